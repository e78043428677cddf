/*
 * test_renew.c - lifetimes of lent sandboxes: POST /v1/sandboxes/{id}/renew (NeMo Gym's
 * RenewableProvider: the new expiry counted from now, renewing a sandbox that is no longer live
 * an error), and the seed's idle_timeout_s / on_idle: activity (exec, files, a running exec)
 * keeps a sandbox, an idle one is stopped with reason "idle" or, with on_idle "pause", paused
 * and resumed by its next exec with its files intact.
 *
 * Real daemon (sweeper every second, as the harness starts it, lending.max_ttl_s 100), real
 * sandboxes. Waits are polls with generous bounds; nothing asserts on speed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"

static struct lbt_daemon D;

static const char *str(json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));

    return s ? s : "";
}

/* An RFC 3339 UTC time of the API ("2026-01-02T03:04:05Z") as Unix seconds; -1 otherwise. */
static long long parse_time(const char *s)
{
    struct tm tm = {0};
    const char *end = s ? strptime(s, "%Y-%m-%dT%H:%M:%SZ", &tm) : NULL;

    return end && *end == '\0' ? (long long)timegm(&tm) : -1;
}

static const char *token_of(json_t *lease)
{
    return str(json_object_get(lease, "access"), "token");
}

/* POST /v1/sandboxes/{id}/renew with body as token. */
static void renew(const char *id, const char *token, const char *body, struct lbt_resp *r)
{
    char path[160];

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/renew", id);
    lbt_json(&D, "POST", path, token, body, r);
}

/* Renew id for ttl_s (JSON text) as token: 200 {"sandbox_id", "expires_at"} with expires_at
 * now + want seconds. */
static void renew_ok(const char *id, const char *token, const char *ttl_s, int want)
{
    char body[64];
    struct lbt_resp r;
    long long before = (long long)time(NULL), after, exp;

    snprintf(body, sizeof(body), "{\"ttl_s\": %s}", ttl_s);
    renew(id, token, body, &r);
    after = (long long)time(NULL);
    ck_assert_msg(r.status == 200, "renew %s: %ld %s", id, r.status, r.body);
    ck_assert_int_eq(json_object_size(r.json), 2);
    ck_assert_str_eq(str(r.json, "sandbox_id"), id);
    exp = parse_time(str(r.json, "expires_at"));
    ck_assert_msg(exp >= before + want && exp <= after + want, "expires_at %s, want now + %d",
                  str(r.json, "expires_at"), want);
    lbt_resp_free(&r);
}

static void renew_fails(const char *id, const char *token, const char *body, long status,
                        const char *code)
{
    struct lbt_resp r;

    renew(id, token, body, &r);
    ck_assert_msg(r.status == status, "renew %s %s: want %ld, got %ld %s", id, body, status,
                  r.status, r.body);
    lbt_assert_error(&r, status, code);
    lbt_resp_free(&r);
}

/* The record of id in GET /v1/sandboxes (caller decrefs). */
static json_t *record_of(const char *id)
{
    json_t *list = lbt_list_sandboxes(&D), *rec = json_incref(lbt_find_record(list, id));

    json_decref(list);
    ck_assert_msg(rec != NULL, "no record of %s", id);
    return rec;
}

/* GET /v1/sandboxes/{id} as admin (asserts 200; caller decrefs). */
static json_t *sandbox_get(const char *id)
{
    char path[160];
    struct lbt_resp r;
    json_t *j;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    lbt_json(&D, "GET", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "get %s: %ld %s", id, r.status, r.body);
    j = json_incref(r.json);
    lbt_resp_free(&r);
    return j;
}

