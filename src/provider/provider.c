/* provider.c - see provider.h: call-through helpers and small shared pieces. */
#include "provider/provider.h"

#include <errno.h>
#include <string.h>

const char *provider_status_name(enum lb_sandbox_status s)
{
    switch (s) {
    case LB_STATUS_STARTING:
        return "starting";
    case LB_STATUS_RUNNING:
        return "running";
    case LB_STATUS_PAUSED:
        return "paused";
    case LB_STATUS_STOPPED:
        return "stopped";
    case LB_STATUS_ERROR:
        return "error";
    case LB_STATUS_UNKNOWN:
        break;
    }
    return "unknown";
}

void provider_exec_result_release(struct lb_exec_result *res)
{
    if (!res)
        return;
    lb_buf_release(&res->out);
    lb_buf_release(&res->err);
}

static int no_op(struct lb_provider *p, const char *what, struct lb_error *err)
{
    return lb_error_set(err, -ENOSYS, "provider '%s' does not support %s",
                        p && p->ops && p->ops->name ? p->ops->name : "?", what);
}

int provider_create(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                    const struct lb_sandbox_spec *spec, json_t **descriptor_out,
                    struct lb_error *err)
{
    if (!p || !p->ops->create)
        return no_op(p, "create", err);
    return p->ops->create(p, ref, spec, descriptor_out, err);
}

int provider_stop(struct lb_provider *p, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                  struct lb_error *err)
{
    if (!p || !p->ops->stop)
        return no_op(p, "stop", err);
    return p->ops->stop(p, ref, timeout_ms, err);
}

int provider_status(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                    enum lb_sandbox_status *out, struct lb_error *err)
{
    if (!p || !p->ops->status)
        return no_op(p, "status", err);
    return p->ops->status(p, ref, out, err);
}

int provider_exec(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                  const struct lb_exec_request *req, struct lb_exec_result *res,
                  struct lb_error *err)
{
    if (!p || !p->ops->exec)
        return no_op(p, "exec", err);
    return p->ops->exec(p, ref, req, res, err);
}

int provider_file_write(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                        const void *data, size_t len, int mode, struct lb_error *err)
{
    if (!p || !p->ops->file_write)
        return no_op(p, "file writes", err);
    return p->ops->file_write(p, ref, path, data, len, mode, err);
}

int provider_file_open(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                       int *fd_out, uint64_t *size_out, struct lb_error *err)
{
    if (!p || !p->ops->file_open)
        return no_op(p, "file reads", err);
    return p->ops->file_open(p, ref, path, fd_out, size_out, err);
}

/* *out zeroed, then op (p's archive_put or archive_get, NULL when p has none). */
static int archive_call(lb_provider_archive_fn *op, struct lb_provider *p,
                        const struct lb_sandbox_ref *ref, const char *dir, int fd,
                        uint64_t max_bytes, struct lb_archive_result *out, struct lb_error *err)
{
    *out = (struct lb_archive_result){0};
    if (!op)
        return no_op(p, "archive transfers", err);
    return op(p, ref, dir, fd, max_bytes, out, err);
}

int provider_archive_put(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *dir,
                         int fd, uint64_t max_bytes, struct lb_archive_result *out,
                         struct lb_error *err)
{
    return archive_call(p ? p->ops->archive_put : NULL, p, ref, dir, fd, max_bytes, out, err);
}

int provider_archive_get(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *dir,
                         int fd, uint64_t max_bytes, struct lb_archive_result *out,
                         struct lb_error *err)
{
    return archive_call(p ? p->ops->archive_get : NULL, p, ref, dir, fd, max_bytes, out, err);
}

int provider_upload_begin(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *path,
                          int mode, const char *owner, struct lb_upload **out, struct lb_error *err)
{
    *out = NULL;
    if (!p || !p->ops->upload_begin)
        return no_op(p, "streamed uploads", err);
    return p->ops->upload_begin(p, ref, path, mode, owner, out, err);
}

int provider_upload_commit(struct lb_upload *u, struct lb_error *err)
{
    return u->provider->ops->upload_commit(u, err);
}

void provider_upload_abort(struct lb_upload *u)
{
    if (u)
        u->provider->ops->upload_abort(u);
}

int provider_upload_error(struct lb_upload *u, int errnum, uint64_t bytes, struct lb_error *err)
{
    if (u->provider->ops->upload_error)
        return u->provider->ops->upload_error(u, errnum, bytes, err);
    if (errnum == ENOSPC || errnum == EDQUOT || errnum == EFBIG)
        return lb_error_set(err, -EFBIG, "no space left in the sandbox after %llu bytes",
                            (unsigned long long)bytes);
    return lb_error_set(err, -EREMOTEIO, "writing the upload failed: %s", strerror(errnum));
}

