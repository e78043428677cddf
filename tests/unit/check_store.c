/* check_store.c - unit tests for src/store (SQLite sandbox records). */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "store/store.h"
#include "store/store_internal.h"
#include "util/clock.h"
#include "util/fault.h"

static char tmpdir[64];
static char dbpath[128];

static void setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/check_store.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(dbpath, sizeof(dbpath), "%s/lendbox.db", tmpdir);
}

static void teardown(void)
{
    static const char *const suffixes[] = {"", "-wal", "-shm", "-journal", ".reserve"};
    char p[160];

    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
        snprintf(p, sizeof(p), "%s%s", dbpath, suffixes[i]);
        unlink(p);
    }
    rmdir(tmpdir);
}

static struct lb_store *open_store(void)
{
    struct lb_error err = {0};
    struct lb_store *st = NULL;
    int ret = store_open(dbpath, &st, &err);

    ck_assert_msg(ret == 0, "store_open: %d %s", ret, err.message);
    ck_assert_ptr_nonnull(st);
    return st;
}

/* A minimal record: only what NOT NULL columns need. */
static struct lb_record mkrec(const char *id, const char *rsid)
{
    struct lb_record r = {0};

    snprintf(r.id, sizeof(r.id), "%s", id);
    r.rsid = (char *)rsid;
    r.provider = "local";
    r.state = LB_STATE_STARTING;
    return r;
}

static void insert_ok(struct lb_store *st, const struct lb_record *r)
{
    struct lb_error err = {0};
    int ret = store_insert_sandbox(st, r, 0, &err);

    ck_assert_msg(ret == 0, "insert %s: %d %s", r->id, ret, err.message);
}

/* Run one query on a second, raw connection and return the first column of the first row. */
static int64_t raw_int(const char *sql)
{
    sqlite3 *db = NULL;
    sqlite3_stmt *s = NULL;
    int64_t v;

    ck_assert_int_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    ck_assert_msg(sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK, "%s: %s", sql,
                  sqlite3_errmsg(db));
    ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
    v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
}

static void raw_exec(const char *sql)
{
    sqlite3 *db = NULL;

    ck_assert_int_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL),
                     SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    ck_assert_msg(sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK, "%s: %s", sql,
                  sqlite3_errmsg(db));
    sqlite3_close(db);
}

static enum lb_record_state state_of(struct lb_store *st, const char *id)
{
    struct lb_error err = {0};
    struct lb_record r;
    enum lb_record_state s;

    ck_assert_int_eq(store_get_sandbox(st, id, &r, &err), 0);
    s = r.state;
    store_record_release(&r);
    return s;
}

START_TEST(test_state_names)
{
    enum lb_record_state s;

    for (int i = LB_STATE_STARTING; i < LB_STATE_COUNT; i++) {
        ck_assert_int_eq(store_state_parse(store_state_name((enum lb_record_state)i), &s), 0);
        ck_assert_int_eq((int)s, i);
    }
    ck_assert_str_eq(store_state_name(LB_STATE_FAILED_SEED), "failed_seed");
    ck_assert_int_eq(store_state_parse("bogus", &s), -EINVAL);
    ck_assert_int_eq(store_state_parse(NULL, &s), -EINVAL);
}
END_TEST

START_TEST(test_open_close_reopen)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record r = mkrec("sbx-1", "rs-1"), got;

    insert_ok(st, &r);
    store_close(st);
    st = open_store();
    ck_assert_int_eq(store_get_sandbox(st, "sbx-1", &got, &err), 0);
    ck_assert_str_eq(got.rsid, "rs-1");
    store_record_release(&got);
    store_close(st);
    store_close(NULL);
}
END_TEST

/* A snapshot under way: recorded once per name, listed until it ends, ends once. */
START_TEST(test_seed_files_kept)
{
    struct lb_store *st = open_store();
    struct lb_record a = mkrec("sbx-sf", "rs-sf");
    struct lb_store_file in[2] = {{"/workspace/a", (unsigned char *)"x\0y", 3, 0600},
                                  {"/workspace/empty", (unsigned char *)"", 0, -1}};
    struct lb_store_file *out = NULL;
    struct lb_error err = {0};
    size_t n = 9;

    ck_assert_int_eq(store_seed_files_get(st, "sbx-sf", &out, &n, &err), 0);
    ck_assert_ptr_null(out);
    ck_assert_uint_eq(n, 0);
    /* no record: the foreign key refuses the rows */
    ck_assert_int_eq(store_seed_files_put(st, "sbx-sf", in, 2, &err), -ENOENT);
    insert_ok(st, &a);
    ck_assert_int_eq(store_seed_files_put(st, "sbx-sf", in, 2, &err), 0);
    ck_assert_int_eq(store_seed_files_get(st, "sbx-sf", &out, &n, &err), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(out[0].path, "/workspace/a");
    ck_assert_uint_eq(out[0].len, 3);
    ck_assert_int_eq(memcmp(out[0].data, "x\0y", 3), 0);
    ck_assert_int_eq(out[0].mode, 0600);
    ck_assert_str_eq(out[1].path, "/workspace/empty");
    ck_assert_uint_eq(out[1].len, 0);
    ck_assert_int_eq(out[1].mode, -1);
    store_seed_files_free(out, n);
    /* a put replaces what was kept */
    ck_assert_int_eq(store_seed_files_put(st, "sbx-sf", in + 1, 1, &err), 0);
    ck_assert_int_eq(store_seed_files_get(st, "sbx-sf", &out, &n, &err), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(out[0].path, "/workspace/empty");
    store_seed_files_free(out, n);
    /* dropped once the sandbox is stopped; and none outlives its record */
    ck_assert_int_eq(store_mark_stopped(st, "sbx-sf", "released", &err), 0);
    ck_assert_int_eq(raw_int("SELECT COUNT(*) FROM seed_files"), 0);
    ck_assert_int_eq(store_seed_files_put(st, "sbx-sf", in, 2, &err), 0);
    ck_assert_int_ge(store_purge_stopped(st, INT64_MAX, &err), 1);
    ck_assert_int_eq(raw_int("SELECT COUNT(*) FROM seed_files"), 0);
    store_close(st);
}
END_TEST

START_TEST(test_snapshot_records)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    json_t *rows = NULL;

    ck_assert_int_eq(store_snapshot_begin(st, "snap-a", "sbx-1", false, &err), 0);
    ck_assert_int_eq(store_snapshot_begin(st, "snap-b", "sbx-2", true, &err), 0);
    ck_assert_int_eq(store_snapshot_begin(st, "snap-a", "sbx-3", false, &err), -EEXIST);
    ck_assert_int_eq(store_snapshots_pending(st, &rows, &err), 0);
    ck_assert_int_eq(json_array_size(rows), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *r = json_array_get(rows, i);
        bool a = strcmp(json_string_value(json_object_get(r, "name")), "snap-a") == 0;

        ck_assert_str_eq(json_string_value(json_object_get(r, "sandbox_id")),
                         a ? "sbx-1" : "sbx-2");
        ck_assert(json_is_true(json_object_get(r, "was_paused")) == !a);
    }
    json_decref(rows);
    ck_assert_int_eq(store_snapshot_end(st, "snap-a", &err), 0);
    ck_assert_int_eq(store_snapshot_end(st, "snap-a", &err), 0); /* none: no error */
    ck_assert_int_eq(store_snapshots_pending(st, &rows, &err), 0);
    ck_assert_int_eq(json_array_size(rows), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(rows, 0), "name")), "snap-b");
    json_decref(rows);
    store_close(st);
}
END_TEST

START_TEST(test_migration_sets_user_version)
{
    struct lb_store *st = open_store();

    ck_assert_int_eq(raw_int("PRAGMA user_version"), 6);
    ck_assert_int_eq(raw_int("SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND "
                             "name IN ('sandboxes_live_rsid', 'sandboxes_token_hash', "
                             "'sandboxes_state', 'sandboxes_state_next_attempt', "
                             "'sandboxes_warm', 'activations_sandbox', 'activations_rsid')"),
                     7);
    ck_assert_int_eq(raw_int("SELECT COUNT(*) FROM pragma_journal_mode WHERE "
                             "journal_mode = 'wal'"),
                     1);
    store_close(st);
    /* Reopening an up-to-date database applies nothing and keeps the version. */
    st = open_store();
    store_close(st);
    ck_assert_int_eq(raw_int("PRAGMA user_version"), 6);
}
END_TEST

START_TEST(test_too_new_schema_refused)
{
    struct lb_error err = {0};
    struct lb_store *st = (struct lb_store *)&err; /* must be reset to NULL */

    raw_exec("PRAGMA user_version = 99");
    ck_assert_int_eq(store_open(dbpath, &st, &err), -EIO);
    ck_assert_ptr_null(st);
    ck_assert_int_eq(err.code, -EIO);
    ck_assert_msg(strstr(err.message, "database schema version 99 is newer than this lendboxd "
                                      "supports") != NULL,
                  "message: %s", err.message);
    ck_assert_int_eq(raw_int("PRAGMA user_version"), 99);
}
END_TEST

