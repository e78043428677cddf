/*
 * park.c - parked requests: waiting without a worker until a wake, a polled condition, a
 * deadline, the client's hang-up or shutdown, and the park and poll threads that end them.
 *
 * Parked requests (http_park): the handler suspends the connection without a job (or a
 * deferred job parks its already suspended request and returns without resuming it) and
 * links the request into the server's parked list. It leaves that list exactly once, under
 * park_lock: woken (any thread, or the poll thread once a polled park's condition holds),
 * past its deadline or with its client gone (the park thread, which sleeps until the nearest
 * deadline and looks for hung-up clients every second), or at shutdown. Leaving resumes the
 * connection; MHD calls us again and the park's answer callback renders the response on the
 * MHD thread (or defers a job). A suspended connection cannot complete, so the request is
 * alive for as long as it is in the list. The handle is reference-counted (http's, the
 * waker's, the poll thread's while it asks), so a late http_wake is harmless, and the server's
 * own memory stays until the last handle goes.
 */
#include "http/http_internal.h"

#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "util/clock.h"
#include "util/log.h"

#define PARK_GONE_CHECK_MS 1000 /* how often parked requests are checked for a gone client */
#define PARK_END_WAIT_MS 5000   /* shutdown waits this long for parked requests' answers */

/* ---------- parking ---------- */

/* Drop a reference; true when that freed the last handle of a stopped server (the caller
 * frees it with http_release once it has unlocked). */
static bool park_put_locked(struct lb_park *p)
{
    struct lb_http *h = p->h;

    if (--p->refs > 0)
        return false;
    if (p->poll_free)
        p->poll_free(p->poll_arg);
    free(p);
    return --h->park_handles == 0 && h->stopped;
}

/* Take p out of the parked list for reason why and resume its connection; false if it had
 * ended already. Under park_lock. */
static bool park_end_locked(struct lb_park *p, enum lb_park_end why)
{
    struct lb_http *h = p->h;

    if (p->ended)
        return false;
    p->ended = true;
    p->why = why;
    if (p->prev)
        p->prev->next = p->next;
    else
        h->parked = p->next;
    if (p->next)
        p->next->prev = p->prev;
    p->prev = p->next = NULL;
    h->park_waiting--;
    MHD_resume_connection(p->req->conn);
    return true;
}

static int park_common(struct lb_request *req, int64_t deadline_ms, const struct lb_park_poll *poll,
                       lb_http_park_fn answer, void *arg, void (*free_arg)(void *),
                       struct lb_park **park_out, struct lb_error *err)
{
    struct lb_http *h = req->http;
    struct lb_park *p = calloc(1, sizeof(*p));

