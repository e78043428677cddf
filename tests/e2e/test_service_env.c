/*
 * test_service_env.c - acceptance: what a sandbox must not inherit from the daemon's service
 * environment. Its open-file limit is local.sandbox_nofile, not the daemon's (the unit sets
 * LimitNOFILE=1048576); on v1/hybrid hosts its processes are outside the daemon's cgroups in
 * the hierarchies systemd tracks units by (name=systemd, unified), so `systemctl kill` and
 * restarts of the unit never count or signal them. The same under a real systemd:
 * tests/systemd-unit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <linux/magic.h>

#include "harness.h"

static struct lbt_daemon D;
static char parent[64];

static char set_parent[96];
static const char *const ARGS[] = {"--set", "local.sandbox_nofile=321", "--set", set_parent, NULL};

static void prepare(void)
{
    snprintf(parent, sizeof(parent), "lbt-svc-%d", (int)getpid());
    snprintf(set_parent, sizeof(set_parent), "local.cgroup_parent=%s", parent);
}

static void release(void)
{
    char cmd[256];

    snprintf(cmd, sizeof(cmd), "rmdir /sys/fs/cgroup/*/%s /sys/fs/cgroup/%s 2>/dev/null", parent,
             parent);
    (void)!system(cmd);
}

START_TEST(test_sandbox_nofile_is_its_own)
{
    json_t *lease = lbt_seed(&D, "svc-nofile", "t", NULL);
    const char *id = json_string_value(json_object_get(lease, "sandbox_id"));
    struct rlimit mine;
    char *out;

    /* the exec's limits, and the sandbox init's (pid 1 inside) */
    out = lbt_sh(&D, id, "ulimit -n; ulimit -Hn; grep 'open files' /proc/1/limits");
    ck_assert_msg(!strncmp(out, "321\n321\n", 8), "exec limits: %s", out);
    ck_assert_msg(strstr(out, "321                  321") != NULL, "init limits: %s", out);
    free(out);
    /* the daemon's own limit is untouched (the test runs it with this process's limit) */
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &mine), 0);
    ck_assert_uint_ne(mine.rlim_cur, 321);
    json_decref(lease);
}
END_TEST

static bool mounted_as(const char *path, long magic)
{
    struct statfs st;

    return statfs(path, &st) == 0 && (long)st.f_type == magic;
}

START_TEST(test_sandbox_outside_the_daemon_cgroups)
{
    json_t *lease = lbt_seed(&D, "svc-cgroup", "t", NULL);
    const char *id = json_string_value(json_object_get(lease, "sandbox_id"));
    char want[160], *out;

    snprintf(want, sizeof(want), ":/%s/%s\n", parent, id);
    out = lbt_sh(&D, id, "cat /proc/self/cgroup /proc/1/cgroup");
    if (mounted_as("/sys/fs/cgroup", CGROUP2_SUPER_MAGIC)) {
        char line[200];

        snprintf(line, sizeof(line), "0::/%s/%s\n", parent, id);
        ck_assert_msg(strstr(out, line) != NULL, "v2: %s", out);
    } else {
        char line[200];

        if (mounted_as("/sys/fs/cgroup/systemd", CGROUP_SUPER_MAGIC)) {
            /* both the exec and the init: two lines each */
            const char *p = out;
            int n = 0;

            snprintf(line, sizeof(line), ":name=systemd:/%s/%s\n", parent, id);
            while ((p = strstr(p, line)) != NULL) {
                n++;
                p++;
            }
            ck_assert_msg(n == 2, "name=systemd: %s", out);
        }
        if (mounted_as("/sys/fs/cgroup/unified", CGROUP2_SUPER_MAGIC)) {
            snprintf(line, sizeof(line), "\n0::/%s/%s\n", parent, id);
            ck_assert_msg(strstr(out, line) != NULL, "unified: %s", out);
        }
        if (mounted_as("/sys/fs/cgroup/pids", CGROUP_SUPER_MAGIC)) {
            snprintf(line, sizeof(line), ":pids:/%s/%s\n", parent, id);
            ck_assert_msg(strstr(out, line) != NULL, "pids: %s", out);
        }
    }
    free(out);
    /* and the descriptor names every dir, so a stop removes them all */
    {
        json_t *desc = lbt_read_descriptor(&D, id);
        json_t *dirs = json_object_get(json_object_get(desc, "cgroup"), "dirs");
        struct lbt_resp r;

        ck_assert_int_eq(lbt_count_cgroup_dirs(id), (int)json_array_size(dirs));
        json_decref(desc);
        lbt_json(&D, "POST", "/v1/sessions/svc-cgroup/release", "", NULL, &r);
        ck_assert_int_eq(r.status, 200);
        lbt_resp_free(&r);
        ck_assert_int_eq(lbt_count_cgroup_dirs(id), 0);
    }
    json_decref(lease);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("service_env");
    TCase *tc = tcase_create("service_env");

    lbt_fixture_add(
        tc, &(struct lbt_fixture){.d = &D, .args = ARGS, .prepare = prepare, .release = release},
        true);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_sandbox_nofile_is_its_own);
    tcase_add_test(tc, test_sandbox_outside_the_daemon_cgroups);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
