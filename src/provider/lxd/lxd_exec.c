/*
 * lxd_exec.c - the lxd provider's exec hooks (engine_exec drives them): exec with recorded
 * output of the supervisor in framed mode (framed.h), the logs fetched and deleted, numeric
 * users only.
 */
#include "provider/lxd/lxd_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "provider/exec_result.h"

#define EXEC_SLACK_MS 30000 /* LXD's own start-up and tear-down of an exec, past the timeout */
#define FRAME_SLACK_BYTES (1024 * 1024) /* frame headers, the status, cut markers */

/* The exec body: the command engine_exec built, with this provider's options (cwd, loopback,
 * the init's session spared by an exclusive exec), env as LXD's map, the uid. */
static json_t *exec_body(struct engine_exec *x, const char *cwd, int uid)
{
    const struct lb_exec_request *req = x->req;
    json_t *env = json_object(), *cmd, *body;

    if (!env)
        return NULL;
    if (!req->cwd) {
        json_array_append_new(x->cmd, json_string("--cwd"));
        json_array_append_new(x->cmd, json_string(cwd));
    }
    /* no NIC, and an image's init need not bring lo up: "none" still means loopback works */
    json_array_append_new(x->cmd, json_string("--loopback-up"));
    /* the image's init may keep children of its own (the test image's shell loop) */
    if (req->exclusive)
        json_array_append_new(x->cmd, json_string("--spare-init-session"));
    cmd = engine_exec_command(x);
    if (!cmd) {
        json_decref(env);
        return NULL;
    }
    for (size_t i = 0; req->env && req->env[i]; i++) {
        const char *eq = strchr(req->env[i], '=');
        char name[256];

        if (!eq || eq == req->env[i] || (size_t)(eq - req->env[i]) >= sizeof(name))
            continue;
        snprintf(name, sizeof(name), "%.*s", (int)(eq - req->env[i]), req->env[i]);
        json_object_set_new(env, name, json_string(eq + 1));
    }
    body = json_pack("{s:O,s:o,s:b,s:b,s:b,s:s}", "command", cmd, "environment", env,
                     "wait-for-websocket", 0, "interactive", 0, "record-output", 1, "cwd", "/");
    if (body && uid > 0) {
        json_object_set_new(body, "user", json_integer(uid));
        json_object_set_new(body, "group", json_integer(uid));
    }
    return body;
}

/* The exec's user: root (0) or a numeric uid; names are -EINVAL (LXD's exec takes numbers). */
static int exec_uid(const char *user, struct lb_error *err)
{
    char *end;
    long v;

    if (!user || strcmp(user, "root") == 0)
        return 0;
    v = strtol(user, &end, 10);
    if (*user && !*end && v >= 0 && v < 65536)
        return (int)v;
    return lb_error_set(err, -EINVAL,
                        "the lxd provider runs commands as root or a numeric uid (0-65535), not "
                        "'%.64s'",
                        user);
}

static int diag_write(const void *data, size_t n, void *arg)
{
    (void)lb_buf_append_capped(arg, data, n);
    return 0;
}

struct frame_sink {
    struct lb_framed_reader *fr;
    uint64_t got, max;
};

static int frame_write(const void *data, size_t n, void *arg)
{
    struct frame_sink *s = arg;

    s->got += n;
    if (s->got > s->max)
        return -EFBIG; /* the supervisor caps each stream: more is not the protocol */
    framed_reader_feed(s->fr, data, n);
    return 0;
}

/* GET a recorded output log into sink (its DELETE is the caller's). */
static int fetch_log(struct lb_lxd *l, const char *member, const char *log_path, lb_httpc_sink sink,
                     void *arg, struct lb_error *err)
{
    struct lb_httpc_request req = {.method = "GET",
                                   .path = log_path,
                                   .timeout_ms = l->call_timeout_ms * 4,
                                   .max_body_bytes = 65536,
                                   .sink = sink,
                                   .sink_arg = arg};
    struct lb_httpc_response resp = {0};
    int r = lxd_do(l, member, &req, &resp, err);

    if (r == 0 && resp.status != 200)
        r = lb_error_set(err, -EREMOTEIO, "LXD: cannot read the exec's output (HTTP %ld)",
                         resp.status);
    httpc_response_release(&resp);
    return r;
}

int lxd_exec_check(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                   const struct lb_exec_request *req, struct lb_error *err)
{
    int uid;

    if (req->pass_fd > 0)
        return lb_error_set(err, -ENOSYS, "the lxd provider cannot pass a file to a command");
    uid = exec_uid(req->user, err);
    return uid < 0 ? uid : 0;
}

