/*
 * test_contexts.c - acceptance of code contexts (API.md "Toolbox"): the real daemon, real
 * sandboxes, lendbox's Python driver held under lendbox-supervise --pty-launch, over real HTTP.
 *
 * Proves: state kept across runs and after an exception (ZeroDivisionError, then the variable
 * is still there); stdout, stderr and the repr of a last expression; a run past timeout_s is
 * interrupted (KeyboardInterrupt) and the context lives on; the interrupt route ends a run;
 * a second run while one is under way is 409; another sandbox's operate token is refused (403)
 * on every context route; a context id on a PTY route and a PTY id on a context route are 404;
 * delete is 204 then 404; bad bodies are 400; a kill -9 of the daemon and a restart keep the
 * interpreter and its state, and so does a SIGTERM (no shutdown sweep) while a run waits (the
 * run answers 503 at once, the drain does not wait for it); a reset and a release end the
 * driver (no driver process of the sandbox left, the context 404); a sandbox without python3
 * answers 422; a run in a paused sandbox is 409 at once.
 */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define DRIVER_MARK "lendbox code-context driver" /* in the driver's source: its argv */

static struct lbt_daemon D;
static char SBX[128], OP[256];

static void seed_sandbox(struct lbt_daemon *d, const char *rsid, char *sbx, size_t sbx_len,
                         char *op, size_t op_len)
{
    json_t *lease = lbt_seed(d, rsid, "task-ctx", NULL);

    snprintf(sbx, sbx_len, "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    if (op)
        snprintf(op, op_len, "%s",
                 json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
}

static void seed(void)
{
    seed_sandbox(&D, "ctx-1", SBX, sizeof(SBX), OP, sizeof(OP));
}

/* POST /v1/sandboxes/SBX/contexts; asserts 201 and returns the id in cid. */
static void ctx_create(struct lbt_daemon *d, const char *sbx, const char *token, char *cid,
                       size_t len)
{
    char path[256];
    struct lbt_resp r;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/contexts", sbx);
    lbt_json(d, "POST", path, token, "{\"language\": \"python\"}", &r);
    ck_assert_msg(r.status == 201, "create: %ld %s", r.status, r.body);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "language")), "python");
    snprintf(cid, len, "%s", json_string_value(json_object_get(r.json, "context_id")));
    ck_assert_int_eq(strncmp(cid, "ctx-", 4), 0);
    lbt_resp_free(&r);
}

/* POST /v1/contexts/CID/run {"code": code, "timeout_s"?} (timeout_s <= 0: none). */
static void ctx_run(struct lbt_daemon *d, const char *cid, const char *token, const char *code,
                    double timeout_s, struct lbt_resp *r)
{
    char path[256], *body;
    json_t *b = json_pack("{s:s}", "code", code);

    if (timeout_s > 0)
        json_object_set_new(b, "timeout_s", json_real(timeout_s));
    body = json_dumps(b, JSON_COMPACT);
    snprintf(path, sizeof(path), "/v1/contexts/%s/run", cid);
    lbt_json(d, "POST", path, token, body, r);
    free(body);
    json_decref(b);
}

/* A run that must answer 200 with exactly these fields; result/error_name NULL: null. */
static void ctx_run_expect(struct lbt_daemon *d, const char *cid, const char *code, const char *out,
                           const char *err, const char *result, const char *error_name)
{
    struct lbt_resp r;
    json_t *e;

    ctx_run(d, cid, OP[0] && d == &D ? OP : "", code, 0, &r);
    ck_assert_msg(r.status == 200, "run %s: %ld %s", code, r.status, r.body);
    ck_assert_int_eq(json_object_size(r.json), 5);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "stdout")), out);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "stderr")), err);
    ck_assert(json_is_integer(json_object_get(r.json, "duration_ms")));
    ck_assert_int_ge(json_integer_value(json_object_get(r.json, "duration_ms")), 0);
    if (result)
        ck_assert_str_eq(json_string_value(json_object_get(r.json, "result")), result);
    else
        ck_assert(json_is_null(json_object_get(r.json, "result")));
    e = json_object_get(r.json, "error");
    if (error_name) {
        ck_assert_msg(json_is_object(e), "run %s: %s", code, r.body);
        ck_assert_str_eq(json_string_value(json_object_get(e, "name")), error_name);
        ck_assert(json_is_string(json_object_get(e, "value")));
        ck_assert_ptr_nonnull(
            strstr(json_string_value(json_object_get(e, "traceback")), error_name));
    } else {
        ck_assert_msg(json_is_null(e), "run %s: %s", code, r.body);
    }
    lbt_resp_free(&r);
}

