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
    routes_respond_lend_id_num(req, endpoint_of, arg);
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
