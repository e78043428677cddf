/*
 * test_fair.c - the kind "one client stops lending for everyone": one sandbox's
 * execs hold at most [limits] max_execs_per_sandbox workers and queue places, past it 429 at
 * once, other sandboxes' execs still get workers, and execs whose client disconnected while
 * they waited in the queue never start.
 *
 * Real daemon (4 workers, 2 execs per sandbox), real sandboxes. Floods are sent on raw loopback
 * TCP sockets (real HTTP/1.1 requests) so the test can hold many requests open at once and
 * then disconnect some of them. Every exec writes a marker file into its sandbox's
 * /workspace; the markers are counted afterwards.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

static struct lbt_daemon D;

static const char *const ARGS[] = {"--set", "server.workers=4", "--set",
                                   "limits.max_execs_per_sandbox=2", NULL};

static void seed(const char *rsid, char *sbx, size_t sbx_len, char *op, size_t op_len)
{
    json_t *lease = lbt_seed(&D, rsid, "task-fair", NULL);

    snprintf(sbx, sbx_len, "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    if (op)
        snprintf(op, op_len, "%s",
                 json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
}

/* Send POST /v1/sandboxes/{sbx}/exec {"command": command} on a new connection; return its fd. */
static int raw_exec_send(const char *sbx, const char *token, const char *command)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    const char *hostport = D.base_url + strlen("http://");
    char host[64], body[512], head[1024];
    const char *colon = strrchr(hostport, ':');
    int fd, n, m;

    ck_assert(colon && (size_t)(colon - hostport) < sizeof(host));
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    ck_assert_int_eq(inet_pton(AF_INET, host, &sa.sin_addr), 1);
    sa.sin_port = htons((unsigned short)atoi(colon + 1));
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect: %s",
                  strerror(errno));
    n = snprintf(body, sizeof(body), "{\"command\": \"%s\", \"timeout_s\": 60}", command);
    m = snprintf(head, sizeof(head),
                 "POST /v1/sandboxes/%s/exec HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer "
                 "%s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: "
                 "close\r\n\r\n%s",
                 sbx, hostport, token[0] ? token : D.admin_token, n, body);
    ck_assert_int_eq(write(fd, head, (size_t)m), m);
    return fd;
}

/* Send GET /v1/sandboxes/{sbx} on a new connection; return its fd. */
static int raw_get_send(const char *sbx, const char *token)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    const char *hostport = D.base_url + strlen("http://");
    char host[64], head[1024];
    const char *colon = strrchr(hostport, ':');
    int fd, m;

    ck_assert(colon && (size_t)(colon - hostport) < sizeof(host));
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    ck_assert_int_eq(inet_pton(AF_INET, host, &sa.sin_addr), 1);
    sa.sin_port = htons((unsigned short)atoi(colon + 1));
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect: %s",
                  strerror(errno));
    m = snprintf(head, sizeof(head),
                 "GET /v1/sandboxes/%s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer "
                 "%s\r\nConnection: close\r\n\r\n",
                 sbx, hostport, token[0] ? token : D.admin_token);
    ck_assert_int_eq(write(fd, head, (size_t)m), m);
    return fd;
}

/* Read the whole response (the server closes after it) within timeout_ms; return its status
 * (0: no complete response in time) and keep the text in buf. */
static int raw_read_response(int fd, int timeout_ms, char *buf, size_t len)
{
    size_t got = 0;
    double until = lbt_now() + timeout_ms / 1000.0;
    int status = 0;

    buf[0] = '\0';
    while (got + 1 < len) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int left = (int)((until - lbt_now()) * 1000);
        ssize_t r;

        if (left <= 0 || poll(&pfd, 1, left) <= 0)
            return 0;
        r = read(fd, buf + got, len - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
        buf[got] = '\0';
    }
    if (sscanf(buf, "HTTP/1.1 %d", &status) != 1)
        return 0;
    return status;
}

/* Has a response arrived on fd (without reading it)? */
static bool answered(int fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};

    return poll(&pfd, 1, 0) == 1;
}

/* Wait until n processes of a sandbox (its host uid: asked before its workers are taken)
 * run exactly cmdline: the execs that hold workers have started. */
