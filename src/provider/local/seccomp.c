/*
 * seccomp.c - see seccomp.h.
 */
#include "provider/local/seccomp.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Refused with EPERM. Names this architecture does not have are skipped. */
static const char *const default_deny[] = {
    /* the kernel keyring: shared by uid and by session across sandboxes */
    "keyctl", "add_key", "request_key",
    /* kernel attack surface sandboxes do not need */
    "bpf", "perf_event_open", "userfaultfd", "lookup_dcookie", "iopl", "ioperm", "syslog",
    "vhangup", "acct", "quotactl", "quotactl_fd", "open_by_handle_at", "nfsservctl",
    /* kernel modules, kexec, reboot, swap */
    "init_module", "finit_module", "delete_module", "create_module", "kexec_load",
    "kexec_file_load", "reboot", "swapon", "swapoff",
    /* clocks are the host's */
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "stime",
    /* other processes' memory and fds (same uid inside a sandbox: nothing else stops it) */
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    /* mounts (execs and the init hold no capability, this makes it two walls) */
    "mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", NULL};

static int add_errno_rule(scmp_filter_ctx ctx, const char *name, int nr, int e,
                          struct lb_error *err)
{
    int r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(e), nr, 0);

    if (r < 0)
        return lb_error_set(err, -EIO, "seccomp: cannot add a rule for '%s': %s", name,
                            strerror(-r));
    return 0;
}

/* The extra names of the config: each must be a syscall of this architecture. */
static int add_extra(scmp_filter_ctx ctx, const char *extra, struct lb_error *err)
{
    char name[64];
    const char *p = extra;
    int r;

    while (p && *p) {
        size_t n;
        int nr;

        p += strspn(p, " ,\t");
        n = strcspn(p, " ,\t");
        if (n == 0)
            break;
        if (n >= sizeof(name))
            return lb_error_set(err, -EINVAL, "seccomp_deny: '%.*s' is not a syscall name",
                                (int)(n > 64 ? 64 : n), p);
        memcpy(name, p, n);
        name[n] = '\0';
        p += n;
        nr = seccomp_syscall_resolve_name(name);
        if (nr == __NR_SCMP_ERROR)
            return lb_error_set(err, -EINVAL,
                                "seccomp_deny: '%s' is not a syscall of this architecture", name);
        r = add_errno_rule(ctx, name, nr, EPERM, err);
        if (r < 0)
            return r;
    }
    return 0;
}

static int add_rules(scmp_filter_ctx ctx, const char *extra, struct lb_error *err)
{
    int r;

    for (size_t i = 0; default_deny[i]; i++) {
        int nr = seccomp_syscall_resolve_name(default_deny[i]);

        if (nr == __NR_SCMP_ERROR)
            continue;
        r = add_errno_rule(ctx, default_deny[i], nr, EPERM, err);
        if (r < 0)
            return r;
    }
    /* no nested user namespace: it would hand its creator every capability again */
    r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 1,
                         SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
    if (r == 0)
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                             SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
    /* clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc use clone */
    if (r == 0)
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    if (r < 0)
        return lb_error_set(err, -EIO, "seccomp: cannot add the namespace rules: %s", strerror(-r));
    return add_extra(ctx, extra, err);
}

/* The exported program's bytes, read back from a memfd. */
static int export_prog(scmp_filter_ctx ctx, struct lb_seccomp *out, struct lb_error *err)
{
    struct stat st;
    void *buf = NULL;
    int fd, r;

    fd = (int)syscall(SYS_memfd_create, "lendbox-seccomp", MFD_CLOEXEC);
    if (fd < 0)
        return lb_error_set(err, -EIO, "seccomp: memfd_create: %s", strerror(errno));
    r = seccomp_export_bpf(ctx, fd);
    if (r < 0) {
        r = lb_error_set(err, -EIO, "seccomp: cannot export the filter: %s", strerror(-r));
        goto out;
    }
    if (fstat(fd, &st) < 0 || st.st_size <= 0 || st.st_size % sizeof(struct sock_filter) ||
        st.st_size / sizeof(struct sock_filter) > BPF_MAXINSNS) {
        r = lb_error_set(err, -EIO, "seccomp: the exported filter has a bad size");
        goto out;
    }
    buf = malloc((size_t)st.st_size);
    if (!buf) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    if (pread(fd, buf, (size_t)st.st_size, 0) != st.st_size) {
        r = lb_error_set(err, -EIO, "seccomp: cannot read the exported filter back");
        goto out;
    }
    out->prog.filter = buf;
    out->prog.len = (unsigned short)(st.st_size / sizeof(struct sock_filter));
    out->size_bytes = (size_t)st.st_size;
    buf = NULL;
    r = 0;
out:
    free(buf);
    close(fd);
    return r;
}

int seccomp_filter_build(const char *extra_deny, struct lb_seccomp *out, struct lb_error *err)
{
    scmp_filter_ctx ctx;
    int r;

    memset(out, 0, sizeof(*out));
    ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx)
        return lb_error_set(err, -ENOMEM, "seccomp: cannot make a filter");
    /* 32-bit calls get the same rules (else int 0x80 would walk around them) */
    if (seccomp_arch_native() == SCMP_ARCH_X86_64) {
        r = seccomp_arch_add(ctx, SCMP_ARCH_X86);
        if (r == 0)
            r = seccomp_arch_add(ctx, SCMP_ARCH_X32);
        if (r < 0 && r != -EEXIST) {
            r = lb_error_set(err, -EIO, "seccomp: cannot add the 32-bit ABIs: %s", strerror(-r));
            goto out;
        }
    }
    r = add_rules(ctx, extra_deny, err);
    if (r == 0)
        r = export_prog(ctx, out, err);
out:
    seccomp_release(ctx);
    return r;
}

int seccomp_refuse_keyrings_to_self(struct lb_error *err)
{
    static const char *const calls[] = {"keyctl", "add_key", "request_key"};
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    int r = 0;

    if (!ctx)
        return lb_error_set(err, -EIO, "seccomp: cannot make a filter");
    /* every thread of the daemon, and no no_new_privs: only the keyring calls change */
    r = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_TSYNC, 1);
    if (r == 0)
        r = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);
    for (size_t i = 0; r == 0 && i < sizeof(calls) / sizeof(calls[0]); i++)
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), seccomp_syscall_resolve_name(calls[i]), 0);
    if (r == 0)
        r = seccomp_load(ctx);
    if (r < 0)
        r = lb_error_set(err, -EIO, "seccomp: cannot refuse the keyring calls: %s", strerror(-r));
    seccomp_release(ctx);
    return r;
}

int seccomp_filter_memfd(const struct lb_seccomp *f)
{
    size_t off = 0;
    int fd = (int)syscall(SYS_memfd_create, "lendbox-seccomp", MFD_CLOEXEC), e;

    if (fd < 0)
        return -errno;
    while (off < f->size_bytes) {
        ssize_t w = write(fd, (const char *)f->prog.filter + off, f->size_bytes - off);

        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            e = w < 0 ? errno : EIO;
            close(fd);
            return -e;
        }
        off += (size_t)w;
    }
    if (lseek(fd, 0, SEEK_SET) < 0) {
        e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

void seccomp_filter_release(struct lb_seccomp *f)
{
    if (!f)
        return;
    free(f->prog.filter);
    memset(f, 0, sizeof(*f));
}
