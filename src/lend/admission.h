/*
 * admission.h - admission control of sandbox creations: at most max_starting provider creates
 * at once (lending.max_starting), seeds past it waiting in a FIFO queue of at most
 * max_seed_queue, seeds past that refused at once with -EAGAIN (429 overloaded) and a
 * Retry-After estimate.
 *
 * Counted: every create lend_start_recorded makes, i.e. a seed's new sandbox (POST .../seed,
 * POST /v1/sandboxes, fork children, batch items) and a warm pool refill. Not counted: a seed
 * served from the warm pool, a repeated seed answered with the session's live sandbox, a
 * reset's re-creation. A slot is held from before the record is inserted until the provider's
 * create returns, so a refused seed leaves no record behind.
 *
 * Waiting: seeds run on the daemon's seed/release workers (http_defer's control pool); a queued
 * seed waits on a condition variable and holds its worker while it waits. The wait is bounded
 * by the creates ahead of it (each bounded by lending.create_timeout_s) and the queue's length;
 * there is no other timeout. The seed/release workers (server.workers / 4, at least 4) bound the
 * seeds in flight anyway: a seed past them waits in the worker queue holding nothing, and a
 * queue longer than them refuses nothing.
 *
 * Refills yield to seeds: a refill takes a slot only while no seed waits, and refills hold at
 * most one slot at once (lend_admission_set_refills raises that for a provider whose creates
 * run in its engine: then at most max_starting - 1, so one slot is always left to seeds), so a
 * seed never waits behind more than one refill's create. A refill that cannot take a slot
 * within its wait gets -EAGAIN and nothing is recorded.
 *
 * Retry-After (whole seconds, 1 to 60): the mean of recent create durations (1 s before any)
 * times the rounds of max_starting creates ahead of the refused seed (starting + queued + it).
 *
 * Metrics: lendbox_seeds_starting (creates holding a slot: seeds and refills),
 * lendbox_seed_queue_length (seeds waiting), lendbox_seeds_overloaded_total (seeds refused).
 *
 * Thread-safety: every function may be called from any thread, except lend_admission_free.
 */
#ifndef LB_LEND_ADMISSION_H
#define LB_LEND_ADMISSION_H

#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"

struct lend_admission;

/* A slot held by one create: filled by lend_admission_enter_*, given back with
 * lend_admission_leave. Zero-initialise; leaving one that holds nothing does nothing. */
struct lend_admission_slot {
    bool held;
    bool refill;
    int64_t since_ms; /* clock_mono_ms when the slot was taken */
};

/* Make the admission control: max_starting creates at once (<= 0: no admission control, *out
 * is NULL and every function below admits at once), max_queue seeds waiting (0: none wait;
 * past max_starting a seed is refused). -ENOMEM. */
int lend_admission_new(int64_t max_starting, int64_t max_queue, struct lend_admission **out,
                       struct lb_error *err);
/* Free it; no thread may be inside. NULL-safe. */
void lend_admission_free(struct lend_admission *a);

/* A seed's create: take a slot at once when one is free and no seed waits, else wait in the
 * queue for its turn, else (the queue is full) refuse: -EAGAIN with err->retry_after_s set
 * (>= 1) and *slot holding nothing. 0 with *slot held. a NULL: 0 at once. */
int lend_admission_enter_seed(struct lend_admission *a, struct lend_admission_slot *slot,
                              struct lb_error *err);

/* How many slots refills may hold at once: n, at most max_starting - 1, at least 1 (the
 * default). The warm pool sets it once at its start (its refill threads, bounded by the
 * provider's own create concurrency, when the provider's creates run in an engine). a NULL:
 * nothing. */
void lend_admission_set_refills(struct lend_admission *a, int64_t n);

/* A warm refill's create: take a slot when no seed waits, refills hold fewer than their
 * bound (lend_admission_set_refills; 1 unless set) and one is free, waiting at most wait_ms for
 * that. 0 with *slot held, -EAGAIN when it did not come (err says so). a NULL: 0 at once. */
int lend_admission_enter_refill(struct lend_admission *a, int64_t wait_ms,
                                struct lend_admission_slot *slot, struct lb_error *err);

/* Give back the slot (the create returned, whatever its result): its duration goes into the
 * Retry-After estimate and the next waiter may start. NULL-safe on both. */
void lend_admission_leave(struct lend_admission *a, struct lend_admission_slot *slot);

#endif
