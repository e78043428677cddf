/*
 * lend.c - see lend.h.
 *
 * A stop always goes: record "stopping" (with its reason) -> provider_stop -> record
 * "stopped"; or, when the provider fails, "stop_failed"/"failed_seed" with the error, the
 * attempt count and the time of the next retry (exponential backoff). Nothing leaves the live
 * set before the provider said the sandbox is gone.
 */
#include "lend/lend.h"
#include "lend/lend_internal.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <uthash.h>

#include "image/image.h"
#include "provider/registry.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"
#include "util/token.h"

struct lend_session_lock {
    char *rsid;
    pthread_mutex_t mutex;
    int refs;
    UT_hash_handle hh;
};

/* A sandbox's operate-token fence: up while exclusive > 0. */
struct lend_fence {
    char *id;
    int exclusive;  /* exclusive execs of the sandbox under way */
    int writers;    /* operate-token writes in progress (lend_fence_enter) */
    char since[32]; /* when the fence went up, ISO 8601 UTC */
    UT_hash_handle hh;
};

struct lb_lend {
    struct lb_lend_config cfg;
    char *default_image, *workdir, *public_url;
    char *images_dir;
    unsigned char *operate_key;
    struct lb_store *store;
    struct lb_registry *providers;
    atomic_bool draining;
    pthread_mutex_t locks_mutex;
    struct lend_session_lock *locks;
    lb_lend_release_hook release_hook;
    void *release_ctx;
    lb_lend_stopped_hook stopped_hook;
    void *stopped_ctx;
    struct lend_pool_hooks pool; /* a warm pool's (src/warm/); zero: none */
    pthread_mutex_t fence_mutex;
    pthread_cond_t fence_cond; /* signalled when a fence's writers reach 0 */
    struct lend_fence *fences;
};

/* ---------- session locks ---------- */

static void session_lock_put(struct lb_lend *l, struct lend_session_lock *s)
{
    pthread_mutex_lock(&l->locks_mutex);
    if (--s->refs == 0) {
        HASH_DEL(l->locks, s);
        pthread_mutex_destroy(&s->mutex);
        free(s->rsid);
        free(s);
    }
    pthread_mutex_unlock(&l->locks_mutex);
}

/* see lend_internal.h */
int lend_session_lock(struct lb_lend *l, const char *rsid, bool try_only,
                      struct lend_session_lock **out, struct lb_error *err)
{
    int64_t wait_s = try_only                         ? 0
                     : l->cfg.session_lock_wait_s > 0 ? l->cfg.session_lock_wait_s
                                                      : 30;
    struct lend_session_lock *s;
    struct timespec until;
    int r;

    *out = NULL;
    pthread_mutex_lock(&l->locks_mutex);
    HASH_FIND_STR(l->locks, rsid, s);
    if (!s) {
        s = calloc(1, sizeof(*s));
        if (!s || !(s->rsid = strdup(rsid))) {
            free(s);
            pthread_mutex_unlock(&l->locks_mutex);
            return lb_error_set(err, -ENOMEM, "out of memory");
        }
        pthread_mutex_init(&s->mutex, NULL);
        HASH_ADD_KEYPTR(hh, l->locks, s->rsid, strlen(s->rsid), s);
    }
    s->refs++;
    pthread_mutex_unlock(&l->locks_mutex);
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += (time_t)wait_s;
    r = try_only ? pthread_mutex_trylock(&s->mutex)
                 : pthread_mutex_clocklock(&s->mutex, CLOCK_MONOTONIC, &until);
    if (r != 0 && try_only) {
        session_lock_put(l, s);
        return lb_error_set(err, -EBUSY, "session %s is busy", rsid);
    }
    if (r != 0) {
        session_lock_put(l, s);
        metrics_add(LB_M_SESSION_LOCK_TIMEOUTS, 1);
        log_warn("session %s: its lock stayed busy for %lld s; the request gives up", rsid,
                 (long long)wait_s);
        return lb_error_set(err, -EBUSY,
                            "session %s is busy: another seed, release or delete of it has "
                            "held it for %lld s; retry later",
                            rsid, (long long)wait_s);
    }
    *out = s;
    return 0;
}

void lend_session_unlock(struct lb_lend *l, struct lend_session_lock *s)
{
    if (!s)
        return;
    pthread_mutex_unlock(&s->mutex);
    session_lock_put(l, s);
}

/* ---------- setup ---------- */

#define DEFAULT_IMAGE_SEPS " \t,"

/* Is list ("NAME", or "NAME NAME ... [host]") a usable default image? */
static bool lend_default_image_is_valid(const char *list)
{
    size_t n = 0;

    for (const char *p = list; *p;) {
        char name[LB_IMAGE_NAME_MAX + 1];
        size_t len;

        p += strspn(p, DEFAULT_IMAGE_SEPS);
        len = strcspn(p, DEFAULT_IMAGE_SEPS);
        if (len == 0)
            break;
        if (len > LB_IMAGE_NAME_MAX)
            return false;
        memcpy(name, p, len);
        name[len] = '\0';
        if (strcmp(name, "host") != 0 && !image_name_is_valid(name))
            return false;
        p += len;
        n++;
    }
    return n > 0;
}

/* The image of a seed that names none: the first name of list (the provider's default image,
 * else lending.default_image; "NAME" or "NAME NAME ... [host]") that is "host" or
 * present under the images dir now, else the list's first name (the seed then answers 404
 * image_not_found naming it). Written into buf. */
static const char *lend_default_image(const struct lb_lend *l, const char *list, char *buf,
                                      size_t size)
{
    buf[0] = '\0';
    for (const char *p = list; *p;) {
        char name[LB_IMAGE_NAME_MAX + 1], path[PATH_MAX];
        struct stat st;
        size_t len;

        p += strspn(p, DEFAULT_IMAGE_SEPS);
        len = strcspn(p, DEFAULT_IMAGE_SEPS);
        if (len == 0 || len >= sizeof(name))
            break;
        snprintf(name, sizeof(name), "%.*s", (int)len, p);
        p += len;
        if (!buf[0])
            snprintf(buf, size, "%s", name);
        if (strcmp(name, "host") == 0 ||
            (l->cfg.images_dir &&
             snprintf(path, sizeof(path), "%s/%s", l->cfg.images_dir, name) < (int)sizeof(path) &&
             stat(path, &st) == 0 && S_ISDIR(st.st_mode))) {
            snprintf(buf, size, "%s", name);
            return buf;
        }
    }
    return buf[0] ? buf : "host";
}

const char *lend_resolve_default_image(struct lb_lend *l, struct lb_provider *prov, char *buf,
                                       size_t size)
{
    struct lb_provider_caps caps;

    provider_caps(prov, &caps);
    return lend_default_image(l, caps.default_image ? caps.default_image : l->cfg.default_image,
                              buf, size);
}

int lend_new(const struct lb_lend_config *cfg, struct lb_store *st, struct lb_registry *providers,
             struct lb_lend **out, struct lb_error *err)
{
    struct lb_lend *l = calloc(1, sizeof(*l));

