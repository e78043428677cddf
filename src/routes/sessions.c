/* sessions.c - /v1/sessions: seed, get, list, release (NeMo Gym LentSandboxes). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "provider/provider.h"
#include "routes/routes.h"
#include "util/parallel.h"

struct seed_job {
    char *rsid;
    struct routes_spec_job spec;
};

void routes_spec_release(struct lb_seed_request *req)
{
    for (size_t i = 0; i < req->n_files; i++) {
        free(req->files[i].path);
        free(req->files[i].data);
    }
    free(req->files);
    free(req->ports);
    free((void *)req->net.tool_servers);
    memset(req, 0, sizeof(*req));
}

int routes_spec_job_parse(struct lb_request *req, struct routes_spec_job *j, bool task_required,
                          struct lb_error *err)
{
    int r = http_body_json(req, false, &j->body, err);

    return r < 0 ? r : routes_parse_spec(j->body, &j->req, task_required, err);
}

void routes_spec_job_release(struct routes_spec_job *j)
{
    routes_spec_release(&j->req);
    json_decref(j->body);
}

static void seed_job_free(void *arg)
{
    struct seed_job *j = arg;

    if (j) {
        routes_spec_job_release(&j->spec);
        free(j->rsid);
    }
    free(j);
}

/* The seed body's optional object member v named what, with only the keys in fields: 0 when it
 * is absent or null (nothing to parse), 1 when it is an object to parse, -EINVAL otherwise. */
static int seed_member_object(json_t *v, const char *const *fields, const char *what,
                              struct lb_error *err)
{
    int r;

    if (!v || json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return lb_error_set(err, -EINVAL, "'%s' must be an object", what);
    r = routes_check_fields(v, fields, what, err);
    return r < 0 ? r : 1;
}

static int seed_parse_resources(json_t *res, struct lb_resources *out, struct lb_error *err)
{
    static const char *const fields[] = {"cpu", "memory_mib", "pids", "disk_mib",
                                         "gpu", "gpu_type",   NULL};
    struct lb_resources got = {0};
    /* the integer members and their bounds, which keep the cgroup arithmetic far from overflow;
     * null_ok: null means none (NeMo Gym's SandboxResources) */
    const struct {
        const char *name;
        int64_t *out, lo, hi;
        bool null_ok;
    } ints[] = {
        {"memory_mib", &got.memory_mib, 1, 16777216, false},
        {"pids", &got.pids, 1, 4194304, false},
        {"disk_mib", &got.disk_mib, 1, 16777216, false}, /* limits.max_disk_mib: lend checks it */
        {"gpu", &got.gpu, 0, 1024, true},                /* the provider decides what it can give */
    };
    json_t *cpu, *gpu_type, *v;
    int r = seed_member_object(res, fields, "resources", err);

    if (r <= 0)
        return r;
    cpu = json_object_get(res, "cpu");
    if (cpu && (!json_is_number(cpu) || !(json_number_value(cpu) >= 0.01) ||
                !(json_number_value(cpu) <= 1024)))
        return lb_error_set(err, -EINVAL, "'resources.cpu' must be a number from 0.01 to 1024");
    got.cpu = cpu ? json_number_value(cpu) : 0;
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        v = json_object_get(res, ints[i].name);
        if (!v || (ints[i].null_ok && json_is_null(v)))
            continue;
        if (!json_is_integer(v) || json_integer_value(v) < ints[i].lo ||
            json_integer_value(v) > ints[i].hi)
            return lb_error_set(err, -EINVAL, "'resources.%s' must be an integer from %lld to %lld",
                                ints[i].name, (long long)ints[i].lo, (long long)ints[i].hi);
        *ints[i].out = json_integer_value(v);
    }
    gpu_type = json_object_get(res, "gpu_type");
    if (gpu_type && !json_is_null(gpu_type) &&
        (!json_is_string(gpu_type) || json_string_length(gpu_type) == 0 ||
         json_string_length(gpu_type) > 128))
        return lb_error_set(err, -EINVAL, "'resources.gpu_type' must be a string of 1-128 bytes");
    got.gpu_type = json_is_string(gpu_type) ? json_string_value(gpu_type) : NULL;
    *out = got;
    return 0;
}

