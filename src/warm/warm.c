/* warm.c - see warm.h. */
#include "warm/warm.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---------- the class ---------- */

/* "<provider>:<image>" fits: a provider name and an image name */
#define WARM_CLASS_MAX (64 + LB_IMAGE_NAME_MAX + 2)

/* The pool's class now: the image a seed that names none gets now (resolved as lend_seed does:
 * a default image list picks the first one present, so the class follows imports) into image
 * (LB_IMAGE_NAME_MAX + 1 bytes) and "<provider>:<image>" into cls (WARM_CLASS_MAX bytes). */
static void warm_class(struct lb_warm_pool *w, char *image, char *cls)
{
    const char *img = lend_resolve_default_image(w->lend, w->prov, image, LB_IMAGE_NAME_MAX + 1);

    if (img != image)
        snprintf(image, LB_IMAGE_NAME_MAX + 1, "%s", img);
    snprintf(cls, WARM_CLASS_MAX, "%s:%s", w->prov->ops->name, image);
}

/* Is this seed (its provider and image resolved) of the pool's class (image: the class's
 * now)? The default provider and image, no resources, no network, no ports, and the default
 * workdir: a warm sandbox was made with exactly these, so it is what the seed would start. */
static bool warm_matches(struct lb_warm_pool *w, const struct lb_seed_request *req,
                         const struct lb_provider *prov, const char *image, const char *class_image)
{
    const struct lb_resources *res = &req->resources;

    return prov == w->prov && image && strcmp(image, class_image) == 0 && res->cpu <= 0 &&
           res->memory_mib <= 0 && res->pids <= 0 && res->disk_mib <= 0 && !req->network &&
           req->n_ports == 0 &&
           (!req->workdir || strcmp(req->workdir, lend_config(w->lend)->workdir) == 0);
}

/* ---------- taking ---------- */

static int warm_take(void *ctx, const char *rsid, const struct lb_seed_request *req,
                     struct lb_provider *prov, const char *image, int64_t ttl_s, json_t **lease_out,
                     struct lb_error *err)
{
    struct lb_warm_pool *w = ctx;
    struct lb_lend *l = w->lend;
    struct lb_resources res = req->resources;
    struct lb_record rec = {0};
    struct lb_error perr = {0};
    json_t *spec = NULL, *desc = NULL;
    char *spec_text = NULL;
    int64_t now = clock_now_s();
    char class_image[LB_IMAGE_NAME_MAX + 1], cls[WARM_CLASS_MAX];
    int r;

    warm_class(w, class_image, cls);
    if (!warm_matches(w, req, prov, image, class_image)) {
        metrics_add(LB_M_WARM_OTHER_CLASS, 1);
        return -ENOENT;
    }
    r = lend_check_resources(l, prov, &res, err);
    if (r < 0)
        return r;
    spec = lend_spec_json(l, req, image, res.disk_mib);
    /* the image store is the local provider's (as for a seed) */
    r = spec && strcmp(prov->ops->name, "local") == 0 ? lend_image_check(l, image, spec, err) : 0;
    if (r < 0)
        goto out;
    spec_text = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
    if (!spec_text) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    struct lb_warm_take t = {
        .pool_class = cls,
        .now_s = now,
        .rsid = rsid,
        .task_id = req->task_id,
        .spec_json = spec_text,
        .expires_at = ttl_s > 0 ? now + ttl_s : 0,
        .token_hash = lend_operate_token_hash,
        .token_ctx = l,
    };
    r = store_take_warm(lend_store(l), &t, &rec, err);
    if (r == -ENOENT) {
        metrics_add(LB_M_WARM_MISSES, 1);
        goto out;
    }
    if (r < 0)
        goto out;
    warm_kick(w);
    /* lent now: the seed's files, then the lease; a failure stops it as a failed seed */
    desc = rec.descriptor_json ? json_loads(rec.descriptor_json, 0, NULL) : NULL;
    struct lb_sandbox_ref ref = {rec.id, desc};
    for (size_t i = 0; i < req->n_files; i++) {
        const struct lb_seed_file *f = &req->files[i];

        lb_error_clear(&perr);
        r = provider_file_write(prov, &ref, f->path, f->data, f->len, f->mode, &perr);
        if (r < 0) {
            struct lb_error serr = {0};

            r = lb_error_set(err, r, "seed file '%s' could not be written: %s", f->path,
                             perr.message);
            metrics_add(LB_M_SEEDS_FAILED, 1);
            if (lend_stop_record(l, &rec, "seed_failed", LB_STATE_FAILED_SEED, &serr) < 0)
                log_error_sbx(rec.id,
                              "session %s: failed seed's sandbox %s could not be stopped: %s", rsid,
                              rec.id, serr.message);
            goto out;
        }
    }
    *lease_out = lend_render_lease(l, &rec, false);
    if (!*lease_out) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    metrics_add(LB_M_WARM_HITS, 1);
    metrics_add(LB_M_SEEDS_OK, 1);
    log_info_sbx(rec.id, "session %s: lent warm sandbox %s (task %s)", rsid, rec.id, req->task_id);
out:
    json_decref(desc);
    json_decref(spec);
    free(spec_text);
    store_record_release(&rec);
    return r;
}

