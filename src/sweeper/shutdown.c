/* shutdown.c - see sweeper.h: the shutdown sweep (stop every recorded sandbox, bounded
 * concurrency).
 *
 * The records are written in batches, not one transaction per transition: every record to
 * stop is marked "stopping" at once, the providers' stops run (concurrency at a time), and the
 * ones that succeeded are marked "stopped" at once; a failed stop is recorded on its own, as
 * any stop's. Every marked sandbox's stop is begun (provider_stop_begin: the local provider
 * kills its init) before the first stop is waited for, so the sandboxes die all at once and
 * not concurrency at a time. A record whose batch could not be written is stopped the way any
 * other stop is (lend_stop_record). A daemon that dies in the middle leaves "stopping" records,
 * which the next start's reconciliation stops again (a stop of a sandbox that is gone succeeds). */
#include "sweeper/sweeper.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lend/lend_internal.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"

#define SWEEP_BATCH 256 /* records per transaction */

/* What became of one record's stop. */
enum sweep_state {
    SWEEP_ALONE,   /* not marked in a batch: lend_stop_record does all of it */
    SWEEP_MARKED,  /* marked "stopping" in a batch: the provider's stop is due */
    SWEEP_STOPPED, /* the provider stopped it: "stopped" is due */
    SWEEP_FAILED,  /* the stop failed (recorded) */
};

struct stop_all_ctx {
    struct lb_lend *l;
    struct lb_record *recs;
    enum sweep_state *st;
    size_t n, next, next_begin;
    const char *reason;
    pthread_mutex_t mutex;
    int failed;
    int in_flight, max_in_flight;
};

/* The reason recorded for r's stop: the sweep's for a live sandbox; a failed one keeps its own. */
static const char *reason_of(const struct stop_all_ctx *c, const struct lb_record *r)
{
    return r->state == LB_STATE_LENT || r->state == LB_STATE_WARM ? c->reason : NULL;
}

static void *stop_all_worker(void *arg)
{
    struct stop_all_ctx *c = arg;

    /* first every marked sandbox's stop is begun (its init killed), so that all of them die
     * at once; then each stop is waited for and finished */
    for (;;) {
        size_t i;

        pthread_mutex_lock(&c->mutex);
        i = c->next_begin < c->n ? c->next_begin++ : c->n;
        pthread_mutex_unlock(&c->mutex);
        if (i >= c->n)
            break;
        if (c->st[i] == SWEEP_MARKED)
            lend_stop_begin(c->l, &c->recs[i]);
    }
    for (;;) {
        struct lb_error perr = {0};
        size_t i;
        struct lb_record *r;
        enum lb_record_state fail;
        int rc;

        pthread_mutex_lock(&c->mutex);
        if (c->next >= c->n) {
            pthread_mutex_unlock(&c->mutex);
            break;
        }
        i = c->next++;
        c->in_flight++;
        if (c->in_flight > c->max_in_flight)
            c->max_in_flight = c->in_flight;
        pthread_mutex_unlock(&c->mutex);
        r = &c->recs[i];
        fail = r->state == LB_STATE_FAILED_SEED ? LB_STATE_FAILED_SEED : LB_STATE_STOP_FAILED;
        if (c->st[i] == SWEEP_ALONE) {
            rc = lend_stop_record(c->l, r, reason_of(c, r), fail, NULL);
        } else {
            rc = lend_stop_provider(c->l, r, &perr);
            if (rc < 0)
                lend_stop_failed(c->l, r, fail, perr.message, NULL);
        }
        pthread_mutex_lock(&c->mutex);
        c->in_flight--;
        if (rc < 0)
            c->failed++;
        if (c->st[i] == SWEEP_MARKED)
            c->st[i] = rc < 0 ? SWEEP_FAILED : SWEEP_STOPPED;
        pthread_mutex_unlock(&c->mutex);
    }
    return NULL;
}

/* Mark the records "stopping", SWEEP_BATCH to a transaction; the ones of a batch that could
 * not be written stay SWEEP_ALONE. */
