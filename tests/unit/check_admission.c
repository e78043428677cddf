/* check_admission.c - unit tests for lending's admission control (src/lend/admission.c): the
 * creation slots, the seeds' FIFO queue and its bound, the refusal's Retry-After estimate, and
 * refills yielding to seeds. The end-to-end behaviour (HTTP 429, no record, client retries) is
 * tests/e2e/test_admission.c. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "lend/admission.h"
#include "util/metrics.h"

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
}

/* Wait (at most 5 s) until the gauge c reads want. */
static void wait_gauge(enum lb_counter c, uint64_t want)
{
    for (int i = 0; i < 5000 && metrics_get(c) != want; i++)
        sleep_ms(1);
    ck_assert_uint_eq(metrics_get(c), want);
}

/* Wait (at most 5 s) until *order reads want: the waiters count themselves in after they are
 * admitted, which follows the queue's gauge. */
static void wait_order(atomic_int *order, int want)
{
    for (int i = 0; i < 5000 && atomic_load(order) != want; i++)
        sleep_ms(1);
    ck_assert_int_eq(atomic_load(order), want);
}

struct waiter {
    struct lend_admission *a;
    struct lend_admission_slot slot;
    int r;
    atomic_int *order; /* the next place in line to take */
    int place;         /* which place this one took, once in */
    pthread_t thread;
};

static void *waiter_main(void *arg)
{
    struct waiter *w = arg;
    struct lb_error err = {0};

    w->r = lend_admission_enter_seed(w->a, &w->slot, &err);
    w->place = atomic_fetch_add(w->order, 1);
    return NULL;
}

static void waiter_start(struct waiter *w, struct lend_admission *a, atomic_int *order)
{
    *w = (struct waiter){.a = a, .order = order, .place = -1};
    ck_assert_int_eq(pthread_create(&w->thread, NULL, waiter_main, w), 0);
}

START_TEST(test_no_bound)
{
    struct lend_admission *a = (struct lend_admission *)1;
    struct lend_admission_slot s;

    ck_assert_int_eq(lend_admission_new(0, 5, &a, NULL), 0);
    ck_assert_ptr_null(a);
    for (int i = 0; i < 100; i++)
        ck_assert_int_eq(lend_admission_enter_seed(a, &s, NULL), 0);
    ck_assert_int_eq(lend_admission_enter_refill(a, 0, &s, NULL), 0);
    lend_admission_leave(a, &s);
}
END_TEST

/* One slot, a queue of two: two wait in arrival order, the fourth is refused at once with a
 * Retry-After, and the gauges follow. */
START_TEST(test_fifo_queue_and_refusal)
{
    struct lend_admission *a;
    struct lend_admission_slot first, extra;
    struct lb_error err = {0};
    struct waiter b, c;
    atomic_int order = 0;

    ck_assert_int_eq(lend_admission_new(1, 2, &a, &err), 0);
    ck_assert_int_eq(lend_admission_enter_seed(a, &first, &err), 0);
    ck_assert(first.held);
    ck_assert_uint_eq(metrics_get(LB_M_SEEDS_STARTING), 1);
    waiter_start(&b, a, &order);
    wait_gauge(LB_M_SEED_QUEUE_LENGTH, 1);
    waiter_start(&c, a, &order);
    wait_gauge(LB_M_SEED_QUEUE_LENGTH, 2);
    uint64_t refused = metrics_get(LB_M_SEEDS_OVERLOADED);

    ck_assert_int_eq(lend_admission_enter_seed(a, &extra, &err), -EAGAIN);
    ck_assert(!extra.held);
    ck_assert_int_eq(err.code, -EAGAIN);
    ck_assert_int_ge(err.retry_after_s, 1);
    ck_assert_ptr_nonnull(strstr(err.message, "lending.max_seed_queue"));
    ck_assert_uint_eq(metrics_get(LB_M_SEEDS_OVERLOADED), refused + 1);
    /* nobody moved while the slot is held */
    sleep_ms(50);
    ck_assert_int_eq(atomic_load(&order), 0);
    lend_admission_leave(a, &first);
    ck_assert(!first.held);
    wait_gauge(LB_M_SEED_QUEUE_LENGTH, 1);
    wait_order(&order, 1);
    ck_assert_int_eq(pthread_join(b.thread, NULL), 0);
    ck_assert_int_eq(b.r, 0);
    ck_assert_int_eq(b.place, 0); /* the first to queue is the first in */
    lend_admission_leave(a, &b.slot);
    ck_assert_int_eq(pthread_join(c.thread, NULL), 0);
    ck_assert_int_eq(c.r, 0);
    ck_assert_int_eq(c.place, 1);
    ck_assert_uint_eq(metrics_get(LB_M_SEED_QUEUE_LENGTH), 0);
    lend_admission_leave(a, &c.slot);
    ck_assert_uint_eq(metrics_get(LB_M_SEEDS_STARTING), 0);
    lend_admission_free(a);
}
END_TEST

