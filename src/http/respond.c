/*
 * respond.c - the HTTP front end's answers: the answer budget (bytes of answers rendered in
 * memory, per bearer token and in all), the responses handlers and jobs set (JSON, errors,
 * text, files), and the accessors of a request (parameters, query, headers, principal, body,
 * the body parsed as JSON), queueing the response set, and freeing the server's memory once no
 * thread uses it. A base of http/: it calls no other file of the folder.
 */
#include "http/http_internal.h"

#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "util/log.h"
#include "util/metrics.h"
#include "util/utf8.h"

/* ---------- the answer budget ---------- */

uint64_t http_token_hash(const char *token)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */

    for (; *token; token++)
        h = (h ^ (unsigned char)*token) * 1099511628211ULL;
    return h ? h : 1;
}

/* Charge n more bytes to key: within the total, and within a quarter of it unless key holds
 * nothing yet (so any one answer that fits the total can be sent). */
bool http_answer_take(struct lb_http *h, uint64_t key, size_t n)
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

void http_answer_give(struct lb_http *h, uint64_t key, size_t n)
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
    if (!http_answer_take(req->http, req->token_key, bytes - req->answer_held))
        return answer_error(req, bytes, err);
    req->answer_held = bytes;
    return 0;
}

/* Charge the request exactly what its answer of len bytes holds (nothing below ANSWER_SMALL);
 * false when it does not fit. */
static bool answer_settle(struct lb_request *req, size_t len)
{
    size_t want = len >= ANSWER_SMALL ? len : 0;

    if (want > req->answer_held) {
        if (!http_answer_take(req->http, req->token_key, want - req->answer_held))
            return false;
    } else {
        http_answer_give(req->http, req->token_key, req->answer_held - want);
    }
    req->answer_held = want;
    return true;
}

/* ---------- responses ---------- */

void http_request_set_response(struct lb_request *req, unsigned status, struct MHD_Response *r)
{
    if (req->response)
        MHD_destroy_response(req->response);
    req->response = r;
    req->status = status;
    if (r) {
        MHD_add_response_header(r, "X-Request-Id", req->request_id);
        MHD_add_response_header(r, "Cache-Control", "no-store");
        /* every 429 says when to retry: what the refusal estimated, else a second */
        if (status == 429) {
            char secs[24];

            snprintf(secs, sizeof(secs), "%ld", req->retry_after_s > 0 ? req->retry_after_s : 1);
            MHD_add_response_header(r, "Retry-After", secs);
        }
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
    http_request_set_response(req, status, r);
}

void http_respond_json(struct lb_request *req, unsigned status, json_t *body)
{
    char *text = json_dumps(body, JSON_COMPACT | JSON_ENSURE_ASCII);

    json_decref(body);
    if (!text) {
        static char fallback[] =
            "{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\"}}";

        http_request_set_response(
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
    if (status == 429) {
        metrics_add(LB_M_HTTP_OVERLOADED, 1);
        req->retry_after_s = err->retry_after_s;
    }
    http_respond_json(req, (unsigned)status, body);
    if (status == 401)
        http_response_header(req, "WWW-Authenticate", "Bearer");
}

void http_respond_empty(struct lb_request *req, unsigned status)
{
    http_request_set_response(
        req, status, MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT));
}

/* A file served from offset; the response owns fd. */
struct fd_source {
    int fd;
    uint64_t offset;
    void (*done)(void *); /* after fd is closed (may be NULL) */
    void *done_arg;
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
    if (src->done)
        src->done(src->done_arg);
    free(src);
}

static void respond_fd(struct lb_request *req, unsigned status, int fd, uint64_t offset,
                       uint64_t len, void (*done)(void *), void *done_arg)
{
    struct fd_source *src = len ? malloc(sizeof(*src)) : NULL;
    struct MHD_Response *r = NULL;

    if (len == 0) {
        close(fd);
        if (done)
            done(done_arg);
        r = MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
    } else if (src) {
        src->fd = fd;
        src->offset = offset;
        src->done = done;
        src->done_arg = done_arg;
        r = MHD_create_response_from_callback(len, 256 * 1024, http_fd_reader, src, http_fd_free);
        if (!r)
            free(src);
    }
    if (!r) {
        if (len != 0) {
            close(fd);
            if (done)
                done(done_arg);
        }
        struct lb_error e;
        lb_error_set(&e, -ENOMEM, "cannot create response");
        http_respond_error(req, &e);
        return;
    }
    MHD_add_response_header(r, "Content-Type", "application/octet-stream");
    http_request_set_response(req, status, r);
}

void http_respond_fd_range(struct lb_request *req, unsigned status, int fd, uint64_t offset,
                           uint64_t len)
{
    respond_fd(req, status, fd, offset, len, NULL, NULL);
}

void http_respond_fd(struct lb_request *req, unsigned status, int fd, uint64_t size)
{
    respond_fd(req, status, fd, 0, size, NULL, NULL);
}

void http_respond_fd_done(struct lb_request *req, unsigned status, int fd, uint64_t size,
                          void (*done)(void *), void *done_arg)
{
    respond_fd(req, status, fd, 0, size, done, done_arg);
}

void http_response_header(struct lb_request *req, const char *name, const char *value)
{
    if (!req->response)
        return;
    if (strcasecmp(name, "Content-Type") == 0) { /* one Content-Type: the last one set */
        const char *old = MHD_get_response_header(req->response, "Content-Type");
        char *copy = old ? strdup(old) : NULL;

        if (copy)
            MHD_del_response_header(req->response, "Content-Type", copy);
        free(copy);
    }
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

/* ---------- queueing the answer, freeing the server ---------- */

enum MHD_Result http_request_queue(struct lb_request *req)
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

/* Free h's memory (no thread uses it any more). */
void http_release(struct lb_http *h)
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
