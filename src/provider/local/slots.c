/*
 * slots.c - uid slots of the local provider: each sandbox runs as a slot of LOCAL_SLOT_IDS
 * host ids from [uid_base, uid_base + uid_count * LOCAL_SLOT_IDS), taken next-fit from a
 * bitmap and claimed host-wide by a file in LOCAL_SLOT_CLAIM_DIR, so that no two lendboxd ever
 * use overlapping ids at once.
 */
#include "provider/local/local_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/idclaim.h"
#include "util/log.h"

/* Every slot in use is claimed host-wide (util/idclaim.h), so no two lendboxd (whatever their
 * state dirs and uid_base) ever use overlapping ids at once: a stop kills every process of the
 * slot's ids. uid_base is a multiple of LOCAL_SLOT_IDS, so two daemons' slots either coincide or
 * are disjoint. */

static int claim_take(const struct local_provider *lp, uint32_t first)
{
    int r = idclaim_take(LOCAL_SLOT_CLAIM_DIR, lp->claim_id, first);

    return r > 0 ? 0 : r; /* ours already: a sandbox of ours is marked before any take */
}

static void claim_drop(const struct local_provider *lp, uint32_t first)
{
    idclaim_drop(LOCAL_SLOT_CLAIM_DIR, lp->claim_id, first);
}

/* ---- uid slots -------------------------------------------------------------------------- */

/* Is uid the first host id of one of our slots (a sandbox's root)? */
bool local_uid_in_range(const struct local_provider *lp, uint32_t uid)
{
    return uid >= lp->uid_base && (uid - lp->uid_base) % LOCAL_SLOT_IDS == 0 &&
           (uid - lp->uid_base) / LOCAL_SLOT_IDS < lp->uid_count;
}

/* The bitmap's bits are atomic: a set bit is only ever set under uid_lock (with the slot's
 * claim taken first), a bit is cleared lock-free (after the claim is dropped), and reads need
 * no lock. */
static bool uid_bit_get(const struct local_provider *lp, uint32_t bit)
{
    return atomic_load(&lp->uid_used[bit / 8]) & (1u << (bit % 8));
}

static void uid_bit_set(struct local_provider *lp, uint32_t bit, bool on)
{
    if (on)
        atomic_fetch_or(&lp->uid_used[bit / 8], (uint8_t)(1u << (bit % 8)));
    else
        atomic_fetch_and(&lp->uid_used[bit / 8], (uint8_t) ~(1u << (bit % 8)));
}

int local_uid_alloc(struct local_provider *lp, uint32_t *uid)
{
    uint32_t i, bit;
    int r = -EUSERS;

    pthread_mutex_lock(&lp->uid_lock);
    for (i = 0; i < lp->uid_count; i++) {
        bit = (lp->uid_next + i) % lp->uid_count;
        if (uid_bit_get(lp, bit))
            continue;
        /* a slot another lendboxd holds is skipped, not an error */
        r = claim_take(lp, lp->uid_base + bit * LOCAL_SLOT_IDS);
        if (r == -EBUSY) {
            r = -EUSERS;
            continue;
        }
        if (r < 0) {
            log_error("cannot claim a uid slot in %s: %s", LOCAL_SLOT_CLAIM_DIR, strerror(-r));
            r = -EUSERS;
            break;
        }
        uid_bit_set(lp, bit, true);
        lp->uid_next = (bit + 1) % lp->uid_count;
        *uid = lp->uid_base + bit * LOCAL_SLOT_IDS;
        r = 0;
        break;
    }
    pthread_mutex_unlock(&lp->uid_lock);
    return r;
}

/* The slot-aligned first ids (absolute: multiples of LOCAL_SLOT_IDS) of the one or two slots
 * that the LOCAL_SLOT_IDS ids from uid on cover: a uid of an older version (one uid per
 * sandbox) need not be slot-aligned. Returns how many (1 or 2; 0 for uid 0, no slot). */
