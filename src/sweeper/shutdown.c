/* shutdown.c - see sweeper.h: the shutdown sweep (stop every recorded sandbox, bounded
 * concurrency). */
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

struct stop_all_ctx {
    struct lb_lend *l;
    struct lb_record *recs;
    size_t n, next;
    const char *reason;
    pthread_mutex_t mutex;
    int failed;
    int in_flight, max_in_flight;
};

static void *stop_all_worker(void *arg)
{
    struct stop_all_ctx *c = arg;

    for (;;) {
        size_t i;
        struct lb_record *r;
        enum lb_record_state fail;

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
        int rc = lend_stop_record(
            c->l, r, r->state == LB_STATE_LENT || r->state == LB_STATE_WARM ? c->reason : NULL,
            fail, NULL);
        pthread_mutex_lock(&c->mutex);
        c->in_flight--;
        if (rc < 0)
            c->failed++;
        pthread_mutex_unlock(&c->mutex);
    }
    return NULL;
}

int sweeper_stop_all(struct lb_lend *l, const char *reason, size_t concurrency)
{
    struct stop_all_ctx c = {.l = l, .reason = reason};
    struct lb_record_filter f = {.state = -1};
    struct lb_record *all = NULL;
    size_t n_all = 0, n_threads;
    pthread_t *threads;
    int64_t t0 = clock_mono_ms();

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
    if (!c.recs)
        return -1;
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
    metrics_set(LB_M_SHUTDOWN_SWEEP_MS, (uint64_t)(clock_mono_ms() - t0));
    log_info("shutdown sweep: %zu sandboxes, %d failed, at most %d stops in flight, %lld ms", c.n,
             c.failed, c.max_in_flight, (long long)(clock_mono_ms() - t0));
    pthread_mutex_destroy(&c.mutex);
    free(threads);
    store_records_free(c.recs, c.n);
    return c.failed;
}
