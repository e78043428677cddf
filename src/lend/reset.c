/*
 * reset.c - a lent sandbox returned in place to how it was seeded (or to a snapshot of the same
 * base): torn down whole and made again under the same id and spec, the seed's files written
 * again, a new operate token. See lend.h (lend_reset).
 *
 * Why a teardown and not a clean-up inside: every process (also those that left the session
 * or double-forked), every writable mount (root layer, workdir, /tmp, /run, /dev/shm), the IPC
 * and UTS namespaces and every listening socket belong to the sandbox's namespaces; stopping
 * the sandbox ends all of them at once and a create makes each of them new, so nothing of the
 * previous episode can be missed by a list of things to clean.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/image.h"
#include "util/clock.h"
#include "util/fault.h"
#include "util/log.h"
#include "util/token.h"

/* The parts of a provider spec rebuilt from a record's spec JSON (what lend_spec_json wrote).
 * Strings are borrowed from the JSON; the arrays are owned. */
struct reset_spec {
    struct lb_sandbox_spec spec;
    const char **tool_servers; /* NULL-terminated; owned */
    int *ports;                /* owned */
};

static void reset_spec_release(struct reset_spec *rs)
{
    free(rs->tool_servers);
    free(rs->ports);
    memset(rs, 0, sizeof(*rs));
}

/* Rebuild the provider spec of the record's spec JSON: image, workdir, resources (with the
 * daemon's pids default where the provider enforces one, as a seed has it), network, ports and
 * readiness wait. 0 or -ENOMEM. */
static int reset_spec_build(struct lb_lend *l, const struct lb_provider_caps *caps, json_t *spec,
                            struct reset_spec *rs, struct lb_error *err)
{
    json_t *res = json_object_get(spec, "resources"), *net = json_object_get(spec, "network");
    json_t *ports = json_object_get(spec, "ports"), *tools = json_object_get(net, "tool_servers");
    const char *workdir = json_string_value(json_object_get(spec, "workdir"));
    size_t i, n;

    memset(rs, 0, sizeof(*rs));
    rs->spec.image = json_string_value(json_object_get(spec, "image"));
    if (!rs->spec.image)
        rs->spec.image = "host";
    rs->spec.workdir = workdir ? workdir : l->cfg.workdir;
    rs->spec.resources.cpu = json_number_value(json_object_get(res, "cpu"));
    rs->spec.resources.memory_mib = json_integer_value(json_object_get(res, "memory_mib"));
    rs->spec.resources.pids = json_integer_value(json_object_get(res, "pids"));
    rs->spec.resources.disk_mib = json_integer_value(json_object_get(res, "disk_mib"));
    rs->spec.resources.gpu = json_integer_value(json_object_get(res, "gpu"));
    if (rs->spec.resources.pids == 0 && caps->pids_limit)
        rs->spec.resources.pids = l->cfg.default_pids;
    rs->spec.ready_timeout_ms = json_integer_value(json_object_get(spec, "ready_timeout_ms"));
    rs->spec.network.access = json_string_value(json_object_get(net, "access"));
    rs->spec.network.model_server = json_string_value(json_object_get(net, "model_server"));
    if (json_is_array(tools)) {
        n = json_array_size(tools);
        rs->tool_servers = calloc(n + 1, sizeof(*rs->tool_servers));
        if (!rs->tool_servers)
            return lb_error_set(err, -ENOMEM, "out of memory");
        for (i = 0; i < n; i++)
            rs->tool_servers[i] = json_string_value(json_array_get(tools, i));
        rs->spec.network.tool_servers = rs->tool_servers;
    }
    if (json_is_array(ports) && json_array_size(ports) > 0) {
        n = json_array_size(ports);
        rs->ports = calloc(n, sizeof(*rs->ports));
        if (!rs->ports)
            return lb_error_set(err, -ENOMEM, "out of memory");
        for (i = 0; i < n; i++)
            rs->ports[i] = (int)json_integer_value(json_array_get(ports, i));
        rs->spec.ports = rs->ports;
        rs->spec.n_ports = n;
    }
    return 0;
}

