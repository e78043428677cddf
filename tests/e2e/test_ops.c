/*
 * test_ops.c - acceptance: /healthz, /readyz, /metrics (Prometheus text, sandbox gauges and
 * seed counters that follow what happens), and the PTY routes for an unknown sandbox or
 * session.
 */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static struct lbt_daemon D;

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

/* Does name end with suffix? */
static bool ends_with(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);

    return n >= k && !strcmp(name + n - k, suffix);
}

/* Prometheus' naming rules, as promtool check metrics applies them: every family has HELP and
 * TYPE, names are snake_case, counters end in _total (and nothing else does), units are base
 * units spelled out (durations in _seconds, no _ms), histograms are durations in seconds with
 * increasing numeric le bounds ending in +Inf, and every sample belongs to a declared family. */
static void assert_promtool_rules(const char *text)
{
    static const char *const bad_units[] = {
        "ms",      "msec",  "millis", "milliseconds", "us",  "usec", "micros", "microseconds",
        "ns",      "nsec",  "nanos",  "nanoseconds",  "sec", "secs", "min",    "mins",
        "minutes", "hours", "kb",     "mb",           "kib", "mib",  "gib",    "kilobytes"};
    char families[64][128], types[64][16];
    int nfam = 0, helps = 0, samples = 0;
    double last_le = -1;
    char *copy = strdup(text), *save = NULL;

    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[128], type[16];

        if (sscanf(line, "# TYPE %127s %15s", name, type) == 2) {
            ck_assert_int_lt(nfam, 64);
            for (const char *p = name; *p; p++)
                ck_assert_msg(islower((unsigned char)*p) || isdigit((unsigned char)*p) || *p == '_',
                              "not snake_case: %s", name);
            ck_assert_msg(!strcmp(type, "counter") == ends_with(name, "_total"),
                          "%s %s: counters and only counters end in _total", type, name);
            if (!strcmp(type, "histogram"))
                ck_assert_msg(ends_with(name, "_seconds"), "histogram %s is not in seconds", name);
            else
                ck_assert_msg(!ends_with(name, "_bucket") && !ends_with(name, "_sum") &&
                                  !ends_with(name, "_count"),
                              "%s %s has a histogram suffix", type, name);
            char tmp[130], *tsave = NULL;

            snprintf(tmp, sizeof(tmp), "%s", name);
            for (char *w = strtok_r(tmp, "_", &tsave); w; w = strtok_r(NULL, "_", &tsave))
                for (size_t i = 0; i < sizeof(bad_units) / sizeof(bad_units[0]); i++)
                    ck_assert_msg(strcmp(w, bad_units[i]) != 0,
                                  "%s: abbreviated or non-base unit '%s'", name, w);
            snprintf(families[nfam], sizeof(families[nfam]), "%s", name);
            snprintf(types[nfam++], sizeof(types[0]), "%s", type);
            continue;
        }
        if (sscanf(line, "# HELP %127s", name) == 1) {
            helps++;
            continue;
        }
        /* a sample: its family is declared, by name or as a histogram's _bucket/_sum/_count */
        size_t len = strcspn(line, "{ ");
        bool found = false;

        ck_assert_uint_lt(len, sizeof(name));
        memcpy(name, line, len);
        name[len] = '\0';
        for (int f = 0; f < nfam && !found; f++) {
            size_t fl = strlen(families[f]);

            if (!strcmp(name, families[f]))
                found = strcmp(types[f], "histogram") != 0;
            else if (!strcmp(types[f], "histogram") && !strncmp(name, families[f], fl) &&
                     (!strcmp(name + fl, "_bucket") || !strcmp(name + fl, "_sum") ||
                      !strcmp(name + fl, "_count")))
                found = true;
        }
        ck_assert_msg(found, "sample of an undeclared family (or without TYPE first): %s", line);
        if (ends_with(name, "_bucket")) {
            const char *le = strstr(line, "le=\"");

            ck_assert_msg(le != NULL, "bucket without le: %s", line);
            if (!strncmp(le + 4, "+Inf\"", 5)) {
                last_le = -1;
            } else {
                char *end;
                double v = strtod(le + 4, &end);

                ck_assert_msg(end != le + 4 && *end == '"', "le is not a number: %s", line);
                ck_assert_msg(v > last_le, "le bounds do not increase: %s", line);
                last_le = v;
            }
        }
        samples++;
    }
    ck_assert_int_eq(helps, nfam);
    ck_assert_int_gt(samples, nfam);
    free(copy);
}

