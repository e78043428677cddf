/*
 * activations.c - harness activation records: their states' names, reading a row, insert,
 * lookups, the size of what one holds, and the state, receipt and capture updates.
 */
#include "store/store_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "util/clock.h"
#include "util/fault.h"
#include "util/mem.h"

/* ---- activations ---- */

static const char *const act_state_names[] = {
    [LB_ACT_STAGING] = "staging",
    [LB_ACT_RUNNING] = "running",
    [LB_ACT_CLOSING] = "closing",
    [LB_ACT_CLOSED] = "closed",
};

const char *store_act_state_name(enum lb_act_state s)
{
    if ((unsigned)s >= ARRAY_LEN(act_state_names))
        return "unknown";
    return act_state_names[s];
}

static int act_state_parse(const char *name, enum lb_act_state *out)
{
    for (size_t i = 0; name && i < ARRAY_LEN(act_state_names); i++) {
        if (strcmp(name, act_state_names[i]) == 0) {
            *out = (enum lb_act_state)i;
            return 0;
        }
    }
    return -EINVAL;
}

void store_activation_release(struct lb_activation *a)
{
    if (!a)
        return;
    char **const strings[] = {&a->rsid, &a->spec_json, &a->receipt_json, &a->artifacts_json,
                              &a->capture_error};

    mem_free_strings(strings, ARRAY_LEN(strings));
    free(a->log);
    a->log = NULL;
    a->log_len = 0;
}

/* Fill *out (zeroed first) from the current activation row. On failure *out holds nothing. */
static int activation_from_row(sqlite3_stmt *s, struct lb_activation *out, struct lb_error *err)
{
    const char *state = (const char *)sqlite3_column_text(s, 3);
    const void *blob;
    int ret, n;

    memset(out, 0, sizeof(*out));
    ret = store_col_copy(s, 0, out->id, sizeof(out->id));
    if (ret == 0)
        ret = store_col_copy(s, 2, out->sandbox_id, sizeof(out->sandbox_id));
    if (ret == -EIO) {
        lb_error_set(err, -EIO, "store: an activation has an over-long id");
        goto cleanup;
    }
    if (ret == 0 && act_state_parse(state, &out->state) < 0) {
        ret = lb_error_set(err, -EIO, "store: activation %s has unknown state '%s'", out->id,
                           state ? state : "(null)");
        goto cleanup;
    }
    if (ret == 0)
        ret = store_col_dup(s, 1, &out->rsid);
    if (ret == 0)
        ret = store_col_dup(s, 4, &out->spec_json);
    if (ret == 0)
        ret = store_col_dup(s, 5, &out->receipt_json);
    if (ret == 0)
        ret = store_col_dup(s, 6, &out->artifacts_json);
    if (ret == 0)
        ret = store_col_dup(s, 7, &out->capture_error);
    if (ret == 0 && sqlite3_column_type(s, 8) != SQLITE_NULL) {
        blob = sqlite3_column_blob(s, 8);
        n = sqlite3_column_bytes(s, 8);
        out->log = malloc(n > 0 ? (size_t)n : 1);
        if (!out->log)
            ret = -ENOMEM;
        else if (n > 0)
            memcpy(out->log, blob, (size_t)n);
        out->log_len = n > 0 ? (size_t)n : 0;
    }
    if (ret < 0) {
        lb_error_set(err, ret, "store: out of memory reading an activation");
        goto cleanup;
    }
    out->output_log_bytes =
        sqlite3_column_type(s, 9) == SQLITE_NULL ? -1 : sqlite3_column_int64(s, 9);
    out->created_at = sqlite3_column_int64(s, 10);
    out->updated_at = sqlite3_column_int64(s, 11);
    return 0;

cleanup:
    store_activation_release(out);
    memset(out, 0, sizeof(*out));
    return ret;
}

int store_insert_activation(struct lb_store *st, const struct lb_activation *a,
                            struct lb_error *err)
{
    sqlite3_stmt *s;
    int64_t now = clock_now_s();
    int ret = 0, rc;

