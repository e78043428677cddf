/* routes.c - the route table and what the route files share. */
#include "routes/routes.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lend/pty.h"
#include "provider/provider.h"
#include "util/token.h"

const struct lb_route lb_routes[] = {
    {"GET", "/healthz", LB_AUTH_NONE, false, route_healthz, "healthz", false},
    {"GET", "/readyz", LB_AUTH_NONE, false, route_readyz, "readyz", false},
    {"GET", "/metrics", LB_AUTH_NONE, false, route_metrics, "metrics", false},
    {"GET", "/v1/sessions", LB_AUTH_ADMIN, false, route_sessions_list, "sessions_list", false},
    {"GET", "/v1/sessions/*", LB_AUTH_ADMIN, false, route_session_get, "session_get", false},
    {"POST", "/v1/sessions/*/seed", LB_AUTH_ADMIN, false, route_seed, "seed", true},
    {"POST", "/v1/sessions/*/release", LB_AUTH_ADMIN, false, route_release, "release", true},
    {"POST", "/v1/sessions/release_all", LB_AUTH_ADMIN, false, route_release_all, "release_all",
     true},
    {"POST", "/v1/sessions/*/execute", LB_AUTH_SESSION, false, route_execute, "execute", false},
    {"POST", "/v1/sessions/*/close", LB_AUTH_SESSION, false, route_close, "close", true},
    {"POST", "/v1/sessions/*/stop_harness", LB_AUTH_SESSION, false, route_stop_harness,
     "stop_harness", true},
    {"GET", "/v1/sessions/*/activation", LB_AUTH_SESSION, false, route_activation_get, "activation",
     false},
    {"GET", "/v1/sandboxes", LB_AUTH_ADMIN, false, route_sandboxes_list, "sandboxes_list", false},
    {"POST", "/v1/sandboxes", LB_AUTH_ADMIN, false, route_sandbox_create, "sandbox_create", true},
    {"GET", "/v1/sandboxes/*", LB_AUTH_SANDBOX, false, route_sandbox_get, "sandbox_get", false},
    {"DELETE", "/v1/sandboxes/*", LB_AUTH_ADMIN, false, route_sandbox_delete, "sandbox_delete",
     true},
    {"POST", "/v1/sandboxes/*/exec", LB_AUTH_SANDBOX, false, route_exec, "exec", false},
    {"PUT", "/v1/sandboxes/*/files", LB_AUTH_SANDBOX, true, route_file_put, "file_put", false},
    {"GET", "/v1/sandboxes/*/files", LB_AUTH_SANDBOX, false, route_file_get, "file_get", false},
    {"POST", "/v1/sandboxes/*/pause", LB_AUTH_SANDBOX, false, route_pause, "pause", false},
    {"POST", "/v1/sandboxes/*/snapshot", LB_AUTH_ADMIN, false, route_snapshot, "snapshot", false},
    {"POST", "/v1/sandboxes/*/resume", LB_AUTH_SANDBOX, false, route_resume, "resume", false},
    {"GET", "/v1/sandboxes/*/endpoints/*", LB_AUTH_SANDBOX, false, route_endpoint, "endpoints",
     false},
    {"POST", "/v1/sandboxes/*/pty", LB_AUTH_SANDBOX, false, route_pty_create, "pty_create", false},
    {"GET", "/v1/pty/*/output", LB_AUTH_PTY, false, route_pty_output, "pty_output", false},
    {"POST", "/v1/pty/*/input", LB_AUTH_PTY, false, route_pty_input, "pty_input", false},
    {"POST", "/v1/pty/*/resize", LB_AUTH_PTY, false, route_pty_resize, "pty_resize", false},
    {"POST", "/v1/pty/*/signal", LB_AUTH_PTY, false, route_pty_signal, "pty_signal", false},
    {"POST", "/v1/pty/*/attach", LB_AUTH_PTY, false, route_pty_attach, "pty_attach", false},
    {"GET", "/v1/pty/*/wait", LB_AUTH_PTY, false, route_pty_wait, "pty_wait", false},
    {"DELETE", "/v1/pty/*", LB_AUTH_PTY, false, route_pty_delete, "pty_delete", false},
    {"GET", "/v1/images", LB_AUTH_ADMIN, false, route_images_list, "images_list", false},
    {"POST", "/v1/images", LB_AUTH_ADMIN, true, route_image_import, "image_import", false},
    {"DELETE", "/v1/images/*", LB_AUTH_ADMIN, false, route_image_delete, "image_delete", true},
    {NULL, NULL, LB_AUTH_NONE, false, NULL, NULL, false},
};

