/*
 * engine.c - the engine base's drivers for create, status, pause/resume, list and the end of
 * execs (see engine.h): the rules written once, the requests in the backend's hooks.
 */
#include "provider/engine/engine.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "image/image.h"
#include "provider/engine/httpc.h"
#include "util/fault.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/token.h"

static void engine_destroy(struct lb_provider *p);
static void engine_caps_op(struct lb_provider *p, struct lb_provider_caps *out);

void engine_init(struct lb_engine *e, const struct engine_hooks *hooks)
{
    memset(e, 0, sizeof(*e));
    e->ops = (struct lb_provider_ops){
        .name = hooks->name,
        .version = LB_PROVIDER_OPS_VERSION,
        .caps = engine_caps_op,
        .create = engine_create,
        .status = engine_status,
        .exec = engine_exec,
        .file_write = engine_file_write,
        .file_open = engine_file_open,
        .upload_begin = engine_upload_begin,
        .upload_commit = engine_upload_commit,
        .upload_abort = engine_upload_abort,
        .list = engine_list,
        .pause = engine_pause,
        .resume = engine_resume,
        .stop = engine_stop,
        .end_execs = engine_end_execs,
        .usage = hooks->usage ? engine_usage : NULL,
        .snapshot = hooks->commit ? engine_snapshot : NULL,
        .snapshot_sweep = hooks->commit ? engine_snapshot_sweep : NULL,
        .archive_put = hooks->archive_put ? engine_archive_put : NULL,
        .archive_get = hooks->archive_get ? engine_archive_get : NULL,
        .destroy = engine_destroy,
    };
    e->base.ops = &e->ops;
    e->hooks = hooks;
    pthread_mutex_init(&e->create_mutex, NULL);
    pthread_cond_init(&e->create_cond, NULL);
}

/* Wait for one of create_concurrency places (none without a bound); create_leave gives it
 * back. */
static bool create_enter(struct lb_engine *e)
{
    if (e->create_concurrency <= 0)
        return false;
    pthread_mutex_lock(&e->create_mutex);
    while (e->create_running >= e->create_concurrency)
        pthread_cond_wait(&e->create_cond, &e->create_mutex);
    e->create_running++;
    pthread_mutex_unlock(&e->create_mutex);
    return true;
}

static void create_leave(struct lb_engine *e)
{
    pthread_mutex_lock(&e->create_mutex);
    e->create_running--;
    pthread_cond_signal(&e->create_cond);
    pthread_mutex_unlock(&e->create_mutex);
}

/* A copy of s, NULL for NULL or ""; *oom when the copy failed. */
static char *copy_set(const char *s, bool *oom)
{
    char *c = s && *s ? strdup(s) : NULL;

    if (s && *s && !c)
        *oom = true;
    return c;
}

int engine_setup(struct lb_engine *e, const struct engine_config *c, struct lb_error *err)
{
    bool oom = false;

    e->socket = copy_set(c->socket, &oom);
    e->default_image = copy_set(c->default_image, &oom);
    e->supervise_path = strdup(c->supervise_path);
    e->net_inherit = strdup(c->net_inherit ? c->net_inherit : "none");
    e->images_dir = copy_set(c->images_dir, &oom);
    engine_instance_label(c->instance, c->state_dir, e->instance, sizeof(e->instance));
    if (asprintf(&e->spool_dir, "%s/%s-spool", c->state_dir, e->hooks->name) < 0)
        e->spool_dir = NULL;
    if (oom || !e->supervise_path || !e->net_inherit || !e->spool_dir)
        return lb_error_set(err, -ENOMEM, "out of memory");
    if (mkdir(e->spool_dir, 0700) < 0 && errno != EEXIST)
        return lb_error_set(err, -errno, "cannot make '%s': %s", e->spool_dir, strerror(errno));
    return 0;
}

int engine_new(size_t size, const struct engine_hooks *hooks, const struct engine_config *c,
               struct lb_engine **out, struct lb_error *err)
{
    struct lb_engine *e;
    int r;

    if (httpc_global_init() < 0)
        return lb_error_set(err, -EIO, "cannot initialise libcurl");
    e = calloc(1, size);
    if (!e)
        return lb_error_set(err, -ENOMEM, "out of memory");
    engine_init(e, hooks);
    r = engine_setup(e, c, err);
    if (r < 0) {
        e->ops.destroy(&e->base);
        return r;
    }
    *out = e;
    return 0;
}

int engine_check_network(const struct lb_engine *e, const struct lb_sandbox_spec *spec,
                         struct lb_error *err)
{
    const char *a = spec->network.access, *name = e->hooks->name, *noun = e->hooks->noun;

