/*
 * activity.c - renewals, activity and idle stops or pauses of lent sandboxes (see lend.h and
 * lend_internal.h).
 *
 * Activity is kept in memory only: one entry per sandbox with the time of its last activity,
 * the number of its processes a request still waits on (execs, activation harnesses, PTYs: all
 * run through lend_exec) and its seed's idle_timeout_s / on_idle. A request updates its entry
 * under one mutex (a hash lookup and two stores). Nothing of it is written to the store: after a
 * restart every idle clock starts again from the time the daemon started (the first sweeper pass
 * loads the idle settings of the lent sandboxes from their records' specs).
 *
 * A sandbox whose seed set on_idle "pause" and that was paused (by the idle sweep, by POST
 * .../pause, or before a restart: its entry starts "may be paused") is resumed by its next
 * activity request before the request reaches it. The idle pause and that resume run under one
 * mutex (idle_op_mutex), and the idle sweep decides and marks a pause in the same critical
 * section of act_mutex as a request's touch, so a request either keeps the sandbox from being
 * paused or sees the mark and resumes it.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/log.h"

/* ---------- entries (act_mutex held) ---------- */

/* Set e's idle settings from a record's spec (spec: parsed, may be NULL). */
static void activity_set_params(struct lend_activity *e, json_t *spec)
{
    json_t *idle = json_object_get(spec, "idle_timeout_s");
    const char *on_idle = json_string_value(json_object_get(spec, "on_idle"));

    e->idle_ms = json_is_number(idle) && json_number_value(idle) > 0
                     ? (int64_t)ceil(json_number_value(idle) * 1000.0)
                     : 0;
    e->on_idle_pause = on_idle && strcmp(on_idle, "pause") == 0;
    e->params_known = true;
}

/* The entry of sandbox id, made (last activity now, may be paused: a new entry knows nothing of
 * the sandbox's past) when make is true. NULL without memory or when not made. */
static struct lend_activity *activity_get(struct lb_lend *l, const char *id, bool make)
{
    struct lend_activity *e;

    HASH_FIND_STR(l->acts, id, e);
    if (e || !make)
        return e;
    e = calloc(1, sizeof(*e));
    if (!e || !(e->id = strdup(id))) {
        free(e);
        return NULL;
    }
    e->last_s = clock_now_s();
    e->last_ms = clock_mono_ms();
    e->may_be_paused = true;
    HASH_ADD_KEYPTR(hh, l->acts, e->id, strlen(e->id), e);
    return e;
}

static void activity_touch_locked(struct lend_activity *e)
{
    e->last_s = clock_now_s();
    e->last_ms = clock_mono_ms();
}

/* Fill e's idle settings from record r unless they are known. */
static void activity_params_from(struct lend_activity *e, const struct lb_record *r)
{
    json_t *spec;

    if (e->params_known)
        return;
    spec = r->spec_json ? json_loads(r->spec_json, 0, NULL) : NULL;
    activity_set_params(e, spec);
    json_decref(spec);
}

/* ---------- what requests call ---------- */

void lend_activity_touch(struct lb_lend *l, const char *id)
{
    struct lend_activity *e;

    if (!id)
        return;
    pthread_mutex_lock(&l->act_mutex);
    e = activity_get(l, id, true);
    if (e)
        activity_touch_locked(e);
    pthread_mutex_unlock(&l->act_mutex);
}

/* see lend_private.h */
void lend_activity_seeded(struct lb_lend *l, const struct lb_record *r, json_t *spec)
{
    struct lend_activity *e;

    pthread_mutex_lock(&l->act_mutex);
    e = activity_get(l, r->id, true);
    if (e) {
        activity_touch_locked(e);
        activity_set_params(e, spec);
        e->may_be_paused = false; /* just started */
        e->idle_paused = false;
    }
    pthread_mutex_unlock(&l->act_mutex);
}

