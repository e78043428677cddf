/*
 * pty_watch.c - the PTY watcher: one inotify thread over every session directory, and the
 * waiters (parked long-polls of output and wait) it wakes when a session's files change. A
 * waiter is woken through the waker its caller gave (struct lb_pty_waker), so the service knows
 * nothing of HTTP. Shares pty_internal.h.
 */
#include "lend/pty_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "util/fd.h"
#include "util/log.h"

#define WATCH_MASK                                                                                 \
    (IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE_SELF | IN_MOVE_SELF)

/* A parked poll of one session. */
struct pty_waiter {
    struct lb_pty_waker waker;
    bool err_stream;
    bool exit_only; /* a wait: output does not wake it */
    struct pty_waiter *next;
};

/* Wake the waiter, drop its reference and free it. */
static void waiter_end(struct pty_waiter *w)
{
    w->waker.wake(w->waker.ctx);
    w->waker.release(w->waker.ctx);
    free(w);
}

void pty_wake_all_locked(struct session *s)
{
    for (struct pty_waiter *w = s->waiters, *next; w; w = next) {
        next = w->next;
        waiter_end(w);
    }
    s->waiters = NULL;
}

static void on_event(struct lb_ptys *p, const struct inotify_event *ev)
{
    struct session *s, *tmp;

    pthread_mutex_lock(&p->lock);
    HASH_ITER(hh, p->sessions, s, tmp) {
        if (s->wd != ev->wd)
            continue;
        bool ctl_end = false;

        if (ev->mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF))
            s->wd = -1;
        /* a close of ctl is the holder's end, or a resize/signal request's: only the first
         * counts (the probe opens "in", which wakes nobody) */
        if (ev->len > 0 && strcmp(ev->name, "ctl") == 0)
            ctl_end = !pty_holder_alive(p, s->sid);
        for (struct pty_waiter **pw = &s->waiters; *pw;) {
            struct pty_waiter *w = *pw;
            const char *stream = w->err_stream ? "err." : "out.";
            bool hit = !(ev->len > 0) || (!w->exit_only && strncmp(ev->name, stream, 4) == 0) ||
                       strcmp(ev->name, "exit") == 0 || ctl_end;

            if (!hit) {
                pw = &w->next;
                continue;
            }
            *pw = w->next;
            waiter_end(w);
        }
        break;
    }
    pthread_mutex_unlock(&p->lock);
}

static void *watch_main(void *arg)
{
    struct lb_ptys *p = arg;
    char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));

    for (;;) {
        struct pollfd pf[2] = {{.fd = p->ino, .events = POLLIN},
                               {.fd = p->stop[0], .events = POLLIN}};
        ssize_t n;

        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (pf[1].revents)
            break;
        n = read(p->ino, buf, sizeof(buf));
        if (n <= 0)
            continue;
        for (char *c = buf; c < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)c;

            on_event(p, ev);
            c += sizeof(*ev) + ev->len;
        }
    }
    return NULL;
}

int pty_watcher_open(struct lb_ptys *p, struct lb_error *err)
{
    p->ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (p->ino < 0 || pipe2(p->stop, O_CLOEXEC) < 0)
        return lb_error_set(err, -errno, "cannot start the PTY watcher: %s", strerror(errno));
    return 0;
}

int pty_watcher_start(struct lb_ptys *p, struct lb_error *err)
{
    if (pthread_create(&p->thread, NULL, watch_main, p) != 0)
        return lb_error_set(err, -EAGAIN, "cannot start the PTY watcher thread");
    p->thread_started = true;
    return 0;
}

void pty_watcher_stop(struct lb_ptys *p)
{
    if (p->thread_started) {
        (void)!write(p->stop[1], "x", 1);
        pthread_join(p->thread, NULL);
        p->thread_started = false;
    }
}

void pty_watcher_close(struct lb_ptys *p)
{
    fd_close(&p->ino);
    fd_close(&p->stop[0]);
    fd_close(&p->stop[1]);
}

void pty_watcher_add_locked(struct lb_ptys *p, struct session *s)
{
    char path[PATH_MAX];

    snprintf(path, sizeof(path), "%s/%s", p->dir, s->sid);
    s->wd = inotify_add_watch(p->ino, path, WATCH_MASK | IN_DONT_FOLLOW | IN_ONLYDIR);
    if (s->wd < 0)
        log_warn("pty: cannot watch %s: %s (its long-polls wait for their deadline)", path,
                 strerror(errno));
}

void pty_watcher_forget_locked(struct lb_ptys *p, struct session *s)
{
    pty_wake_all_locked(s);
    if (s->wd >= 0)
        (void)inotify_rm_watch(p->ino, s->wd);
    s->wd = -1;
}

void pty_watch(struct lb_ptys *p, const char *sid, bool err_stream, int64_t since,
               const struct lb_pty_waker *waker)
{
    struct pty_waiter *w = calloc(1, sizeof(*w));
    struct lb_pty_chunk c;
    struct session *s = NULL;
    bool ready;

    pthread_mutex_lock(&p->lock);
    if (pty_sid_is_valid(sid))
        HASH_FIND_STR(p->sessions, sid, s);
    if (!s || !w) {
        pthread_mutex_unlock(&p->lock);
        free(w);
        waker->wake(waker->ctx);
        waker->release(waker->ctx);
        return;
    }
    w->waker = *waker;
    w->err_stream = err_stream;
    w->exit_only = since < 0;
    w->next = s->waiters;
    s->waiters = w;
    pthread_mutex_unlock(&p->lock);
    /* registered: now the event cannot be missed; has it happened already? */
    if (since < 0) {
        int code;

        ready = pty_exit_code(p, sid, &code, NULL) != -EAGAIN;
    } else if (pty_read(p, sid, err_stream, (uint64_t)since, &c, NULL) < 0) {
        ready = true;
    } else {
        ready = c.exited || (since >= 0 && c.end > (uint64_t)since);
        if (c.fd >= 0)
            close(c.fd);
    }
    if (ready)
        waker->wake(waker->ctx); /* its owner unlinks it (pty_unwatch) */
}

void pty_unwatch(struct lb_ptys *p, const void *ctx)
{
    struct session *s, *tmp;

    pthread_mutex_lock(&p->lock);
    HASH_ITER(hh, p->sessions, s, tmp) {
        for (struct pty_waiter **pw = &s->waiters; *pw; pw = &(*pw)->next) {
            if ((*pw)->waker.ctx == ctx) {
                struct pty_waiter *w = *pw;

                *pw = w->next;
                w->waker.release(w->waker.ctx);
                free(w);
                pthread_mutex_unlock(&p->lock);
                return;
            }
        }
    }
    pthread_mutex_unlock(&p->lock);
}
