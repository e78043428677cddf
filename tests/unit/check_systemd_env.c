/* check_systemd_env.c - unit tests of what running under systemd and in containers needs:
 * removing sandbox cgroups on a read-only cgroup file system (nspawn mounts v1 controllers so)
 * is not a stop failure, and the log's choice between the journal and plain stderr lines.
 * The journal itself is tested under a real systemd by tests/systemd-unit. Needs root (mount). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "provider/local/cgroup.h"
#include "util/clock.h"
#include "util/log.h"

static char dir[64];

/* A tmpfs at dir holding "made/", remounted read-only. */
static void ro_setup(void)
{
    char path[128];

    snprintf(dir, sizeof(dir), "/tmp/lb-check-ro-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(mount("tmpfs", dir, "tmpfs", 0, "size=1m"), 0);
    snprintf(path, sizeof(path), "%s/made", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    ck_assert_int_eq(mount(NULL, dir, NULL, MS_REMOUNT | MS_RDONLY, NULL), 0);
}

static void ro_teardown(void)
{
    (void)umount2(dir, MNT_DETACH);
    (void)rmdir(dir);
}

START_TEST(test_remove_on_read_only_fs_is_not_a_failure)
{
    struct lb_cgroup cg = {.version = 1};
    struct lb_error err = {0};
    char path[128];
    int64_t t0;

    /* rmdir gets EROFS for both: one we made while it was writable, one never made */
    ck_assert_int_ge(asprintf(&cg.dirs[cg.ndirs++], "%s/made", dir), 0);
    ck_assert_int_ge(asprintf(&cg.dirs[cg.ndirs++], "%s/never-made", dir), 0);
    snprintf(path, sizeof(path), "%s/never-made", dir);
    ck_assert_int_eq(rmdir(path), -1);
    ck_assert_int_eq(errno, EROFS);
    t0 = clock_mono_ms();
    ck_assert_int_eq(cgroup_remove(&cg, clock_mono_ms() + 5000, &err), 0);
    ck_assert_int_lt(clock_mono_ms() - t0, 1000); /* answered, not retried to the deadline */
    snprintf(path, sizeof(path), "%s/made", dir);
    ck_assert_int_eq(access(path, F_OK), 0); /* left in place, nothing else to do */
    cgroup_release(&cg);
}
END_TEST

START_TEST(test_remove_writable_and_gone)
{
    struct lb_cgroup cg = {.version = 1};
    struct lb_error err = {0};
    char base[64];

    snprintf(base, sizeof(base), "/tmp/lb-check-rw-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(base));
    ck_assert_int_ge(asprintf(&cg.dirs[cg.ndirs++], "%s/a", base), 0);
    ck_assert_int_ge(asprintf(&cg.dirs[cg.ndirs++], "%s/gone", base), 0);
    ck_assert_int_eq(mkdir(cg.dirs[0], 0755), 0);
    ck_assert_int_eq(cgroup_remove(&cg, clock_mono_ms() + 1000, &err), 0);
    ck_assert_int_eq(access(cg.dirs[0], F_OK), -1);
    /* a real failure (not empty: ENOTEMPTY) still is one */
    ck_assert_int_eq(mkdir(cg.dirs[0], 0755), 0);
    char sub[128];
    snprintf(sub, sizeof(sub), "%s/x", cg.dirs[0]);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    ck_assert_int_eq(cgroup_remove(&cg, clock_mono_ms() + 1000, &err), -EREMOTEIO);
    ck_assert_ptr_nonnull(strstr(err.message, "cannot remove cgroup"));
    (void)rmdir(sub);
    (void)rmdir(cg.dirs[0]);
    (void)rmdir(base);
    cgroup_release(&cg);
}
END_TEST

/* Log a line with stderr redirected to a file; return what was written. */
static char *log_to_file(void)
{
    char path[] = "/tmp/lb-check-log-XXXXXX", *out = calloc(1, 4096);
    int fd = mkstemp(path), saved = dup(STDERR_FILENO);
    ssize_t n;

    ck_assert_int_ge(fd, 0);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_eq(dup2(fd, STDERR_FILENO), STDERR_FILENO);
    log_set_level(LB_LOG_INFO);
    lb_log_ids(LB_LOG_WARN, "req-1", "sbx-1", "hello %d", 42);
    dup2(saved, STDERR_FILENO);
    close(saved);
    n = pread(fd, out, 4095, 0);
    ck_assert_int_gt(n, 0);
    close(fd);
    unlink(path);
    return out;
}

/* JOURNAL_STREAM that names another file than stderr (a redirect inside a service): plain
 * lines with a time and the level, not journal entries or "<N>" prefixes. Each test runs in a
 * fork (CK_FORK), so the log's first-use decision is made afresh. */
START_TEST(test_log_plain_when_stderr_is_not_the_journal)
{
    char *out;

    setenv("JOURNAL_STREAM", "1:2", 1);
    out = log_to_file();
    ck_assert_msg(strstr(out, " warn lendboxd: hello 42\n") != NULL, "got '%s'", out);
    ck_assert_msg(out[0] == '2' && out[4] == '-', "no timestamp: '%s'", out);
    free(out);
}
END_TEST

START_TEST(test_log_forced_syslog_prefix)
{
    char *out;

    unsetenv("JOURNAL_STREAM");
    log_set_syslog_prefix(true);
    out = log_to_file();
    ck_assert_str_eq(out, "<4>hello 42\n");
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("systemd_env");
    TCase *tc = tcase_create("cgroup_remove");
    TCase *tl = tcase_create("log");
    SRunner *sr;
    int failed;

    tcase_add_checked_fixture(tc, ro_setup, ro_teardown);
    tcase_add_test(tc, test_remove_on_read_only_fs_is_not_a_failure);
    tcase_add_test(tc, test_remove_writable_and_gone);
    suite_add_tcase(s, tc);
    tcase_add_test(tl, test_log_plain_when_stderr_is_not_the_journal);
    tcase_add_test(tl, test_log_forced_syslog_prefix);
    suite_add_tcase(s, tl);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
