/*
 * docker.c - the Docker Engine API provider (see docker.h): its engine hooks (engine.h) for
 * containers (create, start, remove, inspect, pause, list), the ops table, construction (API
 * negotiation, the supervisor's read-only copy, the pass dirs). The exec hook is in
 * docker_exec.c, the file transfer in docker_files.c, the transport (docker_call) and a
 * sandbox's names in docker_api.c.
 */
#include "provider/docker/docker_internal.h"

#include <curl/curl.h>
#include <dirent.h>
#include <limits.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/fault.h"
#include "util/log.h"
#include "util/token.h"

#define API_MAX_MAJOR 1
#define API_MAX_MINOR 43
#define API_MIN_MINOR 40

/* Remove a sandbox's pass dir and the links left in it (idempotent). */
static void remove_pass_dir(const struct lb_docker *d, const char *id)
{
    char dir[PATH_MAX];
    struct dirent *e;
    DIR *dp;

    docker_pass_dir(d, id, dir, sizeof(dir));
    dp = opendir(dir);
    if (!dp)
        return;
    while ((e = readdir(dp)))
        if (e->d_name[0] != '.')
            (void)unlinkat(dirfd(dp), e->d_name, 0);
    closedir(dp);
    (void)rmdir(dir);
}

/* The engine's answer as an error: 404 -ENOENT, else -EREMOTEIO naming what was tried. */
static int engine_error(const struct lb_httpc_response *resp, const char *what,
                        struct lb_error *err)
{
    char m[300];

    httpc_json_message(resp, "message", m, sizeof(m));
    return lb_error_set(err, resp->status == 404 ? -ENOENT : -EREMOTEIO,
                        "docker engine: %s failed (HTTP %ld): %s", what, resp->status, m);
}

static json_t *new_descriptor(const char *name, const char *cid)
{
    return json_pack("{s:s,s:s}", "container", name, "container_id", cid ? cid : "");
}

/* The container of a sandbox, found by name: its Id if it carries our labels. 0, -ENOENT
 * (no such container) or -EREMOTEIO (an engine failure or a container that is not ours). */
static int find_own(struct lb_docker *d, const char *id, char *cid, size_t cid_size,
                    struct lb_error *err)
{
    char path[512], name[256];
    json_t *j = NULL, *labels;
    int r;

    docker_name(d, id, name, sizeof(name));
    snprintf(path, sizeof(path), "/containers/%s/json", name);
    r = engine_get_json(&d->eng, path, "inspect", d->eng.create_timeout_ms, &j, err);
    if (r < 0)
        return r;
    labels = json_object_get(json_object_get(j, "Config"), "Labels");
    if (!json_is_string(json_object_get(j, "Id")) ||
        strcmp(json_string_value(json_object_get(labels, DOCKER_LABEL_INSTANCE)) ?: "",
               d->eng.instance) != 0 ||
        strcmp(json_string_value(json_object_get(labels, DOCKER_LABEL_SANDBOX)) ?: "", id) != 0)
        r = lb_error_set(err, -EREMOTEIO,
                         "container '%s' exists but does not carry this daemon's labels", name);
    else
        snprintf(cid, cid_size, "%s", json_string_value(json_object_get(j, "Id")));
    json_decref(j);
    return r;
}

static int remove_container(struct lb_docker *d, const char *name, int64_t timeout_ms,
                            struct lb_error *err)
{
    struct lb_httpc_response resp;
    char path[512];
    int r;

    snprintf(path, sizeof(path), "/containers/%s?force=true&v=true", name);
    r = docker_call(d, "DELETE", path, NULL, timeout_ms, &resp, err);
    if (r == 0 && resp.status != 204 && resp.status != 200 && resp.status != 404)
        r = engine_error(&resp, "remove", err);
    httpc_response_release(&resp);
    return r == -ENOENT ? 0 : r;
}

