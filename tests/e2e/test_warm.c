/*
 * test_warm.c - acceptance for warm pools ([pool], src/warm/): a seed of the pool's class gets
 * a sandbox started before its request, other classes do not take it, concurrent seeds never
 * share one, kill -9 leaves nothing leaked (adopted or stopped per pool.adopt), the shutdown
 * sweep stops warm sandboxes (shutdown_sweep = no keeps them), old ones are replaced,
 * pool.size = 0 means no pool, and refills run nicer than the daemon while the sandboxes they
 * make do not.
 *
 * Other daemons run on this machine: everything counted here is this test's daemon's (its
 * records, the init pids in its descriptors).
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <unistd.h>

#include "harness.h"

static struct lbt_daemon D;

/* Wait (up to timeout_s) until exactly n records are warm; returns them. */
static void wait_warm(int n, int timeout_s, struct lbt_ids *out)
{
    double until = lbt_now() + timeout_s;

    for (;;) {
        lbt_records_in_state(&D, "warm", out);
        if (out->n == n || lbt_now() > until)
            break;
        lbt_sleep_ms(100);
    }
    ck_assert_msg(out->n == n, "%d warm sandboxes, wanted %d", out->n, n);
}

/* The sandbox's init pid from its descriptor (0 if it has none). */
static pid_t init_pid(const char *id)
{
    json_t *desc = lbt_read_descriptor(&D, id);
    pid_t pid = desc ? (pid_t)json_integer_value(json_object_get(desc, "pid")) : 0;

    json_decref(desc);
    return pid;
}

static bool pid_alive(pid_t pid)
{
    char path[64], buf[512];
    FILE *f;
    const char *p;
    bool alive = false;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "re");
    if (!f)
        return false;
    if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')))
        alive = p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
    fclose(f);
    return alive;
}

static bool wait_pid_gone(pid_t pid, int timeout_ms)
{
    for (int t = 0; t < timeout_ms / 20 && pid_alive(pid); t++)
        lbt_sleep_ms(20);
    return !pid_alive(pid);
}

/* A sample's value as a double (durations are rendered in seconds); -1 if absent. */
static double metric_f(const char *name)
{
    struct lbt_resp r;
    double v = -1;
    const char *p;

    lbt_json(&D, "GET", "/metrics", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    p = strstr(r.body, name);
    while (p && p != r.body && p[-1] != '\n')
        p = strstr(p + 1, name);
    if (p)
        v = strtod(p + strlen(name), NULL);
    lbt_resp_free(&r);
    return v;
}

/* Does /metrics have the line (exactly, at a line start)? */
static bool metrics_have_line(const char *line)
{
    struct lbt_resp r;
    bool found = false;
    size_t len = strlen(line);

    lbt_json(&D, "GET", "/metrics", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    for (const char *p = r.body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, line, len) == 0 && (p[len] == '\n' || p[len] == '\0'))
            found = true;
    lbt_resp_free(&r);
    return found;
}

#define HITS "lendbox_warm_seeds_total{result=\"hit\"} "
#define MISSES "lendbox_warm_seeds_total{result=\"miss\"} "
#define OTHER "lendbox_warm_seeds_total{result=\"other_class\"} "
#define REFILLS_OK "lendbox_warm_refills_total{result=\"ok\"} "
#define REFILLS_FAILED "lendbox_warm_refills_total{result=\"failed\"} "
#define REFILL_SECONDS "lendbox_warm_refill_seconds_total "
#define REFILL_LAST "lendbox_warm_refill_last_duration_seconds "

static void start_with(const char *const *extra)
{
    lbt_daemon_start(&D, extra);
}

START_TEST(test_seed_takes_a_warm_sandbox)
{
    static const char *const args[] = {"--set", "pool.size=2", NULL};
    struct lbt_ids warm, after;
    json_t *lease, *rec;
    char *out;

    start_with(args);
    wait_warm(2, 60, &warm);
    /* warm ones are listed with their state, lent to no session */
    rec = lbt_record(&D, warm.id[0]);
    ck_assert_ptr_nonnull(rec);
    ck_assert_str_eq(json_string_value(json_object_get(rec, "state")), "warm");
    ck_assert(json_is_null(json_object_get(rec, "resources_session_id")));
    json_decref(rec);
    ck_assert(pid_alive(init_pid(warm.id[0])));
    lbt_sleep_ms(1100); /* created_at has whole seconds */
    time_t asked = time(NULL);

    lease = lbt_seed(&D, "warm-1", "task-w",
                     "\"files\": {\"/workspace/in.txt\": \"from the seed\"}, "
                     "\"env\": {\"WARM_ENV\": \"yes\"}, \"ttl_s\": 600");
    const char *id = json_string_value(json_object_get(lease, "sandbox_id"));
    /* the oldest warm one, started before the request */
    ck_assert_msg(lbt_ids_has(&warm, id), "lent %s, not a warm one", id);
    ck_assert_str_eq(id, warm.id[0]);
    ck_assert_int_lt(lbt_parse_time(json_string_value(json_object_get(lease, "created_at"))),
                     asked);
    ck_assert_int_ge(lbt_parse_time(json_string_value(json_object_get(lease, "expires_at"))),
                     asked + 599);
    ck_assert_str_eq(json_string_value(json_object_get(lease, "state")), "lent");
    ck_assert(json_is_false(json_object_get(lease, "reused")));
    /* the seed's files and env, and its operate token works */
    out = lbt_sh(&D, id, "cat /workspace/in.txt; echo; echo $WARM_ENV");
    ck_assert_str_eq(out, "from the seed\nyes\n");
    free(out);
    const char *token =
        json_string_value(json_object_get(json_object_get(lease, "access"), "token"));
    json_t *res = lbt_exec_ok(&D, id, token, "{\"argv\": [\"true\"]}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    json_decref(res);
    ck_assert_int_eq(lbt_metric(&D, HITS), 1);
    ck_assert_int_eq(lbt_metric(&D, MISSES), 0);
    /* the warm pool's metrics by their exact names: hits, misses, refills and their time */
    ck_assert(metrics_have_line("# TYPE lendbox_warm_seeds_total counter"));
    ck_assert(metrics_have_line("# TYPE lendbox_warm_refills_total counter"));
    ck_assert(metrics_have_line("# TYPE lendbox_warm_refill_seconds_total counter"));
    ck_assert(metrics_have_line("# TYPE lendbox_warm_refill_last_duration_seconds gauge"));
    ck_assert_int_eq(lbt_metric(&D, OTHER), 0);
    ck_assert_int_eq(lbt_metric(&D, REFILLS_FAILED), 0);
    ck_assert_int_ge(lbt_metric(&D, REFILLS_OK), 2);
    ck_assert(metric_f(REFILL_SECONDS) > 0);
    ck_assert(metric_f(REFILL_LAST) > 0);
    ck_assert(metric_f(REFILL_LAST) <= metric_f(REFILL_SECONDS));
    /* refilled: two warm again, neither the lent one */
    wait_warm(2, 60, &after);
    ck_assert(!lbt_ids_has(&after, id));
    /* the refill is counted right after its record says warm: wait for the count too */
    for (double end = lbt_now() + 60; lbt_now() < end && lbt_metric(&D, REFILLS_OK) < 3;)
        lbt_sleep_ms(20);
    ck_assert_int_ge(lbt_metric(&D, REFILLS_OK), 3);
    /* a repeated seed is the same lease, release stops it */
    json_t *again = lbt_seed(&D, "warm-1", "task-w", NULL);
    ck_assert_str_eq(json_string_value(json_object_get(again, "sandbox_id")), id);
    ck_assert(json_is_true(json_object_get(again, "reused")));
    json_decref(again);
    pid_t pid = init_pid(id);
    struct lbt_resp r;
    lbt_json(&D, "POST", "/v1/sessions/warm-1/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert(json_is_true(json_object_get(r.json, "released")));
    lbt_resp_free(&r);
    ck_assert(wait_pid_gone(pid, 5000));
    json_decref(lease);
}
END_TEST

/* The nice value (field 19 of /proc/<path>/stat), or -100 if it cannot be read. */
static int proc_nice(const char *path)
{
    char file[128], buf[1024];
    const char *p;
    int field = 3, nice = -100;
    FILE *f;

    snprintf(file, sizeof(file), "/proc/%s/stat", path);
    f = fopen(file, "re");
    if (!f)
        return -100;
    if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')'))) {
        for (p += 2; *p && field < 19; p++)
            if (*p == ' ')
                field++;
        if (field == 19)
            nice = atoi(p);
    }
    fclose(f);
    return nice;
}

