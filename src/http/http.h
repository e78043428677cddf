/*
 * http.h - lendbox's HTTP front end: the one adapter around libmicrohttpd.
 *
 * It owns the listening socket, routing (method + path pattern, 404/405), bearer-token
 * authentication (through the app's authorize hook), request-body limits (413, also for
 * chunked bodies and bodies longer than announced), JSON errors, X-Request-Id and latency
 * metrics. Handlers never block: long work goes through http_defer, which suspends the MHD
 * connection, runs the job on the worker pool and resumes the connection when the job has set
 * a response. A job runs to its end even if the client hangs up (stops are never abandoned).
 *
 * Thread-safety: handlers run on MHD's threads, jobs on pool workers; a request is touched by
 * one thread at a time. http_* functions on a server may be called from any thread.
 */
#ifndef LB_HTTP_H
#define LB_HTTP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool/pool.h"
#include "util/buf.h"
#include "util/error.h"

struct lb_request;
struct lb_http;

enum lb_auth_need {
    LB_AUTH_NONE,    /* /healthz, /readyz, /metrics */
    LB_AUTH_ADMIN,   /* admin token only; an operate token gets 403 */
    LB_AUTH_SANDBOX, /* admin, or the operate token of the sandbox named by param 0 */
    LB_AUTH_SESSION, /* admin, or the operate token of the sandbox lent to the resources
                      * session named by param 0 (harness activations) */
};

enum lb_principal {
    LB_PRINCIPAL_ANONYMOUS,
    LB_PRINCIPAL_ADMIN,
    LB_PRINCIPAL_OPERATE,
};

struct lb_route {
    const char *method;  /* "GET", "POST", "PUT", "DELETE" */
    const char *pattern; /* "/v1/sessions/ * /seed" without spaces: '*' matches one segment */
    enum lb_auth_need auth;
    bool raw_body; /* the body is file bytes (max_file_bytes), streamed (http_body_sink), not
                    * JSON (max_body_bytes, buffered) */
    /* Answer the request: set a response with http_respond_* or hand off with http_defer,
     * and return 0; or return a negative errno (message in err) for a JSON error response. */
    int (*handle)(struct lb_request *req, struct lb_error *err);
    const char *name; /* metrics label */
    bool control;     /* lifecycle work (seed, release, close, delete): runs on the control
                       * pool, so long execs holding every worker cannot hold up a stop */
};

/* The app decides who a bearer token is. Return 0 and set *who, or -ENOKEY (401: missing or
 * unknown token) or -EACCES (403: valid but not for this sandbox). sandbox_id is param 0 for
 * LB_AUTH_SANDBOX routes (the session id for LB_AUTH_SESSION ones), else NULL. Called on an MHD
 * thread: must not block on a provider. */
typedef int (*lb_authorize_fn)(void *app, const char *token, enum lb_auth_need need,
                               const char *sandbox_id, enum lb_principal *who,
                               struct lb_error *err);

struct lb_http_config {
    int listen_fd;                 /* from http_bind; http_start takes it over */
    unsigned threads;              /* MHD thread pool size */
    unsigned connection_timeout_s; /* idle bound while a request is under way */
    unsigned header_timeout_s;     /* idle bound of a connection with no request under way */
    unsigned max_connections;      /* open connections at most; more are closed at accept */
    unsigned per_ip_connections;   /* open connections from one client address at most */
    size_t max_body_bytes;         /* JSON bodies */
    size_t max_file_bytes;         /* raw file bodies (streamed) */
    size_t max_inflight_bytes;     /* buffered body bytes of all requests together; 0: no cap */
    int max_json_depth;
    const struct lb_route *routes; /* terminated by a route with method NULL */
    lb_authorize_fn authorize;
    void *app;
    struct lb_pool *pool;         /* deferred work */
    struct lb_pool *control_pool; /* deferred work of control routes; NULL: pool */
};

/* Make the listening socket for listen ("HOST:PORT": IPv4, [IPv6] or a name; PORT 0-65535, 0 picks
 * a free port) and write the address as bound ("127.0.0.1:41234") into bound. *fd_out is the
 * caller's until http_start takes it. Errors: -EINVAL (bad address), -EADDRINUSE, -errno. */
int http_bind(const char *listen, int *fd_out, char *bound, size_t bound_len, struct lb_error *err);

/* Start serving on cfg->listen_fd (always consumed, also on failure). *out owned by the
 * caller (http_stop). Errors: -ENOMEM, -EIO. */
int http_start(const struct lb_http_config *cfg, struct lb_http **out, struct lb_error *err);
/* "127.0.0.1:8787" as actually bound (port 0 resolved). Owned by the server. */
const char *http_bound_address(struct lb_http *h);
/* Stop listening and serving; every deferred job must have finished (pool_stop first). */
void http_stop(struct lb_http *h);

