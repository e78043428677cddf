/*
 * test_lost.c - a lent sandbox whose init dies outside lendbox's control is named lost, and what
 * a sandbox uses is shown.
 *
 * Lost: the sandbox's init is killed from the host (SIGKILL by its host pid from the local
 * descriptor). The next operate-token call finds it (an exec; in another sandbox a file read):
 * 410 sandbox_lost, and so do exec, file reads and writes and PTY creation afterwards; GET shows
 * it stopped with stop_reason lost; the daemon logs it; nothing of it is left on the host (no
 * process of its uid, no cgroup, no mount, no directory); the same session seeds a new sandbox
 * that runs commands. With no call at all, the sweeper's pass finds it (the record list, which
 * asks no provider, shows it stopped, reason lost). On the docker variant: a container removed
 * behind lendbox's back (force, through the engine's API) is found the same way by an exec.
 *
 * Usage: GET /v1/sandboxes/{id} has "usage" with cpu_s after a CPU loop, memory_peak_bytes
 * after a 64 MiB write into the workdir's tmpfs (charged to the sandbox's memory cgroup: a
 * seed with a memory limit, so that cgroup v1 hosts have one), disk_bytes while the file is
 * there, pids and oom_kills; every field is null once the sandbox is stopped. On the docker
 * variant the engine's figures (one stats sample): cpu_s, memory_bytes (the file's tmpfs
 * pages) and pids as plausible numbers (CPU time under the wall time since the seed times the
 * CPUs), disk_bytes and oom_kills null, memory_peak_bytes null or at least memory_bytes. On
 * the lxd variant (the instance's state from LXD) the same, oom_kills null, memory_peak_bytes
 * and disk_bytes where LXD tells them.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define MIB (1024.0 * 1024.0)

static struct lbt_daemon D;

static const char *str(json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

/* Lines of this process's mountinfo that name id (an image sandbox's root mounts). */
static int count_mounts_of(const char *id)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    char line[8192];
    int n = 0;

    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f))
        n += strstr(line, id) != NULL;
    fclose(f);
    return n;
}

/* Is pid gone or a zombie? */
static bool proc_gone(pid_t pid)
{
    char path[64], buf[512], *p;
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "re");
    if (!f)
        return true;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    p = strrchr(buf, ')');
    return !p || p[1] == '\0' || p[2] == 'Z' || p[2] == 'X';
}

/* SIGKILL the sandbox's init from the host and wait (at most 60 s: its exit waits for the
 * kernel to end every process of its pid namespace, seconds on a loaded machine) until it is
 * gone. Returns its uid. */
static uid_t kill_init(const char *id)
{
    json_t *desc = lbt_read_descriptor(&D, id);
    uid_t uid = lbt_sandbox_uid(&D, id);
    pid_t init;

    ck_assert_ptr_nonnull(desc);
    init = (pid_t)json_integer_value(json_object_get(desc, "pid"));
    json_decref(desc);
    ck_assert_int_gt(init, 1);
    ck_assert_int_eq(kill(init, SIGKILL), 0);
    for (int i = 0; i < 2400 && !proc_gone(init); i++)
        lbt_sleep_ms(25);
    ck_assert_msg(proc_gone(init), "init %d still runs 60 s after its SIGKILL", (int)init);
    return uid;
}

/* GET /v1/sandboxes/{id} as admin (asserts 200); the body (caller decrefs). */
static json_t *get_sandbox(const char *id)
{
    char path[160];
    struct lbt_resp r;
    json_t *j;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    lbt_json(&D, "GET", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "GET %s: %ld %s", id, r.status, r.body);
    j = json_incref(r.json);
    lbt_resp_free(&r);
    return j;
}

/* Nothing of the sandbox is left on the host. */
static void assert_nothing_left(const char *id, uid_t uid)
{
    char dir[512];

    snprintf(dir, sizeof(dir), "%s/sandboxes/%s", D.state_dir, id);
    ck_assert_int_eq(lbt_count_live_procs_of_uid(uid), 0);
    ck_assert_int_eq(lbt_count_cgroup_dirs(id), 0);
    ck_assert_int_eq(count_mounts_of(id), 0);
    ck_assert_msg(!lbt_path_exists(dir), "%s is left", dir);
}

static void assert_lost_record(const char *id)
{
    json_t *sbx = get_sandbox(id);

    ck_assert_str_eq(str(sbx, "state"), "stopped");
    ck_assert_str_eq(str(sbx, "status"), "stopped");
    ck_assert_str_eq(str(sbx, "stop_reason"), "lost");
    json_decref(sbx);
}

