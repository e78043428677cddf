/*
 * activity.c - the activity of lent sandboxes (see lend_private.h), a base of the lending
 * service: it calls the provider, never lend.c, stop.c or idle.c (which acts on it: renewals
 * and the idle sweep).
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
 * activity request before the request reaches it, under idle_op_mutex (see idle.c).
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
        else {
            log_info_sbx(r->id, "sandbox %s resumed from its pause by a request", r->id);
            lend_note_event(l, "resumed", r->id, "request");
        }
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
void lend_note_event(struct lb_lend *l, const char *type, const char *id, const char *by)
{
    struct lb_error err = {0};
    json_t *data = by ? json_pack("{s:s}", "by", by) : NULL;

    if (store_record_event(l->store, type, id, data, &err) < 0)
        log_warn_sbx(id, "sandbox %s: cannot record its %s event: %s", id, type, err.message);
    json_decref(data);
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

/* ---------- for the idle sweep (idle.c) ---------- */

/* Is e idle at now_ms (and not already paused for it)? act_mutex held. */
static bool activity_is_idle(const struct lend_activity *e, int64_t now_ms)
{
    return e->idle_ms > 0 && e->busy == 0 && !e->idle_paused && e->last_ms + e->idle_ms <= now_ms;
}

/* see lend_private.h */
void lend_activity_load(struct lb_lend *l, const struct lb_record *recs, size_t n)
{
    pthread_mutex_lock(&l->act_mutex);
    for (size_t i = 0; i < n; i++) {
        struct lend_activity *e = activity_get(l, recs[i].id, true);

        if (e)
            activity_params_from(e, &recs[i]);
    }
    pthread_mutex_unlock(&l->act_mutex);
}

/* see lend_private.h */
int lend_activity_idle_ids(struct lb_lend *l, char ***ids_out, size_t *n_out)
{
    struct lend_activity *e, *tmp;
    char **ids = NULL;
    size_t n = 0, cap = 0;
    int64_t now_ms = clock_mono_ms();
    int r = 0;

    pthread_mutex_lock(&l->act_mutex);
    HASH_ITER(hh, l->acts, e, tmp) {
        if (!activity_is_idle(e, now_ms))
            continue;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            char **nids = realloc(ids, ncap * sizeof(*ids));

            if (!nids) {
                r = -ENOMEM;
                break;
            }
            ids = nids;
            cap = ncap;
        }
        if (!(ids[n] = strdup(e->id))) {
            r = -ENOMEM;
            break;
        }
        n++;
    }
    pthread_mutex_unlock(&l->act_mutex);
    *ids_out = ids;
    *n_out = n;
    return r;
}

/* see lend_private.h */
bool lend_activity_is_idle(struct lb_lend *l, const char *id, bool *pause)
{
    struct lend_activity *e;
    bool idle;

    pthread_mutex_lock(&l->act_mutex);
    e = activity_get(l, id, false);
    idle = e && activity_is_idle(e, clock_mono_ms());
    *pause = e && e->on_idle_pause;
    pthread_mutex_unlock(&l->act_mutex);
    return idle;
}

/* see lend_private.h */
bool lend_activity_mark_idle_paused(struct lb_lend *l, const char *id)
{
    struct lend_activity *e;
    bool idle;

    pthread_mutex_lock(&l->act_mutex);
    e = activity_get(l, id, false);
    idle = e && activity_is_idle(e, clock_mono_ms());
    if (idle)
        e->idle_paused = e->may_be_paused = true;
    pthread_mutex_unlock(&l->act_mutex);
    return idle;
}

/* see lend_private.h */
void lend_activity_pause_failed(struct lb_lend *l, const char *id)
{
    struct lend_activity *e;

    pthread_mutex_lock(&l->act_mutex);
    e = activity_get(l, id, false);
    if (e) { /* tried again after another idle_timeout_s */
        e->idle_paused = false;
        activity_touch_locked(e);
    }
    pthread_mutex_unlock(&l->act_mutex);
}