int lxd_exec_run(struct lb_engine *e, const struct lb_sandbox_ref *ref, struct engine_exec *x,
                 struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)e;
    const struct lb_exec_request *req = x->req;
    const char *member = lxd_member_of(ref);
    const char *cwd =
        req->cwd ? req->cwd : json_string_value(json_object_get(ref->descriptor, "workdir"));
    struct frame_sink fs = {.fr = &x->fr};
    struct lb_httpc_response resp = {0};
    char path[512], m[300];
    json_t *body = NULL, *j = NULL, *md;
    const char *op, *out_log, *err_log;
    int r;

    fs.max = 2 * (uint64_t)req->max_output_bytes + FRAME_SLACK_BYTES;
    if (!cwd || !*cwd)
        cwd = "/workspace";
    body = exec_body(x, cwd, exec_uid(req->user, NULL));
    if (!body) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    snprintf(path, sizeof(path), "/1.0/instances/%s/exec", ref->id);
    r = lxd_call(l, member, "POST", path, body, 0, &resp, err);
    if (r < 0)
        goto out;
    httpc_json_message(&resp, "error", m, sizeof(m));
    if (resp.status == 404) {
        r = lb_error_set(err, -ENOENT, "no such sandbox");
        goto out;
    }
    if (strstr(m, "frozen")) {
        /* as the local provider (and API.md): an exec on a paused sandbox is 409 conflict */
        r = lb_error_set(err, -EBUSY, "sandbox '%s' is paused", ref->id);
        goto out;
    }
    if (resp.status == 400) {
        exec_result_set_runtime(x->res, LB_EXEC_SANDBOX, "the instance cannot run commands: %s", m);
        x->done = true;
        r = 0;
        goto out;
    }
    if (resp.status != 202 && resp.status != 200) {
        r = lb_error_set(err, -EREMOTEIO, "LXD: exec failed (HTTP %ld): %s", resp.status, m);
        goto out;
    }
    j = json_loadb(resp.body.data, resp.body.len, 0, NULL);
    op = json_string_value(json_object_get(j, "operation"));
    if (!op || strlen(op) > 200) {
        r = lb_error_set(err, -EREMOTEIO, "LXD: exec answered no operation");
        goto out;
    }
    /* the operation runs in the instance: a reset or stop from here ends it */
    engine_exec_started(x);
    lxd_wait_path(op, (req->timeout_ms + EXEC_SLACK_MS) / 1000, path, sizeof(path));
    json_decref(j);
    j = NULL;
    httpc_response_release(&resp);
    /* from here on a failure may mean the instance went away: engine_exec looks */
    x->transport = true;
    {
        struct lb_httpc_request wreq = {.method = "GET",
                                        .path = path,
                                        .timeout_ms = req->timeout_ms + EXEC_SLACK_MS + 2000,
                                        .max_body_bytes = 1024 * 1024,
                                        .abort = &l->eng.gates.ended};

        r = lxd_do(l, member, &wreq, &resp, err);
    }
    if (r < 0)
        goto out;
    j = json_loadb(resp.body.data, resp.body.len, 0, NULL);
    md = json_object_get(j, "metadata");
    if (resp.status != 200 ||
        strcmp(json_string_value(json_object_get(md, "status")) ?: "", "Success") != 0) {
        r = lb_error_set(err, -EREMOTEIO, "LXD: the exec did not succeed (HTTP %ld): %s",
                         resp.status,
                         json_string_value(json_object_get(md, "err"))
                             ?: httpc_json_message(&resp, "error", m, sizeof(m)));
        goto out;
    }
    out_log = json_string_value(
        json_object_get(json_object_get(json_object_get(md, "metadata"), "output"), "1"));
    err_log = json_string_value(
        json_object_get(json_object_get(json_object_get(md, "metadata"), "output"), "2"));
    if (out_log)
        r = fetch_log(l, member, out_log, frame_write, &fs, err);
    /* the exec's own stderr is only read when the supervisor left no complete result (its
     * diagnostics say why: engine_exec) */
    if (r == 0 && err_log && !framed_reader_complete(&x->fr))
        (void)fetch_log(l, member, err_log, diag_write, &x->diag, NULL);
    /* both logs are deleted after the exec answered (lxd_cleanup.c), read or not; a failed
     * read deletes them here (engine_exec asks for the instance's state next) */
    for (int k = 0; k < 2; k++) {
        const char *log = k == 0 ? out_log : err_log;

        if (log && r == 0)
            lxd_cleanup_log(l, member, log);
        else if (log)
            lxd_delete_log(l, member, log);
    }
out:
    json_decref(body);
    json_decref(j);
    httpc_response_release(&resp);
    return r;
}
