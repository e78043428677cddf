/*
 * archive.c - the local provider's archive_put and archive_get (provider.h): a directory of
 * the sandbox in and out as a tar archive, read and written with libarchive by the daemon.
 *
 * The daemon acts as files.c does: the sandbox's root is /proc/<init>/root, the calling thread
 * takes the sandbox's file-system identity (local_fs_enter: its root's host uid, no effective
 * capability), and every name is resolved from a directory fd of the sandbox with openat2,
 * RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV: no ".." and no
 * symlink is ever followed, whatever the sandbox's processes change meanwhile.
 *
 * Put. Every entry name is checked before anything is made: relative, no ".." component;
 * symlink targets relative and, read from the link's directory, never above DIR; hard links
 * only to an earlier entry; no device node, FIFO or socket. Entries are extracted into a fresh
 * hidden directory (".lendbox-archive-<random>": inside DIR when DIR exists, else beside it),
 * so a refused or oversized archive leaves nothing but that directory, which is removed. When
 * all are in: a new DIR is that directory renamed; an existing DIR takes the entries by
 * renames (a staged directory over an existing one merges into it; anything else replaces what
 * is there; a staged file over an existing directory, or anything over a mount point, is
 * refused by a check that runs before the first rename).
 *
 * Get. A depth-first walk of DIR with O_NOFOLLOW opens; a pax archive written to the caller's
 * fd through a counting callback that stops past max_bytes.
 */
#include "provider/local/local_internal.h"
#include "provider/tar_out.h"
#include "util/fd.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#define ARCHIVE_MAX_ENTRIES PROVIDER_ARCHIVE_MAX_ENTRIES
#define ARCHIVE_MAX_DEPTH 128 /* directory depth of a GET walk */
/* components of a PUT entry's name: the merge into an existing DIR and the removal of a refused
 * stage walk no deeper, so that the all-or-nothing check sees every level */
#define ARCHIVE_MAX_PUT_DEPTH PROVIDER_ARCHIVE_MAX_DEPTH
/* bytes of directory names a put keeps in the daemon's memory until it applies their modes */
#define ARCHIVE_MAX_DIR_NAME_BYTES PROVIDER_ARCHIVE_MAX_NAME_BYTES
#define STAGE_PREFIX ".lendbox-archive-"
#define PATH_BYTES 4097 /* a name relative to DIR and its NUL */
#define GET_BUF_BYTES (64 * 1024)

/* openat2 beneath dfd, never through a symlink or a magic link; with xdev, onto another mount
 * (DIR itself may be one: a tmpfs workdir), else never. */
static int open_beneath_x(int dfd, const char *path, uint64_t flags, uint64_t mode, bool xdev)
{
    struct open_how how = {
        .flags = flags | O_CLOEXEC,
        .mode = mode,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
                   (xdev ? 0 : RESOLVE_NO_XDEV),
    };
    int i, fd = -1;

    for (i = 0; i < 16; i++) {
        fd = (int)syscall(SYS_openat2, dfd, path, &how, sizeof(how));
        if (fd >= 0 || errno != EAGAIN)
            break;
    }
    return fd < 0 ? -errno : fd;
}

static int open_beneath(int dfd, const char *path, uint64_t flags, uint64_t mode)
{
    return open_beneath_x(dfd, path, flags, mode, false);
}

/* ---------- names ---------- */

/* ---------- put ---------- */

struct dir_mode {
    char *name;
    mode_t mode;
};

struct put_state {
    struct local_provider *lp;
    const struct local_desc *d;
    struct local_fs_identity *id; /* the thread's identity, entered (left around the reserve) */
    struct archive *a;
    int stage; /* O_PATH of the staging directory */
    const char *dir;
    uint64_t max_bytes;
    uint64_t sized; /* the files' sizes so far (a sparse file in full), bounded by max_bytes */
    struct lb_archive_result res;
    struct dir_mode *dirs; /* directory modes, applied once all entries are in */
    size_t n_dirs, cap_dirs;
    size_t dir_name_bytes; /* the dirs' names, bounded by ARCHIVE_MAX_DIR_NAME_BYTES */
    uint64_t headers;      /* every header read, the root's too, bounded by ARCHIVE_MAX_ENTRIES */
};