/* The daemon's threads named comm: how many, and (all alike) their nice value in *nice. */
static int threads_named(pid_t pid, const char *comm, int *nice)
{
    char path[320], name[64];
    struct dirent *de;
    int n = 0;
    DIR *d;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    d = opendir(path);
    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d))) {
        FILE *f;

        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid, de->d_name);
        f = fopen(path, "re");
        if (!f)
            continue;
        name[0] = '\0';
        if (fgets(name, sizeof(name), f))
            name[strcspn(name, "\n")] = '\0';
        fclose(f);
        if (strcmp(name, comm) != 0)
            continue;
        snprintf(path, sizeof(path), "%d/task/%s", (int)pid, de->d_name);
        int v = proc_nice(path);
        ck_assert_msg(n == 0 || v == *nice, "refill threads at nice %d and %d", *nice, v);
        *nice = v;
        n++;
    }
    closedir(d);
    return n;
}

/* Refills run pool.refill_nice (default 10) above the daemon's nice value, so that the creation
 * a take wakes does not slow the taken sandbox's execs and release down; the sandbox a refill
 * made runs at the daemon's own nice value, bwrap and init alike, as one a seed makes. */
START_TEST(test_refills_run_nicer_than_the_daemon)
{
    static const char *const args[] = {"--set", "pool.size=1", NULL};
    int mine = getpriority(PRIO_PROCESS, 0), refill = -100;
    struct lbt_ids warm;
    char path[64];

    /* room above the daemon: a test run under `nice -n 19` starts this one daemon at 0 */
    if (mine > 9)
        ck_assert_int_eq(setpriority(PRIO_PROCESS, 0, 0), 0);
    start_with(args);
    if (mine > 9)
        ck_assert_int_eq(setpriority(PRIO_PROCESS, 0, mine), 0);
    snprintf(path, sizeof(path), "%d", (int)D.pid);
    int base = proc_nice(path);
    ck_assert_int_le(base, 9);
    wait_warm(1, 60, &warm);
    ck_assert_int_eq(threads_named(D.pid, "warm-refill", &refill), 2); /* refill_concurrency */
    ck_assert_int_eq(refill, base + 10);
    /* the warm sandbox: its init and bwrap (the init's parent) at the daemon's value */
    pid_t init = init_pid(warm.id[0]);
    ck_assert_int_gt(init, 0);
    snprintf(path, sizeof(path), "%d", (int)init);
    ck_assert_int_eq(proc_nice(path), base);
    FILE *f;
    char buf[1024];
    const char *p;
    int ppid = 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)init);
    f = fopen(path, "re");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(buf, sizeof(buf), f));
    fclose(f);
    p = strrchr(buf, ')');
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(sscanf(p + 2, "%*c %d", &ppid), 1);
    snprintf(path, sizeof(path), "%d", ppid);
    ck_assert_int_eq(proc_nice(path), base);
    /* lent from the pool, the sandbox's commands run at the daemon's value too */
    json_t *lease = lbt_seed(&D, "nice-1", "t", NULL);
    ck_assert_str_eq(json_string_value(json_object_get(lease, "sandbox_id")), warm.id[0]);
    char *out = lbt_sh(&D, warm.id[0], "cut -d' ' -f19 /proc/self/stat /proc/1/stat");
    snprintf(buf, sizeof(buf), "%d\n%d\n", base, base);
    ck_assert_str_eq(out, buf);
    free(out);
    json_decref(lease);
}
END_TEST

START_TEST(test_other_class_does_not_take_it)
{
    static const char *const args[] = {"--set", "pool.size=2", NULL};
    struct lbt_ids warm, after;
    json_t *lease;

    start_with(args);
    wait_warm(2, 60, &warm);
    /* resource limits, a network request or declared ports: another class */
    lease = lbt_seed(&D, "other-1", "t", "\"resources\": {\"pids\": 200}");
    ck_assert(!lbt_ids_has(&warm, json_string_value(json_object_get(lease, "sandbox_id"))));
    json_decref(lease);
    lease = lbt_seed(&D, "other-2", "t", "\"ports\": [8080]");
    ck_assert(!lbt_ids_has(&warm, json_string_value(json_object_get(lease, "sandbox_id"))));
    json_decref(lease);
    /* another workdir: warm sandboxes were made with lending.workdir */
    lease = lbt_seed(&D, "other-3", "t", "\"workdir\": \"/elsewhere\"");
    ck_assert(!lbt_ids_has(&warm, json_string_value(json_object_get(lease, "sandbox_id"))));
    char *pwd = lbt_sh(&D, json_string_value(json_object_get(lease, "sandbox_id")), "pwd");
    ck_assert_str_eq(pwd, "/elsewhere\n");
    free(pwd);
    json_decref(lease);
    lbt_records_in_state(&D, "warm", &after);
    ck_assert_int_eq(after.n, 2);
    ck_assert(lbt_ids_has(&after, warm.id[0]) && lbt_ids_has(&after, warm.id[1]));
    ck_assert_int_eq(lbt_metric(&D, OTHER), 3);
    ck_assert_int_eq(lbt_metric(&D, HITS), 0);
    /* naming the class's image (host, the default) or its workdir is the class */
    lease = lbt_seed(&D, "same-1", "t", "\"image\": \"host\"");
    ck_assert(lbt_ids_has(&warm, json_string_value(json_object_get(lease, "sandbox_id"))));
    json_decref(lease);
    lease = lbt_seed(&D, "same-2", "t", "\"workdir\": \"/workspace\"");
    ck_assert(lbt_ids_has(&warm, json_string_value(json_object_get(lease, "sandbox_id"))));
    pwd = lbt_sh(&D, json_string_value(json_object_get(lease, "sandbox_id")), "pwd");
    ck_assert_str_eq(pwd, "/workspace\n");
    free(pwd);
    json_decref(lease);
    ck_assert_int_eq(lbt_metric(&D, HITS), 2);
    ck_assert_int_eq(lbt_metric(&D, OTHER), 3);
}
END_TEST

#define BURST 50
#define POOL 10

START_TEST(test_burst_of_50_against_10)
{
    static const char *const args[] = {"--set", "pool.size=10", NULL};
    struct lbt_async *a[BURST];
    struct lbt_ids warm, after;
    char ids[BURST][64], path[64], body[64];
    time_t created[BURST];
    int from_pool = 0;

    start_with(args);
    wait_warm(POOL, 120, &warm);
    lbt_sleep_ms(1100); /* created_at has whole seconds */
    time_t asked = time(NULL);
    for (int i = 0; i < BURST; i++) {
        snprintf(path, sizeof(path), "/v1/sessions/burst-%d/seed", i);
        snprintf(body, sizeof(body), "{\"task_id\": \"t%d\"}", i);
        a[i] = lbt_async_json(&D, "POST", path, "", body);
    }
    for (int i = 0; i < BURST; i++) {
        struct lbt_resp r;

        lbt_async_join(a[i], &r);
        ck_assert_msg(r.status == 200, "seed %d: %ld %s", i, r.status, r.body);
        snprintf(ids[i], sizeof(ids[i]), "%s",
                 json_string_value(json_object_get(r.json, "sandbox_id")));
        created[i] = lbt_parse_time(json_string_value(json_object_get(r.json, "created_at")));
        lbt_resp_free(&r);
    }
    for (int i = 0; i < BURST; i++) {
        for (int j = 0; j < i; j++)
            ck_assert_msg(strcmp(ids[i], ids[j]) != 0, "%s lent twice", ids[i]);
        from_pool += lbt_ids_has(&warm, ids[i]);
        /* pre-started ones before the burst, the 40 others after it began */
        if (lbt_ids_has(&warm, ids[i]))
            ck_assert_int_lt(created[i], asked);
        else
            ck_assert_msg(created[i] >= asked, "%s: not a warm one, created before the burst",
                          ids[i]);
    }
    /* every pre-started one went to exactly one seed; the other 40 were started after the
     * burst began (fresh, or refills made during it: the hit counter tells) */
    ck_assert_int_eq(from_pool, POOL);
    ck_assert_int_ge(lbt_metric(&D, HITS), POOL);
    ck_assert_int_eq(lbt_metric(&D, HITS) + lbt_metric(&D, MISSES), BURST);
    /* 50 lent, and the pool refilled to 10 with none of them */
    wait_warm(POOL, 180, &after);
    for (int i = 0; i < BURST; i++)
        ck_assert(!lbt_ids_has(&after, ids[i]));
    struct lbt_ids lent;
    lbt_records_in_state(&D, "lent", &lent);
    ck_assert_int_eq(lent.n, BURST);
    ck_assert_int_eq(lbt_metric(&D, REFILLS_FAILED), 0);
}
END_TEST

