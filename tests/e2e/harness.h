/*
 * harness.h - end-to-end test support: start the real lendboxd on loopback with its own state
 * dir, talk to it over real HTTP (libcurl), look at processes and files on the host.
 *
 * Binaries come from $LENDBOXD and $LENDBOX_SUPERVISE (the Makefile exports both).
 * Every function aborts the test (ck_abort) on harness failure, so tests stay short.
 */
#ifndef LBT_HARNESS_H
#define LBT_HARNESS_H

#include <check.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Built with ASan or TSan (their shadow memory makes RSS bounds meaningless; tests that bound
 * the daemon's memory bound its growth instead). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LBT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define LBT_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define LBT_SANITIZED_THREAD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LBT_SANITIZED_THREAD 1
#endif
#endif
/* How many times its own use the daemon's resident memory shows under the sanitizer it was
 * built with (the tests are built the same way): ASan's shadow and quarantine about double it,
 * TSan's shadow (as large as the memory it shadows) and its metadata about five times; a bound
 * on its growth is this many times the release build's. */
#if defined(LBT_SANITIZED_THREAD)
#define LBT_RSS_FACTOR 5
#elif defined(LBT_SANITIZED)
#define LBT_RSS_FACTOR 2
#else
#define LBT_RSS_FACTOR 1
#endif

struct lbt_daemon {
    pid_t pid;
    char state_dir[256];
    char base_url[128];
    char admin_token[256];
    char log_path[300];
    /* the local provider's uid range: one the harness claimed for this daemon host-wide
     * (lbt_claim_uid_range), so that daemons running at the same time on this machine, of
     * this run or another, never share a sandbox uid; or the test's own local.uid_base */
    unsigned uid_base, uid_count; /* uid_count: slots of 65536 ids */
    unsigned uid_claimed;         /* slots of the range the harness claimed for it (0: none) */
    /* the extra arguments of its last spawn, each followed by a tab: the harness's clean-up
     * restarts it with the same settings (its nft table, network range, cgroup parent) */
    char last_args[2048];
};

struct lbt_resp {
    long status;
    char *body; /* NUL-terminated (body may also hold NULs: use len) */
    size_t len;
    json_t *json; /* parsed body when it is JSON, else NULL */
    char request_id[128];
    char headers[4096]; /* raw response headers */
};

/* Start lendboxd with a fresh state dir under /tmp and extra arguments (NULL-terminated list
 * of strings, may be NULL); wait until /readyz is 200 (variant pool: and lbt_pool_settle). */
void lbt_daemon_start(struct lbt_daemon *d, const char *const *extra_args);
/* Same, on a state dir the test made (e.g. on a small tmpfs it mounted; removed by
 * lbt_daemon_cleanup), logging to log_path (NULL: <state_dir>.log). */
void lbt_daemon_start_at(struct lbt_daemon *d, const char *state_dir, const char *log_path,
                         const char *const *extra_args);
/* Same, reusing d->state_dir (a restart after lbt_daemon_kill). */
void lbt_daemon_restart(struct lbt_daemon *d, const char *const *extra_args);
/* Daemons spawned from now on by this process get RLIMIT_NOFILE n (soft and hard; 0: the
 * test's own). */
void lbt_set_daemon_fd_limit(unsigned long n);
/* SIGTERM and wait; returns the exit status (or -1 if it had to be killed). */
int lbt_daemon_stop(struct lbt_daemon *d);
/* lbt_daemon_stop, waiting at most wait_s seconds (lbt_daemon_stop: 60) before SIGKILL. */
int lbt_daemon_stop_within(struct lbt_daemon *d, int wait_s);
/* SIGKILL and reap. */
void lbt_daemon_kill(struct lbt_daemon *d);
/* Stop the daemon if running and remove its state dir (and sandboxes). */
void lbt_daemon_cleanup(struct lbt_daemon *d);

