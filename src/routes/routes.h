/*
 * routes.h - the HTTP contract of API.md mapped onto the services: one file per resource
 * (sessions.c, activations.c, sandboxes.c, ops.c), each parsing and validating input, calling
 * lend_* and rendering. No provider or SQL code here.
 */
#ifndef LB_ROUTES_H
#define LB_ROUTES_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "auth/auth.h"
#include "http/http.h"
#include "activation/activation.h"
#include "lend/lend.h"
#include "pool/pool.h"

/* What every handler can reach (http_app(req)). */
struct lb_app {
    struct lb_lend *lend;
    struct lb_auth *auth; /* who a bearer token is */
    struct lb_pool *pool;
    atomic_bool ready; /* startup reconciliation done and not draining */
    int64_t max_exec_timeout_s;
    int64_t max_execs_per_sandbox; /* execs of one sandbox queued or running at once (> 0) */
    int64_t default_exec_timeout_s;
    struct lb_activations *acts;
    struct lb_store *store;       /* the records (images in use) */
    const char *images_dir;       /* the image store (image/image.h) */
    int64_t max_wait_ms;          /* longest long-poll (limits.max_wait_ms) */
    int64_t max_fork;             /* sessions one fork may name (limits.max_fork) */
    int64_t max_file_bytes;       /* archives' bound (limits.max_file_bytes) */
    int64_t stop_concurrency;     /* releases in flight at once in release_all */
    struct lb_ptys *ptys;         /* PTY sessions and detached execs (lend/pty.h) */
    struct lb_follows *follows;   /* followed activation logs (follow.c) */
    struct lb_events_hub *events; /* the event feed's readers (events.c) */
};

/* events.c: GET /v1/events, the event feed (store.h) read from a seq on: one answer, a
 * long-poll (wait_ms: parked, no worker held, woken by the store's event hook) or an
 * application/x-ndjson stream written by the hub's streamer thread. */
struct lb_events_hub;
/* Start the hub (its streamer thread) and hang it on app->store's event hook. app (with its
 * store) must outlive it. 0, -ENOMEM, -errno. */
int events_hub_new(struct lb_app *app, struct lb_events_hub **out);
/* Unhook it from the store, end every stream (an error line "draining") and wake every
 * long-poll; later reads answer 503. Call before http_stop. Idempotent, NULL-safe. */
void events_hub_stop(struct lb_events_hub *h);
/* events_hub_stop, then free (NULL-safe). */
void events_hub_free(struct lb_events_hub *h);
int route_events(struct lb_request *req, struct lb_error *err);

/* follow.c: GET .../activation with Accept: application/x-ndjson streams the activation's
 * output log as {"stream": "log", "data"} lines while the harness runs, then the activation
 * object; one follower thread serves all of them (no worker held while waiting). */
struct lb_follows;
/* Start the follower thread. app must outlive it. -ENOMEM, -errno. */
int follows_new(struct lb_app *app, struct lb_follows **out);
/* Follow fd (the log, owned from now on) into s (a kept stream, http_stream_keep: the
 * reference is the follower's), until watch (owned; NULL: the harness has ended) says the
 * harness ended; then the final line (activation_get_text of rsid and own, copied: an operate
 * token's request renders its own activation or none) is written on app->pool and the stream
 * ended. On failure
 * the stream is ended with an error line. Thread-safe. 0, -ENOMEM, -ESHUTDOWN. */
int follows_add(struct lb_follows *fs, struct lb_stream *s, int fd, const char *rsid,
                const char *own, struct lb_activation_watch *watch);
/* End every follow (an error line "draining") and the thread; later adds are ended at once.
 * Call before http_stop (and before pool_stop: no new final jobs). Idempotent, NULL-safe. */
void follows_stop(struct lb_follows *fs);
/* follows_stop, then free (NULL-safe). */
void follows_free(struct lb_follows *fs);

/* The route table (terminated by {NULL}) for http_start. */
extern const struct lb_route lb_routes[];

/* Print the route table to f, one route a line: "METHOD PATTERN AUTH NAME" (AUTH is none, admin,
 * sandbox, session or pty; '*' in PATTERN matches one path segment). For `lendboxd routes` and the
 * test that compares the table with docs/openapi.yaml. Thread-safe (reads the constant table only).
 */
void routes_print(FILE *f);

/* The authorize hook for http_start; app is a struct lb_app. */
int routes_authorize(void *app, const char *token, enum lb_auth_need need, const char *sandbox_id,
                     enum lb_principal *who, struct lb_error *err);

/* --- parse.c: shared by the route files (a base: it calls no route file) --- */

