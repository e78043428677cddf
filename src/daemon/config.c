/*
 * config.c - the daemon's configuration: the file and the assignments loaded (at start and on
 * SIGHUP), the one place where lb_config becomes each component's configuration (the
 * providers' own: provider/registry.c), the connection limits planned from the fd limit, and
 * the default paths derived from the configuration. See daemon.h.
 */
#include "daemon/daemon.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "routes/routes.h"
#include "util/fault.h"
#include "util/log.h"

/* The config file, then the assignments; the log level and the fault switch. */
int daemon_load_config(struct daemon *d, struct lb_error *err)
{
    struct lb_config *cfg = &d->cfg;
    enum lb_log_level level;
    const char *faults;
    int r = d->config_file ? config_load_file(cfg, d->config_file, err) : 0;

    for (int i = 0; r == 0 && i < d->n_sets; i++)
        r = d->sets[i] ? config_set_assignment(cfg, d->sets[i], err)
                       : lb_error_set(err, -ENOMEM, "out of memory");
    if (r < 0)
        return r;
    if (log_parse_level(cfg->log_level, &level) < 0)
        return lb_error_set(err, -EINVAL, "unknown log level '%s'", cfg->log_level);
    log_set_level(level);
    faults = getenv("LENDBOX_FAULTS") ? getenv("LENDBOX_FAULTS") : cfg->faults_spec;
    r = fault_load(faults, err);
    if (r < 0)
        return r;
    if (fault_enabled())
        log_warn("FAULT INJECTION IS ON (%s): this daemon will fail on purpose", faults);
    return 0;
}

/* SIGHUP: logs go to stderr (journald or a redirect), so there is nothing to reopen; reload what
 * can change at run time: the log level and the fault-injection spec. The rest needs a restart. */
void daemon_reload_config(const char *config_file, const char *const *sets, int n_sets)
{
    struct lb_config fresh;
    struct lb_error err = {0};
    enum lb_log_level level;
    const char *faults;

    if (config_init(&fresh) < 0)
        return;
    if (config_file && config_load_file(&fresh, config_file, &err) < 0)
        goto fail;
    for (int i = 0; i < n_sets; i++)
        if (sets[i] && config_set_assignment(&fresh, sets[i], &err) < 0)
            goto fail;
    if (log_parse_level(fresh.log_level, &level) < 0) {
        lb_error_set(&err, -EINVAL, "unknown log level '%s'", fresh.log_level);
        goto fail;
    }
    faults = getenv("LENDBOX_FAULTS") ? getenv("LENDBOX_FAULTS") : fresh.faults_spec;
    if (fault_load(faults, &err) < 0)
        goto fail;
    log_set_level(level);
    log_info("SIGHUP: reloaded log level (%s) and faults (%s); other keys need a restart",
             fresh.log_level, faults ? faults : "off");
    config_release(&fresh);
    return;
fail:
    log_error("SIGHUP: configuration not reloaded: %s", err.message);
    config_release(&fresh);
}

/* The one place where lb_config becomes each component's configuration (the providers' own:
 * provider/registry.c, one mapping per kind). Strings are borrowed from d. */
/* Admission (lend/admission.h): max_starting unset is twice the online CPUs; max_seed_queue
 * unset is four times max_starting, and at least the seed/release workers (workers / 4, at
 * least 4): those bound the seeds in flight already (more wait in the worker queue, holding
 * nothing), so by default a seed is refused only where the workers would have queued it. */
static void daemon_plan_admission(const struct lb_config *cfg, int64_t *max_starting,
                                  int64_t *max_queue)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t control = cfg->workers / 4 > 4 ? cfg->workers / 4 : 4;

    *max_starting = cfg->max_starting > 0 ? cfg->max_starting : 2 * (cpus > 0 ? cpus : 1);
    if (cfg->max_seed_queue >= 0)
        *max_queue = cfg->max_seed_queue;
    else
        *max_queue = 4 * *max_starting > control ? 4 * *max_starting : control;
}

