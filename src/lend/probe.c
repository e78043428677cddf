/*
 * probe.c - a seed's readiness probe (seed field "ready_probe", kept in the record's spec): the
 * command run in the new sandbox until it exits 0 before the sandbox is lent, by seeds (new or
 * warm), fork children (their seed carries the parent's spec) and resets. See lend_private.h
 * (lend_probe_run).
 *
 * The probe runs through the provider's exec op directly, not lend_exec: the sandbox is not lent
 * yet (its record is "starting", or a reset's), and the probe is the daemon's own work, not a
 * client's activity.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"
#include "util/log.h"

/* Bytes of an attempt's output kept per stream (the rest is read and dropped). */
#define PROBE_OUTPUT_MAX 4096
/* Bytes of the last attempt's stderr that a failure's message quotes. */
#define PROBE_STDERR_QUOTED 200
/* An attempt's own bound is never under this (a supervised exec's start alone takes tens of
 * milliseconds on a loaded host), only the budget's end cuts it shorter. */
#define PROBE_ATTEMPT_MIN_MS 1000
/* The longest sleep between two looks at draining. */
#define PROBE_SLEEP_SLICE_MS 100

/* What the last failed attempt said, for the seed's 502. */
struct probe_last {
    char what[LB_ERROR_MESSAGE_MAX + 64]; /* cut when quoted in the error */
};

/* Describe a failed attempt's result res into last: how it ended and the first
 * PROBE_STDERR_QUOTED bytes of its stderr (control characters as spaces). */
static void probe_describe(const struct lb_exec_result *res, int64_t timeout_ms,
                           struct probe_last *last)
{
    char quoted[PROBE_STDERR_QUOTED + 1];
    size_t n = res->err.len < PROBE_STDERR_QUOTED ? res->err.len : PROBE_STDERR_QUOTED;
    int off;

    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)res->err.data[i];

        quoted[i] = c < 0x20 || c == 0x7f ? ' ' : (char)c;
    }
    while (n > 0 && quoted[n - 1] == ' ')
        n--;
    quoted[n] = '\0';
    switch (res->error_type) {
    case LB_EXEC_TIMEOUT:
        off = snprintf(last->what, sizeof(last->what), "timed out after %lld ms",
                       (long long)timeout_ms);
        break;
    case LB_EXEC_SANDBOX:
        off = snprintf(last->what, sizeof(last->what), "could not run: %s",
                       res->message[0] ? res->message : "the sandbox refused it");
        break;
    default:
        off = snprintf(last->what, sizeof(last->what), "exit status %d", res->return_code);
        break;
    }
    if (off >= 0 && (size_t)off < sizeof(last->what) && n > 0)
        snprintf(last->what + off, sizeof(last->what) - (size_t)off, ", stderr: %s", quoted);
}

/* see lend_private.h */
int lend_probe_run(struct lb_lend *l, struct lb_provider *prov, const struct lb_sandbox_ref *ref,
                   json_t *spec, int64_t since_ms, struct lb_error *err)
{
    json_t *probe = json_object_get(spec, "ready_probe");
    const char *command = json_string_value(json_object_get(probe, "command"));
    int64_t interval_ms = json_integer_value(json_object_get(probe, "interval_ms"));
    int64_t ready_ms = json_integer_value(json_object_get(spec, "ready_timeout_ms"));
    const char *workdir = json_string_value(json_object_get(spec, "workdir"));
    const char *image_wd = json_string_value(json_object_get(spec, "image_working_dir"));
    const char *argv[] = {"/bin/sh", "-c", command, NULL};
    struct probe_last last = {"no attempt ran"};
    int64_t budget_ms, deadline, left;
    char **env = NULL;
    int attempts = 0, r;

    if (!command)
        return 0;
    if (interval_ms < LB_PROBE_INTERVAL_MIN_MS || interval_ms > LB_PROBE_INTERVAL_MAX_MS)
        interval_ms = LB_PROBE_INTERVAL_DEFAULT_MS;
    budget_ms = ready_ms > 0 ? ready_ms : l->cfg.create_timeout_s * 1000;
    deadline = since_ms + budget_ms;
    if (!workdir)
        workdir = l->cfg.workdir;
    env = lend_exec_env(spec, workdir, NULL);
    if (!env) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    for (;;) {
        struct lb_exec_result res = {0};
        struct lb_error perr = {0};
        int64_t timeout_ms, full_ms;

        if (lend_is_draining(l)) {
            r = lb_error_set(err, -ESHUTDOWN,
                             "the daemon is draining: sandbox %s was not ready (its ready_probe "
                             "had not succeeded; last attempt: %s)",
                             ref->id, last.what);
            goto out;
        }
        left = deadline - clock_mono_ms();
        /* the first attempt runs whatever is left: a sandbox ready at once is ready */
        if (left <= 0 && attempts > 0)
            break;
        full_ms = 5 * interval_ms > PROBE_ATTEMPT_MIN_MS ? 5 * interval_ms : PROBE_ATTEMPT_MIN_MS;
        /* never past the budget; the first attempt still gets PROBE_ATTEMPT_MIN_MS (a create
         * that used the whole budget does not fail a sandbox that is ready at once) */
        timeout_ms = full_ms;
        if (timeout_ms > left)
            timeout_ms = attempts > 0 || left > PROBE_ATTEMPT_MIN_MS ? left : PROBE_ATTEMPT_MIN_MS;
        struct lb_exec_request req = {
            .argv = argv,
            .cwd = image_wd ? image_wd : workdir,
            .env = (const char *const *)env,
            .user = NULL, /* the sandbox's root */
            .timeout_ms = timeout_ms,
            .max_output_bytes = PROBE_OUTPUT_MAX,
        };
        attempts++;
        r = provider_exec(prov, ref, &req, &res, &perr);
        if (r == 0 && res.error_type == LB_EXEC_OK && res.return_code == 0) {
            provider_exec_result_release(&res);
            log_info_sbx(ref->id, "sandbox %s: ready_probe succeeded (attempt %d)", ref->id,
                         attempts);
            goto out;
        }
        if (r < 0)
            snprintf(last.what, sizeof(last.what), "could not run: %s", perr.message);
        /* an attempt the budget's end cut short says less than the one before it */
        else if (!(res.error_type == LB_EXEC_TIMEOUT && timeout_ms < full_ms && attempts > 1))
            probe_describe(&res, timeout_ms, &last);
        provider_exec_result_release(&res);
        if (r == -ENOENT) {
            r = lb_error_set(err, -EREMOTEIO,
                             "sandbox %s ended before its ready_probe succeeded (last attempt: "
                             "%s)",
                             ref->id, last.what);
            goto out;
        }
        /* sleep interval_ms (not past the deadline), looking at draining meanwhile */
        for (int64_t slept = 0; slept < interval_ms && !lend_is_draining(l);) {
            int64_t step = interval_ms - slept < PROBE_SLEEP_SLICE_MS ? interval_ms - slept
                                                                      : PROBE_SLEEP_SLICE_MS;

            left = deadline - clock_mono_ms();
            if (left <= 0)
                break;
            if (step > left)
                step = left;
            clock_sleep_ms(step);
            slept += step;
        }
    }
    r = lb_error_set(err, -EREMOTEIO,
                     "sandbox %s was not ready within %lld ms (ready_timeout_s, else "
                     "lending.create_timeout_s): its ready_probe did not succeed in %d attempts; "
                     "last attempt: %s",
                     ref->id, (long long)budget_ms, attempts, last.what);
    log_warn_sbx(ref->id, "%s", err ? err->message : "ready_probe failed");
out:
    lend_exec_env_free(env);
    return r;
}
