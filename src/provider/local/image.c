/*
 * image.c - a writable copy-on-write root over a read-only image tree (the root of a
 * sandbox made from an image of the image store).
 *
 * In the daemon's mount namespace, under the sandbox's directory, one tmpfs holds it all:
 *   <dir>/img            a tmpfs of the sandbox's disk size, owned by the sandbox's uid, with
 *     upper/ work/       the overlay's upper and work dirs: every write to / lands here
 *     workspace/         the sandbox's workdir (bwrap binds it there with storage tmpfs), so
 *                        / and /workspace share one disk_mib budget
 *     lower/             the image tree, cloned (open_tree OPEN_TREE_CLONE) and idmapped
 *                        (mount_setattr MOUNT_ATTR_IDMAP, read-only, nosuid, nodev) with a user
 *                        namespace that maps 0..65535 -> the sandbox's slot, so the image's
 *                        files belong to the sandbox's root and users (uid N -> slot + N)
 *                        without a copy or a chown
 *     root/              overlayfs lowerdir=lower, upperdir=upper, workdir=work; bwrap binds
 *                        it as the sandbox's /
 *     layers/N/          a snapshot's trees (its layer, the layers below, the base image's
 *                        tree), each cloned and idmapped as lower/ is; lower/ is then a
 *                        read-only overlay of them instead of the one idmapped tree
 *     ws-lower/          a snapshot's stored workspace, cloned and idmapped as lower/ is, and
 *     ws-upper/ ws-work/ an overlay's upper and work dirs: workspace/ is then overlayfs of the
 *                        three (storage tmpfs), so a seed from a snapshot (every fork child)
 *                        copies none of the snapshot's workspace; its writes land in ws-upper
 *                        on this tmpfs, against the sandbox's disk size as before
 * A seed from a snapshot of a host sandbox mounts the tmpfs for its workspace only.
 * bwrap copies these mounts into the sandbox's mount namespace when it starts; the daemon's
 * copies are detached when the sandbox is destroyed, all of them with one umount2(MNT_DETACH)
 * of <dir>/img (a lazy unmount takes the mounts below it along: one grace period of the kernel's
 * mount lock instead of one per mount), and the kernel frees the tmpfs when the last namespace
 * holding it dies. The image tree itself is never written: its mount is read-only and overlayfs
 * writes only to the upper dir. (Sandboxes made before this layout have img-root, img-lower and
 * img-upper mounts of their own; local_image_unmount detaches those too.)
 */
#include "provider/local/local_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"

#define IMG_DIR "img"
static const char *const legacy_names[] = {"img-root", "img-lower", "img-upper"};

/* Mount image_root at target, read-only and idmapped 0..65535 -> the slot at uid. */
static int mount_idmapped(const char *image_root, const char *target, uid_t uid,
                          struct lb_error *err)
{
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID |
                                          MOUNT_ATTR_NODEV};
    int tree, ns, r = 0;

    tree = (int)syscall(SYS_open_tree, AT_FDCWD, image_root,
                        OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (tree < 0)
        return lb_error_set(err, -errno, "cannot clone the image tree '%s': %s", image_root,
                            strerror(errno));
    r = local_userns_open(0, uid, LOCAL_SLOT_IDS, &ns);
    if (r < 0) {
        ns = r;
        r = lb_error_set(err, ns, "cannot make the image's user namespace: %s", strerror(-ns));
        goto out;
    }
    attr.userns_fd = (uint64_t)ns;
    if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof(attr)) <
        0) {
        r = lb_error_set(err, -errno, "cannot idmap the image tree: %s", strerror(errno));
        goto out;
    }
    if (syscall(SYS_move_mount, tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) < 0)
        r = lb_error_set(err, -errno, "cannot mount the image tree: %s", strerror(errno));
out:
    if (ns >= 0)
        close(ns);
    close(tree);
    return r;
}

