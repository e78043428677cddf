/*
 * images.c - the image store over HTTP (admin): GET /v1/images, DELETE /v1/images/NAME.
 * POST /v1/images (import of an uploaded archive) answers 501 until request bodies can be
 * streamed to disk: an image must never be held whole in memory. `lendboxd image import`
 * imports meanwhile.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "image/image.h"
#include "routes/routes.h"
#include "store/store.h"

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
            if (json_array_append_new(arr, json_pack("{s:s,s:s,s:I,s:I}", "name", all[i].name,
                                                     "digest", all[i].digest, "size_bytes",
                                                     (json_int_t)all[i].size_bytes, "created_at",
                                                     (json_int_t)all[i].created_at)) < 0)
                break;
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
        r = image_remove(app->images_dir, arg, &err);
    if (r == -ENOENT)
        r = lb_error_set(&err, -LB_E_IMAGE_NOT_FOUND, "no image '%s'", (const char *)arg);
    if (r < 0) {
        http_respond_error(req, &err);
        return;
    }
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

int route_image_import(struct lb_request *req, struct lb_error *err)
{
    (void)req;
    return lb_error_set(err, -ENOSYS,
                        "importing over HTTP is not built yet (uploads are not streamed to disk "
                        "yet); use `lendboxd image import SOURCE NAME` on the daemon's host");
}
