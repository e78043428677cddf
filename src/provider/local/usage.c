/*
 * usage.c - the usage op of the local provider: what a running sandbox uses now, read from its
 * cgroups (cgroup_read_usage) and from its writable storage: the tmpfs of an image sandbox's
 * root (<dir>/img: the overlay's upper layer, and with storage tmpfs its workspace too), the
 * workdir's own tmpfs inside its mount namespace (a host-root sandbox with storage tmpfs), and
 * the host directory bound at its workdir (storage dir: a walk that adds up its files' blocks,
 * never following a symlink).
 */
#include "provider/local/local_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "util/log.h"

#define USAGE_BASE_FILE "usage-base.json"
#define USAGE_BASE_BYTES 128 /* its fixed size */

/* see local_internal.h */
void local_usage_base_save(const char *id, const char *dir, const struct lb_cgroup *cg)
{
    struct lb_usage u = {-1, -1, -1, -1, -1, -1};
    char path[4400], text[USAGE_BASE_BYTES + 1];
    int fd = -1, n;
    bool peak;
    struct stat st;
    ssize_t w = -1;

    cgroup_read_usage(cg, &u);
    peak = cgroup_restart_peak(cg);
    /* written over itself, at its fixed size (JSON, padded with spaces): a file replaced by a
     * rename costs ~0.3 ms here (ext4 writes the new file's blocks out before the rename), a
     * third of an in-place reset. A kill of the daemon loses nothing the page cache holds; a
     * power cut loses the sandbox (tmpfs) anyway. */
    n = snprintf(text, sizeof(text), "{\"cpu_s\":%.6f,\"oom_kills\":%lld,\"peak_restarted\":%s}",
                 u.cpu_s > 0 ? u.cpu_s : 0.0, (long long)(u.oom_kills > 0 ? u.oom_kills : 0),
                 peak ? "true" : "false");
    if (n > 0 && n < USAGE_BASE_BYTES) {
        memset(text + n, ' ', (size_t)(USAGE_BASE_BYTES - n));
        snprintf(path, sizeof(path), "%s/" USAGE_BASE_FILE, dir);
        fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
            (st.st_size <= USAGE_BASE_BYTES || ftruncate(fd, USAGE_BASE_BYTES) == 0))
            w = pwrite(fd, text, USAGE_BASE_BYTES, 0);
    }
    if (w != USAGE_BASE_BYTES)
        log_warn_sbx(id,
                     "sandbox %s: cannot save its usage at the reset (%s): its usage will "
                     "count the episodes before",
                     id, w < 0 ? strerror(errno) : "short write");
    if (fd >= 0)
        close(fd);
}

/* see local_internal.h */
void local_usage_base_apply(const char *dir, struct lb_usage *u)
{
    char path[4400];
    json_t *j;
    double cpu;
    json_int_t kills;

    snprintf(path, sizeof(path), "%s/" USAGE_BASE_FILE, dir);
    j = json_load_file(path, JSON_REJECT_DUPLICATES, NULL);
    if (!j)
        return;
    cpu = json_number_value(json_object_get(j, "cpu_s"));
    kills = json_integer_value(json_object_get(j, "oom_kills"));
    if (u->cpu_s >= 0)
        u->cpu_s = u->cpu_s > cpu ? u->cpu_s - cpu : 0;
    if (u->oom_kills >= 0)
        u->oom_kills = u->oom_kills > kills ? u->oom_kills - kills : 0;
    if (!json_is_true(json_object_get(j, "peak_restarted")))
        u->memory_peak_bytes = -1;
    json_decref(j);
}

/* Bytes in use on a file system (statfs of it), or -1 when it is not a tmpfs. */
static int64_t tmpfs_used(const struct statfs *st)
{
    if ((long)st->f_type != TMPFS_MAGIC)
        return -1;
    return (int64_t)(st->f_blocks - st->f_bfree) * (int64_t)st->f_bsize;
}

/* The tmpfs at the workdir inside the sandbox's mount namespace, through its init's root: the
 * path resolves inside that root (RESOLVE_IN_ROOT), so the sandbox's symlinks cannot point it
 * at a host file system. -1 when it is not a tmpfs or cannot be reached. */
