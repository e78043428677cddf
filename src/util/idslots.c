/*
 * idslots.c - a table of id slots claimed host-wide (see idslots.h).
 */
#include "util/idslots.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

/* The bitmap's bits are atomic: a bit is only ever set under lock (its claim taken first), a
 * bit is cleared lock-free (after its claim is dropped), and reads need no lock. */
static bool bit_get(const struct lb_idslots *t, uint32_t bit)
{
    return atomic_load(&t->used[bit / 8]) & (1u << (bit % 8));
}

static void bit_set(struct lb_idslots *t, uint32_t bit, bool on)
{
    if (on)
        atomic_fetch_or(&t->used[bit / 8], (uint8_t)(1u << (bit % 8)));
    else
        atomic_fetch_and(&t->used[bit / 8], (uint8_t) ~(1u << (bit % 8)));
}

int idslots_init(struct lb_idslots *t, uint32_t base, uint32_t count, const char *claim_dir,
                 const char *state_dir, const char *tag, struct lb_error *err)
{
    int r;

    memset(t, 0, sizeof(*t));
    pthread_mutex_init(&t->lock, NULL);
    if (count == 0 || base % IDCLAIM_SLOT_IDS != 0 ||
        (uint64_t)base + (uint64_t)count * IDCLAIM_SLOT_IDS > UINT64_C(1) << 32)
        return lb_error_set(err, -EINVAL,
                            "bad id range: %" PRIu32 " slots of %u ids from %" PRIu32
                            " (the first id must be a multiple of %u, the last below 2^32)",
                            count, IDCLAIM_SLOT_IDS, base, IDCLAIM_SLOT_IDS);
    t->base = base;
    t->count = count;
    t->used = calloc((count + 7) / 8, 1);
    t->claim_dir = strdup(claim_dir);
    if (!t->used || !t->claim_dir)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = idclaim_dir_make(claim_dir, err);
    return r < 0 ? r : idclaim_id_make(state_dir, tag, &t->claim_id, err);
}

void idslots_release(struct lb_idslots *t)
{
    free((void *)t->used);
    free(t->claim_dir);
    free(t->claim_id);
    pthread_mutex_destroy(&t->lock);
    t->used = NULL;
    t->claim_dir = t->claim_id = NULL;
}

bool idslots_contains(const struct lb_idslots *t, uint32_t first)
{
    return first >= t->base && (first - t->base) % IDCLAIM_SLOT_IDS == 0 &&
           (first - t->base) / IDCLAIM_SLOT_IDS < t->count;
}

int idslots_alloc(struct lb_idslots *t, uint32_t *first)
{
    uint32_t i, bit;
    int r = -EUSERS;

    pthread_mutex_lock(&t->lock);
    for (i = 0; i < t->count; i++) {
        bit = (t->next + i) % t->count;
        if (bit_get(t, bit))
            continue;
        /* a slot another claimer holds is skipped, not an error */
        r = idclaim_take(t->claim_dir, t->claim_id, t->base + bit * IDCLAIM_SLOT_IDS);
        /* a claim of ours that no bit accounts for is an earlier run's, whose user may live
         * still: skipped until idslots_sweep drops it */
        if (r == -EBUSY || r == 1) {
            r = -EUSERS;
            continue;
        }
        if (r < 0) {
            log_error("cannot claim an id slot in %s: %s", t->claim_dir, strerror(-r));
            r = -EUSERS;
            break;
        }
        bit_set(t, bit, true);
        t->next = (bit + 1) % t->count;
        *first = t->base + bit * IDCLAIM_SLOT_IDS;
        r = 0;
        break;
    }
    pthread_mutex_unlock(&t->lock);
    return r;
}

int idslots_mark(struct lb_idslots *t, uint32_t first)
{
    bool ours = idslots_contains(t, first);
    uint32_t bit = ours ? (first - t->base) / IDCLAIM_SLOT_IDS : 0;
    int r;

    if (ours && bit_get(t, bit))
        return 0; /* marked and claimed already */
    pthread_mutex_lock(&t->lock);
    r = ours && bit_get(t, bit) ? 0 : idclaim_take(t->claim_dir, t->claim_id, first);
    r = r > 0 ? 0 : r;
    if (r < 0)
        log_warn("cannot claim the host ids %" PRIu32 "..%" PRIu32 " in use (%s)", first,
                 first + (IDCLAIM_SLOT_IDS - 1),
                 r == -EBUSY ? "another lendboxd holds them" : strerror(-r));
    if (ours)
        bit_set(t, bit, true);
    pthread_mutex_unlock(&t->lock);
    return r == -EBUSY ? -EBUSY : 0;
}

void idslots_free(struct lb_idslots *t, uint32_t first)
{
    /* the claim goes first, then the bit, with no lock: while the bit is set no thread takes
     * the slot, and a bit is cleared atomically */
    idclaim_drop(t->claim_dir, t->claim_id, first);
    if (idslots_contains(t, first))
        bit_set(t, (first - t->base) / IDCLAIM_SLOT_IDS, false);
}

static bool slot_marked(void *arg, uint32_t first)
{
    struct lb_idslots *t = arg;

    return idslots_contains(t, first) && bit_get(t, (first - t->base) / IDCLAIM_SLOT_IDS);
}

void idslots_sweep(struct lb_idslots *t)
{
    /* under lock: a slot being taken right now has its claim before its bit */
    pthread_mutex_lock(&t->lock);
    idclaim_sweep(t->claim_dir, t->claim_id, slot_marked, t);
    pthread_mutex_unlock(&t->lock);
}

uint32_t idslots_used(const struct lb_idslots *t)
{
    uint32_t n = 0;

    for (uint32_t i = 0; i < t->count; i++)
        n += bit_get(t, i) ? 1 : 0;
    return n;
}
