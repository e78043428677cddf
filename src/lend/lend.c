/*
 * lend.c - the lending service's setup, session locks and lookups (see lend.h). The seed is in
 * seed.c, stops, release and delete in stop.c, per-sandbox operations in ops.c, JSON renderings
 * in render.c, activity in activity.c, renewals and idle stops in idle.c; they share
 * lend_private.h. seed.c, stop.c, ops.c and idle.c call lend.c, which calls none of them
 * (render.c and activity.c only).
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "image/image.h"
#include "provider/registry.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/metrics.h"

/* ---------- session locks ---------- */

/* Drop one reference to s; the last one frees it. Call with l->locks_mutex held. */
static void session_lock_put_locked(struct lb_lend *l, struct lend_session_lock *s)
{
    if (--s->refs == 0) {
        HASH_DEL(l->locks, s);
        pthread_cond_destroy(&s->cond);
        free(s->rsid);
        free(s);
    }
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

    *out = NULL;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += (time_t)wait_s;
    pthread_mutex_lock(&l->locks_mutex);
    HASH_FIND_STR(l->locks, rsid, s);
    if (!s) {
        s = calloc(1, sizeof(*s));
        if (!s || !(s->rsid = strdup(rsid))) {
            free(s);
            pthread_mutex_unlock(&l->locks_mutex);
            return lb_error_set(err, -ENOMEM, "out of memory");
        }
        /* The bound is on the monotonic clock: a wall-clock step neither ends nor stretches it. */
        clock_cond_init_mono(&s->cond);
        HASH_ADD_KEYPTR(hh, l->locks, s->rsid, strlen(s->rsid), s);
    }
    s->refs++;
    while (s->held && !try_only) {
        if (pthread_cond_timedwait(&s->cond, &l->locks_mutex, &until) == ETIMEDOUT)
            break;
    }
    if (s->held) {
        session_lock_put_locked(l, s);
        pthread_mutex_unlock(&l->locks_mutex);
        if (try_only)
            return lb_error_set(err, -EBUSY, "session %s is busy", rsid);
        metrics_add(LB_M_SESSION_LOCK_TIMEOUTS, 1);
        log_warn("session %s: its lock stayed busy for %lld s; the request gives up", rsid,
                 (long long)wait_s);
        return lb_error_set(err, -EBUSY,
                            "session %s is busy: another seed, release or delete of it has "
                            "held it for %lld s; retry later",
                            rsid, (long long)wait_s);
    }
    s->held = true;
    pthread_mutex_unlock(&l->locks_mutex);
    *out = s;
    return 0;
}

void lend_session_unlock(struct lb_lend *l, struct lend_session_lock *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&l->locks_mutex);
    s->held = false;
    pthread_cond_signal(&s->cond);
    session_lock_put_locked(l, s);
    pthread_mutex_unlock(&l->locks_mutex);
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
const char *lend_default_image(const struct lb_lend *l, const char *list, char *buf, size_t size)
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
    if (lend_admission_new(cfg->max_starting, cfg->max_seed_queue, &l->admission, err) < 0) {
        lend_free(l);
        return -ENOMEM;
    }
    l->store = st;
    l->providers = providers;
    pthread_mutex_init(&l->locks_mutex, NULL);
    pthread_mutex_init(&l->fence_mutex, NULL);
    pthread_cond_init(&l->fence_cond, NULL);
    pthread_mutex_init(&l->warm_mutex, NULL);
    pthread_cond_init(&l->warm_cond, NULL);
    pthread_mutex_init(&l->fork_mutex, NULL);
    pthread_mutex_init(&l->capture_mutex, NULL);
    pthread_mutex_init(&l->act_mutex, NULL);
    pthread_mutex_init(&l->idle_op_mutex, NULL);
    l->started_s = clock_now_s();
    *out = l;
    return 0;
}