int provider_upload_reserve(struct lb_upload *u, uint64_t need, uint64_t want, struct lb_error *err)
{
    if (u->provider->ops->upload_reserve)
        return u->provider->ops->upload_reserve(u, need, want, err);
    return 0;
}

int provider_list(struct lb_provider *p, json_t **out, struct lb_error *err)
{
    if (!p || !p->ops->list)
        return no_op(p, "list", err);
    return p->ops->list(p, out, err);
}

/* Does the provider say it can pause (caps.pause) and have the op? */
static bool can_pause(struct lb_provider *p, bool resume)
{
    struct lb_provider_caps c;

    if (!p || !(resume ? p->ops->resume : p->ops->pause))
        return false;
    provider_caps(p, &c);
    return c.pause;
}

int provider_pause(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_error *err)
{
    if (!can_pause(p, false))
        return no_op(p, "pause", err);
    return p->ops->pause(p, ref, err);
}

int provider_resume(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_error *err)
{
    if (!can_pause(p, true))
        return no_op(p, "resume", err);
    return p->ops->resume(p, ref, err);
}

int provider_endpoint(struct lb_provider *p, const struct lb_sandbox_ref *ref, int port,
                      char **url_out, struct lb_error *err)
{
    if (!p || !p->ops->endpoint)
        return no_op(p, "service endpoints", err);
    return p->ops->endpoint(p, ref, port, url_out, err);
}

int provider_end_execs(struct lb_provider *p)
{
    return p && p->ops->end_execs ? p->ops->end_execs(p) : 0;
}

void provider_defer_cleanup(struct lb_provider *p)
{
    if (p && p->ops->defer_cleanup)
        p->ops->defer_cleanup(p);
}

void provider_stop_begin(struct lb_provider *p, const struct lb_sandbox_ref *ref)
{
    if (p && p->ops->stop_begin)
        p->ops->stop_begin(p, ref);
}

int provider_oom_kills(struct lb_provider *p, const struct lb_sandbox_ref *ref, uint64_t *count,
                       int64_t *limit_bytes, struct lb_error *err)
{
    if (!p || !p->ops->oom_kills)
        return no_op(p, "oom_kills", err);
    return p->ops->oom_kills(p, ref, count, limit_bytes, err);
}

int provider_snapshot(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *dest,
                      bool flatten, struct lb_error *err)
{
    if (!p || !p->ops->snapshot)
        return no_op(p, "snapshot", err);
    return p->ops->snapshot(p, ref, dest, flatten, err);
}

int provider_usage(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_usage *out,
                   struct lb_error *err)
{
    *out = (struct lb_usage){-1, -1, -1, -1, -1, -1};
    if (!p || !p->ops->usage)
        return no_op(p, "usage", err);
    return p->ops->usage(p, ref, out, err);
}

int provider_reset_in_place(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                            const struct lb_sandbox_spec *spec, const char *hostname,
                            int64_t timeout_ms, struct lb_error *err)
{
    if (!p || !p->ops->reset_in_place)
        return lb_error_set(err, -EOPNOTSUPP, "the provider resets only by a stop and a create");
    return p->ops->reset_in_place(p, ref, spec, hostname, timeout_ms, err);
}

int provider_hand_over(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *new_id,
                       json_t **desc_out, struct lb_error *err)
{
    *desc_out = NULL;
    if (!p || !p->ops->hand_over)
        return lb_error_set(err, -EOPNOTSUPP, "the provider cannot give a sandbox another id");
    return p->ops->hand_over(p, ref, new_id, desc_out, err);
}

int provider_snapshot_sweep(struct lb_provider *p, struct lb_error *err)
{
    if (!p || !p->ops->snapshot_sweep)
        return 0;
    return p->ops->snapshot_sweep(p, err);
}

void provider_destroy(struct lb_provider *p)
{
    if (p && p->ops->destroy)
        p->ops->destroy(p);
}

bool provider_path_is_valid(const char *path)
{
    const char *c;
    size_t len;

    if (!path || path[0] != '/')
        return false;
    len = strnlen(path, 4097);
    if (len > 4096)
        return false;
    if (len == 1)
        return true;
    if (path[len - 1] == '/')
        return false;
    /* Every component (between slashes) is non-empty and neither "." nor "..". */
    for (c = path; *c;) {
        const char *start = c + 1, *end = strchr(start, '/');
        size_t n = end ? (size_t)(end - start) : strlen(start);

        if (n == 0 || (n == 1 && start[0] == '.') || (n == 2 && start[0] == '.' && start[1] == '.'))
            return false;
        c = start + n;
    }
    return true;
}

void provider_caps(struct lb_provider *p, struct lb_provider_caps *out)
{
    memset(out, 0, sizeof(*out));
    if (p && p->ops->caps)
        p->ops->caps(p, out);
}