/* --- used by handlers and jobs --- */

void *http_app(struct lb_request *req);
const char *http_method(struct lb_request *req);
/* The i-th '*' segment of the matched pattern, or NULL. */
const char *http_param(struct lb_request *req, unsigned i);
/* A query argument or request header (NULL if absent; "" for a query value holding a NUL, so
 * that it is rejected, not cut short). Only valid on MHD threads (handler). */
const char *http_query(struct lb_request *req, const char *key);
const char *http_header(struct lb_request *req, const char *name);
enum lb_principal http_principal(struct lb_request *req);
const char *http_request_id(struct lb_request *req);
/* The whole request body (empty for raw_body routes: theirs streams, see http_body_sink). */
const struct lb_buf *http_body(struct lb_request *req);
/* Parse the body as one JSON object (depth-limited). -EINVAL with a message if not. The
 * caller owns *out. An empty body parses as {} when allow_empty. */
int http_body_json(struct lb_request *req, bool allow_empty, json_t **out, struct lb_error *err);

/* Responses: each sets the request's one response (a second call replaces the first). */
void http_respond_json(struct lb_request *req, unsigned status, json_t *body); /* steals body */
void http_respond_error(struct lb_request *req, const struct lb_error *err);
void http_respond_empty(struct lb_request *req, unsigned status);
void http_respond_text(struct lb_request *req, unsigned status, const char *content_type,
                       char *data, size_t len); /* steals data (malloc'd) */
/* Serve size bytes from fd (which the response then owns and closes). */
void http_respond_fd(struct lb_request *req, unsigned status, int fd, uint64_t size);
/* Serve len bytes of fd from offset (fd owned and closed by the response). */
void http_respond_fd_range(struct lb_request *req, unsigned status, int fd, uint64_t offset,
                           uint64_t len);
/* Add a header to the response set last. */
void http_response_header(struct lb_request *req, const char *name, const char *value);

/* Give the request's deferred job a serial key (copied; at most 191 bytes are kept; NULL or ""
 * clears it): jobs with the same key run one at a time in arrival order, and one waiting for
 * an earlier job of its key holds no worker, so the requests of one busy resources session
 * cannot occupy the whole pool. Past 64 waiting jobs of a key http_defer fails with -EAGAIN
 * (429). Call before http_defer. */
void http_set_serial_key(struct lb_request *req, const char *key);

/* Give the request's deferred job a fair-share key (copied, as above): at most max_jobs (0 is
 * taken as 1) jobs of one key are queued or running at once, each holding at most one worker,
 * so one busy key (a sandbox) can never take more than max_jobs workers; past it http_defer
 * fails with -EAGAIN (429) at once. Call before http_defer; replaces a serial key. */
void http_set_fair_key(struct lb_request *req, const char *key, size_t max_jobs);

/* Run job(req, arg) on the pool and answer with the response it sets (it must set one).
 * A job whose client has closed its connection by the time a worker picks it up is not run
 * (free_arg still is); one already running is not interrupted.
 * Returns 0, or -EAGAIN (queue full: 429) / -ESHUTDOWN. On error the job is not run and the
 * handler should return the error. free_arg (may be NULL) is called on arg after the job or
 * when it could not be queued. */
typedef void (*lb_http_job_fn)(struct lb_request *req, void *arg);
int http_defer(struct lb_request *req, lb_http_job_fn job, void *arg, void (*free_arg)(void *),
               struct lb_error *err);

/* Streamed bodies (routes with raw_body). Their handler runs as soon as the headers are
 * complete, before any body byte is read, and defers a job as other handlers do. That job
 * either sets an error response (the body is then never read) or calls http_body_sink to take
 * the body: each chunk is written to sink->fd on the MHD thread as it arrives (plain write()s;
 * the body is never held in memory), and once all of it is there, finish(req, arg) runs on the
 * pool and sets the response. A body that does not arrive whole (client gone, larger than
 * max_file_bytes, a failed write, the daemon stopping) calls abort(arg) instead, on an MHD
 * thread: it must not block. Exactly one of finish and abort runs, once; it owns arg. The
 * sink's fd stays the caller's (close it in finish/abort). Call only from the opening job. */
struct lb_body_sink {
    int fd;
    lb_http_job_fn finish;
    void (*abort)(void *arg);
    /* Optional, before abort when a write to fd failed (errnum, bytes written or tried): the
     * error to answer with (e.g. -EFBIG naming the limit that was hit). */
    int (*write_failed)(void *arg, int errnum, uint64_t bytes, struct lb_error *err);
    void *arg;
};
void http_body_sink(struct lb_request *req, const struct lb_body_sink *sink);

#endif
