/*
 * lxd.h - the LXD provider (provider.name = lxd): one LXD container per sandbox, on one LXD
 * server or anywhere in an LXD cluster, through the LXD REST API (httpc.c, libcurl) on a
 * member's unix socket or over HTTPS with a client certificate and the cluster certificate's
 * key pinned. Tested against Debian 12's lxd 5.0.2.
 *
 * Identity. The instance is named by the sandbox id ("sbx-..." is a valid instance name) and
 * carries the config keys user.lendbox.instance=<instance> and user.lendbox.sandbox=<id> (LXD's
 * labels), so it is found and stopped from the id alone, a create retried after a crash finds
 * the first instance ("already exists") instead of making a second, and list returns exactly
 * this daemon's instances (GET /1.0/instances?filter=config.user.lendbox.instance eq I). The
 * descriptor is {"name", "location" (the member), "workdir", "id_base" (the first host id of its
 * id range; absent when not known)}.
 *
 * Spec mapping. The instance is created with no profile and one device, the root disk on the
 * default profile's pool, so it has no NIC (loopback only) whatever the profiles say.
 * security.idmap.isolated=true (its own uid/gid range on the host); resources.cpu ->
 * limits.cpu.allowance (cpu*100 ms per 100 ms), memory_mib -> limits.memory (no swap), pids ->
 * limits.processes, disk_mib -> the root device's size: refused (422) on a pool whose driver
 * has no quotas ("dir"). network: only no network (access absent or "inherit" with
 * network.inherit = none); declared ports are 422. Placement is the cluster's (its scheduler),
 * unless lxd.target names a member or a cluster group ("@group").
 *
 * Id ranges. Each instance's isolated range is lendbox's choice, not LXD's (LXD 5.0.2 gave
 * isolated instances started at once overlapping ranges, and two members on one host allocate
 * from one range each on their own): security.idmap.base is a slot of 65536 ids from
 * lxd.idmap_base/idmap_count (default: root's range in this host's /etc/subuid and /etc/subgid,
 * less its first 65536 ids), security.idmap.size 65536, taken by the create from a table
 * claimed host-wide like the local provider's slots (util/idslots.h, /run/lendbox/slots) and
 * given back when the instance is removed. A listing (the start's reconciliation) marks the
 * slot of every instance of this daemon from its config (security.idmap.base, or
 * volatile.idmap.base for one LXD placed) and drops claims that no instance accounts for. So
 * creates run in parallel, at most lxd.create_concurrency making and starting at once.
 *
 * Exec: the static lendbox-supervise is pushed into every instance at create
 * (/run/lendbox/supervise, files API) and each command runs as
 *   /run/lendbox/supervise --framed --max-output N --timeout-ms MS --cwd DIR [...] -- ARGV
 * through LXD's exec with record-output (no websocket): the operation is awaited, the recorded
 * stdout (the supervisor's frames, framed.h) and stderr are fetched and deleted. The timeout and
 * the tree kill happen inside the instance (the supervisor); output is capped there too. stdin
 * goes in first as a file (--stdin-file). pass_fd is not offered (caps); an exclusive exec passes
 * --exclusive --spare-init-session (the image's init keeps its own children) and no other exec of
 * the instance runs meanwhile (-EBUSY); activations run with their receipt as a file inside the
 * instance (caps.receipt_file), read back through the files API.
 *
 * Files: the files API, always with Content-Type: application/octet-stream (LXD 5.0.2 answers
 * 200 and writes an empty file when a body arrives as a form), parents made one by one
 * (X-LXD-type: directory). Reads are spooled into an unlinked temporary file on the host
 * (<state_dir>/lxd-spool), at most 1 GiB (-EFBIG past it).
 *
 * Snapshots, fork and reset (lxd_snapshot.c; engine.h "snapshots"): a snapshot is an LXD copy
 * of the frozen instance (instance only, on its member) into a stopped instance "lbs-<hex>"
 * labelled user.lendbox.snapshot=<instance> and without the sandbox labels, never started; a
 * seed from it is another copy, its source sandbox's limits unset. /tmp, /run and /dev/shm are
 * tmpfs mounts (raw.lxc), so no copy carries them. A reset is the generic remove and create
 * under the same name (caps.reset).
 *
 * Failure semantics. Every call is bounded by lxd.call_timeout_s (a member that is down makes
 * LXD itself wait ~10 s and answer 500); a stop by the caller's timeout as well. 404 means gone
 * (stop succeeds); a 500, an error state or a timeout is -EREMOTEIO / -ETIMEDOUT (502): the
 * record stays stop_failed for the retry loop. A seed fails fast with 502 when the cluster has
 * no Online member (or lxd.target names a member that is not Online). Each call is counted by
 * member (lendbox_lxd_member_calls_total / _failures_total{member=...}).
 *
 * Thread-safety: as provider.h.
 */
