/* endpoints.c - GET /v1/sandboxes/{id}/endpoints/{port}: a URL reaching a service port of the
 * sandbox from the daemon's host (NeMo Gym's SandboxEndpoint). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "routes/routes.h"

/* lend_endpoint of a port the route checked (1 to 65535). */
static int endpoint_of(struct lb_lend *l, const char *id, int64_t port, json_t **out,
                       struct lb_error *err)
{
    return lend_endpoint(l, id, (int)port, out, err);
}

static void endpoint_run(struct lb_request *req, void *arg)
{
    const struct routes_id_num_job *j = arg;
    struct lb_error err = {0};
    bool held;

    /* an operate token's endpoint admitted before a reset makes its relay in its own episode or
     * none (401): one made after the reset closed the old ones would reach the next episode */
    if (routes_operate_enter_read(req, j->id, &held, &err) < 0) {
        http_respond_error(req, &err);
        return;
    }
    routes_respond_lend_id_num(req, endpoint_of, j);
    routes_operate_leave_read(req, j->id, &held);
}

int route_endpoint(struct lb_request *req, struct lb_error *err)
{
    const char *port_text = http_param(req, 1);
    struct routes_id_num_job *j;
    char *end = NULL;
    long port;

    port = port_text ? strtol(port_text, &end, 10) : 0;
    if (!port_text || !*port_text || *end || port < 1 || port > 65535)
        return lb_error_set(err, -EINVAL, "the port must be an integer from 1 to 65535");
    j = routes_id_num_job_new(http_param(req, 0), port);
    if (!j)
        return lb_error_set(err, -ENOMEM, "out of memory");
    return http_defer(req, endpoint_run, j, routes_id_num_job_free, err);
}
