/*
 * store.c - see store.h.
 *
 * Locking: the connection is opened with SQLITE_OPEN_NOMUTEX and every use of it happens with
 * st->lock held. Our own mutex rather than SQLite's serialized mode because an operation is more
 * than one SQLite call (bind, step, sqlite3_errmsg, sqlite3_changes, reset): the message and the
 * change count belong to the connection, and another thread's statement must not overwrite them
 * between our step and our read. The lock is never held across anything but SQLite calls and
 * malloc, so holders are brief.
 *
 * Durability: journal_mode=WAL with synchronous=NORMAL. In WAL mode a committed transaction is in
 * the WAL file (in the kernel's page cache) before sqlite3_step returns, so a crash of lendboxd,
 * even kill -9 mid-write, loses nothing: the next open replays the WAL. NORMAL skips only the
 * fsync at each commit, so what can be lost is the last transactions before a power loss or a
 * kernel crash; those also kill every sandbox, and the records that survive (an older state of
 * the same sandboxes) are reconciled against reality at the next start like any other record.
 * The database is never corrupted by it either way.
 *
 * File descriptors: SQLite opens its files with O_CLOEXEC, so no sandbox inherits them. The
 * database file is created here with mode 0600; SQLite gives its -wal and -shm files the mode of
 * the database file.
 */
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <sqlite3.h>

#include "util/clock.h"
#include "util/fault.h"
#include "util/log.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define BUSY_TIMEOUT_MS 5000

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

/*
 * Schema migrations: migrations[i] takes the database from user_version i to i + 1. Append only;
 * never edit one that has shipped.
 */
static const char *const migrations[] = {
    /* 1: sandbox records. */
    "CREATE TABLE sandboxes ("
    "  id TEXT PRIMARY KEY,"
    "  rsid TEXT,"
    "  task_id TEXT,"
    "  provider TEXT NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('starting', 'lent', 'stopping', 'stopped',"
    "                                      'failed_seed', 'stop_failed')),"
    "  spec_json TEXT,"
    "  descriptor_json TEXT,"
    "  token_hash TEXT,"
    "  created_at INTEGER NOT NULL,"
    "  expires_at INTEGER,"
    "  stop_attempts INTEGER NOT NULL DEFAULT 0,"
    "  next_attempt_at INTEGER,"
    "  last_error TEXT,"
    "  stop_reason TEXT,"
    "  updated_at INTEGER NOT NULL"
    ");"
    /* Invariant 2: one live sandbox per resources session. */
    "CREATE UNIQUE INDEX sandboxes_live_rsid ON sandboxes (rsid)"
    "  WHERE state IN ('starting', 'lent');"
    "CREATE INDEX sandboxes_token_hash ON sandboxes (token_hash);"
    "CREATE INDEX sandboxes_state ON sandboxes (state);"
    "CREATE INDEX sandboxes_state_next_attempt ON sandboxes (state, next_attempt_at);",
    /* 2: harness activations, one per lent sandbox, gone with its sandbox record. */
    "CREATE TABLE activations ("
    "  id TEXT PRIMARY KEY,"
    "  rsid TEXT NOT NULL,"
    "  sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,"
    "  state TEXT NOT NULL CHECK (state IN ('staging', 'running', 'closing', 'closed')),"
    "  spec_json TEXT,"
    "  receipt_json TEXT,"
    "  artifacts_json TEXT,"
    "  capture_error TEXT,"
    "  output_log BLOB,"
    "  output_log_bytes INTEGER,"
    "  created_at INTEGER NOT NULL,"
    "  updated_at INTEGER NOT NULL"
    ");"
    "CREATE UNIQUE INDEX activations_sandbox ON activations (sandbox_id);"
    "CREATE INDEX activations_rsid ON activations (rsid, created_at);",
    /* 3: warm pools (src/warm/): state 'warm' and the pool class a warm sandbox was made for.
     * The state CHECK needs a new table; foreign_keys is on (and cannot be turned off inside
     * the migration's transaction), so the activations that reference it are moved aside
     * first and put back after, with their table made again as migration 2 made it. */
    "CREATE TABLE sandboxes_v3 ("
    "  id TEXT PRIMARY KEY,"
    "  rsid TEXT,"
    "  task_id TEXT,"
    "  provider TEXT NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('starting', 'lent', 'stopping', 'stopped',"
    "                                      'failed_seed', 'stop_failed', 'warm')),"
    "  spec_json TEXT,"
    "  descriptor_json TEXT,"
    "  token_hash TEXT,"
    "  created_at INTEGER NOT NULL,"
    "  expires_at INTEGER,"
    "  stop_attempts INTEGER NOT NULL DEFAULT 0,"
    "  next_attempt_at INTEGER,"
    "  last_error TEXT,"
    "  stop_reason TEXT,"
    "  updated_at INTEGER NOT NULL,"
    "  pool_class TEXT"
    ");"
    "INSERT INTO sandboxes_v3 (id, rsid, task_id, provider, state, spec_json, descriptor_json,"
    "  token_hash, created_at, expires_at, stop_attempts, next_attempt_at, last_error,"
    "  stop_reason, updated_at)"
    "  SELECT id, rsid, task_id, provider, state, spec_json, descriptor_json, token_hash,"
    "  created_at, expires_at, stop_attempts, next_attempt_at, last_error, stop_reason,"
    "  updated_at FROM sandboxes ORDER BY rowid;"
    "CREATE TABLE activations_v3_copy AS SELECT * FROM activations;"
    "DROP TABLE activations;"
    "DROP TABLE sandboxes;"
    "ALTER TABLE sandboxes_v3 RENAME TO sandboxes;"
    "CREATE TABLE activations ("
    "  id TEXT PRIMARY KEY,"
    "  rsid TEXT NOT NULL,"
    "  sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,"
    "  state TEXT NOT NULL CHECK (state IN ('staging', 'running', 'closing', 'closed')),"
    "  spec_json TEXT,"
    "  receipt_json TEXT,"
    "  artifacts_json TEXT,"
    "  capture_error TEXT,"
    "  output_log BLOB,"
    "  output_log_bytes INTEGER,"
    "  created_at INTEGER NOT NULL,"
    "  updated_at INTEGER NOT NULL"
    ");"
    "INSERT INTO activations SELECT * FROM activations_v3_copy ORDER BY rowid;"
    "DROP TABLE activations_v3_copy;"
    "CREATE UNIQUE INDEX activations_sandbox ON activations (sandbox_id);"
    "CREATE INDEX activations_rsid ON activations (rsid, created_at);"
    "CREATE UNIQUE INDEX sandboxes_live_rsid ON sandboxes (rsid)"
    "  WHERE state IN ('starting', 'lent');"
    "CREATE INDEX sandboxes_token_hash ON sandboxes (token_hash);"
    "CREATE INDEX sandboxes_state ON sandboxes (state);"
    "CREATE INDEX sandboxes_state_next_attempt ON sandboxes (state, next_attempt_at);"
    "CREATE INDEX sandboxes_warm ON sandboxes (pool_class, created_at) WHERE state = 'warm';",
};

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
    STMT_MARK_STOPPING,
    STMT_MARK_STOPPED,
    STMT_MARK_STOP_FAILED,
    STMT_COUNT,
    STMT_COUNT_LIVE,
    STMT_PURGE,
    STMT_ACT_INSERT,
    STMT_ACT_GET_SANDBOX,
    STMT_ACT_GET_LATEST,
    STMT_ACT_STATE_OF,
    STMT_ACT_SET_STATE,
    STMT_ACT_SET_RECEIPT,
    STMT_ACT_SET_CAPTURE,
    STMT_ACT_TEXT_BYTES,
    STMT__COUNT,
};

