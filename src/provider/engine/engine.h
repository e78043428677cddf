/*
 * engine.h - the engine base: what the providers that drive a container engine over its API
 * (docker/, lxd/) share, written once. A backend embeds struct lb_engine first in its own
 * struct, points its ops table at the engine_* drivers below and fills struct engine_hooks
 * with what differs between engines (the requests themselves). The drivers hold the rules:
 * "no such sandbox" on a missing instance, pause/resume that are idempotent, the label check
 * of a listing, exec admission and its end at shutdown.
 *
 * Dependency rule: engine/ calls only its hooks, provider.h, gate.h, exec_result.h, util/ and
 * the image store's engine snapshots (image.h); it never names a backend.
 *
 * Thread-safety: the drivers are as thread-safe as the provider interface asks (provider.h):
 * any thread, at once, as long as the hooks are.
 */
#ifndef LB_PROVIDER_ENGINE_H
#define LB_PROVIDER_ENGINE_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/types.h>

#include "provider/engine/engine_config.h"
#include "provider/engine/framed.h"
#include "provider/gate.h"
#include "provider/provider.h"
#include "provider/tar_out.h"

struct archive;
struct archive_entry;
struct lb_engine;
struct lb_httpc;
struct lb_httpc_response;

/* The instance a create makes or adopts, as the create hooks fill it in turn. */
struct engine_instance {
    char name[256];     /* the engine's name of it (docker: lendbox-<instance>-<id>; lxd: id) */
    char handle[128];   /* what the descriptor keeps besides (docker: container id; lxd: the
                           cluster member it is on); "" until known */
    bool from_snapshot; /* set before make: the image make gets is a reference commit gave
                           (a snapshot this backend made), not one of the engine's own */
    uint32_t id_base;   /* lxd: the first host id of the instance's own id range (its slot,
                           taken by prepare); 0: none */
    bool maybe_made;    /* set by a make that failed after the engine took the request (its
                           operation's wait failed): the instance may exist all the same, and
                           rollback must remove it before it gives anything it holds back */
};

/* One exec on its way through engine_exec and the backend's exec_run hook. */
struct engine_exec {
    const struct lb_exec_request *req;
    struct lb_exec_result *res;
    struct lb_framed_reader fr; /* feed the supervisor's stdout (its frames) here */
    struct lb_buf diag;         /* the exec's own stderr: the engine's or the supervisor's */
    json_t *cmd;                /* the supervisor and its options; engine_exec_command ends it */
    bool done;      /* exec_run set the result itself (exec_result_set_runtime): no frames */
    bool transport; /* exec_run's error came after the start: look whether the sandbox is gone */
    bool started;   /* engine_exec_started was called */
};

/* exec_run's hook tells the base that the exec is bound to the instance as it runs now (docker:
 * the exec made in the container, whose id a container made again under the same name does
 * not have; lxd: the exec operation running in the instance), so a reset or stop from now on
 * ends it: the request's on_started, once. On the exec's thread. */
void engine_exec_started(struct engine_exec *x);

#define ENGINE_ARCHIVE_MAX_TOPS 4096 /* first components kept for a rollback */

/* The distinct first components of an archive's names (engine_archive_put to the archive_put
 * hook); overflow: there were more than ENGINE_ARCHIVE_MAX_TOPS (the rest are not listed). */
struct engine_archive_tops {
    char **names;
    size_t n;
    bool overflow;
};
void engine_archive_tops_free(struct engine_archive_tops *t);

/* An archive on its way out (engine_archive_get to the archive_get hook) is a struct
 * lb_tar_out (provider/tar_out.h): the hook writes its entries with tar_out_write_header /
 * tar_out_write_data. */

