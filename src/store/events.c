/*
 * events.c - the durable event feed (see store.h, "events"): the one place an event row is
 * written (store_append_event, inside the transaction of the state change it tells of), the
 * transaction helper the transitions run in, reading the feed, its retention and the hook that
 * wakes readers after a commit.
 *
 * Commit order is seq order, so a reader never sees a gap that a later read fills: the store is
 * one SQLite connection and every use of it happens under st->lock (store.c), and an event's
 * row is inserted and its transaction committed without letting go of that lock. seq comes
 * from AUTOINCREMENT inside that transaction, so when a reader (also under the lock) sees seq
 * N, every event with a smaller seq was committed before it; a transaction rolled back takes
 * its seq (and the sqlite_sequence update) with it, and the next event gets that number, which
 * no reader saw. Another process writing the same file is not supported (the state dir is the
 * daemon's own), and would be serialized by SQLite's write lock (BEGIN IMMEDIATE) anyway.
 */
#include "store/store_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "util/clock.h"
#include "util/fault.h"

/* Rows the retention deletes per statement; the lock is let go between batches. */
#define PRUNE_BATCH 5000
#define PRUNE_BATCHES_MAX 20 /* per store_events_prune call */

/* see store_internal.h */
void store_events_forget(struct lb_store *st)
{
    st->events_appended = false;
    st->n_notes = 0;
    st->notes_over = false;
}

/* Note whose event row seq is (sandbox_id, and its rsid as written) for the hook. Lock held. */
static void event_note(struct lb_store *st, const char *sandbox_id, int64_t seq)
{
    sqlite3_stmt *s = NULL;
    size_t i = st->n_notes;
    const char *rsid;

    st->events_appended = true;
    if (st->notes_over || i >= STORE_EVENT_NOTES || strlen(sandbox_id) >= LB_ID_MAX) {
        st->notes_over = true;
        return;
    }
    if (sqlite3_prepare_v2(st->db, "SELECT rsid FROM events WHERE seq = ?1", -1, &s, NULL) !=
            SQLITE_OK ||
        sqlite3_bind_int64(s, 1, seq) != SQLITE_OK || sqlite3_step(s) != SQLITE_ROW) {
        st->notes_over = true; /* not known: the hook wakes every reader */
        goto out;
    }
    rsid = (const char *)sqlite3_column_text(s, 0);
    if (rsid && strlen(rsid) > LB_EVENT_RSID_MAX) {
        st->notes_over = true;
        goto out;
    }
    snprintf(st->note_ids[i], sizeof(st->note_ids[i]), "%s", sandbox_id);
    st->notes[i].sandbox_id = st->note_ids[i];
    st->notes[i].rsid = NULL;
    if (rsid) {
        snprintf(st->note_rsids[i], sizeof(st->note_rsids[i]), "%s", rsid);
        st->notes[i].rsid = st->note_rsids[i];
    }
    st->n_notes = i + 1;
out:
    sqlite3_finalize(s);
}