/* The image at the bottom of name's stack (a snapshot's base, its base's, ...): the image a
 * tree of name was made from, or "host", into root (LB_IMAGE_NAME_MAX + 1 bytes). With
 * engine_images (a provider that runs its engine's own images, not the store's trees), a name
 * the store does not hold is such an image: a bottom. -ENOENT (unknown name) or a negative
 * errno. */
static int reset_image_root(struct lb_lend *l, const char *name, bool engine_images, char *root,
                            struct lb_error *err)
{
    struct lb_image_info info;
    char cur[LB_IMAGE_NAME_MAX + 1];

    snprintf(cur, sizeof(cur), "%s", name);
    for (int depth = 0; depth <= LB_IMAGE_DEPTH_MAX + 1; depth++) {
        if (strcmp(cur, "host") == 0 || !l->cfg.images_dir)
            break;
        if (image_get(l->cfg.images_dir, cur, &info, NULL) < 0) {
            if (engine_images)
                break;
            return lb_error_set(err, -ENOENT, "no image '%s'", cur);
        }
        if (!info.snapshot)
            break;
        snprintf(cur, sizeof(cur), "%s", info.base);
    }
    snprintf(root, LB_IMAGE_NAME_MAX + 1, "%s", cur);
    return 0;
}

/* Point spec (the record's, updated in place) at the tree the reset makes the sandbox from:
 * the seed's image (spec "seed_image", else "image": the first reset records it) or, with
 * snapshot, that snapshot, which must stand on the same base image. Checked before anything
 * is torn down: -LB_E_IMAGE_NOT_FOUND (404) for an unknown snapshot or a seed image no longer
 * in the store (engine_images: a seed image the store never held is the engine's own, which
 * the engine keeps), -EEXIST (409) for a snapshot of another base or a seed image whose name
 * now names another tree, -ENOMEM. */
static int reset_choose_image(struct lb_lend *l, json_t *spec, const char *id, const char *snapshot,
                              bool engine_images, struct lb_error *err)
{
    const char *image = json_string_value(json_object_get(spec, "image"));
    const char *seed_image = json_string_value(json_object_get(spec, "seed_image"));
    const char *seed_digest;
    char seed_root[LB_IMAGE_NAME_MAX + 1], snap_root[LB_IMAGE_NAME_MAX + 1];
    struct lb_image_info info;
    int r = 0;

    if (!image)
        image = "host";
    if (!seed_image) {
        /* the first reset keeps what the seed ran on, for the resets after a snapshot's */
        json_t *digest = json_object_get(spec, "image_digest");

        if (json_object_set_new(spec, "seed_image", json_string(image)) < 0 ||
            (digest && json_object_set(spec, "seed_image_digest", digest) < 0))
            return lb_error_set(err, -ENOMEM, "out of memory");
        seed_image = json_string_value(json_object_get(spec, "seed_image"));
    }
    seed_digest = json_string_value(json_object_get(spec, "seed_image_digest"));
    if (snapshot) {
        if (!l->cfg.images_dir || !image_name_is_valid(snapshot) ||
            image_get(l->cfg.images_dir, snapshot, &info, NULL) < 0 || !info.snapshot)
            return lb_error_set(err, -LB_E_IMAGE_NOT_FOUND, "no snapshot named '%s'",
                                snapshot ? snapshot : "");
        if (reset_image_root(l, seed_image, engine_images, seed_root, NULL) < 0 ||
            reset_image_root(l, snapshot, engine_images, snap_root, NULL) < 0)
            return lb_error_set(err, -LB_E_IMAGE_NOT_FOUND,
                                "snapshot '%s' or the images under it are no longer stored",
                                snapshot);
        if (strcmp(seed_root, snap_root) != 0)
            return lb_error_set(err, -EEXIST,
                                "snapshot '%s' stands on image '%s', sandbox %s on '%s': a reset "
                                "keeps the sandbox's base image",
                                snapshot, snap_root, id, seed_root);
        if (json_object_set_new(spec, "image", json_string(snapshot)) < 0 ||
            json_object_set_new(spec, "image_digest", json_string(info.digest)) < 0)
            return lb_error_set(err, -ENOMEM, "out of memory");
        return 0;
    }
    if (strcmp(seed_image, "host") != 0 && l->cfg.images_dir) {
        bool stored = image_get(l->cfg.images_dir, seed_image, &info, NULL) == 0;

        /* a seed image the store never held (no digest recorded) on a provider that runs its
         * engine's own images is the engine's: the engine keeps it */
        if (!stored && !(engine_images && !seed_digest))
            return lb_error_set(err, -LB_E_IMAGE_NOT_FOUND,
                                "image '%s' that sandbox %s was seeded from is no longer stored",
                                seed_image, id);
        if (stored && seed_digest && strcmp(seed_digest, info.digest) != 0)
            return lb_error_set(err, -EEXIST,
                                "image '%s' names another tree than the one sandbox %s was seeded "
                                "from",
                                seed_image, id);
    }
    if (json_object_set_new(spec, "image", json_string(seed_image)) < 0)
        return lb_error_set(err, -ENOMEM, "out of memory");
    if (seed_digest)
        r = json_object_set_new(spec, "image_digest", json_string(seed_digest));
    else
        json_object_del(spec, "image_digest"); /* none recorded: nothing to delete is fine */
    return r < 0 ? lb_error_set(err, -ENOMEM, "out of memory") : 0;
}

