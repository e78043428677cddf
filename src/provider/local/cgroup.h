/*
 * cgroup.h - the local provider's cgroups: one cgroup per sandbox for limits, freezing and
 * grouping, on cgroup v2 or v1 (private to src/provider/).
 *
 * v2 (production: /sys/fs/cgroup is cgroup2): <mount><base>/<id>, where the controllers the
 * limits need are enabled (best effort) in every ancestor's cgroup.subtree_control.
 * v1 (this machine is a v1/v2 hybrid whose v2 holds no controllers): the same relative path
 * in each of the memory, pids, cpu and freezer hierarchies, and also in the controller-less
 * hierarchies systemd tracks its units' processes by (name=systemd, and the hybrid layout's
 * cgroup2 "unified"), so that no sandbox process is counted, signalled or warned about as one
 * of the lendboxd unit's (these two also when no controller is usable; they limit nothing).
 * A hierarchy that is mounted read-only or where the base cannot be made is left out, with a
 * warning, at detection.
 * <base> is cgroup_parent (a leading '/' is optional) below the hierarchy's root: outside
 * the daemon's own (systemd service) cgroup, so stopping or restarting the service does not
 * kill the sandboxes (DESIGN.md invariant 6), and neither do its limits bound them.
 *
 * Thread-safety: a struct lb_cgroup_host is read-only after cgroup_host_detect; the functions
 * touch only their arguments and the cgroup filesystem.
 */
#ifndef LB_PROVIDER_CGROUP_H
#define LB_PROVIDER_CGROUP_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "provider/provider.h"
#include "util/error.h"

#define LB_CGROUP_MAX_DIRS 6

/* The host's cgroup layout: where new sandbox cgroups go. version 0: none usable. */
struct lb_cgroup_host {
    int version;
    int nbase;
    char *base[LB_CGROUP_MAX_DIRS]; /* absolute parent dirs of the sandbox cgroups */
    /* v1: the controller of each base, or "systemd"/"unified" for the tracking-only ones;
     * v2: "unified" */
    const char *ctrl[LB_CGROUP_MAX_DIRS];
};

/* One sandbox's cgroup directories (one on v2, one per hierarchy on v1). */
struct lb_cgroup {
    int version; /* 0: the sandbox has no cgroup */
    int ndirs;
    char *dirs[LB_CGROUP_MAX_DIRS];
};

/* Find the cgroup hierarchies and the parent dirs for parent (e.g. "lendbox"; NULL means
 * "lendbox"), and make those parent dirs. A read-only or otherwise unusable hierarchy is
 * logged (warn) and left out. Never fails hard: without usable cgroups h->version is 0.
 * Returns 0 or -ENOMEM. */
int cgroup_host_detect(struct lb_cgroup_host *h, const char *parent);
void cgroup_host_release(struct lb_cgroup_host *h);

/* Make the sandbox cgroup(s) for id and apply res. -EOPNOTSUPP when a requested limit cannot
 * be enforced; other failures are -EREMOTEIO. Nothing is left behind on failure. */
int cgroup_create(const struct lb_cgroup_host *h, const char *id, const struct lb_resources *res,
                  struct lb_cgroup *out, struct lb_error *err);

/* Where id's cgroups would be on this host (for cleaning up without a descriptor). */
int cgroup_guess(const struct lb_cgroup_host *h, const char *id, struct lb_cgroup *out);

/* JSON form for the descriptor: null (no cgroup) or {"version": N, "dirs": [...]}. New ref. */
json_t *cgroup_to_json(const struct lb_cgroup *cg);
/* Parse and check a descriptor's cgroup (dirs must be under /sys/fs/cgroup and end in /id).
 * j NULL or null gives version 0. -EINVAL on a malformed value, -ENOMEM. */
int cgroup_from_json(const json_t *j, const char *id, struct lb_cgroup *out);

/* Open each dir's cgroup.procs for writing (O_CLOEXEC) into fds[0..*n). A process joins by
 * writing "0" to each (async-signal-safe). On failure nothing stays open. */
int cgroup_open_procs(const struct lb_cgroup *cg, int fds[LB_CGROUP_MAX_DIRS], int *n);

/* Open the cgroup.procs of the sandbox's memory cgroup for writing (O_CLOEXEC) into *fd: on v1
 * the memory hierarchy's dir alone (not the freezer's, so a process that joins it is not
 * frozen by a pause), on v2 the sandbox's cgroup. A process joins by writing "0". -ENOENT
 * when the sandbox has no memory cgroup (no memory limit), else -errno. */
