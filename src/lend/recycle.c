/*
 * recycle.c - recycling pools ([pool] recycle): the release of a sandbox taken from the warm
 * pool gives the pool a sandbox back at once, under a new id that carries the line's use
 * count. See lend_internal.h (lend_recycle_claim, lend_recycle_finish).
 *
 * What a recycle is, and what it is not. The provider's sandbox is not kept across the id
 * change: the local provider (the only one that can reset today) names the sandbox's
 * directories, cgroup and network by its id, and its reset (reset.c) is itself a teardown and
 * a create under the same id (nothing of an episode can be missed by a list of things to
 * clean). So a recycle is "stop + make under a new id": the old record is stopped as any
 * release stops it (reason released; its id answers 404 on operate routes, GET shows it
 * stopped), and a new record (new id, new token at its take) is inserted "starting" with the
 * pool's class before the provider makes it, then recorded warm, so restarts and the sweeper
 * treat it as any warm sandbox. It costs what a refill costs, paid in the release call instead
 * of a refill thread: recycling saves no time until a provider can reset a sandbox in place
 * and hand it over to another id. What it does give: the pool's place is held across the
 * release (a refill does not race it), and the line's lends are counted (pool.max_uses).
 * Seed files are not written: the next seed brings its own.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fault.h"
#include "util/log.h"
#include "util/metrics.h"

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
    if (uses >= l->cfg.pool_max_uses) {
        log_info_sbx(old->id, "sandbox %s reached pool.max_uses (%lld lends): not recycled",
                     old->id, (long long)uses);
        return false;
    }
    return recycle_slot_claim(l);
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
    free(s.spec_text);
    s.spec_text = NULL;
    if (json_object_set_new(s.spec_json, "uses", json_integer(recycle_uses_of(old))) < 0 ||
        json_object_set_new(s.spec_json, "recycled_from", json_string(old->id)) < 0 ||
        !(s.spec_text = json_dumps(s.spec_json, JSON_COMPACT))) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
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

/* see lend_internal.h */
bool lend_recycle_finish(struct lb_lend *l, const struct lb_record *old, bool stopped)
{
    struct lb_error err = {0};
    bool done = false;

    if (stopped && !lend_is_draining(l) && recycle_has_capacity(l)) {
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
