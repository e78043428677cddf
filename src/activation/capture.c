/*
 * capture.c - an activation's finalization: stop the harness if needed and hold its confirmed
 * receipt (the stop exec and the wait for the receipt; resuming a paused sandbox first, for
 * this and for execute.c's timeout), sweep the sandbox before a close collects, collect the
 * artifacts and the output log's tail into the record once, and record a close. At most one
 * finalization of an activation runs at a time (the entries below); a close that arrives
 * meanwhile joins it. Shares activation_internal.h.
 */
#include "activation/activation_internal.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"
#include "util/token.h"

/* The in-memory entry of the sandbox's activation, made on first use, with a reference the
 * caller drops with entry_put (the last one frees it). NULL out of memory. */
static struct act_entry *entry_get(struct lb_activations *a, const char *sandbox_id)
{
    struct act_entry *e;

    pthread_mutex_lock(&a->mutex);
    HASH_FIND_STR(a->entries, sandbox_id, e);
    if (!e) {
        e = calloc(1, sizeof(*e));
        if (e) {
            snprintf(e->sandbox_id, sizeof(e->sandbox_id), "%s", sandbox_id);
            HASH_ADD_STR(a->entries, sandbox_id, e);
        }
    }
    if (e)
        e->refs++;
    pthread_mutex_unlock(&a->mutex);
    return e;
}

static void entry_put(struct lb_activations *a, struct act_entry *e)
{
    pthread_mutex_lock(&a->mutex);
    if (--e->refs == 0) {
        HASH_DEL(a->entries, e);
        free(e);
    }
    pthread_mutex_unlock(&a->mutex);
}

/* A memory-limit kill ended the harness: it died of SIGKILL (128 + 9) on its own (no timeout,
 * no stop request) and the sandbox's OOM-kill count, stored in the spec when execute began,
 * has grown since. Then the receipt gets "oom_message" (stored with it, so the verdict
 * survives the sandbox and a restart). The count is the sandbox's: the harness's own
 * SIGKILL is what ties the kill to it, as for execs. */
static void act_note_oom(struct lb_activations *a, const struct lb_activation *act, json_t *receipt)
{
    json_t *spec = act->spec_json ? json_loads(act->spec_json, 0, NULL) : NULL;
    json_t *base = json_object_get(spec, "oom_kills_at_launch");
    json_t *rc = json_object_get(receipt, "return_code");
    uint64_t now = 0;
    int64_t limit = 0;
    char msg[200];

    if (json_is_integer(base) && json_is_integer(rc) && json_integer_value(rc) == 128 + SIGKILL &&
        !json_is_true(json_object_get(receipt, "timed_out")) &&
        !json_is_true(json_object_get(receipt, "stop_requested")) &&
        lend_sandbox_oom_kills(a->lend, act->sandbox_id, &now, &limit, NULL) == 0 &&
        now > (uint64_t)json_integer_value(base)) {
        if (limit > 0)
            snprintf(msg, sizeof(msg),
                     "the harness was killed by the out-of-memory killer: it reached the "
                     "sandbox's memory limit of %lld MiB",
                     (long long)(limit / (1024 * 1024)));
        else
            snprintf(msg, sizeof(msg), "the harness was killed by the out-of-memory killer");
        json_object_set_new(receipt, "oom_message", json_string(msg));
        log_info("activation %s: %s", act->id, msg);
    }
    json_decref(spec);
}

/* Store a receipt read from the file (with its OOM verdict): from then on the record's state
 * reads as the receipt's outcome. The file is written once, so storing it again (a GET and a
 * finalization at the same time) stores the same. 0 or an error of the store. */
int act_record_receipt(struct lb_activations *a, const struct lb_activation *act, json_t *receipt,
                       struct lb_error *err)
{
    char *text;
    int r;

    act_note_oom(a, act, receipt);
    text = json_dumps(receipt, JSON_COMPACT);
    r = text ? store_activation_set_receipt(a->store, act->id, text, err)
             : lb_error_set(err, -ENOMEM, "out of memory");
    free(text);
    return r;
}

bool act_sandbox_is_paused(struct lb_activations *a, const char *sandbox_id)
{
    json_t *status = NULL;
    const char *st;
    bool paused = lend_sandbox_status(a->lend, sandbox_id, &status, NULL) == 0 &&
                  (st = json_string_value(json_object_get(status, "status"))) &&
                  !strcmp(st, "paused");

    json_decref(status);
    return paused;
}

