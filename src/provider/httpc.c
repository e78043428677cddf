/*
 * httpc.c - capped libcurl requests over a unix socket (see httpc.h).
 */
#include "provider/httpc.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>
#include <unistd.h>

struct lb_httpc {
    char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char *base_path;
};

int httpc_global_init(void)
{
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -EIO;
}

int httpc_new(const char *socket_path, const char *base_path, struct lb_httpc **out,
              struct lb_error *err)
{
    struct lb_httpc *c;

    if (!socket_path || strlen(socket_path) >= sizeof(c->socket_path))
        return lb_error_set(err, -EINVAL, "socket path '%s' is too long",
                            socket_path ? socket_path : "");
    c = calloc(1, sizeof(*c));
    if (!c || !(c->base_path = strdup(base_path ? base_path : ""))) {
        free(c);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    snprintf(c->socket_path, sizeof(c->socket_path), "%s", socket_path);
    *out = c;
    return 0;
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

void httpc_free(struct lb_httpc *c)
{
    if (!c)
        return;
    free(c->base_path);
    free(c);
}

void httpc_response_release(struct lb_httpc_response *resp)
{
    if (!resp)
        return;
    lb_buf_release(&resp->body);
    free(resp->header_value);
    resp->header_value = NULL;
}

struct transfer {
    const struct lb_httpc_request *req;
    struct lb_httpc_response *resp;
    int sink_rc;      /* a sink's errno, or -EFBIG */
    uint64_t fd_left; /* body bytes still to read from body_fd */
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

static size_t on_header(char *line, size_t size, size_t nmemb, void *arg)
{
    struct transfer *t = arg;
    size_t n = size * nmemb, name_len;
    const char *want = t->req->want_header;

    if (!want)
        return n;
    name_len = strlen(want);
    if (n > name_len + 1 && strncasecmp(line, want, name_len) == 0 && line[name_len] == ':') {
        const char *v = line + name_len + 1;
        size_t vlen = n - name_len - 1;

        while (vlen && (*v == ' ' || *v == '\t'))
            v++, vlen--;
        while (vlen && (v[vlen - 1] == '\r' || v[vlen - 1] == '\n' || v[vlen - 1] == ' '))
            vlen--;
        free(t->resp->header_value);
        t->resp->header_value = strndup(v, vlen);
    }
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
    char url[8192], ctype[256];
    CURLcode cc;
    CURL *h;
    int r = 0;

    memset(resp, 0, sizeof(*resp));
    lb_buf_init(&resp->body, req->max_body_bytes);
    if (snprintf(url, sizeof(url), "http://localhost%s%s", c->base_path, req->path) >=
        (int)sizeof(url))
        return lb_error_set(err, -EINVAL, "request path is too long");
    h = curl_easy_init();
    if (!h)
        return lb_error_set(err, -ENOMEM, "cannot make a curl handle");
    curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, c->socket_path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(req->timeout_ms > 0 ? req->timeout_ms : 30000));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
    if (req->abort) {
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, &t);
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    }
    /* no "Expect: 100-continue" round trip for uploads */
    hdrs = curl_slist_append(hdrs, "Expect:");
    if (req->body || req->body_fd > 0) {
        snprintf(ctype, sizeof(ctype), "Content-Type: %s",
                 req->content_type ? req->content_type : "application/json");
        hdrs = curl_slist_append(hdrs, ctype);
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    if (strcmp(req->method, "HEAD") == 0) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (req->body_fd > 0) {
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, &t);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)req->body_fd_len);
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
    } else if (req->body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, req->body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
    } else if (strcmp(req->method, "GET") != 0) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
        if (strcmp(req->method, "POST") == 0) {
            curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
            curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
        }
    }
    cc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &resp->status);
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
        r = lb_error_set(err, -ECONNREFUSED, "cannot reach the engine at %s: %s", c->socket_path,
                         curl_easy_strerror(cc));
    } else {
        r = lb_error_set(err, -EIO, "%s %s to the engine failed: %s", req->method, req->path,
                         curl_easy_strerror(cc));
    }
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    return r;
}
