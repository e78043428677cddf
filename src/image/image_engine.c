/*
 * image_engine.c - snapshots an engine provider (docker) made: the store entry holds the
 * provider's engine.json (which engine image is the snapshot's root, the workdir's archive)
 * beside its image.json; see image.h, "engine snapshots".
 */
#include "image/image.h"
#include "image/image_internal.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* The engine.json of stored tree hex (NULL when it has none). */
static json_t *load_engine_json(const char *images_dir, const char *hex)
{
    char p[IMAGE_PATH_MAX + 128];

    snprintf(p, sizeof(p), "%s/" STORE "/sha256/%s/" IMAGE_ENGINE_JSON, images_dir, hex);
    return json_load_file(p, 0, NULL);
}

int image_engine_snapshot(const char *images_dir, const char *name, const char *provider,
                          struct lb_image_engine *out, struct lb_error *err)
{
    char hex[65];
    const char *prov, *image, *workdir, *archive;
    json_t *j;
    int r = 0;

    memset(out, 0, sizeof(*out));
    if (!images_dir || !image_name_is_valid(name) || image_name_hex(images_dir, name, hex) < 0)
        return -ENOENT; /* the engine's own image name */
    j = load_engine_json(images_dir, hex);
    if (!j) {
        struct lb_image_info info;

        if (image_read_info(images_dir, name, hex, &info, NULL) == 0 && info.snapshot)
            return lb_error_set(err, -EMEDIUMTYPE,
                                "image '%s' is a snapshot of the local provider; the %s provider "
                                "cannot run it",
                                name, provider);
        return -ENOENT;
    }
    prov = json_string_value(json_object_get(j, "provider"));
    image = json_string_value(json_object_get(j, "image"));
    workdir = json_string_value(json_object_get(j, "workdir"));
    archive = json_string_value(json_object_get(j, "archive"));
    if (!prov || strcmp(prov, provider) != 0) {
        r = lb_error_set(err, -EMEDIUMTYPE,
                         "image '%s' is a snapshot of the %s provider; the %s provider cannot "
                         "run it",
                         name, prov ? prov : "(unknown)", provider);
        goto out;
    }
    if (!image || !workdir || strlen(image) >= sizeof(out->image) ||
        strlen(workdir) >= sizeof(out->workdir) || (archive && strchr(archive, '/'))) {
        r = lb_error_set(err, -ENOENT, "image '%s': its engine.json is damaged", name);
        goto out;
    }
    snprintf(out->image, sizeof(out->image), "%s", image);
    snprintf(out->workdir, sizeof(out->workdir), "%s", workdir);
    if (archive)
        snprintf(out->archive, sizeof(out->archive), "%s/" STORE "/sha256/%s/%s", images_dir, hex,
                 archive);
out:
    json_decref(j);
    return r;
}

/* Whether a directory of images_dir/.store/<sub> holds provider's engine.json naming image
 * (true also when sub cannot be read). */
static bool kept_in(const char *images_dir, const char *sub, const char *provider,
                    const char *image)
{
    struct dirent *de;
    char p[IMAGE_PATH_MAX + 400];
    bool kept = false;
    DIR *d;

    snprintf(p, sizeof(p), "%s/" STORE "/%s", images_dir, sub);
    d = opendir(p);
    if (!d)
        return errno != ENOENT; /* cannot tell: keep it */
    while (!kept && (de = readdir(d))) {
        json_t *j;

        if (de->d_name[0] == '.')
            continue;
        snprintf(p, sizeof(p), "%s/" STORE "/%s/%s/" IMAGE_ENGINE_JSON, images_dir, sub,
                 de->d_name);
        j = json_load_file(p, 0, NULL);
        kept = j &&
               strcmp(json_string_value(json_object_get(j, "provider")) ?: "", provider) == 0 &&
               strcmp(json_string_value(json_object_get(j, "image")) ?: "", image) == 0;
        json_decref(j);
    }
    closedir(d);
    return kept;
}

bool image_engine_image_kept(const char *images_dir, const char *provider, const char *image)
{
    /* tmp first: a capture published meanwhile (renamed from tmp into sha256) is then seen in
     * sha256 */
    return kept_in(images_dir, "tmp", provider, image) ||
           kept_in(images_dir, "sha256", provider, image);
}