/* The column order every activation SELECT returns and activation_from_row reads. */
#define ACT_COLUMNS                                                                                \
    "id, rsid, sandbox_id, state, spec_json, receipt_json, artifacts_json, capture_error, "        \
    "output_log, output_log_bytes, created_at, updated_at"

static const char *const stmt_sql[STMT__COUNT] = {
    [STMT_INSERT] = "INSERT INTO sandboxes (" RECORD_COLUMNS ") VALUES "
                    "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
    /* the capacity check and the insert in one statement, so one transaction: concurrent
     * seeds cannot both see the last free place */
    [STMT_INSERT_CAPPED] = "INSERT INTO sandboxes (" RECORD_COLUMNS ") SELECT "
                           "?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16 "
                           "WHERE (SELECT COUNT(*) FROM sandboxes WHERE state IN ('starting', "
                           "'lent', 'warm')) < ?17",
    [STMT_GET] = "SELECT " RECORD_COLUMNS " FROM sandboxes WHERE id = ?1",
    [STMT_GET_LIVE] = "SELECT " RECORD_COLUMNS " FROM sandboxes "
                      "WHERE rsid = ?1 AND state IN ('starting', 'lent')",
    [STMT_GET_TOKEN] = "SELECT " RECORD_COLUMNS " FROM sandboxes WHERE token_hash = ?1 "
                       "ORDER BY created_at DESC, rowid DESC LIMIT 1",
    [STMT_STATE_OF] = "SELECT state FROM sandboxes WHERE id = ?1",
    /* Only from starting: anything else (a shutdown sweep marked it stopping) must not be
     * resurrected into the live set. */
    [STMT_MARK_LENT] = "UPDATE sandboxes SET state = 'lent', "
                       "descriptor_json = COALESCE(?2, descriptor_json), "
                       "token_hash = COALESCE(?3, token_hash), updated_at = ?4 "
                       "WHERE id = ?1 AND state = 'starting'",
    [STMT_SET_DESCRIPTOR] = "UPDATE sandboxes SET descriptor_json = ?2, updated_at = ?3 "
                            "WHERE id = ?1",
    [STMT_MARK_STOPPING] = "UPDATE sandboxes SET state = 'stopping', "
                           "stop_reason = COALESCE(?2, stop_reason), updated_at = ?3 "
                           "WHERE id = ?1",
    [STMT_MARK_STOPPED] = "UPDATE sandboxes SET state = 'stopped', "
                          "stop_reason = COALESCE(?2, stop_reason), next_attempt_at = NULL, "
                          "updated_at = ?3 WHERE id = ?1",
    [STMT_MARK_STOP_FAILED] = "UPDATE sandboxes SET state = ?2, "
                              "stop_attempts = stop_attempts + 1, "
                              "last_error = COALESCE(?3, last_error), next_attempt_at = ?4, "
                              "updated_at = ?5 WHERE id = ?1",
    [STMT_COUNT] = "SELECT state, COUNT(*) FROM sandboxes GROUP BY state",
    [STMT_COUNT_LIVE] = "SELECT COUNT(*) FROM sandboxes WHERE state IN ('starting', 'lent', "
                        "'warm')",
    [STMT_PURGE] = "DELETE FROM sandboxes WHERE state = 'stopped' AND updated_at < ?1",
    [STMT_ACT_INSERT] = "INSERT INTO activations (" ACT_COLUMNS ") VALUES "
                        "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    [STMT_ACT_GET_SANDBOX] = "SELECT " ACT_COLUMNS " FROM activations WHERE sandbox_id = ?1",
    [STMT_ACT_GET_LATEST] = "SELECT " ACT_COLUMNS " FROM activations WHERE rsid = ?1 "
                            "ORDER BY created_at DESC, rowid DESC LIMIT 1",
    [STMT_ACT_STATE_OF] = "SELECT state FROM activations WHERE id = ?1",
    /* ?4 is a bit mask of the states the move is allowed from (enum lb_act_state order). */
    [STMT_ACT_SET_STATE] = "UPDATE activations SET state = ?2, updated_at = ?3 WHERE id = ?1 AND "
                           "((?4 >> CASE state WHEN 'staging' THEN 0 WHEN 'running' THEN 1 "
                           "WHEN 'closing' THEN 2 ELSE 3 END) & 1) = 1",
    [STMT_ACT_SET_RECEIPT] = "UPDATE activations SET receipt_json = ?2, updated_at = ?3 "
                             "WHERE id = ?1",
    /* Only the first capture is recorded. */
    [STMT_ACT_SET_CAPTURE] = "UPDATE activations SET artifacts_json = ?2, capture_error = ?3, "
                             "output_log = ?4, output_log_bytes = ?5, updated_at = ?6 "
                             "WHERE id = ?1 AND artifacts_json IS NULL",
    [STMT_ACT_TEXT_BYTES] = "SELECT rowid FROM activations WHERE rsid = ?1 "
                            "ORDER BY created_at DESC, rowid DESC LIMIT 64",
};

struct lb_store {
    pthread_mutex_t lock;
    bool lock_ready;
    sqlite3 *db;
    sqlite3_stmt *stmts[STMT__COUNT];
    char *path; /* the database file */
    /* the space reserve and the write check (see "the space reserve"); under lock */
    char *reserve_path;
    int64_t reserve_bytes; /* 0: no reserve */
    bool reserve_present;
    int64_t reserve_tried_ms; /* last attempt to make it */
    int64_t probed_ms;        /* last write check after a failed write */
    atomic_bool write_failed; /* the last write failed for lack of space or an I/O error */
};

static bool rc_is_full(struct lb_store *st, int rc);

/* Map the connection's last failure to an errno and a message. Call with the lock held. */
static int db_fail(struct lb_store *st, struct lb_error *err, const char *what)
{
    int rc = sqlite3_errcode(st->db);
    int code = rc == SQLITE_NOMEM ? -ENOMEM : rc_is_full(st, rc) ? -ENOSPC : -EIO;

    return lb_error_set(err, code, "store: %s: %s", what, sqlite3_errmsg(st->db));
}

static void stmt_done(sqlite3_stmt *s)
{
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
}

/* Text parameter; NULL binds SQL NULL. The value must outlive the step (SQLITE_STATIC). */
static int bind_text(sqlite3_stmt *s, int i, const char *v)
{
    return sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC);
}

/* A time where 0 means "none": stored as SQL NULL. */
static int bind_time(sqlite3_stmt *s, int i, int64_t t)
{
    return t ? sqlite3_bind_int64(s, i, t) : sqlite3_bind_null(s, i);
}

