/*
 * lxd_internal.h - what lxd.c, lxd_exec.c, lxd_files.c, lxd_image.c and their base lxd_api.c
 * (the API transport) share. Not a public interface.
 */
#ifndef LB_LXD_INTERNAL_H
#define LB_LXD_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "provider/engine/engine.h"
#include "provider/engine/httpc.h"
#include "provider/lxd/lxd.h"
#include "util/idslots.h"

#define LXD_LABEL_INSTANCE "user.lendbox.instance"
#define LXD_LABEL_SANDBOX "user.lendbox.sandbox"
/* on the stopped instance that holds a snapshot's root: this daemon's instance label value */
#define LXD_LABEL_SNAPSHOT "user.lendbox.snapshot"
#define LXD_SUPERVISE_DIR "/run/lendbox"
#define LXD_SUPERVISE_PATH "/run/lendbox/supervise"
#define LXD_MAX_DOWNLOAD_BYTES (UINT64_C(1) << 30) /* file_open spools at most this */

/* lxd_cleanup.c: exec logs deleted after the exec answered */
#define LXD_CLEANUP_JOBS 256
struct lxd_cleanup_job {
    char member[128]; /* "": none named */
    char path[256];   /* the log's API path */
};
struct lxd_cleanup {
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* a job came, or stopping */
    pthread_cond_t idle; /* the queue ran empty (CLOCK_MONOTONIC) */
    pthread_t thread;
    bool inited, running, stopping, busy;
    size_t head, len;
    struct lxd_cleanup_job jobs[LXD_CLEANUP_JOBS];
};

struct lb_lxd {
    struct lb_engine eng;    /* first: the provider, the engine base and its settings */
    int64_t call_timeout_ms; /* lxd.call_timeout_s: bound on each API call */
    char *url, *target;      /* lxd.url (NULL: eng.socket), lxd.target (NULL: the cluster's) */
    char pool[128];          /* the root pool of new instances (the default profile's) */
    bool pool_has_quota;     /* its driver bounds a root device's size (not "dir") */
    bool clustered;          /* the server is a cluster member */
    char member[128];        /* its name in the cluster (GET /1.0 server_name); "" if none */
    void *supervise_data;    /* the supervisor binary, pushed into each instance */
    size_t supervise_len;
    char *supervise_host;       /* lxd.supervise_host_path: bound into each instance instead */
    struct lb_idslots idmap;    /* the instances' id slots (lxd_idmap.c) */
    bool idmap_ready;           /* idmap was set up (release it) */
    struct lxd_cleanup cleanup; /* lxd_cleanup.c */
};

/* ---- lxd_cleanup.c: exec logs deleted after the exec answered ---- */
/* Start the cleanup thread. 0, or pthread_create's error (negative). Call once, before any
 * exec. */
int lxd_cleanup_start(struct lb_lxd *l, struct lb_error *err);
/* Queue the DELETE of an exec's recorded log (its API path, on member; NULL: "-"); deleted at
 * once in the caller when the queue is full, the path too long or the thread not running.
 * Best effort either way: a log left behind goes with its instance. Thread-safe. */
void lxd_cleanup_log(struct lb_lxd *l, const char *member, const char *log_path);
/* DELETE one log now (best effort). Thread-safe. */
void lxd_delete_log(struct lb_lxd *l, const char *member, const char *log_path);
/* Wait up to timeout_ms until every queued log is deleted: 0, or -ETIMEDOUT. Thread-safe. */
int lxd_cleanup_settle(struct lb_lxd *l, int64_t timeout_ms);
/* Settle (one call timeout at most), then end the thread; queued logs left are dropped. Safe
 * on a provider whose thread never started. Not concurrent with lxd_cleanup_log. */
void lxd_cleanup_stop(struct lb_lxd *l);

/* ---- lxd_idmap.c: the instances' id ranges ---- */
/* Set up l->idmap for base/count (lxd.idmap_base / idmap_count; 0: root's range in this
 * host's /etc/subuid and /etc/subgid, less its first 65536 ids, in whole slots) claimed as
 * state_dir's. 0, -EINVAL (a bad range, or none found) or idslots_init's errors. */
