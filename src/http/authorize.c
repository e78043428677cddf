/*
 * authorize.c - a request's bearer token, decided by the app's authorize hook: when the headers
 * are complete (http.c) and again when a deferred job of a request that is not the admin's
 * starts (defer.c).
 */
#include "http/http_internal.h"

#include <errno.h>
#include <microhttpd.h>
#include <string.h>
#include <strings.h>

/* see http_internal.h */
int http_request_authorize(struct lb_request *req, struct lb_error *err)
{
    const char *auth = MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, "Authorization");
    const char *token = NULL;

    if (req->route->auth == LB_AUTH_NONE)
        return 0;
    if (auth && strncasecmp(auth, "Bearer ", 7) == 0) {
        token = auth + 7;
        while (*token == ' ')
            token++;
    }
    if (!token || !*token)
        return lb_error_set(err, -ENOKEY, "a bearer token is required (Authorization: Bearer ...)");
    req->token_key = http_token_hash(token);
    return req->http->cfg.authorize(
        req->http->cfg.app, token, req->route->auth,
        req->route->auth == LB_AUTH_SANDBOX || req->route->auth == LB_AUTH_SESSION ||
                req->route->auth == LB_AUTH_PTY || req->route->auth == LB_AUTH_CONTEXT
            ? req->params[0]
            : NULL,
        &req->principal, err);
}

int http_reauthorize(struct lb_request *req, struct lb_error *err)
{
    return http_request_authorize(req, err);
}
