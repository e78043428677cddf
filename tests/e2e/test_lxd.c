/*
 * test_lxd.c - the lxd provider on a real two-member LXD cluster (scripts/lxd-cluster:
 * member a on a local bridge, member b in a network namespace). Runs on the lxd variant only
 * (make e2e-lxd; the harness brings the cluster up or takes LENDBOX_E2E_LXD_SOCKET); elsewhere it
 * prints SKIP. Cases: an instance placed on member b is exec'd, written and stopped through
 * member a's socket; a byte-exact file round trip (the octet-stream pitfall: LXD 5.0.2 writes an
 * empty file for a form body); kill -9 with 10 sandboxes, then adoption by label and an unrecorded
 * labelled instance stopped as an orphan; member b killed: release is 502 and keeps the record,
 * the retry loop finishes the stop once b is back, and the shutdown sweep with b down ends within
 * its bound and leaves the records stop_failed for the next start; `lendboxd image import
 * --provider lxd` of a test image, then a seed on it.
 */
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static const char *sid_of(json_t *lease)
{
    return json_string_value(json_object_get(lease, "sandbox_id"));
}

/* LXD's HTTP-ish code for GET /1.0/instances/id: 200 or 404 (error_code). */
static long instance_code(const char *id)
{
    char path[256];
    json_t *j;
    long code;

    snprintf(path, sizeof(path), "/1.0/instances/%s", id);
    j = lbt_lxd_get(path);
    ck_assert_ptr_nonnull(j);
    code = json_integer_value(json_object_get(j, "error_code"));
    if (code == 0)
        code = json_integer_value(json_object_get(j, "status_code")) == 200 ? 200 : -1;
    json_decref(j);
    return code;
}

static bool wait_instance_gone(const char *id, int seconds)
{
    for (int i = 0; i < seconds * 4; i++) {
        if (instance_code(id) == 404)
            return true;
        lbt_sleep_ms(250);
    }
    return false;
}

/* The record's state ("" when there is none). */
static void record_state(struct lbt_daemon *d, const char *id, char *buf, size_t size)
{
    json_t *list = lbt_list_sandboxes(d), *rec = lbt_find_record(list, id);

    snprintf(buf, size, "%s", rec ? json_string_value(json_object_get(rec, "state")) : "");
    json_decref(list);
}

static bool wait_record_state(struct lbt_daemon *d, const char *id, const char *want, int seconds)
{
    char st[64];

    for (int i = 0; i < seconds * 4; i++) {
        record_state(d, id, st, sizeof(st));
        if (strcmp(st, want) == 0)
            return true;
        lbt_sleep_ms(250);
    }
    return false;
}

