/*
 * idle.c - renewals and the idle sweep (see lend.h and lend_internal.h): what acts on the
 * activity activity.c keeps (a top over activity.c, lend.c and stop.c; nothing in src/lend/
 * calls it).
 *
 * An idle on_idle "pause" sandbox is marked paused (lend_activity_mark_idle_paused) in the same
 * critical section that sees it still idle, then paused, both under idle_op_mutex, which a
 * request's resume (lend_activity_enter) takes too: a request either keeps the sandbox from
 * being paused or sees the mark and resumes it.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/log.h"

/* ---------- renewal ---------- */

int lend_renew(struct lb_lend *l, const char *id, int64_t ttl_s,
               int (*recheck)(void *ctx, struct lb_error *err), void *ctx, json_t **out,
               struct lb_error *err)
{
    struct lend_session_lock *lock = NULL;
    struct lb_record rec = {0};
    int64_t expires;
    char when[32];
    int r;

    *out = NULL;
    if (ttl_s <= 0)
        return lb_error_set(err, -EINVAL, "'ttl_s' must be a number of seconds > 0");
    if (l->cfg.max_ttl_s > 0 && ttl_s > l->cfg.max_ttl_s)
        ttl_s = l->cfg.max_ttl_s;
    /* under the session's lock: the sweeper's TTL stop re-reads the record under it, so a
     * renewal either comes before its check or finds the sandbox stopped */
    r = lend_record_get_locked(l, id, &rec, &lock, err);
    if (r == 0 && recheck)
        r = recheck(ctx, err);
    if (r < 0)
        goto out;
    expires = clock_now_s() + ttl_s;
    r = store_set_expires(l->store, id, expires, err);
    if (r == -ENOENT) {
        r = lb_error_set(err, -ENOENT,
                         "sandbox %s is not live (stopped, stopping, expired or not lent): "
                         "it cannot be renewed",
                         id);
        goto out;
    }
    if (r < 0)
        goto out;
    clock_format_rfc3339(expires, when, sizeof(when));
    *out = json_pack("{s:s,s:s}", "sandbox_id", id, "expires_at", when);
    if (!*out)
        r = lb_error_set(err, -ENOMEM, "out of memory");
    else
        log_info_sbx(id, "sandbox %s renewed for %lld s", id, (long long)ttl_s);
out:
    lend_session_unlock(l, lock);
    store_record_release(&rec);
    return r;
}

/* ---------- the idle sweep ---------- */

/* Load the idle settings of every lent sandbox from its record (once, at the first sweep after
 * start): a sandbox idle since before a restart is idle from the restart on. */
static void idle_load(struct lb_lend *l)
{
    struct lb_record_filter f = {.state = LB_STATE_LENT};
    struct lb_record *recs = NULL;
    size_t n = 0;

    if (store_list_sandboxes(l->store, &f, &recs, &n, NULL) < 0)
        return; /* the next pass tries again */
    lend_activity_load(l, recs, n);
    store_records_free(recs, n);
    l->idle_loaded = true;
}

/* Pause idle sandbox r (on_idle "pause"): marked paused in the same critical section that sees
 * it still idle, then paused, all under idle_op_mutex. */
static void idle_pause(struct lb_lend *l, const struct lb_record *r, struct lb_provider *prov)
{
    json_t *desc = r->descriptor_json ? json_loads(r->descriptor_json, 0, NULL) : NULL;
    struct lb_sandbox_ref ref = {r->id, desc};
    struct lb_error perr = {0};

    pthread_mutex_lock(&l->idle_op_mutex);
    if (lend_activity_mark_idle_paused(l, r->id)) {
        if (provider_pause(prov, &ref, &perr) == 0) {
            log_info_sbx(r->id, "sandbox %s paused: idle", r->id);
            lend_note_event(l, "idle", r->id, NULL);
            lend_note_event(l, "paused", r->id, "idle");
        } else {
            log_warn_sbx(r->id, "sandbox %s is idle but could not be paused: %s", r->id,
                         perr.message);
            lend_activity_pause_failed(l, r->id);
        }
    }
    pthread_mutex_unlock(&l->idle_op_mutex);
    json_decref(desc);
}

int lend_idle_sweep(struct lb_lend *l)
{
    char **ids = NULL;
    size_t n = 0;
    int acted = 0;

    if (!l->idle_loaded)
        idle_load(l);
    /* out of memory: the ids collected so far are handled, the rest by the next pass */
    (void)lend_activity_idle_ids(l, &ids, &n);

    for (size_t i = 0; i < n; i++) {
        struct lend_session_lock *lock = NULL;
        struct lb_record cur = {0}, first = {0};
        struct lb_provider *prov;
        bool busy, idle, pause;

        if (store_get_sandbox(l->store, ids[i], &first, NULL) < 0 || first.state != LB_STATE_LENT) {
            lend_activity_forget(l, ids[i]); /* stopped meanwhile */
            goto next;
        }
        /* as the TTL pass: a busy session is left to the next pass */
        busy = first.rsid && lend_session_lock(l, first.rsid, true, &lock, NULL) < 0;
        if (busy || store_get_sandbox(l->store, ids[i], &cur, NULL) < 0 ||
            cur.state != LB_STATE_LENT)
            goto next;
        idle = lend_activity_is_idle(l, ids[i], &pause);
        if (!idle || !(prov = lend_provider_of(l, &cur, NULL)))
            goto next;
        acted++;
        if (pause) {
            idle_pause(l, &cur, prov);
        } else {
            /* A request that arrives from here on finds the sandbox stopping (404): it was
             * idle for idle_timeout_s. */
            log_info_sbx(cur.id, "sandbox %s was idle for its idle_timeout_s", cur.id);
            lend_note_event(l, "idle", cur.id, NULL);
            lend_before_stop(l, &cur);
            lend_stop_record(l, &cur, "idle", LB_STATE_STOP_FAILED, NULL);
        }
    next:
        store_record_release(&cur);
        store_record_release(&first);
        lend_session_unlock(l, lock);
        free(ids[i]);
    }
    free(ids);
    return acted;
}
