/*
 * test_reset.c - POST /v1/sandboxes/{id}/reset on the local provider (host and image variants)
 * and the lxd provider (variant lxd: the instance removed and made again under its name; its
 * busybox image has no python3, so the probe makes the SysV segment, nc listens and netstat
 * finds the socket; it has no PTY sessions); docker answers 501 and skips the rest.
 *
 * - integrity: an episode leaves behind a double-forked setsid process, a listening socket,
 *   files in the workdir, /tmp, /run, /dev/shm and (image variant) the root, a changed seed
 *   file, a SysV shared memory segment and a changed hostname; after the reset (200, the same
 *   sandbox_id, session and expires_at, a new token) every one of them is gone or back, the
 *   seed's files hold their content again, the old token answers 401 and the new one works
 * - in place (image host): the init and the writable mounts' modes and sizes are the same
 *   after the reset, and processes that left their session or stopped themselves, SysV
 *   semaphores and message queues, a POSIX message queue and the modes the episode gave the
 *   mounts' roots are gone or back (image variant: a new init, the rest the same)
 * - bad input: an operate token 403, an unknown sandbox 404, an unknown snapshot 404, a
 *   released sandbox 404, a body that is not an object 400
 * - reset to a snapshot of the sandbox and back to the seed; a snapshot of another base 409
 *   (image variant)
 * - a failed reset (fault lend.reset, or provider.reset_in_place) answers 502 and stops the sandbox
 * with stop_reason reset_failed; its token answers 401 and no process of it is left
 * - kill -9 of the daemon between the teardown and the new sandbox: after a restart the sandbox
 *   is stopped (reset_failed), nothing of it runs or stays on disk
 * - acts of the old token admitted before the reset: an exec whose provider call is under way
 *   holds the reset off until it is inside and is ended by it; an exec, upload, PTY session,
 *   pause and harness execute whose turn comes after the reset answer 401; none of them
 *   reaches the next episode; a pause by the agent right after its exec was admitted does not
 *   hold the reset for the exec's timeout (the reset thaws the sandbox)
 * - review (a daemon at the defaults): the init an in-place reset keeps comes back as a fresh
 *   sandbox's (resource limits, nice, CPU affinity the agent set on it); a harness execute of
 *   the old token still waiting when the reset comes never answers with (nor finalizes) the
 *   next episode's activation; the endpoint URL got with the old token reaches nothing of the
 *   next episode
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static struct lbt_daemon D;
static struct lbt_daemon F;                       /* the fault test's own daemon */
static char spec_checked[300], hold_checked[128]; /* test_reset_init_changed_during_reset's */

/* a marker no other process of the machine runs: the leftover process's command line */
#define LEFTOVER "sleep 3133.4242"

