/*
 * local_image.c - a writable copy-on-write root over a read-only image tree (issue 9).
 *
 * In the daemon's mount namespace, under the sandbox's directory:
 *   <dir>/img-lower  the image tree, cloned (open_tree OPEN_TREE_CLONE) and idmapped
 *                    (mount_setattr MOUNT_ATTR_IDMAP, read-only) with a user namespace that
 *                    maps 0 -> the sandbox's uid, so the image's root-owned files belong to
 *                    the sandbox's root without a copy or a chown
 *   <dir>/img-upper  a tmpfs of the sandbox's disk size holding upper/, work/ and
 *                    workspace/, owned by the sandbox's uid: every write to / lands here and
 *                    counts against it, and so does /workspace (bwrap binds workspace/ there
 *                    with storage tmpfs): one disk_mib budget for both
 *   <dir>/img-root   overlayfs lowerdir=img-lower, upperdir=img-upper/upper,
 *                    workdir=img-upper/work; bwrap binds it as the sandbox's /
 * bwrap copies these mounts into the sandbox's mount namespace when it starts; the daemon's
 * copies are detached (umount2 MNT_DETACH) when the sandbox is destroyed, and the kernel frees
 * the tmpfs when the last namespace holding it dies. The image tree itself is never written:
 * its mount is read-only and overlayfs writes only to the upper dir.
 */
#include "provider/local_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"

static const char *const mount_names[] = {"img-root", "img-lower", "img-upper"};

/* An fd of a user namespace mapping uid and gid 0 to uid (one id), or a negative errno. */
static int userns_for_uid(uid_t uid)
{
    char path[64], map[64];
    int go[2], ready[2], fd = -1, r, st, mfd;
    pid_t pid;
    char c;

    if (pipe2(go, O_CLOEXEC) < 0)
        return -errno;
    if (pipe2(ready, O_CLOEXEC) < 0) {
        r = -errno;
        close(go[0]);
        close(go[1]);
        return r;
    }
    pid = fork();
    if (pid < 0) {
        r = -errno;
        goto out;
    }
    if (pid == 0) {   /* async-signal-safe calls only */
        close(go[1]); /* else read below never sees the parent's close */
        c = syscall(SYS_unshare, CLONE_NEWUSER) == 0 ? 'u' : 'e';
        (void)write(ready[1], &c, 1);
        (void)read(go[0], &c, 1); /* until the parent closes go[1] */
        _exit(0);
    }
    close(ready[1]);
    ready[1] = -1;
    if (read(ready[0], &c, 1) != 1 || c != 'u') {
        r = -EPERM;
        goto kill;
    }
    r = 0;
    for (int i = 0; i < 2 && r == 0; i++) {
        snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, i ? "gid_map" : "uid_map");
        snprintf(map, sizeof(map), "0 %u 1\n", (unsigned)uid);
        mfd = open(path, O_WRONLY | O_CLOEXEC);
        if (mfd < 0 || write(mfd, map, strlen(map)) != (ssize_t)strlen(map))
            r = -errno;
        if (mfd >= 0)
            close(mfd);
    }
    if (r == 0) {
        snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)pid);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            r = -errno;
    }
kill:
    close(go[1]);
    go[1] = -1;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
out:
    if (go[0] >= 0)
        close(go[0]);
    if (go[1] >= 0)
        close(go[1]);
    close(ready[0]);
    if (ready[1] >= 0)
        close(ready[1]);
    return r < 0 ? r : fd;
}

/* Mount image_root at target, read-only and idmapped 0 -> uid. */
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
    ns = userns_for_uid(uid);
    if (ns < 0) {
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

int local_image_mount(const char *dir, const char *image_root, uid_t uid, int64_t upper_mib,
                      char *root_out, size_t size, struct lb_error *err)
{
    char p[3][4400], up[4416], work[4416], ws[4416], opts[4416 * 3 + 64];
    int r;

    for (int i = 0; i < 3; i++) {
        snprintf(p[i], sizeof(p[i]), "%s/%s", dir, mount_names[i]);
        if (mkdir(p[i], 0711) < 0 && errno != EEXIST)
            return lb_error_set(err, -EREMOTEIO, "cannot make '%s': %s", p[i], strerror(errno));
    }
    snprintf(opts, sizeof(opts), "size=%lldm,mode=0700,uid=%u,gid=%u", (long long)upper_mib,
             (unsigned)uid, (unsigned)uid);
    if (mount("tmpfs", p[2], "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot mount the root's upper tmpfs: %s",
                            strerror(errno));
    snprintf(up, sizeof(up), "%s/upper", p[2]);
    snprintf(work, sizeof(work), "%s/work", p[2]);
    snprintf(ws, sizeof(ws), "%s/" LOCAL_IMAGE_WORKSPACE, p[2]);
    if (mkdir(up, 0755) < 0 || chown(up, uid, uid) < 0 || mkdir(work, 0700) < 0 ||
        chown(work, uid, uid) < 0 || mkdir(ws, 0755) < 0 || chown(ws, uid, uid) < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot make the root's upper dir: %s",
                            strerror(errno));
    r = mount_idmapped(image_root, p[1], uid, err);
    if (r < 0)
        return r;
    snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s", p[1], up, work);
    if (mount("overlay", p[0], "overlay", MS_NOSUID | MS_NODEV, opts) < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot mount the overlay root: %s", strerror(errno));
    snprintf(root_out, size, "%s", p[0]);
    return 0;
}

int local_image_unmount(const char *dir, struct lb_error *err)
{
    char p[4400];
    int r = 0;

    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, mount_names[i]);
        /* a mount point may hold more than one mount (a retried create): detach them all */
        while (umount2(p, MNT_DETACH | UMOUNT_NOFOLLOW) == 0)
            ;
        if (errno != EINVAL && errno != ENOENT && r == 0)
            r = lb_error_set(err, -EREMOTEIO, "cannot unmount '%s': %s", p, strerror(errno));
        if (rmdir(p) < 0 && errno != ENOENT && r == 0)
            r = lb_error_set(err, -EREMOTEIO, "cannot remove '%s': %s", p, strerror(errno));
    }
    return r;
}
