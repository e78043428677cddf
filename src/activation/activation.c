/*
 * activation.c - see activation.h.
 *
 * The pieces, in the order an activation meets them:
 *
 *   execute   record "staging" (intent first) -> write the stage files -> "running" (only from
 *             staging: a close that got in first fences the launch here) -> launch exec
 *             (lendbox-supervise --harness-launch, with --keep-background so the harness
 *             supervisor outlives the exec) -> poll receipt.json -> finalize.
 *   finalize  (one at a time per activation) for a close: record "closing" first; then, unless
 *             a confirmed receipt is held: read the receipt, else run the stop exec
 *             (--harness-stop: stop request plus launch claim, so a launch that has not
 *             happened never will) and poll for the receipt within the close budget; then,
 *             once, collect the artifacts and the output log's tail into the record; for a
 *             close, record "closed". A failure leaves the record as it is, so the next close
 *             starts over; the capture's "at most once" is also held by the store.
 *
 * The in-sandbox directory is /run/lendbox/<activation id>: /run is the sandbox's own tmpfs,
 * and the sandbox (not the daemon) keeps it, so it survives a daemon restart.
 */
#include "activation/activation.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uthash.h>

#include "lend/lend_internal.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/token.h"
#include "util/utf8.h"

#define SUPERVISE_PATH "/run/lendbox/supervise"
#define ACT_DIR_PARENT "/run/lendbox"
#define LAUNCH_TIMEOUT_MS 30000
#define STOP_EXEC_TIMEOUT_MS 15000
#define RECEIPT_SLACK_MS 5000  /* a close waits close_timeout + this for the receipt */
#define EXECUTE_SLACK_MS 30000 /* NeMo Gym's 30 s for start-up, polling and receipt I/O */
#define RECEIPT_MAX 65536
#define RESULT_LOG_TAIL 4096
#define POLL_FIRST_MS 50
#define POLL_MAX_MS 250
#define JOIN_SLACK_MS 60000   /* a close joining a running finalization: past its own budget */
#define LAUNCH_SLACK_MS 10000 /* the launch exec may take the harness's timeout_s plus this */
#define PAUSED_RESUME_MS 2000 /* past the harness's timeout_s, a paused sandbox is resumed */
#define PAUSED_CHECK_MS 500   /* how often a wait past the timeout looks for a pause */

enum fin_mode {
    FIN_EXECUTE, /* after the harness ended (or its deadline passed): stop if needed, capture */
    FIN_CLOSE,   /* the same, then closed; records "closing" first */
    FIN_STOP,    /* stop_harness: stop if needed and hold the confirmed receipt; no capture */
};

/* In-memory state of one activation while someone works on it (keyed by sandbox id). */
struct act_entry {
    char sandbox_id[LB_ID_MAX];
    int refs;
    bool finalizing;
    uint64_t gen; /* finalizations ended */
    int last_rc;  /* outcome of the last one */
    enum fin_mode last_mode;
    struct lb_error last_err;
    UT_hash_handle hh;
};

struct lb_activations {
    struct lb_activation_config cfg;
    struct lb_store *store;
    struct lb_lend *lend;
    pthread_mutex_t mutex; /* guards entries and every entry's fields */
    pthread_cond_t cond;   /* a finalization ended */
    struct act_entry *entries;
    char *receipts_dir;
};

int activations_new(const struct lb_activation_config *cfg, struct lb_store *st,
                    struct lb_lend *lend, struct lb_activations **out, struct lb_error *err)
{
    struct lb_activations *a = calloc(1, sizeof(*a));

    if (!a)
        return lb_error_set(err, -ENOMEM, "out of memory");
    a->cfg = *cfg;
    if (!a->cfg.max_artifact_bytes)
        a->cfg.max_artifact_bytes = 16 * 1024 * 1024;
    if (!a->cfg.max_artifacts_bytes)
        a->cfg.max_artifacts_bytes = 4 * a->cfg.max_artifact_bytes;
    if (!a->cfg.max_log_bytes)
        a->cfg.max_log_bytes = 1024 * 1024;
    a->store = st;
    a->lend = lend;
    if (cfg->receipts_dir && !(a->receipts_dir = strdup(cfg->receipts_dir))) {
        free(a);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    a->cfg.receipts_dir = a->receipts_dir;
    pthread_mutex_init(&a->mutex, NULL);
    {
        pthread_condattr_t ca;

        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* act_finalize's deadlines */
        pthread_cond_init(&a->cond, &ca);
        pthread_condattr_destroy(&ca);
    }
    *out = a;
    return 0;
}

void activations_free(struct lb_activations *a)
{
    struct act_entry *e, *tmp;

    if (!a)
        return;
    HASH_ITER(hh, a->entries, e, tmp) {
        HASH_DEL(a->entries, e);
        free(e);
    }
    pthread_cond_destroy(&a->cond);
    pthread_mutex_destroy(&a->mutex);
    free(a->receipts_dir);
    free(a);
}

static struct act_entry *entry_get(struct lb_activations *a, const char *sandbox_id)
{
    struct act_entry *e;

