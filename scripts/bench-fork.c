/*
 * bench-fork.c - lendbox-bench-fork: "prepare once, fork many" on a running lendboxd without a
 * warm pool, in rounds interleaved with the bare bwrap floor (bench-common.h), so that load from
 * other work on the machine hits all alike (scripts/bench-fork starts the daemon; docs/perf.md,
 * "Fork, snapshots and reset", says what each row means). Each round:
 *   floor      --samples runs of bwrap `true`;
 *   snapshot   POST /v1/sandboxes/ID/snapshot of a freshly seeded, untouched sandbox; then of
 *              the same sandbox after it wrote 100 MiB to its workdir (the write is untimed);
 *   seed       --samples seeds from the untouched snapshot ("image": its name) alternating
 *              with --samples from its base image (the snapshot's "base"); releases untimed;
 *   fork       POST /v1/sandboxes/ID/fork of --fork-n sessions, wall time of the call
 *              (children released untimed);
 *   reset      --samples POST /v1/sandboxes/ID/reset on one lent sandbox, alternating with
 *              --samples release + seed of a session (the same image).
 * A route the daemon does not answer (404, 405, 501) gives "n/a (route absent)" for its rows.
 * Snapshots are deleted at the end of their round. Not a test: nothing is asserted. Exit status
 * 1 when a measured call failed otherwise.
 *
 *   lendbox-bench-fork --url URL --token TOKEN --floor-uid UID --supervise PATH
 *       [--rounds R] [--samples K] [--fork-n N] [--bwrap PATH] [--workdir /workspace]
 */
#include "bench-common.h"

#include <getopt.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum row { R_FLOOR, R_SNAP, R_SNAP_BIG, R_SEED_SNAP, R_SEED_BASE, R_FORK, R_RESET, R_CYCLE, R_N };

static const char *const row_label[R_N] = {
    "bwrap floor (bwrap true)",
    "snapshot, untouched sandbox",
    "snapshot after writing 100 MiB",
    "seed from the snapshot",
    "seed from its base image",
    "fork of N children, wall",
    "reset",
    "release + seed (same image)",
};

struct samples {
    double *v;
    int n, cap;
    bool absent; /* the route answered 404/405/501 */
};

struct run {
    const char *url, *token;
    CURL *c;
    struct bench_sink s;
    struct samples rows[R_N];
    int failed;
    long status; /* of the last call */
};

static void add(struct samples *sm, double ms)
{
    if (sm->n == sm->cap) {
        sm->cap = sm->cap ? sm->cap * 2 : 64;
        sm->v = realloc(sm->v, (size_t)sm->cap * sizeof(*sm->v));
        if (!sm->v) {
            perror("realloc");
            abort();
        }
    }
    sm->v[sm->n++] = ms;
}

static bool route_absent(long status)
{
    return status == 404 || status == 405 || status == 501;
}

/* One admin call: method, path below the URL, body; its time in *ms. The parsed answer (NULL
 * if it is not JSON) when the status is want; else NULL, and a failure is counted and printed
 * unless it is a route the daemon lacks (quiet_absent). */
static json_t *call(struct run *b, const char *method, const char *path, const char *body,
                    long want, bool quiet_absent, double *ms)
{
    char url[1024];
    double t0 = bench_now_ms();

    snprintf(url, sizeof(url), "%s%s", b->url, path);
    b->status = bench_http(b->c, method, url, body, b->token, NULL, &b->s);
    if (ms)
        *ms = bench_now_ms() - t0;
    if (b->status == want)
        return b->s.buf ? json_loads(b->s.buf, 0, NULL) : json_object();
    if (!(quiet_absent && route_absent(b->status))) {
        fprintf(stderr, "%s %s: %ld %s\n", method, path, b->status, b->s.buf ? b->s.buf : "");
        b->failed++;
    }
    return NULL;
}

/* j's string member key, or "". */
static const char *str_of(const json_t *j, const char *key)
{
    const char *v = json_string_value(json_object_get(j, key));

    return v ? v : "";
}

