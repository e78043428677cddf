/*
 * activations.c - harness activations (NeMo Gym SandboxSession): POST
 * /v1/sessions/{rsid}/execute, POST /v1/sessions/{rsid}/close, POST
 * /v1/sessions/{rsid}/stop_harness, GET /v1/sessions/{rsid}/activation[?log=1][&wait_ms=N].
 * Auth LB_AUTH_SESSION: the admin token or the operate token of the session's sandbox.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "activation/activation.h"
#include "provider/provider.h"
#include "routes/routes.h"
#include "util/clock.h"
#include "util/fault.h"

#define DEFAULT_TIMEOUT_S 600.0
#define DEFAULT_CLOSE_TIMEOUT_S 60.0
#define MAX_COLLECT 1024

/* The session of the path as a copy (the job outlives the request's parsing). */
static int session_rsid(struct lb_request *req, char **out, struct lb_error *err)
{
    const char *rsid;
    int r = routes_session_param(req, &rsid, err);

    if (r < 0)
        return r;
    *out = strdup(rsid);
    return *out ? 0 : lb_error_set(err, -ENOMEM, "out of memory");
}

/* ---------- execute ---------- */

struct execute_job {
    char *rsid;
    json_t *body; /* keeps the strings the request points into alive */
    struct lb_execute_request req;
    struct lb_seed_file *stage;
};

static void execute_job_free(void *arg)
{
    struct execute_job *j = arg;

    if (!j)
        return;
    for (size_t i = 0; i < j->req.n_stage; i++) {
        free(j->stage[i].path);
        free(j->stage[i].data);
    }
    free(j->stage);
    routes_free_strings(j->req.argv);
    routes_free_strings(j->req.collect);
    json_decref(j->body);
    free(j->rsid);
    free(j);
}

static int execute_parse(struct lb_app *app, struct execute_job *j, struct lb_error *err)
{
    static const char *const fields[] = {"argv",  "cwd",     "env",       "user",
                                         "stage", "collect", "timeout_s", "close_timeout_s",
                                         "wait",  NULL};
    json_t *body = j->body;
    bool wait = true;
    int r = routes_check_fields(body, fields, "the execute request", err);

    if (r == 0)
        r = routes_parse_strings(json_object_get(body, "argv"), "argv", false, true, 4096,
                                 &j->req.argv, err);
    if (r == 0 && !j->req.argv[0][0])
        r = lb_error_set(err, -EINVAL, "'argv[0]' must not be empty");
    if (r == 0)
        r = routes_parse_strings(json_object_get(body, "collect"), "collect", true, false,
                                 MAX_COLLECT, &j->req.collect, err);
    if (r == 0)
        r = routes_string_map(body, "env", &j->req.env, err);
    if (r == 0)
        r = routes_parse_seconds(body, "timeout_s", DEFAULT_TIMEOUT_S, app->max_exec_timeout_s,
                                 &j->req.timeout_ms, err);
    if (r == 0)
        r = routes_parse_seconds(body, "close_timeout_s", DEFAULT_CLOSE_TIMEOUT_S,
                                 app->max_exec_timeout_s, &j->req.close_timeout_ms, err);
    if (r == 0)
        r = routes_parse_bool(body, "wait", &wait, err);
    if (r == 0)
        r = routes_parse_env_cwd_user(body, j->req.env, &j->req.cwd, &j->req.user, err);
    if (r < 0)
        return r;
    j->req.nowait = !wait;
    r = routes_parse_files(json_object_get(body, "stage"),
                           "'stage' must be an object of path: file", &j->stage, &j->req.n_stage,
                           err);
    if (r == 0)
        j->req.stage = j->stage;
    return r;
}

static void execute_run(struct lb_request *req, void *arg)
{
    struct execute_job *j = arg;
    struct lb_app *app = http_app(req);
    struct lb_record live = {0};
    struct lb_error err = {0};
    json_t *out = NULL;
    bool held = false;
    int r = 0;

    /* an operate token's harness is staged and launched in the episode that admitted it, or
     * not at all (routes_operate_enter; the launch's lend_exec leaves the fence once the
     * harness's supervisor is inside) */
    if (http_principal(req) == LB_PRINCIPAL_OPERATE &&
        store_get_live_by_rsid(app->store, j->rsid, &live, NULL) == 0)
        r = routes_operate_enter(req, live.id, &held, &err);
    if (r == 0) {
        j->req.fence_held = &held;
        r = activation_execute(app->acts, j->rsid, &j->req, &out, &err);
        if (held)
            routes_operate_leave(req, live.id, &held);
    }
    store_record_release(&live);
    routes_respond(req, r, j->req.nowait ? 202 : 200, out, &err);
}