    pthread_mutex_lock(&a->mutex);
    HASH_FIND_STR(a->entries, sandbox_id, e);
    if (!e) {
        e = calloc(1, sizeof(*e));
        if (e) {
            snprintf(e->sandbox_id, sizeof(e->sandbox_id), "%s", sandbox_id);
            HASH_ADD_STR(a->entries, sandbox_id, e);
        }
    }
    if (e)
        e->refs++;
    pthread_mutex_unlock(&a->mutex);
    return e;
}

static void entry_put(struct lb_activations *a, struct act_entry *e)
{
    pthread_mutex_lock(&a->mutex);
    if (--e->refs == 0) {
        HASH_DEL(a->entries, e);
        free(e);
    }
    pthread_mutex_unlock(&a->mutex);
}

/* ---------- small helpers ---------- */

static json_t *json_time(int64_t unix_s)
{
    char buf[32];

    if (unix_s <= 0)
        return json_null();
    clock_format_rfc3339(unix_s, buf, sizeof(buf));
    return json_string(buf);
}

/* Valid UTF-8 text of len bytes (invalid sequences become U+FFFD). */
static json_t *json_text(const void *data, size_t len)
{
    struct lb_buf clean;
    json_t *s;

    lb_buf_init(&clean, 0);
    if (utf8_sanitize(data ? data : "", len, &clean) < 0) {
        lb_buf_release(&clean);
        return NULL;
    }
    s = json_stringn(clean.data ? clean.data : "", clean.len);
    lb_buf_release(&clean);
    return s;
}

static bool sandbox_is_lent(struct lb_activations *a, const char *sandbox_id)
{
    struct lb_record rec = {0};
    bool lent =
        store_get_sandbox(a->store, sandbox_id, &rec, NULL) == 0 && rec.state == LB_STATE_LENT;

    store_record_release(&rec);
    return lent;
}

static bool sandbox_is_paused(struct lb_activations *a, const char *sandbox_id)
{
    json_t *status = NULL;
    const char *st;
    bool paused = lend_sandbox_status(a->lend, sandbox_id, &status, NULL) == 0 &&
                  (st = json_string_value(json_object_get(status, "status"))) &&
                  !strcmp(st, "paused");

    json_decref(status);
    return paused;
}

/* The harness's supervisor runs in the sandbox: frozen (paused), it can neither end the harness
 * nor write its receipt, so no wait for the receipt would end before its bound. Resume the
 * sandbox if it is paused (why says for the log). 0 (not paused, or resumed) or -EREMOTEIO
 * when the resume failed. */
static int act_resume_paused(struct lb_activations *a, const struct lb_activation *act,
                             const char *why, struct lb_error *err)
{
    struct lb_error perr = {0};
    json_t *st = NULL;
    int r;

    if (!sandbox_is_paused(a, act->sandbox_id))
        return 0;
    log_info("activation %s: sandbox %s is paused; resuming it (%s)", act->id, act->sandbox_id,
             why);
    r = lend_set_paused(a->lend, act->sandbox_id, false, &st, &perr);
    json_decref(st);
    if (r < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot resume the paused sandbox: %s", perr.message);
    return 0;
}

static void act_path(char *buf, size_t size, const struct lb_activation *act, const char *name)
{
    snprintf(buf, size, "%s/%s/%s", ACT_DIR_PARENT, act->id, name);
}

/* Read path inside the sandbox: all of it (-EFBIG past max, with *size set), or with tail
 * the last max bytes. *data is malloc'd and NUL-terminated; *size is the file's size. */
static int sbx_read(struct lb_activations *a, const char *sandbox_id, const char *path, size_t max,
                    bool tail, unsigned char **data, size_t *len, uint64_t *size,
                    struct lb_error *err)
{
    unsigned char *buf = NULL;
    uint64_t sz = 0, off = 0;
    size_t want, got = 0;
    int fd = -1, r;

    *data = NULL;
    *len = 0;
    *size = 0;
    r = lend_file_open(a->lend, sandbox_id, path, &fd, &sz, err);
    if (r < 0)
        return r;
    *size = sz;
    if (sz > max && !tail) {
        r = lb_error_set(err, -EFBIG, "'%s' is %llu bytes, over the %zu-byte limit", path,
                         (unsigned long long)sz, max);
        goto out;
    }
    want = sz > max ? max : (size_t)sz;
    off = sz > max ? sz - max : 0;
    buf = malloc(want + 1);
    if (!buf) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    while (got < want) {
        ssize_t n = pread(fd, buf + got, want - got, (off_t)(off + got));

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = lb_error_set(err, -EIO, "cannot read '%s': %s", path, strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    buf[got] = '\0';
    *data = buf;
    buf = NULL;
    *len = got;
out:
    free(buf);
    if (fd >= 0)
        close(fd);
    return r;
}

/* The activation's receipt file on the host: <receipts_dir>/<id>.receipt. */
static void receipt_path(const struct lb_activations *a, const char *act_id, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%s.receipt", a->receipts_dir ? a->receipts_dir : ".", act_id);
}

/* Create the (empty) receipt file of a new activation; the fd (O_RDWR) or -errno. */
static int receipt_create(const struct lb_activations *a, const char *act_id)
{
    char path[PATH_MAX];
    int fd;

    if (!a->receipts_dir)
        return -ENOSYS;
    receipt_path(a, act_id, path, sizeof(path));
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    return fd < 0 ? -errno : fd;
}

/* The daemon's own receipt, for an activation whose harness was never launched (a stop won
 * the launch claim): written only while the file is empty or missing (no supervisor ever held
 * it). */
static void receipt_write_unlaunched(const struct lb_activations *a, const char *act_id,
                                     const char *error)
{
    char path[PATH_MAX];
    json_t *j = json_pack("{s:b,s:n,s:b,s:s?,s:b,s:b}", "cleanup_confirmed", 1, "return_code",
                          "timed_out", 0, "error", error, "launched", 0, "stop_requested", 1);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    struct stat st;
    int fd;

    receipt_path(a, act_id, path, sizeof(path));
    /* a close during staging comes before the launch made the file */
    fd = text ? open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600) : -1;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size == 0) {
        size_t len = strlen(text);

        if (pwrite(fd, text, len, 0) != (ssize_t)len || pwrite(fd, "\n", 1, (off_t)len) != 1)
            log_warn("activation %s: cannot write its receipt: %s", act_id, strerror(errno));
        else
            (void)fsync(fd);
    }
    if (fd >= 0)
        close(fd);
    free(text);
    json_decref(j);
}

static int sbx_read(struct lb_activations *a, const char *sandbox_id, const char *path, size_t max,
                    bool tail, unsigned char **data, size_t *len, uint64_t *size,
                    struct lb_error *err);

/* A receipt's text: 0 and *out (an object), -ENOENT when it is not complete yet (a complete
 * one ends in a newline), -EIO when it cannot be parsed. */
static int parse_receipt(const char *data, size_t len, json_t **out, struct lb_error *err)
{
    json_t *j;

    if (len == 0 || data[len - 1] != '\n')
        return -ENOENT; /* none yet, or still being written */
    j = json_loadb(data, len, 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        return lb_error_set(err, -EIO,
                            "the harness receipt is unreadable; the launch outcome "
                            "is unknown");
    }
    *out = j;
    return 0;
}

/* Where the activation's harness supervisor writes its receipt inside the sandbox (a provider
 * with receipt_file, no pass_fd: the spec's "receipt_file"), into path; false when it writes
 * to the host-side file. */
static bool receipt_in_sandbox(const struct lb_activation *act, char *path, size_t size)
{
    json_t *spec = act->spec_json ? json_loads(act->spec_json, 0, NULL) : NULL;
    const char *p = json_string_value(json_object_get(spec, "receipt_file"));
    bool in = p && (size_t)snprintf(path, size, "%s", p) < size;

    json_decref(spec);
    return in;
}

/* The receipt in the sandbox (receipt_in_sandbox), read through the provider's files API.
 * Errors as read_receipt; a provider that does not answer (a member down, the sandbox
 * stopping) reads as "none yet": the caller's bounded wait decides. */
static int read_receipt_in_sandbox(struct lb_activations *a, const struct lb_activation *act,
                                   const char *path, json_t **out, struct lb_error *err)
{
    unsigned char *data = NULL;
    size_t len = 0;
    uint64_t size = 0;
    struct lb_error rerr = {0};
    int r = sbx_read(a, act->sandbox_id, path, RECEIPT_MAX - 1, false, &data, &len, &size, &rerr);

    if (r == -EFBIG)
        r = lb_error_set(err, -EIO, "the harness receipt is too big");
    else if (r < 0)
        r = -ENOENT;
    else
        r = parse_receipt((const char *)data, len, out, err);
    free(data);
    return r;
}

/* The receipt of the harness supervisor: 0 and *out (an object), -ENOENT while there is none
 * or it is not complete yet (a complete one ends in a newline), -EIO when it cannot be
 * parsed. First the host-side file (the one it was handed at launch, which nothing in the
 * sandbox can reach, or the daemon's own for a harness never launched); then, only for an
 * activation whose supervisor writes inside the sandbox (receipt_file providers), that file.
 * Otherwise nothing under the sandbox's /run/lendbox is read. */
static int read_receipt(struct lb_activations *a, const struct lb_activation *act, json_t **out,
                        struct lb_error *err)
{
    char path[PATH_MAX], *data = NULL;
    ssize_t n;
    size_t len = 0;
    int fd, r = 0;

    *out = NULL;
    receipt_path(a, act->id, path, sizeof(path));
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT)
        return receipt_in_sandbox(act, path, sizeof(path))
                   ? read_receipt_in_sandbox(a, act, path, out, err)
                   : -ENOENT;
    if (fd < 0)
        return lb_error_set(err, -EIO, "cannot open the harness receipt: %s", strerror(errno));
    data = malloc(RECEIPT_MAX + 1);
    if (!data) {
        close(fd);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    while (len < RECEIPT_MAX && (n = pread(fd, data + len, RECEIPT_MAX - len, (off_t)len)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = lb_error_set(err, -EIO, "cannot read the harness receipt: %s", strerror(errno));
            break;
        }
        len += (size_t)n;
    }
    close(fd);
    if (r == 0 && len == RECEIPT_MAX)
        r = lb_error_set(err, -EIO, "the harness receipt is too big");
    if (r == 0)
        r = parse_receipt(data, len, out, err);
    free(data);
    if (r == -ENOENT && receipt_in_sandbox(act, path, sizeof(path)))
        r = read_receipt_in_sandbox(a, act, path, out, err);
    return r;
}

static bool receipt_confirmed(const json_t *receipt)
{
    return json_is_true(json_object_get(receipt, "cleanup_confirmed"));
}

/* API.md's cleanup object from a receipt; malformed diagnostic fields get defaults. */
static json_t *render_cleanup(const json_t *receipt)
{
    json_t *rc = json_object_get(receipt, "return_code"), *e = json_object_get(receipt, "error");

    if (!receipt)
        return json_null();
    return json_pack("{s:b,s:o,s:b,s:o}", "cleanup_confirmed", receipt_confirmed(receipt),
                     "return_code", json_is_integer(rc) ? json_copy(rc) : json_null(), "timed_out",
                     json_is_true(json_object_get(receipt, "timed_out")), "error",
                     json_is_string(e) ? json_copy(e) : json_null());
}

/* finished / timed_out / failed, and for failed why. */
static const char *outcome(const json_t *receipt, const char **why)
{
    const json_t *launched = json_object_get(receipt, "launched");
    const char *e = json_string_value(json_object_get(receipt, "error"));

    *why = NULL;
    if (!receipt) {
        *why = "the harness supervisor left no receipt";
        return "failed";
    }
    if (json_is_false(launched)) {
        *why = "the activation was closed before the harness was launched";
        return "failed";
    }
    if (json_is_true(json_object_get(receipt, "timed_out")))
        return "timed_out";
    if (json_is_string(json_object_get(receipt, "oom_message"))) {
        *why = json_string_value(json_object_get(receipt, "oom_message"));
        return "failed";
    }
    if (e) {
        *why = e;
        return "failed";
    }
    if (!receipt_confirmed(receipt)) {
        *why = "the harness's cleanup was not confirmed";
        return "failed";
    }
    if (json_is_true(json_object_get(receipt, "stop_requested"))) {
        *why = "the harness was stopped by a close before it ended";
        return "failed";
    }
    return "finished";
}

/* Re-read the activation of a sandbox into *act (released first). */
static int act_reload(struct lb_activations *a, const char *sandbox_id, struct lb_activation *act,
                      struct lb_error *err)
{
    char id[LB_ID_MAX];

    snprintf(id, sizeof(id), "%s", sandbox_id); /* sandbox_id may point into *act */
    store_activation_release(act);
    return store_get_activation_by_sandbox(a->store, id, act, err);
}

/* The session's activation: of its lent sandbox if it has one, else its newest. */
static int act_find(struct lb_activations *a, const char *rsid, struct lb_activation *act,
                    struct lb_error *err)
{
    struct lb_record live = {0};
    int r;

    if (store_get_live_by_rsid(a->store, rsid, &live, NULL) == 0) {
        r = store_get_activation_by_sandbox(a->store, live.id, act, NULL);
        store_record_release(&live);
    } else {
        r = store_get_latest_activation(a->store, rsid, act, NULL);
    }
    if (r == -ENOENT)
        return lb_error_set(err, -ENOENT, "session %s has no harness activation", rsid);
    return r < 0 ? lb_error_set(err, r, "cannot read the activation of session %s", rsid) : 0;
}

/* ---------- stop and capture ---------- */

/* A memory-limit kill ended the harness: it died of SIGKILL (128 + 9) on its own (no timeout,
 * no stop request) and the sandbox's OOM-kill count, stored in the spec when execute began,
 * has grown since. Then the receipt gets "oom_message" (stored with it, so the verdict
 * survives the sandbox and a restart). The count is the sandbox's: the harness's own
 * SIGKILL is what ties the kill to it, as for execs. */
static void act_note_oom(struct lb_activations *a, const struct lb_activation *act, json_t *receipt)
{
    json_t *spec = act->spec_json ? json_loads(act->spec_json, 0, NULL) : NULL;
    json_t *base = json_object_get(spec, "oom_kills_at_launch");
    json_t *rc = json_object_get(receipt, "return_code");
    uint64_t now = 0;
    int64_t limit = 0;
    char msg[200];

    if (json_is_integer(base) && json_is_integer(rc) && json_integer_value(rc) == 128 + SIGKILL &&
        !json_is_true(json_object_get(receipt, "timed_out")) &&
        !json_is_true(json_object_get(receipt, "stop_requested")) &&
        lend_sandbox_oom_kills(a->lend, act->sandbox_id, &now, &limit, NULL) == 0 &&
        now > (uint64_t)json_integer_value(base)) {
        if (limit > 0)
            snprintf(msg, sizeof(msg),
                     "the harness was killed by the out-of-memory killer: it reached the "
                     "sandbox's memory limit of %lld MiB",
                     (long long)(limit / (1024 * 1024)));
        else
            snprintf(msg, sizeof(msg), "the harness was killed by the out-of-memory killer");
        json_object_set_new(receipt, "oom_message", json_string(msg));
        log_info("activation %s: %s", act->id, msg);
    }
    json_decref(spec);
}

/* Store a receipt read from the file (with its OOM verdict): from then on the record's state
 * reads as the receipt's outcome. The file is written once, so storing it again (a GET and a
 * finalization at the same time) stores the same. 0 or an error of the store. */
static int act_record_receipt(struct lb_activations *a, const struct lb_activation *act,
                              json_t *receipt, struct lb_error *err)
{
    char *text;
    int r;

    act_note_oom(a, act, receipt);
    text = json_dumps(receipt, JSON_COMPACT);
    r = text ? store_activation_set_receipt(a->store, act->id, text, err)
             : lb_error_set(err, -ENOMEM, "out of memory");
    free(text);
    return r;
}

/* Hold a confirmed receipt: read it, or request the stop and wait for it within budget_ms.
 * The receipt read is stored. 0 and *out, or -EREMOTEIO (502) when cleanup is unconfirmed. */
static int act_stop(struct lb_activations *a, const struct lb_activation *act, int64_t budget_ms,
                    json_t **out, struct lb_error *err)
{
    struct lb_error rerr = {0};
    int64_t deadline = clock_mono_ms() + budget_ms + RECEIPT_SLACK_MS, wait = POLL_FIRST_MS;
    json_t *receipt = NULL;
    int r = read_receipt(a, act, &receipt, &rerr);

    if (r == -ENOENT) {
        char dir[200];
        char *argv[] = {SUPERVISE_PATH, "--harness-stop", dir, NULL};
        struct lb_exec_params p = {.argv = argv, .timeout_ms = STOP_EXEC_TIMEOUT_MS};
        struct lb_exec_result res = {0};

        snprintf(dir, sizeof(dir), "%s/%s", ACT_DIR_PARENT, act->id);
        /* A paused sandbox's harness cannot run its TERM handler, nor can the stop request
         * be made (exec refuses a paused sandbox): resume it first. A pause that comes again
         * before the stop request ran is undone again, within the budget. */
        for (;;) {
            r = act_resume_paused(a, act, "to stop the harness", err);
            if (r < 0)
                break;
            log_info("activation %s: requesting the harness's stop", act->id);
            provider_exec_result_release(&res);
            memset(&res, 0, sizeof(res));
            r = lend_exec(a->lend, act->sandbox_id, &p, &res, err);
            if (r != -EBUSY || clock_mono_ms() >= deadline ||
                !sandbox_is_paused(a, act->sandbox_id))
                break;
            lb_error_clear(err);
        }
        if (r == 0 && (res.error_type != LB_EXEC_OK || res.return_code != 0))
            r = lb_error_set(err, -EREMOTEIO, "the stop request failed (exit %d): %.200s",
                             res.return_code, res.err.data ? res.err.data : "");
        if (r == 0 && res.out.data && strncmp(res.out.data, "fenced", 6) == 0)
            receipt_write_unlaunched(a, act->id, NULL); /* nothing was or will be launched */
        provider_exec_result_release(&res);
        if (r < 0)
            goto out;
        for (int64_t next_check = clock_mono_ms() + PAUSED_CHECK_MS;;) {
            int64_t now;

            lb_error_clear(&rerr);
            r = read_receipt(a, act, &receipt, &rerr);
            now = clock_mono_ms();
            if (r != -ENOENT || now >= deadline)
                break;
            if (now >= next_check) {
                /* paused again meanwhile: the supervisor's cleanup needs the sandbox running */
                (void)act_resume_paused(a, act, "the harness's cleanup is under way", NULL);
                next_check = clock_mono_ms() + PAUSED_CHECK_MS;
            }
            usleep((useconds_t)wait * 1000);
            wait = wait * 2 > POLL_MAX_MS ? POLL_MAX_MS : wait * 2;
        }
        if (r == -ENOENT) {
            r = lb_error_set(err, -EREMOTEIO,
                             "the harness supervisor wrote no receipt within %.1f s; its "
                             "cleanup is unconfirmed (close again to retry)",
                             (double)(budget_ms + RECEIPT_SLACK_MS) / 1000.0);
            goto out;
        }
    }
    if (r < 0) {
        r = lb_error_set(err, -EREMOTEIO, "%s; cleanup cannot be confirmed", rerr.message);
        goto out;
    }
    r = act_record_receipt(a, act, receipt, err);
    if (r < 0)
        goto out;
    if (!receipt_confirmed(receipt)) {
        const char *e = json_string_value(json_object_get(receipt, "error"));

        r = lb_error_set(err, -EREMOTEIO, "the harness's cleanup was not confirmed: %s",
                         e ? e : "no reason given");
        goto out;
    }
    *out = receipt;
    receipt = NULL;
out:
    json_decref(receipt);
    return r;
}

/* Before a close collects the artifacts: stop every sandbox process but its init (an
 * exclusive exec), so nothing the agent left running can still write what is collected. The
 * exec itself is a --harness-stop, which finds the receipt and exits 0 at once; it runs on the
 * sandbox's own root (agent_root), where the activation's directory is. */
static int act_sweep(struct lb_activations *a, const struct lb_activation *act,
                     struct lb_error *err)
{
    char dir[200];
    char *argv[] = {SUPERVISE_PATH, "--harness-stop", dir, NULL};
    struct lb_exec_params p = {.argv = argv,
                               .timeout_ms = STOP_EXEC_TIMEOUT_MS,
                               .exclusive = true,
                               .agent_root = true,
                               .sweep_only = true};
    struct lb_exec_result res = {0};
    int r;

    snprintf(dir, sizeof(dir), "%s/%s", ACT_DIR_PARENT, act->id);
    r = lend_exec(a->lend, act->sandbox_id, &p, &res, err);
    if (r == 0 && (res.error_type != LB_EXEC_OK || res.return_code != 0))
        r = lb_error_set(err, -EREMOTEIO, "the sweep before artifact capture failed (exit %d)",
                         res.return_code);
    provider_exec_result_release(&res);
    if (r == -EBUSY) {
        /* paused: frozen processes write nothing while the capture reads */
        json_t *st = NULL;
        const char *s;

        if (lend_sandbox_status(a->lend, act->sandbox_id, &st, NULL) == 0 &&
            (s = json_string_value(json_object_get(st, "status"))) && strcmp(s, "paused") == 0) {
            log_info("activation %s: the sandbox is paused; capturing without the sweep", act->id);
            r = 0;
        }
        json_decref(st);
        if (r == 0)
            return 0;
    }
    if (r == 0)
        log_info("activation %s: every sandbox process but init stopped before capture", act->id);
    return r;
}

/* Append "; msg" (or msg) to a capture error. */
static void capture_note(struct lb_buf *b, const char *msg)
{
    if (b->len)
        (void)lb_buf_append_capped(b, "; ", 2);
    (void)lb_buf_append_capped(b, msg, strlen(msg));
}

/* Collect every listed path and the output log's tail into the record, once. */
static int act_capture(struct lb_activations *a, const struct lb_activation *act, json_t *spec,
                       const json_t *receipt, struct lb_error *err)
{
    json_t *collect = json_object_get(spec, "collect"), *v, *artifacts = json_object();
    bool launched = !json_is_false(json_object_get(receipt, "launched"));
    struct lb_buf cap_err;
    unsigned char *log = NULL;
    size_t log_len = 0, total = 0, idx, n_got = 0;
    uint64_t log_size = 0;
    char *text = NULL, path[256];
    int r = 0;

    lb_buf_init(&cap_err, 4096);
    if (!artifacts) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    log_info("activation %s: collecting artifacts", act->id);
    json_array_foreach(collect, idx, v) {
        const char *p = json_string_value(v);
        struct lb_error ferr = {0};
        unsigned char *data = NULL;
        size_t len = 0;
        uint64_t size = 0;
        char *b64 = NULL;
        size_t b64_len = 0;
        int fr;

        if (!p)
            continue;
        if (!launched) {
            json_object_set_new(artifacts, p, json_null());
            continue;
        }
        fr = sbx_read(a, act->sandbox_id, p, a->cfg.max_artifact_bytes, false, &data, &len, &size,
                      &ferr);
        if (fr == 0 && total + len > a->cfg.max_artifacts_bytes)
            fr = lb_error_set(&ferr, -EFBIG, "'%s' would pass the %zu-byte limit of all artifacts",
                              p, a->cfg.max_artifacts_bytes);
        if (fr == 0 && token_base64_encode(data, len, &b64, &b64_len) < 0)
            fr = lb_error_set(&ferr, -ENOMEM, "out of memory encoding '%s'", p);
        if (fr == 0) {
            total += len;
            n_got++;
            json_object_set_new(artifacts, p, json_pack("{s:s%}", "base64", b64, b64_len));
        } else {
            json_object_set_new(artifacts, p, json_null());
            if (fr != -ENOENT) {
                char msg[LB_ERROR_MESSAGE_MAX + 300];

                snprintf(msg, sizeof(msg), "'%s': %s", p, ferr.message);
                capture_note(&cap_err, msg);
            }
        }
        free(b64);
        free(data);
    }
    act_path(path, sizeof(path), act, "output.log");
    {
        struct lb_error lerr = {0};

        if (sbx_read(a, act->sandbox_id, path, a->cfg.max_log_bytes, true, &log, &log_len,
                     &log_size, &lerr) < 0) {
            log = NULL;
            log_len = 0;
            log_size = 0;
        }
    }
    text = json_dumps(artifacts, JSON_COMPACT);
    if (!text) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    r = store_activation_set_capture(a->store, act->id, text, cap_err.len ? cap_err.data : NULL,
                                     log ? log : (const unsigned char *)"", log_len,
                                     (int64_t)log_size, err);
    if (r == 0)
        log_info("activation %s: collected %zu of %zu artifacts%s%s", act->id, n_got,
                 json_array_size(collect), cap_err.len ? "; " : "",
                 cap_err.len ? cap_err.data : "");
out:
    free(text);
    free(log);
    lb_buf_release(&cap_err);
    json_decref(artifacts);
    return r;
}

/* Record a capture that could not happen (sandbox gone, forced stop), unless one exists. */
static void act_capture_unavailable(struct lb_activations *a, const struct lb_activation *act,
                                    json_t *spec, const char *why)
{
    json_t *collect = json_object_get(spec, "collect"), *v, *artifacts = json_object();
    char *text;
    size_t idx;

    json_array_foreach(collect, idx, v)
        if (json_is_string(v))
            json_object_set_new(artifacts, json_string_value(v), json_null());
    text = json_dumps(artifacts, JSON_COMPACT);
    if (text)
        (void)store_activation_set_capture(a->store, act->id, text, why, NULL, 0, -1, NULL);
    free(text);
    json_decref(artifacts);
}

/* One finalization. The caller holds the activation's finalizing flag. */
static int act_finalize_once(struct lb_activations *a, const char *sandbox_id, enum fin_mode mode,
                             int64_t budget_ms, struct lb_error *err)
{
    struct lb_activation act = {0};
    json_t *spec = NULL, *receipt = NULL;
    bool fenced = false;
    int r = store_get_activation_by_sandbox(a->store, sandbox_id, &act, err);

    if (r < 0)
        goto out;
    if (act.state == LB_ACT_CLOSED)
        goto out;
    if (mode == FIN_CLOSE && act.state != LB_ACT_CLOSING) {
        r = store_activation_set_state(a->store, act.id, LB_ACT_CLOSING,
                                       LB_ACT_MASK(LB_ACT_STAGING) | LB_ACT_MASK(LB_ACT_RUNNING) |
                                           LB_ACT_MASK(LB_ACT_CLOSING),
                                       err);
        if (r < 0)
            goto out;
        log_info("activation %s: closing", act.id);
    }
    spec = act.spec_json ? json_loads(act.spec_json, 0, NULL) : json_object();
    if (!sandbox_is_lent(a, sandbox_id)) {
        /* The sandbox is gone, and every process of it with it. */
        if (mode == FIN_STOP)
            goto out;
        if (mode == FIN_EXECUTE) {
            r = lb_error_set(err, -ENOENT, "sandbox %s was stopped while the harness ran",
                             sandbox_id);
            goto out;
        }
        if (!act.artifacts_json)
            act_capture_unavailable(a, &act, spec, "sandbox stopped before artifact capture");
        goto close;
    }
    receipt = act.receipt_json ? json_loads(act.receipt_json, 0, NULL) : NULL;
    if (!receipt_confirmed(receipt)) {
        json_decref(receipt);
        receipt = NULL;
        r = act_stop(a, &act, budget_ms, &receipt, err);
        if (r < 0)
            goto out;
    }
    if (mode == FIN_STOP) /* NeMo Gym's stop_harness: the capture is close's (or a GET's) */
        goto out;
    if (mode == FIN_CLOSE) {
        /* the operate token stays fenced from the sweep to the end of the capture: nothing
         * of the agent (an upload) can write what is collected in between */
        r = lend_fence_raise(a->lend, act.sandbox_id, err);
        if (r < 0)
            goto out;
        fenced = true;
        r = act_sweep(a, &act, err);
        if (r < 0)
            goto out;
    }
    if (!act.artifacts_json) {
        r = act_capture(a, &act, spec, receipt, err);
        if (r == -EALREADY)
            r = 0;
        if (r < 0)
            goto out;
    }
    if (fenced) {
        lend_fence_lower(a->lend, act.sandbox_id);
        fenced = false;
    }
close:
    if (mode == FIN_CLOSE) {
        r = store_activation_set_state(a->store, act.id, LB_ACT_CLOSED,
                                       LB_ACT_MASK(LB_ACT_CLOSING) | LB_ACT_MASK(LB_ACT_CLOSED),
                                       err);
        if (r == 0) {
            char path[PATH_MAX];

            receipt_path(a, act.id, path, sizeof(path));
            (void)unlink(path); /* its content is in the record */
            log_info("activation %s: closed", act.id);
        }
    }
out:
    if (fenced)
        lend_fence_lower(a->lend, act.sandbox_id);
    json_decref(receipt);
    json_decref(spec);
    store_activation_release(&act);
    return r;
}

/* Run a finalization, or join the one running: a close that joins a failed one shares its
 * failure; otherwise the joiner runs its own (which finds the work done and returns). */
static int act_finalize(struct lb_activations *a, const char *sandbox_id, enum fin_mode mode,
                        int64_t budget_ms, struct lb_error *err)
{
    struct act_entry *e = entry_get(a, sandbox_id);
    /* the running finalization is bounded (its stop exec, its receipt wait, the capture): wait
     * for it no longer than a finalization of our own could take, plus a margin */
    int64_t until_ms =
        clock_mono_ms() + budget_ms + RECEIPT_SLACK_MS + STOP_EXEC_TIMEOUT_MS + JOIN_SLACK_MS;
    struct timespec until = {.tv_sec = until_ms / 1000,
                             .tv_nsec = (long)(until_ms % 1000) * 1000000L};
    int r;

    if (!e)
        return lb_error_set(err, -ENOMEM, "out of memory");
    pthread_mutex_lock(&a->mutex);
    while (e->finalizing) {
        uint64_t gen = e->gen;

        while (e->finalizing && e->gen == gen) {
            if (pthread_cond_timedwait(&a->cond, &a->mutex, &until) == ETIMEDOUT && e->finalizing &&
                e->gen == gen) {
                pthread_mutex_unlock(&a->mutex);
                entry_put(a, e);
                return lb_error_set(err, -EBUSY,
                                    "another close of the harness in sandbox %s is still "
                                    "running; retry later",
                                    sandbox_id);
            }
        }
        if (mode == FIN_CLOSE && e->last_mode == FIN_CLOSE && e->last_rc < 0 && !e->finalizing) {
            r = e->last_rc;
            if (err)
                *err = e->last_err;
            pthread_mutex_unlock(&a->mutex);
            entry_put(a, e);
            return r;
        }
    }
    e->finalizing = true;
    pthread_mutex_unlock(&a->mutex);

    r = act_finalize_once(a, sandbox_id, mode, budget_ms, err);

    pthread_mutex_lock(&a->mutex);
    e->finalizing = false;
    e->gen++;
    e->last_rc = r;
    e->last_mode = mode;
    lb_error_clear(&e->last_err);
    if (r < 0 && err)
        e->last_err = *err;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->mutex);
    entry_put(a, e);
    return r;
}

static int64_t spec_ms(const json_t *spec, const char *key, int64_t def)
{
    json_t *v = json_object_get(spec, key);

    return json_is_integer(v) && json_integer_value(v) > 0 ? (int64_t)json_integer_value(v) : def;
}

/* ---------- rendering ---------- */

static json_t *stored_artifacts(const struct lb_activation *act, json_t *spec)
{
    json_t *art = act->artifacts_json ? json_loads(act->artifacts_json, 0, NULL) : NULL;
    json_t *collect = json_object_get(spec, "collect"), *v;
    size_t idx;

    if (art)
        return art;
    art = json_object(); /* not collected (yet): every path null */
    json_array_foreach(collect, idx, v)
        if (json_is_string(v))
            json_object_set_new(art, json_string_value(v), json_null());
    return art;
}

/* "oom" when a memory-limit kill ended the harness (act_note_oom), else NULL (JSON null). */
static const char *receipt_error_type(const json_t *receipt, const char *why_override)
{
    return !why_override && !json_is_true(json_object_get(receipt, "timed_out")) &&
                   json_is_string(json_object_get(receipt, "oom_message"))
               ? "oom"
               : NULL;
}

/* The execute result of API.md from the record. why overrides the receipt's reason. */
static json_t *render_result(const struct lb_activation *act, const char *why_override)
{
    json_t *receipt = act->receipt_json ? json_loads(act->receipt_json, 0, NULL) : NULL;
    json_t *spec = act->spec_json ? json_loads(act->spec_json, 0, NULL) : NULL;
    json_t *rc = json_object_get(receipt, "return_code"), *out;
    const char *why, *state = outcome(receipt, &why);

    if (why_override) {
        state = "failed";
        why = why_override;
    }
    out = json_pack("{s:s,s:s,s:o,s:o,s:s?,s:o,s:I,s:s?,s:s?}", "activation_id", act->id, "state",
                    state, "return_code", json_is_integer(rc) ? json_copy(rc) : json_null(),
                    "artifacts", stored_artifacts(act, spec), "capture_error", act->capture_error,
                    "cleanup", render_cleanup(receipt), "output_log_bytes",
                    (json_int_t)(act->output_log_bytes > 0 ? act->output_log_bytes : 0), "error",
                    why, "error_type", receipt_error_type(receipt, why_override));
    if (out && strcmp(state, "finished") != 0) {
        size_t n = act->log_len > RESULT_LOG_TAIL ? RESULT_LOG_TAIL : act->log_len;

        json_object_set_new(out, "output_log_tail",
                            json_text(act->log ? act->log + act->log_len - n : NULL, n));
    }
    json_decref(receipt);
    json_decref(spec);
    return out;
}

static json_t *render_close(const struct lb_activation *act)
{
    json_t *receipt = act->receipt_json ? json_loads(act->receipt_json, 0, NULL) : NULL;
    json_t *spec = act->spec_json ? json_loads(act->spec_json, 0, NULL) : NULL;
    json_t *out = json_pack("{s:b,s:s,s:s,s:o,s:s?,s:o,s:I,s:s?}", "closed", 1, "activation_id",
                            act->id, "state", store_act_state_name(act->state), "artifacts",
                            stored_artifacts(act, spec), "capture_error", act->capture_error,
                            "cleanup", render_cleanup(receipt), "output_log_bytes",
                            (json_int_t)(act->output_log_bytes > 0 ? act->output_log_bytes : 0),
                            "error_type", receipt_error_type(receipt, NULL));
    json_t *rc = json_object_get(receipt, "return_code");

    if (out) /* the same return code as execute and GET report */
        json_object_set_new(out, "return_code", json_is_integer(rc) ? json_copy(rc) : json_null());

    json_decref(receipt);
    json_decref(spec);
    return out;
}

/* res as compact JSON text, with raw (stored JSON text, taken; NULL: none) spliced in as its
 * last member "artifacts": the stored artifacts are copied, never parsed. */
static int render_text(const json_t *res, char *raw, char **text, size_t *len, struct lb_error *err)
{
    char *small = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII), *all = NULL;
    size_t n = small ? strlen(small) : 0, k;
    int r = 0;

