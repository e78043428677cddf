/*
 * docker_archive.c - the docker provider's archive hooks (engine.h): a checked archive put
 * into a directory of the container with PUT /containers/{name}/archive, and a directory's
 * tree read from GET /containers/{name}/archive (spooled, bounded), its names made relative
 * to the directory.
 */
#include "provider/docker/docker_internal.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "provider/engine/httpc.h"
#include "util/log.h"

#define GO_MODE_DIR (1U << 31)
#define GO_MODE_SYMLINK (1U << 27)
/* what docker's own tar of a tree may hold beyond our archive of it (its headers) */
#define SPOOL_SLACK_BYTES (64ULL * 1024 * 1024)

enum path_kind { PATH_MISSING, PATH_DIR, PATH_OTHER };

/* What path is in the container (HEAD .../archive): a directory, missing, or something else
 * (a file, or a symlink: never followed here). */
static int path_kind(struct lb_docker *d, const char *id, const char *path, enum path_kind *out,
                     struct lb_error *err)
{
    json_t *j = NULL;
    const char *link;
    uint64_t mode;
    long status;
    int r = docker_path_stat(d, id, path, &j, &status, err);

    if (r < 0)
        return r;
    if (status == 404) {
        json_decref(j);
        *out = PATH_MISSING;
        return 0;
    }
    if (!j)
        return lb_error_set(err, -EREMOTEIO, "docker engine: cannot stat '%s' (HTTP %ld)", path,
                            status);
    mode = (uint64_t)json_integer_value(json_object_get(j, "mode"));
    link = json_string_value(json_object_get(j, "linkTarget"));
    if ((mode & GO_MODE_SYMLINK) || (link && *link && strcmp(link, path) != 0))
        *out = PATH_OTHER;
    else
        *out = (mode & GO_MODE_DIR) ? PATH_DIR : PATH_OTHER;
    json_decref(j);
    return 0;
}

/* A tar of one directory entry (dir without its leading '/', 0755) into a spool file: its fd
 * and length. */
static int dir_tar(struct lb_docker *d, const char *dir, int *fd_out, uint64_t *len,
                   struct lb_error *err)
{
    struct archive *a = archive_write_new();
    struct archive_entry *e = archive_entry_new();
    int fd = engine_spool_file(&d->eng), r = 0;
    off_t end;

    if (fd < 0) {
        r = lb_error_set(err, fd, "cannot make a spool file: %s", strerror(-fd));
        goto out;
    }
    if (!a || !e || archive_write_set_format_pax_restricted(a) != ARCHIVE_OK ||
        archive_write_open_fd(a, fd) != ARCHIVE_OK) {
        r = lb_error_set(err, -EIO, "cannot start a tar stream");
        goto out;
    }
    archive_entry_set_pathname(e, dir + 1);
    archive_entry_set_filetype(e, AE_IFDIR);
    archive_entry_set_perm(e, 0755);
    archive_entry_set_mtime(e, time(NULL), 0);
    if (archive_write_header(a, e) != ARCHIVE_OK || archive_write_close(a) != ARCHIVE_OK ||
        (end = lseek(fd, 0, SEEK_END)) < 0 || lseek(fd, 0, SEEK_SET) < 0) {
        r = lb_error_set(err, -EIO, "cannot write a tar stream");
        goto out;
    }
    *len = (uint64_t)end;
    *fd_out = fd;
    fd = -1;
out:
    if (fd >= 0)
        close(fd);
    if (a)
        archive_write_free(a);
    if (e)
        archive_entry_free(e);
    return r;
}

/* PUT tar_fd (len bytes) at dir; the engine's answer as this provider's error. */
static int put_at(struct lb_docker *d, const char *id, const char *dir, int tar_fd, uint64_t len,
                  struct lb_error *err)
{
    struct lb_httpc_response resp = {0};
    char m[300];
    int r = docker_put_archive(d, id, dir, tar_fd, len, &resp, err);

