/*
 * pty.c - the PTY routes of API.md (lend/pty.h does the work):
 *
 *   POST   /v1/sandboxes/{id}/pty    create (a worker: it launches through the exec path)
 *   GET    /v1/pty/{sid}/output      bytes from ?since (long-polls ?wait_ms parked, no worker)
 *   POST   /v1/pty/{sid}/input       raw body to the terminal (a worker: it may wait for room)
 *   POST   /v1/pty/{sid}/resize      {"rows","cols"}
 *   POST   /v1/pty/{sid}/signal      {"signal": "INT"|...|number}
 *   POST   /v1/pty/{sid}/attach      {"takeover"} -> {"session_id","attach_token"}
 *   GET    /v1/pty/{sid}/wait        {"exit_code"} (?timeout_ms parked, no worker)
 *   DELETE /v1/pty/{sid}
 *
 * A request carrying X-Attach-Token acts as that holder: once another client took the session
 * over, it gets 409. Requests without the header act for the admin or the sandbox's operate
 * token alone.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lend/pty.h"
#include "routes/routes.h"
#include "util/clock.h"

static struct lb_ptys *ptys_of(struct lb_request *req)
{
    return ((struct lb_app *)http_app(req))->ptys;
}

/* A non-negative decimal query value; absent gives def. -EINVAL naming key. */
static int query_u64(struct lb_request *req, const char *key, uint64_t def, uint64_t *out,
                     struct lb_error *err)
{
    const char *v = http_query(req, key);
    char *end;

    *out = def;
    if (!v)
        return 0;
    errno = 0;
    if (!*v || *v == '-' || *v == '+' || ((*out = strtoull(v, &end, 10)), errno) || *end)
        return lb_error_set(err, -EINVAL, "query '%s' must be a non-negative integer", key);
    return 0;
}

static const char *attach_token(struct lb_request *req)
{
    return http_header(req, "X-Attach-Token");
}

/* ---------- create ---------- */

struct create_job {
    char *id;
    json_t *body;
    struct lb_pty_create c;
};

static void create_job_free(void *arg)
{
    struct create_job *j = arg;

    if (!j)
        return;
    json_decref(j->body);
    free(j->id);
    free(j);
}

static void create_run(struct lb_request *req, void *arg)
{
    struct create_job *j = arg;
    char sid[LB_PTY_SID_MAX];
    struct lb_error err = {0};
    bool held;
    /* an operate token's session starts in the episode that admitted it (routes_operate_enter) */
    int r = routes_operate_enter(req, j->id, &held, &err);

    if (r == 0) {
        j->c.fence_held = &held;
        r = pty_create(ptys_of(req), j->id, &j->c, sid, &err);
        routes_operate_leave(req, j->id, &held);
    }

    routes_respond(req, r, 201, r == 0 ? json_pack("{s:s}", "session_id", sid) : NULL, &err);
}

static int parse_size(json_t *body, const char *key, int def, bool required, int *out,
                      struct lb_error *err)
{
    json_t *v = json_object_get(body, key);

    *out = def;
    if (!v || json_is_null(v))
        return required ? lb_error_set(err, -EINVAL, "'%s' is required", key) : 0;
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65535)
        return lb_error_set(err, -EINVAL, "'%s' must be an integer 1-65535", key);
    *out = (int)json_integer_value(v);
    return 0;
}

static int create_parse(json_t *body, struct lb_pty_create *c, struct lb_error *err)
{
    static const char *const fields[] = {"command", "cwd",  "env", "user",
                                         "rows",    "cols", "pty", NULL};
    json_t *command = json_object_get(body, "command");
    int r = routes_check_fields(body, fields, "the PTY request", err);

    if (r == 0)
        r = routes_string_map(body, "env", &c->env, err);
    if (r == 0 && c->env)
        r = routes_check_env_names(c->env, "env", err);
    if (r == 0)
        r = parse_size(body, "rows", 24, false, &c->rows, err);
    if (r == 0)
        r = parse_size(body, "cols", 80, false, &c->cols, err);
    if (r < 0)
        return r;
    if (command && !json_is_null(command)) {
        if (!json_is_string(command) ||
            strlen(json_string_value(command)) != json_string_length(command))
            return lb_error_set(err, -EINVAL, "'command' must be a string without NUL");
        c->command = json_string_value(command);
    }
    /* the user as exec's: a name, a number (JSON or string), NAME:GROUP or UID:GID */
    r = routes_parse_cwd_user(body, &c->cwd, &c->user, err);
    if (r < 0)
        return r;
    c->pty = true;
    return routes_parse_bool(body, "pty", &c->pty, err);
}

