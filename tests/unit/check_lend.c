/* check_lend.c - unit tests for the seed's one start (src/lend/seed.c): the record written before
 * the provider's create, the lease rendered from that record, the rollback of a failed start,
 * and the warm pool's take and eviction done by lending itself (lend_set_warm).
 *
 * The provider here is a small in-test one that counts its creates and stops and can be told
 * to fail a create or a file write; the store is a real SQLite file in a temporary directory.
 * The local provider end to end is covered by tests/e2e/test_lending.c and test_warm.c. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lend/lend.h"
#include "lend/lend_internal.h"
#include "provider/provider.h"
#include "provider/registry.h"
#include "store/store.h"

struct stub_provider {
    struct lb_provider base;
    struct lb_provider_ops ops;
    int creates, stops, stops_with_descriptor;
    int fail_create;     /* errno create fails with; 0: it works */
    int fail_file_write; /* errno file_write fails with; 0: it works */
    int file_writes;
    bool can_reset; /* caps.reset */
};

static void stub_caps(struct lb_provider *p, struct lb_provider_caps *out)
{
    *out = (struct lb_provider_caps){
        .images = true, .pids_limit = true, .reset = ((struct stub_provider *)p)->can_reset};
}

static int stub_create(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                       const struct lb_sandbox_spec *spec, json_t **descriptor_out,
                       struct lb_error *err)
{
    struct stub_provider *s = (struct stub_provider *)p;

    s->creates++;
    if (s->fail_create)
        return lb_error_set(err, -s->fail_create, "stub create fails");
    *descriptor_out = json_pack("{s:s}", "stub", ref->id);
    return 0;
}

static int stub_stop(struct lb_provider *p, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                     struct lb_error *err)
{
    struct stub_provider *s = (struct stub_provider *)p;

    s->stops++;
    if (ref->descriptor)
        s->stops_with_descriptor++;
    return 0;
}

static int stub_file_write(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                           const char *path, const void *data, size_t len, int mode,
                           struct lb_error *err)
{
    struct stub_provider *s = (struct stub_provider *)p;

    s->file_writes++;
    return s->fail_file_write ? lb_error_set(err, -s->fail_file_write, "stub write fails") : 0;
}

static void stub_destroy(struct lb_provider *p)
{
    free(p);
}

static char dir[64];
static struct lb_store *st;
static struct lb_registry *reg;
static struct stub_provider *stub;
static struct lb_lend *lend;

static void setup_with(int64_t max_sandboxes)
{
    static const unsigned char key[32] = {1, 2, 3};
    struct lb_lend_config cfg = {.stop_timeout_s = 5,
                                 .default_ttl_s = 0,
                                 .retry_base_s = 1,
                                 .retry_max_s = 60,
                                 .max_sandboxes = max_sandboxes,
                                 .default_pids = 512,
                                 .default_image = "host",
                                 .workdir = "/workspace",
                                 .public_url = "http://127.0.0.1:1",
                                 .operate_key = key,
                                 .operate_key_len = sizeof(key)};
    struct lb_error err = {0};
    char path[128];

    snprintf(dir, sizeof(dir), "/tmp/check_lend.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/state.db", dir);
    ck_assert_int_eq(store_open(path, &st, &err), 0);
    stub = calloc(1, sizeof(*stub));
    ck_assert_ptr_nonnull(stub);
    stub->ops = (struct lb_provider_ops){.name = "stub",
                                         .version = LB_PROVIDER_OPS_VERSION,
                                         .caps = stub_caps,
                                         .create = stub_create,
                                         .stop = stub_stop,
                                         .file_write = stub_file_write,
                                         .destroy = stub_destroy};
    stub->base.ops = &stub->ops;
    ck_assert_int_eq(registry_new(&reg), 0);
    ck_assert_int_eq(registry_add(reg, &stub->base, &err), 0);
    ck_assert_int_eq(lend_new(&cfg, st, reg, &lend, &err), 0);
}

static void setup(void)
{
    setup_with(10);
}

