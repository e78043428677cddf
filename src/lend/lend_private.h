/*
 * lend_private.h - what the files of the lending service share and nothing else includes:
 * lend.c, seed.c, stop.c, ops.c, render.c, activity.c and idle.c. The state of struct lb_lend and
 * the helpers one of them defines for the others. Everything outside src/lend/ uses lend.h (routes,
 * main) or lend_internal.h (the warm pool, the sweeper, activations).
 *
 * Thread-safety: as lend.h; fields set in lend_new are read-only afterwards, the session locks
 * and fences have their own mutexes, draining is atomic.
 */
#ifndef LB_LEND_PRIVATE_H
#define LB_LEND_PRIVATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uthash.h>

#include "lend/admission.h"
#include "lend/lend.h"
#include "lend/lend_internal.h"

/* A session's lock: held while a seed, release or delete of the session runs. held, refs and
 * the wait on cond are all under lb_lend.locks_mutex (a flag and a condition rather than a mutex
 * of its own, so that waiting is bounded on the monotonic clock with calls every sanitizer and
 * libc knows). */
struct lend_session_lock {
    char *rsid;
    pthread_cond_t cond; /* signalled when held goes false */
    bool held;
    int refs;
    UT_hash_handle hh;
};

/* A fork's implicit snapshot, pinned while the fork runs: not collected before its children
 * are recorded (fork.c). */
struct lend_fork_pin {
    struct lend_fork_pin *next;
    char name[];
};

/* A sandbox's operate-token fence: up while exclusive > 0. */
struct lend_fence {
    char *id;
    int exclusive;  /* exclusive execs of the sandbox under way */
    int writers;    /* operate-token writes in progress (lend_fence_enter) */
    int readers;    /* operate-token reads in progress (lend_fence_enter_read) */
    char since[32]; /* when the fence went up, ISO 8601 UTC */
    UT_hash_handle hh;
};

/* A sandbox's activity (activity.c): all fields under lb_lend.act_mutex. */
struct lend_activity {
    char *id;
    int64_t last_s;     /* last activity, Unix seconds (what leases show) */
    int64_t last_ms;    /* the same on the monotonic clock (what the idle sweep compares) */
    int busy;           /* its processes requests still wait on (lend_exec under way) */
    int64_t idle_ms;    /* the seed's idle_timeout_s in ms; 0: none */
    bool on_idle_pause; /* the seed's on_idle is "pause" (else "stop") */
    bool params_known;  /* idle_ms and on_idle_pause were read from its record */
    bool may_be_paused; /* paused by the idle sweep or a pause request, or not known: the next
                           activity asks the provider and resumes it (on_idle "pause" only) */
    bool idle_paused;   /* the idle sweep paused it: not idle again until resumed */
    bool gone;          /* stopped while busy: the last lend_activity_leave frees it */
    UT_hash_handle hh;
};

struct lb_lend {
    struct lb_lend_config cfg;
    char *default_image, *workdir, *public_url;
    char *images_dir;
    unsigned char *operate_key;
    struct lb_store *store;
    struct lb_registry *providers;
    atomic_bool draining;
    pthread_mutex_t locks_mutex;
    struct lend_session_lock *locks;
    lb_lend_release_hook release_hook;
    void *release_ctx;
    lb_lend_stopped_hook stopped_hook;
    void *stopped_ctx;
    _Atomic(struct lb_provider *)
        warm_prov; /* a warm pool's provider (lend_set_warm); NULL: none */
    pthread_mutex_t warm_mutex;
    pthread_cond_t warm_cond;  /* broadcast when warm_gen grows */
    _Atomic uint64_t warm_gen; /* lend_warm_generation: grows under warm_mutex, read without */
    struct lend_pool_slots pool_slots; /* lend_set_pool_slots; under warm_mutex */
    pthread_mutex_t fence_mutex;
    pthread_cond_t fence_cond; /* signalled when a fence's writers reach 0 */
    struct lend_fence *fences;
    pthread_mutex_t capture_mutex; /* one snapshot capture (freeze, copy, thaw) at a time: a
                                      second one of the same sandbox would see it frozen and
                                      copy on after the first thawed it */
    pthread_mutex_t fork_mutex;    /* fork_pins, and each collection's check-then-remove */
    struct lend_fork_pin *fork_pins;
    pthread_mutex_t act_mutex; /* acts */
    struct lend_activity *acts;
    pthread_mutex_t idle_op_mutex; /* an idle pause, or the resume of a paused sandbox */
    int64_t started_s;             /* when lend_new ran: idle clocks start here at the latest */
    bool idle_loaded;              /* the sweeper thread's: idle settings of lent sandboxes read */
    struct lend_admission *admission; /* creates at once and seeds waiting; NULL: no bound */
};

