/*
 * test_events.c - the durable event feed, GET /v1/events, against the real daemon and real
 * sandboxes: the events of one sandbox's life in order (seeded, renewed, paused, resumed,
 * stopped with its reason, usage, session, task and labels), the filters, bad parameters
 * (400) and who may read (401, 403), a long-poll woken by a seed from another thread, an
 * application/x-ndjson stream, the retention by count, durability across kill -9 (the events
 * stay and seq goes on upward), and a stress of many episodes at concurrency 16 in which every
 * seeded sandbox has exactly one "seeded" and one "stopped" event.
 *
 * Nothing asserts on speed: waits are polls with generous bounds. LBT_EVENTS_EPISODES sets
 * the stress's episode count (default 1000).
 */
#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static struct lbt_daemon D;

static const char *str(json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));

    return s ? s : "";
}

/* GET path as token: the answer's JSON (asserts 200; caller decrefs). */
static json_t *get_ok(struct lbt_daemon *d, const char *path)
{
    struct lbt_resp r;
    json_t *j;

    lbt_json(d, "GET", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "GET %s: %ld %s", path, r.status, r.body);
    j = json_incref(r.json);
    lbt_resp_free(&r);
    return j;
}

/* Every event after since matching query (e.g. "&rsid=x"), paged: a new array. Asserts seq
 * strictly increasing and "next" the last seq of each page. */
static json_t *events_after(struct lbt_daemon *d, long long since, const char *query)
{
    json_t *all = json_array();
    char path[512];

    for (;;) {
        json_t *page, *evs, *ev;
        size_t i;

        snprintf(path, sizeof(path), "/v1/events?since=%lld&limit=10000%s", since,
                 query ? query : "");
        page = get_ok(d, path);
        evs = json_object_get(page, "events");
        ck_assert_ptr_nonnull(evs);
        if (json_array_size(evs) == 0) {
            ck_assert_int_eq(json_integer_value(json_object_get(page, "next")), since);
            json_decref(page);
            return all;
        }
        json_array_foreach(evs, i, ev) {
            long long seq = json_integer_value(json_object_get(ev, "seq"));

            ck_assert_msg(seq > since, "seq %lld after %lld", seq, since);
            since = seq;
            json_array_append(all, ev);
        }
        ck_assert_int_eq(json_integer_value(json_object_get(page, "next")), since);
        json_decref(page);
    }
}

/* The seq of the newest event (0: none). */
static long long head_seq(struct lbt_daemon *d)
{
    json_t *all = events_after(d, 0, NULL);
    size_t n = json_array_size(all);
    long long seq = n ? json_integer_value(json_object_get(json_array_get(all, n - 1), "seq")) : 0;

    json_decref(all);
    return seq;
}

/* The types of evs joined with ',' into buf. */
static const char *types_of(json_t *evs, char *buf, size_t cap)
{
    json_t *ev;
    size_t i, len = 0;

    buf[0] = '\0';
    json_array_foreach(evs, i, ev)
        len += (size_t)snprintf(buf + len, len < cap ? cap - len : 0, "%s%s", i ? "," : "",
                                str(ev, "type"));
    return buf;
}

static void post_ok(struct lbt_daemon *d, const char *path, const char *body)
{
    struct lbt_resp r;

    lbt_json(d, "POST", path, "", body, &r);
    ck_assert_msg(r.status == 200, "POST %s: %ld %s", path, r.status, r.body);
    lbt_resp_free(&r);
}

/* ---------- one sandbox's life, filters ---------- */

