/*
 * ops.c - a sandbox's status and usage (GET /v1/sandboxes/{id}), operations on one lent sandbox
 * (exec, files, pause, endpoint, caps, OOM kills), each through lend_target (its record,
 * descriptor and provider), and the operate-token fence that an exclusive exec raises. A failed
 * provider call goes through lost.c, which tells a lost sandbox from other failures. See
 * lend.h.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/image.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"

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
 * -ENOENT if it is not lent, -LB_E_LOST (410) if its record says it was lost, -EREMOTEIO if its
 * provider is not enabled. A provider call on t's sandbox that fails goes through
 * lend_lost_check, which tells a lost sandbox from other failures. */
static int lend_target_load(struct lb_lend *l, const char *id, struct lend_target *t,
                            struct lb_error *err)
{
    memset(t, 0, sizeof(*t));
    if (lend_record_get(l, id, &t->rec, err) < 0)
        return -ENOENT;
    if (lend_record_is_lost(&t->rec))
        return lend_lost_error(id, err);
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

/* lend_target_load, then the sandbox's activity (resumed if idle-paused, its last activity now):
 * what a file or archive operation does before its provider call. Close with lend_target_close
 * whatever this returns. */
static int lend_target_open(struct lb_lend *l, const char *id, struct lend_target *t,
                            struct lb_error *err)
{
    int r = lend_target_load(l, id, t, err);

