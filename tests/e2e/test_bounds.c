/*
 * test_bounds.c - every wait on a child, a lock or a provider call has
 * a bound, and errors say what the user can act on.
 *
 * Unbounded waits as a kind: a sandbox paused (cgroup freezer; v1 on this host) while an exec runs,
 * while a harness runs and is closed, while it is released or deleted, and while the daemon
 * gets SIGTERM; and one stuck session whose retried seeds must not starve the others. Errors:
 * a memory-limit kill is error_type "oom", a killed supervisor says so, E2BIG names the limit
 * (never "errno N"), and bad env names are 400.
 *
 * Real daemon, real sandboxes, real freezer. The bounds asserted are the documented ones
 * ("timeout_s + a few seconds"), with generous margins; processes and cgroups are counted by
 * markers only this test uses.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static struct lbt_daemon D;

/* ---------- helpers ---------- */

static const char *str(json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));

    return s ? s : "";
}

static json_int_t num(json_t *obj, const char *key)
{
    return json_integer_value(json_object_get(obj, key));
}

/* Live processes of host uid whose command line (arguments joined by spaces) contains needle:
 * counts only this sandbox's processes, whatever else runs on the machine. */
static int count_procs_but(uid_t uid, const char *needle, const char *but);

/* Live (not zombie) processes of uid whose command line contains needle. */
static int count_procs(uid_t uid, const char *needle)
{
    return count_procs_but(uid, needle, NULL);
}

/* The same, without those whose command line also contains but (NULL: none left out). */
static int count_procs_but(uid_t uid, const char *needle, const char *but)
{
    DIR *d = opendir("/proc");
    struct dirent *de;
    int n = 0;

    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d))) {
        char path[300], buf[4096], *line = NULL;
        size_t cap = 0;
        bool mine = false, zombie = false;
        FILE *f;
        size_t len;

        if (de->d_name[0] < '1' || de->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/status", de->d_name);
        f = fopen(path, "r");
        if (!f)
            continue;
        while (getline(&line, &cap, f) > 0) {
            unsigned u;

            if (sscanf(line, "Uid: %u", &u) == 1)
                mine = u == uid;
            if (!strncmp(line, "State:", 6) && strchr(line, 'Z'))
                zombie = true;
        }
        free(line);
        fclose(f);
        if (!mine || zombie)
            continue;
        snprintf(path, sizeof(path), "/proc/%s/cmdline", de->d_name);
        f = fopen(path, "r");
        if (!f)
            continue;
        len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        for (size_t i = 0; i + 1 < len; i++)
            if (buf[i] == '\0')
                buf[i] = ' ';
        buf[len] = '\0';
        if (strstr(buf, needle) && !(but && strstr(buf, but)))
            n++;
    }
    closedir(d);
    return n;
}

/* Poll until a live process of uid has needle in its command line (an exec's command has
 * started; a loaded host may take seconds). */
static void wait_procs(uid_t uid, const char *needle)
{
    for (double until = lbt_now() + 60; count_procs(uid, needle) == 0; lbt_sleep_ms(50))
        ck_assert_msg(lbt_now() < until, "'%s' did not start", needle);
}

/* Wait (at most 30 s) until no harness supervisor (lendbox-supervise --harness-launch) of uid
 * is left; asserts it. A supervisor exits just after it wrote the receipt an execute or close
 * answers with, so right after the answer it may still be on its way out. */
static void wait_supervisors_gone(uid_t uid)
{
    for (double until = lbt_now() + 30; count_procs(uid, "--harness-launch") > 0; lbt_sleep_ms(50))
        ck_assert_msg(lbt_now() < until, "a harness supervisor did not exit after its receipt");
}

/* Seed rsid (extra JSON members or NULL); the sandbox id into sbx. */
static void seed(struct lbt_daemon *d, const char *rsid, const char *extra, char *sbx, size_t len)
{
    json_t *lease = lbt_seed(d, rsid, "task-bounds", extra);

    snprintf(sbx, len, "%s", str(lease, "sandbox_id"));
    json_decref(lease);
}

static void pause_sandbox(struct lbt_daemon *d, const char *sbx, bool pause)
{
    char path[200];
    struct lbt_resp r;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/%s", sbx, pause ? "pause" : "resume");
    lbt_json(d, "POST", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "%s: %ld %s", path, r.status, r.body);
    ck_assert_str_eq(str(r.json, "status"), pause ? "paused" : "running");
    lbt_resp_free(&r);
}

static char *sandbox_status(struct lbt_daemon *d, const char *sbx)
{
    char path[200];
    struct lbt_resp r;
    char *out;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    lbt_json(d, "GET", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "%s: %ld %s", path, r.status, r.body);
    out = strdup(str(r.json, "status"));
    lbt_resp_free(&r);
    return out;
}

static struct lbt_async *exec_async(struct lbt_daemon *d, const char *sbx, const char *body)
{
    char path[200];

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", sbx);
    return lbt_async_json(d, "POST", path, "", body);
}

/* Everything of a stopped sandbox is gone: its processes, cgroups and directory. */
static void assert_sandbox_gone(struct lbt_daemon *d, const char *sbx, uid_t uid)
{
    char dir[400];
    double until = lbt_now() + 10;

    while (lbt_count_live_procs_of_uid(uid) > 0 && lbt_now() < until)
        lbt_sleep_ms(50);
    ck_assert_int_eq(lbt_count_live_procs_of_uid(uid), 0);
    ck_assert_int_eq(lbt_count_cgroup_dirs(sbx), 0);
    snprintf(dir, sizeof(dir), "%s/sandboxes/%s", d->state_dir, sbx);
    ck_assert_msg(!lbt_path_exists(dir), "%s is still there", dir);
}

