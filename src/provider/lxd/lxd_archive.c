/*
 * lxd_archive.c - the lxd provider's archive hooks (engine.h) over the instance files API,
 * which takes one file, directory or symlink per request and lists a directory on GET: a
 * checked archive is pushed entry by entry (a hard link as a copy of its target), and a
 * directory's tree is walked request by request into the archive writer, each file spooled
 * (bounded by what the writer may still take).
 */
#include "provider/lxd/lxd_internal.h"

#include <archive.h>
#include <archive_entry.h>
#include <curl/curl.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "provider/engine/httpc.h"
#include "util/log.h"

#define ARCHIVE_FILE_TIMEOUT_MS (30 * 60 * 1000)
#define ARCHIVE_MAX_DEPTH 128
#define LISTING_MAX_BYTES (16 * 1024 * 1024)

/* One GET of path into a new spool file (at most max bytes: -EFBIG): *type ("file",
 * "directory", "symlink"; "" for none), *mode (-1 for none), *fd_out and *len. -ENOENT for a
 * 404; else 0 or a negative errno with err set. */
static int get_entry(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *path,
                     uint64_t max, char *type, size_t type_size, int *mode, int *fd_out,
                     uint64_t *len, struct lb_error *err)
{
    struct engine_spool_sink sink = {.fd = engine_spool_file(&l->eng), .max = max};
    struct lb_httpc_request req = {.method = "GET",
                                   .timeout_ms = ARCHIVE_FILE_TIMEOUT_MS,
                                   .max_body_bytes = 65536,
                                   .sink = engine_spool_write,
                                   .sink_arg = &sink,
                                   .want_header = "X-LXD-type",
                                   .want_header2 = "X-LXD-mode"};
    struct lb_httpc_response resp = {0};
    char url[PATH_MAX + 128];
    int r;

    *fd_out = -1;
    if (sink.fd < 0)
        return lb_error_set(err, sink.fd, "cannot make a spool file: %s", strerror(-sink.fd));
    r = lxd_files_url(ref->id, path, url, sizeof(url), err);
    if (r < 0)
        goto out;
    req.path = url;
    r = lxd_do(l, lxd_member_of(ref), &req, &resp, err);
    if (r < 0)
        goto out;
    if (resp.status == 404) {
        r = -ENOENT;
        goto out;
    }
    if (resp.status != 200) {
        r = lb_error_set(err, -EREMOTEIO, "LXD: reading '%s' failed (HTTP %ld)", path, resp.status);
        goto out;
    }
    snprintf(type, type_size, "%s", resp.header_value ? resp.header_value : "");
    *mode = resp.header_value2 ? (int)strtol(resp.header_value2, NULL, 8) : -1;
    *len = sink.written;
    if (lseek(sink.fd, 0, SEEK_SET) < 0) {
        r = lb_error_set(err, -EIO, "cannot rewind a spool file: %s", strerror(errno));
        goto out;
    }
    *fd_out = sink.fd;
    sink.fd = -1;
out:
    if (sink.fd >= 0)
        close(sink.fd);
    httpc_response_release(&resp);
    return r;
}

/* The names of a directory's listing (a spooled GET answer): a new JSON array, or NULL. */
static json_t *listing_names(int fd)
{
    json_t *j = json_loadfd(fd, 0, NULL), *m;

    m = json_incref(json_object_get(j, "metadata"));
    json_decref(j);
    if (!json_is_array(m)) {
        json_decref(m);
        return NULL;
    }
    return m;
}

/* POST a directory or a symlink (target: its body) at path. */
static int post_special(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *path,
                        const char *target, int mode, struct lb_error *err)
{
    struct lb_httpc_request req = {.body = target ? target : "",
                                   .body_len = target ? strlen(target) : 0,
                                   .timeout_ms = l->call_timeout_ms};
    struct lb_httpc_response resp = {0};
    char m[300];
    int r = lxd_files_post(l, ref, path, target ? "symlink" : "directory", (unsigned)mode, true,
                           &req, &resp, err);

    if (r == 0 && resp.status != 200) {
        httpc_json_message(&resp, "error", m, sizeof(m));
        if (strstr(m, "no space") || strstr(m, "quota"))
            r = lb_error_set(err, -EFBIG, "no space left for '%s' in the sandbox", path);
        else if (strstr(m, "frozen"))
            r = lb_error_set(err, -EBUSY, "sandbox '%s' is paused", ref->id);
        else if (resp.status >= 500 && !strstr(m, "exists") && !strstr(m, "directory"))
            r = lb_error_set(err, -EREMOTEIO, "LXD: cannot make '%s': %s", path, m);
        else
            r = lb_error_set(err, -EISDIR,
                             "'%s' clashes with what the sandbox has there (a directory and a "
                             "non-directory): %s",
                             path, m);
    }
    httpc_response_release(&resp);
    return r;
}

