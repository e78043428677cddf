/*
 * engine_files.c - the engine base's file drivers (see engine.h): small writes and spooled
 * uploads, put into the instance by the backend's put_file hook; the spool a backend's
 * download goes through (sink, read-only reopen).
 */
#include "provider/engine/engine.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* An upload on its way: the bytes go to an unlinked file in the spool dir, then put_file. */
struct engine_upload {
    struct lb_upload base;
    struct lb_engine *e;
    char *id, *path;
    json_t *descriptor; /* a copy of the sandbox's, or NULL */
    int mode;
};

int engine_file_write(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                      const void *data, size_t len, int mode, struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;

    if (!provider_path_is_valid(path) || strcmp(path, "/") == 0)
        return lb_error_set(err, -EINVAL, "bad path '%s'", path);
    return e->hooks->put_file(e, ref, path, -1, data ? data : "", len, mode, err);
}

int engine_check_target(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *path,
                        struct lb_error *err)
{
    enum lb_sandbox_status st;
    int r;

    if (!provider_path_is_valid(path) || strcmp(path, "/") == 0)
        return lb_error_set(err, -EINVAL, "bad path '%s'", path);
    r = e->hooks->state(e, ref, &st, err);
    if (r < 0)
        return r;
    if (st == LB_STATUS_STOPPED)
        return lb_error_set(err, -ENOENT, "no such sandbox");
    return 0;
}

int engine_spool_file(struct lb_engine *e)
{
    int fd = open(e->spool_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);

    return fd < 0 ? -errno : fd;
}

int engine_spool_write(const void *data, size_t n, void *arg)
{
    struct engine_spool_sink *s = arg;
    const char *p = data;

    if (n > s->max - s->written)
        return -EFBIG;
    while (n > 0) {
        ssize_t w = write(s->fd, p, n);

        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return errno == ENOSPC || errno == EDQUOT ? -EFBIG : -errno;
        p += w;
        n -= (size_t)w;
        s->written += (uint64_t)w;
    }
    return 0;
}

int engine_spool_reopen(int fd, int *out, struct lb_error *err)
{
    char self[64];
    int ro;

    snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
    ro = open(self, O_RDONLY | O_CLOEXEC);
    if (ro < 0)
        return lb_error_set(err, -EIO, "cannot reopen the downloaded file: %s", strerror(errno));
    *out = ro;
    return 0;
}

int engine_upload_begin(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                        int mode, const char *owner, struct lb_upload **out, struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;
    struct engine_upload *u;
    int r;

    if (owner)
        return lb_error_set(err, -EOPNOTSUPP,
                            "the %s provider cannot give an uploaded file an owner (?owner=): "
                            "its files belong to the %s's root",
                            e->hooks->name, e->hooks->noun);
    r = engine_check_target(e, ref, path, err);
    if (r < 0)
        return r;
    u = calloc(1, sizeof(*u));
    if (!u)
        return lb_error_set(err, -ENOMEM, "out of memory");
    u->base.provider = p;
    u->base.fd = -1;
    u->e = e;
    u->mode = mode;
    u->id = strdup(ref->id);
    u->descriptor = ref->descriptor ? json_deep_copy(ref->descriptor) : NULL;
    u->path = strdup(path);
    if (!u->id || !u->path || (ref->descriptor && !u->descriptor)) {
        engine_upload_abort(&u->base);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    u->base.fd = engine_spool_file(e);
    if (u->base.fd < 0) {
        r = lb_error_set(err, u->base.fd, "cannot make a spool file in '%s': %s", e->spool_dir,
                         strerror(-u->base.fd));
        engine_upload_abort(&u->base);
        return r;
    }
    *out = &u->base;
    return 0;
}

void engine_upload_abort(struct lb_upload *base)
{
    struct engine_upload *u = (struct engine_upload *)base;

    if (!u)
        return;
    if (u->base.fd >= 0)
        close(u->base.fd);
    free(u->id);
    json_decref(u->descriptor);
    free(u->path);
    free(u);
}

int engine_upload_commit(struct lb_upload *base, struct lb_error *err)
{
    struct engine_upload *u = (struct engine_upload *)base;
    struct lb_sandbox_ref ref = {.id = u->id, .descriptor = u->descriptor};
    struct stat st;
    int r;

    if (fstat(u->base.fd, &st) < 0)
        r = lb_error_set(err, -EIO, "cannot stat the spooled upload: %s", strerror(errno));
    else
        r = u->e->hooks->put_file(u->e, &ref, u->path, u->base.fd, NULL, (uint64_t)st.st_size,
                                  u->mode, err);
    engine_upload_abort(base);
    return r;
}