/* The harness's supervisor runs in the sandbox: frozen (paused), it can neither end the harness
 * nor write its receipt, so no wait for the receipt would end before its bound. Resume the
 * sandbox if it is paused (why says for the log). 0 (not paused, or resumed) or -EREMOTEIO
 * when the resume failed. */
int act_resume_paused(struct lb_activations *a, const struct lb_activation *act, const char *why,
                      struct lb_error *err)
{
    struct lb_error perr = {0};
    json_t *st = NULL;
    int r;

    if (!act_sandbox_is_paused(a, act->sandbox_id))
        return 0;
    log_info("activation %s: sandbox %s is paused; resuming it (%s)", act->id, act->sandbox_id,
             why);
    r = lend_set_paused(a->lend, act->sandbox_id, false, &st, &perr);
    json_decref(st);
    if (r < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot resume the paused sandbox: %s", perr.message);
    return 0;
}

/* Hold a confirmed receipt: read it, or request the stop and wait for it within budget_ms.
 * The receipt read is stored. 0 and *out, or -EREMOTEIO (502) when cleanup is unconfirmed. */
static int act_stop(struct lb_activations *a, const struct lb_activation *act, int64_t budget_ms,
                    json_t **out, struct lb_error *err)
{
    struct lb_error rerr = {0};
    int64_t deadline = clock_mono_ms() + budget_ms + RECEIPT_SLACK_MS, wait = POLL_FIRST_MS;
    json_t *receipt = NULL;
    int r = act_read_receipt(a, act, &receipt, &rerr);

    if (r == -ENOENT) {
        char dir[200];
        char *argv[] = {SUPERVISE_PATH, "--harness-stop", dir, NULL};
        struct lb_exec_params p = {.argv = argv, .timeout_ms = STOP_EXEC_TIMEOUT_MS};
        struct lb_exec_result res = {0};

        snprintf(dir, sizeof(dir), "%s/%s", ACT_DIR_PARENT, act->id);
        /* A paused sandbox's harness cannot run its TERM handler, nor can the stop request
         * be made (exec refuses a paused sandbox): resume it first. A pause that comes again
         * before the stop request ran is undone again, within the budget. */
        for (;;) {
            r = act_resume_paused(a, act, "to stop the harness", err);
            if (r < 0)
                break;
            log_info("activation %s: requesting the harness's stop", act->id);
            provider_exec_result_release(&res);
            memset(&res, 0, sizeof(res));
            r = lend_exec(a->lend, act->sandbox_id, &p, &res, err);
            if (r != -EBUSY || clock_mono_ms() >= deadline ||
                !act_sandbox_is_paused(a, act->sandbox_id))
                break;
            lb_error_clear(err);
        }
        if (r == 0 && (res.error_type != LB_EXEC_OK || res.return_code != 0))
            r = lb_error_set(err, -EREMOTEIO, "the stop request failed (exit %d): %.200s",
                             res.return_code, res.err.data ? res.err.data : "");
        /* "fenced" (the stop won the launch claim) is the sandbox's word: its claim is a file
         * in the sandbox that its root can rewrite after a real launch. Taken only while the
         * daemon never sent a launch (no host-side launch mark); once it did, the launch's own
         * outcome (the harness supervisor's receipt, or execute_launch's when the launch lost
         * the claim) is what is waited for. */
        if (r == 0 && res.out.data && strncmp(res.out.data, "fenced", 6) == 0 &&
            !act_launch_began(a, act->id))
            act_receipt_write_unlaunched(a, act->id, NULL); /* nothing was or will be launched */
        provider_exec_result_release(&res);
        if (r < 0)
            goto out;
        for (int64_t next_check = clock_mono_ms() + PAUSED_CHECK_MS;;) {
            int64_t now;

            lb_error_clear(&rerr);
            r = act_read_receipt(a, act, &receipt, &rerr);
            now = clock_mono_ms();
            if (r != -ENOENT || now >= deadline)
                break;
            if (now >= next_check) {
                /* paused again meanwhile: the supervisor's cleanup needs the sandbox running */
                (void)act_resume_paused(a, act, "the harness's cleanup is under way", NULL);
                next_check = clock_mono_ms() + PAUSED_CHECK_MS;
            }
            usleep((useconds_t)wait * 1000);
            wait = wait * 2 > POLL_MAX_MS ? POLL_MAX_MS : wait * 2;
        }
        if (r == -ENOENT) {
            r = lb_error_set(err, -EREMOTEIO,
                             "the harness supervisor wrote no receipt within %.1f s; its "
                             "cleanup is unconfirmed (close again to retry)",
                             (double)(budget_ms + RECEIPT_SLACK_MS) / 1000.0);
            goto out;
        }
    }
    if (r < 0) {
        r = lb_error_set(err, -EREMOTEIO, "%s; cleanup cannot be confirmed", rerr.message);
        goto out;
    }
    r = act_record_receipt(a, act, receipt, err);
    if (r < 0)
        goto out;
    if (!act_receipt_confirmed(receipt)) {
        const char *e = json_string_value(json_object_get(receipt, "error"));

        r = lb_error_set(err, -EREMOTEIO, "the harness's cleanup was not confirmed: %s",
                         e ? e : "no reason given");
        goto out;
    }
    *out = receipt;
    receipt = NULL;
out:
    json_decref(receipt);
    return r;
}

/* Before a close collects the artifacts: stop every sandbox process but its init (an
 * exclusive exec), so nothing the agent left running can still write what is collected. The
 * exec itself is a --harness-stop, which finds the receipt and exits 0 at once; it runs on the
 * sandbox's own root (agent_root), where the activation's directory is. */
static int act_sweep(struct lb_activations *a, const struct lb_activation *act,
                     struct lb_error *err)
{
    char dir[200];
    char *argv[] = {SUPERVISE_PATH, "--harness-stop", dir, NULL};
    struct lb_exec_params p = {.argv = argv,
                               .timeout_ms = STOP_EXEC_TIMEOUT_MS,
                               .exclusive = true,
                               .agent_root = true,
                               .sweep_only = true};
    struct lb_exec_result res = {0};
    int r;

