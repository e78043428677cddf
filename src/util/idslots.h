/*
 * idslots.h - a table of id slots: count slots of IDCLAIM_SLOT_IDS host ids from base (a
 * multiple of IDCLAIM_SLOT_IDS), taken next-fit from a bitmap and each claimed host-wide
 * (util/idclaim.h) while in use, so that no two users of the claim dir ever hold overlapping
 * ids. A slot is given back when what used it is gone, and marked again from what lives after a
 * restart (a slot is named by its first id throughout).
 *
 * Thread-safety: every function but idslots_init and idslots_release may be called from any
 * thread at once.
 */
#ifndef LB_IDSLOTS_H
#define LB_IDSLOTS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"
#include "util/idclaim.h"

struct lb_idslots {
    uint32_t base, count; /* slots [base, base + count * IDCLAIM_SLOT_IDS) */
    char *claim_dir;      /* the host-wide claims' dir */
    char *claim_id;       /* the content of our claims (idclaim_id_make) */
    _Atomic uint8_t *used;
    uint32_t next; /* next-fit: where the next search starts (under lock) */
    pthread_mutex_t lock;
};

/* Set up t for count (>= 1) slots from base (a multiple of IDCLAIM_SLOT_IDS; base + count *
 * IDCLAIM_SLOT_IDS <= 2^32), claimed in claim_dir (made if missing) as state_dir's, tagged
 * with tag (what distinguishes this table's claims from other tables' of the same state dir).
 * 0, or -EINVAL (a bad range), -EREMOTEIO (claim_dir or state_dir unusable), -ENOMEM, with
 * err set. Pair with idslots_release. */
int idslots_init(struct lb_idslots *t, uint32_t base, uint32_t count, const char *claim_dir,
                 const char *state_dir, const char *tag, struct lb_error *err);
void idslots_release(struct lb_idslots *t);

/* Take a free slot and claim it; its first id into *first. Slots another claimer holds are
 * skipped. -EUSERS when every slot is in use here or elsewhere (or the claim dir fails,
 * logged). */
int idslots_alloc(struct lb_idslots *t, uint32_t *first);

/* Is first the first id of one of t's slots? */
bool idslots_contains(const struct lb_idslots *t, uint32_t first);

/* Mark the slot whose first id is first in use (a live user found after a restart) and claim
 * it; one outside t's range is claimed all the same (its ids are in use). 0, or -EBUSY when
 * another claimer holds it (logged; it stays marked here). Idempotent. */
int idslots_mark(struct lb_idslots *t, uint32_t first);

/* Give back the slot whose first id is first: its claim dropped, then its bit cleared. One not
 * of t's range only loses its claim. */
void idslots_free(struct lb_idslots *t, uint32_t first);

/* Drop our claims (in claim_dir) of slots that are not marked here: claims a crash left behind
 * (between a user's end and its give-back). Call after every live user was marked. */
void idslots_sweep(struct lb_idslots *t);

/* How many of t's slots are marked in use here. */
uint32_t idslots_used(const struct lb_idslots *t);

#endif
