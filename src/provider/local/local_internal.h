/*
 * local_internal.h - shared pieces of the local provider, private to the files of
 * src/provider/local/ (and its unit tests). Which file does what, from the top down; a file
 * calls only files below it in this map (and cgroup.c, seccomp.c, spawn.c), never one above
 * it:
 *
 * local.c      the top: ops table, construction, caps, destroy; status, list, pause, endpoint
 * create.c     create: bwrap argv, the double-fork spawn, waiting for the init
 * exec.c       exec: entering the namespaces and running lendbox-supervise
 * files.c      file_write / file_open through /proc/<init>/root with openat2
 * quiesce.c    the per-sandbox exec gate and the sweep before an exclusive exec
 * stop.c       stop: one stop per id at a time, and the teardown of a sandbox
 * relay.c      endpoint relays for sandboxes without a link
 * usage.c      the usage op: a sandbox's cgroup figures and its writable storage's bytes
 * image.c      a sandbox's writable copy-on-write root over an image (overlay on tmpfs)
 * userns.c     user namespaces mapping a sandbox's slot of ids (bwrap --userns, image idmap)
 * desc.c       sandbox ids and directories, descriptors (parse, save, load)
 * net.c, net_nft.c, net_policy.c, net_link.c   per-sandbox veth links and nftables egress
 *              rules (net.h)
 * slots.c      uid slots and their host-wide claims
 * child.c      fd helpers, async-signal-safe helpers for forked children, errno/E2BIG texts
 * proc.c       /proc reading, killing process trees and slots, reaping the daemon's children,
 *              what an in-place reset may keep of the init
 * Used only by the local provider: cgroup.c (cgroups), seccomp.c (the filter), spawn.c
 * (starting programs without a fork).
 */
#ifndef LB_PROVIDER_LOCAL_INTERNAL_H
#define LB_PROVIDER_LOCAL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <dirent.h>
#include <linux/capability.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "provider/gate.h"
#include "provider/local/cgroup.h"
#include "provider/local/local.h"
#include "provider/local/seccomp.h"
#include "provider/local/net.h"
#include "supervisor/signals.h"
#include "util/idclaim.h"

/* Host ids per sandbox: its user namespace maps ids 0..LOCAL_SLOT_IDS-1 (uids and gids) to
 * host ids slot..slot+LOCAL_SLOT_IDS-1, where slot (local_desc.uid) is the first id of a slot
 * of [uid_base, uid_base + uid_count * LOCAL_SLOT_IDS). */
#define LOCAL_SLOT_IDS 65536u
#define LOCAL_SLOT_IDS_TEXT "65536"
/* Host-wide claims of slots in use, one file per slot named by its first id (local.c). */
#define LOCAL_SLOT_CLAIM_DIR IDCLAIM_DIR

/* Where the supervisor appears inside every sandbox. */
#define LOCAL_SUPERVISE_PATH "/run/lendbox/supervise"
#define LOCAL_DEFAULT_WORKDIR "/workspace"
#define LOCAL_DESCRIPTOR_FILE "descriptor.json"
/* disk_mib of a sandbox whose spec sets none (lend normally fills in limits.default_disk_mib) */
#define LOCAL_DEFAULT_DISK_MIB 1024

/* Where a sandbox's workdir lives (local.storage). */
enum local_storage {
    LOCAL_STORAGE_TMPFS, /* a tmpfs of disk_mib inside the sandbox's mount namespace */
    LOCAL_STORAGE_DIR,   /* <data_dir>/<id> on the host, bind-mounted; no per-sandbox quota */
};

struct local_provider {
    struct lb_provider base;
    char *sandboxes_dir;  /* <state_dir>/sandboxes, absolute */
    char *state_dir;      /* realpath of the state dir */
    char *bwrap_path;     /* absolute */
    char *supervise_path; /* absolute */
    char *images_dir;     /* NULL: only "host" */
    struct lb_cgroup_host cg;
    uint32_t uid_base, uid_count; /* uid_count: slots of LOCAL_SLOT_IDS ids */
    char *claim_id;               /* "<dev>:<ino> <state dir>\n": the content of our slot claims */
    int64_t create_timeout_ms;
    int64_t tmp_size_mib;
    enum local_storage storage;
    char *data_dir;             /* storage dir: realpath of the data dir; else NULL */
    struct lb_seccomp seccomp;  /* installed in every sandbox process; len 0 when off */
    int64_t sandbox_nofile;     /* RLIMIT_NOFILE (soft = hard) of the init and every exec */
    bool reset_in_place;        /* local.reset_in_place: a reset may keep the namespaces */
    struct local_net_host *net; /* links and egress rules (net.h) */
    struct relay_host *relays;  /* endpoint relays of sandboxes without a link (relay.c) */
    /* reset_spare.c: the spare reset helper's keeper; NULL without in-place resets */
    struct local_reset_spare *reset_spare;
    struct local_clean_ns *clean_ns; /* mountns.c; NULL: bwrap starts in our namespace */

