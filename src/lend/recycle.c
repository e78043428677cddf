/*
 * recycle.c - recycling pools ([pool] recycle): the release of a sandbox taken from the warm
 * pool gives the pool a sandbox back at once, under a new id that carries the line's use
 * count. See lend_internal.h (lend_recycle_claim, lend_recycle_in_place, lend_recycle_finish).
 *
 * In place where the provider can (the local provider, a sandbox of image host on tmpfs
 * storage): the release's stop is replaced by a reset in place (every process killed, the
 * writable mounts, IPC objects new, the hostname set to the new id) and a hand-over of the
 * sandbox to a new id (its directory renamed; its cgroup keeps its first name). Order, so
 * that a daemon killed at any instant leaves nothing lent half-reset and nothing leaked:
 * old's fence up (no act of old's token lands in the next episode), old recorded "stopping"
 * (released), the reset, the new record inserted "starting" (intent before the hand-over),
 * the hand-over, then in one transaction the new record warm and old recorded stopped (never
 * lendable under the new id while old's record, whose descriptor names the same init, could
 * still be stopped). A restart finds old stopping and new starting and stops both (each stop
 * finds the sandbox under the id it has then, or nothing); the pool refills. An exec of the old
 * id that comes late finds the hostname changed (set before the reset's kill) and refuses.
 *
 * Elsewhere (another provider, an image sandbox, a failed reset) a recycle is a stop and a
 * make under a new id: the old record is stopped as any release stops it, and a new record
 * (new id, new token at its take) is inserted "starting" with the pool's class before the
 * provider makes it, then recorded warm. It costs what a refill costs, paid in the release call
 * instead of a refill thread; what it gives: the pool's place is held across the release (a
 * refill does not race it), and the line's lends are counted (pool.max_uses). Seed files are
 * not written either way: the next seed brings its own.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/fault.h"
#include "util/log.h"
#include "util/metrics.h"
#include "util/token.h"

/* Lends the record's sandbox line has had: spec "uses" (the warm take counts each). */
static int64_t recycle_uses_of(const struct lb_record *r)
{
    json_t *spec = r->spec_json ? json_loads(r->spec_json, 0, NULL) : NULL;
    int64_t uses = json_integer_value(json_object_get(spec, "uses"));

    json_decref(spec);
    return uses;
}

/* Ask the pool for a place (false: no pool registered, or none free). */
static bool recycle_slot_claim(struct lb_lend *l)
{
    bool ok = false;

    pthread_mutex_lock(&l->warm_mutex);
    if (l->pool_slots.claim)
        ok = l->pool_slots.claim(l->pool_slots.ctx);
    pthread_mutex_unlock(&l->warm_mutex);
    return ok;
}

/* Give the place back to the pool (its refills count it again) and wake them. */
static void recycle_slot_release(struct lb_lend *l)
{
    pthread_mutex_lock(&l->warm_mutex);
    if (l->pool_slots.release)
        l->pool_slots.release(l->pool_slots.ctx);
    pthread_mutex_unlock(&l->warm_mutex);
    lend_warm_changed(l);
}

/* Below max_sandboxes (old is stopped: its place is free unless a seed took it)? */
static bool recycle_has_capacity(struct lb_lend *l)
{
    int64_t live = 0;

    if (l->cfg.max_sandboxes <= 0)
        return true;
    return store_count_live(l->store, &live, NULL) == 0 && live < l->cfg.max_sandboxes;
}

