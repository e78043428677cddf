/*
 * engine_snapshot.c - snapshots on an engine (see engine.h, "snapshots"): the workdir's
 * archive and the engine's own image of the instance's root, recorded in the image store
 * entry's engine.json; seeds from such an entry; the sweep of engine images no entry names.
 */
#include "provider/engine/engine.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "image/image.h"
#include "util/fault.h"
#include "util/log.h"

#define ARCHIVE_NAME "workspace.tar"

/* dest/engine.json: what image_engine_snapshot reads back (no "archive" for a backend that
 * keeps the workdir in the instance's root). */
static int write_engine_json(const struct lb_engine *e, const char *dest, const char *image,
                             const char *workdir, struct lb_error *err)
{
    char p[4200];
    json_t *j =
        json_pack("{s:s,s:s,s:s,s:s?}", "provider", e->hooks->name, "image", image, "workdir",
                  workdir, "archive", e->hooks->workdir_archive ? ARCHIVE_NAME : NULL);
    int r = 0;

    snprintf(p, sizeof(p), "%s/" IMAGE_ENGINE_JSON, dest);
    if (!j)
        return lb_error_set(err, -ENOMEM, "out of memory");
    if (json_dump_file(j, p, JSON_COMPACT) < 0)
        r = lb_error_set(err, -EIO, "cannot write '%s'", p);
    json_decref(j);
    return r;
}

/* Freeze (true) or thaw the instance through the hook; 0 also when it is already so. */
static int set_frozen(struct lb_engine *e, const struct lb_sandbox_ref *ref, bool frozen,
                      struct lb_error *err)
{
    enum lb_sandbox_status st;
    int r = e->hooks->set_frozen(e, ref, frozen, err);

    if (r < 0 && r != -ETIMEDOUT && e->hooks->state(e, ref, &st, NULL) == 0 &&
        st == (frozen ? LB_STATUS_PAUSED : LB_STATUS_RUNNING)) {
        lb_error_clear(err);
        return 0;
    }
    return r;
}

int engine_snapshot(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *dest,
                    bool flatten, struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;
    const struct engine_hooks *h = e->hooks;
    char path[4200], workdir[256] = "", image[256] = "";
    enum lb_sandbox_status st;
    struct lb_error ferr = {0};
    bool frozen = false, paused;
    int fd = -1, r;

    (void)flatten; /* the engine stacks its own layers */
    if (!h->commit)
        return lb_error_set(err, -ENOSYS, "the %s provider cannot snapshot sandboxes", h->name);
    r = h->state(e, ref, &st, err);
    if (r < 0)
        return r;
    if (st == LB_STATUS_STOPPED || st == LB_STATUS_ERROR)
        return lb_error_set(err, -ENOENT, "no such sandbox");
    paused = st == LB_STATUS_PAUSED;
    if (paused && h->workdir_archive) /* the engine cannot read a frozen instance's workdir */
        return lb_error_set(err, -EBUSY,
                            "sandbox '%s' is paused; the %s provider snapshots running sandboxes "
                            "only",
                            ref->id, h->name);
    if (h->workdir_archive) {
        snprintf(path, sizeof(path), "%s/" ARCHIVE_NAME, dest);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0)
            return lb_error_set(err, -errno, "cannot make '%s': %s", path, strerror(errno));
        /* the workdir first: an engine reads a mount of a running instance only */
        r = h->workdir_archive(e, ref, fd, workdir, sizeof(workdir), err);
        if (r == 0 && fsync(fd) < 0)
            r = lb_error_set(err, -errno, "cannot write '%s': %s", path, strerror(errno));
        if (r < 0)
            goto out;
    }
    if (!paused) { /* a paused instance stays as it is: frozen already, and not thawed after */
        r = set_frozen(e, ref, true, err);
        if (r < 0)
            goto out;
        frozen = true;
    }
    /* tests: a crash (delay + kill -9) with the sandbox frozen, the capture under way */
    r = fault_hit("snapshot.frozen", 0, err);
    if (r == 0)
        r = h->commit(e, ref, image, sizeof(image), err);
    if (r == 0)
        r = write_engine_json(e, dest, image, workdir, err);
