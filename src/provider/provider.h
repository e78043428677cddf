/*
 * provider.h - the one interface behind which every kind of sandbox lives.
 *
 * A provider creates, runs commands in, moves files in and out of, reports on and stops
 * sandboxes. It mirrors NeMo Gym's SandboxProvider protocol (create/exec/upload_file/
 * download_file/status/close; nemo_gym/sandbox/providers/base.py): create returns only when
 * the sandbox can run commands and take files, exec never fails because the command failed
 * (a non-zero exit is a result), and stop treats "already gone" as success.
 *
 * Identity. The daemon names every sandbox (struct lb_sandbox_ref.id, "sbx-..."). create
 * returns a provider-specific JSON descriptor (pid, uid, container id, ...) that the daemon
 * stores in SQLite and hands back on every later call, also after a daemon restart. A provider
 * must also be able to find and stop a sandbox from its id alone (descriptor NULL), because a
 * crash can happen between create and the record update (DESIGN.md invariant 1).
 *
 * Errors. Functions return 0 or a negative errno and fill the optional struct lb_error (one
 * readable sentence: it becomes the HTTP error's message). The errno decides the HTTP status
 * (see util/error.h). Checklist for a new provider, per operation:
 *   [ ] the sandbox (or the file) is not there            -> -ENOENT      404
 *   [ ] the sandbox's init died outside lendbox's control
 *       (its record, directory or container is still there) -> -LB_E_LOST 410 (lending
 *       checks the record first; -ENOENT is confirmed with status)
 *   [ ] a bad path or argument (not absolute, a directory,
 *       not a directory, read-only)                        -> -EINVAL, -EISDIR, -ENOTDIR,
 *                                                             -EROFS       400
 *   [ ] the sandbox's own root may not do it               -> -EACCES      403
 *   [ ] a size or space limit was hit                      -> -EFBIG       413
 *   [ ] a spec field this provider cannot honour (network
 *       mode, disk limit, gpu, ...): refuse, never weaken  -> -EOPNOTSUPP  422 unenforceable
 *   [ ] an unknown image                                   -> -LB_E_IMAGE_NOT_FOUND 404
 *   [ ] no free slot (uids, ...)                           -> -EUSERS      429
 *   [ ] a whole capability it lacks (pause, endpoints,
 *       pass_fd, ...): leave the op NULL or answer          -> -ENOSYS      501
 *   [ ] every failure of the provider itself (engine down,
 *       transport broken, unexpected answer)              -> -EREMOTEIO   502
 *   [ ] a bounded wait ran out (stop, create)              -> -ETIMEDOUT   502
 *   [ ] stop of a sandbox that is already gone             -> 0 (success)
 *   [ ] exec of a command that failed or timed out         -> 0 with the result filled
 * Any other errno becomes 500: do not let a raw errno of a syscall escape.
 *
 * Capabilities. ops->caps says what the provider can honour (struct lb_provider_caps). The
 * rule: a spec field whose capability is missing is refused by lending before anything is
 * recorded, with -EOPNOTSUPP (422 unenforceable) naming the field and the provider
 * (provider_check_spec); an operation whose whole capability is missing (pause, endpoints,
 * pty) answers -ENOSYS (501). The provider's own create still refuses what it cannot enforce in
 * detail (a network server it cannot reach, ...): the caps are the coarse, early answer.
 *
 * Adding a provider: write its ops (fill version = LB_PROVIDER_OPS_VERSION and caps), its
 * config keys as rows of util/config.c's table under its own section ("[docker] socket"), and
 * one row in provider/registry.c's table naming it and its constructor (registry.h). Nothing
 * else in the daemon changes: records store the provider's name and every later call on a
 * sandbox goes to the provider that made it.
 *
 * Thread-safety: every operation may be called from several worker threads at once, also on
 * the same sandbox; a provider guards its own shared state.
 */
#ifndef LB_PROVIDER_H
#define LB_PROVIDER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/buf.h"
#include "util/error.h"

enum lb_sandbox_status {
    LB_STATUS_STARTING,
    LB_STATUS_RUNNING,
    LB_STATUS_PAUSED,
    LB_STATUS_STOPPED, /* gone; also what a vanished sandbox reports */
    LB_STATUS_ERROR,
    LB_STATUS_UNKNOWN,
};