/* DELETE path (a file or a symlink it replaces: LXD's overwrite keeps an existing file's
 * mode). Best effort: a missing path, or a directory that is not empty, stays as it is and
 * the push that follows says what is wrong. */
static void delete_path(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *path)
{
    struct lb_httpc_request req = {.method = "DELETE", .max_body_bytes = 65536};
    struct lb_httpc_response resp = {0};
    struct lb_error ignored = {0};
    char url[PATH_MAX + 128];

    if (lxd_files_url(ref->id, path, url, sizeof(url), &ignored) < 0)
        return;
    req.path = url;
    req.timeout_ms = l->call_timeout_ms;
    (void)lxd_do(l, lxd_member_of(ref), &req, &resp, &ignored);
    httpc_response_release(&resp);
}

/* One entry of the checked archive (header read) at dir/name; fresh: dir was made for this
 * archive (nothing to replace in it). */
static int push_entry(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *dir,
                      bool fresh, struct archive *a, struct archive_entry *e, struct lb_error *err)
{
    char path[PATH_MAX];
    const char *hard = archive_entry_hardlink(e);
    mode_t type = archive_entry_filetype(e);
    int perm = (int)archive_entry_perm(e), fd = -1, r;
    uint64_t size;

    if (snprintf(path, sizeof(path), "%s/%s", dir, archive_entry_pathname(e)) >= (int)sizeof(path))
        return lb_error_set(err, -EINVAL, "a name of the archive is too long");
    if (!fresh && type != AE_IFDIR)
        delete_path(l, ref, path);
    if (hard) {
        char target[PATH_MAX];

        snprintf(target, sizeof(target), "%s/%s", dir, hard);
        r = lxd_file_open(&l->eng, ref, target, &fd, &size, err);
        if (r == 0)
            r = lxd_put_file(l, ref, path, fd, NULL, size, perm, err);
    } else if (type == AE_IFDIR) {
        r = post_special(l, ref, path, NULL, perm, err);
        if (r == -EREMOTEIO || r == -EISDIR) { /* a missing parent: made, then once more */
            char parent[PATH_MAX];

            snprintf(parent, sizeof(parent), "%s", path);
            *strrchr(parent, '/') = '\0';
            r = lxd_make_dirs(l, ref, parent, err);
            if (r == 0)
                r = post_special(l, ref, path, NULL, perm, err);
        }
    } else if (type == AE_IFLNK) {
        r = post_special(l, ref, path, archive_entry_symlink(e), 0777, err);
        if (r == -EREMOTEIO || r == -EISDIR) {
            char parent[PATH_MAX];

            snprintf(parent, sizeof(parent), "%s", path);
            *strrchr(parent, '/') = '\0';
            r = lxd_make_dirs(l, ref, parent, err);
            if (r == 0)
                r = post_special(l, ref, path, archive_entry_symlink(e), 0777, err);
        }
    } else {
        fd = engine_spool_file(&l->eng);
        if (fd < 0)
            return lb_error_set(err, fd, "cannot make a spool file: %s", strerror(-fd));
        size = (uint64_t)archive_entry_size(e);
        if (archive_read_data_into_fd(a, fd) != ARCHIVE_OK)
            r = lb_error_set(err, -EIO, "cannot spool '%s': %s", path, archive_error_string(a));
        else
            r = lxd_put_file(l, ref, path, fd, NULL, size, perm, err);
    }
    if (fd >= 0)
        close(fd);
    return r;
}