static void mark_stopping(struct stop_all_ctx *c, const char **ids, const char **reasons)
{
    for (size_t at = 0; at < c->n; at += SWEEP_BATCH) {
        size_t k = c->n - at < SWEEP_BATCH ? c->n - at : SWEEP_BATCH;
        struct lb_error err = {0};

        for (size_t i = 0; i < k; i++) {
            const struct lb_record *r = &c->recs[at + i];

            if (r->state == LB_STATE_STOP_FAILED || r->state == LB_STATE_FAILED_SEED)
                metrics_add(LB_M_STOP_RETRIES, 1);
            ids[i] = r->id;
            reasons[i] = reason_of(c, r);
        }
        if (store_mark_stopping_many(lend_store(c->l), ids, reasons, k, &err) < 0) {
            log_warn("shutdown sweep: cannot record %zu stops at once (%s); one by one", k,
                     err.message);
            continue;
        }
        for (size_t i = 0; i < k; i++)
            c->st[at + i] = SWEEP_MARKED;
    }
}

/* Mark the stopped ones "stopped", SWEEP_BATCH to a transaction (one by one when a batch
 * cannot be written), then the rest of each stop (lend_stop_done). */
static void mark_stopped(struct stop_all_ctx *c, const char **ids)
{
    size_t k = 0;

    for (size_t i = 0; i < c->n; i++) {
        if (c->st[i] == SWEEP_STOPPED)
            ids[k++] = c->recs[i].id;
        if (k == 0 || (k < SWEEP_BATCH && i + 1 < c->n))
            continue;
        if (store_mark_stopped_many(lend_store(c->l), ids, k, NULL, NULL) < 0) {
            for (size_t j = 0; j < k; j++)
                (void)store_mark_stopped(lend_store(c->l), ids[j], NULL, NULL);
        }
        k = 0;
    }
    for (size_t i = 0; i < c->n; i++) {
        if (c->st[i] == SWEEP_STOPPED)
            lend_stop_done(c->l, &c->recs[i], reason_of(c, &c->recs[i]));
    }
}

int sweeper_stop_all(struct lb_lend *l, const char *reason, size_t concurrency)
{
    struct stop_all_ctx c = {.l = l, .reason = reason};
    struct lb_record_filter f = {.state = -1};
    struct lb_record *all = NULL;
    size_t n_all = 0, n_threads;
    pthread_t *threads = NULL;
    const char **ids = NULL, **reasons = NULL;
    int64_t t0 = clock_mono_ms(), t_marked, t_stopped;
    int ret = -1;

    if (store_list_sandboxes(lend_store(l), &f, &all, &n_all, NULL) < 0)
        return -1;
    /* Keep what is not stopped (live and failed ones). */
    c.recs = calloc(n_all + 1, sizeof(*c.recs));
    for (size_t i = 0; c.recs && i < n_all; i++) {
        if (all[i].state != LB_STATE_STOPPED) {
            c.recs[c.n++] = all[i];
            memset(&all[i], 0, sizeof(all[i]));
        }
    }
    store_records_free(all, n_all);
    c.st = calloc(c.n + 1, sizeof(*c.st));
    ids = calloc(SWEEP_BATCH, sizeof(*ids));
    reasons = calloc(SWEEP_BATCH, sizeof(*reasons));
    if (!c.recs || !c.st || !ids || !reasons)
        goto out;
    mark_stopping(&c, ids, reasons);
    t_marked = clock_mono_ms();
    n_threads = c.n < concurrency ? c.n : concurrency;
    threads = calloc(n_threads + 1, sizeof(*threads));
    pthread_mutex_init(&c.mutex, NULL);
    size_t started = 0;
    for (; threads && started < n_threads; started++)
        if (pthread_create(&threads[started], NULL, stop_all_worker, &c) != 0)
            break;
    if (started == 0)
        stop_all_worker(&c);
    for (size_t i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    pthread_mutex_destroy(&c.mutex);
    t_stopped = clock_mono_ms();
    mark_stopped(&c, ids);
    metrics_set(LB_M_SHUTDOWN_SWEEP_MS, (uint64_t)(clock_mono_ms() - t0));
    log_info("shutdown sweep: %zu sandboxes, %d failed, at most %d stops in flight, %lld ms "
             "(records %lld + stops %lld + records %lld)",
             c.n, c.failed, c.max_in_flight, (long long)(clock_mono_ms() - t0),
             (long long)(t_marked - t0), (long long)(t_stopped - t_marked),
             (long long)(clock_mono_ms() - t_stopped));
    ret = c.failed;
out:
    free(threads);
    free(ids);
    free(reasons);
    free(c.st);
    store_records_free(c.recs, c.n);
    return ret;
}
