/*
 * lxd_instance.c - one instance found as this daemon's own, and one removed (stop, then
 * delete): the base that the create hooks (lxd.c) and the snapshots (lxd_snapshot.c) share.
 */
#include "provider/lxd/lxd_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util/clock.h"

int lxd_find_own(struct lb_lxd *l, const char *id, char *location, size_t loc_size,
                 uint32_t *id_base, struct lb_error *err)
{
    char path[256];
    json_t *j = NULL, *md, *conf;
    int r;

    snprintf(path, sizeof(path), "/1.0/instances/%s", id);
    r = engine_get_json(&l->eng, path, "instance lookup", 0, &j, err);
    if (r < 0)
        return r;
    md = json_object_get(j, "metadata");
    conf = json_object_get(md, "config");
    if (strcmp(json_string_value(json_object_get(conf, LXD_LABEL_INSTANCE)) ?: "",
               l->eng.instance) != 0 ||
        strcmp(json_string_value(json_object_get(conf, LXD_LABEL_SANDBOX)) ?: "", id) != 0)
        r = lb_error_set(err, -EREMOTEIO,
                         "LXD instance '%s' exists but does not carry this daemon's labels", id);
    else
        snprintf(location, loc_size, "%s",
                 json_string_value(json_object_get(md, "location")) ?: "");
    if (r == 0 && id_base)
        *id_base = lxd_idmap_of_config(conf);
    json_decref(j);
    return r;
}

/* Does LXD's answer say another operation on the instance was in the way? "Instance is busy
 * running a "stop" operation" (one a daemon killed mid-stop left), or "Failed to create instance
 * delete operation: A matching non-reusable operation has now succeeded" (the operation lock of
 * an earlier delete of an instance of the same name, a reset's, not yet let go): either way the
 * next try finds the instance, or finds it gone. */
static bool lxd_answer_busy(const struct lb_error *e)
{
    return strstr(e->message, "is busy running") || strstr(e->message, "matching non-reusable");
}

/* One stop (force) and delete of instance id within timeout_ms: 0 (also for 404: gone),
 * -EBUSY when LXD runs another operation on it (lxd_answer_busy), -ETIMEDOUT or -EREMOTEIO. */
static int remove_once(struct lb_lxd *l, const char *id, const char *member, int64_t timeout_ms,
                       struct lb_error *err)
{
    json_t *body = json_pack("{s:s,s:b,s:i}", "action", "stop", "force", 1, "timeout", -1);
    int64_t t0 = clock_mono_ms(), left;
    struct lb_error serr = {0};
    char path[256];
    int r;

    if (!body)
        return lb_error_set(err, -ENOMEM, "out of memory");
    snprintf(path, sizeof(path), "/1.0/instances/%s/state", id);
    r = lxd_async(l, member, "PUT", path, body, timeout_ms, NULL, &serr);
    json_decref(body);
    if (r == -ENOENT)
        return 0;
    if (r < 0 && r != -ETIMEDOUT && lxd_answer_busy(&serr))
        return lb_error_set(err, -EBUSY, "%s", serr.message);
    if (r == -ETIMEDOUT || (r < 0 && !strstr(serr.message, "already stopped") &&
                            !strstr(serr.message, "not running"))) {
        return lb_error_set(err, r == -ETIMEDOUT ? -ETIMEDOUT : -EREMOTEIO, "%s", serr.message);
    }
    left = timeout_ms - (clock_mono_ms() - t0);
    if (left < 1000)
        return lb_error_set(err, -ETIMEDOUT, "the stop of LXD instance %s took its whole %lld ms",
                            id, (long long)timeout_ms);
    snprintf(path, sizeof(path), "/1.0/instances/%s", id);
    lb_error_clear(&serr);
    r = lxd_async(l, member, "DELETE", path, NULL, left, NULL, &serr);
    if (r == -ENOENT)
        return 0;
    if (r < 0 && r != -ETIMEDOUT && lxd_answer_busy(&serr))
        return lb_error_set(err, -EBUSY, "%s", serr.message);
    if (r < 0)
        return lb_error_set(err, r == -ETIMEDOUT ? r : -EREMOTEIO, "%s", serr.message);
    return 0;
}

int lxd_remove_instance(struct lb_lxd *l, const char *id, const char *member, int64_t timeout_ms,
                        bool wait_busy, struct lb_error *err)
{
    int64_t t0 = clock_mono_ms();
    int r;

    for (;;) {
        lb_error_clear(err);
        r = remove_once(l, id, member, timeout_ms - (clock_mono_ms() - t0), err);
        if (r != -EBUSY || !wait_busy)
            return r;
        /* another operation on it (a stop of a daemon killed meanwhile) ends first */
        if (timeout_ms - (clock_mono_ms() - t0) < 1500)
            return lb_error_recode(err, -EREMOTEIO, "LXD instance %s stayed busy", id);
        usleep(250000);
    }
}
