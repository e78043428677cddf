/* fault.c (provider) - see fault.h. */
#include "provider/fault.h"

#include <errno.h>
#include <stdlib.h>

#include "util/fault.h"

struct fault_provider {
    struct lb_provider base;
    struct lb_provider *inner;
    int64_t create_timeout_ms;
    struct lb_provider_ops ops;
};

#define INNER(p) (((struct fault_provider *)(p))->inner)

/* Injected failures look like provider failures. */
static int fault_as_provider(int r)
{
    return r == -ETIMEDOUT ? r : -EREMOTEIO;
}

static int fault_create(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                        const struct lb_sandbox_spec *spec, json_t **out, struct lb_error *err)
{
    int r = fault_hit("provider.create", ((struct fault_provider *)p)->create_timeout_ms, err);

    return r < 0 ? fault_as_provider(r) : provider_create(INNER(p), ref, spec, out, err);
}

static int fault_stop(struct lb_provider *p, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                      struct lb_error *err)
{
    int r = fault_hit("provider.stop", timeout_ms, err);

    return r < 0 ? fault_as_provider(r) : provider_stop(INNER(p), ref, timeout_ms, err);
}

static int fault_status(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                        enum lb_sandbox_status *out, struct lb_error *err)
{
    int r = fault_hit("provider.status", 0, err);

    return r < 0 ? fault_as_provider(r) : provider_status(INNER(p), ref, out, err);
}

static int fault_exec(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                      const struct lb_exec_request *req, struct lb_exec_result *res,
                      struct lb_error *err)
{
    int r = fault_hit("provider.exec", req->timeout_ms, err);

    return r < 0 ? fault_as_provider(r) : provider_exec(INNER(p), ref, req, res, err);
}

static int fault_file_write(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                            const char *path, const void *data, size_t len, int mode,
                            struct lb_error *err)
{
    int r = fault_hit("provider.file_write", 0, err);

    return r < 0 ? fault_as_provider(r)
                 : provider_file_write(INNER(p), ref, path, data, len, mode, err);
}

static int fault_upload_begin(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                              const char *path, int mode, struct lb_upload **out,
                              struct lb_error *err)
{
    int r = fault_hit("provider.file_write", 0, err);

    return r < 0 ? fault_as_provider(r)
                 : provider_upload_begin(INNER(p), ref, path, mode, out, err);
}

static int fault_file_open(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                           const char *path, int *fd, uint64_t *size, struct lb_error *err)
{
    int r = fault_hit("provider.file_open", 0, err);

    return r < 0 ? fault_as_provider(r) : provider_file_open(INNER(p), ref, path, fd, size, err);
}

static int fault_list(struct lb_provider *p, json_t **out, struct lb_error *err)
{
    int r = fault_hit("provider.list", 0, err);

    return r < 0 ? fault_as_provider(r) : provider_list(INNER(p), out, err);
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

static int fault_end_execs(struct lb_provider *p)
{
    return provider_end_execs(INNER(p));
}

static void fault_destroy(struct lb_provider *p)
{
    provider_destroy(INNER(p));
    free(p);
}

int provider_fault_wrap(struct lb_provider *inner, int64_t create_timeout_ms,
                        struct lb_provider **out)
{
    struct fault_provider *f = calloc(1, sizeof(*f));

    if (!f)
        return -ENOMEM;
    f->inner = inner;
    f->create_timeout_ms = create_timeout_ms;
    f->ops = (struct lb_provider_ops){
        .name = inner->ops->name, /* records keep the real provider's name */
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
        .destroy = fault_destroy,
    };
    f->base.ops = &f->ops;
    *out = &f->base;
    return 0;
}