START_TEST(test_kill9_adopts_warm_sandboxes)
{
    static const char *const args[] = {"--set", "pool.size=3", NULL};
    struct lbt_ids warm, after;
    pid_t pids[3];

    start_with(args);
    wait_warm(3, 60, &warm);
    for (int i = 0; i < 3; i++)
        pids[i] = init_pid(warm.id[i]);
    lbt_daemon_kill(&D);
    lbt_sleep_ms(200);
    for (int i = 0; i < 3; i++)
        ck_assert(pid_alive(pids[i]));
    lbt_daemon_restart(&D, args); /* pool.adopt = yes is the default */
    lbt_records_in_state(&D, "warm", &after);
    ck_assert_int_eq(after.n, 3);
    for (int i = 0; i < 3; i++) {
        ck_assert(lbt_ids_has(&after, warm.id[i]));
        ck_assert(pid_alive(pids[i]));
    }
    lbt_sleep_ms(1500); /* no extra ones are made: the pool is full */
    lbt_records_in_state(&D, "warm", &after);
    ck_assert_int_eq(after.n, 3);
    /* an adopted one serves a seed */
    json_t *lease = lbt_seed(&D, "adopted-1", "t", NULL);
    ck_assert(lbt_ids_has(&warm, json_string_value(json_object_get(lease, "sandbox_id"))));
    char *out = lbt_sh(&D, json_string_value(json_object_get(lease, "sandbox_id")), "echo ok");
    ck_assert_str_eq(out, "ok\n");
    free(out);
    json_decref(lease);
}
END_TEST

START_TEST(test_kill9_without_adopt_stops_them)
{
    static const char *const args[] = {"--set", "pool.size=3", "--set", "pool.adopt=no", NULL};
    struct lbt_ids warm, after;
    pid_t pids[3];

    start_with(args);
    wait_warm(3, 60, &warm);
    for (int i = 0; i < 3; i++)
        pids[i] = init_pid(warm.id[i]);
    lbt_daemon_kill(&D);
    lbt_daemon_restart(&D, args);
    /* reconciled before ready: stopped, recorded with their reason, processes gone */
    for (int i = 0; i < 3; i++) {
        json_t *rec = lbt_record(&D, warm.id[i]);

        ck_assert_ptr_nonnull(rec);
        ck_assert_str_eq(json_string_value(json_object_get(rec, "state")), "stopped");
        ck_assert_str_eq(json_string_value(json_object_get(rec, "stop_reason")), "not_adopted");
        json_decref(rec);
        ck_assert(wait_pid_gone(pids[i], 5000));
        char dir[512];
        snprintf(dir, sizeof(dir), "%s/sandboxes/%s", D.state_dir, warm.id[i]);
        ck_assert_msg(!lbt_path_exists(dir), "%s left behind", dir);
    }
    /* and the pool is made again */
    wait_warm(3, 60, &after);
    for (int i = 0; i < 3; i++)
        ck_assert(!lbt_ids_has(&warm, after.id[i]));
}
END_TEST

START_TEST(test_shutdown_sweep_stops_warm)
{
    static const char *const args[] = {"--set", "pool.size=2", NULL};
    struct lbt_ids warm;
    pid_t pids[2];

    start_with(args);
    wait_warm(2, 60, &warm);
    for (int i = 0; i < 2; i++)
        pids[i] = init_pid(warm.id[i]);
    ck_assert_int_eq(lbt_daemon_stop(&D), 0);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(!pid_alive(pids[i]), "warm sandbox %s outlived the shutdown sweep",
                      warm.id[i]);
}
END_TEST

START_TEST(test_shutdown_sweep_no_keeps_warm)
{
    static const char *const args[] = {"--set", "pool.size=2", "--set", "lending.shutdown_sweep=no",
                                       NULL};
    static const char *const off[] = {"--set", "pool.size=0", NULL};
    struct lbt_ids warm;
    pid_t pids[2];

    start_with(args);
    wait_warm(2, 60, &warm);
    for (int i = 0; i < 2; i++)
        pids[i] = init_pid(warm.id[i]);
    ck_assert_int_eq(lbt_daemon_stop(&D), 0);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(pid_alive(pids[i]), "warm sandbox %s stopped despite shutdown_sweep=no",
                      warm.id[i]);
    /* a start without a pool does not adopt them: stopped, never leaked */
    lbt_daemon_restart(&D, off);
    for (int i = 0; i < 2; i++) {
        json_t *rec = lbt_record(&D, warm.id[i]);

        ck_assert_str_eq(json_string_value(json_object_get(rec, "state")), "stopped");
        ck_assert_str_eq(json_string_value(json_object_get(rec, "stop_reason")), "not_adopted");
        json_decref(rec);
        ck_assert(wait_pid_gone(pids[i], 5000));
    }
}
END_TEST

START_TEST(test_max_age_replaces)
{
    static const char *const args[] = {"--set", "pool.size=1", "--set", "pool.max_age_s=2", NULL};
    struct lbt_ids warm, now;
    json_t *rec = NULL;
    pid_t pid;

    start_with(args);
    wait_warm(1, 60, &warm);
    pid = init_pid(warm.id[0]);
    for (int t = 0; t < 200; t++) {
        json_decref(rec);
        rec = lbt_record(&D, warm.id[0]);
        if (!strcmp(json_string_value(json_object_get(rec, "state")), "stopped"))
            break;
        lbt_sleep_ms(100);
    }
    ck_assert_str_eq(json_string_value(json_object_get(rec, "state")), "stopped");
    ck_assert_str_eq(json_string_value(json_object_get(rec, "stop_reason")), "max_age");
    json_decref(rec);
    ck_assert(wait_pid_gone(pid, 5000));
    /* replaced by a new one */
    for (int t = 0; t < 100; t++) {
        lbt_records_in_state(&D, "warm", &now);
        if (now.n == 1 && strcmp(now.id[0], warm.id[0]) != 0)
            break;
        lbt_sleep_ms(100);
    }
    ck_assert_int_eq(now.n, 1);
    ck_assert_str_ne(now.id[0], warm.id[0]);
}
END_TEST

START_TEST(test_size_0_disables)
{
    struct lbt_ids warm;
    json_t *lease;

    start_with(NULL); /* pool.size = 0 is the default */
    lease = lbt_seed(&D, "nopool-1", "t", NULL);
    json_decref(lease);
    lbt_sleep_ms(1500);
    lbt_records_in_state(&D, "warm", &warm);
    ck_assert_int_eq(warm.n, 0);
    lbt_records_in_state(&D, "starting", &warm);
    ck_assert_int_eq(warm.n, 0);
    ck_assert_int_eq(lbt_metric(&D, HITS), 0);
    ck_assert_int_eq(lbt_metric(&D, MISSES), 0);
    ck_assert_int_eq(lbt_metric(&D, "lendbox_warm_refills_total{result=\"ok\"} "), 0);
}
END_TEST

START_TEST(test_pool_never_exceeds_max_sandboxes)
{
    static const char *const args[] = {"--set", "pool.size=3", "--set", "lending.max_sandboxes=3",
                                       NULL};
    struct lbt_ids warm, after;
    json_t *lease;
    struct lbt_resp r;

    start_with(args);
    wait_warm(3, 60, &warm);
    /* another class at the limit: the oldest warm one gives its place */
    lease = lbt_seed(&D, "cap-1", "t", "\"resources\": {\"pids\": 100}");
    ck_assert(!lbt_ids_has(&warm, json_string_value(json_object_get(lease, "sandbox_id"))));
    json_decref(lease);
    json_t *rec = lbt_record(&D, warm.id[0]);
    ck_assert_str_eq(json_string_value(json_object_get(rec, "stop_reason")), "evicted");
    json_decref(rec);
    lbt_sleep_ms(1500);
    lbt_records_in_state(&D, "warm", &after);
    ck_assert_int_eq(after.n, 2);             /* 1 lent + 2 warm = max_sandboxes */
    lease = lbt_seed(&D, "cap-2", "t", NULL); /* takes a warm one */
    json_decref(lease);
    lease = lbt_seed(&D, "cap-3", "t", NULL);
    json_decref(lease);
    /* 3 lent: full, nothing warm, and a 4th seed is refused as before */
    lbt_sleep_ms(1500);
    lbt_records_in_state(&D, "warm", &after);
    ck_assert_int_eq(after.n, 0);
    lbt_json(&D, "POST", "/v1/sessions/cap-4/seed", "", "{\"task_id\": \"t\"}", &r);
    lbt_assert_error(&r, 429, "overloaded");
    lbt_resp_free(&r);
    /* waiting for room is not a failure: no attempt was made */
    ck_assert_int_eq(lbt_metric(&D, REFILLS_FAILED), 0);
}
END_TEST