int route_pty_create(struct lb_request *req, struct lb_error *err)
{
    struct create_job *j = calloc(1, sizeof(*j));
    char key[160];
    int r;

    if (!j || !(j->id = strdup(http_param(req, 0)))) {
        free(j);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    r = http_body_json(req, true, &j->body, err);
    if (r == 0)
        r = create_parse(j->body, &j->c, err);
    if (r < 0) {
        create_job_free(j);
        return r;
    }
    /* a launch is an exec: it shares the sandbox's exec share of the workers */
    snprintf(key, sizeof(key), "exec:%s", j->id);
    http_set_fair_key(req, key, (size_t)((struct lb_app *)http_app(req))->max_execs_per_sandbox);
    return http_defer(req, create_run, j, create_job_free, err);
}

/* ---------- output and wait (parked) ---------- */

struct poll_wait {
    struct lb_ptys *ptys;
    struct lb_park *park;
    char sid[LB_PTY_SID_MAX];
    char *token; /* X-Attach-Token, or NULL */
    bool err_stream;
    bool wait; /* GET wait (else output) */
    uint64_t since;
};

/* The PTY service's waker for a parked request: http's park handle. */
static void park_wake(void *park)
{
    (void)http_wake(park);
}

static void park_release(void *park)
{
    http_park_release(park);
}

static void poll_wait_free(void *arg)
{
    struct poll_wait *w = arg;

    if (w->park)
        pty_unwatch(w->ptys, w->park);
    free(w->token);
    free(w);
}

static void respond_output(struct lb_request *req, const struct lb_pty_chunk *c)
{
    char num[32];

    if (c->fd >= 0)
        http_respond_fd_range(req, 200, c->fd, c->file_off, c->len);
    else
        http_respond_text(req, 200, "application/octet-stream", NULL, 0);
    snprintf(num, sizeof(num), "%" PRIu64, c->next);
    http_response_header(req, "X-Next-Offset", num);
    if (c->exited && c->next == c->end) {
        snprintf(num, sizeof(num), "%d", c->exit_code);
        http_response_header(req, "X-Exit-Code", num);
    }
}

/* Render the answer of an output or wait request from the session's files. */
static void poll_answer(struct lb_request *req, struct poll_wait *w)
{
    struct lb_error err = {0};
    struct lb_pty_chunk c;
    int r = pty_check_token(w->ptys, w->sid, w->token, &err), code = 0;

    if (r == 0 && w->wait) {
        r = pty_exit_code(w->ptys, w->sid, &code, &err);
        if (r == -EAGAIN) /* the timeout passed first */
            http_respond_json(req, 200, json_pack("{s:n}", "exit_code"));
        else if (r == 0)
            http_respond_json(req, 200, json_pack("{s:i}", "exit_code", code));
        if (r == 0 || r == -EAGAIN)
            return;
    }
    if (r == 0)
        r = pty_read(w->ptys, w->sid, w->err_stream, w->since, &c, &err);
    if (r < 0)
        http_respond_error(req, &err);
    else
        respond_output(req, &c);
}

static void poll_parked(struct lb_request *req, void *arg, enum lb_park_end why)
{
    struct lb_error err = {0};

    if (why == LB_PARK_SHUTDOWN) {
        lb_error_set(&err, -ESHUTDOWN, "the daemon is shutting down; poll again");
        http_respond_error(req, &err);
        return;
    }
    poll_answer(req, arg);
}

/* Answer now, or park until the session changes or wait_ms passes. */
static int poll_start(struct lb_request *req, struct poll_wait *w, uint64_t wait_ms, bool ready,
                      struct lb_error *err)
{
    struct lb_app *app = http_app(req);
    int r;

    if (ready || wait_ms == 0) {
        poll_answer(req, w);
        poll_wait_free(w);
        return 0;
    }
    if (app->max_wait_ms > 0 && wait_ms > (uint64_t)app->max_wait_ms)
        wait_ms = (uint64_t)app->max_wait_ms;
    r = http_park(req, clock_mono_ms() + (int64_t)wait_ms, poll_parked, w, poll_wait_free, &w->park,
                  err);
    if (r < 0)
        return r; /* w freed */
    pty_watch(w->ptys, w->sid, w->err_stream, w->wait ? -1 : (int64_t)w->since,
              &(struct lb_pty_waker){.wake = park_wake, .release = park_release, .ctx = w->park});
    return 0;
}

static struct poll_wait *poll_wait_new(struct lb_request *req, struct lb_error *err)
{
    struct poll_wait *w = calloc(1, sizeof(*w));
    const char *tok = attach_token(req);

    if (!w || (tok && !(w->token = strdup(tok)))) {
        free(w);
        lb_error_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    w->ptys = ptys_of(req);
    snprintf(w->sid, sizeof(w->sid), "%s", http_param(req, 0) ? http_param(req, 0) : "");
    return w;
}

int route_pty_output(struct lb_request *req, struct lb_error *err)
{
    const char *stream = http_query(req, "stream");
    struct poll_wait *w;
    struct lb_pty_chunk c;
    uint64_t since, wait_ms;
    bool err_stream = false;
    int r;

    if (stream && strcmp(stream, "stderr") == 0)
        err_stream = true;
    else if (stream && strcmp(stream, "stdout") != 0)
        return lb_error_set(err, -EINVAL, "query 'stream' must be stdout or stderr");
    r = query_u64(req, "since", 0, &since, err);
    if (r == 0)
        r = query_u64(req, "wait_ms", 0, &wait_ms, err);
    if (r == 0)
        r = pty_check_token(ptys_of(req), http_param(req, 0), attach_token(req), err);
    if (r == 0)
        r = pty_read(ptys_of(req), http_param(req, 0), err_stream, since, &c, err);
    if (r < 0)
        return r;
    if (c.fd >= 0)
        close(c.fd); /* the answer reads afresh */
    w = poll_wait_new(req, err);
    if (!w)
        return -ENOMEM;
    w->err_stream = err_stream;
    w->since = since;
    return poll_start(req, w, wait_ms, c.end > since || c.exited, err);
}

int route_pty_wait(struct lb_request *req, struct lb_error *err)
{
    struct poll_wait *w;
    uint64_t timeout_ms;
    int code, r = query_u64(req, "timeout_ms", 0, &timeout_ms, err);

    if (r == 0)
        r = pty_check_token(ptys_of(req), http_param(req, 0), attach_token(req), err);
    if (r == 0) {
        r = pty_exit_code(ptys_of(req), http_param(req, 0), &code, err);
        if (r == -EAGAIN)
            r = 0;
        else if (r == 0)
            r = 1; /* exited: answer now */
    }
    if (r < 0)
        return r;
    w = poll_wait_new(req, err);
    if (!w)
        return -ENOMEM;
    w->wait = true;
    return poll_start(req, w, timeout_ms, r == 1, err);
}

/* ---------- input and control ---------- */

struct input_job {
    char sid[LB_PTY_SID_MAX];
    char *data;
    size_t len;
};

static void input_job_free(void *arg)
{
    struct input_job *j = arg;

    free(j->data);
    free(j);
}

static void input_run(struct lb_request *req, void *arg)
{
    struct input_job *j = arg;
    struct lb_error err = {0};

    if (pty_input(ptys_of(req), j->sid, j->data, j->len, &err) < 0)
        http_respond_error(req, &err);
    else
        http_respond_empty(req, 204);
}

int route_pty_input(struct lb_request *req, struct lb_error *err)
{
    const struct lb_buf *body = http_body(req);
    char sandbox[LB_ID_MAX], key[200];
    struct input_job *j;
    int r = pty_check_token(ptys_of(req), http_param(req, 0), attach_token(req), err);

    if (r < 0)
        return r;
    j = calloc(1, sizeof(*j));
    if (!j || !(j->data = malloc(body->len ? body->len : 1))) {
        free(j);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    snprintf(j->sid, sizeof(j->sid), "%s", http_param(req, 0));
    if (body->len)
        memcpy(j->data, body->data, body->len);
    j->len = body->len;
    if (j->len == 0) {
        input_job_free(j);
        http_respond_empty(req, 204);
        return 0;
    }
    /* input may wait for the terminal (a stopped or slow holder): it takes the sandbox's exec
     * share of the workers, never more, so one sandbox's flood cannot hold up the others */
    if (pty_sandbox_of(ptys_of(req), j->sid, sandbox, sizeof(sandbox)) == 0) {
        snprintf(key, sizeof(key), "exec:%s", sandbox);
        http_set_fair_key(req, key,
                          (size_t)((struct lb_app *)http_app(req))->max_execs_per_sandbox);
    }
    return http_defer(req, input_run, j, input_job_free, err);
}

/* The JSON body of a control request, after the holder check. */
static int control_body(struct lb_request *req, const char *const *fields, const char *what,
                        json_t **body, struct lb_error *err)
{
    int r = pty_check_token(ptys_of(req), http_param(req, 0), attach_token(req), err);

    *body = NULL;
    if (r == 0)
        r = http_body_json(req, true, body, err);
    if (r == 0)
        r = routes_check_fields(*body, fields, what, err);
    return r;
}

/* The end of a control request: its body is dropped, and 204 answers when r is 0. Returns r. */
static int control_done(struct lb_request *req, json_t *body, int r)
{
    json_decref(body);
    if (r == 0)
        http_respond_empty(req, 204);
    return r;
}

int route_pty_resize(struct lb_request *req, struct lb_error *err)
{
    static const char *const fields[] = {"rows", "cols", NULL};
    json_t *body;
    int rows = 0, cols = 0, r = control_body(req, fields, "the resize request", &body, err);

    if (r == 0)
        r = parse_size(body, "rows", 0, true, &rows, err);
    if (r == 0)
        r = parse_size(body, "cols", 0, true, &cols, err);
    if (r == 0)
        r = pty_resize(ptys_of(req), http_param(req, 0), rows, cols, err);
    return control_done(req, body, r);
}

int route_pty_signal(struct lb_request *req, struct lb_error *err)
{
    static const char *const fields[] = {"signal", NULL};
    json_t *body, *v;
    int sig = -1, r = control_body(req, fields, "the signal request", &body, err);

    if (r == 0) {
        v = json_object_get(body, "signal");
        if (json_is_string(v))
            sig = pty_signal_number(json_string_value(v));
        else if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < 65)
            sig = (int)json_integer_value(v);
        if (sig < 0)
            r = lb_error_set(err, -EINVAL,
                             "'signal' must be a signal name (\"INT\", \"TERM\", \"KILL\", ...) "
                             "or number");
    }
    if (r == 0)
        r = pty_signal(ptys_of(req), http_param(req, 0), sig, err);
    return control_done(req, body, r);
}

int route_pty_attach(struct lb_request *req, struct lb_error *err)
{
    static const char *const fields[] = {"takeover", NULL};
    char token[LB_PTY_TOKEN_MAX];
    json_t *body = NULL;
    bool takeover = false;
    int r = http_body_json(req, true, &body, err);

    if (r == 0)
        r = routes_check_fields(body, fields, "the attach request", err);
    if (r == 0)
        r = routes_parse_bool(body, "takeover", &takeover, err);
    if (r == 0)
        r = pty_attach(ptys_of(req), http_param(req, 0), takeover, token, err);
    json_decref(body);
    if (r < 0)
        return r;
    http_respond_json(
        req, 200, json_pack("{s:s,s:s}", "session_id", http_param(req, 0), "attach_token", token));
    http_response_header(req, "X-Attach-Token", token);
    return 0;
}

int route_pty_delete(struct lb_request *req, struct lb_error *err)
{
    int r = pty_check_token(ptys_of(req), http_param(req, 0), attach_token(req), err);

    if (r == 0)
        r = pty_delete(ptys_of(req), http_param(req, 0), err);
    if (r == 0)
        http_respond_empty(req, 204);
    return r;
}
