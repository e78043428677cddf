/* error.c - see error.h. */
#include "util/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "util/utf8.h"

static void error_vset(struct lb_error *err, int code, const char *fmt, va_list ap)
{
    err->code = code;
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    /* messages quote what clients and sandboxes sent (paths, names, output): they go into JSON,
     * which holds only valid UTF-8, so invalid bytes and a sequence cut by the size limit are
     * replaced here, once, for every message */
    utf8_sanitize_inplace(err->message, sizeof(err->message));
}

int lb_error_set(struct lb_error *err, int code, const char *fmt, ...)
{
    va_list ap;

    if (!err)
        return code;
    va_start(ap, fmt);
    error_vset(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int lb_error_keep(struct lb_error *err, int code, const char *fmt, ...)
{
    va_list ap;

    if (!err || err->code != 0)
        return err ? err->code : code;
    va_start(ap, fmt);
    error_vset(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int lb_error_recode(struct lb_error *err, int code, const char *fmt, ...)
{
    va_list ap;

    if (!err)
        return code;
    if (err->code == 0) {
        va_start(ap, fmt);
        error_vset(err, code, fmt, ap);
        va_end(ap);
    }
    err->code = code;
    return code;
}

void lb_error_clear(struct lb_error *err)
{
    if (!err)
        return;
    err->code = 0;
    err->message[0] = '\0';
}

int lb_error_http_status(int code, const char **api_code)
{
    int status = 500;
    const char *name = "internal";

    switch (-code) {
    case EINVAL:
    case EISDIR:
    case ENOTDIR:
    case EROFS:
    case ENAMETOOLONG:
    case ELOOP:
        status = 400, name = "bad_request";
        break;
    case ENOKEY:
        status = 401, name = "unauthorized";
        break;
    case EACCES:
    case EPERM:
        status = 403, name = "forbidden";
        break;
    case ENOENT:
    case ESRCH:
        status = 404, name = "not_found";
        break;
    case LB_E_IMAGE_NOT_FOUND:
        status = 404, name = "image_not_found";
        break;
    case EEXIST:
    case EBUSY:
    case EALREADY:
        status = 409, name = "conflict";
        break;
    case ESTALE: /* a PTY output offset older than the retained window */
        status = 410, name = "gone";
        break;
    case EFBIG:
    case EMSGSIZE:
        status = 413, name = "payload_too_large";
        break;
    case EOPNOTSUPP:
        status = 422, name = "unenforceable";
        break;
    case EAGAIN:
    case EUSERS:
        status = 429, name = "overloaded";
        break;
    case EREMOTEIO:
    case ETIMEDOUT:
    case ECONNREFUSED:
    case ECHILD:
        status = 502, name = "provider_error";
        break;
    case ESHUTDOWN:
    case ENOSPC: /* the state dir's file system is full: retry once space returns */
        status = 503, name = "draining";
        break;
    case ENOSYS:
        status = 501, name = "not_implemented";
        break;
    default:
        break;
    }
    if (api_code)
        *api_code = name;
    return status;
}
