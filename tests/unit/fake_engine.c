/*
 * fake_engine.c - the fake Docker Engine / LXD server of the unit tests (see fake_engine.h):
 * its in-memory state, the failure rules, the libmicrohttpd server on a unix socket (one thread
 * per connection, so a hanging answer holds only its own connection) and the functions tests
 * call. The two API dialects are fake_docker.c and fake_lxd.c.
 */
#include "fake_engine_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ---------- state (f->lock held) ---------- */

struct fake_inst *fake_inst_find(struct fake_engine *f, const char *name)
{
    for (size_t i = 0; i < FAKE_MAX_INSTANCES; i++)
        if (f->insts[i].used && strcmp(f->insts[i].name, name) == 0)
            return &f->insts[i];
    return NULL;
}

void fake_inst_free(struct fake_inst *in)
{
    for (size_t i = 0; i < FAKE_MAX_FILES; i++)
        free(in->files[i].data);
    memset(in, 0, sizeof(*in));
}

struct fake_inst *fake_inst_new(struct fake_engine *f, const char *name, const char *li,
                                const char *ls)
{
    for (size_t i = 0; i < FAKE_MAX_INSTANCES; i++) {
        struct fake_inst *in = &f->insts[i];

        if (in->used)
            continue;
        memset(in, 0, sizeof(*in));
        in->used = true;
        snprintf(in->name, sizeof(in->name), "%s", name);
        snprintf(in->id, sizeof(in->id), "%064x", ++f->seq);
        snprintf(in->label_instance, sizeof(in->label_instance), "%s", li ? li : "");
        snprintf(in->label_sandbox, sizeof(in->label_sandbox), "%s", ls ? ls : "");
        in->state = ST_CREATED;
        snprintf(in->files[0].path, sizeof(in->files[0].path), "/");
        in->files[0].dir = true;
        return in;
    }
    return NULL;
}

struct fake_file *fake_file_find(struct fake_inst *in, const char *path)
{
    for (size_t i = 0; i < FAKE_MAX_FILES; i++)
        if (in->files[i].path[0] && strcmp(in->files[i].path, path) == 0)
            return &in->files[i];
    return NULL;
}

/* Make or replace path in the instance (dir: a directory; data ignored). 0, -ENOSPC, -ENOMEM,
 * -EISDIR (a directory is there and a file is wanted), -ENOTDIR (the parent is a file),
 * -ENOENT (no parent). */
int fake_file_put(struct fake_inst *in, const char *path, const void *data, size_t len, bool dir)
{
    struct fake_file *fl = fake_file_find(in, path), *parent;
    char up[256];
    char *slash;

    if (strlen(path) >= sizeof(up) || path[0] != '/')
        return -EINVAL;
    snprintf(up, sizeof(up), "%s", path);
    slash = strrchr(up, '/');
    if (slash == up)
        slash[1] = '\0';
    else
        *slash = '\0';
    parent = fake_file_find(in, up);
    if (!parent)
        return -ENOENT;
    if (!parent->dir)
        return -ENOTDIR;
    if (fl && fl->dir)
        return dir ? 0 : -EISDIR;
    if (!fl) {
        for (size_t i = 0; i < FAKE_MAX_FILES && !fl; i++)
            if (!in->files[i].path[0])
                fl = &in->files[i];
        if (!fl)
            return -ENOSPC;
        snprintf(fl->path, sizeof(fl->path), "%s", path);
    }
    free(fl->data);
    fl->data = NULL;
    fl->len = 0;
    fl->dir = dir;
    if (!dir && len > 0) {
        fl->data = malloc(len);
        if (!fl->data) {
            fl->path[0] = '\0';
            return -ENOMEM;
        }
        memcpy(fl->data, data, len);
        fl->len = len;
    }
    return 0;
}

/* Make path and its parents as directories. */
int fake_dirs_put(struct fake_inst *in, const char *path)
{
    char buf[256];
    int r = 0;

    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; r == 0 && *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        r = fake_file_put(in, buf, NULL, 0, true);
        *p = '/';
    }
    return r == 0 && strcmp(buf, "/") != 0 ? fake_file_put(in, buf, NULL, 0, true) : r;
}

