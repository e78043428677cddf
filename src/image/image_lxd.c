/*
 * image_lxd.c - an imported image as an LXD unified tarball (see image.h,
 * image_write_lxd_tarball).
 */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "image/image.h"

/* Directories LXD (liblxc) mounts over or the lxd provider uses, made when the image lacks
 * them. */
static const struct {
    const char *name;
    mode_t mode;
} lxd_dirs[] = {
    {"dev", 0755}, {"proc", 0755}, {"sys", 0755},
    {"run", 0755}, {"tmp", 01777}, {"workspace", 0755},
};

struct tar_out {
    struct archive *a;
    struct archive_entry *e;
    char buf[65536];
};

static int tar_fail(struct tar_out *t, const char *what, const char *path, struct lb_error *err)
{
    return lb_error_set(err, -EIO, "cannot %s '%s' to the LXD tarball: %s", what, path,
                        archive_error_string(t->a) ? archive_error_string(t->a) : "?");
}

/* An entry made up here (not from the tree): owned by root, mtime now. */
static int tar_synthetic(struct tar_out *t, const char *path, mode_t type, mode_t perm,
                         const void *data, size_t len, struct lb_error *err)
{
    archive_entry_clear(t->e);
    archive_entry_set_pathname(t->e, path);
    archive_entry_set_filetype(t->e, (unsigned)type);
    archive_entry_set_perm(t->e, perm);
    archive_entry_set_size(t->e, type == AE_IFREG ? (la_int64_t)len : 0);
    archive_entry_set_uid(t->e, 0);
    archive_entry_set_gid(t->e, 0);
    archive_entry_set_mtime(t->e, time(NULL), 0);
    if (archive_write_header(t->a, t->e) != ARCHIVE_OK)
        return tar_fail(t, "add", path, err);
    if (type == AE_IFREG && len && archive_write_data(t->a, data, len) != (la_ssize_t)len)
        return tar_fail(t, "write", path, err);
    return 0;
}

/* One entry of the tree (name in dirfd, st its lstat) as path; a directory's content after it.
 * Device nodes are skipped (an import removed them already). */
static int tar_tree(struct tar_out *t, int dirfd, const char *name, const struct stat *st,
                    const char *path, struct lb_error *err)
{
    char target[PATH_MAX];
    int fd = -1, r = 0;

    if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode))
        return 0;
    archive_entry_clear(t->e);
    archive_entry_copy_stat(t->e, st);
    archive_entry_set_pathname(t->e, path);
    archive_entry_set_nlink(t->e, 1); /* a hard link becomes a copy */
    if (S_ISLNK(st->st_mode)) {
        ssize_t n = readlinkat(dirfd, name, target, sizeof(target) - 1);

        if (n < 0)
            return lb_error_set(err, -errno, "cannot read the link '%s': %s", path,
                                strerror(errno));
        target[n] = '\0';
        archive_entry_set_symlink(t->e, target);
    } else if (S_ISREG(st->st_mode) || S_ISDIR(st->st_mode)) {
        fd = openat(dirfd, name,
                    O_RDONLY | O_CLOEXEC | O_NOFOLLOW | (S_ISDIR(st->st_mode) ? O_DIRECTORY : 0));
        if (fd < 0)
            return lb_error_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
    }
    if (!S_ISREG(st->st_mode))
        archive_entry_set_size(t->e, 0);
    if (archive_write_header(t->a, t->e) != ARCHIVE_OK) {
        r = tar_fail(t, "add", path, err);
        goto out;
    }
    if (S_ISREG(st->st_mode)) {
        off_t left = st->st_size;

        while (left > 0) {
            ssize_t n = read(fd, t->buf, sizeof(t->buf));

            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                r = lb_error_set(err, -EIO, "cannot read '%s': %s", path,
                                 n < 0 ? strerror(errno) : "it shrank");
                goto out;
            }
            if (n > left)
                n = (ssize_t)left;
            if (archive_write_data(t->a, t->buf, (size_t)n) != n) {
                r = tar_fail(t, "write", path, err);
                goto out;
            }
            left -= n;
        }
    } else if (S_ISDIR(st->st_mode)) {
        int dfd = dup(fd);
        DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
        struct dirent *de;

        if (!d) {
            r = lb_error_set(err, -errno, "cannot list '%s': %s", path, strerror(errno));
            if (dfd >= 0)
                close(dfd);
            goto out;
        }
        while (r == 0 && (de = readdir(d))) {
            char child[PATH_MAX];
            struct stat cst;

            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                continue;
            if (snprintf(child, sizeof(child), "%s/%s", path, de->d_name) >= (int)sizeof(child)) {
                r = lb_error_set(err, -ENAMETOOLONG, "a path in the image is too long: %s/%s", path,
                                 de->d_name);
                break;
            }
            if (fstatat(fd, de->d_name, &cst, AT_SYMLINK_NOFOLLOW) < 0) {
                r = lb_error_set(err, -errno, "cannot stat '%s': %s", child, strerror(errno));
                break;
            }
            r = tar_tree(t, fd, de->d_name, &cst, child, err);
        }
        closedir(d);
    }
