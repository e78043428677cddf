/*
 * test_lxd_idmap.c - the lxd provider's id ranges on a real two-member LXD cluster
 * (scripts/lxd-cluster; both members on this machine, one /etc/subuid). Runs on the lxd variant
 * only (make e2e-lxd); elsewhere it prints SKIP. 40 seeds sent at once all answer 200, and every
 * instance runs in an id range of its own: LXD's config (security.idmap.base and
 * volatile.idmap.current) and the kernel (/proc/<init>/uid_map and gid_map of each instance's
 * init, on this machine) show 40 pairwise disjoint ranges of 65536 ids. After a kill -9 and a
 * restart the live instances (the 6 of the lowest ranges; the 34 others released) keep their
 * ranges and new seeds get none of them; the daemon's shutdown removes every instance. The wall
 * time of the 40 seeds is printed (LENDBOX_E2E_LXD_CREATE_CONCURRENCY=N sets
 * lxd.create_concurrency, for a comparison; no time is asserted).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define N_SEEDS 40
#define N_KEEP 6  /* live across the restart */
#define N_AFTER 3 /* seeds after it */
#define RANGE_IDS 65536

struct inst_range {
    char rsid[32];
    char id[64];
    long long base; /* security.idmap.base */
    long long uid_host, gid_host;
};

/* The first host id of the uid (or gid) entry of LXD's volatile.idmap.current (a JSON string),
 * asserting that it maps 0..65535 and nothing else of that kind. */
static long long current_host(const char *current, bool uid)
{
    json_t *m = json_loads(current, 0, NULL), *e;
    long long host = -1;
    size_t i;
    int n = 0;

    ck_assert_msg(json_is_array(m), "volatile.idmap.current: %s", current);
    json_array_foreach(m, i, e) {
        if (!json_is_true(json_object_get(e, uid ? "Isuid" : "Isgid")))
            continue;
        n++;
        ck_assert_int_eq(json_integer_value(json_object_get(e, "Nsid")), 0);
        ck_assert_int_eq(json_integer_value(json_object_get(e, "Maprange")), RANGE_IDS);
        host = json_integer_value(json_object_get(e, "Hostid"));
    }
    ck_assert_msg(n == 1, "volatile.idmap.current has %d %s entries: %s", n, uid ? "uid" : "gid",
                  current);
    json_decref(m);
    return host;
}

/* The instance's init's /proc/<pid>/<file> (uid_map or gid_map): one line "0 HOST 65536". */
static long long kernel_host(int pid, const char *file)
{
    char path[128], line[256], extra[256];
    long long inside = -1, host = -1, count = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/%s", pid, file);
    f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
    ck_assert_int_eq(sscanf(line, "%lld %lld %lld", &inside, &host, &count), 3);
    ck_assert_ptr_null(fgets(extra, sizeof(extra), f)); /* one line only */
    fclose(f);
    ck_assert_int_eq(inside, 0);
    ck_assert_int_eq(count, RANGE_IDS);
    return host;
}

/* What LXD and the kernel say of instance id's range (into out; id may be out->id); all three
 * agree. */
static void range_of(const char *id, struct inst_range *out)
{
    char path[256];
    json_t *j, *conf, *st;
    const char *base, *current;
    int pid;

    if (out->id != id)
        snprintf(out->id, sizeof(out->id), "%s", id);
    snprintf(path, sizeof(path), "/1.0/instances/%s", id);
    j = lbt_lxd_get(path);
    ck_assert_ptr_nonnull(j);
    conf = json_object_get(json_object_get(j, "metadata"), "config");
    base = json_string_value(json_object_get(conf, "security.idmap.base"));
    current = json_string_value(json_object_get(conf, "volatile.idmap.current"));
    ck_assert_msg(base && current, "instance %s: no security.idmap.base / volatile.idmap.current",
                  id);
    ck_assert_str_eq(json_string_value(json_object_get(conf, "security.idmap.isolated")), "true");
    ck_assert_str_eq(json_string_value(json_object_get(conf, "security.idmap.size")), "65536");
    out->base = atoll(base);
    out->uid_host = current_host(current, true);
    out->gid_host = current_host(current, false);
    ck_assert_int_eq(out->uid_host, out->base);
    ck_assert_int_eq(out->gid_host, out->base);
    ck_assert_int_eq(out->base % RANGE_IDS, 0);
    json_decref(j);
    snprintf(path, sizeof(path), "/1.0/instances/%s/state", id);
    st = lbt_lxd_get(path);
    pid = (int)json_integer_value(json_object_get(json_object_get(st, "metadata"), "pid"));
    json_decref(st);
    ck_assert_int_gt(pid, 1);
    ck_assert_int_eq(kernel_host(pid, "uid_map"), out->base);
    ck_assert_int_eq(kernel_host(pid, "gid_map"), out->base);
}

static int by_base(const void *x, const void *y)
{
    const struct inst_range *a = x, *b = y;

    return a->base < b->base ? -1 : a->base > b->base;
}

/* LXD's HTTP-ish code for GET /1.0/instances/id: 404 once it is gone. */
static bool wait_instance_gone(const char *id, int seconds)
{
    char path[256];

    snprintf(path, sizeof(path), "/1.0/instances/%s", id);
    for (int i = 0; i < seconds * 4; i++) {
        json_t *j = lbt_lxd_get(path);
        long code = json_integer_value(json_object_get(j, "error_code"));

        json_decref(j);
        if (code == 404)
            return true;
        lbt_sleep_ms(250);
    }
    return false;
}