static int col_dup(sqlite3_stmt *s, int col, char **out)
{
    const unsigned char *t;

    *out = NULL;
    if (sqlite3_column_type(s, col) == SQLITE_NULL)
        return 0;
    t = sqlite3_column_text(s, col);
    if (!t)
        return -ENOMEM;
    *out = strdup((const char *)t);
    return *out ? 0 : -ENOMEM;
}

/* Copy a text column into a fixed array; NULL becomes "". -EIO if it does not fit. */
static int col_copy(sqlite3_stmt *s, int col, char *dst, size_t cap)
{
    const unsigned char *t = sqlite3_column_text(s, col);
    int n = sqlite3_column_bytes(s, col);

    dst[0] = '\0';
    if (!t)
        return sqlite3_column_type(s, col) == SQLITE_NULL ? 0 : -ENOMEM;
    if (n < 0 || (size_t)n >= cap)
        return -EIO;
    memcpy(dst, t, (size_t)n);
    dst[n] = '\0';
    return 0;
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
    ret = col_copy(s, COL_ID, out->id, sizeof(out->id));
    if (ret == 0)
        ret = col_copy(s, COL_TOKEN_HASH, out->token_hash, sizeof(out->token_hash));
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
        ret = col_dup(s, COL_RSID, &out->rsid);
    if (ret == 0)
        ret = col_dup(s, COL_TASK_ID, &out->task_id);
    if (ret == 0)
        ret = col_dup(s, COL_PROVIDER, &out->provider);
    if (ret == 0)
        ret = col_dup(s, COL_SPEC, &out->spec_json);
    if (ret == 0)
        ret = col_dup(s, COL_DESCRIPTOR, &out->descriptor_json);
    if (ret == 0)
        ret = col_dup(s, COL_LAST_ERROR, &out->last_error);
    if (ret == 0)
        ret = col_dup(s, COL_STOP_REASON, &out->stop_reason);
    if (ret == 0)
        ret = col_dup(s, COL_POOL_CLASS, &out->pool_class);
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
    free(r->rsid);
    free(r->task_id);
    free(r->provider);
    free(r->spec_json);
    free(r->descriptor_json);
    free(r->last_error);
    free(r->stop_reason);
    free(r->pool_class);
    r->rsid = r->task_id = r->provider = r->spec_json = r->descriptor_json = NULL;
    r->last_error = r->stop_reason = r->pool_class = NULL;
}

void store_records_free(struct lb_record *recs, size_t n)
{
    for (size_t i = 0; recs && i < n; i++)
        store_record_release(&recs[i]);
    free(recs);
}

/* ---- open, configure, migrate, close ---- */

/* Create the database file with mode 0600 before SQLite sees it (SQLite would create it 0644
 * less the umask), and tighten an existing file that is looser. */
static int create_private_file(const char *path, struct lb_error *err)
{
    char ebuf[128];
    struct stat sb;
    int fd, ret = 0;

    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return lb_error_set(err, -EIO, "store: cannot open database %s: %s", path,
                            strerror_r(errno, ebuf, sizeof(ebuf)));
    if (fstat(fd, &sb) < 0) {
        ret = lb_error_set(err, -EIO, "store: cannot stat database %s: %s", path,
                           strerror_r(errno, ebuf, sizeof(ebuf)));
        goto cleanup;
    }
    if (!S_ISREG(sb.st_mode)) {
        ret = lb_error_set(err, -EIO, "store: database %s is not a regular file", path);
        goto cleanup;
    }
    if ((sb.st_mode & 07777) != 0600) {
        if (fchmod(fd, 0600) < 0) {
            ret = lb_error_set(err, -EIO, "store: cannot chmod database %s to 0600: %s", path,
                               strerror_r(errno, ebuf, sizeof(ebuf)));
            goto cleanup;
        }
        if (sb.st_size > 0)
            log_warn("store: database %s had mode %04o; changed it to 0600", path,
                     (unsigned)(sb.st_mode & 07777));
    }

cleanup:
    close(fd);
    return ret;
}

static int exec_sql(struct lb_store *st, const char *sql, const char *what, struct lb_error *err)
{
    if (sqlite3_exec(st->db, sql, NULL, NULL, NULL) != SQLITE_OK)
        return db_fail(st, err, what);
    return 0;
}

static int configure(struct lb_store *st, const char *path, struct lb_error *err)
{
    sqlite3_stmt *s = NULL;
    const char *mode;
    int ret = 0;

    if (sqlite3_busy_timeout(st->db, BUSY_TIMEOUT_MS) != SQLITE_OK)
        return db_fail(st, err, "busy_timeout");
    if (sqlite3_prepare_v2(st->db, "PRAGMA journal_mode = WAL", -1, &s, NULL) != SQLITE_OK ||
        sqlite3_step(s) != SQLITE_ROW) {
        ret = db_fail(st, err, "journal_mode=WAL");
        goto cleanup;
    }
    mode = (const char *)sqlite3_column_text(s, 0);
    if (!mode || strcasecmp(mode, "wal") != 0) {
        ret = lb_error_set(err, -EIO, "store: %s: cannot enable WAL mode (journal mode is %s)",
                           path, mode ? mode : "unknown");
        goto cleanup;
    }
    ret = exec_sql(st, "PRAGMA synchronous = NORMAL", "synchronous=NORMAL", err);
    if (ret == 0)
        ret = exec_sql(st, "PRAGMA foreign_keys = ON", "foreign_keys=ON", err);

cleanup:
    sqlite3_finalize(s);
    return ret;
}

static int read_user_version(struct lb_store *st, int *out, struct lb_error *err)
{
    sqlite3_stmt *s = NULL;
    int ret = 0;

    if (sqlite3_prepare_v2(st->db, "PRAGMA user_version", -1, &s, NULL) != SQLITE_OK ||
        sqlite3_step(s) != SQLITE_ROW) {
        ret = db_fail(st, err, "reading user_version");
        goto cleanup;
    }
    *out = sqlite3_column_int(s, 0);

cleanup:
    sqlite3_finalize(s);
    return ret;
}

static int too_new(const char *path, int version, struct lb_error *err)
{
    return lb_error_set(err, -EIO,
                        "store: %s: database schema version %d is newer than this lendboxd "
                        "supports (%zu)",
                        path, version, ARRAY_LEN(migrations));
}

/* Apply each pending migration in its own IMMEDIATE transaction, re-reading user_version inside
 * it so that two processes opening the same file cannot both apply one. */
static int migrate(struct lb_store *st, const char *path, struct lb_error *err)
{
    const int known = (int)ARRAY_LEN(migrations);
    char sql[64];
    bool in_txn = false;
    int version = 0, ret;

    ret = read_user_version(st, &version, err);
    if (ret < 0)
        return ret;
    if (version > known)
        return too_new(path, version, err);
    while (version < known) {
        ret = exec_sql(st, "BEGIN IMMEDIATE", "beginning a migration", err);
        if (ret < 0)
            goto cleanup;
        in_txn = true;
        ret = read_user_version(st, &version, err);
        if (ret < 0)
            goto cleanup;
        if (version > known) {
            ret = too_new(path, version, err);
            goto cleanup;
        }
        if (version == known)
            break;
        ret = exec_sql(st, migrations[version], "applying a migration", err);
        if (ret < 0)
            goto cleanup;
        snprintf(sql, sizeof(sql), "PRAGMA user_version = %d", version + 1);
        ret = exec_sql(st, sql, "setting user_version", err);
        if (ret < 0)
            goto cleanup;
        ret = exec_sql(st, "COMMIT", "committing a migration", err);
        if (ret < 0)
            goto cleanup;
        in_txn = false;
        version++;
        log_info("store: %s: applied schema migration %d", path, version);
    }

cleanup:
    if (in_txn)
        sqlite3_exec(st->db, ret < 0 ? "ROLLBACK" : "COMMIT", NULL, NULL, NULL);
    return ret;
}

