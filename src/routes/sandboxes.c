/* sandboxes.c - /v1/sandboxes: status, list, delete, pause/resume, exec, files (NeMo Gym
 * AsyncSandbox). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "image/image.h"
#include "provider/provider.h"
#include "routes/routes.h"
#include "util/fault.h"
#include "util/token.h"
#include "util/utf8.h"

/* ---------- status, list, delete ---------- */

static void sandbox_get_run(struct lb_request *req, void *arg)
{
    struct lb_error err = {0};
    bool held;

    /* an operate token's status admitted before a reset is its episode's or none (401): the
     * next episode's usage, expiry and activity are not the old token's to see */
    if (routes_operate_enter_read(req, arg, &held, &err) < 0) {
        http_respond_error(req, &err);
        return;
    }
    routes_respond_lend_id(req, lend_sandbox_status, arg);
    routes_operate_leave_read(req, arg, &held);
}

static int sandbox_defer_with_id(struct lb_request *req, lb_http_job_fn fn, struct lb_error *err)
{
    char *id = strdup(http_param(req, 0));

    if (!id)
        return lb_error_set(err, -ENOMEM, "out of memory");
    return http_defer(req, fn, id, free, err);
}

int route_sandbox_get(struct lb_request *req, struct lb_error *err)
{
    char key[160];

    /* a GET asks the provider (status, and usage: an engine call on docker and lxd, a walk of
     * the workdir with local.storage = dir); whoever's token sends them, one sandbox's GETs
     * hold at most max_execs_per_sandbox workers and queue places, as its execs do */
    snprintf(key, sizeof(key), "get:%s", http_param(req, 0));
    http_set_fair_key(req, key, (size_t)((struct lb_app *)http_app(req))->max_execs_per_sandbox);
    return sandbox_defer_with_id(req, sandbox_get_run, err);
}

int route_sandboxes_list(struct lb_request *req, struct lb_error *err)
{
    return routes_respond_list(req, lend_list_sandboxes, err);
}

/* POST /v1/sandboxes: a sandbox lent to no session (NeMo Gym's AsyncSandbox.start). */
static void create_job_free(void *arg)
{
    if (arg)
        routes_spec_job_release(arg);
    free(arg);
}

static int sandbox_create_call(struct lb_app *app, void *arg, json_t **lease, struct lb_error *err)
{
    struct routes_spec_job *j = arg;

    return lend_create_sandbox(app->lend, &j->req, lease, err);
}

int route_sandbox_create(struct lb_request *req, struct lb_error *err)
{
    struct lb_app *app = http_app(req);
    struct routes_spec_job *j;
    int r;

    if (lend_is_draining(app->lend))
        return lb_error_set(err, -ESHUTDOWN, "the daemon is draining; no new sandboxes");
    j = calloc(1, sizeof(*j));
    if (!j)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = routes_spec_job_parse(req, j, false, err);
    if (r < 0) {
        create_job_free(j);
        return r;
    }
    return routes_defer_job(req, sandbox_create_call, 201, j, create_job_free, err);
}

static void sandbox_delete_run(struct lb_request *req, void *arg)
{
    routes_respond_lend_id(req, lend_delete_sandbox, arg);
}

int route_sandbox_delete(struct lb_request *req, struct lb_error *err)
{
    char rsid[160];

    /* one at a time with the seeds, releases and closes of the sandbox's session */
    if (lend_sandbox_rsid(((struct lb_app *)http_app(req))->lend, http_param(req, 0), rsid,
                          sizeof(rsid)) == 0)
        routes_serialize_session(req, rsid);
    return sandbox_defer_with_id(req, sandbox_delete_run, err);
}

/* ---------- reset ---------- */

struct reset_job {
    char id[LB_ID_MAX];
    char snapshot[LB_IMAGE_NAME_MAX + 1]; /* "": the seed's image */
};

