/*
 * test_admission.c - admission control of creations (lending.max_starting,
 * lending.max_seed_queue; src/lend/admission.h).
 *
 * overload     max_starting 1, max_seed_queue 2, every create made slow (faults.spec
 *              provider.create=delay): of 8 seeds at once exactly 3 are lent (one creating, two
 *              queued) and 5 answer 429 overloaded with a Retry-After of whole seconds >= 1,
 *              leaving no record; the gauges go back to 0 and the refusals are counted. Then
 *              clients that retry as Retry-After says (times [1, 1.5) of it) get all 8 through.
 * warm         a seed served from the warm pool takes no creation slot: while another class's
 *              seed holds the only one (queue 0), a seed of the pool's class is lent at once;
 *              the next (the pool empty) is refused 429.
 * capacity     the 429 at lending.max_sandboxes carries Retry-After: 1 as well.
 * config       a negative max_starting or max_seed_queue: the daemon refuses to start and says
 *              which key and why.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

#define SEEDS 8
#define CREATE_DELAY "1500"

static struct lbt_daemon D;

/* The value of the daemon's /metrics line for series ("name" or "name{labels}"), -1 if none. */
static double metric(const char *series)
{
    struct lbt_resp r;
    double v = -1;
    const char *p;
    size_t n = strlen(series);

    lbt_request(&D, "GET", "/metrics", NULL, NULL, 0, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    for (p = r.body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            v = strtod(p + n + 1, NULL);
    lbt_resp_free(&r);
    return v;
}

/* Wait (at most 30 s) until series reads want. */
static void wait_metric(const char *series, double want)
{
    double until = lbt_now() + 30;

    while (metric(series) != want) {
        ck_assert_msg(lbt_now() < until, "%s stayed %g, not %g", series, metric(series), want);
        lbt_sleep_ms(20);
    }
}

/* A 429 overloaded answer's Retry-After: whole seconds >= 1 (asserted). */
static long retry_after(const struct lbt_resp *r)
{
    const char *h = strcasestr(r->headers, "\r\nRetry-After: ");
    char *end = NULL;
    long s;

    lbt_assert_error(r, 429, "overloaded");
    ck_assert_msg(h != NULL, "no Retry-After: %s", r->headers);
    h += strlen("\r\nRetry-After: ");
    s = strtol(h, &end, 10);
    ck_assert_msg(end != h && (*end == '\r' || *end == '\n'), "Retry-After not whole seconds: %s",
                  r->headers);
    ck_assert_int_ge(s, 1);
    ck_assert_int_le(s, 60);
    return s;
}

static void seed_path(char *path, size_t size, int i)
{
    snprintf(path, size, "/v1/sessions/adm-%d/seed", i);
}

START_TEST(test_overload_then_retries_get_through)
{
    static const char *const args[] = {"--set", "lending.max_starting=1",
                                       "--set", "lending.max_seed_queue=2",
                                       "--set", "faults.spec=provider.create=delay:" CREATE_DELAY,
                                       NULL};
    struct lbt_async *a[SEEDS];
    bool lent[SEEDS] = {false};
    double next_at[SEEDS], deadline;
    int ok = 0, refused = 0, retried_429 = 0;
    json_t *all;

    lbt_daemon_start(&D, args);
    for (int i = 0; i < SEEDS; i++) {
        char path[64];

        seed_path(path, sizeof(path), i);
        a[i] = lbt_async_json(&D, "POST", path, "", "{\"task_id\": \"t\"}");
    }
    for (int i = 0; i < SEEDS; i++) {
        struct lbt_resp r;

        lbt_async_join(a[i], &r);
        a[i] = NULL;
        if (r.status == 200) {
            lent[i] = true;
            ok++;
        } else {
            long s = retry_after(&r);

            ck_assert_msg(strstr(r.body, "lending.max_starting") &&
                              strstr(r.body, "lending.max_seed_queue"),
                          "%s", r.body);
            next_at[i] = lbt_now() + (double)s * (1.0 + 0.5 * drand48());
            refused++;
        }
        lbt_resp_free(&r);
    }
    ck_assert_int_eq(ok, 3); /* one creating, two queued */
    ck_assert_int_eq(refused, SEEDS - 3);
    /* a refused seed leaves nothing: no record of its session, none starting */
    all = lbt_list_sandboxes(&D);
    for (int i = 0; i < SEEDS; i++) {
        char rsid[32];

        snprintf(rsid, sizeof(rsid), "adm-%d", i);
        ck_assert_int_eq(lbt_count_records_of_session(all, rsid), lent[i] ? 1 : 0);
    }
    ck_assert_int_eq((int)json_array_size(all), 3);
    json_decref(all);
    ck_assert_int_eq(metric("lendbox_seeds_overloaded_total"), SEEDS - 3);
    ck_assert_int_eq(metric("lendbox_seeds_starting"), 0);
    ck_assert_int_eq(metric("lendbox_seed_queue_length"), 0);

    /* clients retrying as Retry-After says, with jitter, all get through */
    deadline = lbt_now() + 120;
    while (ok < SEEDS) {
        ck_assert_msg(lbt_now() < deadline, "%d of %d seeds lent after 120 s", ok, SEEDS);
        for (int i = 0; i < SEEDS; i++) {
            char path[64];
            struct lbt_resp r;

            if (lent[i])
                continue;
            if (!a[i]) {
                if (lbt_now() >= next_at[i]) {
                    seed_path(path, sizeof(path), i);
                    a[i] = lbt_async_json(&D, "POST", path, "", "{\"task_id\": \"t\"}");
                }
                continue;
            }
            if (!lbt_async_done(a[i]))
                continue;
            lbt_async_join(a[i], &r);
            a[i] = NULL;
            if (r.status == 200) {
                lent[i] = true;
                ok++;
            } else {
                next_at[i] = lbt_now() + (double)retry_after(&r) * (1.0 + 0.5 * drand48());
                retried_429++;
            }
            lbt_resp_free(&r);
        }
        lbt_sleep_ms(20);
    }
    all = lbt_list_sandboxes(&D);
    ck_assert_int_eq((int)json_array_size(all), SEEDS);
    json_decref(all);
    ck_assert_int_eq(metric("lendbox_seeds_overloaded_total"), SEEDS - 3 + retried_429);
    for (int i = 0; i < SEEDS; i++) {
        char rsid[32];

        snprintf(rsid, sizeof(rsid), "adm-%d", i);
        lbt_release_session(&D, rsid);
    }
    lbt_assert_healthy(&D);
}
END_TEST

START_TEST(test_warm_seed_takes_no_slot)
{
    static const char *const args[] = {"--set", "lending.max_starting=1",
                                       "--set", "lending.max_seed_queue=0",
                                       "--set", "pool.size=1",
                                       "--set", "faults.spec=provider.create=delay:" CREATE_DELAY,
                                       NULL};
    char warm[1][LBT_ID_MAX];
    double until;
    struct lbt_async *other;
    struct lbt_resp r;
    json_t *lease;

    lbt_daemon_start(&D, args);
    until = lbt_now() + 30;
    while (lbt_warm_ids(&D, warm, 1) < 1 || metric("lendbox_seeds_starting") != 0) {
        ck_assert_msg(lbt_now() < until, "the warm pool did not fill");
        lbt_sleep_ms(50);
    }
    /* another class (a workdir of its own) takes the only creation slot */
    other = lbt_async_json(&D, "POST", "/v1/sessions/adm-other/seed", "",
                           "{\"task_id\": \"t\", \"workdir\": \"/elsewhere\"}");
    wait_metric("lendbox_seeds_starting", 1);
    /* the pool's class is lent from the pool, no slot needed */
    lease = lbt_seed(&D, "adm-warm", "t", NULL);
    ck_assert_str_eq(json_string_value(json_object_get(lease, "sandbox_id")), warm[0]);
    json_decref(lease);
    ck_assert_int_eq(metric("lendbox_warm_seeds_total{result=\"hit\"}"), 1);
    /* the pool is empty now and the slot still held: the next one is refused, no record */
    lbt_json(&D, "POST", "/v1/sessions/adm-late/seed", "", "{\"task_id\": \"t\"}", &r);
    retry_after(&r);
    lbt_resp_free(&r);
    lbt_async_join(other, &r);
    ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
    lbt_resp_free(&r);
    json_t *all = lbt_list_sandboxes(&D);

    ck_assert_int_eq(lbt_count_records_of_session(all, "adm-late"), 0);
    json_decref(all);
    ck_assert_int_eq(metric("lendbox_seeds_overloaded_total"), 1);
    lbt_release_session(&D, "adm-other");
    lbt_release_session(&D, "adm-warm");
}
END_TEST

/* Every 429 says when to retry: the capacity one (max_sandboxes) too, with 1 s. */
START_TEST(test_capacity_429_has_retry_after)
{
    static const char *const args[] = {"--set", "lending.max_sandboxes=1", NULL};
    struct lbt_resp r;

    lbt_daemon_start(&D, args);
    json_decref(lbt_seed(&D, "adm-cap-1", "t", NULL));
    lbt_json(&D, "POST", "/v1/sessions/adm-cap-2/seed", "", "{\"task_id\": \"t\"}", &r);
    ck_assert_int_eq(retry_after(&r), 1);
    ck_assert_ptr_nonnull(strstr(r.body, "max_sandboxes (1) reached"));
    lbt_resp_free(&r);
    lbt_release_session(&D, "adm-cap-1");
}
END_TEST

/* lendboxd with one bad --set: it must exit non-zero at once and name the key. */
static void assert_refused(const char *set, const char *key)
{
    const char *bin = getenv("LENDBOXD") ? getenv("LENDBOXD") : "build/lendboxd";
    char cmd[1024], out[4096];
    size_t got;
    FILE *p;
    int status;

    snprintf(cmd, sizeof(cmd),
             "timeout 10 '%s' --state-dir /tmp/lbt-admission-never-$$ --listen 127.0.0.1:0 "
             "--set '%s' 2>&1",
             bin, set);
    p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    got = fread(out, 1, sizeof(out) - 1, p);
    out[got] = '\0';
    status = pclose(p);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 124,
                  "%s: status %d: %s", set, status, out);
    ck_assert_msg(strstr(out, key) && strstr(out, "must be an integer from"), "%s: %s", set, out);
}

START_TEST(test_negative_config_refused)
{
    assert_refused("lending.max_starting=-1", "lending.max_starting");
    assert_refused("lending.max_starting=0", "lending.max_starting");
    assert_refused("lending.max_seed_queue=-3", "lending.max_seed_queue");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("admission");
    TCase *tc = tcase_create("admission");

    srand48(1);
    lbt_test_daemon_cleanup(tc, &D);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_overload_then_retries_get_through);
    tcase_add_test(tc, test_warm_seed_takes_no_slot);
    tcase_add_test(tc, test_capacity_429_has_retry_after);
    tcase_add_test(tc, test_negative_config_refused);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
