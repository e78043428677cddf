/*
 * lend_internal.h - what lending shares with the services beside it: the sweeper
 * (src/sweeper/), the warm pool (src/warm/) and activations (activation.c): the store and
 * providers it works on, the session locks, the one way a recorded sandbox is stopped, the one
 * way a sandbox is started under a record (lend_start_*: seeds and warm refills), and what the
 * warm pool registers and waits on (lend_set_warm, lend_warm_wait). The warm pool calls
 * lending, never the other way round. Routes and main use lend.h; the files of
 * the lending service itself share lend_private.h.
 *
 * Thread-safety: as lend.h; the accessors return what lend_new was given, unchanged for the
 * lending service's life.
 */
#ifndef LB_LEND_INTERNAL_H
#define LB_LEND_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "image/image.h"
#include "lend/lend.h"
#include "provider/registry.h"
#include "store/store.h"

/* The store, the enabled providers and the (copied) config of l. Borrowed. */
struct lb_store *lend_store(struct lb_lend *l);
struct lb_registry *lend_providers(struct lb_lend *l);
const struct lb_lend_config *lend_config(struct lb_lend *l);

/* One resources session's lock (seed, release, delete and sweeper stops of a session run one
 * at a time). */
struct lend_session_lock;

/* Take the session's lock, waiting at most session_lock_wait_s (try_only: not at all): no
 * request waits without bound behind another that holds it (a stop is bounded by
 * stop_timeout_s, but a holder may be stuck in ways nobody foresaw). *out is the held lock.
 * -EBUSY (409) past the bound, -ENOMEM; err may be NULL. */
int lend_session_lock(struct lb_lend *l, const char *rsid, bool try_only,
                      struct lend_session_lock **out, struct lb_error *err);
/* Release a lock lend_session_lock took; NULL-safe. */
void lend_session_unlock(struct lb_lend *l, struct lend_session_lock *s);

/* Read sandbox id's record into *rec (release it with store_record_release, also on failure).
 * Any failure to read it is -ENOENT "no sandbox <id>", the answer a client gets. */
int lend_record_get(struct lb_lend *l, const char *id, struct lb_record *rec, struct lb_error *err);
/* As lend_record_get, then for a record with a session: that session's lock taken into *lock
 * (else *lock stays NULL) and the record read again under it (a failure to read it again is
 * store_get_sandbox's error). The caller releases *rec and unlocks *lock, also on failure.
 * lend_session_lock's errors. */
int lend_record_get_locked(struct lb_lend *l, const char *id, struct lb_record *rec,
                           struct lend_session_lock **lock, struct lb_error *err);

/* The provider that made the sandbox of record r (borrowed), or NULL with -EREMOTEIO in err
 * when it is not enabled on this daemon (the record is kept; its stops are retried). */
struct lb_provider *lend_provider_of(struct lb_lend *l, const struct lb_record *r,
                                     struct lb_error *err);

/* Stop the sandbox of record r: record "stopping" (with reason; NULL keeps the earlier one),
 * its provider's stop, record "stopped"; when the stop fails, record fail_state
 * (stop_failed/failed_seed) with the error and the next retry's time (backoff) and return
 * -EREMOTEIO. The caller holds the session's lock when r has a session and may race a seed. */
int lend_stop_record(struct lb_lend *l, const struct lb_record *r, const char *reason,
                     enum lb_record_state fail_state, struct lb_error *err);

/* Was a reset of r's sandbox under way (lend_reset) when the record was read? A lent record
 * that says so at start-up belongs to a reset a crash interrupted: reconciliation stops its
 * sandbox (reason reset_failed, the provider finding what is there from the id alone). */
bool lend_record_resetting(const struct lb_record *r);
/* The idle pass of the sweeper: every lent sandbox whose seed set idle_timeout_s and that had
 * no activity for that long (and runs no exec, activation or PTY process) is stopped with reason
 * "idle", or, with on_idle "pause", paused (resumed by its next activity request). Under each
 * session's lock (a busy session is left to the next pass). The first call reads the idle
 * settings of the lent sandboxes from the store. Returns the sandboxes acted on. Call from one
 * thread (the sweeper's); blocks on providers. */
int lend_idle_sweep(struct lb_lend *l);
/* The sweeper's pass over lent sandboxes (lost.c): each whose provider's status says it is gone
 * is stopped with reason lost, under its session's lock (a busy session is left to the next
 * pass). Returns how many were found lost. Blocks on the providers (one status each). */
int lend_sweep_lost(struct lb_lend *l);
/* The three steps of lend_stop_record after "stopping" is recorded, for a caller that records
 * many stops in one transaction (the shutdown sweep):
 * lend_stop_provider: r's provider stops its sandbox (bounded by stop_timeout_s): 0, or
 *   -errno with the provider's message in *perr;
 * lend_stop_failed: record fail_state with message and the next retry's time; -EREMOTEIO;
 * lend_stop_done: after "stopped" is recorded: metrics, its activity forgotten, the stopped
 *   hook, a fork's implicit snapshot it stood on collected, the log line (reason NULL: the
 *   record's). */
