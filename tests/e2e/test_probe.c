/*
 * test_probe.c - the seed's ready_probe ({"command", "interval_ms"}): the seed answers only
 * once "sh -c command" exits 0 inside the sandbox (as root, in the workdir, with the seed's
 * env), tried every interval_ms, or 502 at ready_timeout_s with the sandbox stopped (reason
 * seed_failed) and nothing of it left; the probe's last exit status and stderr are in the 502's
 * message. Resets and fork children probe again (the probe is kept in the record's spec). Bad
 * probe bodies are 400. Variant pool: the seeds of the default class take warm sandboxes, which
 * are probed after the take.
 *
 * The probes count their attempts in a file of the workdir, so that what the seed waited for is
 * an exact number, not a time. Nothing asserts on speed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static struct lbt_daemon D;

/* The probe: root, the seed's env, cwd the workdir; counts its attempts in .probe-n there and
 * succeeds from the 5th one. */
#define COUNTING_PROBE                                                                             \
    "[ \\\"$(id -u)\\\" = 0 ] && [ \\\"$PROBE_ENV\\\" = yes ] && "                                 \
    "n=$(cat .probe-n 2>/dev/null || echo 0) && n=$((n + 1)) && echo $n > .probe-n && "            \
    "[ $n -ge 5 ]"
#define COUNTING_SEED                                                                              \
    "\"env\": {\"PROBE_ENV\": \"yes\"}, \"ready_probe\": {\"command\": \"" COUNTING_PROBE          \
    "\", \"interval_ms\": 200}"

static const char *str(json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));

    return s ? s : "";
}

static void seed_raw(const char *rsid, const char *body, struct lbt_resp *r)
{
    char path[300];

    snprintf(path, sizeof(path), "/v1/sessions/%s/seed", rsid);
    lbt_json(&D, "POST", path, "", body, r);
}

/* The record of session rsid in GET /v1/sandboxes (exactly one; caller decrefs). */
static json_t *record_of_session(const char *rsid)
{
    json_t *list = lbt_list_sandboxes(&D), *v, *rec = NULL;
    size_t i;

    ck_assert_int_eq(lbt_count_records_of_session(list, rsid), 1);
    json_array_foreach(list, i, v) {
        if (!strcmp(str(v, "resources_session_id"), rsid))
            rec = json_incref(v);
    }
    json_decref(list);
    ck_assert_ptr_nonnull(rec);
    return rec;
}

