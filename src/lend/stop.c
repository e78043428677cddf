/*
 * stop.c - the one way a recorded sandbox is stopped, and retries of failed stops (release,
 * delete and release_all, which stop through it, are in release.c).
 *
 * A stop always goes: record "stopping" (with its reason) -> provider_stop -> record
 * "stopped"; or, when the provider fails, "stop_failed"/"failed_seed" with the error, the
 * attempt count and the time of the next retry (exponential backoff). Nothing leaves the live
 * set before the provider said the sandbox is gone.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"

/* ---------- stops ---------- */

static int64_t lend_backoff_s(struct lb_lend *l, int attempts)
{
    int64_t d = l->cfg.retry_base_s;

    for (int i = 1; i < attempts && d < l->cfg.retry_max_s; i++)
        d *= 2;
    return d < l->cfg.retry_max_s ? d : l->cfg.retry_max_s;
}

/* see lend_internal.h */
int lend_stop_provider(struct lb_lend *l, const struct lb_record *r, struct lb_error *perr)
{
    json_t *desc = r->descriptor_json ? json_loads(r->descriptor_json, 0, NULL) : NULL;
    struct lb_sandbox_ref ref = {r->id, desc};
    struct lb_provider *prov;
    int rc;

    metrics_add(LB_M_STOPS_IN_FLIGHT, 1);
    metrics_max(LB_M_STOPS_IN_FLIGHT_MAX, metrics_get(LB_M_STOPS_IN_FLIGHT));
    prov = lend_provider_of(l, r, perr);
    rc = prov ? provider_stop(prov, &ref, l->cfg.stop_timeout_s * 1000, perr) : -EREMOTEIO;
    metrics_sub(LB_M_STOPS_IN_FLIGHT, 1);
    json_decref(desc);
    return rc;
}

/* see lend_internal.h */
void lend_stop_begin(struct lb_lend *l, const struct lb_record *r)
{
    json_t *desc = r->descriptor_json ? json_loads(r->descriptor_json, 0, NULL) : NULL;
    struct lb_sandbox_ref ref = {r->id, desc};
    struct lb_provider *prov = lend_provider_of(l, r, NULL);

    if (prov)
        provider_stop_begin(prov, &ref);
    json_decref(desc);
}

/* see lend_internal.h */
int lend_stop_failed(struct lb_lend *l, const struct lb_record *r, enum lb_record_state fail_state,
                     const char *message, struct lb_error *err)
{
    int attempts = r->stop_attempts + 1;

    metrics_add(LB_M_STOPS_FAILED, 1);
    log_warn_sbx(r->id, "stop of sandbox %s failed (attempt %d): %s", r->id, attempts, message);
    store_mark_stop_failed(l->store, r->id, fail_state, message,
                           clock_now_s() + lend_backoff_s(l, attempts), NULL);
    return lb_error_set(err, -EREMOTEIO, "stopping sandbox %s failed: %s", r->id, message);
}

/* see lend_internal.h */
void lend_stop_done(struct lb_lend *l, const struct lb_record *r, const char *reason)
{
    metrics_add(LB_M_STOPS_OK, 1);
    lend_activity_forget(l, r->id);
    if (l->stopped_hook)
        l->stopped_hook(l->stopped_ctx, r->id);
    /* a record that could not be marked stopped still counts as a user: nothing is removed */
    lend_fork_collect_of(l, r);
    log_info_sbx(r->id, "sandbox %s stopped (%s)", r->id, reason ? reason : r->stop_reason);
}

/* see lend_internal.h */
json_t *lend_stop_usage(struct lb_lend *l, const struct lb_record *r)
{
    struct lb_usage u = {-1, -1, -1, -1, -1, -1};
    json_t *desc, *out = NULL;
    struct lb_provider *prov;

    if (r->state != LB_STATE_LENT || !(prov = lend_provider_of(l, r, NULL)))
        return NULL;
    desc = r->descriptor_json ? json_loads(r->descriptor_json, 0, NULL) : NULL;
    struct lb_sandbox_ref ref = {r->id, desc};

    if (provider_usage(prov, &ref, &u, NULL) == 0)
        out = lend_usage_json(&u);
    json_decref(desc);
    return out;
}

