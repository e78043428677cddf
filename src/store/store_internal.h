/*
 * store_internal.h - what the files of the store share: the store's structure, its prepared
 * statements and their column orders, and the helpers one file calls in another. Shared by
 * store.c, records.c, store_warm.c, reserve.c and activations.c (src/store/ only; everything
 * else uses store.h).
 *
 * Locking (see store.c): every use of st->db happens with st->lock held; functions below that
 * take a struct lb_store must be called with it held.
 */
#ifndef LB_STORE_INTERNAL_H
#define LB_STORE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sqlite3.h>

#include "store/store.h"

/* Event notes a transaction keeps for the hook (events.c); past it: "unknown, wake all". */
#define STORE_EVENT_NOTES 16

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* The column order every SELECT returns and record_from_row reads. */
#define RECORD_COLUMNS                                                                             \
    "id, rsid, task_id, provider, state, spec_json, descriptor_json, token_hash, created_at, "     \
    "expires_at, updated_at, stop_attempts, next_attempt_at, last_error, stop_reason, pool_class"
enum {
    COL_ID,
    COL_RSID,
    COL_TASK_ID,
    COL_PROVIDER,
    COL_STATE,
    COL_SPEC,
    COL_DESCRIPTOR,
    COL_TOKEN_HASH,
    COL_CREATED_AT,
    COL_EXPIRES_AT,
    COL_UPDATED_AT,
    COL_STOP_ATTEMPTS,
    COL_NEXT_ATTEMPT_AT,
    COL_LAST_ERROR,
    COL_STOP_REASON,
    COL_POOL_CLASS,
};

enum stmt_id {
    STMT_INSERT,
    STMT_INSERT_CAPPED,
    STMT_GET,
    STMT_GET_LIVE,
    STMT_GET_TOKEN,
    STMT_STATE_OF,
    STMT_MARK_LENT,
    STMT_SET_DESCRIPTOR,
    STMT_SET_EXPIRES,
    STMT_MARK_STOPPING,
    STMT_MARK_STOPPED,
    STMT_MARK_STOP_FAILED,
    STMT_COUNT,
    STMT_COUNT_LIVE,
    STMT_PURGE,
    STMT_ACT_INSERT,
    STMT_ACT_GET_SANDBOX,
    STMT_ACT_GET_LATEST,
    STMT_ACT_ID_SANDBOX,
    STMT_ACT_ID_LATEST,
    STMT_ACT_STATE_OF,
    STMT_ACT_SET_STATE,
    STMT_ACT_SET_RECEIPT,
    STMT_ACT_SET_CAPTURE,
    STMT_ACT_TEXT_BYTES,
    STMT_EVENT_INSERT,
    STMT__COUNT,
};

/* The column order every activation SELECT returns and activation_from_row reads. */
#define ACT_COLUMNS                                                                                \
    "id, rsid, sandbox_id, state, spec_json, receipt_json, artifacts_json, capture_error, "        \
    "output_log, output_log_bytes, created_at, updated_at"

struct lb_store {
    pthread_mutex_t lock;
    bool lock_ready;
    sqlite3 *db;
    sqlite3_stmt *stmts[STMT__COUNT];
    char *path; /* the database file */
    /* the space reserve and the write check (see reserve.c); under lock */
    char *reserve_path;
    int64_t reserve_bytes; /* 0: no reserve */
    bool reserve_present;
    int64_t reserve_tried_ms; /* last attempt to make it */
    int64_t probed_ms;        /* last write check after a failed write */
    atomic_bool write_failed; /* the last write failed for lack of space or an I/O error */
    /* leases committed without their own sync (store_mark_lent durable = false), and how many
     * of them store_sync has synced; sync_broken: an fsync failed (sticky: store.h) */
    atomic_ullong unsynced_leases, synced_leases;
    atomic_bool sync_broken;
    /* the event feed (events.c); under lock but events_on */
    atomic_bool events_on; /* write events (always, but for a bench's comparison) */
    bool events_appended;  /* the transaction under way wrote an event */
    /* whose events it wrote (the first STORE_EVENT_NOTES; notes_over: more, or unknown) */
    struct lb_event_note notes[STORE_EVENT_NOTES];
    char note_ids[STORE_EVENT_NOTES][LB_ID_MAX];
    char note_rsids[STORE_EVENT_NOTES][LB_EVENT_RSID_MAX + 1];
    size_t n_notes;
    bool notes_over;
    void (*event_hook)(void *, const struct lb_event_note *, size_t); /* after such a commit */
    void *event_hook_ctx;
    int64_t events_max_age_s; /* retention; 0: none */
    int64_t events_max_count;
};

/* ---- store.c ---- */

/* Map the connection's last failure to an errno (-ENOMEM, -ENOSPC, -EIO) and a message naming
 * what; returns the errno. */
int store_db_fail(struct lb_store *st, struct lb_error *err, const char *what);
/* Reset a statement and clear its bindings, for its next use. */
void store_stmt_done(sqlite3_stmt *s);
/* Bind text (NULL: SQL NULL; the value must outlive the step) or a time (0: SQL NULL) to
 * parameter i. SQLite's result code. */
