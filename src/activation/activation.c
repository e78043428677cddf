/*
 * activation.c - the activation service (see activation.h): its state, the lookups the other
 * files share (the session's activation), and
 * the calls that act on an existing activation: close, GET, the long-poll watch, the log, stop
 * and the release hook.
 *
 * The pieces, in the order an activation meets them:
 *
 *   execute   (execute.c) record "staging" (intent first) -> write the stage files ->
 *             "running" (only from staging: a close that got in first fences the launch here)
 *             -> launch exec (lendbox-supervise --harness-launch, with --keep-background so the
 *             harness supervisor outlives the exec) -> poll receipt.json -> finalize.
 *   finalize  (capture.c; one at a time per activation) for a close: record "closing" first;
 *             then, unless a confirmed receipt is held: read the receipt, else run the stop exec
 *             (--harness-stop: stop request plus launch claim, so a launch that has not
 *             happened never will) and poll for the receipt within the close budget; then,
 *             once, collect the artifacts and the output log's tail into the record; for a
 *             close, record "closed". A failure leaves the record as it is, so the next close
 *             starts over; the capture's "at most once" is also held by the store.
 *   receipts  (receipt.c) where the receipt and the activation's files are, and reading them.
 *   answers   (render.c) the JSON of API.md from the record.
 *
 * The in-sandbox directory is /run/lendbox/<activation id>: /run is the sandbox's own tmpfs,
 * and the sandbox (not the daemon) keeps it, so it survives a daemon restart.
 */
#include "activation/activation_internal.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"

int activations_new(const struct lb_activation_config *cfg, struct lb_store *st,
                    struct lb_lend *lend, struct lb_activations **out, struct lb_error *err)
{
    struct lb_activations *a = calloc(1, sizeof(*a));

    if (!a)
        return lb_error_set(err, -ENOMEM, "out of memory");
    a->cfg = *cfg;
    if (!a->cfg.max_artifact_bytes)
        a->cfg.max_artifact_bytes = 16 * 1024 * 1024;
    if (!a->cfg.max_artifacts_bytes)
        a->cfg.max_artifacts_bytes = 4 * a->cfg.max_artifact_bytes;
    if (!a->cfg.max_log_bytes)
        a->cfg.max_log_bytes = 1024 * 1024;
    a->store = st;
    a->lend = lend;
    if (cfg->receipts_dir && !(a->receipts_dir = strdup(cfg->receipts_dir))) {
        free(a);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    a->cfg.receipts_dir = a->receipts_dir;
    pthread_mutex_init(&a->mutex, NULL);
    clock_cond_init_mono(&a->cond); /* act_finalize's deadlines */
    *out = a;
    return 0;
}

void activations_free(struct lb_activations *a)
{
    struct act_entry *e, *tmp;

    if (!a)
        return;
    HASH_ITER(hh, a->entries, e, tmp) {
        HASH_DEL(a->entries, e);
        free(e);
    }
    pthread_cond_destroy(&a->cond);
    pthread_mutex_destroy(&a->mutex);
    free(a->receipts_dir);
    free(a);
}

/* Re-read the activation of a sandbox into *act (released first). */
int act_reload(struct lb_activations *a, const char *sandbox_id, struct lb_activation *act,
               struct lb_error *err)
{
    char id[LB_ID_MAX];

    snprintf(id, sizeof(id), "%s", sandbox_id); /* sandbox_id may point into *act */
    store_activation_release(act);
    return store_get_activation_by_sandbox(a->store, id, act, err);
}

int act_reload_own(struct lb_activations *a, struct lb_activation *act, struct lb_error *err)
{
    char id[sizeof(act->id)];
    int r;

    snprintf(id, sizeof(id), "%s", act->id);
    r = act_reload(a, act->sandbox_id, act, err);
    if (r == 0 && strcmp(act->id, id) != 0) {
        r = lb_error_set(err, -ENOENT, "activation %s is gone (sandbox %s was reset)", id,
                         act->sandbox_id);
        store_activation_release(act);
    }
    return r;
}

/* Which activation is the session's: that of its lent sandbox if it has one (*by_sandbox,
 * key its id), else its newest (key rsid, at most 128 bytes: routes_rsid_is_valid). */
static void act_key(struct lb_activations *a, const char *rsid, bool *by_sandbox, char *key,
                    size_t size)
{
    struct lb_record live = {0};

    *by_sandbox = store_get_live_by_rsid(a->store, rsid, &live, NULL) == 0;
    snprintf(key, size, "%s", *by_sandbox ? live.id : rsid);
    store_record_release(&live);
}

/* The session's activation (act_key's). */
static int act_find_current(struct lb_activations *a, const char *rsid, struct lb_activation *act,
                            struct lb_error *err)
{
    char key[LB_ID_MAX + 160];
    bool by_sandbox;
    int r;