static int put_refuse(const char *dir, const char *name, const char *why, struct lb_error *err)
{
    return lb_error_set(err, -EINVAL,
                        "archive entry '%s' is refused: %s (nothing of it was kept in '%s')", name,
                        why, dir);
}

/* Open (O_PATH) the parent directory of name beneath the stage, making missing ones 0700
 * (their modes come later: a directory entry's, else 0755). *base points into name. */
static int open_entry_parent(struct put_state *s, char *name, const char **base)
{
    char *slash = strrchr(name, '/');
    int cur, next;
    char *c;

    *base = slash ? slash + 1 : name;
    cur = open_beneath(s->stage, ".", O_PATH | O_DIRECTORY, 0);
    if (cur < 0 || !slash)
        return cur;
    *slash = '\0';
    for (c = name; *c;) {
        size_t len = strcspn(c, "/");
        char part[256];

        memcpy(part, c, len);
        part[len] = '\0';
        next = open_beneath(cur, part, O_PATH | O_DIRECTORY, 0);
        if (next == -ENOENT) {
            if (mkdirat(cur, part, 0700) < 0 && errno != EEXIST) {
                next = -errno;
            } else {
                char proc[64];

                next = open_beneath(cur, part, O_PATH | O_DIRECTORY, 0);
                snprintf(proc, sizeof(proc), "/proc/self/fd/%d", next);
                if (next >= 0) /* through the fd: never a symlink swapped in meanwhile */
                    (void)chmod(proc, 0755);
            }
        }
        close(cur);
        if (next < 0) {
            *slash = '/';
            return next;
        }
        cur = next;
        c += len;
        if (*c == '/')
            c++;
    }
    *slash = '/';
    return cur;
}

/* Remove whatever non-directory is at pfd/base (a name repeated in the archive: the last one
 * wins). A directory there stays (and an entry that is not one then fails EISDIR/EEXIST). */
static void clear_name(int pfd, const char *base)
{
    struct stat st;

    if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode))
        (void)unlinkat(pfd, base, 0);
}

static int write_full(int fd, const char *p, size_t n, off_t off)
{
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, off);

        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

static int space_error(struct put_state *s, int e, const char *name, struct lb_error *err)
{
    struct statfs fs;
    unsigned long long mib = 0;

    if (e == EEXIST || e == EISDIR || e == ENOTDIR)
        return put_refuse(s->dir, name,
                          "it clashes with an earlier entry of the archive (a directory and a "
                          "non-directory of the same name)",
                          err);
    if (e != ENOSPC && e != EDQUOT)
        return local_map_errno(e, name, err);
    if (fstatfs(s->stage, &fs) == 0)
        mib = (unsigned long long)fs.f_blocks * (unsigned long long)fs.f_bsize >> 20;
    return lb_error_set(err, -EFBIG,
                        "the archive does not fit in '%s': the sandbox's file system there is full "
                        "at entry '%s' (%llu MiB, sized from the sandbox's resources.disk_mib / "
                        "memory_mib); nothing of it was kept",
                        s->dir, name, mib);
}