    if (park_out)
        *park_out = NULL;
    if (!p) {
        if (free_arg)
            free_arg(arg);
        if (poll && poll->free_arg)
            poll->free_arg(poll->arg);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    p->h = h;
    p->req = req;
    p->deadline_ms = deadline_ms;
    p->refs = park_out ? 2 : 1;
    if (poll) {
        p->ready = poll->ready;
        p->poll_arg = poll->arg;
        p->poll_free = poll->free_arg;
        p->poll_every_ms = poll->first_ms > 0 ? poll->first_ms : 1;
        p->poll_max_ms = poll->max_ms > p->poll_every_ms ? poll->max_ms : p->poll_every_ms;
        p->next_poll_at = clock_mono_ms() + p->poll_every_ms;
    }
    pthread_mutex_lock(&h->park_lock);
    h->park_handles++;
    if (h->park_stopping) {
        h->park_handles--;
        pthread_mutex_unlock(&h->park_lock);
        if (p->poll_free)
            p->poll_free(p->poll_arg);
        free(p);
        if (free_arg)
            free_arg(arg);
        return lb_error_set(err, -ESHUTDOWN, "the daemon is shutting down");
    }
    req->park = p;
    req->park_answer = answer;
    req->park_arg = arg;
    req->park_free = free_arg;
    req->phase = PHASE_PARKED;
    if (req->job_ctx) {
        /* from a deferred job: the connection is suspended already, and stays so when the
         * job returns */
        req->job_ctx->parked = true;
        req->job_ctx = NULL;
    } else {
        /* suspended before anyone can wake it: a wake may come before the handler returns */
        MHD_suspend_connection(req->conn);
        req->handed_off = true;
    }
    p->next = h->parked;
    if (h->parked)
        h->parked->prev = p;
    h->parked = p;
    h->park_waiting++;
    h->park_live++;
    req->parked = true;
    if (deadline_ms < h->park_next_at)
        pthread_cond_signal(&h->park_cond);
    if (poll)
        pthread_cond_signal(&h->poll_cond);
    if (park_out)
        *park_out = p;
    pthread_mutex_unlock(&h->park_lock);
    return 0;
}

int http_park(struct lb_request *req, int64_t deadline_ms, lb_http_park_fn answer, void *arg,
              void (*free_arg)(void *), struct lb_park **park_out, struct lb_error *err)
{
    return park_common(req, deadline_ms, NULL, answer, arg, free_arg, park_out, err);
}

int http_park_poll(struct lb_request *req, int64_t deadline_ms, const struct lb_park_poll *poll,
                   lb_http_park_fn answer, void *arg, void (*free_arg)(void *),
                   struct lb_error *err)
{
    return park_common(req, deadline_ms, poll, answer, arg, free_arg, NULL, err);
}

/* The poll thread: asks every polled park's ready() when it is due (without park_lock held,
 * with a reference on the handle), ends the ready ones, backs the others off (doubling, up to
 * their max). At most POLL_BATCH per round, so a long list is worked through in turns. */
#define POLL_BATCH 64
void *http_poll_main(void *arg)
{
    struct lb_http *h = arg;

    pthread_mutex_lock(&h->park_lock);
    while (!h->park_thread_stop) {
        struct lb_park *due[POLL_BATCH];
        bool ok[POLL_BATCH];
        int64_t now = clock_mono_ms(), next = now + 1000;
        size_t n = 0;

        for (struct lb_park *p = h->parked; p; p = p->next) {
            if (!p->ready || p->polling)
                continue;
            if (p->next_poll_at <= now && n < POLL_BATCH) {
                p->polling = true;
                p->refs++;
                due[n++] = p;
            } else if (p->next_poll_at < next) {
                next = p->next_poll_at;
            }
        }
        if (n == 0) {
            struct timespec ts = {(time_t)(next / 1000), (long)(next % 1000) * 1000000L};

            pthread_cond_timedwait(&h->poll_cond, &h->park_lock, &ts);
            continue;
        }
        pthread_mutex_unlock(&h->park_lock);
        for (size_t i = 0; i < n; i++)
            ok[i] = due[i]->ready(due[i]->poll_arg);
        pthread_mutex_lock(&h->park_lock);
        now = clock_mono_ms();
        for (size_t i = 0; i < n; i++) {
            struct lb_park *p = due[i];

            p->polling = false;
            if (ok[i]) {
                park_end_locked(p, LB_PARK_WOKEN);
            } else {
                p->poll_every_ms =
                    p->poll_every_ms * 2 > p->poll_max_ms ? p->poll_max_ms : p->poll_every_ms * 2;
                p->next_poll_at = now + p->poll_every_ms;
            }
            (void)park_put_locked(p); /* never the last: http_stop joins us first */
        }
    }
    pthread_mutex_unlock(&h->park_lock);
    return NULL;
}

bool http_wake(struct lb_park *p)
{
    bool ended;

    if (!p)
        return false;
    pthread_mutex_lock(&p->h->park_lock);
    ended = park_end_locked(p, LB_PARK_WOKEN);
    pthread_mutex_unlock(&p->h->park_lock);
    return ended;
}

void http_park_release(struct lb_park *p)
{
    struct lb_http *h;
    bool last;

    if (!p)
        return;
    h = p->h;
    pthread_mutex_lock(&h->park_lock);
    last = park_put_locked(p);
    pthread_mutex_unlock(&h->park_lock);
    if (last)
        http_release(h); /* the server stopped before its last waker let go */
}

size_t http_parked_count(struct lb_http *h)
{
    return atomic_load(&h->park_waiting);
}

/* http's part of a park is over (answered, or the request ended without an answer). */
static void park_done(struct lb_request *req)
{
    struct lb_http *h = req->http;
    struct lb_park *p = req->park;

    req->park = NULL;
    pthread_mutex_lock(&h->park_lock);
    if (!p->ended) /* only if libmicrohttpd ended a suspended request itself */
        park_end_locked(p, LB_PARK_SHUTDOWN);
    (void)park_put_locked(p); /* never the last: http_stop has not finished with h */
    pthread_mutex_unlock(&h->park_lock);
}

/* Request completion of a request that was parked: its answer went out (or the connection
 * is gone), so shutdown need not wait for it any more. */
static void park_completed(struct lb_request *req)
{
    struct lb_http *h = req->http;

    if (!req->parked)
        return;
    req->parked = false;
    pthread_mutex_lock(&h->park_lock);
    if (--h->park_live == 0)
        pthread_cond_broadcast(&h->park_drained);
    pthread_mutex_unlock(&h->park_lock);
}

/* MHD thread, after the park ended and the connection was resumed: render the answer. */
enum MHD_Result http_park_answer(struct lb_request *req)
{
    struct lb_http *h = req->http;
    enum lb_park_end why;

