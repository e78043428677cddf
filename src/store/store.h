/*
 * store.h - SQLite records of every sandbox lendbox started. The only SQL in lendbox.
 *
 * A table of sandbox records (DESIGN.md "Records") and one of harness activations, in WAL
 * mode with a busy timeout, numbered migrations kept in PRAGMA user_version, prepared
 * statements. A record is written
 * before the provider acts (state "starting", "stopping") and leaves the live set only when the
 * provider confirmed the sandbox gone ("stopped"). Stopped records stay for a retention period
 * so "already released" can be told from "never existed".
 *
 * States: starting -> lent -> stopping -> stopped, plus the retryable side states
 * failed_seed (a seed's rollback stop failed) and stop_failed (a release/delete stop failed).
 * At most one record per resources session is "live" (starting or lent): a partial unique index.
 *
 * Times are Unix seconds; 0 means "none" (expires_at, next_attempt_at).
 *
 * A write that fails for lack of space returns -ENOSPC. The record updates of stops (stopping,
 * stopped, stop failed) first spend a space reserve kept for them (store_reserve_init).
 *
 * Thread-safety: a struct lb_store is one connection guarded by a mutex; every function may be
 * called from any thread. Records returned are copies the caller owns (store_record_release).
 */
#ifndef LB_STORE_H
#define LB_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "util/error.h"

enum lb_record_state {
    LB_STATE_STARTING,
    LB_STATE_LENT,
    LB_STATE_STOPPING,
    LB_STATE_STOPPED,
    LB_STATE_FAILED_SEED,
    LB_STATE_STOP_FAILED,
    LB_STATE_WARM, /* a warm pool's sandbox (src/warm/): running, lent to nobody yet */
    LB_STATE_COUNT
};

/* "starting", "lent", ...; store_state_parse returns 0 or -EINVAL. */
const char *store_state_name(enum lb_record_state s);
int store_state_parse(const char *name, enum lb_record_state *out);

#define LB_ID_MAX 64
#define LB_TOKEN_HASH_HEX 64

struct lb_record {
    char id[LB_ID_MAX]; /* "sbx-..." */
    char *rsid;         /* resources session id; NULL for a sandbox lent to none */
    char *task_id;
    char *provider; /* provider name */
    enum lb_record_state state;
    char *spec_json;       /* the seed's spec as stored (image, workdir, env, ...) */
    char *descriptor_json; /* provider descriptor, NULL until create returned */
    char token_hash[LB_TOKEN_HASH_HEX + 1]; /* hex SHA-256 of the operate token, or "" */
    int64_t created_at;
    int64_t expires_at; /* 0: no TTL */
    int64_t updated_at;
    int stop_attempts;
    int64_t next_attempt_at; /* 0: no retry scheduled */
    char *last_error;        /* NULL or the last stop failure */
    char *stop_reason;       /* NULL or released, ttl, shutdown, seed_failed, vanished, deleted,
                                reset_failed, max_age, not_adopted, pool_shrunk, evicted,
                                class_changed */
    char *pool_class;        /* the warm pool class it was made for (src/warm/); NULL: none */
};

/* Free the strings a record holds (not the struct); safe on a zeroed record. */
void store_record_release(struct lb_record *r);

struct lb_store;

/* Open (creating if needed) the database file at path (mode 0600), enable WAL, set
 * busy_timeout, run pending migrations. *out is owned by the caller (store_close).
 * Errors: -EIO with the SQLite message, -ENOMEM. */
int store_open(const char *path, struct lb_store **out, struct lb_error *err);
void store_close(struct lb_store *st);

/* The space reserve (see reserve.c): keep reserve_bytes (0: none) allocated in <path>.reserve, for
 * the record updates of stops when the file system is full. Made now if there is room (a warning
 * if not). Errors: -EINVAL. Call once, before other threads use st. */
int store_reserve_init(struct lb_store *st, int64_t reserve_bytes, struct lb_error *err);

/* Can the store write? 0, or -ENOSPC (the file system is full: under 1 MiB free, or the space
 * reserve is spent and cannot be made again), -EROFS (read-only) or -EIO (the last write failed
 * and a write check, at most one a second, still fails), with a message. Makes a spent reserve
 * again when there is room (at most one try a second). A statvfs otherwise: cheap enough for
 * every /readyz. Thread-safe. */
int store_check_writable(struct lb_store *st, struct lb_error *err);

