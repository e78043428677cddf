/*
 * store.c - the store's connection (see store.h): open, configure, migrate and close the
 * database, its prepared statements, and the statement helpers every file of the store uses
 * (with the write step, which spends the space reserve for a stop's record). A base: it calls
 * no other file of the store.
 * Sandbox records are read and written in records.c, warm pools in store_warm.c, the space
 * reserve in reserve.c and harness activations in activations.c.
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
#include "store/store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "util/clock.h"
#include "util/fault.h"
#include "util/log.h"

#define BUSY_TIMEOUT_MS 5000

/* The sandboxes table's columns from spec_json to stop_reason, as migration 1 made them
 * (migration 3 makes the table again with them). */
#define SANDBOXES_RECORD_COLUMNS_V1                                                                \
    "  spec_json TEXT,"                                                                            \
    "  descriptor_json TEXT,"                                                                      \
    "  token_hash TEXT,"                                                                           \
    "  created_at INTEGER NOT NULL,"                                                               \
    "  expires_at INTEGER,"                                                                        \
    "  stop_attempts INTEGER NOT NULL DEFAULT 0,"                                                  \
    "  next_attempt_at INTEGER,"                                                                   \
    "  last_error TEXT,"                                                                           \
    "  stop_reason TEXT,"

/* The activations table as migration 2 made it, and its indexes: migration 3 makes them again
 * after it has made the sandboxes table anew. */
#define ACTIVATIONS_TABLE_V2                                                                       \
    "CREATE TABLE activations ("                                                                   \
    "  id TEXT PRIMARY KEY,"                                                                       \
    "  rsid TEXT NOT NULL,"                                                                        \
    "  sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,"                      \
    "  state TEXT NOT NULL CHECK (state IN ('staging', 'running', 'closing', 'closed')),"          \
    "  spec_json TEXT,"                                                                            \
    "  receipt_json TEXT,"                                                                         \
    "  artifacts_json TEXT,"                                                                       \
    "  capture_error TEXT,"                                                                        \
    "  output_log BLOB,"                                                                           \
    "  output_log_bytes INTEGER,"                                                                  \
    "  created_at INTEGER NOT NULL,"                                                               \
    "  updated_at INTEGER NOT NULL"                                                                \
    ");"

#define ACTIVATIONS_INDEXES_V2                                                                     \
    "CREATE UNIQUE INDEX activations_sandbox ON activations (sandbox_id);"                         \
    "CREATE INDEX activations_rsid ON activations (rsid, created_at);"

/* The sandboxes table's indexes as migration 1 made them (migration 3 makes them again). */
#define SANDBOXES_INDEXES_V1                                                                       \
    "CREATE UNIQUE INDEX sandboxes_live_rsid ON sandboxes (rsid)"                                  \
    "  WHERE state IN ('starting', 'lent');"                                                       \
    "CREATE INDEX sandboxes_token_hash ON sandboxes (token_hash);"                                 \
    "CREATE INDEX sandboxes_state ON sandboxes (state);"                                           \
    "CREATE INDEX sandboxes_state_next_attempt ON sandboxes (state, next_attempt_at);"

/*
 * Schema migrations: migrations[i] takes the database from user_version i to i + 1. Append only;
 * never edit one that has shipped.
 * The shared parts above stand one a line (clang-format would run them together).
 */
