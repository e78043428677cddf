/*
 * execute.c - activation_execute: record the activation ("staging", intent first), stage its
 * files, launch the harness under lendbox-supervise --harness-launch, wait for its receipt (or
 * the deadline) and finalize it (capture.c). Shares activation_internal.h.
 */
#include "activation/activation_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"
#include "util/token.h"

static json_t *execute_spec(const struct lb_execute_request *req, const char *dir)
{
    json_t *argv = json_array(), *collect = json_array(), *stage = json_array(), *spec;

    for (size_t i = 0; req->argv[i]; i++)
        json_array_append_new(argv, json_string(req->argv[i]));
    for (size_t i = 0; req->collect && req->collect[i]; i++)
        json_array_append_new(collect, json_string(req->collect[i]));
    for (size_t i = 0; i < req->n_stage; i++)
        json_array_append_new(stage, json_string(req->stage[i].path));
    spec = json_pack("{s:o,s:s?,s:O?,s:s?,s:o,s:o,s:I,s:I,s:s}", "argv", argv, "cwd", req->cwd,
                     "env", req->env, "user", req->user, "collect", collect, "stage", stage,
                     "timeout_ms", (json_int_t)req->timeout_ms, "close_timeout_ms",
                     (json_int_t)req->close_timeout_ms, "dir", dir);
    if (spec && req->nowait)
        json_object_set_new(spec, "nowait", json_true());
    return spec;
}

/* Launch the harness. receipt_file: where the harness supervisor writes its receipt inside
 * the sandbox (a receipt_file provider), NULL: to the host-side file passed as its fd 4. 0
 * launched, -EALREADY fenced by a close, else *why says what failed (and the outcome is
 * unknown when the transport failed). */
