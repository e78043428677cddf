/*
 * images.c - the image store over HTTP (admin): GET /v1/images, DELETE /v1/images/NAME and
 * POST /v1/images?name=NAME, whose body (a docker-save or OCI archive) streams into a
 * temporary file in the store (.store/tmp, removed at the daemon's start if a crash left it)
 * and is imported on a pool worker; POST /v1/sandboxes/{id}/snapshot, which makes an image of a
 * running sandbox (lend_snapshot). Imports, removals and snapshots run one at a time (serial key
 * "images"); imports and removals end with a garbage collection of the digests nothing uses any
 * more.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "image/image.h"
#include "lend/lend.h"
#include "routes/routes.h"
#include "store/store.h"
#include "util/clock.h"
#include "util/log.h"

/* An entry of GET /v1/images; a snapshot's carries its labels (read from the store). */
static json_t *image_json(const char *images_dir, const struct lb_image_info *info)
{
    char created[32];
    json_t *labels = NULL;

    clock_format_rfc3339(info->created_at, created, sizeof(created));
    if (info->snapshot && image_labels(images_dir, info->name, &labels, NULL) < 0)
        labels = json_object(); /* removed meanwhile: listed as it was read */
    return json_pack("{s:s,s:s,s:I,s:s,s:s,s:s?,s:o*}", "name", info->name, "digest", info->digest,
                     "size_bytes", (json_int_t)info->size_bytes, "created_at", created, "kind",
                     info->snapshot ? "snapshot" : "image", "base",
                     info->snapshot ? info->base : NULL, "labels", labels);
}

/* image_gc's question: does a live sandbox record hold this digest? (errors: yes) */
static bool digest_in_use(void *ctx, const char *digest)
{
    int64_t n = 0;

    return store_count_using_image_digest(ctx, digest, &n, NULL) < 0 || n > 0;
}

/* Remove the stored trees nothing uses any more (a name re-imported, a removal). */
static void images_gc(struct lb_app *app)
{
    struct lb_error err = {0};

    if (image_gc(app->images_dir, digest_in_use, app->store, &err) < 0)
        log_warn("image store: garbage collection: %s", err.message);
}

static void images_list_run(struct lb_request *req, void *arg)
{
    struct lb_app *app = http_app(req);
    struct lb_image_info *all = NULL;
    struct lb_error err = {0};
    json_t *arr = NULL, *out = NULL;
    size_t n = 0, i;
    int r;

    (void)arg;
    r = image_list(app->images_dir, &all, &n, &err);
    if (r == 0) {
        arr = json_array();
        for (i = 0; arr && i < n; i++)
            if (!all[i].hidden &&
                json_array_append_new(arr, image_json(app->images_dir, &all[i])) < 0)
                break; /* a fork's implicit snapshot is not a user's image: not listed */
        out = arr && i == n ? json_pack("{s:o}", "images", arr) : NULL;
        if (!out) {
            json_decref(arr);
            r = lb_error_set(&err, -ENOMEM, "out of memory");
        }
    }
    free(all);
    routes_respond(req, r, 200, out, &err);
}

int route_images_list(struct lb_request *req, struct lb_error *err)
{
    return http_defer(req, images_list_run, NULL, NULL, err);
}

static void image_delete_run(struct lb_request *req, void *arg)
{
    struct lb_app *app = http_app(req);
    struct lb_image_info info;
    struct lb_error err = {0};
    int64_t users = 0;
    int r;

    r = image_get(app->images_dir, arg, &info, &err);
    if (r == -ENOENT)
        r = lb_error_set(&err, -LB_E_IMAGE_NOT_FOUND, "no image '%s'", (const char *)arg);
    if (r == 0)
        r = store_count_using_image(app->store, arg, &users, &err);
    if (r == 0 && users > 0)
        r = lb_error_set(&err, -EBUSY, "image '%s' is in use by %lld sandbox(es)",
                         (const char *)arg, (long long)users);
    if (r == 0)
        r = image_count_dependents(app->images_dir, arg, &users, &err);
    if (r == 0 && users > 0)
        r = lb_error_set(&err, -EBUSY, "image '%s' is the base of %lld snapshot(s)",
                         (const char *)arg, (long long)users);
    if (r == 0)
        r = image_remove(app->images_dir, arg, &err);
    if (r == -ENOENT)
        r = lb_error_set(&err, -LB_E_IMAGE_NOT_FOUND, "no image '%s'", (const char *)arg);
    if (r < 0) {
        http_respond_error(req, &err);
        return;
    }
    images_gc(app);
    lend_sweep_snapshots(app->lend); /* an engine's image of a removed snapshot */
    http_respond_empty(req, 204);
}

int route_image_delete(struct lb_request *req, struct lb_error *err)
{
    const char *name = http_param(req, 0);
    char *copy;

    if (!image_name_is_valid(name))
        return lb_error_set(err, -LB_E_IMAGE_NOT_FOUND, "no image '%s'", name ? name : "");
    copy = strdup(name);
    if (!copy)
        return lb_error_set(err, -ENOMEM, "out of memory");
    http_set_serial_key(req, "images"); /* one removal at a time */
    return http_defer(req, image_delete_run, copy, free, err);
}

/* POST: the opening job makes the temporary file and hands it to the body sink; the finish
 * job imports it. Either way the temporary file is gone when the request ends. */