/* clang-format off */
static const char *const migrations[] = {
    /* 1: sandbox records. */
    "CREATE TABLE sandboxes ("
    "  id TEXT PRIMARY KEY,"
    "  rsid TEXT,"
    "  task_id TEXT,"
    "  provider TEXT NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('starting', 'lent', 'stopping', 'stopped',"
    "                                      'failed_seed', 'stop_failed')),"
    SANDBOXES_RECORD_COLUMNS_V1
    "  updated_at INTEGER NOT NULL"
    ");"
    /* Invariant 2: one live sandbox per resources session. */
    SANDBOXES_INDEXES_V1,
    /* 2: harness activations, one per lent sandbox, gone with its sandbox record. */
    ACTIVATIONS_TABLE_V2
    ACTIVATIONS_INDEXES_V2,
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
    SANDBOXES_RECORD_COLUMNS_V1
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
    ACTIVATIONS_TABLE_V2
    "INSERT INTO activations SELECT * FROM activations_v3_copy ORDER BY rowid;"
    "DROP TABLE activations_v3_copy;"
    ACTIVATIONS_INDEXES_V2
    SANDBOXES_INDEXES_V1
    "CREATE INDEX sandboxes_warm ON sandboxes (pool_class, created_at) WHERE state = 'warm';",
    /* 4: snapshots under way (src/store/store_snapshots.c): a row from before the capture
     * until the image is named or discarded; one left at start-up was interrupted. */
    "CREATE TABLE snapshots ("
    "  name TEXT PRIMARY KEY,"
    "  sandbox_id TEXT NOT NULL,"
    "  state TEXT NOT NULL CHECK (state IN ('capturing')),"
    "  was_paused INTEGER NOT NULL,"
    "  created_at INTEGER NOT NULL"
    ");",
    /* 5: a seed's files (src/store/store_seed_files.c), kept so that a reset can write them
     * again; dropped once their sandbox is stopped (nothing resets it then), and gone with its
     * record. */
    "CREATE TABLE seed_files ("
    "  sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,"
    "  idx INTEGER NOT NULL,"
    "  path TEXT NOT NULL,"
    "  mode INTEGER NOT NULL,"
    "  data BLOB NOT NULL,"
    "  PRIMARY KEY (sandbox_id, idx)"
    ");"
    "CREATE TRIGGER seed_files_stopped AFTER UPDATE OF state ON sandboxes"
    "  WHEN NEW.state = 'stopped' BEGIN"
    "  DELETE FROM seed_files WHERE sandbox_id = NEW.id;"
    "  END;",
    /* 6: the event feed (src/store/events.c): one row per state change, written in its
     * transaction; seq never reused (AUTOINCREMENT), pruned by age and count. */
    "CREATE TABLE events ("
    "  seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  time INTEGER NOT NULL,"
    "  type TEXT NOT NULL,"
    "  sandbox_id TEXT,"
    "  rsid TEXT,"
    "  task_id TEXT,"
    "  labels_json TEXT,"
    "  data_json TEXT"
    ");"
    "CREATE INDEX events_sandbox ON events (sandbox_id, seq);"
    "CREATE INDEX events_rsid ON events (rsid, seq);"
    "CREATE INDEX events_time ON events (time);",
};
/* clang-format on */

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
    /* a renewal: only a lent sandbox whose TTL has not passed (an expired one is the
     * sweeper's to stop) */
    [STMT_SET_EXPIRES] = "UPDATE sandboxes SET expires_at = ?2, updated_at = ?3 "
                         "WHERE id = ?1 AND state = 'lent' AND "
                         "(expires_at IS NULL OR expires_at = 0 OR expires_at > ?3)",
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
    /* the id alone: what an operate token's request binds to, without loading the texts */
    [STMT_ACT_ID_SANDBOX] = "SELECT id FROM activations WHERE sandbox_id = ?1",
    [STMT_ACT_ID_LATEST] = "SELECT id FROM activations WHERE rsid = ?1 "
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
    /* an event's row (events.c, store_append_event), derived from the sandbox's record: its
     * session, task and labels as they are now; a sandbox of a warm pool that no session took
     * (no rsid) writes none. ?3 data, ?4: also set data.reason from the record's stop_reason. */
    [STMT_EVENT_INSERT] =
        "INSERT INTO events (time, type, sandbox_id, rsid, task_id, labels_json, data_json) "
        "SELECT ?1, ?2, s.id, s.rsid, s.task_id, "
        "CASE WHEN json_valid(s.spec_json) THEN json_extract(s.spec_json, '$.labels') END, "
        "CASE WHEN ?4 THEN json_set(COALESCE(?3, '{}'), '$.reason', s.stop_reason) "
        "ELSE COALESCE(?3, '{}') END "
        "FROM sandboxes s WHERE s.id = ?5 AND (s.rsid IS NOT NULL OR s.pool_class IS NULL)",
};

/* ---- statement helpers ---- */

/* Map the connection's last failure to an errno and a message. Call with the lock held. */
int store_db_fail(struct lb_store *st, struct lb_error *err, const char *what)
{
    int rc = sqlite3_errcode(st->db);
    int code = rc == SQLITE_NOMEM ? -ENOMEM : store_rc_is_full(st, rc) ? -ENOSPC : -EIO;

    return lb_error_set(err, code, "store: %s: %s", what, sqlite3_errmsg(st->db));
}

int store_count_sql(struct lb_store *st, const char *sql, const char *const texts[], size_t n_texts,
                    const int64_t *num, const char *what, int64_t *out, struct lb_error *err)
{
    sqlite3_stmt *s = NULL;
    bool bad;
    int ret = 0;

    *out = 0;
    pthread_mutex_lock(&st->lock);
    bad = sqlite3_prepare_v2(st->db, sql, -1, &s, NULL) != SQLITE_OK;
    for (size_t i = 0; !bad && i < n_texts; i++)
        bad = sqlite3_bind_text(s, (int)i + 1, texts[i], -1, SQLITE_TRANSIENT) != SQLITE_OK;
    if (!bad && num)
        bad = sqlite3_bind_int64(s, (int)n_texts + 1, *num) != SQLITE_OK;
    if (bad || sqlite3_step(s) != SQLITE_ROW)
        ret = store_db_fail(st, err, what);
    else
        *out = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    pthread_mutex_unlock(&st->lock);
    return ret;
}

