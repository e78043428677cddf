/*
 * fake_engine.c - the fake Docker Engine / LXD server of the unit tests (see fake_engine.h):
 * its in-memory instances, files, operations and failure rules, answered by libmicrohttpd on a
 * unix socket, one thread per connection (so a hanging answer holds only its own connection).
 */
#include "fake_engine.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "util/token.h"

#define FAKE_MAX_INSTANCES 16
#define FAKE_MAX_FILES 32
#define FAKE_MAX_RULES 32
#define FAKE_MAX_OPS 64
#define FAKE_MAX_EXECS 64
#define FAKE_MAX_HITS 1024
#define FAKE_BODY_MAX (16 * 1024 * 1024)
#define FAKE_HANG_MAX_S 30 /* a hanging answer gives up after this even if nobody stops it */

enum fake_state { ST_GONE, ST_CREATED, ST_RUNNING, ST_PAUSED };

struct fake_file {
    char path[256];
    unsigned char *data;
    size_t len;
    bool dir;
};

struct fake_inst {
    bool used;
    char name[160];
    char id[72];
    char label_instance[64], label_sandbox[128];
    enum fake_state state;
    struct fake_file files[FAKE_MAX_FILES];
};

struct fake_rule {
    char method[16]; /* "" any */
    char path[160];
    int action, status, times;
    char message[256];
};

struct fake_op {
    bool used;
    char id[40];
    char inst[160];
    bool failed;
    bool running; /* never ends */
    char err[256];
    bool exec; /* an exec: its metadata names the two logs */
};

struct fake_exec {
    bool used;
    char id[72];
    char inst[160];
};

struct fake_engine {
    enum fake_engine_api api;
    char socket_path[108];
    struct MHD_Daemon *mhd;
    pthread_mutex_t lock;
    pthread_cond_t wake; /* stopping */
    bool stopping;
    struct fake_inst insts[FAKE_MAX_INSTANCES];
    struct fake_rule rules[FAKE_MAX_RULES];
    size_t n_rules;
    struct fake_op ops[FAKE_MAX_OPS];
    struct fake_exec execs[FAKE_MAX_EXECS];
    bool op_running; /* the next operation made never ends (FAKE_OP_RUNNING) */
    unsigned char *exec_out;
    size_t exec_out_len;
    char hits[FAKE_MAX_HITS][200];
    size_t n_hits;
    unsigned seq;
};

/* One request: its body as it arrives. */
struct fake_req {
    unsigned char *body;
    size_t len;
    bool too_big;
};

/* One answer. */
struct fake_reply {
    unsigned status;
    unsigned char *body;
    size_t len;
    const char *ctype;
    char hdr_name[64];
    char *hdr_value; /* malloc'd */
    bool cut;
};

/* ---------- state (f->lock held) ---------- */

static struct fake_inst *inst_find(struct fake_engine *f, const char *name)
{
    for (size_t i = 0; i < FAKE_MAX_INSTANCES; i++)
        if (f->insts[i].used && strcmp(f->insts[i].name, name) == 0)
            return &f->insts[i];
    return NULL;
}

static void inst_free(struct fake_inst *in)
{
    for (size_t i = 0; i < FAKE_MAX_FILES; i++)
        free(in->files[i].data);
    memset(in, 0, sizeof(*in));
}

