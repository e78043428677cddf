/* fault.c (provider) - see fault.h. */
#include "provider/fault.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/fault.h"

struct fault_provider {
    struct lb_provider base;
    struct lb_provider *inner;
    int64_t create_timeout_ms;
    bool owns_inner;
    char points[16]; /* the fault points' prefix: "provider" (provider.create, ...) */
    char name[32];
    struct lb_provider_ops ops;
};

#define INNER(p) (((struct fault_provider *)(p))->inner)

/* Apply the fault configured for this wrapper's point "<prefix>.<op>". */
static int fault_point(struct lb_provider *p, const char *op, int64_t deadline_ms,
                       struct lb_error *err)
{
    char point[48];

    snprintf(point, sizeof(point), "%s.%s", ((struct fault_provider *)p)->points, op);
    return fault_hit(point, deadline_ms, err);
}

/* Injected failures look like provider failures (the error's code too: it decides the HTTP
 * status). */
static int fault_as_provider(int r, struct lb_error *err)
{
    r = r == -ETIMEDOUT ? r : -EREMOTEIO;
    if (err)
        err->code = r;
    return r;
}

static int fault_create(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                        const struct lb_sandbox_spec *spec, json_t **out, struct lb_error *err)
{
    int r = fault_point(p, "create", ((struct fault_provider *)p)->create_timeout_ms, err);

    return r < 0 ? fault_as_provider(r, err) : provider_create(INNER(p), ref, spec, out, err);
}

static int fault_stop(struct lb_provider *p, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                      struct lb_error *err)
{
    int r = fault_point(p, "stop", timeout_ms, err);

    return r < 0 ? fault_as_provider(r, err) : provider_stop(INNER(p), ref, timeout_ms, err);
}

static int fault_status(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                        enum lb_sandbox_status *out, struct lb_error *err)
{
    int r = fault_point(p, "status", 0, err);

    return r < 0 ? fault_as_provider(r, err) : provider_status(INNER(p), ref, out, err);
}

static int fault_exec(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                      const struct lb_exec_request *req, struct lb_exec_result *res,
                      struct lb_error *err)
{
    int r = fault_point(p, "exec", req->timeout_ms, err);

    return r < 0 ? fault_as_provider(r, err) : provider_exec(INNER(p), ref, req, res, err);
}

static int fault_file_write(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                            const char *path, const void *data, size_t len, int mode,
                            struct lb_error *err)
{
    int r = fault_point(p, "file_write", 0, err);

    return r < 0 ? fault_as_provider(r, err)
                 : provider_file_write(INNER(p), ref, path, data, len, mode, err);
}

static int fault_upload_begin(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                              const char *path, int mode, const char *owner, struct lb_upload **out,
                              struct lb_error *err)
{
    int r = fault_point(p, "file_write", 0, err);

    return r < 0 ? fault_as_provider(r, err)
                 : provider_upload_begin(INNER(p), ref, path, mode, owner, out, err);
}

static int fault_file_open(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                           const char *path, int *fd, uint64_t *size, struct lb_error *err)
{
    int r = fault_point(p, "file_open", 0, err);

    return r < 0 ? fault_as_provider(r, err)
                 : provider_file_open(INNER(p), ref, path, fd, size, err);
}

/* The fault point named point, then call (provider_archive_put or _get) on the inner provider. */
static int fault_archive(const char *point, lb_provider_archive_fn *call, struct lb_provider *p,
                         const struct lb_sandbox_ref *ref, const char *dir, int fd,
                         uint64_t max_bytes, struct lb_archive_result *out, struct lb_error *err)
{
    int r = fault_point(p, point, 0, err);

    *out = (struct lb_archive_result){0};
    return r < 0 ? fault_as_provider(r, err) : call(INNER(p), ref, dir, fd, max_bytes, out, err);
}

static int fault_archive_put(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                             const char *dir, int fd, uint64_t max_bytes,
                             struct lb_archive_result *out, struct lb_error *err)
{
    return fault_archive("archive_put", provider_archive_put, p, ref, dir, fd, max_bytes, out, err);
}

static int fault_archive_get(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                             const char *dir, int fd, uint64_t max_bytes,
                             struct lb_archive_result *out, struct lb_error *err)
{
    return fault_archive("archive_get", provider_archive_get, p, ref, dir, fd, max_bytes, out, err);
}

static int fault_list(struct lb_provider *p, json_t **out, struct lb_error *err)
{
    int r = fault_point(p, "list", 0, err);

    return r < 0 ? fault_as_provider(r, err) : provider_list(INNER(p), out, err);
}

static int fault_pause(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                       struct lb_error *err)
{
    const struct lb_provider *in = INNER(p);

    return in->ops->pause ? in->ops->pause(INNER(p), ref, err) : -ENOSYS;
}

static int fault_resume(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                        struct lb_error *err)
{
    const struct lb_provider *in = INNER(p);

    return in->ops->resume ? in->ops->resume(INNER(p), ref, err) : -ENOSYS;
}

