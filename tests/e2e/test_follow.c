/*
 * test_follow.c - following an activation's output log:
 * GET /v1/sessions/{rsid}/activation with "Accept: application/x-ndjson" against the real
 * daemon and a real bubblewrap sandbox, read line by line as the bytes arrive.
 *
 * Proves: a line the harness printed arrives while the harness still runs (it waits for a file
 * the test writes only after seeing that line: event-driven, no timing); the chunks
 * concatenate to the log GET ?log=1 returns; the stream ends with the activation object
 * (return code); followers hold no worker (on a 2-worker daemon, 4 follows of a running
 * harness and an exec on another sandbox all complete); errors before the stream keep their
 * plain JSON status (404 without an activation); a follow of a log the agent made sparse
 * (truncate -s 1T) that its client never reads keeps the daemon's RSS bounded, while another
 * tenant's follow and an exec are served, and a reading follow of it gets the data past the
 * hole, not a terabyte of NULs. Unread answers: 16 GETs of an activation with 64 MB of
 * artifacts (85 MB as JSON) that nobody reads keep the daemon within its answer budget (one
 * answer per token in flight, the rest 429 overloaded with Retry-After), while an exec and a
 * small activation's GET are served.
 */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

#define N_FOLLOWS 4

static struct lbt_daemon D;

static const char *const ARGS[] = {"--set", "server.workers=2", NULL};

/* One follow, run on its own thread. */
struct follow {
    pthread_t thread;
    char rsid[64];
    pthread_mutex_t lock;
    json_t *lines[256];
    int n;
    char partial[1 << 16];
    size_t plen;
    long status;
    char content_type[128];
    CURLcode rc;
};

static size_t follow_write(char *p, size_t sz, size_t nmemb, void *ud)
{
    struct follow *f = ud;
    size_t k = sz * nmemb;
    char *nl;

    if (f->plen + k >= sizeof(f->partial))
        return 0;
    memcpy(f->partial + f->plen, p, k);
    f->plen += k;
    while ((nl = memchr(f->partial, '\n', f->plen))) {
        size_t len = (size_t)(nl - f->partial);
        json_t *l = json_loadb(f->partial, len, 0, NULL);

        pthread_mutex_lock(&f->lock);
        if (f->n < 256)
            f->lines[f->n++] = l ? l : json_string("<not JSON>");
        pthread_mutex_unlock(&f->lock);
        memmove(f->partial, nl + 1, f->plen - len - 1);
        f->plen -= len + 1;
    }
    return k;
}

static void *follow_main(void *arg)
{
    struct follow *f = arg;
    CURL *c = curl_easy_init();
    struct curl_slist *h = NULL;
    char url[512], auth[300], *ct = NULL;

    snprintf(url, sizeof(url), "%s/v1/sessions/%s/activation", D.base_url, f->rsid);
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", D.admin_token);
    h = curl_slist_append(h, auth);
    h = curl_slist_append(h, "Accept: application/x-ndjson");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, follow_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 300L);
    f->rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &f->status);
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
    snprintf(f->content_type, sizeof(f->content_type), "%s", ct ? ct : "");
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    return NULL;
}

static struct follow *follow_start(const char *rsid)
{
    struct follow *f = calloc(1, sizeof(*f));

    ck_assert_ptr_nonnull(f);
    snprintf(f->rsid, sizeof(f->rsid), "%s", rsid);
    pthread_mutex_init(&f->lock, NULL);
    ck_assert_int_eq(pthread_create(&f->thread, NULL, follow_main, f), 0);
    return f;
}

/* The concatenated "data" of the chunk lines so far (malloc'd); *final: the last line is not a
 * chunk (the activation object or an error). */
static char *follow_text(struct follow *f, bool *final)
{
    char *all = calloc(1, 1);
    size_t n = 0;

    pthread_mutex_lock(&f->lock);
    *final = false;
    for (int i = 0; i < f->n; i++) {
        const char *s = json_string_value(json_object_get(f->lines[i], "stream"));
        const char *d = json_string_value(json_object_get(f->lines[i], "data"));

        if (!s) {
            *final = true;
            continue;
        }
        ck_assert_str_eq(s, "log");
        ck_assert_ptr_nonnull(d);
        all = realloc(all, n + strlen(d) + 1);
        memcpy(all + n, d, strlen(d) + 1);
        n += strlen(d);
    }
    pthread_mutex_unlock(&f->lock);
    return all;
}