/* Insert a new record (normally state starting). max_live > 0: only while fewer than max_live
 * records are live (starting, lent, warm), checked and inserted in one statement (one
 * transaction), else -EUSERS; 0: no cap. -EEXIST if the session already has a live (starting
 * or lent) record, or the id exists; -ENOSPC while the space reserve is spent. Thread-safe. */
int store_insert_sandbox(struct lb_store *st, const struct lb_record *r, int64_t max_live,
                         struct lb_error *err);

/* store_insert_sandbox for a seed, which a warm pool's sandboxes hold capacity for: when the
 * cap is reached, the oldest warm record (any class) is claimed for stopping (state stopping,
 * stop_reason reason) and the insert tried again, in one transaction, so no refill can take
 * the place it gives. evicted_id gets the claimed record's id ("" if none was claimed, or on an
 * error); the caller stops that sandbox. Errors as store_insert_sandbox (-EUSERS when nothing
 * warm was there to give its place). Thread-safe. */
int store_insert_sandbox_evicting(struct lb_store *st, const struct lb_record *r, int64_t max_live,
                                  const char *reason, char evicted_id[LB_ID_MAX],
                                  struct lb_error *err);

/* Fetch by sandbox id into *out. -ENOENT if no such record. */
int store_get_sandbox(struct lb_store *st, const char *id, struct lb_record *out,
                      struct lb_error *err);

/* Whether sandbox id has a record in state lent (false for any other state, no record, or a
 * store that cannot be read). Thread-safe. */
bool store_sandbox_is_lent(struct lb_store *st, const char *id);

/* The session's live (starting or lent) record. -ENOENT if none. */
int store_get_live_by_rsid(struct lb_store *st, const char *rsid, struct lb_record *out,
                           struct lb_error *err);

/* The sandbox whose operate token hashes to token_hash (any state). -ENOENT if none. */
int store_get_by_token_hash(struct lb_store *st, const char *token_hash, struct lb_record *out,
                            struct lb_error *err);

struct lb_record_filter {
    const char *rsid;       /* NULL: any session */
    int state;              /* -1: any; else an enum lb_record_state */
    bool live_only;         /* only starting, lent, warm */
    bool pending_stop_only; /* only stopping, failed_seed, stop_failed */
    bool due_only;          /* with pending_stop_only: next_attempt_at <= now_s */
    bool expired_only;      /* only lent or warm with 0 < expires_at <= now_s */
    int64_t now_s;
    size_t limit; /* 0: no limit */
};

/* Records matching filter, oldest first. *out is a malloc'd array of *n_out records the caller
 * frees with store_records_free. */
int store_list_sandboxes(struct lb_store *st, const struct lb_record_filter *f,
                         struct lb_record **out, size_t *n_out, struct lb_error *err);
void store_records_free(struct lb_record *recs, size_t n);

/* starting -> lent: store the provider descriptor and the operate token hash. -ENOENT.
 * durable: the commit is made at synchronous = FULL (the WAL synced: the lease and every
 * record before it survive a power loss, docs/operations.md "Durability"); false: at NORMAL
 * (in the WAL, safe from a daemon crash), and the caller calls store_sync before it hands the
 * lease out (a batch of seeds or a fork's children share one sync instead of one each). */
int store_mark_lent(struct lb_store *st, const char *id, const char *descriptor_json,
                    const char *token_hash, bool durable, struct lb_error *err);

/* Make every lease committed with store_mark_lent(durable = false) so far durable: one
 * fsync(2) of the database's WAL (a checkpoint that moved frames to the database file synced
 * that file itself); nothing when there is none since the last sync. For those callers before
 * they answer, and before any lease is handed out (a seed's repeat, GET of a session). 0, or
 * -EIO and friends (err set; fault point "store.sync"). A failure is sticky: every later call
 * fails too (the kernel may drop the pages a failed fsync left, and a later fsync would say
 * "synced" of frames that are not), until the daemon is restarted. Thread-safe; holds the store
 * lock only to read how many leases were lent unsynced, never across the fsync. */
int store_sync(struct lb_store *st, struct lb_error *err);
/* Are there leases committed without their own sync that store_sync has not synced yet? */
bool store_sync_pending(struct lb_store *st);

/* Record the descriptor without changing state (a create that returned before a failure). */
int store_set_descriptor(struct lb_store *st, const char *id, const char *descriptor_json,
                         struct lb_error *err);

