/* check_engine.c - unit tests for the engine base's drivers (src/provider/engine/engine.c,
 * engine_exec.c, engine_files.c) over an in-test backend: hooks that answer from a small
 * table instead of an engine. What is tested is the rules the drivers hold for every engine:
 * adopt an instance of this daemon on "exists", the fault point between make and start,
 * rollback (remove what was made, undo the host's part otherwise), the errno squash; pause
 * and resume that are idempotent; a listing that keeps only this daemon's instances; exec
 * admission, the status line, "gone?" after a transport failure, shutdown; uploads. The real
 * engines' requests are covered end to end by tests/e2e (docker and lxd variants); a fake
 * HTTP engine for the backends' hooks is a separate program. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "provider/engine/engine.h"
#include "provider/exec_result.h"
#include "util/fault.h"

struct test_engine {
    struct lb_engine eng;
    /* what the hooks answer */
    int make_r, find_own_r, start_r, finish_r, set_frozen_r, exec_r;
    enum lb_sandbox_status state;
    bool exec_transport;
    const char *status_line; /* framed 's' payload exec_run feeds; NULL: none */
    /* what the hooks saw */
    int made, found, started, finished, rollbacks, rollbacks_made, prepared, puts, runs;
    char put_path[256];
    uint64_t put_len;
    char cmd[2048];
};

static int t_prepare(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                     const struct lb_sandbox_spec *spec, struct engine_instance *inst,
                     struct lb_error *err)
{
    snprintf(inst->name, sizeof(inst->name), "t-%s", ref->id);
    ((struct test_engine *)e)->prepared++;
    return 0;
}

static int t_make(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                  const struct lb_sandbox_spec *spec, const char *image, int64_t timeout_ms,
                  struct engine_instance *inst, struct lb_error *err)
{
    struct test_engine *t = (struct test_engine *)e;

    t->made++;
    if (t->make_r < 0 && t->make_r != -EEXIST)
        return lb_error_set(err, t->make_r, "make failed");
    if (t->make_r == 0)
        snprintf(inst->handle, sizeof(inst->handle), "handle-%s", image);
    return t->make_r;
}

static int t_find_own(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                      struct engine_instance *inst, struct lb_error *err)
{
    struct test_engine *t = (struct test_engine *)e;

    t->found++;
    if (t->find_own_r < 0)
        return lb_error_set(err, t->find_own_r, "not ours");
    snprintf(inst->handle, sizeof(inst->handle), "adopted");
    return 0;
}

static int t_start(struct lb_engine *e, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                   struct engine_instance *inst, struct lb_error *err)
{
    struct test_engine *t = (struct test_engine *)e;

    t->started++;
    return t->start_r < 0 ? lb_error_set(err, t->start_r, "start failed") : 0;
}

static int t_finish(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                    const struct lb_sandbox_spec *spec, struct engine_instance *inst, json_t **out,
                    struct lb_error *err)
{
    struct test_engine *t = (struct test_engine *)e;

    t->finished++;
    if (t->finish_r < 0)
        return lb_error_set(err, t->finish_r, "finish failed");
    *out = json_pack("{s:s,s:s}", "name", inst->name, "handle", inst->handle);
    return 0;
}

static void t_rollback(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                       const struct engine_instance *inst, bool made)
{
    struct test_engine *t = (struct test_engine *)e;

    t->rollbacks++;
    t->rollbacks_made += made;
}

static int t_state(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                   enum lb_sandbox_status *out, struct lb_error *err)
{
    *out = ((struct test_engine *)e)->state;
    return 0;
}

static int t_set_frozen(struct lb_engine *e, const struct lb_sandbox_ref *ref, bool frozen,
                        struct lb_error *err)
{
    struct test_engine *t = (struct test_engine *)e;

    return t->set_frozen_r < 0 ? lb_error_set(err, t->set_frozen_r, "engine refused") : 0;
}

static int t_list_raw(struct lb_engine *e, json_t **items_out, struct lb_error *err)
{
    *items_out = json_pack("[{s:s,s:s},{s:s,s:s},{s:s}]", "id", "sbx-1", "inst", "me", "id",
                           "sbx-2", "inst", "other", "id", "sbx-3");
    return *items_out ? 0 : lb_error_set(err, -ENOMEM, "out of memory");
}

static json_t *t_list_entry(struct lb_engine *e, json_t *item, const char **id_out)
{
    const char *inst = json_string_value(json_object_get(item, "inst"));

    if (!inst || strcmp(inst, "me") != 0)
        return NULL;
    *id_out = json_string_value(json_object_get(item, "id"));
    return json_pack("{s:s}", "name", *id_out);
}