static void follow_join(struct follow *f)
{
    pthread_join(f->thread, NULL);
}

static void follow_free(struct follow *f)
{
    for (int i = 0; i < f->n; i++)
        json_decref(f->lines[i]);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

START_TEST(test_follow_streams_while_running)
{
    struct follow *fs[N_FOLLOWS];
    char sbx[128], other[128], path[300];
    struct lbt_resp r;
    json_t *lease, *res;
    double until;
    bool final;
    char *text;

    lease = lbt_seed(&D, "follow-1", "task-follow", NULL);
    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    lease = lbt_seed(&D, "follow-2", "task-follow", NULL);
    snprintf(other, sizeof(other), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);

    lbt_json(&D, "POST", "/v1/sessions/follow-1/execute", "",
             "{\"wait\": false, \"argv\": [\"sh\", \"-c\", \"echo first-line; while [ ! -e "
             "/tmp/go ]; do sleep 0.1; done; echo second-line; exit 4\"]}",
             &r);
    ck_assert_msg(r.status == 202, "execute: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    for (int i = 0; i < N_FOLLOWS; i++)
        fs[i] = follow_start("follow-1");

    /* every follower sees the first line while the harness still waits */
    for (int i = 0; i < N_FOLLOWS; i++) {
        until = lbt_now() + 120;
        for (;;) {
            text = follow_text(fs[i], &final);
            if (strstr(text, "first-line\n") || lbt_now() > until)
                break;
            free(text);
            lbt_sleep_ms(50);
        }
        ck_assert_msg(strstr(text, "first-line\n"), "follower %d: no first line (%s)", i, text);
        ck_assert(!final);
        ck_assert(!strstr(text, "second-line"));
        free(text);
    }
    /* 4 follows of a 2-worker daemon hold no worker: an exec elsewhere completes */
    res = lbt_exec_ok(&D, other, "", "{\"command\": \"echo ok\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "ok\n");
    json_decref(res);

    /* let the harness finish */
    res = lbt_exec_ok(&D, sbx, "", "{\"command\": \"touch /tmp/go\"}");
    json_decref(res);
    lbt_json(&D, "GET", "/v1/sessions/follow-1/activation?wait_ms=60000&log=1", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    for (int i = 0; i < N_FOLLOWS; i++) {
        json_t *last;

        follow_join(fs[i]);
        ck_assert_int_eq(fs[i]->rc, CURLE_OK);
        ck_assert_int_eq(fs[i]->status, 200);
        ck_assert_str_eq(fs[i]->content_type, "application/x-ndjson");
        text = follow_text(fs[i], &final);
        ck_assert(final);
        /* the chunks are the log */
        ck_assert_str_eq(text, json_string_value(json_object_get(r.json, "log")));
        ck_assert_ptr_nonnull(strstr(text, "first-line\nsecond-line\n"));
        free(text);
        last = fs[i]->lines[fs[i]->n - 1];
        ck_assert_str_eq(json_string_value(json_object_get(last, "activation_id")),
                         json_string_value(json_object_get(r.json, "activation_id")));
        ck_assert_int_eq(json_integer_value(json_object_get(last, "return_code")), 4);
        follow_free(fs[i]);
    }
    lbt_resp_free(&r);

    /* no activation: a plain 404, not a stream */
    {
        struct follow *f = follow_start("follow-2");

        follow_join(f);
        ck_assert_int_eq(f->status, 404);
        ck_assert(strncmp(f->content_type, "application/json", 16) == 0);
        follow_free(f);
    }
    snprintf(path, sizeof(path), "/v1/sessions/follow-1/release");
    lbt_json(&D, "POST", path, "", "{}", &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
}
END_TEST

/* Send a GET of the session's activation on a raw socket with a small receive buffer, and
 * leave the answer unread; follow: as a follow (Accept: application/x-ndjson). */
static int get_unread(struct lbt_daemon *d, const char *rsid, const char *token, bool follow)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    const char *port = strrchr(d->base_url, ':');
    char req[1024];
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), rcv = 4096;

    ck_assert_int_ge(fd, 0);
    ck_assert_ptr_nonnull(port);
    ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv)), 0);
    a.sin_port = htons((uint16_t)atoi(port + 1));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    snprintf(req, sizeof(req),
             "GET /v1/sessions/%s/activation HTTP/1.1\r\nHost: x\r\n"
             "Authorization: Bearer %s\r\n%s\r\n",
             rsid, token, follow ? "Accept: application/x-ndjson\r\n" : "");
    ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    return fd;
}