struct engine_hooks {
    const char *name; /* "docker", "lxd": messages, config keys, the fault point <name>.created */
    const char *noun; /* "container", "instance": in messages */
    /* Create, in this order (engine_create): prepare (may be NULL: refuse a spec the backend
     * cannot honour, -EOPNOTSUPP; make what the instance needs on the host), make the instance
     * of image (0; -EEXIST when one of that name exists already; -LB_E_IMAGE_NOT_FOUND; else
     * a negative errno), or on -EEXIST find_own (0 when the existing one carries this
     * daemon's labels, and adopt it), start it (0 also when already running), finish
     * (anything the backend does once it runs; a new descriptor into *out). On failure after
     * prepare, rollback (made: remove the instance; else undo prepare), never failing. All
     * but rollback return 0 or a negative errno with err set; timeout_ms bounds each. */
    int (*prepare)(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                   const struct lb_sandbox_spec *spec, struct engine_instance *inst,
                   struct lb_error *err);
    int (*make)(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                const struct lb_sandbox_spec *spec, const char *image, int64_t timeout_ms,
                struct engine_instance *inst, struct lb_error *err);
    int (*find_own)(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                    struct engine_instance *inst, struct lb_error *err);
    int (*start)(struct lb_engine *e, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                 struct engine_instance *inst, struct lb_error *err);
    int (*finish)(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                  const struct lb_sandbox_spec *spec, struct engine_instance *inst, json_t **out,
                  struct lb_error *err);
    void (*rollback)(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                     const struct engine_instance *inst, bool made);

    /* Put one regular file (len bytes from fd at its offset 0, or from data when fd < 0) at
     * the absolute path inside the instance, parents made; mode < 0: 0644. 0, -ENOENT (no such
     * sandbox) or a negative errno with err set. */
    int (*put_file)(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *path, int fd,
                    const void *data, uint64_t len, int mode, struct lb_error *err);
    /* Exec: exec_check (may be NULL) refuses what the backend cannot run, before admission.
     * exec_run adds its own options to x->cmd, takes the whole command from
     * engine_exec_command(x), runs it and feeds the supervisor's stdout to x->fr (its own
     * stderr to x->diag). 0 when the run ended (x->done when it set the result itself, e.g.
     * an instance that cannot run commands); -ECANCELED when gates.ended cut it short; else a
     * negative errno with err set (-ENOENT "no such sandbox", -EBUSY "sandbox 'X' is paused"
     * as they are; x->transport when the failure came after the start). */
    int (*exec_check)(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                      const struct lb_exec_request *req, struct lb_error *err);
    int (*exec_run)(struct lb_engine *e, const struct lb_sandbox_ref *ref, struct engine_exec *x,
                    struct lb_error *err);
    const char *engine_label; /* "the engine", "LXD": "no output from <label>" */
    /* The instance's state: LB_STATUS_STOPPED when the engine has no such instance. 0, or a
     * negative errno (-EREMOTEIO, -ETIMEDOUT) with err set when err is not NULL. */
    int (*state)(struct lb_engine *e, const struct lb_sandbox_ref *ref, enum lb_sandbox_status *out,
                 struct lb_error *err);
    /* Ask the engine to pause (frozen) or resume the instance. 0 when it did; -ENOENT when it
     * has no such instance; -ETIMEDOUT; any other negative errno when it refused or could
     * not be asked (the driver then checks whether the instance is already so). err says
     * why. */
    int (*set_frozen)(struct lb_engine *e, const struct lb_sandbox_ref *ref, bool frozen,
                      struct lb_error *err);
    /* Every instance the engine lists under this daemon's instance label (the engine's own
     * filter), as a JSON array the caller owns. 0 or a negative errno with err set. */
    int (*list_raw)(struct lb_engine *e, json_t **items_out, struct lb_error *err);
    /* One item of list_raw: when it is a sandbox of this daemon (the labels checked again,
     * not trusting the engine's filter), its id into *id_out (borrowed from item) and a new
     * descriptor (the caller owns it); NULL when it is not ours (or out of memory). */
    json_t *(*list_entry)(struct lb_engine *e, json_t *item, const char **id_out);

    /* The backend's transport, for engine_get_json: call sends one request with a small
     * JSON body (or none) and buffers the answer (any status); timeout_ms <= 0: the
     * backend's default. 0, or -EREMOTEIO / -ETIMEDOUT with err set. answer_error words an
     * answer that is not the one wanted (what names the request): 404 -ENOENT, else
     * -EREMOTEIO. */
    int (*call)(struct lb_engine *e, const char *method, const char *path, const json_t *body,
                int64_t timeout_ms, struct lb_httpc_response *resp, struct lb_error *err);
    int (*answer_error)(const struct lb_httpc_response *resp, const char *what,
                        struct lb_error *err);