/* The shipped config's default image is a list ([local] default_image = default host): a seed
 * that names none runs on the first present, here host (no image "default" is imported). The
 * pool's class is that one: it fills, and such a seed takes a warm sandbox. */
START_TEST(test_fills_with_a_default_image_list)
{
    static const char *const args[] = {"--set", "pool.size=2", "--set",
                                       "local.default_image=default host", NULL};
    struct lbt_ids warm;
    json_t *lease;

    start_with(args);
    wait_warm(2, 60, &warm);
    ck_assert_int_eq(lbt_metric(&D, REFILLS_FAILED), 0);
    lease = lbt_seed(&D, "list-1", "t", NULL);
    ck_assert(lbt_ids_has(&warm, json_string_value(json_object_get(lease, "sandbox_id"))));
    ck_assert_str_eq(json_string_value(json_object_get(lease, "image")), "host");
    json_decref(lease);
    ck_assert_int_eq(lbt_metric(&D, HITS), 1);
    ck_assert_int_eq(lbt_metric(&D, MISSES), 0);
    ck_assert_int_eq(lbt_metric(&D, OTHER), 0);
}
END_TEST

/* Creations that fail (here every provider create, by the fault switch) back off: a few
 * attempts, never a hot loop; the pool fills once they work again. */
START_TEST(test_failed_refills_back_off)
{
    static const char *const args[] = {"--set", "pool.size=2", "--set",
                                       "faults.spec=provider.create=fail", NULL};
    struct lbt_ids warm;

    start_with(args);
    /* wait for the first failures, then watch 6 s: 500 ms doubling allows ~4 per thread */
    for (int t = 0; t < 600 && lbt_metric(&D, REFILLS_FAILED) < 1; t++)
        lbt_sleep_ms(100);
    ck_assert_int_ge(lbt_metric(&D, REFILLS_FAILED), 1);
    long first = lbt_metric(&D, REFILLS_FAILED);
    lbt_sleep_ms(6000);
    long later = lbt_metric(&D, REFILLS_FAILED);
    ck_assert_msg(later - first <= 10, "%ld failed refills in 6 s: a hot loop", later - first);
    lbt_records_in_state(&D, "warm", &warm);
    ck_assert_int_eq(warm.n, 0);
    lbt_records_in_state(&D, "failed_seed", &warm);
    ck_assert_int_eq(warm.n, 0); /* each failed one was stopped */
    ck_assert_int_eq(lbt_metric(&D, REFILLS_OK), 0);
}
END_TEST

/* The class follows the default image list: once the list's first image is imported, seeds
 * that name none run on it, so the warm sandboxes of the previous image (host) are replaced
 * (stop reason class_changed) and the new ones serve such seeds. */
START_TEST(test_class_follows_an_import)
{
    static const char *const args[] = {"--set", "pool.size=1", "--set",
                                       "local.default_image=lbtwarm host", NULL};
    char dir[64], cmd[512], *out;
    struct lbt_ids warm, now;
    json_t *lease, *rec;

    snprintf(dir, sizeof(dir), "/tmp/lbt-warmimg-%d", (int)getpid());
    snprintf(cmd, sizeof(cmd), "%s/tests/images/make-test-image %s lbt-warm-%d >/dev/null",
             getenv("LENDBOX_SRCDIR"), dir, (int)getpid());
    ck_assert_msg(system(cmd) == 0, "make-test-image failed");
    start_with(args);
    wait_warm(1, 60, &warm);
    snprintf(cmd, sizeof(cmd), "%s -s %s image import %s/image.tar lbtwarm >&2", getenv("LENDBOXD"),
             D.state_dir, dir);
    ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
    /* the host one is replaced by one on the image */
    rec = NULL;
    for (int t = 0; t < 600; t++) {
        json_decref(rec);
        rec = lbt_record(&D, warm.id[0]);
        lbt_records_in_state(&D, "warm", &now);
        if (!strcmp(json_string_value(json_object_get(rec, "state")), "stopped") && now.n == 1)
            break;
        lbt_sleep_ms(100);
    }
    ck_assert_str_eq(json_string_value(json_object_get(rec, "state")), "stopped");
    ck_assert_str_eq(json_string_value(json_object_get(rec, "stop_reason")), "class_changed");
    json_decref(rec);
    ck_assert_int_eq(now.n, 1);
    ck_assert_str_ne(now.id[0], warm.id[0]);
    lease = lbt_seed(&D, "img-1", "t", NULL);
    ck_assert_str_eq(json_string_value(json_object_get(lease, "sandbox_id")), now.id[0]);
    ck_assert_str_eq(json_string_value(json_object_get(lease, "image")), "lbtwarm");
    out = lbt_sh(&D, now.id[0], "cat /etc/os-release");
    snprintf(cmd, sizeof(cmd), "ID=lbt-warm-%d", (int)getpid());
    ck_assert_msg(strstr(out, cmd), "not on the image: %s", out);
    free(out);
    json_decref(lease);
    ck_assert_int_eq(lbt_metric(&D, HITS), 1);
    ck_assert_int_eq(lbt_metric(&D, OTHER), 0);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    (void)!system(cmd);
}
END_TEST

START_TEST(test_refills_recover_after_failures)
{
    static const char *const args[] = {"--set", "pool.size=2",
                                       "--set", "pool.refill_concurrency=1",
                                       "--set", "faults.spec=provider.create=fail:3",
                                       NULL};
    struct lbt_ids warm;

    start_with(args);
    wait_warm(2, 90, &warm);
    ck_assert_int_eq(lbt_metric(&D, REFILLS_FAILED), 3);
    ck_assert_int_eq(lbt_metric(&D, REFILLS_OK), 2);
}
END_TEST

/* ---------- recycling pools ([pool] recycle, max_uses) ---------- */

#define RECYCLED "lendbox_pool_recycled_total "
#define RESET_FAILURES "lendbox_pool_reset_failures_total "

/* Run shell command in sandbox id with its operate token; return its stdout (malloc'd). */
static char *op_sh(const char *id, const char *token, const char *command)
{
    json_t *body = json_pack("{s:s,s:i,s:b}", "command", command, "timeout_s", 20,
                             "preserve_background_services", 1);
    char *text = json_dumps(body, JSON_COMPACT), *out;
    json_t *res = lbt_exec_ok(&D, id, token, text);

    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    out = strdup(json_string_value(json_object_get(res, "stdout")));
    json_decref(res);
    json_decref(body);
    free(text);
    return out;
}

/* What an episode leaves behind and what the next must not see: its marker files (workdir,
 * /tmp) and a background sleep that left the exec's session. The leave waits (at most ~10 s)
 * until that sleep runs as "sleep 4242" (until then it is setsid's, or the forked shell's),
 * so a look right after it sees it. */
#define EPISODE_LOOK                                                                               \
    "ls /workspace/marker /tmp/marker 2>/dev/null; "                                               \
    "for c in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $c 2>/dev/null; echo; done | "               \
    "grep '^sleep 4242' | sed 's/ *$//'; cat /workspace/seed.txt; echo"
#define EPISODE_LEAVE                                                                              \
    "echo x > /workspace/marker; echo x > /tmp/marker; "                                           \
    "setsid sleep 4242 </dev/null >/dev/null 2>&1 & "                                              \
    "i=0; while [ $i -lt 100 ] && ! (for c in /proc/[0-9]*/cmdline; do "                           \
    "tr '\\0' ' ' < $c 2>/dev/null; echo; done | grep -q '^sleep 4242'); do "                      \
    "sleep 0.1; i=$((i+1)); done"

/* Seed rsid (one episode), check it sees nothing of an earlier one, leave things behind, see
 * them, release; return the lease's sandbox id (malloc'd) and its token in token_out. */