START_TEST(test_follow_sparse_log_bounded)
{
    char sbx[128], other[128], dir[300], cmd[600];
    struct follow *reader, *tenant;
    struct lbt_resp r;
    json_t *lease, *res;
    long base_kb, max_kb = 0, kb, bound_kb = 48 * 1024;
    int unread;
    double until;
    bool final;
    char *text;

    lease = lbt_seed(&D, "sparse-1", "task-follow", NULL);
    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    lease = lbt_seed(&D, "sparse-2", "task-follow", NULL);
    snprintf(other, sizeof(other), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);

    /* the agent's harness makes its own log a 1 TiB sparse file, then writes past the hole */
    lbt_json(&D, "POST", "/v1/sessions/sparse-1/execute", "",
             "{\"wait\": false, \"argv\": [\"sh\", \"-c\", \"while [ ! -e /tmp/big ]; do sleep "
             "0.05; done; echo after-hole; while [ ! -e /tmp/go ]; do sleep 0.1; done\"]}",
             &r);
    ck_assert_msg(r.status == 202, "execute: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/sessions/sparse-1/activation", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    snprintf(dir, sizeof(dir), "%s",
             json_string_value(json_object_get(r.json, "stop_request_path")));
    lbt_resp_free(&r);
    *strrchr(dir, '/') = '\0';
    snprintf(cmd, sizeof(cmd), "{\"command\": \"truncate -s 1T %s/output.log && touch /tmp/big\"}",
             dir);
    res = lbt_exec_ok(&D, sbx, "", cmd);
    json_decref(res);

    /* another tenant's activation, followed by a client that reads */
    lbt_json(&D, "POST", "/v1/sessions/sparse-2/execute", "",
             "{\"wait\": false, \"argv\": [\"sh\", \"-c\", \"echo tenant-line; while [ ! -e "
             "/tmp/go ]; do sleep 0.1; done\"]}",
             &r);
    ck_assert_msg(r.status == 202, "execute: %ld %s", r.status, r.body);
    lbt_resp_free(&r);

    base_kb = lbt_proc_status_kb(D.pid, "VmRSS");
    unread = get_unread(&D, "sparse-1", D.admin_token, true);
    reader = follow_start("sparse-1");
    tenant = follow_start("sparse-2");

    /* the other tenant is served, and so is an exec, while the unread follow stays open */
    until = lbt_now() + 30;
    for (;;) {
        text = follow_text(tenant, &final);
        if (strstr(text, "tenant-line\n") || lbt_now() > until)
            break;
        free(text);
        lbt_sleep_ms(50);
    }
    ck_assert_msg(strstr(text, "tenant-line\n"), "the other tenant's follow got nothing: %s", text);
    free(text);
    res = lbt_exec_ok(&D, other, "", "{\"command\": \"echo ok\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "ok\n");
    json_decref(res);
    /* the reading follow of the sparse log gets what was written past the hole */
    until = lbt_now() + 30;
    for (;;) {
        text = follow_text(reader, &final);
        if (strstr(text, "after-hole\n") || lbt_now() > until)
            break;
        free(text);
        lbt_sleep_ms(50);
    }
    ck_assert_msg(strstr(text, "after-hole\n"), "no data past the hole (%zu bytes)", strlen(text));
    free(text);

    /* the daemon's memory stays bounded while the unread follow is open (3 s) */
    until = lbt_now() + 3;
    while (lbt_now() < until) {
        kb = lbt_proc_status_kb(D.pid, "VmRSS");
        if (kb > max_kb)
            max_kb = kb;
        if (kb - base_kb > bound_kb)
            break; /* failed: stop before it eats the machine */
        lbt_sleep_ms(100);
    }
    fprintf(stderr, "test_follow: daemon VmRSS %ld kB before, at most %ld kB with the follow\n",
            base_kb, max_kb);
#ifndef LBT_SANITIZED
    ck_assert_msg(max_kb - base_kb <= bound_kb, "daemon VmRSS grew %ld kB (bound %ld kB)",
                  max_kb - base_kb, bound_kb);
#endif
    res = lbt_exec_ok(&D, other, "", "{\"command\": \"echo again\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "again\n");
    json_decref(res);

    close(unread);
    res = lbt_exec_ok(&D, sbx, "", "{\"command\": \"touch /tmp/go\"}");
    json_decref(res);
    res = lbt_exec_ok(&D, other, "", "{\"command\": \"touch /tmp/go\"}");
    json_decref(res);
    follow_join(reader);
    follow_join(tenant);
    ck_assert_int_eq(tenant->status, 200);
    text = follow_text(tenant, &final);
    ck_assert(final);
    free(text);
    follow_free(reader);
    follow_free(tenant);
    lbt_json(&D, "POST", "/v1/sessions/sparse-1/release", "", "{}", &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/sparse-2/release", "", "{}", &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
}
END_TEST

#define N_UNREAD 16
#define ART_FILE_BYTES 16000000 /* 4 of them: 64 MB of artifacts, 85 MB as base64 */

static struct lbt_daemon A; /* default workers: rendering is bounded by the budget alone */

START_TEST(test_unread_answers_bounded)
{
    char big_tok[300], sbx[128], small_sbx[128], head[4096];
    int fds[N_UNREAD], ok = 0, busy = 0;
    /* the answer budget (256 MiB) and room for the allocator, times a sanitizer's shadow */
    long base_kb, max_kb = 0, kb, bound_kb = LBT_RSS_FACTOR * (256 + 48) * 1024;
    struct lbt_resp r;
    json_t *lease, *res;
    double until;

    lease = lbt_seed(&A, "answers-big", "task-answers", NULL);
    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    snprintf(big_tok, sizeof(big_tok), "%s",
             json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
    lease = lbt_seed(&A, "answers-small", "task-answers", NULL);
    snprintf(small_sbx, sizeof(small_sbx), "%s",
             json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    {
        char body[1024];

        snprintf(body, sizeof(body),
                 "{\"argv\": [\"sh\", \"-c\", \"for i in 1 2 3 4; do head -c %d /dev/urandom > "
                 "/workspace/a$i; done\"], \"collect\": [\"/workspace/a1\", \"/workspace/a2\", "
                 "\"/workspace/a3\", \"/workspace/a4\"]}",
                 ART_FILE_BYTES);
        lbt_json(&A, "POST", "/v1/sessions/answers-big/execute", "", body, &r);
        ck_assert_msg(r.status == 200, "execute: %ld", r.status);
        ck_assert_str_eq(
            json_string_value(json_object_get(
                json_object_get(json_object_get(r.json, "artifacts"), "/workspace/a4"), "base64"))
                ? "set"
                : "missing",
            "set");
        lbt_resp_free(&r);
    }
    lbt_json(&A, "POST", "/v1/sessions/answers-small/execute", "",
             "{\"argv\": [\"sh\", \"-c\", \"echo small > /workspace/s\"], \"collect\": "
             "[\"/workspace/s\"]}",
             &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);

    base_kb = lbt_proc_status_kb(A.pid, "VmRSS");
    /* 16 GETs of the 85 MB answer, half with the admin token, half with the sandbox's own */
    for (int i = 0; i < N_UNREAD; i++)
        fds[i] = get_unread(&A, "answers-big", i % 2 ? big_tok : A.admin_token, false);
    /* every one is answered (headers at least) while nobody reads; meanwhile other requests
     * are served and the daemon's memory stays within the answer budget */
    until = lbt_now() + 120;
    for (int i = 0; i < N_UNREAD; i++) {
        struct pollfd pf = {.fd = fds[i], .events = POLLIN};

        while (poll(&pf, 1, 100) == 0 && lbt_now() < until) {
            kb = lbt_proc_status_kb(A.pid, "VmRSS");
            max_kb = kb > max_kb ? kb : max_kb;
            ck_assert_msg(kb - base_kb <= bound_kb, "daemon VmRSS grew %ld kB (bound %ld kB)",
                          kb - base_kb, bound_kb);
        }
        ck_assert_msg(pf.revents & POLLIN, "unread GET %d got no answer", i);
    }
    res = lbt_exec_ok(&A, small_sbx, "", "{\"command\": \"echo ok\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "ok\n");
    json_decref(res);
    lbt_json(&A, "GET", "/v1/sessions/answers-small/activation", "", NULL, &r);
    ck_assert_msg(r.status == 200, "small activation: %ld %s", r.status, r.body);
    ck_assert_ptr_nonnull(json_object_get(json_object_get(r.json, "artifacts"), "/workspace/s"));
    lbt_resp_free(&r);
    for (int i = 0; i < 10; i++) {
        kb = lbt_proc_status_kb(A.pid, "VmRSS");
        max_kb = kb > max_kb ? kb : max_kb;
        lbt_sleep_ms(100);
    }
    fprintf(stderr, "test_follow: daemon VmRSS %ld kB before, at most %ld kB with %d unread\n",
            base_kb, max_kb, N_UNREAD);
    ck_assert_msg(max_kb - base_kb <= bound_kb, "daemon VmRSS grew %ld kB (bound %ld kB)",
                  max_kb - base_kb, bound_kb);
    /* at most one answer per token is in flight; the rest were 429 overloaded, Retry-After */
    for (int i = 0; i < N_UNREAD; i++) {
        ssize_t n = read(fds[i], head, sizeof(head) - 1);

        ck_assert_int_gt(n, 12);
        head[n] = '\0';
        if (!strncmp(head, "HTTP/1.1 200", 12)) {
            ok++;
        } else {
            ck_assert_msg(!strncmp(head, "HTTP/1.1 429", 12), "unread GET %d: %.40s", i, head);
            ck_assert_ptr_nonnull(strcasestr(head, "\r\nRetry-After: 1\r\n"));
            ck_assert_ptr_nonnull(strstr(head, "\"overloaded\""));
            busy++;
        }
        close(fds[i]);
    }
    fprintf(stderr, "test_follow: %d answered, %d overloaded\n", ok, busy);
    ck_assert_int_ge(ok, 1);
    ck_assert_int_le(ok, 2);
    ck_assert_int_eq(ok + busy, N_UNREAD);
    /* once they are gone, the answer can be had again: the daemon notices the closed
     * connections on its own time, so a 429 meanwhile is retried as its Retry-After says */
    for (int t = 0;; t++) {
        lbt_json(&A, "GET", "/v1/sessions/answers-big/activation", "", NULL, &r);
        if (r.status != 429 || t == 30)
            break;
        lbt_assert_error(&r, 429, "overloaded");
        lbt_resp_free(&r);
        lbt_sleep_ms(1000);
    }
    ck_assert_msg(r.status == 200, "answer after the unread GETs left: %ld %s", r.status, r.body);
    ck_assert(json_is_true(json_object_get(r.json, "artifacts_collected")));
    lbt_resp_free(&r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("follow");
    TCase *tc = tcase_create("follow");

    lbt_fixture_add(tc, &(struct lbt_fixture){.d = &D, .args = ARGS, .stop_clean = true}, true);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_follow_streams_while_running);
    tcase_add_test(tc, test_follow_sparse_log_bounded);
    suite_add_tcase(s, tc);
    tc = tcase_create("answers");
    lbt_fixture_add(tc, &(struct lbt_fixture){.d = &A, .stop_clean = true}, true);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_unread_answers_bounded);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