/* ---------- host-wide claims ----------
 * What two test runs on one machine (two clones' make check at once) must not share, and what
 * cannot be made unique by a pid (address ranges, port numbers, uid ranges), is claimed: index
 * i of a kind is held by holding flock(LOCK_EX) on LBT_CLAIM_DIR/<kind>.<i>. The kernel drops
 * the lock when the last holder ends, however it ends (a SIGKILL too), so a claim is never
 * stale; the shell scripts and the Python tests claim the same way (flock(1), fcntl.flock).
 * A claim is held by this process and the tests it forks until lbt_release or its exit. */
#define LBT_CLAIM_DIR "/run/lendbox-test"
/* Claim n consecutive indexes of kind in [0, count), none held by another process, trying the
 * runs from a random start; ok (may be NULL) may refuse a run that is free of claims but in use
 * otherwise. Returns the first index; aborts the test when no run is free. */
int lbt_claim(const char *kind, int count, int n, bool (*ok)(int first, int n));
/* Release n indexes of kind from first that this process claimed (others: ignored). */
void lbt_release(const char *kind, int first, int n);
/* A sandbox uid range of slots slots (65536 ids each) for a daemon: claimed blocks of 64 slots
 * in [1526 * 65536, 14966 * 65536), none in use by a slot claim of any lendboxd
 * (/run/lendbox/slots). Returns its uid_base (a multiple of 65536). */
unsigned lbt_claim_uid_range(unsigned slots);
void lbt_release_uid_range(unsigned uid_base, unsigned slots);

/* ---------- the shared fixture ----------
 * What a test case's daemon is: started before its tests, seeded, and cleaned up after them.
 * Every member but d may be 0/NULL. */
struct lbt_fixture {
    struct lbt_daemon *d;     /* the daemon the tests use (the program's static) */
    const char *const *args;  /* extra daemon arguments (NULL-terminated), NULL: none */
    const char *state_parent; /* the state dir's parent directory; NULL: /tmp */
    void (*prepare)(void);    /* before the daemon starts (host files, paths) */
    void (*seed)(void);       /* once the daemon is ready (seeds, tokens into statics) */
    void (*release)(void);    /* after the daemon's clean-up (host files, cgroups) */
    bool stop_clean;          /* the teardown asserts that the daemon exits 0 on SIGTERM */
    /* the tests start d themselves (each with arguments of its own): the fixture only
     * prepares, cleans up and releases */
    bool test_starts;
};
/* Give tc the fixture f (copied; f->args and the hooks must outlive the suite): shared, once
 * for all of tc's tests in the runner (an unchecked fixture: each test forks from a runner
 * that has the daemon); else once per test, inside the forked test (a checked fixture). The
 * clean-up runs whatever way the tests end: a failed assertion ends only the forked test, and
 * a daemon a test started or restarted itself gets SIGTERM (its shutdown sweep) when that test
 * process ends, and the runner sweeps every state dir still in use after the suite (see
 * lbt_run_suite). At most 16 fixtures per program; aborts beyond. */
void lbt_fixture_add(TCase *tc, const struct lbt_fixture *f, bool shared);
/* The common case: a shared daemon with args (may be NULL), nothing else. */
void lbt_shared_daemon(TCase *tc, struct lbt_daemon *d, const char *const *args);
/* The tests of tc start d themselves: clean it up after each (a checked fixture). */
void lbt_test_daemon_cleanup(TCase *tc, struct lbt_daemon *d);

/* One HTTP request. token NULL: no Authorization header; "" : admin token. body may be NULL.
 * content_type NULL: application/json when body is given. */
void lbt_request(struct lbt_daemon *d, const char *method, const char *path, const char *token,
                 const void *body, size_t body_len, const char *content_type,
                 struct lbt_resp *resp);
/* JSON convenience: body_json is a JSON text (or NULL). */
void lbt_json(struct lbt_daemon *d, const char *method, const char *path, const char *token,
              const char *body_json, struct lbt_resp *resp);
void lbt_resp_free(struct lbt_resp *resp);
/* POST /v1/sessions/<rsid>/release and assert 200 (the test fails otherwise). */
void lbt_release_session(struct lbt_daemon *d, const char *rsid);

/* Seed rsid with task_id and optional extra JSON members (e.g. "\"ttl_s\": 5"); asserts 200 and
 * returns the lease (caller decrefs). */