    snprintf(dir, sizeof(dir), "%s/%s", ACT_DIR_PARENT, act->id);
    r = lend_exec(a->lend, act->sandbox_id, &p, &res, err);
    if (r == 0 && (res.error_type != LB_EXEC_OK || res.return_code != 0))
        r = lb_error_set(err, -EREMOTEIO, "the sweep before artifact capture failed (exit %d)",
                         res.return_code);
    provider_exec_result_release(&res);
    if (r == -EBUSY) {
        /* paused: frozen processes write nothing while the capture reads */
        json_t *st = NULL;
        const char *s;

        if (lend_sandbox_status(a->lend, act->sandbox_id, &st, NULL) == 0 &&
            (s = json_string_value(json_object_get(st, "status"))) && strcmp(s, "paused") == 0) {
            log_info("activation %s: the sandbox is paused; capturing without the sweep", act->id);
            r = 0;
        }
        json_decref(st);
        if (r == 0)
            return 0;
    }
    if (r == 0)
        log_info("activation %s: every sandbox process but init stopped before capture", act->id);
    return r;
}

/* Append "; msg" (or msg) to a capture error. */
static void capture_note(struct lb_buf *b, const char *msg)
{
    if (b->len)
        (void)lb_buf_append_capped(b, "; ", 2);
    (void)lb_buf_append_capped(b, msg, strlen(msg));
}

/* Collect every listed path and the output log's tail into the record, once. */
static int act_capture(struct lb_activations *a, const struct lb_activation *act, json_t *spec,
                       const json_t *receipt, struct lb_error *err)
{
    json_t *collect = json_object_get(spec, "collect"), *v, *artifacts = json_object();
    bool launched = !json_is_false(json_object_get(receipt, "launched"));
    struct lb_buf cap_err;
    unsigned char *log = NULL;
    size_t log_len = 0, total = 0, idx, n_got = 0;
    uint64_t log_size = 0;
    char *text = NULL, path[256];
    int r = 0;

    lb_buf_init(&cap_err, 4096);
    if (!artifacts) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    log_info("activation %s: collecting artifacts", act->id);
    json_array_foreach(collect, idx, v) {
        const char *p = json_string_value(v);
        struct lb_error ferr = {0};
        unsigned char *data = NULL;
        size_t len = 0;
        uint64_t size = 0;
        char *b64 = NULL;
        size_t b64_len = 0;
        int fr;

        if (!p)
            continue;
        if (!launched) {
            json_object_set_new(artifacts, p, json_null());
            continue;
        }
        fr = act_sandbox_read(a, act->sandbox_id, p, a->cfg.max_artifact_bytes, false, &data, &len,
                              &size, &ferr);
        if (fr == 0 && total + len > a->cfg.max_artifacts_bytes)
            fr = lb_error_set(&ferr, -EFBIG, "'%s' would pass the %zu-byte limit of all artifacts",
                              p, a->cfg.max_artifacts_bytes);
        if (fr == 0 && token_base64_encode(data, len, &b64, &b64_len) < 0)
            fr = lb_error_set(&ferr, -ENOMEM, "out of memory encoding '%s'", p);
        if (fr == 0) {
            total += len;
            n_got++;
            json_object_set_new(artifacts, p, json_pack("{s:s%}", "base64", b64, b64_len));
        } else {
            json_object_set_new(artifacts, p, json_null());
            if (fr != -ENOENT) {
                char msg[LB_ERROR_MESSAGE_MAX + 300];

                snprintf(msg, sizeof(msg), "'%s': %s", p, ferr.message);
                capture_note(&cap_err, msg);
            }
        }
        free(b64);
        free(data);
    }
    act_path(path, sizeof(path), act, "output.log");
    {
        struct lb_error lerr = {0};

        if (act_sandbox_read(a, act->sandbox_id, path, a->cfg.max_log_bytes, true, &log, &log_len,
                             &log_size, &lerr) < 0) {
            log = NULL;
            log_len = 0;
            log_size = 0;
        }
    }
    text = json_dumps(artifacts, JSON_COMPACT);
    if (!text) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    r = store_activation_set_capture(a->store, act->id, text, cap_err.len ? cap_err.data : NULL,
                                     log ? log : (const unsigned char *)"", log_len,
                                     (int64_t)log_size, err);
    if (r == 0)
        log_info("activation %s: collected %zu of %zu artifacts%s%s", act->id, n_got,
                 json_array_size(collect), cap_err.len ? "; " : "",
                 cap_err.len ? cap_err.data : "");
out:
    free(text);
    free(log);
    lb_buf_release(&cap_err);
    json_decref(artifacts);
    return r;
}

/* Record a capture that could not happen (sandbox gone, forced stop), unless one exists. */
void act_capture_unavailable(struct lb_activations *a, const struct lb_activation *act,
                             json_t *spec, const char *why)
{
    json_t *collect = json_object_get(spec, "collect"), *v, *artifacts = json_object();
    char *text;
    size_t idx;

    json_array_foreach(collect, idx, v)
        if (json_is_string(v))
            json_object_set_new(artifacts, json_string_value(v), json_null());
    text = json_dumps(artifacts, JSON_COMPACT);
    if (text)
        (void)store_activation_set_capture(a->store, act->id, text, why, NULL, 0, -1, NULL);
    free(text);
    json_decref(artifacts);
}

/* One finalization. The caller holds the activation's finalizing flag. */
static int act_finalize_once(struct lb_activations *a, const char *sandbox_id, const char *act_id,
                             enum fin_mode mode, int64_t budget_ms, struct lb_error *err)
{
    struct lb_activation act = {0};
    json_t *spec = NULL, *receipt = NULL;
    bool fenced = false;
    int r = store_get_activation_by_sandbox(a->store, sandbox_id, &act, err);

