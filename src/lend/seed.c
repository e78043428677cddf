/*
 * seed.c - a seed: a sandbox started (or taken warm) and lent to a session or to no session, and
 * the pieces of it the warm pool repeats (resources, spec, image check). See lend.h.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/image.h"
#include "provider/registry.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"
#include "util/token.h"

/* ---------- the image, opened once per seed ---------- */

/* What a seed takes from the image store: digest, Env, WorkingDir and (want_user) User of the
 * image named name. Release with lend_image_close. */
struct lend_image {
    bool has_digest;
    char digest[LB_IMAGE_DIGEST_MAX];
    json_t *env;       /* config Env, or NULL */
    char *working_dir; /* config WorkingDir, or NULL */
    char *user;        /* config User (want_user only), or NULL */
};

static void lend_image_close(struct lend_image *im)
{
    json_decref(im->env);
    free(im->working_dir);
    free(im->user);
    memset(im, 0, sizeof(*im));
}

/* Read image name once: "host", no image store and a tree placed by hand (no config) give
 * nothing. With want_user (a provider that runs the store's trees as they are), an image whose
 * User is not mapped in a sandbox is refused: -EOPNOTSUPP (422) before anything is made. */
static int lend_image_open(struct lb_lend *l, const char *name, bool want_user,
                           struct lend_image *im, struct lb_error *err)
{
    struct lb_image_info info;
    int r;

    memset(im, 0, sizeof(*im));
    if (!l->cfg.images_dir || strcmp(name, "host") == 0)
        return 0;
    /* which tree the name meant at seed time (image rm and re-imports look at names) */
    if (image_get(l->cfg.images_dir, name, &info, NULL) == 0) {
        im->has_digest = true;
        snprintf(im->digest, sizeof(im->digest), "%s", info.digest);
    }
    if (image_read_config(l->cfg.images_dir, name, &im->env, &im->working_dir, NULL) < 0) {
        im->env = NULL;
        im->working_dir = NULL;
    }
    if (!want_user)
        return 0;
    r = image_resolve_user(l->cfg.images_dir, name, &im->user, err);
    if (r == -ENOENT) {
        lb_error_clear(err);
        im->user = NULL;
        return 0;
    }
    if (r < 0)
        lend_image_close(im);
    return r;
}

/* ---------- the spec a record keeps ---------- */

/* The spec of a seed's record (image, workdir, env, network, labels, ports, resources with
 * disk_mib; the image's digest, Env, WorkingDir and User). A new reference, NULL without
 * memory. The image's Env and WorkingDir are recorded with the sandbox so that a later
 * re-import of the name does not change a running sandbox's execs; the digest keeps the stored
 * tree from garbage collection while the sandbox lives. */
static json_t *lend_spec_json(struct lb_lend *l, const struct lb_seed_request *req,
                              const char *image, const struct lb_resources *res,
                              const struct lend_image *im)
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

    if (spec && req->idle_timeout_s > 0) {
        json_object_set_new(spec, "idle_timeout_s", json_real(req->idle_timeout_s));
        json_object_set_new(spec, "on_idle", json_string(req->on_idle_pause ? "pause" : "stop"));
    }
    if (spec && req->ready_timeout_ms > 0)
        json_object_set_new(spec, "ready_timeout_ms", json_integer(req->ready_timeout_ms));
    /* kept in the seed body's own form: resets and fork children probe again */
    if (spec && req->ready_probe.command &&
        json_object_set_new(spec, "ready_probe",
                            json_pack("{s:s,s:I}", "command", req->ready_probe.command,
                                      "interval_ms", (json_int_t)req->ready_probe.interval_ms)) <
            0) {
        json_decref(spec); /* never a seed that skips its probe */
        spec = NULL;
    }
    if (spec && (res->cpu > 0 || res->memory_mib > 0 || res->pids > 0 || res->disk_mib > 0)) {
        json_t *rj = json_object();

        if (res->cpu > 0)
            json_object_set_new(rj, "cpu", json_real(res->cpu));
        if (res->memory_mib > 0)
            json_object_set_new(rj, "memory_mib", json_integer(res->memory_mib));
        if (res->pids > 0)
            json_object_set_new(rj, "pids", json_integer(res->pids));
        if (res->disk_mib > 0)
            json_object_set_new(rj, "disk_mib", json_integer(res->disk_mib));
        if (res->gpu > 0)
            json_object_set_new(rj, "gpu", json_integer(res->gpu));
        json_object_set_new(spec, "resources", rj);
    }
    if (!spec)
        return NULL;
    if (im->has_digest)
        json_object_set_new(spec, "image_digest", json_string(im->digest));
    if (im->env)
        json_object_set_new(spec, "image_env", json_incref(im->env));
    /* a workdir the request names is the default cwd (NeMo Gym's SandboxSpec) */
    if (im->working_dir && !req->workdir)
        json_object_set_new(spec, "image_working_dir", json_string(im->working_dir));
    if (im->user)
        json_object_set_new(spec, "image_user", json_string(im->user));
    return spec;
}

