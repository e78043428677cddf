/*
 * docker_files.c - files on the docker provider: the archive API (PUT/HEAD/GET
 * /containers/{name}/archive) with tar streams written and read by libarchive, spooled
 * through unlinked temporary files on the host (see docker.h).
 */
#include "provider/docker/docker_internal.h"

#include <archive.h>
#include <archive_entry.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/token.h"

#define ARCHIVE_TIMEOUT_MS (30 * 60 * 1000)
#define GO_MODE_DIR (1U << 31)

static char *escape(const char *s)
{
    return curl_easy_escape(NULL, s, 0);
}

/* Write a one-file tar (entry path without the leading '/') into tar_fd. */
static int make_tar(int tar_fd, const char *path, int src_fd, const void *data, uint64_t len,
                    int mode, struct lb_error *err)
{
    struct archive *a = archive_write_new();
    struct archive_entry *e = archive_entry_new();
    char buf[65536];
    uint64_t off = 0;
    int r = 0;

    if (!a || !e) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    if (archive_write_set_format_pax_restricted(a) != ARCHIVE_OK ||
        archive_write_open_fd(a, tar_fd) != ARCHIVE_OK) {
        r = lb_error_set(err, -EIO, "cannot start a tar stream: %s", archive_error_string(a));
        goto out;
    }
    archive_entry_set_pathname(e, path + 1);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, (mode_t)(mode < 0 ? 0644 : mode) & 07777);
    archive_entry_set_size(e, (la_int64_t)len);
    archive_entry_set_uid(e, 0);
    archive_entry_set_gid(e, 0);
    archive_entry_set_mtime(e, time(NULL), 0);
    if (archive_write_header(a, e) != ARCHIVE_OK) {
        r = lb_error_set(err, -EIO, "cannot write a tar header: %s", archive_error_string(a));
        goto out;
    }
    while (off < len) {
        size_t want = len - off < sizeof(buf) ? (size_t)(len - off) : sizeof(buf);
        const void *chunk = data ? (const char *)data + off : buf;
        ssize_t got = (ssize_t)want;

        if (!data) {
            got = pread(src_fd, buf, want, (off_t)off);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0) {
                r = lb_error_set(err, -EIO, "cannot read the spooled upload: %s",
                                 got < 0 ? strerror(errno) : "short file");
                goto out;
            }
        }
        if (archive_write_data(a, chunk, (size_t)got) != got) {
            r = lb_error_set(err, -EIO, "cannot write the tar stream: %s", archive_error_string(a));
            goto out;
        }
        off += (uint64_t)got;
    }
    if (archive_write_close(a) != ARCHIVE_OK)
        r = lb_error_set(err, -EIO, "cannot finish the tar stream: %s", archive_error_string(a));
out:
    archive_entry_free(e);
    archive_write_free(a);
    return r;
}

/* "/containers/<name>/archive?path=<path, escaped>" of sandbox id into url. */
static int archive_url(const struct lb_docker *d, const char *id, const char *path, char *url,
                       size_t size, struct lb_error *err)
{
    char name[256], *enc = escape(path);

    if (!enc)
        return lb_error_set(err, -ENOMEM, "out of memory");
    docker_name(d, id, name, sizeof(name));
    snprintf(url, size, "/containers/%s/archive?path=%s", name, enc);
    curl_free(enc);
    return 0;
}

/* req (its method and body or sink; its timeout, ARCHIVE_TIMEOUT_MS when 0) sent to the archive
 * endpoint of path in sandbox id's container: archive_url's error, or httpc_do's return (a
 * transport failure made this provider's error by docker_transport_error when transport is true).
 */
static int archive_do(struct lb_docker *d, const char *id, const char *path,
                      struct lb_httpc_request *req, bool transport, struct lb_httpc_response *resp,
                      struct lb_error *err)
{
    char url[8192];
    int r = archive_url(d, id, path, url, sizeof(url), err);

