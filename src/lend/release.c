/*
 * release.c - release (a session's live sandbox and its pending stops, or a pooled sandbox
 * handed to recycle.c), delete and release_all: the tops that stop through stop.c.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"

/* ---------- release / delete ---------- */

int lend_release(struct lb_lend *l, const char *rsid, json_t **out, struct lb_error *err)
{
    struct lend_session_lock *lock = NULL;
    struct lb_record live = {0};
    char stopped_id[LB_ID_MAX] = "";
    bool recycle = false, stopped = false, in_place = false;
    int r = lend_session_lock(l, rsid, false, &lock, err), n_stopped = 0;

    if (r < 0)
        return r;
    if (store_get_live_by_rsid(l->store, rsid, &live, NULL) == 0) {
        /* a pooled sandbox's place is held for its replacement before it stops, so that the
         * pool's refills do not take it meanwhile (recycle.c) */
        recycle = lend_recycle_claim(l, &live);
        lend_before_stop(l, &live);
        /* a recycled sandbox is reset in place and handed to a new id where it can be */
        r = recycle ? lend_recycle_in_place(l, &live, err) : 0;
        in_place = r == 1;
        if (r == 0)
            r = lend_stop_record(l, &live, "released", LB_STATE_STOP_FAILED, err);
        else if (r > 0)
            r = 0; /* stopped by the recycle (recycled, or gone with its failed hand-over) */
        if (r < 0) {
            metrics_add(LB_M_RELEASES_FAILED, 1);
            goto out;
        }
        stopped = true;
        n_stopped++;
        snprintf(stopped_id, sizeof(stopped_id), "%s", live.id);
    }
    r = lend_retry_pending(l, rsid, &n_stopped, stopped_id[0] ? NULL : stopped_id,
                           sizeof(stopped_id), err);
    if (r < 0) {
        metrics_add(LB_M_RELEASES_FAILED, 1);
        goto out;
    }
    metrics_add(LB_M_RELEASES_OK, 1);
    if (n_stopped > 0)
        *out = json_pack("{s:b,s:s}", "released", 1, "sandbox_id", stopped_id);
    else
        *out = json_pack("{s:b}", "released", 0);
out:
    lend_session_unlock(l, lock);
    /* a pooled sandbox's replacement is made now, under a new id (recycle.c) */
    if (recycle)
        lend_recycle_finish(l, &live, stopped, in_place);
    store_record_release(&live);
    return r;
}

int lend_delete_sandbox(struct lb_lend *l, const char *id, json_t **out, struct lb_error *err)
{
    struct lb_record rec = {0};
    struct lend_session_lock *lock = NULL;
    int r = lend_record_get_locked(l, id, &rec, &lock, err);

    if (r < 0)
        goto out;
    if (rec.state == LB_STATE_STOPPED) {
        *out = json_pack("{s:b,s:s}", "deleted", 0, "sandbox_id", id);
        goto out;
    }
    /* a warm one is claimed first: a seed may be taking it right now (src/warm/) */
    if (rec.state == LB_STATE_WARM && store_claim_warm(l->store, id, "deleted", NULL) < 0) {
        r = lb_error_set(err, -EBUSY, "sandbox %s was just lent from the warm pool; retry", id);
        goto out;
    }
    lend_before_stop(l, &rec);
    r = lend_stop_record(
        l, &rec, "deleted",
        rec.state == LB_STATE_FAILED_SEED ? LB_STATE_FAILED_SEED : LB_STATE_STOP_FAILED, err);
    if (r == 0)
        *out = json_pack("{s:b,s:s}", "deleted", 1, "sandbox_id", id);
out:
    store_record_release(&rec);
    lend_session_unlock(l, lock);
    return r;
}

/* ---------- release_all ---------- */

/* Does the record's labels object hold every name of want with the same value? */
static bool lend_labels_match(const struct lb_record *r, json_t *want)
{
    json_t *spec, *have;
    const char *k;
    json_t *v;
    bool ok = true;

    if (!json_is_object(want) || json_object_size(want) == 0)
        return true;
    spec = r->spec_json ? json_loads(r->spec_json, 0, NULL) : NULL;
    have = json_object_get(spec, "labels");
    json_object_foreach(want, k, v) {
        const char *got = json_string_value(json_object_get(have, k));

        if (!got || !json_is_string(v) || strcmp(got, json_string_value(v)) != 0) {
            ok = false;
            break;
        }
    }
    json_decref(spec);
    return ok;
}

