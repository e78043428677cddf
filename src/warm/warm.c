/* warm.c - see warm.h. */
#include "warm/warm.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "lend/lend_internal.h"
#include "image/image.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"
#include "util/token.h"

struct lb_warm_pool {
    struct lb_warm_config cfg;
    struct lb_lend *lend;
    struct lb_provider *prov; /* the default provider: the class's */
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    bool stop;
    int64_t in_flight;   /* creations under way */
    int64_t failures;    /* creations failed in a row (reset by one that works) */
    int64_t retry_at_ms; /* clock_mono_ms before which no creation starts (backoff) */
    pthread_t *threads;
    size_t n_threads;
};

/* ---------- refilling ---------- */

/* Make one warm sandbox of class cls (image) through lending's one start (record "starting"
 * with its class, provider create), then record it warm. 0, 1 when no creation slot came in
 * time (seeds go first: nothing was tried), or -1 when it could not be made (logged,
 * counted). */
static int warm_make_one(struct lb_warm_pool *w, const char *image, const char *cls)
{
    struct lb_lend *l = w->lend;
    struct lb_seed_request req = {.ttl_s = -1, .provider = w->prov->ops->name, .image = image};
    struct lend_start s;
    struct lb_error err = {0};
    int64_t t0 = clock_mono_ms();
    int r = lend_start_prepare(l, &req, &s, &err);

    if (r == 0)
        r = lend_start_recorded(l, &s, NULL, cls, 0, &err);
    if (r == -EAGAIN && !s.recorded) { /* seeds are starting: not now, and no failure */
        lend_start_release(&s);
        return 1;
    }
    if (r < 0) {
        if (s.recorded)
            log_warn_sbx(s.rec.id, "warm pool: sandbox %s could not start: %s", s.rec.id,
                         err.message);
        else
            log_warn("warm pool: cannot record a warm sandbox: %s", err.message);
        goto failed;
    }
    r = store_mark_warm(lend_store(l), s.rec.id, s.desc_text,
                        w->cfg.max_age_s > 0 ? s.rec.created_at + w->cfg.max_age_s : 0, &err);
    if (r < 0) {
        log_warn_sbx(s.rec.id, "warm pool: sandbox %s could not start: %s", s.rec.id, err.message);
        lend_start_rollback(l, &s);
        goto failed;
    }
    metrics_add(LB_M_WARM_REFILLS, 1);
    metrics_add(LB_M_WARM_REFILL_MS, (uint64_t)(clock_mono_ms() - t0));
    metrics_set(LB_M_WARM_REFILL_LAST_MS, (uint64_t)(clock_mono_ms() - t0));
    lb_log_ids(LB_LOG_DEBUG, NULL, s.rec.id, "warm pool: sandbox %s ready in %lld ms", s.rec.id,
               (long long)(clock_mono_ms() - t0));
    goto out;
failed:
    metrics_add(LB_M_WARM_REFILLS_FAILED, 1);
    r = -1;
out:
    lend_start_release(&s);
    return r < 0 ? -1 : 0;
}

/* How many warm sandboxes to make now (< 0: how many too many). Call with w->mutex held. */
static int64_t warm_wanted(struct lb_warm_pool *w)
{
    int64_t counts[LB_STATE_COUNT], live = 0, room, want;

    if (lend_is_draining(w->lend) || store_count_by_state(lend_store(w->lend), counts, NULL) < 0 ||
        store_count_live(lend_store(w->lend), &live, NULL) < 0)
        return 0;
    want = w->cfg.size - counts[LB_STATE_WARM] - w->in_flight;
    if (w->cfg.recycle && w->cfg.max_uses > 0) {
        char image[LB_IMAGE_NAME_MAX + 1], cls[LEND_WARM_CLASS_MAX];
        int64_t back = 0;

        lend_warm_class(w->lend, w->prov, image, cls);
        if (store_count_recyclable(lend_store(w->lend), cls, w->cfg.max_uses, &back, NULL) == 0 &&
            want > 0)
            want = want > back ? want - back : 0;
    }
    if (want < 0)
        return w->in_flight == 0 ? want : 0;
    room = lend_config(w->lend)->max_sandboxes - live;
    return want < room ? want : room > 0 ? room : 0;
}

/* lend_pool_slots.claim: a place for a recycle (a release giving its sandbox back) while
 * fewer than size sandboxes are warm or being made; it counts as a creation under way. */
static bool warm_slot_claim(void *ctx)
{
    struct lb_warm_pool *w = ctx;
    int64_t counts[LB_STATE_COUNT];
    bool ok = false;

    pthread_mutex_lock(&w->mutex);
    if (!w->stop && w->cfg.recycle && !lend_is_draining(w->lend) &&
        store_count_by_state(lend_store(w->lend), counts, NULL) == 0 &&
        counts[LB_STATE_WARM] + w->in_flight < w->cfg.size) {
        w->in_flight++;
        ok = true;
    }
    pthread_mutex_unlock(&w->mutex);
    return ok;
}

