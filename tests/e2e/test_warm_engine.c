/*
 * test_warm_engine.c - warm pools ([pool], src/warm/) on the engine providers: lxd (variant
 * lxd, the two-member test cluster, pool.size = 4) and docker (variant docker, the podman
 * service, pool.size = 2); elsewhere it prints SKIP (test_warm covers the local provider).
 *
 * The pool fills: pool.size instances exist in the engine, each labelled with the daemon's
 * instance label and its sandbox id, running; a seed takes the oldest (its lease id is a former
 * warm id, its created_at before the seed) and gets its files; the pool refills to size with
 * new ids; the refills ran at once (the engine's creates overlap); a kill -9 and a restart
 * adopt every warm instance (same ids, nothing new made); release and a stop leave no instance
 * of the daemon's label. A second case: pool.max_age_s replaces a warm instance (stop reason
 * max_age, its instance gone). recycle = yes logs that the engine cannot reset and refills.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static struct lbt_daemon D;

/* The pool's size on this variant. */
static int pool_size(void)
{
    return lbt_variant_is("lxd") ? 4 : 2;
}

/* The daemon's instance label (lxd.instance / docker.instance) for this test process. */
static char label[64], label_set[96], size_set[32];

static void set_args(const char **argv, const char *const *extra)
{
    int n = 0;

    snprintf(label, sizeof(label), "lbt-warm-%d", (int)getpid());
    snprintf(label_set, sizeof(label_set), "%s.instance=%s",
             lbt_variant_is("lxd") ? "lxd" : "docker", label);
    snprintf(size_set, sizeof(size_set), "pool.size=%d", pool_size());
    argv[n++] = "--set";
    argv[n++] = label_set;
    argv[n++] = "--set";
    argv[n++] = size_set;
    for (; extra && *extra; extra++) {
        argv[n++] = "--set";
        argv[n++] = *extra;
    }
    argv[n] = NULL;
}

/* Wait (up to timeout_s) until exactly n records are warm and none is starting; returns them. */
static void wait_warm(int n, int timeout_s, struct lbt_ids *out)
{
    double until = lbt_now() + timeout_s;
    struct lbt_ids starting;

    for (;;) {
        lbt_records_in_state(&D, "warm", out);
        lbt_records_in_state(&D, "starting", &starting);
        if ((out->n == n && starting.n == 0) || lbt_now() > until)
            break;
        lbt_sleep_ms(100);
    }
    ck_assert_msg(out->n == n && starting.n == 0, "%d warm sandboxes (%d starting), wanted %d",
                  out->n, starting.n, n);
}

/* The engine's object of sandbox id (an LXD instance named id, or the docker container
 * lendbox-<label>-<id>): asserts it exists, runs and carries the daemon's labels. */
static void assert_engine_object(const char *id)
{
    char path[256];
    json_t *j, *conf;

    if (lbt_variant_is("lxd")) {
        snprintf(path, sizeof(path), "/1.0/instances/%s", id);
        j = lbt_lxd_get(path);
        ck_assert_ptr_nonnull(j);
        conf = json_object_get(json_object_get(j, "metadata"), "config");
        ck_assert_msg(conf, "no LXD instance %s", id);
        ck_assert_str_eq(
            json_string_value(json_object_get(json_object_get(j, "metadata"), "status")) ?: "",
            "Running");
        ck_assert_str_eq(json_string_value(json_object_get(conf, "user.lendbox.instance")) ?: "",
                         label);
        ck_assert_str_eq(json_string_value(json_object_get(conf, "user.lendbox.sandbox")) ?: "",
                         id);
    } else {
        snprintf(path, sizeof(path), "/containers/lendbox-%s-%s/json", label, id);
        j = lbt_podman_get(path);
        ck_assert_ptr_nonnull(j);
        conf = json_object_get(json_object_get(j, "Config"), "Labels");
        ck_assert_msg(conf, "no container for %s", id);
        ck_assert(json_is_true(json_object_get(json_object_get(j, "State"), "Running")));
        ck_assert_str_eq(json_string_value(json_object_get(conf, "io.lendbox.instance")) ?: "",
                         label);
        ck_assert_str_eq(json_string_value(json_object_get(conf, "io.lendbox.sandbox")) ?: "", id);
    }
    json_decref(j);
}

/* The engine's objects of this daemon's label (running_only: those running). */
static int engine_count(bool running_only)
{
    int n = lbt_variant_count_containers(label, running_only);

    ck_assert_msg(n >= 0, "the engine does not answer");
    return n;
}

static bool wait_engine_count(int want, int seconds)
{
    for (int i = 0; i < seconds * 4; i++) {
        if (engine_count(false) == want)
            return true;
        lbt_sleep_ms(250);
    }
    return false;
}

