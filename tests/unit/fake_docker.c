/*
 * fake_docker.c - the fake engine's Docker Engine API dialect (see fake_engine.h for the
 * subset): containers, execs with the multiplexed stream, archive PUT/HEAD/GET as tar streams.
 */
#include "fake_engine_internal.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/token.h"

static const char *fake_docker_state_name(enum fake_state s)
{
    return s == ST_RUNNING ? "running" : s == ST_PAUSED ? "paused" : "created";
}

static json_t *fake_docker_labels(const struct fake_inst *in)
{
    return json_pack("{s:s,s:s}", "io.lendbox.instance", in->label_instance, "io.lendbox.sandbox",
                     in->label_sandbox);
}

/* Unpack a tar body into the instance (entries relative to "/"). */
static int fake_docker_untar(struct fake_inst *in, const char *dir, const struct fake_req *rq)
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

        size_t n;

        /* the entries land below dir (the request's path), directories as directories */
        snprintf(path, sizeof(path), "%s/%s", dir && strcmp(dir, "/") != 0 ? dir : "",
                 archive_entry_pathname(e));
        n = strlen(path);
        while (n > 1 && path[n - 1] == '/')
            path[--n] = '\0';
        if (size > 0 && (!data || archive_read_data(a, data, (size_t)size) != size))
            r = -EIO;
        else
            r = fake_file_put(in, path, data, (size_t)(size > 0 ? size : 0),
                              archive_entry_filetype(e) == AE_IFDIR);
        free(data);
    }
out:
    archive_read_free(a);
    return r;
}

/* A one-file tar of fl named by its base name. */
static int fake_docker_tar(const struct fake_file *fl, unsigned char **out, size_t *len)
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

static void fake_docker_archive(struct fake_engine *f, struct fake_inst *in, const char *method,
                                const char *path, const struct fake_req *rq, struct fake_reply *rp)
{
    struct fake_file *fl;
    int r;

    if (strcmp(method, "PUT") == 0) {
        r = fake_docker_untar(in, path, rq);
        if (r == 0)
            fake_reply_bytes(rp, 200, NULL, 0, NULL);
        else
            fake_reply_error(f, rp,
                             r == -ENOTDIR  ? 500
                             : r == -EISDIR ? 500
                                            : 400,
                             r == -ENOTDIR  ? "not a directory"
                             : r == -EISDIR ? "cannot overwrite: is a directory"
                                            : "bad tar stream");
        return;
    }
    fl = path ? fake_file_find(in, path) : NULL;
    if (!fl) {
        fake_reply_error(f, rp, 404, "Could not find the file in container");
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
            fake_reply_header(rp, "X-Docker-Container-Path-Stat", b64);
        free(text);
        free(b64);
        fake_reply_bytes(rp, 200, NULL, 0, NULL);
        return;
    }
    if (fl->dir) {
        fake_reply_error(f, rp, 400, "is a directory");
        return;
    }
    if (fake_docker_tar(fl, &rp->body, &rp->len) < 0) {
        fake_reply_error(f, rp, 500, "cannot make a tar stream");
        return;
    }
    rp->status = 200;
    rp->ctype = "application/x-tar";
}

