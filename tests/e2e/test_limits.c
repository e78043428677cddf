/*
 * test_limits.c - acceptance for the daemon's own resource bounds (memory,
 * connections and the rest below):
 *
 * memory       uploads stream into the sandbox: one larger than the in-flight budget arrives
 *              byte-exact, 8 concurrent 128 MB uploads keep the daemon's peak RSS (VmHWM) low,
 *              an aborted or over-limit upload leaves no temporary file, buffered JSON bodies
 *              past the in-flight budget get 429 overloaded.
 * connections  10,000 idle connections from 127.0.0.2 do not keep /healthz or an exec from
 *              127.0.0.1 from answering within 1 s; connections that never complete a request
 *              are closed after header_timeout_s; with the daemon's fd limit at 1024 a flood does
 *              not make seeds, execs or file transfers fail with "Too many open files".
 * secrets      a group/world-readable admin token file or state dir refuses the start; the
 *              admin token is not readable through the files API with an operate token.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/sha.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static struct lbt_daemon D;
static char SBX[128], OPERATE[256];

static void seed(void)
{
    json_t *lease = lbt_seed(&D, "limits-1", "task-limits", NULL);

    snprintf(SBX, sizeof(SBX), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    snprintf(OPERATE, sizeof(OPERATE), "%s",
             json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
}

static const char *const MEMORY_ARGS[] = {"--set", "limits.max_inflight_bytes=1048576", "--set",
                                          "limits.max_file_bytes=314572800",
                                          /* the workdir is a tmpfs of default_disk_mib: room
                                           * for 8 x 128 MB at once */
                                          "--set", "limits.default_disk_mib=1536",
                                          /* 24 concurrent output floods into one sandbox */
                                          "--set", "limits.max_execs_per_sandbox=24", NULL};

/* no cap on connections still sending headers: the per-address limit is what these tests
 * reach with idle connections (test_trickle covers the cap) */
static const char *const CONNECTION_ARGS[] = {"--set", "server.header_timeout_s=3", "--set",
                                              "server.per_ip_incomplete=1000000", NULL};

static void sha256_hex(const void *data, size_t len, char out[65])
{
    unsigned char md[SHA256_DIGEST_LENGTH];

    SHA256(data, len, md);
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
}

/* Size and sha256 of path as the sandbox itself sees it. */
static void assert_sandbox_file(const char *path, const void *data, size_t len)
{
    char cmd[600], want[128], hex[65];
    char *out;

    sha256_hex(data, len, hex);
    snprintf(cmd, sizeof(cmd), "wc -c < '%s'; sha256sum < '%s' | cut -d' ' -f1", path, path);
    out = lbt_sh(&D, SBX, cmd);
    snprintf(want, sizeof(want), "%zu\n%s\n", len, hex);
    ck_assert_str_eq(out, want);
    free(out);
}

/* Names of the upload temporary files in dir inside the sandbox ("" when none). */
static char *temp_files_in(const char *dir)
{
    char cmd[600];

    snprintf(cmd, sizeof(cmd), "ls -A '%s' 2>/dev/null | grep '^\\.lendbox-' || true", dir);
    return lbt_sh(&D, SBX, cmd);
}

/* ---------- memory ---------- */

START_TEST(test_upload_larger_than_budget_streams)
{
    size_t len = 256u << 20; /* 256 times the in-flight budget of 1 MiB */
    unsigned char *buf = malloc(len);
    struct lbt_resp r;
    char *tmp;

    ck_assert_ptr_nonnull(buf);
    lbt_fill_random(buf, len, 7);
    lbt_file_put(&D, SBX, OPERATE, "/workspace/big/upload.bin", NULL, buf, len, &r);
    ck_assert_msg(r.status == 204, "PUT 256 MB: %ld %.300s", r.status, r.body);
    lbt_resp_free(&r);
    assert_sandbox_file("/workspace/big/upload.bin", buf, len);
    tmp = temp_files_in("/workspace/big");
    ck_assert_str_eq(tmp, "");
    free(tmp);
    free(buf);
    free(lbt_sh(&D, SBX, "rm -r /workspace/big")); /* the workdir's room, for the next tests */
}
END_TEST

struct put_arg {
    pthread_t thread;
    const void *data;
    size_t len;
    char path[64];
    long status;
};

static void *put_thread(void *arg)
{
    struct put_arg *p = arg;
    struct lbt_resp r;

    lbt_file_put(&D, SBX, OPERATE, p->path, NULL, p->data, p->len, &r);
    p->status = r.status;
    lbt_resp_free(&r);
    return NULL;
}

START_TEST(test_concurrent_uploads_bounded_rss)
{
    size_t len = 128u << 20;
    unsigned char *buf = malloc(len);
    struct put_arg puts[8];
    long idle_kb = lbt_proc_status_kb(D.pid, "VmRSS"), peak_kb, bound_kb = 96 * 1024;

    ck_assert_ptr_nonnull(buf);
    ck_assert_int_gt(idle_kb, 0);
    bound_kb *= LBT_RSS_FACTOR; /* a sanitizer's shadow memory of what the daemon does touch */
    lbt_fill_random(buf, len, 8);
    for (int i = 0; i < 8; i++) {
        puts[i].data = buf;
        puts[i].len = len;
        snprintf(puts[i].path, sizeof(puts[i].path), "/workspace/c/upload-%d.bin", i);
        ck_assert_int_eq(pthread_create(&puts[i].thread, NULL, put_thread, &puts[i]), 0);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(puts[i].thread, NULL);
        ck_assert_msg(puts[i].status == 204, "upload %d: %ld", i, puts[i].status);
    }
    /* VmHWM: the peak resident size since the daemon started */
    peak_kb = lbt_proc_status_kb(D.pid, "VmHWM");
    fprintf(stderr,
            "test_limits: daemon VmRSS idle %ld kB, VmHWM after 8 x 128 MB uploads %ld kB\n",
            idle_kb, peak_kb);
    ck_assert_msg(peak_kb - idle_kb < bound_kb,
                  "8 concurrent 128 MB uploads took the daemon from %ld kB to a peak of %ld kB",
                  idle_kb, peak_kb);
    assert_sandbox_file("/workspace/c/upload-7.bin", buf, len);
    free(buf);
    free(lbt_sh(&D, SBX, "rm -r /workspace/c"));
}
END_TEST

