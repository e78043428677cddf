/*
 * test_fork.c - POST /v1/sandboxes/{id}/fork on the local provider (host and image variants)
 * and the lxd provider (variant lxd: the implicit snapshot is an LXD copy of the parent, each
 * child another copy of that; the snapshot's LXD instance goes with the snapshot); the docker
 * variant does not run it.
 *
 * - a fork of 16 sessions, one of them already live for the same task_id (a seed would reuse
 *   it): exactly that one is 409 conflict (its own sandbox untouched), the other 15 are 200
 *   leases in request order with distinct sandbox ids; each child sees the parent's file
 *   written before the fork (image variant: in its root too); a child's write is seen neither
 *   by another child nor by the parent, the parent's later write by no child; a `sleep` the
 *   parent left running is in no child (/proc); the implicit snapshot is in the images dir
 *   while children live, never in GET /v1/images, and gone (name and stored tree) once the
 *   parent and every child are released
 * - a fork whose every child fails leaves no implicit snapshot behind
 * - bad input: no body object, sessions not an array, empty, 65 (limits.max_fork 64), a
 *   duplicate, an invalid rsid, an unknown member, labels not strings → 400; an operate token →
 *   403; an unknown or released parent → 404; none of them leaves a snapshot or a sandbox
 * - kill -9 of the daemon with the implicit snapshot named and no child started (fault
 *   fork.children=delay), then a restart: the snapshot is collected, no stored tree is left,
 *   and the parent still runs
 * - the children's leases are made durable by one sync after the last child (each child's
 *   commit is left unsynced): when that sync fails (fault store.sync=fail:1), the fork answers
 *   500 naming it, and from then on a seed_batch, a GET of a child's session and a repeated seed
 *   answer 500 too (a failed fsync is not retried); after a restart the sandboxes are there,
 *   lent, a seed of each session returns its own, and a fork answers 200
 */
#include <dirent.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "harness.h"

static struct lbt_daemon D;
static struct lbt_daemon K; /* the crash test's own daemon */

#define SKIP_UNLESS_SNAPSHOTS()                                                                    \
    LBT_SKIP_ON_VARIANT("docker", "fork is checked on the local and lxd providers")

