/*
 * supervise.c - lendbox-supervise, the small program that runs inside every sandbox.
 *
 * Linked statically against libc only, so it runs in any image; the providers bind-mount it
 * read-only at /run/lendbox/supervise. This file parses the command line and starts the mode
 * it names; each mode lives in a file of its own: mode_init.c, mode_command.c, mode_framed.c,
 * mode_harness.c, mode_pty.c (run inside a sandbox), mode_enter.c and mode_reserve.c (run by
 * the daemon on the host), over two bases, launch.c (the child's last steps before an exec; a
 * detached holder and its ready byte) and proc.c (/proc scan, reaping, signals, tree kill, the
 * status line); supervise_internal.h is what they share. The modes:
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
 *       It is a child subreaper: when the command-mode supervisor dies without a status (a
 *       process of the exec killed it, or the OOM killer), every descendant left (the whole
 *       tree, a setsid or double-forked process too) is SIGKILLed until none is left and the
 *       status is "error the exec's supervisor was killed by signal N (SIGX, description);
 *       the command's outcome is unknown; lendbox killed the K processes the exec left
 *       running" (as the local provider says). No 's' frame means this process died. Exit
 *       status 0; 2 on bad usage.
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
 *   lendbox-supervise --enter [--keyrings-refused] [--host NAME] NCHILD NCG SECCOMP_FD NOFILE
 *                     NENV ENV... -- ARGV...
 *       fds 0..NCHILD-1 are the command-mode supervisor's (0 stdin, 1 stdout, 2 stderr,
 *       3 status, 4 the pass fd), NCHILD..NCHILD+5 the sandbox init's user, mnt, pid, net, uts
 *       and ipc namespaces, the next NCG its cgroup.procs files, SECCOMP_FD (-1: none) a memfd
 *       with the classic BPF filter. --keyrings-refused: the daemon found that the host
 *       refuses it the keyring calls with a seccomp filter (so every sandbox process is
 *       refused them too), and EPERM for the session keyring below is not an error. --host
 *       NAME: the sandbox's hostname must be NAME (the id the daemon knows it by), checked by
 *       the forked child inside the pid namespace before it runs ARGV: a recycled sandbox has
 *       its next id as hostname, set before its reset's kill, so an exec of the old id that
 *       came late fails ("error the sandbox is no longer NAME ...") instead of running in the
 *       next episode's sandbox.
 *       Joins the cgroups and a fresh session keyring, enters the
 *       namespaces (user first), becomes uid/gid 0 there (the sandbox's host uid), drops every
 *       capability, sets no_new_privs and umask 022, then forks ARGV (the command-mode
 *       supervisor, inside the sandbox's pid namespace; its process checks the hostname and
 *       installs the filter before it execs, so a filter that refuses uname does not refuse the
 *       check) with fds 0..NCHILD-1, the
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
 * Reset mode (the local provider's in-place reset of a sandbox of image host; run by the daemon
 * as host root, outside every namespace of the sandbox, from a vfork-style spawn):
 *
 *   lendbox-supervise --reset HOSTNAME WORKDIR TMP_MIB RUN_MIB SHM_MIB WORKDIR_MIB UID
 *       fds 0..2 /dev/null, 3 the status pipe, 4..8 the sandbox init's user (unused), mnt,
 *       pid, uts and ipc namespaces, 9 an O_PATH fd of this binary on the host. Clones fd 9
 *       read-only, enters the namespaces but the user namespace (the host's root has every
 *       capability over them) and forks into the pid namespace, where the child (its real ids
 *       the host's root: no sandbox process may signal or prlimit it) kills every process but
 *       the init and waits until the init reaped them, mounts fresh tmpfs of the given sizes
 *       (MiB) owned by host id UID (the sandbox's root) at /tmp and /dev/shm (1777), WORKDIR
 *       and /run (0755), binds the clone at /run/lendbox/supervise, sets the hostname to
 *       HOSTNAME and removes every SysV IPC object and POSIX message queue (mode_reset.c).
 *       Writes "reset N (...)" on fd 3 and exits 0 when all of it is done; else "error WHAT:
 *       errno N" on fd 3 and a non-zero exit (2: bad arguments). The sandbox's processes may
 *       see the child in their /proc in the moment before it kills them, but cannot act on it.
 *
 *   lendbox-supervise --reset-spare
 *       The same, started before its resets are asked for (an exec costs ~1 ms on a VM, a
 *       third of a reset): fds 0..2 /dev/null, 3 a SOCK_SEQPACKET socket on which it waits for
 *       a message: the seven arguments of --reset and the CPU to run on (NUL-terminated
 *       strings), with the seven fds of --reset's fds 3..9 attached (SCM_RIGHTS, in that
 *       order). It puts them in place, runs the reset, goes back to its own namespaces, closes
 *       them, sends one byte "b" on the socket (back: the daemon counts it as waiting only
 *       then) and waits for the next, whatever the reset's status (which the daemon read on
 *       the status fd; it ends a spare whose reset failed). Exits 0 when the socket ends (the
 *       daemon closed it or died); 2 when a message is not one; 1 when a reset fails before
 *       its child starts (the status fd says "error ...") or it cannot go back to its own
 *       namespaces.
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
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "supervisor/supervise_internal.h"

/* The command line of every mode but --enter, --enter-view and --reserve into *o. 0 or -EINVAL
 * (then o->status_fd is set when it was given). */