/* Stop the oldest warm sandbox (reason) so that its place goes to a seed, or (not_class
 * non-NULL) the oldest one whose class is not not_class. 0 if one was. */
static int warm_stop_oldest(struct lb_warm_pool *w, const char *reason, const char *not_class)
{
    struct lb_record_filter f = {.state = LB_STATE_WARM, .limit = not_class ? 0 : 4};
    struct lb_record *recs = NULL;
    size_t n = 0;
    int r = store_list_sandboxes(lend_store(w->lend), &f, &recs, &n, NULL);

    for (size_t i = 0; r == 0 && i < n; i++) {
        if (not_class && recs[i].pool_class && strcmp(recs[i].pool_class, not_class) == 0)
            continue;
        if (store_claim_warm(lend_store(w->lend), recs[i].id, reason, NULL) < 0)
            continue; /* a seed took it meanwhile */
        log_info_sbx(recs[i].id, "warm sandbox %s stopped (%s)", recs[i].id, reason);
        lend_stop_record(w->lend, &recs[i], NULL, LB_STATE_STOP_FAILED, NULL);
        store_records_free(recs, n);
        return 0;
    }
    store_records_free(recs, n);
    return -ENOENT;
}

static int warm_evict(void *ctx)
{
    return warm_stop_oldest(ctx, "evicted", NULL);
}

/* ---------- refilling ---------- */

/* Make one warm sandbox of class cls (image): record (starting, its class), provider create,
 * record warm. 0, or -1 when it could not be made (logged, counted). */
static int warm_make_one(struct lb_warm_pool *w, const char *image, const char *cls)
{
    struct lb_lend *l = w->lend;
    struct lb_seed_request req = {.ttl_s = -1};
    struct lb_sandbox_spec spec = {.workdir = lend_config(l)->workdir, .image = image};
    struct lb_record rec = {0}, got = {0};
    struct lb_error err = {0};
    json_t *spec_json = NULL, *desc = NULL;
    char *spec_text = NULL, *desc_text = NULL;
    int64_t t0 = clock_mono_ms();
    int r;

    r = lend_check_resources(l, w->prov, &spec.resources, &err);
    if (r == 0)
        r = token_new_sandbox_id(rec.id);
    spec_json = r == 0 ? lend_spec_json(l, &req, image, spec.resources.disk_mib) : NULL;
    if (spec_json && strcmp(w->prov->ops->name, "local") == 0 &&
        lend_image_check(l, image, spec_json, &err) < 0) {
        log_warn("warm pool: %s", err.message);
        goto failed;
    }
    spec_text = spec_json ? json_dumps(spec_json, JSON_COMPACT) : NULL;
    if (!spec_text) {
        log_warn("warm pool: cannot make a record: %s", r < 0 ? err.message : "out of memory");
        goto failed;
    }
    rec.provider = (char *)w->prov->ops->name;
    rec.state = LB_STATE_STARTING;
    rec.spec_json = spec_text;
    rec.pool_class = (char *)cls;
    rec.created_at = clock_now_s();
    /* Intent before action, as for a seed. */
    if (store_insert_sandbox(lend_store(l), &rec, lend_config(l)->max_sandboxes, &err) < 0) {
        log_warn("warm pool: cannot record a warm sandbox: %s", err.message);
        goto failed;
    }
    struct lb_sandbox_ref ref = {rec.id, NULL};
    r = provider_create(w->prov, &ref, &spec, &desc, &err);
    if (r == 0) {
        desc_text = json_dumps(desc, JSON_COMPACT);
        r = desc_text
                ? store_mark_warm(lend_store(l), rec.id, desc_text,
                                  w->cfg.max_age_s > 0 ? rec.created_at + w->cfg.max_age_s : 0,
                                  &err)
                : lb_error_set(&err, -ENOMEM, "out of memory");
    }
    if (r < 0) {
        log_warn_sbx(rec.id, "warm pool: sandbox %s could not start: %s", rec.id, err.message);
        if (desc_text)
            store_set_descriptor(lend_store(l), rec.id, desc_text, NULL);
        if (store_get_sandbox(lend_store(l), rec.id, &got, NULL) == 0 &&
            got.state != LB_STATE_STOPPED)
            lend_stop_record(l, &got, "seed_failed", LB_STATE_FAILED_SEED, NULL);
        goto failed;
    }
    metrics_add(LB_M_WARM_REFILLS, 1);
    metrics_add(LB_M_WARM_REFILL_MS, (uint64_t)(clock_mono_ms() - t0));
    metrics_set(LB_M_WARM_REFILL_LAST_MS, (uint64_t)(clock_mono_ms() - t0));
    lb_log_ids(LB_LOG_DEBUG, NULL, rec.id, "warm pool: sandbox %s ready in %lld ms", rec.id,
               (long long)(clock_mono_ms() - t0));
    goto out;
failed:
    metrics_add(LB_M_WARM_REFILLS_FAILED, 1);
    r = -1;
out:
    store_record_release(&got);
    json_decref(spec_json);
    json_decref(desc);
    free(spec_text);
    free(desc_text);
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
    if (want < 0)
        return w->in_flight == 0 ? want : 0;
    room = lend_config(w->lend)->max_sandboxes - live;
    return want < room ? want : room > 0 ? room : 0;
}