/* Check the seed's "network" object and parse it into *out (strings borrowed from net; the
 * tool_servers array is new: routes_spec_release frees it). */
static int seed_parse_network(json_t *net, struct lb_network_request *out, struct lb_error *err)
{
    static const char *const fields[] = {"access", "model_server", "tool_servers", NULL};
    json_t *access, *model, *tools, *v;
    size_t i;
    int r;

    r = seed_member_object(net, fields, "network", err);
    if (r <= 0)
        return r;
    access = json_object_get(net, "access");
    model = json_object_get(net, "model_server");
    tools = json_object_get(net, "tool_servers");
    if (access &&
        (!json_is_string(access) || (strcmp(json_string_value(access), "inherit") &&
                                     strcmp(json_string_value(access), "model_only") &&
                                     strcmp(json_string_value(access), "model_and_tools"))))
        return lb_error_set(err, -EINVAL,
                            "'network.access' must be inherit, model_only or model_and_tools");
    if (model && !json_is_null(model) && !json_is_string(model))
        return lb_error_set(err, -EINVAL, "'network.model_server' must be a URL string");
    if (model && json_is_string(model) &&
        (json_string_length(model) == 0 || json_string_length(model) > 2048))
        return lb_error_set(err, -EINVAL, "'network.model_server' must be 1-2048 bytes");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools) || json_array_size(tools) > 16)
            return lb_error_set(err, -EINVAL,
                                "'network.tool_servers' must be an array of at most 16 URLs");
        json_array_foreach(tools, i, v) {
            if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > 2048)
                return lb_error_set(err, -EINVAL,
                                    "'network.tool_servers' must hold strings of 1-2048 bytes");
        }
    }
    if (access && strcmp(json_string_value(access), "inherit") && !json_is_string(model))
        return lb_error_set(err, -EINVAL, "network access '%s' needs 'network.model_server'",
                            json_string_value(access));
    if (json_array_size(tools) > 0 &&
        !(access && strcmp(json_string_value(access), "model_and_tools") == 0))
        return lb_error_set(err, -EINVAL,
                            "'network.tool_servers' is only allowed with access model_and_tools");
    out->access = json_string_value(access);
    out->model_server = json_string_value(model);
    if (json_array_size(tools) > 0) {
        const char **v_out = calloc(json_array_size(tools) + 1, sizeof(*v_out));

        if (!v_out)
            return lb_error_set(err, -ENOMEM, "out of memory");
        json_array_foreach(tools, i, v)
            v_out[i] = json_string_value(v);
        out->tool_servers = v_out;
    }
    return 0;
}

/* "ports": [int] (declared service ports): each 1..65535, no duplicates, at most
 * LB_MAX_PORTS. Fills req->ports (owned by the request). */
/* Labels are stored with every record and rendered by every listing: bounded, so one seed
 * cannot make each GET /v1/sessions slow (a hostile review sent 300,000 labels). */
#define SEED_LABELS_MAX 64
#define SEED_LABEL_KEY_MAX 128
#define SEED_LABEL_VALUE_MAX 1024

static int seed_check_labels(json_t *labels, struct lb_error *err)
{
    const char *k;
    json_t *v;

    if (json_object_size(labels) > SEED_LABELS_MAX)
        return lb_error_set(err, -EINVAL, "'labels' has %zu entries; at most %d are allowed",
                            json_object_size(labels), SEED_LABELS_MAX);
    json_object_foreach(labels, k, v) {
        if (!*k || strlen(k) > SEED_LABEL_KEY_MAX)
            return lb_error_set(err, -EINVAL, "a label name must be 1 to %d bytes",
                                SEED_LABEL_KEY_MAX);
        if (json_string_length(v) > SEED_LABEL_VALUE_MAX)
            return lb_error_set(err, -EINVAL, "label '%s' is longer than %d bytes", k,
                                SEED_LABEL_VALUE_MAX);
    }
    return 0;
}

int routes_check_labels(json_t *labels, struct lb_error *err)
{
    return seed_check_labels(labels, err);
}

