/*
 * test_lending.c - acceptance: seed reuse and conflicts, concurrent seeds of one session,
 * release (and what it leaves behind: nothing), delete, a seed whose file cannot be written,
 * and the seed's choice of provider (two providers side by side: local and fault).
 */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static struct lbt_daemon D;

static const char *str(json_t *obj, const char *key)
{
    const char *v = json_string_value(json_object_get(obj, key));

    ck_assert_msg(v != NULL, "'%s' is not a string", key);
    return v;
}

static void assert_lease(json_t *lease, const char *rsid, const char *task_id, bool reused)
{
    json_t *access = json_object_get(lease, "access");

    ck_assert_str_eq(str(lease, "resources_session_id"), rsid);
    ck_assert_str_eq(str(lease, "task_id"), task_id);
    ck_assert_str_eq(str(lease, "state"), "lent");
    ck_assert_str_eq(str(lease, "provider"), lbt_variant_provider());
    ck_assert_str_eq(str(lease, "image"), lbt_variant_image()); /* the default image */
    ck_assert_msg(strncmp(str(lease, "sandbox_id"), "sbx-", 4) == 0, "sandbox_id %s",
                  str(lease, "sandbox_id"));
    ck_assert_int_ge(strlen(str(lease, "created_at")), 20);
    ck_assert(json_is_null(json_object_get(lease, "expires_at")));
    ck_assert(json_is_boolean(json_object_get(lease, "reused")));
    ck_assert_int_eq(json_is_true(json_object_get(lease, "reused")), reused);
    ck_assert(json_is_object(access));
    ck_assert_str_eq(str(access, "sandbox_id"), str(lease, "sandbox_id"));
    ck_assert_str_eq(str(access, "scope"), "operate");
    ck_assert_int_ge(strlen(str(access, "token")), 16);
    ck_assert_str_eq(str(access, "workdir"), "/workspace");
    ck_assert(json_is_string(json_object_get(access, "base_url")));
}

static void seed_raw(const char *rsid, const char *body, struct lbt_resp *r)
{
    char path[400];

    snprintf(path, sizeof(path), "/v1/sessions/%s/seed", rsid);
    lbt_json(&D, "POST", path, "", body, r);
}

static void release(const char *rsid, struct lbt_resp *r)
{
    char path[400];

    snprintf(path, sizeof(path), "/v1/sessions/%s/release", rsid);
    lbt_json(&D, "POST", path, "", NULL, r);
}

