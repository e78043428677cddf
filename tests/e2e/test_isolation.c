/*
 * test_isolation.c - acceptance: a sandbox sees only its own processes, cannot write the host's
 * /usr, runs as an unprivileged host uid while being root inside, and has only loopback.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static struct lbt_daemon D;
static char SBX[128];

static void seed(void)
{
    json_t *lease = lbt_seed(&D, "iso-1", "task-iso", NULL);

    snprintf(SBX, sizeof(SBX), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
}

START_TEST(test_own_processes_only)
{
    char *out, *line, *save = NULL, pidbuf[32];
    int n = 0, host_procs;

    /* every process visible inside, one "PID ARGS" per line */
    out = lbt_sh(&D, SBX,
                 "for p in /proc/[0-9]*; do printf '%s ' ${p#/proc/}; tr '\\0' ' ' < $p/cmdline; "
                 "echo; done 2>/dev/null");
    snprintf(pidbuf, sizeof(pidbuf), "%d ", (int)D.pid);
    for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        n++;
        ck_assert_msg(strstr(line, "lendboxd") == NULL, "the daemon is visible: %s", line);
        ck_assert_msg(strncmp(line, pidbuf, strlen(pidbuf)) != 0, "daemon pid visible: %s", line);
    }
    free(out);
    ck_assert_msg(n >= 2 && n <= 8, "%d processes visible inside the sandbox", n);
    /* the host sees more: the daemon, this test, and the sandbox's processes too */
    host_procs = lbt_count_procs_cmdline("");
    ck_assert_int_gt(host_procs, n);
    /* ps agrees, and pid 1 is the sandbox's own init */
    out = lbt_sh(&D, SBX, "ps ax -o pid= | wc -l; cat /proc/1/cmdline | tr '\\0' ' '");
    ck_assert_msg(atoi(out) >= 2 && atoi(out) <= 8, "ps: %s", out);
    ck_assert_msg(strstr(out, "supervise") != NULL, "pid 1 is not the sandbox init: %s", out);
    free(out);
}
END_TEST

START_TEST(test_usr_read_only)
{
    json_t *res;
    const char *err;

    if (!lbt_variant_on_host()) {
        /* on an image / is the sandbox's own copy-on-write root: writes work there and never
         * reach the host */
        free(lbt_sh(&D, SBX, "touch /usr/lbt-probe && echo x > /usr/bin/lbt-probe"));
        ck_assert(!lbt_path_exists("/usr/lbt-probe"));
        ck_assert(!lbt_path_exists("/usr/bin/lbt-probe"));
        free(lbt_sh(&D, SBX, "rm /usr/lbt-probe /usr/bin/lbt-probe"));
        return;
    }
    res = lbt_exec_ok(&D, SBX, "", "{\"command\": \"touch /usr/lbt-probe\"}");
    err = json_string_value(json_object_get(res, "stderr"));

    ck_assert_int_ne(json_integer_value(json_object_get(res, "return_code")), 0);
    ck_assert(json_is_null(json_object_get(res, "error_type")));
    ck_assert_msg(err && strstr(err, "Read-only"), "stderr: %s", err ? err : "(null)");
    json_decref(res);
    ck_assert(!lbt_path_exists("/usr/lbt-probe"));
    res = lbt_exec_ok(&D, SBX, "", "{\"command\": \"echo x > /usr/bin/lbt-probe\"}");
    ck_assert_int_ne(json_integer_value(json_object_get(res, "return_code")), 0);
    err = json_string_value(json_object_get(res, "stderr"));
    ck_assert_msg(err && strstr(err, "Read-only"), "stderr: %s", err ? err : "(null)");
    json_decref(res);
    ck_assert(!lbt_path_exists("/usr/bin/lbt-probe"));
    /* the workspace and /tmp are writable */
    free(lbt_sh(&D, SBX, "echo ok > /workspace/w && echo ok > /tmp/t"));
}
END_TEST

/* uid fields (real, effective, saved, fs) of pid from /proc/PID/status */
static void proc_uids(pid_t pid, unsigned u[4])
{
    char path[64], line[256];
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "re");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, "Uid:", 4))
            ck_assert_int_eq(sscanf(line + 4, "%u %u %u %u", &u[0], &u[1], &u[2], &u[3]), 4);
    fclose(f);
}