static int sandbox_reset_call(struct lb_app *app, void *arg, json_t **lease, struct lb_error *err)
{
    struct reset_job *j = arg;

    return lend_reset(app->lend, j->id, j->snapshot[0] ? j->snapshot : NULL, lease, err);
}

int route_sandbox_reset(struct lb_request *req, struct lb_error *err)
{
    const char *id = http_param(req, 0), *snapshot = NULL;
    json_t *body = NULL, *snap;
    struct reset_job *j = NULL;
    char rsid[160];
    int r = http_body_json(req, true, &body, err);

    if (r < 0)
        return r;
    snap = json_object_get(body, "snapshot");
    if (body && !json_is_object(body))
        r = lb_error_set(err, -EINVAL, "the body must be a JSON object");
    else if (snap && !json_is_null(snap) && !json_is_string(snap))
        r = lb_error_set(err, -EINVAL, "'snapshot' must be an image name");
    else if (snap && json_is_string(snap) &&
             !image_name_is_valid(snapshot = json_string_value(snap)))
        r = routes_bad_image_name("'snapshot'", err);
    else
        r = routes_check_sandbox_id(id, err);
    if (r == 0 && !(j = calloc(1, sizeof(*j))))
        r = lb_error_set(err, -ENOMEM, "out of memory");
    if (r < 0) {
        json_decref(body);
        return r;
    }
    snprintf(j->id, sizeof(j->id), "%s", id);
    snprintf(j->snapshot, sizeof(j->snapshot), "%s", snapshot ? snapshot : "");
    json_decref(body);
    /* one at a time with the seeds, releases and closes of the sandbox's session */
    if (lend_sandbox_rsid(((struct lb_app *)http_app(req))->lend, j->id, rsid, sizeof(rsid)) == 0)
        routes_serialize_session(req, rsid);
    return routes_defer_job(req, sandbox_reset_call, 200, j, free, err);
}

/* ---------- pause / resume ---------- */

static void pause_run(struct lb_request *req, void *arg)
{
    struct lb_app *app = http_app(req);
    struct lb_error err = {0};
    json_t *out = NULL;
    const char *which_id = arg;
    bool held;
    /* an operate token's pause admitted before an exclusive exec or a reset began must not
     * freeze the one or the next episode */
    int r = routes_operate_enter(req, which_id + 1, &held, &err);

    if (r == 0) {
        r = lend_set_paused(app->lend, which_id + 1, which_id[0] == 'p', &out, &err);
        routes_operate_leave(req, which_id + 1, &held);
    }
    routes_respond(req, r, 200, out, &err);
}

/* arg is "p<id>" or "r<id>". */
static int pause_defer(struct lb_request *req, char which, struct lb_error *err)
{
    const char *id = http_param(req, 0);
    size_t n = strlen(id) + 2;
    char *arg = malloc(n);

    if (!arg)
        return lb_error_set(err, -ENOMEM, "out of memory");
    snprintf(arg, n, "%c%s", which, id);
    return http_defer(req, pause_run, arg, free, err);
}

int route_pause(struct lb_request *req, struct lb_error *err)
{
    return pause_defer(req, 'p', err);
}

int route_resume(struct lb_request *req, struct lb_error *err)
{
    return pause_defer(req, 'r', err);
}

/* ---------- renew ---------- */

/* lend_renew's recheck: an operate token's renew checks its token again under the session's
 * lock, which a reset holds (a fence here would wait for a release's close while the release
 * holds that lock). */
static int renew_recheck(void *ctx, struct lb_error *err)
{
    struct lb_request *req = ctx;

    return http_principal(req) == LB_PRINCIPAL_OPERATE ? http_reauthorize(req, err) : 0;
}