static int seed_parse_ports(json_t *ports, struct lb_seed_request *req, struct lb_error *err)
{
    json_t *v;
    size_t i, k;

    if (!ports || json_is_null(ports))
        return 0;
    if (!json_is_array(ports) || json_array_size(ports) > LB_MAX_PORTS)
        return lb_error_set(err, -EINVAL, "'ports' must be an array of at most %d TCP ports",
                            LB_MAX_PORTS);
    req->ports = calloc(json_array_size(ports) + 1, sizeof(*req->ports));
    if (!req->ports)
        return lb_error_set(err, -ENOMEM, "out of memory");
    json_array_foreach(ports, i, v) {
        json_int_t p = json_is_integer(v) ? json_integer_value(v) : 0;

        if (p < 1 || p > 65535)
            return lb_error_set(err, -EINVAL, "'ports' must hold integers from 1 to 65535");
        for (k = 0; k < req->n_ports; k++) {
            if (req->ports[k] == (int)p)
                return lb_error_set(err, -EINVAL, "port %d is listed twice in 'ports'", (int)p);
        }
        req->ports[req->n_ports++] = (int)p;
    }
    return 0;
}

/* "provider": one of the enabled providers' names (lending says which are: 422 otherwise). */
static int seed_parse_provider(json_t *v, struct lb_seed_request *req, struct lb_error *err)
{
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > 64)
        return lb_error_set(err, -EINVAL, "'provider' must be a provider's name (1-64 bytes)");
    req->provider = json_string_value(v);
    return 0;
}

/* NeMo Gym's SandboxSpec fields beyond the seed's own: workdir, metadata (= labels),
 * ready_timeout_s, entrypoint. */
static int seed_parse_gym(json_t *body, struct lb_seed_request *req, struct lb_error *err)
{
    json_t *workdir = json_object_get(body, "workdir"),
           *entry = json_object_get(body, "entrypoint");
    json_t *metadata = NULL;
    int r = routes_string_map(body, "metadata", &metadata, err);

    if (r < 0)
        return r;
    if (metadata && req->labels)
        return lb_error_set(err, -EINVAL, "give 'metadata' or 'labels' (the same thing), not both");
    if (metadata)
        req->labels = metadata;
    if (workdir && !json_is_null(workdir)) {
        if (!json_is_string(workdir) || json_string_length(workdir) > 4096 ||
            strlen(json_string_value(workdir)) != json_string_length(workdir) ||
            !provider_path_is_valid(json_string_value(workdir)) ||
            strcmp(json_string_value(workdir), "/") == 0)
            return lb_error_set(err, -EINVAL,
                                "'workdir' must be an absolute, normalised path other than '/' "
                                "(at most 4096 bytes)");
        req->workdir = json_string_value(workdir);
    }
    r = routes_parse_seconds(body, "ready_timeout_s", 0, 3600, &req->ready_timeout_ms, err);
    if (r < 0)
        return r;
    if (entry && !json_is_null(entry)) {
        if (!json_is_array(entry))
            return lb_error_set(err, -EINVAL, "'entrypoint' must be an array of strings or null");
        return lb_error_set(err, -EOPNOTSUPP,
                            "'entrypoint' cannot be honoured: the local provider's sandbox init "
                            "is lendbox's own; start services with an exec and "
                            "preserve_background_services");
    }
    return 0;
}

/* "idle_timeout_s" (absent or null: none; else a number of seconds > 0, at most a year) and
 * "on_idle" (absent or null: "stop"; else "stop" or "pause"). -EINVAL (400). */
static int seed_parse_idle(json_t *body, struct lb_seed_request *req, struct lb_error *err)
{
    json_t *idle = json_object_get(body, "idle_timeout_s"), *on = json_object_get(body, "on_idle");

    if (idle && !json_is_null(idle)) {
        if (!json_is_number(idle) || !(json_number_value(idle) > 0) ||
            json_number_value(idle) > 31536000.0)
            return lb_error_set(err, -EINVAL,
                                "'idle_timeout_s' must be a number of seconds > 0 "
                                "and at most 31536000");
        req->idle_timeout_s = json_number_value(idle);
    }
    if (on && !json_is_null(on)) {
        const char *v = json_string_value(on);

        if (!v || (strcmp(v, "stop") != 0 && strcmp(v, "pause") != 0))
            return lb_error_set(err, -EINVAL, "'on_idle' must be \"stop\" or \"pause\"");
        req->on_idle_pause = strcmp(v, "pause") == 0;
    }
    return 0;
}

