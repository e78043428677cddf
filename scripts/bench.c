/*
 * bench.c - lendbox-bench: N episodes (seed -> exec `true` -> release) against a running
 * lendboxd at a given concurrency, printing p50/p99 per step and episodes per second.
 * Used by scripts/bench; not a test (no assertions on speed anywhere).
 *
 *   lendbox-bench URL TOKEN EPISODES CONCURRENCY [LABEL]
 */
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct bench {
    const char *url, *token, *label, *seed_body;
    int episodes, next, failures;
    double *seed_ms, *exec_ms, *release_ms;
    pthread_mutex_t mutex;
};

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

struct sink {
    char buf[65536];
    size_t len;
};

static size_t sink_write(char *p, size_t size, size_t n, void *user)
{
    struct sink *s = user;
    size_t add = size * n;

    if (s->len + add < sizeof(s->buf)) {
        memcpy(s->buf + s->len, p, add);
        s->len += add;
        s->buf[s->len] = '\0';
    }
    return add;
}

static long post(CURL *c, const char *url, const char *token, const char *body, struct sink *s)
{
    struct curl_slist *h = NULL;
    char auth[512];
    long code = 0;

    s->len = 0;
    s->buf[0] = '\0';
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token);
    h = curl_slist_append(h, auth);
    h = curl_slist_append(h, "Content-Type: application/json");
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, s);
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    return code;
}

static void *episode_worker(void *arg)
{
    struct bench *b = arg;
    CURL *c = curl_easy_init();
    struct sink *s = malloc(sizeof(*s));
    char url[512], body[256], sbx[64];

    for (;;) {
        int i;
        double t0, t1, t2, t3;
        char *p;

        pthread_mutex_lock(&b->mutex);
        i = b->next++;
        pthread_mutex_unlock(&b->mutex);
        if (i >= b->episodes)
            break;
        snprintf(url, sizeof(url), "%s/v1/sessions/bench-%s-%d-%d/seed", b->url, b->label,
                 (int)getpid(), i);
        t0 = now_ms();
        if (post(c, url, b->token, b->seed_body, s) != 200 ||
            !(p = strstr(s->buf, "\"sandbox_id\":\""))) {
            fprintf(stderr, "seed failed: %s\n", s->buf);
            goto fail;
        }
        snprintf(sbx, sizeof(sbx), "%.30s", p + 14);
        t1 = now_ms();
        snprintf(url, sizeof(url), "%s/v1/sandboxes/%s/exec", b->url, sbx);
        snprintf(body, sizeof(body), "{\"argv\":[\"true\"]}");
        if (post(c, url, b->token, body, s) != 200 || !strstr(s->buf, "\"return_code\":0")) {
            fprintf(stderr, "exec failed: %s\n", s->buf);
            goto fail;
        }
        t2 = now_ms();
        snprintf(url, sizeof(url), "%s/v1/sessions/bench-%s-%d-%d/release", b->url, b->label,
                 (int)getpid(), i);
        if (post(c, url, b->token, "{}", s) != 200) {
            fprintf(stderr, "release failed: %s\n", s->buf);
            goto fail;
        }
        t3 = now_ms();
        b->seed_ms[i] = t1 - t0;
        b->exec_ms[i] = t2 - t1;
        b->release_ms[i] = t3 - t2;
        continue;
    fail:
        pthread_mutex_lock(&b->mutex);
        b->failures++;
        pthread_mutex_unlock(&b->mutex);
        b->seed_ms[i] = b->exec_ms[i] = b->release_ms[i] = -1;
    }
    free(s);
    curl_easy_cleanup(c);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static void report(const char *step, double *v, int n)
{
    int m = 0;

    for (int i = 0; i < n; i++)
        if (v[i] >= 0)
            v[m++] = v[i];
    qsort(v, (size_t)m, sizeof(double), cmp_double);
    if (m == 0) {
        printf("  %-8s no successful samples\n", step);
        return;
    }
    printf("  %-8s p50 %7.2f ms   p99 %7.2f ms   max %7.2f ms\n", step, v[m / 2],
           v[(int)((m - 1) * 0.99)], v[m - 1]);
}

int main(int argc, char **argv)
{
    struct bench b = {0};
    int conc;
    pthread_t *t;
    double t0, elapsed;

    if (argc < 5) {
        fprintf(stderr, "usage: lendbox-bench URL TOKEN EPISODES CONCURRENCY [LABEL]\n");
        return 2;
    }
    b.url = argv[1];
    b.token = argv[2];
    b.episodes = atoi(argv[3]);
    conc = atoi(argv[4]);
    b.label = argc > 5 ? argv[5] : "c";
    /* LENDBOX_BENCH_SEED: the seed body, e.g. with a network object */
    b.seed_body =
        getenv("LENDBOX_BENCH_SEED") ? getenv("LENDBOX_BENCH_SEED") : "{\"task_id\":\"bench\"}";
    b.seed_ms = calloc((size_t)b.episodes, sizeof(double));
    b.exec_ms = calloc((size_t)b.episodes, sizeof(double));
    b.release_ms = calloc((size_t)b.episodes, sizeof(double));
    t = calloc((size_t)conc, sizeof(*t));
    pthread_mutex_init(&b.mutex, NULL);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    t0 = now_ms();
    for (int i = 0; i < conc; i++)
        pthread_create(&t[i], NULL, episode_worker, &b);
    for (int i = 0; i < conc; i++)
        pthread_join(t[i], NULL);
    elapsed = now_ms() - t0;
    printf("concurrency %d: %d episodes in %.2f s = %.1f episodes/s, %d failed\n", conc, b.episodes,
           elapsed / 1000.0, b.episodes * 1000.0 / elapsed, b.failures);
    report("seed", b.seed_ms, b.episodes);
    report("exec", b.exec_ms, b.episodes);
    report("release", b.release_ms, b.episodes);
    free(b.seed_ms);
    free(b.exec_ms);
    free(b.release_ms);
    free(t);
    return b.failures ? 1 : 0;
}