static void wait_running(uid_t uid, const char *cmdline, int n)
{
    while (lbt_count_procs_of_uid_exact(uid, cmdline) < n)
        lbt_sleep_ms(10);
}

static int count_markers(const char *sbx, const char *prefix)
{
    char cmd[200];
    char *out;
    int n;

    snprintf(cmd, sizeof(cmd), "ls /workspace | grep -c '^%s' || true", prefix);
    out = lbt_sh(&D, sbx, cmd);
    n = atoi(out);
    free(out);
    return n;
}

/* One operate token floods its sandbox with 12 execs: 2 are taken, 10 answer 429 overloaded at
 * once, and an admin exec on another sandbox answers while the flood's execs still run. */
START_TEST(test_flooded_sandbox_leaves_workers_for_others)
{
    enum { N_FLOOD = 12, CAP = 2 };
    char a[128], b[128], op_a[256], buf[4096];
    int fds[N_FLOOD], n429 = 0, n200 = 0;
    double t0, took;
    uid_t uid_a;
    json_t *res;

    seed("fair-a", a, sizeof(a), op_a, sizeof(op_a));
    seed("fair-b", b, sizeof(b), NULL, 0);
    uid_a = lbt_sandbox_uid(&D, a);
    for (int i = 0; i < N_FLOOD; i++)
        fds[i] = raw_exec_send(a, op_a, "sleep 8; touch /workspace/flood.$$");
    /* the flood is in: CAP of its execs run, and the rest are answered (429, at once) */
    wait_running(uid_a, "sleep 8", CAP);
    for (;;) {
        int n = 0;

        for (int k = 0; k < N_FLOOD; k++)
            n += answered(fds[k]);
        if (n >= N_FLOOD - CAP)
            break;
        lbt_sleep_ms(10);
    }
    t0 = lbt_now();
    res = lbt_exec_ok(&D, b, "", "{\"command\": \"echo other\"}");
    took = lbt_now() - t0;
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "other\n");
    json_decref(res);
    ck_assert_msg(took < 5, "sandbox B's exec waited %.1f s behind sandbox A's flood", took);
    for (int i = 0; i < N_FLOOD; i++) {
        int st = raw_read_response(fds[i], 60000, buf, sizeof(buf));

        close(fds[i]);
        if (st == 429) {
            n429++;
            ck_assert_msg(strstr(buf, "\"overloaded\"") && strstr(buf, "per sandbox"),
                          "429 without the overloaded code and the limit: %s", buf);
        } else if (st == 200) {
            n200++;
        } else {
            ck_abort_msg("flood exec %d: status %d: %s", i, st, buf);
        }
    }
    ck_assert_int_eq(n200, CAP);
    ck_assert_int_eq(n429, N_FLOOD - CAP);
    ck_assert_int_eq(count_markers(a, "flood."), CAP);
}
END_TEST

/* With every worker busy, execs queued for sandbox C whose client disconnects never run; a
 * queued exec whose client stays does. */
