/*
 * lxd_files.c - the instance files API of the lxd provider, always octet-stream: put_file
 * (the engine base's uploads and the exec's stdin go through it), make_dirs, file_open with
 * symlinks followed inside the instance.
 */
#include "provider/lxd/lxd_internal.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/token.h"

#define FILE_TIMEOUT_MS (30 * 60 * 1000)
#define MAX_SYMLINKS 8

/* "/1.0/instances/<id>/files?path=<escaped path>" into buf. */
int lxd_files_url(const char *id, const char *path, char *buf, size_t size, struct lb_error *err)
{
    char *enc = curl_easy_escape(NULL, path, 0);
    int n;

    if (!enc)
        return lb_error_set(err, -ENOMEM, "out of memory");
    n = snprintf(buf, size, "/1.0/instances/%s/files?path=%s", id, enc);
    curl_free(enc);
    return n < (int)size ? 0 : lb_error_set(err, -EINVAL, "path '%.200s' is too long", path);
}

/* ---------- files ---------- */

int lxd_files_post(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *path,
                   const char *type, unsigned mode, bool overwrite, struct lb_httpc_request *req,
                   struct lb_httpc_response *resp, struct lb_error *err)
{
    char url[PATH_MAX + 128], type_hdr[32], mode_hdr[32];
    const char *headers[] = {
        type_hdr, mode_hdr, "X-LXD-uid: 0", "X-LXD-gid: 0", "X-LXD-write: overwrite", NULL};
    int r = lxd_files_url(ref->id, path, url, sizeof(url), err);

    if (r < 0)
        return r;
    snprintf(type_hdr, sizeof(type_hdr), "X-LXD-type: %s", type);
    /* a leading 0 always: LXD reads "4755" (setuid, no leading 0) as a decimal number */
    snprintf(mode_hdr, sizeof(mode_hdr), "X-LXD-mode: 0%o", mode & 07777);
    if (!overwrite)
        headers[4] = NULL;
    req->method = "POST";
    /* octet-stream always: with a form type LXD 5.0.2 answers 200 and writes nothing */
    req->content_type = "application/octet-stream";
    req->headers = headers;
    req->path = url;
    req->max_body_bytes = 65536;
    return lxd_do(l, lxd_member_of(ref), req, resp, err);
}

/* POST one directory (mode 0755, root's); an existing directory is fine. *no_parent (when
 * given) says whether LXD answered 404 about a missing parent rather than the instance. */
static int make_dir(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *dir,
                    bool *no_parent, struct lb_error *err)
{
    struct lb_httpc_request req = {.body = "", .body_len = 0, .timeout_ms = l->call_timeout_ms};
    struct lb_httpc_response resp = {0};
    char m[300];
    int r = lxd_files_post(l, ref, dir, "directory", 0755, false, &req, &resp, err);

    if (no_parent)
        *no_parent = false;
    if (r == 0 && resp.status != 200) {
        httpc_json_message(&resp, "error", m, sizeof(m));
        if (resp.status == 404 && strstr(m, "nstance")) {
            r = lb_error_set(err, -ENOENT, "no such sandbox");
        } else if (resp.status >= 500 && !strstr(m, "exists") && !strstr(m, "not a directory")) {
            r = lb_error_set(err, -EREMOTEIO, "LXD: cannot make directory '%s': %s", dir, m);
        } else {
            if (no_parent && resp.status == 404)
                *no_parent = true;
            r = lb_error_set(err, -ENOTDIR, "'%s' is not a directory", dir);
        }
    }
    httpc_response_release(&resp);
    return r;
}

int lxd_make_dirs(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *path,
                  struct lb_error *err)
{
    char buf[PATH_MAX];
    int r = 0;

    if (strlen(path) >= sizeof(buf) || path[0] != '/')
        return lb_error_set(err, -EINVAL, "bad directory '%s'", path);
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; r == 0 && *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        r = make_dir(l, ref, buf, NULL, err);
        *p = '/';
    }
    if (r == 0 && strcmp(buf, "/") != 0)
        r = make_dir(l, ref, buf, NULL, err);
    return r;
}

