/*
 * warm.h - warm pools: sandboxes started ahead of the seeds that will take them.
 *
 * One pool of the default class: the default provider's default image, no resource limits
 * beyond the daemon's defaults (pids, disk), the default network, no ports, lending.workdir. A
 * seed of that class (no "provider" or the default one, no "image" or that image, no
 * "resources", no "network", no "ports", no "workdir" or lending.workdir) takes the oldest warm
 * sandbox in one store transaction (warm -> lent, operate token minted), then gets its files
 * written; any other seed starts a sandbox as always. A warm sandbox is handed out at most once
 * and only to its class. The class's image is resolved as a seed's that names none
 * (lend_warm_class: the first present of a default image list), at every refill and
 * take, so the pool follows imports; warm sandboxes of an earlier image are replaced (stop
 * reason class_changed). Lending does the take and the eviction itself (lend_internal.h): the
 * pool registers its provider (lend_set_warm), refills through lending's one start
 * (lend_start_recorded) and sleeps on lending's warm generation; lending never calls the pool.
 *
 * Warm sandboxes are records like lent ones (store.h): inserted "starting" with their pool
 * class before the provider makes them, "warm" once they run, with expires_at = their max age,
 * so that the sweeper replaces old ones (reason max_age), startup reconciliation adopts them
 * ([pool] adopt) or stops them (not_adopted), and the shutdown sweep stops them.
 *
 * Refills run on the pool's own threads (refill_concurrency of them), never on a request's
 * path; on a provider whose creates are the daemon's own CPU work (local) one creates at a
 * time, on an engine provider (caps.engine_creates: docker, lxd) all at once, bounded by the
 * provider's create_concurrency and lending.max_starting - 1 (lend_set_refill_slots); and
 * only while lending is not draining. They run refill_nice above the daemon's nice value (so does
 * the creation work they start), so that the refill a take wakes does not slow the taken sandbox's
 * execs down; the provider gives the sandbox the daemon's own value once it is up. The pool and the
 * live sandboxes together never exceed lending.max_sandboxes: a refill waits for room (no attempt,
 * no failure), and a seed of another class at the limit makes a warm sandbox give its place. With
 * recycle, a lent sandbox of the class lent fewer than max_uses times counts as one the pool holds
 * (its release gives it back under a new id, lend_recycle), so the pool makes only what releases
 * will not bring back (recycling is the local provider's: on an engine provider the pool logs why
 * not and does not recycle). A failed creation backs the pool off: the next attempt after 500 ms,
 * doubling per failure in a row up to 30 s, reset by one that works.
 *
 * Thread-safety: every function may be called from any thread; warm_new/warm_free once.
 */
#ifndef LB_WARM_H
#define LB_WARM_H

#include <stdint.h>

#include "lend/lend.h"

struct lb_warm_config {
    int64_t size;               /* warm sandboxes kept ready; 0: no pool */
    int64_t max_age_s;          /* a warm sandbox older than this is replaced; 0: never */
    int64_t refill_concurrency; /* refill threads (see above for how many make at once); <= 0: 2 */
    int64_t refill_nice;        /* the refill threads' nice value above the daemon's (0..19) */
    bool recycle;               /* [pool] recycle: releases give sandboxes back (lend_recycle) */
    int64_t max_uses;           /* with recycle: lends of one line before it is not given back */
};

struct lb_warm_pool;

/* Make the pool for lending l (which stays the caller's and must outlive the pool) and start
 * its refill threads; its sandboxes are made once l stops draining. With cfg->size 0, *out is
 * NULL and nothing runs. -EINVAL if the default provider cannot be chosen, -ENOMEM, or the
 * errno of pthread_create. */
int warm_start(const struct lb_warm_config *cfg, struct lb_lend *l, struct lb_warm_pool **out,
               struct lb_error *err);

/* Stop the refill threads (creations under way finish first), detach the pool from lending
 * and free it. Warm sandboxes stay recorded and running: the shutdown sweep (or the next
 * start's reconciliation) deals with them. NULL-safe. */
void warm_stop(struct lb_warm_pool *w);

/* Wake the refill threads (after a take, or a stop of a warm sandbox). NULL-safe. */
void warm_kick(struct lb_warm_pool *w);

#endif
