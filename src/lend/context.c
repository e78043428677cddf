/*
 * context.c - code contexts (see context.h) on top of the PTY service: create launches the
 * driver as a pipe-mode session, run writes a request line to its input and reads the answer
 * line from its output, interrupt and delete are the session's signal and delete. Shares
 * pty_internal.h for the session's run-in-progress flag.
 */
#include "lend/context.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lend/pty_internal.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/token.h"

/* The driver's source, context_driver.py, built in (NUL-terminated). */
__asm__(".section .rodata\n"
        ".global lb_context_driver\n"
        ".type lb_context_driver, @object\n"
        "lb_context_driver:\n"
        ".incbin \"src/lend/context_driver.py\"\n"
        ".byte 0\n"
        ".size lb_context_driver, . - lb_context_driver\n"
        ".previous\n");
extern const char lb_context_driver[];

#define READY_TIMEOUT_MS 30000
#define INTERRUPT_GRACE_MS 5000
#define ANSWER_MAX (4u << 20) /* bytes of one answer line; the driver's stay under 1 MiB */
#define STDERR_NOTE_MAX 400
#define DRAIN_POLL_MS 500 /* how soon a waiting run notices that the daemon drains */

bool context_id_is_valid(const char *id)
{
    return id && strncmp(id, LB_CONTEXT_PREFIX, 4) == 0 && pty_sid_is_valid(id);
}

static int not_found(struct lb_error *err, const char *cid)
{
    return lb_error_set(err, -ENOENT, "no code context %s", cid ? cid : "");
}

/* ---------- reading answers ---------- */

/* A wait for the session's output: the PTY service's waker signals cond. */
struct out_wait {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool woken;
};

