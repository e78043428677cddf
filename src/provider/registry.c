/*
 * registry.c - see registry.h. The table of provider kinds, each kind's mapping from the
 * daemon's configuration to its own, and the set of opened providers.
 */
#include "provider/registry.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "provider/docker/docker.h"
#include "provider/fault.h"
#include "provider/local/local.h"
#include "provider/local/seccomp.h"
#include "provider/lxd/lxd.h"
#include "util/log.h"

#define REGISTRY_MAX 16

struct lb_registry {
    struct lb_provider *provs[REGISTRY_MAX]; /* [0] is the default */
    size_t n;
};

/* ---------- kinds ---------- */

/* The default uid range of the local provider: derived from the state dir, so that two
 * lendboxd with different state dirs mostly start in different places (the slots themselves
 * are claimed host-wide, see local/slots.c). uid_count slots of 65536 ids, uid_base a multiple of
 * 65536, inside [10^8, 10^9):
 * above the subordinate ids of /etc/subuid (100000 + 65536 * n) and every real user. */
static uint32_t local_default_uid_base(const char *state_dir, uint32_t uid_count)
{
    char *real = realpath(state_dir, NULL);
    const char *p = real ? real : state_dir;
    uint64_t h = 1469598103934665603ull;             /* FNV-1a */
    uint64_t first = (100000000ull + 65535) / 65536; /* in slots: aligned to 65536 */
    uint64_t total = 1000000000ull / 65536 - first, slots;

    for (; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    free(real);
    slots = total > uid_count ? total - uid_count + 1 : 1;
    return (uint32_t)((first + h % slots) * 65536ull);
}

/* [local], [security] and [network] of lb_config -> struct lb_local_config. */
static int local_open(const struct lb_provider_env *env, struct lb_provider **out,
                      struct lb_error *err)
{
    const struct lb_config *cfg = env->cfg;
    struct lb_local_config lc = {
        .state_dir = cfg->state_dir,
        .bwrap_path = cfg->bwrap_path,
        .supervise_path = env->supervise_path,
        .images_dir = env->images_dir,
        .cgroup_parent = cfg->cgroup_parent,
        .uid_base = cfg->uid_base
                        ? (uint32_t)cfg->uid_base
                        : local_default_uid_base(cfg->state_dir, (uint32_t)cfg->uid_count),
        .uid_count = (uint32_t)cfg->uid_count,
        .create_timeout_ms = cfg->create_timeout_s * 1000,
        .tmp_size_mib = cfg->tmp_size_mib,
        .storage = cfg->storage,
        .data_dir = cfg->data_dir,
        .seccomp_off = !cfg->seccomp,
        .seccomp_deny = cfg->seccomp_deny,
        .sandbox_nofile = cfg->sandbox_nofile,
        .reset_in_place = cfg->reset_in_place,
        .net = {.range = cfg->net_range,
                .inherit = cfg->net_inherit,
                .nft_table = cfg->net_nft_table,
                .api_port = env->api_port},
    };
    int r = provider_local_new(&lc, out, err);

    if (r == 0)
        log_info("local provider: sandbox uids %u..%llu (%u slots of 65536)", lc.uid_base,
                 (unsigned long long)lc.uid_base + (unsigned long long)lc.uid_count * 65536 - 1,
                 lc.uid_count);
    return r;
}

/* "fault": the local provider opened before it, under another name and with its own fault
 * points (fault.create, fault.exec, ...), so that tests run two providers side by side. */
static int fault_open(const struct lb_provider_env *env, struct lb_provider **out,
                      struct lb_error *err)
{
    struct lb_provider *local = registry_get(env->opened, "local");
    int r;

    if (!local)
        return lb_error_set(err, -EINVAL,
                            "provider 'fault' is the local provider under another name: enable "
                            "'local' too ([provider] enabled)");
    r = provider_fault_wrap_as(local, env->cfg->create_timeout_s * 1000, "fault", "fault", false,
                               out);
    return r < 0 ? lb_error_set(err, r, "cannot make the fault provider") : 0;
}

/* What an engine-backed kind's config takes from env besides its own section's keys. */
static struct engine_config engine_config_of(const struct lb_provider_env *env, const char *socket,
                                             const char *default_image, const char *instance)
{
    return (struct engine_config){.socket = socket,
                                  .default_image = default_image,
                                  .instance = instance,
                                  .state_dir = env->cfg->state_dir,
                                  .supervise_path = env->supervise_path,
                                  .net_inherit = env->cfg->net_inherit,
                                  .images_dir = env->images_dir};
}

/* [docker] (and [network] inherit, which only "none" satisfies) -> struct lb_docker_config. */
static int docker_open(const struct lb_provider_env *env, struct lb_provider **out,
                       struct lb_error *err)
{
    const struct lb_config *cfg = env->cfg;
    struct lb_docker_config dc = {
        .engine = engine_config_of(env, cfg->docker_socket, cfg->docker_default_image,
                                   cfg->docker_instance),
        .create_timeout_ms = cfg->create_timeout_s * 1000,
        .max_file_bytes = (uint64_t)cfg->max_file_bytes,
    };

    return provider_docker_new(&dc, out, err);
}

/* [lxd] (and [network] inherit, which only "none" satisfies) -> struct lb_lxd_config. */
static int lxd_open(const struct lb_provider_env *env, struct lb_provider **out,
                    struct lb_error *err)
{
    const struct lb_config *cfg = env->cfg;
    struct lb_lxd_config xc = {
        .engine = engine_config_of(env, cfg->lxd_socket, cfg->lxd_default_image, cfg->lxd_instance),
        .url = cfg->lxd_url,
        .cert = cfg->lxd_cert,
        .key = cfg->lxd_key,
        .server_cert = cfg->lxd_server_cert,
        .target = cfg->lxd_target,
        .call_timeout_ms = cfg->lxd_call_timeout_s * 1000,
        .create_concurrency = cfg->lxd_create_concurrency,
        .idmap_base = cfg->lxd_idmap_base,
        .idmap_count = cfg->lxd_idmap_count,
        .supervise_host_path = cfg->lxd_supervise_host_path,
        .create_timeout_ms = cfg->create_timeout_s * 1000,
    };

    return provider_lxd_new(&xc, out, err);
}

/* One row per kind, in the order they are opened. */
static const struct lb_provider_kind registry_kinds[] = {
    {.name = "local", .section = "local", .open = local_open},
    {.name = "docker", .section = "docker", .open = docker_open},
    {.name = "lxd",
     .section = "lxd",
     .open = lxd_open,
     .image_publish = provider_lxd_image_publish},
    {.name = "fault", .section = NULL, .open = fault_open, .fault_wrapped = true},
};

#define N_KINDS (sizeof(registry_kinds) / sizeof(registry_kinds[0]))

const struct lb_provider_kind *registry_find_kind(const char *name)
{
    for (size_t i = 0; name && i < N_KINDS; i++)
        if (strcmp(registry_kinds[i].name, name) == 0)
            return &registry_kinds[i];
    return NULL;
}

void registry_kind_names(char *buf, size_t len)
{
    size_t used = 0;

    if (len == 0)
        return;
    buf[0] = '\0';
    for (size_t i = 0; i < N_KINDS && used < len; i++) {
        int n = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", registry_kinds[i].name);

        if (n < 0)
            break;
        used += (size_t)n;
    }
}

/* ---------- which providers ---------- */

void registry_names_free(char **names)
{
    for (size_t i = 0; names && names[i]; i++)
        free(names[i]);
    free(names);
}

static int registry_names_add(char **names, size_t *n, const char *name, size_t len,
                              struct lb_error *err)
{
    char kinds[256];

    for (size_t i = 0; i < *n; i++)
        if (strlen(names[i]) == len && strncmp(names[i], name, len) == 0)
            return 0; /* a repeat */
    if (*n >= REGISTRY_MAX)
        return lb_error_set(err, -EINVAL, "more than %d providers enabled", REGISTRY_MAX);
    names[*n] = strndup(name, len);
    if (!names[*n])
        return lb_error_set(err, -ENOMEM, "out of memory");
    if (!registry_find_kind(names[*n])) {
        registry_kind_names(kinds, sizeof(kinds));
        lb_error_set(err, -EINVAL, "unknown provider '%s' (this build has: %s)", names[*n], kinds);
        free(names[*n]);
        names[*n] = NULL;
        return -EINVAL;
    }
    (*n)++;
    return 0;
}

int registry_parse_enabled(const char *default_name, const char *enabled, char ***names_out,
                           size_t *n_out, struct lb_error *err)
{
    char **names = calloc(REGISTRY_MAX + 1, sizeof(*names));
    size_t n = 0;
    int r;

    *names_out = NULL;
    *n_out = 0;
    if (!names)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = registry_names_add(names, &n, default_name ? default_name : "",
                           default_name ? strlen(default_name) : 0, err);
    for (const char *p = enabled; r == 0 && p && *p;) {
        size_t len;

        p += strspn(p, " \t,");
        len = strcspn(p, " \t,");
        if (len > 0)
            r = registry_names_add(names, &n, p, len, err);
        p += len;
    }
    if (r < 0) {
        registry_names_free(names);
        return r;
    }
    *names_out = names;
    *n_out = n;
    return 0;
}

/* ---------- the opened set ---------- */

int registry_new(struct lb_registry **out)
{
    *out = calloc(1, sizeof(**out));
    return *out ? 0 : -ENOMEM;
}

int registry_add(struct lb_registry *reg, struct lb_provider *prov, struct lb_error *err)
{
    const char *name = prov->ops->name;
    int r;

    if (prov->ops->version != LB_PROVIDER_OPS_VERSION)
        r = lb_error_set(err, -EINVAL,
                         "provider '%s' implements provider ops version %u, this build wants %u",
                         name, prov->ops->version, LB_PROVIDER_OPS_VERSION);
    else if (registry_get(reg, name))
        r = lb_error_set(err, -EEXIST, "provider '%s' is there twice", name);
    else if (reg->n >= REGISTRY_MAX)
        r = lb_error_set(err, -ENOMEM, "more than %d providers", REGISTRY_MAX);
    else {
        reg->provs[reg->n++] = prov;
        return 0;
    }
    provider_destroy(prov);
    return r;
}

int registry_open(const struct lb_provider_env *env, struct lb_registry **out, struct lb_error *err)
{
    struct lb_provider_env e = *env;
    struct lb_registry *reg = NULL;
    char **names = NULL;
    size_t n = 0;
    int r;

    *out = NULL;
    r = registry_parse_enabled(env->cfg->provider, env->cfg->providers_enabled, &names, &n, err);
    if (r < 0)
        return r;
    if (registry_new(&reg) < 0) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    e.opened = reg;
    /* in the table's order (a kind may use one opened before it) */
    for (size_t k = 0; k < N_KINDS; k++) {
        const struct lb_provider_kind *kind = &registry_kinds[k];
        struct lb_provider *prov = NULL, *wrapped = NULL;
        bool wanted = false;

        for (size_t i = 0; i < n; i++)
            wanted = wanted || strcmp(names[i], kind->name) == 0;
        if (!wanted)
            continue;
        r = kind->open(&e, &prov, err);
        if (r < 0)
            goto out;
        /* always behind the fault switch (a no-op while no fault is set), so that SIGHUP can
         * turn faults on and off */
        if (!kind->fault_wrapped) {
            r = provider_fault_wrap(prov, env->cfg->create_timeout_s * 1000, &wrapped);
            if (r < 0) {
                provider_destroy(prov);
                r = lb_error_set(err, r, "out of memory");
                goto out;
            }
            prov = wrapped;
        }
        r = registry_add(reg, prov, err);
        if (r < 0)
            goto out;
    }
    /* the default goes first; destroying in any order is safe (wrappers that do not own
     * their inner provider leave it alone) */
    for (size_t i = 1; i < reg->n; i++) {
        if (strcmp(reg->provs[i]->ops->name, names[0]) == 0) {
            struct lb_provider *d = reg->provs[i];

            memmove(&reg->provs[1], &reg->provs[0], i * sizeof(reg->provs[0]));
            reg->provs[0] = d;
        }
    }
    *out = reg;
    reg = NULL;
out:
    registry_free(reg);
    registry_names_free(names);
    return r;
}

struct lb_provider *registry_get(const struct lb_registry *reg, const char *name)
{
    for (size_t i = 0; reg && name && i < reg->n; i++)
        if (strcmp(reg->provs[i]->ops->name, name) == 0)
            return reg->provs[i];
    return NULL;
}

struct lb_provider *registry_default(const struct lb_registry *reg)
{
    return reg && reg->n > 0 ? reg->provs[0] : NULL;
}

size_t registry_count(const struct lb_registry *reg)
{
    return reg ? reg->n : 0;
}

struct lb_provider *registry_at(const struct lb_registry *reg, size_t i)
{
    return reg && i < reg->n ? reg->provs[i] : NULL;
}

int registry_choose(const struct lb_registry *reg, const char *requested, struct lb_provider **out,
                    struct lb_error *err)
{
    char names[256] = "";
    size_t used = 0;

    *out = requested ? registry_get(reg, requested) : registry_default(reg);
    if (*out)
        return 0;
    for (size_t i = 0; i < registry_count(reg) && used < sizeof(names); i++) {
        int k = snprintf(names + used, sizeof(names) - used, "%s%s", i ? ", " : "",
                         reg->provs[i]->ops->name);

        if (k < 0)
            break;
        used += (size_t)k;
    }
    if (!requested)
        return lb_error_set(err, -EOPNOTSUPP, "this daemon has no provider");
    return lb_error_set(err, -EOPNOTSUPP,
                        "provider '%.64s' is not enabled on this daemon (enabled: %s)", requested,
                        names);
}

int registry_end_execs(const struct lb_registry *reg)
{
    int n = 0;

    for (size_t i = 0; i < registry_count(reg); i++)
        n += provider_end_execs(reg->provs[i]);
    return n;
}

void registry_defer_cleanup(const struct lb_registry *reg)
{
    for (size_t i = 0; i < registry_count(reg); i++)
        provider_defer_cleanup(reg->provs[i]);
}

void registry_free(struct lb_registry *reg)
{
    if (!reg)
        return;
    for (size_t i = reg->n; i > 0; i--)
        provider_destroy(reg->provs[i - 1]);
    free(reg);
}

int registry_refuse_keyrings_to_self(struct lb_error *err)
{
    return seccomp_refuse_keyrings_to_self(err);
}