struct fake_op *fake_op_new(struct fake_engine *f, const char *inst, bool exec)
{
    for (size_t i = 0; i < FAKE_MAX_OPS; i++) {
        struct fake_op *op = &f->ops[i];

        if (op->used)
            continue;
        memset(op, 0, sizeof(*op));
        op->used = true;
        op->exec = exec;
        snprintf(op->id, sizeof(op->id), "op-%08x", ++f->seq);
        snprintf(op->inst, sizeof(op->inst), "%s", inst);
        return op;
    }
    return NULL;
}

/* ---------- answers ---------- */

void fake_reply_json(struct fake_reply *rp, unsigned status, json_t *j)
{
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;

    json_decref(j);
    rp->status = status;
    rp->body = (unsigned char *)(text ? text : strdup("{}"));
    rp->len = rp->body ? strlen((char *)rp->body) : 0;
    rp->ctype = "application/json";
}

void fake_reply_bytes(struct fake_reply *rp, unsigned status, const void *data, size_t len,
                      const char *ctype)
{
    rp->status = status;
    rp->body = len ? malloc(len) : NULL;
    if (rp->body)
        memcpy(rp->body, data, len);
    rp->len = rp->body ? len : 0;
    rp->ctype = ctype;
}

/* The engine's error answer: docker {"message"}, LXD {"type":"error","error","error_code"}. */
void fake_reply_error(struct fake_engine *f, struct fake_reply *rp, unsigned status,
                      const char *message)
{
    if (f->api == FAKE_DOCKER)
        fake_reply_json(rp, status, json_pack("{s:s}", "message", message));
    else
        fake_reply_json(rp, status,
                        json_pack("{s:s,s:s,s:i}", "type", "error", "error", message, "error_code",
                                  (int)status));
}

void fake_reply_header(struct fake_reply *rp, const char *name, const char *value)
{
    snprintf(rp->hdr_name, sizeof(rp->hdr_name), "%s", name);
    free(rp->hdr_value);
    rp->hdr_value = strdup(value);
}

/* ---------- the server ---------- */

/* The first live rule for this request (its times taken), copied into *out; false: none. */
static bool rule_take(struct fake_engine *f, const char *method, const char *path,
                      struct fake_rule *out)
{
    for (size_t i = 0; i < f->n_rules; i++) {
        struct fake_rule *ru = &f->rules[i];

        if (ru->times == 0 || (ru->method[0] && strcmp(ru->method, method) != 0) ||
            (ru->path[0] == '=' ? strcmp(path, ru->path + 1) != 0 : !strstr(path, ru->path)))
            continue;
        if (ru->times > 0)
            ru->times--;
        *out = *ru;
        return true;
    }
    return false;
}

/* An answer cut short: its status line, headers (the whole body's Content-Length) and half
 * the body written straight to the connection's socket, after which the handler returns MHD_NO
 * and libmicrohttpd closes the connection. Written here rather than through a response
 * callback that fails half way: libmicrohttpd may drop what it buffered when a callback fails,
 * and a client would see a connection closed with nothing on it (which a client reusing
 * connections rightly retries), not an answer cut short. */
static enum MHD_Result send_cut(struct MHD_Connection *c, const struct fake_reply *rp)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    char head[1024];
    size_t off = 0, total;
    int n;

    if (!ci)
        return MHD_NO;
    n = snprintf(head, sizeof(head), "HTTP/1.1 %u %s\r\nContent-Length: %zu\r\n", rp->status,
                 MHD_get_reason_phrase_for(rp->status), rp->len);
    if (rp->ctype)
        n += snprintf(head + n, sizeof(head) - (size_t)n, "Content-Type: %s\r\n", rp->ctype);
    if (rp->hdr_value)
        n +=
            snprintf(head + n, sizeof(head) - (size_t)n, "%s: %s\r\n", rp->hdr_name, rp->hdr_value);
    n += snprintf(head + n, sizeof(head) - (size_t)n, "\r\n");
    if (n < 0 || (size_t)n >= sizeof(head))
        return MHD_NO;
    total = (size_t)n + rp->len / 2;
    while (off < total) {
        const void *p = off < (size_t)n ? (const void *)(head + off)
                                        : (const void *)(rp->body + (off - (size_t)n));
        size_t want = off < (size_t)n ? (size_t)n - off : total - off;
        ssize_t w = send(ci->connect_fd, p, want, MSG_NOSIGNAL);

        if (w <= 0)
            break;
        off += (size_t)w;
    }
    return MHD_NO;
}

