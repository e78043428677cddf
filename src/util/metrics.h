/*
 * metrics.h - process-wide counters and latency histograms, rendered as Prometheus text.
 *
 * Counters are atomics; a histogram is a fixed array of atomic buckets. All functions are
 * thread-safe and lock-free except metrics_render.
 */
#ifndef LB_METRICS_H
#define LB_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "util/buf.h"

enum lb_counter {
    LB_M_SEEDS_OK,
    LB_M_SEEDS_REUSED,
    LB_M_SEEDS_FAILED,
    LB_M_RELEASES_OK,
    LB_M_RELEASES_FAILED,
    LB_M_STOPS_OK,
    LB_M_STOPS_FAILED,
    LB_M_STOP_RETRIES,
    LB_M_EXECS,
    LB_M_EXEC_TIMEOUTS,
    LB_M_HTTP_REQUESTS,
    LB_M_HTTP_ERRORS_4XX,
    LB_M_HTTP_ERRORS_5XX,
    LB_M_HTTP_OVERLOADED,
    LB_M_TTL_REAPED,
    LB_M_SANDBOXES_LOST,
    LB_M_RECONCILE_ADOPTED,
    LB_M_RECONCILE_VANISHED,
    LB_M_RECONCILE_STOPPED,
    LB_M_RECONCILE_ORPHANS,
    LB_M_SWEEPS,
    LB_M_SWEEP_LAST_MS,       /* gauge, ms (rendered in seconds): the last sweeper pass */
    LB_M_STOPS_IN_FLIGHT,     /* gauge: provider stops running now */
    LB_M_STOPS_IN_FLIGHT_MAX, /* gauge: the most stops ever in flight at once */
    LB_M_SHUTDOWN_SWEEP_MS,   /* gauge, ms (rendered in seconds): the shutdown sweep */
    LB_M_SESSION_LOCK_TIMEOUTS,
    LB_M_NET_MODEL_ONLY,      /* gauge: sandboxes with a model_only link */
    LB_M_NET_MODEL_AND_TOOLS, /* gauge: sandboxes with a model_and_tools link */
    LB_M_NET_NAT,             /* gauge: sandboxes with a nat link (inherit = nat) */
    LB_M_NET_RULE_FAILURES,   /* links or egress rules that could not be installed */
    LB_M_NET_UNENFORCEABLE,   /* network requests refused 422 */
    LB_M_WARM_HITS,           /* seeds served from a warm pool (src/warm/) */
    LB_M_WARM_MISSES,         /* seeds of the pool's class that found it empty */
    LB_M_WARM_OTHER_CLASS,    /* seeds of another class (started fresh) */
    LB_M_WARM_REFILLS,        /* warm sandboxes made */
    LB_M_WARM_REFILLS_FAILED, /* warm sandboxes that could not be made */
    LB_M_WARM_REFILL_MS,      /* ms (rendered in seconds): time spent making warm sandboxes */
    LB_M_WARM_REFILL_LAST_MS, /* gauge, ms (rendered in seconds): the last one made */
    LB_M_POOL_RECYCLED,       /* released sandboxes returned to the pool under a new id */
    LB_M_POOL_RESET_FAILURES, /* recycles whose remake failed (the pool refills instead) */
    LB_M_HTTP_CUT_DEADLINE,   /* connections closed past the header deadline */
    LB_M_HTTP_CUT_CAP,        /* connections closed past an address's incomplete-request cap */
    LB_M_HTTP_WAITING_MAX,    /* gauge: most connections of one address ever waiting at once */
    LB_M_SEEDS_STARTING,      /* gauge: creates holding an admission slot (lend/admission.h) */
    LB_M_SEED_QUEUE_LENGTH,   /* gauge: seeds waiting for an admission slot */
    LB_M_SEEDS_OVERLOADED,    /* seeds refused 429 past the admission queue */
    LB_M_COUNTERS
};

#define LB_METRICS_MAX_ROUTES 64

void metrics_add(enum lb_counter c, uint64_t n);
/* Gauges: set, add a signed delta, or raise to at least v. */
void metrics_set(enum lb_counter c, uint64_t v);
void metrics_sub(enum lb_counter c, uint64_t n);
void metrics_max(enum lb_counter c, uint64_t v);
uint64_t metrics_get(enum lb_counter c);

/* Register a route label (static string) and get its index; call before serving. */
int metrics_route_register(const char *label);
/* Record one request of route index (or -1 for "unmatched") taking duration_ms. */
void metrics_observe_request(int route, int64_t duration_ms);

/* An engine provider's call to a cluster member (provider "lxd", member its name, or "-" when
 * unknown): counted as lendbox_provider_member_calls_total{provider,member} and, when failed (no
 * answer, a timeout, a 5xx), lendbox_provider_member_failures_total. At most 64 distinct
 * provider/member pairs are kept (later ones count under member "other"); names are copied
 * (truncated to 63 bytes). Thread-safe. */
void metrics_member_call(const char *provider, const char *member, bool failed);

/* A provider's storage, as it found it at start (the lxd provider: the pool new instances' roots
 * are made on and its driver, "btrfs", "dir", ...): rendered as
 * lendbox_provider_storage_info{provider,pool,driver} 1. A later call for the same provider
 * replaces its row; at most 8 providers are kept (later ones are dropped). Strings are copied
 * (truncated to 63 bytes, cut at a quote, backslash or newline). Thread-safe. */
void metrics_provider_storage(const char *provider, const char *pool, const char *driver);

/* Append the Prometheus text of every counter and histogram to out. Gauges are the caller's.
 * Returns 0 or -ENOMEM. */
int metrics_render(struct lb_buf *out);

#endif
