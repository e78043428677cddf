/*
 * test_restart.c - acceptance: kill -9 the daemon with three sessions lent, start it again on
 * the same state dir: the sandboxes kept running, the sessions are listed with the same
 * sandbox ids, and exec and release work on them. And the shutdown sweep: SIGTERM with three
 * sessions lent stops every sandbox and moves its directory aside (<state_dir>/removed/<id>),
 * which the next start removes.
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static struct lbt_daemon D, S;

/* Start time (field 22 of /proc/PID/stat), 0 if the process is gone or a zombie. */
static unsigned long long start_time(pid_t pid)
{
    char path[64], buf[1024], state;
    unsigned long long st = 0;
    const char *p;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "re");
    if (!f)
        return 0;
    if (!fgets(buf, sizeof(buf), f))
        buf[0] = '\0';
    fclose(f);
    p = strrchr(buf, ')');
    if (!p ||
        sscanf(p + 1,
               " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
               "%*d %llu",
               &state, &st) != 2 ||
        state == 'Z' || state == 'X')
        return 0;
    return st;
}

#define N 3

START_TEST(test_kill_and_restart)
{
    static const char *const rsids[N] = {"restart-1", "restart-2", "restart-3"};
    char ids[N][128], files[200], cmd[200], want[200];
    pid_t init_pid[N];
    unsigned long long init_start[N];
    uid_t uids[N];
    struct lbt_resp r;
    size_t i;
    json_t *v;

    for (int k = 0; k < N; k++) {
        json_t *lease, *desc;
        char *out;

        snprintf(files, sizeof(files), "\"files\": {\"/workspace/who\": \"%s\"}", rsids[k]);
        lease = lbt_seed(&D, rsids[k], "task-restart", files);
        snprintf(ids[k], sizeof(ids[k]), "%s",
                 json_string_value(json_object_get(lease, "sandbox_id")));
        json_decref(lease);
        uids[k] = lbt_sandbox_uid(&D, ids[k]);
        desc = lbt_read_descriptor(&D, ids[k]);
        ck_assert_ptr_nonnull(desc);
        init_pid[k] = (pid_t)json_integer_value(json_object_get(desc, "pid"));
        json_decref(desc);
        ck_assert_int_gt(init_pid[k], 1);
        init_start[k] = start_time(init_pid[k]);
        ck_assert_uint_gt(init_start[k], 0);
        /* state that lives only in the running sandbox: its private /tmp */
        snprintf(cmd, sizeof(cmd), "echo before-kill-%d > /tmp/marker", k);
        out = lbt_sh(&D, ids[k], cmd);
        free(out);
    }

    /* the sandboxes do not depend on the daemon: alive once it is reaped (its death's signals
     * are sent by then), and the very same ones answer after the restart (below) */
    lbt_daemon_kill(&D);
    for (int k = 0; k < N; k++) {
        ck_assert_msg(start_time(init_pid[k]) == init_start[k], "sandbox %s died with the daemon",
                      ids[k]);
        ck_assert_int_gt(lbt_count_live_procs_of_uid(uids[k]), 0);
    }

    lbt_daemon_restart(&D, NULL);
    lbt_json(&D, "GET", "/v1/sessions", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    json_t *sessions = json_object_get(r.json, "sessions");
    ck_assert_msg(json_array_size(sessions) == N, "sessions after restart: %s", r.body);
    for (int k = 0; k < N; k++) {
        bool found = false;

        json_array_foreach(sessions, i, v) {
            if (!strcmp(json_string_value(json_object_get(v, "resources_session_id")), rsids[k])) {
                ck_assert_str_eq(json_string_value(json_object_get(v, "sandbox_id")), ids[k]);
                ck_assert_str_eq(json_string_value(json_object_get(v, "state")), "lent");
                found = true;
            }
        }
        ck_assert_msg(found, "session %s missing after restart: %s", rsids[k], r.body);
    }
    lbt_resp_free(&r);

    for (int k = 0; k < N; k++) {
        char *out;
        int n = -1;

        /* the very same sandbox: same init, same private state */
        ck_assert(start_time(init_pid[k]) == init_start[k]);
        out = lbt_sh(&D, ids[k], "cat /workspace/who; echo; cat /tmp/marker");
        snprintf(want, sizeof(want), "%s\nbefore-kill-%d\n", rsids[k], k);
        ck_assert_str_eq(out, want);
        free(out);
        /* a repeated seed is the same lease */
        json_t *lease = lbt_seed(&D, rsids[k], "task-restart", NULL);
        ck_assert_str_eq(json_string_value(json_object_get(lease, "sandbox_id")), ids[k]);
        ck_assert(json_is_true(json_object_get(lease, "reused")));
        json_decref(lease);
        /* release still works and stops it */
        snprintf(cmd, sizeof(cmd), "/v1/sessions/%s/release", rsids[k]);
        lbt_json(&D, "POST", cmd, "", NULL, &r);
        ck_assert_int_eq(r.status, 200);
        ck_assert(json_is_true(json_object_get(r.json, "released")));
        ck_assert_str_eq(json_string_value(json_object_get(r.json, "sandbox_id")), ids[k]);
        lbt_resp_free(&r);
        for (int t = 0; t < 250 && (n = lbt_count_live_procs_of_uid(uids[k])) > 0; t++)
            lbt_sleep_ms(20);
        ck_assert_int_eq(n, 0);
        ck_assert_uint_eq(start_time(init_pid[k]), 0);
    }
    lbt_json(&D, "GET", "/v1/sessions", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(json_array_size(json_object_get(r.json, "sessions")), 0);
    lbt_resp_free(&r);
}
END_TEST

/* The entries of dir (not . and ..), -1 when it cannot be opened. */
static int dir_entries(const char *dir)
{
    DIR *dh = opendir(dir);
    struct dirent *de;
    int n = 0;

    if (!dh)
        return -1;
    while ((de = readdir(dh)))
        n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    closedir(dh);
    return n;
}

START_TEST(test_shutdown_sweep_moves_dirs_aside)
{
    static const char *const rsids[N] = {"sweep-1", "sweep-2", "sweep-3"};
    char ids[N][128], path[1200], removed[600];
    uid_t uids[N];
    int n = -1;

    lbt_daemon_start(&S, NULL);
    for (int k = 0; k < N; k++) {
        json_t *lease = lbt_seed(&S, rsids[k], "task-sweep", NULL);

        snprintf(ids[k], sizeof(ids[k]), "%s",
                 json_string_value(json_object_get(lease, "sandbox_id")));
        json_decref(lease);
        uids[k] = lbt_sandbox_uid(&S, ids[k]);
        ck_assert_uint_ne(uids[k], 0);
    }
    ck_assert_int_eq(lbt_daemon_stop(&S), 0);
    /* stopped: no process of theirs, no directory among the sandboxes', each one moved aside */
    snprintf(path, sizeof(path), "%s/sandboxes", S.state_dir);
    ck_assert_int_eq(dir_entries(path), 0);
    snprintf(removed, sizeof(removed), "%s/removed", S.state_dir);
    for (int k = 0; k < N; k++) {
        ck_assert_int_eq(lbt_count_live_procs_of_uid(uids[k]), 0);
        snprintf(path, sizeof(path), "%s/%s", removed, ids[k]);
        ck_assert_msg(lbt_path_exists(path), "%s was not moved aside", path);
    }
    /* the next start removes them (in the background: waited for, up to 60 s) */
    lbt_daemon_restart(&S, NULL);
    for (int t = 0; t < 3000 && (n = dir_entries(removed)) > 0; t++)
        lbt_sleep_ms(20);
    ck_assert_int_eq(n, 0);
    /* and their records say stopped */
    json_t *all = lbt_list_sandboxes_but_pool(&S);
    for (int k = 0; k < N; k++) {
        json_t *rec = lbt_find_record(all, ids[k]);

        ck_assert_ptr_nonnull(rec);
        ck_assert_str_eq(json_string_value(json_object_get(rec, "state")), "stopped");
    }
    json_decref(all);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("restart");
    TCase *tc = tcase_create("restart");

    lbt_shared_daemon(tc, &D, NULL);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_kill_and_restart);
    suite_add_tcase(s, tc);
    tc = tcase_create("sweep");
    lbt_test_daemon_cleanup(tc, &S);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_shutdown_sweep_moves_dirs_aside);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
