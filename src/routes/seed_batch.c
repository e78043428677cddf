/*
 * seed_batch.c - POST /v1/sessions/seed_batch {"items": [{"rsid", ...seed body...}]} (admin):
 * up to SEED_BATCH_MAX seeds in one request, run SEED_BATCH_THREADS at a time on the request's
 * deferred job (util/parallel.h, as a fork's children), answered 200 {"results": [...]} with one
 * result per item in request order: {"rsid", "status": 200, "lease"} or {"rsid", "status",
 * "error"}, each what POST /v1/sessions/{rsid}/seed would answer that item alone.
 *
 * Only a body that is not an object, or "items" that is not an array of 1 to SEED_BATCH_MAX, is
 * 400 for the whole request. An item is checked by itself: not an object or no valid "rsid" →
 * its result is 400 with rsid null; the rest of it parsed as a seed's body (routes_parse_spec) →
 * 400 (or 422) for a bad field; an rsid an earlier item of the batch names → 409 conflict
 * (whatever the earlier item's own result: only a session's first item is ever seeded). The others
 * are seeded with lend_seed: a live session answers as a single seed would (its lease again for the
 * same task_id, else 409), capacity 429, and so on.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lend/lend.h"
#include "routes/routes.h"

#define SEED_BATCH_MAX 256
#define SEED_BATCH_THREADS 8

static void seed_batch_run(struct lb_request *req, void *arg)
{
    routes_seeds_job_seed(req, arg, SEED_BATCH_THREADS);
    routes_seeds_job_respond(req, arg, "results");
}

/* Item i of the request: its rsid, its seed body and whether an earlier item named the same
 * session. Sets it->r (and it->err) when the item is not to be seeded. */
static void seed_batch_item_prepare(struct routes_seeds_job *j, size_t i)
{
    struct routes_seed_item *it = &j->items[i];
    json_t *v = json_array_get(json_object_get(j->body, "items"), i), *rsid;
    const char *s;

    if (!json_is_object(v)) {
        it->r = lb_error_set(&it->err, -EINVAL,
                             "items[%zu] must be a JSON object (a seed body "
                             "with its \"rsid\")",
                             i);
        return;
    }
    rsid = json_object_get(v, "rsid");
    s = json_string_value(rsid);
    if (!s || strlen(s) != json_string_length(rsid) || !routes_rsid_is_valid(s)) {
        it->r = lb_error_set(&it->err, -EINVAL,
                             "items[%zu]: 'rsid' is required: a resources session id of 1-128 "
                             "characters of [A-Za-z0-9._:-]",
                             i);
        return;
    }
    it->rsid = s;
    it->body = json_copy(v); /* shallow: the values stay the request's */
    if (!it->body || json_object_del(it->body, "rsid") < 0) {
        it->r = lb_error_set(&it->err, -ENOMEM, "out of memory");
        return;
    }
    it->r = routes_parse_spec(it->body, &it->req, true, &it->err);
    if (it->r < 0)
        return;
    for (size_t k = 0; k < i; k++) {
        if (j->items[k].rsid && strcmp(j->items[k].rsid, s) == 0) {
            it->r = lb_error_set(&it->err, -EEXIST,
                                 "session %s is named by items[%zu] of this batch already", s, k);
            return;
        }
    }
}

/* The request's body as a whole: an object of "items", an array of 1 to SEED_BATCH_MAX. */
static int seed_batch_parse(struct routes_seeds_job *j, struct lb_error *err)
{
    static const char *const fields[] = {"items", NULL};
    json_t *items = json_object_get(j->body, "items");
    int r;

    if (!json_is_object(j->body))
        return lb_error_set(err, -EINVAL, "the seed_batch request must be a JSON object");
    r = routes_check_fields(j->body, fields, "the seed_batch request", err);
    if (r < 0)
        return r;
    if (!json_is_array(items) || json_array_size(items) == 0 ||
        json_array_size(items) > SEED_BATCH_MAX)
        return lb_error_set(err, -EINVAL, "'items' must be an array of 1 to %d seed bodies",
                            SEED_BATCH_MAX);
    j->n = json_array_size(items);
    j->items = calloc(j->n, sizeof(*j->items));
    if (!j->items)
        return lb_error_set(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < j->n; i++)
        seed_batch_item_prepare(j, i);
    return 0;
}

int route_seed_batch(struct lb_request *req, struct lb_error *err)
{
    struct routes_seeds_job *j;
    int r = routes_seeds_job_new(req, lend_seed, &j, err);

    if (r < 0)
        return r;
    r = seed_batch_parse(j, err);
    if (r < 0) {
        routes_seeds_job_free(j);
        return r;
    }
    return http_defer(req, seed_batch_run, j, routes_seeds_job_free, err);
}