    if (!l)
        return lb_error_set(err, -ENOMEM, "out of memory");
    l->cfg = *cfg;
    l->default_image = strdup(cfg->default_image ? cfg->default_image : "host");
    l->images_dir = cfg->images_dir ? strdup(cfg->images_dir) : NULL;
    l->cfg.images_dir = l->images_dir;
    l->workdir = strdup(cfg->workdir ? cfg->workdir : "/workspace");
    l->public_url = strdup(cfg->public_url ? cfg->public_url : "");
    l->operate_key = malloc(cfg->operate_key_len ? cfg->operate_key_len : 1);
    if (!l->default_image || !l->workdir || !l->public_url || !l->operate_key) {
        lend_free(l);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    memcpy(l->operate_key, cfg->operate_key, cfg->operate_key_len);
    if (!lend_default_image_is_valid(l->default_image)) {
        lend_free(l);
        return lb_error_set(err, -EINVAL,
                            "default image '%s': want 'host', an image name, or a list of them "
                            "separated by spaces or commas",
                            cfg->default_image);
    }
    l->cfg.default_image = l->default_image;
    l->cfg.workdir = l->workdir;
    l->cfg.public_url = l->public_url;
    l->cfg.operate_key = l->operate_key;
    l->store = st;
    l->providers = providers;
    pthread_mutex_init(&l->locks_mutex, NULL);
    pthread_mutex_init(&l->fence_mutex, NULL);
    pthread_cond_init(&l->fence_cond, NULL);
    *out = l;
    return 0;
}

void lend_free(struct lb_lend *l)
{
    if (!l)
        return;
    free(l->default_image);
    free(l->images_dir);
    free(l->workdir);
    free(l->public_url);
    free(l->operate_key);
    pthread_mutex_destroy(&l->locks_mutex);
    if (l->store) { /* initialised (lend_new got that far) */
        struct lend_fence *f, *tmp;

        HASH_ITER(hh, l->fences, f, tmp) {
            HASH_DEL(l->fences, f);
            free(f->id);
            free(f);
        }
        pthread_mutex_destroy(&l->fence_mutex);
        pthread_cond_destroy(&l->fence_cond);
    }
    free(l);
}

void lend_set_draining(struct lb_lend *l, bool draining)
{
    atomic_store(&l->draining, draining);
}

bool lend_is_draining(struct lb_lend *l)
{
    return atomic_load(&l->draining);
}

void lend_set_release_hook(struct lb_lend *l, lb_lend_release_hook hook, void *ctx)
{
    l->release_hook = hook;
    l->release_ctx = ctx;
}

void lend_set_stopped_hook(struct lb_lend *l, lb_lend_stopped_hook hook, void *ctx)
{
    l->stopped_hook = hook;
    l->stopped_ctx = ctx;
}

/* Let the activation service close the harness of a lent sandbox about to be stopped. */
static void lend_before_stop(struct lb_lend *l, const struct lb_record *r)
{
    if (l->release_hook && r->rsid && r->state == LB_STATE_LENT)
        l->release_hook(l->release_ctx, r->rsid, r->id);
}

/* ---------- rendering ---------- */

static json_t *json_time(int64_t unix_s)
{
    char buf[32];

    if (unix_s <= 0)
        return json_null();
    clock_format_rfc3339(unix_s, buf, sizeof(buf));
    return json_string(buf);
}

void lend_set_pool(struct lb_lend *l, const struct lend_pool_hooks *hooks)
{
    l->pool = hooks ? *hooks : (struct lend_pool_hooks){0};
}

static int lend_operate_token(struct lb_lend *l, const char *id, char token[4 + 65])
{
    char mac[LB_SHA256_HEX + 1];
    int r = token_hmac_hex(l->operate_key, l->cfg.operate_key_len, id, mac);

    if (r < 0)
        return r;
    snprintf(token, 4 + 65, "lbo_%s", mac);
    return 0;
}

static const char *spec_string(const struct lb_record *r, const char *key, const char *def,
                               json_t **holder)
{
    json_t *spec = r->spec_json ? json_loads(r->spec_json, 0, NULL) : NULL;
    const char *v = spec ? json_string_value(json_object_get(spec, key)) : NULL;

    *holder = spec;
    return v ? v : def;
}

/* The record's labels (a seed's "labels" or "metadata") as a new object; {} when none. */
static json_t *lend_spec_labels(json_t *spec)
{
    json_t *labels = json_object_get(spec, "labels");

    return json_is_object(labels) ? json_deep_copy(labels) : json_object();
}

/* see lend_internal.h */
int lend_operate_token_hash(void *lend, const char *id, char *hash)
{
    char token[4 + 65];
    int r = lend_operate_token(lend, id, token);

    if (r == 0)
        token_sha256_hex(token, strlen(token), hash);
    return r;
}

json_t *lend_render_lease(struct lb_lend *l, const struct lb_record *r, bool reused)
{
    char token[4 + 65] = "";
    json_t *spec = NULL, *lease;
    const char *image = spec_string(r, "image", "host", &spec); /* older records: host */
    const char *workdir = json_string_value(json_object_get(spec, "workdir"));

    if (lend_operate_token(l, r->id, token) < 0)
        token[0] = '\0';
    lease = json_pack("{s:s?,s:s?,s:s,s:s,s:s?,s:s,s:o,s:o,s:b,s:{s:s,s:s,s:s,s:s,s:s}}",
                      "resources_session_id", r->rsid, "task_id", r->task_id, "sandbox_id", r->id,
                      "state", store_state_name(r->state), "provider", r->provider, "image", image,
                      "created_at", json_time(r->created_at), "expires_at",
                      json_time(r->expires_at), "reused", reused, "access", "sandbox_id", r->id,
                      "scope", "operate", "token", token, "base_url", l->cfg.public_url, "workdir",
                      workdir ? workdir : l->cfg.workdir);
    if (lease)
        json_object_set_new(lease, "metadata", lend_spec_labels(spec));
    json_decref(spec);
    return lease;
}

static const char *record_status_guess(enum lb_record_state s)
{
    switch (s) {
    case LB_STATE_STARTING:
        return "starting";
    case LB_STATE_LENT:
    case LB_STATE_STOPPING:
    case LB_STATE_WARM:
        return "running";
    case LB_STATE_STOPPED:
        return "stopped";
    default:
        return "error";
    }
}

/* The record's image reference: "image" (the name the seed resolved to) and "image_digest"
 * (the stored tree it named then; null for host and trees placed by hand). */
static void lend_render_image_ref(json_t *j, const struct lb_record *r)
{
    json_t *spec = NULL;
    const char *image = spec_string(r, "image", "host", &spec);
    const char *digest = json_string_value(json_object_get(spec, "image_digest"));

    json_object_set_new(j, "image", json_string(image));
    json_object_set_new(j, "image_digest", digest ? json_string(digest) : json_null());
    json_decref(spec);
}

static json_t *lend_render_sandbox(const struct lb_record *r, const char *status, bool details)
{
    json_t *j = json_pack("{s:s,s:s,s:s,s:s?,s:o,s:o,s:s?}", "sandbox_id", r->id, "status",
                          status ? status : record_status_guess(r->state), "state",
                          store_state_name(r->state), "provider", r->provider, "created_at",
                          json_time(r->created_at), "expires_at", json_time(r->expires_at),
                          "resources_session_id", r->rsid);

    if (j) {
        json_t *spec = r->spec_json ? json_loads(r->spec_json, 0, NULL) : NULL;
        const char *wd = json_string_value(json_object_get(spec, "workdir"));

        json_object_set_new(j, "metadata", lend_spec_labels(spec));
        json_object_set_new(j, "workdir", wd ? json_string(wd) : json_null());
        json_decref(spec);
    }
    if (j && details) {
        json_object_set_new(j, "task_id", r->task_id ? json_string(r->task_id) : json_null());
        json_object_set_new(j, "stop_reason",
                            r->stop_reason ? json_string(r->stop_reason) : json_null());
        json_object_set_new(j, "stop_attempts", json_integer(r->stop_attempts));
        json_object_set_new(j, "last_error",
                            r->last_error ? json_string(r->last_error) : json_null());
        json_object_set_new(j, "next_attempt_at", json_time(r->next_attempt_at));
        json_object_set_new(j, "updated_at", json_time(r->updated_at));
        lend_render_image_ref(j, r);
    }
    return j;
}

/* ---------- providers ---------- */

/* see lend_internal.h */
struct lb_provider *lend_provider_of(struct lb_lend *l, const struct lb_record *r,
                                     struct lb_error *err)
{
    struct lb_provider *p = registry_get(l->providers, r->provider);

