/*
 * test_exec.c - acceptance: exec results, seed files, cwd errors, timeouts that kill the whole
 * tree (seen from the host and from inside the sandbox, also when the command kills its own
 * supervisor), output caps with bounded daemon memory, invalid UTF-8 and base64 output, and the
 * trusted view an exclusive exec (a grader) runs on.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>

#include "harness.h"

static struct lbt_daemon D;
static char SBX[128];

static const char RUN_SH[] = "#!/bin/sh\necho ran \"$@\"\n";
static unsigned char BLOB[256 + 64];

static void seed(void)
{
    json_t *files, *lease;
    char *files_text, *extra, *b64_run, *b64_key, *b64_blob;

    for (int i = 0; i < 256; i++)
        BLOB[i] = (unsigned char)i;
    memset(BLOB + 256, 0, 64); /* trailing NULs */
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

/* How many processes of the sandbox are named sleep (its pid namespace, seen from inside: the
 * same on every provider; no sandbox's own init runs one). The listing into list. */
static int count_sleeps_inside(char *list, size_t size)
{
    char *ps = lbt_sh(&D, SBX, "busybox ps -o comm,args"), *save = NULL;
    int n = 0;

    snprintf(list, size, "%s", ps);
    for (char *l = strtok_r(ps, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
        if (strncmp(l, "sleep ", 6) == 0)
            n++;
    free(ps);
    return n;
}

/* Every process of a timed-out exec is gone, seen from inside the sandbox 0.5 s and 5 s after
 * the answer: one that called setsid, one whose parent exited (a double fork), one that ignores
 * SIGTERM. */
START_TEST(test_timeout_leaves_nothing_inside)
{
    json_t *body = json_pack("{s:s,s:i}", "command",
                             "echo started; setsid sleep 1000 & sh -c 'setsid sleep 1001 &'; "
                             "(trap '' TERM; exec sleep 1002) & sleep 1003",
                             "timeout_s", 1);
    char *text = json_dumps(body, JSON_COMPACT), list[4096];
    json_t *res;
    int n;

    ck_assert_int_eq(count_sleeps_inside(list, sizeof(list)), 0);
    res = lbt_exec_ok(&D, SBX, "", text);
    assert_result(res, 125, "started\n", NULL, "timeout");
    json_decref(res);
    lbt_sleep_ms(500);
    n = count_sleeps_inside(list, sizeof(list));
    ck_assert_msg(n == 0, "0.5 s after the timeout %d sleep processes are left:\n%s", n, list);
    lbt_sleep_ms(4500);
    n = count_sleeps_inside(list, sizeof(list));
    ck_assert_msg(n == 0, "5 s after the timeout %d sleep processes are left:\n%s", n, list);
    json_decref(body);
    free(text);
}
END_TEST

/* A timed-out command that forks on and on (each child in the background): none of its
 * children outlives the answer, also one forked while the tree was being killed. */
START_TEST(test_timeout_forking_loop_leaves_nothing_inside)
{
    char list[4096];
    json_t *res;
    int n;

    res = lbt_exec_ok(&D, SBX, "",
                      "{\"command\": \"echo started; while :; do sleep 1008 & sleep 0.005; "
                      "done\", \"timeout_s\": 1}");
    assert_result(res, 125, "started\n", NULL, "timeout");
    json_decref(res);
    lbt_sleep_ms(500);
    n = count_sleeps_inside(list, sizeof(list));
    ck_assert_msg(n == 0, "0.5 s after the timeout %d sleep processes are left:\n%s", n, list);
}
END_TEST

/* The command kills its own supervisor (it runs as the same uid): nothing enforces the timeout
 * any more, so what the exec left running (the command, a background child, a setsid child, also
 * with preserve_background_services) is killed, and the answer says so. */
START_TEST(test_supervisor_killed_leaves_nothing_inside)
{
    static const char *const bodies[] = {
        "{\"command\": \"sleep 1004 & setsid sleep 1005 & kill -9 $PPID; sleep 1006\", "
        "\"timeout_s\": 60}",
        "{\"command\": \"sleep 1004 & setsid sleep 1005 & kill -9 $PPID; sleep 1006\", "
        "\"timeout_s\": 60, \"preserve_background_services\": true}",
        NULL};
    char list[4096];
    int n;

    for (int i = 0; bodies[i]; i++) {
        json_t *res = lbt_exec_ok(&D, SBX, "", bodies[i]);
        const char *msg = json_string_value(json_object_get(res, "message"));

        n = count_sleeps_inside(list, sizeof(list));
        for (int k = 0; k < 50 && n > 0; k++) {
            lbt_sleep_ms(20);
            n = count_sleeps_inside(list, sizeof(list));
        }
        ck_assert_msg(n == 0, "%d sleep processes are left (message: %s):\n%s", n,
                      msg ? msg : "(null)", list);
        assert_result(res, 125, NULL, NULL, "sandbox");
        ck_assert_msg(msg && strstr(msg, "supervisor was killed by signal 9") &&
                          strstr(msg, "processes the exec left running"),
                      "message: %s", msg ? msg : "(null)");
        json_decref(res);
    }
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

/* Exec as the agent (operate token op), with no assertion on the outcome: what a hostile agent
 * tries (on image host, whose root is read-only, its writes there fail). */
static void agent_run(const char *sbx, const char *op, const char *command)
{
    json_t *body = json_pack("{s:s}", "command", command);
    char *text = json_dumps(body, JSON_COMPACT);
    struct lbt_resp r;

    lbt_exec(&D, sbx, op, text, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    free(text);
    json_decref(body);
}

/* An exclusive exec (admin) with body's members; asserts return code rc and stdout out. */
static void assert_grader(const char *sbx, const char *members, int rc, const char *out)
{
    char body[1024];
    json_t *res;

    snprintf(body, sizeof(body), "{\"exclusive\": true, %s}", members);
    res = lbt_exec_ok(&D, sbx, "", body);
    ck_assert_msg(json_integer_value(json_object_get(res, "return_code")) == rc,
                  "%s: return code %lld (want %d), stdout '%s', stderr '%s'", members,
                  (long long)json_integer_value(json_object_get(res, "return_code")), rc,
                  json_string_value(json_object_get(res, "stdout")),
                  json_string_value(json_object_get(res, "stderr")));
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), out);
    json_decref(res);
}

/* On a variant without the trusted view (docker, lxd) a grader's plain exclusive exec is 422
 * unenforceable: asserts it and says why the rest is skipped. True when the caller returns. */
static bool view_lacking(const char *sbx, const char *test)
{
    const char *why = lbt_variant_lacks("trusted_view");
    struct lbt_resp r;

    if (!why)
        return false;
    lbt_exec(&D, sbx, "", "{\"command\": \"exit 7\", \"exclusive\": true}", &r);
    lbt_assert_error(&r, 422, "unenforceable");
    lbt_resp_free(&r);
    lbt_skip_note(test, why);
    return true;
}

/* A grader (exclusive exec) runs on the sandbox's base image, not on what the agent made of its
 * root: an agent that replaced /bin/sh, python3 and a module of its standard library with
 * fakes that exit 0, planted json.py in the workdir and marked /tmp cannot change the
 * grader's result, by command or by argv; the grader starts in / and reads the workdir; with
 * "agent_root" it runs on the agent's root (and sees the fakes). */
START_TEST(test_exclusive_trusted_view)
{
    static const char fake[] = "#!/bin/busybox sh\necho forged\nexit 0\n";
    char sbx[128], op[256], cmd[1024];
    json_t *lease = lbt_seed(&D, "exec-view", "task-view", NULL);
    struct lbt_resp r;
    bool image = !lbt_variant_on_host();

    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    snprintf(op, sizeof(op), "%s",
             json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
    if (view_lacking(sbx, "test_exclusive_trusted_view"))
        return;

    /* the agent's work: an answer, a module where an interpreter looks first, a mark in /tmp */
    agent_run(sbx, op,
              "echo 42 > /workspace/answer.txt; echo 'import sys; print(\"forged\"); "
              "sys.exit(0)' > /workspace/json.py; touch /tmp/agent-mark");
    /* the forgery: fakes over the shell, python3 and the json module (each exits 0) */
    lbt_file_put(&D, sbx, op, "/workspace/fake", "755", fake, strlen(fake), &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
    snprintf(cmd, sizeof(cmd),
             "py=$(python3 -c 'import json; print(json.__file__)'); "
             "cp /workspace/json.py \"$py\"; rm -f /usr/bin/python3 /bin/sh; "
             "cp /workspace/fake /usr/bin/python3; cp /workspace/fake /bin/sh");
    agent_run(sbx, op, cmd);
    if (image) /* the forgery took: the agent's root runs the fakes */
        assert_grader(sbx, "\"agent_root\": true, \"command\": \"exit 7\"", 0, "forged\n");

    /* the grader's truth, by command and by argv */
    assert_grader(sbx, "\"command\": \"echo truth; exit 7\"", 7, "truth\n");
    assert_grader(sbx, "\"argv\": [\"sh\", \"-c\", \"echo truth; exit 7\"]", 7, "truth\n");
    assert_grader(sbx, "\"argv\": [\"/bin/sh\", \"-c\", \"exit 6\"]", 6, "");
    /* python3 and its json module are the image's, and json.py in the workdir is not on the
     * path: the default cwd is / */
    assert_grader(sbx, "\"argv\": [\"python3\", \"-c\", \"import json, sys; sys.exit(3)\"]", 3, "");
    assert_grader(sbx, "\"command\": \"pwd\"", 0, "/\n");
    /* the workdir is the agent's, at its path; /tmp is the grader's own */
    assert_grader(sbx, "\"command\": \"cat /workspace/answer.txt\"", 0, "42\n");
    assert_grader(sbx, "\"argv\": [\"test\", \"-e\", \"/tmp/agent-mark\"]", 1, "");
    /* a cwd that is asked for is kept: there the agent's json.py is what Python imports */
    assert_grader(sbx,
                  "\"cwd\": \"/workspace\", \"argv\": [\"python3\", \"-c\", \"import json, sys; "
                  "sys.exit(3)\"]",
                  0, "forged\n");
    /* agent_root: the agent's root, /tmp included */
    assert_grader(sbx, "\"agent_root\": true, \"argv\": [\"test\", \"-e\", \"/tmp/agent-mark\"]", 0,
                  "");

    /* a daemon restarted in a mount namespace of its own no longer has the image's tree
     * mounted where it made it: the grader's view is made from the image itself, and tells the
     * same truth */
    if (image) {
        char img[512];

        snprintf(img, sizeof(img), "%s/sandboxes/%s/img", D.state_dir, sbx);
        ck_assert_int_eq(umount2(img, MNT_DETACH), 0);
        assert_grader(sbx, "\"command\": \"echo truth; exit 7\"", 7, "truth\n");
        assert_grader(sbx, "\"argv\": [\"python3\", \"-c\", \"import json, sys; sys.exit(3)\"]", 3,
                      "");
        assert_grader(sbx, "\"command\": \"cat /workspace/answer.txt; stat -c %u /usr/bin\"", 0,
                      "42\n0\n");
    }
    /* agent_root is a boolean, and only for exclusive execs */
    lbt_exec(&D, sbx, "", "{\"command\": \"true\", \"agent_root\": true}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    lbt_exec(&D, sbx, "", "{\"command\": \"true\", \"exclusive\": true, \"agent_root\": 1}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    assert_grader(sbx, "\"agent_root\": false, \"command\": \"exit 4\"", 4, "");
}
END_TEST

/* A HOME in the workdir is not the grader's: the agent's Python user site (usercustomize.py,
 * loaded at every start) under the workdir's ~/.local stays out of an exclusive exec, whose
 * HOME is then /tmp, unless the grader's env names one. */
START_TEST(test_exclusive_home_not_in_workdir)
{
    char sbx[128], op[256];
    json_t *lease = lbt_seed(&D, "exec-home", "task-home", "\"workdir\": \"/root\"");
    json_t *res;

    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    snprintf(op, sizeof(op), "%s",
             json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
    if (view_lacking(sbx, "test_exclusive_home_not_in_workdir"))
        return;
    agent_run(sbx, op,
              "d=$(python3 -m site --user-site) && mkdir -p \"$d\" && printf 'import "
              "os\\nprint(\"forged\", flush=True)\\nos._exit(0)\\n' > \"$d/usercustomize.py\"");
    /* the plant works where HOME is the workdir */
    res =
        lbt_exec_ok(&D, sbx, op, "{\"argv\": [\"python3\", \"-c\", \"import sys; sys.exit(3)\"]}");
    ck_assert_msg(json_integer_value(json_object_get(res, "return_code")) == 0 &&
                      strcmp(json_string_value(json_object_get(res, "stdout")), "forged\n") == 0,
                  "the agent's usercustomize.py did not load: %s", json_dumps(res, 0));
    json_decref(res);
    assert_grader(sbx,
                  "\"argv\": [\"python3\", \"-c\", \"import os, sys; print(os.environ['HOME']); "
                  "sys.exit(3)\"]",
                  3, "/tmp\n");
    assert_grader(sbx,
                  "\"env\": {\"HOME\": \"/root\"}, \"argv\": [\"python3\", \"-c\", \"import sys; "
                  "sys.exit(3)\"]",
                  0, "forged\n");
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
        /* docker has no base-image view: its graders say agent_root (the supervisor is
         * still the daemon's, from /.lendbox) */
        res = lbt_exec_ok(&d, sbx, "",
                          lbt_variant_lacks("trusted_view")
                              ? "{\"exclusive\": true, \"agent_root\": true, "
                                "\"command\": \"echo true-output; exit 7\"}"
                              : "{\"exclusive\": true, \"command\": \"echo true-output; exit 7\"}");
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
    lbt_exec(&d, sbx, "",
             "{\"exclusive\": true, \"agent_root\": true, \"command\": \"cat\", \"stdin\": \"in\"}",
             &r);
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

    lbt_fixture_add(tc, &(struct lbt_fixture){.d = &D, .seed = seed}, true);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_echo_hi);
    tcase_add_test(tc, test_exit_3);
    tcase_add_test(tc, test_argv_env_stdin);
    tcase_add_test(tc, test_seed_files);
    tcase_add_test(tc, test_cwd);
    tcase_add_test(tc, test_timeout_kills_tree);
    tcase_add_test(tc, test_timeout_leaves_nothing_inside);
    tcase_add_test(tc, test_timeout_forking_loop_leaves_nothing_inside);
    tcase_add_test(tc, test_supervisor_killed_leaves_nothing_inside);
    tcase_add_test(tc, test_output_cap_and_memory);
    tcase_add_test(tc, test_invalid_utf8);
    tcase_add_test(tc, test_exclusive_trusted_view);
    tcase_add_test(tc, test_exclusive_home_not_in_workdir);
    suite_add_tcase(s, tc);
    tcase_set_timeout(grading, 120);
    tcase_add_test(grading, test_planted_supervisor_exclusive);
    suite_add_tcase(s, grading);
    return lbt_run_suite(s);
}