/* "ready_probe" (absent or null: none; else {"command": a non-empty string without NUL of at
 * most LB_PROBE_COMMAND_MAX bytes, "interval_ms"?: an integer LB_PROBE_INTERVAL_MIN_MS..MAX_MS,
 * default LB_PROBE_INTERVAL_DEFAULT_MS}, no other key). The command is borrowed from body.
 * -EINVAL (400). */
static int seed_parse_probe(json_t *body, struct lb_seed_request *req, struct lb_error *err)
{
    static const char *const fields[] = {"command", "interval_ms", NULL};
    json_t *probe = json_object_get(body, "ready_probe"), *command, *interval;
    int r = seed_member_object(probe, fields, "ready_probe", err);

    if (r <= 0)
        return r;
    command = json_object_get(probe, "command");
    interval = json_object_get(probe, "interval_ms");
    if (!json_is_string(command) || json_string_length(command) == 0 ||
        json_string_length(command) > LB_PROBE_COMMAND_MAX ||
        strlen(json_string_value(command)) != json_string_length(command))
        return lb_error_set(err, -EINVAL,
                            "'ready_probe.command' is required: a shell command of 1-%d bytes "
                            "without NUL",
                            LB_PROBE_COMMAND_MAX);
    req->ready_probe.interval_ms = LB_PROBE_INTERVAL_DEFAULT_MS;
    if (interval && !json_is_null(interval)) {
        if (!json_is_integer(interval) || json_integer_value(interval) < LB_PROBE_INTERVAL_MIN_MS ||
            json_integer_value(interval) > LB_PROBE_INTERVAL_MAX_MS)
            return lb_error_set(err, -EINVAL,
                                "'ready_probe.interval_ms' must be an integer from %d to %d "
                                "(milliseconds)",
                                LB_PROBE_INTERVAL_MIN_MS, LB_PROBE_INTERVAL_MAX_MS);
        req->ready_probe.interval_ms = json_integer_value(interval);
    }
    req->ready_probe.command = json_string_value(command);
    return 0;
}

int routes_parse_spec(json_t *body, struct lb_seed_request *req, bool task_required,
                      struct lb_error *err)
{
    static const char *const fields[] = {
        "task_id",    "files",    "image",          "env",     "ttl_s",       "resources",
        "network",    "labels",   "ports",          "workdir", "metadata",    "ready_timeout_s",
        "entrypoint", "provider", "idle_timeout_s", "on_idle", "ready_probe", NULL};
    json_t *task = json_object_get(body, "task_id"), *image = json_object_get(body, "image");
    json_t *ttl = json_object_get(body, "ttl_s"), *files = json_object_get(body, "files");
    int r = routes_check_fields(body, fields,
                                task_required ? "the seed request" : "the create request", err);

