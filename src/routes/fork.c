/*
 * fork.c - POST /v1/sandboxes/{id}/fork {"sessions": [rsid...], "task_id"?, "labels"?} (admin):
 * one implicit snapshot of the sandbox (lend_fork_begin), then each session seeded from it with
 * the parent's spec, at most FORK_THREADS at once; one result per session, in request order.
 * The body is checked whole before anything is made (400); one child's failure (409 for a
 * session with a live sandbox, 429 at capacity) is its own result and fails no other.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lend/lend.h"
#include "routes/routes.h"
#include "util/fault.h"

#define FORK_THREADS 8
#define FORK_NAME_MAX 64

/* The child's seed body: the template with the request's task_id and labels over it, parsed
 * as a seed's (the same checks). */
static void fork_child_prepare(struct routes_seeds_job *j, struct routes_seed_item *c, json_t *tpl)
{
    static const char *const over[] = {"task_id", "labels", NULL};
    json_t *v;

    c->body = json_copy(tpl);
    if (!c->body) {
        c->r = lb_error_set(&c->err, -ENOMEM, "out of memory");
        return;
    }
    for (size_t k = 0; over[k]; k++)
        if ((v = json_object_get(j->body, over[k])) && !json_is_null(v))
            json_object_set(c->body, over[k], v);
    if (!json_object_get(c->body, "task_id"))
        json_object_set_new(c->body, "task_id", json_string("fork"));
    c->r = routes_parse_spec(c->body, &c->req, true, &c->err);
}

static void fork_run(struct lb_request *req, void *arg)
{
    struct routes_seeds_job *j = arg;
    struct lb_app *app = http_app(req);
    struct lb_error err = {0};
    char name[FORK_NAME_MAX];
    size_t i;
    json_t *tpl = NULL;
    int r;

    r = lend_fork_begin(app->lend, j->id, name, sizeof(name), &tpl, &err);
    if (r < 0) {
        http_respond_error(req, &err);
        return;
    }
    /* tests: a crash (delay + kill -9) with the implicit snapshot named and no child yet */
    r = fault_hit("fork.children", 0, &err);
    if (r < 0) {
        lend_fork_end(app->lend, name);
        json_decref(tpl);
        http_respond_error(req, &err);
        return;
    }
    for (i = 0; i < j->n; i++)
        fork_child_prepare(j, &j->items[i], tpl);
    routes_seeds_job_seed(req, j, FORK_THREADS);
    lend_fork_end(app->lend, name);
    json_decref(tpl);
    routes_seeds_job_respond(req, j, "children");
}

/* The body, checked whole: sessions (1..max, valid, distinct), task_id, labels. */
static int fork_parse(struct lb_app *app, json_t *body, struct routes_seeds_job *j,
                      struct lb_error *err)
{
    static const char *const fields[] = {"sessions", "task_id", "labels", NULL};
    json_t *sessions = json_object_get(body, "sessions"), *v, *probe;
    struct lb_seed_request probe_req = {0};
    size_t i, k;
    int r;

    if (!json_is_object(body))
        return lb_error_set(err, -EINVAL, "the fork request must be a JSON object");
    r = routes_check_fields(body, fields, "the fork request", err);
    if (r < 0)
        return r;
    if (!json_is_array(sessions) || json_array_size(sessions) == 0 ||
        (int64_t)json_array_size(sessions) > app->max_fork)
        return lb_error_set(err, -EINVAL,
                            "'sessions' must be an array of 1 to %lld resources session ids "
                            "(limits.max_fork)",
                            (long long)app->max_fork);
    json_array_foreach(sessions, i, v) {
        if (!json_is_string(v) || !routes_rsid_is_valid(json_string_value(v)))
            return lb_error_set(err, -EINVAL, "'sessions'[%zu] is not a valid resources session id",
                                i);
        for (k = 0; k < i; k++)
            if (strcmp(json_string_value(json_array_get(sessions, k)), json_string_value(v)) == 0)
                return lb_error_set(err, -EINVAL, "'sessions' names '%s' twice",
                                    json_string_value(v));
    }
    /* task_id and labels as a seed's: checked once here, so no child fails on them */
    probe = json_pack("{s:s}", "task_id", "fork");
    if (!probe)
        return lb_error_set(err, -ENOMEM, "out of memory");
    if ((v = json_object_get(body, "task_id")) && !json_is_null(v))
        json_object_set(probe, "task_id", v);
    if ((v = json_object_get(body, "labels")))
        json_object_set(probe, "labels", v);
    r = routes_parse_spec(probe, &probe_req, true, err);
    routes_spec_release(&probe_req);
    json_decref(probe);
    if (r < 0)
        return r;
    j->n = json_array_size(sessions);
    j->items = calloc(j->n, sizeof(*j->items));
    if (!j->items)
        return lb_error_set(err, -ENOMEM, "out of memory");
    for (i = 0; i < j->n; i++)
        j->items[i].rsid = json_string_value(json_array_get(sessions, i));
    return 0;
}

int route_fork(struct lb_request *req, struct lb_error *err)
{
    struct lb_app *app = http_app(req);
    const char *id = http_param(req, 0);
    struct routes_seeds_job *j;
    int r = routes_seeds_job_new(req, lend_fork_child, &j, err);

    if (r < 0)
        return r;
    r = fork_parse(app, j->body, j, err);
    if (r == 0)
        r = routes_check_sandbox_id(id, err);
    if (r < 0) {
        routes_seeds_job_free(j);
        return r;
    }
    snprintf(j->id, sizeof(j->id), "%s", id);
    return http_defer(req, fork_run, j, routes_seeds_job_free, err);
}