    /* Three small locks instead of one, so that the many stops of a shutdown sweep do not
     * queue behind each other: a stop takes stop_lock twice and lock once, uid_lock never. */
    pthread_mutex_t uid_lock;  /* serializes taking a slot (claim file, then bit) and uid_next */
    _Atomic uint8_t *uid_used; /* bitmap over the uid_count slots; read and cleared lock-free */
    uint32_t uid_next;         /* next-fit cursor (uid_lock) */
    pthread_mutex_t stop_lock; /* guards stopping, nstopping, stopping_cap */
    char **stopping;           /* ids being stopped right now (stops of one id run one at a time) */
    size_t nstopping, stopping_cap;
    struct local_begun *begun;          /* stop_lock: inits killed by stop_begin, for their stops */
    pthread_cond_t stopped;             /* with stop_lock: signalled when an id leaves stopping */
    pthread_mutex_t lock;               /* guards running and execs_ended */
    struct lb_gates gates;              /* exec admission per sandbox (gate.h; not under lock) */
    struct local_running_exec *running; /* execs whose helper runs (local_exec.c) */
    bool execs_ended;                   /* local_end_execs ran: the daemon is shutting down */

    /* Dead sandboxes' directories moved aside (stop.c): <state_dir>/removed/<id> */
    atomic_bool defer_removal; /* local_defer_cleanup ran: stops move directories aside */
    atomic_bool reaper_quit;   /* local_removed_stop: the reaper ends after its entry */
    atomic_bool removed_made;  /* move_aside made <state_dir>/removed (or found it) */
    pthread_t reaper;          /* removes what an earlier run moved aside */
    bool reaper_started;
};

/* One exec whose helper process runs, on its worker's stack (linked while it runs). */
struct local_running_exec {
    pid_t helper;
    const struct lb_cgroup *cg;
    bool ended; /* local_end_execs killed its process tree */
    struct local_running_exec *next;
};

/* A parsed descriptor. pid 0: the init never (or not yet) started. */
struct local_desc {
    pid_t pid;
    uint64_t start_time; /* field 22 of /proc/<pid>/stat */
    uint32_t uid;        /* first host id of the sandbox's slot: its root (uid and gid 0) */
    char workdir[4097];
    char data[4352]; /* storage dir: the host directory bound at workdir; "" for tmpfs */
    struct lb_cgroup cg;
    struct local_net net; /* mode LOCAL_NET_NONE: loopback only */
    char image[4352];     /* an image sandbox's image tree on the host (resolved, in the image
                             store), what its root's overlay is over; "" for image host or a
                             sandbox made before it was recorded */
    char name[129];       /* the id the sandbox was made under, which its cgroup and data directory
                             carry, when a hand-over (local_hand_over) gave it another; "" when it is
                             the sandbox's id */
};

/* ---- desc.c: ids, directories, descriptors -------------------------------------------------- */
/* Is id usable as a directory name ([A-Za-z0-9._-], 1..128, no leading '.')? */
bool local_id_is_valid(const char *id);
/* <sandboxes_dir>/<id> into buf. */
void local_sandbox_dir(const struct local_provider *lp, const char *id, char *buf, size_t size);

/* Load ref's descriptor (ref->descriptor, else <dir>/descriptor.json) and, while the
 * sandbox's directory exists, mark its uid used. -ENOENT when there is neither (the sandbox
 * is gone), -EINVAL when malformed. */
int local_desc_load(struct local_provider *lp, const struct lb_sandbox_ref *ref,
                    struct local_desc *d, struct lb_error *err);
/* local_desc_load for an operation that needs the sandbox's init alive: -ENOENT "sandbox '<id>'
 * is not running" (d released) when it is not. */
int local_desc_load_running(struct local_provider *lp, const struct lb_sandbox_ref *ref,
                            struct local_desc *d, struct lb_error *err);