/* see lend_internal.h */
bool lend_recycle_claim(struct lb_lend *l, const struct lb_record *old)
{
    struct lb_provider *prov = atomic_load(&l->warm_prov);
    char image[LB_IMAGE_NAME_MAX + 1], cls[LEND_WARM_CLASS_MAX];
    struct lb_provider_caps caps;
    int64_t uses;

    if (!l->cfg.pool_recycle || !prov || !old->pool_class || old->state != LB_STATE_LENT ||
        lend_is_draining(l))
        return false;
    provider_caps(prov, &caps);
    if (!caps.reset)
        return false; /* said once at start-up (warm_start) */
    lend_warm_class(l, prov, image, cls);
    if (strcmp(old->pool_class, cls) != 0)
        return false; /* another class (the default image changed): the pool refills */
    uses = recycle_uses_of(old);
    /* an in-place recycle keeps the sandbox, and its age: one past pool.max_age stops */
    if (l->cfg.pool_max_age_s > 0 && clock_now_s() >= old->created_at + l->cfg.pool_max_age_s) {
        log_info_sbx(old->id, "sandbox %s reached pool.max_age: not recycled", old->id);
        return false;
    }
    if (uses >= l->cfg.pool_max_uses) {
        log_info_sbx(old->id, "sandbox %s reached pool.max_uses (%lld lends): not recycled",
                     old->id, (long long)uses);
        return false;
    }
    return recycle_slot_claim(l);
}

/* s (prepared) as old's replacement: spec "uses" carried over, "recycled_from" old's id. */
static int recycle_spec(struct lend_start *s, const struct lb_record *old, struct lb_error *err)
{
    free(s->spec_text);
    s->spec_text = NULL;
    if (json_object_set_new(s->spec_json, "uses", json_integer(recycle_uses_of(old))) < 0 ||
        json_object_set_new(s->spec_json, "recycled_from", json_string(old->id)) < 0 ||
        !(s->spec_text = json_dumps(s->spec_json, JSON_COMPACT)))
        return lb_error_set(err, -ENOMEM, "out of memory");
    return 0;
}

/* Make old's replacement (a place is held): a warm sandbox of the pool's class under a new
 * id. 0; 1 when max_sandboxes left no room (nothing made, nothing failed); or a negative errno
 * with err set, after which a record it left was stopped (reset_failed). */
static int recycle_make(struct lb_lend *l, const struct lb_record *old, struct lb_error *err)
{
    struct lb_provider *prov = atomic_load(&l->warm_prov);
    char image[LB_IMAGE_NAME_MAX + 1], cls[LEND_WARM_CLASS_MAX];
    struct lend_start s;
    int r;

    if (!prov)
        return lb_error_set(err, -ESHUTDOWN, "the warm pool stopped");
    lend_warm_class(l, prov, image, cls);

    struct lb_seed_request req = {.ttl_s = -1, .provider = prov->ops->name, .image = image};

    r = lend_start_prepare(l, &req, &s, err);
    if (r < 0)
        goto out;
    s.fail_reason = "reset_failed";
    r = recycle_spec(&s, old, err);
    if (r < 0)
        goto out;
    r = lend_start_recorded(l, &s, NULL, cls, 0, err);
    if (r == -EUSERS && !s.recorded) {
        r = 1; /* a seed took the place old left under max_sandboxes: nothing failed */
        goto out;
    }
    if (r < 0)
        goto out; /* the record it made (if any) was stopped: reset_failed */
    /* the fault point "lend.recycle" fails a recycle whose sandbox was made, before it is warm */
    r = fault_hit("lend.recycle", 0, err);
    if (r == 0)
        r = store_mark_warm(
            l->store, s.rec.id, s.desc_text,
            l->cfg.pool_max_age_s > 0 ? s.rec.created_at + l->cfg.pool_max_age_s : 0, err);
    if (r < 0)
        lend_start_rollback(l, &s);
out:
    if (r == 0) {
        log_info_sbx(s.rec.id, "sandbox %s recycled as warm sandbox %s (%lld lends so far)",
                     old->id, s.rec.id, (long long)recycle_uses_of(old));
    }
    lend_start_release(&s);
    return r;
}

/* What became of old's sandbox in a recycle_hand_over that did not complete. */
enum recycle_left {
    RECYCLE_OLD,  /* still under old's id, as it was or reset: the release stops it */
    RECYCLE_GONE, /* stopped under the new id (or left to its stop's retries) */
};

