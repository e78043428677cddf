/*
 * snapshot.c - the local provider's snapshot op (provider.h) and the restore of a snapshot's
 * workspace into a new sandbox of storage dir (create.c; with storage tmpfs the stored
 * workspace is an overlay's lower layer instead: image.c). Layout on disk:
 * docs/architecture.md, "Snapshots on disk".
 *
 * The copy is cp -a (coreutils: modes, owners, symlinks, xattrs including trusted.overlay.*,
 * timestamps, device nodes such as overlayfs's 0:0 whiteouts), run as the daemon's root on the
 * daemon's own mounts: the sandbox's overlay upper dir (<dir>/img/upper) or merged root, and its
 * workdir reached through /proc/<init>/root with openat2 RESOLVE_IN_ROOT (a symlink the sandbox
 * planted resolves inside the sandbox, never to a host file), handed to cp as an inherited fd.
 * The sandbox is frozen throughout, so nothing it runs can swap a directory for a symlink
 * while cp walks it. Owners are then shifted between the sandbox's slot of host ids and the
 * images' 0..65535 (ids outside the slot, such as the overlay's own whiteouts, become 65534).
 */
#include "provider/local/local_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <search.h>
#include <stdint.h>
#include <linux/openat2.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/fault.h"
#include "util/log.h"

#define FREEZE_TIMEOUT_MS 5000
#define NOBODY_ID 65534u

/* cp -a SRC/. DST/ with the fd src_fd (or -1) inherited as fd 3; one_fs: -x, what is
 * mounted below SRC is not copied (only its empty mount point) */
static int copy_tree(const char *src, int src_fd, const char *dst, bool one_fs,
                     struct lb_error *err)
{
    extern char **environ;
    posix_spawn_file_actions_t fa;
    char s[4400], d[4400];
    char *argv[] = {"cp", one_fs ? "-ax" : "-a", "--", s, d, NULL};
    pid_t pid;
    int r, status;

    snprintf(s, sizeof(s), "%s/.", src_fd >= 0 ? "/proc/self/fd/3" : src);
    snprintf(d, sizeof(d), "%s/", dst);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (src_fd >= 0)
        posix_spawn_file_actions_adddup2(&fa, src_fd, 3);
    r = posix_spawnp(&pid, "cp", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (r != 0)
        return lb_error_set(err, -EREMOTEIO, "cannot run cp: %s", strerror(r));
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return lb_error_set(err, -EREMOTEIO, "waiting for cp: %s", strerror(errno));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return lb_error_set(err, -EREMOTEIO, "cannot copy '%s' (cp %s %d)", src,
                            WIFEXITED(status) ? "exit" : "signal",
                            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    return 0;
}

/* nftw has no context: one shift at a time per thread */
static _Thread_local long shift_from, shift_to;
static _Thread_local int shift_errno;
static _Thread_local void *shift_seen; /* tsearch tree: inodes of several names, shifted once */

static uint32_t shifted(uint32_t id)
{
    if (id < (uint64_t)shift_from || id >= (uint64_t)shift_from + LOCAL_SLOT_IDS)
        return shift_to == 0 ? NOBODY_ID : (uint32_t)shift_to + NOBODY_ID;
    return (uint32_t)(id - shift_from + shift_to);
}

static int ino_cmp(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

    return x < y ? -1 : x > y;
}

static void ino_keep(void *key)
{
    (void)key; /* the key is the inode number itself */
}

static int shift_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)flag;
    (void)ftw;
    /* a hard link's inode is met once per name: shifting it again would take its new owner
     * for one outside the slot */
    if (!S_ISDIR(st->st_mode) && st->st_nlink > 1) {
        void *key = (void *)(uintptr_t)st->st_ino, **found = tfind(key, &shift_seen, ino_cmp);

        if (found)
            return 0;
        if (!tsearch(key, &shift_seen, ino_cmp)) {
            shift_errno = ENOMEM;
            return 1;
        }
    }
    if (lchown(path, shifted(st->st_uid), shifted(st->st_gid)) < 0 ||
        (!S_ISLNK(st->st_mode) && chmod(path, st->st_mode & 07777) < 0)) {
        shift_errno = errno;
        return 1; /* stop */
    }
    return 0;
}