/* Wait (at most limit_s) until id's record is stopped; assert its stop reason. */
static void wait_stopped(const char *id, const char *reason, double limit_s)
{
    double until = lbt_now() + limit_s;
    json_t *rec = NULL;

    for (;;) {
        json_decref(rec);
        rec = record_of(id);
        if (!strcmp(str(rec, "state"), "stopped") || lbt_now() > until)
            break;
        lbt_sleep_ms(200);
    }
    ck_assert_msg(!strcmp(str(rec, "state"), "stopped"), "%s is %s after %.0f s", id,
                  str(rec, "state"), limit_s);
    ck_assert_str_eq(str(rec, "stop_reason"), reason);
    json_decref(rec);
}

static void assert_lent(const char *id)
{
    json_t *rec = record_of(id);

    ck_assert_msg(!strcmp(str(rec, "state"), "lent"), "%s is %s (%s)", id, str(rec, "state"),
                  str(rec, "stop_reason"));
    json_decref(rec);
}

/* An exec as token: 200, exit 0, stdout want (NULL: any). */
static void exec_ok(const char *id, const char *token, const char *command, const char *want)
{
    char body[512];
    json_t *res;

    snprintf(body, sizeof(body), "{\"command\": \"%s\"}", command);
    res = lbt_exec_ok(&D, id, token, body);
    ck_assert_int_eq(json_integer_value(json_object_get(res, "exit_code")), 0);
    if (want)
        ck_assert_str_eq(str(res, "stdout"), want);
    json_decref(res);
}

/* ---------- renew ---------- */

/* A 3 s TTL sandbox renewed every second lives 10 s; its twin, not renewed, expires (reason
 * ttl); once stopped, renewing it is 404. */
START_TEST(test_renew_keeps_alive)
{
    json_t *kept = lbt_seed(&D, "renew-kept", "t", "\"ttl_s\": 3");
    json_t *lapsed = lbt_seed(&D, "renew-lapsed", "t", "\"ttl_s\": 3");
    char id[64], lapsed_id[64], token[128];
    double start = lbt_now();

    snprintf(id, sizeof(id), "%s", str(kept, "sandbox_id"));
    snprintf(lapsed_id, sizeof(lapsed_id), "%s", str(lapsed, "sandbox_id"));
    snprintf(token, sizeof(token), "%s", token_of(kept));
    for (int i = 0; lbt_now() - start < 10.0; i++) {
        lbt_sleep_ms(1000);
        /* the operate token of the sandbox, and the admin */
        renew_ok(id, i % 2 ? "" : token, "3", 3);
    }
    assert_lent(id);
    exec_ok(id, token, "echo alive", "alive\n");
    /* the one nobody renewed expired long ago, as any TTL does */
    wait_stopped(lapsed_id, "ttl", 1.0);
    renew_fails(lapsed_id, "", "{\"ttl_s\": 5}", 404, "not_found");
    renew_fails(lapsed_id, token_of(lapsed), "{\"ttl_s\": 5}", 404, "not_found");
    /* no more renewals: it expires too, and then cannot be renewed */
    wait_stopped(id, "ttl", 20.0);
    renew_fails(id, "", "{\"ttl_s\": 5}", 404, "not_found");
    json_decref(kept);
    json_decref(lapsed);
}
END_TEST

/* Bad ttl_s is 400; an unknown sandbox 404; another sandbox's token is refused as on the other
 * operate routes; ttl_s past lending.max_ttl_s is capped as a seed's is; a renewal is in the
 * store (GET shows it). */