    *text = NULL;
    *len = 0;
    if (!small || n < 2 || small[n - 1] != '}') {
        r = lb_error_set(err, -ENOMEM, "out of memory rendering the activation");
        goto out;
    }
    if (!raw) {
        *text = small;
        *len = n;
        small = NULL;
        goto out;
    }
    k = strlen(raw);
    all = malloc(n + k + 16);
    if (!all) {
        r = lb_error_set(err, -ENOMEM, "out of memory rendering the activation");
        goto out;
    }
    memcpy(all, small, --n); /* without the closing brace */
    if (n > 1)
        all[n++] = ',';
    memcpy(all + n, "\"artifacts\":", 12);
    n += 12;
    free(small); /* copied: freed before the large copy */
    small = NULL;
    memcpy(all + n, raw, k);
    n += k;
    all[n++] = '}';
    all[n] = '\0';
    *text = all;
    *len = n;
out:
    free(small);
    free(raw);
    return r;
}

/* ---------- execute ---------- */

static json_t *execute_spec(const struct lb_execute_request *req, const char *dir)
{
    json_t *argv = json_array(), *collect = json_array(), *stage = json_array(), *spec;

    for (size_t i = 0; req->argv[i]; i++)
        json_array_append_new(argv, json_string(req->argv[i]));
    for (size_t i = 0; req->collect && req->collect[i]; i++)
        json_array_append_new(collect, json_string(req->collect[i]));
    for (size_t i = 0; i < req->n_stage; i++)
        json_array_append_new(stage, json_string(req->stage[i].path));
    spec = json_pack("{s:o,s:s?,s:O?,s:s?,s:o,s:o,s:I,s:I,s:s}", "argv", argv, "cwd", req->cwd,
                     "env", req->env, "user", req->user, "collect", collect, "stage", stage,
                     "timeout_ms", (json_int_t)req->timeout_ms, "close_timeout_ms",
                     (json_int_t)req->close_timeout_ms, "dir", dir);
    if (spec && req->nowait)
        json_object_set_new(spec, "nowait", json_true());
    return spec;
}