/* resources.disk_mib: at most max_disk_mib (400), default_disk_mib when unset, so every
 * sandbox's storage is bounded. The defaults (disk, pids) apply where the provider (caps) can
 * enforce them; what a seed asks for itself is checked by provider_check_spec. */
static int lend_check_resources(struct lb_lend *l, const struct lb_provider_caps *caps,
                                struct lb_resources *res, struct lb_error *err)
{
    if (l->cfg.max_disk_mib > 0 && res->disk_mib > l->cfg.max_disk_mib)
        return lb_error_set(err, -EINVAL,
                            "'resources.disk_mib' %lld is over this daemon's limit of %lld "
                            "(limits.max_disk_mib)",
                            (long long)res->disk_mib, (long long)l->cfg.max_disk_mib);
    if (res->disk_mib == 0 && caps->disk_limit)
        res->disk_mib = l->cfg.default_disk_mib;
    if (res->pids == 0 && caps->pids_limit)
        res->pids = l->cfg.default_pids; /* a fork bomb must not take the host's pids */
    return 0;
}

/* ---------- the seed's files, kept for resets ---------- */

/* Keep req's files with sandbox id's record (store_seed_files_put): a reset writes them again.
 * 0 or a negative errno; nothing to keep is 0 without a store call. */
static int lend_keep_seed_files(struct lb_lend *l, const char *id,
                                const struct lb_seed_request *req, struct lb_error *err)
{
    struct lb_store_file *files;
    int r;

    if (req->n_files == 0)
        return 0;
    files = calloc(req->n_files, sizeof(*files));
    if (!files)
        return lb_error_set(err, -ENOMEM, "out of memory");
    for (size_t i = 0; i < req->n_files; i++)
        files[i] = (struct lb_store_file){req->files[i].path, req->files[i].data, req->files[i].len,
                                          req->files[i].mode};
    r = store_seed_files_put(l->store, id, files, req->n_files, err);
    free(files);
    return r;
}

/* ---------- the start every sandbox takes: intent before action ---------- */

/* see lend_internal.h */
int lend_start_prepare(struct lb_lend *l, const struct lb_seed_request *req, struct lend_start *s,
                       struct lb_error *err)
{
    struct lend_image im = {0};
    int r;

    memset(s, 0, sizeof(*s));
    s->req = req;
    s->spec = (struct lb_sandbox_spec){.workdir = req->workdir ? req->workdir : l->cfg.workdir,
                                       .resources = req->resources,
                                       .network = req->net,
                                       .ports = req->ports,
                                       .n_ports = req->n_ports,
                                       .ready_timeout_ms = req->ready_timeout_ms};
    /* the provider is the seed's choice among the enabled ones; what it cannot enforce is
     * refused (422) before anything is recorded */
    r = registry_choose(l->providers, req->provider, &s->prov, err);
    if (r < 0)
        return r;
    provider_caps(s->prov, &s->caps);
    s->spec.image = req->image ? req->image
                               : lend_default_image(l,
                                                    s->caps.default_image ? s->caps.default_image
                                                                          : l->cfg.default_image,
                                                    s->image, sizeof(s->image));
    r = lend_check_resources(l, &s->caps, &s->spec.resources, err);
    if (r == 0)
        r = provider_check_spec(s->prov, &s->spec, err);
    if (r < 0)
        return r;
    /* the User is checked where the provider runs the image store's trees as they are */
    r = lend_image_open(l, s->spec.image, s->caps.image_store, &im, err);
    if (r < 0)
        return r;
    /* the record keeps what the seed asked for, and the disk it got (pids default unrecorded) */
    struct lb_resources recorded = req->resources;

