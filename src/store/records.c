/*
 * records.c - sandbox records: their states' names, reading a row, inserting, looking up,
 * listing and counting records, the per-transition updates (lent, descriptor, stopping,
 * stopped, stop failed), the image counts and the purge of old stopped records.
 */
#include "store/store_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "util/clock.h"
#include "util/fault.h"
#include "util/mem.h"

static const char *const state_names[] = {
    [LB_STATE_STARTING] = "starting",
    [LB_STATE_LENT] = "lent",
    [LB_STATE_STOPPING] = "stopping",
    [LB_STATE_STOPPED] = "stopped",
    [LB_STATE_FAILED_SEED] = "failed_seed",
    [LB_STATE_STOP_FAILED] = "stop_failed",
    [LB_STATE_WARM] = "warm",
};
_Static_assert(ARRAY_LEN(state_names) == LB_STATE_COUNT, "store_count_by_state's array");

const char *store_state_name(enum lb_record_state s)
{
    if ((unsigned)s >= ARRAY_LEN(state_names))
        return "unknown";
    return state_names[s];
}

int store_state_parse(const char *name, enum lb_record_state *out)
{
    if (!name)
        return -EINVAL;
    for (size_t i = 0; i < ARRAY_LEN(state_names); i++) {
        if (strcmp(name, state_names[i]) == 0) {
            *out = (enum lb_record_state)i;
            return 0;
        }
    }
    return -EINVAL;
}

static int64_t col_time(sqlite3_stmt *s, int col)
{
    return sqlite3_column_type(s, col) == SQLITE_NULL ? 0 : sqlite3_column_int64(s, col);
}

/* Fill *out (zeroed first) from the current row. On failure *out holds nothing. */
static int record_from_row(sqlite3_stmt *s, struct lb_record *out, struct lb_error *err)
{
    const char *state = (const char *)sqlite3_column_text(s, COL_STATE);
    int ret;

    memset(out, 0, sizeof(*out));
    ret = store_col_copy(s, COL_ID, out->id, sizeof(out->id));
    if (ret == 0)
        ret = store_col_copy(s, COL_TOKEN_HASH, out->token_hash, sizeof(out->token_hash));
    if (ret == -EIO) {
        lb_error_set(err, -EIO, "store: a record has an over-long id or token hash");
        goto cleanup;
    }
    if (ret == 0 && store_state_parse(state, &out->state) < 0) {
        ret = lb_error_set(err, -EIO, "store: record %s has unknown state '%s'", out->id,
                           state ? state : "(null)");
        goto cleanup;
    }
    if (ret == 0)
        ret = store_col_dup(s, COL_RSID, &out->rsid);
    if (ret == 0)
        ret = store_col_dup(s, COL_TASK_ID, &out->task_id);
    if (ret == 0)
        ret = store_col_dup(s, COL_PROVIDER, &out->provider);
    if (ret == 0)
        ret = store_col_dup(s, COL_SPEC, &out->spec_json);
    if (ret == 0)
        ret = store_col_dup(s, COL_DESCRIPTOR, &out->descriptor_json);
    if (ret == 0)
        ret = store_col_dup(s, COL_LAST_ERROR, &out->last_error);
    if (ret == 0)
        ret = store_col_dup(s, COL_STOP_REASON, &out->stop_reason);
    if (ret == 0)
        ret = store_col_dup(s, COL_POOL_CLASS, &out->pool_class);
    if (ret < 0) {
        lb_error_set(err, ret, "store: out of memory reading a record");
        goto cleanup;
    }
    out->created_at = sqlite3_column_int64(s, COL_CREATED_AT);
    out->expires_at = col_time(s, COL_EXPIRES_AT);
    out->updated_at = sqlite3_column_int64(s, COL_UPDATED_AT);
    out->stop_attempts = sqlite3_column_int(s, COL_STOP_ATTEMPTS);
    out->next_attempt_at = col_time(s, COL_NEXT_ATTEMPT_AT);
    return 0;

cleanup:
    store_record_release(out);
    memset(out, 0, sizeof(*out));
    return ret;
}

void store_record_release(struct lb_record *r)
{
    if (!r)
        return;
    char **const strings[] = {&r->rsid,        &r->task_id,         &r->provider,
                              &r->spec_json,   &r->descriptor_json, &r->last_error,
                              &r->stop_reason, &r->pool_class};

    mem_free_strings(strings, ARRAY_LEN(strings));
}

void store_records_free(struct lb_record *recs, size_t n)
{
    for (size_t i = 0; recs && i < n; i++)
        store_record_release(&recs[i]);
    free(recs);
}

/* ---- records ---- */