/* Is user (not NULL) root or numeric ids only: "root", UID or UID:GID? */
static bool user_is_numeric(const char *user)
{
    size_t n = strspn(user, "0123456789");

    if (!strcmp(user, "root"))
        return true;
    if (n == 0)
        return false;
    if (user[n] == ':')
        user += n + 1, n = strspn(user, "0123456789");
    return n > 0 && user[n] == '\0';
}

int provider_check_exec(struct lb_provider *p, const struct lb_exec_request *req,
                        struct lb_error *err)
{
    struct lb_provider_caps c;

    provider_caps(p, &c);
    if (req->user && *req->user && !c.users && !user_is_numeric(req->user))
        return lb_error_set(err, -EOPNOTSUPP,
                            "user '%.64s' cannot be enforced by provider '%s': it runs commands "
                            "as root or a numeric uid, not a user named in the sandbox",
                            req->user, p && p->ops->name ? p->ops->name : "?");
    if (req->exclusive && !c.exclusive)
        return lb_error_set(err, -EOPNOTSUPP,
                            "exclusive cannot be enforced by provider '%s': the sandbox's root "
                            "can reach what would run or report the command",
                            p && p->ops->name ? p->ops->name : "?");
    if (req->exclusive && !req->agent_root && !c.trusted_view)
        return lb_error_set(err, -EOPNOTSUPP,
                            "exclusive cannot run on the base image with provider '%s' (the "
                            "sandbox's root is the agent's): ask for \"agent_root\": true to "
                            "grade on it, accepting what the agent changed there",
                            p && p->ops->name ? p->ops->name : "?");
    return 0;
}

int provider_check_spec(struct lb_provider *p, const struct lb_sandbox_spec *spec,
                        struct lb_error *err)
{
    const char *name = p && p->ops->name ? p->ops->name : "?";
    const char *access = spec->network.access;
    const struct lb_resources *res = &spec->resources;
    struct lb_provider_caps c;
    const char *field = NULL;

    provider_caps(p, &c);
    if (res->cpu > 0 && !c.cpu_limit)
        field = "resources.cpu";
    else if (res->memory_mib > 0 && !c.memory_limit)
        field = "resources.memory_mib";
    else if (res->pids > 0 && !c.pids_limit)
        field = "resources.pids";
    else if (res->disk_mib > 0 && !c.disk_limit)
        field = "resources.disk_mib";
    else if (res->gpu > 0 && !c.gpu)
        field = "resources.gpu";
    else if (res->gpu_type && !c.gpu)
        field = "resources.gpu_type";
    else if (spec->n_ports > 0 && !c.endpoints)
        field = "ports";
    else if (spec->image && strcmp(spec->image, "host") != 0 && !c.images)
        field = "image";
    if (field)
        return lb_error_set(err, -EOPNOTSUPP, "%s cannot be enforced by provider '%s'", field,
                            name);
    if (access &&
        ((!strcmp(access, "model_only") && !(c.network_modes & LB_NET_MODEL_ONLY)) ||
         (!strcmp(access, "model_and_tools") && !(c.network_modes & LB_NET_MODEL_AND_TOOLS))))
        return lb_error_set(err, -EOPNOTSUPP,
                            "network access '%s' cannot be enforced by provider '%s'", access,
                            name);
    return 0;
}

int provider_archive_name_normalise(const char *in, char *out, size_t size, int max_parts)
{
    const char *c;
    size_t n;
    int parts = 0;

    if (!in || in[0] == '/')
        return -EINVAL;
    while (in[0] == '.' && in[1] == '/') {
        in += 2;
        while (*in == '/')
            in++;
    }
    n = strlen(in);
    while (n > 0 && in[n - 1] == '/')
        n--;
    if (n == 0 || (n == 1 && in[0] == '.'))
        return 1;
    if (n >= size)
        return -EINVAL;
    memcpy(out, in, n);
    out[n] = '\0';
    for (c = out; *c; parts++) {
        size_t len = strcspn(c, "/");

        if (len == 0 || len > 255 || (len == 2 && c[0] == '.' && c[1] == '.') ||
            (len == 1 && c[0] == '.') || (max_parts > 0 && parts == max_parts))
            return -EINVAL;
        c += len;
        if (*c == '/')
            c++;
    }
    return 0;
}

bool provider_archive_link_inside(const char *name, const char *target)
{
    long depth = 0;
    bool descended = false;
    const char *c;

    if (!target[0] || target[0] == '/')
        return false;
    for (c = name; *c; c++) /* the link's directory's depth below DIR */
        if (*c == '/')
            depth++;
    for (c = target; *c;) {
        size_t len = strcspn(c, "/");

        if (len == 2 && c[0] == '.' && c[1] == '.') {
            if (descended || --depth < 0)
                return false;
        } else if (len > 0 && !(len == 1 && c[0] == '.')) {
            descended = true;
        }
        c += len;
        if (*c == '/')
            c++;
    }
    return true;
}
