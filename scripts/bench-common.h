/*
 * bench-common.h - what the bench programs (scripts/bench.c, bench-docker.c, bench-side.c,
 * bench-fork.c) share: the clock, HTTP calls through libcurl, percentiles, the bwrap floor, and
 * the two kinds of episode
 * (seed -> exec `true` -> release) they time: through lendbox's API and directly through a
 * Docker-compatible engine API. Not part of the daemon; nothing here asserts on speed.
 *
 * Thread-safety: every function touches only its arguments; a CURL handle and a bench_sink
 * belong to one thread at a time. curl_global_init must have run before the first call.
 */
#ifndef LB_BENCH_COMMON_H
#define LB_BENCH_COMMON_H

#include <curl/curl.h>
#include <stddef.h>
#include <sys/types.h>

/* CLOCK_MONOTONIC in milliseconds. */
double bench_now_ms(void);

/* A response body, grown as needed (a list of thousands of records); buf is NUL-terminated
 * after bench_http. Zero-initialize; bench_sink_release frees buf. */
struct bench_sink {
    char *buf;
    size_t len, cap;
};
void bench_sink_release(struct bench_sink *s);

/* One HTTP request on c (curl_easy_reset first, so the connection cache stays): method
 * ("POST", "DELETE", ...), url, body (NULL: none), token (NULL: no Authorization header),
 * unix_socket (NULL: TCP; else the engine's socket, and the connection is not reused, as a
 * docker client would not: exec start hijacks it). The body lands in s.
 * Returns the HTTP status, or 0 when the request failed (also when memory ran out). */
long bench_http(CURL *c, const char *method, const char *url, const char *body, const char *token,
                const char *unix_socket, struct bench_sink *s);

/* Percentiles (nearest rank) of the samples of v[0..n) that are >= 0 (a failed episode
 * records -1). v is compacted and sorted in place: the kept samples first, then -1s (so calling
 * again gives the same answer). n_ok: how many were kept. */
struct bench_stat {
    int n_ok;
    double p50_ms, p99_ms, max_ms;
};
void bench_stat_of(double *v, int n, struct bench_stat *st);

/* Print "  STEP  p50 .. ms   p99 .. ms   max .. ms" for v[0..n) (sorts v, see above). */
void bench_print_stat(const char *step, double *v, int n);

/* A lendboxd to run episodes against. seed_body: the seed's JSON. */
struct bench_lendbox {
    const char *url, *token, *seed_body;
};

/* One episode on lendbox: POST /v1/sessions/SESSION/seed, POST /v1/sandboxes/ID/exec with
 * argv ["true"] (return_code 0 required), POST /v1/sessions/SESSION/release. ms[0..2] get the
 * three steps' times. Returns 0, or -1 after printing the failed step's answer to stderr. */
int bench_lendbox_episode(CURL *c, const struct bench_lendbox *lb, const char *session,
                          struct bench_sink *s, double ms[3]);

/* A Docker-compatible engine (podman's API service, tests/podman-service). supervise: the
 * host path of lendbox-supervise, bind-mounted as the container's init, as the docker provider
 * does. */
struct bench_docker {
    const char *socket, *image, *supervise;
};

/* One episode done directly on the engine, the docker provider's own requests without
 * lendbox: seed = container create (image, supervisor bind, tmpfs workdir and /tmp, no
 * network, labels) + start; exec = exec create + start of `lendbox-supervise --framed ... --
 * true`, its stream read to the end; release = DELETE ?force&v. name: the container's name.
 * ms[0..2] as above. Returns 0, or -1 after printing what failed to stderr (a container
 * created before the failure is removed). */
int bench_docker_episode(CURL *c, const struct bench_docker *d, const char *name,
                         struct bench_sink *s, double ms[3]);

/* The bwrap floor: bare bwrap with the namespaces and mounts of a lendbox sandbox of the
 * default class, running `true` as an unprivileged uid: no daemon, no HTTP, no SQLite, no
 * cgroup. argv: its command line (LENDBOX_BENCH_DEBUG set: printed to stderr at init). */
struct bench_floor {
    char **argv;
    int supervise_fd; /* lendbox-supervise, bound at /run/lendbox/supervise; -1: not bound */
    uid_t uid;
};

/* Build f's command line for bwrap (its path), workdir (absolute) and supervise (the host
 * path of lendbox-supervise, or NULL); episodes run as uid. 0, or -1 after printing why.
 * Release with bench_floor_release. */
int bench_floor_init(struct bench_floor *f, const char *bwrap, const char *workdir,
                     const char *supervise, uid_t uid);

/* One floor episode: fork, become f->uid, exec bwrap ... true, wait; *ms: its time. 0, or -1
 * (printed) when bwrap failed. */
int bench_floor_episode(const struct bench_floor *f, double *ms);

void bench_floor_release(struct bench_floor *f);

#endif