/* lend_pool_slots.release: the recycle is over (its sandbox warm or not made). */
static void warm_slot_release(void *ctx)
{
    struct lb_warm_pool *w = ctx;

    pthread_mutex_lock(&w->mutex);
    w->in_flight--;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->mutex);
}

/* Backoff after failed creations (a provider error, no free uid, a full disk): the first
 * retry after WARM_BACKOFF_MIN_MS, doubling per failure in a row up to WARM_BACKOFF_MAX_MS, so
 * that a pool that cannot be made costs a few attempts a minute, never a hot loop. */
#define WARM_BACKOFF_MIN_MS 500
#define WARM_BACKOFF_MAX_MS 30000

/* Wait on the pool's condition until it is kicked or ms pass. Call with w->mutex held. */
static void warm_wait_ms(struct lb_warm_pool *w, int64_t ms)
{
    struct timespec until = clock_realtime_after_ms(ms);

    pthread_cond_timedwait(&w->cond, &w->mutex, &until);
}

/* Run the calling refill thread refill_nice above the daemon's nice value (Linux: a nice value
 * is per thread, and what the thread starts inherits it). A creation costs the CPU of several
 * execs (bwrap, mounts, namespaces, cgroups); at the daemon's own priority the refills a take
 * wakes run beside the taken sandbox's first execs and its release and slow them down. Nicer,
 * they take the CPU that requests leave. The provider brings the sandbox itself back to the
 * daemon's nice value once it is up (a warm sandbox runs like one a seed made). */
static void warm_thread_setup(const struct lb_warm_pool *w)
{
    id_t tid = (id_t)syscall(SYS_gettid);
    int base, want;

    (void)pthread_setname_np(pthread_self(), "warm-refill");
    if (w->cfg.refill_nice <= 0)
        return;
    errno = 0;
    base = getpriority(PRIO_PROCESS, (id_t)getpid()); /* the main thread's: the daemon's */
    if (base == -1 && errno != 0)
        base = 0;
    want = base + (int)w->cfg.refill_nice;
    if (want > 19)
        want = 19;
    if (setpriority(PRIO_PROCESS, tid, want) < 0)
        log_warn("warm pool: cannot set a refill thread's nice value to %d: %s", want,
                 strerror(errno));
}

static void *warm_main(void *arg)
{
    struct lb_warm_pool *w = arg;
    char image[LB_IMAGE_NAME_MAX + 1], cls[LEND_WARM_CLASS_MAX];

    warm_thread_setup(w);
    pthread_mutex_lock(&w->mutex);
    while (!w->stop) {
        int64_t now = clock_mono_ms(), want;
        /* read first: a take after this point ends the idle wait below at once */
        uint64_t gen = lend_warm_generation(w->lend);

        if (now < w->retry_at_ms) { /* backing off: kicks do not shorten it */
            warm_wait_ms(w, w->retry_at_ms - now < 1000 ? w->retry_at_ms - now : 1000);
            continue;
        }
        /* the class follows the default image's resolution (an import of a listed image):
         * warm sandboxes of an older class make room for the current one */
        lend_warm_class(w->lend, w->prov, image, cls);
        if (!lend_is_draining(w->lend)) {
            pthread_mutex_unlock(&w->mutex);
            int stale = lend_stop_oldest_warm(w->lend, "class_changed", cls);
            pthread_mutex_lock(&w->mutex);
            if (stale == 0)
                continue;
        }
        want = warm_wanted(w);
        if (want > 0) {
            w->in_flight++;
            pthread_mutex_unlock(&w->mutex);
            int r = warm_make_one(w, image, cls);
            pthread_mutex_lock(&w->mutex);
            w->in_flight--;
            if (r > 0)
                continue;
            if (r < 0) {
                int64_t shift = w->failures < 16 ? w->failures : 16;
                int64_t delay = (int64_t)WARM_BACKOFF_MIN_MS << shift;

                if (delay > WARM_BACKOFF_MAX_MS)
                    delay = WARM_BACKOFF_MAX_MS;
                w->failures++;
                w->retry_at_ms = clock_mono_ms() + delay;
                log_warn("warm pool: %lld creation(s) failed in a row; next attempt in %lld ms",
                         (long long)w->failures, (long long)delay);
            } else {
                w->failures = 0;
            }
            continue;
        }
        if (want < 0) { /* more than size (adopted after a restart with a smaller pool) */
            pthread_mutex_unlock(&w->mutex);
            lend_stop_oldest_warm(w->lend, "pool_shrunk", NULL);
            pthread_mutex_lock(&w->mutex);
            continue;
        }
        /* woken by a take or an eviction (lending's warm generation) or warm_kick; the
         * timeout also notices stops by the sweeper (max age) and the end of draining */
        pthread_mutex_unlock(&w->mutex);
        lend_warm_wait(w->lend, gen, 1000);
        pthread_mutex_lock(&w->mutex);
    }
    pthread_mutex_unlock(&w->mutex);
    return NULL;
}