json_t *lbt_seed(struct lbt_daemon *d, const char *rsid, const char *task_id,
                 const char *extra_members);
/* The error code string of an error response ("" if none). */
const char *lbt_error_code(const struct lbt_resp *resp);

/* Host-side facts. Another run of the same programs may run the same command lines at the same
 * time, so scans by command line count only processes of this run (lbt_proc_of_run); scans by uid
 * are given uids of this run's claimed ranges. */
/* Does uid lie in a uid range this process claimed (lbt_claim_uid_range)? */
bool lbt_uid_claimed(uid_t uid);
/* Is /proc entry pid (decimal) a process of this run: its real uid lies in a range this process
 * claimed (a sandbox's processes, also one left behind: it keeps its uid), or it descends from
 * this test program's process (the daemons it started and their helpers)? On the
 * engine variants (docker, lxd), where the engine starts the processes: it descends from this
 * run's engine (a conmon of this run's podman root, or a monitor or forkexec of this run's LXD
 * cluster directory) or from this program. */
bool lbt_proc_of_run(const char *pid);
/* Does a line of /proc/PID/cgroup contain needle (e.g. a sandbox id: a local sandbox's cgroup is
 * <cgroup parent>/<sandbox id>)? false when unreadable. */
bool lbt_proc_cgroup_has(pid_t pid, const char *needle);
/* The parent pid of pid (field 4 of /proc/PID/stat), or 0 when it cannot be read. */
pid_t lbt_proc_ppid(pid_t pid);
/* A file read to its end (a /proc file: no size known ahead), NUL-terminated, malloc'd (the
 * caller frees it); *len_out (may be NULL) its length without the NUL; NULL when unreadable. */
char *lbt_proc_read(const char *path, size_t *len_out);
int lbt_count_procs_of_uid(uid_t uid);
/* Processes of this run whose cmdline contains needle. */
int lbt_count_procs_cmdline(const char *needle);
bool lbt_path_exists(const char *path);
/* The host uid the sandbox's processes run as, from its descriptor in GET /v1/sandboxes. */
uid_t lbt_sandbox_uid(struct lbt_daemon *d, const char *sandbox_id);
/* Sleep milliseconds. */
void lbt_sleep_ms(long ms);

/* ---------- additions for the acceptance tests ---------- */

/* lbt_request with extra headers ("Name: value", NULL-terminated list, may be NULL). With
 * chunked, the body is sent with "Transfer-Encoding: chunked" and no Content-Length (through a
 * read callback). */
void lbt_request_ex(struct lbt_daemon *d, const char *method, const char *path, const char *token,
                    const void *body, size_t body_len, const char *content_type,
                    const char *const *headers, bool chunked, struct lbt_resp *resp);

/* A request run on its own thread with its own curl handle; join to get the response. */
struct lbt_async;
struct lbt_async *lbt_async_json(struct lbt_daemon *d, const char *method, const char *path,
                                 const char *token, const char *body_json);
void lbt_async_join(struct lbt_async *a, struct lbt_resp *resp);
/* Has the response arrived (join will not block)? */
bool lbt_async_done(struct lbt_async *a);

/* POST /v1/sandboxes/{id}/exec with a JSON body. */
void lbt_exec(struct lbt_daemon *d, const char *sandbox_id, const char *token,
              const char *body_json, struct lbt_resp *resp);
/* Same, asserting 200 and a JSON body; returns the result (caller decrefs). */
json_t *lbt_exec_ok(struct lbt_daemon *d, const char *sandbox_id, const char *token,
                    const char *body_json);
/* Run a shell command as admin, assert 200 and return code 0, return a malloc'd stdout. */
char *lbt_sh(struct lbt_daemon *d, const char *sandbox_id, const char *command);
/* lbt_sh every 100 ms until command's stdout is want, at most tries times; whether it was. */
bool lbt_sh_until(struct lbt_daemon *d, const char *sandbox_id, const char *command,
                  const char *want, int tries);

