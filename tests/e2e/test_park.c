/*
 * test_park.c - the HTTP layer's park/wake, over real HTTP on loopback.
 *
 * The server is lendbox's own src/http (libmicrohttpd, the real worker pool) started in this
 * process on port 0 with a small route table of its own: GET /park?ms=N parks the request
 * until a wake (from this test's thread), its deadline, its client's hang-up or shutdown;
 * GET /work is an ordinary deferred job on the pool. Nothing is mocked; the routes are the
 * test's because no daemon route parks yet (the activation long-poll is another branch's).
 * Proves: parked requests hold no worker (POOL_WORKERS + 50 parked, a job still completes),
 * a wake from another thread answers, a deadline answers, a client that hangs up is dropped,
 * and shutdown with parked requests answers every one of them and frees everything (make asan).
 */
#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "http/http.h"
#include "pool/pool.h"
#include "util/clock.h"

#define POOL_WORKERS 2
#define N_PARKED (POOL_WORKERS + 50)

struct server {
    struct lb_http *http;
    struct lb_pool *pool;
    char url[160];
    pthread_mutex_t lock;
    struct lb_park *parks[256]; /* the waker's references */
    size_t n_parks;
    int answered[4]; /* by enum lb_park_end */
    int polls, poll_frees;
};

static struct server S;

static const char *why_name(enum lb_park_end why)
{
    switch (why) {
    case LB_PARK_WOKEN:
        return "woken";
    case LB_PARK_DEADLINE:
        return "deadline";
    case LB_PARK_GONE:
        return "gone";
    case LB_PARK_SHUTDOWN:
        return "shutdown";
    }
    return "?";
}

static void park_answer(struct lb_request *req, void *arg, enum lb_park_end why)
{
    struct server *s = arg;

    pthread_mutex_lock(&s->lock);
    s->answered[why]++;
    pthread_mutex_unlock(&s->lock);
    http_respond_json(req, why == LB_PARK_SHUTDOWN ? 503 : 200,
                      json_pack("{s:s}", "why", why_name(why)));
}

static void after_park_job(struct lb_request *req, void *arg)
{
    http_respond_json(req, 200, json_pack("{s:s,s:b}", "why", (const char *)arg, "worked", 1));
}

/* GET /park?then=work: once the wait is over, the rest runs on a worker. */
static void park_answer_then_work(struct lb_request *req, void *arg, enum lb_park_end why)
{
    struct lb_error err = {0};

    park_answer(req, arg, why);
    if (http_defer(req, after_park_job, (void *)why_name(why), NULL, &err) < 0)
        http_respond_error(req, &err);
}

static int route_park(struct lb_request *req, struct lb_error *err)
{
    const char *ms = http_query(req, "ms");
    struct lb_park *park = NULL;
    int r;

    pthread_mutex_lock(&S.lock);
    r = http_park(req, clock_mono_ms() + (ms ? atol(ms) : 30000),
                  http_query(req, "then") ? park_answer_then_work : park_answer, &S, NULL, &park,
                  err);
    if (r == 0 && S.n_parks < sizeof(S.parks) / sizeof(S.parks[0]))
        S.parks[S.n_parks++] = park;
    else if (r == 0)
        http_park_release(park);
    pthread_mutex_unlock(&S.lock);
    return r;
}

static void work_job(struct lb_request *req, void *arg)
{
    (void)arg;
    http_respond_json(req, 200, json_pack("{s:b}", "worked", 1));
}

static int route_work(struct lb_request *req, struct lb_error *err)
{
    return http_defer(req, work_job, NULL, NULL, err);
}

/* GET /jobpoll?ready_ms=R&ms=D: a job finds it must wait and parks with a polled condition
 * (true R ms after the job ran), deadline D ms. */
struct poll_cond {
    int64_t ready_at;
};