/* A renewal: set lent sandbox id's expires_at (Unix seconds, > 0) when its TTL has not passed
 * yet (expires_at 0 or later than now). -ENOENT when no such lent, unexpired sandbox exists,
 * -ENOSPC/-EIO from the store. Thread-safe. */
int store_set_expires(struct lb_store *st, const char *id, int64_t expires_at,
                      struct lb_error *err);

/* Any state -> stopping with a stop reason (keeps an earlier reason if reason is NULL). */
int store_mark_stopping(struct lb_store *st, const char *id, const char *reason,
                        struct lb_error *err);

/* -> stopped (the provider confirmed the sandbox gone). reason NULL keeps the earlier one.
 * Writes the "stopped" event (data.reason, data.usage null) unless the record was stopped
 * already. */
int store_mark_stopped(struct lb_store *st, const char *id, const char *reason,
                       struct lb_error *err);
/* store_mark_stopped whose event's data.usage is usage (borrowed; NULL: null): the figures
 * taken just before the stop. */
int store_mark_stopped_usage(struct lb_store *st, const char *id, const char *reason,
                             const json_t *usage, struct lb_error *err);

/* Mark n records stopped (reason as above) in one transaction: all or none. -ENOENT (nothing
 * changed) if one is missing. For startup reconciliation of many vanished sandboxes. */
int store_mark_stopped_many(struct lb_store *st, const char *const *ids, size_t n,
                            const char *reason, struct lb_error *err);
/* Mark n records stopping in one transaction, as store_mark_stopping does one (reasons[i],
 * which may be NULL, as its reason; reasons NULL: none): all or none. -ENOENT (nothing
 * changed) if one is missing. For the shutdown sweep. Thread-safe. */
int store_mark_stopping_many(struct lb_store *st, const char *const *ids,
                             const char *const *reasons, size_t n, struct lb_error *err);

/* A stop failed: -> state (LB_STATE_FAILED_SEED or LB_STATE_STOP_FAILED), stop_attempts+1,
 * last_error, next_attempt_at. */
int store_mark_stop_failed(struct lb_store *st, const char *id, enum lb_record_state state,
                           const char *last_error, int64_t next_attempt_at, struct lb_error *err);

/* Count records by state: counts[i] for every enum lb_record_state i (LB_STATE_COUNT). */
int store_count_by_state(struct lb_store *st, int64_t counts[LB_STATE_COUNT], struct lb_error *err);

/* ---- warm pools (src/warm/) ----
 * A warm sandbox is inserted "starting" with its pool_class and no session, made by the
 * provider, then marked "warm" (expires_at: its max age). A seed takes one in one transaction;
 * everything else that ends one claims it first (warm -> stopping), so that a sandbox is
 * either taken or stopped, never both. */

/* starting -> warm with the provider descriptor and expires_at (0: none). -EBUSY if the record
 * is no longer starting (a shutdown sweep claimed it), -ENOENT. */
int store_mark_warm(struct lb_store *st, const char *id, const char *descriptor_json,
                    int64_t expires_at, struct lb_error *err);

/* The operate token hash of sandbox id into hash (LB_TOKEN_HASH_HEX + 1 bytes): 0 or < 0. */
typedef int (*lb_store_token_hash_fn)(void *ctx, const char *id, char *hash);

struct lb_warm_take {
    const char *pool_class;     /* only a sandbox of this class */
    int64_t now_s;              /* only one with expires_at > now_s (or none) */
    const char *rsid, *task_id; /* rsid NULL: a sandbox lent to no session (POST /v1/sandboxes) */
    const char *spec_json;      /* replaces the warm record's spec (the seed's env, labels) */
    int64_t expires_at;         /* the lease's; 0: no TTL */
    lb_store_token_hash_fn token_hash;
    void *token_ctx;
};

/* Take the oldest unexpired warm sandbox of t->pool_class for session t->rsid in one IMMEDIATE
 * transaction: warm -> lent with rsid, task_id, spec, expires_at and the token hash of its id;
 * the spec's "uses" becomes the warm record's plus one (the lends of a recycled line).
 * *out is the record as lent (the caller releases it). -ENOENT when the class has none,
 * -EEXIST if the session has a live record, -ENOSPC/-EIO. Thread-safe: two takes never get the
 * same sandbox. */
int store_take_warm(struct lb_store *st, const struct lb_warm_take *t, struct lb_record *out,
                    struct lb_error *err);

