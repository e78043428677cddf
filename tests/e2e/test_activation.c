/*
 * test_activation.c - harness activations (execute / close / activation) exactly as
 * NeMo Gym's SandboxSession runs them, preserve_background_services on exec, and pause/resume.
 *
 * Real daemon, real sandboxes. Most tests share one daemon (each uses its own session and so
 * its own sandbox); the ones that need a fault switch or a SIGKILL start their own. Nothing
 * here asserts on tight timings: waits are polls with generous bounds.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <libgen.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static struct lbt_daemon D;

/* ---------- helpers ---------- */

/* Seed rsid on d; returns the sandbox id (static buffer per call site is the caller's). */
static void seed(struct lbt_daemon *d, const char *rsid, char *sbx, size_t len)
{
    json_t *lease = lbt_seed(d, rsid, "task-act", NULL);

    snprintf(sbx, len, "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
}

static char *dumps(json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);

    json_decref(j);
    ck_assert_ptr_nonnull(s);
    return s;
}

static void session_path(char *buf, size_t len, const char *rsid, const char *what)
{
    snprintf(buf, len, "/v1/sessions/%s/%s", rsid, what);
}

/* POST .../execute with body; returns the response (caller frees). */
static void execute(struct lbt_daemon *d, const char *rsid, const char *body, struct lbt_resp *r)
{
    char path[300];

    session_path(path, sizeof(path), rsid, "execute");
    lbt_json(d, "POST", path, "", body, r);
}

static struct lbt_async *execute_async(struct lbt_daemon *d, const char *rsid, const char *body)
{
    char path[300];

    session_path(path, sizeof(path), rsid, "execute");
    return lbt_async_json(d, "POST", path, "", body);
}

static void close_session(struct lbt_daemon *d, const char *rsid, struct lbt_resp *r)
{
    char path[300];

    session_path(path, sizeof(path), rsid, "close");
    lbt_json(d, "POST", path, "", "{}", r);
}

static json_t *get_activation(struct lbt_daemon *d, const char *rsid, bool log)
{
    char path[300];
    struct lbt_resp r;
    json_t *out;

    snprintf(path, sizeof(path), "/v1/sessions/%s/activation%s", rsid, log ? "?log=1" : "");
    lbt_json(d, "GET", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "activation of %s: %ld %s", rsid, r.status, r.body);
    out = json_incref(r.json);
    lbt_resp_free(&r);
    return out;
}

static const char *str(json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));

    return s ? s : "";
}

/* The decoded bytes of artifact path in a result, NUL-terminated (NULL when null). */
static char *artifact(json_t *res, const char *path)
{
    json_t *a = json_object_get(json_object_get(res, "artifacts"), path);
    unsigned char *bytes;
    size_t len = 0;
    char *out;

    ck_assert_msg(a != NULL, "no artifact entry for %s", path);
    if (json_is_null(a))
        return NULL;
    bytes = lbt_b64_decode(json_string_value(json_object_get(a, "base64")), &len);
    ck_assert_ptr_nonnull(bytes);
    out = calloc(1, len + 1);
    memcpy(out, bytes, len);
    free(bytes);
    return out;
}

static void assert_artifact(json_t *res, const char *path, const char *want)
{
    char *got = artifact(res, path);

    ck_assert_msg(got != NULL, "artifact %s is null", path);
    ck_assert_str_eq(got, want);
    free(got);
}

static void assert_cleanup_confirmed(json_t *res)
{
    json_t *c = json_object_get(res, "cleanup");

    ck_assert_msg(json_is_object(c), "no cleanup object");
    ck_assert(json_is_true(json_object_get(c, "cleanup_confirmed")));
}

/* Processes inside the sandbox whose command line matches the grep -E pattern (write it so
 * that it does not match itself, e.g. "slee[p] 1000"), supervisors left out: a harness's
 * supervisor (lendbox-supervise --harness-launch ...) carries the harness's argv in its own
 * command line, and it exits just after it wrote its receipt, so a count right after an
 * execute or a stop could find it still there; sbx_wait_supervisors_gone waits for those. */
static int sbx_count_lines(struct lbt_daemon *d, const char *sbx, const char *pattern,
                           bool but_supervisors)
{
    char cmd[640], *out;
    int n;

    /* -e: a pattern starting with "-" is a pattern, not an option */
    snprintf(cmd, sizeof(cmd),
             "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | "
             "%sgrep -cE -e '%s' || true",
             but_supervisors ? "grep -v -e '--harness-launc[h]' | " : "", pattern);
    out = lbt_sh(d, sbx, cmd);
    n = atoi(out);
    free(out);
    return n;
}

static int sbx_count(struct lbt_daemon *d, const char *sbx, const char *pattern)
{
    return sbx_count_lines(d, sbx, pattern, true);
}

/* Supervisors of harnesses (lendbox-supervise --harness-launch) inside the sandbox. */
static int sbx_count_supervisors(struct lbt_daemon *d, const char *sbx)
{
    return sbx_count_lines(d, sbx, "--harness-launc[h]", false);
}

/* Wait (at most 10 s) until no harness supervisor is left in the sandbox; asserts it. */
static void sbx_wait_supervisors_gone(struct lbt_daemon *d, const char *sbx)
{
    int n;

    for (int i = 0; (n = sbx_count_supervisors(d, sbx)) > 0 && i < 100; i++)
        lbt_sleep_ms(100);
    ck_assert_msg(n == 0, "%d harness supervisor(s) still in the sandbox after 10 s", n);
}

/* Contents of a file inside the sandbox, or NULL when it does not exist. */
static char *sbx_file(struct lbt_daemon *d, const char *sbx, const char *path)
{
    struct lbt_resp r;
    char *out = NULL;

    lbt_file_get(d, sbx, "", path, &r);
    if (r.status == 200)
        out = strndup(r.body, r.len);
    else
        ck_assert_msg(r.status == 404, "GET %s: %ld", path, r.status);
    lbt_resp_free(&r);
    return out;
}

/* Poll until the sandbox file holds want (a prefix match), at most timeout_s. */
static void wait_file(struct lbt_daemon *d, const char *sbx, const char *path, const char *want,
                      double timeout_s)
{
    double until = lbt_now() + timeout_s;

    for (;;) {
        char *got = sbx_file(d, sbx, path);
        bool ok = got && !strncmp(got, want, strlen(want));

        free(got);
        if (ok)
            return;
        ck_assert_msg(lbt_now() < until, "%s never held '%s'", path, want);
        lbt_sleep_ms(50);
    }
}

/* Lines of the daemon's log that contain needle. */
static int log_count(struct lbt_daemon *d, const char *needle)
{
    FILE *f = fopen(d->log_path, "re");
    char line[4096];
    int n = 0;

    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f))
        if (strstr(line, needle))
            n++;
    fclose(f);
    return n;
}

static int collections(struct lbt_daemon *d, const char *activation_id)
{
    char needle[160];

    snprintf(needle, sizeof(needle), "activation %s: collecting artifacts", activation_id);
    return log_count(d, needle);
}

/* ---------- the acceptance cases ---------- */

/* A harness that writes /workspace/out.txt and exits 0: finished, rc 0, the artifact's bytes,
 * cleanup confirmed; close returns the same artifacts without collecting again. */