/* see lend_private.h */
int lend_activity_enter(struct lb_lend *l, const struct lb_record *r, struct lb_provider *prov,
                        const struct lb_sandbox_ref *ref, bool busy, struct lb_error *err)
{
    struct lend_activity *e;
    bool check = false;
    int rc = 0;

    pthread_mutex_lock(&l->act_mutex);
    e = activity_get(l, r->id, true);
    if (e) {
        activity_params_from(e, r);
        activity_touch_locked(e);
        if (busy)
            e->busy++;
        check = e->on_idle_pause && e->may_be_paused;
    }
    pthread_mutex_unlock(&l->act_mutex);
    if (!check)
        return 0;

    /* on_idle "pause": resume it first if it is paused (an idle pause under way finishes
     * first: it holds idle_op_mutex) */
    pthread_mutex_lock(&l->idle_op_mutex);
    enum lb_sandbox_status st;
    struct lb_error perr = {0};

    if (provider_status(prov, ref, &st, &perr) == 0 && st == LB_STATUS_PAUSED) {
        rc = provider_resume(prov, ref, &perr);
        if (rc < 0)
            rc = lb_error_set(err, -EREMOTEIO, "sandbox %s is paused and could not be resumed: %s",
                              r->id, perr.message);
        else
            log_info_sbx(r->id, "sandbox %s resumed from its pause by a request", r->id);
    }
    if (rc == 0) {
        pthread_mutex_lock(&l->act_mutex);
        e = activity_get(l, r->id, false);
        if (e) {
            e->may_be_paused = false;
            e->idle_paused = false;
        }
        pthread_mutex_unlock(&l->act_mutex);
    }
    pthread_mutex_unlock(&l->idle_op_mutex);
    if (rc < 0 && busy)
        lend_activity_leave(l, r->id);
    return rc;
}

/* see lend_private.h */
void lend_activity_leave(struct lb_lend *l, const char *id)
{
    struct lend_activity *e;

    pthread_mutex_lock(&l->act_mutex);
    e = activity_get(l, id, false);
    if (e) {
        if (e->busy > 0)
            e->busy--;
        activity_touch_locked(e);
        if (e->gone && e->busy == 0) {
            HASH_DEL(l->acts, e);
            free(e->id);
            free(e);
        }
    }
    pthread_mutex_unlock(&l->act_mutex);
}

/* see lend_private.h */
void lend_activity_paused(struct lb_lend *l, const char *id, bool paused)
{
    struct lend_activity *e;

    pthread_mutex_lock(&l->act_mutex);
    e = activity_get(l, id, true);
    if (e) {
        e->may_be_paused = paused;
        e->idle_paused = false;
        if (!paused)
            activity_touch_locked(e); /* a resume is a request to use it */
    }
    pthread_mutex_unlock(&l->act_mutex);
}

/* see lend_private.h */
void lend_activity_forget(struct lb_lend *l, const char *id)
{
    struct lend_activity *e;

    pthread_mutex_lock(&l->act_mutex);
    e = activity_get(l, id, false);
    if (e && e->busy == 0) {
        HASH_DEL(l->acts, e);
        free(e->id);
        free(e);
    } else if (e) {
        e->gone = true; /* the last lend_activity_leave frees it */
    }
    pthread_mutex_unlock(&l->act_mutex);
}

/* see lend_private.h */
int64_t lend_last_activity(struct lb_lend *l, const struct lb_record *r)
{
    struct lend_activity *e;
    int64_t t = 0;

    pthread_mutex_lock(&l->act_mutex);
    e = activity_get(l, r->id, false);
    if (e)
        t = e->busy > 0 ? clock_now_s() : e->last_s;
    pthread_mutex_unlock(&l->act_mutex);
    if (t == 0) /* nothing since this daemon started */
        t = r->created_at > l->started_s ? r->created_at : l->started_s;
    return t;
}

void lend_activity_free_all(struct lb_lend *l)
{
    struct lend_activity *e, *tmp;

    HASH_ITER(hh, l->acts, e, tmp) {
        HASH_DEL(l->acts, e);
        free(e->id);
        free(e);
    }
}

/* ---------- renewal ---------- */