/* "starting", "running", ... (static string). */
const char *provider_status_name(enum lb_sandbox_status s);

/* Resource limits for a new sandbox; 0 means "no limit requested". */
struct lb_resources {
    double cpu;           /* CPUs, may be fractional */
    int64_t memory_mib;   /* memory (and swap) limit */
    int64_t pids;         /* max processes */
    int64_t disk_mib;     /* the sandbox's writable storage: the workdir and each tmpfs mount */
    int64_t gpu;          /* GPUs asked for (NeMo Gym's SandboxResources.gpu); 0: none. A
                           * provider without GPUs answers -EOPNOTSUPP (422) past 0 */
    const char *gpu_type; /* GPU model asked for, or NULL; borrowed. -EOPNOTSUPP likewise */
};

/* The network a sandbox asks for (the seed's "network" object). The provider decides whether
 * it can enforce it: create answers -EOPNOTSUPP (422 unenforceable) with a message saying what
 * is missing, never a sandbox with a weaker rule. */
struct lb_network_request {
    const char *access;              /* NULL or "inherit", "model_only", "model_and_tools" */
    const char *model_server;        /* URL or host[:port]; NULL: none */
    const char *const *tool_servers; /* NULL-terminated URLs or host[:port]; NULL: none */
};

#define LB_MAX_PORTS 64

struct lb_sandbox_spec {
    const char *image;   /* "host" (the host's / read-only) or a name under images_dir */
    const char *workdir; /* absolute; the private writable directory, "/workspace" */
    struct lb_resources resources;
    struct lb_network_request network;
    const int *ports; /* declared service ports (1..65535) for endpoints; NULL: none */
    size_t n_ports;
    int64_t ready_timeout_ms; /* > 0: how long create may wait for the sandbox to be ready
                               * (NeMo Gym's ready_timeout_s); 0: the provider's default */
};

/* Which sandbox an operation is about. */
struct lb_sandbox_ref {
    const char *id;           /* daemon-made sandbox id, never NULL */
    const json_t *descriptor; /* what create returned, or NULL when unknown */
};

enum lb_exec_error {
    LB_EXEC_OK = 0,  /* the command ran; return_code is its exit status */
    LB_EXEC_TIMEOUT, /* killed at timeout_ms; return_code 125 */
    LB_EXEC_SANDBOX, /* the sandbox failed to run it (bad cwd, ...); return_code 125 */
    LB_EXEC_OOM,     /* the sandbox's memory limit killed it (OOM killer); return_code its
                      * status, usually 137 */
};

/* NeMo Gym's SANDBOX_RUNTIME_RETURN_CODE: a result that is not a process exit status. */
#define LB_RETURN_CODE_RUNTIME 125

struct lb_exec_request {
    const char *const *argv; /* NULL-terminated, argv[0] non-NULL; searched in $PATH */
    const char *cwd;         /* absolute; NULL means the spec's workdir */
    const char *const *env;  /* NULL-terminated "K=V": the command's whole environment */
    const char *user;        /* NULL, "root" or "0": the sandbox's root; others may be -EINVAL */
    const void *stdin_data;  /* bytes for stdin, then EOF; NULL: stdin is /dev/null */
    size_t stdin_len;
    int64_t timeout_ms;       /* > 0; the whole process tree is killed when it passes */
    size_t max_output_bytes;  /* per stream; bytes past it are read and dropped */
    bool preserve_background; /* leave background descendants running after the command */
    bool exclusive;           /* first stop every sandbox process but its init; no other exec of the
                                 sandbox runs meanwhile (they get -EBUSY); a provider that can
                                 runs the command on a trusted view of the sandbox (its base
                                 image's read-only tree, the workdir at its path: docs/api.md
                                 "Grading safely") */
    bool agent_root;          /* exclusive only: run on the sandbox's own root instead of the
                                 trusted view (what the agent installed, and could replace) */
    int pass_fd; /* > 0: a daemon fd given to the command alone as its fd 4 (the supervisor gets
                    --pass-fd 4 and keeps it from every other process); 0: none. Borrowed: the
                    caller keeps and closes it. A provider that cannot pass fds answers
                    -ENOSYS. */
    /* Optional (NULL: none): called on the exec's thread with output as it is read, before
     * the exec ends: stream LB_EXEC_STDOUT or LB_EXEC_STDERR, the bytes that were kept in
     * the result (so never past max_output_bytes; what the result holds is exactly what was
     * reported, plus anything the provider appends after the command, e.g. a "lendbox: ..."
     * line). Must not block. A provider that cannot report early just does not call it. */
    void (*on_output)(void *ctx, int stream, const char *data, size_t len);
    void *output_ctx;
    /* Optional (NULL: none): called at most once on the exec's thread, before the exec ends,
     * once the command's supervisor runs inside the sandbox (local: the supervisor is in its
     * pid namespace; docker and lxd: the exec is bound to the running instance): from then on
     * every process of the exec is one that the sandbox's stop, reset or exclusive sweep ends.
     * A provider that cannot tell does not call it (the caller then takes the exec's end as
     * that moment). The
     * daemon holds an operate-token exec's fence until then (lend_exec), so a reset never runs
     * between an exec's admission and its start. Must not block. */
    void (*on_started)(void *ctx);
    void *started_ctx;
};