    if (r < 0)
        return r;
    req->path = url;
    if (!req->timeout_ms)
        req->timeout_ms = ARCHIVE_TIMEOUT_MS;
    req->max_body_bytes = 65536;
    r = httpc_do(d->eng.http, req, resp, err);
    return r < 0 && transport ? docker_transport_error(r, err) : r;
}

int docker_put_archive(struct lb_docker *d, const char *id, const char *dir, int tar_fd,
                       uint64_t len, struct lb_httpc_response *resp, struct lb_error *err)
{
    struct lb_httpc_request req = {.method = "PUT",
                                   .content_type = "application/x-tar",
                                   .body_fd = tar_fd,
                                   .body_fd_len = len};
    int r = archive_do(d, id, dir, &req, true, resp, err);

    return r < 0 ? r : 0;
}

int docker_put_file(struct lb_docker *d, const char *id, const char *path, int fd, const void *data,
                    uint64_t len, int mode, struct lb_error *err)
{
    struct lb_httpc_response resp = {0};
    char m[300];
    int tar_fd = engine_spool_file(&d->eng), r;
    struct stat stt;

    if (tar_fd < 0)
        return lb_error_set(err, tar_fd, "cannot make a spool file in '%s': %s", d->eng.spool_dir,
                            strerror(-tar_fd));
    r = make_tar(tar_fd, path, fd, data, len, mode, err);
    if (r < 0)
        goto out;
    if (fstat(tar_fd, &stt) < 0 || lseek(tar_fd, 0, SEEK_SET) < 0) {
        r = lb_error_set(err, -EIO, "cannot rewind the spooled tar: %s", strerror(errno));
        goto out;
    }
    r = docker_put_archive(d, id, "/", tar_fd, (uint64_t)stt.st_size, &resp, err);
    if (r < 0 || resp.status == 200 || resp.status == 204)
        goto out;
    httpc_json_message(&resp, "message", m, sizeof(m));
    if (resp.status == 404)
        r = lb_error_set(err, -ENOENT, "no such sandbox");
    else if (strstr(m, "not a directory"))
        r = lb_error_set(err, -ENOTDIR, "a parent of '%s' is not a directory", path);
    else if (strstr(m, "is a directory") || strstr(m, "file exists") ||
             strstr(m, "removing item to be overwritten"))
        /* podman: a directory (or a mount point such as /tmp) cannot be replaced by a file */
        r = lb_error_set(err, -EISDIR, "'%s' is a directory", path);
    else if (strstr(m, "no such file or directory"))
        /* a parent that does not resolve inside the container (a dangling symlink) */
        r = lb_error_set(err, -ENOTDIR, "a parent of '%s' is not a directory", path);
    else if (resp.status == 403 || strstr(m, "read-only"))
        r = lb_error_set(err, -EROFS, "'%s' is on a read-only file system", path);
    else if (strstr(m, "no space"))
        r = lb_error_set(err, -EFBIG, "no space left for '%s' in the sandbox", path);
    else if (resp.status == 400)
        r = lb_error_set(err, -EINVAL, "cannot write '%s': %s", path, m);
    else
        r = lb_error_set(err, -EREMOTEIO, "docker engine: archive upload failed (HTTP %ld): %s",
                         resp.status, m);
out:
    close(tar_fd);
    httpc_response_release(&resp);
    return r;
}

/* The failures an archive request (HEAD or GET .../archive?path=) shares: r, what httpc_do
 * returned, as the engine's transport error; a 404 as "no file". 0 otherwise (other statuses
 * are the caller's), or a negative errno with err set. */
static int archive_answer_failed(int r, const struct lb_httpc_response *resp, const char *path,
                                 struct lb_error *err)
{
    if (r < 0)
        return docker_transport_error(r, err);
    if (resp->status == 404)
        return lb_error_set(err, -ENOENT, "no file '%s' in the sandbox", path);
    return 0;
}