/* The checks of a new record; 0 or -EINVAL. */
static int insert_check(const struct lb_record *r, struct lb_error *err)
{
    if (!r || !r->id[0] || !store_fits(r->id, sizeof(r->id)))
        return lb_error_set(err, -EINVAL, "store: a record needs an id shorter than %d bytes",
                            LB_ID_MAX);
    if (!r->provider || !r->provider[0])
        return lb_error_set(err, -EINVAL, "store: record %s has no provider", r->id);
    if ((unsigned)r->state >= ARRAY_LEN(state_names))
        return lb_error_set(err, -EINVAL, "store: record %s has an invalid state %d", r->id,
                            (int)r->state);
    if (!store_fits(r->token_hash, sizeof(r->token_hash)) || r->stop_attempts < 0)
        return lb_error_set(err, -EINVAL, "store: record %s is malformed", r->id);
    return fault_hit("store.write", 0, err);
}

/* The insert itself, capped or not (see store_insert_sandbox). Lock held. */
static int insert_locked(struct lb_store *st, const struct lb_record *r, int64_t max_live,
                         struct lb_error *err)
{
    sqlite3_stmt *s = st->stmts[max_live > 0 ? STMT_INSERT_CAPPED : STMT_INSERT];
    int64_t now = clock_now_s();
    int ret = 0, rc;

    if (store_bind_text(s, 1, r->id) || store_bind_text(s, 2, r->rsid) ||
        store_bind_text(s, 3, r->task_id) || store_bind_text(s, 4, r->provider) ||
        store_bind_text(s, 5, state_names[r->state]) || store_bind_text(s, 6, r->spec_json) ||
        store_bind_text(s, 7, r->descriptor_json) ||
        store_bind_text(s, 8, r->token_hash[0] ? r->token_hash : NULL) ||
        sqlite3_bind_int64(s, 9, r->created_at ? r->created_at : now) ||
        store_bind_time(s, 10, r->expires_at) || sqlite3_bind_int64(s, 11, now) ||
        sqlite3_bind_int(s, 12, r->stop_attempts) || store_bind_time(s, 13, r->next_attempt_at) ||
        store_bind_text(s, 14, r->last_error) || store_bind_text(s, 15, r->stop_reason) ||
        store_bind_text(s, 16, r->pool_class) ||
        (max_live > 0 && sqlite3_bind_int64(s, 17, max_live))) {
        ret = store_db_fail(st, err, "binding an insert");
        goto cleanup;
    }
    rc = store_step_writing(st, s, false);
    if (rc == SQLITE_CONSTRAINT_PRIMARYKEY)
        ret = lb_error_set(err, -EEXIST, "sandbox %s already exists", r->id);
    else if (rc == SQLITE_CONSTRAINT_UNIQUE)
        ret = lb_error_set(err, -EEXIST, "resources session %s already has a live sandbox",
                           r->rsid ? r->rsid : "(none)");
    else if (rc != SQLITE_DONE)
        ret = store_db_fail(st, err, "inserting a sandbox record");
    else if (max_live > 0 && sqlite3_changes(st->db) == 0)
        ret = lb_error_set(err, -EUSERS, "max_sandboxes (%lld) reached", (long long)max_live);

cleanup:
    store_stmt_done(s);
    return ret;
}

/* A spent reserve is the stops': no new records until it is back. Lock held. */
static int insert_room(struct lb_store *st, struct lb_error *err)
{
    if (store_reserve_make(st) < 0)
        return lb_error_set(err, -ENOSPC,
                            "store: the file system of %s is full (its space reserve for stops "
                            "is spent); no new sandboxes until space returns",
                            st->path);
    return 0;
}

int store_insert_sandbox(struct lb_store *st, const struct lb_record *r, int64_t max_live,
                         struct lb_error *err)
{
    int ret = insert_check(r, err);

    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    ret = insert_room(st, err);
    if (ret == 0)
        ret = insert_locked(st, r, max_live, err);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

/* Claim the oldest warm record for stopping (state stopping, stop_reason reason); its id into
 * id. 1 if one was claimed, 0 if none is warm, or < 0. Lock held. */
static int claim_oldest_warm_locked(struct lb_store *st, const char *reason, char id[LB_ID_MAX],
                                    struct lb_error *err)
{
    sqlite3_stmt *s = NULL;
    int ret = 0, rc;

