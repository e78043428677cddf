/* sweeper.c - see sweeper.h: the sweeper thread and its pass (retries due, TTL stops, lost
 * sandboxes, purge). */
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

/* ---------- sweeper and shutdown ---------- */

/* One sweeper pass over the records f selects: each is re-read under its session's lock (a
 * seed or release may have handled it meanwhile) and stopped if still wanted. ttl: the pass of
 * expired lent sandboxes; else the pass of due retries. Returns the stops attempted. */
static int sweeper_pass(struct lb_lend *l, const struct lb_record_filter *f, bool ttl,
                        struct lb_error *err)
{
    struct lb_record *recs = NULL;
    size_t n = 0;
    int attempted = 0, r = store_list_sandboxes(lend_store(l), f, &recs, &n, err);

    for (size_t i = 0; r == 0 && i < n; i++) {
        struct lend_session_lock *lock = NULL;
        struct lb_record cur = {0};
        /* a busy session is skipped: its holder handles it, or the next pass does */
        bool busy = recs[i].rsid && lend_session_lock(l, recs[i].rsid, true, &lock, NULL) < 0;
        bool wanted =
            !busy && store_get_sandbox(lend_store(l), recs[i].id, &cur, NULL) == 0 &&
            (ttl ? (cur.state == LB_STATE_LENT || cur.state == LB_STATE_WARM) &&
                       cur.expires_at > 0 && cur.expires_at <= f->now_s
                 : cur.state == LB_STATE_FAILED_SEED || cur.state == LB_STATE_STOP_FAILED ||
                       cur.state == LB_STATE_STOPPING);

        /* a warm sandbox past its max age: claimed first, so no seed takes it meanwhile */
        if (wanted && cur.state == LB_STATE_WARM) {
            attempted++;
            if (store_claim_warm(lend_store(l), cur.id, "max_age", NULL) == 0) {
                log_info_sbx(cur.id, "warm sandbox %s reached its max age", cur.id);
                lend_stop_record(l, &cur, NULL, LB_STATE_STOP_FAILED, NULL);
            }
        } else if (wanted) {
            attempted++;
            if (ttl) {
                log_info_sbx(cur.id, "sandbox %s reached its TTL", cur.id);
                if (lend_stop_record(l, &cur, "ttl", LB_STATE_STOP_FAILED, NULL) == 0)
                    metrics_add(LB_M_TTL_REAPED, 1);
            } else {
                lend_stop_record(l, &cur, NULL,
                                 cur.state == LB_STATE_FAILED_SEED ? LB_STATE_FAILED_SEED
                                                                   : LB_STATE_STOP_FAILED,
                                 NULL);
            }
        }
        store_record_release(&cur);
        lend_session_unlock(l, lock);
    }
    store_records_free(recs, n);
    return r < 0 ? r : attempted;
}

int sweeper_sweep_once(struct lb_lend *l, struct lb_error *err)
{
    struct lb_record_filter due = {.state = -1,
                                   .pending_stop_only = true,
                                   .due_only = true,
                                   .now_s = clock_now_s(),
                                   .limit = 256};
    struct lb_record_filter expired = {
        .state = -1, .expired_only = true, .now_s = due.now_s, .limit = 256};
    int64_t t_start = clock_mono_ms();
    int retried = sweeper_pass(l, &due, false, err);
    int reaped = retried < 0 ? 0 : sweeper_pass(l, &expired, true, err);
    int idle = lend_idle_sweep(l);

    /* lent sandboxes whose init died outside lendbox's control: stopped, reason lost */
    if (retried >= 0 && reaped >= 0)
        reaped += lend_sweep_lost(l);

    if (retried >= 0 && reaped >= 0 && lend_config(l)->retention_s > 0)
        store_purge_stopped(lend_store(l), clock_now_s() - lend_config(l)->retention_s, NULL);
    /* the event feed's retention (events.max_age_s, events.max_count), in bounded batches */
    (void)store_events_prune(lend_store(l), clock_now_s(), NULL);
    (void)store_check_writable(lend_store(l), NULL); /* makes a spent space reserve again */
    metrics_add(LB_M_SWEEPS, 1);
    metrics_set(LB_M_SWEEP_LAST_MS, (uint64_t)(clock_mono_ms() - t_start));
    if (retried < 0)
        return retried;
    return reaped < 0 ? reaped : retried + reaped + idle;
}

/* ---------- the thread ---------- */

struct lb_sweeper {
    pthread_t thread;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    bool stop;
    struct lb_lend *lend;
    int64_t interval_s;
};

static void *sweeper_main(void *arg)
{
    struct lb_sweeper *s = arg;

    pthread_mutex_lock(&s->mutex);
    while (!s->stop) {
        struct timespec until = clock_realtime_after_ms(s->interval_s * 1000);

        pthread_cond_timedwait(&s->cond, &s->mutex, &until);
        if (s->stop)
            break;
        pthread_mutex_unlock(&s->mutex);
        sweeper_sweep_once(s->lend, NULL);
        pthread_mutex_lock(&s->mutex);
    }
    pthread_mutex_unlock(&s->mutex);
    return NULL;
}

int sweeper_start(struct lb_lend *l, int64_t interval_s, struct lb_sweeper **out)
{
    struct lb_sweeper *s = calloc(1, sizeof(*s));
    int r;

    *out = NULL;
    if (!s)
        return -ENOMEM;
    pthread_mutex_init(&s->mutex, NULL);
    pthread_cond_init(&s->cond, NULL);
    s->lend = l;
    s->interval_s = interval_s > 0 ? interval_s : 5;
    r = pthread_create(&s->thread, NULL, sweeper_main, s);
    if (r != 0) {
        pthread_cond_destroy(&s->cond);
        pthread_mutex_destroy(&s->mutex);
        free(s);
        return -r;
    }
    *out = s;
    return 0;
}

void sweeper_stop(struct lb_sweeper *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mutex);
    s->stop = true;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->mutex);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->mutex);
    free(s);
}