static struct fake_inst *inst_new(struct fake_engine *f, const char *name, const char *li,
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

static struct fake_file *file_find(struct fake_inst *in, const char *path)
{
    for (size_t i = 0; i < FAKE_MAX_FILES; i++)
        if (in->files[i].path[0] && strcmp(in->files[i].path, path) == 0)
            return &in->files[i];
    return NULL;
}

/* Make or replace path in the instance (dir: a directory; data ignored). 0, -ENOSPC, -ENOMEM,
 * -EISDIR (a directory is there and a file is wanted), -ENOTDIR (the parent is a file),
 * -ENOENT (no parent). */
static int file_put(struct fake_inst *in, const char *path, const void *data, size_t len, bool dir)
{
    struct fake_file *fl = file_find(in, path), *parent;
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
    parent = file_find(in, up);
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
static int dirs_put(struct fake_inst *in, const char *path)
{
    char buf[256];
    int r = 0;

    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; r == 0 && *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        r = file_put(in, buf, NULL, 0, true);
        *p = '/';
    }
    return r == 0 && strcmp(buf, "/") != 0 ? file_put(in, buf, NULL, 0, true) : r;
}

static struct fake_op *op_new(struct fake_engine *f, const char *inst, bool exec)
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

static void reply_json(struct fake_reply *rp, unsigned status, json_t *j)
{
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;

    json_decref(j);
    rp->status = status;
    rp->body = (unsigned char *)(text ? text : strdup("{}"));
    rp->len = rp->body ? strlen((char *)rp->body) : 0;
    rp->ctype = "application/json";
}

static void reply_bytes(struct fake_reply *rp, unsigned status, const void *data, size_t len,
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
static void reply_error(struct fake_engine *f, struct fake_reply *rp, unsigned status,
                        const char *message)
{
    if (f->api == FAKE_DOCKER)
        reply_json(rp, status, json_pack("{s:s}", "message", message));
    else
        reply_json(rp, status,
                   json_pack("{s:s,s:s,s:i}", "type", "error", "error", message, "error_code",
                             (int)status));
}

static void reply_header(struct fake_reply *rp, const char *name, const char *value)
{
    snprintf(rp->hdr_name, sizeof(rp->hdr_name), "%s", name);
    free(rp->hdr_value);
    rp->hdr_value = strdup(value);
}

/* ---------- docker ---------- */

static const char *docker_state_name(enum fake_state s)
{
    return s == ST_RUNNING ? "running" : s == ST_PAUSED ? "paused" : "created";
}

static json_t *docker_labels(const struct fake_inst *in)
{
    return json_pack("{s:s,s:s}", "io.lendbox.instance", in->label_instance, "io.lendbox.sandbox",
                     in->label_sandbox);
}

/* Unpack a tar body into the instance (entries relative to "/"). */
static int docker_untar(struct fake_inst *in, const struct fake_req *rq)
{
    struct archive *a = archive_read_new();
    struct archive_entry *e;
    int r = 0;

    if (!a)
        return -ENOMEM;
    archive_read_support_format_tar(a);
    if (archive_read_open_memory(a, rq->body, rq->len) != ARCHIVE_OK) {
        r = -EINVAL;
        goto out;
    }
    while (r == 0 && archive_read_next_header(a, &e) == ARCHIVE_OK) {
        la_int64_t size = archive_entry_size(e);
        char path[256];
        unsigned char *data = size > 0 ? malloc((size_t)size) : NULL;

        snprintf(path, sizeof(path), "/%s", archive_entry_pathname(e));
        if (size > 0 && (!data || archive_read_data(a, data, (size_t)size) != size))
            r = -EIO;
        else
            r = file_put(in, path, data, (size_t)(size > 0 ? size : 0), false);
        free(data);
    }
out:
    archive_read_free(a);
    return r;
}

/* A one-file tar of fl named by its base name. */
static int docker_tar(const struct fake_file *fl, unsigned char **out, size_t *len)
{
    size_t cap = fl->len + 64 * 1024, used = 0;
    unsigned char *buf = malloc(cap);
    struct archive *a = archive_write_new();
    struct archive_entry *e = archive_entry_new();
    const char *base = strrchr(fl->path, '/') + 1;
    int r = -EIO;

    if (!buf || !a || !e)
        goto out;
    archive_write_set_format_pax_restricted(a);
    archive_write_set_bytes_in_last_block(a, 1);
    if (archive_write_open_memory(a, buf, cap, &used) != ARCHIVE_OK)
        goto out;
    archive_entry_set_pathname(e, base);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, (la_int64_t)fl->len);
    if (archive_write_header(a, e) != ARCHIVE_OK ||
        (fl->len && archive_write_data(a, fl->data, fl->len) != (la_ssize_t)fl->len) ||
        archive_write_close(a) != ARCHIVE_OK)
        goto out;
    *out = buf;
    *len = used;
    buf = NULL;
    r = 0;
out:
    free(buf);
    archive_entry_free(e);
    archive_write_free(a);
    return r;
}

static void docker_archive(struct fake_engine *f, struct fake_inst *in, const char *method,
                           const char *path, const struct fake_req *rq, struct fake_reply *rp)
{
    struct fake_file *fl;
    int r;

    if (strcmp(method, "PUT") == 0) {
        r = docker_untar(in, rq);
        if (r == 0)
            reply_bytes(rp, 200, NULL, 0, NULL);
        else
            reply_error(f, rp,
                        r == -ENOTDIR  ? 500
                        : r == -EISDIR ? 500
                                       : 400,
                        r == -ENOTDIR  ? "not a directory"
                        : r == -EISDIR ? "cannot overwrite: is a directory"
                                       : "bad tar stream");
        return;
    }
    fl = path ? file_find(in, path) : NULL;
    if (!fl) {
        reply_error(f, rp, 404, "Could not find the file in container");
        return;
    }
    if (strcmp(method, "HEAD") == 0) {
        json_t *st =
            json_pack("{s:s,s:I,s:I,s:s,s:s}", "name", strrchr(fl->path, '/') + 1, "size",
                      (json_int_t)fl->len, "mode", (json_int_t)(fl->dir ? (1U << 31) | 0755 : 0644),
                      "mtime", "2026-01-01T00:00:00Z", "linkTarget", fl->path);
        char *text = json_dumps(st, JSON_COMPACT), *b64 = NULL;
        size_t n;

        json_decref(st);
        if (text && token_base64_encode(text, strlen(text), &b64, &n) == 0)
            reply_header(rp, "X-Docker-Container-Path-Stat", b64);
        free(text);
        free(b64);
        reply_bytes(rp, 200, NULL, 0, NULL);
        return;
    }
    if (fl->dir) {
        reply_error(f, rp, 400, "is a directory");
        return;
    }
    if (docker_tar(fl, &rp->body, &rp->len) < 0) {
        reply_error(f, rp, 500, "cannot make a tar stream");
        return;
    }
    rp->status = 200;
    rp->ctype = "application/x-tar";
}

static void docker_exec_start(struct fake_engine *f, const char *eid, struct fake_reply *rp,
                              char *inst, size_t inst_size)
{
    struct fake_exec *ex = NULL;
    unsigned char *buf;

    for (size_t i = 0; i < FAKE_MAX_EXECS && !ex; i++)
        if (f->execs[i].used && strcmp(f->execs[i].id, eid) == 0)
            ex = &f->execs[i];
    if (!ex || !inst_find(f, ex->inst)) {
        reply_error(f, rp, 404, "No such exec instance");
        return;
    }
    snprintf(inst, inst_size, "%s", ex->inst);
    buf = malloc(8 + f->exec_out_len);
    if (!buf) {
        reply_error(f, rp, 500, "out of memory");
        return;
    }
    buf[0] = 1;
    buf[1] = buf[2] = buf[3] = 0;
    buf[4] = (unsigned char)(f->exec_out_len >> 24);
    buf[5] = (unsigned char)(f->exec_out_len >> 16);
    buf[6] = (unsigned char)(f->exec_out_len >> 8);
    buf[7] = (unsigned char)f->exec_out_len;
    if (f->exec_out_len)
        memcpy(buf + 8, f->exec_out, f->exec_out_len);
    rp->status = 200;
    rp->body = buf;
    rp->len = 8 + f->exec_out_len;
    rp->ctype = "application/vnd.docker.raw-stream";
}

/* Docker: answer path (version prefix gone) into rp; the instance it is about into inst. */
static void docker_dispatch(struct fake_engine *f, struct MHD_Connection *c, const char *method,
                            const char *path, const struct fake_req *rq, struct fake_reply *rp,
                            char *inst, size_t inst_size)
{
    char name[160], rest[64] = "";
    struct fake_inst *in;

    if (strcmp(path, "/_ping") == 0) {
        reply_bytes(rp, 200, "OK", 2, "text/plain");
        reply_header(rp, "Api-Version", "1.41");
        return;
    }
    if (strcmp(path, "/containers/create") == 0 && strcmp(method, "POST") == 0) {
        const char *want = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "name");
        json_t *j = json_loadb((const char *)rq->body, rq->len, 0, NULL), *labels;
        const char *image = json_string_value(json_object_get(j, "Image"));

        labels = json_object_get(j, "Labels");
        if (!want || !image) {
            reply_error(f, rp, 400, "bad create body");
        } else if (strcmp(image, "nosuch") == 0) {
            reply_error(f, rp, 404, "No such image: nosuch");
        } else if (inst_find(f, want)) {
            reply_error(f, rp, 409, "Conflict. The container name is already in use");
        } else if (!(in = inst_new(
                         f, want, json_string_value(json_object_get(labels, "io.lendbox.instance")),
                         json_string_value(json_object_get(labels, "io.lendbox.sandbox"))))) {
            reply_error(f, rp, 500, "too many containers");
        } else {
            const char *wd = json_string_value(json_object_get(j, "WorkingDir"));

            (void)dirs_put(in, "/tmp");
            if (wd)
                (void)dirs_put(in, wd);
            snprintf(inst, inst_size, "%s", want);
            reply_json(rp, 201, json_pack("{s:s,s:[]}", "Id", in->id, "Warnings"));
        }
        json_decref(j);
        return;
    }
    if (strcmp(path, "/containers/json") == 0) {
        json_t *arr = json_array();

        for (size_t i = 0; i < FAKE_MAX_INSTANCES; i++) {
            in = &f->insts[i];
            if (in->used)
                json_array_append_new(arr, json_pack("{s:s,s:[s],s:o,s:s}", "Id", in->id, "Names",
                                                     in->name, "Labels", docker_labels(in), "State",
                                                     docker_state_name(in->state)));
        }
        reply_json(rp, 200, arr);
        return;
    }
    if (sscanf(path, "/exec/%159[^/]/%63s", name, rest) == 2 && strcmp(rest, "start") == 0) {
        docker_exec_start(f, name, rp, inst, inst_size);
        return;
    }
    if (sscanf(path, "/containers/%159[^/]/%63s", name, rest) < 1) {
        reply_error(f, rp, 404, "page not found");
        return;
    }
    snprintf(inst, inst_size, "%s", name);
    in = inst_find(f, name);
    if (!in) {
        reply_error(f, rp, 404, "No such container");
        return;
    }
    if (!rest[0] && strcmp(method, "DELETE") == 0) {
        inst_free(in);
        reply_bytes(rp, 204, NULL, 0, NULL);
    } else if (strcmp(rest, "json") == 0) {
        reply_json(rp, 200,
                   json_pack("{s:s,s:s,s:{s:o},s:{s:s}}", "Id", in->id, "Name", in->name, "Config",
                             "Labels", docker_labels(in), "State", "Status",
                             docker_state_name(in->state)));
    } else if (strcmp(rest, "start") == 0) {
        if (in->state == ST_RUNNING) {
            reply_bytes(rp, 304, NULL, 0, NULL);
        } else {
            in->state = ST_RUNNING;
            reply_bytes(rp, 204, NULL, 0, NULL);
        }
    } else if (strcmp(rest, "pause") == 0 || strcmp(rest, "unpause") == 0) {
        bool pause = rest[0] == 'p';

        if (in->state == (pause ? ST_PAUSED : ST_RUNNING)) {
            reply_error(f, rp, 500,
                        pause ? "container is already paused" : "container is not paused");
        } else {
            in->state = pause ? ST_PAUSED : ST_RUNNING;
            reply_bytes(rp, 204, NULL, 0, NULL);
        }
    } else if (strcmp(rest, "exec") == 0) {
        struct fake_exec *ex = NULL;

        if (in->state == ST_PAUSED) {
            reply_error(f, rp, 409, "container is paused, unpause the container before exec");
            return;
        }
        if (in->state != ST_RUNNING) {
            reply_error(f, rp, 409, "container is not running");
            return;
        }
        for (size_t i = 0; i < FAKE_MAX_EXECS && !ex; i++)
            if (!f->execs[i].used)
                ex = &f->execs[i];
        if (!ex) {
            reply_error(f, rp, 500, "too many execs");
            return;
        }
        ex->used = true;
        snprintf(ex->id, sizeof(ex->id), "exec%08x", ++f->seq);
        snprintf(ex->inst, sizeof(ex->inst), "%s", name);
        reply_json(rp, 201, json_pack("{s:s}", "Id", ex->id));
    } else if (strcmp(rest, "archive") == 0) {
        docker_archive(f, in, method, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "path"),
                       rq, rp);
    } else {
        reply_error(f, rp, 404, "page not found");
    }
}