static void ctx_call(struct lbt_daemon *d, const char *method, const char *cid, const char *what,
                     const char *token, struct lbt_resp *r)
{
    char path[256];

    snprintf(path, sizeof(path), "/v1/contexts/%s%s%s", cid, what ? "/" : "", what ? what : "");
    lbt_json(d, method, path, token, strcmp(method, "DELETE") ? "{}" : NULL, r);
}

/* Live interpreters of uid running the driver (python3, with the driver's mark in its argv; the
 * holder above it carries the mark too, in its own argv). */
static int count_drivers_of_uid(uid_t uid)
{
    DIR *dir = opendir("/proc");
    struct dirent *e;
    int n = 0;

    ck_assert_ptr_nonnull(dir);
    while ((e = readdir(dir))) {
        char path[300], buf[16384], line[256];
        unsigned ruid = 0;
        size_t len;
        FILE *f;
        bool zombie = false, mine = false;

        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        snprintf(path, sizeof(path), "/proc/%s/status", e->d_name);
        if (!(f = fopen(path, "r")))
            continue;
        while (fgets(line, sizeof(line), f)) {
            if (strncmp(line, "State:", 6) == 0 && strchr(line, 'Z'))
                zombie = true;
            if (sscanf(line, "Uid: %u", &ruid) == 1)
                mine = ruid == uid;
        }
        fclose(f);
        if (!mine || zombie)
            continue;
        snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
        if (!(f = fopen(path, "r")))
            continue;
        len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        for (size_t i = 0; i < len; i++)
            if (!buf[i])
                buf[i] = ' ';
        buf[len] = '\0';
        if (strncmp(buf, "python3 ", 8) == 0 && strstr(buf, DRIVER_MARK))
            n++;
    }
    closedir(dir);
    return n;
}

START_TEST(test_state_output_and_exceptions)
{
    char cid[64];

    LBT_SKIP_ON_ENGINE("the engine providers have no PTY sessions, so no contexts (501)");
    ctx_create(&D, SBX, OP, cid, sizeof(cid));
    ctx_run_expect(&D, cid, "x = 41", "", "", NULL, NULL);
    ctx_run_expect(&D, cid, "x + 1", "", "", "42", NULL);
    ctx_run_expect(&D, cid, "import sys\nprint('out')\nprint('err', file=sys.stderr)\n'x=%d' % x",
                   "out\n", "err\n", "'x=41'", NULL);
    /* a child process's output is captured too */
    ctx_run_expect(&D, cid, "import subprocess\nsubprocess.run(['echo', 'child'])\nNone", "child\n",
                   "", NULL, NULL);
    ctx_run_expect(&D, cid, "y = 1\n1/0", "", "", NULL, "ZeroDivisionError");
    ctx_run_expect(&D, cid, "x, y", "", "", "(41, 1)", NULL);
    ctx_run_expect(&D, cid, "def f(:", "", "", NULL, "SyntaxError");
    ctx_run_expect(&D, cid, "raise SystemExit(3)", "", "", NULL, "SystemExit");
    ctx_run_expect(&D, cid, "x", "", "", "41", NULL);
}
END_TEST