int store_bind_text(sqlite3_stmt *s, int i, const char *v);
int store_bind_time(sqlite3_stmt *s, int i, int64_t t);
/* A text column, malloc'd into *out (NULL for SQL NULL); 0 or -ENOMEM. */
int store_col_dup(sqlite3_stmt *s, int col, char **out);
/* A text column copied into dst of cap bytes (NULL: ""); 0, -EIO if it does not fit, or
 * -ENOMEM. */
int store_col_copy(sqlite3_stmt *s, int col, char *dst, size_t cap);
/* Whether s is shorter than cap bytes (so it fits a char[cap] with its NUL). */
bool store_fits(const char *s, size_t cap);
/* Step a bound UPDATE/DELETE (stop: a stop's record, which may spend the reserve) and reset
 * it: the number of rows changed, or a negative errno. store_step_write: not a stop. */
int store_step_write_ex(struct lb_store *st, sqlite3_stmt *s, bool stop, const char *what,
                        struct lb_error *err);
int store_step_write(struct lb_store *st, sqlite3_stmt *s, const char *what, struct lb_error *err);
/* Commit at synchronous = FULL (on) or back to NORMAL (off): the commit of a lease. */
void store_sync_full(struct lb_store *st, bool on);
/* Run SQL with no result rows; 0 or store_db_fail's errno (what names it). */
/* One integer that sql (a SELECT COUNT(*) ...) answers, into *out (0 on failure), with
 * texts[0..n_texts) bound as ?1.. and, when num is not NULL, *num as the next parameter. Takes
 * st->lock. 0, or store_db_fail's error naming what. */
int store_count_sql(struct lb_store *st, const char *sql, const char *const texts[], size_t n_texts,
                    const int64_t *num, const char *what, int64_t *out, struct lb_error *err);
int store_exec_sql(struct lb_store *st, const char *sql, const char *what, struct lb_error *err);
/* The database's user_version (its schema version) into *out; 0 or a negative errno. */
int store_read_user_version(struct lb_store *st, int *out, struct lb_error *err);

/* Whether SQLite's code rc means the file system is full. */
bool store_rc_is_full(struct lb_store *st, int rc);
/* Give the reserve's space back to the file system (for a stop's record); false if there was
 * none. */
bool store_reserve_spend(struct lb_store *st);
/* Step a bound write (stop: a stop's record, which may spend the reserve and run again), and
 * note whether the store could write. SQLite's result code. */
int store_step_writing(struct lb_store *st, sqlite3_stmt *s, bool stop);

/* ---- events.c ---- */

/* Forget the transaction's events (a new transaction, or a rollback). Lock held. */
void store_events_forget(struct lb_store *st);

/* Append an event of type for sandbox_id, with its session, task and labels from the record,
 * data (NULL: {}; borrowed) and, with_reason, data.reason from the record's stop_reason. Call
 * inside a transaction (store_txn, or the caller's BEGIN ... COMMIT, then the hook: see
 * store_txn) with the lock held; a record that is missing, or warm and never taken, writes
 * nothing. 0 or a negative errno. */
int store_append_event(struct lb_store *st, const char *type, const char *sandbox_id,
                       const json_t *data, bool with_reason, struct lb_error *err);
/* The work of one transaction: >= 0 to commit (returned by store_txn), < 0 to roll back. */
typedef int (*store_txn_fn)(struct lb_store *st, void *ctx, struct lb_error *err);
/* store_mark_stopped_usage's work inside a transaction the caller runs (lock held). */
int store_mark_stopped_in_txn(struct lb_store *st, const char *id, const char *reason,
                              const json_t *usage, struct lb_error *err);
/* Run fn inside BEGIN IMMEDIATE ... COMMIT (sync_full: the commit at synchronous = FULL), the
 * lock held by the caller. On failure the transaction is rolled back; stop (a stop's record):
 * a disk found full spends the space reserve and the whole transaction runs once more. After a
 * commit that appended events, the event hook runs (still under the lock). fn's result or a
 * negative errno. */
int store_txn(struct lb_store *st, store_txn_fn fn, void *ctx, bool stop, bool sync_full,
              struct lb_error *err);
/* A write of its own: the store.write fault point, then store_txn under st->lock (taken and
 * released here). fn's result or a negative errno. */
int store_txn_write(struct lb_store *st, store_txn_fn fn, void *ctx, bool stop, bool sync_full,
                    struct lb_error *err);
/* The SELECT store_events_list runs for f (a static string; ?1 since, ?2 rsid, ?3 sandbox_id,
 * ?4 types, ?5 limit): with f->rsid or f->sandbox_id it reads that column's index, not the whole
 * feed after since. */
const char *store_events_list_sql(const struct lb_event_filter *f);
/* A commit made by hand (not store_txn) after store_append_event: runs the event hook. */
void store_events_after_commit(struct lb_store *st);

/* ---- reserve.c (a top over store.c: it runs SQL to check a write) ---- */

/* Make the space reserve if it is missing and there is room (rate-limited): 0 when it is in
 * place or none is configured, -ENOSPC otherwise. */
int store_reserve_make(struct lb_store *st);

#endif
