/*
 * files.c - the local provider's file_write, streamed uploads and file_open.
 *
 * The daemon does the I/O itself, through the sandbox's root: /proc/<init>/root is opened
 * (as root, after the identity check), and every path is resolved from it with
 * openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS), so ".." stops at the sandbox's "/" and an
 * absolute symlink means the sandbox's "/", never the host's. For the duration of the
 * operation the calling thread takes the sandbox's file-system identity: setfsuid/setfsgid to
 * the sandbox's host uid, and an empty effective capability set (both are per-thread), so the
 * daemon's root privileges never read or write what the sandbox's own root could not (host
 * /etc/shadow is EACCES, a read-only bind is EROFS). Both are restored on every path.
 * Requires that the daemon has dropped its supplementary groups (they would count).
 *
 * Writes go to a temporary name in the target directory and are renamed into place, so a
 * reader never sees half a file and a symlink at the target is replaced, not followed. A
 * streamed upload (upload_begin) keeps that temporary file open for the HTTP front end to fill
 * chunk by chunk; commit renames it, abort removes it.
 *
 * Memory. A file on a memory-backed mount (tmpfs: /tmp, /run, /dev/shm, a tmpfs workdir; an
 * image's writable root, an overlay on a tmpfs) is held in memory, and tmpfs charges each page to
 * the memory cgroup of the process that allocates it: written by the daemon, it would count against
 * the daemon, not the sandbox's memory limit. So before bytes are written there, upload_reserve has
 * a helper (lendbox-supervise --reserve) that joins the sandbox's memory cgroup allocate them
 * (fallocate, size kept); the daemon then writes into pages that already exist and are the
 * sandbox's. What the limit cannot hold fails the reservation (413) before a byte is written;
 * the helper is the out-of-memory killer's first choice, so the sandbox's own processes are
 * spared. Commit gives back what was reserved but not written.
 */
#include "provider/local/local_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/random.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "provider/local/spawn.h"
#include "supervisor/user.h"
#include "util/clock.h"

#define OPENAT2_RETRIES 16
#define RESERVE_WAIT_MS 10000 /* the reserve helper's bound; then it is killed */
#define RESERVE_REAP_MS 5000
#define RESERVE_MARGIN (1024 * 1024) /* memory left free when reserving ahead of the bytes */