START_TEST(test_timeout_interrupt_and_busy)
{
    char cid[64], path[256];
    struct lbt_async *a;
    struct lbt_resp r;
    json_t *e;
    double until;
    int interrupts = 0;

    LBT_SKIP_ON_ENGINE("the engine providers have no PTY sessions, so no contexts (501)");
    ctx_create(&D, SBX, OP, cid, sizeof(cid));
    ctx_run_expect(&D, cid, "x = 7", "", "", NULL, NULL);
    /* past its timeout: KeyboardInterrupt, and the context lives on */
    ctx_run(&D, cid, OP, "print('before', flush=True)\nwhile True: pass", 1, &r);
    ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
    e = json_object_get(r.json, "error");
    ck_assert_str_eq(json_string_value(json_object_get(e, "name")), "KeyboardInterrupt");
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "stdout")), "before\n");
    lbt_resp_free(&r);
    ctx_run_expect(&D, cid, "x", "", "", "7", NULL);

    /* the interrupt route ends a run; a second run meanwhile is 409 */
    snprintf(path, sizeof(path), "/v1/contexts/%s/run", cid);
    a = lbt_async_json(&D, "POST", path, OP,
                       "{\"code\": \"import time\\nx = 8\\ntime.sleep(120)\", \"timeout_s\": 300}");
    until = lbt_now() + 30;
    while (!lbt_async_done(a) && lbt_now() < until) {
        lbt_sleep_ms(300);
        ctx_run(&D, cid, OP, "x", 0, &r);
        if (r.status == 409)
            lbt_assert_error(&r, 409, "conflict");
        else /* the first had not started yet */
            ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
        lbt_resp_free(&r);
        ctx_call(&D, "POST", cid, "interrupt", OP, &r);
        ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
        ck_assert_str_eq(json_string_value(json_object_get(r.json, "context_id")), cid);
        lbt_resp_free(&r);
        interrupts++;
    }
    lbt_async_join(a, &r);
    ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
    e = json_object_get(r.json, "error");
    ck_assert_str_eq(json_string_value(json_object_get(e, "name")), "KeyboardInterrupt");
    ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(e, "traceback")), "sleep"));
    lbt_resp_free(&r);
    ck_assert_int_ge(interrupts, 1);
    ctx_run_expect(&D, cid, "x", "", "", "8", NULL);
}
END_TEST

