/*
 * httpc.c - capped libcurl requests over a unix socket or HTTPS (see httpc.h). Every
 * curl_easy_setopt result is checked: a request whose options curl refused is not sent.
 *
 * Connections are kept alive: a client keeps a bounded stack of idle curl easy handles, each
 * holding its connection (and TLS session) in its own connection cache. A request takes one
 * (or makes one when none is idle), resets its options (curl_easy_reset keeps the connection)
 * and gives it back when the transfer completed; a handle whose transfer failed in any way
 * (timeout, abort, a sink's refusal, a cut answer) is cleaned up with its connection, never
 * reused. Handles made when the stack is empty resume TLS sessions from a share object
 * (CURL_LOCK_DATA_SSL_SESSION; connections themselves are not shared: libcurl does not support
 * sharing them between concurrent threads), so no request pays a full handshake once one has
 * been made. curl tests an idle connection before reusing it and retries a request once on a
 * fresh connection when a reused one turns out closed (an fd body is rewound, see on_seek).
 */
#include "provider/engine/httpc.h"
#include "util/log.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/mem.h"

struct lb_httpc {
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)]; /* "" for https */
    char *origin; /* "http://localhost" (unix socket) or "https://host:port" */
    char *base_path;
    char *cert, *key; /* https: client certificate and key files */
    char *pin;        /* https: "sha256//BASE64" of the server's public key */
    char endpoint[300];
    pthread_mutex_t idle_lock;      /* guards idle and n_idle */
    CURL *idle[HTTPC_IDLE_HANDLES]; /* handles whose last transfer completed, options reset */
    size_t n_idle;
    CURLSH *share; /* TLS sessions (and DNS) for every handle of this client */
    pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
    atomic_long connects; /* connections opened so far */
};

/* Set one curl option; on failure remember the first option curl refused. */
#define SETOPT(h, opt, val, bad)                                                                   \
    do {                                                                                           \
        if (curl_easy_setopt((h), (opt), (val)) != CURLE_OK && !*(bad))                            \
            *(bad) = #opt;                                                                         \
    } while (0)

int httpc_global_init(void)
{
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -EIO;
}

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *arg)
{
    struct lb_httpc *c = arg;

    (void)h;
    (void)access;
    if ((int)data >= 0 && data < CURL_LOCK_DATA_LAST)
        pthread_mutex_lock(&c->share_locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *arg)
{
    struct lb_httpc *c = arg;

    (void)h;
    if ((int)data >= 0 && data < CURL_LOCK_DATA_LAST)
        pthread_mutex_unlock(&c->share_locks[data]);
}

/* A zeroed client's pool: its locks and the TLS session share. 0 or -ENOMEM. */
static int pool_init(struct lb_httpc *c)
{
    pthread_mutex_init(&c->idle_lock, NULL);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&c->share_locks[i], NULL);
    c->share = curl_share_init();
    if (!c->share || curl_share_setopt(c->share, CURLSHOPT_LOCKFUNC, share_lock) != CURLSHE_OK ||
        curl_share_setopt(c->share, CURLSHOPT_UNLOCKFUNC, share_unlock) != CURLSHE_OK ||
        curl_share_setopt(c->share, CURLSHOPT_USERDATA, c) != CURLSHE_OK ||
        curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION) != CURLSHE_OK ||
        curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS) != CURLSHE_OK)
        return -ENOMEM;
    return 0;
}

/* An idle handle of c (options reset, its connection kept), or a new one on c's share; NULL
 * when curl cannot make one. */
static CURL *handle_take(struct lb_httpc *c)
{
    CURL *h = NULL;

    pthread_mutex_lock(&c->idle_lock);
    if (c->n_idle > 0)
        h = c->idle[--c->n_idle];
    pthread_mutex_unlock(&c->idle_lock);
    if (h)
        return h;
    h = curl_easy_init();
    if (h && curl_easy_setopt(h, CURLOPT_SHARE, c->share) != CURLE_OK) {
        curl_easy_cleanup(h);
        h = NULL;
    }
    return h;
}

/* Give h back after a request: kept idle (options reset, so it holds no pointer into the
 * request) when reusable and there is room, else cleaned up with its connection. */
static void handle_give(struct lb_httpc *c, CURL *h, bool reusable)
{
    if (reusable) {
        curl_easy_reset(h);
        pthread_mutex_lock(&c->idle_lock);
        if (c->n_idle < HTTPC_IDLE_HANDLES) {
            c->idle[c->n_idle++] = h;
            h = NULL;
        }
        pthread_mutex_unlock(&c->idle_lock);
    }
    if (h)
        curl_easy_cleanup(h);
}