    if (!p)
        lb_error_set(err, -EREMOTEIO,
                     "sandbox %s belongs to provider '%s', which is not enabled on this daemon",
                     r->id, r->provider ? r->provider : "?");
    return p;
}

/* A lent sandbox about to get a provider call: its record, parsed descriptor and provider. */
struct lend_target {
    struct lb_record rec;
    json_t *desc;
    struct lb_sandbox_ref ref;
    struct lb_provider *prov;
};

static void lend_target_release(struct lend_target *t)
{
    json_decref(t->desc);
    store_record_release(&t->rec);
    memset(t, 0, sizeof(*t));
}

/* Load the lent sandbox id into t (release it with lend_target_release, also on failure).
 * -ENOENT if it is not lent, -EREMOTEIO if its provider is not enabled. */
static int lend_target_load(struct lb_lend *l, const char *id, struct lend_target *t,
                            struct lb_error *err)
{
    memset(t, 0, sizeof(*t));
    if (store_get_sandbox(l->store, id, &t->rec, NULL) < 0)
        return lb_error_set(err, -ENOENT, "no sandbox %s", id);
    if (t->rec.state != LB_STATE_LENT)
        return lb_error_set(err, -ENOENT, "sandbox %s is not running (state %s)", id,
                            store_state_name(t->rec.state));
    t->prov = lend_provider_of(l, &t->rec, err);
    if (!t->prov)
        return -EREMOTEIO;
    t->desc = t->rec.descriptor_json ? json_loads(t->rec.descriptor_json, 0, NULL) : NULL;
    t->ref = (struct lb_sandbox_ref){t->rec.id, t->desc};
    return 0;
}

/* ---------- the operate-token fence ---------- */

/* The fence of id, made when make is true (NULL without memory). fence_mutex held. */
static struct lend_fence *fence_get(struct lb_lend *l, const char *id, bool make)
{
    struct lend_fence *f;

    HASH_FIND_STR(l->fences, id, f);
    if (f || !make)
        return f;
    f = calloc(1, sizeof(*f));
    if (!f || !(f->id = strdup(id))) {
        free(f);
        return NULL;
    }
    HASH_ADD_KEYPTR(hh, l->fences, f->id, strlen(f->id), f);
    return f;
}

/* Forget f when nothing holds it. fence_mutex held. */
static void fence_put(struct lb_lend *l, struct lend_fence *f)
{
    if (f->exclusive > 0 || f->writers > 0)
        return;
    HASH_DEL(l->fences, f);
    free(f->id);
    free(f);
}

static int fence_refuse(const struct lend_fence *f, struct lb_error *err)
{
    return lb_error_set(err, -EBUSY,
                        "sandbox '%s' is fenced by the exclusive exec running in it since %s: "
                        "calls with its operate token answer 409 until that exec's result is in",
                        f->id, f->since);
}

int lend_fence_raise(struct lb_lend *l, const char *id, struct lb_error *err)
{
    struct lend_fence *f;
    int r = 0;

    pthread_mutex_lock(&l->fence_mutex);
    f = fence_get(l, id, true);
    if (!f) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    if (f->exclusive++ == 0) {
        struct timespec now;
        struct tm tm;

        clock_gettime(CLOCK_REALTIME, &now);
        gmtime_r(&now.tv_sec, &tm);
        strftime(f->since, sizeof(f->since), "%Y-%m-%dT%H:%M:%SZ", &tm);
    }
    while (f->writers > 0)
        pthread_cond_wait(&l->fence_cond, &l->fence_mutex);
out:
    pthread_mutex_unlock(&l->fence_mutex);
    return r;
}

void lend_fence_lower(struct lb_lend *l, const char *id)
{
    struct lend_fence *f;

    pthread_mutex_lock(&l->fence_mutex);
    f = fence_get(l, id, false);
    if (f) {
        f->exclusive--;
        fence_put(l, f);
    }
    pthread_mutex_unlock(&l->fence_mutex);
}

int lend_fence_check(struct lb_lend *l, const char *id, struct lb_error *err)
{
    struct lend_fence *f;
    int r = 0;

    pthread_mutex_lock(&l->fence_mutex);
    f = fence_get(l, id, false);
    if (f && f->exclusive > 0)
        r = fence_refuse(f, err);
    pthread_mutex_unlock(&l->fence_mutex);
    return r;
}

int lend_fence_enter(struct lb_lend *l, const char *id, struct lb_error *err)
{
    struct lend_fence *f;
    int r = 0;

    pthread_mutex_lock(&l->fence_mutex);
    f = fence_get(l, id, true);
    if (!f)
        r = lb_error_set(err, -ENOMEM, "out of memory");
    else if (f->exclusive > 0)
        r = fence_refuse(f, err);
    else
        f->writers++;
    pthread_mutex_unlock(&l->fence_mutex);
    return r;
}

void lend_fence_leave(struct lb_lend *l, const char *id)
{
    struct lend_fence *f;

    pthread_mutex_lock(&l->fence_mutex);
    f = fence_get(l, id, false);
    if (f && --f->writers == 0) {
        pthread_cond_broadcast(&l->fence_cond);
        fence_put(l, f);
    }
    pthread_mutex_unlock(&l->fence_mutex);
}

/* ---------- stops ---------- */

static int64_t lend_backoff_s(struct lb_lend *l, int attempts)
{
    int64_t d = l->cfg.retry_base_s;

    for (int i = 1; i < attempts && d < l->cfg.retry_max_s; i++)
        d *= 2;
    return d < l->cfg.retry_max_s ? d : l->cfg.retry_max_s;
}

/* see lend_internal.h */
int lend_stop_record(struct lb_lend *l, const struct lb_record *r, const char *reason,
                     enum lb_record_state fail_state, struct lb_error *err)
{
    struct lb_error perr = {0};
    json_t *desc = r->descriptor_json ? json_loads(r->descriptor_json, 0, NULL) : NULL;
    struct lb_sandbox_ref ref = {r->id, desc};
    struct lb_provider *prov;
    int rc;

