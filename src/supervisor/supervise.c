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
 *                     [--pass-fd P] [--user USER] -- ARGV...
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
 *       launcher); the supervisor itself holds it close-on-exec. --user USER (a name of the
 *       sandbox's /etc/passwd, a uid, NAME:GROUP or UID:GID; user.c looks it up in the
 *       sandbox's own files) runs the command as that user: exactly the groups the sandbox's
 *       /etc/group gives it, HOME from passwd unless the environment sets one; an unknown
 *       user is the status "error unknown user ...". Every launch path (command, framed,
 *       harness) switches right before its exec, and the command never keeps a capability.
 *       --untrusted-dir DIR (an exclusive exec's workdir): a HOME from passwd that is DIR or
 *       below it becomes /tmp, so the agent's dotfiles and ~/.local are not the command's.
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
 *       newline). --pass-socket PATH: connects to the daemon's unix socket PATH, receives one fd
 *       (SCM_RIGHTS) and gives it to the command alone as fd 4 (command mode's --pass-fd 4):
 *       the docker provider's way of passing a daemon fd (the daemon hands it only to the
 *       exec's own process; a socket whose owner is visible in the sandbox is refused).
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
 *                     --timeout-ms MS --cleanup-timeout-ms MS [--user USER] -- ARGV...
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
 *       the receipt itself; otherwise it sends SIGCONT to the harness supervisor (a sandbox
 *       process may have stopped it), prints "requested", and the running harness supervisor
 *       sees the request and writes the receipt. Exits 1 when the request cannot be made.
 *
 * Enter mode (the local provider's exec helper; run by the daemon as host root, outside the
 * sandbox, from a vfork-style spawn that shares the daemon's memory until this exec):
 *
 *   lendbox-supervise --enter [--keyrings-refused] NCHILD NCG SECCOMP_FD NOFILE NENV ENV... --
 *                     ARGV...
 *       fds 0..NCHILD-1 are the command-mode supervisor's (0 stdin, 1 stdout, 2 stderr,
 *       3 status, 4 the pass fd), NCHILD..NCHILD+5 the sandbox init's user, mnt, pid, net, uts
 *       and ipc namespaces, the next NCG its cgroup.procs files, SECCOMP_FD (-1: none) a memfd
 *       with the classic BPF filter. --keyrings-refused: the daemon found that the host
 *       refuses it the keyring calls with a seccomp filter (so every sandbox process is
 *       refused them too), and EPERM for the session keyring below is not an error.
 *       Joins the cgroups and a fresh session keyring, enters the
 *       namespaces (user first), becomes uid/gid 0 there (the sandbox's host uid), drops every
 *       capability, sets no_new_privs, installs the filter and umask 022, then forks ARGV (the
 *       command-mode supervisor, inside the sandbox's pid namespace) with fds 0..NCHILD-1, the
 *       open-file limit NOFILE and the environment ENV..., writes "supervisor PID" on fd 3,
 *       closes every fd and waits for it: exit 0, or 128 + N when signal N killed it. It stays
 *       the supervisor's parent (an orphan would go to the host's init, whose late reaping
 *       holds up the pid namespace's teardown). Failures: "error WHAT: errno N" on fd 3, exit
 *       1. This process is never visible in the sandbox's pid namespace, so no sandbox
 *       process can signal it; its memory is its own (a stopped or frozen helper never stops
 *       a daemon thread).
 *
 *   lendbox-supervise --enter-view KIND BASE HOSTS WORKDIR TMP_MIB [--keyrings-refused] NCHILD ...
 *                     -- ARGV...
 *       The same for an exclusive exec (a grader), which runs on a trusted view of the
 *       sandbox: right after it becomes the sandbox's root, the helper makes a mount namespace
 *       of its own whose / is the base image read-only (KIND "mounted": BASE is the idmapped
 *       tree the sandbox's overlay is over; "image": BASE is the image tree, idmapped here
 *       through the sandbox's user namespace; "root": the sandbox's own read-only root, image
 *       host), with the sandbox's /proc and /dev, fresh /tmp, /run and /dev/shm of TMP_MIB
 *       MiB, HOSTS ("-": none) at /etc/hosts and the sandbox's WORKDIR at its path (see
 *       view_enter). BASE and HOSTS are cloned on the host, before any namespace is entered.
 *
 * Reserve mode (the local provider's upload helper; run by the daemon as host root, outside
 * every namespace of the sandbox, from a vfork-style spawn):
 *
 *   lendbox-supervise --reserve UID OFFSET LENGTH
 *       fd 0 is an upload's temporary file on a memory-backed mount (a tmpfs, or an overlay
 *       on one) of a sandbox, fd 1 the cgroup.procs of the sandbox's memory cgroup (on cgroup
 *       v1 the memory hierarchy's alone, so a paused sandbox's freezer does not hold it).
 *       Offers itself first to the out-of-memory killer (oom_score_adj 1000, before it joins:
 *       the sandbox's own processes are spared), joins that cgroup, becomes host uid/gid UID
 *       (the sandbox's) without capabilities, and allocates LENGTH bytes of the file from
 *       OFFSET (fallocate, size kept). tmpfs pages
 *       are charged to the memory cgroup of the process that allocates them, so the upload's
 *       pages count against the sandbox's memory limit, never the daemon's; the daemon then
 *       writes into pages that exist. Exit 0, or the errno value (< 125) of the step that
 *       failed (ENOSPC: the mount is full, ENOMEM: the memory limit), 125 for bad arguments;
 *       killed by SIGKILL when the limit cannot hold the pages.
 *
 * PTY mode (NeMo Gym's PTY sessions and detached exec; the daemon's lend/pty.c). Run as the
 * command of an ordinary exec (with --keep-background) whose pass fd is a directory on the host
 * that only the daemon and this fd reach:
 *
 *   lendbox-supervise --pty-launch --dir-fd N [--rows R] [--cols C] [--no-pty] [--user USER]
 *                     -- ARGV...
 *       Forks the holder, which leaves the caller's session (setsid), becomes a child
 *       subreaper, points 0/1/2 at /dev/null, makes the FIFOs "in" (raw input) and "ctl"
 *       (lines "resize R C", "signal N", "kill", "eof") in the directory, opens a terminal
 *       (R x C; --no-pty: three pipes) and runs ARGV on it in a new session with the terminal as
 *       its controlling tty. The launcher prints "launched PID" once that is set up and exits 0
 *       (1 on errors). The holder writes the command's output to segment files out.K (err.K
 *       for stderr with --no-pty) of 256 KiB of logical offset K*256 KiB each, keeping the 5
 *       newest; once the command exited and its output is drained (the terminal reads EIO, the
 *       pipes EOF, or 1 s passes without a byte while a background process holds them) it kills
 *       what is left of the tree and renames the exit code (128+N for signal N) into "exit":
 *       its presence means every output byte is in. "signal N" goes to the terminal's
 *       foreground process group and the command's group; "kill" (or SIGTERM to the holder)
 *       kills the tree.
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
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>

#include <net/if.h>
#include <linux/falloc.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "supervisor/user.h"

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
    const char *pass_socket; /* framed: the daemon's socket that hands the command's fd 4 */
    bool exclusive;          /* framed: first SIGKILL every process of the pid namespace but 1 */
    bool pty_launch;         /* --pty-launch: start a detached PTY (or pipe) session */
    int pty_dir_fd;          /* its session directory (the daemon's, on the host) */
    int64_t pty_rows, pty_cols;
    bool pty_pipes;            /* --no-pty: stdin, stdout and stderr are pipes */
    const char *user;          /* --user: run the command (the harness) as this user */
    bool spare_init_session;   /* exclusive: and but those of pid 1's session */
    bool loopback_up;          /* framed: first bring the network namespace's lo up */
    const char *untrusted_dir; /* command: a HOME from passwd at or below it becomes /tmp */
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
    o->pty_dir_fd = -1;
    o->pty_rows = 24;
    o->pty_cols = 80;
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
        } else if (strcmp(a, "--pty-launch") == 0) {
            o->pty_launch = true;
        } else if (strcmp(a, "--no-pty") == 0) {
            o->pty_pipes = true;
        } else if (strcmp(a, "--dir-fd") == 0 && parse_int64(val, 3, INT_MAX, &v) == 0) {
            o->pty_dir_fd = (int)v;
            i++;
        } else if (strcmp(a, "--rows") == 0 && parse_int64(val, 1, 65535, &v) == 0) {
            o->pty_rows = v;
            i++;
        } else if (strcmp(a, "--cols") == 0 && parse_int64(val, 1, 65535, &v) == 0) {
            o->pty_cols = v;
            i++;
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
        } else if (strcmp(a, "--pass-socket") == 0 && val && val[0] == '/') {
            o->pass_socket = val;
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
        } else if (strcmp(a, "--untrusted-dir") == 0 && val && val[0] == '/' && val[1]) {
            o->untrusted_dir = val;
            i++;
        } else if (strcmp(a, "--user") == 0 && val && *val) {
            o->user = val;
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
    if (o->pty_launch)
        return o->pty_dir_fd >= 0 && o->argv && o->argv[0] ? 0 : -EINVAL;
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

/* The user to run as (--user, looked up in this sandbox's /etc/passwd and /etc/group: the
 * supervisor's root is the sandbox's) into *u; *have false without --user. 0, or a negative
 * errno with a one-line reason in why. */
static int user_prepare(const char *spec, struct sup_user *u, bool *have, char *why, size_t why_len)
{
    int rootfd, r;

    *have = false;
    if (!spec)
        return 0;
    rootfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0) {
        snprintf(why, why_len, "cannot open /: %s", strerror(errno));
        return -errno;
    }
    r = sup_user_resolve(rootfd, spec, u, why, why_len);
    close(rootfd);
    *have = r == 0;
    return r;
}

/* In the forked child, right before the exec of every launch path (command, harness): become
 * the user (have) or stay who we are, in both cases without a capability, bounding set
 * included (the exec helper leaves the supervisor CAP_SETUID, CAP_SETGID and CAP_SETPCAP in the
 * sandbox's user namespace, for this switch alone); HOME from passwd when the environment has
 * none. 0 or -errno. */
/* --untrusted-dir (an exclusive exec's workdir, which the agent wrote): a HOME there would
 * put the agent's files where programs look for their own (~/.local, dotfiles) */
static const char *untrusted_dir;

static bool path_is_at_or_below(const char *path, const char *dir)
{
    size_t n = strlen(dir);

    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

static int user_become(const struct sup_user *u, bool have)
{
    struct sup_user self;
    char num[16];
    int r;

    if (have) {
        r = sup_user_switch(u);
        if (r < 0)
            return r;
    } else {
        (void)sup_user_drop_caps();
    }
    if (!getenv("HOME")) {
        int rootfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        const char *home = NULL;

        snprintf(num, sizeof(num), "%u", (unsigned)getuid());
        if (have)
            home = u->home;
        else if (rootfd >= 0 && sup_user_resolve(rootfd, num, &self, NULL, 0) == 0)
            home = self.home;
        if (home && untrusted_dir && path_is_at_or_below(home, untrusted_dir))
            home = "/tmp";
        if (home)
            (void)setenv("HOME", home, 1);
        if (rootfd >= 0)
            close(rootfd);
    }
    return 0;
}

/* Is argv one of this program's own modes the daemon runs as a command (an activation's launch
 * or stop request, a PTY session's start: the daemon names it by its path in the sandbox)?
 * Those stay the sandbox's root (launchers switch to their own --user right before their
 * command's exec), and run as this very binary (/proc/self/exe), never as the file now at that
 * path: the sandbox's root owns /run and could put its own program there.
 * (A command naming it itself gains nothing: it gets the real launcher, as the sandbox's root,
 * which its own request could have asked for.) */
static bool is_own_harness_launch(char **argv)
{
    return argv[0] && argv[1] && strcmp(argv[0], "/run/lendbox/supervise") == 0 &&
           (strcmp(argv[1], "--harness-launch") == 0 || strcmp(argv[1], "--pty-launch") == 0 ||
            strcmp(argv[1], "--harness-stop") == 0);
}

static void exec_command(char **argv, int status_fd, int pass_fd, const struct sup_user *u,
                         bool have_user)
{
    bool own;
    int e;

    /* the status channel is the supervisor's alone: never the command's (it is CLOEXEC too) */
    (void)close(status_fd);
    if (pass_fd >= 0) /* the daemon's channel for the command (a harness launcher) */
        (void)fcntl(pass_fd, F_SETFD, 0);
    setpgid(0, 0);
    reset_signals();
    /* our own harness and PTY launchers stay who we are, capabilities included: the harness
     * supervisor (the PTY holder) switches to its --user right before its command's exec */
    own = is_own_harness_launch(argv);
    e = own ? 0 : user_become(u, have_user);
    if (e < 0) {
        dprintf(2, "lendbox-supervise: cannot become the user: %s\n", strerror(-e));
        _exit(126);
    }
    if (own)
        execv("/proc/self/exe", argv);
    else
        execvp(argv[0], argv);
    e = errno;
    dprintf(2, "lendbox-supervise: cannot run '%s': %s\n", argv[0], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
}

static int run_command(const struct options *o)
{
    struct child_state cmd = {.pid = -1};
    struct sup_user user;
    char why[300];
    int terminating = 0;
    bool timed_out = false, have_user;
    int64_t deadline;
    sigset_t set;
    int sfd;

    untrusted_dir = o->untrusted_dir;
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
    if (user_prepare(o->user, &user, &have_user, why, sizeof(why)) < 0) {
        write_status(o->status_fd, "error %s", why);
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
        exec_command(o->argv, o->status_fd, o->pass_fd, &user, have_user);
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
            snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
            fd = open(path, O_RDONLY | O_CLOEXEC);
            n = fd >= 0 ? read(fd, stat, sizeof(stat) - 1) : -1;
            if (fd >= 0)
                close(fd);
            if (n > 0) {
                stat[n] = '\0';
                const char *rp = strrchr(stat, ')');

                /* A zombie is dead already (init reaps it): do not wait for it, unless it is
                 * a thread-group leader that exited while other threads of it run: the kill
                 * to the group ends those, and it counts until they are gone. */
                if (rp && rp[1] == ' ' && rp[2] == 'Z') {
                    (void)kill((pid_t)pid, SIGKILL);
                    if (has_other_threads((pid_t)pid))
                        found++;
                    continue;
                }
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

/* --pass-socket: connect to the daemon's socket at path and receive the one fd it hands over
 * (SCM_RIGHTS with one byte). The daemon listens from outside the sandbox's pid namespace, so
 * the socket's owner has no pid here (SO_PEERCRED pid 0); a socket a sandbox process put at
 * that path (the directory is the sandbox's to change) has one, and is refused before anything
 * is read from it. Returns the fd (close-on-exec), or -1 with "error ..." in line. */
static int receive_pass_fd(const char *path, char *line, size_t size)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct timeval tv = {.tv_sec = 60};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    char byte;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    struct ucred cred;
    socklen_t len = sizeof(cred);
    struct cmsghdr *c;
    int s = -1, fd = -1;
    ssize_t n;

    if (strlen(path) >= sizeof(sa.sun_path)) {
        snprintf(line, size, "error the pass socket's path is too long");
        return -1;
    }
    memcpy(sa.sun_path, path, strlen(path) + 1);
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0 || setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
        connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        snprintf(line, size, "error cannot reach the pass socket: %s", strerror(errno));
        goto out;
    }
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.pid != 0) {
        snprintf(line, size,
                 "error the pass socket is not the daemon's (a sandbox process "
                 "listens on it)");
        goto out;
    }
    memset(u.buf, 0, sizeof(u.buf));
    do
        n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    c = n == 1 ? CMSG_FIRSTHDR(&msg) : NULL;
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(sizeof(int)) && !(msg.msg_flags & MSG_CTRUNC))
        memcpy(&fd, CMSG_DATA(c), sizeof(int));
    if (fd < 0)
        snprintf(line, size, "error the daemon passed no fd: %s",
                 n < 0 ? strerror(errno) : "it refused this process");
out:
    if (s >= 0)
        (void)close(s);
    return fd;
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
    if (o->pass_socket) {
        pass = receive_pass_fd(o->pass_socket, line, sizeof(line));
        if (pass < 0) {
            (void)write_frame('s', line, strlen(line));
            return 0;
        }
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

static void exec_harness(char **argv, int err_fd, const struct sup_user *u, bool have_user)
{
    int e;

    setpgid(0, 0);
    reset_signals();
    e = user_become(u, have_user);
    if (e < 0) {
        e = -e;
        if (write(err_fd, &e, sizeof(e)) != (ssize_t)sizeof(e)) {
            /* the supervisor then reports the exit status alone */
        }
        dprintf(2, "lendbox-supervise: cannot become the user: %s\n", strerror(e));
        _exit(126);
    }
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
static int run_harness(const struct options *o, int ready_fd, const struct sup_user *user,
                       bool have_user)
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
        exec_harness(o->argv, err_pipe[1], user, have_user);
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
        /* the deadline first: a supervisor that was frozen (a paused sandbox) past it finds
         * the harness timed out, even if a stop request came in meanwhile */
        left = deadline - mono_ms();
        if (left <= 0) {
            timed_out = true;
            if (terminating || harness_exists(o->harness_launch, "stop.request"))
                r.stop_requested = true;
            break;
        }
        if (terminating || harness_exists(o->harness_launch, "stop.request")) {
            r.stop_requested = true;
            break;
        }
        wait_signal(sfd, left < HARNESS_POLL_MS ? left : HARNESS_POLL_MS, &terminating);
    }
    if (r.stop_requested && !timed_out)
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
    char claim[PATH_MAX], target[16], b, why[300];
    struct sup_user user;
    bool have_user;
    int ready[2], e;
    ssize_t n;
    pid_t pid;

    if (user_prepare(o->user, &user, &have_user, why, sizeof(why)) < 0) {
        fprintf(stderr, "lendbox-supervise: %s\n", why);
        return 1;
    }

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
        _exit(run_harness(o, ready[1], &user, have_user));
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

/* A sandbox process (same uid) may have stopped the harness supervisor (SIGSTOP), which then
 * never sees the stop request: continue it. Its pid comes from DIR/supervisor.pid, which
 * sandbox processes can rewrite; a SIGCONT to whatever pid is there is harmless. */
static void harness_continue(const char *dir)
{
    char path[PATH_MAX], text[32];
    int64_t pid;
    ssize_t n;
    int fd;

    harness_path(path, dir, "supervisor.pid");
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return;
    n = read(fd, text, sizeof(text) - 1);
    (void)close(fd);
    if (n <= 0)
        return;
    text[n] = '\0';
    text[strcspn(text, "\n")] = '\0';
    if (parse_int64(text, 2, INT_MAX, &pid) == 0)
        (void)kill((pid_t)pid, SIGCONT);
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
            harness_continue(dir);
            printf("requested\n"); /* the harness supervisor writes the receipt */
            return 0;
        }
    }
    /* The stop won the claim: nothing was or will be launched (the daemon records it). */
    printf("fenced\n");
    return 0;
}

/* ---- enter mode (the local provider's exec helper) ---- */

#define ENTER_STATUS_FD 3
#define ENTER_NS 6
#define ENTER_SECCOMP_MAX (64 * 1024)
#define ENTER_CLOSE_RANGE_CLOEXEC (1U << 2) /* linux/close_range.h, Linux 5.11 */

static void enter_fail(const char *what)
{
    write_status(ENTER_STATUS_FD, "error %s: errno %d", what, errno);
    _exit(1);
}

/* Every capability but CAP_SETUID, CAP_SETGID and CAP_SETPCAP gone (bounding, ambient,
 * effective/permitted/inheritable) and no new privileges: as uid 0 of the sandbox's user
 * namespace we got all of them by entering it. The three kept act only inside that namespace
 * (they switch among the sandbox's own ids and shrink the bounding set): the command-mode
 * supervisor needs them to run a command as a sandbox user, and drops all three, bounding set
 * included, in the command before its exec. */
static int enter_drop_capabilities(void)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    const uint32_t keep = (1u << CAP_SETUID) | (1u << CAP_SETGID) | (1u << CAP_SETPCAP);

    for (int cap = 0; cap <= 63; cap++)
        if (cap != CAP_SETUID && cap != CAP_SETGID && cap != CAP_SETPCAP &&
            prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
            return -1;
    (void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    memset(data, 0, sizeof(data));
    data[0].effective = data[0].permitted = keep;
    if (syscall(SYS_capset, &hdr, data) < 0)
        return -1;
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
}

static int enter_install_seccomp(int fd)
{
    static struct sock_filter prog[ENTER_SECCOMP_MAX / sizeof(struct sock_filter)];
    struct sock_fprog fprog;
    size_t off = 0;
    ssize_t n;

    while ((n = pread(fd, (char *)prog + off, sizeof(prog) - off, (off_t)off)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        off += (size_t)n;
        if (off == sizeof(prog)) {
            errno = E2BIG;
            return -1;
        }
    }
    if (off == 0 || off % sizeof(struct sock_filter)) {
        errno = EINVAL;
        return -1;
    }
    fprog.len = (unsigned short)(off / sizeof(struct sock_filter));
    fprog.filter = prog;
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog);
}

/* Reserve mode (see the header). */
static int run_reserve(int argc, char **argv)
{
    int64_t uid, off, len;
    int fd, r;

    if (argc != 5 || parse_int64(argv[2], 1, 0xfffffffeLL, &uid) < 0 ||
        parse_int64(argv[3], 0, INT64_MAX, &off) < 0 ||
        parse_int64(argv[4], 1, INT64_MAX - off, &len) < 0)
        return 125;
    if (syscall(SYS_setgroups, 0, NULL) < 0)
        return errno;
    /* the first victim if the pages do not fit, so the sandbox's own processes are spared:
     * set before joining, since any allocation after that may already meet the limit */
    fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "1000", 4) != 4)
        return errno ? errno : EIO;
    (void)close(fd);
    if (write(1, "0", 1) != 1)
        return errno ? errno : EIO;
    if (syscall(SYS_setresgid, (gid_t)uid, (gid_t)uid, (gid_t)uid) < 0 ||
        syscall(SYS_setresuid, (uid_t)uid, (uid_t)uid, (uid_t)uid) < 0 ||
        prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return errno;
    do
        r = fallocate(0, FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
    while (r < 0 && errno == EINTR);
    return r < 0 ? (errno < 125 ? errno : EIO) : 0;
}

/* ---- the trusted view of an exclusive exec (enter mode, --enter-view) ---- */

#define VIEW_RUN_MAX_MIB 64

/* What a grader's view is made of: base, the image's read-only tree on the host (NULL: the
 * sandbox's own root, already read-only: image host), already idmapped to the sandbox's ids
 * (the overlay's lower layer) or not (idmap: the image tree itself); hosts, a host file bound
 * at /etc/hosts (NULL: none); the workdir, bound from the sandbox at its path; tmp_mib, the
 * size of the fresh /tmp. base_fd and hosts_fd are their detached clones (open_tree), taken on
 * the host. */
struct enter_view {
    const char *base, *hosts, *workdir;
    bool idmap;
    int64_t tmp_mib;
    int base_fd, hosts_fd;
};

/* Top-level names of the base the view does not take from it: the sandbox's /proc and /dev,
 * and fresh /tmp and /run. */
static bool view_skipped(const char *name)
{
    static const char *const skip[] = {"proc", "dev", "tmp", "run", "lost+found"};

    for (size_t i = 0; i < sizeof(skip) / sizeof(skip[0]); i++) {
        if (strcmp(name, skip[i]) == 0)
            return true;
    }
    return false;
}

/* Fill dst (a directory of the view's tmpfs) from src (the same place in the base): every
 * directory bound (recursively, so read-only and idmapped as the base is), every symlink
 * copied, every regular file bound; but for the entry named by the first component of rest
 * (the workdir's path below this level), which becomes a directory of the tmpfs filled the
 * same way one level down, so the workdir's mount point exists whatever the image holds. At
 * the top, the names of view_skipped are left out. 0 or -1 (errno set). */
static int view_fill(const char *src, const char *dst, const char *rest, bool top)
{
    char next[NAME_MAX + 1] = "", s[PATH_MAX], t[PATH_MAX], link[PATH_MAX];
    size_t len = strcspn(rest, "/");
    struct dirent *de;
    struct stat st;
    DIR *d;
    int r = 0;

    if (len > NAME_MAX) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(next, rest, len);
    next[len] = '\0';
    d = src ? opendir(src) : NULL;
    while (d && (de = readdir(d))) {
        const char *n = de->d_name;
        ssize_t k;

        if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0 || strcmp(n, next) == 0 ||
            (top && view_skipped(n)))
            continue;
        if ((size_t)snprintf(s, sizeof(s), "%s/%s", src, n) >= sizeof(s) ||
            (size_t)snprintf(t, sizeof(t), "%s/%s", dst, n) >= sizeof(t) || lstat(s, &st) < 0)
            continue;
        if (S_ISLNK(st.st_mode)) {
            k = readlink(s, link, sizeof(link) - 1);
            if (k < 0)
                continue;
            link[k] = '\0';
            if (symlink(link, t) < 0)
                goto fail;
        } else if (S_ISDIR(st.st_mode)) {
            if (mkdir(t, 0755) < 0 || mount(s, t, NULL, MS_BIND | MS_REC, NULL) < 0)
                goto fail;
        } else if (S_ISREG(st.st_mode)) {
            int fd = open(t, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);

            if (fd < 0)
                goto fail;
            close(fd);
            if (mount(s, t, NULL, MS_BIND, NULL) < 0)
                goto fail;
        }
    }
    if (len == 0)
        goto out;
    if ((size_t)snprintf(t, sizeof(t), "%s/%s", dst, next) >= sizeof(t) ||
        (mkdir(t, 0755) < 0 && errno != EEXIST))
        goto fail;
    /* one level down: the base's directory of that name, when it is a directory */
    if (src && (size_t)snprintf(s, sizeof(s), "%s/%s", src, next) < sizeof(s) &&
        lstat(s, &st) == 0 && S_ISDIR(st.st_mode))
        r = view_fill(s, t, rest + len + (rest[len] == '/'), false);
    else
        r = view_fill(NULL, t, rest + len + (rest[len] == '/'), false);
    goto out;
fail:
    r = -1;
out:
    if (d) {
        int e = errno;

        closedir(d);
        errno = e;
    }
    return r;
}

static int view_tmpfs(const char *target, const char *mode, int64_t mib)
{
    char opts[64];

    snprintf(opts, sizeof(opts), "mode=%s,size=%lldm", mode, (long long)mib);
    return mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, opts);
}

/* In the sandbox's user and mount namespaces, with their capabilities: a mount namespace of
 * this exec's own (nothing mounted here reaches the sandbox, nor the other way) whose / holds
 * nothing the sandbox's processes could write but the workdir. With a base: a read-only tmpfs
 * filled from the base (view_fill), the sandbox's /proc and /dev (with a fresh /dev/shm), a
 * fresh /tmp and /run, the workdir, /etc/hosts; then pivot_root into it and the sandbox's own
 * root detached. Without (image host, whose / is the host's, read-only): the sandbox's root
 * with a fresh /tmp, /run and /dev/shm. Ends with the cwd at /. Fails through enter_fail. */
static void view_enter(const struct enter_view *v)
{
    char wd[PATH_MAX];
    struct stat st;

    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        enter_fail("cannot make the grading view's mount namespace");
    if (v->base_fd < 0) {
        if (view_tmpfs("/tmp", "1777", v->tmp_mib) < 0 ||
            view_tmpfs("/run", "0755",
                       v->tmp_mib < VIEW_RUN_MAX_MIB ? v->tmp_mib : VIEW_RUN_MAX_MIB) < 0 ||
            (stat("/dev/shm", &st) == 0 && view_tmpfs("/dev/shm", "1777", v->tmp_mib) < 0) ||
            chdir("/") < 0)
            enter_fail("cannot mount the grading view's /tmp, /run and /dev/shm");
        return;
    }
    /* built on a tmpfs over the sandbox's /tmp (a mount point its processes cannot move) */
    if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m") < 0 ||
        chdir("/tmp") < 0 || mkdir(".base", 0700) < 0 ||
        syscall(SYS_move_mount, v->base_fd, "", AT_FDCWD, ".base", 0x4 /* F_EMPTY_PATH */) < 0)
        enter_fail("cannot mount the image's base tree");
    if (view_fill(".base", ".", v->workdir + 1, true) < 0)
        enter_fail("cannot fill the grading view from the image's base tree");
    if (umount2(".base", MNT_DETACH) < 0 || rmdir(".base") < 0)
        enter_fail("cannot unmount the image's base tree");
    if ((size_t)snprintf(wd, sizeof(wd), ".%s", v->workdir) >= sizeof(wd))
        enter_fail("the workdir's path is too long");
    if ((mkdir("proc", 0555) < 0 && errno != EEXIST) || mkdir("dev", 0755) < 0 ||
        mkdir("tmp", 01777) < 0 || mkdir("run", 0755) < 0 ||
        mount("/proc", "proc", NULL, MS_BIND | MS_REC, NULL) < 0 ||
        mount("/dev", "dev", NULL, MS_BIND | MS_REC, NULL) < 0 ||
        (stat("dev/shm", &st) == 0 && view_tmpfs("dev/shm", "1777", v->tmp_mib) < 0) ||
        view_tmpfs("tmp", "1777", v->tmp_mib) < 0 ||
        view_tmpfs("run", "0755", v->tmp_mib < VIEW_RUN_MAX_MIB ? v->tmp_mib : VIEW_RUN_MAX_MIB) <
            0)
        enter_fail("cannot mount the grading view's /proc, /dev, /tmp and /run");
    if (mount(v->workdir, wd, NULL, MS_BIND | MS_REC, NULL) < 0)
        enter_fail("cannot mount the workdir in the grading view");
    if (v->hosts_fd >= 0 && lstat("etc/hosts", &st) == 0 && S_ISREG(st.st_mode) &&
        syscall(SYS_move_mount, v->hosts_fd, "", AT_FDCWD, "etc/hosts", 0x4) < 0)
        enter_fail("cannot mount /etc/hosts in the grading view");
    if (mount(NULL, ".", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
        enter_fail("cannot make the grading view's root read-only");
    if (syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
        enter_fail("cannot enter the grading view");
}

/* On the host, before any namespace is entered: detached clones of the base and the hosts
 * file (read-only, as the host has them), for view_enter. An image tree (idmap) is mapped as
 * local_image.c maps the overlay's lower layer, 0..65535 -> the sandbox's ids, through the
 * sandbox's own user namespace (userns_fd), read-only, nosuid and nodev. */
static void view_open(struct enter_view *v, int userns_fd)
{
    const unsigned clone = 1 /* OPEN_TREE_CLONE */ | O_CLOEXEC;
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID |
                                          MOUNT_ATTR_NODEV,
                              .userns_fd = (uint64_t)userns_fd};

    v->base_fd = v->hosts_fd = -1;
    if (v->base &&
        (v->base_fd = (int)syscall(SYS_open_tree, AT_FDCWD, v->base, clone | AT_RECURSIVE)) < 0)
        enter_fail("cannot clone the image's base tree");
    if (v->base && v->idmap &&
        syscall(SYS_mount_setattr, v->base_fd, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr,
                sizeof(attr)) < 0)
        enter_fail("cannot idmap the image's base tree");
    if (v->hosts && (v->hosts_fd = (int)syscall(SYS_open_tree, AT_FDCWD, v->hosts, clone)) < 0)
        enter_fail("cannot clone the sandbox's hosts file");
}

static int run_enter(int argc, char **argv, struct enter_view *view)
{
    static const int ns_types[ENTER_NS] = {CLONE_NEWUSER, CLONE_NEWNS,  CLONE_NEWPID,
                                           CLONE_NEWNET,  CLONE_NEWUTS, CLONE_NEWIPC};
    int64_t nchild, ncg, seccomp_fd, nofile, nenv;
    struct rlimit lim;
    char **env, **cmd;
    int i, ws = 0, self_fd;
    pid_t g;
    bool keyrings_refused = false;

    if (argc > 2 && strcmp(argv[2], "--keyrings-refused") == 0) {
        keyrings_refused = true;
        argv[2] = argv[1];
        argv++;
        argc--;
    }
    if (argc < 8 || parse_int64(argv[2], 4, 5, &nchild) < 0 ||
        parse_int64(argv[3], 0, 16, &ncg) < 0 || parse_int64(argv[4], -1, 64, &seccomp_fd) < 0 ||
        parse_int64(argv[5], 1, INT_MAX, &nofile) < 0 || parse_int64(argv[6], 0, argc, &nenv) < 0 ||
        7 + nenv + 1 >= argc || strcmp(argv[7 + nenv], "--") != 0) {
        write_status(ENTER_STATUS_FD, "error bad lendbox-supervise --enter arguments");
        return 2;
    }
    env = argv + 7;
    argv[7 + nenv] = NULL; /* ends env */
    cmd = argv + 7 + nenv + 1;
    /* The supervisor we start is this very binary, run through this fd, never the file at
     * cmd[0] inside the sandbox: the sandbox's root owns /run there and could rename
     * /run/lendbox and put a program of its own at that path. Opened here, on the host, before
     * any namespace is entered. */
    self_fd = open("/proc/self/exe", O_PATH | O_CLOEXEC);
    if (self_fd < 0)
        enter_fail("cannot open the supervisor's own binary");
    if (syscall(SYS_setgroups, 0, NULL) < 0)
        enter_fail("cannot drop supplementary groups");
    for (i = 0; i < ncg; i++) {
        if (write((int)nchild + ENTER_NS + i, "0", 1) != 1)
            enter_fail("cannot join the sandbox cgroup");
    }
    /* a session keyring of this exec's own, not the daemon's (nor another exec's) */
    if (syscall(SYS_keyctl, 1 /* KEYCTL_JOIN_SESSION_KEYRING */, NULL, 0, 0, 0) < 0 &&
        errno != ENOSYS && !(keyrings_refused && errno == EPERM))
        enter_fail("cannot make a session keyring");
    if (view)
        view_open(view, (int)nchild); /* the first namespace fd: the sandbox's user namespace */
    for (i = 0; i < ENTER_NS; i++) {
        if (syscall(SYS_setns, (int)nchild + i, ns_types[i]) < 0)
            enter_fail("cannot enter the sandbox namespaces");
    }
    /* uid/gid 0 of the sandbox's user namespace: its host uid, never host root */
    if (syscall(SYS_setresgid, 0, 0, 0) < 0 || syscall(SYS_setresuid, 0, 0, 0) < 0)
        enter_fail("cannot become the sandbox's root");
    /* an exclusive exec's own mount namespace, made with the sandbox's capabilities */
    if (view)
        view_enter(view);
    /* else a command could remount the read-only host directories writable or bind-mount
     * over the supervisor */
    if (enter_drop_capabilities() < 0)
        enter_fail("cannot drop capabilities");
    /* last: the filter refuses keyctl, which the keyring above needed */
    if (seccomp_fd >= 0 && enter_install_seccomp((int)seccomp_fd) < 0)
        enter_fail("cannot install the seccomp filter");
    umask(022); /* the daemon's 077 is not the sandbox's business */
    g = fork();
    if (g == 0) {
        /* close-on-exec rather than closed: self_fd must live until the exec */
        (void)syscall(SYS_close_range, (unsigned)nchild, ~0U, ENTER_CLOSE_RANGE_CLOEXEC);
        lim.rlim_cur = lim.rlim_max = (rlim_t)nofile;
        if (setrlimit(RLIMIT_NOFILE, &lim) < 0) {
            write_status(ENTER_STATUS_FD,
                         "error cannot set the sandbox's open-file limit: errno %d", errno);
            _exit(127);
        }
        syscall(SYS_execveat, self_fd, "", cmd, env, AT_EMPTY_PATH);
        write_status(ENTER_STATUS_FD, "error cannot execute %s: errno %d", cmd[0], errno);
        _exit(127);
    }
    if (g < 0)
        enter_fail("fork inside the sandbox failed");
    /* one write, so one line; any order with the supervisor's own status line */
    write_status(ENTER_STATUS_FD, "supervisor %d", (int)g);
    (void)syscall(SYS_close_range, 0, ~0U, 0);
    while (waitpid(g, &ws, 0) < 0 && errno == EINTR)
        ;
    return WIFSIGNALED(ws) ? 128 + WTERMSIG(ws) : 0;
}

/* ---- PTY mode ------------------------------------------------------------------------ */

#define PTY_SEG_BYTES (256 * 1024) /* one output segment file */
#define PTY_KEEP_SEGS 5            /* segments kept: at least 1 MiB of history retained */
#define PTY_IDLE_AFTER_EXIT_MS 1000
#define PTY_CHUNK 65536

/* One output stream written as segment files NAME.K (logical bytes K*SEG .. (K+1)*SEG). */
struct pty_stream {
    const char *name; /* "out" or "err" */
    int fd;           /* the current segment, -1 before the first byte of one */
    uint64_t off;     /* logical bytes written so far */
};

static void pty_seg_name(char *buf, size_t len, const char *name, uint64_t k)
{
    snprintf(buf, len, "%s.%llu", name, (unsigned long long)k);
}

/* Open segment off / SEG (creating it empty) and drop the one PTY_KEEP_SEGS before it. */
static int pty_stream_open(int dir, struct pty_stream *s)
{
    uint64_t k = s->off / PTY_SEG_BYTES;
    char name[64];

    if (s->fd >= 0)
        (void)close(s->fd);
    pty_seg_name(name, sizeof(name), s->name, k);
    s->fd = openat(dir, name, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (s->fd < 0)
        return -errno;
    if (k >= PTY_KEEP_SEGS) {
        pty_seg_name(name, sizeof(name), s->name, k - PTY_KEEP_SEGS);
        (void)unlinkat(dir, name, 0);
    }
    return 0;
}

/* Append len bytes, across segment boundaries. A failed write drops the rest (the session
 * carries on; the reader sees the offsets that made it). */
static void pty_stream_write(int dir, struct pty_stream *s, const char *data, size_t len)
{
    while (len > 0) {
        size_t room = PTY_SEG_BYTES - (size_t)(s->off % PTY_SEG_BYTES), n = len < room ? len : room;
        ssize_t w;

        if ((s->off % PTY_SEG_BYTES == 0 || s->fd < 0) && pty_stream_open(dir, s) < 0)
            return;
        w = write(s->fd, data, n);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            return;
        }
        s->off += (uint64_t)w;
        data += w;
        len -= (size_t)w;
        if (s->off % PTY_SEG_BYTES == 0) {
            (void)close(s->fd);
            s->fd = -1;
        }
    }
}

/* Write name in dir atomically (tmp file, then rename). */
static void pty_write_atomic(int dir, const char *name, const char *text)
{
    char tmp[64];
    int fd;

    snprintf(tmp, sizeof(tmp), ".%s.tmp", name);
    fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    if (write(fd, text, strlen(text)) != (ssize_t)strlen(text)) {
        (void)close(fd);
        return;
    }
    (void)close(fd);
    (void)renameat(dir, tmp, dir, name);
}

struct pty_state {
    int dir;
    bool pty;
    int master;             /* pty mode: the terminal's master (input and output) */
    int in_w, out_r, err_r; /* pipe mode */
    int slave;              /* pty mode: held until the command exits, so EIO means drained */
    int in_fifo, ctl_fifo;
    struct pty_stream out, err;
    char pending[PTY_CHUNK]; /* input read from the FIFO, not yet taken by the terminal */
    size_t pending_len, pending_off;
    char ctl[256];
    size_t ctl_len;
    struct child_state cmd;
    bool kill_requested;
};

/* Read what fd has into stream s. Returns false at EOF or EIO (the other side is gone). */
static bool pty_pump(struct pty_state *st, int *fd, struct pty_stream *s)
{
    char buf[PTY_CHUNK];

    for (;;) {
        ssize_t n = read(*fd, buf, sizeof(buf));

        if (n > 0) {
            pty_stream_write(st->dir, s, buf, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return true;
        (void)close(*fd);
        *fd = -1;
        return false;
    }
}

static void pty_signal_group(struct pty_state *st, int sig)
{
    pid_t fg = st->pty ? tcgetpgrp(st->master) : -1;

    if (st->cmd.done)
        return;
    if (fg > 0)
        (void)kill(-fg, sig);
    (void)kill(-st->cmd.pid, sig);
}

/* One control line: "resize ROWS COLS", "signal N", "kill", "eof". */
static void pty_control(struct pty_state *st, const char *line)
{
    unsigned rows, cols;
    int sig;

    if (sscanf(line, "resize %u %u", &rows, &cols) == 2 && st->pty) {
        struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};

        (void)ioctl(st->master, TIOCSWINSZ, &ws);
    } else if (sscanf(line, "signal %d", &sig) == 1 && sig > 0 && sig < NSIG) {
        pty_signal_group(st, sig);
    } else if (strcmp(line, "kill") == 0) {
        st->kill_requested = true;
    } else if (strcmp(line, "eof") == 0 && !st->pty && st->in_w >= 0) {
        (void)close(st->in_w);
        st->in_w = -1;
    }
}

static void pty_read_control(struct pty_state *st)
{
    for (;;) {
        ssize_t n = read(st->ctl_fifo, st->ctl + st->ctl_len, sizeof(st->ctl) - 1 - st->ctl_len);
        char *nl;

        if (n <= 0)
            return;
        st->ctl_len += (size_t)n;
        st->ctl[st->ctl_len] = '\0';
        while ((nl = memchr(st->ctl, '\n', st->ctl_len))) {
            *nl = '\0';
            pty_control(st, st->ctl);
            st->ctl_len -= (size_t)(nl + 1 - st->ctl);
            memmove(st->ctl, nl + 1, st->ctl_len);
        }
        if (st->ctl_len == sizeof(st->ctl) - 1)
            st->ctl_len = 0; /* an overlong line: drop it */
    }
}

/* Move input from the FIFO to the command's terminal (or stdin pipe), never blocking. */
static void pty_move_input(struct pty_state *st)
{
    int to = st->pty ? st->master : st->in_w;

    for (;;) {
        if (st->pending_off == st->pending_len) {
            ssize_t n = read(st->in_fifo, st->pending, sizeof(st->pending));

            st->pending_off = st->pending_len = 0;
            if (n <= 0)
                return;
            st->pending_len = (size_t)n;
        }
        if (to < 0) { /* stdin closed: input is dropped */
            st->pending_off = st->pending_len;
            continue;
        }
        {
            ssize_t w = write(to, st->pending + st->pending_off, st->pending_len - st->pending_off);

            if (w <= 0) {
                if (w < 0 && errno == EPIPE && !st->pty) {
                    (void)close(st->in_w);
                    st->in_w = -1;
                    continue;
                }
                return; /* full: wait for POLLOUT */
            }
            st->pending_off += (size_t)w;
        }
    }
}

static void exec_pty_command(struct pty_state *st, char **argv, const char *slave, int rows,
                             int cols, int pipes[3][2], const struct sup_user *u, bool have_user)
{
    int e, fd;

    (void)setsid();
    if (st->pty) {
        struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};

        fd = open(slave, O_RDWR);
        if (fd < 0)
            _exit(126);
        (void)ioctl(fd, TIOCSCTTY, 0);
        (void)ioctl(fd, TIOCSWINSZ, &ws);
        (void)dup2(fd, 0);
        (void)dup2(fd, 1);
        (void)dup2(fd, 2);
        if (fd > 2)
            (void)close(fd);
    } else {
        (void)dup2(pipes[0][0], 0);
        (void)dup2(pipes[1][1], 1);
        (void)dup2(pipes[2][1], 2);
    }
    (void)close_range(3, ~0U, 0);
    reset_signals();
    e = user_become(u, have_user);
    if (e < 0) {
        dprintf(2, "lendbox-supervise: cannot become the user: %s\n", strerror(-e));
        _exit(126);
    }
    execvp(argv[0], argv);
    e = errno;
    dprintf(2, "lendbox-supervise: cannot run '%s': %s\n", argv[0], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
}

/* The PTY holder: owns the terminal (or the pipes) and the session's files. Reports setup
 * with one byte on ready_fd, then runs until the command is over. Returns its exit status. */
static int run_pty_holder(const struct options *o, int ready_fd, const struct sup_user *user,
                          bool have_user)
{
    struct pty_state *st = calloc(1, sizeof(*st));
    char slave[128] = "", text[32];
    int pipes[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};
    int64_t idle_since = -1;
    sigset_t set;
    int sfd, code;

    if (!st)
        return 1;
    st->dir = o->pty_dir_fd;
    st->pty = !o->pty_pipes;
    st->master = st->slave = st->in_w = st->out_r = st->err_r = -1;
    st->out = (struct pty_stream){"out", -1, 0};
    st->err = (struct pty_stream){"err", -1, 0};
    (void)setsid();
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    /* the holder keeps the session directory's fd (a host directory) for its whole life: no
     * sandbox process may take it through /proc/<pid>/fd, pidfd_getfd or ptrace. main made us
     * non-dumpable and nothing since changed our ids (which would reset it to
     * fs.suid_dumpable); say it again and refuse to run if it did not hold */
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    if (prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0)
        return 1;
    {
        int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);

        if (null_fd >= 0) {
            (void)dup2(null_fd, 0);
            (void)dup2(null_fd, 1);
            (void)dup2(null_fd, 2);
        }
        close_all_but(ready_fd, st->dir);
    }
    if ((mkfifoat(st->dir, "in", 0600) < 0 && errno != EEXIST) ||
        (mkfifoat(st->dir, "ctl", 0600) < 0 && errno != EEXIST))
        return 1;
    st->in_fifo = openat(st->dir, "in", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    st->ctl_fifo = openat(st->dir, "ctl", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (st->in_fifo < 0 || st->ctl_fifo < 0 || pty_stream_open(st->dir, &st->out) < 0 ||
        pty_stream_open(st->dir, &st->err) < 0)
        return 1;
    if (st->pty) {
        st->master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (st->master < 0 || unlockpt(st->master) < 0 ||
            ptsname_r(st->master, slave, sizeof(slave)) != 0)
            return 1;
        st->slave = open(slave, O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (st->slave < 0)
            return 1;
    } else {
        for (int i = 0; i < 3; i++)
            if (pipe2(pipes[i], O_CLOEXEC) < 0)
                return 1;
        st->in_w = pipes[0][1];
        st->out_r = pipes[1][0];
        st->err_r = pipes[2][0];
    }
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGQUIT);
    sigaddset(&set, SIGPIPE);
    (void)sigprocmask(SIG_BLOCK, &set, NULL);
    sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        return 1;
    snprintf(text, sizeof(text), "%d\n", (int)getpid());
    pty_write_atomic(st->dir, "pid", text);

    st->cmd.pid = fork();
    if (st->cmd.pid < 0)
        return 1;
    if (st->cmd.pid == 0)
        exec_pty_command(st, o->argv, slave, (int)o->pty_rows, (int)o->pty_cols, pipes, user,
                         have_user);
    /* the holder itself needs no capability from here on */
    (void)sup_user_drop_caps();
    if (!st->pty) {
        (void)close(pipes[0][0]);
        (void)close(pipes[1][1]);
        (void)close(pipes[2][1]);
        (void)fcntl(st->in_w, F_SETFL, O_NONBLOCK);
        (void)fcntl(st->out_r, F_SETFL, O_NONBLOCK);
        (void)fcntl(st->err_r, F_SETFL, O_NONBLOCK);
    } else {
        (void)fcntl(st->master, F_SETFL, O_RDWR | O_NONBLOCK);
    }
    if (write(ready_fd, "R", 1) != 1) {
        /* the launcher is gone; the session runs anyway */
    }
    (void)close(ready_fd);

    /* Output until the command has exited and its output is drained: EOF/EIO on every
     * output, or PTY_IDLE_AFTER_EXIT_MS without a byte once it has exited (a background
     * process may hold the terminal open). */
    for (;;) {
        struct pollfd p[6];
        int n = 0, terminating = 0, timeout = -1, i_sig, i_in, i_ctl, i_a, i_b = -1;
        int *a = st->pty ? &st->master : &st->out_r;
        bool out_open;

        reap(&st->cmd);
        if (st->cmd.done && st->slave >= 0) {
            (void)close(st->slave); /* from now on EIO means every byte was read */
            st->slave = -1;
        }
        if (st->kill_requested)
            kill_tree(&st->cmd, sfd, SIGKILL);
        out_open = *a >= 0 || (!st->pty && st->err_r >= 0);
        if (!out_open && st->cmd.done)
            break;
        if (st->cmd.done) {
            int64_t now = mono_ms();

            if (idle_since < 0)
                idle_since = now;
            if (now - idle_since >= PTY_IDLE_AFTER_EXIT_MS)
                break;
            timeout = (int)(PTY_IDLE_AFTER_EXIT_MS - (now - idle_since));
        }
        i_sig = n;
        p[n++] = (struct pollfd){.fd = sfd, .events = POLLIN};
        i_in = n;
        p[n++] = (struct pollfd){.fd = st->pending_off < st->pending_len ? -1 : st->in_fifo,
                                 .events = POLLIN};
        i_ctl = n;
        p[n++] = (struct pollfd){.fd = st->ctl_fifo, .events = POLLIN};
        i_a = n;
        p[n++] = (struct pollfd){
            .fd = *a,
            .events = POLLIN | (st->pty && st->pending_off < st->pending_len ? POLLOUT : 0)};
        if (!st->pty) {
            i_b = n;
            p[n++] = (struct pollfd){.fd = st->err_r, .events = POLLIN};
            p[n++] = (struct pollfd){.fd = st->pending_off < st->pending_len ? st->in_w : -1,
                                     .events = POLLOUT};
        }
        if (poll(p, (nfds_t)n, timeout) < 0 && errno != EINTR)
            break;
        if (p[i_sig].revents)
            drain_signalfd(sfd, &terminating);
        if (terminating && terminating != SIGPIPE)
            st->kill_requested = true;
        if (p[i_ctl].revents)
            pty_read_control(st);
        if (p[i_a].revents && *a >= 0) {
            (void)pty_pump(st, a, &st->out);
            idle_since = -1;
        }
        if (i_b >= 0 && p[i_b].revents && st->err_r >= 0) {
            (void)pty_pump(st, &st->err_r, &st->err);
            idle_since = -1;
        }
        if (p[i_in].revents || st->pending_off < st->pending_len)
            pty_move_input(st);
    }
    /* the session is over: nothing of it stays behind */
    kill_tree(&st->cmd, sfd, SIGKILL);
    if (WIFEXITED(st->cmd.status))
        code = WEXITSTATUS(st->cmd.status);
    else
        code = 128 + (WIFSIGNALED(st->cmd.status) ? WTERMSIG(st->cmd.status) : 0);
    if (st->out.fd >= 0)
        (void)close(st->out.fd);
    if (st->err.fd >= 0)
        (void)close(st->err.fd);
    snprintf(text, sizeof(text), "%d\n", code);
    pty_write_atomic(st->dir, "exit", text);
    return 0;
}

/* --pty-launch: start the holder (which leaves our session) and exit once it is set up. */
static int run_pty_launch(const struct options *o)
{
    struct sup_user user;
    bool have_user;
    char why[300];
    int ready[2];
    ssize_t n;
    pid_t pid;
    char b;

    if (user_prepare(o->user, &user, &have_user, why, sizeof(why)) < 0) {
        fprintf(stderr, "lendbox-supervise: %s\n", why);
        return 1;
    }

    if (fcntl(o->pty_dir_fd, F_SETFD, FD_CLOEXEC) < 0) {
        fprintf(stderr, "lendbox-supervise: no session directory fd %d: %s\n", o->pty_dir_fd,
                strerror(errno));
        return 1;
    }
    if (pipe2(ready, O_CLOEXEC) < 0 || (pid = fork()) < 0) {
        fprintf(stderr, "lendbox-supervise: cannot start the PTY holder: %s\n", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        (void)close(ready[0]);
        _exit(run_pty_holder(o, ready[1], &user, have_user));
    }
    (void)close(ready[1]);
    do
        n = read(ready[0], &b, 1);
    while (n < 0 && errno == EINTR);
    if (n != 1) {
        fprintf(stderr, "lendbox-supervise: the PTY holder failed to start\n");
        return 1;
    }
    printf("launched %d\n", (int)pid);
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
    /* Run through an fd or /proc/self/exe (never by its path inside a sandbox, see run_enter),
     * the kernel names us after that ("5", "exe"): take the name of argv[0] again, as an exec
     * by path would have given ("supervise"), which is how we appear in ps. */
    if (argc > 0 && argv[0]) {
        const char *base = strrchr(argv[0], '/');

        (void)prctl(PR_SET_NAME, base ? base + 1 : argv[0], 0, 0, 0);
    }
    if (argc > 1 && strcmp(argv[1], "--enter") == 0)
        return run_enter(argc, argv, NULL);
    if (argc > 7 && strcmp(argv[1], "--enter-view") == 0) {
        bool root = strcmp(argv[2], "root") == 0;
        struct enter_view v = {.base = root ? NULL : argv[3],
                               .idmap = strcmp(argv[2], "image") == 0,
                               .hosts = strcmp(argv[4], "-") ? argv[4] : NULL,
                               .workdir = argv[5]};

        if ((!root && !v.idmap && strcmp(argv[2], "mounted") != 0) ||
            (!root && argv[3][0] != '/') || argv[5][0] != '/' || strcmp(argv[5], "/") == 0 ||
            parse_int64(argv[6], 1, INT64_MAX / 2, &v.tmp_mib) < 0) {
            write_status(ENTER_STATUS_FD, "error bad lendbox-supervise --enter-view arguments");
            return 2;
        }
        /* the rest as --enter's, from NCHILD on */
        return run_enter(argc - 5, argv + 5, &v);
    }
    if (argc > 1 && strcmp(argv[1], "--reserve") == 0)
        return run_reserve(argc, argv);
    if (argc == 1 && getpid() == 1) {
        loopback_up();
        return run_init(-1); /* an engine's init: /sbin/init of an imported LXD image */
    }
    if (parse_options(argc, argv, &o) < 0) {
        fprintf(stderr,
                "usage: lendbox-supervise --init --ready-fd N\n"
                "       lendbox-supervise --status-fd N --timeout-ms MS [--cwd DIR] "
                "[--keep-background] [--pass-fd P] [--user USER] -- ARGV...\n"
                "       lendbox-supervise --harness-launch DIR (--receipt-fd N | --receipt-file "
                "PATH) --timeout-ms MS --cleanup-timeout-ms MS [--user USER] -- ARGV...\n"
                "       lendbox-supervise --harness-stop DIR\n"
                "       lendbox-supervise --pty-launch --dir-fd N [--rows R] [--cols C] [--no-pty] "
                "[--user USER] -- ARGV...\n"
                "       lendbox-supervise --framed --max-output BYTES --timeout-ms MS "
                "[--cwd DIR] [--keep-background] [--stdin-file PATH] [--pass-socket PATH] "
                "[--exclusive [--spare-init-session]] [--loopback-up] -- ARGV...\n");
        if (o.status_fd >= 0)
            write_status(o.status_fd, "error bad lendbox-supervise arguments");
        return 2;
    }
    if (o.init)
        return run_init(o.ready_fd);
    if (o.harness_launch)
        return run_harness_launch(&o);
    if (o.pty_launch)
        return run_pty_launch(&o);
    if (o.harness_stop)
        return run_harness_stop(o.harness_stop);
    if (o.framed)
        return run_framed(&o);
    return run_command(&o);
}