int lend_stop_provider(struct lb_lend *l, const struct lb_record *r, struct lb_error *perr);
/* Before lend_stop_provider, for many stops at once: r's provider starts stopping its sandbox
 * without waiting (provider_stop_begin; best effort, nothing to report). */
void lend_stop_begin(struct lb_lend *l, const struct lb_record *r);
int lend_stop_failed(struct lb_lend *l, const struct lb_record *r, enum lb_record_state fail_state,
                     const char *message, struct lb_error *err);
void lend_stop_done(struct lb_lend *l, const struct lb_record *r, const char *reason);
/* The "usage" figures of a lent sandbox about to be torn down (its stopped event's data.usage;
 * the caller's), or NULL (null) for one that is not lent or whose provider cannot tell. */
json_t *lend_stop_usage(struct lb_lend *l, const struct lb_record *r);

/* ---- starting a sandbox: for seeds (seed.c) and the warm pool (src/warm/) ---- */

/* A sandbox on its way to start under a record: lend_start_prepare fills it, lend_start_recorded
 * records and makes it, lend_start_release frees it (also after a failure). */
struct lend_start {
    const struct lb_seed_request *req; /* borrowed from the caller */
    struct lb_provider *prov;          /* the chosen provider (borrowed) */
    struct lb_provider_caps caps;      /* prov's, asked once per start */
    struct lb_sandbox_spec spec;       /* checked; resources with the daemon's defaults */
    char image[LB_IMAGE_NAME_MAX + 1]; /* the default image resolved, when req names none */
    json_t *spec_json;                 /* what the record keeps (owned) */
    char *spec_text;                   /* spec_json as stored (owned) */
    const char *fail_reason; /* the stop reason of a start rolled back; NULL: "seed_failed" (a
                                recycle's is "reset_failed"); set it after lend_start_prepare */
    /* set by lend_start_recorded */
    bool recorded;        /* the record was inserted (a later failure must roll it back) */
    struct lb_record rec; /* the row as inserted (state starting); strings borrowed */
    json_t *desc;         /* what the provider's create returned (owned) */
    char *desc_text;      /* desc as stored (owned) */
    int64_t create_ms;    /* clock_mono_ms when the provider's create began (the ready
                             probe's budget counts from it) */
};

/* Choose the provider of req (ask its caps once), resolve the image (req->image, else the
 * provider's or the daemon's default image list), check resources against the daemon's limits
 * and fill in the defaults the provider can enforce, check the spec against the provider
 * (provider_check_spec), open the image once (digest, Env, WorkingDir and, for a provider whose
 * caps say image_store, User) and build the record's spec. Nothing is recorded. -EOPNOTSUPP
 * (422) for a provider not enabled or a spec it cannot enforce or an image User not mapped,
 * -EINVAL (400) past limits.max_disk_mib, -ENOMEM. Release s in every case. */
int lend_start_prepare(struct lb_lend *l, const struct lb_seed_request *req, struct lend_start *s,
                       struct lb_error *err);

/* Intent before action: record s (prepared) as "starting" (with rsid, NULL for none; the warm
 * class pool_class, NULL for a seed; expires ttl_s seconds after it is recorded, <= 0: never), then
 * the provider's create. For a seed (pool_class NULL) at max_sandboxes with a pool set
 * (lend_set_warm), the oldest warm sandbox gives its place and the insert is tried once more. 0
 * with s->rec, s->desc, s->desc_text set; -EUSERS (429) at max_sandboxes, -ENOSPC/-EIO from the
 * store, or the create's error (-EINVAL, -EOPNOTSUPP, -EUSERS, -LB_E_IMAGE_NOT_FOUND keep theirs,
 * others are -EREMOTEIO), after which the record was stopped as a failed seed (s->recorded tells
 * whether one was made). The caller then moves the record on (lent, warm) or calls
 * lend_start_rollback. Before the record, the create takes an admission slot (lend/admission.h):
 * a seed may wait in the seed queue, or get -EAGAIN (429, err->retry_after_s set) past it; a
 * refill (pool_class set) waits at most LEND_REFILL_WAIT_MS and gets -EAGAIN when seeds come
 * first; nothing is recorded then. Blocks on the provider and on the admission queue. */
#define LEND_REFILL_WAIT_MS 1000
int lend_start_recorded(struct lb_lend *l, struct lend_start *s, const char *rsid,
                        const char *pool_class, int64_t ttl_s, struct lb_error *err);

/* Undo a start after lend_start_recorded succeeded: record the descriptor, stop the sandbox as
 * a failed seed (reason s->fail_reason, else seed_failed; a failed stop is logged and left to
 * the retries). No-op when nothing was recorded. */
void lend_start_rollback(struct lb_lend *l, struct lend_start *s);

/* Free what s holds; s may be reused after. */
void lend_start_release(struct lend_start *s);

/* ---- warm pools (src/warm/): the pool calls lending, never the other way round ---- */

/* "<provider>:<image>" fits: a provider name and an image name */
#define LEND_WARM_CLASS_MAX (64 + LB_IMAGE_NAME_MAX + 2)

