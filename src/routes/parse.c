/* parse.c - what the route files share: the one parsing dialect of routes/ (fields, strings,
 * seconds, commands, files, cwd and user, env names) and the answer helpers (respond,
 * serialise by session). A base: it calls no route file. */
#include "routes/routes.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "image/image.h"
#include "util/fault.h"
#include "util/token.h"

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

int routes_respond_list(struct lb_request *req,
                        int (*fn)(struct lb_lend *l, const char *state, json_t **out,
                                  struct lb_error *err),
                        struct lb_error *err)
{
    struct lb_app *app = http_app(req);
    json_t *out = NULL;
    int r = fn(app->lend, http_query(req, "state"), &out, err);

    if (r == 0)
        http_respond_json(req, 200, out);
    return r;
}

int routes_bad_image_name(const char *what, struct lb_error *err)
{
    return lb_error_set(err, -EINVAL,
                        "%s must be an image name ([A-Za-z0-9][A-Za-z0-9._-]*, at most %d bytes, "
                        "not 'host')",
                        what, LB_IMAGE_NAME_MAX);
}

int routes_check_sandbox_id(const char *id, struct lb_error *err)
{
    if (!id || strlen(id) >= LB_ID_MAX)
        return lb_error_set(err, -ENOENT, "no sandbox %s", id ? id : "");
    return 0;
}

struct defer_job {
    routes_job_fn *fn;
    unsigned status;
    void *job;
    void (*job_free)(void *);
};

static void defer_job_run(struct lb_request *req, void *arg)
{
    struct defer_job *d = arg;
    struct lb_error err = {0};
    json_t *out = NULL;
    int r = d->fn(http_app(req), d->job, &out, &err);

    routes_respond(req, r, d->status, out, &err);
}

static void defer_job_free(void *arg)
{
    struct defer_job *d = arg;

    if (d->job_free)
        d->job_free(d->job);
    free(d);
}

int routes_defer_job(struct lb_request *req, routes_job_fn *fn, unsigned status, void *job,
                     void (*job_free)(void *), struct lb_error *err)
{
    struct defer_job *d = malloc(sizeof(*d));

    if (!d) {
        if (job_free)
            job_free(job);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    *d = (struct defer_job){.fn = fn, .status = status, .job = job, .job_free = job_free};
    return http_defer(req, defer_job_run, d, defer_job_free, err);
}

json_t *routes_item_result(const char *rsid, int r, json_t *lease, const struct lb_error *err)
{
    const char *code = "internal";
    json_t *e, *res;
    int status;

    if (r == 0)
        return json_pack("{s:s?,s:i,s:O}", "rsid", rsid, "status", 200, "lease", lease);
    /* as http_respond_error answers a single request */
    status = lb_error_http_status(err->code ? err->code : r, &code);
    e = http_error_json(code, err->message[0] ? err->message : "internal error");
    res = e ? json_pack("{s:s?,s:i,s:O}", "rsid", rsid, "status", status, "error",
                        json_object_get(e, "error"))
            : NULL;
    json_decref(e);
    return res;
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

struct routes_id_num_job *routes_id_num_job_new(const char *id, int64_t n)
{
    struct routes_id_num_job *j = calloc(1, sizeof(*j));

    if (!j || !(j->id = strdup(id))) {
        free(j);
        return NULL;
    }
    j->n = n;
    return j;
}

void routes_id_num_job_free(void *arg)
{
    struct routes_id_num_job *j = arg;

    if (j)
        free(j->id);
    free(j);
}

void routes_respond_lend_id_num(struct lb_request *req,
                                int (*fn)(struct lb_lend *l, const char *id, int64_t n,
                                          json_t **out, struct lb_error *err),
                                const struct routes_id_num_job *j)
{
    struct lb_app *app = http_app(req);
    struct lb_error err = {0};
    json_t *out = NULL;
    int r = fn(app->lend, j->id, j->n, &out, &err);

    routes_respond(req, r, 200, out, &err);
}

static int operate_enter(struct lb_request *req, const char *id, bool read, bool *held,
                         struct lb_error *err)
{
    struct lb_app *app = http_app(req);
    int r;

    *held = false;
    if (http_principal(req) != LB_PRINCIPAL_OPERATE)
        return 0;
    /* tests: an act held here, its job started, while a whole reset runs */
    r = fault_hit("operate.enter", 0, err);
    if (r < 0)
        return r;
    r = read ? lend_fence_enter_read(app->lend, id, err) : lend_fence_enter(app->lend, id, err);
    if (r < 0)
        return r;
    /* the fence held, no reset can begin: a token still good now stays good until the leave */
    r = http_reauthorize(req, err);
    if (r < 0) {
        if (read)
            lend_fence_leave_read(app->lend, id);
        else
            lend_fence_leave(app->lend, id);
        return r;
    }
    *held = true;
    return 0;
}

int routes_operate_enter(struct lb_request *req, const char *id, bool *held, struct lb_error *err)
{
    return operate_enter(req, id, false, held, err);
}

void routes_operate_leave(struct lb_request *req, const char *id, bool *held)
{
    if (*held)
        lend_fence_leave(((struct lb_app *)http_app(req))->lend, id);
    *held = false;
}

int routes_operate_enter_read(struct lb_request *req, const char *id, bool *held,
                              struct lb_error *err)
{
    return operate_enter(req, id, true, held, err);
}

void routes_operate_leave_read(struct lb_request *req, const char *id, bool *held)
{
    if (*held)
        lend_fence_leave_read(((struct lb_app *)http_app(req))->lend, id);
    *held = false;
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

int routes_parse_env_cwd_user(json_t *body, json_t *env, const char **cwd_out,
                              const char **user_out, struct lb_error *err)
{
    int r = env ? routes_check_env_names(env, "env", err) : 0;

    return r < 0 ? r : routes_parse_cwd_user(body, cwd_out, user_out, err);
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

int routes_parse_files(json_t *v, const char *not_object, struct lb_seed_file **out, size_t *n,
                       struct lb_error *err)
{
    const char *path;
    json_t *f;
    int r;

    if (!v || json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return lb_error_set(err, -EINVAL, "%s", not_object);
    *out = calloc(json_object_size(v) + 1, sizeof(**out));
    if (!*out)
        return lb_error_set(err, -ENOMEM, "out of memory");
    json_object_foreach(v, path, f) {
        r = routes_parse_file(path, f, &(*out)[*n], err);
        (*n)++; /* counted even on failure: the caller's free needs it */
        if (r < 0)
            return r;
    }
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