    act_key(a, rsid, &by_sandbox, key, sizeof(key));
    r = by_sandbox ? store_get_activation_by_sandbox(a->store, key, act, NULL)
                   : store_get_latest_activation(a->store, key, act, NULL);
    if (r == -ENOENT)
        return lb_error_set(err, -ENOENT, "session %s has no harness activation", rsid);
    return r < 0 ? lb_error_set(err, r, "cannot read the activation of session %s", rsid) : 0;
}

/* act_find_current's activation; own (NULL: whichever that is) names the one the caller was
 * let act on (activation_id_of; "": none): when the session's is another now, -ENOKEY (401),
 * as the operate token a reset revoked. */
static int act_find(struct lb_activations *a, const char *rsid, const char *own,
                    struct lb_activation *act, struct lb_error *err)
{
    int r = act_find_current(a, rsid, act, err);

    if (!own || (r == -ENOENT && !own[0]) || (r == 0 && strcmp(act->id, own) == 0) ||
        (r < 0 && r != -ENOENT))
        return r;
    if (r == 0)
        store_activation_release(act);
    return lb_error_set(err, -ENOKEY,
                        "the harness activation of session %s this operate token was for is gone "
                        "(its sandbox was reset)",
                        rsid);
}

/* Re-read *act after a finalization: for a caller bound to it (own), by its id (one a reset
 * removed is -ENOKEY, as own's revoked token); else the sandbox's activation, whichever it is. */
static int act_reload_for(struct lb_activations *a, struct lb_activation *act, const char *own,
                          struct lb_error *err)
{
    int r;

    if (!own)
        return act_reload(a, act->sandbox_id, act, err);
    r = act_reload_own(a, act, err);
    return r == -ENOENT ? lb_error_set(err, -ENOKEY,
                                       "the harness activation this operate token was for is "
                                       "gone (its sandbox was reset)")
                        : r;
}

int activation_id_of(struct lb_activations *a, const char *rsid, char *id, size_t size,
                     struct lb_error *err)
{
    char key[LB_ID_MAX + 160];
    bool by_sandbox;
    int r;