/* Reject keys of obj not in allowed (NULL-terminated): -EINVAL "unknown field 'x'". */
int routes_check_fields(json_t *obj, const char *const *allowed, const char *what,
                        struct lb_error *err);
/* A resources session id: 1-128 characters of [A-Za-z0-9._:-], not "." or "..". */
bool routes_rsid_is_valid(const char *rsid);
/* obj[key] must be absent, or an object whose values are all strings. */
int routes_string_map(json_t *obj, const char *key, json_t **out, struct lb_error *err);
/* The bounds of a labels object (a seed's, a snapshot's): at most 64 entries, names of 1 to
 * 128 bytes, values of at most 1024 bytes. -EINVAL (400) naming what is past them. */
int routes_check_labels(json_t *labels, struct lb_error *err);
/* Answer the JSON object a job made, or its error. Steals body. */
void routes_respond(struct lb_request *req, int r, unsigned status, json_t *body,
                    const struct lb_error *err);
/* One item's result in a batch answer (a fork's children, a batch of seeds): {"rsid", "status":
 * 200, "lease"} when r is 0, else {"rsid", "status", "error": {"code", "message"}} with the
 * status and body http_respond_error would give err alone. rsid NULL renders null; lease and
 * err are borrowed. A new reference; NULL only without memory. Thread-safe. */
json_t *routes_item_result(const char *rsid, int r, json_t *lease, const struct lb_error *err);
/* One seed of a request that makes many (fork's children, seed_batch's items): filled before
 * the seeds run, then each item only by its own seed. */
struct routes_seed_item {
    const char *rsid; /* borrowed from the request's body; NULL: none or not a valid one */
    json_t *body;     /* the item's seed body (the request's strings point into it) */
    struct lb_seed_request req;
    json_t *lease;
    struct lb_error err;
    int r; /* < 0: the item's answer is this error (no seed, or the seed's failure) */
};
/* The items' results in order ({"rsid", "status", "lease" | "error"}, routes_item_result
 * each): a new array, or NULL without memory. Thread-safe. */
json_t *routes_seed_items_results(const struct routes_seed_item *items, size_t n);
/* Each item's body, request and lease, then the array itself (NULL: nothing). */
void routes_seed_items_free(struct routes_seed_item *items, size_t n);
/* A request that makes many seeds (fork's children, seed_batch's items), as its deferred job. */
struct routes_seeds_job {
    char id[LB_ID_MAX]; /* fork: the parent sandbox's id; "" otherwise */
    json_t *body;       /* the request's body */
    struct routes_seed_item *items;
    size_t n;
    struct lb_lend *lend; /* set by routes_seeds_job_seed */
    /* what seeds one item (lend_seed, lend_fork_child): thread-safe */
    int (*seed)(struct lb_lend *l, const char *rsid, const struct lb_seed_request *req,
                json_t **lease_out, struct lb_error *err);
    int sync_r; /* lend_sync_leases after the seeds: 0, or its error (in sync_err) */
    struct lb_error sync_err;
};
/* A new job for req whose items seed is to seed, with the request's body read: -ESHUTDOWN
 * while the daemon drains (no new seeds), -ENOMEM, or http_body_json's errors. On success *out
 * is the caller's (routes_seeds_job_free); on failure *out is NULL. */
int routes_seeds_job_new(struct lb_request *req,
                         int (*seed)(struct lb_lend *l, const char *rsid,
                                     const struct lb_seed_request *r, json_t **lease_out,
                                     struct lb_error *err),
                         struct routes_seeds_job **out, struct lb_error *err);
/* Seed every item whose r is still 0 with j->seed, at most threads at once; blocks until all
 * are done, then makes their leases durable with one sync (lend_sync_leases: each seed's
 * commit is left unsynced, sync_later) into j->sync_r. From the request's deferred job. */
void routes_seeds_job_seed(struct lb_request *req, struct routes_seeds_job *j, size_t threads);
/* Answer 200 {key: the items' results} (routes_seed_items_results), or 500 without memory or
 * when the leases could not be synced (j->sync_r: the sandboxes are lent and recorded; after a
 * restart of the daemon a seed of one of the sessions returns its sandbox). */
void routes_seeds_job_respond(struct lb_request *req, const struct routes_seeds_job *j,
                              const char *key);
