/*
 * lend_internal.h - what lending shares with the sweeper (src/sweeper/): the store and providers
 * it works on, the session locks, and the one way a recorded sandbox is stopped. Not for routes
 * or anything else: they use lend.h.
 *
 * Thread-safety: as lend.h; the accessors return what lend_new was given, unchanged for the
 * lending service's life.
 */
#ifndef LB_LEND_INTERNAL_H
#define LB_LEND_INTERNAL_H

#include <stdbool.h>

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

#endif