/* Wait (at most 30 s) until path in the sandbox holds want (want "": exists). */
static void wait_file(struct lbt_daemon *d, const char *sbx, const char *path, const char *want)
{
    double until = lbt_now() + 30;

    for (;;) {
        struct lbt_resp r;
        bool ok;

        lbt_file_get(d, sbx, "", path, &r);
        ok = r.status == 200 && (!*want || (r.body && strstr(r.body, want)));
        lbt_resp_free(&r);
        if (ok)
            return;
        ck_assert_msg(lbt_now() < until, "%s never showed '%s'", path, want);
        lbt_sleep_ms(50);
    }
}

/* The decoded artifact at path of an activation result, NUL-terminated (NULL when null). */
static char *artifact(json_t *res, const char *path)
{
    json_t *a = json_object_get(json_object_get(res, "artifacts"), path);
    unsigned char *bytes;
    size_t len = 0;
    char *out;

    ck_assert_msg(a != NULL, "no artifact entry for %s", path);
    if (json_is_null(a))
        return NULL;
    bytes = lbt_b64_decode(str(a, "base64"), &len);
    ck_assert_ptr_nonnull(bytes);
    out = calloc(1, len + 1);
    memcpy(out, bytes, len);
    free(bytes);
    return out;
}

/* A harness that records TERM ("graceful") in /workspace/state.txt. */
#define GRACEFUL_HARNESS                                                                           \
    "{\"argv\": [\"sh\", \"-c\", \"trap 'echo graceful > /workspace/state.txt; exit 0' TERM; "     \
    "echo running > /workspace/state.txt; while :; do sleep 0.1; done\"], "                        \
    "\"collect\": [\"/workspace/state.txt\"], \"close_timeout_s\": 9}"

/* ---------- bounds: paused during exec ---------- */

/* The supervisor cannot enforce the timeout of a frozen exec: the daemon ends it at timeout_s +
 * 2 s, killing the exec's processes (not the sandbox's others), and answers 125/timeout. */