START_TEST(test_unprivileged_uid)
{
    char path[300];
    struct lbt_async *a;
    struct lbt_resp r;
    uid_t uid = lbt_sandbox_uid(&D, SBX);
    char *out;
    int found = 0;

    ck_assert_uint_ne(uid, 0);
    ck_assert_uint_ne(uid, getuid());
    out = lbt_sh(&D, SBX, "id -u; id -g");
    ck_assert_str_eq(out, "0\n0\n");
    free(out);
    /* a command running right now: on the host it is the sandbox's uid, in every field */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", SBX);
    a = lbt_async_json(&D, "POST", path, "",
                       "{\"command\": \"exec sleep 1013\", \"timeout_s\": 3}");
    for (int k = 0; k < 200 && !found; k++) {
        DIR *dir = opendir("/proc");
        struct dirent *e;

        while (dir && (e = readdir(dir))) {
            char cmd[300], buf[64] = "";
            FILE *f;

            if (e->d_name[0] < '0' || e->d_name[0] > '9')
                continue;
            snprintf(cmd, sizeof(cmd), "/proc/%s/cmdline", e->d_name);
            f = fopen(cmd, "re");
            if (!f)
                continue;
            size_t len = fread(buf, 1, sizeof(buf) - 1, f);
            fclose(f);
            /* only this sandbox's (another run may run the same command at the same time);
             * told by its cgroup, not by the uids asserted here */
            if (len == 11 && !memcmp(buf, "sleep\0001013", 11) &&
                lbt_proc_cgroup_has(atoi(e->d_name), SBX)) {
                unsigned u[4];

                proc_uids(atoi(e->d_name), u);
                for (int i = 0; i < 4; i++)
                    ck_assert_uint_eq(u[i], uid);
                found++;
            }
        }
        if (dir)
            closedir(dir);
        if (!found)
            lbt_sleep_ms(10);
    }
    lbt_async_join(a, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "error_type")), "timeout");
    lbt_resp_free(&r);
    ck_assert_int_eq(found, 1);
    /* and nothing of the sandbox runs as host root */
    ck_assert_int_gt(lbt_count_live_procs_of_uid(uid), 0);
}
END_TEST

START_TEST(test_loopback_only)
{
    char *out, host_ns[64] = "", *nl;
    ssize_t n;

    out = lbt_sh(&D, SBX, "sed -n '3,$p' /proc/net/dev | cut -d: -f1 | tr -d ' '");
    ck_assert_str_eq(out, "lo\n");
    free(out);
    /* its own network namespace, not the host's */
    n = readlink("/proc/self/ns/net", host_ns, sizeof(host_ns) - 1);
    ck_assert_int_gt(n, 0);
    host_ns[n] = '\0';
    out = lbt_sh(&D, SBX, "readlink /proc/self/ns/net");
    nl = strchr(out, '\n');
    ck_assert_ptr_nonnull(nl);
    *nl = '\0';
    ck_assert_str_ne(out, host_ns);
    free(out);
}
END_TEST

/* Commands have no capabilities, even in the sandbox's user namespace: they cannot remount
 * the read-only host directories or mount over the supervisor. */
START_TEST(test_no_capabilities)
{
    char *out = lbt_sh(&D, SBX, "grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status; umask");
    json_t *res;

    ck_assert_ptr_nonnull(strstr(out, "CapEff:\t0000000000000000"));
    ck_assert_ptr_nonnull(strstr(out, "CapPrm:\t0000000000000000"));
    ck_assert_ptr_nonnull(strstr(out, "CapBnd:\t0000000000000000"));
    ck_assert_ptr_nonnull(strstr(out, "0022"));
    free(out);
    unlink("/var/tmp/lendbox-iso-escape");
    res = lbt_exec_ok(&D, SBX, "",
                      "{\"command\": \"mount -o remount,bind,rw /var && "
                      "touch /var/tmp/lendbox-iso-escape\"}");
    ck_assert_int_ne(json_integer_value(json_object_get(res, "return_code")), 0);
    json_decref(res);
    ck_assert(!lbt_path_exists("/var/tmp/lendbox-iso-escape"));
    res = lbt_exec_ok(&D, SBX, "",
                      "{\"command\": \"echo x > /workspace/f && mount --bind /workspace/f "
                      "/run/lendbox/supervise\"}");
    ck_assert_int_ne(json_integer_value(json_object_get(res, "return_code")), 0);
    json_decref(res);
    out = lbt_sh(&D, SBX, "echo still supervised");
    ck_assert_str_eq(out, "still supervised\n");
    free(out);
}
END_TEST

