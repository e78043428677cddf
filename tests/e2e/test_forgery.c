/*
 * test_forgery.c - forged results and reach beyond the sandbox, as kinds: nothing running
 * inside a sandbox can
 * read, write or hold a supervisor's channels (so a leftover agent process cannot forge or
 * stall a grader's exec), `exclusive` execs and activation close leave nothing of the agent
 * alive, every sandbox and exec has a session keyring of its own, and the default seccomp
 * filter refuses what sandboxes do not need while normal commands keep working.
 *
 * The hostile program is build/tests/lbt-probe (tests/e2e/lbt_probe.c), uploaded into each
 * sandbox through the files API and started with the sandbox's operate token, as an agent
 * would.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdatomic.h>
#include <linux/keyctl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* ---------- helpers ---------- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

/* build/tests/lbt-probe, next to the daemon's build directory. */
static void probe_path(char *buf, size_t size)
{
    const char *daemon = getenv("LENDBOXD") ? getenv("LENDBOXD") : "build/lendboxd";
    char copy[1024];

    snprintf(copy, sizeof(copy), "%s", daemon);
    snprintf(buf, size, "%s/tests/lbt-probe", dirname(copy));
}

static void upload_probe(struct lbt_daemon *d, const char *sbx)
{
    char path[1024];
    struct lbt_resp r;
    size_t len;
    char *data;

    probe_path(path, sizeof(path));
    data = read_file(path, &len);
    lbt_file_put(d, sbx, "", "/workspace/lbt-probe", "0755", data, len, &r);
    ck_assert_msg(r.status == 204, "upload of the probe: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    free(data);
}

/* Seed rsid; sandbox id into sbx, operate token into op. */
static void seed(struct lbt_daemon *d, const char *rsid, char *sbx, size_t sbx_len, char *op,
                 size_t op_len)
{
    json_t *lease = lbt_seed(d, rsid, "task-forgery", NULL);

    snprintf(sbx, sbx_len, "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    if (op)
        snprintf(op, op_len, "%s",
                 json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
}

/* As the agent (operate token): start the forger in the background, left running with
 * preserve_background_services; returns its pid inside the sandbox. */
static int start_forger(struct lbt_daemon *d, const char *sbx, const char *op, const char *log,
                        const char *mode)
{
    char body[1024], cmd[600];
    json_t *res;
    char *out;
    int pid;

    snprintf(cmd, sizeof(cmd),
             "/workspace/lbt-probe forge %s %s </dev/null >/dev/null 2>&1 & "
             "while [ ! -s %s.pid ]; do sleep 0.01; done",
             log, mode, log);
    snprintf(body, sizeof(body),
             "{\"command\": \"%s\", \"preserve_background_services\": true, \"timeout_s\": 30}",
             cmd);
    res = lbt_exec_ok(d, sbx, op, body);
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    json_decref(res);
    snprintf(cmd, sizeof(cmd), "cat %s.pid", log);
    out = lbt_sh(d, sbx, cmd);
    pid = atoi(out);
    free(out);
    ck_assert_int_gt(pid, 1);
    return pid;
}

/* The grader's exec (admin): must come back with its true code and output. */
static void assert_true_result(struct lbt_daemon *d, const char *sbx, const char *extra)
{
    char body[512];
    json_t *res;

    snprintf(body, sizeof(body),
             "{\"command\": \"sleep 0.3; echo true-output; exit 7\", \"timeout_s\": 20%s}", extra);
    res = lbt_exec_ok(d, sbx, "", body);
    ck_assert_msg(json_is_null(json_object_get(res, "error_type")), "error_type %s (stderr %s)",
                  json_string_value(json_object_get(res, "error_type")),
                  json_string_value(json_object_get(res, "stderr")));
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 7);
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "true-output\n");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stderr")), "");
    json_decref(res);
}

/* Every attempt on a supervisor in the forger's log failed; returns how many distinct
 * supervisors it attacked. */
static int assert_attacks_failed(struct lbt_daemon *d, const char *sbx, const char *log)
{
    static const char *const attempts[] = {"pidfd_getfd0", "pidfd_getfd1", "pidfd_getfd2",
                                           "pidfd_getfd3", "proc_fd1",     "proc_fd3",
                                           "proc_fd_dir",  "proc_mem",     "ptrace"};
    char cmd[300], *text, *line, *save = NULL;
    int supervisors = 0, checked = 0;

    snprintf(cmd, sizeof(cmd), "cat %s", log);
    text = lbt_sh(d, sbx, cmd);
    for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char what[64] = "", result[64] = "";
        int pid;

        if (sscanf(line, "%d %63s %63s", &pid, what, result) != 3)
            continue;
        for (size_t i = 0; i < sizeof(attempts) / sizeof(attempts[0]); i++) {
            if (strcmp(what, attempts[i]) == 0) {
                ck_assert_msg(strcmp(result, "ok") != 0, "the forger succeeded: %s", line);
                checked++;
            }
        }
        if (strcmp(what, "ptrace") == 0)
            supervisors++;
    }
    free(text);
    ck_assert_int_eq(checked, supervisors * 9);
    return supervisors;
}

/* Is pid alive inside the sandbox (as its own namespace numbers it)? */
static bool alive_inside(struct lbt_daemon *d, const char *sbx, int pid)
{
    char cmd[200], *out;
    bool alive;

    snprintf(cmd, sizeof(cmd), "if [ -d /proc/%d ]; then echo yes; else echo no; fi", pid);
    out = lbt_sh(d, sbx, cmd);
    alive = strncmp(out, "yes", 3) == 0;
    free(out);
    return alive;
}

/* ---------- the forger: a leftover agent process against a grader's exec ---------- */

static void forgery_scenario(const char *const *daemon_args)
{
    struct lbt_daemon d;
    char sbx[128], op[256];
    int pid, attacked;

    lbt_daemon_start(&d, daemon_args);
    seed(&d, "forge-1", sbx, sizeof(sbx), op, sizeof(op));
    upload_probe(&d, sbx);
    pid = start_forger(&d, sbx, op, "/workspace/forge.log", "");
    for (int i = 0; i < 3; i++)
        assert_true_result(&d, sbx, "");
    ck_assert(alive_inside(&d, sbx, pid));
    /* the forger saw and attacked the supervisor that started it and each grader's */
    attacked = assert_attacks_failed(&d, sbx, "/workspace/forge.log");
    ck_assert_int_ge(attacked, 4);
    lbt_daemon_cleanup(&d);
}

/* The supervisor's own protection (non-dumpable, exec-only, status fd never in the command),
 * without the seccomp filter's help. */
