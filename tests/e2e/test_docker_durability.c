/*
 * test_docker_durability.c - the daemon's durability paths (record before create,
 * stops retried, adoption after restart, reconciliation, TTL, bounded shutdown sweep) on the
 * docker provider against podman's Docker-compatible service (docker_env.h). Faults come from
 * the daemon's own switch: provider.stop=fail:N, and docker.created=delay:MS (the provider
 * waits after the container exists and before it starts it, so a kill -9 lands mid-create).
 * The engine itself is killed (SIGKILL to the podman service) for the engine-down case.
 * Skips (printed) when podman cannot run here.
 */
#include "docker_env.h"

static const char *sid_of(json_t *lease)
{
    return json_string_value(json_object_get(lease, "sandbox_id"));
}

/* The records of session rsid, each as "state" (or "state/stop_reason" when stopped). */
static int count_state(struct lbt_daemon *d, const char *rsid, const char *state)
{
    json_t *all = lbt_list_sandboxes(d), *rec;
    size_t i;
    int n = 0;

    json_array_foreach(all, i, rec) {
        if (strcmp(json_string_value(json_object_get(rec, "resources_session_id")) ?: "", rsid))
            continue;
        if (!state || !strcmp(json_string_value(json_object_get(rec, "state")), state))
            n++;
    }
    json_decref(all);
    return n;
}

/* Wait until every record of rsid is stopped; returns how many are not. */
static int wait_all_stopped(struct lbt_daemon *d, const char *rsid, long ms)
{
    int left = -1;

    for (long t = 0; t <= ms; t += 200) {
        left = count_state(d, rsid, NULL) - count_state(d, rsid, "stopped");
        if (left == 0)
            break;
        lbt_sleep_ms(200);
    }
    return left;
}

/* kill -9 while the container exists but create has not returned: after the restart no
 * container is left without a record and no record is left without a stop. */
START_TEST(test_kill9_during_create)
{
    static const char *const faulty[] = {"--set", "faults.spec=docker.created=delay:8000", NULL};
    struct dk_daemon x;
    struct lbt_async *a;
    struct lbt_resp r;
    json_t *lease;

    dk_start(&x, "k9", faulty);
    a = lbt_async_json(&x.d, "POST", "/v1/sessions/ep-k/seed", "", "{\"task_id\": \"t\"}");
    ck_assert_int_eq(dk_wait_containers(x.inst, 1, 8000), 1);
    lbt_daemon_kill(&x.d);
    lbt_async_join(a, &r);
    lbt_resp_free(&r);
    dk_restart(&x, "k9", NULL);
    /* reconciled before /readyz: the half-made sandbox is stopped and recorded so */
    ck_assert_int_eq(dk_count_containers(x.inst), 0);
    ck_assert_int_eq(count_state(&x.d, "ep-k", NULL), 1);
    ck_assert_int_eq(count_state(&x.d, "ep-k", "stopped"), 1);
    /* the session works again: one new container */
    lease = lbt_seed(&x.d, "ep-k", "t", NULL);
    ck_assert_int_eq(dk_count_containers(x.inst), 1);
    json_decref(lease);
    lbt_daemon_cleanup(&x.d);
    ck_assert_int_eq(dk_count_containers(x.inst), 0);
}
END_TEST

/* kill -9 of the daemon: the container keeps running and is adopted by the next start. */
START_TEST(test_restart_adopts)
{
    struct dk_daemon x;
    struct lbt_resp r;
    json_t *lease;
    char *out;

    dk_start(&x, "ad", NULL);
    lease = lbt_seed(&x.d, "ep-a", "t", NULL);
    out = lbt_sh(&x.d, sid_of(lease), "echo kept > /workspace/mark && echo ok");
    free(out);
    lbt_daemon_kill(&x.d);
    ck_assert_int_eq(dk_count_containers(x.inst), 1);
    dk_restart(&x, "ad", NULL);
    lbt_json(&x.d, "GET", "/v1/sessions/ep-a", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "state")), "lent");
    ck_assert_str_eq(sid_of(r.json), sid_of(lease));
    lbt_resp_free(&r);
    out = lbt_sh(&x.d, sid_of(lease), "cat /workspace/mark");
    ck_assert_str_eq(out, "kept\n");
    free(out);
    ck_assert_int_eq(dk_count_containers(x.inst), 1);
    lbt_json(&x.d, "POST", "/v1/sessions/ep-a/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    ck_assert_int_eq(dk_count_containers(x.inst), 0);
    json_decref(lease);
    lbt_daemon_cleanup(&x.d);
}
END_TEST

/* Failed stops keep their record and are retried by the sweeper until the container is gone. */
START_TEST(test_failed_stop_retried)
{
    static const char *const faulty[] = {"--set", "faults.spec=provider.stop=fail:2",
                                         "--set", "lending.retry_base_s=1",
                                         "--set", "lending.retry_max_s=1",
                                         NULL};
    struct dk_daemon x;
    struct lbt_resp r;
    json_t *lease;

    dk_start(&x, "st", faulty);
    lease = lbt_seed(&x.d, "ep-s", "t", NULL);
    lbt_json(&x.d, "POST", "/v1/sessions/ep-s/release", "", NULL, &r);
    lbt_assert_error(&r, 502, "provider_error");
    lbt_resp_free(&r);
    ck_assert_int_eq(count_state(&x.d, "ep-s", "stop_failed"), 1);
    ck_assert_int_eq(dk_count_containers(x.inst), 1);
    ck_assert_int_eq(wait_all_stopped(&x.d, "ep-s", 15000), 0);
    ck_assert_int_eq(dk_count_containers(x.inst), 0);
    json_decref(lease);
    lbt_daemon_cleanup(&x.d);
}
END_TEST