void warm_kick(struct lb_warm_pool *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&w->mutex);
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->mutex);
    lend_warm_changed(w->lend);
}

int warm_start(const struct lb_warm_config *cfg, struct lb_lend *l, struct lb_warm_pool **out,
               struct lb_error *err)
{
    struct lb_warm_pool *w;
    char image[LB_IMAGE_NAME_MAX + 1], cls[LEND_WARM_CLASS_MAX];
    struct lb_provider_caps caps;
    int64_t refills;
    int r;

    *out = NULL;
    if (cfg->size <= 0)
        return 0;
    w = calloc(1, sizeof(*w));
    if (!w)
        return lb_error_set(err, -ENOMEM, "out of memory");
    w->cfg = *cfg;
    w->lend = l;
    pthread_mutex_init(&w->mutex, NULL);
    pthread_cond_init(&w->cond, NULL);
    r = registry_choose(lend_providers(l), NULL, &w->prov, err);
    if (r < 0)
        goto fail;
    lend_warm_class(w->lend, w->prov, image, cls);
    provider_caps(w->prov, &caps);
    /* A recycle is a stop and a create under a new id, paid in the release call. Only the
     * local provider recycles: an engine's create is no cheaper there than in a refill, and
     * its reset (lxd) remakes an instance under the same id, which a recycle does not use. */
    if (w->cfg.recycle && (!caps.reset || caps.engine_creates)) {
        log_warn("warm pool: pool.recycle = yes, but the %s provider %s: the pool does not "
                 "recycle (a release stops the sandbox and the pool refills)",
                 w->prov->ops->name,
                 !caps.reset ? "cannot reset sandboxes" : "makes its sandboxes in an engine");
        w->cfg.recycle = false;
    }
    w->n_threads = (size_t)(cfg->refill_concurrency > 0 ? cfg->refill_concurrency : 2);
    /* Refills at once. The local provider's creates are the daemon's own work on this
     * machine's CPU (bwrap, mounts, namespaces): one at a time behind the seeds, so a seed
     * never waits behind more than one. An engine's creates are its service's (LXD's, the
     * docker daemon's) and mostly waiting: every refill thread at once, bounded by the
     * provider's own create concurrency less one. Either way one creation slot, and one of
     * the provider's create places, stay for seeds (a seed admitted would otherwise wait in
     * the provider behind refills, outside its create timeout). */
    refills = 1;
    if (caps.engine_creates) {
        refills = (int64_t)w->n_threads;
        if (caps.create_concurrency > 0 && refills > caps.create_concurrency - 1)
            refills = caps.create_concurrency > 1 ? caps.create_concurrency - 1 : 1;
    }
    if (refills > lend_config(l)->max_starting - 1 && lend_config(l)->max_starting > 0)
        refills = lend_config(l)->max_starting > 1 ? lend_config(l)->max_starting - 1 : 1;
    lend_set_refill_slots(l, refills);
    w->threads = calloc(w->n_threads, sizeof(*w->threads));
    if (!w->threads) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < w->n_threads; i++) {
        r = pthread_create(&w->threads[i], NULL, warm_main, w);
        if (r != 0) {
            w->n_threads = i;
            r = lb_error_set(err, -r, "cannot start the warm pool's threads");
            goto fail;
        }
    }
    lend_set_warm(l, w->prov);
    lend_set_pool_slots(l, &(struct lend_pool_slots){warm_slot_claim, warm_slot_release, w});
    log_info("warm pool: %lld sandboxes of the default class, now %s (max age %lld s, %lld made "
             "at once, nice +%lld, recycle %s, max uses %lld)",
             (long long)cfg->size, cls, (long long)cfg->max_age_s, (long long)refills,
             (long long)cfg->refill_nice, w->cfg.recycle ? "yes" : "no", (long long)cfg->max_uses);
    *out = w;
    return 0;
fail:
    warm_stop(w);
    return r;
}

void warm_stop(struct lb_warm_pool *w)
{
    if (!w)
        return;
    lend_set_pool_slots(w->lend, NULL); /* no recycle calls into w after this */
    lend_set_warm(w->lend, NULL);
    lend_set_refill_slots(w->lend, 1);
    pthread_mutex_lock(&w->mutex);
    w->stop = true;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->mutex);
    lend_warm_changed(w->lend); /* threads idle in lend_warm_wait */
    for (size_t i = 0; i < w->n_threads; i++)
        pthread_join(w->threads[i], NULL);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->mutex);
    free(w->threads);
    free(w);
}
