/*
 * test_pty_hostile.c - a PTY session's host directory (<state_dir>/pty/<sid>/) is written by
 * the sandbox: the daemon must never be turned against the host through it. The real daemon, real
 * bubblewrap sandboxes, real HTTP.
 *
 * Proves: from inside the sandbox the session directory cannot be reached (no process of the
 * sandbox shows a directory fd, the holder's /proc/<pid>/fd is closed to the command, nothing
 * can be planted through it) and the command inherits no fd but 0-2; with a compromised
 * holder simulated from the host (the test is root): a symlink or hard link to a host file
 * planted as out.0 is never served, a FIFO planted as out.0 or exit does not hang the output
 * poll, the wait or the daemon, symlinks planted as meta.tmp/holder.tmp/in/ctl leave their host
 * targets untouched through attach, input, resize and delete, a directory with symlinks in it
 * is removed without following them, and junk and oversized segments are swept.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define SECRET "HOST-SECRET-CONTENT-7f3a"

static struct lbt_daemon D;
static char SBX[128], OP[256], TMP[128];

static const char *const ARGS[] = {"--set", "limits.max_pty_sessions=8", NULL};

static void prepare(void)
{
    snprintf(TMP, sizeof(TMP), "/tmp/i12-ptyhostile-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(TMP));
}

static void seed(void)
{
    json_t *lease = lbt_seed(&D, "pty-hostile", "task-pty", NULL);

    snprintf(SBX, sizeof(SBX), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    snprintf(OP, sizeof(OP), "%s",
             json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
}

static void release(void)
{
    char cmd[300];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", TMP);
    ck_assert_int_eq(system(cmd), 0);
}

/* A host file the test owns, with known content. */
static void victim_make(const char *name, char *path, size_t len)
{
    FILE *f;

    snprintf(path, len, "%s/%s", TMP, name);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(SECRET "\n", f);
    ck_assert_int_eq(fclose(f), 0);
    ck_assert_int_eq(chmod(path, 0644), 0);
}

static void victim_assert_unchanged(const char *path)
{
    char buf[256] = "";
    FILE *f = fopen(path, "r");

    ck_assert_msg(f, "%s is gone", path);
    ck_assert_uint_eq(fread(buf, 1, sizeof(buf) - 1, f), strlen(SECRET) + 1);
    fclose(f);
    ck_assert_str_eq(buf, SECRET "\n");
}

static void sdir_path(const char *sid, const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/pty/%s/%s", D.state_dir, sid, name);
}

static void pty_create(const char *body, char *sid, size_t sid_len)
{
    char path[256];
    struct lbt_resp r;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pty", SBX);
    lbt_json(&D, "POST", path, OP, body, &r);
    ck_assert_msg(r.status == 201, "create: %ld %s", r.status, r.body);
    snprintf(sid, sid_len, "%s", json_string_value(json_object_get(r.json, "session_id")));
    lbt_resp_free(&r);
}

static void pty_output(const char *sid, unsigned long long since, long wait_ms, struct lbt_resp *r)
{
    char path[300];

    snprintf(path, sizeof(path), "/v1/pty/%s/output?since=%llu&wait_ms=%ld", sid, since, wait_ms);
    lbt_request_ex(&D, "GET", path, "", NULL, 0, NULL, NULL, false, r);
}

static void pty_post(const char *sid, const char *what, const void *body, size_t len,
                     const char *ctype, struct lbt_resp *r)
{
    char path[300];

    snprintf(path, sizeof(path), "/v1/pty/%s/%s", sid, what);
    lbt_request_ex(&D, "POST", path, "", body, len, ctype, NULL, false, r);
}