static void renew_run(struct lb_request *req, void *arg)
{
    const struct routes_id_num_job *j = arg;
    struct lb_error err = {0};
    json_t *out = NULL;
    /* tests: an operate token's renew held before its re-check, as the fenced acts are */
    int r = http_principal(req) == LB_PRINCIPAL_OPERATE ? fault_hit("operate.enter", 0, &err) : 0;

    if (r == 0)
        r = lend_renew(((struct lb_app *)http_app(req))->lend, j->id, j->n, renew_recheck, req,
                       &out, &err);
    routes_respond(req, r, 200, out, &err);
}

int route_renew(struct lb_request *req, struct lb_error *err)
{
    static const char *const fields[] = {"ttl_s", NULL};
    struct routes_id_num_job *j = NULL;
    json_t *body = NULL, *ttl;
    int r = http_body_json(req, false, &body, err);

    if (r == 0)
        r = routes_check_fields(body, fields, "the renew request", err);
    if (r < 0)
        goto out;
    /* as a seed's ttl_s: seconds > 0 (fractions round up), at most a year */
    ttl = json_object_get(body, "ttl_s");
    if (!json_is_number(ttl) || !(json_number_value(ttl) > 0) ||
        json_number_value(ttl) > 31536000.0) {
        r = lb_error_set(err, -EINVAL,
                         "'ttl_s' is required: a number of seconds > 0 and at most 31536000");
        goto out;
    }
    j = routes_id_num_job_new(http_param(req, 0), (int64_t)ceil(json_number_value(ttl)));
    if (!j) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    r = http_defer(req, renew_run, j, routes_id_num_job_free, err);
    j = NULL; /* http_defer owns it now, also on failure */
out:
    routes_id_num_job_free(j);
    json_decref(body);
    return r;
}

/* ---------- exec ---------- */

struct exec_job {
    char *id;
    json_t *body;
    struct lb_exec_params p;
    bool base64;
    bool ndjson; /* Accept: application/x-ndjson: stream the output */
};

static void exec_job_free(void *arg)
{
    struct exec_job *j = arg;

    if (!j)
        return;
    routes_free_strings(j->p.argv);
    json_decref(j->body);
    free(j->id);
    free(j);
}

static int exec_parse(struct lb_app *app, json_t *body, struct exec_job *j, struct lb_error *err)
{
    static const char *const fields[] = {
        "command",  "argv",      "cwd",        "env",
        "user",     "stdin",     "timeout_s",  "preserve_background_services",
        "encoding", "exclusive", "agent_root", NULL};
    json_t *in = json_object_get(body, "stdin");
    json_t *enc = json_object_get(body, "encoding");
    int r = routes_check_fields(body, fields, "the exec request", err);

    if (r == 0)
        r = routes_parse_command(body, &j->p.argv, err);
    if (r == 0)
        r = routes_string_map(body, "env", &j->p.env, err);
    if (r == 0)
        r = routes_parse_env_cwd_user(body, j->p.env, &j->p.cwd, &j->p.user, err);
    if (r < 0)
        return r;
    if (in && !json_is_null(in)) {
        if (!json_is_string(in))
            return lb_error_set(err, -EINVAL, "'stdin' must be a string");
        j->p.stdin_data = (const unsigned char *)json_string_value(in);
        j->p.stdin_len = json_string_length(in);
    }
    r = routes_parse_seconds(body, "timeout_s", (double)app->default_exec_timeout_s,
                             app->max_exec_timeout_s, &j->p.timeout_ms, err);
    if (r == 0)
        r = routes_parse_bool(body, "preserve_background_services", &j->p.preserve_background, err);
    if (r == 0)
        r = routes_parse_bool(body, "exclusive", &j->p.exclusive, err);
    if (r == 0)
        r = routes_parse_bool(body, "agent_root", &j->p.agent_root, err);
    if (r < 0)
        return r;
    if (j->p.agent_root && !j->p.exclusive)
        return lb_error_set(err, -EINVAL,
                            "'agent_root' applies to exclusive execs only: set 'exclusive': true");
    if (enc && !json_is_null(enc)) {
        const char *e = json_string_value(enc);

        if (!e || (strcmp(e, "utf-8") && strcmp(e, "base64")))
            return lb_error_set(err, -EINVAL, "'encoding' must be \"utf-8\" or \"base64\"");
        j->base64 = strcmp(e, "base64") == 0;
    }
    return 0;
}