int docker_path_stat(struct lb_docker *d, const char *id, const char *path, json_t **stat,
                     long *status, struct lb_error *err)
{
    struct lb_httpc_request req = {
        .method = "HEAD", .timeout_ms = 30000, .want_header = "X-Docker-Container-Path-Stat"};
    struct lb_httpc_response resp = {0};
    unsigned char *raw = NULL;
    size_t raw_len = 0;
    int r = archive_do(d, id, path, &req, true, &resp, err);

    *stat = NULL;
    *status = resp.status;
    if (r == 0 && resp.status == 200 && resp.header_value &&
        token_base64_decode(resp.header_value, strlen(resp.header_value), &raw, &raw_len) == 0)
        *stat = json_loadb((const char *)raw, raw_len, 0, NULL);
    free(raw);
    httpc_response_release(&resp);
    return r;
}

/* The path's stat from HEAD .../archive: the engine resolves symlinks inside the container
 * (linkTarget). */
static int stat_path(struct lb_docker *d, const char *id, const char *path, char *target,
                     size_t target_size, uint64_t *size, struct lb_error *err)
{
    json_t *j = NULL;
    const char *link;
    json_int_t mode;
    long status;
    int r = docker_path_stat(d, id, path, &j, &status, err);

    if (r == 0 && status == 404)
        r = lb_error_set(err, -ENOENT, "no file '%s' in the sandbox", path);
    if (r < 0)
        return r;
    if (!j)
        return lb_error_set(err, status == 400 ? -EINVAL : -EREMOTEIO,
                            "docker engine: cannot stat '%s' (HTTP %ld)", path, status);
    mode = json_integer_value(json_object_get(j, "mode"));
    if (json_is_true(json_object_get(j, "isDir")) || ((uint64_t)mode & GO_MODE_DIR)) {
        r = lb_error_set(err, -EISDIR, "'%s' is a directory", path);
        goto out;
    }
    link = json_string_value(json_object_get(j, "linkTarget"));
    snprintf(target, target_size, "%s", link && link[0] == '/' ? link : path);
    /* a symlink's stat may be the link's own (docker): its target's size is checked in the
     * tar instead. podman names a regular file itself as its linkTarget. */
    *size = json_integer_value(json_object_get(j, "size")) > 0 &&
                    (!link || !*link || strcmp(link, path) == 0)
                ? (uint64_t)json_integer_value(json_object_get(j, "size"))
                : 0;
out:
    json_decref(j);
    return r;
}

/* The tar of one file: its data, a header (pax: a few 512-byte blocks), padding and the end
 * blocks; what a spool may hold beyond the file's own bytes. */
#define TAR_OVERHEAD_BYTES (64 * 1024)

static int too_large(const struct lb_docker *d, const char *path, uint64_t size,
                     struct lb_error *err)
{
    if (size)
        return lb_error_set(err, -EFBIG,
                            "'%s' is %llu bytes, over the %llu-byte file limit "
                            "(limits.max_file_bytes): read it in parts with exec",
                            path, (unsigned long long)size, (unsigned long long)d->max_file_bytes);
    return lb_error_set(err, -EFBIG,
                        "'%s' is over the %llu-byte file limit (limits.max_file_bytes): read it "
                        "in parts with exec",
                        path, (unsigned long long)d->max_file_bytes);
}

int docker_archive_read(const struct lb_httpc_response *resp, int fd, const char *dir,
                        struct archive **a, struct lb_error *err)
{
    if (resp->status != 200)
        return lb_error_set(err, -EREMOTEIO, "docker engine: archive download failed (HTTP %ld)",
                            resp->status);
    if (lseek(fd, 0, SEEK_SET) < 0 || !(*a = archive_read_new()) ||
        archive_read_support_format_tar(*a) != ARCHIVE_OK ||
        archive_read_open_fd(*a, fd, 65536) != ARCHIVE_OK)
        return dir ? lb_error_set(err, -EREMOTEIO, "cannot read the engine's archive of '%s'", dir)
                   : lb_error_set(err, -EREMOTEIO, "cannot read the engine's tar stream");
    return 0;
}

