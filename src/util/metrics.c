/* metrics.c - see metrics.h. */
#include "util/metrics.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Names follow Prometheus' rules (promtool check metrics): counters end in _total, durations
 * are in seconds and end in _seconds (kept in milliseconds here, converted when rendered: ms). */
static const struct {
    const char *name, *labels, *help;
    bool gauge, ms;
} counter_info[LB_M_COUNTERS] = {
    [LB_M_SEEDS_OK] = {"lendbox_seeds_total", "result=\"ok\"", "Seeds by result."},
    [LB_M_SEEDS_REUSED] = {"lendbox_seeds_total", "result=\"reused\"", NULL},
    [LB_M_SEEDS_FAILED] = {"lendbox_seeds_total", "result=\"failed\"", NULL},
    [LB_M_RELEASES_OK] = {"lendbox_releases_total", "result=\"ok\"", "Releases by result."},
    [LB_M_RELEASES_FAILED] = {"lendbox_releases_total", "result=\"failed\"", NULL},
    [LB_M_STOPS_OK] = {"lendbox_stops_total", "result=\"ok\"", "Provider stops by result."},
    [LB_M_STOPS_FAILED] = {"lendbox_stops_total", "result=\"failed\"", NULL},
    [LB_M_STOP_RETRIES] = {"lendbox_stop_retries_total", NULL, "Stops retried after a failure."},
    [LB_M_EXECS] = {"lendbox_execs_total", NULL, "Commands run through exec."},
    [LB_M_EXEC_TIMEOUTS] = {"lendbox_exec_timeouts_total", NULL, "Execs killed at their timeout."},
    [LB_M_HTTP_REQUESTS] = {"lendbox_http_requests_total", NULL, "HTTP requests answered."},
    [LB_M_HTTP_ERRORS_4XX] = {"lendbox_http_errors_total", "class=\"4xx\"", "HTTP errors."},
    [LB_M_HTTP_ERRORS_5XX] = {"lendbox_http_errors_total", "class=\"5xx\"", NULL},
    [LB_M_HTTP_OVERLOADED] = {"lendbox_http_overloaded_total", NULL, "Requests refused 429."},
    [LB_M_TTL_REAPED] = {"lendbox_ttl_reaped_total", NULL, "Sandboxes stopped at their TTL."},
    [LB_M_SANDBOXES_LOST] = {"lendbox_sandboxes_lost_total", NULL,
                             "Sandboxes whose init died outside lendbox's control."},
    [LB_M_RECONCILE_ADOPTED] = {"lendbox_reconciled_total", "result=\"adopted\"",
                                "Startup reconciliation outcomes."},
    [LB_M_RECONCILE_VANISHED] = {"lendbox_reconciled_total", "result=\"vanished\"", NULL},
    [LB_M_RECONCILE_STOPPED] = {"lendbox_reconciled_total", "result=\"stopped\"", NULL},
    [LB_M_RECONCILE_ORPHANS] = {"lendbox_reconciled_total", "result=\"orphan_stopped\"", NULL},
    [LB_M_SWEEPS] = {"lendbox_sweeps_total", NULL, "Sweeper passes (retries, TTL, purge)."},
    [LB_M_SWEEP_LAST_MS] = {"lendbox_sweep_last_duration_seconds", NULL,
                            "Duration of the last sweeper pass.", true, true},
    [LB_M_STOPS_IN_FLIGHT] = {"lendbox_stops_in_flight", NULL, "Provider stops running now.", true},
    [LB_M_STOPS_IN_FLIGHT_MAX] = {"lendbox_stops_in_flight_max", NULL,
                                  "Most provider stops ever in flight at once.", true},
    [LB_M_SHUTDOWN_SWEEP_MS] = {"lendbox_shutdown_sweep_duration_seconds", NULL,
                                "Duration of the shutdown sweep (0 until one ran).", true, true},
    [LB_M_SESSION_LOCK_TIMEOUTS] = {"lendbox_session_lock_timeouts_total", NULL,
                                    "Requests that gave up waiting for a busy session (409)."},
    [LB_M_NET_MODEL_ONLY] = {"lendbox_network_sandboxes", "mode=\"model_only\"",
                             "Sandboxes with a network link, by network mode.", true},
    [LB_M_NET_MODEL_AND_TOOLS] = {"lendbox_network_sandboxes", "mode=\"model_and_tools\"", NULL,
                                  true},
    [LB_M_NET_NAT] = {"lendbox_network_sandboxes", "mode=\"nat\"", NULL, true},
    [LB_M_NET_RULE_FAILURES] = {"lendbox_network_rule_failures_total", NULL,
                                "Links or egress rules that could not be installed."},
    [LB_M_NET_UNENFORCEABLE] = {"lendbox_network_unenforceable_total", NULL,
                                "Network requests refused as unenforceable (422)."},
    [LB_M_WARM_HITS] = {"lendbox_warm_seeds_total", "result=\"hit\"",
                        "Seeds while a warm pool is on, by result."},
    [LB_M_WARM_MISSES] = {"lendbox_warm_seeds_total", "result=\"miss\"", NULL},
    [LB_M_WARM_OTHER_CLASS] = {"lendbox_warm_seeds_total", "result=\"other_class\"", NULL},
    [LB_M_WARM_REFILLS] = {"lendbox_warm_refills_total", "result=\"ok\"",
                           "Warm sandboxes made, by result."},
    [LB_M_WARM_REFILLS_FAILED] = {"lendbox_warm_refills_total", "result=\"failed\"", NULL},
    [LB_M_WARM_REFILL_MS] = {"lendbox_warm_refill_seconds_total", NULL,
                             "Time spent making warm sandboxes.", false, true},
    [LB_M_WARM_REFILL_LAST_MS] = {"lendbox_warm_refill_last_duration_seconds", NULL,
                                  "Time the last warm sandbox took to make.", true, true},
    [LB_M_POOL_RECYCLED] = {"lendbox_pool_recycled_total", NULL,
                            "Released sandboxes reset and returned to the warm pool."},
    [LB_M_POOL_RESET_FAILURES] = {"lendbox_pool_reset_failures_total", NULL,
                                  "Recycles whose reset failed (stopped, reason reset_failed)."},
    [LB_M_HTTP_CUT_DEADLINE] = {"lendbox_http_connections_cut_total", "reason=\"header_deadline\"",
                                "Connections closed before their request headers were in, by "
                                "reason."},
    [LB_M_HTTP_CUT_CAP] = {"lendbox_http_connections_cut_total", "reason=\"per_address_cap\"",
                           NULL},
    [LB_M_HTTP_WAITING_MAX] = {"lendbox_http_incomplete_per_address_max", NULL,
                               "Most connections of one client address ever still sending their "
                               "request headers at once.",
                               true},
    [LB_M_SEEDS_STARTING] = {"lendbox_seeds_starting", NULL,
                             "Sandbox creations under way (seeds and warm refills; at most "
                             "lending.max_starting).",
                             true},
    [LB_M_SEED_QUEUE_LENGTH] = {"lendbox_seed_queue_length", NULL,
                                "Seeds waiting for a creation slot (at most "
                                "lending.max_seed_queue).",
                                true},
    [LB_M_SEEDS_OVERLOADED] = {"lendbox_seeds_overloaded_total", NULL,
                               "Seeds refused 429 overloaded: creation slots and queue full."},
};