static void teardown(void)
{
    char cmd[128];

    lend_free(lend);
    registry_free(reg);
    store_close(st);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static const char *str(json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* A warm record of the stub's default class, as the pool makes one. */
static void insert_warm(const char *id)
{
    struct lb_record rec = {.provider = "stub",
                            .state = LB_STATE_STARTING,
                            .spec_json = "{\"image\":\"host\",\"workdir\":\"/workspace\"}",
                            .pool_class = "stub:host",
                            .created_at = 1000};
    struct lb_error err = {0};

    snprintf(rec.id, sizeof(rec.id), "%s", id);
    ck_assert_int_eq(store_insert_sandbox(st, &rec, 100, &err), 0);
    ck_assert_int_eq(store_mark_warm(st, id, "{\"stub\":\"warm\"}", 0, &err), 0);
}

/* The lease a seed answers is its record as written: the same as one read back from the store
 * (GET /v1/sessions/{rsid}), with the TTL recorded. */
START_TEST(test_lease_is_the_record)
{
    struct lb_seed_request req = {.task_id = "t1", .ttl_s = 600};
    struct lb_error err = {0};
    json_t *lease = NULL, *again = NULL;
    struct lb_record rec = {0};

    ck_assert_int_eq(lend_seed(lend, "rs-1", &req, &lease, &err), 0);
    ck_assert_int_eq(stub->creates, 1);
    ck_assert_str_eq(str(lease, "state"), "lent");
    ck_assert_str_eq(str(lease, "provider"), "stub");
    ck_assert_str_eq(str(lease, "image"), "host");
    ck_assert_str_eq(str(json_object_get(lease, "access"), "workdir"), "/workspace");
    ck_assert_ptr_nonnull(str(lease, "expires_at"));
    ck_assert_int_eq(store_get_sandbox(st, str(lease, "sandbox_id"), &rec, &err), 0);
    ck_assert_int_eq(rec.state, LB_STATE_LENT);
    ck_assert_int_eq(rec.expires_at, rec.created_at + 600);
    ck_assert_ptr_nonnull(rec.descriptor_json);
    ck_assert_ptr_nonnull(strstr(rec.descriptor_json, rec.id));
    ck_assert_int_eq(lend_get_lease(lend, "rs-1", &again, &err), 0);
    ck_assert(json_equal(lease, again));
    /* the record's spec holds the pids default the provider enforces nowhere: only disk is
     * recorded from the defaults (none here), as before */
    ck_assert_ptr_null(strstr(rec.spec_json, "pids"));
    store_record_release(&rec);
    json_decref(lease);
    json_decref(again);
}
END_TEST

/* A create that fails: the record was there first and is stopped as a failed seed. */
START_TEST(test_failed_create_is_rolled_back)
{
    struct lb_seed_request req = {.task_id = "t1", .ttl_s = -1};
    struct lb_error err = {0};
    struct lb_record_filter f = {.state = -1};
    struct lb_record *recs = NULL;
    json_t *lease = NULL;
    size_t n = 0;

    stub->fail_create = EIO;
    ck_assert_int_eq(lend_seed(lend, "rs-1", &req, &lease, &err), -EREMOTEIO);
    ck_assert_ptr_nonnull(strstr(err.message, "sandbox could not start: stub create fails"));
    ck_assert_ptr_null(lease);
    ck_assert_int_eq(store_list_sandboxes(st, &f, &recs, &n, &err), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(recs[0].state, LB_STATE_STOPPED);
    ck_assert_str_eq(recs[0].stop_reason, "seed_failed");
    ck_assert_int_eq(stub->stops, 1);
    store_records_free(recs, n);
}
END_TEST

/* A reset on a provider without the capability: 501, nothing stopped or changed. */
START_TEST(test_reset_needs_the_cap)
{
    struct lb_seed_request req = {.task_id = "t1", .ttl_s = -1};
    struct lb_error err = {0};
    json_t *lease = NULL, *again = NULL;

    ck_assert_int_eq(lend_seed(lend, "rs-1", &req, &lease, &err), 0);
    ck_assert_int_eq(lend_reset(lend, str(lease, "sandbox_id"), NULL, &again, &err), -ENOSYS);
    ck_assert_ptr_null(again);
    ck_assert_int_eq(stub->stops, 0);
    ck_assert_int_eq(lend_get_lease(lend, "rs-1", &again, &err), 0);
    ck_assert(json_equal(lease, again));
    json_decref(lease);
    json_decref(again);
}
END_TEST

/* A reset: stop, create under the same id, the seed's files written again, a new token; the
 * record keeps its id, session and expiry and loses its "resetting" mark. A create that fails
 * stops the sandbox (reset_failed). */
START_TEST(test_reset_remakes)
{
    unsigned char data[] = "seed";
    struct lb_seed_file file = {"/workspace/f", data, 4, -1};
    struct lb_seed_request req = {.task_id = "t1", .ttl_s = 600, .files = &file, .n_files = 1};
    struct lb_error err = {0};
    struct lb_record rec = {0};
    json_t *lease = NULL, *again = NULL;
    const char *id;

    stub->can_reset = true;
    ck_assert_int_eq(lend_seed(lend, "rs-1", &req, &lease, &err), 0);
    id = str(lease, "sandbox_id");
    ck_assert_int_eq(stub->file_writes, 1);
    ck_assert_int_eq(lend_reset(lend, id, NULL, &again, &err), 0);
    ck_assert_int_eq(stub->stops, 1);
    ck_assert_int_eq(stub->creates, 2);
    ck_assert_int_eq(stub->file_writes, 2);
    ck_assert_str_eq(str(again, "sandbox_id"), id);
    ck_assert_str_eq(str(again, "resources_session_id"), "rs-1");
    ck_assert_str_eq(str(again, "expires_at"), str(lease, "expires_at"));
    ck_assert_str_ne(str(json_object_get(again, "access"), "token"),
                     str(json_object_get(lease, "access"), "token"));
    ck_assert_int_eq(store_get_sandbox(st, id, &rec, &err), 0);
    ck_assert_int_eq(rec.state, LB_STATE_LENT);
    ck_assert_ptr_null(strstr(rec.spec_json, "resetting"));
    ck_assert(!lend_record_resetting(&rec));
    store_record_release(&rec);
    json_decref(again);
    again = NULL;
    /* a snapshot that does not exist: 404 before anything is torn down */
    ck_assert_int_eq(lend_reset(lend, id, "no-such", &again, &err), -LB_E_IMAGE_NOT_FOUND);
    ck_assert_int_eq(stub->stops, 1);
    stub->fail_create = EIO;
    ck_assert_int_eq(lend_reset(lend, id, NULL, &again, &err), -EREMOTEIO);
    ck_assert_ptr_nonnull(strstr(err.message, "reset_failed"));
    ck_assert_ptr_null(again);
    ck_assert_int_eq(store_get_sandbox(st, id, &rec, &err), 0);
    ck_assert_int_eq(rec.state, LB_STATE_STOPPED);
    ck_assert_str_eq(rec.stop_reason, "reset_failed");
    store_record_release(&rec);
    ck_assert_int_eq(lend_reset(lend, id, NULL, &again, &err), -ENOENT);
    json_decref(lease);
}
END_TEST

/* A seed file that cannot be written: the sandbox is stopped with the descriptor its create
 * returned, and its record keeps that descriptor. */
START_TEST(test_failed_file_stops_with_descriptor)
{
    struct lb_seed_file file = {
        .path = "/workspace/a", .data = (unsigned char *)"x", .len = 1, .mode = -1};
    struct lb_seed_request req = {.task_id = "t1", .ttl_s = -1, .files = &file, .n_files = 1};
    struct lb_error err = {0};
    struct lb_record_filter f = {.state = -1};
    struct lb_record *recs = NULL;
    json_t *lease = NULL;
    size_t n = 0;

    stub->fail_file_write = EISDIR;
    ck_assert_int_eq(lend_seed(lend, "rs-1", &req, &lease, &err), -EISDIR);
    ck_assert_int_eq(store_list_sandboxes(st, &f, &recs, &n, &err), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(recs[0].state, LB_STATE_STOPPED);
    ck_assert_str_eq(recs[0].stop_reason, "seed_failed");
    ck_assert_ptr_nonnull(recs[0].descriptor_json);
    ck_assert_int_eq(stub->stops_with_descriptor, 1);
    store_records_free(recs, n);
}
END_TEST

/* With a pool registered, a seed of its class takes the warm sandbox (no create) and the warm
 * generation moves (what wakes the pool's refills); without one it starts its own. */
START_TEST(test_seed_takes_warm)
{
    struct lb_seed_request req = {.task_id = "t1", .ttl_s = -1};
    struct lb_error err = {0};
    json_t *lease = NULL;
    uint64_t gen;

    insert_warm("sbx-warm1");
    ck_assert_int_eq(lend_seed(lend, "rs-0", &req, &lease, &err), 0);
    ck_assert_str_ne(str(lease, "sandbox_id"), "sbx-warm1"); /* no pool registered */
    ck_assert_int_eq(stub->creates, 1);
    json_decref(lease);
    lend_set_warm(lend, &stub->base);
    gen = lend_warm_generation(lend);
    ck_assert_int_eq(lend_seed(lend, "rs-1", &req, &lease, &err), 0);
    ck_assert_str_eq(str(lease, "sandbox_id"), "sbx-warm1");
    ck_assert_str_eq(str(lease, "state"), "lent");
    ck_assert_int_eq(stub->creates, 1);
    ck_assert_uint_gt(lend_warm_generation(lend), gen);
    json_decref(lease);
    /* another class (an image) starts its own */
    insert_warm("sbx-warm2");
    req.image = "other";
    ck_assert_int_eq(lend_seed(lend, "rs-2", &req, &lease, &err), 0);
    ck_assert_str_ne(str(lease, "sandbox_id"), "sbx-warm2");
    ck_assert_int_eq(stub->creates, 2);
    json_decref(lease);
    lend_set_warm(lend, NULL);
}
END_TEST

/* At max_sandboxes a seed of another class makes the oldest warm sandbox give its place. */
START_TEST(test_seed_evicts_warm_at_capacity)
{
    struct lb_seed_request req = {.task_id = "t1", .ttl_s = -1, .image = "other"};
    struct lb_error err = {0};
    struct lb_record rec = {0};
    json_t *lease = NULL;

    insert_warm("sbx-warm1");
    insert_warm("sbx-warm2");
    lend_set_warm(lend, &stub->base);
    ck_assert_int_eq(lend_seed(lend, "rs-1", &req, &lease, &err), 0);
    ck_assert_int_eq(stub->creates, 1);
    ck_assert_int_eq(store_get_sandbox(st, "sbx-warm1", &rec, &err), 0);
    ck_assert_int_eq(rec.state, LB_STATE_STOPPED);
    ck_assert_str_eq(rec.stop_reason, "evicted");
    store_record_release(&rec);
    ck_assert_int_eq(store_get_sandbox(st, "sbx-warm2", &rec, &err), 0);
    ck_assert_int_eq(rec.state, LB_STATE_WARM);
    store_record_release(&rec);
    json_decref(lease);
    /* full of lent ones: 429 */
    req.task_id = "t2";
    ck_assert_int_eq(lend_seed(lend, "rs-2", &req, &lease, &err), 0); /* evicts warm2 */
    json_decref(lease);
    lease = NULL;
    ck_assert_int_eq(lend_seed(lend, "rs-3", &req, &lease, &err), -EUSERS);
    ck_assert_ptr_null(lease);
    lend_set_warm(lend, NULL);
}
END_TEST

static void setup_two(void)
{
    setup_with(2);
}

static Suite *lend_suite(void)
{
    Suite *s = suite_create("lend");
    TCase *tc = tcase_create("seed");
    TCase *tw = tcase_create("capacity");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_lease_is_the_record);
    tcase_add_test(tc, test_failed_create_is_rolled_back);
    tcase_add_test(tc, test_failed_file_stops_with_descriptor);
    tcase_add_test(tc, test_seed_takes_warm);
    tcase_add_test(tc, test_reset_needs_the_cap);
    tcase_add_test(tc, test_reset_remakes);
    suite_add_tcase(s, tc);
    tcase_add_checked_fixture(tw, setup_two, teardown);
    tcase_add_test(tw, test_seed_evicts_warm_at_capacity);
    suite_add_tcase(s, tw);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(lend_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