/* Owners of the tree at path: ids from..from+65535 become to..to+65535, each inode once (a
 * hard link's other names are skipped). The chmod after the chown restores the setuid/setgid
 * bits the chown clears. */
static int shift_tree(const char *path, long from, long to, struct lb_error *err)
{
    int r;

    shift_from = from;
    shift_to = to;
    shift_errno = 0;
    shift_seen = NULL;
    r = nftw(path, shift_entry, 32, FTW_PHYS | FTW_MOUNT);
    tdestroy(shift_seen, ino_keep);
    shift_seen = NULL;
    if (r != 0)
        return lb_error_set(err, -EREMOTEIO, "cannot set the owners under '%s': %s", path,
                            strerror(shift_errno ? shift_errno : errno));
    return 0;
}

int local_tree_restore(const char *src, const char *dst, uid_t to, struct lb_error *err)
{
    int r = copy_tree(src, -1, dst, false, err);

    return r < 0 ? r : shift_tree(dst, 0, to, err);
}

/* ---- the capture's bound ----
 * Before a byte is copied (the sandbox frozen), the trees the capture copies are walked without
 * following a symlink or leaving their file system: a regular file counts the larger of its
 * size and its allocation (a sparse file counts in full: what the image says it holds, not what
 * it happens to use), anything else its allocation. The capture is refused when the sum passes
 * the sandbox's disk size or the entries pass one per KiB of it (-EFBIG: a tmpfs does not count
 * inodes against its size, the image store's disk does; and each costs the copy a file), when
 * the image store has not that much room (-ENOSPC), or
 * when a tree holds a device node (-EOPNOTSUPP: a node there came from elsewhere and is not
 * carried into an image). The one node allowed is overlayfs's 0:0 whiteout, and only in the
 * root layer (the overlay's upper dir), where overlayfs itself makes them for deleted files:
 * in the workdir, a plain tmpfs or directory, a 0:0 node is no whiteout, and stacked under a
 * later sandbox's overlay it would hide that path of the layers below. */
#define TALLY_BYTES_PER_ENTRY 1024
static _Thread_local int64_t tally_bytes, tally_cap, tally_entries;
static _Thread_local int tally_stop;          /* 0, or the negative errno that stopped the walk */
static _Thread_local bool tally_whiteouts;    /* 0:0 character devices allowed (the root layer) */
static _Thread_local dev_t tally_dev;         /* the walked tree's file system */
static _Thread_local char tally_path[512];    /* where the walk stopped, as the sandbox sees it */
static _Thread_local const char *tally_shown; /* the walked tree's path in the sandbox */
static _Thread_local size_t tally_skip;       /* length of the walked tree's host path */

static int tally_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    int64_t alloc = (int64_t)st->st_blocks * 512;

    (void)ftw;
    if (flag == FTW_NS || flag == FTW_DNR) {
        tally_stop = -EREMOTEIO;
    } else if ((S_ISCHR(st->st_mode) && (st->st_rdev != 0 || !tally_whiteouts)) ||
               S_ISBLK(st->st_mode)) {
        tally_stop = -EOPNOTSUPP;
    } else {
        tally_bytes += S_ISREG(st->st_mode) && st->st_size > alloc ? st->st_size : alloc;
        if (tally_bytes > tally_cap || ++tally_entries > tally_cap / TALLY_BYTES_PER_ENTRY)
            tally_stop = -EFBIG;
    }
    if (tally_stop) {
        const char *rest = strlen(path) >= tally_skip ? path + tally_skip : "";

        snprintf(tally_path, sizeof(tally_path), "%s%s", tally_shown,
                 rest[0] ? rest : (tally_shown[0] ? "" : "/"));
        return FTW_STOP;
    }
    /* what cp -x does: a directory of another file system (a mount point) is copied empty and
     * not entered; files are copied whatever device they report (an overlay's non-directories
     * report their layer's, not the overlay's) */
    return flag == FTW_D && st->st_dev != tally_dev ? FTW_SKIP_SUBTREE : FTW_CONTINUE;
}

