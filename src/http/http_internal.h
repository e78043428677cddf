/*
 * http_internal.h - what the files of the HTTP front end share: the server, connection and
 * request structures, and the functions one of them calls in another. Shared by http.c,
 * respond.c, body.c, defer.c, park.c, stream.c and conn.c (src/http/ only; everything else
 * uses http.h).
 *
 * Locks: h->answer_lock guards the answer budget, h->park_lock the parked list and the park
 * handles, h->conn_lock the connections waiting for their headers (functions named *_locked
 * run with it held). A request is touched by one thread at a time (see http.h).
 */
#ifndef LB_HTTP_INTERNAL_H
#define LB_HTTP_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http/http.h"

#define HTTP_MAX_PARAMS 4
#define HTTP_IP_BUCKETS 1024

/* A client address that has connections still sending their request line and headers. */
/* Connections waiting for their request line and headers, oldest first, chained through one
 * of their links (enum conn_link). */
struct conn_list {
    struct http_conn *head, *tail;
};

/* The lists a waiting connection is on: the server's, and its address's. */
enum conn_link { CONN_LINK_SERVER, CONN_LINK_IP };

struct http_ip {
    unsigned char addr[16];
    unsigned char len; /* 4 or 16 */
    size_t waiting;
    struct conn_list conns; /* its waiting connections, oldest first */
    struct http_ip *next;   /* hash chain */
};

/* One TCP connection (libmicrohttpd's socket context), from accept to close. */
struct http_conn {
    struct lb_http *h;
    int fd;
    unsigned char addr[16];
    unsigned char addr_len; /* 0: unknown address (not counted per address) */
    bool waiting;           /* its request line and headers are not all in yet */
    int64_t deadline_ms;    /* ... and must be by then */
    size_t target_len;      /* the current request's target as sent (from the URI log) */
    struct http_ip *ip;     /* while waiting (NULL if unknown or out of memory) */
    struct {
        struct http_conn *prev, *next;
    } link[2]; /* [CONN_LINK_SERVER]: h's waiting list; [CONN_LINK_IP]: ip's */
};

#define ANSWER_SMALL (64 * 1024) /* answers this small are not charged to the answer budget */

/* Answer bytes one bearer token holds (only tokens holding some are listed). */
struct answer_holder {
    uint64_t key;
    size_t bytes;
    struct answer_holder *next;
};

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
    struct lb_park *parked;     /* waiting */
    atomic_size_t park_waiting; /* in the list (changed under park_lock, read without) */
    size_t park_live;           /* parked and not answered yet */
    int64_t park_next_at;       /* when the park thread wakes up next */
    size_t park_handles;        /* lb_park objects alive: h is freed after the last one */
    bool stopped;               /* http_stop is done with h */
    bool park_stopping, park_thread_stop;
    bool park_thread_started;
    pthread_t park_thread;
    /* connections still sending a request line and headers (see conn.c) */
    pthread_mutex_t conn_lock;
    pthread_cond_t conn_cond; /* wakes the watch thread (monotonic clock) */
    pthread_t conn_thread;
    bool conn_thread_started, conn_thread_stop;
    struct conn_list waiting;             /* oldest first: deadline order */
    struct http_ip *ips[HTTP_IP_BUCKETS]; /* addresses with waiting connections */
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
    PHASE_DRAIN,    /* refused before a byte of the body was read (a streamed body's job, or
                       the front end: the in-flight budget): the body is read and dropped,
                       then the response already set goes out */
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
    bool job_is_finish;       /* the deferred job is the body sink's finish (it owns sink.arg) */
    size_t answer_held;       /* bytes of the answer budget this request holds */
    long retry_after_s;       /* a 429's Retry-After (whole seconds); <= 0: 1 */
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

/* What a running job shares with http_stream_begin (on the worker's stack). */
struct http_job_ctx {
    struct lb_stream *stream; /* began: req is no longer the job's */
    bool parked;              /* the job parked req: it is no longer the job's */
};

/* ---- respond.c ---- */

/* A hash of a bearer token, never 0: the key its answer bytes are charged to. */
uint64_t http_token_hash(const char *token);
/* Charge n answer bytes to key (within the total, and a quarter of it per key unless the key
 * holds nothing yet); false when they do not fit. Takes h->answer_lock. */
