/*
 * bench-side.c - lendbox-bench-side: one interleaved side-by-side run of episodes (seed ->
 * exec `true` -> release) on up to four contenders (scripts/bench-side starts the daemons
 * and the engine; docs/operations.md, "Benchmarks", says what each number means):
 *   floor     bare bwrap with the namespaces and mounts of a lendbox sandbox, running `true`
 *             as an unprivileged uid (--floor-uid): no daemon, no HTTP, no SQLite, no cgroup;
 *   docker    a container per episode through a Docker-compatible engine API (--docker-socket):
 *             bench_docker_episode, the docker provider's own requests without lendbox;
 *   lendbox   a lendboxd without a warm pool (--lendbox URL --lendbox-token T);
 *   pool      a lendboxd with [pool] size = N (--pool URL --pool-token T --pool-size N); with
 *             --pool-recycle its daemon has [pool] recycle = yes: a release of a pooled sandbox
 *             remakes it for the pool (paid inside the release, so timed) and the pool's
 *             seeds take the recycled ones.
 * For each concurrency (--concurrency 1,16) each contender runs --episodes episodes, split in
 * batches of max(concurrency, episodes / --rounds); the batches alternate between the
 * contenders (the first contender of a round rotates), so load from other work on the machine
 * hits all alike. Before and after each pool batch the run waits, untimed, until the pool is
 * full again: its seeds are hits and its refills do not run inside the others' batches.
 * episodes/s: a contender's episodes over the summed wall time of its batches.
 * LENDBOX_BENCH_DEBUG set: the floor's bwrap command line is printed to stderr.
 * Not a test: nothing is asserted. Exit status 1 when an episode failed.
 */
#include "bench-common.h"

#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_CONC_LEVELS 4
#define MAX_THREADS 256
#define POOL_WAIT_MS 300000.0

enum kind { FLOOR, DOCKER, LENDBOX };

struct result {
    double *ms[4]; /* seed, exec, release, whole episode; -1 failed, -2 no such step */
    int failed;
    double elapsed_ms;
};

struct contender {
    const char *name;
    enum kind kind;
    struct bench_lendbox lb;
    struct bench_docker d;
    int pool_size; /* > 0: lb is a daemon with a warm pool of this size */
    bool recycle;  /* the pool daemon recycles released sandboxes ([pool] recycle = yes) */
    CURL *curl[MAX_THREADS];
    struct bench_sink *sink[MAX_THREADS];
    struct result res[MAX_CONC_LEVELS];
};

struct batch {
    struct contender *c;
    struct result *r;
    int level, next, end;
    pthread_mutex_t mutex;
};

struct worker {
    struct batch *b;
    int slot;
};

/* The floor (bench-common.h), set up once. */
static struct bench_floor floor_b = {.supervise_fd = -1};

/* One floor episode: the whole episode's time in ms[3], no steps. */
static int floor_episode(double ms[4])
{
    ms[0] = ms[1] = ms[2] = -2;
    return bench_floor_episode(&floor_b, &ms[3]);
}

static void *batch_worker(void *arg)
{
    struct worker *w = arg;
    struct batch *b = w->b;
    struct contender *c = b->c;
    char name[128];
    double ms[4];

    for (;;) {
        int i, rc;

        pthread_mutex_lock(&b->mutex);
        i = b->next++;
        pthread_mutex_unlock(&b->mutex);
        if (i >= b->end)
            break;
        snprintf(name, sizeof(name), "side-%s-%d-%d-%d", c->name, (int)getpid(), b->level, i);
        if (c->kind == FLOOR) {
            rc = floor_episode(ms);
        } else {
            rc = c->kind == DOCKER
                     ? bench_docker_episode(c->curl[w->slot], &c->d, name, c->sink[w->slot], ms)
                     : bench_lendbox_episode(c->curl[w->slot], &c->lb, name, c->sink[w->slot], ms);
            ms[3] = ms[0] + ms[1] + ms[2];
        }
        if (rc < 0) {
            pthread_mutex_lock(&b->mutex);
            b->r->failed++;
            pthread_mutex_unlock(&b->mutex);
            ms[0] = ms[1] = ms[2] = ms[3] = -1;
        }
        for (int k = 0; k < 4; k++)
            b->r->ms[k][i] = ms[k];
    }
    return NULL;
}

