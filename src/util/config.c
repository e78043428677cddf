/*
 * config.c - the table of every configuration key, and the INI/--set parsing around it.
 * Each row: section, key, type, where it lives in struct lb_config, default, bounds.
 */
#include "util/config.h"

#include <errno.h>
#include <ini.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum config_type { CT_STR, CT_INT, CT_BOOL };

struct config_key {
    const char *section;
    const char *key;
    enum config_type type;
    size_t offset;
    const char *def; /* default, as text; NULL for a NULL string */
    int64_t min, max;
};

#define STR(sec, k, field, d)                                                                      \
    {                                                                                              \
        sec, k, CT_STR, offsetof(struct lb_config, field), d, 0, 0                                 \
    }
#define INT(sec, k, field, d, lo, hi)                                                              \
    {                                                                                              \
        sec, k, CT_INT, offsetof(struct lb_config, field), d, lo, hi                               \
    }
#define BOOL(sec, k, field, d)                                                                     \
    {                                                                                              \
        sec, k, CT_BOOL, offsetof(struct lb_config, field), d, 0, 1                                \
    }

static const struct config_key config_keys[] = {
    STR("server", "listen", listen, "127.0.0.1:8787"),
    STR("server", "state_dir", state_dir, "/var/lib/lendbox"),
    STR("server", "admin_token_file", admin_token_file, NULL),
    STR("server", "public_url", public_url, NULL),
    STR("server", "log_level", log_level, "info"),
    INT("server", "http_threads", http_threads, "4", 1, 256),
    INT("server", "workers", workers, "64", 1, 4096),
    INT("server", "queue_max", queue_max, "1024", 1, 1000000),
    INT("server", "connection_timeout_s", connection_timeout_s, "60", 1, 86400),
    INT("server", "store_reserve_mib", store_reserve_mib, "8", 0, 4096),
    INT("server", "header_timeout_s", header_timeout_s, "10", 1, 86400),
    INT("server", "max_connections", max_connections, "0", 0, 1000000),
    INT("server", "per_ip_connections", per_ip_connections, "0", 0, 1000000),
    INT("server", "per_ip_incomplete", per_ip_incomplete, "0", 0, 1000000),
    INT("server", "fd_reserve", fd_reserve, "0", 0, 1000000),
    INT("lending", "stop_concurrency", stop_concurrency, "64", 1, 4096),
    INT("lending", "stop_timeout_s", stop_timeout_s, "120", 1, 86400),
    INT("lending", "default_ttl_s", default_ttl_s, "0", 0, 31536000),
    INT("lending", "max_ttl_s", max_ttl_s, "0", 0, 31536000),
    BOOL("lending", "shutdown_sweep", shutdown_sweep, "yes"),
    INT("lending", "retry_base_s", retry_base_s, "2", 1, 86400),
    INT("lending", "retry_max_s", retry_max_s, "300", 1, 86400),
    INT("lending", "sweep_interval_s", sweep_interval_s, "5", 1, 3600),
    INT("lending", "max_sandboxes", max_sandboxes, "4096", 1, 1000000),
    INT("lending", "retention_s", retention_s, "86400", 0, 31536000),
    STR("lending", "default_image", default_image, "host"),
    STR("lending", "workdir", workdir, "/workspace"),
    INT("lending", "create_timeout_s", create_timeout_s, "30", 1, 3600),
    INT("lending", "default_pids", default_pids, "4096", 0, 4194304),
    INT("lending", "session_lock_wait_s", session_lock_wait_s, "30", 1, 86400),
    INT("lending", "drain_timeout_s", drain_timeout_s, "30", 0, 86400),
    /* no default text: -1 until set, the daemon derives them (daemon/config.c) */
    INT("lending", "max_starting", max_starting, NULL, 1, 100000),
    INT("lending", "max_seed_queue", max_seed_queue, NULL, 0, 1000000),
    INT("limits", "max_body_bytes", max_body_bytes, "16777216", 1024, INT64_C(1) << 40),
    INT("limits", "max_file_bytes", max_file_bytes, "1073741824", 1024, INT64_C(1) << 40),
    INT("limits", "max_image_bytes", max_image_bytes, "4294967296", 1024, INT64_C(1) << 42),
    INT("limits", "max_inflight_bytes", max_inflight_bytes, "134217728", 0, INT64_C(1) << 40),
    INT("limits", "max_answer_bytes", max_answer_bytes, "268435456", 0, INT64_C(1) << 40),
    INT("limits", "max_output_bytes", max_output_bytes, "1048576", 1, INT64_C(1) << 32),
    INT("limits", "max_json_depth", max_json_depth, "32", 2, 1024),
    INT("limits", "max_exec_timeout_s", max_exec_timeout_s, "86400", 1, 31536000),
    INT("limits", "max_execs_per_sandbox", max_execs_per_sandbox, "0", 0, 1000000),
    INT("limits", "default_disk_mib", default_disk_mib, "1024", 1, 16777216),
    INT("limits", "max_disk_mib", max_disk_mib, "16384", 1, 16777216),
    INT("limits", "max_wait_ms", max_wait_ms, "30000", 0, 3600000),
    INT("limits", "max_fork", max_fork, "64", 1, 1024),
    INT("limits", "max_pty_sessions", max_pty_sessions, "16", 1, 100000),
    STR("provider", "name", provider, "local"),
    STR("provider", "enabled", providers_enabled, NULL),
    STR("local", "bwrap", bwrap_path, "bwrap"),
    STR("local", "supervise", supervise_path, NULL),
    STR("local", "images_dir", images_dir, NULL),
    STR("local", "default_image", local_default_image, NULL),
    STR("local", "cgroup_parent", cgroup_parent, "lendbox"),
    INT("local", "uid_base", uid_base, "0", 0, 2147483647),
    INT("local", "uid_count", uid_count, "4096", 1, 32767),
    INT("local", "tmp_size_mib", tmp_size_mib, "1024", 1, 1048576),
    STR("local", "storage", storage, "tmpfs"),
    STR("local", "data_dir", data_dir, NULL),
    INT("local", "sandbox_nofile", sandbox_nofile, "1024", 64, 1048576),
    BOOL("local", "reset_in_place", reset_in_place, "yes"),
    STR("docker", "socket", docker_socket, "/run/docker.sock"),
    STR("docker", "default_image", docker_default_image, NULL),
    STR("docker", "instance", docker_instance, NULL),
    STR("lxd", "socket", lxd_socket, NULL),
    STR("lxd", "url", lxd_url, NULL),
    STR("lxd", "cert", lxd_cert, NULL),
    STR("lxd", "key", lxd_key, NULL),
    STR("lxd", "server_cert", lxd_server_cert, NULL),
    STR("lxd", "default_image", lxd_default_image, NULL),
    STR("lxd", "target", lxd_target, NULL),
    STR("lxd", "instance", lxd_instance, NULL),
    INT("lxd", "call_timeout_s", lxd_call_timeout_s, "15", 1, 3600),
    INT("lxd", "create_concurrency", lxd_create_concurrency, "8", 1, 1024),
    INT("lxd", "idmap_base", lxd_idmap_base, "0", 0, 2147483647),
    INT("lxd", "idmap_count", lxd_idmap_count, "0", 0, 32767),
    STR("lxd", "supervise_host_path", lxd_supervise_host_path, NULL),
    BOOL("security", "seccomp", seccomp, "yes"),
    STR("security", "seccomp_deny", seccomp_deny, NULL),
    STR("network", "range", net_range, "10.213.0.0/16"),
    STR("network", "inherit", net_inherit, "none"),
    STR("network", "nft_table", net_nft_table, "lendbox"),
    INT("pool", "size", pool_size, "0", 0, 1000000),
    INT("pool", "max_age_s", pool_max_age_s, "3600", 0, 31536000),
    BOOL("pool", "adopt", pool_adopt, "yes"),
    INT("pool", "refill_concurrency", pool_refill_concurrency, "2", 1, 64),
    INT("pool", "refill_nice", pool_refill_nice, "10", 0, 19),
    BOOL("events", "enabled", events_enabled, "yes"),
    INT("events", "max_age_s", events_max_age_s, "604800", 0, 315360000),
    INT("events", "max_count", events_max_count, "1000000", 0, 1000000000),
    BOOL("pool", "recycle", pool_recycle, "no"),
    INT("pool", "max_uses", pool_max_uses, "100", 1, 1000000),
    STR("faults", "spec", faults_spec, NULL),
};

