/*
 * activation.h - harness activations: NeMo Gym's SandboxSession on a session's lent sandbox.
 *
 * execute stages files, launches the harness under lendbox-supervise's harness mode (which
 * lives inside the sandbox, detached from the exec that started it), waits for the
 * supervisor's receipt or the deadline, collects the listed paths once and returns. close
 * stops the harness (stop request, TERM, KILL, descendant drain), collects once if that has not
 * happened and marks the activation closed. Everything the activation knows is in the store
 * (table activations), so GET .../activation and close work after a daemon restart; the
 * in-sandbox files live in /run/lendbox/<activation id>/ (see src/supervisor/supervise.c).
 *
 * Budget, as NeMo Gym's: one cleanup phase is close_timeout_s / 3 (the supervisor has three:
 * TERM grace, harness reap, descendant drain); execute waits at most timeout_s + 3 x phase +
 * 30 s for the receipt. A close waits for the receipt at most its timeout (default the
 * activation's close_timeout_s) + 5 s; without a confirmed receipt it fails with -EREMOTEIO
 * (502) and the activation stays "closing", so the next close retries.
 *
 * Concurrency: at most one finalization (stop + capture [+ close]) of an activation runs at a
 * time; a close that arrives meanwhile waits for it and shares its outcome, so concurrent
 * closes collect once. Functions block on the provider: call them from pool workers. All
 * functions are thread-safe.
 *
 * Returned JSON objects are new references the caller owns. Errors are negative errnos with
 * the status mapping of util/error.h.
 */
#ifndef LB_ACTIVATION_H
#define LB_ACTIVATION_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lend/lend.h"
#include "store/store.h"

struct lb_activation_config {
    size_t max_artifact_bytes;  /* one collected file; a bigger one is null + capture_error */
    size_t max_artifacts_bytes; /* all files of one capture together */
    size_t max_log_bytes;       /* output log tail kept at capture and served by ?log=1 */
    const char *receipts_dir;   /* host directory (mode 0700, hidden from every sandbox) for the
                                   receipt files <id>.receipt; copied. NULL: execute refuses */
};

struct lb_activations;

/* Make the service over store and lend (both stay the caller's). Errors: -ENOMEM. */
int activations_new(const struct lb_activation_config *cfg, struct lb_store *st,
                    struct lb_lend *lend, struct lb_activations **out, struct lb_error *err);
/* No call may be running. NULL is accepted. */
void activations_free(struct lb_activations *a);

struct lb_execute_request {
    char **argv;                      /* NULL-terminated; argv[0] non-empty */
    const char *cwd;                  /* NULL: the sandbox's workdir */
    json_t *env;                      /* object of strings or NULL; merged over the seed's env */
    const char *user;                 /* NULL or root */
    const struct lb_seed_file *stage; /* written before the launch */
    size_t n_stage;
    char **collect;           /* NULL-terminated absolute, normalised paths */
    int64_t timeout_ms;       /* > 0: the harness's own deadline */
    int64_t close_timeout_ms; /* > 0: three cleanup phases */
    bool nowait; /* "wait": false: return {"activation_id", "state": "running"} once the harness
                  * is launched ("failed" when the launch failed); GET collects later */
    bool *fence_held; /* NULL, or the operate-token fence the caller holds (an operate-token
                         execute: routes_operate_enter), handed to the launch's lend_exec
                         (lb_exec_params.fence_held); what is still held when
                         activation_execute returns is the caller's to leave */
};

/* Run the harness once in the session's lent sandbox and wait for it. *out is the result of
 * API.md ({"activation_id", "state", "return_code", "artifacts", "capture_error", "cleanup",
 * "output_log_bytes", "error"}, plus "output_log_tail" unless finished). Errors: -ENOENT (404)
 * no lent sandbox; -EEXIST (409) the sandbox has an activation already; -EALREADY (409) a
 * close came before the launch; -EBUSY (409) the sandbox is paused; -ESHUTDOWN (503) the
 * daemon is draining (the harness keeps running); -EREMOTEIO (502) the launch failed and its
 * cleanup could not be confirmed, or the harness's cleanup was not confirmed; staging errors
 * as lend_file_write. A client that hangs up does not stop the harness. */
int activation_execute(struct lb_activations *a, const char *rsid,
                       const struct lb_execute_request *req, json_t **out, struct lb_error *err);

/* Close the session's activation (timeout_ms <= 0: its close_timeout_s). Idempotent: *text
 * (malloc'd, the caller's; *len bytes of compact JSON, the stored artifacts spliced in as
 * activation_get_text does) is {"closed": true, "activation_id", "capture_error", "cleanup",
 * "output_log_bytes", "artifacts"}, the same for every close; {"closed": false} when the
 * session has no activation. own: NULL for the session's activation, whichever it is now; an
 * operate token's request passes the one it was let act on (activation_id_of; "" for none),
 * and is -ENOKEY (401, as the revoked token) when the session's is another by then (a reset
 * came between). -EREMOTEIO (502) when cleanup cannot be confirmed (the activation stays
 * "closing"), -EBUSY (409) when the sandbox is paused, -ENOMEM. */
