/*
 * seccomp.h - the default seccomp filter every sandbox process runs under (DESIGN.md
 * invariant 7): built once with libseccomp, exported as a classic BPF program, then handed
 * as a memfd to bubblewrap's --seccomp FD (the init) and to lendbox-supervise (each exec),
 * which install it in the sandbox's processes.
 *
 * The filter allows everything except what sandboxes do not need and what would let one
 * sandbox process reach beyond itself: the kernel keyring (keyctl, add_key, request_key), new
 * user namespaces (unshare/clone with CLONE_NEWUSER; clone3 answers ENOSYS so libc falls back
 * to clone, whose flags can be checked), bpf, perf_event_open, userfaultfd, kernel modules,
 * kexec, reboot, swap, setting clocks, ptrace and every other way into another process's
 * memory or fds (process_vm_readv/writev, pidfd_getfd, kcmp), mounts (the mount family,
 * pivot_root), quotactl, acct, syslog, open_by_handle_at and ioperm/iopl. Denied calls fail
 * with EPERM (ENOSYS for clone3); nothing is killed. Extra names can be denied per config.
 *
 * Thread-safety: a built struct lb_seccomp is read-only and may be shared.
 */
#ifndef LB_PROVIDER_SECCOMP_H
#define LB_PROVIDER_SECCOMP_H

#include <linux/filter.h>
#include <stddef.h>

#include "util/error.h"

struct lb_seccomp {
    struct sock_fprog prog; /* .len == 0: no filter (disabled) */
    size_t size_bytes;      /* prog.len * sizeof(struct sock_filter) */
};

/* Build the default filter plus the syscalls named in extra_deny (names separated by spaces
 * or commas; NULL or "" for none) into out, which the caller releases with
 * seccomp_filter_release. -EINVAL (with the name in err) when a name is not a syscall of this
 * architecture, -ENOMEM, -EIO when libseccomp fails. */
int seccomp_filter_build(const char *extra_deny, struct lb_seccomp *out, struct lb_error *err);

/* A new memfd (O_CLOEXEC, offset 0) holding the program's bytes, for bwrap --seccomp FD.
 * Returns the fd or -errno. */
int seccomp_filter_memfd(const struct lb_seccomp *f);

void seccomp_filter_release(struct lb_seccomp *f);

/* Make the kernel keyring calls (keyctl, add_key, request_key) fail with EPERM for this whole
 * process (every thread) and everything it starts, as systemd-nspawn's default filter, Docker's
 * default seccomp profile and Kubernetes' RuntimeDefault do to a daemon in a container. For
 * tests of a daemon on such a host (the fault switch host.keyrings); irreversible. 0, or
 * -EIO with the reason in err. Call before any sandbox exists. */
int seccomp_refuse_keyrings_to_self(struct lb_error *err);

#endif