int store_open(const char *path, struct lb_store **out, struct lb_error *err)
{
    struct lb_store *st = NULL;
    int ret, rc;

    if (!path || !*path || !out)
        return lb_error_set(err, -EINVAL, "store: no database path");
    *out = NULL;
    ret = create_private_file(path, err);
    if (ret < 0)
        return ret;
    st = calloc(1, sizeof(*st));
    if (!st)
        return lb_error_set(err, -ENOMEM, "store: out of memory");
    rc = pthread_mutex_init(&st->lock, NULL);
    if (rc != 0) {
        ret = lb_error_set(err, -rc, "store: cannot create a mutex");
        goto cleanup;
    }
    st->lock_ready = true;
    if (!(st->path = strdup(path)) || asprintf(&st->reserve_path, "%s.reserve", path) < 0) {
        st->reserve_path = NULL;
        ret = lb_error_set(err, -ENOMEM, "store: out of memory");
        goto cleanup;
    }
    /* No SQLITE_OPEN_CREATE: create_private_file made the file with the right mode. */
    rc = sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        ret = lb_error_set(err, rc == SQLITE_NOMEM ? -ENOMEM : -EIO, "store: cannot open %s: %s",
                           path, st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
        goto cleanup;
    }
    sqlite3_extended_result_codes(st->db, 1);
    ret = configure(st, path, err);
    if (ret < 0)
        goto cleanup;
    ret = migrate(st, path, err);
    if (ret < 0)
        goto cleanup;
    for (size_t i = 0; i < STMT__COUNT; i++) {
        if (sqlite3_prepare_v3(st->db, stmt_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &st->stmts[i],
                               NULL) != SQLITE_OK) {
            ret = db_fail(st, err, "preparing a statement");
            goto cleanup;
        }
    }
    *out = st;
    st = NULL;

cleanup:
    store_close(st);
    return ret;
}

void store_close(struct lb_store *st)
{
    if (!st)
        return;
    for (size_t i = 0; i < STMT__COUNT; i++)
        sqlite3_finalize(st->stmts[i]);
    if (st->db && sqlite3_close(st->db) != SQLITE_OK)
        log_error("store: close: %s", sqlite3_errmsg(st->db));
    if (st->lock_ready)
        pthread_mutex_destroy(&st->lock);
    free(st->path);
    free(st->reserve_path);
    free(st);
}

/* ---- the space reserve ----
 *
 * A full file system must not keep the daemon from recording stops: a stop frees space, and its
 * record update must not be starved by whoever filled the disk. store_reserve_init makes
 * <database>.reserve, a file of reserve_bytes allocated up front (posix_fallocate). A stop's
 * record update (stopping, stopped, stop failed) that fails with SQLITE_FULL deletes it, which
 * frees its blocks at once (nothing holds it open), and is retried. Other writes never spend
 * it: while it is gone and cannot be made again, new sandbox records are refused (-ENOSPC)
 * rather than eat the space stops need. It is made again once the file system has twice its
 * size free (store_check_writable: /readyz and the sweeper call it; and before an insert).
 */

#define RESERVE_RETRY_MS 1000
#define PROBE_INTERVAL_MS 1000
#define LOW_WATER_BYTES (1024 * 1024) /* less free than this: the store counts as unwritable */

/* Did a step fail for lack of space? Call with the lock held. */
static bool rc_is_full(struct lb_store *st, int rc)
{
    return (rc & 0xff) == SQLITE_FULL ||
           ((rc & 0xff) == SQLITE_IOERR && sqlite3_system_errno(st->db) == ENOSPC);
}

/* Free bytes on the database's file system (lendboxd is root: blocks reserved for root count);
 * -errno when it cannot be read, -EROFS when it is read-only. */
static int64_t fs_free_bytes(const char *path)
{
    struct statvfs v;

    if (statvfs(path, &v) < 0)
        return -errno;
    if (v.f_flag & ST_RDONLY)
        return -EROFS;
    return (int64_t)v.f_bfree * (int64_t)v.f_frsize;
}

/* Make the reserve if it is missing and there is room: twice its size free, so that what is
 * left beside it is at least as much. Rate-limited. 0 when it is in place (or none is
 * configured), -ENOSPC otherwise. Call with the lock held. */
static int reserve_make(struct lb_store *st)
{
    int64_t now = clock_mono_ms(), free_bytes;
    int fd, r;

    if (st->reserve_bytes == 0 || st->reserve_present)
        return 0;
    if (st->reserve_tried_ms && now - st->reserve_tried_ms < RESERVE_RETRY_MS)
        return -ENOSPC;
    st->reserve_tried_ms = now;
    free_bytes = fs_free_bytes(st->path);
    if (free_bytes < 2 * st->reserve_bytes)
        return -ENOSPC;
    fd = open(st->reserve_path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        log_warn("store: cannot make the space reserve %s: %s", st->reserve_path, strerror(errno));
        return -ENOSPC;
    }
    r = posix_fallocate(fd, 0, st->reserve_bytes);
    close(fd);
    if (r != 0) {
        (void)unlink(st->reserve_path);
        log_warn("store: cannot allocate the space reserve %s: %s", st->reserve_path, strerror(r));
        return -ENOSPC;
    }
    st->reserve_present = true;
    log_info("store: space reserve %s in place (%lld bytes)", st->reserve_path,
             (long long)st->reserve_bytes);
    return 0;
}

/* Give the reserve's space back to the file system. false if there was none to give. Call with
 * the lock held. */
static bool reserve_spend(struct lb_store *st)
{
    if (!st->reserve_present)
        return false;
    st->reserve_present = false;
    st->reserve_tried_ms = clock_mono_ms(); /* not made again right away */
    if (unlink(st->reserve_path) < 0 && errno != ENOENT) {
        log_error("store: cannot delete the space reserve %s: %s", st->reserve_path,
                  strerror(errno));
        return false;
    }
    log_warn("store: the file system of %s is full: spent the space reserve (%lld bytes) on a "
             "stop's record",
             st->path, (long long)st->reserve_bytes);
    return true;
}

/* Step a bound write. stop: it records a stop, and may spend the reserve (then it is run
 * again). Notes whether the store could write. Returns SQLite's code. Call with the lock held. */
