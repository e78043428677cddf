/*
 * http.c - the libmicrohttpd adapter (see http.h).
 *
 * Life of a request:
 *   1st call (no body yet): make the request context, match the route (404/405), authorize
 *      (401/403), check Content-Length against the route's limit (413) and take it from the
 *      in-flight budget (429).
 *   upload calls: append the body, counting bytes; past the limit the request turns into 413,
 *      past the in-flight budget into 429 (so chunked bodies and bodies longer than announced
 *      are caught too).
 *   last call: run the handler. It sets a response, or defers: the connection is suspended, the
 *      job runs on the pool and sets the response, then resumes the connection; MHD calls us
 *      again and the response is queued.
 * A streamed body (raw_body routes) runs the handler at the 1st call instead: its job opens a
 * sink (suspended meanwhile, so no body byte is read before there is somewhere to put it);
 * upload calls write each chunk to the sink's fd; the last call defers the sink's finish job.
 * A body that does not arrive whole aborts the sink (request completion callback).
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
 *
 * Streamed responses (http_stream_begin, from a deferred job): the job sets a response whose
 * body comes from a callback reading the stream's buffer, and resumes the connection at once;
 * the job keeps writing. With nothing to send and the body not ended, the callback suspends
 * the connection (returning 0) and the next write or the end resumes it, all under the
 * stream's lock, so a wake-up is never lost. The stream is shared by the job and the response
 * (reference-counted); when the response goes (client gone, request done), writes turn into
 * -EPIPE.
 *
 * Timeouts: a connection that has no request under way (before its first, between keep-alive
 * requests) must have sent its request line and headers within header_timeout_s (an absolute
 * deadline, see "header deadline" below; also libmicrohttpd's idle timeout meanwhile); while a
 * request is under way connection_timeout_s of inactivity applies (suspended connections,
 * waiting for a job, never time out).
 */
#include "http/http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"
#include "util/token.h"
#include "util/utf8.h"

#define HTTP_MAX_PARAMS 4
#define PARK_GONE_CHECK_MS 1000 /* how often parked requests are checked for a gone client */
#define PARK_END_WAIT_MS 5000   /* shutdown waits this long for parked requests' answers */
#define STREAM_BLOCK_BYTES (64 * 1024)
/* An announced body at most this far past its limit is read and dropped before the 413 */
#define DRAIN_MAX_BYTES (64ull * 1024 * 1024)
#define HTTP_IP_BUCKETS 1024
#define HTTP_WARN_INTERVAL_MS 10000 /* at most one summary of connection warnings per this */
#define HTTP_MHD_WARN_BURST 3       /* libmicrohttpd lines logged as-is per interval */
/* The front end's own bounds on a request's head, checked before routing so they answer JSON;
 * they sit below libmicrohttpd's per-connection buffer (32 KiB), past which libmicrohttpd
 * answers 414/431 itself. */
#define HTTP_MAX_TARGET_BYTES 16384 /* the request target: path and query, as sent */
#define HTTP_MAX_HEAD_BYTES 24576   /* the request line and every header line */

/* A client address that has connections still sending their request line and headers. */
struct http_ip {
    unsigned char addr[16];
    unsigned char len; /* 4 or 16 */
    size_t waiting;
    struct http_conn *head, *tail; /* its waiting connections, oldest first */
    struct http_ip *next;          /* hash chain */
};

/* One TCP connection (libmicrohttpd's socket context), from accept to close. */
struct http_conn {
    struct lb_http *h;
    int fd;
    unsigned char addr[16];
    unsigned char addr_len;        /* 0: unknown address (not counted per address) */
    bool waiting;                  /* its request line and headers are not all in yet */
    int64_t deadline_ms;           /* ... and must be by then */
    size_t target_len;             /* the current request's target as sent (from the URI log) */
    struct http_ip *ip;            /* while waiting (NULL if unknown or out of memory) */
    struct http_conn *prev, *next; /* h's waiting list */
    struct http_conn *ip_prev, *ip_next; /* ip's waiting list */
};

#define ANSWER_SMALL (64 * 1024) /* answers this small are not charged to the answer budget */

/* Answer bytes one bearer token holds (only tokens holding some are listed). */
struct answer_holder {
    uint64_t key;
    size_t bytes;
    struct answer_holder *next;
};

#define SINK_RESERVE_MIN (1024 * 1024)       /* a streamed body reserves at least this ahead */
#define SINK_RESERVE_STEP (16 * 1024 * 1024) /* and at most this */

struct lb_park {
    struct lb_http *h;
    struct lb_request *req; /* valid while !ended: the connection is suspended */
    int64_t deadline_ms;
    enum lb_park_end why;
    bool ended;
    int refs; /* under h->park_lock: http's (until answered) and the waker's */
    struct lb_park *prev, *next;
    /* polled parks (http_park_poll): the condition, asked on the poll thread */
    bool (*ready)(void *arg);
    void *poll_arg;
    void (*poll_free)(void *arg); /* when the handle is freed */
    int64_t poll_every_ms, poll_max_ms, next_poll_at;
    bool polling; /* ready() is running (the poll thread holds a reference) */
};

struct lb_http {
    struct MHD_Daemon *mhd;
    struct lb_http_config cfg;
    int listen_fd;
    char bound[128];
    int *route_metric; /* metrics index per route */
    atomic_uint_fast64_t next_request;
    atomic_size_t inflight_bytes; /* buffered request-body bytes held right now */
    /* answers rendered in memory (max_answer_bytes) */
    pthread_mutex_t answer_lock;
    size_t answer_total;
    struct answer_holder *holders;
    /* parked requests */
    pthread_mutex_t park_lock;
    pthread_cond_t park_cond;    /* wakes the park thread (monotonic clock) */
    pthread_cond_t park_drained; /* park_live fell to 0 (monotonic clock) */
    pthread_cond_t poll_cond;    /* wakes the poll thread (monotonic clock) */
    pthread_t poll_thread;
    bool poll_thread_started;
    struct lb_park *parked; /* waiting */
    size_t park_waiting;    /* in the list */
    size_t park_live;       /* parked and not answered yet */
    int64_t park_next_at;   /* when the park thread wakes up next */
    size_t park_handles;    /* lb_park objects alive: h is freed after the last one */
    bool stopped;           /* http_stop is done with h */
    bool park_stopping, park_thread_stop;
    bool park_thread_started;
    pthread_t park_thread;
    /* connections still sending a request line and headers (see "Header deadline") */
    pthread_mutex_t conn_lock;
    pthread_cond_t conn_cond; /* wakes the watch thread (monotonic clock) */
    pthread_t conn_thread;
    bool conn_thread_started, conn_thread_stop;
    struct http_conn *waiting_head, *waiting_tail; /* oldest first: deadline order */
    struct http_ip *ips[HTTP_IP_BUCKETS];          /* addresses with waiting connections */
    /* rate-limited warnings: counted under conn_lock, logged once per HTTP_WARN_INTERVAL_MS */
    int64_t warn_since;
    uint64_t cut_deadline, cut_cap, mhd_logged, mhd_suppressed;
    size_t waiting_max; /* the most waiting connections one address has had at once */
    char mhd_last[256];
};

enum request_phase {
    PHASE_NEW,
    PHASE_BODY,     /* a JSON body is arriving (buffered) */
    PHASE_OPENING,  /* streamed body: the handler's job is opening its sink; suspended */
    PHASE_STREAM,   /* streamed body: chunks go to the sink as they arrive */
    PHASE_DEFERRED, /* the whole body is here; a job is making the response; suspended */
    PHASE_PARKED,   /* the whole body is here; waiting for a wake or deadline; suspended */
    PHASE_DONE,
};

