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

#include "util/log.h"

/* ---- host-wide slot claims ---------------------------------------------------------------
 * Every slot in use is claimed host-wide, so no two lendboxd (whatever their state dirs and
 * uid_base) ever use overlapping ids at once: a stop kills every process of the slot's ids.
 * A claim is the file LOCAL_SLOT_CLAIM_DIR/<first id of the slot>, made with O_EXCL, holding
 * the claimer's identity ("<dev>:<ino> <state dir>\n" of its state dir). uid_base is a multiple
 * of LOCAL_SLOT_IDS, so two daemons' slots either coincide or are disjoint. A claim whose state
 * dir no longer exists (or is another directory now) is stale and may be removed; a daemon that
 * died keeps its claims (its sandboxes outlive it) until it starts again and drops the ones of
 * no live sandbox. /run is a tmpfs: every claim goes at reboot, and so does every sandbox. */

/* The claim file's path of the slot whose first id is first. */
static void claim_path(uint32_t first, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%" PRIu32, LOCAL_SLOT_CLAIM_DIR, first);
}

/* The claim's content: 0, or -errno when the file cannot be read. */
static int claim_read(const char *path, char *buf, size_t size)
{
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

    if (fd < 0)
        return -errno;
    n = read(fd, buf, size - 1);
    close(fd);
    if (n < 0)
        return -EIO;
    buf[n] = '\0';
    return 0;
}

/* Is the claim's owner provably gone: its state dir no longer exists or is another directory? */
static bool claim_is_stale(const char *content)
{
    unsigned long long dev, ino;
    char path[4096];
    struct stat st;

    if (sscanf(content, "%llu:%llu %4095[^\n]", &dev, &ino, path) != 3)
        return false; /* being written right now, or not ours to judge */
    if (stat(path, &st) < 0)
        return errno == ENOENT || errno == ENOTDIR;
    return (unsigned long long)st.st_dev != dev || (unsigned long long)st.st_ino != ino;
}

/* Remove the claim at path if it is still the stale one; under the claim dir's lock, so a
 * claim made after another daemon's check is never removed. */
static void claim_remove_stale(const char *path)
{
    char content[4200];
    int lk = open(LOCAL_SLOT_CLAIM_DIR "/.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);

    if (lk < 0)
        return;
    if (flock(lk, LOCK_EX) == 0 && claim_read(path, content, sizeof(content)) == 0 &&
        claim_is_stale(content))
        (void)unlink(path);
    close(lk);
}

/* Claim the slot whose first id is first. 0 when it is ours now (also when it already named us),
 * -EBUSY when another live daemon holds it, another -errno when the claim dir is unusable. */
static int claim_take(const struct local_provider *lp, uint32_t first)
{
    char path[128], content[4200];
    int tries, fd;

    claim_path(first, path, sizeof(path));
    for (tries = 0; tries < 2; tries++) {
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd >= 0) {
            size_t len = strlen(lp->claim_id);
            ssize_t n = write(fd, lp->claim_id, len);

            close(fd);
            if (n != (ssize_t)len) {
                (void)unlink(path);
                return -EIO;
            }
            return 0;
        }
        if (errno != EEXIST)
            return -errno;
        if (claim_read(path, content, sizeof(content)) < 0)
            continue; /* removed meanwhile: try again */
        if (strcmp(content, lp->claim_id) == 0)
            return 0;
        if (!claim_is_stale(content))
            return -EBUSY;
        claim_remove_stale(path);
    }
    return -EBUSY;
}

/* Drop our claim of the slot whose first id is first (never another daemon's). */
static void claim_drop(const struct local_provider *lp, uint32_t first)
{
    char path[128], content[4200];

    claim_path(first, path, sizeof(path));
    if (claim_read(path, content, sizeof(content)) == 0 && strcmp(content, lp->claim_id) == 0)
        (void)unlink(path);
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
    struct stat st;

    if ((mkdir("/run/lendbox", 0755) < 0 && errno != EEXIST) ||
        (mkdir(LOCAL_SLOT_CLAIM_DIR, 0755) < 0 && errno != EEXIST))
        return lb_error_set(err, -EREMOTEIO, "cannot make '%s': %s", LOCAL_SLOT_CLAIM_DIR,
                            strerror(errno));
    if (lstat(LOCAL_SLOT_CLAIM_DIR, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
        return lb_error_set(err, -EREMOTEIO, "'%s' is not a directory of this user",
                            LOCAL_SLOT_CLAIM_DIR);
    if (stat(lp->state_dir, &st) < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot stat '%s': %s", lp->state_dir,
                            strerror(errno));
    if (asprintf(&lp->claim_id, "%llu:%llu %s\n", (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino, lp->state_dir) < 0) {
        lp->claim_id = NULL;
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    return 0;
}

/* Drop our claims that no live sandbox of ours accounts for (called after local_list). */
void local_claims_sweep(struct local_provider *lp, json_t *all)
{
    char path[300], content[4200];
    struct dirent *de;
    DIR *dir = opendir(LOCAL_SLOT_CLAIM_DIR);
    size_t i;

    if (!dir)
        return;
    while ((de = readdir(dir))) {
        char *end;
        unsigned long v;
        bool used = false;

        errno = 0;
        v = strtoul(de->d_name, &end, 10);
        if (de->d_name[0] < '0' || de->d_name[0] > '9' || *end || errno || v > UINT32_MAX)
            continue;
        snprintf(path, sizeof(path), "%s/%s", LOCAL_SLOT_CLAIM_DIR, de->d_name);
        if (claim_read(path, content, sizeof(content)) < 0 || strcmp(content, lp->claim_id))
            continue;
        for (i = 0; all && i < json_array_size(all) && !used; i++) {
            json_t *u =
                json_object_get(json_object_get(json_array_get(all, i), "descriptor"), "uid");
            uint32_t first[2];
            int k, n;

            if (!json_is_integer(u) || json_integer_value(u) <= 0 ||
                json_integer_value(u) > UINT32_MAX)
                continue;
            n = uid_slots((uint32_t)json_integer_value(u), first);
            for (k = 0; k < n; k++)
                used = used || first[k] == (uint32_t)v;
        }
        if (!used) {
            log_info("dropping the claim of host ids %lu.. (no sandbox uses them)", v);
            (void)unlink(path);
        }
    }
    closedir(dir);
}
