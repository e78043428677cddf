/*
 * bench-docker.c - lendbox-bench-docker: the docker provider's operations done directly
 * against the engine's API (no lendbox), to measure lendbox's overhead per operation: each
 * episode is bench_docker_episode (bench-common.h), what the provider does for seed, exec
 * `true` and release. Sequential (concurrency 1). Not a test: nothing is asserted.
 *
 *   lendbox-bench-docker SOCKET IMAGE SUPERVISE EPISODES
 */
#include "bench-common.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    static struct bench_sink s;
    struct bench_docker d;
    char name[64];
    double *seed, *exec, *rel, ms[3];
    int n;
    CURL *c;

    if (argc < 5) {
        fprintf(stderr, "usage: lendbox-bench-docker SOCKET IMAGE SUPERVISE EPISODES\n");
        return 2;
    }
    d.socket = argv[1];
    d.image = argv[2];
    d.supervise = argv[3];
    n = atoi(argv[4]);
    seed = calloc((size_t)n, sizeof(double));
    exec = calloc((size_t)n, sizeof(double));
    rel = calloc((size_t)n, sizeof(double));
    curl_global_init(CURL_GLOBAL_DEFAULT);
    c = curl_easy_init();
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "bench-direct-%d-%d", (int)getpid(), i);
        if (bench_docker_episode(c, &d, name, &s, ms) < 0)
            return 1;
        seed[i] = ms[0];
        exec[i] = ms[1];
        rel[i] = ms[2];
    }
    printf("direct engine API, concurrency 1: %d episodes\n", n);
    bench_print_stat("seed", seed, n);
    bench_print_stat("exec", exec, n);
    bench_print_stat("release", rel, n);
    curl_easy_cleanup(c);
    bench_sink_release(&s);
    free(seed);
    free(exec);
    free(rel);
    return 0;
}