START_TEST(test_round_trip_every_field)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record r = {0}, got;
    int64_t before = clock_now_s();

    snprintf(r.id, sizeof(r.id), "sbx-full");
    r.rsid = "rs-full";
    r.task_id = "task-7";
    r.provider = "docker";
    r.state = LB_STATE_STARTING;
    r.spec_json = "{\"image\":\"host\"}";
    r.descriptor_json = "{\"pid\":42}";
    memset(r.token_hash, 'a', LB_TOKEN_HASH_HEX);
    r.created_at = 1700000000;
    r.expires_at = 1700003600;
    r.updated_at = 5; /* ignored: the store sets it */
    r.stop_attempts = 3;
    r.next_attempt_at = 1700000100;
    r.last_error = "boom";
    r.stop_reason = "ttl";
    insert_ok(st, &r);

    ck_assert_int_eq(store_get_sandbox(st, "sbx-full", &got, &err), 0);
    ck_assert_str_eq(got.id, "sbx-full");
    ck_assert_str_eq(got.rsid, "rs-full");
    ck_assert_str_eq(got.task_id, "task-7");
    ck_assert_str_eq(got.provider, "docker");
    ck_assert_int_eq(got.state, LB_STATE_STARTING);
    ck_assert_str_eq(got.spec_json, "{\"image\":\"host\"}");
    ck_assert_str_eq(got.descriptor_json, "{\"pid\":42}");
    ck_assert_str_eq(got.token_hash, r.token_hash);
    ck_assert_int_eq(strlen(got.token_hash), LB_TOKEN_HASH_HEX);
    ck_assert_int_eq(got.created_at, 1700000000);
    ck_assert_int_eq(got.expires_at, 1700003600);
    ck_assert_int_ge(got.updated_at, before);
    ck_assert_int_le(got.updated_at, clock_now_s());
    ck_assert_int_eq(got.stop_attempts, 3);
    ck_assert_int_eq(got.next_attempt_at, 1700000100);
    ck_assert_str_eq(got.last_error, "boom");
    ck_assert_str_eq(got.stop_reason, "ttl");
    store_record_release(&got);
    store_record_release(&got); /* idempotent */

    /* The minimal record: NULL columns come back as NULL pointers, "" and 0. */
    r = mkrec("sbx-min", NULL);
    insert_ok(st, &r);
    ck_assert_int_eq(store_get_sandbox(st, "sbx-min", &got, &err), 0);
    ck_assert_ptr_null(got.rsid);
    ck_assert_ptr_null(got.task_id);
    ck_assert_str_eq(got.provider, "local");
    ck_assert_ptr_null(got.spec_json);
    ck_assert_ptr_null(got.descriptor_json);
    ck_assert_str_eq(got.token_hash, "");
    ck_assert_int_ge(got.created_at, before); /* 0 means "now" */
    ck_assert_int_eq(got.expires_at, 0);
    ck_assert_int_eq(got.stop_attempts, 0);
    ck_assert_int_eq(got.next_attempt_at, 0);
    ck_assert_ptr_null(got.last_error);
    ck_assert_ptr_null(got.stop_reason);
    store_record_release(&got);
    ck_assert_int_eq(raw_int("SELECT expires_at IS NULL AND next_attempt_at IS NULL AND "
                             "token_hash IS NULL FROM sandboxes WHERE id = 'sbx-min'"),
                     1);

    ck_assert_int_eq(store_get_sandbox(st, "sbx-none", &got, &err), -ENOENT);
    ck_assert_int_eq(err.code, -ENOENT);
    ck_assert_ptr_null(got.rsid);

    /* Malformed records are refused before SQL. */
    r = mkrec("sbx-bad", "rs-bad");
    r.provider = NULL;
    ck_assert_int_eq(store_insert_sandbox(st, &r, 0, &err), -EINVAL);
    r = mkrec("", "rs-bad");
    ck_assert_int_eq(store_insert_sandbox(st, &r, 0, &err), -EINVAL);
    r = mkrec("sbx-bad", "rs-bad");
    r.state = (enum lb_record_state)17;
    ck_assert_int_eq(store_insert_sandbox(st, &r, 0, &err), -EINVAL);
    store_close(st);
}
END_TEST

/* Every record names the provider that made its sandbox (a daemon with several providers
 * sends each later call there): the name survives every transition and a reopen, is what
 * lists return, and a record without one is refused. The column is in the first schema, so no
 * migration was needed for several providers. */
START_TEST(test_records_carry_provider)
{
    static const char *const ids[] = {"sbx-p1", "sbx-p2", "sbx-p3"};
    static const char *const provs[] = {"local", "fault", "docker"};
    struct lb_record_filter all = {.state = -1}, pending = {.state = -1, .pending_stop_only = true};
    struct lb_store *st = open_store();
    struct lb_error err = {0};
    struct lb_record got = {0}, *recs = NULL, bad = mkrec("sbx-p0", "rs-p0");
    size_t n = 0;

    for (int i = 0; i < 3; i++) {
        char rsid[16];
        struct lb_record r;

        snprintf(rsid, sizeof(rsid), "rs-p%d", i + 1);
        r = mkrec(ids[i], rsid);
        r.provider = (char *)provs[i];
        insert_ok(st, &r);
        ck_assert_int_eq(store_mark_lent(st, ids[i], "{}", "h", true, &err), 0);
    }
    ck_assert_int_eq(store_mark_stopping(st, "sbx-p2", "released", &err), 0);
    ck_assert_int_eq(store_mark_stop_failed(st, "sbx-p2", LB_STATE_STOP_FAILED, "down", 1, &err),
                     0);
    ck_assert_int_eq(store_mark_stopping(st, "sbx-p3", "released", &err), 0);
    ck_assert_int_eq(store_mark_stopped(st, "sbx-p3", NULL, &err), 0);
    store_close(st);
    st = open_store();
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(store_get_sandbox(st, ids[i], &got, &err), 0);
        ck_assert_str_eq(got.provider, provs[i]);
        store_record_release(&got);
    }
    ck_assert_int_eq(store_list_sandboxes(st, &pending, &recs, &n, &err), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(recs[0].id, "sbx-p2");
    ck_assert_str_eq(recs[0].provider, "fault");
    store_records_free(recs, n);
    ck_assert_int_eq(store_list_sandboxes(st, &all, &recs, &n, &err), 0);
    ck_assert_uint_eq(n, 3);
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 3; k++)
            if (!strcmp(recs[i].id, ids[k]))
                ck_assert_str_eq(recs[i].provider, provs[k]);
    store_records_free(recs, n);
    bad.provider = NULL;
    ck_assert_int_eq(store_insert_sandbox(st, &bad, 0, &err), -EINVAL);
    bad.provider = "";
    ck_assert_int_eq(store_insert_sandbox(st, &bad, 0, &err), -EINVAL);
    store_close(st);
}
END_TEST

START_TEST(test_one_live_per_rsid)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record a = mkrec("sbx-a", "rs-1"), b = mkrec("sbx-b", "rs-1"),
                     c = mkrec("sbx-c", "rs-1"), got;

    insert_ok(st, &a);
    ck_assert_int_eq(store_insert_sandbox(st, &b, 0, &err), -EEXIST);
    ck_assert_msg(strstr(err.message, "rs-1") && strstr(err.message, "live"), "%s", err.message);
    /* Same id, other session: the primary key. */
    a.rsid = "rs-2";
    ck_assert_int_eq(store_insert_sandbox(st, &a, 0, &err), -EEXIST);
    ck_assert_msg(strstr(err.message, "sbx-a") && strstr(err.message, "already exists"), "%s",
                  err.message);

    /* Lent is live too. */
    ck_assert_int_eq(store_mark_lent(st, "sbx-a", "{}", NULL, true, &err), 0);
    ck_assert_int_eq(store_insert_sandbox(st, &b, 0, &err), -EEXIST);
    /* stopping is not live (the record left the live set once a stop was intended). */
    ck_assert_int_eq(store_mark_stopping(st, "sbx-a", "released", &err), 0);
    ck_assert_int_eq(store_mark_stopped(st, "sbx-a", NULL, &err), 0);
    insert_ok(st, &b);
    ck_assert_int_eq(store_get_live_by_rsid(st, "rs-1", &got, &err), 0);
    ck_assert_str_eq(got.id, "sbx-b");
    store_record_release(&got);

    ck_assert_int_eq(
        store_mark_stop_failed(st, "sbx-b", LB_STATE_FAILED_SEED, "rollback failed", 0, &err), 0);
    insert_ok(st, &c);
    ck_assert_int_eq(store_get_live_by_rsid(st, "rs-1", &got, &err), 0);
    ck_assert_str_eq(got.id, "sbx-c");
    store_record_release(&got);
    ck_assert_int_eq(store_get_live_by_rsid(st, "rs-none", &got, &err), -ENOENT);

    /* Sandboxes lent to no session do not collide. */
    a = mkrec("sbx-n1", NULL);
    b = mkrec("sbx-n2", NULL);
    insert_ok(st, &a);
    insert_ok(st, &b);
    store_close(st);
}
END_TEST

START_TEST(test_transitions)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record r = mkrec("sbx-t", "rs-t"), got;
    char hash[LB_TOKEN_HASH_HEX + 1];

    memset(hash, 'f', LB_TOKEN_HASH_HEX);
    hash[LB_TOKEN_HASH_HEX] = '\0';
    insert_ok(st, &r);
    ck_assert_int_eq(store_set_descriptor(st, "sbx-t", "{\"pid\":1}", &err), 0);
    ck_assert_int_eq(state_of(st, "sbx-t"), LB_STATE_STARTING);

    ck_assert_int_eq(store_mark_lent(st, "sbx-t", "{\"pid\":2}", hash, true, &err), 0);
    ck_assert_int_eq(store_get_sandbox(st, "sbx-t", &got, &err), 0);
    ck_assert_int_eq(got.state, LB_STATE_LENT);
    ck_assert_str_eq(got.descriptor_json, "{\"pid\":2}");
    ck_assert_str_eq(got.token_hash, hash);
    store_record_release(&got);
    ck_assert_int_eq(store_get_live_by_rsid(st, "rs-t", &got, &err), 0);
    store_record_release(&got);

    ck_assert_int_eq(store_mark_stopping(st, "sbx-t", "released", &err), 0);
    ck_assert_int_eq(store_get_live_by_rsid(st, "rs-t", &got, &err), -ENOENT);
    /* No longer starting: cannot be lent again. */
    ck_assert_int_eq(store_mark_lent(st, "sbx-t", NULL, NULL, true, &err), -EBUSY);
    ck_assert_int_eq(state_of(st, "sbx-t"), LB_STATE_STOPPING);

    ck_assert_int_eq(store_mark_stopped(st, "sbx-t", NULL, &err), 0);
    ck_assert_int_eq(store_get_sandbox(st, "sbx-t", &got, &err), 0);
    ck_assert_int_eq(got.state, LB_STATE_STOPPED);
    ck_assert_str_eq(got.stop_reason, "released"); /* NULL kept the earlier reason */
    ck_assert_str_eq(got.descriptor_json, "{\"pid\":2}");
    store_record_release(&got);
    ck_assert_int_eq(store_mark_stopped(st, "sbx-t", "deleted", &err), 0);
    ck_assert_int_eq(store_get_sandbox(st, "sbx-t", &got, &err), 0);
    ck_assert_str_eq(got.stop_reason, "deleted");
    store_record_release(&got);

    /* Every transition on a missing id is -ENOENT. */
    ck_assert_int_eq(store_mark_lent(st, "sbx-x", NULL, NULL, true, &err), -ENOENT);
    ck_assert_int_eq(err.code, -ENOENT);
    ck_assert_int_eq(store_set_descriptor(st, "sbx-x", "{}", &err), -ENOENT);
    ck_assert_int_eq(store_mark_stopping(st, "sbx-x", NULL, &err), -ENOENT);
    ck_assert_int_eq(store_mark_stopped(st, "sbx-x", NULL, &err), -ENOENT);
    ck_assert_int_eq(store_mark_stop_failed(st, "sbx-x", LB_STATE_STOP_FAILED, "e", 0, &err),
                     -ENOENT);
    ck_assert_int_eq(raw_int("SELECT COUNT(*) FROM sandboxes"), 1);
    store_close(st);
}
END_TEST

