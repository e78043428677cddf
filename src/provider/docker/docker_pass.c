/*
 * docker_pass.c - passing a daemon fd to one exec of a container (the docker engine passes
 * none): a listening unix socket in the sandbox's bind-mounted pass directory, which hands the
 * fd by SCM_RIGHTS to the exec's own process alone (its SO_PEERCRED pid is the "Pid" the
 * engine gives for the exec) and to no other sandbox process. See docker_internal.h.
 */
#include "provider/docker/docker_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/token.h"

#define PASS_BACKLOG 16
#define PASS_PID_POLL_MS 20 /* between exec inspections while the engine has no Pid yet */

/* The exec's host pid from the engine (0: none yet, or the exec ended). */
static pid_t exec_pid(struct docker_pass *ps)
{
    struct lb_httpc_response resp = {0};
    struct lb_error err = {0};
    char path[160];
    json_t *j = NULL;
    pid_t pid = 0;

    snprintf(path, sizeof(path), "/exec/%s/json", ps->exec_id);
    if (docker_call(ps->d, "GET", path, NULL, 10000, &resp, &err) == 0 && resp.status == 200 &&
        (j = json_loadb(resp.body.data, resp.body.len, 0, NULL))) {
        json_int_t v = json_integer_value(json_object_get(j, "Pid"));

        if (v > 0 && v <= INT_MAX)
            pid = (pid_t)v;
    }
    json_decref(j);
    httpc_response_release(&resp);
    lb_error_clear(&err);
    return pid;
}

/* Wait up to ms for stop or (with_listen) the listening socket; 1 readable, 0 timed out, -1
 * stopped. */
static int wait_event(struct docker_pass *ps, int64_t ms, bool with_listen)
{
    struct pollfd pfd[2] = {{.fd = ps->stop_fd, .events = POLLIN},
                            {.fd = with_listen ? ps->listen_fd : -1, .events = POLLIN}};

    if (ms < 0)
        ms = 0;
    if (poll(pfd, 2, (int)(ms > INT_MAX ? INT_MAX : ms)) < 0)
        return errno == EINTR ? 0 : -1;
    if (pfd[0].revents)
        return -1;
    return pfd[1].revents ? 1 : 0;
}

/* Hand the fd over on conn: one byte "p" with the fd as SCM_RIGHTS. */
static int send_fd(int conn, int fd)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    char byte = 'p';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    struct cmsghdr *c;

    memset(u.buf, 0, sizeof(u.buf));
    c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    return sendmsg(conn, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) == 1 ? 0 : -1;
}

static void *pass_serve(void *arg)
{
    struct docker_pass *ps = arg;
    pid_t want = 0;

    for (;;) {
        int64_t left = ps->deadline_ms - clock_mono_ms();
        struct ucred cred;
        socklen_t len = sizeof(cred);
        int conn, w;

        if (left <= 0 || (w = wait_event(ps, left, true)) < 0)
            break;
        if (w == 0)
            continue;
        conn = accept4(ps->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0)
            continue;
        if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.pid <= 0) {
            (void)close(conn);
            atomic_fetch_add(&ps->refused, 1);
            continue;
        }
        /* the engine learns the exec's pid only once it runs: ask until it knows it */
        while (want == 0 && clock_mono_ms() < ps->deadline_ms) {
            want = exec_pid(ps);
            if (want == 0 && wait_event(ps, PASS_PID_POLL_MS, false) < 0)
                break;
        }
        if (want == 0 || cred.pid != want) {
            (void)close(conn);
            atomic_fetch_add(&ps->refused, 1);
            if (want == 0)
                break;
            continue;
        }
        if (send_fd(conn, ps->fd) == 0)
            atomic_store(&ps->sent, true);
        (void)close(conn);
        break;
    }
    /* one fd, one taker: nobody connects any more */
    (void)unlinkat(ps->dir_fd, ps->name, 0);
    (void)close(ps->listen_fd);
    ps->listen_fd = -1;
    return NULL;
}

int docker_pass_open(struct lb_docker *d, const char *id, int fd, struct docker_pass *ps,
                     char *path, size_t size, struct lb_error *err)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char dir[PATH_MAX], hex[2 * 12 + 1];
    struct stat st;
    int r;

    memset(ps, 0, sizeof(*ps));
    ps->d = d;
    ps->fd = fd;
    ps->dir_fd = ps->listen_fd = ps->stop_fd = -1;
    /* a host directory (or any other kind) handed into a container would be a way out of it */
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
        return lb_error_set(err, -ENOSYS,
                            "the docker provider passes only regular files into a container");
    r = token_random_hex(12, hex);
    if (r < 0)
        return lb_error_set(err, -EREMOTEIO, "no random bytes: %s", strerror(-r));
    snprintf(ps->name, sizeof(ps->name), "%s", hex);
    snprintf(path, size, "%s/%s", DOCKER_PASS_PATH, ps->name);
    docker_pass_dir(d, id, dir, sizeof(dir));
    ps->dir_fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (ps->dir_fd < 0) {
        r = errno;
        r = r == ENOENT ? lb_error_set(err, -ENOENT, "no such sandbox (its pass directory is gone)")
                        : lb_error_set(err, -r, "cannot open '%s': %s", dir, strerror(r));
        goto fail;
    }
    /* bound through the directory's fd: the host path may be longer than sun_path */
    snprintf(sa.sun_path, sizeof(sa.sun_path), "/proc/self/fd/%d/%s", ps->dir_fd, ps->name);
    ps->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ps->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ps->listen_fd < 0 || ps->stop_fd < 0) {
        r = lb_error_set(err, -errno, "cannot make the pass socket: %s", strerror(errno));
        goto fail;
    }
    if (bind(ps->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        r = lb_error_set(err, -errno, "cannot bind the pass socket in '%s': %s", dir,
                         strerror(errno));
        goto fail;
    }
    ps->bound = true;
    if (listen(ps->listen_fd, PASS_BACKLOG) < 0) {
        r = lb_error_set(err, -errno, "cannot listen on the pass socket: %s", strerror(errno));
        goto fail;
    }
    return 0;
fail:
    docker_pass_close(ps);
    return r;
}

int docker_pass_start(struct docker_pass *ps, const char *exec_id, int64_t wait_ms,
                      struct lb_error *err)
{
    int r;

    snprintf(ps->exec_id, sizeof(ps->exec_id), "%s", exec_id);
    ps->deadline_ms = clock_mono_ms() + wait_ms;
    r = pthread_create(&ps->thread, NULL, pass_serve, ps);
    if (r != 0)
        return lb_error_set(err, -r, "cannot start the pass thread: %s", strerror(r));
    ps->started = true;
    return 0;
}

void docker_pass_close(struct docker_pass *ps)
{
    if (ps->started) {
        uint64_t one = 1;

        (void)!write(ps->stop_fd, &one, sizeof(one));
        pthread_join(ps->thread, NULL);
        ps->started = false;
    }
    if (ps->bound && ps->dir_fd >= 0)
        (void)unlinkat(ps->dir_fd, ps->name, 0);
    ps->bound = false;
    if (ps->listen_fd >= 0)
        (void)close(ps->listen_fd);
    if (ps->stop_fd >= 0)
        (void)close(ps->stop_fd);
    if (ps->dir_fd >= 0)
        (void)close(ps->dir_fd);
    ps->listen_fd = ps->stop_fd = ps->dir_fd = -1;
}