struct release_all_item {
    char *rsid;
    char sandbox_id[LB_ID_MAX];
    int rc;
    bool released;
    struct lb_error err;
};

struct release_all_ctx {
    struct lb_lend *l;
    struct release_all_item *items;
    size_t n, next;
    pthread_mutex_t mutex;
};

static void *release_all_worker(void *arg)
{
    struct release_all_ctx *c = arg;

    for (;;) {
        struct release_all_item *it;
        json_t *out = NULL;

        pthread_mutex_lock(&c->mutex);
        it = c->next < c->n ? &c->items[c->next++] : NULL;
        pthread_mutex_unlock(&c->mutex);
        if (!it)
            break;
        /* each item is this thread's alone from here */
        it->rc = lend_release(c->l, it->rsid, &out, &it->err);
        it->released = it->rc == 0 && json_is_true(json_object_get(out, "released"));
        json_decref(out);
    }
    return NULL;
}

int lend_release_all(struct lb_lend *l, json_t *labels, size_t concurrency, json_t **out,
                     struct lb_error *err)
{
    struct release_all_ctx c = {.l = l};
    struct lb_record_filter f = {.state = -1};
    struct lb_record *recs = NULL;
    size_t n = 0, n_threads, started = 0, i, k;
    pthread_t *threads = NULL;
    json_t *released = NULL, *failed = NULL;
    int r;

    *out = NULL;
    if (lend_is_draining(l))
        return lb_error_set(err, -ESHUTDOWN, "the daemon is draining");
    r = store_list_sandboxes(l->store, &f, &recs, &n, err);
    if (r < 0)
        return r;
    c.items = calloc(n + 1, sizeof(*c.items));
    if (!c.items) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    /* one item per session with something to stop, oldest record first; its sandbox is the
     * live one if there is one, else the first pending one */
    for (i = 0; i < n; i++) {
        const struct lb_record *rec = &recs[i];
        bool live = rec->state == LB_STATE_STARTING || rec->state == LB_STATE_LENT;

        if (!rec->rsid || rec->state == LB_STATE_STOPPED || !lend_labels_match(rec, labels))
            continue;
        for (k = 0; k < c.n && strcmp(c.items[k].rsid, rec->rsid) != 0; k++)
            ;
        if (k == c.n) {
            c.items[k].rsid = strdup(rec->rsid);
            if (!c.items[k].rsid) {
                r = lb_error_set(err, -ENOMEM, "out of memory");
                goto out;
            }
            c.n++;
        } else if (!live) {
            continue;
        }
        snprintf(c.items[k].sandbox_id, sizeof(c.items[k].sandbox_id), "%s", rec->id);
    }
    store_records_free(recs, n);
    recs = NULL;
    n = 0;

    if (concurrency == 0)
        concurrency = 1;
    n_threads = c.n < concurrency ? c.n : concurrency;
    pthread_mutex_init(&c.mutex, NULL);
    threads = n_threads ? calloc(n_threads, sizeof(*threads)) : NULL;
    for (; threads && started < n_threads; started++)
        if (pthread_create(&threads[started], NULL, release_all_worker, &c) != 0)
            break;
    if (started == 0)
        release_all_worker(&c); /* no thread could start: one at a time here */
    for (i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    pthread_mutex_destroy(&c.mutex);

    released = json_array();
    failed = json_array();
    if (!released || !failed) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    for (i = 0; i < c.n; i++) {
        struct release_all_item *it = &c.items[i];
        const char *code = NULL;

        if (it->rc == 0) {
            if (it->released)
                json_array_append_new(released, json_string(it->rsid));
            continue;
        }
        (void)lb_error_http_status(it->rc, &code);
        json_array_append_new(failed,
                              json_pack("{s:s,s:s?,s:{s:s,s:s}}", "resources_session_id", it->rsid,
                                        "sandbox_id", it->sandbox_id[0] ? it->sandbox_id : NULL,
                                        "error", "code", code ? code : "internal", "message",
                                        it->err.message[0] ? it->err.message : "release failed"));
    }
    log_info("release_all: %zu sessions, %zu released, %zu failed", c.n, json_array_size(released),
             json_array_size(failed));
    *out = json_pack("{s:o,s:o}", "released", released, "failed", failed);
    released = failed = NULL;
    if (!*out)
        r = lb_error_set(err, -ENOMEM, "out of memory");
out:
    json_decref(released);
    json_decref(failed);
    for (i = 0; c.items && i < c.n; i++)
        free(c.items[i].rsid);
    free(c.items);
    free(threads);
    store_records_free(recs, n);
    return r;
}