int httpc_new(const char *socket_path, const char *base_path, struct lb_httpc **out,
              struct lb_error *err)
{
    struct lb_httpc *c;

    if (!socket_path || strlen(socket_path) >= sizeof(c->socket_path))
        return lb_error_set(err, -EINVAL, "socket path '%s' is too long",
                            socket_path ? socket_path : "");
    c = calloc(1, sizeof(*c));
    if (!c)
        return lb_error_set(err, -ENOMEM, "out of memory");
    snprintf(c->socket_path, sizeof(c->socket_path), "%s", socket_path);
    snprintf(c->endpoint, sizeof(c->endpoint), "unix:%s", socket_path);
    c->base_path = strdup(base_path ? base_path : "");
    c->origin = strdup("http://localhost");
    if (pool_init(c) < 0 || !c->base_path || !c->origin) {
        httpc_free(c);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    *out = c;
    return 0;
}

const char *httpc_endpoint(const struct lb_httpc *c)
{
    return c->endpoint;
}

/* "sha256//BASE64" of the public key of the PEM certificate in path into *pin (malloc'd). */
static int pin_of_cert(const char *path, char **pin, struct lb_error *err)
{
    unsigned char *der = NULL, md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    char b64[4 * ((EVP_MAX_MD_SIZE + 2) / 3) + 1];
    X509 *x = NULL;
    FILE *f = fopen(path, "re");
    int len, r = 0;

    if (!f)
        return lb_error_set(err, -EINVAL, "cannot read the server certificate '%s': %s", path,
                            strerror(errno));
    x = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    if (!x)
        return lb_error_set(err, -EINVAL, "'%s' is not a PEM certificate", path);
    len = i2d_X509_PUBKEY(X509_get_X509_PUBKEY(x), &der);
    if (len <= 0 || !EVP_Digest(der, (size_t)len, md, &md_len, EVP_sha256(), NULL)) {
        r = lb_error_set(err, -EINVAL, "cannot hash the public key of '%s'", path);
        goto out;
    }
    EVP_EncodeBlock((unsigned char *)b64, md, (int)md_len);
    if (asprintf(pin, "sha256//%s", b64) < 0) {
        *pin = NULL;
        r = lb_error_set(err, -ENOMEM, "out of memory");
    }
out:
    OPENSSL_free(der);
    X509_free(x);
    return r;
}

/* The TLS options of an https client on h; the name of the first one curl refused into *bad. */
static void set_tls(const struct lb_httpc *c, CURL *h, const char **bad)
{
    SETOPT(h, CURLOPT_PROTOCOLS_STR, "https", bad);
    SETOPT(h, CURLOPT_SSLCERT, c->cert, bad);
    SETOPT(h, CURLOPT_SSLCERTTYPE, "PEM", bad);
    SETOPT(h, CURLOPT_SSLKEY, c->key, bad);
    SETOPT(h, CURLOPT_SSLKEYTYPE, "PEM", bad);
    /* the pin is the check: the cluster certificate names no member address */
    SETOPT(h, CURLOPT_PINNEDPUBLICKEY, c->pin, bad);
    SETOPT(h, CURLOPT_SSL_VERIFYPEER, 0L, bad);
    SETOPT(h, CURLOPT_SSL_VERIFYHOST, 0L, bad);
}

int httpc_new_https(const char *origin, const struct lb_httpc_tls *tls, const char *base_path,
                    struct lb_httpc **out, struct lb_error *err)
{
    const char *bad = NULL;
    struct lb_httpc *c;
    CURL *h;
    int r;

