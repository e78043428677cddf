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
#include "util/parallel.h"

/* ---------- startup reconciliation ---------- */

/* Finish the stop of a record that should not be running (startup reconciliation): 0, or
 * lend_stop_record's error (the record kept for the retry loop). */
static int reconcile_stop_one(struct lb_lend *l, const struct lb_record *rec)
{
    bool starting = rec->state == LB_STATE_STARTING;

    return lend_stop_record(l, rec, starting ? "seed_failed" : NULL,
                            starting || rec->state == LB_STATE_FAILED_SEED ? LB_STATE_FAILED_SEED
                                                                           : LB_STATE_STOP_FAILED,
                            NULL);
}

static void reconcile_stop_record(struct lb_lend *l, const struct lb_record *rec,
                                  struct lb_reconcile_stats *stats)
{
    if (reconcile_stop_one(l, rec) == 0)
        stats->stopped++;
    else
        stats->failed++;
}

/* What the provider says of a starting or lent record (step 1), asked of many at once: a
 * provider call (an engine's HTTP round trip, ~1 s for an LXD cluster) each. */
enum check_outcome { CHECK_ADOPT, CHECK_VANISHED, CHECK_STOP };

struct reconcile_batch {
    struct lb_lend *l;
    struct lb_record **recs;    /* the records to ask about (borrowed) */
    struct lb_provider **provs; /* each one's provider */
    int *result;                /* per index: an enum check_outcome, or the stop's 0 / error */
};

/* parallel_run's fn for step 1: ask whether recs[i] runs; one that is gone has what is left
 * of it cleaned up (idempotent) and is recorded after the batch. Its own slot only. */
static void reconcile_check_one(void *arg, size_t i)
{
    struct reconcile_batch *b = arg;
    const struct lb_record *rec = b->recs[i];
    json_t *desc = rec->descriptor_json ? json_loads(rec->descriptor_json, 0, NULL) : NULL;
    struct lb_sandbox_ref ref = {rec->id, desc};
    enum lb_sandbox_status st = LB_STATUS_UNKNOWN;
    int sr = provider_status(b->provs[i], &ref, &st, NULL);

    b->result[i] = CHECK_ADOPT;
    /* Gone while we were away: clean up what may be left (idempotent), and record it after
     * the batch in one transaction; a crash before that only repeats this on the next start. */
    if (sr == 0 && st == LB_STATUS_STOPPED)
        b->result[i] =
            provider_stop(b->provs[i], &ref, lend_config(b->l)->stop_timeout_s * 1000, NULL) == 0
                ? CHECK_VANISHED
                : CHECK_STOP; /* leftovers would not go: the retry loop's */
    json_decref(desc);
}

/* parallel_run's fn for step 2: finish the stop of recs[i]. */
static void reconcile_stop_run(void *arg, size_t i)
{
    struct reconcile_batch *b = arg;

    b->result[i] = reconcile_stop_one(b->l, b->recs[i]);
}

static int reconcile_batch_alloc(struct reconcile_batch *b, struct lb_lend *l, size_t n,
                                 struct lb_error *err)
{
    b->l = l;
    b->recs = calloc(n + 1, sizeof(*b->recs));
    b->provs = calloc(n + 1, sizeof(*b->provs));
    b->result = calloc(n + 1, sizeof(*b->result));
    if (b->recs && b->provs && b->result)
        return 0;
    return lb_error_set(err, -ENOMEM, "out of memory");
}

static void reconcile_batch_free(struct reconcile_batch *b)
{
    free(b->recs);
    free(b->provs);
    free(b->result);
    memset(b, 0, sizeof(*b));
}

int sweeper_reconcile(struct lb_lend *l, size_t concurrency, struct lb_reconcile_stats *stats,
                      struct lb_error *err)
{
    struct lb_record_filter live = {.state = -1, .live_only = true};
    struct lb_record_filter pending = {.state = -1, .pending_stop_only = true};
    struct reconcile_batch b = {0};
    struct lb_record *recs = NULL;
    const char **vanished = NULL;
    size_t n = 0, n_vanished = 0, n_check = 0;
    struct lb_provider_caps caps;
    bool engine = false;
    json_t *found = NULL, *item;
    size_t idx;
    int r;

    memset(stats, 0, sizeof(*stats));
    /* 1. starting and lent records: adopt what runs, record what vanished */
    r = store_list_sandboxes(lend_store(l), &live, &recs, &n, err);
    if (r < 0)
        return r;
    vanished = calloc(n + 1, sizeof(*vanished));
    if (!vanished || reconcile_batch_alloc(&b, l, n, err) < 0) {
        free(vanished);
        reconcile_batch_free(&b);
        store_records_free(recs, n);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        struct lb_record *rec = &recs[i];
        struct lb_provider *prov;

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
        provider_caps(prov, &caps);
        engine |= caps.engine_creates;
        b.recs[n_check] = rec;
        b.provs[n_check++] = prov;
    }
    /* an engine's answer is a round trip: many at once; the local provider's is a little of
     * the daemon's own CPU (/proc, cgroupfs): one after another, as threads only contend */
    parallel_run(n_check, engine ? concurrency : 1, reconcile_check_one, &b);
    for (size_t i = 0; i < n_check; i++) {
        if (b.result[i] == CHECK_VANISHED)
            vanished[n_vanished++] = b.recs[i]->id;
        else if (b.result[i] == CHECK_STOP)
            reconcile_stop_record(l, b.recs[i], stats);
        else
            stats->adopted++;
    }
    reconcile_batch_free(&b);
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
    if (reconcile_batch_alloc(&b, l, n, err) < 0) {
        reconcile_batch_free(&b);
        store_records_free(recs, n);
        return -ENOMEM;
    }
    engine = false;
    for (size_t i = 0; i < n; i++) {
        struct lb_provider *prov = lend_provider_of(l, &recs[i], NULL);

        if (prov) {
            provider_caps(prov, &caps);
            engine |= caps.engine_creates;
        }
        b.recs[i] = &recs[i];
    }
    parallel_run(n, engine ? concurrency : 1, reconcile_stop_run, &b);
    for (size_t i = 0; i < n; i++) {
        if (b.result[i] == 0)
            stats->stopped++;
        else
            stats->failed++;
    }
    reconcile_batch_free(&b);
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