static json_t *create_body(struct lb_docker *d, const char *id, const struct lb_sandbox_spec *spec,
                           const char *image)
{
    const char *workdir = spec->workdir ? spec->workdir : "/workspace";
    json_t *body = NULL, *host, *tmpfs, *binds;
    char opt[64], bind[PATH_MAX + 64];

    char pass[PATH_MAX + 64], pass_dir[PATH_MAX];

    snprintf(bind, sizeof(bind), "%s:%s:ro", d->supervise_dir, DOCKER_SUPERVISE_DIR);
    docker_pass_dir(d, id, pass_dir, sizeof(pass_dir));
    snprintf(pass, sizeof(pass), "%s:%s:rw", pass_dir, DOCKER_PASS_PATH);
    if (spec->resources.disk_mib > 0)
        snprintf(opt, sizeof(opt), "rw,size=%lldm,mode=1777", (long long)spec->resources.disk_mib);
    else
        snprintf(opt, sizeof(opt), "rw,mode=1777");
    tmpfs = json_object();
    binds = json_pack("[s,s]", bind, pass);
    host = json_object();
    if (!tmpfs || !binds || !host)
        goto fail;
    json_object_set_new(tmpfs, workdir, json_string(opt));
    if (strcmp(workdir, "/tmp") != 0)
        json_object_set_new(tmpfs, "/tmp", json_string(opt));
    json_object_set_new(host, "Binds", binds);
    binds = NULL;
    json_object_set_new(host, "Tmpfs", tmpfs);
    tmpfs = NULL;
    json_object_set_new(host, "NetworkMode", json_string("none"));
    if (spec->resources.cpu > 0)
        json_object_set_new(host, "NanoCpus",
                            json_integer((json_int_t)(spec->resources.cpu * 1e9)));
    if (spec->resources.memory_mib > 0) {
        json_object_set_new(host, "Memory",
                            json_integer((json_int_t)spec->resources.memory_mib << 20));
        json_object_set_new(host, "MemorySwap",
                            json_integer((json_int_t)spec->resources.memory_mib << 20));
    }
    if (spec->resources.pids > 0)
        json_object_set_new(host, "PidsLimit", json_integer(spec->resources.pids));
    body = json_pack("{s:s,s:[s,s,s,s],s:s,s:{s:s,s:s},s:b,s:o}", "Image", image, "Cmd",
                     DOCKER_SUPERVISE_PATH, "--init", "--ready-fd", "1", "WorkingDir", workdir,
                     "Labels", DOCKER_LABEL_INSTANCE, d->eng.instance, DOCKER_LABEL_SANDBOX, id,
                     "NetworkDisabled", 1, "HostConfig", host);
    if (body)
        json_object_set_new(body, "Entrypoint", json_array()); /* the image's would wrap ours */
    return body;
fail:
    json_decref(tmpfs);
    json_decref(binds);
    json_decref(host);
    return NULL;
}

static int hook_prepare(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                        const struct lb_sandbox_spec *spec, struct engine_instance *inst,
                        struct lb_error *err)
{
    struct lb_docker *d = (struct lb_docker *)e;
    char pass_dir[PATH_MAX];
    int r;

    r = engine_check_network(e, spec, err);
    if (r < 0)
        return r;
    docker_name(d, ref->id, inst->name, sizeof(inst->name));
    docker_pass_dir(d, ref->id, pass_dir, sizeof(pass_dir));
    if (mkdir(pass_dir, 0700) < 0 && errno != EEXIST)
        return lb_error_set(err, -EREMOTEIO, "cannot make '%s': %s", pass_dir, strerror(errno));
    return 0;
}

static int hook_make(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                     const struct lb_sandbox_spec *spec, const char *image, int64_t timeout_ms,
                     struct engine_instance *inst, struct lb_error *err)
{
    struct lb_docker *d = (struct lb_docker *)e;
    struct lb_httpc_response resp = {0};
    char path[512], m[300];
    json_t *body, *j = NULL;
    int r;

