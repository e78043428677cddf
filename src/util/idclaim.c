/*
 * idclaim.c - host-wide claims of id slots (see idclaim.h): one file per claimed slot, made
 * with O_EXCL, holding the claimer's identity.
 */
#include "util/idclaim.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/log.h"

#define CLAIM_MAX 4200 /* a claim's content: an identity line and a tag line */

/* The claim file's path of the slot whose first id is first. */
static void claim_path(const char *dir, uint32_t first, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%" PRIu32, dir, first);
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

/* Is the claim's owner provably gone: its state dir no longer exists or is another directory?
 * Only the first line counts (a tag line after it names the user, not the owner). */
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
static void claim_remove_stale(const char *dir, const char *path)
{
    char content[CLAIM_MAX], lock[4200];
    int lk;

    snprintf(lock, sizeof(lock), "%s/.lock", dir);
    lk = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lk < 0)
        return;
    if (flock(lk, LOCK_EX) == 0 && claim_read(path, content, sizeof(content)) == 0 &&
        claim_is_stale(content))
        (void)unlink(path);
    close(lk);
}

int idclaim_take(const char *dir, const char *claim_id, uint32_t first)
{
    char path[4200], content[CLAIM_MAX];
    int tries, fd;

    claim_path(dir, first, path, sizeof(path));
    for (tries = 0; tries < 2; tries++) {
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd >= 0) {
            size_t len = strlen(claim_id);
            ssize_t n = write(fd, claim_id, len);

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
        if (strcmp(content, claim_id) == 0)
            return 1;
        if (!claim_is_stale(content))
            return -EBUSY;
        claim_remove_stale(dir, path);
    }
    return -EBUSY;
}

void idclaim_drop(const char *dir, const char *claim_id, uint32_t first)
{
    char path[4200], content[CLAIM_MAX];

    claim_path(dir, first, path, sizeof(path));
    if (claim_read(path, content, sizeof(content)) == 0 && strcmp(content, claim_id) == 0)
        (void)unlink(path);
}

int idclaim_dir_make(const char *dir, struct lb_error *err)
{
    char *copy = strdup(dir), *parent;
    struct stat st;

    if (!copy)
        return lb_error_set(err, -ENOMEM, "out of memory");
    parent = dirname(copy);
    if ((mkdir(parent, 0755) < 0 && errno != EEXIST) || (mkdir(dir, 0755) < 0 && errno != EEXIST)) {
        free(copy);
        return lb_error_set(err, -EREMOTEIO, "cannot make '%s': %s", dir, strerror(errno));
    }
    free(copy);
    if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
        return lb_error_set(err, -EREMOTEIO, "'%s' is not a directory of this user", dir);
    return 0;
}

int idclaim_id_make(const char *state_dir, const char *tag, char **out, struct lb_error *err)
{
    struct stat st;

    *out = NULL;
    if (stat(state_dir, &st) < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot stat '%s': %s", state_dir, strerror(errno));
    if (asprintf(out, "%llu:%llu %s\n%s%s", (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino, state_dir, tag ? tag : "", tag ? "\n" : "") < 0) {
        *out = NULL;
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    return 0;
}

void idclaim_sweep(const char *dir, const char *claim_id, bool (*in_use)(void *arg, uint32_t first),
                   void *arg)
{
    char path[4200], content[CLAIM_MAX];
    struct dirent *de;
    DIR *d = opendir(dir);

    if (!d)
        return;
    while ((de = readdir(d))) {
        char *end;
        unsigned long v;

        errno = 0;
        v = strtoul(de->d_name, &end, 10);
        if (de->d_name[0] < '0' || de->d_name[0] > '9' || *end || errno || v > UINT32_MAX)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        if (claim_read(path, content, sizeof(content)) < 0 || strcmp(content, claim_id) != 0)
            continue;
        if (!in_use(arg, (uint32_t)v)) {
            log_info("dropping the claim of host ids %lu.. (no sandbox uses them)", v);
            (void)unlink(path);
        }
    }
    closedir(d);
}
