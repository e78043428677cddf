/*
 * fake_lxd.c - the fake engine's LXD API dialect (see fake_engine.h for the subset): the
 * server's start-up answers, instances and their state, async operations and their waits,
 * exec with recorded output, the files API.
 */
#include "fake_engine_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *fake_lxd_state_name(enum fake_state s)
{
    return s == ST_RUNNING ? "Running" : s == ST_PAUSED ? "Frozen" : "Stopped";
}

static json_t *fake_lxd_instance_json(const struct fake_inst *in)
{
    return json_pack("{s:s,s:{s:s,s:s},s:s,s:s}", "name", in->name, "config",
                     "user.lendbox.instance", in->label_instance, "user.lendbox.sandbox",
                     in->label_sandbox, "location", "none", "status",
                     fake_lxd_state_name(in->state));
}

static void fake_lxd_sync(struct fake_reply *rp, json_t *metadata)
{
    fake_reply_json(rp, 200,
                    json_pack("{s:s,s:s,s:i,s:o}", "type", "sync", "status", "Success",
                              "status_code", 200, "metadata", metadata ? metadata : json_null()));
}

/* An async answer: a new operation about inst; a rule's FAKE_OP_FAIL makes it fail, its
 * FAKE_OP_RUNNING (f->op_running, taken here) never end. */
static void fake_lxd_async(struct fake_engine *f, struct fake_reply *rp, const char *inst,
                           bool exec, const char *fail)
{
    struct fake_op *op = fake_op_new(f, inst, exec);
    char opath[80];

    if (!op) {
        fake_reply_error(f, rp, 500, "too many operations");
        return;
    }
    op->running = f->op_running;
    f->op_running = false;
    if (fail) {
        op->failed = true;
        snprintf(op->err, sizeof(op->err), "%s", fail);
    }
    snprintf(opath, sizeof(opath), "/1.0/operations/%s", op->id);
    fake_reply_json(rp, 202,
                    json_pack("{s:s,s:s,s:i,s:s,s:{s:s}}", "type", "async", "status",
                              "Operation created", "status_code", 100, "operation", opath,
                              "metadata", "id", op->id));
}

static void fake_lxd_wait(struct fake_engine *f, const char *id, struct fake_reply *rp, char *inst,
                          size_t inst_size)
{
    struct fake_op *op = NULL;
    json_t *md;

    for (size_t i = 0; i < FAKE_MAX_OPS && !op; i++)
        if (f->ops[i].used && strcmp(f->ops[i].id, id) == 0)
            op = &f->ops[i];
    if (!op) {
        fake_reply_error(f, rp, 404, "Operation not found");
        return;
    }
    snprintf(inst, inst_size, "%s", op->inst);
    /* "location": the member the operation ran on, as LXD names it ("none" unclustered) */
    md = json_pack("{s:s,s:s,s:s,s:s,s:i,s:s}", "id", op->id, "location", "none", "description",
                   "Fake operation", "status",
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
    fake_lxd_sync(rp, md);
}

/* PUT /1.0/instances/I/state */
static void fake_lxd_put_state(struct fake_engine *f, struct fake_inst *in,
                               const struct fake_req *rq, struct fake_reply *rp, const char *fail)
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
        fake_reply_error(f, rp, 400, "bad action");
        json_decref(j);
        return;
    }
    json_decref(j);
    fake_lxd_async(f, rp, in->name, false, fail ? fail : refuse);
}

static void fake_lxd_files(struct fake_engine *f, struct MHD_Connection *c, struct fake_inst *in,
                           const char *method, const struct fake_req *rq, struct fake_reply *rp)
{
    const char *path = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "path");
    const char *type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-LXD-type");
    struct fake_file *fl;
    int r;

    if (!path) {
        fake_reply_error(f, rp, 400, "missing path");
        return;
    }
    if (strcmp(method, "POST") == 0) {
        r = fake_file_put(in, path, rq->body, rq->len, type && strcmp(type, "directory") == 0);
        if (r == 0)
            fake_lxd_sync(rp, NULL);
        else if (r == -ENOENT)
            fake_reply_error(f, rp, 404, "not found");
        else
            fake_reply_error(f, rp, 500,
                             r == -EISDIR    ? "open: is a directory"
                             : r == -ENOTDIR ? "mkdir: not a directory"
                                             : "cannot write");
        return;
    }
    fl = fake_file_find(in, path);
    if (!fl) {
        fake_reply_error(f, rp, 404, "not found");
        return;
    }
    if (fl->dir) {
        fake_lxd_sync(rp, json_array());
        fake_reply_header(rp, "X-LXD-type", "directory");
        return;
    }
    fake_reply_bytes(rp, 200, fl->data, fl->len, "application/octet-stream");
    rp->status = 200;
    fake_reply_header(rp, "X-LXD-type", "file");
}