    body = create_body(d, ref->id, spec, image);
    if (!body)
        return lb_error_set(err, -ENOMEM, "out of memory");
    snprintf(path, sizeof(path), "/containers/create?name=%s", inst->name);
    r = docker_call(d, "POST", path, body, timeout_ms, &resp, err);
    if (r < 0)
        goto out;
    if (resp.status == 201) {
        j = json_loadb(resp.body.data, resp.body.len, 0, NULL);
        snprintf(inst->handle, sizeof(inst->handle), "%s",
                 json_string_value(json_object_get(j, "Id")) ?: "");
    } else if (resp.status == 409 ||
               (resp.status == 500 &&
                strstr(httpc_json_message(&resp, "message", m, sizeof(m)), "already in use"))) {
        r = -EEXIST;
    } else if (resp.status == 404) {
        r = lb_error_set(err, -LB_E_IMAGE_NOT_FOUND, "docker engine has no image '%s': %s", image,
                         httpc_json_message(&resp, "message", m, sizeof(m)));
    } else {
        r = engine_error(&resp, "container create", err);
        if (r == -ENOENT)
            r = -EREMOTEIO;
    }
out:
    json_decref(j);
    json_decref(body);
    httpc_response_release(&resp);
    return r;
}

static int hook_find_own(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                         struct engine_instance *inst, struct lb_error *err)
{
    return find_own((struct lb_docker *)e, ref->id, inst->handle, sizeof(inst->handle), err);
}

static int hook_start(struct lb_engine *e, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                      struct engine_instance *inst, struct lb_error *err)
{
    struct lb_docker *d = (struct lb_docker *)e;
    struct lb_httpc_response resp = {0};
    char path[512];
    int r;

    snprintf(path, sizeof(path), "/containers/%s/start", inst->name);
    r = docker_call(d, "POST", path, NULL, timeout_ms, &resp, err);
    if (r == 0 && resp.status != 204 && resp.status != 304) {
        r = engine_error(&resp, "container start", err);
        r = -EREMOTEIO;
    }
    httpc_response_release(&resp);
    return r;
}

static int hook_finish(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                       const struct lb_sandbox_spec *spec, struct engine_instance *inst,
                       json_t **out, struct lb_error *err)
{
    *out = new_descriptor(inst->name, inst->handle);
    return *out ? 0 : lb_error_set(err, -ENOMEM, "out of memory");
}

static void hook_rollback(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                          const struct engine_instance *inst, bool made)
{
    struct lb_docker *d = (struct lb_docker *)e;
    struct lb_error rerr = {0};

    if (!made) {
        remove_pass_dir(d, ref->id);
        return;
    }
    if (remove_container(d, inst->name, d->eng.create_timeout_ms, &rerr) < 0)
        log_warn_sbx(ref->id, "docker: cannot remove container %s of a failed create: %s",
                     inst->name, rerr.message);
}

static int hook_remove(struct lb_engine *e, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                       struct lb_error *err)
{
    struct lb_docker *d = (struct lb_docker *)e;
    char name[256];
    int r;

    docker_name(d, ref->id, name, sizeof(name));
    r = remove_container(d, name, timeout_ms, err);
    if (r == 0)
        remove_pass_dir(d, ref->id);
    return r;
}

/* A container's State.Status and the status it means (a container that ended is an error). */
static const struct engine_state_name docker_states[] = {
    {"running", LB_STATUS_RUNNING},  {"paused", LB_STATUS_PAUSED},
    {"created", LB_STATUS_STARTING}, {"configured", LB_STATUS_STARTING},
    {"exited", LB_STATUS_ERROR},     {"dead", LB_STATUS_ERROR},
    {"stopped", LB_STATUS_ERROR},    {NULL, LB_STATUS_UNKNOWN},
};

int docker_state(struct lb_docker *d, const char *id, enum lb_sandbox_status *out,
                 struct lb_error *err)
{
    struct lb_httpc_response resp;
    char path[512], name[256];
    int r;

    docker_name(d, id, name, sizeof(name));
    snprintf(path, sizeof(path), "/containers/%s/json", name);
    r = docker_call(d, "GET", path, NULL, 30000, &resp, err);
    if (r == 0 && engine_state_answer(&resp, "State", "Status", docker_states, out) < 0)
        r = engine_error(&resp, "inspect", err); /* not 404: -EREMOTEIO */
    httpc_response_release(&resp);
    return r;
}