    if (r->state == LB_STATE_STOP_FAILED || r->state == LB_STATE_FAILED_SEED)
        metrics_add(LB_M_STOP_RETRIES, 1);
    rc = store_mark_stopping(l->store, r->id, reason, err);
    if (rc < 0)
        goto out;
    metrics_add(LB_M_STOPS_IN_FLIGHT, 1);
    metrics_max(LB_M_STOPS_IN_FLIGHT_MAX, metrics_get(LB_M_STOPS_IN_FLIGHT));
    prov = lend_provider_of(l, r, &perr);
    rc = prov ? provider_stop(prov, &ref, l->cfg.stop_timeout_s * 1000, &perr) : -EREMOTEIO;
    metrics_sub(LB_M_STOPS_IN_FLIGHT, 1);
    if (rc < 0) {
        int attempts = r->stop_attempts + 1;

        metrics_add(LB_M_STOPS_FAILED, 1);
        log_warn_sbx(r->id, "stop of sandbox %s failed (attempt %d): %s", r->id, attempts,
                     perr.message);
        store_mark_stop_failed(l->store, r->id, fail_state, perr.message,
                               clock_now_s() + lend_backoff_s(l, attempts), NULL);
        rc = lb_error_set(err, -EREMOTEIO, "stopping sandbox %s failed: %s", r->id, perr.message);
        goto out;
    }
    metrics_add(LB_M_STOPS_OK, 1);
    rc = store_mark_stopped(l->store, r->id, NULL, err);
    if (l->stopped_hook)
        l->stopped_hook(l->stopped_ctx, r->id);
    log_info_sbx(r->id, "sandbox %s stopped (%s)", r->id, reason ? reason : r->stop_reason);
out:
    json_decref(desc);
    return rc;
}

/* Retry the stops a session left pending (failed seed, failed release). Returns 0 when none
 * is left, or the first failure. *n_stopped counts the ones that succeeded. */
static int lend_retry_pending(struct lb_lend *l, const char *rsid, int *n_stopped, char *stopped_id,
                              size_t stopped_id_len, struct lb_error *err)
{
    struct lb_record_filter f = {.rsid = rsid, .state = -1, .pending_stop_only = true};
    struct lb_record *recs = NULL;
    size_t n = 0;
    int r = store_list_sandboxes(l->store, &f, &recs, &n, err);

    for (size_t i = 0; r == 0 && i < n; i++) {
        enum lb_record_state fail =
            recs[i].state == LB_STATE_FAILED_SEED ? LB_STATE_FAILED_SEED : LB_STATE_STOP_FAILED;
        r = lend_stop_record(l, &recs[i], NULL, fail, err);
        if (r == 0) {
            (*n_stopped)++;
            if (stopped_id)
                snprintf(stopped_id, stopped_id_len, "%s", recs[i].id);
        }
    }
    store_records_free(recs, n);
    return r;
}

/* ---------- seed ---------- */

json_t *lend_spec_json(struct lb_lend *l, const struct lb_seed_request *req, const char *image,
                       int64_t disk_mib)
{
    json_t *spec = json_pack("{s:s,s:s,s:O?,s:O?,s:O?}", "image", image, "workdir",
                             req->workdir ? req->workdir : l->cfg.workdir, "env", req->env,
                             "network", req->network, "labels", req->labels);

    if (spec && req->n_ports > 0) {
        json_t *ports = json_array();

        for (size_t i = 0; i < req->n_ports; i++)
            json_array_append_new(ports, json_integer(req->ports[i]));
        json_object_set_new(spec, "ports", ports);
    }

    if (spec && req->ready_timeout_ms > 0)
        json_object_set_new(spec, "ready_timeout_ms", json_integer(req->ready_timeout_ms));
    if (spec && (req->resources.cpu > 0 || req->resources.memory_mib > 0 ||
                 req->resources.pids > 0 || disk_mib > 0)) {
        json_t *res = json_object();

        if (req->resources.cpu > 0)
            json_object_set_new(res, "cpu", json_real(req->resources.cpu));
        if (req->resources.memory_mib > 0)
            json_object_set_new(res, "memory_mib", json_integer(req->resources.memory_mib));
        if (req->resources.pids > 0)
            json_object_set_new(res, "pids", json_integer(req->resources.pids));
        if (disk_mib > 0)
            json_object_set_new(res, "disk_mib", json_integer(disk_mib));
        if (req->resources.gpu > 0)
            json_object_set_new(res, "gpu", json_integer(req->resources.gpu));
        json_object_set_new(spec, "resources", res);
    }
    /* an imported image's Env and WorkingDir, recorded with the sandbox so that a later
     * re-import of the name does not change a running sandbox's execs */
    if (spec && l->cfg.images_dir && strcmp(image, "host") != 0) {
        json_t *env = NULL;
        char *wd = NULL;

        struct lb_image_info info;

        /* which tree the name meant at seed time (image rm and re-imports look at names) */
        if (image_get(l->cfg.images_dir, image, &info, NULL) == 0)
            json_object_set_new(spec, "image_digest", json_string(info.digest));
        if (image_read_config(l->cfg.images_dir, image, &env, &wd, NULL) == 0) {
            if (env)
                json_object_set_new(spec, "image_env", env);
            /* a workdir the request names is the default cwd (NeMo Gym's SandboxSpec) */
            if (wd && !req->workdir)
                json_object_set_new(spec, "image_working_dir", json_string(wd));
            free(wd);
        }
    }
    return spec;
}

/* An imported image's User and digest into spec (image_user, image_digest): an image whose
 * User is not mapped in a sandbox is refused (422) before anything is made, and the digest
 * keeps the stored tree from garbage collection while the sandbox lives. A tree placed by
 * hand (no config) passes. */
int lend_image_check(struct lb_lend *l, const char *image, json_t *spec, struct lb_error *err)
{
    struct lb_image_info info;
    char *user = NULL;
    int r;

    if (!l->cfg.images_dir || strcmp(image, "host") == 0)
        return 0;
    r = image_resolve_user(l->cfg.images_dir, image, &user, err);
    if (r == -ENOENT) {
        lb_error_clear(err);
        return 0;
    }
    if (r < 0)
        return r;
    if (user)
        json_object_set_new(spec, "image_user", json_string(user));
    free(user);
    if (image_get(l->cfg.images_dir, image, &info, NULL) == 0)
        json_object_set_new(spec, "image_digest", json_string(info.digest));
    return 0;
}

/* The seed's network object as the provider's request; strings are borrowed from req, the
 * tool_servers array is new (free it). The provider decides what it can enforce. */
static int lend_network_request(const struct lb_seed_request *req, struct lb_network_request *out,
                                const char ***tools_out)
{
    json_t *tools = req->network ? json_object_get(req->network, "tool_servers") : NULL;
    const char **v = NULL;
    size_t i, n = json_is_array(tools) ? json_array_size(tools) : 0;

    memset(out, 0, sizeof(*out));
    *tools_out = NULL;
    if (!req->network)
        return 0;
    out->access = json_string_value(json_object_get(req->network, "access"));
    out->model_server = json_string_value(json_object_get(req->network, "model_server"));
    if (n > 0) {
        v = calloc(n + 1, sizeof(*v));
        if (!v)
            return -ENOMEM;
        for (i = 0; i < n; i++)
            v[i] = json_string_value(json_array_get(tools, i));
        out->tool_servers = v;
    }
    *tools_out = v;
    return 0;
}

/* resources.disk_mib: at most max_disk_mib (400), default_disk_mib when unset, so every
 * sandbox's storage is bounded. The defaults (disk, pids) apply where the provider can
 * enforce them; what a seed asks for itself is checked by provider_check_spec. */
int lend_check_resources(struct lb_lend *l, struct lb_provider *prov, struct lb_resources *res,
                         struct lb_error *err)
{
    struct lb_provider_caps caps;

