/*
 * body.c - request bodies: the in-flight budget of buffered (JSON) bodies, and streamed
 * (raw_body) bodies written chunk by chunk to the sink a handler's job opened.
 */
#include "http/http_internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define SINK_RESERVE_MIN (1024 * 1024)       /* a streamed body reserves at least this ahead */
#define SINK_RESERVE_STEP (16 * 1024 * 1024) /* and at most this */

/* ---------- request-body budget ---------- */

/* Take n bytes of the in-flight budget (max_inflight_bytes; 0: unlimited). */
bool http_inflight_take(struct lb_request *req, size_t n)
{
    struct lb_http *h = req->http;
    size_t cap = h->cfg.max_inflight_bytes, cur = atomic_load(&h->inflight_bytes);

    do {
        if (cap && (n > cap || cur > cap - n))
            return false;
    } while (!atomic_compare_exchange_weak(&h->inflight_bytes, &cur, cur + n));
    req->reserved += n;
    return true;
}

void http_inflight_give_back(struct lb_request *req)
{
    if (req->reserved)
        atomic_fetch_sub(&req->http->inflight_bytes, req->reserved);
    req->reserved = 0;
}

int http_inflight_error(struct lb_request *req, struct lb_error *err)
{
    return lb_error_set(err, -EAGAIN,
                        "too many request-body bytes in flight (limit %zu); retry later",
                        req->http->cfg.max_inflight_bytes);
}

/* Buffer a chunk of a JSON body; past the route's limit or the in-flight budget the request
 * turns into a 413 or 429, answered once the body has ended. */
void http_body_append(struct lb_request *req, const char *data, size_t n)
{
    if (req->too_large || req->overloaded)
        return;
    /* a body announced with Content-Length reserved its size up front */
    if (req->body.len + n > req->reserved &&
        !http_inflight_take(req, req->body.len + n - req->reserved))
        req->overloaded = true;
    else if (lb_buf_append(&req->body, data, n) < 0)
        req->too_large = true;
    if (req->too_large || req->overloaded) {
        lb_buf_release(&req->body);
        http_inflight_give_back(req);
    }
}

/* ---------- streamed bodies ---------- */

void http_body_sink(struct lb_request *req, const struct lb_body_sink *sink)
{
    req->sink = *sink;
    req->sink_open = true;
}

/* The body will not be complete: the sink's owner removes what it made. */
void http_sink_abort(struct lb_request *req)
{
    if (!req->sink_open)
        return;
    req->sink_open = false;
    if (req->sink.abort)
        req->sink.abort(req->sink.arg);
}

/* The bound of a raw (streamed) body. */
size_t http_raw_limit(const struct lb_request *req)
{
    const struct lb_http_config *c = &req->http->cfg;

    return c->archive_route && strcmp(req->route->name, c->archive_route) == 0
               ? c->max_archive_bytes
               : c->max_file_bytes;
}

void http_sink_write(struct lb_request *req, const char *data, size_t n)
{
    size_t limit = http_raw_limit(req);

    if (!req->sink_open)
        return; /* failed earlier: the rest is read and dropped */
    if (n > limit - req->streamed_bytes) {
        lb_error_set(&req->sink_err, -EFBIG, "the body is larger than the limit of %zu bytes",
                     limit);
        http_sink_abort(req);
        return;
    }
    req->streamed_bytes += n;
    if (req->sink.reserve) {
        /* room for the bytes so far, and some more (the provider returns at once when it has
         * them already): 1 MiB at first, then as much as there is, at most 16 MiB more */
        uint64_t step = req->streamed_bytes < SINK_RESERVE_MIN    ? SINK_RESERVE_MIN
                        : req->streamed_bytes > SINK_RESERVE_STEP ? SINK_RESERVE_STEP
                                                                  : req->streamed_bytes;
        uint64_t want = req->streamed_bytes + step;

        if (want > limit)
            want = limit;
        if (want > req->announced_len) /* never past the announced body */
            want = req->announced_len;
        if (want < req->streamed_bytes)
            want = req->streamed_bytes;
        if (req->sink.reserve(req->sink.arg, req->streamed_bytes, want, &req->sink_err) < 0) {
            http_sink_abort(req);
            return;
        }
    }
    while (n > 0) {
        ssize_t w = write(req->sink.fd, data, n);

        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            int e = errno;

            if (req->sink.write_failed)
                req->sink.write_failed(req->sink.arg, e, req->streamed_bytes, &req->sink_err);
            else if (e == ENOSPC || e == EDQUOT || e == EFBIG)
                lb_error_set(&req->sink_err, -EFBIG, "no space left for the upload");
            else
                lb_error_set(&req->sink_err, -EREMOTEIO, "writing the upload failed: %s",
                             strerror(e));
            http_sink_abort(req);
            return;
        }
        data += w;
        n -= (size_t)w;
    }
}

static void http_finish_job(struct lb_request *req, void *arg)
{
    req->sink.finish(req, arg);
}

/* The whole streamed body has arrived: the sink's finish job makes the response. */
int http_sink_finish(struct lb_request *req, struct lb_error *err)
{
    int r;

    if (!req->sink_open)
        return lb_error_set(err, req->sink_err.code ? req->sink_err.code : -EIO, "%s",
                            req->sink_err.message[0] ? req->sink_err.message : "the upload failed");
    req->sink_open = false;
    req->job_is_finish = true;
    r = http_defer(req, http_finish_job, req->sink.arg, NULL, err);
    if (r < 0 && req->sink.abort)
        req->sink.abort(req->sink.arg);
    return r;
}