int lxd_archive_put(struct lb_engine *eng, const struct lb_sandbox_ref *ref, const char *dir,
                    int fd, uint64_t len, const struct engine_archive_tops *tops,
                    struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)eng;
    bool *existed = calloc(tops->n + 1, sizeof(*existed)), made = false;
    struct archive *a = NULL;
    struct archive_entry *e;
    char type[32];
    int mode, dfd = -1, r, ar;
    uint64_t n;
    json_t *names = NULL;

    if (!existed)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = get_entry(l, ref, dir, LISTING_MAX_BYTES, type, sizeof(type), &mode, &dfd, &n, err);
    if (r == -ENOENT) {
        enum lb_sandbox_status st;

        if (lxd_state(l, ref, &st, NULL) == 0 && st == LB_STATUS_STOPPED) {
            r = lb_error_set(err, -ENOENT, "no such sandbox");
            goto out;
        }
        r = lxd_make_dirs(l, ref, dir, err);
        if (r < 0)
            goto out;
        made = true;
    } else if (r < 0 && r != -EFBIG) {
        goto out;
    } else if (r == -EFBIG || strcmp(type, "directory") != 0) { /* a file past the bound */
        r = lb_error_set(err, -ENOTDIR, "'%s' is not a directory", dir);
        goto out;
    } else {
        names = listing_names(dfd);
        for (size_t i = 0; i < tops->n; i++) {
            size_t k;
            json_t *v;

            json_array_foreach(names, k, v)
                if (json_is_string(v) && !strcmp(json_string_value(v), tops->names[i]))
                    existed[i] = true;
        }
    }
    (void)len;
    a = archive_read_new();
    if (!a || archive_read_support_format_tar(a) != ARCHIVE_OK ||
        archive_read_open_fd(a, fd, 65536) != ARCHIVE_OK) {
        r = lb_error_set(err, -EIO, "cannot read the checked archive back");
        goto undo;
    }
    while ((ar = archive_read_next_header(a, &e)) != ARCHIVE_EOF) {
        if (ar < ARCHIVE_WARN) {
            r = lb_error_set(err, -EIO, "cannot read the checked archive back: %s",
                             archive_error_string(a));
            goto undo;
        }
        r = push_entry(l, ref, dir, made, a, e, err);
        if (r < 0)
            goto undo;
    }
    r = 0;
    goto out;
undo:
    if (!tops->overflow && engine_archive_undo(eng, ref, dir, made, tops, existed) < 0)
        log_warn("lxd: archive into '%s' of sandbox %s failed part way and what it made could "
                 "not be removed",
                 dir, ref->id);
out:
    if (a)
        archive_read_free(a);
    if (dfd >= 0)
        close(dfd);
    json_decref(names);
    free(existed);
    return r;
}

/* LXD answers a symlink's target absolute (joined to the link's directory and cleaned): one
 * inside top becomes relative to the link's directory from again, into out; any other stays as
 * LXD gave it. */
static void link_relative(const char *top, const char *from, const char *target, char *out,
                          size_t size)
{
    size_t n = strlen(top), common = 0, i;
    const char *f, *t;

    snprintf(out, size, "%s", target);
    if (target[0] != '/' || strncmp(target, top, n) != 0 || target[n] != '/')
        return;
    /* the longest common directory prefix of from and target (whole components) */
    for (i = 0; from[i] && from[i] == target[i]; i++)
        if (from[i] == '/')
            common = i;
    if (!from[i] && target[i] == '/')
        common = i;
    out[0] = '\0';
    for (f = from + common; *f; f++) /* one ".." per component of from past the prefix */
        if (*f == '/')
            strncat(out, "../", size - strlen(out) - 1);
    t = target + common + 1;
    strncat(out, t, size - strlen(out) - 1);
}

/* What walk needs at each level, on the heap: a worker's stack is 256 KiB and an agent makes
 * directories as deep as it likes (ARCHIVE_MAX_DEPTH levels are walked). */
struct walk_frame {
    char child[PATH_MAX], name[PATH_MAX], target[PATH_MAX], rel[PATH_MAX], buf[65536];
};

/* The tree below path (prefix: its name relative to DIR, "" for DIR) into w. */
static int walk(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *path,
                const char *prefix, json_t *names, int depth, struct lb_tar_out *w,
                struct lb_error *err)
{
    struct walk_frame *f = malloc(sizeof(*f));
    char *child, *name, *buf;
    size_t i;
    json_t *v;
    int r = 0;

