/*
 * reset_spare.c - the spare reset helper (local_internal.h): one lendbox-supervise
 * --reset-spare started ahead and kept, so that an in-place reset (reset.c) pays a message to
 * a waiting process instead of an exec. On this machine's VM an exec of the static helper
 * costs ~1 ms (a new address space faulted in page by page), the reset's own work ~0.6 ms.
 *
 * A thread of the provider, the keeper, keeps one spare while in-place resets are on: it
 * starts one when none waits (and after a failed start, again a second later). A reset takes
 * it and, once the spare said the reset is done and then that it is back in its own
 * namespaces, gives it back: the spare never enters a sandbox's user namespace and leaves the
 * others after each reset (mode_reset.c), so it serves one reset after another. A reset that
 * failed ends it; one that does not come back is ended (the keeper starts another once the
 * reset said so: never a second spare while one is out). A reset that finds none waiting
 * (another reset has it) execs a helper of its own, as before. The keeper watches the waiting
 * spare through a pidfd (without one, a look once a second): one that ends while it waits (an
 * operator's kill, the OOM killer) is reaped, logged and replaced, never left counted as
 * waiting. A spare holds nothing of any sandbox between resets: host root, its own
 * namespaces, its fds /dev/null and the socket. It ends when its socket does: at the
 * provider's end, or when the daemon dies.
 */
#include "provider/local/local_internal.h"
#include "provider/local/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "supervisor/signals.h"
#include "util/clock.h"
#include "util/fault.h"
#include "util/log.h"

struct local_reset_spare {
    pthread_mutex_t lock;
    int wake_fd; /* eventfd: a spare given back or lost, or quit (the keeper polls it) */
    pthread_t thread;
    pid_t pid;   /* the waiting spare, 0: none */
    int out;     /* spares taken by resets and not yet given back or lost (0 or 1) */
    pid_t spent; /* a spare given back when another waited, or after quit: the keeper reaps */
    int sock;    /* our end of the waiting spare's socket */
    int pidfd;   /* the keeper's pidfd of spare pidfd_of (-1: none); the keeper's only */
    pid_t pidfd_of;
    bool quit;
    bool failed_logged;
    bool pidfd_failed_logged;
};

struct spare_child {
    const int *fds; /* /dev/null x 3, its socket end */
    const char *path;
};

static int spare_child_exec(void *arg)
{
    const struct spare_child *c = arg;
    char *argv[] = {(char *)c->path, "--reset-spare", NULL};
    char *envp[] = {NULL};
    int e;

    sup_signals_reset();
    (void)syscall(SYS_setsid);
    if (local_child_new_session_keyring() < 0) {
        e = errno;
        return e;
    }
    if (local_child_place_fds(c->fds, 4) < 0)
        return errno;
    (void)syscall(SYS_close_range, 4, ~0U, 0);
    execve(argv[0], argv, envp);
    return errno;
}

/* Start a spare: 0 with *pid and *sock, or a negative errno. */
static int spare_start(const struct local_provider *lp, pid_t *pid, int *sock)
{
    int fds[4] = {-1, -1, -1, -1}, pair[2] = {-1, -1}, r;
    struct spare_child c = {fds, lp->supervise_path};

    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) < 0)
        return -errno;
    fds[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    fds[1] = open("/dev/null", O_WRONLY | O_CLOEXEC);
    fds[2] = open("/dev/null", O_WRONLY | O_CLOEXEC);
    fds[3] = pair[1];
    if (fds[0] < 0 || fds[1] < 0 || fds[2] < 0) {
        r = -errno;
        goto out;
    }
    r = spawn_vfork(spare_child_exec, &c, pid);
    if (r > 0)
        r = -r;
out:
    for (int i = 0; i < 3; i++)
        local_close_fd(&fds[i]);
    local_close_fd(&pair[1]);
    if (r < 0)
        local_close_fd(&pair[0]);
    else
        *sock = pair[0];
    return r;
}

/* Reap spare pid, which is exiting or about to (its socket closed): bounded by bound_ms,
 * killed past it. */