void daemon_map_config(struct daemon *d, struct lb_http_config *hc, struct lb_lend_config *lc,
                       struct lb_activation_config *ac)
{
    const struct lb_config *cfg = &d->cfg;

    *hc = (struct lb_http_config){
        .listen_fd = d->listen_fd,
        .threads = (unsigned)cfg->http_threads,
        .connection_timeout_s = (unsigned)cfg->connection_timeout_s,
        .header_timeout_s = (unsigned)cfg->header_timeout_s,
        .max_connections = d->max_conn,
        .per_ip_connections = d->per_ip,
        .per_ip_incomplete = d->per_ip_incomplete,
        .max_body_bytes = (size_t)cfg->max_body_bytes,
        .max_file_bytes = (size_t)cfg->max_file_bytes,
        .max_archive_bytes = (size_t)cfg->max_image_bytes,
        .archive_route = "image_import",
        .max_inflight_bytes = (size_t)cfg->max_inflight_bytes,
        .max_answer_bytes = (size_t)cfg->max_answer_bytes,
        .max_json_depth = (int)cfg->max_json_depth,
        .routes = lb_routes,
        .authorize = routes_authorize,
        .app = &d->app,
        .pool = d->pool,
        .control_pool = d->control_pool,
    };
    *lc = (struct lb_lend_config){
        .stop_timeout_s = cfg->stop_timeout_s,
        .create_timeout_s = cfg->create_timeout_s,
        .default_ttl_s = cfg->default_ttl_s,
        .max_ttl_s = cfg->max_ttl_s,
        .retry_base_s = cfg->retry_base_s,
        .retry_max_s = cfg->retry_max_s,
        .max_sandboxes = cfg->max_sandboxes,
        .pool_adopt = cfg->pool_adopt && cfg->pool_size > 0,
        .pool_recycle = cfg->pool_recycle && cfg->pool_size > 0,
        .pool_size = cfg->pool_size,
        .pool_max_uses = cfg->pool_max_uses,
        .pool_max_age_s = cfg->pool_max_age_s,
        .default_pids = cfg->default_pids,
        /* where the provider has no disk limit (local storage dir) only a seed that asks for
         * one gets a 422 */
        .default_disk_mib = cfg->default_disk_mib,
        .max_disk_mib = cfg->max_disk_mib,
        .retention_s = cfg->retention_s,
        .session_lock_wait_s = cfg->session_lock_wait_s,
        .max_output_bytes = (size_t)cfg->max_output_bytes,
        /* [local] default_image, else the older lending.default_image */
        .default_image = cfg->local_default_image ? cfg->local_default_image : cfg->default_image,
        .images_dir = d->images_dir,
        .workdir = cfg->workdir,
        .public_url = cfg->public_url ? cfg->public_url : d->public_url,
        .operate_key = d->operate_key,
        .operate_key_len = OPERATE_KEY_BYTES,
    };
    daemon_plan_admission(cfg, &lc->max_starting, &lc->max_seed_queue);
    /* receipts of harness supervisors: host side, so no sandbox process can forge one.
     * Artifacts come back the way stage files go in: at most a request body each. */
    snprintf(d->receipts_dir, sizeof(d->receipts_dir), "%s/activations", cfg->state_dir);
    *ac = (struct lb_activation_config){
        .receipts_dir = d->receipts_dir,
        .max_artifact_bytes = (size_t)cfg->max_body_bytes,
        .max_artifacts_bytes = 4 * (size_t)cfg->max_body_bytes,
        .max_log_bytes = (size_t)cfg->max_output_bytes,
    };
    d->app.max_exec_timeout_s = cfg->max_exec_timeout_s;
    d->app.max_execs_per_sandbox = cfg->max_execs_per_sandbox > 0
                                       ? cfg->max_execs_per_sandbox
                                       : (cfg->workers / 4 > 1 ? cfg->workers / 4 : 1);
    d->app.default_exec_timeout_s = API_DEFAULT_EXEC_TIMEOUT_S;
    d->app.max_wait_ms = cfg->max_wait_ms;
    d->app.max_fork = cfg->max_fork;
    d->app.max_file_bytes = cfg->max_file_bytes;
    d->app.stop_concurrency = cfg->stop_concurrency;
}

