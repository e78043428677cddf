/*
 * test_exec.c - acceptance: exec results, seed files, cwd errors, timeouts that kill the whole
 * tree, output caps with bounded daemon memory, invalid UTF-8 and base64 output.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static struct lbt_daemon D;
static char SBX[128];

static const char RUN_SH[] = "#!/bin/sh\necho ran \"$@\"\n";
static unsigned char BLOB[256 + 64];

static void setup(void)
{
    json_t *files, *lease;
    char *files_text, *extra, *b64_run, *b64_key, *b64_blob;

    for (int i = 0; i < 256; i++)
        BLOB[i] = (unsigned char)i;
    memset(BLOB + 256, 0, 64); /* trailing NULs */
    lbt_daemon_start(&D, NULL);
    b64_run = lbt_b64_encode(RUN_SH, strlen(RUN_SH));
    b64_key = lbt_b64_encode("k3y\n", 4);
    b64_blob = lbt_b64_encode(BLOB, sizeof(BLOB));
    files =
        json_pack("{s:s, s:{s:s,s:i}, s:{s:s,s:i}, s:{s:s}, s:s}", "/workspace/task.txt",
                  "add 2 and 3\n", "/workspace/bin/run.sh", "base64", b64_run, "mode", 0755,
                  "/workspace/secret.key", "base64", b64_key, "mode", 0600,
                  "/workspace/data/blob.bin", "base64", b64_blob, "/tmp/seeded.txt", "in tmp\n");
    files_text = json_dumps(files, JSON_COMPACT);
    ck_assert_int_ge(asprintf(&extra, "\"files\": %s", files_text), 0);
    lease = lbt_seed(&D, "exec-1", "task-exec", extra);
    snprintf(SBX, sizeof(SBX), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    json_decref(files);
    free(files_text);
    free(extra);
    free(b64_run);
    free(b64_key);
    free(b64_blob);
}

static void teardown(void)
{
    lbt_daemon_cleanup(&D);
}

/* Assert the full shape of an exec result. stdout_want/stderr_want NULL: not compared. */
static void assert_result(json_t *res, int rc, const char *stdout_want, const char *stderr_want,
                          const char *error_type)
{
    json_t *et = json_object_get(res, "error_type");

    ck_assert_msg(json_is_integer(json_object_get(res, "return_code")), "no return_code");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), rc);
    if (error_type) {
        ck_assert_msg(json_is_string(et), "error_type is not a string");
        ck_assert_str_eq(json_string_value(et), error_type);
    } else {
        ck_assert_msg(et && json_is_null(et), "error_type is not null");
    }
    if (stdout_want)
        ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), stdout_want);
    if (stderr_want)
        ck_assert_str_eq(json_string_value(json_object_get(res, "stderr")), stderr_want);
    ck_assert(json_is_boolean(json_object_get(res, "stdout_truncated")));
    ck_assert(json_is_boolean(json_object_get(res, "stderr_truncated")));
    ck_assert(json_is_integer(json_object_get(res, "duration_ms")));
    ck_assert_int_ge(json_integer_value(json_object_get(res, "duration_ms")), 0);
}

START_TEST(test_echo_hi)
{
    json_t *res = lbt_exec_ok(&D, SBX, "", "{\"command\": \"echo hi\"}");

    assert_result(res, 0, "hi\n", "", NULL);
    ck_assert(json_is_false(json_object_get(res, "stdout_truncated")));
    ck_assert(json_is_false(json_object_get(res, "stderr_truncated")));
    json_decref(res);
}
END_TEST

START_TEST(test_exit_3)
{
    json_t *res = lbt_exec_ok(&D, SBX, "", "{\"command\": \"echo out; echo err >&2; exit 3\"}");

    assert_result(res, 3, "out\n", "err\n", NULL);
    json_decref(res);
}
END_TEST

START_TEST(test_argv_env_stdin)
{
    json_t *res = lbt_exec_ok(&D, SBX, "", "{\"argv\": [\"/bin/echo\", \"a  b\", \"$HOME\"]}");

    assert_result(res, 0, "a  b $HOME\n", "", NULL);
    json_decref(res);
    res = lbt_exec_ok(&D, SBX, "",
                      "{\"command\": \"echo $LBT_X; cat\", \"env\": {\"LBT_X\": \"x=1\"}, "
                      "\"stdin\": \"from stdin\\n\"}");
    assert_result(res, 0, "x=1\nfrom stdin\n", "", NULL);
    json_decref(res);
}
END_TEST

