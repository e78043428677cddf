/*
 * main.c - lendboxd: wires config, store, providers, lending, worker pool and HTTP together,
 * runs startup reconciliation, the sweeper thread, and the shutdown sweep on SIGTERM/SIGINT.
 * The only file that sees every module. main() calls the daemon_* wiring functions in order;
 * daemon_map_config is the one place where lb_config becomes each component's config.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <malloc.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "auth/auth.h"
#include "http/http.h"
#include "lend/pty.h"
#include "lend/activation.h"
#include "lend/lend.h"
#include "pool/pool.h"
#include "provider/lxd.h"
#include "provider/local/seccomp.h"
#include "provider/registry.h"
#include "routes/routes.h"
#include "image/image.h"
#include "store/store.h"
#include "sweeper/sweeper.h"
#include "warm/warm.h"
#include "util/clock.h"
#include "util/config.h"
#include "util/fault.h"
#include "util/log.h"
#include "util/token.h"

#define OPERATE_KEY_BYTES 32

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lendboxd [--config FILE] [--listen HOST:PORT] [--state-dir DIR]\n"
            "                [--admin-token-file FILE] [--log-level LEVEL]\n"
            "                [--set SECTION.KEY=VALUE]... [--no-shutdown-sweep]\n"
            "                [--version] [--help]\n"
            "       lendboxd [OPTIONS] image import [--provider lxd] SOURCE NAME | image list | "
            "image rm NAME\n"
            "       lendboxd routes   (print the route table: METHOD PATTERN AUTH NAME)\n\n"
            "Lends Linux-namespace sandboxes to resources servers over HTTP (API: docs/api.md).\n"
            "Flags override the config file; --set sets any key of etc/lendbox.conf.\n"
            "LENDBOX_FAULTS=OP=ACTION[,...] injects failures (tests and rehearsals only).\n");
}

/* On SIGTERM: in-flight execs get lending.drain_timeout_s, then the provider ends them. */
struct drain_watchdog {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    bool done;
    int64_t timeout_s;
    struct lb_registry *providers;
    pthread_t thread;
};

static void *drain_watchdog_main(void *arg)
{
    struct drain_watchdog *w = arg;
    struct timespec until;
    bool expired = false;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)w->timeout_s;
    pthread_mutex_lock(&w->mutex);
    while (!w->done && !expired)
        expired = pthread_cond_timedwait(&w->cond, &w->mutex, &until) == ETIMEDOUT;
    pthread_mutex_unlock(&w->mutex);
    if (expired && !w->done) {
        int n = registry_end_execs(w->providers);

        log_warn("drain: in-flight requests still running after drain_timeout_s = %lld; ended "
                 "%d execs",
                 (long long)w->timeout_s, n);
    }
    return NULL;
}

/* Read a whole small file (<= 4 KiB), trimmed of trailing whitespace. Caller frees. */
static int read_small_file(const char *path, char **out, struct lb_error *err)
{
    char buf[4097];
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return lb_error_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n < 0)
        return lb_error_set(err, -errno, "cannot read '%s': %s", path, strerror(errno));
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' ' || buf[n - 1] == '\r'))
        n--;
    buf[n] = '\0';
    *out = strdup(buf);
    return *out ? 0 : lb_error_set(err, -ENOMEM, "out of memory");
}

/* Create path with a fresh random hex secret of n_bytes (mode 0600) unless it exists. */
static int ensure_secret_file(const char *path, size_t n_bytes, struct lb_error *err)
{
    char hex[2 * 64 + 2];
    int fd, r;

    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            return 0;
        return lb_error_set(err, -errno, "cannot create '%s': %s", path, strerror(errno));
    }
    r = token_random_hex(n_bytes, hex);
    if (r == 0) {
        size_t len = strlen(hex);

        hex[len++] = '\n';
        if (write(fd, hex, len) != (ssize_t)len || fsync(fd) < 0)
            r = -errno;
    }
    close(fd);
    if (r < 0) {
        unlink(path);
        return lb_error_set(err, r, "cannot write '%s'", path);
    }
    return 0;
}