    recorded.disk_mib = s->spec.resources.disk_mib;
    s->spec_json = lend_spec_json(l, req, s->spec.image, &recorded, &im);
    s->spec_text = s->spec_json ? json_dumps(s->spec_json, JSON_COMPACT) : NULL;
    lend_image_close(&im);
    if (!s->spec_text)
        return lb_error_set(err, -ENOMEM, "out of memory");
    return 0;
}

/* see lend_internal.h */
void lend_start_release(struct lend_start *s)
{
    json_decref(s->spec_json);
    json_decref(s->desc);
    free(s->spec_text);
    free(s->desc_text);
    memset(s, 0, sizeof(*s));
}

/* see lend_internal.h */
int lend_start_recorded(struct lb_lend *l, struct lend_start *s, const char *rsid,
                        const char *pool_class, int64_t ttl_s, struct lb_error *err)
{
    struct lb_record *rec = &s->rec;
    struct lb_error perr = {0};
    struct lend_admission_slot slot;
    int r;

    /* admission before the record: a refused seed (429) or a refill that must yield leaves
     * nothing behind */
    r = pool_class ? lend_admission_enter_refill(l->admission, LEND_REFILL_WAIT_MS, &slot, err)
                   : lend_admission_enter_seed(l->admission, &slot, err);
    if (r < 0)
        return r;
    r = token_new_sandbox_id(rec->id);
    if (r < 0) {
        lend_admission_leave(l->admission, &slot);
        return lb_error_set(err, r, "cannot make a sandbox id");
    }
    rec->rsid = (char *)rsid;
    rec->task_id = (char *)s->req->task_id;
    rec->provider = (char *)s->prov->ops->name;
    rec->state = LB_STATE_STARTING;
    rec->spec_json = s->spec_text;
    rec->pool_class = (char *)pool_class;
    rec->created_at = clock_now_s();
    rec->expires_at = ttl_s > 0 ? rec->created_at + ttl_s : 0;
    /* Intent before action: the record exists before the provider makes anything. The
     * capacity check and the insert are one statement, so concurrent starts never pass
     * max_sandboxes; a warm pool's sandboxes hold capacity for seeds, not against them: for a
     * seed the oldest gives its place in the insert's own transaction (a refill woken in
     * between cannot take it), and is stopped after. */
    if (!pool_class && l->cfg.max_sandboxes > 0 && atomic_load(&l->warm_prov)) {
        char evicted[LB_ID_MAX];

        r = store_insert_sandbox_evicting(l->store, rec, l->cfg.max_sandboxes, "evicted", evicted,
                                          err);
        if (evicted[0])
            lend_stop_evicted(l, evicted, "evicted");
    } else {
        r = store_insert_sandbox(l->store, rec, l->cfg.max_sandboxes, err);
    }
    if (r < 0) {
        lend_admission_leave(l->admission, &slot);
        return r;
    }
    s->recorded = true;
    struct lb_sandbox_ref ref = {rec->id, NULL};
    s->create_ms = clock_mono_ms();
    r = provider_create(s->prov, &ref, &s->spec, &s->desc, &perr);
    lend_admission_leave(l->admission, &slot);
    if (r < 0) {
        /* bad input, an unenforceable request or no free sandbox uid keep their status */
        r = lb_error_set(err,
                         r == -EINVAL || r == -EOPNOTSUPP || r == -EUSERS ||
                                 r == -LB_E_IMAGE_NOT_FOUND
                             ? r
                             : -EREMOTEIO,
                         "sandbox could not start: %s", perr.message);
        lend_start_rollback(l, s);
        return r;
    }
    s->desc_text = json_dumps(s->desc, JSON_COMPACT);
    if (!s->desc_text) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        lend_start_rollback(l, s);
    }
    return r;
}