static void out_wake(void *ctx)
{
    struct out_wait *w = ctx;

    pthread_mutex_lock(&w->lock);
    w->woken = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

static void out_release(void *ctx)
{
    (void)ctx; /* the wait lives on its owner's stack */
}

/* Wait until the session's stdout passes since or it changes otherwise, or until the monotonic
 * time until_ms. */
static void wait_output(struct lb_ptys *p, const char *cid, uint64_t since, int64_t until_ms)
{
    struct out_wait w = {.woken = false};
    struct timespec ts;

    pthread_mutex_init(&w.lock, NULL);
    clock_cond_init_mono(&w.cond);
    pty_watch(p, cid, false, (int64_t)since,
              &(struct lb_pty_waker){.wake = out_wake, .release = out_release, .ctx = &w});
    ts.tv_sec = (time_t)(until_ms / 1000);
    ts.tv_nsec = (long)(until_ms % 1000) * 1000000L;
    pthread_mutex_lock(&w.lock);
    while (!w.woken && clock_mono_ms() < until_ms)
        if (pthread_cond_timedwait(&w.cond, &w.lock, &ts) == ETIMEDOUT)
            break;
    pthread_mutex_unlock(&w.lock);
    /* after this no thread calls out_wake on w (wakes run under the service's lock) */
    pty_unwatch(p, &w);
    pthread_cond_destroy(&w.cond);
    pthread_mutex_destroy(&w.lock);
}

/* The answers read so far from the session's stdout, from pos on. */
struct reader {
    uint64_t pos;
    char *buf;
    size_t len;
    bool skipping; /* a line longer than ANSWER_MAX: dropped up to its newline */
};

/* The end of the session's stdout so far (where a new run's answer starts). */
static int output_end(struct lb_ptys *p, const char *cid, uint64_t *end, struct lb_error *err)
{
    struct lb_pty_chunk c;
    struct lb_error scratch = {0};
    int r = pty_read(p, cid, false, 0, &c, &scratch);

    if (c.fd >= 0)
        close(c.fd);
    if (r == 0 || r == -ESTALE) {
        *end = c.end;
        return 0;
    }
    if (r == -ENOENT)
        return not_found(err, cid);
    return lb_error_set(err, r, "%s", scratch.message);
}

/* Take the complete lines in rd->buf: the first that is a JSON object whose "id" is id goes to
 * *found (the caller's); others are dropped. */
static void take_lines(struct reader *rd, const char *id, json_t **found)
{
    char *start = rd->buf, *nl;

    while (!*found && (nl = memchr(start, '\n', rd->len - (size_t)(start - rd->buf)))) {
        if (!rd->skipping) {
            json_t *j = json_loadb(start, (size_t)(nl - start), JSON_REJECT_DUPLICATES, NULL);
            const char *jid = json_string_value(json_object_get(j, "id"));

            if (jid && strcmp(jid, id) == 0)
                *found = json_incref(j);
            json_decref(j);
        }
        rd->skipping = false;
        start = nl + 1;
    }
    rd->len -= (size_t)(start - rd->buf);
    memmove(rd->buf, start, rd->len);
    if (rd->len >= ANSWER_MAX) { /* no newline in ANSWER_MAX bytes: not an answer of ours */
        rd->len = 0;
        rd->skipping = true;
    }
}

/* Read what the session wrote from rd->pos on and look for the answer id. 0 (with *found set
 * when it came, *exited when the interpreter is gone and everything was read), or -errno. */
static int read_answer(struct lb_ptys *p, const char *cid, struct reader *rd, const char *id,
                       json_t **found, bool *exited, struct lb_error *err)
{
    struct lb_pty_chunk c;
    struct lb_error e = {0};
    int r;

    *exited = false;
    while (!*found) {
        r = pty_read(p, cid, false, rd->pos, &c, &e);
        if (r == -ENOENT)
            return not_found(err, cid);
        if (r < 0)
            return lb_error_set(err, r == -ESTALE ? -EREMOTEIO : r, "context %s: %s", cid,
                                e.message);
        if (c.fd < 0) {
            *exited = c.exited && c.next == c.end;
            return 0;
        }
        {
            size_t want = (size_t)c.len, got = 0;
            char *m = realloc(rd->buf, rd->len + want + 1);

            if (!m) {
                close(c.fd);
                return lb_error_set(err, -ENOMEM, "out of memory");
            }
            rd->buf = m;
            while (got < want) {
                ssize_t n =
                    pread(c.fd, rd->buf + rd->len + got, want - got, (off_t)(c.file_off + got));

                if (n < 0 && errno == EINTR)
                    continue;
                if (n <= 0)
                    break;
                got += (size_t)n;
            }
            close(c.fd);
            rd->len += got;
            rd->pos += got;
            if (got < want)
                return lb_error_set(err, -EREMOTEIO, "context %s: its output could not be read",
                                    cid);
        }
        take_lines(rd, id, found);
    }
    return 0;
}

/* The start of the session's stderr (why an interpreter ended), into buf. */
static void stderr_note(struct lb_ptys *p, const char *cid, char *buf, size_t size)
{
    struct lb_pty_chunk c;
    ssize_t n = 0;

    buf[0] = '\0';
    if (pty_read(p, cid, true, 0, &c, NULL) < 0 || c.fd < 0)
        return;
    n = pread(c.fd, buf, c.len < size - 1 ? (size_t)c.len : size - 1, (off_t)c.file_off);
    close(c.fd);
    buf[n > 0 ? n : 0] = '\0';
    for (char *q = buf; *q; q++)
        if ((unsigned char)*q < 0x20)
            *q = ' ';
}

/* ---------- the routes' work ---------- */

int context_create(struct lb_ptys *p, const char *sandbox_id, const char *language,
                   bool *fence_held, char cid_out[LB_PTY_SID_MAX], struct lb_error *err)
{
    static const char prefix[] = "exec python3 -u -c '", suffix[] = "'";
    struct reader rd = {0};
    json_t *ready = NULL;
    char *command = NULL, *q, note[STDERR_NOTE_MAX + 1];
    size_t n = strlen(lb_context_driver);
    int64_t until;
    bool exited = false;
    int r;

    cid_out[0] = '\0';
    if (!language || strcmp(language, "python") != 0)
        return lb_error_set(err, -EINVAL, "'language' must be \"python\"");
    /* the driver as one shell word: each ' becomes '\'' */
    command = malloc(sizeof(prefix) + n * 4 + sizeof(suffix));
    if (!command)
        return lb_error_set(err, -ENOMEM, "out of memory");
    q = stpcpy(command, prefix);
    for (const char *s = lb_context_driver; *s; s++)
        q = *s == '\'' ? stpcpy(q, "'\\''") : (*q = *s, q + 1);
    stpcpy(q, suffix);
    struct lb_pty_create c = {.command = command,
                              .rows = 24,
                              .cols = 80,
                              .pty = false,
                              .context = true,
                              .fence_held = fence_held};
    r = pty_create(p, sandbox_id, &c, cid_out, err);
    free(command);
    if (r < 0)
        return r;
    /* the interpreter is there once the driver says so */
    until = clock_mono_ms() + READY_TIMEOUT_MS;
    for (;;) {
        r = read_answer(p, cid_out, &rd, "ready", &ready, &exited, err);
        if (r < 0 || ready)
            break;
        if (exited) {
            stderr_note(p, cid_out, note, sizeof(note));
            r = lb_error_set(err, -EOPNOTSUPP,
                             "the Python interpreter did not start in sandbox %s (python3 is "
                             "needed in its image): %s",
                             sandbox_id, note[0] ? note : "no message");
            break;
        }
        if (clock_mono_ms() >= until) {
            r = lb_error_set(err, -EREMOTEIO,
                             "the Python interpreter of sandbox %s did not answer in %d s",
                             sandbox_id, READY_TIMEOUT_MS / 1000);
            break;
        }
        wait_output(p, cid_out, rd.pos, until);
    }
    json_decref(ready);
    free(rd.buf);
    if (r < 0) {
        (void)pty_delete(p, cid_out, NULL);
        cid_out[0] = '\0';
        return r;
    }
    log_info("sbx=%s code context %s started", sandbox_id, cid_out);
    return 0;
}

/* Mark the context's run under way (busy true) or over. -ENOENT, -EBUSY (already under way). */
static int set_busy(struct lb_ptys *p, const char *cid, bool busy, struct lb_error *err)
{
    struct session *s;
    int r;

    if (!context_id_is_valid(cid))
        return not_found(err, cid);
    r = pty_session_lock(p, cid, &s, err);
    if (r < 0)
        return busy ? r : 0;
    if (busy && s->busy)
        r = lb_error_set(err, -EBUSY,
                         "context %s is running code already (one run at a time; interrupt it "
                         "or wait)",
                         cid);
    else
        s->busy = busy;
    pthread_mutex_unlock(&p->lock);
    return r;
}

/* The driver's answer, checked, as the route's body (the caller's). */
static int answer_body(const char *cid, json_t *a, json_t **out, struct lb_error *err)
{
    json_t *err_obj = json_object_get(a, "error"), *res = json_object_get(a, "result");
    json_t *dur = json_object_get(a, "duration_ms"), *e;
    const char *so = json_string_value(json_object_get(a, "stdout"));
    const char *se = json_string_value(json_object_get(a, "stderr"));

    if (!so || !se || !(json_is_null(res) || json_is_string(res)) || !json_is_integer(dur) ||
        !(json_is_null(err_obj) || (json_is_string(json_object_get(err_obj, "name")) &&
                                    json_is_string(json_object_get(err_obj, "value")) &&
                                    json_is_string(json_object_get(err_obj, "traceback")))))
        return lb_error_set(err, -EREMOTEIO, "context %s answered something not its driver's", cid);
    e = json_is_null(err_obj) ? json_null()
                              : json_pack("{s:O,s:O,s:O}", "name", json_object_get(err_obj, "name"),
                                          "value", json_object_get(err_obj, "value"), "traceback",
                                          json_object_get(err_obj, "traceback"));
    *out = json_pack("{s:s,s:s,s:O,s:o,s:I}", "stdout", so, "stderr", se, "result", res, "error", e,
                     "duration_ms", (json_int_t)json_integer_value(dur));
    return *out ? 0 : lb_error_set(err, -ENOMEM, "out of memory");
}

int context_run(struct lb_ptys *p, const char *cid, const char *code, int64_t timeout_ms,
                json_t **out, struct lb_error *err)
{
    char id[33], sandbox_id[LB_ID_MAX], *line = NULL;
    struct reader rd = {0};
    json_t *req = NULL, *answer = NULL;
    int64_t until;
    bool interrupted = false, exited = false, entered = false;
    int r;

    *out = NULL;
    r = set_busy(p, cid, true, err);
    if (r < 0)
        return r;
    if (pty_sandbox_of(p, cid, sandbox_id, sizeof(sandbox_id)) < 0) {
        r = not_found(err, cid);
        goto out;
    }
    /* a lost sandbox: 410; a paused one: 409; the run is activity (no idle stop meanwhile) */
    r = lend_busy_enter(p->lend, sandbox_id, err);
    if (r < 0)
        goto out;
    entered = true;
    if (token_random_hex(16, id) < 0) {
        r = lb_error_set(err, -EIO, "no randomness for a request id");
        goto out;
    }
    req = json_pack("{s:s,s:s}", "id", id, "code", code);
    line = req ? json_dumps(req, JSON_COMPACT) : NULL;
    if (!line) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    r = output_end(p, cid, &rd.pos, err);
    if (r < 0)
        goto out;
    {
        size_t n = strlen(line);

        line[n] = '\n'; /* json_dumps' NUL: the request is one line */
        r = pty_input(p, cid, line, n + 1, err);
    }
    if (r == -ENOENT)
        r = not_found(err, cid);
    if (r == -EBUSY)
        r = lb_error_set(err, -EBUSY,
                         "the interpreter of context %s has exited; delete it and create another",
                         cid);
    if (r < 0)
        goto out;
    until = clock_mono_ms() + timeout_ms;
    for (;;) {
        r = read_answer(p, cid, &rd, id, &answer, &exited, err);
        if (r < 0 || answer)
            break;
        if (exited) {
            r = lb_error_set(err, -EBUSY,
                             "the interpreter of context %s has exited; delete it and create "
                             "another",
                             cid);
            break;
        }
        if (clock_mono_ms() >= until) {
            if (interrupted) {
                r = lb_error_set(err, -ETIMEDOUT,
                                 "context %s did not answer %d s after its run was interrupted",
                                 cid, INTERRUPT_GRACE_MS / 1000);
                break;
            }
            r = pty_signal(p, cid, SIGINT, err);
            if (r == -ENOENT)
                r = not_found(err, cid);
            if (r < 0 && r != -EBUSY)
                break;
            interrupted = true;
            until = clock_mono_ms() + INTERRUPT_GRACE_MS;
        }
        if (lend_is_draining(p->lend)) {
            /* a drain waits for its workers: a long run must not hold the daemon's stop up */
            r = lb_error_set(err, -ESHUTDOWN,
                             "the daemon is shutting down; the code goes on in context %s and "
                             "its answer is lost",
                             cid);
            break;
        }
        wait_output(p, cid, rd.pos,
                    until - clock_mono_ms() > DRAIN_POLL_MS ? clock_mono_ms() + DRAIN_POLL_MS
                                                            : until);
    }
    if (r == 0)
        r = answer_body(cid, answer, out, err);
out:
    if (entered)
        lend_busy_leave(p->lend, sandbox_id);
    (void)set_busy(p, cid, false, NULL);
    json_decref(answer);
    json_decref(req);
    free(line);
    free(rd.buf);
    return r;
}

int context_interrupt(struct lb_ptys *p, const char *cid, struct lb_error *err)
{
    int r;

    if (!context_id_is_valid(cid))
        return not_found(err, cid);
    r = pty_signal(p, cid, SIGINT, err);
    if (r == -EBUSY)
        r = lb_error_set(err, -EBUSY, "the interpreter of context %s has exited", cid);
    return r;
}

int context_delete(struct lb_ptys *p, const char *cid, struct lb_error *err)
{
    if (!context_id_is_valid(cid))
        return not_found(err, cid);
    return pty_delete(p, cid, err);
}