void routes_print(FILE *f)
{
    /* by enum lb_auth_need: "session" is admin or the operate token of the sandbox lent to
     * the session (the activation routes), "pty" the same for a PTY session's sandbox */
    static const char *const auth_names[] = {"none", "admin", "sandbox", "session", "pty"};
    const size_t n_names = sizeof(auth_names) / sizeof(auth_names[0]);

    for (const struct lb_route *r = lb_routes; r->method; r++)
        fprintf(f, "%s %s %s %s\n", r->method, r->pattern,
                (size_t)r->auth < n_names ? auth_names[r->auth] : "other", r->name);
}

int routes_authorize(void *app, const char *token, enum lb_auth_need need, const char *sandbox_id,
                     enum lb_principal *who, struct lb_error *err)
{
    struct lb_app *a = app;
    char sbx[LB_ID_MAX];
    const char *target = sandbox_id;
    struct lb_record live = {0};
    int r;

    if (need == LB_AUTH_PTY) {
        /* the session's sandbox decides; an unknown session is nobody's (admin only: 404) */
        bool known = a->ptys && pty_sandbox_of(a->ptys, sandbox_id, sbx, sizeof(sbx)) == 0;

        target = known ? sbx : NULL;
        r = auth_authorize(a->auth, token, LB_AUTH_SANDBOX, target, who, err);
    } else {
        r = auth_authorize(a->auth, token, need, sandbox_id, who, err);
    }
    if (r < 0 || *who != LB_PRINCIPAL_OPERATE)
        return r;
    /* Every call made with an operate token passes here: while an exclusive exec runs in the
     * token's sandbox, none of them reaches it (409, naming the exec). For a session route
     * the sandbox is the session's live one (an exec needs a live sandbox). */
    if (need == LB_AUTH_SESSION) {
        target = NULL;
        if (a->store && sandbox_id &&
            store_get_live_by_rsid(a->store, sandbox_id, &live, NULL) == 0)
            target = live.id;
    }
    if (target)
        r = lend_fence_check(a->lend, target, err);
    store_record_release(&live);
    return r;
}

int routes_check_fields(json_t *obj, const char *const *allowed, const char *what,
                        struct lb_error *err)
{
    const char *key;
    json_t *v;

    json_object_foreach(obj, key, v) {
        bool ok = false;

        for (size_t i = 0; allowed[i] && !ok; i++)
            ok = strcmp(key, allowed[i]) == 0;
        if (!ok)
            return lb_error_set(err, -EINVAL, "unknown field '%s' in %s", key, what);
    }
    return 0;
}

bool routes_rsid_is_valid(const char *rsid)
{
    size_t n = strlen(rsid);

    if (n == 0 || n > 128)
        return false;
    /* "." and ".." match the character set but are path segments to every HTTP client, which
     * rewrite /v1/sessions/../release to /v1/release: such a session could not be released */
    if (strcmp(rsid, ".") == 0 || strcmp(rsid, "..") == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = rsid[i];

        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-'))
            return false;
    }
    return true;
}

int routes_string_map(json_t *obj, const char *key, json_t **out, struct lb_error *err)
{
    json_t *m = json_object_get(obj, key);
    const char *k;
    json_t *v;

    *out = NULL;
    if (!m || json_is_null(m))
        return 0;
    if (!json_is_object(m))
        return lb_error_set(err, -EINVAL, "'%s' must be an object of strings", key);
    json_object_foreach(m, k, v) {
        if (!json_is_string(v))
            return lb_error_set(err, -EINVAL, "'%s.%s' must be a string", key, k);
    }
    *out = m;
    return 0;
}

void routes_respond(struct lb_request *req, int r, unsigned status, json_t *body,
                    const struct lb_error *err)
{
    if (r < 0) {
        json_decref(body);
        http_respond_error(req, err);
        return;
    }
    http_respond_json(req, status, body);
}

void routes_respond_lend_id(struct lb_request *req,
                            int (*fn)(struct lb_lend *l, const char *id, json_t **out,
                                      struct lb_error *err),
                            const char *id)
{
    struct lb_app *app = http_app(req);
    struct lb_error err = {0};
    json_t *out = NULL;
    int r = fn(app->lend, id, &out, &err);

    routes_respond(req, r, 200, out, &err);
}

void routes_serialize_session(struct lb_request *req, const char *rsid)
{
    char key[160];

    snprintf(key, sizeof(key), "session:%s", rsid);
    http_set_serial_key(req, key);
}