/* Seed session rsid with body; the sandbox id into id (size 64). 0 or -1. */
static int seed(struct run *b, const char *rsid, const char *body, char *id, double *ms)
{
    char path[256];
    json_t *j;

    snprintf(path, sizeof(path), "/v1/sessions/%s/seed", rsid);
    j = call(b, "POST", path, body, 200, false, ms);
    if (!j)
        return -1;
    snprintf(id, 64, "%s", str_of(j, "sandbox_id"));
    json_decref(j);
    return id[0] ? 0 : -1;
}

static void release(struct run *b, const char *rsid, double *ms)
{
    char path[256];

    snprintf(path, sizeof(path), "/v1/sessions/%s/release", rsid);
    json_decref(call(b, "POST", path, "{}", 200, false, ms));
}

/* Snapshot sandbox id as name; its base image into base (size 256) when base is not NULL.
 * 0, -1 failed, -2 route absent. */
static int snapshot(struct run *b, const char *id, const char *name, char *base, double *ms)
{
    char path[256], body[256];
    json_t *j;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/snapshot", id);
    snprintf(body, sizeof(body), "{\"name\":\"%s\"}", name);
    j = call(b, "POST", path, body, 201, true, ms);
    if (!j)
        return route_absent(b->status) ? -2 : -1;
    if (base)
        snprintf(base, 256, "%s", str_of(j, "base"));
    json_decref(j);
    return 0;
}

static void delete_image(struct run *b, const char *name)
{
    char path[256];

    snprintf(path, sizeof(path), "/v1/images/%s", name);
    b->status = 0;
    json_decref(call(b, "DELETE", path, NULL, 204, false, NULL));
}

