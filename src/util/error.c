/* error.c - see error.h. */
#include "util/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "util/utf8.h"

static void error_vset(struct lb_error *err, int code, const char *fmt, va_list ap)
{
    err->code = code;
    err->retry_after_s = 0;
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    /* messages quote what clients and sandboxes sent (paths, names, output): they go into JSON,
     * which holds only valid UTF-8, so invalid bytes and a sequence cut by the size limit are
     * replaced here, once, for every message */
    utf8_sanitize_inplace(err->message, sizeof(err->message));
}

/* error_vset(err, code, fmt, the variadic arguments after fmt) in a variadic function. */
#define ERROR_SET_ARGS(err, code, fmt)                                                             \
    do {                                                                                           \
        va_list ap_;                                                                               \
                                                                                                   \
        va_start(ap_, fmt);                                                                        \
        error_vset(err, code, fmt, ap_);                                                           \
        va_end(ap_);                                                                               \
    } while (0)

int lb_error_set(struct lb_error *err, int code, const char *fmt, ...)
{
    if (err)
        ERROR_SET_ARGS(err, code, fmt);
    return code;
}

int lb_error_keep(struct lb_error *err, int code, const char *fmt, ...)
{
    if (err && err->code != 0)
        return err->code;
    if (err)
        ERROR_SET_ARGS(err, code, fmt);
    return code;
}

int lb_error_recode(struct lb_error *err, int code, const char *fmt, ...)
{
    if (!err)
        return code;
    if (err->code == 0)
        ERROR_SET_ARGS(err, code, fmt);
    err->code = code;
    return code;
}

void lb_error_clear(struct lb_error *err)
{
    if (!err)
        return;
    err->code = 0;
    err->retry_after_s = 0;
    err->message[0] = '\0';
}

/* The HTTP status and API error code each errno answers with (a function returns it as
 * -errno); any other errno is 500 "internal". */
static const struct http_code {
    int status;
    const char *name;
    int errnos[7]; /* 0 ends the list */
} http_codes[] = {
    {400, "bad_request", {EINVAL, EISDIR, ENOTDIR, EROFS, ENAMETOOLONG, ELOOP}},
    {401, "unauthorized", {ENOKEY}},
    {403, "forbidden", {EACCES, EPERM}},
    {404, "not_found", {ENOENT, ESRCH}},
    {404, "image_not_found", {LB_E_IMAGE_NOT_FOUND}},
    {409, "conflict", {EEXIST, EBUSY, EALREADY}},
    {410, "gone", {ESTALE}}, /* a PTY output offset older than the retained window */
    {410, "sandbox_lost", {LB_E_LOST}},
    {413, "payload_too_large", {EFBIG, EMSGSIZE}},
    {422, "unenforceable", {EOPNOTSUPP}},
    {429, "overloaded", {EAGAIN, EUSERS}},
    {502, "provider_error", {EREMOTEIO, ETIMEDOUT, ECONNREFUSED, ECHILD}},
    /* ENOSPC: the state dir's file system is full: retry once space returns */
    {503, "draining", {ESHUTDOWN, ENOSPC}},
    {501, "not_implemented", {ENOSYS}},
};

int lb_error_http_status(int code, const char **api_code)
{
    for (size_t i = 0; i < sizeof(http_codes) / sizeof(http_codes[0]); i++) {
        const struct http_code *c = &http_codes[i];

        for (size_t j = 0; j < sizeof(c->errnos) / sizeof(c->errnos[0]) && c->errnos[j]; j++) {
            if (c->errnos[j] == -code) {
                if (api_code)
                    *api_code = c->name;
                return c->status;
            }
        }
    }
    if (api_code)
        *api_code = "internal";
    return 500;
}