START_TEST(test_seed_reuse_and_conflict)
{
    json_t *first = lbt_seed(&D, "lend-reuse", "task-a", NULL), *again, *list, *rec;
    struct lbt_resp r;
    char id[128];

    assert_lease(first, "lend-reuse", "task-a", false);
    snprintf(id, sizeof(id), "%s", str(first, "sandbox_id"));
    again = lbt_seed(&D, "lend-reuse", "task-a", NULL);
    assert_lease(again, "lend-reuse", "task-a", true);
    ck_assert_str_eq(str(again, "sandbox_id"), id);
    ck_assert_str_eq(str(json_object_get(again, "access"), "token"),
                     str(json_object_get(first, "access"), "token"));
    /* another task on a live session: 409, and the lease is untouched */
    seed_raw("lend-reuse", "{\"task_id\": \"task-b\"}", &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/sessions/lend-reuse", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    assert_lease(r.json, "lend-reuse", "task-a", false);
    ck_assert_str_eq(str(r.json, "sandbox_id"), id);
    lbt_resp_free(&r);
    list = lbt_list_sandboxes(&D);
    ck_assert_int_eq(lbt_count_records_of_session(list, "lend-reuse"), 1);
    rec = lbt_find_record(list, id);
    ck_assert_ptr_nonnull(rec);
    ck_assert_str_eq(str(rec, "state"), "lent");
    json_decref(list);
    json_decref(first);
    json_decref(again);
}
END_TEST

#define N_CONCURRENT 20

START_TEST(test_concurrent_seeds)
{
    struct lbt_async *a[N_CONCURRENT];
    struct lbt_resp r[N_CONCURRENT];
    const char *id = NULL;
    int fresh = 0;
    json_t *list, *rec;

    for (int i = 0; i < N_CONCURRENT; i++)
        a[i] = lbt_async_json(&D, "POST", "/v1/sessions/lend-concurrent/seed", "",
                              "{\"task_id\": \"task-c\"}");
    for (int i = 0; i < N_CONCURRENT; i++)
        lbt_async_join(a[i], &r[i]);
    for (int i = 0; i < N_CONCURRENT; i++) {
        ck_assert_msg(r[i].status == 200 && r[i].json, "seed %d: %ld %s", i, r[i].status,
                      r[i].body);
        if (!id)
            id = str(r[i].json, "sandbox_id");
        ck_assert_str_eq(str(r[i].json, "sandbox_id"), id);
        if (json_is_false(json_object_get(r[i].json, "reused")))
            fresh++;
    }
    ck_assert_int_eq(fresh, 1);
    list = lbt_list_sandboxes(&D);
    ck_assert_int_eq(lbt_count_records_of_session(list, "lend-concurrent"), 1);
    rec = lbt_find_record(list, id);
    ck_assert_ptr_nonnull(rec);
    ck_assert_str_eq(str(rec, "state"), "lent");
    json_decref(list);
    /* one sandbox dir under the state dir for it, and it works */
    char *out = lbt_sh(&D, id, "echo one");
    ck_assert_str_eq(out, "one\n");
    free(out);
    for (int i = 0; i < N_CONCURRENT; i++)
        lbt_resp_free(&r[i]);
}
END_TEST

START_TEST(test_release)
{
    json_t *lease = lbt_seed(&D, "lend-release", "task-r", NULL), *list, *rec, *desc;
    char id[128], dir[400], want[300];
    struct lbt_resp r;
    uid_t uid;
    int n = -1;

    snprintf(id, sizeof(id), "%s", str(lease, "sandbox_id"));
    json_decref(lease);
    if (lbt_variant_engine()) {
        /* the provider's own things are its container, as the engine lists them */
        ck_assert_int_eq(lbt_variant_count_containers(id, true), 1);
        release("lend-release", &r);
        ck_assert_int_eq(r.status, 200);
        ck_assert(json_is_true(json_object_get(r.json, "released")));
        lbt_resp_free(&r);
        ck_assert_int_eq(lbt_variant_count_containers(id, false), 0);
        goto after;
    }
    /* before: the sandbox's processes, directory and cgroups exist */
    uid = lbt_sandbox_uid(&D, id);
    ck_assert_uint_ne(uid, 0);
    ck_assert_int_gt(lbt_count_live_procs_of_uid(uid), 0);
    snprintf(dir, sizeof(dir), "%s/sandboxes/%s", D.state_dir, id);
    ck_assert(lbt_path_exists(dir));
    desc = lbt_read_descriptor(&D, id);
    ck_assert_ptr_nonnull(desc);
    json_t *cg_dirs = json_object_get(json_object_get(desc, "cgroup"), "dirs");
    size_t i;
    json_t *v;
    json_array_foreach(cg_dirs, i, v) {
        ck_assert_msg(lbt_path_exists(json_string_value(v)), "cgroup %s missing",
                      json_string_value(v));
    }
    ck_assert_int_eq(lbt_count_cgroup_dirs(id), (int)json_array_size(cg_dirs));
    json_decref(desc);

    release("lend-release", &r);
    ck_assert_int_eq(r.status, 200);
    snprintf(want, sizeof(want), "{\"released\": true, \"sandbox_id\": \"%s\"}", id);
    json_t *expect = json_loads(want, 0, NULL);
    ck_assert_msg(json_equal(r.json, expect), "release: %s", r.body);
    json_decref(expect);
    lbt_assert_request_id(&r, NULL);
    lbt_resp_free(&r);
    release("lend-release", &r);
    ck_assert_int_eq(r.status, 200);
    expect = json_pack("{s:b}", "released", 0);
    ck_assert_msg(json_equal(r.json, expect), "second release: %s", r.body);
    lbt_resp_free(&r);
    release("lend-never-seeded", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_msg(json_equal(r.json, expect), "release of an unknown session: %s", r.body);
    json_decref(expect);
    lbt_resp_free(&r);

    /* after: no process of its uid, no directory, no cgroup */
    ck_assert_int_eq(lbt_count_live_procs_of_uid(uid), 0);
    /* killed processes reparented to the host's init may be zombies for a moment */
    for (int k = 0; k < 500 && (n = lbt_count_procs_of_uid(uid)) > 0; k++)
        lbt_sleep_ms(20);
    ck_assert_msg(n == 0, "%d processes of uid %u left", n, (unsigned)uid);
    ck_assert_msg(!lbt_path_exists(dir), "%s is still there", dir);
    ck_assert_int_eq(lbt_count_cgroup_dirs(id), 0);
after:
    /* exec on it: 404; the session is gone; the record says released */
    lbt_exec(&D, id, "", "{\"command\": \"true\"}", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/sessions/lend-release", "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    list = lbt_list_sandboxes(&D);
    rec = lbt_find_record(list, id);
    ck_assert_ptr_nonnull(rec);
    ck_assert_str_eq(str(rec, "state"), "stopped");
    ck_assert_str_eq(str(rec, "status"), "stopped");
    ck_assert_str_eq(str(rec, "stop_reason"), "released");
    json_decref(list);
    lbt_json(&D, "GET", "/v1/sessions", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert(strstr(r.body, id) == NULL);
    lbt_resp_free(&r);
}
END_TEST

START_TEST(test_delete)
{
    json_t *lease = lbt_seed(&D, "lend-delete", "task-d", NULL), *list, *rec;
    char id[128], path[300];
    struct lbt_resp r;
    uid_t uid;
    int n = -1;

    snprintf(id, sizeof(id), "%s", str(lease, "sandbox_id"));
    json_decref(lease);
    uid = lbt_variant_engine() ? 0 : lbt_sandbox_uid(&D, id);
    ck_assert(uid != 0 || lbt_variant_count_containers(id, true) == 1);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    lbt_json(&D, "DELETE", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "DELETE: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    for (int k = 0; k < 250 && (n = uid ? lbt_count_live_procs_of_uid(uid)
                                        : lbt_variant_count_containers(id, false)) > 0;
         k++)
        lbt_sleep_ms(20);
    ck_assert_int_eq(n, 0);
    list = lbt_list_sandboxes(&D);
    rec = lbt_find_record(list, id);
    ck_assert_ptr_nonnull(rec);
    ck_assert_str_eq(str(rec, "state"), "stopped");
    ck_assert_str_eq(str(rec, "stop_reason"), "deleted");
    json_decref(list);
    lbt_json(&D, "GET", "/v1/sessions/lend-delete", "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    lbt_exec(&D, id, "", "{\"command\": \"true\"}", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
}
END_TEST

/* Names under <state_dir>/sandboxes, joined by spaces. */
/* The daemon's sandbox dirs but the warm sandboxes' (variant pool: a refill replaces a taken
 * one with a new dir). */
static void sandbox_dirs(char *buf, size_t size)
{
    char path[400], warm[64][LBT_ID_MAX];
    struct dirent *e;
    DIR *dir;
    int n_warm = lbt_warm_ids(&D, warm, 64);

    buf[0] = '\0';
    snprintf(path, sizeof(path), "%s/sandboxes", D.state_dir);
    dir = opendir(path);
    ck_assert_ptr_nonnull(dir);
    while ((e = readdir(dir))) {
        bool is_warm = false;

        for (int i = 0; i < n_warm && !is_warm; i++)
            is_warm = strcmp(warm[i], e->d_name) == 0;
        if (e->d_name[0] == '.' || is_warm)
            continue;
        strncat(buf, e->d_name, size - strlen(buf) - 2);
        strncat(buf, " ", size - strlen(buf) - 1);
    }
    closedir(dir);
}

static void check_failed_seed(const char *rsid, const char *files_json)
{
    uid_t uids_before[64], uids_after[64];
    int nb, na = -1;
    char dirs_before[4096], dirs_after[4096], body[600];
    struct lbt_resp r;
    json_t *list, *rec = NULL, *v;
    size_t i;

    bool dk = lbt_variant_engine();

    if (!dk) {
        /* with a warm pool (variant pool) the seed takes a warm sandbox and a refill starts a
         * new one: count what is not warm, once no refill is under way */
        lbt_pool_settle(&D);
        nb = lbt_lent_uids(&D, D.uid_base, D.uid_base + D.uid_count * 65536u, uids_before, 64);
        sandbox_dirs(dirs_before, sizeof(dirs_before));
    }
    snprintf(body, sizeof(body), "{\"task_id\": \"task-f\", \"files\": %s}", files_json);
    seed_raw(rsid, body, &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    /* nothing is lent */
    char path[300];
    snprintf(path, sizeof(path), "/v1/sessions/%s", rsid);
    lbt_json(&D, "GET", path, "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    /* the sandbox that was started for it is recorded as stopped, seed_failed */
    list = lbt_list_sandboxes(&D);
    ck_assert_int_eq(lbt_count_records_of_session(list, rsid), 1);
    json_array_foreach(list, i, v) {
        const char *s = json_string_value(json_object_get(v, "resources_session_id"));
        if (s && !strcmp(s, rsid))
            rec = v;
    }
    ck_assert_ptr_nonnull(rec);
    ck_assert_str_eq(str(rec, "state"), "stopped");
    ck_assert_str_eq(str(rec, "stop_reason"), "seed_failed");
    if (dk) {
        /* its container is removed */
        ck_assert_int_eq(lbt_variant_count_containers(str(rec, "sandbox_id"), false), 0);
        json_decref(list);
        lbt_assert_healthy(&D);
        return;
    }
    ck_assert_int_eq(lbt_count_cgroup_dirs(str(rec, "sandbox_id")), 0);
    json_decref(list);
    /* and nothing of it runs or remains */
    lbt_pool_settle(&D);
    for (int k = 0; k < 250; k++) {
        na = lbt_lent_uids(&D, D.uid_base, D.uid_base + D.uid_count * 65536u, uids_after, 64);
        if (na == nb && memcmp(uids_before, uids_after, sizeof(uid_t) * (size_t)na) == 0)
            break;
        lbt_sleep_ms(20);
    }
    ck_assert_int_eq(na, nb);
    ck_assert(memcmp(uids_before, uids_after, sizeof(uid_t) * (size_t)na) == 0);
    sandbox_dirs(dirs_after, sizeof(dirs_after));
    ck_assert_str_eq(dirs_after, dirs_before);
    lbt_assert_healthy(&D);
}

START_TEST(test_seed_file_unwritable)
{
    /* keep one sandbox lent meanwhile, so "nothing new remains" is not trivially true */
    json_t *lease = lbt_seed(&D, "lend-bystander", "task-x", NULL);
    json_decref(lease);
    check_failed_seed("lend-bad-file-1", "{\"/tmp\": \"x\"}");
    check_failed_seed("lend-bad-file-2", "{\"/workspace/ok.txt\": \"fine\", \"/workspace\": "
                                         "{\"base64\": \"eA==\"}}");
    /* the session can still be seeded properly afterwards */
    lease = lbt_seed(&D, "lend-bad-file-1", "task-f", NULL);
    ck_assert(json_is_false(json_object_get(lease, "reused")));
    json_decref(lease);
}
END_TEST

static void release_on(struct lbt_daemon *d, const char *rsid, const char *id)
{
    struct lbt_resp r;
    char path[400];

    snprintf(path, sizeof(path), "/v1/sessions/%s/release", rsid);
    lbt_json(d, "POST", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "release %s: %ld %s", rsid, r.status, r.body);
    ck_assert(json_is_true(json_object_get(r.json, "released")));
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "sandbox_id")), id);
    lbt_resp_free(&r);
}
/* A seed may name its provider among the enabled ones ("provider"): an unknown or not enabled
 * one is 422 with the enabled ones named and records nothing; the default's name is a seed. */
START_TEST(test_seed_provider_choice)
{
    struct lbt_resp r;
    json_t *list;
    char want[200], body[200];

    seed_raw("lend-prov-1", "{\"task_id\": \"t\", \"provider\": \"nosuch\"}", &r);
    lbt_assert_error(&r, 422, "unenforceable");
    snprintf(want, sizeof(want), "provider 'nosuch' is not enabled on this daemon (enabled: %s)",
             lbt_variant_provider());
    ck_assert_str_eq(
        json_string_value(json_object_get(json_object_get(r.json, "error"), "message")), want);
    lbt_resp_free(&r);
    /* a kind this build has, but not enabled here */
    seed_raw("lend-prov-1", "{\"task_id\": \"t\", \"provider\": \"fault\"}", &r);
    lbt_assert_error(&r, 422, "unenforceable");
    lbt_resp_free(&r);
    seed_raw("lend-prov-1", "{\"task_id\": \"t\", \"provider\": 7}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    list = lbt_list_sandboxes(&D);
    ck_assert_int_eq(lbt_count_records_of_session(list, "lend-prov-1"), 0);
    json_decref(list);
    snprintf(body, sizeof(body), "{\"task_id\": \"t\", \"provider\": \"%s\"}",
             lbt_variant_provider());
    seed_raw("lend-prov-1", body, &r);
    ck_assert_msg(r.status == 200, "seed: %ld %s", r.status, r.body);
    assert_lease(r.json, "lend-prov-1", "t", false);
    lbt_resp_free(&r);
    release("lend-prov-1", &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
}
END_TEST

static void exec_expect(struct lbt_daemon *d, const char *id, long status, const char *code)
{
    struct lbt_resp r;

    lbt_exec(d, id, "", "{\"command\": \"echo hi\"}", &r);
    ck_assert_msg(r.status == status, "exec %s: %ld %s", id, r.status, r.body);
    if (code)
        lbt_assert_error(&r, status, code);
    else
        ck_assert_str_eq(json_string_value(json_object_get(r.json, "stdout")), "hi\n");
    lbt_resp_free(&r);
}

static const char *record_field(struct lbt_daemon *d, const char *id, const char *key, char *buf,
                                size_t len)
{
    json_t *list = lbt_list_sandboxes(d), *rec = lbt_find_record(list, id);

    ck_assert_ptr_nonnull(rec);
    snprintf(buf, len, "%s", json_string_value(json_object_get(rec, key)));
    json_decref(list);
    return buf;
}

/* Two providers side by side: "local" and "fault" (the local provider under another name with
 * its own fault points, fault.*). Every call on a sandbox goes to the provider its record names:
 * with fault.exec failing, execs of the fault sandbox fail and those of the local one do not,
 * also after kill -9 and a restart (adoption asks each record's provider); a restart without
 * "fault" enabled leaves its sandbox recorded and running (calls 502), and a restart with it
 * enabled again serves and releases it. */
START_TEST(test_two_providers)
{
    static const char *const both[] = {"--set", "provider.enabled=fault", "--set",
                                       "faults.spec=fault.exec=fail", NULL};
    struct lbt_daemon d2;
    struct lbt_resp r;
    char a[64], b[64], buf[64];
    json_t *lease;
    uid_t uid_b;
    int n = -1;

    LBT_SKIP_ON_ENGINE("the 'fault' provider is the local provider under another name "
                       "(it needs 'local' enabled); the engine providers have no such twin");
    lbt_daemon_start(&d2, both);
    lease = lbt_seed(&d2, "two-a", "t", NULL);
    ck_assert_str_eq(json_string_value(json_object_get(lease, "provider")), "local");
    snprintf(a, sizeof(a), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    lease = lbt_seed(&d2, "two-b", "t", "\"provider\": \"fault\"");
    ck_assert_str_eq(json_string_value(json_object_get(lease, "provider")), "fault");
    snprintf(b, sizeof(b), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    ck_assert_str_eq(record_field(&d2, b, "provider", buf, sizeof(buf)), "fault");
    ck_assert_str_eq(record_field(&d2, a, "provider", buf, sizeof(buf)), "local");
    uid_b = lbt_sandbox_uid(&d2, b);
    exec_expect(&d2, a, 200, NULL);
    exec_expect(&d2, b, 502, "provider_error");

    lbt_daemon_kill(&d2);
    lbt_daemon_restart(&d2, both);
    ck_assert_str_eq(record_field(&d2, a, "state", buf, sizeof(buf)), "lent");
    ck_assert_str_eq(record_field(&d2, b, "state", buf, sizeof(buf)), "lent");
    exec_expect(&d2, a, 200, NULL);
    exec_expect(&d2, b, 502, "provider_error");

    /* without "fault": its sandbox is neither adopted as local's nor stopped as an orphan */
    lbt_daemon_kill(&d2);
    lbt_daemon_restart(&d2, NULL);
    ck_assert_str_eq(record_field(&d2, b, "state", buf, sizeof(buf)), "lent");
    ck_assert_int_gt(lbt_count_live_procs_of_uid(uid_b), 0);
    lbt_exec(&d2, b, "", "{\"command\": \"echo hi\"}", &r);
    lbt_assert_error(&r, 502, "provider_error");
    ck_assert_ptr_nonnull(strstr(r.body, "not enabled"));
    lbt_resp_free(&r);
    exec_expect(&d2, a, 200, NULL);

    lbt_daemon_kill(&d2);
    lbt_daemon_restart(&d2, both);
    release_on(&d2, "two-b", b);
    for (int t = 0; t < 250 && (n = lbt_count_live_procs_of_uid(uid_b)) > 0; t++)
        lbt_sleep_ms(20);
    ck_assert_int_eq(n, 0);
    ck_assert_str_eq(record_field(&d2, b, "state", buf, sizeof(buf)), "stopped");
    release_on(&d2, "two-a", a);
    lbt_daemon_cleanup(&d2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("lending");
    TCase *tc = tcase_create("lending");

    lbt_shared_daemon(tc, &D, NULL);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_seed_reuse_and_conflict);
    tcase_add_test(tc, test_concurrent_seeds);
    tcase_add_test(tc, test_release);
    tcase_add_test(tc, test_delete);
    tcase_add_test(tc, test_seed_file_unwritable);
    tcase_add_test(tc, test_seed_provider_choice);
    tcase_add_test(tc, test_two_providers);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