void store_stmt_done(sqlite3_stmt *s)
{
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
}

/* Text parameter; NULL binds SQL NULL. The value must outlive the step (SQLITE_STATIC). */
int store_bind_text(sqlite3_stmt *s, int i, const char *v)
{
    return sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC);
}

/* A time where 0 means "none": stored as SQL NULL. */
int store_bind_time(sqlite3_stmt *s, int i, int64_t t)
{
    return t ? sqlite3_bind_int64(s, i, t) : sqlite3_bind_null(s, i);
}

int store_col_dup(sqlite3_stmt *s, int col, char **out)
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
int store_col_copy(sqlite3_stmt *s, int col, char *dst, size_t cap)
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

bool store_fits(const char *s, size_t cap)
{
    return strnlen(s, cap) < cap;
}

/* Step a bound UPDATE/DELETE (stop: a stop's record, which may spend the reserve). Returns the
 * number of rows changed, or a negative errno. Call with the lock held; resets the statement. */
int store_step_write_ex(struct lb_store *st, sqlite3_stmt *s, bool stop, const char *what,
                        struct lb_error *err)
{
    int ret;

    if (store_step_writing(st, s, stop) == SQLITE_DONE)
        ret = sqlite3_changes(st->db);
    else
        ret = store_db_fail(st, err, what);
    store_stmt_done(s);
    return ret;
}

int store_step_write(struct lb_store *st, sqlite3_stmt *s, const char *what, struct lb_error *err)
{
    return store_step_write_ex(st, s, false, what, err);
}

/* The connection runs at synchronous = NORMAL: a commit is in the WAL (safe from a daemon
 * crash) but fsync waits for a checkpoint. The commit that hands out a lease is made at FULL,
 * which syncs the WAL, so the lease and every record written before it are on disk before the
 * lease is returned (docs/operations.md, "Durability"). Lock held. */
void store_sync_full(struct lb_store *st, bool on)
{
    (void)sqlite3_exec(st->db, on ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL",
                       NULL, NULL, NULL);
}

/* see store.h. The WAL's frames are written with write(2) at every commit; an fsync of any
 * descriptor of the file flushes them (the one SQLite itself syncs at FULL). The connection is in
 * WAL mode from its open, so a lease committed at NORMAL is in the WAL (or, after a checkpoint,
 * in the database file, which the checkpoint synced): a missing WAL is an error, not a reason
 * to sync something else. */
int store_sync(struct lb_store *st, struct lb_error *err)
{
    unsigned long long want, done;
    char path[4096];
    int fd, r;

    /* the count as of the last commit (store_mark_lent counts under this lock) */
    pthread_mutex_lock(&st->lock);
    want = atomic_load(&st->unsynced_leases);
    pthread_mutex_unlock(&st->lock);
    if (want == atomic_load(&st->synced_leases))
        return 0; /* nothing committed unsynced since the last sync */
    if (atomic_load(&st->sync_broken))
        return lb_error_set(err, -EIO,
                            "store: an earlier fsync of the database failed; leases can no longer "
                            "be made durable (restart lendboxd)");
    r = fault_hit("store.sync", 0, err);
    if (r < 0)
        goto broken;
    if (snprintf(path, sizeof(path), "%s-wal", st->path) >= (int)sizeof(path))
        return lb_error_set(err, -ENAMETOOLONG, "store: database path too long");
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        r = lb_error_set(err, -errno, "store: cannot open %s to sync it: %s", path,
                         strerror(errno));
        goto broken;
    }
    if (fsync(fd) < 0)
        r = lb_error_set(err, -errno, "store: fsync of %s: %s", path, strerror(errno));
    close(fd);
    if (r < 0)
        goto broken;
    /* every lease counted before the fsync is on disk: raise the mark (never lower it) */
    done = atomic_load(&st->synced_leases);
    while (done < want && !atomic_compare_exchange_weak(&st->synced_leases, &done, want))
        ;
    return 0;
broken:
    /* after a failed fsync the kernel may have dropped the dirty pages and a later fsync would
     * report success for frames that never reached the disk: no lease is said durable again */
    atomic_store(&st->sync_broken, true);
    log_error("store: %s; no more leases can be made durable until lendboxd is restarted",
              err ? err->message : "fsync failed");
    return r;
}