#define HITS "lendbox_warm_seeds_total{result=\"hit\"} "
#define REFILLS_OK "lendbox_warm_refills_total{result=\"ok\"} "
#define REFILLS_FAILED "lendbox_warm_refills_total{result=\"failed\"} "

START_TEST(test_pool_fills_takes_refills_adopts)
{
    const char *args[12];
    const int n = pool_size();
    struct lbt_ids warm, after, adopted;
    struct lbt_resp r;
    json_t *lease, *rec;
    char *out, hold[96], held[160];
    long starting = 0;

    /* every creation waits in its admission slot at provider.create until the test makes
     * file hold (fault provider.create=hold): the refills' overlap is seen, not sampled */
    snprintf(hold, sizeof(hold), "/tmp/lbt-warm-hold-%d", (int)getpid());
    unlink(hold);
    snprintf(held, sizeof(held), "faults.spec=provider.create=hold:%s", hold);
    {
        const char *const extra[] = {held, NULL};

        set_args(args, extra);
    }
    lbt_daemon_start(&D, args);
    /* refills run at once (pool.refill_concurrency, 2): two creations hold admission slots
     * together while the pool fills, never more */
    for (int i = 0; i < 1200 && starting < 2; i++) {
        starting = lbt_metric(&D, "lendbox_seeds_starting ");
        if (starting < 2)
            lbt_sleep_ms(50);
    }
    lbt_sleep_ms(300); /* a third would have started by now */
    starting = lbt_metric(&D, "lendbox_seeds_starting ");
    ck_assert_int_eq(close(open(hold, O_WRONLY | O_CREAT | O_CLOEXEC, 0600)), 0);
    ck_assert_msg(starting == 2, "%ld refill(s) at once, wanted 2", starting);
    ck_assert_int_eq(lbt_log_count(&D, "(max age 3600 s, 2 made at once,"), 1);
    wait_warm(n, 120, &warm);
    /* n instances in the engine, running, with the daemon's labels: the warm ones */
    ck_assert_int_eq(engine_count(false), n);
    ck_assert_int_eq(engine_count(true), n);
    for (int i = 0; i < n; i++) {
        assert_engine_object(warm.id[i]);
        rec = lbt_record(&D, warm.id[i]);
        ck_assert_ptr_nonnull(rec);
        ck_assert_str_eq(json_string_value(json_object_get(rec, "provider")),
                         lbt_variant_provider());
        ck_assert(json_is_null(json_object_get(rec, "resources_session_id")));
        json_decref(rec);
    }
    ck_assert_int_eq(lbt_metric(&D, REFILLS_OK), n);
    ck_assert_int_eq(lbt_metric(&D, REFILLS_FAILED), 0);

    /* a seed of the class takes the oldest warm one, made before the seed */
    lbt_sleep_ms(1100); /* created_at has whole seconds */
    time_t asked = time(NULL);
    lease = lbt_seed(&D, "ew-1", "t", "\"files\": {\"/workspace/in.txt\": \"from the seed\"}");
    const char *id = json_string_value(json_object_get(lease, "sandbox_id"));
    ck_assert_msg(lbt_ids_has(&warm, id), "lent %s, not a warm one", id);
    ck_assert_str_eq(id, warm.id[0]);
    ck_assert_str_eq(json_string_value(json_object_get(lease, "provider")), lbt_variant_provider());
    ck_assert_int_lt(lbt_parse_time(json_string_value(json_object_get(lease, "created_at"))),
                     asked);
    ck_assert_int_eq(lbt_metric(&D, HITS), 1);
    out = lbt_sh(&D, id, "cat /workspace/in.txt");
    ck_assert_str_eq(out, "from the seed");
    free(out);

    /* the pool refills to n with a new one; n + 1 instances of the label */
    wait_warm(n, 120, &after);
    ck_assert(!lbt_ids_has(&after, id));
    for (int i = 0; i < n; i++)
        if (!lbt_ids_has(&warm, after.id[i]))
            assert_engine_object(after.id[i]);
    ck_assert_int_eq(engine_count(true), n + 1);
    ck_assert_int_eq(lbt_metric(&D, REFILLS_OK), n + 1);

    /* kill -9 and restart: every warm instance adopted back into the pool, none made */
    lbt_daemon_kill(&D);
    lbt_daemon_restart(&D, args); /* pool.adopt = yes is the default */
    lbt_records_in_state(&D, "warm", &adopted);
    ck_assert_int_eq(adopted.n, n);
    for (int i = 0; i < n; i++)
        ck_assert(lbt_ids_has(&after, adopted.id[i]));
    rec = lbt_record(&D, id);
    ck_assert_str_eq(json_string_value(json_object_get(rec, "state")), "lent");
    json_decref(rec);
    lbt_sleep_ms(1500); /* nothing more is made: the pool is full */
    lbt_records_in_state(&D, "warm", &adopted);
    ck_assert_int_eq(adopted.n, n);
    ck_assert_int_eq(engine_count(false), n + 1);
    ck_assert_int_eq(lbt_metric(&D, REFILLS_OK), 0);
    ck_assert_int_eq(lbt_metric(&D, "lendbox_reconciled_total{result=\"adopted\"} "), n + 1);
    /* an adopted one serves a seed */
    json_t *lease2 = lbt_seed(&D, "ew-2", "t", NULL);
    ck_assert(lbt_ids_has(&after, json_string_value(json_object_get(lease2, "sandbox_id"))));
    out = lbt_sh(&D, json_string_value(json_object_get(lease2, "sandbox_id")), "echo ok");
    ck_assert_str_eq(out, "ok\n");
    free(out);
    json_decref(lease2);

    /* release everything and stop: no instance of the label is left */
    lbt_json(&D, "POST", "/v1/sessions/ew-1/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/ew-2/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    ck_assert_int_eq(lbt_daemon_stop(&D), 0);
    ck_assert_msg(wait_engine_count(0, 60), "%d instance(s) of %s left", engine_count(false),
                  label);
    json_decref(lease);
    (void)unlink(hold);
}
END_TEST

/* max_age: a warm instance past it is stopped (reason max_age), its engine object removed, and
 * a new one made; recycle = yes is refused with the warning (the engines cannot reset). */
START_TEST(test_max_age_and_no_recycle)
{
    const char *args[16];
    struct lbt_ids warm, now;
    json_t *rec = NULL;

    /* on lxd, lxd.create_concurrency = 1 bounds the refills at once below the 2 threads */
    static const char *const extra[] = {"pool.max_age_s=3", "pool.recycle=yes",
                                        "lending.sweep_interval_s=1", "lxd.create_concurrency=1",
                                        NULL};

    set_args(args, extra);
    if (!lbt_variant_is("lxd"))
        args[10] = NULL;
    args[3] = "pool.size=1";
    lbt_daemon_start(&D, args);
    wait_warm(1, 120, &warm);
    ck_assert_int_eq(lbt_log_count(&D, lbt_variant_is("lxd")
                                           ? "provider makes its sandboxes in an engine: the "
                                             "pool does not recycle"
                                           : "provider cannot reset sandboxes: the pool does not "
                                             "recycle"),
                     1);
    ck_assert_int_eq(lbt_log_count(&D, lbt_variant_is("lxd") ? "(max age 3 s, 1 made at once,"
                                                             : "(max age 3 s, 2 made at once,"),
                     1);
    assert_engine_object(warm.id[0]);
    for (int t = 0; t < 300; t++) {
        json_decref(rec);
        rec = lbt_record(&D, warm.id[0]);
        if (!strcmp(json_string_value(json_object_get(rec, "state")), "stopped"))
            break;
        lbt_sleep_ms(100);
    }
    ck_assert_str_eq(json_string_value(json_object_get(rec, "state")), "stopped");
    ck_assert_str_eq(json_string_value(json_object_get(rec, "stop_reason")), "max_age");
    json_decref(rec);
    ck_assert_int_eq(lbt_variant_count_containers(warm.id[0], false), 0);
    /* replaced by a new one (which may itself age out and be replaced meanwhile) */
    for (int t = 0; t < 300; t++) {
        lbt_records_in_state(&D, "warm", &now);
        if (now.n == 1 && strcmp(now.id[0], warm.id[0]) != 0)
            break;
        lbt_sleep_ms(100);
    }
    ck_assert_int_eq(now.n, 1);
    ck_assert_str_ne(now.id[0], warm.id[0]);
    ck_assert_int_eq(lbt_daemon_stop(&D), 0);
    ck_assert_msg(wait_engine_count(0, 60), "%d instance(s) of %s left", engine_count(false),
                  label);
}
END_TEST

int main(void)
{
    Suite *s;
    TCase *tc;

    if (!lbt_variant_is("lxd") && !lbt_variant_is("docker")) {
        printf("test_warm_engine: SKIP: runs on the lxd and docker variants (make e2e-lxd, "
               "make e2e-docker); test_warm covers the local provider\n");
        return 0;
    }
    s = suite_create("warm_engine");
    tc = tcase_create("warm_engine");
    lbt_test_daemon_cleanup(tc, &D);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_pool_fills_takes_refills_adopts);
    tcase_add_test(tc, test_max_age_and_no_recycle);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