/* A lease committed without its own sync (a fork's or a seed_batch's) is lent at once and
 * pending; store_sync syncs it (and then has nothing to do); a durable one leaves nothing
 * pending. The fault point store.sync makes a sync fail, and the failure is sticky: a later
 * sync with something pending fails too (a failed fsync may have dropped the pages), while the
 * records stay as written. */
START_TEST(test_mark_lent_unsynced_then_sync)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record a = mkrec("sbx-s", "rs-s"), b = mkrec("sbx-t", "rs-t"),
                     c = mkrec("sbx-u", "rs-u"), got;
    char wal[600];
    struct stat sb;

    insert_ok(st, &a);
    ck_assert(!store_sync_pending(st));
    ck_assert_int_eq(store_mark_lent(st, "sbx-s", "{}", "hash", false, &err), 0);
    ck_assert(store_sync_pending(st));
    ck_assert_int_eq(store_get_sandbox(st, "sbx-s", &got, &err), 0);
    ck_assert_int_eq(got.state, LB_STATE_LENT);
    store_record_release(&got);
    /* the WAL is the file that holds it (and the one store_sync opens) */
    snprintf(wal, sizeof(wal), "%s-wal", dbpath);
    ck_assert_int_eq(stat(wal, &sb), 0);
    ck_assert_int_gt(sb.st_size, 0);
    ck_assert_int_eq(store_sync(st, &err), 0);
    ck_assert(!store_sync_pending(st));
    ck_assert_int_eq(fault_load("store.sync=fail", &err), 0);
    ck_assert_int_eq(store_sync(st, &err), 0); /* nothing pending: no fsync, no fault */
    insert_ok(st, &b);
    ck_assert_int_eq(store_mark_lent(st, "sbx-t", "{}", "hash", true, &err), 0);
    ck_assert(!store_sync_pending(st)); /* durable by its own commit */
    insert_ok(st, &c);
    ck_assert_int_eq(store_mark_lent(st, "sbx-u", "{}", "hash", false, &err), 0);
    ck_assert_int_eq(store_sync(st, &err), -EIO);
    ck_assert_msg(strstr(err.message, "store.sync"), "%s", err.message);
    fault_reset();
    ck_assert_int_eq(store_sync(st, &err), -EIO); /* sticky */
    ck_assert_msg(strstr(err.message, "restart lendboxd"), "%s", err.message);
    ck_assert(store_sync_pending(st));
    ck_assert_int_eq(store_get_sandbox(st, "sbx-u", &got, &err), 0);
    ck_assert_int_eq(got.state, LB_STATE_LENT);
    store_record_release(&got);
    store_close(st);
}
END_TEST

START_TEST(test_updated_at_on_write)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record r = mkrec("sbx-u", "rs-u"), got;

    insert_ok(st, &r);
    raw_exec("UPDATE sandboxes SET updated_at = 1");
    ck_assert_int_eq(store_mark_lent(st, "sbx-u", NULL, NULL, true, &err), 0);
    ck_assert_int_eq(store_get_sandbox(st, "sbx-u", &got, &err), 0);
    ck_assert_int_gt(got.updated_at, 1000);
    store_record_release(&got);
    store_close(st);
}
END_TEST

START_TEST(test_stop_failed)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record r = mkrec("sbx-f", "rs-f"), got;

    insert_ok(st, &r);
    ck_assert_int_eq(store_mark_stopping(st, "sbx-f", "released", &err), 0);
    ck_assert_int_eq(
        store_mark_stop_failed(st, "sbx-f", LB_STATE_STOP_FAILED, "kill: EPERM", 1000, &err), 0);
    ck_assert_int_eq(store_get_sandbox(st, "sbx-f", &got, &err), 0);
    ck_assert_int_eq(got.state, LB_STATE_STOP_FAILED);
    ck_assert_int_eq(got.stop_attempts, 1);
    ck_assert_str_eq(got.last_error, "kill: EPERM");
    ck_assert_int_eq(got.next_attempt_at, 1000);
    ck_assert_str_eq(got.stop_reason, "released");
    store_record_release(&got);

    ck_assert_int_eq(store_mark_stopping(st, "sbx-f", NULL, &err), 0);
    ck_assert_int_eq(
        store_mark_stop_failed(st, "sbx-f", LB_STATE_STOP_FAILED, "timed out", 2000, &err), 0);
    ck_assert_int_eq(store_get_sandbox(st, "sbx-f", &got, &err), 0);
    ck_assert_int_eq(got.stop_attempts, 2);
    ck_assert_str_eq(got.last_error, "timed out");
    ck_assert_int_eq(got.next_attempt_at, 2000);
    store_record_release(&got);

    ck_assert_int_eq(store_mark_stop_failed(st, "sbx-f", LB_STATE_LENT, "x", 0, &err), -EINVAL);
    ck_assert_int_eq(store_mark_stop_failed(st, "sbx-f", LB_STATE_FAILED_SEED, "x", 0, &err), 0);
    ck_assert_int_eq(raw_int("SELECT next_attempt_at IS NULL AND stop_attempts = 3 "
                             "FROM sandboxes WHERE id = 'sbx-f'"),
                     1);
    /* stopped clears the retry schedule. */
    ck_assert_int_eq(store_mark_stop_failed(st, "sbx-f", LB_STATE_FAILED_SEED, "again", 3000, &err),
                     0);
    ck_assert_int_eq(store_mark_stopped(st, "sbx-f", NULL, &err), 0);
    ck_assert_int_eq(store_get_sandbox(st, "sbx-f", &got, &err), 0);
    ck_assert_int_eq(got.state, LB_STATE_STOPPED);
    ck_assert_int_eq(got.next_attempt_at, 0);
    ck_assert_int_eq(got.stop_attempts, 4);
    store_record_release(&got);
    store_close(st);
}
END_TEST

/* Insert a record with a given state and times (created_at orders the listing). */
static void put(struct lb_store *st, const char *id, const char *rsid, enum lb_record_state state,
                int64_t created, int64_t expires, int64_t next_attempt)
{
    struct lb_record r = mkrec(id, rsid);

    r.state = state;
    r.created_at = created;
    r.expires_at = expires;
    r.next_attempt_at = next_attempt;
    insert_ok(st, &r);
}

/* Assert that the listing holds exactly the ids in the space-separated list, in order. */
static void expect_ids(struct lb_store *st, const struct lb_record_filter *f, const char *want)
{
    struct lb_error err = {0};
    struct lb_record *recs = NULL;
    size_t n = 99;
    char got[512] = "";
    int ret = store_list_sandboxes(st, f, &recs, &n, &err);

    ck_assert_msg(ret == 0, "list: %d %s", ret, err.message);
    for (size_t i = 0; i < n; i++) {
        if (i)
            strcat(got, " ");
        strcat(got, recs[i].id);
    }
    store_records_free(recs, n);
    ck_assert_str_eq(got, want);
}