/* GET /v1/sessions/rsid answers 404 (nothing lent to it). */
static void assert_nothing_lent(const char *rsid)
{
    char path[300];
    struct lbt_resp r;

    snprintf(path, sizeof(path), "/v1/sessions/%s", rsid);
    lbt_json(&D, "GET", path, "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
}

/* Session rsid's one sandbox was stopped as a failed seed and nothing of it remains: no
 * cgroup, no sandbox dir, no process whose command line holds marker. */
static void assert_failed_seed_gone(const char *rsid, const char *marker)
{
    json_t *rec = record_of_session(rsid);
    char dir[600];

    ck_assert_str_eq(str(rec, "state"), "stopped");
    ck_assert_str_eq(str(rec, "stop_reason"), "seed_failed");
    if (lbt_variant_engine()) {
        ck_assert_int_eq(lbt_variant_count_containers(str(rec, "sandbox_id"), false), 0);
    } else {
        ck_assert_int_eq(lbt_count_cgroup_dirs(str(rec, "sandbox_id")), 0);
        snprintf(dir, sizeof(dir), "%s/sandboxes/%s", D.state_dir, str(rec, "sandbox_id"));
        ck_assert_msg(!lbt_path_exists(dir), "%s is left", dir);
        ck_assert_int_eq(lbt_count_procs_cmdline(marker), 0);
    }
    json_decref(rec);
    assert_nothing_lent(rsid);
}

/* ---------- a probe that passes on its 5th attempt ---------- */

START_TEST(test_probe_waits_until_ready)
{
    json_t *lease = lbt_seed(&D, "probe-ok", "task-probe", COUNTING_SEED);
    char *out;

    /* variant pool: a warm sandbox was taken, then probed */
    if (lbt_variant_is("pool")) {
        char needle[160];

        lbt_pool_settle(&D);
        snprintf(needle, sizeof(needle), "lent warm sandbox %s", str(lease, "sandbox_id"));
        ck_assert_int_eq(lbt_log_count(&D, needle), 1);
    }
    /* the seed answered after the 5th attempt and no attempt ran after it */
    out = lbt_sh(&D, str(lease, "sandbox_id"), "cat \"$LENDBOX_WORKDIR/.probe-n\"");
    ck_assert_str_eq(out, "5\n");
    free(out);
    /* the lease is an ordinary one: its token works */
    json_t *res =
        lbt_exec_ok(&D, str(lease, "sandbox_id"), str(json_object_get(lease, "access"), "token"),
                    "{\"command\": \"cat .probe-n\"}");
    ck_assert_str_eq(str(res, "stdout"), "5\n");
    json_decref(res);
    /* a seed again with the same task reuses the sandbox: no new probe */
    json_t *again = lbt_seed(&D, "probe-ok", "task-probe", COUNTING_SEED);
    ck_assert(json_is_true(json_object_get(again, "reused")));
    ck_assert_str_eq(str(again, "sandbox_id"), str(lease, "sandbox_id"));
    out = lbt_sh(&D, str(lease, "sandbox_id"), "cat \"$LENDBOX_WORKDIR/.probe-n\"");
    ck_assert_str_eq(out, "5\n");
    free(out);
    json_decref(again);
    json_decref(lease);
    lbt_release_session(&D, "probe-ok");
}
END_TEST

/* ---------- probes that never pass ---------- */

START_TEST(test_probe_never_ready)
{
    struct lbt_resp r;
    const char *msg;

    /* a bystander stays lent meanwhile */
    json_t *by = lbt_seed(&D, "probe-bystander", "task-by", NULL);

    seed_raw("probe-never",
             "{\"task_id\": \"t\", \"ready_timeout_s\": 2, \"ready_probe\": {\"command\": "
             "\": probe-marker-4711; echo not-ready-yet >&2; exit 3\", \"interval_ms\": 100}}",
             &r);
    lbt_assert_error(&r, 502, "provider_error");
    msg = str(json_object_get(r.json, "error"), "message");
    ck_assert_msg(strstr(msg, "ready_probe") && strstr(msg, "exit status 3") &&
                      strstr(msg, "stderr: not-ready-yet"),
                  "message: %s", msg);
    lbt_resp_free(&r);
    assert_failed_seed_gone("probe-never", "probe-marker-4711");

    /* an attempt that hangs is ended at the ready timeout too */
    seed_raw("probe-hang",
             "{\"task_id\": \"t\", \"ready_timeout_s\": 2, \"ready_probe\": {\"command\": "
             "\"sleep 31.4711\"}}",
             &r);
    lbt_assert_error(&r, 502, "provider_error");
    msg = str(json_object_get(r.json, "error"), "message");
    ck_assert_msg(strstr(msg, "timed out after"), "message: %s", msg);
    lbt_resp_free(&r);
    assert_failed_seed_gone("probe-hang", "sleep 31.4711");

    /* an attempt's own bound (5 x interval_ms, here 300 s) never runs past the budget, not the
     * first attempt either: a probe that would exit 0 after 6 s fails a 2 s ready_timeout_s */
    seed_raw("probe-long",
             "{\"task_id\": \"t\", \"ready_timeout_s\": 2, \"ready_probe\": {\"command\": "
             "\"sleep 6.4712\", \"interval_ms\": 60000}}",
             &r);
    lbt_assert_error(&r, 502, "provider_error");
    msg = str(json_object_get(r.json, "error"), "message");
    ck_assert_msg(strstr(msg, "timed out after") && strstr(msg, "in 1 attempts"), "message: %s",
                  msg);
    lbt_resp_free(&r);
    assert_failed_seed_gone("probe-long", "sleep 6.4712");

    /* the session can be seeded again; the bystander was not touched */
    json_t *lease = lbt_seed(&D, "probe-never", "task-again", NULL);
    ck_assert(json_is_false(json_object_get(lease, "reused")));
    json_decref(lease);
    free(lbt_sh(&D, str(by, "sandbox_id"), "true"));
    json_decref(by);
    lbt_release_session(&D, "probe-never");
    lbt_release_session(&D, "probe-bystander");
    lbt_assert_healthy(&D);
}
END_TEST

/* ---------- bad bodies ---------- */

START_TEST(test_probe_bad_bodies)
{
    static const char *const bad[] = {
        "{}",                                                /* no command */
        "{\"command\": \"\"}",                               /* empty */
        "{\"command\": 7}",                                  /* not a string */
        "{\"command\": \"true\", \"interval_ms\": 0}",       /* under 10 */
        "{\"command\": \"true\", \"interval_ms\": 9}",       /* under 10 */
        "{\"command\": \"true\", \"interval_ms\": 60001}",   /* over a minute */
        "{\"command\": \"true\", \"interval_ms\": \"200\"}", /* a string */
        "{\"command\": \"true\", \"interval_ms\": 1.5}",     /* not an integer */
        "{\"command\": \"true\", \"timeout_ms\": 100}",      /* unknown key */
        "\"true\"",                                          /* not an object */
        "[\"true\"]",                                        /* not an object */
    };
    char body[512];
    struct lbt_resp r;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(body, sizeof(body), "{\"task_id\": \"t\", \"ready_probe\": %s}", bad[i]);
        seed_raw("probe-bad", body, &r);
        ck_assert_msg(r.status == 400, "%s: %ld %s", bad[i], r.status, r.body);
        lbt_assert_error(&r, 400, "bad_request");
        ck_assert_msg(strstr(str(json_object_get(r.json, "error"), "message"), "ready_probe"),
                      "%s: %s", bad[i], r.body);
        lbt_resp_free(&r);
        /* POST /v1/sandboxes parses the same body */
        snprintf(body, sizeof(body), "{\"ready_probe\": %s}", bad[i]);
        lbt_json(&D, "POST", "/v1/sandboxes", "", body, &r);
        lbt_assert_error(&r, 400, "bad_request");
        lbt_resp_free(&r);
    }
    /* a command with a NUL byte */
    seed_raw("probe-bad", "{\"task_id\": \"t\", \"ready_probe\": {\"command\": \"tr\\u0000ue\"}}",
             &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    /* nothing was recorded for them */
    json_t *list = lbt_list_sandboxes(&D);
    ck_assert_int_eq(lbt_count_records_of_session(list, "probe-bad"), 0);
    json_decref(list);
    /* null is no probe; the bounds themselves are accepted */
    json_t *lease = lbt_seed(&D, "probe-bounds", "t", "\"ready_probe\": null");
    json_decref(lease);
    lbt_release_session(&D, "probe-bounds");
    lease = lbt_seed(&D, "probe-bounds", "t2",
                     "\"ready_probe\": {\"command\": \"true\", \"interval_ms\": 10}");
    json_decref(lease);
    lbt_release_session(&D, "probe-bounds");
    lease = lbt_seed(&D, "probe-bounds", "t3",
                     "\"ready_probe\": {\"command\": \"true\", \"interval_ms\": 60000}");
    json_decref(lease);
    lbt_release_session(&D, "probe-bounds");
}
END_TEST

/* ---------- POST /v1/sandboxes, reset and fork probe too ---------- */

START_TEST(test_probe_create_reset_fork)
{
    struct lbt_resp r;
    char path[200], sbx[LBT_ID_MAX], *out;
    json_t *lease;

    /* a sandbox lent to no session */
    lbt_json(&D, "POST", "/v1/sandboxes", "", "{" COUNTING_SEED "}", &r);
    ck_assert_msg(r.status == 201, "create: %ld %s", r.status, r.body);
    snprintf(sbx, sizeof(sbx), "%s", str(r.json, "sandbox_id"));
    lbt_resp_free(&r);
    out = lbt_sh(&D, sbx, "cat \"$LENDBOX_WORKDIR/.probe-n\"");
    ck_assert_str_eq(out, "5\n");
    free(out);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    lbt_json(&D, "DELETE", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "delete: %ld %s", r.status, r.body);
    lbt_resp_free(&r);

    if (lbt_variant_engine()) { /* reset and fork are the local provider's */
        lbt_skip_note(__func__, "reset and fork: local provider only");
        return;
    }
    lease = lbt_seed(&D, "probe-rf", "task-rf", COUNTING_SEED);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    json_decref(lease);
    /* a reset makes the sandbox (and its workdir) again: the probe counts from 0 again */
    free(lbt_sh(&D, sbx, "echo 100 > \"$LENDBOX_WORKDIR/.probe-n\""));
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/reset", sbx);
    lbt_json(&D, "POST", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    out = lbt_sh(&D, sbx, "cat \"$LENDBOX_WORKDIR/.probe-n\"");
    ck_assert_str_eq(out, "5\n");
    free(out);
    /* a fork child starts from the parent's workdir (.probe-n 5): its probe ran once more */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/fork", sbx);
    lbt_json(&D, "POST", path, "", "{\"sessions\": [\"probe-child\"]}", &r);
    ck_assert_msg(r.status == 200, "fork: %ld %s", r.status, r.body);
    json_t *c = json_array_get(json_object_get(r.json, "children"), 0);
    ck_assert_msg(json_integer_value(json_object_get(c, "status")) == 200, "child: %s", r.body);
    out = lbt_sh(&D, str(json_object_get(c, "lease"), "sandbox_id"),
                 "cat \"$LENDBOX_WORKDIR/.probe-n\"");
    ck_assert_str_eq(out, "6\n");
    free(out);
    lbt_resp_free(&r);
    lbt_release_session(&D, "probe-child");
    lbt_release_session(&D, "probe-rf");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("probe");
    TCase *tc = tcase_create("probe");

    lbt_shared_daemon(tc, &D, NULL);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_probe_waits_until_ready);
    tcase_add_test(tc, test_probe_never_ready);
    tcase_add_test(tc, test_probe_bad_bodies);
    tcase_add_test(tc, test_probe_create_reset_fork);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