int lxd_idmap_init(struct lb_lxd *l, int64_t base, int64_t count, const char *state_dir,
                   struct lb_error *err);
/* The first host id of an instance's id range from its config (security.idmap.base, else
 * volatile.idmap.base, which LXD sets at start); 0 when neither says. */
uint32_t lxd_idmap_of_config(const json_t *config);
/* Mark (an instance found) / give back (its instance removed) the slot or two slots that the
 * 65536 ids from id_base cover (id_base need not be slot-aligned: a range LXD chose). 0 is
 * none. */
void lxd_idmap_mark(struct lb_lxd *l, uint32_t id_base);
void lxd_idmap_free(struct lb_lxd *l, uint32_t id_base);
/* The descriptor's id_base (0 when absent). */
uint32_t lxd_idmap_of_descriptor(const json_t *desc);

/* The member a sandbox's calls are counted under: the descriptor's location, or "-". */
const char *lxd_member_of(const struct lb_sandbox_ref *ref);

/* One API request with a small JSON body (or none) and a buffered answer (at most 4 MiB),
 * bounded by timeout_ms (<= 0: lxd.call_timeout_s), counted for member (NULL: "-"): a failure
 * is a transport error or a 5xx. 0 when an answer came (any status), else -EREMOTEIO (server
 * unreachable) or -ETIMEDOUT. */
int lxd_call(struct lb_lxd *l, const char *member, const char *method, const char *path,
             const json_t *body, int64_t timeout_ms, struct lb_httpc_response *resp,
             struct lb_error *err);

/* Any request (files, logs) through httpc_do, counted for member like lxd_call; transport
 * failures as -EREMOTEIO / -ETIMEDOUT / -ECANCELED / -EFBIG or a sink's errno. */
int lxd_do(struct lb_lxd *l, const char *member, const struct lb_httpc_request *req,
           struct lb_httpc_response *resp, struct lb_error *err);

/* An async call (POST/PUT/DELETE answering 202 with an operation) awaited up to timeout_ms.
 * 0 when the operation succeeded (*op_out: a new reference to the operation object's
 * "metadata", or NULL when not wanted), -ENOENT on 404, -EREMOTEIO naming LXD's error (the
 * operation's "err" into err), -ETIMEDOUT. */
int lxd_async(struct lb_lxd *l, const char *member, const char *method, const char *path,
              const json_t *body, int64_t timeout_ms, json_t **op_out, struct lb_error *err);

/* Await the operation op (its path, as an async answer's "operation" names it) up to
 * timeout_ms: as lxd_async after its request. */
int lxd_wait_operation(struct lb_lxd *l, const char *member, const char *op, int64_t timeout_ms,
                       json_t **op_out, struct lb_error *err);

/* GET the instances (recursion=1) LXD finds with config.<label> equal to value (LXD's filter:
 * the caller checks what it needs again). *out is the whole answer (a new reference, NULL on
 * failure); what names the list in errors. -ENOMEM, or engine_get_json's errors (but a 404 is
 * -EREMOTEIO: LXD always has the list). */
int lxd_list_labelled(struct lb_engine *e, const char *label, const char *value, const char *what,
                      json_t **out, struct lb_error *err);

/* The path waiting secs seconds for the operation op ("/1.0/operations/ID[?query]"). */
void lxd_wait_path(const char *op, int64_t secs, char *buf, size_t size);

/* An LXD answer that is not what was wanted as an error: 404 -ENOENT, else -EREMOTEIO; what
 * names the request in the message. */
int lxd_answer_error(const struct lb_httpc_response *resp, const char *what, struct lb_error *err);

/* The instance's status (404: LB_STATUS_STOPPED). */
int lxd_state(struct lb_lxd *l, const struct lb_sandbox_ref *ref, enum lb_sandbox_status *out,
              struct lb_error *err);

/* Write len bytes (from data, or from fd at its current offset when fd >= 0) as the file at
 * the absolute path of instance id, mode (< 0: 0644), owned by the instance's root, parents
 * made. */