static atomic_uint_fast64_t counters[LB_M_COUNTERS];

/* Bucket upper bounds in milliseconds; the last bucket is +Inf. */
static const int64_t bucket_ms[] = {1,   2,    5,    10,   25,    50,    100,   250,
                                    500, 1000, 2500, 5000, 10000, 30000, 60000, 300000};
#define N_BUCKETS (sizeof(bucket_ms) / sizeof(bucket_ms[0]) + 1)

struct route_hist {
    const char *label;
    atomic_uint_fast64_t buckets[N_BUCKETS];
    atomic_uint_fast64_t count, sum_ms;
};

static struct route_hist routes[LB_METRICS_MAX_ROUTES + 1]; /* last: unmatched */
static atomic_int n_routes;

#define MEMBER_SLOTS 64
struct member_count {
    char provider[32], member[64];
    uint64_t calls, failures;
};
static struct member_count members[MEMBER_SLOTS];
static size_t n_members;
static pthread_mutex_t members_mutex = PTHREAD_MUTEX_INITIALIZER;

#define STORAGE_SLOTS 8
struct provider_storage {
    char provider[32], pool[64], driver[64];
};
static struct provider_storage storages[STORAGE_SLOTS];
static size_t n_storages;

/* a label value: no quote, backslash or newline */
static void copy_label(char *dst, size_t size, const char *src)
{
    src = src ? src : "";
    snprintf(dst, size, "%.*s", (int)strcspn(src, "\"\\\n"), src);
}