/* Launch the harness. receipt_file: where the harness supervisor writes its receipt inside
 * the sandbox (a receipt_file provider), NULL: to the host-side file passed as its fd 4. 0
 * launched, -EALREADY fenced by a close, else *why says what failed (and the outcome is
 * unknown when the transport failed). */
static int execute_launch(struct lb_activations *a, const struct lb_activation *act,
                          const struct lb_execute_request *req, const char *dir,
                          const char *receipt_file, char *why, size_t why_len)
{
    int receipt_fd = receipt_create(a, act->id);
    struct lb_exec_result res = {0};
    struct lb_error err = {0};
    char t_ms[32], c_ms[32], *user = NULL;
    size_t n = 0, k = 0;
    char **argv;
    int r;

    if (receipt_fd < 0) {
        snprintf(why, why_len, "cannot create the receipt file: %s", strerror(-receipt_fd));
        return receipt_fd;
    }
    /* the harness's user: the request's, else the image's User, else root */
    r = lend_exec_user(a->lend, act->sandbox_id, req->user, &user, &err);
    if (r < 0) {
        close(receipt_fd);
        snprintf(why, why_len, "%s", err.message);
        return r;
    }
    while (req->argv[n])
        n++;
    argv = calloc(n + 14, sizeof(*argv));
    if (!argv) {
        free(user);
        close(receipt_fd);
        snprintf(why, why_len, "out of memory");
        return -ENOMEM;
    }
    snprintf(t_ms, sizeof(t_ms), "%lld", (long long)req->timeout_ms);
    snprintf(c_ms, sizeof(c_ms), "%lld",
             (long long)(req->close_timeout_ms / 3 > 0 ? req->close_timeout_ms / 3 : 1));
    argv[k++] = SUPERVISE_PATH;
    argv[k++] = "--harness-launch";
    argv[k++] = (char *)dir;
    argv[k++] = "--timeout-ms";
    argv[k++] = t_ms;
    argv[k++] = "--cleanup-timeout-ms";
    argv[k++] = c_ms;
    if (receipt_file) {
        argv[k++] = "--receipt-file"; /* the host-side file stays the daemon's own */
        argv[k++] = (char *)receipt_file;
    } else {
        argv[k++] = "--receipt-fd"; /* the host-side receipt, passed as fd 4 */
        argv[k++] = "4";
    }
    if (user) {
        /* the harness runs as the user; the launcher (which makes the activation's directory
         * under the root-owned /run/lendbox) and the harness supervisor stay the sandbox's
         * root */
        argv[k++] = "--user";
        argv[k++] = user;
    }
    argv[k++] = "--";
    for (size_t i = 0; i < n; i++)
        argv[k++] = req->argv[i];
    argv[k] = NULL;

    /* the harness's environment: the request's, then where its stop request appears (NeMo
     * Gym's stop_request_path) */
    json_t *env = req->env ? json_deep_copy(req->env) : json_object();
    char stop_path[256];

    snprintf(stop_path, sizeof(stop_path), "%s/stop.request", dir);
    if (!env || json_object_set_new(env, "LENDBOX_STOP_REQUEST", json_string(stop_path)) < 0 ||
        json_object_set_new(env, "LENDBOX_ACTIVATION_ID", json_string(act->id)) < 0) {
        json_decref(env);
        free(user);
        free(argv);
        close(receipt_fd);
        snprintf(why, why_len, "out of memory");
        return -ENOMEM;
    }
    struct lb_exec_params p = {
        .argv = argv,
        .cwd = req->cwd,
        .env = env,
        .user = "0", /* the launcher (root; the supervisor leaves it its capabilities): the
                        harness's user is its --user */
        /* the launcher returns once the harness supervisor runs: bounded by the harness's
         * own timeout (plus slack), so a pause during the launch ends it that much sooner */
        .timeout_ms = req->timeout_ms + LAUNCH_SLACK_MS < LAUNCH_TIMEOUT_MS
                          ? req->timeout_ms + LAUNCH_SLACK_MS
                          : LAUNCH_TIMEOUT_MS,
        .preserve_background = true,
        .pass_fd = receipt_file ? 0 : receipt_fd,
    };
    r = lend_exec(a->lend, act->sandbox_id, &p, &res, &err);
    if (r < 0) {
        snprintf(why, why_len, "the launch failed: %s", err.message);
    } else if (res.error_type == LB_EXEC_OK && res.return_code == 4) {
        /* we launch once: a claim there before us was made by a sandbox process */
        r = -EREMOTEIO;
        snprintf(why, why_len,
                 "a sandbox process took the launch claim; the harness was not "
                 "launched");
        receipt_write_unlaunched(a, act->id, why);
    } else if (res.error_type == LB_EXEC_OK && res.return_code == 0) {
        log_info("activation %s: launched (%.*s)", act->id,
                 (int)strcspn(res.out.data ? res.out.data : "", "\n"),
                 res.out.data ? res.out.data : "");
    } else if (res.error_type == LB_EXEC_OK && res.return_code == 3) {
        r = -EALREADY;
        receipt_write_unlaunched(a, act->id, NULL);
        snprintf(why, why_len, "the activation was closed before the harness was launched");
    } else {
        const char *msg = res.err.data && res.err.len ? res.err.data : res.out.data;

        r = -EREMOTEIO;
        snprintf(why, why_len, "the launch failed (exit %d): %.400s", res.return_code,
                 msg ? msg : "");
        why[strcspn(why, "\n")] = '\0';
    }
    provider_exec_result_release(&res);
    json_decref(env);
    free(argv);
    free(user);
    close(receipt_fd); /* the harness supervisor holds its own */
    return r;
}

