/*
 * activation_internal.h - what the activation service's files share, and nothing else includes:
 * activation.c (service, lookups, close/get/release, watch), execute.c, capture.c (stop,
 * capture, finalization), receipt.c (receipts and in-sandbox paths) and render.c (answers).
 *
 * Every function here takes the service (or a record) the caller holds, follows the error
 * convention of activation.h (0 or a negative errno, detail in err when err is not NULL) and is
 * thread-safe unless it says otherwise. Functions that read the sandbox block on the provider.
 */
#ifndef LB_ACTIVATION_INTERNAL_H
#define LB_ACTIVATION_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uthash.h>

#include "activation/activation.h"
#include "lend/lend_internal.h"

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

/* ---------- activation.c: lookups ---------- */

/* Re-read the activation of a sandbox into *act (released first; sandbox_id may point into
 * *act). Errors of store_get_activation_by_sandbox. */
int act_reload(struct lb_activations *a, const char *sandbox_id, struct lb_activation *act,
               struct lb_error *err);
/* Re-read *act (its sandbox's activation) by its id: -ENOENT (nothing read) when the
 * sandbox's activation is another now or none (a reset removed act's). */
int act_reload_own(struct lb_activations *a, struct lb_activation *act, struct lb_error *err);

/* ---------- receipt.c: receipts and in-sandbox paths ---------- */

/* <ACT_DIR_PARENT>/<activation id>/<name> into buf (size bytes, truncated). */
void act_path(char *buf, size_t size, const struct lb_activation *act, const char *name);
/* Read path inside the sandbox: all of it (-EFBIG past max, with *size set), or with tail the
 * last max bytes. *data (malloc'd, the caller's) is NUL-terminated, *len bytes; *size is the
 * file's size. Errors of lend_file_open, -EIO, -ENOMEM. */
int act_sandbox_read(struct lb_activations *a, const char *sandbox_id, const char *path, size_t max,
                     bool tail, unsigned char **data, size_t *len, uint64_t *size,
                     struct lb_error *err);
/* The activation's receipt file on the host, <receipts_dir>/<id>.receipt, into buf. */
void act_receipt_path(const struct lb_activations *a, const char *act_id, char *buf, size_t size);
/* Create the (empty) receipt file of a new activation: the fd (O_RDWR, the caller's) or
 * -errno (-ENOSYS: no receipts_dir). */
int act_receipt_create(const struct lb_activations *a, const char *act_id);
/* The host-side launch mark, <receipts_dir>/<id>.launch: made (on, fsync'd) by execute_launch
 * before it sends the launch exec, removed when the launcher certainly took no claim (the exec
 * refused before it ran, the launcher not found or not executable, or it exited 5: failed
 * before claiming, a bad cwd included) and when the activation's receipt file goes. 0 or -errno. A
 * stop whose claim says "fenced" is taken only while there is none (a sandbox process can rewrite
 * the claim after a real launch). */
int act_launch_mark(const struct lb_activations *a, const char *act_id, bool on);
/* Is there a launch mark (or one that cannot be looked at)? */
bool act_launch_began(const struct lb_activations *a, const char *act_id);
/* Remove the activation's receipt file and launch mark (missing ones are fine): once its
 * outcome is in the record, or the sandbox's stop ends its supervisor. */
void act_receipt_remove(const struct lb_activations *a, const char *act_id);
/* Write the daemon's own receipt for a harness never launched (error: its reason, or NULL),
 * only while the file is empty or missing. Failures are logged. */
void act_receipt_write_unlaunched(const struct lb_activations *a, const char *act_id,
                                  const char *error);
/* The harness supervisor's receipt: 0 and *out (an object, the caller's), -ENOENT while there
 * is none or it is incomplete, -EIO when it cannot be parsed, -ENOMEM. The host-side file first;
 * the in-sandbox file only for an activation whose spec names a "receipt_file". */
int act_read_receipt(struct lb_activations *a, const struct lb_activation *act, json_t **out,
                     struct lb_error *err);
/* Does the receipt confirm the harness's cleanup? NULL: no. */
bool act_receipt_confirmed(const json_t *receipt);

/* ---------- capture.c: stop, capture, finalization ---------- */

/* Is the sandbox paused (asks the provider)? */
bool act_sandbox_is_paused(struct lb_activations *a, const char *sandbox_id);
/* Resume the activation's sandbox if it is paused (why: for the log). 0 (not paused, or
 * resumed) or -EREMOTEIO when the resume failed. */
int act_resume_paused(struct lb_activations *a, const struct lb_activation *act, const char *why,
                      struct lb_error *err);
/* Store a receipt read from the file, with its out-of-memory verdict ("oom_message"). 0 or an
 * error of the store. */
int act_record_receipt(struct lb_activations *a, const struct lb_activation *act, json_t *receipt,
                       struct lb_error *err);
/* Record a capture that could not happen (why: its capture_error), unless one exists. */
void act_capture_unavailable(struct lb_activations *a, const struct lb_activation *act,
                             json_t *spec, const char *why);
/* Run a finalization of the sandbox's activation in mode (budget_ms: its close timeout), or
 * join the one running. act_id: NULL, or the activation the caller means (its execute): when
 * the sandbox's activation is another by then (a reset removed it), nothing is done and the
 * answer is -ENOENT. 0, -EREMOTEIO (cleanup unconfirmed), -EBUSY (the running one is past its
 * budget), -ENOENT (FIN_EXECUTE: the sandbox was stopped; or act_id's is gone), errors of the
 * store, -ENOMEM. */
int act_finalize(struct lb_activations *a, const char *sandbox_id, const char *act_id,
                 enum fin_mode mode, int64_t budget_ms, struct lb_error *err);

/* ---------- render.c: answers ---------- */

/* Valid UTF-8 text of len bytes (invalid sequences become U+FFFD); NULL out of memory. */
json_t *act_json_text(const void *data, size_t len);
/* The execute result of API.md from the record (why_override: a failure reason that overrides
 * the receipt's). A new reference; NULL out of memory. */
json_t *act_render_result(const struct lb_activation *act, const char *why_override);
/* The close result of API.md from the record. A new reference; NULL out of memory. */
json_t *act_render_close(const struct lb_activation *act);
/* res as compact JSON text (*text malloc'd, the caller's; *len bytes), with raw (stored JSON
 * text, taken and freed; NULL: none) spliced in as its last member "artifacts", unparsed.
 * -ENOMEM. */
int act_render_text(const json_t *res, char *raw, char **text, size_t *len, struct lb_error *err);

#endif
