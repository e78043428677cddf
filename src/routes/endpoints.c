/* endpoints.c - GET /v1/sandboxes/{id}/endpoints/{port}: a URL reaching a service port of the
 * sandbox from the daemon's host (NeMo Gym's SandboxEndpoint). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "routes/routes.h"

struct endpoint_job {
    char *id;
    int port;
};

static void endpoint_job_free(void *arg)
{
    struct endpoint_job *j = arg;

    if (j)
        free(j->id);
    free(j);
}

static void endpoint_run(struct lb_request *req, void *arg)
{
    struct endpoint_job *j = arg;
    struct lb_app *app = http_app(req);
    struct lb_error err = {0};
    json_t *out = NULL;
    int r = lend_endpoint(app->lend, j->id, j->port, &out, &err);

    routes_respond(req, r, 200, out, &err);
}

int route_endpoint(struct lb_request *req, struct lb_error *err)
{
    const char *port_text = http_param(req, 1);
    struct endpoint_job *j;
    char *end = NULL;
    long port;

    port = port_text ? strtol(port_text, &end, 10) : 0;
    if (!port_text || !*port_text || *end || port < 1 || port > 65535)
        return lb_error_set(err, -EINVAL, "the port must be an integer from 1 to 65535");
    j = calloc(1, sizeof(*j));
    if (!j || !(j->id = strdup(http_param(req, 0)))) {
        free(j);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    j->port = (int)port;
    return http_defer(req, endpoint_run, j, endpoint_job_free, err);
}
