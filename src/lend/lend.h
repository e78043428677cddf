/*
 * lend.h - lending: one sandbox per resources session, and the operations on lent sandboxes.
 *
 * Mirrors NeMo Gym's LentSandboxes (nemo_gym/server_runtime/sandbox_lending): seed lends the
 * session a sandbox (starting it on the first call only), release stops it, a failed seed's
 * sandbox whose stop also failed is kept apart and retried by the session's next seed or
 * release, the sweeper and the shutdown sweep. It also serves the per-sandbox operations of
 * AsyncSandbox (exec, files, status) for the admin and for the sandbox's operate token.
 *
 * Every state change is written to the store before the provider acts (DESIGN.md invariant 1);
 * seed/release/delete of one session run one at a time (a lock per session id), different
 * sessions in parallel. Functions that call the provider block: call them from pool workers.
 *
 * Returned JSON objects are new references the caller owns. Errors are negative errnos with
 * the status mapping of util/error.h.
 */
#ifndef LB_LEND_H
#define LB_LEND_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "provider/provider.h"
#include "provider/registry.h"
#include "store/store.h"

struct lb_lend_config {
    int64_t stop_timeout_s;
    int64_t create_timeout_s;
    int64_t default_ttl_s; /* 0: none */
    int64_t max_ttl_s;     /* 0: no cap */
    int64_t retry_base_s;
    int64_t retry_max_s;
    int64_t max_sandboxes;
    int64_t default_pids;     /* pids limit for seeds that set none; 0: none */
    int64_t default_disk_mib; /* disk_mib for seeds that set none; 0: none (unenforceable) */
    int64_t max_disk_mib;     /* largest disk_mib a seed may ask for (400 past it); 0: no cap */
    int64_t retention_s;
    int64_t session_lock_wait_s; /* bound on waiting for a session's lock; <= 0: 30 */
    int64_t max_starting;        /* creates at once (lend/admission.h); <= 0: no bound */
    int64_t max_seed_queue;      /* seeds waiting for a create slot; past it 429 overloaded */
    bool pool_adopt; /* startup: warm sandboxes that still run go back into the pool (else
                        they are stopped, reason not_adopted); see src/warm/ */
    /* [pool] recycle: a release of a sandbox taken from the pool, while the pool holds fewer
     * than pool_size warm sandboxes and the sandbox was lent fewer than pool_max_uses times,
     * makes its replacement at once as a warm sandbox under a new id carrying the use count
     * (see lend_release); pool_max_age_s is the warm record's max age (0: none) */
    bool pool_recycle;
    int64_t pool_size;
    int64_t pool_max_uses;
    int64_t pool_max_age_s;
    size_t max_output_bytes;
    const char *default_image;
    const char *images_dir; /* the image store (image/image.h): imported images' Env and
                               WorkingDir apply to execs; NULL: none */
    const char *workdir;
    const char *public_url;           /* base_url in the lease's access */
    const unsigned char *operate_key; /* HMAC key operate tokens derive from */
    size_t operate_key_len;
};

struct lb_lend;

/* Make the lending service over store and the enabled providers (both stay the caller's).
 * A new sandbox goes to the seed's provider (or the registry's default); every later call on
 * it goes to the provider its record names. The config's strings are copied. -ENOMEM. */
int lend_new(const struct lb_lend_config *cfg, struct lb_store *st, struct lb_registry *providers,
             struct lb_lend **out, struct lb_error *err);
void lend_free(struct lb_lend *l);

/* While draining, seeds fail with -ESHUTDOWN (503 draining). Thread-safe. */
void lend_set_draining(struct lb_lend *l, bool draining);
bool lend_is_draining(struct lb_lend *l);

struct lb_seed_file {
    char *path;          /* absolute, normalised */
    unsigned char *data; /* decoded bytes */
    size_t len;
    int mode; /* -1: 0644 */
};

/* A seed's readiness probe: the seed answers only once "sh -c command" exits 0 inside the
 * sandbox (as root, in an exec's default cwd, with the seed's env), tried every interval_ms,
 * or fails at its ready timeout (see lend_probe_run). */