void metrics_provider_storage(const char *provider, const char *pool, const char *driver)
{
    struct provider_storage *s = NULL;
    char name[sizeof(s->provider)];

    copy_label(name, sizeof(name), provider);
    pthread_mutex_lock(&members_mutex);
    for (size_t i = 0; i < n_storages && !s; i++)
        if (strcmp(storages[i].provider, name) == 0)
            s = &storages[i];
    if (!s && n_storages < STORAGE_SLOTS) {
        s = &storages[n_storages++];
        snprintf(s->provider, sizeof(s->provider), "%s", name);
    }
    if (s) {
        copy_label(s->pool, sizeof(s->pool), pool);
        copy_label(s->driver, sizeof(s->driver), driver);
    }
    pthread_mutex_unlock(&members_mutex);
}

void metrics_member_call(const char *provider, const char *member, bool failed)
{
    struct member_count *m = NULL;

    if (!member || !*member)
        member = "-";
    pthread_mutex_lock(&members_mutex);
    for (size_t i = 0; i < n_members && !m; i++)
        if (strcmp(members[i].provider, provider) == 0 && strcmp(members[i].member, member) == 0)
            m = &members[i];
    if (!m && n_members >= MEMBER_SLOTS - 1) {
        member = "other"; /* the last slot counts every later pair */
        for (size_t i = 0; i < n_members && !m; i++)
            if (strcmp(members[i].provider, provider) == 0 &&
                strcmp(members[i].member, member) == 0)
                m = &members[i];
    }
    if (!m && n_members < MEMBER_SLOTS) {
        m = &members[n_members++];
        snprintf(m->provider, sizeof(m->provider), "%s", provider);
        /* a label value: no quote, backslash or newline */
        snprintf(m->member, sizeof(m->member), "%.*s", (int)strcspn(member, "\"\\\n"), member);
    }
    if (m) {
        m->calls++;
        if (failed)
            m->failures++;
    }
    pthread_mutex_unlock(&members_mutex);
}

void metrics_add(enum lb_counter c, uint64_t n)
{
    atomic_fetch_add(&counters[c], n);
}

void metrics_set(enum lb_counter c, uint64_t v)
{
    atomic_store(&counters[c], v);
}

void metrics_sub(enum lb_counter c, uint64_t n)
{
    atomic_fetch_sub(&counters[c], n);
}

void metrics_max(enum lb_counter c, uint64_t v)
{
    uint_fast64_t cur = atomic_load(&counters[c]);

    while (cur < v && !atomic_compare_exchange_weak(&counters[c], &cur, v))
        ;
}

uint64_t metrics_get(enum lb_counter c)
{
    return atomic_load(&counters[c]);
}

int metrics_route_register(const char *label)
{
    int n = atomic_load(&n_routes);

    for (int i = 0; i < n; i++)
        if (!strcmp(routes[i].label, label))
            return i;
    if (n >= LB_METRICS_MAX_ROUTES)
        return -1;
    routes[n].label = label;
    atomic_store(&n_routes, n + 1);
    return n;
}

void metrics_observe_request(int route, int64_t duration_ms)
{
    struct route_hist *h =
        &routes[route >= 0 && route < LB_METRICS_MAX_ROUTES ? route : LB_METRICS_MAX_ROUTES];
    size_t b = 0;

    while (b < N_BUCKETS - 1 && duration_ms > bucket_ms[b])
        b++;
    atomic_fetch_add(&h->buckets[b], 1);
    atomic_fetch_add(&h->count, 1);
    atomic_fetch_add(&h->sum_ms, (uint64_t)(duration_ms < 0 ? 0 : duration_ms));
}