    if (sqlite3_prepare_v2(st->db,
                           "UPDATE sandboxes SET state = 'stopping', stop_reason = ?1, "
                           "updated_at = ?2 WHERE id = (SELECT id FROM sandboxes WHERE state = "
                           "'warm' ORDER BY created_at, rowid LIMIT 1) RETURNING id",
                           -1, &s, NULL) != SQLITE_OK ||
        sqlite3_bind_text(s, 1, reason, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
        sqlite3_bind_int64(s, 2, clock_now_s()) != SQLITE_OK) {
        ret = store_db_fail(st, err, "claiming the oldest warm sandbox");
        goto cleanup;
    }
    rc = store_step_writing(st, s, false);
    if (rc == SQLITE_ROW) {
        ret = store_col_copy(s, 0, id, LB_ID_MAX) < 0
                  ? lb_error_set(err, -EIO, "store: a warm record has an over-long id")
                  : 1;
        if (ret == 1 && sqlite3_step(s) != SQLITE_DONE)
            ret = store_db_fail(st, err, "claiming the oldest warm sandbox");
    } else if (rc != SQLITE_DONE) {
        ret = store_db_fail(st, err, "claiming the oldest warm sandbox");
    }
cleanup:
    sqlite3_finalize(s);
    return ret;
}

int store_insert_sandbox_evicting(struct lb_store *st, const struct lb_record *r, int64_t max_live,
                                  const char *reason, char evicted_id[LB_ID_MAX],
                                  struct lb_error *err)
{
    bool in_txn = false;
    int ret = insert_check(r, err);

    evicted_id[0] = '\0';
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    ret = insert_room(st, err);
    if (ret < 0)
        goto cleanup;
    ret = store_exec_sql(st, "BEGIN IMMEDIATE", "beginning an evicting insert", err);
    if (ret < 0)
        goto cleanup;
    in_txn = true;
    ret = insert_locked(st, r, max_live, err);
    if (ret == -EUSERS) {
        int claimed = claim_oldest_warm_locked(st, reason, evicted_id, err);

        if (claimed < 0) {
            ret = claimed;
        } else if (claimed == 1) {
            lb_error_clear(err);
            ret = insert_locked(st, r, max_live, err);
        }
    }
    if (ret < 0)
        goto cleanup;
    ret = store_exec_sql(st, "COMMIT", "committing an evicting insert", err);
    if (ret == 0)
        in_txn = false;
cleanup:
    if (in_txn) {
        sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
        evicted_id[0] = '\0';
    }
    pthread_mutex_unlock(&st->lock);
    return ret;
}

/* Run a one-row lookup keyed by one text parameter. */
static int get_one(struct lb_store *st, enum stmt_id id, const char *key, struct lb_record *out,
                   struct lb_error *err)
{
    sqlite3_stmt *s;
    int ret = 0, rc;

    pthread_mutex_lock(&st->lock);
    s = st->stmts[id];
    if (store_bind_text(s, 1, key)) {
        ret = store_db_fail(st, err, "binding a lookup");
        goto cleanup;
    }
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        ret = record_from_row(s, out, err);
    else if (rc == SQLITE_DONE)
        ret = -ENOENT; /* the caller words the message */
    else
        ret = store_db_fail(st, err, "reading a sandbox record");

cleanup:
    store_stmt_done(s);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

int store_get_sandbox(struct lb_store *st, const char *id, struct lb_record *out,
                      struct lb_error *err)
{
    int ret;

    memset(out, 0, sizeof(*out));
    if (!id)
        return lb_error_set(err, -EINVAL, "store: no sandbox id");
    ret = get_one(st, STMT_GET, id, out, err);
    if (ret == -ENOENT)
        lb_error_set(err, ret, "no sandbox %s", id);
    return ret;
}

bool store_sandbox_is_lent(struct lb_store *st, const char *id)
{
    struct lb_record rec = {0};
    bool lent = store_get_sandbox(st, id, &rec, NULL) == 0 && rec.state == LB_STATE_LENT;

    store_record_release(&rec);
    return lent;
}

int store_get_live_by_rsid(struct lb_store *st, const char *rsid, struct lb_record *out,
                           struct lb_error *err)
{
    int ret;

    memset(out, 0, sizeof(*out));
    if (!rsid)
        return lb_error_set(err, -EINVAL, "store: no resources session id");
    ret = get_one(st, STMT_GET_LIVE, rsid, out, err);
    if (ret == -ENOENT)
        lb_error_set(err, ret, "resources session %s has no live sandbox", rsid);
    return ret;
}

int store_get_by_token_hash(struct lb_store *st, const char *token_hash, struct lb_record *out,
                            struct lb_error *err)
{
    int ret = -ENOENT;