struct lb_request {
    struct lb_http *http;
    struct MHD_Connection *conn;
    const struct lb_route *route;
    int route_index;
    enum request_phase phase;
    char request_id[64];
    char allow[64]; /* methods of the matched path, for 405 */
    char *params[HTTP_MAX_PARAMS];
    const char *method;
    enum lb_principal principal;
    struct lb_buf body;
    bool too_large;
    bool overloaded;          /* the in-flight byte budget ran out while the body arrived */
    size_t reserved;          /* bytes of the in-flight budget this request holds */
    uint64_t token_key;       /* a hash of the bearer token (0: none) */
    size_t answer_held;       /* bytes of the answer budget this request holds */
    bool retry_after;         /* a 429 from the answer budget: say when to retry */
    struct lb_body_sink sink; /* streamed body (while sink_open) */
    bool sink_open;
    uint64_t streamed_bytes;
    uint64_t announced_len;   /* the body's Content-Length; UINT64_MAX: none (chunked) */
    struct lb_error sink_err; /* why a streamed body failed (code 0: it did not) */
    int64_t start_ms;
    struct MHD_Response *response;
    unsigned status;
    /* deferred job */
    lb_http_job_fn job;
    void *job_arg;
    void (*job_free)(void *);
    struct http_job_ctx *job_ctx; /* while the job runs and has not streamed */
    struct lb_park *park;         /* parked (http's reference) */
    bool parked;                  /* counted in park_live until the request completes */
    /* Set on the MHD thread when the handler (or a park's answer) deferred or parked: the
     * connection is suspended and someone else answers. Read there instead of phase, which a
     * job that parks may be writing at that moment. */
    bool handed_off;
    lb_http_park_fn park_answer;
    void *park_arg;
    void (*park_free)(void *);
    size_t target_len;      /* the request target as sent (path and query); 0: unknown */
    char serial_key[192];   /* "": none; see http_set_serial_key / http_set_fair_key */
    size_t key_active_max;  /* jobs of serial_key queued or running at once */
    size_t key_waiting_max; /* more that may wait behind them */
};

/* Jobs of one serial key (one resources session) that may wait behind its running one. */
#define HTTP_SERIAL_BACKLOG_MAX 64

/* ---------- the answer budget ---------- */

static uint64_t token_hash(const char *token)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */

    for (; *token; token++)
        h = (h ^ (unsigned char)*token) * 1099511628211ULL;
    return h ? h : 1;
}

/* Charge n more bytes to key: within the total, and within a quarter of it unless key holds
 * nothing yet (so any one answer that fits the total can be sent). */
static bool answer_take(struct lb_http *h, uint64_t key, size_t n)
{
    size_t cap = h->cfg.max_answer_bytes;
    struct answer_holder *a;
    bool ok;

    if (n == 0)
        return true;
    pthread_mutex_lock(&h->answer_lock);
    for (a = h->holders; a && a->key != key; a = a->next)
        ;
    ok = !cap || (n <= cap && h->answer_total <= cap - n &&
                  (!a || (a->bytes <= cap / 4 && n <= cap / 4 - a->bytes)));
    if (ok && !a) {
        a = calloc(1, sizeof(*a));
        if (a) {
            a->key = key;
            a->next = h->holders;
            h->holders = a;
        }
        ok = a != NULL;
    }
    if (ok) {
        a->bytes += n;
        h->answer_total += n;
    }
    pthread_mutex_unlock(&h->answer_lock);
    return ok;
}

static void answer_give(struct lb_http *h, uint64_t key, size_t n)
{
    struct answer_holder **pp, *a;

    if (n == 0)
        return;
    pthread_mutex_lock(&h->answer_lock);
    h->answer_total -= n < h->answer_total ? n : h->answer_total;
    for (pp = &h->holders; (a = *pp) && a->key != key; pp = &a->next)
        ;
    if (a) {
        a->bytes -= n < a->bytes ? n : a->bytes;
        if (a->bytes == 0) {
            *pp = a->next;
            free(a);
        }
    }
    pthread_mutex_unlock(&h->answer_lock);
}

static int answer_error(struct lb_request *req, size_t bytes, struct lb_error *err)
{
    req->retry_after = true;
    return lb_error_set(err, -EAGAIN,
                        "too many answer bytes in flight (an answer of up to %zu bytes; limit %zu "
                        "in all, a quarter of it per token): read the answers already asked "
                        "for, or retry later",
                        bytes, req->http->cfg.max_answer_bytes);
}

int http_answer_reserve(struct lb_request *req, size_t bytes, struct lb_error *err)
{
    if (bytes < ANSWER_SMALL || bytes <= req->answer_held)
        return 0;
    if (!answer_take(req->http, req->token_key, bytes - req->answer_held))
        return answer_error(req, bytes, err);
    req->answer_held = bytes;
    return 0;
}

size_t http_answer_bytes(struct lb_http *h)
{
    size_t n;

    pthread_mutex_lock(&h->answer_lock);
    n = h->answer_total;
    pthread_mutex_unlock(&h->answer_lock);
    return n;
}

/* Charge the request exactly what its answer of len bytes holds (nothing below ANSWER_SMALL);
 * false when it does not fit. */
static bool answer_settle(struct lb_request *req, size_t len)
{
    size_t want = len >= ANSWER_SMALL ? len : 0;

    if (want > req->answer_held) {
        if (!answer_take(req->http, req->token_key, want - req->answer_held))
            return false;
    } else {
        answer_give(req->http, req->token_key, req->answer_held - want);
    }
    req->answer_held = want;
    return true;
}

/* ---------- responses ---------- */

static void request_set_response(struct lb_request *req, unsigned status, struct MHD_Response *r)
{
    if (req->response)
        MHD_destroy_response(req->response);
    req->response = r;
    req->status = status;
    if (r) {
        MHD_add_response_header(r, "X-Request-Id", req->request_id);
        MHD_add_response_header(r, "Cache-Control", "no-store");
        if (status == 429 && req->retry_after)
            MHD_add_response_header(r, "Retry-After", "1");
    }
}

void http_respond_text(struct lb_request *req, unsigned status, const char *content_type,
                       char *data, size_t len)
{
    struct MHD_Response *r;

    if (!answer_settle(req, data ? len : 0)) {
        struct lb_error e;

        free(data);
        answer_error(req, len, &e);
        http_respond_error(req, &e);
        return;
    }
    r = MHD_create_response_from_buffer(len, data ? data : (char *)"",
                                        data ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);

    if (r && content_type)
        MHD_add_response_header(r, "Content-Type", content_type);
    request_set_response(req, status, r);
}

void http_respond_json(struct lb_request *req, unsigned status, json_t *body)
{
    char *text = json_dumps(body, JSON_COMPACT | JSON_ENSURE_ASCII);

    json_decref(body);
    if (!text) {
        static char fallback[] =
            "{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\"}}";

        request_set_response(
            req, 500,
            MHD_create_response_from_buffer(strlen(fallback), fallback, MHD_RESPMEM_PERSISTENT));
        return;
    }
    size_t n = strlen(text);

    text[n] = '\0';
    http_respond_text(req, status, "application/json", text, n);
}

json_t *http_error_json(const char *code, const char *message)
{
    struct lb_buf clean;
    json_t *body;

    /* jansson refuses strings that are not UTF-8 (json_pack fails): a message that quotes
     * bytes a client or a sandbox sent gets U+FFFD for each invalid one instead */
    if (utf8_valid(message, strlen(message)))
        return json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", message);
    lb_buf_init(&clean, 0);
    if (utf8_sanitize(message, strlen(message), &clean) < 0 || lb_buf_append(&clean, "", 1) < 0) {
        lb_buf_release(&clean);
        return json_pack("{s:{s:s,s:s}}", "error", "code", code, "message",
                         "(the message held bytes that are not UTF-8)");
    }
    body = json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", clean.data);
    lb_buf_release(&clean);
    return body;
}

void http_respond_error(struct lb_request *req, const struct lb_error *err)
{
    const char *code = "internal";
    int status = lb_error_http_status(err->code ? err->code : -EIO, &code);
    const char *msg = err->message[0] ? err->message : "internal error";
    json_t *body = http_error_json(code, msg);

    if (status >= 500)
        log_error_req(req->request_id, "request %s %s: %d %s: %s", req->request_id,
                      req->route ? req->route->name : "-", status, code, msg);
    else
        log_debug_req(req->request_id, "request %s: %d %s: %s", req->request_id, status, code, msg);
    if (status == 429)
        metrics_add(LB_M_HTTP_OVERLOADED, 1);
    http_respond_json(req, (unsigned)status, body);
    if (status == 401)
        http_response_header(req, "WWW-Authenticate", "Bearer");
}