int routes_parse_user(json_t *body, const char **out, struct lb_error *err)
{
    json_t *user = json_object_get(body, "user");

    *out = NULL;
    if (!user || json_is_null(user))
        return 0;
    if (json_is_integer(user)) {
        json_int_t v = json_integer_value(user);

        if (v < 0 || v > 65535)
            return lb_error_set(err, -EINVAL, "'user' %lld is outside the sandbox's ids (0..65535)",
                                (long long)v);
        if (json_object_set_new(body, "user", json_sprintf("%lld", (long long)v)) < 0)
            return lb_error_set(err, -ENOMEM, "out of memory");
        user = json_object_get(body, "user");
    }
    if (!json_is_string(user) || json_string_length(user) == 0 ||
        strlen(json_string_value(user)) != json_string_length(user))
        return lb_error_set(err, -EINVAL, "'user' must be a non-empty string or a uid");
    *out = json_string_value(user);
    return 0;
}

int routes_parse_cwd_user(json_t *body, const char **cwd_out, const char **user_out,
                          struct lb_error *err)
{
    json_t *cwd = json_object_get(body, "cwd");

    if (cwd && !json_is_null(cwd)) {
        if (!json_is_string(cwd) || !provider_path_is_valid(json_string_value(cwd)))
            return lb_error_set(err, -EINVAL, "'cwd' must be an absolute, normalised path");
        *cwd_out = json_string_value(cwd);
    }
    return routes_parse_user(body, user_out, err);
}

int routes_check_env_names(json_t *env, const char *what, struct lb_error *err)
{
    const char *k;
    size_t klen;
    json_t *v;

    json_object_keylen_foreach(env, k, klen, v)
    {
        const unsigned char *c;

        if (klen == 0)
            return lb_error_set(err, -EINVAL, "'%s' has an empty variable name", what);
        /* a NUL inside a name would cut it short in the "NAME=value" string */
        if (strlen(k) != klen)
            return lb_error_set(err, -EINVAL, "'%s' has a variable name with a NUL byte", what);
        for (c = (const unsigned char *)k; *c; c++) {
            if (*c == '=')
                return lb_error_set(err, -EINVAL,
                                    "'%s' name '%s' contains '=' (the name ends at the first '=')",
                                    what, k);
            if (*c < 0x20 || *c == 0x7f)
                return lb_error_set(err, -EINVAL,
                                    "'%s' name '%s' contains the control character 0x%02x", what, k,
                                    (unsigned)*c);
        }
    }
    return 0;
}

int routes_session_param(struct lb_request *req, const char **rsid, struct lb_error *err)
{
    *rsid = http_param(req, 0);
    if (!*rsid || !routes_rsid_is_valid(*rsid))
        return lb_error_set(err, -EINVAL,
                            "invalid resources session id: 1-128 characters of [A-Za-z0-9._:-]");
    return 0;
}