    if (r < 0 || resp.status == 200 || resp.status == 204)
        goto out;
    httpc_json_message(&resp, "message", m, sizeof(m));
    if (resp.status == 404 && !strstr(m, "no such file"))
        r = lb_error_set(err, -ENOENT, "no such sandbox");
    else if (strstr(m, "no space") || strstr(m, "quota"))
        r = lb_error_set(err, -EFBIG,
                         "the archive does not fit in '%s': the sandbox's file system there is "
                         "full (sized from the sandbox's resources.disk_mib)",
                         dir);
    else if (strstr(m, "not a directory") || strstr(m, "no such file"))
        r = lb_error_set(err, -ENOTDIR, "a parent of '%s' is not a directory", dir);
    else if (strstr(m, "is a directory") || strstr(m, "file exists") ||
             strstr(m, "removing item to be overwritten"))
        r = lb_error_set(err, -EISDIR,
                         "an entry of the archive is a directory in the sandbox and not one in "
                         "the archive, or a mount point: %s",
                         m);
    else if (resp.status == 403 || strstr(m, "read-only"))
        r = lb_error_set(err, -EROFS, "'%s' is on a read-only file system", dir);
    else if (strstr(m, "paused"))
        r = lb_error_set(err, -EBUSY, "sandbox '%s' is paused", id);
    else
        r = lb_error_set(err, -EREMOTEIO, "docker engine: archive upload failed (HTTP %ld): %s",
                         resp.status, m);
out:
    httpc_response_release(&resp);
    return r < 0 ? docker_transport_error(r, err) : 0;
}

int docker_archive_put(struct lb_engine *eng, const struct lb_sandbox_ref *ref, const char *dir,
                       int fd, uint64_t len, const struct engine_archive_tops *tops,
                       struct lb_error *err)
{
    struct lb_docker *d = (struct lb_docker *)eng;
    bool *existed = calloc(tops->n + 1, sizeof(*existed));
    enum path_kind kind;
    bool made = false;
    int dfd = -1, r;
    uint64_t dlen = 0;

    if (!existed)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = path_kind(d, ref->id, dir, &kind, err);
    if (r < 0)
        goto out;
    if (kind == PATH_OTHER) {
        r = lb_error_set(err, -ENOTDIR, "'%s' is not a directory", dir);
        goto out;
    }
    if (kind == PATH_DIR) {
        for (size_t i = 0; i < tops->n && r == 0; i++) {
            char p[8192];
            enum path_kind k;

            snprintf(p, sizeof(p), "%s/%s", dir, tops->names[i]);
            r = path_kind(d, ref->id, p, &k, err);
            existed[i] = k != PATH_MISSING;
        }
        if (r < 0)
            goto out;
    } else {
        r = dir_tar(d, dir, &dfd, &dlen, err);
        if (r == 0)
            r = put_at(d, ref->id, "/", dfd, dlen, err);
        if (r < 0)
            goto out;
        made = true;
    }
    r = put_at(d, ref->id, dir, fd, len, err);
    if (r < 0 && !tops->overflow) {
        if (engine_archive_undo(eng, ref, dir, made, tops, existed) < 0)
            log_warn("docker: archive into '%s' of sandbox %s failed part way and what it made "
                     "could not be removed",
                     dir, ref->id);
    }
out:
    if (dfd >= 0)
        close(dfd);
    free(existed);
    return r;
}

/* The name of a docker tar entry relative to dir: its first component (dir's own name)
 * dropped. NULL for dir itself. */
static const char *relative_name(const char *name)
{
    const char *s;

    while (name[0] == '.' && name[1] == '/')
        name += 2;
    s = strchr(name, '/');
    if (!s)
        return NULL;
    while (*s == '/')
        s++;
    return *s ? s : NULL;
}

