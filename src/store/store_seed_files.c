/*
 * store_seed_files.c - a seed's files kept with its sandbox's record (see store.h), so that a
 * reset can write them again.
 */
#include "store/store_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sqlite3.h>

#include "util/fault.h"

int store_seed_files_put(struct lb_store *st, const char *sandbox_id,
                         const struct lb_store_file *files, size_t n, struct lb_error *err)
{
    sqlite3_stmt *del = NULL, *ins = NULL;
    bool began = false;
    int ret = fault_hit("store.write", 0, err);

    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    ret = store_exec_sql(st, "BEGIN IMMEDIATE", "keeping a seed's files", err);
    if (ret < 0)
        goto out;
    began = true;
    if (sqlite3_prepare_v2(st->db, "DELETE FROM seed_files WHERE sandbox_id = ?1", -1, &del,
                           NULL) != SQLITE_OK ||
        sqlite3_bind_text(del, 1, sandbox_id, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
        store_step_writing(st, del, false) != SQLITE_DONE ||
        sqlite3_prepare_v2(st->db,
                           "INSERT INTO seed_files (sandbox_id, idx, path, mode, data) "
                           "VALUES (?1, ?2, ?3, ?4, ?5)",
                           -1, &ins, NULL) != SQLITE_OK) {
        ret = store_db_fail(st, err, "keeping a seed's files");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        int rc;

        sqlite3_reset(ins);
        if (sqlite3_bind_text(ins, 1, sandbox_id, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
            sqlite3_bind_int64(ins, 2, (sqlite3_int64)i) != SQLITE_OK ||
            sqlite3_bind_text(ins, 3, files[i].path, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
            sqlite3_bind_int(ins, 4, files[i].mode) != SQLITE_OK ||
            sqlite3_bind_blob64(ins, 5, files[i].len ? (const void *)files[i].data : "",
                                (sqlite3_uint64)files[i].len, SQLITE_STATIC) != SQLITE_OK) {
            ret = store_db_fail(st, err, "keeping a seed's files");
            goto out;
        }
        rc = store_step_writing(st, ins, false);
        if ((rc & 0xff) == SQLITE_CONSTRAINT) {
            ret = lb_error_set(err, -ENOENT, "no sandbox %s", sandbox_id);
            goto out;
        }
        if (rc != SQLITE_DONE) {
            ret = store_db_fail(st, err, "keeping a seed's files");
            goto out;
        }
    }
    ret = store_exec_sql(st, "COMMIT", "keeping a seed's files", err);
    if (ret == 0)
        began = false;
out:
    sqlite3_finalize(del);
    sqlite3_finalize(ins);
    if (began)
        store_exec_sql(st, "ROLLBACK", "undoing a seed's files", NULL);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

void store_seed_files_free(struct lb_store_file *files, size_t n)
{
    for (size_t i = 0; files && i < n; i++) {
        free(files[i].path);
        free(files[i].data);
    }
    free(files);
}

int store_seed_files_get(struct lb_store *st, const char *sandbox_id, struct lb_store_file **out,
                         size_t *n, struct lb_error *err)
{
    sqlite3_stmt *s = NULL;
    struct lb_store_file *files = NULL;
    size_t count = 0;
    int rc, ret = 0;

    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&st->lock);
    if (sqlite3_prepare_v2(st->db,
                           "SELECT path, mode, data FROM seed_files WHERE sandbox_id = ?1 "
                           "ORDER BY idx",
                           -1, &s, NULL) != SQLITE_OK ||
        sqlite3_bind_text(s, 1, sandbox_id, -1, SQLITE_TRANSIENT) != SQLITE_OK) {
        ret = store_db_fail(st, err, "reading a seed's files");
        goto out;
    }
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        struct lb_store_file *grown = realloc(files, (count + 1) * sizeof(*files));
        const void *blob = sqlite3_column_blob(s, 2);
        size_t len = (size_t)sqlite3_column_bytes(s, 2);
        struct lb_store_file *f;

        if (!grown) {
            ret = lb_error_set(err, -ENOMEM, "out of memory");
            goto out;
        }
        files = grown;
        f = &files[count];
        memset(f, 0, sizeof(*f));
        count++;
        f->mode = sqlite3_column_int(s, 1);
        f->len = len;
        f->data = malloc(len ? len : 1);
        if (store_col_dup(s, 0, &f->path) < 0 || !f->path || !f->data) {
            ret = lb_error_set(err, -ENOMEM, "out of memory");
            goto out;
        }
        if (len)
            memcpy(f->data, blob, len);
    }
    if (rc != SQLITE_DONE)
        ret = store_db_fail(st, err, "reading a seed's files");
out:
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->lock);
    if (ret < 0) {
        store_seed_files_free(files, count);
        return ret;
    }
    *out = files;
    *n = count;
    return 0;
}

struct set_reset_args {
    const char *id, *spec_json, *token_hash;
    bool complete;
};

/* The reset's record and, once complete, its "reset" event, in one transaction. */
static int set_reset_fn(struct lb_store *st, void *ctx, struct lb_error *err)
{
    const struct set_reset_args *a = ctx;
    sqlite3_stmt *s = NULL;
    int ret = 0;

    if (sqlite3_prepare_v2(st->db,
                           "UPDATE sandboxes SET spec_json = ?2, token_hash = ?3, updated_at = ?4 "
                           "WHERE id = ?1 AND state = 'lent'",
                           -1, &s, NULL) != SQLITE_OK ||
        sqlite3_bind_text(s, 1, a->id, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
        sqlite3_bind_text(s, 2, a->spec_json, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
        sqlite3_bind_text(s, 3, a->token_hash, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
        sqlite3_bind_int64(s, 4, (sqlite3_int64)time(NULL)) != SQLITE_OK ||
        store_step_writing(st, s, false) != SQLITE_DONE) {
        ret = store_db_fail(st, err, "recording a reset");
        goto out;
    }
    if (sqlite3_changes(st->db) == 0)
        ret = lb_error_set(err, -ENOENT, "sandbox %s is not lent", a->id);
    else if (a->complete)
        ret = store_append_event(st, "reset", a->id, NULL, false, err);
out:
    sqlite3_finalize(s);
    return ret;
}

int store_set_reset(struct lb_store *st, const char *id, const char *spec_json,
                    const char *token_hash, bool complete, struct lb_error *err)
{
    struct set_reset_args a = {id, spec_json, token_hash, complete};

    return store_txn_write(st, set_reset_fn, &a, false, false, err);
}