/* Connections may use what the fd limit leaves after a reserve for sandboxes and the store
 * (each worker's exec or file transfer, SQLite, cgroup files); each connection counts twice,
 * as an upload or download holds a file beside its socket. The soft limit is raised to the hard
 * one first. */
void daemon_plan_connections(struct lb_config *cfg, unsigned *max_conn, unsigned *per_ip,
                             unsigned *per_ip_incomplete)
{
    struct rlimit rl;
    uint64_t fds = 1024, reserve, conns;
    int64_t workers = cfg->workers + (cfg->workers / 4 > 4 ? cfg->workers / 4 : 4);

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur < rl.rlim_max) {
            rlim_t old = rl.rlim_cur;

            rl.rlim_cur = rl.rlim_max;
            if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
                log_warn("cannot raise the fd limit from %llu to %llu: %s", (unsigned long long)old,
                         (unsigned long long)rl.rlim_max, strerror(errno));
                rl.rlim_cur = old;
            }
        }
        fds = rl.rlim_cur == RLIM_INFINITY ? 1048576 : (uint64_t)rl.rlim_cur;
    }
    reserve = cfg->fd_reserve ? (uint64_t)cfg->fd_reserve : 64 + 16 * (uint64_t)workers;
    if (reserve + 64 > fds) {
        log_warn("the fd limit (%llu) leaves little beside the reserve for %lld workers (%llu); "
                 "raise LimitNOFILE / ulimit -n",
                 (unsigned long long)fds, (long long)workers, (unsigned long long)reserve);
        reserve = fds > 64 ? fds - 64 : fds / 2;
    }
    conns = (fds - reserve) / 2;
    if (conns > 65536)
        conns = 65536;
    if (conns < 2)
        conns = 2;
    if (cfg->max_connections)
        conns = (uint64_t)cfg->max_connections;
    *max_conn = (unsigned)conns;
    *per_ip = cfg->per_ip_connections ? (unsigned)cfg->per_ip_connections
                                      : (unsigned)(conns / 2 > 0 ? conns / 2 : 1);
    /* a client still sending its headers holds a connection for up to header_timeout_s: one
     * address may hold only a few such, well below its share, so that a trickling client
     * cannot take every connection of its address */
    *per_ip_incomplete = cfg->per_ip_incomplete ? (unsigned)cfg->per_ip_incomplete
                         : *per_ip / 4 > 64     ? 64
                         : *per_ip / 4 > 0      ? *per_ip / 4
                                                : 1;
    log_info("fd limit %llu: at most %u connections (%u per client address, %u of them still "
             "sending their headers), %llu fds reserved",
             (unsigned long long)fds, *max_conn, *per_ip, *per_ip_incomplete,
             (unsigned long long)reserve);
}

char *daemon_supervise_path(void)
{
    char exe[PATH_MAX], cand[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    char *dir;

    if (n <= 0)
        return NULL;
    exe[n] = '\0';
    dir = dirname(exe);
    snprintf(cand, sizeof(cand), "%s/lendbox-supervise", dir);
    if (access(cand, X_OK) == 0)
        return strdup(cand);
    snprintf(cand, sizeof(cand), "%s/../libexec/lendbox/lendbox-supervise", dir);
    if (access(cand, X_OK) == 0)
        return realpath(cand, NULL);
    return NULL;
}

/* local.images_dir, or <state_dir>/images. Returns a malloc'd path or NULL. */
char *daemon_images_dir(const struct lb_config *cfg)
{
    char *p = NULL;

    if (cfg->images_dir)
        return strdup(cfg->images_dir);
    return asprintf(&p, "%s/images", cfg->state_dir) < 0 ? NULL : p;
}