#define LB_PROBE_COMMAND_MAX 65536 /* bytes; under the kernel's 128 KiB bound on one argument */
#define LB_PROBE_INTERVAL_MIN_MS 10
#define LB_PROBE_INTERVAL_MAX_MS 60000
#define LB_PROBE_INTERVAL_DEFAULT_MS 200

struct lb_ready_probe {
    const char *command; /* non-empty, no NUL, at most LB_PROBE_COMMAND_MAX bytes; NULL: none.
                            Borrowed (the request body's) */
    int64_t interval_ms; /* between attempts, LB_PROBE_INTERVAL_MIN_MS..MAX_MS */
};

struct lb_seed_request {
    const char *task_id;
    const char *provider; /* an enabled provider's name; NULL: the default provider */
    const char *image;    /* NULL: default image */
    json_t *env;          /* object of strings, or NULL */
    int64_t ttl_s;        /* -1: default_ttl_s */
    struct lb_resources resources;
    json_t *network;               /* validated object or NULL (what the record keeps) */
    struct lb_network_request net; /* network parsed by the caller (what the provider gets);
                                      zero: none. Strings and the tool_servers array are the
                                      caller's */
    json_t *labels;                /* object of strings or NULL */
    int *ports;                    /* declared service ports, 1..65535, no duplicates; NULL: none */
    size_t n_ports;
    struct lb_seed_file *files;
    size_t n_files;
    const char *workdir;      /* absolute, normalised; NULL: lending.workdir */
    int64_t ready_timeout_ms; /* > 0: the provider's readiness wait; 0: create_timeout_s */
    double idle_timeout_s;    /* > 0: stop (or pause) it after this long without activity */
    bool on_idle_pause;       /* with idle_timeout_s: pause it rather than stop it */
    struct lb_ready_probe ready_probe; /* command NULL: none */
    bool sync_later; /* the lease's commit is left unsynced: the caller calls lend_sync_leases
                        before it hands the lease out (a batch's seeds share one sync) */
};

/* Lend the session a sandbox, or return the one it has. *lease_out is the lease of API.md.
 * -EEXIST (409) for a live session seeded with another task_id, -EREMOTEIO (502) when the
 * sandbox cannot start or a failed seed's stop fails again, -EINVAL/-EISDIR/... (400) for a
 * file that cannot be written, -EUSERS (429) at max_sandboxes, -ESHUTDOWN (503) while draining,
 * -EOPNOTSUPP (422) for a provider that is not enabled, or a spec field (network policy,
 * resource limit, ports) the chosen provider cannot enforce. */
int lend_seed(struct lb_lend *l, const char *rsid, const struct lb_seed_request *req,
              json_t **lease_out, struct lb_error *err);

/* Make the leases of seeds made with sync_later durable (store_sync: one fsync, none when no
 * such lease is unsynced), before any lease is handed out. 0, or a negative errno with err set:
 * the leases' records are written and lent either way, and a failure is sticky (no lease is
 * handed out until the daemon restarts; then a seed of such a session returns its sandbox).
 * Thread-safe. */
int lend_sync_leases(struct lb_lend *l, struct lb_error *err);

/* Start a sandbox lent to no session (POST /v1/sandboxes, NeMo Gym's AsyncSandbox.start):
 * the same record, TTL, durability and rollback as a seed's new sandbox, with rsid NULL;
 * req->task_id may be NULL. *lease_out is the lease (resources_session_id null). Errors as
 * lend_seed's start (no 409: every call starts a new sandbox). Blocks on the provider. */
int lend_create_sandbox(struct lb_lend *l, const struct lb_seed_request *req, json_t **lease_out,
                        struct lb_error *err);

