/* check_pty.c - unit tests for the PTY service's waiters (lend/pty.h, struct lb_pty_waker): the
 * service wakes a waiting poll through the waker it was given, without HTTP, and releases the
 * waiter's reference exactly once on every path (an event, a takeover, pty_unwatch, an unknown
 * session, the service's end).
 *
 * No sandbox runs here. The session is one "left by an earlier run": its directory and the
 * daemon's <sid>.meta in <state>/pty, for a record the store says is lent, which the service
 * loads at start. The test plays the holder: it keeps the "in" FIFO open for reading (the
 * holder's sign of life) and writes the output segment and the exit file itself. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "lend/lend.h"
#include "lend/pty.h"
#include "provider/registry.h"
#include "store/store.h"

#define SID "pty-0123456789abcdef0123456789abcdef"
#define SBX "sbx-pty-unit"

/* One waiter's ctx: what the service did with it. */
struct counts {
    atomic_int wakes;
    atomic_int releases;
};

static void count_wake(void *ctx)
{
    atomic_fetch_add(&((struct counts *)ctx)->wakes, 1);
}

static void count_release(void *ctx)
{
    atomic_fetch_add(&((struct counts *)ctx)->releases, 1);
}

static int got(atomic_int *v)
{
    return atomic_load(v);
}

static struct lb_pty_waker waker_of(struct counts *c)
{
    return (struct lb_pty_waker){.wake = count_wake, .release = count_release, .ctx = c};
}

static char root[256], dir[512], sdir[1024];
static struct lb_store *st;
static struct lb_registry *reg;
static struct lb_lend *lend;
static struct lb_ptys *ptys;
static int in_reader = -1; /* the "holder" keeps its input FIFO open */

/* Make path with text whole, in one step (written beside the watched directory, then renamed
 * in): the watcher sees one event for it (IN_MOVED_TO), not a create, a modify and a close
 * that a loaded machine may hand it in separate reads, each a wake of its own. */
static void put_file(const char *path, const char *text)
{
    char tmp[PATH_MAX + 128];
    FILE *f;

    snprintf(tmp, sizeof(tmp), "%s/put.tmp", dir);
    f = fopen(tmp, "w");
    ck_assert_msg(f != NULL, "%s: %s", tmp, strerror(errno));
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_msg(rename(tmp, path) == 0, "%s: %s", path, strerror(errno));
}

