/* check_registry.c - unit tests for src/provider/registry.c (provider kinds, the enabled list,
 * the choice of a seed's provider), provider_check_spec and provider_check_exec (capabilities
 * -> 422) and provider_pause/resume (caps.pause -> 501).
 *
 * The registered providers here are small in-test providers that have a name, a version and
 * capabilities only: what the registry itself looks at. Opening the real kinds (local, fault)
 * is covered end to end by tests/e2e/test_lending.c. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "provider/provider.h"
#include "provider/registry.h"

struct named_provider {
    struct lb_provider base;
    struct lb_provider_ops ops;
    struct lb_provider_caps caps;
    int *destroyed;
};

static void named_caps(struct lb_provider *p, struct lb_provider_caps *out)
{
    *out = ((struct named_provider *)p)->caps;
}

static void named_destroy(struct lb_provider *p)
{
    struct named_provider *n = (struct named_provider *)p;

    if (n->destroyed)
        (*n->destroyed)++;
    free(n);
}

static struct lb_provider *named_new(const char *name, unsigned version, int *destroyed)
{
    struct named_provider *n = calloc(1, sizeof(*n));

    ck_assert_ptr_nonnull(n);
    n->ops.name = name;
    n->ops.version = version;
    n->ops.caps = named_caps;
    n->ops.destroy = named_destroy;
    n->destroyed = destroyed;
    n->base.ops = &n->ops;
    return &n->base;
}

START_TEST(test_find_kind)
{
    char names[256];

    ck_assert_ptr_nonnull(registry_find_kind("local"));
    ck_assert_str_eq(registry_find_kind("local")->name, "local");
    ck_assert_str_eq(registry_find_kind("local")->section, "local");
    ck_assert_ptr_nonnull(registry_find_kind("fault"));
    ck_assert_str_eq(registry_find_kind("docker")->section, "docker");
    ck_assert_str_eq(registry_find_kind("lxd")->section, "lxd");
    ck_assert_ptr_null(registry_find_kind("nosuch"));
    ck_assert_ptr_null(registry_find_kind(""));
    ck_assert_ptr_null(registry_find_kind(NULL));
    registry_kind_names(names, sizeof(names));
    ck_assert_str_eq(names, "local, docker, lxd, fault");
}
END_TEST

START_TEST(test_parse_enabled)
{
    struct lb_error err = {0};
    char **names = NULL;
    size_t n = 99;

    /* only the default */
    ck_assert_int_eq(registry_parse_enabled("local", NULL, &names, &n, &err), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(names[0], "local");
    ck_assert_ptr_null(names[1]);
    registry_names_free(names);
    /* spaces, commas, the default again and a repeat */
    ck_assert_int_eq(registry_parse_enabled("local", " fault,local  fault, ", &names, &n, &err), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(names[0], "local");
    ck_assert_str_eq(names[1], "fault");
    ck_assert_ptr_null(names[2]);
    registry_names_free(names);
    /* the default comes first even when listed later */
    ck_assert_int_eq(registry_parse_enabled("fault", "local", &names, &n, &err), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(names[0], "fault");
    ck_assert_str_eq(names[1], "local");
    registry_names_free(names);
    ck_assert_int_eq(registry_parse_enabled("local", "", &names, &n, &err), 0);
    ck_assert_uint_eq(n, 1);
    registry_names_free(names);
}
END_TEST

START_TEST(test_parse_enabled_unknown)
{
    struct lb_error err = {0};
    char **names = (char **)1;
    size_t n = 99;

    ck_assert_int_eq(registry_parse_enabled("local", "fault nosuch", &names, &n, &err), -EINVAL);
    ck_assert_ptr_null(names);
    ck_assert_uint_eq(n, 0);
    ck_assert_str_eq(err.message,
                     "unknown provider 'nosuch' (this build has: local, docker, lxd, fault)");
    lb_error_clear(&err);
    ck_assert_int_eq(registry_parse_enabled("k8s", NULL, &names, &n, &err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.message, "unknown provider 'k8s'"));
    lb_error_clear(&err);
    ck_assert_int_eq(registry_parse_enabled("", NULL, &names, &n, &err), -EINVAL);
}
END_TEST

START_TEST(test_add_and_choose)
{
    struct lb_registry *reg = NULL;
    struct lb_provider *p = NULL, *a, *b;
    struct lb_error err = {0};
    int destroyed = 0;

    ck_assert_int_eq(registry_new(&reg), 0);
    ck_assert_ptr_null(registry_default(reg));
    ck_assert_int_eq(registry_choose(reg, NULL, &p, &err), -EOPNOTSUPP);
    a = named_new("alpha", LB_PROVIDER_OPS_VERSION, &destroyed);
    b = named_new("beta", LB_PROVIDER_OPS_VERSION, &destroyed);
    ck_assert_int_eq(registry_add(reg, a, &err), 0);
    ck_assert_int_eq(registry_add(reg, b, &err), 0);
    /* a second of the same name, or another ops version, is refused and destroyed */
    ck_assert_int_eq(
        registry_add(reg, named_new("beta", LB_PROVIDER_OPS_VERSION, &destroyed), &err), -EEXIST);
    ck_assert_int_eq(destroyed, 1);
    ck_assert_int_eq(
        registry_add(reg, named_new("gamma", LB_PROVIDER_OPS_VERSION + 1, &destroyed), &err),
        -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.message, "version"));
    ck_assert_int_eq(destroyed, 2);

    ck_assert_uint_eq(registry_count(reg), 2);
    ck_assert_ptr_eq(registry_default(reg), a);
    ck_assert_ptr_eq(registry_at(reg, 1), b);
    ck_assert_ptr_null(registry_at(reg, 2));
    ck_assert_ptr_eq(registry_get(reg, "beta"), b);
    ck_assert_ptr_null(registry_get(reg, "gamma"));
    /* a seed without "provider" gets the default, one naming an enabled provider gets it */
    ck_assert_int_eq(registry_choose(reg, NULL, &p, &err), 0);
    ck_assert_ptr_eq(p, a);
    ck_assert_int_eq(registry_choose(reg, "beta", &p, &err), 0);
    ck_assert_ptr_eq(p, b);
    ck_assert_int_eq(registry_choose(reg, "nosuch", &p, &err), -EOPNOTSUPP);
    ck_assert_ptr_null(p);
    ck_assert_str_eq(err.message,
                     "provider 'nosuch' is not enabled on this daemon (enabled: alpha, beta)");
    ck_assert_int_eq(registry_end_execs(reg), 0);
    registry_free(reg);
    ck_assert_int_eq(destroyed, 4);
    registry_free(NULL);
}
END_TEST

START_TEST(test_check_spec)
{
    struct lb_provider *p = named_new("tiny", LB_PROVIDER_OPS_VERSION, NULL);
    struct named_provider *np = (struct named_provider *)p;
    struct lb_sandbox_spec spec = {.image = "host", .workdir = "/workspace"};
    struct lb_provider_caps caps;
    struct lb_error err = {0};
    int ports[] = {8000};

    provider_caps(p, &caps);
    ck_assert(!caps.disk_limit && !caps.pause && caps.network_modes == 0);
    /* nothing optional asked: fine, also with access inherit (the provider's own meaning) */
    spec.network.access = "inherit";
    ck_assert_int_eq(provider_check_spec(p, &spec, &err), 0);
    spec.resources.disk_mib = 64;
    ck_assert_int_eq(provider_check_spec(p, &spec, &err), -EOPNOTSUPP);
    ck_assert_str_eq(err.message, "resources.disk_mib cannot be enforced by provider 'tiny'");
    np->caps.disk_limit = true;
    ck_assert_int_eq(provider_check_spec(p, &spec, &err), 0);
    spec.network.access = "model_only";
    ck_assert_int_eq(provider_check_spec(p, &spec, &err), -EOPNOTSUPP);
    ck_assert_str_eq(err.message,
                     "network access 'model_only' cannot be enforced by provider 'tiny'");
    np->caps.network_modes = LB_NET_MODEL_ONLY;
    ck_assert_int_eq(provider_check_spec(p, &spec, &err), 0);
    spec.network.access = "model_and_tools";
    ck_assert_int_eq(provider_check_spec(p, &spec, &err), -EOPNOTSUPP);
    spec.network.access = NULL;
    spec.ports = ports;
    spec.n_ports = 1;
    ck_assert_int_eq(provider_check_spec(p, &spec, &err), -EOPNOTSUPP);
    ck_assert_str_eq(err.message, "ports cannot be enforced by provider 'tiny'");
    spec.n_ports = 0;
    spec.image = "python";
    ck_assert_int_eq(provider_check_spec(p, &spec, &err), -EOPNOTSUPP);
    ck_assert_str_eq(err.message, "image cannot be enforced by provider 'tiny'");
    np->caps.images = true;
    spec.resources.cpu = 0.5;
    ck_assert_int_eq(provider_check_spec(p, &spec, &err), -EOPNOTSUPP);
    ck_assert_str_eq(err.message, "resources.cpu cannot be enforced by provider 'tiny'");
    np->caps.cpu_limit = true;
    ck_assert_int_eq(provider_check_spec(p, &spec, &err), 0);
    provider_destroy(p);
}
END_TEST

START_TEST(test_check_exec_user)
{
    struct lb_provider *p = named_new("tiny", LB_PROVIDER_OPS_VERSION, NULL);
    struct named_provider *np = (struct named_provider *)p;
    struct lb_exec_request req = {0};
    struct lb_error err = {0};
    const char *numeric[] = {NULL, "", "root", "0", "1000", "1000:1000", "65535:0"};
    const char *named[] = {"nobody", "nobody:nogroup", "1000:staff", "user1",
                           "1000:",  ":1000",          "-1",         "1x"};

    /* without caps.users: root and numeric ids pass, a name is 422 */
    for (size_t i = 0; i < sizeof(numeric) / sizeof(numeric[0]); i++) {
        req.user = numeric[i];
        ck_assert_msg(provider_check_exec(p, &req, &err) == 0, "user %s", numeric[i]);
    }
    for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
        req.user = named[i];
        ck_assert_msg(provider_check_exec(p, &req, &err) == -EOPNOTSUPP, "user %s", named[i]);
    }
    req.user = "nobody";
    ck_assert_int_eq(provider_check_exec(p, &req, &err), -EOPNOTSUPP);
    ck_assert_str_eq(err.message,
                     "user 'nobody' cannot be enforced by provider 'tiny': it runs commands as "
                     "root or a numeric uid, not a user named in the sandbox");
    /* with it, names go on to the provider */
    np->caps.users = true;
    for (size_t i = 0; i < sizeof(named) / sizeof(named[0]); i++) {
        req.user = named[i];
        ck_assert_int_eq(provider_check_exec(p, &req, &err), 0);
    }
    provider_destroy(p);
}
END_TEST