    if (l->cfg.max_disk_mib > 0 && res->disk_mib > l->cfg.max_disk_mib)
        return lb_error_set(err, -EINVAL,
                            "'resources.disk_mib' %lld is over this daemon's limit of %lld "
                            "(limits.max_disk_mib)",
                            (long long)res->disk_mib, (long long)l->cfg.max_disk_mib);
    provider_caps(prov, &caps);
    if (res->disk_mib == 0 && caps.disk_limit)
        res->disk_mib = l->cfg.default_disk_mib;
    if (res->pids == 0 && caps.pids_limit)
        res->pids = l->cfg.default_pids; /* a fork bomb must not take the host's pids */
    return 0;
}

/* The part of a seed that starts a new sandbox; the session lock is held. */
static int lend_seed_new(struct lb_lend *l, const char *rsid, const struct lb_seed_request *req,
                         json_t **lease_out, struct lb_error *err)
{
    struct lb_record rec = {0}, got = {0};
    struct lb_error perr = {0};
    char default_image[LB_IMAGE_NAME_MAX + 1];
    const char *image = NULL;
    struct lb_sandbox_spec spec = {.workdir = req->workdir ? req->workdir : l->cfg.workdir,
                                   .resources = req->resources,
                                   .ready_timeout_ms = req->ready_timeout_ms};
    struct lb_provider_caps caps;
    const char **tools = NULL;
    struct lb_sandbox_ref ref = {rec.id, NULL};
    json_t *spec_json = NULL, *desc = NULL;
    char *spec_text = NULL, *desc_text = NULL;
    char token[4 + 65], token_hash[LB_SHA256_HEX + 1];
    int64_t ttl = req->ttl_s >= 0 ? req->ttl_s : l->cfg.default_ttl_s;
    struct lb_provider *prov = NULL;
    int r;

    if (lend_network_request(req, &spec.network, &tools) < 0) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    spec.ports = req->ports;
    spec.n_ports = req->n_ports;
    /* the provider is the seed's choice among the enabled ones; what it cannot enforce is
     * refused (422) before anything is recorded */
    r = registry_choose(l->providers, req->provider, &prov, err);
    if (r < 0)
        goto out;
    provider_caps(prov, &caps);
    image =
        req->image
            ? req->image
            : lend_default_image(l, caps.default_image ? caps.default_image : l->cfg.default_image,
                                 default_image, sizeof(default_image));
    spec.image = image;
    r = lend_check_resources(l, prov, &spec.resources, err);
    if (r == 0)
        r = provider_check_spec(prov, &spec, err);
    if (r < 0)
        goto out;
    if (l->cfg.max_ttl_s > 0 && ttl > l->cfg.max_ttl_s)
        ttl = l->cfg.max_ttl_s;
    /* a warm pool of this seed's class serves it (-ENOENT: a miss, start one as always) */
    if (l->pool.take) {
        r = l->pool.take(l->pool.ctx, rsid, req, prov, image, ttl, lease_out, err);
        if (r != -ENOENT)
            goto out;
    }
    r = token_new_sandbox_id(rec.id);
    if (r < 0)
        goto out;
    spec_json = lend_spec_json(l, req, image, spec.resources.disk_mib);
    /* the image store is the local provider's */
    r = spec_json && strcmp(prov->ops->name, "local") == 0
            ? lend_image_check(l, image, spec_json, err)
            : 0;
    if (r < 0)
        goto out;
    spec_text = spec_json ? json_dumps(spec_json, JSON_COMPACT) : NULL;
    if (!spec_text) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    rec.rsid = (char *)rsid;
    rec.task_id = (char *)req->task_id;
    rec.provider = (char *)prov->ops->name;
    rec.state = LB_STATE_STARTING;
    rec.spec_json = spec_text;
    rec.created_at = clock_now_s();
    rec.expires_at = ttl > 0 ? rec.created_at + ttl : 0;
    /* Intent before action: the record exists before the provider makes anything. The
     * capacity check and the insert are one statement, so concurrent seeds never pass
     * max_sandboxes; warm sandboxes hold capacity for seeds, not against them: one gives its
     * place, and the insert is tried once more. */
    r = store_insert_sandbox(l->store, &rec, l->cfg.max_sandboxes, err);
    if (r == -EUSERS && l->pool.evict && l->pool.evict(l->pool.ctx) == 0) {
        lb_error_clear(err);
        r = store_insert_sandbox(l->store, &rec, l->cfg.max_sandboxes, err);
    }
    if (r < 0)
        goto out;
    r = provider_create(prov, &ref, &spec, &desc, &perr);
    if (r < 0) {
        /* bad input, an unenforceable request or no free sandbox uid keep their status */
        r = lb_error_set(err,
                         r == -EINVAL || r == -EOPNOTSUPP || r == -EUSERS ||
                                 r == -LB_E_IMAGE_NOT_FOUND
                             ? r
                             : -EREMOTEIO,
                         "sandbox could not start: %s", perr.message);
        goto rollback;
    }
    /* The descriptor is written once: with the lease (mark_lent) when nothing else comes in
     * between, or first thing when seed files are written (so a failure or crash while they are
     * written can still find the sandbox; mark_lent then leaves it as it is). */
    desc_text = json_dumps(desc, JSON_COMPACT);
    if (!desc_text ||
        (req->n_files > 0 && store_set_descriptor(l->store, rec.id, desc_text, err) < 0)) {
        r = lb_error_keep(err, -EIO, "cannot record the sandbox descriptor");
        goto rollback;
    }
    ref.descriptor = desc;
    for (size_t i = 0; i < req->n_files; i++) {
        const struct lb_seed_file *f = &req->files[i];

        lb_error_clear(&perr);
        r = provider_file_write(prov, &ref, f->path, f->data, f->len, f->mode, &perr);
        if (r < 0) {
            r = lb_error_set(err, r, "seed file '%s' could not be written: %s", f->path,
                             perr.message);
            goto rollback;
        }
    }
    r = lend_operate_token(l, rec.id, token);
    if (r < 0) {
        r = lb_error_set(err, r, "cannot mint the operate token");
        goto rollback;
    }
    token_sha256_hex(token, strlen(token), token_hash);
    r = store_mark_lent(l->store, rec.id, req->n_files > 0 ? NULL : desc_text, token_hash, err);
    if (r < 0)
        goto rollback;
    r = store_get_sandbox(l->store, rec.id, &got, err);
    if (r < 0)
        goto out;
    *lease_out = lend_render_lease(l, &got, false);
    metrics_add(LB_M_SEEDS_OK, 1);
    if (rsid)
        log_info_sbx(rec.id, "session %s: lent sandbox %s (task %s)", rsid, rec.id, req->task_id);
    else
        log_info_sbx(rec.id, "started sandbox %s (lent to no session)", rec.id);
    goto out;

rollback:
    /* Nothing is lent: stop what may have started; a failed stop leaves a failed seed. */
    metrics_add(LB_M_SEEDS_FAILED, 1);
    if (store_get_sandbox(l->store, rec.id, &got, NULL) == 0) {
        struct lb_error serr = {0};

        /* not recorded yet (it comes with the lease): stop with the one create returned */
        if (!got.descriptor_json && desc_text)
            got.descriptor_json = strdup(desc_text);

        if (lend_stop_record(l, &got, "seed_failed", LB_STATE_FAILED_SEED, &serr) < 0)
            log_error_sbx(rec.id, "session %s: failed seed's sandbox %s could not be stopped: %s",
                          rsid ? rsid : "(none)", rec.id, serr.message);
    }
out:
    store_record_release(&got);
    json_decref(spec_json);
    json_decref(desc);
    free(spec_text);
    free(desc_text);
    free(tools);
    return r;
}

int lend_seed(struct lb_lend *l, const char *rsid, const struct lb_seed_request *req,
              json_t **lease_out, struct lb_error *err)
{
    struct lend_session_lock *lock;
    struct lb_record live = {0};
    int r, n_stopped = 0;

    if (lend_is_draining(l))
        return lb_error_set(err, -ESHUTDOWN, "the daemon is draining; no new seeds");
    r = lend_session_lock(l, rsid, false, &lock, err);
    if (r < 0)
        return r;
    r = store_get_live_by_rsid(l->store, rsid, &live, NULL);
    if (r == 0) {
        if (live.task_id && strcmp(live.task_id, req->task_id) == 0 &&
            live.state == LB_STATE_LENT) {
            *lease_out = lend_render_lease(l, &live, true);
            metrics_add(LB_M_SEEDS_REUSED, 1);
        } else {
            r = lb_error_set(err, -EEXIST,
                             "session %s already has sandbox %s for task '%s', not '%s'", rsid,
                             live.id, live.task_id ? live.task_id : "", req->task_id);
        }
        goto out;
    }
    /* A failed seed (or failed release) of this session must be stopped before a new start. */
    r = lend_retry_pending(l, rsid, &n_stopped, NULL, 0, err);
    if (r < 0) {
        metrics_add(LB_M_SEEDS_FAILED, 1);
        goto out;
    }
    if (lend_is_draining(l)) {
        r = lb_error_set(err, -ESHUTDOWN, "the daemon is draining; no new seeds");
        goto out;
    }
    r = lend_seed_new(l, rsid, req, lease_out, err);
out:
    store_record_release(&live);
    lend_session_unlock(l, lock);
    return r;
}

int lend_create_sandbox(struct lb_lend *l, const struct lb_seed_request *req, json_t **lease_out,
                        struct lb_error *err)
{
    if (lend_is_draining(l))
        return lb_error_set(err, -ESHUTDOWN, "the daemon is draining; no new sandboxes");
    /* no session: no session lock, no pending stops to retry, no reuse */
    return lend_seed_new(l, NULL, req, lease_out, err);
}

/* ---------- lookups ---------- */

int lend_get_lease(struct lb_lend *l, const char *rsid, json_t **lease_out, struct lb_error *err)
{
    struct lb_record rec = {0};
    int r = store_get_live_by_rsid(l->store, rsid, &rec, NULL);

    /* a seed still starting has nothing to lend yet */
    if (r < 0 || rec.state != LB_STATE_LENT) {
        store_record_release(&rec);
        return lb_error_set(err, -ENOENT, "session %s has no lent sandbox", rsid);
    }
    *lease_out = lend_render_lease(l, &rec, false);
    store_record_release(&rec);
    return *lease_out ? 0 : lb_error_set(err, -ENOMEM, "out of memory");
}

static int lend_parse_state(const char *state, int *out, struct lb_error *err)
{
    enum lb_record_state s;

    *out = -1;
    if (!state)
        return 0;
    if (store_state_parse(state, &s) < 0)
        return lb_error_set(err, -EINVAL,
                            "unknown state '%s' (starting, lent, stopping, stopped, failed_seed, "
                            "stop_failed, warm)",
                            state);
    *out = (int)s;
    return 0;
}

/* Records in state (a name, or NULL for default_state: -1 for all) as a JSON array made by
 * render, under key. */
static int lend_list(struct lb_lend *l, const char *state, int default_state, const char *key,
                     json_t *(*render)(struct lb_lend *, const struct lb_record *), json_t **out,
                     struct lb_error *err)
{
    struct lb_record_filter f = {.state = -1};
    struct lb_record *recs = NULL;
    size_t n = 0;
    json_t *arr;
    int r = lend_parse_state(state, &f.state, err);