int route_execute(struct lb_request *req, struct lb_error *err)
{
    struct lb_app *app = http_app(req);
    struct execute_job *j = calloc(1, sizeof(*j));
    int r;

    if (!j)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = session_rsid(req, &j->rsid, err);
    if (r == 0)
        r = http_body_json(req, false, &j->body, err);
    if (r == 0)
        r = execute_parse(app, j, err);
    if (r == 0 && lend_is_draining(app->lend))
        r = lb_error_set(err, -ESHUTDOWN, "the daemon is draining; no new activations");
    if (r < 0) {
        execute_job_free(j);
        return r;
    }
    return http_defer(req, execute_run, j, execute_job_free, err);
}

/* ---------- close ---------- */

/* What every job on a session's activation (close, stop_harness, GET) starts with. */
struct act_job {
    char *rsid;
    const char *own; /* session_bind_own's: NULL, or own_id */
    char own_id[LB_ID_MAX];
};

/* http_defer's free of a job that starts with a struct act_job. */
static void act_job_free(void *arg)
{
    struct act_job *j = arg;

    if (j)
        free(j->rsid);
    free(j);
}

/* An operate token's request on the session's activation acts on the one it was let act on
 * (j->own = j->own_id, "": none), read under the sandbox's fence with the token checked again
 * (routes_operate_enter; 401 when a reset revoked it), so that after a reset it finds that one
 * gone (-ENOKEY) instead of acting on the next episode's; the admin's: j->own NULL (the
 * session's, whichever it is). */
static int session_bind_own(struct lb_request *req, struct act_job *j, struct lb_error *err)
{
    const char *rsid = j->rsid;
    struct lb_app *app = http_app(req);
    struct lb_record live = {0};
    bool held = false;
    int r = 0;

    j->own = NULL;
    if (http_principal(req) != LB_PRINCIPAL_OPERATE)
        return 0;
    if (store_get_live_by_rsid(app->store, rsid, &live, NULL) == 0)
        r = routes_operate_enter_read(req, live.id, &held, err);
    if (r == 0)
        r = activation_id_of(app->acts, rsid, j->own_id, sizeof(j->own_id), err);
    if (held)
        routes_operate_leave_read(req, live.id, &held);
    store_record_release(&live);
    if (r == 0)
        j->own = j->own_id;
    /* tests: a request bound to its activation, held while a reset replaces it */
    if (r == 0)
        r = fault_hit("activation.bound", 0, err);
    return r;
}

/* A close-shaped request (close, stop_harness): op on the session's activation. */
struct close_job {
    struct act_job a;   /* first: act_job_free */
    int64_t timeout_ms; /* 0: the activation's close_timeout_s */
    int (*op)(struct lb_activations *a, const char *rsid, const char *own, int64_t timeout_ms,
              char **text, size_t *len, struct lb_error *err);
};

/* Reserve what rendering the session's activation may hold (http_answer_reserve), then
 * answer with the text render makes. An activation collected by the call itself is larger
 * than reserved: it is charged once rendered (a 429 then; the call is idempotent). */
static void respond_activation(struct lb_request *req, const char *rsid, bool with_log,
                               int (*render)(struct lb_request *req, void *arg, char **text,
                                             size_t *len, struct lb_error *err),
                               void *arg)
{
    struct lb_app *app = http_app(req);
    struct lb_error err = {0};
    uint64_t need = 0;
    char *text = NULL;
    size_t len = 0;
    int r = activation_answer_bytes(app->acts, rsid, with_log, &need, &err);

    if (r == 0)
        r = http_answer_reserve(req, need > SIZE_MAX ? SIZE_MAX : (size_t)need, &err);
    if (r == 0)
        r = render(req, arg, &text, &len, &err);
    if (r < 0)
        http_respond_error(req, &err);
    else
        http_respond_text(req, 200, "application/json", text, len);
}