/* ---------- lxd ---------- */

static const char *lxd_state_name(enum fake_state s)
{
    return s == ST_RUNNING ? "Running" : s == ST_PAUSED ? "Frozen" : "Stopped";
}

static json_t *lxd_instance_json(const struct fake_inst *in)
{
    return json_pack("{s:s,s:{s:s,s:s},s:s,s:s}", "name", in->name, "config",
                     "user.lendbox.instance", in->label_instance, "user.lendbox.sandbox",
                     in->label_sandbox, "location", "none", "status", lxd_state_name(in->state));
}

static void lxd_sync(struct fake_reply *rp, json_t *metadata)
{
    reply_json(rp, 200,
               json_pack("{s:s,s:s,s:i,s:o}", "type", "sync", "status", "Success", "status_code",
                         200, "metadata", metadata ? metadata : json_null()));
}

/* An async answer: a new operation about inst; a rule's FAKE_OP_FAIL makes it fail, its
 * FAKE_OP_RUNNING (f->op_running, taken here) never end. */
static void lxd_async(struct fake_engine *f, struct fake_reply *rp, const char *inst, bool exec,
                      const char *fail)
{
    struct fake_op *op = op_new(f, inst, exec);
    char opath[80];

    if (!op) {
        reply_error(f, rp, 500, "too many operations");
        return;
    }
    op->running = f->op_running;
    f->op_running = false;
    if (fail) {
        op->failed = true;
        snprintf(op->err, sizeof(op->err), "%s", fail);
    }
    snprintf(opath, sizeof(opath), "/1.0/operations/%s", op->id);
    reply_json(rp, 202,
               json_pack("{s:s,s:s,s:i,s:s,s:{s:s}}", "type", "async", "status",
                         "Operation created", "status_code", 100, "operation", opath, "metadata",
                         "id", op->id));
}