static json_t *exec_render_stream(const struct lb_buf *b, bool base64)
{
    struct lb_buf clean;
    json_t *s;

    if (base64) {
        char *text = NULL;
        size_t n = 0;

        if (token_base64_encode(b->data ? b->data : "", b->len, &text, &n) < 0)
            return NULL;
        s = json_stringn_nocheck(text, n);
        free(text);
        return s;
    }
    lb_buf_init(&clean, 0);
    if (utf8_sanitize(b->data ? b->data : "", b->len, &clean) < 0) {
        lb_buf_release(&clean);
        return NULL;
    }
    s = json_stringn(clean.data ? clean.data : "", clean.len);
    lb_buf_release(&clean);
    return s;
}

/* The result object; stdout and stderr are null when with_output is false (streamed: the
 * output went out in the chunks). NULL when out of memory. */
static json_t *exec_result_json(const struct lb_exec_result *res, bool base64, bool with_output)
{
    static const char *const error_names[] = {NULL, "timeout", "sandbox", "oom"};
    const char *et = error_names[res->error_type];
    json_t *out =
        json_pack("{s:i,s:o*,s:o*,s:s?,s:b,s:b,s:I}", "return_code", res->return_code, "stdout",
                  with_output ? exec_render_stream(&res->out, base64) : json_null(), "stderr",
                  with_output ? exec_render_stream(&res->err, base64) : json_null(), "error_type",
                  et, "stdout_truncated", res->out.truncated, "stderr_truncated",
                  res->err.truncated, "duration_ms", (json_int_t)res->duration_ms);

    /* why an error_type is set, as one sentence (null for a plain exit) */
    if (out) {
        struct lb_buf m = {.data = (char *)res->message, .len = strlen(res->message)};

        json_object_set_new(out, "message",
                            res->error_type != LB_EXEC_OK && m.len ? exec_render_stream(&m, false)
                                                                   : json_null());
    }
    return out;
}

/*
 * Streamed exec (Accept: application/x-ndjson): one JSON object per line, {"stream":
 * "stdout"|"stderr", "data": text} as output is read, then the result object (stdout and stderr
 * null) or, for a failure after the stream began, {"error": {...}}. The response begins with
 * the first output (or at the end for a silent command), so errors found before the command
 * runs keep their status. data is the chunk as UTF-8 (invalid bytes become U+FFFD; a sequence
 * cut between two reads is held back for the next chunk, so the chunks concatenate to the text
 * a plain exec returns) or, with "encoding": "base64", the chunk's bytes in base64. Runs on
 * the exec's worker; the client is never waited for (http_stream_write queues).
 */
struct exec_ndjson {
    struct lb_request *req; /* until the stream begins */
    struct lb_stream *stream;
    bool base64;
    bool plain;       /* the stream could not begin: answer with the plain object at the end */
    bool gone;        /* the client hung up: the exec runs on, its output is dropped */
    size_t sent[3];   /* bytes of [LB_EXEC_STDOUT] / [LB_EXEC_STDERR] taken so far */
    char carry[3][4]; /* a UTF-8 sequence cut short at the end of the last chunk */
    size_t carry_len[3];
};