    if (!a || !a->id[0] || !store_fits(a->id, sizeof(a->id)) || !a->rsid ||
        !store_fits(a->sandbox_id, sizeof(a->sandbox_id)) || !a->sandbox_id[0] ||
        (unsigned)a->state >= ARRAY_LEN(act_state_names))
        return lb_error_set(err, -EINVAL, "store: malformed activation");
    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_ACT_INSERT];
    if (store_bind_text(s, 1, a->id) || store_bind_text(s, 2, a->rsid) ||
        store_bind_text(s, 3, a->sandbox_id) || store_bind_text(s, 4, act_state_names[a->state]) ||
        store_bind_text(s, 5, a->spec_json) || store_bind_text(s, 6, a->receipt_json) ||
        store_bind_text(s, 7, a->artifacts_json) || store_bind_text(s, 8, a->capture_error) ||
        (a->log ? sqlite3_bind_blob64(s, 9, a->log, a->log_len, SQLITE_STATIC)
                : sqlite3_bind_null(s, 9)) ||
        (a->output_log_bytes >= 0 ? sqlite3_bind_int64(s, 10, a->output_log_bytes)
                                  : sqlite3_bind_null(s, 10)) ||
        sqlite3_bind_int64(s, 11, a->created_at ? a->created_at : now) ||
        sqlite3_bind_int64(s, 12, now)) {
        ret = store_db_fail(st, err, "binding an activation insert");
        goto cleanup;
    }
    rc = store_step_writing(st, s, false);
    if (rc == SQLITE_CONSTRAINT_PRIMARYKEY || rc == SQLITE_CONSTRAINT_UNIQUE)
        ret = lb_error_set(err, -EEXIST, "sandbox %s already has an activation", a->sandbox_id);
    else if (rc == SQLITE_CONSTRAINT_FOREIGNKEY)
        ret = lb_error_set(err, -ENOENT, "no sandbox %s", a->sandbox_id);
    else if (rc != SQLITE_DONE)
        ret = store_db_fail(st, err, "inserting an activation");

cleanup:
    store_stmt_done(s);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

static int act_get_one(struct lb_store *st, enum stmt_id id, const char *key,
                       struct lb_activation *out, struct lb_error *err)
{
    sqlite3_stmt *s;
    int ret = 0, rc;