#ifndef LB_PROVIDER_LXD_H
#define LB_PROVIDER_LXD_H

#include "provider/engine/engine_config.h"
#include "provider/provider.h"

struct lb_lxd_config {
    struct engine_config engine;     /* socket (a member's; or none and url:), default image (an
                                      * LXD image alias), instance label, state dir, supervisor,
                                      * net_inherit */
    const char *url;                 /* "https://host:port" of a member */
    const char *cert, *key;          /* url: the client certificate and key (PEM files) */
    const char *server_cert;         /* url: the cluster's certificate (PEM): its key is pinned */
    const char *target;              /* member or "@group" for new instances; NULL: the cluster's */
    int64_t call_timeout_ms;         /* bound on each API call (not an exec's own run) */
    int64_t create_timeout_ms;       /* bound on a whole create */
    int64_t create_concurrency;      /* instances made and started at once (<= 0: 8) */
    int64_t idmap_base;              /* first host id of the instances' id slots (a multiple of
                                      * 65536); 0: from root's /etc/subuid and /etc/subgid here */
    int64_t idmap_count;             /* slots of 65536 ids; 0: as many as root's range holds */
    const char *supervise_host_path; /* the supervisor's path on every member's host (the same
                                      * build as engine.supervise_path), bound read-only into
                                      * each instance; NULL: pushed through the files API */
};

/* Make the provider: reads the supervisor (and checks supervise_host_path: a plain path, the
 * same bytes where this host has it, else a warning), checks the server answers GET /1.0 as
 * trusted, has every API extension this provider uses (the missing one is named), and finds the
 * default profile's root pool and its driver. *out is the caller's (provider_destroy). Returns 0,
 * -EINVAL (bad config, unusable certificate or pin), -EREMOTEIO (server unreachable, not
 * trusted, too old), -ENOMEM. */
int provider_lxd_new(const struct lb_lxd_config *cfg, struct lb_provider **out,
                     struct lb_error *err);

/* Wait up to timeout_ms until the exec logs p deletes after its execs answered (LXD keeps each
 * exec's recorded output until then) are deleted: for tests that count an engine's requests
 * or connections. 0, -ETIMEDOUT, or -EINVAL when p is not an lxd provider. Thread-safe. */
int provider_lxd_settle(struct lb_provider *p, int64_t timeout_ms);

/* `lendboxd image import --provider lxd`: upload the unified tarball of len bytes at fd (from
 * its offset 0; image_write_lxd_tarball) to the LXD server as a private image (POST
 * /1.0/images, octet-stream), await it up to timeout_ms, and point the alias at it (made, or
 * moved from the image it named before, which LXD keeps). p must be an lxd provider.
 * fingerprint (size >= 65) gets the new image's. Returns 0, -EINVAL (not an lxd provider, bad
 * alias), -EREMOTEIO (LXD refused; err has its message), -ETIMEDOUT, or a negative errno.
 * Thread-safe. */
int provider_lxd_image_publish(struct lb_provider *p, int fd, uint64_t len, const char *alias,
                               int64_t timeout_ms, char *fingerprint, size_t size,
                               struct lb_error *err);

#endif