static void spare_reap(pid_t pid, int64_t bound_ms)
{
    if (pid > 0 && local_wait_child(pid, clock_mono_ms() + bound_ms, NULL) < 0) {
        (void)kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
}

/* End a waiting spare: its socket's end makes it exit 0. */
static void spare_end(pid_t pid, int sock)
{
    if (sock >= 0)
        close(sock);
    spare_reap(pid, 2000);
}

/* Wake the keeper (its poll). */
static void spare_wake(struct local_reset_spare *s)
{
    uint64_t one = 1;

    if (write(s->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        log_warn("cannot wake the spare reset helper's keeper: %s", strerror(errno));
}

/* Wait for the wake eventfd (and pidfd when >= 0) for up to timeout_ms (-1: no bound), with
 * s->lock dropped; drains the eventfd. Whether pidfd said its process ended. */
static bool spare_poll(struct local_reset_spare *s, int pidfd, int timeout_ms)
{
    struct pollfd p[2] = {{.fd = s->wake_fd, .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};
    uint64_t n;
    int r;

    pthread_mutex_unlock(&s->lock);
    do
        r = poll(p, 2, timeout_ms);
    while (r < 0 && errno == EINTR);
    if (p[0].revents & POLLIN)
        (void)!read(s->wake_fd, &n, sizeof(n));
    pthread_mutex_lock(&s->lock);
    return r > 0 && pidfd >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR));
}

/* The waiting spare ended (s->lock held; dropped and taken again): reaped (unless reaped
 * already, its status ws) and said. */
static void spare_lost_waiting(struct local_reset_spare *s, bool reaped, int ws)
{
    pid_t pid = s->pid, w = pid;
    int sock = s->sock;

    s->pid = 0;
    s->sock = -1;
    pthread_mutex_unlock(&s->lock);
    local_close_fd(&sock);
    while (!reaped && (w = waitpid(pid, &ws, 0)) < 0 && errno == EINTR)
        ;
    if (w == pid && WIFSIGNALED(ws))
        log_warn("the spare reset helper (pid %d) ended while it waited (killed by signal %d); "
                 "another is started",
                 (int)pid, WTERMSIG(ws));
    else if (w == pid)
        log_warn("the spare reset helper (pid %d) ended while it waited (exit status %d); "
                 "another is started",
                 (int)pid, WEXITSTATUS(ws));
    else
        log_warn("the spare reset helper (pid %d) ended while it waited (%s); another is "
                 "started",
                 (int)pid, strerror(errno));
    pthread_mutex_lock(&s->lock);
}

static void *spare_main(void *arg)
{
    struct local_provider *lp = arg;
    struct local_reset_spare *s = lp->reset_spare;

    pthread_mutex_lock(&s->lock);
    while (!s->quit) {
        if (s->spent > 0) {
            pid_t spent = s->spent;

            pthread_mutex_unlock(&s->lock);
            spare_reap(spent, 5000);
            pthread_mutex_lock(&s->lock);
            s->spent = 0;
            continue;
        }
        if (s->pid > 0) { /* one waits: watch it until it is taken, or ends */
            pid_t pid = s->pid;

            if (s->pidfd_of != pid) {
                local_close_fd(&s->pidfd);
                s->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
                if (s->pidfd >= 0)
                    s->pidfd_of = pid;
                else if (!s->pidfd_failed_logged)
                    log_warn("cannot watch the spare reset helper (pidfd_open: %s): looked at "
                             "once a second",
                             strerror(errno));
                s->pidfd_failed_logged |= s->pidfd < 0;
            }
            if (s->pidfd >= 0) {
                if (spare_poll(s, s->pidfd, -1) && s->pid == pid && !s->quit)
                    spare_lost_waiting(s, false, 0);
            } else { /* no pidfd: a look once a second (our child, not taken: ours to reap) */
                int ws = 0;

                (void)spare_poll(s, -1, 1000);
                if (s->pid == pid && !s->quit && waitpid(pid, &ws, WNOHANG) == pid)
                    spare_lost_waiting(s, true, ws);
            }
            continue;
        }
        if (s->out > 0) { /* taken by a reset: it comes back, or the reset says it is lost */
            (void)spare_poll(s, -1, -1);
            continue;
        }
        pid_t pid = 0;
        int sock = -1, r;

        pthread_mutex_unlock(&s->lock);
        r = spare_start(lp, &pid, &sock);
        pthread_mutex_lock(&s->lock);
        if (r < 0) {
            if (!s->failed_logged)
                log_warn("cannot start a spare reset helper (%s): in-place resets exec their "
                         "own",
                         strerror(-r));
            s->failed_logged = true;
            (void)spare_poll(s, -1, 1000);
            continue;
        }
        if (s->quit || s->pid > 0 || s->out > 0) { /* (not needed any more) */
            pthread_mutex_unlock(&s->lock);
            spare_end(pid, sock);
            pthread_mutex_lock(&s->lock);
            continue;
        }
        s->pid = pid;
        s->sock = sock;
        s->pidfd_of = 0; /* a new process, whatever its pid: a pidfd of its own */
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

int local_reset_spare_start(struct local_provider *lp)
{
    struct local_reset_spare *s = calloc(1, sizeof(*s));
    int r;

    if (!s)
        return -ENOMEM;
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wake_fd < 0) {
        r = -errno;
        free(s);
        return r;
    }
    pthread_mutex_init(&s->lock, NULL);
    s->sock = -1;
    s->pidfd = -1;
    lp->reset_spare = s;
    r = pthread_create(&s->thread, NULL, spare_main, lp);
    if (r != 0) {
        lp->reset_spare = NULL;
        close(s->wake_fd);
        pthread_mutex_destroy(&s->lock);
        free(s);
        return -r;
    }
    return 0;
}

void local_reset_spare_stop(struct local_provider *lp)
{
    struct local_reset_spare *s = lp->reset_spare;

    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    s->quit = true;
    spare_wake(s);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    if (s->spent > 0)
        spare_reap(s->spent, 5000);
    spare_end(s->pid, s->sock);
    local_close_fd(&s->pidfd);
    close(s->wake_fd);
    pthread_mutex_destroy(&s->lock);
    free(s);
    lp->reset_spare = NULL;
}

pid_t local_reset_spare_take(struct local_provider *lp, int *sock)
{
    struct local_reset_spare *s = lp->reset_spare;
    pid_t pid = 0;

    *sock = -1;
    if (!s || fault_hit("reset.spare", 0, NULL) < 0)
        return 0;
    pthread_mutex_lock(&s->lock);
    if (s->pid > 0 && !s->quit) {
        pid = s->pid;
        *sock = s->sock;
        s->pid = 0;
        s->sock = -1;
        s->out++;
    }
    pthread_mutex_unlock(&s->lock);
    return pid;
}

/* Count spare pid (its socket sock) as waiting again, or end it when one waits already
 * (another reset's spare, started while this one was taken). */
static void spare_give_back(struct local_reset_spare *s, pid_t pid, int sock)
{
    pthread_mutex_lock(&s->lock);
    s->out--;
    if (s->pid == 0 && !s->quit) { /* it waits for the next reset */
        s->pid = pid;
        s->sock = sock;
    } else {         /* one waits already: this one ends */
        close(sock); /* it exits on the socket's end */
        if (s->spent == 0) {
            s->spent = pid;
        } else {
            pthread_mutex_unlock(&s->lock);
            spare_reap(pid, 5000);
            pthread_mutex_lock(&s->lock);
        }
    }
    spare_wake(s);
    pthread_mutex_unlock(&s->lock);
}

void local_reset_spare_back(struct local_provider *lp, pid_t pid, int sock, int64_t deadline_ms)
{
    struct local_reset_spare *s = lp->reset_spare;
    int64_t left = deadline_ms - clock_mono_ms();
    struct pollfd p = {.fd = sock, .events = POLLIN};
    char said = 0;
    ssize_t n = -1;
    int r;

    if (left < 100)
        left = 100;
    do
        r = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
    while (r < 0 && errno == EINTR);
    if (r > 0) {
        do
            n = recv(sock, &said, 1, MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
    }
    if (n == 1 && said == 'b' && s) {
        spare_give_back(s, pid, sock);
        return;
    }
    if (s) /* (without a keeper the spare ends in any case) */
        log_warn("the spare reset helper (pid %d) did not come back after its reset; ended, "
                 "another is started",
                 (int)pid);
    local_reset_spare_kill(lp, pid, sock);
}

void local_reset_spare_kill(struct local_provider *lp, pid_t pid, int sock)
{
    (void)kill(pid, SIGKILL);
    spare_end(pid, sock);
    local_reset_spare_lost(lp);
}

void local_reset_spare_lost(struct local_provider *lp)
{
    struct local_reset_spare *s = lp->reset_spare;

    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    s->out--;
    spare_wake(s);
    pthread_mutex_unlock(&s->lock);
}