static void lxd_wait(struct fake_engine *f, const char *id, struct fake_reply *rp, char *inst,
                     size_t inst_size)
{
    struct fake_op *op = NULL;
    json_t *md;

    for (size_t i = 0; i < FAKE_MAX_OPS && !op; i++)
        if (f->ops[i].used && strcmp(f->ops[i].id, id) == 0)
            op = &f->ops[i];
    if (!op) {
        reply_error(f, rp, 404, "Operation not found");
        return;
    }
    snprintf(inst, inst_size, "%s", op->inst);
    md = json_pack("{s:s,s:s,s:s,s:i,s:s}", "id", op->id, "description", "Fake operation", "status",
                   op->running  ? "Running"
                   : op->failed ? "Failure"
                                : "Success",
                   "status_code",
                   op->running  ? 103
                   : op->failed ? 400
                                : 200,
                   "err", op->err);
    if (op->exec && !op->failed && !op->running) {
        char out[256], err[256];

        snprintf(out, sizeof(out), "/1.0/instances/%s/logs/exec_%s.stdout", op->inst, op->id);
        snprintf(err, sizeof(err), "/1.0/instances/%s/logs/exec_%s.stderr", op->inst, op->id);
        json_object_set_new(
            md, "metadata",
            json_pack("{s:{s:s,s:s},s:i}", "output", "1", out, "2", err, "return", 0));
    }
    lxd_sync(rp, md);
}