void http_respond_empty(struct lb_request *req, unsigned status)
{
    request_set_response(req, status,
                         MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT));
}

/* A file served from offset; the response owns fd. */
struct fd_source {
    int fd;
    uint64_t offset;
};

/* Read callback of http_respond_fd: a file that turns out shorter than announced (truncated
 * meanwhile) ends the response with an error, so the client sees a cut connection instead of
 * waiting for bytes that never come. */
static ssize_t http_fd_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct fd_source *src = cls;
    ssize_t n;

    do
        n = pread(src->fd, buf, max, (off_t)(src->offset + pos));
    while (n < 0 && errno == EINTR);
    return n > 0 ? n : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void http_fd_free(void *cls)
{
    struct fd_source *src = cls;

    close(src->fd);
    free(src);
}

void http_respond_fd_range(struct lb_request *req, unsigned status, int fd, uint64_t offset,
                           uint64_t len)
{
    struct fd_source *src = len ? malloc(sizeof(*src)) : NULL;
    struct MHD_Response *r = NULL;

    if (len == 0) {
        close(fd);
        r = MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
    } else if (src) {
        src->fd = fd;
        src->offset = offset;
        r = MHD_create_response_from_callback(len, 256 * 1024, http_fd_reader, src, http_fd_free);
        if (!r)
            free(src);
    }
    if (!r) {
        if (len != 0)
            close(fd);
        struct lb_error e;
        lb_error_set(&e, -ENOMEM, "cannot create response");
        http_respond_error(req, &e);
        return;
    }
    MHD_add_response_header(r, "Content-Type", "application/octet-stream");
    request_set_response(req, status, r);
}

void http_respond_fd(struct lb_request *req, unsigned status, int fd, uint64_t size)
{
    http_respond_fd_range(req, status, fd, 0, size);
}

void http_response_header(struct lb_request *req, const char *name, const char *value)
{
    if (req->response)
        MHD_add_response_header(req->response, name, value);
}

/* ---------- accessors ---------- */

void *http_app(struct lb_request *req)
{
    return req->http->cfg.app;
}

struct lb_http *http_server(struct lb_request *req)
{
    return req->http;
}

const char *http_param(struct lb_request *req, unsigned i)
{
    return i < HTTP_MAX_PARAMS ? req->params[i] : NULL;
}

const char *http_query(struct lb_request *req, const char *key)
{
    const char *value = NULL;
    size_t len = 0;

    if (MHD_lookup_connection_value_n(req->conn, MHD_GET_ARGUMENT_KIND, key, strlen(key), &value,
                                      &len) != MHD_YES ||
        !value)
        return NULL;
    /* "%00" decodes to a NUL that would silently cut the value short (a path!): give the
     * caller an empty value, which every query parameter rejects */
    return strlen(value) == len ? value : "";
}

const char *http_header(struct lb_request *req, const char *name)
{
    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

enum lb_principal http_principal(struct lb_request *req)
{
    return req->principal;
}

const struct lb_buf *http_body(struct lb_request *req)
{
    return &req->body;
}

static int json_depth(const json_t *j, int limit)
{
    int deepest = 0;

    if (limit <= 0)
        return 1;
    if (json_is_object(j)) {
        const char *k;
        json_t *v;

        json_object_foreach((json_t *)j, k, v) {
            int d = json_depth(v, limit - 1);
            if (d > deepest)
                deepest = d;
        }
    } else if (json_is_array(j)) {
        size_t i;
        json_t *v;

        json_array_foreach(j, i, v) {
            int d = json_depth(v, limit - 1);
            if (d > deepest)
                deepest = d;
        }
    } else {
        return 0;
    }
    return deepest + 1;
}

int http_body_json(struct lb_request *req, bool allow_empty, json_t **out, struct lb_error *err)
{
    json_error_t jerr;
    json_t *j;
    int limit = req->http->cfg.max_json_depth;

    if (req->body.len == 0) {
        if (!allow_empty)
            return lb_error_set(err, -EINVAL, "a JSON object body is required");
        *out = json_object();
        return *out ? 0 : -ENOMEM;
    }
    j = json_loadb(req->body.data, req->body.len, JSON_REJECT_DUPLICATES, &jerr);
    if (!j)
        return lb_error_set(err, -EINVAL, "malformed JSON at line %d column %d: %s", jerr.line,
                            jerr.column, jerr.text);
    if (!json_is_object(j)) {
        json_decref(j);
        return lb_error_set(err, -EINVAL, "the body must be a JSON object");
    }
    if (json_depth(j, limit + 1) > limit) {
        json_decref(j);
        return lb_error_set(err, -EINVAL, "JSON nested deeper than %d levels", limit);
    }
    *out = j;
    return 0;
}

/* ---------- routing ---------- */

/* Match path against pattern, collecting '*' segments into params (malloc'd). 1 on match. */
static int route_match(const char *pattern, const char *path, char **params)
{
    const char *p = pattern, *s = path;
    unsigned n = 0;

    while (*p && *s) {
        if (*p == '*') {
            const char *end = strchr(s, '/');
            size_t len = end ? (size_t)(end - s) : strlen(s);

            if (len == 0 || n >= HTTP_MAX_PARAMS)
                goto nomatch;
            params[n] = strndup(s, len);
            if (!params[n])
                goto nomatch;
            n++;
            s += len;
            p++;
        } else if (*p == *s) {
            p++, s++;
        } else {
            goto nomatch;
        }
    }
    if (*p == '\0' && *s == '\0')
        return 1;
nomatch:
    for (unsigned i = 0; i < n; i++) {
        free(params[i]);
        params[i] = NULL;
    }
    return 0;
}

static int request_route(struct lb_request *req, const char *url, struct lb_error *err)
{
    const struct lb_route *routes = req->http->cfg.routes;
    bool path_known = false;
    char *allow = req->allow;
    size_t allow_len = sizeof(req->allow);

    for (int i = 0; routes[i].method; i++) {
        char *params[HTTP_MAX_PARAMS] = {0};

        if (!route_match(routes[i].pattern, url, params))
            continue;
        /* HEAD is GET without the body (libmicrohttpd leaves the body out) */
        if (!strcmp(routes[i].method, req->method) ||
            (!strcmp(req->method, "HEAD") && !strcmp(routes[i].method, "GET"))) {
            for (unsigned k = 0; k < HTTP_MAX_PARAMS; k++) {
                free(req->params[k]);
                req->params[k] = params[k];
            }
            req->route = &routes[i];
            req->route_index = i;
            return 0;
        }
        for (unsigned k = 0; k < HTTP_MAX_PARAMS; k++)
            free(params[k]);
        if (strlen(allow) + strlen(routes[i].method) + 3 < allow_len) {
            if (path_known)
                strcat(allow, ", ");
            strcat(allow, routes[i].method);
        }
        path_known = true;
    }
    if (path_known)
        return lb_error_set(err, -EPROTONOSUPPORT, "%s is not allowed on %s (allowed: %s)",
                            req->method, url, allow);
    return lb_error_set(err, -ENOENT, "no route %s %s", req->method, url);
}

/* ---------- MHD callbacks ---------- */

static enum MHD_Result request_queue(struct lb_request *req)
{
    enum MHD_Result r;

    if (!req->response) {
        struct lb_error e;

        lb_error_set(&e, -EIO, "the handler set no response");
        http_respond_error(req, &e);
    }
    r = MHD_queue_response(req->conn, req->status, req->response);
    req->phase = PHASE_DONE;
    return r;
}

/* Error before the handler ran; 405 has no errno of its own in util/error.h. */
static enum MHD_Result request_fail(struct lb_request *req, const struct lb_error *err)
{
    if (err->code == -EPROTONOSUPPORT) {
        json_t *body = http_error_json("method_not_allowed", err->message);

        http_respond_json(req, 405, body);
        http_response_header(req, "Allow", req->allow);
    } else {
        http_respond_error(req, err);
    }
    return request_queue(req);
}

/* An error of the front end's own whose status has no errno in util/error.h (414, 431). */
static enum MHD_Result request_fail_status(struct lb_request *req, unsigned status,
                                           const char *code, const char *message)
{
    log_debug_req(req->request_id, "request %s: %u %s: %s", req->request_id, status, code, message);
    http_respond_json(req, status, http_error_json(code, message));
    return request_queue(req);
}

/* The request's head against the front end's bounds (HTTP_MAX_TARGET_BYTES and
 * HTTP_MAX_HEAD_BYTES); answers and returns true when it is past one. */
static bool request_head_too_large(struct lb_request *req, enum MHD_Result *ret)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    char msg[160];

    if (req->target_len > HTTP_MAX_TARGET_BYTES) {
        snprintf(msg, sizeof(msg),
                 "the request target (path and query) is %zu bytes; the limit is %d",
                 req->target_len, HTTP_MAX_TARGET_BYTES);
        *ret = request_fail_status(req, 414, "uri_too_long", msg);
        return true;
    }
    if (ci && ci->header_size > HTTP_MAX_HEAD_BYTES) {
        snprintf(msg, sizeof(msg), "the request line and headers are %zu bytes; the limit is %d",
                 ci->header_size, HTTP_MAX_HEAD_BYTES);
        *ret = request_fail_status(req, 431, "headers_too_large", msg);
        return true;
    }
    return false;
}