/* The error for an operation on sandbox id whose init d names is not alive: -LB_E_LOST (410,
 * naming the pid) while its directory is still there and its init had started (nothing of
 * lendbox's removed it: a stop removes the directory last, and lending checks the record
 * before a client sees it), else -ENOENT "not running". */
int local_not_running(struct local_provider *lp, const char *id, const struct local_desc *d,
                      struct lb_error *err);
json_t *local_desc_to_json(const struct local_desc *d, const char *dir);
void local_desc_release(struct local_desc *d);
/* Write the descriptor atomically (temp file + rename) to <dir>/descriptor.json. */
int local_desc_save(const struct local_desc *d, const char *dir, struct lb_error *err);
/* local_desc_save into <in>/descriptor.json of a descriptor whose "dir" is dir (a hand-over
 * writes it before its directory is renamed to dir). */
int local_desc_save_in(const struct local_desc *d, const char *in, const char *dir,
                       struct lb_error *err);
/* Parse <dir>/descriptor.json into d (and, when raw is not NULL, its JSON into *raw, the
 * caller's). -ENOENT when it does not exist, -EINVAL when malformed. */
int local_desc_read_file(const char *dir, const char *id, struct local_desc *d, json_t **raw);

/* ---- slots.c: uid slots --------------------------------------------------------------------- */
/* Take a free slot of LOCAL_SLOT_IDS ids and claim it host-wide (a file in
 * LOCAL_SLOT_CLAIM_DIR), *uid its first; slots claimed by another lendboxd are skipped. -EUSERS
 * when every slot is in use here or elsewhere (or the claim dir is unusable, logged) / give one
 * back and drop its claim (both slots its ids reach into when uid is not slot-aligned: an
 * older version's sandbox). Thread-safe (uid_lock for a take; a give-back takes no lock). */
int local_uid_alloc(struct local_provider *lp, uint32_t *uid);
void local_uid_free(struct local_provider *lp, uint32_t uid);
/* Is uid the first host id of one of our slots (a sandbox's root)? */
bool local_uid_in_range(const struct local_provider *lp, uint32_t uid);
/* Mark the slot(s) of an adopted sandbox (uid: its first id) in use, here and host-wide (a
 * slot another lendboxd holds is logged, not refused). Thread-safe (uid_lock; none when already
 * marked). */
void local_uid_mark(struct local_provider *lp, uint32_t uid);
/* At start: make the claim dir and lp->claim_id (this daemon's identity in its claims). 0,
 * -EREMOTEIO or -ENOMEM. */
int local_claims_start(struct local_provider *lp, struct lb_error *err);
/* At start, after every live sandbox's slots are marked: drop our claims of slots that no
 * sandbox of all (local_list's array) uses any more. */
void local_claims_sweep(struct local_provider *lp, json_t *all);

/* ---- proc.c: /proc, killing, reaping -------------------------------------------------------- */
/* Record in the sandbox directory dir what the new sandbox's init (pid) has of what its
 * processes may change of it (its resource limits, nice value and CPUs: they run as its uid),
 * in dir/init.attrs. Best effort: without the record no reset keeps the init. */
void local_init_attrs_save(const char *dir, pid_t pid);
/* Are the init's (pid) limits, nice value and CPUs still what local_init_attrs_save recorded in
 * dir? false also when either cannot be read. An in-place reset keeps the init only then. */
bool local_init_attrs_kept(const char *dir, pid_t pid);
/* Start time (field 22 of /proc/<pid>/stat) of pid; -ENOENT when gone (a zombie counts as
 * gone). */
int local_proc_start_time(pid_t pid, uint64_t *start_time);
/* Parent pid and start time of pid from one read of /proc/<pid>/stat (a consistent pair);
 * 0, -ENOENT when gone (a zombie counts as gone), -EIO when it does not parse. Thread-safe. */
int local_proc_parent(pid_t pid, pid_t *ppid, uint64_t *start_time);
/* Is the sandbox's init the very process the descriptor names (pid + start time)? */
/* The next process id that readdir lists in d (an opendir("/proc")), or 0 at the end. */
pid_t local_proc_next_pid(DIR *d);
bool local_desc_alive(const struct local_desc *d);
/* Is that init alive but already exiting (killed: its namespace's processes are being killed,
 * and the namespace's teardown, e.g. an image root's mounts, may keep it a while)? */
bool local_desc_exiting(const struct local_desc *d);
/* Read at most size - 1 bytes of the file at path (a /proc file, read in one go) into buf and
 * NUL-terminate them: the byte count (> 0), or -1 when it cannot be opened or read or is
 * empty. Thread-safe. */