static enum MHD_Result send_reply(struct MHD_Connection *c, struct fake_reply *rp)
{
    struct MHD_Response *resp;
    enum MHD_Result ret;

    if (rp->cut && rp->len > 0)
        return send_cut(c, rp);
    resp = MHD_create_response_from_buffer(rp->len, rp->body, MHD_RESPMEM_MUST_COPY);
    if (!resp)
        return MHD_NO;
    if (rp->ctype)
        MHD_add_response_header(resp, "Content-Type", rp->ctype);
    if (rp->hdr_value)
        MHD_add_response_header(resp, rp->hdr_name, rp->hdr_value);
    if (rp->close)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    ret = MHD_queue_response(c, rp->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct fake_engine *f = cls;
    struct fake_req *rq = *con_cls;
    struct fake_reply rp = {.status = 500};
    struct fake_rule rule;
    char inst[160] = "";
    const char *path = url;
    bool ruled;
    enum MHD_Result ret;

    (void)version;
    if (!rq) {
        rq = calloc(1, sizeof(*rq));
        *con_cls = rq;
        return rq ? MHD_YES : MHD_NO;
    }
    if (*upload_data_size) {
        if (rq->len + *upload_data_size > FAKE_BODY_MAX) {
            rq->too_big = true;
        } else {
            unsigned char *nb = realloc(rq->body, rq->len + *upload_data_size + 1);

            if (!nb)
                return MHD_NO;
            rq->body = nb;
            memcpy(rq->body + rq->len, upload_data, *upload_data_size);
            rq->len += *upload_data_size;
            rq->body[rq->len] = 0;
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    /* docker's API version prefix "/v1.41" */
    if (f->api == FAKE_DOCKER && path[0] == '/' && path[1] == 'v' && path[2] >= '0' &&
        path[2] <= '9' && strchr(path + 1, '/'))
        path = strchr(path + 1, '/');
    pthread_mutex_lock(&f->lock);
    if (f->n_hits < FAKE_MAX_HITS) {
        /* LXD's files API names the file in the query: kept, as "?path=P;" (';' ends it) */
        const char *fp = f->api == FAKE_LXD
                             ? MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "path")
                             : NULL;

        snprintf(f->hits[f->n_hits++], sizeof(f->hits[0]), "%s %s%s%s%s", method, path,
                 fp ? "?path=" : "", fp ? fp : "", fp ? ";" : "");
    }
    ruled = rule_take(f, method, path, &rule);
    if (ruled && (rule.action & FAKE_HANG)) {
        struct timespec until;

        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += FAKE_HANG_MAX_S;
        while (!f->stopping && pthread_cond_timedwait(&f->wake, &f->lock, &until) == 0)
            ;
        pthread_mutex_unlock(&f->lock);
        return MHD_NO; /* close the connection without an answer */
    }
    if (ruled && (rule.action & FAKE_ERROR)) {
        fake_reply_error(f, &rp, (unsigned)rule.status, rule.message);
    } else if (rq->too_big) {
        fake_reply_error(f, &rp, 413, "request body too large");
    } else {
        const char *fail = ruled && (rule.action & FAKE_OP_FAIL) ? rule.message : NULL;

        f->op_running = ruled && (rule.action & FAKE_OP_RUNNING);

        if (f->api == FAKE_DOCKER)
            fake_docker_dispatch(f, c, method, path, rq, &rp, inst, sizeof(inst));
        else
            fake_lxd_dispatch(f, c, method, path, rq, &rp, inst, sizeof(inst), fail);
        f->op_running = false;
    }
    if (ruled && (rule.action & FAKE_LOSE) && inst[0]) {
        struct fake_inst *in = fake_inst_find(f, inst);

        if (in)
            fake_inst_free(in);
    }
    rp.cut = ruled && (rule.action & FAKE_CUT);
    rp.close = ruled && (rule.action & FAKE_CLOSE);
    pthread_mutex_unlock(&f->lock);
    ret = send_reply(c, &rp);
    free(rp.body);
    free(rp.hdr_value);
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct fake_req *rq = *con_cls;

    (void)cls;
    (void)c;
    (void)toe;
    if (rq) {
        free(rq->body);
        free(rq);
    }
    *con_cls = NULL;
}

/* Count and track each connection (its socket, for fake_engine_close_connections). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct fake_engine *f = cls;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? ci->connect_fd : -1;

    (void)socket_context;
    pthread_mutex_lock(&f->lock);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        f->accepted++;
        for (size_t i = 0; i < FAKE_MAX_CONNS && fd >= 0; i++)
            if (f->conn_fds[i] < 0) {
                f->conn_fds[i] = fd;
                break;
            }
    } else {
        for (size_t i = 0; i < FAKE_MAX_CONNS && fd >= 0; i++)
            if (f->conn_fds[i] == fd)
                f->conn_fds[i] = -1;
    }
    pthread_mutex_unlock(&f->lock);
}

int fake_engine_start(enum fake_engine_api api, const char *socket_path, struct fake_engine **out)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct fake_engine *f;
    int fd, r;

    if (strlen(socket_path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    f = calloc(1, sizeof(*f));
    if (!f)
        return -ENOMEM;
    f->api = api;
    for (size_t i = 0; i < FAKE_MAX_CONNS; i++)
        f->conn_fds[i] = -1;
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->wake, NULL);
    snprintf(f->socket_path, sizeof(f->socket_path), "%s", socket_path);
    fake_engine_set_exec_output(f, "o\0\0\0\3ok\ns\0\0\0\6exit 0", 19);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", socket_path);
    (void)unlink(socket_path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 64) < 0) {
        r = -errno;
        if (fd >= 0)
            close(fd);
        goto fail;
    }
    f->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0,
                              NULL, NULL, on_request, f, MHD_OPTION_LISTEN_SOCKET, fd,
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, f,
                              MHD_OPTION_NOTIFY_CONNECTION, on_connection, f, MHD_OPTION_END);
    if (!f->mhd) {
        close(fd);
        r = -EIO;
        goto fail;
    }
    *out = f;
    return 0;
fail:
    (void)unlink(socket_path);
    free(f->exec_out);
    pthread_cond_destroy(&f->wake);
    pthread_mutex_destroy(&f->lock);
    free(f);
    return r;
}

void fake_engine_stop(struct fake_engine *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->lock);
    f->stopping = true;
    pthread_cond_broadcast(&f->wake);
    pthread_mutex_unlock(&f->lock);
    MHD_stop_daemon(f->mhd); /* closes the listening socket and joins every connection */
    (void)unlink(f->socket_path);
    for (size_t i = 0; i < FAKE_MAX_INSTANCES; i++)
        if (f->insts[i].used)
            fake_inst_free(&f->insts[i]);
    free(f->exec_out);
    pthread_cond_destroy(&f->wake);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

void fake_engine_rule(struct fake_engine *f, const char *method, const char *path_part, int action,
                      int status, const char *message, int times)
{
    struct fake_rule *ru;

    pthread_mutex_lock(&f->lock);
    if (f->n_rules < FAKE_MAX_RULES) {
        ru = &f->rules[f->n_rules++];
        snprintf(ru->method, sizeof(ru->method), "%s", method ? method : "");
        snprintf(ru->path, sizeof(ru->path), "%s", path_part);
        ru->action = action;
        ru->status = status;
        ru->times = times;
        snprintf(ru->message, sizeof(ru->message), "%s", message ? message : "");
    }
    pthread_mutex_unlock(&f->lock);
}

int fake_engine_add(struct fake_engine *f, const char *name, const char *label_instance,
                    const char *label_sandbox)
{
    struct fake_inst *in;
    int r = 0;

    pthread_mutex_lock(&f->lock);
    if (fake_inst_find(f, name))
        r = -EEXIST;
    else if (!(in = fake_inst_new(f, name, label_instance, label_sandbox)))
        r = -ENOSPC;
    else
        in->state = ST_RUNNING;
    pthread_mutex_unlock(&f->lock);
    return r;
}

bool fake_engine_has(struct fake_engine *f, const char *name)
{
    bool has;

    pthread_mutex_lock(&f->lock);
    has = fake_inst_find(f, name) != NULL;
    pthread_mutex_unlock(&f->lock);
    return has;
}

void fake_engine_lose(struct fake_engine *f, const char *name)
{
    struct fake_inst *in;

    pthread_mutex_lock(&f->lock);
    in = fake_inst_find(f, name);
    if (in)
        fake_inst_free(in);
    pthread_mutex_unlock(&f->lock);
}

const char *fake_engine_state(struct fake_engine *f, const char *name)
{
    struct fake_inst *in;
    const char *s;

    pthread_mutex_lock(&f->lock);
    in = fake_inst_find(f, name);
    s = !in                       ? "gone"
        : in->state == ST_RUNNING ? "running"
        : in->state == ST_PAUSED  ? "paused"
                                  : "stopped";
    pthread_mutex_unlock(&f->lock);
    return s;
}

int fake_engine_put(struct fake_engine *f, const char *name, const char *path, const void *data,
                    size_t len)
{
    struct fake_inst *in;
    int r;

    pthread_mutex_lock(&f->lock);
    in = fake_inst_find(f, name);
    r = in ? fake_file_put(in, path, data, len, false) : -ENOENT;
    pthread_mutex_unlock(&f->lock);
    return r;
}

void *fake_engine_get(struct fake_engine *f, const char *name, const char *path, size_t *len)
{
    struct fake_inst *in;
    struct fake_file *fl = NULL;
    void *copy = NULL;

    pthread_mutex_lock(&f->lock);
    in = fake_inst_find(f, name);
    if (in)
        fl = fake_file_find(in, path);
    if (fl && !fl->dir && (copy = malloc(fl->len + 1))) {
        if (fl->len)
            memcpy(copy, fl->data, fl->len);
        ((char *)copy)[fl->len] = '\0';
        *len = fl->len;
    }
    pthread_mutex_unlock(&f->lock);
    return copy;
}

void fake_engine_set_pool_driver(struct fake_engine *f, const char *driver)
{
    pthread_mutex_lock(&f->lock);
    snprintf(f->pool_driver, sizeof(f->pool_driver), "%s", driver ? driver : "");
    pthread_mutex_unlock(&f->lock);
}

void fake_engine_set_exec_output(struct fake_engine *f, const void *data, size_t len)
{
    unsigned char *copy = malloc(len ? len : 1);

    if (!copy)
        return;
    if (len)
        memcpy(copy, data, len);
    pthread_mutex_lock(&f->lock);
    free(f->exec_out);
    f->exec_out = copy;
    f->exec_out_len = len;
    pthread_mutex_unlock(&f->lock);
}

int fake_engine_connections(struct fake_engine *f)
{
    int n;

    pthread_mutex_lock(&f->lock);
    n = f->accepted;
    pthread_mutex_unlock(&f->lock);
    return n;
}

void fake_engine_close_connections(struct fake_engine *f)
{
    /* under the lock: a connection's socket is forgotten (on_connection) before it is closed */
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < FAKE_MAX_CONNS; i++)
        if (f->conn_fds[i] >= 0)
            (void)shutdown(f->conn_fds[i], SHUT_RDWR);
    pthread_mutex_unlock(&f->lock);
}

int fake_engine_hits(struct fake_engine *f, const char *method, const char *path_part)
{
    size_t ml = method ? strlen(method) : 0;
    int n = 0;

    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < f->n_hits; i++)
        if ((!method || (strncmp(f->hits[i], method, ml) == 0 && f->hits[i][ml] == ' ')) &&
            strstr(strchr(f->hits[i], ' ') + 1, path_part))
            n++;
    pthread_mutex_unlock(&f->lock);
    return n;
}