/* lend.c: the image a seed that names none runs on, resolved from list (a default image list,
 * "NAME" or "NAME NAME ... [host]"): the first name that is "host" or present under the
 * images dir now, else the list's first name. Written into buf (size bytes) and returned. */
const char *lend_default_image(const struct lb_lend *l, const char *list, char *buf, size_t size);

/* lend.c: let the activation service close the harness of a lent sandbox about to be stopped. */
void lend_before_stop(struct lb_lend *l, const struct lb_record *r);

/* lost.c: does record r say its sandbox was lost (stopped, or being stopped, reason lost)? */
bool lend_record_is_lost(const struct lb_record *r);
/* lost.c: -LB_E_LOST (410 sandbox_lost) with the message naming sandbox id. */
int lend_lost_error(const char *id, struct lb_error *err);
/* lost.c: the one place a provider's failure r of an operation on the lent sandbox id becomes
 * 410: -LB_E_LOST, -ENOENT or -EREMOTEIO while the record still says lent and the provider's
 * status says the sandbox is gone (stopped, error) is a loss (recorded, see lost.c) and returns
 * -LB_E_LOST; a record that says lost already returns -LB_E_LOST; a provider's -LB_E_LOST for a
 * sandbox lendbox is stopping becomes -ENOENT. Any other r is returned as it is. err gets the
 * message of what is returned. Blocks on the provider (its status, and a stop when lost). */
int lend_lost_check(struct lb_lend *l, const char *id, int r, struct lb_error *err);
/* lost.c: the provider's status of lent record r said "stopped" or "error": record the loss as
 * lend_lost_check does. -LB_E_LOST when the record says lost (or could not be stopped yet), 0
 * when lendbox was stopping it anyway. */
int lend_note_gone(struct lb_lend *l, const struct lb_record *r);

/* stop.c: retry the stops session rsid left pending (failed seed, failed release). 0 when none
 * is left, or the first failure. *n_stopped counts the ones that succeeded; the id of the last
 * one goes into stopped_id (stopped_id_len bytes) when stopped_id is not NULL. */
int lend_retry_pending(struct lb_lend *l, const char *rsid, int *n_stopped, char *stopped_id,
                       size_t stopped_id_len, struct lb_error *err);

/* ops.c: capture the lent sandbox id as the snapshot name (hidden: a fork's implicit one,
 * see image_snapshot_publish; labels: kept with it, or NULL; borrowed); info gets the new
 * image. The sandbox's operate-token fence is up during the capture. Errors as lend_snapshot
 * (name is not checked here). Blocks for the copy. */
struct lb_image_info;
int lend_snapshot_capture(struct lb_lend *l, const char *id, const char *name, bool hidden,
                          json_t *labels, struct lb_image_info *info, struct lb_error *err);

/* fork_collect.c: after record r stopped: when its image is a fork's implicit snapshot that nothing
 * stands on any more, remove it (logs its own failures). */
void lend_fork_collect_of(struct lb_lend *l, const struct lb_record *r);