struct exec_arg {
    pthread_t thread;
    long status;
    bool truncated;
};

static void *flood_exec_thread(void *arg)
{
    struct exec_arg *e = arg;
    struct lbt_resp r;

    lbt_exec(&D, SBX, OPERATE, "{\"command\": \"yes | head -c 50000000\"}", &r);
    e->status = r.status;
    e->truncated = r.json && json_is_true(json_object_get(r.json, "stdout_truncated"));
    lbt_resp_free(&r);
    return NULL;
}

/* 24 concurrent output floods, three times: the daemon's peak stays bounded (at most
 * max_output_bytes kept per stream), and the buffers go back to the system afterwards. */
START_TEST(test_output_floods_bounded_and_returned)
{
    struct exec_arg ex[24];
    long idle_kb = lbt_proc_status_kb(D.pid, "VmRSS"), peak_kb, after_kb;
    long peak_bound_kb = 128 * 1024, after_bound_kb = 16 * 1024;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 24; i++)
            ck_assert_int_eq(pthread_create(&ex[i].thread, NULL, flood_exec_thread, &ex[i]), 0);
        for (int i = 0; i < 24; i++) {
            pthread_join(ex[i].thread, NULL);
            ck_assert_int_eq(ex[i].status, 200);
            ck_assert(ex[i].truncated);
        }
    }
    lbt_sleep_ms(500);
    after_kb = lbt_proc_status_kb(D.pid, "VmRSS");
    peak_kb = lbt_proc_status_kb(D.pid, "VmHWM");
    fprintf(stderr,
            "test_limits: daemon VmRSS idle %ld kB, after 3 x 24 output floods %ld kB, VmHWM %ld "
            "kB\n",
            idle_kb, after_kb, peak_kb);
#ifndef LBT_SANITIZED
    /* (a sanitizer's allocator keeps freed memory in quarantine: no bound to check there) */
    ck_assert_msg(peak_kb - idle_kb < peak_bound_kb, "peak %ld kB from idle %ld kB", peak_kb,
                  idle_kb);
    ck_assert_msg(after_kb - idle_kb < after_bound_kb,
                  "the daemon kept %ld kB after the floods (idle %ld kB)", after_kb - idle_kb,
                  idle_kb);
#else
    (void)peak_bound_kb;
    (void)after_bound_kb;
#endif
}
END_TEST

static int connect_from(const char *src_ip, const struct lbt_daemon *d, bool nonblock)
{
    struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET};
    const char *hostport = d->base_url + strlen("http://");
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0);

    ck_assert_int_ge(fd, 0);
    inet_pton(AF_INET, src_ip, &src.sin_addr);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&src, sizeof(src)), 0);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    dst.sin_port = htons((uint16_t)atoi(strrchr(hostport, ':') + 1));
    if (connect(fd, (struct sockaddr *)&dst, sizeof(dst)) < 0)
        ck_assert_msg(nonblock && errno == EINPROGRESS, "connect: %s", strerror(errno));
    return fd;
}

static void send_all(int fd, const void *data, size_t len)
{
    const char *p = data;

    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

        ck_assert_msg(n > 0, "send: %s", strerror(errno));
        p += n;
        len -= (size_t)n;
    }
}

START_TEST(test_aborted_upload_leaves_no_temp_file)
{
    char head[1024], *tmp = NULL;
    static char chunk[1 << 20];
    int fd = connect_from("127.0.0.1", &D, false);

    memset(chunk, 'x', sizeof(chunk));
    snprintf(head, sizeof(head),
             "PUT /v1/sandboxes/%s/files?path=/workspace/ab/file.bin HTTP/1.1\r\n"
             "Host: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n",
             SBX, OPERATE, 64 << 20);
    send_all(fd, head, strlen(head));
    send_all(fd, chunk, sizeof(chunk));
    /* the bytes sent so far are in a temporary file inside the sandbox ... */
    for (int i = 0; i < 100; i++) {
        free(tmp);
        tmp = temp_files_in("/workspace/ab");
        if (*tmp)
            break;
        lbt_sleep_ms(50);
    }
    ck_assert_msg(*tmp, "no temporary file while the upload is under way");
    free(tmp);
    tmp = NULL;
    /* ... and gone once the client hangs up mid-body */
    close(fd);
    for (int i = 0; i < 100; i++) {
        free(tmp);
        tmp = temp_files_in("/workspace/ab");
        if (!*tmp)
            break;
        lbt_sleep_ms(50);
    }
    ck_assert_msg(!*tmp, "temporary file left after an aborted upload: %s", tmp);
    free(tmp);
    tmp = lbt_sh(&D, SBX, "ls -A /workspace/ab");
    ck_assert_str_eq(tmp, ""); /* and the destination was never created */
    free(tmp);
    lbt_assert_healthy(&D);
}
END_TEST

START_TEST(test_over_limit_upload_leaves_no_temp_file)
{
    size_t len = (300u << 20) + 1024; /* max_file_bytes is 300 MiB */
    unsigned char *buf = calloc(1, len);
    struct lbt_resp r;
    char *tmp;

    ck_assert_ptr_nonnull(buf);
    /* chunked: no Content-Length to refuse up front, so the body streams until it passes */
    {
        char path[256];

        snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?path=/workspace/ol/f.bin", SBX);
        lbt_request_ex(&D, "PUT", path, OPERATE, buf, len, "application/octet-stream", NULL, true,
                       &r);
    }
    lbt_assert_error(&r, 413, "payload_too_large");
    lbt_resp_free(&r);
    tmp = lbt_sh(&D, SBX, "ls -A /workspace/ol");
    ck_assert_str_eq(tmp, "");
    free(tmp);
    free(buf);
}
END_TEST