    /* the one act_find_current finds, reading the id alone (an activation's artifacts may be
     * large, and this runs for every operate-token request on it, outside the answer budget) */
    act_key(a, rsid, &by_sandbox, key, sizeof(key));
    r = store_get_activation_id(a->store, by_sandbox, key, id, size, err);
    if (r == -ENOENT) {
        lb_error_clear(err);
        return 0;
    }
    return r < 0 ? lb_error_set(err, r, "cannot read the activation of session %s", rsid) : 0;
}

static int64_t spec_ms(const json_t *spec, const char *key, int64_t def)
{
    json_t *v = json_object_get(spec, key);

    return json_is_integer(v) && json_integer_value(v) > 0 ? (int64_t)json_integer_value(v) : def;
}

/* ---------- close, get, release ---------- */

int activation_close(struct lb_activations *a, const char *rsid, const char *own,
                     int64_t timeout_ms, char **text, size_t *len, struct lb_error *err)
{
    struct lb_activation act = {0};
    json_t *spec = NULL, *out = NULL;
    char *raw = NULL;
    int r = act_find(a, rsid, own, &act, err);

    *text = NULL;
    *len = 0;
    if (r == -ENOENT) {
        *text = strdup("{\"closed\":false}");
        *len = *text ? strlen(*text) : 0;
        return *text ? 0 : lb_error_set(err, -ENOMEM, "out of memory");
    }
    if (r < 0)
        return r;
    if (act.state != LB_ACT_CLOSED) {
        spec = act.spec_json ? json_loads(act.spec_json, 0, NULL) : NULL;
        if (timeout_ms <= 0)
            timeout_ms = spec_ms(spec, "close_timeout_ms", 60000);
        r = act_finalize(a, act.sandbox_id, act.id, FIN_CLOSE, timeout_ms, err);
        if (r == 0)
            r = act_reload_for(a, &act, own, err);
    }
    if (r == 0) {
        raw = act.artifacts_json; /* spliced in, not parsed */
        act.artifacts_json = NULL;
        out = act_render_close(&act);
        if (!out)
            r = lb_error_set(err, -ENOMEM, "out of memory");
    }
    if (r == 0) {
        if (raw)
            json_object_del(out, "artifacts");
        r = act_render_text(out, raw, text, len, err);
        raw = NULL;
    }
    free(raw);
    json_decref(out);
    json_decref(spec);
    store_activation_release(&act);
    return r;
}

/* Has the harness of act not ended yet, as far as the record and its receipt file tell? */
static bool act_open(struct lb_activations *a, const struct lb_activation *act)
{
    json_t *receipt = NULL;
    bool open = !act->receipt_json && act->state != LB_ACT_CLOSED &&
                act_read_receipt(a, act, &receipt, NULL) == -ENOENT;

    json_decref(receipt);
    return open;
}

struct lb_activation_watch {
    struct lb_activations *a;
    char act_id[LB_ID_MAX];
    char sandbox_id[LB_ID_MAX];
    enum lb_act_state state;
};

int activation_watch_begin(struct lb_activations *a, const char *rsid, const char *own,
                           struct lb_activation_watch **out, struct lb_error *err)
{
    struct lb_activation act = {0};
    struct lb_activation_watch *w = NULL;
    int r = act_find(a, rsid, own, &act, err);