    if (!origin || strncmp(origin, "https://", 8) != 0 || strchr(origin + 8, '/'))
        return lb_error_set(err, -EINVAL, "'%s' is not an https://host:port origin",
                            origin ? origin : "");
    if (!tls || !tls->cert || !tls->key || !tls->server_cert)
        return lb_error_set(err, -EINVAL,
                            "https needs a client certificate, its key and the server's "
                            "certificate");
    if (access(tls->cert, R_OK) < 0 || access(tls->key, R_OK) < 0)
        return lb_error_set(err, -EINVAL, "cannot read the client certificate '%s' or key '%s'",
                            tls->cert, tls->key);
    c = calloc(1, sizeof(*c));
    if (!c)
        return lb_error_set(err, -ENOMEM, "out of memory");
    snprintf(c->endpoint, sizeof(c->endpoint), "%s", origin);
    c->origin = strdup(origin);
    c->base_path = strdup(base_path ? base_path : "");
    c->cert = strdup(tls->cert);
    c->key = strdup(tls->key);
    if (pool_init(c) < 0 || !c->origin || !c->base_path || !c->cert || !c->key) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    r = pin_of_cert(tls->server_cert, &c->pin, err);
    if (r < 0)
        goto fail;
    /* refuse now what curl would refuse at every request (no TLS backend, no pinning, ...) */
    h = curl_easy_init();
    if (!h) {
        r = lb_error_set(err, -ENOMEM, "cannot make a curl handle");
        goto fail;
    }
    set_tls(c, h, &bad);
    curl_easy_cleanup(h);
    if (bad) {
        r = lb_error_set(err, -EINVAL,
                         "libcurl refused %s: cannot use the client certificate "
                         "or pin the server's key",
                         bad);
        goto fail;
    }
    *out = c;
    return 0;
fail:
    httpc_free(c);
    return r;
}

int httpc_set_base_path(struct lb_httpc *c, const char *base_path)
{
    char *copy = strdup(base_path ? base_path : "");

    if (!copy)
        return -ENOMEM;
    free(c->base_path);
    c->base_path = copy;
    return 0;
}

long httpc_connections(struct lb_httpc *c)
{
    return atomic_load(&c->connects);
}

void httpc_free(struct lb_httpc *c)
{
    if (!c)
        return;
    char **const strings[] = {&c->origin, &c->base_path, &c->cert, &c->key, &c->pin};

    /* every handle on the share goes before it */
    for (size_t i = 0; i < c->n_idle; i++)
        curl_easy_cleanup(c->idle[i]);
    if (c->share)
        curl_share_cleanup(c->share);
    pthread_mutex_destroy(&c->idle_lock);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&c->share_locks[i]);
    mem_free_strings(strings, sizeof(strings) / sizeof(strings[0]));
    free(c);
}

void httpc_response_release(struct lb_httpc_response *resp)
{
    if (!resp)
        return;
    lb_buf_release(&resp->body);
    free(resp->header_value);
    resp->header_value = NULL;
    free(resp->header_value2);
    resp->header_value2 = NULL;
}

struct transfer {
    const struct lb_httpc_request *req;
    struct lb_httpc_response *resp;
    int sink_rc;      /* a sink's errno, or -EFBIG */
    uint64_t fd_left; /* body bytes still to read from body_fd */
    off_t fd_start;   /* body_fd's offset when the request began; < 0: it cannot seek */
};

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    struct transfer *t = arg;
    size_t n = size * nmemb;

    if (t->req->sink) {
        int r = t->req->sink(data, n, t->req->sink_arg);

        if (r < 0) {
            t->sink_rc = r;
            return 0;
        }
        return n;
    }
    if (lb_buf_append(&t->resp->body, data, n) < 0) {
        t->sink_rc = -EFBIG;
        return 0;
    }
    return n;
}

/* The value of header want in line (n bytes) into *out (malloc'd), when line is it. */
static void header_pick(const char *line, size_t n, const char *want, char **out)
{
    size_t name_len;

    if (!want)
        return;
    name_len = strlen(want);
    if (n > name_len + 1 && strncasecmp(line, want, name_len) == 0 && line[name_len] == ':') {
        const char *v = line + name_len + 1;
        size_t vlen = n - name_len - 1;

        while (vlen && (*v == ' ' || *v == '\t'))
            v++, vlen--;
        while (vlen && (v[vlen - 1] == '\r' || v[vlen - 1] == '\n' || v[vlen - 1] == ' '))
            vlen--;
        free(*out);
        *out = strndup(v, vlen);
    }
}

static size_t on_header(char *line, size_t size, size_t nmemb, void *arg)
{
    struct transfer *t = arg;
    size_t n = size * nmemb;

    header_pick(line, n, t->req->want_header, &t->resp->header_value);
    header_pick(line, n, t->req->want_header2, &t->resp->header_value2);
    return n;
}

static size_t on_read(char *buf, size_t size, size_t nmemb, void *arg)
{
    struct transfer *t = arg;
    size_t want = size * nmemb;
    ssize_t got;

    if (t->fd_left == 0)
        return 0;
    if (want > t->fd_left)
        want = (size_t)t->fd_left;
    do
        got = read(t->req->body_fd, buf, want);
    while (got < 0 && errno == EINTR);
    if (got <= 0) {
        t->sink_rc = -EIO;
        return CURL_READFUNC_ABORT;
    }
    t->fd_left -= (uint64_t)got;
    return (size_t)got;
}

