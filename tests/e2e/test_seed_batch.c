/*
 * test_seed_batch.c - POST /v1/sessions/seed_batch (host, image and pool variants).
 *
 * - a batch of 64: 60 good items (each with a seed file naming its session), one with a bad
 *   field (ttl_s -1), one without an rsid, one naming an rsid an earlier item names, one for a
 *   session that already has a live sandbox of another task → 200 with 64 results in request
 *   order: exactly those four are 400, 400 (rsid null), 409, 409 with a JSON error, the other
 *   60 are leases with 60 distinct sandbox ids; each sandbox runs an exec with its own operate
 *   token and holds its own item's file; the earlier item's session keeps its sandbox, the live
 *   one keeps its own, the bad one has none; release_all by the batch's label releases the 60,
 *   and then no record is lent or starting, no cgroup of theirs and no process of a lent uid is
 *   left
 * - a live session seeded again in a batch with its own task_id gets its lease again (200, the
 *   same sandbox), as a single seed would
 * - the whole request is 400 for 257 items, an empty or missing "items", items not an array, a
 *   body that is not an object, an unknown member; 403 with an operate token, 401 with none;
 *   none of them seeds anything
 * - lending.max_sandboxes = 3 and a batch of 8: exactly 3 leases, the other 5 are 429
 *   overloaded, and nothing (no record, no session) is left of those 5
 * - a batch of 20 with every create slowed (fault provider.create=delay): the records in state
 *   starting, watched while it runs, are never more than 8 and more than 1 at some moment (the
 *   items run in parallel, 8 at a time); all 20 are lent
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define N_ITEMS 64
#define BAD_FIELD 10
#define NO_RSID 20
#define DUP 30
#define DUP_OF 5
#define LIVE 40

static struct lbt_daemon D;
static struct lbt_daemon C; /* the capacity test's own daemon */

