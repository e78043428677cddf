/*
 * image_snapshot.c - snapshots in the image store (see image.h, "snapshots"): a capture is
 * prepared under .store/tmp, published by a rename into .store/sha256 and then named, so it is
 * either complete or invisible; seeds of a snapshot stack its layers (image_layers).
 */
#include "image/image.h"
#include "image/image_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/fault.h"
#include "util/log.h"

int image_snapshot_prepare(const char *images_dir, char *work_out, size_t size,
                           struct lb_error *err)
{
    char p[IMAGE_PATH_MAX + 32];
    int r = image_store_init(images_dir, err);

    if (r < 0)
        return r;
    if (snprintf(work_out, size, "%s/" STORE "/tmp/snap-XXXXXX", images_dir) >= (int)size)
        return lb_error_set(err, -ENAMETOOLONG, "images dir path is too long");
    if (!mkdtemp(work_out))
        return lb_error_set(err, -errno, "cannot make '%s': %s", work_out, strerror(errno));
    snprintf(p, sizeof(p), "%s/rootfs", work_out);
    r = image_mkdir_mode(p, 0755);
    snprintf(p, sizeof(p), "%s/workspace", work_out);
    if (r == 0)
        r = image_mkdir_mode(p, 0755);
    if (r < 0) {
        image_snapshot_discard(work_out);
        return lb_error_set(err, r, "cannot make the snapshot's work dir: %s", strerror(-r));
    }
    return 0;
}

void image_snapshot_discard(const char *work)
{
    if (work && *work && image_remove_tree(work) < 0)
        log_warn("image store: cannot remove '%s': %s", work, strerror(errno));
}

/* The base's image.json (NULL for "host") and its hex into base_hex. */
static int load_base(const char *images_dir, const char *base, char base_hex[65], json_t **out,
                     struct lb_error *err)
{
    char p[IMAGE_PATH_MAX + 128];
    int r;

    *out = NULL;
    base_hex[0] = '\0';
    if (strcmp(base, "host") == 0)
        return 0;
    r = image_find_hex(images_dir, base, base_hex, err);
    if (r < 0)
        return r;
    snprintf(p, sizeof(p), "%s/" STORE "/sha256/%s/image.json", images_dir, base_hex);
    *out = json_load_file(p, 0, NULL);
    if (!*out)
        return lb_error_set(err, -ENOENT, "image '%s' has no readable image.json", base);
    return 0;
}