static int hook_state(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                      enum lb_sandbox_status *out, struct lb_error *err)
{
    return docker_state((struct lb_docker *)e, ref->id, out, err);
}

static int hook_set_frozen(struct lb_engine *e, const struct lb_sandbox_ref *ref, bool pause,
                           struct lb_error *err)
{
    struct lb_docker *d = (struct lb_docker *)e;
    struct lb_httpc_response resp;
    char path[512], name[256];
    int r;

    docker_name(d, ref->id, name, sizeof(name));
    snprintf(path, sizeof(path), "/containers/%s/%s", name, pause ? "pause" : "unpause");
    r = docker_call(d, "POST", path, NULL, 30000, &resp, err);
    if (r == 0 && resp.status != 204 && resp.status != 200)
        r = engine_error(&resp, pause ? "pause" : "unpause", err);
    httpc_response_release(&resp);
    return r;
}

static int hook_list_raw(struct lb_engine *e, json_t **items_out, struct lb_error *err)
{
    return docker_list_ours((struct lb_docker *)e, "/containers/json?all=true&", "container list",
                            items_out, err);
}

static json_t *hook_list_entry(struct lb_engine *e, json_t *c, const char **id_out)
{
    struct lb_docker *d = (struct lb_docker *)e;
    json_t *labels = json_object_get(c, "Labels");
    const char *id = json_string_value(json_object_get(labels, DOCKER_LABEL_SANDBOX));
    const char *inst = json_string_value(json_object_get(labels, DOCKER_LABEL_INSTANCE));
    char name[256];

    if (!id || !inst || strcmp(inst, d->eng.instance) != 0)
        return NULL;
    docker_name(d, id, name, sizeof(name));
    *id_out = id;
    return new_descriptor(name, json_string_value(json_object_get(c, "Id")));
}

/* The usage hook: GET /containers/N/stats, one sample (one-shot: no wait for a second one to
 * work out rates, which it would do without). cpu_stats.cpu_usage.total_usage (ns),
 * memory_stats.usage (bytes, page cache included: the workdir's and /tmp's tmpfs pages are
 * there), memory_stats.max_usage (cgroup v1 Docker; podman and cgroup v2 give none),
 * pids_stats.current, memory_stats.stats.oom_kill where an engine gives it. disk_bytes stays
 * unknown: the container's writable layer (SizeRw of an inspect with size=true) is a walk of
 * what the sandbox wrote there (a diff against the image's whole tree on the vfs driver),
 * too dear for a status read, and the workdir and /tmp, tmpfs mounts, are not in it. */
static int hook_usage(struct lb_engine *e, const struct lb_sandbox_ref *ref, struct lb_usage *out,
                      struct lb_error *err)
{
    struct lb_docker *d = (struct lb_docker *)e;
    json_t *j = NULL, *cpu, *mem;
    char path[512], name[256];
    int64_t ns;
    int r;

    docker_name(d, ref->id, name, sizeof(name));
    snprintf(path, sizeof(path), "/containers/%s/stats?stream=false&one-shot=true", name);
    r = engine_get_json(e, path, "stats", 0, &j, err);
    if (r < 0)
        return r;
    if (!json_is_object(j)) {
        json_decref(j);
        return lb_error_set(err, -EREMOTEIO, "docker engine: unreadable stats");
    }
    cpu = json_object_get(json_object_get(j, "cpu_stats"), "cpu_usage");
    mem = json_object_get(j, "memory_stats");
    ns = engine_usage_figure(json_object_get(cpu, "total_usage"));
    out->cpu_s = ns < 0 ? -1 : (double)ns / 1e9;
    out->memory_bytes = engine_usage_figure(json_object_get(mem, "usage"));
    out->memory_peak_bytes = engine_usage_figure(json_object_get(mem, "max_usage"));
    if (out->memory_peak_bytes == 0) /* an engine that keeps no peak may answer 0 */
        out->memory_peak_bytes = -1;
    out->pids = engine_usage_figure(json_object_get(json_object_get(j, "pids_stats"), "current"));
    out->oom_kills =
        engine_usage_figure(json_object_get(json_object_get(mem, "stats"), "oom_kill"));
    json_decref(j);
    return 0;
}