ssize_t local_read_small(const char *path, char *buf, size_t size);
/* Wait until deadline_ms (monotonic) for our child pid to exit and reap it; *status (may be
 * NULL) gets its wait status. 0, -ETIMEDOUT when it is still running (not reaped), -ECHILD
 * when it is not our child. */
int local_wait_child(pid_t pid, int64_t deadline_ms, int *status);

/* mountns.c: the clean mount namespace bwrap starts in a copy of (create.c moves the
 * sandbox's own img tree into that copy), so that no create copies or reads the mounts of
 * every other sandbox. local_clean_ns_open makes it: call once at the start, before any
 * create; 0, or a negative errno (logged; bwrap then starts in the daemon's namespace as
 * before). local_clean_ns_get returns a new fd of it (the caller closes it), made again first
 * when the host's mounts changed since (checked at most once a second), or -1 (none: start
 * in ours). local_clean_ns_close frees it (idempotent). Thread-safe but for open/close. */
int local_clean_ns_open(struct local_provider *lp);
int local_clean_ns_get(struct local_provider *lp);
void local_clean_ns_close(struct local_provider *lp);

/* reset_spare.c: one lendbox-supervise --reset-spare kept waiting for the next in-place reset
 * (an exec costs ~1 ms here). local_reset_spare_start starts the thread that keeps it (0 or a
 * negative errno; call once, while in-place resets are on); local_reset_spare_stop ends the
 * thread and the spare and frees them (idempotent). local_reset_spare_take hands the waiting
 * spare to the caller: its pid (our child) and in *sock our end of its socket, or 0 when none
 * waits (or fault reset.spare): the caller execs a helper of its own. After the reset the
 * caller gives it back: when its reset said "reset", by local_reset_spare_back, which waits
 * (until deadline_ms, at least 100 ms from now) for the spare to say it is back in its own
 * namespaces and counts it as waiting then, or else ends and reaps it; when the caller ended
 * and reaped it (a reset that failed), by local_reset_spare_lost; local_reset_spare_kill
 * kills, reaps and loses one the caller took and did not use. Either way the
 * next spare is started when none waits. A waiting spare that ends (killed by an operator or
 * the OOM killer) is reaped, logged and replaced by the keeper. Thread-safe. */
int local_reset_spare_start(struct local_provider *lp);
void local_reset_spare_stop(struct local_provider *lp);
pid_t local_reset_spare_take(struct local_provider *lp, int *sock);
void local_reset_spare_back(struct local_provider *lp, pid_t pid, int sock, int64_t deadline_ms);
void local_reset_spare_lost(struct local_provider *lp);
void local_reset_spare_kill(struct local_provider *lp, pid_t pid, int sock);
/* Reap our child pid whenever it exits, on a detached thread (for a child that did not exit
 * within a bound and must not be waited for inline). */
void local_reap_later(pid_t pid);
/* SIGKILL root and every descendant of it (one snapshot of /proc). The tree's processes are
 * first let out of cg's freezer (cgroup_unfreeze_procs; cg may be NULL) so that even frozen
 * ones die. Returns how many were signalled, or -errno. */
int local_kill_tree(pid_t root, const struct lb_cgroup *cg);
/* The same, then wait (at most wait_ms, for the first 256 of them) until the signalled
 * processes have ended: for an answer that says the command's processes are gone. */
int local_kill_tree_wait(pid_t root, const struct lb_cgroup *cg, int64_t wait_ms);
/* SIGKILL every process of session sid (its leader's pid as the host sees it; the leader is
 * gone) that lives in the sandbox d's pid namespace, and their descendants: what is left of
 * an exec whose supervisor died. Returns once they have ended (at most 2 s, the first 256).
 * How many were signalled, or -errno. */
int local_kill_session(const struct local_desc *d, pid_t sid);
/* SIGKILL every live process whose real uid is one of the slot's ids (uid: its first id, the
 * sandbox's root); a pid is pinned with a pidfd and its uid read again before the kill, so a
 * reused pid is safe. How many were still alive, or -errno. Scans all of /proc. */
int local_kill_uid(uint32_t uid);
/* Parent pid of pid (also of a zombie), or -1. */
pid_t local_proc_ppid(pid_t pid);
/* Real uid of pid and whether it is a zombie, from /proc/<pid>/status; 0, -ENOENT when gone,
 * -EIO when it does not parse. */