/* fork_collect.c: the name prefix of a fork's implicit snapshot (a hidden image). */
#define LEND_FORK_PREFIX "fork-"
/* fork_collect.c: pin name against collection until lend_fork_unpin (0, or -ENOMEM). */
int lend_fork_pin(struct lb_lend *l, const char *name);
void lend_fork_unpin(struct lb_lend *l, const char *name);
/* fork_collect.c: remove the implicit snapshot name when it is one, is not pinned and no
 * record that is not stopped names it (logs its own failures). */
void lend_fork_collect(struct lb_lend *l, const char *name);

/* ops.c: the environment of a command in a sandbox whose record's spec is spec (parsed,
 * borrowed; NULL: none) and workdir workdir: the defaults (PATH, LANG, LENDBOX_WORKDIR) < the
 * image's Env < the seed's env < req_env (an object of strings, or NULL). A malloc'd
 * NULL-terminated array of malloc'd "K=V" strings (lend_exec_env_free), NULL without memory. */
char **lend_exec_env(json_t *spec, const char *workdir, json_t *req_env);
void lend_exec_env_free(char **env);

/* probe.c: run the ready probe of a sandbox's spec (spec "ready_probe", parsed, borrowed; none:
 * 0 at once) in the sandbox ref of prov, which need not be lent yet: "sh -c command" as root,
 * in an exec's default cwd (the image's WorkingDir when the seed named no workdir, else the
 * workdir), with the spec's env, its output bounded and dropped. Attempts every interval_ms
 * until one exits 0, each bounded by min(max(5 interval_ms, 1 s), what is left); the budget is
 * the spec's ready_timeout_ms (else lending.create_timeout_s) from since_ms (clock_mono_ms:
 * when the provider's create began, or the warm take). 0 once an attempt exits 0; -EREMOTEIO
 * (502) past the budget or when the sandbox is gone, the message naming the last attempt's
 * exit status (or timeout, or why it could not run) and the first 200 bytes of its stderr;
 * -ESHUTDOWN (503) when lending starts draining meanwhile; -ENOMEM. The caller stops the
 * sandbox on failure. Blocks for up to the budget; thread-safe. */
int lend_probe_run(struct lb_lend *l, struct lb_provider *prov, const struct lb_sandbox_ref *ref,
                   json_t *spec, int64_t since_ms, struct lb_error *err);

/* seed.c: lend_seed; fresh: a session with any live sandbox is -EEXIST (no reuse). */
int lend_seed_session(struct lb_lend *l, const char *rsid, const struct lb_seed_request *req,
                      bool fresh, json_t **lease_out, struct lb_error *err);

/* render.c: sandbox id's operate token of generation (0: the seed's; each reset takes the next,
 * recorded as the spec's "token_generation"), "lbo_" and the HMAC's hex, into token. 0 or < 0. */
int lend_operate_token(struct lb_lend *l, const char *id, int64_t generation, char token[4 + 65]);
/* render.c: the spec's "token_generation" (0 when it has none; spec may be NULL). */
int64_t lend_spec_token_generation(const json_t *spec);
/* activity.c: the activity of sandbox records (see activity.c for the model). */
/* A seed lent r (spec: its spec, parsed): its idle clock starts now. */
void lend_activity_seeded(struct lb_lend *l, const struct lb_record *r, json_t *spec);
/* An activity request on lent sandbox r (prov, ref: its provider and reference) is about to
 * reach it: its idle clock starts again; busy: a process of it runs until lend_activity_leave.
 * With on_idle "pause", a paused sandbox is resumed first. 0, or -EREMOTEIO (it could not be
 * resumed; nothing is held). Blocks on the provider only for that resume. */
int lend_activity_enter(struct lb_lend *l, const struct lb_record *r, struct lb_provider *prov,
                        const struct lb_sandbox_ref *ref, bool busy, struct lb_error *err);
