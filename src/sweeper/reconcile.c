/* reconcile.c - see sweeper.h: startup reconciliation of records and providers. */
#include "sweeper/sweeper.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lend/lend_internal.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"

/* ---------- startup reconciliation ---------- */

/* Finish the stop of a record that should not be running (startup reconciliation). */
static void reconcile_stop_record(struct lb_lend *l, const struct lb_record *rec,
                                  struct lb_reconcile_stats *stats)
{
    bool starting = rec->state == LB_STATE_STARTING;

    if (lend_stop_record(l, rec, starting ? "seed_failed" : NULL,
                         starting || rec->state == LB_STATE_FAILED_SEED ? LB_STATE_FAILED_SEED
                                                                        : LB_STATE_STOP_FAILED,
                         NULL) == 0)
        stats->stopped++;
    else
        stats->failed++;
}

int sweeper_reconcile(struct lb_lend *l, struct lb_reconcile_stats *stats, struct lb_error *err)
{
    struct lb_record_filter live = {.state = -1, .live_only = true};
    struct lb_record_filter pending = {.state = -1, .pending_stop_only = true};
    struct lb_record *recs = NULL;
    const char **vanished = NULL;
    size_t n = 0, n_vanished = 0;
    json_t *found = NULL, *item;
    size_t idx;
    int r;

    memset(stats, 0, sizeof(*stats));
    /* 1. starting and lent records: adopt what runs, record what vanished */
    r = store_list_sandboxes(lend_store(l), &live, &recs, &n, err);
    if (r < 0)
        return r;
    vanished = calloc(n + 1, sizeof(*vanished));
    if (!vanished) {
        store_records_free(recs, n);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        struct lb_record *rec = &recs[i];
        struct lb_provider *prov;
        json_t *desc;
        enum lb_sandbox_status st = LB_STATUS_UNKNOWN;
        int sr;

        /* a warm pool's sandbox: back into the pool (checked below like a lent one) only
         * when pool.adopt is on */
        if (rec->state == LB_STATE_WARM && !lend_config(l)->pool_adopt) {
            if (lend_stop_record(l, rec, "not_adopted", LB_STATE_STOP_FAILED, NULL) == 0)
                stats->stopped++;
            else
                stats->failed++;
            continue;
        }
        if (rec->state != LB_STATE_LENT && rec->state != LB_STATE_WARM) {
            reconcile_stop_record(l, rec, stats);
            continue;
        }
        /* a reset a crash interrupted: never lent half-reset; its descriptor may name the
         * sandbox the reset tore down, so the provider looks for what runs now by id */
        if (rec->state == LB_STATE_LENT && lend_record_resetting(rec)) {
            char *stale = rec->descriptor_json;

            rec->descriptor_json = NULL;
            log_warn_sbx(rec->id, "sandbox %s: its reset was interrupted; stopping it", rec->id);
            if (lend_stop_record(l, rec, "reset_failed", LB_STATE_STOP_FAILED, NULL) == 0)
                stats->stopped++;
            else
                stats->failed++;
            rec->descriptor_json = stale;
            continue;
        }
        prov = lend_provider_of(l, rec, NULL);
        if (!prov) {
            /* its provider is not enabled now: left as it is, served again once it is */
            log_warn_sbx(rec->id,
                         "sandbox %s of provider '%s' left alone: that provider is "
                         "not enabled",
                         rec->id, rec->provider);
            stats->failed++;
            continue;
        }
        desc = rec->descriptor_json ? json_loads(rec->descriptor_json, 0, NULL) : NULL;
        struct lb_sandbox_ref ref = {rec->id, desc};
        sr = provider_status(prov, &ref, &st, NULL);
        /* Gone while we were away: clean up what may be left (idempotent), and record it
         * below in one transaction; a crash before that only repeats this on the next start. */
        if (sr == 0 && st == LB_STATUS_STOPPED &&
            provider_stop(prov, &ref, lend_config(l)->stop_timeout_s * 1000, NULL) == 0)
            vanished[n_vanished++] = rec->id;
        else if (sr == 0 && st == LB_STATUS_STOPPED)
            reconcile_stop_record(l, rec, stats); /* leftovers would not go: retry loop */
        else
            stats->adopted++;
        json_decref(desc);
    }
    for (size_t i = 0; i < n_vanished; i += 512) {
        size_t chunk = n_vanished - i < 512 ? n_vanished - i : 512;

        if (store_mark_stopped_many(lend_store(l), vanished + i, chunk, "vanished", err) == 0)
            stats->vanished += (int)chunk;
        else
            stats->failed += (int)chunk;
    }
    free(vanished);
    store_records_free(recs, n);
    recs = NULL, n = 0;
    /* 2. stopping, failed_seed, stop_failed: finish the stop */
    r = store_list_sandboxes(lend_store(l), &pending, &recs, &n, err);
    if (r < 0)
        return r;
    for (size_t i = 0; i < n; i++)
        reconcile_stop_record(l, &recs[i], stats);
    store_records_free(recs, n);
    recs = NULL, n = 0;
    /* Sandboxes of ours with no record at all (a crash between create and insert is not
     * possible, since the record comes first; this catches records purged or lost), asked of
     * every enabled provider. */
    for (size_t p = 0; p < registry_count(lend_providers(l)); p++) {
        struct lb_provider *prov = registry_at(lend_providers(l), p);

        if (provider_list(prov, &found, NULL) < 0)
            continue;
        json_array_foreach(found, idx, item) {
            const char *id = json_string_value(json_object_get(item, "sandbox_id"));
            struct lb_record cur = {0};

            if (!id || store_get_sandbox(lend_store(l), id, &cur, NULL) == 0) {
                store_record_release(&cur);
                continue;
            }
            struct lb_sandbox_ref ref = {id, json_object_get(item, "descriptor")};
            if (provider_stop(prov, &ref, lend_config(l)->stop_timeout_s * 1000, NULL) == 0) {
                stats->orphans_stopped++;
                log_warn_sbx(id, "stopped sandbox %s that had no record", id);
            } else {
                stats->failed++;
            }
        }
        json_decref(found);
        found = NULL;
    }
    store_records_free(recs, n);
    metrics_add(LB_M_RECONCILE_ADOPTED, (uint64_t)stats->adopted);
    metrics_add(LB_M_RECONCILE_VANISHED, (uint64_t)stats->vanished);
    metrics_add(LB_M_RECONCILE_STOPPED, (uint64_t)stats->stopped);
    metrics_add(LB_M_RECONCILE_ORPHANS, (uint64_t)stats->orphans_stopped);
    return 0;
}