    memset(out, 0, sizeof(*out));
    if (!key)
        return lb_error_set(err, -EINVAL, "store: no key");
    pthread_mutex_lock(&st->lock);
    s = st->stmts[id];
    if (store_bind_text(s, 1, key)) {
        ret = store_db_fail(st, err, "binding an activation lookup");
        goto cleanup;
    }
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        ret = activation_from_row(s, out, err);
    else if (rc == SQLITE_DONE)
        ret = lb_error_set(err, -ENOENT, "no activation for %s", key);
    else
        ret = store_db_fail(st, err, "reading an activation");

cleanup:
    store_stmt_done(s);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

int store_get_activation_by_sandbox(struct lb_store *st, const char *sandbox_id,
                                    struct lb_activation *out, struct lb_error *err)
{
    return act_get_one(st, STMT_ACT_GET_SANDBOX, sandbox_id, out, err);
}

int store_get_latest_activation(struct lb_store *st, const char *rsid, struct lb_activation *out,
                                struct lb_error *err)
{
    return act_get_one(st, STMT_ACT_GET_LATEST, rsid, out, err);
}

int store_get_activation_id(struct lb_store *st, bool by_sandbox, const char *key, char *id,
                            size_t size, struct lb_error *err)
{
    sqlite3_stmt *s;
    int ret = 0, rc;

    if (size)
        id[0] = '\0';
    if (!key)
        return lb_error_set(err, -EINVAL, "store: no key");
    pthread_mutex_lock(&st->lock);
    s = st->stmts[by_sandbox ? STMT_ACT_ID_SANDBOX : STMT_ACT_ID_LATEST];
    if (store_bind_text(s, 1, key)) {
        ret = store_db_fail(st, err, "binding an activation id lookup");
        goto cleanup;
    }
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        snprintf(id, size, "%s", (const char *)sqlite3_column_text(s, 0));
    else if (rc == SQLITE_DONE)
        ret = lb_error_set(err, -ENOENT, "no activation for %s", key);
    else
        ret = store_db_fail(st, err, "reading an activation id");

cleanup:
    store_stmt_done(s);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

/* The size of one stored value in bytes, from the row's header: its content is not read
 * (sqlite3_blob_bytes). 0 for NULL. Lock held. */
static uint64_t act_value_bytes(struct lb_store *st, const char *column, sqlite3_int64 rowid)
{
    sqlite3_blob *b = NULL;
    uint64_t n = 0;

    if (sqlite3_blob_open(st->db, "main", "activations", column, rowid, 0, &b) == SQLITE_OK)
        n = (uint64_t)sqlite3_blob_bytes(b);
    sqlite3_blob_close(b);
    return n;
}

int store_activation_text_bytes(struct lb_store *st, const char *rsid, uint64_t *bytes,
                                struct lb_error *err)
{
    static const char *const columns[] = {"artifacts_json", "output_log", "spec_json",
                                          "receipt_json", "capture_error"};
    sqlite3_int64 rows[64];
    size_t n = 0;
    sqlite3_stmt *s;
    int ret = 0, rc;

    *bytes = 0;
    if (!rsid)
        return lb_error_set(err, -EINVAL, "store: no key");
    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_ACT_TEXT_BYTES];
    if (store_bind_text(s, 1, rsid)) {
        ret = store_db_fail(st, err, "binding an activation size lookup");
        store_stmt_done(s);
        goto cleanup;
    }
    while ((rc = sqlite3_step(s)) == SQLITE_ROW && n < sizeof(rows) / sizeof(rows[0]))
        rows[n++] = sqlite3_column_int64(s, 0);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW)
        ret = store_db_fail(st, err, "reading an activation's size");
    store_stmt_done(s);
    for (size_t i = 0; ret == 0 && i < n; i++) {
        uint64_t sum = 0;

        for (size_t c = 0; c < sizeof(columns) / sizeof(columns[0]); c++)
            sum += act_value_bytes(st, columns[c], rows[i]);
        if (sum > *bytes)
            *bytes = sum;
    }
cleanup:
    pthread_mutex_unlock(&st->lock);
    return ret;
}

/* After an activation UPDATE that changed nothing: -ENOENT or the given code. Lock held. */
static int act_explain_no_change(struct lb_store *st, const char *id, int code, const char *what,
                                 struct lb_error *err)
{
    sqlite3_stmt *s = st->stmts[STMT_ACT_STATE_OF];
    const char *state;
    int ret;

    if (store_bind_text(s, 1, id)) {
        ret = store_db_fail(st, err, "binding an activation state lookup");
    } else {
        switch (sqlite3_step(s)) {
        case SQLITE_ROW:
            state = (const char *)sqlite3_column_text(s, 0);
            ret = lb_error_set(err, code, "activation %s is %s: %s", id,
                               state ? state : "in an unknown state", what);
            break;
        case SQLITE_DONE:
            ret = lb_error_set(err, -ENOENT, "no activation %s", id);
            break;
        default:
            ret = store_db_fail(st, err, "reading an activation state");
            break;
        }
    }
    store_stmt_done(s);
    return ret;
}

/* Step the activation UPDATE s whose parameters were bound (bind_failed: they could not be;
 * bind_what, write_what name the two failures). Call with the lock held; resets s. The rows
 * changed (0 or 1) or a negative errno with err set. */
static int act_write(struct lb_store *st, sqlite3_stmt *s, bool bind_failed, const char *bind_what,
                     const char *write_what, struct lb_error *err)
{
    int ret;

    if (!bind_failed)
        return store_step_write(st, s, write_what, err);
    ret = store_db_fail(st, err, bind_what);
    store_stmt_done(s);
    return ret;
}