/* PUT /1.0/instances/I/state */
static void lxd_put_state(struct fake_engine *f, struct fake_inst *in, const struct fake_req *rq,
                          struct fake_reply *rp, const char *fail)
{
    json_t *j = json_loadb((const char *)rq->body, rq->len, 0, NULL);
    const char *action = json_string_value(json_object_get(j, "action")) ?: "";
    const char *refuse = NULL;

    if (strcmp(action, "start") == 0) {
        if (in->state == ST_RUNNING)
            refuse = "The instance is already running";
        else if (!fail)
            in->state = ST_RUNNING;
    } else if (strcmp(action, "stop") == 0) {
        if (in->state == ST_CREATED)
            refuse = "The instance is already stopped";
        else if (!fail)
            in->state = ST_CREATED;
    } else if (strcmp(action, "freeze") == 0) {
        if (in->state != ST_RUNNING)
            refuse = "The instance isn't running";
        else if (!fail)
            in->state = ST_PAUSED;
    } else if (strcmp(action, "unfreeze") == 0) {
        if (in->state != ST_PAUSED)
            refuse = "The instance is not frozen";
        else if (!fail)
            in->state = ST_RUNNING;
    } else {
        reply_error(f, rp, 400, "bad action");
        json_decref(j);
        return;
    }
    json_decref(j);
    lxd_async(f, rp, in->name, false, fail ? fail : refuse);
}