START_TEST(test_finished_then_close)
{
    char sbx[64], *body, *out;
    struct lbt_resp r, c1, c2;
    json_t *res, *act;
    char id[64];

    seed(&D, "act-fin", sbx, sizeof(sbx));
    body = dumps(json_pack("{s:[s,s,s],s:{s:s,s:{s:s,s:i}},s:[s,s]}", "argv", "sh", "-c",
                           "echo harness says hi; cat /workspace/in.txt > /workspace/out.txt; "
                           "printf ' and more' >> /workspace/out.txt; test -x /workspace/bin/tool",
                           "stage", "/workspace/in.txt", "staged input", "/workspace/bin/tool",
                           "base64", "IyEvYmluL3NoCg==", "mode", 0755, "collect",
                           "/workspace/out.txt", "/workspace/never-written"));
    execute(&D, "act-fin", body, &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    res = r.json;
    ck_assert_str_eq(str(res, "state"), "finished");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    ck_assert(json_is_integer(json_object_get(res, "return_code")));
    assert_artifact(res, "/workspace/out.txt", "staged input and more");
    ck_assert(json_is_null(
        json_object_get(json_object_get(res, "artifacts"), "/workspace/never-written")));
    ck_assert(json_is_null(json_object_get(res, "capture_error")));
    assert_cleanup_confirmed(res);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(res, "cleanup"), "return_code")), 0);
    ck_assert(json_is_false(json_object_get(json_object_get(res, "cleanup"), "timed_out")));
    ck_assert_int_eq(json_integer_value(json_object_get(res, "output_log_bytes")),
                     (json_int_t)strlen("harness says hi\n"));
    snprintf(id, sizeof(id), "%s", str(res, "activation_id"));
    ck_assert_int_eq(strncmp(id, "act-", 4), 0);
    ck_assert_int_eq(collections(&D, id), 1);

    /* The activation record: not closed; its state is the harness's outcome, as execute
     * answered (not "running"), with the same return code; the log. */
    act = get_activation(&D, "act-fin", true);
    ck_assert_str_eq(str(act, "state"), "finished");
    ck_assert_int_eq(json_integer_value(json_object_get(act, "return_code")), 0);
    ck_assert_str_eq(str(act, "outcome"), "finished");
    ck_assert_str_eq(str(act, "log"), "harness says hi\n");
    ck_assert(json_is_true(json_object_get(act, "artifacts_collected")));
    json_decref(act);

    /* Change the file: a close that collected again would see it. */
    out = lbt_sh(&D, sbx, "echo changed > /workspace/out.txt");
    free(out);
    close_session(&D, "act-fin", &c1);
    ck_assert_msg(c1.status == 200, "close: %ld %s", c1.status, c1.body);
    ck_assert(json_is_true(json_object_get(c1.json, "closed")));
    ck_assert(json_equal(json_object_get(c1.json, "artifacts"), json_object_get(res, "artifacts")));
    ck_assert(json_equal(json_object_get(c1.json, "cleanup"), json_object_get(res, "cleanup")));
    ck_assert_int_eq(collections(&D, id), 1);
    /* idempotent */
    close_session(&D, "act-fin", &c2);
    ck_assert_int_eq(c2.status, 200);
    ck_assert(json_equal(c1.json, c2.json));
    act = get_activation(&D, "act-fin", false);
    ck_assert_str_eq(str(act, "state"), "closed");
    json_decref(act);

    /* one activation per lent sandbox */
    lbt_resp_free(&r);
    execute(&D, "act-fin", "{\"argv\": [\"true\"]}", &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);
    lbt_resp_free(&c1);
    lbt_resp_free(&c2);
    free(body);
}
END_TEST

/* A harness that runs forever, timeout_s 2: timed_out, nothing of it remains, the partial
 * artifacts are collected. */
START_TEST(test_timeout)
{
    char sbx[64];
    struct lbt_resp r;
    json_t *res;

    seed(&D, "act-timeout", sbx, sizeof(sbx));
    execute(&D, "act-timeout",
            "{\"argv\": [\"sh\", \"-c\", \"echo partial > /workspace/partial.txt; sleep 1000 & "
            "while :; do sleep 1; done\"], \"timeout_s\": 2, \"close_timeout_s\": 6, "
            "\"collect\": [\"/workspace/partial.txt\"]}",
            &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    res = r.json;
    ck_assert_str_eq(str(res, "state"), "timed_out");
    ck_assert(json_is_true(json_object_get(json_object_get(res, "cleanup"), "timed_out")));
    assert_cleanup_confirmed(res);
    assert_artifact(res, "/workspace/partial.txt", "partial\n");
    ck_assert_ptr_nonnull(strstr(str(res, "output_log_tail"), "timed out"));
    ck_assert_int_eq(sbx_count(&D, sbx, "slee[p] 1000|while :; d[o]"), 0);
    sbx_wait_supervisors_gone(&D, sbx);
    lbt_resp_free(&r);
}
END_TEST

/* TERM comes before KILL: a harness that traps TERM and writes "graceful" before exiting. */
START_TEST(test_close_mid_run_terms_first)
{
    char sbx[64], *state;
    struct lbt_async *ex;
    struct lbt_resp r, c;

    seed(&D, "act-term", sbx, sizeof(sbx));
    ex = execute_async(&D, "act-term",
                       "{\"argv\": [\"sh\", \"-c\", \"trap 'echo graceful > "
                       "/workspace/state.txt; exit 0' TERM; echo running > "
                       "/workspace/state.txt; while :; do sleep 0.1; done\"], "
                       "\"collect\": [\"/workspace/state.txt\"]}");
    wait_file(&D, sbx, "/workspace/state.txt", "running", 30);
    close_session(&D, "act-term", &c);
    ck_assert_msg(c.status == 200, "close: %ld %s", c.status, c.body);
    assert_artifact(c.json, "/workspace/state.txt", "graceful\n");
    assert_cleanup_confirmed(c.json);
    state = sbx_file(&D, sbx, "/workspace/state.txt");
    ck_assert_str_eq(state, "graceful\n");
    free(state);
    /* the execute that was waiting answers too, with the same artifacts */
    lbt_async_join(ex, &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "state"), "failed");
    ck_assert(
        json_equal(json_object_get(r.json, "artifacts"), json_object_get(c.json, "artifacts")));
    ck_assert_int_eq(collections(&D, str(r.json, "activation_id")), 1);
    ck_assert_int_eq(sbx_count(&D, sbx, "slee[p] 0.1"), 0);
    lbt_resp_free(&r);
    lbt_resp_free(&c);
}
END_TEST

/* A harness that double-forks a sleep (its own session, reparented to the subreaper) and
 * exits: after execute no sleep remains. */
START_TEST(test_descendant_drain)
{
    char sbx[64];
    struct lbt_resp r;

    seed(&D, "act-drain", sbx, sizeof(sbx));
    execute(&D, "act-drain",
            "{\"argv\": [\"sh\", \"-c\", \"(setsid sleep 1000 >/dev/null 2>&1 &); "
            "sleep 1001 & echo forked; exit 0\"]}",
            &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "state"), "finished");
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "return_code")), 0);
    assert_cleanup_confirmed(r.json);
    ck_assert_int_eq(sbx_count(&D, sbx, "slee[p] 100[01]"), 0);
    lbt_resp_free(&r);
}
END_TEST

/* argv[0] not found: failed, with the exit code and the log. */
START_TEST(test_missing_interpreter)
{
    char sbx[64];
    struct lbt_resp r, c;
    json_t *act;

    seed(&D, "act-missing", sbx, sizeof(sbx));
    execute(&D, "act-missing",
            "{\"argv\": [\"/nonexistent/python9\", \"-c\", \"print(1)\"], "
            "\"collect\": [\"/workspace/out.txt\"]}",
            &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "state"), "failed");
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "return_code")), 127);
    ck_assert_ptr_nonnull(strstr(str(r.json, "error"), "/nonexistent/python9"));
    ck_assert_ptr_nonnull(strstr(str(r.json, "output_log_tail"), "cannot run"));
    ck_assert_int_gt(json_integer_value(json_object_get(r.json, "output_log_bytes")), 0);
    assert_cleanup_confirmed(r.json);
    act = get_activation(&D, "act-missing", true);
    ck_assert_str_eq(str(act, "outcome"), "failed");
    ck_assert_ptr_nonnull(strstr(str(act, "log"), "No such file or directory"));
    json_decref(act);
    close_session(&D, "act-missing", &c);
    ck_assert_int_eq(c.status, 200);
    lbt_resp_free(&c);
    lbt_resp_free(&r);
}
END_TEST