static int put_file(struct put_state *s, int pfd, const char *base, const char *name, mode_t mode,
                    int64_t size, struct lb_error *err)
{
    const void *buf;
    size_t len;
    la_int64_t off;
    int fd, r, ar;

    if (size < 0 || (uint64_t)size > s->max_bytes - s->sized)
        return lb_error_set(err, -EFBIG,
                            "the archive's files hold more than %llu bytes "
                            "(limits.max_file_bytes); nothing of it was kept",
                            (unsigned long long)s->max_bytes);
    s->sized += (uint64_t)size;
    clear_name(pfd, base);
    fd = openat(pfd, base, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return space_error(s, errno, name, err);
    if (size > 0) {
        /* on a memory-backed mount the pages are allocated by the sandbox's memory cgroup
         * first, so that they are charged to it (as the daemon, which starts the helper) */
        int e;

        local_fs_leave(s->id);
        r = local_memory_reserve_fd(s->lp, s->d, fd, (uint64_t)size, name, err);
        e = local_fs_enter(s->id, s->d->uid, r < 0 ? NULL : err);
        if (r == 0)
            r = e;
        if (r < 0)
            goto out;
    }
    for (;;) {
        ar = archive_read_data_block(s->a, &buf, &len, &off);
        if (ar == ARCHIVE_EOF)
            break;
        if (ar < ARCHIVE_WARN) {
            r = lb_error_set(err, -EINVAL, "the archive is damaged at entry '%s': %s", name,
                             archive_error_string(s->a));
            goto out;
        }
        if (len > s->max_bytes - s->res.bytes) {
            r = lb_error_set(
                err, -EFBIG,
                "the archive's files hold more than %llu bytes (limits.max_file_bytes)",
                (unsigned long long)s->max_bytes);
            goto out;
        }
        r = write_full(fd, buf, len, (off_t)off);
        if (r < 0) {
            r = space_error(s, -r, name, err);
            goto out;
        }
        s->res.bytes += len;
    }
    /* a sparse entry's size may end in a hole */
    if (size > 0 && ftruncate(fd, (off_t)size) < 0) {
        r = space_error(s, errno, name, err);
        goto out;
    }
    r = 0;
    if (fchmod(fd, mode & 0777) < 0)
        r = local_map_errno(errno, name, err);
out:
    close(fd);
    return r;
}

/* Keep a directory entry's mode for put_dir_modes. -EFBIG once the names kept would pass
 * ARCHIVE_MAX_DIR_NAME_BYTES (a small gzip body can repeat a 4 KiB directory name for every
 * entry), -ENOMEM. */
static int remember_dir(struct put_state *s, const char *name, mode_t mode)
{
    size_t len = strlen(name) + 1;

    if (len > ARCHIVE_MAX_DIR_NAME_BYTES - s->dir_name_bytes)
        return -EFBIG;
    if (s->n_dirs == s->cap_dirs) {
        size_t cap = s->cap_dirs ? s->cap_dirs * 2 : 32;
        struct dir_mode *d = realloc(s->dirs, cap * sizeof(*d));

        if (!d)
            return -ENOMEM;
        s->dirs = d;
        s->cap_dirs = cap;
    }
    s->dirs[s->n_dirs].name = strdup(name);
    if (!s->dirs[s->n_dirs].name)
        return -ENOMEM;
    s->dir_name_bytes += len;
    s->dirs[s->n_dirs++].mode = mode & 01777;
    return 0;
}

/* One entry of the archive (its header read). */
static int put_entry(struct put_state *s, struct archive_entry *e, struct lb_error *err)
{
    char name[4097], target[4097], proc[64];
    const char *raw = archive_entry_pathname(e), *hard = archive_entry_hardlink(e), *base;
    mode_t type = archive_entry_filetype(e), mode = archive_entry_perm(e);
    int pfd = -1, tfd = -1, r;

    /* every header counts, the root's and the repeated ones too: a gzip body of nothing but
     * "./" headers would otherwise keep a worker inflating for as long as its ratio allows */
    if (++s->headers > ARCHIVE_MAX_ENTRIES)
        return lb_error_set(err, -EFBIG, "the archive has more than %d entries",
                            ARCHIVE_MAX_ENTRIES);
    r = provider_archive_name_normalise(raw, name, sizeof(name), ARCHIVE_MAX_PUT_DEPTH);
    if (r < 0)
        return put_refuse(s->dir, raw ? raw : "",
                          "names must be relative, without '..', at most 256 levels deep", err);
    if (r == 1) /* the archive's root: DIR itself */
        return 0;
    if (hard &&
        provider_archive_name_normalise(hard, target, sizeof(target), ARCHIVE_MAX_PUT_DEPTH) != 0)
        return put_refuse(s->dir, name, "a hard link must name an earlier entry of the archive",
                          err);
    if (!hard && type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK)
        return put_refuse(s->dir, name,
                          "only directories, regular files, symlinks and hard links are taken "
                          "(no device nodes, FIFOs or sockets)",
                          err);
    if (!hard && type == AE_IFLNK) {
        const char *t = archive_entry_symlink(e);

        if (!t || !provider_archive_link_inside(name, t))
            return put_refuse(s->dir, name,
                              "a symlink's target must be relative and stay inside the directory",
                              err);
    }
    s->res.entries++;
    pfd = open_entry_parent(s, name, &base);
    if (pfd < 0) {
        r = pfd == -ENOTDIR || pfd == -ELOOP || pfd == -EXDEV
                ? put_refuse(s->dir, name, "a parent of it is not a directory of the archive", err)
                : space_error(s, -pfd, name, err);
        pfd = -1;
        goto out;
    }
    if (hard) {
        struct stat st;

        tfd = open_beneath(s->stage, target, O_PATH | O_NOFOLLOW, 0);
        if (tfd < 0 || fstat(tfd, &st) < 0 || !S_ISREG(st.st_mode)) {
            r = put_refuse(s->dir, name,
                           "a hard link must name an earlier regular file of the archive", err);
            goto out;
        }
        clear_name(pfd, base);
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", tfd);
        if (linkat(AT_FDCWD, proc, pfd, base, AT_SYMLINK_FOLLOW) < 0)
            r = space_error(s, errno, name, err);
        goto out;
    }
    switch (type) {
    case AE_IFDIR: {
        struct stat st;

        if (mkdirat(pfd, base, 0700) < 0 &&
            (errno != EEXIST || fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
             !S_ISDIR(st.st_mode))) {
            r = space_error(s, errno == 0 ? EEXIST : errno, name, err);
            goto out;
        }
        r = remember_dir(s, name, mode);
        if (r == -EFBIG)
            r = lb_error_set(err, r,
                             "the archive's directory entries have names longer than %u bytes "
                             "in all; nothing of it was kept",
                             ARCHIVE_MAX_DIR_NAME_BYTES);
        else if (r < 0)
            r = lb_error_set(err, r, "out of memory");
        break;
    }
    case AE_IFLNK:
        clear_name(pfd, base);
        if (symlinkat(archive_entry_symlink(e), pfd, base) < 0)
            r = space_error(s, errno, name, err);
        break;
    default:
        r = put_file(s, pfd, base, name, mode,
                     archive_entry_size_is_set(e) ? archive_entry_size(e) : 0, err);
        break;
    }
out:
    if (tfd >= 0)
        close(tfd);
    if (pfd >= 0)
        close(pfd);
    return r;
}

/* Apply the remembered directory modes (of the archive's directory entries, not of the
 * parents it only implies) below top, deepest (last made) first. */
static void put_dir_modes(struct put_state *s, int top)
{
    size_t i;

    for (i = s->n_dirs; i-- > 0;) {
        int fd = open_beneath(top, s->dirs[i].name, O_PATH | O_DIRECTORY, 0);
        char proc[64];

        if (fd < 0)
            continue;
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
        (void)chmod(proc, s->dirs[i].mode);
        close(fd);
    }
}

/* Remove the tree dfd/name (not following symlinks, not crossing mounts). Best effort. */
static void remove_tree(int dfd, const char *name, int depth)
{
    int fd;
    DIR *d;
    struct dirent *de;

    if (unlinkat(dfd, name, 0) == 0 || (errno != EISDIR && errno != EPERM))
        return;
    if (depth > ARCHIVE_MAX_PUT_DEPTH)
        return;
    fd = open_beneath(dfd, name, O_RDONLY | O_DIRECTORY, 0);
    if (fd < 0)
        return;
    /* owner write and search, so that its entries can go (modes were applied) */
    (void)fchmod(fd, 0700);
    d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            remove_tree(dirfd(d), de->d_name, depth + 1);
    closedir(d);
    (void)unlinkat(dfd, name, AT_REMOVEDIR);
}

/* The staged directory sfd as a stream (*d) and a PATH_BYTES buffer for names (*path), both
 * the caller's to release: 0, or an error (nothing to release). */
static int merge_open(int sfd, const char *rel, DIR **d, char **path, struct lb_error *err)
{
    int fd = open_beneath(sfd, ".", O_RDONLY | O_DIRECTORY, 0);

    if (fd < 0)
        return local_map_errno(-fd, rel, err);
    *d = fd_open_dir(fd);
    *path = malloc(PATH_BYTES); /* not on the stack: one frame per level on a worker's stack */
    if (!*d || !*path) {
        if (*d)
            closedir(*d);
        free(*path);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    return 0;
}

typedef int merge_fn(int sfd, int tfd, const char *rel, int depth, struct lb_error *err);

/* fn on the directories named name in sd (staged) and tfd (path: its name for errors). */
static int merge_descend(merge_fn *fn, int sd, int tfd, const char *name, const char *path,
                         int depth, struct lb_error *err)
{
    int cs = open_beneath(sd, name, O_PATH | O_DIRECTORY, 0);
    int ct = open_beneath(tfd, name, O_PATH | O_DIRECTORY, 0);
    int r;

    if (cs < 0 || ct < 0)
        r = local_map_errno(cs < 0 ? -cs : -ct, path, err);
    else
        r = fn(cs, ct, path, depth + 1, err);
    if (cs >= 0)
        close(cs);
    if (ct >= 0)
        close(ct);
    return r;
}

typedef int merge_entry_fn(int sd, int tfd, const char *name, const char *path, int depth,
                           struct lb_error *err);

/* entry on each entry of the staged directory sfd (named rel for errors) and the target tfd,
 * until one fails: 0 or the first error. */
static int merge_walk(merge_entry_fn *entry, int sfd, int tfd, const char *rel, int depth,
                      struct lb_error *err)
{
    DIR *d = NULL;
    struct dirent *de;
    char *path = NULL;
    int r = merge_open(sfd, rel, &d, &path, err);

    if (r < 0)
        return r;
    while (r == 0 && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        snprintf(path, PATH_BYTES, "%s/%s", rel, de->d_name);
        r = entry(dirfd(d), tfd, de->d_name, path, depth, err);
    }
    closedir(d);
    free(path);
    return r;
}

static merge_fn merge_check;

/* merge_check for the entry name of sd (staged) over tfd (path: its name for errors). */
static int merge_check_entry(int sd, int tfd, const char *name, const char *path, int depth,
                             struct lb_error *err)
{
    struct stat ss, ts;

    if (fstatat(tfd, name, &ts, AT_SYMLINK_NOFOLLOW) < 0)
        return 0; /* nothing there: a plain rename */
    if (fstatat(sd, name, &ss, AT_SYMLINK_NOFOLLOW) < 0)
        return local_map_errno(errno, path, err);
    if (local_is_mount_point(tfd, name))
        return lb_error_set(err, -EACCES,
                            "'%s' is a mount point of the sandbox; the archive cannot replace it "
                            "(nothing was extracted)",
                            path);
    if (S_ISDIR(ts.st_mode) && !S_ISDIR(ss.st_mode))
        return lb_error_set(err, -EISDIR,
                            "'%s' is a directory in the sandbox and not one in the archive "
                            "(nothing was extracted)",
                            path);
    if (S_ISDIR(ts.st_mode) && depth < ARCHIVE_MAX_PUT_DEPTH)
        return merge_descend(merge_check, sd, tfd, name, path, depth, err);
    return 0;
}

/* Before any rename: would moving the staged tree sfd into tfd meet a staged non-directory
 * over an existing directory, or a mount point? 0 or an error. */
static int merge_check(int sfd, int tfd, const char *rel, int depth, struct lb_error *err)
{
    return merge_walk(merge_check_entry, sfd, tfd, rel, depth, err);
}

static merge_fn merge_move;

/* merge_move for the entry name of sd (staged) into tfd (path: its name for errors). */
static int merge_move_entry(int sd, int tfd, const char *name, const char *path, int depth,
                            struct lb_error *err)
{
    struct stat ss, ts;

    if (fstatat(sd, name, &ss, AT_SYMLINK_NOFOLLOW) < 0)
        return local_map_errno(errno, path, err);
    if (fstatat(tfd, name, &ts, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(ss.st_mode)) {
        if (S_ISDIR(ts.st_mode) && depth < ARCHIVE_MAX_PUT_DEPTH)
            return merge_descend(merge_move, sd, tfd, name, path, depth, err);
        (void)unlinkat(tfd, name, 0); /* a directory replaces a non-directory */
    }
    if (renameat(sd, name, tfd, name) < 0)
        return local_map_errno(errno, path, err);
    return 0;
}

/* Move the staged tree sfd into tfd (checked by merge_check). */
static int merge_move(int sfd, int tfd, const char *rel, int depth, struct lb_error *err)
{
    return merge_walk(merge_move_entry, sfd, tfd, rel, depth, err);
}

/* A put holds an exclusive flock on its stage from just after making it until the stage is
 * gone, so a stage nobody holds is one a daemon killed mid-extraction left behind. */

/* Make a fresh stage in hostfd (its name into name) and lock it: the lock fd into *lockfd.
 * 0, -EREMOTEIO (getrandom failed) or -errno of mkdirat. */
static int stage_make(int hostfd, char *name, size_t size, int *lockfd)
{
    for (int tries = 0; tries < 8; tries++) {
        unsigned char rnd[8];
        struct stat a, b;
        int fd;

        if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
            return -EREMOTEIO;
        snprintf(name, size, STAGE_PREFIX "%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1],
                 rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
        if (mkdirat(hostfd, name, 0700) < 0) {
            if (errno == EEXIST)
                continue;
            return -errno;
        }
        fd = open_beneath(hostfd, name, O_RDONLY | O_DIRECTORY, 0);
        if (fd < 0)
            continue; /* swept or replaced before we could lock it: another name */
        /* still the directory we made under that name, and ours alone */
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &a) == 0 &&
            fstatat(hostfd, name, &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino) {
            *lockfd = fd;
            return 0;
        }
        close(fd);
    }
    return -EEXIST;
}

/* Remove the stages in hostfd that no put holds (best effort). */
static void stage_sweep(int hostfd)
{
    DIR *d = fd_open_dir(open_beneath(hostfd, ".", O_RDONLY | O_DIRECTORY, 0));
    struct dirent *de;

    if (!d)
        return;
    while ((de = readdir(d))) {
        struct stat st;
        int sfd;

        if (strncmp(de->d_name, STAGE_PREFIX, strlen(STAGE_PREFIX)) != 0 ||
            fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
            continue;
        sfd = open_beneath(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY, 0);
        if (sfd < 0)
            continue;
        if (flock(sfd, LOCK_EX | LOCK_NB) == 0)
            remove_tree(dirfd(d), de->d_name, 0);
        close(sfd);
    }
    closedir(d);
}

static int read_all_entries(struct put_state *s, struct lb_error *err)
{
    struct archive_entry *e;
    bool any = false;
    int ar, r;

    for (;;) {
        ar = archive_read_next_header(s->a, &e);
        if (ar == ARCHIVE_EOF)
            break;
        if (ar < ARCHIVE_WARN)
            return lb_error_set(err, -EINVAL,
                                any ? "the archive is damaged: %s"
                                    : "the body is not a tar archive (gzip-compressed or not): %s",
                                archive_error_string(s->a));
        any = true;
        r = put_entry(s, e, err);
        if (r < 0)
            return r;
    }
    return 0;
}

int local_archive_put(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *dir,
                      int fd, uint64_t max_bytes, struct lb_archive_result *out,
                      struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    struct local_fs_identity id = {0};
    struct local_desc d;
    struct put_state s = {
        .lp = lp, .d = &d, .id = &id, .stage = -1, .dir = dir, .max_bytes = max_bytes};
    char parent[4097], stage[64];
    const char *name;
    struct stat st;
    bool exists = false, staged = false;
    int rootfd = -1, pfd = -1, tfd = -1, hostfd = -1, lockfd = -1, r;

    *out = (struct lb_archive_result){0};
    memset(&d, 0, sizeof(d));
    r = local_open_root(lp, ref, &d, dir, &rootfd, err);
    if (r < 0)
        goto out;
    name = strrchr(dir, '/') + 1;
    snprintf(parent, sizeof(parent), "%.*s", (int)(name - dir > 1 ? name - dir - 1 : 1), dir);
    s.a = archive_read_new();
    if (!s.a) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    archive_read_support_filter_gzip(s.a);
    archive_read_support_format_tar(s.a);
    archive_read_support_format_gnutar(s.a);
    r = local_fs_enter(&id, d.uid, err);
    if (r < 0)
        goto out;
    pfd = local_open_parent(rootfd, parent);
    if (pfd < 0) {
        r = local_map_errno(-pfd, dir, err);
        pfd = -1;
        goto out;
    }
    if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (!S_ISDIR(st.st_mode)) {
            r = lb_error_set(err, -ENOTDIR, "'%s' is not a directory", dir);
            goto out;
        }
        exists = true;
        tfd = open_beneath_x(pfd, name, O_PATH | O_DIRECTORY, 0, true);
        if (tfd < 0) {
            r = local_map_errno(-tfd, dir, err);
            tfd = -1;
            goto out;
        }
    }
    hostfd = exists ? tfd : pfd; /* where the stage is made */
    stage_sweep(hostfd);
    r = stage_make(hostfd, stage, sizeof(stage), &lockfd);
    if (r < 0) {
        r = r == -EREMOTEIO ? lb_error_set(err, r, "getrandom: %s", strerror(EIO))
                            : space_error(&s, -r, dir, err);
        goto out;
    }
    staged = true;
    s.stage = open_beneath(hostfd, stage, O_PATH | O_DIRECTORY, 0);
    if (s.stage < 0) {
        r = local_map_errno(-s.stage, dir, err);
        goto out;
    }
    if (archive_read_open_fd(s.a, fd, 64 * 1024) != ARCHIVE_OK) {
        r = lb_error_set(err, -EINVAL, "the body is not a tar archive (gzip-compressed or not): %s",
                         archive_error_string(s.a));
        goto out;
    }
    r = read_all_entries(&s, err);
    if (r < 0)
        goto out;
    if (!exists) {
        char proc[64];

        if (renameat2(pfd, stage, pfd, name, RENAME_NOREPLACE) < 0) {
            r = local_map_errno(errno, dir, err);
            goto out;
        }
        staged = false;
        snprintf(proc, sizeof(proc), "/proc/self/fd/%d", s.stage);
        (void)chmod(proc, 0755);
        put_dir_modes(&s, s.stage);
    } else {
        r = merge_check(s.stage, tfd, dir, 0, err);
        if (r == 0)
            r = merge_move(s.stage, tfd, dir, 0, err);
        if (r < 0)
            goto out;
        put_dir_modes(&s, tfd);
    }
    *out = s.res;
    r = 0;
out:
    if (staged)
        remove_tree(hostfd, stage, 0);
    if (lockfd >= 0)
        close(lockfd); /* the stage is gone (or is DIR): its lock with it */
    local_fs_leave(&id);
    if (s.a)
        archive_read_free(s.a);
    for (size_t i = 0; i < s.n_dirs; i++)
        free(s.dirs[i].name);
    free(s.dirs);
    if (s.stage >= 0)
        close(s.stage);
    if (tfd >= 0)
        close(tfd);
    if (pfd >= 0)
        close(pfd);
    if (rootfd >= 0)
        close(rootfd);
    local_desc_release(&d);
    return r;
}

/* ---------- get ---------- */

struct get_state {
    struct lb_tar_out w;
    uint32_t base_uid; /* the sandbox root's host uid */
    const char *dir;
    char *buf; /* GET_BUF_BYTES for a file's reads (a worker's stack is small) */
};

static bool pseudo_fs(int fd)
{
    struct statfs fs;

    return fstatfs(fd, &fs) == 0 &&
           (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC ||
            fs.f_type == DEBUGFS_MAGIC || fs.f_type == CGROUP_SUPER_MAGIC ||
            fs.f_type == CGROUP2_SUPER_MAGIC || fs.f_type == DEVPTS_SUPER_MAGIC);
}

/* The header of name (relative to DIR) for st. */
static int get_header(struct get_state *g, const char *name, const struct stat *st,
                      const char *link, struct lb_error *err)
{
    const struct lb_tar_item it = {
        .name = name,
        .mode = st->st_mode,
        .size = st->st_size,
        .mtime = st->st_mtim.tv_sec,
        .mtime_nsec = st->st_mtim.tv_nsec,
        .uid = st->st_uid - g->base_uid,
        .gid = st->st_gid - g->base_uid,
        .symlink = link,
    };

    return tar_out_write_header(&g->w, &it, err);
}

static int get_file(struct get_state *g, int dfd, const char *dname, const char *name,
                    struct lb_error *err)
{
    char *buf = g->buf;
    const size_t cap = GET_BUF_BYTES;
    struct stat st;
    off_t left;
    int fd = openat(dfd, dname, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC), r;

    if (fd < 0)
        return local_map_errno(errno, name, err);
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd); /* swapped meanwhile: left out */
        return 0;
    }
    r = get_header(g, name, &st, NULL, err);
    for (left = st.st_size; r == 0 && left > 0;) {
        ssize_t n = read(fd, buf, (size_t)left < cap ? (size_t)left : cap);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = local_map_errno(errno, name, err);
            break;
        }
        if (n == 0) { /* shrank meanwhile: zeros keep the header's size */
            n = (ssize_t)((size_t)left < cap ? (size_t)left : cap);
            memset(buf, 0, (size_t)n);
        }
        r = tar_out_write_data(&g->w, buf, (size_t)n, name, err);
        left -= n;
    }
    close(fd);
    return r;
}