static bool poll_ready(void *arg)
{
    struct poll_cond *c = arg;

    pthread_mutex_lock(&S.lock);
    S.polls++;
    pthread_mutex_unlock(&S.lock);
    return clock_mono_ms() >= c->ready_at;
}

static void poll_free(void *arg)
{
    S.poll_frees++; /* under http's lock; only this test's count */
    free(arg);
}

struct jobpoll {
    int64_t ready_ms, ms;
};

static void jobpoll_job(struct lb_request *req, void *arg)
{
    struct jobpoll *j = arg;
    struct poll_cond *c = malloc(sizeof(*c));
    struct lb_park_poll poll = {poll_ready, c, poll_free, 10, 100};
    struct lb_error err = {0};

    if (!c) {
        lb_error_set(&err, -ENOMEM, "out of memory");
        http_respond_error(req, &err);
        return;
    }
    c->ready_at = clock_mono_ms() + j->ready_ms;
    if (http_park_poll(req, clock_mono_ms() + j->ms, &poll, park_answer, &S, NULL, &err) < 0)
        http_respond_error(req, &err);
    /* parked: req is not ours any more */
}

static int route_jobpoll(struct lb_request *req, struct lb_error *err)
{
    struct jobpoll *j = calloc(1, sizeof(*j));

    if (!j)
        return lb_error_set(err, -ENOMEM, "out of memory");
    j->ready_ms = http_query(req, "ready_ms") ? atol(http_query(req, "ready_ms")) : 0;
    j->ms = http_query(req, "ms") ? atol(http_query(req, "ms")) : 30000;
    return http_defer(req, jobpoll_job, j, free, err);
}

static const struct lb_route ROUTES[] = {
    {"GET", "/jobpoll", LB_AUTH_NONE, false, route_jobpoll, "jobpoll", false},
    {"GET", "/park", LB_AUTH_NONE, false, route_park, "park", false},
    {"GET", "/work", LB_AUTH_NONE, false, route_work, "work", false},
    {NULL, NULL, LB_AUTH_NONE, false, NULL, NULL, false},
};

static int no_authorize(void *app, const char *token, enum lb_auth_need need,
                        const char *sandbox_id, enum lb_principal *who, struct lb_error *err)
{
    (void)app, (void)token, (void)need, (void)sandbox_id, (void)err;
    *who = LB_PRINCIPAL_ADMIN;
    return 0;
}

static void server_start(void)
{
    struct lb_http_config cfg = {0};
    struct lb_error err = {0};
    char bound[128];
    int fd = -1;

    memset(&S, 0, sizeof(S));
    pthread_mutex_init(&S.lock, NULL);
    ck_assert_int_eq(pool_new(POOL_WORKERS, 64, &S.pool), 0);
    ck_assert_int_eq(http_bind("127.0.0.1:0", &fd, bound, sizeof(bound), &err), 0);
    cfg.listen_fd = fd;
    cfg.threads = 2;
    cfg.connection_timeout_s = 60;
    cfg.header_timeout_s = 60;
    cfg.max_connections = 1000;
    cfg.per_ip_connections = 0;
    cfg.max_body_bytes = 4096;
    cfg.max_file_bytes = 4096;
    cfg.max_json_depth = 8;
    cfg.routes = ROUTES;
    cfg.authorize = no_authorize;
    cfg.pool = S.pool;
    ck_assert_msg(http_start(&cfg, &S.http, &err) == 0, "http_start: %s", err.message);
    snprintf(S.url, sizeof(S.url), "http://%s", http_bound_address(S.http));
}

/* Stop as lendboxd does: the pool first (deferred jobs finish), then http (parks end). */
static void server_stop(void)
{
    pool_stop(S.pool);
    http_stop(S.http);
    pool_destroy(S.pool);
    for (size_t i = 0; i < S.n_parks; i++)
        http_park_release(S.parks[i]);
    S.n_parks = 0;
    pthread_mutex_destroy(&S.lock);
}

