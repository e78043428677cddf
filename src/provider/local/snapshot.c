/*
 * snapshot.c - the local provider's snapshot op (provider.h) and the restore of a snapshot's
 * workspace into a new sandbox (create.c). Layout on disk: docs/architecture.md, "Snapshots on
 * disk".
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
#include <linux/openat2.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/fault.h"
#include "util/log.h"

#define FREEZE_TIMEOUT_MS 5000
#define NOBODY_ID 65534u

/* cp -a SRC/. DST/ with the fd src_fd (or -1) inherited as fd 3 */
static int copy_tree(const char *src, int src_fd, const char *dst, struct lb_error *err)
{
    extern char **environ;
    posix_spawn_file_actions_t fa;
    char s[4400], d[4400];
    char *argv[] = {"cp", "-a", "--", s, d, NULL};
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

static uint32_t shifted(uint32_t id)
{
    if (id < (uint64_t)shift_from || id >= (uint64_t)shift_from + LOCAL_SLOT_IDS)
        return shift_to == 0 ? NOBODY_ID : (uint32_t)shift_to + NOBODY_ID;
    return (uint32_t)(id - shift_from + shift_to);
}

static int shift_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)flag;
    (void)ftw;
    if (lchown(path, shifted(st->st_uid), shifted(st->st_gid)) < 0 ||
        (!S_ISLNK(st->st_mode) && chmod(path, st->st_mode & 07777) < 0)) {
        shift_errno = errno;
        return 1; /* stop */
    }
    return 0;
}

/* Owners of the tree at path: ids from..from+65535 become to..to+65535. The chmod after the
 * chown restores the setuid/setgid bits the chown clears. */
static int shift_tree(const char *path, long from, long to, struct lb_error *err)
{
    shift_from = from;
    shift_to = to;
    shift_errno = 0;
    if (nftw(path, shift_entry, 32, FTW_PHYS | FTW_MOUNT) != 0)
        return lb_error_set(err, -EREMOTEIO, "cannot set the owners under '%s': %s", path,
                            strerror(shift_errno ? shift_errno : errno));
    return 0;
}

int local_tree_restore(const char *src, const char *dst, uid_t to, struct lb_error *err)
{
    int r = copy_tree(src, -1, dst, err);

    return r < 0 ? r : shift_tree(dst, 0, to, err);
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
    /* tests: a crash (delay + kill -9) with the sandbox frozen, the copy under way */
    r = fault_hit("snapshot.frozen", 0, err);
    snprintf(out, sizeof(out), "%s/rootfs", dest);
    if (r == 0 && d.image[0])
        r = copy_tree(layer, -1, out, err);
    snprintf(out, sizeof(out), "%s/workspace", dest);
    if (r == 0)
        r = copy_tree(d.workdir, wfd, out, err);
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