START_TEST(test_abandoned_queued_execs_do_not_run)
{
    char a[128], b[128], c[128], e[128], buf[4096];
    int busy[4], gone[2], kept, dropped;
    uid_t uid_a, uid_b;

    seed("fair-busy-a", a, sizeof(a), NULL, 0);
    seed("fair-busy-b", b, sizeof(b), NULL, 0);
    seed("fair-gone", c, sizeof(c), NULL, 0);
    seed("fair-kept", e, sizeof(e), NULL, 0);
    uid_a = lbt_sandbox_uid(&D, a);
    uid_b = lbt_sandbox_uid(&D, b);
    /* 2 + 2 execs take the 4 workers */
    busy[0] = raw_exec_send(a, "", "sleep 5");
    busy[1] = raw_exec_send(a, "", "sleep 5");
    busy[2] = raw_exec_send(b, "", "sleep 5");
    busy[3] = raw_exec_send(b, "", "sleep 5");
    wait_running(uid_a, "sleep 5", 2);
    wait_running(uid_b, "sleep 5", 2);
    dropped = lbt_log_count(&D, "dropped before it started");
    gone[0] = raw_exec_send(c, "", "touch /workspace/abandoned.$$");
    gone[1] = raw_exec_send(c, "", "touch /workspace/abandoned.$$");
    kept = raw_exec_send(e, "", "touch /workspace/kept.$$");
    /* the daemon has read them (and queued them: no worker is free) */
    while (!lbt_request_read(gone[0]) || !lbt_request_read(gone[1]) || !lbt_request_read(kept))
        lbt_sleep_ms(10);
    /* the queued ones are not answered yet: no worker was free */
    ck_assert_int_eq(raw_read_response(gone[0], 10, buf, sizeof(buf)), 0);
    close(gone[0]);
    close(gone[1]);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(raw_read_response(busy[i], 60000, buf, sizeof(buf)), 200);
        close(busy[i]);
    }
    ck_assert_int_eq(raw_read_response(kept, 60000, buf, sizeof(buf)), 200);
    close(kept);
    /* the abandoned two reached a worker, which dropped them */
    while (lbt_log_count(&D, "dropped before it started") < dropped + 2)
        lbt_sleep_ms(10);
    ck_assert_int_eq(count_markers(e, "kept."), 1);
    ck_assert_int_eq(count_markers(c, "abandoned."), 0);
}
END_TEST

/* GET /v1/sandboxes/{id} asks the provider (status, and usage: an engine call on docker and
 * lxd, a walk of the workdir with local.storage = dir): one sandbox's GETs, sent with its own
 * operate token as a hostile agent could, hold at most max_execs_per_sandbox (2) of the 4
 * workers; the rest answer 429 overloaded at once, and another sandbox's GET is answered. The
 * provider's status call is made slow (faults.spec) so that the flood's GETs overlap. */
START_TEST(test_flooded_get_leaves_workers_for_others)
{
    enum { N_FLOOD = 8, CAP = 2 };
    char a[128], b[128], op_a[256], buf[8192], path[200];
    int fds[N_FLOOD], n429 = 0, n200 = 0;
    struct lbt_resp r;

    seed("fair-get-a", a, sizeof(a), op_a, sizeof(op_a));
    seed("fair-get-b", b, sizeof(b), NULL, 0);
    for (int i = 0; i < N_FLOOD; i++)
        fds[i] = raw_get_send(a, op_a);
    /* another sandbox's GET gets one of the workers the flood left */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", b);
    lbt_json(&D, "GET", path, "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "state")), "lent");
    lbt_resp_free(&r);
    for (int i = 0; i < N_FLOOD; i++) {
        int st = raw_read_response(fds[i], 60000, buf, sizeof(buf));

        close(fds[i]);
        if (st == 429) {
            n429++;
            ck_assert_msg(strstr(buf, "{\"error\":{\"code\":\"overloaded\"") &&
                              strstr(buf, "per sandbox") && strstr(buf, "Retry-After: 1"),
                          "429 without the overloaded code, the limit and Retry-After: %s", buf);
        } else if (st == 200) {
            n200++;
        } else {
            ck_abort_msg("flood GET %d: status %d: %s", i, st, buf);
        }
    }
    ck_assert_int_eq(n200, CAP);
    ck_assert_int_eq(n429, N_FLOOD - CAP);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fair");
    TCase *tc = tcase_create("fair");

    lbt_shared_daemon(tc, &D, ARGS);
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_flooded_sandbox_leaves_workers_for_others);
    tcase_add_test(tc, test_abandoned_queued_execs_do_not_run);
    suite_add_tcase(s, tc);
    /* its own daemon: every provider status call takes 3 s */
    static const char *const get_args[] = {"--set", "server.workers=4",
                                           "--set", "limits.max_execs_per_sandbox=2",
                                           "--set", "faults.spec=provider.status=delay:3000",
                                           NULL};
    TCase *get = tcase_create("fair_get");

    lbt_shared_daemon(get, &D, get_args);
    tcase_set_timeout(get, 120);
    tcase_add_test(get, test_flooded_get_leaves_workers_for_others);
    suite_add_tcase(s, get);
    return lbt_run_suite(s);
}