int cgroup_open_memory_procs(const struct lb_cgroup *cg, int *fd);
/* The path of the sandbox's memory usage counter (v1 memory.usage_in_bytes, v2
 * memory.current, in bytes) into buf. -ENOENT without a memory cgroup (or buf too small). */
int cgroup_memory_usage_path(const struct lb_cgroup *cg, char *buf, size_t size);

/* Freeze or thaw every process in the cgroup and wait (bounded by timeout_ms) until the
 * kernel says it is done. -ENOSYS without a freezer. */
int cgroup_set_frozen(const struct lb_cgroup *cg, bool frozen, int64_t timeout_ms,
                      struct lb_error *err);
/* *out = whether the cgroup is frozen (false without a freezer). */
void cgroup_is_frozen(const struct lb_cgroup *cg, bool *out);

/* true when every dir of the cgroup exists and lists no process in its cgroup.procs (a
 * zombie is listed until reaped); false otherwise, also without a cgroup (version 0) or when a
 * file cannot be read, so that a caller falls back to a search of its own. */
bool cgroup_is_empty(const struct lb_cgroup *cg);

/* Let the processes pids[0..n) of a frozen sandbox run again, without thawing the rest of it,
 * so that a kill can end them: on v1, whose freezer keeps even a SIGKILLed task frozen, each
 * is moved into the (never frozen) parent of the sandbox's freezer cgroup; on v2 a fatal
 * signal ends a frozen task anyway, and nothing is done. Best effort: returns how many could
 * not be moved (a process already gone counts as moved). */
int cgroup_unfreeze_procs(const struct lb_cgroup *cg, const pid_t *pids, size_t n);

/* How many times the kernel's OOM killer ended a process of the cgroup because of its memory
 * limit (v1 memory.oom_control, v2 memory.events: "oom_kill"), into *count; and the memory
 * limit in bytes into *limit_bytes (0: none). -ENOENT when the sandbox has no memory cgroup
 * (no memory limit was asked for), -EIO when the files cannot be read. Either out may be
 * NULL. */
int cgroup_read_oom_kills(const struct lb_cgroup *cg, uint64_t *count, int64_t *limit_bytes);

/* What the cgroup's processes use now, into out's cpu_s, memory_bytes, memory_peak_bytes, pids
 * and oom_kills (the others are left as they are); a figure no file of this host tells stays
 * -1 (out must come in filled with -1). cpu_s: v2 cpu.stat usage_usec (also the hybrid
 * layout's controller-less cgroup2 "unified" dir has it), else v1 cpuacct.usage; memory: v2
 * memory.current and memory.peak, v1 memory.usage_in_bytes and memory.max_usage_in_bytes (on
 * v1 only a sandbox with a memory limit has a memory cgroup); pids: pids.current, else the
 * number of processes its cgroup.procs lists; oom_kills as cgroup_read_oom_kills. Reads only. */
void cgroup_read_usage(const struct lb_cgroup *cg, struct lb_usage *out);
/* Restart the memory peak cgroup_read_usage reads at what is charged now: v1
 * memory.max_usage_in_bytes (true, also when there is no memory cgroup); false on v2, whose
 * memory.peak restarts only for reads through the same open file (an in-place reset then
 * reports no peak). */
bool cgroup_restart_peak(const struct lb_cgroup *cg);

/* Remove the cgroup dirs (already-gone counts as done), retrying while they are busy until
 * deadline_ms (monotonic). A dir on a read-only cgroup file system is not a failure: one that
 * does not exist was never made, one that does is left (warn) since no retry can remove it.
 * -ETIMEDOUT if still busy, -EREMOTEIO on other failures. */
int cgroup_remove(const struct lb_cgroup *cg, int64_t deadline_ms, struct lb_error *err);
/* cgroup_remove of the dirs of cg that removed (may be NULL) does not name: removed is a
 * cgroup that cgroup_remove has just removed (a stop removes the descriptor's dirs, then
 * the ones this host would have made for the id, and needs no second rmdir of each path
 * both name: on cgroupfs a path walk is not free, and a shutdown sweep makes thousands).
 * Same errors. Thread-safe (the caller owns both). */
int cgroup_remove_except(const struct lb_cgroup *cg, const struct lb_cgroup *removed,
                         int64_t deadline_ms, struct lb_error *err);

void cgroup_release(struct lb_cgroup *cg);

#endif