static int t_put_file(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *path,
                      int fd, const void *data, uint64_t len, int mode, struct lb_error *err)
{
    struct test_engine *t = (struct test_engine *)e;

    t->puts++;
    snprintf(t->put_path, sizeof(t->put_path), "%s", path);
    t->put_len = len;
    return 0;
}

static void frame(struct engine_exec *x, char type, const char *payload)
{
    unsigned char hdr[5];
    uint32_t n = (uint32_t)strlen(payload);

    hdr[0] = (unsigned char)type;
    hdr[1] = (unsigned char)(n >> 24);
    hdr[2] = (unsigned char)(n >> 16);
    hdr[3] = (unsigned char)(n >> 8);
    hdr[4] = (unsigned char)n;
    framed_reader_feed(&x->fr, hdr, 5);
    framed_reader_feed(&x->fr, payload, n);
}

static int t_exec_run(struct lb_engine *e, const struct lb_sandbox_ref *ref, struct engine_exec *x,
                      struct lb_error *err)
{
    struct test_engine *t = (struct test_engine *)e;
    json_t *cmd;
    char *text;

    t->runs++;
    json_array_append_new(x->cmd, json_string("--backend-option"));
    cmd = engine_exec_command(x);
    text = cmd ? json_dumps(cmd, JSON_COMPACT) : NULL;
    snprintf(t->cmd, sizeof(t->cmd), "%s", text ? text : "");
    free(text);
    frame(x, 'o', "out");
    if (t->status_line)
        frame(x, 's', t->status_line);
    x->transport = t->exec_transport;
    return t->exec_r < 0 ? lb_error_set(err, t->exec_r, "transport failed") : 0;
}

static const struct engine_hooks test_hooks = {
    .name = "test",
    .noun = "box",
    .prepare = t_prepare,
    .make = t_make,
    .find_own = t_find_own,
    .start = t_start,
    .finish = t_finish,
    .rollback = t_rollback,
    .put_file = t_put_file,
    .exec_run = t_exec_run,
    .engine_label = "the test engine",
    .state = t_state,
    .set_frozen = t_set_frozen,
    .list_raw = t_list_raw,
    .list_entry = t_list_entry,
};

static char spool[] = "/tmp/check-engine-XXXXXX";

static struct test_engine *test_new(void)
{
    struct test_engine *t = calloc(1, sizeof(*t));

    ck_assert_ptr_nonnull(t);
    engine_init(&t->eng, &test_hooks);
    t->eng.default_image = strdup("img");
    t->eng.supervise_inside = "/sv";
    t->eng.spool_dir = strdup(spool);
    ck_assert(t->eng.default_image && t->eng.spool_dir);
    t->eng.create_timeout_ms = 1000;
    t->state = LB_STATUS_RUNNING;
    return t;
}

static void test_free(struct test_engine *t)
{
    engine_release(&t->eng);
    free(t);
}

static int create(struct test_engine *t, json_t **desc, struct lb_error *err)
{
    struct lb_sandbox_ref ref = {.id = "sbx-1"};
    struct lb_sandbox_spec spec = {0};

    *desc = NULL;
    return engine_create(&t->eng.base, &ref, &spec, desc, err);
}