int local_image_mount(const char *dir, const char *const *layers, size_t n, uid_t uid,
                      int64_t upper_mib, char *root_out, size_t size, struct lb_error *err)
{
    static const char *const subdirs[] = {"upper", "work", LOCAL_IMAGE_WORKSPACE, "lower", "root"};
    char img[4400], p[5][4416], opts[4416 * 3 + 64];
    int r;

    if (root_out && size)
        root_out[0] = '\0';
    snprintf(img, sizeof(img), "%s/" IMG_DIR, dir);
    if (mkdir(img, 0711) < 0 && errno != EEXIST)
        return lb_error_set(err, -EREMOTEIO, "cannot make '%s': %s", img, strerror(errno));
    snprintf(opts, sizeof(opts), "size=%lldm,mode=0700,uid=%u,gid=%u", (long long)upper_mib,
             (unsigned)uid, (unsigned)uid);
    if (mount("tmpfs", img, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot mount the root's tmpfs: %s", strerror(errno));
    for (int i = 0; i < 5; i++) {
        snprintf(p[i], sizeof(p[i]), "%s/%s", img, subdirs[i]);
        mode_t mode = i == 1 ? 0700 : 0755;

        /* a host root has no lower/ (a grader's trusted view would take it for the image) */
        if (n == 0 && i != 2)
            continue;

        /* chmod too: the daemon's umask (077) would leave the sandbox's / (the upper dir's
         * mode) and workdir 0700, closed to every user but root */
        if (mkdir(p[i], mode) < 0 || chmod(p[i], mode) < 0 || (i < 3 && chown(p[i], uid, uid) < 0))
            return lb_error_set(err, -EREMOTEIO, "cannot make '%s': %s", p[i], strerror(errno));
    }
    if (n == 0) /* a host root: only the workspace lives here */
        return 0;
    if (n == 1) {
        r = mount_idmapped(layers[0], p[3], uid, err);
    } else { /* a snapshot: each layer idmapped, a read-only overlay of them as the lower */
        char dirs[LOCAL_IMAGE_LAYERS_MAX][4440], lower[LOCAL_IMAGE_LAYERS_MAX * 4441 + 16];
        size_t len = 0;

        if (n > LOCAL_IMAGE_LAYERS_MAX)
            return lb_error_set(err, -EINVAL, "too many image layers (%zu)", n);
        snprintf(dirs[0], sizeof(dirs[0]), "%s/layers", img);
        if (mkdir(dirs[0], 0700) < 0)
            return lb_error_set(err, -EREMOTEIO, "cannot make '%s': %s", dirs[0], strerror(errno));
        len = (size_t)snprintf(lower, sizeof(lower), "lowerdir=");
        for (size_t i = 0; i < n; i++) {
            snprintf(dirs[i], sizeof(dirs[i]), "%s/layers/%zu", img, i);
            if (mkdir(dirs[i], 0700) < 0)
                return lb_error_set(err, -EREMOTEIO, "cannot make '%s': %s", dirs[i],
                                    strerror(errno));
            r = mount_idmapped(layers[i], dirs[i], uid, err);
            if (r < 0)
                return r;
            len +=
                (size_t)snprintf(lower + len, sizeof(lower) - len, "%s%s", i ? ":" : "", dirs[i]);
        }
        if (len >= sizeof(lower) || len > 4000)
            return lb_error_set(err, -ENAMETOOLONG, "the image's layers' paths are too long");
        r = mount("overlay", p[3], "overlay", MS_RDONLY | MS_NOSUID | MS_NODEV, lower) < 0
                ? lb_error_set(err, -EREMOTEIO, "cannot mount the snapshot's layers: %s",
                               strerror(errno))
                : 0;
    }
    if (r < 0)
        return r;
    snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s", p[3], p[0], p[1]);
    if (mount("overlay", p[4], "overlay", MS_NOSUID | MS_NODEV, opts) < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot mount the overlay root: %s", strerror(errno));
    snprintf(root_out, size, "%s", p[4]);
    return 0;
}

static const char *const ws_overlay_extra[] = {",redirect_dir=on,index=on", ",redirect_dir=on", ""};

/* nftw has no context, and needs none here */
static int ws_device_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)path;
    (void)ftw;
    return flag == FTW_NS || flag == FTW_DNR || S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode);
}