out:
    if (fd >= 0)
        close(fd);
    return r;
}

/* Where /sbin/init goes when the image has none: *where gets "sbin" or, when /sbin is a
 * relative symlink to a directory of the image (usrmerge: usr/sbin), that directory; *make_dir
 * when sbin itself is missing. 1 when an init is needed, 0 when the image has one. */
static int init_needed(int rootfd, char *where, size_t size, bool *make_dir, struct lb_error *err)
{
    struct stat st;
    char target[PATH_MAX];
    ssize_t n;

    *make_dir = false;
    snprintf(where, size, "sbin");
    if (fstatat(rootfd, "sbin", &st, AT_SYMLINK_NOFOLLOW) < 0) {
        *make_dir = true;
        return 1;
    }
    if (S_ISLNK(st.st_mode)) {
        n = readlinkat(rootfd, "sbin", target, sizeof(target) - 1);
        if (n <= 0)
            return lb_error_set(err, -EIO, "cannot read the image's /sbin link");
        target[n] = '\0';
        const char *rel = target;

        while (*rel == '/')
            rel++;
        if (!*rel || strstr(rel, "..") || strchr(rel, '/') == rel ||
            fstatat(rootfd, rel, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
            return lb_error_set(err, -EOPNOTSUPP,
                                "the image's /sbin is a link to '%s', not a directory of the "
                                "image: cannot give it an /sbin/init",
                                target);
        snprintf(where, size, "%s", rel);
    } else if (!S_ISDIR(st.st_mode)) {
        return lb_error_set(err, -EOPNOTSUPP, "the image's /sbin is not a directory");
    }
    {
        char init[PATH_MAX + 8];

        snprintf(init, sizeof(init), "%s/init", where);
        /* a link (e.g. to systemd) counts as an init: LXD follows it inside the container */
        return fstatat(rootfd, init, &st, AT_SYMLINK_NOFOLLOW) == 0 ? 0 : 1;
    }
}

static int read_whole(const char *path, void **data, size_t *len, struct lb_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    char *buf = NULL;
    size_t got = 0;
    int r = 0;

    if (fd < 0)
        return lb_error_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
        !(buf = malloc((size_t)st.st_size))) {
        r = lb_error_set(err, -EIO, "cannot read '%s'", path);
        goto out;
    }
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            r = lb_error_set(err, -EIO, "cannot read '%s'", path);
            goto out;
        }
        got += (size_t)n;
    }
    *data = buf;
    *len = got;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return r;
}