    if (r < 0)
        goto out;
    /* the sandbox's activation now may be another's (a reset removed act_id's, and the next
     * episode ran its own): never finalize that one for act_id's request */
    if (act_id && strcmp(act.id, act_id) != 0) {
        r = lb_error_set(err, -ENOENT, "activation %s is gone (sandbox %s was reset)", act_id,
                         sandbox_id);
        goto out;
    }
    if (act.state == LB_ACT_CLOSED)
        goto out;
    if (mode == FIN_CLOSE && act.state != LB_ACT_CLOSING) {
        r = store_activation_set_state(a->store, act.id, LB_ACT_CLOSING,
                                       LB_ACT_MASK(LB_ACT_STAGING) | LB_ACT_MASK(LB_ACT_RUNNING) |
                                           LB_ACT_MASK(LB_ACT_CLOSING),
                                       err);
        if (r < 0)
            goto out;
        log_info("activation %s: closing", act.id);
    }
    spec = act.spec_json ? json_loads(act.spec_json, 0, NULL) : json_object();
    if (!store_sandbox_is_lent(a->store, sandbox_id)) {
        /* The sandbox is gone, and every process of it with it. */
        if (mode == FIN_STOP)
            goto out;
        if (mode == FIN_EXECUTE) {
            r = lb_error_set(err, -ENOENT, "sandbox %s was stopped while the harness ran",
                             sandbox_id);
            goto out;
        }
        if (!act.artifacts_json)
            act_capture_unavailable(a, &act, spec, "sandbox stopped before artifact capture");
        goto close;
    }
    receipt = act.receipt_json ? json_loads(act.receipt_json, 0, NULL) : NULL;
    if (!act_receipt_confirmed(receipt)) {
        json_decref(receipt);
        receipt = NULL;
        r = act_stop(a, &act, budget_ms, &receipt, err);
        if (r < 0)
            goto out;
    }
    if (mode == FIN_STOP) /* NeMo Gym's stop_harness: the capture is close's (or a GET's) */
        goto out;
    if (mode == FIN_CLOSE) {
        /* the operate token stays fenced from the sweep to the end of the capture: nothing
         * of the agent (an upload) can write what is collected in between */
        r = lend_fence_raise(a->lend, act.sandbox_id, err);
        fenced = r == 0;
        if (r == 0)
            r = act_sweep(a, &act, err);
        if (r < 0)
            goto out;
    }
    if (!act.artifacts_json) {
        r = act_capture(a, &act, spec, receipt, err);
        if (r == -EALREADY)
            r = 0;
        if (r < 0)
            goto out;
    }
    if (fenced) {
        lend_fence_lower(a->lend, act.sandbox_id);
        fenced = false;
    }
close:
    if (mode == FIN_CLOSE) {
        r = store_activation_set_state(a->store, act.id, LB_ACT_CLOSED,
                                       LB_ACT_MASK(LB_ACT_CLOSING) | LB_ACT_MASK(LB_ACT_CLOSED),
                                       err);
        if (r == 0) {
            act_receipt_remove(a, act.id); /* its content is in the record */
            log_info("activation %s: closed", act.id);
        }
    }
out:
    if (fenced)
        lend_fence_lower(a->lend, act.sandbox_id);
    json_decref(receipt);
    json_decref(spec);
    store_activation_release(&act);
    return r;
}

/* Run a finalization, or join the one running: a close that joins a failed one shares its
 * failure; otherwise the joiner runs its own (which finds the work done and returns). */
int act_finalize(struct lb_activations *a, const char *sandbox_id, const char *act_id,
                 enum fin_mode mode, int64_t budget_ms, struct lb_error *err)
{
    struct act_entry *e = entry_get(a, sandbox_id);
    /* the running finalization is bounded (its stop exec, its receipt wait, the capture): wait
     * for it no longer than a finalization of our own could take, plus a margin */
    int64_t until_ms =
        clock_mono_ms() + budget_ms + RECEIPT_SLACK_MS + STOP_EXEC_TIMEOUT_MS + JOIN_SLACK_MS;
    struct timespec until = {.tv_sec = until_ms / 1000,
                             .tv_nsec = (long)(until_ms % 1000) * 1000000L};
    int r;