/* --- placed on b, driven through a's socket; what lxd cannot honour --- */
START_TEST(test_member_b_through_a)
{
    static const char *const extra[] = {"--set", "lxd.target=b", NULL};
    struct lbt_daemon d;
    struct lbt_resp r;
    char where[64];
    json_t *lease, *res;
    const char *id;

    lbt_daemon_start(&d, extra);
    lease = lbt_seed(&d, "b-1", "t", "\"files\": {\"/workspace/task.txt\": \"on b\\n\"}");
    id = sid_of(lease);
    ck_assert_str_eq(json_string_value(json_object_get(lease, "provider")), "lxd");
    lbt_lxd_location(id, where, sizeof(where));
    ck_assert_str_eq(where, "b");
    /* exec: result fields, stdin, cwd, timeout killing a tree inside the instance */
    res = lbt_exec_ok(&d, id, "",
                      "{\"command\": \"cat /workspace/task.txt; pwd; echo oops >&2; exit 3\"}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 3);
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "on b\n/workspace\n");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stderr")), "oops\n");
    json_decref(res);
    res = lbt_exec_ok(&d, id, "", "{\"argv\": [\"cat\"], \"stdin\": \"in\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "in");
    json_decref(res);
    res = lbt_exec_ok(&d, id, "", "{\"command\": \"(sleep 300 &); sleep 300\", \"timeout_s\": 1}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "error_type")), "timeout");
    json_decref(res);
    res = lbt_exec_ok(&d, id, "", "{\"command\": \"ps | grep -c '[s]leep 300' || true\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "0\n");
    json_decref(res);
    /* a file written through a reaches b */
    lbt_file_put(&d, id, "", "/workspace/deep/x.txt", NULL, "written", 7, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
    res = lbt_exec_ok(&d, id, "", "{\"command\": \"cat /workspace/deep/x.txt\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "written");
    json_decref(res);
    /* pause / resume: an exec on a frozen instance is 409 */
    {
        char path[128];

        snprintf(path, sizeof(path), "/v1/sandboxes/%s/pause", id);
        lbt_json(&d, "POST", path, "", NULL, &r);
        ck_assert_msg(r.status == 200, "pause: %ld %s", r.status, r.body);
        lbt_resp_free(&r);
        lbt_exec(&d, id, "", "{\"command\": \"true\"}", &r);
        lbt_assert_error(&r, 409, "conflict");
        lbt_resp_free(&r);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/resume", id);
        lbt_json(&d, "POST", path, "", NULL, &r);
        ck_assert_msg(r.status == 200, "resume: %ld %s", r.status, r.body);
        lbt_resp_free(&r);
    }
    /* disk_mib: on a pool with quotas (the test cluster's btrfs) the instance's root is bounded
     * by it (LXD's root device size); a dir pool has none: 422. The driver is in /metrics. */
    {
        json_t *pool = lbt_lxd_get("/1.0/storage-pools/local"), *inst;
        const char *driver =
            json_string_value(json_object_get(json_object_get(pool, "metadata"), "driver"));
        char want[160], path[128];

        ck_assert_msg(driver, "no driver for the storage pool local");
        lbt_json(&d, "GET", "/metrics", NULL, NULL, &r);
        ck_assert_int_eq(r.status, 200);
        snprintf(want, sizeof(want),
                 "\nlendbox_provider_storage_info{provider=\"lxd\",pool=\"local\",driver=\"%s\"} "
                 "1\n",
                 driver);
        ck_assert_msg(strstr(r.body, want), "no '%s' in /metrics", want + 1);
        lbt_resp_free(&r);
        lbt_json(&d, "POST", "/v1/sessions/b-2/seed", "",
                 "{\"task_id\": \"t\", \"resources\": {\"disk_mib\": 64}}", &r);
        if (strcmp(driver, "dir") == 0) {
            lbt_assert_error(&r, 422, "unenforceable");
            lbt_resp_free(&r);
        } else {
            const char *id2;

            ck_assert_msg(r.status == 200, "seed with disk_mib on %s: %ld %s", driver, r.status,
                          r.body);
            id2 = json_string_value(json_object_get(r.json, "sandbox_id"));
            ck_assert_ptr_nonnull(id2);
            snprintf(path, sizeof(path), "/1.0/instances/%s", id2);
            inst = lbt_lxd_get(path);
            ck_assert_str_eq(
                json_string_value(json_object_get(
                    json_object_get(json_object_get(json_object_get(inst, "metadata"), "devices"),
                                    "root"),
                    "size")),
                "64MiB");
            json_decref(inst);
            /* 96 MiB into the workdir (the root file system): cut short by the quota; 8 MiB fit */
            res = lbt_exec_ok(&d, id2, "",
                              "{\"command\": \"dd if=/dev/zero of=/workspace/big bs=1M count=96 "
                              "2>/dev/null; echo rc=$?; rm -f /workspace/big; sync; dd "
                              "if=/dev/zero of=/workspace/small bs=1M count=8 2>/dev/null; echo "
                              "rc=$?\"}");
            ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "rc=1\nrc=0\n");
            json_decref(res);
            lbt_resp_free(&r);
            lbt_json(&d, "POST", "/v1/sessions/b-2/release", "", NULL, &r);
            ck_assert_msg(r.status == 200, "release: %ld %s", r.status, r.body);
            lbt_resp_free(&r);
        }
        json_decref(pool);
    }
    /* activations run (their receipt read back from the instance through a: test_activation
     * on this variant) */
    lbt_json(&d, "POST", "/v1/sessions/b-1/execute", "", "{\"argv\": [\"sh\", \"-c\", \"exit 6\"]}",
             &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "state")), "finished");
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "return_code")), 6);
    lbt_resp_free(&r);
    /* release through a: gone from the cluster */
    lbt_json(&d, "POST", "/v1/sessions/b-1/release", "", NULL, &r);
    ck_assert_msg(r.status == 200, "release: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    ck_assert_int_eq(instance_code(id), 404);
    json_decref(lease);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* --- lxd.supervise_host_path: the supervisor bound read-only from the member's host, the
 * workdir made by LXC at the start; execs, a seed's files, a custom workdir all work --- */
START_TEST(test_supervisor_bound)
{
    char setting[PATH_MAX + 64];
    const char *extra[] = {"--set", setting, "--set", "lxd.target=b", NULL};
    const char *sup = getenv("LENDBOX_SUPERVISE");
    struct lbt_daemon d;
    json_t *lease, *lease2, *res, *inst;
    const char *id, *raw;
    char path[PATH_MAX];

    ck_assert_ptr_nonnull(sup);
    ck_assert_ptr_nonnull(realpath(sup, path));
    snprintf(setting, sizeof(setting), "lxd.supervise_host_path=%s", path);
    lbt_daemon_start(&d, extra);
    lease = lbt_seed(&d, "bound-1", "t", "\"files\": {\"/workspace/task.txt\": \"bound\\n\"}");
    id = sid_of(lease);
    /* the instance's config holds the bind and the workdir's entry */
    snprintf(setting, sizeof(setting), "/1.0/instances/%s", id);
    inst = lbt_lxd_get(setting);
    raw = json_string_value(
        json_object_get(json_object_get(json_object_get(inst, "metadata"), "config"), "raw.lxc"));
    ck_assert_ptr_nonnull(raw);
    snprintf(setting, sizeof(setting), "lxc.mount.entry = %s run/lendbox/supervise none bind,ro",
             path);
    ck_assert_msg(strstr(raw, setting), "raw.lxc: %s", raw);
    ck_assert_msg(strstr(raw, "lxc.mount.entry = none workspace none bind,optional,create=dir"),
                  "raw.lxc: %s", raw);
    json_decref(inst);
    res = lbt_exec_ok(&d, id, "", "{\"command\": \"cat task.txt; pwd; exit 4\"}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 4);
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "bound\n/workspace\n");
    json_decref(res);
    /* the instance's root cannot write the supervisor (a read-only bind) */
    res = lbt_exec_ok(&d, id, "",
                      "{\"command\": \"echo x > /run/lendbox/supervise; echo rc=$?; "
                      "grep -c ' /run/lendbox/supervise ' /proc/self/mountinfo\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "rc=1\n1\n");
    ck_assert_msg(strstr(json_string_value(json_object_get(res, "stderr")), "Read-only"), "%s",
                  json_string_value(json_object_get(res, "stderr")));
    json_decref(res);
    /* a workdir of its own, nested; and one raw.lxc cannot carry (made through the files API) */
    lease2 = lbt_seed(&d, "bound-2", "t", "\"workdir\": \"/srv/deep/work\"");
    res = lbt_exec_ok(&d, sid_of(lease2), "", "{\"command\": \"pwd; stat -c %u:%a .\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "/srv/deep/work\n0:755\n");
    json_decref(res);
    json_decref(lease2);
    lease2 = lbt_seed(&d, "bound-3", "t", "\"workdir\": \"/srv/a b\"");
    res = lbt_exec_ok(&d, sid_of(lease2), "", "{\"command\": \"pwd\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "/srv/a b\n");
    json_decref(res);
    json_decref(lease2);
    json_decref(lease);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* --- the files API pitfall: every byte value, 300 KiB, empty, a form-looking body --- */
START_TEST(test_octet_stream_round_trip)
{
    static const char form[] = "a=1&b=2&c=%41";
    struct lbt_daemon d;
    struct lbt_resp r;
    unsigned char all[256];
    size_t big_len = 300 * 1024;
    unsigned char *big = malloc(big_len);
    json_t *lease, *res;
    const char *id;
    struct {
        const char *path;
        const void *data;
        size_t len;
        const char *ctype; /* what the client says it sends */
    } cases[] = {
        {"/workspace/all.bin", all, sizeof(all), "application/octet-stream"},
        {"/workspace/big.bin", NULL, 0, "application/octet-stream"},
        {"/workspace/empty.bin", "", 0, "application/octet-stream"},
        {"/workspace/form.txt", form, sizeof(form) - 1, "application/x-www-form-urlencoded"},
    };

    ck_assert_ptr_nonnull(big);
    for (int i = 0; i < 256; i++)
        all[i] = (unsigned char)i;
    lbt_fill_random(big, big_len, 14);
    cases[1].data = big;
    cases[1].len = big_len;
    lbt_daemon_start(&d, NULL);
    lease = lbt_seed(&d, "oct-1", "t", NULL);
    id = sid_of(lease);
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        char path[512], cmd[300];

        snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?path=%s", id, cases[k].path);
        lbt_request(&d, "PUT", path, "", cases[k].data, cases[k].len, cases[k].ctype, &r);
        ck_assert_msg(r.status == 204, "PUT %s: %ld %s", cases[k].path, r.status, r.body);
        lbt_resp_free(&r);
        /* inside the instance: the size it really has */
        snprintf(cmd, sizeof(cmd), "{\"command\": \"stat -c %%s %s\"}", cases[k].path);
        res = lbt_exec_ok(&d, id, "", cmd);
        snprintf(cmd, sizeof(cmd), "%zu\n", cases[k].len);
        ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), cmd);
        json_decref(res);
        /* and back, byte for byte */
        lbt_file_get(&d, id, "", cases[k].path, &r);
        ck_assert_int_eq(r.status, 200);
        ck_assert_uint_eq(r.len, cases[k].len);
        ck_assert(cases[k].len == 0 || memcmp(r.body, cases[k].data, cases[k].len) == 0);
        lbt_resp_free(&r);
    }
    json_decref(lease);
    free(big);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* --- kill -9 with 10 sandboxes: all adopted by label; an unrecorded labelled instance is an
 * orphan and stopped; /metrics counts the live sandboxes per cluster member --- */
START_TEST(test_kill9_adopt_and_orphan)
{
    char inst_set[96], orphan[64], body[600], rsid[32], metrics_want[128];
    const char *extra[] = {"--set", inst_set, NULL};
    struct lbt_daemon d;
    struct lbt_resp r;
    char ids[10][64];
    json_t *j;

    snprintf(inst_set, sizeof(inst_set), "lxd.instance=lbt-adopt-%d", (int)getpid());
    lbt_daemon_start(&d, extra);
    for (int i = 0; i < 10; i++) {
        json_t *lease;

        snprintf(rsid, sizeof(rsid), "ad-%d", i);
        lease = lbt_seed(&d, rsid, "t", NULL);
        snprintf(ids[i], sizeof(ids[i]), "%s", sid_of(lease));
        json_decref(lease);
    }
    lbt_daemon_kill(&d);
    /* an instance with this daemon's label and no record */
    snprintf(orphan, sizeof(orphan), "sbx-orphan%d", (int)getpid());
    snprintf(body, sizeof(body),
             "{\"name\": \"%s\", \"type\": \"container\", \"source\": {\"type\": \"image\", "
             "\"alias\": \"lendbox-test\"}, \"profiles\": [], \"devices\": {\"root\": {\"type\": "
             "\"disk\", \"path\": \"/\", \"pool\": \"local\"}}, \"config\": "
             "{\"user.lendbox.instance\": \"lbt-adopt-%d\", \"user.lendbox.sandbox\": \"%s\"}}",
             orphan, (int)getpid(), orphan);
    j = lbt_lxd_request("POST", "/1.0/instances", body);
    ck_assert_ptr_nonnull(j);
    ck_assert_msg(
        strcmp(json_string_value(json_object_get(json_object_get(j, "metadata"), "status")) ?: "",
               "Success") == 0,
        "orphan create: %s", json_dumps(j, 0));
    json_decref(j);
    ck_assert_int_eq(instance_code(orphan), 200);
    lbt_daemon_restart(&d, extra);
    ck_assert(wait_instance_gone(orphan, 120));
    for (int i = 0; i < 10; i++) {
        char st[64];
        json_t *res;

        record_state(&d, ids[i], st, sizeof(st));
        ck_assert_str_eq(st, "lent");
        ck_assert_int_eq(instance_code(ids[i]), 200);
        res = lbt_exec_ok(&d, ids[i], "", "{\"command\": \"echo alive\"}");
        ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "alive\n");
        json_decref(res);
    }
    lbt_json(&d, "GET", "/metrics", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    snprintf(metrics_want, sizeof(metrics_want),
             "lendbox_reconciled_total{result=\"adopted\"} 10\n");
    ck_assert_msg(strstr(r.body, metrics_want), "metrics: %s", r.body);
    ck_assert(strstr(r.body, "lendbox_reconciled_total{result=\"orphan_stopped\"} 1\n"));
    ck_assert(strstr(r.body, "lendbox_provider_member_calls_total{provider=\"lxd\""));
    /* the live sandboxes per member, as LXD places them (the orphan has no record) */
    {
        int on_a = 0, on_b = 0;

        for (int i = 0; i < 10; i++) {
            char where[64];

            lbt_lxd_location(ids[i], where, sizeof(where));
            on_a += strcmp(where, "a") == 0;
            on_b += strcmp(where, "b") == 0;
        }
        ck_assert_int_eq(on_a + on_b, 10);
        for (int m = 0; m < 2; m++) {
            int want = m ? on_b : on_a;

            snprintf(metrics_want, sizeof(metrics_want),
                     "lendbox_provider_member_sandboxes{provider=\"lxd\",member=\"%s\"} %d\n",
                     m ? "b" : "a", want);
            if (want > 0 && !strstr(r.body, metrics_want))
                fprintf(stderr, "/metrics:\n%s\n", r.body);
            ck_assert_msg(want == 0 || strstr(r.body, metrics_want),
                          "no '%s' in /metrics (printed above)", metrics_want);
        }
    }
    lbt_resp_free(&r);
    lbt_daemon_cleanup(&d);
    for (int i = 0; i < 10; i++)
        ck_assert(wait_instance_gone(ids[i], 60));
}
END_TEST

/* --- member b dies: release 502 keeps the record, the retry loop finishes once b is back; the
 * shutdown sweep with b down is bounded and leaves stop_failed records --- */
START_TEST(test_member_b_down)
{
    static const char *const extra[] = {
        "--set", "lxd.target=b",          "--set", "lending.stop_timeout_s=20",
        "--set", "lxd.call_timeout_s=20", "--set", "lending.retry_base_s=1",
        "--set", "lending.retry_max_s=2", "--set", "lending.drain_timeout_s=1",
        NULL};
    struct lbt_daemon d;
    struct lbt_resp r;
    char where[64], st[64], s1[64], s2[64], s3[64];
    json_t *lease;
    double t0, took;

    lbt_daemon_start(&d, extra);
    lease = lbt_seed(&d, "down-1", "t", NULL);
    snprintf(s1, sizeof(s1), "%s", sid_of(lease));
    json_decref(lease);
    lease = lbt_seed(&d, "down-2", "t", NULL);
    snprintf(s2, sizeof(s2), "%s", sid_of(lease));
    json_decref(lease);
    lbt_lxd_location(s1, where, sizeof(where));
    ck_assert_str_eq(where, "b");
    ck_assert_int_eq(lbt_lxd_cluster("stop-member b"), 0);

    /* release: 502, the record kept */
    lbt_json(&d, "POST", "/v1/sessions/down-1/release", "", NULL, &r);
    lbt_assert_error(&r, 502, "provider_error");
    lbt_resp_free(&r);
    record_state(&d, s1, st, sizeof(st));
    ck_assert_str_eq(st, "stop_failed");
    /* a seed placed on the dead member fails fast */
    t0 = lbt_now();
    lbt_json(&d, "POST", "/v1/sessions/down-9/seed", "", "{\"task_id\": \"t\"}", &r);
    lbt_assert_error(&r, 502, "provider_error");
    lbt_resp_free(&r);
    ck_assert_msg(lbt_now() - t0 < 25, "a seed on a dead member took %.1f s", lbt_now() - t0);

    /* b back: the retry loop completes the stop */
    ck_assert_int_eq(lbt_lxd_cluster("start-member b"), 0);
    ck_assert(wait_record_state(&d, s1, "stopped", 120));
    ck_assert(wait_instance_gone(s1, 30));

    /* the shutdown sweep with b down: bounded, records left stop_failed */
    lease = lbt_seed(&d, "down-3", "t", NULL);
    snprintf(s3, sizeof(s3), "%s", sid_of(lease));
    json_decref(lease);
    ck_assert_int_eq(lbt_lxd_cluster("stop-member b"), 0);
    t0 = lbt_now();
    ck_assert_int_eq(lbt_daemon_stop(&d), 0);
    took = lbt_now() - t0;
    /* stop_timeout_s (20) per stop, all in parallel, plus drain and exit */
    ck_assert_msg(took < 45, "the sweep with b down took %.1f s", took);
    /* the next start, b still down: the records are stop_failed (or being stopped again) */
    lbt_daemon_restart(&d, extra);
    record_state(&d, s2, st, sizeof(st));
    ck_assert_msg(strcmp(st, "stop_failed") == 0 || strcmp(st, "stopping") == 0, "s2: %s", st);
    record_state(&d, s3, st, sizeof(st));
    ck_assert_msg(strcmp(st, "stop_failed") == 0 || strcmp(st, "stopping") == 0, "s3: %s", st);
    ck_assert_int_eq(lbt_lxd_cluster("start-member b"), 0);
    ck_assert(wait_record_state(&d, s2, "stopped", 120));
    ck_assert(wait_record_state(&d, s3, "stopped", 120));
    ck_assert(wait_instance_gone(s2, 30));
    ck_assert(wait_instance_gone(s3, 30));
    lbt_daemon_cleanup(&d);
}
END_TEST

/* Run lendboxd with args to its end (at most 60 s): its exit status; its output into log. */
static int daemon_run_to_end(const char *const *args, const char *log)
{
    const char *bin = getenv("LENDBOXD") ? getenv("LENDBOXD") : "build/lendboxd";
    const char *argv[32];
    int n = 0, st = -1;
    pid_t pid;

    argv[n++] = bin;
    for (int i = 0; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *f = freopen(log, "w", stderr);

        if (!f || dup2(fileno(stderr), 1) < 0)
            _exit(127);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 600; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        lbt_sleep_ms(100);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

/* --- HTTPS with a client certificate and the cluster's key pinned; a wrong pin stops startup
 * --- */
START_TEST(test_https_pinned)
{
    char member_dir[600], base[600], url[128], url_set[160], cert_set[700], key_set[700],
        server_set[700], wrong_set[700], log[700], *slash;
    const char *sock = lbt_variant_lxd_socket();
    const char *addr;
    struct lbt_daemon d;
    json_t *j, *lease, *res;
    struct lbt_resp r;
    FILE *f;
    char text[8192] = "";
    size_t got;

    ck_assert_ptr_nonnull(sock);
    snprintf(member_dir, sizeof(member_dir), "%s", sock);
    *strrchr(member_dir, '/') = '\0';
    snprintf(base, sizeof(base), "%s", member_dir);
    slash = strrchr(base, '/');
    *slash = '\0';
    j = lbt_lxd_get("/1.0");
    addr = json_string_value(json_object_get(
        json_object_get(json_object_get(j, "metadata"), "config"), "core.https_address"));
    snprintf(url, sizeof(url), "%s", addr ? addr : "");
    json_decref(j);
    snprintf(cert_set, sizeof(cert_set), "%s/client.crt", base);
    snprintf(server_set, sizeof(server_set), "%s/cluster.crt", member_dir);
    if (!url[0] || !lbt_path_exists(cert_set) || !lbt_path_exists(server_set)) {
        lbt_skip_note(__func__, "the cluster has no HTTPS address or no client certificate "
                                "(scripts/lxd-cluster makes both)");
        return;
    }
    snprintf(url_set, sizeof(url_set), "lxd.url=https://%s", url);
    snprintf(cert_set, sizeof(cert_set), "lxd.cert=%s/client.crt", base);
    snprintf(key_set, sizeof(key_set), "lxd.key=%s/client.key", base);
    snprintf(server_set, sizeof(server_set), "lxd.server_cert=%s/cluster.crt", member_dir);
    {
        const char *extra[] = {"--set", "lxd.socket=", "--set", url_set,    "--set", cert_set,
                               "--set", key_set,       "--set", server_set, NULL};

        lbt_daemon_start(&d, extra);
    }
    lease = lbt_seed(&d, "tls-1", "t", NULL);
    res = lbt_exec_ok(&d, sid_of(lease), "", "{\"command\": \"echo over tls\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "over tls\n");
    json_decref(res);
    lbt_json(&d, "POST", "/v1/sessions/tls-1/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    ck_assert_int_eq(instance_code(sid_of(lease)), 404);
    json_decref(lease);
    ck_assert_int_eq(lbt_daemon_stop(&d), 0);
    /* the client's own certificate as the server's: its key is not the cluster's */
    snprintf(wrong_set, sizeof(wrong_set), "lxd.server_cert=%s/client.crt", base);
    snprintf(log, sizeof(log), "%s.wrong-pin.log", d.state_dir);
    {
        const char *args[] = {
            "--state-dir", d.state_dir,   "--listen", "127.0.0.1:0", "--set", "provider.name=lxd",
            "--set",       "lxd.socket=", "--set",    url_set,       "--set", cert_set,
            "--set",       key_set,       "--set",    wrong_set,     NULL};

        ck_assert_int_ne(daemon_run_to_end(args, log), 0);
    }
    f = fopen(log, "r");
    ck_assert_ptr_nonnull(f);
    got = fread(text, 1, sizeof(text) - 1, f);
    text[got] = '\0';
    fclose(f);
    unlink(log);
    ck_assert_msg(strstr(text, "pinned"), "a wrong pin: %s", text);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* --- lendboxd image import --provider lxd --- */

/* Run `lendboxd -c conf -s state image import --provider lxd SOURCE NAME`; its one stdout
 * line into line (asserts exit 0). */
static void import_lxd(const char *conf, const char *state, const char *source, const char *name,
                       char *line, size_t size)
{
    const char *bin = getenv("LENDBOXD") ? getenv("LENDBOXD") : "build/lendboxd";
    char cmd[2048];
    FILE *p;
    int st;

    snprintf(cmd, sizeof(cmd), "'%s' -c '%s' -s '%s' image import --provider lxd '%s' '%s'", bin,
             conf, state, source, name);
    p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    line[0] = '\0';
    if (!fgets(line, (int)size, p))
        line[0] = '\0';
    st = pclose(p);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "image import failed: %s", cmd);
    line[strcspn(line, "\n")] = '\0';
}

/* The fingerprint an LXD alias names ("" when none). */
static void alias_target(const char *name, char *buf, size_t size)
{
    char path[256];
    json_t *j;

    snprintf(path, sizeof(path), "/1.0/images/aliases/%s", name);
    j = lbt_lxd_get(path);
    ck_assert_ptr_nonnull(j);
    snprintf(buf, size, "%s",
             json_string_value(json_object_get(json_object_get(j, "metadata"), "target")) ?: "");
    json_decref(j);
}

/* An image of the images issue (tests/images/make-test-image: three layers, a whiteout, no
 * /sbin/init) imported into the cluster through member a's socket as a unified tarball; a seed
 * naming it runs on it with lendbox-supervise as its init; the same tarball again is only
 * re-aliased; another image under the same name moves the alias. */
START_TEST(test_image_import_lxd)
{
    const char *src = getenv("LENDBOX_SRCDIR") ? getenv("LENDBOX_SRCDIR") : ".";
    const char *sup =
        getenv("LENDBOX_SUPERVISE") ? getenv("LENDBOX_SUPERVISE") : "build/lendbox-supervise";
    char tmpl[] = "/tmp/lbt-lxd-image-XXXXXX", cmd[1024], conf[300], state[300], name[64];
    char line[512], line2[512], fp[80], fp2[80], target[80], want[160], path[256];
    struct lbt_daemon d;
    struct lbt_resp r;
    struct stat st;
    json_t *lease, *res, *j;
    const char *out;
    FILE *f;

    ck_assert_ptr_nonnull(mkdtemp(tmpl));
    snprintf(name, sizeof(name), "lbt-imported-%d", (int)getpid());
    for (int i = 1; i <= 2; i++) {
        snprintf(cmd, sizeof(cmd),
                 "'%s/tests/images/make-test-image' '%s/img%d' lxd-imported-%d >&2", src, tmpl, i,
                 i);
        ck_assert_int_eq(system(cmd), 0);
    }
    snprintf(conf, sizeof(conf), "%s/lendbox.conf", tmpl);
    snprintf(state, sizeof(state), "%s/state", tmpl);
    f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "[lxd]\nsocket = %s\n", lbt_variant_lxd_socket());
    fclose(f);

    /* "lxd NAME FINGERPRINT BYTES (lendbox-supervise as /sbin/init)" */
    snprintf(path, sizeof(path), "%s/img1/image.tar", tmpl);
    import_lxd(conf, state, path, name, line, sizeof(line));
    ck_assert_msg(sscanf(line, "lxd %*s %79s", fp) == 1 && strlen(fp) == 64, "%s", line);
    snprintf(want, sizeof(want), "lxd %s %s ", name, fp);
    ck_assert_msg(strncmp(line, want, strlen(want)) == 0, "%s", line);
    ck_assert_msg(strstr(line, "(lendbox-supervise as /sbin/init)"), "%s", line);
    alias_target(name, target, sizeof(target));
    ck_assert_str_eq(target, fp);

    /* a seed naming it: the image's files (layer 3's whiteout applied), the supervisor as
     * /sbin/init, pid 1 */
    lbt_daemon_start(&d, NULL);
    snprintf(want, sizeof(want), "\"image\": \"%s\"", name);
    lease = lbt_seed(&d, "img-1", "t", want);
    res = lbt_exec_ok(&d, sid_of(lease), "",
                      "{\"command\": \"grep ^ID= /etc/os-release; cat /srv/layer3.txt; "
                      "test -e /etc/gone.txt || echo no-gone; wc -c < /sbin/init; "
                      "tr '\\\\0' ' ' < /proc/1/cmdline; echo\"}");
    out = json_string_value(json_object_get(res, "stdout"));
    ck_assert_int_eq(stat(sup, &st), 0);
    snprintf(want, sizeof(want), "ID=lxd-imported-1\nlayer3\nno-gone\n%lld\n/sbin/init \n",
             (long long)st.st_size);
    ck_assert_str_eq(out, want);
    json_decref(res);
    lbt_json(&d, "POST", "/v1/sessions/img-1/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    ck_assert_int_eq(instance_code(sid_of(lease)), 404);
    json_decref(lease);
    lbt_daemon_cleanup(&d);

    /* another image under the same name moves the alias (the first stays in LXD) */
    snprintf(path, sizeof(path), "%s/img2/image.tar", tmpl);
    import_lxd(conf, state, path, name, line2, sizeof(line2));
    ck_assert_msg(sscanf(line2, "lxd %*s %79s", fp2) == 1 && strlen(fp2) == 64, "%s", line2);
    ck_assert_str_ne(fp2, fp);
    alias_target(name, target, sizeof(target));
    ck_assert_str_eq(target, fp2);
    snprintf(path, sizeof(path), "/1.0/images/%s", fp);
    j = lbt_lxd_get(path);
    ck_assert_int_eq(json_integer_value(json_object_get(j, "status_code")), 200);
    json_decref(j);

    /* cleanup: the alias and both images */
    snprintf(path, sizeof(path), "/1.0/images/aliases/%s", name);
    json_decref(lbt_lxd_request("DELETE", path, NULL));
    snprintf(path, sizeof(path), "/1.0/images/%s", fp);
    json_decref(lbt_lxd_request("DELETE", path, NULL));
    snprintf(path, sizeof(path), "/1.0/images/%s", fp2);
    json_decref(lbt_lxd_request("DELETE", path, NULL));
    alias_target(name, target, sizeof(target));
    ck_assert_str_eq(target, "");
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpl);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void)
{
    Suite *s;
    TCase *tc;

    if (!lbt_variant_is("lxd")) {
        printf("test_lxd: SKIP: runs on the lxd variant (make e2e-lxd, LENDBOX_E2E_VARIANT=lxd)\n");
        return 0;
    }
    s = suite_create("lxd");
    tc = tcase_create("cluster");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_member_b_through_a);
    tcase_add_test(tc, test_octet_stream_round_trip);
    tcase_add_test(tc, test_kill9_adopt_and_orphan);
    tcase_add_test(tc, test_https_pinned);
    tcase_add_test(tc, test_supervisor_bound);
    suite_add_tcase(s, tc);
    tc = tcase_create("image");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_image_import_lxd);
    suite_add_tcase(s, tc);
    tc = tcase_create("member_down");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_member_b_down);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