int local_proc_uid(pid_t pid, uint32_t *uid, bool *zombie);
/* Reap this process's zombie children that ran as one of the slot's ids (bwrap's monitor:
 * lendboxd is a child subreaper). Scans all of /proc. */
void local_reap_uid_children(uint32_t uid);

/* ---- stop.c: stop --------------------------------------------------------------------------- */
/* Kill the sandbox: SIGKILL the init and every process running as one of its slot's uids,
 * thaw, wait until they are gone, remove its cgroups and its directory, free the slot.
 * Idempotent. The slot is only swept and freed while the directory exists: once it is gone
 * the slot may already belong to a newer sandbox. The caller serialises calls for one id. */
int local_destroy_sandbox(struct local_provider *lp, const char *id, struct local_desc *d,
                          int64_t deadline_ms, struct lb_error *err);
/* The stop op (provider.h). */
int local_stop(struct lb_provider *p, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
               struct lb_error *err);
/* The stop_begin op (provider.h): SIGKILL the sandbox's init (checked as a stop checks it)
 * and keep its pidfds for the stop of the same id, which then waits on them instead of
 * killing. Best effort: nothing is kept when the descriptor, the init or a pidfd is not to be
 * had (that stop then does all of it). local_begun_release closes what no stop took (at
 * destroy). Thread-safe. */
void local_stop_begin(struct lb_provider *p, const struct lb_sandbox_ref *ref);
void local_begun_release(struct local_provider *lp);
/* Enter / leave the one stop of id allowed at a time (endpoint requests enter it too). Waiting
 * for a stop of the same id is bounded by deadline_ms (monotonic): -ETIMEDOUT past it; -ENOMEM.
 * Thread-safe (stop_lock). */
int local_stopping_enter(struct local_provider *lp, const char *id, int64_t deadline_ms);
void local_stopping_leave(struct local_provider *lp, const char *id);
/* The defer_cleanup op (provider.h): from now on a stop moves the dead sandbox's directory to
 * <state_dir>/removed/<id> (one rename) instead of removing its files, each of which a disk
 * mounted with discard frees synchronously (milliseconds apiece); the next start removes it.
 * Only after everything the directory accounts for is gone, as a removal would be. */
void local_defer_cleanup(struct lb_provider *p);
/* Start the thread that removes <state_dir>/removed (what an earlier run's shutdown sweep
 * moved aside), entry by entry. 0, or -errno of pthread_create (nothing is removed then; the
 * next start tries again). local_removed_stop ends it (after the entry under way) and waits. */
int local_removed_start(struct local_provider *lp);
void local_removed_stop(struct local_provider *lp);
/* How many stops so far swept /proc for the processes of a slot's ids (a stop without a live
 * init, or one whose sandbox still had processes outside its pid namespace once its init, its
 * monitor and its exec helpers were gone). Thread-safe. */
unsigned long local_slot_sweeps(void);

/* ---- create.c: sizes of the writable mounts ------------------------------------------------- */
/* The sizes in MiB of a sandbox's writable mounts, from its limits (create.c, "sizes of the
 * writable mounts"; docs/operations.md, "Sandbox storage"). */
struct mount_sizes {
    int64_t workdir_mib, tmp_mib, run_mib, shm_mib;
    int64_t root_mib; /* an image's writable root (its overlay upper dir) */
};
void local_mount_sizes(const struct local_provider *lp, const struct lb_resources *res,
                       struct mount_sizes *m);

/* ---- reset.c: in place ---------------------------------------------------------------------- */
/* The sandbox of ref (image host, storage tmpfs, spec->image "host": what it can be) returned
 * in place to how its create made it, keeping its namespaces, cgroup, network and uid slot
 * (lendbox-supervise --reset: its processes but the init killed, fresh /tmp, /run, /dev/shm and
 * workdir, SysV IPC and POSIX message queues removed, the hostname set to hostname, NULL: back
 * to ref->id). Blocks until done (bounded by timeout_ms). -EOPNOTSUPP with nothing done when the
 * sandbox is not one it can reset (the caller stops and creates it instead); -ENOENT when it is
 * not running; -EINVAL for an invalid id or hostname; -EREMOTEIO when a step failed (the sandbox
 * is then in an unknown state: the caller stops it). */
int local_reset(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                const struct lb_sandbox_spec *spec, const char *hostname, int64_t timeout_ms,
                struct lb_error *err);