static const char *str(json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

static long status_of(json_t *res)
{
    return (long)json_integer_value(json_object_get(res, "status"));
}

/* POST /v1/sessions/seed_batch with body (a JSON value, stolen) and token. */
static void batch(struct lbt_daemon *d, const char *token, json_t *body, struct lbt_resp *r)
{
    char *text = json_dumps(body, JSON_COMPACT);

    json_decref(body);
    ck_assert_ptr_nonnull(text);
    lbt_json(d, "POST", "/v1/sessions/seed_batch", token, text, r);
    free(text);
}

/* A good item: session rsid, task "batch", the batch's label, a file naming its session. */
static json_t *good_item(const char *rsid)
{
    return json_pack("{s:s,s:s,s:{s:s},s:{s:s}}", "rsid", rsid, "task_id", "batch", "labels",
                     "batch", "b64", "files", "/workspace/who", rsid);
}

/* Result res is an error of status and code with nothing else in it, and rsid (NULL: null). */
static void assert_item_error(json_t *res, const char *rsid, long status, const char *code)
{
    json_t *e = json_object_get(res, "error");

    ck_assert_msg(status_of(res) == status, "want %ld, got %s", status,
                  json_dumps(res, JSON_COMPACT));
    if (rsid)
        ck_assert_str_eq(str(res, "rsid"), rsid);
    else
        ck_assert(json_is_null(json_object_get(res, "rsid")));
    ck_assert_int_eq(json_object_size(res), 3);
    ck_assert_int_eq(json_object_size(e), 2);
    ck_assert_str_eq(str(e, "code"), code);
    ck_assert_msg(str(e, "message") && *str(e, "message"), "no message");
}

/* GET /v1/sessions/rsid: the status (the sandbox id into sbx when 200 and sbx non-NULL). */
static long session_get(struct lbt_daemon *d, const char *rsid, char *sbx)
{
    char path[200];
    struct lbt_resp r;
    long st;

    snprintf(path, sizeof(path), "/v1/sessions/%s", rsid);
    lbt_json(d, "GET", path, "", NULL, &r);
    st = r.status;
    if (st == 200 && sbx)
        snprintf(sbx, LBT_ID_MAX, "%s", str(r.json, "sandbox_id"));
    lbt_resp_free(&r);
    return st;
}

/* Records of d in state lent or starting, but the warm pool's (its refills start too). */
static int count_lent(struct lbt_daemon *d)
{
    json_t *list = lbt_list_sandboxes_but_pool(d), *v;
    size_t i;
    int n = 0;

    json_array_foreach(list, i, v) {
        n += strcmp(str(v, "state"), "lent") == 0 || strcmp(str(v, "state"), "starting") == 0;
    }
    json_decref(list);
    return n;
}

START_TEST(test_batch_64)
{
    char live[LBT_ID_MAX], sbx[N_ITEMS][LBT_ID_MAX], rsid[32], got[LBT_ID_MAX];
    json_t *items = json_array(), *lease, *res, *results;
    uid_t uids[N_ITEMS];
    struct lbt_resp r;
    int n_ok = 0;

    lease = lbt_seed(&D, "b-live", "other-task", NULL);
    snprintf(live, sizeof(live), "%s", str(lease, "sandbox_id"));
    json_decref(lease);
    for (int i = 0; i < N_ITEMS; i++) {
        snprintf(rsid, sizeof(rsid), "b-%02d", i);
        if (i == BAD_FIELD)
            json_array_append_new(
                items, json_pack("{s:s,s:s,s:i}", "rsid", rsid, "task_id", "batch", "ttl_s", -1));
        else if (i == NO_RSID)
            json_array_append_new(items, json_pack("{s:s}", "task_id", "batch"));
        else if (i == DUP)
            json_array_append_new(items, good_item("b-05"));
        else if (i == LIVE)
            json_array_append_new(items, good_item("b-live"));
        else
            json_array_append_new(items, good_item(rsid));
    }
    batch(&D, "", json_pack("{s:o}", "items", items), &r);
    ck_assert_msg(r.status == 200, "seed_batch: %ld %.2000s", r.status, r.body);
    ck_assert_int_eq(json_object_size(r.json), 1);
    results = json_object_get(r.json, "results");
    ck_assert_int_eq(json_array_size(results), N_ITEMS);
    for (int i = 0; i < N_ITEMS; i++) {
        res = json_array_get(results, i);
        snprintf(rsid, sizeof(rsid), "b-%02d", i);
        sbx[i][0] = '\0';
        if (i == BAD_FIELD) {
            assert_item_error(res, rsid, 400, "bad_request");
            ck_assert_ptr_nonnull(strstr(str(json_object_get(res, "error"), "message"), "ttl_s"));
            continue;
        }
        if (i == NO_RSID) {
            assert_item_error(res, NULL, 400, "bad_request");
            continue;
        }
        if (i == DUP) {
            assert_item_error(res, "b-05", 409, "conflict");
            continue;
        }
        if (i == LIVE) {
            assert_item_error(res, "b-live", 409, "conflict");
            continue;
        }
        ck_assert_msg(status_of(res) == 200, "item %d: %s", i, json_dumps(res, JSON_COMPACT));
        ck_assert_int_eq(json_object_size(res), 3);
        ck_assert_str_eq(str(res, "rsid"), rsid);
        lease = json_object_get(res, "lease");
        ck_assert_str_eq(str(lease, "resources_session_id"), rsid);
        ck_assert_str_eq(str(lease, "task_id"), "batch");
        snprintf(sbx[i], LBT_ID_MAX, "%s", str(lease, "sandbox_id"));
        ck_assert_str_ne(sbx[i], live);
        for (int k = 0; k < i; k++)
            if (sbx[k][0])
                ck_assert_str_ne(sbx[i], sbx[k]);
        n_ok++;
    }
    ck_assert_int_eq(n_ok, N_ITEMS - 4);
    /* each sandbox works with its own operate token and holds its own item's file */
    for (int i = 0; i < N_ITEMS; i++) {
        json_t *out;

        if (!sbx[i][0])
            continue;
        lease = json_object_get(json_array_get(results, i), "lease");
        out = lbt_exec_ok(&D, sbx[i], str(json_object_get(lease, "access"), "token"),
                          "{\"command\": \"cat /workspace/who\"}");
        snprintf(rsid, sizeof(rsid), "b-%02d", i);
        ck_assert_int_eq(json_integer_value(json_object_get(out, "exit_code")), 0);
        ck_assert_str_eq(str(out, "stdout"), rsid);
        json_decref(out);
        uids[i] = lbt_sandbox_uid(&D, sbx[i]);
    }
    /* the first item of b-05 was seeded; the live session keeps its own; b-10 has none */
    ck_assert_int_eq(session_get(&D, "b-05", got), 200);
    ck_assert_str_eq(got, sbx[DUP_OF]);
    ck_assert_int_eq(session_get(&D, "b-live", got), 200);
    ck_assert_str_eq(got, live);
    ck_assert_int_eq(session_get(&D, "b-10", NULL), 404);
    lbt_resp_free(&r);

    lbt_json(&D, "POST", "/v1/sessions/release_all", "", "{\"labels\": {\"batch\": \"b64\"}}", &r);
    ck_assert_msg(r.status == 200, "release_all: %ld %s", r.status, r.body);
    ck_assert_int_eq(json_array_size(json_object_get(r.json, "released")), N_ITEMS - 4);
    ck_assert_int_eq(json_array_size(json_object_get(r.json, "failed")), 0);
    lbt_resp_free(&r);
    lbt_release_session(&D, "b-live");
    ck_assert_int_eq(count_lent(&D), 0);
    lbt_pool_settle(&D);
    for (int i = 0; i < N_ITEMS; i++) {
        if (!sbx[i][0])
            continue;
        ck_assert_int_eq(lbt_count_cgroup_dirs(sbx[i]), 0);
        if (!lbt_variant_is("pool")) /* a refill may take a freed uid */
            ck_assert_int_eq(lbt_count_live_procs_of_uid(uids[i]), 0);
    }
    {
        uid_t lent[8];

        ck_assert_int_eq(lbt_lent_uids(&D, D.uid_base, D.uid_base + D.uid_count * 65536u, lent, 8),
                         0);
    }
}
END_TEST

START_TEST(test_batch_reuses_live_same_task)
{
    char live[LBT_ID_MAX];
    json_t *lease = lbt_seed(&D, "b-same", "batch", NULL), *res;
    struct lbt_resp r;

    snprintf(live, sizeof(live), "%s", str(lease, "sandbox_id"));
    json_decref(lease);
    batch(&D, "", json_pack("{s:[o]}", "items", good_item("b-same")), &r);
    ck_assert_msg(r.status == 200, "seed_batch: %ld %s", r.status, r.body);
    res = json_array_get(json_object_get(r.json, "results"), 0);
    ck_assert_int_eq(status_of(res), 200);
    ck_assert_str_eq(str(json_object_get(res, "lease"), "sandbox_id"), live);
    lbt_resp_free(&r);
    lbt_release_session(&D, "b-same");
}
END_TEST

START_TEST(test_batch_whole_request_errors)
{
    json_t *items = json_array(), *lease;
    char rsid[32], tok[256];
    struct lbt_resp r;
    const char *const bodies[] = {
        "[]",
        "{}",
        "{\"items\": []}",
        "{\"items\": {\"rsid\": \"w-1\", \"task_id\": \"t\"}}",
        "{\"items\": [{\"rsid\": \"w-1\", \"task_id\": \"t\"}], \"other\": 1}",
        "{\"items\": null}",
        NULL,
    };

    for (int i = 0; i < 257; i++) {
        snprintf(rsid, sizeof(rsid), "w-%d", i);
        json_array_append_new(items, json_pack("{s:s,s:s}", "rsid", rsid, "task_id", "t"));
    }
    batch(&D, "", json_pack("{s:o}", "items", items), &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    for (int i = 0; bodies[i]; i++) {
        lbt_json(&D, "POST", "/v1/sessions/seed_batch", "", bodies[i], &r);
        lbt_assert_error(&r, 400, "bad_request");
        lbt_resp_free(&r);
    }
    lease = lbt_seed(&D, "w-tok", "t", NULL);
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
    lbt_json(&D, "POST", "/v1/sessions/seed_batch", tok,
             "{\"items\": [{\"rsid\": \"w-1\", \"task_id\": \"t\"}]}", &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/seed_batch", NULL,
             "{\"items\": [{\"rsid\": \"w-1\", \"task_id\": \"t\"}]}", &r);
    lbt_assert_error(&r, 401, "unauthorized");
    lbt_resp_free(&r);
    lbt_release_session(&D, "w-tok");
    ck_assert_int_eq(session_get(&D, "w-0", NULL), 404);
    ck_assert_int_eq(session_get(&D, "w-1", NULL), 404);
    ck_assert_int_eq(session_get(&D, "w-256", NULL), 404);
    ck_assert_int_eq(count_lent(&D), 0);
}
END_TEST

#define CAP 3
#define CAP_ITEMS 8

START_TEST(test_batch_capacity)
{
    static const char *const args[] = {"--set", "lending.max_sandboxes=3", "--set", "pool.size=0",
                                       NULL};
    json_t *items = json_array(), *res, *list;
    char rsid[32], ok_rsid[CAP][32];
    int n_ok = 0, n_full = 0;
    struct lbt_resp r;

    lbt_daemon_start(&C, args);
    for (int i = 0; i < CAP_ITEMS; i++) {
        snprintf(rsid, sizeof(rsid), "c-%d", i);
        json_array_append_new(items, good_item(rsid));
    }
    batch(&C, "", json_pack("{s:o}", "items", items), &r);
    ck_assert_msg(r.status == 200, "seed_batch: %ld %s", r.status, r.body);
    ck_assert_int_eq(json_array_size(json_object_get(r.json, "results")), CAP_ITEMS);
    for (int i = 0; i < CAP_ITEMS; i++) {
        res = json_array_get(json_object_get(r.json, "results"), i);
        snprintf(rsid, sizeof(rsid), "c-%d", i);
        ck_assert_str_eq(str(res, "rsid"), rsid);
        if (status_of(res) == 200) {
            ck_assert_int_lt(n_ok, CAP);
            snprintf(ok_rsid[n_ok++], sizeof(ok_rsid[0]), "%s", rsid);
            continue;
        }
        assert_item_error(res, rsid, 429, "overloaded");
        n_full++;
        ck_assert_int_eq(session_get(&C, rsid, NULL), 404);
    }
    lbt_resp_free(&r);
    ck_assert_int_eq(n_ok, CAP);
    ck_assert_int_eq(n_full, CAP_ITEMS - CAP);
    /* the refused ones left no record at all */
    list = lbt_list_sandboxes(&C);
    ck_assert_int_eq(json_array_size(list), CAP);
    json_decref(list);
    for (int i = 0; i < CAP; i++)
        lbt_release_session(&C, ok_rsid[i]);
    ck_assert_int_eq(count_lent(&C), 0);
}
END_TEST

#define SLOW_ITEMS 20

/* Records of d in state starting now. */
static int count_starting(struct lbt_daemon *d)
{
    json_t *list = lbt_list_sandboxes(d), *v;
    size_t i;
    int n = 0;

    json_array_foreach(list, i, v) {
        n += strcmp(str(v, "state"), "starting") == 0;
    }
    json_decref(list);
    return n;
}

START_TEST(test_batch_bound)
{
    static const char *const args[] = {"--set", "faults.spec=provider.create=delay:300", "--set",
                                       "pool.size=0", NULL};
    json_t *items = json_array(), *body;
    int max_starting = 0, n;
    struct lbt_async *a;
    struct lbt_resp r;
    char rsid[32], *text;

    lbt_daemon_start(&C, args);
    for (int i = 0; i < SLOW_ITEMS; i++) {
        snprintf(rsid, sizeof(rsid), "s-%d", i);
        json_array_append_new(items, json_pack("{s:s,s:s}", "rsid", rsid, "task_id", "t"));
    }
    body = json_pack("{s:o}", "items", items);
    text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    a = lbt_async_json(&C, "POST", "/v1/sessions/seed_batch", "", text);
    free(text);
    while (!lbt_async_done(a)) {
        n = count_starting(&C);
        ck_assert_msg(n <= 8, "%d seeds of the batch were starting at once", n);
        max_starting = n > max_starting ? n : max_starting;
        lbt_sleep_ms(20);
    }
    lbt_async_join(a, &r);
    ck_assert_msg(r.status == 200, "seed_batch: %ld %s", r.status, r.body);
    ck_assert_msg(max_starting > 1, "the items did not run in parallel (at most %d at once)",
                  max_starting);
    for (int i = 0; i < SLOW_ITEMS; i++)
        ck_assert_int_eq(status_of(json_array_get(json_object_get(r.json, "results"), i)), 200);
    lbt_resp_free(&r);
    for (int i = 0; i < SLOW_ITEMS; i++) {
        snprintf(rsid, sizeof(rsid), "s-%d", i);
        lbt_release_session(&C, rsid);
    }
    ck_assert_int_eq(count_lent(&C), 0);
}
END_TEST

int main(void)
{
    static const char *const args[] = {"--set", "local.uid_count=128", NULL};
    Suite *s = suite_create("seed_batch");
    TCase *tc = tcase_create("batch");

    lbt_shared_daemon(tc, &D, args);
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_batch_64);
    tcase_add_test(tc, test_batch_reuses_live_same_task);
    tcase_add_test(tc, test_batch_whole_request_errors);
    suite_add_tcase(s, tc);
    tc = tcase_create("capacity");
    lbt_test_daemon_cleanup(tc, &C);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_batch_capacity);
    tcase_add_test(tc, test_batch_bound);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
