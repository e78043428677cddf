/*
 * stream.c - streamed responses: a body a deferred job (or a keeper) writes over time, read by
 * libmicrohttpd through a callback that suspends the connection while there is nothing to send.
 *
 * Streamed responses (http_stream_begin, from a deferred job): the job sets a response whose
 * body comes from a callback reading the stream's buffer, and resumes the connection at once;
 * the job keeps writing. With nothing to send and the body not ended, the callback suspends
 * the connection (returning 0) and the next write or the end resumes it, all under the
 * stream's lock, so a wake-up is never lost. The stream is shared by the job and the response
 * (reference-counted); when the response goes (client gone, request done), writes turn into
 * -EPIPE.
 */
#include "http/http_internal.h"

#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define STREAM_BLOCK_BYTES (64 * 1024)

/* ---------- streamed responses ---------- */

struct lb_stream {
    pthread_mutex_t lock;
    struct MHD_Connection *conn; /* valid while !gone */
    char *data;                  /* bytes not yet read by libmicrohttpd: data[off..len) */
    size_t len, off, cap;
    bool waiting; /* the reader found nothing and suspended the connection */
    bool ended, gone;
    atomic_bool kept;           /* http_stream_keep: the job's return does not end the body */
    int refs;                   /* the job's and the response's (and a keeper's) */
    void (*drained)(void *arg); /* http_stream_on_drain */
    void *drained_arg;
    struct lb_http *h;  /* the answer budget (http_stream_reserve) */
    uint64_t token_key; /* the request's */
    size_t answer_held; /* given back when the response goes */
};

void http_stream_put(struct lb_stream *s)
{
    int left;

    pthread_mutex_lock(&s->lock);
    left = --s->refs;
    pthread_mutex_unlock(&s->lock);
    if (left > 0)
        return;
    pthread_mutex_destroy(&s->lock);
    free(s->data);
    free(s);
}

/* Content reader (MHD thread): the next bytes, the end, or nothing yet (suspend until a write
 * or the end resumes us: returning 0 without suspending would spin the MHD thread). */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct lb_stream *s = cls;
    ssize_t n;

    (void)pos;
    pthread_mutex_lock(&s->lock);
    if (s->len > s->off) {
        size_t k = s->len - s->off < max ? s->len - s->off : max;

        memcpy(buf, s->data + s->off, k);
        s->off += k;
        if (s->off == s->len) {
            s->off = s->len = 0;
            if (s->drained) /* under the lock: a keeper clearing it is then sure of it */
                s->drained(s->drained_arg);
        }
        n = (ssize_t)k;
    } else if (s->ended) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        s->waiting = true;
        MHD_suspend_connection(s->conn);
        n = 0;
    }
    pthread_mutex_unlock(&s->lock);
    return n;
}

/* The response is gone (request done or connection closed). */
static void stream_free(void *cls)
{
    struct lb_stream *s = cls;

    pthread_mutex_lock(&s->lock);
    s->gone = true;
    s->waiting = false;
    free(s->data);
    s->data = NULL;
    s->len = s->off = s->cap = 0;
    http_answer_give(s->h, s->token_key, s->answer_held);
    s->answer_held = 0;
    pthread_mutex_unlock(&s->lock);
    http_stream_put(s);
}

/* Under s->lock: let the reader go on if it waits. */
static void stream_kick_locked(struct lb_stream *s)
{
    if (s->waiting && !s->gone) {
        s->waiting = false;
        MHD_resume_connection(s->conn);
    }
}

struct lb_stream *http_stream_begin(struct lb_request *req, unsigned status,
                                    const char *content_type)
{
    struct http_job_ctx *ctx = req->job_ctx;
    struct lb_stream *s;
    struct MHD_Response *r;

    if (!ctx || ctx->stream)
        return NULL;
    s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    pthread_mutex_init(&s->lock, NULL);
    s->conn = req->conn;
    s->refs = 2;
    s->h = req->http;
    s->token_key = req->token_key;
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK_BYTES, stream_read, s,
                                          stream_free);
    if (!r) {
        pthread_mutex_destroy(&s->lock);
        free(s);
        return NULL;
    }
    if (content_type)
        MHD_add_response_header(r, "Content-Type", content_type);
    http_request_set_response(req, status, r);
    ctx->stream = s;
    req->job_ctx = NULL;
    req->job_arg = NULL;
    /* from here on the request is libmicrohttpd's: it queues the response and reads the body */
    MHD_resume_connection(req->conn);
    return s;
}

int http_stream_write(struct lb_stream *s, const void *data, size_t len)
{
    int r = 0;

    pthread_mutex_lock(&s->lock);
    if (s->gone || s->ended) {
        r = -EPIPE;
    } else if (len > 0) {
        if (s->off > 0 && s->len + len > s->cap) { /* reuse the space already read */
            memmove(s->data, s->data + s->off, s->len - s->off);
            s->len -= s->off;
            s->off = 0;
        }
        if (s->len + len > s->cap) {
            size_t cap = s->cap ? s->cap : 4096;
            char *d;

            while (cap < s->len + len)
                cap *= 2;
            d = realloc(s->data, cap);
            if (!d) {
                r = -ENOMEM;
                goto out;
            }
            s->data = d;
            s->cap = cap;
        }
        memcpy(s->data + s->len, data, len);
        s->len += len;
        stream_kick_locked(s);
    }
out:
    pthread_mutex_unlock(&s->lock);
    return r;
}

bool http_stream_write_json_line(struct lb_stream *s, json_t *line)
{
    char *text = line ? json_dumps(line, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    bool ok =
        text && http_stream_write(s, text, strlen(text)) == 0 && http_stream_write(s, "\n", 1) == 0;

    json_decref(line);
    free(text);
    return ok;
}

int http_stream_reserve(struct lb_stream *s, size_t bytes)
{
    int r = 0;

    pthread_mutex_lock(&s->lock);
    if (s->gone)
        r = -EPIPE;
    else if (bytes < ANSWER_SMALL)
        r = 0;
    else if (!http_answer_take(s->h, s->token_key, bytes))
        r = -EAGAIN;
    else
        s->answer_held += bytes;
    pthread_mutex_unlock(&s->lock);
    return r;
}

size_t http_stream_queued(struct lb_stream *s)
{
    size_t n;

    pthread_mutex_lock(&s->lock);
    n = s->gone ? 0 : s->len - s->off;
    pthread_mutex_unlock(&s->lock);
    return n;
}

void http_stream_on_drain(struct lb_stream *s, void (*fn)(void *arg), void *arg)
{
    pthread_mutex_lock(&s->lock);
    s->drained = fn;
    s->drained_arg = arg;
    pthread_mutex_unlock(&s->lock);
}

bool http_stream_kept(struct lb_stream *s)
{
    return atomic_load(&s->kept);
}

void http_stream_keep(struct lb_stream *s)
{
    pthread_mutex_lock(&s->lock);
    atomic_store(&s->kept, true);
    s->refs++;
    pthread_mutex_unlock(&s->lock);
}

void http_stream_release(struct lb_stream *s)
{
    if (s)
        http_stream_put(s);
}

void http_stream_end(struct lb_stream *s)
{
    pthread_mutex_lock(&s->lock);
    if (!s->ended) {
        s->ended = true;
        stream_kick_locked(s);
    }
    pthread_mutex_unlock(&s->lock);
}