bool store_sync_pending(struct lb_store *st)
{
    return atomic_load(&st->unsynced_leases) != atomic_load(&st->synced_leases);
}

/* ---- stepping a write, and spending the space reserve for a stop's (reserve.c makes it) ---- */

/* Did a step fail for lack of space? Call with the lock held. */
bool store_rc_is_full(struct lb_store *st, int rc)
{
    return (rc & 0xff) == SQLITE_FULL ||
           ((rc & 0xff) == SQLITE_IOERR && sqlite3_system_errno(st->db) == ENOSPC);
}

/* Give the reserve's space back to the file system. false if there was none to give. Call with
 * the lock held. */
bool store_reserve_spend(struct lb_store *st)
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
int store_step_writing(struct lb_store *st, sqlite3_stmt *s, bool stop)
{
    int rc = sqlite3_step(s);

    if (stop && store_rc_is_full(st, rc) && store_reserve_spend(st)) {
        sqlite3_reset(s); /* bindings stay */
        rc = sqlite3_step(s);
    }
    if (rc == SQLITE_DONE)
        atomic_store(&st->write_failed, false);
    else if (store_rc_is_full(st, rc) || (rc & 0xff) == SQLITE_IOERR ||
             (rc & 0xff) == SQLITE_READONLY)
        atomic_store(&st->write_failed, true);
    return rc;
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

int store_exec_sql(struct lb_store *st, const char *sql, const char *what, struct lb_error *err)
{
    if (sqlite3_exec(st->db, sql, NULL, NULL, NULL) != SQLITE_OK)
        return store_db_fail(st, err, what);
    return 0;
}

static int configure(struct lb_store *st, const char *path, struct lb_error *err)
{
    sqlite3_stmt *s = NULL;
    const char *mode;
    int ret = 0;

    if (sqlite3_busy_timeout(st->db, BUSY_TIMEOUT_MS) != SQLITE_OK)
        return store_db_fail(st, err, "busy_timeout");
    if (sqlite3_prepare_v2(st->db, "PRAGMA journal_mode = WAL", -1, &s, NULL) != SQLITE_OK ||
        sqlite3_step(s) != SQLITE_ROW) {
        ret = store_db_fail(st, err, "journal_mode=WAL");
        goto cleanup;
    }
    mode = (const char *)sqlite3_column_text(s, 0);
    if (!mode || strcasecmp(mode, "wal") != 0) {
        ret = lb_error_set(err, -EIO, "store: %s: cannot enable WAL mode (journal mode is %s)",
                           path, mode ? mode : "unknown");
        goto cleanup;
    }
    ret = store_exec_sql(st, "PRAGMA synchronous = NORMAL", "synchronous=NORMAL", err);
    if (ret == 0)
        ret = store_exec_sql(st, "PRAGMA foreign_keys = ON", "foreign_keys=ON", err);

cleanup:
    sqlite3_finalize(s);
    return ret;
}

int store_read_user_version(struct lb_store *st, int *out, struct lb_error *err)
{
    sqlite3_stmt *s = NULL;
    int ret = 0;

    if (sqlite3_prepare_v2(st->db, "PRAGMA user_version", -1, &s, NULL) != SQLITE_OK ||
        sqlite3_step(s) != SQLITE_ROW) {
        ret = store_db_fail(st, err, "reading user_version");
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

    ret = store_read_user_version(st, &version, err);
    if (ret < 0)
        return ret;
    if (version > known)
        return too_new(path, version, err);
    while (version < known) {
        ret = store_exec_sql(st, "BEGIN IMMEDIATE", "beginning a migration", err);
        if (ret < 0)
            goto cleanup;
        in_txn = true;
        ret = store_read_user_version(st, &version, err);
        if (ret < 0)
            goto cleanup;
        if (version > known) {
            ret = too_new(path, version, err);
            goto cleanup;
        }
        if (version == known)
            break;
        ret = store_exec_sql(st, migrations[version], "applying a migration", err);
        if (ret < 0)
            goto cleanup;
        snprintf(sql, sizeof(sql), "PRAGMA user_version = %d", version + 1);
        ret = store_exec_sql(st, sql, "setting user_version", err);
        if (ret < 0)
            goto cleanup;
        ret = store_exec_sql(st, "COMMIT", "committing a migration", err);
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
    atomic_store(&st->events_on, true);
    st->events_max_age_s = 7 * 24 * 3600;
    st->events_max_count = 1000000;
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
            ret = store_db_fail(st, err, "preparing a statement");
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