static int step_writing(struct lb_store *st, sqlite3_stmt *s, bool stop)
{
    int rc = sqlite3_step(s);

    if (stop && rc_is_full(st, rc) && reserve_spend(st)) {
        sqlite3_reset(s); /* bindings stay */
        rc = sqlite3_step(s);
    }
    if (rc == SQLITE_DONE)
        atomic_store(&st->write_failed, false);
    else if (rc_is_full(st, rc) || (rc & 0xff) == SQLITE_IOERR || (rc & 0xff) == SQLITE_READONLY)
        atomic_store(&st->write_failed, true);
    return rc;
}

/* A real write (user_version set to what it is), after a write failed. Lock held. */
static int probe_write(struct lb_store *st, struct lb_error *err)
{
    char sql[64];
    int version = 0, r;

    r = read_user_version(st, &version, err);
    if (r < 0)
        return r;
    snprintf(sql, sizeof(sql), "PRAGMA user_version = %d", version);
    r = exec_sql(st, sql, "write check", err);
    if (r == 0)
        atomic_store(&st->write_failed, false);
    return r;
}

int store_reserve_init(struct lb_store *st, int64_t reserve_bytes, struct lb_error *err)
{
    struct stat sb;
    int r = 0;

    if (reserve_bytes < 0)
        return lb_error_set(err, -EINVAL, "store: the space reserve must not be negative");
    pthread_mutex_lock(&st->lock);
    st->reserve_bytes = reserve_bytes;
    if (reserve_bytes == 0) {
        (void)unlink(st->reserve_path); /* one of an earlier configuration */
        goto out;
    }
    /* one kept from an earlier run counts if it is whole */
    st->reserve_present = stat(st->reserve_path, &sb) == 0 && S_ISREG(sb.st_mode) &&
                          sb.st_size >= reserve_bytes &&
                          (int64_t)sb.st_blocks * 512 >= reserve_bytes;
    if (!st->reserve_present && reserve_make(st) < 0)
        log_warn("store: no space for the space reserve (%lld bytes) next to %s: stops on a full "
                 "disk may fail to be recorded until space returns",
                 (long long)reserve_bytes, st->path);
out:
    pthread_mutex_unlock(&st->lock);
    return r;
}

int store_check_writable(struct lb_store *st, struct lb_error *err)
{
    int64_t now = clock_mono_ms(), free_bytes;
    int r = 0;

    pthread_mutex_lock(&st->lock);
    free_bytes = fs_free_bytes(st->path);
    if (free_bytes < 0) {
        r = lb_error_set(err, free_bytes == -EROFS ? -EROFS : -EIO,
                         "store cannot write: the file system of %s is %s", st->path,
                         free_bytes == -EROFS ? "read-only" : "unreadable");
    } else if (reserve_make(st) < 0) {
        r = lb_error_set(err, -ENOSPC,
                         "store cannot write: the file system of %s is full (its space reserve "
                         "for stops is spent and needs %lld bytes free to be made again)",
                         st->path, (long long)(2 * st->reserve_bytes));
    } else if (free_bytes < LOW_WATER_BYTES) {
        r = lb_error_set(err, -ENOSPC,
                         "store cannot write: the file system of %s is full (%lld bytes free)",
                         st->path, (long long)free_bytes);
    } else if (atomic_load(&st->write_failed)) {
        /* the last write failed: only a write that succeeds tells it works again */
        if (now - st->probed_ms >= PROBE_INTERVAL_MS) {
            st->probed_ms = now;
            (void)probe_write(st, NULL);
        }
        if (atomic_load(&st->write_failed))
            r = lb_error_set(err, -EIO, "store cannot write: the last write failed");
    }
    pthread_mutex_unlock(&st->lock);
    return r;
}

/* ---- records ---- */

static bool fits(const char *s, size_t cap)
{
    return strnlen(s, cap) < cap;
}

int store_insert_sandbox(struct lb_store *st, const struct lb_record *r, int64_t max_live,
                         struct lb_error *err)
{
    sqlite3_stmt *s;
    int64_t now = clock_now_s();
    int ret = 0, rc;