START_TEST(test_exec_paused_past_its_timeout)
{
    char sbx[64], *st;
    struct lbt_async *a;
    struct lbt_resp r;
    json_t *res;
    double t0, took;
    uid_t uid;

    seed(&D, "bounds-exec", NULL, sbx, sizeof(sbx));
    uid = lbt_sandbox_uid(&D, sbx);
    /* a process of the sandbox that is not the exec's: it must survive, still paused */
    res = lbt_exec_ok(&D, sbx, "",
                      "{\"command\": \"sleep 1000.771 >/dev/null 2>&1 &\", "
                      "\"preserve_background_services\": true}");
    json_decref(res);
    ck_assert_int_eq(count_procs(uid, "sleep 1000.771"), 1);

    t0 = lbt_now();
    a = exec_async(&D, sbx,
                   "{\"command\": \"echo started; exec sleep 300.772\", \"timeout_s\": 2}");
    /* the shell has exec'd the sleep, so "started" is written: the shell's own command line
     * names the sleep too, and a pause before its echo would leave stdout empty */
    for (double until = lbt_now() + 60; lbt_count_procs_of_uid_exact(uid, "sleep 300.772") == 0;
         lbt_sleep_ms(50))
        ck_assert_msg(lbt_now() < until, "'sleep 300.772' did not start");
    pause_sandbox(&D, sbx, true);
    lbt_async_join(a, &r);
    took = lbt_now() - t0;
    ck_assert_msg(r.status == 200, "exec: %ld %s", r.status, r.body);
    ck_assert_int_eq(num(r.json, "return_code"), 125);
    ck_assert_str_eq(str(r.json, "error_type"), "timeout");
    ck_assert_str_eq(str(r.json, "stdout"), "started\n");
    ck_assert_msg(strstr(str(r.json, "message"), "paused"), "message: %s", r.body);
    /* timeout_s + a few seconds (the daemon acts at + 2 s) */
    ck_assert_msg(took < 2 + 6, "the exec answered after %.1f s", took);
    lbt_resp_free(&r);

    /* the exec's command is gone; the other process lives on and the sandbox stays paused */
    ck_assert_int_eq(count_procs(uid, "sleep 300.772"), 0);
    ck_assert_int_eq(count_procs(uid, "--timeout-ms 2000 "), 0);
    ck_assert_int_eq(count_procs(uid, "sleep 1000.771"), 1);
    st = sandbox_status(&D, sbx);
    ck_assert_str_eq(st, "paused");
    free(st);
    lbt_exec(&D, sbx, "", "{\"command\": \"true\"}", &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);

    /* resumed, it works as before */
    pause_sandbox(&D, sbx, false);
    res = lbt_exec_ok(&D, sbx, "", "{\"command\": \"echo again\"}");
    ck_assert_int_eq(num(res, "return_code"), 0);
    ck_assert_str_eq(str(res, "stdout"), "again\n");
    ck_assert(json_is_null(json_object_get(res, "message")));
    json_decref(res);
    lbt_json(&D, "POST", "/v1/sessions/bounds-exec/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    ck_assert_int_eq(count_procs(uid, "sleep 1000.771"), 0);
}
END_TEST

/* Release of a sandbox paused while an exec runs in it: the release answers (the stop thaws,
 * then kills), the exec answers 404 (its sandbox stopped), everything is gone. */
START_TEST(test_release_paused_during_exec)
{
    char sbx[64];
    struct lbt_async *a;
    struct lbt_resp r;
    uid_t uid;
    double t0;

    seed(&D, "bounds-release", NULL, sbx, sizeof(sbx));
    uid = lbt_sandbox_uid(&D, sbx);
    a = exec_async(&D, sbx, "{\"command\": \"sleep 300.773\", \"timeout_s\": 60}");
    wait_procs(uid, "sleep 300.773");
    pause_sandbox(&D, sbx, true);
    t0 = lbt_now();
    lbt_json(&D, "POST", "/v1/sessions/bounds-release/release", "", NULL, &r);
    ck_assert_msg(r.status == 200, "release: %ld %s", r.status, r.body);
    ck_assert(json_is_true(json_object_get(r.json, "released")));
    ck_assert_str_eq(str(r.json, "sandbox_id"), sbx);
    lbt_resp_free(&r);
    lbt_async_join(a, &r);
    ck_assert_msg(lbt_now() - t0 < 15, "release + exec took %.1f s", lbt_now() - t0);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    ck_assert_int_eq(count_procs(uid, "sleep 300.773"), 0);
    assert_sandbox_gone(&D, sbx, uid);
}
END_TEST

/* DELETE of a paused sandbox (nothing running in it but its init) works the same way. */
START_TEST(test_delete_paused)
{
    char sbx[64], path[200];
    struct lbt_resp r;
    json_t *res;
    uid_t uid;

    seed(&D, "bounds-delete", NULL, sbx, sizeof(sbx));
    uid = lbt_sandbox_uid(&D, sbx);
    res = lbt_exec_ok(&D, sbx, "",
                      "{\"command\": \"sleep 1000.774 >/dev/null 2>&1 &\", "
                      "\"preserve_background_services\": true}");
    json_decref(res);
    pause_sandbox(&D, sbx, true);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    lbt_json(&D, "DELETE", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "delete: %ld %s", r.status, r.body);
    ck_assert(json_is_true(json_object_get(r.json, "deleted")));
    lbt_resp_free(&r);
    ck_assert_int_eq(count_procs(uid, "sleep 1000.774"), 0);
    assert_sandbox_gone(&D, sbx, uid);
}
END_TEST

/* ---------- bounds: paused during an activation ---------- */

/* Close of a paused sandbox's harness resumes the sandbox first, so the harness gets its TERM
 * (it writes "graceful"), the artifact is collected and cleanup is confirmed. */
START_TEST(test_close_paused_activation)
{
    char sbx[64], *state, *st;
    struct lbt_async *ex;
    struct lbt_resp r;
    uid_t uid;

    seed(&D, "bounds-close", NULL, sbx, sizeof(sbx));
    uid = lbt_sandbox_uid(&D, sbx);
    ex = lbt_async_json(&D, "POST", "/v1/sessions/bounds-close/execute", "", GRACEFUL_HARNESS);
    wait_file(&D, sbx, "/workspace/state.txt", "running");
    pause_sandbox(&D, sbx, true);
    lbt_json(&D, "POST", "/v1/sessions/bounds-close/close", "", "{}", &r);
    ck_assert_msg(r.status == 200, "close: %ld %s", r.status, r.body);
    ck_assert(json_is_true(json_object_get(r.json, "closed")));
    ck_assert_str_eq(str(r.json, "state"), "closed");
    ck_assert(
        json_is_true(json_object_get(json_object_get(r.json, "cleanup"), "cleanup_confirmed")));
    state = artifact(r.json, "/workspace/state.txt");
    ck_assert_str_eq(state, "graceful\n");
    free(state);
    lbt_resp_free(&r);
    lbt_async_join(ex, &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "state"), "failed");
    lbt_resp_free(&r);
    st = sandbox_status(&D, sbx);
    ck_assert_str_eq(st, "running");
    free(st);
    wait_supervisors_gone(uid);
    lbt_json(&D, "POST", "/v1/sessions/bounds-close/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
}
END_TEST

/* Release of a paused sandbox with a running harness: the release's close resumes it, the
 * harness is stopped gracefully and collected, then the sandbox is stopped. */
START_TEST(test_release_paused_activation)
{
    char sbx[64], *state;
    struct lbt_async *ex;
    struct lbt_resp r;
    json_t *act;
    uid_t uid;

    seed(&D, "bounds-relact", NULL, sbx, sizeof(sbx));
    uid = lbt_sandbox_uid(&D, sbx);
    ex = lbt_async_json(&D, "POST", "/v1/sessions/bounds-relact/execute", "", GRACEFUL_HARNESS);
    wait_file(&D, sbx, "/workspace/state.txt", "running");
    pause_sandbox(&D, sbx, true);
    lbt_json(&D, "POST", "/v1/sessions/bounds-relact/release", "", NULL, &r);
    ck_assert_msg(r.status == 200, "release: %ld %s", r.status, r.body);
    ck_assert(json_is_true(json_object_get(r.json, "released")));
    lbt_resp_free(&r);
    lbt_async_join(ex, &r);
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/sessions/bounds-relact/activation", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    act = r.json;
    ck_assert_str_eq(str(act, "state"), "closed");
    ck_assert_msg(json_is_null(json_object_get(act, "capture_error")), "%s", r.body);
    state = artifact(act, "/workspace/state.txt");
    ck_assert_str_eq(state, "graceful\n");
    free(state);
    lbt_resp_free(&r);
    assert_sandbox_gone(&D, sbx, uid);
}
END_TEST

/* A harness that ignores TERM, whose sandbox its agent pauses (with its operate token) while it
 * runs: its supervisor is frozen at timeout_s. 2 s past it the execute's wait resumes the
 * sandbox, the supervisor ends the harness (TERM ignored: KILL after one phase) and the execute
 * answers the timed_out result, well before its old bound of timeout_s + close_timeout_s +
 * 30 s; the sandbox is running afterwards and nothing of the harness is left. */
START_TEST(test_execute_paused_past_its_timeout)
{
    char sbx[64], path[200], *st;
    struct lbt_async *ex;
    struct lbt_resp r;
    json_t *lease, *cleanup;
    const char *tok;
    double t0, took;
    uid_t uid;

    lease = lbt_seed(&D, "bounds-exepause", "task-bounds", NULL);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    tok = str(json_object_get(lease, "access"), "token");
    uid = lbt_sandbox_uid(&D, sbx);
    t0 = lbt_now();
    ex = lbt_async_json(&D, "POST", "/v1/sessions/bounds-exepause/execute", "",
                        "{\"argv\": [\"sh\", \"-c\", \"trap '' TERM; echo running > "
                        "/workspace/state.txt; while :; do sleep 0.1; done\", \"harness782\"], "
                        "\"timeout_s\": 3, \"close_timeout_s\": 3}");
    wait_file(&D, sbx, "/workspace/state.txt", "running");
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pause", sbx);
    lbt_json(&D, "POST", path, tok, NULL, &r);
    ck_assert_msg(r.status == 200, "pause: %ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "status"), "paused");
    lbt_resp_free(&r);

    lbt_async_join(ex, &r);
    took = lbt_now() - t0;
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "state"), "timed_out");
    ck_assert_int_eq(num(r.json, "return_code"), 128 + 9);
    ck_assert(json_is_null(json_object_get(r.json, "error")));
    cleanup = json_object_get(r.json, "cleanup");
    ck_assert(json_is_true(json_object_get(cleanup, "cleanup_confirmed")));
    ck_assert(json_is_true(json_object_get(cleanup, "timed_out")));
    ck_assert_int_eq(num(cleanup, "return_code"), 128 + 9);
    /* timeout_s + 2 s + one cleanup phase (1 s) + the resume, with room for a loaded host;
     * well below the backstop (timeout_s + close_timeout_s + 30 s) it used to wait for */
    ck_assert_msg(took < 25, "the execute answered after %.1f s", took);
    lbt_resp_free(&r);

    st = sandbox_status(&D, sbx);
    ck_assert_str_eq(st, "running");
    free(st);
    /* the harness's own processes were reaped before its supervisor wrote the receipt the
     * answer carries; the supervisor (its command line names the harness too) exits right
     * after writing it, so it may still be on its way out */
    ck_assert_int_eq(count_procs_but(uid, "harness782", "--harness-launch"), 0);
    wait_supervisors_gone(uid);
    ck_assert_int_eq(count_procs(uid, "harness782"), 0);
    lbt_json(&D, "POST", "/v1/sessions/bounds-exepause/close", "", "{}", &r);
    ck_assert_msg(r.status == 200, "close: %ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "state"), "closed");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/bounds-exepause/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    json_decref(lease);
}
END_TEST

/* A sandbox process (its root, as the agent is) stops the harness supervisor with SIGSTOP: it
 * can neither see a stop request nor end the harness. The close's stop request continues it
 * (SIGCONT), so the close answers 200 with cleanup confirmed within its own timeout instead of
 * 502 "no receipt", and nothing of the harness is left. */
START_TEST(test_close_of_stopped_supervisor)
{
    char sbx[64], *out;
    struct lbt_resp r;
    double t0;
    uid_t uid;

    seed(&D, "bounds-sigstop", NULL, sbx, sizeof(sbx));
    uid = lbt_sandbox_uid(&D, sbx);
    lbt_json(&D, "POST", "/v1/sessions/bounds-sigstop/execute", "",
             "{\"argv\": [\"sh\", \"-c\", \"echo running > /workspace/state.txt; exec sleep "
             "300.783\"], \"timeout_s\": 300, \"close_timeout_s\": 3, \"wait\": false}",
             &r);
    ck_assert_msg(r.status == 202, "execute: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    wait_file(&D, sbx, "/workspace/state.txt", "running");
    out = lbt_sh(&D, sbx,
                 "p=$(cat /run/lendbox/act-*/supervisor.pid); kill -STOP $p; "
                 "sleep 0.2; grep -c '^State:.*T' /proc/$p/status");
    ck_assert_str_eq(out, "1\n");
    free(out);

    t0 = lbt_now();
    lbt_json(&D, "POST", "/v1/sessions/bounds-sigstop/close", "", "{\"timeout_s\": 3}", &r);
    ck_assert_msg(r.status == 200, "close: %ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "state"), "closed");
    ck_assert(
        json_is_true(json_object_get(json_object_get(r.json, "cleanup"), "cleanup_confirmed")));
    ck_assert_msg(lbt_now() - t0 < 3 + 20, "the close answered after %.1f s", lbt_now() - t0);
    lbt_resp_free(&r);
    /* the harness (its supervisor's command line names it too, and exits just after) */
    ck_assert_int_eq(count_procs_but(uid, "sleep 300.783", "--harness-launch"), 0);
    wait_supervisors_gone(uid);
    ck_assert_int_eq(count_procs(uid, "sleep 300.783"), 0);
    lbt_json(&D, "POST", "/v1/sessions/bounds-sigstop/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
}
END_TEST

/* ---------- bounds: one stuck session does not starve the others ---------- */

/* A release that holds its session (stops take 20 s here) while its client retries seeds of
 * the same session over and over: with 4 control workers, the other sessions' seeds still
 * answer at once, because requests waiting for their session hold no worker. */
START_TEST(test_stuck_session_does_not_starve_others)
{
    static const char *const extra[] = {"--set", "server.workers=4", "--set",
                                        "faults.spec=provider.stop=delay:20000", NULL};
    enum { N_RETRIES = 12, N_OTHERS = 5 };
    struct lbt_async *rel, *retry[N_RETRIES];
    struct lbt_daemon d;
    char sbx[64], path[200], rsid[32];
    struct lbt_resp r;
    json_t *list;
    double until;
    int n_new = 0;

    lbt_daemon_start(&d, extra);
    seed(&d, "stuck", NULL, sbx, sizeof(sbx));
    rel = lbt_async_json(&d, "POST", "/v1/sessions/stuck/release", "", NULL);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    until = lbt_now() + 30;
    for (;;) { /* the release holds the session: its stop is under way */
        bool stopping;

        lbt_json(&d, "GET", path, "", NULL, &r);
        stopping = r.status == 200 && !strcmp(str(r.json, "state"), "stopping");
        lbt_resp_free(&r);
        if (stopping)
            break;
        ck_assert_msg(lbt_now() < until, "the release never started its stop");
        lbt_sleep_ms(20);
    }
    for (int i = 0; i < N_RETRIES; i++)
        retry[i] = lbt_async_json(&d, "POST", "/v1/sessions/stuck/seed", "",
                                  "{\"task_id\": \"task-bounds\"}");
    lbt_sleep_ms(300);
    for (int i = 0; i < N_OTHERS; i++) {
        double t0 = lbt_now(), took;
        json_t *lease;

        snprintf(rsid, sizeof(rsid), "other-%d", i);
        lease = lbt_seed(&d, rsid, "task-bounds", NULL); /* asserts 200 */
        took = lbt_now() - t0;
        json_decref(lease);
        ck_assert_msg(took < 12, "seed of %s waited %.1f s behind the stuck session", rsid, took);
    }
    lbt_async_join(rel, &r);
    ck_assert_msg(r.status == 200, "release: %ld %s", r.status, r.body);
    ck_assert(json_is_true(json_object_get(r.json, "released")));
    lbt_resp_free(&r);
    /* the retried seeds, one at a time after the release: one new sandbox, reused by the rest */
    for (int i = 0; i < N_RETRIES; i++) {
        lbt_async_join(retry[i], &r);
        ck_assert_msg(r.status == 200, "retried seed %d: %ld %s", i, r.status, r.body);
        ck_assert(json_is_boolean(json_object_get(r.json, "reused")));
        if (json_is_false(json_object_get(r.json, "reused")))
            n_new++;
        lbt_resp_free(&r);
    }
    ck_assert_int_eq(n_new, 1);
    list = lbt_list_sandboxes(&d);
    ck_assert_int_eq(lbt_count_records_of_session(list, "stuck"), 2);
    json_decref(list);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* The wait for a session's lock is bounded: a seed of a session whose sandbox the TTL sweeper
 * is stopping (the stop takes 15 s) gives up after lending.session_lock_wait_s with 409. */
START_TEST(test_session_lock_wait_is_bounded)
{
    static const char *const extra[] = {"--set", "faults.spec=provider.stop=delay:15000",
                                        "--set", "lending.session_lock_wait_s=2",
                                        "--set", "lending.sweep_interval_s=1",
                                        NULL};
    struct lbt_daemon d;
    char sbx[64], path[200];
    struct lbt_resp r;
    double until, t0, took;

    lbt_daemon_start(&d, extra);
    seed(&d, "ttl-held", "\"ttl_s\": 1", sbx, sizeof(sbx));
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    until = lbt_now() + 30;
    for (;;) {
        bool stopping;

        lbt_json(&d, "GET", path, "", NULL, &r);
        stopping = r.status == 200 && !strcmp(str(r.json, "state"), "stopping");
        lbt_resp_free(&r);
        if (stopping)
            break;
        ck_assert_msg(lbt_now() < until, "the TTL stop never started");
        lbt_sleep_ms(50);
    }
    t0 = lbt_now();
    lbt_json(&d, "POST", "/v1/sessions/ttl-held/seed", "", "{\"task_id\": \"task-bounds\"}", &r);
    took = lbt_now() - t0;
    lbt_assert_error(&r, 409, "conflict");
    ck_assert_msg(strstr(r.body, "busy"), "%s", r.body);
    lbt_resp_free(&r);
    ck_assert_msg(took >= 1.5 && took < 10, "the seed gave up after %.1f s", took);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* ---------- bounds: SIGTERM with paused sandboxes ---------- */

/* SIGTERM with one paused sandbox and another paused while an exec runs in it: the exec ends
 * at its timeout + 2 s, the shutdown sweep thaws and stops both, the daemon exits 0. */
START_TEST(test_sigterm_with_paused_sandboxes)
{
    struct lbt_daemon d;
    char a[64], b[64];
    struct lbt_async *ex;
    struct lbt_resp r;
    uid_t ua, ub;
    double t0, took;
    int rc;

    lbt_daemon_start(&d, NULL);
    seed(&d, "term-a", NULL, a, sizeof(a));
    seed(&d, "term-b", NULL, b, sizeof(b));
    ua = lbt_sandbox_uid(&d, a);
    ub = lbt_sandbox_uid(&d, b);
    pause_sandbox(&d, a, true);
    ex = exec_async(&d, b, "{\"command\": \"sleep 300.775\", \"timeout_s\": 3}");
    wait_procs(ub, "sleep 300.775");
    pause_sandbox(&d, b, true);
    t0 = lbt_now();
    rc = lbt_daemon_stop(&d); /* SIGTERM, and wait */
    took = lbt_now() - t0;
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(took < 30, "SIGTERM took %.1f s", took);
    lbt_async_join(ex, &r);
    ck_assert_msg(r.status == 200, "exec: %ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "error_type"), "timeout");
    lbt_resp_free(&r);
    ck_assert_int_eq(count_procs(ub, "sleep 300.775"), 0);
    assert_sandbox_gone(&d, a, ua);
    assert_sandbox_gone(&d, b, ub);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* SIGTERM with an exec that would run for 10 minutes: the drain waits lending.drain_timeout_s
 * (2 s here), then the exec's process tree is killed and its client gets a defined answer
 * (125, "sandbox", the daemon is shutting down); the sweep runs and the daemon exits 0. */
START_TEST(test_sigterm_drain_is_bounded)
{
    static const char *const extra[] = {"--set", "lending.drain_timeout_s=2", NULL};
    struct lbt_daemon d;
    char sbx[64];
    struct lbt_async *ex;
    struct lbt_resp r;
    double t0, took;
    uid_t uid;
    int rc;

    lbt_daemon_start(&d, extra);
    seed(&d, "drain-a", NULL, sbx, sizeof(sbx));
    uid = lbt_sandbox_uid(&d, sbx);
    ex =
        exec_async(&d, sbx, "{\"command\": \"sleep 600.417 & sleep 600.419\", \"timeout_s\": 900}");
    t0 = lbt_now() + 30;
    while (count_procs(uid, "sleep 600.419") == 0) {
        ck_assert_msg(lbt_now() < t0, "the exec never started");
        lbt_sleep_ms(50);
    }
    t0 = lbt_now();
    rc = lbt_daemon_stop(&d); /* SIGTERM, and wait */
    took = lbt_now() - t0;
    ck_assert_int_eq(rc, 0);
    ck_assert_msg(took >= 1.5, "SIGTERM took only %.1f s: the drain did not wait", took);
    ck_assert_msg(took < 2 + 30, "SIGTERM took %.1f s", took);
    lbt_async_join(ex, &r);
    ck_assert_msg(r.status == 200, "exec: %ld %s", r.status, r.body);
    ck_assert_int_eq(num(r.json, "return_code"), 125);
    ck_assert_str_eq(str(r.json, "error_type"), "sandbox");
    ck_assert_msg(strstr(str(r.json, "message"), "daemon is shutting down"), "message: %s",
                  str(r.json, "message"));
    lbt_resp_free(&r);
    ck_assert_int_eq(count_procs(uid, "sleep 600.41"), 0);
    assert_sandbox_gone(&d, sbx, uid);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* ---------- errors users can act on ---------- */

/* A memory-limit kill is error_type "oom" (from the cgroup's OOM-kill count), with a message
 * naming the limit; a SIGKILL that is not the OOM killer's stays a plain 137. */
START_TEST(test_oom_kill)
{
    char sbx[64];
    json_t *res;

    seed(&D, "bounds-oom", "\"resources\": {\"memory_mib\": 64}", sbx, sizeof(sbx));
    res = lbt_exec_ok(
        &D, sbx, "",
        "{\"command\": \"python3 -c 'b = bytearray(512 * 1024 * 1024); print(len(b))'\"}");
    ck_assert_int_eq(num(res, "return_code"), 137);
    ck_assert_str_eq(str(res, "error_type"), "oom");
    ck_assert_str_eq(str(res, "stdout"), "");
    ck_assert_msg(strstr(str(res, "message"), "out-of-memory killer") &&
                      strstr(str(res, "message"), "64 MiB"),
                  "message: %s", str(res, "message"));
    json_decref(res);

    res = lbt_exec_ok(&D, sbx, "", "{\"command\": \"kill -9 $$\"}");
    ck_assert_int_eq(num(res, "return_code"), 137);
    ck_assert(json_is_null(json_object_get(res, "error_type")));
    ck_assert(json_is_null(json_object_get(res, "message")));
    json_decref(res);

    /* the sandbox is fine afterwards */
    res = lbt_exec_ok(&D, sbx, "", "{\"command\": \"echo ok\"}");
    ck_assert_str_eq(str(res, "stdout"), "ok\n");
    json_decref(res);
}
END_TEST

/* The supervisor killed under the command: error_type "sandbox" and a message that says so. */
START_TEST(test_supervisor_killed)
{
    char sbx[64];
    json_t *res;

    seed(&D, "bounds-superkill", NULL, sbx, sizeof(sbx));
    res = lbt_exec_ok(&D, sbx, "", "{\"command\": \"kill -9 $PPID; sleep 0.2\"}");
    ck_assert_int_eq(num(res, "return_code"), 125);
    ck_assert_str_eq(str(res, "error_type"), "sandbox");
    ck_assert_msg(strstr(str(res, "message"), "supervisor was killed by signal 9"), "message: %s",
                  str(res, "message"));
    ck_assert_msg(strstr(str(res, "stderr"), "supervisor was killed by signal 9"), "stderr: %s",
                  str(res, "stderr"));
    json_decref(res);
}
END_TEST

/* A harness the OOM killer ends: the activation is failed with error_type "oom" and an error
 * naming the limit (in the execute answer, the close answer and GET); a harness that SIGKILLs
 * itself in a sandbox with a memory limit stays a plain 137 with no error_type. */
START_TEST(test_activation_oom)
{
    char sbx[64];
    struct lbt_resp r;

    seed(&D, "bounds-act-oom", "\"resources\": {\"memory_mib\": 64}", sbx, sizeof(sbx));
    lbt_json(&D, "POST", "/v1/sessions/bounds-act-oom/execute", "",
             "{\"argv\": [\"python3\", \"-c\", \"b = bytearray(512 * 1024 * 1024)\"], "
             "\"timeout_s\": 60}",
             &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    ck_assert_msg(!strcmp(str(r.json, "state"), "failed"), "execute: %s", r.body);
    ck_assert_int_eq(num(r.json, "return_code"), 137);
    ck_assert_str_eq(str(r.json, "error_type"), "oom");
    ck_assert_msg(strstr(str(r.json, "error"), "out-of-memory killer") &&
                      strstr(str(r.json, "error"), "64 MiB"),
                  "error: %s", str(r.json, "error"));
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/sessions/bounds-act-oom/activation", "", NULL, &r);
    ck_assert_msg(r.status == 200, "get: %ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "error_type"), "oom");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/bounds-act-oom/close", "", "{}", &r);
    ck_assert_msg(r.status == 200, "close: %ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "error_type"), "oom");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/bounds-act-oom/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);

    /* not the OOM killer: a plain 137, no error_type */
    seed(&D, "bounds-act-kill", "\"resources\": {\"memory_mib\": 64}", sbx, sizeof(sbx));
    lbt_json(&D, "POST", "/v1/sessions/bounds-act-kill/execute", "",
             "{\"argv\": [\"sh\", \"-c\", \"kill -9 $$\"]}", &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    ck_assert_int_eq(num(r.json, "return_code"), 137);
    ck_assert(json_is_null(json_object_get(r.json, "error_type")));
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/bounds-act-kill/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
}
END_TEST

/* Wait (at most 10 s) until no live process of uid has needle in its command line. */
static void wait_no_procs(uid_t uid, const char *needle)
{
    double until = lbt_now() + 10;

    while (count_procs(uid, needle) > 0 && lbt_now() < until)
        lbt_sleep_ms(50);
    ck_assert_msg(count_procs(uid, needle) == 0, "'%s' is still running", needle);
}

/* The supervisor killed under the command: what the exec left running (the command, its
 * background children, also with preserve_background_services) is killed, and the answer
 * says so; a service an earlier exec preserved (another session) is left alone. */
START_TEST(test_supervisor_killed_ends_its_processes)
{
    static const char *const bodies[] = {
        "{\"command\": \"sleep 600.613 >/dev/null 2>&1 & kill -9 $PPID; sleep 600.617\"}",
        "{\"command\": \"sleep 600.613 >/dev/null 2>&1 & kill -9 $PPID; sleep 600.617\", "
        "\"preserve_background_services\": true}",
        NULL};
    char sbx[64];
    json_t *res;
    uid_t uid;

    seed(&D, "bounds-superkill-tree", NULL, sbx, sizeof(sbx));
    uid = lbt_sandbox_uid(&D, sbx);
    res = lbt_exec_ok(&D, sbx, "",
                      "{\"command\": \"sleep 600.611 >/dev/null 2>&1 &\", "
                      "\"preserve_background_services\": true}");
    ck_assert_int_eq(num(res, "return_code"), 0);
    json_decref(res);
    for (int i = 0; bodies[i]; i++) {
        res = lbt_exec_ok(&D, sbx, "", bodies[i]);
        ck_assert_int_eq(num(res, "return_code"), 125);
        ck_assert_str_eq(str(res, "error_type"), "sandbox");
        ck_assert_msg(strstr(str(res, "message"), "supervisor was killed by signal 9") &&
                          strstr(str(res, "message"), "processes the exec left running"),
                      "message: %s", str(res, "message"));
        json_decref(res);
        wait_no_procs(uid, "sleep 600.613");
        wait_no_procs(uid, "sleep 600.617");
        ck_assert_int_eq(count_procs(uid, "sleep 600.611"), 1);
    }
    /* a command that forks on and on after killing its supervisor: a child forked between
     * the daemon's read of /proc and its kill is still found (the kill repeats until a pass
     * finds no member of the session) */
    res = lbt_exec_ok(&D, sbx, "",
                      "{\"command\": \"kill -9 $PPID; while :; do sleep 600.619 & done\"}");
    ck_assert_int_eq(num(res, "return_code"), 125);
    json_decref(res);
    wait_no_procs(uid, "sleep 600.619");
    ck_assert_int_eq(count_procs(uid, "sleep 600.611"), 1);
    res = lbt_exec_ok(&D, sbx, "", "{\"command\": \"echo ok\"}");
    ck_assert_str_eq(str(res, "stdout"), "ok\n");
    json_decref(res);
}
END_TEST

/* Arguments past the kernel's limits: a sandbox failure that names the limit, never "errno". */
START_TEST(test_argument_list_too_long)
{
    char sbx[64], *body;
    size_t n = 200000;
    json_t *res;

    seed(&D, "bounds-e2big", NULL, sbx, sizeof(sbx));
    body = malloc(n + 64);
    ck_assert_ptr_nonnull(body);
    strcpy(body, "{\"command\": \"echo ");
    memset(body + strlen(body), 'x', n);
    strcpy(body + strlen("{\"command\": \"echo ") + n, "\"}");
    res = lbt_exec_ok(&D, sbx, "", body);
    free(body);
    ck_assert_int_eq(num(res, "return_code"), 125);
    ck_assert_str_eq(str(res, "error_type"), "sandbox");
    ck_assert_msg(strstr(str(res, "message"), "argument list too long") &&
                      strstr(str(res, "message"), "limit 131072 bytes"),
                  "message: %s", str(res, "message"));
    ck_assert_msg(!strstr(str(res, "stderr"), "errno"), "stderr: %s", str(res, "stderr"));
    ck_assert_msg(strstr(str(res, "stderr"), "argument list too long"), "stderr: %s",
                  str(res, "stderr"));
    json_decref(res);
}
END_TEST

/* Env names with '=', NUL, control characters, or empty: 400 for exec, execute and seed. */
START_TEST(test_env_names)
{
    static const char *const bad[] = {"{\"A=B\": \"x\"}",       "{\"\": \"x\"}",
                                      "{\"A\\u0000B\": \"x\"}", "{\"A\\nB\": \"x\"}",
                                      "{\"A\\tB\": \"x\"}",     "{\"A\\u001bB\": \"x\"}",
                                      "{\"A\\u007fB\": \"x\"}", NULL};
    char sbx[64], body[256];
    struct lbt_resp r;
    json_t *res;

    seed(&D, "bounds-env", NULL, sbx, sizeof(sbx));
    for (int i = 0; bad[i]; i++) {
        snprintf(body, sizeof(body), "{\"command\": \"true\", \"env\": %s}", bad[i]);
        lbt_exec(&D, sbx, "", body, &r);
        lbt_assert_error(&r, 400, "bad_request");
        lbt_resp_free(&r);
        snprintf(body, sizeof(body), "{\"argv\": [\"true\"], \"env\": %s}", bad[i]);
        lbt_json(&D, "POST", "/v1/sessions/bounds-env/execute", "", body, &r);
        lbt_assert_error(&r, 400, "bad_request");
        lbt_resp_free(&r);
        snprintf(body, sizeof(body), "{\"task_id\": \"t\", \"env\": %s}", bad[i]);
        lbt_json(&D, "POST", "/v1/sessions/bounds-env-seed/seed", "", body, &r);
        lbt_assert_error(&r, 400, "bad_request");
        lbt_resp_free(&r);
    }
    /* nothing was started by the refused requests */
    lbt_json(&D, "GET", "/v1/sessions/bounds-env/activation", "", NULL, &r);
    ck_assert_int_eq(r.status, 404);
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/sessions/bounds-env-seed", "", NULL, &r);
    ck_assert_int_eq(r.status, 404);
    lbt_resp_free(&r);
    /* good names, also non-ASCII and with spaces in the value, still work */
    res = lbt_exec_ok(&D, sbx, "",
                      "{\"command\": \"printf '%s|%s' \\\"$GOOD_1\\\" \\\"$lower\\\"\", "
                      "\"env\": {\"GOOD_1\": \"a b=c\", \"lower\": \"\\n\"}}");
    ck_assert_str_eq(str(res, "stdout"), "a b=c|\n");
    json_decref(res);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bounds");
    TCase *shared = tcase_create("shared_daemon");
    TCase *own = tcase_create("own_daemon");
    TCase *followup = tcase_create("followup");
    TCase *waits = tcase_create("waits");

    lbt_shared_daemon(shared, &D, NULL);
    tcase_set_timeout(shared, 240);
    tcase_add_test(shared, test_exec_paused_past_its_timeout);
    tcase_add_test(shared, test_release_paused_during_exec);
    tcase_add_test(shared, test_delete_paused);
    tcase_add_test(shared, test_close_paused_activation);
    tcase_add_test(shared, test_release_paused_activation);
    tcase_add_test(shared, test_oom_kill);
    tcase_add_test(shared, test_supervisor_killed);
    tcase_add_test(shared, test_argument_list_too_long);
    tcase_add_test(shared, test_env_names);
    suite_add_tcase(s, shared);
    tcase_set_timeout(own, 240);
    tcase_add_test(own, test_stuck_session_does_not_starve_others);
    tcase_add_test(own, test_session_lock_wait_is_bounded);
    tcase_add_test(own, test_sigterm_with_paused_sandboxes);
    suite_add_tcase(s, own);
    lbt_shared_daemon(followup, &D, NULL);
    tcase_set_timeout(followup, 240);
    tcase_add_test(followup, test_activation_oom);
    tcase_add_test(followup, test_supervisor_killed_ends_its_processes);
    tcase_add_test(followup, test_sigterm_drain_is_bounded);
    suite_add_tcase(s, followup);
    lbt_shared_daemon(waits, &D, NULL);
    tcase_set_timeout(waits, 240);
    tcase_add_test(waits, test_execute_paused_past_its_timeout);
    tcase_add_test(waits, test_close_of_stopped_supervisor);
    suite_add_tcase(s, waits);
    return lbt_run_suite(s);
}
