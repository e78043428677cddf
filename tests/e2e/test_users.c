/*
 * test_users.c - acceptance for exec as any user: each sandbox maps a slot of
 * 65536 host ids, exec's `user` is a name of the sandbox's own /etc/passwd or a number, its
 * groups come from the sandbox's /etc/group only, unknown users are a 400, files uploaded
 * with ?owner= belong to that user, slots survive a daemon crash, and release kills every
 * process of the slot.
 */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define SLOT_IDS 65536u

static struct lbt_daemon D;

/* Seed rsid; its sandbox id into sbx. */
static void seed(const char *rsid, char *sbx, size_t size)
{
    json_t *lease = lbt_seed(&D, rsid, "task-users", NULL);

    snprintf(sbx, size, "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
}

static void release(const char *rsid)
{
    struct lbt_resp r;
    char path[128];

    snprintf(path, sizeof(path), "/v1/sessions/%s/release", rsid);
    lbt_json(&D, "POST", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "release %s: %ld %s", rsid, r.status, r.body);
    lbt_resp_free(&r);
}

/* Exec body (JSON) in sbx and return its stdout (caller frees); asserts return code rc. */
static char *run(const char *sbx, const char *body, int rc)
{
    json_t *res = lbt_exec_ok(&D, sbx, "", body);
    char *out;

    ck_assert_msg(json_integer_value(json_object_get(res, "return_code")) == rc,
                  "exec %s: return code %lld, stderr %s", body,
                  (long long)json_integer_value(json_object_get(res, "return_code")),
                  json_string_value(json_object_get(res, "stderr")));
    out = strdup(json_string_value(json_object_get(res, "stdout")));
    json_decref(res);
    return out;
}

/* The host pid of the (single) process of this run (lbt_proc_of_run) whose command line is
 * exactly cmdline, or 0. */
static pid_t find_proc(const char *cmdline)
{
    DIR *dir = opendir("/proc");
    struct dirent *e;
    pid_t found = 0;

    ck_assert_ptr_nonnull(dir);
    while ((e = readdir(dir))) {
        char path[300], buf[256];
        size_t n;
        FILE *f;

        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
        f = fopen(path, "re");
        if (!f)
            continue;
        n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        for (size_t i = 0; i + 1 < n; i++)
            if (buf[i] == '\0')
                buf[i] = ' ';
        if (strcmp(buf, cmdline) == 0 && lbt_proc_of_run(e->d_name))
            found = (pid_t)atoi(e->d_name);
    }
    closedir(dir);
    return found;
}

/* Real uid of host pid from /proc/<pid>/status. */
static uid_t host_uid_of(pid_t pid)
{
    char path[64], line[256];
    unsigned u = 0;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "re");
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "Uid: %u", &u) == 1)
            break;
    fclose(f);
    return (uid_t)u;
}

/* Start `sleep N` (N unique to this test process and tag) as user in the background of sbx;
 * returns the command line to look for. */
static void start_sleeper(const char *sbx, const char *user, int tag, char *cmdline, size_t size)
{
    char body[512];
    json_t *res;

    snprintf(cmdline, size, "sleep %d%d", 1000 + tag, (int)getpid());
    snprintf(body, sizeof(body),
             "{\"command\": \"%s >/dev/null 2>&1 &\", \"user\": \"%s\", "
             "\"preserve_background_services\": true}",
             cmdline, user);
    res = lbt_exec_ok(&D, sbx, "", body);
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    json_decref(res);
}

START_TEST(test_nobody_ids_and_groups)
{
    char sbx[64], *out, *tok, *save = NULL;
    gid_t host_groups[256];
    int nhost = getgroups(256, host_groups);

    LBT_SKIP_ON_VARIANT("docker", "about the local provider's id slots and in-sandbox user switch");

    ck_assert_int_ge(nhost, 0);
    seed("users-1", sbx, sizeof(sbx));
    out = run(sbx, "{\"command\": \"id -u; id -g\", \"user\": \"nobody\"}", 0);
    ck_assert_str_eq(out, "65534\n65534\n");
    free(out);
    out = run(sbx, "{\"command\": \"id -G\", \"user\": \"nobody\"}", 0);
    ck_assert_msg(strlen(out) > 1, "id -G printed nothing");
    for (tok = strtok_r(out, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save)) {
        long g = strtol(tok, NULL, 10);

        ck_assert_msg(g != 0, "nobody is in group 0: %s", tok);
        for (int i = 0; i < nhost; i++)
            ck_assert_msg(g != (long)host_groups[i] || g == 65534,
                          "nobody has the host's group %ld", g);
        ck_assert_msg(g != (long)getgid() || g == 65534, "nobody has the host's gid %ld", g);
    }
    free(out);
    /* HOME from the sandbox's passwd (nobody's is /nonexistent on Debian) */
    out = run(sbx, "{\"command\": \"echo $HOME\", \"user\": \"nobody\"}", 0);
    ck_assert_str_ne(out, "/root\n");
    free(out);
    out = run(sbx, "{\"command\": \"echo $HOME; id -u\"}", 0);
    ck_assert_str_eq(out, "/root\n0\n");
    free(out);
    release("users-1");
}
END_TEST