static int parse_options(int argc, char **argv, struct sup_options *o)
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
        } else if (strcmp(a, "--dir-fd") == 0 && proc_parse_int64(val, 3, INT_MAX, &v) == 0) {
            o->pty_dir_fd = (int)v;
            i++;
        } else if (strcmp(a, "--rows") == 0 && proc_parse_int64(val, 1, 65535, &v) == 0) {
            o->pty_rows = v;
            i++;
        } else if (strcmp(a, "--cols") == 0 && proc_parse_int64(val, 1, 65535, &v) == 0) {
            o->pty_cols = v;
            i++;
        } else if (strcmp(a, "--exclusive") == 0) {
            o->exclusive = true;
        } else if (strcmp(a, "--loopback-up") == 0) {
            o->loopback_up = true;
        } else if (strcmp(a, "--spare-init-session") == 0) {
            o->spare_init_session = true;
        } else if (strcmp(a, "--max-output") == 0 &&
                   proc_parse_int64(val, 1, INT64_MAX / 2, &v) == 0) {
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
        } else if (strcmp(a, "--ready-fd") == 0 && proc_parse_int64(val, 0, INT_MAX, &v) == 0) {
            o->ready_fd = (int)v;
            i++;
        } else if (strcmp(a, "--status-fd") == 0 && proc_parse_int64(val, 0, INT_MAX, &v) == 0) {
            o->status_fd = (int)v;
            i++;
        } else if (strcmp(a, "--pass-fd") == 0 && proc_parse_int64(val, 3, INT_MAX, &v) == 0) {
            o->pass_fd = (int)v;
            i++;
        } else if (strcmp(a, "--receipt-fd") == 0 && proc_parse_int64(val, 3, INT_MAX, &v) == 0) {
            o->receipt_fd = (int)v;
            i++;
        } else if (strcmp(a, "--receipt-file") == 0 && val && val[0] == '/') {
            o->receipt_file = val;
            i++;
        } else if (strcmp(a, "--timeout-ms") == 0 &&
                   proc_parse_int64(val, 1, INT64_MAX / 2, &v) == 0) {
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
                   proc_parse_int64(val, 1, INT64_MAX / 8, &v) == 0) {
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

int main(int argc, char **argv)
{
    struct sup_options o;

    /* First, before anything else: nothing else in the sandbox runs as another uid, so only
     * this keeps its processes from ptrace, pidfd_getfd, /proc/<pid>/fd and /proc/<pid>/mem on
     * us (and on the status, stdout and stderr channels we hold). Installed exec-only (mode
     * 0711, owned by host root) the binary is non-dumpable from the exec on, with no window
     * at all; this call covers a readable copy. Inherited by forks, reset by exec, so the
     * commands we run are not affected. */
    (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    /* Run through an fd or /proc/self/exe (never by its path inside a sandbox, see mode_enter.c),
     * the kernel names us after that ("5", "exe"): take the name of argv[0] again, as an exec
     * by path would have given ("supervise"), which is how we appear in ps. */
    if (argc > 0 && argv[0]) {
        const char *base = strrchr(argv[0], '/');

        (void)prctl(PR_SET_NAME, base ? base + 1 : argv[0], 0, 0, 0);
    }
    if (argc > 1 && strcmp(argv[1], "--enter") == 0)
        return mode_enter_run(argc, argv);
    if (argc > 7 && strcmp(argv[1], "--enter-view") == 0)
        return mode_enter_view_run(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--reserve") == 0)
        return mode_reserve_run(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--reset") == 0)
        return mode_reset_run(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--reset-spare") == 0)
        return mode_reset_spare_run(argc, argv);
    if (argc == 1 && getpid() == 1) {
        proc_loopback_up();
        return mode_init_run(-1); /* an engine's init: /sbin/init of an imported LXD image */
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
            proc_write_status(o.status_fd, "error bad lendbox-supervise arguments");
        return 2;
    }
    if (o.init)
        return mode_init_run(o.ready_fd);
    if (o.harness_launch)
        return mode_harness_launch(&o);
    if (o.pty_launch)
        return mode_pty_launch(&o);
    if (o.harness_stop)
        return mode_harness_stop(o.harness_stop);
    if (o.framed)
        return mode_framed_run(&o);
    return mode_command_run(&o);
}