static void wait_parked(size_t n)
{
    double until = lbt_now() + 20;

    while (http_parked_count(S.http) != n && lbt_now() < until)
        lbt_sleep_ms(20);
    ck_assert_uint_eq(http_parked_count(S.http), n);
}

/* One GET on its own thread. */
struct get {
    pthread_t thread;
    char url[256];
    long timeout_ms; /* 0: none */
    long status;
    char body[256];
    size_t len;
    CURLcode rc;
};

static size_t get_write(char *p, size_t sz, size_t n, void *ud)
{
    struct get *g = ud;
    size_t k = sz * n;

    if (g->len + k < sizeof(g->body)) {
        memcpy(g->body + g->len, p, k);
        g->len += k;
    }
    return k;
}

static void *get_main(void *arg)
{
    struct get *g = arg;
    CURL *c = curl_easy_init();

    curl_easy_setopt(c, CURLOPT_URL, g->url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, get_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, g);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (g->timeout_ms)
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, g->timeout_ms);
    g->rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &g->status);
    curl_easy_cleanup(c);
    return NULL;
}

static struct get *get_start(const char *path, long timeout_ms)
{
    struct get *g = calloc(1, sizeof(*g));

    ck_assert_ptr_nonnull(g);
    snprintf(g->url, sizeof(g->url), "%s%s", S.url, path);
    g->timeout_ms = timeout_ms;
    ck_assert_int_eq(pthread_create(&g->thread, NULL, get_main, g), 0);
    return g;
}

static void get_join(struct get *g)
{
    pthread_join(g->thread, NULL);
}

static void assert_why(struct get *g, long status, const char *why)
{
    char want[64];

    ck_assert_int_eq(g->rc, CURLE_OK);
    ck_assert_int_eq(g->status, status);
    snprintf(want, sizeof(want), "{\"why\":\"%s\"}", why);
    ck_assert_str_eq(g->body, want);
}

START_TEST(test_parked_hold_no_worker)
{
    struct get *g[N_PARKED], *work;

    server_start();
    for (int i = 0; i < N_PARKED; i++)
        g[i] = get_start("/park", 0);
    wait_parked(N_PARKED);
    /* every worker would be taken many times over if parking held one */
    work = get_start("/work", 20000);
    get_join(work);
    ck_assert_int_eq(work->rc, CURLE_OK);
    ck_assert_int_eq(work->status, 200);
    ck_assert_str_eq(work->body, "{\"worked\":true}");
    free(work);
    ck_assert_uint_eq(http_parked_count(S.http), N_PARKED);
    /* wake every one from this (non-MHD, non-pool) thread; a second wake is a no-op */
    pthread_mutex_lock(&S.lock);
    for (size_t i = 0; i < S.n_parks; i++)
        ck_assert(http_wake(S.parks[i]));
    for (size_t i = 0; i < S.n_parks; i++)
        ck_assert(!http_wake(S.parks[i]));
    pthread_mutex_unlock(&S.lock);
    for (int i = 0; i < N_PARKED; i++) {
        get_join(g[i]);
        assert_why(g[i], 200, "woken");
        free(g[i]);
    }
    ck_assert_uint_eq(http_parked_count(S.http), 0);
    ck_assert_int_eq(S.answered[LB_PARK_WOKEN], N_PARKED);
    server_stop();
}
END_TEST

START_TEST(test_deadline_answers)
{
    double t0;
    struct get *g;

    server_start();
    t0 = lbt_now();
    g = get_start("/park?ms=400", 20000);
    get_join(g);
    assert_why(g, 200, "deadline");
    /* not before its deadline (the bound that matters; no upper speed bound) */
    ck_assert_msg(lbt_now() - t0 >= 0.39, "answered after %.3f s", lbt_now() - t0);
    ck_assert_uint_eq(http_parked_count(S.http), 0);
    /* a wake after the deadline ended it is a no-op on a still-valid handle */
    pthread_mutex_lock(&S.lock);
    ck_assert_uint_eq(S.n_parks, 1);
    ck_assert(!http_wake(S.parks[0]));
    pthread_mutex_unlock(&S.lock);
    free(g);
    server_stop();
}
END_TEST

