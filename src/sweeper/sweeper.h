/*
 * sweeper.h - what keeps records and sandboxes in step outside requests: the sweeper pass
 * (retry due failed stops, stop expired sandboxes, purge old records), the shutdown sweep, and
 * startup reconciliation. All of them stop sandboxes the way lending does (lend_internal.h):
 * under the session's lock, record first.
 *
 * Functions call providers and block: run them from the sweeper thread or main. Thread-safe
 * against requests (they take the sessions' locks).
 */
#ifndef LB_SWEEPER_H
#define LB_SWEEPER_H

#include <stddef.h>
#include <stdint.h>

#include "lend/lend.h"

/* The sweeper thread: one sweeper_sweep_once every interval_s seconds (<= 0: 5). *out is the
 * caller's (sweeper_stop). -ENOMEM, or the errno of pthread_create. */
struct lb_sweeper;
int sweeper_start(struct lb_lend *l, int64_t interval_s, struct lb_sweeper **out);
/* Stop the thread (a pass under way finishes first), wait for it and free s; NULL-safe. */
void sweeper_stop(struct lb_sweeper *s);

/* One pass of the sweeper: retry due failed stops, stop expired (TTL) sandboxes, stop or pause
 * idle ones (lend_idle_sweep), stop lent sandboxes whose provider says they are gone (reason
 * lost, lend_sweep_lost), purge old stopped records. Returns the number of stops attempted (>=
 * 0). */
int sweeper_sweep_once(struct lb_lend *l, struct lb_error *err);

/* Stop every live and failed sandbox (the shutdown sweep) with at most concurrency stops in
 * flight. Returns the number that failed to stop (kept recorded for the next start). */
int sweeper_stop_all(struct lb_lend *l, const char *reason, size_t concurrency);

struct lb_reconcile_stats {
    int adopted;         /* lent and still running */
    int vanished;        /* lent but gone: recorded stopped, reason vanished */
    int stopped;         /* starting/stopping/failed records whose stop now succeeded */
    int orphans_stopped; /* provider sandboxes of this instance with no record */
    int failed;          /* stops that failed again (kept for the retry loop) */
};

/* Startup reconciliation (before /readyz turns 200): adopt lent sandboxes that run, record the
 * vanished ones, stop what should not run, stop this instance's unrecorded sandboxes. The
 * provider is asked about (and stops) at most concurrency (>= 1) sandboxes at once, on threads
 * started and joined here, when an engine provider (caps.engine_creates) has any of them: its
 * call is a round trip (~1 s on an LXD cluster), so a restart with many instances does not ask
 * about them one at a time; the local provider's are asked one after another (its answer is
 * the daemon's own CPU, which threads only contend for). 0, or -EIO (store),
 * -ENOMEM; per-sandbox failures are counted in *stats, their records kept for the retry loop.
 * Blocks. */
int sweeper_reconcile(struct lb_lend *l, size_t concurrency, struct lb_reconcile_stats *stats,
                      struct lb_error *err);

#endif