enum { LB_EXEC_STDOUT = 1, LB_EXEC_STDERR = 2 };

struct lb_exec_result {
    int return_code; /* exit status, 128+signal, or LB_RETURN_CODE_RUNTIME */
    enum lb_exec_error error_type;
    struct lb_buf out, err; /* captured stdout/stderr; .truncated says if cut */
    int64_t duration_ms;
    char message[512]; /* why, when error_type is not LB_EXEC_OK: one readable sentence, "" if
                        * none is known */
};

/* Free what an exec result holds (safe on a zeroed or half-filled result). */
void provider_exec_result_release(struct lb_exec_result *res);

struct lb_provider;

/* A streamed upload (upload_begin): a new temporary file inside the sandbox, in the directory
 * of its destination, that the caller fills through fd and then commits (renamed into place)
 * or aborts (removed). The bytes land in the sandbox's own file system, so its limits apply.
 * Providers embed this struct first in their own. One thread at a time per upload; commit or
 * abort may run on another thread than begin. */
struct lb_upload {
    struct lb_provider *provider; /* the provider whose upload_commit/upload_abort apply */
    int fd;                       /* O_WRONLY|O_CLOEXEC, blocking; owned by the upload */
};

/* What a provider can honour (ops->caps). Zeroed means "nothing optional". */
#define LB_NET_LOOPBACK (1u << 0)        /* access "inherit" when it means loopback only */
#define LB_NET_NAT (1u << 1)             /* access "inherit" when it means nat */
#define LB_NET_MODEL_ONLY (1u << 2)      /* access "model_only" */
#define LB_NET_MODEL_AND_TOOLS (1u << 3) /* access "model_and_tools" */

struct lb_provider_caps {
    unsigned network_modes;    /* LB_NET_* bits it can enforce */
    bool cpu_limit;            /* resources.cpu */
    bool memory_limit;         /* resources.memory_mib */
    bool pids_limit;           /* resources.pids */
    bool disk_limit;           /* resources.disk_mib */
    bool gpu;                  /* resources.gpu */
    bool images;               /* images other than "host" */
    bool users;                /* exec as a user named in the sandbox's /etc/passwd (NAME or
                                  NAME:GROUP). Root and numeric ids (UID, UID:GID) need no cap:
                                  every provider takes them or says why not. Without it an exec
                                  naming a user is refused (provider_check_exec). */
    bool pause;                /* pause/resume; without it provider_pause/resume are -ENOSYS */
    bool endpoints;            /* declared ports reachable through endpoint */
    bool pty;                  /* interactive terminals */
    bool pass_fd;              /* exec pass_fd (activations' receipt channel) */
    bool receipt_file;         /* without pass_fd: activations' harness supervisor writes its
                                  receipt to a file inside the sandbox (--receipt-file) that the
                                  daemon reads back with file_open. The sandbox's own processes
                                  can forge or remove that file (same uid): the receipt is as
                                  trustworthy as the sandbox. */
    bool exclusive;            /* exec exclusive, as a grading guarantee: the sweep, the
                                  supervisor that runs the command and the channel its result
                                  comes back on are all out of the sandbox's reach (no file the
                                  sandbox's root can rename or rewrite). Without it an exec
                                  asking "exclusive" is refused (provider_check_exec). */
    bool trusted_view;         /* with exclusive: the command runs on the sandbox's base image
                                  read-only (its workdir at its path), not on the root the
                                  sandbox's processes could change. Without it an exclusive exec
                                  must ask for agent_root (provider_check_exec). */
    const char *default_image; /* the image of a seed that names none, when this provider has
                                  its own (docker.default_image); NULL: lending.default_image.
                                  Owned by the provider. */
    bool snapshot;             /* snapshot: capture a sandbox's file system as an image of the
                                  daemon's image store; without it the route answers 501 */
    bool reset;                /* reset: a running sandbox stopped and made again under the
                                  same id and spec, in place (lend_reset); without it the route
                                  answers 501 */
    bool image_store;          /* runs the daemon's image store trees (images_dir) as they are:
                                  a seed records the image's User (an image whose User is not
                                  mapped in a sandbox is refused before anything is made) */
    bool engine_creates;       /* a create is the work of an engine service (docker, lxd), not
of the daemon's own processes on its CPU (local: bwrap,
mounts, namespaces): the warm pool then refills with all its
threads at once rather than one create at a time */
    int create_concurrency;    /* creates the provider runs at once ([lxd] create_concurrency;
                                  more wait inside create); 0: no bound of its own */
};