START_TEST(test_renew_input)
{
    json_t *a = lbt_seed(&D, "renew-a", "t", "\"ttl_s\": 60");
    json_t *b = lbt_seed(&D, "renew-b", "t", "\"ttl_s\": 60"), *got;
    const char *id = str(a, "sandbox_id");
    static const char *const bad[] = {"{\"ttl_s\": 0}",
                                      "{\"ttl_s\": -1}",
                                      "{\"ttl_s\": \"5\"}",
                                      "{\"ttl_s\": null}",
                                      "{}",
                                      "{\"ttl_s\": 5, \"x\": 1}",
                                      "{\"ttl_s\": true}",
                                      "{\"ttl_s\": 31536001}",
                                      "[5]"};
    struct lbt_resp r;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        renew_fails(id, "", bad[i], 400, "bad_request");
    renew_fails("sbx-no-such-sandbox", "", "{\"ttl_s\": 5}", 404, "not_found");
    /* another sandbox's operate token: refused as exec with it is */
    renew(id, token_of(b), "{\"ttl_s\": 5}", &r);
    ck_assert_msg(r.status == 403 || r.status == 401, "renew with b's token: %ld", r.status);
    {
        struct lbt_resp e;

        lbt_exec(&D, id, token_of(b), "{\"command\": \"true\"}", &e);
        ck_assert_int_eq(e.status, r.status);
        lbt_resp_free(&e);
    }
    lbt_resp_free(&r);
    renew(id, NULL, "{\"ttl_s\": 5}", &r);
    lbt_assert_error(&r, 401, "unauthorized");
    lbt_resp_free(&r);
    /* capped at max_ttl_s (100) */
    renew_ok(id, token_of(a), "100000", 100);
    /* fractions round up, as a seed's ttl_s */
    renew_ok(id, "", "4.2", 5);
    got = sandbox_get(id);
    {
        long long exp = parse_time(str(got, "expires_at")), now = (long long)time(NULL);

        ck_assert_msg(exp > now && exp <= now + 5, "GET expires_at %s", str(got, "expires_at"));
    }
    json_decref(got);
    json_decref(a);
    json_decref(b);
}
END_TEST

/* ---------- idle ---------- */

START_TEST(test_idle_fields_refused)
{
    static const char *const bad[] = {
        "\"idle_timeout_s\": 0",        "\"idle_timeout_s\": -2",
        "\"idle_timeout_s\": \"2\"",    "\"idle_timeout_s\": true",
        "\"on_idle\": \"sleep\"",       "\"on_idle\": 1",
        "\"idle_timeout_s\": 31536001", "\"idle_timeout_s\": 2, \"on_idle\": \"Stop\"",
    };
    char body[256];
    struct lbt_resp r;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(body, sizeof(body), "{\"task_id\": \"t\", %s}", bad[i]);
        lbt_json(&D, "POST", "/v1/sessions/idle-bad/seed", "", body, &r);
        ck_assert_msg(r.status == 400, "seed %s: %ld %s", body, r.status, r.body);
        lbt_assert_error(&r, 400, "bad_request");
        lbt_resp_free(&r);
    }
}
END_TEST

/* idle_timeout_s 2: file requests every 0.5 s keep it 3 s, activation requests 3 s more; a 4 s
 * exec keeps it; then, with no activity, it is stopped with reason idle. last_activity_at
 * follows the activity. */