    if (a && strcmp(a, "inherit") != 0)
        return lb_error_set(err, -EOPNOTSUPP,
                            "network access '%s' cannot be enforced by the %s provider (its %ss "
                            "have no network at all)",
                            a, name, noun);
    if (strcmp(e->net_inherit, "none") != 0)
        return lb_error_set(err, -EOPNOTSUPP,
                            "network.inherit '%s' cannot be enforced by the %s provider (only "
                            "'none')",
                            e->net_inherit, name);
    if (spec->n_ports > 0)
        return lb_error_set(err, -EOPNOTSUPP,
                            "the %s provider cannot expose ports: its %ss have no network", name,
                            noun);
    return 0;
}

void engine_caps(const struct lb_engine *e, struct lb_provider_caps *out)
{
    *out = (struct lb_provider_caps){
        .network_modes = strcmp(e->net_inherit, "none") == 0 ? LB_NET_LOOPBACK : 0,
        .cpu_limit = true,
        .memory_limit = true,
        .pids_limit = true,
        .disk_limit = true,
        .images = true,
        .pause = true,
        .snapshot = e->hooks->commit && e->images_dir,
        .default_image = e->default_image,
        .engine_creates = true,
        .create_concurrency = e->create_concurrency > 0 ? e->create_concurrency : 0,
    };
}

static void engine_caps_op(struct lb_provider *p, struct lb_provider_caps *out)
{
    struct lb_engine *e = (struct lb_engine *)p;

    engine_caps(e, out);
    e->hooks->caps(e, out);
}

void engine_instance_label(const char *configured, const char *state_dir, char *buf, size_t size)
{
    char hex[LB_SHA256_HEX + 1];

    if (configured && *configured) {
        snprintf(buf, size, "%s", configured);
        return;
    }
    token_sha256_hex(state_dir, strlen(state_dir), hex);
    snprintf(buf, size, "%.12s", hex);
}

int engine_create(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                  const struct lb_sandbox_spec *spec, json_t **descriptor_out, struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;
    const struct engine_hooks *h = e->hooks;
    const char *image =
        spec->image && strcmp(spec->image, "host") != 0 ? spec->image : e->default_image;
    int64_t timeout_ms = e->ready_timeout && spec->ready_timeout_ms > 0 ? spec->ready_timeout_ms
                                                                        : e->create_timeout_ms;
    struct engine_instance inst = {.name = ""};
    struct lb_image_engine snap;
    char point[64];
    bool made = false, locked = false, from_snap;
    int r;

    if (!image)
        return lb_error_set(err, -EINVAL, "no image given and %s.default_image is not set",
                            h->name);
    r = engine_snapshot_source(e, spec, &snap, err);
    if (r < 0 && r != -ENOENT)
        return r;
    from_snap = r == 0;
    inst.from_snapshot = from_snap;
    if (from_snap)
        image = snap.image;
    r = h->prepare ? h->prepare(e, ref, spec, &inst, err) : 0;
    if (r < 0)
        return r;
    locked = create_enter(e);
    r = h->make(e, ref, spec, image, timeout_ms, &inst, err);
    if (r == -EEXIST) {
        /* a create retried after a crash: the first instance is the sandbox */
        lb_error_clear(err);
        r = h->find_own(e, ref, &inst, err);
        if (r < 0)
            goto out;
        log_info_sbx(ref->id, "%s: %s %s already exists; using it", h->name, h->noun, inst.name);
    }
    if (r < 0)
        goto out;
    made = true;
    /* a crash here leaves an instance whose record is "starting": the next start stops it */
    snprintf(point, sizeof(point), "%s.created", h->name);
    r = fault_hit(point, timeout_ms, err);
    if (r < 0) {
        r = -EREMOTEIO;
        goto out;
    }
    r = h->start(e, ref, timeout_ms, &inst, err);
    if (locked) {
        create_leave(e);
        locked = false;
    }
    if (r == 0 && from_snap)
        r = engine_snapshot_restore(e, ref, spec, &snap, err);
    if (r == 0)
        r = h->finish(e, ref, spec, &inst, descriptor_out, err);
out:
    if (locked)
        create_leave(e);
    if (r < 0)
        h->rollback(e, ref, &inst, made);
    if (r < 0 && r != -ETIMEDOUT && r != -EINVAL && r != -EOPNOTSUPP && r != -LB_E_IMAGE_NOT_FOUND)
        r = -EREMOTEIO;
    return r;
}

static int pause_or_resume(struct lb_provider *p, const struct lb_sandbox_ref *ref, bool pause,
                           struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;
    enum lb_sandbox_status st;
    struct lb_error ferr = {0};
    int r;

    r = e->hooks->set_frozen(e, ref, pause, &ferr);
    if (r == -ENOENT)
        return lb_error_set(err, -ENOENT, "no such sandbox");
    if (r < 0 && r != -ETIMEDOUT && e->hooks->state(e, ref, &st, NULL) == 0 &&
        st == (pause ? LB_STATUS_PAUSED : LB_STATUS_RUNNING))
        return 0; /* already so: idempotent */
    if (r < 0)
        return lb_error_keep(err, r == -ETIMEDOUT ? r : -EREMOTEIO, "%s", ferr.message);
    return 0;
}