START_TEST(test_killed_init_is_lost)
{
    static const char *const args[] = {"--set", "lending.sweep_interval_s=3600", NULL};
    json_t *lease, *again, *res;
    char id[64], token[128], path[200];
    struct lbt_resp r;
    uid_t uid;

    LBT_SKIP_ON_ENGINE("it kills the sandbox's init by its host pid from the local descriptor");
    lbt_daemon_start(&D, args);
    lease = lbt_seed(&D, "lost-1", "t", NULL);
    snprintf(id, sizeof(id), "%s", str(lease, "sandbox_id"));
    snprintf(token, sizeof(token), "%s", str(json_object_get(lease, "access"), "token"));
    res = lbt_exec_ok(&D, id, token, "{\"command\": \"echo up\"}");
    ck_assert_str_eq(str(res, "stdout"), "up\n");
    json_decref(res);

    uid = kill_init(id);
    /* the next operate call finds it: 410, not a result, not 404 or 502 */
    lbt_exec(&D, id, token, "{\"command\": \"echo hi\"}", &r);
    lbt_assert_error(&r, 410, "sandbox_lost");
    lbt_resp_free(&r);
    assert_lost_record(id);
    ck_assert_int_eq(lbt_log_count(&D, "was lost (found by an operation)"), 1);

    /* and every operate call after it, also with the admin token */
    lbt_exec(&D, id, token, "{\"command\": \"echo hi\"}", &r);
    lbt_assert_error(&r, 410, "sandbox_lost");
    lbt_resp_free(&r);
    lbt_exec(&D, id, "", "{\"command\": \"echo hi\"}", &r);
    lbt_assert_error(&r, 410, "sandbox_lost");
    lbt_resp_free(&r);
    lbt_file_get(&D, id, token, "/etc/hostname", &r);
    lbt_assert_error(&r, 410, "sandbox_lost");
    lbt_resp_free(&r);
    lbt_file_put(&D, id, token, "/tmp/x", NULL, "x", 1, &r);
    lbt_assert_error(&r, 410, "sandbox_lost");
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pty", id);
    lbt_json(&D, "POST", path, token, "{\"command\": \"sh\"}", &r);
    lbt_assert_error(&r, 410, "sandbox_lost");
    lbt_resp_free(&r);

    /* its stop ran: nothing of it is left */
    assert_nothing_left(id, uid);

    /* the session seeds again: a new sandbox that runs commands */
    again = lbt_seed(&D, "lost-1", "t", NULL);
    ck_assert_str_ne(str(again, "sandbox_id"), id);
    res = lbt_exec_ok(&D, str(again, "sandbox_id"), "", "{\"command\": \"echo new\"}");
    ck_assert_str_eq(str(res, "stdout"), "new\n");
    json_decref(res);
    lbt_release_session(&D, "lost-1");
    /* the lost one's record still says so */
    assert_lost_record(id);
    json_decref(again);
    json_decref(lease);
}
END_TEST

