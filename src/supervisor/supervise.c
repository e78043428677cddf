/*
 * supervise.c - lendbox-supervise, the small program that runs inside every sandbox.
 *
 * Linked statically against libc only, so it runs in any image; the providers bind-mount it
 * read-only at /run/lendbox/supervise. Two modes:
 *
 *   lendbox-supervise --init --ready-fd N
 *       The sandbox's pid 1 (bwrap --as-pid-1). Closes every fd but N, points 0/1/2 at
 *       /dev/null, writes one byte to N and closes it (the provider waits for that byte before
 *       create returns), then reaps whatever is reparented to it, forever. Signals sent from
 *       inside the sandbox cannot kill it (pid 1 of a pid namespace only gets signals it has
 *       handlers for, and it has none); the provider stops a sandbox by SIGKILL from outside.
 *
 *   lendbox-supervise --status-fd N --timeout-ms MS [--cwd DIR] [--keep-background] -- ARGV...
 *       Runs one command: new session, child subreaper, chdir DIR, fork, exec ARGV (PATH
 *       search; 127 if not found, 126 if not executable, like a shell) in its own process
 *       group with default signal dispositions and an empty signal mask. When the command
 *       exits, every remaining descendant is killed (SIGKILL) unless --keep-background is
 *       given, in which case they are left running and inherit the sandbox's pid 1. When MS
 *       passes first: SIGTERM to the command's process group and every descendant, 500 ms of
 *       grace, then SIGKILL to all of them until none is left. Descendants are found by
 *       scanning /proc for processes whose parent chain leads here (as a subreaper, orphans
 *       come to us, so that chain never breaks). A SIGTERM/SIGINT/SIGHUP/SIGQUIT to the
 *       supervisor itself is treated like a timeout but reported as an error.
 *
 * Status protocol (command mode): exactly one line is written to the status fd just before
 * the supervisor exits, after the whole tree is gone (or left behind on purpose):
 *
 *   exit N        the command exited with status N
 *   signal N      the command was killed by signal N
 *   timeout       the timeout passed; the process tree was killed
 *   error MSG     the command could not be run; MSG is one line, e.g.
 *                 "cwd '/nope' does not exist"
 *
 * No line at all (EOF) means the supervisor itself died. The supervisor's exit status is 0
 * when a status line was written and 2 on bad usage.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GRACE_MS 500
#define KILL_POLL_MS 10

struct options {
    bool init;
    int ready_fd;
    int status_fd;
    int64_t timeout_ms;
    const char *cwd;
    bool keep_background;
    char **argv;
};

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int parse_int64(const char *s, int64_t min, int64_t max, int64_t *out)
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

static int parse_options(int argc, char **argv, struct options *o)
{
    int64_t v;
    int i;

    memset(o, 0, sizeof(*o));
    o->ready_fd = -1;
    o->status_fd = -1;
    o->timeout_ms = -1;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;

        if (strcmp(a, "--") == 0) {
            o->argv = &argv[i + 1];
            break;
        } else if (strcmp(a, "--init") == 0) {
            o->init = true;
        } else if (strcmp(a, "--keep-background") == 0) {
            o->keep_background = true;
        } else if (strcmp(a, "--ready-fd") == 0 && parse_int64(val, 0, INT_MAX, &v) == 0) {
            o->ready_fd = (int)v;
            i++;
        } else if (strcmp(a, "--status-fd") == 0 && parse_int64(val, 0, INT_MAX, &v) == 0) {
            o->status_fd = (int)v;
            i++;
        } else if (strcmp(a, "--timeout-ms") == 0 && parse_int64(val, 1, INT64_MAX / 2, &v) == 0) {
            o->timeout_ms = v;
            i++;
        } else if (strcmp(a, "--cwd") == 0 && val) {
            o->cwd = val;
            i++;
        } else {
            return -EINVAL;
        }
    }
    if (o->init)
        return o->ready_fd >= 0 ? 0 : -EINVAL;
    if (o->status_fd < 0 || o->timeout_ms < 0 || !o->argv || !o->argv[0])
        return -EINVAL;
    return 0;
}

/* Every signal back to its default action and unblocked (for what we exec). */
static void reset_signals(void)
{
    struct sigaction sa;
    sigset_t none;
    int s;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_DFL;
    for (s = 1; s < NSIG; s++) {
        if (s != SIGKILL && s != SIGSTOP)
            (void)sigaction(s, &sa, NULL); /* glibc-internal signals fail; fine */
    }
    sigemptyset(&none);
    (void)sigprocmask(SIG_SETMASK, &none, NULL);
}