START_TEST(test_filters)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record_filter f;
    struct lb_record *recs = (struct lb_record *)&err;
    size_t n = 7;

    /* Inserted out of order to prove the ordering is by created_at. */
    put(st, "s3", "r3", LB_STATE_STOPPING, 300, 0, 0);
    put(st, "s1", "r1", LB_STATE_STARTING, 100, 0, 0);
    put(st, "s2", "r2", LB_STATE_LENT, 200, 500, 0);
    put(st, "s4", "r1", LB_STATE_STOP_FAILED, 400, 0, 1000);
    put(st, "s5", "r5", LB_STATE_FAILED_SEED, 500, 0, 2000);
    put(st, "s6", "r1", LB_STATE_STOPPED, 600, 0, 0);
    put(st, "s7", "r7", LB_STATE_LENT, 700, 5000, 0);
    put(st, "s8", NULL, LB_STATE_LENT, 800, 0, 0);

    expect_ids(st, NULL, "s1 s2 s3 s4 s5 s6 s7 s8");
    f = (struct lb_record_filter){.state = -1};
    expect_ids(st, &f, "s1 s2 s3 s4 s5 s6 s7 s8");
    f = (struct lb_record_filter){.state = -1, .rsid = "r1"};
    expect_ids(st, &f, "s1 s4 s6");
    f = (struct lb_record_filter){.state = LB_STATE_LENT};
    expect_ids(st, &f, "s2 s7 s8");
    f = (struct lb_record_filter){.state = LB_STATE_STOPPED, .rsid = "r1"};
    expect_ids(st, &f, "s6");
    f = (struct lb_record_filter){.state = -1, .live_only = true};
    expect_ids(st, &f, "s1 s2 s7 s8");
    f = (struct lb_record_filter){.state = -1, .live_only = true, .rsid = "r1"};
    expect_ids(st, &f, "s1");
    f = (struct lb_record_filter){.state = -1, .pending_stop_only = true};
    expect_ids(st, &f, "s3 s4 s5");
    /* due: no retry scheduled (s3) or scheduled at or before now. */
    f = (struct lb_record_filter){
        .state = -1, .pending_stop_only = true, .due_only = true, .now_s = 999};
    expect_ids(st, &f, "s3");
    f.now_s = 1000;
    expect_ids(st, &f, "s3 s4");
    f.now_s = 5000;
    expect_ids(st, &f, "s3 s4 s5");
    f = (struct lb_record_filter){.state = -1, .expired_only = true, .now_s = 499};
    expect_ids(st, &f, "");
    f.now_s = 500;
    expect_ids(st, &f, "s2");
    f.now_s = 100000;
    expect_ids(st, &f, "s2 s7"); /* s8 has no TTL */
    f = (struct lb_record_filter){.state = -1, .limit = 3};
    expect_ids(st, &f, "s1 s2 s3");
    f = (struct lb_record_filter){.state = -1, .pending_stop_only = true, .limit = 2};
    expect_ids(st, &f, "s3 s4");
    f = (struct lb_record_filter){.state = -1, .rsid = "nobody"};
    expect_ids(st, &f, "");
    /* A hostile rsid is a value, not SQL. */
    f = (struct lb_record_filter){.state = -1, .rsid = "r1' OR '1'='1"};
    expect_ids(st, &f, "");

    f = (struct lb_record_filter){.state = LB_STATE_COUNT};
    ck_assert_int_eq(store_list_sandboxes(st, &f, &recs, &n, &err), -EINVAL);
    ck_assert_ptr_null(recs);
    ck_assert_uint_eq(n, 0);
    f = (struct lb_record_filter){.state = -2};
    ck_assert_int_eq(store_list_sandboxes(st, &f, &recs, &n, &err), -EINVAL);
    store_close(st);
}
END_TEST

START_TEST(test_token_hash_lookup)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record a = mkrec("sbx-a", "rs-a"), b = mkrec("sbx-b", "rs-b"), got;

    insert_ok(st, &a);
    insert_ok(st, &b);
    ck_assert_int_eq(store_mark_lent(st, "sbx-a", "{}", "aaaa", true, &err), 0);
    ck_assert_int_eq(store_mark_lent(st, "sbx-b", "{}", "bbbb", true, &err), 0);
    ck_assert_int_eq(store_get_by_token_hash(st, "bbbb", &got, &err), 0);
    ck_assert_str_eq(got.id, "sbx-b");
    ck_assert_int_eq(got.state, LB_STATE_LENT);
    store_record_release(&got);
    /* Any state. */
    ck_assert_int_eq(store_mark_stopping(st, "sbx-a", "released", &err), 0);
    ck_assert_int_eq(store_mark_stopped(st, "sbx-a", NULL, &err), 0);
    ck_assert_int_eq(store_get_by_token_hash(st, "aaaa", &got, &err), 0);
    ck_assert_str_eq(got.id, "sbx-a");
    ck_assert_int_eq(got.state, LB_STATE_STOPPED);
    store_record_release(&got);

    ck_assert_int_eq(store_get_by_token_hash(st, "cccc", &got, &err), -ENOENT);
    ck_assert_int_eq(store_get_by_token_hash(st, "", &got, &err), -ENOENT);
    ck_assert_int_eq(err.code, -ENOENT);
    store_close(st);
}
END_TEST

START_TEST(test_count_by_state)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    int64_t counts[LB_STATE_COUNT];

    ck_assert_int_eq(store_count_by_state(st, counts, &err), 0);
    for (int i = 0; i < LB_STATE_COUNT; i++)
        ck_assert_int_eq(counts[i], 0);
    put(st, "s1", "r1", LB_STATE_STARTING, 1, 0, 0);
    put(st, "s2", "r2", LB_STATE_LENT, 2, 0, 0);
    put(st, "s3", "r3", LB_STATE_LENT, 3, 0, 0);
    put(st, "s4", "r4", LB_STATE_STOPPED, 4, 0, 0);
    put(st, "s5", "r4", LB_STATE_STOPPED, 5, 0, 0);
    put(st, "s6", "r4", LB_STATE_STOPPED, 6, 0, 0);
    put(st, "s7", "r7", LB_STATE_STOP_FAILED, 7, 0, 0);
    ck_assert_int_eq(store_count_by_state(st, counts, &err), 0);
    ck_assert_int_eq(counts[LB_STATE_STARTING], 1);
    ck_assert_int_eq(counts[LB_STATE_LENT], 2);
    ck_assert_int_eq(counts[LB_STATE_STOPPING], 0);
    ck_assert_int_eq(counts[LB_STATE_STOPPED], 3);
    ck_assert_int_eq(counts[LB_STATE_FAILED_SEED], 0);
    ck_assert_int_eq(counts[LB_STATE_STOP_FAILED], 1);
    store_close(st);
}
END_TEST

/* Live records by the cluster member their descriptor names (location): stopped records, a
 * descriptor without a location or with "" (docker, local) and one that is no JSON count
 * nowhere; rows are ordered by provider then member; max bounds them. */
START_TEST(test_count_by_member)
{
    static const struct {
        const char *id, *provider, *desc;
        enum lb_record_state state;
    } recs[] = {
        {"m1", "lxd", "{\"name\":\"m1\",\"location\":\"b\"}", LB_STATE_LENT},
        {"m2", "lxd", "{\"name\":\"m2\",\"location\":\"a\"}", LB_STATE_LENT},
        {"m3", "lxd", "{\"name\":\"m3\",\"location\":\"b\"}", LB_STATE_STOP_FAILED},
        {"m4", "lxd", "{\"name\":\"m4\",\"location\":\"a\"}", LB_STATE_STOPPED},
        {"m5", "lxd", "{\"name\":\"m5\",\"location\":\"\"}", LB_STATE_LENT},
        {"m6", "docker", "{\"container\":\"c\",\"container_id\":\"x\"}", LB_STATE_LENT},
        {"m7", "lxd", "not json", LB_STATE_LENT},
        {"m8", "lxd2", "{\"location\":\"a\"}", LB_STATE_WARM},
    };
    struct lb_member_count rows[8];
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    size_t n = 99;

    ck_assert_int_eq(store_count_by_member(st, rows, 8, &n, &err), 0);
    ck_assert_uint_eq(n, 0);
    for (size_t i = 0; i < sizeof(recs) / sizeof(recs[0]); i++) {
        struct lb_record r = mkrec(recs[i].id, recs[i].id);

        r.provider = (char *)recs[i].provider;
        r.descriptor_json = (char *)recs[i].desc;
        r.state = recs[i].state;
        insert_ok(st, &r);
    }
    ck_assert_int_eq(store_count_by_member(st, rows, 8, &n, &err), 0);
    ck_assert_uint_eq(n, 3);
    ck_assert_str_eq(rows[0].provider, "lxd");
    ck_assert_str_eq(rows[0].member, "a");
    ck_assert_int_eq(rows[0].count, 1);
    ck_assert_str_eq(rows[1].provider, "lxd");
    ck_assert_str_eq(rows[1].member, "b");
    ck_assert_int_eq(rows[1].count, 2);
    ck_assert_str_eq(rows[2].provider, "lxd2");
    ck_assert_str_eq(rows[2].member, "a");
    ck_assert_int_eq(rows[2].count, 1);
    ck_assert_int_eq(store_count_by_member(st, rows, 2, &n, &err), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(rows[1].member, "b");
    store_close(st);
}
END_TEST

START_TEST(test_count_live_and_batch_stop)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    const char *ids[] = {"b1", "b2", "b3"}, *with_missing[] = {"b4", "nope"};
    int64_t live = -1;

    put(st, "b1", "r1", LB_STATE_LENT, 1, 0, 0);
    put(st, "b2", "r2", LB_STATE_LENT, 2, 0, 0);
    put(st, "b3", "r3", LB_STATE_STARTING, 3, 0, 0);
    put(st, "b4", "r4", LB_STATE_LENT, 4, 0, 0);
    put(st, "b5", "r5", LB_STATE_STOPPED, 5, 0, 0);
    ck_assert_int_eq(store_count_live(st, &live, &err), 0);
    ck_assert_int_eq(live, 4);
    ck_assert_int_eq(store_mark_stopped_many(st, ids, 3, "vanished", &err), 0);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(state_of(st, ids[i]), LB_STATE_STOPPED);
    ck_assert_int_eq(store_count_live(st, &live, &err), 0);
    ck_assert_int_eq(live, 1);
    /* all or nothing: a missing id rolls the whole batch back */
    ck_assert_int_eq(store_mark_stopped_many(st, with_missing, 2, "vanished", &err), -ENOENT);
    ck_assert_int_eq(state_of(st, "b4"), LB_STATE_LENT);
    ck_assert_int_eq(store_mark_stopped_many(st, NULL, 0, "vanished", &err), 0);
    store_close(st);
}
END_TEST

/* The shutdown sweep's batch: every record "stopping" with its own reason (NULL keeps the one
 * recorded), in one transaction: a missing id changes nothing. */