    if (r < 0)
        return r;
    if (task_required || (task && !json_is_null(task))) {
        if (!json_is_string(task) || json_string_length(task) == 0 ||
            json_string_length(task) > 1024)
            return lb_error_set(err, -EINVAL,
                                task_required ? "'task_id' is required: a string of 1-1024 bytes"
                                              : "'task_id' must be a string of 1-1024 bytes");
        req->task_id = json_string_value(task);
    }
    if (image && !json_is_null(image)) {
        if (!json_is_string(image) || json_string_length(image) == 0)
            return lb_error_set(err, -EINVAL, "'image' must be a non-empty string");
        req->image = json_string_value(image);
    }
    r = seed_parse_provider(json_object_get(body, "provider"), req, err);
    if (r < 0)
        return r;
    req->ttl_s = -1;
    if (ttl && !json_is_null(ttl)) {
        if (!json_is_number(ttl) || !(json_number_value(ttl) > 0) ||
            json_number_value(ttl) > 31536000.0)
            return lb_error_set(err, -EINVAL,
                                "'ttl_s' must be a number of seconds > 0 and at most 31536000");
        req->ttl_s = (int64_t)ceil(json_number_value(ttl));
    }
    r = seed_parse_idle(body, req, err);
    if (r == 0)
        r = seed_parse_probe(body, req, err);
    if (r == 0)
        r = routes_string_map(body, "env", &req->env, err);
    if (r == 0)
        r = routes_string_map(body, "labels", &req->labels, err);
    if (r == 0)
        r = seed_parse_resources(json_object_get(body, "resources"), &req->resources, err);
    if (r == 0)
        r = seed_parse_network(json_object_get(body, "network"), &req->net, err);
    if (r == 0)
        r = seed_parse_ports(json_object_get(body, "ports"), req, err);
    if (r == 0)
        r = seed_parse_gym(body, req, err);
    if (r < 0)
        return r;
    if (req->env && (r = routes_check_env_names(req->env, "env", err)) < 0)
        return r;
    if (req->labels && (r = seed_check_labels(req->labels, err)) < 0)
        return r;
    req->network = json_object_get(body, "network");
    if (json_is_null(req->network))
        req->network = NULL;
    return routes_parse_files(files, "'files' must be an object of path -> content", &req->files,
                              &req->n_files, err);
}

static int seed_call(struct lb_app *app, void *arg, json_t **lease, struct lb_error *err)
{
    struct seed_job *j = arg;

    return lend_seed(app->lend, j->rsid, &j->spec.req, lease, err);
}