struct import_job {
    char name[LB_IMAGE_NAME_MAX + 1];
    char path[4096];
    int fd;
    bool sinking; /* handed to the body sink, which frees it (finish or abort) */
};

static void import_job_free(struct import_job *j)
{
    if (j->fd >= 0)
        close(j->fd);
    if (j->path[0])
        (void)unlink(j->path);
    free(j);
}

static void import_finish(struct lb_request *req, void *arg)
{
    struct import_job *j = arg;
    struct lb_app *app = http_app(req);
    struct lb_image_info info;
    struct lb_error err = {0};
    bool existed = false;
    json_t *out;
    int r;

    close(j->fd);
    j->fd = -1;
    r = image_import(app->images_dir, j->path, j->name, &info, &existed, &err);
    if (r == -EPROTO || r == -ENOENT) {
        struct lb_error why = err;

        lb_error_clear(&err);
        r = lb_error_set(&err, -EINVAL,
                         "the body is not an image archive lendbox can import (a docker-save or "
                         "OCI archive): %s",
                         why.message);
    }
    import_job_free(j);
    if (r < 0) {
        http_respond_error(req, &err);
        return;
    }
    images_gc(app);
    out = image_json(app->images_dir, &info);
    if (out)
        json_object_set_new(out, "already_stored", json_boolean(existed));
    if (!out) {
        lb_error_set(&err, -ENOMEM, "out of memory");
        http_respond_error(req, &err);
        return;
    }
    http_respond_json(req, 201, out);
}

/* http_defer's free_arg: j unless the sink has it */
static void import_job_release(void *arg)
{
    struct import_job *j = arg;

    if (!j->sinking)
        import_job_free(j);
}

static void import_abort(void *arg)
{
    import_job_free(arg); /* close and unlink: no blocking */
}

static void import_open(struct lb_request *req, void *arg)
{
    struct import_job *j = arg;
    struct lb_app *app = http_app(req);
    struct lb_error err = {0};
    int r = image_store_init(app->images_dir, &err);

    if (r == 0 && snprintf(j->path, sizeof(j->path), "%s/.store/tmp/upload-XXXXXX",
                           app->images_dir) >= (int)sizeof(j->path))
        r = lb_error_set(&err, -ENAMETOOLONG, "images dir path is too long");
    if (r == 0) {
        j->fd = mkostemp(j->path, O_CLOEXEC);
        if (j->fd < 0) {
            j->path[0] = '\0';
            r = lb_error_set(&err, -EIO, "cannot make the upload's file in the image store: %s",
                             strerror(errno));
        }
    }
    if (r < 0) {
        http_respond_error(req, &err); /* j freed by import_job_release */
        return;
    }
    j->sinking = true;
    http_body_sink(req, &(struct lb_body_sink){
                            .fd = j->fd, .finish = import_finish, .abort = import_abort, .arg = j});
}

int route_image_import(struct lb_request *req, struct lb_error *err)
{
    const char *name = http_query(req, "name");
    struct import_job *j;

    if (!image_name_is_valid(name))
        return routes_bad_image_name("query 'name'", err);
    j = calloc(1, sizeof(*j));
    if (!j)
        return lb_error_set(err, -ENOMEM, "out of memory");
    j->fd = -1;
    snprintf(j->name, sizeof(j->name), "%s", name);
    http_set_serial_key(req, "images"); /* imports and removals one at a time */
    return http_defer(req, import_open, j, import_job_release, err);
}

/* ---------- POST /v1/sandboxes/{id}/snapshot ---------- */

struct snapshot_job {
    char id[LB_ID_MAX];
    char name[LB_IMAGE_NAME_MAX + 1];
    json_t *labels; /* NULL: none */
};

static void snapshot_job_free(void *arg)
{
    struct snapshot_job *j = arg;

    json_decref(j->labels);
    free(j);
}

static int snapshot_call(struct lb_app *app, void *arg, json_t **out, struct lb_error *err)
{
    struct snapshot_job *j = arg;

    return lend_snapshot(app->lend, j->id, j->name, j->labels, out, err);
}

int route_snapshot(struct lb_request *req, struct lb_error *err)
{
    const char *id = http_param(req, 0), *name;
    json_t *body = NULL, *labels = NULL;
    struct snapshot_job *j = NULL;
    int r;

    r = http_body_json(req, false, &body, err);
    if (r < 0)
        return r;
    name = json_string_value(json_object_get(body, "name"));
    if (!json_is_object(body) || !name || !image_name_is_valid(name))
        r = routes_bad_image_name("'name'", err);
    else if ((r = routes_string_map(body, "labels", &labels, err)) == 0 && labels)
        r = routes_check_labels(labels, err);
    else if (routes_check_sandbox_id(id, err) < 0)
        r = -ENOENT;
    if (r == 0 && !(j = calloc(1, sizeof(*j))))
        r = lb_error_set(err, -ENOMEM, "out of memory");
    if (r < 0) {
        json_decref(body);
        return r;
    }
    snprintf(j->id, sizeof(j->id), "%s", id);
    snprintf(j->name, sizeof(j->name), "%s", name);
    j->labels = json_is_object(labels) ? json_incref(labels) : NULL;
    json_decref(body);
    http_set_serial_key(req, "images"); /* with imports and removals: one at a time */
    return routes_defer_job(req, snapshot_call, 201, j, snapshot_job_free, err);
}