/* Walk the tree at path (a host path); shown: its path inside the sandbox ("" for its root),
 * for the messages. */
static int tally_tree(const char *path, const char *shown, bool whiteouts, struct lb_error *err)
{
    struct stat st;

    tally_stop = 0;
    tally_whiteouts = whiteouts;
    tally_shown = shown;
    tally_skip = strlen(path);
    if (stat(path, &st) < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot read '%s' for the snapshot",
                            shown[0] ? shown : "/");
    tally_dev = st.st_dev;
    /* not FTW_MOUNT: that would leave out every file whose device is not the tree's, and the
     * files of an overlay's lower layers (a workdir seeded from a snapshot) all are */
    if (nftw(path, tally_entry, 32, FTW_PHYS | FTW_ACTIONRETVAL) == 0)
        return 0;
    switch (tally_stop) {
    case -EFBIG:
        return lb_error_set(err, -EFBIG,
                            "the snapshot would hold more than the sandbox's disk size (%lld "
                            "bytes; a sparse file counts its full size) or more than %lld files",
                            (long long)tally_cap, (long long)(tally_cap / TALLY_BYTES_PER_ENTRY));
    case -EOPNOTSUPP:
        return lb_error_set(err, -EOPNOTSUPP,
                            "the sandbox's file system holds a device node ('%s'): it is not "
                            "captured",
                            tally_path);
    default:
        return lb_error_set(err, -EREMOTEIO, "cannot read '%s' for the snapshot",
                            tally_stop ? tally_path : (shown[0] ? shown : "/"));
    }
}

/* The sandbox's disk size. An image sandbox's: the tmpfs at <dir>/img that its root layer (and
 * with storage tmpfs its workdir) lives on, the daemon's own mount, sized at create (disk_mib).
 * A host sandbox's with storage tmpfs: the tmpfs its workdir lives on. Else
 * local.tmp_size_mib (storage dir). The daemon's mount is asked first: the workdir is reached
 * through the sandbox's root, where what is mounted at it is the sandbox's to change. */
static int64_t capture_cap(const struct local_provider *lp, const char *dir, int wfd)
{
    char img[4400];
    struct statfs sf;

    snprintf(img, sizeof(img), "%s/img", dir);
    if (statfs(img, &sf) == 0 && sf.f_type == TMPFS_MAGIC)
        return (int64_t)sf.f_blocks * (int64_t)sf.f_bsize;
    if (lp->storage == LOCAL_STORAGE_TMPFS && fstatfs(wfd, &sf) == 0 && sf.f_type == TMPFS_MAGIC)
        return (int64_t)sf.f_blocks * (int64_t)sf.f_bsize;
    return lp->tmp_size_mib * 1024 * 1024;
}

/* The bound, checked over the trees the capture copies (layer: NULL without one; the workdir
 * through its fd), and the room in dest's file system. */
static int capture_check(const struct local_provider *lp, const char *dir, const char *layer,
                         int wfd, const char *workdir, const char *dest, struct lb_error *err)
{
    char wpath[64];
    struct statvfs vf;
    int r = 0;

    tally_bytes = 0;
    tally_entries = 0;
    tally_cap = capture_cap(lp, dir, wfd);
    if (layer)
        r = tally_tree(layer, "", true, err);
    snprintf(wpath, sizeof(wpath), "/proc/self/fd/%d/.", wfd);
    if (r == 0)
        r = tally_tree(wpath, workdir, false, err);
    if (r == 0 && statvfs(dest, &vf) == 0 &&
        (uint64_t)tally_bytes > (uint64_t)vf.f_bavail * vf.f_frsize)
        r = lb_error_set(err, -ENOSPC,
                         "the image store has no room for the snapshot (%lld bytes needed)",
                         (long long)tally_bytes);
    return r;
}