#define N_KEYS (sizeof(config_keys) / sizeof(config_keys[0]))

static int config_apply(struct lb_config *cfg, const struct config_key *k, const char *value,
                        struct lb_error *err)
{
    char *base = (char *)cfg + k->offset;

    switch (k->type) {
    case CT_STR: {
        char **slot = (char **)(void *)base;
        char *copy = NULL;

        if (value && !(copy = strdup(value)))
            return lb_error_set(err, -ENOMEM, "out of memory");
        free(*slot);
        *slot = copy;
        return 0;
    }
    case CT_INT: {
        char *end = NULL;
        long long v;

        errno = 0;
        v = strtoll(value, &end, 10);
        if (errno || end == value || *end != '\0' || v < k->min || v > k->max)
            return lb_error_set(err, -EINVAL,
                                "%s.%s must be an integer from %lld to %lld, not '%s'", k->section,
                                k->key, (long long)k->min, (long long)k->max, value);
        *(int64_t *)(void *)base = v;
        return 0;
    }
    case CT_BOOL:
        if (!strcasecmp(value, "yes") || !strcasecmp(value, "true") || !strcmp(value, "1") ||
            !strcasecmp(value, "on"))
            *(bool *)(void *)base = true;
        else if (!strcasecmp(value, "no") || !strcasecmp(value, "false") || !strcmp(value, "0") ||
                 !strcasecmp(value, "off"))
            *(bool *)(void *)base = false;
        else
            return lb_error_set(err, -EINVAL, "%s.%s must be yes or no, not '%s'", k->section,
                                k->key, value);
        return 0;
    }
    return -EINVAL;
}

