/*
 * engine_exec.c - the engine base's exec driver (see engine.h): lendbox-supervise in framed
 * mode inside the instance, run by the backend's exec_run hook; admission, stdin, the
 * supervisor's options and the meaning of the result are the same for every engine.
 */
#include "provider/engine/engine.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "provider/exec_result.h"
#include "util/clock.h"
#include "util/token.h"

#define DIAG_MAX 4096

static const char shutting_down[] = "the daemon is shutting down and no longer runs commands";

/* Put stdin into the instance as a file under an unguessable name the supervisor opens and
 * unlinks; its path into path. */
static int put_stdin(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                     const struct lb_exec_request *req, char *path, size_t size,
                     struct lb_error *err)
{
    char hex[2 * 12 + 1];
    int r = token_random_hex(12, hex);

    if (r < 0)
        return lb_error_set(err, -EREMOTEIO, "no random bytes: %s", strerror(-r));
    snprintf(path, size, "/tmp/.lendbox-stdin-%s", hex);
    return e->hooks->put_file(e, ref, path, -1, req->stdin_data, req->stdin_len, 0600, err);
}

/* The supervisor and the options every engine gives it. */
static json_t *base_command(struct lb_engine *e, const struct lb_exec_request *req,
                            const char *stdin_path)
{
    json_t *cmd = json_array();
    char num[32];

    if (!cmd)
        return NULL;
    json_array_append_new(cmd, json_string(e->supervise_inside));
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
    return cmd;
}

void engine_exec_started(struct engine_exec *x)
{
    if (x->started)
        return;
    x->started = true;
    if (x->req->on_started)
        x->req->on_started(x->req->started_ctx);
}

json_t *engine_exec_command(struct engine_exec *x)
{
    if (json_array_append_new(x->cmd, json_string("--")) < 0)
        return NULL;
    for (size_t i = 0; x->req->argv[i]; i++)
        if (json_array_append_new(x->cmd, json_string(x->req->argv[i])) < 0)
            return NULL;
    return x->cmd;
}

int engine_exec(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                const struct lb_exec_request *req, struct lb_exec_result *res, struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;
    struct engine_exec x = {.req = req, .res = res};
    enum lb_sandbox_status st;
    char stdin_path[128] = "";
    int64_t t0 = clock_mono_ms();
    int r;

    memset(res, 0, sizeof(*res));
    lb_buf_init(&res->out, req->max_output_bytes);
    lb_buf_init(&res->err, req->max_output_bytes);
    lb_buf_init(&x.diag, DIAG_MAX);
    framed_reader_init(&x.fr, res);
    if (e->hooks->exec_check && (r = e->hooks->exec_check(e, ref, req, err)) < 0)
        return r;
    r = gates_enter(&e->gates, ref->id, req->exclusive, err);
    if (r == -ESHUTDOWN) {
        lb_error_clear(err);
        exec_result_set_runtime(res, LB_EXEC_SANDBOX, "%s", shutting_down);
        return 0;
    }
    if (r < 0)
        return r;
    if (req->stdin_data) {
        r = put_stdin(e, ref, req, stdin_path, sizeof(stdin_path), err);
        if (r < 0)
            goto out;
    }
    x.cmd = base_command(e, req, stdin_path[0] ? stdin_path : NULL);
    if (!x.cmd) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    r = e->hooks->exec_run(e, ref, &x, err);
    if (r == -ECANCELED) {
        lb_error_clear(err);
        exec_result_set_runtime(res, LB_EXEC_SANDBOX, "%s",
                                "the daemon is shutting down and no longer waits for this "
                                "command");
        r = 0;
        goto out;
    }
    if ((r < 0 && !x.transport) || (r == 0 && x.done))
        goto out;
    if (r == 0 && framed_reader_complete(&x.fr)) {
        framed_reader_apply_status(&x.fr);
        goto out;
    }
    /* no status: the supervisor died, the instance went away, or the transport failed */
    if (e->hooks->state(e, ref, &st, NULL) == 0 && st == LB_STATUS_STOPPED) {
        lb_error_clear(err);
        r = lb_error_set(err, -ENOENT, "no such sandbox");
        goto out;
    }
    if (r < 0) {
        r = lb_error_recode(err, -EREMOTEIO, "the exec transport failed");
        goto out;
    }
    if (x.diag.data && x.diag.len)
        exec_result_set_runtime(res, LB_EXEC_SANDBOX,
                                "the supervisor ended without a result: %.400s", x.diag.data);
    else
        exec_result_set_runtime(res, LB_EXEC_SANDBOX,
                                "the supervisor ended without a result: no output from %s",
                                e->hooks->engine_label);
    r = 0;
out:
    res->duration_ms = clock_mono_ms() - t0;
    gates_leave(&e->gates, ref->id, req->exclusive);
    lb_buf_release(&x.diag);
    json_decref(x.cmd);
    return r;
}