    /* The provider's ops that stay the backend's own (engine_init's ops table calls them; see
     * provider.h for their contracts). caps adjusts what engine_caps filled in: what this
     * backend honours beyond, or not, of what both do. remove stops and removes the sandbox's
     * instance (engine_stop gives a positive timeout_ms). file_open gets a valid path. release
     * (may be NULL) frees what the backend holds besides the engine base; the engine frees the
     * struct itself. */
    void (*caps)(struct lb_engine *e, struct lb_provider_caps *out);
    int (*remove)(struct lb_engine *e, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                  struct lb_error *err);
    int (*file_open)(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *path,
                     int *fd_out, uint64_t *size_out, struct lb_error *err);
    void (*release)(struct lb_engine *e);

    /* Snapshots (engine_snapshot.c); a backend without commit has none (NULL, the caps op
     * leaves snapshot false). workdir_archive writes the running instance's workdir as a tar
     * archive (its entries under the workdir's own name) to fd and its path into workdir; NULL
     * (then put_archive is NULL too) when the workdir is part of the instance's root, which
     * commit carries whole (lxd). commit makes an engine image of the instance's root as it is
     * (the instance frozen by the caller, or paused) carrying this daemon's instance label and
     * puts its reference into image. put_archive extracts a tar archive read from fd (at its
     * offset 0) at dir inside the running instance. snapshot_images lists the references of
     * every engine image commit made for this daemon (a JSON array of strings, the caller's).
     * image_remove removes one: 0, -ENOENT (none), -EBUSY (an instance or an image stands on
     * it). Each returns 0 or a negative errno with err set. */
    int (*workdir_archive)(struct lb_engine *e, const struct lb_sandbox_ref *ref, int fd,
                           char *workdir, size_t size, struct lb_error *err);
    int (*commit)(struct lb_engine *e, const struct lb_sandbox_ref *ref, char *image, size_t size,
                  struct lb_error *err);
    int (*put_archive)(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *dir,
                       int fd, struct lb_error *err);
    int (*snapshot_images)(struct lb_engine *e, json_t **out, struct lb_error *err);
    int (*image_remove)(struct lb_engine *e, const char *image, struct lb_error *err);

    /* Directory transfer (engine_archive.c); both NULL: the provider has no archive ops.
     * archive_put extracts a checked archive (engine_archive_put made it: a pax tar of len
     * bytes read from fd at its offset 0, names normalised and relative to dir, owners 0, only
     * directories, regular files, symlinks that stay inside dir and hard links to an earlier
     * regular file) into dir inside the running instance, dir made with its missing parents
     * when missing. tops names the archive's distinct first components (what a failure part
     * way removes again). 0, -ENOTDIR (dir is not a directory), -ENOENT (no such sandbox),
     * -EFBIG (no room in the instance), -EBUSY (paused), else a negative errno; err set.
     * archive_get hands dir's tree to w (tar_out_write_header / _data), names relative to
     * dir ("a", "sub/", "sub/b"); 0, -ENOENT (no such dir), -ENOTDIR, -EFBIG (w's bounds),
     * else a negative errno; err set. */
    int (*archive_put)(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *dir,
                       int fd, uint64_t len, const struct engine_archive_tops *tops,
                       struct lb_error *err);
    int (*archive_get)(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *dir,
                       struct lb_tar_out *w, struct lb_error *err);

    /* What the running (or paused) instance uses now, from one request to the engine (its
     * usual timeout): each figure the engine gives into *out, which engine_usage filled with
     * -1 first; a figure it does not give stays -1. May be NULL (the usage op then answers
     * -ENOSYS). 0, or -ENOENT (no such instance), -ETIMEDOUT or -EREMOTEIO (an engine failure,
     * an answer that is not the one wanted) with err set. */
    int (*usage)(struct lb_engine *e, const struct lb_sandbox_ref *ref, struct lb_usage *out,
                 struct lb_error *err);
};

/* The members of a backend's struct engine_hooks that every backend fills from functions of
 * the same name, for a backend that names its hooks hook_<member> (static in its own file):
 * prepare, make, find_own, start, finish, rollback, state, set_frozen, list_raw, list_entry,
 * put_file, caps, remove, file_open and release. The backend adds name, noun, engine_label,
 * exec_check and exec_run. */
#define ENGINE_HOOKS_BY_NAME                                                                       \
    .prepare = hook_prepare, .make = hook_make, .find_own = hook_find_own, .start = hook_start,    \
    .finish = hook_finish, .rollback = hook_rollback, .state = hook_state,                         \
    .set_frozen = hook_set_frozen, .list_raw = hook_list_raw, .list_entry = hook_list_entry,       \
    .put_file = hook_put_file, .caps = hook_caps, .remove = hook_remove,                           \
    .file_open = hook_file_open, .release = hook_release