static int uid_slots(uint32_t uid, uint32_t first[2])
{
    if (uid == 0)
        return 0;
    first[0] = uid - uid % LOCAL_SLOT_IDS;
    if (uid % LOCAL_SLOT_IDS == 0 || first[0] > UINT32_MAX - LOCAL_SLOT_IDS)
        return 1;
    first[1] = first[0] + LOCAL_SLOT_IDS;
    return 2;
}

/* Mark the slot(s) of an adopted sandbox (uid: its first id) in use, here and host-wide. */
void local_uid_mark(struct local_provider *lp, uint32_t uid)
{
    uint32_t first[2];
    int i, n = uid_slots(uid, first);

    if (n == 0)
        return;
    /* every descriptor load marks: a slot of ours already marked needs no lock */
    for (i = 0; i < n; i++) {
        if (!local_uid_in_range(lp, first[i]) ||
            !uid_bit_get(lp, (first[i] - lp->uid_base) / LOCAL_SLOT_IDS))
            break;
    }
    if (i == n)
        return;
    pthread_mutex_lock(&lp->uid_lock);
    for (i = 0; i < n; i++) {
        bool ours = local_uid_in_range(lp, first[i]);
        uint32_t bit = ours ? (first[i] - lp->uid_base) / LOCAL_SLOT_IDS : 0;
        int r;

        if (ours && uid_bit_get(lp, bit))
            continue; /* claimed already: marks come with every descriptor load */
        r = claim_take(lp, first[i]);
        if (r < 0)
            log_warn("sandbox uid %" PRIu32 ": cannot claim the host ids %" PRIu32 "..%" PRIu32
                     " (%s)",
                     uid, first[i], first[i] + (LOCAL_SLOT_IDS - 1),
                     r == -EBUSY ? "another lendboxd holds them" : strerror(-r));
        if (ours)
            uid_bit_set(lp, bit, true);
    }
    pthread_mutex_unlock(&lp->uid_lock);
}

void local_uid_free(struct local_provider *lp, uint32_t uid)
{
    uint32_t first[2];
    int i, n = uid_slots(uid, first);

    if (n == 0)
        return;
    /* The claims go first, then the bits, with no lock: while the slot's bit is still set no
     * thread here takes the slot (local_uid_alloc skips it, local_uid_mark sees it marked), and
     * a bit is cleared atomically, so a stop never waits for another's slot work. */
    for (i = 0; i < n; i++)
        claim_drop(lp, first[i]);
    for (i = 0; i < n; i++) {
        if (local_uid_in_range(lp, first[i]))
            uid_bit_set(lp, (first[i] - lp->uid_base) / LOCAL_SLOT_IDS, false);
    }
}

/* At start, after every live sandbox's slots are marked: drop our claims of slots that no
 * sandbox uses any more (a crash between a sandbox's removal and its claim's), and make the
 * claim dir. One readdir, at start only. */
int local_claims_start(struct local_provider *lp, struct lb_error *err)
{
    int r = idclaim_dir_make(LOCAL_SLOT_CLAIM_DIR, err);

    return r < 0 ? r : idclaim_id_make(lp->state_dir, NULL, &lp->claim_id, err);
}

/* Is the slot whose first id is first used by a sandbox of arg (local_list's array)? */
static bool slot_in_use(void *arg, uint32_t first)
{
    json_t *all = arg;
    size_t i;

    for (i = 0; all && i < json_array_size(all); i++) {
        json_t *u = json_object_get(json_object_get(json_array_get(all, i), "descriptor"), "uid");
        uint32_t f[2];
        int k, n;

        if (!json_is_integer(u) || json_integer_value(u) <= 0 || json_integer_value(u) > UINT32_MAX)
            continue;
        n = uid_slots((uint32_t)json_integer_value(u), f);
        for (k = 0; k < n; k++)
            if (f[k] == first)
                return true;
    }
    return false;
}

/* Drop our claims that no live sandbox of ours accounts for (called after local_list). */
void local_claims_sweep(struct local_provider *lp, json_t *all)
{
    idclaim_sweep(LOCAL_SLOT_CLAIM_DIR, lp->claim_id, slot_in_use, all);
}