/* The warm class of provider prov now: the image a seed that names none gets now (the first
 * present of a default image list, so the class follows imports) into image (LB_IMAGE_NAME_MAX
 * + 1 bytes) and "<provider>:<image>" into cls (LEND_WARM_CLASS_MAX bytes). Reads the image
 * store. */
void lend_warm_class(struct lb_lend *l, struct lb_provider *prov, char *image, char *cls);

/* Let seeds of provider prov's warm class take warm sandboxes (prov NULL: stop taking). A seed
 * of that class then takes the oldest warm one of its class in one store transaction, and a
 * seed at max_sandboxes stops the oldest warm one to make room. Thread-safe. */
void lend_set_warm(struct lb_lend *l, struct lb_provider *prov);

/* How many warm refills may hold creation slots at once (lend_admission_set_refills: at most
 * lending.max_starting - 1, at least 1, the default). Thread-safe. */
void lend_set_refill_slots(struct lb_lend *l, int64_t n);

/* A counter that grows whenever warm sandboxes are taken or stopped to make room, or
 * lend_warm_changed is called; lend_warm_wait returns once it differs from seen, or after
 * timeout_ms. What a pool's refill threads sleep on. Thread-safe. */
uint64_t lend_warm_generation(struct lb_lend *l);
void lend_warm_wait(struct lb_lend *l, uint64_t seen, int64_t timeout_ms);
void lend_warm_changed(struct lb_lend *l);

/* A warm pool's places (registered by src/warm/ with lend_set_pool_slots; lending calls them
 * under its warm lock, so never after the pool unregistered them). claim: is there room in the
 * pool for one more sandbox (warm ones and those being made count, a recycle claimed earlier
 * too) and may a release give one back (recycling on, the provider can reset)? true takes the
 * place, counted as a creation under way until release gives it back (made or not). */
struct lend_pool_slots {
    bool (*claim)(void *ctx);
    void (*release)(void *ctx);
    void *ctx;
};

/* Register (slots non-NULL, copied) or unregister (NULL) the pool's places. Thread-safe. */
void lend_set_pool_slots(struct lb_lend *l, const struct lend_pool_slots *slots);

/* [pool] recycle, in two steps around a release's stop of old (a lent record of the pool's
 * class, under the session's lock). lend_recycle_claim, before the stop: may old's sandbox go
 * back to the pool? It does not when recycling is off, no pool is set, the provider cannot
 * reset (caps.reset), old is of no or another class, old was lent pool_max_uses times or more
 * (spec "uses", which each warm take increments), the daemon is draining or the pool has no
 * place (lend_pool_slots.claim). true: a place is held for old's replacement; then
 * lend_recycle_finish must follow, with stopped telling whether old was stopped and in_place
 * whether lend_recycle_in_place (below) recycled it already (then it only counts it). It makes the
 * replacement as a warm sandbox of the pool's class under a new id (new token, new record,
 * spec "uses" carried over and "recycled_from" old's id), unless old was not stopped or the
 * daemon is at max_sandboxes; a failure is counted (reset failures), logged, and the record it
 * left stopped with reason reset_failed; the pool refills for it. It then gives the place back.
 * true when the replacement is warm. Blocks on the provider; call it without the session's
 * lock. */
bool lend_recycle_claim(struct lb_lend *l, const struct lb_record *old);
bool lend_recycle_finish(struct lb_lend *l, const struct lb_record *old, bool stopped,
                         bool in_place);
/* Between the two, in place of the release's stop where the provider can (reset_in_place and
 * hand_over): old's sandbox is reset in place and handed over to a new warm record of the
 * pool's class, and old recorded stopped (reason released), with its operate-token fence up
 * throughout; the new record's warm and old's stopped are one transaction (store_hand_over).
 * 1: done (old stopped; lend_recycle_finish then makes nothing); 2: old stopped, its sandbox
 * gone with a hand-over that could not be recorded (counted as a reset failure; the pool makes
 * a replacement as for a stop); 0: not done, old's sandbox as it was or reset but still under
 * old's id (the caller stops it as any release); a negative errno (err set) when old's record
 * could not be marked stopped after its sandbox went. Blocks on the provider (a reset:
 * milliseconds). Under the session's lock. */
int lend_recycle_in_place(struct lb_lend *l, const struct lb_record *old, struct lb_error *err);

/* Stop the oldest warm sandbox (reason) so that its place goes elsewhere, or (not_class
 * non-NULL) the oldest one whose class is not not_class. Claims it first (a seed may be taking
 * it). 0 if one was stopped, -ENOENT if none was. Blocks on the provider. */
int lend_stop_oldest_warm(struct lb_lend *l, const char *reason, const char *not_class);

/* Stop warm sandbox id, which store_insert_sandbox_evicting claimed for reason (a seed took its
 * place); a record that cannot be read is left to the sweeper's retries. Blocks on the
 * provider. */
void lend_stop_evicted(struct lb_lend *l, const char *id, const char *reason);

#endif
