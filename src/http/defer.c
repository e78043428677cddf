/*
 * defer.c - deferral: a handler's job runs on the worker pool (with a serial or fair-share key)
 * while its connection is suspended, and resumes the connection once it has set a response.
 */
#include "http/http_internal.h"

#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <stdio.h>

#include "util/log.h"

/* Jobs of one serial key (one resources session) that may wait behind its running one. */
#define HTTP_SERIAL_BACKLOG_MAX 64

/* ---------- deferral ---------- */

/* Whether the client of a suspended request has closed its side (or reset) the connection:
 * nobody is left to read an answer. */
bool http_request_client_gone(struct lb_request *req)
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

static void http_job_run(void *arg)
{
    struct lb_request *req = arg;
    struct http_job_ctx ctx = {0};
    struct MHD_Connection *conn = req->conn;
    void *job_arg = req->job_arg;
    void (*job_free)(void *) = req->job_free;

    struct lb_error err = {0};

    if (http_request_client_gone(req)) {
        /* Abandoned while it waited in the queue: do not start it (a job already running keeps
         * running to its own end). */
        log_info("request %s dropped before it started: the client has disconnected",
                 req->request_id);
        lb_error_set(&err, -EAGAIN, "the client disconnected before the request started");
        http_respond_error(req, &err);
    } else if (req->principal != LB_PRINCIPAL_ADMIN && req->route->auth != LB_AUTH_NONE &&
               http_request_authorize(req, &err) < 0) {
        /* its token was checked when the headers came; what it may do is decided again now,
         * when it acts: a token revoked (a reset) or a fence raised since then refuses it */
        log_info("request %s refused when it started: %s", req->request_id, err.message);
        if (req->job_is_finish && req->sink.abort) /* the body's owner removes what it made */
            req->sink.abort(req->sink.arg);
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
        if (!http_stream_kept(ctx.stream))
            http_stream_end(ctx.stream);
        http_stream_put(ctx.stream);
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