    *out = NULL;
    if (r < 0)
        return r;
    if (act_open(a, &act) && !lend_is_draining(a->lend)) {
        w = calloc(1, sizeof(*w));
        if (!w) {
            r = lb_error_set(err, -ENOMEM, "out of memory");
            goto out;
        }
        w->a = a;
        w->state = act.state;
        snprintf(w->act_id, sizeof(w->act_id), "%s", act.id);
        snprintf(w->sandbox_id, sizeof(w->sandbox_id), "%s", act.sandbox_id);
        *out = w;
    }
out:
    store_activation_release(&act);
    return r;
}

bool activation_watch_changed(struct lb_activation_watch *w)
{
    struct lb_activation cur = {0};
    bool changed;

    if (lend_is_draining(w->a->lend))
        return true;
    changed = store_get_activation_by_sandbox(w->a->store, w->sandbox_id, &cur, NULL) < 0 ||
              strcmp(cur.id, w->act_id) != 0 || cur.state != w->state || !act_open(w->a, &cur) ||
              !store_sandbox_is_lent(w->a->store, w->sandbox_id);
    store_activation_release(&cur);
    return changed;
}

void activation_watch_free(struct lb_activation_watch *w)
{
    free(w);
}

/* The session's activation as JSON in *out; the stored artifacts are not parsed but handed
 * over as their JSON text in *raw (NULL when not collected: then "artifacts" stays in *out),
 * and *out lacks "artifacts". */
static int act_get(struct lb_activations *a, const char *rsid, const char *own, bool with_log,
                   json_t **out, char **raw, struct lb_error *err)
{
    struct lb_activation act = {0};
    json_t *spec = NULL, *receipt = NULL, *res = NULL;
    char *art_text = NULL;
    bool live, collected;
    int r = act_find(a, rsid, own, &act, err);

    if (r < 0)
        return r;
    live = act.state != LB_ACT_CLOSED && store_sandbox_is_lent(a->store, act.sandbox_id);
    /* A receipt that came while nobody waited (the execute's caller went away, the daemon
     * was restarted): recorded now, so the state follows it from here on. */
    if (!act.receipt_json && (act.state == LB_ACT_RUNNING || act.state == LB_ACT_CLOSING) &&
        act_read_receipt(a, &act, &receipt, NULL) == 0 &&
        act_record_receipt(a, &act, receipt, NULL) == 0)
        act.receipt_json = json_dumps(receipt, JSON_COMPACT);
    spec = act.spec_json ? json_loads(act.spec_json, 0, NULL) : json_object();
    /* "wait": false: nobody waits to collect, so the first GET that finds the harness ended
     * (its cleanup confirmed) collects, once, as execute would have */
    if (json_is_true(json_object_get(spec, "nowait")) && act.state == LB_ACT_RUNNING &&
        !act.artifacts_json && act.receipt_json && live) {
        json_t *held = json_loads(act.receipt_json, 0, NULL);
        struct lb_error ferr = {0};

        if (act_receipt_confirmed(held) &&
            act_finalize(a, act.sandbox_id, act.id, FIN_EXECUTE,
                         spec_ms(spec, "close_timeout_ms", 60000), &ferr) < 0)
            log_warn("activation %s: collecting after the harness ended failed: %s", act.id,
                     ferr.message);
        json_decref(held);
        r = act_reload_for(a, &act, own, err);
        if (r < 0)
            goto out;
    }
    collected = act.artifacts_json != NULL;
    if (raw) { /* not parsed: the caller splices the text in */
        art_text = act.artifacts_json;
        act.artifacts_json = NULL;
    }
    res = act_render_result(&act, NULL);
    if (!res) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    if (!act.receipt_json) {
        json_object_set_new(res, "state", json_null());
        json_object_set_new(res, "error", json_null());
    }
    json_object_set_new(res, "outcome", json_incref(json_object_get(res, "state")));
    /* running with a receipt: the harness has ended, and the state says how (as execute did) */
    if (act.state != LB_ACT_RUNNING || !act.receipt_json)
        json_object_set_new(res, "state", json_string(store_act_state_name(act.state)));
    json_object_del(res, "output_log_tail");
    if (!collected)
        json_object_set_new(res, "artifacts", json_null());
    else if (raw)
        json_object_del(res, "artifacts");
    json_object_set_new(res, "artifacts_collected", json_boolean(collected));
    json_object_set_new(res, "resources_session_id", json_string(act.rsid ? act.rsid : ""));
    json_object_set_new(res, "sandbox_id", json_string(act.sandbox_id));
    json_object_set_new(res, "argv", json_incref(json_object_get(spec, "argv")));
    json_object_set_new(res, "collect", json_incref(json_object_get(spec, "collect")));
    json_object_set_new(res, "timeout_s",
                        json_real((double)spec_ms(spec, "timeout_ms", 0) / 1000.0));
    json_object_set_new(res, "close_timeout_s",
                        json_real((double)spec_ms(spec, "close_timeout_ms", 0) / 1000.0));
    {
        char stop_path[256];

        act_path(stop_path, sizeof(stop_path), &act, "stop.request");
        json_object_set_new(res, "stop_request_path", json_string(stop_path));
        json_object_set_new(res, "wait",
                            json_boolean(!json_is_true(json_object_get(spec, "nowait"))));
    }
    json_object_set_new(res, "created_at", clock_json_rfc3339(act.created_at));
    json_object_set_new(res, "updated_at", clock_json_rfc3339(act.updated_at));
    if (with_log) {
        unsigned char *log = NULL;
        size_t len = 0;
        uint64_t size = 0;
        char path[256];

        act_path(path, sizeof(path), &act, "output.log");
        if (live && act_sandbox_read(a, act.sandbox_id, path, a->cfg.max_log_bytes, true, &log,
                                     &len, &size, NULL) == 0) {
            json_object_set_new(res, "log", act_json_text(log, len));
            json_object_set_new(res, "log_truncated", json_boolean(size > len));
            json_object_set_new(res, "output_log_bytes", json_integer((json_int_t)size));
        } else {
            json_object_set_new(res, "log", act_json_text(act.log, act.log_len));
            json_object_set_new(res, "log_truncated",
                                json_boolean(act.output_log_bytes > (int64_t)act.log_len));
        }
        free(log);
    }
    *out = res;
    res = NULL;
    if (raw) {
        *raw = art_text;
        art_text = NULL;
    }
out:
    free(art_text);
    json_decref(res);
    json_decref(receipt);
    json_decref(spec);
    store_activation_release(&act);
    return r;
}

int activation_get_text(struct lb_activations *a, const char *rsid, const char *own, bool with_log,
                        char **text, size_t *len, struct lb_error *err)
{
    json_t *res = NULL;
    char *raw = NULL;
    int r = act_get(a, rsid, own, with_log, &res, &raw, err);

    *text = NULL;
    *len = 0;
    if (r == 0)
        r = act_render_text(res, raw, text, len, err);
    json_decref(res);
    return r;
}

int activation_answer_bytes(struct lb_activations *a, const char *rsid, bool with_log,
                            uint64_t *bytes, struct lb_error *err)
{
    uint64_t text = 0;
    int r = store_activation_text_bytes(a->store, rsid, &text, err);

    if (r < 0)
        return r;
    /* the stored texts loaded and copied into the answer, a live log's tail read and escaped
     * (\u00XX: 6 bytes for one), and the fixed fields */
    *bytes = 2 * text + (with_log ? 7 * (uint64_t)a->cfg.max_log_bytes : 0) + 4096;
    return 0;
}

int activation_open_log(struct lb_activations *a, const char *rsid, const char *own, int *fd,
                        struct lb_error *err)
{
    struct lb_activation act = {0};
    char path[256];
    uint64_t size = 0;
    int r = act_find(a, rsid, own, &act, err);