static int execute_launch(struct lb_activations *a, const struct lb_activation *act,
                          const struct lb_execute_request *req, const char *dir,
                          const char *receipt_file, char *why, size_t why_len)
{
    int receipt_fd = act_receipt_create(a, act->id);
    struct lb_exec_result res = {0};
    struct lb_error err = {0};
    char t_ms[32], c_ms[32], *user = NULL;
    size_t n = 0, k = 0;
    char **argv;
    int r;

    if (receipt_fd < 0) {
        snprintf(why, why_len, "cannot create the receipt file: %s", strerror(-receipt_fd));
        return receipt_fd;
    }
    /* the harness's user: the request's, else the image's User, else root */
    r = lend_exec_user(a->lend, act->sandbox_id, req->user, &user, &err);
    if (r < 0) {
        close(receipt_fd);
        snprintf(why, why_len, "%s", err.message);
        return r;
    }
    while (req->argv[n])
        n++;
    argv = calloc(n + 14, sizeof(*argv));
    if (!argv) {
        free(user);
        close(receipt_fd);
        snprintf(why, why_len, "out of memory");
        return -ENOMEM;
    }
    snprintf(t_ms, sizeof(t_ms), "%lld", (long long)req->timeout_ms);
    snprintf(c_ms, sizeof(c_ms), "%lld",
             (long long)(req->close_timeout_ms / 3 > 0 ? req->close_timeout_ms / 3 : 1));
    argv[k++] = SUPERVISE_PATH;
    argv[k++] = "--harness-launch";
    argv[k++] = (char *)dir;
    argv[k++] = "--timeout-ms";
    argv[k++] = t_ms;
    argv[k++] = "--cleanup-timeout-ms";
    argv[k++] = c_ms;
    if (req->cwd) {
        /* the launcher enters it before its claim: a bad cwd is its exit 5, not a sandbox error
         * (which the daemon also gives for a launch exec whose supervisor was stopped or killed
         * after the claim, and so cannot take as "nothing claimed") */
        argv[k++] = "--cwd";
        argv[k++] = (char *)req->cwd;
    }
    if (receipt_file) {
        argv[k++] = "--receipt-file"; /* the host-side file stays the daemon's own */
        argv[k++] = (char *)receipt_file;
    } else {
        argv[k++] = "--receipt-fd"; /* the host-side receipt, passed as fd 4 */
        argv[k++] = "4";
    }
    if (user) {
        /* the harness runs as the user; the launcher (which makes the activation's directory
         * under the root-owned /run/lendbox) and the harness supervisor stay the sandbox's
         * root */
        argv[k++] = "--user";
        argv[k++] = user;
    }
    argv[k++] = "--";
    for (size_t i = 0; i < n; i++)
        argv[k++] = req->argv[i];
    argv[k] = NULL;

    /* the harness's environment: the request's, then where its stop request appears (NeMo
     * Gym's stop_request_path) */
    json_t *env = req->env ? json_deep_copy(req->env) : json_object();
    char stop_path[256];

    snprintf(stop_path, sizeof(stop_path), "%s/stop.request", dir);
    if (!env || json_object_set_new(env, "LENDBOX_STOP_REQUEST", json_string(stop_path)) < 0 ||
        json_object_set_new(env, "LENDBOX_ACTIVATION_ID", json_string(act->id)) < 0) {
        json_decref(env);
        free(user);
        free(argv);
        close(receipt_fd);
        snprintf(why, why_len, "out of memory");
        return -ENOMEM;
    }
    struct lb_exec_params p = {
        .argv = argv,
        .cwd = req->cwd ? "/" : NULL,
        .env = env,
        .user = "0", /* the launcher (root; the supervisor leaves it its capabilities): the
                        harness's user is its --user */
        /* the launcher returns once the harness supervisor runs: bounded by the harness's
         * own timeout (plus slack), so a pause during the launch ends it that much sooner */
        .timeout_ms = req->timeout_ms + LAUNCH_SLACK_MS < LAUNCH_TIMEOUT_MS
                          ? req->timeout_ms + LAUNCH_SLACK_MS
                          : LAUNCH_TIMEOUT_MS,
        .preserve_background = true,
        .pass_fd = receipt_file ? 0 : receipt_fd,
        .fence_held = req->fence_held,
    };
    /* from here a stop's "fenced" is not the sandbox's to say (act_stop) */
    r = act_launch_mark(a, act->id, true);
    if (r < 0) {
        json_decref(env);
        free(user);
        free(argv);
        close(receipt_fd);
        snprintf(why, why_len, "cannot make the launch mark: %s", strerror(-r));
        return r;
    }
    r = lend_exec(a->lend, act->sandbox_id, &p, &res, &err);
    /* the launcher certainly took no claim: the exec was refused before it ran (paused), it was
     * not found or not executable (127, 126), or it failed before claiming (5, a bad cwd
     * included): each the launcher's own status. A stop's "fenced" is then true again. Any
     * other outcome keeps the mark: launched, failed after the claim, timed out, or a sandbox
     * error, which the daemon also notes for a launch exec whose supervisor a sandbox process
     * stopped or killed after the claim (outcome unknown). */
    if (r == -EBUSY || (r == 0 && res.error_type == LB_EXEC_OK &&
                        (res.return_code == 5 || res.return_code == 126 || res.return_code == 127)))
        (void)act_launch_mark(a, act->id, false);
    if (r < 0) {
        snprintf(why, why_len, "the launch failed: %s", err.message);
    } else if (res.error_type == LB_EXEC_OK && res.return_code == 4) {
        /* we launch once: a claim there before us was made by a sandbox process */
        r = -EREMOTEIO;
        snprintf(why, why_len,
                 "a sandbox process took the launch claim; the harness was not "
                 "launched");
        act_receipt_write_unlaunched(a, act->id, why);
    } else if (res.error_type == LB_EXEC_OK && res.return_code == 0) {
        log_info("activation %s: launched (%.*s)", act->id,
                 (int)strcspn(res.out.data ? res.out.data : "", "\n"),
                 res.out.data ? res.out.data : "");
    } else if (res.error_type == LB_EXEC_OK && res.return_code == 3) {
        r = -EALREADY;
        act_receipt_write_unlaunched(a, act->id, NULL);
        snprintf(why, why_len, "the activation was closed before the harness was launched");
    } else {
        const char *msg = res.err.data && res.err.len ? res.err.data : res.out.data;

        r = -EREMOTEIO;
        snprintf(why, why_len, "the launch failed (exit %d): %.400s", res.return_code,
                 msg ? msg : "");
        why[strcspn(why, "\n")] = '\0';
    }
    provider_exec_result_release(&res);
    json_decref(env);
    free(argv);
    free(user);
    close(receipt_fd); /* the harness supervisor holds its own */
    return r;
}

