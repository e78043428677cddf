/*
 * test_lxd_burst.c - a cluster member dies in the middle of a burst of seeds, on a real
 * two-member LXD cluster (scripts/lxd-cluster). Runs on the lxd variant only (make e2e-lxd);
 * elsewhere it prints SKIP. 20 seeds are sent at once (target not pinned: LXD places them on
 * both members) and member b's lxd is SIGKILLed while they are in flight; 4 more are sent at
 * once right after. Every seed answers: 200, or 502 provider_error with its record kept (GET
 * /v1/sandboxes shows it) for a create b took before it died; none fails because LXD, which
 * still counts b Online until its heartbeats are missed, placed it on b after. Seeds sent
 * during the outage answer 200 on member a. Every lease of 200 runs: an exec of `true` answers 0 at
 * once on a, and once b is back on b. After b returns, a release of every session and the
 * retry loop leave every record stopped and no instance of this daemon in LXD, asked of the
 * cluster and of each member.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define N_BURST 20
#define N_OUTAGE 4

/* The instances LXD lists with user.lendbox.instance = label, on member (NULL: the whole
 * cluster, as its database knows them); -1 when LXD does not answer. */
static int count_instances(const char *label, const char *member)
{
    char path[256];
    json_t *j, *c;
    size_t i;
    int n = 0;

    snprintf(path, sizeof(path), "/1.0/instances?recursion=1%s%s", member ? "&target=" : "",
             member ? member : "");
    j = lbt_lxd_get(path);
    if (!j || !json_is_array(json_object_get(j, "metadata"))) {
        json_decref(j);
        return -1;
    }
    json_array_foreach(json_object_get(j, "metadata"), i, c) {
        const char *v = json_string_value(
            json_object_get(json_object_get(c, "config"), "user.lendbox.instance"));

        n += v && strcmp(v, label) == 0;
    }
    json_decref(j);
    return n;
}

/* The record of session rsid (a new reference; NULL when none): the last one listed. */
static json_t *record_of_session(struct lbt_daemon *d, const char *rsid)
{
    json_t *list = lbt_list_sandboxes(d), *rec, *found = NULL;
    size_t i;

    json_array_foreach(list, i, rec) {
        if (strcmp(json_string_value(json_object_get(rec, "resources_session_id")) ?: "", rsid) ==
            0)
            found = rec;
    }
    json_incref(found);
    json_decref(list);
    return found;
}

/* How many records are not stopped. */
static int records_open(struct lbt_daemon *d)
{
    json_t *list = lbt_list_sandboxes(d), *rec;
    size_t i;
    int n = 0;

    json_array_foreach(list, i, rec) {
        n += strcmp(json_string_value(json_object_get(rec, "state")) ?: "", "stopped") != 0;
    }
    json_decref(list);
    return n;
}

static void exec_true(struct lbt_daemon *d, const char *id)
{
    json_t *res = lbt_exec_ok(d, id, "", "{\"argv\": [\"true\"]}");

    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    json_decref(res);
}

struct seeded {
    char rsid[32];
    char id[64];    /* "" for a 502 */
    char where[16]; /* its member */
};