static const char *str(json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

static void reset(struct lbt_daemon *d, const char *sbx, const char *token, const char *body,
                  struct lbt_resp *r)
{
    char path[160];

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/reset", sbx);
    lbt_json(d, "POST", path, token, body, r);
}

/* Run command with token in sbx; its stdout (the caller frees it). */
static char *sh_tok(struct lbt_daemon *d, const char *sbx, const char *token, const char *command)
{
    json_t *body = json_pack("{s:s}", "command", command), *res;
    char *text = json_dumps(body, 0), *out;

    res = lbt_exec_ok(d, sbx, token, text);
    out = strdup(str(res, "stdout") ? str(res, "stdout") : "");
    json_decref(res);
    json_decref(body);
    free(text);
    return out;
}

/* What the episode leaves behind, as one line per item the check reads (see LEFTOVERS). */
#define CHECK_COMMON                                                                               \
    "cd /; "                                                                                       \
    "for f in /workspace/w /tmp/t /run/r /dev/shm/s /opt/episode; do "                             \
    "  [ -e $f ] && echo \"file $f\"; done; "                                                      \
    "grep -q root-was-here /etc/passwd && echo 'root changed'; "                                   \
    "[ \"$(cat /workspace/seeded.txt)\" = seed-content ] || echo 'seed file changed'; "            \
    "[ \"$(cat /workspace/sub/b.bin)\" = bytes ] || echo 'seed file b changed'; "                  \
    "[ -e /workspace/sub/extra ] && echo 'seed dir changed'; "                                     \
    "[ \"$(cat /proc/sys/kernel/hostname)\" = episode-host ] && echo 'hostname changed'; "         \
    "awk 'NR > 1 { n++ } END { if (n) print \"sysv shm\", n }' /proc/sysvipc/shm; "                \
    "for p in /proc/[0-9]*; do "                                                                   \
    "  grep -q '[3]133[.]4242' $p/cmdline 2>/dev/null && echo \"process ${p#/proc/}\"; done; "
#define CHECK_PYTHON                                                                               \
    CHECK_COMMON                                                                                   \
    "python3 -c \"import socket; s = socket.socket(); "                                            \
    "print('listening socket') if s.connect_ex(('127.0.0.1', 47613)) == 0 else None\"; "           \
    "true"
/* the same in a busybox image (lxd's): no python3 */
#define CHECK_BUSYBOX                                                                              \
    CHECK_COMMON                                                                                   \
    "netstat -ltn 2>/dev/null | grep -q ':47613 ' && echo 'listening socket'; true"
#define CHECK (busybox() ? CHECK_BUSYBOX : CHECK_PYTHON)

/* The lxd variant's test image is busybox: no python3. */
static bool busybox(void)
{
    return lbt_variant_is("lxd");
}

/* Put build/tests/lbt-probe (beside LENDBOXD) at /tmp/lbt-probe in sbx, with token. */
static void put_probe(struct lbt_daemon *d, const char *sbx, const char *token)
{
    const char *daemon = getenv("LENDBOXD") ? getenv("LENDBOXD") : "build/lendboxd";
    char probe[1024], copy[1024];
    struct lbt_resp r;
    size_t len;
    char *data;
    FILE *f;

    snprintf(copy, sizeof(copy), "%s", daemon);
    snprintf(probe, sizeof(probe), "%s/tests/lbt-probe", dirname(copy));
    f = fopen(probe, "rb");
    ck_assert_msg(f != NULL, "no %s (make build/tests/lbt-probe)", probe);
    data = malloc(4 << 20);
    ck_assert_ptr_nonnull(data);
    len = fread(data, 1, 4 << 20, f);
    fclose(f);
    ck_assert_int_gt(len, 0);
    lbt_file_put(d, sbx, token, "/tmp/lbt-probe", "0755", data, len, &r);
    ck_assert_msg(r.status == 204, "upload of the probe: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    free(data);
}

START_TEST(test_reset_integrity)
{
    const bool image = !lbt_variant_on_host();
    char sbx[LBT_ID_MAX], tok[256], tok2[256], expires[64], path[200], pty[128], *out;
    struct lbt_resp r;
    json_t *lease;

    lease = lbt_seed(&D, "rs-reset", "task-reset",
                     "\"files\": {\"/workspace/seeded.txt\": \"seed-content\", "
                     "\"/workspace/sub/b.bin\": {\"base64\": \"Ynl0ZXM=\"}}");
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    snprintf(expires, sizeof(expires), "%s",
             str(lease, "expires_at") ? str(lease, "expires_at") : "");
    json_decref(lease);
    if (lbt_variant_is("docker")) {
        reset(&D, sbx, "", NULL, &r);
        lbt_assert_error(&r, 501, "not_implemented");
        lbt_resp_free(&r);
        lbt_release_session(&D, "rs-reset");
        return;
    }
    /* a clean sandbox: the check reports nothing */
    out = sh_tok(&D, sbx, tok, CHECK);
    ck_assert_msg(strcmp(out, "") == 0, "fresh sandbox: %s", out);
    free(out);

    /* the episode, with the sandbox's operate token */
    if (busybox())
        put_probe(&D, sbx, tok);
    free(sh_tok(&D, sbx, tok,
                busybox() ? "set -e; echo w > /workspace/w; echo t > /tmp/t; echo r > /run/r; "
                            "echo s > /dev/shm/s; echo changed > /workspace/seeded.txt; "
                            "rm /workspace/sub/b.bin; mkdir /workspace/sub/extra; "
                            "/tmp/lbt-probe shm 0x4c42 >/dev/null; "
                            "(hostname episode-host || echo episode-host > "
                            "/proc/sys/kernel/hostname) 2>/dev/null || true"
                          : "set -e; echo w > /workspace/w; echo t > /tmp/t; echo r > /run/r; "
                            "echo s > /dev/shm/s; echo changed > /workspace/seeded.txt; "
                            "rm /workspace/sub/b.bin; mkdir /workspace/sub/extra; "
                            "python3 -c \"import ctypes; libc = ctypes.CDLL(None); "
                            "assert libc.shmget(0x4c42, 4096, 0o1600) >= 0\"; "
                            "(hostname episode-host || echo episode-host > "
                            "/proc/sys/kernel/hostname) 2>/dev/null || true"));
    if (image)
        free(sh_tok(&D, sbx, tok,
                    "set -e; mkdir -p /opt; echo o > /opt/episode; "
                    "echo root-was-here >> /etc/passwd"));
    /* a double-forked, setsid process, and a listening socket held by another */
    free(sh_tok(&D, sbx, tok,
                "set -e; printf '%s\\n' 'import socket, time' 's = socket.socket()' "
                "'s.bind((\"127.0.0.1\", 47613))' 's.listen()' 'time.sleep(3133.4242)' "
                "> /tmp/listen.py"));
    json_decref(lbt_exec_ok(&D, sbx, tok,
                            busybox()
                                ? "{\"command\": \"setsid sh -c '(" LEFTOVER " &); "
                                  "(nc -l -p 47613 &)' </dev/null >/dev/null 2>&1; sleep 1\", "
                                  "\"preserve_background_services\": true}"
                                : "{\"command\": \"setsid sh -c '(" LEFTOVER " &); "
                                  "(python3 /tmp/listen.py &)' </dev/null >/dev/null 2>&1; "
                                  "sleep 1\", \"preserve_background_services\": true}"));
    out = sh_tok(&D, sbx, tok, CHECK);
    /* the check sees what the episode left (the hostname where the sandbox may set it) */
    ck_assert_msg(strstr(out, "file /workspace/w") && strstr(out, "file /tmp/t") &&
                      strstr(out, "file /run/r") && strstr(out, "file /dev/shm/s") &&
                      strstr(out, "seed file changed") && strstr(out, "seed file b changed") &&
                      strstr(out, "seed dir changed") && strstr(out, "sysv shm 1") &&
                      strstr(out, "process ") && strstr(out, "listening socket") &&
                      (!image || (strstr(out, "file /opt/episode") && strstr(out, "root changed"))),
                  "episode left: %s", out);
    if (!strstr(out, "hostname changed"))
        lbt_skip_note(__func__, "the sandbox's commands cannot set its hostname (they run "
                                "without capabilities); that item is not checked");
    free(out);
    ck_assert_int_gt(lbt_count_procs_cmdline(LEFTOVER), 0);

    /* a terminal session, ended by the reset (lxd has none: capability pty) */
    pty[0] = '\0';
    if (!lbt_variant_is("lxd")) {
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/pty", sbx);
        lbt_json(&D, "POST", path, tok, "{\"command\": \"cat\"}", &r);
        ck_assert_msg(r.status == 201, "pty: %ld %s", r.status, r.body);
        snprintf(pty, sizeof(pty), "%s", str(r.json, "session_id"));
        lbt_resp_free(&r);
    } else {
        lbt_skip_note(__func__, "the lxd provider has no PTY sessions: none to end");
    }

    /* the operate token may not reset */
    reset(&D, sbx, tok, NULL, &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);

    reset(&D, sbx, "", "{}", &r);
    ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
    ck_assert_str_eq(str(r.json, "sandbox_id"), sbx);
    ck_assert_str_eq(str(r.json, "resources_session_id"), "rs-reset");
    ck_assert_str_eq(str(r.json, "state"), "lent");
    ck_assert_str_eq(str(r.json, "expires_at") ? str(r.json, "expires_at") : "", expires);
    snprintf(tok2, sizeof(tok2), "%s", str(json_object_get(r.json, "access"), "token"));
    ck_assert_str_ne(tok2, tok);
    ck_assert_int_eq(strncmp(tok2, "lbo_", 4), 0);
    lbt_resp_free(&r);

    /* the old token is dead, the new one works, and nothing of the episode is left */
    lbt_exec(&D, sbx, tok, "{\"command\": \"true\"}", &r);
    ck_assert_int_eq(r.status, 401);
    lbt_resp_free(&r);
    ck_assert_int_eq(lbt_count_procs_cmdline(LEFTOVER), 0);
    out = sh_tok(&D, sbx, tok2, CHECK);
    ck_assert_msg(strcmp(out, "") == 0, "after the reset: %s", out);
    free(out);
    if (pty[0]) {
        snprintf(path, sizeof(path), "/v1/pty/%s/wait?timeout_ms=100", pty);
        lbt_json(&D, "GET", path, "", NULL, &r);
        lbt_assert_error(&r, 404, "not_found");
        lbt_resp_free(&r);
    }
    /* the session's lease names the same sandbox with the new token */
    lbt_json(&D, "GET", "/v1/sessions/rs-reset", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(str(r.json, "sandbox_id"), sbx);
    ck_assert_str_eq(str(json_object_get(r.json, "access"), "token"), tok2);
    lbt_resp_free(&r);

    /* a second reset mints yet another token */
    reset(&D, sbx, "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_ne(str(json_object_get(r.json, "access"), "token"), tok2);
    ck_assert_str_ne(str(json_object_get(r.json, "access"), "token"), tok);
    lbt_resp_free(&r);
    lbt_release_session(&D, "rs-reset");
}
END_TEST

/* What the in-place test compares before and after: the init's start time, and the mode and
 * size of every writable mount, one line. */
#define STATE_CHECK                                                                                \
    "cut -d' ' -f22 /proc/1/stat; stat -c '%n %a' /tmp /dev/shm /run /workspace; "                 \
    "df -k /tmp /dev/shm /run /workspace | awk 'NR > 1 { print $2 }'; "                            \
    "stat -c '%n %a %u' /dev/pts /dev/pts/ptmx; (exec 3<>/dev/ptmx) && echo pty; "                 \
    "[ -f /run/lendbox/supervise ] && echo supervisor"
/* The episode's IPC objects: a SysV semaphore set and message queue, a POSIX message queue
 * (mq_open is in libc since glibc 2.34; the image variant has no librt) */
#define IPC_MAKE                                                                                   \
    "python3 -c \"import ctypes, os; libc = ctypes.CDLL(None); "                                   \
    "assert libc.semget(0x4c43, 1, 0o1600) >= 0; assert libc.msgget(0x4c44, 0o1600) >= 0; "        \
    "assert libc.mq_open(b'/lbq', os.O_CREAT | os.O_RDWR, 0o600, None) >= 0\""
#define IPC_CHECK                                                                                  \
    "for f in sem msg; do awk -v f=$f 'NR > 1 { n++ } END { if (n) print \"sysv\", f, n }' "       \
    "/proc/sysvipc/$f; done; "                                                                     \
    "python3 -c \"import ctypes, os; libc = ctypes.CDLL(None); "                                   \
    "print('posix mq') if libc.mq_open(b'/lbq', os.O_RDWR) >= 0 else None\"; true"

/* A sandbox of image host is reset in place (its init, namespaces and mounts' sizes kept; a
 * sandbox of an image is stopped and made again, a new init): processes that left their
 * session or stopped themselves, SysV semaphores and message queues, a POSIX message queue,
 * the modes the episode gave the roots of its writable mounts and /dev/pts and its ptmx (no pty
 * for the next episode); all gone or back. */
/* The pid of daemon d's spare reset helper (lendbox-supervise --reset-spare, its child) other
 * than not (0: any), once one runs (at most wait_ms), or 0. */
static pid_t spare_find(const struct lbt_daemon *d, pid_t not, int wait_ms)
{
    for (int waited = 0;; waited += 10) {
        DIR *dir = opendir("/proc");
        struct dirent *e;
        pid_t found = 0;

        ck_assert_ptr_nonnull(dir);
        while (!found && (e = readdir(dir))) {
            char path[300], *cmdline;
            size_t n = 0;

            if (e->d_name[0] < '1' || e->d_name[0] > '9' || atoi(e->d_name) == not ||
                lbt_proc_ppid(atoi(e->d_name)) != d->pid)
                continue;
            snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
            cmdline = lbt_proc_read(path, &n);
            /* argv[0] NUL argv[1] NUL */
            if (cmdline && strlen(cmdline) + 1 < n &&
                strcmp(cmdline + strlen(cmdline) + 1, "--reset-spare") == 0)
                found = atoi(e->d_name);
            free(cmdline);
        }
        closedir(dir);
        if (found || waited >= wait_ms)
            return found;
        usleep(10000);
    }
}

/* Daemon d's spare, once one runs (at most 30 s: a loaded machine may take long to start one),
 * or 0. */
static pid_t spare_of(const struct lbt_daemon *d)
{
    return spare_find(d, 0, 30000);
}

/* How many times process pid gave up the CPU waiting (voluntary_ctxt_switches): the spare
 * does at least twice per reset it serves (it wakes for the request, waits for its child),
 * never while it waits. -1 when unreadable. */
static long waits_of(pid_t pid)
{
    char path[64], *text, *p;
    long n = -1;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    text = lbt_proc_read(path, NULL);
    if (text && (p = strstr(text, "\nvoluntary_ctxt_switches:")))
        n = strtol(p + strlen("\nvoluntary_ctxt_switches:"), NULL, 10);
    free(text);
    return n;
}

/* What daemon d's log says of its spare reset helper: its last lines naming it, at most ~2 KiB
 * (for a failure's message; the caller frees it). */
static char *spare_said(const struct lbt_daemon *d)
{
    char *log = lbt_proc_read(d->log_path, NULL), *out = calloc(1, 2048), *line, *save = NULL;
    size_t len = 0;

    ck_assert_ptr_nonnull(out);
    for (line = log ? strtok_r(log, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save)) {
        size_t k = strlen(line);

        if (!strstr(line, "spare"))
            continue;
        if (len + k + 2 > 2047) /* keep the last ones */
            len = 0;
        memcpy(out + len, line, k);
        len += k;
        out[len++] = '\n';
        out[len] = '\0';
    }
    free(log);
    if (len == 0)
        snprintf(out, 2048, "(nothing of a spare)");
    return out;
}

/* An episode's leftovers in a sandbox of d reset in place are gone (the reset done by the spare
 * helper, or with fault reset.spare by a helper it execs) */
static void reset_in_place_on(struct lbt_daemon *d, const char *rsid, bool spare,
                              const char *leftover)
{
    char sbx[LBT_ID_MAX], tok[256], cmd[512], *before, *after, *out;
    struct lbt_resp r;
    json_t *lease;
    pid_t spare_before, spare_after;
    long waits_before;

    lease = lbt_seed(d, rsid, "task-reset", NULL);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
    before = sh_tok(d, sbx, tok, STATE_CHECK);
    ck_assert_msg(strstr(before, "/tmp 1777") && strstr(before, "/dev/shm 1777") &&
                      strstr(before, "/run 755") && strstr(before, "supervisor"),
                  "fresh sandbox: %s", before);
    out = sh_tok(d, sbx, tok, IPC_CHECK);
    ck_assert_msg(strcmp(out, "") == 0, "fresh sandbox: %s", out);
    free(out);

    /* the episode */
    free(sh_tok(d, sbx, tok,
                "set -e; " IPC_MAKE "; chmod 700 /tmp /dev/shm; chmod 777 /run; "
                "chmod 0 /dev/pts/ptmx /dev/pts"));
    snprintf(cmd, sizeof(cmd),
             "{\"command\": \"setsid sh -c '(sh -c \\\"kill -STOP \\\\$\\\\$; %s\\\" &); "
             "(setsid %s &)' </dev/null >/dev/null 2>&1; sleep 0.5\", "
             "\"preserve_background_services\": true}",
             leftover, leftover);
    json_decref(lbt_exec_ok(d, sbx, tok, cmd));
    out = sh_tok(d, sbx, tok, IPC_CHECK);
    ck_assert_msg(strstr(out, "sysv sem 1") && strstr(out, "sysv msg 1") && strstr(out, "posix mq"),
                  "episode left: %s", out);
    free(out);
    out = sh_tok(d, sbx, tok,
                 "stat -c '%n %a' /tmp /dev/shm /run /dev/pts; ls /proc | grep -c '^[0-9]'");
    ck_assert_msg(strstr(out, "/tmp 700") && strstr(out, "/run 777") && strstr(out, "/dev/pts 0"),
                  "episode left: %s", out);
    free(out);
    ck_assert_int_gt(lbt_count_procs_cmdline(leftover), 0);

    /* the spare waits before the reset; the reset is its work (it waits for the next one
     * after), unless fault reset.spare keeps it out and the reset execs its own helper */
    spare_before = spare_of(d);
    if (spare_before <= 0) {
        char *said = spare_said(d);

        ck_abort_msg("no spare reset helper waits; the daemon said: %s", said);
    }
    waits_before = waits_of(spare_before);
    ck_assert_int_ge(waits_before, 0);
    reset(d, sbx, "", "{}", &r);
    ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(r.json, "access"), "token"));
    lbt_resp_free(&r);

    ck_assert_int_eq(lbt_count_procs_cmdline(leftover), 0);
    out = sh_tok(d, sbx, tok, IPC_CHECK);
    ck_assert_msg(strcmp(out, "") == 0, "after the reset: %s", out);
    free(out);
    /* nothing runs but the init and the check itself (sh, and what it runs) */
    out = sh_tok(d, sbx, tok,
                 "for p in /proc/[0-9]*; do [ \"${p#/proc/}\" = 1 ] || [ \"${p#/proc/}\" = $$ ] || "
                 "[ \"${p#/proc/}\" = $PPID ] || [ ! -e $p/cmdline ] || "
                 "{ c=$(tr '\\0' ' ' < $p/cmdline); [ -n \"$c\" ] && echo \"$c\"; }; done | "
                 "grep -v -e '^for ' -e 'tr ' -e 'grep ' -e '^sh ' || true");
    ck_assert_msg(strcmp(out, "") == 0, "processes after the reset: %s", out);
    free(out);
    after = sh_tok(d, sbx, tok, STATE_CHECK);
    if (lbt_variant_on_host()) { /* in place: the same init, the same mounts' modes and sizes */
        ck_assert_str_eq(after, before);
    } else { /* made again: a new init (the first line), the same modes and sizes */
        ck_assert_str_ne(after, before);
        ck_assert_str_eq(strchr(after, '\n'), strchr(before, '\n'));
    }
    free(before);
    free(after);
    spare_after = spare_of(d);
    ck_assert_int_eq(spare_after, spare_before);
    if (spare)
        ck_assert_int_ge(waits_of(spare_after), waits_before + 2);
    else
        ck_assert_int_eq(waits_of(spare_after), waits_before);
    lbt_release_session(d, rsid);
}

START_TEST(test_reset_in_place)
{
    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    LBT_SKIP_ON_VARIANT("lxd", "the lxd provider resets by a new instance; its image has no "
                               "python3 (the integrity test covers it)");
    reset_in_place_on(&D, "rs-reset-ip", lbt_variant_on_host(), "sleep 3133.4243");
}
END_TEST

/* the same reset by a helper the reset execs itself (what it does when the spare is taken by
 * another reset at the same moment, or failed to start) */
START_TEST(test_reset_in_place_exec_helper)
{
    const char *args[] = {"--set", "faults.spec=reset.spare=fail", "--set",
                          "local.reset_in_place=yes", NULL};

    pid_t spare;

    if (!lbt_variant_on_host()) {
        lbt_skip_note(__func__, "an in-place reset is of a sandbox of image host");
        return;
    }
    lbt_daemon_start(&F, args);
    reset_in_place_on(&F, "rs-reset-ipx", false, "sleep 3133.4244");
    spare = spare_of(&F);
    ck_assert_int_gt(spare, 0);
    lbt_daemon_stop(&F);
    /* its spare ended with it (its socket's end) */
    for (int i = 0; i < 500 && kill(spare, 0) == 0; i++)
        usleep(10000);
    ck_assert_int_eq(kill(spare, 0), -1);
}
END_TEST

/* A reset answered and its sandbox released at once (its init killed, with it whatever of the
 * reset still ran in the sandbox's pid namespace): the spare that served the reset serves the
 * next one, every time. (A spare whose child in the sandbox was killed after it said "reset"
 * used to exit while the daemon counted it as waiting: no spare until the next reset found it
 * dead, as one CI run saw.) */
START_TEST(test_reset_spare_survives_release)
{
    pid_t spare;

    if (!lbt_variant_on_host()) {
        lbt_skip_note(__func__, "an in-place reset is of a sandbox of image host");
        return;
    }
    spare = spare_of(&D);
    ck_assert_int_gt(spare, 0);
    for (int i = 0; i < 12; i++) {
        char rsid[64], sbx[LBT_ID_MAX];
        struct lbt_resp r;
        json_t *lease;
        pid_t now;

        snprintf(rsid, sizeof(rsid), "rs-reset-rel-%d", i);
        lease = lbt_seed(&D, rsid, "task-reset", NULL);
        snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
        json_decref(lease);
        reset(&D, sbx, "", "{}", &r);
        ck_assert_msg(r.status == 200, "reset %d: %ld %s", i, r.status, r.body);
        lbt_resp_free(&r);
        lbt_release_session(&D, rsid);
        now = spare_of(&D);
        ck_assert_msg(now == spare, "after reset and release %d: the spare is %d, was %d", i,
                      (int)now, (int)spare);
    }
}
END_TEST

/* A waiting spare killed (by an operator, the OOM killer): the daemon sees it end, says so,
 * and starts another, which serves the next reset. */
START_TEST(test_reset_spare_killed)
{
    pid_t spare, next;
    char *log;

    if (!lbt_variant_on_host()) {
        lbt_skip_note(__func__, "an in-place reset is of a sandbox of image host");
        return;
    }
    spare = spare_of(&D);
    ck_assert_int_gt(spare, 0);
    ck_assert_int_eq(kill(spare, SIGKILL), 0);
    next = spare_find(&D, spare, 30000);
    ck_assert_msg(next > 0, "no spare after %d was killed", (int)spare);
    log = lbt_proc_read(D.log_path, NULL);
    ck_assert_ptr_nonnull(log);
    ck_assert_msg(strstr(log, "spare reset helper") && strstr(log, "ended while it waited") &&
                      strstr(log, "killed by signal 9"),
                  "the log does not say the spare ended");
    free(log);
    reset_in_place_on(&D, "rs-reset-spare-killed", true, "sleep 3133.4245");
}
END_TEST

START_TEST(test_reset_bad_input)
{
    char sbx[LBT_ID_MAX];
    struct lbt_resp r;
    json_t *lease;

    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    lease = lbt_seed(&D, "rs-reset-bad", "task-reset", NULL);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    json_decref(lease);
    reset(&D, "sbx-nosuch", "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    reset(&D, sbx, "", "{\"snapshot\": \"no-such-snapshot\"}", &r);
    ck_assert_int_eq(r.status, 404);
    lbt_resp_free(&r);
    reset(&D, sbx, "", "{\"snapshot\": \"bad name!\"}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    reset(&D, sbx, "", "[1]", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    /* the failed requests left the sandbox as it was */
    free(lbt_sh(&D, sbx, "true"));
    lbt_release_session(&D, "rs-reset-bad");
    reset(&D, sbx, "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
}
END_TEST

/* A connection to D with the head of a request sent and its body held back. */
static int send_head(const char *head)
{
    struct sockaddr_in dst = {.sin_family = AF_INET};
    const char *hostport = D.base_url + strlen("http://");
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    ck_assert_int_ge(fd, 0);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    dst.sin_port = htons((uint16_t)atoi(strrchr(hostport, ':') + 1));
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&dst, sizeof(dst)), 0);
    ck_assert_int_eq(send(fd, head, strlen(head), MSG_NOSIGNAL), (ssize_t)strlen(head));
    return fd;
}

/* Send the rest (body) on fd and read the answer's status line (closes fd). */
static long send_rest(int fd, const char *body, char *out, size_t out_len)
{
    size_t got = 0;
    long status = 0;

    ck_assert_int_eq(send(fd, body, strlen(body), MSG_NOSIGNAL), (ssize_t)strlen(body));
    for (double end = lbt_now() + 30; got + 1 < out_len && lbt_now() < end;) {
        struct pollfd p = {fd, POLLIN, 0};
        ssize_t n;

        if (poll(&p, 1, 200) <= 0)
            continue;
        n = recv(fd, out + got, out_len - 1 - got, 0);
        if (n <= 0)
            break;
        got += (size_t)n;
        out[got] = '\0';
        if (strstr(out, "\r\n\r\n") && strchr(strstr(out, "\r\n\r\n"), '}'))
            break;
    }
    out[got] = '\0';
    close(fd);
    sscanf(out, "HTTP/1.%*d %ld", &status);
    return status;
}

/* A request admitted with the old token before the reset (its headers in), whose body comes
 * after it, is refused when it would act (401): the previous episode's agent cannot reach the
 * next episode's sandbox by holding back a body. The same for a file upload. */
START_TEST(test_reset_refuses_request_admitted_before)
{
    static const char cmd[] = "{\"command\": \"touch /workspace/late\"}";
    char sbx[LBT_ID_MAX], old_tok[160], head[1024], ans[4096], *out;
    struct lbt_resp r;
    json_t *lease;
    int fd_exec, fd_put;

    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    lease = lbt_seed(&D, "rs-reset-late", "task-reset", NULL);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(old_tok, sizeof(old_tok), "%s",
             json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
    snprintf(head, sizeof(head),
             "POST /v1/sandboxes/%s/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
             sbx, old_tok, strlen(cmd));
    fd_exec = send_head(head);
    snprintf(head, sizeof(head),
             "PUT /v1/sandboxes/%s/files?path=/workspace/late-upload HTTP/1.1\r\nHost: x\r\n"
             "Authorization: Bearer %s\r\nContent-Length: 5\r\n\r\n",
             sbx, old_tok);
    fd_put = send_head(head);
    lbt_sleep_ms(300); /* both heads are in (authorized) before the reset */
    reset(&D, sbx, "", NULL, &r);
    ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
    char new_tok[160];

    snprintf(new_tok, sizeof(new_tok), "%s",
             json_string_value(json_object_get(json_object_get(r.json, "access"), "token")));
    lbt_resp_free(&r);
    ck_assert_int_eq(send_rest(fd_exec, cmd, ans, sizeof(ans)), 401);
    ck_assert_ptr_nonnull(strstr(ans, "\"unauthorized\""));
    send_rest(fd_put, "hello", ans, sizeof(ans));
    ck_assert_msg(strncmp(ans, "HTTP/1.1 2", 10) != 0, "the held upload landed: %.60s", ans);
    out = sh_tok(&D, sbx, new_tok,
                 "ls /workspace/late /workspace/late-upload 2>/dev/null; echo done");
    ck_assert_str_eq(out, "done\n");
    free(out);
    lbt_release_session(&D, "rs-reset-late");
}
END_TEST

/* The previous episode's harness activation is not the next one's: after a reset the session
 * has none (404), and a new execute starts one. */
START_TEST(test_reset_ends_activation)
{
    char sbx[LBT_ID_MAX];
    struct lbt_resp r;
    json_t *lease;

    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    lease = lbt_seed(&D, "rs-reset-act", "task-reset", NULL);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    json_decref(lease);
    lbt_json(&D, "POST", "/v1/sessions/rs-reset-act/execute", "",
             "{\"argv\": [\"sh\", \"-c\", \"echo episode-one > /workspace/o\"], "
             "\"collect\": [\"/workspace/o\"]}",
             &r);
    ck_assert_msg(r.status == 200, "execute: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/sessions/rs-reset-act/activation", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    reset(&D, sbx, "", NULL, &r);
    ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    lbt_json(&D, "GET", "/v1/sessions/rs-reset-act/activation", "", NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", "/v1/sessions/rs-reset-act/execute", "",
             "{\"argv\": [\"sh\", \"-c\", \"cat /workspace/o 2>/dev/null; echo two\"]}", &r);
    ck_assert_msg(r.status == 200, "execute after the reset: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    lbt_release_session(&D, "rs-reset-act");
}
END_TEST

/* A sandbox made by POST /v1/sandboxes has no session (no session lock to hold off the lost
 * check): its reset to a snapshot still completes (200, running, its new token works) and is
 * never taken for a lost sandbox while it is torn down. */
START_TEST(test_reset_without_session)
{
    char sbx[LBT_ID_MAX], path[200], tok[256], *out;
    struct lbt_resp r;

    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    lbt_json(&D, "POST", "/v1/sandboxes", "", "{}", &r);
    ck_assert_msg(r.status == 201, "create: %ld %s", r.status, r.body);
    snprintf(sbx, sizeof(sbx), "%s", str(r.json, "sandbox_id"));
    lbt_resp_free(&r);
    free(lbt_sh(&D, sbx, "echo snapped > /workspace/m"));
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/snapshot", sbx);
    lbt_json(&D, "POST", path, "", "{\"name\": \"rst-nosession\"}", &r);
    ck_assert_msg(r.status == 201, "snapshot: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    free(lbt_sh(&D, sbx, "echo later > /workspace/m"));
    for (int i = 0; i < 3; i++) {
        reset(&D, sbx, "", "{\"snapshot\": \"rst-nosession\"}", &r);
        ck_assert_msg(r.status == 200, "reset %d: %ld %s", i, r.status, r.body);
        snprintf(tok, sizeof(tok), "%s", str(json_object_get(r.json, "access"), "token"));
        lbt_resp_free(&r);
        out = sh_tok(&D, sbx, tok, "cat /workspace/m");
        ck_assert_str_eq(out, "snapped\n");
        free(out);
    }
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    lbt_json(&D, "GET", path, "", NULL, &r);
    ck_assert_str_eq(str(r.json, "status"), "running");
    lbt_resp_free(&r);
    lbt_json(&D, "DELETE", path, "", NULL, &r);
    ck_assert_msg(r.status == 200 || r.status == 204, "delete: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    lbt_json(&D, "DELETE", "/v1/images/rst-nosession", "", NULL, &r);
    ck_assert_msg(r.status == 200 || r.status == 204, "image delete: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
}
END_TEST

/* POST /v1/sandboxes/{id}/reset with token and body; the new token into tok (on 200). */
static long reset_to(const char *sbx, const char *body, char *tok)
{
    struct lbt_resp r;
    long st;

    reset(&D, sbx, "", body, &r);
    st = r.status;
    if (st == 200)
        snprintf(tok, 256, "%s", str(json_object_get(r.json, "access"), "token"));
    else
        fprintf(stderr, "reset %s: %ld %s\n", body ? body : "", st, r.body);
    lbt_resp_free(&r);
    return st;
}

START_TEST(test_reset_to_snapshot)
{
    char sbx[LBT_ID_MAX], tok[256], other[LBT_ID_MAX], path[200], *out;
    struct lbt_resp r;
    json_t *lease;

    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    lease = lbt_seed(&D, "rs-reset-snap", "task-reset", "\"files\": {\"/workspace/s\": \"seed\"}");
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
    free(sh_tok(&D, sbx, tok, "echo kept > /workspace/snapped; echo tmp > /tmp/t"));
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/snapshot", sbx);
    lbt_json(&D, "POST", path, "", "{\"name\": \"rst-snap\"}", &r);
    ck_assert_msg(r.status == 201, "snapshot: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    free(sh_tok(&D, sbx, tok, "rm /workspace/snapped; echo later > /workspace/later"));

    /* to the snapshot: its workdir (and the seed's files), not what came after, no /tmp */
    ck_assert_int_eq(reset_to(sbx, "{\"snapshot\": \"rst-snap\"}", tok), 200);
    out = sh_tok(&D, sbx, tok, "ls /workspace /tmp; cat /workspace/snapped");
    ck_assert_str_eq(out, "/tmp:\n\n/workspace:\ns\nsnapped\nkept\n");
    free(out);
    /* then back to the seed */
    ck_assert_int_eq(reset_to(sbx, NULL, tok), 200);
    out = sh_tok(&D, sbx, tok, "ls /workspace; cat /workspace/s");
    ck_assert_str_eq(out, "s\nseed");
    free(out);

    /* a snapshot of another base: 409, and the sandbox is left as it was */
    lease = lbt_seed(&D, "rs-reset-other", "task-reset",
                     lbt_variant_on_host() ? NULL : "\"image\": \"host\"");
    snprintf(other, sizeof(other), "%s", str(lease, "sandbox_id"));
    json_decref(lease);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/snapshot", other);
    lbt_json(&D, "POST", path, "", "{\"name\": \"rst-other\"}", &r);
    ck_assert_msg(r.status == 201, "snapshot: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    if (!lbt_variant_on_host()) {
        reset(&D, sbx, "", "{\"snapshot\": \"rst-other\"}", &r);
        lbt_assert_error(&r, 409, "conflict");
        lbt_resp_free(&r);
        free(sh_tok(&D, sbx, tok, "true"));
    } else {
        lbt_skip_note(__func__, "every sandbox of this variant stands on the host: no other "
                                "base to refuse (the image variant checks the 409)");
    }
    lbt_release_session(&D, "rs-reset-other");
    lbt_release_session(&D, "rs-reset-snap");
    lbt_json(&D, "DELETE", "/v1/images/rst-other", "", NULL, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
    lbt_json(&D, "DELETE", "/v1/images/rst-snap", "", NULL, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
}
END_TEST

/* A reset failed by the fault spec (a daemon started with it) answers 502 and stops the
 * sandbox (reset_failed): its process is gone, its token 401, its session without a lease. */
static void failed_reset_stops(const char *spec, const char *rsid)
{
    const char *args[] = {"--set", spec, "--set", "local.reset_in_place=yes", NULL};
    char sbx[LBT_ID_MAX], tok[256], path[160];
    struct lbt_resp r;
    json_t *lease, *rec, *list;

    lbt_daemon_start(&F, args);
    lease = lbt_seed(&F, rsid, "task-reset", NULL);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
    json_decref(
        lbt_exec_ok(&F, sbx, tok,
                    "{\"command\": \"setsid sh -c '(" LEFTOVER " &)' </dev/null "
                    ">/dev/null 2>&1; sleep 0.2\", \"preserve_background_services\": true}"));
    ck_assert_int_gt(lbt_count_procs_cmdline(LEFTOVER), 0);
    reset(&F, sbx, "", NULL, &r);
    lbt_assert_error(&r, 502, "provider_error");
    ck_assert_ptr_nonnull(strstr(r.body, "reset_failed"));
    lbt_resp_free(&r);
    /* stopped, not lent half-reset */
    list = lbt_list_sandboxes(&F);
    rec = lbt_find_record(list, sbx);
    ck_assert_ptr_nonnull(rec);
    ck_assert_str_eq(str(rec, "state"), "stopped");
    ck_assert_str_eq(str(rec, "stop_reason"), "reset_failed");
    json_decref(list);
    ck_assert_int_eq(lbt_count_procs_cmdline(LEFTOVER), 0);
    lbt_exec(&F, sbx, tok, "{\"command\": \"true\"}", &r);
    ck_assert_int_eq(r.status, 401);
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/sessions/%s", rsid);
    lbt_json(&F, "GET", path, "", NULL, &r);
    ck_assert_int_eq(r.status, 404);
    lbt_resp_free(&r);
}

/* A daemon without CAP_SYS_CHROOT (a unit's CapabilityBoundingSet without it) cannot enter a
 * mount namespace from outside its user namespace: it says so at the start, resets by a stop
 * and a create (the init changes) instead of failing every in-place reset, and starts bwrap in
 * its own namespace (a seed works). */
START_TEST(test_reset_without_sys_chroot)
{
    const char *args[] = {"--set", "local.reset_in_place=yes", NULL};
    char *real = strdup(getenv("LENDBOXD") ? getenv("LENDBOXD") : "build/lendboxd");
    char wrapper[128], sbx[LBT_ID_MAX], tok[256], *before, *after, *abs_real;
    struct lbt_resp r;
    json_t *lease;
    FILE *f;

    if (!lbt_variant_on_host()) {
        lbt_skip_note(__func__, "an in-place reset is of a sandbox of image host");
        return;
    }
    ck_assert_ptr_nonnull(real);
    abs_real = realpath(real, NULL);
    ck_assert_ptr_nonnull(abs_real);
    snprintf(wrapper, sizeof(wrapper), "/tmp/lbt-nochroot-%d.sh", (int)getpid());
    f = fopen(wrapper, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f,
            "#!/bin/sh\nexec setpriv --bounding-set -sys_chroot --inh-caps -sys_chroot %s \"$@\"\n",
            abs_real);
    fclose(f);
    free(abs_real);
    ck_assert_int_eq(chmod(wrapper, 0755), 0);
    setenv("LENDBOXD", wrapper, 1);
    lbt_daemon_start(&F, args);
    setenv("LENDBOXD", real, 1);
    free(real);
    unlink(wrapper);
    ck_assert_int_eq(lbt_log_count(&F, "lacks CAP_SYS_CHROOT"), 1);
    lease = lbt_seed(&F, "rs-nochroot", "task-reset", NULL);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
    before = sh_tok(&F, sbx, tok, "cat /proc/1/stat | cut -d' ' -f22");
    free(sh_tok(&F, sbx, tok, "touch /tmp/left"));
    reset(&F, sbx, "", "{}", &r);
    ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(r.json, "access"), "token"));
    lbt_resp_free(&r);
    after = sh_tok(&F, sbx, tok, "cat /proc/1/stat | cut -d' ' -f22; ls /tmp");
    /* a new init (its start time differs), nothing left in /tmp */
    ck_assert_msg(strncmp(after, before, strlen(before)) != 0, "same init: %s", after);
    ck_assert_str_eq(strchr(after, '\n') + 1, "");
    free(before);
    free(after);
    lbt_release_session(&F, "rs-nochroot");
    lbt_daemon_stop(&F);
}
END_TEST

START_TEST(test_reset_failed_stops)
{
    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    failed_reset_stops("faults.spec=lend.reset=fail:1", "rs-reset-fail");
}
END_TEST

/* the same when the provider's in-place reset itself fails */
START_TEST(test_reset_in_place_failed_stops)
{
    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    LBT_SKIP_ON_VARIANT("lxd", "the lxd provider has no in-place reset");
    failed_reset_stops("faults.spec=provider.reset_in_place=fail:1", "rs-reset-ipfail");
}
END_TEST

/* kill -9 of the daemon in the middle of a reset (the sandbox torn down, not yet made again:
 * fault lend.reset=delay), then a restart: the sandbox is stopped with reset_failed, nothing of
 * it runs or stays on disk, its session has no lease and its old token answers 401 */
START_TEST(test_reset_killed)
{
    const char *args[] = {"--set", "faults.spec=lend.reset=delay:30000", NULL};
    char sbx[LBT_ID_MAX], tok[256], path[600];
    struct lbt_async *job;
    struct lbt_resp r;
    json_t *lease, *rec, *list;
    int i;

    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    lbt_daemon_start(&F, args);
    lease = lbt_seed(&F, "rs-reset-kill", "task-reset", "\"files\": {\"/workspace/s\": \"x\"}");
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
    json_decref(
        lbt_exec_ok(&F, sbx, tok,
                    "{\"command\": \"setsid sh -c '(" LEFTOVER " &)' </dev/null "
                    ">/dev/null 2>&1; sleep 0.2\", \"preserve_background_services\": true}"));
    ck_assert_int_gt(lbt_count_procs_cmdline(LEFTOVER), 0);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/reset", sbx);
    job = lbt_async_json(&F, "POST", path, "", NULL);
    /* torn down: the process is gone, and the reset waits at the fault point */
    for (i = 0; i < 400 && lbt_count_procs_cmdline(LEFTOVER) > 0; i++)
        lbt_sleep_ms(50);
    ck_assert_int_lt(i, 400);
    lbt_sleep_ms(200);
    ck_assert(!lbt_async_done(job));
    lbt_daemon_kill(&F);
    lbt_async_join(job, &r);
    ck_assert_int_ne(r.status, 200);
    lbt_resp_free(&r);

    lbt_daemon_restart(&F, NULL);
    list = lbt_list_sandboxes(&F);
    rec = lbt_find_record(list, sbx);
    ck_assert_ptr_nonnull(rec);
    ck_assert_str_eq(str(rec, "state"), "stopped");
    ck_assert_str_eq(str(rec, "stop_reason"), "reset_failed");
    json_decref(list);
    snprintf(path, sizeof(path), "%s/sandboxes/%s", F.state_dir, sbx);
    ck_assert(!lbt_path_exists(path));
    ck_assert_int_eq(lbt_count_procs_cmdline(LEFTOVER), 0);
    lbt_json(&F, "GET", "/v1/sessions/rs-reset-kill", "", NULL, &r);
    ck_assert_int_eq(r.status, 404);
    lbt_resp_free(&r);
    lbt_exec(&F, sbx, tok, "{\"command\": \"true\"}", &r);
    ck_assert_int_eq(r.status, 401);
    lbt_resp_free(&r);
    /* the session seeds anew */
    lease = lbt_seed(&F, "rs-reset-kill", "task-reset", NULL);
    ck_assert_str_ne(str(lease, "sandbox_id"), sbx);
    json_decref(lease);
    lbt_release_session(&F, "rs-reset-kill");
}
END_TEST

/* Wait (at most 60 s) until sandbox sbx's old token tok is refused with 409: a reset has
 * raised the sandbox's fence and waits there for what it admitted before. */
static void wait_fenced(struct lbt_daemon *d, const char *sbx, const char *tok)
{
    char path[160];
    struct lbt_resp r;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    for (int i = 0; i < 1200; i++) {
        lbt_json(d, "GET", path, tok, NULL, &r);
        long status = r.status;

        lbt_resp_free(&r);
        if (status == 409)
            return;
        lbt_sleep_ms(50);
    }
    ck_abort_msg("the reset of %s never raised its fence", sbx);
}

/* Wait (at most 60 s) until d's log shows n calls held at fault op. */
static void wait_held(struct lbt_daemon *d, const char *op, int n)
{
    char needle[128];

    snprintf(needle, sizeof(needle), "fault injected: %s holds", op);
    for (int i = 0; i < 1200 && lbt_log_count(d, needle) < n; i++)
        lbt_sleep_ms(50);
    ck_assert_int_ge(lbt_log_count(d, needle), n);
}

/* A late-act case: F with fault op held until the file late->hold exists and the in-place
 * reset on, a sandbox seeded for rsid (late->sbx, its operate token late->old_tok). */
struct late {
    char hold[128], spec[200], sbx[LBT_ID_MAX], old_tok[256], tok[256], path[200];
    const char *rsid;
};

static void late_start(struct late *t, const char *op, const char *rsid)
{
    const char *args[] = {"--set", t->spec, "--set", "local.reset_in_place=yes", NULL};
    json_t *lease;

    t->rsid = rsid;
    snprintf(t->hold, sizeof(t->hold), "/tmp/lbt-hold-%s-%d", rsid, (int)getpid());
    (void)unlink(t->hold);
    snprintf(t->spec, sizeof(t->spec), "faults.spec=%s=hold:%s", op, t->hold);
    lbt_daemon_start(&F, args);
    lease = lbt_seed(&F, rsid, "task-reset", NULL);
    snprintf(t->sbx, sizeof(t->sbx), "%s", str(lease, "sandbox_id"));
    snprintf(t->old_tok, sizeof(t->old_tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
}

/* The old token's request METHOD /v1/sandboxes/<sbx>/WHAT with body, begun (not waited for). */
static struct lbt_async *late_begin(struct late *t, const char *method, const char *what,
                                    const char *body)
{
    snprintf(t->path, sizeof(t->path), "/v1/sandboxes/%s/%s", t->sbx, what);
    return lbt_async_json(&F, method, t->path, t->old_tok, body);
}

/* The admin's reset of the sandbox, begun (not waited for). */
static struct lbt_async *late_reset_begin(struct late *t)
{
    snprintf(t->path, sizeof(t->path), "/v1/sandboxes/%s/reset", t->sbx);
    return lbt_async_json(&F, "POST", t->path, F.admin_token, NULL);
}

/* Let the held calls go. */
static void late_release(const struct late *t)
{
    int fd = open(t->hold, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);

    ck_assert_int_ge(fd, 0);
    close(fd);
}

/* The reset (answered rr) is 200: its new token into t->tok. */
static void late_reset_done(struct late *t, struct lbt_resp *rr)
{
    ck_assert_msg(rr->status == 200, "reset: %ld %s", rr->status, rr->body);
    snprintf(t->tok, sizeof(t->tok), "%s", str(json_object_get(rr->json, "access"), "token"));
    lbt_resp_free(rr);
}

/* The old token's exec job was ended with its episode: never a clean exit. */
static void late_exec_ended(struct lbt_async *job)
{
    struct lbt_resp r;

    lbt_async_join(job, &r);
    ck_assert_msg(r.status != 200 ||
                      json_integer_value(json_object_get(r.json, "return_code")) != 0,
                  "the held exec was not ended by the reset: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
}

/* Nothing of the old episode's acts in the new one (seen with the new token): none of paths
 * (space-separated) exists, no marker process runs, and the sandbox is running. */
static void late_check_clean(struct late *t, const char *paths)
{
    char cmd[512], *out;
    struct lbt_resp r;

    snprintf(cmd, sizeof(cmd),
             "ls %s 2>/dev/null; for p in /proc/[0-9]*; do "
             "grep -q '[3]133[.]4242' $p/cmdline 2>/dev/null && echo \"process ${p#/proc/}\"; "
             "done; echo done",
             paths);
    out = sh_tok(&F, t->sbx, t->tok, cmd);
    snprintf(t->path, sizeof(t->path), "/v1/sandboxes/%s", t->sbx);
    lbt_json(&F, "GET", t->path, t->tok, NULL, &r);
    (void)unlink(t->hold); /* the new token's calls above pass the fault point too */
    ck_assert_msg(strcmp(out, "done\n") == 0, "the old token's acts reached the next episode: %s",
                  out);
    free(out);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(str(r.json, "status"), "running");
    lbt_resp_free(&r);
}

#define LATE_EXEC                                                                                  \
    "{\"command\": \"touch /tmp/late-exec; exec sleep 3133.4242\", \"timeout_s\": 1000}"

/* An exec admitted with the old token whose provider call is under way when the reset comes
 * (fault provider.exec=hold:) runs in the old episode only: the reset waits for its start
 * (the exec holds the sandbox's fence until its supervisor is inside), then ends it with the
 * rest of the episode; nothing of it is in the next one. With the in-place reset, whose kept
 * namespaces an exec started late would enter. */
START_TEST(test_reset_late_exec)
{
    struct late t;
    struct lbt_async *job, *rjob;
    struct lbt_resp r;

    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    LBT_SKIP_ON_VARIANT("lxd",
                        "about the local provider; an lxd reset always makes a new instance");
    late_start(&t, "provider.exec", "rs-reset-lateexec");
    job = late_begin(&t, "POST", "exec", LATE_EXEC);
    wait_held(&F, "provider.exec", 1);
    rjob = late_reset_begin(&t);
    wait_fenced(&F, t.sbx, t.old_tok);
    ck_assert(!lbt_async_done(rjob)); /* it waits for the exec's start */
    late_release(&t);
    lbt_async_join(rjob, &r);
    late_reset_done(&t, &r);
    late_exec_ended(job);
    late_check_clean(&t, "/tmp/late-exec");
    if (lbt_variant_on_host()) /* an image sandbox is made anew: the fence holds the same */
        ck_assert_int_ge(lbt_log_count(&F, "reset in place"), 1);
    lbt_release_session(&F, t.rsid);
}
END_TEST

/* An agent pauses its sandbox right after its own exec was admitted (held at fault exec.spawn,
 * found not paused): the exec's helper would freeze as it joins the sandbox's cgroup, and the
 * reset wait for its start until the exec's timeout. The reset thaws the sandbox instead (the
 * old token can pause it no more), the exec starts and is ended with the episode; a grader's
 * exclusive exec meanwhile answers 409 (paused) rather than wait. */
START_TEST(test_reset_thaws_for_late_exec)
{
    struct late t;
    struct lbt_async *job, *rjob;
    struct lbt_resp r;

    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    LBT_SKIP_ON_VARIANT("lxd", "the fault point is the local provider's exec");
    late_start(&t, "exec.spawn", "rs-reset-thaw");
    job = late_begin(&t, "POST", "exec", LATE_EXEC);
    wait_held(&F, "exec.spawn", 1);
    lbt_async_join(late_begin(&t, "POST", "pause", NULL), &r);
    ck_assert_msg(r.status == 200, "pause: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    /* a grader's exclusive exec meanwhile does not wait out the held exec: 409, paused */
    snprintf(t.path, sizeof(t.path), "/v1/sandboxes/%s/exec", t.sbx);
    lbt_json(&F, "POST", t.path, F.admin_token,
             "{\"command\": \"true\", \"exclusive\": true, \"agent_root\": true}", &r);
    ck_assert_msg(r.status == 409 && strstr(r.body, "is paused"), "exclusive exec: %ld %s",
                  r.status, r.body);
    lbt_resp_free(&r);
    rjob = late_reset_begin(&t);
    wait_fenced(&F, t.sbx, t.old_tok);
    late_release(&t);
    lbt_async_join(rjob, &r);
    late_reset_done(&t, &r);
    late_exec_ended(job);
    ck_assert_int_ge(lbt_log_count(&F, "thawed: an act admitted before its reset was held"), 1);
    late_check_clean(&t, "/tmp/late-exec");
    lbt_release_session(&F, t.rsid);
}
END_TEST

/* An exec of the old token that is running (not starting) when the reset comes does not hold
 * the reset: it is ended with the episode (every provider that resets says when an exec is
 * bound to the sandbox: local, its supervisor in the pid namespace; lxd, its operation). */
START_TEST(test_reset_ends_running_exec)
{
    char sbx[LBT_ID_MAX], tok[256], path[200];
    struct lbt_async *job;
    struct lbt_resp r;
    json_t *lease;

    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    lease = lbt_seed(&D, "rs-reset-running", "task-reset", NULL);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", sbx);
    job = lbt_async_json(&D, "POST", path, tok,
                         "{\"command\": \"touch /tmp/running; exec sleep 3133.4242\", "
                         "\"timeout_s\": 1000}");
    /* until it runs (at most 60 s) */
    (void)lbt_sh_until(&D, sbx, "ls /tmp/running 2>/dev/null || true", "/tmp/running\n", 600);
    reset(&D, sbx, "", NULL, &r);
    ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(r.json, "access"), "token"));
    lbt_resp_free(&r);
    lbt_async_join(job, &r);
    ck_assert_msg(r.status != 200 ||
                      json_integer_value(json_object_get(r.json, "return_code")) != 0,
                  "the running exec was not ended by the reset: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    lbt_release_session(&D, "rs-reset-running");
}
END_TEST

/* Acts of the old token admitted, their jobs started, but held right before they take the
 * sandbox's fence (fault operate.enter=hold:) while a whole reset runs: once let go, each
 * checks its token again under the fence and is refused (401), so none starts a process or
 * writes a file in the next episode (an exec, an upload, a PTY session, a pause, a harness's
 * execute), nor reads one of it (a file, an archive, the session's activation), renews its TTL
 * or makes an endpoint relay to it (which the reset's close of the relays would miss), nor
 * reads its status (usage, expiry). */
#define LATE_ACTS 11
START_TEST(test_reset_refuses_late_act)
{
    struct late t;
    struct lbt_async *jobs[LATE_ACTS];
    struct lbt_resp r;

    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    LBT_SKIP_ON_VARIANT("lxd", "its busybox image has no PTY sessions; the fence is the "
                               "daemon's, the same on every provider");
    late_start(&t, "operate.enter", "rs-reset-lateact");
    jobs[0] = late_begin(&t, "POST", "exec", LATE_EXEC);
    jobs[1] = late_begin(&t, "PUT", "files?path=/tmp/late-put", "late bytes");
    jobs[2] =
        late_begin(&t, "POST", "pty", "{\"command\": \"touch /tmp/late-pty; sleep 3133.4242\"}");
    jobs[3] = late_begin(&t, "POST", "pause", NULL);
    jobs[4] = lbt_async_json(&F, "POST", "/v1/sessions/rs-reset-lateact/execute", t.old_tok,
                             "{\"argv\": [\"sh\", \"-c\", \"touch /tmp/late-harness; "
                             "sleep 3133.4242\"], \"wait\": false}");
    jobs[5] = late_begin(&t, "GET", "files?path=/etc/hostname", NULL);
    jobs[6] = late_begin(&t, "GET", "archive?path=/tmp", NULL);
    jobs[7] = late_begin(&t, "POST", "renew", "{\"ttl_s\": 86400}");
    jobs[8] = late_begin(&t, "GET", "endpoints/8080", NULL);
    jobs[9] =
        lbt_async_json(&F, "GET", "/v1/sessions/rs-reset-lateact/activation", t.old_tok, NULL);
    snprintf(t.path, sizeof(t.path), "/v1/sandboxes/%s", t.sbx);
    jobs[10] = lbt_async_json(&F, "GET", t.path, t.old_tok, NULL);
    wait_held(&F, "operate.enter", LATE_ACTS);
    reset(&F, t.sbx, "", NULL, &r);
    late_reset_done(&t, &r);
    late_release(&t);
    for (int i = 0; i < LATE_ACTS; i++) {
        lbt_async_join(jobs[i], &r);
        ck_assert_msg(r.status == 401, "act %d of the old token: %ld %s", i, r.status, r.body);
        lbt_resp_free(&r);
    }
    /* the pause did not land either: late_check_clean finds it running */
    late_check_clean(&t, "/tmp/late-exec /tmp/late-put /tmp/late-pty /tmp/late-harness");
    lbt_json(&F, "GET", "/v1/sessions/rs-reset-lateact/activation", "", NULL, &r);
    ck_assert_msg(r.status == 404, "the old token's execute left an activation: %ld %s", r.status,
                  r.body);
    lbt_resp_free(&r);
    lbt_release_session(&F, t.rsid);
}
END_TEST

/* Wait (at most about 60 s) until session rsid's activation, as the admin GETs it, holds
 * needle; whether it did. */
static bool wait_activation(struct lbt_daemon *d, const char *rsid, const char *needle)
{
    char path[160];
    struct lbt_resp r;
    bool seen = false;

    snprintf(path, sizeof(path), "/v1/sessions/%s/activation", rsid);
    for (double end = lbt_now() + 60; !seen && lbt_now() < end;) {
        lbt_json(d, "GET", path, "", NULL, &r);
        seen = r.status == 200 && r.body && strstr(r.body, needle);
        lbt_resp_free(&r);
        if (!seen)
            lbt_sleep_ms(10);
    }
    return seen;
}

/* Review: an old-token renew must not hold up a release whose close is stopping the harness.
 * A renew that took the sandbox's fence as a writer and then waited for the session's lock,
 * which the release holds while its close waits for the fence's writers, made both wait out
 * lending.session_lock_wait_s and answered 409 "busy". The renew waits for the release and then
 * finds the sandbox released (404, or 401 for its token), never 409. */
START_TEST(test_reset_renew_during_release)
{
    const char *args[] = {"--set", "lending.session_lock_wait_s=8", NULL};
    char path[200], tok[256], sbx[LBT_ID_MAX];
    struct lbt_async *rel;
    struct lbt_resp r;
    json_t *lease;

    lbt_daemon_start(&F, args);
    lease = lbt_seed(&F, "rs-renew-release", "task-reset", NULL);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
    /* a harness that ignores SIGTERM: the release's close takes seconds to stop it */
    lbt_json(&F, "POST", "/v1/sessions/rs-renew-release/execute", tok,
             "{\"argv\": [\"sh\", \"-c\", \"trap '' TERM; exec sleep 3133.4242\"], "
             "\"close_timeout_s\": 6, \"wait\": false}",
             &r);
    ck_assert_msg(r.status == 202, "execute: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    rel = lbt_async_json(&F, "POST", "/v1/sessions/rs-renew-release/release", F.admin_token, NULL);
    /* the release's close is stopping it */
    ck_assert_msg(wait_activation(&F, "rs-renew-release", "\"state\":\"closing\""),
                  "the release never began to close the harness");
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/renew", sbx);
    lbt_json(&F, "POST", path, tok, "{\"ttl_s\": 600}", &r);
    /* a renew that comes once the close swept the sandbox finds the operate token fenced until
     * the capture ends: 409 at once, saying so (docs/api.md) — not the "busy" of a wait on the
     * session's lock (on a loaded machine the close can get there before the renew) */
    ck_assert_msg(r.status == 404 || r.status == 401 || r.status == 410 ||
                      (r.status == 409 && r.body && strstr(r.body, "is fenced since")),
                  "the renew during the release's close: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    lbt_async_join(rel, &r);
    ck_assert_msg(r.status == 200, "release: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
}
END_TEST

/* The next episode's harness: the admin's execute of body in session rsid, answered want; its
 * activation id into act (size bytes; "?" when it has none). */
static void execute_next(struct lbt_daemon *d, const char *rsid, const char *body, long want,
                         char *act, size_t size)
{
    char path[160];
    struct lbt_resp r;

    snprintf(path, sizeof(path), "/v1/sessions/%s/execute", rsid);
    lbt_json(d, "POST", path, "", body, &r);
    ck_assert_msg(r.status == want, "the next episode's execute: %ld %s", r.status, r.body);
    snprintf(act, size, "%s", str(r.json, "activation_id") ? str(r.json, "activation_id") : "?");
    lbt_resp_free(&r);
}

/* A request of the old token on its session's activation acts on the activation its episode
 * had, bound while its token was good (the GET here held at activation.bound, after the
 * binding), never on the next episode's: after a reset and the next episode's harness it
 * answers 401, not with that harness's activation (nor collects it). */
START_TEST(test_reset_old_token_bound_activation)
{
    char next_act[64];
    struct lbt_async *job;
    struct lbt_resp r;
    struct late t;

    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    late_start(&t, "activation.bound", "rs-reset-actbound");
    lbt_json(&F, "POST", "/v1/sessions/rs-reset-actbound/execute", t.old_tok,
             "{\"argv\": [\"sh\", \"-c\", \"exec sleep 3133.4242\"], \"wait\": false}", &r);
    ck_assert_msg(r.status == 202, "the old episode's execute: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    job = lbt_async_json(&F, "GET", "/v1/sessions/rs-reset-actbound/activation", t.old_tok, NULL);
    wait_held(&F, "activation.bound", 1);
    reset(&F, t.sbx, "", NULL, &r);
    late_reset_done(&t, &r);
    execute_next(&F, "rs-reset-actbound",
                 "{\"argv\": [\"sh\", \"-c\", \"echo next > /workspace/n\"], \"collect\": "
                 "[\"/workspace/n\"], \"wait\": false}",
                 202, next_act, sizeof(next_act));
    late_release(&t);
    lbt_async_join(job, &r);
    ck_assert_msg(r.status == 401 && !strstr(r.body, next_act),
                  "the old token's GET of its activation: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    (void)unlink(t.hold);
    lbt_release_session(&F, t.rsid);
}
END_TEST

/* Review: what the episode's agent (the sandbox's root, no capabilities) can change in the
 * sandbox's init, which an in-place reset keeps: its resource limits (prlimit needs only the
 * same uids), its nice value and its CPU affinity. After the reset the init must be as a fresh
 * sandbox's: the next episode must not inherit them (an RLIMIT_CPU set low kills the init, so
 * the next episode's sandbox, once it has used that much CPU). */
#define INIT_ATTRS                                                                                 \
    "grep -e '^Max cpu time' -e '^Max open files' -e '^Max processes' /proc/1/limits; "            \
    "awk '{print \"nice\", $19, \"policy\", $41}' /proc/1/stat; "                                  \
    "grep Cpus_allowed_list /proc/1/status; ionice -p 1"

/* Seed rsid, run change (the agent changing what it may of the init; its output must hold
 * want), reset: what INIT_ATTRS shows is as before the change. */
static void reset_after_init_change(const char *rsid, const char *change, const char *want)
{
    char sbx[LBT_ID_MAX], tok[256], *fresh, *out, *after;
    struct lbt_resp r;
    json_t *lease;

    lease = lbt_seed(&D, rsid, "task-reset", NULL);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
    fresh = sh_tok(&D, sbx, tok, INIT_ATTRS);
    out = sh_tok(&D, sbx, tok, change);
    ck_assert_msg(strstr(out, want) != NULL, "the agent's changes: %s", out);
    free(out);
    reset(&D, sbx, "", "{}", &r);
    ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(r.json, "access"), "token"));
    lbt_resp_free(&r);
    after = sh_tok(&D, sbx, tok, INIT_ATTRS);
    ck_assert_msg(strcmp(after, fresh) == 0,
                  "the old episode's changes to the init reached the next one:\nfresh:\n%s\n"
                  "after the reset:\n%s",
                  fresh, after);
    free(fresh);
    free(after);
    lbt_release_session(&D, rsid);
}

START_TEST(test_reset_init_changed)
{
    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    LBT_SKIP_ON_VARIANT("lxd", "about the local provider's in-place reset");
    /* the episode: the agent changes what it may of the init */
    reset_after_init_change("rs-reset-initattrs",
                            "python3 -c \"import os, resource as R\n"
                            "for what, f in (('cpu', lambda: R.prlimit(1, R.RLIMIT_CPU, (3000, "
                            "3000))),\n"
                            "    ('nofile', lambda: R.prlimit(1, R.RLIMIT_NOFILE, (9, 9))),\n"
                            "    ('nproc', lambda: R.prlimit(1, R.RLIMIT_NPROC, (5, 5))),\n"
                            "    ('nice', lambda: os.setpriority(os.PRIO_PROCESS, 1, 19)),\n"
                            "    ('affinity', lambda: os.sched_setaffinity(1, {0}))):\n"
                            "    try:\n"
                            "        f(); print(what, 'changed')\n"
                            "    except OSError as e:\n"
                            "        print(what, e)\n\"",
                            "nofile changed");
}
END_TEST

/* An episode's process that changes the init between the reset's look at it and its kill (a
 * loop of prlimit on pid 1; here the test itself, with the reset held at that point: fault
 * reset.checked) does not carry the change into the next episode: the reset looks again after
 * the kill and is a stop and a create (hostile review: 3 of 12 such resets kept it). */
START_TEST(test_reset_init_changed_during_reset)
{
    const char *args[] = {"--set", spec_checked, "--set", "local.reset_in_place=yes", NULL};
    char sbx[LBT_ID_MAX], tok[256], cmd[128], *fresh, *after;
    struct lbt_async *job;
    struct lbt_resp r;
    json_t *lease, *desc;
    long long init;

    if (!lbt_variant_on_host()) {
        lbt_skip_note(__func__, "an in-place reset is of a sandbox of image host");
        return;
    }
    snprintf(hold_checked, sizeof(hold_checked), "/tmp/lbt-hold-checked-%d", (int)getpid());
    (void)unlink(hold_checked);
    snprintf(spec_checked, sizeof(spec_checked), "faults.spec=reset.checked=hold:%s", hold_checked);
    lbt_daemon_start(&F, args);
    lease = lbt_seed(&F, "rs-initrace", "task-reset", NULL);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
    fresh = sh_tok(&F, sbx, tok, INIT_ATTRS);
    /* the episode's process: waits for /tmp/go, then changes the init */
    json_decref(lbt_exec_ok(
        &F, sbx, tok,
        "{\"command\": \"setsid sh -c 'while [ ! -e /tmp/go ]; do sleep 0.02; done; "
        "prlimit --pid 1 --nofile=9:9 && touch /tmp/done' </dev/null >/dev/null 2>&1 &\", "
        "\"preserve_background_services\": true}"));
    desc = lbt_read_descriptor(&F, sbx);
    ck_assert_ptr_nonnull(desc);
    init = json_integer_value(json_object_get(desc, "pid"));
    json_decref(desc);
    {
        char path[160];

        snprintf(path, sizeof(path), "/v1/sandboxes/%s/reset", sbx);
        job = lbt_async_json(&F, "POST", path, F.admin_token, "{}");
    }
    for (int i = 0; i < 1200 && lbt_log_count(&F, "fault injected: reset.checked holds") < 1; i++)
        lbt_sleep_ms(50);
    ck_assert_int_eq(lbt_log_count(&F, "fault injected: reset.checked holds"), 1);
    /* the episode's process changes the init now */
    snprintf(cmd, sizeof(cmd), "/proc/%lld/root/tmp/go", init);
    {
        /* as the sandbox's root (its tmpfs maps no other host id) */
        uid_t root = lbt_sandbox_uid(&F, sbx);
        FILE *f;

        (void)setfsgid(root);
        (void)setfsuid(root);
        f = fopen(cmd, "w");
        (void)setfsuid(0);
        (void)setfsgid(0);
        ck_assert_msg(f != NULL, "%s: %s", cmd, strerror(errno));
        fclose(f);
    }
    snprintf(cmd, sizeof(cmd), "/proc/%lld/root/tmp/done", init);
    for (int i = 0; i < 500 && !lbt_path_exists(cmd); i++)
        lbt_sleep_ms(20);
    ck_assert_msg(lbt_path_exists(cmd), "the episode's process did not change the init");
    {
        FILE *f = fopen(hold_checked, "w");

        ck_assert_ptr_nonnull(f);
        fclose(f);
    }
    lbt_async_join(job, &r);
    ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(r.json, "access"), "token"));
    lbt_resp_free(&r);
    ck_assert_int_ge(lbt_log_count(&F, "were changed during its reset"), 1);
    after = sh_tok(&F, sbx, tok, INIT_ATTRS);
    ck_assert_msg(strcmp(after, fresh) == 0,
                  "the change to the init reached the next episode:\nfresh:\n%s\nafter:\n%s", fresh,
                  after);
    free(fresh);
    free(after);
    (void)unlink(hold_checked);
    lbt_release_session(&F, "rs-initrace");
    lbt_daemon_stop(&F);
}
END_TEST

/* The same for the init's scheduling policy and I/O priority alone (SCHED_IDLE, ionice idle:
 * nothing else changed): the in-place reset had kept them (hostile review). */
START_TEST(test_reset_init_sched_changed)
{
    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    LBT_SKIP_ON_VARIANT("lxd", "about the local provider's in-place reset");
    reset_after_init_change("rs-reset-initsched",
                            "python3 -c \"import os; os.sched_setscheduler(1, os.SCHED_IDLE, "
                            "os.sched_param(0))\" && ionice -c3 -p 1 && echo changed",
                            "changed\n");
}
END_TEST

/* Review: a harness execute the agent made with the old token (wait: true) is still waiting
 * for its receipt when the reset closes and removes its activation (the harness ends at once:
 * exec sleep, close_timeout_s 1); the next episode's harness (here the admin's execute, run to
 * its end) then is the sandbox's activation. The old request must not answer with the next
 * episode's activation (its id, artifacts, return code), nor finalize (stop, collect) it. */
START_TEST(test_reset_old_execute_takes_next_activation)
{
    char sbx[LBT_ID_MAX], tok[256], next_act[64];
    struct lbt_async *job;
    struct lbt_resp r;
    json_t *lease;
    int leaked = 0;

    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    lease = lbt_seed(&D, "rs-reset-oldexe", "task-reset", NULL);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
    /* the reset's close of the old harness races the old request's receipt poll: try a few
     * episodes */
    for (int round = 0; round < 3; round++) {
        job = lbt_async_json(&D, "POST", "/v1/sessions/rs-reset-oldexe/execute", tok,
                             "{\"argv\": [\"sh\", \"-c\", \"exec sleep 100\"], \"timeout_s\": 60, "
                             "\"close_timeout_s\": 1}");
        ck_assert_msg(wait_activation(&D, "rs-reset-oldexe", "\"running\""),
                      "the old episode's harness never ran");
        reset(&D, sbx, "", NULL, &r);
        ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
        snprintf(tok, sizeof(tok), "%s", str(json_object_get(r.json, "access"), "token"));
        lbt_resp_free(&r);
        /* the next episode's harness, run to its end */
        execute_next(&D, "rs-reset-oldexe",
                     "{\"argv\": [\"sh\", \"-c\", \"echo next-episode-output; echo next > "
                     "/workspace/n\"], \"collect\": [\"/workspace/n\"]}",
                     200, next_act, sizeof(next_act));
        lbt_async_join(job, &r);
        if (r.body && strstr(r.body, next_act))
            leaked++;
        lbt_resp_free(&r);
        /* the next round's episode: a new activation needs a new lent sandbox episode */
        reset(&D, sbx, "", NULL, &r);
        ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
        snprintf(tok, sizeof(tok), "%s", str(json_object_get(r.json, "access"), "token"));
        lbt_resp_free(&r);
    }
    ck_assert_msg(leaked == 0,
                  "%d of 3 old-token executes answered with the next episode's activation", leaked);
    lbt_release_session(&D, "rs-reset-oldexe");
}
END_TEST

/* Fetch "GET /secret" from the endpoint URL "http://127.0.0.1:PORT" (a relay on the host);
 * what came back ("" when nothing answers). */
static void endpoint_fetch(const char *url, char *out, size_t out_len)
{
    struct sockaddr_in dst = {.sin_family = AF_INET};
    const char *colon = strrchr(url, ':');
    const char req[] = "GET /secret HTTP/1.0\r\n\r\n";
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    size_t got = 0;

    out[0] = '\0';
    ck_assert_int_ge(fd, 0);
    ck_assert_msg(colon && strncmp(url, "http://127.0.0.1:", 17) == 0, "endpoint %s", url);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    dst.sin_port = htons((uint16_t)atoi(colon + 1));
    if (connect(fd, (struct sockaddr *)&dst, sizeof(dst)) == 0 &&
        send(fd, req, strlen(req), MSG_NOSIGNAL) == (ssize_t)strlen(req)) {
        for (double end = lbt_now() + 10; got + 1 < out_len && lbt_now() < end;) {
            struct pollfd p = {fd, POLLIN, 0};
            ssize_t n;

            if (poll(&p, 1, 200) <= 0)
                continue;
            n = recv(fd, out + got, out_len - 1 - got, 0);
            if (n <= 0)
                break;
            got += (size_t)n;
        }
    }
    out[got] = '\0';
    close(fd);
}

/* Review: the endpoint URL an agent got with the old token (a loopback sandbox's relay, which
 * ends only when the sandbox stops) must not reach the next episode's server on that port:
 * the URL carries no token, and an in-place reset keeps the sandbox running. */
START_TEST(test_reset_old_endpoint_url)
{
    char sbx[LBT_ID_MAX], tok[256], path[160], old_url[128], got[4096];
    struct lbt_resp r;
    json_t *lease;

    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    LBT_SKIP_ON_VARIANT("lxd", "about the local provider's relay");
    lease = lbt_seed(&D, "rs-reset-endpoint", "task-reset", "\"ports\": [8080]");
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/endpoints/8080", sbx);
    lbt_json(&D, "GET", path, tok, NULL, &r);
    ck_assert_msg(r.status == 200, "endpoint: %ld %s", r.status, r.body);
    snprintf(old_url, sizeof(old_url), "%s", str(r.json, "endpoint"));
    lbt_resp_free(&r);
    reset(&D, sbx, "", NULL, &r);
    ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(r.json, "access"), "token"));
    lbt_resp_free(&r);
    /* the next episode serves its own secret on the port */
    json_decref(lbt_exec_ok(
        &D, sbx, tok,
        "{\"command\": \"mkdir -p /tmp/www && echo next-episode-secret > /tmp/www/secret && "
        "(python3 -m http.server 8080 --bind 127.0.0.1 --directory /tmp/www "
        "</dev/null >/dev/null 2>&1 &) && for i in $(seq 50); do "
        "python3 -c 'import socket; socket.create_connection((\\\"127.0.0.1\\\", 8080))' "
        "2>/dev/null && break; sleep 0.1; done\", \"preserve_background_services\": true}"));
    /* the episode's own endpoint reaches it (the check works) */
    lbt_json(&D, "GET", path, tok, NULL, &r);
    ck_assert_msg(r.status == 200, "endpoint: %ld %s", r.status, r.body);
    endpoint_fetch(str(r.json, "endpoint"), got, sizeof(got));
    ck_assert_msg(strstr(got, "next-episode-secret") != NULL, "the next episode's endpoint: %s",
                  got);
    lbt_resp_free(&r);
    endpoint_fetch(old_url, got, sizeof(got));
    ck_assert_msg(strstr(got, "next-episode-secret") == NULL,
                  "the old episode's endpoint URL %s reaches the next episode's server: %s",
                  old_url, got);
    lbt_release_session(&D, "rs-reset-endpoint");
}
END_TEST

/* The sandbox's usage as GET /v1/sandboxes/{id} shows it (admin). */
static json_t *usage_of(struct lbt_daemon *d, const char *sbx)
{
    char path[160];
    struct lbt_resp r;
    json_t *u;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s", sbx);
    lbt_json(d, "GET", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "GET %s: %ld %s", path, r.status, r.body);
    u = json_incref(json_object_get(r.json, "usage"));
    lbt_resp_free(&r);
    return u;
}

/* The usage a sandbox reports after a reset counts from the reset: the CPU time an episode
 * burnt is not the next one's (nor visible to it); in place on cgroup v2, whose memory.peak
 * cannot be restarted, the peak is null rather than the episode before's. */
START_TEST(test_reset_usage_counts_from_the_reset)
{
    char sbx[LBT_ID_MAX], tok[256];
    struct lbt_resp r;
    json_t *lease, *u, *desc;
    double before, after;
    bool v2;

    LBT_SKIP_ON_VARIANT("docker", "reset is 501 on docker (checked above)");
    LBT_SKIP_ON_VARIANT("lxd", "about the local provider's cgroups");
    lease = lbt_seed(&D, "rs-reset-usage", "task-reset", NULL);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
    free(sh_tok(&D, sbx, tok, "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done"));
    u = usage_of(&D, sbx);
    before = json_number_value(json_object_get(u, "cpu_s"));
    json_decref(u);
    ck_assert_msg(before > 0.2, "the episode burnt %.3f s of CPU", before);
    desc = lbt_read_descriptor(&D, sbx);
    v2 = json_integer_value(json_object_get(json_object_get(desc, "cgroup"), "version")) == 2;
    json_decref(desc);

    reset(&D, sbx, "", "{}", &r);
    ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    u = usage_of(&D, sbx);
    after = json_number_value(json_object_get(u, "cpu_s"));
    ck_assert_msg(json_is_number(json_object_get(u, "cpu_s")) && after < 0.1 && after < before / 2,
                  "after the reset: cpu_s %.3f (before %.3f)", after, before);
    if (lbt_variant_on_host() && v2)
        ck_assert_msg(json_is_null(json_object_get(u, "memory_peak_bytes")),
                      "a peak after an in-place reset on cgroup v2");
    json_decref(u);
    lbt_release_session(&D, "rs-reset-usage");
}
END_TEST

/* A process of the sandbox's pid namespace whose parent is outside it and does not reap it at
 * once (an exec's helper killed past its bound leaves its supervisor to lendboxd; here
 * nsenter, stopped) stays a zombie after the reset's kill: the in-place reset does not wait
 * for it (it had failed the reset after 5 s), and its parent reaps it later. */
START_TEST(test_reset_zombie_of_outside_parent)
{
    char sbx[LBT_ID_MAX], tok[256], target[32];
    struct lbt_resp r;
    json_t *lease, *desc;
    pid_t enter;
    int ws;

    if (lbt_variant_engine() || !lbt_variant_on_host()) {
        lbt_skip_note(__func__, "the in-place reset: local provider, image host");
        return;
    }
    lease = lbt_seed(&D, "rs-reset-zombie", "task-reset", NULL);
    snprintf(sbx, sizeof(sbx), "%s", str(lease, "sandbox_id"));
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(lease, "access"), "token"));
    json_decref(lease);
    desc = lbt_read_descriptor(&D, sbx);
    snprintf(target, sizeof(target), "%lld",
             (long long)json_integer_value(json_object_get(desc, "pid")));
    json_decref(desc);
    enter = fork();
    ck_assert_int_ge(enter, 0);
    if (enter == 0) {
        execlp("nsenter", "nsenter", "-t", target, "-p", "--", "sleep", "4343.5", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200 && lbt_count_procs_exact("sleep 4343.5") == 0; i++)
        lbt_sleep_ms(25);
    ck_assert_int_eq(lbt_count_procs_exact("sleep 4343.5"), 1);
    ck_assert_int_eq(kill(enter, SIGSTOP), 0);

    reset(&D, sbx, "", "{}", &r);
    ck_assert_msg(r.status == 200, "reset: %ld %s", r.status, r.body);
    snprintf(tok, sizeof(tok), "%s", str(json_object_get(r.json, "access"), "token"));
    lbt_resp_free(&r);
    ck_assert_int_eq(lbt_count_procs_exact("sleep 4343.5"), 0);
    ck_assert_int_eq(kill(enter, SIGCONT), 0);
    ck_assert_int_eq(waitpid(enter, &ws, 0), enter);
    /* the sleep was killed (nsenter passes its signal on, or its status) */
    ck_assert_msg((WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL) ||
                      (WIFEXITED(ws) && WEXITSTATUS(ws) == 128 + SIGKILL),
                  "nsenter ended with status %#x", ws);
    /* the sandbox is lent and works */
    free(sh_tok(&D, sbx, tok, "true"));
    lbt_release_session(&D, "rs-reset-zombie");
}
END_TEST

static const char *in_place_args[] = {"--set", "local.reset_in_place=yes", NULL};

int main(void)
{
    Suite *s = suite_create("reset");
    TCase *tc = tcase_create("reset");

    /* the shared daemon resets host sandboxes in place: the integrity bar holds for that path
     * too (image sandboxes are always made anew) */
    lbt_shared_daemon(tc, &D, in_place_args);
    lbt_test_daemon_cleanup(tc, &F); /* the tests of the spare and of a daemon without chroot */
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_reset_integrity);
    tcase_add_test(tc, test_reset_in_place);
    tcase_add_test(tc, test_reset_in_place_exec_helper);
    tcase_add_test(tc, test_reset_spare_survives_release);
    tcase_add_test(tc, test_reset_spare_killed);
    tcase_add_test(tc, test_reset_without_sys_chroot);
    tcase_add_test(tc, test_reset_bad_input);
    tcase_add_test(tc, test_reset_to_snapshot);
    tcase_add_test(tc, test_reset_refuses_request_admitted_before);
    tcase_add_test(tc, test_reset_ends_activation);
    tcase_add_test(tc, test_reset_without_session);
    tcase_add_test(tc, test_reset_ends_running_exec);
    tcase_add_test(tc, test_reset_usage_counts_from_the_reset);
    tcase_add_test(tc, test_reset_zombie_of_outside_parent);
    suite_add_tcase(s, tc);
    tc = tcase_create("fault");
    lbt_test_daemon_cleanup(tc, &F);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_reset_failed_stops);
    tcase_add_test(tc, test_reset_in_place_failed_stops);
    tcase_add_test(tc, test_reset_killed);
    suite_add_tcase(s, tc);
    tc = tcase_create("late-exec");
    lbt_test_daemon_cleanup(tc, &F);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_reset_late_exec);
    tcase_add_test(tc, test_reset_refuses_late_act);
    tcase_add_test(tc, test_reset_old_token_bound_activation);
    tcase_add_test(tc, test_reset_renew_during_release);
    tcase_add_test(tc, test_reset_thaws_for_late_exec);
    suite_add_tcase(s, tc);
    tc = tcase_create("review");
    lbt_shared_daemon(tc, &D, NULL);
    lbt_test_daemon_cleanup(tc, &F); /* test_reset_init_changed_during_reset's */
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_reset_init_changed);
    tcase_add_test(tc, test_reset_init_sched_changed);
    tcase_add_test(tc, test_reset_init_changed_during_reset);
    tcase_add_test(tc, test_reset_old_execute_takes_next_activation);
    tcase_add_test(tc, test_reset_old_endpoint_url);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