/* Backoff after failed creations (a provider error, no free uid, a full disk): the first
 * retry after WARM_BACKOFF_MIN_MS, doubling per failure in a row up to WARM_BACKOFF_MAX_MS, so
 * that a pool that cannot be made costs a few attempts a minute, never a hot loop. */
#define WARM_BACKOFF_MIN_MS 500
#define WARM_BACKOFF_MAX_MS 30000

/* Wait on the pool's condition until it is kicked or ms pass. Call with w->mutex held. */
static void warm_wait_ms(struct lb_warm_pool *w, int64_t ms)
{
    struct timespec until;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (ms % 1000) * 1000000;
    if (until.tv_nsec >= 1000000000) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&w->cond, &w->mutex, &until);
}

static void *warm_main(void *arg)
{
    struct lb_warm_pool *w = arg;
    char image[LB_IMAGE_NAME_MAX + 1], cls[WARM_CLASS_MAX];

    pthread_mutex_lock(&w->mutex);
    while (!w->stop) {
        int64_t now = clock_mono_ms(), want;

        if (now < w->retry_at_ms) { /* backing off: kicks do not shorten it */
            warm_wait_ms(w, w->retry_at_ms - now < 1000 ? w->retry_at_ms - now : 1000);
            continue;
        }
        /* the class follows the default image's resolution (an import of a listed image):
         * warm sandboxes of an older class make room for the current one */
        warm_class(w, image, cls);
        if (!lend_is_draining(w->lend)) {
            pthread_mutex_unlock(&w->mutex);
            int stale = warm_stop_oldest(w, "class_changed", cls);
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
            warm_stop_oldest(w, "pool_shrunk", NULL);
            pthread_mutex_lock(&w->mutex);
            continue;
        }
        /* also notices stops by the sweeper (max age) and the end of draining */
        warm_wait_ms(w, 1000);
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
}

int warm_start(const struct lb_warm_config *cfg, struct lb_lend *l, struct lb_warm_pool **out,
               struct lb_error *err)
{
    struct lb_warm_pool *w;
    char image[LB_IMAGE_NAME_MAX + 1], cls[WARM_CLASS_MAX];
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
    warm_class(w, image, cls);
    w->n_threads = (size_t)(cfg->refill_concurrency > 0 ? cfg->refill_concurrency : 2);
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
    lend_set_pool(l, &(struct lend_pool_hooks){warm_take, warm_evict, w});
    log_info("warm pool: %lld sandboxes of the default class, now %s (max age %lld s, %zu made "
             "at once)",
             (long long)cfg->size, cls, (long long)cfg->max_age_s, w->n_threads);
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
    lend_set_pool(w->lend, NULL);
    pthread_mutex_lock(&w->mutex);
    w->stop = true;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->mutex);
    for (size_t i = 0; i < w->n_threads; i++)
        pthread_join(w->threads[i], NULL);
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->mutex);
    free(w->threads);
    free(w);
}
