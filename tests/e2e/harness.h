/*
 * harness.h - end-to-end test support: start the real lendboxd on loopback with its own state
 * dir, talk to it over real HTTP (libcurl), look at processes and files on the host.
 *
 * Binaries come from $LENDBOXD and $LENDBOX_SUPERVISE (the Makefile exports both).
 * Every function aborts the test (ck_abort) on harness failure, so tests stay short.
 */
#ifndef LBT_HARNESS_H
#define LBT_HARNESS_H

#include <check.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct lbt_daemon {
    pid_t pid;
    char state_dir[256];
    char base_url[128];
    char admin_token[256];
    char log_path[300];
};

struct lbt_resp {
    long status;
    char *body; /* NUL-terminated (body may also hold NULs: use len) */
    size_t len;
    json_t *json; /* parsed body when it is JSON, else NULL */
    char request_id[128];
    char headers[4096]; /* raw response headers */
};

/* Start lendboxd with a fresh state dir under /tmp and extra arguments (NULL-terminated list
 * of strings, may be NULL); wait until /readyz is 200. */
void lbt_daemon_start(struct lbt_daemon *d, const char *const *extra_args);
/* Same, reusing d->state_dir (a restart after lbt_daemon_kill). */
void lbt_daemon_restart(struct lbt_daemon *d, const char *const *extra_args);
/* SIGTERM and wait; returns the exit status (or -1 if it had to be killed). */
int lbt_daemon_stop(struct lbt_daemon *d);
/* SIGKILL and reap. */
void lbt_daemon_kill(struct lbt_daemon *d);
/* Stop the daemon if running and remove its state dir (and sandboxes). */
void lbt_daemon_cleanup(struct lbt_daemon *d);

/* One HTTP request. token NULL: no Authorization header; "" : admin token. body may be NULL.
 * content_type NULL: application/json when body is given. */
void lbt_request(struct lbt_daemon *d, const char *method, const char *path, const char *token,
                 const void *body, size_t body_len, const char *content_type,
                 struct lbt_resp *resp);
/* JSON convenience: body_json is a JSON text (or NULL). */
void lbt_json(struct lbt_daemon *d, const char *method, const char *path, const char *token,
              const char *body_json, struct lbt_resp *resp);
void lbt_resp_free(struct lbt_resp *resp);

/* Seed rsid with task_id and optional extra JSON members (e.g. "\"ttl_s\": 5"); asserts 200 and
 * returns the lease (caller decrefs). */
json_t *lbt_seed(struct lbt_daemon *d, const char *rsid, const char *task_id,
                 const char *extra_members);
/* The error code string of an error response ("" if none). */
const char *lbt_error_code(const struct lbt_resp *resp);

/* Host-side facts. */
int lbt_count_procs_of_uid(uid_t uid);
int lbt_count_procs_cmdline(const char *needle); /* processes whose cmdline contains needle */
bool lbt_path_exists(const char *path);
/* The host uid the sandbox's processes run as, from its descriptor in GET /v1/sandboxes. */
uid_t lbt_sandbox_uid(struct lbt_daemon *d, const char *sandbox_id);
/* Sleep milliseconds. */
void lbt_sleep_ms(long ms);

#endif