/* see lend_internal.h */
void lend_start_rollback(struct lb_lend *l, struct lend_start *s)
{
    struct lb_record got = {0};
    struct lb_error serr = {0};

    if (!s->recorded)
        return;
    /* the stop needs the descriptor create returned; a failed stop keeps it for its retries */
    if (s->desc_text)
        store_set_descriptor(l->store, s->rec.id, s->desc_text, NULL);
    if (store_get_sandbox(l->store, s->rec.id, &got, NULL) == 0 && got.state != LB_STATE_STOPPED) {
        if (!got.descriptor_json && s->desc_text)
            got.descriptor_json = strdup(s->desc_text);
        if (lend_stop_record(l, &got, s->fail_reason ? s->fail_reason : "seed_failed",
                             s->fail_reason ? LB_STATE_STOP_FAILED : LB_STATE_FAILED_SEED,
                             &serr) < 0)
            log_error_sbx(s->rec.id,
                          "session %s: failed seed's sandbox %s could not be stopped: %s",
                          s->rec.rsid ? s->rec.rsid : "(none)", s->rec.id, serr.message);
    }
    store_record_release(&got);
}

/* ---------- warm sandboxes ---------- */

/* The warm class of provider prov (caps: its caps) now; as lend_warm_class. */
static void lend_warm_class_caps(struct lb_lend *l, struct lb_provider *prov,
                                 const struct lb_provider_caps *caps, char *image, char *cls)
{
    const char *img =
        lend_default_image(l, caps->default_image ? caps->default_image : l->cfg.default_image,
                           image, LB_IMAGE_NAME_MAX + 1);

    if (img != image)
        snprintf(image, LB_IMAGE_NAME_MAX + 1, "%s", img);
    snprintf(cls, LEND_WARM_CLASS_MAX, "%s:%s", prov->ops->name, image);
}

/* see lend_internal.h */
void lend_warm_class(struct lb_lend *l, struct lb_provider *prov, char *image, char *cls)
{
    struct lb_provider_caps caps;

    provider_caps(prov, &caps);
    lend_warm_class_caps(l, prov, &caps, image, cls);
}

/* Is this seed (s prepared) of the warm pool's class (class_image: the class's now)? The
 * pool's provider and image, no resources, no network, no ports, and the default workdir: a
 * warm sandbox was made with exactly these, so it is what the seed would start. */
static bool lend_warm_matches(struct lb_lend *l, const struct lend_start *s,
                              struct lb_provider *pool_prov, const char *class_image)
{
    const struct lb_seed_request *req = s->req;
    const struct lb_resources *res = &req->resources;

    return s->prov == pool_prov && strcmp(s->spec.image, class_image) == 0 && res->cpu <= 0 &&
           res->memory_mib <= 0 && res->pids <= 0 && res->disk_mib <= 0 && !req->network &&
           req->n_ports == 0 && (!req->workdir || strcmp(req->workdir, l->cfg.workdir) == 0);
}

/* Serve a seed (s prepared, the session's lock held) from the warm pool: take the oldest warm
 * sandbox of its class in one store transaction (warm -> lent, token minted), write the seed's
 * files, render the lease. 0 with *lease_out, -ENOENT for no pool, another class or none left
 * (nothing changed: the seed starts a sandbox), or the seed's error (the taken sandbox is then
 * stopped as a failed seed). */