int lxd_put_file(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *path, int fd,
                 const void *data, uint64_t len, int mode, struct lb_error *err);
/* "/1.0/instances/<id>/files?path=<escaped path>" into buf (size bytes). 0, or -ENOMEM /
 * -EINVAL (too long) with err set. */
int lxd_files_url(const char *id, const char *path, char *buf, size_t size, struct lb_error *err);
/* POST req (its body and timeout_ms set by the caller; the rest set here) to the files endpoint
 * of path in ref's instance: a type ("file", "directory", "symlink") owned by root with mode's
 * permission bits (mode & 07777), replacing what is there when overwrite is true. Returns
 * lxd_files_url's error or lxd_do's return; the answer into *resp (the caller releases it). */
int lxd_files_post(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *path,
                   const char *type, unsigned mode, bool overwrite, struct lb_httpc_request *req,
                   struct lb_httpc_response *resp, struct lb_error *err);
/* Make the directory path and its parents in the instance (existing ones are fine). */
int lxd_make_dirs(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *path,
                  struct lb_error *err);
/* The same for a directory whose parents most likely exist (a create's, under the instance's
 * own mounts): one request for the directory itself, the walk of lxd_make_dirs only when LXD
 * answers that a parent is missing. */
int lxd_make_dir_likely(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *path,
                        struct lb_error *err);

/* The instance named id: its location (the member) into location, the first host id of its
 * id range into *id_base (when not NULL; 0 when its config names none), and whether it
 * carries this daemon's sandbox labels. 0, -ENOENT, or -EREMOTEIO (an LXD failure, or an
 * instance that is not ours). */
int lxd_find_own(struct lb_lxd *l, const char *id, char *location, size_t loc_size,
                 uint32_t *id_base, struct lb_error *err);
/* Stop (force) and delete instance id (on member: counted there), within timeout_ms. 0 also
 * when it is gone (404). While LXD runs another operation on it ("is busy running"): with
 * wait_busy, tried again every 250 ms within timeout_ms (then -EREMOTEIO); without, -EBUSY at
 * once. Else -ETIMEDOUT, or -EREMOTEIO with LXD's reason. */
int lxd_remove_instance(struct lb_lxd *l, const char *id, const char *member, int64_t timeout_ms,
                        bool wait_busy, struct lb_error *err);

/* The engine hooks of snapshots (lxd_snapshot.c; see engine.h): commit copies the frozen
 * instance into a new stopped instance of this daemon (a snapshot's "image" is its name),
 * snapshot_images lists those, image_remove deletes one. */
int lxd_commit(struct lb_engine *e, const struct lb_sandbox_ref *ref, char *image, size_t size,
               struct lb_error *err);
int lxd_snapshot_images(struct lb_engine *e, json_t **out, struct lb_error *err);
int lxd_image_remove(struct lb_engine *e, const char *image, struct lb_error *err);
/* Where a snapshot's instance name is (its cluster member, "" when LXD names none) into
 * location. 0; -LB_E_IMAGE_NOT_FOUND when no such instance of this daemon's snapshots exists;
 * -EREMOTEIO / -ETIMEDOUT. */
int lxd_snapshot_location(struct lb_lxd *l, const char *name, char *location, size_t size,
                          struct lb_error *err);

/* The engine hooks of exec (lxd_exec.c; see engine.h). */
int lxd_exec_check(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                   const struct lb_exec_request *req, struct lb_error *err);
int lxd_exec_run(struct lb_engine *e, const struct lb_sandbox_ref *ref, struct engine_exec *x,
                 struct lb_error *err);
/* The archive hooks of the engine base (lxd_archive.c; see engine.h). */
int lxd_archive_put(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *dir, int fd,
                    uint64_t len, const struct engine_archive_tops *tops, struct lb_error *err);
int lxd_archive_get(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *dir,
                    struct lb_tar_out *w, struct lb_error *err);

/* The engine's file_open hook (lxd_files.c). */
int lxd_file_open(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *path,
                  int *fd_out, uint64_t *size_out, struct lb_error *err);

#endif
