/*
 * fork.c - forks (see lend.h): one implicit snapshot of the parent, a hidden image (image.h,
 * "hidden"), then a fresh seed per session from it; the implicit snapshot is removed once no
 * live sandbox stands on it (the last child's stop, the fork's own end, or the start-up).
 * Pins and collection are in fork_collect.c (stops call it; it calls nothing of this file's).
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "image/image.h"
#include "util/log.h"

/* The seed body a child of parent rec (spec: its parsed spec) gets: the parent's spec on the
 * implicit snapshot name. A new reference, NULL without memory. */
static json_t *fork_template(const struct lb_record *rec, json_t *spec, const char *name)
{
    static const char *const copied[] = {"env",     "network",     "labels",
                                         "ports",   "resources",   "idle_timeout_s",
                                         "on_idle", "ready_probe", NULL};
    json_t *tpl = json_pack("{s:s}", "image", name), *v;
    int bad = 0;

    if (!tpl)
        return NULL;
    if (rec->provider)
        bad |= json_object_set_new(tpl, "provider", json_string(rec->provider));
    if (rec->task_id)
        bad |= json_object_set_new(tpl, "task_id", json_string(rec->task_id));
    for (size_t i = 0; copied[i]; i++)
        if ((v = json_object_get(spec, copied[i])) && !json_is_null(v))
            bad |= json_object_set(tpl, copied[i], v);
    /* the workdir the parent named; one that came from its image's WorkingDir comes again from
     * the snapshot's (copied from that image) */
    v = json_object_get(spec, "workdir");
    if (json_is_string(v) && !json_object_get(spec, "image_working_dir"))
        bad |= json_object_set(tpl, "workdir", v);
    v = json_object_get(spec, "ready_timeout_ms");
    if (json_is_integer(v) && json_integer_value(v) > 0)
        bad |= json_object_set_new(tpl, "ready_timeout_s",
                                   json_real((double)json_integer_value(v) / 1000.0));
    /* the parent's TTL as it was given (not what is left of it) */
    if (rec->expires_at > 0 && rec->expires_at > rec->created_at)
        bad |= json_object_set_new(tpl, "ttl_s", json_integer(rec->expires_at - rec->created_at));
    if (bad) {
        json_decref(tpl);
        return NULL;
    }
    return tpl;
}

int lend_fork_begin(struct lb_lend *l, const char *id, char *name, size_t name_len,
                    json_t **template_out, struct lb_error *err)
{
    struct lb_record rec = {0};
    struct lb_image_info info;
    unsigned char rnd[12];
    json_t *spec = NULL;
    bool pinned = false;
    int r;

    *template_out = NULL;
    if (name_len < strlen(LEND_FORK_PREFIX) + 2 * sizeof(rnd) + 1)
        return lb_error_set(err, -ENAMETOOLONG, "fork name buffer too small");
    r = lend_record_get(l, id, &rec, err);
    if (r < 0) {
        r = -ENOENT;
        goto out;
    }
    if (rec.state != LB_STATE_LENT) {
        r = lb_error_set(err, -ENOENT, "sandbox %s is not running (state %s)", id,
                         store_state_name(rec.state));
        goto out;
    }
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
        r = lb_error_set(err, -EIO, "cannot draw the fork's name: %s", strerror(errno));
        goto out;
    }
    snprintf(name, name_len, LEND_FORK_PREFIX);
    for (size_t i = 0; i < sizeof(rnd); i++)
        snprintf(name + strlen(LEND_FORK_PREFIX) + 2 * i, 3, "%02x", rnd[i]);
    r = lend_fork_pin(l, name);
    if (r < 0) {
        r = lb_error_set(err, r, "out of memory");
        goto out;
    }
    pinned = true;
    r = lend_snapshot_capture(l, id, name, true, NULL, &info, err);
    if (r < 0)
        goto out;
    spec = rec.spec_json ? json_loads(rec.spec_json, 0, NULL) : NULL;
    *template_out = fork_template(&rec, spec, name);
    if (!*template_out)
        r = lb_error_set(err, -ENOMEM, "out of memory");
out:
    if (r < 0 && pinned)
        lend_fork_end(l, name); /* a published snapshot no child will use goes now */
    json_decref(spec);
    store_record_release(&rec);
    return r;
}

int lend_fork_child(struct lb_lend *l, const char *rsid, const struct lb_seed_request *req,
                    json_t **lease_out, struct lb_error *err)
{
    return lend_seed_session(l, rsid, req, true, lease_out, err);
}

void lend_fork_end(struct lb_lend *l, const char *name)
{
    lend_fork_unpin(l, name);
    lend_fork_collect(l, name);
}