static void ndjson_write(struct exec_ndjson *x, json_t *line)
{
    char *text;

    if (!x->stream && !x->plain && !x->gone) {
        x->stream = http_stream_begin(x->req, 200, "application/x-ndjson");
        x->plain = !x->stream;
    }
    if (!x->stream || x->gone || !line) {
        json_decref(line);
        return;
    }
    text = json_dumps(line, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(line);
    if (!text || http_stream_write(x->stream, text, strlen(text)) < 0 ||
        http_stream_write(x->stream, "\n", 1) < 0)
        x->gone = true;
    free(text);
}

/* One chunk line for stream st (1 stdout, 2 stderr); last: flush what is held back. */
static void ndjson_chunk(struct exec_ndjson *x, int st, const char *data, size_t len, bool last)
{
    size_t n = x->carry_len[st] + len, keep = 0;
    char *all = malloc(n + 1);
    json_t *text;

    if (!all) {
        x->gone = true; /* cannot render: stop streaming rather than send a gap */
        return;
    }
    memcpy(all, x->carry[st], x->carry_len[st]);
    if (len)
        memcpy(all + x->carry_len[st], data, len);
    if (!x->base64 && !last)
        keep = utf8_incomplete_tail(all, n);
    memcpy(x->carry[st], all + n - keep, keep);
    x->carry_len[st] = keep;
    n -= keep;
    if (n > 0) {
        struct lb_buf b = {.data = all, .len = n};

        text = exec_render_stream(&b, x->base64);
        ndjson_write(x, text ? json_pack("{s:s,s:o}", "stream",
                                         st == LB_EXEC_STDOUT ? "stdout" : "stderr", "data", text)
                             : NULL);
        if (!text)
            x->gone = true;
    }
    free(all);
}

/* provider on_output (the exec's worker thread) */
static void exec_on_output(void *ctx, int st, const char *data, size_t len)
{
    struct exec_ndjson *x = ctx;

    if (st != LB_EXEC_STDOUT && st != LB_EXEC_STDERR)
        return;
    x->sent[st] += len;
    if (!x->plain && !x->gone)
        ndjson_chunk(x, st, data, len, false);
}

/* The exec is over: what the provider did not report as it came (a provider without
 * on_output, lendbox's own stderr lines), the held-back bytes, then the last line. */
static void exec_ndjson_finish(struct exec_ndjson *x, int r, const struct lb_exec_result *res,
                               const struct lb_error *err)
{
    const struct lb_buf *bufs[3] = {NULL, &res->out, &res->err};

    for (int st = LB_EXEC_STDOUT; r == 0 && st <= LB_EXEC_STDERR; st++) {
        if (bufs[st]->len > x->sent[st])
            ndjson_chunk(x, st, bufs[st]->data + x->sent[st], bufs[st]->len - x->sent[st], true);
        else if (x->carry_len[st])
            ndjson_chunk(x, st, NULL, 0, true);
    }
    if (r == 0) {
        ndjson_write(x, exec_result_json(res, x->base64, false));
    } else {
        const char *code = "internal";

        lb_error_http_status(err->code ? err->code : -EIO, &code);
        ndjson_write(x, json_pack("{s:{s:s,s:s}}", "error", "code", code, "message",
                                  err->message[0] ? err->message : "internal error"));
    }
    http_stream_end(x->stream);
}

static void exec_run(struct lb_request *req, void *arg)
{
    struct exec_job *j = arg;
    struct lb_app *app = http_app(req);
    struct lb_exec_result res = {0};
    struct lb_error err = {0};
    struct exec_ndjson x = {.req = req, .base64 = j->base64};
    json_t *out = NULL;
    int r;

    bool held = false;

    if (j->ndjson) {
        j->p.on_output = exec_on_output;
        j->p.output_ctx = &x;
    }
    /* an operate token's exec starts in the episode that admitted it, or not at all: a reset
     * waits for its start (and then ends it) or revoked its token first */
    r = routes_operate_enter(req, j->id, &held, &err);
    if (r < 0) {
        routes_respond(req, r, 200, NULL, &err);
        return;
    }
    j->p.fence_held = &held;
    r = lend_exec(app->lend, j->id, &j->p, &res, &err);
    routes_operate_leave(req, j->id, &held);
    if (j->ndjson && !x.plain && (x.stream || r == 0)) {
        /* streamed (or a silent command's whole answer): req is not ours once begun */
        if (!x.stream)
            ndjson_write(&x, NULL);
        if (x.stream) {
            exec_ndjson_finish(&x, r, &res, &err);
            provider_exec_result_release(&res);
            return;
        }
    }
    if (r == 0) {
        out = exec_result_json(&res, j->base64, true);
        if (!out)
            r = lb_error_set(&err, -ENOMEM, "cannot render the exec result");
    }
    provider_exec_result_release(&res);
    routes_respond(req, r, 200, out, &err);
}

int route_exec(struct lb_request *req, struct lb_error *err)
{
    struct exec_job *j = calloc(1, sizeof(*j));
    int r;

    if (!j || !(j->id = strdup(http_param(req, 0)))) {
        free(j);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    r = http_body_json(req, false, &j->body, err);
    if (r == 0)
        r = exec_parse(http_app(req), j->body, j, err);
    /* An exclusive exec is the grader's: it stops the agent's processes and holds the sandbox
     * (every other exec, the admin's too, is 409 while it runs), so the agent's own token may
     * not start one, or it could end a grader's exec and lock the grader out for its
     * timeout. */
    if (r == 0 && j->p.exclusive && http_principal(req) == LB_PRINCIPAL_OPERATE)
        r = lb_error_set(err, -EACCES,
                         "an exclusive exec needs the admin token (a grader's); the sandbox's "
                         "operate token may not start one");
    {
        const char *accept = http_header(req, "Accept");

        j->ndjson = accept && strcasestr(accept, "application/x-ndjson");
    }
    if (r < 0) {
        exec_job_free(j);
        return r;
    }
    /* one sandbox's execs hold at most max_execs_per_sandbox workers and queue places */
    {
        char key[160];

        snprintf(key, sizeof(key), "exec:%s", j->id);
        http_set_fair_key(req, key,
                          (size_t)((struct lb_app *)http_app(req))->max_execs_per_sandbox);
    }
    return http_defer(req, exec_run, j, exec_job_free, err);
}

/* ---------- files ---------- */

/* A Range request (bytes=a-b, a- or -n); kind NONE serves the whole file. */
struct byte_range {
    enum { RANGE_NONE, RANGE_FROM, RANGE_SUFFIX } kind;
    uint64_t first, last; /* FROM: first..last (last UINT64_MAX: to the end); SUFFIX: last n */
};

struct file_job {
    char *id;
    char *path;
    char *owner; /* PUT ?owner=: NULL = the sandbox's root */
    int mode;
    struct byte_range range;
};

static void file_job_free(void *arg)
{
    struct file_job *j = arg;

    if (!j)
        return;
    free(j->id);
    free(j->path);
    free(j->owner);
    free(j);
}

static int file_job_new(struct lb_request *req, bool with_mode, struct file_job **out,
                        struct lb_error *err)
{
    const char *path = http_query(req, "path"), *mode = http_query(req, "mode");
    const char *owner = with_mode ? http_query(req, "owner") : NULL;
    struct file_job *j;

    if (!path || !provider_path_is_valid(path))
        return lb_error_set(err, -EINVAL,
                            "query 'path' must be an absolute, normalised path (no '..')");
    j = calloc(1, sizeof(*j));
    if (!j || !(j->id = strdup(http_param(req, 0))) || !(j->path = strdup(path))) {
        file_job_free(j);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    j->mode = -1;
    if (mode && with_mode) {
        char *end = NULL;
        long m = strtol(mode, &end, 8);

        if (!*mode || *end || m < 0 || m > 07777) {
            file_job_free(j);
            return lb_error_set(err, -EINVAL, "query 'mode' must be octal 0000-7777");
        }
        j->mode = (int)m;
    }
    if (owner) {
        if (!*owner || strlen(owner) > 255) {
            file_job_free(j);
            return lb_error_set(err, -EINVAL,
                                "query 'owner' must be a user of the sandbox (name or uid)");
        }
        j->owner = strdup(owner);
        if (!j->owner) {
            file_job_free(j);
            return lb_error_set(err, -ENOMEM, "out of memory");
        }
    }
    *out = j;
    return 0;
}

/* PUT: the body streams into a temporary file inside the sandbox (lend_upload_begin), opened
 * by a job before any body byte is read; the finish job renames it into place. The body is
 * never whole in the daemon's memory. */
struct upload_job {
    struct lb_lend *lend;
    struct lb_upload *upload;
    char *fenced_id; /* an operate-token upload: the sandbox whose fence its commit passes */
};

static void upload_finish(struct lb_request *req, void *arg)
{
    struct upload_job *u = arg;
    struct lb_error err = {0};
    bool held = false;
    int r = 0;

    /* admitted before an exclusive exec or a reset began, its bytes may land only before the
     * sweep, or in the episode whose token sent them */
    if (u->fenced_id && (r = routes_operate_enter(req, u->fenced_id, &held, &err)) < 0) {
        lend_upload_abort(u->lend, u->upload);
    } else {
        r = lend_upload_commit(u->lend, u->upload, &err);
        if (u->fenced_id)
            routes_operate_leave(req, u->fenced_id, &held);
    }
    free(u->fenced_id);
    free(u);
    if (r < 0)
        http_respond_error(req, &err);
    else
        http_respond_empty(req, 204);
}

static void upload_abort(void *arg)
{
    struct upload_job *u = arg;

    lend_upload_abort(u->lend, u->upload);
    free(u->fenced_id);
    free(u);
}

static int upload_write_failed(void *arg, int errnum, uint64_t bytes, struct lb_error *err)
{
    struct upload_job *u = arg;

    return lend_upload_error(u->lend, u->upload, errnum, bytes, err);
}

static int upload_reserve(void *arg, uint64_t need, uint64_t want, struct lb_error *err)
{
    struct upload_job *u = arg;

    return lend_upload_reserve(u->lend, u->upload, need, want, err);
}

static void file_put_open(struct lb_request *req, void *arg)
{
    struct file_job *j = arg;
    struct lb_app *app = http_app(req);
    struct lb_error err = {0};
    struct upload_job *u = calloc(1, sizeof(*u));
    bool held = false;
    /* its temporary file is made in the episode whose token sent it, or not at all */
    int r = u ? routes_operate_enter(req, j->id, &held, &err)
              : lb_error_set(&err, -ENOMEM, "out of memory");

    if (r == 0) {
        r = lend_upload_begin(app->lend, j->id, j->path, j->mode, j->owner, &u->upload, &err);
        routes_operate_leave(req, j->id, &held);
    }

    if (r < 0) {
        free(u);
        http_respond_error(req, &err);
        return;
    }
    u->lend = app->lend;
    {
        /* a body of known length: room for all of it now, on this worker, before a byte is
         * read (a file in the sandbox's memory is charged to the sandbox; what its memory
         * limit cannot hold is a 413 here) */
        const char *clen = http_header(req, "Content-Length");
        char *end = NULL;
        unsigned long long n = clen ? strtoull(clen, &end, 10) : 0;

        if (n > 0 && end && *end == '\0' &&
            lend_upload_reserve(app->lend, u->upload, (uint64_t)n, (uint64_t)n, &err) < 0) {
            lend_upload_abort(app->lend, u->upload);
            free(u);
            http_respond_error(req, &err);
            return;
        }
    }
    if (http_principal(req) == LB_PRINCIPAL_OPERATE && !(u->fenced_id = strdup(j->id))) {
        lend_upload_abort(u->lend, u->upload);
        free(u);
        lb_error_set(&err, -ENOMEM, "out of memory");
        http_respond_error(req, &err);
        return;
    }
    http_body_sink(req, &(struct lb_body_sink){.fd = u->upload->fd,
                                               .finish = upload_finish,
                                               .abort = upload_abort,
                                               .write_failed = upload_write_failed,
                                               .reserve = upload_reserve,
                                               .arg = u});
}

int route_file_put(struct lb_request *req, struct lb_error *err)
{
    struct file_job *j = NULL;
    int r = file_job_new(req, true, &j, err);

    if (r < 0)
        return r;
    return http_defer(req, file_put_open, j, file_job_free, err);
}

/* Parse a Range header. Only one range of bytes is served; anything else (other units, several
 * ranges, bad syntax) is ignored and the whole file served, as RFC 9110 allows. */
static void range_parse(const char *h, struct byte_range *r)
{
    const char *p;
    char *end;

    r->kind = RANGE_NONE;
    if (!h || strncmp(h, "bytes=", 6) != 0 || strchr(h, ','))
        return;
    p = h + 6;
    while (*p == ' ')
        p++;
    if (*p == '-') {
        if (p[1] < '0' || p[1] > '9')
            return;
        errno = 0;
        r->last = strtoull(p + 1, &end, 10);
        if (errno || (*end && *end != ' '))
            return;
        r->kind = RANGE_SUFFIX;
        return;
    }
    if (*p < '0' || *p > '9')
        return;
    errno = 0;
    r->first = strtoull(p, &end, 10);
    if (errno || *end != '-')
        return;
    p = end + 1;
    r->last = UINT64_MAX;
    if (*p >= '0' && *p <= '9') {
        r->last = strtoull(p, &end, 10);
        if (errno || r->last < r->first)
            return;
        p = end;
    }
    while (*p == ' ')
        p++;
    if (*p)
        return;
    r->kind = RANGE_FROM;
}

static void file_get_run(struct lb_request *req, void *arg)
{
    struct file_job *j = arg;
    struct lb_app *app = http_app(req);
    struct lb_error err = {0};
    uint64_t size = 0, first = 0, len;
    char header[96];
    int fd = -1;
    bool held;
    /* an operate token's read admitted before a reset opens a file of its own episode or
     * none (401): the open is fenced, what it opened is read after */
    int r = routes_operate_enter_read(req, j->id, &held, &err);

    if (r == 0) {
        r = lend_file_open(app->lend, j->id, j->path, &fd, &size, &err);
        routes_operate_leave_read(req, j->id, &held);
    }
    if (r < 0) {
        http_respond_error(req, &err);
        return;
    }
    if (j->range.kind == RANGE_NONE) {
        http_respond_fd(req, 200, fd, size);
        http_response_header(req, "Accept-Ranges", "bytes");
        return;
    }
    if (j->range.kind == RANGE_SUFFIX) {
        len = j->range.last < size ? j->range.last : size;
        first = size - len;
    } else {
        first = j->range.first;
        len = first < size ? (j->range.last < size - 1 ? j->range.last : size - 1) - first + 1 : 0;
    }
    if (len == 0) {
        close(fd);
        http_respond_json(req, 416,
                          json_pack("{s:{s:s,s:s}}", "error", "code", "range_not_satisfiable",
                                    "message", "the requested range is outside the file"));
        snprintf(header, sizeof(header), "bytes */%llu", (unsigned long long)size);
        http_response_header(req, "Content-Range", header);
        return;
    }
    http_respond_fd_range(req, 206, fd, first, len);
    snprintf(header, sizeof(header), "bytes %llu-%llu/%llu", (unsigned long long)first,
             (unsigned long long)(first + len - 1), (unsigned long long)size);
    http_response_header(req, "Content-Range", header);
    http_response_header(req, "Accept-Ranges", "bytes");
}

int route_file_get(struct lb_request *req, struct lb_error *err)
{
    struct file_job *j = NULL;
    int r = file_job_new(req, false, &j, err);

    if (r < 0)
        return r;
    range_parse(http_header(req, "Range"), &j->range);
    return http_defer(req, file_get_run, j, file_job_free, err);
}