/* Retry-After: the mean create time times the rounds of creations ahead, 1 to 60 s. */
START_TEST(test_retry_after_estimate)
{
    struct lend_admission *a;
    struct lend_admission_slot s, t;
    struct lb_error err = {0};
    struct waiter w1, w2;
    atomic_int order = 0;

    ck_assert_int_eq(lend_admission_new(1, 0, &a, &err), 0);
    /* before any create: 1 s per round; ahead: the one starting and the refused one */
    ck_assert_int_eq(lend_admission_enter_seed(a, &s, &err), 0);
    ck_assert_int_eq(lend_admission_enter_seed(a, &t, &err), -EAGAIN);
    ck_assert_int_eq(err.retry_after_s, 2);
    s.since_ms -= 5000; /* a create of 5 s */
    lend_admission_leave(a, &s);
    ck_assert_int_eq(lend_admission_enter_seed(a, &s, &err), 0);
    ck_assert_int_eq(lend_admission_enter_seed(a, &t, &err), -EAGAIN);
    ck_assert_int_ge(err.retry_after_s, 10);
    ck_assert_int_le(err.retry_after_s, 11);
    s.since_ms -= 1000000; /* a very long one: capped */
    lend_admission_leave(a, &s);
    ck_assert_int_eq(lend_admission_enter_seed(a, &s, &err), 0);
    ck_assert_int_eq(lend_admission_enter_seed(a, &t, &err), -EAGAIN);
    ck_assert_int_eq(err.retry_after_s, 60);
    lend_admission_leave(a, &s);
    lend_admission_free(a);

    /* two slots, a queue of two, creates of 4 s: 2 starting + 2 queued + it = 3 rounds */
    ck_assert_int_eq(lend_admission_new(2, 2, &a, &err), 0);
    ck_assert_int_eq(lend_admission_enter_seed(a, &s, &err), 0);
    s.since_ms -= 4000;
    lend_admission_leave(a, &s);
    ck_assert_int_eq(lend_admission_enter_seed(a, &s, &err), 0);
    ck_assert_int_eq(lend_admission_enter_seed(a, &t, &err), 0);
    waiter_start(&w1, a, &order);
    wait_gauge(LB_M_SEED_QUEUE_LENGTH, 1);
    waiter_start(&w2, a, &order);
    wait_gauge(LB_M_SEED_QUEUE_LENGTH, 2);
    struct lend_admission_slot u;

    ck_assert_int_eq(lend_admission_enter_seed(a, &u, &err), -EAGAIN);
    ck_assert_int_eq(err.retry_after_s, 12);
    lend_admission_leave(a, &s);
    lend_admission_leave(a, &t);
    ck_assert_int_eq(pthread_join(w1.thread, NULL), 0);
    ck_assert_int_eq(pthread_join(w2.thread, NULL), 0);
    lend_admission_leave(a, &w1.slot);
    lend_admission_leave(a, &w2.slot);
    ck_assert_uint_eq(metrics_get(LB_M_SEEDS_STARTING), 0);
    lend_admission_free(a);
}
END_TEST

struct refiller {
    struct lend_admission *a;
    struct lend_admission_slot slot;
    atomic_int done;
    int r;
    pthread_t thread;
};

static void *refiller_main(void *arg)
{
    struct refiller *f = arg;

    f->r = lend_admission_enter_refill(f->a, 5000, &f->slot, NULL);
    atomic_store(&f->done, 1);
    return NULL;
}

/* Refills take a slot only while no seed waits, one refill at a time: a slot given back goes
 * to a waiting seed before a waiting refill. */