static void assert_disjoint(const struct inst_range *r, int n)
{
    for (int i = 0; i < n; i++)
        for (int k = i + 1; k < n; k++)
            ck_assert_msg(r[i].base + RANGE_IDS <= r[k].base || r[k].base + RANGE_IDS <= r[i].base,
                          "instances %s and %s share ids: %lld and %lld", r[i].id, r[k].id,
                          r[i].base, r[k].base);
}

START_TEST(test_concurrent_seeds_own_ranges)
{
    char inst_set[96], conc_set[64] = "", path[64];
    const char *conc = getenv("LENDBOX_E2E_LXD_CREATE_CONCURRENCY");
    const char *extra[] = {"--set", inst_set, "--set", "lending.max_starting=64", "--set",
                           "lending.max_seed_queue=256",
                           /* 40 creates at once on a loaded 2-core machine: LXD may take
                            * longer than the default 30 s for the last of them; what is
                            * asserted is that every seed succeeds with ids of its own */
                           "--set", "lending.create_timeout_s=180", NULL, NULL, NULL};
    static struct inst_range ranges[N_SEEDS];
    struct lbt_async *a[N_SEEDS];
    struct lbt_daemon d;
    struct lbt_resp r;
    double t0, wall;

    if (conc && *conc) {
        snprintf(conc_set, sizeof(conc_set), "lxd.create_concurrency=%s", conc);
        extra[8] = "--set";
        extra[9] = conc_set;
    }
    snprintf(inst_set, sizeof(inst_set), "lxd.instance=lbt-idmap-%d", (int)getpid());
    lbt_daemon_start(&d, extra);
    t0 = lbt_now();
    for (int i = 0; i < N_SEEDS; i++) {
        snprintf(ranges[i].rsid, sizeof(ranges[i].rsid), "idm-%d", i);
        snprintf(path, sizeof(path), "/v1/sessions/%.31s/seed", ranges[i].rsid);
        a[i] = lbt_async_json(&d, "POST", path, "", "{\"task_id\": \"t\"}");
    }
    for (int i = 0; i < N_SEEDS; i++) {
        lbt_async_join(a[i], &r);
        ck_assert_msg(r.status == 200, "seed %d: %ld %s", i, r.status, r.body);
        snprintf(ranges[i].id, sizeof(ranges[i].id), "%s",
                 json_string_value(json_object_get(r.json, "sandbox_id")));
        lbt_resp_free(&r);
    }
    wall = lbt_now() - t0;
    fprintf(stderr, "test_lxd_idmap: %d concurrent seeds took %.1f s (%s)\n", N_SEEDS, wall,
            conc_set[0] ? conc_set : "lxd.create_concurrency default");
    for (int i = 0; i < N_SEEDS; i++)
        range_of(ranges[i].id, &ranges[i]);
    assert_disjoint(ranges, N_SEEDS);

    /* a crash and a restart: the live instances keep their ranges, new seeds take none of
     * them. The N_KEEP with the lowest ranges stay (the slots a table that forgot them would
     * hand out first), the others are released at once (a restart's reconciliation asks LXD of
     * each live one in turn) */
    qsort(ranges, N_SEEDS, sizeof(ranges[0]), by_base);
    for (int i = N_KEEP; i < N_SEEDS; i++) {
        snprintf(path, sizeof(path), "/v1/sessions/%.31s/release", ranges[i].rsid);
        a[i] = lbt_async_json(&d, "POST", path, "", NULL);
    }
    for (int i = N_KEEP; i < N_SEEDS; i++) {
        lbt_async_join(a[i], &r);
        ck_assert_msg(r.status == 200, "release %s: %ld %s", ranges[i].rsid, r.status, r.body);
        lbt_resp_free(&r);
    }
    lbt_daemon_kill(&d);
    lbt_daemon_restart(&d, extra);
    for (int i = 0; i < N_AFTER; i++) {
        struct inst_range *n = &ranges[N_KEEP + i];
        json_t *lease;

        snprintf(n->rsid, sizeof(n->rsid), "idm-after-%d", i);
        lease = lbt_seed(&d, n->rsid, "t", NULL);
        snprintf(n->id, sizeof(n->id), "%s",
                 json_string_value(json_object_get(lease, "sandbox_id")));
        json_decref(lease);
    }
    for (int i = 0; i < N_KEEP + N_AFTER; i++)
        range_of(ranges[i].id, &ranges[i]);
    assert_disjoint(ranges, N_KEEP + N_AFTER);
    lbt_daemon_cleanup(&d);
    for (int i = 0; i < N_KEEP + N_AFTER; i++)
        ck_assert_msg(wait_instance_gone(ranges[i].id, 120), "instance %s left", ranges[i].id);
}
END_TEST

int main(void)
{
    Suite *s;
    TCase *tc;

    if (!lbt_variant_is("lxd")) {
        printf("test_lxd_idmap: SKIP: runs on the lxd variant (make e2e-lxd, "
               "LENDBOX_E2E_VARIANT=lxd)\n");
        return 0;
    }
    s = suite_create("lxd_idmap");
    tc = tcase_create("ranges");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_concurrent_seeds_own_ranges);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