static int close_job_render(struct lb_request *req, void *arg, char **text, size_t *len,
                            struct lb_error *err)
{
    struct close_job *j = arg;
    struct lb_app *app = http_app(req);

    return j->op(app->acts, j->a.rsid, j->a.own, j->timeout_ms, text, len, err);
}

static void close_job_run(struct lb_request *req, void *arg)
{
    struct close_job *j = arg;
    struct lb_error err = {0};

    if (session_bind_own(req, &j->a, &err) < 0) {
        http_respond_error(req, &err);
        return;
    }
    respond_activation(req, j->a.rsid, false, close_job_render, j);
}

/* Parse a close-shaped request ({"timeout_s"?} on a session) and defer a job that runs op
 * with it; what names the request in error messages. */
static int defer_close_job(struct lb_request *req, const char *what,
                           int (*op)(struct lb_activations *a, const char *rsid, const char *own,
                                     int64_t timeout_ms, char **text, size_t *len,
                                     struct lb_error *err),
                           struct lb_error *err)
{
    static const char *const fields[] = {"timeout_s", NULL};
    struct lb_app *app = http_app(req);
    struct close_job *j = calloc(1, sizeof(*j));
    json_t *body = NULL;
    int r;

    if (!j)
        return lb_error_set(err, -ENOMEM, "out of memory");
    j->op = op;
    r = session_rsid(req, &j->a.rsid, err);
    if (r == 0)
        r = http_body_json(req, true, &body, err);
    if (r == 0)
        r = routes_check_fields(body, fields, what, err);
    if (r == 0 && json_object_get(body, "timeout_s") &&
        !json_is_null(json_object_get(body, "timeout_s")))
        r = routes_parse_seconds(body, "timeout_s", 0, app->max_exec_timeout_s, &j->timeout_ms,
                                 err);
    json_decref(body);
    if (r < 0) {
        act_job_free(j);
        return r;
    }
    routes_serialize_session(req, j->a.rsid);
    return http_defer(req, close_job_run, j, act_job_free, err);
}

int route_close(struct lb_request *req, struct lb_error *err)
{
    return defer_close_job(req, "the close request", activation_close, err);
}

/* ---------- activation ---------- */

struct get_job {
    struct act_job a; /* first: act_job_free */
    bool with_log;
    int64_t wait_ms; /* long-poll: 0 answers at once */
    bool follow;     /* Accept: application/x-ndjson: stream the output log (follow.c) */
};

static struct get_job *get_job_copy(const struct get_job *j)
{
    struct get_job *c = calloc(1, sizeof(*c));

    if (c && !(c->a.rsid = strdup(j->a.rsid))) {
        free(c);
        c = NULL;
    }
    if (c)
        c->with_log = j->with_log;
    return c;
}

static void activation_get_run(struct lb_request *req, void *arg);

static bool activation_watch_ready(void *arg)
{
    return activation_watch_changed(arg);
}

static void activation_watch_release(void *arg)
{
    activation_watch_free(arg);
}

/* The long-poll's wait is over (changed, deadline, draining): render the answer as wait_ms=0
 * does, on a worker (rendering reads the store and may collect a nowait activation). */
static void activation_get_parked(struct lb_request *req, void *arg, enum lb_park_end why)
{
    struct get_job *c = why == LB_PARK_GONE ? NULL : get_job_copy(arg);
    struct lb_error err = {0};
    int r;

    if (why == LB_PARK_GONE) {
        http_respond_empty(req, 204); /* nobody reads it */
        return;
    }
    if (!c) {
        lb_error_set(&err, -ENOMEM, "out of memory");
        http_respond_error(req, &err);
        return;
    }
    r = http_defer(req, activation_get_run, c, act_job_free, &err);
    if (r < 0)
        http_respond_error(req, &err);
}

/* Follow the output log: open it and hand the stream to the follower thread (follow.c), so
 * no worker is held while the harness runs. Errors before the stream begins keep their
 * status. */
