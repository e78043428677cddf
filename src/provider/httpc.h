/*
 * httpc.h - a small, capped HTTP client over a unix socket (libcurl), for providers that talk
 * to an engine's API: the Docker Engine API (docker.c), later LXD.
 *
 * Every request is bounded: a total timeout, a cap on the buffered response body, and an
 * optional abort flag checked while the transfer runs. Response bodies either go into a
 * buffer (capped) or to a sink callback (streams: exec output, tar archives). Request bodies
 * come from memory or from a file descriptor (large uploads, never held in memory).
 *
 * Thread-safety: an lb_httpc may be used by any number of threads at once (each request has
 * its own curl handle); httpc_global_init must have run once before threads start.
 */
#ifndef LB_HTTPC_H
#define LB_HTTPC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"
#include "util/error.h"

struct lb_httpc;

/* libcurl's process-wide setup; call once from the main thread before any request. Returns 0
 * or -EIO. */
int httpc_global_init(void);

/* A client for the HTTP server on the unix socket socket_path; paths of later requests are
 * prefixed with base_path (e.g. "/v1.41"; NULL or "" for none). *out is owned by the caller
 * (httpc_free). Returns 0, -EINVAL (path too long) or -ENOMEM. */
int httpc_new(const char *socket_path, const char *base_path, struct lb_httpc **out,
              struct lb_error *err);
/* Change the path prefix (API version negotiated after the first request). Not thread-safe:
 * call before the client is shared. Returns 0 or -ENOMEM. */
int httpc_set_base_path(struct lb_httpc *c, const char *base_path);
void httpc_free(struct lb_httpc *c);

/* A response sink: consumes n bytes; returns 0 to go on, or a negative errno to abort the
 * transfer (httpc_do then returns that errno). */
typedef int (*lb_httpc_sink)(const void *data, size_t n, void *arg);

struct lb_httpc_request {
    const char *method;       /* "GET", "POST", "PUT", "DELETE", "HEAD" */
    const char *path;         /* absolute path with query, already URL-encoded */
    const char *content_type; /* of the body; NULL: application/json when a body is given */
    const void *body;         /* request body in memory, or NULL */
    size_t body_len;
    int body_fd;           /* > 0: the body is read from this fd (borrowed) ... */
    uint64_t body_fd_len;  /* ... this many bytes, from its current offset */
    int64_t timeout_ms;    /* whole request; > 0 */
    size_t max_body_bytes; /* cap on a buffered response body; over it: -EFBIG */
    lb_httpc_sink sink;    /* non-NULL: the response body goes here, not into the buffer */
    void *sink_arg;
    const char *want_header; /* name of a response header whose value is wanted, or NULL */
    atomic_bool *abort;      /* non-NULL: the transfer ends with -ECANCELED once it is true */
};

struct lb_httpc_response {
    long status;        /* HTTP status; 0 when none came */
    struct lb_buf body; /* buffered body (when no sink); release with httpc_response_release */
    char *header_value; /* value of want_header (malloc'd), or NULL */
};

/* Run one request. Returns 0 when a response came (any status: the caller judges it),
 * -ETIMEDOUT when timeout_ms passed, -ECONNREFUSED/-ENOENT when the socket cannot be reached
 * (engine down), -EFBIG over max_body_bytes, a sink's errno, -ECANCELED on abort, or -EIO
 * for other transport failures; err says which. resp is filled as far as it got either way
 * (release it in every case). */
int httpc_do(struct lb_httpc *c, const struct lb_httpc_request *req, struct lb_httpc_response *resp,
             struct lb_error *err);

/* Free what a response holds (safe on a zeroed one). */
void httpc_response_release(struct lb_httpc_response *resp);

#endif
