/*
 * test_ops.c - acceptance: /healthz, /readyz, /metrics (Prometheus text, sandbox gauges and
 * seed counters that follow what happens), and the contract's routes that are not built yet
 * (501 not_implemented).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static struct lbt_daemon D;

static void setup(void)
{
    lbt_daemon_start(&D, NULL);
}

static void teardown(void)
{
    lbt_daemon_cleanup(&D);
}

START_TEST(test_healthz_readyz)
{
    struct lbt_resp r;
    json_t *want = json_pack("{s:s}", "status", "ok");

    lbt_json(&D, "GET", "/healthz", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_msg(json_equal(r.json, want), "/healthz: %s", r.body);
    ck_assert(strstr(r.headers, "application/json") != NULL);
    lbt_assert_request_id(&r, NULL);
    lbt_resp_free(&r);
    json_decref(want);
    /* with a token too (and a wrong one: these need none) */
    lbt_json(&D, "GET", "/healthz", "wrong-token", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/readyz", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert(json_is_object(r.json));
    lbt_assert_request_id(&r, NULL);
    lbt_resp_free(&r);
}
END_TEST

/* Check the Prometheus text exposition format line by line. */
static void assert_prometheus(const char *text)
{
    const char *line = text;
    int samples = 0;

    ck_assert_msg(*text, "empty metrics");
    ck_assert_msg(text[strlen(text) - 1] == '\n', "metrics do not end in a newline");
    while (*line) {
        const char *end = strchr(line, '\n'), *p = line;
        char buf[1024];
        size_t n = (size_t)(end - line);

        ck_assert_uint_lt(n, sizeof(buf));
        memcpy(buf, line, n);
        buf[n] = '\0';
        if (!strncmp(buf, "# HELP ", 7) || !strncmp(buf, "# TYPE ", 7)) {
            line = end + 1;
            continue;
        }
        ck_assert_msg(buf[0] != '#' && buf[0] != '\0', "bad line: '%s'", buf);
        p = buf;
        ck_assert_msg(isalpha((unsigned char)*p) || *p == '_' || *p == ':', "bad name: %s", buf);
        while (isalnum((unsigned char)*p) || *p == '_' || *p == ':')
            p++;
        if (*p == '{') {
            const char *close = strchr(p, '}');

            ck_assert_msg(close != NULL, "unclosed labels: %s", buf);
            p = close + 1;
        }
        ck_assert_msg(*p == ' ', "no value: %s", buf);
        char *num_end;
        strtod(p + 1, &num_end);
        ck_assert_msg(num_end != p + 1 && *num_end == '\0', "bad value: %s", buf);
        samples++;
        line = end + 1;
    }
    ck_assert_int_gt(samples, 5);
}

/* The value of the sample whose name and labels are exactly series, or -1. */
static double metric(const char *text, const char *series)
{
    size_t n = strlen(series);

    for (const char *line = text; line && *line;
         line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        if (!strncmp(line, series, n) && line[n] == ' ')
            return strtod(line + n + 1, NULL);
    }
    return -1;
}

static char *get_metrics(void)
{
    struct lbt_resp r;
    char *text;

    lbt_json(&D, "GET", "/metrics", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_msg(strstr(r.headers, "Content-Type: text/plain") != NULL ||
                      strstr(r.headers, "content-type: text/plain") != NULL,
                  "headers: %s", r.headers);
    lbt_assert_request_id(&r, NULL);
    text = strdup(r.body);
    lbt_resp_free(&r);
    return text;
}

START_TEST(test_metrics_text)
{
    char *text = get_metrics();

    assert_prometheus(text);
    ck_assert(strstr(text, "lendbox_sandboxes{state=\"lent\"}") != NULL);
    ck_assert(strstr(text, "lendbox_seeds_total") != NULL);
    ck_assert_msg(metric(text, "lendbox_sandboxes{state=\"lent\"}") >= 0, "%s", text);
    free(text);
}
END_TEST

START_TEST(test_metrics_follow_seeds)
{
    char *before = get_metrics(), *during, *after;
    double lent0 = metric(before, "lendbox_sandboxes{state=\"lent\"}");
    double ok0 = metric(before, "lendbox_seeds_total{result=\"ok\"}");
    json_t *lease;
    struct lbt_resp r;

    ck_assert(lent0 >= 0 && ok0 >= 0);
    lease = lbt_seed(&D, "ops-metrics", "task-m", NULL);
    json_decref(lease);
    during = get_metrics();
    ck_assert(metric(during, "lendbox_sandboxes{state=\"lent\"}") == lent0 + 1);
    ck_assert(metric(during, "lendbox_seeds_total{result=\"ok\"}") == ok0 + 1);
    lbt_json(&D, "POST", "/v1/sessions/ops-metrics/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    after = get_metrics();
    ck_assert(metric(after, "lendbox_sandboxes{state=\"lent\"}") == lent0);
    ck_assert(metric(after, "lendbox_seeds_total{result=\"ok\"}") == ok0 + 1);
    free(before);
    free(during);
    free(after);
}
END_TEST

START_TEST(test_not_implemented)
{
    static const struct {
        const char *method, *path, *body;
    } routes[] = {
        {"GET", "/v1/sandboxes/sbx-00000000000000000000000000/endpoints/8080", NULL},
        {"POST", "/v1/sandboxes/sbx-00000000000000000000000000/pty",
         "{\"rows\": 24, \"cols\": 80, \"pty\": true}"},
        {"GET", "/v1/pty/pty-1/output?since=0&wait_ms=10", NULL},
        {"POST", "/v1/pty/pty-1/input", "ls\n"},
        {"POST", "/v1/pty/pty-1/resize", "{\"rows\": 30, \"cols\": 100}"},
        {"POST", "/v1/pty/pty-1/signal", "{\"signal\": \"INT\"}"},
        {"POST", "/v1/pty/pty-1/attach", "{\"takeover\": false}"},
        {"GET", "/v1/pty/pty-1/wait?timeout_ms=10", NULL},
        {"DELETE", "/v1/pty/pty-1", NULL},
    };
    json_t *before = lbt_list_sandboxes(&D), *after;

    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        struct lbt_resp r;

        lbt_json(&D, routes[i].method, routes[i].path, "", routes[i].body, &r);
        ck_assert_msg(r.status == 501, "%s %s: %ld %s", routes[i].method, routes[i].path, r.status,
                      r.body);
        lbt_assert_error(&r, 501, "not_implemented");
        lbt_resp_free(&r);
    }
    after = lbt_list_sandboxes(&D);
    ck_assert(json_equal(before, after));
    json_decref(before);
    json_decref(after);
    lbt_assert_healthy(&D);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("ops");

    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_healthz_readyz);
    tcase_add_test(tc, test_metrics_text);
    tcase_add_test(tc, test_not_implemented);
    tcase_add_test(tc, test_metrics_follow_seeds);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