/* What an in-place reset leaves for the usage op (usage.c): <dir>/usage-base.json, the CPU
 * time and OOM kills its cgroup had counted at the reset, and whether the memory peak could be
 * restarted; the usage op reports what came after. Best effort (a failure is logged: the
 * figures then include the episodes before). */
void local_usage_base_save(const char *id, const char *dir, const struct lb_cgroup *cg);
/* Subtract the base <dir>/usage-base.json holds (if any) from u: cpu_s and oom_kills (never
 * below 0); memory_peak_bytes -1 (unknown) when the reset could not restart the peak. */
void local_usage_base_apply(const char *dir, struct lb_usage *u);
/* The running sandbox of ref answers to new_id from now on (the provider op hand_over): its
 * directory renamed to <sandboxes_dir>/<new_id>, its descriptor naming the id it was made under
 * (its cgroup's name; local_desc.name). *desc_out its descriptor under new_id (the caller's).
 * -EEXIST when new_id's directory exists, -ENOENT when it is not running, -EINVAL for bad ids,
 * -EREMOTEIO when the rename failed (nothing moved), -ENOMEM. */
int local_hand_over(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *new_id,
                    json_t **desc_out, struct lb_error *err);

/* ---- child.c: fds, forked children, messages ------------------------------------------------ */
/* pipe2(O_CLOEXEC) into *r / *w; 0 or -errno. */
int local_pipe(int *r, int *w);
/* close(*fd) if open, then *fd = -1. */
void local_close_fd(int *fd);
/* Copy in to out, replacing every ": errno N" (what the forked children report, as they
 * cannot call strerror) with ": " and the error's text; E2BIG names the kernel's limits. */
void local_errno_text(const char *in, char *out, size_t size);
/* "argument list too long (limit ...)": E2BIG with the limits that apply, into buf. */
void local_describe_e2big(char *buf, size_t size);
/* Would execve(argv, envp) fail with E2BIG? 0, or -E2BIG with a sentence naming the limit
 * that is passed in why. */
int local_check_exec_args(const char *const *argv, const char *const *envp, char *why,
                          size_t why_len);
/* Helpers for the forked children: only async-signal-safe work (and sup_signals_reset of
 * supervisor/signals.h, which lendbox-supervise shares). */
/* Move fds[i] to number i for i < n (collision-safe); 0 or -errno. */
int local_child_place_fds(const int *fds, int n);
/* Write a fixed message plus an errno number to fd. */
void local_child_report(int fd, const char *msg, int err_no);
/* Join a new anonymous session keyring (KEYCTL_JOIN_SESSION_KEYRING), so that nothing of the
 * daemon's session keyring, nor of another sandbox's or exec's, is reachable as @s. Call while
 * still host root, before entering the sandbox's user namespace: the keyring then belongs to
 * root and counts against root's key quota, not the 200 keys of the sandbox's root's host id
 * (else 200 live background processes of separate execs would block every further exec; each
 * other id of the sandbox's slot has a quota of its own), and only its
 * possessors (this process and its descendants) may use it. A kernel without keys (ENOSYS)
 * counts as done, and so does EPERM when local_keyrings_probe found that the host refuses the
 * keyring calls to the daemon: then they are refused to every sandbox process too and there is
 * no shared keyring to keep apart. 0 or -1 with errno. */
int local_child_new_session_keyring(void);
/* Find out once, at the provider's start and before any sandbox exists, whether the host
 * refuses the keyring calls to the daemon (a container's syscall filter: systemd-nspawn's
 * default, Docker's, Kubernetes' RuntimeDefault), by joining a session keyring in a forked
 * child: refused means EPERM while the daemon runs under a seccomp filter (which every process
 * it starts inherits). Logs a warning once when refused; later calls do nothing. Not
 * thread-safe: call before sandboxes are made. */
void local_keyrings_probe(void);
/* What local_keyrings_probe found: true when the host refuses the keyring calls. Thread-safe
 * (read-only after the probe). */
bool local_keyrings_refused(void);

/* ---- userns.c: user namespaces -------------------------------------------------------------- */
/* A new user namespace mapping uids and gids 0..count-1 to host ids first..first+count-1,
 * owned by host uid owner (0: by the daemon; a sandbox's is owned by its slot's first id, so
 * bwrap running as that id may join it). *fd_out gets an O_CLOEXEC fd of it (the caller's;
 * it alone keeps the namespace alive: no process is left running). Made by a short-lived
 * helper that dies with the daemon. Thread-safe. 0 or a negative errno. */