/* Episodes [first, first + count) of contender c at concurrency conc. */
static void run_batch(struct contender *c, int level, int conc, int first, int count)
{
    struct batch b = {.c = c, .r = &c->res[level], .level = level, .next = first};
    pthread_t t[MAX_THREADS];
    struct worker w[MAX_THREADS];
    int nt = conc < count ? conc : count;
    double t0;

    b.end = first + count;
    pthread_mutex_init(&b.mutex, NULL);
    t0 = bench_now_ms();
    for (int i = 0; i < nt; i++) {
        w[i] = (struct worker){&b, i};
        pthread_create(&t[i], NULL, batch_worker, &w[i]);
    }
    for (int i = 0; i < nt; i++)
        pthread_join(t[i], NULL);
    c->res[level].elapsed_ms += bench_now_ms() - t0;
    pthread_mutex_destroy(&b.mutex);
}

/* The number of warm sandboxes of a pool daemon, or -1. */
static int warm_count(struct contender *c)
{
    char url[512];
    json_t *j;
    int n = -1;

    snprintf(url, sizeof(url), "%s/v1/sandboxes?state=warm", c->lb.url);
    if (bench_http(c->curl[0], "GET", url, NULL, c->lb.token, NULL, c->sink[0]) != 200)
        return -1;
    j = json_loads(c->sink[0]->buf, 0, NULL);
    if (j && json_is_array(json_object_get(j, "sandboxes")))
        n = (int)json_array_size(json_object_get(j, "sandboxes"));
    json_decref(j);
    return n;
}

static void wait_pool_full(struct contender *c)
{
    double t0 = bench_now_ms();

    while (warm_count(c) < c->pool_size) {
        if (bench_now_ms() - t0 > POOL_WAIT_MS) {
            fprintf(stderr, "pool: not full after %.0f s; going on\n", POOL_WAIT_MS / 1000);
            return;
        }
        usleep(50000);
    }
}