START_TEST(test_mark_stopping_many)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    const char *ids[] = {"m1", "m2"}, *reasons[] = {"shutdown", NULL};
    const char *with_missing[] = {"m3", "nope"};
    struct lb_record got = {0};

    put(st, "m1", "s1", LB_STATE_LENT, 1, 0, 0);
    put(st, "m2", "s2", LB_STATE_LENT, 2, 0, 0);
    put(st, "m3", "s3", LB_STATE_LENT, 3, 0, 0);
    ck_assert_int_eq(store_mark_stopping(st, "m2", "ttl", &err), 0);
    ck_assert_int_eq(store_mark_stop_failed(st, "m2", LB_STATE_STOP_FAILED, "boom", 99, &err), 0);
    ck_assert_int_eq(store_mark_stopping_many(st, ids, reasons, 2, &err), 0);
    ck_assert_int_eq(store_get_sandbox(st, "m1", &got, &err), 0);
    ck_assert_int_eq(got.state, LB_STATE_STOPPING);
    ck_assert_str_eq(got.stop_reason, "shutdown");
    store_record_release(&got);
    ck_assert_int_eq(store_get_sandbox(st, "m2", &got, &err), 0);
    ck_assert_int_eq(got.state, LB_STATE_STOPPING);
    ck_assert_str_eq(got.stop_reason, "ttl");
    store_record_release(&got);
    ck_assert_int_eq(store_mark_stopping_many(st, with_missing, NULL, 2, &err), -ENOENT);
    ck_assert_int_eq(state_of(st, "m3"), LB_STATE_LENT);
    ck_assert_int_eq(store_mark_stopping_many(st, NULL, NULL, 0, &err), 0);
    store_close(st);
}
END_TEST

/* A capped insert counts and inserts in one statement: the cap holds, stopped records do not
 * count, and a refused insert leaves nothing behind. */
START_TEST(test_insert_capped)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record a = mkrec("c1", "q1"), b = mkrec("c2", "q2"), c = mkrec("c3", "q3");
    int64_t live = -1;

    put(st, "c0", "q0", LB_STATE_STOPPED, 1, 0, 0);
    ck_assert_int_eq(store_insert_sandbox(st, &a, 2, &err), 0);
    ck_assert_int_eq(store_insert_sandbox(st, &b, 2, &err), 0);
    ck_assert_int_eq(store_insert_sandbox(st, &c, 2, &err), -EUSERS);
    ck_assert_ptr_nonnull(strstr(err.message, "max_sandboxes (2) reached"));
    ck_assert_int_eq(store_count_live(st, &live, &err), 0);
    ck_assert_int_eq(live, 2);
    ck_assert_int_eq(store_get_sandbox(st, "c3", &(struct lb_record){0}, &err), -ENOENT);
    ck_assert_int_eq(store_mark_stopped_many(st, (const char *[]){"c1"}, 1, "test", &err), 0);
    ck_assert_int_eq(store_insert_sandbox(st, &c, 2, &err), 0);
    store_close(st);
}
END_TEST

/* A seed's insert at the cap takes the place of the oldest warm record in its own transaction:
 * that one is claimed (stopping, "evicted"), the newer warm one stays, and with nothing warm
 * left the cap holds and nothing is claimed. */
START_TEST(test_insert_evicting)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record c = mkrec("e3", "q3"), d = mkrec("e4", "q4"), got = {0};
    char evicted[LB_ID_MAX] = "x";

    put(st, "w-new", NULL, LB_STATE_WARM, 20, 0, 0);
    put(st, "w-old", NULL, LB_STATE_WARM, 10, 0, 0);
    ck_assert_int_eq(store_insert_sandbox_evicting(st, &c, 2, "evicted", evicted, &err), 0);
    ck_assert_str_eq(evicted, "w-old");
    ck_assert_int_eq(store_get_sandbox(st, "w-old", &got, &err), 0);
    ck_assert_int_eq(got.state, LB_STATE_STOPPING);
    ck_assert_str_eq(got.stop_reason, "evicted");
    store_record_release(&got);
    ck_assert_int_eq(state_of(st, "w-new"), LB_STATE_WARM);
    ck_assert_int_eq(state_of(st, "e3"), LB_STATE_STARTING);
    /* below the cap nothing is claimed */
    ck_assert_int_eq(store_mark_stopped_many(st, (const char *[]){"e3"}, 1, "test", &err), 0);
    ck_assert_int_eq(store_insert_sandbox_evicting(st, &d, 2, "evicted", evicted, &err), 0);
    ck_assert_str_eq(evicted, "");
    ck_assert_int_eq(state_of(st, "w-new"), LB_STATE_WARM);
    /* at the cap with one warm left: it goes; then with none the cap holds */
    struct lb_record e = mkrec("e5", "q5"), f = mkrec("e6", "q6");

    ck_assert_int_eq(store_insert_sandbox_evicting(st, &e, 2, "evicted", evicted, &err), 0);
    ck_assert_str_eq(evicted, "w-new");
    ck_assert_int_eq(store_insert_sandbox_evicting(st, &f, 2, "evicted", evicted, &err), -EUSERS);
    ck_assert_str_eq(evicted, "");
    ck_assert_ptr_nonnull(strstr(err.message, "max_sandboxes (2) reached"));
    ck_assert_int_eq(store_get_sandbox(st, "e6", &got, &err), -ENOENT);
    store_record_release(&got);
    store_close(st);
}
END_TEST

START_TEST(test_purge_stopped)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    int64_t now = clock_now_s();

    put(st, "old-stopped", "r1", LB_STATE_STOPPED, 1, 0, 0);
    put(st, "new-stopped", "r1", LB_STATE_STOPPED, 2, 0, 0);
    put(st, "old-lent", "r2", LB_STATE_LENT, 3, 0, 0);
    put(st, "old-failed", "r3", LB_STATE_STOP_FAILED, 4, 0, 0);
    raw_exec("UPDATE sandboxes SET updated_at = 1000 "
             "WHERE id IN ('old-stopped', 'old-lent', 'old-failed')");

    ck_assert_int_eq(store_purge_stopped(st, 1000, &err), 0); /* strictly before the cutoff */
    ck_assert_int_eq(store_purge_stopped(st, now - 60, &err), 1);
    expect_ids(st, NULL, "new-stopped old-lent old-failed");
    ck_assert_int_eq(store_purge_stopped(st, now - 60, &err), 0);
    ck_assert_int_eq(store_purge_stopped(st, now + 60, &err), 1);
    expect_ids(st, NULL, "old-lent old-failed");
    store_close(st);
}
END_TEST

#define N_THREADS 8

struct race {
    struct lb_store *st;
    pthread_barrier_t *barrier;
    int index;
    bool same_rsid;
    int ret;
};

static void *race_insert(void *arg)
{
    struct race *r = arg;
    struct lb_error err = {0};
    char id[32], rsid[32];
    struct lb_record rec;

    snprintf(id, sizeof(id), "sbx-%d", r->index);
    snprintf(rsid, sizeof(rsid), "rs-%d", r->same_rsid ? 0 : r->index);
    rec = mkrec(id, rsid);
    pthread_barrier_wait(r->barrier);
    r->ret = store_insert_sandbox(r->st, &rec, 0, &err);
    return NULL;
}