/* Every entry of the directory dfd (prefix: its name relative to DIR, "" for DIR). */
static int get_walk(struct get_state *g, int dfd, const char *prefix, int depth,
                    struct lb_error *err)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC), r = 0;
    DIR *d;
    struct dirent *de;
    char *name, *link;

    if (fd < 0)
        return local_map_errno(errno, prefix[0] ? prefix : g->dir, err);
    d = fdopendir(fd);
    name = malloc(2 * PATH_BYTES); /* not on the stack: one frame per level on a worker's */
    if (!d || !name) {
        if (d)
            closedir(d);
        else
            close(fd);
        free(name);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    link = name + PATH_BYTES;
    while (r == 0 && (de = readdir(d))) {
        struct stat st;
        ssize_t n;

        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (snprintf(name, PATH_BYTES, "%s%s", prefix, de->d_name) >= PATH_BYTES - 1)
            continue;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* gone meanwhile */
        if (S_ISREG(st.st_mode)) {
            r = get_file(g, dirfd(d), de->d_name, name, err);
        } else if (S_ISLNK(st.st_mode)) {
            n = readlinkat(dirfd(d), de->d_name, link, PATH_BYTES - 1);
            if (n < 0)
                continue;
            link[n] = '\0';
            r = get_header(g, name, &st, link, err);
        } else if (S_ISDIR(st.st_mode) && depth < ARCHIVE_MAX_DEPTH) {
            int cfd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

            if (cfd < 0) {
                r = local_map_errno(errno, name, err);
                break;
            }
            if (!pseudo_fs(cfd)) {
                strcat(name, "/");
                r = get_header(g, name, &st, NULL, err);
                if (r == 0)
                    r = get_walk(g, cfd, name, depth + 1, err);
            }
            close(cfd);
        }
        /* devices, FIFOs, sockets: left out */
    }
    closedir(d);
    free(name);
    return r;
}