/* The engine dies mid-run: seeds answer 502 provider_error, records are kept, and the stops
 * complete once it is back. */
START_TEST(test_engine_killed)
{
    static const char *const fast[] = {"--set", "lending.retry_base_s=1", "--set",
                                       "lending.retry_max_s=1", NULL};
    struct dk_daemon x;
    struct lbt_resp r;
    json_t *lease;

    dk_start(&x, "eng", fast);
    lease = lbt_seed(&x.d, "ep-1", "t", NULL);
    dk_kill_service();
    lbt_json(&x.d, "POST", "/v1/sessions/ep-2/seed", "", "{\"task_id\": \"t\"}", &r);
    lbt_assert_error(&r, 502, "provider_error");
    lbt_resp_free(&r);
    lbt_json(&x.d, "POST", "/v1/sessions/ep-1/release", "", NULL, &r);
    lbt_assert_error(&r, 502, "provider_error");
    lbt_resp_free(&r);
    /* records kept: the lent one waits for its stop, the failed seed for its cleanup */
    ck_assert_int_eq(count_state(&x.d, "ep-1", "stop_failed"), 1);
    ck_assert_int_eq(count_state(&x.d, "ep-2", NULL), 1);
    ck_assert_int_eq(count_state(&x.d, "ep-2", "stopped"), 0);
    lbt_assert_healthy(&x.d);
    dk_restart_service();
    ck_assert_int_eq(wait_all_stopped(&x.d, "ep-1", 20000), 0);
    ck_assert_int_eq(wait_all_stopped(&x.d, "ep-2", 20000), 0);
    ck_assert_int_eq(dk_count_containers(x.inst), 0);
    /* and lending works again */
    json_decref(lease);
    lease = lbt_seed(&x.d, "ep-3", "t", NULL);
    ck_assert_int_eq(dk_count_containers(x.inst), 1);
    json_decref(lease);
    lbt_daemon_cleanup(&x.d);
}
END_TEST

/* TTL reaps a container through the unchanged sweeper path. */
START_TEST(test_ttl_reaps)
{
    struct dk_daemon x;
    json_t *lease;

    dk_start(&x, "ttl", NULL);
    lease = lbt_seed(&x.d, "ep-t", "t", "\"ttl_s\": 2");
    ck_assert_int_eq(dk_count_containers(x.inst), 1);
    ck_assert_int_eq(wait_all_stopped(&x.d, "ep-t", 15000), 0);
    ck_assert_int_eq(dk_count_containers(x.inst), 0);
    json_decref(lease);
    lbt_daemon_cleanup(&x.d);
}
END_TEST

/* SIGTERM: the shutdown sweep stops every container (at most stop_concurrency at once) and
 * records each as stopped by the shutdown. */
START_TEST(test_shutdown_sweep)
{
    static const char *const conc[] = {"--set", "lending.stop_concurrency=3", NULL};
    struct dk_daemon x;
    char rsid[32];
    json_t *all, *rec;
    size_t i;

    dk_start(&x, "sw", conc);
    for (int k = 0; k < 8; k++) {
        snprintf(rsid, sizeof(rsid), "ep-%d", k);
        json_decref(lbt_seed(&x.d, rsid, "t", NULL));
    }
    ck_assert_int_eq(dk_count_containers(x.inst), 8);
    ck_assert_int_eq(lbt_daemon_stop(&x.d), 0);
    ck_assert_int_eq(dk_count_containers(x.inst), 0);
    /* the sweep's own account: 8 sandboxes, none failed, at most 3 stops at once */
    {
        FILE *f = fopen(x.d.log_path, "r");
        char line[1024];
        int n = -1, failed = -1, inflight = -1;

        ck_assert_ptr_nonnull(f);
        while (fgets(line, sizeof(line), f)) {
            const char *p = strstr(line, "shutdown sweep: ");

            if (p)
                sscanf(p, "shutdown sweep: %d sandboxes, %d failed, at most %d stops in flight", &n,
                       &failed, &inflight);
        }
        fclose(f);
        ck_assert_int_eq(n, 8);
        ck_assert_int_eq(failed, 0);
        ck_assert_int_ge(inflight, 1);
        ck_assert_int_le(inflight, 3);
    }
    dk_restart(&x, "sw", conc);
    all = lbt_list_sandboxes(&x.d);
    ck_assert_uint_eq(json_array_size(all), 8);
    json_array_foreach(all, i, rec) {
        ck_assert_str_eq(json_string_value(json_object_get(rec, "state")), "stopped");
        ck_assert_str_eq(json_string_value(json_object_get(rec, "stop_reason")), "shutdown");
    }
    json_decref(all);
    lbt_daemon_cleanup(&x.d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("docker_durability");
    TCase *tc = tcase_create("docker_durability");
    int rc;

    if (!dk_setup("test_docker_durability"))
        return EXIT_SUCCESS;
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_kill9_during_create);
    tcase_add_test(tc, test_restart_adopts);
    tcase_add_test(tc, test_failed_stop_retried);
    tcase_add_test(tc, test_engine_killed);
    tcase_add_test(tc, test_ttl_reaps);
    tcase_add_test(tc, test_shutdown_sweep);
    suite_add_tcase(s, tc);
    rc = lbt_run_suite(s);
    dk_teardown();
    return rc;
}