/* Wait for the receipt until deadline_ms: 0 when it is there, -ETIMEDOUT, -ESHUTDOWN
 * (draining) or -ENOENT (the sandbox is gone). From PAUSED_RESUME_MS past timeout_at_ms (the
 * harness's own deadline) on, a paused sandbox is resumed (and again if it is paused again),
 * so that the supervisor ends the harness at its timeout whatever the sandbox's state. */
static int execute_wait(struct lb_activations *a, const struct lb_activation *act,
                        int64_t timeout_at_ms, int64_t deadline_ms)
{
    int64_t wait = POLL_FIRST_MS, pause_check = timeout_at_ms + PAUSED_RESUME_MS;

    for (;;) {
        json_t *receipt = NULL;
        int r = read_receipt(a, act, &receipt, NULL);

        json_decref(receipt);
        if (r != -ENOENT)
            return 0; /* there (readable or not: finalization judges it) */
        {
            /* a close (or a GET) may have recorded it first; a closed one's file is gone */
            struct lb_activation cur = {0};
            bool held =
                store_get_activation_by_sandbox(a->store, act->sandbox_id, &cur, NULL) == 0 &&
                (cur.receipt_json || cur.state == LB_ACT_CLOSED);

            store_activation_release(&cur);
            if (held)
                return 0;
        }
        if (!sandbox_is_lent(a, act->sandbox_id))
            return -ENOENT;
        if (lend_is_draining(a->lend))
            return -ESHUTDOWN;
        if (clock_mono_ms() >= deadline_ms)
            return -ETIMEDOUT;
        if (clock_mono_ms() >= pause_check) {
            struct lb_error perr = {0};

            if (act_resume_paused(a, act, "the harness's timeout_s has passed", &perr) < 0)
                log_warn("activation %s: %s", act->id, perr.message);
            pause_check = clock_mono_ms() + PAUSED_CHECK_MS;
        }
        usleep((useconds_t)wait * 1000);
        wait = wait * 2 > POLL_MAX_MS ? POLL_MAX_MS : wait * 2;
    }
}