    if (!e)
        return lb_error_set(err, -ENOMEM, "out of memory");
    pthread_mutex_lock(&a->mutex);
    while (e->finalizing) {
        uint64_t gen = e->gen;

        while (e->finalizing && e->gen == gen) {
            if (pthread_cond_timedwait(&a->cond, &a->mutex, &until) == ETIMEDOUT && e->finalizing &&
                e->gen == gen) {
                pthread_mutex_unlock(&a->mutex);
                entry_put(a, e);
                return lb_error_set(err, -EBUSY,
                                    "another close of the harness in sandbox %s is still "
                                    "running; retry later",
                                    sandbox_id);
            }
        }
        if (mode == FIN_CLOSE && e->last_mode == FIN_CLOSE && e->last_rc < 0 && !e->finalizing) {
            r = e->last_rc;
            if (err)
                *err = e->last_err;
            pthread_mutex_unlock(&a->mutex);
            entry_put(a, e);
            return r;
        }
    }
    e->finalizing = true;
    pthread_mutex_unlock(&a->mutex);

    r = act_finalize_once(a, sandbox_id, act_id, mode, budget_ms, err);

    pthread_mutex_lock(&a->mutex);
    e->finalizing = false;
    e->gen++;
    e->last_rc = r;
    e->last_mode = mode;
    lb_error_clear(&e->last_err);
    if (r < 0 && err)
        e->last_err = *err;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mutex);
    entry_put(a, e);
    return r;
}
