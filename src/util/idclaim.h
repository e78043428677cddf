/*
 * idclaim.h - host-wide claims of id slots: a slot is IDCLAIM_SLOT_IDS host ids whose first id
 * is a multiple of IDCLAIM_SLOT_IDS, claimed by one lendboxd at a time through a file named by
 * that first id in a claim dir (IDCLAIM_DIR), so that no two daemons (nor two providers of one
 * daemon) ever use overlapping ids at once, whatever their configured ranges.
 *
 * A claim file holds its claimer's identity (idclaim_id_make): "<dev>:<ino> <state dir>\n"
 * (the local provider's) or that line followed by "<tag>\n" (another user of the dir). A claim
 * whose state dir no longer exists (or is another directory now) is stale and may be taken
 * over; a daemon that died keeps its claims until it starts again and sweeps the ones that no
 * live instance of its own uses. The dir is on /run (a tmpfs): every claim goes at reboot.
 *
 * Thread-safety: every function may be called from any thread; two takes of one slot by
 * threads of one daemon must be serialized by the caller (they would both see "ours").
 */
#ifndef LB_IDCLAIM_H
#define LB_IDCLAIM_H

#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"

#define IDCLAIM_SLOT_IDS 65536u
#define IDCLAIM_DIR "/run/lendbox/slots"

/* Make dir (and its parent) if missing and check that it is a directory of this user. 0, or
 * -EREMOTEIO with err naming why. */
int idclaim_dir_make(const char *dir, struct lb_error *err);

/* This daemon's identity in its claims: state_dir's device and inode and its path (absolute:
 * other daemons judge the claim's staleness by it), then tag on a line of its own when tag is
 * not NULL. *out is malloc'd (the caller frees it). 0,
 * -EREMOTEIO (state_dir cannot be stat'ed) or -ENOMEM, with err set. */
int idclaim_id_make(const char *state_dir, const char *tag, char **out, struct lb_error *err);

/* Claim the slot whose first id is first for claim_id. 0 when it is ours now, 1 when it already
 * was (a claim of an earlier run of this daemon, or a second take), -EBUSY when another live
 * claimer holds it, another -errno when dir is unusable. */
int idclaim_take(const char *dir, const char *claim_id, uint32_t first);

/* Drop claim_id's claim of the slot whose first id is first (never another claimer's). */
void idclaim_drop(const char *dir, const char *claim_id, uint32_t first);

/* Drop every claim of claim_id in dir whose first id in_use(arg, first) says is not in use.
 * One readdir. */
void idclaim_sweep(const char *dir, const char *claim_id, bool (*in_use)(void *arg, uint32_t first),
                   void *arg);

#endif