/* What a sandbox uses now (the usage op). A field the provider cannot tell is -1. */
struct lb_usage {
    double cpu_s;              /* CPU time of all its processes so far, seconds; < 0: unknown */
    int64_t memory_bytes;      /* memory charged to it now (page cache included), bytes */
    int64_t memory_peak_bytes; /* the most it was charged at once, bytes */
    int64_t pids;              /* processes (and threads, where the kernel counts them) now */
    int64_t oom_kills;         /* processes the OOM killer ended because of its memory limit */
    int64_t disk_bytes;        /* bytes used of its writable storage (upper layer, workdir) */
};

/* What an archive transfer moved (archive_put, archive_get). */
struct lb_archive_result {
    uint64_t entries; /* entries extracted or written */
    uint64_t bytes;   /* put: bytes of file contents written; get: bytes of the archive */
};

/* The type of the archive_put and archive_get ops (struct lb_provider_ops says what they do),
 * so that every provider declares its pair by name: `lb_provider_archive_fn x_archive_put;`. */
typedef int lb_provider_archive_fn(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                                   const char *dir, int fd, uint64_t max_bytes,
                                   struct lb_archive_result *out, struct lb_error *err);

/* The version of struct lb_provider_ops this build expects; a provider sets ops->version to
 * it. Later versions add ops at the end; the daemon refuses a provider of another version. */
#define LB_PROVIDER_OPS_VERSION 5u

struct lb_provider_ops {
    const char *name; /* "local", "docker", ... (what records store) */
    unsigned version; /* LB_PROVIDER_OPS_VERSION */

    /* Fill *out with what this provider (as configured) can honour. May be NULL (nothing
     * optional). Cheap, no I/O; the answer does not change while the provider lives. */
    void (*caps)(struct lb_provider *p, struct lb_provider_caps *out);

    /* Start a sandbox named ref->id (ref->descriptor is NULL). On success *descriptor_out is
     * a new JSON object the caller owns. On failure nothing the call made is left running. */
    int (*create)(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                  const struct lb_sandbox_spec *spec, json_t **descriptor_out,
                  struct lb_error *err);

    /* Stop the sandbox and remove everything the provider made for it (processes,
     * directories, cgroups). Idempotent: a sandbox that is already gone is success. Gives up
     * with -ETIMEDOUT after timeout_ms. */
    int (*stop)(struct lb_provider *p, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                struct lb_error *err);

    /* Current status; a sandbox that is gone is LB_STATUS_STOPPED (not an error). */
    int (*status)(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                  enum lb_sandbox_status *out, struct lb_error *err);

    /* Run one command under lendbox-supervise (local: command mode with a status fd; engines
     * without fd passing, docker: framed mode, the result as frames on stdout, see
     * supervise.c and docker.h). Fills *res (caller releases it) and returns
     * 0 whenever a result exists, including timeouts and LB_EXEC_SANDBOX results; returns
     * -ENOENT if the sandbox is gone, -EREMOTEIO if the exec transport failed. */
    int (*exec)(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                const struct lb_exec_request *req, struct lb_exec_result *res,
                struct lb_error *err);