static void run_race(struct lb_store *st, bool same_rsid, int *ok, int *eexist)
{
    pthread_barrier_t barrier;
    pthread_t threads[N_THREADS];
    struct race races[N_THREADS];

    *ok = *eexist = 0;
    ck_assert_int_eq(pthread_barrier_init(&barrier, NULL, N_THREADS), 0);
    for (int i = 0; i < N_THREADS; i++) {
        races[i] = (struct race){
            .st = st, .barrier = &barrier, .index = i, .same_rsid = same_rsid, .ret = 1};
        ck_assert_int_eq(pthread_create(&threads[i], NULL, race_insert, &races[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(threads[i], NULL);
        *ok += races[i].ret == 0;
        *eexist += races[i].ret == -EEXIST;
    }
    pthread_barrier_destroy(&barrier);
}

START_TEST(test_concurrent_distinct_rsids)
{
    struct lb_store *st = open_store();
    int ok, eexist;

    run_race(st, false, &ok, &eexist);
    ck_assert_int_eq(ok, N_THREADS);
    ck_assert_int_eq(raw_int("SELECT COUNT(*) FROM sandboxes"), N_THREADS);
    store_close(st);
}
END_TEST

START_TEST(test_concurrent_one_rsid)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record got;
    int ok, eexist;

    run_race(st, true, &ok, &eexist);
    ck_assert_int_eq(ok, 1);
    ck_assert_int_eq(eexist, N_THREADS - 1);
    ck_assert_int_eq(store_get_live_by_rsid(st, "rs-0", &got, &err), 0);
    store_record_release(&got);
    ck_assert_int_eq(raw_int("SELECT COUNT(*) FROM sandboxes"), 1);
    store_close(st);
}
END_TEST

START_TEST(test_file_mode_0600)
{
    struct lb_store *st;
    struct stat sb;
    char wal[160];
    mode_t old = umask(0);
    FILE *f;

    st = open_store();
    umask(old);
    ck_assert_int_eq(stat(dbpath, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 07777, 0600);
    snprintf(wal, sizeof(wal), "%s-wal", dbpath);
    ck_assert_int_eq(stat(wal, &sb), 0); /* WAL mode, and the WAL is private too */
    ck_assert_int_eq(sb.st_mode & 07777, 0600);
    store_close(st);

    /* A pre-existing, looser (empty) file is tightened. */
    unlink(dbpath);
    f = fopen(dbpath, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    ck_assert_int_eq(chmod(dbpath, 0644), 0);
    st = open_store();
    ck_assert_int_eq(stat(dbpath, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 07777, 0600);
    store_close(st);
}
END_TEST

START_TEST(test_open_errors)
{
    struct lb_error err = {0};
    struct lb_store *st = NULL;

    ck_assert_int_eq(store_open("/nonexistent-dir/lendbox.db", &st, &err), -EIO);
    ck_assert_ptr_null(st);
    ck_assert_msg(strstr(err.message, "/nonexistent-dir/lendbox.db") != NULL, "%s", err.message);
    /* Not a database. */
    {
        FILE *f = fopen(dbpath, "w");

        ck_assert_ptr_nonnull(f);
        fputs("this is not an SQLite database, not even a little bit; padding padding\n", f);
        fclose(f);
    }
    ck_assert_int_eq(store_open(dbpath, &st, &err), -EIO);
    ck_assert_ptr_null(st);
}
END_TEST

/* ---- activations ---- */

static struct lb_activation mkact(const char *id, const char *sandbox_id)
{
    struct lb_activation a = {0};

    snprintf(a.id, sizeof(a.id), "%s", id);
    snprintf(a.sandbox_id, sizeof(a.sandbox_id), "%s", sandbox_id);
    a.rsid = "rs-a";
    a.state = LB_ACT_STAGING;
    a.spec_json = "{\"argv\":[\"true\"]}";
    a.output_log_bytes = -1;
    return a;
}

START_TEST(test_activation_round_trip)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record r = mkrec("sbx-a", "rs-a");
    struct lb_activation a = mkact("act-1", "sbx-a"), got;

    insert_ok(st, &r);
    ck_assert_int_eq(store_insert_activation(st, &a, &err), 0);
    ck_assert_int_eq(store_get_activation_by_sandbox(st, "sbx-a", &got, &err), 0);
    ck_assert_str_eq(got.id, "act-1");
    ck_assert_str_eq(got.rsid, "rs-a");
    ck_assert_int_eq(got.state, LB_ACT_STAGING);
    ck_assert_str_eq(got.spec_json, "{\"argv\":[\"true\"]}");
    ck_assert_ptr_null(got.receipt_json);
    ck_assert_ptr_null(got.artifacts_json);
    ck_assert_ptr_null(got.log);
    ck_assert_int_eq(got.output_log_bytes, -1);
    ck_assert_int_gt(got.created_at, 0);
    store_activation_release(&got);
    ck_assert_int_eq(store_get_latest_activation(st, "rs-a", &got, &err), 0);
    ck_assert_str_eq(got.id, "act-1");
    store_activation_release(&got);
    ck_assert_int_eq(store_get_latest_activation(st, "rs-none", &got, &err), -ENOENT);
    ck_assert_int_eq(store_get_activation_by_sandbox(st, "sbx-none", &got, &err), -ENOENT);
    /* one per sandbox; the sandbox must exist */
    a = mkact("act-2", "sbx-a");
    ck_assert_int_eq(store_insert_activation(st, &a, &err), -EEXIST);
    a = mkact("act-3", "sbx-missing");
    ck_assert_int_eq(store_insert_activation(st, &a, &err), -ENOENT);
    ck_assert_str_eq(store_act_state_name(LB_ACT_CLOSING), "closing");
    store_close(st);
}
END_TEST

START_TEST(test_activation_transitions_and_capture)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record r = mkrec("sbx-b", "rs-b");
    struct lb_activation a = mkact("act-b", "sbx-b"), got;
    const unsigned from_staging = LB_ACT_MASK(LB_ACT_STAGING);

    insert_ok(st, &r);
    ck_assert_int_eq(store_insert_activation(st, &a, &err), 0);
    ck_assert_int_eq(
        store_activation_set_state(st, "act-b", LB_ACT_CLOSING,
                                   LB_ACT_MASK(LB_ACT_STAGING) | LB_ACT_MASK(LB_ACT_RUNNING), &err),
        0);
    /* a launch after a close: refused */
    ck_assert_int_eq(store_activation_set_state(st, "act-b", LB_ACT_RUNNING, from_staging, &err),
                     -EBUSY);
    ck_assert_int_eq(store_activation_set_state(st, "act-none", LB_ACT_RUNNING, from_staging, &err),
                     -ENOENT);
    ck_assert_int_eq(
        store_activation_set_receipt(st, "act-b", "{\"cleanup_confirmed\":true}", &err), 0);
    ck_assert_int_eq(
        store_activation_set_capture(st, "act-b", "{\"/x\":null}", "oops", "log\0x", 5, 5, &err),
        0);
    /* at most once */
    ck_assert_int_eq(store_activation_set_capture(st, "act-b", "{}", NULL, NULL, 0, 0, &err),
                     -EALREADY);
    ck_assert_int_eq(store_get_activation_by_sandbox(st, "sbx-b", &got, &err), 0);
    ck_assert_int_eq(got.state, LB_ACT_CLOSING);
    ck_assert_str_eq(got.receipt_json, "{\"cleanup_confirmed\":true}");
    ck_assert_str_eq(got.artifacts_json, "{\"/x\":null}");
    ck_assert_str_eq(got.capture_error, "oops");
    ck_assert_uint_eq(got.log_len, 5);
    ck_assert(memcmp(got.log, "log\0x", 5) == 0);
    ck_assert_int_eq(got.output_log_bytes, 5);
    store_activation_release(&got);
    ck_assert_int_eq(
        store_activation_set_state(st, "act-b", LB_ACT_CLOSED, LB_ACT_MASK(LB_ACT_CLOSING), &err),
        0);
    /* purging the stopped sandbox takes its activation along */
    ck_assert_int_eq(store_mark_stopped(st, "sbx-b", "released", &err), 0);
    ck_assert_int_eq(store_purge_stopped(st, clock_now_s() + 60, &err), 1);
    ck_assert_int_eq(raw_int("SELECT COUNT(*) FROM activations"), 0);
    store_close(st);
}
END_TEST

/* The space reserve: a whole, allocated, private file next to the database; kept across
 * opens; removed when turned off. The store counts as writable on a healthy file system. */
START_TEST(test_space_reserve)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    char path[160];
    struct stat sb;

    snprintf(path, sizeof(path), "%s.reserve", dbpath);
    ck_assert_int_eq(store_reserve_init(st, -1, &err), -EINVAL);
    ck_assert_int_eq(store_reserve_init(st, 1 << 20, &err), 0);
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq(sb.st_size, 1 << 20);
    ck_assert_int_ge((long long)sb.st_blocks * 512, 1 << 20);
    ck_assert_int_eq(sb.st_mode & 07777, 0600);
    ck_assert_msg(store_check_writable(st, &err) == 0, "%s", err.message);
    store_close(st);
    st = open_store();
    ck_assert_int_eq(store_reserve_init(st, 1 << 20, &err), 0);
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq(store_reserve_init(st, 0, &err), 0);
    ck_assert_int_eq(stat(path, &sb), -1);
    ck_assert_int_eq(store_check_writable(st, &err), 0);
    store_close(st);
}
END_TEST

/* ---- warm pools (migration 3, take, claim) ---- */

/* A database as lendboxd made it before migration 3 (schema version 2). */
static void make_v2_database(void)
{
    raw_exec("CREATE TABLE sandboxes (id TEXT PRIMARY KEY, rsid TEXT, task_id TEXT,"
             " provider TEXT NOT NULL, state TEXT NOT NULL CHECK (state IN ('starting', 'lent',"
             " 'stopping', 'stopped', 'failed_seed', 'stop_failed')), spec_json TEXT,"
             " descriptor_json TEXT, token_hash TEXT, created_at INTEGER NOT NULL,"
             " expires_at INTEGER, stop_attempts INTEGER NOT NULL DEFAULT 0,"
             " next_attempt_at INTEGER, last_error TEXT, stop_reason TEXT,"
             " updated_at INTEGER NOT NULL);"
             "CREATE UNIQUE INDEX sandboxes_live_rsid ON sandboxes (rsid)"
             " WHERE state IN ('starting', 'lent');"
             "CREATE TABLE activations (id TEXT PRIMARY KEY, rsid TEXT NOT NULL,"
             " sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,"
             " state TEXT NOT NULL CHECK (state IN ('staging', 'running', 'closing', 'closed')),"
             " spec_json TEXT, receipt_json TEXT, artifacts_json TEXT, capture_error TEXT,"
             " output_log BLOB, output_log_bytes INTEGER, created_at INTEGER NOT NULL,"
             " updated_at INTEGER NOT NULL);"
             "INSERT INTO sandboxes (id, rsid, task_id, provider, state, spec_json, token_hash,"
             " created_at, expires_at, updated_at, stop_reason) VALUES"
             " ('sbx-old', 'rs-old', 't1', 'local', 'lent', '{\"image\":\"host\"}', 'abc', 11,"
             " 99, 12, NULL),"
             " ('sbx-gone', 'rs-gone', 't2', 'local', 'stopped', NULL, NULL, 13, NULL, 14,"
             " 'released');"
             "INSERT INTO activations VALUES ('act-1', 'rs-old', 'sbx-old', 'running', '{}',"
             " NULL, NULL, NULL, x'6869', 2, 15, 16);"
             "PRAGMA user_version = 2;");
}

START_TEST(test_migration_3_keeps_records_and_activations)
{
    struct lb_error err = {0};
    struct lb_store *st;
    struct lb_record r;
    struct lb_activation a;

    make_v2_database();
    st = open_store();
    ck_assert_int_eq(raw_int("PRAGMA user_version"), 6); /* 3, then the snapshots table */
    ck_assert_int_eq(store_get_sandbox(st, "sbx-old", &r, &err), 0);
    ck_assert_int_eq(r.state, LB_STATE_LENT);
    ck_assert_str_eq(r.rsid, "rs-old");
    ck_assert_str_eq(r.spec_json, "{\"image\":\"host\"}");
    ck_assert_str_eq(r.token_hash, "abc");
    ck_assert_int_eq(r.created_at, 11);
    ck_assert_int_eq(r.expires_at, 99);
    ck_assert_ptr_null(r.pool_class);
    store_record_release(&r);
    ck_assert_int_eq(state_of(st, "sbx-gone"), LB_STATE_STOPPED);
    /* the activation survived the table's rebuild, still tied to its sandbox */
    ck_assert_int_eq(store_get_activation_by_sandbox(st, "sbx-old", &a, &err), 0);
    ck_assert_str_eq(a.id, "act-1");
    ck_assert_int_eq(a.state, LB_ACT_RUNNING);
    ck_assert_uint_eq(a.log_len, 2);
    store_activation_release(&a);
    ck_assert_int_eq(raw_int("SELECT COUNT(*) FROM pragma_foreign_key_list('activations') "
                             "WHERE \"table\" = 'sandboxes'"),
                     1);
    /* the one-live-per-session index is back */
    struct lb_record dup = mkrec("sbx-dup", "rs-old");
    ck_assert_int_eq(store_insert_sandbox(st, &dup, 0, &err), -EEXIST);
    /* and a warm record is allowed now */
    struct lb_record w = mkrec("sbx-w", NULL);
    w.pool_class = "local:host";
    insert_ok(st, &w);
    ck_assert_int_eq(store_mark_warm(st, "sbx-w", "{}", 0, &err), 0);
    ck_assert_int_eq(state_of(st, "sbx-w"), LB_STATE_WARM);
    store_close(st);
}
END_TEST

static int fake_hash(void *ctx, const char *id, char *hash)
{
    (void)ctx;
    snprintf(hash, LB_TOKEN_HASH_HEX + 1, "h-%s", id);
    return 0;
}

static void put_warm(struct lb_store *st, const char *id, const char *cls, int64_t created,
                     int64_t expires)
{
    struct lb_error err = {0};
    struct lb_record r = mkrec(id, NULL);

    r.pool_class = (char *)cls;
    r.created_at = created;
    insert_ok(st, &r);
    ck_assert_int_eq(store_mark_warm(st, id, "{\"pid\":1}", expires, &err), 0);
}

static int take(struct lb_store *st, const char *cls, const char *rsid, int64_t now,
                struct lb_record *out)
{
    struct lb_error err = {0};
    struct lb_warm_take t = {.pool_class = cls,
                             .now_s = now,
                             .rsid = rsid,
                             .task_id = "task",
                             .spec_json = "{\"image\":\"host\",\"env\":{\"A\":\"1\"}}",
                             .expires_at = now + 60,
                             .token_hash = fake_hash};

    return store_take_warm(st, &t, out, &err);
}

START_TEST(test_warm_take_and_claim)
{
    struct lb_error err = {0};
    struct lb_store *st = open_store();
    struct lb_record r;
    int64_t live = 0, now = clock_now_s();

    put_warm(st, "w-old", "local:host", now - 30, now - 1); /* past its max age */
    put_warm(st, "w-1", "local:host", now - 20, now + 100);
    put_warm(st, "w-2", "local:host", now - 10, 0);
    put_warm(st, "w-other", "local:img", now - 40, 0);
    ck_assert_int_eq(store_count_live(st, &live, &err), 0);
    ck_assert_int_eq(live, 4); /* warm ones hold capacity */
    /* the oldest unexpired one of the class, lent to the session with its token */
    ck_assert_int_eq(take(st, "local:host", "rs-a", now, &r), 0);
    ck_assert_str_eq(r.id, "w-1");
    ck_assert_int_eq(r.state, LB_STATE_LENT);
    ck_assert_str_eq(r.rsid, "rs-a");
    ck_assert_str_eq(r.task_id, "task");
    ck_assert_str_eq(r.token_hash, "h-w-1");
    ck_assert_str_eq(r.descriptor_json, "{\"pid\":1}");
    ck_assert_int_eq(r.expires_at, now + 60);
    ck_assert_int_eq(r.created_at, now - 20); /* started before the take */
    ck_assert_ptr_nonnull(strstr(r.spec_json, "\"A\""));
    store_record_release(&r);
    /* a session with a live sandbox cannot take another */
    ck_assert_int_eq(take(st, "local:host", "rs-a", now, &r), -EEXIST);
    ck_assert_int_eq(state_of(st, "w-2"), LB_STATE_WARM);
    ck_assert_int_eq(take(st, "local:host", "rs-b", now, &r), 0);
    ck_assert_str_eq(r.id, "w-2");
    store_record_release(&r);
    /* nothing left of the class: the expired one and the other class are not handed out */
    ck_assert_int_eq(take(st, "local:host", "rs-c", now, &r), -ENOENT);
    ck_assert_int_eq(state_of(st, "w-old"), LB_STATE_WARM);
    ck_assert_int_eq(state_of(st, "w-other"), LB_STATE_WARM);
    /* claims: a taken one is not warm any more; a warm one goes to stopping with a reason */
    ck_assert_int_eq(store_claim_warm(st, "w-1", "max_age", &err), -EBUSY);
    ck_assert_int_eq(store_claim_warm(st, "w-old", "max_age", &err), 0);
    ck_assert_int_eq(store_get_sandbox(st, "w-old", &r, &err), 0);
    ck_assert_int_eq(r.state, LB_STATE_STOPPING);
    ck_assert_str_eq(r.stop_reason, "max_age");
    store_record_release(&r);
    ck_assert_int_eq(store_claim_warm(st, "w-old", "max_age", &err), -EBUSY);
    /* mark_warm only from starting */
    ck_assert_int_eq(store_mark_warm(st, "w-1", "{}", 0, &err), -EBUSY);
    store_close(st);
}
END_TEST

#define TAKERS 8
struct taker {
    struct lb_store *st;
    int idx, rc;
    char id[LB_ID_MAX];
};

static void *taker_main(void *arg)
{
    struct taker *t = arg;
    struct lb_record r = {0};
    char rsid[32];

    snprintf(rsid, sizeof(rsid), "rs-%d", t->idx);
    t->rc = take(t->st, "local:host", rsid, clock_now_s(), &r);
    if (t->rc == 0)
        snprintf(t->id, sizeof(t->id), "%s", r.id);
    store_record_release(&r);
    return NULL;
}

START_TEST(test_warm_take_concurrent_never_twice)
{
    struct lb_store *st = open_store();
    struct taker t[TAKERS];
    pthread_t th[TAKERS];
    int ok = 0;
    int64_t now = clock_now_s();
    char id[16];

    for (int i = 0; i < 5; i++) {
        snprintf(id, sizeof(id), "w-%d", i);
        put_warm(st, id, "local:host", now - 10 + i, 0);
    }
    for (int i = 0; i < TAKERS; i++) {
        t[i] = (struct taker){.st = st, .idx = i};
        ck_assert_int_eq(pthread_create(&th[i], NULL, taker_main, &t[i]), 0);
    }
    for (int i = 0; i < TAKERS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < TAKERS; i++) {
        if (t[i].rc != 0) {
            ck_assert_int_eq(t[i].rc, -ENOENT);
            continue;
        }
        ok++;
        for (int j = 0; j < i; j++)
            ck_assert_msg(t[j].rc != 0 || strcmp(t[j].id, t[i].id) != 0, "%s taken twice", t[i].id);
    }
    ck_assert_int_eq(ok, 5);
    store_close(st);
}
END_TEST

/* ---- the event feed ---- */

static int hook_calls;

static char hook_last[256]; /* the last call's notes: "sandbox/rsid;..." or "unknown" */

static void count_hook(void *ctx, const struct lb_event_note *notes, size_t n)
{
    size_t off = 0;

    (void)ctx;
    hook_calls++;
    hook_last[0] = '\0';
    if (n == 0)
        snprintf(hook_last, sizeof(hook_last), "unknown");
    for (size_t i = 0; i < n && off < sizeof(hook_last); i++)
        off += (size_t)snprintf(hook_last + off, sizeof(hook_last) - off, "%s/%s;",
                                notes[i].sandbox_id, notes[i].rsid ? notes[i].rsid : "-");
}

/* The types of the events after since (filter f, since and limit set here), joined by ','. */
static const char *event_types(struct lb_store *st, struct lb_event_filter f, char *buf, size_t cap)
{
    struct lb_error err = {0};
    json_t *evs = NULL, *ev;
    int64_t next = -1;
    size_t i, len = 0;

    f.limit = 100;
    ck_assert_int_eq(store_events_list(st, &f, &evs, &next, &err), 0);
    buf[0] = '\0';
    json_array_foreach(evs, i, ev)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? "," : "",
                                json_string_value(json_object_get(ev, "type")));
    json_decref(evs);
    return buf;
}

START_TEST(test_events_feed)
{
    struct lb_store *st = open_store();
    struct lb_record a = mkrec("sbx-e1", "rs-e1"), b = mkrec("sbx-e2", "rs-e2"),
                     w = mkrec("sbx-w", NULL);
    struct lb_error err = {0};
    json_t *usage = json_pack("{s:f,s:n}", "cpu_s", 1.5, "pids"), *evs = NULL, *data;
    const char *ids[] = {"sbx-e2"};
    int64_t next = 0;
    char buf[256];

    store_events_set_hook(st, count_hook, NULL);
    a.task_id = "task-1";
    a.spec_json = "{\"labels\":{\"team\":\"rl\"}}";
    insert_ok(st, &a);
    insert_ok(st, &b);
    w.pool_class = "default";
    insert_ok(st, &w);
    ck_assert_int_eq(store_mark_lent(st, "sbx-e1", "{}", NULL, true, &err), 0);
    ck_assert_int_eq(hook_calls, 1);
    /* the hook is told whose event the commit wrote (the event feed wakes only its readers) */
    ck_assert_str_eq(hook_last, "sbx-e1/rs-e1;");
    /* a transition that fails writes no event (and wakes nobody) */
    ck_assert_int_eq(store_mark_lent(st, "sbx-e1", "{}", NULL, true, &err), -EBUSY);
    ck_assert_int_eq(store_mark_lent(st, "sbx-none", "{}", NULL, true, &err), -ENOENT);
    ck_assert_int_eq(hook_calls, 1);
    ck_assert_int_eq(store_set_expires(st, "sbx-e1", clock_now_s() + 60, &err), 0);
    ck_assert_int_eq(store_mark_stopping(st, "sbx-e1", "lost", &err), 0);
    ck_assert_int_eq(store_mark_stopped_usage(st, "sbx-e1", NULL, usage, &err), 0);
    ck_assert_int_eq(store_mark_stopped(st, "sbx-e1", "deleted", &err), 0); /* no 2nd event */
    ck_assert_int_eq(store_mark_stop_failed(st, "sbx-e2", LB_STATE_FAILED_SEED, "boom", 0, &err),
                     0);
    ck_assert_int_eq(store_mark_stopped_many(st, ids, 1, "seed_failed", &err), 0);
    ck_assert_str_eq(hook_last, "sbx-e2/rs-e2;");
    /* a warm sandbox no session took writes nothing */
    ck_assert_int_eq(store_mark_stopping(st, "sbx-w", "max_age", &err), 0);
    ck_assert_int_eq(store_mark_stopped(st, "sbx-w", NULL, &err), 0);
    ck_assert_str_eq(event_types(st, (struct lb_event_filter){0}, buf, sizeof(buf)),
                     "seeded,renewed,lost,stopped,stop_failed,stopped");
    ck_assert_str_eq(event_types(st, (struct lb_event_filter){.rsid = "rs-e2"}, buf, sizeof(buf)),
                     "stop_failed,stopped");
    ck_assert_str_eq(event_types(st, (struct lb_event_filter){.since = 3}, buf, sizeof(buf)),
                     "stopped,stop_failed,stopped");

    /* the stopped event: the record's reason, the usage given, its session, task and labels */
    json_t *types = json_pack("[s]", "stopped");
    struct lb_event_filter f = {.sandbox_id = "sbx-e1", .types = types, .limit = 10};

    ck_assert_int_eq(store_events_list(st, &f, &evs, &next, &err), 0);
    ck_assert_int_eq(json_array_size(evs), 1);
    ck_assert_int_eq(next, 4);
    data = json_object_get(json_array_get(evs, 0), "data");
    ck_assert_str_eq(json_string_value(json_object_get(data, "reason")), "lost");
    ck_assert(json_equal(json_object_get(data, "usage"), usage));
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(evs, 0), "task_id")),
                     "task-1");
    ck_assert_str_eq(json_string_value(json_object_get(
                         json_object_get(json_array_get(evs, 0), "labels"), "team")),
                     "rl");
    json_decref(evs);
    json_decref(types);

    /* retention by count keeps the newest; seq is never reused */
    store_events_configure(st, true, 0, 2);
    ck_assert_int_eq(store_events_prune(st, clock_now_s(), &err), 4);
    ck_assert_int_eq(raw_int("SELECT MIN(seq) FROM events"), 5);
    /* switched off (the bench only): nothing written */
    store_events_configure(st, false, 0, 0);
    ck_assert_int_eq(store_record_event(st, "paused", "sbx-e1", NULL, &err), 0);
    store_events_configure(st, true, 0, 0);
    ck_assert_int_eq(raw_int("SELECT COUNT(*) FROM events"), 2);
    ck_assert_int_eq(store_record_event(st, "paused", "sbx-e1", NULL, &err), 0);
    ck_assert_int_eq(raw_int("SELECT MAX(seq) FROM events"), 7);
    json_decref(usage);
    store_close(st);
}
END_TEST