/* The sandbox's root owns its IPC, network, UTS and pid namespaces, and the kernel lets a
 * namespace's root write their sysctls without capabilities; an in-place reset or a recycle
 * keeps those namespaces, so such a write would reach the next episode (a limit of 0 SysV
 * segments, a pid_max of 400). /proc/sys is read-only inside: each write fails, the values
 * stay, and reads show the sandbox's own namespaces (its hostname). */
START_TEST(test_sysctls_read_only)
{
    static const char *const files[] = {
        "/proc/sys/kernel/shmmni",  "/proc/sys/kernel/msgmni",
        "/proc/sys/kernel/sem",     "/proc/sys/fs/mqueue/queues_max",
        "/proc/sys/kernel/pid_max", "/proc/sys/net/ipv4/ip_local_port_range"};
    char cmd[512], *before, *out;

    LBT_SKIP_ON_ENGINE("about the local provider's /proc (an engine's containers have their own)");
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        snprintf(cmd, sizeof(cmd), "cat %s", files[i]);
        before = lbt_sh(&D, SBX, cmd);
        snprintf(cmd, sizeof(cmd), "(echo 0 > %s) 2>&1; echo \"rc=$?\"; cat %s", files[i],
                 files[i]);
        out = lbt_sh(&D, SBX, cmd);
        ck_assert_msg(strstr(out, "Read-only file system") && strstr(out, "rc=0") == NULL &&
                          strstr(out, before),
                      "%s: %s (was %s)", files[i], out, before);
        free(out);
        free(before);
    }
    out = lbt_sh(&D, SBX, "cat /proc/sys/kernel/hostname; hostname");
    ck_assert_msg(strncmp(out, SBX, 20) == 0, "the sandbox reads another hostname: %s", out);
    free(out);
}
END_TEST

/* The files API cannot replace what is mounted in the sandbox (the supervisor, /dev/null),
 * nor read kernel pseudo-files, nor be cut short by an encoded NUL. */
START_TEST(test_files_api_mount_points_and_pseudo_files)
{
    struct lbt_resp r;
    char path[512];
    char *out;

    lbt_file_put(&D, SBX, "", "/run/lendbox/supervise", "0755", "#!/bin/sh\n", 10, &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    lbt_file_put(&D, SBX, "", "/dev/null", NULL, "x", 1, &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    out = lbt_sh(&D, SBX, "test -c /dev/null && echo char device");
    ck_assert_str_eq(out, "char device\n");
    free(out);
    lbt_file_get(&D, SBX, "", "/proc/version", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?path=/etc/hostname%%00/x", SBX);
    lbt_request(&D, "GET", path, "", NULL, 0, NULL, &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
}
END_TEST

/* Resource limits are bounded, and a seed without one still gets a pids limit. */
START_TEST(test_resource_bounds)
{
    struct lbt_resp r;
    char *out;

    lbt_json(&D, "POST", "/v1/sessions/iso-big/seed", "",
             "{\"task_id\":\"t\",\"resources\":{\"memory_mib\":17592186044417}}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/iso-big/seed", "",
             "{\"task_id\":\"t\",\"resources\":{\"cpu\":1e300}}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    /* /tmp is a bounded tmpfs (1 GiB by default), not half the host's memory */
    out = lbt_sh(&D, SBX, "df -k /tmp | awk 'NR == 2 { print $2 }'");
    ck_assert_int_eq(atol(out), 1024 * 1024);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("isolation");
    TCase *tc = tcase_create("isolation");

    lbt_fixture_add(tc, &(struct lbt_fixture){.d = &D, .seed = seed}, true);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_own_processes_only);
    tcase_add_test(tc, test_usr_read_only);
    tcase_add_test(tc, test_unprivileged_uid);
    tcase_add_test(tc, test_loopback_only);
    tcase_add_test(tc, test_no_capabilities);
    tcase_add_test(tc, test_sysctls_read_only);
    tcase_add_test(tc, test_files_api_mount_points_and_pseudo_files);
    tcase_add_test(tc, test_resource_bounds);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