static void round_run(struct run *b, const struct bench_floor *fl, int r, int samples, int fork_n)
{
    char src[64], snap_a[64], snap_b[64], base[256] = "", body[512], rsid[96], id[64];
    int pid = (int)getpid(), ra, rb = -1;
    double ms;
    json_t *j;

    for (int i = 0; i < samples; i++)
        if (bench_floor_episode(fl, &ms) == 0)
            add(&b->rows[R_FLOOR], ms);
        else
            b->failed++;

    /* snapshots: untouched, then after 100 MiB */
    snprintf(rsid, sizeof(rsid), "bf-%d-%d-src", pid, r);
    snprintf(snap_a, sizeof(snap_a), "bf-%d-%d-a", pid, r);
    snprintf(snap_b, sizeof(snap_b), "bf-%d-%d-b", pid, r);
    if (seed(b, rsid, "{\"task_id\":\"bench-fork\"}", src, NULL) < 0)
        return;
    ra = snapshot(b, src, snap_a, base, &ms);
    if (ra == 0)
        add(&b->rows[R_SNAP], ms);
    b->rows[R_SNAP].absent = ra == -2;
    if (ra == 0) {
        char path[256];

        snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", src);
        j = call(b, "POST", path,
                 "{\"argv\":[\"sh\",\"-c\",\"head -c 104857600 /dev/zero > big && "
                 "test $(wc -c < big) = 104857600\"],\"timeout_s\":120}",
                 200, false, NULL);
        if (j && json_integer_value(json_object_get(j, "return_code")) == 0) {
            rb = snapshot(b, src, snap_b, NULL, &ms);
            if (rb == 0)
                add(&b->rows[R_SNAP_BIG], ms);
        } else {
            fprintf(stderr, "writing 100 MiB failed: %s\n", b->s.buf ? b->s.buf : "");
            b->failed++;
        }
        json_decref(j);
    }
    b->rows[R_SNAP_BIG].absent = ra == -2;

    /* seeds from the snapshot and from its base, alternating; releases untimed */
    b->rows[R_SEED_SNAP].absent = b->rows[R_SEED_BASE].absent = ra == -2;
    for (int i = 0; ra == 0 && base[0] && i < samples; i++) {
        for (int k = 0; k < 2; k++) {
            snprintf(rsid, sizeof(rsid), "bf-%d-%d-seed-%d-%d", pid, r, i, k);
            snprintf(body, sizeof(body), "{\"task_id\":\"bench-fork\",\"image\":\"%s\"}",
                     k == 0 ? snap_a : base);
            if (seed(b, rsid, body, id, &ms) == 0) {
                add(&b->rows[k == 0 ? R_SEED_SNAP : R_SEED_BASE], ms);
                release(b, rsid, NULL);
            }
        }
    }

    /* fork of fork_n children of the source sandbox */
    {
        size_t cap = (size_t)fork_n * 48 + 64, off = 0;
        char *fb = malloc(cap), path[256];
        json_t *kids;
        size_t i;

        off += (size_t)snprintf(fb + off, cap - off, "{\"sessions\":[");
        for (int k = 0; k < fork_n; k++)
            off += (size_t)snprintf(fb + off, cap - off, "%s\"bf-%d-%d-kid-%d\"", k ? "," : "", pid,
                                    r, k);
        snprintf(fb + off, cap - off, "]}");
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/fork", src);
        j = call(b, "POST", path, fb, 200, true, &ms);
        b->rows[R_FORK].absent = !j && route_absent(b->status);
        kids = j ? json_object_get(j, "children") : NULL;
        if (j && json_array_size(kids) == (size_t)fork_n) {
            json_t *kid;
            int ok = 0;

            json_array_foreach(kids, i, kid) {
                if (json_integer_value(json_object_get(kid, "status")) == 200) {
                    ok++;
                    release(b, str_of(kid, "rsid"), NULL);
                }
            }
            if (ok == fork_n) {
                add(&b->rows[R_FORK], ms);
            } else {
                fprintf(stderr, "fork: %d of %d children lent\n", ok, fork_n);
                b->failed++;
            }
        } else if (j) {
            fprintf(stderr, "fork: an answer without %d children\n", fork_n);
            b->failed++;
        }
        json_decref(j);
        free(fb);
    }

    /* reset of one lent sandbox against release + seed of a session, alternating */
    {
        char path[256];

        snprintf(path, sizeof(path), "/v1/sandboxes/%s/reset", src);
        snprintf(rsid, sizeof(rsid), "bf-%d-%d-cycle", pid, r);
        for (int i = 0; i < samples; i++) {
            j = call(b, "POST", path, "{}", 200, true, &ms);
            if (j)
                add(&b->rows[R_RESET], ms);
            json_decref(j);
            if (!j && route_absent(b->status)) {
                b->rows[R_RESET].absent = true;
                break;
            }
        }
        for (int i = 0; i < samples; i++) {
            double t0 = bench_now_ms();

            if (i > 0)
                release(b, rsid, NULL);
            if (seed(b, rsid, "{\"task_id\":\"bench-fork\"}", id, NULL) == 0 && i > 0)
                add(&b->rows[R_CYCLE], bench_now_ms() - t0);
        }
        release(b, rsid, NULL);
    }

    snprintf(rsid, sizeof(rsid), "bf-%d-%d-src", pid, r);
    release(b, rsid, NULL);
    if (rb == 0)
        delete_image(b, snap_b);
    if (ra == 0)
        delete_image(b, snap_a);
}

static void print_row(struct run *b, enum row k, int fork_n)
{
    struct samples *sm = &b->rows[k];
    struct bench_stat st;
    char label[64];

    if (k == R_FORK)
        snprintf(label, sizeof(label), "fork of %d children, wall", fork_n);
    else
        snprintf(label, sizeof(label), "%s", row_label[k]);
    if (sm->absent) {
        printf("  %-34s %s\n", label, "n/a (route absent)");
        return;
    }
    bench_stat_of(sm->v, sm->n, &st);
    if (st.n_ok == 0)
        printf("  %-34s %s\n", label, "failed");
    else
        printf("  %-34s %9.2f %9.2f %9.2f %5d\n", label, st.p50_ms, st.p99_ms, st.max_ms, st.n_ok);
}