/* The number of lent (or being released) records of pool_class lent fewer than max_uses times
 * (spec "uses"): the sandboxes a recycling pool gets back at their release. 0 or -EIO.
 * Thread-safe. */
int store_count_recyclable(struct lb_store *st, const char *pool_class, int64_t max_uses,
                           int64_t *out, struct lb_error *err);

/* A recycling pool's in-place recycle, in one transaction: new_id (starting) -> warm with the
 * provider descriptor and expires_at (0: none), and old_id -> stopped (its reason kept, its
 * "stopped" event's data.usage usage, borrowed; NULL: null). So the sandbox is never warm (and
 * so lendable) under the new id while the old id's record, whose descriptor still names its
 * init, could be stopped. -EBUSY (nothing changed) when new_id is no longer starting (a
 * shutdown sweep claimed it), -ENOENT, -ENOSPC/-EIO. Thread-safe. */
int store_hand_over(struct lb_store *st, const char *old_id, const json_t *usage,
                    const char *new_id, const char *descriptor_json, int64_t expires_at,
                    struct lb_error *err);

/* Claim warm sandbox id for a stop: warm -> stopping with reason. 0, or -EBUSY when it is not
 * warm any more (a seed took it), -ENOSPC/-EIO. */
int store_claim_warm(struct lb_store *st, const char *id, const char *reason, struct lb_error *err);

/* Live (starting, lent or warm) records: an index range, cheap however many stopped rows are
 * kept. */
int store_count_live(struct lb_store *st, int64_t *out, struct lb_error *err);

/* Live records by the cluster member their sandbox is on: the "location" of the descriptor
 * (what a provider with members, lxd, records there; a descriptor without one, or with "",
 * counts nowhere). */
struct lb_member_count {
    char provider[64]; /* truncated */
    char member[64];   /* truncated */
    int64_t count;
};
/* Fill out with up to max rows, ordered by provider then member (those past max are left
 * out); their number into *n_out. Counted: starting, lent, warm, stopping and stop_failed
 * records, which may still run there. 0 or -EIO with err set. Thread-safe. */
int store_count_by_member(struct lb_store *st, struct lb_member_count *out, size_t max,
                          size_t *n_out, struct lb_error *err);

/* *out = how many records not yet stopped (starting, lent, stopping, stop_failed) name image
 * in their spec: an image they use or may still hold mounted. Thread-safe.
 * Returns 0 or a negative errno with err set. */
int store_count_using_image(struct lb_store *st, const char *image, int64_t *out,
                            struct lb_error *err);

/* *out = how many records not yet stopped recorded digest ("sha256:...") as their image's
 * digest (spec image_digest): the stored tree they mount, whatever name points where now.
 * Thread-safe. Returns 0 or a negative errno with err set. */
int store_count_using_image_digest(struct lb_store *st, const char *digest, int64_t *out,
                                   struct lb_error *err);

/* Delete stopped records last updated before cutoff_s. Returns the number deleted (>= 0). */
int store_purge_stopped(struct lb_store *st, int64_t cutoff_s, struct lb_error *err);

/* ---- harness activations (NeMo Gym SandboxSession records) ----
 *
 * One activation per lent sandbox (a unique index on sandbox_id), deleted with its sandbox
 * record when that is purged. States: staging -> running -> closing -> closed; a close may
 * also go staging -> closing. The receipt is the in-sandbox supervisor's JSON; the capture
 * (artifacts, capture error, output log) is recorded at most once. */
enum lb_act_state {
    LB_ACT_STAGING,
    LB_ACT_RUNNING,
    LB_ACT_CLOSING,
    LB_ACT_CLOSED,
};
#define LB_ACT_MASK(s) (1u << (s))

/* "staging", "running", "closing", "closed" (static string). */
const char *store_act_state_name(enum lb_act_state s);

struct lb_activation {
    char id[LB_ID_MAX]; /* "act-..." */
    char *rsid;
    char sandbox_id[LB_ID_MAX];
    enum lb_act_state state;
    char *spec_json;      /* what execute asked for */
    char *receipt_json;   /* the supervisor's receipt, NULL until read */
    char *artifacts_json; /* NULL until the capture ran; then an object */
    char *capture_error;  /* NULL or why (part of) the capture failed */
    unsigned char *log;   /* the output log (tail) kept at capture; NULL before */
    size_t log_len;
    int64_t output_log_bytes; /* size of the whole output log at capture; -1 unknown */
    int64_t created_at;
    int64_t updated_at;
};

