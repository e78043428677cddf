/* check_gate.c - unit tests for src/provider/gate.c, the exec admission every provider uses:
 * an exclusive exec runs alone, a plain exec never keeps an exclusive one out, the -EBUSY
 * message names the sandbox, ids of LB_ID_MAX bytes or more are refused (never truncated, so
 * two long ids cannot share a gate), and after gates_end nothing is admitted. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "provider/gate.h"

START_TEST(test_exclusive_runs_alone)
{
    struct lb_gates g = {0};
    struct lb_error err = {0};

    ck_assert_int_eq(gates_enter(&g, "sbx-a", false, &err), 0);
    ck_assert_int_eq(gates_enter(&g, "sbx-a", false, &err), 0);
    ck_assert_int_eq(gates_plain_running(&g, "sbx-a"), 2);
    /* plain execs in flight do not keep an exclusive one out */
    ck_assert_int_eq(gates_enter(&g, "sbx-a", true, &err), 0);
    ck_assert_int_eq(gates_plain_running(&g, "sbx-a"), 2);
    ck_assert_int_eq(gates_enter(&g, "sbx-a", false, &err), -EBUSY);
    ck_assert_str_eq(err.message, "an exclusive exec is running in sandbox 'sbx-a'");
    lb_error_clear(&err);
    ck_assert_int_eq(gates_enter(&g, "sbx-a", true, &err), -EBUSY);
    ck_assert_str_eq(err.message, "an exclusive exec is running in sandbox 'sbx-a'");
    lb_error_clear(&err);
    /* another sandbox is not held */
    ck_assert_int_eq(gates_enter(&g, "sbx-b", true, &err), 0);
    gates_leave(&g, "sbx-b", true);
    gates_leave(&g, "sbx-a", false);
    gates_leave(&g, "sbx-a", false);
    ck_assert_int_eq(gates_plain_running(&g, "sbx-a"), 0);
    ck_assert_int_eq(gates_enter(&g, "sbx-a", false, &err), -EBUSY);
    lb_error_clear(&err);
    gates_leave(&g, "sbx-a", true);
    ck_assert_int_eq(gates_enter(&g, "sbx-a", false, &err), 0);
    gates_leave(&g, "sbx-a", false);
    ck_assert_ptr_null(g.list); /* idle sandboxes leave the list */
    gates_release(&g);
}
END_TEST

START_TEST(test_long_ids_refused)
{
    struct lb_gates g = {0};
    struct lb_error err = {0};
    char a[LB_ID_MAX + 8], b[LB_ID_MAX + 8];

    memset(a, 'a', LB_ID_MAX - 1);
    a[LB_ID_MAX - 1] = '\0';
    ck_assert_int_eq(gates_enter(&g, a, true, &err), 0); /* the longest id that fits */
    gates_leave(&g, a, true);
    /* one byte longer: refused, not cut to a prefix another sandbox could share */
    memset(a, 'a', LB_ID_MAX);
    a[LB_ID_MAX] = '\0';
    memcpy(b, a, LB_ID_MAX);
    b[LB_ID_MAX] = 'b';
    b[LB_ID_MAX + 1] = '\0';
    ck_assert_int_eq(gates_enter(&g, a, true, &err), -EINVAL);
    ck_assert_str_eq(err.message, "invalid sandbox id");
    lb_error_clear(&err);
    ck_assert_int_eq(gates_enter(&g, b, false, &err), -EINVAL);
    lb_error_clear(&err);
    ck_assert_ptr_null(g.list);
    gates_release(&g);
}
END_TEST

START_TEST(test_end_refuses_and_counts)
{
    struct lb_gates g = {0};
    struct lb_error err = {0};

    ck_assert(!gates_ended(&g));
    ck_assert_int_eq(gates_enter(&g, "sbx-a", false, &err), 0);
    ck_assert_int_eq(gates_enter(&g, "sbx-a", true, &err), 0);
    ck_assert_int_eq(gates_enter(&g, "sbx-b", false, &err), 0);
    ck_assert_int_eq(gates_end(&g), 3);
    ck_assert(gates_ended(&g));
    ck_assert(atomic_load(&g.ended));
    ck_assert_int_eq(gates_enter(&g, "sbx-c", false, &err), -ESHUTDOWN);
    lb_error_clear(&err);
    gates_leave(&g, "sbx-a", true);
    ck_assert_int_eq(gates_end(&g), 2);
    gates_leave(&g, "sbx-a", false);
    gates_leave(&g, "sbx-b", false);
    ck_assert_int_eq(gates_end(&g), 0);
    gates_release(&g);
}
END_TEST

struct race_arg {
    struct lb_gates *g;
    int admitted_exclusive;
};

static void *race_thread(void *p)
{
    struct race_arg *a = p;
    struct lb_error err = {0};

    for (int i = 0; i < 2000; i++) {
        if (gates_enter(a->g, "sbx-r", true, &err) == 0) {
            a->admitted_exclusive++;
            gates_leave(a->g, "sbx-r", true);
        }
        lb_error_clear(&err);
        if (gates_enter(a->g, "sbx-r", false, &err) == 0)
            gates_leave(a->g, "sbx-r", false);
        lb_error_clear(&err);
    }
    return NULL;
}

START_TEST(test_threads_leave_it_empty)
{
    struct lb_gates g = {0};
    struct race_arg a[4];
    pthread_t t[4];

    for (int i = 0; i < 4; i++) {
        a[i] = (struct race_arg){.g = &g};
        ck_assert_int_eq(pthread_create(&t[i], NULL, race_thread, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    ck_assert_ptr_null(g.list);
    ck_assert_int_eq(gates_end(&g), 0);
    gates_release(&g);
}
END_TEST

static Suite *gate_suite(void)
{
    Suite *s = suite_create("gate");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_exclusive_runs_alone);
    tcase_add_test(tc, test_long_ids_refused);
    tcase_add_test(tc, test_end_refuses_and_counts);
    tcase_add_test(tc, test_threads_leave_it_empty);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(gate_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