START_TEST(test_idle_stop)
{
    json_t *lease = lbt_seed(&D, "idle-stop", "t", "\"idle_timeout_s\": 2"), *got;
    char id[64], token[128];
    double start = lbt_now();
    long long seeded = (long long)time(NULL), last;
    struct lbt_resp r;

    snprintf(id, sizeof(id), "%s", str(lease, "sandbox_id"));
    snprintf(token, sizeof(token), "%s", token_of(lease));
    last = parse_time(str(lease, "last_activity_at"));
    ck_assert_msg(last >= seeded - 1 && last <= seeded, "lease last_activity_at %s",
                  str(lease, "last_activity_at"));
    /* each kind of request alone keeps it, for longer than idle_timeout_s: files... */
    for (int i = 0; lbt_now() - start < 3.0; i++) {
        lbt_sleep_ms(500);
        if (i % 2) {
            lbt_file_get(&D, id, token, "/workspace/a.txt", &r);
            ck_assert_msg(r.status == 200, "file get: %ld %s", r.status, r.body);
        } else {
            lbt_file_put(&D, id, token, "/workspace/a.txt", NULL, "x", 1, &r);
            ck_assert_msg(r.status == 204, "file put: %ld %s", r.status, r.body);
        }
        lbt_resp_free(&r);
    }
    assert_lent(id);
    /* ...and activation requests (its session's, with its operate token; none ran yet) */
    while (lbt_now() - start < 6.0) {
        lbt_sleep_ms(500);
        lbt_json(&D, "GET", "/v1/sessions/idle-stop/activation", token, NULL, &r);
        lbt_assert_error(&r, 404, "not_found");
        lbt_resp_free(&r);
    }
    assert_lent(id);
    got = sandbox_get(id);
    last = parse_time(str(got, "last_activity_at"));
    ck_assert_msg(last >= seeded + 5, "last_activity_at %s after 6 s of activity",
                  str(got, "last_activity_at"));
    json_decref(got);
    /* a long exec is activity while it runs (twice the idle timeout) */
    exec_ok(id, token, "sleep 4; echo done", "done\n");
    assert_lent(id);
    /* and a file read is activity */
    lbt_file_get(&D, id, token, "/workspace/a.txt", &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    /* nothing more: stopped, reason idle */
    wait_stopped(id, "idle", 15.0);
    lbt_exec(&D, id, "", "{\"command\": \"true\"}", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    /* the session can be seeded again */
    json_decref(lease);
    lease = lbt_seed(&D, "idle-stop", "t", NULL);
    ck_assert_str_ne(str(lease, "sandbox_id"), id);
    lbt_release_session(&D, "idle-stop");
    json_decref(lease);
}
END_TEST

/* on_idle pause: idle, it is paused (GET shows it, the record stays lent); the next exec resumes
 * it and sees its files; then it is paused again once idle. A sandbox without idle_timeout_s is
 * left alone. */
START_TEST(test_idle_pause)
{
    json_t *lease = lbt_seed(&D, "idle-pause", "t",
                             "\"idle_timeout_s\": 2, \"on_idle\": \"pause\", \"files\": "
                             "{\"/workspace/keep.txt\": \"kept\"}");
    json_t *plain = lbt_seed(&D, "idle-none", "t", NULL), *got = NULL;
    char id[64], token[128];
    double until;

    snprintf(id, sizeof(id), "%s", str(lease, "sandbox_id"));
    snprintf(token, sizeof(token), "%s", token_of(lease));
    exec_ok(id, token, "echo more >> /workspace/keep.txt", NULL);
    for (int round = 0; round < 2; round++) {
        until = lbt_now() + 15;
        for (;;) {
            json_decref(got);
            got = sandbox_get(id);
            if (!strcmp(str(got, "status"), "paused") || lbt_now() > until)
                break;
            lbt_sleep_ms(200);
        }
        ck_assert_msg(!strcmp(str(got, "status"), "paused"), "status %s", str(got, "status"));
        ck_assert_str_eq(str(got, "state"), "lent");
        json_decref(got);
        got = NULL;
        assert_lent(id);
        /* the next exec resumes it, files intact */
        exec_ok(id, token, "cat /workspace/keep.txt", "keptmore\n");
        got = sandbox_get(id);
        ck_assert_str_eq(str(got, "status"), "running");
    }
    json_decref(got);
    /* the sandbox without idle_timeout_s ran all along */
    got = sandbox_get(str(plain, "sandbox_id"));
    ck_assert_str_eq(str(got, "status"), "running");
    json_decref(got);
    assert_lent(str(plain, "sandbox_id"));
    lbt_release_session(&D, "idle-pause");
    lbt_release_session(&D, "idle-none");
    json_decref(lease);
    json_decref(plain);
}
END_TEST

int main(void)
{
    static const char *const args[] = {"--set", "lending.max_ttl_s=100", NULL};
    Suite *s = suite_create("renew");
    TCase *tc = tcase_create("renew");

    lbt_shared_daemon(tc, &D, args);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_renew_input);
    tcase_add_test(tc, test_idle_fields_refused);
    tcase_add_test(tc, test_renew_keeps_alive);
    tcase_add_test(tc, test_idle_stop);
    tcase_add_test(tc, test_idle_pause);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
