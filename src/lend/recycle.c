/*
 * recycle.c - recycling pools ([pool] recycle): a released sandbox taken from the warm pool is
 * replaced at once by a warm sandbox of the same class under a new id that carries its use
 * count. See lend_internal.h (lend_recycle).
 *
 * What a recycle is here: the same as a reset (reset.c), which on every provider that can reset
 * tears the sandbox down whole and makes it again from its image (nothing of an episode can be
 * missed by a list of things to clean), with the remade sandbox recorded under a new record id
 * instead of the old one. The old record is stopped as any release stops it (reason released,
 * its id answers 404 on operate routes); the new one is inserted "starting" with the pool's
 * class before the provider makes it, then recorded warm, so restarts and the sweeper treat it
 * as any warm sandbox. Seed files are not written: the next seed brings its own.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Is there room for one more warm sandbox of class cls: fewer than pool_size warm or being
 * made (a refill under way counts), and below max_sandboxes? */
static bool recycle_pool_has_room(struct lb_lend *l, const char *cls)
{
    int64_t pooled = 0, live = 0;

    if (store_count_pooled(l->store, cls, &pooled, NULL) < 0 ||
        store_count_live(l->store, &live, NULL) < 0)
        return false;
    if (pooled >= l->cfg.pool_size)
        return false;
    return l->cfg.max_sandboxes <= 0 || live < l->cfg.max_sandboxes;
}

/* see lend_internal.h */
bool lend_recycle(struct lb_lend *l, const struct lb_record *old)
{
    struct lb_provider *prov = atomic_load(&l->warm_prov);
    char image[LB_IMAGE_NAME_MAX + 1], cls[LEND_WARM_CLASS_MAX];
    struct lb_error err = {0};
    struct lend_start s;
    int64_t uses;
    bool done = false;
    int r;

    if (!l->cfg.pool_recycle || !prov || !old->pool_class || lend_is_draining(l))
        return false;
    lend_warm_class(l, prov, image, cls);
    if (strcmp(old->pool_class, cls) != 0)
        return false; /* another class (the default image changed): the pool refills */
    uses = recycle_uses_of(old);
    if (uses >= l->cfg.pool_max_uses) {
        log_info_sbx(old->id, "sandbox %s reached pool.max_uses (%lld lends): not recycled",
                     old->id, (long long)uses);
        return false;
    }
    if (!recycle_pool_has_room(l, cls))
        return false;

    struct lb_seed_request req = {.ttl_s = -1, .provider = prov->ops->name, .image = image};

    r = lend_start_prepare(l, &req, &s, &err);
    if (r == 0) {
        free(s.spec_text);
        s.spec_text = NULL;
        if (json_object_set_new(s.spec_json, "uses", json_integer(uses)) < 0 ||
            json_object_set_new(s.spec_json, "recycled_from", json_string(old->id)) < 0 ||
            !(s.spec_text = json_dumps(s.spec_json, JSON_COMPACT)))
            r = lb_error_set(&err, -ENOMEM, "out of memory");
    }
    if (r == 0)
        r = lend_start_recorded(l, &s, NULL, cls, 0, &err);
    if (r == 0) {
        r = store_mark_warm(
            l->store, s.rec.id, s.desc_text,
            l->cfg.pool_max_age_s > 0 ? s.rec.created_at + l->cfg.pool_max_age_s : 0, &err);
        if (r < 0) {
            struct lb_record got = {0};

            store_set_descriptor(l->store, s.rec.id, s.desc_text, NULL);
            if (store_get_sandbox(l->store, s.rec.id, &got, NULL) == 0)
                lend_stop_record(l, &got, "reset_failed", LB_STATE_STOP_FAILED, NULL);
            store_record_release(&got);
        }
    }
    if (r < 0) {
        metrics_add(LB_M_POOL_RESET_FAILURES, 1);
        log_warn_sbx(old->id, "sandbox %s could not be recycled (the pool refills instead): %s",
                     old->id, err.message);
    } else {
        metrics_add(LB_M_POOL_RECYCLED, 1);
        log_info_sbx(s.rec.id, "sandbox %s recycled as warm sandbox %s (%lld lends so far)",
                     old->id, s.rec.id, (long long)uses);
        done = true;
    }
    lend_start_release(&s);
    lend_warm_changed(l);
    return done;
}