/* Three concurrent closes: one finalization, the artifacts collected once, all 200. */
START_TEST(test_concurrent_closes)
{
    char sbx[64], path[300], *out;
    struct lbt_async *ex, *cl[3];
    struct lbt_resp r, c[3], again;

    seed(&D, "act-conc", sbx, sizeof(sbx));
    ex = execute_async(&D, "act-conc",
                       "{\"argv\": [\"sh\", \"-c\", \"i=0; while :; do i=$((i+1)); echo $i > "
                       "/workspace/t.tmp; mv /workspace/t.tmp /workspace/t.txt; sleep 0.05; "
                       "done\"], \"collect\": [\"/workspace/t.txt\"]}");
    wait_file(&D, sbx, "/workspace/t.txt", "", 30);
    session_path(path, sizeof(path), "act-conc", "close");
    for (int i = 0; i < 3; i++)
        cl[i] = lbt_async_json(&D, "POST", path, "", "{}");
    for (int i = 0; i < 3; i++) {
        lbt_async_join(cl[i], &c[i]);
        ck_assert_msg(c[i].status == 200, "close %d: %ld %s", i, c[i].status, c[i].body);
        ck_assert(json_is_true(json_object_get(c[i].json, "closed")));
        assert_cleanup_confirmed(c[i].json);
        out = artifact(c[i].json, "/workspace/t.txt");
        ck_assert_msg(out != NULL, "no transcript");
        free(out);
    }
    ck_assert(json_equal(c[0].json, c[1].json));
    ck_assert(json_equal(c[0].json, c[2].json));
    lbt_async_join(ex, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_eq(collections(&D, str(c[0].json, "activation_id")), 1);
    /* one finalization: one stop request, one move to closing */
    snprintf(path, sizeof(path), "activation %s: requesting the harness's stop",
             str(c[0].json, "activation_id"));
    ck_assert_int_eq(log_count(&D, path), 1);
    snprintf(path, sizeof(path), "activation %s: closing", str(c[0].json, "activation_id"));
    ck_assert_int_eq(log_count(&D, path), 1);
    /* and a later close neither collects again nor changes the answer */
    out = lbt_sh(&D, sbx, "echo rewritten > /workspace/t.txt");
    free(out);
    close_session(&D, "act-conc", &again);
    ck_assert_int_eq(again.status, 200);
    ck_assert(json_equal(c[0].json, again.json));
    ck_assert_int_eq(collections(&D, str(c[0].json, "activation_id")), 1);
    for (int i = 0; i < 3; i++)
        lbt_resp_free(&c[i]);
    lbt_resp_free(&again);
    lbt_resp_free(&r);
}
END_TEST

/* Cleanup that cannot be confirmed (the supervisor died, no receipt): close is 502 and the
 * activation stays closing, every time; a receipt written inside the sandbox (where the
 * supervisor's used to be) changes nothing; the release's stop is the authority. */
START_TEST(test_unconfirmed_cleanup_retries)
{
    char sbx[64], *out;
    struct lbt_async *ex;
    struct lbt_resp r, c, rel;
    json_t *act;

    seed(&D, "act-unconf", sbx, sizeof(sbx));
    ex = execute_async(&D, "act-unconf",
                       "{\"argv\": [\"sh\", \"-c\", \"echo running > /workspace/s.txt; "
                       "while :; do sleep 0.1; done\"], \"close_timeout_s\": 3, "
                       "\"collect\": [\"/workspace/s.txt\"]}");
    wait_file(&D, sbx, "/workspace/s.txt", "running", 30);
    out = lbt_sh(&D, sbx, "kill -9 $(cat /run/lendbox/act-*/supervisor.pid)");
    free(out);
    for (int i = 0; i < 3; i++) {
        if (i == 2 && lbt_variant_lacks("sealed_receipt")) {
            lbt_skip_note("test_unconfirmed_cleanup_retries (its forged receipt)",
                          lbt_variant_lacks("sealed_receipt"));
        } else if (i == 2) {
            out = lbt_sh(&D, sbx,
                         "cd /run/lendbox/act-* && printf '%s\\n' '{\"cleanup_confirmed\": "
                         "true, \"return_code\": 0, \"timed_out\": false, \"error\": null, "
                         "\"launched\": true, \"stop_requested\": true}' > receipt.json");
            free(out);
        }
        lbt_json(&D, "POST", "/v1/sessions/act-unconf/close", "", "{\"timeout_s\": 0.5}", &c);
        lbt_assert_error(&c, 502, "provider_error");
        lbt_resp_free(&c);
        act = get_activation(&D, "act-unconf", false);
        ck_assert_str_eq(str(act, "state"), "closing");
        ck_assert(json_is_null(json_object_get(act, "return_code")));
        ck_assert(json_is_false(json_object_get(act, "artifacts_collected")));
        json_decref(act);
    }
    lbt_json(&D, "POST", "/v1/sessions/act-unconf/release", "", NULL, &rel);
    ck_assert_int_eq(rel.status, 200);
    act = get_activation(&D, "act-unconf", false);
    ck_assert_str_eq(str(act, "state"), "closed");
    ck_assert(json_is_null(json_object_get(act, "return_code")));
    json_decref(act);
    lbt_async_join(ex, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(str(r.json, "state"), "failed");
    ck_assert(json_is_null(json_object_get(r.json, "return_code")));
    lbt_resp_free(&r);
    lbt_resp_free(&rel);
}
END_TEST

/* Releasing the session closes a running activation first (TERM, then collect). */
START_TEST(test_release_closes_first)
{
    char sbx[64];
    struct lbt_async *ex;
    struct lbt_resp r, rel;
    json_t *act;

    seed(&D, "act-release", sbx, sizeof(sbx));
    ex = execute_async(&D, "act-release",
                       "{\"argv\": [\"sh\", \"-c\", \"trap 'echo graceful > "
                       "/workspace/state.txt; exit 0' TERM; echo running > "
                       "/workspace/state.txt; while :; do sleep 0.1; done\"], "
                       "\"collect\": [\"/workspace/state.txt\"]}");
    wait_file(&D, sbx, "/workspace/state.txt", "running", 30);
    lbt_json(&D, "POST", "/v1/sessions/act-release/release", "", NULL, &rel);
    ck_assert_int_eq(rel.status, 200);
    ck_assert(json_is_true(json_object_get(rel.json, "released")));
    act = get_activation(&D, "act-release", false);
    ck_assert_str_eq(str(act, "state"), "closed");
    assert_artifact(act, "/workspace/state.txt", "graceful\n");
    json_decref(act);
    lbt_async_join(ex, &r);
    ck_assert_int_eq(r.status, 200);
    assert_artifact(r.json, "/workspace/state.txt", "graceful\n");
    lbt_resp_free(&r);
    lbt_resp_free(&rel);
}
END_TEST

/* Send a request and hang up at once, without reading the answer. */
/* Send a POST to `path` and close the connection once the session `rsid` has an activation
 * recorded: a request still waiting in the queue when its client goes is dropped before it
 * starts (http_job_run), so hanging up after a fixed delay raced a busy daemon. */
static void post_and_hang_up(struct lbt_daemon *d, const char *rsid, const char *path,
                             const char *body)
{
    char apath[300];
    double until;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    char req[2048];
    int fd, port = 0, n;

    ck_assert_int_eq(sscanf(d->base_url, "http://127.0.0.1:%d", &port), 1);
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    n = snprintf(req, sizeof(req),
                 "POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n"
                 "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                 path, d->admin_token, strlen(body), body);
    ck_assert_int_eq(write(fd, req, (size_t)n), n);
    snprintf(apath, sizeof(apath), "/v1/sessions/%s/activation", rsid);
    until = lbt_now() + 60;
    for (;;) {
        struct lbt_resp r;
        long status;

        lbt_json(d, "GET", apath, "", NULL, &r);
        status = r.status;
        ck_assert_msg(status == 200 || status == 404, "activation of %s: %ld %s", rsid, status,
                      r.body);
        lbt_resp_free(&r);
        if (status == 200)
            break;
        ck_assert_msg(lbt_now() < until, "the execute request was never taken in");
        lbt_sleep_ms(50);
    }
    close(fd);
}

/* A client that disconnects does not stop the harness: it runs to its end and is collected. */
START_TEST(test_client_disconnect)
{
    char sbx[64], path[300];
    json_t *act = NULL;
    double until;

    seed(&D, "act-hangup", sbx, sizeof(sbx));
    session_path(path, sizeof(path), "act-hangup", "execute");
    post_and_hang_up(&D, "act-hangup", path,
                     "{\"argv\": [\"sh\", \"-c\", \"sleep 1; echo done > /workspace/done.txt\"], "
                     "\"collect\": [\"/workspace/done.txt\"]}");
    until = lbt_now() + 60;
    for (;;) {
        json_decref(act);
        act = get_activation(&D, "act-hangup", false);
        if (json_is_true(json_object_get(act, "artifacts_collected")))
            break;
        ck_assert_msg(lbt_now() < until, "the harness was never collected");
        lbt_sleep_ms(100);
    }
    ck_assert_str_eq(str(act, "outcome"), "finished");
    assert_artifact(act, "/workspace/done.txt", "done\n");
    json_decref(act);
}
END_TEST

START_TEST(test_input_and_errors)
{
    static const char *const bad[] = {
        "{}",
        "{\"argv\": []}",
        "{\"argv\": [\"\"]}",
        "{\"argv\": \"true\"}",
        "{\"argv\": [\"true\"], \"bogus\": 1}",
        "{\"argv\": [\"true\"], \"collect\": [\"relative/path\"]}",
        "{\"argv\": [\"true\"], \"collect\": [\"/a/../b\"]}",
        "{\"argv\": [\"true\"], \"timeout_s\": 0}",
        "{\"argv\": [\"true\"], \"close_timeout_s\": -1}",
        "{\"argv\": [\"true\"], \"stage\": {\"rel\": \"x\"}}",
        "{\"argv\": [\"true\"], \"stage\": {\"/x\": {\"base64\": \"!!\"}}}",
        "{\"argv\": [\"true\"], \"env\": {\"A=B\": \"x\"}}",
        "{\"argv\": [\"true\"], \"cwd\": \"tmp\"}",
    };
    struct lbt_resp r;
    json_t *lease, *other;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        execute(&D, "act-input", bad[i], &r);
        ck_assert_msg(r.status == 400, "%s: %ld", bad[i], r.status);
        lbt_assert_error(&r, 400, "bad_request");
        lbt_resp_free(&r);
    }
    /* no lent sandbox */
    execute(&D, "act-nobody", "{\"argv\": [\"true\"]}", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/sessions/act-nobody/activation", "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    close_session(&D, "act-nobody", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert(json_is_false(json_object_get(r.json, "closed")));
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/act-nobody/close", "", "{\"timeout_s\": 0}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/sessions/act-nobody/activation?log=yes", "", NULL, &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    /* admin, or the session's own operate token (test_operate_token_activation): another
     * sandbox's operate token gets 403 */
    lease = lbt_seed(&D, "act-input", "task-act", NULL);
    other = lbt_seed(&D, "act-input-other", "task-act", NULL);
    {
        const char *tok =
            json_string_value(json_object_get(json_object_get(other, "access"), "token"));

        lbt_json(&D, "POST", "/v1/sessions/act-input/execute", tok, "{\"argv\": [\"true\"]}", &r);
        lbt_assert_error(&r, 403, "forbidden");
        lbt_resp_free(&r);
        lbt_json(&D, "POST", "/v1/sessions/act-input/close", tok, "{}", &r);
        lbt_assert_error(&r, 403, "forbidden");
        lbt_resp_free(&r);
        lbt_json(&D, "GET", "/v1/sessions/act-input/activation", tok, NULL, &r);
        lbt_assert_error(&r, 403, "forbidden");
        lbt_resp_free(&r);
    }
    /* a bad cwd fails the launch: failed, with why */
    execute(&D, "act-input", "{\"argv\": [\"true\"], \"cwd\": \"/nope\"}", &r);
    ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "state"), "failed");
    ck_assert_ptr_nonnull(strstr(str(r.json, "error"), "/nope"));
    lbt_resp_free(&r);
    json_decref(lease);
    json_decref(other);
}
END_TEST

/* ---------- preserve_background_services ---------- */

/* A listener on port that stays in the foreground: python3's http.server, else perl, else
 * (a busybox image, the docker variant's) busybox nc as a persistent server. */
static void listener_command(char *buf, size_t len, int port)
{
    snprintf(buf, len,
             "if command -v python3 >/dev/null 2>&1; then exec python3 -m http.server %d; "
             "elif command -v perl >/dev/null 2>&1; then "
             "exec perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(LocalAddr => "
             "\"127.0.0.1:%d\", Listen => 5, ReuseAddr => 1) or die; while ($c = $s->accept) "
             "{ close $c }' lbt-listen-%d; else exec nc -ll -p %d -e true; fi",
             port, port, port, port);
}

/* Exec a probe of port: tries for up to tries x 100 ms; returns its exit code. */
static int probe_port(const char *sbx, int port, int tries)
{
    char cmd[512];
    json_t *res;
    char *body;
    int rc;

    snprintf(cmd, sizeof(cmd),
             "if command -v bash >/dev/null 2>&1; then p() { bash -c 'exec "
             "3<>/dev/tcp/127.0.0.1/%d' 2>/dev/null; }; else p() { nc -w 1 127.0.0.1 %d "
             "</dev/null >/dev/null 2>&1; }; fi; "
             "for i in $(seq %d); do p && exit 0; sleep 0.1; done; exit 1",
             port, port, tries);
    body = dumps(json_pack("{s:s}", "command", cmd));
    res = lbt_exec_ok(&D, sbx, "", body);
    free(body);
    rc = (int)json_integer_value(json_object_get(res, "return_code"));
    json_decref(res);
    return rc;
}

START_TEST(test_preserve_background_services)
{
    char sbx[64], listen[512], cmd[700], pattern[96], *body;
    json_t *res;

    seed(&D, "act-bg", sbx, sizeof(sbx));
    /* with the flag the server outlives the exec */
    listener_command(listen, sizeof(listen), 8000);
    snprintf(cmd, sizeof(cmd), "(%s) >/dev/null 2>&1 &", listen);
    body = dumps(json_pack("{s:s,s:b}", "command", cmd, "preserve_background_services", 1));
    res = lbt_exec_ok(&D, sbx, "", body);
    free(body);
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    json_decref(res);
    ck_assert_int_eq(probe_port(sbx, 8000, 150), 0);
    ck_assert_int_eq(probe_port(sbx, 8000, 1), 0); /* still there for a later exec */

    /* without it every descendant dies with the exec */
    listener_command(listen, sizeof(listen), 8001);
    snprintf(cmd, sizeof(cmd), "(%s) >/dev/null 2>&1 & sleep 1", listen);
    body = dumps(json_pack("{s:s}", "command", cmd));
    res = lbt_exec_ok(&D, sbx, "", body);
    free(body);
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    json_decref(res);
    snprintf(pattern, sizeof(pattern), "http.serve[r] 8001|lbt-liste[n]-8001|n[c] -ll -p 8001");
    ck_assert_int_eq(sbx_count(&D, sbx, pattern), 0);
    ck_assert_int_ne(probe_port(sbx, 8001, 1), 0);
    /* the preserved one is unaffected */
    ck_assert_int_eq(probe_port(sbx, 8000, 1), 0);
}
END_TEST

/* ---------- pause / resume ---------- */

static long counter(const char *sbx)
{
    char *c = sbx_file(&D, sbx, "/workspace/count");
    long v = c ? atol(c) : -1;

    free(c);
    return v;
}

START_TEST(test_pause_resume)
{
    char sbx[64], path[300];
    struct lbt_resp r;
    json_t *lease, *res;
    const char *tok;
    long a, b;
    double until;

    lease = lbt_seed(&D, "act-pause", "task-act", NULL);
    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    tok = json_string_value(json_object_get(json_object_get(lease, "access"), "token"));
    res = lbt_exec_ok(&D, sbx, "",
                      "{\"command\": \"(i=0; while :; do i=$((i+1)); echo $i > /workspace/c.tmp; "
                      "mv /workspace/c.tmp /workspace/count; sleep 0.02; done) >/dev/null 2>&1 "
                      "&\", \"preserve_background_services\": true}");
    json_decref(res);
    wait_file(&D, sbx, "/workspace/count", "", 30);
    a = counter(sbx);
    until = lbt_now() + 30;
    while (counter(sbx) <= a + 2 && lbt_now() < until)
        lbt_sleep_ms(50);
    ck_assert_int_gt(counter(sbx), a + 2);

    /* pause (the operate token may): status paused, no progress, exec 409 */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pause", sbx);
    lbt_json(&D, "POST", path, tok, NULL, &r);
    ck_assert_msg(r.status == 200, "pause: %ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "status"), "paused");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", path, "", NULL, &r); /* again: still paused */
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(str(r.json, "status"), "paused");
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    lbt_json(&D, "GET", path, "", NULL, &r);
    ck_assert_str_eq(str(r.json, "status"), "paused");
    lbt_resp_free(&r);
    a = counter(sbx);
    lbt_sleep_ms(600);
    b = counter(sbx);
    ck_assert_int_eq(a, b);
    lbt_exec(&D, sbx, "", "{\"command\": \"true\"}", &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);
    execute(&D, "act-pause", "{\"argv\": [\"true\"]}", &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);

    /* resume: running, progress again, exec works */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/resume", sbx);
    lbt_json(&D, "POST", path, tok, NULL, &r);
    ck_assert_msg(r.status == 200, "resume: %ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "status"), "running");
    lbt_resp_free(&r);
    until = lbt_now() + 30;
    while (counter(sbx) <= b + 2 && lbt_now() < until)
        lbt_sleep_ms(50);
    ck_assert_int_gt(counter(sbx), b + 2);
    res = lbt_exec_ok(&D, sbx, "", "{\"command\": \"true\"}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    json_decref(res);

    /* unknown sandbox: 404; released sandbox: 404 */
    lbt_json(&D, "POST", "/v1/sandboxes/sbx-00000000000000000000000000/pause", "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    json_decref(lease);
}
END_TEST

/* ---------- cases with a daemon of their own ---------- */

/* Close before the launch (staging still running): nothing is launched, close returns closed. */
START_TEST(test_close_before_launch)
{
    static const char *const extra[] = {"--set", "faults.spec=provider.file_write=delay:5000",
                                        NULL};
    struct lbt_daemon d;
    char sbx[64], *out;
    struct lbt_async *ex;
    struct lbt_resp r, c;
    json_t *act;
    double until;

    lbt_daemon_start(&d, extra);
    seed(&d, "act-early", sbx, sizeof(sbx));
    ex = execute_async(&d, "act-early",
                       "{\"argv\": [\"sh\", \"-c\", \"touch /workspace/launched\"], "
                       "\"stage\": {\"/workspace/in.txt\": \"slow to stage\"}, "
                       "\"collect\": [\"/workspace/in.txt\"]}");
    until = lbt_now() + 30;
    for (;;) {
        char p[128];

        lbt_json(&d, "GET", "/v1/sessions/act-early/activation", "", NULL, &r);
        snprintf(p, sizeof(p), "%s", r.json ? str(r.json, "state") : "");
        lbt_resp_free(&r);
        if (!strcmp(p, "staging"))
            break;
        ck_assert_msg(lbt_now() < until, "the activation never showed staging");
        lbt_sleep_ms(20);
    }
    close_session(&d, "act-early", &c);
    ck_assert_msg(c.status == 200, "close: %ld %s", c.status, c.body);
    ck_assert(json_is_true(json_object_get(c.json, "closed")));
    ck_assert_str_eq(str(c.json, "state"), "closed");
    assert_cleanup_confirmed(c.json);
    ck_assert(json_is_null(json_object_get(json_object_get(c.json, "cleanup"), "return_code")));
    lbt_async_join(ex, &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);
    lbt_sleep_ms(300);
    out = lbt_sh(&d, sbx,
                 "test -e /workspace/launched && echo yes || echo no; "
                 "readlink /run/lendbox/act-*/launch.claim");
    ck_assert_str_eq(out, "no\nstop\n");
    free(out);
    act = get_activation(&d, "act-early", false);
    ck_assert_str_eq(str(act, "state"), "closed");
    json_decref(act);
    lbt_resp_free(&c);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* SIGKILL the daemon while a harness runs, restart: close stops the harness and collects. */
START_TEST(test_daemon_restart)
{
    struct lbt_daemon d;
    char sbx[64], *state;
    struct lbt_async *ex;
    struct lbt_resp r, c;
    json_t *act;

    lbt_daemon_start(&d, NULL);
    seed(&d, "act-restart", sbx, sizeof(sbx));
    ex = execute_async(&d, "act-restart",
                       "{\"argv\": [\"sh\", \"-c\", \"trap 'echo graceful > "
                       "/workspace/state.txt; exit 0' TERM; echo running > "
                       "/workspace/state.txt; while :; do sleep 0.1; done\"], "
                       "\"collect\": [\"/workspace/state.txt\"]}");
    wait_file(&d, sbx, "/workspace/state.txt", "running", 30);
    lbt_daemon_kill(&d);
    lbt_async_join(ex, &r); /* the connection died with the daemon */
    ck_assert_int_ne(r.status, 200);
    lbt_resp_free(&r);
    lbt_daemon_restart(&d, NULL);

    act = get_activation(&d, "act-restart", true);
    ck_assert_str_eq(str(act, "state"), "running");
    ck_assert(json_is_null(json_object_get(act, "outcome")));
    json_decref(act);
    ck_assert_int_gt(sbx_count(&d, sbx, "slee[p] 0.1"), 0);
    ck_assert_int_gt(sbx_count_supervisors(&d, sbx), 0);
    state = sbx_file(&d, sbx, "/workspace/state.txt");
    ck_assert_str_eq(state, "running\n");
    free(state);

    close_session(&d, "act-restart", &c);
    ck_assert_msg(c.status == 200, "close: %ld %s", c.status, c.body);
    assert_artifact(c.json, "/workspace/state.txt", "graceful\n");
    assert_cleanup_confirmed(c.json);
    ck_assert_int_eq(sbx_count(&d, sbx, "slee[p] 0.1"), 0);
    sbx_wait_supervisors_gone(&d, sbx);
    act = get_activation(&d, "act-restart", false);
    ck_assert_str_eq(str(act, "state"), "closed");
    json_decref(act);
    lbt_resp_free(&c);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* Processes other than the daemon itself holding the state dir's lock file open. */
static int lock_holders(const struct lbt_daemon *d)
{
    char lock[300], dir[64], link[340], target[300];
    struct dirent *pe, *fe;
    DIR *proc = opendir("/proc"), *fds;
    int n = 0;
    ssize_t k;

    ck_assert_ptr_nonnull(proc);
    snprintf(lock, sizeof(lock), "%s/lendboxd.lock", d->state_dir);
    while ((pe = readdir(proc))) {
        int pid = atoi(pe->d_name);

        if (pid <= 0 || pid == (int)d->pid)
            continue;
        snprintf(dir, sizeof(dir), "/proc/%d/fd", pid);
        if (!(fds = opendir(dir)))
            continue;
        while ((fe = readdir(fds))) {
            snprintf(link, sizeof(link), "%s/%s", dir, fe->d_name);
            k = readlink(link, target, sizeof(target) - 1);
            if (k > 0) {
                target[k] = '\0';
                if (strcmp(target, lock) == 0) {
                    fprintf(stderr, "pid %d holds %s\n", pid, lock);
                    n++;
                }
            }
        }
        closedir(fds);
    }
    closedir(proc);
    return n;
}

/* Hostile-tester finding: execute and an immediate pause, racing. Every execute answers (200
 * or 409 "paused"), no process but the daemon holds its lock file even while the sandboxes
 * stay frozen (a helper frozen mid-launch kept the daemon's fds), and after a SIGKILL the
 * daemon restarts on the same state dir. */
START_TEST(test_execute_pause_race)
{
    enum { N = 8 };
    struct lbt_daemon d;
    char sbx[N][64], rsid[N][32], path[600];
    struct lbt_async *ex[N];
    struct lbt_resp r;
    double until;
    int i;

    lbt_daemon_start(&d, NULL);
    for (i = 0; i < N; i++) {
        snprintf(rsid[i], sizeof(rsid[i]), "act-race-%d", i);
        seed(&d, rsid[i], sbx[i], sizeof(sbx[i]));
    }
    for (i = 0; i < N; i++) {
        ex[i] = execute_async(&d, rsid[i], "{\"argv\": [\"sleep\", \"1\"]}");
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/pause", sbx[i]);
        lbt_json(&d, "POST", path, "", NULL, &r);
        ck_assert_msg(r.status == 200 || r.status == 409, "pause: %ld %s", r.status, r.body);
        lbt_resp_free(&r);
    }
    lbt_sleep_ms(1500); /* frozen a while: any helper caught mid-launch is in the freezer */
    ck_assert_int_eq(lock_holders(&d), 0);
    for (i = 0; i < N; i++) {
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/resume", sbx[i]);
        lbt_json(&d, "POST", path, "", NULL, &r);
        ck_assert_msg(r.status == 200, "resume: %ld %s", r.status, r.body);
        lbt_resp_free(&r);
    }
    until = lbt_now() + 90;
    for (i = 0; i < N; i++) {
        while (!lbt_async_done(ex[i]) && lbt_now() < until)
            lbt_sleep_ms(50);
        ck_assert_msg(lbt_async_done(ex[i]), "execute %d never answered", i);
        lbt_async_join(ex[i], &r);
        ck_assert_msg(r.status == 200 || r.status == 409, "execute %d: %ld %s", i, r.status,
                      r.body);
        lbt_resp_free(&r);
    }
    ck_assert_int_eq(lock_holders(&d), 0);
    lbt_daemon_kill(&d);
    lbt_daemon_restart(&d, NULL);
    lbt_json(&d, "GET", "/v1/sandboxes", "", NULL, &r);
    ck_assert_msg(r.status == 200, "after restart: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* Is there a complete receipt (one ending in a newline) in d's activations dir? */
static bool receipt_complete(struct lbt_daemon *d)
{
    char path[400];
    struct dirent *e;
    bool done = false;
    DIR *dir;

    snprintf(path, sizeof(path), "%s/activations", d->state_dir);
    dir = opendir(path);
    while (dir && !done && (e = readdir(dir))) {
        size_t len = strlen(e->d_name);
        char file[700];
        struct stat st;
        char last = 0;
        int fd;

        if (len < 8 || strcmp(e->d_name + len - 8, ".receipt") != 0)
            continue;
        snprintf(file, sizeof(file), "%s/%s", path, e->d_name);
        fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 0 &&
            pread(fd, &last, 1, st.st_size - 1) == 1)
            done = last == '\n';
        if (fd >= 0)
            close(fd);
    }
    if (dir)
        closedir(dir);
    return done;
}

/* The daemon is SIGKILLed while execute waits, and the harness ends (rc 3) while it is down:
 * after the restart the activation reads as finished with that return code (GET), and the
 * close reports the same code. */
START_TEST(test_restart_harness_ended_meanwhile)
{
    struct lbt_daemon d;
    char sbx[64];
    struct lbt_async *ex;
    struct lbt_resp r, c;
    json_t *act = NULL, *cl;

    lbt_daemon_start(&d, NULL);
    seed(&d, "act-restart-rc", sbx, sizeof(sbx));
    ex = execute_async(&d, "act-restart-rc",
                       "{\"argv\": [\"sh\", \"-c\", \"echo running > /workspace/state.txt; "
                       "sleep 2; echo ended > /workspace/state.txt; exit 3\"], "
                       "\"collect\": [\"/workspace/state.txt\"]}");
    wait_file(&d, sbx, "/workspace/state.txt", "running", 30);
    lbt_daemon_kill(&d);
    lbt_async_join(ex, &r);
    ck_assert_int_ne(r.status, 200);
    lbt_resp_free(&r);
    /* the harness ends while no daemon runs: its receipt, complete (a trailing newline), is in
     * <state_dir>/activations on the host; where the receipt is a file inside the instance
     * (lxd) nothing on the host says so: the harness's 2 s, with a margin */
    if (lbt_variant_lacks("sealed_receipt"))
        lbt_sleep_ms(3000);
    else
        while (!receipt_complete(&d))
            lbt_sleep_ms(50);
    lbt_daemon_restart(&d, NULL);
    for (int i = 0; i < 150; i++) { /* its receipt is on the host already; allow slow start */
        json_decref(act);
        act = get_activation(&d, "act-restart-rc", false);
        if (strcmp(str(act, "state"), "running") != 0)
            break;
        lbt_sleep_ms(200);
    }
    ck_assert_str_eq(str(act, "state"), "finished");
    ck_assert_int_eq(json_integer_value(json_object_get(act, "return_code")), 3);
    json_decref(act);
    act = get_activation(&d, "act-restart-rc", false); /* and stays so */
    ck_assert_str_eq(str(act, "state"), "finished");
    json_decref(act);
    close_session(&d, "act-restart-rc", &c);
    ck_assert_msg(c.status == 200, "close: %ld %s", c.status, c.body);
    ck_assert_int_eq(json_integer_value(json_object_get(c.json, "return_code")), 3);
    cl = json_object_get(c.json, "cleanup");
    ck_assert_int_eq(json_integer_value(json_object_get(cl, "return_code")), 3);
    assert_cleanup_confirmed(c.json);
    assert_artifact(c.json, "/workspace/state.txt", "ended\n");
    lbt_resp_free(&c);
    act = get_activation(&d, "act-restart-rc", false);
    ck_assert_str_eq(str(act, "state"), "closed");
    ck_assert_int_eq(json_integer_value(json_object_get(act, "return_code")), 3);
    json_decref(act);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* ---------- the agent side (operate token), wait:false, long-poll, stop ---------- */

/* Seed rsid and return its operate token too. */
static void seed_op(struct lbt_daemon *d, const char *rsid, char *sbx, size_t len, char *tok,
                    size_t tok_len)
{
    json_t *lease = lbt_seed(d, rsid, "task-act", NULL);

    snprintf(sbx, len, "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    snprintf(tok, tok_len, "%s",
             json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
}

/* A request on a session route with token; returns the status, the response in *r. */
static long session_req(struct lbt_daemon *d, const char *method, const char *rsid,
                        const char *what, const char *token, const char *body, struct lbt_resp *r)
{
    char path[300];

    session_path(path, sizeof(path), rsid, what);
    lbt_json(d, method, path, token, body, r);
    return r->status;
}

/* The operate token of a session's sandbox may execute, read and close that session's
 * activation (2xx); another sandbox's token is 403 on every activation route. The harness's
 * environment names its stop-request file (LENDBOX_STOP_REQUEST), as GET does. */
START_TEST(test_operate_token_activation)
{
    char sa[64], ta[128], sb[64], tb[128], want[200];
    struct lbt_resp r;
    json_t *act;

    seed_op(&D, "act-op-a", sa, sizeof(sa), ta, sizeof(ta));
    seed_op(&D, "act-op-b", sb, sizeof(sb), tb, sizeof(tb));
    /* another sandbox's token: 403 everywhere, before anything runs */
    ck_assert_int_eq(
        session_req(&D, "POST", "act-op-a", "execute", tb, "{\"argv\": [\"true\"]}", &r), 403);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);

    ck_assert_int_eq(session_req(&D, "POST", "act-op-a", "execute", ta,
                                 "{\"argv\": [\"sh\", \"-c\", \"echo $LENDBOX_STOP_REQUEST "
                                 "$LENDBOX_ACTIVATION_ID > /workspace/env.txt\"], "
                                 "\"collect\": [\"/workspace/env.txt\"]}",
                                 &r),
                     200);
    ck_assert_str_eq(str(r.json, "state"), "finished");
    snprintf(want, sizeof(want), "/run/lendbox/%s/stop.request %s\n", str(r.json, "activation_id"),
             str(r.json, "activation_id"));
    assert_artifact(r.json, "/workspace/env.txt", want);
    lbt_resp_free(&r);

    ck_assert_int_eq(session_req(&D, "GET", "act-op-a", "activation", tb, NULL, &r), 403);
    lbt_resp_free(&r);
    ck_assert_int_eq(session_req(&D, "GET", "act-op-a", "activation?log=1", ta, NULL, &r), 200);
    want[strlen(want) - 1] = '\0';
    *strchr(want, ' ') = '\0';
    ck_assert_str_eq(str(r.json, "stop_request_path"), want);
    ck_assert(json_is_true(json_object_get(r.json, "wait")));
    ck_assert(json_is_string(json_object_get(r.json, "log")));
    lbt_resp_free(&r);
    ck_assert_int_eq(session_req(&D, "POST", "act-op-a", "stop_harness", tb, "{}", &r), 403);
    lbt_resp_free(&r);
    ck_assert_int_eq(session_req(&D, "POST", "act-op-a", "close", tb, "{}", &r), 403);
    lbt_resp_free(&r);
    ck_assert_int_eq(session_req(&D, "POST", "act-op-a", "close", ta, "{}", &r), 200);
    ck_assert(json_is_true(json_object_get(r.json, "closed")));
    lbt_resp_free(&r);
    /* the session's other routes stay admin's */
    ck_assert_int_eq(session_req(&D, "POST", "act-op-a", "release", ta, NULL, &r), 403);
    lbt_resp_free(&r);
    /* a token of no sandbox is 401 */
    ck_assert_int_eq(session_req(&D, "GET", "act-op-a", "activation", "lbo_nope", NULL, &r), 401);
    lbt_resp_free(&r);
    /* released: the session has no live sandbox; its old token still reads its activation,
     * the other session's token still does not */
    ck_assert_int_eq(session_req(&D, "POST", "act-op-a", "release", "", NULL, &r), 200);
    lbt_resp_free(&r);
    ck_assert_int_eq(session_req(&D, "GET", "act-op-a", "activation", ta, NULL, &r), 200);
    ck_assert_str_eq(str(r.json, "state"), "closed");
    lbt_resp_free(&r);
    ck_assert_int_eq(session_req(&D, "GET", "act-op-a", "activation", tb, NULL, &r), 403);
    lbt_resp_free(&r);
    act = get_activation(&D, "act-op-a", false);
    json_decref(act);
}
END_TEST

/* "wait": false answers 202 with the activation id; GET polls (running, outcome null), a
 * long-poll returns when the harness ends, with the artifacts collected then; close gives
 * the same result. Bad wait_ms is 400; a long-poll that times out answers the same state. */
START_TEST(test_nowait_and_long_poll)
{
    char sbx[64], tok[128], id[64];
    struct lbt_resp r;

    seed_op(&D, "act-nowait", sbx, sizeof(sbx), tok, sizeof(tok));
    ck_assert_int_eq(session_req(&D, "POST", "act-nowait", "execute", tok,
                                 "{\"wait\": false, \"argv\": [\"sh\", \"-c\", \"echo started > "
                                 "/workspace/s.txt; sleep 2; echo done > /workspace/out.txt; "
                                 "exit 5\"], \"collect\": [\"/workspace/out.txt\"]}",
                                 &r),
                     202);
    ck_assert_str_eq(str(r.json, "state"), "running");
    snprintf(id, sizeof(id), "%s", str(r.json, "activation_id"));
    ck_assert(!strncmp(id, "act-", 4));
    ck_assert_int_eq(json_object_size(r.json), 2);
    lbt_resp_free(&r);

    ck_assert_int_eq(session_req(&D, "GET", "act-nowait", "activation", tok, NULL, &r), 200);
    ck_assert_str_eq(str(r.json, "activation_id"), id);
    ck_assert_str_eq(str(r.json, "state"), "running");
    ck_assert(json_is_null(json_object_get(r.json, "outcome")));
    ck_assert(json_is_false(json_object_get(r.json, "wait")));
    lbt_resp_free(&r);
    /* a short long-poll ends with nothing new */
    ck_assert_int_eq(session_req(&D, "GET", "act-nowait", "activation?wait_ms=200", tok, NULL, &r),
                     200);
    ck_assert(json_is_null(json_object_get(r.json, "outcome")));
    lbt_resp_free(&r);
    ck_assert_int_eq(session_req(&D, "GET", "act-nowait", "activation?wait_ms=x", tok, NULL, &r),
                     400);
    lbt_resp_free(&r);
    ck_assert_int_eq(session_req(&D, "GET", "act-nowait", "activation?wait_ms=-5", "", NULL, &r),
                     400);
    lbt_resp_free(&r);
    /* the long-poll returns once the harness ended, and that answer collected */
    {
        double until = lbt_now() + 60;

        for (;;) {
            ck_assert_int_eq(
                session_req(&D, "GET", "act-nowait", "activation?wait_ms=30000", tok, NULL, &r),
                200);
            if (!json_is_null(json_object_get(r.json, "outcome")))
                break;
            ck_assert_msg(lbt_now() < until, "the harness never ended");
            lbt_resp_free(&r);
        }
    }
    ck_assert_str_eq(str(r.json, "outcome"), "finished");
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "return_code")), 5);
    ck_assert(json_is_true(json_object_get(r.json, "artifacts_collected")));
    assert_artifact(r.json, "/workspace/out.txt", "done\n");
    assert_cleanup_confirmed(r.json);
    lbt_resp_free(&r);
    /* an ended harness answers at once */
    ck_assert_int_eq(session_req(&D, "GET", "act-nowait", "activation?wait_ms=30000", "", NULL, &r),
                     200);
    ck_assert_str_eq(str(r.json, "outcome"), "finished");
    lbt_resp_free(&r);
    close_session(&D, "act-nowait", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "return_code")), 5);
    assert_artifact(r.json, "/workspace/out.txt", "done\n");
    lbt_resp_free(&r);
    ck_assert_int_eq(session_req(&D, "POST", "act-nowait", "execute", "",
                                 "{\"wait\": \"no\", \"argv\": [\"true\"]}", &r),
                     400);
    lbt_resp_free(&r);
}
END_TEST

/* stop_harness (NeMo Gym's): a harness that watches $LENDBOX_STOP_REQUEST (and ignores TERM)
 * sees the file and exits by itself with its own code; cleanup confirmed; no capture until
 * a GET (wait:false) or close; repeated, it answers the same. */
START_TEST(test_stop_harness)
{
    char sbx[64], tok[128], *got;
    struct lbt_resp r;

    seed_op(&D, "act-stop", sbx, sizeof(sbx), tok, sizeof(tok));
    ck_assert_int_eq(session_req(&D, "POST", "act-stop", "stop_harness", tok, "{}", &r), 404);
    lbt_resp_free(&r);
    ck_assert_int_eq(
        session_req(&D, "POST", "act-stop", "execute", tok,
                    "{\"wait\": false, \"close_timeout_s\": 30, \"argv\": [\"sh\", \"-c\", "
                    "\"trap '' TERM; echo watching > /workspace/w.txt; "
                    "while [ ! -e \\\"$LENDBOX_STOP_REQUEST\\\" ]; do sleep 0.05; done; "
                    "echo saw-stop > /workspace/stop.txt; exit 7\"], "
                    "\"collect\": [\"/workspace/stop.txt\"]}",
                    &r),
        202);
    lbt_resp_free(&r);
    wait_file(&D, sbx, "/workspace/w.txt", "watching", 30);
    /* the counts below see the running harness (its shell's command line names the sleep)
     * and its supervisor, so their zeros after the stop mean something */
    ck_assert_int_gt(sbx_count(&D, sbx, "slee[p] 0.05"), 0);
    ck_assert_int_gt(sbx_count_supervisors(&D, sbx), 0);
    ck_assert_int_eq(session_req(&D, "POST", "act-stop", "stop_harness", tok, "{\"x\": 1}", &r),
                     400);
    lbt_resp_free(&r);
    ck_assert_int_eq(
        session_req(&D, "POST", "act-stop", "stop_harness", tok, "{\"timeout_s\": 30}", &r), 200);
    /* it exited by itself (7), not by the KILL 10 s after the TERM it ignored (137) */
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "return_code")), 7);
    ck_assert_str_eq(str(r.json, "outcome"), "failed"); /* stopped before it ended */
    assert_cleanup_confirmed(r.json);
    lbt_resp_free(&r);
    got = sbx_file(&D, sbx, "/workspace/stop.txt");
    ck_assert_str_eq(got, "saw-stop\n");
    free(got);
    ck_assert_int_eq(sbx_count(&D, sbx, "slee[p] 0.05"), 0);
    sbx_wait_supervisors_gone(&D, sbx);
    /* repeated: nothing to do, same answer */
    ck_assert_int_eq(session_req(&D, "POST", "act-stop", "stop_harness", "", NULL, &r), 200);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "return_code")), 7);
    lbt_resp_free(&r);
    close_session(&D, "act-stop", &r);
    ck_assert_int_eq(r.status, 200);
    assert_artifact(r.json, "/workspace/stop.txt", "saw-stop\n");
    lbt_resp_free(&r);
}
END_TEST

