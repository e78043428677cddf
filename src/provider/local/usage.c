/*
 * usage.c - the usage op of the local provider: what a running sandbox uses now, read from its
 * cgroups (cgroup_read_usage) and from its writable storage: the tmpfs of an image sandbox's
 * root (<dir>/img: the overlay's upper layer, and with storage tmpfs its workspace too), the
 * workdir's own tmpfs inside its mount namespace (a host-root sandbox with storage tmpfs), and
 * the host directory bound at its workdir (storage dir: a walk that adds up its files' blocks).
 */
#include "provider/local/local_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

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

/* nftw has no context argument: the walk's running total, per thread. */
static _Thread_local int64_t walk_bytes;

static int walk_add(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)path;
    (void)ftw;
    if (type == FTW_F || type == FTW_D || type == FTW_SL)
        walk_bytes += (int64_t)st->st_blocks * 512;
    return 0;
}

/* Blocks used by the files under dir (one file system, symlinks not followed), or -1. */
static int64_t dir_used(const char *dir)
{
    walk_bytes = 0;
    if (nftw(dir, walk_add, 16, FTW_PHYS | FTW_MOUNT) < 0)
        return -1;
    return walk_bytes;
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
