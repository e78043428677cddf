/*
 * child.c - helpers for the local provider's forked children and their messages: pipes and fds,
 * async-signal-safe work between fork and exec (placing fds, resetting signals, a new session
 * keyring, reporting an errno without strerror), the host's keyring probe, and the texts the
 * parent makes of what children report (errno names, E2BIG with the kernel's limits).
 */
#include "provider/local/local_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/keyctl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/log.h"

/* ---- fds ------------------------------------------------------------------------------- */

int local_pipe(int *r, int *w)
{
    int p[2];

    if (pipe2(p, O_CLOEXEC) < 0)
        return -errno;
    *r = p[0];
    *w = p[1];
    return 0;
}

void local_close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* ---- helpers for forked children (async-signal-safe only) ------------------------------ */

int local_child_place_fds(const int *fds, int n)
{
    int tmp[32], i;

    if (n > 32)
        return -EINVAL;
    /* first out of the way (above n), so moving one never clobbers another */
    for (i = 0; i < n; i++) {
        tmp[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, n);
        if (tmp[i] < 0)
            return -errno;
    }
    for (i = 0; i < n; i++) {
        if (dup2(tmp[i], i) < 0)
            return -errno;
    }
    return 0;
}

/* Set once by local_keyrings_probe (before any sandbox), read-only afterwards. */
static bool keyrings_probed, keyrings_refused;

/* Is this process under a seccomp filter ("Seccomp: 2" in /proc/self/status)? */
static bool under_seccomp_filter(void)
{
    char buf[4096];
    const char *p;

    if (local_read_small("/proc/self/status", buf, sizeof(buf)) < 0)
        return false;
    p = strstr(buf, "\nSeccomp:");
    return p && atoi(p + 9) == 2;
}

bool local_keyrings_refused(void)
{
    return keyrings_refused;
}

void local_keyrings_probe(void)
{
    int st = 0;
    pid_t pid;

    if (keyrings_probed)
        return;
    keyrings_probed = true;
    /* in a child, so the daemon keeps the session keyring it was given */
    pid = fork();
    if (pid == 0) {
        if (syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, NULL, 0, 0, 0) < 0)
            _exit(errno > 0 && errno < 255 ? errno : 255);
        _exit(0);
    }
    if (pid < 0) {
        log_warn("cannot probe the kernel keyring: fork: %s", strerror(errno));
        return;
    }
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    /* Only a seccomp filter's EPERM counts: a filter is inherited by every process the daemon
     * starts and cannot be lifted, so no sandbox can use a keyring either. (An LSM's refusal,
     * EACCES, is not known to hold for the sandboxes' own domains.) */
    if (WIFEXITED(st) && WEXITSTATUS(st) == EPERM && under_seccomp_filter()) {
        keyrings_refused = true;
        log_warn("this host refuses the kernel keyring calls to lendboxd (keyctl: %s, under a "
                 "seccomp filter: a container's or systemd's): every sandbox inherits the "
                 "refusal, so sandboxes and execs start without a session keyring of their own",
                 strerror(EPERM));
    }
}

int local_child_new_session_keyring(void)
{
    if (syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, NULL, 0, 0, 0) < 0 && errno != ENOSYS &&
        !(keyrings_refused && errno == EPERM))
        return -1;
    return 0;
}

void local_child_report(int fd, const char *msg, int err_no)
{
    char buf[256], num[16];
    size_t n = 0, k = 0;
    const char *e = ": errno ";

    while (*msg && n < sizeof(buf) - 32)
        buf[n++] = *msg++;
    while (*e)
        buf[n++] = *e++;
    if (err_no <= 0)
        err_no = 0;
    do {
        num[k++] = (char)('0' + err_no % 10);
        err_no /= 10;
    } while (err_no && k < sizeof(num));
    while (k)
        buf[n++] = num[--k];
    buf[n++] = '\n';
    (void)!write(fd, buf, n);
}

/* ---- messages --------------------------------------------------------------------------- */

/* The kernel's per-string bound on execve's arguments and environment (MAX_ARG_STRLEN). */
static long arg_strlen_max(void)
{
    long page = sysconf(_SC_PAGESIZE);

    return 32 * (page > 0 ? page : 4096);
}

void local_describe_e2big(char *buf, size_t size)
{
    long all = sysconf(_SC_ARG_MAX);

    snprintf(buf, size,
             "argument list too long (limit %ld bytes for the arguments and environment "
             "together, %ld bytes for one argument or variable)",
             all > 0 ? all : 131072L, arg_strlen_max());
}

void local_errno_text(const char *in, char *out, size_t size)
{
    static const char marker[] = ": errno ";
    size_t o = 0;

    if (size == 0)
        return;
    while (*in && o + 1 < size) {
        if (strncmp(in, marker, sizeof(marker) - 1) == 0 && in[sizeof(marker) - 1] >= '0' &&
            in[sizeof(marker) - 1] <= '9') {
            char *end, text[320];
            long e = strtol(in + sizeof(marker) - 1, &end, 10);

            if (e == E2BIG)
                local_describe_e2big(text, sizeof(text));
            else
                snprintf(text, sizeof(text), "%s", e > 0 ? strerror((int)e) : "unknown error");
            o += (size_t)snprintf(out + o, size - o, ": %s", text);
            if (o >= size)
                o = size - 1;
            in = end;
            continue;
        }
        out[o++] = *in++;
    }
    out[o] = '\0';
}

int local_check_exec_args(const char *const *argv, const char *const *envp, char *why,
                          size_t why_len)
{
    const char *const *lists[2] = {argv, envp};
    long all = sysconf(_SC_ARG_MAX), one = arg_strlen_max();
    size_t total = 0, longest = 0;

    for (int l = 0; l < 2; l++) {
        for (size_t i = 0; lists[l] && lists[l][i]; i++) {
            size_t n = strlen(lists[l][i]) + 1;

            total += n + sizeof(char *);
            if (n > longest)
                longest = n;
        }
    }
    if ((long)longest > one) {
        snprintf(why, why_len,
                 "argument list too long: one argument or environment variable is %zu bytes "
                 "(limit %ld bytes each)",
                 longest - 1, one);
        return -E2BIG;
    }
    if (all > 0 && (long)total > all) {
        snprintf(why, why_len,
                 "argument list too long: the arguments and environment take %zu bytes (limit "
                 "%ld bytes together)",
                 total, all);
        return -E2BIG;
    }
    return 0;
}