/* An O_PATH fd of the sandbox's workdir, resolved inside its root. */
static int open_workdir(const struct local_desc *d, int *fd_out, struct lb_error *err)
{
    struct open_how how = {.flags = O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
                           .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
    char proc[64];
    int root, fd;

    snprintf(proc, sizeof(proc), "/proc/%d/root", (int)d->pid);
    root = open(proc, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0)
        return lb_error_set(err, -ENOENT, "the sandbox is not running");
    fd = (int)syscall(SYS_openat2, root, d->workdir, &how, sizeof(how));
    close(root);
    if (fd < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot open the sandbox's workdir '%s': %s",
                            d->workdir, strerror(errno));
    *fd_out = fd;
    return 0;
}

int local_snapshot(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *dest,
                   bool flatten, struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    char dir[4352], layer[4400], out[4400];
    struct local_desc d;
    bool was_frozen = false, froze = false;
    int r, wfd = -1;
    struct stat st;

    r = local_desc_load_running(lp, ref, &d, err);
    if (r < 0)
        return r;
    if (d.cg.version == 0) {
        r = lb_error_set(err, -EREMOTEIO, "sandbox '%s' has no cgroup to freeze", ref->id);
        goto out;
    }
    local_sandbox_dir(lp, ref->id, dir, sizeof(dir));
    snprintf(layer, sizeof(layer), "%s/img/%s", dir, flatten ? "root" : "upper");
    if (d.image[0] && (lstat(layer, &st) < 0 || !S_ISDIR(st.st_mode))) {
        r = lb_error_set(err, -EREMOTEIO,
                         "the root layer of sandbox '%s' is not reachable from this daemon",
                         ref->id);
        goto out;
    }
    r = open_workdir(&d, &wfd, err);
    if (r < 0)
        goto out;
    cgroup_is_frozen(&d.cg, &was_frozen);
    if (!was_frozen) {
        r = cgroup_set_frozen(&d.cg, true, FREEZE_TIMEOUT_MS, err);
        if (r < 0)
            goto out;
        froze = true;
    }
    /* counted on the layer the sandbox writes (a flattened copy adds the stored trees below) */
    snprintf(out, sizeof(out), "%s/img/upper", dir);
    r = capture_check(lp, dir, d.image[0] ? out : NULL, wfd, d.workdir, dest, err);
    /* tests: a crash (delay + kill -9) with the sandbox frozen, the copy under way */
    if (r == 0)
        r = fault_hit("snapshot.frozen", 0, err);
    snprintf(out, sizeof(out), "%s/rootfs", dest);
    if (r == 0 && d.image[0])
        r = copy_tree(layer, -1, out, true, err);
    snprintf(out, sizeof(out), "%s/workspace", dest);
    if (r == 0)
        r = copy_tree(d.workdir, wfd, out, true, err);
    if (froze) {
        struct lb_error thaw = {0};

        if (cgroup_set_frozen(&d.cg, false, FREEZE_TIMEOUT_MS, &thaw) < 0 && r == 0)
            r = lb_error_set(err, -EREMOTEIO, "cannot thaw sandbox '%s': %s", ref->id,
                             thaw.message);
    }
    if (r < 0)
        goto out;
    snprintf(out, sizeof(out), "%s/rootfs", dest);
    r = shift_tree(out, d.uid, 0, err);
    snprintf(out, sizeof(out), "%s/workspace", dest);
    if (r == 0)
        r = shift_tree(out, d.uid, 0, err);
out:
    if (wfd >= 0)
        close(wfd);
    local_desc_release(&d);
    return r;
}
