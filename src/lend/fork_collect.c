/*
 * fork_collect.c - a fork's implicit snapshot kept and removed: a fork pins its name
 * (fork_pins) from before the capture until its children are recorded, so that a collection
 * cannot remove it under them; a collection's check and removal run under fork_mutex. Called by
 * stops (the last child's), by fork.c (the fork's end) and at start-up; calls nothing above it.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/image.h"
#include "util/log.h"

static bool fork_is_name(const char *name)
{
    return name && strncmp(name, LEND_FORK_PREFIX, strlen(LEND_FORK_PREFIX)) == 0;
}

/* see lend_private.h */
int lend_fork_pin(struct lb_lend *l, const char *name)
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

/* see lend_private.h */
void lend_fork_unpin(struct lb_lend *l, const char *name)
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

/* Every provider's snapshot_sweep under the capture lock; wait false: skip it while a capture
 * holds the lock (a stop must not wait for a copy; the next removal or start sweeps). */
static void sweep_snapshots(struct lb_lend *l, bool wait)
{
    size_t n = registry_count(lend_providers(l));

    /* no capture between an engine's commit and its engine.json in the work dir meanwhile */
    if (!wait && pthread_mutex_trylock(&l->capture_mutex) != 0)
        return;
    if (wait)
        pthread_mutex_lock(&l->capture_mutex);
    for (size_t i = 0; i < n; i++) {
        struct lb_provider *p = registry_at(lend_providers(l), i);
        struct lb_error e = {0};

        if (provider_snapshot_sweep(p, &e) < 0)
            log_warn("%s provider: snapshot sweep: %s", p->ops->name, e.message);
    }
    pthread_mutex_unlock(&l->capture_mutex);
}

/* see lend.h */
void lend_sweep_snapshots(struct lb_lend *l)
{
    sweep_snapshots(l, true);
}

/* see lend_private.h */
void lend_fork_collect(struct lb_lend *l, const char *name)
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
    swept = r >= 0; /* 1: the tree went too, which an engine's image stood for */
out:
    pthread_mutex_unlock(&l->fork_mutex);
    if (swept) /* an engine's image of it (docker); not behind a capture under way */
        sweep_snapshots(l, false);
}

/* see lend_private.h */
void lend_fork_collect_of(struct lb_lend *l, const struct lb_record *r)
{
    json_t *spec = NULL;
    const char *image;

    if (!l->cfg.images_dir || !r->spec_json || !strstr(r->spec_json, LEND_FORK_PREFIX))
        return; /* cheap: most stops are of no fork's child */
    image = lend_spec_string(r, "image", NULL, &spec);
    if (image)
        lend_fork_collect(l, image);
    /* a child reset to another snapshot stood on its fork's image as its seed_image */
    image = json_string_value(json_object_get(spec, "seed_image"));
    if (image)
        lend_fork_collect(l, image);
    json_decref(spec);
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
            lend_fork_collect(l, all[i].name);
    free(all);
    return 0;
}