START_TEST(test_inflight_budget_429)
{
    size_t len = 2u << 20; /* over the 1 MiB budget, under max_body_bytes (16 MiB) */
    char *body = malloc(len + 64);
    char path[256];
    struct lbt_resp r;

    ck_assert_ptr_nonnull(body);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", SBX);
    /* {"command": "true", "env": {"PAD": "xxxx..."}} */
    strcpy(body, "{\"command\": \"true\", \"env\": {\"PAD\": \"");
    size_t n = strlen(body);
    memset(body + n, 'x', len - n - 3);
    memcpy(body + len - 3, "\"}}", 4);
    lbt_request_ex(&D, "POST", path, OPERATE, body, len, NULL, NULL, false, &r);
    lbt_assert_error(&r, 429, "overloaded");
    lbt_resp_free(&r);
    /* chunked: refused as it passes the budget */
    lbt_request_ex(&D, "POST", path, OPERATE, body, len, NULL, NULL, true, &r);
    lbt_assert_error(&r, 429, "overloaded");
    lbt_resp_free(&r);
    /* the budget is given back: a small body goes through */
    lbt_exec(&D, SBX, OPERATE, "{\"command\": \"true\"}", &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    free(body);
}
END_TEST

/* A request of a known client refused before its handler ran (here the in-flight budget: 429)
 * while its body is still arriving is answered once the body has ended, read and dropped: the
 * answer does not come while the body is half sent, and the client that goes on sending reads
 * the whole answer. Answered at once, the daemon closed the connection on the unread rest and a
 * client still sending saw a reset instead ("Send failure: Broken pipe", 4 of 100 at load, and
 * test_inflight_budget_429's status -1 under ThreadSanitizer). */
START_TEST(test_refusal_waits_for_the_body)
{
    enum { LEN = 2 << 20, FIRST = 64 << 10 };
    struct {
        const char *route, *token, *want_status, *want_code;
    } cases[] = {
        {"exec", OPERATE, "HTTP/1.1 429", "\"overloaded\""},
        {"exec", "", "HTTP/1.1 429", "\"overloaded\""}, /* the admin token */
    };
    char *body = malloc(LEN);

    ck_assert_ptr_nonnull(body);
    memset(body, 'x', LEN);
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        char path[256], head[1024], answer[4096];
        struct pollfd pfd;
        size_t got = 0;
        int fd = connect_from("127.0.0.1", &D, false), i;

        snprintf(path, sizeof(path), "/v1/sandboxes/%s/%s", SBX, cases[k].route);
        snprintf(head, sizeof(head),
                 "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                 "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n",
                 path, cases[k].token[0] ? cases[k].token : D.admin_token, LEN);
        send_all(fd, head, strlen(head));
        send_all(fd, body, FIRST);
        /* the daemon reads the head and the first part, and does not answer yet */
        pfd = (struct pollfd){.fd = fd, .events = POLLIN};
        for (i = 0; i < 1000 && !lbt_request_read(fd); i++) {
            ck_assert_msg(poll(&pfd, 1, 0) == 0, "%s: answered while the body was arriving", path);
            lbt_sleep_ms(10);
        }
        ck_assert_msg(i < 1000, "%s: the daemon did not read the request", path);
        ck_assert_msg(poll(&pfd, 1, 300) == 0, "%s: answered while the body was arriving", path);
        /* the rest of the body goes through, and the whole answer comes after it */
        send_all(fd, body + FIRST, LEN - FIRST);
        for (;;) {
            ssize_t n = recv(fd, answer + got, sizeof(answer) - 1 - got, 0);

            ck_assert_msg(n >= 0, "%s: recv: %s", path, strerror(errno));
            if (n == 0)
                break;
            got += (size_t)n;
            answer[got] = '\0';
            if (strstr(answer, "\r\n\r\n") && strstr(answer, "}}"))
                break;
        }
        answer[got] = '\0';
        ck_assert_msg(strncmp(answer, cases[k].want_status, strlen(cases[k].want_status)) == 0 &&
                          strstr(answer, cases[k].want_code),
                      "%s: %s", path, answer);
        close(fd);
    }
    free(body);
    lbt_assert_healthy(&D);
}
END_TEST

/* Send head on a new connection from 127.0.0.1 and return the daemon's first answer bytes
 * (the status line and on) into buf, waiting at most 10 s; the body the head announces is
 * never sent. */
static void answer_without_body(const char *head, char *buf, size_t size)
{
    int fd = connect_from("127.0.0.1", &D, false);
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    ssize_t n;

    send_all(fd, head, strlen(head));
    ck_assert_msg(poll(&pfd, 1, 10000) == 1, "no answer to %.60s", head);
    n = recv(fd, buf, size - 1, 0);
    ck_assert_int_gt(n, 0);
    buf[n] = '\0';
    close(fd);
}

/* A client the daemon cannot name by a token is answered at once, never made to send its body
 * first (that would let it hold a connection past its header deadline): a bad token with a
 * 1 MiB body announced gets its 401, and the routes that need no token (/healthz, /readyz,
 * /metrics) take no body at all (413, before a byte of it: neither a connection nor the in-flight
 * budget is held for it). A Transfer-Encoding other than chunked beside a Content-Length (the
 * body then ends only when the client closes) is answered at once too. */
START_TEST(test_anonymous_refusals_answered_at_once)
{
    char head[1024], buf[2048];

    snprintf(head, sizeof(head),
             "POST /v1/sandboxes/%s/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
             "lbo_not_a_token\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n",
             SBX);
    answer_without_body(head, buf, sizeof(buf));
    ck_assert_msg(strncmp(buf, "HTTP/1.1 401", 12) == 0, "%s", buf);
    answer_without_body("GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 16777216\r\n\r\n", buf,
                        sizeof(buf));
    ck_assert_msg(strncmp(buf, "HTTP/1.1 413", 12) == 0 && strstr(buf, "takes no request body"),
                  "%s", buf);
    answer_without_body("GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
                        buf, sizeof(buf));
    ck_assert_msg(strncmp(buf, "HTTP/1.1 413", 12) == 0, "%s", buf);
    snprintf(head, sizeof(head),
             "POST /v1/sandboxes/%s/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
             "Content-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\n"
             "Content-Length: 2097152\r\n\r\n",
             SBX, OPERATE);
    answer_without_body(head, buf, sizeof(buf));
    ck_assert_msg(strncmp(buf, "HTTP/1.1 4", 10) == 0, "%s", buf);
    lbt_assert_healthy(&D);
}
END_TEST