static void lxd_files(struct fake_engine *f, struct MHD_Connection *c, struct fake_inst *in,
                      const char *method, const struct fake_req *rq, struct fake_reply *rp)
{
    const char *path = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "path");
    const char *type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-LXD-type");
    struct fake_file *fl;
    int r;

    if (!path) {
        reply_error(f, rp, 400, "missing path");
        return;
    }
    if (strcmp(method, "POST") == 0) {
        r = file_put(in, path, rq->body, rq->len, type && strcmp(type, "directory") == 0);
        if (r == 0)
            lxd_sync(rp, NULL);
        else if (r == -ENOENT)
            reply_error(f, rp, 404, "not found");
        else
            reply_error(f, rp, 500,
                        r == -EISDIR    ? "open: is a directory"
                        : r == -ENOTDIR ? "mkdir: not a directory"
                                        : "cannot write");
        return;
    }
    fl = file_find(in, path);
    if (!fl) {
        reply_error(f, rp, 404, "not found");
        return;
    }
    if (fl->dir) {
        lxd_sync(rp, json_array());
        reply_header(rp, "X-LXD-type", "directory");
        return;
    }
    reply_bytes(rp, 200, fl->data, fl->len, "application/octet-stream");
    rp->status = 200;
    reply_header(rp, "X-LXD-type", "file");
}