static char *episode(int n, char **token_out)
{
    char rsid[32], files[128], want[64], *out;
    json_t *lease;

    snprintf(rsid, sizeof(rsid), "recycle-%d", n);
    snprintf(files, sizeof(files), "\"files\": {\"/workspace/seed.txt\": \"episode %d\"}", n);
    lease = lbt_seed(&D, rsid, "task-r", files);
    char *id = strdup(json_string_value(json_object_get(lease, "sandbox_id")));
    *token_out =
        strdup(json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
    snprintf(want, sizeof(want), "episode %d\n", n);
    out = op_sh(id, *token_out, EPISODE_LOOK "; " EPISODE_LEAVE); /* one exec: look, then leave */
    ck_assert_msg(strcmp(out, want) == 0, "episode %d in %s sees '%s'", n, id, out);
    free(out);
    snprintf(want, sizeof(want), "/tmp/marker\n/workspace/marker\nsleep 4242\nepisode %d\n", n);
    if (n % 10 == 0) { /* what it left is there to be seen (the look can see it) */
        out = op_sh(id, *token_out, EPISODE_LOOK);
        ck_assert_msg(strcmp(out, want) == 0, "episode %d in %s left '%s'", n, id, out);
        free(out);
    }
    lbt_release_session(&D, rsid);
    return id;
}

/* Record id as GET /v1/sandboxes/{id} (admin) shows it; asserts 200. */
static json_t *record_get(const char *id)
{
    char path[128];
    struct lbt_resp r;
    json_t *rec;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
    lbt_json(&D, "GET", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "GET %s: %ld", path, r.status);
    rec = json_incref(r.json);
    lbt_resp_free(&r);
    return rec;
}

/* The old id after its release: 404 on exec (admin and its old token), GET shows it stopped
 * (released). */
static void assert_gone(const char *id, const char *token)
{
    struct lbt_resp r;
    json_t *rec;

    lbt_exec(&D, id, "", "{\"argv\": [\"true\"]}", &r);
    ck_assert_int_eq(r.status, 404);
    lbt_resp_free(&r);
    lbt_exec(&D, id, token, "{\"argv\": [\"true\"]}", &r);
    ck_assert_int_eq(r.status, 404);
    lbt_resp_free(&r);
    rec = record_get(id);
    ck_assert_str_eq(json_string_value(json_object_get(rec, "state")), "stopped");
    ck_assert_str_eq(json_string_value(json_object_get(rec, "stop_reason")), "released");
    json_decref(rec);
}

/* Records of the daemon whose stop_reason is reason (NULL: every record). */
static int count_records(const char *reason)
{
    json_t *all = lbt_list_sandboxes(&D), *v;
    size_t i;
    int n = 0;

    json_array_foreach(all, i, v) {
        const char *why = json_string_value(json_object_get(v, "stop_reason"));

        n += !reason || (why && strcmp(why, reason) == 0);
    }
    json_decref(all);
    return n;
}

#define EPISODES 200

/* 200 episodes through a recycling pool of 2. What holds in every interleaving of the releases
 * with the pool's refill threads: each lease is a new id never lent before; an episode sees no
 * file or process an earlier one left; each old id answers 404 and shows stopped (released);
 * sandboxes were recycled; and every sandbox the daemon made (records not made by a seed that
 * missed the pool) was made by a recycle or a refill, none failed. How many of each depends on
 * timing and is not asserted. */
START_TEST(test_recycle_200_episodes)
{
    static const char *const args[] = {"--set", "pool.size=2", "--set", "pool.recycle=yes", NULL};
    static char *seen[EPISODES];
    struct lbt_ids warm;
    long recycled, refills, misses, hits;

    start_with(args);
    wait_warm(2, 60, &warm);
    for (int n = 0; n < EPISODES; n++) {
        char *token;

        seen[n] = episode(n, &token);
        for (int k = 0; k < n; k++)
            ck_assert_msg(strcmp(seen[k], seen[n]) != 0, "episode %d got %s again", n, seen[n]);
        assert_gone(seen[n], token);
        free(token);
    }
    /* the pool full again: a pool and the creations under way never exceed its size, so none
     * is under way now; a creation is counted just after its sandbox is warm: wait for that */
    wait_warm(2, 60, &warm);
    for (double until = lbt_now() + 10;; lbt_sleep_ms(50)) {
        recycled = lbt_metric(&D, RECYCLED);
        refills = lbt_metric(&D, REFILLS_OK);
        misses = lbt_metric(&D, MISSES);
        if (recycled + refills + misses >= EPISODES + 2 || lbt_now() > until)
            break;
    }
    hits = lbt_metric(&D, HITS);
    ck_assert_msg(recycled > 0, "no sandbox was recycled");
    ck_assert_int_eq(hits + misses, EPISODES);
    ck_assert_int_eq(lbt_metric(&D, RESET_FAILURES), 0);
    ck_assert_int_eq(lbt_metric(&D, REFILLS_FAILED), 0);
    ck_assert_int_eq(count_records("reset_failed"), 0);
    ck_assert_int_eq(count_records("released"), EPISODES);
    /* every record is an episode's or a warm one (nothing else stopped: evicted, pool_shrunk);
     * those a missed seed made aside, each was made by a recycle or a refill */
    ck_assert_int_eq(count_records(NULL), EPISODES + 2);
    ck_assert_int_eq(recycled + refills, EPISODES + 2 - misses);
    ck_assert(metrics_have_line("# TYPE lendbox_pool_recycled_total counter"));
    ck_assert(metrics_have_line("# TYPE lendbox_pool_reset_failures_total counter"));
    for (int n = 0; n < EPISODES; n++) {
        ck_assert(!lbt_ids_has(&warm, seen[n]));
        free(seen[n]);
    }
}
END_TEST

/* max_uses = 3: the line of one sandbox is lent three times, then its release stops it and the
 * pool makes a fresh one; a fresh line is recycled again. max_sandboxes = 1 keeps the refill
 * from making the fresh one while the last use is lent, so only max_uses decides. */
START_TEST(test_recycle_max_uses)
{
    static const char *const args[] = {
        "--set", "pool.size=1",     "--set", "pool.recycle=yes",
        "--set", "pool.max_uses=3", "--set", "lending.max_sandboxes=1",
        NULL};
    struct lbt_ids warm;
    char *id, *token;

    start_with(args);
    wait_warm(1, 60, &warm);
    for (int n = 0; n < 4; n++) {
        id = episode(n, &token);
        assert_gone(id, token);
        free(id);
        free(token);
        /* after the 1st and 2nd lend it came back; the 3rd was its last; the 4th is a new line */
        ck_assert_int_eq(lbt_metric(&D, RECYCLED), n < 2 ? n + 1 : n);
        wait_warm(1, 60, &warm);
    }
    ck_assert_int_eq(lbt_metric(&D, REFILLS_OK), 2);
    ck_assert_int_eq(lbt_metric(&D, RESET_FAILURES), 0);
}
END_TEST

/* recycle = no (the default): a release stops the sandbox and the pool refills as before. */
START_TEST(test_recycle_off_keeps_refilling)
{
    static const char *const args[] = {"--set", "pool.size=1", NULL};
    struct lbt_ids warm;
    char *id, *token;

    start_with(args);
    wait_warm(1, 60, &warm);
    for (int n = 0; n < 2; n++) {
        id = episode(n, &token);
        assert_gone(id, token);
        free(id);
        free(token);
        wait_warm(1, 60, &warm);
    }
    ck_assert_int_eq(lbt_metric(&D, RECYCLED), 0);
    ck_assert_int_eq(lbt_metric(&D, REFILLS_OK), 3);
}
END_TEST

/* The one record whose stop_reason is reason (asserts there is exactly one); its id into id. */
static void the_record_stopped_for(const char *reason, char *id, size_t len)
{
    json_t *all = lbt_list_sandboxes(&D), *v;
    size_t i;
    int n = 0;

    json_array_foreach(all, i, v) {
        const char *why = json_string_value(json_object_get(v, "stop_reason"));

        if (why && strcmp(why, reason) == 0) {
            snprintf(id, len, "%s", json_string_value(json_object_get(v, "sandbox_id")));
            ck_assert_str_eq(json_string_value(json_object_get(v, "state")), "stopped");
            n++;
        }
    }
    json_decref(all);
    ck_assert_int_eq(n, 1);
}

/* A recycle by a stop and a make (the in-place reset off) whose sandbox was made but could not
 * be recorded warm (fault lend.recycle, once): the release answers as always and the old
 * sandbox is stopped (released, 404); the replacement's record is stopped with reason
 * reset_failed (its cgroup gone), counted as a reset failure and not as recycled; the pool
 * refills, and the next release recycles. */
START_TEST(test_recycle_reset_failure)
{
    static const char *const args[] = {"--set", "pool.size=1",
                                       "--set", "pool.recycle=yes",
                                       "--set", "faults.spec=lend.recycle=fail:1",
                                       "--set", "local.reset_in_place=no",
                                       NULL};
    char failed[64];
    struct lbt_ids warm;
    char *id, *id2, *token;

    start_with(args);
    wait_warm(1, 60, &warm);
    id = episode(0, &token);
    assert_gone(id, token);
    free(token);
    ck_assert_int_eq(lbt_metric(&D, RESET_FAILURES), 1);
    ck_assert_int_eq(lbt_metric(&D, RECYCLED), 0);
    the_record_stopped_for("reset_failed", failed, sizeof(failed));
    ck_assert_str_ne(failed, id);
    ck_assert_ptr_null(lbt_read_descriptor(&D, failed));
    ck_assert_int_eq(lbt_count_cgroup_dirs(failed), 0);
    wait_warm(1, 60, &warm); /* the refill's */
    ck_assert(!lbt_ids_has(&warm, failed) && !lbt_ids_has(&warm, id));
    id2 = episode(1, &token);
    ck_assert_str_eq(id2, warm.id[0]);
    assert_gone(id2, token);
    free(token);
    ck_assert_int_eq(lbt_metric(&D, RECYCLED), 1);
    ck_assert_int_eq(lbt_metric(&D, RESET_FAILURES), 1);
    wait_warm(1, 60, &warm); /* the recycled one */
    ck_assert(!lbt_ids_has(&warm, failed) && !lbt_ids_has(&warm, id) && !lbt_ids_has(&warm, id2));
    free(id);
    free(id2);
}
END_TEST

/* A provider that cannot reset (the local provider with its reset capability hidden by the
 * fault provider.caps.reset, as docker's caps have none): pool.recycle = yes is turned off at
 * start-up with a warning; a release stops the sandbox and the pool refills as without it. */
START_TEST(test_recycle_needs_reset)
{
    static const char *const args[] = {"--set", "pool.size=1",
                                       "--set", "pool.recycle=yes",
                                       "--set", "faults.spec=provider.caps.reset=fail",
                                       NULL};
    struct lbt_ids warm;
    char *id, *token;

    start_with(args);
    wait_warm(1, 60, &warm);
    ck_assert_int_eq(lbt_log_count(&D, "cannot reset sandboxes: the pool does not recycle"), 1);
    id = episode(0, &token);
    assert_gone(id, token);
    free(token);
    ck_assert_int_eq(lbt_metric(&D, RECYCLED), 0);
    ck_assert_int_eq(lbt_metric(&D, RESET_FAILURES), 0);
    wait_warm(1, 60, &warm); /* a refill's */
    ck_assert(!lbt_ids_has(&warm, id));
    free(id);
}
END_TEST

/* A lent sandbox past pool.max_age_s is not recycled (an in-place recycle would keep an old
 * sandbox going): its release stops it and the pool refills. */
START_TEST(test_recycle_not_past_max_age)
{
    static const char *const args[] = {"--set", "pool.size=1",      "--set", "pool.recycle=yes",
                                       "--set", "pool.max_age_s=4", NULL};
    struct lbt_ids warm;
    json_t *lease;
    char id[LBT_ID_MAX] = "";
    pid_t pid;

    start_with(args);
    /* a seed that comes after the warm sandbox's max age (a loaded machine) misses the pool:
     * its sandbox is not the pool's, released, and tried again */
    for (int attempt = 0; attempt < 5; attempt++) {
        wait_warm(1, 60, &warm);
        lease = lbt_seed(&D, "recycle-age", "task-r", NULL);
        snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
        json_decref(lease);
        if (strcmp(id, warm.id[0]) == 0)
            break;
        lbt_release_session(&D, "recycle-age");
    }
    ck_assert_str_eq(id, warm.id[0]);
    pid = init_pid(id);
    lbt_sleep_ms(4500);
    lbt_release_session(&D, "recycle-age");
    ck_assert_int_eq(lbt_metric(&D, RECYCLED), 0);
    ck_assert_int_eq(lbt_log_count(&D, "reached pool.max_age: not recycled"), 1);
    if (pid > 0)
        ck_assert(wait_pid_gone(pid, 5000));
    wait_warm(1, 60, &warm);
    ck_assert_str_ne(warm.id[0], id);
}
END_TEST

/* ---------- recycling in place (local provider, image host, tmpfs storage) ---------- */

/* Skip unless a recycle here is in place: the local provider, seeds on the host's root. */
#define SKIP_UNLESS_IN_PLACE()                                                                     \
    do {                                                                                           \
        if (lbt_variant_engine() || !lbt_variant_on_host()) {                                      \
            lbt_skip_note(__func__, "in-place recycling is the local provider's, image host");     \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* A descriptor's string field (asserts the descriptor exists); malloc'd. */
static char *desc_str(const char *id, const char *field)
{
    json_t *desc = lbt_read_descriptor(&D, id);
    char *v;

    ck_assert_msg(desc != NULL, "sandbox %s has no descriptor", id);
    v = json_string_value(json_object_get(desc, field))
            ? strdup(json_string_value(json_object_get(desc, field)))
            : NULL;
    json_decref(desc);
    return v;
}

/* Recycled in place: the pool's next sandbox is the released one's, not a new one (the same
 * init process), under a new id: its directory renamed to that id, its hostname the new id,
 * its descriptor naming the id it was made under (its cgroup's, which stays); nothing of the
 * episode before is seen (episode()), the old id answers 404. Its final stop (a delete) ends
 * the init and removes the directory and the cgroup of the first name. */
START_TEST(test_recycle_in_place)
{
    static const char *const args[] = {"--set", "pool.size=1", "--set", "pool.recycle=yes", NULL};
    struct lbt_ids warm;
    char first[LBT_ID_MAX], made_at[64], *id, *token, *name, *host;
    json_t *rec;
    pid_t pid;
    int cgroups;

    SKIP_UNLESS_IN_PLACE();
    start_with(args);
    wait_warm(1, 60, &warm);
    snprintf(first, sizeof(first), "%s", warm.id[0]);
    pid = init_pid(first);
    ck_assert_int_gt(pid, 0);
    rec = record_get(first);
    snprintf(made_at, sizeof(made_at), "%s", json_string_value(json_object_get(rec, "created_at")));
    json_decref(rec);
    cgroups = lbt_count_cgroup_dirs(first);
    ck_assert_int_gt(cgroups, 0);
    for (int n = 0; n < 3; n++) {
        char was[LBT_ID_MAX];

        snprintf(was, sizeof(was), "%s", warm.id[0]);
        id = episode(n, &token);
        ck_assert_str_eq(id, was);
        assert_gone(id, token);
        ck_assert_int_eq(lbt_metric(&D, RECYCLED), n + 1);
        wait_warm(1, 60, &warm);
        ck_assert_str_ne(warm.id[0], id);
        /* the same sandbox: its init, its cgroup under the first id; its directory renamed */
        ck_assert_int_eq(init_pid(warm.id[0]), pid);
        ck_assert_ptr_null(lbt_read_descriptor(&D, id));
        name = desc_str(warm.id[0], "name");
        ck_assert_str_eq(name, first);
        free(name);
        ck_assert_int_eq(lbt_count_cgroup_dirs(first), cgroups);
        ck_assert_int_eq(lbt_count_cgroup_dirs(warm.id[0]), 0);
        /* its age goes on (pool.max_age counts from when it was made) */
        rec = record_get(warm.id[0]);
        ck_assert_str_eq(json_string_value(json_object_get(rec, "created_at")), made_at);
        json_decref(rec);
        free(id);
        free(token);
    }
    ck_assert_int_eq(lbt_log_count(&D, "reset in place and handed over to warm sandbox"), 3);
    /* the next episode's hostname is its own id */
    {
        json_t *lease = lbt_seed(&D, "recycle-host", "task-r", NULL);
        const char *sid = json_string_value(json_object_get(lease, "sandbox_id"));
        const char *tok =
            json_string_value(json_object_get(json_object_get(lease, "access"), "token"));
        char want[LBT_ID_MAX + 2];

        ck_assert_str_eq(sid, warm.id[0]);
        host = op_sh(sid, tok, "hostname");
        snprintf(want, sizeof(want), "%.63s\n", sid);
        ck_assert_str_eq(host, want);
        free(host);
        json_decref(lease);
    }
    /* max_uses reached nowhere, the pool full: a delete stops it for good */
    {
        char path[128];
        struct lbt_resp r;

        snprintf(path, sizeof(path), "/v1/sandboxes/%s", warm.id[0]);
        lbt_json(&D, "DELETE", path, "", NULL, &r);
        ck_assert_msg(r.status == 200, "DELETE: %ld %s", r.status, r.body);
        lbt_resp_free(&r);
    }
    ck_assert(wait_pid_gone(pid, 5000));
    ck_assert_ptr_null(lbt_read_descriptor(&D, warm.id[0]));
    ck_assert_int_eq(lbt_count_cgroup_dirs(first), 0);
    ck_assert_int_eq(lbt_metric(&D, RESET_FAILURES), 0);
}
END_TEST

/* The hand-over fails (fault lend.hand_over, once; the sandbox already reset): the release
 * answers as always, the old sandbox is stopped under its own id (released, 404, its init
 * gone), the new id's record is stopped with reason reset_failed and left nothing (no
 * directory, no cgroup); it counts as a reset failure; the pool's place is filled by a stop and
 * a make, and the next release recycles in place again. */
START_TEST(test_recycle_hand_over_failure)
{
    static const char *const args[] = {"--set", "pool.size=1",
                                       "--set", "pool.recycle=yes",
                                       "--set", "faults.spec=lend.hand_over=fail:1",
                                       NULL};
    struct lbt_ids warm;
    char failed[64], *id, *token;
    pid_t pid;

    SKIP_UNLESS_IN_PLACE();
    start_with(args);
    wait_warm(1, 60, &warm);
    pid = init_pid(warm.id[0]);
    id = episode(0, &token);
    assert_gone(id, token);
    free(token);
    ck_assert(wait_pid_gone(pid, 5000));
    ck_assert_ptr_null(lbt_read_descriptor(&D, id));
    ck_assert_int_eq(lbt_count_cgroup_dirs(id), 0);
    ck_assert_int_eq(lbt_metric(&D, RESET_FAILURES), 1);
    the_record_stopped_for("reset_failed", failed, sizeof(failed));
    ck_assert_str_ne(failed, id);
    ck_assert_ptr_null(lbt_read_descriptor(&D, failed));
    ck_assert_int_eq(lbt_count_cgroup_dirs(failed), 0);
    wait_warm(1, 60, &warm);
    ck_assert(!lbt_ids_has(&warm, failed) && !lbt_ids_has(&warm, id));
    free(id);
    id = episode(1, &token);
    assert_gone(id, token);
    free(token);
    free(id);
    ck_assert_int_eq(lbt_log_count(&D, "reset in place and handed over to warm sandbox"), 1);
    ck_assert_int_eq(lbt_metric(&D, RESET_FAILURES), 1);
}
END_TEST

/* kill -9 of the daemon while a recycle is held at fault point op: lend.hand_over (the sandbox
 * reset under the old id, the new id recorded starting) or lend.handed_over (the sandbox renamed
 * to the new id, nothing recorded of it yet). After a restart both records are stopped, the
 * sandbox's init is gone, and no directory or cgroup of either id is left; the pool is made
 * again. */
static void recycle_kill9_at(const char *op)
{
    char hold[128], spec[200], rsid[] = "recycle-kill9", needle[96];
    const char *args[] = {"--set", "pool.size=1", "--set", "pool.recycle=yes", "--set", spec, NULL};
    struct lbt_ids warm, starting;
    struct lbt_async *job;
    char first[LBT_ID_MAX], path[128];
    json_t *lease;
    pid_t pid;

    snprintf(hold, sizeof(hold), "/tmp/lbt-hold-recycle-%d", (int)getpid());
    (void)unlink(hold);
    snprintf(spec, sizeof(spec), "faults.spec=%s=hold:%s", op, hold);
    snprintf(needle, sizeof(needle), "fault injected: %s holds", op);
    start_with(args);
    wait_warm(1, 60, &warm);
    snprintf(first, sizeof(first), "%s", warm.id[0]);
    pid = init_pid(first);
    lease = lbt_seed(&D, rsid, "task-r", NULL);
    ck_assert_str_eq(json_string_value(json_object_get(lease, "sandbox_id")), first);
    json_decref(lease);
    snprintf(path, sizeof(path), "/v1/sessions/%s/release", rsid);
    job = lbt_async_json(&D, "POST", path, D.admin_token, NULL);
    for (int i = 0; i < 1200 && lbt_log_count(&D, needle) < 1; i++)
        lbt_sleep_ms(50);
    ck_assert_int_eq(lbt_log_count(&D, needle), 1);
    lbt_records_in_state(&D, "starting", &starting);
    ck_assert_int_eq(starting.n, 1);
    lbt_daemon_kill(&D);
    {
        struct lbt_resp r;

        lbt_async_join(job, &r);
        lbt_resp_free(&r);
    }
    snprintf(spec, sizeof(spec), "faults.spec=");
    lbt_daemon_restart(&D, args);
    ck_assert(wait_pid_gone(pid, 5000));
    const char *ids[2] = {first, starting.id[0]};
    for (int i = 0; i < 2; i++) {
        json_t *rec = lbt_record(&D, ids[i]);
        char dir[512];

        ck_assert_ptr_nonnull(rec);
        ck_assert_str_eq(json_string_value(json_object_get(rec, "state")), "stopped");
        json_decref(rec);
        snprintf(dir, sizeof(dir), "%s/sandboxes/%s", D.state_dir, ids[i]);
        ck_assert_msg(!lbt_path_exists(dir), "%s left behind", dir);
    }
    ck_assert_int_eq(lbt_count_cgroup_dirs(first), 0);
    wait_warm(1, 60, &warm);
    ck_assert(!lbt_ids_has(&warm, first) && !lbt_ids_has(&warm, starting.id[0]));
    (void)unlink(hold);
}

START_TEST(test_recycle_kill9_at_hand_over)
{
    SKIP_UNLESS_IN_PLACE();
    recycle_kill9_at("lend.hand_over");
}
END_TEST

START_TEST(test_recycle_kill9_after_hand_over)
{
    SKIP_UNLESS_IN_PLACE();
    recycle_kill9_at("lend.handed_over");
}
END_TEST

/* The hand-over done but its record not written (fault lend.handed_over, once): the sandbox is
 * stopped under the new id (reset_failed: no directory, no cgroup, its init gone), the old
 * record is stopped (released) and the release answers as always; a reset failure, and the
 * pool's place is filled by a stop and a make. */
START_TEST(test_recycle_handed_over_unrecorded)
{
    static const char *const args[] = {"--set", "pool.size=1",
                                       "--set", "pool.recycle=yes",
                                       "--set", "faults.spec=lend.handed_over=fail:1",
                                       NULL};
    struct lbt_ids warm;
    char failed[64], first[LBT_ID_MAX], *id, *token;
    pid_t pid;

    SKIP_UNLESS_IN_PLACE();
    start_with(args);
    wait_warm(1, 60, &warm);
    snprintf(first, sizeof(first), "%s", warm.id[0]);
    pid = init_pid(first);
    id = episode(0, &token);
    assert_gone(id, token);
    free(token);
    ck_assert(wait_pid_gone(pid, 5000));
    ck_assert_int_eq(lbt_metric(&D, RESET_FAILURES), 1);
    the_record_stopped_for("reset_failed", failed, sizeof(failed));
    ck_assert_str_ne(failed, id);
    ck_assert_ptr_null(lbt_read_descriptor(&D, failed));
    ck_assert_ptr_null(lbt_read_descriptor(&D, id));
    ck_assert_int_eq(lbt_count_cgroup_dirs(first), 0);
    wait_warm(1, 60, &warm);
    ck_assert(!lbt_ids_has(&warm, failed) && !lbt_ids_has(&warm, id));
    free(id);
}
END_TEST

/* A late exec of a recycle: a daemon with a pool of 1 recycling and fault op held until the
 * file hold exists; the sandbox seeded for rsid (id, operate token); an exec of body with the
 * admin's token (admin) or the episode's, begun and held at op. */
struct late_exec {
    char hold[128], spec[200], sid[LBT_ID_MAX], tok[256];
    struct lbt_async *job;
};

static void late_exec_begin(struct late_exec *t, const char *op, const char *rsid, bool admin,
                            const char *body)
{
    const char *args[] = {"--set", "pool.size=1", "--set", "pool.recycle=yes",
                          "--set", t->spec,       NULL};
    char path[128], needle[96];
    struct lbt_ids warm;
    json_t *lease;

    snprintf(t->hold, sizeof(t->hold), "/tmp/lbt-hold-%s-%d", rsid, (int)getpid());
    (void)unlink(t->hold);
    snprintf(t->spec, sizeof(t->spec), "faults.spec=%s=hold:%s", op, t->hold);
    start_with(args);
    wait_warm(1, 60, &warm);
    lease = lbt_seed(&D, rsid, "task-r", NULL);
    snprintf(t->sid, sizeof(t->sid), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    snprintf(t->tok, sizeof(t->tok), "%s",
             json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", t->sid);
    t->job = lbt_async_json(&D, "POST", path, admin ? D.admin_token : t->tok, body);
    snprintf(needle, sizeof(needle), "fault injected: %s holds", op);
    for (int i = 0; i < 1200 && lbt_log_count(&D, needle) < 1; i++)
        lbt_sleep_ms(50);
    ck_assert_int_eq(lbt_log_count(&D, needle), 1);
}

/* Let the held calls go. */
static void late_exec_release(const struct late_exec *t)
{
    int fd = open(t->hold, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);

    ck_assert_int_ge(fd, 0);
    close(fd);
}

/* The held exec ends without a clean exit (or is refused), and the next episode, seeded for
 * rsid on the recycled sandbox, sees nothing of it: look prints only "done". go_after_seed: the
 * held exec is let go only once the next episode has the sandbox (else it was let go). */
static void late_exec_check(struct late_exec *t, const char *rsid, const char *look,
                            bool go_after_seed)
{
    struct lbt_ids warm;
    struct lbt_resp r;
    json_t *lease;
    char *out;

    ck_assert_int_eq(lbt_metric(&D, RECYCLED), 1);
    wait_warm(1, 60, &warm);
    lease = lbt_seed(&D, rsid, "task-r", NULL);
    ck_assert_str_eq(json_string_value(json_object_get(lease, "sandbox_id")), warm.id[0]);
    if (go_after_seed)
        late_exec_release(t);
    lbt_async_join(t->job, &r);
    ck_assert_msg(r.status != 200 ||
                      json_integer_value(json_object_get(r.json, "return_code")) != 0,
                  "the held exec ran: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    out =
        op_sh(warm.id[0],
              json_string_value(json_object_get(json_object_get(lease, "access"), "token")), look);
    ck_assert_msg(strcmp(out, "done\n") == 0, "the old id's exec reached the next episode: %s",
                  out);
    free(out);
    json_decref(lease);
    (void)unlink(t->hold);
}

/* An exec admitted with the episode's token whose provider call is under way when the release
 * comes (fault provider.exec=hold:): the recycle waits for its start, and the reset ends it; the
 * next episode (the same sandbox under a new id) sees neither its file nor its process. */
START_TEST(test_recycle_late_exec)
{
    struct late_exec t;
    struct lbt_async *rel;
    struct lbt_resp r;

    SKIP_UNLESS_IN_PLACE();
    late_exec_begin(&t, "provider.exec", "recycle-late", false,
                    "{\"command\": \"touch /tmp/late-exec; exec sleep 3133.4242\", "
                    "\"timeout_s\": 1000}");
    rel = lbt_async_json(&D, "POST", "/v1/sessions/recycle-late/release", D.admin_token, NULL);
    lbt_sleep_ms(300);
    ck_assert(!lbt_async_done(rel)); /* it waits for the exec's start */
    late_exec_release(&t);
    lbt_async_join(rel, &r);
    ck_assert_msg(r.status == 200, "release: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    late_exec_check(&t, "recycle-late-2",
                    "ls /tmp/late-exec 2>/dev/null; for p in /proc/[0-9]*; do "
                    "grep -q '[3]133[.]4242' $p/cmdline 2>/dev/null && echo \"process "
                    "${p#/proc/}\"; done; echo done",
                    false);
}
END_TEST

/* An admin's exec of the episode's sandbox held right before its helper starts (fault
 * exec.spawn=hold:) while the release recycles the sandbox and the next episode takes it: let
 * go, the exec fails (the sandbox is no longer its id's) and its file is not in the next
 * episode's workdir. */
START_TEST(test_recycle_late_admin_exec)
{
    struct late_exec t;

    SKIP_UNLESS_IN_PLACE();
    late_exec_begin(&t, "exec.spawn", "recycle-admin", true,
                    "{\"command\": \"echo planted > /workspace/planted\"}");
    lbt_release_session(&D, "recycle-admin");
    /* the next episode takes the sandbox before the held exec goes on */
    late_exec_check(&t, "recycle-admin-2", "ls /workspace; echo done", true);
}
END_TEST

/* An upload with the episode's token still sending its body (curl --limit-rate) when the
 * release recycles the sandbox: it is not committed (404: its sandbox is no longer that id's)
 * and the next episode's workdir does not have the file. */
START_TEST(test_recycle_upload_in_flight)
{
    static const char *const args[] = {"--set", "pool.size=1", "--set", "pool.recycle=yes", NULL};
    char sid[LBT_ID_MAX], tok[256], cmd[1024], file[96], code[16] = "";
    struct lbt_ids warm;
    json_t *lease;
    FILE *curl, *f;
    char *out;

    SKIP_UNLESS_IN_PLACE();
    start_with(args);
    wait_warm(1, 60, &warm);
    lease = lbt_seed(&D, "recycle-upload", "task-r", NULL);
    snprintf(sid, sizeof(sid), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    snprintf(tok, sizeof(tok), "%s",
             json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
    snprintf(file, sizeof(file), "/tmp/lbt-recycle-upload-%d", (int)getpid());
    f = fopen(file, "we");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 96 * 1024; i++)
        fputc('u', f);
    fclose(f);
    snprintf(cmd, sizeof(cmd),
             "curl -s -o /dev/null -w '%%{http_code}' --limit-rate 24k -T %s "
             "-H 'Authorization: Bearer %s' '%s/v1/sandboxes/%s/files?path=/workspace/uploaded'",
             file, tok, D.base_url, sid);
    curl = popen(cmd, "r");
    ck_assert_ptr_nonnull(curl);
    lbt_sleep_ms(1000); /* the upload is under way: about a quarter of it sent */
    lbt_release_session(&D, "recycle-upload");
    ck_assert_int_eq(lbt_metric(&D, RECYCLED), 1);
    ck_assert_ptr_nonnull(fgets(code, sizeof(code), curl));
    pclose(curl);
    unlink(file);
    ck_assert_msg(strcmp(code, "204") != 0, "the old token's upload was committed: %s", code);
    wait_warm(1, 60, &warm);
    lease = lbt_seed(&D, "recycle-upload-2", "task-r", NULL);
    ck_assert_str_eq(json_string_value(json_object_get(lease, "sandbox_id")), warm.id[0]);
    out = op_sh(warm.id[0],
                json_string_value(json_object_get(json_object_get(lease, "access"), "token")),
                "ls -A /workspace; echo done");
    ck_assert_msg(strcmp(out, "done\n") == 0, "the old token's upload reached the next episode: %s",
                  out);
    free(out);
    json_decref(lease);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("warm");
    TCase *tc = tcase_create("warm");

    lbt_test_daemon_cleanup(tc, &D);
    tcase_set_timeout(tc, 400);
    tcase_add_test(tc, test_seed_takes_a_warm_sandbox);
    tcase_add_test(tc, test_other_class_does_not_take_it);
    tcase_add_test(tc, test_burst_of_50_against_10);
    tcase_add_test(tc, test_kill9_adopts_warm_sandboxes);
    tcase_add_test(tc, test_kill9_without_adopt_stops_them);
    tcase_add_test(tc, test_shutdown_sweep_stops_warm);
    tcase_add_test(tc, test_shutdown_sweep_no_keeps_warm);
    tcase_add_test(tc, test_max_age_replaces);
    tcase_add_test(tc, test_size_0_disables);
    tcase_add_test(tc, test_pool_never_exceeds_max_sandboxes);
    tcase_add_test(tc, test_fills_with_a_default_image_list);
    tcase_add_test(tc, test_failed_refills_back_off);
    tcase_add_test(tc, test_refills_recover_after_failures);
    tcase_add_test(tc, test_class_follows_an_import);
    suite_add_tcase(s, tc);
    TCase *tr = tcase_create("recycle");
    lbt_test_daemon_cleanup(tr, &D);
    tcase_set_timeout(tr, 120);
    tcase_add_test(tr, test_recycle_max_uses);
    tcase_add_test(tr, test_recycle_off_keeps_refilling);
    tcase_add_test(tr, test_recycle_reset_failure);
    tcase_add_test(tr, test_recycle_needs_reset);
    tcase_add_test(tr, test_recycle_in_place);
    tcase_add_test(tr, test_recycle_hand_over_failure);
    tcase_add_test(tr, test_recycle_kill9_at_hand_over);
    tcase_add_test(tr, test_recycle_kill9_after_hand_over);
    tcase_add_test(tr, test_recycle_handed_over_unrecorded);
    tcase_add_test(tr, test_recycle_late_admin_exec);
    tcase_add_test(tr, test_recycle_upload_in_flight);
    tcase_add_test(tr, test_recycle_late_exec);
    tcase_add_test(tr, test_recycle_not_past_max_age);
    suite_add_tcase(s, tr);
    TCase *t200 = tcase_create("recycle_200");
    lbt_test_daemon_cleanup(t200, &D);
    tcase_set_timeout(t200, 600);
    tcase_add_test(t200, test_recycle_200_episodes);
    suite_add_tcase(s, t200);
    TCase *tn = tcase_create("refill_nice");
    lbt_test_daemon_cleanup(tn, &D);
    tcase_set_timeout(tn, 120);
    tcase_add_test(tn, test_refills_run_nicer_than_the_daemon);
    suite_add_tcase(s, tn);
    return lbt_run_suite(s);
}