static void request_set_id(struct lb_request *req)
{
    const char *given = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "X-Request-Id");
    size_t n = given ? strlen(given) : 0;
    bool ok = n > 0 && n < sizeof(req->request_id);

    for (size_t i = 0; ok && i < n; i++)
        ok = given[i] > 32 && given[i] < 127;
    if (ok) {
        memcpy(req->request_id, given, n + 1);
        return;
    }
    if (token_random_hex(8, req->request_id) < 0)
        snprintf(req->request_id, sizeof(req->request_id), "r%llu",
                 (unsigned long long)atomic_fetch_add(&req->http->next_request, 1));
}

static int request_authorize(struct lb_request *req, struct lb_error *err)
{
    const char *auth = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Authorization");
    const char *token = NULL;

    if (req->route->auth == LB_AUTH_NONE)
        return 0;
    if (auth && strncasecmp(auth, "Bearer ", 7) == 0) {
        token = auth + 7;
        while (*token == ' ')
            token++;
    }
    if (!token || !*token)
        return lb_error_set(err, -ENOKEY, "a bearer token is required (Authorization: Bearer ...)");
    req->token_key = token_hash(token);
    return req->http->cfg.authorize(req->http->cfg.app, token, req->route->auth,
                                    req->route->auth == LB_AUTH_SANDBOX ||
                                            req->route->auth == LB_AUTH_SESSION ||
                                            req->route->auth == LB_AUTH_PTY
                                        ? req->params[0]
                                        : NULL,
                                    &req->principal, err);
}

/* ---------- request-body budget ---------- */

/* Take n bytes of the in-flight budget (max_inflight_bytes; 0: unlimited). */
static bool inflight_take(struct lb_request *req, size_t n)
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

static void inflight_give_back(struct lb_request *req)
{
    if (req->reserved)
        atomic_fetch_sub(&req->http->inflight_bytes, req->reserved);
    req->reserved = 0;
}

static int inflight_error(struct lb_request *req, struct lb_error *err)
{
    return lb_error_set(err, -EAGAIN,
                        "too many request-body bytes in flight (limit %zu); retry later",
                        req->http->cfg.max_inflight_bytes);
}

/* Buffer a chunk of a JSON body; past the route's limit or the in-flight budget the request
 * turns into a 413 or 429, answered once the body has ended. */
static void body_append(struct lb_request *req, const char *data, size_t n)
{
    if (req->too_large || req->overloaded)
        return;
    /* a body announced with Content-Length reserved its size up front */
    if (req->body.len + n > req->reserved && !inflight_take(req, req->body.len + n - req->reserved))
        req->overloaded = true;
    else if (lb_buf_append(&req->body, data, n) < 0)
        req->too_large = true;
    if (req->too_large || req->overloaded) {
        lb_buf_release(&req->body);
        inflight_give_back(req);
    }
}

/* ---------- streamed bodies ---------- */

void http_body_sink(struct lb_request *req, const struct lb_body_sink *sink)
{
    req->sink = *sink;
    req->sink_open = true;
}

/* The body will not be complete: the sink's owner removes what it made. */
static void sink_abort(struct lb_request *req)
{
    if (!req->sink_open)
        return;
    req->sink_open = false;
    if (req->sink.abort)
        req->sink.abort(req->sink.arg);
}

/* The bound of a raw (streamed) body. */
static size_t raw_limit(const struct lb_request *req)
{
    const struct lb_http_config *c = &req->http->cfg;

    return c->archive_route && strcmp(req->route->name, c->archive_route) == 0
               ? c->max_archive_bytes
               : c->max_file_bytes;
}