/* ---- init mode ---------------------------------------------------------------------- */

static int run_init(int ready_fd)
{
    static const int ignored[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE};
    struct sigaction sa;
    sigset_t chld;
    size_t i;
    int fd;

    if (ready_fd > 3)
        (void)close_range(3, (unsigned)ready_fd - 1, 0);
    (void)close_range((unsigned)ready_fd + 1, ~0U, 0);
    if (write(ready_fd, "R", 1) != 1)
        return 1;
    (void)close(ready_fd);
    fd = open("/dev/null", O_RDWR);
    if (fd >= 0) {
        for (i = 0; i < 3; i++) {
            if (fd != (int)i)
                (void)dup2(fd, (int)i);
        }
        if (fd > 2)
            (void)close(fd);
    }
    if (chdir("/") < 0) {
        /* nothing to do about it; keep running */
    }

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_IGN;
    for (i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++)
        (void)sigaction(ignored[i], &sa, NULL);
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    (void)sigprocmask(SIG_BLOCK, &chld, NULL);

    for (;;) {
        /* SIGCHLD stays pending while blocked, so no exit is missed between the two. */
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        (void)sigwaitinfo(&chld, NULL);
    }
}

/* ---- command mode --------------------------------------------------------------------- */

struct proc_ent {
    pid_t pid, ppid;
    bool mark;
};

static int read_ppid(pid_t pid, pid_t *ppid)
{
    char path[64], buf[512];
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
    if (!p || sscanf(p + 1, " %*c %d", &v) != 1)
        return -EIO;
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

        if (parse_int64(de->d_name, 1, INT_MAX, &pid) < 0)
            continue;
        if (read_ppid((pid_t)pid, &ppid) < 0)
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
static int signal_descendants(int sig)
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
        if (read_ppid(v[i].pid, &ppid) == 0 && is_marked(v, n, ppid, self) &&
            syscall(SYS_pidfd_send_signal, pfd, sig, NULL, 0) == 0)
            hit++;
        (void)close(pfd);
    }
    free(v);
    return hit;
}

struct child_state {
    pid_t pid;
    bool done;
    int status;
};

/* Reap every exited child. Returns true when no child at all is left. */
static bool reap(struct child_state *cmd)
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

static void drain_signalfd(int sfd, int *terminating)
{
    struct signalfd_siginfo si;

    while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo != SIGCHLD && terminating && !*terminating)
            *terminating = (int)si.ssi_signo;
    }
}

/* Wait for a signal (SIGCHLD mostly) for at most ms. */
static void wait_signal(int sfd, int64_t ms, int *terminating)
{
    struct pollfd pfd = {.fd = sfd, .events = POLLIN};

    if (ms < 0)
        ms = 0;
    if (ms > INT_MAX)
        ms = INT_MAX;
    if (poll(&pfd, 1, (int)ms) > 0)
        drain_signalfd(sfd, terminating);
}

/* Kill the command's group and every descendant with sig until no child is left. */
static void kill_tree(struct child_state *cmd, int sfd, int sig)
{
    for (;;) {
        if (!cmd->done) /* after the leader is reaped its pid may be reused */
            (void)kill(-cmd->pid, sig);
        (void)signal_descendants(sig);
        if (reap(cmd))
            return;
        wait_signal(sfd, KILL_POLL_MS, NULL);
    }
}