static int fault_endpoint(struct lb_provider *p, const struct lb_sandbox_ref *ref, int port,
                          char **url_out, struct lb_error *err)
{
    return provider_endpoint(INNER(p), ref, port, url_out, err);
}

static int fault_oom_kills(struct lb_provider *p, const struct lb_sandbox_ref *ref, uint64_t *count,
                           int64_t *limit_bytes, struct lb_error *err)
{
    return provider_oom_kills(INNER(p), ref, count, limit_bytes, err);
}

static int fault_usage(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                       struct lb_usage *out, struct lb_error *err)
{
    return provider_usage(INNER(p), ref, out, err);
}

static int fault_end_execs(struct lb_provider *p)
{
    return provider_end_execs(INNER(p));
}

static void fault_defer_cleanup(struct lb_provider *p)
{
    provider_defer_cleanup(INNER(p));
}

static void fault_stop_begin(struct lb_provider *p, const struct lb_sandbox_ref *ref)
{
    provider_stop_begin(INNER(p), ref);
}

static void fault_caps(struct lb_provider *p, struct lb_provider_caps *out)
{
    provider_caps(INNER(p), out);
    /* "<points>.caps.reset=fail": the provider seen as one that cannot reset (docker's caps) */
    if (fault_enabled() && fault_point(p, "caps.reset", 0, NULL) < 0)
        out->reset = false;
}

static int fault_snapshot(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *dest,
                          bool flatten, struct lb_error *err)
{
    int r = fault_point(p, "snapshot", 0, err);

    return r < 0 ? fault_as_provider(r, err) : provider_snapshot(INNER(p), ref, dest, flatten, err);
}

static int fault_reset_in_place(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                                const struct lb_sandbox_spec *spec, const char *hostname,
                                int64_t timeout_ms, struct lb_error *err)
{
    int r = fault_point(p, "reset_in_place", 0, err);

    return r < 0 ? fault_as_provider(r, err)
                 : provider_reset_in_place(INNER(p), ref, spec, hostname, timeout_ms, err);
}

static int fault_hand_over(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                           const char *new_id, json_t **desc_out, struct lb_error *err)
{
    int r = fault_point(p, "hand_over", 0, err);

    *desc_out = NULL;
    return r < 0 ? fault_as_provider(r, err)
                 : provider_hand_over(INNER(p), ref, new_id, desc_out, err);
}

static int fault_snapshot_sweep(struct lb_provider *p, struct lb_error *err)
{
    return provider_snapshot_sweep(INNER(p), err);
}

static void fault_destroy(struct lb_provider *p)
{
    if (((struct fault_provider *)p)->owns_inner)
        provider_destroy(INNER(p));
    free(p);
}

int provider_fault_wrap(struct lb_provider *inner, int64_t create_timeout_ms,
                        struct lb_provider **out)
{
    /* records keep the real provider's name */
    return provider_fault_wrap_as(inner, create_timeout_ms, inner->ops->name, "provider", true,
                                  out);
}

int provider_fault_wrap_as(struct lb_provider *inner, int64_t create_timeout_ms, const char *name,
                           const char *points, bool owns_inner, struct lb_provider **out)
{
    struct fault_provider *f = calloc(1, sizeof(*f));

    if (!f)
        return -ENOMEM;
    if (strlen(name) >= sizeof(f->name) || strlen(points) >= sizeof(f->points)) {
        free(f);
        return -EINVAL;
    }
    f->inner = inner;
    f->create_timeout_ms = create_timeout_ms;
    f->owns_inner = owns_inner;
    snprintf(f->name, sizeof(f->name), "%s", name);
    snprintf(f->points, sizeof(f->points), "%s", points);
    f->ops = (struct lb_provider_ops){
        .name = f->name,
        .version = LB_PROVIDER_OPS_VERSION,
        .caps = fault_caps,
        .create = fault_create,
        .stop = fault_stop,
        .status = fault_status,
        .exec = fault_exec,
        .file_write = fault_file_write,
        .upload_begin = fault_upload_begin,
        .file_open = fault_file_open,
        .list = fault_list,
        .pause = fault_pause,
        .resume = fault_resume,
        .endpoint = fault_endpoint,
        .oom_kills = fault_oom_kills,
        .end_execs = fault_end_execs,
        .defer_cleanup = fault_defer_cleanup,
        .stop_begin = fault_stop_begin,
        .snapshot = fault_snapshot,
        .snapshot_sweep = fault_snapshot_sweep,
        .reset_in_place = fault_reset_in_place,
        .hand_over = fault_hand_over,
        .destroy = fault_destroy,
        .usage = fault_usage,
        .archive_put = fault_archive_put,
        .archive_get = fault_archive_get,
    };
    f->base.ops = &f->ops;
    *out = &f->base;
    return 0;
}