START_TEST(test_file_read_finds_lost)
{
    static const char *const args[] = {"--set", "lending.sweep_interval_s=3600", NULL};
    json_t *lease;
    char id[64], token[128];
    struct lbt_resp r;
    uid_t uid;

    LBT_SKIP_ON_ENGINE("it kills the sandbox's init by its host pid from the local descriptor");
    lbt_daemon_start(&D, args);
    lease = lbt_seed(&D, "lost-2", "t", NULL);
    snprintf(id, sizeof(id), "%s", str(lease, "sandbox_id"));
    snprintf(token, sizeof(token), "%s", str(json_object_get(lease, "access"), "token"));
    uid = kill_init(id);
    lbt_file_get(&D, id, token, "/etc/hostname", &r);
    lbt_assert_error(&r, 410, "sandbox_lost");
    lbt_resp_free(&r);
    assert_lost_record(id);
    assert_nothing_left(id, uid);
    /* a missing file of a running sandbox is still 404, not a loss */
    json_decref(lease);
    lease = lbt_seed(&D, "lost-2", "t", NULL);
    lbt_file_get(&D, str(lease, "sandbox_id"), "", "/no/such/file", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    lbt_release_session(&D, "lost-2");
    json_decref(lease);
}
END_TEST

START_TEST(test_sweeper_finds_lost)
{
    static const char *const args[] = {"--set", "lending.sweep_interval_s=1", NULL};
    json_t *lease, *list = NULL, *rec = NULL;
    char id[64];
    struct lbt_resp r;
    uid_t uid;

    LBT_SKIP_ON_ENGINE("it kills the sandbox's init by its host pid from the local descriptor");
    lbt_daemon_start(&D, args);
    lease = lbt_seed(&D, "lost-3", "t", NULL);
    snprintf(id, sizeof(id), "%s", str(lease, "sandbox_id"));
    uid = kill_init(id);
    /* no call on it: the record list (no provider call) shows what the sweeper did */
    for (int i = 0; i < 100; i++) {
        json_decref(list);
        list = lbt_list_sandboxes(&D);
        rec = lbt_find_record(list, id);
        ck_assert_ptr_nonnull(rec);
        if (strcmp(str(rec, "state"), "stopped") == 0)
            break;
        lbt_sleep_ms(100);
    }
    ck_assert_str_eq(str(rec, "state"), "stopped");
    ck_assert_str_eq(str(rec, "stop_reason"), "lost");
    json_decref(list);
    ck_assert_int_eq(lbt_log_count(&D, "was lost (found by the sweeper)"), 1);
    assert_nothing_left(id, uid);
    lbt_exec(&D, id, "", "{\"command\": \"true\"}", &r);
    lbt_assert_error(&r, 410, "sandbox_lost");
    lbt_resp_free(&r);
    json_decref(lease);
}
END_TEST

START_TEST(test_removed_container_is_lost)
{
    static const char *const args[] = {"--set", "lending.sweep_interval_s=3600", NULL};
    json_t *lease, *again, *res;
    char id[64], token[128];
    struct lbt_resp r;

    if (!lbt_variant_is("docker")) {
        lbt_skip_note(__func__, "about a docker container removed behind lendbox's back");
        return;
    }
    lbt_daemon_start(&D, args);
    lease = lbt_seed(&D, "lost-dk", "t", NULL);
    snprintf(id, sizeof(id), "%s", str(lease, "sandbox_id"));
    snprintf(token, sizeof(token), "%s", str(json_object_get(lease, "access"), "token"));
    ck_assert_int_eq(lbt_variant_remove_containers(id), 1);
    lbt_exec(&D, id, token, "{\"command\": \"echo hi\"}", &r);
    lbt_assert_error(&r, 410, "sandbox_lost");
    lbt_resp_free(&r);
    assert_lost_record(id);
    ck_assert_int_eq(lbt_log_count(&D, "was lost (found by an operation)"), 1);
    lbt_file_get(&D, id, token, "/etc/hostname", &r);
    lbt_assert_error(&r, 410, "sandbox_lost");
    lbt_resp_free(&r);
    ck_assert_int_eq(lbt_variant_count_containers(id, false), 0);
    again = lbt_seed(&D, "lost-dk", "t", NULL);
    ck_assert_str_ne(str(again, "sandbox_id"), id);
    res = lbt_exec_ok(&D, str(again, "sandbox_id"), "", "{\"command\": \"echo new\"}");
    ck_assert_str_eq(str(res, "stdout"), "new\n");
    json_decref(res);
    lbt_release_session(&D, "lost-dk");
    json_decref(again);
    json_decref(lease);
}
END_TEST

/* A figure of u: its integer, or -1 when it is null (unknown). */
static int64_t figure(json_t *u, const char *k)
{
    json_t *v = json_object_get(u, k);

    ck_assert_msg(json_is_integer(v) || json_is_null(v), "%s is neither a number nor null", k);
    return json_is_null(v) ? -1 : (int64_t)json_integer_value(v);
}

/* The figures every provider gives of a running sandbox, and the ones an engine provider
 * leaves null: docker (podman's stats) has no disk, no OOM kills and, but on cgroup v1
 * Docker, no peak; LXD no OOM kills, and a peak and disk only where its host tells them. A
 * peak, where given, is at least what is charged now. */
static void assert_usage_running(json_t *u)
{
    int64_t mem = figure(u, "memory_bytes"), peak = figure(u, "memory_peak_bytes");

    ck_assert_msg(json_is_number(json_object_get(u, "cpu_s")), "cpu_s is not a number");
    ck_assert_int_ge(figure(u, "pids"), 1);
    ck_assert_int_lt(figure(u, "pids"), 1000);
    ck_assert_int_gt(mem, 0);
    if (lbt_variant_engine()) {
        ck_assert(json_is_null(json_object_get(u, "oom_kills")));
        if (lbt_variant_is("docker"))
            ck_assert(json_is_null(json_object_get(u, "disk_bytes")));
        ck_assert_msg(peak == -1 || peak >= mem, "peak %lld < memory %lld", (long long)peak,
                      (long long)mem);
    } else {
        ck_assert_int_eq(figure(u, "oom_kills"), 0);
        ck_assert_int_ge(peak, mem);
    }
}

static double mono_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

START_TEST(test_usage)
{
    json_t *lease, *sbx, *u, *res;
    double t0 = mono_s(), cpu_s, wall_s;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    char id[64];

    lbt_daemon_start(&D, NULL);
    lease = lbt_seed(&D, "usage-1", "t", "\"resources\": {\"memory_mib\": 512}");
    snprintf(id, sizeof(id), "%s", str(lease, "sandbox_id"));

    sbx = get_sandbox(id);
    u = json_object_get(sbx, "usage");
    ck_assert_msg(json_is_object(u), "no usage: %s", json_dumps(sbx, 0));
    ck_assert_int_eq(json_object_size(u), 6);
    assert_usage_running(u);
    json_decref(sbx);

    /* a CPU loop (about 0.5 s of CPU on this machine), then 64 MiB into the workdir's tmpfs
     * (charged to the sandbox's memory: on every provider the workdir is a tmpfs here) and a
     * 64 MiB burst through a pipe */
    res = lbt_exec_ok(&D, id, "",
                      "{\"command\": \"i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; "
                      "head -c 67108864 /dev/zero > blob; "
                      "head -c 67108864 /dev/zero | tail -c 1 >/dev/null\", \"timeout_s\": 120}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    json_decref(res);

    sbx = get_sandbox(id);
    wall_s = mono_s() - t0;
    u = json_object_get(sbx, "usage");
    {
        char *text = json_dumps(u, JSON_COMPACT);

        fprintf(stderr, "usage: %s\n", text ? text : "?");
        free(text);
    }
    assert_usage_running(u);
    cpu_s = json_number_value(json_object_get(u, "cpu_s"));
    ck_assert_msg(cpu_s > 0.2, "cpu_s: %s", json_dumps(u, 0));
    ck_assert_msg(cpu_s < wall_s * (double)(cpus > 0 ? cpus : 1), "cpu_s %g in %g s of wall", cpu_s,
                  wall_s);
    ck_assert_msg(figure(u, "memory_bytes") >= 50 * MIB, "memory_bytes (the file's pages): %s",
                  json_dumps(u, 0));
    if (figure(u, "memory_peak_bytes") >= 0 || !lbt_variant_engine())
        ck_assert_msg(figure(u, "memory_peak_bytes") >= 50 * MIB, "memory_peak_bytes: %s",
                      json_dumps(u, 0));
    if (!lbt_variant_engine())
        ck_assert_msg(figure(u, "disk_bytes") >= 64 * MIB, "disk_bytes: %s", json_dumps(u, 0));
    json_decref(sbx);

    /* a stopped sandbox uses nothing the host can tell */
    lbt_release_session(&D, "usage-1");
    sbx = get_sandbox(id);
    u = json_object_get(sbx, "usage");
    ck_assert_int_eq(json_object_size(u), 6);
    ck_assert(json_is_null(json_object_get(u, "cpu_s")));
    ck_assert(json_is_null(json_object_get(u, "memory_bytes")));
    ck_assert(json_is_null(json_object_get(u, "memory_peak_bytes")));
    ck_assert(json_is_null(json_object_get(u, "pids")));
    ck_assert(json_is_null(json_object_get(u, "oom_kills")));
    ck_assert(json_is_null(json_object_get(u, "disk_bytes")));
    json_decref(sbx);
    json_decref(lease);
}
END_TEST

/* With local.storage = dir the workdir's use is a walk of its host directory: it adds up the
 * files there and follows none of the sandbox's symlinks (one to / and one to /usr would add
 * the host's files). */
START_TEST(test_usage_dir_walk)
{
    static const char *const args[] = {"--set", "local.storage=dir", NULL};
    json_t *lease, *sbx, *res;
    int64_t disk;
    char id[64];

    LBT_SKIP_ON_ENGINE("the walk is the local provider's (storage = dir)");
    lbt_daemon_start(&D, args);
    lease = lbt_seed(&D, "usage-dir", "t", NULL);
    snprintf(id, sizeof(id), "%s", str(lease, "sandbox_id"));
    res = lbt_exec_ok(&D, id, "",
                      "{\"command\": \"head -c 4194304 /dev/urandom > blob && ln -s / rootlink && "
                      "mkdir -p d/e && ln -s /usr d/e/usr && head -c 1048576 /dev/urandom > "
                      "d/e/f\"}");
    json_decref(res);
    sbx = get_sandbox(id);
    disk = json_integer_value(json_object_get(json_object_get(sbx, "usage"), "disk_bytes"));
    ck_assert_msg(disk >= 5 * MIB && disk < 64 * MIB, "disk_bytes %lld (5 MiB written)",
                  (long long)disk);
    json_decref(sbx);
    lbt_release_session(&D, "usage-dir");
    json_decref(lease);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("lost");
    TCase *tc = tcase_create("lost");

    lbt_test_daemon_cleanup(tc, &D);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_killed_init_is_lost);
    tcase_add_test(tc, test_file_read_finds_lost);
    tcase_add_test(tc, test_sweeper_finds_lost);
    tcase_add_test(tc, test_removed_container_is_lost);
    tcase_add_test(tc, test_usage);
    tcase_add_test(tc, test_usage_dir_walk);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
