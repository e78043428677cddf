/* routes.c - the route table and the authorize hook (what the route files share is in parse.c). */
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
    {"POST", "/v1/sessions/seed_batch", LB_AUTH_ADMIN, false, route_seed_batch, "seed_batch", true},
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
    {"PUT", "/v1/sandboxes/*/archive", LB_AUTH_SANDBOX, true, route_archive_put, "archive_put",
     false},
    {"GET", "/v1/sandboxes/*/archive", LB_AUTH_SANDBOX, false, route_archive_get, "archive_get",
     false},
    {"POST", "/v1/sandboxes/*/pause", LB_AUTH_SANDBOX, false, route_pause, "pause", false},
    {"POST", "/v1/sandboxes/*/snapshot", LB_AUTH_ADMIN, false, route_snapshot, "snapshot", false},
    {"POST", "/v1/sandboxes/*/fork", LB_AUTH_ADMIN, false, route_fork, "fork", true},
    {"POST", "/v1/sandboxes/*/reset", LB_AUTH_ADMIN, false, route_sandbox_reset, "reset", true},
    {"POST", "/v1/sandboxes/*/resume", LB_AUTH_SANDBOX, false, route_resume, "resume", false},
    {"POST", "/v1/sandboxes/*/renew", LB_AUTH_SANDBOX, false, route_renew, "renew", true},
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
    {"POST", "/v1/sandboxes/*/contexts", LB_AUTH_SANDBOX, false, route_context_create,
     "context_create", false},
    {"POST", "/v1/contexts/*/run", LB_AUTH_CONTEXT, false, route_context_run, "context_run", false},
    {"POST", "/v1/contexts/*/interrupt", LB_AUTH_CONTEXT, false, route_context_interrupt,
     "context_interrupt", false},
    {"DELETE", "/v1/contexts/*", LB_AUTH_CONTEXT, false, route_context_delete, "context_delete",
     false},
    {"GET", "/v1/events", LB_AUTH_ADMIN, false, route_events, "events", false},
    {"GET", "/v1/images", LB_AUTH_ADMIN, false, route_images_list, "images_list", false},
    {"POST", "/v1/images", LB_AUTH_ADMIN, true, route_image_import, "image_import", false},
    {"DELETE", "/v1/images/*", LB_AUTH_ADMIN, false, route_image_delete, "image_delete", true},
    {NULL, NULL, LB_AUTH_NONE, false, NULL, NULL, false},
};

void routes_print(FILE *f)
{
    /* by enum lb_auth_need: "session" is admin or the operate token of the sandbox lent to
     * the session (the activation routes), "pty" the same for a PTY session's sandbox,
     * "context" for a code context's */
    static const char *const auth_names[] = {"none",    "admin", "sandbox",
                                             "session", "pty",   "context"};
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

    if (need == LB_AUTH_PTY || need == LB_AUTH_CONTEXT) {
        /* the session's sandbox decides; an unknown session is nobody's (admin only: 404). A
         * code context is a PTY session too, but each kind is reached only by its own routes */
        bool context = sandbox_id && strncmp(sandbox_id, LB_CONTEXT_PREFIX, 4) == 0;
        bool kind = context == (need == LB_AUTH_CONTEXT);
        bool known = kind && a->ptys && pty_sandbox_of(a->ptys, sandbox_id, sbx, sizeof(sbx)) == 0;

        target = known ? sbx : NULL;
        r = auth_authorize(a->auth, token, LB_AUTH_SANDBOX, target, who, err);
        if (r == 0 && !kind)
            return lb_error_set(err, -ENOENT, "no %s %s",
                                need == LB_AUTH_CONTEXT ? "code context" : "PTY session",
                                sandbox_id);
    } else {
        r = auth_authorize(a->auth, token, need, sandbox_id, who, err);
    }
    if (r < 0)
        return r;
    /* For a session route the sandbox is the session's live one (an exec needs a live
     * sandbox). */
    if (need == LB_AUTH_SESSION) {
        target = NULL;
        if (a->store && sandbox_id &&
            store_get_live_by_rsid(a->store, sandbox_id, &live, NULL) == 0)
            target = live.id;
    }
    /* PTY and activation requests are activity of their sandbox (its idle clock starts
     * again); exec, file and endpoint requests note theirs where they reach the sandbox */
    if (target && (need == LB_AUTH_PTY || need == LB_AUTH_CONTEXT || need == LB_AUTH_SESSION))
        lend_activity_touch(a->lend, target);
    /* Every call made with an operate token passes here: while an exclusive exec runs in the
     * token's sandbox, none of them reaches it (409, naming the exec). */
    if (target && *who == LB_PRINCIPAL_OPERATE)
        r = lend_fence_check(a->lend, target, err);
    store_record_release(&live);
    return r;
}