START_TEST(test_events_life_in_order)
{
    long long head = head_seq(&D);
    json_t *lease = lbt_seed(&D, "ev-life", "task-life", "\"labels\": {\"team\": \"rl\"}");
    const char *id = str(lease, "sandbox_id");
    char path[256], types[256];
    json_t *evs, *ev, *usage;
    size_t i;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/renew", id);
    post_ok(&D, path, "{\"ttl_s\": 60}");
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pause", id);
    post_ok(&D, path, NULL);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/resume", id);
    post_ok(&D, path, NULL);
    lbt_release_session(&D, "ev-life");

    evs = events_after(&D, head, "&rsid=ev-life");
    ck_assert_str_eq(types_of(evs, types, sizeof(types)), "seeded,renewed,paused,resumed,stopped");
    json_array_foreach(evs, i, ev) {
        ck_assert_str_eq(str(ev, "sandbox_id"), id);
        ck_assert_str_eq(str(ev, "rsid"), "ev-life");
        ck_assert_str_eq(str(ev, "task_id"), "task-life");
        ck_assert_str_eq(str(json_object_get(ev, "labels"), "team"), "rl");
        ck_assert_msg(strlen(str(ev, "time")) == 20, "time %s", str(ev, "time"));
        ck_assert(json_is_object(json_object_get(ev, "data")));
    }
    ck_assert_msg(strlen(str(json_object_get(json_array_get(evs, 1), "data"), "expires_at")) == 20,
                  "renewed without expires_at");
    ev = json_array_get(evs, 4);
    ck_assert_str_eq(str(json_object_get(ev, "data"), "reason"), "released");
    usage = json_object_get(json_object_get(ev, "data"), "usage");
    ck_assert_msg(json_is_object(usage) || json_is_null(usage), "usage is neither");
    if (json_is_object(usage)) { /* the figures GET shows: every key, a number or null */
        static const char *const keys[] = {"cpu_s", "memory_bytes", "memory_peak_bytes",
                                           "pids",  "oom_kills",    "disk_bytes"};

        ck_assert_int_eq(json_object_size(usage), 6);
        for (i = 0; i < 6; i++) {
            json_t *v = json_object_get(usage, keys[i]);

            ck_assert_msg(v && (json_is_number(v) || json_is_null(v)), "usage.%s", keys[i]);
        }
        if (lbt_variant_is("host") || !strcmp(lbt_variant(), ""))
            ck_assert_msg(json_is_number(json_object_get(usage, "cpu_s")), "no cpu_s: %s",
                          json_dumps(usage, 0));
    }
    json_decref(evs);

    /* the filters: sandbox_id, types (a list), an rsid with nothing */
    snprintf(path, sizeof(path), "&sandbox_id=%s", id);
    evs = events_after(&D, head, path);
    ck_assert_str_eq(types_of(evs, types, sizeof(types)), "seeded,renewed,paused,resumed,stopped");
    json_decref(evs);
    snprintf(path, sizeof(path), "&sandbox_id=%s&types=stopped,seeded", id);
    evs = events_after(&D, head, path);
    ck_assert_str_eq(types_of(evs, types, sizeof(types)), "seeded,stopped");
    json_decref(evs);
    evs = events_after(&D, head, "&rsid=ev-nobody");
    ck_assert_int_eq(json_array_size(evs), 0);
    json_decref(evs);
    /* limit: one at a time, next names it */
    snprintf(path, sizeof(path), "/v1/events?since=%lld&limit=1&rsid=ev-life", head);
    evs = get_ok(&D, path);
    ck_assert_int_eq(json_array_size(json_object_get(evs, "events")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(evs, "next")),
                     json_integer_value(json_object_get(
                         json_array_get(json_object_get(evs, "events"), 0), "seq")));
    json_decref(evs);
    json_decref(lease);
}
END_TEST

START_TEST(test_events_bad_params_and_auth)
{
    static const char *const bad[] = {
        "/v1/events?since=-1",        "/v1/events?since=abc",   "/v1/events?since=",
        "/v1/events?limit=0",         "/v1/events?limit=10001", "/v1/events?wait_ms=60001",
        "/v1/events?wait_ms=-5",      "/v1/events?types=bogus", "/v1/events?types=seeded,",
        "/v1/events?rsid=bad%2Fname", "/v1/events?sandbox_id=",
    };
    json_t *lease = lbt_seed(&D, "ev-auth", "t", NULL);
    const char *token = str(json_object_get(lease, "access"), "token");
    struct lbt_resp r;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        lbt_json(&D, "GET", bad[i], "", NULL, &r);
        ck_assert_msg(r.status == 400, "%s: %ld %s", bad[i], r.status, r.body);
        lbt_assert_error(&r, 400, "bad_request");
        lbt_resp_free(&r);
    }
    lbt_json(&D, "GET", "/v1/events?since=0", token, NULL, &r); /* an operate token */
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/events?since=0", NULL, NULL, &r);
    lbt_assert_error(&r, 401, "unauthorized");
    lbt_resp_free(&r);
    lbt_release_session(&D, "ev-auth");
    json_decref(lease);
}
END_TEST

