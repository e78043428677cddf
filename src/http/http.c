/*
 * http.c - the libmicrohttpd adapter (see http.h): start and stop, the MHD callbacks, the
 * access handler and routing. Responses are made in respond.c, request bodies taken in body.c,
 * jobs deferred in defer.c, requests parked in park.c, responses streamed in stream.c and
 * connections held to their header deadline in conn.c.
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
 * Timeouts: a connection that has no request under way (before its first, between keep-alive
 * requests) must have sent its request line and headers within header_timeout_s (an absolute
 * deadline, see conn.c; also libmicrohttpd's idle timeout meanwhile); while a request is under
 * way connection_timeout_s of inactivity applies (suspended connections, waiting for a job,
 * never time out).
 */
#include "http/http_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
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

/* An announced body at most this far past its limit is read and dropped before the 413 */
#define DRAIN_MAX_BYTES (64ull * 1024 * 1024)
#define HTTP_MHD_WARN_BURST 3 /* libmicrohttpd lines logged as-is per interval */
/* The front end's own bounds on a request's head, checked before routing so they answer JSON;
 * they sit below libmicrohttpd's per-connection buffer (32 KiB), past which libmicrohttpd
 * answers 414/431 itself. */
#define HTTP_MAX_TARGET_BYTES 16384 /* the request target: path and query, as sent */
#define HTTP_MAX_HEAD_BYTES 24576   /* the request line and every header line */

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
    return http_request_queue(req);
}

/* Is a body on its way that the client sends whatever the answer, and short enough to read
 * and drop: a Content-Length of 1 to DRAIN_MAX_BYTES without "Expect: 100-continue" (such a
 * client waits for the go-ahead and sends nothing when it gets an answer instead), and without
 * any Transfer-Encoding (libmicrohttpd then ignores Content-Length and reads until the client
 * closes: there is no end to wait for)? */
static bool request_body_coming(struct lb_request *req)
{
    const char *clen = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Content-Length");
    const char *te = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Transfer-Encoding");
    const char *expect = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Expect");
    unsigned long long n;
    char *end;

    if ((expect && strcasecmp(expect, "100-continue") == 0) || !clen || te)
        return false;
    n = strtoull(clen, &end, 10);
    return *end == '\0' && n > 0 && n <= DRAIN_MAX_BYTES;
}

/* Refuse a request of an authenticated client before its handler ran (the in-flight budget, a
 * streamed route's handler failing): as request_fail, but when a body is coming
 * (request_body_coming) the answer waits until the body has been read and dropped
 * (PHASE_DRAIN). Answered at once, libmicrohttpd closes the connection on the unread rest; the
 * kernel then resets it, and the client, still sending, saw "Send failure: Broken pipe" or
 * "Connection reset" instead of the answer (4 of 100 2 MiB exec bodies over the budget, here,
 * at load). The connection's timeout bounds a client that stalls. A client not known by a token
 * (no route yet, no valid token) is answered at once, as before: reading its body first would
 * let it hold a connection longer than its headers may. */
static enum MHD_Result request_refuse(struct lb_request *req, const struct lb_error *err)
{
    if (req->principal == LB_PRINCIPAL_ANONYMOUS || !request_body_coming(req))
        return request_fail(req, err);
    http_respond_error(req, err);
    req->phase = PHASE_DRAIN;
    return MHD_YES;
}

/* Does the request bring a body (a Content-Length other than 0, or any Transfer-Encoding)? */
static bool request_has_body(struct lb_request *req)
{
    const char *clen = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Content-Length");

    return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Transfer-Encoding") ||
           (clen && strcmp(clen, "0") != 0);
}

