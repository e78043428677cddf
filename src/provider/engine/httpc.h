/*
 * httpc.h - a small, capped HTTP client (libcurl) over a unix socket or HTTPS with a client
 * certificate and a pinned server key, for providers that talk to an engine's API: the Docker
 * Engine API (docker.c) and LXD (lxd.c).
 *
 * Every request is bounded: a total timeout, a cap on the buffered response body, and an
 * optional abort flag checked while the transfer runs. Response bodies either go into a
 * buffer (capped) or to a sink callback (streams: exec output, tar archives). Request bodies
 * come from memory or from a file descriptor (large uploads, never held in memory).
 *
 * Connections are kept alive and reused: a client keeps up to HTTPC_IDLE_HANDLES idle curl
 * handles, each with its open connection (unix socket, or HTTPS with its TLS session), and a
 * request takes one of them, so sequential calls share one connection and no call pays a new
 * connect or TLS handshake while one is idle. A handle is reused only after a transfer that
 * completed (any HTTP status); one that timed out, was aborted, was refused by its sink or cut
 * short is dropped with its connection. A connection the server closed while idle is replaced
 * by curl without the caller seeing it (the request is sent again on a new one; an fd body is
 * rewound). New handles resume the client's TLS sessions (shared between its handles).
 *
 * Thread-safety: an lb_httpc may be used by any number of threads at once (each request runs
 * on a handle no other thread holds; the idle stack and the TLS session cache are behind the
 * client's locks); httpc_global_init must have run once before threads start; httpc_free only
 * once no request runs.
 */
#ifndef LB_HTTPC_H
#define LB_HTTPC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "util/buf.h"
#include "util/error.h"

struct lb_httpc;

/* How many idle handles (so open connections) a client keeps at most; handles beyond it, made
 * while more requests ran at once, are cleaned up (their connections closed) when given back. */
#define HTTPC_IDLE_HANDLES 16

/* libcurl's process-wide setup; call once from the main thread before any request. Returns 0
 * or -EIO. */
int httpc_global_init(void);

/* A client for the HTTP server on the unix socket socket_path; paths of later requests are
 * prefixed with base_path (e.g. "/v1.41"; NULL or "" for none). *out is owned by the caller
 * (httpc_free). Returns 0, -EINVAL (path too long) or -ENOMEM. */
int httpc_new(const char *socket_path, const char *base_path, struct lb_httpc **out,
              struct lb_error *err);
/* How an HTTPS client authenticates (httpc_new_https): all three are PEM files. */
struct lb_httpc_tls {
    const char *cert;        /* client certificate (the engine trusts it) */
    const char *key;         /* its private key */
    const char *server_cert; /* the server's certificate: its public key is pinned
                              * (CURLOPT_PINNEDPUBLICKEY, sha256 of the SubjectPublicKeyInfo);
                              * the name and the CA chain are not checked, the pin is (a
                              * cluster's certificate names no member address) */
};

/* A client for the HTTPS server at origin ("https://host:port", no path), authenticated with
 * tls (see struct lb_httpc_tls). The files are read and every TLS option is tried on a curl
 * handle here, so a certificate, key or pin that cannot be used is refused now (-EINVAL, err
 * naming the file or option) rather than at the first request. Paths of requests are prefixed
 * with base_path. *out is the caller's (httpc_free). -EINVAL, -ENOMEM. */
int httpc_new_https(const char *origin, const struct lb_httpc_tls *tls, const char *base_path,
                    struct lb_httpc **out, struct lb_error *err);
/* Where the client connects ("unix:PATH" or the https origin), for messages; borrowed. */
const char *httpc_endpoint(const struct lb_httpc *c);

/* Change the path prefix (API version negotiated after the first request). Not thread-safe:
 * call before the client is shared. Returns 0 or -ENOMEM. */
int httpc_set_base_path(struct lb_httpc *c, const char *base_path);
/* Free c: its idle handles (closing their connections), its TLS sessions, its strings.
 * NULL-safe. No request may run on c any more. */
void httpc_free(struct lb_httpc *c);

/* How many connections c's requests have opened so far (each connect, TLS or not; a reused
 * connection adds nothing). Thread-safe. */
long httpc_connections(struct lb_httpc *c);

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
    const char *want_header;    /* name of a response header whose value is wanted, or NULL */
    const char *want_header2;   /* a second one, or NULL */
    const char *const *headers; /* NULL-terminated extra "Name: value" request headers, or NULL */
    atomic_bool *abort;         /* non-NULL: the transfer ends with -ECANCELED once it is true */
};

struct lb_httpc_response {
    long status;         /* HTTP status; 0 when none came */
    struct lb_buf body;  /* buffered body (when no sink); release with httpc_response_release */
    char *header_value;  /* value of want_header (malloc'd), or NULL */
    char *header_value2; /* value of want_header2 (malloc'd), or NULL */
};

/* Run one request. Returns 0 when a response came (any status: the caller judges it),
 * -ETIMEDOUT when timeout_ms passed, -ECONNREFUSED when the socket or host cannot be reached
 * (engine down), -EINVAL when curl refused an option (nothing was sent), -EFBIG over
 * max_body_bytes, a sink's errno, -ECANCELED on abort, or -EIO for other transport failures; err
 * says which. resp is filled as far as it got either way (release it in every case). */
int httpc_do(struct lb_httpc *c, const struct lb_httpc_request *req, struct lb_httpc_response *resp,
             struct lb_error *err);

/* httpc_do with a small JSON body: body (NULL: none) sent compact as req's body
 * (application/json). The same returns, and -ENOMEM when body cannot be written out. */
int httpc_call_json(struct lb_httpc *c, struct lb_httpc_request *req, const json_t *body,
                    struct lb_httpc_response *resp, struct lb_error *err);

/* A response's buffered body parsed as JSON: a new reference (the caller's), or NULL when
 * there is no body or it is not JSON. */
json_t *httpc_response_json(const struct lb_httpc_response *resp);

/* The string member key of a JSON answer (an engine's error text: Docker's "message", LXD's
 * "error") into buf; "(no message)" when there is none or it is empty. Returns buf. */
const char *httpc_json_message(const struct lb_httpc_response *resp, const char *key, char *buf,
                               size_t size);

/* Free what a response holds (safe on a zeroed one). */
void httpc_response_release(struct lb_httpc_response *resp);

#endif