START_TEST(test_answer_may_defer)
{
    struct get *g;

    server_start();
    g = get_start("/park?ms=100&then=work", 20000);
    get_join(g);
    ck_assert_int_eq(g->rc, CURLE_OK);
    ck_assert_int_eq(g->status, 200);
    ck_assert_str_eq(g->body, "{\"why\":\"deadline\",\"worked\":true}");
    free(g);
    server_stop();
}
END_TEST

/* A job that has to wait parks (its worker is free at once) with a polled condition. */
START_TEST(test_job_parks_polled)
{
    struct get *g[N_PARKED], *work, *late;

    server_start();
    for (int i = 0; i < N_PARKED; i++)
        g[i] = get_start("/jobpoll?ready_ms=1500", 0);
    late = get_start("/jobpoll?ready_ms=60000&ms=300", 20000); /* the deadline comes first */
    wait_parked(N_PARKED + 1);
    work = get_start("/work", 20000);
    get_join(work);
    ck_assert_int_eq(work->status, 200);
    ck_assert_str_eq(work->body, "{\"worked\":true}");
    free(work);
    for (int i = 0; i < N_PARKED; i++) {
        get_join(g[i]);
        assert_why(g[i], 200, "woken");
        free(g[i]);
    }
    get_join(late);
    assert_why(late, 200, "deadline");
    free(late);
    wait_parked(0);
    pthread_mutex_lock(&S.lock);
    ck_assert_int_ge(S.polls, N_PARKED + 1);
    ck_assert_int_eq(S.answered[LB_PARK_WOKEN], N_PARKED);
    ck_assert_int_eq(S.answered[LB_PARK_DEADLINE], 1);
    pthread_mutex_unlock(&S.lock);
    server_stop();
    ck_assert_int_eq(S.poll_frees, N_PARKED + 1); /* every condition freed with its handle */
}
END_TEST

START_TEST(test_client_gone_unparks)
{
    struct get *g;
    double until;

    server_start();
    g = get_start("/park?ms=60000", 300); /* the client gives up after 300 ms */
    get_join(g);
    ck_assert_int_eq(g->rc, CURLE_OPERATION_TIMEDOUT);
    until = lbt_now() + 10;
    while (http_parked_count(S.http) > 0 && lbt_now() < until)
        lbt_sleep_ms(50);
    ck_assert_uint_eq(http_parked_count(S.http), 0);
    pthread_mutex_lock(&S.lock);
    ck_assert_int_eq(S.answered[LB_PARK_GONE], 1);
    pthread_mutex_unlock(&S.lock);
    free(g);
    server_stop();
}
END_TEST

START_TEST(test_shutdown_ends_parked)
{
    struct get *g[20];

    server_start();
    for (int i = 0; i < 20; i++)
        g[i] = get_start("/park?ms=60000", 20000);
    wait_parked(20);
    server_stop(); /* must answer all 20 and stop libmicrohttpd cleanly */
    for (int i = 0; i < 20; i++) {
        get_join(g[i]);
        assert_why(g[i], 503, "shutdown");
        free(g[i]);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("park");
    TCase *tc = tcase_create("park");
    int r;

    curl_global_init(CURL_GLOBAL_ALL);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_parked_hold_no_worker);
    tcase_add_test(tc, test_deadline_answers);
    tcase_add_test(tc, test_answer_may_defer);
    tcase_add_test(tc, test_job_parks_polled);
    tcase_add_test(tc, test_client_gone_unparks);
    tcase_add_test(tc, test_shutdown_ends_parked);
    suite_add_tcase(s, tc);
    r = lbt_run_suite(s);
    curl_global_cleanup();
    return r;
}