void lend_free(struct lb_lend *l)
{
    if (!l)
        return;
    char **const strings[] = {&l->default_image, &l->images_dir, &l->workdir, &l->public_url};

    mem_free_strings(strings, sizeof(strings) / sizeof(strings[0]));
    free(l->operate_key);
    lend_admission_free(l->admission);
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
        pthread_mutex_destroy(&l->warm_mutex);
        pthread_cond_destroy(&l->warm_cond);
        while (l->fork_pins) {
            struct lend_fork_pin *p = l->fork_pins;

            l->fork_pins = p->next;
            free(p);
        }
        pthread_mutex_destroy(&l->fork_mutex);
        pthread_mutex_destroy(&l->capture_mutex);
        lend_activity_free_all(l);
        pthread_mutex_destroy(&l->act_mutex);
        pthread_mutex_destroy(&l->idle_op_mutex);
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
void lend_before_stop(struct lb_lend *l, const struct lb_record *r)
{
    if (l->release_hook && r->rsid && r->state == LB_STATE_LENT)
        l->release_hook(l->release_ctx, r->rsid, r->id);
}

void lend_set_warm(struct lb_lend *l, struct lb_provider *prov)
{
    atomic_store(&l->warm_prov, prov);
    lend_warm_changed(l);
}

void lend_set_refill_slots(struct lb_lend *l, int64_t n)
{
    lend_admission_set_refills(l->admission, n);
}

void lend_set_pool_slots(struct lb_lend *l, const struct lend_pool_slots *slots)
{
    pthread_mutex_lock(&l->warm_mutex);
    if (slots)
        l->pool_slots = *slots;
    else
        memset(&l->pool_slots, 0, sizeof(l->pool_slots));
    pthread_mutex_unlock(&l->warm_mutex);
}

uint64_t lend_warm_generation(struct lb_lend *l)
{
    return atomic_load(&l->warm_gen);
}

void lend_warm_changed(struct lb_lend *l)
{
    pthread_mutex_lock(&l->warm_mutex);
    l->warm_gen++;
    pthread_cond_broadcast(&l->warm_cond);
    pthread_mutex_unlock(&l->warm_mutex);
}

void lend_warm_wait(struct lb_lend *l, uint64_t seen, int64_t timeout_ms)
{
    struct timespec until = clock_realtime_after_ms(timeout_ms);

    pthread_mutex_lock(&l->warm_mutex);
    while (l->warm_gen == seen &&
           pthread_cond_timedwait(&l->warm_cond, &l->warm_mutex, &until) == 0)
        ;
    pthread_mutex_unlock(&l->warm_mutex);
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

/* ---------- lookups ---------- */

/* see lend_internal.h */
int lend_record_get(struct lb_lend *l, const char *id, struct lb_record *rec, struct lb_error *err)
{
    if (store_get_sandbox(l->store, id, rec, NULL) < 0)
        return lb_error_set(err, -ENOENT, "no sandbox %s", id);
    return 0;
}

int lend_record_get_locked(struct lb_lend *l, const char *id, struct lb_record *rec,
                           struct lend_session_lock **lock, struct lb_error *err)
{
    int r = lend_record_get(l, id, rec, err);

    *lock = NULL;
    if (r < 0 || !rec->rsid)
        return r;
    r = lend_session_lock(l, rec->rsid, false, lock, err);
    if (r < 0)
        return r;
    store_record_release(rec);
    return store_get_sandbox(l->store, id, rec, err);
}

int lend_sync_leases(struct lb_lend *l, struct lb_error *err)
{
    return store_sync(l->store, err);
}

int lend_get_lease(struct lb_lend *l, const char *rsid, json_t **lease_out, struct lb_error *err)
{
    struct lb_record rec = {0};
    int r = store_get_live_by_rsid(l->store, rsid, &rec, NULL);

    /* a seed still starting has nothing to lend yet */
    if (r < 0 || rec.state != LB_STATE_LENT) {
        store_record_release(&rec);
        return lb_error_set(err, -ENOENT, "session %s has no lent sandbox", rsid);
    }
    /* a lease a running fork or batch lent is durable before it is handed out */
    r = lend_sync_leases(l, err);
    if (r < 0) {
        store_record_release(&rec);
        return r;
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
    /* leases a running fork or batch lent are durable before they are handed out */
    int r = lend_sync_leases(l, err);

    if (r < 0)
        return r;
    /* without a filter: the sessions that have a lease */
    return lend_list(l, state, LB_STATE_LENT, "sessions", lend_render_listed_lease, out, err);
}

int lend_list_sandboxes(struct lb_lend *l, const char *state, json_t **out, struct lb_error *err)
{
    return lend_list(l, state, -1, "sandboxes", lend_render_listed_sandbox, out, err);
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

/* A Prometheus label value: '\\', '"' and newlines escaped, into buf. */
static void label_escape(const char *v, char *buf, size_t size)
{
    size_t o = 0;

    for (; *v && o + 3 < size; v++) {
        if (*v == '\\' || *v == '"' || *v == '\n') {
            buf[o++] = '\\';
            buf[o++] = *v == '\n' ? 'n' : *v;
        } else {
            buf[o++] = *v;
        }
    }
    buf[o] = '\0';
}

/* Live sandboxes per cluster member of the providers that have members (the descriptor's
 * location): lendbox_provider_member_sandboxes{provider,member}, only when there are any. */
static int render_member_sandboxes(struct lb_lend *l, struct lb_buf *out)
{
    static const char head[] = "# HELP lendbox_provider_member_sandboxes Live sandboxes by "
                               "cluster member.\n"
                               "# TYPE lendbox_provider_member_sandboxes gauge\n";
    struct lb_member_count rows[256];
    char line[400], prov[140], member[140];
    size_t n = 0;
    int r = store_count_by_member(l->store, rows, sizeof(rows) / sizeof(rows[0]), &n, NULL);

    if (r < 0 || n == 0)
        return r;
    r = lb_buf_append(out, head, strlen(head));
    for (size_t i = 0; r == 0 && i < n; i++) {
        int len;

        label_escape(rows[i].provider, prov, sizeof(prov));
        label_escape(rows[i].member, member, sizeof(member));
        len = snprintf(line, sizeof(line),
                       "lendbox_provider_member_sandboxes{provider=\"%s\",member=\"%s\"} %lld\n",
                       prov, member, (long long)rows[i].count);
        r = lb_buf_append(out, line, (size_t)len);
    }
    return r;
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
    return r == 0 ? render_member_sandboxes(l, out) : r;
}