static int lend_take_warm(struct lb_lend *l, const char *rsid, const struct lend_start *s,
                          int64_t ttl_s, json_t **lease_out, struct lb_error *err)
{
    const struct lb_seed_request *req = s->req;
    struct lb_provider *pool_prov = atomic_load(&l->warm_prov);
    struct lb_record rec = {0};
    struct lb_error perr = {0};
    json_t *desc = NULL;
    int64_t now = clock_now_s(), take_ms = clock_mono_ms();
    char class_image[LB_IMAGE_NAME_MAX + 1], cls[LEND_WARM_CLASS_MAX];
    int r;

    if (!pool_prov)
        return -ENOENT;
    /* the class of the seed's provider, from the caps the seed asked (another provider is
     * another class) */
    if (s->prov == pool_prov)
        lend_warm_class_caps(l, s->prov, &s->caps, class_image, cls);
    if (s->prov != pool_prov || !lend_warm_matches(l, s, pool_prov, class_image)) {
        metrics_add(LB_M_WARM_OTHER_CLASS, 1);
        return -ENOENT;
    }
    struct lb_warm_take t = {
        .pool_class = cls,
        .now_s = now,
        .rsid = rsid,
        .task_id = req->task_id,
        .spec_json = s->spec_text,
        .expires_at = ttl_s > 0 ? now + ttl_s : 0,
        .token_hash = lend_operate_token_hash,
        .token_ctx = l,
    };
    r = store_take_warm(l->store, &t, &rec, err);
    if (r == -ENOENT) {
        metrics_add(LB_M_WARM_MISSES, 1);
        goto out;
    }
    if (r < 0)
        goto out;
    lend_warm_changed(l);
    /* lent now: the seed's files, then the lease; a failure stops it as a failed seed */
    desc = rec.descriptor_json ? json_loads(rec.descriptor_json, 0, NULL) : NULL;
    struct lb_sandbox_ref ref = {rec.id, desc};
    for (size_t i = 0; i < req->n_files; i++) {
        const struct lb_seed_file *f = &req->files[i];

        lb_error_clear(&perr);
        r = provider_file_write(s->prov, &ref, f->path, f->data, f->len, f->mode, &perr);
        if (r < 0) {
            struct lb_error serr = {0};

            r = lb_error_set(err, r, "seed file '%s' could not be written: %s", f->path,
                             perr.message);
            metrics_add(LB_M_SEEDS_FAILED, 1);
            if (lend_stop_record(l, &rec, "seed_failed", LB_STATE_FAILED_SEED, &serr) < 0)
                log_error_sbx(rec.id,
                              "session %s: failed seed's sandbox %s could not be stopped: %s",
                              rsid ? rsid : "(none)", rec.id, serr.message);
            goto out;
        }
    }
    r = lend_keep_seed_files(l, rec.id, req, err);
    /* ready once its probe (if any) passes, counted from the take */
    if (r == 0)
        r = lend_probe_run(l, s->prov, &ref, s->spec_json, take_ms, err);
    if (r < 0) {
        struct lb_error serr = {0};

        metrics_add(LB_M_SEEDS_FAILED, 1);
        if (lend_stop_record(l, &rec, "seed_failed", LB_STATE_FAILED_SEED, &serr) < 0)
            log_error_sbx(rec.id, "session %s: failed seed's sandbox %s could not be stopped: %s",
                          rsid ? rsid : "(none)", rec.id, serr.message);
        goto out;
    }
    lend_activity_seeded(l, &rec, s->spec_json);
    *lease_out = lend_render_lease_spec(l, &rec, s->spec_json, false);
    if (!*lease_out) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    metrics_add(LB_M_WARM_HITS, 1);
    metrics_add(LB_M_SEEDS_OK, 1);
    log_info_sbx(rec.id, "session %s: lent warm sandbox %s (task %s)", rsid ? rsid : "(none)",
                 rec.id, req->task_id);
out:
    json_decref(desc);
    store_record_release(&rec);
    return r;
}

/* ---------- seed ---------- */

/* The part of a seed that starts a new sandbox (or takes a warm one); the session lock is
 * held. */