/* POST /v1/sessions/release_all: release (as lend_release) every session that has a live
 * sandbox or a pending stop and, when labels is a non-empty object, whose record's labels hold
 * every name of it with the same value; at most concurrency releases at once. *out is
 * {"released": [rsid...], "failed": [{"resources_session_id", "sandbox_id", "error": {"code",
 * "message"}}...]} (oldest record first). Returns 0 even when some failed; -ESHUTDOWN while
 * draining, -ENOMEM. Blocks (runs up to concurrency threads). */
int lend_release_all(struct lb_lend *l, json_t *labels, size_t concurrency, json_t **out,
                     struct lb_error *err);

/* The session's lease (live sandbox). -ENOENT if the session has none. */
int lend_get_lease(struct lb_lend *l, const char *rsid, json_t **lease_out, struct lb_error *err);
/* {"sessions": [lease...]}; state NULL or a record state name (else -EINVAL). */
int lend_list_leases(struct lb_lend *l, const char *state, json_t **out, struct lb_error *err);

/* Stop the session's sandbox and any failed-seed sandbox of it. *out is {"released": true,
 * "sandbox_id"} or {"released": false}. -EREMOTEIO (502) when a stop fails (record kept). */
int lend_release(struct lb_lend *l, const char *rsid, json_t **out, struct lb_error *err);

/* POST /v1/sandboxes/{id}/renew: lent sandbox id now expires ttl_s seconds from now (capped at
 * max_ttl_s as a seed's ttl_s is), recorded in the store. *out is {"sandbox_id", "expires_at"}
 * (RFC 3339 as the lease's). recheck (NULL: none) is called with ctx under the session's lock,
 * before anything is recorded, and its error returned: an operate token's renew checks its
 * token again there, so one a reset (which holds that lock) revoked while the renew waited
 * answers 401 and does not lengthen the next episode's TTL. -EINVAL (400) for ttl_s <= 0,
 * -ENOENT (404) for a sandbox that is unknown, not lent (starting, stopping, stopped) or past
 * its TTL already, -EBUSY (409) when its session stays busy (session_lock_wait_s), -ENOSPC/-EIO
 * from the store. Takes the session's lock (the TTL sweep's order); no provider call.
 * Thread-safe. */
int lend_renew(struct lb_lend *l, const char *id, int64_t ttl_s,
               int (*recheck)(void *ctx, struct lb_error *err), void *ctx, json_t **out,
               struct lb_error *err);

/* Note activity on sandbox id (a PTY or activation request that does not go through lend_exec
 * or the file calls, which note their own): its idle clock starts again. Cheap (a hash update
 * under a mutex), no store or provider call: fine on an HTTP thread. NULL-safe. */
void lend_activity_touch(struct lb_lend *l, const char *id);

/* Stop one sandbox by id (reason "deleted"). *out {"deleted": bool, "sandbox_id"}. -ENOENT. */
int lend_delete_sandbox(struct lb_lend *l, const char *id, json_t **out, struct lb_error *err);

/* The resources session of sandbox id into rsid (a record read, no provider call: fine on an
 * HTTP thread). -ENOENT for an unknown id or one lent to no session, -ENAMETOOLONG. */
int lend_sandbox_rsid(struct lb_lend *l, const char *id, char *rsid, size_t len);

/* GET /v1/sandboxes/{id}: record plus the provider's status for live ones. -ENOENT. */
int lend_sandbox_status(struct lb_lend *l, const char *id, json_t **out, struct lb_error *err);
/* {"sandboxes": [...]} of every record (with stop details); state filter as above. */
int lend_list_sandboxes(struct lb_lend *l, const char *state, json_t **out, struct lb_error *err);