/* Embedded first in a backend's provider struct (struct lb_docker, struct lb_lxd). The
 * strings and http are the engine's: engine_setup makes the strings, the backend the client;
 * engine_release frees them all. */
struct lb_engine {
    struct lb_provider base;    /* base.ops points at ops */
    struct lb_provider_ops ops; /* the engine's drivers under the backend's name */
    const struct engine_hooks *hooks;
    struct lb_gates gates;        /* exec admission; gates.ended: end_execs was called */
    char *socket;                 /* NULL: none */
    char *default_image;          /* NULL: a seed must name one */
    char *supervise_path;         /* the supervisor on the host */
    char *net_inherit;            /* [network] inherit */
    char *spool_dir;              /* uploads and downloads spool here (absolute) */
    char *images_dir;             /* the daemon's image store (snapshots); NULL: none */
    char instance[64];            /* this daemon's instance label value */
    struct lb_httpc *http;        /* the engine's API client */
    const char *supervise_inside; /* the supervisor inside an instance (static string) */
    int64_t create_timeout_ms;    /* bound of each step of a create */
    bool ready_timeout;           /* a spec's ready_timeout_ms, when set, bounds a create instead */
    int create_concurrency;       /* at most this many instances made and started at once
                                   * (0: no bound): create_mutex, create_cond, create_running */
    int create_running;
    pthread_mutex_t create_mutex;
    pthread_cond_t create_cond;
};

/* Set up the base: hooks (static, borrowed) and the ops table of the engine's drivers under
 * hooks->name, the rest zeroed but the mutex. The backend then calls engine_setup (or sets the
 * strings itself, malloc'd) and sets supervise_inside, create_timeout_ms, ready_timeout and
 * create_concurrency. Pair with engine_release (the provider's destroy op does). */
void engine_init(struct lb_engine *e, const struct engine_hooks *hooks);

/* Copy what c names into e (socket, default_image, supervise_path, net_inherit, instance: the
 * label engine_instance_label gives) and make the spool dir <state_dir>/<name>-spool (0700).
 * 0, -ENOMEM, or the errno of mkdir with err set; what was copied is freed by engine_release. */
int engine_setup(struct lb_engine *e, const struct engine_config *c, struct lb_error *err);

/* Allocate a backend's struct of size bytes (struct lb_engine first in it), engine_init it
 * with hooks and engine_setup it with c, after libcurl's process-wide set-up. On success
 * *out is the new base (the backend sets the rest; on a later failure it destroys it with
 * its ops' destroy). 0, -EIO (libcurl), -ENOMEM or engine_setup's error, with err set. */
int engine_new(size_t size, const struct engine_hooks *hooks, const struct engine_config *c,
               struct lb_engine **out, struct lb_error *err);

/* The network part of a spec that an instance with no network at all can honour: no access
 * mode but "inherit" (or none), and that only when net_inherit is "none"; no ports. 0, or
 * -EOPNOTSUPP with err naming what cannot be enforced. */
int engine_check_network(const struct lb_engine *e, const struct lb_sandbox_spec *spec,
                         struct lb_error *err);

/* The capabilities every engine backend has: cpu, memory, pids and disk limits, images,
 * pause, loopback-only networking when net_inherit is "none", the default image (borrowed
 * from e); no users, fd passing, receipts or exclusive execs. The caps op is this, then
 * hooks->caps. */
void engine_caps(const struct lb_engine *e, struct lb_provider_caps *out);

/* The value of the instance label that tells this daemon's instances from others on one
 * engine: configured when it is not NULL or "", else the first 12 hex digits of the SHA-256
 * of state_dir (so one state dir keeps its instances across restarts). Into buf (>= 13). */
void engine_instance_label(const char *configured, const char *state_dir, char *buf, size_t size);

/* The create op: a default image when the spec names none (or "host"), the hooks in order
 * (see struct engine_hooks), adopting an instance of that name that is this daemon's (a
 * create retried after a crash), the fault point "<name>.created" between make and start,
 * the instance removed again when a later step fails. Errors: -EINVAL (no image at all),
 * -EOPNOTSUPP and -LB_E_IMAGE_NOT_FOUND as the hooks say, -ETIMEDOUT, else -EREMOTEIO. */