    /* Write len bytes to the absolute, normalised path inside the sandbox, creating parent
     * directories, replacing an existing file; mode < 0 means 0644. The file belongs to the
     * sandbox's root. Paths resolve inside the sandbox's own root: ".." and symlinks never
     * reach host files. */
    int (*file_write)(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                      const void *data, size_t len, int mode, struct lb_error *err);

    /* Streamed file_write: open a temporary file beside path (parents created, owned by the
     * sandbox's root, same path rules as file_write) and return it as *out (the caller
     * commits or aborts it). owner NULL: the file belongs to the sandbox's root; else a user
     * of the sandbox's own /etc/passwd (NAME, UID, NAME:GROUP, UID:GID, as exec's user) whom
     * commit makes its owner: an unknown one is -EINVAL (400, naming it) here, before any
     * byte; a provider that cannot honour it returns -EOPNOTSUPP. Errors as file_write. May
     * be NULL (-ENOSYS). */
    int (*upload_begin)(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                        int mode, const char *owner, struct lb_upload **out, struct lb_error *err);
    /* Give the file its mode and rename it to its path (replacing a file there). Consumes u:
     * on failure the temporary file is removed. */
    int (*upload_commit)(struct lb_upload *u, struct lb_error *err);
    /* Remove the temporary file and free u. Does not block on the sandbox. */
    void (*upload_abort)(struct lb_upload *u);
    /* Describe a failed write(2) to u->fd (errnum, with bytes written or tried so far) as this
     * provider's error: no space is -EFBIG naming the limit that was hit. May be NULL. */
    int (*upload_error)(struct lb_upload *u, int errnum, uint64_t bytes, struct lb_error *err);
    /* Make room for the file to hold need bytes (and, as far as the sandbox's memory has room
     * for them, up to want) before they are written to u->fd, so that what the sandbox holds
     * in memory is charged to the sandbox: on a memory-backed mount (tmpfs) of a sandbox with
     * a memory limit, a process in the sandbox's memory cgroup allocates the pages.
     * Idempotent (need already reserved returns at once); blocks for that process, at most a
     * few seconds. -EFBIG (413) when the sandbox's memory limit or the mount's size cannot
     * hold need bytes (nothing more stays reserved then). May be NULL (nothing to reserve). */
    int (*upload_reserve)(struct lb_upload *u, uint64_t need, uint64_t want, struct lb_error *err);

    /* Open the file at path inside the sandbox for reading. *fd_out is an O_RDONLY|O_CLOEXEC
     * descriptor the caller owns and *size_out its size. It need not be the sandbox's file
     * itself: a remote provider (docker) extracts the file from the engine's tar stream into
     * an unlinked temporary file on the daemon's host and returns that, reopened read-only.
     * -ENOENT if missing, -EISDIR if a directory, -EACCES if the sandbox's own root could not
     * read it either. */
    int (*file_open)(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                     int *fd_out, uint64_t *size_out, struct lb_error *err);

    /* Sandboxes of this provider that belong to this daemon instance: a new JSON array of
     * {"sandbox_id": ..., "descriptor": {...}} the caller owns. Used by reconciliation. */
    int (*list)(struct lb_provider *p, json_t **out, struct lb_error *err);

    /* Freeze / thaw every process of the sandbox. May be NULL (-ENOSYS). */
    int (*pause)(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_error *err);
    int (*resume)(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_error *err);

    /* A URL reaching the TCP port a server listens on inside the sandbox, from the daemon's
     * host: *url_out is a new string the caller frees. The caller checked the port was
     * declared. May be NULL (-ENOSYS). -ENOENT if the sandbox is gone. */
    int (*endpoint)(struct lb_provider *p, const struct lb_sandbox_ref *ref, int port,
                    char **url_out, struct lb_error *err);

    /* How many processes of the sandbox the OOM killer has ended so far, into *count, and
     * its memory limit in bytes into *limit_bytes (NULL: not wanted; 0 when unlimited).
     * -ENOENT when the sandbox is gone. May be NULL (-ENOSYS). */
    int (*oom_kills)(struct lb_provider *p, const struct lb_sandbox_ref *ref, uint64_t *count,
                     int64_t *limit_bytes, struct lb_error *err);