static void fake_docker_exec_start(struct fake_engine *f, const char *eid, struct fake_reply *rp,
                                   char *inst, size_t inst_size)
{
    struct fake_exec *ex = NULL;
    unsigned char *buf;

    for (size_t i = 0; i < FAKE_MAX_EXECS && !ex; i++)
        if (f->execs[i].used && strcmp(f->execs[i].id, eid) == 0)
            ex = &f->execs[i];
    if (!ex || !fake_inst_find(f, ex->inst)) {
        fake_reply_error(f, rp, 404, "No such exec instance");
        return;
    }
    snprintf(inst, inst_size, "%s", ex->inst);
    buf = malloc(8 + f->exec_out_len);
    if (!buf) {
        fake_reply_error(f, rp, 500, "out of memory");
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
void fake_docker_dispatch(struct fake_engine *f, struct MHD_Connection *c, const char *method,
                          const char *path, const struct fake_req *rq, struct fake_reply *rp,
                          char *inst, size_t inst_size)
{
    char name[160], rest[64] = "";
    struct fake_inst *in;

    if (strcmp(path, "/_ping") == 0) {
        fake_reply_bytes(rp, 200, "OK", 2, "text/plain");
        fake_reply_header(rp, "Api-Version", "1.41");
        return;
    }
    if (strcmp(path, "/containers/create") == 0 && strcmp(method, "POST") == 0) {
        const char *want = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "name");
        json_t *j = json_loadb((const char *)rq->body, rq->len, 0, NULL), *labels;
        const char *image = json_string_value(json_object_get(j, "Image"));

        labels = json_object_get(j, "Labels");
        if (!want || !image) {
            fake_reply_error(f, rp, 400, "bad create body");
        } else if (strcmp(image, "nosuch") == 0) {
            fake_reply_error(f, rp, 404, "No such image: nosuch");
        } else if (fake_inst_find(f, want)) {
            fake_reply_error(f, rp, 409, "Conflict. The container name is already in use");
        } else if (!(in = fake_inst_new(
                         f, want, json_string_value(json_object_get(labels, "io.lendbox.instance")),
                         json_string_value(json_object_get(labels, "io.lendbox.sandbox"))))) {
            fake_reply_error(f, rp, 500, "too many containers");
        } else {
            const char *wd = json_string_value(json_object_get(j, "WorkingDir"));

            (void)fake_dirs_put(in, "/tmp");
            if (wd)
                (void)fake_dirs_put(in, wd);
            snprintf(inst, inst_size, "%s", want);
            fake_reply_json(rp, 201, json_pack("{s:s,s:[]}", "Id", in->id, "Warnings"));
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
                                                     in->name, "Labels", fake_docker_labels(in),
                                                     "State", fake_docker_state_name(in->state)));
        }
        fake_reply_json(rp, 200, arr);
        return;
    }
    if (sscanf(path, "/exec/%159[^/]/%63s", name, rest) == 2 && strcmp(rest, "start") == 0) {
        fake_docker_exec_start(f, name, rp, inst, inst_size);
        return;
    }
    if (sscanf(path, "/containers/%159[^/]/%63s", name, rest) < 1) {
        fake_reply_error(f, rp, 404, "page not found");
        return;
    }
    snprintf(inst, inst_size, "%s", name);
    in = fake_inst_find(f, name);
    if (!in) {
        fake_reply_error(f, rp, 404, "No such container");
        return;
    }
    if (!rest[0] && strcmp(method, "DELETE") == 0) {
        fake_inst_free(in);
        fake_reply_bytes(rp, 204, NULL, 0, NULL);
    } else if (strcmp(rest, "json") == 0) {
        fake_reply_json(rp, 200,
                        json_pack("{s:s,s:s,s:{s:o},s:{s:s}}", "Id", in->id, "Name", in->name,
                                  "Config", "Labels", fake_docker_labels(in), "State", "Status",
                                  fake_docker_state_name(in->state)));
    } else if (strcmp(rest, "stats") == 0 && strcmp(method, "GET") == 0) {
        /* the shape of podman 4's compat answer, with Docker's max_usage and stats besides */
        fake_reply_json(rp, 200,
                        json_pack("{s:s,s:{s:I},s:{s:{s:I,s:I}},s:{s:I,s:I,s:I,s:{s:I}}}", "name",
                                  in->name, "pids_stats", "current", (json_int_t)FAKE_USAGE_PIDS,
                                  "cpu_stats", "cpu_usage", "total_usage",
                                  (json_int_t)FAKE_USAGE_CPU_NS, "usage_in_usermode",
                                  (json_int_t)FAKE_USAGE_CPU_NS, "memory_stats", "usage",
                                  (json_int_t)FAKE_USAGE_MEMORY, "max_usage",
                                  (json_int_t)FAKE_USAGE_PEAK, "limit", (json_int_t)1 << 30,
                                  "stats", "oom_kill", (json_int_t)FAKE_USAGE_OOM_KILLS));
    } else if (strcmp(rest, "start") == 0) {
        if (in->state == ST_RUNNING) {
            fake_reply_bytes(rp, 304, NULL, 0, NULL);
        } else {
            in->state = ST_RUNNING;
            fake_reply_bytes(rp, 204, NULL, 0, NULL);
        }
    } else if (strcmp(rest, "pause") == 0 || strcmp(rest, "unpause") == 0) {
        bool pause = rest[0] == 'p';

        if (in->state == (pause ? ST_PAUSED : ST_RUNNING)) {
            fake_reply_error(f, rp, 500,
                             pause ? "container is already paused" : "container is not paused");
        } else {
            in->state = pause ? ST_PAUSED : ST_RUNNING;
            fake_reply_bytes(rp, 204, NULL, 0, NULL);
        }
    } else if (strcmp(rest, "exec") == 0) {
        struct fake_exec *ex = NULL;

        if (in->state == ST_PAUSED) {
            fake_reply_error(f, rp, 409, "container is paused, unpause the container before exec");
            return;
        }
        if (in->state != ST_RUNNING) {
            fake_reply_error(f, rp, 409, "container is not running");
            return;
        }
        for (size_t i = 0; i < FAKE_MAX_EXECS && !ex; i++)
            if (!f->execs[i].used)
                ex = &f->execs[i];
        if (!ex) {
            fake_reply_error(f, rp, 500, "too many execs");
            return;
        }
        ex->used = true;
        snprintf(ex->id, sizeof(ex->id), "exec%08x", ++f->seq);
        snprintf(ex->inst, sizeof(ex->inst), "%s", name);
        fake_reply_json(rp, 201, json_pack("{s:s}", "Id", ex->id));
    } else if (strcmp(rest, "archive") == 0) {
        fake_docker_archive(f, in, method,
                            MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "path"), rq, rp);
    } else {
        fake_reply_error(f, rp, 404, "page not found");
    }
}