/* The query plan's details of sql on db, joined by "; " into buf. */
static void query_plan(sqlite3 *db, const char *sql, char *buf, size_t len)
{
    char explain[1024];
    sqlite3_stmt *s = NULL;
    size_t off = 0;

    snprintf(explain, sizeof(explain), "EXPLAIN QUERY PLAN %s", sql);
    ck_assert_int_eq(sqlite3_prepare_v2(db, explain, -1, &s, NULL), SQLITE_OK);
    buf[0] = '\0';
    while (sqlite3_step(s) == SQLITE_ROW && off < len)
        off += (size_t)snprintf(buf + off, len - off, "%s; ", sqlite3_column_text(s, 3));
    sqlite3_finalize(s);
}

/* A read filtered by session or sandbox takes that column's index: it never scans the feed's
 * other rows (a parked long-poll of one session is read again at every commit, under the
 * store's lock, and the feed keeps up to a million rows). */
START_TEST(test_events_filter_uses_index)
{
    struct lb_store *st = open_store();
    json_t *types = json_pack("[s]", "stopped");
    struct lb_event_filter by_rsid = {.rsid = "rs-1"}, by_sbx = {.sandbox_id = "sbx-1"},
                           both = {.rsid = "rs-1", .sandbox_id = "sbx-1", .types = types},
                           none = {.types = types};
    sqlite3 *db = NULL;
    char plan[1024];

    ck_assert_int_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    query_plan(db, store_events_list_sql(&by_rsid), plan, sizeof(plan));
    ck_assert_msg(strstr(plan, "USING INDEX events_rsid (rsid=? AND seq>?)"), "plan: %s", plan);
    query_plan(db, store_events_list_sql(&both), plan, sizeof(plan));
    ck_assert_msg(strstr(plan, "USING INDEX events_rsid (rsid=? AND seq>?)"), "plan: %s", plan);
    query_plan(db, store_events_list_sql(&by_sbx), plan, sizeof(plan));
    ck_assert_msg(strstr(plan, "USING INDEX events_sandbox (sandbox_id=? AND seq>?)"), "plan: %s",
                  plan);
    query_plan(db, store_events_list_sql(&none), plan, sizeof(plan));
    ck_assert_msg(strstr(plan, "USING INTEGER PRIMARY KEY (rowid>?)"), "plan: %s", plan);
    sqlite3_close(db);
    json_decref(types);
    store_close(st);
}
END_TEST

