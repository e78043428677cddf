/*
 * test_pty.c - acceptance of PTY sessions and detached execs: the real
 * daemon, real bubblewrap sandboxes, the terminal held by lendbox-supervise --pty-launch in
 * the sandbox, over real HTTP.
 *
 * Proves: stty size follows create and resize, tty is a /dev/pts terminal, typed input
 * echoes; the last bytes before an exit all arrive and then X-Exit-Code; polls following
 * X-Next-Offset and a re-read from 0 after the exit give the same bytes; attach/takeover
 * (409s); 410 past the retained window, 400 past the end; a kill -9 of the daemon loses no
 * output and no exit code; 100 parked long-polls hold no worker (an exec on another sandbox
 * completes on a 2-worker daemon meanwhile); release ends every process and session; the
 * cap (429), unknown sessions (404), bad JSON (400), another sandbox's token (403); pipe mode
 * keeps stdout and stderr apart.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "harness.h"

#define MAX_SESSIONS 4 /* limits.max_pty_sessions of the main daemon */

static struct lbt_daemon D;
static char SBX[128], OP[256];

static void seed_sandbox(struct lbt_daemon *d, const char *rsid, char *sbx, size_t sbx_len,
                         char *op, size_t op_len)
{
    json_t *lease = lbt_seed(d, rsid, "task-pty", NULL);

    snprintf(sbx, sbx_len, "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    if (op)
        snprintf(op, op_len, "%s",
                 json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
}

static const char *const ARGS[] = {"--set", "limits.max_pty_sessions=4", NULL};

static void seed(void)
{
    seed_sandbox(&D, "pty-1", SBX, sizeof(SBX), OP, sizeof(OP));
}

/* The value of response header name (case-insensitive), or NULL; static buffer. */
static const char *header(const struct lbt_resp *r, const char *name)
{
    static char val[256];
    size_t n = strlen(name);

    for (const char *p = r->headers; p && *p;) {
        const char *eol = strstr(p, "\r\n");
        size_t len = eol ? (size_t)(eol - p) : strlen(p);

        if (len > n + 1 && strncasecmp(p, name, n) == 0 && p[n] == ':') {
            const char *v = p + n + 1;

            while (*v == ' ')
                v++;
            snprintf(val, sizeof(val), "%.*s", (int)(len - (size_t)(v - p)), v);
            return val;
        }
        p = eol ? eol + 2 : p + len;
    }
    return NULL;
}

/* POST /v1/sandboxes/SBX/pty with body; asserts 201 and returns the session id in sid. */
static void pty_create(struct lbt_daemon *d, const char *sbx, const char *token, const char *body,
                       char *sid, size_t sid_len)
{
    char path[256];
    struct lbt_resp r;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pty", sbx);
    lbt_json(d, "POST", path, token, body, &r);
    ck_assert_msg(r.status == 201, "create: %ld %s", r.status, r.body);
    snprintf(sid, sid_len, "%s", json_string_value(json_object_get(r.json, "session_id")));
    ck_assert_int_eq(strncmp(sid, "pty-", 4), 0);
    lbt_resp_free(&r);
}

static void pty_output(struct lbt_daemon *d, const char *sid, unsigned long long since,
                       long wait_ms, bool err_stream, const char *attach, struct lbt_resp *r)
{
    char path[300], hdr[200];
    const char *headers[] = {hdr, NULL};

    snprintf(path, sizeof(path), "/v1/pty/%s/output?since=%llu&wait_ms=%ld%s", sid, since, wait_ms,
             err_stream ? "&stream=stderr" : "");
    snprintf(hdr, sizeof(hdr), "X-Attach-Token: %s", attach ? attach : "");
    lbt_request_ex(d, "GET", path, "", NULL, 0, NULL, attach ? headers : NULL, false, r);
}

static void pty_post(struct lbt_daemon *d, const char *sid, const char *what, const void *body,
                     size_t len, const char *ctype, const char *attach, struct lbt_resp *r)
{
    char path[300], hdr[200];
    const char *headers[] = {hdr, NULL};

    snprintf(path, sizeof(path), "/v1/pty/%s/%s", sid, what);
    snprintf(hdr, sizeof(hdr), "X-Attach-Token: %s", attach ? attach : "");
    lbt_request_ex(d, "POST", path, "", body, len, ctype, attach ? headers : NULL, false, r);
}

static void pty_input(struct lbt_daemon *d, const char *sid, const char *text)
{
    struct lbt_resp r;

    pty_post(d, sid, "input", text, strlen(text), "application/octet-stream", NULL, &r);
    ck_assert_msg(r.status == 204, "input: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
}

/* What a reader following X-Next-Offset has collected. */
struct reader {
    char *buf;
    size_t len;
    unsigned long long next;
    bool exited;
    int exit_code;
};

static void reader_free(struct reader *rd)
{
    free(rd->buf);
    memset(rd, 0, sizeof(*rd));
}

/* One long-poll from rd->next; appends what came. */
static void reader_poll(struct lbt_daemon *d, const char *sid, bool err_stream, struct reader *rd)
{
    struct lbt_resp r;
    const char *next, *code;

    pty_output(d, sid, rd->next, 2000, err_stream, NULL, &r);
    ck_assert_msg(r.status == 200, "output: %ld %s", r.status, r.body);
    next = header(&r, "X-Next-Offset");
    ck_assert_ptr_nonnull(next);
    ck_assert_uint_eq(strtoull(next, NULL, 10), rd->next + r.len);
    if (r.len) {
        rd->buf = realloc(rd->buf, rd->len + r.len + 1);
        memcpy(rd->buf + rd->len, r.body, r.len);
        rd->len += r.len;
        rd->buf[rd->len] = '\0';
    }
    rd->next += r.len;
    code = header(&r, "X-Exit-Code");
    if (code) {
        rd->exited = true;
        rd->exit_code = atoi(code);
    }
    lbt_resp_free(&r);
}

/* Poll until needle is in the collected output (or the process exited); asserts it came. */
static void reader_until(struct lbt_daemon *d, const char *sid, struct reader *rd,
                         const char *needle)
{
    double until = lbt_now() + 120;

    while (!(rd->buf && memmem(rd->buf, rd->len, needle, strlen(needle))) && !rd->exited &&
           lbt_now() < until)
        reader_poll(d, sid, false, rd);
    ck_assert_msg(rd->buf && memmem(rd->buf, rd->len, needle, strlen(needle)),
                  "'%s' not in the output: %.*s", needle, (int)(rd->len > 2000 ? 2000 : rd->len),
                  rd->buf ? rd->buf : "");
}

static void reader_until_exit(struct lbt_daemon *d, const char *sid, bool err_stream,
                              struct reader *rd)
{
    double until = lbt_now() + 180;

    while (!rd->exited && lbt_now() < until)
        reader_poll(d, sid, err_stream, rd);
    ck_assert_msg(rd->exited, "no X-Exit-Code in time");
}

/* GET wait until the exit code comes (a timeout answers null: ask again). */
static int pty_wait(struct lbt_daemon *d, const char *sid, const char *token)
{
    double until = lbt_now() + 180;
    char path[300];
    struct lbt_resp r;
    int code = -1;

    snprintf(path, sizeof(path), "/v1/pty/%s/wait?timeout_ms=20000", sid);
    while (code < 0 && lbt_now() < until) {
        json_t *v;

        lbt_json(d, "GET", path, token, NULL, &r);
        ck_assert_msg(r.status == 200, "wait: %ld %s", r.status, r.body);
        v = json_object_get(r.json, "exit_code");
        ck_assert(v && (json_is_null(v) || json_is_integer(v)));
        if (json_is_integer(v))
            code = (int)json_integer_value(v);
        lbt_resp_free(&r);
    }
    ck_assert_msg(code >= 0, "no exit code in time");
    return code;
}

static void pty_delete(struct lbt_daemon *d, const char *sid)
{
    char path[300];
    struct lbt_resp r;

    snprintf(path, sizeof(path), "/v1/pty/%s", sid);
    lbt_json(d, "DELETE", path, "", NULL, &r);
    ck_assert_msg(r.status == 204, "delete: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
}

/* ---------- the terminal ---------- */

START_TEST(test_size_tty_and_echo)
{
    struct reader rd = {0};
    struct lbt_resp r;
    char sid[64];

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");

    /* no command: a login shell */
    pty_create(&D, SBX, OP, "{\"rows\": 30, \"cols\": 100}", sid, sizeof(sid));
    pty_input(&D, sid, "stty size; tty\n");
    reader_until(&D, sid, &rd, "30 100\r\n");
    reader_until(&D, sid, &rd, "/dev/pts/");

    pty_post(&D, sid, "resize", "{\"rows\": 40, \"cols\": 120}", 25, NULL, NULL, &r);
    ck_assert_msg(r.status == 204, "resize: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    pty_input(&D, sid, "stty size\n");
    reader_until(&D, sid, &rd, "40 120\r\n");

    /* the terminal echoes what is typed (the quotes are in the echo, not in the result) */
    pty_input(&D, sid, "echo typed-'in'put\n");
    reader_until(&D, sid, &rd, "echo typed-'in'put");
    reader_until(&D, sid, &rd, "typed-input\r\n");

    /* a terminal gets a TERM */
    pty_input(&D, sid, "echo \"term=$TERM\"\n");
    reader_until(&D, sid, &rd, "term=xterm-256color\r\n");

    pty_input(&D, sid, "exit 0\n");
    reader_until_exit(&D, sid, false, &rd);
    ck_assert_int_eq(rd.exit_code, 0);
    reader_free(&rd);
    pty_delete(&D, sid);

    /* user goes through the exec path: root works, an unknown user is refused */
    pty_create(&D, SBX, OP, "{\"command\": \"id -u\", \"user\": \"root\"}", sid, sizeof(sid));
    reader_until_exit(&D, sid, false, &rd);
    ck_assert_str_eq(rd.buf, "0\r\n");
    reader_free(&rd);
    pty_delete(&D, sid);
    {
        char path[256];

        snprintf(path, sizeof(path), "/v1/sandboxes/%s/pty", SBX);
        lbt_json(&D, "POST", path, OP, "{\"user\": \"no-such-user-here\"}", &r);
        lbt_assert_error(&r, 400, "bad_request");
        lbt_resp_free(&r);
    }
}
END_TEST

START_TEST(test_tail_and_replay)
{
    struct reader rd = {0}, again = {0};
    struct lbt_resp r;
    char sid[64], path[300];

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");

    /* the last bytes before the exit are all delivered, then the exit code */
    pty_create(&D, SBX, OP, "{\"command\": \"printf '%05000d' 0; exit 3\"}", sid, sizeof(sid));
    reader_until_exit(&D, sid, false, &rd);
    ck_assert_uint_eq(rd.len, 5000);
    for (size_t i = 0; i < rd.len; i++)
        ck_assert_int_eq(rd.buf[i], '0');
    ck_assert_int_eq(rd.exit_code, 3);
    /* one read from 0 after the exit: the same bytes, the end and the exit code */
    pty_output(&D, sid, 0, 0, false, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(r.len, rd.len);
    ck_assert_int_eq(memcmp(r.body, rd.buf, rd.len), 0);
    ck_assert_str_eq(header(&r, "X-Next-Offset"), "5000");
    ck_assert_str_eq(header(&r, "X-Exit-Code"), "3");
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/pty/%s/wait?timeout_ms=1000", sid);
    lbt_json(&D, "GET", path, "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "exit_code")), 3);
    lbt_resp_free(&r);
    /* past the end: 400 */
    pty_output(&D, sid, 5001, 0, false, NULL, &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    reader_free(&rd);
    pty_delete(&D, sid);

    /* several segments: what polls following X-Next-Offset collected while it ran equals a
     * re-read from 0 after the exit, and the expected bytes (the terminal adds \r) */
    pty_create(&D, SBX, OP, "{\"command\": \"seq 1 100000\"}", sid, sizeof(sid));
    reader_until_exit(&D, sid, false, &rd);
    ck_assert_int_eq(rd.exit_code, 0);
    while (!again.exited)
        reader_poll(&D, sid, false, &again);
    ck_assert_uint_eq(again.len, rd.len);
    ck_assert_int_eq(memcmp(again.buf, rd.buf, rd.len), 0);
    {
        size_t off = 0;
        char line[32];

        for (int i = 1; i <= 100000; i++) {
            int n = snprintf(line, sizeof(line), "%d\r\n", i);

            ck_assert_msg(off + (size_t)n <= rd.len && memcmp(rd.buf + off, line, (size_t)n) == 0,
                          "line %d missing or wrong at offset %zu", i, off);
            off += (size_t)n;
        }
        ck_assert_uint_eq(off, rd.len);
    }
    reader_free(&rd);
    reader_free(&again);
    pty_delete(&D, sid);
}
END_TEST

START_TEST(test_window_410)
{
    struct reader rd = {0};
    struct lbt_resp r;
    char sid[64];

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");

    pty_create(&D, SBX, OP,
               "{\"command\": \"head -c 3000000 /dev/zero | tr '\\\\0' a\", \"pty\": false}", sid,
               sizeof(sid));
    /* wait for the exit without reading the output */
    ck_assert_int_eq(pty_wait(&D, sid, ""), 0);
    pty_output(&D, sid, 0, 0, false, NULL, &r);
    lbt_assert_error(&r, 410, "gone");
    lbt_resp_free(&r);
    /* the last MiB is there */
    rd.next = 3000000 - 1024 * 1024;
    reader_until_exit(&D, sid, false, &rd);
    ck_assert_uint_eq(rd.next, 3000000);
    ck_assert_uint_eq(rd.len, 1024 * 1024);
    for (size_t i = 0; i < rd.len; i++)
        ck_assert_int_eq(rd.buf[i], 'a');
    reader_free(&rd);
    pty_delete(&D, sid);
}
END_TEST

START_TEST(test_attach_takeover)
{
    struct lbt_resp r;
    char sid[64], tok1[80], tok2[80];

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");

    pty_create(&D, SBX, OP, "{\"command\": \"cat\"}", sid, sizeof(sid));
    pty_post(&D, sid, "attach", "{}", 2, NULL, NULL, &r);
    ck_assert_msg(r.status == 200, "attach: %ld %s", r.status, r.body);
    snprintf(tok1, sizeof(tok1), "%s", json_string_value(json_object_get(r.json, "attach_token")));
    ck_assert_str_eq(header(&r, "X-Attach-Token"), tok1);
    lbt_resp_free(&r);
    /* held: no takeover -> 409 */
    pty_post(&D, sid, "attach", "{\"takeover\": false}", 19, NULL, NULL, &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);
    /* the holder polls and types */
    pty_output(&D, sid, 0, 0, false, tok1, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    pty_post(&D, sid, "input", "x\n", 2, "application/octet-stream", tok1, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
    /* takeover: the old holder's next poll and input get 409, the new one's work */
    pty_post(&D, sid, "attach", "{\"takeover\": true}", 18, NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    snprintf(tok2, sizeof(tok2), "%s", json_string_value(json_object_get(r.json, "attach_token")));
    ck_assert_str_ne(tok1, tok2);
    lbt_resp_free(&r);
    pty_output(&D, sid, 0, 0, false, tok1, &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);
    pty_post(&D, sid, "input", "y\n", 2, "application/octet-stream", tok1, &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);
    pty_output(&D, sid, 0, 0, false, tok2, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    pty_delete(&D, sid);
}
END_TEST

/* ---------- errors ---------- */

START_TEST(test_errors)
{
    char sbx2[128], op2[256], sid[64], path[300], sids[MAX_SESSIONS][64];
    struct lbt_resp r;

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");

    /* unknown session: 404 (well-formed or not) */
    pty_output(&D, "pty-00000000000000000000000000000000", 0, 0, false, NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    pty_output(&D, "nonsense", 0, 0, false, NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    /* bad JSON, unknown fields, bad sizes: 400 */
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pty", SBX);
    lbt_json(&D, "POST", path, OP, "{\"rows\": ", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", path, OP, "{\"nope\": 1}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", path, OP, "{\"rows\": 0}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);

    /* another sandbox's operate token: 403, for create and for the session's routes */
    seed_sandbox(&D, "pty-2", sbx2, sizeof(sbx2), op2, sizeof(op2));
    lbt_json(&D, "POST", path, op2, "{\"command\": \"cat\"}", &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    pty_create(&D, SBX, OP, "{\"command\": \"cat\"}", sid, sizeof(sid));
    snprintf(path, sizeof(path), "/v1/pty/%s/output?since=0", sid);
    lbt_json(&D, "GET", path, op2, NULL, &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    lbt_json(&D, "GET", path, OP, NULL, &r); /* its own sandbox's token works */
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/pty/%s/signal", sid);
    lbt_json(&D, "POST", path, OP, "{\"signal\": \"NOPE\"}", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    pty_delete(&D, sid);
    /* deleted: 404 (an operate token gets 403 for a session of no sandbox, as it does for
     * an unknown sandbox) */
    lbt_json(&D, "POST", path, "", "{\"signal\": \"INT\"}", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", path, OP, "{\"signal\": \"INT\"}", &r);
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);

    /* the per-sandbox cap: 429 */
    for (int i = 0; i < MAX_SESSIONS; i++)
        pty_create(&D, sbx2, op2, "{\"command\": \"sleep 600\"}", sids[i], sizeof(sids[i]));
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pty", sbx2);
    lbt_json(&D, "POST", path, op2, "{\"command\": \"cat\"}", &r);
    lbt_assert_error(&r, 429, "overloaded");
    lbt_resp_free(&r);
    pty_delete(&D, sids[0]); /* room again */
    pty_create(&D, sbx2, op2, "{\"command\": \"cat\"}", sids[0], sizeof(sids[0]));
    snprintf(path, sizeof(path), "/v1/sessions/pty-2/release");
    lbt_json(&D, "POST", path, "", "{}", &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
}
END_TEST

START_TEST(test_signal_and_pipes)
{
    struct lbt_async *waiter;
    struct reader out = {0}, err = {0};
    struct lbt_resp r;
    char sid[64], path[300];

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");

    /* detached exec: stdout and stderr apart, input to stdin, the exit code */
    pty_create(&D, SBX, OP,
               "{\"command\": \"read x; echo \\\"out $x\\\"; echo err-line >&2; exit 7\", "
               "\"pty\": false}",
               sid, sizeof(sid));
    pty_input(&D, sid, "hello\n");
    reader_until_exit(&D, sid, false, &out);
    reader_until_exit(&D, sid, true, &err);
    ck_assert_str_eq(out.buf, "out hello\n");
    ck_assert_str_eq(err.buf, "err-line\n");
    ck_assert_int_eq(out.exit_code, 7);
    ck_assert_int_eq(err.exit_code, 7);
    reader_free(&out);
    reader_free(&err);
    pty_delete(&D, sid);

    /* a signal reaches the terminal's foreground process; wait parks until the exit */
    pty_create(&D, SBX, OP, "{\"command\": \"echo ready; exec sleep 600\"}", sid, sizeof(sid));
    reader_until(&D, sid, &out, "ready");
    /* a parked wait: a resize (which talks to the holder too) does not end it, the exit does */
    snprintf(path, sizeof(path), "/v1/pty/%s/wait?timeout_ms=600000", sid);
    waiter = lbt_async_json(&D, "GET", path, "", NULL);
    lbt_sleep_ms(300); /* let it park (answering early would fail below, not pass) */
    pty_post(&D, sid, "resize", "{\"rows\": 10, \"cols\": 10}", 24, NULL, NULL, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
    lbt_sleep_ms(500);
    ck_assert_msg(!lbt_async_done(waiter), "a resize answered a parked wait");
    snprintf(path, sizeof(path), "/v1/pty/%s/signal", sid);
    lbt_json(&D, "POST", path, OP, "{\"signal\": \"TERM\"}", &r);
    ck_assert_msg(r.status == 204, "signal: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    lbt_async_join(waiter, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "exit_code")), 128 + SIGTERM);
    lbt_resp_free(&r);
    ck_assert_int_eq(pty_wait(&D, sid, OP), 128 + SIGTERM);
    reader_free(&out);
    pty_delete(&D, sid);
}
END_TEST

/* A session whose holder is killed (same uid as every sandbox process: nothing stops that) ends
 * with a 502 for its readers, not with a poll that waits for ever. */
START_TEST(test_holder_killed)
{
    char sid[64], path[600], cmd[128], pid_text[32] = "";
    struct lbt_resp r;
    json_t *res;
    FILE *f;

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");
    pty_create(&D, SBX, OP, "{\"command\": \"sleep 600\"}", sid, sizeof(sid));
    snprintf(path, sizeof(path), "%s/pty/%s/pid", D.state_dir, sid);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(pid_text, sizeof(pid_text), f));
    fclose(f);
    snprintf(cmd, sizeof(cmd), "{\"command\": \"kill -9 %d\"}", atoi(pid_text));
    res = lbt_exec_ok(&D, SBX, "", cmd);
    json_decref(res);
    /* a parked wait is woken by the holder's end */
    snprintf(path, sizeof(path), "/v1/pty/%s/wait?timeout_ms=60000", sid);
    lbt_json(&D, "GET", path, "", NULL, &r);
    lbt_assert_error(&r, 502, "provider_error");
    lbt_resp_free(&r);
    pty_output(&D, sid, 0, 1000, false, NULL, &r);
    lbt_assert_error(&r, 502, "provider_error");
    lbt_resp_free(&r);
    pty_delete(&D, sid);
}
END_TEST

/* ---------- restart ---------- */

START_TEST(test_daemon_kill9_loses_nothing)
{
    static const char *const args[] = {"--set", "limits.max_pty_sessions=4", NULL};
    struct lbt_daemon d;
    struct reader rd = {0};
    struct lbt_resp r;
    char sid[64], want[512], sbx[128];
    size_t wl = 0;

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");

    /* a daemon of its own: this test restarts it (in check's forked child) */
    lbt_daemon_start(&d, args);
    seed_sandbox(&d, "pty-r", sbx, sizeof(sbx), NULL, 0);

    pty_create(&d, sbx, "", "{\"command\": \"for i in $(seq 50); do echo $i; sleep 0.1; done\"}",
               sid, sizeof(sid));
    reader_until(&d, sid, &rd, "3\r\n");
    lbt_daemon_kill(&d);
    lbt_sleep_ms(1000); /* the loop carries on meanwhile */
    lbt_daemon_restart(&d, args);
    reader_until_exit(&d, sid, false, &rd);
    ck_assert_int_eq(rd.exit_code, 0);
    for (int i = 1; i <= 50; i++)
        wl += (size_t)snprintf(want + wl, sizeof(want) - wl, "%d\r\n", i);
    ck_assert_uint_eq(rd.len, wl);
    ck_assert_int_eq(memcmp(rd.buf, want, wl), 0);
    /* input still reaches a session made before the restart */
    reader_free(&rd);
    pty_delete(&d, sid);
    pty_create(&d, sbx, "", "{\"command\": \"cat\"}", sid, sizeof(sid));
    lbt_daemon_kill(&d);
    lbt_daemon_restart(&d, args);
    pty_input(&d, sid, "after-restart\n");
    reader_until(&d, sid, &rd, "after-restart\r\nafter-restart\r\n"); /* echo, then cat */
    reader_free(&rd);
    pty_delete(&d, sid);
    lbt_json(&d, "GET", "/readyz", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    ck_assert_int_eq(lbt_daemon_stop(&d), 0);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* ---------- release ---------- */

START_TEST(test_release_ends_everything)
{
    char sbx[128], op[256], sids[3][64], path[600];
    struct reader rd = {0};
    struct lbt_resp r;
    uid_t uid;
    double until;

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");

    seed_sandbox(&D, "pty-3", sbx, sizeof(sbx), op, sizeof(op));
    uid = lbt_sandbox_uid(&D, sbx);
    pty_create(&D, sbx, op, NULL, sids[0], sizeof(sids[0])); /* a login shell */
    pty_create(&D, sbx, op, "{\"command\": \"sleep 1000 & sleep 1000; echo never\"}", sids[1],
               sizeof(sids[1]));
    pty_create(&D, sbx, op, "{\"command\": \"echo up; cat\", \"pty\": false}", sids[2],
               sizeof(sids[2]));
    reader_until(&D, sids[2], &rd, "up");
    reader_free(&rd);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/pty/%s/out.0", D.state_dir, sids[i]);
        ck_assert(lbt_path_exists(path));
    }
    ck_assert_int_gt(lbt_count_live_procs_of_uid(uid), 0);
    lbt_json(&D, "POST", "/v1/sessions/pty-3/release", "", "{}", &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    until = lbt_now() + 60;
    while (lbt_count_live_procs_of_uid(uid) > 0 && lbt_now() < until)
        lbt_sleep_ms(100);
    ck_assert_int_eq(lbt_count_live_procs_of_uid(uid), 0);
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "%s/pty/%s", D.state_dir, sids[i]);
        ck_assert_msg(!lbt_path_exists(path), "%s is still there", path);
        pty_output(&D, sids[i], 0, 0, false, NULL, &r);
        lbt_assert_error(&r, 404, "not_found");
        lbt_resp_free(&r);
    }
}
END_TEST

/* ---------- parked long-polls hold no worker ---------- */

#define N_SESSIONS 10
#define N_POLLS 100

static long parked_gauge(struct lbt_daemon *d)
{
    struct lbt_resp r;
    const char *p;
    long v = -1;

    lbt_json(d, "GET", "/metrics", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    p = strstr(r.body, "\nlendbox_http_parked ");
    if (p)
        v = strtol(p + strlen("\nlendbox_http_parked "), NULL, 10);
    lbt_resp_free(&r);
    return v;
}

START_TEST(test_parked_polls_hold_no_worker)
{
    static const char *const args[] = {
        "--set", "server.workers=2", "--set", "limits.max_pty_sessions=16", "--set",
        "limits.max_wait_ms=600000", "--set", "limits.max_execs_per_sandbox=2",
        /* 100 polls opened at once from one address: a busy daemon accepts more of them than
         * the default 64 before it has read their headers, and the per-address cap on
         * connections still sending headers then closes the oldest (a poll answered -1, not
         * parked). The cap is for trickling clients, not for this burst; see
         * docs/operations.md, "Idle and trickling connections" */
        "--set", "server.per_ip_incomplete=200", NULL};
    struct lbt_daemon d2;
    char sbx_a[128], sbx_b[128], sids[N_SESSIONS][64], path[300];
    struct lbt_async *polls[N_POLLS];
    struct lbt_resp r;
    json_t *res;
    double until;
    long parked = 0;

    LBT_SKIP_ON_VARIANT("docker", "the docker provider has no PTY sessions (test_docker_501)");

    lbt_daemon_start(&d2, args);
    seed_sandbox(&d2, "park-a", sbx_a, sizeof(sbx_a), NULL, 0);
    seed_sandbox(&d2, "park-b", sbx_b, sizeof(sbx_b), NULL, 0);
    for (int i = 0; i < N_SESSIONS; i++)
        pty_create(&d2, sbx_a, "", "{\"command\": \"cat\"}", sids[i], sizeof(sids[i]));
    for (int i = 0; i < N_POLLS; i++) {
        snprintf(path, sizeof(path), "/v1/pty/%s/output?since=0&wait_ms=600000",
                 sids[i % N_SESSIONS]);
        polls[i] = lbt_async_json(&d2, "GET", path, "", NULL);
    }
    until = lbt_now() + 120;
    while ((parked = parked_gauge(&d2)) < N_POLLS && lbt_now() < until)
        lbt_sleep_ms(100);
    if (parked < N_POLLS) {
        for (int i = 0; i < N_POLLS; i++)
            if (lbt_async_done(polls[i])) {
                lbt_async_join(polls[i], &r);
                fprintf(stderr, "poll %d answered before it parked: %ld %.200s\n", i, r.status,
                        r.body ? r.body : "");
                lbt_resp_free(&r);
                polls[i] = NULL;
            }
        fprintf(stderr, "cut connections: header_deadline %ld, per_address_cap %ld\n",
                lbt_metric(&d2, "lendbox_http_connections_cut_total{reason=\"header_deadline\"} "),
                lbt_metric(&d2, "lendbox_http_connections_cut_total{reason=\"per_address_cap\"} "));
    }
    ck_assert_int_ge(parked, N_POLLS);
    {
        struct lbt_resp m;

        lbt_json(&d2, "GET", "/metrics", NULL, NULL, &m);
        ck_assert_ptr_nonnull(strstr(m.body, "\nlendbox_pty_sessions 10\n"));
        lbt_resp_free(&m);
    }
    /* both workers are free: an exec on the other sandbox completes */
    res = lbt_exec_ok(&d2, sbx_b, "", "{\"command\": \"echo ok\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "ok\n");
    json_decref(res);
    ck_assert_int_ge(parked_gauge(&d2), N_POLLS);
    for (int i = 0; i < N_POLLS; i++)
        ck_assert(!lbt_async_done(polls[i]));
    /* ending a session answers its parked polls (404: gone) */
    for (int i = 0; i < N_SESSIONS; i++)
        pty_delete(&d2, sids[i]);
    for (int i = 0; i < N_POLLS; i++) {
        lbt_async_join(polls[i], &r);
        lbt_assert_error(&r, 404, "not_found");
        lbt_resp_free(&r);
    }
    ck_assert_int_eq(lbt_daemon_stop(&d2), 0);
    lbt_daemon_cleanup(&d2);
}
END_TEST

/* The docker provider has no PTY capability: every PTY route answers 501 with a JSON error
 * for its sandboxes. Runs on the docker variant only (make e2e-docker). */
START_TEST(test_docker_501)
{
    char path[300];
    struct lbt_resp r;

    if (!lbt_variant_is("docker")) {
        lbt_skip_note(__func__, "only the docker variant lacks PTY sessions");
        return;
    }
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/pty", SBX);
    lbt_json(&D, "POST", path, OP, "{\"command\": \"true\"}", &r);
    lbt_assert_error(&r, 501, "not_implemented");
    lbt_resp_free(&r);
    lbt_json(&D, "POST", path, OP, "{\"pty\": false, \"command\": \"true\"}", &r);
    lbt_assert_error(&r, 501, "not_implemented");
    lbt_resp_free(&r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("pty");
    TCase *tc = tcase_create("pty");

    lbt_fixture_add(
        tc, &(struct lbt_fixture){.d = &D, .args = ARGS, .seed = seed, .stop_clean = true}, true);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_docker_501);
    tcase_add_test(tc, test_size_tty_and_echo);
    tcase_add_test(tc, test_tail_and_replay);
    tcase_add_test(tc, test_window_410);
    tcase_add_test(tc, test_attach_takeover);
    tcase_add_test(tc, test_errors);
    tcase_add_test(tc, test_signal_and_pipes);
    tcase_add_test(tc, test_holder_killed);
    tcase_add_test(tc, test_release_ends_everything);
    suite_add_tcase(s, tc);
    tc = tcase_create("restart");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_daemon_kill9_loses_nothing);
    suite_add_tcase(s, tc);
    tc = tcase_create("parked");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_parked_polls_hold_no_worker);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