int activation_close(struct lb_activations *a, const char *rsid, const char *own,
                     int64_t timeout_ms, char **text, size_t *len, struct lb_error *err);

/* The session's activation (of its lent sandbox, else its newest one) as compact JSON text
 * (*text malloc'd, the caller's; *len bytes): state, receipt, artifacts, stop_request_path,
 * wait; with_log adds "log" (the output log's tail as text) and "log_truncated". Never waits
 * for the harness (a long-poll parks with activation_watch_*). An activation started with
 * nowait whose confirmed receipt is found here has its artifacts collected here (once). The
 * stored artifacts are not parsed: their stored text is copied in as the last member, so the
 * peak is about twice their size instead of four times. own as activation_close's (-ENOKEY).
 * -ENOENT when there is none, -ENOMEM. */
int activation_get_text(struct lb_activations *a, const char *rsid, const char *own, bool with_log,
                        char **text, size_t *len, struct lb_error *err);

/* What rendering the session's activation costs at most, in bytes (upper bound: its stored
 * texts loaded and copied, the log's tail escaped, the rest), without loading it: to reserve
 * before rendering. A store read; thread-safe. Errors: -EIO. */
int activation_answer_bytes(struct lb_activations *a, const char *rsid, bool with_log,
                            uint64_t *bytes, struct lb_error *err);

/* Open the output log of the session's activation (of its lent sandbox) for following: *fd
 * (the caller's, read-only, the file as it grows) is the harness's combined stdout and
 * stderr. Blocks on the provider briefly (a worker's job). -ENOENT (404): no activation, or
 * it is closed or its sandbox stopped (the record keeps the log's tail), or no log yet; own as
 * activation_close's (-ENOKEY). */
int activation_open_log(struct lb_activations *a, const char *rsid, const char *own, int *fd,
                        struct lb_error *err);

/* The id of the session's activation (of its lent sandbox, else its newest) into id (size
 * bytes; LB_ID_MAX fits any), "" when it has none: what an operate token's request holds as
 * its own while the sandbox's fence keeps a reset off (routes), to act on that one only. 0,
 * or -EIO (store). Thread-safe. */
int activation_id_of(struct lb_activations *a, const char *rsid, char *id, size_t size,
                     struct lb_error *err);

/* A long-poll's watch on the session's activation, for waiting without a worker (the route
 * parks the request and polls activation_watch_changed). */
struct lb_activation_watch;

/* Snapshot the session's activation (as activation_get_text finds it). *out (the caller's, freed
 * with activation_watch_free) is NULL when there is nothing to wait for: the harness has ended,
 * or the daemon drains; then answer at once. Reads the store and the receipt file; never waits
 * on a provider. Errors as activation_get_text (-ENOENT: no activation; own as
 * activation_close's, -ENOKEY). Thread-safe. */
int activation_watch_begin(struct lb_activations *a, const char *rsid, const char *own,
                           struct lb_activation_watch **out, struct lb_error *err);
/* True once the harness ended (receipt), the record's state changed, another activation took
 * its place, the sandbox stopped or the daemon drains. Quick (a store read and a receipt
 * file read); any thread, one caller per watch at a time. */
bool activation_watch_changed(struct lb_activation_watch *w);
/* NULL-safe. */
void activation_watch_free(struct lb_activation_watch *w);

/* NeMo Gym's stop_harness: unless the receipt is held (or the activation is closed, or its
 * sandbox stopped), stop the harness (stop request, TERM, KILL, drain; a harness not launched
 * yet never will be) and wait for its confirmed receipt within timeout_ms (<= 0: the
 * activation's close_timeout_s) + 5 s. No capture, no close. *text (*len bytes, the
 * caller's) is activation_get_text's (without log). -ENOENT (404) no activation, -EREMOTEIO
 * (502) cleanup unconfirmed, -EBUSY (409) another finalization still running past its budget,
 * -ENOMEM; own as activation_close's (-ENOKEY). */
int activation_stop_harness(struct lb_activations *a, const char *rsid, const char *own,
                            int64_t timeout_ms, char **text, size_t *len, struct lb_error *err);

/* lend's release hook (ctx is the struct lb_activations): close the sandbox's activation
 * before the sandbox is stopped; when that fails the activation is recorded closed anyway
 * (the stop ends every process). */
void activation_release_hook(void *ctx, const char *rsid, const char *sandbox_id);

#endif
