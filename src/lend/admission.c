/* admission.c - see admission.h. */
#include "lend/admission.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "util/clock.h"
#include "util/metrics.h"

/* The Retry-After bounds, seconds. */
#define ADMISSION_RETRY_MIN_S 1
#define ADMISSION_RETRY_MAX_S 60

struct lend_admission {
    int64_t max_starting, max_queue;
    pthread_mutex_t mutex;
    pthread_cond_t cond; /* broadcast when a slot is given back or the queue's head moves */
    int64_t starting;    /* slots held (seeds and refills) */
    int64_t refills;     /* of which by refills (at most refills_max) */
    int64_t refills_max; /* lend_admission_set_refills; 1 until set */
    /* the FIFO of waiting seeds as tickets: head is the next to start, tail the next given */
    uint64_t head, tail;
    int64_t create_ms; /* mean of recent create durations (exponential, 1/8); 0: none yet */
};

int lend_admission_new(int64_t max_starting, int64_t max_queue, struct lend_admission **out,
                       struct lb_error *err)
{
    struct lend_admission *a;

    *out = NULL;
    if (max_starting <= 0)
        return 0;
    a = calloc(1, sizeof(*a));
    if (!a)
        return lb_error_set(err, -ENOMEM, "out of memory");
    a->max_starting = max_starting;
    a->max_queue = max_queue > 0 ? max_queue : 0;
    a->refills_max = 1;
    pthread_mutex_init(&a->mutex, NULL);
    pthread_cond_init(&a->cond, NULL);
    *out = a;
    return 0;
}

void lend_admission_free(struct lend_admission *a)
{
    if (!a)
        return;
    pthread_mutex_destroy(&a->mutex);
    pthread_cond_destroy(&a->cond);
    free(a);
}

/* The gauges, from a's counts. Call with a->mutex held. */
static void admission_publish(const struct lend_admission *a)
{
    metrics_set(LB_M_SEEDS_STARTING, (uint64_t)a->starting);
    metrics_set(LB_M_SEED_QUEUE_LENGTH, a->tail - a->head);
}

/* Take a slot for slot's holder. Call with a->mutex held. */
static void admission_take(struct lend_admission *a, struct lend_admission_slot *slot, bool refill)
{
    a->starting++;
    if (refill)
        a->refills++;
    *slot =
        (struct lend_admission_slot){.held = true, .refill = refill, .since_ms = clock_mono_ms()};
    admission_publish(a);
}

/* Seconds until a seed refused now would likely find room: the mean create time times the
 * rounds of max_starting creates ahead of it (those starting, those queued, and itself). Call
 * with a->mutex held. */
static long admission_retry_after_s(const struct lend_admission *a)
{
    int64_t ahead = a->starting + (int64_t)(a->tail - a->head) + 1;
    int64_t rounds = (ahead + a->max_starting - 1) / a->max_starting;
    int64_t per = a->create_ms > 0 ? a->create_ms : 1000;
    int64_t s;

    if (rounds > ADMISSION_RETRY_MAX_S * 1000 / per + 1)
        return ADMISSION_RETRY_MAX_S;
    s = (per * rounds + 999) / 1000;
    return s < ADMISSION_RETRY_MIN_S   ? ADMISSION_RETRY_MIN_S
           : s > ADMISSION_RETRY_MAX_S ? ADMISSION_RETRY_MAX_S
                                       : (long)s;
}

int lend_admission_enter_seed(struct lend_admission *a, struct lend_admission_slot *slot,
                              struct lb_error *err)
{
    uint64_t ticket;

    *slot = (struct lend_admission_slot){0};
    if (!a)
        return 0;
    pthread_mutex_lock(&a->mutex);
    if (a->head == a->tail && a->starting < a->max_starting) {
        admission_take(a, slot, false);
        pthread_mutex_unlock(&a->mutex);
        return 0;
    }
    if (a->tail - a->head >= (uint64_t)a->max_queue) {
        long retry = admission_retry_after_s(a);
        int64_t starting = a->starting, queued = (int64_t)(a->tail - a->head);

        pthread_mutex_unlock(&a->mutex);
        metrics_add(LB_M_SEEDS_OVERLOADED, 1);
        lb_error_set(err, -EAGAIN,
                     "too many sandboxes starting (%lld of lending.max_starting %lld) and seeds "
                     "waiting (%lld of lending.max_seed_queue %lld); retry in %ld s",
                     (long long)starting, (long long)a->max_starting, (long long)queued,
                     (long long)a->max_queue, retry);
        if (err)
            err->retry_after_s = retry;
        return -EAGAIN;
    }
    ticket = a->tail++;
    admission_publish(a);
    while (ticket != a->head || a->starting >= a->max_starting)
        pthread_cond_wait(&a->cond, &a->mutex);
    a->head++;
    admission_take(a, slot, false);
    /* the next in line may find a slot free as well */
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mutex);
    return 0;
}

void lend_admission_set_refills(struct lend_admission *a, int64_t n)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->mutex);
    /* one slot stays free of refills (while there are two), so a seed never waits for them */
    if (n > a->max_starting - 1)
        n = a->max_starting - 1;
    a->refills_max = n > 1 ? n : 1;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mutex);
}

int lend_admission_enter_refill(struct lend_admission *a, int64_t wait_ms,
                                struct lend_admission_slot *slot, struct lb_error *err)
{
    struct timespec until = clock_realtime_after_ms(wait_ms > 0 ? wait_ms : 0);
    int r = 0;

    *slot = (struct lend_admission_slot){0};
    if (!a)
        return 0;
    pthread_mutex_lock(&a->mutex);
    while (a->head != a->tail || a->refills >= a->refills_max || a->starting >= a->max_starting) {
        if (r == ETIMEDOUT || wait_ms <= 0) {
            pthread_mutex_unlock(&a->mutex);
            return lb_error_set(err, -EAGAIN,
                                "no creation slot for a refill (seeds first; "
                                "lending.max_starting)");
        }
        r = pthread_cond_timedwait(&a->cond, &a->mutex, &until);
    }
    admission_take(a, slot, true);
    pthread_mutex_unlock(&a->mutex);
    return 0;
}

void lend_admission_leave(struct lend_admission *a, struct lend_admission_slot *slot)
{
    int64_t took;

    if (!a || !slot || !slot->held)
        return;
    took = clock_mono_ms() - slot->since_ms;
    pthread_mutex_lock(&a->mutex);
    a->starting--;
    if (slot->refill)
        a->refills--;
    a->create_ms = a->create_ms > 0 ? (a->create_ms * 7 + took) / 8 : (took > 0 ? took : 1);
    admission_publish(a);
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mutex);
    slot->held = false;
}