int local_userns_open(uid_t owner, uid_t first, uint32_t count, int *fd_out);

/* ---- image.c: image roots ------------------------------------------------------------------- */
#define LOCAL_IMAGE_WORKSPACE "workspace"

/* A writable copy-on-write root for the sandbox in dir. Mounts, in the daemon's mount
 * namespace, a tmpfs of upper_mib MiB owned by uid at <dir>/img holding the overlay's upper and
 * work dirs and the sandbox's workspace; image_root read-only, nosuid, nodev and idmapped
 * 0..65535 -> uid..uid+65535 (the slot) at <dir>/img/lower; and overlayfs of the two at
 * <dir>/img/root, whose path goes into root_out. On error err is set and what was mounted stays
 * for local_image_unmount. Not thread-safe for one dir; different dirs in parallel are fine.
 * Returns 0 or a negative errno. */
#define LOCAL_IMAGE_LAYERS_MAX 8
/* layers: n trees, top first (image_layers); n 1: the image's tree idmapped at lower/; n > 1: a
 * snapshot's trees idmapped at layers/N and a read-only overlay of them at lower/; n 0: only
 * the tmpfs and its workspace (a host root seeded from a snapshot; root_out gets ""). */
int local_image_mount(const char *dir, const char *const *layers, size_t n, uid_t uid,
                      int64_t upper_mib, char *root_out, size_t size, struct lb_error *err);
/* A snapshot's workspace for the sandbox in dir (after local_image_mount): the stored tree
 * stored (owners 0..65535) read-only, nosuid, nodev and idmapped to the slot at uid at
 * <dir>/img/ws-lower, and overlayfs of it with an upper and work dir on the sandbox's tmpfs
 * mounted at its workspace (local_image_workspace), so nothing of the tree is copied and the
 * sandbox's writes count against its disk size. On error err is set and what was mounted
 * stays for local_image_unmount. Same thread-safety as local_image_mount. 0 or a negative
 * errno (-EREMOTEIO: the tree is unreadable or a mount failed). */
int local_image_mount_workspace(const char *dir, const char *stored, uid_t uid,
                                struct lb_error *err);
/* Does the stored workspace tree hold a character or block device (or an entry it cannot
 * read)? Snapshots captured before the capture refused them in the workdir may hold 0:0 nodes,
 * which as an overlay's lower layer would act as whiteouts: such a tree is copied
 * (local_tree_restore), not mounted. Thread-safe. */
bool local_image_workspace_has_devices(const char *stored);
/* Detach (one lazy unmount) and remove whatever local_image_mount left under dir (none of it:
 * 0). Returns 0 or a negative errno. */
int local_image_unmount(const char *dir, struct lb_error *err);
/* The workspace directory on an image sandbox's root tmpfs (bound at the workdir with storage
 * tmpfs, so / and the workdir share the sandbox's disk size) into out. */
void local_image_workspace(const char *dir, char *out, size_t size);

/* ---- usage.c: what a sandbox uses ------------------------------------------------------------ */
/* The usage op (provider.h): its cgroups' figures and its writable storage's bytes in use. */
int local_usage(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_usage *out,
                struct lb_error *err);

/* ---- snapshot.c: capture and restore of a sandbox's file system ------------------------------ */
/* The snapshot op (provider.h). */
int local_snapshot(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *dest,
                   bool flatten, struct lb_error *err);
/* Copy the contents of the directory src into the directory dst (cp -a: modes, owners, links,
 * xattrs, timestamps), then shift every owner of dst's tree by adding to (ids 0..65535 become
 * to..to+65535). Returns 0 or a negative errno with err set. */
int local_tree_restore(const char *src, const char *dst, uid_t to, struct lb_error *err);

/* ---- relay.c: endpoint relays --------------------------------------------------------------- */
/* init: -ENOMEM. endpoint: the URL of the relay of (id, port), made on first use; *url_out is
 * the caller's; -EREMOTEIO when it cannot be made. close: end the relays of id (NULL: all) and
 * wait for their threads. */
int local_relay_init(struct local_provider *lp);
int local_relay_endpoint(struct local_provider *lp, const char *id, const struct local_desc *d,
                         int port, char **url_out, struct lb_error *err);
void local_relay_close(struct local_provider *lp, const char *id);
void local_relay_destroy(struct local_provider *lp);