    *fd = -1;
    if (r < 0)
        return r;
    if (act.state == LB_ACT_CLOSED || !store_sandbox_is_lent(a->store, act.sandbox_id)) {
        r = lb_error_set(err, -ENOENT,
                         "the activation of session %s is over: its log is in the record "
                         "(GET .../activation?log=1)",
                         rsid);
    } else {
        act_path(path, sizeof(path), &act, "output.log");
        r = lend_file_open(a->lend, act.sandbox_id, path, fd, &size, err);
    }
    store_activation_release(&act);
    return r;
}

int activation_stop_harness(struct lb_activations *a, const char *rsid, const char *own,
                            int64_t timeout_ms, char **text, size_t *len, struct lb_error *err)
{
    struct lb_activation act = {0};
    json_t *spec = NULL;
    int r = act_find(a, rsid, own, &act, err);

    *text = NULL;
    *len = 0;
    if (r < 0)
        return r;
    /* nothing to do once the receipt is held, the activation closed or the sandbox gone */
    if (act.state != LB_ACT_CLOSED && !act.receipt_json &&
        store_sandbox_is_lent(a->store, act.sandbox_id)) {
        spec = act.spec_json ? json_loads(act.spec_json, 0, NULL) : NULL;
        if (timeout_ms <= 0)
            timeout_ms = spec_ms(spec, "close_timeout_ms", 60000);
        log_info("activation %s: stop_harness", act.id);
        r = act_finalize(a, act.sandbox_id, act.id, FIN_STOP, timeout_ms, err);
    }
    json_decref(spec);
    if (r == 0 && own) /* rendered: the one stopped, or -ENOKEY */
        own = act.id;
    if (r == 0)
        r = activation_get_text(a, rsid, own, false, text, len, err);
    store_activation_release(&act);
    return r;
}

void activation_release_hook(void *ctx, const char *rsid, const char *sandbox_id)
{
    struct lb_activations *a = ctx;
    struct lb_activation act = {0};
    struct lb_error err = {0};
    json_t *spec = NULL;
    int r;

    if (store_get_activation_by_sandbox(a->store, sandbox_id, &act, NULL) < 0)
        return;
    if (act.state == LB_ACT_CLOSED)
        goto out;
    spec = act.spec_json ? json_loads(act.spec_json, 0, NULL) : NULL;
    log_info("session %s: closing activation %s before the release", rsid, act.id);
    r = act_finalize(a, sandbox_id, NULL, FIN_CLOSE, spec_ms(spec, "close_timeout_ms", 60000),
                     &err);
    if (r < 0) {
        /* The sandbox's stop ends every process of it: the teardown is the authority. */
        log_warn("activation %s: close before the release failed: %s; the stop goes ahead", act.id,
                 err.message);
        act_capture_unavailable(a, &act, spec, "artifact capture unavailable during forced stop");
        (void)store_activation_set_state(a->store, act.id, LB_ACT_CLOSED,
                                         LB_ACT_MASK(LB_ACT_STAGING) | LB_ACT_MASK(LB_ACT_RUNNING) |
                                             LB_ACT_MASK(LB_ACT_CLOSING),
                                         NULL);
        act_receipt_remove(a, act.id); /* the sandbox's stop ends its supervisor */
    }
out:
    json_decref(spec);
    store_activation_release(&act);
}