/* The job's items and body, then the job (NULL: nothing); http_defer's free. */
void routes_seeds_job_free(void *arg);
/* A deferred job of one id and one number (renew's ttl_s, an endpoint's port). */
struct routes_id_num_job {
    char *id; /* owned */
    int64_t n;
};
/* A new job of a copy of id and n, or NULL without memory; free with routes_id_num_job_free. */
struct routes_id_num_job *routes_id_num_job_new(const char *id, int64_t n);
/* The job and its id (NULL: nothing); http_defer's free. */
void routes_id_num_job_free(void *arg);
/* A deferred job's run that asks lend one thing of the job's id and number (j: the job's
 * argument, borrowed): answers 200 with what fn made, or fn's error. */
void routes_respond_lend_id_num(struct lb_request *req,
                                int (*fn)(struct lb_lend *l, const char *id, int64_t n,
                                          json_t **out, struct lb_error *err),
                                const struct routes_id_num_job *j);
/* A deferred job's run that asks lend one thing of an id (a sandbox id, a resources session id):
 * answers 200 with what fn made, or fn's error. id is the job's argument (borrowed). */
void routes_respond_lend_id(struct lb_request *req,
                            int (*fn)(struct lb_lend *l, const char *id, json_t **out,
                                      struct lb_error *err),
                            const char *id);
/* -EINVAL with err set: what (the field, e.g. "'name'") is not an image name
 * (image_name_is_valid). */
int routes_bad_image_name(const char *what, struct lb_error *err);
/* The sandbox id id from a path (NULL: none) fits an id buffer (LB_ID_MAX bytes): 0, or
 * -ENOENT ("no sandbox") with err set. */
int routes_check_sandbox_id(const char *id, struct lb_error *err);
/* A list route's answer: 200 with what fn (lend_list_leases, lend_list_sandboxes) lists of
 * the query's state (NULL: every state), or fn's error returned. */
int routes_respond_list(struct lb_request *req,
                        int (*fn)(struct lb_lend *l, const char *state, json_t **out,
                                  struct lb_error *err),
                        struct lb_error *err);
/* A deferred job's work, run on a worker: the answer's body into *out (a new reference, NULL
 * for none) and 0, or an error with err set. app is the daemon's; job is what
 * routes_defer_job was given (borrowed). */
typedef int routes_job_fn(struct lb_app *app, void *job, json_t **out, struct lb_error *err);
/* http_defer a job whose worker runs fn on job and answers status with fn's body, or with fn's
 * error (routes_respond). job_free (may be NULL) is called on job once the job is done or when
 * it could not be queued, also when this call fails. 0, or -ENOMEM / http_defer's error, with
 * err set. Call after any serial or fair-share key is set. */
int routes_defer_job(struct lb_request *req, routes_job_fn *fn, unsigned status, void *job,
                     void (*job_free)(void *), struct lb_error *err);
/* --- the one parsing dialect of routes/: every route file parses with these --- */

/* One file of a seed's "files" or an execute's "stage": a string (UTF-8 text) or {"base64",
 * "mode"}, at an absolute normalised path. Fills *f (the caller frees f->path and f->data,
 * also after a failure). -EINVAL (400) with a message, -ENOMEM. */
int routes_parse_file(const char *path, json_t *v, struct lb_seed_file *f, struct lb_error *err);
/* A seed's "files" or an execute's "stage" (v; NULL or null: none, 0), each member parsed by
 * routes_parse_file into a new array *out (the caller's, as are its items' path and data),
 * *n counting every item tried, the failed one too, so that the caller frees what it holds.
 * -EINVAL (400) with the message not_object when v is not an object, routes_parse_file's
 * errors, -ENOMEM. */
int routes_parse_files(json_t *v, const char *not_object, struct lb_seed_file **out, size_t *n,
                       struct lb_error *err);
/* Path parameter 0 as a resources session id into *rsid (borrowed from the request; valid
 * while it lives). -EINVAL (400) when it is not a valid rsid. */
int routes_session_param(struct lb_request *req, const char **rsid, struct lb_error *err);
/* obj[key] as a boolean: absent or null leaves *out as it is (the caller's default); true or
 * false sets it; anything else is -EINVAL "'<key>' must be a boolean" (400). */
int routes_parse_bool(json_t *obj, const char *key, bool *out, struct lb_error *err);
/* obj[key] in seconds: absent or null gives def; else a finite number > 0 and (max_s > 0) at
 * most max_s, else -EINVAL (400). *ms is the value in milliseconds, rounded up. */
int routes_parse_seconds(json_t *obj, const char *key, double def, int64_t max_s, int64_t *ms,
                         struct lb_error *err);
/* A NULL-terminated copy of arr, a JSON array of strings without NUL (key names it in
 * messages): absent/null is an empty vector unless required (then -EINVAL); required also
 * needs a non-empty array; at most max entries; paths: each an absolute, normalised path.
 * *out is set even on failure (free it with routes_free_strings). -EINVAL (400), -ENOMEM. */