START_TEST(test_create_adopts_and_rolls_back)
{
    struct test_engine *t = test_new();
    struct lb_error err = {0};
    json_t *desc;

    /* plain: made, started, finished; nothing rolled back */
    ck_assert_int_eq(create(t, &desc, &err), 0);
    ck_assert_str_eq(json_string_value(json_object_get(desc, "handle")), "handle-img");
    ck_assert_str_eq(json_string_value(json_object_get(desc, "name")), "t-sbx-1");
    ck_assert_int_eq(t->rollbacks, 0);
    json_decref(desc);

    /* exists and ours: adopted, no error left behind */
    t->make_r = -EEXIST;
    ck_assert_int_eq(create(t, &desc, &err), 0);
    ck_assert_int_eq(t->found, 1);
    ck_assert_str_eq(json_string_value(json_object_get(desc, "handle")), "adopted");
    ck_assert_int_eq(err.code, 0);
    json_decref(desc);

    /* exists and not ours: -EREMOTEIO, nothing removed (it is not ours to remove) */
    t->find_own_r = -EREMOTEIO;
    ck_assert_int_eq(create(t, &desc, &err), -EREMOTEIO);
    ck_assert_str_eq(err.message, "not ours");
    ck_assert_int_eq(t->rollbacks, 1);
    ck_assert_int_eq(t->rollbacks_made, 0);
    lb_error_clear(&err);

    /* made, then the start fails: removed again; any errno but the kept ones is -EREMOTEIO */
    t->make_r = 0;
    t->find_own_r = 0;
    t->start_r = -EIO;
    ck_assert_int_eq(create(t, &desc, &err), -EREMOTEIO);
    ck_assert_ptr_null(desc);
    ck_assert_int_eq(t->rollbacks, 2);
    ck_assert_int_eq(t->rollbacks_made, 1);
    lb_error_clear(&err);

    /* a timeout stays a timeout */
    t->start_r = -ETIMEDOUT;
    ck_assert_int_eq(create(t, &desc, &err), -ETIMEDOUT);
    ck_assert_int_eq(t->rollbacks_made, 2);
    lb_error_clear(&err);

    /* the fault point between make and start: removed, -EREMOTEIO, never started */
    t->start_r = 0;
    ck_assert_int_eq(fault_load("test.created=fail", &err), 0);
    t->started = 0;
    ck_assert_int_eq(create(t, &desc, &err), -EREMOTEIO);
    ck_assert_int_eq(t->started, 0);
    ck_assert_int_eq(t->rollbacks_made, 3);
    fault_reset();
    lb_error_clear(&err);

    /* no image at all */
    free(t->eng.default_image);
    t->eng.default_image = NULL;
    ck_assert_int_eq(create(t, &desc, &err), -EINVAL);
    ck_assert_str_eq(err.message, "no image given and test.default_image is not set");
    test_free(t);
}
END_TEST

START_TEST(test_pause_is_idempotent)
{
    struct test_engine *t = test_new();
    struct lb_sandbox_ref ref = {.id = "sbx-1"};
    struct lb_error err = {0};

    ck_assert_int_eq(engine_pause(&t->eng.base, &ref, &err), 0);
    /* refused, but already paused: 0 */
    t->set_frozen_r = -EREMOTEIO;
    t->state = LB_STATUS_PAUSED;
    ck_assert_int_eq(engine_pause(&t->eng.base, &ref, &err), 0);
    ck_assert_int_eq(err.code, 0);
    /* refused and not so: the engine's reason */
    ck_assert_int_eq(engine_resume(&t->eng.base, &ref, &err), -EREMOTEIO);
    ck_assert_str_eq(err.message, "engine refused");
    lb_error_clear(&err);
    /* gone */
    t->set_frozen_r = -ENOENT;
    ck_assert_int_eq(engine_resume(&t->eng.base, &ref, &err), -ENOENT);
    ck_assert_str_eq(err.message, "no such sandbox");
    lb_error_clear(&err);
    /* a timeout is not looked past */
    t->set_frozen_r = -ETIMEDOUT;
    t->state = LB_STATUS_RUNNING;
    ck_assert_int_eq(engine_resume(&t->eng.base, &ref, &err), -ETIMEDOUT);
    test_free(t);
}
END_TEST

START_TEST(test_list_keeps_ours)
{
    struct test_engine *t = test_new();
    struct lb_error err = {0};
    json_t *out = NULL;

    ck_assert_int_eq(engine_list(&t->eng.base, &out, &err), 0);
    ck_assert_uint_eq(json_array_size(out), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(out, 0), "sandbox_id")),
                     "sbx-1");
    json_decref(out);
    test_free(t);
}
END_TEST

static int run_exec(struct test_engine *t, struct lb_exec_request *req, struct lb_exec_result *res,
                    struct lb_error *err)
{
    struct lb_sandbox_ref ref = {.id = "sbx-1"};

    return engine_exec(&t->eng.base, &ref, req, res, err);
}