int lxd_make_dir_likely(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *path,
                        struct lb_error *err)
{
    bool no_parent = false;
    int r;

    if (path[0] != '/' || strcmp(path, "/") == 0 || strlen(path) >= PATH_MAX)
        return lxd_make_dirs(l, ref, path, err);
    r = make_dir(l, ref, path, &no_parent, err);
    if (r == 0 || !no_parent)
        return r;
    lb_error_clear(err);
    return lxd_make_dirs(l, ref, path, err);
}

/* One file POST; *status gets the HTTP status, m LXD's message. */
static int post_file(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *path, int fd,
                     const void *data, uint64_t len, int mode, long *status, char *m, size_t m_size,
                     struct lb_error *err)
{
    struct lb_httpc_request req = {.timeout_ms = FILE_TIMEOUT_MS};
    struct lb_httpc_response resp = {0};
    int r;

    if (fd >= 0) {
        if (lseek(fd, 0, SEEK_SET) < 0)
            return lb_error_set(err, -EIO, "cannot rewind the spooled upload: %s", strerror(errno));
        req.body_fd = fd;
        req.body_fd_len = len;
        if (len == 0) { /* curl sends no body for an empty fd upload: send "" */
            req.body_fd = 0;
            req.body = "";
        }
    } else {
        req.body = data ? data : "";
        req.body_len = (size_t)len;
    }
    r = lxd_files_post(l, ref, path, "file", (unsigned)(mode < 0 ? 0644 : mode), true, &req, &resp,
                       err);
    *status = resp.status;
    httpc_json_message(&resp, "error", m, m_size);
    httpc_response_release(&resp);
    return r;
}

int lxd_put_file(struct lb_lxd *l, const struct lb_sandbox_ref *ref, const char *path, int fd,
                 const void *data, uint64_t len, int mode, struct lb_error *err)
{
    char m[300], parent[PATH_MAX];
    enum lb_sandbox_status st;
    long status = 0;
    int r;

    r = post_file(l, ref, path, fd, data, len, mode, &status, m, sizeof(m), err);
    if (r == 0 && status == 404) {
        /* a missing parent (or no such instance): make the parents, then once more */
        snprintf(parent, sizeof(parent), "%s", path);
        *strrchr(parent, '/') = '\0';
        if (parent[0]) {
            r = lxd_make_dirs(l, ref, parent, err);
            if (r < 0)
                return r;
        }
        r = post_file(l, ref, path, fd, data, len, mode, &status, m, sizeof(m), err);
    }
    if (r < 0)
        return r;
    if (status == 200)
        return 0;
    if (status == 404) {
        if (lxd_state(l, ref, &st, NULL) == 0 && st == LB_STATUS_STOPPED)
            return lb_error_set(err, -ENOENT, "no such sandbox");
        return lb_error_set(err, -ENOTDIR, "a parent of '%s' is not a directory", path);
    }
    if (strstr(m, "is a directory") || strstr(m, "Is a directory"))
        return lb_error_set(err, -EISDIR, "'%s' is a directory", path);
    if (strstr(m, "not a directory"))
        return lb_error_set(err, -ENOTDIR, "a parent of '%s' is not a directory", path);
    if (strstr(m, "read-only"))
        return lb_error_set(err, -EROFS, "'%s' is on a read-only file system", path);
    if (strstr(m, "no space") || strstr(m, "quota"))
        return lb_error_set(err, -EFBIG, "no space left for '%s' in the sandbox", path);
    if (strstr(m, "frozen"))
        return lb_error_set(err, -EBUSY, "sandbox '%s' is paused", ref->id);
    return lb_error_set(err, -EREMOTEIO, "LXD: writing '%s' failed (HTTP %ld): %s", path, status,
                        m);
}