    memset(out, 0, sizeof(*out));
    if (!token_hash)
        return lb_error_set(err, -EINVAL, "store: no token hash");
    if (token_hash[0])
        ret = get_one(st, STMT_GET_TOKEN, token_hash, out, err);
    if (ret == -ENOENT)
        lb_error_set(err, ret, "no sandbox has that operate token");
    return ret;
}

/* Append a constant SQL fragment (never a value) to buf. */
static int sql_append(char *buf, size_t cap, size_t *len, const char *frag)
{
    size_t n = strlen(frag);

    if (*len + n >= cap)
        return -EOVERFLOW;
    memcpy(buf + *len, frag, n + 1);
    *len += n;
    return 0;
}

int store_list_sandboxes(struct lb_store *st, const struct lb_record_filter *f,
                         struct lb_record **out, size_t *n_out, struct lb_error *err)
{
    static const struct lb_record_filter all = {.state = -1};
    struct lb_record *recs = NULL, *grown;
    size_t n = 0, cap = 0, len = 0;
    sqlite3_stmt *s = NULL;
    char sql[1024];
    int ret = 0, rc;

    *out = NULL;
    *n_out = 0;
    if (!f)
        f = &all;
    if (f->state < -1 || f->state >= (int)ARRAY_LEN(state_names))
        return lb_error_set(err, -EINVAL, "store: invalid state filter %d", f->state);

    /* Parameters keep fixed numbers (?1 rsid, ?2 state, ?3 now, ?4 limit) whichever appear. */
    ret = sql_append(sql, sizeof(sql), &len, "SELECT " RECORD_COLUMNS " FROM sandboxes WHERE 1");
    if (ret == 0 && f->rsid)
        ret = sql_append(sql, sizeof(sql), &len, " AND rsid = ?1");
    if (ret == 0 && f->state >= 0)
        ret = sql_append(sql, sizeof(sql), &len, " AND state = ?2");
    if (ret == 0 && f->live_only)
        ret = sql_append(sql, sizeof(sql), &len, " AND state IN ('starting', 'lent', 'warm')");
    if (ret == 0 && f->pending_stop_only)
        ret = sql_append(sql, sizeof(sql), &len,
                         " AND state IN ('stopping', 'failed_seed', 'stop_failed')");
    /* No retry scheduled (NULL) counts as due: a stop interrupted by a crash is retried now. */
    if (ret == 0 && f->due_only)
        ret = sql_append(sql, sizeof(sql), &len,
                         " AND (next_attempt_at IS NULL OR next_attempt_at <= ?3)");
    if (ret == 0 && f->expired_only)
        ret = sql_append(sql, sizeof(sql), &len,
                         " AND state IN ('lent', 'warm') AND expires_at > 0 AND "
                         "expires_at <= ?3");
    if (ret == 0)
        ret = sql_append(sql, sizeof(sql), &len, " ORDER BY created_at, rowid");
    if (ret == 0 && f->limit)
        ret = sql_append(sql, sizeof(sql), &len, " LIMIT ?4");
    if (ret < 0)
        return lb_error_set(err, ret, "store: list query too long");

    pthread_mutex_lock(&st->lock);
    if (sqlite3_prepare_v2(st->db, sql, -1, &s, NULL) != SQLITE_OK) {
        ret = store_db_fail(st, err, "preparing a list query");
        goto cleanup;
    }
    if ((f->rsid && store_bind_text(s, 1, f->rsid)) ||
        (f->state >= 0 && store_bind_text(s, 2, state_names[f->state])) ||
        ((f->due_only || f->expired_only) && sqlite3_bind_int64(s, 3, f->now_s)) ||
        (f->limit &&
         sqlite3_bind_int64(s, 4, f->limit > INT64_MAX ? INT64_MAX : (int64_t)f->limit))) {
        ret = store_db_fail(st, err, "binding a list query");
        goto cleanup;
    }
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            grown = realloc(recs, cap * sizeof(*recs));
            if (!grown) {
                ret = lb_error_set(err, -ENOMEM, "store: out of memory listing records");
                goto cleanup;
            }
            recs = grown;
        }
        ret = record_from_row(s, &recs[n], err);
        if (ret < 0)
            goto cleanup;
        n++;
    }
    if (rc != SQLITE_DONE) {
        ret = store_db_fail(st, err, "listing sandbox records");
        goto cleanup;
    }
    *out = recs;
    *n_out = n;
    recs = NULL;
    n = 0;

cleanup:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->lock);
    store_records_free(recs, n);
    return ret;
}

/* The state of record id into *out: 0, -ENOENT, or < 0. Lock held. */
static int state_of_locked(struct lb_store *st, const char *id, enum lb_record_state *out,
                           struct lb_error *err)
{
    sqlite3_stmt *s = st->stmts[STMT_STATE_OF];
    const char *state;
    int ret;