static void activation_follow_start(struct lb_request *req, struct get_job *j)
{
    struct lb_app *app = http_app(req);
    struct lb_activation_watch *w = NULL;
    struct lb_error err = {0};
    struct lb_stream *s;
    int fd = -1, r = session_bind_own(req, &j->a, &err);

    if (r == 0)
        r = activation_open_log(app->acts, j->a.rsid, j->a.own, &fd, &err);
    if (r == 0)
        r = activation_watch_begin(app->acts, j->a.rsid, j->a.own, &w, &err);
    if (r == 0 && !(s = http_stream_begin(req, 200, "application/x-ndjson")))
        r = lb_error_set(&err, -ENOMEM, "cannot begin the stream");
    if (r < 0) {
        if (fd >= 0)
            close(fd);
        activation_watch_free(w);
        http_respond_error(req, &err);
        return;
    }
    /* req is the stream's from here on */
    http_stream_keep(s);
    (void)follows_add(app->follows, s, fd, j->a.rsid, j->a.own, w);
}

static int get_render(struct lb_request *req, void *arg, char **text, size_t *len,
                      struct lb_error *err)
{
    struct get_job *j = arg;
    struct lb_app *app = http_app(req);

    return activation_get_text(app->acts, j->a.rsid, j->a.own, j->with_log, text, len, err);
}

static void activation_get_run(struct lb_request *req, void *arg)
{
    struct get_job *j = arg;
    struct lb_app *app = http_app(req);
    struct lb_error err = {0};
    int r = 0;

    if (j->follow) {
        activation_follow_start(req, j);
        return;
    }
    /* an operate token's GET (and its long-poll) is of its episode's activation only */
    r = session_bind_own(req, &j->a, &err);
    if (r < 0) {
        http_respond_error(req, &err);
        return;
    }
    if (j->wait_ms > 0) {
        /* a long-poll holds no worker while it waits: park it, and poll the record */
        struct lb_activation_watch *w = NULL;

        r = activation_watch_begin(app->acts, j->a.rsid, j->a.own, &w, &err);
        if (r == 0 && w) {
            struct get_job *c = get_job_copy(j);
            struct lb_park_poll poll = {
                .ready = activation_watch_ready,
                .arg = w,
                .free_arg = activation_watch_release,
                .first_ms = 50,
                .max_ms = 500,
            };

            if (!c) {
                activation_watch_free(w);
                r = lb_error_set(&err, -ENOMEM, "out of memory");
            } else {
                r = http_park_poll(req, clock_mono_ms() + j->wait_ms, &poll, activation_get_parked,
                                   c, act_job_free, &err);
                if (r == 0)
                    return; /* req is the park's now */
            }
        }
        if (r < 0) {
            routes_respond(req, r, 200, NULL, &err);
            return;
        }
    }
    /* rendered within the answer budget: its peak is reserved before the store is read */
    respond_activation(req, j->a.rsid, j->with_log, get_render, j);
}

int route_activation_get(struct lb_request *req, struct lb_error *err)
{
    const char *log = http_query(req, "log"), *wait = http_query(req, "wait_ms");
    struct get_job *j = calloc(1, sizeof(*j));
    int r;

    if (!j)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = session_rsid(req, &j->a.rsid, err);
    {
        const char *accept = http_header(req, "Accept");

        j->follow = accept && strcasestr(accept, "application/x-ndjson");
    }
    if (r == 0 && log) {
        if (!strcmp(log, "1") || !strcmp(log, "true"))
            j->with_log = true;
        else if (strcmp(log, "0") && strcmp(log, "false"))
            r = lb_error_set(err, -EINVAL, "query 'log' must be 1 or 0");
    }
    if (r == 0 && wait) {
        struct lb_app *app = http_app(req);
        char *end = NULL;
        long long ms;

        errno = 0;
        ms = strtoll(wait, &end, 10);
        /* a number too large for int64 is lowered to the maximum like any other large one */
        if (errno == ERANGE && ms == LLONG_MAX && wait[0] != '-')
            errno = 0;
        if (!*wait || *end || errno || ms < 0 || wait[0] == '+' || wait[0] == ' ')
            r = lb_error_set(err, -EINVAL,
                             "query 'wait_ms' must be an integer number of milliseconds >= 0");
        /* bounded; a waiting long-poll is parked (holds no worker) */
        j->wait_ms = ms > app->max_wait_ms ? app->max_wait_ms : ms;
    }
    if (r < 0) {
        act_job_free(j);
        return r;
    }
    return http_defer(req, activation_get_run, j, act_job_free, err);
}

/* ---------- stop_harness ---------- */

int route_stop_harness(struct lb_request *req, struct lb_error *err)
{
    return defer_close_job(req, "the stop_harness request", activation_stop_harness, err);
}