static double p50(struct run *b, enum row k)
{
    struct bench_stat st;

    if (b->rows[k].absent)
        return 0;
    bench_stat_of(b->rows[k].v, b->rows[k].n, &st);
    return st.n_ok ? st.p50_ms : 0;
}

static void print_ratio(const char *what, double num, double den, const char *goal)
{
    if (num > 0 && den > 0)
        printf("  %-34s %6.2fx   (%.2f / %.2f ms; goal %s)\n", what, num / den, num, den, goal);
    else
        printf("  %-34s n/a\n", what);
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
    fprintf(stderr, "usage: lendbox-bench-fork --url URL --token TOKEN --floor-uid UID "
                    "--supervise PATH\n"
                    "  [--rounds R] [--samples K] [--fork-n N] [--bwrap PATH] "
                    "[--workdir /workspace]\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"url", required_argument, NULL, 'L'},       {"token", required_argument, NULL, 'T'},
        {"floor-uid", required_argument, NULL, 'u'}, {"supervise", required_argument, NULL, 's'},
        {"rounds", required_argument, NULL, 'r'},    {"samples", required_argument, NULL, 'k'},
        {"fork-n", required_argument, NULL, 'f'},    {"bwrap", required_argument, NULL, 'b'},
        {"workdir", required_argument, NULL, 'w'},   {NULL, 0, NULL, 0}};
    const char *bwrap = "/usr/bin/bwrap", *supervise = NULL, *workdir = "/workspace";
    struct run b = {0};
    struct bench_floor fl = {.supervise_fd = -1};
    int rounds = 3, samples = 10, fork_n = 64, o;
    long floor_uid = -1;

    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'L':
            b.url = optarg;
            break;
        case 'T':
            b.token = optarg;
            break;
        case 'u':
            floor_uid = strtol(optarg, NULL, 10);
            break;
        case 's':
            supervise = optarg;
            break;
        case 'r':
            rounds = atoi(optarg);
            break;
        case 'k':
            samples = atoi(optarg);
            break;
        case 'f':
            fork_n = atoi(optarg);
            break;
        case 'b':
            bwrap = optarg;
            break;
        case 'w':
            workdir = optarg;
            break;
        default:
            usage();
            return 2;
        }
    }
    if (!b.url || !b.token || floor_uid <= 0 || !supervise || rounds <= 0 || samples <= 1 ||
        fork_n <= 0 || fork_n > 1024 || workdir[0] != '/') {
        usage();
        return 2;
    }
    if (bench_floor_init(&fl, bwrap, workdir, supervise, (uid_t)floor_uid) < 0)
        return 2;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    b.c = curl_easy_init();
    print_load("at start");
    for (int r = 0; r < rounds; r++)
        round_run(&b, &fl, r, samples, fork_n);
    print_load("at end");

    printf("\n%d rounds, each: %d floor runs, 2 snapshots, %d + %d seeds, a fork of %d, %d resets "
           "and %d releases + seeds\n",
           rounds, samples, samples, samples, fork_n, samples, samples - 1);
    printf("  %-34s %9s %9s %9s %5s\n", "measure", "p50 ms", "p99 ms", "max ms", "n");
    for (int k = 0; k < R_N; k++)
        print_row(&b, (enum row)k, fork_n);
    printf(" ratios of p50s:\n");
    print_ratio("seed snapshot / base image", p50(&b, R_SEED_SNAP), p50(&b, R_SEED_BASE),
                "<= 1.2x");
    print_ratio("reset / (release + seed)", p50(&b, R_RESET), p50(&b, R_CYCLE),
                "<= 0.5x, reset <= 3 ms");
    print_ratio("seed from snapshot / floor", p50(&b, R_SEED_SNAP), p50(&b, R_FLOOR), "-");

    for (int k = 0; k < R_N; k++)
        free(b.rows[k].v);
    bench_sink_release(&b.s);
    curl_easy_cleanup(b.c);
    curl_global_cleanup();
    bench_floor_release(&fl);
    return b.failed ? 1 : 0;
}