    /* The daemon is shutting down and will not wait for its execs any longer: kill the
     * process tree of every exec in flight (each answers LB_EXEC_SANDBOX, "the daemon is
     * shutting down ..."), and every exec started from now on answers so at once. Returns
     * how many execs were ended. May be NULL (nothing is ended). Thread-safe. */
    int (*end_execs)(struct lb_provider *p);

    /* The daemon is about to stop every sandbox and exit (the shutdown sweep): from now on a
     * stop may leave the removal of what a dead sandbox no longer needs (nothing that runs,
     * holds a resource limit, a network link, a mount or an id slot) to the provider's next
     * start, so that the sweep ends sooner. A stop still returns 0 only once the sandbox is
     * gone. Irreversible. May be NULL (stops stay as they are). Thread-safe. */
    void (*defer_cleanup)(struct lb_provider *p);

    /* Start stopping the sandbox without waiting for it (the local provider: SIGKILL its
     * init, so that its processes die while other stops run); the stop that must follow
     * finishes it, and is what says the sandbox is gone. Best effort: reports nothing. For
     * callers that stop many sandboxes at once (the shutdown sweep). May be NULL (nothing
     * happens until the stop). Thread-safe. */
    void (*stop_begin)(struct lb_provider *p, const struct lb_sandbox_ref *ref);

    /* Return the running sandbox in place to how its create made it with spec (the spec it
     * was made with, or one that differs only where the provider can say so): every process
     * of it killed, its writable file systems, IPC objects and hostname as new, its identity,
     * network and limits kept; its hostname hostname (NULL: ref->id, as its create set it).
     * Blocks until done, at most timeout_ms. -EOPNOTSUPP with nothing done when this sandbox
     * cannot be reset in place (the caller stops it and creates it again); -ENOENT when it is
     * not running; -EREMOTEIO when a step failed (the sandbox is in an unknown state: stop
     * it). May be NULL (-EOPNOTSUPP). Thread-safe across sandboxes; the caller runs one reset
     * per sandbox at a time, with nothing else under way in it. */
    int (*reset_in_place)(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                          const struct lb_sandbox_spec *spec, const char *hostname,
                          int64_t timeout_ms, struct lb_error *err);

    /* Capture the running sandbox's file system into dest, a directory the caller made (the
     * image store's image_snapshot_prepare) holding empty rootfs/ and workspace/: its writable
     * root layer into rootfs (the overlay upper dir as it is: whiteouts as 0:0 character
     * devices, opaque directories' trusted.overlay.opaque; with flatten its whole merged root
     * instead) and its workdir's contents into workspace, with symlinks, modes, owners
     * (shifted to the sandbox's own ids, 0..65535), timestamps, xattrs and hard links
     * (within rootfs, within workspace) kept. /tmp, /run, /dev/shm, /proc and processes are not
     * captured. A sandbox without an image ("host") captures only its workdir. The sandbox's
     * processes are frozen for the copy and thawed after it (a sandbox that was paused stays
     * paused). Blocks for the copy (seconds for hundreds of MiB). -ENOENT if the sandbox is
     * not running; -EREMOTEIO if its layer cannot be reached or copied (dest then holds a
     * partial copy the caller discards). May be NULL (-ENOSYS). Thread-safe across sandboxes;
     * the caller runs one snapshot per sandbox at a time. */
    int (*snapshot)(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *dest,
                    bool flatten, struct lb_error *err);

    /* Remove what the provider keeps outside the image store for snapshots (an engine's
     * images) that no tree of the image store names any more: a snapshot deleted, or one a
     * crash left unnamed. What a sandbox still runs on stays for a later sweep. Blocks for the
     * engine's answers. May be NULL (nothing kept). Call it with no snapshot of this provider
     * under way. 0, or a negative errno with err set (what could be removed was). */
    int (*snapshot_sweep)(struct lb_provider *p, struct lb_error *err);

    /* Release the provider and its memory; sandboxes keep running. */
    void (*destroy)(struct lb_provider *p);

    /* (version 3) What the running sandbox uses now into *out (struct lb_usage; every field
     * the host cannot tell is -1): cheap reads of its cgroup and storage, no process is
     * started. -ENOENT when the sandbox is gone, -LB_E_LOST when its record is there but its
     * init is not. May be NULL (-ENOSYS; lending then shows every field unknown). */
    int (*usage)(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_usage *out,
                 struct lb_error *err);

