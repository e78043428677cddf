/* ops.c - /healthz, /readyz, /metrics. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "lend/pty.h"
#include "routes/routes.h"
#include "util/metrics.h"

int route_healthz(struct lb_request *req, struct lb_error *err)
{
    (void)err;
    http_respond_json(req, 200, json_pack("{s:s}", "status", "ok"));
    return 0;
}

int route_readyz(struct lb_request *req, struct lb_error *err)
{
    struct lb_app *app = http_app(req);
    struct lb_error why = {0};

    if (!atomic_load(&app->ready) || lend_is_draining(app->lend))
        return lb_error_set(err, -ESHUTDOWN,
                            lend_is_draining(app->lend) ? "the daemon is draining"
                                                        : "startup reconciliation is not done yet");
    /* not ready while the records cannot be written (a full or read-only state dir) */
    if (lend_check_store(app->lend, &why) < 0)
        return lb_error_set(err, -ESHUTDOWN, "%s", why.message);
    http_respond_json(req, 200, json_pack("{s:s}", "status", "ready"));
    return 0;
}

int route_metrics(struct lb_request *req, struct lb_error *err)
{
    struct lb_app *app = http_app(req);
    struct lb_buf out;
    char line[512];
    int r, n;

    lb_buf_init(&out, 0);
    r = metrics_render(&out);
    if (r == 0)
        r = lend_render_metrics(app->lend, &out);
    if (r == 0) {
        n = snprintf(line, sizeof(line),
                     "# HELP lendbox_worker_queue_depth Jobs waiting for a worker.\n"
                     "# TYPE lendbox_worker_queue_depth gauge\nlendbox_worker_queue_depth %zu\n"
                     "# HELP lendbox_workers_busy Workers running a job.\n"
                     "# TYPE lendbox_workers_busy gauge\nlendbox_workers_busy %zu\n"
                     "# HELP lendbox_http_parked Requests waiting parked (no worker held).\n"
                     "# TYPE lendbox_http_parked gauge\nlendbox_http_parked %zu\n"
                     "# HELP lendbox_pty_sessions PTY sessions and detached execs.\n"
                     "# TYPE lendbox_pty_sessions gauge\nlendbox_pty_sessions %zu\n",
                     pool_queued(app->pool), pool_running(app->pool),
                     http_parked_count(http_server(req)), app->ptys ? pty_count(app->ptys) : 0);
        r = lb_buf_append(&out, line, (size_t)n);
    }
    if (r < 0) {
        lb_buf_release(&out);
        return lb_error_set(err, r, "cannot render metrics");
    }
    size_t len = out.len;
    http_respond_text(req, 200, "text/plain; version=0.0.4", lb_buf_steal(&out, NULL), len);
    return 0;
}
