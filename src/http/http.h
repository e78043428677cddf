/*
 * http.h - lendbox's HTTP front end: the one adapter around libmicrohttpd.
 *
 * It owns the listening socket, connection bounds (an absolute deadline for a request's line
 * and headers, a per-address cap on connections still sending them), request-head limits
 * (414/431), a UTF-8 check of the URL (400), routing (method + path pattern, 404/405),
 * bearer-token authentication (through the app's authorize hook), request-body limits (413,
 * also for chunked bodies and bodies longer than announced), JSON errors, X-Request-Id and
 * latency metrics. Handlers never block: long work goes through http_defer, which suspends the MHD
 * connection, runs the job on the worker pool and resumes the connection when the job has set
 * a response. A job runs to its end even if the client hangs up (stops are never abandoned).
 *
 * The rule: the pool is for work that computes or blocks on a provider; waiting is parked.
 * A request that waits for something to happen (a long-poll, output that is not there yet)
 * holds no worker: its handler parks it (http_park: suspended, no job, a deadline) and
 * whoever makes the event wakes it (http_wake, from any thread); its answer is then rendered
 * on an MHD thread from memory. A job that produces a body over time (streamed exec output)
 * starts a streamed response (http_stream_begin) and writes to it; the connection is suspended
 * whenever it has nothing to send, and a slow client never blocks the writer.
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
    LB_AUTH_PTY,     /* admin, or the operate token of the sandbox whose PTY session is
                      * named by param 0 */
    LB_AUTH_CONTEXT, /* admin, or the operate token of the sandbox whose code context is
                      * named by param 0 */
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
 * LB_AUTH_SANDBOX routes (the session id for LB_AUTH_SESSION ones, the PTY session id for
 * LB_AUTH_PTY ones, the context id for LB_AUTH_CONTEXT ones), else NULL. Called on an MHD
 * thread: must not block on a provider. */
typedef int (*lb_authorize_fn)(void *app, const char *token, enum lb_auth_need need,
                               const char *sandbox_id, enum lb_principal *who,
                               struct lb_error *err);