int image_snapshot_publish(const char *images_dir, const char *work, const char *name,
                           const char *base, const char *source_id, bool flattened, bool hidden,
                           json_t *labels, struct lb_image_info *out, struct lb_error *err)
{
    /* base_hex stays "" when no base is loaded (an engine's own image) */
    char hex[65], base_hex[65] = "", p[IMAGE_PATH_MAX + 128], stored[IMAGE_PATH_MAX + 128];
    unsigned char rnd[32];
    json_t *bj = NULL, *info = NULL, *engine = NULL;
    const char *root = NULL;
    struct stat st;
    int r, lock = -1, depth = 0;
    bool host_based;

    if (!image_name_is_valid(name)) {
        r = lb_error_set(err, -EINVAL,
                         "invalid snapshot name '%s' (want [A-Za-z0-9][A-Za-z0-9._-]*, at most "
                         "%d bytes, not 'host')",
                         name ? name : "", LB_IMAGE_NAME_MAX);
        goto out;
    }
    snprintf(p, sizeof(p), "%s/" IMAGE_ENGINE_JSON, work);
    engine = json_load_file(p, 0, NULL);
    /* an engine snapshot's base may be the engine's own image, not one of the store */
    r = engine && !image_name_is_valid(base) ? 0 : load_base(images_dir, base, base_hex, &bj, err);
    if (r == -ENOENT && engine && image_find_hex(images_dir, base, base_hex, NULL) < 0) {
        lb_error_clear(err);
        r = 0;
    }
    if (r < 0)
        goto out;
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
        r = lb_error_set(err, -EIO, "cannot draw the snapshot's id: %s", strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < sizeof(rnd); i++)
        snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
    /* a snapshot of a host sandbox (or of one seeded from such a snapshot) has no tree: its
     * workspace is all of it */
    host_based = !bj || (json_is_string(json_object_get(bj, "kind")) &&
                         strcmp(json_string_value(json_object_get(bj, "kind")), "snapshot") == 0 &&
                         !json_is_string(json_object_get(bj, "root")));
    if (!host_based && !flattened) {
        root = json_string_value(json_object_get(bj, "root"));
        root = root ? root : base_hex;
        depth = (int)json_integer_value(json_object_get(bj, "depth")) + 1;
    }
    info = json_pack("{s:s,s:s,s:s,s:s?,s:s?,s:s?,s:i,s:s,s:O?,s:O?,s:O?,s:O?,s:O?,s:I,s:I}",
                     "digest", "", "kind", "snapshot", "base", base, "base_digest",
                     base_hex[0] ? base_hex : NULL, "lower", bj && !flattened ? base_hex : NULL,
                     "root",
                     host_based  ? NULL
                     : flattened ? hex
                                 : root,
                     "depth", depth, "source_sandbox_id", source_id, "architecture",
                     json_object_get(bj, "architecture"), "os", json_object_get(bj, "os"), "env",
                     json_object_get(bj, "env"), "working_dir", json_object_get(bj, "working_dir"),
                     "user", json_object_get(bj, "user"), "size_bytes",
                     (json_int_t)image_tree_size(work), "created_at", (json_int_t)time(NULL));
    if (!info) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    snprintf(p, sizeof(p), "sha256:%s", hex);
    json_object_set_new(info, "digest", json_string(p));
    if (hidden)
        json_object_set_new(info, "hidden", json_true());
    if (json_object_size(labels) > 0 && json_object_set(info, "labels", labels) < 0) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    if (engine) /* the local provider refuses it (image_layers) */
        json_object_set(info, "engine", json_object_get(engine, "provider"));
    snprintf(p, sizeof(p), "%s/image.json", work);
    if (json_dump_file(info, p, JSON_COMPACT) < 0) {
        r = lb_error_set(err, -EIO, "cannot write '%s'", p);
        goto out;
    }
    lock = image_store_lock(images_dir);
    if (lock < 0) {
        r = lb_error_set(err, lock, "cannot lock the image store: %s", strerror(-lock));
        goto out;
    }
    snprintf(p, sizeof(p), "%s/%s", images_dir, name);
    if (lstat(p, &st) == 0) {
        r = lb_error_set(err, -EEXIST, "an image named '%s' exists", name);
        goto out;
    }
    if (base_hex[0] && image_name_hex(images_dir, base, p) == 0 && strcmp(p, base_hex) != 0) {
        r = lb_error_set(err, -ENOENT, "image '%s' changed during the snapshot", base);
        goto out;
    }
    snprintf(stored, sizeof(stored), "%s/" STORE "/sha256/%s", images_dir, hex);
    if (rename(work, stored) < 0) {
        r = lb_error_set(err, -errno, "cannot store the snapshot: %s", strerror(errno));
        goto out;
    }
    /* tests: a crash (delay + kill -9) with the tree stored and not yet named */
    r = fault_hit("snapshot.publish", 0, err);
    if (r == 0)
        r = image_link_name(images_dir, name, hex, err);
    if (r == 0 && out)
        r = image_read_info(images_dir, name, hex, out, err);
    if (r < 0) {
        snprintf(p, sizeof(p), "%s/%s", images_dir, name);
        (void)unlink(p);
        (void)image_remove_tree(stored);
        goto out;
    }
    log_info("image store: %s %s -> sha256:%s (base %s%s)", hidden ? "fork snapshot" : "snapshot",
             name, hex, base, flattened ? ", flattened" : "");
out:
    if (lock >= 0)
        close(lock);
    json_decref(info);
    json_decref(bj);
    json_decref(engine);
    if (r < 0)
        image_snapshot_discard(work);
    return r;
}