out:
    if (frozen && set_frozen(e, ref, false, &ferr) < 0) {
        log_warn_sbx(ref->id, "%s: cannot thaw the %s after its snapshot: %s", h->name, h->noun,
                     ferr.message);
        if (r == 0)
            r = lb_error_keep(err, -EREMOTEIO, "cannot thaw the %s after the snapshot: %s", h->noun,
                              ferr.message);
    }
    if (r < 0 && image[0] && h->image_remove(e, image, &ferr) < 0)
        log_warn("%s: cannot remove image %s of a failed snapshot: %s", h->name, image,
                 ferr.message);
    if (fd >= 0)
        close(fd);
    if (r < 0 && r != -ENOENT && r != -EBUSY && r != -ETIMEDOUT && r != -ENOMEM && r != -ENOSPC)
        r = lb_error_recode(err, -EREMOTEIO, "the %s's snapshot failed", h->noun);
    return r;
}

int engine_snapshot_sweep(struct lb_provider *p, struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;
    const struct engine_hooks *h = e->hooks;
    json_t *images = NULL, *v;
    size_t i;
    int r;

    if (!e->images_dir || !h->snapshot_images)
        return 0;
    r = h->snapshot_images(e, &images, err);
    if (r < 0)
        return r;
    json_array_foreach(images, i, v) {
        const char *image = json_string_value(v);
        struct lb_error rerr = {0};
        int rr;

        if (!image || image_engine_image_kept(e->images_dir, h->name, image))
            continue;
        rr = h->image_remove(e, image, &rerr);
        if (rr == 0)
            log_info("%s: removed image %s of a snapshot the image store no longer names", h->name,
                     image);
        else if (rr == -EBUSY || rr == -ENOENT)
            log_debug("%s: image %s of a removed snapshot stays for now: %s", h->name, image,
                      rerr.message);
        else if (r == 0)
            r = lb_error_keep(err, rr, "%s", rerr.message);
    }
    json_decref(images);
    return r;
}

/* The basename of an absolute path, into buf. */
static void base_of(const char *path, char *buf, size_t size)
{
    const char *s = strrchr(path, '/');

    snprintf(buf, size, "%s", s ? s + 1 : path);
}

int engine_snapshot_source(struct lb_engine *e, const struct lb_sandbox_spec *spec,
                           struct lb_image_engine *out, struct lb_error *err)
{
    char want[256], have[256];
    int r;

    memset(out, 0, sizeof(*out));
    if (!e->images_dir || !spec->image || !e->hooks->commit)
        return -ENOENT;
    r = image_engine_snapshot(e->images_dir, spec->image, e->hooks->name, out, err);
    if (r == -EMEDIUMTYPE) /* a snapshot of another provider: 422 */
        return lb_error_recode(err, -EOPNOTSUPP, "image '%s' is another provider's snapshot",
                               spec->image);
    if (r < 0)
        return r;
    if (!out->archive[0]) /* the workdir is in the engine image's root: any workdir seeds */
        return 0;
    base_of(spec->workdir ? spec->workdir : "/workspace", want, sizeof(want));
    base_of(out->workdir, have, sizeof(have));
    if (strcmp(want, have) != 0)
        return lb_error_set(err, -EOPNOTSUPP,
                            "snapshot '%s' holds the workdir %s: a seed from it on the %s provider "
                            "takes a workdir named '%s'",
                            spec->image, out->workdir, e->hooks->name, have);
    return 0;
}

int engine_snapshot_restore(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                            const struct lb_sandbox_spec *spec, const struct lb_image_engine *src,
                            struct lb_error *err)
{
    char parent[256];
    const char *dir;
    int fd, r;

    if (!src->archive[0])
        return 0;
    snprintf(parent, sizeof(parent), "%s", spec->workdir ? spec->workdir : "/workspace");
    dir = dirname(parent); /* parent, or a static "/" */
    fd = open(src->archive, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return lb_error_set(err, -errno, "cannot read '%s': %s", src->archive, strerror(errno));
    r = e->hooks->put_archive(e, ref, dir, fd, err);
    close(fd);
    return r;
}
