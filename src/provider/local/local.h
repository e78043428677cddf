/*
 * local.h - the embedded default provider: Linux-namespace sandboxes on this machine, made
 * with bubblewrap (DESIGN.md "The local provider").
 *
 * One sandbox = one bwrap-started init (lendbox-supervise --init, pid 1 of a new pid
 * namespace) in new user, pid, mount, uts, ipc and net namespaces. Its user namespace maps
 * a slot of 65536 host ids of its own, taken from [uid_base, uid_base + uid_count * 65536):
 * sandbox uid/gid N is host id slot + N (the sandbox's root maps to the slot's first id, so no
 * sandbox process is ever host root, and any in-sandbox user of /etc/passwd can run). Its directory
 * <state_dir>/sandboxes/<id>/ holds descriptor.json. Its writable storage never lives on the state
 * dir's file system: the workdir is a tmpfs of resources.disk_mib inside the sandbox's mount
 * namespace (storage "tmpfs", the default), or a directory <data_dir>/<id> bind-mounted there
 * (storage "dir"). Sandboxes are not tied to the daemon's life: a restarted daemon execs in and
 * stops them through their descriptor (pid + start time).
 */
#ifndef LB_PROVIDER_LOCAL_H
#define LB_PROVIDER_LOCAL_H

#include <stdint.h>

#include "provider/provider.h"

/* [network]: per-sandbox links and egress rules (see local_net.h). */
struct lb_local_net_config {
    const char *range;     /* IPv4 CIDR the /31 of each link comes from; NULL: 10.213.0.0/16 */
    const char *inherit;   /* what access "inherit" means: "none" (loopback only) or "nat" */
    const char *nft_table; /* name of the nftables inet table; NULL: "lendbox" */
    int api_port;          /* the daemon's API port, refused to every sandbox; 0: none */
};

struct lb_local_config {
    const char *state_dir;      /* daemon state dir; sandboxes live in <state_dir>/sandboxes */
    const char *bwrap_path;     /* "bwrap" is looked up in PATH */
    const char *supervise_path; /* the static lendbox-supervise binary */
    const char *images_dir;     /* directory of image root trees; NULL: only "host" */
    const char *cgroup_parent;  /* cgroup name for sandboxes, e.g. "lendbox" */
    uint32_t uid_base;  /* first host uid for sandboxes, a multiple of 65536, e.g. 100007936 */
    uint32_t uid_count; /* slots of 65536 ids (= max concurrent sandboxes), e.g. 4096 */
    int64_t create_timeout_ms; /* bound on a sandbox becoming ready; <= 0: 10000 */
    int64_t tmp_size_mib;      /* size of the sandbox's /tmp tmpfs; <= 0: 1024 (/run: 64) */
    const char *storage;       /* the workdir: "tmpfs" (NULL: the default) or "dir" */
    const char *data_dir;      /* storage "dir": where workdirs live; NULL: <state_dir>/data */
    bool seccomp_off;          /* true: no seccomp filter (the default filter is on) */
    const char *seccomp_deny;  /* extra syscalls to refuse, see provider/seccomp.h */
    int64_t sandbox_nofile; /* RLIMIT_NOFILE of sandbox processes (not the daemon's); <= 0: 1024 */
    bool reset_in_place;    /* a reset may keep the sandbox's namespaces (local.reset_in_place,
                               default yes) */
    struct lb_local_net_config net;
};

/* Make a local provider. Checks bwrap and the supervisor exist and builds the seccomp filter.
 * *out is owned by the caller (provider_destroy). Errors: -ENOENT (bwrap or supervisor
 * missing), -EINVAL (bad config, e.g. an unknown name in seccomp_deny, or uid_base not a
 * multiple of 65536), -EREMOTEIO (state dir or the host-wide claim dir /run/lendbox/slots
 * unusable), -ENOMEM. Slots in use are claimed host-wide (one file per slot under
 * /run/lendbox/slots naming the state dir), so providers of several daemons, even with the
 * same uid_base, never share a slot; at start the slots of adopted sandboxes are claimed again
 * and this state dir's claims of no sandbox are dropped. */
int provider_local_new(const struct lb_local_config *cfg, struct lb_provider **out,
                       struct lb_error *err);

#endif