static void sink_write(struct lb_request *req, const char *data, size_t n)
{
    size_t limit = raw_limit(req);

    if (!req->sink_open)
        return; /* failed earlier: the rest is read and dropped */
    if (n > limit - req->streamed_bytes) {
        lb_error_set(&req->sink_err, -EFBIG, "the body is larger than the limit of %zu bytes",
                     limit);
        sink_abort(req);
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
            sink_abort(req);
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
            sink_abort(req);
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
static int sink_finish(struct lb_request *req, struct lb_error *err)
{
    int r;

    if (!req->sink_open)
        return lb_error_set(err, req->sink_err.code ? req->sink_err.code : -EIO, "%s",
                            req->sink_err.message[0] ? req->sink_err.message : "the upload failed");
    req->sink_open = false;
    r = http_defer(req, http_finish_job, req->sink.arg, NULL, err);
    if (r < 0 && req->sink.abort)
        req->sink.abort(req->sink.arg);
    return r;
}

/* ---------- the access handler ---------- */

static enum MHD_Result park_answer(struct lb_request *req);
static void park_forget(struct lb_request *req);
static struct http_conn *conn_of(struct MHD_Connection *conn);
static void conn_wait_begin_locked(struct http_conn *c);
static void conn_wait_end_locked(struct http_conn *c);

/* The first query argument (key or value) that is not valid UTF-8. */
struct utf8_scan {
    const char *bad_key; /* its key when the key is valid; NULL: the key itself is invalid */
    bool found;
};

static enum MHD_Result query_arg_utf8(void *cls, enum MHD_ValueKind kind, const char *key,
                                      size_t key_size, const char *value, size_t value_size)
{
    struct utf8_scan *scan = cls;

    (void)kind;
    if (!utf8_valid(key, key_size)) {
        scan->found = true;
        scan->bad_key = NULL;
        return MHD_NO;
    }
    if (value && !utf8_valid(value, value_size)) {
        scan->found = true;
        scan->bad_key = key;
        return MHD_NO;
    }
    return MHD_YES;
}

/* Paths, ids and names from the URL end up in messages, records and JSON answers, which hold
 * only UTF-8: a URL path or query argument (after %-decoding) that is not UTF-8 is refused up
 * front, whatever the route. */
static int request_check_utf8(struct lb_request *req, const char *url, struct lb_error *err)
{
    struct utf8_scan scan = {0};

    if (!utf8_valid(url, strlen(url)))
        return lb_error_set(err, -EINVAL, "the URL path is not valid UTF-8");
    MHD_get_connection_values_n(req->conn, MHD_GET_ARGUMENT_KIND, query_arg_utf8, &scan);
    if (scan.found && scan.bad_key)
        return lb_error_set(err, -EINVAL, "the query parameter '%s' is not valid UTF-8",
                            scan.bad_key);
    if (scan.found)
        return lb_error_set(err, -EINVAL, "a query parameter name is not valid UTF-8");
    return 0;
}

/* First call: the headers are complete. */
static enum MHD_Result request_begin(struct lb_http *h, struct lb_request *req, const char *url,
                                     struct lb_error *err)
{
    const char *clen;
    size_t limit;
    enum MHD_Result ret;

    /* a request is under way: the longer timeout applies until it completes */
    MHD_set_connection_option(req->conn, MHD_CONNECTION_OPTION_TIMEOUT,
                              (unsigned)h->cfg.connection_timeout_s);
    if (request_head_too_large(req, &ret))
        return ret;
    if (request_check_utf8(req, url, err) < 0 || request_route(req, url, err) < 0)
        return request_fail(req, err);
    if (request_authorize(req, err) < 0)
        return request_fail(req, err);
    limit = req->route->raw_body ? raw_limit(req) : h->cfg.max_body_bytes;
    lb_buf_init(&req->body, limit);
    clen = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Content-Length");
    if (clen) {
        char *end;
        unsigned long long n = strtoull(clen, &end, 10);

        if (*end == '\0')
            req->announced_len = n;
        if (*end == '\0' && n > limit && n - limit > DRAIN_MAX_BYTES) {
            lb_error_set(err, -EFBIG, "the body is %llu bytes; the limit is %zu", n, limit);
            return request_fail(req, err);
        }
        if (*end == '\0' && n > limit) {
            /* A body a little past the limit is read and dropped, and the 413 goes out once
             * it has ended, as for a chunked one: answered at once, the unread body makes the
             * kernel reset the connection when it closes, and the client may see that reset
             * before the answer. Far past it, the answer goes out at once. */
            req->too_large = true;
            req->phase = PHASE_BODY;
            return MHD_YES;
        }
        if (*end == '\0' && !req->route->raw_body && !inflight_take(req, (size_t)n)) {
            inflight_error(req, err);
            return request_fail(req, err);
        }
    }
    if (!req->route->raw_body) {
        req->phase = PHASE_BODY;
        return MHD_YES;
    }
    /* A streamed body: the handler runs now, before any of the body is read, and its job
     * opens the sink (or answers with an error, and the body is never read). */
    req->phase = PHASE_OPENING;
    if (req->route->handle(req, err) < 0) {
        if (err->code == 0)
            lb_error_set(err, -EIO, "handler failed");
        req->phase = PHASE_BODY;
        return request_fail(req, err);
    }
    if (req->phase == PHASE_DEFERRED)
        req->phase = PHASE_OPENING; /* suspended until the job has opened the sink */
    return MHD_YES;
}

static enum MHD_Result http_access(void *cls, struct MHD_Connection *conn, const char *url,
                                   const char *method, const char *version, const char *upload_data,
                                   size_t *upload_data_size, void **con_cls)
{
    struct lb_http *h = cls;
    struct lb_request *req = *con_cls;
    struct lb_error err = {0};

    if (!req) {
        req = calloc(1, sizeof(*req));
        if (!req)
            return MHD_NO;
        *con_cls = req;
        req->http = h;
        req->conn = conn;
        req->method = method;
        req->route_index = -1;
        req->start_ms = clock_mono_ms();
        req->sink.fd = -1;
        req->announced_len = UINT64_MAX;
        request_set_id(req);
        {
            struct http_conn *c = conn_of(conn);

            if (c) {
                /* the request line and headers are in: no header deadline any more */
                pthread_mutex_lock(&h->conn_lock);
                conn_wait_end_locked(c);
                pthread_mutex_unlock(&h->conn_lock);
                req->target_len = c->target_len;
            }
        }
        return request_begin(h, req, url, &err);
    }

    switch (req->phase) {
    case PHASE_DONE:
        /* A response is queued but MHD still hands us the rest of the body: drop it. */
        *upload_data_size = 0;
        return MHD_YES;
    case PHASE_OPENING:
        /* Resumed: the job opened the sink, or set an error response (body left unread).
         * libmicrohttpd repeats its headers call after a resume in that state (no body bytes
         * yet): the body, and its end, come in the calls after this one. */
        if (!req->sink_open)
            return request_queue(req);
        req->phase = PHASE_STREAM;
        return MHD_YES;
    case PHASE_DEFERRED:
        if (*upload_data_size == 0)
            return request_queue(req); /* resumed: the job has set the response */
        *upload_data_size = 0;
        return MHD_YES;
    case PHASE_PARKED:
        if (*upload_data_size == 0)
            return park_answer(req); /* resumed: woken, deadline, client gone or shutdown */
        *upload_data_size = 0;
        return MHD_YES;
    default:
        break;
    }
    if (*upload_data_size > 0) {
        if (req->phase == PHASE_STREAM)
            sink_write(req, upload_data, *upload_data_size);
        else
            body_append(req, upload_data, *upload_data_size);
        /* Past a limit the rest is read and dropped: libmicrohttpd cannot queue a response
         * while a body is still arriving (a chunked one has no Content-Length to refuse it up
         * front), so the error goes out once the body has ended. */
        *upload_data_size = 0;
        return MHD_YES;
    }

    /* The whole body is here. */
    if (req->phase == PHASE_STREAM) {
        if (sink_finish(req, &err) < 0)
            return request_fail(req, &err);
        return MHD_YES; /* suspended; the finish job resumes us */
    }
    if (req->too_large && req->announced_len != UINT64_MAX) {
        lb_error_set(&err, -EFBIG, "the body is %llu bytes; the limit is %zu",
                     (unsigned long long)req->announced_len, req->body.max);
        return request_fail(req, &err);
    }
    if (req->too_large) {
        lb_error_set(&err, -EFBIG, "the body is larger than the limit of %zu bytes", req->body.max);
        return request_fail(req, &err);
    }
    if (req->overloaded) {
        inflight_error(req, &err);
        return request_fail(req, &err);
    }
    req->handed_off = false;
    if (req->route->handle(req, &err) < 0) {
        if (err.code == 0)
            lb_error_set(&err, -EIO, "handler failed");
        http_respond_error(req, &err);
    }
    if (req->handed_off)
        return MHD_YES; /* suspended; the job, or the park's end, resumes us */
    return request_queue(req);
}

static void http_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                           enum MHD_RequestTerminationCode toe)
{
    struct lb_http *h = cls;
    struct lb_request *req = *con_cls;

    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        struct http_conn *c = conn_of(conn);

        /* the connection stays open for the next request: the short timeout again, and the
         * next request's line and headers are due header_timeout_s from now */
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT,
                                  (unsigned)h->cfg.header_timeout_s);
        if (c) {
            pthread_mutex_lock(&h->conn_lock);
            conn_wait_begin_locked(c);
            pthread_mutex_unlock(&h->conn_lock);
        }
    }
    if (!req)
        return;
    sink_abort(req); /* the body never ended: client gone, or the daemon stops */
    park_forget(req);
    metrics_add(LB_M_HTTP_REQUESTS, 1);
    if (req->status >= 500)
        metrics_add(LB_M_HTTP_ERRORS_5XX, 1);
    else if (req->status >= 400)
        metrics_add(LB_M_HTTP_ERRORS_4XX, 1);
    if (req->route && req->http->route_metric)
        metrics_observe_request(req->http->route_metric[req->route_index],
                                clock_mono_ms() - req->start_ms);
    else
        metrics_observe_request(-1, clock_mono_ms() - req->start_ms);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        log_debug("request %s ended early (%d)", req->request_id, (int)toe);
    if (req->response)
        MHD_destroy_response(req->response);
    for (unsigned i = 0; i < HTTP_MAX_PARAMS; i++)
        free(req->params[i]);
    lb_buf_release(&req->body);
    inflight_give_back(req);
    answer_give(req->http, req->token_key, req->answer_held);
    free(req);
    *con_cls = NULL;
}

/* ---------- deferral ---------- */

/* Whether the client of a suspended request has closed its side (or reset) the connection:
 * nobody is left to read an answer. */