int route_seed(struct lb_request *req, struct lb_error *err)
{
    struct lb_app *app = http_app(req);
    struct seed_job *j;
    const char *rsid;
    int r = routes_session_param(req, &rsid, err);

    if (r < 0)
        return r;
    if (lend_is_draining(app->lend))
        return lb_error_set(err, -ESHUTDOWN, "the daemon is draining; no new seeds");
    j = calloc(1, sizeof(*j));
    if (!j || !(j->rsid = strdup(rsid))) {
        free(j);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    r = routes_spec_job_parse(req, &j->spec, true, err);
    if (r < 0) {
        seed_job_free(j);
        return r;
    }
    routes_serialize_session(req, rsid);
    return routes_defer_job(req, seed_call, 200, j, seed_job_free, err);
}

int route_session_get(struct lb_request *req, struct lb_error *err)
{
    struct lb_app *app = http_app(req);
    json_t *lease = NULL;
    const char *rsid;
    int r = routes_session_param(req, &rsid, err);

    if (r == 0)
        r = lend_get_lease(app->lend, rsid, &lease, err);
    if (r == 0)
        http_respond_json(req, 200, lease);
    return r;
}

int route_sessions_list(struct lb_request *req, struct lb_error *err)
{
    return routes_respond_list(req, lend_list_leases, err);
}

static void release_run(struct lb_request *req, void *arg)
{
    routes_respond_lend_id(req, lend_release, arg);
}

int route_release(struct lb_request *req, struct lb_error *err)
{
    const char *rsid;
    char *copy;
    json_t *body = NULL;
    int r = routes_session_param(req, &rsid, err);
    static const char *const fields[] = {NULL};

    if (r == 0)
        r = http_body_json(req, true, &body, err);
    if (r == 0)
        r = routes_check_fields(body, fields, "the release request", err);
    json_decref(body);
    if (r < 0)
        return r;
    copy = strdup(rsid);
    if (!copy)
        return lb_error_set(err, -ENOMEM, "out of memory");
    routes_serialize_session(req, rsid);
    return http_defer(req, release_run, copy, free, err);
}

/* ---------- release_all ---------- */

static int release_all_call(struct lb_app *app, void *labels, json_t **out, struct lb_error *err)
{
    return lend_release_all(app->lend, labels, (size_t)app->stop_concurrency, out, err);
}

static void release_all_free(void *arg)
{
    json_decref(arg);
}

int route_release_all(struct lb_request *req, struct lb_error *err)
{
    static const char *const fields[] = {"labels", NULL};
    struct lb_app *app = http_app(req);
    json_t *body = NULL, *labels = NULL;
    int r = http_body_json(req, true, &body, err);

    if (r == 0)
        r = routes_check_fields(body, fields, "the release_all request", err);
    if (r == 0)
        r = routes_string_map(body, "labels", &labels, err);
    if (r == 0 && labels)
        r = seed_check_labels(labels, err);
    if (r == 0 && lend_is_draining(app->lend))
        r = lb_error_set(err, -ESHUTDOWN, "the daemon is draining");
    if (r < 0) {
        json_decref(body);
        return r;
    }
    json_incref(labels); /* NULL-safe; the job owns it */
    json_decref(body);
    return routes_defer_job(req, release_all_call, 200, labels, release_all_free, err);
}

json_t *routes_seed_items_results(const struct routes_seed_item *items, size_t n)
{
    json_t *results = json_array();
    size_t i;

    for (i = 0; results && i < n; i++)
        if (json_array_append_new(results, routes_item_result(items[i].rsid, items[i].r,
                                                              items[i].lease, &items[i].err)) < 0)
            break;
    if (results && i == n)
        return results;
    json_decref(results);
    return NULL;
}

void routes_seed_items_free(struct routes_seed_item *items, size_t n)
{
    for (size_t i = 0; items && i < n; i++) {
        routes_spec_release(&items[i].req);
        json_decref(items[i].body);
        json_decref(items[i].lease);
    }
    free(items);
}

int routes_seeds_job_new(struct lb_request *req,
                         int (*seed)(struct lb_lend *l, const char *rsid,
                                     const struct lb_seed_request *r, json_t **lease_out,
                                     struct lb_error *err),
                         struct routes_seeds_job **out, struct lb_error *err)
{
    struct routes_seeds_job *j;
    int r;

    *out = NULL;
    if (lend_is_draining(((struct lb_app *)http_app(req))->lend))
        return lb_error_set(err, -ESHUTDOWN, "the daemon is draining; no new seeds");
    j = calloc(1, sizeof(*j));
    if (!j)
        return lb_error_set(err, -ENOMEM, "out of memory");
    j->seed = seed;
    r = http_body_json(req, false, &j->body, err);
    if (r < 0) {
        routes_seeds_job_free(j);
        return r;
    }
    *out = j;
    return 0;
}

/* One item's seed (parallel_run's fn): its own slot of j->items only. */
static void seeds_job_item_run(void *arg, size_t i)
{
    struct routes_seeds_job *j = arg;
    struct routes_seed_item *it = &j->items[i];

    if (it->r == 0)
        it->r = j->seed(j->lend, it->rsid, &it->req, &it->lease, &it->err);
}

void routes_seeds_job_seed(struct lb_request *req, struct routes_seeds_job *j, size_t threads)
{
    j->lend = ((struct lb_app *)http_app(req))->lend;
    for (size_t i = 0; i < j->n; i++)
        j->items[i].req.sync_later = true;
    parallel_run(j->n, threads, seeds_job_item_run, j);
    j->sync_r = lend_sync_leases(j->lend, &j->sync_err);
}

void routes_seeds_job_respond(struct lb_request *req, const struct routes_seeds_job *j,
                              const char *key)
{
    json_t *results, *out;
    struct lb_error err = {0};
    int r;

    if (j->sync_r < 0) {
        lb_error_set(&err, j->sync_r,
                     "the leases could not be made durable (%s); the sandboxes are lent "
                     "and recorded: restart lendboxd, then seed a session again to get its lease",
                     j->sync_err.message);
        routes_respond(req, j->sync_r, 200, NULL, &err);
        return;
    }
    results = routes_seed_items_results(j->items, j->n);
    out = results ? json_pack("{s:o}", key, results) : NULL;
    r = out ? 0 : lb_error_set(&err, -ENOMEM, "out of memory");
    routes_respond(req, r, 200, out, &err);
}

void routes_seeds_job_free(void *arg)
{
    struct routes_seeds_job *j = arg;

    if (!j)
        return;
    routes_seed_items_free(j->items, j->n);
    json_decref(j->body);
    free(j);
}
