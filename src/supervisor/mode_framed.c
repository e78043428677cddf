/*
 * mode_framed.c - framed mode of lendbox-supervise (--framed, the engine providers' exec):
 * the exclusive sweep and loopback first when asked, stdin from a file, the daemon's fd from
 * --pass-socket, then command mode in a child whose stdout, stderr and status line come back
 * as frames on our stdout. The frame format: supervise.c's head comment, "Framed mode".
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "supervisor/supervise_internal.h"

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

/* The command-mode child ended without a status line (a process of the exec killed it, or the
 * OOM killer did): nothing enforces the exec's timeout any more. SIGKILL every descendant of
 * ours (the command's tree, and as subreaper every process of it whose parent had exited:
 * one that called setsid, a double fork) until none is left, then say what happened in the
 * status line. st: the child's wait status. */
static void end_orphaned_tree(int st, char *line, size_t size, size_t *line_len)
{
    const char *name, *descr;
    int killed = 0, sig;

    /* every process of the tree ends as a child of ours (orphans come to the subreaper):
     * the count is the children reaped */
    for (;;) {
        (void)proc_signal_descendants(SIGKILL);
        while (waitpid(-1, NULL, WNOHANG) > 0)
            killed++;
        if (waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD)
            break;
        struct timespec ts = {0, KILL_POLL_MS * 1000000L};

        nanosleep(&ts, NULL);
    }
    if (WIFSIGNALED(st)) {
        sig = WTERMSIG(st);
        name = sigabbrev_np(sig);
        descr = sigdescr_np(sig);
        snprintf(line, size,
                 "error the exec's supervisor was killed by signal %d (SIG%s, %s); the command's "
                 "outcome is unknown",
                 sig, name ? name : "?", descr ? descr : "unknown signal");
    } else {
        snprintf(line, size, "error the exec's supervisor exited without a status");
    }
    if (killed > 0) {
        size_t len = strlen(line);

        snprintf(line + len, size - len, "; lendbox killed the %d processes the exec left running",
                 killed);
    }
    *line_len = strlen(line);
}

int mode_framed_run(const struct sup_options *o)
{
    int out[2], err[2], status[2], in = -1, pass = -1;
    struct framed_stream streams[2];
    char line[1100];
    size_t line_len = 0;
    struct sup_options child_opts = *o;
    pid_t pid;
    int st = 0;

    (void)signal(SIGPIPE, SIG_IGN);
    if (o->loopback_up)
        proc_loopback_up();
    if (o->exclusive && proc_kill_all_but_init(o->spare_init_session) < 0) {
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
    /* the exec's processes whose parents exit come to us, not to the sandbox's init: should
     * the command-mode supervisor die, every one of them is still ours to end */
    (void)prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
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
        /* mode_command_run closes every fd above 2 but the status fd */
        _exit(mode_command_run(&child_opts));
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
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (line_len == 0)
        end_orphaned_tree(st, line, sizeof(line), &line_len);
    /* a --keep-background process goes on under the sandbox's init once we exit */
    while (line_len && line[line_len - 1] == '\n')
        line_len--;
    (void)write_frame('s', line, line_len);
    return 0;
}
