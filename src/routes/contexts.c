/*
 * contexts.c - the code-context routes of API.md "Toolbox" (lend/context.h does the work):
 *
 *   POST   /v1/sandboxes/{id}/contexts   {"language"} -> 201 {"context_id","language"} (a worker)
 *   POST   /v1/contexts/{cid}/run        {"code","timeout_s"?} -> 200 the run (a worker)
 *   POST   /v1/contexts/{cid}/interrupt  -> 200 {"context_id"}
 *   DELETE /v1/contexts/{cid}            -> 204
 *
 * Admin, or the operate token of the context's sandbox. Creates and runs take the sandbox's
 * exec share of the workers (a run holds its worker until it answers).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lend/context.h"
#include "routes/routes.h"

#define DEFAULT_TIMEOUT_S 60

static struct lb_ptys *ptys_of(struct lb_request *req)
{
    return ((struct lb_app *)http_app(req))->ptys;
}

/* The sandbox's exec share of the workers: one sandbox's runs cannot hold up the others. */
static void fair_key(struct lb_request *req, const char *sandbox_id)
{
    char key[160];

    snprintf(key, sizeof(key), "exec:%s", sandbox_id);
    http_set_fair_key(req, key, (size_t)((struct lb_app *)http_app(req))->max_execs_per_sandbox);
}

struct context_job {
    char id[LB_PTY_SID_MAX > LB_ID_MAX ? LB_PTY_SID_MAX : LB_ID_MAX];
    json_t *body;
    const char *code;
    int64_t timeout_ms;
};

static void context_job_free(void *arg)
{
    struct context_job *j = arg;

    if (!j)
        return;
    json_decref(j->body);
    free(j);
}

/* A job for param 0 with the request's JSON body checked against fields. */
static struct context_job *context_job_new(struct lb_request *req, const char *const *fields,
                                           const char *what, struct lb_error *err)
{
    struct context_job *j = calloc(1, sizeof(*j));

    if (!j) {
        lb_error_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    snprintf(j->id, sizeof(j->id), "%s", http_param(req, 0));
    if (http_body_json(req, true, &j->body, err) < 0 ||
        routes_check_fields(j->body, fields, what, err) < 0) {
        context_job_free(j);
        return NULL;
    }
    return j;
}

static void create_run(struct lb_request *req, void *arg)
{
    struct context_job *j = arg;
    const char *language = json_string_value(json_object_get(j->body, "language"));
    char cid[LB_PTY_SID_MAX];
    struct lb_error err = {0};
    bool held;
    /* an operate token's context starts in the episode that admitted it */
    int r = routes_operate_enter(req, j->id, &held, &err);

    if (r == 0) {
        r = context_create(ptys_of(req), j->id, language ? language : "python", &held, cid, &err);
        routes_operate_leave(req, j->id, &held);
    }

    routes_respond(req, r, 201,
                   r == 0 ? json_pack("{s:s,s:s}", "context_id", cid, "language", "python") : NULL,
                   &err);
}

int route_context_create(struct lb_request *req, struct lb_error *err)
{
    static const char *const fields[] = {"language", NULL};
    struct context_job *j = context_job_new(req, fields, "the context request", err);
    json_t *language;

    if (!j)
        return err->code;
    language = json_object_get(j->body, "language");
    if (language && !json_is_null(language) &&
        (!json_is_string(language) || strcmp(json_string_value(language), "python") != 0)) {
        context_job_free(j);
        return lb_error_set(err, -EINVAL, "'language' must be \"python\"");
    }
    fair_key(req, j->id);
    return http_defer(req, create_run, j, context_job_free, err);
}

static int run_call(struct lb_app *app, void *arg, json_t **out, struct lb_error *err)
{
    struct context_job *j = arg;

    return context_run(app->ptys, j->id, j->code, j->timeout_ms, out, err);
}

int route_context_run(struct lb_request *req, struct lb_error *err)
{
    static const char *const fields[] = {"code", "timeout_s", NULL};
    struct lb_app *app = http_app(req);
    struct context_job *j = context_job_new(req, fields, "the run request", err);
    char sandbox[LB_ID_MAX];
    json_t *code;
    double def = DEFAULT_TIMEOUT_S;
    int r;

    if (!j)
        return err->code;
    code = json_object_get(j->body, "code");
    if (!json_is_string(code) || strlen(json_string_value(code)) != json_string_length(code)) {
        context_job_free(j);
        return lb_error_set(err, -EINVAL, "'code' is required: a string without NUL");
    }
    j->code = json_string_value(code);
    if (app->max_exec_timeout_s > 0 && def > (double)app->max_exec_timeout_s)
        def = (double)app->max_exec_timeout_s;
    r = routes_parse_seconds(j->body, "timeout_s", def, app->max_exec_timeout_s, &j->timeout_ms,
                             err);
    if (r == 0 && pty_sandbox_of(ptys_of(req), j->id, sandbox, sizeof(sandbox)) < 0)
        r = lb_error_set(err, -ENOENT, "no code context %s", j->id);
    if (r < 0) {
        context_job_free(j);
        return r;
    }
    fair_key(req, sandbox);
    return routes_defer_job(req, run_call, 200, j, context_job_free, err);
}

int route_context_interrupt(struct lb_request *req, struct lb_error *err)
{
    const char *cid = http_param(req, 0);
    int r = context_interrupt(ptys_of(req), cid, err);

    if (r == 0)
        http_respond_json(req, 200, json_pack("{s:s}", "context_id", cid));
    return r;
}

int route_context_delete(struct lb_request *req, struct lb_error *err)
{
    int r = context_delete(ptys_of(req), http_param(req, 0), err);

    if (r == 0)
        http_respond_empty(req, 204);
    return r;
}