int docker_get_archive(struct lb_docker *d, const char *id, const char *path, int fd, uint64_t max,
                       struct lb_httpc_response *resp, struct lb_error *err)
{
    struct engine_spool_sink sink = {.fd = fd, .max = max};
    struct lb_httpc_request req = {.method = "GET", .sink = engine_spool_write, .sink_arg = &sink};

    return archive_do(d, id, path, &req, false, resp, err);
}

int docker_file_open(struct lb_engine *eng, const struct lb_sandbox_ref *ref, const char *path,
                     int *fd_out, uint64_t *size_out, struct lb_error *err)
{
    struct lb_docker *d = (struct lb_docker *)eng;
    struct lb_httpc_response resp = {0};
    char target[4200];
    struct archive *a = NULL;
    struct archive_entry *e;
    int tar_fd = -1, out_fd = -1, r;
    struct stat st;
    uint64_t size = 0;

    r = stat_path(d, ref->id, path, target, sizeof(target), &size, err);
    if (r < 0)
        return r;
    if (size > d->max_file_bytes) /* refused before the engine sends a byte */
        return too_large(d, path, size, err);
    tar_fd = engine_spool_file(&d->eng);
    out_fd = engine_spool_file(&d->eng);
    if (tar_fd < 0 || out_fd < 0) {
        r = lb_error_set(err, -EIO, "cannot make spool files in '%s'", d->eng.spool_dir);
        goto out;
    }
    r = docker_get_archive(d, ref->id, target, tar_fd, d->max_file_bytes + TAR_OVERHEAD_BYTES,
                           &resp, err);
    if (r == -EFBIG) { /* it grew past the limit after the stat, or is a link to a large file */
        r = too_large(d, path, 0, err);
        goto out;
    }
    r = archive_answer_failed(r, &resp, path, err);
    if (r == 0)
        r = docker_archive_read(&resp, tar_fd, NULL, &a, err);
    if (r < 0)
        goto out;
    if (archive_read_next_header(a, &e) != ARCHIVE_OK) {
        r = lb_error_set(err, -EREMOTEIO, "the engine's tar stream is empty or damaged: %s",
                         archive_error_string(a));
        goto out;
    }
    if (archive_entry_filetype(e) == AE_IFDIR) {
        r = lb_error_set(err, -EISDIR, "'%s' is a directory", path);
        goto out;
    }
    if (archive_entry_filetype(e) != AE_IFREG) {
        r = lb_error_set(err, -EINVAL, "'%s' is not a regular file", path);
        goto out;
    }
    if (archive_entry_size(e) < 0 || (uint64_t)archive_entry_size(e) > d->max_file_bytes) {
        r = too_large(d, path, (uint64_t)archive_entry_size(e), err);
        goto out;
    }
    if (archive_read_data_into_fd(a, out_fd) != ARCHIVE_OK) {
        r = lb_error_set(err, -EREMOTEIO, "cannot extract '%s' from the engine's tar stream: %s",
                         path, archive_error_string(a));
        goto out;
    }
    if (fstat(out_fd, &st) < 0 || lseek(out_fd, 0, SEEK_SET) < 0) {
        r = lb_error_set(err, -EIO, "cannot rewind the downloaded file: %s", strerror(errno));
        goto out;
    }
    r = engine_spool_reopen(out_fd, fd_out, err);
    if (r < 0)
        goto out;
    *size_out = (uint64_t)st.st_size;
out:
    if (a)
        archive_read_free(a);
    if (tar_fd >= 0)
        close(tar_fd);
    if (out_fd >= 0)
        close(out_fd);
    httpc_response_release(&resp);
    return r;
}