/* PUT / GET /v1/sandboxes/{id}/files?path=...[&mode=...] (path URL-encoded here). */
void lbt_file_put(struct lbt_daemon *d, const char *sandbox_id, const char *token, const char *path,
                  const char *mode, const void *data, size_t len, struct lbt_resp *resp);
void lbt_file_get(struct lbt_daemon *d, const char *sandbox_id, const char *token, const char *path,
                  struct lbt_resp *resp);

/* Assert an error response: status, {"error": {"code": code, "message": non-empty}} and nothing
 * else, and an X-Request-Id header. */
void lbt_assert_error(const struct lbt_resp *resp, long status, const char *code);
/* Assert that the response carries an X-Request-Id (equal to want unless want is NULL). */
void lbt_assert_request_id(const struct lbt_resp *resp, const char *want);

/* GET /v1/sandboxes as admin (asserts 200); returns the "sandboxes" array (caller decrefs). */
json_t *lbt_list_sandboxes(struct lbt_daemon *d);
/* The record with sandbox_id id in a list (borrowed), or NULL. */
json_t *lbt_find_record(json_t *sandboxes, const char *id);
/* The daemon's record of sandbox id from GET /v1/sandboxes (a new reference; NULL if absent). */
json_t *lbt_record(struct lbt_daemon *d, const char *id);
struct lbt_ids;
bool lbt_ids_has(const struct lbt_ids *s, const char *id);
/* The daemon's records in state (GET /v1/sandboxes?state=STATE), oldest first, into out;
 * asserts a 200 and that each row is in that state. */
void lbt_records_in_state(struct lbt_daemon *d, const char *state, struct lbt_ids *out);
/* Seconds since the epoch of an RFC 3339 UTC time ("2026-12-02T13:54:06Z"); asserts it parses. */
time_t lbt_parse_time(const char *rfc3339);
/* A counter's value in the daemon's /metrics (the line "NAME value", NAME with its labels and
 * a trailing space), or -1 when no line starts with NAME. */
long lbt_metric(struct lbt_daemon *d, const char *name);
/* How many records of the list belong to resources session rsid. */
int lbt_count_records_of_session(json_t *sandboxes, const char *rsid);
/* GET /healthz is 200 {"status":"ok"}. */
void lbt_assert_healthy(struct lbt_daemon *d);

/* <state_dir>/sandboxes/<id>/descriptor.json, or NULL when it does not exist. */
json_t *lbt_read_descriptor(struct lbt_daemon *d, const char *sandbox_id);
/* Directories anywhere under /sys/fs/cgroup whose name contains needle. */
int lbt_count_cgroup_dirs(const char *needle);
/* Live (not zombie) processes of uid. */
int lbt_count_live_procs_of_uid(uid_t uid);
/* Processes of this run whose whole command line (arguments joined by spaces) equals cmdline. */
int lbt_count_procs_exact(const char *cmdline);
/* Live processes of uid whose whole command line equals cmdline. */
int lbt_count_procs_of_uid_exact(uid_t uid, const char *cmdline);
/* Lines of d's log that contain needle (0 when there is no log). */
int lbt_log_count(const struct lbt_daemon *d, const char *needle);
/* Has the daemon read everything sent on fd, a client TCP socket to it over IPv4 loopback
 * (its end's receive queue in /proc/net/tcp is empty)? false also when the connection is not
 * found. For waits on "the daemon has the request" instead of a fixed sleep. */
bool lbt_request_read(int fd);
/* Wait until d (listening on IPv4 loopback) has accepted every connection made to it so far
 * (its listening socket's accept queue in /proc/net/tcp is empty). */
void lbt_wait_accepted(const struct lbt_daemon *d);
/* Distinct uids in [lo, hi) of live processes, sorted, into out (at most max); returns count. */
int lbt_uids_in_range(uid_t lo, uid_t hi, uid_t *out, int max);
/* Warm pools (variant "pool", or a test's own [pool]): a daemon's warm sandboxes are records in
 * state "warm" lent to no session, each with its processes under its own sandbox uid, and a
 * refill starts a new one (perhaps in a uid a stopped sandbox just freed) whenever a seed takes
 * one. Tests that count sandboxes, processes, uids or sandbox dirs count the lent ones only. */
