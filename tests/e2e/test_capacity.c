/*
 * test_capacity.c - lending.max_sandboxes holds under concurrent seeds: the capacity check and
 * the record's insert are one statement (store_insert_sandbox with max_live), so 20 seeds at
 * once against max_sandboxes = 5 lend exactly 5, refuse the other 15 with 429 "overloaded",
 * and at no moment are there 6 live records. A delay injected before every store write
 * (faults.spec store.write) widens the window a separate count-then-insert would race in.
 */
#include <stdio.h>
#include <string.h>

#include "harness.h"

#define MAX_LIVE 5
#define SEEDS 20

static struct lbt_daemon D;

/* Live records (starting, lent, warm) of this daemon right now; lent ones in *lent. */
static int live_records(int *lent)
{
    struct lbt_resp r;
    size_t i;
    json_t *v;
    int live = 0;

    lbt_json(&D, "GET", "/v1/sandboxes", "", NULL, &r);
    ck_assert_msg(r.status == 200, "list: %ld %s", r.status, r.body);
    *lent = 0;
    json_array_foreach(json_object_get(r.json, "sandboxes"), i, v) {
        const char *st = json_string_value(json_object_get(v, "state"));

        if (strcmp(st, "starting") == 0 || strcmp(st, "lent") == 0 || strcmp(st, "warm") == 0)
            live++;
        if (strcmp(st, "lent") == 0)
            (*lent)++;
    }
    lbt_resp_free(&r);
    return live;
}

START_TEST(test_concurrent_seeds_never_pass_max_sandboxes)
{
    /* every store write waits 300 ms first: a count made before the insert (the race this
     * guards against) would be stale by then for all 20 seeds */
    static const char *const args[] = {
        "--set", "lending.max_sandboxes=5",           "--set", "server.workers=16",
        "--set", "faults.spec=store.write=delay:300", NULL};
    struct lbt_async *a[SEEDS];
    int ok = 0, refused = 0, lent = 0, max_seen = 0, live, polls = 0;
    bool all_done;

    lbt_daemon_start(&D, args);
    for (int i = 0; i < SEEDS; i++) {
        char path[64];

        snprintf(path, sizeof(path), "/v1/sessions/cap-%d/seed", i);
        a[i] = lbt_async_json(&D, "POST", path, "", "{\"task_id\": \"t\"}");
    }
    /* watch the records while the seeds run */
    do {
        all_done = true;
        for (int i = 0; i < SEEDS; i++)
            all_done = all_done && lbt_async_done(a[i]);
        live = live_records(&lent);
        if (live > max_seen)
            max_seen = live;
        polls++;
    } while (!all_done);
    for (int i = 0; i < SEEDS; i++) {
        struct lbt_resp r;

        lbt_async_join(a[i], &r);
        if (r.status == 200) {
            ok++;
        } else {
            lbt_assert_error(&r, 429, "overloaded");
            ck_assert_ptr_nonnull(strstr(r.body, "max_sandboxes (5) reached"));
            refused++;
        }
        lbt_resp_free(&r);
    }
    ck_assert_int_eq(ok, MAX_LIVE);
    ck_assert_int_eq(refused, SEEDS - MAX_LIVE);
    ck_assert_msg(max_seen <= MAX_LIVE, "%d live records seen at once (%d polls)", max_seen, polls);
    ck_assert_int_eq(live_records(&lent), MAX_LIVE);
    ck_assert_int_eq(lent, MAX_LIVE);
    /* releases give the places back */
    for (int i = 0; i < SEEDS; i++) {
        char path[64];
        struct lbt_resp r;

        snprintf(path, sizeof(path), "/v1/sessions/cap-%d/release", i);
        lbt_json(&D, "POST", path, "", "{}", &r);
        lbt_resp_free(&r);
    }
    ck_assert_int_eq(live_records(&lent), 0);
    json_decref(lbt_seed(&D, "cap-again", "t", NULL));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("capacity");
    TCase *tc = tcase_create("capacity");

    lbt_test_daemon_cleanup(tc, &D);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_concurrent_seeds_never_pass_max_sandboxes);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
