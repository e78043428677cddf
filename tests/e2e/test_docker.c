/*
 * test_docker.c - the docker provider (provider.name = docker) against a real
 * engine API: podman's Docker-compatible service on a private socket (docker_env.h). Lending,
 * exec through lendbox-supervise (result fields, stdin, cwd, output cap, the timeout killing a
 * setsid'd tree), files through the archive API (byte-exact 64 MiB, parents, symlinks that
 * stay inside the container), pause/resume, what the provider cannot honour (422/501), and
 * 20 concurrent seeds of one session making one container. Skips (printed) when podman cannot
 * run here.
 */
#include <pthread.h>
#include <sys/stat.h>

#include "docker_env.h"

static json_t *seed_ok(struct dk_daemon *x, const char *rsid, const char *extra)
{
    return lbt_seed(&x->d, rsid, "task-1", extra);
}

static const char *sid_of(json_t *lease)
{
    return json_string_value(json_object_get(lease, "sandbox_id"));
}

START_TEST(test_lend_exec_release)
{
    struct dk_daemon x;
    struct lbt_resp r;
    json_t *lease, *res;

    dk_start(&x, "lend", NULL);
    lease = seed_ok(&x, "ep-1",
                    "\"files\": {\"/workspace/task.txt\": \"add 2 and 3\\n\", "
                    "\"/workspace/deep/a/b.txt\": {\"base64\": \"AAEC\", \"mode\": 448}}");
    ck_assert_str_eq(json_string_value(json_object_get(lease, "provider")), "docker");
    ck_assert_str_eq(json_string_value(json_object_get(lease, "image")), "lbtest:latest");
    ck_assert_int_eq(dk_count_containers(x.inst), 1);

    /* the result fields of the local provider */
    res = lbt_exec_ok(&x.d, sid_of(lease), "",
                      "{\"command\": \"cat /workspace/task.txt; echo oops >&2; exit 3\"}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 3);
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "add 2 and 3\n");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stderr")), "oops\n");
    ck_assert(json_is_null(json_object_get(res, "error_type")));
    ck_assert(json_is_false(json_object_get(res, "stdout_truncated")));
    json_decref(res);

    /* the seed file with its mode, parents made; the image's own files */
    res = lbt_exec_ok(&x.d, sid_of(lease), "",
                      "{\"command\": \"stat -c %a /workspace/deep/a/b.txt; "
                      "od -An -tx1 /workspace/deep/a/b.txt 2>/dev/null || "
                      "busybox od -An -tx1 /workspace/deep/a/b.txt; "
                      ". /etc/os-release; echo $ID\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "700\n 00 01 02\nlbtest\n");
    json_decref(res);

    /* argv, env, stdin, cwd */
    res = lbt_exec_ok(&x.d, sid_of(lease), "",
                      "{\"argv\": [\"sh\", \"-c\", \"cat; echo \\\" $FOO\\\"; pwd\"], "
                      "\"env\": {\"FOO\": \"bar\"}, \"stdin\": \"in\", \"cwd\": \"/tmp\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "in bar\n/tmp\n");
    json_decref(res);
    /* the stdin file is gone from /tmp */
    res = lbt_exec_ok(&x.d, sid_of(lease), "", "{\"command\": \"ls -A /tmp | wc -l\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "0\n");
    json_decref(res);

    /* a cwd that does not exist: a sandbox result, 125 */
    res = lbt_exec_ok(&x.d, sid_of(lease), "", "{\"command\": \"true\", \"cwd\": \"/nope\"}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 125);
    ck_assert_str_eq(json_string_value(json_object_get(res, "error_type")), "sandbox");
    json_decref(res);

    /* a killed command: 128 + signal */
    res = lbt_exec_ok(&x.d, sid_of(lease), "", "{\"command\": \"kill -9 $$\"}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 137);
    json_decref(res);

    /* the output cap (1 MiB per stream by default), cut inside the container already */
    res = lbt_exec_ok(&x.d, sid_of(lease), "",
                      "{\"command\": \"dd if=/dev/zero bs=65536 count=48 2>/dev/null | "
                      "tr '\\\\000' a; echo done >&2\"}");
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
    ck_assert(json_is_true(json_object_get(res, "stdout_truncated")));
    ck_assert_uint_eq(strlen(json_string_value(json_object_get(res, "stdout"))), 1048576);
    ck_assert_str_eq(json_string_value(json_object_get(res, "stderr")), "done\n");
    json_decref(res);

    /* release removes the container; repeating is harmless; the sandbox is gone */
    lbt_json(&x.d, "POST", "/v1/sessions/ep-1/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert(json_is_true(json_object_get(r.json, "released")));
    lbt_resp_free(&r);
    ck_assert_int_eq(dk_count_containers(x.inst), 0);
    lbt_json(&x.d, "POST", "/v1/sessions/ep-1/release", "", NULL, &r);
    ck_assert(json_is_false(json_object_get(r.json, "released")));
    lbt_resp_free(&r);
    lbt_exec(&x.d, sid_of(lease), "", "{\"command\": \"true\"}", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    json_decref(lease);
    lbt_daemon_cleanup(&x.d);
}
END_TEST

/* exec `sh -c 'setsid sleep 1000 & sleep 1000'` with timeout_s 1: within 3 s, 125/timeout,
 * no sleep left in the container. */
START_TEST(test_timeout_kills_setsid_tree)
{
    struct dk_daemon x;
    json_t *lease, *res;
    double t0;

    dk_start(&x, "tmo", NULL);
    lease = seed_ok(&x, "ep-t", NULL);
    t0 = lbt_now();
    res = lbt_exec_ok(&x.d, sid_of(lease), "",
                      "{\"command\": \"echo started; setsid sleep 1000 & sleep 1000\", "
                      "\"timeout_s\": 1}");
    ck_assert_msg(lbt_now() - t0 <= 3.0, "timeout took %.2f s", lbt_now() - t0);
    ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 125);
    ck_assert_str_eq(json_string_value(json_object_get(res, "error_type")), "timeout");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "started\n");
    json_decref(res);
    res = lbt_exec_ok(&x.d, sid_of(lease), "",
                      "{\"command\": \"cat /proc/[0-9]*/cmdline | tr '\\\\000' ' ' | "
                      "grep -c '[s]leep 1000' || true\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "0\n");
    json_decref(res);
    json_decref(lease);
    lbt_daemon_cleanup(&x.d);
    ck_assert_int_eq(dk_count_containers(x.inst), 0);
}
END_TEST

/* 64 MiB of random bytes up and down, byte-exact, through the archive API. */
START_TEST(test_files_64mib_byte_exact)
{
    const size_t len = 64u << 20;
    unsigned char *blob = malloc(len);
    struct dk_daemon x;
    struct lbt_resp r;
    json_t *lease;
    char *out;

    ck_assert_ptr_nonnull(blob);
    lbt_fill_random(blob, len, 11);
    dk_start(&x, "big", NULL);
    lease = seed_ok(&x, "ep-f", NULL);
    lbt_file_put(&x.d, sid_of(lease), "", "/workspace/in/sub/blob.bin", "0600", blob, len, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
    lbt_file_get(&x.d, sid_of(lease), "", "/workspace/in/sub/blob.bin", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(r.len, len);
    ck_assert(memcmp(r.body, blob, len) == 0);
    lbt_resp_free(&r);
    out = lbt_sh(&x.d, sid_of(lease), "stat -c '%a %s' /workspace/in/sub/blob.bin");
    ck_assert_str_eq(out, "600 67108864\n");
    free(out);
    /* missing file, directory */
    lbt_file_get(&x.d, sid_of(lease), "", "/workspace/nope", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    lbt_file_get(&x.d, sid_of(lease), "", "/workspace/in", &r);
    ck_assert_int_eq(r.status, 400);
    lbt_resp_free(&r);
    free(blob);
    json_decref(lease);
    lbt_daemon_cleanup(&x.d);
}
END_TEST

/* A symlink inside the container pointing at /etc resolves inside the container: writing
 * through it never reaches the host's /etc, reading through it reads the container's. */
START_TEST(test_symlink_stays_inside)
{
    struct dk_daemon x;
    struct lbt_resp r;
    char host_path[128], name[64], cmd[256], *out;
    json_t *lease;

    snprintf(name, sizeof(name), "lbt-docker-probe-%d", (int)getpid());
    snprintf(host_path, sizeof(host_path), "/etc/%s", name);
    dk_start(&x, "sym", NULL);
    lease = seed_ok(&x, "ep-s", NULL);
    out = lbt_sh(&x.d, sid_of(lease),
                 "ln -s /etc /workspace/etc && ln -s /etc/passwd /workspace/pw && echo ok");
    ck_assert_str_eq(out, "ok\n");
    free(out);
    snprintf(cmd, sizeof(cmd), "/workspace/etc/%s", name);
    lbt_file_put(&x.d, sid_of(lease), "", cmd, NULL, "pwned\n", 6, &r);
    lbt_resp_free(&r);
    ck_assert_msg(!lbt_path_exists(host_path), "the host's %s was written", host_path);
    /* if the write went anywhere, it went to the container's own /etc */
    snprintf(cmd, sizeof(cmd), "cat /etc/%s 2>/dev/null || echo absent", name);
    out = lbt_sh(&x.d, sid_of(lease), cmd);
    ck_assert(strcmp(out, "pwned\n") == 0 || strcmp(out, "absent\n") == 0);
    free(out);
    /* the link to /etc/passwd reads the image's passwd, not the host's */
    out = lbt_sh(&x.d, sid_of(lease), "cat /etc/passwd");
    lbt_file_get(&x.d, sid_of(lease), "", "/workspace/pw", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(r.body, out);
    ck_assert_ptr_nonnull(strstr(r.body, "root:x:0:0:root:/root:/bin/sh\n"));
    ck_assert_ptr_null(strstr(r.body, "daemon:"));
    free(out);
    lbt_resp_free(&r);
    json_decref(lease);
    lbt_daemon_cleanup(&x.d);
}
END_TEST

struct seeder {
    struct lbt_daemon *d;
    struct lbt_resp r;
};

static void *seed_thread(void *arg)
{
    struct seeder *s = arg;

    lbt_json(s->d, "POST", "/v1/sessions/ep-c/seed", "", "{\"task_id\": \"task-c\"}", &s->r);
    return NULL;
}

/* 20 concurrent seeds of one session: one container, one sandbox id for all. */
START_TEST(test_concurrent_seeds_one_container)
{
    struct seeder s[20];
    pthread_t th[20];
    struct dk_daemon x;
    const char *first = NULL;
    struct lbt_resp r;

    dk_start(&x, "conc", NULL);
    for (int i = 0; i < 20; i++) {
        s[i].d = &x.d;
        ck_assert_int_eq(pthread_create(&th[i], NULL, seed_thread, &s[i]), 0);
    }
    for (int i = 0; i < 20; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 20; i++) {
        ck_assert_int_eq(s[i].r.status, 200);
        if (!first)
            first = sid_of(s[i].r.json);
        ck_assert_str_eq(sid_of(s[i].r.json), first);
    }
    ck_assert_int_eq(dk_count_containers(x.inst), 1);
    for (int i = 0; i < 20; i++)
        lbt_resp_free(&s[i].r);
    lbt_json(&x.d, "POST", "/v1/sessions/ep-c/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    ck_assert_int_eq(dk_count_containers(x.inst), 0);
    lbt_daemon_cleanup(&x.d);
}
END_TEST

/* pause/resume through the engine; limits reach the container. */
START_TEST(test_pause_resume_limits)
{
    struct dk_daemon x;
    struct lbt_resp r;
    char path[160], *out;
    json_t *lease, *c;

    dk_start(&x, "pause", NULL);
    lease = seed_ok(&x, "ep-p", "\"resources\": {\"cpu\": 0.5, \"memory_mib\": 128, \"pids\": 64}");
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pause", sid_of(lease));
    lbt_json(&x.d, "POST", path, "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "status")), "paused");
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sid_of(lease));
    lbt_json(&x.d, "GET", path, "", NULL, &r);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "status")), "paused");
    lbt_resp_free(&r);
    /* an exec in a paused container is refused at once: 409 conflict (API.md), as on local */
    lbt_exec(&x.d, sid_of(lease), "", "{\"command\": \"true\"}", &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/resume", sid_of(lease));
    lbt_json(&x.d, "POST", path, "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "status")), "running");
    lbt_resp_free(&r);
    out = lbt_sh(&x.d, sid_of(lease), "echo back");
    ck_assert_str_eq(out, "back\n");
    free(out);
    /* the engine holds the limits */
    snprintf(path, sizeof(path), "/v1.41/containers/lendbox-%s-%s/json", x.inst, sid_of(lease));
    c = dk_engine_get(path);
    ck_assert_ptr_nonnull(c);
    json_t *hc = json_object_get(c, "HostConfig");
    ck_assert_int_eq(json_integer_value(json_object_get(hc, "Memory")), 128 << 20);
    ck_assert_int_eq(json_integer_value(json_object_get(hc, "NanoCpus")), 500000000);
    ck_assert_int_eq(json_integer_value(json_object_get(hc, "PidsLimit")), 64);
    ck_assert_str_eq(json_string_value(json_object_get(hc, "NetworkMode")), "none");
    json_decref(c);
    json_decref(lease);
    lbt_daemon_cleanup(&x.d);
}
END_TEST

/* What the docker provider cannot honour: a network policy (422 unenforceable, no container
 * left), ports (422), an unknown image (404 image_not_found); and an exclusive exec, which it
 * can (the supervisor kills every other process first). */
START_TEST(test_unenforceable)
{
    struct dk_daemon x;
    struct lbt_resp r;
    json_t *lease;

    dk_start(&x, "cap", NULL);
    lbt_json(&x.d, "POST", "/v1/sessions/ep-n/seed", "",
             "{\"task_id\": \"t\", \"network\": {\"access\": \"model_only\", "
             "\"model_server\": \"http://127.0.0.1:8000\"}}",
             &r);
    lbt_assert_error(&r, 422, "unenforceable");
    lbt_resp_free(&r);
    lbt_json(&x.d, "POST", "/v1/sessions/ep-n/seed", "", "{\"task_id\": \"t\", \"ports\": [8080]}",
             &r);
    lbt_assert_error(&r, 422, "unenforceable");
    lbt_resp_free(&r);
    lbt_json(&x.d, "POST", "/v1/sessions/ep-n/seed", "",
             "{\"task_id\": \"t\", \"image\": \"no-such-image:1\"}", &r);
    lbt_assert_error(&r, 404, "image_not_found");
    lbt_resp_free(&r);
    ck_assert_int_eq(dk_count_containers(x.inst), 0);
    lease = seed_ok(&x, "ep-a", NULL);
    /* an exclusive exec runs with nothing else left in the container but its init; docker has
     * no base-image view for it, so it must say agent_root (without: 422 unenforceable) */
    {
        json_t *res = lbt_exec_ok(&x.d, sid_of(lease), "",
                                  "{\"command\": \"sleep 1000 > /dev/null 2>&1 &\", "
                                  "\"preserve_background_services\": true}");

        json_decref(res);
        res = lbt_exec_ok(&x.d, sid_of(lease), "",
                          "{\"command\": \"cat /proc/[0-9]*/cmdline | tr '\\\\000' ' ' | grep -c "
                          "'[s]leep 1000' || true\"}");
        ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "1\n");
        json_decref(res);
        res = lbt_exec_ok(&x.d, sid_of(lease), "",
                          "{\"command\": \"cat /proc/[0-9]*/cmdline | tr '\\\\000' ' ' | grep -c "
                          "'[s]leep 1000' || true\", \"exclusive\": true, \"agent_root\": true}");
        ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "0\n");
        json_decref(res);
        lbt_exec(&x.d, sid_of(lease), "", "{\"command\": \"true\", \"exclusive\": true}", &r);
        lbt_assert_error(&r, 422, "unenforceable");
        ck_assert_msg(strstr(r.body, "agent_root") != NULL, "%s", r.body);
        lbt_resp_free(&r);
    }
    json_decref(lease);
    lbt_daemon_cleanup(&x.d);
}
END_TEST

/* Harness activations: the receipt file is passed as the launcher's fd 4 through a socket in
 * the bind-mounted pass dir. A finished harness (return code, artifact, confirmed cleanup), then a
 * timed-out one whose whole tree is gone, then a close mid-run (TERM first). */
START_TEST(test_activations)
{
    struct dk_daemon x;
    struct lbt_resp r, c;
    struct lbt_async *ex;
    json_t *lease, *art;
    char *out;

    dk_start(&x, "act", NULL);
    lease = seed_ok(&x, "ep-a", NULL);
    lbt_json(&x.d, "POST", "/v1/sessions/ep-a/execute", "",
             "{\"argv\": [\"sh\", \"-c\", \"echo hi > /workspace/out.txt; exit 3\"], "
             "\"timeout_s\": 30, \"collect\": [\"/workspace/out.txt\"]}",
             &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "state")), "finished");
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "return_code")), 3);
    ck_assert(
        json_is_true(json_object_get(json_object_get(r.json, "cleanup"), "cleanup_confirmed")));
    art = json_object_get(json_object_get(r.json, "artifacts"), "/workspace/out.txt");
    ck_assert_str_eq(json_string_value(json_object_get(art, "base64")), "aGkK");
    lbt_resp_free(&r);
    /* the pass socket is gone: nothing in the container can connect to it any more */
    out = lbt_sh(&x.d, sid_of(lease), "ls -A /run/lendbox/pass | wc -l");
    ck_assert_str_eq(out, "0\n");
    free(out);
    lbt_json(&x.d, "POST", "/v1/sessions/ep-a/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    json_decref(lease);

    /* timed out: the whole tree goes */
    lease = seed_ok(&x, "ep-b", NULL);
    lbt_json(&x.d, "POST", "/v1/sessions/ep-b/execute", "",
             "{\"argv\": [\"sh\", \"-c\", \"setsid sleep 1000 & while :; do sleep 1; done\"], "
             "\"timeout_s\": 2, \"close_timeout_s\": 6}",
             &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "state")), "timed_out");
    lbt_resp_free(&r);
    out = lbt_sh(&x.d, sid_of(lease),
                 "cat /proc/[0-9]*/cmdline | tr '\\000' ' ' | grep -c '[s]leep' || true");
    ck_assert_str_eq(out, "0\n");
    free(out);
    json_decref(lease);

    /* close mid-run: TERM first, the waiting execute answers with the same artifacts */
    lease = seed_ok(&x, "ep-c", NULL);
    ex = lbt_async_json(&x.d, "POST", "/v1/sessions/ep-c/execute", "",
                        "{\"argv\": [\"sh\", \"-c\", \"trap 'echo graceful > "
                        "/workspace/state.txt; exit 0' TERM; echo running > /workspace/state.txt; "
                        "while :; do sleep 0.1; done\"], \"collect\": [\"/workspace/state.txt\"]}");
    for (int i = 0; i < 300; i++) {
        lbt_file_get(&x.d, sid_of(lease), "", "/workspace/state.txt", &r);
        bool running = r.status == 200 && strcmp(r.body, "running\n") == 0;

        lbt_resp_free(&r);
        if (running)
            break;
        lbt_sleep_ms(100);
    }
    lbt_json(&x.d, "POST", "/v1/sessions/ep-c/close", "", "{}", &c);
    ck_assert_msg(c.status == 200, "close: %ld %s", c.status, c.body);
    art = json_object_get(json_object_get(c.json, "artifacts"), "/workspace/state.txt");
    ck_assert_str_eq(json_string_value(json_object_get(art, "base64")), "Z3JhY2VmdWwK");
    ck_assert(
        json_is_true(json_object_get(json_object_get(c.json, "cleanup"), "cleanup_confirmed")));
    lbt_async_join(ex, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert(
        json_equal(json_object_get(r.json, "artifacts"), json_object_get(c.json, "artifacts")));
    lbt_resp_free(&r);
    lbt_resp_free(&c);
    json_decref(lease);
    lbt_daemon_cleanup(&x.d);
    ck_assert_int_eq(dk_count_containers(x.inst), 0);
}
END_TEST

/* A daemon whose default is local with docker enabled: a seed naming "provider": "docker" gets
 * a container, one naming none a local sandbox; each record keeps its provider; release of each
 * goes to the provider that made it. */
START_TEST(test_seed_chooses_provider)
{
    static const char *const both[] = {"--set", "provider.name=local", "--set",
                                       "provider.enabled=docker", NULL};
    struct dk_daemon x;
    struct lbt_resp r;
    json_t *dk, *loc;
    char *out;

    dk_start(&x, "both", both);
    dk = lbt_seed(&x.d, "ep-d", "t", "\"provider\": \"docker\"");
    loc = lbt_seed(&x.d, "ep-l", "t", NULL);
    ck_assert_str_eq(json_string_value(json_object_get(dk, "provider")), "docker");
    ck_assert_str_eq(json_string_value(json_object_get(dk, "image")), "lbtest:latest");
    ck_assert_str_eq(json_string_value(json_object_get(loc, "provider")), "local");
    ck_assert_int_eq(dk_count_containers(x.inst), 1);
    /* the docker sandbox runs the image */
    out = lbt_sh(&x.d, sid_of(dk), ". /etc/os-release; echo $ID");
    ck_assert_str_eq(out, "lbtest\n");
    free(out);
    lbt_json(&x.d, "POST", "/v1/sessions/ep-d/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    ck_assert_int_eq(dk_count_containers(x.inst), 0);
    lbt_json(&x.d, "POST", "/v1/sessions/ep-l/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    json_decref(dk);
    json_decref(loc);
    lbt_daemon_cleanup(&x.d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("docker");
    TCase *tc = tcase_create("docker");
    int rc;

    if (!dk_setup("test_docker"))
        return EXIT_SUCCESS;
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_lend_exec_release);
    tcase_add_test(tc, test_timeout_kills_setsid_tree);
    tcase_add_test(tc, test_files_64mib_byte_exact);
    tcase_add_test(tc, test_symlink_stays_inside);
    tcase_add_test(tc, test_concurrent_seeds_one_container);
    tcase_add_test(tc, test_pause_resume_limits);
    tcase_add_test(tc, test_unenforceable);
    tcase_add_test(tc, test_activations);
    tcase_add_test(tc, test_seed_chooses_provider);
    suite_add_tcase(s, tc);
    rc = lbt_run_suite(s);
    dk_teardown();
    return rc;
}
