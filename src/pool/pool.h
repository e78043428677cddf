/*
 * pool.h - a fixed set of worker threads taking jobs from one bounded FIFO queue.
 *
 * HTTP threads never wait on a provider (DESIGN.md invariant 4): they submit the blocking part
 * of a request here and get the connection resumed when the job ends. A full queue is refused
 * at once (the HTTP layer answers 429 overloaded).
 *
 * Thread-safety: every function may be called from any thread, except pool_destroy, which must
 * run once, after the last submit.
 */
#ifndef LB_POOL_H
#define LB_POOL_H

#include <stddef.h>

struct lb_pool;

typedef void (*lb_job_fn)(void *arg);

/* Start n_workers threads with a queue of at most queue_max waiting jobs. *out owned by the
 * caller. Errors: -EINVAL (zero sizes), -ENOMEM, -EAGAIN (thread creation failed). */
int pool_new(size_t n_workers, size_t queue_max, struct lb_pool **out);

/* Queue fn(arg). Returns 0, -EAGAIN when the queue is full, -ESHUTDOWN after pool_stop. */
int pool_submit(struct lb_pool *p, lb_job_fn fn, void *arg);

/* Queue fn(arg) so that jobs of the same key run one at a time, in submission order, and a job
 * waiting for an earlier one of its key occupies no worker (different keys run in parallel).
 * key NULL is pool_submit. Returns 0, -EAGAIN when the queue (keyed waiters included) is full,
 * -EBUSY when key_max (> 0) jobs of this key are already waiting, -ESHUTDOWN after pool_stop,
 * -ENOMEM. The key is copied. */
int pool_submit_keyed(struct lb_pool *p, const char *key, size_t key_max, lb_job_fn fn, void *arg);

/* Queue fn(arg) so that at most active_max (> 0) jobs of key are queued on the ring or running
 * at once; more wait behind them off the ring (occupying no worker and no place ahead of other
 * keys' jobs), at most waiting_max of them (SIZE_MAX: no bound but the queue's). So one busy key
 * can hold at most active_max workers. pool_submit_keyed is active_max 1. The active_max of
 * the key's first job holds while the key has jobs. key NULL is pool_submit. Returns 0,
 * -EAGAIN (queue full), -EBUSY (active_max running/queued and waiting_max waiting), -EINVAL
 * (active_max 0), -ESHUTDOWN after pool_stop, -ENOMEM. The key is copied. */
int pool_submit_shared(struct lb_pool *p, const char *key, size_t active_max, size_t waiting_max,
                       lb_job_fn fn, void *arg);

/* Jobs waiting (in the queue or behind a job of their key), and jobs running now (for
 * /metrics). */
size_t pool_queued(struct lb_pool *p);
size_t pool_running(struct lb_pool *p);

/* Refuse new jobs, let the workers finish every queued and running job, join them. */
void pool_stop(struct lb_pool *p);

/* pool_stop if not done yet, then free. NULL is accepted. */
void pool_destroy(struct lb_pool *p);

#endif