static void hook_release(struct lb_engine *e)
{
    struct lb_docker *d = (struct lb_docker *)e;

    free(d->pass_dir);
    free(d->supervise_dir);
}

/* Beyond the engine's: users by name, fd passing and exclusive execs (the supervisor is a
 * read-only mount the container cannot replace). Only no network at all, no endpoints, GPUs
 * or terminals; disk_mib bounds its tmpfs workdir and /tmp. */
static void hook_caps(struct lb_engine *e, struct lb_provider_caps *out)
{
    out->users = true;
    out->pass_fd = true;
    out->exclusive = true;
}

static int hook_call(struct lb_engine *e, const char *method, const char *path, const json_t *body,
                     int64_t timeout_ms, struct lb_httpc_response *resp, struct lb_error *err)
{
    return docker_call((struct lb_docker *)e, method, path, body,
                       timeout_ms > 0 ? timeout_ms : 30000, resp, err);
}

static int hook_file_open(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *path,
                          int *fd_out, uint64_t *size_out, struct lb_error *err)
{
    return docker_file_open(e, ref, path, fd_out, size_out, err);
}

static int hook_put_file(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *path,
                         int fd, const void *data, uint64_t len, int mode, struct lb_error *err)
{
    return docker_put_file((struct lb_docker *)e, ref->id, path, fd, data, len, mode, err);
}

static const struct engine_hooks docker_hooks = {
    .name = "docker",
    .noun = "container",
    ENGINE_HOOKS_BY_NAME,
    .exec_check = docker_exec_check,
    .exec_run = docker_exec_run,
    .workdir_archive = docker_workdir_archive,
    .commit = docker_commit,
    .put_archive = docker_put_tar,
    .archive_put = docker_archive_put,
    .archive_get = docker_archive_get,
    .snapshot_images = docker_snapshot_images,
    .image_remove = docker_image_remove,
    .usage = hook_usage,
    .call = hook_call,
    .answer_error = engine_error,
    .engine_label = "the engine",
};

/* /_ping, then the version: the engine's API version, capped at what this code knows. */
static int negotiate(struct lb_docker *d, struct lb_error *err)
{
    struct lb_httpc_request req = {.method = "GET",
                                   .path = "/_ping",
                                   .timeout_ms = 10000,
                                   .max_body_bytes = 4096,
                                   .want_header = "Api-Version"};
    struct lb_httpc_response resp;
    int major = 0, minor = 0, r;
    char base[32];

    r = httpc_do(d->eng.http, &req, &resp, err);
    if (r < 0) {
        r = lb_error_recode(err, -EREMOTEIO, "cannot reach the docker engine");
        goto out;
    }
    if (resp.status != 200 || !resp.header_value ||
        sscanf(resp.header_value, "%d.%d", &major, &minor) != 2) {
        r = lb_error_set(err, -EREMOTEIO,
                         "%s does not answer /_ping like a Docker engine (HTTP %ld)", d->eng.socket,
                         resp.status);
        goto out;
    }
    if (major > API_MAX_MAJOR || (major == API_MAX_MAJOR && minor > API_MAX_MINOR))
        major = API_MAX_MAJOR, minor = API_MAX_MINOR;
    if (major < 1 || (major == 1 && minor < API_MIN_MINOR)) {
        r = lb_error_set(err, -EREMOTEIO, "the docker engine's API %d.%d is older than 1.%d", major,
                         minor, API_MIN_MINOR);
        goto out;
    }
    snprintf(base, sizeof(base), "/v%d.%d", major, minor);
    if (httpc_set_base_path(d->eng.http, base) < 0) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    log_info("docker provider: engine at %s, API %d.%d", d->eng.socket, major, minor);
out:
    httpc_response_release(&resp);
    return r;
}

/* Copy the supervisor at src into dir/supervise (mode 0755; dir made 0755), replacing an
 * older copy atomically (a running container's bind mount of dir sees the new file; execs
 * under way keep the old one). 0 or -errno with err set. */