static int lend_seed_new(struct lb_lend *l, const char *rsid, const struct lb_seed_request *req,
                         json_t **lease_out, struct lb_error *err)
{
    struct lend_start s;
    char token[4 + 65], token_hash[LB_SHA256_HEX + 1];
    int64_t ttl = req->ttl_s >= 0 ? req->ttl_s : l->cfg.default_ttl_s;
    int r = lend_start_prepare(l, req, &s, err);

    if (r < 0)
        goto out;
    if (l->cfg.max_ttl_s > 0 && ttl > l->cfg.max_ttl_s)
        ttl = l->cfg.max_ttl_s;
    /* a warm pool of this seed's class serves it (-ENOENT: a miss, start one as always) */
    r = lend_take_warm(l, rsid, &s, ttl, lease_out, err);
    if (r != -ENOENT)
        goto out;
    lb_error_clear(err);
    r = lend_start_recorded(l, &s, rsid, NULL, ttl, err);
    if (r < 0)
        goto failed;
    /* The descriptor is written once: with the lease (mark_lent) when nothing else comes in
     * between, or first thing when seed files are written or a ready probe runs (so a failure
     * or crash meanwhile can still find the sandbox; mark_lent then leaves it as it is). */
    bool early_desc = req->n_files > 0 || req->ready_probe.command;

    if (early_desc && store_set_descriptor(l->store, s.rec.id, s.desc_text, err) < 0) {
        r = lb_error_keep(err, -EIO, "cannot record the sandbox descriptor");
        goto rollback;
    }
    struct lb_sandbox_ref ref = {s.rec.id, s.desc};
    for (size_t i = 0; i < req->n_files; i++) {
        const struct lb_seed_file *f = &req->files[i];
        struct lb_error perr = {0};

        r = provider_file_write(s.prov, &ref, f->path, f->data, f->len, f->mode, &perr);
        if (r < 0) {
            r = lb_error_set(err, r, "seed file '%s' could not be written: %s", f->path,
                             perr.message);
            goto rollback;
        }
    }
    r = lend_keep_seed_files(l, s.rec.id, req, err);
    if (r < 0)
        goto rollback;
    /* ready once its probe (if any) passes, its files in place */
    r = lend_probe_run(l, s.prov, &ref, s.spec_json, s.create_ms, err);
    if (r < 0)
        goto rollback;
    r = lend_operate_token(l, s.rec.id, 0, token);
    if (r < 0) {
        r = lb_error_set(err, r, "cannot mint the operate token");
        goto rollback;
    }
    token_sha256_hex(token, strlen(token), token_hash);
    r = store_mark_lent(l->store, s.rec.id, early_desc ? NULL : s.desc_text, token_hash,
                        !req->sync_later, err);
    if (r < 0)
        goto rollback;
    /* the lease of the row just written: the record as inserted, lent now */
    s.rec.state = LB_STATE_LENT;
    lend_activity_seeded(l, &s.rec, s.spec_json);
    *lease_out = lend_render_lease_spec(l, &s.rec, s.spec_json, false);
    if (!*lease_out) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    metrics_add(LB_M_SEEDS_OK, 1);
    if (rsid)
        log_info_sbx(s.rec.id, "session %s: lent sandbox %s (task %s)", rsid, s.rec.id,
                     req->task_id);
    else
        log_info_sbx(s.rec.id, "started sandbox %s (lent to no session)", s.rec.id);
    goto out;

rollback:
    /* Nothing is lent: stop what may have started; a failed stop leaves a failed seed. */
    lend_start_rollback(l, &s);
failed:
    if (s.recorded)
        metrics_add(LB_M_SEEDS_FAILED, 1);
out:
    lend_start_release(&s);
    return r;
}

int lend_seed(struct lb_lend *l, const char *rsid, const struct lb_seed_request *req,
              json_t **lease_out, struct lb_error *err)
{
    return lend_seed_session(l, rsid, req, false, lease_out, err);
}

/* see lend_private.h */
int lend_seed_session(struct lb_lend *l, const char *rsid, const struct lb_seed_request *req,
                      bool fresh, json_t **lease_out, struct lb_error *err)
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
        if (fresh) {
            r = lb_error_set(err, -EEXIST, "session %s already has sandbox %s", rsid, live.id);
        } else if (live.task_id && strcmp(live.task_id, req->task_id) == 0 &&
                   live.state == LB_STATE_LENT) {
            /* a lease a running fork or batch lent is durable before it is handed out */
            r = req->sync_later ? 0 : lend_sync_leases(l, err);
            if (r == 0)
                *lease_out = lend_render_lease(l, &live, true);
            if (r == 0 && !*lease_out)
                r = lb_error_set(err, -ENOMEM, "out of memory");
            if (r == 0)
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