struct lb_exec_params {
    char **argv;     /* NULL-terminated */
    const char *cwd; /* NULL: workdir */
    json_t *env;     /* object of strings or NULL; merged over the seed's env */
    const char *user;
    const unsigned char *stdin_data;
    size_t stdin_len;
    int64_t timeout_ms;
    bool preserve_background;
    bool exclusive;  /* stop every sandbox process but its init first (-EBUSY while another
                        exclusive exec runs in the sandbox, or for others while one does) */
    bool agent_root; /* exclusive: on the sandbox's own root, not the trusted view */
    bool sweep_only; /* with exclusive: the daemon's own exec that wants only the sweep (an
                        activation's stop), not a result a grader trusts, so it runs on
                        providers whose caps.exclusive is false too */
    int pass_fd;     /* > 0: given to the command alone as its fd 4 (provider pass_fd); borrowed */
    /* output as it is produced (provider.h lb_exec_request.on_output); NULL: none */
    void (*on_output)(void *ctx, int stream, const char *data, size_t len);
    void *output_ctx;
    /* NULL, or the caller's flag, true while it holds the sandbox's operate-token fence as a
     * writer for an operate-token request (routes_operate_enter): lend_exec leaves the fence
     * once the command runs inside the sandbox (the provider's on_started) or when it
     * returns, whichever comes first, and sets the flag false; so a reset waits for the start
     * and its kill then ends the command. Whatever is still held after a caller's early
     * return is the caller's to leave. */
    bool *fence_held;
};

/* Who a command of the lent sandbox id runs as: user, else the image's User (image_user of the
 * spec), else root (*out NULL). *out is malloc'd (the caller frees). 0, -ENOENT (not lent),
 * -ENOMEM. */
int lend_exec_user(struct lb_lend *l, const char *id, const char *user, char **out,
                   struct lb_error *err);

/* Run a command in a lent sandbox. -ENOENT (404) if the sandbox is not lent; an exclusive
 * one (not sweep_only) on a provider whose caps.exclusive is false, or a user given by name on
 * one whose caps.users is false, is -EOPNOTSUPP (422 unenforceable). While an exclusive exec runs,
 * the sandbox's operate-token fence is up (lend_fence_check): it goes up before the provider's
 * sweep starts and down once the provider's result is in, and it waits for the writes
 * lend_fence_enter admitted before. */
int lend_exec(struct lb_lend *l, const char *id, const struct lb_exec_params *p,
              struct lb_exec_result *res, struct lb_error *err);

/* The operate-token fence. check: 0, or -EBUSY (409 conflict, the message naming the
 * exclusive exec and when it began) while an exclusive exec of sandbox id runs; a record-free
 * lookup, fine on an HTTP thread. Every call made with a sandbox's operate token is checked
 * when it is authorized (routes_authorize). enter/leave bracket what the daemon does in the
 * sandbox for an operate-token request admitted earlier (an upload's commit, a pause, an exec
 * or a PTY session until its process is inside: routes_operate_enter): enter is -EBUSY as check
 * (nothing held) or holds the fence down until leave, so the act either starts before an
 * exclusive exec's sweep or a reset's kill, or is refused. -ENOMEM. Thread-safe. */
int lend_fence_check(struct lb_lend *l, const char *id, struct lb_error *err);
/* Raise id's fence (counted: every raise needs its lower) for an exclusive exec, a snapshot, a
 * reset, or for what must span more than one (an activation close's sweep and capture): from then
 * on check and enter refuse; returns once no write enter admitted before is still in progress.
 * -ENOMEM, or -EBUSY (409, nothing raised) when the sandbox is paused while such an act is
 * still starting (a pause holds it at its start for as long as its timeout). */
int lend_fence_raise(struct lb_lend *l, const char *id, struct lb_error *err);
/* A raise's hook, called while a writer admitted before is still in: 0 to wait on, or a
 * negative errno with err set to give up (the raise then returns it, nothing raised). */
typedef int lend_fence_stall_fn(void *ctx, struct lb_error *err);
/* lend_fence_raise with its own stall hook, called (when not NULL; without the fence's lock)
 * every 200 ms that a writer is still in: a reset thaws the sandbox (whose pause could hold an
 * exec's start, and so the reset, for the exec's whole timeout) and waits on. */
int lend_fence_raise_stalled(struct lb_lend *l, const char *id, lend_fence_stall_fn *stalled,
                             void *ctx, struct lb_error *err);