/* The provider's half of an in-place recycle (old_ref: old's sandbox, with its parsed
 * descriptor): old's sandbox reset in place with a new id as
 * its hostname, the new id recorded (s->rec: starting, of the pool's class), the sandbox handed
 * over to it, and then in one transaction the new record warm and old's stopped (usage: its
 * stopped event's figures), so the sandbox is never lendable under the new id while old's
 * record, whose descriptor names the same init, could still be stopped. 0 when done. Else a
 * negative errno (perr set) and *left: RECYCLE_OLD (nothing recorded of old beyond
 * "stopping"; -EOPNOTSUPP when the provider cannot) or RECYCLE_GONE (the sandbox was stopped
 * under the new id, with reason reset_failed: the hand-over's record could not be written). */
static int recycle_hand_over(struct lb_lend *l, struct lb_provider *prov,
                             const struct lb_record *old, const struct lb_sandbox_ref *old_ref,
                             struct lend_start *s, const json_t *usage, enum recycle_left *left,
                             struct lb_error *perr)
{
    struct lb_record *rec = &s->rec;
    char *desc_text = NULL;
    json_t *desc = NULL;
    int64_t t0 = clock_mono_ms();
    int r;

    *left = RECYCLE_OLD;
    r = token_new_sandbox_id(rec->id);
    if (r < 0) {
        r = lb_error_set(perr, r, "cannot make a sandbox id");
        goto out;
    }
    r = provider_reset_in_place(prov, old_ref, &s->spec, rec->id, l->cfg.stop_timeout_s * 1000,
                                perr);
    if (r < 0)
        goto out;
    rec->provider = (char *)prov->ops->name;
    rec->state = LB_STATE_STARTING;
    rec->spec_json = s->spec_text;
    rec->pool_class = (char *)old->pool_class;
    /* the same sandbox: its age (pool.max_age) and its lease's created_at go on */
    rec->created_at = old->created_at;
    /* old is stopping (not live): its place under max_sandboxes is the one this takes */
    r = store_insert_sandbox(l->store, rec, l->cfg.max_sandboxes, perr);
    if (r < 0)
        goto out;
    s->recorded = true;
    /* the fault point "lend.hand_over" fails a recycle after its record, before the hand-over */
    r = fault_hit("lend.hand_over", 0, perr);
    if (r == 0)
        r = provider_hand_over(prov, old_ref, rec->id, &desc, perr);
    if (r == 0 && !(desc_text = json_dumps(desc, JSON_COMPACT)))
        r = lb_error_set(perr, -ENOMEM, "out of memory");
    if (r == 0) {
        /* the fault point "lend.handed_over": the sandbox under the new id, nothing recorded */
        r = fault_hit("lend.handed_over", 0, perr);
        if (r == 0)
            r = store_hand_over(
                l->store, old->id, usage, rec->id, desc_text,
                l->cfg.pool_max_age_s > 0 ? rec->created_at + l->cfg.pool_max_age_s : 0, perr);
        if (r < 0) {
            *left = RECYCLE_GONE;
            store_set_descriptor(l->store, rec->id, desc_text, NULL);
        }
    }
    if (r < 0) {
        struct lb_record got = {0};
        struct lb_error serr = {0};

        /* whatever the hand-over left under the new id goes (a stop finds it, or nothing) */
        if (store_get_sandbox(l->store, rec->id, &got, NULL) == 0 &&
            got.state != LB_STATE_STOPPED &&
            lend_stop_record(l, &got, "reset_failed", LB_STATE_STOP_FAILED, &serr) < 0)
            log_error_sbx(rec->id, "sandbox %s: a failed hand-over's stop failed: %s", rec->id,
                          serr.message);
        store_record_release(&got);
        goto out;
    }
    log_info_sbx(rec->id, "sandbox %s reset in place and handed over to warm sandbox %s in %lld ms",
                 old->id, rec->id, (long long)(clock_mono_ms() - t0));
out:
    free(desc_text);
    json_decref(desc);
    return r;
}