/* Stage the files; stops early (-EALREADY) when a close got in. */
static int execute_stage(struct lb_activations *a, const struct lb_activation *act,
                         const struct lb_execute_request *req, struct lb_error *err)
{
    for (size_t i = 0; i < req->n_stage; i++) {
        const struct lb_seed_file *f = &req->stage[i];
        struct lb_activation cur = {0};
        bool closing =
            store_get_activation_by_sandbox(a->store, act->sandbox_id, &cur, NULL) == 0 &&
            cur.state != LB_ACT_STAGING;
        int r;

        store_activation_release(&cur);
        if (closing)
            return lb_error_set(err, -EALREADY, "activation %s was closed while staging", act->id);
        struct lb_error werr = {0};

        /* an execute admitted before an exclusive exec began stages nothing once it runs */
        r = lend_fence_enter(a->lend, act->sandbox_id, &werr);
        if (r == 0) {
            r = lend_file_write(a->lend, act->sandbox_id, f->path, f->data, f->len, f->mode, &werr);
            lend_fence_leave(a->lend, act->sandbox_id);
        }
        if (r == -EBUSY)
            return lb_error_set(err, r, "%s", werr.message);
        if (r < 0)
            return lb_error_set(err, r, "staging '%s' failed: %s", f->path, werr.message);
    }
    return 0;
}