static int copy_supervisor(const char *src, const char *dir, struct lb_error *err)
{
    char tmp[PATH_MAX], dst[PATH_MAX], buf[65536];
    int in = -1, out = -1, r = 0;
    ssize_t n;

    if ((size_t)snprintf(tmp, sizeof(tmp), "%s/.supervise.new", dir) >= sizeof(tmp) ||
        (size_t)snprintf(dst, sizeof(dst), "%s/supervise", dir) >= sizeof(dst))
        return lb_error_set(err, -ENAMETOOLONG, "the state dir's path is too long");
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return lb_error_set(err, -errno, "cannot make '%s': %s", dir, strerror(errno));
    in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0) {
        r = lb_error_set(err, -errno, "cannot read the supervisor '%s': %s", src, strerror(errno));
        goto out;
    }
    (void)unlink(tmp);
    out = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    if (out < 0) {
        r = lb_error_set(err, -errno, "cannot write '%s': %s", tmp, strerror(errno));
        goto out;
    }
    while ((n = read(in, buf, sizeof(buf))) > 0) {
        for (ssize_t off = 0; off < n;) {
            ssize_t w = write(out, buf + off, (size_t)(n - off));

            if (w < 0) {
                r = lb_error_set(err, -errno, "cannot write '%s': %s", tmp, strerror(errno));
                goto out;
            }
            off += w;
        }
    }
    if (n < 0) {
        r = lb_error_set(err, -errno, "cannot read the supervisor '%s': %s", src, strerror(errno));
        goto out;
    }
    if (fchmod(out, 0755) < 0 || fsync(out) < 0 || close(out) < 0) {
        out = -1;
        r = lb_error_set(err, -errno, "cannot write '%s': %s", tmp, strerror(errno));
        goto out;
    }
    out = -1;
    if (rename(tmp, dst) < 0)
        r = lb_error_set(err, -errno, "cannot place '%s': %s", dst, strerror(errno));
out:
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    if (r < 0)
        (void)unlink(tmp);
    return r;
}

int provider_docker_new(const struct lb_docker_config *cfg, struct lb_provider **out,
                        struct lb_error *err)
{
    struct lb_engine *e;
    struct lb_docker *d;
    int r;

    if (!cfg->engine.socket || !*cfg->engine.socket || !cfg->engine.supervise_path ||
        !cfg->engine.state_dir)
        return lb_error_set(err, -EINVAL,
                            "the docker provider needs docker.socket, the "
                            "supervisor and a state dir");
    r = engine_new(sizeof(*d), &docker_hooks, &cfg->engine, &e, err);
    if (r < 0)
        return r;
    d = (struct lb_docker *)e;
    d->eng.supervise_inside = DOCKER_SUPERVISE_PATH;
    d->eng.create_timeout_ms = cfg->create_timeout_ms > 0 ? cfg->create_timeout_ms : 30000;
    d->max_file_bytes = cfg->max_file_bytes ? cfg->max_file_bytes : UINT64_C(1) << 30;
    if (asprintf(&d->pass_dir, "%s/docker-pass", cfg->engine.state_dir) < 0)
        d->pass_dir = NULL;
    if (asprintf(&d->supervise_dir, "%s/docker-supervise", cfg->engine.state_dir) < 0)
        d->supervise_dir = NULL;
    if (!d->pass_dir || !d->supervise_dir) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    if (mkdir(d->pass_dir, 0700) < 0 && errno != EEXIST) {
        r = lb_error_set(err, -errno, "cannot make '%s': %s", d->pass_dir, strerror(errno));
        goto fail;
    }
    r = copy_supervisor(d->eng.supervise_path, d->supervise_dir, err);
    if (r < 0)
        goto fail;
    r = httpc_new(d->eng.socket, "", &d->eng.http, err);
    if (r < 0)
        goto fail;
    r = negotiate(d, err);
    if (r < 0)
        goto fail;
    log_info("docker provider: instance %s, default image %s", d->eng.instance,
             d->eng.default_image ? d->eng.default_image : "(none)");
    *out = &d->eng.base;
    return 0;
fail:
    d->eng.ops.destroy(&d->eng.base);
    return r;
}