START_TEST(test_exec_driver)
{
    struct test_engine *t = test_new();
    const char *argv[] = {"sh", "-c", "x", NULL};
    struct lb_exec_request req = {.argv = argv,
                                  .max_output_bytes = 1024,
                                  .timeout_ms = 5000,
                                  .stdin_data = "in",
                                  .stdin_len = 2,
                                  .cwd = "/w"};
    struct lb_exec_result res;
    struct lb_error err = {0};

    /* the status line, the command as every engine builds it, stdin as a file first */
    t->status_line = "exit 7";
    ck_assert_int_eq(run_exec(t, &req, &res, &err), 0);
    ck_assert_int_eq(res.return_code, 7);
    ck_assert_int_eq(res.error_type, LB_EXEC_OK);
    ck_assert_mem_eq(res.out.data, "out", 3);
    ck_assert_int_eq(t->puts, 1);
    ck_assert_uint_eq(t->put_len, 2);
    ck_assert(strncmp(t->put_path, "/tmp/.lendbox-stdin-", 20) == 0);
    {
        char want[1024];

        snprintf(want, sizeof(want),
                 "[\"/sv\",\"--framed\",\"--max-output\",\"1024\",\"--timeout-ms\",\"5000\","
                 "\"--cwd\",\"/w\",\"--stdin-file\",\"%s\",\"--backend-option\",\"--\",\"sh\","
                 "\"-c\",\"x\"]",
                 t->put_path);
        ck_assert_str_eq(t->cmd, want);
    }
    provider_exec_result_release(&res);

    /* no status, the instance gone: no such sandbox */
    t->status_line = NULL;
    t->state = LB_STATUS_STOPPED;
    ck_assert_int_eq(run_exec(t, &req, &res, &err), -ENOENT);
    ck_assert_str_eq(err.message, "no such sandbox");
    lb_error_clear(&err);
    provider_exec_result_release(&res);

    /* no status, still running: a runtime result naming the engine */
    t->state = LB_STATUS_RUNNING;
    ck_assert_int_eq(run_exec(t, &req, &res, &err), 0);
    ck_assert_int_eq(res.return_code, LB_RETURN_CODE_RUNTIME);
    ck_assert_str_eq(res.message,
                     "the supervisor ended without a result: no output from the test engine");
    provider_exec_result_release(&res);

    /* a transport failure after the start: -EREMOTEIO in the return and in err */
    t->exec_r = -ETIMEDOUT;
    t->exec_transport = true;
    ck_assert_int_eq(run_exec(t, &req, &res, &err), -EREMOTEIO);
    ck_assert_int_eq(err.code, -EREMOTEIO);
    lb_error_clear(&err);
    provider_exec_result_release(&res);

    /* a failure before the start is returned as it is */
    t->exec_r = -EBUSY;
    t->exec_transport = false;
    ck_assert_int_eq(run_exec(t, &req, &res, &err), -EBUSY);
    lb_error_clear(&err);
    provider_exec_result_release(&res);

    /* after end_execs: a shutting-down result, the backend never asked */
    t->exec_r = 0;
    t->runs = 0;
    ck_assert_int_eq(engine_end_execs(&t->eng.base), 0);
    ck_assert_int_eq(run_exec(t, &req, &res, &err), 0);
    ck_assert_int_eq(res.error_type, LB_EXEC_SANDBOX);
    ck_assert_str_eq(res.message, "the daemon is shutting down and no longer runs commands");
    ck_assert_int_eq(t->runs, 0);
    ck_assert_int_eq(err.code, 0);
    provider_exec_result_release(&res);
    test_free(t);
}
END_TEST

START_TEST(test_uploads)
{
    struct test_engine *t = test_new();
    struct lb_sandbox_ref ref = {.id = "sbx-1"};
    struct lb_upload *u = NULL;
    struct lb_error err = {0};

    ck_assert_int_eq(engine_upload_begin(&t->eng.base, &ref, "/a/b", 0644, "user", &u, &err),
                     -EOPNOTSUPP);
    ck_assert_str_eq(err.message, "the test provider cannot give an uploaded file an owner "
                                  "(?owner=): its files belong to the box's root");
    lb_error_clear(&err);
    ck_assert_int_eq(engine_upload_begin(&t->eng.base, &ref, "/", 0644, NULL, &u, &err), -EINVAL);
    lb_error_clear(&err);
    t->state = LB_STATUS_STOPPED;
    ck_assert_int_eq(engine_upload_begin(&t->eng.base, &ref, "/a/b", 0644, NULL, &u, &err),
                     -ENOENT);
    lb_error_clear(&err);
    t->state = LB_STATUS_RUNNING;
    ck_assert_int_eq(engine_upload_begin(&t->eng.base, &ref, "/a/b", 0644, NULL, &u, &err), 0);
    ck_assert_int_eq(write(u->fd, "12345", 5), 5);
    ck_assert_int_eq(engine_upload_commit(u, &err), 0);
    ck_assert_str_eq(t->put_path, "/a/b");
    ck_assert_uint_eq(t->put_len, 5);
    ck_assert_int_eq(engine_file_write(&t->eng.base, &ref, "rel", "x", 1, 0644, &err), -EINVAL);
    test_free(t);
}
END_TEST

static Suite *engine_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_create_adopts_and_rolls_back);
    tcase_add_test(tc, test_pause_is_idempotent);
    tcase_add_test(tc, test_list_keeps_ours);
    tcase_add_test(tc, test_exec_driver);
    tcase_add_test(tc, test_uploads);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr;
    int failed;

    if (!mkdtemp(spool))
        return EXIT_FAILURE;
    sr = srunner_create(engine_suite());
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    rmdir(spool);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