/* ---------- long-poll ---------- */

START_TEST(test_events_long_poll_wakes)
{
    long long head = head_seq(&D);
    char path[256];
    struct lbt_async *a;
    struct lbt_resp r;
    json_t *lease, *evs;

    snprintf(path, sizeof(path), "/v1/events?since=%lld&wait_ms=30000&rsid=ev-wake", head);
    a = lbt_async_json(&D, "GET", path, "", NULL);
    lbt_sleep_ms(300);
    ck_assert_msg(!lbt_async_done(a), "the long-poll answered with nothing new");
    lease = lbt_seed(&D, "ev-wake", "t", NULL);
    lbt_async_join(a, &r);
    ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
    evs = json_object_get(r.json, "events");
    ck_assert_msg(json_array_size(evs) == 1, "%s", r.body);
    ck_assert_str_eq(str(json_array_get(evs, 0), "type"), "seeded");
    ck_assert_str_eq(str(json_array_get(evs, 0), "sandbox_id"), str(lease, "sandbox_id"));
    lbt_resp_free(&r);

    /* a filtered long-poll is not answered by another session's event, nor even woken (every
     * woken read is a worker's job: a thousand parked polls woken at each commit would flood
     * the worker queue) */
    int parked = lbt_log_count(&D, "events: a read (rsid ev-none, sandbox_id any) parked");

    snprintf(path, sizeof(path), "/v1/events?since=%lld&wait_ms=1500&rsid=ev-none", head);
    a = lbt_async_json(&D, "GET", path, "", NULL);
    while (lbt_log_count(&D, "events: a read (rsid ev-none, sandbox_id any) parked") == parked)
        lbt_sleep_ms(10);
    lbt_release_session(&D, "ev-wake");
    lbt_async_join(a, &r);
    ck_assert_int_eq(
        lbt_log_count(&D, "events: a parked read (rsid ev-none, sandbox_id any) was woken"), 0);
    ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
    ck_assert_int_eq(json_array_size(json_object_get(r.json, "events")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "next")), head);
    lbt_resp_free(&r);
    json_decref(lease);
}
END_TEST

/* ---------- streaming ---------- */

struct ndjson {
    pthread_mutex_t lock;
    char partial[65536];
    size_t plen;
    json_t *lines;   /* array */
    atomic_int stop; /* set by the test's thread, read by curl's callback */
    long status;
    char content_type[128];
    char url[512];
    pthread_t thread;
};

static size_t nd_write(char *p, size_t sz, size_t nmemb, void *ud)
{
    struct ndjson *x = ud;
    size_t k = sz * nmemb;
    char *nl;

    if (x->plen + k > sizeof(x->partial))
        return 0;
    memcpy(x->partial + x->plen, p, k);
    x->plen += k;
    while ((nl = memchr(x->partial, '\n', x->plen))) {
        size_t len = (size_t)(nl - x->partial);
        json_t *l = json_loadb(x->partial, len, 0, NULL);

        pthread_mutex_lock(&x->lock);
        json_array_append_new(x->lines, l ? l : json_string("<not JSON>"));
        pthread_mutex_unlock(&x->lock);
        memmove(x->partial, nl + 1, x->plen - len - 1);
        x->plen -= len + 1;
    }
    return k;
}

static int nd_progress(void *ud, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    return atomic_load(&((struct ndjson *)ud)->stop); /* non-zero: the client leaves */
}

static void *nd_main(void *arg)
{
    struct ndjson *x = arg;
    CURL *c = curl_easy_init();
    struct curl_slist *h = NULL;
    char auth[300], *ct = NULL;

    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", D.admin_token);
    h = curl_slist_append(h, auth);
    h = curl_slist_append(h, "Accept: application/x-ndjson");
    curl_easy_setopt(c, CURLOPT_URL, x->url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, nd_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, nd_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, x);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &x->status);
    curl_easy_getinfo(c, CURLINFO_CONTENT_TYPE, &ct);
    snprintf(x->content_type, sizeof(x->content_type), "%s", ct ? ct : "");
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    return NULL;
}

static size_t nd_count(struct ndjson *x)
{
    size_t n;

    pthread_mutex_lock(&x->lock);
    n = json_array_size(x->lines);
    pthread_mutex_unlock(&x->lock);
    return n;
}

