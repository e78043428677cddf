/*
 * daemon.c - the daemon's life: process setup, the state dir and its secrets, the backends
 * (socket, store, image store, providers), the services (workers, auth, lending, activations,
 * PTYs, HTTP), reconciliation and readiness, the wait for a signal, the drain with its
 * watchdog and the shutdown sweep, and the release of everything in reverse. See daemon.h.
 */
#include "daemon/daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "image/image.h"
#include "sweeper/sweeper.h"
#include "util/clock.h"
#include "util/fault.h"
#include "util/log.h"

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
    struct timespec until = clock_realtime_after_ms(w->timeout_s * 1000);
    bool expired = false;

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

/* The fault switch host.keyrings: the daemon refuses itself the keyring calls, as a
 * container's syscall filter would (systemd-nspawn, Docker, Kubernetes' RuntimeDefault). Before
 * any thread exists. */
int daemon_fault_host_keyrings(struct lb_error *err)
{
    struct lb_error e = {0};

    if (fault_hit("host.keyrings", 0, &e) == 0)
        return 0;
    log_warn("injected fault host.keyrings: the keyring calls fail with EPERM in this daemon and "
             "everything it starts");
    return registry_refuse_keyrings_to_self(err);
}

/* Process-wide setup before any thread exists. */
void daemon_setup_process(struct daemon *d)
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
    daemon_plan_connections(&d->cfg, &d->max_conn, &d->per_ip, &d->per_ip_incomplete);
}

/* State dir, its lock, the admin token and the operate-token key. */
int daemon_open_state(struct daemon *d, struct lb_error *err)
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
int daemon_open_backends(struct daemon *d, struct lb_error *err)
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
    if (r == 0)
        store_events_configure(d->store, cfg->events_enabled, cfg->events_max_age_s,
                               cfg->events_max_count);
    if (r < 0)
        return r;
    if (cfg->default_disk_mib > cfg->max_disk_mib)
        return lb_error_set(err, -EINVAL,
                            "limits.default_disk_mib (%lld) is over limits.max_disk_mib (%lld)",
                            (long long)cfg->default_disk_mib, (long long)cfg->max_disk_mib);
    d->supervise = cfg->supervise_path ? strdup(cfg->supervise_path) : daemon_supervise_path();
    if (!d->supervise)
        return lb_error_set(err, -ENOENT, "lendbox-supervise not found; set local.supervise");
    d->images_dir = daemon_images_dir(cfg);
    if (!d->images_dir)
        return lb_error_set(err, -ENOMEM, "out of memory");
    /* an unusable image store leaves image "host" (as before it existed): warn, go on */
    if (image_store_init(d->images_dir, err) < 0 || image_store_clean_tmp(d->images_dir, err) < 0 ||
        image_gc(d->images_dir, daemon_image_in_use, d->store, err) < 0) {
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
int daemon_start_services(struct daemon *d, struct lb_error *err)
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
    /* the app is whole (but for its threads) before the threads that read it start */
    d->app.ptys = d->ptys;
    d->app.pool = d->pool;
    d->app.store = d->store;
    d->app.images_dir = d->images_dir;
    d->app.auth = d->auth;
    d->app.lend = d->lend;
    d->app.acts = d->acts;
    r = follows_new(&d->app, &d->follows);
    if (r < 0)
        return lb_error_set(err, r, "cannot start the log follower thread: %s", strerror(-r));
    d->app.follows = d->follows;
    r = events_hub_new(&d->app, &d->events);
    if (r < 0)
        return lb_error_set(err, r, "cannot start the event feed's thread: %s", strerror(-r));
    d->app.events = d->events;
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
int daemon_become_ready(struct daemon *d, struct lb_error *err)
{
    struct lb_reconcile_stats rs;
    int64_t t0 = clock_mono_ms();
    int r = sweeper_reconcile(d->lend, (size_t)d->cfg.stop_concurrency, &rs, err);

    if (r < 0)
        return r;
    log_info("reconciled in %lld ms: %d adopted, %d vanished, %d stopped, %d orphans "
             "stopped, %d failed",
             (long long)(clock_mono_ms() - t0), rs.adopted, rs.vanished, rs.stopped,
             rs.orphans_stopped, rs.failed);
    if (lend_recover_snapshots(d->lend, err) < 0)
        log_warn("cannot settle the snapshots a crash interrupted: %s", err->message);
    if (lend_collect_forks(d->lend, err) < 0)
        log_warn("cannot collect the fork snapshots nothing uses: %s", err->message);
    if (sweeper_start(d->lend, d->cfg.sweep_interval_s, &d->sweeper) < 0)
        log_error("cannot start the sweeper thread: no retries or TTL stops until a restart");
    struct lb_warm_config wc = {.size = d->cfg.pool_size,
                                .max_age_s = d->cfg.pool_max_age_s,
                                .refill_concurrency = d->cfg.pool_refill_concurrency,
                                .refill_nice = d->cfg.pool_refill_nice,
                                .recycle = d->cfg.pool_recycle,
                                .max_uses = d->cfg.pool_max_uses};
    r = warm_start(&wc, d->lend, &d->warm, err);
    if (r < 0)
        return r;
    lend_set_draining(d->lend, false);
    atomic_store(&d->app.ready, true);
    sd_notify(0, "READY=1");
    return 0;
}

/* Serve until SIGTERM/SIGINT; SIGHUP reloads what can change at run time. */
void daemon_wait_for_signal(struct daemon *d)
{
    for (;;) {
        int sig = 0;

        sigwait(&d->sigs, &sig);
        if (sig == SIGHUP) {
            daemon_reload_config(d->config_file, (const char *const *)d->sets, d->n_sets);
            continue;
        }
        log_info("signal %d: draining", sig);
        break;
    }
}

/* Drain: no new seeds, no sweeper, in-flight requests finish (execs still running after
 * drain_timeout_s are ended), then the shutdown sweep. */
void daemon_drain(struct daemon *d)
{
    struct drain_watchdog dw = {.mutex = PTHREAD_MUTEX_INITIALIZER,
                                .cond = PTHREAD_COND_INITIALIZER,
                                .timeout_s = d->cfg.drain_timeout_s,
                                .providers = d->providers};
    bool dw_started;

    sd_notify(0, "STOPPING=1");
    atomic_store(&d->app.ready, false);
    lend_set_draining(d->lend, true);
    http_end_parked(d->http);   /* long-polls get their answer now, not after the stop sweep */
    follows_stop(d->follows);   /* followed logs too */
    events_hub_stop(d->events); /* and event streams */
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
        registry_defer_cleanup(d->providers); /* dead sandboxes' files: at the next start */
        int failed = sweeper_stop_all(d->lend, "shutdown", (size_t)d->cfg.stop_concurrency);

        if (failed > 0)
            log_warn("shutdown sweep: %d sandboxes failed to stop; they stay recorded", failed);
    } else {
        log_info("shutdown_sweep = no: leaving lent (and warm) sandboxes running");
    }
}

/* Release everything, in reverse order of making; safe on a half-made daemon. */
void daemon_close(struct daemon *d)
{
    warm_stop(d->warm);
    sweeper_stop(d->sweeper);
    follows_stop(d->follows); /* no kept stream may hold a connection past http_stop */
    events_hub_stop(d->events);
    http_stop(d->http);
    pool_destroy(d->pool);
    pool_destroy(d->control_pool);
    follows_free(d->follows);
    events_hub_free(d->events);
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
