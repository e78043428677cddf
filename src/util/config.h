/*
 * config.h - lendboxd's configuration: built-in defaults, then the INI file (inih), then
 * command-line flags and `--set SECTION.KEY=VALUE`. Every key is listed, with its default and
 * meaning, in etc/lendbox.conf; config.c holds the one table that defines them.
 *
 * Not thread-safe while being filled; read-only (and so shareable) once the daemon runs.
 */
#ifndef LB_CONFIG_H
#define LB_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

struct lb_config {
    /* [server] */
    char *listen;           /* "HOST:PORT"; port 0 picks a free one */
    char *state_dir;        /* SQLite file, admin token, listen file, sandbox dirs */
    char *admin_token_file; /* NULL: <state_dir>/admin.token */
    char *public_url;       /* base_url handed to harnesses; NULL: http://<bound address> */
    char *log_level;
    int64_t http_threads;
    int64_t workers;
    int64_t queue_max;
    int64_t connection_timeout_s;
    int64_t store_reserve_mib;
    int64_t header_timeout_s;   /* deadline of a request line and headers (from accept or the
                                 * previous request's end) */
    int64_t max_connections;    /* 0: from the fd limit (see daemon/config.c) */
    int64_t per_ip_connections; /* 0: max_connections / 2 */
    int64_t per_ip_incomplete;  /* connections of one address still sending their headers;
                                 * 0: per_ip_connections / 4, at most 64 */
    int64_t fd_reserve;         /* fds kept from connections; 0: from workers */
    /* [lending] */
    int64_t stop_concurrency;
    int64_t stop_timeout_s;
    int64_t default_ttl_s; /* 0: no TTL */
    int64_t max_ttl_s;     /* 0: no cap */
    bool shutdown_sweep;
    int64_t retry_base_s;
    int64_t retry_max_s;
    int64_t sweep_interval_s;
    int64_t max_sandboxes;
    int64_t retention_s;
    char *default_image;
    char *workdir;
    int64_t create_timeout_s;
    int64_t default_pids;
    int64_t session_lock_wait_s; /* longest wait for a busy session's lock (409 past it) */
    int64_t drain_timeout_s;     /* on SIGTERM: longest wait for in-flight execs, then killed */
    int64_t max_starting;        /* creates at once (lend/admission.h); -1: 2 x online CPUs */
    int64_t max_seed_queue;      /* seeds waiting past max_starting; -1: derived, 0: none */
    /* [limits] */
    int64_t max_body_bytes;
    int64_t max_file_bytes;
    int64_t max_image_bytes;    /* an image archive uploaded to POST /v1/images (streamed) */
    int64_t max_inflight_bytes; /* buffered request bodies together; 0: no cap */
    int64_t max_answer_bytes;   /* answers rendered in memory, being made or sent; 0: no cap */
    int64_t max_output_bytes;
    int64_t max_json_depth;
    int64_t max_exec_timeout_s;
    int64_t max_execs_per_sandbox; /* execs of one sandbox queued or running; 0: workers / 4 */
    int64_t default_disk_mib;
    int64_t max_disk_mib;
    int64_t max_wait_ms;      /* longest long-poll (GET .../activation?wait_ms=) */
    int64_t max_fork;         /* sessions one POST /v1/sandboxes/{id}/fork may name */
    int64_t max_pty_sessions; /* PTY sessions (and detached execs) per sandbox, exited ones until
                                 deleted */
    /* [provider] */
    char *provider;          /* the default provider (provider/registry.h) */
    char *providers_enabled; /* more providers seeds may name; NULL: only the default */
    /* [local] */
    char *bwrap_path;
    char *supervise_path;
    char *images_dir;
    /* image for seeds that name none: NAME, or a list "NAME NAME ... [host]" of which the first
     * present in the image store at seed time wins; NULL: lending.default_image */
    char *local_default_image;
    char *cgroup_parent;
    int64_t uid_base;
    int64_t uid_count;
    int64_t tmp_size_mib;
    char *storage;          /* "tmpfs" or "dir" */
    char *data_dir;         /* storage dir: NULL means <state_dir>/data */
    int64_t sandbox_nofile; /* RLIMIT_NOFILE (soft and hard) of sandbox processes */
    bool reset_in_place;    /* local: a reset may keep the namespaces (local/reset.c) */
    /* [docker] */
    char *docker_socket;        /* the engine's unix socket */
    char *docker_default_image; /* image of a seed without one; NULL: none */
    char *docker_instance;      /* container label value; NULL: derived from the state dir */
    /* [lxd] */
    char *lxd_socket;               /* a member's unix socket; or lxd_url with the three PEMs: */
    char *lxd_url;                  /* "https://host:port" of a member */
    char *lxd_cert, *lxd_key;       /* the client certificate and key */
    char *lxd_server_cert;          /* the cluster certificate, whose key is pinned */
    char *lxd_default_image;        /* LXD image alias of a seed without one; NULL: none */
    char *lxd_target;               /* member or "@group" for new instances; NULL: the cluster's */
    char *lxd_instance;             /* user.lendbox.instance value; NULL: derived from state dir */
    int64_t lxd_call_timeout_s;     /* bound on each LXD API call */
    int64_t lxd_create_concurrency; /* instances made and started at once */
    int64_t lxd_idmap_base;  /* first host id of the instances' id slots; 0: from /etc/subuid */
    int64_t lxd_idmap_count; /* slots of 65536 ids; 0: as many as the range holds */
    char *lxd_supervise_host_path; /* lendbox-supervise on every member's host; NULL: pushed */
    /* [security] */
    bool seccomp;       /* the default seccomp filter for every sandbox process */
    char *seccomp_deny; /* extra syscall names to refuse (EPERM), space/comma separated */
    /* [network] */
    char *net_range;
    char *net_inherit;
    char *net_nft_table;
    /* [pool] warm pools (src/warm/) */
    int64_t pool_size;               /* warm sandboxes of the default class; 0: no pool */
    int64_t pool_max_age_s;          /* replaced past this age; 0: never */
    bool pool_adopt;                 /* startup: warm sandboxes that run go back in the pool */
    int64_t pool_refill_concurrency; /* warm sandboxes made at once */
    int64_t pool_refill_nice;        /* refill threads' nice value above the daemon's */
    /* [events] the event feed (store.h, "the event feed") */
    bool events_enabled;      /* false only to measure what the event write costs (bench) */
    int64_t events_max_age_s; /* retention by age; 0: none */
    int64_t events_max_count; /* the newest kept; 0: no limit */
    bool pool_recycle;        /* a released pooled sandbox goes back to the pool */
    int64_t pool_max_uses;    /* lends of one recycled line before it is stopped */
    /* [faults] */
    char *faults_spec;
};

/* Fill cfg with the built-in defaults. Returns 0 or -ENOMEM. */
int config_init(struct lb_config *cfg);
/* Free every string; cfg may be re-initialised afterwards. */
void config_release(struct lb_config *cfg);
/* Read an INI file into cfg. -ENOENT if missing, -EINVAL (with line) on bad syntax/key/value. */
int config_load_file(struct lb_config *cfg, const char *path, struct lb_error *err);
/* Set one key from "section.key=value" (the --set flag). -EINVAL on an unknown key or value. */
int config_set_assignment(struct lb_config *cfg, const char *assignment, struct lb_error *err);
/* Set one key by section and name. -EINVAL on an unknown key or a bad value. */
int config_set(struct lb_config *cfg, const char *section, const char *key, const char *value,
               struct lb_error *err);

#endif