int config_set(struct lb_config *cfg, const char *section, const char *key, const char *value,
               struct lb_error *err)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        if (!strcmp(config_keys[i].section, section) && !strcmp(config_keys[i].key, key))
            return config_apply(cfg, &config_keys[i], value, err);
    }
    return lb_error_set(err, -EINVAL, "unknown configuration key %s.%s", section, key);
}

int config_init(struct lb_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < N_KEYS; i++) {
        const struct config_key *k = &config_keys[i];

        if (k->type == CT_STR && !k->def)
            continue;
        if (k->type == CT_INT && !k->def) { /* derived when unset */
            *(int64_t *)(void *)((char *)cfg + k->offset) = -1;
            continue;
        }
        if (config_apply(cfg, k, k->def, NULL) < 0) {
            config_release(cfg);
            return -ENOMEM;
        }
    }
    return 0;
}

void config_release(struct lb_config *cfg)
{
    for (size_t i = 0; i < N_KEYS; i++) {
        if (config_keys[i].type == CT_STR) {
            char **slot = (char **)(void *)((char *)cfg + config_keys[i].offset);

            free(*slot);
            *slot = NULL;
        }
    }
}

struct config_load_ctx {
    struct lb_config *cfg;
    struct lb_error *err;
    int r;
};

static int config_ini_handler(void *user, const char *section, const char *name, const char *value)
{
    struct config_load_ctx *ctx = user;
    int r = config_set(ctx->cfg, section, name, value, ctx->err);

    if (r < 0 && ctx->r == 0)
        ctx->r = r;
    return r < 0 ? 0 : 1;
}

int config_load_file(struct lb_config *cfg, const char *path, struct lb_error *err)
{
    struct config_load_ctx ctx = {cfg, err, 0};
    int line = ini_parse(path, config_ini_handler, &ctx);

    if (line == -1)
        return lb_error_set(err, -ENOENT, "cannot open config file '%s'", path);
    if (line == -2)
        return lb_error_set(err, -ENOMEM, "out of memory reading '%s'", path);
    if (ctx.r < 0) {
        char msg[LB_ERROR_MESSAGE_MAX];

        snprintf(msg, sizeof(msg), "%s", err ? err->message : "");
        return lb_error_set(err, ctx.r, "%s line %d: %s", path, line, msg);
    }
    if (line > 0)
        return lb_error_set(err, -EINVAL, "%s line %d: syntax error", path, line);
    return 0;
}

int config_set_assignment(struct lb_config *cfg, const char *assignment, struct lb_error *err)
{
    const char *dot = strchr(assignment, '.');
    const char *eq = strchr(assignment, '=');
    char section[64], key[64];

    if (!dot || !eq || dot > eq || (size_t)(dot - assignment) >= sizeof(section) ||
        (size_t)(eq - dot - 1) >= sizeof(key) || dot == assignment || eq == dot + 1)
        return lb_error_set(err, -EINVAL, "--set wants SECTION.KEY=VALUE, not '%s'", assignment);
    memcpy(section, assignment, (size_t)(dot - assignment));
    section[dot - assignment] = '\0';
    memcpy(key, dot + 1, (size_t)(eq - dot - 1));
    key[eq - dot - 1] = '\0';
    return config_set(cfg, section, key, eq + 1, err);
}