void lend_fence_lower(struct lb_lend *l, const char *id);
int lend_fence_enter(struct lb_lend *l, const char *id, struct lb_error *err);
void lend_fence_leave(struct lb_lend *l, const char *id);
/* enter/leave for an operate-token read the daemon does itself (a file opened, an archive made,
 * an activation looked up, an endpoint's relay made): a raise waits for it as for a write, but
 * never calls its stall hook for it (a paused sandbox cannot hold a read up), so a read in
 * flight cannot make a snapshot or a close give up with 409. Errors as enter. */
int lend_fence_enter_read(struct lb_lend *l, const char *id, struct lb_error *err);
void lend_fence_leave_read(struct lb_lend *l, const char *id);

int lend_file_write(struct lb_lend *l, const char *id, const char *path, const void *data,
                    size_t len, int mode, struct lb_error *err);
/* A streamed upload to path in a lent sandbox (provider.h, struct lb_upload): begin opens the
 * temporary file (-ENOENT if the sandbox is not lent; path errors as lend_file_write; owner
 * NULL or a user of the sandbox's passwd, see the upload_begin op); the caller writes to
 * (*out)->fd, then commits (renamed into place) or aborts (removed). commit and abort consume
 * u; abort is NULL-safe and does not block on the sandbox. */
int lend_upload_begin(struct lb_lend *l, const char *id, const char *path, int mode,
                      const char *owner, struct lb_upload **out, struct lb_error *err);
int lend_upload_commit(struct lb_lend *l, struct lb_upload *u, struct lb_error *err);
void lend_upload_abort(struct lb_lend *l, struct lb_upload *u);
/* The error of a failed write to u->fd (errnum, bytes written or tried): see provider.h. */
int lend_upload_error(struct lb_lend *l, struct lb_upload *u, int errnum, uint64_t bytes,
                      struct lb_error *err);
/* Make room for need bytes of u (and for up to want, as far as there is room) before they
 * are written (provider.h, upload_reserve): on a memory-backed mount the sandbox's memory is
 * charged for them, not the daemon's. Call before writing past what was reserved; blocks
 * briefly. -EFBIG (413) when the sandbox's memory limit or the mount cannot hold need bytes. */
int lend_upload_reserve(struct lb_lend *l, struct lb_upload *u, uint64_t need, uint64_t want,
                        struct lb_error *err);
int lend_file_open(struct lb_lend *l, const char *id, const char *path, int *fd_out,
                   uint64_t *size_out, struct lb_error *err);

/* A directory of a lent sandbox in and out as a tar archive (provider.h, archive_put and
 * archive_get): put extracts the archive read from fd (gzip or not) into dir, get writes a tar of
 * dir to fd; max_bytes bounds the contents (put) or the archive (get), -EFBIG (413) past it.
 * -ENOENT if the sandbox is not lent, -LB_E_LOST if its init is gone, -ENOSYS (501) for a
 * provider without archives; path and entry errors as the ops say. fd is borrowed. Blocks for
 * the copy. An operate-token put is bracketed by lend_fence_enter/leave by its caller. */
int lend_archive_put(struct lb_lend *l, const char *id, const char *dir, int fd, uint64_t max_bytes,
                     struct lb_archive_result *out, struct lb_error *err);
int lend_archive_get(struct lb_lend *l, const char *id, const char *dir, int fd, uint64_t max_bytes,
                     struct lb_archive_result *out, struct lb_error *err);

/* Freeze (pause true) or thaw every process of a lent sandbox through the provider (the
 * cgroup freezer); idempotent. *out is the status object of lend_sandbox_status ("paused" or
 * "running"). -ENOENT (404) if the sandbox is not lent, -ENOSYS (501) without a freezer. */
int lend_set_paused(struct lb_lend *l, const char *id, bool pause, json_t **out,
                    struct lb_error *err);

/* GET /v1/sandboxes/{id}/endpoints/{port}: *out {"endpoint": url, "headers": {}} reaching a
 * server on that TCP port inside the sandbox from the daemon's host. -ENOENT (404) if the
 * sandbox is not lent or the port was not declared in the seed's "ports", -ENOSYS (501) if
 * the provider cannot serve endpoints. */
