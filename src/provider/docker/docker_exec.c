/*
 * docker_exec.c - the docker provider's exec_run hook (engine_exec drives it): exec create +
 * exec start of the supervisor in framed mode, read from the engine's multiplexed stream (the
 * protocol is described in docker.h and supervise.c, "Framed mode"), and a passed fd.
 */
#include "provider/docker/docker_internal.h"
#include "provider/engine/framed.h"
#include "provider/exec_result.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"
#include "util/log.h"
#include "util/token.h"

#define EXEC_SLACK_MS 30000 /* the engine's own start-up and tear-down, past the timeout */

/* The reader of the engine's multiplexed stream (8-byte headers: stream, 0, 0, 0, size BE)
 * whose stdout carries the supervisor's frames (framed.h). */
struct exec_reader {
    struct engine_exec *x; /* stdout to x->fr, stderr to x->diag */
    unsigned char mux_hdr[8];
    size_t mux_have;
    uint32_t mux_left;
    int mux_stream;
};

static int on_stream(const void *data, size_t n, void *arg)
{
    struct exec_reader *x = arg;
    const unsigned char *p = data;

    while (n > 0) {
        if (x->mux_left == 0) {
            x->mux_hdr[x->mux_have++] = *p++;
            n--;
            if (x->mux_have == 8) {
                x->mux_stream = x->mux_hdr[0];
                x->mux_left = (uint32_t)x->mux_hdr[4] << 24 | (uint32_t)x->mux_hdr[5] << 16 |
                              (uint32_t)x->mux_hdr[6] << 8 | x->mux_hdr[7];
                x->mux_have = 0;
            }
            continue;
        }
        size_t k = n < x->mux_left ? n : x->mux_left;

        if (x->mux_stream == 1)
            framed_reader_feed(&x->x->fr, p, k);
        else
            (void)lb_buf_append_capped(&x->x->diag, p, k);
        p += k;
        n -= k;
        x->mux_left -= (uint32_t)k;
    }
    return 0;
}

/* The exec create body: the command engine_exec built (plus --pass-socket), env, user. */
static json_t *exec_body(struct engine_exec *x, const char *pass_path)
{
    const struct lb_exec_request *req = x->req;
    json_t *env = json_array(), *cmd, *body;

    if (!env)
        return NULL;
    if (pass_path) {
        json_array_append_new(x->cmd, json_string("--pass-socket"));
        json_array_append_new(x->cmd, json_string(pass_path));
    }
    cmd = engine_exec_command(x);
    if (!cmd) {
        json_decref(env);
        return NULL;
    }
    for (size_t i = 0; req->env && req->env[i]; i++)
        json_array_append_new(env, json_string(req->env[i]));
    body = json_pack("{s:b,s:b,s:b,s:b,s:O,s:o}", "AttachStdin", 0, "AttachStdout", 1,
                     "AttachStderr", 1, "Tty", 0, "Cmd", cmd, "Env", env);
    if (body && req->user && strcmp(req->user, "root") != 0 && strcmp(req->user, "0") != 0)
        json_object_set_new(body, "User", json_string(req->user));
    return body;
}

/* stdin goes in as a file under /tmp before the exec starts, while the agent's processes
 * still run: they could replace it before the sweep, so a grader's stdin would not hold */
int docker_exec_check(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                      const struct lb_exec_request *req, struct lb_error *err)
{
    if (req->exclusive && req->stdin_data)
        return lb_error_set(err, -EOPNOTSUPP,
                            "'stdin' of an exclusive exec cannot be enforced by provider 'docker' "
                            "(it passes through a file the sandbox can replace before the "
                            "sweep): put the input in the command or a file the grader checks");
    return 0;
}

int docker_exec_run(struct lb_engine *e, const struct lb_sandbox_ref *ref, struct engine_exec *x,
                    struct lb_error *err)
{
    struct lb_docker *d = (struct lb_docker *)e;
    const struct lb_exec_request *req = x->req;
    struct exec_reader rd = {.x = x};
    struct lb_httpc_response resp = {0};
    char name[256], path[512], m[300], pass_path[128];
    struct docker_pass pass = {.dir_fd = -1, .listen_fd = -1, .stop_fd = -1};
    json_t *body = NULL, *j = NULL;
    const char *exec_id;
    int r;

    docker_name(d, ref->id, name, sizeof(name));
    if (req->pass_fd > 0) {
        r = docker_pass_open(d, ref->id, req->pass_fd, &pass, pass_path, sizeof(pass_path), err);
        if (r < 0)
            goto out;
    }
    body = exec_body(x, req->pass_fd > 0 ? pass_path : NULL);
    if (!body) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    snprintf(path, sizeof(path), "/containers/%s/exec", name);
    r = docker_call(d, "POST", path, body, 30000, &resp, err);
    if (r < 0)
        goto out;
    if (resp.status == 404) {
        r = lb_error_set(err, -ENOENT, "no such sandbox");
        goto out;
    }
    if (strstr(httpc_json_message(&resp, "message", m, sizeof(m)), "is paused")) {
        /* as the local provider (and API.md): an exec on a paused sandbox is 409 conflict */
        r = lb_error_set(err, -EBUSY, "sandbox '%s' is paused", ref->id);
        goto out;
    }
    if (resp.status == 409 || (resp.status != 201 && resp.status != 200)) {
        /* not running: a sandbox-runtime result, like the local provider's */
        exec_result_set_runtime(x->res, LB_EXEC_SANDBOX, "the container cannot run commands: %s",
                                httpc_json_message(&resp, "message", m, sizeof(m)));
        x->done = true;
        r = 0;
        goto out;
    }
    j = json_loadb(resp.body.data, resp.body.len, 0, NULL);
    exec_id = json_string_value(json_object_get(j, "Id"));
    if (!exec_id) {
        r = lb_error_set(err, -EREMOTEIO, "docker engine: exec create answered no Id");
        goto out;
    }
    httpc_response_release(&resp);
    /* the exec is the container's (by its id, which a container made again under the same
     * name does not have): a reset or stop from here ends it, or its start fails */
    engine_exec_started(x);
    if (req->pass_fd > 0) {
        r = docker_pass_start(&pass, exec_id, EXEC_SLACK_MS, err);
        if (r < 0)
            goto out;
    }
    snprintf(path, sizeof(path), "/exec/%s/start", exec_id);
    {
        struct lb_httpc_request sreq = {.method = "POST",
                                        .path = path,
                                        .body = "{\"Detach\":false,\"Tty\":false}",
                                        .body_len = strlen("{\"Detach\":false,\"Tty\":false}"),
                                        .timeout_ms = req->timeout_ms + EXEC_SLACK_MS,
                                        .max_body_bytes = 4096,
                                        .sink = on_stream,
                                        .sink_arg = &rd,
                                        .abort = &d->eng.gates.ended};

        r = httpc_do(d->eng.http, &sreq, &resp, err);
    }
    if (r == 0 && resp.status == 404) {
        r = lb_error_set(err, -ENOENT, "no such sandbox");
        goto out;
    }
    x->transport = r < 0;
out:
    docker_pass_close(&pass); /* gone already once the supervisor took the fd */
    if (atomic_load(&pass.refused) > 0)
        log_warn_sbx(ref->id,
                     "docker: %d connection(s) to an exec's pass socket came from other "
                     "processes of the container; they got nothing",
                     atomic_load(&pass.refused));
    json_decref(body);
    json_decref(j);
    httpc_response_release(&resp);
    return r;
}