/* Wait for the receipt until deadline_ms: 0 when it is there, -ETIMEDOUT, -ESHUTDOWN
 * (draining) or -ENOENT (the sandbox is gone). From PAUSED_RESUME_MS past timeout_at_ms (the
 * harness's own deadline) on, a paused sandbox is resumed (and again if it is paused again),
 * so that the supervisor ends the harness at its timeout whatever the sandbox's state. */
static int execute_wait(struct lb_activations *a, const struct lb_activation *act,
                        int64_t timeout_at_ms, int64_t deadline_ms)
{
    int64_t wait = POLL_FIRST_MS, pause_check = timeout_at_ms + PAUSED_RESUME_MS;

    for (;;) {
        json_t *receipt = NULL;
        int r = act_read_receipt(a, act, &receipt, NULL);

        json_decref(receipt);
        if (r != -ENOENT)
            return 0; /* there (readable or not: finalization judges it) */
        {
            /* a close (or a GET) may have recorded it first; a closed one's file is gone; a
             * reset removes it (the sandbox's activation is then none, or the next episode's) */
            struct lb_activation cur = {0};
            int gr = store_get_activation_by_sandbox(a->store, act->sandbox_id, &cur, NULL);
            bool ours = gr == 0 && strcmp(cur.id, act->id) == 0;
            bool held = ours && (cur.receipt_json || cur.state == LB_ACT_CLOSED);

            store_activation_release(&cur);
            if (held)
                return 0;
            if (gr == -ENOENT || (gr == 0 && !ours))
                return -ENOENT;
        }
        if (!store_sandbox_is_lent(a->store, act->sandbox_id))
            return -ENOENT;
        if (lend_is_draining(a->lend))
            return -ESHUTDOWN;
        if (clock_mono_ms() >= deadline_ms)
            return -ETIMEDOUT;
        if (clock_mono_ms() >= pause_check) {
            struct lb_error perr = {0};

            if (act_resume_paused(a, act, "the harness's timeout_s has passed", &perr) < 0)
                log_warn("activation %s: %s", act->id, perr.message);
            pause_check = clock_mono_ms() + PAUSED_CHECK_MS;
        }
        usleep((useconds_t)wait * 1000);
        wait = wait * 2 > POLL_MAX_MS ? POLL_MAX_MS : wait * 2;
    }
}

/* Stage the files; stops early (-EALREADY) when a close got in. */
static int execute_stage(struct lb_activations *a, const struct lb_activation *act,
                         const struct lb_execute_request *req, struct lb_error *err)
{
    for (size_t i = 0; i < req->n_stage; i++) {
        const struct lb_seed_file *f = &req->stage[i];
        struct lb_activation cur = {0};
        bool closing =
            store_get_activation_by_sandbox(a->store, act->sandbox_id, &cur, NULL) == 0 &&
            cur.state != LB_ACT_STAGING;
        int r;

        store_activation_release(&cur);
        if (closing)
            return lb_error_set(err, -EALREADY, "activation %s was closed while staging", act->id);
        struct lb_error werr = {0};

        /* an execute admitted before an exclusive exec began stages nothing once it runs */
        r = lend_fence_enter(a->lend, act->sandbox_id, &werr);
        if (r == 0) {
            r = lend_file_write(a->lend, act->sandbox_id, f->path, f->data, f->len, f->mode, &werr);
            lend_fence_leave(a->lend, act->sandbox_id);
        }
        if (r == -EBUSY)
            return lb_error_set(err, r, "%s", werr.message);
        if (r < 0)
            return lb_error_set(err, r, "staging '%s' failed: %s", f->path, werr.message);
    }
    return 0;
}

