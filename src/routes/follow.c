/*
 * follow.c - following an activation's output log (GET /v1/sessions/{rsid}/activation with
 * Accept: application/x-ndjson), without holding a worker while the harness runs.
 *
 * The route's job opens the log (a provider call), begins the streamed response and hands it
 * here (http_stream_keep), then returns its worker. One follower thread serves every follow:
 * woken by inotify on the open log files (and every TICK_MS at the latest), it reads what was
 * appended and writes {"stream": "log", "data": text} lines (UTF-8, a sequence cut between two
 * reads held back, as streamed exec does). Once the activation's watch says the harness has
 * ended (activation_watch_changed: a store and receipt read, quick), it reads the rest and
 * hands the final line - the activation object as GET .../activation returns it, which may
 * collect a nowait activation and so needs a worker - to the pool, which writes it and ends
 * the stream. A client that hangs up is dropped at its next write.
 *
 * Bounded and fair, whatever the log holds and whatever the client reads:
 *  - backpressure: a follow whose client has not taken FOLLOW_QUEUE_MAX bytes already sent is
 *    not read further until the client drains them (http_stream_on_drain wakes the thread),
 *    so an unread follow holds at most about FOLLOW_QUEUE_MAX plus one rendered chunk;
 *  - a budget per round: each follow reads at most ROUND_BUDGET bytes of its log per round,
 *    then the others get theirs (rounds repeat at once while any follow has more to read);
 *  - holes are skipped: only the log's data regions are read (SEEK_DATA/SEEK_HOLE, in the
 *    file system's blocks), so a log made sparse (truncate -s 1T) costs nothing to follow.
 *    A log written by appending has no holes, and its follow sends every byte.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#include "routes/routes.h"
#include "util/buf.h"
#include "util/fd.h"
#include "util/log.h"
#include "util/utf8.h"

#define TICK_MS 250
#define READ_CHUNK 65536
#define FOLLOW_QUEUE_MAX (256 * 1024) /* unsent bytes past which a follow is not read */
#define ROUND_BUDGET (256 * 1024)     /* log bytes read per follow per round */

struct follow {
    struct lb_stream *stream;
    int fd;
    int wd;
    uint64_t off;
    char carry[4];
    size_t carry_len;
    char *rsid;
    char *own;                         /* the activation bound to (NULL: the session's) */
    struct lb_activation_watch *watch; /* NULL: nothing to wait for */
    bool ended;                        /* the harness ended: read the rest, then finish */
    struct follow *next;
};

struct lb_follows {
    struct lb_app *app;
    pthread_mutex_t lock; /* guards pending and stopping */
    struct follow *pending;
    bool stopping;
    struct follow *active; /* the thread's own */
    int ino;
    int wake[2];
    pthread_t thread;
    bool started;
};

static void follow_free(struct follow *f)
{
    if (f->fd >= 0)
        close(f->fd);
    activation_watch_free(f->watch);
    free(f->rsid);
    free(f->own);
    free(f);
}