START_TEST(test_numeric_and_unknown_users)
{
    struct lbt_resp r;
    char sbx[64], *out;

    LBT_SKIP_ON_VARIANT("docker", "about the local provider's id slots and in-sandbox user switch");

    seed("users-2", sbx, sizeof(sbx));
    out = run(sbx, "{\"command\": \"id -u; id -g\", \"user\": 1000}", 0);
    ck_assert_str_eq(out, "1000\n1000\n");
    free(out);
    out = run(sbx, "{\"command\": \"id -u\", \"user\": \"1000\"}", 0);
    ck_assert_str_eq(out, "1000\n");
    free(out);
    out = run(sbx, "{\"command\": \"id -u; id -g\", \"user\": \"nobody:0\"}", 0);
    ck_assert_str_eq(out, "65534\n0\n");
    free(out);

    lbt_exec(&D, sbx, "", "{\"command\": \"id -u\", \"user\": \"nosuchuser\"}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    ck_assert_msg(strstr(r.body, "unknown user \\\"nosuchuser\\\""), "body: %s", r.body);
    lbt_resp_free(&r);
    lbt_exec(&D, sbx, "", "{\"command\": \"id -u\", \"user\": 70000}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    lbt_exec(&D, sbx, "", "{\"command\": \"id -u\", \"user\": \"nobody:nosuchgroup\"}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    ck_assert_msg(strstr(r.body, "nosuchgroup"), "body: %s", r.body);
    lbt_resp_free(&r);
    release("users-2");
}
END_TEST

START_TEST(test_file_permissions_between_users)
{
    char sbx[64], *out;

    LBT_SKIP_ON_VARIANT("docker", "about the local provider's id slots and in-sandbox user switch");

    seed("users-3", sbx, sizeof(sbx));
    out = run(sbx,
              "{\"command\": \"touch /tmp/x && chmod 600 /tmp/x && stat -c '%u %a' /tmp/x "
              "/tmp /dev/shm\", \"user\": \"nobody\"}",
              0);
    ck_assert_str_eq(out, "65534 600\n0 1777\n0 1777\n");
    free(out);
    /* another uid can neither write nor read it */
    out = run(sbx, "{\"command\": \"echo hi > /tmp/x\", \"user\": 1000}", 2); /* sh: EACCES */
    free(out);
    out = run(sbx, "{\"command\": \"cat /tmp/x\", \"user\": 1000}", 1);
    free(out);
    /* its owner can */
    out = run(sbx, "{\"command\": \"echo hi > /tmp/x && cat /tmp/x\", \"user\": \"nobody\"}", 0);
    ck_assert_str_eq(out, "hi\n");
    free(out);
    release("users-3");
}
END_TEST

START_TEST(test_upload_owner)
{
    struct lbt_resp r;
    char sbx[64], url[512], *out;

    LBT_SKIP_ON_VARIANT("docker", "about the local provider's id slots and in-sandbox user switch");

    seed("users-4", sbx, sizeof(sbx));
    snprintf(url, sizeof(url),
             "/v1/sandboxes/%s/files?path=%%2Fworkspace%%2Fowned.txt&owner=nobody", sbx);
    lbt_request(&D, "PUT", url, "", "mine\n", 5, "application/octet-stream", &r);
    ck_assert_msg(r.status == 200 || r.status == 201 || r.status == 204, "PUT: %ld %s", r.status,
                  r.body);
    lbt_resp_free(&r);
    lbt_file_put(&D, sbx, "", "/workspace/root.txt", NULL, "root\n", 5, &r);
    ck_assert_msg(r.status < 300, "PUT: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    out = run(sbx, "{\"command\": \"stat -c '%u %g %a' /workspace/owned.txt /workspace/root.txt\"}",
              0);
    ck_assert_str_eq(out, "65534 65534 644\n0 0 644\n");
    free(out);
    /* nobody may write its own file */
    out = run(sbx,
              "{\"command\": \"echo more >> /workspace/owned.txt && cat /workspace/owned.txt\", "
              "\"user\": \"nobody\"}",
              0);
    ck_assert_str_eq(out, "mine\nmore\n");
    free(out);
    /* an unknown owner: 400 naming it, and nothing is written */
    snprintf(url, sizeof(url),
             "/v1/sandboxes/%s/files?path=%%2Fworkspace%%2Fnot.txt&owner=nosuchuser", sbx);
    lbt_request(&D, "PUT", url, "", "x", 1, "application/octet-stream", &r);
    lbt_assert_error(&r, 400, "bad_request");
    ck_assert_msg(strstr(r.body, "nosuchuser"), "body: %s", r.body);
    lbt_resp_free(&r);
    out = run(sbx, "{\"command\": \"ls /workspace\"}", 0);
    ck_assert_str_eq(out, "owned.txt\nroot.txt\n");
    free(out);
    release("users-4");
}
END_TEST

START_TEST(test_host_ids_and_disjoint_slots)
{
    char a[64], b[64], cmdline[64];
    uid_t ua, ub, u;
    pid_t pid;

    LBT_SKIP_ON_VARIANT("docker", "about the local provider's id slots and in-sandbox user switch");

    seed("users-5a", a, sizeof(a));
    seed("users-5b", b, sizeof(b));
    ua = lbt_sandbox_uid(&D, a);
    ub = lbt_sandbox_uid(&D, b);
    /* slot-aligned, inside the daemon's range, disjoint */
    ck_assert_uint_eq((ua - D.uid_base) % SLOT_IDS, 0);
    ck_assert_uint_eq((ub - D.uid_base) % SLOT_IDS, 0);
    ck_assert_uint_lt(ua - D.uid_base, D.uid_count * SLOT_IDS);
    ck_assert_uint_lt(ub - D.uid_base, D.uid_count * SLOT_IDS);
    ck_assert_msg(ua + SLOT_IDS <= ub || ub + SLOT_IDS <= ua, "slots overlap: %u %u", ua, ub);

    /* a process of nobody runs as host id slot + 65534 */
    start_sleeper(a, "nobody", 1, cmdline, sizeof(cmdline));
    pid = 0;
    for (int i = 0; i < 200 && !(pid = find_proc(cmdline)); i++)
        lbt_sleep_ms(20);
    ck_assert_msg(pid > 0, "no host process '%s'", cmdline);
    u = host_uid_of(pid);
    ck_assert_uint_eq(u, ua + 65534);
    ck_assert_uint_ge(u, ua);
    ck_assert_uint_lt(u, ua + SLOT_IDS);
    release("users-5a");
    release("users-5b");
}
END_TEST

START_TEST(test_release_kills_every_uid)
{
    char sbx[64], c1[64], c2[64];
    uid_t slot;

    LBT_SKIP_ON_VARIANT("docker", "about the local provider's id slots and in-sandbox user switch");

    seed("users-6", sbx, sizeof(sbx));
    slot = lbt_sandbox_uid(&D, sbx);
    start_sleeper(sbx, "nobody", 2, c1, sizeof(c1));
    start_sleeper(sbx, "1000", 3, c2, sizeof(c2));
    for (int i = 0; i < 200 && !(find_proc(c1) && find_proc(c2)); i++)
        lbt_sleep_ms(20);
    ck_assert_int_eq(lbt_count_live_procs_of_uid(slot + 65534), 1);
    ck_assert_int_eq(lbt_count_live_procs_of_uid(slot + 1000), 1);
    release("users-6");
    ck_assert_int_eq(lbt_count_live_procs_of_uid(slot + 65534), 0);
    ck_assert_int_eq(lbt_count_live_procs_of_uid(slot + 1000), 0);
    ck_assert_int_eq(lbt_count_live_procs_of_uid(slot), 0);
    ck_assert_int_eq(find_proc(c1), 0);
}
END_TEST

/* An activation's harness runs as its user; the launcher (root) still makes its directory */
START_TEST(test_activation_user)
{
    struct lbt_resp r;
    char sbx[64], *out;

    LBT_SKIP_ON_VARIANT("docker", "about the local provider's in-sandbox user switch");
    seed("users-8", sbx, sizeof(sbx));
    lbt_json(&D, "POST", "/v1/sessions/users-8/execute", "",
             "{\"argv\": [\"sh\", \"-c\", \"id -u > /tmp/act.txt; id -G >> /tmp/act.txt\"], "
             "\"user\": \"nobody\"}",
             &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    ck_assert_msg(strcmp(json_string_value(json_object_get(r.json, "state")), "finished") == 0,
                  "execute: %s", r.body);
    lbt_resp_free(&r);
    out = run(sbx, "{\"command\": \"cat /tmp/act.txt; stat -c %u /tmp/act.txt\"}", 0);
    ck_assert_str_eq(out, "65534\n65534\n65534\n");
    free(out);
    release("users-8");
}
END_TEST

/* A PTY session (and a detached exec) as a user: its command runs as that user, while the
 * launcher and holder stay the sandbox's root (only root reaches the supervisor); an unknown
 * user is a 400 before anything starts. */
static void pty_as(const char *sbx, const char *body, const char *want)
{
    struct lbt_resp r;
    char path[256], sid[80];
    double until = lbt_now() + 120;
    const char *code = NULL;
    int exit_code = -1;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pty", sbx);
    lbt_json(&D, "POST", path, "", body, &r);
    ck_assert_msg(r.status == 201, "pty %s: %ld %s", body, r.status, r.body);
    snprintf(sid, sizeof(sid), "%s", json_string_value(json_object_get(r.json, "session_id")));
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/pty/%s/output?since=0&wait_ms=2000", sid);
    for (;;) {
        lbt_request(&D, "GET", path, "", NULL, 0, NULL, &r);
        ck_assert_msg(r.status == 200, "output: %ld %s", r.status, r.body);
        code = strcasestr(r.headers, "\nX-Exit-Code:");
        if (code || lbt_now() > until)
            break;
        lbt_resp_free(&r);
    }
    ck_assert_msg(code && sscanf(code, "\nX-Exit-Code: %d", &exit_code) == 1,
                  "no exit code in time");
    ck_assert_int_eq(exit_code, 0);
    ck_assert_msg(r.len == strlen(want) && memcmp(r.body, want, r.len) == 0,
                  "pty %s printed '%.*s', want '%s'", body, (int)r.len, r.body, want);
    lbt_resp_free(&r);
}

START_TEST(test_pty_as_user)
{
    struct lbt_resp r;
    char sbx[64], path[256];

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions");
    seed("users-pty", sbx, sizeof(sbx));
    pty_as(sbx, "{\"command\": \"id -u; id -g\", \"user\": \"nobody\", \"pty\": false}",
           "65534\n65534\n");
    pty_as(sbx, "{\"command\": \"id -u\", \"user\": 1000, \"pty\": false}", "1000\n");
    pty_as(sbx, "{\"command\": \"id -u\", \"pty\": false}", "0\n");
    /* on a terminal too (its output has CR LF) */
    pty_as(sbx, "{\"command\": \"id -u\", \"user\": \"nobody\"}", "65534\r\n");
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pty", sbx);
    lbt_json(&D, "POST", path, "", "{\"command\": \"id\", \"user\": \"nosuchuser\"}", &r);
    ck_assert_msg(r.status == 400 && strstr(r.body, "nosuchuser"), "unknown user: %ld %s", r.status,
                  r.body);
    lbt_resp_free(&r);
    release("users-pty");
}
END_TEST

START_TEST(test_slots_survive_a_crash)
{
    char a[64], b[64], c[64], *out;
    uid_t ua, ub, uc;

    LBT_SKIP_ON_VARIANT("docker", "about the local provider's id slots and in-sandbox user switch");

    seed("users-7a", a, sizeof(a));
    seed("users-7b", b, sizeof(b));
    ua = lbt_sandbox_uid(&D, a);
    ub = lbt_sandbox_uid(&D, b);
    lbt_daemon_kill(&D); /* kill -9 */
    lbt_daemon_restart(&D, NULL);
    seed("users-7c", c, sizeof(c));
    uc = lbt_sandbox_uid(&D, c);
    ck_assert_msg(uc != ua && uc != ub, "a new sandbox took a live slot: %u (live %u %u)", uc, ua,
                  ub);
    /* the adopted sandboxes still run as any user */
    out = run(a, "{\"command\": \"id -u\", \"user\": \"nobody\"}", 0);
    ck_assert_str_eq(out, "65534\n");
    free(out);
    release("users-7a");
    release("users-7b");
    release("users-7c");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("users");
    TCase *tc = tcase_create("users");

    tcase_set_timeout(tc, 300);
    lbt_fixture_add(tc, &(struct lbt_fixture){.d = &D}, false);
    tcase_add_test(tc, test_nobody_ids_and_groups);
    tcase_add_test(tc, test_numeric_and_unknown_users);
    tcase_add_test(tc, test_file_permissions_between_users);
    tcase_add_test(tc, test_upload_owner);
    tcase_add_test(tc, test_host_ids_and_disjoint_slots);
    tcase_add_test(tc, test_release_kills_every_uid);
    tcase_add_test(tc, test_activation_user);
    tcase_add_test(tc, test_slots_survive_a_crash);
    tcase_add_test(tc, test_pty_as_user);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
