/* check_idslots.c - unit tests for src/util/idslots.c and idclaim.c, the id slot table of the
 * lxd provider's instances (claims shared with the local provider's slots): slots are distinct,
 * aligned and inside the range; a full table is -EUSERS; a slot given back is taken again; two
 * tables on one claim dir (two daemons, or two providers of one daemon: another tag) never hold
 * one slot at once, whatever their ranges; a restart keeps the claims of its live users (marked)
 * and the sweep drops only the others; a dead daemon's claims (its state dir gone) are taken
 * over; threads at once never get one slot twice. Each case works in a claim dir of its own. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/idslots.h"

#define SLOT IDCLAIM_SLOT_IDS
#define BASE (100u * SLOT)

static char top[64], claims[128], state_a[128], state_b[128];

static void dirs_make(void)
{
    snprintf(top, sizeof(top), "/tmp/check-idslots-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(top));
    snprintf(claims, sizeof(claims), "%s/run/slots", top);
    snprintf(state_a, sizeof(state_a), "%s/a", top);
    snprintf(state_b, sizeof(state_b), "%s/b", top);
    ck_assert_int_eq(mkdir(state_a, 0700), 0);
    ck_assert_int_eq(mkdir(state_b, 0700), 0);
}

static void dirs_remove(void)
{
    char cmd[128];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", top);
    ck_assert_int_eq(system(cmd), 0);
}

static void table(struct lb_idslots *t, uint32_t base, uint32_t count, const char *state,
                  const char *tag)
{
    struct lb_error err = {0};

    ck_assert_int_eq(idslots_init(t, base, count, claims, state, tag, &err), 0);
}

/* The claim file of the slot whose first id is first: its content ("" when there is none). */
static void claim_of(uint32_t first, char *buf, size_t size)
{
    char path[256];
    FILE *f;
    size_t n = 0;

    snprintf(path, sizeof(path), "%s/%u", claims, first);
    f = fopen(path, "r");
    if (f) {
        n = fread(buf, 1, size - 1, f);
        fclose(f);
    }
    buf[n] = '\0';
}

START_TEST(test_distinct_full_and_reused)
{
    struct lb_idslots t;
    uint32_t got[4], extra;
    char c[512], want[512];
    struct stat st;

    dirs_make();
    table(&t, BASE, 4, state_a, "lxd");
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(idslots_alloc(&t, &got[i]), 0);
        ck_assert_uint_eq(got[i] % SLOT, 0);
        ck_assert_uint_ge(got[i], BASE);
        ck_assert_uint_lt(got[i], BASE + 4 * SLOT);
        for (int k = 0; k < i; k++)
            ck_assert_uint_ne(got[i], got[k]);
        /* claimed host-wide: the file names the state dir and the tag */
        ck_assert_int_eq(stat(state_a, &st), 0);
        snprintf(want, sizeof(want), "%llu:%llu %s\nlxd\n", (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino, state_a);
        claim_of(got[i], c, sizeof(c));
        ck_assert_str_eq(c, want);
    }
    ck_assert_uint_eq(idslots_used(&t), 4);
    ck_assert_int_eq(idslots_alloc(&t, &extra), -EUSERS);
    idslots_free(&t, got[2]);
    claim_of(got[2], c, sizeof(c));
    ck_assert_str_eq(c, "");
    ck_assert_int_eq(idslots_alloc(&t, &extra), 0);
    ck_assert_uint_eq(extra, got[2]);
    ck_assert_int_eq(idslots_alloc(&t, &extra), -EUSERS);
    idslots_release(&t);
    dirs_remove();
}
END_TEST

START_TEST(test_two_tables_never_share)
{
    struct lb_idslots a, b, local;
    uint32_t x, y;
    uint32_t seen[8];
    int n = 0;

    dirs_make();
    /* ranges that overlap in two slots: BASE+2, BASE+3 */
    table(&a, BASE, 4, state_a, "lxd");
    table(&b, BASE + 2 * SLOT, 4, state_b, "lxd");
    while (idslots_alloc(&a, &x) == 0)
        seen[n++] = x;
    ck_assert_int_eq(n, 4);
    /* b gets only the two slots a does not reach */
    ck_assert_int_eq(idslots_alloc(&b, &y), 0);
    ck_assert_uint_ge(y, BASE + 4 * SLOT);
    ck_assert_int_eq(idslots_alloc(&b, &y), 0);
    ck_assert_uint_ge(y, BASE + 4 * SLOT);
    ck_assert_int_eq(idslots_alloc(&b, &y), -EUSERS);
    /* one daemon's other table (another tag: the local provider's claims) is kept out too */
    table(&local, BASE, 4, state_a, NULL);
    ck_assert_int_eq(idslots_alloc(&local, &y), -EUSERS);
    /* a mark of a slot another holds is refused (logged), and claims nothing */
    ck_assert_int_eq(idslots_mark(&local, seen[0]), -EBUSY);
    idslots_free(&a, seen[1]);
    ck_assert_int_eq(idslots_alloc(&local, &y), 0);
    ck_assert_uint_eq(y, seen[1]);
    ck_assert_int_eq(idslots_alloc(&a, &x), -EUSERS);
    idslots_release(&a);
    idslots_release(&b);
    idslots_release(&local);
    dirs_remove();
}
END_TEST