    if (r < 0)
        return r;
    if (!state)
        f.state = default_state;
    r = store_list_sandboxes(l->store, &f, &recs, &n, err);
    if (r < 0)
        return r;
    arr = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *item = render(l, &recs[i]);

        if (item)
            json_array_append_new(arr, item);
    }
    store_records_free(recs, n);
    *out = json_pack("{s:o}", key, arr);
    return *out ? 0 : lb_error_set(err, -ENOMEM, "out of memory");
}

static json_t *lend_render_listed_lease(struct lb_lend *l, const struct lb_record *r)
{
    return r->rsid ? lend_render_lease(l, r, false) : NULL;
}

static json_t *lend_render_listed_sandbox(struct lb_lend *l, const struct lb_record *r)
{
    (void)l;
    return lend_render_sandbox(r, NULL, true);
}

int lend_list_leases(struct lb_lend *l, const char *state, json_t **out, struct lb_error *err)
{
    /* without a filter: the sessions that have a lease */
    return lend_list(l, state, LB_STATE_LENT, "sessions", lend_render_listed_lease, out, err);
}

int lend_list_sandboxes(struct lb_lend *l, const char *state, json_t **out, struct lb_error *err)
{
    return lend_list(l, state, -1, "sandboxes", lend_render_listed_sandbox, out, err);
}