/* see lend_private.h */
int lend_reset_thaw(void *ctx, struct lb_error *err)
{
    struct lend_reset_stall *s = ctx;
    enum lb_sandbox_status st;

    /* An act admitted before the reset is still starting: the sandbox may be paused (an
     * agent's pause right after its own exec holds that exec's start, and so the reset, until
     * the exec's timeout). Thaw it; its token is fenced, so it cannot pause it again. A reset
     * thaws it anyway (in place) or stops it. */
    (void)err; /* a reset waits on: its kill ends whatever the act started */
    if (provider_status(s->prov, &s->ref, &st, NULL) == 0 && st == LB_STATUS_PAUSED &&
        provider_resume(s->prov, &s->ref, NULL) == 0)
        log_info_sbx(s->ref.id, "sandbox %s thawed: an act admitted before its reset was held",
                     s->ref.id);
    return 0;
}

/* Where a reset's time went, in ms (monotonic), for its log line. */
struct reset_times {
    int64_t start_ms;  /* when lend_reset began */
    int64_t stop_ms;   /* the provider's stop of the old sandbox */
    int64_t create_ms; /* the provider's create of the new one */
    int64_t files_ms;  /* its descriptor recorded and the seed's files written again */
};

/* Make the sandbox of rec again (its namespaces gone) or finish its in-place reset: with
 * in_place false, create under its id with rs and record the descriptor; with in_place (kept:
 * the descriptor of the sandbox the provider reset in place, or NULL) only what follows: write the
 * seed's files, run the seed's ready probe (spec: the record's spec, parsed). *desc_text_out is the
 * recorded descriptor (owned) once create succeeded, so a failure after it can stop what was
 * made. 0 or a negative errno. */
static int reset_remake(struct lb_lend *l, struct lb_provider *prov, const char *id,
                        const struct reset_spec *rs, json_t *spec, bool in_place, json_t *kept,
                        char **desc_text_out, struct reset_times *t, struct lb_error *err)
{
    int64_t create_ms = clock_mono_ms();
    struct lb_sandbox_ref ref = {id, NULL};
    struct lb_store_file *files = NULL;
    struct lb_error perr = {0};
    json_t *desc = in_place ? json_incref(kept) : NULL;
    size_t n_files = 0;
    /* tests: a reset that fails (or a daemon killed during one) with the old episode gone */
    int r = fault_hit("lend.reset", 0, &perr);

    if (r < 0) {
        r = lb_error_set(err, -EREMOTEIO, "%s", perr.message);
        goto out;
    }
    if (!in_place) {
        r = provider_create(prov, &ref, &rs->spec, &desc, &perr);
        if (r < 0) {
            r = lb_error_set(err, -EREMOTEIO, "the sandbox could not start again: %s",
                             perr.message);
            goto out;
        }
        *desc_text_out = json_dumps(desc, JSON_COMPACT);
        if (!*desc_text_out) {
            r = lb_error_set(err, -ENOMEM, "out of memory");
            goto out;
        }
        t->create_ms = clock_mono_ms() - create_ms;
        r = store_set_descriptor(l->store, id, *desc_text_out, err);
        if (r < 0)
            goto out;
    }
    r = store_seed_files_get(l->store, id, &files, &n_files, err);
    if (r < 0)
        goto out;
    ref.descriptor = desc;
    for (size_t i = 0; i < n_files; i++) {
        lb_error_clear(&perr);
        r = provider_file_write(prov, &ref, files[i].path, files[i].data, files[i].len,
                                files[i].mode, &perr);
        if (r < 0) {
            r = lb_error_set(err, -EREMOTEIO, "seed file '%s' could not be written again: %s",
                             files[i].path, perr.message);
            goto out;
        }
    }
    t->files_ms = clock_mono_ms() - create_ms - t->create_ms;
    r = lend_probe_run(l, prov, &ref, spec, create_ms, err);
out:
    store_seed_files_free(files, n_files);
    json_decref(desc);
    return r;
}