int lend_renew(struct lb_lend *l, const char *id, int64_t ttl_s, json_t **out, struct lb_error *err)
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
    r = lend_record_get(l, id, &rec, err);
    if (r < 0)
        return r;
    /* under the session's lock: the sweeper's TTL stop re-reads the record under it, so a
     * renewal either comes before its check or finds the sandbox stopped */
    if (rec.rsid) {
        r = lend_session_lock(l, rec.rsid, false, &lock, err);
        if (r < 0)
            goto out;
    }
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
    pthread_mutex_lock(&l->act_mutex);
    for (size_t i = 0; i < n; i++) {
        struct lend_activity *e = activity_get(l, recs[i].id, true);

        if (e)
            activity_params_from(e, &recs[i]);
    }
    pthread_mutex_unlock(&l->act_mutex);
    store_records_free(recs, n);
    l->idle_loaded = true;
}

/* Is e idle at now_ms (and not already paused for it)? act_mutex held. */
static bool activity_is_idle(const struct lend_activity *e, int64_t now_ms)
{
    return e->idle_ms > 0 && e->busy == 0 && !e->idle_paused && e->last_ms + e->idle_ms <= now_ms;
}

/* Pause idle sandbox r (on_idle "pause"): marked paused in the same critical section that sees
 * it still idle, then paused, all under idle_op_mutex. */
static void idle_pause(struct lb_lend *l, const struct lb_record *r, struct lb_provider *prov)
{
    json_t *desc = r->descriptor_json ? json_loads(r->descriptor_json, 0, NULL) : NULL;
    struct lb_sandbox_ref ref = {r->id, desc};
    struct lend_activity *e;
    struct lb_error perr = {0};
    bool idle;

    pthread_mutex_lock(&l->idle_op_mutex);
    pthread_mutex_lock(&l->act_mutex);
    e = activity_get(l, r->id, false);
    idle = e && activity_is_idle(e, clock_mono_ms());
    if (idle)
        e->idle_paused = e->may_be_paused = true;
    pthread_mutex_unlock(&l->act_mutex);
    if (idle) {
        if (provider_pause(prov, &ref, &perr) == 0) {
            log_info_sbx(r->id, "sandbox %s paused: idle", r->id);
        } else {
            log_warn_sbx(r->id, "sandbox %s is idle but could not be paused: %s", r->id,
                         perr.message);
            pthread_mutex_lock(&l->act_mutex);
            e = activity_get(l, r->id, false);
            if (e) { /* tried again after another idle_timeout_s */
                e->idle_paused = false;
                activity_touch_locked(e);
            }
            pthread_mutex_unlock(&l->act_mutex);
        }
    }
    pthread_mutex_unlock(&l->idle_op_mutex);
    json_decref(desc);
}

int lend_idle_sweep(struct lb_lend *l)
{
    struct lend_activity *e, *tmp;
    char **ids = NULL;
    size_t n = 0, cap = 0;
    int64_t now_ms = clock_mono_ms();
    int acted = 0;

    if (!l->idle_loaded)
        idle_load(l);
    pthread_mutex_lock(&l->act_mutex);
    HASH_ITER(hh, l->acts, e, tmp) {
        if (!activity_is_idle(e, now_ms))
            continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            char **nids = realloc(ids, ncap * sizeof(*ids));

            if (!nids)
                break;
            ids = nids;
            cap = ncap;
        }
        if (!(ids[n] = strdup(e->id)))
            break;
        n++;
    }
    pthread_mutex_unlock(&l->act_mutex);

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
        pthread_mutex_lock(&l->act_mutex);
        e = activity_get(l, ids[i], false);
        idle = e && activity_is_idle(e, clock_mono_ms());
        pause = e && e->on_idle_pause;
        pthread_mutex_unlock(&l->act_mutex);
        if (!idle || !(prov = lend_provider_of(l, &cur, NULL)))
            goto next;
        acted++;
        if (pause) {
            idle_pause(l, &cur, prov);
        } else {
            /* A request that arrives from here on finds the sandbox stopping (404): it was
             * idle for idle_timeout_s. */
            log_info_sbx(cur.id, "sandbox %s was idle for its idle_timeout_s", cur.id);
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