int image_write_lxd_tarball(const char *images_dir, const char *name, const char *init_path,
                            int out_fd, bool *init_added, struct lb_error *err)
{
    struct tar_out *t = calloc(1, sizeof(*t));
    struct lb_image_info info;
    struct utsname un;
    char root[PATH_MAX], meta[1024], where[PATH_MAX], path[PATH_MAX + 16];
    void *init_data = NULL;
    size_t init_len = 0;
    bool make_sbin = false;
    struct stat st;
    int rootfd = -1, need, r;

    *init_added = false;
    if (!t)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = image_get(images_dir, name, &info, err);
    if (r < 0)
        goto out;
    if (snprintf(root, sizeof(root), "%s/.store/sha256/%s/rootfs", images_dir,
                 info.digest + strlen("sha256:")) >= (int)sizeof(root)) {
        r = lb_error_set(err, -ENAMETOOLONG, "the images directory's path is too long");
        goto out;
    }
    rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (rootfd < 0 || fstat(rootfd, &st) < 0) {
        r = lb_error_set(err, -errno, "cannot open the tree of image '%s': %s", name,
                         strerror(errno));
        goto out;
    }
    need = init_needed(rootfd, where, sizeof(where), &make_sbin, err);
    if (need < 0) {
        r = need;
        goto out;
    }
    if (need && (r = read_whole(init_path, &init_data, &init_len, err)) < 0)
        goto out;
    t->a = archive_write_new();
    t->e = archive_entry_new();
    if (!t->a || !t->e) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    if (archive_write_set_format_pax_restricted(t->a) != ARCHIVE_OK ||
        archive_write_open_fd(t->a, out_fd) != ARCHIVE_OK) {
        r = lb_error_set(err, -EIO, "cannot start the LXD tarball: %s", archive_error_string(t->a));
        goto out;
    }
    uname(&un);
    snprintf(meta, sizeof(meta),
             "architecture: %s\ncreation_date: %lld\nproperties:\n"
             "  description: \"lendbox image %s (%s)\"\n  os: lendbox\n  release: \"%s\"\n",
             un.machine, (long long)time(NULL), name, info.digest, name);
    r = tar_synthetic(t, "metadata.yaml", AE_IFREG, 0644, meta, strlen(meta), err);
    if (r == 0) {
        /* the root first (its own mode and owner), then what LXD needs that the image lacks */
        archive_entry_clear(t->e);
        archive_entry_copy_stat(t->e, &st);
        archive_entry_set_pathname(t->e, "rootfs");
        archive_entry_set_size(t->e, 0);
        if (archive_write_header(t->a, t->e) != ARCHIVE_OK)
            r = tar_fail(t, "add", "rootfs", err);
    }
    for (size_t i = 0; r == 0 && i < sizeof(lxd_dirs) / sizeof(lxd_dirs[0]); i++) {
        struct stat dst;

        if (fstatat(rootfd, lxd_dirs[i].name, &dst, AT_SYMLINK_NOFOLLOW) == 0)
            continue;
        snprintf(path, sizeof(path), "rootfs/%s", lxd_dirs[i].name);
        r = tar_synthetic(t, path, AE_IFDIR, lxd_dirs[i].mode, NULL, 0, err);
    }
    if (r == 0 && need && make_sbin)
        r = tar_synthetic(t, "rootfs/sbin", AE_IFDIR, 0755, NULL, 0, err);
    {
        /* the tree, each top-level entry in turn */
        int dfd = r == 0 ? dup(rootfd) : -1;
        DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
        struct dirent *de;

        if (r == 0 && !d) {
            r = lb_error_set(err, -errno, "cannot list the image's tree: %s", strerror(errno));
            if (dfd >= 0)
                close(dfd);
        }
        while (r == 0 && (de = readdir(d))) {
            struct stat cst;

            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                continue;
            snprintf(path, sizeof(path), "rootfs/%s", de->d_name);
            if (fstatat(rootfd, de->d_name, &cst, AT_SYMLINK_NOFOLLOW) < 0)
                r = lb_error_set(err, -errno, "cannot stat '%s': %s", path, strerror(errno));
            else
                r = tar_tree(t, rootfd, de->d_name, &cst, path, err);
        }
        if (d)
            closedir(d);
    }
    if (r == 0 && need) {
        snprintf(path, sizeof(path), "rootfs/%s/init", where);
        r = tar_synthetic(t, path, AE_IFREG, 0755, init_data, init_len, err);
        *init_added = r == 0;
    }
    if (r == 0 && archive_write_close(t->a) != ARCHIVE_OK)
        r = lb_error_set(err, -EIO, "cannot finish the LXD tarball: %s",
                         archive_error_string(t->a));
out:
    if (t->e)
        archive_entry_free(t->e);
    if (t->a)
        archive_write_free(t->a);
    if (rootfd >= 0)
        close(rootfd);
    free(init_data);
    free(t);
    return r;
}