int lend_reset(struct lb_lend *l, const char *id, const char *snapshot, json_t **lease_out,
               struct lb_error *err)
{
    struct lend_session_lock *lock = NULL;
    struct lb_record rec = {0};
    struct lb_provider *prov;
    struct lb_provider_caps caps;
    struct reset_spec rs = {0};
    struct lb_error perr = {0};
    json_t *spec = NULL, *old_desc = NULL;
    char *spec_text = NULL, *desc_text = NULL;
    char token[4 + 65], token_hash[LB_SHA256_HEX + 1];
    int64_t generation;
    bool torn = false, stopped = false, fenced = false, in_place = false;
    struct reset_times t = {.start_ms = clock_mono_ms()};
    int64_t stop_start;
    int r;

    *lease_out = NULL;
    if (lend_is_draining(l))
        return lb_error_set(err, -ESHUTDOWN, "the daemon is draining; no resets");
    /* seeds, releases and deletes of the session wait for the reset, and it for them */
    r = lend_record_get_locked(l, id, &rec, &lock, err);
    if (r < 0)
        goto out;
    if (rec.state != LB_STATE_LENT) {
        r = lb_error_set(err, -ENOENT, "sandbox %s is not running (state %s)", id,
                         store_state_name(rec.state));
        goto out;
    }
    prov = lend_provider_of(l, &rec, err);
    if (!prov) {
        r = -EREMOTEIO;
        goto out;
    }
    provider_caps(prov, &caps);
    if (!caps.reset) {
        r = lb_error_set(err, -ENOSYS, "the %s provider cannot reset sandboxes", prov->ops->name);
        goto out;
    }
    spec = rec.spec_json ? json_loads(rec.spec_json, 0, NULL) : NULL;
    if (!json_is_object(spec)) {
        r = lb_error_set(err, -EIO, "sandbox %s has no readable spec", id);
        goto out;
    }
    r = reset_choose_image(l, spec, id, snapshot, !caps.image_store, err);
    if (r < 0)
        goto out;
    generation = lend_spec_token_generation(spec) + 1;
    /* "resetting" stays in the record until the reset is complete: a daemon that dies before
     * finds it at start-up and stops the sandbox (lend_record_resetting) */
    if (json_object_set_new(spec, "token_generation", json_integer(generation)) < 0 ||
        json_object_set_new(spec, "resetting", json_true()) < 0 ||
        !(spec_text = json_dumps(spec, JSON_COMPACT))) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    r = reset_spec_build(l, &caps, spec, &rs, err);
    if (r < 0)
        goto out;
    r = lend_operate_token(l, id, generation, token);
    if (r < 0) {
        r = lb_error_set(err, r, "cannot mint the operate token");
        goto out;
    }
    token_sha256_hex(token, strlen(token), token_hash);
    /* operate-token calls answer 409 from here, and acts admitted before end or start first
     * (an upload's commit; an exec, PTY session or harness until its process is inside: the
     * kill below then ends it), so none lands in the sandbox made again or reset in place;
     * one that comes to the fence after the reset finds its token revoked
     * (routes_operate_enter) */
    old_desc = rec.descriptor_json ? json_loads(rec.descriptor_json, 0, NULL) : NULL;
    struct lend_reset_stall stall = {prov, {id, old_desc}};