int docker_archive_get(struct lb_engine *eng, const struct lb_sandbox_ref *ref, const char *dir,
                       struct lb_tar_out *w, struct lb_error *err)
{
    struct lb_docker *d = (struct lb_docker *)eng;
    struct lb_httpc_response resp = {0};
    struct archive *a = NULL;
    struct archive_entry *e;
    enum path_kind kind;
    int fd = -1, r, ar;
    char buf[64 * 1024];

    r = path_kind(d, ref->id, dir, &kind, err);
    if (r < 0)
        return r;
    if (kind == PATH_MISSING)
        return lb_error_set(err, -ENOENT, "no directory '%s' in the sandbox", dir);
    if (kind != PATH_DIR)
        return lb_error_set(err, -ENOTDIR, "'%s' is not a directory", dir);
    fd = engine_spool_file(eng);
    if (fd < 0)
        return lb_error_set(err, fd, "cannot make a spool file: %s", strerror(-fd));
    r = docker_get_archive(d, ref->id, dir, fd, w->max_bytes + SPOOL_SLACK_BYTES, &resp, err);
    if (r == -EFBIG) {
        w->too_big = true;
        r = lb_error_set(err, -EFBIG,
                         "the archive of '%s' is larger than %llu bytes (limits.max_file_bytes)",
                         dir, (unsigned long long)w->max_bytes);
        goto out;
    }
    if (r < 0) {
        r = docker_transport_error(r, err);
        goto out;
    }
    if (resp.status == 404) {
        r = lb_error_set(err, -ENOENT, "no directory '%s' in the sandbox", dir);
        goto out;
    }
    r = docker_archive_read(&resp, fd, dir, &a, err);
    if (r < 0)
        goto out;
    while (r == 0 && (ar = archive_read_next_header(a, &e)) != ARCHIVE_EOF) {
        const char *rel, *hard;
        char name[4200], hname[4200];
        mode_t type;
        struct lb_tar_item it = {0};

        if (ar < ARCHIVE_WARN) {
            r = lb_error_set(err, -EREMOTEIO, "the engine's archive of '%s' is damaged: %s", dir,
                             archive_error_string(a));
            break;
        }
        rel = relative_name(archive_entry_pathname(e));
        type = archive_entry_filetype(e);
        hard = archive_entry_hardlink(e);
        if (!rel || (type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK && !hard))
            continue; /* dir itself; devices, FIFOs, sockets: left out */
        snprintf(name, sizeof(name), "%s%s", rel,
                 type == AE_IFDIR && rel[strlen(rel) - 1] != '/' ? "/" : "");
        it.name = name;
        it.mode = archive_entry_mode(e);
        it.mtime = archive_entry_mtime(e);
        it.uid = (uint32_t)archive_entry_uid(e);
        it.gid = (uint32_t)archive_entry_gid(e);
        it.size = archive_entry_size(e);
        it.symlink = type == AE_IFLNK ? archive_entry_symlink(e) : NULL;
        if (hard) {
            const char *hr = relative_name(hard);

            if (!hr)
                continue;
            snprintf(hname, sizeof(hname), "%s", hr);
            it.hardlink = hname;
            it.mode = (it.mode & 07777) | S_IFREG;
        }
        r = tar_out_write_header(w, &it, err);
        if (r < 0 || type != AE_IFREG || hard)
            continue;
        for (;;) {
            la_ssize_t n = archive_read_data(a, buf, sizeof(buf));

            if (n == 0)
                break;
            if (n < 0) {
                r = lb_error_set(err, -EREMOTEIO, "the engine's archive of '%s' is damaged: %s",
                                 dir, archive_error_string(a));
                break;
            }
            r = tar_out_write_data(w, buf, (size_t)n, name, err);
            if (r < 0)
                break;
        }
    }
out:
    if (a)
        archive_read_free(a);
    if (fd >= 0)
        close(fd);
    httpc_response_release(&resp);
    return r;
}
