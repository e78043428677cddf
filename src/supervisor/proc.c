/*
 * proc.c - the process plumbing every mode of lendbox-supervise shares: the monotonic clock,
 * closing fds, number parsing, the /proc scan (descendants to signal; the exclusive sweep of
 * a whole pid namespace), reaping, waiting on a signalfd, killing a process tree, and the
 * one-line status writer. A base: it calls nothing of the supervisor's other files.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "supervisor/supervise_internal.h"

/* SIGTERM to SIGKILL when a tree is terminated */
#define GRACE_MS 500

int64_t proc_mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Close every fd from 3 on but a and b (either may be -1). */
void proc_close_all_but(int a, int b)
{
    int lo = a < b ? a : b, hi = a < b ? b : a;
    unsigned from = 3;

    if (lo >= 3) {
        if ((unsigned)lo > from)
            (void)close_range(from, (unsigned)lo - 1, 0);
        from = (unsigned)lo + 1;
    }
    if (hi >= 3) {
        if ((unsigned)hi > from)
            (void)close_range(from, (unsigned)hi - 1, 0);
        from = (unsigned)hi + 1;
    }
    (void)close_range(from, ~0U, 0);
}

int proc_parse_int64(const char *s, int64_t min, int64_t max, int64_t *out)
{
    char *end;
    long long v;

    if (!s || !*s)
        return -EINVAL;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return -EINVAL;
    *out = v;
    return 0;
}

struct proc_ent {
    pid_t pid, ppid;
    bool mark;
};

/* The state letter and the parent of pid, from /proc/PID/stat (state or ppid may be NULL). One
 * reader for the descendant scan and the exclusive sweep. 0 or -errno (-EIO: unreadable). */
static int read_stat(pid_t pid, char *state, pid_t *ppid)
{
    char path[64], buf[512], c;
    const char *p;
    ssize_t n;
    int fd, v;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    n = read(fd, buf, sizeof(buf) - 1);
    (void)close(fd);
    if (n <= 0)
        return -EIO;
    buf[n] = '\0';
    p = strrchr(buf, ')');
    if (!p || sscanf(p + 1, " %c %d", &c, &v) != 2)
        return -EIO;
    if (state)
        *state = c;
    if (ppid)
        *ppid = v;
    return 0;
}

/* Every process of this pid namespace with its parent. */
static int scan_procs(struct proc_ent **out, size_t *count)
{
    struct proc_ent *v = NULL, *nv;
    size_t n = 0, cap = 0;
    struct dirent *de;
    DIR *d;

    d = opendir("/proc");
    if (!d)
        return -errno;
    while ((de = readdir(d))) {
        int64_t pid;
        pid_t ppid;

        if (proc_parse_int64(de->d_name, 1, INT_MAX, &pid) < 0)
            continue;
        if (read_stat((pid_t)pid, NULL, &ppid) < 0)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            nv = realloc(v, cap * sizeof(*v));
            if (!nv) {
                free(v);
                closedir(d);
                return -ENOMEM;
            }
            v = nv;
        }
        v[n].pid = (pid_t)pid;
        v[n].ppid = ppid;
        v[n].mark = false;
        n++;
    }
    closedir(d);
    *out = v;
    *count = n;
    return 0;
}

static bool is_marked(const struct proc_ent *v, size_t n, pid_t pid, pid_t self)
{
    size_t i;

    if (pid == self)
        return true;
    for (i = 0; i < n; i++) {
        if (v[i].pid == pid)
            return v[i].mark;
    }
    return false;
}

/* Send sig to every descendant of ours. Returns how many were signalled (or -errno). A pid
 * is pinned with a pidfd and its parent re-checked before the signal, so a pid reused by an
 * unrelated process in the meantime is not hit. */
int proc_signal_descendants(int sig)
{
    pid_t self = getpid();
    struct proc_ent *v = NULL;
    size_t n = 0, i;
    bool changed;
    int r, hit = 0;

    r = scan_procs(&v, &n);
    if (r < 0)
        return r;
    do {
        changed = false;
        for (i = 0; i < n; i++) {
            if (!v[i].mark && v[i].pid != self && is_marked(v, n, v[i].ppid, self)) {
                v[i].mark = true;
                changed = true;
            }
        }
    } while (changed);

    for (i = 0; i < n; i++) {
        pid_t ppid;
        int pfd;

        if (!v[i].mark)
            continue;
        pfd = (int)syscall(SYS_pidfd_open, v[i].pid, 0);
        if (pfd < 0) {
            if (errno == ENOSYS && kill(v[i].pid, sig) == 0)
                hit++;
            continue;
        }
        if (read_stat(v[i].pid, NULL, &ppid) == 0 && is_marked(v, n, ppid, self) &&
            syscall(SYS_pidfd_send_signal, pfd, sig, NULL, 0) == 0)
            hit++;
        (void)close(pfd);
    }
    free(v);
    return hit;
}

int proc_open_signalfd(bool with_sigpipe)
{
    sigset_t set;

    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGQUIT);
    if (with_sigpipe)
        sigaddset(&set, SIGPIPE);
    (void)sigprocmask(SIG_BLOCK, &set, NULL);
    return signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