/* TERM, grace, then KILL of the whole tree. */
static void terminate_tree(struct child_state *cmd, int sfd)
{
    int64_t deadline = mono_ms() + GRACE_MS;

    if (!cmd->done)
        (void)kill(-cmd->pid, SIGTERM);
    (void)signal_descendants(SIGTERM);
    for (;;) {
        int64_t left = deadline - mono_ms();

        if (reap(cmd))
            return;
        if (left <= 0)
            break;
        wait_signal(sfd, left, NULL);
    }
    kill_tree(cmd, sfd, SIGKILL);
}

/* Write one status line (printf-style) to fd; control characters become '?' so it stays
 * one line. */
static void write_status(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void write_status(int fd, const char *fmt, ...)
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

static void report_cwd_error(int fd, const char *cwd, int e)
{
    if (e == ENOENT)
        write_status(fd, "error cwd '%s' does not exist", cwd);
    else if (e == ENOTDIR)
        write_status(fd, "error cwd '%s' is not a directory", cwd);
    else if (e == EACCES)
        write_status(fd, "error cwd '%s' is not accessible", cwd);
    else
        write_status(fd, "error cannot enter cwd '%s': %s", cwd, strerror(e));
}

static void exec_command(char **argv)
{
    int e;

    setpgid(0, 0);
    reset_signals();
    execvp(argv[0], argv);
    e = errno;
    dprintf(2, "lendbox-supervise: cannot run '%s': %s\n", argv[0], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
}

static int run_command(const struct options *o)
{
    struct child_state cmd = {.pid = -1};
    int terminating = 0;
    bool timed_out = false;
    int64_t deadline;
    sigset_t set;
    int sfd;

    (void)fcntl(o->status_fd, F_SETFD, FD_CLOEXEC);
    (void)setsid();
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);

    if (o->cwd && chdir(o->cwd) < 0) {
        report_cwd_error(o->status_fd, o->cwd, errno);
        return 0;
    }

    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGQUIT);
    (void)sigprocmask(SIG_BLOCK, &set, NULL);
    sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0) {
        write_status(o->status_fd, "error signalfd failed: %s", strerror(errno));
        return 0;
    }

    deadline = mono_ms() + o->timeout_ms;
    cmd.pid = fork();
    if (cmd.pid < 0) {
        write_status(o->status_fd, "error fork failed: %s", strerror(errno));
        return 0;
    }
    if (cmd.pid == 0)
        exec_command(o->argv);
    (void)setpgid(cmd.pid, cmd.pid);

    for (;;) {
        int64_t left;

        reap(&cmd);
        if (cmd.done)
            break;
        left = deadline - mono_ms();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        wait_signal(sfd, left, &terminating);
        if (terminating)
            break;
    }

    if (timed_out || terminating)
        terminate_tree(&cmd, sfd);
    else if (!o->keep_background)
        kill_tree(&cmd, sfd, SIGKILL);

    if (terminating) {
        write_status(o->status_fd, "error supervisor received signal %s", strsignal(terminating));
    } else if (timed_out) {
        write_status(o->status_fd, "timeout");
    } else if (WIFEXITED(cmd.status)) {
        write_status(o->status_fd, "exit %d", WEXITSTATUS(cmd.status));
    } else {
        write_status(o->status_fd, "signal %d", WIFSIGNALED(cmd.status) ? WTERMSIG(cmd.status) : 0);
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct options o;

    if (parse_options(argc, argv, &o) < 0) {
        fprintf(stderr, "usage: lendbox-supervise --init --ready-fd N\n"
                        "       lendbox-supervise --status-fd N --timeout-ms MS [--cwd DIR] "
                        "[--keep-background] -- ARGV...\n");
        if (o.status_fd >= 0)
            write_status(o.status_fd, "error bad lendbox-supervise arguments");
        return 2;
    }
    if (o.init)
        return run_init(o.ready_fd);
    return run_command(&o);
}