static int pause_calls;

static int counting_pause(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                          struct lb_error *err)
{
    pause_calls++;
    return 0;
}

START_TEST(test_pause_needs_cap)
{
    struct lb_provider *p = named_new("tiny", LB_PROVIDER_OPS_VERSION, NULL);
    struct named_provider *np = (struct named_provider *)p;
    struct lb_sandbox_ref ref = {.id = "sbx-1"};
    struct lb_error err = {0};

    pause_calls = 0;
    np->ops.pause = counting_pause;
    np->ops.resume = counting_pause;
    /* the op without caps.pause: 501, and the op is never called */
    ck_assert_int_eq(provider_pause(p, &ref, &err), -ENOSYS);
    ck_assert_str_eq(err.message, "provider 'tiny' does not support pause");
    ck_assert_int_eq(provider_resume(p, &ref, &err), -ENOSYS);
    ck_assert_str_eq(err.message, "provider 'tiny' does not support resume");
    ck_assert_int_eq(pause_calls, 0);
    np->caps.pause = true;
    ck_assert_int_eq(provider_pause(p, &ref, &err), 0);
    ck_assert_int_eq(provider_resume(p, &ref, &err), 0);
    ck_assert_int_eq(pause_calls, 2);
    /* the cap without the op: 501 too */
    np->ops.pause = NULL;
    ck_assert_int_eq(provider_pause(p, &ref, &err), -ENOSYS);
    ck_assert_int_eq(pause_calls, 2);
    provider_destroy(p);
}
END_TEST

static Suite *registry_suite(void)
{
    Suite *s = suite_create("registry");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_find_kind);
    tcase_add_test(tc, test_parse_enabled);
    tcase_add_test(tc, test_parse_enabled_unknown);
    tcase_add_test(tc, test_add_and_choose);
    tcase_add_test(tc, test_check_spec);
    tcase_add_test(tc, test_check_exec_user);
    tcase_add_test(tc, test_pause_needs_cap);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(registry_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