static int metrics_printf(struct lb_buf *out, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int metrics_printf(struct lb_buf *out, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n < 0)
        return -EINVAL;
    return lb_buf_append(out, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
}

int metrics_render(struct lb_buf *out)
{
    int r = 0;

    for (int c = 0; c < LB_M_COUNTERS && r == 0; c++) {
        if (counter_info[c].help)
            r = metrics_printf(out, "# HELP %s %s\n# TYPE %s %s\n", counter_info[c].name,
                               counter_info[c].help, counter_info[c].name,
                               counter_info[c].gauge ? "gauge" : "counter");
        if (r == 0 && counter_info[c].ms)
            r = metrics_printf(out, "%s %.3f\n", counter_info[c].name,
                               (double)atomic_load(&counters[c]) / 1000.0);
        else if (r == 0)
            r = metrics_printf(
                out, "%s%s%s%s %llu\n", counter_info[c].name, counter_info[c].labels ? "{" : "",
                counter_info[c].labels ? counter_info[c].labels : "",
                counter_info[c].labels ? "}" : "", (unsigned long long)atomic_load(&counters[c]));
    }
    if (r == 0)
        r = metrics_printf(out, "# HELP lendbox_http_request_duration_seconds Request latency by "
                                "route.\n# TYPE lendbox_http_request_duration_seconds histogram\n");
    for (int i = 0; i <= LB_METRICS_MAX_ROUTES && r == 0; i++) {
        struct route_hist *h = &routes[i];
        const char *label = i == LB_METRICS_MAX_ROUTES ? "unmatched" : h->label;
        uint64_t cum = 0;

        if (i < LB_METRICS_MAX_ROUTES && i >= atomic_load(&n_routes))
            continue;
        if (atomic_load(&h->count) == 0)
            continue;
        for (size_t b = 0; b < N_BUCKETS && r == 0; b++) {
            cum += atomic_load(&h->buckets[b]);
            if (b < N_BUCKETS - 1)
                r = metrics_printf(out,
                                   "lendbox_http_request_duration_seconds_bucket{route=\"%s\","
                                   "le=\"%g\"} %llu\n",
                                   label, (double)bucket_ms[b] / 1000.0, (unsigned long long)cum);
            else
                r = metrics_printf(out,
                                   "lendbox_http_request_duration_seconds_bucket{route=\"%s\","
                                   "le=\"+Inf\"} %llu\n",
                                   label, (unsigned long long)cum);
        }
        if (r == 0)
            r = metrics_printf(out,
                               "lendbox_http_request_duration_seconds_sum{route=\"%s\"} %.3f\n"
                               "lendbox_http_request_duration_seconds_count{route=\"%s\"} %llu\n",
                               label, (double)atomic_load(&h->sum_ms) / 1000.0, label,
                               (unsigned long long)atomic_load(&h->count));
    }
    /* one family after the other: Prometheus wants a family's samples together */
    pthread_mutex_lock(&members_mutex);
    for (int fam = 0; fam < 2 && n_members > 0; fam++) {
        const char *name =
            fam ? "lendbox_provider_member_failures_total" : "lendbox_provider_member_calls_total";

        if (r == 0)
            r = metrics_printf(out, "# HELP %s %s\n# TYPE %s counter\n", name,
                               fam ? "Engine API calls by cluster member that failed (no "
                                     "answer, timeout, 5xx)."
                                   : "Engine API calls by cluster member.",
                               name);
        for (size_t i = 0; i < n_members && r == 0; i++)
            r = metrics_printf(out, "%s{provider=\"%s\",member=\"%s\"} %llu\n", name,
                               members[i].provider, members[i].member,
                               (unsigned long long)(fam ? members[i].failures : members[i].calls));
    }
    if (r == 0 && n_storages > 0)
        r = metrics_printf(out,
                           "# HELP lendbox_provider_storage_info The storage pool and driver a "
                           "provider makes sandbox roots on (found at start).\n"
                           "# TYPE lendbox_provider_storage_info gauge\n");
    for (size_t i = 0; i < n_storages && r == 0; i++)
        r = metrics_printf(out,
                           "lendbox_provider_storage_info{provider=\"%s\",pool=\"%s\",driver="
                           "\"%s\"} 1\n",
                           storages[i].provider, storages[i].pool, storages[i].driver);
    pthread_mutex_unlock(&members_mutex);
    return r;
}