START_TEST(test_tokens_ids_and_delete)
{
    char cid[64], sbx2[128], op2[256], path[256];
    struct lbt_resp r;
    static const char *const verbs[][2] = {
        {"POST", "run"}, {"POST", "interrupt"}, {"DELETE", NULL}};

    LBT_SKIP_ON_ENGINE("the engine providers have no PTY sessions, so no contexts (501)");
    seed_sandbox(&D, "ctx-2", sbx2, sizeof(sbx2), op2, sizeof(op2));
    ctx_create(&D, SBX, "", cid, sizeof(cid)); /* admin may create too */
    ctx_run_expect(&D, cid, "z = 3", "", "", NULL, NULL);

    /* another sandbox's operate token: refused on every route, the context untouched */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/contexts", SBX);
    lbt_json(&D, "POST", path, op2, "{\"language\": \"python\"}", &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    for (size_t i = 0; i < 3; i++) {
        if (verbs[i][1] && strcmp(verbs[i][1], "run") == 0)
            ctx_run(&D, cid, op2, "z = 4", 0, &r);
        else
            ctx_call(&D, verbs[i][0], cid, verbs[i][1], op2, &r);
        lbt_assert_error(&r, 403, "forbidden");
        lbt_resp_free(&r);
    }
    ctx_call(&D, "POST", cid, "run", NULL, &r);
    ck_assert_int_eq(r.status, 401);
    lbt_resp_free(&r);
    ctx_run_expect(&D, cid, "z", "", "", "3", NULL);

    /* bodies */
    lbt_json(&D, "POST", path, OP, "{\"language\": \"ruby\"}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", path, OP, "{\"language\": \"python\", \"x\": 1}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    ctx_call(&D, "POST", cid, "run", OP, &r); /* {}: no code */
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    ctx_run(&D, cid, OP, "z", -1, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/contexts/%s/run", cid);
    lbt_json(&D, "POST", path, OP, "{\"code\": \"z\", \"timeout_s\": 0}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);

    /* a context is not a PTY session to the PTY routes, nor a PTY session a context */
    snprintf(path, sizeof(path), "/v1/pty/%s/output", cid);
    lbt_json(&D, "GET", path, "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/pty/%s/input", cid);
    lbt_json(&D, "POST", path, OP, "x", &r);
    ck_assert_msg(r.status == 403 || r.status == 404, "%ld", r.status);
    lbt_resp_free(&r);
    {
        char sid[64];

        snprintf(path, sizeof(path), "/v1/sandboxes/%s/pty", SBX);
        lbt_json(&D, "POST", path, OP, "{\"command\": \"cat\", \"pty\": false}", &r);
        ck_assert_int_eq(r.status, 201);
        snprintf(sid, sizeof(sid), "%s", json_string_value(json_object_get(r.json, "session_id")));
        lbt_resp_free(&r);
        ctx_run(&D, sid, "", "1", 0, &r);
        lbt_assert_error(&r, 404, "not_found");
        lbt_resp_free(&r);
        snprintf(path, sizeof(path), "/v1/pty/%s", sid);
        lbt_json(&D, "DELETE", path, OP, NULL, &r);
        ck_assert_int_eq(r.status, 204);
        lbt_resp_free(&r);
    }

    /* delete: 204, then 404 everywhere */
    ctx_call(&D, "DELETE", cid, NULL, OP, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
    ctx_run(&D, cid, "", "z", 0, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    ctx_call(&D, "POST", cid, "interrupt", "", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    ctx_call(&D, "DELETE", cid, NULL, "", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    ctx_call(&D, "DELETE", "ctx-0123456789abcdef", NULL, "", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    lbt_release_session(&D, "ctx-2");
}
END_TEST

/* Wait (at most 60 s) until uid runs no driver; assert it. */
static void assert_drivers_end(uid_t uid)
{
    double until = lbt_now() + 60;

    while (count_drivers_of_uid(uid) > 0 && lbt_now() < until)
        lbt_sleep_ms(100);
    ck_assert_int_eq(count_drivers_of_uid(uid), 0);
}

START_TEST(test_reset_and_release_end_the_driver)
{
    char sbx[128], op[256], cid[64], path[256];
    struct lbt_resp r;
    uid_t uid;

    LBT_SKIP_ON_ENGINE("the engine providers have no PTY sessions, so no contexts (501)");
    seed_sandbox(&D, "ctx-3", sbx, sizeof(sbx), op, sizeof(op));
    uid = lbt_sandbox_uid(&D, sbx);
    ctx_create(&D, sbx, op, cid, sizeof(cid));
    ck_assert_int_eq(count_drivers_of_uid(uid), 1);
    /* a reset ends it */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/reset", sbx);
    lbt_json(&D, "POST", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    assert_drivers_end(uid);
    ctx_run(&D, cid, "", "1", 0, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    /* and so does a release (the reset may have given the sandbox another uid) */
    uid = lbt_sandbox_uid(&D, sbx);
    ctx_create(&D, sbx, "", cid, sizeof(cid));
    ck_assert_int_eq(count_drivers_of_uid(uid), 1);
    lbt_release_session(&D, "ctx-3");
    assert_drivers_end(uid);
    ctx_run(&D, cid, "", "1", 0, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
}
END_TEST

START_TEST(test_daemon_restarts_keep_the_interpreter)
{
    static const char *const args[] = {"--set", "lending.shutdown_sweep=no", NULL};
    static struct lbt_daemon d; /* static: the harness cleans it up when the test process ends */
    char sbx[128], cid[64], path[256];
    struct lbt_async *a;
    struct lbt_resp r;
    uid_t uid;
    double until;
    bool under_way = false;

    LBT_SKIP_ON_ENGINE("the engine providers have no PTY sessions, so no contexts (501)");
    lbt_daemon_start(&d, args);
    seed_sandbox(&d, "ctx-r", sbx, sizeof(sbx), NULL, 0);
    uid = lbt_sandbox_uid(&d, sbx);
    ctx_create(&d, sbx, "", cid, sizeof(cid));
    ctx_run_expect(&d, cid, "x = 41", "", "", NULL, NULL);
    /* kill -9 */
    lbt_daemon_kill(&d);
    ck_assert_int_eq(count_drivers_of_uid(uid), 1); /* it outlives the daemon */
    lbt_daemon_restart(&d, args);
    ctx_run_expect(&d, cid, "x + 1", "", "", "42", NULL);
    ctx_run_expect(&d, cid, "print(x)", "41\n", "", NULL, NULL);

    /* SIGTERM (no shutdown sweep) while a long run waits: the run answers 503 at once and the
     * daemon stops; the interpreter goes on */
    snprintf(path, sizeof(path), "/v1/contexts/%s/run", cid);
    a = lbt_async_json(&d, "POST", path, "",
                       "{\"code\": \"import time\\ntime.sleep(600)\", \"timeout_s\": 900}");
    until = lbt_now() + 20;
    while (!under_way && lbt_now() < until) {
        lbt_sleep_ms(200);
        ctx_run(&d, cid, "", "x", 0, &r);
        under_way = r.status == 409;
        lbt_resp_free(&r);
    }
    ck_assert(under_way);
    ck_assert_int_eq(lbt_daemon_stop(&d), 0);
    lbt_async_join(a, &r);
    lbt_assert_error(&r, 503, "draining");
    lbt_resp_free(&r);
    ck_assert_int_eq(count_drivers_of_uid(uid), 1);
    lbt_daemon_restart(&d, args);
    /* the sleep still runs in the interpreter: interrupt it, and the state is there */
    ctx_call(&d, "POST", cid, "interrupt", "", &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    ctx_run_expect(&d, cid, "x", "", "", "41", NULL);
    lbt_release_session(&d, "ctx-r");
    ck_assert_int_eq(lbt_daemon_stop(&d), 0);
}
END_TEST

START_TEST(test_paused_sandbox_is_409)
{
    char cid[64], path[256];
    struct lbt_resp r;

    LBT_SKIP_ON_ENGINE("the engine providers have no PTY sessions, so no contexts (501)");
    ctx_create(&D, SBX, OP, cid, sizeof(cid));
    ctx_run_expect(&D, cid, "p = 'kept'", "", "", NULL, NULL);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pause", SBX);
    lbt_json(&D, "POST", path, OP, "{}", &r);
    ck_assert_msg(r.status == 200, "pause: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    /* a frozen interpreter cannot answer: refused at once, not after the timeout */
    ctx_run(&D, cid, OP, "p", 0, &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/resume", SBX);
    lbt_json(&D, "POST", path, OP, "{}", &r);
    ck_assert_msg(r.status == 200, "resume: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    ctx_run_expect(&D, cid, "p", "", "", "'kept'", NULL);
    ctx_call(&D, "DELETE", cid, NULL, OP, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
}
END_TEST

START_TEST(test_no_python_is_422)
{
    char sbx[128], op[256], path[256];
    json_t *lease;
    struct lbt_resp r;

    LBT_SKIP_ON_ENGINE("the engine providers have no PTY sessions, so no contexts (501)");
    /* a sandbox whose PATH finds no python3 stands for an image without one */
    lease = lbt_seed(&D, "ctx-4", "task-ctx", "\"env\": {\"PATH\": \"/nonexistent\"}");
    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    snprintf(op, sizeof(op), "%s",
             json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/contexts", sbx);
    lbt_json(&D, "POST", path, op, "{}", &r);
    lbt_assert_error(&r, 422, "unenforceable");
    ck_assert_ptr_nonnull(
        strstr(json_string_value(json_object_get(json_object_get(r.json, "error"), "message")),
               "python3"));
    lbt_resp_free(&r);
    ck_assert_int_eq(count_drivers_of_uid(lbt_sandbox_uid(&D, sbx)), 0);
    lbt_release_session(&D, "ctx-4");
}
END_TEST

START_TEST(test_engines_501)
{
    char path[256];
    struct lbt_resp r;

    if (!lbt_variant_engine()) {
        lbt_skip_note(__func__, "only the engine variants lack contexts");
        return;
    }
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/contexts", SBX);
    lbt_json(&D, "POST", path, OP, "{\"language\": \"python\"}", &r);
    lbt_assert_error(&r, 501, "not_implemented");
    lbt_resp_free(&r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("contexts");
    TCase *tc = tcase_create("contexts");

    lbt_fixture_add(tc, &(struct lbt_fixture){.d = &D, .seed = seed, .stop_clean = true}, true);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_engines_501);
    tcase_add_test(tc, test_state_output_and_exceptions);
    tcase_add_test(tc, test_timeout_interrupt_and_busy);
    tcase_add_test(tc, test_tokens_ids_and_delete);
    tcase_add_test(tc, test_reset_and_release_end_the_driver);
    tcase_add_test(tc, test_no_python_is_422);
    tcase_add_test(tc, test_paused_sandbox_is_409);
    suite_add_tcase(s, tc);
    tc = tcase_create("restart");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_daemon_restarts_keep_the_interpreter);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
