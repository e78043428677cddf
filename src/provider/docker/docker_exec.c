/*
 * docker_exec.c - exec on the docker provider: exec create + exec start of the supervisor in
 * framed mode (the protocol is described in docker.h and supervise.c, "Framed mode").
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

#define DIAG_MAX 4096
#define EXEC_SLACK_MS 30000 /* the engine's own start-up and tear-down, past the timeout */

/* The reader of the engine's multiplexed stream (8-byte headers: stream, 0, 0, 0, size BE)
 * whose stdout carries the supervisor's frames (framed.h). */
struct exec_reader {
    struct lb_framed_reader fr;
    unsigned char mux_hdr[8];
    size_t mux_have;
    uint32_t mux_left;
    int mux_stream;
    struct lb_buf diag; /* the exec's own stderr: the engine's or the supervisor's complaints */
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
            framed_reader_feed(&x->fr, p, k);
        else
            (void)lb_buf_append_capped(&x->diag, p, k);
        p += k;
        n -= k;
        x->mux_left -= (uint32_t)k;
    }
    return 0;
}

/* A fresh unguessable file name (24 hex digits) into buf. */
static int random_name(char *buf, size_t size, struct lb_error *err)
{
    char hex[2 * 12 + 1];
    int r = token_random_hex(12, hex);

    if (r < 0)
        return lb_error_set(err, -EREMOTEIO, "no random bytes: %s", strerror(-r));
    snprintf(buf, size, "%s", hex);
    return 0;
}

/* Put stdin bytes into the container as a file the supervisor opens and unlinks. */
static int put_stdin(struct lb_docker *d, const char *id, const struct lb_exec_request *req,
                     char *path, size_t size, struct lb_error *err)
{
    char name[32];
    int r = random_name(name, sizeof(name), err);

    if (r < 0)
        return r;
    snprintf(path, size, "/tmp/.lendbox-stdin-%s", name);
    return docker_put_file(d, id, path, -1, req->stdin_data, req->stdin_len, 0600, err);
}

static json_t *exec_body(struct lb_docker *d, const struct lb_exec_request *req,
                         const char *stdin_path, const char *pass_path)
{
    json_t *cmd = json_array(), *env = json_array(), *body;
    char num[32];

    if (!cmd || !env)
        goto fail;
    json_array_append_new(cmd, json_string(DOCKER_SUPERVISE_PATH));
    json_array_append_new(cmd, json_string("--framed"));
    json_array_append_new(cmd, json_string("--max-output"));
    snprintf(num, sizeof(num), "%zu", req->max_output_bytes > 0 ? req->max_output_bytes : 1);
    json_array_append_new(cmd, json_string(num));
    json_array_append_new(cmd, json_string("--timeout-ms"));
    snprintf(num, sizeof(num), "%lld", (long long)req->timeout_ms);
    json_array_append_new(cmd, json_string(num));
    if (req->cwd) {
        json_array_append_new(cmd, json_string("--cwd"));
        json_array_append_new(cmd, json_string(req->cwd));
    }
    if (req->preserve_background)
        json_array_append_new(cmd, json_string("--keep-background"));
    if (req->exclusive)
        json_array_append_new(cmd, json_string("--exclusive"));
    if (stdin_path) {
        json_array_append_new(cmd, json_string("--stdin-file"));
        json_array_append_new(cmd, json_string(stdin_path));
    }
    if (pass_path) {
        json_array_append_new(cmd, json_string("--pass-socket"));
        json_array_append_new(cmd, json_string(pass_path));
    }
    json_array_append_new(cmd, json_string("--"));
    for (size_t i = 0; req->argv[i]; i++)
        json_array_append_new(cmd, json_string(req->argv[i]));
    for (size_t i = 0; req->env && req->env[i]; i++)
        json_array_append_new(env, json_string(req->env[i]));
    body = json_pack("{s:b,s:b,s:b,s:b,s:o,s:o}", "AttachStdin", 0, "AttachStdout", 1,
                     "AttachStderr", 1, "Tty", 0, "Cmd", cmd, "Env", env);
    if (body && req->user && strcmp(req->user, "root") != 0 && strcmp(req->user, "0") != 0)
        json_object_set_new(body, "User", json_string(req->user));
    return body;
fail:
    json_decref(cmd);
    json_decref(env);
    return NULL;
}