START_TEST(test_refills_yield)
{
    struct lend_admission *a;
    struct lend_admission_slot s, q, r1, r2;
    struct lb_error err = {0};
    struct refiller f = {0};
    struct waiter w;
    atomic_int order = 0;

    ck_assert_int_eq(lend_admission_new(3, 4, &a, &err), 0);
    ck_assert_int_eq(lend_admission_enter_refill(a, 0, &r1, &err), 0);
    ck_assert(r1.held && r1.refill);
    /* a second refill waits for the first, though two slots are free */
    ck_assert_int_eq(lend_admission_enter_refill(a, 20, &r2, &err), -EAGAIN);
    ck_assert(!r2.held);
    /* seeds are not held up by it */
    ck_assert_int_eq(lend_admission_enter_seed(a, &s, &err), 0);
    ck_assert_int_eq(lend_admission_enter_seed(a, &q, &err), 0);
    ck_assert_uint_eq(metrics_get(LB_M_SEEDS_STARTING), 3);
    lend_admission_leave(a, &r1);
    ck_assert_int_eq(lend_admission_enter_seed(a, &r1, &err), 0); /* all three held by seeds */
    /* a refill waits, then a seed queues behind it in time */
    f.a = a;
    ck_assert_int_eq(pthread_create(&f.thread, NULL, refiller_main, &f), 0);
    sleep_ms(30);
    waiter_start(&w, a, &order);
    wait_gauge(LB_M_SEED_QUEUE_LENGTH, 1);
    lend_admission_leave(a, &s);
    /* the freed slot went to the seed, not to the refill that waited longer */
    ck_assert_int_eq(pthread_join(w.thread, NULL), 0);
    ck_assert_int_eq(w.r, 0);
    sleep_ms(30);
    ck_assert_int_eq(atomic_load(&f.done), 0);
    lend_admission_leave(a, &q);
    ck_assert_int_eq(pthread_join(f.thread, NULL), 0);
    ck_assert_int_eq(f.r, 0);
    ck_assert(f.slot.held && f.slot.refill);
    lend_admission_leave(a, &f.slot);
    lend_admission_leave(a, &r1);
    lend_admission_leave(a, &w.slot);
    ck_assert_uint_eq(metrics_get(LB_M_SEEDS_STARTING), 0);
    lend_admission_free(a);
}
END_TEST

/* lend_admission_set_refills: an engine pool's refills hold up to n slots at once, but never
 * the last one (a seed always finds a slot free of refills); 1 (the default) again after. */
START_TEST(test_refills_in_parallel)
{
    struct lend_admission *a;
    struct lend_admission_slot r[4], s, q;
    struct lb_error err = {0};

    ck_assert_int_eq(lend_admission_new(4, 4, &a, &err), 0);
    lend_admission_set_refills(a, 8); /* bounded by max_starting - 1: 3 */
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(lend_admission_enter_refill(a, 0, &r[i], &err), 0);
        ck_assert(r[i].held && r[i].refill);
    }
    ck_assert_int_eq(lend_admission_enter_refill(a, 20, &r[3], &err), -EAGAIN);
    ck_assert(!r[3].held);
    ck_assert_uint_eq(metrics_get(LB_M_SEEDS_STARTING), 3);
    ck_assert_int_eq(lend_admission_enter_seed(a, &s, &err), 0); /* the slot left to seeds */
    lend_admission_leave(a, &r[0]);
    lend_admission_leave(a, &r[1]);
    lend_admission_leave(a, &r[2]);
    /* back to one refill at a time */
    lend_admission_set_refills(a, 1);
    ck_assert_int_eq(lend_admission_enter_refill(a, 0, &r[0], &err), 0);
    ck_assert_int_eq(lend_admission_enter_refill(a, 20, &r[1], &err), -EAGAIN);
    lend_admission_leave(a, &r[0]);
    lend_admission_leave(a, &s);
    lend_admission_free(a);
    /* max_starting 1: one refill, however many are asked for */
    ck_assert_int_eq(lend_admission_new(1, 4, &a, &err), 0);
    lend_admission_set_refills(a, 8);
    ck_assert_int_eq(lend_admission_enter_refill(a, 0, &r[0], &err), 0);
    ck_assert_int_eq(lend_admission_enter_refill(a, 20, &r[1], &err), -EAGAIN);
    lend_admission_leave(a, &r[0]);
    ck_assert_int_eq(lend_admission_enter_seed(a, &q, &err), 0);
    lend_admission_leave(a, &q);
    ck_assert_uint_eq(metrics_get(LB_M_SEEDS_STARTING), 0);
    lend_admission_free(a);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("admission");
    TCase *tc = tcase_create("admission");
    SRunner *sr;
    int failed;

    tcase_add_test(tc, test_no_bound);
    tcase_add_test(tc, test_fifo_queue_and_refusal);
    tcase_add_test(tc, test_retry_after_estimate);
    tcase_add_test(tc, test_refills_yield);
    tcase_add_test(tc, test_refills_in_parallel);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