int routes_parse_strings(json_t *arr, const char *key, bool paths, bool required, size_t max,
                         char ***out, struct lb_error *err);
/* Free a vector of routes_parse_strings / routes_parse_command; NULL is fine. */
void routes_free_strings(char **v);
/* An exec's command: exactly one of body.command (a string, run as /bin/sh -c) and body.argv
 * (a non-empty array of strings, argv[0] non-empty), no NUL anywhere. *argv_out is a
 * NULL-terminated vector, set even on failure (free with routes_free_strings). -EINVAL, -ENOMEM. */
int routes_parse_command(json_t *body, char ***argv_out, struct lb_error *err);
/* The body of a seed or a create (POST /v1/sandboxes): NeMo Gym's SandboxSpec fields and the
 * seed's own, into *req (strings borrowed from body, which must outlive req; release req
 * with routes_spec_release, also after a failure). "network" is checked and parsed into
 * req->net (lending hands it to the provider as it is). task_id is required for a seed only.
 * -EINVAL (400), -EOPNOTSUPP (422: entrypoint), -ENOMEM. */
int routes_parse_spec(json_t *body, struct lb_seed_request *req, bool task_required,
                      struct lb_error *err);
void routes_spec_release(struct lb_seed_request *req);
/* The deferred job of a seed or a create: its body and the request parsed from it. */
struct routes_spec_job {
    json_t *body; /* keeps the strings req points into alive */
    struct lb_seed_request req;
};
/* Read the request's JSON body into j->body (j zeroed by the caller) and parse it into j->req
 * (routes_parse_spec, task_required as there): 0, or http_body_json's or routes_parse_spec's
 * error. Release j with routes_spec_job_release either way. */
int routes_spec_job_parse(struct lb_request *req, struct routes_spec_job *j, bool task_required,
                          struct lb_error *err);
/* j's request and body (j itself, not NULL, is the caller's). */
void routes_spec_job_release(struct routes_spec_job *j);

/* For an operate-token request about to act in sandbox id (start a process, write a file,
 * pause it): hold id's operate-token fence
 * as a writer (lend_fence_enter), then check the token again (http_reauthorize), so a reset either
 * waits for the act to start (its kill then ends it) or has revoked the token first (401); an
 * exclusive exec or a reset under way is -EBUSY (409). *held says whether the fence is held (never
 * for the admin's requests: 0 and false): the caller leaves it with lend_fence_leave once the act
 * has started or ended, or hands it to lend_exec (lb_exec_params.fence_held). 0, or a negative
 * errno with nothing held. On the request's job thread. */
int routes_operate_enter(struct lb_request *req, const char *id, bool *held, struct lb_error *err);
/* Leave what routes_operate_enter holds, if anything (clears *held). */
void routes_operate_leave(struct lb_request *req, const char *id, bool *held);
/* routes_operate_enter/leave for an operate-token read the daemon does itself (open a file,
 * make an archive, look up the session's activation, make an endpoint's relay): held as a
 * reader (lend_fence_enter_read: a raise waits for it but a paused sandbox is no reason to give
 * up), so a reset either waits for the read or has revoked the token (401); what the read
 * opened is its own episode's. */
int routes_operate_enter_read(struct lb_request *req, const char *id, bool *held,
                              struct lb_error *err);
void routes_operate_leave_read(struct lb_request *req, const char *id, bool *held);

/* Serialise the request's deferred job with every other seed, release, close and delete of
 * resources session rsid (http_set_serial_key): a waiting one holds no worker. */
void routes_serialize_session(struct lb_request *req, const char *rsid);

/* Check the names of an env object (NULL is fine): non-empty, no '=', no control character
 * (bytes 1-31 and 127), no NUL. -EINVAL
 * (400) naming the field (what, e.g. "env") otherwise. */
int routes_check_env_names(json_t *env, const char *what, struct lb_error *err);

/* The request's "user" (exec, activation, PTY): absent or null -> *out NULL; a non-empty
 * string (a name of the sandbox's /etc/passwd, NAME:GROUP, UID:GID) or an integer 0..65535
 * (stored back into body as its decimal string) -> *out borrowed from body. -EINVAL (400)
 * otherwise. Whether the sandbox knows the user is its provider's check. */
int routes_parse_user(json_t *body, const char **out, struct lb_error *err);