struct lb_http_config {
    int listen_fd;                 /* from http_bind; http_start takes it over */
    unsigned threads;              /* MHD thread pool size */
    unsigned connection_timeout_s; /* idle bound while a request is under way */
    unsigned header_timeout_s;     /* a connection's request line and headers must be in within
                                    * this of its accept (or of its previous request's end);
                                    * past it the connection is closed */
    unsigned max_connections;      /* open connections at most; more are closed at accept */
    unsigned per_ip_connections;   /* open connections from one client address at most */
    unsigned per_ip_incomplete;    /* connections of one client address still sending their
                                    * request line and headers; another one closes the oldest
                                    * (0: no cap) */
    size_t max_body_bytes;         /* JSON bodies */
    size_t max_file_bytes;         /* raw file bodies (streamed) */
    size_t max_archive_bytes;      /* the raw body of the route named archive_route */
    const char *archive_route;     /* a raw_body route's name (metrics label) whose body is an
                                    * archive bounded by max_archive_bytes, not max_file_bytes;
                                    * NULL: none */
    size_t max_inflight_bytes;     /* buffered body bytes of all requests together; 0: no cap */
    size_t max_answer_bytes;       /* bytes of answers rendered in memory (being made or not yet
                                    * sent) of all requests together; one bearer token may hold
                                    * a quarter of it, or any one answer; 0: no cap */
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
/* Stop listening and serving; every deferred job must have finished (pool_stop first). Parked
 * requests are ended first (http_end_parked). */
void http_stop(struct lb_http *h);

/* --- used by handlers and jobs --- */

void *http_app(struct lb_request *req);
/* The server the request came to. */
struct lb_http *http_server(struct lb_request *req);
/* The i-th '*' segment of the matched pattern, or NULL. */
const char *http_param(struct lb_request *req, unsigned i);
/* A query argument or request header (NULL if absent; "" for a query value holding a NUL, so
 * that it is rejected, not cut short). Only valid on MHD threads (handler). */
const char *http_query(struct lb_request *req, const char *key);
const char *http_header(struct lb_request *req, const char *name);
/* Who the request was authorized as (set before the handler runs). */
enum lb_principal http_principal(struct lb_request *req);
/* Check req's bearer token again, now, through the app's authorize hook, as when its headers
 * came and when its job started: 0, or the hook's error (an operate token a reset revoked
 * since: 401; a fence raised since: 409). For a job whose act must not outlive its token:
 * call it after taking what keeps the token from changing (routes_operate_enter). On the
 * request's own job thread only. */
int http_reauthorize(struct lb_request *req, struct lb_error *err);
/* The whole request body (empty for raw_body routes: theirs streams, see http_body_sink). */
const struct lb_buf *http_body(struct lb_request *req);
/* Parse the body as one JSON object (depth-limited). -EINVAL with a message if not. The
 * caller owns *out. An empty body parses as {} when allow_empty. */
int http_body_json(struct lb_request *req, bool allow_empty, json_t **out, struct lb_error *err);

/* Responses: each sets the request's one response (a second call replaces the first). */
void http_respond_json(struct lb_request *req, unsigned status, json_t *body); /* steals body */
void http_respond_error(struct lb_request *req, const struct lb_error *err);
/* {"error": {"code": code, "message": message}} for bodies that are not a whole response (an
 * error line of a stream). A message that is not valid UTF-8 gets U+FFFD for each invalid
 * byte, so the result is never NULL for that reason (NULL only when out of memory). The caller
 * owns the result. Thread-safe. */
json_t *http_error_json(const char *code, const char *message);
void http_respond_empty(struct lb_request *req, unsigned status);
void http_respond_text(struct lb_request *req, unsigned status, const char *content_type,
                       char *data, size_t len); /* steals data (malloc'd) */
/* Serve size bytes from fd (which the response then owns and closes). */
void http_respond_fd(struct lb_request *req, unsigned status, int fd, uint64_t size);
/* http_respond_fd, then done(done_arg) once fd is closed: when the response has been sent or
 * dropped (its client gone), or at once when no response could be made. done (may be NULL) runs
 * on whichever thread lets go of the response; it must not block. */
void http_respond_fd_done(struct lb_request *req, unsigned status, int fd, uint64_t size,
                          void (*done)(void *), void *done_arg);
/* Serve len bytes of fd from offset (fd owned and closed by the response). */
void http_respond_fd_range(struct lb_request *req, unsigned status, int fd, uint64_t offset,
                           uint64_t len);
/* Add a header to the response set last (Content-Type replaces the one already set). */
void http_response_header(struct lb_request *req, const char *name, const char *value);

/* From a job, before rendering a large answer into memory: reserve up to bytes (an upper bound
 * of what rendering it holds at its peak) of the server's answer budget (max_answer_bytes),
 * charged to the request's bearer token. The reservation shrinks to the answer's size when a
 * response is set, and is given back when the request is done (sent or the client gone).
 * Every answer set with http_respond_text/json of at least 64 KiB is charged so anyway (one
 * over budget is replaced by the 429); answers and reservations under 64 KiB are not charged.
 * Returns 0, or -EAGAIN (429 overloaded, answered with Retry-After: 1) when the total or the
 * token's share is taken by answers in flight. */
int http_answer_reserve(struct lb_request *req, size_t bytes, struct lb_error *err);

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

/* ---------- parking: waiting without a worker ---------- */

/* Why a parked request is being answered. */
enum lb_park_end {
    LB_PARK_WOKEN,    /* http_wake */
    LB_PARK_DEADLINE, /* its deadline passed */
    LB_PARK_GONE,     /* the client closed its connection (nobody will read the answer) */
    LB_PARK_SHUTDOWN, /* the daemon is stopping (http_end_parked / http_stop) */
};

/* The handle of a parked request, shared by http and the waker. */
struct lb_park;

/* Answer a parked request: set its response with http_respond_* (as a handler would), or hand
 * the rest to a worker with http_defer (e.g. to collect results from a provider once the wait
 * is over; an http_defer error is answered by setting an error response). Runs once, on an MHD
 * thread, after the park ended for reason why: it must not block (render from memory; never
 * wait on a provider). arg is the one given to http_park; free_arg runs right after. */
typedef void (*lb_http_park_fn)(struct lb_request *req, void *arg, enum lb_park_end why);

/* From a handler, or from a deferred job that finds it has to wait (checking needed a worker):
 * park req until http_wake(*park_out), deadline_ms (absolute, the
 * clock_mono_ms clock; <= now ends it at once) or shutdown, whichever comes first; then
 * answer(req, arg, why) sets the response. The connection is suspended meanwhile: no worker
 * is held, no connection timeout runs. A client that hangs up is noticed within about a
 * second (LB_PARK_GONE).
 * park_out (may be NULL) receives a reference for the waker, which must drop it with
 * http_park_release once it will not call http_wake any more (the handle stays valid, and
 * http_wake harmless, until then). Register it where the event's producer finds it before
 * checking, under the producer's lock, that the event has not already happened, so no wake
 * is lost; it is safe for http_wake to run before the handler returns.
 * Returns 0, or -ESHUTDOWN (503-worthy: the daemon is stopping) or -ENOMEM with nothing
 * parked and free_arg already called on arg. A handler returns what http_park returned; a job
 * answers an error itself. After a successful call from a job, the job must not touch req
 * again (the park may end, and the request be answered, at once). Not for raw_body routes. */
int http_park(struct lb_request *req, int64_t deadline_ms, lb_http_park_fn answer, void *arg,
              void (*free_arg)(void *), struct lb_park **park_out, struct lb_error *err);
/* A park whose event has no producer inside the daemon (a file written in a sandbox): http's
 * poll thread calls ready(arg) every first_ms, doubling up to max_ms, until it returns true
 * (the park ends as LB_PARK_WOKEN) or the park ends otherwise. ready runs without http's locks,
 * one park at a time on one thread shared by all polled parks: it may read the store or a
 * file, but must be quick and must not wait on a provider. free_arg(arg) runs when the
 * handle is freed (after the last ready), under http's lock: it must only free. */
struct lb_park_poll {
    bool (*ready)(void *arg);
    void *arg;
    void (*free_arg)(void *arg);
    int64_t first_ms, max_ms;
};

/* http_park with a polled condition instead of a waker's handle (see struct lb_park_poll);
 * same answer, deadline, errors and ownership of arg. */
int http_park_poll(struct lb_request *req, int64_t deadline_ms, const struct lb_park_poll *poll,
                   lb_http_park_fn answer, void *arg, void (*free_arg)(void *),
                   struct lb_error *err);

/* End the park (reason LB_PARK_WOKEN) so the request gets answered. Any thread, any number of
 * times: true only for the call that ended it (false if a deadline, the client or shutdown
 * ended it first). Does not block beyond a short lock; never calls answer itself. */
bool http_wake(struct lb_park *park);
/* Drop the waker's reference (NULL-safe). Any thread, also after http_stop (the server's
 * memory is freed with its last handle). */
void http_park_release(struct lb_park *park);
/* Requests parked right now (for metrics and tests). */
size_t http_parked_count(struct lb_http *h);
/* Shutdown: refuse new parks (-ESHUTDOWN) and end every parked request (LB_PARK_SHUTDOWN),
 * waiting up to about 5 s for their answers to go out. http_stop calls it before
 * stopping libmicrohttpd; call it earlier (when draining starts) so long-polls are answered at
 * once. Idempotent. */
void http_end_parked(struct lb_http *h);

/* ---------- streamed responses ---------- */

/* A response body written over time by a deferred job (chunked transfer encoding). */
struct lb_stream;

/* From a deferred job: answer req now with status, content_type and a body the job then writes
 * with http_stream_write. After this call the job must not touch req again (the client may
 * finish with it at any time); the stream stays the job's until it returns, when http ends the
 * body if http_stream_end was not called. Returns the stream, or NULL (out of memory: then
 * nothing was sent and the job answers as usual). Call at most once per request. */
struct lb_stream *http_stream_begin(struct lb_request *req, unsigned status,
                                    const char *content_type);
/* Queue len bytes for the client. Never blocks on the client: bytes wait in memory until it
 * reads them, so the writer bounds the total it writes (streamed exec: the output caps).
 * Returns 0, -EPIPE once the client is gone (the bytes are dropped; the job may carry on or
 * stop, nobody reads), -ENOMEM. Only from the job that began the stream. */
int http_stream_write(struct lb_stream *s, const void *data, size_t len);
/* Queue line (a JSON value; the call steals the reference, NULL allowed) as one compact ASCII
 * JSON text and a newline. Returns true when both are queued; false when line is NULL, cannot
 * be dumped, or the client is gone. Only from the job that began the stream. */
bool http_stream_write_json_line(struct lb_stream *s, json_t *line);
/* Charge bytes (what the next writes will hold at most) to the answer budget of the request
 * that began s (see http_answer_reserve), until the response goes. Returns 0, -EAGAIN (over
 * the budget: write a short error line instead), -EPIPE (the client is gone). */
int http_stream_reserve(struct lb_stream *s, size_t bytes);
/* Bytes written to s that the client has not taken yet (0 once it is gone). A writer that
 * produces without bound (a follower of a growing file) stops while this exceeds its own
 * bound, so a client that reads nothing cannot make the daemon hold more. Any thread. */
size_t http_stream_queued(struct lb_stream *s);
/* Call fn(arg) each time the client has taken every queued byte (fn NULL: stop). fn runs on
 * an MHD thread under the stream's lock: it must be quick and must not block or touch the
 * stream (write a byte to a non-blocking pipe). Once this returns with fn NULL, fn is not
 * running and will not run, so arg may be freed. Any thread. */
void http_stream_on_drain(struct lb_stream *s, void (*fn)(void *arg), void *arg);
/* End the body (the client gets the end once it has read the rest). Later writes are
 * -EPIPE. */
void http_stream_end(struct lb_stream *s);
/* From the job that began the stream: keep it past the job's return (the job's return does
 * not end the body), for a writer that produces the rest without a worker (a follower thread
 * woken by file events). The keeper owns a reference: it may then write and end the stream
 * from any one thread at a time, and must end it and drop the reference with
 * http_stream_release. End every kept stream before http_stop (a stream waiting for bytes
 * holds its connection suspended). */
void http_stream_keep(struct lb_stream *s);
/* Drop a keeper's reference (NULL-safe); any thread. */
void http_stream_release(struct lb_stream *s);

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
    /* Optional: called (on the MHD thread, so it must be brief) before a chunk is written:
     * need is the bytes so far with it, want adds room (1 MiB, else as many bytes as came so
     * far, at most 16 MiB; never past the body's limit or its
     * Content-Length); it is called for every chunk and must return at once when need is
     * reserved already. An error ends the upload as a failed write does. */
    int (*reserve)(void *arg, uint64_t need, uint64_t want, struct lb_error *err);
    void *arg;
};
void http_body_sink(struct lb_request *req, const struct lb_body_sink *sink);

#endif