int lxd_file_open(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *path,
                  int *fd_out, uint64_t *size_out, struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)e;
    char cur[PATH_MAX], url[PATH_MAX + 128], m[300];
    struct lb_httpc_response resp = {0};
    struct engine_spool_sink sink = {.fd = -1, .max = LXD_MAX_DOWNLOAD_BYTES};
    int r;

    snprintf(cur, sizeof(cur), "%s", path);
    for (int hop = 0;; hop++) {
        struct lb_httpc_request req = {.method = "GET",
                                       .timeout_ms = FILE_TIMEOUT_MS,
                                       .max_body_bytes = 65536,
                                       .sink = engine_spool_write,
                                       .sink_arg = &sink,
                                       .want_header = "X-LXD-type"};
        const char *type;

        if (sink.fd >= 0)
            close(sink.fd);
        sink.fd = engine_spool_file(&l->eng);
        sink.written = 0;
        if (sink.fd < 0) {
            r = lb_error_set(err, -EIO, "cannot make a spool file in '%s': %s", l->eng.spool_dir,
                             strerror(-sink.fd));
            goto out;
        }
        r = lxd_files_url(ref->id, cur, url, sizeof(url), err);
        if (r < 0)
            goto out;
        req.path = url;
        httpc_response_release(&resp);
        r = lxd_do(l, lxd_member_of(ref), &req, &resp, err);
        if (r == -EFBIG) {
            r = lb_error_set(err, -EFBIG, "'%s' is over the %llu-byte download limit", path,
                             (unsigned long long)LXD_MAX_DOWNLOAD_BYTES);
            goto out;
        }
        if (r < 0)
            goto out;
        type = resp.header_value ? resp.header_value : "";
        if (resp.status == 404) {
            r = lb_error_set(err, -ENOENT, "no such file '%s'", path);
            goto out;
        }
        if (resp.status != 200) {
            char buf[512] = "";
            ssize_t n = pread(sink.fd, buf, sizeof(buf) - 1, 0);
            json_t *j = n > 0 ? json_loadb(buf, (size_t)n, 0, NULL) : NULL;

            snprintf(m, sizeof(m), "%s",
                     json_string_value(json_object_get(j, "error")) ?: "(no message)");
            json_decref(j);
            r = lb_error_set(err, resp.status >= 500 ? -EREMOTEIO : -EACCES,
                             "LXD: reading '%s' failed (HTTP %ld): %s", path, resp.status, m);
            if (strstr(m, "frozen"))
                r = lb_error_set(err, -EBUSY, "sandbox '%s' is paused", ref->id);
            goto out;
        }
        if (strcmp(type, "directory") == 0) {
            r = lb_error_set(err, -EISDIR, "'%s' is a directory", path);
            goto out;
        }
        if (strcmp(type, "symlink") != 0)
            break;
        /* a symlink: its body is the target, resolved inside the instance by LXD */
        if (hop >= MAX_SYMLINKS || sink.written == 0 || sink.written >= sizeof(cur) / 2) {
            r = lb_error_set(err, -ELOOP, "too many symlinks at '%s'", path);
            goto out;
        }
        {
            char target[PATH_MAX / 2 + 1];
            ssize_t n = pread(sink.fd, target, (size_t)sink.written, 0);
            char *slash;

            if (n != (ssize_t)sink.written) {
                r = lb_error_set(err, -EIO, "cannot read back a symlink target");
                goto out;
            }
            target[n] = '\0';
            target[strcspn(target, "\n")] = '\0';
            if (target[0] == '/') {
                snprintf(cur, sizeof(cur), "%s", target);
            } else {
                slash = strrchr(cur, '/');
                slash[1] = '\0';
                if (strlen(cur) + strlen(target) >= sizeof(cur)) {
                    r = lb_error_set(err, -EINVAL, "symlink target too long");
                    goto out;
                }
                strncat(cur, target, sizeof(cur) - strlen(cur) - 1);
            }
        }
    }
    r = engine_spool_reopen(sink.fd, fd_out, err);
    if (r < 0)
        goto out;
    *size_out = sink.written;
out:
    if (sink.fd >= 0)
        close(sink.fd);
    httpc_response_release(&resp);
    return r;
}