#define LBT_ID_MAX 64
/* Sandbox ids, as lbt_records_in_state lists them (at most LBT_IDS_MAX kept). */
#define LBT_IDS_MAX 64
struct lbt_ids {
    int n;
    char id[LBT_IDS_MAX][LBT_ID_MAX];
};
/* Variant pool: wait (at most 60 s) until d's pool is full with no refill under way, or its
 * warm and refilling counts did not change for 2 s (no room, failing or stalled creations).
 * Other variants, or d not running: returns at once. */
void lbt_pool_settle(struct lbt_daemon *d);
/* lbt_list_sandboxes, but in variant pool without the records lent to no session (the pool's:
 * warm, refilling, or stopped). Only for tests that start no sandbox lent to no session. */
json_t *lbt_list_sandboxes_but_pool(struct lbt_daemon *d);
/* The ids of d's warm records (at most max) into ids; their count (0 when d is not running:
 * its sandboxes are then counted as any). */
int lbt_warm_ids(struct lbt_daemon *d, char ids[][LBT_ID_MAX], int max);
/* Is sandbox id one of d's warm records? */
bool lbt_is_warm(struct lbt_daemon *d, const char *id);
/* lbt_uids_in_range(lo, hi) without the uids of d's warm sandboxes' slots (each 65,536 ids from the
 * uid of its descriptor): the uids of lent sandboxes (and of any starting: lbt_pool_settle first).
 * Sorted. */
int lbt_lent_uids(struct lbt_daemon *d, uid_t lo, uid_t hi, uid_t *out, int max);
/* A numeric field of /proc/PID/status in kB (e.g. "VmRSS"), -1 if unreadable. */
long lbt_proc_status_kb(pid_t pid, const char *field);

/* Base64 (standard alphabet, padded). Results are malloc'd; decode returns NULL on bad input. */
char *lbt_b64_encode(const void *data, size_t len);
unsigned char *lbt_b64_decode(const char *text, size_t *len_out);
/* Monotonic clock in seconds. */
double lbt_now(void);
/* Fill buf with deterministic pseudo-random bytes from seed. */
void lbt_fill_random(void *buf, size_t len, unsigned seed);

/* ---------- variants ----------
 * LENDBOX_E2E_VARIANT picks what every daemon started by the harness runs its sandboxes on:
 * "host" (the default: the host's / read-only), "image" (local.default_image = a test image
 * built from this machine's Debian files by tests/images/make-variant-image, pre-imported once
 * and linked into each daemon's image store; LENDBOX_E2E_IMAGE_DIR says where, default
 * $LENDBOX_SRCDIR/build/e2e-image) or "docker" (provider.name = docker against a private podman
 * API service and its busybox test image lbtest:latest; where podman cannot run, the program
 * prints SKIP and passes) or "pool" (the host's root, and every daemon keeps a warm pool of
 * LBT_VARIANT_POOL_SIZE sandboxes, pool.size, unless the test sets its own: their records are
 * in state "warm", lent to no session, and each runs as a sandbox uid; tests that count
 * sandboxes, processes or uids count only the lent ones, see lbt_warm_ids) or "lxd-pool" (the
 * lxd variant's daemons each with the pool variant's pool: lbt_variant_is("lxd") and
 * lbt_variant_is("pool") are both true). An unknown name exits the test program (status 2). */
#define LBT_VARIANT_POOL_SIZE "2"

/* The variant's name ("host", "image"); a static string. Thread-safe. */
const char *lbt_variant(void);
/* Is the variant name, or name one part of a combined variant ("lxd-pool": "lxd", "pool")? */
bool lbt_variant_is(const char *name);
/* The image a seed that names none runs on in this variant ("host", or the test image's name);
 * what its lease's "image" says. A static string. */
const char *lbt_variant_image(void);
/* Do seeds that name no image run on the host's root (lbt_variant_image() is "host")? Tests that
 * assert what the host's root looks like from inside (read-only /, host files visible) check
 * this and assert the image's behaviour otherwise. */
