/*
 * fault.h - named fault injection (the way SQLite tests its failure paths).
 *
 * A spec is a comma-separated list of OP=ACTION[:ARG]:
 *   fail        every call of OP fails
 *   fail:N      the next N calls of OP fail, later ones succeed
 *   hang        calls of OP block until the operation's own deadline passes, then fail
 *               with -ETIMEDOUT (as a provider that never answers would)
 *   delay:MS    calls of OP wait MS milliseconds, then proceed normally
 *   hold:PATH   calls of OP wait until the file PATH exists (at most 300 s), then proceed
 *               normally: a test holds the daemon at OP while it checks what OP's window
 *               allows, and releases it by creating PATH (no window to race)
 * OP names: provider.create, provider.stop, provider.exec, provider.status, provider.file_write,
 * provider.file_open, provider.list, store.write, store.sync (the one sync of a fork's or a
 * seed_batch's leases, store_sync), image.publish (an import, unpacked, right
 * before its tree is published), image.mounted (a seed on an image: its root's mounts made,
 * right before the sandbox's init starts), userns.helper (a sandbox's user namespace: its helper
 * process is up, the id maps not yet written), userns.idmap_helper (the same for the
 * daemon-owned user namespace that idmaps an image's tree; never the sandbox's own),
 * provider.snapshot, snapshot.frozen (a local snapshot: the sandbox frozen, its work dir made,
 * the copy not started), snapshot.publish (a snapshot's tree stored, its name not yet linked),
 * host.keyrings (checked once at start: "fail" makes the daemon refuse itself the kernel
 * keyring calls with EPERM, as a container's syscall filter does to a daemon inside it),
 * bwrap.mount_race (a local create, right before it starts bwrap: "fail" stands for bwrap
 * losing the race of its recursive binds with a host mount going away, without starting it),
 * provider.caps.reset (asked with each provider caps call: "fail" makes the provider one that
 * cannot reset), lend.recycle (a recycle's sandbox made, before it is recorded warm),
 * lend.hand_over (an in-place recycle: the sandbox reset and its new id recorded, before the
 * provider hands it over), provider.hand_over (the provider's hand-over), lend.handed_over (an
 * in-place recycle's sandbox under its new id, before the transaction that records it),
 * reset.checked (a local in-place reset, its init checked unchanged, nothing killed yet),
 * reset.spare (a local in-place reset, before it takes the spare reset helper: "fail" makes
 * it exec a helper of its own, as when the spare is busy), operate.enter (an operate-token act in a
 * sandbox, its job started, before it takes the sandbox's fence and checks its token again:
 * routes_operate_enter; a renew, before it takes the session's lock and checks its token again
 * there), exec.spawn (a local exec, its sandbox found not paused, right before its helper starts),
 * activation.bound (an operate token's request on its session's activation, the activation it may
 * act on read under the fence, the fence left, before it acts). Example:
 * LENDBOX_FAULTS=provider.stop=fail:2,provider.create=delay:3000
 *
 * Off unless a spec is loaded. Thread-safe.
 */
#ifndef LB_FAULT_H
#define LB_FAULT_H

#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"

/* Load spec (NULL or "" turns injection off). -EINVAL with a message on a bad spec. */
int fault_load(const char *spec, struct lb_error *err);
/* Is any fault configured? */
bool fault_enabled(void);
/* Apply the fault configured for op, if any. deadline_ms bounds a hang (<= 0: 30 s).
 * Returns 0 (proceed), -EIO (injected failure) or -ETIMEDOUT (hang ran out); err says it was
 * injected. */
int fault_hit(const char *op, int64_t deadline_ms, struct lb_error *err);
/* Free the loaded spec. */
void fault_reset(void);

#endif