/* ---- create.c, exec.c, files.c: ops (provider.h) ------------------------------------------- */
int local_create(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                 const struct lb_sandbox_spec *spec, json_t **descriptor_out, struct lb_error *err);
int local_end_execs(struct lb_provider *p);
int local_exec(struct lb_provider *p, const struct lb_sandbox_ref *ref,
               const struct lb_exec_request *req, struct lb_exec_result *res, struct lb_error *err);
int local_file_write(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                     const void *data, size_t len, int mode, struct lb_error *err);
int local_upload_begin(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                       int mode, const char *owner, struct lb_upload **out, struct lb_error *err);
int local_upload_commit(struct lb_upload *u, struct lb_error *err);
void local_upload_abort(struct lb_upload *u);
int local_upload_error(struct lb_upload *u, int errnum, uint64_t bytes, struct lb_error *err);
int local_upload_reserve(struct lb_upload *u, uint64_t need, uint64_t want, struct lb_error *err);
int local_file_open(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                    int *fd_out, uint64_t *size_out, struct lb_error *err);

/* What files.c shares with archive.c: acting for a sandbox on its own root (files.c's head
 * comment). A thread's identity while it acts for a sandbox (per thread; not shared). */
struct local_fs_identity {
    int old_fsuid, old_fsgid;
    struct __user_cap_header_struct cap_hdr;
    struct __user_cap_data_struct caps[2];
    bool active;
};
/* Take the sandbox's host uid as fsuid/fsgid and drop every effective capability, on this
 * thread only; leave restores both (idempotent). 0 or -EREMOTEIO with err set. */
int local_fs_enter(struct local_fs_identity *id, uint32_t uid, struct lb_error *err);
void local_fs_leave(struct local_fs_identity *id);
/* openat2(rootfd, path, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS): an fd or -errno. */
int local_open_in_root(int rootfd, const char *path, uint64_t flags, uint64_t mode);
/* An errno of a path operation as this provider's error (ENOSPC is -EFBIG, ...). */
int local_map_errno(int e, const char *path, struct lb_error *err);
/* Load d and open /proc/<init>/root of the running sandbox into *rootfd (path is checked
 * first: absolute, normalised, not "/"). The caller closes *rootfd and releases d. */
int local_open_root(struct local_provider *lp, const struct lb_sandbox_ref *ref,
                    struct local_desc *d, const char *path, int *rootfd, struct lb_error *err);
/* O_PATH fd of directory dir inside the root, missing components made 0755; or -errno. */
int local_open_parent(int rootfd, const char *dir);
/* Is dfd/name (not followed) the root of another mount than dfd's? */
bool local_is_mount_point(int dfd, const char *name);

/* Have the sandbox's memory cgroup allocate bytes of the new file fd (the daemon's, borrowed)
 * before the daemon writes them, when fd is on a memory-backed mount (tmpfs, an image's
 * overlay root) and the sandbox has a memory cgroup: the pages are then the sandbox's, as
 * upload_reserve makes them (one run of the reserve helper). 0 when done or not needed;
 * -EFBIG (413) when the sandbox's memory limit or the mount cannot hold them (nothing stays
 * allocated); -EBUSY (409) when the sandbox is paused (cgroup v2); -EREMOTEIO. Blocks briefly. */
int local_memory_reserve_fd(struct local_provider *lp, const struct local_desc *d, int fd,
                            uint64_t bytes, const char *path, struct lb_error *err);

/* ---- archive.c: archive_put / archive_get (provider.h) ----------------------------------------
 */
lb_provider_archive_fn local_archive_put;
lb_provider_archive_fn local_archive_get;

/* ---- quiesce.c: the exec gate, quiescing ---------------------------------------------------- */
/* Exec admission per sandbox is lp->gates (gate.h): an exclusive exec runs alone.
 * Free the gate table (at destroy, when no exec runs). */
void local_exec_gates_release(struct local_provider *lp);
/* Stop every process of the sandbox but its init, for an exclusive exec that holds the gate:
 * freeze the cgroup (when there is a freezer), SIGKILL every process in the init's pid
 * namespace except the init, thaw; again until none is left and no other exec of the sandbox
 * is in flight, or deadline_ms (monotonic) passes (-ETIMEDOUT). Processes of the daemon (the
 * exec helpers, which stay in the host's pid namespace) are never touched. */
int local_sandbox_quiesce(struct local_provider *lp, const char *id, const struct local_desc *d,
                          int64_t deadline_ms, struct lb_error *err);

#endif