static const char *str(json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* Seed rsid; the sandbox id into sbx and (tok non-NULL) its operate token into tok. */
static void seed(struct lbt_daemon *d, const char *rsid, char *sbx, char *tok)
{
    json_t *lease = lbt_seed(d, rsid, "task-fork", NULL);

    snprintf(sbx, LBT_ID_MAX, "%s", str(lease, "sandbox_id"));
    if (tok)
        snprintf(tok, 256, "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
}

static void fork_req(struct lbt_daemon *d, const char *sbx, const char *token, const char *body,
                     struct lbt_resp *r)
{
    char path[160];

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/fork", sbx);
    lbt_json(d, "POST", path, token, body, r);
}

/* Entries of images dir named fork-* (the implicit snapshots' names). */
static int count_fork_names(struct lbt_daemon *d)
{
    char dir[512];
    struct dirent *de;
    DIR *dp;
    int n = 0;

    snprintf(dir, sizeof(dir), "%s/images", d->state_dir);
    dp = opendir(dir);
    if (!dp)
        return 0;
    while ((de = readdir(dp)))
        n += strncmp(de->d_name, "fork-", 5) == 0;
    closedir(dp);
    return n;
}

/* Stored trees under .store/sha256 (-1: no store yet counts as 0). */
static int count_trees(struct lbt_daemon *d)
{
    char dir[512];
    struct dirent *de;
    DIR *dp;
    int n = 0;

    snprintf(dir, sizeof(dir), "%s/images/.store/sha256", d->state_dir);
    dp = opendir(dir);
    if (!dp)
        return 0;
    while ((de = readdir(dp)))
        n += de->d_name[0] != '.';
    closedir(dp);
    return n;
}

/* GET /v1/images names no fork-* image (and answers 200). */
static void assert_images_hide_forks(struct lbt_daemon *d)
{
    struct lbt_resp r;
    json_t *v;
    size_t i;

    lbt_json(d, "GET", "/v1/images", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    json_array_foreach(json_object_get(r.json, "images"), i, v) {
        ck_assert_msg(strncmp(str(v, "name"), "fork-", 5) != 0, "listed: %s", str(v, "name"));
    }
    lbt_resp_free(&r);
}

/* Variant lxd: the LXD instances that hold snapshots (any daemon's: config
 * user.lendbox.snapshot); -1 elsewhere. */
static int lxd_snapshot_instances(void)
{
    json_t *j, *v;
    size_t i;
    int n = 0;

    if (!lbt_variant_is("lxd"))
        return -1;
    j = lbt_lxd_get("/1.0/instances?recursion=1");
    ck_assert_ptr_nonnull(j);
    json_array_foreach(json_object_get(j, "metadata"), i, v)
        n += json_object_get(json_object_get(v, "config"), "user.lendbox.snapshot") != NULL;
    json_decref(j);
    return n;
}

/* How many processes in sandbox sbx run "sleep 7777" (their /proc cmdlines). */
static int count_marker_sleeps(struct lbt_daemon *d, const char *sbx)
{
    char *text = lbt_sh(d, sbx,
                        "n=0; for c in /proc/[0-9]*/cmdline; do "
                        "if [ \"$(tr '\\0' ' ' < $c 2>/dev/null)\" = 'sleep 7777 ' ]; then "
                        "n=$((n+1)); fi; done; echo $n");
    int n = atoi(text);

    free(text);
    return n;
}

#define N_KIDS 16
#define LIVE_KID 7

START_TEST(test_fork_16)
{
    char parent[LBT_ID_MAX], live[LBT_ID_MAX], kid[N_KIDS][LBT_ID_MAX], rsid[32], *text;
    json_t *body = json_pack("{s:[],s:s}", "sessions", "task_id", "task-fork"), *res;
    const bool image = !lbt_variant_on_host();
    int trees_before, lxd_before;
    struct lbt_resp r;
    char *req;

    SKIP_UNLESS_SNAPSHOTS();
    trees_before = count_trees(&D);
    lxd_before = lxd_snapshot_instances();
    seed(&D, "rs-fork-parent", parent, NULL);
    seed(&D, "rs-fork-07", live, NULL);
    free(lbt_sh(&D, parent, "echo parent-before > /workspace/pfile"));
    if (image) /* the root layer comes too */
        free(lbt_sh(&D, parent, "mkdir -p /opt/fork && echo root-before > /opt/fork/r"));
    json_decref(lbt_exec_ok(&D, parent, "",
                            "{\"command\": \"sleep 7777 >/dev/null 2>&1 &\", "
                            "\"preserve_background_services\": true}"));
    ck_assert_int_eq(count_marker_sleeps(&D, parent), 1); /* the check sees it where it runs */
    for (int i = 0; i < N_KIDS; i++) {
        snprintf(rsid, sizeof(rsid), "rs-fork-%02d", i);
        json_array_append_new(json_object_get(body, "sessions"), json_string(rsid));
    }
    req = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    fork_req(&D, parent, "", req, &r);
    free(req);
    ck_assert_msg(r.status == 200, "fork: %ld %s", r.status, r.body);
    ck_assert_int_eq(json_array_size(json_object_get(r.json, "children")), N_KIDS);
    for (int i = 0; i < N_KIDS; i++) {
        json_t *c = json_array_get(json_object_get(r.json, "children"), i);

        snprintf(rsid, sizeof(rsid), "rs-fork-%02d", i);
        ck_assert_str_eq(str(c, "rsid"), rsid);
        if (i == LIVE_KID) {
            ck_assert_int_eq(json_integer_value(json_object_get(c, "status")), 409);
            ck_assert_str_eq(str(json_object_get(c, "error"), "code"), "conflict");
            ck_assert_ptr_nonnull(str(json_object_get(c, "error"), "message"));
            ck_assert_ptr_null(json_object_get(c, "lease"));
            kid[i][0] = '\0';
            continue;
        }
        ck_assert_msg(json_integer_value(json_object_get(c, "status")) == 200, "child %d: %s", i,
                      r.body);
        ck_assert_ptr_null(json_object_get(c, "error"));
        res = json_object_get(c, "lease");
        ck_assert_str_eq(str(res, "resources_session_id"), rsid);
        snprintf(kid[i], LBT_ID_MAX, "%s", str(res, "sandbox_id"));
        ck_assert_str_ne(kid[i], parent);
        ck_assert_str_ne(kid[i], live);
        for (int k = 0; k < i; k++)
            if (kid[k][0])
                ck_assert_str_ne(kid[i], kid[k]);
    }
    lbt_resp_free(&r);
    /* the session that was live keeps its own sandbox */
    lbt_json(&D, "GET", "/v1/sessions/rs-fork-07", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(str(r.json, "sandbox_id"), live);
    lbt_resp_free(&r);
    ck_assert_int_eq(count_fork_names(&D), 1);
    assert_images_hide_forks(&D);
    if (lxd_before >= 0) /* the implicit snapshot's own LXD instance */
        ck_assert_int_eq(lxd_snapshot_instances(), lxd_before + 1);

    free(lbt_sh(&D, parent, "echo parent-after > /workspace/later"));
    free(lbt_sh(&D, kid[0], "echo kid0 > /workspace/kid0"));
    for (int i = 0; i < N_KIDS; i++) {
        if (!kid[i][0])
            continue;
        text = lbt_sh(&D, kid[i],
                      "cat /workspace/pfile; test -e /workspace/later && echo later; "
                      "test -e /workspace/kid0 && echo kid0; true");
        ck_assert_str_eq(text, i == 0 ? "parent-before\nkid0\n" : "parent-before\n");
        free(text);
        if (image) {
            text = lbt_sh(&D, kid[i], "cat /opt/fork/r");
            ck_assert_str_eq(text, "root-before\n");
            free(text);
        }
        ck_assert_int_eq(count_marker_sleeps(&D, kid[i]), 0);
    }
    text = lbt_sh(&D, parent, "test -e /workspace/kid0 && echo kid0; cat /workspace/later");
    ck_assert_str_eq(text, "parent-after\n");
    free(text);
    ck_assert_int_eq(count_marker_sleeps(&D, parent), 1);

    /* the children hold the implicit snapshot; released with the parent, it goes */
    lbt_release_session(&D, "rs-fork-parent");
    ck_assert_int_eq(count_fork_names(&D), 1);
    for (int i = 0; i < N_KIDS; i++) {
        snprintf(rsid, sizeof(rsid), "rs-fork-%02d", i);
        if (i != LIVE_KID)
            lbt_release_session(&D, rsid);
        if (i < N_KIDS - 1 && i != LIVE_KID)
            ck_assert_int_eq(count_fork_names(&D), 1); /* still stood on */
    }
    ck_assert_int_eq(count_fork_names(&D), 0);
    lbt_release_session(&D, "rs-fork-07");
    ck_assert_int_eq(count_trees(&D), trees_before);
    ck_assert_int_eq(lxd_snapshot_instances(), lxd_before); /* lxd: gone with it */
    assert_images_hide_forks(&D);
}
END_TEST

/* Bytes used on the tmpfs at <state_dir>/sandboxes/<id>/img (the sandbox's disk: its root
 * layer and workdir writes), -1 when it is not a tmpfs of its own. */
static long long img_used_bytes(struct lbt_daemon *d, const char *id)
{
    char path[512];
    struct statfs sf;

    snprintf(path, sizeof(path), "%s/sandboxes/%s/img", d->state_dir, id);
    if (statfs(path, &sf) < 0 || sf.f_type != TMPFS_MAGIC)
        return -1;
    return (long long)(sf.f_blocks - sf.f_bfree) * (long long)sf.f_bsize;
}

/* A child of a parent with 48 MiB in its workdir copies none of it (the stored workspace is
 * the lower layer of the child's workdir): its disk holds a few KiB until it writes, it sees
 * the parent's file byte for byte, with the workdir's owner and mode, and its own write of that
 * file is its own (copied up), seen by neither the parent nor the other child. Local provider
 * (host and image variants): the others keep their children's disks in their engines. */
START_TEST(test_children_copy_nothing)
{
    char parent[LBT_ID_MAX], kid[2][LBT_ID_MAX], *text, *want;
    struct lbt_resp r;

    SKIP_UNLESS_SNAPSHOTS();
    LBT_SKIP_ON_VARIANT("lxd", "an LXD child's disk is LXD's copy of the snapshot");
    seed(&D, "rs-nocopy-parent", parent, NULL);
    free(lbt_sh(&D, parent,
                "head -c 50331648 /dev/zero > /workspace/big && echo tail >> /workspace/big && "
                "mkdir /workspace/d && echo in-d > /workspace/d/f && echo hl > /workspace/h1 && "
                "ln /workspace/h1 /workspace/h2"));
    fork_req(&D, parent, "", "{\"sessions\": [\"rs-nocopy-0\", \"rs-nocopy-1\"]}", &r);
    ck_assert_msg(r.status == 200, "fork: %ld %s", r.status, r.body);
    for (int i = 0; i < 2; i++) {
        json_t *c = json_array_get(json_object_get(r.json, "children"), i);

        ck_assert_msg(json_integer_value(json_object_get(c, "status")) == 200, "child %d: %s", i,
                      r.body);
        snprintf(kid[i], LBT_ID_MAX, "%s", str(json_object_get(c, "lease"), "sandbox_id"));
    }
    lbt_resp_free(&r);
    want = lbt_sh(&D, parent,
                  "stat -c '%a %u %g' /workspace; wc -c < /workspace/big; "
                  "tail -c 5 /workspace/big; md5sum < /workspace/big");
    for (int i = 0; i < 2; i++) {
        long long used = img_used_bytes(&D, kid[i]);

        ck_assert_msg(used >= 0 && used < (8LL << 20), "child %d uses %lld bytes after the fork", i,
                      used);
        text = lbt_sh(&D, kid[i],
                      "stat -c '%a %u %g' /workspace; wc -c < /workspace/big; "
                      "tail -c 5 /workspace/big; md5sum < /workspace/big");
        ck_assert_str_eq(text, want);
        free(text);
    }
    free(want);
    /* POSIX as on a plain directory: a directory of the snapshot renames in place (rename(2),
     * not mv's copy fallback: no EXDEV), and a hard link of the snapshot stays one file when
     * one of its names is written */
    text = lbt_sh(&D, kid[1],
                  "if command -v python3 >/dev/null; then "
                  "python3 -c \"import os; os.rename('/workspace/d', '/workspace/d2')\"; "
                  "else mv -T /workspace/d /workspace/d2; fi; cat /workspace/d2/f; "
                  "echo changed > /workspace/h1; cat /workspace/h2; stat -c %h /workspace/h2");
    ck_assert_str_eq(text, "in-d\nchanged\n2\n");
    free(text);
    /* the child's write is its own, on its own disk */
    free(lbt_sh(&D, kid[0], "echo kid0 >> /workspace/big"));
    ck_assert_int_ge(img_used_bytes(&D, kid[0]), 48LL << 20);
    text = lbt_sh(&D, kid[0], "tail -c 10 /workspace/big");
    ck_assert_str_eq(text, "tail\nkid0\n");
    free(text);
    for (int i = 0; i < 2; i++) {
        text = lbt_sh(&D, i == 0 ? parent : kid[1], "tail -c 5 /workspace/big");
        ck_assert_str_eq(text, "tail\n");
        free(text);
    }
    lbt_release_session(&D, "rs-nocopy-0");
    lbt_release_session(&D, "rs-nocopy-1");
    lbt_release_session(&D, "rs-nocopy-parent");
    ck_assert_int_eq(count_fork_names(&D), 0);
}
END_TEST

START_TEST(test_all_children_fail)
{
    char parent[LBT_ID_MAX], live[LBT_ID_MAX];
    int trees_before;
    struct lbt_resp r;
    json_t *c;

    SKIP_UNLESS_SNAPSHOTS();
    trees_before = count_trees(&D);
    seed(&D, "rs-fail-parent", parent, NULL);
    seed(&D, "rs-fail-live", live, NULL);
    fork_req(&D, parent, "", "{\"sessions\": [\"rs-fail-live\", \"rs-fail-parent\"]}", &r);
    ck_assert_msg(r.status == 200, "fork: %ld %s", r.status, r.body);
    for (int i = 0; i < 2; i++) {
        c = json_array_get(json_object_get(r.json, "children"), i);
        ck_assert_int_eq(json_integer_value(json_object_get(c, "status")), 409);
        ck_assert_str_eq(str(json_object_get(c, "error"), "code"), "conflict");
    }
    lbt_resp_free(&r);
    ck_assert_int_eq(count_fork_names(&D), 0);
    ck_assert_int_eq(count_trees(&D), trees_before);
    lbt_release_session(&D, "rs-fail-parent");
    lbt_release_session(&D, "rs-fail-live");
}
END_TEST

START_TEST(test_bad_input)
{
    static const char *const bad[] = {
        "[\"rs-b1\"]",
        "{}",
        "{\"sessions\": \"rs-b1\"}",
        "{\"sessions\": []}",
        "{\"sessions\": [\"rs-b1\", \"rs-b2\", \"rs-b1\"]}",
        "{\"sessions\": [\"rs-b1\", \"bad rsid\"]}",
        "{\"sessions\": [\"rs-b1\", \"..\"]}",
        "{\"sessions\": [\"rs-b1\", 7]}",
        "{\"sessions\": [\"rs-b1\"], \"image\": \"x\"}",
        "{\"sessions\": [\"rs-b1\"], \"labels\": {\"k\": 1}}",
        "{\"sessions\": [\"rs-b1\"], \"task_id\": \"\"}",
    };
    char a[LBT_ID_MAX], tok[256], path[80];
    json_t *many = json_pack("{s:[]}", "sessions");
    struct lbt_resp r;
    char *body;

    SKIP_UNLESS_SNAPSHOTS();
    seed(&D, "rs-bad-parent", a, tok);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fork_req(&D, a, "", bad[i], &r);
        ck_assert_msg(r.status == 400, "%s: %ld %s", bad[i], r.status, r.body);
        lbt_assert_error(&r, 400, "bad_request");
        lbt_resp_free(&r);
    }
    for (int i = 0; i < 65; i++) { /* one past limits.max_fork */
        char rsid[32];

        snprintf(rsid, sizeof(rsid), "rs-many-%02d", i);
        json_array_append_new(json_object_get(many, "sessions"), json_string(rsid));
    }
    body = json_dumps(many, JSON_COMPACT);
    json_decref(many);
    fork_req(&D, a, "", body, &r);
    free(body);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    fork_req(&D, a, tok, "{\"sessions\": [\"rs-b1\"]}", &r); /* the parent's operate token */
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    fork_req(&D, "sbx-nosuch", "", "{\"sessions\": [\"rs-b1\"]}", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    ck_assert_int_eq(count_fork_names(&D), 0);
    lbt_release_session(&D, "rs-bad-parent");
    fork_req(&D, a, "", "{\"sessions\": [\"rs-b1\"]}", &r); /* released: not running */
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    /* none of them lent anything */
    lbt_json(&D, "GET", "/v1/sessions/rs-b1", "", NULL, &r);
    ck_assert_int_eq(r.status, 404);
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/sessions/rs-many-00");
    lbt_json(&D, "GET", path, "", NULL, &r);
    ck_assert_int_eq(r.status, 404);
    lbt_resp_free(&r);
    ck_assert_int_eq(count_fork_names(&D), 0);
}
END_TEST

START_TEST(test_kill_during_fork)
{
    const char *const args[] = {"--set", "faults.spec=fork.children=delay:60000", NULL};
    char a[LBT_ID_MAX], path[160], *text;
    struct lbt_async *job;
    struct lbt_resp r;
    int trees, i, lxd_before = lxd_snapshot_instances();

    SKIP_UNLESS_SNAPSHOTS();
    lbt_daemon_start(&K, args);
    seed(&K, "rs-kill-parent", a, NULL);
    free(lbt_sh(&K, a, "echo kept > /workspace/f"));
    trees = count_trees(&K);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/fork", a);
    job = lbt_async_json(&K, "POST", path, "", "{\"sessions\": [\"rs-kill-1\", \"rs-kill-2\"]}");
    for (i = 0; i < 400 && count_fork_names(&K) == 0; i++)
        lbt_sleep_ms(50);
    ck_assert_int_lt(i, 400); /* held with the implicit snapshot named */
    ck_assert_int_eq(count_trees(&K), trees + 1);
    lbt_daemon_kill(&K);
    lbt_async_join(job, &r);
    ck_assert_int_ne(r.status, 200);
    lbt_resp_free(&r);

    lbt_daemon_restart(&K, NULL);
    ck_assert_int_eq(count_fork_names(&K), 0); /* collected at the start */
    ck_assert_int_eq(count_trees(&K), trees);
    ck_assert_int_eq(lxd_snapshot_instances(), lxd_before); /* lxd: its instance too */
    lbt_json(&K, "GET", "/v1/sessions/rs-kill-1", "", NULL, &r);
    ck_assert_int_eq(r.status, 404);
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", a);
    lbt_json(&K, "GET", path, "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(str(r.json, "status"), "running");
    lbt_resp_free(&r);
    text = lbt_sh(&K, a, "cat /workspace/f");
    ck_assert_str_eq(text, "kept\n");
    free(text);
    lbt_release_session(&K, "rs-kill-parent"); /* the fixture stops K */
}
END_TEST

/* GET /v1/sessions/rsid's sandbox_id into id (the session must have a lease). */
static void session_sandbox(struct lbt_daemon *d, const char *rsid, char *id)
{
    char path[160];
    struct lbt_resp r;

    snprintf(path, sizeof(path), "/v1/sessions/%s", rsid);
    lbt_json(d, "GET", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "GET %s: %ld %s", path, r.status, r.body);
    ck_assert_str_eq(str(r.json, "state"), "lent");
    snprintf(id, LBT_ID_MAX, "%s", str(r.json, "sandbox_id"));
    lbt_resp_free(&r);
}

START_TEST(test_lease_sync_failure)
{
    const char *const args[] = {"--set", "faults.spec=store.sync=fail:1", NULL};
    static const char *const rsids[] = {"rs-sync-1", "rs-sync-2", "rs-sync-b"};
    char a[LBT_ID_MAX], id[LBT_ID_MAX];
    struct lbt_resp r;
    json_t *lease;

    SKIP_UNLESS_SNAPSHOTS();
    lbt_daemon_start(&K, args);
    seed(&K, "rs-sync-parent", a, NULL);
    fork_req(&K, a, "", "{\"sessions\": [\"rs-sync-1\", \"rs-sync-2\"]}", &r);
    lbt_assert_error(&r, 500, "internal");
    ck_assert_msg(strstr(r.body, "could not be made durable"), "%s", r.body);
    lbt_resp_free(&r);
    /* a failed fsync is not retried: no lease is handed out until the daemon is restarted */
    lbt_json(&K, "POST", "/v1/sessions/seed_batch", "",
             "{\"items\": [{\"rsid\": \"rs-sync-b\", \"task_id\": \"task-fork\"}]}", &r);
    lbt_assert_error(&r, 500, "internal");
    ck_assert_msg(strstr(r.body, "restart lendboxd"), "%s", r.body);
    lbt_resp_free(&r);
    lbt_json(&K, "GET", "/v1/sessions/rs-sync-1", "", NULL, &r);
    lbt_assert_error(&r, 500, "internal");
    lbt_resp_free(&r);
    lbt_json(&K, "POST", "/v1/sessions/rs-sync-1/seed", "", "{\"task_id\": \"task-fork\"}", &r);
    lbt_assert_error(&r, 500, "internal");
    lbt_resp_free(&r);
    /* restarted: the sandboxes were lent and recorded, and a seed of each session (a child has
     * its parent's task_id) returns its own */
    lbt_daemon_kill(&K); /* no shutdown sweep: the sandboxes stay */
    lbt_daemon_restart(&K, NULL);
    for (size_t i = 0; i < sizeof(rsids) / sizeof(rsids[0]); i++) {
        char *out;

        session_sandbox(&K, rsids[i], id);
        lease = lbt_seed(&K, rsids[i], "task-fork", NULL);
        ck_assert_str_eq(str(lease, "sandbox_id"), id);
        ck_assert(json_is_true(json_object_get(lease, "reused")));
        json_decref(lease);
        out = lbt_sh(&K, id, "echo up");
        ck_assert_str_eq(out, "up\n");
        free(out);
    }
    fork_req(&K, a, "", "{\"sessions\": [\"rs-sync-3\"]}", &r);
    ck_assert_msg(r.status == 200, "fork: %ld %s", r.status, r.body);
    ck_assert_int_eq(json_integer_value(json_object_get(
                         json_array_get(json_object_get(r.json, "children"), 0), "status")),
                     200);
    lbt_resp_free(&r);
    lbt_release_session(&K, "rs-sync-3");
    for (size_t i = 0; i < sizeof(rsids) / sizeof(rsids[0]); i++)
        lbt_release_session(&K, rsids[i]);
    lbt_release_session(&K, "rs-sync-parent"); /* the fixture stops K */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fork");
    TCase *tc = tcase_create("fork");

    lbt_shared_daemon(tc, &D, NULL);
    /* lxd: each child is an LXD copy, made one at a time */
    tcase_set_timeout(tc, lbt_variant_is("lxd") ? 300 : 120);
    tcase_add_test(tc, test_fork_16);
    tcase_add_test(tc, test_children_copy_nothing);
    tcase_add_test(tc, test_all_children_fail);
    tcase_add_test(tc, test_bad_input);
    suite_add_tcase(s, tc);
    tc = tcase_create("crash");
    lbt_test_daemon_cleanup(tc, &K);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_kill_during_fork);
    tcase_add_test(tc, test_lease_sync_failure);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