    if (store_bind_text(s, 1, id)) {
        ret = store_db_fail(st, err, "binding a state lookup");
    } else {
        switch (sqlite3_step(s)) {
        case SQLITE_ROW:
            state = (const char *)sqlite3_column_text(s, 0);
            ret = store_state_parse(state, out) < 0
                      ? lb_error_set(err, -EIO, "store: record %s has unknown state '%s'", id,
                                     state ? state : "(null)")
                      : 0;
            break;
        case SQLITE_DONE:
            ret = lb_error_set(err, -ENOENT, "no sandbox %s", id);
            break;
        default:
            ret = store_db_fail(st, err, "reading a sandbox state");
            break;
        }
    }
    store_stmt_done(s);
    return ret;
}

struct mark_lent_args {
    const char *id, *descriptor_json, *token_hash;
    bool durable;
};

/* starting -> lent and the "seeded" event, in one transaction. A lease lent without its own
 * sync is counted here, under the lock its commit holds: whoever reads the row lent afterwards
 * and then asks store_sync (which reads the count under that lock) finds it counted; a commit
 * that fails after the count only costs a later sync one more fsync. */
static int mark_lent_fn(struct lb_store *st, void *ctx, struct lb_error *err)
{
    const struct mark_lent_args *a = ctx;
    sqlite3_stmt *s = st->stmts[STMT_MARK_LENT];
    enum lb_record_state state;
    int ret;

    if (store_bind_text(s, 1, a->id) || store_bind_text(s, 2, a->descriptor_json) ||
        store_bind_text(s, 3, a->token_hash && a->token_hash[0] ? a->token_hash : NULL) ||
        sqlite3_bind_int64(s, 4, clock_now_s())) {
        ret = store_db_fail(st, err, "binding mark_lent");
        store_stmt_done(s);
        return ret;
    }
    ret = store_step_write(st, s, "marking a sandbox lent", err);
    if (ret > 0) {
        ret = store_append_event(st, "seeded", a->id, NULL, false, err);
        if (ret >= 0 && !a->durable)
            atomic_fetch_add(&st->unsynced_leases, 1);
        return ret;
    }
    if (ret < 0)
        return ret;
    /* Nothing changed: tell a missing record from one that is no longer starting. */
    ret = state_of_locked(st, a->id, &state, err);
    if (ret == 0)
        ret = lb_error_set(err, -EBUSY, "sandbox %s is %s, not starting", a->id,
                           store_state_name(state));
    return ret;
}

int store_mark_lent(struct lb_store *st, const char *id, const char *descriptor_json,
                    const char *token_hash, bool durable, struct lb_error *err)
{
    struct mark_lent_args a = {id, descriptor_json, token_hash, durable};
    int ret;

    if (!id)
        return lb_error_set(err, -EINVAL, "store: no sandbox id");
    if (token_hash && !store_fits(token_hash, LB_TOKEN_HASH_HEX + 1))
        return lb_error_set(err, -EINVAL, "store: token hash longer than %d characters",
                            LB_TOKEN_HASH_HEX);
    /* the commit that hands out the lease is made at synchronous = FULL (store_sync_full),
     * or the caller syncs a batch of them at once (store_sync) */
    ret = store_txn_write(st, mark_lent_fn, &a, false, durable, err);
    return ret < 0 ? ret : 0;
}

/* Finish an UPDATE keyed by id whose parameters are bound (bind_failed: they could not be). Call
 * with the lock held; resets the statement. */
static int finish_transition(struct lb_store *st, sqlite3_stmt *s, bool bind_failed, bool stop,
                             const char *id, const char *what, struct lb_error *err)
{
    int ret;

    if (bind_failed) {
        ret = store_db_fail(st, err, what);
        store_stmt_done(s);
    } else {
        ret = store_step_write_ex(st, s, stop, what, err);
        if (ret == 0)
            ret = lb_error_set(err, -ENOENT, "no sandbox %s", id);
    }
    return ret < 0 ? ret : 0;
}

/* The transitions that set one text column and the time of a sandbox's row: the UPDATE at
 * stmts[stmt] bound to (id, text, now), finished by finish_transition. */