/* An error of the front end's own whose status has no errno in util/error.h (414, 431). */
static enum MHD_Result request_fail_status(struct lb_request *req, unsigned status,
                                           const char *code, const char *message)
{
    log_debug_req(req->request_id, "request %s: %u %s: %s", req->request_id, status, code, message);
    http_respond_json(req, status, http_error_json(code, message));
    return http_request_queue(req);
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

/* ---------- the access handler ---------- */

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
    if (http_request_authorize(req, err) < 0)
        return request_fail(req, err);
    /* the routes without a token (health, readiness, metrics) take no body: one would hold a
     * connection and a share of the in-flight budget for a client nobody knows */
    if (req->route->auth == LB_AUTH_NONE && request_has_body(req)) {
        lb_error_set(err, -EFBIG, "%s %s takes no request body", req->method, url);
        return request_fail(req, err);
    }
    limit = req->route->raw_body ? http_raw_limit(req) : h->cfg.max_body_bytes;
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
        if (*end == '\0' && !req->route->raw_body && !http_inflight_take(req, (size_t)n)) {
            http_inflight_error(req, err);
            return request_refuse(req, err);
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
        return request_refuse(req, err);
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
            struct http_conn *c = http_conn_of(conn);

            if (c) {
                /* the request line and headers are in: no header deadline any more */
                pthread_mutex_lock(&h->conn_lock);
                http_conn_wait_end_locked(c);
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
        if (!req->sink_open) {
            /* Refused before a byte was read. A client that asked "Expect: 100-continue" has
             * sent nothing and never will: answer now. Any other is sending the body already;
             * answered now, libmicrohttpd would close the connection on the unread rest and the
             * client's kernel could discard the answer on the reset. Read it and drop it, and
             * answer when it has ended (the connection's timeout bounds a client that stalls). */
            const char *expect = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Expect");

            if (req->announced_len == 0 || (expect && strcasecmp(expect, "100-continue") == 0))
                return http_request_queue(req);
            req->phase = PHASE_DRAIN;
            return MHD_YES;
        }
        req->phase = PHASE_STREAM;
        return MHD_YES;
    case PHASE_DRAIN:
        if (*upload_data_size == 0)
            return http_request_queue(req); /* the body has ended */
        *upload_data_size = 0;
        return MHD_YES;
    case PHASE_DEFERRED:
        if (*upload_data_size == 0)
            return http_request_queue(req); /* resumed: the job has set the response */
        *upload_data_size = 0;
        return MHD_YES;
    case PHASE_PARKED:
        if (*upload_data_size == 0)
            return http_park_answer(req); /* resumed: woken, deadline, client gone or shutdown */
        *upload_data_size = 0;
        return MHD_YES;
    default:
        break;
    }
    if (*upload_data_size > 0) {
        if (req->phase == PHASE_STREAM)
            http_sink_write(req, upload_data, *upload_data_size);
        else
            http_body_append(req, upload_data, *upload_data_size);
        /* Past a limit the rest is read and dropped: libmicrohttpd cannot queue a response
         * while a body is still arriving (a chunked one has no Content-Length to refuse it up
         * front), so the error goes out once the body has ended. */
        *upload_data_size = 0;
        return MHD_YES;
    }

    /* The whole body is here. */
    if (req->phase == PHASE_STREAM) {
        if (http_sink_finish(req, &err) < 0)
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
        http_inflight_error(req, &err);
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
    return http_request_queue(req);
}

static void http_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                           enum MHD_RequestTerminationCode toe)
{
    struct lb_http *h = cls;
    struct lb_request *req = *con_cls;

    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        struct http_conn *c = http_conn_of(conn);

        /* the connection stays open for the next request: the short timeout again, and the
         * next request's line and headers are due header_timeout_s from now */
        MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT,
                                  (unsigned)h->cfg.header_timeout_s);
        if (c) {
            pthread_mutex_lock(&h->conn_lock);
            http_conn_wait_begin_locked(c);
            pthread_mutex_unlock(&h->conn_lock);
        }
    }
    if (!req)
        return;
    http_sink_abort(req); /* the body never ended: client gone, or the daemon stops */
    http_park_forget(req);
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
    http_inflight_give_back(req);
    http_answer_give(req->http, req->token_key, req->answer_held);
    free(req);
    *con_cls = NULL;
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
    clock_cond_init_mono(&h->park_cond);
    clock_cond_init_mono(&h->park_drained);
    clock_cond_init_mono(&h->poll_cond);
    clock_cond_init_mono(&h->conn_cond);
    pthread_mutex_init(&h->conn_lock, NULL);
    h->warn_since = clock_mono_ms();
    h->park_next_at = INT64_MAX;
    if (pthread_create(&h->park_thread, NULL, http_park_main, h) != 0) {
        r = lb_error_set(err, -ENOMEM, "cannot start the park thread");
        goto fail;
    }
    h->park_thread_started = true;
    if (pthread_create(&h->poll_thread, NULL, http_poll_main, h) != 0) {
        r = lb_error_set(err, -ENOMEM, "cannot start the park poll thread");
        goto fail;
    }
    h->poll_thread_started = true;
    if (pthread_create(&h->conn_thread, NULL, http_conn_main, h) != 0) {
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