int lend_endpoint(struct lb_lend *l, const char *id, int port, json_t **out, struct lb_error *err);

/* The OOM-kill count of a lent sandbox's cgroup (provider oom_kills) into *count, its memory
 * limit in bytes into *limit_bytes (may be NULL; 0 when unlimited). -ENOENT if the sandbox is
 * not lent or is gone, -ENOSYS if the provider cannot tell; err may be NULL. Thread-safe. */
int lend_sandbox_oom_kills(struct lb_lend *l, const char *id, uint64_t *count, int64_t *limit_bytes,
                           struct lb_error *err);

/* Called by release and delete before a lent sandbox is stopped, with the session's lock held,
 * so that the activation service can close a running harness first (and collect its
 * artifacts). The hook logs its own failures; the stop goes ahead either way. It must not
 * call lend_seed, lend_release or lend_delete_sandbox. Set once, before serving. */
typedef void (*lb_lend_release_hook)(void *ctx, const char *rsid, const char *sandbox_id);
void lend_set_release_hook(struct lb_lend *l, lb_lend_release_hook hook, void *ctx);
/* Called after every successful stop of a sandbox (release, delete, TTL, reconciliation),
 * on the stopping thread, with the sandbox's id: the PTY service drops its sessions. Set it
 * once, before serving. */
typedef void (*lb_lend_stopped_hook)(void *ctx, const char *sandbox_id);
void lend_set_stopped_hook(struct lb_lend *l, lb_lend_stopped_hook hook, void *ctx);

/* Snapshot the lent sandbox id as the image name (image/image.h; the provider's snapshot op),
 * with labels (a checked JSON object of strings, or NULL; borrowed) kept with the image:
 * *out gets {"name","digest","size_bytes","created_at","kind":"snapshot","base",
 * "source_sandbox_id","labels"} (the caller's). The sandbox keeps running; its operate-token
 * fence is up for the capture (lend_fence_raise: operate-token calls answer 409, writes admitted
 * before complete first), so nothing but the frozen sandbox itself holds its files. Errors:
 * -EINVAL (bad name), -EEXIST (an image of that name exists, or the sandbox's image was renamed
 * to another tree since its seed), -ENOENT (no such running sandbox), -ENOSYS (the provider has
 * no snapshots), -EFBIG (the capture would pass the sandbox's disk size), -ENOSPC (the image
 * store has no room), -EOPNOTSUPP (a device node in the sandbox's trees), -EREMOTEIO (the
 * capture failed); on any error nothing is named. Blocks for the copy. Callers run one
 * snapshot at a time (the route's serial key "images"). */
int lend_snapshot(struct lb_lend *l, const char *id, const char *name, json_t *labels, json_t **out,
                  struct lb_error *err);

/* POST /v1/sandboxes/{id}/reset: return lent sandbox id, in place, to how it was seeded, or
 * (snapshot non-NULL) to that snapshot, which must stand on the sandbox's base image. The
 * sandbox is torn down whole (every process, mount and namespace: root layer, workdir, /tmp,
 * /run, /dev/shm, IPC objects, hostname, sockets; its harness closed as before a release, its
 * PTY sessions ended) and made again under the same id, spec, session and expiry; the seed's
 * files are written again and a new operate token is minted (the old one answers 401). *out is
 * the lease (the caller's). Errors: -ENOENT (404: not lent), -LB_E_IMAGE_NOT_FOUND (404: unknown
 * snapshot, or the seed's image no longer stored), -EEXIST (409: a snapshot of another base,
 * or the seed's image name now names another tree), -ENOSYS (501: the provider's caps lack
 * reset), -ESHUTDOWN (503: draining), -EREMOTEIO (502: the reset failed after the teardown
 * began; the sandbox was then stopped with reason reset_failed, never lent half-reset). Holds
 * the session's lock; blocks on the provider. The fault point "lend.reset" fails a reset between
 * the teardown and the new sandbox's create. */