static bool request_client_gone(struct lb_request *req)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct pollfd pfd;

    if (!ci)
        return false;
    pfd = (struct pollfd){.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pfd, 1, 0) <= 0)
        return false;
    return (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

/* What a running job shares with http_stream_begin (on the worker's stack). */
struct http_job_ctx {
    struct lb_stream *stream; /* began: req is no longer the job's */
    bool parked;              /* the job parked req: it is no longer the job's */
};

static void stream_put(struct lb_stream *s);
static bool stream_kept(struct lb_stream *s);

static void http_job_run(void *arg)
{
    struct lb_request *req = arg;
    struct http_job_ctx ctx = {0};
    struct MHD_Connection *conn = req->conn;
    void *job_arg = req->job_arg;
    void (*job_free)(void *) = req->job_free;

    if (request_client_gone(req)) {
        /* Abandoned while it waited in the queue: do not start it (a job already running keeps
         * running to its own end). */
        struct lb_error err = {0};

        log_info("request %s dropped before it started: the client has disconnected",
                 req->request_id);
        lb_error_set(&err, -EAGAIN, "the client disconnected before the request started");
        http_respond_error(req, &err);
    } else {
        req->job_ctx = &ctx;
        req->job(req, job_arg);
    }
    if (job_free)
        job_free(job_arg);
    if (ctx.parked)
        return; /* still suspended; the park's end resumes it (maybe did already) */
    if (ctx.stream) {
        /* streamed: the connection was resumed by http_stream_begin and req may be gone */
        if (!stream_kept(ctx.stream))
            http_stream_end(ctx.stream);
        stream_put(ctx.stream);
        return;
    }
    req->job_ctx = NULL;
    req->job_arg = NULL;
    MHD_resume_connection(conn);
}

void http_set_serial_key(struct lb_request *req, const char *key)
{
    snprintf(req->serial_key, sizeof(req->serial_key), "%s", key ? key : "");
    req->key_active_max = 1;
    req->key_waiting_max = HTTP_SERIAL_BACKLOG_MAX;
}

void http_set_fair_key(struct lb_request *req, const char *key, size_t max_jobs)
{
    snprintf(req->serial_key, sizeof(req->serial_key), "%s", key ? key : "");
    req->key_active_max = max_jobs ? max_jobs : 1;
    req->key_waiting_max = 0;
}

int http_defer(struct lb_request *req, lb_http_job_fn job, void *arg, void (*free_arg)(void *),
               struct lb_error *err)
{
    int r;

    req->job = job;
    req->job_arg = arg;
    req->job_free = free_arg;
    /* Suspend first: the job may finish (and resume) before pool_submit returns. */
    MHD_suspend_connection(req->conn);
    req->phase = PHASE_DEFERRED;
    req->handed_off = true;
    r = pool_submit_shared(req->route->control && req->http->cfg.control_pool
                               ? req->http->cfg.control_pool
                               : req->http->cfg.pool,
                           req->serial_key[0] ? req->serial_key : NULL, req->key_active_max,
                           req->key_waiting_max, http_job_run, req);
    if (r < 0) {
        req->phase = PHASE_BODY;
        req->handed_off = false;
        req->job_arg = NULL;
        MHD_resume_connection(req->conn);
        if (free_arg)
            free_arg(arg);
        if (r == -EAGAIN)
            return lb_error_set(err, -EAGAIN, "the worker queue is full; retry later");
        if (r == -EBUSY && req->key_waiting_max == 0)
            return lb_error_set(err, -EAGAIN,
                                "%zu requests for '%s' are already queued or running (the limit "
                                "per sandbox); retry later",
                                req->key_active_max, req->serial_key);
        if (r == -EBUSY)
            return lb_error_set(err, -EAGAIN,
                                "%d requests for '%s' are already waiting for an earlier one to "
                                "finish; retry later",
                                HTTP_SERIAL_BACKLOG_MAX, req->serial_key);
        return lb_error_set(err, r, "the daemon is shutting down");
    }
    return 0;
}

/* ---------- parking ---------- */

static void http_release(struct lb_http *h);

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
static void *poll_main(void *arg)
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
    size_t n;

    pthread_mutex_lock(&h->park_lock);
    n = h->park_waiting;
    pthread_mutex_unlock(&h->park_lock);
    return n;
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
static enum MHD_Result park_answer(struct lb_request *req)
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
    return request_queue(req);
}

/* Request completion with a park still held: never answered (should not happen: a parked
 * connection is suspended, and http_stop ends every park before stopping libmicrohttpd). */
static void park_forget(struct lb_request *req)
{
    if (req->park) {
        if (req->park_free)
            req->park_free(req->park_arg);
        req->park_arg = NULL;
        park_done(req);
    }
    park_completed(req);
}

static void *park_main(void *arg)
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
            else if (check_gone && request_client_gone(p->req))
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

/* ---------- streamed responses ---------- */

struct lb_stream {
    pthread_mutex_t lock;
    struct MHD_Connection *conn; /* valid while !gone */
    char *data;                  /* bytes not yet read by libmicrohttpd: data[off..len) */
    size_t len, off, cap;
    bool waiting; /* the reader found nothing and suspended the connection */
    bool ended, gone;
    bool kept;                  /* http_stream_keep: the job's return does not end the body */
    int refs;                   /* the job's and the response's (and a keeper's) */
    void (*drained)(void *arg); /* http_stream_on_drain */
    void *drained_arg;
    struct lb_http *h;  /* the answer budget (http_stream_reserve) */
    uint64_t token_key; /* the request's */
    size_t answer_held; /* given back when the response goes */
};

static void stream_put(struct lb_stream *s)
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
    answer_give(s->h, s->token_key, s->answer_held);
    s->answer_held = 0;
    pthread_mutex_unlock(&s->lock);
    stream_put(s);
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
    request_set_response(req, status, r);
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

