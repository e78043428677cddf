/*
 * lost.c - lent sandboxes whose init died outside lendbox's control (killed from the host, the
 * OOM killer ending the init, a container removed behind lendbox's back). One rule, applied on
 * every operation's failure (lend_lost_check), on GET of a sandbox and by the sweeper
 * (lend_sweep_lost): the provider says the sandbox is gone (-LB_E_LOST, or its status is
 * "stopped" or "error") while its record still says lent. lendbox itself never ends a lent
 * sandbox's init without recording "stopping" first, so that is a loss: the sandbox is stopped with
 * reason "lost" (the provider's cleanup runs as for any stop), logged, and every operation on
 * it answers 410 sandbox_lost, also later, while its record says lost.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <string.h>

#include "util/log.h"
#include "util/metrics.h"

bool lend_record_is_lost(const struct lb_record *r)
{
    return r->state != LB_STATE_LENT && r->state != LB_STATE_STARTING && r->stop_reason &&
           strcmp(r->stop_reason, "lost") == 0;
}

int lend_lost_error(const char *id, struct lb_error *err)
{
    return lb_error_set(err, -LB_E_LOST,
                        "sandbox %s was lost: its init died outside lendbox's control, and it was "
                        "stopped with reason lost (seed the session again for a new one)",
                        id);
}

/* Does the provider of record r say its sandbox is gone: status "stopped" (no such sandbox,
 * or its init is dead), or "error" (an engine's container or instance that exited: its init
 * ended)? A provider that cannot tell (an error, an engine that is down) does not. */
static bool provider_says_gone(struct lb_lend *l, const struct lb_record *r)
{
    json_t *desc = r->descriptor_json ? json_loads(r->descriptor_json, 0, NULL) : NULL;
    struct lb_sandbox_ref ref = {r->id, desc};
    struct lb_provider *prov = lend_provider_of(l, r, NULL);
    enum lb_sandbox_status st;
    bool gone = prov && provider_status(prov, &ref, &st, NULL) == 0 &&
                (st == LB_STATUS_STOPPED || st == LB_STATUS_ERROR);

    json_decref(desc);
    return gone;
}

/* Do records a and b of one sandbox name different sandboxes of the provider (a reset made it
 * again between the two reads)? */
static bool descriptor_changed(const struct lb_record *a, const struct lb_record *b)
{
    if (!a->descriptor_json || !b->descriptor_json)
        return !a->descriptor_json != !b->descriptor_json;
    return strcmp(a->descriptor_json, b->descriptor_json) != 0;
}

/* The provider says sandbox id is gone: re-read its record under its session's lock (taken
 * only if free: its holder, a release or a seed, may be what ended it) and, while it still
 * says lent, stop it with reason lost. Returns true when the record says lost afterwards (or
 * still says lent because the lock was busy: the sweeper records it later). */
static bool lost_confirm(struct lb_lend *l, const struct lb_record *seen, const char *how)
{
    struct lend_session_lock *lock = NULL;
    struct lb_record cur = {0};
    bool locked = !seen->rsid || lend_session_lock(l, seen->rsid, true, &lock, NULL) == 0;
    bool lost = false;

    if (store_get_sandbox(l->store, seen->id, &cur, NULL) < 0)
        goto out;
    if (cur.state == LB_STATE_LENT && lend_record_resetting(&cur))
        goto out; /* a reset tears it down and makes it again: not lost (a crashed reset is
                     the start-up's) */
    /* seen may be older than a reset that made it again since (a sandbox of no session is
     * reset under no lock of ours): its dead init was the old one; ask about the one the record
     * names now */
    if (cur.state == LB_STATE_LENT && descriptor_changed(seen, &cur) &&
        !provider_says_gone(l, &cur))
        goto out;
    if (cur.state == LB_STATE_LENT && locked) {
        log_warn_sbx(cur.id,
                     "sandbox %s was lost (%s): its init died outside lendbox's control; "
                     "stopping it, reason lost",
                     cur.id, how);
        metrics_add(LB_M_SANDBOXES_LOST, 1);
        /* a failed stop keeps the reason and is retried by the sweeper */
        (void)lend_stop_record(l, &cur, "lost", LB_STATE_STOP_FAILED, NULL);
        lost = true;
    } else {
        lost = cur.state == LB_STATE_LENT || lend_record_is_lost(&cur);
    }
out:
    store_record_release(&cur);
    lend_session_unlock(l, lock);
    return lost;
}

int lend_lost_check(struct lb_lend *l, const char *id, int r, struct lb_error *err)
{
    struct lb_record rec = {0};

    if (r != -LB_E_LOST && r != -ENOENT && r != -EREMOTEIO)
        return r;
    if (store_get_sandbox(l->store, id, &rec, NULL) < 0)
        goto out;
    if (lend_record_is_lost(&rec)) {
        r = lend_lost_error(id, err);
        goto out;
    }
    if (rec.state != LB_STATE_LENT) {
        /* lendbox is stopping it (a release, a TTL): not a loss */
        if (r == -LB_E_LOST)
            r = lb_error_set(err, -ENOENT, "sandbox %s is not running (state %s)", id,
                             store_state_name(rec.state));
        goto out;
    }
    /* a missing file is -ENOENT too: only the provider's status tells the two apart */
    if (provider_says_gone(l, &rec) && lost_confirm(l, &rec, "found by an operation"))
        r = lend_lost_error(id, err);
    else if (r == -LB_E_LOST)
        r = lb_error_set(err, -EREMOTEIO, "sandbox %s: its provider answered both gone and running",
                         id);
out:
    store_record_release(&rec);
    return r;
}

int lend_note_gone(struct lb_lend *l, const struct lb_record *r)
{
    return r->state == LB_STATE_LENT && lost_confirm(l, r, "its status is stopped") ? -LB_E_LOST
                                                                                    : 0;
}

int lend_sweep_lost(struct lb_lend *l)
{
    struct lb_record_filter f = {.state = LB_STATE_LENT};
    struct lb_record *recs = NULL;
    size_t n = 0;
    int found = 0;

    if (store_list_sandboxes(l->store, &f, &recs, &n, NULL) < 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (provider_says_gone(l, &recs[i]) && lost_confirm(l, &recs[i], "found by the sweeper"))
            found++;
    store_records_free(recs, n);
    return found;
}