    r = lend_fence_raise_stalled(l, id, lend_reset_thaw, &stall, err);
    if (r < 0)
        goto out;
    fenced = true;
    /* Intent before action: the new spec and token are recorded first; from here the old token
     * answers 401, and a failure stops the sandbox rather than lend a half-reset one. */
    r = store_set_reset(l->store, id, spec_text, token_hash, false, err);
    if (r < 0)
        goto out;
    torn = true;
    /* a harness running in it is closed (its artifacts collected) as before a release; then
     * its activation goes: the next episode's token must reach nothing of this one's */
    lend_before_stop(l, &rec);
    r = store_delete_activation_of_sandbox(l->store, id, err);
    if (r < 0)
        goto out;
    struct lb_sandbox_ref ref = {id, old_desc};
    stop_start = clock_mono_ms();
    /* in place where the provider can (no bwrap, no new namespaces), else a stop and a create */
    r = provider_reset_in_place(prov, &ref, &rs.spec, NULL, l->cfg.stop_timeout_s * 1000, &perr);
    in_place = r == 0;
    if (r < 0 && r != -EOPNOTSUPP) {
        r = lb_error_set(err, -EREMOTEIO, "the sandbox could not be reset in place: %s",
                         perr.message);
        goto out;
    }
    if (!in_place) {
        lb_error_clear(&perr);
        r = provider_stop(prov, &ref, l->cfg.stop_timeout_s * 1000, &perr);
        if (r < 0) {
            r = lb_error_set(err, -EREMOTEIO, "the sandbox could not be stopped: %s", perr.message);
            goto out;
        }
        stopped = true;
    }
    t.stop_ms = clock_mono_ms() - stop_start;
    /* its PTY sessions end with the processes they ran */
    if (l->stopped_hook)
        l->stopped_hook(l->stopped_ctx, id);
    r = reset_remake(l, prov, id, &rs, spec, in_place, old_desc, &desc_text, &t, err);
    if (r < 0)
        goto out;
    /* complete: the record loses its "resetting" mark */
    json_object_del(spec, "resetting");
    free(spec_text);
    spec_text = json_dumps(spec, JSON_COMPACT);
    r = spec_text ? store_set_reset(l->store, id, spec_text, token_hash, true, err)
                  : lb_error_set(err, -ENOMEM, "out of memory");
    if (r < 0)
        goto out;
    store_record_release(&rec);
    r = lend_record_get(l, id, &rec, err);
    if (r == 0 && !(*lease_out = lend_render_lease(l, &rec, false)))
        r = lb_error_set(err, -ENOMEM, "out of memory");
    if (r == 0) {
        torn = false;
        lend_activity_seeded(l, &rec, spec); /* its idle clock starts again, not paused */
        log_info_sbx(id,
                     "sandbox %s reset%s%s%s in %" PRId64 " ms (%s %" PRId64 ", create %" PRId64
                     ", files %" PRId64 " ms)",
                     id, in_place ? " in place" : "", snapshot ? " to snapshot " : "",
                     snapshot ? snapshot : "", clock_mono_ms() - t.start_ms,
                     in_place ? "reset" : "stop", t.stop_ms, t.create_ms, t.files_ms);
    }
out:
    if (r < 0 && torn) {
        struct lb_error serr = {0};
        char why[LB_ERROR_MESSAGE_MAX];

        snprintf(why, sizeof(why), "%s", err && err->message[0] ? err->message : "unknown");
        /* never lend a half-reset sandbox: stop whatever is left of it (once the old one was
         * stopped, the provider finds what is there now from the id alone) */
        if (desc_text || stopped) {
            free(rec.descriptor_json);
            rec.descriptor_json = desc_text ? strdup(desc_text) : NULL;
        }
        if (lend_stop_record(l, &rec, "reset_failed", LB_STATE_STOP_FAILED, &serr) < 0)
            log_error_sbx(id, "sandbox %s: a failed reset's stop failed: %s", id, serr.message);
        log_warn_sbx(id, "reset of sandbox %s failed; it was stopped (reset_failed): %s", id, why);
        r = lb_error_set(err, -EREMOTEIO,
                         "reset of sandbox %s failed and it was stopped (reason reset_failed): %s",
                         id, why);
    }
    if (fenced)
        lend_fence_lower(l, id);
    reset_spec_release(&rs);
    json_decref(old_desc);
    json_decref(spec);
    free(spec_text);
    free(desc_text);
    store_record_release(&rec);
    lend_session_unlock(l, lock);
    return r;
}
