/*
 * mode_harness.c - harness mode of lendbox-supervise: --harness-launch (claim the launch, start
 * the detached harness supervisor, which runs the harness until it exits, a stop request or
 * its timeout, cleans up its process tree in three phases and writes the receipt once) and
 * --harness-stop (request the stop, or fence a launch that has not happened). The files, the
 * receipt and the exit codes: supervise.c's head comment, "Harness mode".
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "supervisor/supervise_internal.h"

/* ms between two looks for DIR/stop.request */
#define HARNESS_POLL_MS 50

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
static void wait_harness(struct sup_child *cmd, int sfd, int64_t ms)
{
    int64_t deadline = proc_mono_ms() + ms;

    for (;;) {
        int64_t left;

        if (proc_reap(cmd) || cmd->done)
            return;
        left = deadline - proc_mono_ms();
        if (left <= 0)
            return;
        proc_wait_signal(sfd, left < KILL_POLL_MS * 5 ? left : KILL_POLL_MS * 5, NULL);
    }
}

/* The three cleanup phases: TERM and wait, KILL and wait, drain every descendant. */
static void harness_cleanup(struct sup_child *cmd, int sfd, int64_t phase, struct receipt *r)
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
    deadline = proc_mono_ms() + phase;
    for (;;) {
        if (!cmd->done) /* after the leader is reaped its pid may be reused */
            (void)kill(-cmd->pid, SIGKILL);
        (void)proc_signal_descendants(SIGKILL);
        if (proc_reap(cmd))
            break; /* no child (and, as a subreaper, no descendant) left */
        if (proc_mono_ms() >= deadline) {
            fail = "sandbox processes of the harness remain alive";
            break;
        }
        proc_wait_signal(sfd, KILL_POLL_MS, NULL);
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
    proc_close_all_but(keep, keep2);
    return 0;
}

/* The harness supervisor (a child of the launcher). Reports setup with one byte on ready_fd.
 * Returns its exit status. */
static int run_harness(const struct sup_options *o, int ready_fd, const struct sup_user *user,
                       bool have_user)
{
    struct sup_child cmd = {.pid = -1};
    struct receipt r = {0};
    char pid_text[32];
    int terminating = 0, err_pipe[2], e = 0, sfd, n;
    bool timed_out = false;
    int64_t deadline;
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

    sfd = proc_open_signalfd(false);
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
    deadline = proc_mono_ms() + o->timeout_ms;
    cmd.pid = fork();
    if (cmd.pid < 0) {
        set_error(&r, "fork failed: %s", strerror(errno));
        r.confirmed = true;
        return write_receipt(o->receipt_fd, &r) < 0;
    }
    if (cmd.pid == 0) {
        (void)close(err_pipe[0]);
        setpgid(0, 0);
        launch_exec(o->argv, false, user, have_user, err_pipe[1]);
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

        proc_reap(&cmd);
        if (cmd.done) {
            /* a harness that ended on seeing the stop request (its stop_request_path) may be
             * reaped before this loop saw the request: it was still stopped by it */
            if (harness_exists(o->harness_launch, "stop.request"))
                r.stop_requested = true;
            break;
        }
        /* the deadline first: a supervisor that was frozen (a paused sandbox) past it finds
         * the harness timed out, even if a stop request came in meanwhile */
        left = deadline - proc_mono_ms();
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
        proc_wait_signal(sfd, left < HARNESS_POLL_MS ? left : HARNESS_POLL_MS, &terminating);
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

/* The launcher's exit status when it failed before it took the launch claim (nothing was or
 * will be launched by it): the daemon may then trust a stop's "fenced". */
#define LAUNCH_UNCLAIMED 5

int mode_harness_launch(struct sup_options *o)
{
    char claim[PATH_MAX], target[16], why[300];
    struct sup_user user;
    bool have_user;
    ssize_t n;
    int e;

    /* the harness's cwd (--cwd): changed to here, before the claim, so that a bad one is this
     * launcher's own failure (LAUNCH_UNCLAIMED), which the daemon reads from its status */
    if (o->cwd && chdir(o->cwd) < 0) {
        fprintf(stderr, "lendbox-supervise: cwd '%s' does not exist or cannot be entered: %s\n",
                o->cwd, strerror(errno));
        return LAUNCH_UNCLAIMED;
    }
    if (launch_user_prepare(o->user, &user, &have_user, why, sizeof(why)) < 0) {
        fprintf(stderr, "lendbox-supervise: %s\n", why);
        return LAUNCH_UNCLAIMED;
    }

    e = mkdir_p(o->harness_launch);
    if (e < 0) {
        fprintf(stderr, "lendbox-supervise: cannot create '%s': %s\n", o->harness_launch,
                strerror(-e));
        return LAUNCH_UNCLAIMED;
    }
    /* the receipt channel is the harness supervisor's alone, never the harness's */
    if (!o->receipt_file && fcntl(o->receipt_fd, F_SETFD, FD_CLOEXEC) < 0) {
        fprintf(stderr, "lendbox-supervise: no receipt fd %d: %s\n", o->receipt_fd,
                strerror(errno));
        return LAUNCH_UNCLAIMED;
    }
    harness_path(claim, o->harness_launch, "launch.claim");
    if (symlink("launch", claim) < 0) {
        if (errno != EEXIST) {
            fprintf(stderr, "lendbox-supervise: cannot claim the launch: %s\n", strerror(errno));
            return LAUNCH_UNCLAIMED;
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
         * sandbox process could still write it later: the daemon says so, see supervise.c's head
         * comment) */
        o->receipt_fd =
            open(o->receipt_file, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (o->receipt_fd < 0) {
            fprintf(stderr, "lendbox-supervise: cannot create the receipt file '%s': %s\n",
                    o->receipt_file, strerror(errno));
            return 1;
        }
    }
    e = launch_holder(run_harness, o, &user, have_user);
    if (e == -ECHILD) {
        fprintf(stderr, "lendbox-supervise: the harness supervisor failed to start (see %s)\n",
                "output.log and receipt.json");
        return 1;
    }
    if (e < 0) {
        struct receipt r = {.confirmed = true};

        set_error(&r, "cannot start the harness supervisor: %s", strerror(-e));
        (void)write_receipt(o->receipt_fd, &r);
        fprintf(stderr, "lendbox-supervise: %s\n", r.error);
        return 1;
    }
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
    if (proc_parse_int64(text, 2, INT_MAX, &pid) == 0)
        (void)kill((pid_t)pid, SIGCONT);
}

int mode_harness_stop(const char *dir)
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