int local_archive_get(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *dir,
                      int fd, uint64_t max_bytes, struct lb_archive_result *out,
                      struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    struct local_fs_identity id = {0};
    struct local_desc d;
    struct get_state g = {.dir = dir};
    struct stat st;
    int rootfd = -1, dfd = -1, r;

    *out = (struct lb_archive_result){0};
    memset(&d, 0, sizeof(d));
    r = local_open_root(lp, ref, &d, dir, &rootfd, err);
    if (r < 0)
        goto out;
    g.base_uid = d.uid;
    r = tar_out_init(&g.w, fd, max_bytes, dir, err);
    if (r < 0)
        goto out;
    g.buf = malloc(GET_BUF_BYTES);
    if (!g.buf) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    r = local_fs_enter(&id, d.uid, err);
    if (r < 0)
        goto out;
    dfd = local_open_in_root(rootfd, dir, O_RDONLY | O_DIRECTORY, 0);
    if (dfd < 0) {
        r = local_map_errno(-dfd, dir, err);
        dfd = -1;
        goto out;
    }
    if (fstat(dfd, &st) < 0 || pseudo_fs(dfd)) {
        r = lb_error_set(err, -EINVAL,
                         "'%s' is a kernel pseudo-file system, not a directory to "
                         "archive",
                         dir);
        goto out;
    }
    r = tar_out_open(&g.w, err);
    if (r < 0)
        goto out;
    r = get_walk(&g, dfd, "", 0, err);
    if (r == 0)
        r = tar_out_close(&g.w, err);
    if (r == 0)
        *out = (struct lb_archive_result){.entries = g.w.entries, .bytes = g.w.written};
out:
    local_fs_leave(&id);
    tar_out_free(&g.w);
    free(g.buf);
    if (dfd >= 0)
        close(dfd);
    if (rootfd >= 0)
        close(rootfd);
    local_desc_release(&d);
    return r;
}