    /* (version 4) Directory transfer by tar archive (docs/api.md, "Archives").
     *
     * archive_put extracts the tar archive (gzip-compressed or not) read from fd (the daemon's,
     * borrowed, at its start) into the directory dir inside the sandbox (absolute, normalised,
     * not "/"; made when missing, its parents as file_write makes them). Paths confined as
     * file_write's: every entry lands inside dir. Refused with -EINVAL (400), nothing of the
     * archive left: a body that is not a tar, an absolute name or one with a ".." component, a
     * symlink whose target is absolute or climbs out of dir, a hard link to anything but an
     * earlier entry, a device node, FIFO or socket. Entries are the sandbox root's; modes keep
     * their permission and sticky bits (setuid/setgid dropped). Past the sandbox's storage or
     * past max_bytes of contents: -EFBIG (413), nothing left either. The entries are extracted
     * into a hidden directory and renamed into place once all are in. Files on a memory-backed
     * mount are charged to the sandbox's memory as upload_reserve charges them (-EFBIG past its
     * limit; -EBUSY, 409, while it is paused). *out: entries extracted and bytes of file
     * contents. May be NULL (-ENOSYS, 501).
     *
     * archive_get writes a tar (pax) of dir's tree to fd (the daemon's, borrowed, at its
     * current offset): directories, regular files and symlinks (not followed), names relative
     * to dir; other kinds are left out, as are kernel pseudo-file systems below dir. More than
     * max_bytes of archive: -EFBIG (413). -ENOTDIR (400) when dir is not a directory, -ENOENT
     * when missing. *out: entries written and bytes of archive. May be NULL (-ENOSYS). */
    lb_provider_archive_fn *archive_put;
    lb_provider_archive_fn *archive_get;

    /* Hand the running sandbox of ref (just reset in place with new_id as its hostname, nothing
     * of it running but what its create started) over to new_id, an id no sandbox had: every
     * op finds it under new_id (with *desc_out, the caller's) from then on, and no longer
     * under ref->id. A recycling pool's release (lend/recycle.c): the next episode gets the
     * sandbox under a new id without a stop and a create. The caller records new_id before the
     * call: a crash after it leaves the sandbox under one of the two ids, and a stop of each
     * finds it. -EEXIST when new_id names a sandbox, -ENOENT when ref's is not running,
     * -EREMOTEIO when it could not be handed over (nothing moved; stop it under ref->id).
     * May be NULL (-EOPNOTSUPP: the pool stops the sandbox and makes another). Thread-safe
     * across sandboxes. */
    int (*hand_over)(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *new_id,
                     json_t **desc_out, struct lb_error *err);
};

/* Every provider struct starts with this header. */
struct lb_provider {
    const struct lb_provider_ops *ops;
};

/* Call-through helpers: NULL-safe on optional ops (-ENOSYS). Same contracts as the ops. */
int provider_create(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                    const struct lb_sandbox_spec *spec, json_t **descriptor_out,
                    struct lb_error *err);
int provider_stop(struct lb_provider *p, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                  struct lb_error *err);
int provider_status(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                    enum lb_sandbox_status *out, struct lb_error *err);
int provider_exec(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                  const struct lb_exec_request *req, struct lb_exec_result *res,
                  struct lb_error *err);
int provider_file_write(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                        const void *data, size_t len, int mode, struct lb_error *err);
int provider_file_open(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                       int *fd_out, uint64_t *size_out, struct lb_error *err);
/* Streamed uploads (see the ops). commit and abort consume u; abort is NULL-safe. */
int provider_upload_begin(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                          int mode, const char *owner, struct lb_upload **out,
                          struct lb_error *err);
int provider_upload_commit(struct lb_upload *u, struct lb_error *err);
void provider_upload_abort(struct lb_upload *u);
int provider_upload_error(struct lb_upload *u, int errnum, uint64_t bytes, struct lb_error *err);
int provider_upload_reserve(struct lb_upload *u, uint64_t need, uint64_t want,
                            struct lb_error *err);