int http_stream_reserve(struct lb_stream *s, size_t bytes)
{
    int r = 0;

    pthread_mutex_lock(&s->lock);
    if (s->gone)
        r = -EPIPE;
    else if (bytes < ANSWER_SMALL)
        r = 0;
    else if (!answer_take(s->h, s->token_key, bytes))
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

static bool stream_kept(struct lb_stream *s)
{
    bool kept;

    pthread_mutex_lock(&s->lock);
    kept = s->kept;
    pthread_mutex_unlock(&s->lock);
    return kept;
}

void http_stream_keep(struct lb_stream *s)
{
    pthread_mutex_lock(&s->lock);
    s->kept = true;
    s->refs++;
    pthread_mutex_unlock(&s->lock);
}

void http_stream_release(struct lb_stream *s)
{
    if (s)
        stream_put(s);
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

/* ---------- header deadline ---------- */

/* Header deadline: libmicrohttpd's connection timeout is an idle timer, so a client sending one
 * header line every few seconds would keep a connection forever, and enough of them from one
 * address fill its per-address limit. Each connection is therefore tracked from accept
 * (NOTIFY_CONNECTION) until its request line and headers are all in (the access handler's
 * first call), and again from the end of each request until the next one's headers are in:
 * while "waiting" it is on a list in deadline order and on its address's list. The watch
 * thread shuts down (shutdown(2): libmicrohttpd then sees the end and closes it) every
 * connection past header_timeout_s; an address holding per_ip_incomplete waiting connections
 * has its oldest one shut down when another arrives, so a trickling client cannot keep others
 * from the same address out for long. A connection's fd is only touched under conn_lock while
 * it is tracked, and libmicrohttpd reports the close (NOTIFY_CLOSED, which takes conn_lock)
 * before it closes the fd, so the fd shut down is never one reused by another connection. */

static size_t ip_bucket(const unsigned char *addr, unsigned char len)
{
    uint32_t x = 2166136261u; /* FNV-1a */

    for (unsigned char i = 0; i < len; i++)
        x = (x ^ addr[i]) * 16777619u;
    return x % HTTP_IP_BUCKETS;
}

static void conn_set_addr(struct http_conn *c, const struct sockaddr *sa)
{
    static const unsigned char v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

    c->addr_len = 0;
    if (sa && sa->sa_family == AF_INET) {
        memcpy(c->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        c->addr_len = 4;
    } else if (sa && sa->sa_family == AF_INET6) {
        const unsigned char *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;

        if (memcmp(a, v4mapped, 12) == 0) {
            memcpy(c->addr, a + 12, 4);
            c->addr_len = 4;
        } else {
            memcpy(c->addr, a, 16);
            c->addr_len = 16;
        }
    }
}

static void conn_wait_end_locked(struct http_conn *c)
{
    struct lb_http *h = c->h;
    struct http_ip *ip = c->ip;

    if (!c->waiting)
        return;
    c->waiting = false;
    if (c->prev)
        c->prev->next = c->next;
    else
        h->waiting_head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        h->waiting_tail = c->prev;
    c->prev = c->next = NULL;
    if (!ip)
        return;
    if (c->ip_prev)
        c->ip_prev->ip_next = c->ip_next;
    else
        ip->head = c->ip_next;
    if (c->ip_next)
        c->ip_next->ip_prev = c->ip_prev;
    else
        ip->tail = c->ip_prev;
    c->ip_prev = c->ip_next = NULL;
    c->ip = NULL;
    if (--ip->waiting == 0) {
        struct http_ip **pp = &h->ips[ip_bucket(ip->addr, ip->len)];

        while (*pp != ip)
            pp = &(*pp)->next;
        *pp = ip->next;
        free(ip);
    }
}

/* Close c from our side: libmicrohttpd sees the end of the connection and closes it. */
static void conn_cut_locked(struct http_conn *c)
{
    conn_wait_end_locked(c);
    shutdown(c->fd, SHUT_RDWR);
}

static struct http_ip *ip_find_locked(struct lb_http *h, const unsigned char *addr,
                                      unsigned char len)
{
    struct http_ip *ip = h->ips[ip_bucket(addr, len)];

    while (ip && !(ip->len == len && memcmp(ip->addr, addr, len) == 0))
        ip = ip->next;
    return ip;
}

/* c starts waiting for a request line and headers, due header_timeout_s from now. */
static void conn_wait_begin_locked(struct http_conn *c)
{
    struct lb_http *h = c->h;
    struct http_ip *ip;

    if (c->waiting)
        return;
    c->waiting = true;
    c->target_len = 0;
    c->deadline_ms = clock_mono_ms() + (int64_t)h->cfg.header_timeout_s * 1000;
    c->prev = h->waiting_tail;
    c->next = NULL;
    if (h->waiting_tail)
        h->waiting_tail->next = c;
    else
        h->waiting_head = c;
    h->waiting_tail = c;
    if (h->waiting_head == c)
        pthread_cond_signal(&h->conn_cond); /* the watch thread slept with nothing to watch */
    if (c->addr_len == 0 || h->cfg.per_ip_incomplete == 0)
        return;
    /* at the address's cap its oldest waiting connection makes room (cutting the last one
     * frees the entry: look it up again) */
    ip = ip_find_locked(h, c->addr, c->addr_len);
    while (ip && ip->waiting >= h->cfg.per_ip_incomplete) {
        conn_cut_locked(ip->head);
        h->cut_cap++;
        metrics_add(LB_M_HTTP_CUT_CAP, 1);
        ip = ip_find_locked(h, c->addr, c->addr_len);
    }
    if (!ip) {
        size_t b = ip_bucket(c->addr, c->addr_len);

        ip = calloc(1, sizeof(*ip));
        if (!ip)
            return; /* not counted per address; the deadline still holds */
        memcpy(ip->addr, c->addr, c->addr_len);
        ip->len = c->addr_len;
        ip->next = h->ips[b];
        h->ips[b] = ip;
    }
    c->ip = ip;
    c->ip_prev = ip->tail;
    c->ip_next = NULL;
    if (ip->tail)
        ip->tail->ip_next = c;
    else
        ip->head = c;
    ip->tail = c;
    if (++ip->waiting > h->waiting_max) {
        h->waiting_max = ip->waiting;
        metrics_set(LB_M_HTTP_WAITING_MAX, h->waiting_max);
    }
}

/* NOTIFY_CONNECTION: a connection was accepted (STARTED) or is about to be closed (CLOSED). */
static void http_notify_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                                   enum MHD_ConnectionNotificationCode toe)
{
    struct lb_http *h = cls;
    struct http_conn *c = *socket_context;

    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fd =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *addr =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);

        c = fd ? calloc(1, sizeof(*c)) : NULL;
        *socket_context = c;
        if (!c)
            return; /* untracked: only libmicrohttpd's idle timeout bounds it */
        c->h = h;
        c->fd = fd->connect_fd;
        conn_set_addr(c, addr ? addr->client_addr : NULL);
        pthread_mutex_lock(&h->conn_lock);
        conn_wait_begin_locked(c);
        pthread_mutex_unlock(&h->conn_lock);
        return;
    }
    if (!c)
        return;
    pthread_mutex_lock(&h->conn_lock);
    conn_wait_end_locked(c);
    pthread_mutex_unlock(&h->conn_lock);
    free(c);
    *socket_context = NULL;
}

static struct http_conn *conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

    return ci ? ci->socket_context : NULL;
}

/* The URI log callback: the request line is in. Keeps the request target's length (as sent,
 * query included) for the access handler's check. Returns the request's initial context:
 * none. */
static void *http_uri_log(void *cls, const char *uri, struct MHD_Connection *conn)
{
    struct http_conn *c = conn_of(conn);

    (void)cls;
    if (c)
        c->target_len = strlen(uri);
    return NULL;
}

/* Log a summary of what was counted since the last one, at most once per interval. Called on
 * the watch thread with conn_lock held; unlocks it while logging. */
static void conn_warn_summary_locked(struct lb_http *h, int64_t now)
{
    uint64_t deadline = h->cut_deadline, cap = h->cut_cap, suppressed = h->mhd_suppressed;
    char last[sizeof(h->mhd_last)];

    if (now - h->warn_since < HTTP_WARN_INTERVAL_MS)
        return;
    h->warn_since = now;
    h->cut_deadline = h->cut_cap = h->mhd_suppressed = h->mhd_logged = 0;
    if (!deadline && !cap && !suppressed)
        return;
    memcpy(last, h->mhd_last, sizeof(last));
    pthread_mutex_unlock(&h->conn_lock);
    if (deadline || cap)
        log_warn("connections closed before their request headers were in, in the last %d s: "
                 "%llu past the header deadline (server.header_timeout_s = %u s), %llu past %u "
                 "incomplete requests from one address (server.per_ip_incomplete)",
                 HTTP_WARN_INTERVAL_MS / 1000, (unsigned long long)deadline,
                 h->cfg.header_timeout_s, (unsigned long long)cap, h->cfg.per_ip_incomplete);
    if (suppressed)
        log_warn("libmicrohttpd: %llu more warnings in the last %d s, not logged one by one "
                 "(the last: %s)",
                 (unsigned long long)suppressed, HTTP_WARN_INTERVAL_MS / 1000, last);
    pthread_mutex_lock(&h->conn_lock);
}

/* The watch thread: cuts connections past their header deadline, logs the summaries. */
static void *conn_main(void *arg)
{
    struct lb_http *h = arg;

    pthread_mutex_lock(&h->conn_lock);
    while (!h->conn_thread_stop) {
        int64_t now = clock_mono_ms(), wake = now + HTTP_WARN_INTERVAL_MS;
        struct timespec ts;

        while (h->waiting_head && h->waiting_head->deadline_ms <= now) {
            conn_cut_locked(h->waiting_head);
            h->cut_deadline++;
            metrics_add(LB_M_HTTP_CUT_DEADLINE, 1);
        }
        conn_warn_summary_locked(h, now);
        if (h->waiting_head && h->waiting_head->deadline_ms < wake)
            wake = h->waiting_head->deadline_ms;
        if (h->warn_since + HTTP_WARN_INTERVAL_MS < wake)
            wake = h->warn_since + HTTP_WARN_INTERVAL_MS;
        if (wake <= now)
            wake = now + 1;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        {
            int64_t ns = (int64_t)ts.tv_nsec + (wake - now) * 1000000;

            ts.tv_sec += (time_t)(ns / 1000000000);
            ts.tv_nsec = (long)(ns % 1000000000);
        }
        pthread_cond_timedwait(&h->conn_cond, &h->conn_lock, &ts);
    }
    pthread_mutex_unlock(&h->conn_lock);
    return NULL;
}

/* ---------- start/stop ---------- */

/* libmicrohttpd's messages (one per refused connection, per error answer...): the first few of
 * each interval are logged as they come, the rest counted into the watch thread's summary, so
 * a flood of connections cannot flood the log. */
static void http_mhd_log(void *cls, const char *fmt, va_list ap)
{
    struct lb_http *h = cls;
    char line[512];
    bool now;

    vsnprintf(line, sizeof(line), fmt, ap);
    line[strcspn(line, "\n")] = '\0';
    pthread_mutex_lock(&h->conn_lock);
    now = h->mhd_logged < HTTP_MHD_WARN_BURST;
    if (now) {
        h->mhd_logged++;
    } else {
        h->mhd_suppressed++;
        snprintf(h->mhd_last, sizeof(h->mhd_last), "%.*s", (int)sizeof(h->mhd_last) - 1, line);
    }
    pthread_mutex_unlock(&h->conn_lock);
    if (now)
        log_warn("libmicrohttpd: %s", line);
}