int engine_create(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                  const struct lb_sandbox_spec *spec, json_t **descriptor_out,
                  struct lb_error *err);

/* The exec op: the backend's exec_check, admission (gate.h; after end_execs a runtime result
 * "the daemon is shutting down ..."), stdin put as a file under /tmp the supervisor opens and
 * unlinks, the supervisor's options (framed mode, output cap, timeout, cwd, background,
 * exclusive, stdin file), hooks->exec_run, the status line (exec_result.h). A run without a status:
 * "no such sandbox" when the instance is gone, -EREMOTEIO after a transport failure, else a runtime
 * result "the supervisor ended without a result". */
int engine_exec(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                const struct lb_exec_request *req, struct lb_exec_result *res,
                struct lb_error *err);
/* x->cmd ended with "--" and the request's argv: the command exec_run sends. Borrowed (x owns
 * it); NULL when out of memory. */
json_t *engine_exec_command(struct engine_exec *x);

/* The file_write op: a valid absolute path (not "/"), then hooks->put_file. */
int engine_file_write(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                      const void *data, size_t len, int mode, struct lb_error *err);
/* The upload ops: begin refuses an owner (-EOPNOTSUPP: an instance's files are its root's), a
 * bad path (-EINVAL) and a stopped sandbox (-ENOENT), and hands out an unlinked spool file;
 * commit puts it with hooks->put_file; both commit and abort free the upload. */
int engine_upload_begin(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                        int mode, const char *owner, struct lb_upload **out, struct lb_error *err);
int engine_upload_commit(struct lb_upload *u, struct lb_error *err);
void engine_upload_abort(struct lb_upload *u);
/* path is a valid absolute path other than "/" in a sandbox that is not stopped: 0, or
 * -EINVAL / -ENOENT / the state hook's error with err set. */
int engine_check_target(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *path,
                        struct lb_error *err);
/* An unlinked read-write file (O_TMPFILE) in spool_dir: its fd, or a negative errno. */
int engine_spool_file(struct lb_engine *e);
/* A download's sink (an lb_httpc_sink; arg a struct engine_spool_sink): append to fd, at most
 * max bytes in all. -EFBIG past max or when the disk is full (ENOSPC, EDQUOT), else 0 or a
 * negative errno. */
struct engine_spool_sink {
    int fd;
    uint64_t written, max;
};
int engine_spool_write(const void *data, size_t n, void *arg);
/* The spool file fd reopened read-only (the file_open contract's O_RDONLY descriptor) into
 * *out, the caller's. 0 or -EIO with err set. */
int engine_spool_reopen(int fd, int *out, struct lb_error *err);

/* An engine's name for an instance's state and the status it means (a table ends with a NULL
 * name). */
struct engine_state_name {
    const char *name;
    enum lb_sandbox_status status;
};
struct lb_httpc_response;
/* What an engine's answer to a state request means, into *out: 404 (no such instance) is
 * LB_STATUS_STOPPED; 200 is the name at body[obj][key] looked up in table
 * (LB_STATUS_UNKNOWN for a name not in it, or none). 0; -EREMOTEIO for another HTTP status,
 * with *out untouched and no error set: the caller words it from the answer. */
int engine_state_answer(const struct lb_httpc_response *resp, const char *obj, const char *key,
                        const struct engine_state_name *table, enum lb_sandbox_status *out);

/* GET path through hooks->call and its answer, which must be 200 (else hooks->answer_error:
 * 404 -ENOENT, else -EREMOTEIO), parsed as JSON into *out (the caller's; an answer that is not
 * JSON is -EREMOTEIO). what names the request in messages. */
int engine_get_json(struct lb_engine *e, const char *path, const char *what, int64_t timeout_ms,
                    json_t **out, struct lb_error *err);

/* The provider's status op: hooks->state. */
int engine_status(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                  enum lb_sandbox_status *out, struct lb_error *err);
/* The pause and resume ops: hooks->set_frozen; -ENOENT "no such sandbox" when the instance
 * is gone; 0 when the engine refused but the instance is already so; else -ETIMEDOUT or
 * -EREMOTEIO with the engine's reason. */
int engine_pause(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_error *err);
int engine_resume(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_error *err);
/* The list op: [{"sandbox_id", "descriptor"}] of the items hooks->list_entry takes as ours;
 * a list_raw that fails with -ENOENT (a 404) is -EREMOTEIO. */