/* End the stream with an error line and drop the follow. */
static void follow_fail(struct follow *f, const char *code, const char *message)
{
    (void)http_stream_write_json_line(
        f->stream, json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", message));
    http_stream_on_drain(f->stream, NULL, NULL);
    http_stream_end(f->stream);
    http_stream_release(f->stream);
    follow_free(f);
}

/* Send data (with what was held back) as one chunk line; last: hold nothing back. */
static bool send_chunk(struct follow *f, const char *data, size_t len, bool last)
{
    size_t n = f->carry_len + len, keep;
    char *all = malloc(n + 1);
    struct lb_buf clean;
    bool ok = true;

    if (!all)
        return false;
    memcpy(all, f->carry, f->carry_len);
    if (len)
        memcpy(all + f->carry_len, data, len);
    keep = last ? 0 : utf8_incomplete_tail(all, n);
    memcpy(f->carry, all + n - keep, keep);
    f->carry_len = keep;
    n -= keep;
    if (n > 0) {
        lb_buf_init(&clean, 0);
        ok = utf8_sanitize(all, n, &clean) == 0 &&
             http_stream_write_json_line(f->stream,
                                         json_pack("{s:s,s:s%}", "stream", "log", "data",
                                                   clean.data ? clean.data : "", clean.len));
        lb_buf_release(&clean);
    }
    free(all);
    return ok;
}

enum pump_result {
    PUMP_GONE,    /* the client went away */
    PUMP_MORE,    /* the round's budget is spent and the log has more: read again at once */
    PUMP_BLOCKED, /* the client has not taken what was sent: wait for it to drain */
    PUMP_DONE,    /* read to the log's end, as far as it is written now */
};

/* The next data region at or past off: [*start, *end), or false when there is none now. A
 * file system that does not know holes has one data region up to the end. */
static bool next_data(int fd, uint64_t off, uint64_t *start, uint64_t *end)
{
    off_t d = lseek(fd, (off_t)off, SEEK_DATA), h;

    if (d < 0)
        return errno != ENXIO && (*start = off, *end = UINT64_MAX, true);
    h = lseek(fd, d, SEEK_HOLE);
    *start = (uint64_t)d;
    *end = h < 0 ? UINT64_MAX : (uint64_t)h;
    return true;
}

/* Read at most ROUND_BUDGET bytes of the log past f->off, skipping holes; stop early while the
 * client has FOLLOW_QUEUE_MAX bytes unread. */
static enum pump_result pump(struct follow *f)
{
    char buf[READ_CHUNK];
    size_t budget = ROUND_BUDGET;

    while (budget > 0) {
        uint64_t start, end;
        size_t want;
        ssize_t n;

        if (http_stream_queued(f->stream) > FOLLOW_QUEUE_MAX)
            return PUMP_BLOCKED;
        if (!next_data(f->fd, f->off, &start, &end))
            return PUMP_DONE;
        if (start > f->off)
            f->off = start; /* a hole: nothing was written there */
        want = budget < sizeof(buf) ? budget : sizeof(buf);
        if (end > f->off && end - f->off < want)
            want = (size_t)(end - f->off);
        do
            n = pread(f->fd, buf, want, (off_t)f->off);
        while (n < 0 && errno == EINTR);
        if (n <= 0)
            return PUMP_DONE;
        f->off += (uint64_t)n;
        budget -= (size_t)n;
        if (!send_chunk(f, buf, (size_t)n, false))
            return PUMP_GONE;
    }
    return PUMP_MORE;
}

/* The final line, on a worker: the activation object as GET .../activation renders it. */
struct final_job {
    struct lb_app *app;
    struct lb_stream *stream;
    char *rsid;
    char *own; /* activation_get_text's own */
};

static void final_run(void *arg)
{
    struct final_job *j = arg;
    struct lb_error err = {0};
    uint64_t need = 0;
    char *text = NULL;
    size_t len = 0;
    int r = activation_answer_bytes(j->app->acts, j->rsid, false, &need, &err);

    /* the activation object may be large (artifacts): within the answer budget */
    if (r == 0 && http_stream_reserve(j->stream, need > SIZE_MAX ? SIZE_MAX : (size_t)need) < 0)
        r = lb_error_set(&err, -EAGAIN,
                         "too many answer bytes in flight for the activation object: read it "
                         "with GET .../activation");
    if (r == 0)
        r = activation_get_text(j->app->acts, j->rsid, j->own, false, &text, &len, &err);
    if (r < 0) {
        const char *code = "internal";

        lb_error_http_status(r, &code);
        (void)http_stream_write_json_line(
            j->stream, json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", err.message));
    } else if (http_stream_write(j->stream, text, len) == 0) {
        free(text);
        text = NULL;
        (void)http_stream_write(j->stream, "\n", 1);
    }
    free(text);
    http_stream_end(j->stream);
    http_stream_release(j->stream);
    free(j->rsid);
    free(j->own);
    free(j);
}

/* The harness ended and its log is read: send what was held back and hand the final line to
 * a worker. */
static void follow_finish(struct lb_follows *fs, struct follow *f)
{
    struct final_job *j;

    if (f->carry_len && !send_chunk(f, NULL, 0, true)) {
        follow_fail(f, "gone", "the client went away");
        return;
    }
    j = calloc(1, sizeof(*j));
    if (!j || !(j->rsid = strdup(f->rsid)) || (f->own && !(j->own = strdup(f->own)))) {
        if (j)
            free(j->rsid);
        free(j);
        follow_fail(f, "internal", "out of memory");
        return;
    }
    http_stream_on_drain(f->stream, NULL, NULL); /* the final line needs no follower */
    j->app = fs->app;
    j->stream = f->stream;
    if (pool_submit(fs->app->pool, final_run, j) < 0) {
        free(j->rsid);
        free(j->own);
        free(j);
        follow_fail(f, "overloaded", "the worker queue is full: read the activation with GET");
        return;
    }
    f->stream = NULL; /* the job's now */
    follow_free(f);
}

/* http_stream_on_drain: a client took every byte; its follow may read on. */
static void follow_drained(void *arg)
{
    struct lb_follows *fs = arg;

    (void)!write(fs->wake[1], "x", 1);
}

static void *follow_main(void *arg)
{
    struct lb_follows *fs = arg;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    bool more = false; /* a follow spent its round's budget: the next round starts at once */

    for (;;) {
        struct pollfd pf[2] = {{.fd = fs->ino, .events = POLLIN},
                               {.fd = fs->wake[0], .events = POLLIN}};
        struct follow *add, **pp;
        bool stopping;

        (void)poll(pf, 2, more ? 0 : TICK_MS);
        more = false;
        if (pf[0].revents)
            while (read(fs->ino, buf, sizeof(buf)) > 0)
                ;
        if (pf[1].revents)
            while (read(fs->wake[0], buf, sizeof(buf)) > 0)
                ;
        pthread_mutex_lock(&fs->lock);
        add = fs->pending;
        fs->pending = NULL;
        stopping = fs->stopping;
        pthread_mutex_unlock(&fs->lock);
        while (add) {
            struct follow *f = add;

            add = add->next;
            f->next = fs->active;
            fs->active = f;
        }
        if (stopping)
            break;
        for (pp = &fs->active; *pp;) {
            struct follow *f = *pp;
            enum pump_result pr;

            /* asked before reading, so what was written before the end is read */
            if (!f->ended)
                f->ended = !f->watch || activation_watch_changed(f->watch);
            pr = pump(f);
            if (pr == PUMP_GONE) {
                *pp = f->next;
                follow_fail(f, "gone", "the client went away");
            } else if (pr == PUMP_DONE && f->ended) {
                *pp = f->next;
                follow_finish(fs, f);
            } else {
                more |= pr == PUMP_MORE;
                pp = &f->next;
            }
        }
    }
    return NULL;
}

int follows_new(struct lb_app *app, struct lb_follows **out)
{
    struct lb_follows *fs = calloc(1, sizeof(*fs));

    *out = NULL;
    if (!fs)
        return -ENOMEM;
    fs->app = app;
    fs->wake[0] = fs->wake[1] = -1;
    pthread_mutex_init(&fs->lock, NULL);
    fs->ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (fs->ino < 0 || pipe2(fs->wake, O_CLOEXEC | O_NONBLOCK) < 0 ||
        pthread_create(&fs->thread, NULL, follow_main, fs) != 0) {
        int e = errno ? errno : EAGAIN;

        follows_free(fs);
        return -e;
    }
    fs->started = true;
    *out = fs;
    return 0;
}

int follows_add(struct lb_follows *fs, struct lb_stream *s, int fd, const char *rsid,
                const char *own, struct lb_activation_watch *w)
{
    struct follow *f = calloc(1, sizeof(*f));
    char path[64];

    if (!f || !(f->rsid = strdup(rsid)) || (own && !(f->own = strdup(own)))) {
        if (f)
            free(f->rsid);
        free(f);
        close(fd);
        activation_watch_free(w);
        (void)http_stream_write_json_line(
            s, json_pack("{s:{s:s,s:s}}", "error", "code", "internal", "message", "out of memory"));
        http_stream_end(s);
        http_stream_release(s);
        return -ENOMEM;
    }
    f->stream = s;
    http_stream_on_drain(s, follow_drained, fs);
    f->fd = fd;
    f->watch = w;
    /* the log's own inode, whatever mount namespace it lives in */
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    f->wd = inotify_add_watch(fs->ino, path, IN_MODIFY);
    pthread_mutex_lock(&fs->lock);
    if (fs->stopping) {
        pthread_mutex_unlock(&fs->lock);
        follow_fail(f, "draining", "the daemon is shutting down");
        return -ESHUTDOWN;
    }
    f->next = fs->pending;
    fs->pending = f;
    pthread_mutex_unlock(&fs->lock);
    (void)!write(fs->wake[1], "x", 1);
    return 0;
}

void follows_stop(struct lb_follows *fs)
{
    struct follow *f;

    if (!fs)
        return;
    pthread_mutex_lock(&fs->lock);
    fs->stopping = true;
    pthread_mutex_unlock(&fs->lock);
    if (fs->started) {
        (void)!write(fs->wake[1], "x", 1);
        pthread_join(fs->thread, NULL);
        fs->started = false;
    }
    pthread_mutex_lock(&fs->lock);
    while ((f = fs->pending)) {
        fs->pending = f->next;
        f->next = fs->active;
        fs->active = f;
    }
    pthread_mutex_unlock(&fs->lock);
    while ((f = fs->active)) {
        fs->active = f->next;
        follow_fail(f, "draining",
                    "the daemon is shutting down; read the activation with GET once it is back");
    }
}

void follows_free(struct lb_follows *fs)
{
    if (!fs)
        return;
    follows_stop(fs);
    fd_close(&fs->ino);
    fd_close(&fs->wake[0]);
    fd_close(&fs->wake[1]);
    pthread_mutex_destroy(&fs->lock);
    free(fs);
}