    if (!r || !r->id[0] || !fits(r->id, sizeof(r->id)))
        return lb_error_set(err, -EINVAL, "store: a record needs an id shorter than %d bytes",
                            LB_ID_MAX);
    if (!r->provider || !r->provider[0])
        return lb_error_set(err, -EINVAL, "store: record %s has no provider", r->id);
    if ((unsigned)r->state >= ARRAY_LEN(state_names))
        return lb_error_set(err, -EINVAL, "store: record %s has an invalid state %d", r->id,
                            (int)r->state);
    if (!fits(r->token_hash, sizeof(r->token_hash)) || r->stop_attempts < 0)
        return lb_error_set(err, -EINVAL, "store: record %s is malformed", r->id);

    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    /* a spent reserve is the stops': no new records until it is back */
    if (reserve_make(st) < 0) {
        ret = lb_error_set(err, -ENOSPC,
                           "store: the file system of %s is full (its space reserve for stops "
                           "is spent); no new sandboxes until space returns",
                           st->path);
        pthread_mutex_unlock(&st->lock);
        return ret;
    }
    s = st->stmts[max_live > 0 ? STMT_INSERT_CAPPED : STMT_INSERT];
    if (bind_text(s, 1, r->id) || bind_text(s, 2, r->rsid) || bind_text(s, 3, r->task_id) ||
        bind_text(s, 4, r->provider) || bind_text(s, 5, state_names[r->state]) ||
        bind_text(s, 6, r->spec_json) || bind_text(s, 7, r->descriptor_json) ||
        bind_text(s, 8, r->token_hash[0] ? r->token_hash : NULL) ||
        sqlite3_bind_int64(s, 9, r->created_at ? r->created_at : now) ||
        bind_time(s, 10, r->expires_at) || sqlite3_bind_int64(s, 11, now) ||
        sqlite3_bind_int(s, 12, r->stop_attempts) || bind_time(s, 13, r->next_attempt_at) ||
        bind_text(s, 14, r->last_error) || bind_text(s, 15, r->stop_reason) ||
        bind_text(s, 16, r->pool_class) || (max_live > 0 && sqlite3_bind_int64(s, 17, max_live))) {
        ret = db_fail(st, err, "binding an insert");
        goto cleanup;
    }
    rc = step_writing(st, s, false);
    if (rc == SQLITE_CONSTRAINT_PRIMARYKEY)
        ret = lb_error_set(err, -EEXIST, "sandbox %s already exists", r->id);
    else if (rc == SQLITE_CONSTRAINT_UNIQUE)
        ret = lb_error_set(err, -EEXIST, "resources session %s already has a live sandbox",
                           r->rsid ? r->rsid : "(none)");
    else if (rc != SQLITE_DONE)
        ret = db_fail(st, err, "inserting a sandbox record");
    else if (max_live > 0 && sqlite3_changes(st->db) == 0)
        ret = lb_error_set(err, -EUSERS, "max_sandboxes (%lld) reached", (long long)max_live);

cleanup:
    stmt_done(s);
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
    if (bind_text(s, 1, key)) {
        ret = db_fail(st, err, "binding a lookup");
        goto cleanup;
    }
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        ret = record_from_row(s, out, err);
    else if (rc == SQLITE_DONE)
        ret = -ENOENT; /* the caller words the message */
    else
        ret = db_fail(st, err, "reading a sandbox record");

cleanup:
    stmt_done(s);
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
        ret = db_fail(st, err, "preparing a list query");
        goto cleanup;
    }
    if ((f->rsid && bind_text(s, 1, f->rsid)) ||
        (f->state >= 0 && bind_text(s, 2, state_names[f->state])) ||
        ((f->due_only || f->expired_only) && sqlite3_bind_int64(s, 3, f->now_s)) ||
        (f->limit &&
         sqlite3_bind_int64(s, 4, f->limit > INT64_MAX ? INT64_MAX : (int64_t)f->limit))) {
        ret = db_fail(st, err, "binding a list query");
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
        ret = db_fail(st, err, "listing sandbox records");
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

/* Step a bound UPDATE/DELETE (stop: a stop's record, which may spend the reserve). Returns the
 * number of rows changed, or a negative errno. Call with the lock held; resets the statement. */
static int step_write_ex(struct lb_store *st, sqlite3_stmt *s, bool stop, const char *what,
                         struct lb_error *err)
{
    int ret;

    if (step_writing(st, s, stop) == SQLITE_DONE)
        ret = sqlite3_changes(st->db);
    else
        ret = db_fail(st, err, what);
    stmt_done(s);
    return ret;
}

static int step_write(struct lb_store *st, sqlite3_stmt *s, const char *what, struct lb_error *err)
{
    return step_write_ex(st, s, false, what, err);
}

/* The connection runs at synchronous = NORMAL: a commit is in the WAL (safe from a daemon
 * crash) but fsync waits for a checkpoint. The commit that hands out a lease is made at FULL,
 * which syncs the WAL, so the lease and every record written before it are on disk before the
 * lease is returned (docs/operations.md, "Durability"). Lock held. */
static void sync_full(struct lb_store *st, bool on)
{
    (void)sqlite3_exec(st->db, on ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL",
                       NULL, NULL, NULL);
}

int store_mark_lent(struct lb_store *st, const char *id, const char *descriptor_json,
                    const char *token_hash, struct lb_error *err)
{
    sqlite3_stmt *s;
    const char *state;
    int ret;

    if (!id)
        return lb_error_set(err, -EINVAL, "store: no sandbox id");
    if (token_hash && !fits(token_hash, LB_TOKEN_HASH_HEX + 1))
        return lb_error_set(err, -EINVAL, "store: token hash longer than %d characters",
                            LB_TOKEN_HASH_HEX);
    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_MARK_LENT];
    if (bind_text(s, 1, id) || bind_text(s, 2, descriptor_json) ||
        bind_text(s, 3, token_hash && token_hash[0] ? token_hash : NULL) ||
        sqlite3_bind_int64(s, 4, clock_now_s())) {
        ret = db_fail(st, err, "binding mark_lent");
        stmt_done(s);
        goto cleanup;
    }
    sync_full(st, true);
    ret = step_write(st, s, "marking a sandbox lent", err);
    sync_full(st, false);
    if (ret != 0)
        goto cleanup;
    /* Nothing changed: tell a missing record from one that is no longer starting. */
    s = st->stmts[STMT_STATE_OF];
    if (bind_text(s, 1, id)) {
        ret = db_fail(st, err, "binding a state lookup");
    } else {
        switch (sqlite3_step(s)) {
        case SQLITE_ROW:
            state = (const char *)sqlite3_column_text(s, 0);
            ret = lb_error_set(err, -EBUSY, "sandbox %s is %s, not starting", id,
                               state ? state : "in an unknown state");
            break;
        case SQLITE_DONE:
            ret = lb_error_set(err, -ENOENT, "no sandbox %s", id);
            break;
        default:
            ret = db_fail(st, err, "reading a sandbox state");
            break;
        }
    }
    stmt_done(s);

cleanup:
    pthread_mutex_unlock(&st->lock);
    return ret < 0 ? ret : 0;
}

/* Finish an UPDATE keyed by id whose parameters are bound (bind_failed: they could not be). Call
 * with the lock held; resets the statement. */
static int finish_transition(struct lb_store *st, sqlite3_stmt *s, bool bind_failed, bool stop,
                             const char *id, const char *what, struct lb_error *err)
{
    int ret;

    if (bind_failed) {
        ret = db_fail(st, err, what);
        stmt_done(s);
    } else {
        ret = step_write_ex(st, s, stop, what, err);
        if (ret == 0)
            ret = lb_error_set(err, -ENOENT, "no sandbox %s", id);
    }
    return ret < 0 ? ret : 0;
}

int store_set_descriptor(struct lb_store *st, const char *id, const char *descriptor_json,
                         struct lb_error *err)
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
    s = st->stmts[STMT_SET_DESCRIPTOR];
    bad = bind_text(s, 1, id) || bind_text(s, 2, descriptor_json) ||
          sqlite3_bind_int64(s, 3, clock_now_s());
    ret = finish_transition(st, s, bad, false, id, "storing a descriptor", err);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

int store_mark_stopping(struct lb_store *st, const char *id, const char *reason,
                        struct lb_error *err)
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
    s = st->stmts[STMT_MARK_STOPPING];
    bad = bind_text(s, 1, id) || bind_text(s, 2, reason) || sqlite3_bind_int64(s, 3, clock_now_s());
    ret = finish_transition(st, s, bad, true, id, "marking a sandbox stopping", err);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

int store_mark_stopped(struct lb_store *st, const char *id, const char *reason,
                       struct lb_error *err)
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
    s = st->stmts[STMT_MARK_STOPPED];
    bad = bind_text(s, 1, id) || bind_text(s, 2, reason) || sqlite3_bind_int64(s, 3, clock_now_s());
    ret = finish_transition(st, s, bad, true, id, "marking a sandbox stopped", err);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

int store_mark_stopped_many(struct lb_store *st, const char *const *ids, size_t n,
                            const char *reason, struct lb_error *err)
{
    sqlite3_stmt *s;
    int ret;

    if (n == 0)
        return 0;
    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_MARK_STOPPED];
    /* stops' records: a batch that finds the disk full is rolled back, spends the reserve and
     * runs once more */
    for (int attempt = 0; attempt < 2; attempt++) {
        ret = exec_sql(st, "BEGIN IMMEDIATE", "beginning a batch", err);
        for (size_t i = 0; ret == 0 && i < n; i++) {
            bool bad = bind_text(s, 1, ids[i]) || bind_text(s, 2, reason) ||
                       sqlite3_bind_int64(s, 3, clock_now_s());

            ret = finish_transition(st, s, bad, false, ids[i], "marking sandboxes stopped", err);
        }
        if (ret == 0)
            ret = exec_sql(st, "COMMIT", "committing a batch", err);
        if (ret == 0) {
            atomic_store(&st->write_failed, false);
            break;
        }
        if (!sqlite3_get_autocommit(st->db))
            sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
        if (ret != -ENOSPC || attempt > 0 || !reserve_spend(st))
            break;
    }
    if (ret == -ENOSPC)
        atomic_store(&st->write_failed, true);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

