/*
 * store_snapshots.c - snapshots under way (see store.h): one row per capture, written before
 * the sandbox is frozen, removed once the image is named or discarded.
 */
#include "store/store_internal.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "util/fault.h"

int store_snapshot_begin(struct lb_store *st, const char *name, const char *sandbox_id,
                         bool was_paused, struct lb_error *err)
{
    sqlite3_stmt *s = NULL;
    int rc, ret = fault_hit("store.write", 0, err);

    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    if (sqlite3_prepare_v2(st->db,
                           "INSERT INTO snapshots (name, sandbox_id, state, was_paused, "
                           "created_at) VALUES (?1, ?2, 'capturing', ?3, ?4)",
                           -1, &s, NULL) != SQLITE_OK ||
        sqlite3_bind_text(s, 1, name, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
        sqlite3_bind_text(s, 2, sandbox_id, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
        sqlite3_bind_int(s, 3, was_paused ? 1 : 0) != SQLITE_OK ||
        sqlite3_bind_int64(s, 4, (sqlite3_int64)time(NULL)) != SQLITE_OK) {
        ret = store_db_fail(st, err, "recording a snapshot");
        goto out;
    }
    rc = store_step_writing(st, s, false);
    if ((rc & 0xff) == SQLITE_CONSTRAINT)
        ret = lb_error_set(err, -EEXIST, "a snapshot named '%s' is under way", name);
    else if (rc != SQLITE_DONE)
        ret = store_db_fail(st, err, "recording a snapshot");
out:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

struct snapshot_end_args {
    const char *name;
    bool done;
};

/* Forget snapshot name's row; done: first the "snapshot" event (data.name) of its sandbox. */
static int snapshot_end_fn(struct lb_store *st, void *ctx, struct lb_error *err)
{
    const struct snapshot_end_args *a = ctx;
    sqlite3_stmt *s = NULL;
    json_t *data = NULL;
    int ret = 0, rc;

    if (a->done) {
        if (sqlite3_prepare_v2(st->db, "SELECT sandbox_id FROM snapshots WHERE name = ?1", -1, &s,
                               NULL) != SQLITE_OK ||
            sqlite3_bind_text(s, 1, a->name, -1, SQLITE_TRANSIENT) != SQLITE_OK) {
            ret = store_db_fail(st, err, "reading a snapshot");
            goto out;
        }
        rc = sqlite3_step(s);
        if (rc == SQLITE_ROW) {
            data = json_pack("{s:s}", "name", a->name);
            ret = data ? store_append_event(st, "snapshot", (const char *)sqlite3_column_text(s, 0),
                                            data, false, err)
                       : lb_error_set(err, -ENOMEM, "out of memory");
        } else if (rc != SQLITE_DONE) {
            ret = store_db_fail(st, err, "reading a snapshot");
        }
        sqlite3_finalize(s);
        s = NULL;
        if (ret < 0)
            goto out;
    }
    if (sqlite3_prepare_v2(st->db, "DELETE FROM snapshots WHERE name = ?1", -1, &s, NULL) !=
            SQLITE_OK ||
        sqlite3_bind_text(s, 1, a->name, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
        store_step_writing(st, s, false) != SQLITE_DONE)
        ret = store_db_fail(st, err, "forgetting a snapshot");
out:
    sqlite3_finalize(s);
    json_decref(data);
    return ret;
}

static int snapshot_end(struct lb_store *st, const char *name, bool done, struct lb_error *err)
{
    struct snapshot_end_args a = {name, done};
    int ret;

    pthread_mutex_lock(&st->lock);
    ret = store_txn(st, snapshot_end_fn, &a, false, false, err);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

int store_snapshot_end(struct lb_store *st, const char *name, struct lb_error *err)
{
    return snapshot_end(st, name, false, err);
}

int store_snapshot_done(struct lb_store *st, const char *name, struct lb_error *err)
{
    return snapshot_end(st, name, true, err);
}

int store_snapshots_pending(struct lb_store *st, json_t **out, struct lb_error *err)
{
    sqlite3_stmt *s = NULL;
    json_t *arr = json_array();
    int rc, ret = 0;

    *out = NULL;
    if (!arr)
        return lb_error_set(err, -ENOMEM, "out of memory");
    pthread_mutex_lock(&st->lock);
    if (sqlite3_prepare_v2(st->db, "SELECT name, sandbox_id, was_paused FROM snapshots", -1, &s,
                           NULL) != SQLITE_OK) {
        ret = store_db_fail(st, err, "reading the snapshots under way");
        goto out;
    }
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        json_t *row = json_pack("{s:s,s:s,s:b}", "name", (const char *)sqlite3_column_text(s, 0),
                                "sandbox_id", (const char *)sqlite3_column_text(s, 1), "was_paused",
                                sqlite3_column_int(s, 2) != 0);

        if (!row || json_array_append_new(arr, row) < 0) {
            ret = lb_error_set(err, -ENOMEM, "out of memory");
            goto out;
        }
    }
    if (rc != SQLITE_DONE)
        ret = store_db_fail(st, err, "reading the snapshots under way");
out:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->lock);
    if (ret < 0)
        json_decref(arr);
    else
        *out = arr;
    return ret;
}