/* Reap every exited child. Returns true when no child at all is left. */
bool proc_reap(struct sup_child *cmd)
{
    int st;

    for (;;) {
        pid_t w = waitpid(-1, &st, WNOHANG);

        if (w > 0) {
            if (w == cmd->pid) {
                cmd->done = true;
                cmd->status = st;
            }
            continue;
        }
        return w < 0 && errno == ECHILD;
    }
}

void proc_drain_signalfd(int sfd, int *terminating)
{
    struct signalfd_siginfo si;

    while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo != SIGCHLD && terminating && !*terminating)
            *terminating = (int)si.ssi_signo;
    }
}

/* Wait for a signal (SIGCHLD mostly) for at most ms. */
void proc_wait_signal(int sfd, int64_t ms, int *terminating)
{
    struct pollfd pfd = {.fd = sfd, .events = POLLIN};

    if (ms < 0)
        ms = 0;
    if (ms > INT_MAX)
        ms = INT_MAX;
    if (poll(&pfd, 1, (int)ms) > 0)
        proc_drain_signalfd(sfd, terminating);
}

/* Kill the command's group and every descendant with sig until no child is left. */
void proc_kill_tree(struct sup_child *cmd, int sfd, int sig)
{
    for (;;) {
        if (!cmd->done) /* after the leader is reaped its pid may be reused */
            (void)kill(-cmd->pid, sig);
        (void)proc_signal_descendants(sig);
        if (proc_reap(cmd))
            return;
        proc_wait_signal(sfd, KILL_POLL_MS, NULL);
    }
}

/* TERM, grace, then KILL of the whole tree. */
void proc_terminate_tree(struct sup_child *cmd, int sfd)
{
    int64_t deadline = proc_mono_ms() + GRACE_MS;

    if (!cmd->done)
        (void)kill(-cmd->pid, SIGTERM);
    (void)proc_signal_descendants(SIGTERM);
    for (;;) {
        int64_t left = deadline - proc_mono_ms();

        if (proc_reap(cmd))
            return;
        if (left <= 0)
            break;
        proc_wait_signal(sfd, left, NULL);
    }
    proc_kill_tree(cmd, sfd, SIGKILL);
}

/* Write one status line (printf-style) to fd; control characters become '?' so it stays
 * one line. */
void proc_write_status(int fd, const char *fmt, ...)
{
    char line[1024];
    size_t len, off = 0;
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    len = (size_t)n < sizeof(line) - 2 ? (size_t)n : sizeof(line) - 2;
    for (size_t i = 0; i < len; i++) {
        if ((unsigned char)line[i] < 0x20)
            line[i] = '?';
    }
    line[len++] = '\n';
    while (off < len) {
        ssize_t w = write(fd, line + off, len - off);

        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        off += (size_t)w;
    }
}

/* Bring lo of our network namespace up when it is down (an LXD container without a NIC whose
 * init does not: its loopback is down). Best effort: without CAP_NET_ADMIN nothing changes. */
void proc_loopback_up(void)
{
    struct ifreq ifr;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

    if (s < 0)
        return;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
    if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0 && !(ifr.ifr_flags & IFF_UP)) {
        ifr.ifr_flags |= IFF_UP;
        (void)ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    close(s);
}

/* Has pid a thread other than itself (an entry of /proc/PID/task but its own)? */
static bool has_other_threads(pid_t pid)
{
    char path[64];
    struct dirent *e;
    bool other = false;
    DIR *dp;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    dp = opendir(path);
    if (!dp)
        return false;
    while (!other && (e = readdir(dp))) {
        char *end;
        long tid = strtol(e->d_name, &end, 10);

        other = !*end && tid > 0 && tid != pid;
    }
    closedir(dp);
    return other;
}

/* --exclusive: SIGKILL every process but pid 1 and ourselves until none is left; with
 * spare_init_session also every process of pid 1's own session (an image's init that keeps
 * a child, like a shell looping on sleep: what came in through an exec is always in a
 * session of its own, and no process can join another session). 0 or -1. */
int proc_kill_all_but_init(bool spare_init_session)
{
    pid_t self = getpid();
    pid_t init_sid = spare_init_session ? getsid(1) : -1;

    for (int pass = 0; pass < 200; pass++) {
        DIR *dp = opendir("/proc");
        struct dirent *e;
        int found = 0;

        if (!dp)
            return -1;
        while ((e = readdir(dp))) {
            char *end, state;
            long pid = strtol(e->d_name, &end, 10);

            if (*end || pid <= 1 || pid == self)
                continue;
            if (init_sid > 0 && getsid((pid_t)pid) == init_sid)
                continue;
            /* A zombie is dead already (init reaps it): do not wait for it, unless it is a
             * thread-group leader that exited while other threads of it run: the kill to the
             * group ends those, and it counts until they are gone. */
            if (read_stat((pid_t)pid, &state, NULL) == 0 && state == 'Z') {
                (void)kill((pid_t)pid, SIGKILL);
                if (has_other_threads((pid_t)pid))
                    found++;
                continue;
            }
            if (kill((pid_t)pid, SIGKILL) == 0)
                found++;
        }
        closedir(dp);
        if (!found)
            return 0;
        /* zombies of ours do not exist yet; others' are reaped by init */
        struct timespec ts = {0, KILL_POLL_MS * 1000000L};

        nanosleep(&ts, NULL);
    }
    return -1;
}