int store_mark_stop_failed(struct lb_store *st, const char *id, enum lb_record_state state,
                           const char *last_error, int64_t next_attempt_at, struct lb_error *err)
{
    sqlite3_stmt *s;
    bool bad;
    int ret;

    if (!id)
        return lb_error_set(err, -EINVAL, "store: no sandbox id");
    if (state != LB_STATE_FAILED_SEED && state != LB_STATE_STOP_FAILED)
        return lb_error_set(err, -EINVAL,
                            "store: a failed stop leaves failed_seed or "
                            "stop_failed, not %s",
                            store_state_name(state));
    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_MARK_STOP_FAILED];
    bad = bind_text(s, 1, id) || bind_text(s, 2, state_names[state]) ||
          bind_text(s, 3, last_error) || bind_time(s, 4, next_attempt_at) ||
          sqlite3_bind_int64(s, 5, clock_now_s());
    ret = finish_transition(st, s, bad, true, id, "recording a failed stop", err);
    pthread_mutex_unlock(&st->lock);
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
        ret = db_fail(st, err, "counting sandbox records");

cleanup:
    stmt_done(s);
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
        ret = db_fail(st, err, "counting live sandboxes");
    stmt_done(s);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

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
        ret = db_fail(st, err, what);
        sqlite3_finalize(s);
        return ret;
    }
    if (step_writing(st, s, stop) == SQLITE_DONE)
        ret = sqlite3_changes(st->db);
    else
        ret = db_fail(st, err, what);
    sqlite3_finalize(s);
    return ret;
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
        rc = bind_time(s, 3, a->expires_at);
    return rc == SQLITE_OK ? sqlite3_bind_int64(s, 4, clock_now_s()) : rc;
}

int store_mark_warm(struct lb_store *st, const char *id, const char *descriptor_json,
                    int64_t expires_at, struct lb_error *err)
{
    struct mark_warm_args a = {descriptor_json, expires_at};
    int ret = fault_hit("store.write", 0, err);

    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    ret = warm_update(st,
                      "UPDATE sandboxes SET state = 'warm', descriptor_json = ?2, expires_at = ?3, "
                      "updated_at = ?4 WHERE id = ?1 AND state = 'starting'",
                      id, bind_mark_warm, &a, false, "marking a sandbox warm", err);
    pthread_mutex_unlock(&st->lock);
    if (ret == 0)
        return lb_error_set(err, -EBUSY, "sandbox %s is no longer starting", id);
    return ret < 0 ? ret : 0;
}

static int bind_claim(sqlite3_stmt *s, const void *ctx)
{
    int rc = sqlite3_bind_text(s, 2, ctx, -1, SQLITE_TRANSIENT);

    return rc == SQLITE_OK ? sqlite3_bind_int64(s, 3, clock_now_s()) : rc;
}

int store_claim_warm(struct lb_store *st, const char *id, const char *reason, struct lb_error *err)
{
    int ret = fault_hit("store.write", 0, err);

    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    ret = warm_update(st,
                      "UPDATE sandboxes SET state = 'stopping', stop_reason = ?2, updated_at = ?3 "
                      "WHERE id = ?1 AND state = 'warm'",
                      id, bind_claim, reason, true, "claiming a warm sandbox", err);
    pthread_mutex_unlock(&st->lock);
    if (ret == 0)
        return lb_error_set(err, -EBUSY, "sandbox %s is not warm", id);
    return ret < 0 ? ret : 0;
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
        rc = bind_time(s, 6, a->t->expires_at);
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
    ret = exec_sql(st, "BEGIN IMMEDIATE", "beginning a warm take", err);
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
        ret = db_fail(st, err, "finding a warm sandbox");
        goto cleanup;
    }
    rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) {
        ret = -ENOENT; /* a miss: no message needed */
        goto cleanup;
    }
    if (rc != SQLITE_ROW) {
        ret = db_fail(st, err, "finding a warm sandbox");
        goto cleanup;
    }
    if (col_copy(s, 0, id, sizeof(id)) < 0) {
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
                      "spec_json = ?4, token_hash = ?5, expires_at = ?6, updated_at = ?7 "
                      "WHERE id = ?1 AND state = 'warm'",
                      id, bind_take, &a, false, "taking a warm sandbox", err);
    if (ret < 0 && (sqlite3_extended_errcode(st->db) == SQLITE_CONSTRAINT_UNIQUE))
        ret = lb_error_set(err, -EEXIST, "session %s already has a live sandbox", t->rsid);
    if (ret == 0)
        ret = lb_error_set(err, -EIO, "store: warm sandbox %s changed inside a transaction", id);
    if (ret < 0)
        goto cleanup;
    sync_full(st, true); /* the lease is durable before it is returned */
    ret = exec_sql(st, "COMMIT", "committing a warm take", err);
    sync_full(st, false);
    if (ret < 0)
        goto cleanup;
    in_txn = false;
    ret = 0;
cleanup:
    sqlite3_finalize(s);
    if (in_txn)
        sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
    pthread_mutex_unlock(&st->lock);
    if (ret == 0)
        ret = store_get_sandbox(st, id, out, err);
    return ret;
}

