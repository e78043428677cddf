/*
 * lxd_snapshot.c - the lxd provider's snapshot hooks (engine.h, "snapshots") with LXD's own
 * copies: the frozen instance is copied (POST /1.0/instances, source type "copy", instance
 * only) into a new stopped instance "lbs-<16 hex>" on the same member, which carries
 * user.lendbox.snapshot=<this daemon's instance label> and none of the sandbox labels (so no
 * listing of sandboxes sees it) and is never started. That instance is the snapshot's "image":
 * a seed from the snapshot is another copy of it (lxd.c, create_body). The workdir, like
 * everything the sandbox wrote, is in the instance's root; /tmp, /run and /dev/shm are tmpfs
 * mounts of their own (lxd.c, mounts_lxc) and are not copied. The listing and removal of those
 * instances let the engine sweep what no image store entry names (a capture killed half-way).
 */
#include "provider/lxd/lxd_internal.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "util/log.h"

#define SNAPSHOT_TIMEOUT_MS (30 * 60 * 1000)
#define SNAPSHOT_PREFIX "lbs-"

/* GET the instance name; 0 and its metadata (the caller's) when it is one of this daemon's
 * snapshot instances; -ENOENT when there is none of that name or it is not ours. */
static int get_snapshot_instance(struct lb_lxd *l, const char *name, json_t **md_out,
                                 struct lb_error *err)
{
    char path[256];
    json_t *j = NULL, *md;
    const char *owner;
    int r;

    *md_out = NULL;
    if (strncmp(name, SNAPSHOT_PREFIX, strlen(SNAPSHOT_PREFIX)) != 0 || strlen(name) > 63 ||
        strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789-") != strlen(name))
        return lb_error_set(err, -ENOENT, "'%s' is not a snapshot instance of the lxd provider",
                            name);
    snprintf(path, sizeof(path), "/1.0/instances/%s", name);
    r = engine_get_json(&l->eng, path, "snapshot instance lookup", 0, &j, err);
    if (r < 0)
        return r;
    md = json_object_get(j, "metadata");
    owner = json_string_value(json_object_get(json_object_get(md, "config"), LXD_LABEL_SNAPSHOT));
    if (!owner || strcmp(owner, l->eng.instance) != 0) {
        json_decref(j);
        return lb_error_set(err, -ENOENT, "LXD instance '%s' is not a snapshot of this daemon",
                            name);
    }
    *md_out = json_incref(md);
    json_decref(j);
    return 0;
}

int lxd_snapshot_location(struct lb_lxd *l, const char *name, char *location, size_t size,
                          struct lb_error *err)
{
    json_t *md = NULL;
    int r = get_snapshot_instance(l, name, &md, err);

    if (r == -ENOENT)
        return lb_error_recode(err, -LB_E_IMAGE_NOT_FOUND, "LXD has no snapshot instance '%s'",
                               name);
    if (r < 0)
        return r;
    snprintf(location, size, "%s", json_string_value(json_object_get(md, "location")) ?: "");
    json_decref(md);
    return 0;
}

int lxd_commit(struct lb_engine *e, const struct lb_sandbox_ref *ref, char *image, size_t size,
               struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)e;
    char name[64], location[128] = "", path[256];
    unsigned char rnd[8];
    json_t *body = NULL;
    int r;

    if (size < sizeof(name))
        return lb_error_set(err, -EINVAL, "no room for a snapshot instance name");
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        return lb_error_set(err, -EIO, "cannot draw a snapshot name: %s", strerror(errno));
    snprintf(name, sizeof(name), SNAPSHOT_PREFIX "%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1],
             rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    /* the source's member: a copy there is a local one (LXD 5.0.2 places no copy itself) */
    r = lxd_find_own(l, ref->id, location, sizeof(location), NULL, err);
    if (r == -ENOENT)
        return lb_error_set(err, -ENOENT, "no such sandbox");
    if (r < 0)
        return r;
    /* the copy keeps the source's config but for what is named here ("" unsets): no sandbox
     * labels (no listing of sandboxes sees it), no isolated id range held while it is stopped,
     * nor the source's slot (volatile.last_state.idmap, which LXD copies, still says how its
     * files are owned; a seed from it gets a slot of its own) */
    body =
        json_pack("{s:s,s:s,s:{s:s,s:s,s:b},s:[],s:{s:s,s:s,s:s,s:s,s:s,s:s}}", "name", name,
                  "type", "container", "source", "type", "copy", "source", ref->id, "instance_only",
                  1, "profiles", "config", LXD_LABEL_INSTANCE, "", LXD_LABEL_SANDBOX, "",
                  LXD_LABEL_SNAPSHOT, l->eng.instance, "security.idmap.isolated", "false",
                  "security.idmap.base", "", "security.idmap.size", "");
    if (!body)
        return lb_error_set(err, -ENOMEM, "out of memory");
    if (l->clustered && location[0]) {
        char *enc = curl_easy_escape(NULL, location, 0);

        snprintf(path, sizeof(path), "/1.0/instances?target=%s", enc ? enc : "");
        curl_free(enc);
    } else {
        snprintf(path, sizeof(path), "/1.0/instances");
    }
    /* the frozen source stays frozen: LXD freezes only a running one that is not */
    r = lxd_async(l, location[0] ? location : NULL, "POST", path, body, SNAPSHOT_TIMEOUT_MS, NULL,
                  err);
    json_decref(body);
    if (r == -ENOENT)
        return lb_error_set(err, -ENOENT, "no such sandbox");
    if (r == 0 || r == -ETIMEDOUT) /* a copy still under way is removed like a finished one */
        snprintf(image, size, "%s", name);
    return r;
}

int lxd_snapshot_images(struct lb_engine *e, json_t **out, struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)e;
    json_t *j = NULL, *arr = json_array(), *item;
    size_t i;
    int r;

    *out = NULL;
    if (!arr)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = lxd_list_labelled(e, LXD_LABEL_SNAPSHOT, l->eng.instance, "snapshot instance list", &j,
                          err);
    if (r < 0)
        goto out;
    json_array_foreach(json_object_get(j, "metadata"), i, item) {
        const char *name = json_string_value(json_object_get(item, "name"));
        const char *owner =
            json_string_value(json_object_get(json_object_get(item, "config"), LXD_LABEL_SNAPSHOT));

        /* the filter is LXD's: check again */
        if (name && owner && strcmp(owner, l->eng.instance) == 0 &&
            strncmp(name, SNAPSHOT_PREFIX, strlen(SNAPSHOT_PREFIX)) == 0)
            json_array_append_new(arr, json_string(name));
    }
    *out = arr;
    arr = NULL;
out:
    json_decref(arr);
    json_decref(j);
    return r;
}

int lxd_image_remove(struct lb_engine *e, const char *image, struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)e;
    json_t *md = NULL;
    char location[128];
    int r = get_snapshot_instance(l, image, &md, err);

    if (r < 0)
        return r;
    snprintf(location, sizeof(location), "%s",
             json_string_value(json_object_get(md, "location")) ?: "");
    json_decref(md);
    /* a copy from it under way holds LXD's lock on it: -EBUSY, the next sweep comes again */
    return lxd_remove_instance(l, image, location[0] ? location : NULL, l->call_timeout_ms * 4,
                               false, err);
}