static void pty_delete(const char *sid)
{
    char path[300];
    struct lbt_resp r;

    snprintf(path, sizeof(path), "/v1/pty/%s", sid);
    lbt_json(&D, "DELETE", path, "", NULL, &r);
    ck_assert_msg(r.status == 204, "delete: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
}

/* The whole output of a command session (polls until X-Exit-Code). malloc'd. */
static char *output_until_exit(const char *sid)
{
    double until = lbt_now() + 180;
    unsigned long long next = 0;
    char *buf = calloc(1, 1);
    size_t len = 0;
    bool exited = false;

    while (!exited && lbt_now() < until) {
        struct lbt_resp r;

        pty_output(sid, next, 2000, &r);
        ck_assert_msg(r.status == 200, "output: %ld %s", r.status, r.body);
        buf = realloc(buf, len + r.len + 1);
        memcpy(buf + len, r.body, r.len);
        len += r.len;
        buf[len] = '\0';
        next += r.len;
        exited = strcasestr(r.headers, "\r\nX-Exit-Code:") != NULL;
        lbt_resp_free(&r);
    }
    ck_assert_msg(exited, "no exit in time: %s", buf);
    return buf;
}

/* ---------- from inside the sandbox ---------- */

START_TEST(test_sandbox_cannot_reach_the_directory)
{
    /* every process of the sandbox: no directory fd visible (the holder's are closed to us);
     * the holder's fd table (it is our parent): not listable, and nothing can be planted
     * through any fd number; our own fds: 0-2 only (the glob's own fd is closed by the time
     * the loop runs) */
    static const char *const body =
        "{\"pty\": false, \"command\": \""
        "for f in /proc/[0-9]*/fd/*; do [ -d \\\"$f\\\" ] && echo \\\"DIRFD $f\\\"; done "
        "2>/dev/null; "
        "if ls /proc/$PPID/fd >/dev/null 2>&1; then echo HOLDER_FDS_OPEN; "
        "else echo HOLDER_FDS_DENIED; fi; "
        "for n in 0 1 2 3 4 5 6 7 8 9 10 11 12; do "
        "ln -s /etc/hostname /proc/$PPID/fd/$n/out.0 2>/dev/null && echo PLANTED $n; "
        "ln -s /etc/hostname /proc/$PPID/fd/$n/out.1 2>/dev/null && echo PLANTED $n; "
        "done; "
        "for f in /proc/$$/fd/*; do echo \\\"OWNFD ${f##*/}\\\"; done; echo END\"}";
    char sid[64], *out;

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");
    pty_create(body, sid, sizeof(sid));
    out = output_until_exit(sid);
    ck_assert_msg(strstr(out, "END\n"), "%s", out);
    ck_assert_msg(!strstr(out, "DIRFD"), "a directory fd is reachable: %s", out);
    ck_assert_msg(strstr(out, "HOLDER_FDS_DENIED\n"), "%s", out);
    ck_assert_msg(!strstr(out, "PLANTED"), "%s", out);
    /* 0, 1, 2 and nothing else (the glob's own directory fd is the only other one listed,
     * and it is 3 at most while the glob runs) */
    for (int fd = 4; fd < 64; fd++) {
        char line[32];

        snprintf(line, sizeof(line), "OWNFD %d\n", fd);
        ck_assert_msg(!strstr(out, line), "the command inherited fd %d: %s", fd, out);
    }
    ck_assert_msg(strstr(out, "OWNFD 0\n") && strstr(out, "OWNFD 2\n"), "%s", out);
    free(out);
    {
        char path[600];
        struct stat st;

        sdir_path(sid, "out.1", path, sizeof(path));
        ck_assert_int_lt(lstat(path, &st), 0);
    }
    pty_delete(sid);
}
END_TEST

/* ---------- a compromised holder, simulated from the host ---------- */

/* Replace name in the session directory with a symlink to target. */
static void plant_symlink(const char *sid, const char *name, const char *target)
{
    char path[600];

    sdir_path(sid, name, path, sizeof(path));
    (void)unlink(path);
    ck_assert_int_eq(symlink(target, path), 0);
}

static void assert_no_secret(const struct lbt_resp *r)
{
    ck_assert_msg(!r->body || !memmem(r->body, r->len, SECRET, strlen(SECRET)),
                  "the daemon served a host file: %ld %.*s", r->status, (int)r->len, r->body);
}

START_TEST(test_planted_segments_are_never_served)
{
    char sid[64], victim[300], path[600];
    struct lbt_resp r;
    struct stat st;

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");
    victim_make("secret", victim, sizeof(victim));
    pty_create("{\"command\": \"sleep 600\"}", sid, sizeof(sid));

    /* a symlink to a host file as out.0 (the current segment) and as out.1 */
    plant_symlink(sid, "out.0", victim);
    plant_symlink(sid, "out.1", victim);
    pty_output(sid, 0, 0, &r);
    assert_no_secret(&r);
    ck_assert_msg(r.status == 200 || r.status == 502, "%ld %s", r.status, r.body);
    lbt_resp_free(&r);
    /* swept: neither is there any more */
    sdir_path(sid, "out.0", path, sizeof(path));
    ck_assert_int_lt(lstat(path, &st), 0);
    sdir_path(sid, "out.1", path, sizeof(path));
    ck_assert_int_lt(lstat(path, &st), 0);

    /* a hard link to a host file (same file system as the state dir) */
    sdir_path(sid, "out.0", path, sizeof(path));
    if (link(victim, path) == 0) {
        pty_output(sid, 0, 0, &r);
        assert_no_secret(&r);
        ck_assert_msg(r.status == 200 || r.status == 502, "%ld %s", r.status, r.body);
        lbt_resp_free(&r);
        ck_assert_int_lt(lstat(path, &st), 0);
    } else {
        ck_assert_int_eq(errno, EXDEV); /* TMP on another file system: nothing to plant */
    }

    /* a symlink as exit: not read (the session has not exited) */
    plant_symlink(sid, "exit", victim);
    pty_output(sid, 0, 0, &r);
    assert_no_secret(&r);
    ck_assert_ptr_null(strcasestr(r.headers, "\r\nX-Exit-Code:"));
    lbt_resp_free(&r);
    victim_assert_unchanged(victim);
    pty_delete(sid);
}
END_TEST

START_TEST(test_planted_fifos_do_not_hang)
{
    char sid[64], path[600], url[300];
    struct lbt_async *a;
    struct lbt_resp r;
    double until;

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");
    pty_create("{\"command\": \"sleep 600\"}", sid, sizeof(sid));
    /* a FIFO where the segment and the exit file belong: opening one to read would block */
    sdir_path(sid, "out.0", path, sizeof(path));
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(mkfifo(path, 0666), 0);
    sdir_path(sid, "exit", path, sizeof(path));
    ck_assert_int_eq(mkfifo(path, 0666), 0);

    snprintf(url, sizeof(url), "/v1/pty/%s/output?since=0&wait_ms=2000", sid);
    a = lbt_async_json(&D, "GET", url, "", NULL);
    until = lbt_now() + 60; /* the poll waits 2 s at most; 60 s is for a loaded machine */
    while (!lbt_async_done(a) && lbt_now() < until)
        lbt_sleep_ms(50);
    ck_assert_msg(lbt_async_done(a), "the output poll hangs on a planted FIFO");
    lbt_async_join(a, &r);
    ck_assert_msg(r.status == 200 || r.status == 502, "%ld %s", r.status, r.body);
    lbt_resp_free(&r);

    snprintf(url, sizeof(url), "/v1/pty/%s/wait?timeout_ms=1000", sid);
    a = lbt_async_json(&D, "GET", url, "", NULL);
    until = lbt_now() + 60;
    while (!lbt_async_done(a) && lbt_now() < until)
        lbt_sleep_ms(50);
    ck_assert_msg(lbt_async_done(a), "the wait hangs on a planted FIFO");
    lbt_async_join(a, &r);
    ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
    ck_assert(json_is_null(json_object_get(r.json, "exit_code")));
    lbt_resp_free(&r);

    /* the FIFO out.0 was swept; the daemon answers everything else */
    sdir_path(sid, "out.0", path, sizeof(path));
    ck_assert(!lbt_path_exists(path));
    lbt_assert_healthy(&D);
    pty_delete(sid);
}
END_TEST

START_TEST(test_planted_symlinks_leave_host_files_alone)
{
    char sid[64], v_meta[300], v_holder[300], v_in[300], v_ctl[300], path[600];
    struct lbt_resp r;
    struct stat st;

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");
    victim_make("v-meta", v_meta, sizeof(v_meta));
    victim_make("v-holder", v_holder, sizeof(v_holder));
    victim_make("v-in", v_in, sizeof(v_in));
    victim_make("v-ctl", v_ctl, sizeof(v_ctl));
    pty_create("{\"command\": \"sleep 600\"}", sid, sizeof(sid));

    /* the daemon's own records are not in the sandbox's directory */
    sdir_path(sid, "meta", path, sizeof(path));
    ck_assert_int_lt(lstat(path, &st), 0);
    snprintf(path, sizeof(path), "%s/pty/%s.meta", D.state_dir, sid);
    ck_assert_int_eq(lstat(path, &st), 0);
    ck_assert(S_ISREG(st.st_mode));
    ck_assert_int_eq(st.st_mode & 07777, 0600);
    ck_assert_int_eq(st.st_uid, 0);

    plant_symlink(sid, "meta.tmp", v_meta);
    plant_symlink(sid, "holder.tmp", v_holder);
    plant_symlink(sid, "holder", v_holder);
    plant_symlink(sid, "in", v_in);
    plant_symlink(sid, "ctl", v_ctl);

    /* attach records the holder (outside the directory) */
    snprintf(path, sizeof(path), "/v1/pty/%s/attach", sid);
    lbt_json(&D, "POST", path, "", "{}", &r);
    ck_assert_msg(r.status == 200 || r.status == 201, "attach: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    /* input and resize refuse to write anything but the holder's FIFOs */
    pty_post(sid, "input", "typed\n", 6, "application/octet-stream", &r);
    lbt_assert_error(&r, 502, "provider_error");
    lbt_resp_free(&r);
    pty_post(sid, "resize", "{\"rows\": 10, \"cols\": 20}", 24, NULL, &r);
    lbt_assert_error(&r, 502, "provider_error");
    lbt_resp_free(&r);
    pty_post(sid, "signal", "{\"signal\": \"INT\"}", 17, NULL, &r);
    lbt_assert_error(&r, 502, "provider_error");
    lbt_resp_free(&r);

    /* a directory holding symlinks to host files, and a symlink to a host directory: the
     * removal follows neither */
    sdir_path(sid, "sub", path, sizeof(path));
    ck_assert_int_eq(mkdir(path, 0777), 0);
    sdir_path(sid, "sub/link", path, sizeof(path));
    ck_assert_int_eq(symlink(v_in, path), 0);
    sdir_path(sid, "sub/dirlink", path, sizeof(path));
    ck_assert_int_eq(symlink(TMP, path), 0);
    plant_symlink(sid, "tmpdir", TMP);

    pty_delete(sid);
    snprintf(path, sizeof(path), "%s/pty/%s", D.state_dir, sid);
    ck_assert(!lbt_path_exists(path));
    snprintf(path, sizeof(path), "%s/pty/%s.meta", D.state_dir, sid);
    ck_assert(!lbt_path_exists(path));
    snprintf(path, sizeof(path), "%s/pty/%s.holder", D.state_dir, sid);
    ck_assert(!lbt_path_exists(path));
    victim_assert_unchanged(v_meta);
    victim_assert_unchanged(v_holder);
    victim_assert_unchanged(v_in);
    victim_assert_unchanged(v_ctl);
    lbt_assert_healthy(&D);
}
END_TEST

START_TEST(test_junk_is_swept)
{
    char sid[64], path[600];
    struct lbt_resp r;
    FILE *f;

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");
    pty_create("{\"command\": \"sleep 600\"}", sid, sizeof(sid));
    /* a file no holder writes, an oversized segment, a segment far behind the window */
    sdir_path(sid, "junk", path, sizeof(path));
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, 8 << 20, SEEK_SET), 0);
    fputc('x', f);
    ck_assert_int_eq(fclose(f), 0);
    sdir_path(sid, "out.9", path, sizeof(path));
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, 256 * 1024, SEEK_SET), 0);
    fputc('x', f); /* 256 KiB + 1: more than a segment holds */
    ck_assert_int_eq(fclose(f), 0);

    pty_output(sid, 0, 0, &r);
    ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
    ck_assert_uint_eq(r.len, 0);
    ck_assert_msg(strcasestr(r.headers, "\r\nX-Next-Offset: 0\r\n"), "%s", r.headers);
    lbt_resp_free(&r);
    sdir_path(sid, "junk", path, sizeof(path));
    ck_assert(!lbt_path_exists(path));
    sdir_path(sid, "out.9", path, sizeof(path));
    ck_assert(!lbt_path_exists(path));
    /* the holder's own files stay */
    sdir_path(sid, "out.0", path, sizeof(path));
    ck_assert(lbt_path_exists(path));
    sdir_path(sid, "in", path, sizeof(path));
    ck_assert(lbt_path_exists(path));
    pty_delete(sid);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("pty_hostile");
    TCase *tc = tcase_create("pty_hostile");

    lbt_fixture_add(tc,
                    &(struct lbt_fixture){.d = &D,
                                          .args = ARGS,
                                          .prepare = prepare,
                                          .seed = seed,
                                          .release = release,
                                          .stop_clean = true},
                    true);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_sandbox_cannot_reach_the_directory);
    tcase_add_test(tc, test_planted_segments_are_never_served);
    tcase_add_test(tc, test_planted_fifos_do_not_hang);
    tcase_add_test(tc, test_planted_symlinks_leave_host_files_alone);
    tcase_add_test(tc, test_junk_is_swept);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