/* The number of live (and warm) records whose spec's JSON field at path equals value. */
static int count_live_by_spec(struct lb_store *st, const char *path, const char *value,
                              const char *what, int64_t *out, struct lb_error *err)
{
    sqlite3_stmt *s = NULL;
    int ret = 0;

    *out = 0;
    pthread_mutex_lock(&st->lock);
    if (sqlite3_prepare_v2(st->db,
                           "SELECT COUNT(*) FROM sandboxes WHERE state IN ('starting', 'lent', "
                           "'stopping', 'stop_failed', 'warm') AND json_valid(spec_json) AND "
                           "json_extract(spec_json, ?2) = ?1",
                           -1, &s, NULL) != SQLITE_OK ||
        sqlite3_bind_text(s, 1, value, -1, SQLITE_TRANSIENT) != SQLITE_OK ||
        sqlite3_bind_text(s, 2, path, -1, SQLITE_STATIC) != SQLITE_OK)
        ret = db_fail(st, err, what);
    else if (sqlite3_step(s) == SQLITE_ROW)
        *out = sqlite3_column_int64(s, 0);
    else
        ret = db_fail(st, err, what);
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

int store_count_using_image(struct lb_store *st, const char *image, int64_t *out,
                            struct lb_error *err)
{
    return count_live_by_spec(st, "$.image", image, "counting the sandboxes of an image", out, err);
}

int store_count_using_image_digest(struct lb_store *st, const char *digest, int64_t *out,
                                   struct lb_error *err)
{
    return count_live_by_spec(st, "$.image_digest", digest,
                              "counting the sandboxes of an image digest", out, err);
}

int store_purge_stopped(struct lb_store *st, int64_t cutoff_s, struct lb_error *err)
{
    sqlite3_stmt *s;
    int ret;

    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_PURGE];
    if (sqlite3_bind_int64(s, 1, cutoff_s)) {
        ret = db_fail(st, err, "binding a purge");
        stmt_done(s);
    } else {
        ret = step_write(st, s, "purging stopped records", err);
    }
    pthread_mutex_unlock(&st->lock);
    return ret;
}

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
    free(a->rsid);
    free(a->spec_json);
    free(a->receipt_json);
    free(a->artifacts_json);
    free(a->capture_error);
    free(a->log);
    a->rsid = a->spec_json = a->receipt_json = a->artifacts_json = a->capture_error = NULL;
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
    ret = col_copy(s, 0, out->id, sizeof(out->id));
    if (ret == 0)
        ret = col_copy(s, 2, out->sandbox_id, sizeof(out->sandbox_id));
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
        ret = col_dup(s, 1, &out->rsid);
    if (ret == 0)
        ret = col_dup(s, 4, &out->spec_json);
    if (ret == 0)
        ret = col_dup(s, 5, &out->receipt_json);
    if (ret == 0)
        ret = col_dup(s, 6, &out->artifacts_json);
    if (ret == 0)
        ret = col_dup(s, 7, &out->capture_error);
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

    if (!a || !a->id[0] || !fits(a->id, sizeof(a->id)) || !a->rsid ||
        !fits(a->sandbox_id, sizeof(a->sandbox_id)) || !a->sandbox_id[0] ||
        (unsigned)a->state >= ARRAY_LEN(act_state_names))
        return lb_error_set(err, -EINVAL, "store: malformed activation");
    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_ACT_INSERT];
    if (bind_text(s, 1, a->id) || bind_text(s, 2, a->rsid) || bind_text(s, 3, a->sandbox_id) ||
        bind_text(s, 4, act_state_names[a->state]) || bind_text(s, 5, a->spec_json) ||
        bind_text(s, 6, a->receipt_json) || bind_text(s, 7, a->artifacts_json) ||
        bind_text(s, 8, a->capture_error) ||
        (a->log ? sqlite3_bind_blob64(s, 9, a->log, a->log_len, SQLITE_STATIC)
                : sqlite3_bind_null(s, 9)) ||
        (a->output_log_bytes >= 0 ? sqlite3_bind_int64(s, 10, a->output_log_bytes)
                                  : sqlite3_bind_null(s, 10)) ||
        sqlite3_bind_int64(s, 11, a->created_at ? a->created_at : now) ||
        sqlite3_bind_int64(s, 12, now)) {
        ret = db_fail(st, err, "binding an activation insert");
        goto cleanup;
    }
    rc = step_writing(st, s, false);
    if (rc == SQLITE_CONSTRAINT_PRIMARYKEY || rc == SQLITE_CONSTRAINT_UNIQUE)
        ret = lb_error_set(err, -EEXIST, "sandbox %s already has an activation", a->sandbox_id);
    else if (rc == SQLITE_CONSTRAINT_FOREIGNKEY)
        ret = lb_error_set(err, -ENOENT, "no sandbox %s", a->sandbox_id);
    else if (rc != SQLITE_DONE)
        ret = db_fail(st, err, "inserting an activation");

cleanup:
    stmt_done(s);
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
    if (bind_text(s, 1, key)) {
        ret = db_fail(st, err, "binding an activation lookup");
        goto cleanup;
    }
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW)
        ret = activation_from_row(s, out, err);
    else if (rc == SQLITE_DONE)
        ret = lb_error_set(err, -ENOENT, "no activation for %s", key);
    else
        ret = db_fail(st, err, "reading an activation");

cleanup:
    stmt_done(s);
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
    if (bind_text(s, 1, rsid)) {
        ret = db_fail(st, err, "binding an activation size lookup");
        stmt_done(s);
        goto cleanup;
    }
    while ((rc = sqlite3_step(s)) == SQLITE_ROW && n < sizeof(rows) / sizeof(rows[0]))
        rows[n++] = sqlite3_column_int64(s, 0);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW)
        ret = db_fail(st, err, "reading an activation's size");
    stmt_done(s);
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

    if (bind_text(s, 1, id)) {
        ret = db_fail(st, err, "binding an activation state lookup");
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
            ret = db_fail(st, err, "reading an activation state");
            break;
        }
    }
    stmt_done(s);
    return ret;
}

int store_activation_set_state(struct lb_store *st, const char *id, enum lb_act_state to,
                               unsigned from_mask, struct lb_error *err)
{
    sqlite3_stmt *s;
    int ret;

    if (!id || (unsigned)to >= ARRAY_LEN(act_state_names))
        return lb_error_set(err, -EINVAL, "store: bad activation transition");
    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_ACT_SET_STATE];
    if (bind_text(s, 1, id) || bind_text(s, 2, act_state_names[to]) ||
        sqlite3_bind_int64(s, 3, clock_now_s()) || sqlite3_bind_int64(s, 4, from_mask)) {
        ret = db_fail(st, err, "binding an activation transition");
        stmt_done(s);
        goto cleanup;
    }
    ret = step_write(st, s, "changing an activation's state", err);
    if (ret == 0)
        ret = act_explain_no_change(st, id, -EBUSY, "cannot move it", err);

cleanup:
    pthread_mutex_unlock(&st->lock);
    return ret < 0 ? ret : 0;
}

int store_activation_set_receipt(struct lb_store *st, const char *id, const char *receipt_json,
                                 struct lb_error *err)
{
    sqlite3_stmt *s;
    int ret;

    if (!id)
        return lb_error_set(err, -EINVAL, "store: no activation id");
    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_ACT_SET_RECEIPT];
    if (bind_text(s, 1, id) || bind_text(s, 2, receipt_json) ||
        sqlite3_bind_int64(s, 3, clock_now_s())) {
        ret = db_fail(st, err, "binding an activation receipt");
        stmt_done(s);
        goto cleanup;
    }
    ret = step_write(st, s, "storing an activation receipt", err);
    if (ret == 0)
        ret = lb_error_set(err, -ENOENT, "no activation %s", id);

cleanup:
    pthread_mutex_unlock(&st->lock);
    return ret < 0 ? ret : 0;
}

int store_activation_set_capture(struct lb_store *st, const char *id, const char *artifacts_json,
                                 const char *capture_error, const void *log, size_t log_len,
                                 int64_t output_log_bytes, struct lb_error *err)
{
    sqlite3_stmt *s;
    int ret;

    if (!id || !artifacts_json)
        return lb_error_set(err, -EINVAL, "store: a capture needs an id and artifacts");
    ret = fault_hit("store.write", 0, err);
    if (ret < 0)
        return ret;
    pthread_mutex_lock(&st->lock);
    s = st->stmts[STMT_ACT_SET_CAPTURE];
    if (bind_text(s, 1, id) || bind_text(s, 2, artifacts_json) || bind_text(s, 3, capture_error) ||
        (log ? sqlite3_bind_blob64(s, 4, log, log_len, SQLITE_STATIC) : sqlite3_bind_null(s, 4)) ||
        (output_log_bytes >= 0 ? sqlite3_bind_int64(s, 5, output_log_bytes)
                               : sqlite3_bind_null(s, 5)) ||
        sqlite3_bind_int64(s, 6, clock_now_s())) {
        ret = db_fail(st, err, "binding an activation capture");
        stmt_done(s);
        goto cleanup;
    }
    ret = step_write(st, s, "storing an activation capture", err);
    if (ret == 0)
        ret = act_explain_no_change(st, id, -EALREADY, "its artifacts were collected already", err);

cleanup:
    pthread_mutex_unlock(&st->lock);
    return ret < 0 ? ret : 0;
}