int lend_sandbox_status(struct lb_lend *l, const char *id, json_t **out, struct lb_error *err)
{
    struct lb_record rec = {0};
    const char *status = NULL;
    int r = store_get_sandbox(l->store, id, &rec, NULL);

    if (r < 0)
        return lb_error_set(err, -ENOENT, "no sandbox %s", id);
    if (rec.state == LB_STATE_LENT) {
        json_t *desc = rec.descriptor_json ? json_loads(rec.descriptor_json, 0, NULL) : NULL;
        struct lb_sandbox_ref ref = {rec.id, desc};
        struct lb_provider *prov = lend_provider_of(l, &rec, NULL);
        enum lb_sandbox_status st;

        status = prov && provider_status(prov, &ref, &st, NULL) == 0 ? provider_status_name(st)
                                                                     : "unknown";
        json_decref(desc);
    }
    *out = lend_render_sandbox(&rec, status, false);
    store_record_release(&rec);
    return 0;
}

/* ---------- release / delete ---------- */

int lend_release(struct lb_lend *l, const char *rsid, json_t **out, struct lb_error *err)
{
    struct lend_session_lock *lock = NULL;
    struct lb_record live = {0};
    char stopped_id[LB_ID_MAX] = "";
    int r = lend_session_lock(l, rsid, false, &lock, err), n_stopped = 0;

    if (r < 0)
        return r;
    if (store_get_live_by_rsid(l->store, rsid, &live, NULL) == 0) {
        lend_before_stop(l, &live);
        r = lend_stop_record(l, &live, "released", LB_STATE_STOP_FAILED, err);
        if (r < 0) {
            metrics_add(LB_M_RELEASES_FAILED, 1);
            goto out;
        }
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
    store_record_release(&live);
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

int lend_sandbox_rsid(struct lb_lend *l, const char *id, char *rsid, size_t len)
{
    struct lb_record rec = {0};
    int r = store_get_sandbox(l->store, id, &rec, NULL);

    if (r == 0 && !rec.rsid)
        r = -ENOENT;
    if (r == 0 && (size_t)snprintf(rsid, len, "%s", rec.rsid) >= len)
        r = -ENAMETOOLONG;
    store_record_release(&rec);
    return r < 0 ? r : 0;
}

int lend_delete_sandbox(struct lb_lend *l, const char *id, json_t **out, struct lb_error *err)
{
    struct lb_record rec = {0};
    struct lend_session_lock *lock = NULL;
    int r = store_get_sandbox(l->store, id, &rec, NULL);

    if (r < 0)
        return lb_error_set(err, -ENOENT, "no sandbox %s", id);
    if (rec.rsid) {
        r = lend_session_lock(l, rec.rsid, false, &lock, err);
        if (r < 0)
            goto out;
        store_record_release(&rec);
        r = store_get_sandbox(l->store, id, &rec, err); /* re-read under the lock */
        if (r < 0)
            goto out;
    }
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

/* ---------- per-sandbox operations ---------- */

/* Build "K=V" environment: defaults < the image's Env < the seed's env < the request's env. */
static char **lend_exec_env(const struct lb_record *rec, const char *workdir, json_t *req_env)
{
    /* no HOME: the supervisor sets the user's, from the sandbox's /etc/passwd */
    json_t *env = json_pack("{s:s,s:s,s:s}", "PATH",
                            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG",
                            "C.UTF-8", "LENDBOX_WORKDIR", workdir);
    json_t *spec = rec->spec_json ? json_loads(rec->spec_json, 0, NULL) : NULL;
    json_t *seed_env = json_object_get(spec, "env");
    const char *k;
    json_t *v;
    char **out = NULL;
    size_t i = 0;

    json_t *image_env = json_object_get(spec, "image_env");

    if (!env)
        goto out;
    json_array_foreach(image_env, i, v) {
        const char *kv = json_string_value(v), *eq = kv ? strchr(kv, '=') : NULL;

        if (eq && eq != kv)
            json_object_setn_new(env, kv, (size_t)(eq - kv), json_string(eq + 1));
    }
    i = 0;
    if (json_is_object(seed_env))
        json_object_update(env, seed_env);
    if (json_is_object(req_env))
        json_object_update(env, req_env);
    out = calloc(json_object_size(env) + 1, sizeof(char *));
    if (!out)
        goto out;
    json_object_foreach(env, k, v) {
        const char *s = json_string_value(v);

        if (!s || asprintf(&out[i], "%s=%s", k, s) < 0) {
            out[i] = NULL;
            continue;
        }
        i++;
    }
out:
    json_decref(spec);
    json_decref(env);
    return out;
}

int lend_exec_user(struct lb_lend *l, const char *id, const char *user, char **out,
                   struct lb_error *err)
{
    struct lend_target t;
    json_t *spec = NULL;
    const char *image_user;
    int r = lend_target_load(l, id, &t, err);

    *out = NULL;
    if (r == 0 && !user) {
        (void)spec_string(&t.rec, "workdir", l->cfg.workdir, &spec);
        image_user = json_string_value(json_object_get(spec, "image_user"));
        user = image_user;
    }
    if (r == 0 && user && !(*out = strdup(user)))
        r = lb_error_set(err, -ENOMEM, "out of memory");
    json_decref(spec);
    lend_target_release(&t);
    return r;
}

int lend_exec(struct lb_lend *l, const char *id, const struct lb_exec_params *p,
              struct lb_exec_result *res, struct lb_error *err)
{
    struct lend_target t;
    json_t *spec = NULL;
    char **env = NULL;
    const char *workdir, *image_wd;
    int r = lend_target_load(l, id, &t, err);

    if (r < 0)
        goto out;
    workdir = spec_string(&t.rec, "workdir", l->cfg.workdir, &spec);
    image_wd = json_string_value(json_object_get(spec, "image_working_dir"));
    env = lend_exec_env(&t.rec, workdir, p->env);
    if (!env) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    struct lb_exec_request req = {
        .argv = (const char *const *)p->argv,
        /* an exclusive exec (a grader) starts in /: in the workdir, or the image's working
         * dir, the agent's files would come first where interpreters look for modules */
        .cwd = p->cwd         ? p->cwd
               : p->exclusive ? "/"
               : image_wd     ? image_wd
                              : workdir,
        .env = (const char *const *)env,
        /* the image's User (resolved at seed; only a mapped one gets that far) unless the
         * exec names its own */
        .user = p->user ? p->user : json_string_value(json_object_get(spec, "image_user")),
        .stdin_data = p->stdin_data,
        .stdin_len = p->stdin_len,
        .timeout_ms = p->timeout_ms,
        .max_output_bytes = l->cfg.max_output_bytes,
        .preserve_background = p->preserve_background,
        .exclusive = p->exclusive,
        .agent_root = p->agent_root,
        .pass_fd = p->pass_fd,
        .on_output = p->on_output,
        .output_ctx = p->output_ctx,
    };
    /* a sweep_only exec is the daemon's own: it runs where exclusive cannot be held too */
    struct lb_exec_request checked = req;

    checked.exclusive = p->exclusive && !p->sweep_only;
    if ((r = provider_check_exec(t.prov, &checked, err)) < 0)
        goto out;
    /* the fence is up before the provider's sweep starts and down once the result is in */
    if (p->exclusive && (r = lend_fence_raise(l, id, err)) < 0)
        goto out;
    metrics_add(LB_M_EXECS, 1);
    r = provider_exec(t.prov, &t.ref, &req, res, err);
    if (p->exclusive)
        lend_fence_lower(l, id);
    if (r == 0 && res->error_type == LB_EXEC_TIMEOUT)
        metrics_add(LB_M_EXEC_TIMEOUTS, 1);
out:
    if (env)
        for (size_t i = 0; env[i]; i++)
            free(env[i]);
    free(env);
    json_decref(spec);
    lend_target_release(&t);
    return r;
}

int lend_sandbox_caps(struct lb_lend *l, const char *id, struct lb_provider_caps *caps,
                      struct lb_error *err)
{
    struct lend_target t;
    int r = lend_target_load(l, id, &t, err);

    if (r == 0)
        provider_caps(t.prov, caps);
    lend_target_release(&t);
    return r;
}

int lend_file_write(struct lb_lend *l, const char *id, const char *path, const void *data,
                    size_t len, int mode, struct lb_error *err)
{
    struct lend_target t;
    int r = lend_target_load(l, id, &t, err);

    if (r == 0)
        r = provider_file_write(t.prov, &t.ref, path, data, len, mode, err);
    lend_target_release(&t);
    return r;
}

int lend_upload_begin(struct lb_lend *l, const char *id, const char *path, int mode,
                      const char *owner, struct lb_upload **out, struct lb_error *err)
{
    struct lend_target t;
    int r = lend_target_load(l, id, &t, err);

    *out = NULL;
    if (r == 0)
        r = provider_upload_begin(t.prov, &t.ref, path, mode, owner, out, err);
    lend_target_release(&t);
    return r;
}

int lend_upload_commit(struct lb_lend *l, struct lb_upload *u, struct lb_error *err)
{
    (void)l;
    return provider_upload_commit(u, err);
}

void lend_upload_abort(struct lb_lend *l, struct lb_upload *u)
{
    (void)l;
    provider_upload_abort(u);
}

int lend_upload_error(struct lb_lend *l, struct lb_upload *u, int errnum, uint64_t bytes,
                      struct lb_error *err)
{
    (void)l;
    return provider_upload_error(u, errnum, bytes, err);
}

int lend_upload_reserve(struct lb_lend *l, struct lb_upload *u, uint64_t need, uint64_t want,
                        struct lb_error *err)
{
    (void)l;
    return provider_upload_reserve(u, need, want, err);
}

int lend_file_open(struct lb_lend *l, const char *id, const char *path, int *fd_out,
                   uint64_t *size_out, struct lb_error *err)
{
    struct lend_target t;
    int r = lend_target_load(l, id, &t, err);

    if (r == 0)
        r = provider_file_open(t.prov, &t.ref, path, fd_out, size_out, err);
    lend_target_release(&t);
    return r;
}

int lend_set_paused(struct lb_lend *l, const char *id, bool pause, json_t **out,
                    struct lb_error *err)
{
    struct lend_target t;
    int r = lend_target_load(l, id, &t, err);

    if (r == 0)
        r = pause ? provider_pause(t.prov, &t.ref, err) : provider_resume(t.prov, &t.ref, err);
    if (r == 0)
        r = lend_sandbox_status(l, id, out, err);
    lend_target_release(&t);
    return r;
}

int lend_endpoint(struct lb_lend *l, const char *id, int port, json_t **out, struct lb_error *err)
{
    struct lend_target t;
    json_t *spec = NULL, *v;
    char *url = NULL;
    bool declared = false;
    size_t i;
    int r = lend_target_load(l, id, &t, err);

    if (r < 0)
        goto out;
    spec = t.rec.spec_json ? json_loads(t.rec.spec_json, 0, NULL) : NULL;
    json_array_foreach(json_object_get(spec, "ports"), i, v) {
        if (json_integer_value(v) == port)
            declared = true;
    }
    if (!declared) {
        r = lb_error_set(err, -ENOENT, "port %d was not declared in the seed's 'ports'", port);
        goto out;
    }
    r = provider_endpoint(t.prov, &t.ref, port, &url, err);
    if (r < 0)
        goto out;
    *out = json_pack("{s:s,s:{}}", "endpoint", url, "headers");
    if (!*out)
        r = lb_error_set(err, -ENOMEM, "out of memory");
out:
    free(url);
    json_decref(spec);
    lend_target_release(&t);
    return r;
}

int lend_sandbox_oom_kills(struct lb_lend *l, const char *id, uint64_t *count, int64_t *limit_bytes,
                           struct lb_error *err)
{
    struct lend_target t;
    int r = lend_target_load(l, id, &t, err);

    if (r == 0)
        r = provider_oom_kills(t.prov, &t.ref, count, limit_bytes, err);
    lend_target_release(&t);
    return r;
}

/* ---------- for the sweeper (lend_internal.h) ---------- */

struct lb_store *lend_store(struct lb_lend *l)
{
    return l->store;
}

struct lb_registry *lend_providers(struct lb_lend *l)
{
    return l->providers;
}

const struct lb_lend_config *lend_config(struct lb_lend *l)
{
    return &l->cfg;
}

/* ---------- store checks and metrics ---------- */

int lend_check_store(struct lb_lend *l, struct lb_error *err)
{
    return store_check_writable(l->store, err);
}

int lend_render_metrics(struct lb_lend *l, struct lb_buf *out)
{
    int64_t counts[LB_STATE_COUNT] = {0};
    char line[160];
    int r = store_count_by_state(l->store, counts, NULL);

    if (r < 0)
        return r;
    r = lb_buf_append(out,
                      "# HELP lendbox_sandboxes Sandbox records by state.\n"
                      "# TYPE lendbox_sandboxes gauge\n",
                      strlen("# HELP lendbox_sandboxes Sandbox records by state.\n"
                             "# TYPE lendbox_sandboxes gauge\n"));
    for (int s = 0; r == 0 && s < LB_STATE_COUNT; s++) {
        int n = snprintf(line, sizeof(line), "lendbox_sandboxes{state=\"%s\"} %lld\n",
                         store_state_name((enum lb_record_state)s), (long long)counts[s]);
        r = lb_buf_append(out, line, (size_t)n);
    }
    return r;
}