START_TEST(test_seed_files)
{
    char *out;
    struct lbt_resp r;

    out = lbt_sh(&D, SBX, "cat /workspace/task.txt");
    ck_assert_str_eq(out, "add 2 and 3\n");
    free(out);
    out = lbt_sh(&D, SBX, "stat -c '%a %s' /workspace/bin/run.sh /workspace/secret.key");
    ck_assert_str_eq(out, "755 24\n600 4\n");
    free(out);
    out = lbt_sh(&D, SBX, "/workspace/bin/run.sh x y");
    ck_assert_str_eq(out, "ran x y\n");
    free(out);
    out = lbt_sh(&D, SBX, "cat /workspace/secret.key; cat /tmp/seeded.txt");
    ck_assert_str_eq(out, "k3y\nin tmp\n");
    free(out);
    /* the binary seed file, byte for byte, seen from inside and through the files API */
    out = lbt_sh(&D, SBX,
                 "wc -c < /workspace/data/blob.bin; od -An -tx1 -v "
                 "/workspace/data/blob.bin | tr -d ' \\n' | cut -c1-16,497-512");
    ck_assert_str_eq(out, "320\n0001020304050607f8f9fafbfcfdfeff\n");
    free(out);
    lbt_file_get(&D, SBX, "", "/workspace/data/blob.bin", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(r.len, sizeof(BLOB));
    ck_assert(memcmp(r.body, BLOB, sizeof(BLOB)) == 0);
    lbt_resp_free(&r);
}
END_TEST

START_TEST(test_cwd)
{
    json_t *res;
    const char *err;

    res = lbt_exec_ok(&D, SBX, "", "{\"command\": \"pwd\"}");
    assert_result(res, 0, "/workspace\n", "", NULL);
    json_decref(res);
    res = lbt_exec_ok(&D, SBX, "", "{\"command\": \"pwd\", \"cwd\": \"/workspace/data\"}");
    assert_result(res, 0, "/workspace/data\n", "", NULL);
    json_decref(res);
    /* a cwd that does not exist is a sandbox error naming it, not a 127 from a shell */
    res = lbt_exec_ok(&D, SBX, "", "{\"command\": \"pwd\", \"cwd\": \"/nope/lbt-missing-dir\"}");
    assert_result(res, 125, "", NULL, "sandbox");
    err = json_string_value(json_object_get(res, "stderr"));
    ck_assert_ptr_nonnull(err);
    ck_assert_msg(strstr(err, "/nope/lbt-missing-dir") != NULL, "stderr does not name the cwd: %s",
                  err);
    json_decref(res);
}
END_TEST

/* The exec runs on its own thread; meanwhile the host side watches its processes. */
START_TEST(test_timeout_kills_tree)
{
    const char *body = "{\"command\": \"sh -c 'echo started; setsid sleep 1007 & sleep 1007'\", "
                       "\"timeout_s\": 1}";
    char path[300];
    struct lbt_async *a;
    struct lbt_resp r;
    double t0, elapsed;
    int seen = 0, n;
    const char *out;

    ck_assert_int_eq(lbt_count_procs_exact("sleep 1007"), 0);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", SBX);
    t0 = lbt_now();
    a = lbt_async_json(&D, "POST", path, "", body);
    /* while it runs, both sleeps (the setsid one too) exist on the host */
    while (!lbt_async_done(a)) {
        n = lbt_count_procs_exact("sleep 1007");
        if (n > seen)
            seen = n;
        if (seen >= 2)
            break;
        lbt_sleep_ms(10);
    }
    lbt_async_join(a, &r);
    elapsed = lbt_now() - t0;
    ck_assert_msg(r.status == 200 && r.json, "exec: %ld %s", r.status, r.body);
    ck_assert_msg(elapsed < 3.0, "the timed-out exec took %.2f s", elapsed);
    assert_result(r.json, 125, NULL, NULL, "timeout");
    out = json_string_value(json_object_get(r.json, "stdout"));
    ck_assert_msg(out && strstr(out, "started"), "stdout: %s", out ? out : "(null)");
    ck_assert_int_ge(seen, 2);
    lbt_resp_free(&r);
    for (int i = 0; i < 100 && (n = lbt_count_procs_exact("sleep 1007")) > 0; i++)
        lbt_sleep_ms(20);
    ck_assert_msg(n == 0, "%d 'sleep 1007' left after the timeout", n);
    /* nor the shells that started them */
    ck_assert_int_eq(lbt_count_procs_cmdline("sleep 1007"), 0);
}
END_TEST

struct rss_sampler {
    pthread_t thread;
    atomic_int stop;
    long max_kb;
};

static void *rss_sample(void *arg)
{
    struct rss_sampler *s = arg;

    while (!atomic_load(&s->stop)) {
        long kb = lbt_proc_status_kb(D.pid, "VmRSS");

        if (kb > s->max_kb)
            s->max_kb = kb;
        lbt_sleep_ms(5);
    }
    return NULL;
}

START_TEST(test_output_cap_and_memory)
{
    const char *body = "{\"command\": \"head -c 5242880 /dev/zero | tr '\\\\0' a; "
                       "echo fatal >&2; exit 1\"}";
    struct rss_sampler s = {0};
    long base_kb = lbt_proc_status_kb(D.pid, "VmRSS"), limit_kb = 64 * 1024;

    ck_assert_int_gt(base_kb, 0);
#ifdef LBT_SANITIZED
    /* a sanitizer's shadow memory and allocator quarantine: bound the growth instead */
    limit_kb += base_kb;
#endif
    ck_assert_int_eq(pthread_create(&s.thread, NULL, rss_sample, &s), 0);
    for (int i = 0; i < 5; i++) {
        json_t *res = lbt_exec_ok(&D, SBX, "", body);
        const char *out = json_string_value(json_object_get(res, "stdout"));

        assert_result(res, 1, NULL, "fatal\n", NULL);
        ck_assert_ptr_nonnull(out);
        ck_assert_uint_eq(strlen(out), 1048576);
        ck_assert_uint_eq(strspn(out, "a"), 1048576);
        ck_assert(json_is_true(json_object_get(res, "stdout_truncated")));
        ck_assert(json_is_false(json_object_get(res, "stderr_truncated")));
        json_decref(res);
    }
    atomic_store(&s.stop, 1);
    pthread_join(s.thread, NULL);
    fprintf(stderr, "test_exec: daemon VmRSS %ld kB before, at most %ld kB during (limit %ld)\n",
            base_kb, s.max_kb, limit_kb);
    ck_assert_int_gt(s.max_kb, 0);
    ck_assert_msg(s.max_kb < limit_kb, "daemon VmRSS reached %ld kB (limit %ld kB)", s.max_kb,
                  limit_kb);
}
END_TEST

START_TEST(test_invalid_utf8)
{
    json_t *res = lbt_exec_ok(&D, SBX, "", "{\"command\": \"printf '\\\\377\\\\376ok'\"}");
    unsigned char *raw;
    size_t len = 0;

    /* lbt_exec_ok parsed the body as JSON (jansson rejects invalid UTF-8) */
    assert_result(res, 0, "\xef\xbf\xbd\xef\xbf\xbdok", "", NULL);
    json_decref(res);
    res = lbt_exec_ok(&D, SBX, "",
                      "{\"command\": \"printf '\\\\377\\\\376ok'; printf '\\\\000\\\\001' >&2\", "
                      "\"encoding\": \"base64\"}");
    assert_result(res, 0, NULL, NULL, NULL);
    raw = lbt_b64_decode(json_string_value(json_object_get(res, "stdout")), &len);
    ck_assert_ptr_nonnull(raw);
    ck_assert_uint_eq(len, 4);
    ck_assert(memcmp(raw, "\377\376ok", 4) == 0);
    free(raw);
    raw = lbt_b64_decode(json_string_value(json_object_get(res, "stderr")), &len);
    ck_assert_ptr_nonnull(raw);
    ck_assert_uint_eq(len, 2);
    ck_assert(memcmp(raw, "\000\001", 2) == 0);
    free(raw);
    json_decref(res);
}
END_TEST

/* ---------- grading integrity ---------- */

/* The agent's planted supervisor: notes that it ran, then runs the real one without
 * --exclusive (so a result would look right, but nothing of the agent would be stopped). */
static const char PLANT_SH[] = "#!/bin/sh\n"
                               "echo ran >>/tmp/planted-ran\n"
                               "for a; do shift; [ \"$a\" = --exclusive ] || set -- \"$@\" \"$a\"; "
                               "done\n"
                               "exec /run/lendbox.agent/supervise \"$@\"\n";

/* The container's (sandbox's) root renames /run/lendbox (and /run, where it can) and plants its
 * own supervise there: three exclusive execs still run the daemon's supervisor (the planted one
 * never runs), return the true result, and sweep (the agent's background process is gone). On
 * a provider that cannot hold that (lxd), an exclusive exec is refused with 422. */
START_TEST(test_planted_supervisor_exclusive)
{
    struct lbt_daemon d;
    char sbx[128], op[256], cmd[300];
    struct lbt_resp r;
    json_t *lease, *res;
    char *out;

    lbt_daemon_start(&d, NULL);
    lease = lbt_seed(&d, "planted-exec", "task-planted", NULL);
    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    snprintf(op, sizeof(op), "%s",
             json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
    if (lbt_variant_lacks("exclusive")) {
        lbt_exec(&d, sbx, "", "{\"command\": \"exit 7\", \"exclusive\": true}", &r);
        lbt_assert_error(&r, 422, "unenforceable");
        ck_assert_msg(strstr(r.body, "exclusive") && strstr(r.body, "lxd"), "%s", r.body);
        lbt_resp_free(&r);
        lbt_skip_note("test_planted_supervisor_exclusive (the plant)",
                      lbt_variant_lacks("exclusive"));
        lbt_daemon_cleanup(&d);
        return;
    }
    lbt_file_put(&d, sbx, op, "/tmp/plant.sh", "0755", PLANT_SH, strlen(PLANT_SH), &r);
    ck_assert_msg(r.status == 204, "upload: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    res = lbt_exec_ok(&d, sbx, op,
                      "{\"command\": \"mv /run /run.agent 2>/dev/null; mkdir -p /run; "
                      "mv /run/lendbox /run/lendbox.agent 2>/dev/null || "
                      "mv /run.agent/lendbox /run/lendbox.agent; mkdir /run/lendbox && "
                      "cp /tmp/plant.sh /run/lendbox/supervise && "
                      "chmod 755 /run/lendbox/supervise\"}");
    ck_assert_msg(json_integer_value(json_object_get(res, "return_code")) == 0, "plant: %s",
                  json_string_value(json_object_get(res, "stderr")));
    json_decref(res);
    for (int i = 0; i < 3; i++) {
        int pid;

        res = lbt_exec_ok(&d, sbx, op,
                          "{\"command\": \"sleep 1000 </dev/null >/dev/null 2>&1 & echo $!\", "
                          "\"preserve_background_services\": true}");
        pid = atoi(json_string_value(json_object_get(res, "stdout")));
        json_decref(res);
        ck_assert_int_gt(pid, 1);
        res = lbt_exec_ok(&d, sbx, "",
                          "{\"exclusive\": true, \"command\": \"echo true-output; exit 7\"}");
        assert_result(res, 7, "true-output\n", "", NULL);
        json_decref(res);
        snprintf(cmd, sizeof(cmd), "if kill -0 %d 2>/dev/null; then echo alive; fi; echo end", pid);
        out = lbt_sh(&d, sbx, cmd);
        ck_assert_msg(strcmp(out, "end\n") == 0, "exclusive exec %d: the agent's process: %s", i,
                      out);
        free(out);
    }
    out = lbt_sh(&d, sbx, "cat /tmp/planted-ran 2>/dev/null; echo end");
    ck_assert_str_eq(out, "end\n");
    free(out);
    /* stdin: on docker it would pass through a file the agent can replace before the sweep */
    lbt_exec(&d, sbx, "", "{\"exclusive\": true, \"command\": \"cat\", \"stdin\": \"in\"}", &r);
    if (lbt_variant_is("docker")) {
        lbt_assert_error(&r, 422, "unenforceable");
        ck_assert_msg(strstr(r.body, "stdin") != NULL, "%s", r.body);
    } else {
        ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
        assert_result(r.json, 0, "in", "", NULL);
    }
    lbt_resp_free(&r);
    lbt_daemon_cleanup(&d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("exec");
    TCase *tc = tcase_create("exec");
    TCase *grading = tcase_create("grading");

    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_echo_hi);
    tcase_add_test(tc, test_exit_3);
    tcase_add_test(tc, test_argv_env_stdin);
    tcase_add_test(tc, test_seed_files);
    tcase_add_test(tc, test_cwd);
    tcase_add_test(tc, test_timeout_kills_tree);
    tcase_add_test(tc, test_output_cap_and_memory);
    tcase_add_test(tc, test_invalid_utf8);
    suite_add_tcase(s, tc);
    tcase_set_timeout(grading, 120);
    tcase_add_test(grading, test_planted_supervisor_exclusive);
    suite_add_tcase(s, grading);
    return lbt_run_suite(s);
}