int activation_execute(struct lb_activations *a, const char *rsid,
                       const struct lb_execute_request *req, json_t **out, struct lb_error *err)
{
    struct lb_activation act = {0};
    struct lb_record live = {0};
    struct lb_error ferr = {0};
    json_t *spec = NULL, *status = NULL;
    char *spec_text = NULL, dir[200], receipt_file[240], why[600] = "", sid[31];
    const char *st;
    bool receipt_in_sbx = false;
    int64_t phase_ms, deadline, launched_at;
    int r;

    *out = NULL;
    if (lend_is_draining(a->lend))
        return lb_error_set(err, -ESHUTDOWN, "the daemon is draining; no new activations");
    if (store_get_live_by_rsid(a->store, rsid, &live, NULL) < 0 || live.state != LB_STATE_LENT) {
        r = lb_error_set(err, -ENOENT, "session %s has no lent sandbox", rsid);
        goto out;
    }
    {
        /* the receipt channel: a daemon file passed to the harness supervisor (pass_fd), or
         * else a file inside the sandbox read back through the files API (receipt_file, lxd);
         * a provider with neither cannot run activations */
        struct lb_provider *prov = lend_provider_of(a->lend, &live, NULL);
        struct lb_provider_caps caps;

        provider_caps(prov, &caps);
        if (prov && !caps.pass_fd && !caps.receipt_file) {
            r = lb_error_set(err, -ENOSYS,
                             "harness activations are not available on provider '%s' (it cannot "
                             "pass the receipt file to the harness supervisor)",
                             prov->ops->name);
            goto out;
        }
        receipt_in_sbx = prov && !caps.pass_fd;
    }
    if (lend_sandbox_status(a->lend, live.id, &status, NULL) == 0 &&
        (st = json_string_value(json_object_get(status, "status"))) && !strcmp(st, "paused")) {
        r = lb_error_set(err, -EBUSY, "sandbox %s is paused; resume it first", live.id);
        goto out;
    }
    r = token_new_sandbox_id(sid);
    if (r < 0) {
        r = lb_error_set(err, r, "cannot make an activation id");
        goto out;
    }
    snprintf(act.id, sizeof(act.id), "act-%s", sid + 4);
    snprintf(act.sandbox_id, sizeof(act.sandbox_id), "%s", live.id);
    snprintf(dir, sizeof(dir), "%s/%s", ACT_DIR_PARENT, act.id);
    snprintf(receipt_file, sizeof(receipt_file), "%s/receipt.json", dir);
    act.rsid = (char *)rsid;
    act.state = LB_ACT_STAGING;
    act.output_log_bytes = -1;
    spec = execute_spec(req, dir);
    if (spec && receipt_in_sbx &&
        json_object_set_new(spec, "receipt_file", json_string(receipt_file)) < 0) {
        json_decref(spec);
        spec = NULL;
    }
    {
        /* the OOM-kill count now, kept with the spec: act_note_oom compares at the end */
        uint64_t oom_kills = 0;

        if (spec && lend_sandbox_oom_kills(a->lend, live.id, &oom_kills, NULL, NULL) == 0)
            json_object_set_new(spec, "oom_kills_at_launch", json_integer((json_int_t)oom_kills));
    }
    spec_text = spec ? json_dumps(spec, JSON_COMPACT) : NULL;
    if (!spec_text) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        act.rsid = NULL;
        goto out;
    }
    act.spec_json = spec_text;
    /* Intent first; the unique index makes a second execute of this sandbox a 409. */
    r = store_insert_activation(a->store, &act, err);
    act.rsid = NULL;
    spec_text = NULL; /* act's now: read_receipt finds its receipt_file there */
    if (r == -EEXIST) {
        r = lb_error_set(err, -EEXIST,
                         "session %s already ran a harness in sandbox %s (one activation per "
                         "lent sandbox)",
                         rsid, live.id);
        goto out;
    }
    if (r < 0)
        goto out;
    log_info("activation %s: staging %zu files in sandbox %s (session %s)", act.id, req->n_stage,
             live.id, rsid);
    r = execute_stage(a, &act, req, err);
    if (r < 0)
        goto out;
    r = store_activation_set_state(a->store, act.id, LB_ACT_RUNNING, LB_ACT_MASK(LB_ACT_STAGING),
                                   err);
    if (r == -EBUSY) {
        r = lb_error_set(err, -EALREADY, "activation %s was closed before the launch", act.id);
        goto out;
    }
    if (r < 0)
        goto out;

    phase_ms = req->close_timeout_ms / 3 > 0 ? req->close_timeout_ms / 3 : 1;
    launched_at = clock_mono_ms();
    deadline = launched_at + req->timeout_ms + 3 * phase_ms + EXECUTE_SLACK_MS;
    r = execute_launch(a, &act, req, dir, receipt_in_sbx ? receipt_file : NULL, why, sizeof(why));
    if (r == -EALREADY) {
        r = lb_error_set(err, -EALREADY, "activation %s: %s", act.id, why);
        goto out;
    }
    if (r == -EBUSY) {
        /* Refused before anything ran (a pause won the race with this launch): a 409, as an
         * execute of a paused sandbox is. Nothing to end now, and nothing can be ended in a
         * paused sandbox; a close (after a resume) fences the launch claim and records it. */
        r = lb_error_set(err, -EBUSY,
                         "activation %s: the harness was not launched (%s); close the activation "
                         "once the sandbox is resumed",
                         act.id, why);
        goto out;
    }
    if (r < 0) {
        /* Launched or not, end it (the stop's claim fences a launch that has not happened). */
        log_warn("activation %s: %s", act.id, why);
    } else if (req->nowait) {
        /* "wait": false: the client polls GET .../activation, which collects; the harness's
         * own supervisor enforces its timeout inside the sandbox */
        *out = json_pack("{s:s,s:s}", "activation_id", act.id, "state", "running");
        goto out;
    } else {
        r = execute_wait(a, &act, launched_at + req->timeout_ms, deadline);
        if (r == -ESHUTDOWN) {
            r = lb_error_set(err, -ESHUTDOWN,
                             "the daemon is shutting down before activation %s ended; after "
                             "the restart, GET the activation or close it",
                             act.id);
            goto out;
        }
        if (r == -ENOENT) {
            /* Stopped under us; a release closed the activation first, if it ran. */
            r = act_reload(a, act.sandbox_id, &act, err);
            if (r == 0)
                *out = render_result(&act, act.receipt_json ? NULL
                                                            : "the sandbox was stopped before "
                                                              "the harness ended");
            goto out;
        }
        if (r == -ETIMEDOUT) {
            log_warn("activation %s: no receipt by the execution deadline; stopping it", act.id);
            snprintf(why, sizeof(why), "the harness supervisor exceeded its execution deadline");
        }
    }
    r = act_finalize(a, act.sandbox_id, FIN_EXECUTE, req->close_timeout_ms, &ferr);
    if (r < 0 && why[0]) {
        r = lb_error_set(err, -EREMOTEIO, "%s; and then %s", why, ferr.message);
        goto out;
    }
    if (r < 0) {
        r = lb_error_set(err, r, "%s", ferr.message);
        goto out;
    }
    r = act_reload(a, act.sandbox_id, &act, err);
    if (r == 0 && req->nowait) {
        /* the launch failed: known already, and GET says why */
        *out = json_pack("{s:s,s:s}", "activation_id", act.id, "state", "failed");
    } else if (r == 0) {
        *out = render_result(&act, why[0] ? why : NULL);
        log_info("activation %s: %s", act.id,
                 *out ? json_string_value(json_object_get(*out, "state")) : "?");
    }
out:
    if (r == 0 && !*out)
        r = lb_error_set(err, -ENOMEM, "cannot render the activation result");
    json_decref(status);
    json_decref(spec);
    free(spec_text);
    store_activation_release(&act);
    store_record_release(&live);
    return r;
}

/* ---------- close, get, release ---------- */

int activation_close(struct lb_activations *a, const char *rsid, int64_t timeout_ms, char **text,
                     size_t *len, struct lb_error *err)
{
    struct lb_activation act = {0};
    json_t *spec = NULL, *out = NULL;
    char *raw = NULL;
    int r = act_find(a, rsid, &act, err);

    *text = NULL;
    *len = 0;
    if (r == -ENOENT) {
        *text = strdup("{\"closed\":false}");
        *len = *text ? strlen(*text) : 0;
        return *text ? 0 : lb_error_set(err, -ENOMEM, "out of memory");
    }
    if (r < 0)
        return r;
    if (act.state != LB_ACT_CLOSED) {
        spec = act.spec_json ? json_loads(act.spec_json, 0, NULL) : NULL;
        if (timeout_ms <= 0)
            timeout_ms = spec_ms(spec, "close_timeout_ms", 60000);
        r = act_finalize(a, act.sandbox_id, FIN_CLOSE, timeout_ms, err);
        if (r == 0)
            r = act_reload(a, act.sandbox_id, &act, err);
    }
    if (r == 0) {
        raw = act.artifacts_json; /* spliced in, not parsed */
        act.artifacts_json = NULL;
        out = render_close(&act);
        if (!out)
            r = lb_error_set(err, -ENOMEM, "out of memory");
    }
    if (r == 0) {
        if (raw)
            json_object_del(out, "artifacts");
        r = render_text(out, raw, text, len, err);
        raw = NULL;
    }
    free(raw);
    json_decref(out);
    json_decref(spec);
    store_activation_release(&act);
    return r;
}

/* Has the harness of act not ended yet, as far as the record and its receipt file tell? */
static bool act_open(struct lb_activations *a, const struct lb_activation *act)
{
    json_t *receipt = NULL;
    bool open = !act->receipt_json && act->state != LB_ACT_CLOSED &&
                read_receipt(a, act, &receipt, NULL) == -ENOENT;

    json_decref(receipt);
    return open;
}

struct lb_activation_watch {
    struct lb_activations *a;
    char act_id[LB_ID_MAX];
    char sandbox_id[LB_ID_MAX];
    enum lb_act_state state;
};

int activation_watch_begin(struct lb_activations *a, const char *rsid,
                           struct lb_activation_watch **out, struct lb_error *err)
{
    struct lb_activation act = {0};
    struct lb_activation_watch *w = NULL;
    int r = act_find(a, rsid, &act, err);

    *out = NULL;
    if (r < 0)
        return r;
    if (act_open(a, &act) && !lend_is_draining(a->lend)) {
        w = calloc(1, sizeof(*w));
        if (!w) {
            r = lb_error_set(err, -ENOMEM, "out of memory");
            goto out;
        }
        w->a = a;
        w->state = act.state;
        snprintf(w->act_id, sizeof(w->act_id), "%s", act.id);
        snprintf(w->sandbox_id, sizeof(w->sandbox_id), "%s", act.sandbox_id);
        *out = w;
    }
out:
    store_activation_release(&act);
    return r;
}

bool activation_watch_changed(struct lb_activation_watch *w)
{
    struct lb_activation cur = {0};
    bool changed;

    if (lend_is_draining(w->a->lend))
        return true;
    changed = store_get_activation_by_sandbox(w->a->store, w->sandbox_id, &cur, NULL) < 0 ||
              strcmp(cur.id, w->act_id) != 0 || cur.state != w->state || !act_open(w->a, &cur) ||
              !sandbox_is_lent(w->a, w->sandbox_id);
    store_activation_release(&cur);
    return changed;
}

void activation_watch_free(struct lb_activation_watch *w)
{
    free(w);
}

/* The session's activation as JSON in *out; the stored artifacts are not parsed but handed
 * over as their JSON text in *raw (NULL when not collected: then "artifacts" stays in *out),
 * and *out lacks "artifacts". */