static int write_listen_file(const char *state_dir, const char *addr)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    FILE *f;

    snprintf(path, sizeof(path), "%s/listen", state_dir);
    snprintf(tmp, sizeof(tmp), "%s/.listen.tmp", state_dir);
    f = fopen(tmp, "we");
    if (!f)
        return -errno;
    fprintf(f, "%s\n", addr);
    if (fclose(f) != 0 || rename(tmp, path) < 0)
        return -errno;
    return 0;
}

/* SIGHUP: logs go to stderr (journald or a redirect), so there is nothing to reopen; reload what
 * can change at run time: the log level and the fault-injection spec. The rest needs a restart. */
static void reload_config(const char *config_file, const char *const *sets, int n_sets)
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

/* A secret file must be the daemon's alone: owned by its user, no group or world bits. */
static int check_secret_file(const char *path, const char *what, struct lb_error *err)
{
    struct stat st;

    if (stat(path, &st) < 0)
        return lb_error_set(err, -errno, "cannot stat %s '%s': %s", what, path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return lb_error_set(err, -EINVAL, "%s '%s' is not a regular file", what, path);
    if (st.st_uid != geteuid())
        return lb_error_set(err, -EPERM,
                            "%s '%s' is owned by uid %u, not by the daemon's user (%u)", what, path,
                            (unsigned)st.st_uid, (unsigned)geteuid());
    if (st.st_mode & 077)
        return lb_error_set(err, -EPERM,
                            "%s '%s' has mode %04o: group and others must have no access "
                            "(chmod 600 it)",
                            what, path, (unsigned)(st.st_mode & 07777));
    return 0;
}

/* The state dir holds the secrets and every sandbox's directory. Created 0711; an existing one
 * must be the daemon's and must not be listable or writable by group or others (mode at most
 * 0711: traverse is what the sandboxes' uids need to reach their own directories, and is
 * added if missing). */
static int prepare_state_dir(const char *dir, struct lb_error *err)
{
    struct stat st;

    if (mkdir(dir, 0711) < 0 && errno != EEXIST)
        return lb_error_set(err, -errno, "cannot create state dir '%s': %s", dir, strerror(errno));
    if (stat(dir, &st) < 0)
        return lb_error_set(err, -errno, "cannot stat state dir '%s': %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return lb_error_set(err, -ENOTDIR, "state dir '%s' is not a directory", dir);
    if (st.st_uid != geteuid())
        return lb_error_set(err, -EPERM,
                            "state dir '%s' is owned by uid %u, not by the daemon's user (%u)", dir,
                            (unsigned)st.st_uid, (unsigned)geteuid());
    if (st.st_mode & 066)
        return lb_error_set(err, -EPERM,
                            "state dir '%s' has mode %04o: group and others may at most traverse "
                            "it (chmod 711 it)",
                            dir, (unsigned)(st.st_mode & 07777));
    if ((st.st_mode & 07777) != 0711 && chmod(dir, 0711) < 0)
        return lb_error_set(err, -errno, "cannot chmod state dir '%s': %s", dir, strerror(errno));
    return 0;
}

/* Connections may use what the fd limit leaves after a reserve for sandboxes and the store
 * (each worker's exec or file transfer, SQLite, cgroup files); each connection counts twice,
 * as an upload or download holds a file beside its socket. The soft limit is raised to the hard
 * one first. */
static void plan_connections(struct lb_config *cfg, unsigned *max_conn, unsigned *per_ip,
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

static char *default_supervise_path(void)
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
static char *images_dir_of(const struct lb_config *cfg)
{
    char *p = NULL;

    if (cfg->images_dir)
        return strdup(cfg->images_dir);
    return asprintf(&p, "%s/images", cfg->state_dir) < 0 ? NULL : p;
}

/* image_gc's question: does a live sandbox record hold this digest? (errors: yes) */
static bool image_digest_in_use(void *store, const char *digest)
{
    int64_t n = 0;

    return store_count_using_image_digest(store, digest, &n, NULL) < 0 || n > 0;
}

/* image import --provider lxd: the image (imported into the local store first) as a unified
 * tarball (image_write_lxd_tarball: the supervisor as /sbin/init when it has none) uploaded
 * through [lxd] socket or url and published under the alias name. 0 or a negative errno. */
static int image_publish_lxd(const struct lb_config *cfg, const char *dir, const char *name,
                             struct lb_error *err)
{
    const struct lb_provider_kind *kind = registry_find_kind("lxd");
    char *supervise = cfg->supervise_path ? strdup(cfg->supervise_path) : default_supervise_path();
    char tmp_dir[] = "/tmp/lendbox-lxd-image-XXXXXX", fp[128] = "";
    struct lb_provider *prov = NULL;
    struct lb_provider_env env = {.cfg = cfg, .supervise_path = supervise, .images_dir = dir};
    bool init_added = false;
    struct stat st;
    int fd = -1, r;

    if (!supervise) {
        r = lb_error_set(err, -ENOENT, "lendbox-supervise not found; set local.supervise");
        goto out;
    }
    r = kind ? kind->open(&env, &prov, err) : lb_error_set(err, -EINVAL, "no lxd provider");
    if (r < 0)
        goto out;
    /* the tarball: an unlinked file (O_TMPFILE where /tmp has it, else made and unlinked) */
    fd = open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && mkdtemp(tmp_dir)) {
        char p[sizeof(tmp_dir) + 16];

        snprintf(p, sizeof(p), "%s/image.tar", tmp_dir);
        fd = open(p, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        unlink(p);
        rmdir(tmp_dir);
    }
    if (fd < 0) {
        r = lb_error_set(err, -errno, "cannot make a temporary file: %s", strerror(errno));
        goto out;
    }
    r = image_write_lxd_tarball(dir, name, supervise, fd, &init_added, err);
    if (r == 0 && fstat(fd, &st) < 0)
        r = lb_error_set(err, -errno, "cannot stat the tarball: %s", strerror(errno));
    if (r == 0)
        r = provider_lxd_image_publish(
            prov, fd, (uint64_t)st.st_size, name,
            cfg->create_timeout_s * 1000 > 600000 ? cfg->create_timeout_s * 1000 : 600000, fp,
            sizeof(fp), err);
    if (r == 0)
        printf("lxd %s %s %lld%s\n", name, fp, (long long)st.st_size,
               init_added ? " (lendbox-supervise as /sbin/init)" : "");
out:
    if (fd >= 0)
        close(fd);
    provider_destroy(prov);
    free(supervise);
    return r;
}

/* lendboxd image import [--provider lxd] SOURCE NAME | list | rm NAME. Returns the exit
 * status. */
static int image_command(const struct lb_config *cfg, int argc, char **argv)
{
    char *dir = images_dir_of(cfg), path[PATH_MAX];
    struct lb_error err = {0};
    struct lb_image_info info, *all = NULL;
    struct lb_store *store = NULL;
    int64_t users = 0;
    size_t n = 0, i;
    bool existed;
    int rc = 1;

    umask(022);
    /* the default store is under the state dir, which a daemon may not have made yet */
    if (!cfg->images_dir && mkdir(cfg->state_dir, 0711) < 0 && errno != EEXIST)
        fprintf(stderr, "lendboxd: cannot make '%s': %s\n", cfg->state_dir, strerror(errno));
    if (!dir) {
        fprintf(stderr, "lendboxd: out of memory\n");
        return 1;
    }
    if (argc == 5 && strcmp(argv[0], "import") == 0 && strcmp(argv[1], "--provider") == 0) {
        /* into the local store (where it is unpacked and checked), then into LXD */
        if (strcmp(argv[2], "lxd") != 0) {
            lb_error_set(&err, -EINVAL, "image import --provider: only lxd (not '%s')", argv[2]);
            goto fail;
        }
        if (image_import(dir, argv[3], argv[4], &info, &existed, &err) < 0 ||
            image_publish_lxd(cfg, dir, argv[4], &err) < 0)
            goto fail;
        rc = 0;
    } else if (argc == 3 && strcmp(argv[0], "import") == 0) {
        if (image_import(dir, argv[1], argv[2], &info, &existed, &err) < 0)
            goto fail;
        /* a name imported anew leaves its old tree unnamed: collect it unless a sandbox
         * recorded in the state dir (the daemon may be running) still uses it */
        snprintf(path, sizeof(path), "%s/lendbox.db", cfg->state_dir);
        if (access(path, F_OK) == 0 && store_open(path, &store, &err) < 0)
            goto fail;
        if (store && image_gc(dir, image_digest_in_use, store, &err) < 0)
            goto fail;
        printf("%s %s %lld%s\n", info.name, info.digest, (long long)info.size_bytes,
               existed ? " (already stored)" : "");
        rc = 0;
    } else if (argc == 1 && strcmp(argv[0], "list") == 0) {
        if (image_list(dir, &all, &n, &err) < 0)
            goto fail;
        for (i = 0; i < n; i++)
            printf("%s %s %lld %lld\n", all[i].name, all[i].digest, (long long)all[i].size_bytes,
                   (long long)all[i].created_at);
        rc = 0;
    } else if (argc == 2 && strcmp(argv[0], "rm") == 0) {
        /* refused while a record not yet stopped names it (the daemon may be running) */
        snprintf(path, sizeof(path), "%s/lendbox.db", cfg->state_dir);
        if (image_get(dir, argv[1], &info, &err) < 0 || store_open(path, &store, &err) < 0 ||
            store_count_using_image(store, argv[1], &users, &err) < 0)
            goto fail;
        if (users > 0) {
            lb_error_set(&err, -EBUSY, "image '%s' is in use by %lld sandbox(es)", argv[1],
                         (long long)users);
            goto fail;
        }
        if (image_remove(dir, argv[1], &err) < 0 ||
            image_gc(dir, image_digest_in_use, store, &err) < 0)
            goto fail;
        rc = 0;
    } else {
        fprintf(stderr, "usage: lendboxd [OPTIONS] image import [--provider lxd] SOURCE NAME\n"
                        "       lendboxd [OPTIONS] image list\n"
                        "       lendboxd [OPTIONS] image rm NAME\n"
                        "SOURCE: docker-archive:PATH, oci-archive:PATH, oci:DIR[:TAG] or a path\n");
        rc = 2;
    }
    goto out;
fail:
    fprintf(stderr, "lendboxd: image: %s\n", err.message);
out:
    if (store)
        store_close(store);
    free(all);
    free(dir);
    return rc;
}

/* Everything one daemon runs, made by the wiring functions below in this order and released
 * by daemon_close in reverse. */
struct daemon {
    struct lb_config cfg;
    const char *config_file;
    char **sets; /* --set and flag assignments, applied over the file (and again on SIGHUP) */
    int n_sets;
    sigset_t sigs;
    unsigned max_conn, per_ip, per_ip_incomplete;
    int lock_fd;
    char admin_hash[LB_SHA256_HEX + 1];
    unsigned char operate_key[OPERATE_KEY_BYTES];
    int listen_fd; /* until http_start takes it over */
    char bound[128];
    char *supervise, *images_dir, *public_url;
    char receipts_dir[PATH_MAX];
    struct lb_store *store;
    struct lb_registry *providers;
    struct lb_auth *auth;
    struct lb_pool *pool, *control_pool;
    struct lb_lend *lend;
    struct lb_activations *acts;
    struct lb_ptys *ptys;
    struct lb_follows *follows;
    struct lb_http *http;
    struct lb_app app;
    struct lb_sweeper *sweeper;
    struct lb_warm_pool *warm;
};

/* The API's defaults that are not configuration keys (API.md): an exec without timeout_s. */
#define API_DEFAULT_EXEC_TIMEOUT_S 180

/* The one place where lb_config becomes each component's configuration (the providers' own:
 * provider/registry.c, one mapping per kind). Strings are borrowed from d. */
static void daemon_map_config(struct daemon *d, struct lb_http_config *hc,
                              struct lb_lend_config *lc, struct lb_activation_config *ac)
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
    d->app.stop_concurrency = cfg->stop_concurrency;
}

/* Command line: flags become assignments applied over the config file. Returns -1 to go on,
 * else the exit status (0 for --version/--help, 1 out of memory, 2 for a usage error). */
static int daemon_parse_args(struct daemon *d, int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"listen", required_argument, NULL, 'l'},
        {"state-dir", required_argument, NULL, 's'},
        {"admin-token-file", required_argument, NULL, 'a'},
        {"log-level", required_argument, NULL, 'L'},
        {"set", required_argument, NULL, 'S'},
        {"no-shutdown-sweep", no_argument, NULL, 'N'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;

    /* Flags override the file, so collect them first and apply them after loading it. Options
     * end at the first word ("+"): `image import --provider lxd` keeps its own. */
    while ((c = getopt_long(argc, argv, "+c:l:s:a:L:S:NVh", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            d->config_file = optarg;
            break;
        case 'l':
        case 's':
        case 'a':
        case 'L': {
            const char *key = c == 'l'   ? "server.listen="
                              : c == 's' ? "server.state_dir="
                              : c == 'a' ? "server.admin_token_file="
                                         : "server.log_level=";
            if (asprintf(&d->sets[d->n_sets++], "%s%s", key, optarg) < 0) {
                d->sets[--d->n_sets] = NULL;
                fprintf(stderr, "lendboxd: out of memory\n");
                return 1;
            }
            break;
        }
        case 'S':
            d->sets[d->n_sets++] = strdup(optarg);
            break;
        case 'N':
            d->sets[d->n_sets++] = strdup("lending.shutdown_sweep=no");
            break;
        case 'V':
            printf("lendboxd %s\n", LB_VERSION);
            return 0;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc && strcmp(argv[optind], "routes") == 0 && optind + 1 == argc) {
        routes_print(stdout);
        return 0;
    }
    if (optind < argc && strcmp(argv[optind], "image") != 0) {
        fprintf(stderr, "lendboxd: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    return -1;
}

/* The config file, then the assignments; the log level and the fault switch. */
static int daemon_load_config(struct daemon *d, struct lb_error *err)
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

/* The fault switch host.keyrings: the daemon refuses itself the keyring calls, as a
 * container's syscall filter would (systemd-nspawn, Docker, Kubernetes' RuntimeDefault). Before
 * any thread exists. */
static int daemon_fault_host_keyrings(struct lb_error *err)
{
    struct lb_error e = {0};

    if (fault_hit("host.keyrings", 0, &e) == 0)
        return 0;
    log_warn("injected fault host.keyrings: the keyring calls fail with EPERM in this daemon and "
             "everything it starts");
    return seccomp_refuse_keyrings_to_self(err);
}

/* Process-wide setup before any thread exists. */
static void daemon_setup_process(struct daemon *d)
{
    umask(077);
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&d->sigs);
    sigaddset(&d->sigs, SIGTERM);
    sigaddset(&d->sigs, SIGINT);
    sigaddset(&d->sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &d->sigs, NULL);
    /* File operations run with a sandbox's fsuid; root's supplementary groups must not come
     * along (they would open group-readable host files). */
    if (getuid() == 0 && setgroups(0, NULL) < 0)
        log_warn("cannot drop supplementary groups: %s", strerror(errno));
    /* bubblewrap's monitor processes outlive the short-lived forks that start them; as a child
     * subreaper lendboxd inherits them and the provider reaps them when it stops a sandbox
     * (instead of leaving zombies for pid 1). After a restart pid 1 reaps the old ones. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
        log_warn("cannot become a child subreaper: %s", strerror(errno));

    /* Large buffers (exec output, rendered responses) come from mmap and go back to the
     * system when freed, instead of staying in the heap at the size of the largest burst: a
     * fixed threshold also turns off glibc's raising it after each free. */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    mallopt(M_TRIM_THRESHOLD, 1024 * 1024);
    plan_connections(&d->cfg, &d->max_conn, &d->per_ip, &d->per_ip_incomplete);
}

/* State dir, its lock, the admin token and the operate-token key. */
static int daemon_open_state(struct daemon *d, struct lb_error *err)
{
    const struct lb_config *cfg = &d->cfg;
    char path[PATH_MAX], *admin_token = NULL, *operate_hex = NULL;
    int r;

    /* 0711: the sandboxes' own uids must reach their directories below it; nothing in it can
     * be listed, and every secret in it is 0600. */
    r = prepare_state_dir(cfg->state_dir, err);
    if (r < 0)
        return r;
    snprintf(path, sizeof(path), "%s/lendboxd.lock", cfg->state_dir);
    d->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (d->lock_fd < 0)
        return lb_error_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
    /* After a crash, a fork of the old daemon may hold the lock for a moment (until its exec
     * or exit): wait a little before calling the state dir taken. */
    for (int tries = 0; flock(d->lock_fd, LOCK_EX | LOCK_NB) < 0; tries++) {
        if (errno != EWOULDBLOCK || tries == 100)
            return lb_error_set(err, -EBUSY, "state dir '%s' is in use by another lendboxd (%s)",
                                cfg->state_dir, strerror(errno));
        if (tries == 0)
            log_info("waiting for the lock on %s", path);
        usleep(100 * 1000);
    }
    if (cfg->admin_token_file)
        snprintf(path, sizeof(path), "%s", cfg->admin_token_file);
    else
        snprintf(path, sizeof(path), "%s/admin.token", cfg->state_dir);
    r = ensure_secret_file(path, 32, err);
    if (r == 0)
        r = check_secret_file(path, "admin token file", err);
    if (r == 0)
        r = read_small_file(path, &admin_token, err);
    if (r == 0 && strlen(admin_token) < 16)
        r = lb_error_set(err, -EINVAL, "admin token in '%s' is shorter than 16 characters", path);
    if (r < 0)
        goto out;
    token_sha256_hex(admin_token, strlen(admin_token), d->admin_hash);
    log_info("admin token: %s", path);
    snprintf(path, sizeof(path), "%s/operate.key", cfg->state_dir);
    r = ensure_secret_file(path, OPERATE_KEY_BYTES, err);
    if (r == 0)
        r = check_secret_file(path, "operate-token key", err);
    if (r == 0)
        r = read_small_file(path, &operate_hex, err);
    if (r == 0 && strlen(operate_hex) != 2 * OPERATE_KEY_BYTES)
        r = lb_error_set(err, -EINVAL, "'%s' is damaged (want %d hex digits)", path,
                         2 * OPERATE_KEY_BYTES);
    if (r < 0)
        goto out;
    for (int i = 0; i < OPERATE_KEY_BYTES; i++)
        sscanf(operate_hex + 2 * i, "%2hhx", &d->operate_key[i]);
out:
    free(admin_token);
    free(operate_hex);
    return r;
}

/* The API's socket (before the providers: the local one refuses its port to every sandbox),
 * the store, the image store and the providers. */
static int daemon_open_backends(struct daemon *d, struct lb_error *err)
{
    const struct lb_config *cfg = &d->cfg;
    char path[PATH_MAX];
    int r = http_bind(cfg->listen, &d->listen_fd, d->bound, sizeof(d->bound), err);

    if (r < 0)
        return r;
    snprintf(path, sizeof(path), "%s/lendbox.db", cfg->state_dir);
    r = store_open(path, &d->store, err);
    if (r == 0)
        r = store_reserve_init(d->store, cfg->store_reserve_mib * 1024 * 1024, err);
    if (r < 0)
        return r;
    if (cfg->default_disk_mib > cfg->max_disk_mib)
        return lb_error_set(err, -EINVAL,
                            "limits.default_disk_mib (%lld) is over limits.max_disk_mib (%lld)",
                            (long long)cfg->default_disk_mib, (long long)cfg->max_disk_mib);
    d->supervise = cfg->supervise_path ? strdup(cfg->supervise_path) : default_supervise_path();
    if (!d->supervise)
        return lb_error_set(err, -ENOENT, "lendbox-supervise not found; set local.supervise");
    d->images_dir = images_dir_of(cfg);
    if (!d->images_dir)
        return lb_error_set(err, -ENOMEM, "out of memory");
    /* an unusable image store leaves image "host" (as before it existed): warn, go on */
    if (image_store_init(d->images_dir, err) < 0 || image_store_clean_tmp(d->images_dir, err) < 0 ||
        image_gc(d->images_dir, image_digest_in_use, d->store, err) < 0) {
        log_warn("image store: %s", err->message);
        lb_error_clear(err);
    }
    struct lb_provider_env penv = {
        .cfg = cfg,
        .supervise_path = d->supervise,
        .images_dir = d->images_dir,
        .api_port = strrchr(d->bound, ':') ? atoi(strrchr(d->bound, ':') + 1) : 0,
    };
    return registry_open(&penv, &d->providers, err);
}

/* Workers, auth, lending, activations and HTTP. Readiness stays 503 and seeds are refused
 * until reconciliation is done. */
static int daemon_start_services(struct daemon *d, struct lb_error *err)
{
    const struct lb_config *cfg = &d->cfg;
    struct lb_http_config hc;
    struct lb_lend_config lc;
    struct lb_activation_config ac;
    int r;

    if (pool_new((size_t)cfg->workers, (size_t)cfg->queue_max, &d->pool) < 0 ||
        pool_new((size_t)(cfg->workers / 4 > 4 ? cfg->workers / 4 : 4), (size_t)cfg->queue_max,
                 &d->control_pool) < 0)
        return lb_error_set(err, -ENOMEM, "cannot start %lld workers", (long long)cfg->workers);
    if (!cfg->public_url && asprintf(&d->public_url, "http://%s", d->bound) < 0) {
        d->public_url = NULL;
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    daemon_map_config(d, &hc, &lc, &ac);
    r = auth_new(d->admin_hash, d->store, &d->auth, err);
    if (r == 0)
        r = lend_new(&lc, d->store, d->providers, &d->lend, err);
    if (r < 0)
        return r;
    if ((mkdir(ac.receipts_dir, 0700) < 0 && errno != EEXIST) || chmod(ac.receipts_dir, 0700) < 0)
        return lb_error_set(err, -errno, "cannot create '%s': %s", ac.receipts_dir,
                            strerror(errno));
    r = activations_new(&ac, d->store, d->lend, &d->acts, err);
    if (r < 0)
        return r;
    lend_set_release_hook(d->lend, activation_release_hook, d->acts);
    {
        char pty_dir[PATH_MAX];
        struct lb_pty_config pc = {.dir = pty_dir, .max_sessions = cfg->max_pty_sessions};

        snprintf(pty_dir, sizeof(pty_dir), "%s/pty", cfg->state_dir);
        r = pty_service_new(&pc, d->lend, d->store, &d->ptys, err);
        if (r < 0)
            return r;
    }
    d->app.ptys = d->ptys;
    r = follows_new(&d->app, &d->follows);
    if (r < 0)
        return lb_error_set(err, r, "cannot start the log follower thread: %s", strerror(-r));
    d->app.follows = d->follows;
    d->app.pool = d->pool;
    d->app.store = d->store;
    d->app.images_dir = d->images_dir;
    d->app.auth = d->auth;
    d->app.lend = d->lend;
    d->app.acts = d->acts;
    lend_set_draining(d->lend, true);
    d->listen_fd = -1; /* http_start takes it over */
    r = http_start(&hc, &d->http, err);
    if (r < 0)
        return r;
    if (write_listen_file(cfg->state_dir, http_bound_address(d->http)) < 0)
        log_warn("cannot write %s/listen", cfg->state_dir);
    log_info("lendboxd %s listening on http://%s (state dir %s)", LB_VERSION,
             http_bound_address(d->http), cfg->state_dir);
    return 0;
}

/* Startup reconciliation, the sweeper, then ready. */
static int daemon_become_ready(struct daemon *d, struct lb_error *err)
{
    struct lb_reconcile_stats rs;
    int64_t t0 = clock_mono_ms();
    int r = sweeper_reconcile(d->lend, &rs, err);

    if (r < 0)
        return r;
    log_info("reconciled in %lld ms: %d adopted, %d vanished, %d stopped, %d orphans "
             "stopped, %d failed",
             (long long)(clock_mono_ms() - t0), rs.adopted, rs.vanished, rs.stopped,
             rs.orphans_stopped, rs.failed);
    if (sweeper_start(d->lend, d->cfg.sweep_interval_s, &d->sweeper) < 0)
        log_error("cannot start the sweeper thread: no retries or TTL stops until a restart");
    struct lb_warm_config wc = {.size = d->cfg.pool_size,
                                .max_age_s = d->cfg.pool_max_age_s,
                                .refill_concurrency = d->cfg.pool_refill_concurrency};
    r = warm_start(&wc, d->lend, &d->warm, err);
    if (r < 0)
        return r;
    lend_set_draining(d->lend, false);
    atomic_store(&d->app.ready, true);
    sd_notify(0, "READY=1");
    return 0;
}

/* Serve until SIGTERM/SIGINT; SIGHUP reloads what can change at run time. */
static void daemon_wait_for_signal(struct daemon *d)
{
    for (;;) {
        int sig = 0;

        sigwait(&d->sigs, &sig);
        if (sig == SIGHUP) {
            reload_config(d->config_file, (const char *const *)d->sets, d->n_sets);
            continue;
        }
        log_info("signal %d: draining", sig);
        break;
    }
}

/* Drain: no new seeds, no sweeper, in-flight requests finish (execs still running after
 * drain_timeout_s are ended), then the shutdown sweep. */
static void daemon_drain(struct daemon *d)
{
    struct drain_watchdog dw = {.mutex = PTHREAD_MUTEX_INITIALIZER,
                                .cond = PTHREAD_COND_INITIALIZER,
                                .timeout_s = d->cfg.drain_timeout_s,
                                .providers = d->providers};
    bool dw_started;

    sd_notify(0, "STOPPING=1");
    atomic_store(&d->app.ready, false);
    lend_set_draining(d->lend, true);
    http_end_parked(d->http); /* long-polls get their answer now, not after the stop sweep */
    follows_stop(d->follows); /* followed logs too */
    sweeper_stop(d->sweeper);
    d->sweeper = NULL;
    dw_started = pthread_create(&dw.thread, NULL, drain_watchdog_main, &dw) == 0;
    if (!dw_started)
        (void)registry_end_execs(d->providers);
    pool_stop(d->pool);
    pool_stop(d->control_pool);
    warm_stop(d->warm); /* no refills during the sweep; warm sandboxes are swept like lent ones */
    d->warm = NULL;
    if (dw_started) {
        pthread_mutex_lock(&dw.mutex);
        dw.done = true;
        pthread_cond_signal(&dw.cond);
        pthread_mutex_unlock(&dw.mutex);
        pthread_join(dw.thread, NULL);
    }
    if (d->cfg.shutdown_sweep) {
        int failed = sweeper_stop_all(d->lend, "shutdown", (size_t)d->cfg.stop_concurrency);

        if (failed > 0)
            log_warn("shutdown sweep: %d sandboxes failed to stop; they stay recorded", failed);
    } else {
        log_info("shutdown_sweep = no: leaving lent (and warm) sandboxes running");
    }
}

/* Release everything, in reverse order of making; safe on a half-made daemon. */
static void daemon_close(struct daemon *d)
{
    warm_stop(d->warm);
    sweeper_stop(d->sweeper);
    follows_stop(d->follows); /* no kept stream may hold a connection past http_stop */
    http_stop(d->http);
    pool_destroy(d->pool);
    pool_destroy(d->control_pool);
    follows_free(d->follows);
    pty_service_free(d->ptys);
    activations_free(d->acts);
    lend_free(d->lend);
    auth_free(d->auth);
    registry_free(d->providers);
    store_close(d->store);
    if (d->listen_fd >= 0)
        close(d->listen_fd);
    if (d->lock_fd >= 0)
        close(d->lock_fd);
    for (int i = 0; d->sets && i < d->n_sets; i++)
        free(d->sets[i]);
    free(d->sets);
    free(d->supervise);
    free(d->images_dir);
    free(d->public_url);
    config_release(&d->cfg);
}

int main(int argc, char **argv)
{
    static struct daemon d = {.lock_fd = -1, .listen_fd = -1};
    struct lb_error err = {0};
    int rc;

    d.sets = calloc((size_t)argc + 1, sizeof(char *));
    if (!d.sets || config_init(&d.cfg) < 0) {
        fprintf(stderr, "lendboxd: out of memory\n");
        free(d.sets);
        return 1;
    }
    rc = daemon_parse_args(&d, argc, argv);
    if (rc >= 0)
        goto out;
    if (daemon_load_config(&d, &err) < 0)
        goto fail;
    if (optind < argc) { /* "image ...": the image store subcommand, no daemon */
        rc = image_command(&d.cfg, argc - optind - 1, argv + optind + 1);
        goto out;
    }
    daemon_setup_process(&d);
    if (daemon_fault_host_keyrings(&err) < 0 || daemon_open_state(&d, &err) < 0 ||
        daemon_open_backends(&d, &err) < 0 || daemon_start_services(&d, &err) < 0 ||
        daemon_become_ready(&d, &err) < 0)
        goto fail;
    daemon_wait_for_signal(&d);
    daemon_drain(&d);
    rc = 0;
    goto out;
fail:
    log_error("%s", err.message[0] ? err.message : "startup failed");
    rc = 1;
out:
    daemon_close(&d);
    return rc;
}
