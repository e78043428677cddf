/*
 * lxd_idmap.c - the lxd provider's id ranges (lxd.h, "Id ranges"): the slot table every
 * instance's security.idmap.base comes from, its default range from root's subordinate ids,
 * and the marks and give-backs of instances found and removed.
 */
#include "provider/lxd/lxd_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/log.h"

#define SLOT IDCLAIM_SLOT_IDS
#define RANGES_MAX 64

struct id_range {
    uint64_t start, end; /* [start, end) */
};

/* root's ranges in a subordinate id file (/etc/subuid format "name:start:count"; "root" or
 * "0"). How many (at most max); 0 when none or unreadable. */
static size_t read_ranges(const char *path, struct id_range *out, size_t max)
{
    FILE *f = fopen(path, "re");
    char line[512];
    size_t n = 0;

    if (!f)
        return 0;
    while (n < max && fgets(line, sizeof(line), f)) {
        char name[256];
        unsigned long long start, count;

        if (sscanf(line, "%255[^:]:%llu:%llu", name, &start, &count) != 3 || count == 0 ||
            (strcmp(name, "root") != 0 && strcmp(name, "0") != 0))
            continue;
        out[n++] = (struct id_range){start, start + count};
    }
    fclose(f);
    return n;
}

/* The widest range of whole slots inside both a uid and a gid range of root, leaving out the
 * first SLOT ids of each uid range (what LXD maps for instances that are not isolated, and
 * where its own allocator for isolated ones starts). 0 and base/count, or -ENOENT. */
static int default_range(uint32_t *base, uint32_t *count)
{
    struct id_range u[RANGES_MAX], g[RANGES_MAX];
    size_t nu = read_ranges("/etc/subuid", u, RANGES_MAX);
    size_t ng = read_ranges("/etc/subgid", g, RANGES_MAX);
    uint64_t best = 0;

    for (size_t i = 0; i < nu; i++) {
        for (size_t k = 0; k < ng; k++) {
            uint64_t lo = (u[i].start > g[k].start ? u[i].start : g[k].start) + SLOT;
            uint64_t hi = u[i].end < g[k].end ? u[i].end : g[k].end;
            uint64_t first = (lo + SLOT - 1) / SLOT, last = hi / SLOT; /* in slots */

            if (hi > UINT64_C(1) << 32)
                last = (UINT64_C(1) << 32) / SLOT;
            if (last > first && last - first > best) {
                best = last - first;
                *base = (uint32_t)(first * SLOT);
                *count = (uint32_t)best;
            }
        }
    }
    return best > 0 ? 0 : -ENOENT;
}

int lxd_idmap_init(struct lb_lxd *l, int64_t base, int64_t count, const char *state_dir,
                   struct lb_error *err)
{
    uint32_t b = 0, c = 0;
    char *real;
    int r;

    if (base > 0) {
        if (count <= 0)
            return lb_error_set(err, -EINVAL, "lxd.idmap_base needs lxd.idmap_count");
        b = (uint32_t)base;
        c = (uint32_t)count;
    } else {
        if (default_range(&b, &c) < 0)
            return lb_error_set(err, -EINVAL,
                                "root has no range of at least %u ids in /etc/subuid and "
                                "/etc/subgid here: set lxd.idmap_base and lxd.idmap_count",
                                2 * SLOT);
        if (count > 0 && (uint32_t)count < c)
            c = (uint32_t)count;
    }
    /* the claims name the state dir absolute: another daemon judges their staleness by it */
    real = realpath(state_dir, NULL);
    if (!real)
        return lb_error_set(err, -EINVAL, "cannot resolve the state dir '%s': %s", state_dir,
                            strerror(errno));
    r = idslots_init(&l->idmap, b, c, IDCLAIM_DIR, real, "lxd", err);
    free(real);
    if (r < 0) {
        idslots_release(&l->idmap);
        return lb_error_keep(err, r, "lxd.idmap_base/idmap_count: %s", err->message);
    }
    l->idmap_ready = true;
    log_info("lxd provider: instances' id ranges from %" PRIu32 ", %" PRIu32 " slots of %u ids", b,
             c, SLOT);
    return 0;
}

uint32_t lxd_idmap_of_config(const json_t *config)
{
    static const char *const keys[] = {"security.idmap.base", "volatile.idmap.base"};

    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        const char *v = json_string_value(json_object_get(config, keys[i]));
        char *end;
        unsigned long long n;

        if (!v || !*v)
            continue;
        errno = 0;
        n = strtoull(v, &end, 10);
        if (!errno && !*end && n > 0 && n <= UINT32_MAX - SLOT)
            return (uint32_t)n;
    }
    return 0;
}

uint32_t lxd_idmap_of_descriptor(const json_t *desc)
{
    json_t *v = json_object_get(desc, "id_base");

    if (!json_is_integer(v) || json_integer_value(v) <= 0 ||
        json_integer_value(v) > (json_int_t)(UINT32_MAX - SLOT))
        return 0;
    return (uint32_t)json_integer_value(v);
}

/* The slot-aligned first ids of the one or two slots the SLOT ids from id_base cover. */
static int slots_of(uint32_t id_base, uint32_t first[2])
{
    first[0] = id_base - id_base % SLOT;
    if (id_base % SLOT == 0)
        return 1;
    first[1] = first[0] + SLOT;
    return 2;
}

/* Mark (used) or free the slots the SLOT ids from id_base cover; nothing before init. */
static void idmap_set(struct lb_lxd *l, uint32_t id_base, bool used)
{
    uint32_t first[2];
    int n;

    if (!id_base || !l->idmap_ready)
        return;
    n = slots_of(id_base, first);
    for (int i = 0; i < n; i++) {
        if (used)
            (void)idslots_mark(&l->idmap, first[i]);
        else
            idslots_free(&l->idmap, first[i]);
    }
}

void lxd_idmap_mark(struct lb_lxd *l, uint32_t id_base)
{
    idmap_set(l, id_base, true);
}

void lxd_idmap_free(struct lb_lxd *l, uint32_t id_base)
{
    idmap_set(l, id_base, false);
}