/* see lend_internal.h */
int lend_stop_record(struct lb_lend *l, const struct lb_record *r, const char *reason,
                     enum lb_record_state fail_state, struct lb_error *err)
{
    struct lb_error perr = {0};
    json_t *usage;
    int rc;

    if (r->state == LB_STATE_STOP_FAILED || r->state == LB_STATE_FAILED_SEED)
        metrics_add(LB_M_STOP_RETRIES, 1);
    rc = store_mark_stopping(l->store, r->id, reason, err);
    if (rc < 0)
        return rc;
    usage = lend_stop_usage(l, r);
    if (lend_stop_provider(l, r, &perr) < 0) {
        json_decref(usage);
        return lend_stop_failed(l, r, fail_state, perr.message, err);
    }
    rc = store_mark_stopped_usage(l->store, r->id, NULL, usage, err);
    json_decref(usage);
    lend_stop_done(l, r, reason);
    return rc;
}

/* Retry the stops a session left pending (failed seed, failed release). Returns 0 when none
 * is left, or the first failure. *n_stopped counts the ones that succeeded. */
int lend_retry_pending(struct lb_lend *l, const char *rsid, int *n_stopped, char *stopped_id,
                       size_t stopped_id_len, struct lb_error *err)
{
    struct lb_record_filter f = {.rsid = rsid, .state = -1, .pending_stop_only = true};
    struct lb_record *recs = NULL;
    size_t n = 0;
    int r = store_list_sandboxes(l->store, &f, &recs, &n, err);

    for (size_t i = 0; r == 0 && i < n; i++) {
        enum lb_record_state fail =
            recs[i].state == LB_STATE_FAILED_SEED ? LB_STATE_FAILED_SEED : LB_STATE_STOP_FAILED;
        r = lend_stop_record(l, &recs[i], NULL, fail, err);
        if (r == 0) {
            (*n_stopped)++;
            if (stopped_id)
                snprintf(stopped_id, stopped_id_len, "%s", recs[i].id);
        }
    }
    store_records_free(recs, n);
    return r;
}

/* Stop a warm sandbox whose record was claimed (state stopping) for reason, and wake the pool. */
static void stop_claimed_warm(struct lb_lend *l, const struct lb_record *r, const char *reason)
{
    log_info_sbx(r->id, "warm sandbox %s stopped (%s)", r->id, reason);
    lend_stop_record(l, r, NULL, LB_STATE_STOP_FAILED, NULL);
    lend_warm_changed(l);
}

/* see lend_internal.h */
void lend_stop_evicted(struct lb_lend *l, const char *id, const char *reason)
{
    struct lb_record rec = {0};

    if (lend_record_get(l, id, &rec, NULL) == 0)
        stop_claimed_warm(l, &rec, reason);
    store_record_release(&rec);
}

/* see lend_internal.h */
int lend_stop_oldest_warm(struct lb_lend *l, const char *reason, const char *not_class)
{
    struct lb_record_filter f = {.state = LB_STATE_WARM, .limit = not_class ? 0 : 4};
    struct lb_record *recs = NULL;
    size_t n = 0;
    int r = store_list_sandboxes(l->store, &f, &recs, &n, NULL);

    for (size_t i = 0; r == 0 && i < n; i++) {
        if (not_class && recs[i].pool_class && strcmp(recs[i].pool_class, not_class) == 0)
            continue;
        if (store_claim_warm(l->store, recs[i].id, reason, NULL) < 0)
            continue; /* a seed took it meanwhile */
        stop_claimed_warm(l, &recs[i], reason);
        store_records_free(recs, n);
        return 0;
    }
    store_records_free(recs, n);
    return -ENOENT;
}
