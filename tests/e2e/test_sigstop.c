/*
 * test_sigstop.c - a sandbox that stops everything it can see (`kill -STOP -1` in a loop)
 * must not wedge the daemon's workers. The exec path spawns its helper with a vfork-style
 * clone that shares the daemon's memory until execve (src/provider/local/spawn.h); whatever enters
 * the sandbox (its cgroup, its uid, its pid namespace) must be a process of its own, else a
 * stopped child would hold a worker forever. With server.workers = 2: several execs into the
 * stopping sandbox all answer (a result, usually timeout or sandbox error) instead of hanging,
 * an exec into another sandbox still completes, and both sandboxes release.
 */
#include <stdio.h>
#include <string.h>

#include "harness.h"

#define WORKERS 2
#define ROUNDS 2
#define MAX_ROUNDS 12

static struct lbt_daemon D;

static const char *sandbox_of(json_t *lease)
{
    const char *id = json_string_value(json_object_get(lease, "sandbox_id"));

    ck_assert_ptr_nonnull(id);
    return id;
}

START_TEST(test_stop_loop_does_not_wedge_workers)
{
    /* Both workers may serve the stopping sandbox at once (the default allows half). The
     * per-sandbox bound is twice the workers: the pool counts a job's key until its worker
     * returns, which is just after the answer went out, so a round sent as soon as the last
     * one answered can still find that round's jobs counted (a 429 that says nothing about
     * wedged workers). */
    static const char *const args[] = {"--set", "server.workers=2", "--set",
                                       "limits.max_execs_per_sandbox=4", NULL};
    json_t *bad = NULL, *good = NULL, *res;
    struct lbt_async *a[WORKERS];
    char path[128], bad_id[64], good_id[64];
    struct lbt_resp r;
    int stopped = 0, rounds = 0;
    char mark[128];
    json_t *desc;

    lbt_daemon_start(&D, args);
    bad = lbt_seed(&D, "stopper", "t", NULL);
    good = lbt_seed(&D, "bystander", "t", NULL);
    snprintf(bad_id, sizeof(bad_id), "%s", sandbox_of(bad));
    snprintf(good_id, sizeof(good_id), "%s", sandbox_of(good));

    /* the loop outlives its exec and starts once that exec is over (a supervisor stopped at
     * its backstop has its whole session killed, the loop with it) */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", bad_id);
    lbt_json(&D, "POST", path, "",
             "{\"command\": \"(sleep 1; : > /tmp/loop-on; while :; do kill -STOP -1; done) "
             ">/dev/null 2>&1 &\", "
             "\"preserve_background_services\": true, \"timeout_s\": 30}",
             &r);
    ck_assert_msg(r.status == 200, "starting the loop: %ld %s", r.status, r.body);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "return_code")), 0);
    lbt_resp_free(&r);
    /* wait until the loop runs (its mark, read through the init's root, at most 60 s) */
    desc = lbt_read_descriptor(&D, bad_id);
    ck_assert_ptr_nonnull(desc);
    snprintf(mark, sizeof(mark), "/proc/%lld/root/tmp/loop-on",
             (long long)json_integer_value(json_object_get(desc, "pid")));
    json_decref(desc);
    for (int i = 0; !lbt_path_exists(mark); i++) {
        ck_assert_msg(i < 600, "the stop loop did not start in 60 s");
        lbt_sleep_ms(100);
    }

    /* rounds of as many execs as there are workers, all into the stopping sandbox: each
     * must come back (a stopped supervisor ends at the backstop, timeout + 10 s). At least
     * ROUNDS, and more until the loop caught one (it stops what it sees between two of its
     * own turns; a quick exec can run between them) */
    for (int round = 0; round < MAX_ROUNDS && (round < ROUNDS || stopped == 0); round++) {
        rounds++;
        for (int i = 0; i < WORKERS; i++)
            a[i] =
                lbt_async_json(&D, "POST", path, "", "{\"command\": \"true\", \"timeout_s\": 1}");
        for (int i = 0; i < WORKERS; i++) {
            json_t *rc;

            lbt_async_join(a[i], &r);
            ck_assert_msg(r.status == 200, "round %d, exec %d into the stopping sandbox: %ld %s",
                          round, i, r.status, r.body);
            fprintf(stderr, "round %d exec %d: %.200s\n", round, i, r.body);
            rc = json_object_get(r.json, "return_code");
            ck_assert_msg(json_is_integer(rc), "no return_code: %s", r.body);
            stopped += json_integer_value(rc) == 125;
            lbt_resp_free(&r);
        }
    }

    /* the loop did stop supervisors (else this test proves nothing) */
    ck_assert_msg(stopped > 0, "no exec of %d rounds was stopped: the loop is not running", rounds);

    /* the workers are free: another sandbox's exec completes */
    res = lbt_exec_ok(&D, good_id, "", "{\"command\": \"echo still here\"}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "still here\n");
    json_decref(res);

    /* and both release: the stopped processes die with their sandbox */
    lbt_json(&D, "POST", "/v1/sessions/stopper/release", "", "{}", &r);
    ck_assert_msg(r.status == 200, "release stopper: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/bystander/release", "", "{}", &r);
    ck_assert_msg(r.status == 200, "release bystander: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    lbt_assert_healthy(&D);
    json_decref(bad);
    json_decref(good);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sigstop");
    TCase *tc = tcase_create("sigstop");

    lbt_test_daemon_cleanup(tc, &D);
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_stop_loop_does_not_wedge_workers);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