int store_activation_set_state(struct lb_store *st, const char *id, enum lb_act_state to,
                               unsigned from_mask, struct lb_error *err)
{
    sqlite3_stmt *s;
    bool bad;
    int ret;

    if (!id || (unsigned)to >= ARRAY_LEN(act_state_names))
        return lb_error_set(err, -EINVAL, "store: bad activation transition");
    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_ACT_SET_STATE];
    bad = store_bind_text(s, 1, id) || store_bind_text(s, 2, act_state_names[to]) ||
          sqlite3_bind_int64(s, 3, clock_now_s()) || sqlite3_bind_int64(s, 4, from_mask);
    ret = act_write(st, s, bad, "binding an activation transition",
                    "changing an activation's state", err);
    if (ret == 0)
        ret = act_explain_no_change(st, id, -EBUSY, "cannot move it", err);
    pthread_mutex_unlock(&st->lock);
    return ret < 0 ? ret : 0;
}

int store_activation_set_receipt(struct lb_store *st, const char *id, const char *receipt_json,
                                 struct lb_error *err)
{
    sqlite3_stmt *s;
    bool bad;
    int ret;

    if (!id)
        return lb_error_set(err, -EINVAL, "store: no activation id");
    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_ACT_SET_RECEIPT];
    bad = store_bind_text(s, 1, id) || store_bind_text(s, 2, receipt_json) ||
          sqlite3_bind_int64(s, 3, clock_now_s());
    ret = act_write(st, s, bad, "binding an activation receipt", "storing an activation receipt",
                    err);
    if (ret == 0)
        ret = lb_error_set(err, -ENOENT, "no activation %s", id);
    pthread_mutex_unlock(&st->lock);
    return ret < 0 ? ret : 0;
}

int store_activation_set_capture(struct lb_store *st, const char *id, const char *artifacts_json,
                                 const char *capture_error, const void *log, size_t log_len,
                                 int64_t output_log_bytes, struct lb_error *err)
{
    sqlite3_stmt *s;
    bool bad;
    int ret;

    if (!id || !artifacts_json)
        return lb_error_set(err, -EINVAL, "store: a capture needs an id and artifacts");
    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_ACT_SET_CAPTURE];
    bad =
        store_bind_text(s, 1, id) || store_bind_text(s, 2, artifacts_json) ||
        store_bind_text(s, 3, capture_error) ||
        (log ? sqlite3_bind_blob64(s, 4, log, log_len, SQLITE_STATIC) : sqlite3_bind_null(s, 4)) ||
        (output_log_bytes >= 0 ? sqlite3_bind_int64(s, 5, output_log_bytes)
                               : sqlite3_bind_null(s, 5)) ||
        sqlite3_bind_int64(s, 6, clock_now_s());
    ret = act_write(st, s, bad, "binding an activation capture", "storing an activation capture",
                    err);
    if (ret == 0)
        ret = act_explain_no_change(st, id, -EALREADY, "its artifacts were collected already", err);
    pthread_mutex_unlock(&st->lock);
    return ret < 0 ? ret : 0;
}

int store_delete_activation_of_sandbox(struct lb_store *st, const char *sandbox_id,
                                       struct lb_error *err)
{
    sqlite3_stmt *s = NULL;
    int ret;

    if (!sandbox_id)
        return lb_error_set(err, -EINVAL, "store: no sandbox id");
    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    if (sqlite3_prepare_v2(st->db, "DELETE FROM activations WHERE sandbox_id = ?1", -1, &s, NULL) !=
            SQLITE_OK ||
        store_bind_text(s, 1, sandbox_id)) {
        ret = store_db_fail(st, err, "binding an activation's removal");
        sqlite3_finalize(s);
        goto out;
    }
    ret = store_step_write_ex(st, s, false, "removing an activation", err);
    sqlite3_finalize(s);
out:
    pthread_mutex_unlock(&st->lock);
    return ret < 0 ? ret : 0;
}