START_TEST(test_events_stream)
{
    long long head = head_seq(&D);
    struct ndjson *x = calloc(1, sizeof(*x));
    char types[256];
    json_t *lease;

    pthread_mutex_init(&x->lock, NULL);
    x->lines = json_array();
    snprintf(x->url, sizeof(x->url), "%s/v1/events?since=%lld&rsid=ev-stream", D.base_url, head);
    ck_assert_int_eq(pthread_create(&x->thread, NULL, nd_main, x), 0);
    lbt_sleep_ms(300);
    lease = lbt_seed(&D, "ev-stream", "t", NULL);
    lbt_release_session(&D, "ev-stream");
    for (double until = lbt_now() + 30; nd_count(x) < 2 && lbt_now() < until;)
        lbt_sleep_ms(50);
    pthread_mutex_lock(&x->lock);
    ck_assert_str_eq(types_of(x->lines, types, sizeof(types)), "seeded,stopped");
    ck_assert_str_eq(str(json_array_get(x->lines, 0), "sandbox_id"), str(lease, "sandbox_id"));
    ck_assert_int_gt(json_integer_value(json_object_get(json_array_get(x->lines, 1), "seq")),
                     json_integer_value(json_object_get(json_array_get(x->lines, 0), "seq")));
    pthread_mutex_unlock(&x->lock);
    atomic_store(&x->stop, 1); /* the client leaves; the daemon drops the stream */
    pthread_join(x->thread, NULL);
    ck_assert_int_eq(x->status, 200);
    ck_assert_str_eq(x->content_type, "application/x-ndjson");
    lbt_assert_healthy(&D);
    json_decref(x->lines);
    free(x);
    json_decref(lease);
}
END_TEST

/* ---------- stress ---------- */

struct stress {
    int first, n, failures;
    char msg[256];
};

static void *stress_main(void *arg)
{
    struct stress *s = arg;

    for (int i = s->first; i < s->first + s->n; i++) {
        char path[128];
        struct lbt_resp r;

        snprintf(path, sizeof(path), "/v1/sessions/ev-st-%d/seed", i);
        lbt_json(&D, "POST", path, "", "{\"task_id\": \"stress\"}", &r);
        if (r.status != 200) {
            s->failures++;
            snprintf(s->msg, sizeof(s->msg), "seed %d: %ld %.150s", i, r.status,
                     r.body ? r.body : "");
            lbt_resp_free(&r);
            continue;
        }
        lbt_resp_free(&r);
        snprintf(path, sizeof(path), "/v1/sessions/ev-st-%d/release", i);
        lbt_json(&D, "POST", path, "", NULL, &r);
        if (r.status != 200) {
            s->failures++;
            snprintf(s->msg, sizeof(s->msg), "release %d: %ld %.150s", i, r.status,
                     r.body ? r.body : "");
        }
        lbt_resp_free(&r);
    }
    return NULL;
}

START_TEST(test_events_stress)
{
    const char *env = getenv("LBT_EVENTS_EPISODES");
    int episodes = env && atoi(env) > 0 ? atoi(env) : 1000, seeded = 0;
    long long head = head_seq(&D);
    struct stress st[16];
    pthread_t th[16];
    json_t *evs, *ev, *per = json_object();
    const char *key;
    json_t *v;
    size_t i;

    for (int t = 0; t < 16; t++) {
        st[t] = (struct stress){.first = t * episodes / 16,
                                .n = (t + 1) * episodes / 16 - t * episodes / 16};
        ck_assert_int_eq(pthread_create(&th[t], NULL, stress_main, &st[t]), 0);
    }
    for (int t = 0; t < 16; t++) {
        pthread_join(th[t], NULL);
        ck_assert_msg(st[t].failures == 0, "%d failures: %s", st[t].failures, st[t].msg);
    }
    evs = events_after(&D, head, "&types=seeded,stopped"); /* asserts seq strictly increasing */
    json_array_foreach(evs, i, ev) {
        const char *id = str(ev, "sandbox_id");
        json_t *c = json_object_get(per, id);
        bool is_seeded = !strcmp(str(ev, "type"), "seeded");

        if (strncmp(str(ev, "rsid"), "ev-st-", 6) != 0)
            continue;
        if (!c) {
            c = json_pack("[i,i]", 0, 0);
            json_object_set_new(per, id, c);
        }
        /* seeded before stopped */
        ck_assert_msg(is_seeded || json_integer_value(json_array_get(c, 0)) == 1,
                      "%s stopped before it was seeded", id);
        json_array_set_new(
            c, is_seeded ? 0 : 1,
            json_integer(json_integer_value(json_array_get(c, is_seeded ? 0 : 1)) + 1));
        seeded += is_seeded;
    }
    ck_assert_int_eq(seeded, episodes);
    ck_assert_int_eq((int)json_object_size(per), episodes);
    json_object_foreach(per, key, v) {
        ck_assert_msg(json_integer_value(json_array_get(v, 0)) == 1 &&
                          json_integer_value(json_array_get(v, 1)) == 1,
                      "%s: %lld seeded, %lld stopped", key,
                      (long long)json_integer_value(json_array_get(v, 0)),
                      (long long)json_integer_value(json_array_get(v, 1)));
    }
    json_decref(per);
    json_decref(evs);
}
END_TEST

