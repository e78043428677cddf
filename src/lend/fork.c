/*
 * fork.c - forks (see lend.h): one implicit snapshot of the parent, a hidden image (image.h,
 * "hidden"), then a fresh seed per session from it; the implicit snapshot is removed once no
 * live sandbox stands on it (the last child's stop, the fork's own end, or the start-up).
 *
 * A fork pins its snapshot's name (fork_pins) from before the capture until its children are
 * recorded, so that a collection cannot remove it under them; a collection's check and removal
 * run under fork_mutex.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "image/image.h"
#include "util/log.h"

#define FORK_PREFIX "fork-"

static bool fork_is_name(const char *name)
{
    return name && strncmp(name, FORK_PREFIX, strlen(FORK_PREFIX)) == 0;
}

static int fork_pin(struct lb_lend *l, const char *name)
{
    size_t len = strlen(name) + 1;
    struct lend_fork_pin *p = malloc(sizeof(*p) + len);

    if (!p)
        return -ENOMEM;
    memcpy(p->name, name, len);
    pthread_mutex_lock(&l->fork_mutex);
    p->next = l->fork_pins;
    l->fork_pins = p;
    pthread_mutex_unlock(&l->fork_mutex);
    return 0;
}

static void fork_unpin(struct lb_lend *l, const char *name)
{
    struct lend_fork_pin **pp, *p;

    pthread_mutex_lock(&l->fork_mutex);
    for (pp = &l->fork_pins; (p = *pp); pp = &p->next) {
        if (strcmp(p->name, name) == 0) {
            *pp = p->next;
            free(p);
            break;
        }
    }
    pthread_mutex_unlock(&l->fork_mutex);
}

/* fork_mutex held */
static bool fork_is_pinned(struct lb_lend *l, const char *name)
{
    for (struct lend_fork_pin *p = l->fork_pins; p; p = p->next)
        if (strcmp(p->name, name) == 0)
            return true;
    return false;
}

/* image_remove_unused's question: does a live record hold this digest? (errors: yes) */
static bool fork_digest_in_use(void *ctx, const char *digest)
{
    int64_t n = 0;

    return store_count_using_image_digest(ctx, digest, &n, NULL) < 0 || n > 0;
}

/* Remove the implicit snapshot name when it is one, is not pinned and no record that is not
 * stopped names it. */
static void fork_collect(struct lb_lend *l, const char *name)
{
    struct lb_image_info info;
    struct lb_error e = {0};
    int64_t users = 0;
    bool swept = false;
    int r;

    if (!l->cfg.images_dir || !fork_is_name(name))
        return;
    pthread_mutex_lock(&l->fork_mutex);
    if (fork_is_pinned(l, name) || image_get(l->cfg.images_dir, name, &info, NULL) < 0 ||
        !info.hidden)
        goto out;
    r = store_count_using_image(l->store, name, &users, &e);
    if (r < 0) {
        log_warn("fork snapshot %s: cannot count its sandboxes: %s", name, e.message);
        goto out;
    }
    if (users > 0)
        goto out;
    r = image_remove_unused(l->cfg.images_dir, name, fork_digest_in_use, l->store, &e);
    if (r < 0 && r != -ENOENT)
        log_warn("fork snapshot %s: cannot remove it: %s", name, e.message);
    swept = r == 0;
out:
    pthread_mutex_unlock(&l->fork_mutex);
    if (swept) /* an engine's image of it (docker) */
        lend_sweep_snapshots(l);
}

/* see lend_private.h */
void lend_fork_collect_of(struct lb_lend *l, const struct lb_record *r)
{
    json_t *spec = NULL;
    const char *image;

    if (!l->cfg.images_dir || !r->spec_json || !strstr(r->spec_json, FORK_PREFIX))
        return; /* cheap: most stops are of no fork's child */
    image = lend_spec_string(r, "image", NULL, &spec);
    if (image)
        fork_collect(l, image);
    json_decref(spec);
}

/* The seed body a child of parent rec (spec: its parsed spec) gets: the parent's spec on the
 * implicit snapshot name. A new reference, NULL without memory. */
static json_t *fork_template(const struct lb_record *rec, json_t *spec, const char *name)
{
    static const char *const copied[] = {"env", "network", "labels", "ports", "resources", NULL};
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
    if (name_len < strlen(FORK_PREFIX) + 2 * sizeof(rnd) + 1)
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
    snprintf(name, name_len, FORK_PREFIX);
    for (size_t i = 0; i < sizeof(rnd); i++)
        snprintf(name + strlen(FORK_PREFIX) + 2 * i, 3, "%02x", rnd[i]);
    r = fork_pin(l, name);
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
    fork_unpin(l, name);
    fork_collect(l, name);
}

int lend_collect_forks(struct lb_lend *l, struct lb_error *err)
{
    struct lb_image_info *all = NULL;
    size_t n = 0;
    int r;

    if (!l->cfg.images_dir)
        return 0;
    r = image_list(l->cfg.images_dir, &all, &n, err);
    if (r < 0)
        return r;
    for (size_t i = 0; i < n; i++)
        if (all[i].hidden)
            fork_collect(l, all[i].name);
    free(all);
    return 0;
}