bool lbt_variant_on_host(void);
/* The provider every daemon's seeds run on in this variant: "local", or "docker" (variant
 * "docker": provider.name = docker against a private podman API service, tests/podman-service;
 * LENDBOX_E2E_PODMAN_DIR names one already started, else each program starts its own). A static
 * string. Thread-safe. */
const char *lbt_variant_provider(void);
/* Engine variants: the containers (docker) or instances (lxd; also those whose
 * user.lendbox.instance is needle) whose name contains needle (a sandbox id: lendbox names them
 * lendbox-<instance>-<sandbox id>), in any state or (running_only) running, as the engine lists
 * them; -1 on other variants or when the engine does not answer. */
int lbt_variant_count_containers(const char *needle, bool running_only);
/* The docker variant: remove (force: a running one is killed) every container of this run's
 * podman service whose name contains needle, behind the daemon's back. Returns how many. */
int lbt_variant_remove_containers(const char *needle);
/* Is the variant an engine provider's (docker, lxd): sandboxes are engine objects (containers,
 * instances) with no host uid of their own, counted by lbt_variant_count_containers? */
bool lbt_variant_engine(void);
/* Why the variant cannot do capability ("activations", "exclusive", "user_names",
 * "disk_quota", "sealed_receipt": an activation receipt no sandbox process can write), or NULL
 * when it can. A static string. */
const char *lbt_variant_lacks(const char *capability);
/* Variant lxd: member a's unix socket (NULL on other variants), and GET path through it as
 * JSON (NULL when LXD does not answer; the caller decrefs). */
const char *lbt_variant_lxd_socket(void);
json_t *lbt_lxd_get(const char *path);
/* Any request through member a's socket (body JSON text or NULL); an async answer's operation
 * is awaited (up to 60 s) and the operation's answer returned. NULL when LXD does not answer. */
json_t *lbt_lxd_request(const char *method, const char *path, const char *body);
/* scripts/lxd-cluster ARGS (LENDBOX_E2E_LXD_CLUSTER names another copy; its output to stderr):
 * its exit status, or -1 when it did not exit. */
int lbt_lxd_cluster(const char *args);
/* The member that instance id is on, into buf ("" when LXD does not know it); fails the test
 * when LXD does not answer. */
void lbt_lxd_location(const char *id, char *buf, size_t size);
/* Variant docker: GET path (e.g. "/images/json") from the podman service as JSON (NULL on
 * other variants or when it does not answer; the caller decrefs). */
json_t *lbt_podman_get(const char *path);
/* Print (stderr) that test is skipped on this variant and why. Use LBT_SKIP_ON_VARIANT. */
void lbt_skip_note(const char *test, const char *why);
/* In a test body: on variant name, print why and end the test (it counts as passed). Only for
 * what the variant cannot do by design, never to hide a bug. */
/* In a test body: on an engine variant (docker, lxd), print why and end the test. */
#define LBT_SKIP_ON_ENGINE(why)                                                                    \
    do {                                                                                           \
        if (lbt_variant_engine()) {                                                                \
            lbt_skip_note(__func__, why);                                                          \
            return;                                                                                \
        }                                                                                          \
    } while (0)
/* In a test body: when the variant lacks capability, print why and end the test. */
#define LBT_SKIP_UNLESS_CAN(capability)                                                            \
    do {                                                                                           \
        const char *lbt_why_ = lbt_variant_lacks(capability);                                      \
        if (lbt_why_) {                                                                            \
            lbt_skip_note(__func__, lbt_why_);                                                     \
            return;                                                                                \
        }                                                                                          \
    } while (0)
#define LBT_SKIP_ON_VARIANT(name, why)                                                             \
    do {                                                                                           \
        if (lbt_variant_is(name)) {                                                                \
            lbt_skip_note(__func__, why);                                                          \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* Run one suite (each program's main): the variant's setup, the suite, then the registry sweep
 * (every daemon any process of this program started is stopped if it still runs, and sandboxes
 * still recorded in its state dir are stopped by a daemon started there for that), then the
 * variant's teardown. Returns the exit status. */
int lbt_run_suite(Suite *s);

#endif