int provider_list(struct lb_provider *p, json_t **out, struct lb_error *err);
int provider_pause(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_error *err);
int provider_resume(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_error *err);
int provider_endpoint(struct lb_provider *p, const struct lb_sandbox_ref *ref, int port,
                      char **url_out, struct lb_error *err);
int provider_end_execs(struct lb_provider *p);
void provider_defer_cleanup(struct lb_provider *p);
void provider_stop_begin(struct lb_provider *p, const struct lb_sandbox_ref *ref);
int provider_oom_kills(struct lb_provider *p, const struct lb_sandbox_ref *ref, uint64_t *count,
                       int64_t *limit_bytes, struct lb_error *err);
int provider_snapshot(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *dest,
                      bool flatten, struct lb_error *err);
/* *out filled with -1 first, then the provider's usage op (-ENOSYS without one). */
int provider_usage(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_usage *out,
                   struct lb_error *err);
/* *out zeroed first, then the provider's archive_put / archive_get op (-ENOSYS without one). */
lb_provider_archive_fn provider_archive_put;
lb_provider_archive_fn provider_archive_get;
/* -EOPNOTSUPP (err set) when the provider has no reset_in_place op. */
int provider_reset_in_place(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                            const struct lb_sandbox_spec *spec, const char *hostname,
                            int64_t timeout_ms, struct lb_error *err);
/* -EOPNOTSUPP (err set) when the provider has no hand_over op; *desc_out NULL first. */
int provider_hand_over(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *new_id,
                       json_t **desc_out, struct lb_error *err);
/* 0 when the provider has no snapshot_sweep op. */
int provider_snapshot_sweep(struct lb_provider *p, struct lb_error *err);
void provider_destroy(struct lb_provider *p);
/* The provider's capabilities into *out (zeroed when ops->caps is NULL). Thread-safe. */
void provider_caps(struct lb_provider *p, struct lb_provider_caps *out);
/* Refuse a spec field the provider's capabilities lack: 0, or -EOPNOTSUPP (422) with a message
 * naming the field and the provider. Access "inherit" is the provider's own to interpret; it
 * does not check what only create can (servers' addresses, an image's contents). */
/* Refuse an exec request field the provider's capabilities lack (a user given by name without
 * caps.users; exclusive without caps.exclusive; exclusive without agent_root and without
 * caps.trusted_view): 0, or -EOPNOTSUPP (422 unenforceable) naming the field and the
 * provider. */
int provider_check_exec(struct lb_provider *p, const struct lb_exec_request *req,
                        struct lb_error *err);
int provider_check_spec(struct lb_provider *p, const struct lb_sandbox_spec *spec,
                        struct lb_error *err);

/* Is path absolute and normalised: starts with '/', no "." or ".." component, no "//", no
 * trailing '/' (except "/" itself), no NUL, at most 4096 bytes? */
bool provider_path_is_valid(const char *path);

/* Normalise an archive entry's name into out (size bytes): leading "./" and trailing '/'
 * dropped. 1 for the archive's root ("." or ""), 0 for a name, -EINVAL for a NULL or
 * absolute name, a ".." or "." component, an empty component or one past 255 bytes, a name
 * that does not fit, or more than max_parts components (max_parts 0: any number). */
int provider_archive_name_normalise(const char *in, char *out, size_t size, int max_parts);

/* Components an uploaded archive's entry name may have (every provider: deeper is 400). */
#define PROVIDER_ARCHIVE_MAX_DEPTH 256
/* Headers one archive may hold, either way; every header counts (the root's, repeated ones). */
#define PROVIDER_ARCHIVE_MAX_ENTRIES 200000
/* Bytes of entry names an upload may make the daemon keep in memory while it checks it. */
#define PROVIDER_ARCHIVE_MAX_NAME_BYTES (32u * 1024 * 1024)

/* Does a symlink of an uploaded archive at name (normalised by
 * provider_archive_name_normalise, relative to DIR) with this target stay inside DIR? The
 * target must be relative, may climb only with leading ".." components and never above DIR,
 * then only descend: a ".." after a name would climb from wherever that name leads when it is
 * itself a symlink (s -> "." and x -> "s/s/../.." read as staying inside, and lead two levels
 * above DIR). The one rule of every provider (local extraction, the engines' check). */
bool provider_archive_link_inside(const char *name, const char *target);

#endif