void fake_lxd_dispatch(struct fake_engine *f, struct MHD_Connection *c, const char *method,
                       const char *path, const struct fake_req *rq, struct fake_reply *rp,
                       char *inst, size_t inst_size, const char *fail)
{
    char name[160], rest[200] = "";
    struct fake_inst *in;

    if (strcmp(path, "/1.0") == 0) {
        fake_lxd_sync(rp, json_pack("{s:s,s:[s,s,s,s,s,s],s:{s:b}}", "auth", "trusted",
                                    "api_extensions", "instances", "container_exec_recording",
                                    "container_exec_user_group_cwd", "file_append", "api_filtering",
                                    "id_map_base", "environment", "server_clustered", 0));
        return;
    }
    if (strcmp(path, "/1.0/profiles/default") == 0) {
        fake_lxd_sync(rp, json_pack("{s:{s:{s:s,s:s,s:s}}}", "devices", "root", "type", "disk",
                                    "path", "/", "pool", "default"));
        return;
    }
    if (strncmp(path, "/1.0/storage-pools/", 19) == 0) {
        fake_lxd_sync(rp, json_pack("{s:s,s:s}", "name", path + 19, "driver",
                                    f->pool_driver[0] ? f->pool_driver : "btrfs"));
        return;
    }
    if (sscanf(path, "/1.0/operations/%159[^/]/%199s", name, rest) == 2 &&
        strcmp(rest, "wait") == 0) {
        fake_lxd_wait(f, name, rp, inst, inst_size);
        return;
    }
    if (strcmp(path, "/1.0/instances") == 0) {
        json_t *j, *conf;
        struct fake_inst *made;
        const char *want;

        if (strcmp(method, "GET") == 0) {
            json_t *arr = json_array();

            for (size_t i = 0; i < FAKE_MAX_INSTANCES; i++)
                if (f->insts[i].used)
                    json_array_append_new(arr, fake_lxd_instance_json(&f->insts[i]));
            fake_lxd_sync(rp, arr);
            return;
        }
        j = json_loadb((const char *)rq->body, rq->len, 0, NULL);
        conf = json_object_get(j, "config");
        want = json_string_value(json_object_get(j, "name"));
        if (!want) {
            fake_reply_error(f, rp, 400, "no name");
        } else if (fake_inst_find(f, want)) {
            fake_reply_error(f, rp, 409, "Instance \"x\" already exists");
        } else if (strcmp(json_string_value(json_object_get(json_object_get(j, "source"), "alias"))
                              ?: "",
                          "nosuch") == 0) {
            fake_reply_error(f, rp, 404, "Image alias not found");
        } else if (fail) {
            fake_lxd_async(f, rp, want, false, fail);
        } else if (!(made = fake_inst_new(
                         f, want, json_string_value(json_object_get(conf, "user.lendbox.instance")),
                         json_string_value(json_object_get(conf, "user.lendbox.sandbox"))))) {
            fake_reply_error(f, rp, 500, "too many instances");
        } else {
            /* /run is there, as the provider's raw.lxc tmpfs mount makes it in a real one */
            (void)fake_file_put(made, "/run", NULL, 0, true);
            snprintf(inst, inst_size, "%s", want);
            fake_lxd_async(f, rp, want, false, NULL);
        }
        json_decref(j);
        return;
    }
    if (sscanf(path, "/1.0/instances/%159[^/]/%199s", name, rest) < 1) {
        fake_reply_error(f, rp, 404, "not found");
        return;
    }
    snprintf(inst, inst_size, "%s", name);
    in = fake_inst_find(f, name);
    if (!in) {
        fake_reply_error(f, rp, 404, "Instance not found");
        return;
    }
    if (!rest[0] && strcmp(method, "GET") == 0) {
        fake_lxd_sync(rp, fake_lxd_instance_json(in));
    } else if (!rest[0] && strcmp(method, "DELETE") == 0) {
        if (in->state != ST_CREATED)
            fake_lxd_async(f, rp, name, false, "Instance is running");
        else if (fail)
            fake_lxd_async(f, rp, name, false, fail);
        else {
            fake_inst_free(in);
            fake_lxd_async(f, rp, name, false, NULL);
        }
    } else if (strcmp(rest, "state") == 0 && strcmp(method, "GET") == 0) {
        fake_lxd_sync(rp, json_pack("{s:s,s:i,s:{s:I},s:{s:I,s:I},s:I,s:{s:{s:I}}}", "status",
                                    fake_lxd_state_name(in->state), "status_code",
                                    in->state == ST_RUNNING ? 103 : 102, "cpu", "usage",
                                    (json_int_t)FAKE_USAGE_CPU_NS, "memory", "usage",
                                    (json_int_t)FAKE_USAGE_MEMORY, "usage_peak",
                                    (json_int_t)FAKE_USAGE_PEAK, "processes",
                                    (json_int_t)FAKE_USAGE_PIDS, "disk", "root", "usage",
                                    (json_int_t)FAKE_USAGE_DISK));
    } else if (strcmp(rest, "state") == 0) {
        fake_lxd_put_state(f, in, rq, rp, fail);
    } else if (strcmp(rest, "exec") == 0) {
        if (in->state == ST_PAUSED)
            fake_reply_error(f, rp, 500, "Instance is frozen");
        else if (in->state != ST_RUNNING)
            fake_reply_error(f, rp, 400, "Instance is not running");
        else
            fake_lxd_async(f, rp, name, true, fail);
    } else if (strncmp(rest, "logs/", 5) == 0) {
        if (strcmp(method, "DELETE") == 0)
            fake_lxd_sync(rp, NULL);
        else if (strstr(rest, ".stdout"))
            fake_reply_bytes(rp, 200, f->exec_out, f->exec_out_len, "application/octet-stream");
        else
            fake_reply_bytes(rp, 200, NULL, 0, "application/octet-stream");
        rp->status = 200;
    } else if (strcmp(rest, "files") == 0) {
        fake_lxd_files(f, c, in, method, rq, rp);
    } else {
        fake_reply_error(f, rp, 404, "not found");
    }
}