/* see lend_internal.h */
int lend_recycle_in_place(struct lb_lend *l, const struct lb_record *old, struct lb_error *err)
{
    struct lb_provider *prov = lend_provider_of(l, old, NULL);
    char image[LB_IMAGE_NAME_MAX + 1], cls[LEND_WARM_CLASS_MAX];
    enum recycle_left left = RECYCLE_OLD;
    json_t *old_desc = NULL, *usage = NULL;
    struct lb_error perr = {0};
    struct lend_start s;
    bool fenced = false;
    int r;

    if (!prov || prov != atomic_load(&l->warm_prov))
        return 0;
    lend_warm_class(l, prov, image, cls);

    struct lb_seed_request req = {.ttl_s = -1, .provider = prov->ops->name, .image = image};

    r = lend_start_prepare(l, &req, &s, &perr);
    if (r == 0)
        r = recycle_spec(&s, old, &perr);
    if (r < 0)
        goto out;
    /* no act of old's token may land in the sandbox the next episode gets: acts admitted
     * before start (and are killed by the reset) or are refused from here (409, then 404) */
    old_desc = old->descriptor_json ? json_loads(old->descriptor_json, 0, NULL) : NULL;
    struct lend_reset_stall stall = {prov, {old->id, old_desc}};

    r = lend_fence_raise_stalled(l, old->id, lend_reset_thaw, &stall, &perr);
    if (r < 0)
        goto out;
    fenced = true;
    r = store_mark_stopping(l->store, old->id, "released", &perr);
    if (r < 0)
        goto out;
    usage = lend_stop_usage(l, old);
    r = recycle_hand_over(l, prov, old, &stall.ref, &s, usage, &left, &perr);
    if (r < 0 && left == RECYCLE_GONE) {
        /* the sandbox was stopped under the new id: old's record only needs its end */
        metrics_add(LB_M_POOL_RESET_FAILURES, 1);
        log_warn_sbx(old->id,
                     "sandbox %s was reset but its hand-over could not be recorded (it "
                     "is stopped): %s",
                     old->id, perr.message);
        r = store_mark_stopped_usage(l->store, old->id, NULL, usage, err);
    }
    if (r < 0)
        goto out;
    /* old's record is stopped: its sandbox lives on under the new id, or is gone */
    lend_stop_done(l, old, "released");
    r = left == RECYCLE_OLD ? 1 : 2;
out:
    if (r < 0 && left == RECYCLE_OLD) {
        /* old's sandbox is still under old's id: the release stops it as any other */
        if (r != -EOPNOTSUPP && r != -EUSERS) {
            metrics_add(LB_M_POOL_RESET_FAILURES, 1);
            log_warn_sbx(old->id, "sandbox %s could not be recycled in place (it is stopped): %s",
                         old->id, perr.message);
        }
        r = 0;
    }
    if (fenced)
        lend_fence_lower(l, old->id);
    json_decref(usage);
    json_decref(old_desc);
    lend_start_release(&s);
    return r;
}

/* see lend_internal.h */
bool lend_recycle_finish(struct lb_lend *l, const struct lb_record *old, bool stopped,
                         bool in_place)
{
    struct lb_error err = {0};
    bool done = false;

    if (in_place) {
        metrics_add(LB_M_POOL_RECYCLED, 1);
        done = true;
    } else if (stopped && !lend_is_draining(l) && recycle_has_capacity(l)) {
        int r = recycle_make(l, old, &err);

        if (r < 0) {
            metrics_add(LB_M_POOL_RESET_FAILURES, 1);
            log_warn_sbx(old->id, "sandbox %s could not be recycled (the pool refills instead): %s",
                         old->id, err.message);
        } else if (r == 0) {
            metrics_add(LB_M_POOL_RECYCLED, 1);
            done = true;
        }
    }
    recycle_slot_release(l);
    return done;
}