static int64_t workdir_tmpfs_used(const struct local_desc *d)
{
    struct open_how how = {
        .flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
        .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    };
    struct statfs st;
    char proc[64];
    int64_t used = -1;
    int rootfd, fd;

    snprintf(proc, sizeof(proc), "/proc/%d/root", (int)d->pid);
    rootfd = open(proc, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0)
        return -1;
    /* the pid may have been reused between the check and the open */
    if (local_desc_alive(d)) {
        fd = (int)syscall(SYS_openat2, rootfd, d->workdir, &how, sizeof(how));
        if (fd >= 0) {
            if (fstatfs(fd, &st) == 0)
                used = tmpfs_used(&st);
            close(fd);
        }
    }
    close(rootfd);
    return used;
}

/* What a walk of a storage = dir workdir may cost: past these it answers unknown (-1). */
#define WALK_MAX_ENTRIES 1000000
#define WALK_MAX_DEPTH 256

struct walk {
    dev_t dev;       /* the walk's file system: it does not cross mounts */
    int64_t bytes;   /* blocks of what it saw, in bytes */
    int64_t entries; /* entries seen */
};

/* Add the blocks of what directory dfd holds (closed here) to w. Every step is relative to an
 * fd the walk opened itself, with O_NOFOLLOW and no symlink followed: a sandbox's process that
 * swaps a directory for a symlink mid-walk makes that open fail; it can never point the walk,
 * which runs as root, at a host directory. 0, or -1 past the bounds or on an error. */
static int walk_dir(int dfd, struct walk *w, int depth)
{
    DIR *dir = fdopendir(dfd);
    struct dirent *e;
    int r = 0;

    if (!dir) {
        close(dfd);
        return -1;
    }
    while (r == 0 && (e = readdir(dir))) {
        struct stat st;

        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (++w->entries > WALK_MAX_ENTRIES) {
            r = -1;
            break;
        }
        if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* gone meanwhile */
        if (st.st_dev != w->dev)
            continue; /* another file system mounted there */
        w->bytes += (int64_t)st.st_blocks * 512;
        if (S_ISDIR(st.st_mode)) {
            int sub;

            if (depth >= WALK_MAX_DEPTH) {
                r = -1;
                break;
            }
            sub = openat(dirfd(dir), e->d_name,
                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NOATIME | O_CLOEXEC);
            if (sub < 0 && errno == EPERM)
                sub =
                    openat(dirfd(dir), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0)
                r = walk_dir(sub, w, depth + 1);
        }
    }
    closedir(dir);
    return r;
}

/* Blocks used by the files under dir (one file system, symlinks never followed, bounded), or
 * -1. */
static int64_t dir_used(const char *dir)
{
    struct walk w = {0};
    struct stat st;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

    if (fd < 0)
        return -1;
    if (fstat(fd, &st) < 0) {
        close(fd);
        return -1;
    }
    w.dev = st.st_dev;
    w.bytes = (int64_t)st.st_blocks * 512;
    return walk_dir(fd, &w, 0) < 0 ? -1 : w.bytes;
}

int local_usage(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_usage *out,
                struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    struct local_desc d;
    struct statfs st;
    char dir[4352], img[4400];
    int64_t disk = -1, part;
    int r = local_desc_load_running(lp, ref, &d, err);

    if (r < 0)
        return r;
    cgroup_read_usage(&d.cg, out);
    local_sandbox_dir(lp, ref->id, dir, sizeof(dir));
    local_usage_base_apply(dir, out);
    snprintf(img, sizeof(img), "%s/img", dir);
    /* an image root's tmpfs (upper layer and, with storage tmpfs, the workspace) */
    if (statfs(img, &st) == 0 && (part = tmpfs_used(&st)) >= 0)
        disk = part;
    else if (lp->storage == LOCAL_STORAGE_TMPFS && (part = workdir_tmpfs_used(&d)) >= 0)
        disk = part;
    if (d.data[0] && (part = dir_used(d.data)) >= 0)
        disk = (disk < 0 ? 0 : disk) + part;
    out->disk_bytes = disk;
    local_desc_release(&d);
    return 0;
}