    pthread_mutex_lock(&h->park_lock);
    why = req->park->why;
    pthread_mutex_unlock(&h->park_lock);
    req->phase = PHASE_BODY; /* the answer may defer a job, as a handler would */
    req->handed_off = false;
    req->park_answer(req, req->park_arg, why);
    if (req->park_free)
        req->park_free(req->park_arg);
    req->park_arg = NULL;
    req->park_free = NULL;
    park_done(req);
    if (req->handed_off)
        return MHD_YES; /* suspended again; the job resumes us */
    return http_request_queue(req);
}

/* Request completion with a park still held: never answered (should not happen: a parked
 * connection is suspended, and http_stop ends every park before stopping libmicrohttpd). */
void http_park_forget(struct lb_request *req)
{
    if (req->park) {
        if (req->park_free)
            req->park_free(req->park_arg);
        req->park_arg = NULL;
        park_done(req);
    }
    park_completed(req);
}

void *http_park_main(void *arg)
{
    struct lb_http *h = arg;
    int64_t next_gone_check = 0;

    pthread_mutex_lock(&h->park_lock);
    while (!h->park_thread_stop) {
        int64_t now = clock_mono_ms(), wake_at;
        bool check_gone = now >= next_gone_check;
        struct lb_park *p, *next;
        struct timespec ts;

        if (check_gone)
            next_gone_check = now + PARK_GONE_CHECK_MS;
        wake_at = next_gone_check;
        for (p = h->parked; p; p = next) {
            next = p->next;
            if (p->deadline_ms <= now)
                park_end_locked(p, LB_PARK_DEADLINE);
            else if (check_gone && http_request_client_gone(p->req))
                park_end_locked(p, LB_PARK_GONE);
            else if (p->deadline_ms < wake_at)
                wake_at = p->deadline_ms;
        }
        h->park_next_at = wake_at;
        ts.tv_sec = (time_t)(wake_at / 1000);
        ts.tv_nsec = (long)(wake_at % 1000) * 1000000L;
        pthread_cond_timedwait(&h->park_cond, &h->park_lock, &ts);
    }
    pthread_mutex_unlock(&h->park_lock);
    return NULL;
}

void http_end_parked(struct lb_http *h)
{
    int64_t until = clock_mono_ms() + PARK_END_WAIT_MS;
    struct timespec ts = {(time_t)(until / 1000), (long)(until % 1000) * 1000000L};

    if (!h)
        return;
    pthread_mutex_lock(&h->park_lock);
    h->park_stopping = true;
    while (h->parked)
        park_end_locked(h->parked, LB_PARK_SHUTDOWN);
    while (h->park_live > 0)
        if (pthread_cond_timedwait(&h->park_drained, &h->park_lock, &ts) == ETIMEDOUT) {
            log_warn("%zu parked requests were not answered within %d ms of shutdown", h->park_live,
                     PARK_END_WAIT_MS);
            break;
        }
    pthread_mutex_unlock(&h->park_lock);
}
