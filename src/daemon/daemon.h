/*
 * daemon.h - lendboxd's wiring, shared by the daemon binary's own files and nothing else:
 * src/main.c (the command line), config.c (configuration), daemon.c (start, run, stop) and
 * image.c (the image subcommand). These are not in the internal library the tests link.
 *
 * main() calls, in order: daemon_load_config, then (unless a subcommand runs)
 * daemon_setup_process, daemon_fault_host_keyrings, daemon_open_state, daemon_open_backends,
 * daemon_start_services, daemon_become_ready, daemon_wait_for_signal, daemon_drain, and always
 * daemon_close. Functions that can fail return 0 or a negative errno with the detail in err.
 * All of them run on the main thread (daemon_drain starts and joins a watchdog thread of its
 * own).
 */
#ifndef LB_DAEMON_H
#define LB_DAEMON_H

#include <limits.h>
#include <signal.h>
#include <stdbool.h>

#include "activation/activation.h"
#include "auth/auth.h"
#include "http/http.h"
#include "lend/lend.h"
#include "lend/pty.h"
#include "pool/pool.h"
#include "provider/registry.h"
#include "routes/routes.h"
#include "store/store.h"
#include "sweeper/sweeper.h"
#include "util/config.h"
#include "util/error.h"
#include "util/token.h"
#include "warm/warm.h"

#define OPERATE_KEY_BYTES 32

/* The API's defaults that are not configuration keys (API.md): an exec without timeout_s. */
#define API_DEFAULT_EXEC_TIMEOUT_S 180

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
    struct lb_events_hub *events; /* GET /v1/events readers (routes/events.c) */
    struct lb_http *http;
    struct lb_app app;
    struct lb_sweeper *sweeper;
    struct lb_warm_pool *warm;
};

/* ---------- config.c ---------- */

/* Load d->config_file (if any), then d->sets over it; set the log level and load the fault
 * switch (LENDBOX_FAULTS, else the config's). Errors of the config loader, -EINVAL. */
int daemon_load_config(struct daemon *d, struct lb_error *err);
/* SIGHUP: reload what can change at run time (the log level and the fault spec) from the file
 * and the assignments; the rest needs a restart. Failures are logged and change nothing. */
void daemon_reload_config(const char *config_file, const char *const *sets, int n_sets);
/* The one place where lb_config becomes each component's configuration (into *hc, *lc, *ac and
 * d->app); strings are borrowed from d, which must outlive them. */
void daemon_map_config(struct daemon *d, struct lb_http_config *hc, struct lb_lend_config *lc,
                       struct lb_activation_config *ac);
/* Raise the soft fd limit to the hard one and plan the connection limits from it: *max_conn,
 * *per_ip and *per_ip_incomplete (config values win when set). Logs the plan. */
void daemon_plan_connections(struct lb_config *cfg, unsigned *max_conn, unsigned *per_ip,
                             unsigned *per_ip_incomplete);
/* lendbox-supervise beside the executable, else in ../libexec/lendbox/: a malloc'd path (the
 * caller's), NULL when neither is executable. */
char *daemon_supervise_path(void);
/* local.images_dir, or <state_dir>/images: a malloc'd path (the caller's), NULL out of
 * memory. */
char *daemon_images_dir(const struct lb_config *cfg);

/* ---------- image.c ---------- */

/* image_gc's question (store is a struct lb_store): does a live sandbox record hold this
 * digest? Errors read as yes. */
bool daemon_image_in_use(void *store, const char *digest);
/* lendboxd [OPTIONS] image import [--provider lxd] SOURCE NAME | list | rm NAME, with argc and
 * argv after the word "image". Returns the exit status (0, 1 failed, 2 usage). */
int daemon_image_command(const struct lb_config *cfg, int argc, char **argv);

/* ---------- daemon.c ---------- */

/* Process-wide setup before any thread exists: umask, signals, groups, subreaper, malloc
 * thresholds, the connection plan. */
void daemon_setup_process(struct daemon *d);
/* The fault switch host.keyrings (refuse the keyring calls to this process and its children).
 * Before any thread exists. Errors of seccomp_refuse_keyrings_to_self. */
int daemon_fault_host_keyrings(struct lb_error *err);
/* The state dir, its lock, the admin token and the operate-token key. -EBUSY (another lendboxd
 * holds the state dir), -EPERM/-EINVAL (unsafe or damaged files), -errno. */
int daemon_open_state(struct daemon *d, struct lb_error *err);
/* The API's socket, the store, the image store and the providers. */
int daemon_open_backends(struct daemon *d, struct lb_error *err);
/* Workers, auth, lending, activations, PTYs, log followers and HTTP (readiness stays 503 and
 * seeds are refused until daemon_become_ready). */
int daemon_start_services(struct daemon *d, struct lb_error *err);
/* Startup reconciliation, the sweeper and the warm pool; then ready. */
int daemon_become_ready(struct daemon *d, struct lb_error *err);
/* Serve until SIGTERM/SIGINT; SIGHUP reloads (daemon_reload_config). */
void daemon_wait_for_signal(struct daemon *d);
/* Drain (no new seeds, in-flight requests finish or their execs are ended after
 * drain_timeout_s), then the shutdown sweep. */
void daemon_drain(struct daemon *d);
/* Release everything in reverse order of making; safe on a half-made daemon. */
void daemon_close(struct daemon *d);

#endif