/* ---------- connections ---------- */

static void raise_own_fd_limit(rlim_t want)
{
    struct rlimit rl = {want, want};

    ck_assert_msg(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit(%llu): %s",
                  (unsigned long long)want, strerror(errno));
}

/* Open n connections from src_ip to the daemon and wait until each is connected or refused.
 * They are opened FLOOD_BATCH at a time, each batch once the daemon has taken the last one from
 * its accept queue (lbt_wait_accepted): a connection the kernel completes while that queue is
 * full (its backlog, 1024) is never handed to the daemon, and its client sees it open for as
 * long as it waits. A slow daemon (ThreadSanitizer's, or one at load) left thousands so, and
 * the tests below would have held the daemon to connections it never saw. Returns the fds (-1
 * for refused ones); *connected counts the others. */
enum { FLOOD_BATCH = 256 };
static int *flood(const struct lbt_daemon *d, const char *src_ip, int n, int *connected)
{
    int *fds = malloc(sizeof(int) * (size_t)n);
    struct pollfd *pfd = calloc((size_t)n, sizeof(*pfd));
    double deadline = lbt_now() + 60;

    ck_assert_ptr_nonnull(fds);
    ck_assert_ptr_nonnull(pfd);
    *connected = 0;
    for (int b = 0; b < n; b += FLOOD_BATCH) {
        int m = n - b < FLOOD_BATCH ? n - b : FLOOD_BATCH, pending = m;

        for (int i = b; i < b + m; i++) {
            fds[i] = connect_from(src_ip, d, true);
            pfd[i].fd = fds[i];
            pfd[i].events = POLLOUT;
        }
        while (pending > 0 && lbt_now() < deadline) {
            ck_assert_int_ge(poll(pfd + b, (nfds_t)m, 1000), 0);
            for (int i = b; i < b + m; i++) {
                int e = 0;
                socklen_t el = sizeof(e);

                if (pfd[i].fd < 0 || !pfd[i].revents)
                    continue;
                getsockopt(pfd[i].fd, SOL_SOCKET, SO_ERROR, &e, &el);
                if (e == 0) {
                    (*connected)++;
                } else {
                    close(fds[i]);
                    fds[i] = -1;
                }
                pfd[i].fd = -1;
                pending--;
            }
        }
        ck_assert_msg(pending == 0, "%d connects still pending after 60 s", pending);
        lbt_wait_accepted(d);
    }
    free(pfd);
    return fds;
}