int store_append_event(struct lb_store *st, const char *type, const char *sandbox_id,
                       const json_t *data, bool with_reason, struct lb_error *err)
{
    char *text = NULL;
    sqlite3_stmt *s;
    int ret = 0;

    if (!atomic_load(&st->events_on))
        return 0;
    if (data && !(text = json_dumps(data, JSON_COMPACT)))
        return lb_error_set(err, -ENOMEM, "out of memory");
    s = st->stmts[STMT_EVENT_INSERT];
    if (sqlite3_bind_int64(s, 1, clock_now_s()) != SQLITE_OK ||
        sqlite3_bind_text(s, 2, type, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_text(s, 3, text, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_int(s, 4, with_reason ? 1 : 0) != SQLITE_OK ||
        sqlite3_bind_text(s, 5, sandbox_id, -1, SQLITE_STATIC) != SQLITE_OK) {
        ret = store_db_fail(st, err, "binding an event");
        goto cleanup;
    }
    if (store_step_writing(st, s, false) != SQLITE_DONE)
        ret = store_db_fail(st, err, "writing an event");
    else if (sqlite3_changes(st->db) > 0)
        event_note(st, sandbox_id, sqlite3_last_insert_rowid(st->db));

cleanup:
    store_stmt_done(s);
    free(text);
    return ret;
}

/* After a commit: wake the feed's readers if the transaction wrote an event. Lock held. */
void store_events_after_commit(struct lb_store *st)
{
    if (!st->events_appended)
        return;
    if (st->event_hook)
        st->event_hook(st->event_hook_ctx, st->notes_over ? NULL : st->notes,
                       st->notes_over ? 0 : st->n_notes);
    store_events_forget(st);
}

int store_txn(struct lb_store *st, store_txn_fn fn, void *ctx, bool stop, bool sync_full,
              struct lb_error *err)
{
    int ret = 0;

    for (int attempt = 0; attempt < 2; attempt++) {
        store_events_forget(st);
        ret = store_exec_sql(st, "BEGIN IMMEDIATE", "beginning a transaction", err);
        if (ret == 0)
            ret = fn(st, ctx, err);
        if (ret >= 0) {
            if (sync_full)
                store_sync_full(st, true);
            int c = store_exec_sql(st, "COMMIT", "committing a transaction", err);
            if (sync_full)
                store_sync_full(st, false);
            if (c == 0) {
                atomic_store(&st->write_failed, false);
                store_events_after_commit(st);
                return ret;
            }
            ret = c;
        }
        if (!sqlite3_get_autocommit(st->db))
            sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
        store_events_forget(st);
        /* a stop's record may spend the space reserve, then runs once more */
        if (ret != -ENOSPC || !stop || attempt > 0 || !store_reserve_spend(st))
            break;
    }
    if (ret == -ENOSPC)
        atomic_store(&st->write_failed, true);
    return ret;
}

int store_txn_write(struct lb_store *st, store_txn_fn fn, void *ctx, bool stop, bool sync_full,
                    struct lb_error *err)
{
    int ret = fault_hit("store.write", 0, err);

    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    ret = store_txn(st, fn, ctx, stop, sync_full, err);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

struct record_event {
    const char *type, *id;
    const json_t *data;
};

static int record_event_fn(struct lb_store *st, void *ctx, struct lb_error *err)
{
    const struct record_event *e = ctx;

    return store_append_event(st, e->type, e->id, e->data, false, err);
}

int store_record_event(struct lb_store *st, const char *type, const char *sandbox_id,
                       const json_t *data, struct lb_error *err)
{
    struct record_event e = {type, sandbox_id, data};
    int ret;

    if (!type || !sandbox_id)
        return lb_error_set(err, -EINVAL, "store: an event needs a type and a sandbox");
    if (!atomic_load(&st->events_on))
        return 0;
    ret = store_txn_write(st, record_event_fn, &e, false, false, err);
    return ret;
}

void store_events_set_hook(struct lb_store *st,
                           void (*fn)(void *ctx, const struct lb_event_note *notes, size_t n),
                           void *ctx)
{
    pthread_mutex_lock(&st->lock);
    st->event_hook = fn;
    st->event_hook_ctx = ctx;
    pthread_mutex_unlock(&st->lock);
}

void store_events_configure(struct lb_store *st, bool enabled, int64_t max_age_s, int64_t max_count)
{
    pthread_mutex_lock(&st->lock);
    atomic_store(&st->events_on, enabled);
    st->events_max_age_s = max_age_s;
    st->events_max_count = max_count;
    pthread_mutex_unlock(&st->lock);
}

/* ---- reading ---- */

/* A JSON column parsed, or def (a new reference) when NULL or not JSON. */
static json_t *col_json(sqlite3_stmt *s, int col, json_t *(*def)(void))
{
    const char *t = (const char *)sqlite3_column_text(s, col);
    json_t *v = t ? json_loads(t, JSON_DECODE_ANY, NULL) : NULL;

    return v ? v : def();
}

static json_t *col_str(sqlite3_stmt *s, int col)
{
    const char *t = (const char *)sqlite3_column_text(s, col);

    return t ? json_string(t) : json_null();
}

/* The event of the current row: {"seq","time","type","sandbox_id","rsid","task_id","labels",
 * "data"}; NULL when out of memory. */
static json_t *event_from_row(sqlite3_stmt *s)
{
    char when[32];

    clock_format_rfc3339(sqlite3_column_int64(s, 1), when, sizeof(when));
    return json_pack("{s:I,s:s,s:o,s:o,s:o,s:o,s:o,s:o}", "seq",
                     (json_int_t)sqlite3_column_int64(s, 0), "time", when, "type", col_str(s, 2),
                     "sandbox_id", col_str(s, 3), "rsid", col_str(s, 4), "task_id", col_str(s, 5),
                     "labels", col_json(s, 6, json_object), "data", col_json(s, 7, json_object));
}

/* The seq of the newest event (0: none) into *out. Lock held. 0 or -1. */
static int store_events_newest_locked(struct lb_store *st, int64_t *out)
{
    sqlite3_stmt *s = NULL;
    int ret = -1;

    *out = 0;
    if (sqlite3_prepare_v3(st->db, "SELECT COALESCE(MAX(seq), 0) FROM events", -1,
                           SQLITE_PREPARE_PERSISTENT, &s, NULL) == SQLITE_OK &&
        sqlite3_step(s) == SQLITE_ROW) {
        *out = sqlite3_column_int64(s, 0);
        ret = 0;
    }
    sqlite3_finalize(s);
    return ret;
}

/* see store_internal.h */
const char *store_events_list_sql(const struct lb_event_filter *f)
{
#define EVENTS_SELECT                                                                              \
    "SELECT seq, time, type, sandbox_id, rsid, task_id, labels_json, data_json FROM events "
#define EVENTS_REST                                                                                \
    "AND (?4 IS NULL OR type IN (SELECT value FROM json_each(?4))) ORDER BY seq LIMIT ?5"
    /* the same bound parameters in each; a filter that names a session or a sandbox is an
     * equality the planner can take to its index ((rsid, seq), (sandbox_id, seq)), so a reader
     * whose filter matches nothing reads no row of anyone else's, however long the feed is */
    if (f->rsid)
        return EVENTS_SELECT
            "WHERE rsid = ?2 AND seq > ?1 AND (?3 IS NULL OR sandbox_id = ?3) " EVENTS_REST;
    if (f->sandbox_id)
        return EVENTS_SELECT "WHERE sandbox_id = ?3 AND seq > ?1 AND ?2 IS NULL " EVENTS_REST;
    return EVENTS_SELECT "WHERE seq > ?1 AND ?2 IS NULL AND ?3 IS NULL " EVENTS_REST;
#undef EVENTS_SELECT
#undef EVENTS_REST
}

int store_events_list(struct lb_store *st, const struct lb_event_filter *f, json_t **out,
                      int64_t *next, struct lb_error *err)
{
    return store_events_list_to(st, f, out, next, NULL, err);
}

int store_events_list_to(struct lb_store *st, const struct lb_event_filter *f, json_t **out,
                         int64_t *next, int64_t *read_to, struct lb_error *err)
{
    char *types = NULL;
    json_t *arr = json_array();
    sqlite3_stmt *s = NULL;
    int64_t last = f->since;
    int ret = 0, rc;

    *out = NULL;
    *next = f->since;
    if (!arr || (f->types && !(types = json_dumps(f->types, JSON_COMPACT)))) {
        ret = lb_error_set(err, -ENOMEM, "out of memory");
        goto cleanup;
    }
    pthread_mutex_lock(&st->lock);
    /* every filter is bound; a NULL one matches all (store_events_list_sql) */
    if (sqlite3_prepare_v3(st->db, store_events_list_sql(f), -1, SQLITE_PREPARE_PERSISTENT, &s,
                           NULL) != SQLITE_OK ||
        sqlite3_bind_int64(s, 1, f->since) != SQLITE_OK ||
        sqlite3_bind_text(s, 2, f->rsid, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_text(s, 3, f->sandbox_id, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_text(s, 4, types, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_int64(s, 5, f->limit > 0 ? f->limit : 1000) != SQLITE_OK) {
        ret = store_db_fail(st, err, "reading events");
        goto unlock;
    }
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        json_t *e = event_from_row(s);

        if (!e || json_array_append_new(arr, e) < 0) {
            ret = lb_error_set(err, -ENOMEM, "out of memory");
            goto unlock;
        }
        last = sqlite3_column_int64(s, 0);
    }
    if (rc != SQLITE_DONE)
        ret = store_db_fail(st, err, "reading events");
    /* fewer than limit matched: every event up to the newest was read (same lock) */
    if (ret == 0 && read_to) {
        int64_t limit = f->limit > 0 ? f->limit : 1000, newest = 0;

        *read_to = last;
        if ((int64_t)json_array_size(arr) < limit && store_events_newest_locked(st, &newest) == 0 &&
            newest > last)
            *read_to = newest;
    }
unlock:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->lock);
cleanup:
    free(types);
    if (ret < 0) {
        json_decref(arr);
        return ret;
    }
    *out = arr;
    *next = last;
    return 0;
}

/* ---- retention ---- */

/* Run one bounded DELETE (sql, with ?1 = a1 and ?2 = the batch): the rows it deleted, or < 0.
 * Takes the lock. */
static int prune_batch(struct lb_store *st, const char *sql, int64_t a1, struct lb_error *err)
{
    sqlite3_stmt *s = NULL;
    int ret;

    pthread_mutex_lock(&st->lock);
    if (sqlite3_prepare_v2(st->db, sql, -1, &s, NULL) != SQLITE_OK ||
        sqlite3_bind_int64(s, 1, a1) != SQLITE_OK ||
        sqlite3_bind_int64(s, 2, PRUNE_BATCH) != SQLITE_OK) {
        ret = store_db_fail(st, err, "pruning events");
        sqlite3_finalize(s);
        s = NULL;
    } else {
        ret = store_step_write(st, s, "pruning events", err);
    }
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

int store_events_prune(struct lb_store *st, int64_t now_s, struct lb_error *err)
{
    int64_t max_age, max_count;
    int total = 0, n = 0;

    pthread_mutex_lock(&st->lock);
    max_age = st->events_max_age_s;
    max_count = st->events_max_count;
    pthread_mutex_unlock(&st->lock);
    for (int i = 0; max_age > 0 && i < PRUNE_BATCHES_MAX; i++) {
        n = prune_batch(st,
                        "DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE time < ?1 "
                        "ORDER BY time LIMIT ?2)",
                        now_s - max_age, err);
        if (n < 0)
            return n;
        total += n;
        if (n < PRUNE_BATCH)
            break;
    }
    /* the newest max_count seqs stay: seqs have no holes but the ones pruned */
    for (int i = 0; max_count > 0 && i < PRUNE_BATCHES_MAX; i++) {
        n = prune_batch(st,
                        "DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE seq <= "
                        "(SELECT MAX(seq) FROM events) - ?1 ORDER BY seq LIMIT ?2)",
                        max_count, err);
        if (n < 0)
            return n;
        total += n;
        if (n < PRUNE_BATCH)
            break;
    }
    return total;
}