/* store_events_list_to's read_to: where a reader whose filter matched little may read on from
 * without walking the same rows again, and without missing a later event of its filter. */
START_TEST(test_events_read_to)
{
    struct lb_store *st = open_store();
    struct lb_record a = mkrec("sbx-r1", "rs-r1");
    struct lb_error err = {0};
    json_t *snap = json_pack("[s]", "snapshot"), *evs = NULL;
    struct lb_event_filter f = {.types = snap};
    int64_t next = -1, read_to = -1;

    insert_ok(st, &a);
    ck_assert_int_eq(store_mark_lent(st, "sbx-r1", "{}", NULL, true, &err), 0);   /* seq 1 */
    ck_assert_int_eq(store_record_event(st, "paused", "sbx-r1", NULL, &err), 0);  /* 2 */
    ck_assert_int_eq(store_record_event(st, "resumed", "sbx-r1", NULL, &err), 0); /* 3 */
    /* nothing matches: next stays since, read_to is the newest seq */
    ck_assert_int_eq(store_events_list_to(st, &f, &evs, &next, &read_to, &err), 0);
    ck_assert_int_eq(json_array_size(evs), 0);
    ck_assert_int_eq(next, 0);
    ck_assert_int_eq(read_to, 3);
    json_decref(evs);
    /* a later match after read_to is found from it */
    ck_assert_int_eq(store_record_event(st, "paused", "sbx-r1", NULL, &err), 0); /* 4 */
    json_array_set_new(snap, 0, json_string("paused"));
    f.since = read_to;
    ck_assert_int_eq(store_events_list_to(st, &f, &evs, &next, &read_to, &err), 0);
    ck_assert_int_eq(json_array_size(evs), 1);
    ck_assert_int_eq(next, 4);
    ck_assert_int_eq(read_to, 4);
    json_decref(evs);
    /* a full answer (limit reached) reads on from its last event, not the newest */
    f.since = 0;
    f.types = NULL;
    f.limit = 2;
    ck_assert_int_eq(store_events_list_to(st, &f, &evs, &next, &read_to, &err), 0);
    ck_assert_int_eq(json_array_size(evs), 2);
    ck_assert_int_eq(next, 2);
    ck_assert_int_eq(read_to, 2);
    json_decref(evs);
    json_decref(snap);
    store_close(st);
}
END_TEST

static Suite *store_suite(void)
{
    Suite *s = suite_create("store");
    TCase *tc = tcase_create("core");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_state_names);
    tcase_add_test(tc, test_mark_lent_unsynced_then_sync);
    tcase_add_test(tc, test_open_close_reopen);
    tcase_add_test(tc, test_migration_sets_user_version);
    tcase_add_test(tc, test_snapshot_records);
    tcase_add_test(tc, test_seed_files_kept);
    tcase_add_test(tc, test_too_new_schema_refused);
    tcase_add_test(tc, test_round_trip_every_field);
    tcase_add_test(tc, test_records_carry_provider);
    tcase_add_test(tc, test_one_live_per_rsid);
    tcase_add_test(tc, test_transitions);
    tcase_add_test(tc, test_updated_at_on_write);
    tcase_add_test(tc, test_stop_failed);
    tcase_add_test(tc, test_filters);
    tcase_add_test(tc, test_token_hash_lookup);
    tcase_add_test(tc, test_count_by_state);
    tcase_add_test(tc, test_purge_stopped);
    tcase_add_test(tc, test_count_by_member);
    tcase_add_test(tc, test_count_live_and_batch_stop);
    tcase_add_test(tc, test_mark_stopping_many);
    tcase_add_test(tc, test_insert_capped);
    tcase_add_test(tc, test_insert_evicting);
    tcase_add_test(tc, test_concurrent_distinct_rsids);
    tcase_add_test(tc, test_concurrent_one_rsid);
    tcase_add_test(tc, test_file_mode_0600);
    tcase_add_test(tc, test_open_errors);
    tcase_add_test(tc, test_activation_round_trip);
    tcase_add_test(tc, test_activation_transitions_and_capture);
    tcase_add_test(tc, test_space_reserve);
    tcase_add_test(tc, test_migration_3_keeps_records_and_activations);
    tcase_add_test(tc, test_warm_take_and_claim);
    tcase_add_test(tc, test_warm_take_concurrent_never_twice);
    tcase_add_test(tc, test_events_feed);
    tcase_add_test(tc, test_events_filter_uses_index);
    tcase_add_test(tc, test_events_read_to);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(store_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