START_TEST(test_restart_keeps_live_claims)
{
    struct lb_idslots t;
    uint32_t got[3], x;
    char c[512];

    dirs_make();
    table(&t, BASE, 3, state_a, "lxd");
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(idslots_alloc(&t, &got[i]), 0);
    idslots_release(&t); /* a crash: the claims stay */
    table(&t, BASE, 3, state_a, "lxd");
    /* before the listing: the earlier run's claims are not handed out */
    ck_assert_int_eq(idslots_alloc(&t, &x), -EUSERS);
    /* the listing finds got[0] and got[2] live; the sweep drops got[1]'s claim only */
    ck_assert_int_eq(idslots_mark(&t, got[0]), 0);
    ck_assert_int_eq(idslots_mark(&t, got[2]), 0);
    ck_assert_int_eq(idslots_mark(&t, got[2]), 0); /* idempotent */
    idslots_sweep(&t);
    claim_of(got[1], c, sizeof(c));
    ck_assert_str_eq(c, "");
    claim_of(got[0], c, sizeof(c));
    ck_assert_str_ne(c, "");
    claim_of(got[2], c, sizeof(c));
    ck_assert_str_ne(c, "");
    ck_assert_int_eq(idslots_alloc(&t, &x), 0);
    ck_assert_uint_eq(x, got[1]);
    ck_assert_int_eq(idslots_alloc(&t, &x), -EUSERS);
    /* a slot outside the range (a range LXD chose) is claimed all the same, and given back */
    ck_assert_int_eq(idslots_mark(&t, BASE + 50 * SLOT), 0);
    claim_of(BASE + 50 * SLOT, c, sizeof(c));
    ck_assert_str_ne(c, "");
    idslots_free(&t, BASE + 50 * SLOT);
    claim_of(BASE + 50 * SLOT, c, sizeof(c));
    ck_assert_str_eq(c, "");
    idslots_release(&t);
    dirs_remove();
}
END_TEST

START_TEST(test_dead_daemon_taken_over)
{
    struct lb_idslots a, b;
    uint32_t x, y;
    char cmd[256];

    dirs_make();
    table(&a, BASE, 1, state_a, "lxd");
    table(&b, BASE, 1, state_b, "lxd");
    ck_assert_int_eq(idslots_alloc(&a, &x), 0);
    ck_assert_int_eq(idslots_alloc(&b, &y), -EUSERS);
    /* a's state dir is gone: its claim is stale */
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", state_a);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(idslots_alloc(&b, &y), 0);
    ck_assert_uint_eq(y, x);
    idslots_release(&a);
    idslots_release(&b);
    dirs_remove();
}
END_TEST

START_TEST(test_bad_range)
{
    struct lb_idslots t;
    struct lb_error err = {0};

    dirs_make();
    ck_assert_int_eq(idslots_init(&t, BASE + 1, 4, claims, state_a, "lxd", &err), -EINVAL);
    idslots_release(&t);
    ck_assert_int_eq(idslots_init(&t, BASE, 0, claims, state_a, "lxd", &err), -EINVAL);
    idslots_release(&t);
    ck_assert_int_eq(idslots_init(&t, 0xFFFF0000u, 2, claims, state_a, "lxd", &err), -EINVAL);
    idslots_release(&t);
    dirs_remove();
}
END_TEST

#define THREADS 8
#define PER_THREAD 8

struct race {
    struct lb_idslots *t;
    uint32_t got[PER_THREAD];
};

static void *race_run(void *arg)
{
    struct race *r = arg;

    for (int i = 0; i < PER_THREAD; i++)
        if (idslots_alloc(r->t, &r->got[i]) < 0)
            r->got[i] = 0;
    return NULL;
}

START_TEST(test_threads_distinct)
{
    struct lb_idslots t;
    struct race rs[THREADS];
    pthread_t th[THREADS];
    uint32_t all[THREADS * PER_THREAD], x;
    int n = 0;

    dirs_make();
    table(&t, BASE, THREADS * PER_THREAD, state_a, "lxd");
    for (int i = 0; i < THREADS; i++) {
        rs[i].t = &t;
        ck_assert_int_eq(pthread_create(&th[i], NULL, race_run, &rs[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        for (int k = 0; k < PER_THREAD; k++) {
            ck_assert_uint_ne(rs[i].got[k], 0);
            for (int m = 0; m < n; m++)
                ck_assert_uint_ne(all[m], rs[i].got[k]);
            all[n++] = rs[i].got[k];
        }
    }
    ck_assert_int_eq(idslots_alloc(&t, &x), -EUSERS);
    idslots_release(&t);
    dirs_remove();
}
END_TEST

static Suite *idslots_suite(void)
{
    Suite *s = suite_create("idslots");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_distinct_full_and_reused);
    tcase_add_test(tc, test_two_tables_never_share);
    tcase_add_test(tc, test_restart_keeps_live_claims);
    tcase_add_test(tc, test_dead_daemon_taken_over);
    tcase_add_test(tc, test_bad_range);
    tcase_add_test(tc, test_threads_distinct);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(idslots_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