int activation_execute(struct lb_activations *a, const char *rsid,
                       const struct lb_execute_request *req, json_t **out, struct lb_error *err)
{
    struct lb_activation act = {0};
    struct lb_record live = {0};
    struct lb_error ferr = {0};
    json_t *spec = NULL, *status = NULL;
    char *spec_text = NULL, dir[200], receipt_file[240], why[600] = "", sid[31];
    const char *st;
    bool receipt_in_sbx = false;
    int64_t phase_ms, deadline, launched_at;
    int r;

    *out = NULL;
    if (lend_is_draining(a->lend))
        return lb_error_set(err, -ESHUTDOWN, "the daemon is draining; no new activations");
    if (store_get_live_by_rsid(a->store, rsid, &live, NULL) < 0 || live.state != LB_STATE_LENT) {
        r = lb_error_set(err, -ENOENT, "session %s has no lent sandbox", rsid);
        goto out;
    }
    {
        /* the receipt channel: a daemon file passed to the harness supervisor (pass_fd), or
         * else a file inside the sandbox read back through the files API (receipt_file, lxd);
         * a provider with neither cannot run activations */
        struct lb_provider *prov = lend_provider_of(a->lend, &live, NULL);
        struct lb_provider_caps caps;

        provider_caps(prov, &caps);
        if (prov && !caps.pass_fd && !caps.receipt_file) {
            r = lb_error_set(err, -ENOSYS,
                             "harness activations are not available on provider '%s' (it cannot "
                             "pass the receipt file to the harness supervisor)",
                             prov->ops->name);
            goto out;
        }
        receipt_in_sbx = prov && !caps.pass_fd;
    }
    if (lend_sandbox_status(a->lend, live.id, &status, NULL) == 0 &&
        (st = json_string_value(json_object_get(status, "status"))) && !strcmp(st, "paused")) {
        r = lb_error_set(err, -EBUSY, "sandbox %s is paused; resume it first", live.id);
        goto out;
    }
    r = token_new_sandbox_id(sid);
    if (r < 0) {
        r = lb_error_set(err, r, "cannot make an activation id");
        goto out;
    }
    snprintf(act.id, sizeof(act.id), "act-%s", sid + 4);
    snprintf(act.sandbox_id, sizeof(act.sandbox_id), "%s", live.id);
    snprintf(dir, sizeof(dir), "%s/%s", ACT_DIR_PARENT, act.id);
    snprintf(receipt_file, sizeof(receipt_file), "%s/receipt.json", dir);
    act.rsid = (char *)rsid;
    act.state = LB_ACT_STAGING;
    act.output_log_bytes = -1;
    spec = execute_spec(req, dir);
    if (spec && receipt_in_sbx &&
        json_object_set_new(spec, "receipt_file", json_string(receipt_file)) < 0) {
        json_decref(spec);
        spec = NULL;
    }
    {
        /* the OOM-kill count now, kept with the spec: act_note_oom compares at the end */
        uint64_t oom_kills = 0;

        if (spec && lend_sandbox_oom_kills(a->lend, live.id, &oom_kills, NULL, NULL) == 0)
            json_object_set_new(spec, "oom_kills_at_launch", json_integer((json_int_t)oom_kills));
    }
    spec_text = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
    if (!spec_text) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        act.rsid = NULL;
        goto out;
    }
    act.spec_json = spec_text;
    /* Intent first; the unique index makes a second execute of this sandbox a 409. */
    r = store_insert_activation(a->store, &act, err);
    act.rsid = NULL;
    spec_text = NULL; /* act's now: act_read_receipt finds its receipt_file there */
    if (r == -EEXIST) {
        r = lb_error_set(err, -EEXIST,
                         "session %s already ran a harness in sandbox %s (one activation per "
                         "lent sandbox)",
                         rsid, live.id);
        goto out;
    }
    if (r < 0)
        goto out;
    log_info("activation %s: staging %zu files in sandbox %s (session %s)", act.id, req->n_stage,
             live.id, rsid);
    r = execute_stage(a, &act, req, err);
    if (r < 0)
        goto out;
    r = store_activation_set_state(a->store, act.id, LB_ACT_RUNNING, LB_ACT_MASK(LB_ACT_STAGING),
                                   err);
    if (r == -EBUSY) {
        r = lb_error_set(err, -EALREADY, "activation %s was closed before the launch", act.id);
        goto out;
    }
    if (r < 0)
        goto out;

    phase_ms = req->close_timeout_ms / 3 > 0 ? req->close_timeout_ms / 3 : 1;
    launched_at = clock_mono_ms();
    deadline = launched_at + req->timeout_ms + 3 * phase_ms + EXECUTE_SLACK_MS;
    r = execute_launch(a, &act, req, dir, receipt_in_sbx ? receipt_file : NULL, why, sizeof(why));
    if (r == -EALREADY) {
        r = lb_error_set(err, -EALREADY, "activation %s: %s", act.id, why);
        goto out;
    }
    if (r == -EBUSY) {
        /* Refused before anything ran (a pause won the race with this launch): a 409, as an
         * execute of a paused sandbox is. Nothing to end now, and nothing can be ended in a
         * paused sandbox; a close (after a resume) fences the launch claim and records it. */
        r = lb_error_set(err, -EBUSY,
                         "activation %s: the harness was not launched (%s); close the activation "
                         "once the sandbox is resumed",
                         act.id, why);
        goto out;
    }
    if (r < 0) {
        /* Launched or not, end it (the stop's claim fences a launch that has not happened). */
        log_warn("activation %s: %s", act.id, why);
    } else if (req->nowait) {
        /* "wait": false: the client polls GET .../activation, which collects; the harness's
         * own supervisor enforces its timeout inside the sandbox */
        *out = json_pack("{s:s,s:s}", "activation_id", act.id, "state", "running");
        goto out;
    } else {
        r = execute_wait(a, &act, launched_at + req->timeout_ms, deadline);
        if (r == -ESHUTDOWN) {
            r = lb_error_set(err, -ESHUTDOWN,
                             "the daemon is shutting down before activation %s ended; after "
                             "the restart, GET the activation or close it",
                             act.id);
            goto out;
        }
        if (r == -ENOENT) {
            /* Stopped under us; a release closed the activation first, if it ran. */
            r = act_reload_own(a, &act, err);
            if (r == 0)
                *out = act_render_result(&act, act.receipt_json ? NULL
                                                                : "the sandbox was stopped before "
                                                                  "the harness ended");
            goto out;
        }
        if (r == -ETIMEDOUT) {
            log_warn("activation %s: no receipt by the execution deadline; stopping it", act.id);
            snprintf(why, sizeof(why), "the harness supervisor exceeded its execution deadline");
        }
    }
    r = act_finalize(a, act.sandbox_id, act.id, FIN_EXECUTE, req->close_timeout_ms, &ferr);
    if (r < 0 && why[0]) {
        r = lb_error_set(err, -EREMOTEIO, "%s; and then %s", why, ferr.message);
        goto out;
    }
    if (r < 0) {
        r = lb_error_set(err, r, "%s", ferr.message);
        goto out;
    }
    r = act_reload_own(a, &act, err);
    if (r == 0 && req->nowait) {
        /* the launch failed: known already, and GET says why */
        *out = json_pack("{s:s,s:s}", "activation_id", act.id, "state", "failed");
    } else if (r == 0) {
        *out = act_render_result(&act, why[0] ? why : NULL);
        log_info("activation %s: %s", act.id,
                 *out ? json_string_value(json_object_get(*out, "state")) : "?");
    }
out:
    if (r == 0 && !*out)
        r = lb_error_set(err, -ENOMEM, "cannot render the activation result");
    json_decref(status);
    json_decref(spec);
    free(spec_text);
    store_activation_release(&act);
    store_record_release(&live);
    return r;
}