/* curl rewinds the body to resend it (a reused connection found closed): back to where the
 * request began, offset bytes on. */
static int on_seek(void *arg, curl_off_t offset, int origin)
{
    struct transfer *t = arg;

    if (origin != SEEK_SET || offset < 0 || (uint64_t)offset > t->req->body_fd_len ||
        t->fd_start < 0)
        return CURL_SEEKFUNC_CANTSEEK;
    if (lseek(t->req->body_fd, t->fd_start + (off_t)offset, SEEK_SET) < 0)
        return CURL_SEEKFUNC_FAIL;
    t->fd_left = t->req->body_fd_len - (uint64_t)offset;
    return CURL_SEEKFUNC_OK;
}

/* Every connection's socket is close-on-exec: connections now stay open between requests,
 * and a process the daemon starts meanwhile must not inherit one (a unix socket to LXD or
 * docker is root on the host). */
static curl_socket_t on_open_socket(void *arg, curlsocktype purpose, struct curl_sockaddr *a)
{
    (void)arg;
    (void)purpose;
    return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    struct transfer *t = arg;

    return t->req->abort && atomic_load(t->req->abort) ? 1 : 0;
}

int httpc_do(struct lb_httpc *c, const struct lb_httpc_request *req, struct lb_httpc_response *resp,
             struct lb_error *err)
{
    struct transfer t = {.req = req, .resp = resp, .fd_left = req->body_fd_len};
    struct curl_slist *hdrs = NULL;
    const char *bad = NULL;
    char url[8192], ctype[256];
    CURLcode cc = CURLE_OK;
    long connects = 0;
    CURL *h;
    int r = 0;

