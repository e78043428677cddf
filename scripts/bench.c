/*
 * bench.c - lendbox-bench: N episodes (seed -> exec `true` -> release) against a running
 * lendboxd at a given concurrency, printing p50/p99 per step and episodes per second.
 * Used by scripts/bench; not a test (no assertions on speed anywhere).
 *
 *   lendbox-bench URL TOKEN EPISODES CONCURRENCY [LABEL]
 *
 * LENDBOX_BENCH_SEED: the seed's body. LENDBOX_BENCH_SAMPLES=FILE: also append each successful
 * episode to FILE as a line "SEED_MS EXEC_MS RELEASE_MS" (scripts/bench-compare pools the
 * samples of several runs).
 */
#include "bench-common.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct bench {
    struct bench_lendbox lb;
    const char *label;
    int episodes, next, failures;
    double *seed_ms, *exec_ms, *release_ms;
    pthread_mutex_t mutex;
};

/* Append the successful episodes' samples to path, one line each. */
static void write_samples(const struct bench *b, const char *path)
{
    FILE *f = fopen(path, "a");

    if (!f) {
        perror(path);
        return;
    }
    for (int i = 0; i < b->episodes; i++)
        if (b->seed_ms[i] >= 0)
            fprintf(f, "%.3f %.3f %.3f\n", b->seed_ms[i], b->exec_ms[i], b->release_ms[i]);
    fclose(f);
}

static void *episode_worker(void *arg)
{
    struct bench *b = arg;
    CURL *c = curl_easy_init();
    struct bench_sink *s = calloc(1, sizeof(*s));
    char session[128];
    double ms[3];

    for (;;) {
        int i;

        pthread_mutex_lock(&b->mutex);
        i = b->next++;
        pthread_mutex_unlock(&b->mutex);
        if (i >= b->episodes)
            break;
        snprintf(session, sizeof(session), "bench-%s-%d-%d", b->label, (int)getpid(), i);
        if (bench_lendbox_episode(c, &b->lb, session, s, ms) < 0) {
            pthread_mutex_lock(&b->mutex);
            b->failures++;
            pthread_mutex_unlock(&b->mutex);
            ms[0] = ms[1] = ms[2] = -1;
        }
        b->seed_ms[i] = ms[0];
        b->exec_ms[i] = ms[1];
        b->release_ms[i] = ms[2];
    }
    bench_sink_release(s);
    free(s);
    curl_easy_cleanup(c);
    return NULL;
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
    b.lb.url = argv[1];
    b.lb.token = argv[2];
    b.episodes = atoi(argv[3]);
    conc = atoi(argv[4]);
    b.label = argc > 5 ? argv[5] : "c";
    /* LENDBOX_BENCH_SEED: the seed body, e.g. with a network object */
    b.lb.seed_body =
        getenv("LENDBOX_BENCH_SEED") ? getenv("LENDBOX_BENCH_SEED") : "{\"task_id\":\"bench\"}";
    b.seed_ms = calloc((size_t)b.episodes, sizeof(double));
    b.exec_ms = calloc((size_t)b.episodes, sizeof(double));
    b.release_ms = calloc((size_t)b.episodes, sizeof(double));
    t = calloc((size_t)conc, sizeof(*t));
    pthread_mutex_init(&b.mutex, NULL);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    t0 = bench_now_ms();
    for (int i = 0; i < conc; i++)
        pthread_create(&t[i], NULL, episode_worker, &b);
    for (int i = 0; i < conc; i++)
        pthread_join(t[i], NULL);
    elapsed = bench_now_ms() - t0;
    if (getenv("LENDBOX_BENCH_SAMPLES")) /* before bench_print_stat sorts each column */
        write_samples(&b, getenv("LENDBOX_BENCH_SAMPLES"));
    printf("concurrency %d: %d episodes in %.2f s = %.1f episodes/s, %d failed\n", conc, b.episodes,
           elapsed / 1000.0, b.episodes * 1000.0 / elapsed, b.failures);
    bench_print_stat("seed", b.seed_ms, b.episodes);
    bench_print_stat("exec", b.exec_ms, b.episodes);
    bench_print_stat("release", b.release_ms, b.episodes);
    free(b.seed_ms);
    free(b.exec_ms);
    free(b.release_ms);
    free(t);
    return b.failures ? 1 : 0;
}