/* Become the sandbox (uid) for file-system purposes, on this thread only. */
int local_fs_enter(struct local_fs_identity *id, uint32_t uid, struct lb_error *err)
{
    struct __user_cap_data_struct none[2];

    memset(id, 0, sizeof(*id));
    if (getgroups(0, NULL) != 0)
        return lb_error_set(err, -EREMOTEIO,
                            "the daemon still has supplementary groups; it must drop them "
                            "(setgroups(0, NULL)) at startup");
    id->cap_hdr.version = _LINUX_CAPABILITY_VERSION_3;
    id->cap_hdr.pid = 0;
    if (syscall(SYS_capget, &id->cap_hdr, id->caps) < 0)
        return lb_error_set(err, -EREMOTEIO, "capget: %s", strerror(errno));
    id->old_fsgid = (int)syscall(SYS_setfsgid, uid);
    id->old_fsuid = (int)syscall(SYS_setfsuid, uid);
    id->active = true;
    memcpy(none, id->caps, sizeof(none));
    none[0].effective = none[1].effective = 0;
    if ((uint32_t)syscall(SYS_setfsuid, -1) != uid || (uint32_t)syscall(SYS_setfsgid, -1) != uid ||
        syscall(SYS_capset, &id->cap_hdr, none) < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot take the sandbox's file-system identity");
    return 0;
}

/* fchown(fd, uid, gid) with CAP_CHOWN effective for this one call (the thread acts as the
 * sandbox's root otherwise): an upload's new file, given to one of the sandbox's ids. */
static int fs_chown_fd(const struct local_fs_identity *id, int fd, uint32_t uid, uint32_t gid)
{
    struct __user_cap_header_struct hdr = id->cap_hdr;
    struct __user_cap_data_struct caps[2];
    int r = 0;

    memcpy(caps, id->caps, sizeof(caps));
    caps[0].effective = caps[0].permitted & (1u << CAP_CHOWN);
    caps[1].effective = 0;
    if (syscall(SYS_capset, &hdr, caps) < 0)
        return -errno;
    if (fchown(fd, uid, gid) < 0)
        r = -errno;
    caps[0].effective = 0;
    (void)syscall(SYS_capset, &hdr, caps);
    return r;
}

void local_fs_leave(struct local_fs_identity *id)
{
    if (!id->active)
        return;
    (void)syscall(SYS_capset, &id->cap_hdr, id->caps);
    (void)syscall(SYS_setfsuid, id->old_fsuid);
    (void)syscall(SYS_setfsgid, id->old_fsgid);
    id->active = false;
}

int local_open_in_root(int rootfd, const char *path, uint64_t flags, uint64_t mode)
{
    struct open_how how = {
        .flags = flags | O_CLOEXEC,
        .mode = mode,
        .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS,
    };
    int i, fd = -1;

    /* EAGAIN: a concurrent rename inside the root; the kernel asks for a retry */
    for (i = 0; i < OPENAT2_RETRIES; i++) {
        fd = (int)syscall(SYS_openat2, rootfd, path, &how, sizeof(how));
        if (fd >= 0 || errno != EAGAIN)
            break;
    }
    return fd < 0 ? -errno : fd;
}

int local_map_errno(int e, const char *path, struct lb_error *err)
{
    switch (e) {
    case ENOENT:
        return lb_error_set(err, -ENOENT, "no such file '%s'", path);
    case EISDIR:
        return lb_error_set(err, -EISDIR, "'%s' is a directory", path);
    case ENOTDIR:
        return lb_error_set(err, -ENOTDIR, "a parent of '%s' is not a directory", path);
    case EROFS:
        return lb_error_set(err, -EROFS, "'%s' is on a read-only file system", path);
    case EACCES:
    case EPERM:
        return lb_error_set(err, -EACCES, "permission denied for '%s'", path);
    case ELOOP:
        return lb_error_set(err, -ELOOP, "too many symlinks (or a /proc magic link) in '%s'", path);
    case ENAMETOOLONG:
        return lb_error_set(err, -ENAMETOOLONG, "path '%s' is too long", path);
    case ENOSPC:
    case EDQUOT:
        return lb_error_set(err, -EFBIG, "no space left for '%s'", path);
    default:
        return lb_error_set(err, -EREMOTEIO, "cannot access '%s': %s", path, strerror(e));
    }
}

/* Open the running sandbox's root (as the daemon), after checking it is the sandbox. */
int local_open_root(struct local_provider *lp, const struct lb_sandbox_ref *ref,
                    struct local_desc *d, const char *path, int *rootfd, struct lb_error *err)
{
    char proc[64];
    int r;

    *rootfd = -1;
    if (!provider_path_is_valid(path) || strcmp(path, "/") == 0)
        return lb_error_set(err, -EINVAL, "invalid path");
    r = local_desc_load(lp, ref, d, err);
    if (r < 0)
        return r;
    if (!local_desc_alive(d))
        return local_not_running(lp, ref->id, d, err);
    snprintf(proc, sizeof(proc), "/proc/%d/root", (int)d->pid);
    *rootfd = open(proc, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (*rootfd < 0)
        return lb_error_set(err, -ENOENT, "sandbox '%s' is not running", ref->id);
    if (!local_desc_alive(d)) {
        close(*rootfd);
        *rootfd = -1;
        return lb_error_set(err, -ENOENT, "sandbox '%s' is not running", ref->id);
    }
    return 0;
}

/* Open (O_PATH) the directory dir inside the root, creating missing components (0755) one
 * at a time, each resolved inside the root. Returns an fd or -errno. */
int local_open_parent(int rootfd, const char *dir)
{
    char prefix[4097];
    const char *c;
    int cur, next;

    cur = local_open_in_root(rootfd, dir, O_PATH | O_DIRECTORY, 0);
    if (cur != -ENOENT)
        return cur;
    cur = local_open_in_root(rootfd, "/", O_PATH | O_DIRECTORY, 0);
    if (cur < 0)
        return cur;
    for (c = dir + 1; *c;) {
        size_t n = strcspn(c, "/"), plen = (size_t)(c - dir) + n;
        char name[256];

        if (n >= sizeof(name) || plen >= sizeof(prefix)) {
            close(cur);
            return -ENAMETOOLONG;
        }
        memcpy(name, c, n);
        name[n] = '\0';
        memcpy(prefix, dir, plen);
        prefix[plen] = '\0';
        next = local_open_in_root(rootfd, prefix, O_PATH | O_DIRECTORY, 0);
        if (next == -ENOENT) {
            if (mkdirat(cur, name, 0755) < 0 && errno != EEXIST) {
                next = -errno;
                close(cur);
                return next;
            }
            /* the daemon's umask (077) must not decide the sandbox's directory modes */
            (void)fchmodat(cur, name, 0755, AT_SYMLINK_NOFOLLOW);
            next = local_open_in_root(rootfd, prefix, O_PATH | O_DIRECTORY, 0);
        }
        close(cur);
        if (next < 0)
            return next;
        cur = next;
        c += n;
        if (*c == '/')
            c++;
    }
    return cur;
}

static int write_all(int fd, const void *data, size_t len)
{
    const char *p = data;

    while (len > 0) {
        ssize_t n = write(fd, p, len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* A write that found its file system full: every writable mount of a sandbox is sized from
 * its limits (resources.disk_mib, memory_mib), so name the size it ran into. -EFBIG (413). */
static int no_space(int dfd, size_t len, const char *path, struct lb_error *err)
{
    struct statfs fs;

    if (fstatfs(dfd, &fs) < 0)
        return lb_error_set(err, -EFBIG, "no space left for '%s'", path);
    return lb_error_set(err, -EFBIG,
                        "%zu bytes do not fit at '%s': the sandbox's file system there is full "
                        "(%llu MiB, sized from the sandbox's resources.disk_mib / memory_mib)",
                        len, path,
                        (unsigned long long)fs.f_blocks * (unsigned long long)fs.f_bsize >> 20);
}

/* Is dfd/name (not followed) the root of a mount other than its directory's? */
bool local_is_mount_point(int dfd, const char *name)
{
    struct statx parent, target;

    if (statx(dfd, name, AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &target) < 0)
        return false; /* does not exist (yet) */
    if (statx(dfd, "", AT_EMPTY_PATH, STATX_MNT_ID, &parent) < 0)
        return true; /* cannot tell: refuse */
    if (!(target.stx_mask & STATX_MNT_ID) || !(parent.stx_mask & STATX_MNT_ID))
        return target.stx_dev_major != parent.stx_dev_major ||
               target.stx_dev_minor != parent.stx_dev_minor;
    return target.stx_mnt_id != parent.stx_mnt_id;
}

/* A streamed upload of the local provider: the temporary file lives in the destination's
 * directory (dfd), so the rename at commit never crosses a file system. */
struct local_upload {
    struct lb_upload base;
    int dfd;      /* O_PATH of the destination's directory, resolved inside the root */
    uint32_t uid; /* the sandbox's host uid: commit and abort act as it */
    bool owned;   /* ?owner=: commit gives the file to host ids owner_uid, owner_gid */
    uint32_t owner_uid, owner_gid;
    int mode;     /* final mode */
    char tmp[64]; /* temporary name in dfd */
    char name[256];
    char path[4097]; /* for messages */
    /* the file is on a memory-backed mount of a sandbox with a memory cgroup: its pages are
     * allocated by a process of that cgroup (upload_reserve) */
    bool memory;
    int memcg_fd;           /* that cgroup's cgroup.procs (write), or -1 */
    uint64_t reserved;      /* bytes from offset 0 allocated so */
    int64_t mem_limit;      /* the sandbox's memory limit in bytes, 0 unknown */
    const char *helper;     /* lendbox-supervise (the provider's) */
    bool unnamed;           /* made O_TMPFILE: linked as tmp only at commit */
    char usage_path[4400];  /* the memory cgroup's usage counter, "" unknown */
    char sandbox_dir[4352]; /* <sandboxes_dir>/<id> at the begin: gone once the sandbox is
                               stopped or handed over to another id (a recycle) */
};

/* Is the upload's sandbox still the id it began on? A recycled sandbox lives on (its cgroup,
 * whose memory the reservations charge, too) under another id and another episode: an upload
 * of the old id must neither charge it nor commit. 0 or -ENOENT. */
static int upload_sandbox_kept(const struct local_upload *u, struct lb_error *err)
{
    /* "": a reservation made inside one call on a sandbox it found (an archive's files) */
    if (!u->sandbox_dir[0] || access(u->sandbox_dir, F_OK) == 0)
        return 0;
    return lb_error_set(err, -ENOENT, "the sandbox of '%s' is no longer running", u->path);
}

static void upload_free(struct local_upload *u)
{
    if (u->memcg_fd >= 0)
        close(u->memcg_fd);
    if (u->base.fd >= 0)
        close(u->base.fd);
    if (u->dfd >= 0)
        close(u->dfd);
    free(u);
}

void local_upload_abort(struct lb_upload *base)
{
    struct local_upload *u = (struct local_upload *)base;
    struct local_fs_identity id = {0};

    if (!u)
        return;
    /* as the sandbox, so a sandbox that swapped the name for something else cannot make the
     * daemon remove what its own root could not */
    if (local_fs_enter(&id, u->uid, NULL) == 0)
        (void)unlinkat(u->dfd, u->tmp, 0);
    local_fs_leave(&id);
    upload_free(u);
}

/* Refuse a destination that is a directory or a mount point of the sandbox. */
static int check_destination(int dfd, const char *name, const char *path, struct lb_error *err)
{
    struct stat st;

    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
        return local_map_errno(EISDIR, path, err);
    /* Never replace what the sandbox has mounted there (the supervisor, /dev/null, ...): the
     * rename happens in the daemon's mount namespace, where it would silently detach the
     * sandbox's mount. */
    if (local_is_mount_point(dfd, name))
        return lb_error_set(err, -EACCES,
                            "'%s' is a mount point of the sandbox; it cannot be replaced", path);
    return 0;
}

int local_upload_begin(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                       int mode, const char *owner, struct lb_upload **out, struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    char dir[4097];
    const char *name;
    struct local_fs_identity id = {0};
    struct local_desc d;
    unsigned char rnd[8];
    struct local_upload *u = NULL;
    int rootfd = -1, r;

    *out = NULL;
    memset(&d, 0, sizeof(d));
    r = local_open_root(lp, ref, &d, path, &rootfd, err);
    if (r < 0)
        goto out;
    name = strrchr(path, '/') + 1;
    snprintf(dir, sizeof(dir), "%.*s", (int)(name - path > 1 ? name - path - 1 : 1), path);
    if (strlen(name) > 255) {
        r = lb_error_set(err, -ENAMETOOLONG, "file name in '%s' is too long", path);
        goto out;
    }
    u = calloc(1, sizeof(*u));
    if (!u) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    u->base.provider = p;
    u->base.fd = u->dfd = u->memcg_fd = -1;
    u->uid = d.uid;
    local_sandbox_dir(lp, ref->id, u->sandbox_dir, sizeof(u->sandbox_dir));
    u->mode = mode < 0 ? 0644 : mode & 0777;
    if (owner) {
        /* the sandbox's own passwd and group, as exec's user (before a byte is read) */
        struct sup_user su;
        char why[300];

        r = sup_user_resolve(rootfd, owner, &su, why, sizeof(why));
        if (r == -ENOENT || r == -ERANGE || r == -EINVAL) {
            r = lb_error_set(err, -EINVAL, "owner: %s", why);
            goto out;
        }
        if (r < 0) {
            r = lb_error_set(err, -EREMOTEIO, "owner: %s", why);
            goto out;
        }
        u->owned = true;
        u->owner_uid = d.uid + su.uid;
        u->owner_gid = d.uid + su.gid;
    }
    snprintf(u->name, sizeof(u->name), "%s", name);
    snprintf(u->path, sizeof(u->path), "%s", path);
    /* as the daemon (the sandbox's identity may not open it); kept only for a memory-backed
     * destination, below */
    if (cgroup_open_memory_procs(&d.cg, &u->memcg_fd) == 0) {
        (void)cgroup_read_oom_kills(&d.cg, NULL, &u->mem_limit);
        (void)cgroup_memory_usage_path(&d.cg, u->usage_path, sizeof(u->usage_path));
    }
    r = local_fs_enter(&id, d.uid, err);
    if (r < 0)
        goto out;
    u->dfd = local_open_parent(rootfd, dir);
    if (u->dfd < 0) {
        r = local_map_errno(-u->dfd, path, err);
        goto out;
    }
    r = check_destination(u->dfd, name, path, err);
    if (r < 0)
        goto out;
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
        r = lb_error_set(err, -EREMOTEIO, "getrandom: %s", strerror(errno));
        goto out;
    }
    snprintf(u->tmp, sizeof(u->tmp), ".lendbox-%02x%02x%02x%02x%02x%02x%02x%02x.tmp", rnd[0],
             rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    {
        /* A file for the sandbox's memory is made unnamed (O_TMPFILE) and linked only at
         * commit: no sandbox process can open it meanwhile, so none can truncate it or punch
         * holes into what was reserved, which would make the daemon's writes allocate (and be
         * charged for) new pages. */
        struct statfs dfs;

        if (u->memcg_fd >= 0 && fstatfs(u->dfd, &dfs) == 0 && dfs.f_type == TMPFS_MAGIC) {
            u->base.fd = openat(u->dfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
            u->unnamed = u->base.fd >= 0;
        }
    }
    if (!u->unnamed)
        u->base.fd =
            openat(u->dfd, u->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (u->base.fd < 0) {
        r = local_map_errno(errno, path, err);
        goto out;
    }
    {
        struct statfs fs;

        /* tmpfs, or an image's writable root (an overlay whose upper layer is a tmpfs) */
        if (u->memcg_fd >= 0 && fstatfs(u->base.fd, &fs) == 0 &&
            (fs.f_type == TMPFS_MAGIC || fs.f_type == OVERLAYFS_SUPER_MAGIC)) {
            bool frozen = false;

            u->memory = true;
            u->helper = lp->supervise_path;
            /* v2 has one cgroup for memory and freezer: its helper would be frozen */
            if (d.cg.version == 2)
                cgroup_is_frozen(&d.cg, &frozen);
            if (frozen) {
                (void)unlinkat(u->dfd, u->tmp, 0);
                r = lb_error_set(err, -EBUSY,
                                 "sandbox '%s' is paused: '%s' is in its memory, which only a "
                                 "process of its (frozen) cgroup can fill; resume it first",
                                 ref->id, path);
                goto out;
            }
        } else {
            local_close_fd(&u->memcg_fd);
        }
    }
    *out = &u->base;
    u = NULL;
    r = 0;
out:
    local_fs_leave(&id);
    if (u)
        upload_free(u);
    if (rootfd >= 0)
        close(rootfd);
    local_desc_release(&d);
    return r;
}

int local_upload_error(struct lb_upload *base, int errnum, uint64_t bytes, struct lb_error *err)
{
    struct local_upload *u = (struct local_upload *)base;

    if (errnum == ENOSPC || errnum == EDQUOT)
        return no_space(u->dfd, (size_t)bytes, u->path, err);
    return local_map_errno(errnum, u->path, err);
}

/* What the reserve helper needs in its vfork-style child. */
struct reserve_child {
    int fds[2]; /* its fd 0 (the file) and 1 (the memory cgroup's cgroup.procs) */
    const char *helper;
    char *const *argv;
};

static int child_reserve(void *arg)
{
    static char *const no_env[] = {NULL};
    const struct reserve_child *c = arg;
    int r;

    sup_signals_reset();
    r = local_child_place_fds(c->fds, 2);
    if (r < 0)
        return -r;
    (void)syscall(SYS_close_range, 2, ~0U, 0);
    execve(c->helper, c->argv, no_env);
    return errno;
}

/* Allocate bytes [u->reserved, total) of the file by the helper, in the sandbox's memory
 * cgroup. 0, -EFBIG when they do not fit (nothing of them stays allocated), -EREMOTEIO. */
static int reserve_run(struct local_upload *u, uint64_t total, struct lb_error *err)
{
    char a_uid[24], a_off[24], a_len[24];
    char *argv[] = {"supervise", "--reserve", a_uid, a_off, a_len, NULL};
    struct reserve_child c;
    pid_t pid = 0;
    int r, w, st = 0, code;

    snprintf(a_uid, sizeof(a_uid), "%u", u->uid);
    snprintf(a_off, sizeof(a_off), "%llu", (unsigned long long)u->reserved);
    snprintf(a_len, sizeof(a_len), "%llu", (unsigned long long)(total - u->reserved));
    c = (struct reserve_child){{u->base.fd, u->memcg_fd}, u->helper, argv};
    r = spawn_vfork(child_reserve, &c, &pid);
    if (r != 0)
        return lb_error_set(err, -EREMOTEIO, "cannot start the helper that writes '%s': %s",
                            u->path, strerror(r < 0 ? -r : r));
    w = local_wait_child(pid, clock_mono_ms() + RESERVE_WAIT_MS, &st);
    if (w == -ETIMEDOUT) {
        (void)kill(pid, SIGKILL);
        w = local_wait_child(pid, clock_mono_ms() + RESERVE_REAP_MS, &st);
        if (w == -ETIMEDOUT)
            local_reap_later(pid);
        st = 0;
        code = -1;
    } else {
        code = w == 0 && WIFEXITED(st) ? WEXITSTATUS(st) : 0;
    }
    if (w == 0 && WIFEXITED(st) && code == 0) {
        u->reserved = total;
        return 0;
    }
    /* nothing of this attempt stays allocated (a killed helper may leave some pages) */
    (void)fallocate(u->base.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)u->reserved,
                    (off_t)(total - u->reserved));
    if (code == ENOSPC)
        return no_space(u->dfd, (size_t)total, u->path, err);
    if (code == ENOMEM || (w == 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)) {
        if (u->mem_limit > 0)
            return lb_error_set(err, -EFBIG,
                                "%llu bytes do not fit at '%s': the sandbox's memory limit "
                                "(%lld MiB) cannot hold them (files on its memory-backed "
                                "mounts, such as /tmp, /run, /dev/shm or a tmpfs workdir, "
                                "count against it)",
                                (unsigned long long)total, u->path,
                                (long long)(u->mem_limit >> 20));
        return lb_error_set(err, -EFBIG,
                            "%llu bytes do not fit at '%s': the sandbox's memory cannot hold "
                            "them",
                            (unsigned long long)total, u->path);
    }
    if (code < 0)
        return lb_error_set(err, -EREMOTEIO,
                            "making room for '%s' in the sandbox's memory did not finish within "
                            "%d s",
                            u->path, RESERVE_WAIT_MS / 1000);
    return lb_error_set(err, -EREMOTEIO, "cannot make room for '%s' in the sandbox's memory: %s",
                        u->path, code ? strerror(code) : "the helper failed");
}

/* The sandbox's memory cgroup's usage in bytes (its counter), or -1. */
static int64_t memory_usage(const struct local_upload *u)
{
    char buf[64];
    ssize_t n;
    int fd = u->usage_path[0] ? open(u->usage_path, O_RDONLY | O_CLOEXEC) : -1;

    if (fd < 0)
        return -1;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    return buf[0] >= '0' && buf[0] <= '9' ? (int64_t)strtoll(buf, NULL, 10) : -1;
}

int local_upload_reserve(struct lb_upload *base, uint64_t need, uint64_t want, struct lb_error *err)
{
    struct local_upload *u = (struct local_upload *)base;
    uint64_t total = want > need ? want : need;
    int64_t usage;
    int r;

    if (!u->memory || need <= u->reserved)
        return 0;
    r = upload_sandbox_kept(u, err);
    if (r < 0)
        return r;
    /* room past need only as far as the memory cgroup has it: more may not fit where need
     * still does, and a reservation that does not fit costs an out-of-memory kill */
    if (total > need && u->mem_limit > 0 && (usage = memory_usage(u)) >= 0) {
        int64_t room = u->mem_limit - usage - RESERVE_MARGIN - (int64_t)(need - u->reserved);

        if (room < 0)
            room = 0;
        if (total - need > (uint64_t)room)
            total = need + (uint64_t)room;
    }
    r = reserve_run(u, total, err);
    if (r == -EFBIG && total > need) {
        lb_error_clear(err);
        r = reserve_run(u, need, err);
    }
    return r;
}

int local_memory_reserve_fd(struct local_provider *lp, const struct local_desc *d, int fd,
                            uint64_t bytes, const char *path, struct lb_error *err)
{
    struct local_upload *u;
    struct statfs fs;
    bool frozen = false;
    int r;

    if (bytes == 0 || fstatfs(fd, &fs) < 0 ||
        (fs.f_type != TMPFS_MAGIC && fs.f_type != OVERLAYFS_SUPER_MAGIC))
        return 0; /* not in memory: nothing to charge */
    u = calloc(1, sizeof(*u));
    if (!u)
        return lb_error_set(err, -ENOMEM, "out of memory");
    u->base.fd = u->dfd = u->memcg_fd = -1;
    if (cgroup_open_memory_procs(&d->cg, &u->memcg_fd) < 0) {
        free(u);
        return 0; /* no memory cgroup of its own: nothing to charge it to */
    }
    (void)cgroup_read_oom_kills(&d->cg, NULL, &u->mem_limit);
    (void)cgroup_memory_usage_path(&d->cg, u->usage_path, sizeof(u->usage_path));
    if (d->cg.version == 2)
        cgroup_is_frozen(&d->cg, &frozen);
    if (frozen) {
        r = lb_error_set(err, -EBUSY,
                         "the sandbox is paused: '%s' is in its memory, which only a process of "
                         "its (frozen) cgroup can fill; resume it first",
                         path);
        goto out;
    }
    u->base.fd = fd; /* borrowed: given back before the free */
    u->uid = d->uid;
    u->memory = true;
    u->helper = lp->supervise_path;
    snprintf(u->path, sizeof(u->path), "%s", path);
    r = local_upload_reserve(&u->base, bytes, bytes, err);
out:
    u->base.fd = -1;
    upload_free(u);
    return r;
}

int local_upload_commit(struct lb_upload *base, struct lb_error *err)
{
    struct local_upload *u = (struct local_upload *)base;
    struct local_fs_identity id = {0};
    int r = upload_sandbox_kept(u, err);

    if (r < 0) {
        local_upload_abort(base); /* a commit frees the upload whatever it answers */
        return r;
    }
    if (u->memory && u->reserved) {
        /* give back what was reserved past the bytes written */
        off_t end = lseek(u->base.fd, 0, SEEK_CUR);

        if (end >= 0 && (uint64_t)end < u->reserved)
            (void)ftruncate(u->base.fd, end);
    }
    r = local_fs_enter(&id, u->uid, err);
    if (r == 0 && u->unnamed) {
        /* first (the owner's chown below would take the right to link it) */
        char proc[64];

        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", u->base.fd);
        if (linkat(AT_FDCWD, proc, u->dfd, u->tmp, AT_SYMLINK_FOLLOW) < 0)
            r = local_map_errno(errno, u->path, err);
    }
    if (r == 0 && fchmod(u->base.fd, (mode_t)u->mode) < 0)
        r = local_map_errno(errno, u->path, err);
    if (r == 0 && u->owned) { /* after the chmod: only the file's owner may chmod it */
        int c = fs_chown_fd(&id, u->base.fd, u->owner_uid, u->owner_gid);

        if (c < 0)
            r = lb_error_set(err, -EREMOTEIO, "cannot give '%s' its owner: %s", u->path,
                             strerror(-c));
    }
    if (r == 0)
        r = check_destination(u->dfd, u->name, u->path, err);
    if (r == 0 && renameat(u->dfd, u->tmp, u->dfd, u->name) < 0)
        r = local_map_errno(errno, u->path, err);
    if (r < 0)
        (void)unlinkat(u->dfd, u->tmp, 0);
    local_fs_leave(&id);
    upload_free(u);
    return r;
}

int local_file_write(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                     const void *data, size_t len, int mode, struct lb_error *err)
{
    struct lb_upload *u = NULL;
    int r = local_upload_begin(p, ref, path, mode, NULL, &u, err);

    if (r < 0)
        return r;
    r = local_upload_reserve(u, len, len, err);
    if (r < 0) {
        local_upload_abort(u);
        return r;
    }
    r = write_all(u->fd, data, len);
    if (r == -ENOSPC || r == -EDQUOT)
        r = no_space(((struct local_upload *)u)->dfd, len, path, err);
    else if (r < 0)
        r = local_map_errno(-r, path, err);
    if (r < 0) {
        local_upload_abort(u);
        return r;
    }
    return local_upload_commit(u, err);
}

int local_file_open(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                    int *fd_out, uint64_t *size_out, struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    struct local_fs_identity id = {0};
    struct local_desc d;
    struct stat st;
    int rootfd = -1, fd = -1, r;

    *fd_out = -1;
    memset(&d, 0, sizeof(d));
    r = local_open_root(lp, ref, &d, path, &rootfd, err);
    if (r < 0)
        goto out;
    r = local_fs_enter(&id, d.uid, err);
    if (r < 0)
        goto out;
    /* O_NONBLOCK: a FIFO must not hang us; it is refused below anyway */
    fd = local_open_in_root(rootfd, path, O_RDONLY | O_NOCTTY | O_NONBLOCK, 0);
    if (fd < 0) {
        r = local_map_errno(-fd, path, err);
        fd = -1;
        goto out;
    }
    if (fstat(fd, &st) < 0) {
        r = local_map_errno(errno, path, err);
        goto out;
    }
    if (S_ISDIR(st.st_mode)) {
        r = local_map_errno(EISDIR, path, err);
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        r = lb_error_set(err, -EINVAL, "'%s' is not a regular file", path);
        goto out;
    }
    /* proc and sysfs files claim sizes (0, 4096) they do not have: not files to transfer */
    {
        struct statfs fs;

        if (fstatfs(fd, &fs) == 0 &&
            (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC ||
             fs.f_type == DEBUGFS_MAGIC || fs.f_type == CGROUP_SUPER_MAGIC ||
             fs.f_type == CGROUP2_SUPER_MAGIC)) {
            r = lb_error_set(err, -EINVAL, "'%s' is a kernel pseudo-file, not a file to download",
                             path);
            goto out;
        }
    }
    (void)fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    *fd_out = fd;
    *size_out = (uint64_t)st.st_size;
    fd = -1;
    r = 0;
out:
    if (fd >= 0)
        close(fd);
    local_fs_leave(&id);
    if (rootfd >= 0)
        close(rootfd);
    local_desc_release(&d);
    return r;
}