    memset(resp, 0, sizeof(*resp));
    lb_buf_init(&resp->body, req->max_body_bytes);
    if (snprintf(url, sizeof(url), "%s%s%s", c->origin, c->base_path, req->path) >=
        (int)sizeof(url))
        return lb_error_set(err, -EINVAL, "request path is too long");
    h = handle_take(c);
    if (!h)
        return lb_error_set(err, -ENOMEM, "cannot make a curl handle");
    if (c->socket_path[0])
        SETOPT(h, CURLOPT_UNIX_SOCKET_PATH, c->socket_path, &bad);
    else
        set_tls(c, h, &bad);
    SETOPT(h, CURLOPT_URL, url, &bad);
    SETOPT(h, CURLOPT_NOSIGNAL, 1L, &bad);
    SETOPT(h, CURLOPT_OPENSOCKETFUNCTION, on_open_socket, &bad);
    SETOPT(h, CURLOPT_TIMEOUT_MS, (long)(req->timeout_ms > 0 ? req->timeout_ms : 30000), &bad);
    SETOPT(h, CURLOPT_WRITEFUNCTION, on_body, &bad);
    SETOPT(h, CURLOPT_WRITEDATA, &t, &bad);
    SETOPT(h, CURLOPT_HEADERFUNCTION, on_header, &bad);
    SETOPT(h, CURLOPT_HEADERDATA, &t, &bad);
    if (req->abort) {
        SETOPT(h, CURLOPT_XFERINFOFUNCTION, on_progress, &bad);
        SETOPT(h, CURLOPT_XFERINFODATA, &t, &bad);
        SETOPT(h, CURLOPT_NOPROGRESS, 0L, &bad);
    }
    /* no "Expect: 100-continue" round trip for uploads */
    hdrs = curl_slist_append(hdrs, "Expect:");
    if (req->body || req->body_fd > 0) {
        snprintf(ctype, sizeof(ctype), "Content-Type: %s",
                 req->content_type ? req->content_type : "application/json");
        hdrs = curl_slist_append(hdrs, ctype);
    }
    for (size_t i = 0; req->headers && req->headers[i]; i++)
        hdrs = curl_slist_append(hdrs, req->headers[i]);
    SETOPT(h, CURLOPT_HTTPHEADER, hdrs, &bad);
    if (strcmp(req->method, "HEAD") == 0) {
        SETOPT(h, CURLOPT_NOBODY, 1L, &bad);
    } else if (req->body_fd > 0) {
        SETOPT(h, CURLOPT_UPLOAD, 1L, &bad);
        SETOPT(h, CURLOPT_READFUNCTION, on_read, &bad);
        SETOPT(h, CURLOPT_READDATA, &t, &bad);
        SETOPT(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)req->body_fd_len, &bad);
        t.fd_start = lseek(req->body_fd, 0, SEEK_CUR);
        SETOPT(h, CURLOPT_SEEKFUNCTION, on_seek, &bad);
        SETOPT(h, CURLOPT_SEEKDATA, &t, &bad);
        SETOPT(h, CURLOPT_CUSTOMREQUEST, req->method, &bad);
    } else if (req->body) {
        SETOPT(h, CURLOPT_POSTFIELDS, req->body, &bad);
        SETOPT(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len, &bad);
        SETOPT(h, CURLOPT_CUSTOMREQUEST, req->method, &bad);
    } else if (strcmp(req->method, "GET") != 0) {
        SETOPT(h, CURLOPT_CUSTOMREQUEST, req->method, &bad);
        if (strcmp(req->method, "POST") == 0) {
            SETOPT(h, CURLOPT_POSTFIELDS, "", &bad);
            SETOPT(h, CURLOPT_POSTFIELDSIZE, 0L, &bad);
        }
    }
    if (bad || !hdrs) {
        r = lb_error_set(err, -EINVAL, "libcurl refused %s; nothing was sent",
                         bad ? bad : "the request headers");
        goto out;
    }
    cc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp->status);
    {
        curl_off_t us = 0;

        /* each call and its time, for profiling a provider (--log-level debug) */
        curl_easy_getinfo(h, CURLINFO_TOTAL_TIME_T, &us);
        log_debug("engine: %s %s: HTTP %ld in %.1f ms", req->method, req->path, resp->status,
                  (double)us / 1000.0);
    }
    if (curl_easy_getinfo(h, CURLINFO_NUM_CONNECTS, &connects) == CURLE_OK && connects > 0)
        atomic_fetch_add(&c->connects, connects);
    if (cc == CURLE_OK) {
        r = 0;
    } else if (t.sink_rc < 0) {
        r = t.sink_rc == -EFBIG
                ? lb_error_set(err, -EFBIG, "the engine's answer is over %zu bytes",
                               req->max_body_bytes)
                : lb_error_keep(err, t.sink_rc, "reading the engine's answer failed");
    } else if (cc == CURLE_ABORTED_BY_CALLBACK) {
        r = lb_error_set(err, -ECANCELED, "the request to the engine was cancelled");
    } else if (cc == CURLE_OPERATION_TIMEDOUT) {
        r = lb_error_set(err, -ETIMEDOUT, "the engine did not answer %s %s within %lld ms",
                         req->method, req->path, (long long)req->timeout_ms);
    } else if (cc == CURLE_COULDNT_CONNECT) {
        r = lb_error_set(err, -ECONNREFUSED, "cannot reach the engine at %s: %s", c->endpoint,
                         curl_easy_strerror(cc));
    } else {
        r = lb_error_set(err, -EIO, "%s %s to the engine failed: %s", req->method, req->path,
                         curl_easy_strerror(cc));
    }
out:
    /* only a handle whose transfer completed is reused: after a timeout, an abort, a sink's
     * refusal or a cut answer its connection is in an unknown state */
    handle_give(c, h, cc == CURLE_OK);
    curl_slist_free_all(hdrs);
    return r;
}

int httpc_call_json(struct lb_httpc *c, struct lb_httpc_request *req, const json_t *body,
                    struct lb_httpc_response *resp, struct lb_error *err)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    int r;

    memset(resp, 0, sizeof(*resp));
    if (body && !text)
        return lb_error_set(err, -ENOMEM, "out of memory");
    if (text) {
        req->body = text;
        req->body_len = strlen(text);
    }
    r = httpc_do(c, req, resp, err);
    if (text) {
        req->body = NULL;
        req->body_len = 0;
    }
    free(text);
    return r;
}

json_t *httpc_response_json(const struct lb_httpc_response *resp)
{
    return resp->body.data ? json_loadb(resp->body.data, resp->body.len, 0, NULL) : NULL;
}

const char *httpc_json_message(const struct lb_httpc_response *resp, const char *key, char *buf,
                               size_t size)
{
    json_t *j = httpc_response_json(resp);
    const char *m = json_string_value(json_object_get(j, key));

    snprintf(buf, size, "%s", m && *m ? m : "(no message)");
    json_decref(j);
    return buf;
}