bool local_image_workspace_has_devices(const char *stored)
{
    return nftw(stored, ws_device_entry, 32, FTW_PHYS) != 0;
}

int local_image_mount_workspace(const char *dir, const char *stored, uid_t uid,
                                struct lb_error *err)
{
    static const char *const names[] = {"ws-lower", "ws-upper", "ws-work", LOCAL_IMAGE_WORKSPACE};
    char p[4][4416], opts[4416 * 3 + 64];
    struct stat st;
    uid_t owner;
    gid_t group;
    int r;

    if (stat(stored, &st) < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot read the snapshot's workspace '%s': %s",
                            stored, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return lb_error_set(err, -EREMOTEIO, "the snapshot's workspace '%s' is not a directory",
                            stored);
    /* the workdir's own owner and mode are the upper dir's (overlayfs shows the upper's) */
    owner = uid + (st.st_uid < LOCAL_SLOT_IDS ? st.st_uid : 65534);
    group = uid + (st.st_gid < LOCAL_SLOT_IDS ? st.st_gid : 65534);
    for (int i = 0; i < 4; i++) {
        snprintf(p[i], sizeof(p[i]), "%s/" IMG_DIR "/%s", dir, names[i]);
        if (i == 3)
            break; /* local_image_mount made it */
        if (mkdir(p[i], 0700) < 0 ||
            (i == 1 && (chown(p[i], owner, group) < 0 || chmod(p[i], st.st_mode & 07777) < 0)))
            return lb_error_set(err, -EREMOTEIO, "cannot make '%s': %s", p[i], strerror(errno));
    }
    r = mount_idmapped(stored, p[0], uid, err);
    if (r < 0)
        return r;
    /* redirect_dir: a directory of the snapshot can be renamed (without it rename(2) answers
     * EXDEV, which mv works around and git, Python's os.rename, Go and Rust do not); index: a
     * hard link of the snapshot stays one link when one of its names is written (copied up
     * once). Both are private to this mount: the capture reads the merged view, never the
     * upper dir, so no overlay xattr reaches the store. A kernel that refuses an option
     * (EINVAL) gets the mount without it. */
    for (size_t i = 0; i < sizeof(ws_overlay_extra) / sizeof(ws_overlay_extra[0]); i++) {
        snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s%s", p[0], p[1], p[2],
                 ws_overlay_extra[i]);
        if (mount("overlay", p[3], "overlay", MS_NOSUID | MS_NODEV, opts) == 0)
            return 0;
        if (errno != EINVAL)
            break;
    }
    return lb_error_set(err, -EREMOTEIO, "cannot mount the snapshot's workspace: %s",
                        strerror(errno));
}

/* Detach every mount at path (a retried create may have stacked more than one) and remove
 * the directory. */
static int detach_and_remove(const char *path, struct lb_error *err)
{
    while (umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) == 0)
        ;
    if (errno != EINVAL && errno != ENOENT)
        return lb_error_set(err, -EREMOTEIO, "cannot unmount '%s': %s", path, strerror(errno));
    if (rmdir(path) < 0 && errno != ENOENT)
        return lb_error_set(err, -EREMOTEIO, "cannot remove '%s': %s", path, strerror(errno));
    return 0;
}

int local_image_unmount(const char *dir, struct lb_error *err)
{
    char p[4400];
    int r;

    snprintf(p, sizeof(p), "%s/" IMG_DIR, dir);
    r = detach_and_remove(p, err); /* the tmpfs and the two mounts on it */
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, legacy_names[i]);
        if (detach_and_remove(p, r < 0 ? NULL : err) < 0 && r == 0)
            r = -EREMOTEIO;
    }
    return r;
}

void local_image_workspace(const char *dir, char *out, size_t size)
{
    snprintf(out, size, "%s/" IMG_DIR "/" LOCAL_IMAGE_WORKSPACE, dir);
}