static int update_text_now(struct lb_store *st, enum stmt_id stmt, const char *id, const char *text,
                           bool stop, const char *what, struct lb_error *err)
{
    sqlite3_stmt *s;
    bool bad;
    int ret;

    if (!id)
        return lb_error_set(err, -EINVAL, "store: no sandbox id");
    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    s = st->stmts[stmt];
    bad = store_bind_text(s, 1, id) || store_bind_text(s, 2, text) ||
          sqlite3_bind_int64(s, 3, clock_now_s());
    ret = finish_transition(st, s, bad, stop, id, what, err);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

int store_set_descriptor(struct lb_store *st, const char *id, const char *descriptor_json,
                         struct lb_error *err)
{
    return update_text_now(st, STMT_SET_DESCRIPTOR, id, descriptor_json, false,
                           "storing a descriptor", err);
}

struct set_expires_args {
    const char *id;
    int64_t expires_at;
};

/* A renewal and its "renewed" event (data.expires_at), in one transaction. */
static int set_expires_fn(struct lb_store *st, void *ctx, struct lb_error *err)
{
    const struct set_expires_args *a = ctx;
    sqlite3_stmt *s = st->stmts[STMT_SET_EXPIRES];
    char when[32];
    json_t *data;
    bool bad;
    int ret;

    bad = store_bind_text(s, 1, a->id) || sqlite3_bind_int64(s, 2, a->expires_at) ||
          sqlite3_bind_int64(s, 3, clock_now_s());
    ret = finish_transition(st, s, bad, false, a->id, "renewing a sandbox", err);
    if (ret < 0)
        return ret;
    clock_format_rfc3339(a->expires_at, when, sizeof(when));
    data = json_pack("{s:s}", "expires_at", when);
    ret = data ? store_append_event(st, "renewed", a->id, data, false, err)
               : lb_error_set(err, -ENOMEM, "out of memory");
    json_decref(data);
    return ret;
}

int store_set_expires(struct lb_store *st, const char *id, int64_t expires_at, struct lb_error *err)
{
    struct set_expires_args a = {id, expires_at};
    int ret;

    if (!id || expires_at <= 0)
        return lb_error_set(err, -EINVAL, "store: no sandbox id or no expiry");
    ret = store_txn_write(st, set_expires_fn, &a, false, false, err);
    return ret;
}

struct stop_args {
    const char *id, *reason;
    const json_t *usage;
};

/* -> stopping, and the "lost" event when the reason is lost (the record turns lost here). */
static int mark_stopping_fn(struct lb_store *st, void *ctx, struct lb_error *err)
{
    const struct stop_args *a = ctx;
    sqlite3_stmt *s = st->stmts[STMT_MARK_STOPPING];
    bool bad = store_bind_text(s, 1, a->id) || store_bind_text(s, 2, a->reason) ||
               sqlite3_bind_int64(s, 3, clock_now_s());
    int ret = finish_transition(st, s, bad, false, a->id, "marking a sandbox stopping", err);

    if (ret == 0 && a->reason && strcmp(a->reason, "lost") == 0)
        ret = store_append_event(st, "lost", a->id, NULL, false, err);
    return ret;
}

/* -> stopped, and its "stopped" event (data.reason, data.usage) unless it was stopped already.
 * Lock held, inside a transaction. */
static int mark_stopped_locked(struct lb_store *st, const struct stop_args *a, const char *what,
                               struct lb_error *err)
{
    sqlite3_stmt *s = st->stmts[STMT_MARK_STOPPED];
    enum lb_record_state before;
    json_t *data;
    bool bad;
    int ret = state_of_locked(st, a->id, &before, err);

    if (ret < 0)
        return ret;
    bad = store_bind_text(s, 1, a->id) || store_bind_text(s, 2, a->reason) ||
          sqlite3_bind_int64(s, 3, clock_now_s());
    ret = finish_transition(st, s, bad, false, a->id, what, err);
    if (ret < 0 || before == LB_STATE_STOPPED)
        return ret;
    data = json_pack("{s:O}", "usage", a->usage ? (json_t *)a->usage : json_null());
    ret = data ? store_append_event(st, "stopped", a->id, data, true, err)
               : lb_error_set(err, -ENOMEM, "out of memory");
    json_decref(data);
    return ret;
}

static int mark_stopped_fn(struct lb_store *st, void *ctx, struct lb_error *err)
{
    return mark_stopped_locked(st, ctx, "marking a sandbox stopped", err);
}

/* see store_internal.h */
int store_mark_stopped_in_txn(struct lb_store *st, const char *id, const char *reason,
                              const json_t *usage, struct lb_error *err)
{
    struct stop_args a = {id, reason, usage};

    return mark_stopped_locked(st, &a, "marking a sandbox stopped", err);
}

/* One stop transition (fn) of record id in its own transaction: a stop's record (the space
 * reserve may be spent). */
static int stop_transition(struct lb_store *st, store_txn_fn fn, const struct stop_args *a,
                           struct lb_error *err)
{
    int ret;

    if (!a->id)
        return lb_error_set(err, -EINVAL, "store: no sandbox id");
    ret = store_txn_write(st, fn, (void *)a, true, false, err);
    return ret;
}

int store_mark_stopping(struct lb_store *st, const char *id, const char *reason,
                        struct lb_error *err)
{
    struct stop_args a = {id, reason, NULL};

    return stop_transition(st, mark_stopping_fn, &a, err);
}

int store_mark_stopped(struct lb_store *st, const char *id, const char *reason,
                       struct lb_error *err)
{
    return store_mark_stopped_usage(st, id, reason, NULL, err);
}

int store_mark_stopped_usage(struct lb_store *st, const char *id, const char *reason,
                             const json_t *usage, struct lb_error *err)
{
    struct stop_args a = {id, reason, usage};

    return stop_transition(st, mark_stopped_fn, &a, err);
}

/* One transition (the UPDATE at stmts[stmt], bound to (id, reason, now)) of n records in one
 * transaction: all or none. reasons[i] (reasons may be NULL) before reason. stopped: the
 * transition to stopped, with its events (mark_stopped_locked). A batch that finds the disk
 * full is rolled back, spends the reserve and runs once more (stops' records). */
struct many_args {
    enum stmt_id stmt;
    const char *const *ids, *const *reasons;
    const char *reason, *what;
    size_t n;
};

static int update_many_fn(struct lb_store *st, void *ctx, struct lb_error *err)
{
    const struct many_args *a = ctx;
    sqlite3_stmt *s = st->stmts[a->stmt];
    int ret = 0;

    for (size_t i = 0; ret == 0 && i < a->n; i++) {
        const char *why = a->reasons && a->reasons[i] ? a->reasons[i] : a->reason;

        if (a->stmt == STMT_MARK_STOPPED) {
            struct stop_args one = {a->ids[i], why, NULL};

            ret = mark_stopped_locked(st, &one, a->what, err);
        } else {
            bool bad = store_bind_text(s, 1, a->ids[i]) || store_bind_text(s, 2, why) ||
                       sqlite3_bind_int64(s, 3, clock_now_s());

            ret = finish_transition(st, s, bad, false, a->ids[i], a->what, err);
        }
    }
    return ret;
}

static int update_many(struct lb_store *st, enum stmt_id stmt, const char *const *ids,
                       const char *const *reasons, const char *reason, size_t n, const char *what,
                       struct lb_error *err)
{
    struct many_args a = {stmt, ids, reasons, reason, what, n};
    int ret;

    if (n == 0)
        return 0;
    ret = store_txn_write(st, update_many_fn, &a, true, false, err);
    return ret;
}

int store_mark_stopped_many(struct lb_store *st, const char *const *ids, size_t n,
                            const char *reason, struct lb_error *err)
{
    return update_many(st, STMT_MARK_STOPPED, ids, NULL, reason, n, "marking sandboxes stopped",
                       err);
}

int store_mark_stopping_many(struct lb_store *st, const char *const *ids,
                             const char *const *reasons, size_t n, struct lb_error *err)
{
    return update_many(st, STMT_MARK_STOPPING, ids, reasons, NULL, n, "marking sandboxes stopping",
                       err);
}

struct stop_failed_args {
    const char *id, *last_error;
    enum lb_record_state state;
    int64_t next_attempt_at;
};

/* A failed stop and its "stop_failed" event (data.state, data.error), in one transaction. */
static int stop_failed_fn(struct lb_store *st, void *ctx, struct lb_error *err)
{
    const struct stop_failed_args *a = ctx;
    sqlite3_stmt *s = st->stmts[STMT_MARK_STOP_FAILED];
    json_t *data;
    bool bad;
    int ret;

    bad = store_bind_text(s, 1, a->id) || store_bind_text(s, 2, state_names[a->state]) ||
          store_bind_text(s, 3, a->last_error) || store_bind_time(s, 4, a->next_attempt_at) ||
          sqlite3_bind_int64(s, 5, clock_now_s());
    ret = finish_transition(st, s, bad, false, a->id, "recording a failed stop", err);
    if (ret < 0)
        return ret;
    data = json_pack("{s:s,s:s?}", "state", state_names[a->state], "error", a->last_error);
    ret = data ? store_append_event(st, "stop_failed", a->id, data, false, err)
               : lb_error_set(err, -ENOMEM, "out of memory");
    json_decref(data);
    return ret;
}

int store_mark_stop_failed(struct lb_store *st, const char *id, enum lb_record_state state,
                           const char *last_error, int64_t next_attempt_at, struct lb_error *err)
{
    struct stop_failed_args a = {id, last_error, state, next_attempt_at};
    int ret;

    if (!id)
        return lb_error_set(err, -EINVAL, "store: no sandbox id");
    if (state != LB_STATE_FAILED_SEED && state != LB_STATE_STOP_FAILED)
        return lb_error_set(err, -EINVAL,
                            "store: a failed stop leaves failed_seed or "
                            "stop_failed, not %s",
                            store_state_name(state));
    ret = store_txn_write(st, stop_failed_fn, &a, true, false, err);
    return ret;
}

int store_count_by_state(struct lb_store *st, int64_t counts[LB_STATE_COUNT], struct lb_error *err)
{
    enum lb_record_state state;
    sqlite3_stmt *s;
    const char *name;
    int ret = 0, rc;

    memset(counts, 0, LB_STATE_COUNT * sizeof(counts[0]));
    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_COUNT];
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        name = (const char *)sqlite3_column_text(s, 0);
        if (store_state_parse(name, &state) < 0) {
            ret = lb_error_set(err, -EIO, "store: records in unknown state '%s'",
                               name ? name : "(null)");
            goto cleanup;
        }
        counts[state] = sqlite3_column_int64(s, 1);
    }
    if (rc != SQLITE_DONE)
        ret = store_db_fail(st, err, "counting sandbox records");