START_TEST(test_metrics_names_follow_prometheus_rules)
{
    struct lbt_resp r;
    json_t *lease;
    char *text;

    /* a seed and a release, so every histogram route has samples to check */
    lease = lbt_seed(&D, "ops-names", "task-n", NULL);
    json_decref(lease);
    lbt_json(&D, "POST", "/v1/sessions/ops-names/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    text = get_metrics();
    assert_promtool_rules(text);
    ck_assert_msg(strstr(text, "# TYPE lendbox_sweep_last_duration_seconds gauge") != NULL, "%s",
                  text);
    ck_assert_msg(strstr(text, "# TYPE lendbox_shutdown_sweep_duration_seconds gauge") != NULL,
                  "%s", text);
    ck_assert_msg(strstr(text, "_ms") == NULL, "a metric in milliseconds: %s", text);
    ck_assert_msg(strstr(text, "le=\"0.001\"") != NULL, "histogram buckets not in seconds: %s",
                  text);
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

/* The PTY and code-context routes (test_pty.c, test_contexts.c): for an unknown sandbox,
 * session or context each answers a JSON 404 and changes nothing. */
START_TEST(test_pty_routes_unknown)
{
    static const struct {
        const char *method, *path, *body;
    } routes[] = {
        {"POST", "/v1/sandboxes/sbx-00000000000000000000000000/pty",
         "{\"rows\": 24, \"cols\": 80, \"pty\": true}"},
        {"GET", "/v1/pty/pty-1/output?since=0&wait_ms=10", NULL},
        {"POST", "/v1/pty/pty-1/input", "ls\n"},
        {"POST", "/v1/pty/pty-1/resize", "{\"rows\": 30, \"cols\": 100}"},
        {"POST", "/v1/pty/pty-1/signal", "{\"signal\": \"INT\"}"},
        {"POST", "/v1/pty/pty-1/attach", "{\"takeover\": false}"},
        {"GET", "/v1/pty/pty-1/wait?timeout_ms=10", NULL},
        {"DELETE", "/v1/pty/pty-1", NULL},
        /* code contexts are held like PTY sessions: the same */
        {"POST", "/v1/sandboxes/sbx-00000000000000000000000000/contexts",
         "{\"language\": \"python\"}"},
        {"POST", "/v1/contexts/ctx-1/run", "{\"code\": \"1\"}"},
        {"POST", "/v1/contexts/ctx-0123456789abcdef/interrupt", "{}"},
        {"DELETE", "/v1/contexts/ctx-1", NULL},
    };
    json_t *before = lbt_list_sandboxes(&D), *after;

    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        struct lbt_resp r;

        lbt_json(&D, routes[i].method, routes[i].path, "", routes[i].body, &r);
        ck_assert_msg(r.status == 404, "%s %s: %ld %s", routes[i].method, routes[i].path, r.status,
                      r.body);
        lbt_assert_error(&r, 404, "not_found");
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

    lbt_shared_daemon(tc, &D, NULL);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_healthz_readyz);
    tcase_add_test(tc, test_metrics_text);
    tcase_add_test(tc, test_metrics_names_follow_prometheus_rules);
    tcase_add_test(tc, test_pty_routes_unknown);
    tcase_add_test(tc, test_metrics_follow_seeds);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