/* Where and as whom an exec, activation or PTY runs: the request's "cwd" (absent or null ->
 * *cwd_out left as it is; else an absolute, normalised path -> *cwd_out borrowed from body),
 * then its "user" (routes_parse_user into *user_out). -EINVAL (400), or -ENOMEM, otherwise. */
int routes_parse_cwd_user(json_t *body, const char **cwd_out, const char **user_out,
                          struct lb_error *err);
/* The environment of an exec or activation: env's names checked (routes_check_env_names; env
 * NULL: none), then routes_parse_cwd_user. Their errors. */
int routes_parse_env_cwd_user(json_t *body, json_t *env, const char **cwd_out,
                              const char **user_out, struct lb_error *err);

int route_seed(struct lb_request *req, struct lb_error *err);
int route_session_get(struct lb_request *req, struct lb_error *err);
int route_sessions_list(struct lb_request *req, struct lb_error *err);
int route_release(struct lb_request *req, struct lb_error *err);
int route_release_all(struct lb_request *req, struct lb_error *err);
/* POST /v1/sessions/seed_batch {"items": [{"rsid", ...seed body...}]} (admin, 1 to 256 items):
 * 200 {"results": [...]}, one per item in order (seed_batch.c) */
int route_seed_batch(struct lb_request *req, struct lb_error *err);
int route_sandbox_create(struct lb_request *req, struct lb_error *err);
int route_stop_harness(struct lb_request *req, struct lb_error *err);
int route_sandbox_get(struct lb_request *req, struct lb_error *err);
int route_sandboxes_list(struct lb_request *req, struct lb_error *err);
/* images.c: GET /v1/images, DELETE /v1/images/NAME, POST /v1/images (501 for now) */
int route_images_list(struct lb_request *req, struct lb_error *err);
int route_image_delete(struct lb_request *req, struct lb_error *err);
int route_image_import(struct lb_request *req, struct lb_error *err);
int route_sandbox_delete(struct lb_request *req, struct lb_error *err);
int route_exec(struct lb_request *req, struct lb_error *err);
int route_file_put(struct lb_request *req, struct lb_error *err);
int route_file_get(struct lb_request *req, struct lb_error *err);
/* archive.c: PUT/GET /v1/sandboxes/{id}/archive?path=DIR, a directory as a tar archive. */
int route_archive_put(struct lb_request *req, struct lb_error *err);
int route_archive_get(struct lb_request *req, struct lb_error *err);
int route_execute(struct lb_request *req, struct lb_error *err);
int route_close(struct lb_request *req, struct lb_error *err);
int route_activation_get(struct lb_request *req, struct lb_error *err);
int route_pause(struct lb_request *req, struct lb_error *err);
/* POST /v1/sandboxes/{id}/snapshot {"name", "labels"?} (admin): 201 the new image */
int route_snapshot(struct lb_request *req, struct lb_error *err);
/* POST /v1/sandboxes/{id}/fork {"sessions", "task_id"?, "labels"?} (admin): 200 {"children"} */
int route_fork(struct lb_request *req, struct lb_error *err);
/* POST /v1/sandboxes/{id}/reset {"snapshot"?: NAME} (admin): lend_reset; 200 the lease. */
int route_sandbox_reset(struct lb_request *req, struct lb_error *err);
int route_resume(struct lb_request *req, struct lb_error *err);
/* POST /v1/sandboxes/{id}/renew {"ttl_s"} (admin or operate): 200 {"sandbox_id", "expires_at"} */
int route_renew(struct lb_request *req, struct lb_error *err);
int route_endpoint(struct lb_request *req, struct lb_error *err);
/* contexts.c: code contexts */
int route_context_create(struct lb_request *req, struct lb_error *err);
int route_context_run(struct lb_request *req, struct lb_error *err);
int route_context_interrupt(struct lb_request *req, struct lb_error *err);
int route_context_delete(struct lb_request *req, struct lb_error *err);

/* pty.c: PTY sessions and detached execs */
int route_pty_create(struct lb_request *req, struct lb_error *err);
int route_pty_output(struct lb_request *req, struct lb_error *err);
int route_pty_input(struct lb_request *req, struct lb_error *err);
int route_pty_resize(struct lb_request *req, struct lb_error *err);
int route_pty_signal(struct lb_request *req, struct lb_error *err);
int route_pty_attach(struct lb_request *req, struct lb_error *err);
int route_pty_wait(struct lb_request *req, struct lb_error *err);
int route_pty_delete(struct lb_request *req, struct lb_error *err);
int route_healthz(struct lb_request *req, struct lb_error *err);
int route_readyz(struct lb_request *req, struct lb_error *err);
int route_metrics(struct lb_request *req, struct lb_error *err);

#endif