int http_bind(const char *listen_spec, int *fd_out, char *bound, size_t bound_len,
              struct lb_error *err)
{
    char host[256], port[16];
    const char *colon = strrchr(listen_spec, ':');
    struct addrinfo hints = {0}, *ai = NULL;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int fd = -1, r, one = 1;
    size_t hl;

    if (!colon || colon == listen_spec || strlen(colon + 1) == 0 ||
        strlen(colon + 1) >= sizeof(port))
        return lb_error_set(err, -EINVAL, "listen address must be HOST:PORT, not '%s'",
                            listen_spec);
    hl = (size_t)(colon - listen_spec);
    if (listen_spec[0] == '[' && hl >= 2 && listen_spec[hl - 1] == ']')
        memcpy(host, listen_spec + 1, hl - 2), host[hl - 2] = '\0';
    else if (hl < sizeof(host))
        memcpy(host, listen_spec, hl), host[hl] = '\0';
    else
        return lb_error_set(err, -EINVAL, "listen host too long");
    snprintf(port, sizeof(port), "%s", colon + 1);
    /* getaddrinfo takes "99999" and the port silently wraps (to 34463): refuse it instead */
    if (strspn(port, "0123456789") != strlen(port) || strtoul(port, NULL, 10) > 65535)
        return lb_error_set(err, -EINVAL, "listen port must be a number from 0 to 65535, not '%s'",
                            port);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    r = getaddrinfo(host, port, &hints, &ai);
    if (r != 0)
        return lb_error_set(err, -EINVAL, "cannot resolve listen address '%s': %s", listen_spec,
                            gai_strerror(r));
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        r = lb_error_set(err, -errno, "socket: %s", strerror(errno));
        goto out;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 1024) < 0) {
        r = lb_error_set(err, -errno, "cannot listen on %s: %s", listen_spec, strerror(errno));
        goto out;
    }
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        char a[INET6_ADDRSTRLEN] = "?";

        if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof(a));
            snprintf(bound, bound_len, "[%s]:%u", a, ntohs(s6->sin6_port));
        } else {
            struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &s4->sin_addr, a, sizeof(a));
            snprintf(bound, bound_len, "%s:%u", a, ntohs(s4->sin_port));
        }
    }
    *fd_out = fd;
    fd = -1;
    r = 0;
out:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(ai);
    return r;
}

/* Free h's memory (no thread uses it any more). */
static void http_release(struct lb_http *h)
{
    pthread_cond_destroy(&h->park_cond);
    pthread_cond_destroy(&h->park_drained);
    pthread_cond_destroy(&h->poll_cond);
    pthread_mutex_destroy(&h->park_lock);
    pthread_cond_destroy(&h->conn_cond);
    pthread_mutex_destroy(&h->conn_lock);
    pthread_mutex_destroy(&h->answer_lock);
    while (h->holders) {
        struct answer_holder *a = h->holders;

        h->holders = a->next;
        free(a);
    }
    free(h->route_metric);
    free(h);
}

/* Stop the park thread and free h, or leave the freeing to the last park handle's release
 * (a waker may still hold one: its http_wake must keep working, as a no-op). */
static void http_free(struct lb_http *h)
{
    bool now;

    pthread_mutex_lock(&h->park_lock);
    h->park_thread_stop = true;
    pthread_cond_signal(&h->park_cond);
    pthread_cond_signal(&h->poll_cond);
    pthread_mutex_unlock(&h->park_lock);
    if (h->park_thread_started)
        pthread_join(h->park_thread, NULL);
    if (h->poll_thread_started)
        pthread_join(h->poll_thread, NULL);
    pthread_mutex_lock(&h->conn_lock);
    h->conn_thread_stop = true;
    pthread_cond_signal(&h->conn_cond);
    pthread_mutex_unlock(&h->conn_lock);
    if (h->conn_thread_started)
        pthread_join(h->conn_thread, NULL);
    pthread_mutex_lock(&h->park_lock);
    h->stopped = true;
    now = h->park_handles == 0;
    pthread_mutex_unlock(&h->park_lock);
    if (now)
        http_release(h);
}

int http_start(const struct lb_http_config *cfg, struct lb_http **out, struct lb_error *err)
{
    struct lb_http *h = calloc(1, sizeof(*h));
    int r, n = 0;

    if (!h) {
        close(cfg->listen_fd);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    h->cfg = *cfg;
    h->listen_fd = cfg->listen_fd;
    pthread_mutex_init(&h->park_lock, NULL);
    pthread_mutex_init(&h->answer_lock, NULL);
    {
        pthread_condattr_t ca;

        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&h->park_cond, &ca);
        pthread_cond_init(&h->park_drained, &ca);
        pthread_cond_init(&h->poll_cond, &ca);
        pthread_cond_init(&h->conn_cond, &ca);
        pthread_condattr_destroy(&ca);
    }
    pthread_mutex_init(&h->conn_lock, NULL);
    h->warn_since = clock_mono_ms();
    h->park_next_at = INT64_MAX;
    if (pthread_create(&h->park_thread, NULL, park_main, h) != 0) {
        r = lb_error_set(err, -ENOMEM, "cannot start the park thread");
        goto fail;
    }
    h->park_thread_started = true;
    if (pthread_create(&h->poll_thread, NULL, poll_main, h) != 0) {
        r = lb_error_set(err, -ENOMEM, "cannot start the park poll thread");
        goto fail;
    }
    h->poll_thread_started = true;
    if (pthread_create(&h->conn_thread, NULL, conn_main, h) != 0) {
        r = lb_error_set(err, -ENOMEM, "cannot start the connection watch thread");
        goto fail;
    }
    h->conn_thread_started = true;
    while (cfg->routes[n].method)
        n++;
    h->route_metric = calloc((size_t)n + 1, sizeof(int));
    if (!h->route_metric) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < n; i++)
        h->route_metric[i] = metrics_route_register(cfg->routes[i].name);
    {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        char a[INET6_ADDRSTRLEN] = "?";

        if (getsockname(h->listen_fd, (struct sockaddr *)&ss, &sl) == 0 &&
            ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
            inet_ntop(AF_INET6, &s6->sin6_addr, a, sizeof(a));
            snprintf(h->bound, sizeof(h->bound), "[%s]:%u", a, ntohs(s6->sin6_port));
        } else if (ss.ss_family == AF_INET) {
            struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
            inet_ntop(AF_INET, &s4->sin_addr, a, sizeof(a));
            snprintf(h->bound, sizeof(h->bound), "%s:%u", a, ntohs(s4->sin_port));
        }
    }
    h->mhd = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
            MHD_USE_ERROR_LOG,
        0, NULL, NULL, http_access, h, MHD_OPTION_EXTERNAL_LOGGER, http_mhd_log, h,
        MHD_OPTION_LISTEN_SOCKET, h->listen_fd, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)cfg->threads,
        /* a connection between requests (or before its first) gets the
         * short timeout; a request under way the longer one */
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->header_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)cfg->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)cfg->per_ip_connections, MHD_OPTION_NOTIFY_COMPLETED, http_completed, h,
        MHD_OPTION_NOTIFY_CONNECTION, http_notify_connection, h, MHD_OPTION_URI_LOG_CALLBACK,
        http_uri_log, h, MHD_OPTION_END);
    if (!h->mhd) {
        r = lb_error_set(err, -EIO, "libmicrohttpd failed to start on %s", h->bound);
        goto fail;
    }
    h->listen_fd = -1; /* MHD owns and closes the listening socket now */
    *out = h;
    return 0;
fail:
    if (h->listen_fd >= 0)
        close(h->listen_fd);
    http_free(h);
    return r;
}

const char *http_bound_address(struct lb_http *h)
{
    return h->bound;
}

void http_stop(struct lb_http *h)
{
    if (!h)
        return;
    /* libmicrohttpd must not be stopped with suspended connections: answer the parked first */
    http_end_parked(h);
    if (h->mhd)
        MHD_stop_daemon(h->mhd);
    if (h->listen_fd >= 0)
        close(h->listen_fd);
    http_free(h);
}