static void lxd_dispatch(struct fake_engine *f, struct MHD_Connection *c, const char *method,
                         const char *path, const struct fake_req *rq, struct fake_reply *rp,
                         char *inst, size_t inst_size, const char *fail)
{
    char name[160], rest[200] = "";
    struct fake_inst *in;

    if (strcmp(path, "/1.0") == 0) {
        lxd_sync(rp,
                 json_pack("{s:s,s:[s,s,s,s,s],s:{s:b}}", "auth", "trusted", "api_extensions",
                           "instances", "container_exec_recording", "container_exec_user_group_cwd",
                           "file_append", "api_filtering", "environment", "server_clustered", 0));
        return;
    }
    if (strcmp(path, "/1.0/profiles/default") == 0) {
        lxd_sync(rp, json_pack("{s:{s:{s:s,s:s,s:s}}}", "devices", "root", "type", "disk", "path",
                               "/", "pool", "default"));
        return;
    }
    if (strncmp(path, "/1.0/storage-pools/", 19) == 0) {
        lxd_sync(rp, json_pack("{s:s,s:s}", "name", path + 19, "driver", "btrfs"));
        return;
    }
    if (sscanf(path, "/1.0/operations/%159[^/]/%199s", name, rest) == 2 &&
        strcmp(rest, "wait") == 0) {
        lxd_wait(f, name, rp, inst, inst_size);
        return;
    }
    if (strcmp(path, "/1.0/instances") == 0) {
        json_t *j, *conf;
        const char *want;

        if (strcmp(method, "GET") == 0) {
            json_t *arr = json_array();

            for (size_t i = 0; i < FAKE_MAX_INSTANCES; i++)
                if (f->insts[i].used)
                    json_array_append_new(arr, lxd_instance_json(&f->insts[i]));
            lxd_sync(rp, arr);
            return;
        }
        j = json_loadb((const char *)rq->body, rq->len, 0, NULL);
        conf = json_object_get(j, "config");
        want = json_string_value(json_object_get(j, "name"));
        if (!want) {
            reply_error(f, rp, 400, "no name");
        } else if (inst_find(f, want)) {
            reply_error(f, rp, 409, "Instance \"x\" already exists");
        } else if (strcmp(json_string_value(json_object_get(json_object_get(j, "source"), "alias"))
                              ?: "",
                          "nosuch") == 0) {
            reply_error(f, rp, 404, "Image alias not found");
        } else if (fail) {
            lxd_async(f, rp, want, false, fail);
        } else if (!inst_new(f, want,
                             json_string_value(json_object_get(conf, "user.lendbox.instance")),
                             json_string_value(json_object_get(conf, "user.lendbox.sandbox")))) {
            reply_error(f, rp, 500, "too many instances");
        } else {
            snprintf(inst, inst_size, "%s", want);
            lxd_async(f, rp, want, false, NULL);
        }
        json_decref(j);
        return;
    }
    if (sscanf(path, "/1.0/instances/%159[^/]/%199s", name, rest) < 1) {
        reply_error(f, rp, 404, "not found");
        return;
    }
    snprintf(inst, inst_size, "%s", name);
    in = inst_find(f, name);
    if (!in) {
        reply_error(f, rp, 404, "Instance not found");
        return;
    }
    if (!rest[0] && strcmp(method, "GET") == 0) {
        lxd_sync(rp, lxd_instance_json(in));
    } else if (!rest[0] && strcmp(method, "DELETE") == 0) {
        if (in->state != ST_CREATED)
            lxd_async(f, rp, name, false, "Instance is running");
        else if (fail)
            lxd_async(f, rp, name, false, fail);
        else {
            inst_free(in);
            lxd_async(f, rp, name, false, NULL);
        }
    } else if (strcmp(rest, "state") == 0 && strcmp(method, "GET") == 0) {
        lxd_sync(rp, json_pack("{s:s,s:i}", "status", lxd_state_name(in->state), "status_code",
                               in->state == ST_RUNNING ? 103 : 102));
    } else if (strcmp(rest, "state") == 0) {
        lxd_put_state(f, in, rq, rp, fail);
    } else if (strcmp(rest, "exec") == 0) {
        if (in->state == ST_PAUSED)
            reply_error(f, rp, 500, "Instance is frozen");
        else if (in->state != ST_RUNNING)
            reply_error(f, rp, 400, "Instance is not running");
        else
            lxd_async(f, rp, name, true, fail);
    } else if (strncmp(rest, "logs/", 5) == 0) {
        if (strcmp(method, "DELETE") == 0)
            lxd_sync(rp, NULL);
        else if (strstr(rest, ".stdout"))
            reply_bytes(rp, 200, f->exec_out, f->exec_out_len, "application/octet-stream");
        else
            reply_bytes(rp, 200, NULL, 0, "application/octet-stream");
        rp->status = 200;
    } else if (strcmp(rest, "files") == 0) {
        lxd_files(f, c, in, method, rq, rp);
    } else {
        reply_error(f, rp, 404, "not found");
    }
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

struct cut_body {
    unsigned char *data;
    size_t len, cut;
};

static ssize_t cut_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct cut_body *cb = cls;
    size_t n;

    if (pos >= cb->cut)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    n = cb->cut - (size_t)pos < max ? cb->cut - (size_t)pos : max;
    memcpy(buf, cb->data + pos, n);
    return (ssize_t)n;
}