/* ---------- retention, durability (daemons of their own) ---------- */

static struct lbt_daemon R;
static const char *const R_ARGS[] = {"--set", "events.max_count=3", NULL};

START_TEST(test_events_retention_by_count)
{
    json_t *all = NULL;
    long long newest = 0;

    for (int i = 0; i < 3; i++) {
        char rsid[32];
        json_t *lease;

        snprintf(rsid, sizeof(rsid), "ev-ret-%d", i);
        lease = lbt_seed(&R, rsid, "t", NULL);
        lbt_release_session(&R, rsid);
        json_decref(lease);
    }
    newest = head_seq(&R);
    ck_assert_int_ge(newest, 6);
    /* the sweeper (every second in tests) keeps the newest 3 */
    for (double until = lbt_now() + 30;; lbt_sleep_ms(200)) {
        json_decref(all);
        all = events_after(&R, 0, NULL);
        if (json_array_size(all) == 3 || lbt_now() > until)
            break;
    }
    ck_assert_int_eq(json_array_size(all), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(all, 0), "seq")),
                     newest - 2);
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(all, 2), "seq")), newest);
    json_decref(all);
}
END_TEST

static struct lbt_daemon K;

START_TEST(test_events_survive_kill9)
{
    json_t *lease = lbt_seed(&K, "ev-kill", "t", NULL), *before, *after;
    char q[160], types[128];
    long long last;

    snprintf(q, sizeof(q), "&sandbox_id=%s", str(lease, "sandbox_id"));
    before = events_after(&K, 0, q);
    ck_assert_str_eq(types_of(before, types, sizeof(types)), "seeded");
    last = head_seq(&K);
    lbt_daemon_kill(&K); /* SIGKILL: no shutdown, no sweep */
    lbt_daemon_restart(&K, NULL);
    after = events_after(&K, 0, q);
    ck_assert_msg(json_equal(before, after), "the events before the kill changed");
    lbt_release_session(&K, "ev-kill");
    json_decref(after);
    after = events_after(&K, last, q);
    ck_assert_str_eq(types_of(after, types, sizeof(types)), "stopped");
    ck_assert_int_gt(json_integer_value(json_object_get(json_array_get(after, 0), "seq")), last);
    json_decref(after);
    json_decref(before);
    json_decref(lease);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("events");
    TCase *tc = tcase_create("events");
    TCase *tr = tcase_create("retention");
    TCase *tk = tcase_create("kill9");

    lbt_shared_daemon(tc, &D, NULL);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_events_life_in_order);
    tcase_add_test(tc, test_events_bad_params_and_auth);
    tcase_add_test(tc, test_events_long_poll_wakes);
    tcase_add_test(tc, test_events_stream);
    tcase_add_test(tc, test_events_stress);
    suite_add_tcase(s, tc);

    lbt_shared_daemon(tr, &R, R_ARGS);
    tcase_set_timeout(tr, 120);
    tcase_add_test(tr, test_events_retention_by_count);
    suite_add_tcase(s, tr);

    lbt_shared_daemon(tk, &K, NULL);
    tcase_set_timeout(tk, 120);
    tcase_add_test(tk, test_events_survive_kill9);
    suite_add_tcase(s, tk);
    return lbt_run_suite(s);
}