/* Free what an activation holds (not the struct); safe on a zeroed one. */
void store_activation_release(struct lb_activation *a);

/* Insert a new activation (state as given, normally staging). -EEXIST if its sandbox already
 * has one or the id exists; -ENOENT if there is no sandbox record sandbox_id. */
int store_insert_activation(struct lb_store *st, const struct lb_activation *a,
                            struct lb_error *err);
/* The id alone (into id, size bytes; LB_ID_MAX fits any) of the activation of sandbox key
 * (by_sandbox) or of the newest activation of session key, without loading its texts. -ENOENT
 * if none, -EIO. Thread-safe. */
int store_get_activation_id(struct lb_store *st, bool by_sandbox, const char *key, char *id,
                            size_t size, struct lb_error *err);
/* The activation of a sandbox / the newest activation of a session. -ENOENT if none. */
int store_get_activation_by_sandbox(struct lb_store *st, const char *sandbox_id,
                                    struct lb_activation *out, struct lb_error *err);
/* Remove sandbox_id's activation, if it has one (a reset: the next episode starts with none,
 * and nothing of the previous one's output, receipt or artifacts is reachable). 0 (also when
 * there was none) or < 0. Thread-safe. */
int store_delete_activation_of_sandbox(struct lb_store *st, const char *sandbox_id,
                                       struct lb_error *err);
int store_get_latest_activation(struct lb_store *st, const char *rsid, struct lb_activation *out,
                                struct lb_error *err);
/* The largest stored texts (artifacts, output log, spec, receipt, capture error), in bytes, of
 * the activations of
 * resources session rsid (0 when it has none): what rendering one of them costs at most
 * beyond its small fields, without loading it. Errors: -EIO. Thread-safe. */
int store_activation_text_bytes(struct lb_store *st, const char *rsid, uint64_t *bytes,
                                struct lb_error *err);
/* Move to state to, but only from a state in from_mask (LB_ACT_MASK bits): -EBUSY when the
 * activation is in another state, -ENOENT when there is none. */
int store_activation_set_state(struct lb_store *st, const char *id, enum lb_act_state to,
                               unsigned from_mask, struct lb_error *err);
/* Store the receipt text (replacing an earlier one). -ENOENT. */
int store_activation_set_receipt(struct lb_store *st, const char *id, const char *receipt_json,
                                 struct lb_error *err);
/* Record the capture, once: -EALREADY if one is recorded already, -ENOENT. artifacts_json
 * must not be NULL; capture_error and log may be. */
int store_activation_set_capture(struct lb_store *st, const char *id, const char *artifacts_json,
                                 const char *capture_error, const void *log, size_t log_len,
                                 int64_t output_log_bytes, struct lb_error *err);

/* ---- snapshots under way (store_snapshots.c) ----
 * A snapshot is recorded (state "capturing") before its sandbox is frozen and its capture
 * starts, and forgotten once its image is named or its work discarded; a row found at start-up
 * belongs to a capture a crash interrupted (the caller thaws the sandbox unless was_paused).
 * Thread-safe. */

/* Record the snapshot name of sandbox_id. 0, -EEXIST (a snapshot of that name is under way),
 * or a negative errno. */
int store_snapshot_begin(struct lb_store *st, const char *name, const char *sandbox_id,
                         bool was_paused, struct lb_error *err);
/* Forget it (none recorded is no error). 0 or a negative errno. */
int store_snapshot_end(struct lb_store *st, const char *name, struct lb_error *err);
/* store_snapshot_end for a snapshot whose image was published: in the same transaction, the
 * "snapshot" event (data.name) of the sandbox it recorded. */
int store_snapshot_done(struct lb_store *st, const char *name, struct lb_error *err);
/* Every recorded snapshot: *out a new JSON array of {"name","sandbox_id","was_paused"} the
 * caller decrefs. 0 or a negative errno. */
int store_snapshots_pending(struct lb_store *st, json_t **out, struct lb_error *err);

/* ---- a seed's files (store_seed_files.c) ----
 * The files a seed wrote into its sandbox, kept with the sandbox's record so that a reset writes
 * them again; dropped when the record turns stopped, and with the record. Thread-safe. */

struct lb_store_file {
    char *path;          /* absolute path inside the sandbox */
    unsigned char *data; /* the bytes (owned by whoever filled the struct) */
    size_t len;
    int mode; /* -1: the default (0644) */
};