static void setup(void)
{
    struct lb_error err = {0};
    struct lb_record r = {0};
    struct lb_lend_config lc = {.operate_key = (const unsigned char *)"k", .operate_key_len = 1};
    char path[PATH_MAX + 128];
    int ret;

    snprintf(dir, sizeof(dir), "%s/t-XXXXXX", root);
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/lendbox.db", dir);
    ret = store_open(path, &st, &err);
    ck_assert_msg(ret == 0, "store_open: %d %s", ret, err.message);
    snprintf(r.id, sizeof(r.id), "%s", SBX);
    r.rsid = "rs-pty-unit";
    r.provider = "local";
    r.state = LB_STATE_STARTING;
    ck_assert_int_eq(store_insert_sandbox(st, &r, 0, &err), 0);
    ck_assert_int_eq(store_mark_lent(st, SBX, "{}", "h", true, &err), 0);
    ck_assert_int_eq(registry_new(&reg), 0);
    ret = lend_new(&lc, st, reg, &lend, &err);
    ck_assert_msg(ret == 0, "lend_new: %d %s", ret, err.message);

    /* the session an earlier run left: <state>/pty/<sid>/ with its FIFOs, and <sid>.meta */
    snprintf(path, sizeof(path), "%s/pty", dir);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    snprintf(sdir, sizeof(sdir), "%s/pty/%s", dir, SID);
    ck_assert_int_eq(mkdir(sdir, 0777), 0);
    snprintf(path, sizeof(path), "%s/in", sdir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    in_reader = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    ck_assert_int_ge(in_reader, 0);
    snprintf(path, sizeof(path), "%s/ctl", sdir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    snprintf(path, sizeof(path), "%s/pty/%s.meta", dir, SID);
    put_file(path, "{\"sandbox_id\":\"" SBX "\",\"pty\":true}");

    struct lb_pty_config pc = {.dir = NULL, .max_sessions = 4};
    char pty_dir[PATH_MAX + 8];

    snprintf(pty_dir, sizeof(pty_dir), "%s/pty", dir);
    pc.dir = pty_dir;
    ret = pty_service_new(&pc, lend, st, &ptys, &err);
    ck_assert_msg(ret == 0, "pty_service_new: %d %s", ret, err.message);
    ck_assert_uint_eq(pty_count(ptys), 1);
}

/* The tests' directories live under one root, made and removed by the parent process: a test
 * that fails (its child exits at the assertion, before teardown) leaves nothing behind. Its
 * service thread and fds end with that child. */
static void remove_tree(const char *path)
{
    char cmd[PATH_MAX + 32];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
    (void)!system(cmd);
}

static void root_setup(void)
{
    snprintf(root, sizeof(root), "/tmp/lb-check-pty-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
}

static void root_teardown(void)
{
    remove_tree(root);
}

static void teardown(void)
{
    pty_service_free(ptys);
    ptys = NULL;
    lend_free(lend);
    registry_free(reg);
    store_close(st);
    if (in_reader >= 0)
        close(in_reader);
    in_reader = -1;
    remove_tree(dir);
}

/* Wait (bounded: the watcher is a thread) until *v reaches want; its value then. */
static int wait_for(atomic_int *v, int want)
{
    for (int i = 0; i < 500 && atomic_load(v) < want; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};

        nanosleep(&ts, NULL);
    }
    return atomic_load(v);
}

/* Write the session's stdout segment and wait until the watcher has handled that event: a
 * probe waiting for output is woken by it, and the watcher judges every waiter of a session
 * for one event in one pass under the lock, so once that pass ends the others have been judged
 * too (no sleep needed). */
static void write_output_and_sync(const char *text)
{
    struct counts probe = {0};
    struct lb_pty_waker w = waker_of(&probe);
    char path[PATH_MAX + 128];

    pty_watch(ptys, SID, false, 0, &w);
    ck_assert_int_eq(got(&probe.wakes), 0);
    snprintf(path, sizeof(path), "%s/out.0", sdir);
    put_file(path, text);
    ck_assert_int_eq(wait_for(&probe.releases, 1), 1);
    ck_assert_int_eq(got(&probe.wakes), 1);
    /* the watcher holds the service's lock for the whole pass that woke the probe: taking the
     * lock (pty_count does) waits for the pass to end */
    ck_assert_uint_eq(pty_count(ptys), 1);
}

START_TEST(test_unknown_session_wakes_and_releases_at_once)
{
    struct counts c = {0};
    struct lb_pty_waker w = waker_of(&c);

    pty_watch(ptys, "pty-ffffffffffffffffffffffffffffffff", false, 0, &w);
    ck_assert_int_eq(got(&c.wakes), 1);
    ck_assert_int_eq(got(&c.releases), 1);
    pty_unwatch(ptys, &c); /* nothing registered: no second release */
    ck_assert_int_eq(got(&c.releases), 1);
}
END_TEST

START_TEST(test_output_wakes_the_output_waiter_once)
{
    struct counts out = {0}, err_stream = {0};
    struct lb_pty_waker wo = waker_of(&out), we = waker_of(&err_stream);

    pty_watch(ptys, SID, false, 0, &wo);
    pty_watch(ptys, SID, true, 0, &we);
    ck_assert_int_eq(got(&out.wakes), 0); /* nothing yet: both wait */
    ck_assert_int_eq(got(&err_stream.wakes), 0);
    write_output_and_sync("hello");
    ck_assert_int_eq(got(&out.wakes), 1);
    ck_assert_int_eq(got(&out.releases), 1);
    ck_assert_int_eq(got(&err_stream.wakes), 0); /* stdout bytes: not its stream */
    ck_assert_int_eq(got(&err_stream.releases), 0);
    pty_unwatch(ptys, &out); /* already released by the event */
    pty_unwatch(ptys, &err_stream);
    ck_assert_int_eq(got(&out.releases), 1);
    ck_assert_int_eq(got(&err_stream.releases), 1);
    ck_assert_int_eq(got(&err_stream.wakes), 0);
}
END_TEST

START_TEST(test_wait_ignores_output_and_wakes_on_exit)
{
    struct counts c = {0};
    struct lb_pty_waker w = waker_of(&c);
    char path[PATH_MAX + 128];

    pty_watch(ptys, SID, false, -1, &w);
    write_output_and_sync("output");
    ck_assert_int_eq(got(&c.wakes), 0);
    snprintf(path, sizeof(path), "%s/exit", sdir);
    put_file(path, "0\n");
    ck_assert_int_eq(wait_for(&c.releases, 1), 1);
    ck_assert_int_eq(got(&c.wakes), 1);
}
END_TEST

START_TEST(test_output_already_there_wakes_at_once_and_stays_registered)
{
    struct counts c = {0};
    struct lb_pty_waker w = waker_of(&c);

    write_output_and_sync("early");
    pty_watch(ptys, SID, false, 0, &w);
    ck_assert_int_eq(got(&c.wakes), 1);    /* ready at once */
    ck_assert_int_eq(got(&c.releases), 0); /* the owner unlinks it */
    pty_unwatch(ptys, &c);
    ck_assert_int_eq(got(&c.releases), 1);
}
END_TEST

START_TEST(test_unwatch_releases_without_waking)
{
    struct counts c = {0};
    struct lb_pty_waker w = waker_of(&c);

    pty_watch(ptys, SID, false, 0, &w);
    pty_unwatch(ptys, &c);
    pty_unwatch(ptys, &c); /* idempotent */
    ck_assert_int_eq(got(&c.wakes), 0);
    ck_assert_int_eq(got(&c.releases), 1);
}
END_TEST

START_TEST(test_takeover_and_service_end_wake_and_release_every_waiter)
{
    struct counts a = {0}, b = {0}, later = {0};
    struct lb_pty_waker wa = waker_of(&a), wb = waker_of(&b), wl = waker_of(&later);
    struct lb_error err = {0};
    char token[LB_PTY_TOKEN_MAX];

    pty_watch(ptys, SID, false, 0, &wa);
    pty_watch(ptys, SID, false, -1, &wb);
    ck_assert_int_eq(pty_attach(ptys, SID, false, token, &err), 0);
    ck_assert_int_eq(got(&a.wakes), 1);
    ck_assert_int_eq(got(&a.releases), 1);
    ck_assert_int_eq(got(&b.wakes), 1);
    ck_assert_int_eq(got(&b.releases), 1);
    pty_watch(ptys, SID, false, 0, &wl);
    pty_service_free(ptys);
    ptys = NULL;
    ck_assert_int_eq(got(&later.wakes), 1);
    ck_assert_int_eq(got(&later.releases), 1);
}
END_TEST

static Suite *pty_suite(void)
{
    Suite *s = suite_create("pty");
    TCase *tc = tcase_create("waker");

    tcase_add_unchecked_fixture(tc, root_setup, root_teardown);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_unknown_session_wakes_and_releases_at_once);
    tcase_add_test(tc, test_output_wakes_the_output_waiter_once);
    tcase_add_test(tc, test_wait_ignores_output_and_wakes_on_exit);
    tcase_add_test(tc, test_output_already_there_wakes_at_once_and_stays_registered);
    tcase_add_test(tc, test_unwatch_releases_without_waking);
    tcase_add_test(tc, test_takeover_and_service_end_wake_and_release_every_waiter);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(pty_suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
