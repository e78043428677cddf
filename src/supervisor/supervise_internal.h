/*
 * supervise_internal.h - what the files of lendbox-supervise share: the parsed command line,
 * a supervised child, and the functions of the two bases (proc.c, launch.c) and of each mode.
 *
 * Shared by supervise.c (options, mode dispatch), proc.c, launch.c and the mode_*.c files; no
 * other program includes it. The supervisor is a static, libc-only, single-threaded program:
 * nothing here is thread-safe, and nothing needs to be. The command line and every mode's
 * protocol are described in supervise.c's head comment.
 *
 * Dependencies run one way: supervise.c -> mode_*.c -> launch.c, proc.c, user.c;
 * mode_framed.c is a top over mode_command.c (its child runs command mode); no other mode calls
 * another.
 */
#ifndef LENDBOX_SUPERVISOR_SUPERVISE_INTERNAL_H
#define LENDBOX_SUPERVISOR_SUPERVISE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "supervisor/user.h"

/* ms between two looks for the tree's end while killing it */
#define KILL_POLL_MS 10

/* The parsed command line of every mode but --enter, --enter-view and --reserve (those parse
 * their own positional arguments). Pointers point into argv. */
struct sup_options {
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

/* A forked command (its own process group, pgid == pid) and, once reaped, its wait status. */
struct sup_child {
    pid_t pid;
    bool done;
    int status;
};

/* ---- proc.c: clock, fds, numbers, /proc scan, reaping, signals, tree kill, status line ---- */

/* CLOCK_MONOTONIC in ms. */
int64_t proc_mono_ms(void);

/* Close every fd from 3 on but a and b (either may be -1). */
void proc_close_all_but(int a, int b);

/* A decimal integer in [min, max], the whole of s, into *out. 0 or -EINVAL (out untouched). */
int proc_parse_int64(const char *s, int64_t min, int64_t max, int64_t *out);

/* sig to every descendant of this process found in /proc (each pinned with a pidfd
 * and its parent re-checked, so a reused pid is not hit). How many were signalled, or -errno
 * when /proc cannot be read. */
int proc_signal_descendants(int sig);

/* Block SIGCHLD and the signals that ask us to end (TERM, INT, HUP, QUIT; and PIPE with
 * with_sigpipe) so that they arrive on the returned signalfd (close-on-exec, non-blocking)
 * instead. The fd, or -1 with errno set (the signals stay blocked). */
int proc_open_signalfd(bool with_sigpipe);

/* Reap every exited child without blocking, recording cmd's status (cmd->done). True when no
 * child at all is left. */
bool proc_reap(struct sup_child *cmd);

/* Read every pending signal of signalfd sfd; the first that is not SIGCHLD goes to
 * *terminating when it is 0 (terminating may be NULL). */
void proc_drain_signalfd(int sfd, int *terminating);

/* Wait at most ms (clamped to 0..INT_MAX) for a signal on sfd, then drain it as above. */
void proc_wait_signal(int sfd, int64_t ms, int *terminating);

/* sig to cmd's group (while its leader is unreaped) and every descendant, over and over, until
 * no child is left. sfd: a signalfd with SIGCHLD. */
void proc_kill_tree(struct sup_child *cmd, int sfd, int sig);

/* SIGTERM to the tree, 500 ms of grace, then proc_kill_tree with SIGKILL. */
void proc_terminate_tree(struct sup_child *cmd, int sfd);

/* One status line (printf-style, control characters made '?', newline added) written whole to
 * fd; errors are ignored. */
void proc_write_status(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Bring lo of this network namespace up when it is down; best effort. */
void proc_loopback_up(void);

/* SIGKILL every process of this pid namespace but pid 1 and this one (and, with
 * spare_init_session, those of pid 1's session), pass after pass until a pass finds none. 0, or
 * -1 when 200 passes did not end them (or /proc cannot be read). */
int proc_kill_all_but_init(bool spare_init_session);

/* ---- launch.c: the child's side of every launch (signals, user, exec), detached holders ---- */

/* The user of --user spec (looked up in this sandbox's /etc/passwd and /etc/group: our root is
 * the sandbox's) into *u, *have true; spec NULL: *have false. 0, or a negative errno with a
 * one-line reason in why (why_len bytes). */
int launch_user_prepare(const char *spec, struct sup_user *u, bool *have, char *why,
                        size_t why_len);

/* --untrusted-dir: a HOME from passwd at or below dir becomes /tmp in launch_exec. dir (NULL:
 * none) must outlive the process (it points into argv). */
void launch_set_untrusted_dir(const char *dir);

/* In a forked child, right before its exec: every signal to its default and unblocked, then
 * the user u (have_user) or no capability at all, HOME from passwd when the environment has
 * none, then exec argv[0] with a PATH search. own: argv runs this very binary
 * (/proc/self/exe), as who we are, capabilities included. Never returns: exit 126 when the user
 * switch fails or argv[0] cannot be run, 127 when it does not exist, with a line on stderr; when
 * err_fd >= 0 the errno (an int) is written there first. */
__attribute__((noreturn)) void launch_exec(char **argv, bool own, const struct sup_user *u,
                                           bool have_user, int err_fd);

/* The body of a detached holder: runs in the forked child with the write end of the ready
 * pipe, writes one byte there once it is set up, and returns the child's exit status. */
typedef int (*launch_holder_fn)(const struct sup_options *o, int ready_fd,
                                const struct sup_user *user, bool have_user);

/* Fork a holder that runs fn(o, ready_fd, user, have_user) and wait for its ready byte; then
 * print "launched PID" on stdout. 0; -errno when the pipe or the fork failed (errno kept);
 * -ECHILD when the holder ended before its ready byte. */
int launch_holder(launch_holder_fn fn, const struct sup_options *o, const struct sup_user *user,
                  bool have_user);

/* ---- the modes: each returns the process's exit status ---- */

/* mode_init.c: the sandbox's pid 1. ready_fd >= 0: bwrap's, one byte written to it; -1: an
 * engine's init (no ready byte; SIGPWR ends it with 0). Never returns otherwise. */
int mode_init_run(int ready_fd);

/* mode_command.c: run o->argv supervised; the result line goes to o->status_fd. 0. */
int mode_command_run(const struct sup_options *o);

/* mode_framed.c: command mode with the result as frames on stdout. 0. */
int mode_framed_run(const struct sup_options *o);

/* mode_harness.c: --harness-launch (may set o->receipt_fd) and --harness-stop. */
int mode_harness_launch(struct sup_options *o);
int mode_harness_stop(const char *dir);

/* mode_pty.c: --pty-launch. */
int mode_pty_launch(const struct sup_options *o);

/* mode_enter.c: --enter and --enter-view, from the whole argv. */
int mode_enter_run(int argc, char **argv);
/* --reset (mode_reset.c): a sandbox of image host returned in place to how bwrap made it. The
 * exit status of the helper: 0 done, 1 failed, 2 bad arguments (fd 3 says why). */
int mode_reset_run(int argc, char **argv);
/* --reset-spare (mode_reset.c): a reset helper started ahead of its resets, serving one request
 * after another on fd 3 (a SOCK_SEQPACKET socket), each a --reset with what it carries, and
 * saying "b" on it when back in its own namespaces after each. Exits 0 when the socket ends,
 * 2 on a message that is not one, 1 when a reset fails before its child starts or it cannot
 * go back to its namespaces. */
int mode_reset_spare_run(int argc, char **argv);
int mode_enter_view_run(int argc, char **argv);

/* mode_reserve.c: --reserve, from the whole argv. */
int mode_reserve_run(int argc, char **argv);

#endif
