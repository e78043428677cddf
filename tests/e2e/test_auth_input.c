/*
 * test_auth_input.c - acceptance: bearer tokens (none, wrong, operate token scope), bad input
 * of every kind (malformed JSON, unknown fields, invalid ids, bad timeouts, bodies over the
 * limit with and without Content-Length, unknown routes, wrong methods): each gets its JSON
 * error, changes no record, and leaves the daemon serving. X-Request-Id on every response.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

static struct lbt_daemon D;
static char SBX_A[128], SBX_B[128], OP_A[256];

static void seed_two(void)
{
    json_t *a = lbt_seed(&D, "auth-a", "task-a", NULL), *b = lbt_seed(&D, "auth-b", "task-b", NULL);

    snprintf(SBX_A, sizeof(SBX_A), "%s", json_string_value(json_object_get(a, "sandbox_id")));
    snprintf(SBX_B, sizeof(SBX_B), "%s", json_string_value(json_object_get(b, "sandbox_id")));
    snprintf(OP_A, sizeof(OP_A), "%s",
             json_string_value(json_object_get(json_object_get(a, "access"), "token")));
    ck_assert_str_ne(SBX_A, SBX_B);
    ck_assert(OP_A[0]);
    json_decref(a);
    json_decref(b);
}

static const char *const LIMITS_ARGS[] = {"--set", "limits.max_body_bytes=2048", NULL};

#define path_of(buf, size, fmt, id) snprintf(buf, size, fmt, id)

/* ---------- auth ---------- */

START_TEST(test_no_token)
{
    struct lbt_resp r;
    char p[300];

    lbt_json(&D, "GET", "/v1/sessions", NULL, NULL, &r);
    lbt_assert_error(&r, 401, "unauthorized");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/auth-c/seed", NULL, "{\"task_id\": \"t\"}", &r);
    lbt_assert_error(&r, 401, "unauthorized");
    lbt_resp_free(&r);
    lbt_exec(&D, SBX_A, NULL, "{\"command\": \"true\"}", &r);
    lbt_assert_error(&r, 401, "unauthorized");
    lbt_resp_free(&r);
    lbt_file_get(&D, SBX_A, NULL, "/workspace/x", &r);
    lbt_assert_error(&r, 401, "unauthorized");
    lbt_resp_free(&r);
    path_of(p, sizeof(p), "/v1/sandboxes/%s", SBX_A);
    lbt_json(&D, "GET", p, NULL, NULL, &r);
    lbt_assert_error(&r, 401, "unauthorized");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/auth-a/release", NULL, NULL, &r);
    lbt_assert_error(&r, 401, "unauthorized");
    lbt_resp_free(&r);
    /* a scheme other than Bearer is no token either */
    static const char *const basic[] = {"Authorization: Basic YWRtaW46YWRtaW4=", NULL};
    lbt_request_ex(&D, "GET", "/v1/sessions", NULL, NULL, 0, NULL, basic, false, &r);
    lbt_assert_error(&r, 401, "unauthorized");
    lbt_resp_free(&r);
    /* nothing happened */
    lbt_json(&D, "GET", "/v1/sessions/auth-c", "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/sessions/auth-a", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
}
END_TEST

START_TEST(test_wrong_token)
{
    static const char *const wrong[] = {
        "nope", "lbo_0000000000000000000000000000000000000000000000000000000000000000", NULL};
    struct lbt_resp r;
    char admin_like[300];

    for (int i = 0; wrong[i]; i++) {
        lbt_json(&D, "GET", "/v1/sessions", wrong[i], NULL, &r);
        lbt_assert_error(&r, 401, "unauthorized");
        lbt_resp_free(&r);
        lbt_exec(&D, SBX_A, wrong[i], "{\"command\": \"true\"}", &r);
        lbt_assert_error(&r, 401, "unauthorized");
        lbt_resp_free(&r);
    }
    /* the admin token with one character changed */
    snprintf(admin_like, sizeof(admin_like), "%s", D.admin_token);
    admin_like[0] = admin_like[0] == 'a' ? 'b' : 'a';
    lbt_json(&D, "GET", "/v1/sessions", admin_like, NULL, &r);
    lbt_assert_error(&r, 401, "unauthorized");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/auth-a/release", admin_like, NULL, &r);
    lbt_assert_error(&r, 401, "unauthorized");
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/sessions/auth-a", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
}
END_TEST

START_TEST(test_operate_token_own_sandbox)
{
    struct lbt_resp r;
    json_t *res;
    char p[300];

    res = lbt_exec_ok(&D, SBX_A, OP_A, "{\"command\": \"echo op\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "op\n");
    json_decref(res);
    lbt_file_put(&D, SBX_A, OP_A, "/workspace/op.txt", NULL, "by op\n", 6, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
    lbt_file_get(&D, SBX_A, OP_A, "/workspace/op.txt", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(r.len, 6);
    ck_assert(memcmp(r.body, "by op\n", 6) == 0);
    lbt_resp_free(&r);
    path_of(p, sizeof(p), "/v1/sandboxes/%s", SBX_A);
    lbt_json(&D, "GET", p, OP_A, NULL, &r);
    ck_assert_msg(r.status == 200, "status: %ld %s", r.status, r.body);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "sandbox_id")), SBX_A);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "status")), "running");
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "state")), "lent");
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "resources_session_id")), "auth-a");
    lbt_resp_free(&r);
}
END_TEST