/* Keep files[0..n) as sandbox_id's seed files, in place of any kept before (n 0: none), in one
 * transaction. 0 or a negative errno (-ENOENT for no such record). */
int store_seed_files_put(struct lb_store *st, const char *sandbox_id,
                         const struct lb_store_file *files, size_t n, struct lb_error *err);
/* sandbox_id's seed files, in the order they were kept: *out a malloc'd array of *n (NULL, 0
 * when none) the caller frees with store_seed_files_free. 0 or a negative errno. */
int store_seed_files_get(struct lb_store *st, const char *sandbox_id, struct lb_store_file **out,
                         size_t *n, struct lb_error *err);
/* A reset of lent sandbox id (lend_reset): its new spec_json and operate token's hash, in one
 * write, so the old token answers 401 from then on. 0, -ENOENT (not lent), or a negative
 * errno. */
int store_set_reset(struct lb_store *st, const char *id, const char *spec_json,
                    const char *token_hash, bool complete, struct lb_error *err);
/* Free what store_seed_files_get returned; NULL-safe. */
void store_seed_files_free(struct lb_store_file *files, size_t n);

/* ---- the event feed (events.c) ----
 * One row per state change, written in the transaction of the change: seeded (mark_lent, a
 * warm take), renewed (set_expires: data.expires_at), reset (set_reset, complete), snapshot
 * (snapshot_done: data.name), lost (stopping with reason "lost"), stopped (data.reason,
 * data.usage), stop_failed (data.state, data.error), and the ones lending records on their own
 * (paused, resumed, idle: store_record_event). seq is strictly increasing and commit order is
 * seq order, so a reader never sees a gap a later read fills. A warm sandbox no session took
 * writes none. Thread-safe. */

/* Which events store_events_list returns: seq > since, and each non-NULL filter (types: a
 * JSON array of type names, borrowed), at most limit (<= 0: 1000), in seq order. */
struct lb_event_filter {
    int64_t since;
    const char *rsid;
    const char *sandbox_id;
    const json_t *types;
    int64_t limit;
};
/* *out: a new JSON array of events {"seq","time","type","sandbox_id","rsid","task_id",
 * "labels","data"}; *next: the seq of its last one, or since when empty. 0 or a negative
 * errno (*out NULL). */
int store_events_list(struct lb_store *st, const struct lb_event_filter *f, json_t **out,
                      int64_t *next, struct lb_error *err);
/* store_events_list, and *read_to (NULL: not asked): the seq up to which every event was read,
 * matching or not: when fewer than limit matched, the newest event's seq at the time of the
 * read (a later read may start after it and misses nothing of f); else *next. A reader whose
 * filter rarely matches reads on from it so as not to walk the same rows again. */
int store_events_list_to(struct lb_store *st, const struct lb_event_filter *f, json_t **out,
                         int64_t *next, int64_t *read_to, struct lb_error *err);
/* An event that is no record transition (paused, resumed, idle) for sandbox_id in its own
 * transaction; data borrowed (NULL: {}). 0 or a negative errno. */
int store_record_event(struct lb_store *st, const char *type, const char *sandbox_id,
                       const json_t *data, struct lb_error *err);
/* The longest rsid an event note holds (a resources session id is 1 to 128 bytes). */
#define LB_EVENT_RSID_MAX 128
/* Whose event a commit wrote: its sandbox and its session (NULL: none). */
struct lb_event_note {
    const char *sandbox_id;
    const char *rsid;
};
/* fn(ctx, notes, n) runs after each commit that wrote events, with the store's lock held: it
 * must be quick and make no store call. notes (valid during the call only) say whose events the
 * commit wrote; n == 0 (notes NULL): not known (too many): any reader may have new events.
 * fn NULL: none. */
void store_events_set_hook(struct lb_store *st,
                           void (*fn)(void *ctx, const struct lb_event_note *notes, size_t n),
                           void *ctx);
/* enabled false writes no events (for a bench's comparison only; the default is true);
 * retention: events older than max_age_s (0: no limit) and all but the newest max_count (0:
 * no limit) go at store_events_prune. Defaults: 7 days, 1,000,000. */
void store_events_configure(struct lb_store *st, bool enabled, int64_t max_age_s,
                            int64_t max_count);
/* Delete what the retention says, in bounded batches (the lock let go between them): the
 * number deleted, or a negative errno. For the sweeper. */
int store_events_prune(struct lb_store *st, int64_t now_s, struct lb_error *err);

#endif