START_TEST(test_member_dies_mid_burst)
{
    char label[64], inst_set[96], path[96];
    const char *extra[] = {"--set", inst_set,
                           "--set", "lending.max_starting=64",
                           "--set", "lending.max_seed_queue=256",
                           "--set", "lending.retry_base_s=1",
                           "--set", "lending.retry_max_s=2",
                           "--set", "lending.sweep_interval_s=1",
                           "--set", "lending.stop_timeout_s=20",
                           "--set", "lxd.call_timeout_s=20",
                           NULL};
    static struct seeded s[N_BURST + N_OUTAGE];
    struct lbt_async *a[N_BURST + N_OUTAGE];
    struct lbt_daemon d;
    struct lbt_resp r;
    int ok = 0, failed = 0, in_flight = 0, on_b = 0;

    /* both members up (a run that failed half-way may have left b down) */
    ck_assert_int_eq(lbt_lxd_cluster("up"), 0);
    snprintf(label, sizeof(label), "lbt-burst-%d", (int)getpid());
    snprintf(inst_set, sizeof(inst_set), "lxd.instance=%s", label);
    lbt_daemon_start(&d, extra);
    for (int i = 0; i < N_BURST; i++) {
        snprintf(s[i].rsid, sizeof(s[i].rsid), "bu-%d", i);
        snprintf(path, sizeof(path), "/v1/sessions/%.31s/seed", s[i].rsid);
        a[i] = lbt_async_json(&d, "POST", path, "", "{\"task_id\": \"t\"}");
    }
    /* b dies while the creates run */
    lbt_sleep_ms(400);
    for (int i = 0; i < N_BURST; i++)
        in_flight += !lbt_async_done(a[i]);
    ck_assert_int_eq(lbt_lxd_cluster("stop-member b"), 0);
    fprintf(stderr, "test_lxd_burst: member b killed with %d of %d seeds in flight\n", in_flight,
            N_BURST);
    /* seeds sent during the outage, at once: LXD still has b Online for a while (until its
     * heartbeats are missed) and places some of them there */
    for (int i = N_BURST; i < N_BURST + N_OUTAGE; i++) {
        snprintf(s[i].rsid, sizeof(s[i].rsid), "bo-%d", i);
        snprintf(path, sizeof(path), "/v1/sessions/%.31s/seed", s[i].rsid);
        a[i] = lbt_async_json(&d, "POST", path, "", "{\"task_id\": \"t\"}");
    }

    /* every seed answers: 200, or 502 with its record kept */
    for (int i = 0; i < N_BURST; i++) {
        lbt_async_join(a[i], &r);
        if (r.status == 200) {
            snprintf(s[i].id, sizeof(s[i].id), "%s",
                     json_string_value(json_object_get(r.json, "sandbox_id")));
            ok++;
        } else {
            json_t *rec;

            lbt_assert_error(&r, 502, "provider_error");
            /* only a create b took before it died fails (its operation, its POST cut: "EOF",
             * the wait for its operation, "GET .../operations/ID/wait", or the start of the
             * instance it made, "PUT .../state", then finding b gone): none LXD placed on b
             * after ("Unable to connect" to a create) or could place nowhere */
            ck_assert_msg((!strstr(r.body, "Unable to connect") || strstr(r.body, "/state") ||
                           strstr(r.body, "/operations/")) &&
                              !strstr(r.body, "No suitable cluster member") &&
                              !strstr(r.body, "no Online member"),
                          "seed %s: %s", s[i].rsid, r.body);
            rec = record_of_session(&d, s[i].rsid);
            ck_assert_msg(rec != NULL, "seed %s: 502 and no record", s[i].rsid);
            json_decref(rec);
            failed++;
        }
        lbt_resp_free(&r);
    }
    fprintf(stderr, "test_lxd_burst: %d seeds 200, %d seeds 502\n", ok, failed);

    /* seeds during the outage (target not pinned) go to the live member */
    for (int i = N_BURST; i < N_BURST + N_OUTAGE; i++) {
        lbt_async_join(a[i], &r);
        ck_assert_msg(r.status == 200, "outage seed %s: %ld %s", s[i].rsid, r.status, r.body);
        snprintf(s[i].id, sizeof(s[i].id), "%s",
                 json_string_value(json_object_get(r.json, "sandbox_id")));
        lbt_resp_free(&r);
        lbt_lxd_location(s[i].id, s[i].where, sizeof(s[i].where));
        ck_assert_msg(strcmp(s[i].where, "a") == 0, "outage seed %s placed on '%s'", s[i].rsid,
                      s[i].where);
    }

    /* every lease runs: on a now */
    for (int i = 0; i < N_BURST + N_OUTAGE; i++) {
        if (!s[i].id[0])
            continue;
        lbt_lxd_location(s[i].id, s[i].where, sizeof(s[i].where));
        ck_assert_msg(strcmp(s[i].where, "a") == 0 || strcmp(s[i].where, "b") == 0,
                      "lease %s: instance %s on '%s'", s[i].rsid, s[i].id, s[i].where);
        if (strcmp(s[i].where, "a") == 0)
            exec_true(&d, s[i].id);
        else
            on_b++;
    }
    /* b back: the leases on b run too */
    ck_assert_int_eq(lbt_lxd_cluster("start-member b"), 0);
    for (int i = 0; i < N_BURST; i++)
        if (s[i].id[0] && strcmp(s[i].where, "b") == 0)
            exec_true(&d, s[i].id);
    fprintf(stderr, "test_lxd_burst: %d leases on b ran after its return\n", on_b);

    /* release everything; the retry loop finishes what failed: no record live, no instance */
    for (int i = 0; i < N_BURST + N_OUTAGE; i++) {
        snprintf(path, sizeof(path), "/v1/sessions/%.31s/release", s[i].rsid);
        lbt_json(&d, "POST", path, "", NULL, &r);
        ck_assert_msg(r.status == 200 || r.status == 404, "release %s: %ld %s", s[i].rsid, r.status,
                      r.body);
        lbt_resp_free(&r);
    }
    for (int i = 0; i < 240 && (records_open(&d) != 0 || count_instances(label, NULL) != 0); i++)
        lbt_sleep_ms(250);
    ck_assert_int_eq(records_open(&d), 0);
    ck_assert_int_eq(count_instances(label, NULL), 0);
    ck_assert_int_eq(count_instances(label, "a"), 0);
    ck_assert_int_eq(count_instances(label, "b"), 0);
    /* every seed's record is there, stopped */
    for (int i = 0; i < N_BURST + N_OUTAGE; i++) {
        json_t *rec = record_of_session(&d, s[i].rsid);

        ck_assert_msg(rec != NULL, "no record of %s", s[i].rsid);
        ck_assert_str_eq(json_string_value(json_object_get(rec, "state")), "stopped");
        json_decref(rec);
    }
    lbt_daemon_cleanup(&d);
    ck_assert_int_eq(count_instances(label, NULL), 0);
}
END_TEST

int main(void)
{
    Suite *s;
    TCase *tc;

    if (!lbt_variant_is("lxd")) {
        printf("test_lxd_burst: SKIP: runs on the lxd variant (make e2e-lxd, "
               "LENDBOX_E2E_VARIANT=lxd)\n");
        return 0;
    }
    s = suite_create("lxd_burst");
    tc = tcase_create("member_death");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_member_dies_mid_burst);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
