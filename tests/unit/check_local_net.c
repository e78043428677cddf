/* check_local_net.c - unit tests of the local provider's network module that touch neither
 * links nor nftables: descriptor round trip and validation, configuration checks, and the
 * decisions taken before anything is made (no link for inherit = none, 422 through the fault
 * point). The links and rules themselves are tested end to end in tests/e2e/test_network.c. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "provider/local/local_internal.h"
#include "util/fault.h"

START_TEST(test_descriptor_round_trip)
{
    struct local_net n = {
        .mode = LOCAL_NET_MODEL_AND_TOOLS, .slot = 3, .ifname = "lbabcdefghjkmnp"};
    struct local_net back;
    json_t *j;

    n.host_addr = 0x0ad50006; /* 10.213.0.6 */
    n.sbx_addr = 0x0ad50007;
    n.allow[n.n_allow++] = 0xc6120101; /* 198.18.1.1 */
    n.local[0].port = 8000;
    n.local[0].target = 0x7f000001;
    n.n_local = 1;
    j = local_net_to_json(&n);
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(json_string_value(json_object_get(j, "mode")), "model_and_tools");
    ck_assert_str_eq(json_string_value(json_object_get(j, "addr")), "10.213.0.7");
    ck_assert_int_eq(local_net_from_json(j, &back), 0);
    ck_assert_int_eq(back.mode, LOCAL_NET_MODEL_AND_TOOLS);
    ck_assert_int_eq(back.slot, 3);
    ck_assert_str_eq(back.ifname, n.ifname);
    ck_assert_uint_eq(back.host_addr, n.host_addr);
    ck_assert_uint_eq(back.sbx_addr, n.sbx_addr);
    ck_assert_uint_eq(back.n_allow, 1);
    ck_assert_uint_eq(back.allow[0], 0xc6120101);
    ck_assert_uint_eq(back.n_local, 1);
    ck_assert_uint_eq(back.local[0].port, 8000);
    ck_assert_uint_eq(back.local[0].target, 0x7f000001);
    json_decref(j);
    /* no network: no object, and null reads back as none */
    n.mode = LOCAL_NET_NONE;
    ck_assert_ptr_null(local_net_to_json(&n));
    ck_assert_int_eq(local_net_from_json(NULL, &back), 0);
    ck_assert_int_eq(back.mode, LOCAL_NET_NONE);
    ck_assert_int_eq(back.slot, -1);
}
END_TEST

START_TEST(test_descriptor_rejects_malformed)
{
    static const char *const bad[] = {
        "{\"mode\":\"open\",\"slot\":1,\"ifname\":\"lb1\",\"host\":\"10.0.0.0\",\"addr\":\"10.0.0."
        "1\"}",
        "{\"mode\":\"nat\",\"slot\":-1,\"ifname\":\"lb1\",\"host\":\"10.0.0.0\",\"addr\":\"10.0.0."
        "1\"}",
        "{\"mode\":\"nat\",\"slot\":1,\"ifname\":\"lb1\",\"host\":\"10.0.0\",\"addr\":\"10.0.0."
        "1\"}",
        "{\"mode\":\"nat\",\"slot\":1,\"ifname\":\"lb0123456789abcdef\",\"host\":\"10.0.0.0\","
        "\"addr\":\"10.0.0.1\"}",
        "{\"mode\":\"model_only\",\"slot\":1,\"ifname\":\"lb1\",\"host\":\"10.0.0.0\","
        "\"addr\":\"10.0.0.1\",\"allow\":[\"::1\"]}",
        "{\"mode\":\"model_only\",\"slot\":1,\"ifname\":\"lb1\",\"host\":\"10.0.0.0\","
        "\"addr\":\"10.0.0.1\",\"local\":[{\"port\":0,\"target\":\"127.0.0.1\"}]}",
        "[]",
    };
    struct local_net n;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_t *j = json_loads(bad[i], 0, NULL);

        ck_assert_ptr_nonnull(j);
        ck_assert_msg(local_net_from_json(j, &n) == -EINVAL, "accepted %s", bad[i]);
        json_decref(j);
    }
}
END_TEST

START_TEST(test_config_validation)
{
    static const struct {
        const char *range, *inherit, *table;
    } bad[] = {
        {"10.213.0.0", "none", "t"},     {"10.213.0.0/31", "none", "t"},
        {"10.213.0.0/4", "none", "t"},   {"300.1.1.1/16", "none", "t"},
        {"10.213.0.0/16", "open", "t"},  {"10.213.0.0/16", "none", "bad table"},
        {"10.213.0.0/16", "none", "-x"},
    };
    struct local_provider lp;
    struct lb_error err = {0};

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct lb_local_net_config c = {bad[i].range, bad[i].inherit, bad[i].table, 0};

        memset(&lp, 0, sizeof(lp));
        ck_assert_int_eq(local_net_init(&lp, &c, &err), -EINVAL);
        ck_assert(err.message[0] != '\0');
        local_net_destroy(&lp);
        ck_assert_ptr_null(lp.net);
    }
}
END_TEST

START_TEST(test_prepare_decisions)
{
    struct lb_local_net_config c = {"10.213.250.0/24", "none", "lbunitnever", 0};
    struct lb_network_request none = {0}, mo = {"model_only", "http://127.0.0.1:8000", NULL};
    struct local_provider lp;
    struct lb_error err = {0};
    struct local_net n;

    memset(&lp, 0, sizeof(lp));
    ck_assert_int_eq(local_net_init(&lp, &c, &err), 0);
    /* inherit = none: no link, no slot, nothing to do */
    ck_assert_int_eq(local_net_prepare(&lp, "sbx-1", &none, &n, &err), 0);
    ck_assert_int_eq(n.mode, LOCAL_NET_NONE);
    ck_assert_int_eq(n.slot, -1);
    ck_assert_ptr_null(n.hosts_text);
    /* enforcement unavailable (fault point): 422 before anything is made */
    ck_assert_int_eq(fault_load("network.enforce=fail", &err), 0);
    ck_assert_int_eq(local_net_prepare(&lp, "sbx-2", &mo, &n, &err), -EOPNOTSUPP);
    ck_assert_ptr_nonnull(strstr(err.message, "nftables is not available"));
    ck_assert_int_eq(n.mode, LOCAL_NET_NONE);
    fault_reset();
    /* unknown access */
    mo.access = "everything";
    ck_assert_int_eq(local_net_prepare(&lp, "sbx-3", &mo, &n, &err), -EINVAL);
    local_net_destroy(&lp);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("local_net");
    TCase *tc = tcase_create("local_net");
    SRunner *sr;
    int failed;

    tcase_add_test(tc, test_descriptor_round_trip);
    tcase_add_test(tc, test_descriptor_rejects_malformed);
    tcase_add_test(tc, test_config_validation);
    tcase_add_test(tc, test_prepare_decisions);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