START_TEST(test_forger_fails_without_seccomp)
{
    const char *const args[] = {"--set", "security.seccomp=no", NULL};

    forgery_scenario(args);
}
END_TEST

/* And with the default configuration (both walls). */
START_TEST(test_forger_fails_by_default)
{
    forgery_scenario(NULL);
}
END_TEST

/* A process holding the command's stdout and stderr (stolen with pidfd_getfd, which only
 * works without the seccomp filter, or simply inherited by a background child) does not stall
 * the exec: the result comes with the supervisor's status, not at the backstop (which would
 * answer 125 "sandbox"). */
START_TEST(test_held_pipes_do_not_stall)
{
    const char *const args[] = {"--set", "security.seccomp=no", NULL};
    struct lbt_daemon d;
    char sbx[128], op[256], *log;
    json_t *res;

    lbt_daemon_start(&d, args);
    seed(&d, "forge-hold", sbx, sizeof(sbx), op, sizeof(op));
    upload_probe(&d, sbx);
    start_forger(&d, sbx, op, "/workspace/hold.log", "--hold");
    assert_true_result(&d, sbx, "");
    log = lbt_sh(&d, sbx, "grep -c 'hold_fd1 ok' /workspace/hold.log || true");
    ck_assert_msg(atoi(log) >= 1, "the forger held no command's stdout: %s", log);
    free(log);
    /* the exec's own background child keeps stdout open for 60 s */
    res = lbt_exec_ok(&d, sbx, "",
                      "{\"command\": \"sleep 60 & echo true-output; exit 7\", "
                      "\"preserve_background_services\": true, \"timeout_s\": 20}");
    ck_assert(json_is_null(json_object_get(res, "error_type")));
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 7);
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "true-output\n");
    json_decref(res);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* exclusive: every agent process is gone before the grader's command starts, the forger
 * included (it writes into every command's stdout it can reach). */
START_TEST(test_exclusive_leaves_no_agent_process)
{
    struct lbt_daemon d;
    char sbx[128], op[256], cmd[300], *out, *line, *save = NULL;
    int forger, sleeper, looper, n = 0;
    json_t *res;

    lbt_daemon_start(&d, NULL);
    seed(&d, "forge-excl", sbx, sizeof(sbx), op, sizeof(op));
    upload_probe(&d, sbx);
    forger = start_forger(&d, sbx, op, "/workspace/excl.log", "--write");
    /* more of the agent: a sleeper and a loop that keeps forking */
    res = lbt_exec_ok(&d, sbx, op,
                      "{\"command\": \"sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > "
                      "/workspace/sleeper.pid; (while :; do sleep 0.01; done) </dev/null "
                      ">/dev/null 2>&1 & echo $! > /workspace/looper.pid\", "
                      "\"preserve_background_services\": true}");
    json_decref(res);
    out = lbt_sh(&d, sbx, "cat /workspace/sleeper.pid");
    sleeper = atoi(out);
    free(out);
    out = lbt_sh(&d, sbx, "cat /workspace/looper.pid");
    looper = atoi(out);
    free(out);
    ck_assert(alive_inside(&d, sbx, forger));
    ck_assert(alive_inside(&d, sbx, sleeper));
    ck_assert(alive_inside(&d, sbx, looper));

    /* the exclusive command itself lists what is alive: the init, its own supervisor, its
     * shell and what the shell runs, nothing else */
    res = lbt_exec_ok(&d, sbx, "",
                      "{\"exclusive\": true, \"command\": \"for p in /proc/[0-9]*; do "
                      "echo ${p#/proc/} $(cat $p/comm 2>/dev/null); done\"}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    out = strdup(json_string_value(json_object_get(res, "stdout")));
    json_decref(res);
    for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int pid = atoi(line);

        n++;
        ck_assert_msg(pid != forger && pid != sleeper && pid != looper,
                      "agent process alive under exclusive: %s", line);
        ck_assert_msg(strstr(line, "lbt-probe") == NULL && strstr(line, " sleep") == NULL,
                      "agent process alive under exclusive: %s", line);
    }
    free(out);
    ck_assert_msg(n >= 3 && n <= 5, "%d processes under exclusive", n);
    ck_assert(!alive_inside(&d, sbx, forger));
    ck_assert(!alive_inside(&d, sbx, sleeper));
    ck_assert(!alive_inside(&d, sbx, looper));
    snprintf(cmd, sizeof(cmd), "/workspace/lbt-probe forge /workspace/excl.log");
    ck_assert_int_eq(lbt_count_procs_cmdline(cmd), 0);
    /* a forger started before an exclusive grader cannot touch its result */
    start_forger(&d, sbx, op, "/workspace/excl2.log", "--write");
    assert_true_result(&d, sbx, ", \"exclusive\": true");
    /* the sandbox itself lives on */
    free(lbt_sh(&d, sbx, "true"));
    lbt_daemon_cleanup(&d);
}
END_TEST

/* While an exclusive exec runs, no other exec enters the sandbox (409); an exec that was
 * running when it started is ended (its processes are the agent's too). */
START_TEST(test_exclusive_runs_alone)
{
    struct lbt_daemon d;
    char sbx[128], op[256], path[200];
    struct lbt_async *before, *excl;
    struct lbt_resp r;
    uid_t uid;

    lbt_daemon_start(&d, NULL);
    seed(&d, "forge-alone", sbx, sizeof(sbx), op, sizeof(op));
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", sbx);
    uid = lbt_sandbox_uid(&d, sbx);
    before = lbt_async_json(&d, "POST", path, op, "{\"command\": \"sleep 30; exit 3\"}");
    while (lbt_count_procs_of_uid_exact(uid, "sleep 30") == 0) /* it runs */
        lbt_sleep_ms(10);
    excl = lbt_async_json(&d, "POST", path, "",
                          "{\"exclusive\": true, \"command\": \"sleep 2; exit 5\"}");
    lbt_async_join(before, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_ne(json_integer_value(json_object_get(r.json, "return_code")), 3);
    ck_assert_int_ne(json_integer_value(json_object_get(r.json, "return_code")), 0);
    lbt_resp_free(&r);
    while (lbt_count_procs_of_uid_exact(uid, "sleep 2") == 0) /* the exclusive one runs */
        lbt_sleep_ms(10);
    ck_assert(!lbt_async_done(excl));
    lbt_exec(&d, sbx, op, "{\"command\": \"true\"}", &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);
    lbt_async_join(excl, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "return_code")), 5);
    lbt_resp_free(&r);
    /* afterwards anyone may exec again */
    free(lbt_sh(&d, sbx, "true"));
    lbt_exec(&d, sbx, "", "{\"command\": \"true\", \"exclusive\": 1}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    /* the agent's token may not start one: it would end the grader's execs and hold the
     * sandbox against the admin for its timeout */
    lbt_exec(&d, sbx, op, "{\"command\": \"sleep 8\", \"exclusive\": true}", &r);
    lbt_assert_error(&r, 403, "forbidden");
    ck_assert_msg(strstr(r.body, "admin") != NULL, "%s", r.body);
    lbt_resp_free(&r);
    free(lbt_sh(&d, sbx, "true")); /* nothing holds the sandbox */
    lbt_daemon_cleanup(&d);
}
END_TEST

/* A process whose main thread ended while another thread of it runs shows as a zombie; the
 * exclusive sweep still ends it (a SIGKILL to the zombie leader kills its thread group): the
 * grader's exec answers 200, and the agent's thread writes nothing more. */
START_TEST(test_exclusive_sweeps_zombie_leader)
{
    struct lbt_daemon d;
    char sbx[128], op[256];
    char *before, *after;
    json_t *res;

    lbt_daemon_start(&d, NULL);
    seed(&d, "forge-zombie", sbx, sizeof(sbx), op, sizeof(op));
    upload_probe(&d, sbx);
    res = lbt_exec_ok(
        &d, sbx, op,
        "{\"command\": \"setsid /workspace/lbt-probe zombie-leader /workspace/beat "
        "</dev/null >/dev/null 2>&1 & p=$!; while [ ! -s /workspace/beat ] || [ \\\"$(cut "
        "-d' ' -f3 /proc/$p/stat)\\\" != Z ]; do sleep 0.05; done\", "
        "\"preserve_background_services\": true, \"timeout_s\": 30}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    json_decref(res);
    res = lbt_exec_ok(&d, sbx, "", "{\"exclusive\": true, \"command\": \"echo graded\"}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "graded\n");
    json_decref(res);
    /* the beat has stopped: its thread is gone */
    before = lbt_sh(&d, sbx, "wc -c < /workspace/beat");
    lbt_sleep_ms(500);
    after = lbt_sh(&d, sbx, "wc -c < /workspace/beat");
    ck_assert_str_eq(before, after);
    free(before);
    free(after);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* ---------- the operate-token fence of an exclusive exec ---------- */

/* The agent's uploader: PUT /tmp/g.sh and /workspace/g.sh (each "exit 0") with the operate
 * token in a loop, counting what it got. */
struct uploader {
    struct lbt_daemon *d;
    const char *sbx, *op;
    atomic_bool stop;
    int ok, fenced, other;
    char other_seen[300];
};

static void *uploader_run(void *arg)
{
    static const char fake[] = "#!/bin/sh\nexit 0\n";
    struct uploader *u = arg;

    while (!atomic_load(&u->stop)) {
        for (int i = 0; i < 2; i++) {
            struct lbt_resp r;

            lbt_file_put(u->d, u->sbx, u->op, i ? "/workspace/g.sh" : "/tmp/g.sh", "0755", fake,
                         sizeof(fake) - 1, &r);
            if (r.status == 204)
                u->ok++;
            else if (r.status == 409 && strcmp(lbt_error_code(&r), "conflict") == 0 &&
                     strstr(r.body, "exclusive exec"))
                u->fenced++;
            else if (u->other++ == 0)
                snprintf(u->other_seen, sizeof(u->other_seen), "%ld %.250s", r.status, r.body);
            lbt_resp_free(&r);
        }
    }
    return NULL;
}

/* A call with the operate token while an exclusive exec runs: 409 conflict naming it. */
static void assert_fenced(struct lbt_daemon *d, const char *method, const char *path,
                          const char *op, const char *body)
{
    struct lbt_resp r;

    lbt_json(d, method, path, op, body, &r);
    ck_assert_msg(r.status == 409, "%s %s during an exclusive exec: %ld %s", method, path, r.status,
                  r.body);
    lbt_assert_error(&r, 409, "conflict");
    ck_assert_msg(strstr(r.body, "exclusive exec") != NULL, "%s %s: %s", method, path, r.body);
    lbt_resp_free(&r);
}

/* While an admin's exclusive exec runs, every call made with the sandbox's operate token
 * answers 409 conflict naming the exec: a concurrent uploader rewriting the script the grader
 * writes and runs never changes the grade, and every other kind of operate call is refused
 * too; the admin's calls still work. */
START_TEST(test_exclusive_fences_the_operate_token)
{
    struct lbt_daemon d;
    struct uploader u = {0};
    char sbx[128], op[256], path[300], sid[128], excl_path[200];
    struct lbt_async *excl;
    struct lbt_resp r;
    pthread_t th;
    json_t *res;

    lbt_daemon_start(&d, NULL);
    seed(&d, "fence", sbx, sizeof(sbx), op, sizeof(op));
    u.d = &d, u.sbx = sbx, u.op = op;
    ck_assert_int_eq(pthread_create(&th, NULL, uploader_run, &u), 0);
    for (int i = 0; i < 5; i++) {
        res = lbt_exec_ok(&d, sbx, "",
                          "{\"exclusive\": true, \"timeout_s\": 30, \"command\": "
                          "\"printf '#!/bin/sh\\\\nexit 1\\\\n' >/tmp/g.sh && "
                          "printf '#!/bin/sh\\\\nexit 2\\\\n' >/workspace/g.sh && sleep 0.3; "
                          "sh /tmp/g.sh; a=$?; sh /workspace/g.sh; exit $((a * 10 + $?))\"}");
        ck_assert_msg(json_integer_value(json_object_get(res, "return_code")) == 12,
                      "grading run %d: return code %lld (stderr %s)", i,
                      (long long)json_integer_value(json_object_get(res, "return_code")),
                      json_string_value(json_object_get(res, "stderr")));
        json_decref(res);
        lbt_sleep_ms(100);
    }
    atomic_store(&u.stop, true);
    pthread_join(th, NULL);
    ck_assert_msg(u.other == 0, "the uploader got %d other answers, first: %s", u.other,
                  u.other_seen);
    ck_assert_msg(u.fenced > 0, "the uploader was never refused (%d uploads went in)", u.ok);
    ck_assert_msg(u.ok > 0, "the uploader never got in between the grading runs");

    /* one call of every other kind the operate token can make, during one exclusive exec */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pty", sbx);
    lbt_json(&d, "POST", path, op, "{\"command\": \"sleep 100\", \"pty\": false}", &r);
    ck_assert_msg(r.status == 201, "pty: %ld %s", r.status, r.body);
    snprintf(sid, sizeof(sid), "%s", json_string_value(json_object_get(r.json, "session_id")));
    lbt_resp_free(&r);
    snprintf(excl_path, sizeof(excl_path), "/v1/sandboxes/%s/exec", sbx);
    excl = lbt_async_json(&d, "POST", excl_path, "",
                          "{\"exclusive\": true, \"command\": \"sleep 3; exit 4\"}");
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    for (int i = 0; i < 100; i++) {
        lbt_json(&d, "GET", path, op, NULL, &r);
        long st = r.status;

        lbt_resp_free(&r);
        if (st == 409)
            break;
        ck_assert_int_eq(st, 200);
        lbt_sleep_ms(20);
    }
    assert_fenced(&d, "GET", path, op, NULL);
    assert_fenced(&d, "POST", excl_path, op, "{\"command\": \"true\"}");
    assert_fenced(&d, "POST", excl_path, op, "{\"command\": \"true\", \"exclusive\": true}");
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?path=/tmp/g.sh", sbx);
    assert_fenced(&d, "GET", path, op, NULL);
    lbt_file_put(&d, sbx, op, "/workspace/other", NULL, "x", 1, &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pause", sbx);
    assert_fenced(&d, "POST", path, op, "{}");
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/resume", sbx);
    assert_fenced(&d, "POST", path, op, "{}");
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/endpoints/8080", sbx);
    assert_fenced(&d, "GET", path, op, NULL);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pty", sbx);
    assert_fenced(&d, "POST", path, op, "{\"command\": \"true\"}");
    snprintf(path, sizeof(path), "/v1/pty/%s/input", sid);
    assert_fenced(&d, "POST", path, op, "x");
    snprintf(path, sizeof(path), "/v1/pty/%s/resize", sid);
    assert_fenced(&d, "POST", path, op, "{\"rows\": 30, \"cols\": 100}");
    snprintf(path, sizeof(path), "/v1/pty/%s/signal", sid);
    assert_fenced(&d, "POST", path, op, "{\"signal\": \"INT\"}");
    snprintf(path, sizeof(path), "/v1/pty/%s/output", sid);
    assert_fenced(&d, "GET", path, op, NULL);
    assert_fenced(&d, "POST", "/v1/sessions/fence/execute", op,
                  "{\"argv\": [\"true\"], \"files\": {\"/tmp/g.sh\": \"exit 0\"}}");
    assert_fenced(&d, "GET", "/v1/sessions/fence/activation", op, NULL);
    assert_fenced(&d, "POST", "/v1/sessions/fence/stop_harness", op, "{}");
    assert_fenced(&d, "POST", "/v1/sessions/fence/close", op, "{}");
    /* the admin is not fenced */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    lbt_json(&d, "GET", path, "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    lbt_file_get(&d, sbx, "", "/tmp/g.sh", &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    ck_assert(!lbt_async_done(excl));
    lbt_async_join(excl, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "return_code")), 4);
    lbt_resp_free(&r);
    /* the fence is down with the result */
    res = lbt_exec_ok(&d, sbx, op, "{\"command\": \"exit 6\"}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 6);
    json_decref(res);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* The agent renames /run/lendbox and plants its own supervise there, after its harness ended:
 * an activation's close still runs the real --harness-stop sweep (the planted program never
 * runs), the agent's background process is gone, and the collected artifact is the harness's. */
START_TEST(test_planted_supervisor_close)
{
    struct lbt_daemon d;
    char sbx[128], op[256];
    struct lbt_resp r;
    json_t *res, *a;
    unsigned char *bytes;
    size_t len = 0;
    char *out;
    int sleeper;

    lbt_daemon_start(&d, NULL);
    seed(&d, "planted-close", sbx, sizeof(sbx), op, sizeof(op));
    lbt_json(&d, "POST", "/v1/sessions/planted-close/execute", "",
             "{\"argv\": [\"sh\", \"-c\", \"echo real > /workspace/result.txt\"], "
             "\"collect\": [\"/workspace/result.txt\"], \"wait\": false}",
             &r);
    ck_assert_msg(r.status == 200 || r.status == 202, "execute: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    /* the harness has ended (nothing has collected yet: that is the close's) */
    for (;;) {
        lbt_json(&d, "GET", "/v1/sessions/planted-close/activation", "", NULL, &r);
        ck_assert_msg(r.status == 200, "activation: %ld %s", r.status, r.body);
        const char *state = json_string_value(json_object_get(r.json, "state")) ?: "";
        bool running = !strcmp(state, "staging") || !strcmp(state, "running");

        lbt_resp_free(&r);
        if (!running)
            break;
        lbt_sleep_ms(20);
    }
    res = lbt_exec_ok(
        &d, sbx, op,
        "{\"preserve_background_services\": true, \"command\": \"mv /run/lendbox /run/real && "
        "mkdir /run/lendbox && printf '#!/bin/sh\\\\necho forged-by-agent "
        ">/workspace/result.txt\\\\necho planted >/tmp/planted\\\\nexit 0\\\\n' "
        ">/run/lendbox/supervise && chmod 755 /run/lendbox/supervise && "
        "sleep 1000 </dev/null >/dev/null 2>&1 & echo $!\"}");
    sleeper = atoi(json_string_value(json_object_get(res, "stdout")));
    json_decref(res);
    ck_assert_int_gt(sleeper, 1);
    ck_assert(alive_inside(&d, sbx, sleeper));
    lbt_json(&d, "POST", "/v1/sessions/planted-close/close", "", "{}", &r);
    ck_assert_msg(r.status == 200, "close: %ld %s", r.status, r.body);
    a = json_object_get(json_object_get(r.json, "artifacts"), "/workspace/result.txt");
    ck_assert_msg(json_is_object(a), "no artifact: %s", r.body);
    bytes = lbt_b64_decode(json_string_value(json_object_get(a, "base64")), &len);
    ck_assert_ptr_nonnull(bytes);
    ck_assert_msg(len == 5 && memcmp(bytes, "real\n", 5) == 0, "artifact: %.*s", (int)len,
                  (const char *)bytes);
    free(bytes);
    lbt_resp_free(&r);
    ck_assert(!alive_inside(&d, sbx, sleeper)); /* the sweep ran */
    out = lbt_sh(&d, sbx, "cat /tmp/planted 2>/dev/null; cat /workspace/result.txt");
    ck_assert_str_eq(out, "real\n");
    free(out);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* Activation close stops every sandbox process but init before it collects the artifacts. */
START_TEST(test_close_stops_agent_processes)
{
    struct lbt_daemon d;
    char sbx[128], op[256], *out;
    struct lbt_resp r;
    int sleeper;
    json_t *res;

    lbt_daemon_start(&d, NULL);
    seed(&d, "forge-close", sbx, sizeof(sbx), op, sizeof(op));
    res = lbt_exec_ok(&d, sbx, op,
                      "{\"command\": \"sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > "
                      "/workspace/sleeper.pid\", \"preserve_background_services\": true}");
    json_decref(res);
    out = lbt_sh(&d, sbx, "cat /workspace/sleeper.pid");
    sleeper = atoi(out);
    free(out);
    lbt_json(&d, "POST", "/v1/sessions/forge-close/execute", "",
             "{\"argv\": [\"sh\", \"-c\", \"echo done > /workspace/result.txt\"], "
             "\"collect\": [\"/workspace/result.txt\"]}",
             &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    ck_assert(alive_inside(&d, sbx, sleeper)); /* finishing the harness leaves it */
    lbt_json(&d, "POST", "/v1/sessions/forge-close/close", "", "{}", &r);
    ck_assert_msg(r.status == 200, "close: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    ck_assert(!alive_inside(&d, sbx, sleeper));
    lbt_daemon_cleanup(&d);
}
END_TEST

/* ---------- keyrings and seccomp ---------- */

static const char *keyctl_out(json_t *res)
{
    return json_string_value(json_object_get(res, "stdout"));
}

/* The daemon has a session keyring (as under systemd) holding a key of its own; without the
 * seccomp filter (so keyctl works at all) no sandbox and no exec reaches it or each other's. */
START_TEST(test_session_keyring_per_sandbox_and_exec)
{
    const char *const args[] = {"--set", "security.seccomp=no", NULL};
    struct lbt_daemon d;
    char a[128], b[128];
    json_t *res;

    /* the test process (Check forks one per test) joins a session keyring; the daemon inherits
     * it, as `keyctl session` would give it */
    ck_assert_int_ge(syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, "lbt-forgery"), 0);
    ck_assert_int_ge(
        syscall(SYS_add_key, "user", "lbt-daemon", "secret", 6, KEY_SPEC_SESSION_KEYRING), 0);
    lbt_daemon_start(&d, args);
    seed(&d, "keys-a", a, sizeof(a), NULL, 0);
    seed(&d, "keys-b", b, sizeof(b), NULL, 0);
    res = lbt_exec_ok(&d, a, "",
                      "{\"command\": \"keyctl add user lbt-a secret-a @s >/dev/null && "
                      "keyctl search @s user lbt-a >/dev/null && echo found\"}");
    ck_assert_str_eq(keyctl_out(res), "found\n");
    json_decref(res);
    /* not in another sandbox, not in the next exec of the same sandbox, never the daemon's */
    res = lbt_exec_ok(&d, b, "", "{\"command\": \"keyctl search @s user lbt-a || echo absent\"}");
    ck_assert_str_eq(keyctl_out(res), "absent\n");
    json_decref(res);
    res = lbt_exec_ok(&d, a, "", "{\"command\": \"keyctl search @s user lbt-a || echo absent\"}");
    ck_assert_str_eq(keyctl_out(res), "absent\n");
    json_decref(res);
    res = lbt_exec_ok(&d, b, "",
                      "{\"command\": \"keyctl search @s user lbt-daemon || echo absent\"}");
    ck_assert_str_eq(keyctl_out(res), "absent\n");
    json_decref(res);
    /* and the init's session is not the daemon's either (its processes get one of their own) */
    res = lbt_exec_ok(&d, a, "",
                      "{\"command\": \"keyctl describe @s | grep -c lbt-forgery || true\"}");
    ck_assert_str_eq(keyctl_out(res), "0\n");
    json_decref(res);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* Lines of path that contain needle. */
static int count_lines_with(const char *path, const char *needle)
{
    char line[4096];
    int n = 0;
    FILE *f = fopen(path, "re");

    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* A host that refuses the keyring calls to the daemon (systemd-nspawn's default filter,
 * Docker's default seccomp profile, Kubernetes' RuntimeDefault; here the fault switch
 * host.keyrings puts the same refusal on the daemon): it is found at start and logged once,
 * and seeds, execs and releases work. Every sandbox process inherits the refusal (seen with
 * the sandbox's own filter off, which refuses keyctl by itself). */
START_TEST(test_host_refuses_keyrings)
{
    const char *const args[] = {"--set", "security.seccomp=no", "--set",
                                "faults.spec=host.keyrings=fail", NULL};
    struct lbt_daemon d;
    struct lbt_resp r;
    char a[128], b[128];
    json_t *res;

    lbt_daemon_start(&d, args);
    seed(&d, "nokeys-a", a, sizeof(a), NULL, 0);
    seed(&d, "nokeys-b", b, sizeof(b), NULL, 0);
    res = lbt_exec_ok(&d, a, "",
                      "{\"command\": \"echo ran; keyctl add user k v @s >/dev/null 2>&1 || "
                      "echo refused\"}");
    ck_assert_str_eq(keyctl_out(res), "ran\nrefused\n");
    json_decref(res);
    res = lbt_exec_ok(&d, b, "", "{\"command\": \"echo ran-b\"}");
    ck_assert_str_eq(keyctl_out(res), "ran-b\n");
    json_decref(res);
    /* a grader's exclusive exec (its trusted view's helper takes the same flag) */
    res = lbt_exec_ok(&d, b, "", "{\"command\": \"echo graded\", \"exclusive\": true}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    ck_assert_str_eq(keyctl_out(res), "graded\n");
    json_decref(res);
    lbt_json(&d, "POST", "/v1/sessions/nokeys-a/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    lbt_json(&d, "POST", "/v1/sessions/nokeys-b/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    ck_assert_int_eq(count_lines_with(d.log_path, "refuses the kernel keyring calls"), 1);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* Each exec's keyring counts against root's key quota, not the sandbox uid's 200 keys: 210
 * background processes left by 210 execs (each holding its exec's keyring) do not make the
 * next exec fail. */
START_TEST(test_keyrings_do_not_exhaust_the_sandbox_quota)
{
    struct lbt_daemon d;
    char sbx[128];
    json_t *res;

    lbt_daemon_start(&d, NULL);
    seed(&d, "keys-quota", sbx, sizeof(sbx), NULL, 0);
    for (int i = 0; i < 210; i++) {
        res = lbt_exec_ok(&d, sbx, "",
                          "{\"command\": \"sleep 1000 >/dev/null 2>&1 &\", "
                          "\"preserve_background_services\": true}");
        ck_assert_msg(json_integer_value(json_object_get(res, "return_code")) == 0, "exec %d: %s",
                      i, json_string_value(json_object_get(res, "stderr")));
        json_decref(res);
    }
    free(lbt_sh(&d, sbx, "true"));
    lbt_daemon_cleanup(&d);
}
END_TEST

/* Each refused call answers EPERM inside the sandbox (clone3 ENOSYS), for the exec and, as
 * /proc shows, for the init and the supervisor too; plain fork and threads work. */
START_TEST(test_seccomp_refuses_with_eperm)
{
    struct lbt_daemon d;
    char sbx[128], *out, *line, *save = NULL;
    int n = 0;
    json_t *res;

    lbt_daemon_start(&d, NULL);
    seed(&d, "sec-1", sbx, sizeof(sbx), NULL, 0);
    upload_probe(&d, sbx);
    out = lbt_sh(&d, sbx, "/workspace/lbt-probe syscalls");
    for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[64], result[32];

        ck_assert_int_eq(sscanf(line, "%63s %31s", name, result), 2);
        n++;
        if (strcmp(name, "clone3") == 0)
            ck_assert_msg(strcmp(result, "ENOSYS") == 0, "%s", line);
        else if (strcmp(name, "fork") == 0 || strcmp(name, "getpid") == 0)
            ck_assert_msg(strcmp(result, "ok") == 0, "%s", line);
        else
            ck_assert_msg(strcmp(result, "EPERM") == 0, "%s", line);
    }
    free(out);
    ck_assert_int_ge(n, 38);
    /* the init (pid 1) and this exec's supervisor (the shell's parent) run filtered */
    res = lbt_exec_ok(&d, sbx, "",
                      "{\"command\": \"grep '^Seccomp:' /proc/1/status /proc/$PPID/status "
                      "/proc/self/status | cut -f2 | tr -d ' '\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "2\n2\n2\n");
    json_decref(res);
    /* keyctl(1) as a user meets it */
    res = lbt_exec_ok(&d, sbx, "", "{\"command\": \"keyctl add user k v @s\"}");
    ck_assert_int_ne(json_integer_value(json_object_get(res, "return_code")), 0);
    ck_assert_ptr_nonnull(
        strstr(json_string_value(json_object_get(res, "stderr")), "Operation not permitted"));
    json_decref(res);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* Without the filter the same probes do other things: the test above can fail. */
START_TEST(test_seccomp_off_allows)
{
    const char *const args[] = {"--set", "security.seccomp=no", NULL};
    struct lbt_daemon d;
    char sbx[128], *out;

    lbt_daemon_start(&d, args);
    seed(&d, "sec-off", sbx, sizeof(sbx), NULL, 0);
    upload_probe(&d, sbx);
    out = lbt_sh(&d, sbx,
                 "/workspace/lbt-probe syscalls keyctl unshare_user pidfd_getfd "
                 "process_vm_readv; grep '^Seccomp:' /proc/self/status | cut -f2");
    ck_assert_str_eq(out, "keyctl ok\nunshare_user ok\npidfd_getfd ok\nprocess_vm_readv ok\n0\n");
    free(out);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* Normal work is unaffected: shells, python3 with threads, cp, tar, pipes. */
START_TEST(test_seccomp_normal_commands)
{
    struct lbt_daemon d;
    char sbx[128], *out;

    lbt_daemon_start(&d, NULL);
    seed(&d, "sec-normal", sbx, sizeof(sbx), NULL, 0);
    out = lbt_sh(&d, sbx,
                 "cd /workspace && mkdir -p src && echo hello > src/a.txt && cp -r src copy && "
                 "tar czf t.tgz copy && rm -rf copy && tar xzf t.tgz && cat copy/a.txt && "
                 "echo $(echo sub | tr a-z A-Z) | sed s/U/u/ && "
                 "sh -c 'sleep 0.1 & wait; echo waited'");
    ck_assert_str_eq(out, "hello\nSuB\nwaited\n");
    free(out);
    if (access("/usr/bin/python3", X_OK) == 0) {
        out = lbt_sh(&d, sbx,
                     "/usr/bin/python3 -c 'import threading, subprocess; r = []; "
                     "t = threading.Thread(target=lambda: r.append(subprocess.run([\"echo\", "
                     "\"py\"], capture_output=True).stdout)); t.start(); t.join(); "
                     "print(r[0].decode().strip())'");
        ck_assert_str_eq(out, "py\n");
        free(out);
    }
    lbt_daemon_cleanup(&d);
}
END_TEST

/* The supervisor sandboxes run is the daemon's own root-owned 0711 copy, whatever the mode of
 * the configured file: a readable supervisor would be dumpable for an instant after each exec. */
START_TEST(test_supervisor_copy_is_exec_only)
{
    const char *sup =
        getenv("LENDBOX_SUPERVISE") ? getenv("LENDBOX_SUPERVISE") : "build/lendbox-supervise";
    char dir[] = "/tmp/lbt-supcopy-XXXXXX", cmd[2048], set[1100], sbx[128];
    const char *args[] = {"--set", set, NULL};
    struct lbt_daemon d;
    json_t *res;

    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(chmod(dir, 0711), 0);
    snprintf(cmd, sizeof(cmd), "cp '%s' '%s/sup' && chmod 0755 '%s/sup'", sup, dir, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(set, sizeof(set), "local.supervise=%s/sup", dir);
    lbt_daemon_start(&d, args);
    seed(&d, "sup-copy", sbx, sizeof(sbx), NULL, 0);
    res = lbt_exec_ok(&d, sbx, "",
                      "{\"command\": \"stat -c %a /run/lendbox/supervise; "
                      "cat /run/lendbox/supervise >/dev/null 2>&1 && echo readable || echo "
                      "unreadable\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "711\nunreadable\n");
    json_decref(res);
    lbt_daemon_cleanup(&d);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A sandbox's root owns /run: it can rename /run/lendbox and put a program of its own at
 * /run/lendbox/supervise. The exec helper and the supervisor's own launchers (PTY sessions,
 * activations) run the daemon's supervisor itself, never the file at that path: the planted
 * program never runs and results stay the real ones. */
START_TEST(test_planted_supervisor_never_runs)
{
    char sbx[128], path[256];
    struct lbt_daemon d;
    struct lbt_resp r;
    json_t *res;

    LBT_SKIP_ON_VARIANT("docker", "about the local provider's exec helper");
    lbt_daemon_start(&d, NULL);
    seed(&d, "planted", sbx, sizeof(sbx), NULL, 0);
    res = lbt_exec_ok(
        &d, sbx, "",
        "{\"command\": \"mv /run/lendbox /run/real && mkdir /run/lendbox && printf "
        "'#!/bin/sh\\\\necho planted >>/tmp/planted\\\\necho exit 0 >&3\\\\nexit 0\\\\n' "
        ">/run/lendbox/supervise && chmod 755 /run/lendbox/supervise && "
        "/run/lendbox/supervise && cat /tmp/planted && rm /tmp/planted\"}");
    /* the plant works when run by hand (so the test would see it run) */
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "planted\n");
    json_decref(res);
    /* an exec: the real supervisor, the real exit code */
    res = lbt_exec_ok(&d, sbx, "", "{\"command\": \"echo real; exit 7\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "real\n");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 7);
    json_decref(res);
    /* a PTY session (the supervisor's own launcher) */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pty", sbx);
    lbt_json(&d, "POST", path, "", "{\"command\": \"true\", \"pty\": false}", &r);
    ck_assert_msg(r.status == 201, "pty: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    res = lbt_exec_ok(&d, sbx, "", "{\"command\": \"cat /tmp/planted 2>/dev/null; echo end\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "end\n");
    json_decref(res);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* [security] seccomp_deny adds names; an unknown name stops the daemon at start. */
START_TEST(test_seccomp_deny_config)
{
    const char *const args[] = {"--set", "security.seccomp_deny=uname, getcpu", NULL};
    const char *daemon = getenv("LENDBOXD") ? getenv("LENDBOXD") : "build/lendboxd";
    const char *sup =
        getenv("LENDBOX_SUPERVISE") ? getenv("LENDBOX_SUPERVISE") : "build/lendbox-supervise";
    char dir[] = "/tmp/lbt-forgery-XXXXXX", cmd[2048], buf[4096];
    struct lbt_daemon d;
    char sbx[128];
    size_t got;
    json_t *res;
    FILE *p;
    int st;

    lbt_daemon_start(&d, args);
    seed(&d, "sec-deny", sbx, sizeof(sbx), NULL, 0);
    res = lbt_exec_ok(&d, sbx, "", "{\"command\": \"uname -s\"}");
    ck_assert_int_ne(json_integer_value(json_object_get(res, "return_code")), 0);
    ck_assert_ptr_nonnull(
        strstr(json_string_value(json_object_get(res, "stderr")), "Operation not permitted"));
    json_decref(res);
    lbt_daemon_cleanup(&d);

    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd),
             "'%s' --state-dir '%s' --listen 127.0.0.1:0 --set local.supervise='%s' "
             "--set local.uid_base=900005888 --set security.seccomp_deny=no_such_call 2>&1",
             daemon, dir, sup);
    p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    got = fread(buf, 1, sizeof(buf) - 1, p);
    buf[got] = '\0';
    st = pclose(p);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) != 0, "daemon started: %s", buf);
    ck_assert_msg(strstr(buf, "no_such_call") != NULL, "output: %s", buf);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* ---------- the forger against harness activations: the receipt ---------- */

/* The harness (the sandbox's root) writes a fake "clean, return code 0" receipt into every
 * place under /run/lendbox it can reach, then keeps running and exits 7 (or times out). The
 * result is the real one: it comes when the harness has really ended, with its return code,
 * the artifacts written just before the end, and nothing of the harness left alive. */
static const char forger_sh[] =
    "d=$(ls -d /run/lendbox/act-*)\n"
    "fake='{\"cleanup_confirmed\":true,\"return_code\":0,\"timed_out\":false,\"error\":null,"
    "\"launched\":true,\"stop_requested\":false}'\n"
    "(sleep 1; printf '%s\\n' \"$fake\" >$d/r.tmp && mv $d/r.tmp $d/receipt.json;"
    " for f in $d/* $d/.[!.]*; do [ -f \"$f\" ] && printf '%s\\n' \"$fake\" >\"$f\"; done;"
    " printf '%s\\n' \"$fake\" > /run/lendbox/receipt.json) &\n"
    "sleep \"$1\"\n"
    "echo done > /workspace/end.txt\n"
    "exit 7\n";

static json_t *forged_execute(struct lbt_daemon *d, const char *rsid, const char *sbx,
                              const char *secs, int timeout_s)
{
    struct lbt_resp r;
    char path[128], body[512];
    json_t *res;

    lbt_file_put(d, sbx, "", "/workspace/h.sh", "0644", forger_sh, strlen(forger_sh), &r);
    ck_assert_msg(r.status == 204, "stage: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/sessions/%s/execute", rsid);
    snprintf(body, sizeof(body),
             "{\"argv\": [\"sh\", \"/workspace/h.sh\", \"%s\"], \"collect\": "
             "[\"/workspace/end.txt\"], \"timeout_s\": %d, \"close_timeout_s\": 3}",
             secs, timeout_s);
    lbt_json(d, "POST", path, "", body, &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    res = json_incref(r.json);
    lbt_resp_free(&r);
    return res;
}

static void assert_cleanup(json_t *res, bool confirmed)
{
    json_t *c = json_object_get(res, "cleanup");

    ck_assert(json_is_boolean(json_object_get(c, "cleanup_confirmed")));
    ck_assert(json_is_true(json_object_get(c, "cleanup_confirmed")) == confirmed);
}

START_TEST(test_harness_cannot_forge_its_receipt)
{
    struct lbt_daemon d;
    char sbx[128], path[128], *out;
    json_t *res, *art, *act;

    lbt_daemon_start(&d, NULL);
    seed(&d, "forge-receipt", sbx, sizeof(sbx), NULL, 0);
    res = forged_execute(&d, "forge-receipt", sbx, "4", 30);
    ck_assert_str_eq(json_string_value(json_object_get(res, "state")), "finished");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 7);
    assert_cleanup(res, true);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(res, "cleanup"), "return_code")), 7);
    art = json_object_get(res, "artifacts");
    ck_assert_msg(json_object_get(art, "/workspace/end.txt") &&
                      !json_is_null(json_object_get(art, "/workspace/end.txt")),
                  "collected before the harness ended: %s", json_dumps(res, JSON_COMPACT));
    json_decref(res);
    /* the fakes were written (the attack ran), and nothing of the harness is left */
    out = lbt_sh(&d, sbx, "cat /run/lendbox/act-*/receipt.json");
    ck_assert_ptr_nonnull(strstr(out, "\"return_code\":0"));
    free(out);
    out = lbt_sh(&d, sbx, "ps -eo args | grep -c '[s]leep 4' || true");
    ck_assert_str_eq(out, "0\n");
    free(out);
    /* GET says the same */
    snprintf(path, sizeof(path), "/v1/sessions/%s/activation", "forge-receipt");
    {
        struct lbt_resp r;

        lbt_json(&d, "GET", path, "", NULL, &r);
        ck_assert_int_eq(r.status, 200);
        act = json_incref(r.json);
        lbt_resp_free(&r);
    }
    ck_assert_str_eq(json_string_value(json_object_get(act, "state")), "finished");
    ck_assert_int_eq(json_integer_value(json_object_get(act, "return_code")), 7);
    json_decref(act);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* The same forger, but it outlives its timeout: timed_out, cleanup confirmed only once the
 * harness and its background writer are gone. */
START_TEST(test_harness_forgery_times_out)
{
    struct lbt_daemon d;
    char sbx[128], *out;
    json_t *res;

    lbt_daemon_start(&d, NULL);
    seed(&d, "forge-receipt-to", sbx, sizeof(sbx), NULL, 0);
    res = forged_execute(&d, "forge-receipt-to", sbx, "60", 3);
    ck_assert_str_eq(json_string_value(json_object_get(res, "state")), "timed_out");
    ck_assert(json_is_true(json_object_get(json_object_get(res, "cleanup"), "timed_out")));
    assert_cleanup(res, true);
    ck_assert(
        json_is_null(json_object_get(json_object_get(res, "artifacts"), "/workspace/end.txt")));
    json_decref(res);
    out = lbt_sh(&d, sbx, "ps -eo args | grep -c '[s]leep 60' || true");
    ck_assert_str_eq(out, "0\n");
    free(out);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* A sandbox process rewrites the launch claim after the real launch (to "stop", as a stop that
 * won it would): the stop's "fenced" is then not taken. stop_harness waits for the real harness
 * supervisor's receipt (its harness killed past the cleanup: 137), and the harness is gone. On a
 * daemon that took "fenced" as said, the answer is "closed before the harness was launched" with
 * cleanup confirmed while the harness still runs. */
START_TEST(test_forged_launch_claim)
{
    static const char body[] =
        "{\"argv\": [\"sh\", \"-c\", \"trap '' TERM; while :; do sleep 0.2; echo tick >> "
        "/workspace/ticks; done\"], \"wait\": false, \"timeout_s\": 120, "
        "\"close_timeout_s\": 3}";
    struct lbt_daemon d;
    struct lbt_resp r;
    char sbx[128], *out;
    json_t *c;

    lbt_daemon_start(&d, NULL);
    seed(&d, "forge-claim", sbx, sizeof(sbx), NULL, 0);
    lbt_json(&d, "POST", "/v1/sessions/forge-claim/execute", "", body, &r);
    ck_assert_msg(r.status == 202, "execute: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    /* the harness runs; then the claim is rewritten from inside */
    (void)lbt_sh_until(&d, sbx, "[ -s /workspace/ticks ] && echo yes || echo no", "yes\n", 100);
    out = lbt_sh(&d, sbx,
                 "for d in /run/lendbox/act-*; do ln -sfn stop $d/launch.claim; done; "
                 "readlink /run/lendbox/act-*/launch.claim");
    ck_assert_str_eq(out, "stop\n");
    free(out);
    lbt_json(&d, "POST", "/v1/sessions/forge-claim/stop_harness", "", "{\"timeout_s\": 30}", &r);
    ck_assert_msg(r.status == 200, "stop_harness: %ld %s", r.status, r.body);
    ck_assert_msg(!strstr(r.body, "before the harness was launched"), "forged: %s", r.body);
    c = json_object_get(r.json, "cleanup");
    /* the real supervisor's receipt: the harness ignored TERM and was killed */
    ck_assert_msg(json_integer_value(json_object_get(c, "return_code")) == 137, "%s", r.body);
    ck_assert_msg(json_is_true(json_object_get(c, "cleanup_confirmed")), "%s", r.body);
    lbt_resp_free(&r);
    /* the harness is gone: no loop left, the ticks stop */
    out = lbt_sh(&d, sbx, "ps -eo args | grep -c '[e]cho tick' || true");
    ck_assert_str_eq(out, "0\n");
    free(out);
    lbt_daemon_cleanup(&d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("forgery");
    TCase *forge = tcase_create("forgery");
    TCase *sec = tcase_create("seccomp");
    TCase *host = tcase_create("host");
    TCase *fence = tcase_create("fence");

    tcase_set_timeout(forge, 180);
    tcase_add_test(forge, test_forger_fails_without_seccomp);
    tcase_add_test(forge, test_forger_fails_by_default);
    tcase_add_test(forge, test_held_pipes_do_not_stall);
    tcase_add_test(forge, test_exclusive_leaves_no_agent_process);
    tcase_add_test(forge, test_exclusive_runs_alone);
    tcase_add_test(forge, test_exclusive_sweeps_zombie_leader);
    tcase_add_test(forge, test_supervisor_copy_is_exec_only);
    tcase_add_test(forge, test_planted_supervisor_never_runs);
    tcase_add_test(forge, test_close_stops_agent_processes);
    tcase_add_test(forge, test_harness_cannot_forge_its_receipt);
    tcase_add_test(forge, test_harness_forgery_times_out);
    tcase_add_test(forge, test_forged_launch_claim);
    suite_add_tcase(s, forge);
    tcase_set_timeout(sec, 180);
    tcase_add_test(sec, test_session_keyring_per_sandbox_and_exec);
    tcase_add_test(sec, test_keyrings_do_not_exhaust_the_sandbox_quota);
    tcase_add_test(sec, test_seccomp_refuses_with_eperm);
    tcase_add_test(sec, test_seccomp_off_allows);
    tcase_add_test(sec, test_seccomp_normal_commands);
    tcase_add_test(sec, test_seccomp_deny_config);
    suite_add_tcase(s, sec);
    tcase_set_timeout(host, 60);
    tcase_add_test(host, test_host_refuses_keyrings);
    suite_add_tcase(s, host);
    /* grading integrity: the operate token fenced during exclusive execs, planted supervisors */
    tcase_set_timeout(fence, 120);
    tcase_add_test(fence, test_exclusive_fences_the_operate_token);
    tcase_add_test(fence, test_planted_supervisor_close);
    suite_add_tcase(s, fence);
    return lbt_run_suite(s);
}