/* How many of the fds the daemon has closed (EOF or reset) by now. */
static int count_closed(const int *fds, int n, int *open_out)
{
    int closed = 0, open = 0;

    for (int i = 0; i < n; i++) {
        char c;
        ssize_t r;

        if (fds[i] < 0)
            continue;
        r = recv(fds[i], &c, 1, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
            closed++;
        else
            open++;
    }
    if (open_out)
        *open_out = open;
    return closed;
}

START_TEST(test_idle_flood_healthz_and_exec_answer)
{
    const int n = 10000;
    int connected = 0, open = 0, *fds;
    double t0, dt;
    struct lbt_resp r;
    json_t *res;

    raise_own_fd_limit(n + 1024);
    fds = flood(&D, "127.0.0.2", n, &connected);
    fprintf(stderr, "test_limits: %d of %d idle connections from 127.0.0.2 connected\n", connected,
            n);
    ck_assert_int_gt(connected, 0);
    /* half-requests on a few of them: a request line, never the end of the headers */
    for (int i = 0, sent = 0; i < n && sent < 10; i++)
        if (fds[i] >= 0 && send(fds[i], "GET /healthz HTTP/1.1\r\n", 23, MSG_NOSIGNAL) == 23)
            sent++;

    t0 = lbt_now();
    lbt_request(&D, "GET", "/healthz", NULL, NULL, 0, NULL, &r);
    dt = lbt_now() - t0;
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    ck_assert_msg(dt < 1.0, "/healthz took %.3f s under 10,000 idle connections", dt);
    t0 = lbt_now();
    res = lbt_exec_ok(&D, SBX, OPERATE, "{\"command\": \"echo ok\"}");
    dt = lbt_now() - t0;
    {
        char *text = json_dumps(res, JSON_COMPACT);

        ck_assert_msg(!strcmp(json_string_value(json_object_get(res, "stdout")), "ok\n"),
                      "exec under the flood: %s", text);
        free(text);
    }
    json_decref(res);
    ck_assert_msg(dt < 1.0, "an exec took %.3f s under 10,000 idle connections", dt);
    fprintf(stderr, "test_limits: healthz and exec answered under the flood\n");

    /* every idle connection is closed after header_timeout_s (3 s) */
    t0 = lbt_now();
    while (count_closed(fds, n, &open) >= 0 && open > 0 && lbt_now() - t0 < 15)
        lbt_sleep_ms(250);
    ck_assert_msg(open == 0, "%d idle connections still open %.1f s after the flood", open,
                  lbt_now() - t0);
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(fds);
    lbt_assert_healthy(&D);
}
END_TEST

/* ---------- header trickle ---------- */

/* The daemon of test_trickle: a header deadline of 2 s, 500 connections per address (the
 * incomplete-request cap is then its default, 64). */
static const char *const TRICKLE_ARGS[] = {"--set", "server.header_timeout_s=2", "--set",
                                           "server.per_ip_connections=500", NULL};

/* Lines of the daemon's log that hold needle. */
static int log_lines_with(const struct lbt_daemon *d, const char *needle)
{
    FILE *f = fopen(d->log_path, "re");
    char *line = NULL;
    size_t cap = 0;
    int n = 0;

    ck_assert_ptr_nonnull(f);
    while (getline(&line, &cap, f) > 0)
        n += strstr(line, needle) != NULL;
    fclose(f);
    free(line);
    return n;
}

/* The value of a line of the daemon's /metrics that starts with series ("name" or
 * "name{labels}"), or -1 when there is none. */
static double metric(const char *series)
{
    struct lbt_resp r;
    double v = -1;
    const char *p;
    size_t n = strlen(series);

    lbt_request(&D, "GET", "/metrics", NULL, NULL, 0, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    for (p = r.body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            v = strtod(p + n + 1, NULL);
    lbt_resp_free(&r);
    return v;
}

/* 600 connections from 127.0.0.1 each send a request line, then one header line every 250 ms
 * (each line resets libmicrohttpd's idle timer). Meanwhile /healthz from 127.0.0.1 answers 200
 * every time; every trickling connection is closed while it still trickles (without the
 * header deadline they would stay open for as long as they trickle): the oldest ones as newer
 * ones pass the address's cap of 64 connections still sending headers, the rest at the 2 s
 * deadline (the daemon's counters say which, and that one address never had more than 64
 * waiting); and the log gets a few lines, not one per connection. Nothing here depends on how
 * fast the daemon accepts, so a slow (sanitized) daemon passes too. */
START_TEST(test_trickle)
{
    enum { N = 600, CAP = 64 };
    int connected = 0, *fds, open_now = N, warn_before;
    double t0, by_deadline, by_cap, most;

    raise_own_fd_limit(N + 1024);
    warn_before = log_lines_with(&D, " warn ");
    t0 = lbt_now();
    fds = flood(&D, "127.0.0.1", N, &connected);
    for (int i = 0; i < N; i++)
        if (fds[i] >= 0 && send(fds[i], "GET /healthz HTTP/1.1\r\n", 23, MSG_NOSIGNAL) != 23) {
            close(fds[i]);
            fds[i] = -1;
        }
    fprintf(stderr, "test_limits: %d of %d trickling connections from 127.0.0.1 connected\n",
            connected, N);
    /* trickle until every one is closed (2 s from its accept; 30 s at most) */
    while (open_now > 0 && lbt_now() - t0 < 30) {
        struct lbt_resp r;

        open_now = 0;
        for (int i = 0; i < N; i++) {
            char c;
            ssize_t got;

            if (fds[i] < 0)
                continue;
            got = recv(fds[i], &c, 1, MSG_DONTWAIT);
            if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
                send(fds[i], "X-Trickle: 1\r\n", 14, MSG_NOSIGNAL) != 14) {
                close(fds[i]);
                fds[i] = -1;
                continue;
            }
            open_now++;
        }
        /* another client of the same address is served throughout */
        lbt_request(&D, "GET", "/healthz", NULL, NULL, 0, NULL, &r);
        ck_assert_msg(r.status == 200, "/healthz at %.2f s of the trickle: %ld", lbt_now() - t0,
                      r.status);
        lbt_resp_free(&r);
        lbt_sleep_ms(250);
    }
    free(fds);
    by_deadline = metric("lendbox_http_connections_cut_total{reason=\"header_deadline\"}");
    by_cap = metric("lendbox_http_connections_cut_total{reason=\"per_address_cap\"}");
    most = metric("lendbox_http_incomplete_per_address_max");
    fprintf(stderr,
            "test_limits: trickle: %d open after %.1f s; %.0f closed at the deadline, %.0f past "
            "the cap; at most %.0f waiting from one address\n",
            open_now, lbt_now() - t0, by_deadline, by_cap, most);
    ck_assert_msg(open_now == 0, "%d trickling connections still open after 30 s", open_now);
    ck_assert_msg(by_deadline >= 1 && by_deadline <= CAP, "%.0f closed at the deadline",
                  by_deadline);
    ck_assert_msg(by_cap >= 1 && by_cap + by_deadline <= N + 8, "%.0f closed past the cap", by_cap);
    ck_assert_msg(most >= 1 && most <= CAP, "%.0f connections of one address waiting at once",
                  most);
    /* a handful of warning lines, not one per connection */
    ck_assert_msg(log_lines_with(&D, " warn ") - warn_before <= 8,
                  "%d warnings logged for the trickle (see %s)",
                  log_lines_with(&D, " warn ") - warn_before, D.log_path);
    lbt_assert_healthy(&D);
}
END_TEST

/* 1500 open connections take every fd number below 1024 in the daemon: a new sandbox and an
 * exec, whose processes get an fd limit of 1024 (local.sandbox_nofile), still start. */
START_TEST(test_seed_and_exec_above_fd_1024)
{
    int connected = 0, *fds;
    char sbx[128];
    json_t *lease, *res;

    raise_own_fd_limit(4096);
    fds = flood(&D, "127.0.0.4", 1500, &connected);
    ck_assert_int_eq(connected, 1500);
    lbt_wait_accepted(&D); /* the daemon holds all 1500 */
    lease = lbt_seed(&D, "limits-highfd", "task", NULL);
    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    res = lbt_exec_ok(&D, sbx, "", "{\"command\": \"echo ok; ulimit -n\"}");
    {
        char *text = json_dumps(res, JSON_COMPACT);

        ck_assert_msg(!strcmp(json_string_value(json_object_get(res, "stdout")), "ok\n1024\n"),
                      "exec with 1500 connections open: %s", text);
        free(text);
    }
    json_decref(res);
    for (int i = 0; i < 1500; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(fds);
}
END_TEST

/* The daemon of test_low_fd_limit_flood, started by the (forked) test itself. */
static struct lbt_daemon LOW;

/* The per-client limit the daemon logged at start. */
static int logged_per_ip_limit(const struct lbt_daemon *d)
{
    FILE *f = fopen(d->log_path, "re");
    char *line = NULL, *p;
    size_t cap = 0;
    unsigned conns = 0, per_ip = 0;

    ck_assert_ptr_nonnull(f);
    while (getline(&line, &cap, f) > 0)
        if ((p = strstr(line, "at most ")) && strstr(line, "per client address"))
            sscanf(p, "at most %u connections (%u per client address)", &conns, &per_ip);
    fclose(f);
    free(line);
    ck_assert_uint_gt(per_ip, 0);
    return (int)per_ip;
}

START_TEST(test_per_client_limit)
{
    int per_ip = logged_per_ip_limit(&D), n = per_ip + 200, connected = 0, open = 0, closed, *fds;
    double t0;

    raise_own_fd_limit((rlim_t)n + 1024);
    t0 = lbt_now();
    fds = flood(&D, "127.0.0.3", n, &connected);
    lbt_wait_accepted(&D); /* it has seen each: kept it, or closed it past the limit */
    closed = count_closed(fds, n, &open);
    fprintf(stderr, "test_limits: %d connections from 127.0.0.3 (limit %d): %d closed, %d open\n",
            n, per_ip, closed, open);
    /* well before header_timeout_s (3 s): only the per-client limit closes connections */
    if (lbt_now() - t0 < 2.5) {
        ck_assert_int_ge(closed, n - per_ip);
        ck_assert_int_le(open, per_ip);
        ck_assert_int_ge(open, per_ip / 2);
    }
    lbt_assert_healthy(&D);
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(fds);
}
END_TEST

START_TEST(test_low_fd_limit_flood)
{
    int connected = 0, *fds;
    struct lbt_resp r;
    json_t *lease, *res;
    char sbx[128], *log = NULL;
    static const char *const args[] = {NULL};

    /* a daemon started with an fd limit of 1024 (soft and hard: it cannot raise it) */
    lbt_set_daemon_fd_limit(1024);
    lbt_daemon_start(&LOW, args);
    lbt_set_daemon_fd_limit(0);
    raise_own_fd_limit(4096);
    {
        char path[64], *limits;
        FILE *f;
        size_t cap = 0;
        bool seen = false;

        snprintf(path, sizeof(path), "/proc/%d/limits", (int)LOW.pid);
        f = fopen(path, "re");
        ck_assert_ptr_nonnull(f);
        limits = NULL;
        while (getline(&limits, &cap, f) > 0)
            seen = seen || (strstr(limits, "Max open files") && strstr(limits, " 1024 "));
        fclose(f);
        free(limits);
        ck_assert_msg(seen, "the daemon's fd limit is not 1024");
    }
#define D LOW

    fds = flood(&LOW, "127.0.0.2", 1500, &connected);
    fprintf(stderr, "test_limits: %d of 1500 connections connected (daemon fd limit 1024)\n",
            connected);
    lease = lbt_seed(&D, "limits-fd", "task-fd", NULL);
    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    for (int i = 0; i < 8; i++) {
        res = lbt_exec_ok(&D, sbx, "", "{\"command\": \"echo ok\"}");
        ck_assert_int_eq(json_integer_value(json_object_get(res, "return_code")), 0);
        json_decref(res);
    }
    lbt_file_put(&D, sbx, "", "/workspace/f.txt", NULL, "hello", 5, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
    lbt_file_get(&D, sbx, "", "/workspace/f.txt", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(r.len, 5);
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/limits-fd/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    for (int i = 0; i < 1500; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(fds);
    {
        FILE *f = fopen(D.log_path, "re");
        size_t cap = 0;
        ssize_t got;
        bool emfile = false;

        ck_assert_ptr_nonnull(f);
        while ((got = getline(&log, &cap, f)) > 0)
            emfile = emfile || strstr(log, "Too many open files") != NULL;
        fclose(f);
        free(log);
        ck_assert_msg(!emfile, "the daemon ran out of fds (see %s)", D.log_path);
    }
#undef D
}
END_TEST

/* ---------- secrets ---------- */

/* Run lendboxd with args (state dir, listen, supervisor added) and expect it to refuse to
 * start: returns its exit status; its output goes to out. */
static int run_expect_refusal(const char *state_dir, const char *const *extra, char *out,
                              size_t out_len)
{
    const char *bin = getenv("LENDBOXD") ? getenv("LENDBOXD") : "build/lendboxd";
    const char *argv[32];
    int n = 0, pipefd[2], status = 0;
    size_t got = 0;
    pid_t pid;

    argv[n++] = bin;
    argv[n++] = "--state-dir";
    argv[n++] = state_dir;
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    for (int i = 0; extra && extra[i]; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    ck_assert_int_eq(pipe2(pipefd, O_CLOEXEC), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(pipefd[1], 1);
        dup2(pipefd[1], 2);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(pipefd[1]);
    /* read its output until EOF (it exited) or 10 s (it started: not what the test wants) */
    for (double end = lbt_now() + 10; lbt_now() < end;) {
        struct pollfd p = {pipefd[0], POLLIN, 0};
        ssize_t r;

        if (poll(&p, 1, 100) <= 0)
            continue;
        r = read(pipefd[0], out + got, out_len - 1 - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    out[got] = '\0';
    close(pipefd[0]);
    for (int i = 0; i < 50 && waitpid(pid, &status, WNOHANG) != pid; i++)
        lbt_sleep_ms(100);
    if (kill(pid, 0) == 0 && waitpid(pid, &status, WNOHANG) != pid) {
        kill(pid, SIGTERM);
        waitpid(pid, &status, 0);
        return 0;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static char TMPDIR_[64];

static void setup_secrets(void)
{
    snprintf(TMPDIR_, sizeof(TMPDIR_), "/tmp/lbt-secrets-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(TMPDIR_));
    /* sandbox uids could reach a state dir below it: only the daemon's own checks refuse */
    ck_assert_int_eq(chmod(TMPDIR_, 0711), 0);
}

static void teardown_secrets(void)
{
    char cmd[128];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", TMPDIR_);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_refuses_readable_token_file)
{
    char state[128], token[128], out[8192];
    const char *args[] = {"--admin-token-file", token, NULL};
    int fd;

    snprintf(state, sizeof(state), "%s/state", TMPDIR_);
    snprintf(token, sizeof(token), "%s/admin.token", TMPDIR_);
    fd = open(token, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "0123456789abcdef0123456789abcdef\n", 33), 33);
    close(fd);
    ck_assert_int_eq(chmod(token, 0644), 0);
    ck_assert_msg(run_expect_refusal(state, args, out, sizeof(out)) != 0, "started: %s", out);
    ck_assert_msg(strstr(out, "admin token file") && strstr(out, "0644") && strstr(out, token),
                  "unclear refusal: %s", out);
    /* group-writable is refused too */
    ck_assert_int_eq(chmod(token, 0620), 0);
    ck_assert_int_ne(run_expect_refusal(state, args, out, sizeof(out)), 0);
    ck_assert_msg(strstr(out, "0620"), "unclear refusal: %s", out);
    /* the default token file in a state dir is also checked */
    ck_assert_int_eq(chmod(token, 0600), 0);
    {
        char def[160];
        const char *none[] = {NULL};

        snprintf(def, sizeof(def), "%s/admin.token", state);
        fd = open(def, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0640);
        ck_assert_int_ge(fd, 0);
        close(fd);
        ck_assert_int_eq(chmod(def, 0640), 0);
        ck_assert_int_ne(run_expect_refusal(state, none, out, sizeof(out)), 0);
        ck_assert_msg(strstr(out, def) && strstr(out, "0640"), "unclear refusal: %s", out);
    }
}
END_TEST

START_TEST(test_refuses_open_state_dir)
{
    static const mode_t bad[] = {0755, 0733, 0711 | 0040, 0777};
    char state[128], out[8192];
    const char *none[] = {NULL};

    snprintf(state, sizeof(state), "%s/state", TMPDIR_);
    ck_assert_int_eq(mkdir(state, 0700), 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char mode[8];

        ck_assert_int_eq(chmod(state, bad[i]), 0);
        ck_assert_int_ne(run_expect_refusal(state, none, out, sizeof(out)), 0);
        snprintf(mode, sizeof(mode), "%04o", (unsigned)bad[i]);
        ck_assert_msg(strstr(out, "state dir") && strstr(out, mode), "unclear refusal: %s", out);
        /* and nothing was made in it */
        {
            char p[200];

            snprintf(p, sizeof(p), "%s/admin.token", state);
            ck_assert(!lbt_path_exists(p));
        }
    }
}
END_TEST

START_TEST(test_token_not_readable_through_files)
{
    static const char *const args[] = {NULL};
    char path[512], token_file[160];
    struct lbt_resp r;
    const char *secrets[] = {"admin.token", "operate.key", "lendbox.db"};
    const char *restart[] = {"--admin-token-file", token_file, NULL};
    int fd;

    lbt_daemon_start(&D, args);
    {
        json_t *lease = lbt_seed(&D, "secrets-1", "task", NULL);

        snprintf(SBX, sizeof(SBX), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
        snprintf(OPERATE, sizeof(OPERATE), "%s",
                 json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
        json_decref(lease);
    }
    /* the state dir is not visible inside sandboxes at all */
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/%s", D.state_dir, secrets[i]);
        lbt_file_get(&D, SBX, OPERATE, path, &r);
        ck_assert_msg(r.status == 404, "GET %s with an operate token: %ld", path, r.status);
        lbt_resp_free(&r);
    }
    /* a token file elsewhere on the host (visible read-only in the sandbox) is 0600, so the
     * sandbox's uid cannot read it */
    snprintf(token_file, sizeof(token_file), "/var/tmp/lbt-admin-token-%d", (int)getpid());
    fd = open(token_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, D.admin_token, strlen(D.admin_token)),
                     (ssize_t)strlen(D.admin_token));
    close(fd);
    lbt_daemon_kill(&D); /* no shutdown sweep: the sandbox stays for the restart to adopt */
    lbt_daemon_restart(&D, restart);
    lbt_file_get(&D, SBX, OPERATE, token_file, &r);
    unlink(token_file);
    /* on an image the host's /var/tmp is not in the sandbox at all */
    if (lbt_variant_on_host())
        lbt_assert_error(&r, 403, "forbidden");
    else
        lbt_assert_error(&r, 404, "not_found");
    ck_assert(strstr(r.body, D.admin_token) == NULL);
    lbt_resp_free(&r);
}
END_TEST

/* ---------- sandbox memory ---------- */

/* The bytes of memory-backed files (tmpfs: shmem) charged to sandbox sbx's memory cgroup: v1
 * memory.stat total_shmem (its subtree), v2 memory.stat shmem, of the cgroup dir named after it.
 * Only files count there: what its processes and the execs that look come and go with them
 * (a sum like memory.current moved by a megabyte between two reads at load). */
static long long sandbox_memory_usage(const char *sbx)
{
    char cmd[400], dir[600] = "", path[700], key[64];
    long long v = -1, n;
    FILE *f;

    snprintf(cmd, sizeof(cmd),
             "find /sys/fs/cgroup -maxdepth 5 -type d -name '%s' 2>/dev/null | "
             "while read d; do test -e \"$d/memory.stat\" && echo \"$d\"; done | head -1",
             sbx);
    f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    if (!fgets(dir, sizeof(dir), f))
        dir[0] = '\0';
    pclose(f);
    dir[strcspn(dir, "\n")] = '\0';
    ck_assert_msg(dir[0], "no memory cgroup for %s", sbx);
    snprintf(path, sizeof(path), "%s/memory.stat", dir);
    f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot read %s", path);
    while (fscanf(f, "%63s %lld", key, &n) == 2) {
        if (strcmp(key, "total_shmem") == 0 || (strcmp(key, "shmem") == 0 && v < 0))
            v = n;
    }
    fclose(f);
    ck_assert_msg(v >= 0, "no shmem in %s", path);
    return v;
}

/* Files uploaded into a sandbox's memory-backed mounts (/tmp, the tmpfs workdir; both far larger
 * than the limit here) count against its own memory limit, not the daemon's: with memory_mib 64,
 * four 96 MiB uploads (one of them chunked, of unknown length) are each 413 naming the limit,
 * leave nothing behind, and the daemon lives on; an accepted 32 MiB upload shows in the
 * sandbox's memory cgroup (its shmem), and goes with the file. */
START_TEST(test_memory_mount_uploads_charged_to_sandbox)
{
    static const char *const paths[] = {"/tmp/m0", "/workspace/m1", "/tmp/m2", "/workspace/m3"};
    size_t len = 96u << 20, small = 32u << 20;
    char *data = malloc(len), sbx[128], url[400], *out;
    struct lbt_resp r;
    long long before, after;
    json_t *lease;

    ck_assert_ptr_nonnull(data);
    memset(data, 'm', len);
    lease = lbt_seed(&D, "limits-mem", "task-limits", "\"resources\": {\"memory_mib\": 64}");
    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    for (int i = 0; i < 4; i++) {
        snprintf(url, sizeof(url), "/v1/sandboxes/%s/files?path=%s", sbx, paths[i]);
        lbt_request_ex(&D, "PUT", url, "", data, len, "application/octet-stream", NULL, i == 3, &r);
        lbt_assert_error(&r, 413, "payload_too_large");
        ck_assert_msg(strstr(r.body, "memory limit (64 MiB)") != NULL, "%s: %s", paths[i], r.body);
        lbt_resp_free(&r);
    }
    if (!lbt_variant_on_host()) {
        /* an image's writable root: an overlay whose upper layer is a tmpfs */
        snprintf(url, sizeof(url), "/v1/sandboxes/%s/files?path=/srv/m4", sbx);
        lbt_request(&D, "PUT", url, "", data, len, "application/octet-stream", &r);
        lbt_assert_error(&r, 413, "payload_too_large");
        ck_assert_msg(strstr(r.body, "memory limit (64 MiB)") != NULL, "/srv/m4: %s", r.body);
        lbt_resp_free(&r);
    }
    out = lbt_sh(&D, sbx,
                 "ls -A /tmp /workspace | grep -c . || true; "
                 "df -k --output=used /tmp /workspace | tail -2 | tr -d ' '");
    ck_assert_str_eq(out, "2\n0\n0\n"); /* the two "dir:" headers of ls, nothing else */
    free(out);
    ck_assert_int_eq(kill(D.pid, 0), 0);
    lbt_json(&D, "GET", "/healthz", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);

    before = sandbox_memory_usage(sbx);
    lbt_file_put(&D, sbx, "", "/tmp/ok", NULL, data, small, &r);
    ck_assert_msg(r.status == 204, "PUT 32 MiB: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    after = sandbox_memory_usage(sbx);
    ck_assert_msg(after - before >= (long long)small - (1 << 20),
                  "the sandbox's memory grew by %lld bytes for a %zu-byte upload", after - before,
                  small);
    out = lbt_sh(&D, sbx, "wc -c < /tmp/ok; ls -A /tmp");
    ck_assert_str_eq(out, "33554432\nok\n");
    free(out);
    /* mode and owner are applied as on any mount */
    snprintf(url, sizeof(url),
             "/v1/sandboxes/%s/files?path=%%2Fworkspace%%2Fowned&mode=0640&owner=nobody", sbx);
    lbt_request(&D, "PUT", url, "", "mine\n", 5, "application/octet-stream", &r);
    ck_assert_msg(r.status == 204, "PUT owned: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    out = lbt_sh(&D, sbx, "stat -c '%u %g %a %s' /workspace/owned; ls -A /workspace");
    ck_assert_str_eq(out, "65534 65534 640 5\nowned\n");
    free(out);
    /* given back with the file */
    free(lbt_sh(&D, sbx, "rm /tmp/ok"));
    ck_assert_int_lt(sandbox_memory_usage(sbx), after - (long long)small / 2);
    /* a chunked body that fits is not refused for the room its reservation grows by */
    snprintf(url, sizeof(url), "/v1/sandboxes/%s/files?path=/tmp/chunked", sbx);
    lbt_request_ex(&D, "PUT", url, "", data, 40u << 20, "application/octet-stream", NULL, true, &r);
    ck_assert_msg(r.status == 204, "chunked PUT 40 MiB: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    out = lbt_sh(&D, sbx, "wc -c < /tmp/chunked; ls -A /tmp");
    ck_assert_str_eq(out, "41943040\nchunked\n");
    free(out);
    lbt_json(&D, "POST", "/v1/sessions/limits-mem/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    free(data);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("limits");
    TCase *mem = tcase_create("memory"), *conn = tcase_create("connections"),
          *sec = tcase_create("secrets"), *sec2 = tcase_create("secrets_files"),
          *low = tcase_create("low_fd_limit"), *trickle = tcase_create("trickle"),
          *sbxmem = tcase_create("sandbox_memory");

    lbt_fixture_add(mem, &(struct lbt_fixture){.d = &D, .args = MEMORY_ARGS, .seed = seed}, true);
    tcase_set_timeout(mem, 300);
    tcase_add_test(mem, test_upload_larger_than_budget_streams);
    tcase_add_test(mem, test_concurrent_uploads_bounded_rss);
    tcase_add_test(mem, test_output_floods_bounded_and_returned);
    tcase_add_test(mem, test_aborted_upload_leaves_no_temp_file);
    tcase_add_test(mem, test_over_limit_upload_leaves_no_temp_file);
    tcase_add_test(mem, test_inflight_budget_429);
    tcase_add_test(mem, test_refusal_waits_for_the_body);
    tcase_add_test(mem, test_anonymous_refusals_answered_at_once);
    suite_add_tcase(s, mem);
    lbt_fixture_add(sbxmem, &(struct lbt_fixture){.d = &D, .args = MEMORY_ARGS, .seed = seed},
                    true);
    tcase_set_timeout(sbxmem, 180);
    tcase_add_test(sbxmem, test_memory_mount_uploads_charged_to_sandbox);
    suite_add_tcase(s, sbxmem);

    lbt_fixture_add(conn, &(struct lbt_fixture){.d = &D, .args = CONNECTION_ARGS, .seed = seed},
                    true);
    tcase_set_timeout(conn, 180);
    tcase_add_test(conn, test_idle_flood_healthz_and_exec_answer);
    tcase_add_test(conn, test_per_client_limit);
    tcase_add_test(conn, test_seed_and_exec_above_fd_1024);
    suite_add_tcase(s, conn);

    lbt_shared_daemon(trickle, &D, TRICKLE_ARGS);
    tcase_set_timeout(trickle, 60);
    tcase_add_test(trickle, test_trickle);
    suite_add_tcase(s, trickle);

    lbt_test_daemon_cleanup(low, &LOW);
    tcase_set_timeout(low, 180);
    tcase_add_test(low, test_low_fd_limit_flood);
    suite_add_tcase(s, low);

    tcase_add_checked_fixture(sec, setup_secrets, teardown_secrets);
    tcase_add_test(sec, test_refuses_readable_token_file);
    tcase_add_test(sec, test_refuses_open_state_dir);
    suite_add_tcase(s, sec);

    lbt_test_daemon_cleanup(sec2, &D);
    tcase_set_timeout(sec2, 120);
    tcase_add_test(sec2, test_token_not_readable_through_files);
    suite_add_tcase(s, sec2);
    return lbt_run_suite(s);
}