int routes_parse_bool(json_t *obj, const char *key, bool *out, struct lb_error *err)
{
    json_t *v = json_object_get(obj, key);

    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return lb_error_set(err, -EINVAL, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

int routes_parse_seconds(json_t *obj, const char *key, double def, int64_t max_s, int64_t *ms,
                         struct lb_error *err)
{
    json_t *v = json_object_get(obj, key);
    double t = def;

    if (v && !json_is_null(v)) {
        if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
            return lb_error_set(err, -EINVAL, "'%s' must be a number > 0", key);
        t = json_number_value(v);
        if (max_s > 0 && t > (double)max_s)
            return lb_error_set(err, -EINVAL, "'%s' must be at most %lld", key, (long long)max_s);
    }
    *ms = (int64_t)ceil(t * 1000.0);
    return 0;
}

int routes_parse_strings(json_t *arr, const char *key, bool paths, bool required, size_t max,
                         char ***out, struct lb_error *err)
{
    json_t *v;
    size_t i;

    *out = NULL;
    if (!arr || json_is_null(arr)) {
        if (required)
            return lb_error_set(err, -EINVAL, "'%s' is required", key);
        *out = calloc(1, sizeof(char *));
        return *out ? 0 : lb_error_set(err, -ENOMEM, "out of memory");
    }
    if (!json_is_array(arr) || (required && json_array_size(arr) == 0))
        return lb_error_set(err, -EINVAL, "'%s' must be a%s array of strings", key,
                            required ? " non-empty" : "n");
    if (json_array_size(arr) > max)
        return lb_error_set(err, -EINVAL, "'%s' may hold at most %zu entries", key, max);
    *out = calloc(json_array_size(arr) + 1, sizeof(char *));
    if (!*out)
        return lb_error_set(err, -ENOMEM, "out of memory");
    json_array_foreach(arr, i, v) {
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
            return lb_error_set(err, -EINVAL, "'%s' must hold strings without NUL", key);
        if (paths && !provider_path_is_valid(json_string_value(v)))
            return lb_error_set(err, -EINVAL,
                                "'%s' entry '%s' must be an absolute, normalised "
                                "path",
                                key, json_string_value(v));
        (*out)[i] = strdup(json_string_value(v));
        if (!(*out)[i])
            return lb_error_set(err, -ENOMEM, "out of memory");
    }
    return 0;
}

void routes_free_strings(char **v)
{
    for (size_t i = 0; v && v[i]; i++)
        free(v[i]);
    free(v);
}

int routes_parse_command(json_t *body, char ***argv_out, struct lb_error *err)
{
    json_t *command = json_object_get(body, "command"), *argv = json_object_get(body, "argv");
    json_t *v;
    char **a;
    size_t i;

    if (command && json_is_null(command))
        command = NULL;
    if (argv && json_is_null(argv))
        argv = NULL;
    if ((command != NULL) == (argv != NULL))
        return lb_error_set(err, -EINVAL, "give exactly one of 'command' (string) or 'argv'");
    if (command) {
        if (!json_is_string(command))
            return lb_error_set(err, -EINVAL, "'command' must be a string");
        a = *argv_out = calloc(4, sizeof(char *));
        if (!a || !(a[0] = strdup("/bin/sh")) || !(a[1] = strdup("-c")) ||
            !(a[2] = strndup(json_string_value(command), json_string_length(command))))
            return lb_error_set(err, -ENOMEM, "out of memory");
        if (strlen(a[2]) != json_string_length(command))
            return lb_error_set(err, -EINVAL, "'command' must not contain NUL");
        return 0;
    }
    if (!json_is_array(argv) || json_array_size(argv) == 0)
        return lb_error_set(err, -EINVAL, "'argv' must be a non-empty array of strings");
    a = *argv_out = calloc(json_array_size(argv) + 1, sizeof(char *));
    if (!a)
        return lb_error_set(err, -ENOMEM, "out of memory");
    json_array_foreach(argv, i, v) {
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
            return lb_error_set(err, -EINVAL, "'argv' must hold strings without NUL");
        a[i] = strdup(json_string_value(v));
        if (!a[i])
            return lb_error_set(err, -ENOMEM, "out of memory");
    }
    if (!a[0][0])
        return lb_error_set(err, -EINVAL, "'argv[0]' must not be empty");
    return 0;
}

int routes_parse_file(const char *path, json_t *v, struct lb_seed_file *f, struct lb_error *err)
{
    static const char *const fields[] = {"base64", "mode", NULL};
    int r;

    if (!provider_path_is_valid(path))
        return lb_error_set(err, -EINVAL,
                            "file path '%s' must be absolute and normalised (no '..')", path);
    f->mode = -1;
    if (json_is_string(v)) {
        f->len = json_string_length(v);
        f->data = malloc(f->len + 1);
        if (!f->data)
            return lb_error_set(err, -ENOMEM, "out of memory");
        memcpy(f->data, json_string_value(v), f->len);
    } else if (json_is_object(v)) {
        json_t *b64 = json_object_get(v, "base64"), *mode = json_object_get(v, "mode");

        r = routes_check_fields(v, fields, "a seed file", err);
        if (r < 0)
            return r;
        if (!json_is_string(b64))
            return lb_error_set(err, -EINVAL, "file '%s' needs a 'base64' string", path);
        if (token_base64_decode(json_string_value(b64), json_string_length(b64), &f->data,
                                &f->len) < 0)
            return lb_error_set(err, -EINVAL, "file '%s' has malformed base64", path);
        if (mode) {
            if (!json_is_integer(mode) || json_integer_value(mode) < 0 ||
                json_integer_value(mode) > 07777)
                return lb_error_set(err, -EINVAL, "file '%s' mode must be 0..4095 (07777)", path);
            f->mode = (int)json_integer_value(mode);
        }
    } else {
        return lb_error_set(err, -EINVAL, "file '%s' must be a string or {\"base64\", \"mode\"}",
                            path);
    }
    f->path = strdup(path);
    return f->path ? 0 : lb_error_set(err, -ENOMEM, "out of memory");
}
