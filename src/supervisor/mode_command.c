/*
 * mode_command.c - command mode of lendbox-supervise (--status-fd N --timeout-ms MS ... --
 * ARGV): run one command in its own session and process group as a child subreaper, end it at
 * its timeout or on a signal to us (TERM, grace, KILL of the whole tree), kill what it left
 * unless --keep-background, and write the one status line. The protocol: supervise.c's head
 * comment.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "supervisor/supervise_internal.h"

static void report_cwd_error(int fd, const char *cwd, int e)
{
    if (e == ENOENT)
        proc_write_status(fd, "error cwd '%s' does not exist", cwd);
    else if (e == ENOTDIR)
        proc_write_status(fd, "error cwd '%s' is not a directory", cwd);
    else if (e == EACCES)
        proc_write_status(fd, "error cwd '%s' is not accessible", cwd);
    else
        proc_write_status(fd, "error cannot enter cwd '%s': %s", cwd, strerror(e));
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
    /* the status channel is the supervisor's alone: never the command's (it is CLOEXEC too) */
    (void)close(status_fd);
    if (pass_fd >= 0) /* the daemon's channel for the command (a harness launcher) */
        (void)fcntl(pass_fd, F_SETFD, 0);
    setpgid(0, 0);
    /* our own harness and PTY launchers stay who we are, capabilities included: the harness
     * supervisor (the PTY holder) switches to its --user right before its command's exec */
    launch_exec(argv, is_own_harness_launch(argv), u, have_user, -1);
}

int mode_command_run(const struct sup_options *o)
{
    struct sup_child cmd = {.pid = -1};
    struct sup_user user;
    char why[300];
    int terminating = 0;
    bool timed_out = false, have_user;
    int64_t deadline;
    int sfd;

    launch_set_untrusted_dir(o->untrusted_dir);
    (void)fcntl(o->status_fd, F_SETFD, FD_CLOEXEC);
    if (o->pass_fd >= 0)
        (void)fcntl(o->pass_fd, F_SETFD, FD_CLOEXEC);
    /* nothing but stdin, stdout, stderr (and the pass fd) reaches the command (the status fd
     * is CLOEXEC) */
    proc_close_all_but(o->status_fd, o->pass_fd);
    (void)setsid();
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);

    if (o->cwd && chdir(o->cwd) < 0) {
        report_cwd_error(o->status_fd, o->cwd, errno);
        return 0;
    }
    if (launch_user_prepare(o->user, &user, &have_user, why, sizeof(why)) < 0) {
        proc_write_status(o->status_fd, "error %s", why);
        return 0;
    }

    sfd = proc_open_signalfd(false);
    if (sfd < 0) {
        proc_write_status(o->status_fd, "error signalfd failed: %s", strerror(errno));
        return 0;
    }

    deadline = proc_mono_ms() + o->timeout_ms;
    cmd.pid = fork();
    if (cmd.pid < 0) {
        proc_write_status(o->status_fd, "error fork failed: %s", strerror(errno));
        return 0;
    }
    if (cmd.pid == 0)
        exec_command(o->argv, o->status_fd, o->pass_fd, &user, have_user);
    (void)setpgid(cmd.pid, cmd.pid);

    for (;;) {
        int64_t left;

        proc_reap(&cmd);
        if (cmd.done)
            break;
        left = deadline - proc_mono_ms();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        proc_wait_signal(sfd, left, &terminating);
        if (terminating)
            break;
    }

    if (timed_out || terminating)
        proc_terminate_tree(&cmd, sfd);
    else if (!o->keep_background)
        proc_kill_tree(&cmd, sfd, SIGKILL);

    if (terminating) {
        proc_write_status(o->status_fd, "error supervisor received signal %s",
                          strsignal(terminating));
    } else if (timed_out) {
        proc_write_status(o->status_fd, "timeout");
    } else if (WIFEXITED(cmd.status)) {
        proc_write_status(o->status_fd, "exit %d", WEXITSTATUS(cmd.status));
    } else {
        proc_write_status(o->status_fd, "signal %d",
                          WIFSIGNALED(cmd.status) ? WTERMSIG(cmd.status) : 0);
    }
    return 0;
}