static void cut_free(void *cls)
{
    struct cut_body *cb = cls;

    free(cb->data);
    free(cb);
}

static enum MHD_Result send_reply(struct MHD_Connection *c, struct fake_reply *rp)
{
    struct MHD_Response *resp;
    enum MHD_Result ret;

    if (rp->cut && rp->len > 0) {
        struct cut_body *cb = calloc(1, sizeof(*cb));

        if (!cb)
            return MHD_NO;
        cb->data = rp->body;
        cb->len = rp->len;
        cb->cut = rp->len / 2;
        rp->body = NULL;
        resp = MHD_create_response_from_callback(cb->len, 4096, cut_read, cb, cut_free);
    } else {
        resp = MHD_create_response_from_buffer(rp->len, rp->body, MHD_RESPMEM_MUST_COPY);
    }
    if (!resp)
        return MHD_NO;
    if (rp->ctype)
        MHD_add_response_header(resp, "Content-Type", rp->ctype);
    if (rp->hdr_value)
        MHD_add_response_header(resp, rp->hdr_name, rp->hdr_value);
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
    if (f->n_hits < FAKE_MAX_HITS)
        snprintf(f->hits[f->n_hits++], sizeof(f->hits[0]), "%s %s", method, path);
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
        reply_error(f, &rp, (unsigned)rule.status, rule.message);
    } else if (rq->too_big) {
        reply_error(f, &rp, 413, "request body too large");
    } else {
        const char *fail = ruled && (rule.action & FAKE_OP_FAIL) ? rule.message : NULL;

        f->op_running = ruled && (rule.action & FAKE_OP_RUNNING);

        if (f->api == FAKE_DOCKER)
            docker_dispatch(f, c, method, path, rq, &rp, inst, sizeof(inst));
        else
            lxd_dispatch(f, c, method, path, rq, &rp, inst, sizeof(inst), fail);
        f->op_running = false;
    }
    if (ruled && (rule.action & FAKE_LOSE) && inst[0]) {
        struct fake_inst *in = inst_find(f, inst);

        if (in)
            inst_free(in);
    }
    rp.cut = ruled && (rule.action & FAKE_CUT);
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
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, f, MHD_OPTION_END);
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
            inst_free(&f->insts[i]);
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
    if (inst_find(f, name))
        r = -EEXIST;
    else if (!(in = inst_new(f, name, label_instance, label_sandbox)))
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
    has = inst_find(f, name) != NULL;
    pthread_mutex_unlock(&f->lock);
    return has;
}

void fake_engine_lose(struct fake_engine *f, const char *name)
{
    struct fake_inst *in;

    pthread_mutex_lock(&f->lock);
    in = inst_find(f, name);
    if (in)
        inst_free(in);
    pthread_mutex_unlock(&f->lock);
}

const char *fake_engine_state(struct fake_engine *f, const char *name)
{
    struct fake_inst *in;
    const char *s;

    pthread_mutex_lock(&f->lock);
    in = inst_find(f, name);
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
    in = inst_find(f, name);
    r = in ? file_put(in, path, data, len, false) : -ENOENT;
    pthread_mutex_unlock(&f->lock);
    return r;
}

void *fake_engine_get(struct fake_engine *f, const char *name, const char *path, size_t *len)
{
    struct fake_inst *in;
    struct fake_file *fl = NULL;
    void *copy = NULL;

    pthread_mutex_lock(&f->lock);
    in = inst_find(f, name);
    if (in)
        fl = file_find(in, path);
    if (fl && !fl->dir && (copy = malloc(fl->len + 1))) {
        if (fl->len)
            memcpy(copy, fl->data, fl->len);
        ((char *)copy)[fl->len] = '\0';
        *len = fl->len;
    }
    pthread_mutex_unlock(&f->lock);
    return copy;
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