int engine_state_answer(const struct lb_httpc_response *resp, const char *obj, const char *key,
                        const struct engine_state_name *table, enum lb_sandbox_status *out)
{
    json_t *j;
    const char *name;

    if (resp->status == 404) {
        *out = LB_STATUS_STOPPED;
        return 0;
    }
    if (resp->status != 200)
        return -EREMOTEIO;
    j = json_loadb(resp->body.data, resp->body.len, 0, NULL);
    name = json_string_value(json_object_get(json_object_get(j, obj), key));
    while (name && table->name && strcmp(table->name, name) != 0)
        table++;
    *out = name && table->name ? table->status : LB_STATUS_UNKNOWN;
    json_decref(j);
    return 0;
}

int engine_get_json(struct lb_engine *e, const char *path, const char *what, int64_t timeout_ms,
                    json_t **out, struct lb_error *err)
{
    struct lb_httpc_response resp = {0};
    int r;

    r = e->hooks->call(e, "GET", path, NULL, timeout_ms, &resp, err);
    if (r == 0 && resp.status != 200)
        r = e->hooks->answer_error(&resp, what, err);
    if (r == 0) {
        *out = httpc_response_json(&resp);
        if (!*out)
            r = lb_error_set(err, -EREMOTEIO, "%s: unreadable answer to %s", e->hooks->engine_label,
                             what);
    }
    httpc_response_release(&resp);
    return r;
}

int engine_status(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                  enum lb_sandbox_status *out, struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;

    return e->hooks->state(e, ref, out, err);
}

int engine_pause(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_error *err)
{
    return pause_or_resume(p, ref, true, err);
}

int engine_resume(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_error *err)
{
    return pause_or_resume(p, ref, false, err);
}

int engine_list(struct lb_provider *p, json_t **out, struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;
    json_t *items = NULL, *arr = NULL, *item;
    size_t i;
    int r;

    arr = json_array();
    if (!arr)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = e->hooks->list_raw(e, &items, err);
    if (r == -ENOENT) /* the engine has no such list: it failed */
        r = -EREMOTEIO;
    if (r < 0)
        goto out;
    json_array_foreach(items, i, item) {
        const char *id = NULL;
        json_t *desc = e->hooks->list_entry(e, item, &id);

        if (desc)
            json_array_append_new(arr,
                                  json_pack("{s:s,s:o}", "sandbox_id", id, "descriptor", desc));
    }
    *out = arr;
    arr = NULL;
out:
    json_decref(arr);
    json_decref(items);
    return r;
}

int engine_end_execs(struct lb_provider *p)
{
    return gates_end(&((struct lb_engine *)p)->gates);
}

int engine_stop(struct lb_provider *p, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;

    return e->hooks->remove(e, ref, timeout_ms > 0 ? timeout_ms : 120000, err);
}

int64_t engine_usage_figure(const json_t *v)
{
    if (json_is_integer(v))
        return json_integer_value(v) >= 0 ? (int64_t)json_integer_value(v) : -1;
    if (json_is_real(v) && json_real_value(v) >= 0 && json_real_value(v) < 9.2e18)
        return (int64_t)json_real_value(v);
    return -1;
}

int engine_usage(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_usage *out,
                 struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;
    struct lb_usage u = {-1, -1, -1, -1, -1, -1};
    struct lb_error uerr = {0};
    int r;

    *out = u;
    if (!e->hooks->usage)
        return lb_error_set(err, -ENOSYS, "the %s provider has no usage op", e->hooks->name);
    r = e->hooks->usage(e, ref, &u, &uerr);
    if (r < 0) {
        log_debug("%s: usage of sandbox %s unknown: %s", e->hooks->name, ref->id, uerr.message);
        return lb_error_keep(err, r, "%s", uerr.message);
    }
    *out = u;
    return 0;
}

int engine_file_open(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                     int *fd_out, uint64_t *size_out, struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;

    if (!provider_path_is_valid(path))
        return lb_error_set(err, -EINVAL, "bad path '%s'", path);
    return e->hooks->file_open(e, ref, path, fd_out, size_out, err);
}

void engine_release(struct lb_engine *e)
{
    char **const strings[] = {&e->socket,      &e->default_image, &e->supervise_path,
                              &e->net_inherit, &e->spool_dir,     &e->images_dir};

    httpc_free(e->http);
    e->http = NULL;
    mem_free_strings(strings, sizeof(strings) / sizeof(strings[0]));
    gates_release(&e->gates);
    pthread_mutex_destroy(&e->create_mutex);
    pthread_cond_destroy(&e->create_cond);
}

/* The destroy op: the backend's own, then the base, then the struct (calloc'd by the
 * backend, the base first in it). */
static void engine_destroy(struct lb_provider *p)
{
    struct lb_engine *e = (struct lb_engine *)p;

    if (!e)
        return;
    if (e->hooks->release)
        e->hooks->release(e);
    engine_release(e);
    free(e);
}
