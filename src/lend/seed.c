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