int engine_list(struct lb_provider *p, json_t **out, struct lb_error *err);
/* The end_execs op: no exec is admitted from now on; returns how many are in flight. */
int engine_end_execs(struct lb_provider *p);
/* The stop op: hooks->remove, with 120000 ms when timeout_ms is not positive. */
int engine_stop(struct lb_provider *p, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                struct lb_error *err);
/* The usage op (provider.h): every field -1, then hooks->usage. A failure of the hook leaves
 * every field -1 (never half an answer), is logged at debug and returned (-ENOENT, -ETIMEDOUT,
 * -EREMOTEIO) with err set: a caller that only shows usage ignores it. */
int engine_usage(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_usage *out,
                 struct lb_error *err);
/* A figure of an engine's answer for struct lb_usage: v when it is a JSON integer >= 0 (a
 * real >= 0 is truncated), else -1 (absent, null, negative or another type). v may be NULL. */
int64_t engine_usage_figure(const json_t *v);
/* The file_open op: a valid path (-EINVAL), then hooks->file_open. */
int engine_file_open(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                     int *fd_out, uint64_t *size_out, struct lb_error *err);
/* ---- snapshots (engine_snapshot.c) ----
 *
 * A snapshot of an engine instance is the workdir's tar archive (hooks->workdir_archive, read
 * while the instance runs: an engine cannot read a frozen instance's workdir mount) in dest,
 * then, with the instance frozen, an engine image of its root (hooks->commit), recorded in
 * dest's engine.json (image.h, "engine snapshots"); the rootfs/ and workspace/ of dest stay
 * empty. /tmp and the workdir are mounts the engine's image leaves out (docker). A backend
 * without workdir_archive keeps the workdir in the instance's root: the engine image is all of
 * the snapshot (engine.json names no archive and an empty workdir). */

/* The snapshot op (provider.h): -ENOENT for a stopped instance; a paused one: -EBUSY when the
 * backend archives the workdir, else captured as it is (neither frozen nor thawed here); the
 * fault point "snapshot.frozen" while frozen, the image removed again on a later failure, the
 * instance thawed either way. flatten is ignored (the engine stacks its own layers). */
int engine_snapshot(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *dest,
                    bool flatten, struct lb_error *err);
/* The snapshot_sweep op: hooks->image_remove of each of hooks->snapshot_images that no tree of
 * the image store names (image_engine_image_kept); one in use stays. */
int engine_snapshot_sweep(struct lb_provider *p, struct lb_error *err);
struct lb_image_engine;
/* For a create: 0 and *out when spec->image names a snapshot this backend made; -ENOENT
 * (err untouched) when it names none (the engine's own image); -EOPNOTSUPP (err set) for a
 * snapshot of another provider or, for a snapshot with a workdir archive, a workdir of another
 * name than the snapshot's. */
int engine_snapshot_source(struct lb_engine *e, const struct lb_sandbox_spec *spec,
                           struct lb_image_engine *out, struct lb_error *err);
/* After the instance of such a create started: its workdir from the snapshot's archive
 * (hooks->put_archive at the workdir's parent). 0 or a negative errno with err set. */
int engine_snapshot_restore(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                            const struct lb_sandbox_spec *spec, const struct lb_image_engine *src,
                            struct lb_error *err);

/* The archive_put and archive_get ops (provider.h) when the backend has the hooks: a bad dir
 * (-EINVAL), a stopped instance (-ENOENT); put reads and checks the whole body into a clean
 * archive in the spool dir before hooks->archive_put sees any of it (refused entries and a
 * body that is not a tar: -EINVAL; past max_bytes of file contents or the entry count:
 * -EFBIG); get writes what hooks->archive_get hands over to fd. */
lb_provider_archive_fn engine_archive_put;
lb_provider_archive_fn engine_archive_get;

/* For an archive_put hook whose extraction failed part way: remove what it made, by an exec
 * of "rm -rf" in the instance (the image needs rm): dir itself when dir_was_new, else
 * dir/<top> for each of tops whose existed[i] is false. 0, or a negative errno (the exec
 * failed or rm did not succeed); best effort, nothing else is undone. */
int engine_archive_undo(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *dir,
                        bool dir_was_new, const struct engine_archive_tops *tops,
                        const bool *existed);

/* Free what the engine base holds (the strings, http, the gates; no exec runs). */
void engine_release(struct lb_engine *e);

#endif
