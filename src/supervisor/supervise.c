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
 *   lendbox-supervise   (no arguments, as pid 1)
 *       The same init for an engine's container: /sbin/init of an image that `lendboxd image
 *       import --provider lxd` gives LXD when the image has none. Brings lo up; no ready byte;
 *       SIGPWR (LXD's clean stop) ends it.
 *
 *   lendbox-supervise --status-fd N --timeout-ms MS [--cwd DIR] [--keep-background]
 *                     [--pass-fd P] -- ARGV...
 *       Runs one command: new session, child subreaper, chdir DIR, fork, exec ARGV (PATH
 *       search; 127 if not found, 126 if not executable, like a shell) in its own process
 *       group with default signal dispositions and an empty signal mask. When the command
 *       exits, every remaining descendant is killed (SIGKILL) unless --keep-background is
 *       given, in which case they are left running and inherit the sandbox's pid 1. When MS
 *       passes first: SIGTERM to the command's process group and every descendant, 500 ms of
 *       grace, then SIGKILL to all of them until none is left. Descendants are found by
 *       scanning /proc for processes whose parent chain leads here (as a subreaper, orphans
 *       come to us, so that chain never breaks). A SIGTERM/SIGINT/SIGHUP/SIGQUIT to the
 *       supervisor itself is treated like a timeout but reported as an error. --pass-fd P
 *       keeps fd P open for the command alone (the daemon's receipt fd for a harness
 *       launcher); the supervisor itself holds it close-on-exec.
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
 *
 * Framed mode (the exec protocol of engine providers: docker, later LXD). An engine's exec API
 * gives a command stdout and stderr (streamed, or recorded to files) but no extra fds, so the
 * whole result travels on stdout as frames:
 *
 *   lendbox-supervise --framed --max-output BYTES --timeout-ms MS [--cwd DIR]
 *                     [--keep-background] [--stdin-file PATH] -- ARGV...
 *       Forks the command-mode supervisor above (status fd, timeout, tree kill unchanged)
 *       with the command's stdout and stderr on pipes, and stdin from PATH (opened, then
 *       unlinked; default /dev/null). It relays them as frames on its own stdout: one byte
 *       type, a 4-byte big-endian length, the payload. 'o' stdout bytes, 'e' stderr bytes
 *       (each stream relayed up to BYTES, the rest read and dropped), 'T' payload "o" or "e":
 *       that stream was cut, and last 's': the status line (protocol above, without the
 *       newline). --pass-file PATH: the file is opened read-write, unlinked, and given to the
 *       command alone as fd 4 (command mode's --pass-fd 4): the docker provider's stand-in for
 *       passing a daemon fd (a host file hard-linked into a bind-mounted directory).
 *       --exclusive: before anything else, SIGKILL every process of the pid namespace but
 *       pid 1 (the sandbox's init) and this one, pass after pass until a pass finds none (a
 *       process forking meanwhile is caught by the next pass; at most 200 passes, else the
 *       status is "error"): the engine providers' exclusive exec. --spare-init-session
 *       (lxd, whose image's init may keep children of its own): also spare every process in
 *       pid 1's session; a process that came in through an exec always runs in a session of
 *       its own (the command's new session, or its own setsid), and no process can join
 *       another session. --loopback-up (lxd: a container without a NIC whose init does not
 *       do it has its loopback down): first bring lo up when it is down (best effort).
 *       Once the status arrives (the tree is gone) what is left in the pipes is
 *       drained and the frames end: background processes kept with --keep-background cannot
 *       hold the exec open. The command cannot forge a frame: its bytes are always payload.
 *       No 's' frame means the supervisor died. Exit status 0; 2 on bad usage.
 *
 * Channels. Every process in a sandbox runs as the same uid, so the supervisor must keep the
 * others away from what it holds: it is non-dumpable in every mode (PR_SET_DUMPABLE 0 as the
 * first call; installed exec-only, mode 0711 owned by host root, the kernel makes it
 * non-dumpable at exec already), so no sandbox process can ptrace it, take its fds with
 * pidfd_getfd, open /proc/<pid>/fd/N or /proc/<pid>/mem. The status fd is close-on-exec and
 * closed in the command's child before exec: no command or background process ever holds it,
 * and its one line comes from the supervisor alone.
 *
 * Harness mode (one supervised harness activation, NeMo Gym's process supervisor). The files
 * live in the activation's directory DIR inside the sandbox, where every sandbox process can
 * write them, so the daemon trusts none of them for a result:
 *
 *   launch.claim    symlink whose target is "launch" or "stop": whoever creates it first wins,
 *                   so a stop that arrives before the launch fences it
 *   stop.request    created by a stop; the harness supervisor polls for it every 50 ms
 *   supervisor.pid  the harness supervisor's pid (in the sandbox's pid namespace; informative)
 *   output.log      the supervisor's and the harness's combined stdout and stderr
 *
 * The receipt {"cleanup_confirmed", "return_code", "timed_out", "error", "launched",
 * "stop_requested"} goes to fd --receipt-fd: a file the daemon made on the host, outside the
 * sandbox, passed through the command-mode supervisor (--pass-fd) to the launcher alone. The
 * harness supervisor keeps it close-on-exec and is non-dumpable, so no sandbox process can
 * reach it. It is written once, after cleanup: one pwrite at offset 0 of the object and a
 * newline, then fsync (the daemon takes only a newline-terminated receipt as complete).
 * --receipt-file PATH instead of --receipt-fd (engine providers that cannot pass a daemon fd,
 * lxd): the launcher creates PATH (O_EXCL, mode 0600) once it has won the launch claim and
 * writes the receipt there the same way; the daemon reads it back through the provider's files
 * API. Such a receipt is inside the sandbox, so the sandbox's own processes (same uid) can
 * forge or remove it: the daemon says so (capability receipt_file) and trusts it no further.
 *
 *   lendbox-supervise --harness-launch DIR (--receipt-fd N | --receipt-file PATH)
 *                     --timeout-ms MS --cleanup-timeout-ms MS -- ARGV...
 *       Claims the launch, then forks the harness supervisor, which leaves the caller's session
 *       (setsid), becomes a child subreaper, points 0/1/2 at /dev/null and output.log, writes
 *       the pid file and runs ARGV in its own process group; the launcher exits as soon as
 *       that is set up, so the harness outlives the exec that started it (run that exec with
 *       --keep-background). Prints "launched PID" and exits 0; prints "fenced" and exits 3 when
 *       a stop claimed first; exits 4 when already launched, 1 on errors (stderr says why).
 *       The harness supervisor ends the harness when it exits, when stop.request appears (or
 *       the supervisor gets SIGTERM), or when MS passes (timed_out): SIGTERM to the harness's
 *       process group, up to the cleanup timeout for it to exit, SIGKILL to the group, up to
 *       the cleanup timeout for its status, then SIGKILL to every remaining descendant until
 *       none is left or a third cleanup timeout passes (then cleanup_confirmed is false).
 *       argv[0] that cannot be run gives return_code 127 (not found) or 126 and an error.
 *
 *   lendbox-supervise --harness-stop DIR
 *       Requests the stop: creates stop.request and tries to claim the launch for "stop". If
 *       that wins (nothing was or will be launched) it prints "fenced" and the daemon records
 *       the receipt itself; otherwise it prints "requested" and the running harness supervisor
 *       sees the request and writes the receipt. Exits 1 when the request cannot be made.
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
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GRACE_MS 500
#define KILL_POLL_MS 10
#define HARNESS_POLL_MS 50

struct options {
    bool init;
    int ready_fd;
    int status_fd;
    int64_t timeout_ms;
    const char *cwd;
    bool keep_background;
    const char *harness_launch; /* DIR of --harness-launch */
    const char *harness_stop;   /* DIR of --harness-stop */
    int pass_fd;                /* command mode: an fd the command alone inherits */
    int receipt_fd;             /* harness mode: the host-side receipt, write end */
    const char *receipt_file;   /* harness mode: the receipt in this new file instead (made
                                   after the launch claim; engines without fd passing) */
    int64_t cleanup_timeout_ms;
    bool framed;             /* --framed: the result as frames on stdout */
    int64_t max_output;      /* framed: bytes relayed per stream */
    const char *stdin_file;  /* framed: stdin from this file (unlinked once open) */
    const char *pass_file;   /* framed: the command's fd 4 (--pass-fd 4), unlinked once open */
    bool exclusive;          /* framed: first SIGKILL every process of the pid namespace but 1 */
    bool spare_init_session; /* exclusive: and but those of pid 1's session */
    bool loopback_up;        /* framed: first bring the network namespace's lo up */
    char **argv;
};

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Close every fd from 3 on but a and b (either may be -1). */
static void close_all_but(int a, int b)
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
    o->cleanup_timeout_ms = -1;
    o->pass_fd = -1;
    o->receipt_fd = -1;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;

        if (strcmp(a, "--") == 0) {
            o->argv = &argv[i + 1];
            break;
        } else if (strcmp(a, "--init") == 0) {
            o->init = true;
        } else if (strcmp(a, "--framed") == 0) {
            o->framed = true;
        } else if (strcmp(a, "--exclusive") == 0) {
            o->exclusive = true;
        } else if (strcmp(a, "--loopback-up") == 0) {
            o->loopback_up = true;
        } else if (strcmp(a, "--spare-init-session") == 0) {
            o->spare_init_session = true;
        } else if (strcmp(a, "--max-output") == 0 && parse_int64(val, 1, INT64_MAX / 2, &v) == 0) {
            o->max_output = v;
            i++;
        } else if (strcmp(a, "--stdin-file") == 0 && val && val[0] == '/') {
            o->stdin_file = val;
            i++;
        } else if (strcmp(a, "--pass-file") == 0 && val && val[0] == '/') {
            o->pass_file = val;
            i++;
        } else if (strcmp(a, "--keep-background") == 0) {
            o->keep_background = true;
        } else if (strcmp(a, "--ready-fd") == 0 && parse_int64(val, 0, INT_MAX, &v) == 0) {
            o->ready_fd = (int)v;
            i++;
        } else if (strcmp(a, "--status-fd") == 0 && parse_int64(val, 0, INT_MAX, &v) == 0) {
            o->status_fd = (int)v;
            i++;
        } else if (strcmp(a, "--pass-fd") == 0 && parse_int64(val, 3, INT_MAX, &v) == 0) {
            o->pass_fd = (int)v;
            i++;
        } else if (strcmp(a, "--receipt-fd") == 0 && parse_int64(val, 3, INT_MAX, &v) == 0) {
            o->receipt_fd = (int)v;
            i++;
        } else if (strcmp(a, "--receipt-file") == 0 && val && val[0] == '/') {
            o->receipt_file = val;
            i++;
        } else if (strcmp(a, "--timeout-ms") == 0 && parse_int64(val, 1, INT64_MAX / 2, &v) == 0) {
            o->timeout_ms = v;
            i++;
        } else if (strcmp(a, "--cwd") == 0 && val) {
            o->cwd = val;
            i++;
        } else if (strcmp(a, "--harness-launch") == 0 && val && val[0] == '/') {
            o->harness_launch = val;
            i++;
        } else if (strcmp(a, "--harness-stop") == 0 && val && val[0] == '/') {
            o->harness_stop = val;
            i++;
        } else if (strcmp(a, "--cleanup-timeout-ms") == 0 &&
                   parse_int64(val, 1, INT64_MAX / 8, &v) == 0) {
            o->cleanup_timeout_ms = v;
            i++;
        } else {
            return -EINVAL;
        }
    }
    if (o->init)
        return o->ready_fd >= 0 ? 0 : -EINVAL;
    if (o->harness_stop)
        return o->harness_launch || o->argv ? -EINVAL : 0;
    if (o->harness_launch) {
        if (strlen(o->harness_launch) > PATH_MAX - 64 || o->timeout_ms < 0 ||
            o->cleanup_timeout_ms < 0 || (o->receipt_fd < 0) == !o->receipt_file || !o->argv ||
            !o->argv[0])
            return -EINVAL;
        return 0;
    }
    if (o->framed)
        return o->status_fd < 0 && o->pass_fd < 0 && o->max_output > 0 && o->timeout_ms > 0 &&
                       o->argv && o->argv[0]
                   ? 0
                   : -EINVAL;
    if (o->status_fd < 0 || o->timeout_ms < 0 || !o->argv || !o->argv[0] ||
        o->pass_fd == o->status_fd)
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

    if (ready_fd < 0) {
        (void)close_range(3, ~0U, 0);
    } else {
        if (ready_fd > 3)
            (void)close_range(3, (unsigned)ready_fd - 1, 0);
        (void)close_range((unsigned)ready_fd + 1, ~0U, 0);
        if (write(ready_fd, "R", 1) != 1)
            return 1;
        (void)close(ready_fd);
    }
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
    if (ready_fd < 0)
        sigaddset(&chld, SIGPWR); /* an engine's clean stop (LXD) */
    (void)sigprocmask(SIG_BLOCK, &chld, NULL);

    for (;;) {
        /* SIGCHLD stays pending while blocked, so no exit is missed between the two. */
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        if (sigwaitinfo(&chld, NULL) == SIGPWR)
            return 0;
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

static void exec_command(char **argv, int status_fd, int pass_fd)
{
    int e;

    /* the status channel is the supervisor's alone: never the command's (it is CLOEXEC too) */
    (void)close(status_fd);
    if (pass_fd >= 0) /* the daemon's channel for the command (a harness launcher) */
        (void)fcntl(pass_fd, F_SETFD, 0);
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
    if (o->pass_fd >= 0)
        (void)fcntl(o->pass_fd, F_SETFD, FD_CLOEXEC);
    /* nothing but stdin, stdout, stderr (and the pass fd) reaches the command (the status fd
     * is CLOEXEC) */
    close_all_but(o->status_fd, o->pass_fd);
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
        exec_command(o->argv, o->status_fd, o->pass_fd);
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

/* ---- framed mode ------------------------------------------------------------------- */

/* Write all of a frame (type, big-endian length, payload) to fd 1; false when it is gone. */
static bool write_frame(char type, const void *data, size_t len)
{
    unsigned char hdr[5] = {(unsigned char)type, (unsigned char)(len >> 24),
                            (unsigned char)(len >> 16), (unsigned char)(len >> 8),
                            (unsigned char)len};
    const unsigned char *parts[2] = {hdr, data};
    size_t sizes[2] = {sizeof(hdr), len};

    for (int p = 0; p < 2; p++) {
        size_t off = 0;

        while (off < sizes[p]) {
            ssize_t w = write(1, parts[p] + off, sizes[p] - off);

            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return false;
            off += (size_t)w;
        }
    }
    return true;
}

struct framed_stream {
    int fd;
    char type;
    int64_t sent;
    bool cut;
};

/* Read what fd has (one read) and relay it within the cap; false at EOF or error. */
static bool relay_once(struct framed_stream *st, int64_t max)
{
    char buf[65536];
    ssize_t n = read(st->fd, buf, sizeof(buf));

    if (n < 0 && errno == EINTR)
        return true;
    if (n <= 0) /* EOF, error, or (draining) nothing left */
        return false;
    if (st->sent < max) {
        size_t room = (size_t)(max - st->sent), k = (size_t)n < room ? (size_t)n : room;

        (void)write_frame(st->type, buf, k);
        st->sent += (int64_t)k;
        if ((size_t)n > k)
            st->cut = true;
    } else {
        st->cut = true;
    }
    return true;
}

/* Bring lo of our network namespace up when it is down (an LXD container without a NIC whose
 * init does not: its loopback is down). Best effort: without CAP_NET_ADMIN nothing changes. */
static void loopback_up(void)
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

/* --exclusive: SIGKILL every process but pid 1 and ourselves until none is left; with
 * spare_init_session also every process of pid 1's own session (an image's init that keeps
 * a child, like a shell looping on sleep: what came in through an exec is always in a
 * session of its own, and no process can join another session). 0 or -1. */
static int kill_all_but_init(bool spare_init_session)
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
            char *end;
            long pid = strtol(e->d_name, &end, 10);

            char path[64], stat[512];
            ssize_t n;
            int fd;

            if (*end || pid <= 1 || pid == self)
                continue;
            if (init_sid > 0 && getsid((pid_t)pid) == init_sid)
                continue;
            /* a zombie is dead already (init reaps it): do not wait for it */
            snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
            fd = open(path, O_RDONLY | O_CLOEXEC);
            n = fd >= 0 ? read(fd, stat, sizeof(stat) - 1) : -1;
            if (fd >= 0)
                close(fd);
            if (n > 0) {
                stat[n] = '\0';
                const char *rp = strrchr(stat, ')');

                if (rp && rp[1] == ' ' && rp[2] == 'Z')
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

static int run_framed(const struct options *o)
{
    int out[2], err[2], status[2], in = -1, pass = -1;
    struct framed_stream streams[2];
    char line[1100];
    size_t line_len = 0;
    struct options child_opts = *o;
    pid_t pid;

    (void)signal(SIGPIPE, SIG_IGN);
    if (o->loopback_up)
        loopback_up();
    if (o->exclusive && kill_all_but_init(o->spare_init_session) < 0) {
        snprintf(line, sizeof(line), "error the other processes of the sandbox would not end");
        (void)write_frame('s', line, strlen(line));
        return 0;
    }
    if (o->stdin_file) {
        in = open(o->stdin_file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (in >= 0)
            (void)unlink(o->stdin_file);
    } else {
        in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if (in < 0) {
        snprintf(line, sizeof(line), "error cannot open stdin: %s", strerror(errno));
        (void)write_frame('s', line, strlen(line));
        return 0;
    }
    if (o->pass_file) {
        pass = open(o->pass_file, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (pass < 0) {
            snprintf(line, sizeof(line), "error cannot open the pass file: %s", strerror(errno));
            (void)write_frame('s', line, strlen(line));
            return 0;
        }
        (void)unlink(o->pass_file);
    }
    if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 || pipe2(status, O_CLOEXEC) < 0) {
        snprintf(line, sizeof(line), "error pipe failed: %s", strerror(errno));
        (void)write_frame('s', line, strlen(line));
        return 0;
    }
    pid = fork();
    if (pid < 0) {
        snprintf(line, sizeof(line), "error fork failed: %s", strerror(errno));
        (void)write_frame('s', line, strlen(line));
        return 0;
    }
    if (pid == 0) {
        (void)signal(SIGPIPE, SIG_DFL);
        if (dup2(in, 0) < 0 || dup2(out[1], 1) < 0 || dup2(err[1], 2) < 0)
            _exit(1);
        child_opts.framed = false;
        child_opts.status_fd = status[1];
        if (pass >= 0) {
            /* fd 4 for the command: move the status pipe out of its way first */
            int st = fcntl(status[1], F_DUPFD_CLOEXEC, 10);

            if (st < 0 || dup2(pass, 4) < 0)
                _exit(1);
            child_opts.status_fd = st;
            child_opts.pass_fd = 4;
        }
        /* run_command closes every fd above 2 but the status fd */
        _exit(run_command(&child_opts));
    }
    (void)close(in);
    if (pass >= 0)
        (void)close(pass);
    (void)close(out[1]);
    (void)close(err[1]);
    (void)close(status[1]);
    streams[0] = (struct framed_stream){.fd = out[0], .type = 'o'};
    streams[1] = (struct framed_stream){.fd = err[0], .type = 'e'};
    bool open_fds[3] = {true, true, true};

    while (open_fds[2]) {
        struct pollfd pfd[3];

        for (int i = 0; i < 2; i++)
            pfd[i] = (struct pollfd){.fd = open_fds[i] ? streams[i].fd : -1, .events = POLLIN};
        pfd[2] = (struct pollfd){.fd = status[0], .events = POLLIN};
        if (poll(pfd, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        for (int i = 0; i < 2; i++) {
            if (open_fds[i] && (pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
                open_fds[i] = relay_once(&streams[i], o->max_output);
        }
        if (pfd[2].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = read(status[0], line + line_len, sizeof(line) - 1 - line_len);

            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                open_fds[2] = false;
            else
                line_len += (size_t)n;
            if (line_len >= sizeof(line) - 1)
                open_fds[2] = false;
        }
    }
    /* the tree is gone (or left on purpose): take what the pipes already hold, then stop */
    for (int i = 0; i < 2; i++) {
        (void)fcntl(streams[i].fd, F_SETFL, O_NONBLOCK);
        while (open_fds[i] && relay_once(&streams[i], o->max_output))
            ;
        if (streams[i].cut)
            (void)write_frame('T', &streams[i].type, 1);
    }
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    while (line_len && line[line_len - 1] == '\n')
        line_len--;
    (void)write_frame('s', line, line_len);
    return 0;
}

/* ---- harness mode --------------------------------------------------------------------- */

struct receipt {
    bool confirmed;
    bool have_rc;
    int rc;
    bool timed_out;
    bool launched;
    bool stop_requested;
    char error[512]; /* "" is null */
};

static void harness_path(char *buf, const char *dir, const char *name)
{
    snprintf(buf, PATH_MAX, "%s/%s", dir, name);
}

static bool harness_exists(const char *dir, const char *name)
{
    char path[PATH_MAX];
    struct stat st;

    harness_path(path, dir, name);
    return lstat(path, &st) == 0;
}

/* mkdir -p with mode 0700 for what it creates. 0 or -errno. */
static int mkdir_p(const char *dir)
{
    char path[PATH_MAX];
    size_t n = strlen(dir);

    if (n == 0 || n >= sizeof(path))
        return -ENAMETOOLONG;
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != '\0')
            continue;
        path[i] = '\0';
        if (mkdir(path, 0700) < 0 && errno != EEXIST)
            return -errno;
        path[i] = i < n ? '/' : '\0';
    }
    return 0;
}

/* Write len bytes to DIR/name through a temp file and a rename. 0 or -errno. */
static int write_atomic(const char *dir, const char *name, const char *data, size_t len)
{
    char tmp[PATH_MAX], path[PATH_MAX];
    size_t off = 0;
    int fd, e = 0;

    snprintf(tmp, sizeof(tmp), "%s/.%s.%d.tmp", dir, name, (int)getpid());
    harness_path(path, dir, name);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);

        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            e = w < 0 ? errno : EIO;
            break;
        }
        off += (size_t)w;
    }
    if (close(fd) < 0 && !e)
        e = errno;
    if (!e && rename(tmp, path) < 0)
        e = errno;
    if (e)
        (void)unlink(tmp);
    return -e;
}

/* JSON string body of s: quotes, backslashes and control characters escaped, bytes outside
 * ASCII replaced by '?' so the receipt is always valid UTF-8. */
static void json_escape(const char *s, char *out, size_t cap)
{
    size_t o = 0;

    for (; *s && o + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;

        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c < 0x20) {
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
        } else {
            out[o++] = c < 0x80 ? (char)c : '?';
        }
    }
    out[o] = '\0';
}

/* The receipt goes to the host-side file the daemon made and handed us as fd (no sandbox
 * process can reach it: the file is outside the sandbox and this process is non-dumpable).
 * One pwrite at offset 0 of the whole JSON and its terminating newline, then fsync: the
 * daemon takes only a newline-terminated object as complete. Written once. 0 or -errno. */
static int write_receipt(int fd, const struct receipt *r)
{
    char rc[32] = "null", err[1100] = "null", esc[1024], json[2048];
    size_t off = 0;
    int n;

    if (fd < 0)
        return -EBADF;
    if (r->have_rc)
        snprintf(rc, sizeof(rc), "%d", r->rc);
    if (r->error[0]) {
        json_escape(r->error, esc, sizeof(esc));
        snprintf(err, sizeof(err), "\"%s\"", esc);
    }
    n = snprintf(json, sizeof(json),
                 "{\"cleanup_confirmed\": %s, \"return_code\": %s, \"timed_out\": %s, "
                 "\"error\": %s, \"launched\": %s, \"stop_requested\": %s}\n",
                 r->confirmed ? "true" : "false", rc, r->timed_out ? "true" : "false", err,
                 r->launched ? "true" : "false", r->stop_requested ? "true" : "false");
    while (off < (size_t)n) {
        ssize_t w = pwrite(fd, json + off, (size_t)n - off, (off_t)off);

        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        off += (size_t)w;
    }
    return fsync(fd) < 0 && errno != EINVAL ? -errno : 0;
}

static void set_error(struct receipt *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_error(struct receipt *r, const char *fmt, ...)
{
    va_list ap;

    if (r->error[0])
        return; /* the first failure is the interesting one */
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof(r->error), fmt, ap);
    va_end(ap);
}

/* Reap until the harness is done or ms passes. */
static void wait_harness(struct child_state *cmd, int sfd, int64_t ms)
{
    int64_t deadline = mono_ms() + ms;

    for (;;) {
        int64_t left;

        if (reap(cmd) || cmd->done)
            return;
        left = deadline - mono_ms();
        if (left <= 0)
            return;
        wait_signal(sfd, left < KILL_POLL_MS * 5 ? left : KILL_POLL_MS * 5, NULL);
    }
}

/* The three cleanup phases: TERM and wait, KILL and wait, drain every descendant. */
static void harness_cleanup(struct child_state *cmd, int sfd, int64_t phase, struct receipt *r)
{
    const char *fail = NULL;
    int64_t deadline;

    if (!cmd->done) {
        (void)kill(-cmd->pid, SIGTERM);
        wait_harness(cmd, sfd, phase);
    }
    if (!cmd->done) {
        (void)kill(-cmd->pid, SIGKILL);
        wait_harness(cmd, sfd, phase);
        if (!cmd->done)
            fail = "the harness did not exit after SIGKILL";
    }
    deadline = mono_ms() + phase;
    for (;;) {
        if (!cmd->done) /* after the leader is reaped its pid may be reused */
            (void)kill(-cmd->pid, SIGKILL);
        (void)signal_descendants(SIGKILL);
        if (reap(cmd))
            break; /* no child (and, as a subreaper, no descendant) left */
        if (mono_ms() >= deadline) {
            fail = "sandbox processes of the harness remain alive";
            break;
        }
        wait_signal(sfd, KILL_POLL_MS, NULL);
    }
    if (cmd->done) {
        r->have_rc = true;
        r->rc = WIFEXITED(cmd->status)
                    ? WEXITSTATUS(cmd->status)
                    : 128 + (WIFSIGNALED(cmd->status) ? WTERMSIG(cmd->status) : 0);
    }
    r->confirmed = !fail;
    if (fail && r->error[0]) {
        size_t len = strlen(r->error);

        snprintf(r->error + len, sizeof(r->error) - len, "; cleanup: %s", fail);
    } else if (fail) {
        set_error(r, "cleanup: %s", fail);
    }
}

static void exec_harness(char **argv, int err_fd)
{
    int e;

    setpgid(0, 0);
    reset_signals();
    execvp(argv[0], argv);
    e = errno;
    if (write(err_fd, &e, sizeof(e)) != (ssize_t)sizeof(e)) {
        /* the supervisor then reports the exit status alone */
    }
    dprintf(2, "lendbox-supervise: cannot run '%s': %s\n", argv[0], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
}

/* Point 0 at /dev/null and 1, 2 at DIR/output.log; close every other fd but keep and
 * keep2. */
static int harness_stdio(const char *dir, int keep, int keep2)
{
    char path[PATH_MAX];
    int log_fd, null_fd;

    harness_path(path, dir, "output.log");
    log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0)
        return -errno;
    null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(log_fd, 1) < 0 || dup2(log_fd, 2) < 0)
        return -errno;
    close_all_but(keep, keep2);
    return 0;
}

/* The harness supervisor (a child of the launcher). Reports setup with one byte on ready_fd.
 * Returns its exit status. */
static int run_harness(const struct options *o, int ready_fd)
{
    struct child_state cmd = {.pid = -1};
    struct receipt r = {0};
    char pid_text[32];
    int terminating = 0, err_pipe[2], e = 0, sfd, n;
    bool timed_out = false;
    int64_t deadline;
    sigset_t set;
    ssize_t got;

    (void)setsid();
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    if ((e = harness_stdio(o->harness_launch, ready_fd, o->receipt_fd)) < 0) {
        set_error(&r, "the harness supervisor cannot open its output log: %s", strerror(-e));
        r.confirmed = true;
        (void)write_receipt(o->receipt_fd, &r);
        return 1;
    }
    n = snprintf(pid_text, sizeof(pid_text), "%d\n", (int)getpid());
    (void)write_atomic(o->harness_launch, "supervisor.pid", pid_text, (size_t)n);

    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGQUIT);
    (void)sigprocmask(SIG_BLOCK, &set, NULL);
    sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0 || pipe2(err_pipe, O_CLOEXEC) < 0) {
        set_error(&r, "the harness supervisor cannot start: %s", strerror(errno));
        r.confirmed = true;
        (void)write_receipt(o->receipt_fd, &r);
        return 1;
    }
    if (write(ready_fd, "R", 1) != 1) {
        /* the launcher is gone; carry on, the receipt tells the rest */
    }
    (void)close(ready_fd);

    if (harness_exists(o->harness_launch, "stop.request")) {
        r.stop_requested = true;
        r.confirmed = true;
        dprintf(2, "lendbox-supervise: stop requested before the harness started\n");
        return write_receipt(o->receipt_fd, &r) < 0;
    }
    r.launched = true;
    deadline = mono_ms() + o->timeout_ms;
    cmd.pid = fork();
    if (cmd.pid < 0) {
        set_error(&r, "fork failed: %s", strerror(errno));
        r.confirmed = true;
        return write_receipt(o->receipt_fd, &r) < 0;
    }
    if (cmd.pid == 0) {
        (void)close(err_pipe[0]);
        exec_harness(o->argv, err_pipe[1]);
    }
    (void)setpgid(cmd.pid, cmd.pid);
    (void)close(err_pipe[1]);
    do
        got = read(err_pipe[0], &e, sizeof(e));
    while (got < 0 && errno == EINTR);
    (void)close(err_pipe[0]);
    if (got == (ssize_t)sizeof(e)) {
        set_error(&r, "cannot run '%s': %s", o->argv[0], strerror(e));
        /* it exits right after reporting: take its status before any signal can reach it */
        while (waitpid(cmd.pid, &cmd.status, 0) < 0 && errno == EINTR)
            ;
        cmd.done = true;
    }

    while (!r.error[0]) {
        int64_t left;

        reap(&cmd);
        if (cmd.done) {
            /* a harness that ended on seeing the stop request (its stop_request_path) may be
             * reaped before this loop saw the request: it was still stopped by it */
            if (harness_exists(o->harness_launch, "stop.request"))
                r.stop_requested = true;
            break;
        }
        if (terminating || harness_exists(o->harness_launch, "stop.request")) {
            r.stop_requested = true;
            break;
        }
        left = deadline - mono_ms();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        wait_signal(sfd, left < HARNESS_POLL_MS ? left : HARNESS_POLL_MS, &terminating);
    }
    if (r.stop_requested)
        dprintf(2, "lendbox-supervise: stop requested; ending the harness\n");
    else if (timed_out)
        dprintf(2, "lendbox-supervise: the harness timed out after %lld ms; ending it\n",
                (long long)o->timeout_ms);
    r.timed_out = timed_out;
    harness_cleanup(&cmd, sfd, o->cleanup_timeout_ms, &r);
    return write_receipt(o->receipt_fd, &r) < 0;
}

static int run_harness_launch(struct options *o)
{
    char claim[PATH_MAX], target[16], b;
    int ready[2], e;
    ssize_t n;
    pid_t pid;

    e = mkdir_p(o->harness_launch);
    if (e < 0) {
        fprintf(stderr, "lendbox-supervise: cannot create '%s': %s\n", o->harness_launch,
                strerror(-e));
        return 1;
    }
    /* the receipt channel is the harness supervisor's alone, never the harness's */
    if (!o->receipt_file && fcntl(o->receipt_fd, F_SETFD, FD_CLOEXEC) < 0) {
        fprintf(stderr, "lendbox-supervise: no receipt fd %d: %s\n", o->receipt_fd,
                strerror(errno));
        return 1;
    }
    harness_path(claim, o->harness_launch, "launch.claim");
    if (symlink("launch", claim) < 0) {
        if (errno != EEXIST) {
            fprintf(stderr, "lendbox-supervise: cannot claim the launch: %s\n", strerror(errno));
            return 1;
        }
        n = readlink(claim, target, sizeof(target) - 1);
        if (n == 4 && memcmp(target, "stop", 4) == 0) {
            printf("fenced\n");
            return 3;
        }
        printf("already launched\n");
        return 4;
    }
    if (o->receipt_file) {
        /* made only now, by the claim's winner, and never over a file already there (a
         * sandbox process could still write it later: the daemon says so, see the header) */
        o->receipt_fd =
            open(o->receipt_file, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (o->receipt_fd < 0) {
            fprintf(stderr, "lendbox-supervise: cannot create the receipt file '%s': %s\n",
                    o->receipt_file, strerror(errno));
            return 1;
        }
    }
    if (pipe2(ready, O_CLOEXEC) < 0 || (pid = fork()) < 0) {
        struct receipt r = {.confirmed = true};

        set_error(&r, "cannot start the harness supervisor: %s", strerror(errno));
        (void)write_receipt(o->receipt_fd, &r);
        fprintf(stderr, "lendbox-supervise: %s\n", r.error);
        return 1;
    }
    if (pid == 0) {
        (void)close(ready[0]);
        _exit(run_harness(o, ready[1]));
    }
    (void)close(ready[1]);
    do
        n = read(ready[0], &b, 1);
    while (n < 0 && errno == EINTR);
    if (n != 1) {
        fprintf(stderr, "lendbox-supervise: the harness supervisor failed to start (see %s)\n",
                "output.log and receipt.json");
        return 1;
    }
    printf("launched %d\n", (int)pid);
    return 0;
}

static int run_harness_stop(const char *dir)
{
    char path[PATH_MAX], target[16];
    ssize_t n;
    int fd, e;

    e = mkdir_p(dir);
    if (e < 0) {
        fprintf(stderr, "lendbox-supervise: cannot create '%s': %s\n", dir, strerror(-e));
        return 1;
    }
    harness_path(path, dir, "stop.request");
    fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "lendbox-supervise: cannot request the stop: %s\n", strerror(errno));
        return 1;
    }
    (void)close(fd);
    harness_path(path, dir, "launch.claim");
    if (symlink("stop", path) < 0) {
        if (errno != EEXIST) {
            fprintf(stderr, "lendbox-supervise: cannot claim the launch: %s\n", strerror(errno));
            return 1;
        }
        n = readlink(path, target, sizeof(target) - 1);
        if (n != 4 || memcmp(target, "stop", 4) != 0) {
            printf("requested\n"); /* the harness supervisor writes the receipt */
            return 0;
        }
    }
    /* The stop won the claim: nothing was or will be launched (the daemon records it). */
    printf("fenced\n");
    return 0;
}

int main(int argc, char **argv)
{
    struct options o;

    /* First, before anything else: nothing else in the sandbox runs as another uid, so only
     * this keeps its processes from ptrace, pidfd_getfd, /proc/<pid>/fd and /proc/<pid>/mem on
     * us (and on the status, stdout and stderr channels we hold). Installed exec-only (mode
     * 0711, owned by host root) the binary is non-dumpable from the exec on, with no window
     * at all; this call covers a readable copy. Inherited by forks, reset by exec, so the
     * commands we run are not affected. */
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (argc == 1 && getpid() == 1) {
        loopback_up();
        return run_init(-1); /* an engine's init: /sbin/init of an imported LXD image */
    }
    if (parse_options(argc, argv, &o) < 0) {
        fprintf(
            stderr,
            "usage: lendbox-supervise --init --ready-fd N\n"
            "       lendbox-supervise --status-fd N --timeout-ms MS [--cwd DIR] "
            "[--keep-background] [--pass-fd P] -- ARGV...\n"
            "       lendbox-supervise --harness-launch DIR (--receipt-fd N | --receipt-file PATH) "
            "--timeout-ms MS --cleanup-timeout-ms MS -- ARGV...\n"
            "       lendbox-supervise --harness-stop DIR\n"
            "       lendbox-supervise --framed --max-output BYTES --timeout-ms MS "
            "[--cwd DIR] [--keep-background] [--stdin-file PATH] [--pass-file PATH] [--exclusive "
            "[--spare-init-session]] [--loopback-up] "
            "-- ARGV...\n");
        if (o.status_fd >= 0)
            write_status(o.status_fd, "error bad lendbox-supervise arguments");
        return 2;
    }
    if (o.init)
        return run_init(o.ready_fd);
    if (o.harness_launch)
        return run_harness_launch(&o);
    if (o.harness_stop)
        return run_harness_stop(o.harness_stop);
    if (o.framed)
        return run_framed(&o);
    return run_command(&o);
}