int lend_reset(struct lb_lend *l, const char *id, const char *snapshot, json_t **out,
               struct lb_error *err);

/* At start-up, after reconciliation: every snapshot a crash interrupted (store.h) is settled:
 * its sandbox thawed (unless it was paused before the snapshot) and its record dropped. Its
 * image is either named and complete or was never named; the image store's start-up clean-up
 * removes its work dir. 0 or a negative errno. */
int lend_recover_snapshots(struct lb_lend *l, struct lb_error *err);

/* Fork (POST /v1/sandboxes/{id}/fork), in three steps the caller runs on pool workers:
 *
 * lend_fork_begin captures the lent sandbox id as an implicit snapshot: a hidden image (not
 * listed by GET /v1/images) named "fork-<24 hex>" into name (name_len bytes, at least 30),
 * pinned until lend_fork_end. *template_out (the caller's) is the seed body every child gets:
 * the parent's spec (provider, task_id, env, network, labels, ports, resources, workdir,
 * ready_timeout_s, its TTL as given) with "image" the implicit snapshot; the files the parent
 * was seeded with are not in it (the snapshot holds the parent's tree). Errors as lend_snapshot
 * (-ENOENT: no such running sandbox; -ENOSYS: the provider has no snapshots); on failure
 * nothing stays pinned or stored. Blocks for the capture.
 *
 * lend_fork_child lends session rsid a sandbox of req (a parsed template): as lend_seed, but a
 * session that has any live sandbox is -EEXIST (409), never reused. Thread-safe: children
 * start concurrently.
 *
 * lend_fork_end unpins name and removes the implicit snapshot when no live sandbox stands on it
 * (no child started); else the stop of its last child does (lend_stop_record). Call it once for
 * every successful begin. */
int lend_fork_begin(struct lb_lend *l, const char *id, char *name, size_t name_len,
                    json_t **template_out, struct lb_error *err);
int lend_fork_child(struct lb_lend *l, const char *rsid, const struct lb_seed_request *req,
                    json_t **lease_out, struct lb_error *err);
void lend_fork_end(struct lb_lend *l, const char *name);

/* At start-up, after reconciliation and lend_recover_snapshots: remove every implicit fork
 * snapshot that no live sandbox stands on (a crash during a fork, or after the last child's
 * stop). 0 or a negative errno (the image store cannot be read). */
int lend_collect_forks(struct lb_lend *l, struct lb_error *err);

/* Every provider's snapshot_sweep (provider.h): what an engine keeps for snapshots that the
 * image store no longer names is removed (after an image's removal, a fork snapshot's
 * collection, and at start-up after lend_recover_snapshots). Failures are logged. Holds the
 * capture lock: a capture under way finishes first, and its work dir keeps its engine image. */
void lend_sweep_snapshots(struct lb_lend *l);

/* The capabilities of the provider a running sandbox is on (a record read, no provider call).
 * -ENOENT (not running), -EREMOTEIO (its provider is not configured). */
int lend_sandbox_caps(struct lb_lend *l, const char *id, struct lb_provider_caps *caps,
                      struct lb_error *err);

/* Work of the daemon's in a lent sandbox that runs outside lend_exec (a code context's run):
 * enter counts it as activity under way until lend_busy_leave (no idle stop or pause
 * meanwhile; an idle-paused sandbox is resumed first). 0, -ENOENT (not running), -LB_E_LOST,
 * -EBUSY (409: the sandbox is paused), -EREMOTEIO. Every 0 needs one lend_busy_leave. */
int lend_busy_enter(struct lb_lend *l, const char *id, struct lb_error *err);
void lend_busy_leave(struct lb_lend *l, const char *id);

/* Can the store record anything (/readyz)? 0, or -ENOSPC/-EROFS/-EIO with a message (see
 * store_check_writable). Cheap; thread-safe. */
int lend_check_store(struct lb_lend *l, struct lb_error *err);

/* Gauges for /metrics: append Prometheus text of sandboxes by state. */
int lend_render_metrics(struct lb_lend *l, struct lb_buf *out);

#endif
