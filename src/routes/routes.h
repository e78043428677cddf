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
#include "lend/activation.h"
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
    struct lb_store *store; /* the records (images in use) */
    const char *images_dir; /* the image store (image/image.h) */
};

/* The route table (terminated by {NULL}) for http_start. */
extern const struct lb_route lb_routes[];

/* Print the route table to f, one route a line: "METHOD PATTERN AUTH NAME" (AUTH is none, admin,
 * sandbox or session; '*' in PATTERN matches one path segment). For `lendboxd routes` and the test
 * that compares the table with docs/openapi.yaml. Thread-safe (reads the constant table only). */
void routes_print(FILE *f);

/* The authorize hook for http_start; app is a struct lb_app. */
int routes_authorize(void *app, const char *token, enum lb_auth_need need, const char *sandbox_id,
                     enum lb_principal *who, struct lb_error *err);

/* --- shared by the route files --- */

/* Reject keys of obj not in allowed (NULL-terminated): -EINVAL "unknown field 'x'". */
int routes_check_fields(json_t *obj, const char *const *allowed, const char *what,
                        struct lb_error *err);
/* A resources session id: 1-128 characters of [A-Za-z0-9._:-], not "." or "..". */
bool routes_rsid_is_valid(const char *rsid);
/* obj[key] must be absent, or an object whose values are all strings. */
int routes_string_map(json_t *obj, const char *key, json_t **out, struct lb_error *err);
/* Answer the JSON object a job made, or its error. Steals body. */
void routes_respond(struct lb_request *req, int r, unsigned status, json_t *body,
                    const struct lb_error *err);
/* One file of a seed's "files" or an execute's "stage": a string (UTF-8 text) or {"base64",
 * "mode"}, at an absolute normalised path. Fills *f (the caller frees f->path and f->data). */
int routes_parse_file(const char *path, json_t *v, struct lb_seed_file *f, struct lb_error *err);
/* The "not built yet" handler: 501 not_implemented. */
int routes_not_implemented(struct lb_request *req, struct lb_error *err);

/* Serialise the request's deferred job with every other seed, release, close and delete of
 * resources session rsid (http_set_serial_key): a waiting one holds no worker. */
void routes_serialize_session(struct lb_request *req, const char *rsid);

/* Check the names of an env object (NULL is fine): non-empty, no '=', no control character
 * (bytes 1-31 and 127), no NUL. -EINVAL
 * (400) naming the field (what, e.g. "env") otherwise. */
int routes_check_env_names(json_t *env, const char *what, struct lb_error *err);

int route_seed(struct lb_request *req, struct lb_error *err);
int route_session_get(struct lb_request *req, struct lb_error *err);
int route_sessions_list(struct lb_request *req, struct lb_error *err);
int route_release(struct lb_request *req, struct lb_error *err);
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
int route_execute(struct lb_request *req, struct lb_error *err);
int route_close(struct lb_request *req, struct lb_error *err);
int route_activation_get(struct lb_request *req, struct lb_error *err);
int route_pause(struct lb_request *req, struct lb_error *err);
int route_resume(struct lb_request *req, struct lb_error *err);
int route_endpoint(struct lb_request *req, struct lb_error *err);
int route_healthz(struct lb_request *req, struct lb_error *err);
int route_readyz(struct lb_request *req, struct lb_error *err);
int route_metrics(struct lb_request *req, struct lb_error *err);

#endif
