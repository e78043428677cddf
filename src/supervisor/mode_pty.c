/*
 * mode_pty.c - PTY mode of lendbox-supervise (--pty-launch, the daemon's PTY sessions and
 * detached execs): the detached holder that owns a terminal (or three pipes) and the session
 * directory's FIFOs, runs the command on it, writes its output into rotating segment files,
 * obeys control lines (resize, signal, kill, eof) and records the exit code once every byte is
 * in. The files and control lines: supervise.c's head comment, "PTY mode".
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "supervisor/supervise_internal.h"

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
    struct sup_child cmd;
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
    int fd;

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
    launch_exec(argv, false, u, have_user, -1);
}

/* The PTY holder: owns the terminal (or the pipes) and the session's files. Reports setup
 * with one byte on ready_fd, then runs until the command is over. Returns its exit status. */
static int run_pty_holder(const struct sup_options *o, int ready_fd, const struct sup_user *user,
                          bool have_user)
{
    struct pty_state *st = calloc(1, sizeof(*st));
    char slave[128] = "", text[32];
    int pipes[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};
    int64_t idle_since = -1;
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
     * sandbox process may take it through /proc/<pid>/fd, pidfd_getfd or ptrace. main (supervise.c)
     * made us non-dumpable and nothing since changed our ids (which would reset it to
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
        proc_close_all_but(ready_fd, st->dir);
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
    sfd = proc_open_signalfd(true);
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

        proc_reap(&st->cmd);
        if (st->cmd.done && st->slave >= 0) {
            (void)close(st->slave); /* from now on EIO means every byte was read */
            st->slave = -1;
        }
        if (st->kill_requested)
            proc_kill_tree(&st->cmd, sfd, SIGKILL);
        out_open = *a >= 0 || (!st->pty && st->err_r >= 0);
        if (!out_open && st->cmd.done)
            break;
        if (st->cmd.done) {
            int64_t now = proc_mono_ms();

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
            proc_drain_signalfd(sfd, &terminating);
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
    proc_kill_tree(&st->cmd, sfd, SIGKILL);
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
int mode_pty_launch(const struct sup_options *o)
{
    struct sup_user user;
    bool have_user;
    char why[300];
    int e;

    if (launch_user_prepare(o->user, &user, &have_user, why, sizeof(why)) < 0) {
        fprintf(stderr, "lendbox-supervise: %s\n", why);
        return 1;
    }

    if (fcntl(o->pty_dir_fd, F_SETFD, FD_CLOEXEC) < 0) {
        fprintf(stderr, "lendbox-supervise: no session directory fd %d: %s\n", o->pty_dir_fd,
                strerror(errno));
        return 1;
    }
    e = launch_holder(run_pty_holder, o, &user, have_user);
    if (e == -ECHILD) {
        fprintf(stderr, "lendbox-supervise: the PTY holder failed to start\n");
        return 1;
    }
    if (e < 0) {
        fprintf(stderr, "lendbox-supervise: cannot start the PTY holder: %s\n", strerror(-e));
        return 1;
    }
    return 0;
}