static void print_warm_metrics(struct contender *c)
{
    char url[512], *line, *save = NULL;

    snprintf(url, sizeof(url), "%s/metrics", c->lb.url);
    if (bench_http(c->curl[0], "GET", url, NULL, c->lb.token, NULL, c->sink[0]) != 200)
        return;
    for (line = strtok_r(c->sink[0]->buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        if (strncmp(line, "lendbox_warm_seeds_total", 24) == 0 ||
            strncmp(line, "lendbox_warm_refill", 19) == 0 ||
            strncmp(line, "lendbox_pool_recycled_total", 27) == 0 ||
            strncmp(line, "lendbox_pool_reset_failures_total", 33) == 0)
            printf("  %s\n", line);
}

static void fmt_pair(char *out, size_t size, double *v, int n, bool none)
{
    struct bench_stat st;

    if (none) {
        snprintf(out, size, "%17s", "-");
        return;
    }
    bench_stat_of(v, n, &st);
    if (st.n_ok == 0)
        snprintf(out, size, "%17s", "failed");
    else
        snprintf(out, size, "%7.2f / %7.2f", st.p50_ms, st.p99_ms);
}

static double p50_of(struct contender *c, int level, int step, int n)
{
    struct bench_stat st;

    if (!c || (c->kind == FLOOR && step < 3))
        return 0;
    bench_stat_of(c->res[level].ms[step], n, &st);
    return st.n_ok ? st.p50_ms : 0;
}

static void print_ratio(const char *what, double num, double den)
{
    if (num > 0 && den > 0)
        printf("  %-34s %6.2fx   (%.2f / %.2f ms)\n", what, num / den, num, den);
}

/* A contender's episodes/s at one concurrency (its episodes over its batches' wall time). */
static double rate_of(struct contender *c, int level, int n)
{
    struct result *r;

    if (!c)
        return 0;
    r = &c->res[level];
    return r->elapsed_ms > 0 ? (n - r->failed) * 1000.0 / r->elapsed_ms : 0;
}

static void print_load(const char *when)
{
    char buf[128] = "";
    FILE *f = fopen("/proc/loadavg", "r");

    if (f) {
        if (!fgets(buf, sizeof(buf), f))
            buf[0] = '\0';
        fclose(f);
    }
    buf[strcspn(buf, "\n")] = '\0';
    printf("load average %s: %s (%ld CPUs online)\n", when, buf, sysconf(_SC_NPROCESSORS_ONLN));
}

static void usage(void)
{
    fprintf(stderr, "usage: lendbox-bench-side [--episodes N] [--rounds R] [--concurrency 1,16]\n"
                    "  [--floor-uid UID [--bwrap PATH] [--supervise PATH] [--workdir /workspace]]\n"
                    "  [--docker-socket PATH [--docker-image IMAGE] --supervise PATH]\n"
                    "  [--lendbox URL --lendbox-token TOKEN]\n"
                    "  [--pool URL --pool-token TOKEN --pool-size N [--pool-recycle]]\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"episodes", required_argument, NULL, 'n'},
                                         {"rounds", required_argument, NULL, 'r'},
                                         {"concurrency", required_argument, NULL, 'c'},
                                         {"floor-uid", required_argument, NULL, 'u'},
                                         {"bwrap", required_argument, NULL, 'b'},
                                         {"supervise", required_argument, NULL, 's'},
                                         {"workdir", required_argument, NULL, 'w'},
                                         {"docker-socket", required_argument, NULL, 'D'},
                                         {"docker-image", required_argument, NULL, 'I'},
                                         {"lendbox", required_argument, NULL, 'L'},
                                         {"lendbox-token", required_argument, NULL, 'T'},
                                         {"pool", required_argument, NULL, 'P'},
                                         {"pool-token", required_argument, NULL, 'K'},
                                         {"pool-size", required_argument, NULL, 'S'},
                                         {"pool-recycle", no_argument, NULL, 'R'},
                                         {NULL, 0, NULL, 0}};
    const char *bwrap = "/usr/bin/bwrap", *supervise = NULL, *workdir = "/workspace";
    const char *seed_body = "{\"task_id\":\"bench\"}";
    struct contender floor_c = {.name = "floor", .kind = FLOOR};
    struct contender docker_c = {.name = "docker", .kind = DOCKER, .d.image = "lbtest:latest"};
    struct contender lend_c = {.name = "lendbox", .kind = LENDBOX, .lb.seed_body = seed_body};
    struct contender pool_c = {.name = "pool", .kind = LENDBOX, .lb.seed_body = seed_body};
    struct contender *cs[4], *floor_p = NULL, *docker_p = NULL, *lend_p = NULL, *pool_p = NULL;
    int episodes = 50, rounds = 5, conc[MAX_CONC_LEVELS], nconc = 0, ncs = 0, failed = 0, o;
    int max_conc = 1;
    uid_t floor_uid = 0;
    bool have_floor = false;
    char *list = NULL, *tok, *save = NULL;

    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'n':
            episodes = atoi(optarg);
            break;
        case 'r':
            rounds = atoi(optarg);
            break;
        case 'c':
            list = optarg;
            break;
        case 'u':
            floor_uid = (uid_t)strtoul(optarg, NULL, 10);
            have_floor = true;
            break;
        case 'b':
            bwrap = optarg;
            break;
        case 's':
            supervise = optarg;
            break;
        case 'w':
            workdir = optarg;
            break;
        case 'D':
            docker_c.d.socket = optarg;
            break;
        case 'I':
            docker_c.d.image = optarg;
            break;
        case 'L':
            lend_c.lb.url = optarg;
            break;
        case 'T':
            lend_c.lb.token = optarg;
            break;
        case 'P':
            pool_c.lb.url = optarg;
            break;
        case 'K':
            pool_c.lb.token = optarg;
            break;
        case 'S':
            pool_c.pool_size = atoi(optarg);
            break;
        case 'R':
            pool_c.recycle = true;
            break;
        default:
            usage();
            return 2;
        }
    }
    for (tok = strtok_r(list ? list : (char[]){"1,16"}, ",", &save); tok && nconc < MAX_CONC_LEVELS;
         tok = strtok_r(NULL, ",", &save))
        conc[nconc++] = atoi(tok);
    if (episodes <= 0 || rounds <= 0 || nconc == 0 || workdir[0] != '/' ||
        (docker_c.d.socket && !supervise) || (lend_c.lb.url && !lend_c.lb.token) ||
        (pool_c.lb.url && (!pool_c.lb.token || pool_c.pool_size <= 0))) {
        usage();
        return 2;
    }
    for (int i = 0; i < nconc; i++)
        if (conc[i] <= 0 || conc[i] > MAX_THREADS) {
            usage();
            return 2;
        }
    docker_c.d.supervise = supervise;
    if (have_floor) {
        if (bench_floor_init(&floor_b, bwrap, workdir, supervise, floor_uid) < 0)
            return 2;
        cs[ncs++] = floor_p = &floor_c;
    }
    if (docker_c.d.socket)
        cs[ncs++] = docker_p = &docker_c;
    if (lend_c.lb.url)
        cs[ncs++] = lend_p = &lend_c;
    if (pool_c.lb.url)
        cs[ncs++] = pool_p = &pool_c;
    if (ncs == 0) {
        usage();
        return 2;
    }
    for (int i = 0; i < nconc; i++)
        max_conc = conc[i] > max_conc ? conc[i] : max_conc;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    for (int k = 0; k < ncs; k++) {
        for (int t = 0; t < max_conc; t++) {
            cs[k]->curl[t] = curl_easy_init();
            cs[k]->sink[t] = calloc(1, sizeof(struct bench_sink));
        }
        for (int l = 0; l < nconc; l++)
            for (int s = 0; s < 4; s++)
                cs[k]->res[l].ms[s] = calloc((size_t)episodes, sizeof(double));
    }

    print_load("at start");
    if (pool_p)
        wait_pool_full(pool_p);
    for (int l = 0; l < nconc; l++) {
        int batch = (episodes + rounds - 1) / rounds;

        if (batch < conc[l])
            batch = conc[l] < episodes ? conc[l] : episodes;
        for (int first = 0, r = 0; first < episodes; first += batch, r++) {
            int count = episodes - first < batch ? episodes - first : batch;

            for (int k = 0; k < ncs; k++) {
                struct contender *c = cs[(k + r) % ncs];

                run_batch(c, l, conc[l], first, count);
                if (c == pool_p)
                    wait_pool_full(c);
            }
        }
    }
    print_load("at end");

    printf("\n%d episodes (seed -> exec true -> release) per contender and concurrency, "
           "interleaved in batches of up to max(concurrency, %d)\n",
           episodes, (episodes + rounds - 1) / rounds);
    for (int l = 0; l < nconc; l++) {
        printf("\nconcurrency %d          seed p50 / p99 ms   exec p50 / p99 ms"
               "   release p50 / p99   episode p50 / p99   episodes/s  failed\n",
               conc[l]);
        for (int k = 0; k < ncs; k++) {
            struct contender *c = cs[k];
            struct result *r = &c->res[l];
            char label[64], col[4][40];

            if (c == pool_p)
                snprintf(label, sizeof(label), "lendbox pool=%d%s", c->pool_size,
                         c->recycle ? " rc" : "");
            else
                snprintf(label, sizeof(label), "%s",
                         c == floor_p    ? "bwrap floor"
                         : c == docker_p ? "docker API"
                                         : "lendbox (no pool)");
            for (int s = 0; s < 4; s++)
                fmt_pair(col[s], sizeof(col[s]), r->ms[s], episodes, c->kind == FLOOR && s < 3);
            printf("  %-20s %s   %s   %s   %s   %10.1f  %6d\n", label, col[0], col[1], col[2],
                   col[3], r->elapsed_ms > 0 ? (episodes - r->failed) * 1000.0 / r->elapsed_ms : 0,
                   r->failed);
            failed += r->failed;
        }
        printf(" ratios of p50s at concurrency %d:\n", conc[l]);
        print_ratio("episode lendbox / floor", p50_of(lend_p, l, 3, episodes),
                    p50_of(floor_p, l, 3, episodes));
        print_ratio("episode lendbox pool / floor", p50_of(pool_p, l, 3, episodes),
                    p50_of(floor_p, l, 3, episodes));
        print_ratio("seed lendbox / floor", p50_of(lend_p, l, 0, episodes),
                    p50_of(floor_p, l, 3, episodes));
        print_ratio("seed lendbox pool / floor", p50_of(pool_p, l, 0, episodes),
                    p50_of(floor_p, l, 3, episodes));
        print_ratio("episode docker / lendbox", p50_of(docker_p, l, 3, episodes),
                    p50_of(lend_p, l, 3, episodes));
        print_ratio("episode docker / lendbox pool", p50_of(docker_p, l, 3, episodes),
                    p50_of(pool_p, l, 3, episodes));
        print_ratio("exec lendbox pool / lendbox", p50_of(pool_p, l, 1, episodes),
                    p50_of(lend_p, l, 1, episodes));
        print_ratio("release lendbox pool / lendbox", p50_of(pool_p, l, 2, episodes),
                    p50_of(lend_p, l, 2, episodes));
        if (rate_of(pool_p, l, episodes) > 0 && rate_of(floor_p, l, episodes) > 0)
            printf("  %-34s %6.2fx   (%.1f / %.1f episodes/s)\n", "episodes/s lendbox pool / floor",
                   rate_of(pool_p, l, episodes) / rate_of(floor_p, l, episodes),
                   rate_of(pool_p, l, episodes), rate_of(floor_p, l, episodes));
    }
    if (pool_p) {
        printf("\nwarm pool counters (refills happened between batches, untimed%s):\n",
               pool_p->recycle ? "; recycles inside the releases, timed" : "");
        print_warm_metrics(pool_p);
    }
    for (int k = 0; k < ncs; k++) {
        for (int t = 0; t < max_conc; t++) {
            curl_easy_cleanup(cs[k]->curl[t]);
            bench_sink_release(cs[k]->sink[t]);
            free(cs[k]->sink[t]);
        }
        for (int l = 0; l < nconc; l++)
            for (int s = 0; s < 4; s++)
                free(cs[k]->res[l].ms[s]);
    }
    bench_floor_release(&floor_b);
    curl_global_cleanup();
    return failed ? 1 : 0;
}