    if (!f)
        return lb_error_set(err, -ENOMEM, "out of memory");
    child = f->child, name = f->name, buf = f->buf;
    json_array_foreach(names, i, v) {
        const char *base = json_string_value(v);
        char type[32];
        struct lb_tar_item it = {0};
        int mode, fd = -1;
        uint64_t len = 0, room = w->max_bytes - w->written;

        if (!base || !base[0] || strchr(base, '/') || !strcmp(base, ".") || !strcmp(base, ".."))
            continue;
        if (snprintf(child, sizeof(f->child), "%s/%s", path, base) >= (int)sizeof(f->child) - 1 ||
            snprintf(name, sizeof(f->name), "%s%s", prefix, base) >= (int)sizeof(f->name) - 1)
            continue;
        r = get_entry(l, ref, child, room < LISTING_MAX_BYTES ? LISTING_MAX_BYTES : room, type,
                      sizeof(type), &mode, &fd, &len, err);
        if (r == -ENOENT) { /* gone meanwhile */
            r = 0;
            continue;
        }
        if (r == -EFBIG)
            r = lb_error_set(
                err, -EFBIG,
                "the archive of '%s' is larger than %llu bytes (limits.max_file_bytes)", w->dir,
                (unsigned long long)w->max_bytes);
        if (r < 0)
            break;
        it.name = name;
        it.mtime = 0;
        if (!strcmp(type, "directory")) {
            json_t *sub = listing_names(fd);

            if (depth < ARCHIVE_MAX_DEPTH) {
                strcat(name, "/");
                it.mode = S_IFDIR | (mode_t)(mode < 0 ? 0755 : mode & 07777);
                r = tar_out_write_header(w, &it, err);
                if (r == 0 && sub)
                    r = walk(l, ref, child, name, sub, depth + 1, w, err);
            }
            json_decref(sub);
        } else if (!strcmp(type, "symlink")) {
            char *target = f->target, *rel = f->rel;
            ssize_t n = len < sizeof(f->target) ? pread(fd, target, (size_t)len, 0) : -1;

            if (n >= 0) {
                target[n] = '\0';
                target[strcspn(target, "\n")] = '\0';
                link_relative(w->dir, path, target, rel, sizeof(f->rel));
                it.mode = S_IFLNK | 0777;
                it.symlink = rel;
                r = tar_out_write_header(w, &it, err);
            }
        } else if (!strcmp(type, "file")) {
            it.mode = S_IFREG | (mode_t)(mode < 0 ? 0644 : mode & 07777);
            it.size = (int64_t)len;
            r = tar_out_write_header(w, &it, err);
            while (r == 0) {
                ssize_t n = read(fd, buf, sizeof(f->buf));

                if (n < 0 && errno == EINTR)
                    continue;
                if (n <= 0) {
                    if (n < 0)
                        r = lb_error_set(err, -EIO, "cannot read a spool file: %s",
                                         strerror(errno));
                    break;
                }
                r = tar_out_write_data(w, buf, (size_t)n, name, err);
            }
        }
        close(fd);
        if (r < 0)
            break;
    }
    free(f);
    return r;
}

int lxd_archive_get(struct lb_engine *eng, const struct lb_sandbox_ref *ref, const char *dir,
                    struct lb_tar_out *w, struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)eng;
    char type[32];
    int mode, fd = -1, r;
    uint64_t len;
    json_t *names = NULL;

    r = get_entry(l, ref, dir, LISTING_MAX_BYTES, type, sizeof(type), &mode, &fd, &len, err);
    if (r == -ENOENT)
        return lb_error_set(err, -ENOENT, "no directory '%s' in the sandbox", dir);
    if (r == -EFBIG || (r == 0 && strcmp(type, "directory") != 0))
        r = lb_error_set(err, -ENOTDIR, "'%s' is not a directory", dir);
    if (r < 0)
        goto out;
    names = listing_names(fd);
    if (!names) {
        r = lb_error_set(err, -EREMOTEIO, "LXD: the listing of '%s' is not one", dir);
        goto out;
    }
    r = walk(l, ref, dir, "", names, 0, w, err);
out:
    if (fd >= 0)
        close(fd);
    json_decref(names);
    return r;
}