cleanup:
    store_stmt_done(s);
    pthread_mutex_unlock(&st->lock);
    if (ret < 0)
        memset(counts, 0, LB_STATE_COUNT * sizeof(counts[0]));
    return ret;
}

int store_count_live(struct lb_store *st, int64_t *out, struct lb_error *err)
{
    sqlite3_stmt *s;
    int ret = 0;

    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_COUNT_LIVE];
    if (sqlite3_step(s) == SQLITE_ROW)
        *out = sqlite3_column_int64(s, 0);
    else
        ret = store_db_fail(st, err, "counting live sandboxes");
    store_stmt_done(s);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

int store_count_by_member(struct lb_store *st, struct lb_member_count *out, size_t max,
                          size_t *n_out, struct lb_error *err)
{
    sqlite3_stmt *s = NULL;
    size_t n = 0;
    int ret = 0, rc = SQLITE_DONE;

    *n_out = 0;
    pthread_mutex_lock(&st->lock);
    if (sqlite3_prepare_v2(st->db,
                           "SELECT provider, m, COUNT(*) FROM (SELECT provider, "
                           "json_extract(descriptor_json, '$.location') AS m FROM sandboxes "
                           "WHERE state IN ('starting', 'lent', 'stopping', 'stop_failed', "
                           "'warm') AND json_valid(descriptor_json)) "
                           "WHERE typeof(m) = 'text' AND m != '' "
                           "GROUP BY provider, m ORDER BY provider, m",
                           -1, &s, NULL) != SQLITE_OK) {
        ret = store_db_fail(st, err, "counting sandboxes by member");
        goto out;
    }
    while (n < max && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        snprintf(out[n].provider, sizeof(out[n].provider), "%s",
                 (const char *)sqlite3_column_text(s, 0) ?: "");
        snprintf(out[n].member, sizeof(out[n].member), "%s",
                 (const char *)sqlite3_column_text(s, 1) ?: "");
        out[n].count = sqlite3_column_int64(s, 2);
        n++;
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        ret = store_db_fail(st, err, "counting sandboxes by member");
    else
        *n_out = n;
out:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

/* The number of live (and warm) records whose spec's JSON field at path equals value. */
static int count_live_by_spec(struct lb_store *st, const char *path, const char *path2,
                              const char *value, const char *what, int64_t *out,
                              struct lb_error *err)
{
    const char *const texts[] = {value, path, path2};

    return store_count_sql(st,
                           "SELECT COUNT(*) FROM sandboxes WHERE state IN ('starting', 'lent', "
                           "'stopping', 'stop_failed', 'warm') AND json_valid(spec_json) AND "
                           "(json_extract(spec_json, ?2) = ?1 OR json_extract(spec_json, ?3) = ?1)",
                           texts, 3, NULL, what, out, err);
}

int store_count_using_image(struct lb_store *st, const char *image, int64_t *out,
                            struct lb_error *err)
{
    /* a reset sandbox runs its "image" now and returns to its "seed_image" on the next reset */
    return count_live_by_spec(st, "$.image", "$.seed_image", image,
                              "counting the sandboxes of an image", out, err);
}

int store_count_using_image_digest(struct lb_store *st, const char *digest, int64_t *out,
                                   struct lb_error *err)
{
    return count_live_by_spec(st, "$.image_digest", "$.seed_image_digest", digest,
                              "counting the sandboxes of an image digest", out, err);
}

int store_purge_stopped(struct lb_store *st, int64_t cutoff_s, struct lb_error *err)
{
    sqlite3_stmt *s;
    int ret;

    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_PURGE];
    if (sqlite3_bind_int64(s, 1, cutoff_s)) {
        ret = store_db_fail(st, err, "binding a purge");
        store_stmt_done(s);
    } else {
        ret = store_step_write(st, s, "purging stopped records", err);
    }
    pthread_mutex_unlock(&st->lock);
    return ret;
}