int image_labels(const char *images_dir, const char *name, json_t **out, struct lb_error *err)
{
    char hex[65], p[IMAGE_PATH_MAX + 128];
    json_t *j, *labels;
    int r;

    *out = NULL;
    r = image_find_hex(images_dir, name, hex, err);
    if (r < 0)
        return r;
    snprintf(p, sizeof(p), "%s/" STORE "/sha256/%s/image.json", images_dir, hex);
    j = json_load_file(p, 0, NULL);
    if (!j)
        return lb_error_set(err, -ENOENT, "image '%s': cannot read '%s'", name, p);
    labels = json_object_get(j, "labels");
    *out = json_is_object(labels) ? json_incref(labels) : json_object();
    json_decref(j);
    return *out ? 0 : lb_error_set(err, -ENOMEM, "out of memory");
}

int image_layers(const char *images_dir, const char *name, struct lb_image_layers *out,
                 struct lb_error *err)
{
    char hex[65], next[65], p[IMAGE_PATH_MAX + 128];
    json_t *j;
    int r;

    memset(out, 0, sizeof(*out));
    r = image_find_hex(images_dir, name, hex, NULL);
    if (r < 0) { /* a plain directory placed by hand: its one tree */
        snprintf(out->paths[0], sizeof(out->paths[0]), "%s/%s", images_dir, name);
        out->n = 1;
        return 0;
    }
    for (;;) {
        bool snap;
        const char *lower;

        snprintf(p, sizeof(p), "%s/" STORE "/sha256/%s/image.json", images_dir, hex);
        j = json_load_file(p, 0, NULL);
        if (!j)
            return lb_error_set(err, -ENOENT, "image '%s': cannot read '%s'", name, p);
        if (json_is_string(json_object_get(j, "engine"))) {
            r = lb_error_set(err, -ENOENT, "image '%s' is a snapshot of the %s provider", name,
                             json_string_value(json_object_get(j, "engine")));
            json_decref(j);
            return r;
        }
        snap = json_is_string(json_object_get(j, "kind")) &&
               strcmp(json_string_value(json_object_get(j, "kind")), "snapshot") == 0;
        lower = json_string_value(json_object_get(j, "lower"));
        if (snap && out->n == 0)
            snprintf(out->workspace, sizeof(out->workspace), "%s/" STORE "/sha256/%s/workspace",
                     images_dir, hex);
        if (snap && !json_is_string(json_object_get(j, "root"))) {
            out->host = true; /* only a workspace */
            json_decref(j);
            return 0;
        }
        if (out->n > LB_IMAGE_DEPTH_MAX) {
            json_decref(j);
            return lb_error_set(err, -ENOENT, "image '%s' stacks too many layers", name);
        }
        snprintf(out->paths[out->n++], sizeof(out->paths[0]), "%s/" STORE "/sha256/%s/rootfs",
                 images_dir, hex);
        r = snap && lower && strlen(lower) == 64 ? 1 : 0;
        if (r)
            memcpy(next, lower, 65);
        json_decref(j);
        if (!r)
            return 0;
        memcpy(hex, next, 65);
    }
}

int image_count_dependents(const char *images_dir, const char *name, int64_t *out,
                           struct lb_error *err)
{
    char hex[65], other[65], lower[65];
    struct dirent *de;
    DIR *d;
    int r;

    *out = 0;
    r = image_find_hex(images_dir, name, hex, err);
    if (r < 0)
        return r;
    d = opendir(images_dir);
    if (!d)
        return lb_error_set(err, -errno, "cannot read '%s': %s", images_dir, strerror(errno));
    while ((de = readdir(d)))
        if (image_name_is_valid(de->d_name) && image_name_hex(images_dir, de->d_name, other) == 0 &&
            image_entry_lower(images_dir, other, lower) == 0 && strcmp(lower, hex) == 0)
            (*out)++;
    closedir(d);
    return 0;
}