int docker_exec(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                const struct lb_exec_request *req, struct lb_exec_result *res, struct lb_error *err)
{
    struct lb_docker *d = (struct lb_docker *)p;
    struct exec_reader x = {0};
    struct lb_httpc_response resp = {0};
    char name[256], path[512], stdin_path[128], m[300], pass_path[128];
    struct docker_pass pass = {.dir_fd = -1, .listen_fd = -1, .stop_fd = -1};
    enum lb_sandbox_status st;
    json_t *body = NULL, *j = NULL;
    const char *exec_id;
    int64_t t0 = clock_mono_ms();
    int r;

    memset(res, 0, sizeof(*res));
    lb_buf_init(&res->out, req->max_output_bytes);
    lb_buf_init(&res->err, req->max_output_bytes);
    lb_buf_init(&x.diag, DIAG_MAX);
    framed_reader_init(&x.fr, res);
    if (gates_ended(&d->eng.gates)) {
        exec_result_set_runtime(res, LB_EXEC_SANDBOX, "%s",
                                "the daemon is shutting down and no longer runs commands");
        return 0;
    }
    /* stdin goes in as a file under /tmp before the exec starts, while the agent's processes
     * still run: they could replace it before the sweep, so a grader's stdin would not hold */
    if (req->exclusive && req->stdin_data)
        return lb_error_set(err, -EOPNOTSUPP,
                            "'stdin' of an exclusive exec cannot be enforced by provider 'docker' "
                            "(it passes through a file the sandbox can replace before the "
                            "sweep): put the input in the command or a file the grader checks");
    r = gates_enter(&d->eng.gates, ref->id, req->exclusive, err);
    if (r == -ESHUTDOWN) {
        lb_error_clear(err);
        exec_result_set_runtime(res, LB_EXEC_SANDBOX, "%s",
                                "the daemon is shutting down and no longer runs commands");
        return 0;
    }
    if (r < 0)
        return r;
    docker_name(d, ref->id, name, sizeof(name));
    if (req->stdin_data) {
        r = put_stdin(d, ref->id, req, stdin_path, sizeof(stdin_path), err);
        if (r < 0)
            goto out;
    }
    if (req->pass_fd > 0) {
        r = docker_pass_open(d, ref->id, req->pass_fd, &pass, pass_path, sizeof(pass_path), err);
        if (r < 0)
            goto out;
    }
    body =
        exec_body(d, req, req->stdin_data ? stdin_path : NULL, req->pass_fd > 0 ? pass_path : NULL);
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
    if (strstr(docker_engine_message(&resp, m, sizeof(m)), "is paused")) {
        /* as the local provider (and API.md): an exec on a paused sandbox is 409 conflict */
        r = lb_error_set(err, -EBUSY, "sandbox '%s' is paused", ref->id);
        goto out;
    }
    if (resp.status == 409 || (resp.status != 201 && resp.status != 200)) {
        /* not running: a sandbox-runtime result, like the local provider's */
        exec_result_set_runtime(res, LB_EXEC_SANDBOX, "the container cannot run commands: %s",
                                docker_engine_message(&resp, m, sizeof(m)));
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
                                        .max_body_bytes = DIAG_MAX,
                                        .sink = on_stream,
                                        .sink_arg = &x,
                                        .abort = &d->eng.gates.ended};

        r = httpc_do(d->http, &sreq, &resp, err);
    }
    if (r == -ECANCELED) {
        lb_error_clear(err);
        exec_result_set_runtime(res, LB_EXEC_SANDBOX, "%s",
                                "the daemon is shutting down and no longer waits for this command");
        r = 0;
        goto out;
    }
    if (r == 0 && resp.status == 404) {
        r = lb_error_set(err, -ENOENT, "no such sandbox");
        goto out;
    }
    if (framed_reader_complete(&x.fr) && r == 0) {
        framed_reader_apply_status(&x.fr);
        goto out;
    }
    /* no status: the supervisor died, the container went away, or the transport failed */
    if (docker_state(d, ref->id, &st, NULL) == 0 && st == LB_STATUS_STOPPED) {
        lb_error_clear(err);
        r = lb_error_set(err, -ENOENT, "no such sandbox");
        goto out;
    }
    if (r < 0) {
        r = lb_error_keep(err, -EREMOTEIO, "the exec transport failed");
        r = -EREMOTEIO;
        goto out;
    }
    exec_result_set_runtime(res, LB_EXEC_SANDBOX, "the supervisor ended without a result: %.400s",
                            x.diag.data ? x.diag.data : "no output from the engine");
    r = 0;
out:
    docker_pass_close(&pass); /* gone already once the supervisor took the fd */
    if (atomic_load(&pass.refused) > 0)
        log_warn_sbx(ref->id,
                     "docker: %d connection(s) to an exec's pass socket came from other "
                     "processes of the container; they got nothing",
                     atomic_load(&pass.refused));
    res->duration_ms = clock_mono_ms() - t0;
    gates_leave(&d->eng.gates, ref->id, req->exclusive);
    lb_buf_release(&x.diag);
    json_decref(body);
    json_decref(j);
    httpc_response_release(&resp);
    return r;
}