static int act_get(struct lb_activations *a, const char *rsid, bool with_log, json_t **out,
                   char **raw, struct lb_error *err)
{
    struct lb_activation act = {0};
    json_t *spec = NULL, *receipt = NULL, *res = NULL;
    char *art_text = NULL;
    bool live, collected;
    int r = act_find(a, rsid, &act, err);

    if (r < 0)
        return r;
    live = act.state != LB_ACT_CLOSED && sandbox_is_lent(a, act.sandbox_id);
    /* A receipt that came while nobody waited (the execute's caller went away, the daemon
     * was restarted): recorded now, so the state follows it from here on. */
    if (!act.receipt_json && (act.state == LB_ACT_RUNNING || act.state == LB_ACT_CLOSING) &&
        read_receipt(a, &act, &receipt, NULL) == 0 &&
        act_record_receipt(a, &act, receipt, NULL) == 0)
        act.receipt_json = json_dumps(receipt, JSON_COMPACT);
    spec = act.spec_json ? json_loads(act.spec_json, 0, NULL) : json_object();
    /* "wait": false: nobody waits to collect, so the first GET that finds the harness ended
     * (its cleanup confirmed) collects, once, as execute would have */
    if (json_is_true(json_object_get(spec, "nowait")) && act.state == LB_ACT_RUNNING &&
        !act.artifacts_json && act.receipt_json && live) {
        json_t *held = json_loads(act.receipt_json, 0, NULL);
        struct lb_error ferr = {0};

        if (receipt_confirmed(held) &&
            act_finalize(a, act.sandbox_id, FIN_EXECUTE, spec_ms(spec, "close_timeout_ms", 60000),
                         &ferr) < 0)
            log_warn("activation %s: collecting after the harness ended failed: %s", act.id,
                     ferr.message);
        json_decref(held);
        r = act_reload(a, act.sandbox_id, &act, err);
        if (r < 0)
            goto out;
    }
    collected = act.artifacts_json != NULL;
    if (raw) { /* not parsed: the caller splices the text in */
        art_text = act.artifacts_json;
        act.artifacts_json = NULL;
    }
    res = render_result(&act, NULL);
    if (!res) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    if (!act.receipt_json) {
        json_object_set_new(res, "state", json_null());
        json_object_set_new(res, "error", json_null());
    }
    json_object_set_new(res, "outcome", json_incref(json_object_get(res, "state")));
    /* running with a receipt: the harness has ended, and the state says how (as execute did) */
    if (act.state != LB_ACT_RUNNING || !act.receipt_json)
        json_object_set_new(res, "state", json_string(store_act_state_name(act.state)));
    json_object_del(res, "output_log_tail");
    if (!collected)
        json_object_set_new(res, "artifacts", json_null());
    else if (raw)
        json_object_del(res, "artifacts");
    json_object_set_new(res, "artifacts_collected", json_boolean(collected));
    json_object_set_new(res, "resources_session_id", json_string(act.rsid ? act.rsid : ""));
    json_object_set_new(res, "sandbox_id", json_string(act.sandbox_id));
    json_object_set_new(res, "argv", json_incref(json_object_get(spec, "argv")));
    json_object_set_new(res, "collect", json_incref(json_object_get(spec, "collect")));
    json_object_set_new(res, "timeout_s",
                        json_real((double)spec_ms(spec, "timeout_ms", 0) / 1000.0));
    json_object_set_new(res, "close_timeout_s",
                        json_real((double)spec_ms(spec, "close_timeout_ms", 0) / 1000.0));
    {
        char stop_path[256];

        act_path(stop_path, sizeof(stop_path), &act, "stop.request");
        json_object_set_new(res, "stop_request_path", json_string(stop_path));
        json_object_set_new(res, "wait",
                            json_boolean(!json_is_true(json_object_get(spec, "nowait"))));
    }
    json_object_set_new(res, "created_at", json_time(act.created_at));
    json_object_set_new(res, "updated_at", json_time(act.updated_at));
    if (with_log) {
        unsigned char *log = NULL;
        size_t len = 0;
        uint64_t size = 0;
        char path[256];

        act_path(path, sizeof(path), &act, "output.log");
        if (live && sbx_read(a, act.sandbox_id, path, a->cfg.max_log_bytes, true, &log, &len, &size,
                             NULL) == 0) {
            json_object_set_new(res, "log", json_text(log, len));
            json_object_set_new(res, "log_truncated", json_boolean(size > len));
            json_object_set_new(res, "output_log_bytes", json_integer((json_int_t)size));
        } else {
            json_object_set_new(res, "log", json_text(act.log, act.log_len));
            json_object_set_new(res, "log_truncated",
                                json_boolean(act.output_log_bytes > (int64_t)act.log_len));
        }
        free(log);
    }
    *out = res;
    res = NULL;
    if (raw) {
        *raw = art_text;
        art_text = NULL;
    }
out:
    free(art_text);
    json_decref(res);
    json_decref(receipt);
    json_decref(spec);
    store_activation_release(&act);
    return r;
}

int activation_get_text(struct lb_activations *a, const char *rsid, bool with_log, char **text,
                        size_t *len, struct lb_error *err)
{
    json_t *res = NULL;
    char *raw = NULL;
    int r = act_get(a, rsid, with_log, &res, &raw, err);

    *text = NULL;
    *len = 0;
    if (r == 0)
        r = render_text(res, raw, text, len, err);
    json_decref(res);
    return r;
}

int activation_answer_bytes(struct lb_activations *a, const char *rsid, bool with_log,
                            uint64_t *bytes, struct lb_error *err)
{
    uint64_t text = 0;
    int r = store_activation_text_bytes(a->store, rsid, &text, err);

    if (r < 0)
        return r;
    /* the stored texts loaded and copied into the answer, a live log's tail read and escaped
     * (\u00XX: 6 bytes for one), and the fixed fields */
    *bytes = 2 * text + (with_log ? 7 * (uint64_t)a->cfg.max_log_bytes : 0) + 4096;
    return 0;
}

int activation_open_log(struct lb_activations *a, const char *rsid, int *fd, struct lb_error *err)
{
    struct lb_activation act = {0};
    char path[256];
    uint64_t size = 0;
    int r = act_find(a, rsid, &act, err);

    *fd = -1;
    if (r < 0)
        return r;
    if (act.state == LB_ACT_CLOSED || !sandbox_is_lent(a, act.sandbox_id)) {
        r = lb_error_set(err, -ENOENT,
                         "the activation of session %s is over: its log is in the record "
                         "(GET .../activation?log=1)",
                         rsid);
    } else {
        act_path(path, sizeof(path), &act, "output.log");
        r = lend_file_open(a->lend, act.sandbox_id, path, fd, &size, err);
    }
    store_activation_release(&act);
    return r;
}

int activation_stop_harness(struct lb_activations *a, const char *rsid, int64_t timeout_ms,
                            char **text, size_t *len, struct lb_error *err)
{
    struct lb_activation act = {0};
    json_t *spec = NULL;
    int r = act_find(a, rsid, &act, err);

    *text = NULL;
    *len = 0;
    if (r < 0)
        return r;
    /* nothing to do once the receipt is held, the activation closed or the sandbox gone */
    if (act.state != LB_ACT_CLOSED && !act.receipt_json && sandbox_is_lent(a, act.sandbox_id)) {
        spec = act.spec_json ? json_loads(act.spec_json, 0, NULL) : NULL;
        if (timeout_ms <= 0)
            timeout_ms = spec_ms(spec, "close_timeout_ms", 60000);
        log_info("activation %s: stop_harness", act.id);
        r = act_finalize(a, act.sandbox_id, FIN_STOP, timeout_ms, err);
    }
    json_decref(spec);
    store_activation_release(&act);
    if (r < 0)
        return r;
    return activation_get_text(a, rsid, false, text, len, err);
}

void activation_release_hook(void *ctx, const char *rsid, const char *sandbox_id)
{
    struct lb_activations *a = ctx;
    struct lb_activation act = {0};
    struct lb_error err = {0};
    json_t *spec = NULL;
    int r;

    if (store_get_activation_by_sandbox(a->store, sandbox_id, &act, NULL) < 0)
        return;
    if (act.state == LB_ACT_CLOSED)
        goto out;
    spec = act.spec_json ? json_loads(act.spec_json, 0, NULL) : NULL;
    log_info("session %s: closing activation %s before the release", rsid, act.id);
    r = act_finalize(a, sandbox_id, FIN_CLOSE, spec_ms(spec, "close_timeout_ms", 60000), &err);
    if (r < 0) {
        /* The sandbox's stop ends every process of it: the teardown is the authority. */
        log_warn("activation %s: close before the release failed: %s; the stop goes ahead", act.id,
                 err.message);
        act_capture_unavailable(a, &act, spec, "artifact capture unavailable during forced stop");
        (void)store_activation_set_state(a->store, act.id, LB_ACT_CLOSED,
                                         LB_ACT_MASK(LB_ACT_STAGING) | LB_ACT_MASK(LB_ACT_RUNNING) |
                                             LB_ACT_MASK(LB_ACT_CLOSING),
                                         NULL);
        {
            char path[PATH_MAX];

            receipt_path(a, act.id, path, sizeof(path));
            (void)unlink(path); /* the sandbox's stop ends its supervisor */
        }
    }
out:
    json_decref(spec);
    store_activation_release(&act);
}