    if (r == 0)
        r = lend_activity_enter(l, &t->rec, t->prov, &t->ref, false, err);
    return r;
}

/* The end of an operation on t: a failure r of its provider call goes through lend_lost_check
 * (410 for a lost sandbox), and t is released. Returns r or what lend_lost_check made of it. */
static int lend_target_close(struct lb_lend *l, const char *id, struct lend_target *t, int r,
                             struct lb_error *err)
{
    if (r < 0 && t->prov)
        r = lend_lost_check(l, id, r, err);
    lend_target_release(t);
    return r;
}

/* ---------- status and usage ---------- */

int lend_sandbox_status(struct lb_lend *l, const char *id, json_t **out, struct lb_error *err)
{
    struct lb_record rec = {0};
    struct lb_usage usage = {-1, -1, -1, -1, -1, -1};
    const char *status = NULL;
    bool gone = false;

    if (lend_record_get(l, id, &rec, err) < 0)
        return -ENOENT;
    if (rec.state == LB_STATE_LENT) {
        json_t *desc = rec.descriptor_json ? json_loads(rec.descriptor_json, 0, NULL) : NULL;
        struct lb_sandbox_ref ref = {rec.id, desc};
        struct lb_provider *prov = lend_provider_of(l, &rec, NULL);
        enum lb_sandbox_status st;

        if (prov && provider_status(prov, &ref, &st, NULL) == 0) {
            status = provider_status_name(st);
            gone = st == LB_STATUS_STOPPED || st == LB_STATUS_ERROR;
            if (st == LB_STATUS_RUNNING || st == LB_STATUS_PAUSED)
                (void)provider_usage(prov, &ref, &usage, NULL);
        } else {
            status = "unknown";
        }
        json_decref(desc);
    }
    /* a lent sandbox its provider calls stopped was lost: recorded so, and shown as recorded */
    if (gone && lend_note_gone(l, &rec) < 0) {
        store_record_release(&rec);
        if (lend_record_get(l, id, &rec, err) < 0) {
            store_record_release(&rec);
            return -ENOENT;
        }
        if (rec.state != LB_STATE_LENT)
            status = NULL;
    }
    *out = lend_render_sandbox(&rec, status, false);
    if (*out &&
        (json_object_set_new(*out, "stop_reason",
                             rec.stop_reason ? json_string(rec.stop_reason) : json_null()) < 0 ||
         json_object_set_new(*out, "usage", lend_usage_json(&usage)) < 0 ||
         json_object_set_new(*out, "last_activity_at",
                             rec.state == LB_STATE_LENT
                                 ? clock_json_rfc3339(lend_last_activity(l, &rec))
                                 : json_null()) < 0)) {
        json_decref(*out);
        *out = NULL;
    }
    store_record_release(&rec);
    return *out ? 0 : lb_error_set(err, -ENOMEM, "out of memory");
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
    if (f->exclusive > 0 || f->writers > 0 || f->readers > 0)
        return;
    HASH_DEL(l->fences, f);
    free(f->id);
    free(f);
}

static int fence_refuse(const struct lend_fence *f, struct lb_error *err)
{
    return lb_error_set(
        err, -EBUSY,
        "sandbox '%s' is fenced since %s by an exclusive exec, a snapshot or a "
        "reset running in it: calls with its operate token answer 409 until it ends",
        f->id, f->since);
}

/* How often a raise that waits for writers calls its stall hook (lend_fence_raise_stalled). */
#define FENCE_STALL_MS 200

int lend_fence_raise_stalled(struct lb_lend *l, const char *id, lend_fence_stall_fn *stalled,
                             void *ctx, struct lb_error *err)
{
    struct lend_fence *f;
    int r = 0;

    pthread_mutex_lock(&l->fence_mutex);
    f = fence_get(l, id, true);
    if (!f) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    if (f->exclusive++ == 0)
        clock_format_rfc3339(clock_now_s(), f->since, sizeof(f->since));
    /* a read is the daemon's own bounded work: waited for, never a stall */
    while (f->writers > 0 || f->readers > 0) {
        struct timespec until = clock_realtime_after_ms(FENCE_STALL_MS);

        if (pthread_cond_timedwait(&l->fence_cond, &l->fence_mutex, &until) != ETIMEDOUT ||
            !stalled || f->writers == 0)
            continue;
        /* f stays while the lock is down: this raise's own count holds it */
        pthread_mutex_unlock(&l->fence_mutex);
        r = stalled(ctx, err);
        pthread_mutex_lock(&l->fence_mutex);
        if (r < 0) {
            f->exclusive--;
            fence_put(l, f);
            break;
        }
    }
out:
    pthread_mutex_unlock(&l->fence_mutex);
    return r;
}

/* lend_fence_raise's stall hook: a paused sandbox holds an act admitted before at its start
 * (its helper frozen as it joins the sandbox's cgroup), for as long as the act's timeout; give
 * up then. ctx: struct fence_stall_ctx. */
struct fence_stall_ctx {
    struct lb_lend *l;
    const char *id;
};

static int fence_stall_paused(void *ctx, struct lb_error *err)
{
    struct fence_stall_ctx *c = ctx;
    struct lend_target t;
    enum lb_sandbox_status st;
    int r = 0;

    if (lend_target_load(c->l, c->id, &t, NULL) == 0 &&
        provider_status(t.prov, &t.ref, &st, NULL) == 0 && st == LB_STATUS_PAUSED)
        r = lb_error_set(err, -EBUSY,
                         "sandbox '%s' is paused while a request made with its operate token "
                         "before this one is starting in it: resume it first",
                         c->id);
    lend_target_release(&t);
    return r;
}

int lend_fence_raise(struct lb_lend *l, const char *id, struct lb_error *err)
{
    struct fence_stall_ctx c = {l, id};

    return lend_fence_raise_stalled(l, id, fence_stall_paused, &c, err);
}

enum fence_role { FENCE_EXCLUSIVE, FENCE_WRITER, FENCE_READER };

/* One exclusive exec, writer or reader leaves id's fence; the last writer or reader out wakes
 * an exclusive exec waiting in lend_fence_raise. */
static void fence_drop(struct lb_lend *l, const char *id, enum fence_role role)
{
    struct lend_fence *f;

    pthread_mutex_lock(&l->fence_mutex);
    f = fence_get(l, id, false);
    if (f) {
        if (role == FENCE_EXCLUSIVE)
            f->exclusive--;
        else if (role == FENCE_WRITER)
            f->writers--;
        else
            f->readers--;
        if (role != FENCE_EXCLUSIVE && f->writers == 0 && f->readers == 0)
            pthread_cond_broadcast(&l->fence_cond);
        fence_put(l, f);
    }
    pthread_mutex_unlock(&l->fence_mutex);
}

void lend_fence_lower(struct lb_lend *l, const char *id)
{
    fence_drop(l, id, FENCE_EXCLUSIVE);
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

static int fence_enter(struct lb_lend *l, const char *id, enum fence_role role,
                       struct lb_error *err)
{
    struct lend_fence *f;
    int r = 0;

    pthread_mutex_lock(&l->fence_mutex);
    f = fence_get(l, id, true);
    if (!f)
        r = lb_error_set(err, -ENOMEM, "out of memory");
    else if (f->exclusive > 0)
        r = fence_refuse(f, err);
    else if (role == FENCE_WRITER)
        f->writers++;
    else
        f->readers++;
    pthread_mutex_unlock(&l->fence_mutex);
    return r;
}

int lend_fence_enter(struct lb_lend *l, const char *id, struct lb_error *err)
{
    return fence_enter(l, id, FENCE_WRITER, err);
}

void lend_fence_leave(struct lb_lend *l, const char *id)
{
    fence_drop(l, id, FENCE_WRITER);
}

int lend_fence_enter_read(struct lb_lend *l, const char *id, struct lb_error *err)
{
    return fence_enter(l, id, FENCE_READER, err);
}

void lend_fence_leave_read(struct lb_lend *l, const char *id)
{
    fence_drop(l, id, FENCE_READER);
}

/* ---------- per-sandbox operations ---------- */

int lend_exec_user(struct lb_lend *l, const char *id, const char *user, char **out,
                   struct lb_error *err)
{
    struct lend_target t;
    json_t *spec = NULL;
    const char *image_user;
    int r = lend_target_load(l, id, &t, err);

    *out = NULL;
    if (r == 0 && !user) {
        (void)lend_spec_string(&t.rec, "workdir", l->cfg.workdir, &spec);
        image_user = json_string_value(json_object_get(spec, "image_user"));
        user = image_user;
    }
    if (r == 0 && user && !(*out = strdup(user)))
        r = lb_error_set(err, -ENOMEM, "out of memory");
    json_decref(spec);
    lend_target_release(&t);
    return r;
}

/* An operate-token exec's writer hold on its sandbox's fence (lb_exec_params.fence_held). */
struct exec_fence_hold {
    struct lb_lend *l;
    const char *id;
    bool *held; /* the caller's flag, or NULL */
};

/* Leave the hold once: the provider's on_started, or lend_exec's end. Both on the exec's
 * thread. */
static void exec_fence_release(void *ctx)
{
    struct exec_fence_hold *h = ctx;

    if (h->held && *h->held) {
        *h->held = false;
        lend_fence_leave(h->l, h->id);
    }
}

int lend_exec(struct lb_lend *l, const char *id, const struct lb_exec_params *p,
              struct lb_exec_result *res, struct lb_error *err)
{
    struct exec_fence_hold hold = {l, id, p->fence_held};
    struct lend_target t;
    json_t *spec = NULL;
    char **env = NULL;
    const char *workdir, *image_wd;
    int r = lend_target_load(l, id, &t, err);

    if (r < 0)
        goto out;
    workdir = lend_spec_string(&t.rec, "workdir", l->cfg.workdir, &spec);
    image_wd = json_string_value(json_object_get(spec, "image_working_dir"));
    env = lend_exec_env(spec, workdir, p->env);
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
    /* activity until the command ends (a paused on_idle "pause" sandbox is resumed first) */
    if ((r = lend_activity_enter(l, &t.rec, t.prov, &t.ref, true, err)) < 0)
        goto out;
    /* the fence is up before the provider's sweep starts and down once the result is in (a
     * raise waits for every writer: this exec's own hold goes first) */
    if (p->exclusive)
        exec_fence_release(&hold);
    if (p->exclusive && (r = lend_fence_raise(l, id, err)) < 0) {
        lend_activity_leave(l, id);
        goto out;
    }
    if (hold.held && *hold.held) {
        req.on_started = exec_fence_release;
        req.started_ctx = &hold;
    }
    metrics_add(LB_M_EXECS, 1);
    r = provider_exec(t.prov, &t.ref, &req, res, err);
    if (p->exclusive)
        lend_fence_lower(l, id);
    lend_activity_leave(l, id);
    if (r < 0)
        r = lend_lost_check(l, id, r, err);
    if (r == 0 && res->error_type == LB_EXEC_TIMEOUT)
        metrics_add(LB_M_EXEC_TIMEOUTS, 1);
out:
    exec_fence_release(&hold);
    lend_exec_env_free(env);
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

int lend_busy_enter(struct lb_lend *l, const char *id, struct lb_error *err)
{
    struct lend_target t;
    enum lb_sandbox_status st;
    struct lb_error perr = {0};
    int r = lend_target_load(l, id, &t, err);

    if (r == 0)
        r = lend_activity_enter(l, &t.rec, t.prov, &t.ref, true, err);
    if (r == 0 && provider_status(t.prov, &t.ref, &st, &perr) == 0 && st == LB_STATUS_PAUSED) {
        lend_activity_leave(l, id);
        r = lb_error_set(err, -EBUSY, "sandbox '%s' is paused", id);
    }
    lend_target_release(&t);
    return r;
}

void lend_busy_leave(struct lb_lend *l, const char *id)
{
    lend_activity_leave(l, id);
}

int lend_file_write(struct lb_lend *l, const char *id, const char *path, const void *data,
                    size_t len, int mode, struct lb_error *err)
{
    struct lend_target t;
    int r = lend_target_open(l, id, &t, err);

    if (r == 0)
        r = provider_file_write(t.prov, &t.ref, path, data, len, mode, err);
    return lend_target_close(l, id, &t, r, err);
}

int lend_upload_begin(struct lb_lend *l, const char *id, const char *path, int mode,
                      const char *owner, struct lb_upload **out, struct lb_error *err)
{
    struct lend_target t;
    int r = lend_target_open(l, id, &t, err);

    *out = NULL;
    if (r == 0)
        r = provider_upload_begin(t.prov, &t.ref, path, mode, owner, out, err);
    return lend_target_close(l, id, &t, r, err);
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
    int r = lend_target_open(l, id, &t, err);

    if (r == 0)
        r = provider_file_open(t.prov, &t.ref, path, fd_out, size_out, err);
    return lend_target_close(l, id, &t, r, err);
}

/* An archive into (put) or out of dir of sandbox id: lend_archive_put and lend_archive_get. */
static int lend_archive_move(struct lb_lend *l, const char *id, bool put, const char *dir, int fd,
                             uint64_t max_bytes, struct lb_archive_result *out,
                             struct lb_error *err)
{
    struct lend_target t;
    int r = lend_target_open(l, id, &t, err);

    *out = (struct lb_archive_result){0};
    if (r == 0 && put)
        r = provider_archive_put(t.prov, &t.ref, dir, fd, max_bytes, out, err);
    else if (r == 0)
        r = provider_archive_get(t.prov, &t.ref, dir, fd, max_bytes, out, err);
    return lend_target_close(l, id, &t, r, err);
}

int lend_archive_put(struct lb_lend *l, const char *id, const char *dir, int fd, uint64_t max_bytes,
                     struct lb_archive_result *out, struct lb_error *err)
{
    return lend_archive_move(l, id, true, dir, fd, max_bytes, out, err);
}

int lend_archive_get(struct lb_lend *l, const char *id, const char *dir, int fd, uint64_t max_bytes,
                     struct lb_archive_result *out, struct lb_error *err)
{
    return lend_archive_move(l, id, false, dir, fd, max_bytes, out, err);
}

int lend_set_paused(struct lb_lend *l, const char *id, bool pause, json_t **out,
                    struct lb_error *err)
{
    struct lend_target t;
    int r = lend_target_load(l, id, &t, err);

    if (r == 0)
        r = pause ? provider_pause(t.prov, &t.ref, err) : provider_resume(t.prov, &t.ref, err);
    if (r < 0 && t.prov)
        r = lend_lost_check(l, id, r, err);
    if (r == 0) {
        lend_activity_paused(l, id, pause);
        lend_note_event(l, pause ? "paused" : "resumed", id, "api");
    }
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
    if ((r = lend_activity_enter(l, &t.rec, t.prov, &t.ref, false, err)) < 0)
        goto out;
    r = provider_endpoint(t.prov, &t.ref, port, &url, err);
    if (r < 0) {
        r = lend_lost_check(l, id, r, err);
        goto out;
    }
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
    if (r < 0 && t.prov)
        r = lend_lost_check(l, id, r, err);
    lend_target_release(&t);
    return r;
}

/* see lend_private.h */
int lend_snapshot_capture(struct lb_lend *l, const char *id, const char *name, bool hidden,
                          json_t *labels, struct lb_image_info *info, struct lb_error *err)
{
    struct lend_target t;
    struct lb_provider_caps caps;
    struct lb_image_info base_info;
    char work[4200] = "";
    const char *base, *digest;
    struct lb_error end_err = {0};
    enum lb_sandbox_status status;
    json_t *spec = NULL;
    bool flatten = false, recorded = false;
    int r;

    r = lend_target_load(l, id, &t, err);
    if (r < 0)
        goto out;
    provider_caps(t.prov, &caps);
    if (!caps.snapshot || !l->cfg.images_dir) {
        r = lb_error_set(err, -ENOSYS, "the %s provider cannot snapshot sandboxes",
                         t.prov->ops->name);
        goto out;
    }
    if (image_get(l->cfg.images_dir, name, info, NULL) == 0) {
        r = lb_error_set(err, -EEXIST, "an image named '%s' exists", name);
        goto out;
    }
    base = lend_spec_string(&t.rec, "image", "host", &spec);
    digest = json_string_value(json_object_get(spec, "image_digest"));
    if (strcmp(base, "host") != 0 && !caps.image_store &&
        image_get(l->cfg.images_dir, base, &base_info, NULL) < 0) {
        /* the engine's own image: the engine keeps what the snapshot stands on */
    } else if (strcmp(base, "host") != 0) {
        /* the layer is a difference to the tree the sandbox was seeded from */
        r = image_get(l->cfg.images_dir, base, &base_info, err);
        if (r == 0 && digest && strcmp(digest, base_info.digest) != 0)
            r = lb_error_set(err, -EEXIST,
                             "image '%s' names another tree than the one sandbox %s was seeded "
                             "from; cannot stack a snapshot on it",
                             base, id);
        if (r < 0)
            goto out;
        flatten = base_info.depth + 1 > LB_IMAGE_DEPTH_MAX;
    }
    /* recorded before the freeze: a crash from here on is finished or undone at start-up */
    if (provider_status(t.prov, &t.ref, &status, NULL) < 0)
        status = LB_STATUS_RUNNING;
    r = store_snapshot_begin(l->store, name, id, status == LB_STATUS_PAUSED, err);
    if (r < 0)
        goto out;
    recorded = true;
    r = image_snapshot_prepare(l->cfg.images_dir, work, sizeof(work), err);
    if (r < 0)
        goto out;
    /* no write made for an operate token (an upload, a file, a resume) runs while the copy
     * walks the trees: the frozen sandbox is all there is to them (a fork's capture too) */
    r = lend_fence_raise(l, id, err);
    if (r == 0) {
        pthread_mutex_lock(&l->capture_mutex);
        r = provider_snapshot(t.prov, &t.ref, work, flatten, err);
        pthread_mutex_unlock(&l->capture_mutex);
        lend_fence_lower(l, id);
    }
    if (r < 0) {
        r = lend_lost_check(l, id, r, err);
        image_snapshot_discard(work);
        goto out;
    }
    r = image_snapshot_publish(l->cfg.images_dir, work, name, base, id, flatten, hidden, labels,
                               info, err);
out:
    /* published: the "snapshot" event goes with the row's removal */
    if (recorded && (r == 0 ? store_snapshot_done(l->store, name, &end_err)
                            : store_snapshot_end(l->store, name, &end_err)) < 0)
        log_warn("snapshot %s: cannot forget its record: %s", name, end_err.message);
    json_decref(spec);
    lend_target_release(&t);
    return r;
}

int lend_snapshot(struct lb_lend *l, const char *id, const char *name, json_t *labels, json_t **out,
                  struct lb_error *err)
{
    struct lb_image_info info;
    char created[32];
    int r;

    *out = NULL;
    if (!image_name_is_valid(name))
        return lb_error_set(err, -EINVAL,
                            "invalid snapshot name '%s' (want [A-Za-z0-9][A-Za-z0-9._-]*, at most "
                            "%d bytes, not 'host')",
                            name ? name : "", LB_IMAGE_NAME_MAX);
    r = lend_snapshot_capture(l, id, name, false, labels, &info, err);
    if (r < 0)
        return r;
    clock_format_rfc3339(info.created_at, created, sizeof(created));
    *out = json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:s,s:o}", "name", info.name, "digest", info.digest,
                     "size_bytes", (json_int_t)info.size_bytes, "created_at", created, "kind",
                     "snapshot", "base", info.base, "source_sandbox_id", id, "labels",
                     labels ? json_incref(labels) : json_object());
    if (!*out)
        return lb_error_set(err, -ENOMEM, "out of memory");
    return 0;
}

int lend_recover_snapshots(struct lb_lend *l, struct lb_error *err)
{
    json_t *rows = NULL, *row;
    size_t i;
    int r = store_snapshots_pending(l->store, &rows, err);

    if (r < 0)
        return r;
    json_array_foreach(rows, i, row) {
        const char *name = json_string_value(json_object_get(row, "name"));
        const char *id = json_string_value(json_object_get(row, "sandbox_id"));
        struct lb_image_info info;
        struct lend_target t;
        struct lb_error e = {0};
        bool named = l->cfg.images_dir && image_get(l->cfg.images_dir, name, &info, NULL) == 0;

        memset(&t, 0, sizeof(t));
        /* the capture froze the sandbox: thaw it, unless it was paused before */
        if (!json_is_true(json_object_get(row, "was_paused")) &&
            lend_target_load(l, id, &t, &e) == 0 && provider_resume(t.prov, &t.ref, &e) < 0)
            log_warn("snapshot %s: cannot thaw sandbox %s: %s", name, id, e.message);
        lend_target_release(&t);
        log_info("snapshot %s of sandbox %s was interrupted: %s", name, id,
                 named ? "its image was complete and is kept" : "nothing of it is kept");
        if ((named ? store_snapshot_done(l->store, name, &e)
                   : store_snapshot_end(l->store, name, &e)) < 0)
            log_warn("snapshot %s: cannot forget its record: %s", name, e.message);
    }
    json_decref(rows);
    lend_sweep_snapshots(l);
    return 0;
}