bool http_answer_take(struct lb_http *h, uint64_t key, size_t n);
/* Give back n answer bytes charged to key. Takes h->answer_lock. */
void http_answer_give(struct lb_http *h, uint64_t key, size_t n);
/* Set req's response to r (replacing one set before; r may be NULL: out of memory), with the
 * headers every answer carries. The request owns r. */
void http_request_set_response(struct lb_request *req, unsigned status, struct MHD_Response *r);
/* Queue the response set (a 500 if none was) on the MHD thread; the request is done. */
enum MHD_Result http_request_queue(struct lb_request *req);
/* Free h's memory once no thread uses it (the last park handle, or http_stop). */
void http_release(struct lb_http *h);

/* ---- body.c ---- */

/* Take n bytes of the in-flight budget for req (max_inflight_bytes; 0: unlimited); false when
 * they do not fit. */
bool http_inflight_take(struct lb_request *req, size_t n);
/* Give back what req holds of the in-flight budget. */
void http_inflight_give_back(struct lb_request *req);
/* The 429 of a full in-flight budget, in err; returns -EAGAIN. */
int http_inflight_error(struct lb_request *req, struct lb_error *err);
/* Buffer a chunk of a JSON body (past a limit, mark the request 413 or 429). */
void http_body_append(struct lb_request *req, const char *data, size_t n);
/* The body will not be complete: abort the open sink, if any (its owner removes what it
 * made). */
void http_sink_abort(struct lb_request *req);
/* The bound of a raw (streamed) body, in bytes. */
size_t http_raw_limit(const struct lb_request *req);
/* Write a chunk of a streamed body to the sink (past the limit or on a failed write, abort it
 * and keep why in req->sink_err). */
void http_sink_write(struct lb_request *req, const char *data, size_t n);
/* The whole streamed body is here: defer the sink's finish job. 0, or a negative errno (the
 * sink then aborted) with err set. */
int http_sink_finish(struct lb_request *req, struct lb_error *err);

/* ---- defer.c ---- */

/* Whether the client of a suspended request has closed (or reset) its connection. */
bool http_request_client_gone(struct lb_request *req);

/* Authorize req by its bearer token through the app's hook (sets req->principal and
 * req->token_key): 0, or the hook's error. Runs when the headers are complete, and again when a
 * job of a request that is not the admin's starts (http_job_run): an operate token revoked
 * meanwhile (a reset mints a new one) or a fence raised meanwhile must stop a request whose
 * body or queue wait came after it. */
int http_request_authorize(struct lb_request *req, struct lb_error *err);

/* ---- park.c ---- */

/* The park thread (deadlines, gone clients) and the poll thread (polled parks); arg is the
 * server. Started by http_start, stopped by http_stop. */
void *http_park_main(void *arg);
void *http_poll_main(void *arg);
/* MHD thread, after a park ended and the connection was resumed: render the answer. */
enum MHD_Result http_park_answer(struct lb_request *req);
/* Request completion: drop whatever park the request still holds. */
void http_park_forget(struct lb_request *req);

/* ---- stream.c ---- */

/* Drop a reference to s (the last frees it). */
void http_stream_put(struct lb_stream *s);
/* Whether s was kept past its job's return (http_stream_keep). */
bool http_stream_kept(struct lb_stream *s);

/* ---- conn.c ---- */

/* c starts (begin) or stops (end) waiting for a request line and headers. h->conn_lock held. */
void http_conn_wait_begin_locked(struct http_conn *c);
void http_conn_wait_end_locked(struct http_conn *c);
/* The tracked connection of conn (its socket context), or NULL. */
struct http_conn *http_conn_of(struct MHD_Connection *conn);
/* libmicrohttpd's NOTIFY_CONNECTION and URI log callbacks; cls is the server. */
void http_notify_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                            enum MHD_ConnectionNotificationCode toe);
void *http_uri_log(void *cls, const char *uri, struct MHD_Connection *conn);
/* The watch thread (header deadlines, warning summaries); arg is the server. */
void *http_conn_main(void *arg);

#endif