START_TEST(test_operate_token_other_sandbox)
{
    struct lbt_resp r;
    char p[300];

    lbt_exec(&D, SBX_B, OP_A, "{\"command\": \"echo x > /workspace/from-a\"}", &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    lbt_file_put(&D, SBX_B, OP_A, "/workspace/from-a-put", NULL, "x", 1, &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    lbt_file_get(&D, SBX_B, OP_A, "/etc/hostname", &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    path_of(p, sizeof(p), "/v1/sandboxes/%s", SBX_B);
    lbt_json(&D, "GET", p, OP_A, NULL, &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    /* none of it happened in B */
    lbt_file_get(&D, SBX_B, "", "/workspace/from-a", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    lbt_file_get(&D, SBX_B, "", "/workspace/from-a-put", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
}
END_TEST

START_TEST(test_operate_token_admin_routes)
{
    struct lbt_resp r;
    char p[300];

    lbt_json(&D, "POST", "/v1/sessions/auth-a/release", OP_A, NULL, &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    path_of(p, sizeof(p), "/v1/sandboxes/%s", SBX_A);
    lbt_json(&D, "DELETE", p, OP_A, NULL, &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/auth-a/seed", OP_A, "{\"task_id\": \"task-a\"}", &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/auth-c/seed", OP_A, "{\"task_id\": \"task-c\"}", &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/sessions", OP_A, NULL, &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/sandboxes", OP_A, NULL, &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    /* A is still lent and works; auth-c was not seeded */
    lbt_json(&D, "GET", "/v1/sessions/auth-a", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "sandbox_id")), SBX_A);
    lbt_resp_free(&r);
    json_decref(lbt_exec_ok(&D, SBX_A, OP_A, "{\"command\": \"true\"}"));
    lbt_json(&D, "GET", "/v1/sessions/auth-c", "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
}
END_TEST

/* ---------- bad input ---------- */

/* The records before a bad request, to compare with afterwards. */
static json_t *snapshot(void)
{
    return lbt_list_sandboxes(&D);
}

static void assert_unchanged(json_t *before)
{
    json_t *after = lbt_list_sandboxes(&D);

    ck_assert_msg(json_equal(before, after), "the records changed");
    json_decref(after);
    json_decref(before);
    lbt_assert_healthy(&D);
}

/* One bad JSON request: expect the error, then no change and a healthy daemon. */
static void bad(const char *method, const char *path, const char *body, long status,
                const char *code)
{
    json_t *before = snapshot();
    struct lbt_resp r;

    lbt_json(&D, method, path, "", body, &r);
    lbt_assert_error(&r, status, code);
    lbt_resp_free(&r);
    assert_unchanged(before);
}

START_TEST(test_malformed_json)
{
    char p[300];

    bad("POST", "/v1/sessions/in-x/seed", "{\"task_id\": \"t\",", 400, "bad_request");
    bad("POST", "/v1/sessions/in-x/seed", "{\"task_id\": \"t\"} trailing", 400, "bad_request");
    bad("POST", "/v1/sessions/in-x/seed", "[\"task_id\"]", 400, "bad_request");
    bad("POST", "/v1/sessions/in-x/seed", "\"just a string\"", 400, "bad_request");
    bad("POST", "/v1/sessions/in-x/seed", "", 400, "bad_request");
    bad("POST", "/v1/sessions/in-x/seed", "{\"task_id\": \"t\", \"task_id\": \"u\"}", 400,
        "bad_request");
    path_of(p, sizeof(p), "/v1/sandboxes/%s/exec", SBX_A);
    bad("POST", p, "{\"command\": ", 400, "bad_request");
    bad("POST", "/v1/sessions/auth-a/release", "{oops}", 400, "bad_request");
}
END_TEST

START_TEST(test_unknown_fields)
{
    char p[300];
    struct lbt_resp r;

    bad("POST", "/v1/sessions/in-x/seed", "{\"task_id\": \"t\", \"bogus\": 1}", 400, "bad_request");
    bad("POST", "/v1/sessions/in-x/seed",
        "{\"task_id\": \"t\", \"files\": {\"/workspace/a\": {\"base64\": \"eA==\", \"x\": 1}}}",
        400, "bad_request");
    bad("POST", "/v1/sessions/in-x/seed",
        "{\"task_id\": \"t\", \"resources\": {\"cpu\": 1, \"gpus\": 1}}", 400, "bad_request");
    path_of(p, sizeof(p), "/v1/sandboxes/%s/exec", SBX_A);
    bad("POST", p, "{\"command\": \"touch /workspace/must-not-exist\", \"bogus\": true}", 400,
        "bad_request");
    bad("POST", "/v1/sessions/auth-a/release", "{\"force\": true}", 400, "bad_request");
    lbt_file_get(&D, SBX_A, "", "/workspace/must-not-exist", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
}
END_TEST

START_TEST(test_wrong_types_and_values)
{
    char p[300];

    bad("POST", "/v1/sessions/in-x/seed", "{\"task_id\": 5}", 400, "bad_request");
    bad("POST", "/v1/sessions/in-x/seed", "{}", 400, "bad_request");
    bad("POST", "/v1/sessions/in-x/seed", "{\"task_id\": \"t\", \"files\": []}", 400,
        "bad_request");
    bad("POST", "/v1/sessions/in-x/seed", "{\"task_id\": \"t\", \"files\": {\"rel/a\": \"x\"}}",
        400, "bad_request");
    bad("POST", "/v1/sessions/in-x/seed",
        "{\"task_id\": \"t\", \"files\": {\"/workspace/../etc/x\": \"x\"}}", 400, "bad_request");
    bad("POST", "/v1/sessions/in-x/seed", "{\"task_id\": \"t\", \"ttl_s\": -1}", 400,
        "bad_request");
    path_of(p, sizeof(p), "/v1/sandboxes/%s/exec", SBX_A);
    bad("POST", p, "{\"command\": [\"true\"]}", 400, "bad_request");
    bad("POST", p, "{\"command\": \"true\", \"argv\": [\"true\"]}", 400, "bad_request");
    bad("POST", p, "{\"argv\": []}", 400, "bad_request");
    bad("POST", p, "{\"command\": \"true\", \"cwd\": \"relative\"}", 400, "bad_request");
    bad("POST", p, "{\"command\": \"true\", \"encoding\": \"latin1\"}", 400, "bad_request");
}
END_TEST

START_TEST(test_invalid_session_id)
{
    char long_id[200], p[400];
    json_t *lease;
    struct lbt_resp r;

    bad("POST", "/v1/sessions/bad%20id%21/seed", "{\"task_id\": \"t\"}", 400, "bad_request");
    bad("GET", "/v1/sessions/bad%20id%21", NULL, 400, "bad_request");
    bad("POST", "/v1/sessions/bad%20id%21/release", NULL, 400, "bad_request");
    bad("POST", "/v1/sessions/semi%3Bcolon/seed", "{\"task_id\": \"t\"}", 400, "bad_request");
    /* "." and ".." are path segments to HTTP clients: refused as session ids */
    bad("POST", "/v1/sessions/%2e/seed", "{\"task_id\": \"t\"}", 400, "bad_request");
    bad("POST", "/v1/sessions/%2e%2e/seed", "{\"task_id\": \"t\"}", 400, "bad_request");
    bad("POST", "/v1/sessions/%2E%2E/release", NULL, 400, "bad_request");
    memset(long_id, 'a', 129);
    long_id[129] = '\0';
    snprintf(p, sizeof(p), "/v1/sessions/%s/seed", long_id);
    bad("POST", p, "{\"task_id\": \"t\"}", 400, "bad_request");
    /* 128 characters of the allowed set is fine */
    memcpy(long_id, "Ab0._:-", 7);
    long_id[128] = '\0';
    lease = lbt_seed(&D, long_id, "t", NULL);
    ck_assert_str_eq(json_string_value(json_object_get(lease, "resources_session_id")), long_id);
    json_decref(lease);
    snprintf(p, sizeof(p), "/v1/sessions/%s/release", long_id);
    lbt_json(&D, "POST", p, "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert(json_is_true(json_object_get(r.json, "released")));
    lbt_resp_free(&r);
}
END_TEST

START_TEST(test_label_bounds)
{
    char body[4096];
    int n = snprintf(body, sizeof(body), "{\"task_id\": \"t\", \"labels\": {");

    for (int i = 0; i < 65; i++)
        n += snprintf(body + n, sizeof(body) - (size_t)n, "%s\"k%d\": \"v\"", i ? "," : "", i);
    snprintf(body + n, sizeof(body) - (size_t)n, "}}");
    bad("POST", "/v1/sessions/in-labels/seed", body, 400, "bad_request");
    bad("POST", "/v1/sessions/in-labels/seed", "{\"task_id\": \"t\", \"labels\": {\"\": \"v\"}}",
        400, "bad_request");
    n = snprintf(body, sizeof(body), "{\"task_id\": \"t\", \"labels\": {\"k\": \"");
    memset(body + n, 'x', 1025); /* one byte over the bound */
    snprintf(body + n + 1025, sizeof(body) - (size_t)n - 1025, "\"}}");
    bad("POST", "/v1/sessions/in-labels/seed", body, 400, "bad_request");
}
END_TEST

START_TEST(test_timeout_not_positive)
{
    char p[300];
    struct lbt_resp r;

    path_of(p, sizeof(p), "/v1/sandboxes/%s/exec", SBX_A);
    bad("POST", p, "{\"command\": \"touch /workspace/t0\", \"timeout_s\": 0}", 400, "bad_request");
    bad("POST", p, "{\"command\": \"touch /workspace/t0\", \"timeout_s\": -1}", 400, "bad_request");
    bad("POST", p, "{\"command\": \"touch /workspace/t0\", \"timeout_s\": -0.5}", 400,
        "bad_request");
    bad("POST", p, "{\"command\": \"touch /workspace/t0\", \"timeout_s\": \"5\"}", 400,
        "bad_request");
    lbt_file_get(&D, SBX_A, "", "/workspace/t0", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    /* a fractional positive timeout is fine */
    json_decref(lbt_exec_ok(&D, SBX_A, "", "{\"command\": \"true\", \"timeout_s\": 0.5}"));
}
END_TEST

START_TEST(test_unknown_route)
{
    bad("GET", "/v1/nope", NULL, 404, "not_found");
    bad("GET", "/nope", NULL, 404, "not_found");
    bad("GET", "/", NULL, 404, "not_found");
    bad("POST", "/v1/sessions/auth-a/bogus", "{}", 404, "not_found");
    bad("GET", "/v1/sandboxes/x/y/z", NULL, 404, "not_found");
    bad("GET", "/v2/sessions", NULL, 404, "not_found");
    /* and unknown things on known routes */
    bad("GET", "/v1/sessions/in-unknown", NULL, 404, "not_found");
    bad("GET", "/v1/sandboxes/sbx-00000000000000000000000000", NULL, 404, "not_found");
    bad("POST", "/v1/sandboxes/sbx-00000000000000000000000000/exec", "{\"command\": \"true\"}", 404,
        "not_found");
}
END_TEST

START_TEST(test_wrong_method)
{
    char p[300];

    bad("DELETE", "/v1/sessions", NULL, 405, "method_not_allowed");
    bad("GET", "/v1/sessions/auth-a/seed", NULL, 405, "method_not_allowed");
    bad("PUT", "/healthz", "{}", 405, "method_not_allowed");
    bad("PUT", "/v1/sandboxes", "{}", 405, "method_not_allowed"); /* POST creates */
    bad("DELETE", "/v1/sessions/auth-a/release", NULL, 405, "method_not_allowed");
    path_of(p, sizeof(p), "/v1/sandboxes/%s", SBX_A);
    bad("PATCH", p, "{}", 405, "method_not_allowed");
    path_of(p, sizeof(p), "/v1/sandboxes/%s/exec", SBX_A);
    bad("GET", p, NULL, 405, "method_not_allowed");
    path_of(p, sizeof(p), "/v1/sandboxes/%s/files?path=/workspace/x", SBX_A);
    bad("POST", p, "x", 405, "method_not_allowed");
}
END_TEST

/* tmpl with its '@' replaced by sandbox A's id. */
static void with_id(char *out, size_t size, const char *tmpl)
{
    const char *at = strchr(tmpl, '@');

    if (!at)
        snprintf(out, size, "%s", tmpl);
    else
        snprintf(out, size, "%.*s%s%s", (int)(at - tmpl), tmpl, SBX_A, at + 1);
}

/* A URL path or query argument that is not UTF-8 after %-decoding is 400 bad_request naming
 * it, on every route family that takes a name, an id or a path from the URL, with an admin and
 * with an operate token; the answer is JSON (jansson parsed it: valid UTF-8) and echoes none
 * of the invalid bytes. */
START_TEST(test_invalid_utf8_in_url)
{
    static const struct {
        const char *method, *tmpl; /* tmpl: @ is sandbox A's id */
        const char *body, *names;  /* names: what the message must name */
    } cases[] = {
        {"GET", "/v1/sandboxes/@/files?path=/workspace/%FF%FEnope", NULL, "'path'"},
        {"PUT", "/v1/sandboxes/@/files?path=/workspace/%FF%FEnope", "x", "'path'"},
        {"PUT", "/v1/sandboxes/@/files?path=/workspace/ok&owner=%C3%28", "x", "'owner'"},
        {"GET", "/v1/sandboxes/@/files?path=/workspace/a%ED%A0%80b", NULL, "'path'"},
        {"GET", "/v1/sandboxes/@/files?%FF=1&path=/workspace/x", NULL, "name"},
        {"GET", "/v1/sandboxes/@%FF", NULL, "URL path"},
        {"POST", "/v1/sandboxes/@%FF/exec", "{\"command\": \"true\"}", "URL path"},
        {"GET", "/v1/sandboxes/@/endpoints/80%FF", NULL, "URL path"},
        {"POST", "/v1/sandboxes/@%C0%AF/pty", "{}", "URL path"},
        {"GET", "/v1/sessions/auth-a%FF", NULL, "URL path"},
        {"POST", "/v1/sessions/auth-%FE/seed", "{\"task_id\": \"t\"}", "URL path"},
        {"GET", "/v1/sessions/auth-a%FF/activation", NULL, "URL path"},
        {"GET", "/v1/sessions?state=%FF", NULL, "'state'"},
        {"GET", "/v1/sandboxes?state=lent%80", NULL, "'state'"},
        {"GET", "/v1/pty/pty-%FF/output", NULL, "URL path"},
        {"DELETE", "/v1/pty/%FF", NULL, "URL path"},
        {"DELETE", "/v1/images/img%FF", NULL, "URL path"},
        {"POST", "/v1/images?name=img%FF", "x", "'name'"},
        {"GET", "/v1/nope%FF", NULL, "URL path"},
    };
    const char *tokens[] = {"", OP_A};
    struct lbt_resp r;
    char p[512];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        for (size_t t = 0; t < 2; t++) {
            const char *msg;

            with_id(p, sizeof(p), cases[i].tmpl);
            lbt_request_ex(&D, cases[i].method, p, tokens[t], cases[i].body,
                           cases[i].body ? strlen(cases[i].body) : 0, NULL, NULL, false, &r);
            ck_assert_msg(r.status == 400, "%s %s (%s token): %ld %.500s", cases[i].method, p,
                          t ? "operate" : "admin", r.status, r.body);
            lbt_assert_error(&r, 400, "bad_request");
            msg = json_string_value(json_object_get(json_object_get(r.json, "error"), "message"));
            ck_assert_msg(strstr(msg, "not valid UTF-8") && strstr(msg, cases[i].names),
                          "%s %s: %s", cases[i].method, p, msg);
            /* nothing of the request's bytes that are not UTF-8 in the raw body either */
            ck_assert_msg(!strchr(r.body, '\xff') && !strchr(r.body, '\xfe') &&
                              !strchr(r.body, '\x80'),
                          "%s %s: %s", cases[i].method, p, r.body);
            lbt_resp_free(&r);
        }
    }
    /* valid UTF-8 is not refused: a missing file with an accented name is 404 */
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/files?path=/workspace/%%C3%%A9t%%C3%%A9", SBX_A);
    lbt_request_ex(&D, "GET", p, OP_A, NULL, 0, NULL, NULL, false, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    lbt_assert_healthy(&D);
}
END_TEST

/* An error message quoting more than the message's room of multi-byte text is cut between
 * characters: still a JSON error with its status, never 500 "out of memory". */
START_TEST(test_long_utf8_in_message)
{
    char p[8192], comp[400];
    size_t n = 0;
    struct lbt_resp r;

    /* 6 directories of 60 x "é" (120 bytes each, %-encoded): the path's bytes pass the 512 of
     * a message, and the cut falls inside one "é" at one offset or the next */
    for (int k = 0; k < 2; k++) {
        n = (size_t)snprintf(p, sizeof(p), "/v1/sandboxes/%s/files?path=/workspace/%s", SBX_A,
                             k ? "x" : "");
        comp[0] = '\0';
        for (int i = 0; i < 60; i++)
            strcat(comp, "%C3%A9");
        for (int d = 0; d < 6; d++)
            n += (size_t)snprintf(p + n, sizeof(p) - n, "%s%s", d ? "/" : "", comp);
        lbt_request_ex(&D, "GET", p, OP_A, NULL, 0, NULL, NULL, false, &r);
        ck_assert_msg(r.status == 404, "%ld %.600s", r.status, r.body);
        lbt_assert_error(&r, 404, "not_found");
        lbt_resp_free(&r);
    }
}
END_TEST

START_TEST(test_request_id)
{
    static const char *const ids[] = {"X-Request-Id: lbt-echo-1", NULL};
    static const struct {
        const char *method, *path, *token, *body;
        long status;
    } cases[] = {
        {"GET", "/healthz", NULL, NULL, 200},
        {"GET", "/readyz", NULL, NULL, 200},
        {"GET", "/metrics", NULL, NULL, 200},
        {"GET", "/v1/sessions", "", NULL, 200},
        {"GET", "/v1/sessions/auth-a", "", NULL, 200},
        {"POST", "/v1/sessions/auth-a/seed", "", "{\"task_id\": \"task-a\"}", 200},
        {"GET", "/v1/sessions", NULL, NULL, 401},
        {"GET", "/v1/nope", "", NULL, 404},
        {"DELETE", "/v1/sessions", "", NULL, 405},
        {"POST", "/v1/sessions/in-x/seed", "", "{", 400},
        {"POST", "/v1/sessions/auth-a/seed", "", "{\"task_id\": \"other\"}", 409},
        {"POST", "/v1/sessions/auth-none/execute", "", "{\"argv\": [\"true\"]}", 404},
    };
    struct lbt_resp r, r2;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        lbt_request_ex(&D, cases[i].method, cases[i].path, cases[i].token, cases[i].body,
                       cases[i].body ? strlen(cases[i].body) : 0, NULL, ids, false, &r);
        ck_assert_msg(r.status == cases[i].status, "%s %s: %ld", cases[i].method, cases[i].path,
                      r.status);
        lbt_assert_request_id(&r, "lbt-echo-1");
        lbt_resp_free(&r);
        /* without one, the daemon makes one, different each time */
        lbt_request_ex(&D, cases[i].method, cases[i].path, cases[i].token, cases[i].body,
                       cases[i].body ? strlen(cases[i].body) : 0, NULL, NULL, false, &r);
        lbt_request_ex(&D, cases[i].method, cases[i].path, cases[i].token, cases[i].body,
                       cases[i].body ? strlen(cases[i].body) : 0, NULL, NULL, false, &r2);
        lbt_assert_request_id(&r, NULL);
        lbt_assert_request_id(&r2, NULL);
        ck_assert_str_ne(r.request_id, r2.request_id);
        ck_assert_str_ne(r.request_id, "lbt-echo-1");
        lbt_resp_free(&r);
        lbt_resp_free(&r2);
    }
    /* an exec's response and a file download carry it too */
    lbt_request_ex(&D, "GET", "/healthz", NULL, NULL, 0, NULL, ids, false, &r);
    lbt_resp_free(&r);
    char p[300];
    path_of(p, sizeof(p), "/v1/sandboxes/%s/exec", SBX_A);
    lbt_request_ex(&D, "POST", p, "", "{\"command\": \"true\"}", 19, NULL, ids, false, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_assert_request_id(&r, "lbt-echo-1");
    lbt_resp_free(&r);
    path_of(p, sizeof(p), "/v1/sandboxes/%s/files?path=/etc/hostname", SBX_A);
    lbt_request_ex(&D, "GET", p, "", NULL, 0, NULL, ids, false, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_assert_request_id(&r, "lbt-echo-1");
    lbt_resp_free(&r);
}
END_TEST

/* ---------- the front end's own errors ---------- */

/* Send raw bytes to the daemon and read its answer until it closes the connection (or 10 s):
 * the status of the first response line, the whole answer in out. */
static long raw_exchange(const void *req, size_t len, char *out, size_t out_len)
{
    struct sockaddr_in dst = {.sin_family = AF_INET};
    const char *hostport = D.base_url + strlen("http://");
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    size_t got = 0;
    long status = 0;

    ck_assert_int_ge(fd, 0);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    dst.sin_port = htons((uint16_t)atoi(strrchr(hostport, ':') + 1));
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&dst, sizeof(dst)), 0);
    for (size_t off = 0; off < len;) {
        ssize_t n = send(fd, (const char *)req + off, len - off, MSG_NOSIGNAL);

        if (n <= 0)
            break; /* the daemon may answer and close before it read everything */
        off += (size_t)n;
    }
    shutdown(fd, SHUT_WR);
    for (double end = lbt_now() + 10; got + 1 < out_len && lbt_now() < end;) {
        struct pollfd p = {fd, POLLIN, 0};
        ssize_t n;

        if (poll(&p, 1, 200) <= 0)
            continue;
        n = recv(fd, out + got, out_len - 1 - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    out[got] = '\0';
    close(fd);
    sscanf(out, "HTTP/1.%*d %ld", &status);
    return status;
}

/* A request target or head larger than the front end's bounds (16 KiB, 24 KiB) but within
 * libmicrohttpd's buffer gets a JSON error with X-Request-Id; the answers libmicrohttpd makes
 * itself (a head past its buffer, an HTTP version it does not speak, a malformed chunk) have
 * the exact status docs/api.md lists for them. The daemon keeps serving. */
START_TEST(test_front_end_errors)
{
    static char big[64 * 1024], out[16 * 1024];
    const char *hdrs[2] = {NULL, NULL};
    struct lbt_resp r;
    char *pad;
    const char *msg;

    /* 414: a 17000-byte target */
    memcpy(big, "/healthz?pad=", 13);
    memset(big + 13, 'a', 17000 - 13);
    big[17000] = '\0';
    lbt_request(&D, "GET", big, NULL, NULL, 0, NULL, &r);
    lbt_assert_error(&r, 414, "uri_too_long");
    msg = json_string_value(json_object_get(json_object_get(r.json, "error"), "message"));
    ck_assert_str_eq(msg, "the request target (path and query) is 17000 bytes; the limit is 16384");
    lbt_resp_free(&r);
    /* the same on a route with a token and a body: the bound comes first */
    {
        char p[17300];

        snprintf(p, sizeof(p), "/v1/sandboxes/%s/exec?%.16990s", SBX_A, big + 9);
        lbt_request_ex(&D, "POST", p, "", "{}", 2, NULL, NULL, false, &r);
        lbt_assert_error(&r, 414, "uri_too_long");
        lbt_resp_free(&r);
    }
    /* 431: a 25000-byte header */
    pad = malloc(25100);
    ck_assert_ptr_nonnull(pad);
    memcpy(pad, "X-Pad: ", 7);
    memset(pad + 7, 'b', 25000);
    pad[25007] = '\0';
    hdrs[0] = pad;
    lbt_request_ex(&D, "GET", "/healthz", NULL, NULL, 0, NULL, hdrs, false, &r);
    lbt_assert_error(&r, 431, "headers_too_large");
    msg = json_string_value(json_object_get(json_object_get(r.json, "error"), "message"));
    ck_assert_msg(strstr(msg, "the limit is 24576"), "%s", msg);
    lbt_resp_free(&r);
    free(pad);
    /* at the bounds: served */
    memset(big + 13, 'a', 16384 - 13);
    big[16384] = '\0';
    lbt_request(&D, "GET", big, NULL, NULL, 0, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);

    /* libmicrohttpd's own answers (documented exceptions: not JSON, no X-Request-Id) */
    {
        size_t n = (size_t)snprintf(big, sizeof(big), "GET /healthz?pad=");

        memset(big + n, 'c', 40000);
        n += 40000;
        n += (size_t)snprintf(big + n, sizeof(big) - n, " HTTP/1.1\r\nHost: x\r\n\r\n");
        ck_assert_int_eq(raw_exchange(big, n, out, sizeof(out)), 414);
        n = (size_t)snprintf(big, sizeof(big), "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: ");
        memset(big + n, 'd', 40000);
        n += 40000;
        n += (size_t)snprintf(big + n, sizeof(big) - n, "\r\n\r\n");
        ck_assert_int_eq(raw_exchange(big, n, out, sizeof(out)), 431);
    }
    snprintf(big, sizeof(big), "GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n");
    ck_assert_int_eq(raw_exchange(big, strlen(big), out, sizeof(out)), 505);
    snprintf(big, sizeof(big), "GET /healthz HTTP/0.9\r\nHost: x\r\n\r\n");
    ck_assert_int_eq(raw_exchange(big, strlen(big), out, sizeof(out)), 505);
    snprintf(big, sizeof(big),
             "POST /v1/sessions/auth-a/seed HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
             "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
             "zz\r\n{}\r\n0\r\n\r\n",
             D.admin_token);
    ck_assert_int_eq(raw_exchange(big, strlen(big), out, sizeof(out)), 400);
    lbt_assert_healthy(&D);
}
END_TEST

/* ---------- body limit (daemon with limits.max_body_bytes=2048) ---------- */

/* A valid seed body of exactly len bytes. */
static char *seed_body(size_t len)
{
    const char *head = "{\"task_id\": \"t\", \"labels\": {\"pad\": \"", *tail = "\"}}";
    char *b = malloc(len + 1);
    size_t h = strlen(head), t = strlen(tail);

    ck_assert_uint_gt(len, h + t);
    memcpy(b, head, h);
    memset(b + h, 'p', len - h - t);
    memcpy(b + len - t, tail, t);
    b[len] = '\0';
    return b;
}

/* A valid exec body of exactly len bytes. */
static char *exec_body(size_t len)
{
    const char *head = "{\"command\": \"true\", \"env\": {\"PAD\": \"", *tail = "\"}}";
    char *b = malloc(len + 1);
    size_t h = strlen(head), t = strlen(tail);

    memcpy(b, head, h);
    memset(b + h, 'p', len - h - t);
    memcpy(b + len - t, tail, t);
    b[len] = '\0';
    return b;
}

static void too_large(const char *path, const char *body, bool chunked)
{
    static const char *const ids[] = {"X-Request-Id: lbt-413", NULL};
    json_t *before = snapshot();
    struct lbt_resp r;

    lbt_request_ex(&D, "POST", path, "", body, strlen(body), NULL, ids, chunked, &r);
    lbt_assert_error(&r, 413, "payload_too_large");
    lbt_assert_request_id(&r, "lbt-413");
    lbt_resp_free(&r);
    assert_unchanged(before);
}

START_TEST(test_body_limit_content_length)
{
    char *body = seed_body(4096), p[300];
    struct lbt_resp r;

    too_large("/v1/sessions/in-big/seed", body, false);
    free(body);
    body = seed_body(2049);
    too_large("/v1/sessions/in-big/seed", body, false);
    free(body);
    path_of(p, sizeof(p), "/v1/sandboxes/%s/exec", SBX_A);
    body = exec_body(100000);
    too_large(p, body, false);
    free(body);
    lbt_json(&D, "GET", "/v1/sessions/in-big", "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    /* exactly at the limit is accepted */
    body = exec_body(2048);
    json_decref(lbt_exec_ok(&D, SBX_A, "", body));
    free(body);
}
END_TEST

START_TEST(test_body_limit_chunked)
{
    char *body = seed_body(4096), p[300];
    struct lbt_resp r;

    too_large("/v1/sessions/in-big/seed", body, true);
    free(body);
    body = seed_body(2049);
    too_large("/v1/sessions/in-big/seed", body, true);
    free(body);
    path_of(p, sizeof(p), "/v1/sandboxes/%s/exec", SBX_A);
    body = exec_body(100000);
    too_large(p, body, true);
    free(body);
    lbt_json(&D, "GET", "/v1/sessions/in-big", "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    /* a chunked body within the limit is read and used */
    body = exec_body(2048);
    lbt_request_ex(&D, "POST", p, "", body, strlen(body), NULL, NULL, true, &r);
    ck_assert_msg(r.status == 200, "chunked exec: %ld %s", r.status, r.body);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "return_code")), 0);
    lbt_resp_free(&r);
    free(body);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("auth_input");
    TCase *auth = tcase_create("auth"), *input = tcase_create("input");
    TCase *limits = tcase_create("limits");

    lbt_fixture_add(auth, &(struct lbt_fixture){.d = &D, .seed = seed_two}, true);
    tcase_set_timeout(auth, 120);
    tcase_add_test(auth, test_no_token);
    tcase_add_test(auth, test_wrong_token);
    tcase_add_test(auth, test_operate_token_own_sandbox);
    tcase_add_test(auth, test_operate_token_other_sandbox);
    tcase_add_test(auth, test_operate_token_admin_routes);
    /* the bad-input cases get a daemon of their own, set up the same way */
    tcase_add_test(input, test_malformed_json);
    tcase_add_test(input, test_unknown_fields);
    tcase_add_test(input, test_wrong_types_and_values);
    tcase_add_test(input, test_invalid_session_id);
    tcase_add_test(input, test_label_bounds);
    tcase_add_test(input, test_timeout_not_positive);
    tcase_add_test(input, test_unknown_route);
    tcase_add_test(input, test_wrong_method);
    tcase_add_test(input, test_request_id);
    tcase_add_test(input, test_invalid_utf8_in_url);
    tcase_add_test(input, test_long_utf8_in_message);
    tcase_add_test(input, test_front_end_errors);
    lbt_fixture_add(input, &(struct lbt_fixture){.d = &D, .seed = seed_two}, true);
    tcase_set_timeout(input, 120);
    lbt_fixture_add(limits, &(struct lbt_fixture){.d = &D, .args = LIMITS_ARGS, .seed = seed_two},
                    true);
    tcase_set_timeout(limits, 120);
    tcase_add_test(limits, test_body_limit_content_length);
    tcase_add_test(limits, test_body_limit_chunked);
    suite_add_tcase(s, auth);
    suite_add_tcase(s, input);
    suite_add_tcase(s, limits);
    return lbt_run_suite(s);
}
