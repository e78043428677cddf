/*
 * store_warm.c - the records of warm-pool sandboxes (src/warm/ is the pool itself): mark a
 * starting sandbox warm, claim a warm one for stopping, and take one for a lease in one
 * transaction.
 */
#include "store/store_internal.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include <sqlite3.h>

#include "util/clock.h"
#include "util/fault.h"

/* ---- warm pools ---- */

/* An ad-hoc UPDATE keyed by ?1 = id whose other parameters bind() sets; the number of rows it
 * changed (0 or 1), or < 0. Lock held. */
static int warm_update(struct lb_store *st, const char *sql, const char *id,
                       int (*bind)(sqlite3_stmt *, const void *), const void *ctx, bool stop,
                       const char *what, struct lb_error *err)
{
    sqlite3_stmt *s = NULL;
    int ret;

    if (sqlite3_prepare_v2(st->db, sql, -1, &s, NULL) != SQLITE_OK ||
        sqlite3_bind_text(s, 1, id, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
        (bind && bind(s, ctx) != SQLITE_OK)) {
        ret = store_db_fail(st, err, what);
        sqlite3_finalize(s);
        return ret;
    }
    ret = store_step_write_ex(st, s, stop, what, err);
    sqlite3_finalize(s);
    return ret;
}

/* A warm transition on its own: the store.write fault point, then warm_update under the lock.
 * 0; -EBUSY "sandbox <id> <busy>" when the row was not in the state sql asks for; or < 0. */
static int warm_transition(struct lb_store *st, const char *sql, const char *id,
                           int (*bind)(sqlite3_stmt *, const void *), const void *ctx, bool stop,
                           const char *what, const char *busy, struct lb_error *err)
{
    int ret = fault_hit("store.write", 0, err);

    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    ret = warm_update(st, sql, id, bind, ctx, stop, what, err);
    pthread_mutex_unlock(&st->lock);
    if (ret == 0)
        return lb_error_set(err, -EBUSY, "sandbox %s %s", id, busy);
    return ret < 0 ? ret : 0;
}

struct mark_warm_args {
    const char *descriptor_json;
    int64_t expires_at;
};

static int bind_mark_warm(sqlite3_stmt *s, const void *ctx)
{
    const struct mark_warm_args *a = ctx;
    int rc = sqlite3_bind_text(s, 2, a->descriptor_json, -1, SQLITE_TRANSIENT);

    if (rc == SQLITE_OK)
        rc = store_bind_time(s, 3, a->expires_at);
    return rc == SQLITE_OK ? sqlite3_bind_int64(s, 4, clock_now_s()) : rc;
}

int store_mark_warm(struct lb_store *st, const char *id, const char *descriptor_json,
                    int64_t expires_at, struct lb_error *err)
{
    struct mark_warm_args a = {descriptor_json, expires_at};

    return warm_transition(st,
                           "UPDATE sandboxes SET state = 'warm', descriptor_json = ?2, "
                           "expires_at = ?3, updated_at = ?4 WHERE id = ?1 AND state = 'starting'",
                           id, bind_mark_warm, &a, false, "marking a sandbox warm",
                           "is no longer starting", err);
}

struct hand_over_args {
    const char *old_id, *new_id;
    const json_t *usage;
    struct mark_warm_args warm;
};

static int hand_over_fn(struct lb_store *st, void *ctx, struct lb_error *err)
{
    const struct hand_over_args *a = ctx;
    int ret =
        warm_update(st,
                    "UPDATE sandboxes SET state = 'warm', descriptor_json = ?2, "
                    "expires_at = ?3, updated_at = ?4 WHERE id = ?1 AND state = 'starting'",
                    a->new_id, bind_mark_warm, &a->warm, false, "marking a sandbox warm", err);

    if (ret == 0)
        return lb_error_set(err, -EBUSY, "sandbox %s is no longer starting", a->new_id);
    if (ret < 0)
        return ret;
    return store_mark_stopped_in_txn(st, a->old_id, NULL, a->usage, err);
}

int store_hand_over(struct lb_store *st, const char *old_id, const json_t *usage,
                    const char *new_id, const char *descriptor_json, int64_t expires_at,
                    struct lb_error *err)
{
    struct hand_over_args a = {old_id, new_id, usage, {descriptor_json, expires_at}};

    return store_txn_write(st, hand_over_fn, &a, true, false, err);
}

static int bind_claim(sqlite3_stmt *s, const void *ctx)
{
    int rc = sqlite3_bind_text(s, 2, ctx, -1, SQLITE_TRANSIENT);

    return rc == SQLITE_OK ? sqlite3_bind_int64(s, 3, clock_now_s()) : rc;
}

int store_claim_warm(struct lb_store *st, const char *id, const char *reason, struct lb_error *err)
{
    return warm_transition(st,
                           "UPDATE sandboxes SET state = 'stopping', stop_reason = ?2, "
                           "updated_at = ?3 WHERE id = ?1 AND state = 'warm'",
                           id, bind_claim, reason, true, "claiming a warm sandbox", "is not warm",
                           err);
}

struct take_args {
    const struct lb_warm_take *t;
    const char *token_hash;
};

static int bind_take(sqlite3_stmt *s, const void *ctx)
{
    const struct take_args *a = ctx;
    int rc = sqlite3_bind_text(s, 2, a->t->rsid, -1, SQLITE_TRANSIENT);

    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(s, 3, a->t->task_id, -1, SQLITE_TRANSIENT);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(s, 4, a->t->spec_json, -1, SQLITE_TRANSIENT);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(s, 5, a->token_hash, -1, SQLITE_TRANSIENT);
    if (rc == SQLITE_OK)
        rc = store_bind_time(s, 6, a->t->expires_at);
    return rc == SQLITE_OK ? sqlite3_bind_int64(s, 7, clock_now_s()) : rc;
}

int store_take_warm(struct lb_store *st, const struct lb_warm_take *t, struct lb_record *out,
                    struct lb_error *err)
{
    char id[LB_ID_MAX] = "", hash[LB_TOKEN_HASH_HEX + 1];
    struct take_args a = {t, hash};
    sqlite3_stmt *s = NULL;
    bool in_txn = false;
    int ret, rc;

    memset(out, 0, sizeof(*out));
    if (!t || !t->pool_class || !t->token_hash)
        return lb_error_set(err, -EINVAL, "store: a warm take needs a class and a token");
    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    ret = store_exec_sql(st, "BEGIN IMMEDIATE", "beginning a warm take", err);
    if (ret < 0)
        goto cleanup;
    in_txn = true;
    if (sqlite3_prepare_v2(st->db,
                           "SELECT id FROM sandboxes WHERE state = 'warm' AND pool_class = ?1 AND "
                           "(expires_at IS NULL OR expires_at > ?2) "
                           "ORDER BY created_at, rowid LIMIT 1",
                           -1, &s, NULL) != SQLITE_OK ||
        sqlite3_bind_text(s, 1, t->pool_class, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
        sqlite3_bind_int64(s, 2, t->now_s) != SQLITE_OK) {
        ret = store_db_fail(st, err, "finding a warm sandbox");
        goto cleanup;
    }
    rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) {
        ret = -ENOENT; /* a miss: no message needed */
        goto cleanup;
    }
    if (rc != SQLITE_ROW) {
        ret = store_db_fail(st, err, "finding a warm sandbox");
        goto cleanup;
    }
    if (store_col_copy(s, 0, id, sizeof(id)) < 0) {
        ret = lb_error_set(err, -EIO, "store: a warm record has an over-long id");
        goto cleanup;
    }
    sqlite3_finalize(s);
    s = NULL;
    ret = t->token_hash(t->token_ctx, id, hash);
    if (ret < 0) {
        lb_error_set(err, ret, "cannot mint the operate token");
        goto cleanup;
    }
    ret = warm_update(st,
                      "UPDATE sandboxes SET state = 'lent', rsid = ?2, task_id = ?3, "
                      "spec_json = json_set(?4, '$.uses', "
                      "coalesce(json_extract(spec_json, '$.uses'), 0) + 1), token_hash = ?5, "
                      "expires_at = ?6, updated_at = ?7 "
                      "WHERE id = ?1 AND state = 'warm'",
                      id, bind_take, &a, false, "taking a warm sandbox", err);
    if (ret < 0 && (sqlite3_extended_errcode(st->db) == SQLITE_CONSTRAINT_UNIQUE))
        ret = lb_error_set(err, -EEXIST, "session %s already has a live sandbox", t->rsid);
    if (ret == 0)
        ret = lb_error_set(err, -EIO, "store: warm sandbox %s changed inside a transaction", id);
    if (ret == 1)
        ret = store_append_event(st, "seeded", id, NULL, false, err);
    if (ret < 0)
        goto cleanup;
    store_sync_full(st, true); /* the lease is durable before it is returned */
    ret = store_exec_sql(st, "COMMIT", "committing a warm take", err);
    store_sync_full(st, false);
    if (ret < 0)
        goto cleanup;
    in_txn = false;
    store_events_after_commit(st);
    ret = 0;
cleanup:
    sqlite3_finalize(s);
    if (in_txn) {
        sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
        store_events_forget(st);
    }
    pthread_mutex_unlock(&st->lock);
    if (ret == 0)
        ret = store_get_sandbox(st, id, out, err);
    return ret;
}

int store_count_recyclable(struct lb_store *st, const char *pool_class, int64_t max_uses,
                           int64_t *out, struct lb_error *err)
{
    return store_count_sql(st,
                           "SELECT COUNT(*) FROM sandboxes WHERE pool_class = ?1 AND (state = "
                           "'lent' OR (state = 'stopping' AND stop_reason = 'released')) AND "
                           "json_valid(spec_json) AND "
                           "coalesce(json_extract(spec_json, '$.uses'), 0) < ?2",
                           &pool_class, 1, &max_uses, "counting recyclable sandboxes", out, err);
}