/* docker: the harness's receipt goes to the harness's launcher alone. The engine passes no
 * fds, so the daemon offers the receipt on a socket in the sandbox's pass directory
 * (/run/lendbox/pass) and hands it only to the exec's own process. An agent process (operate
 * token) loops over that directory opening every entry and connecting to every socket while
 * the activation launches: it sees the daemon's socket but gets no fd (with a hard-linked
 * receipt it opened it and forged return code 0), and the activation's result is the
 * harness's own (7). */
START_TEST(test_receipt_pass_race)
{
    char sbx[64], tok[128], probe[1024], copy[1024], body[1024];
    const char *daemon = getenv("LENDBOXD") ? getenv("LENDBOXD") : "build/lendboxd";
    struct lbt_resp r;
    size_t len = 0;
    char *data, *log;
    FILE *f;
    json_t *res;

    if (strcmp(lbt_variant(), "docker") != 0)
        return; /* the other providers pass the receipt as an fd, with no directory */
    seed_op(&D, "act-pass", sbx, sizeof(sbx), tok, sizeof(tok));
    snprintf(copy, sizeof(copy), "%s", daemon);
    snprintf(probe, sizeof(probe), "%s/tests/lbt-probe", dirname(copy));
    f = fopen(probe, "rb");
    ck_assert_msg(f != NULL, "no %s (make build/tests/lbt-probe)", probe);
    data = malloc(4 << 20);
    ck_assert_ptr_nonnull(data);
    len = fread(data, 1, 4 << 20, f);
    fclose(f);
    ck_assert_int_gt(len, 0);
    lbt_file_put(&D, sbx, tok, "/workspace/lbt-probe", "0755", data, len, &r);
    ck_assert_msg(r.status == 204, "upload of the probe: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    free(data);
    snprintf(body, sizeof(body),
             "{\"command\": \"/workspace/lbt-probe passgrab /run/lendbox/pass /workspace/grab.log"
             " </dev/null >/dev/null 2>&1 & while [ ! -s /workspace/grab.log.pid ]; do sleep "
             "0.01; done\", \"preserve_background_services\": true, \"timeout_s\": 30}");
    res = lbt_exec_ok(&D, sbx, tok, body);
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    json_decref(res);

    ck_assert_int_eq(session_req(&D, "POST", "act-pass", "execute", tok,
                                 "{\"argv\": [\"sh\", \"-c\", \"sleep 1; exit 7\"]}", &r),
                     200);
    ck_assert_msg(json_integer_value(json_object_get(r.json, "return_code")) == 7,
                  "the receipt was forged: %s", r.body);
    ck_assert_str_eq(str(r.json, "state"), "finished");
    assert_cleanup_confirmed(r.json);
    lbt_resp_free(&r);
    /* the probe's last connection gives up within 2 s */
    sleep(2);
    log = lbt_sh(&D, sbx, "kill $(cat /workspace/grab.log.pid); cat /workspace/grab.log");
    ck_assert_msg(strstr(log, "saw ") != NULL, "the probe never saw the pass entry: %s", log);
    ck_assert_msg(strstr(log, " ok\n") == NULL, "the probe got the receipt: %s", log);
    free(log);
    ck_assert_int_eq(session_req(&D, "POST", "act-pass", "close", tok, "{}", &r), 200);
    lbt_resp_free(&r);
}
END_TEST

/* Long-polls are parked, not held on a worker: with 2 workers, 20 long-polls (wait_ms 20000)
 * on a running harness leave an exec on another sandbox free to answer while they still wait;
 * the harness then ends and every poll answers with the ended state. A wait_ms too large for
 * int64 is lowered to limits.max_wait_ms (200), not refused. */
#define PARKED_POLLS 20
START_TEST(test_long_polls_hold_no_worker)
{
    static const char *const extra[] = {"--set", "server.workers=2", NULL};
    struct lbt_daemon d;
    struct lbt_async *polls[PARKED_POLLS];
    char sa[64], ta[128], sb[64], tb[128], path[300];
    struct lbt_resp r;
    double t0;
    json_t *ex;

    lbt_daemon_start(&d, extra);
    seed_op(&d, "act-park-a", sa, sizeof(sa), ta, sizeof(ta));
    seed_op(&d, "act-park-b", sb, sizeof(sb), tb, sizeof(tb));
    ck_assert_int_eq(session_req(&d, "POST", "act-park-a", "execute", ta,
                                 "{\"wait\": false, \"argv\": [\"sh\", \"-c\", \"echo up > "
                                 "/workspace/up.txt; while [ ! -e /workspace/go ]; do sleep 0.05; "
                                 "done; exit 3\"]}",
                                 &r),
                     202);
    lbt_resp_free(&r);
    wait_file(&d, sa, "/workspace/up.txt", "up", 30);
    session_path(path, sizeof(path), "act-park-a", "activation?wait_ms=20000");
    for (int i = 0; i < PARKED_POLLS; i++)
        polls[i] = lbt_async_json(&d, "GET", path, i % 2 ? ta : "", NULL);
    lbt_sleep_ms(1000); /* let them all arrive and wait */
    t0 = lbt_now();
    ex = lbt_exec_ok(&d, sb, tb, "{\"argv\": [\"echo\", \"free\"]}");
    ck_assert_str_eq(str(ex, "stdout"), "free\n");
    json_decref(ex);
    /* generous: without parking the exec waited for the 20 s polls to end */
    ck_assert_msg(lbt_now() - t0 < 10, "exec took %.1f s behind the long-polls", lbt_now() - t0);
    for (int i = 0; i < PARKED_POLLS; i++)
        ck_assert_msg(!lbt_async_done(polls[i]), "long-poll %d answered before the harness ended",
                      i);
    /* the harness ends: every poll answers with the ended state, well before 20 s */
    t0 = lbt_now();
    lbt_file_put(&d, sa, "", "/workspace/go", NULL, "1", 1, &r);
    ck_assert_int_lt(r.status, 300);
    lbt_resp_free(&r);
    for (int i = 0; i < PARKED_POLLS; i++) {
        lbt_async_join(polls[i], &r);
        ck_assert_int_eq(r.status, 200);
        ck_assert_msg(json_integer_value(json_object_get(r.json, "return_code")) == 3,
                      "poll %d: %s", i, r.body);
        lbt_resp_free(&r);
    }
    ck_assert_msg(lbt_now() - t0 < 15, "polls answered only after %.1f s", lbt_now() - t0);
    ck_assert_int_eq(session_req(&d, "GET", "act-park-a", "activation?wait_ms=0", ta, NULL, &r),
                     200);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "return_code")), 3);
    lbt_resp_free(&r);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* wait_ms above int64 is lowered to the maximum (the docs' rule), negative/non-numeric 400. */
START_TEST(test_wait_ms_huge_lowered)
{
    static const char *const extra[] = {"--set", "limits.max_wait_ms=300", NULL};
    struct lbt_daemon d;
    char sa[64], ta[128];
    struct lbt_resp r;
    double t0;

    lbt_daemon_start(&d, extra);
    seed_op(&d, "act-huge", sa, sizeof(sa), ta, sizeof(ta));
    ck_assert_int_eq(session_req(&d, "POST", "act-huge", "execute", ta,
                                 "{\"wait\": false, \"argv\": [\"sleep\", \"60\"]}", &r),
                     202);
    lbt_resp_free(&r);
    t0 = lbt_now();
    ck_assert_int_eq(
        session_req(&d, "GET", "act-huge", "activation?wait_ms=99999999999999999999", ta, NULL, &r),
        200);
    ck_assert_str_eq(str(r.json, "state"), "running");
    lbt_resp_free(&r);
    ck_assert_msg(lbt_now() - t0 < 10, "not lowered to max_wait_ms");
    ck_assert_int_eq(session_req(&d, "GET", "act-huge", "activation?wait_ms=-99999999999999999999",
                                 ta, NULL, &r),
                     400);
    lbt_resp_free(&r);
    ck_assert_int_eq(session_req(&d, "GET", "act-huge", "activation?wait_ms=1e3", ta, NULL, &r),
                     400);
    lbt_resp_free(&r);
    lbt_daemon_cleanup(&d);
}
END_TEST

int main(void)
{
    const char *why = lbt_variant_lacks("activations");
    Suite *s;

    if (why) {
        printf("test_activation: SKIP on variant %s: %s\n", lbt_variant(), why);
        return 0;
    }
    s = suite_create("activation");
    TCase *shared = tcase_create("shared_daemon");
    TCase *own = tcase_create("own_daemon");

    lbt_shared_daemon(shared, &D, NULL);
    tcase_set_timeout(shared, 240);
    tcase_add_test(shared, test_finished_then_close);
    tcase_add_test(shared, test_timeout);
    tcase_add_test(shared, test_close_mid_run_terms_first);
    tcase_add_test(shared, test_descendant_drain);
    tcase_add_test(shared, test_missing_interpreter);
    tcase_add_test(shared, test_concurrent_closes);
    tcase_add_test(shared, test_unconfirmed_cleanup_retries);
    tcase_add_test(shared, test_release_closes_first);
    tcase_add_test(shared, test_client_disconnect);
    tcase_add_test(shared, test_input_and_errors);
    tcase_add_test(shared, test_preserve_background_services);
    tcase_add_test(shared, test_pause_resume);
    tcase_add_test(shared, test_operate_token_activation);
    tcase_add_test(shared, test_nowait_and_long_poll);
    tcase_add_test(shared, test_stop_harness);
    tcase_add_test(shared, test_receipt_pass_race);
    suite_add_tcase(s, shared);
    tcase_set_timeout(own, 240);
    tcase_add_test(own, test_close_before_launch);
    tcase_add_test(own, test_daemon_restart);
    tcase_add_test(own, test_execute_pause_race);
    tcase_add_test(own, test_restart_harness_ended_meanwhile);
    tcase_add_test(own, test_long_polls_hold_no_worker);
    tcase_add_test(own, test_wait_ms_huge_lowered);
    suite_add_tcase(s, own);
    return lbt_run_suite(s);
}