/* The process a busy lend_activity_enter counted has ended (its end is activity too). */
void lend_activity_leave(struct lb_lend *l, const char *id);
/* Sandbox id was paused (paused) or resumed by a request (a resume counts as activity). */
void lend_activity_paused(struct lb_lend *l, const char *id, bool paused);
/* Record event type ("paused", "resumed", "idle") of sandbox id in the event feed with data
 * {"by": by} (by may be NULL: {}); a failure is logged (the change itself happened). */
void lend_note_event(struct lb_lend *l, const char *type, const char *id, const char *by);
/* Sandbox id was stopped: drop its entry (once no process of it is counted). */
void lend_activity_forget(struct lb_lend *l, const char *id);
/* The last activity of record r, Unix seconds: now while a process of it runs; without any
 * since this daemon started, its creation or the daemon's start, whichever is later. */
int64_t lend_last_activity(struct lb_lend *l, const struct lb_record *r);
/* lend_free: free every entry. */
void lend_activity_free_all(struct lb_lend *l);
/* For the idle sweep (idle.c). load: the idle settings of lent records recs[0..n) (entries made
 * as needed). idle_ids: the ids of the sandboxes idle now (*ids_out: malloc'd strings in a
 * malloc'd array, the caller frees both; set also on -ENOMEM, with what was collected).
 * is_idle: is sandbox id idle now (*pause: its on_idle is "pause")? mark_idle_paused: if id is
 * idle now, mark it paused for it (true; call with idle_op_mutex held, then pause it).
 * pause_failed: the pause after mark_idle_paused failed (idle again after idle_timeout_s). */
void lend_activity_load(struct lb_lend *l, const struct lb_record *recs, size_t n);
int lend_activity_idle_ids(struct lb_lend *l, char ***ids_out, size_t *n_out);
bool lend_activity_is_idle(struct lb_lend *l, const char *id, bool *pause);
bool lend_activity_mark_idle_paused(struct lb_lend *l, const char *id);
void lend_activity_pause_failed(struct lb_lend *l, const char *id);

/* The sandbox object's "usage" (lend.h): u's figures, null where unknown (< 0). A new
 * reference, or NULL when out of memory. */
json_t *lend_usage_json(const struct lb_usage *u);

/* render.c: the string key of record r's spec, or def when it has none; *holder is the parsed
 * spec (a new reference the caller drops with json_decref, also when def is returned). */
const char *lend_spec_string(const struct lb_record *r, const char *key, const char *def,
                             json_t **holder);

/* render.c: the hex SHA-256 of sandbox id's operate token into hash (LB_TOKEN_HASH_HEX + 1 bytes);
 * lend is a struct lb_lend * (an lb_store_token_hash_fn). 0 or < 0. */
int lend_operate_token_hash(void *lend, const char *id, char *hash);
/* render.c: the lease of record r (API.md); a new reference, NULL without memory. */
json_t *lend_render_lease(struct lb_lend *l, const struct lb_record *r, bool reused);

/* render.c: the lease of record r (API.md) with its spec already parsed (spec: r's spec_json as
 * JSON, borrowed). A new reference, NULL without memory. */
json_t *lend_render_lease_spec(struct lb_lend *l, const struct lb_record *r, json_t *spec,
                               bool reused);

/* render.c: the sandbox object (API.md) of record r; status NULL: guessed from the state;
 * details adds task, stop, error and image fields. A new reference, NULL without memory. */
json_t *lend_render_sandbox(const struct lb_record *r, const char *status, bool details);

/* ---- reset.c, for recycle.c ---- */
/* The sandbox a reset (or a recycle's reset) waits to fence. */
struct lend_reset_stall {
    struct lb_provider *prov;
    struct lb_sandbox_ref ref;
};
/* lend_fence_stall_fn of a reset (ctx: struct lend_reset_stall): thaws the sandbox when it is
 * paused, so that an act admitted before the fence can start (and be killed); always 0. */
int lend_reset_thaw(void *ctx, struct lb_error *err);

#endif
