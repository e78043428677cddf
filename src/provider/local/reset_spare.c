/*
 * reset_spare.c - the spare reset helper (local_internal.h): one lendbox-supervise
 * --reset-spare started ahead and kept, so that an in-place reset (reset.c) pays a message to
 * a waiting process instead of an exec. On this machine's VM an exec of the static helper
 * costs ~1 ms (a new address space faulted in page by page), the reset's own work ~0.6 ms.
 *
 * A thread of the provider keeps one spare while in-place resets are on: it starts one when
 * none waits (and after a failed start, again a second later). A reset takes it and, once the
 * spare said the reset is done, gives it back: the spare never enters a sandbox's user
 * namespace and leaves the others after each reset (mode_reset.c), so it serves one reset
 * after another. A reset that failed ends it (the thread starts another). A reset that finds
 * none waiting (another reset has it) execs a helper of its own, as before. A spare holds
 * nothing of any sandbox between resets: host root, its own namespaces, its fds /dev/null and
 * the socket. It ends when its socket does: at the provider's end, or when the daemon dies.
 */
#include "provider/local/local_internal.h"
#include "provider/local/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
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
    pthread_cond_t wake; /* the spare was taken, or quit */
    pthread_t thread;
    pid_t pid;   /* the waiting spare, 0: none */
    pid_t spent; /* a spare whose reset is done, for the thread to reap; 0: none */
    int sock;    /* our end of its socket */
    bool quit;
    bool failed_logged;
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
        if (s->pid > 0) {
            pthread_cond_wait(&s->wake, &s->lock);
            continue;
        }
        pid_t pid = 0;
        int sock = -1, r;

        pthread_mutex_unlock(&s->lock);
        r = spare_start(lp, &pid, &sock);
        pthread_mutex_lock(&s->lock);
        if (r < 0) {
            int64_t at = clock_mono_ms() + 1000;
            struct timespec until = {.tv_sec = at / 1000, .tv_nsec = (long)(at % 1000) * 1000000L};

            if (!s->failed_logged)
                log_warn("cannot start a spare reset helper (%s): in-place resets exec their "
                         "own",
                         strerror(-r));
            s->failed_logged = true;
            (void)pthread_cond_timedwait(&s->wake, &s->lock, &until);
            continue;
        }
        if (s->quit) {
            pthread_mutex_unlock(&s->lock);
            spare_end(pid, sock);
            pthread_mutex_lock(&s->lock);
            break;
        }
        s->pid = pid;
        s->sock = sock;
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
    pthread_mutex_init(&s->lock, NULL);
    clock_cond_init_mono(&s->wake);
    s->sock = -1;
    lp->reset_spare = s;
    r = pthread_create(&s->thread, NULL, spare_main, lp);
    if (r != 0) {
        lp->reset_spare = NULL;
        pthread_cond_destroy(&s->wake);
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
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    if (s->spent > 0)
        spare_reap(s->spent, 5000);
    spare_end(s->pid, s->sock);
    pthread_cond_destroy(&s->wake);
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
    }
    pthread_mutex_unlock(&s->lock);
    return pid;
}

void local_reset_spare_done(struct local_provider *lp, pid_t pid, int sock)
{
    struct local_reset_spare *s = lp->reset_spare;

    if (!s) {
        spare_end(pid, sock);
        return;
    }
    pthread_mutex_lock(&s->lock);
    if (pid > 0 && s->pid == 0 && !s->quit) { /* it waits for the next reset */
        s->pid = pid;
        s->sock = sock;
    } else if (pid > 0) { /* one waits already (another reset's fallback, say): this one ends */
        close(sock);      /* it exits on the socket's end */
        if (s->spent == 0) {
            s->spent = pid;
        } else {
            pthread_mutex_unlock(&s->lock);
            spare_reap(pid, 5000);
            pthread_mutex_lock(&s->lock);
        }
    }
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
}
