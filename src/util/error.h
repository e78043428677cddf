/*
 * error.h - errors as values.
 *
 * Every fallible lendbox function returns int: 0 on success or a negative errno. When the caller
 * passes a non-NULL struct lb_error, the function also fills in a readable one-sentence message.
 * The HTTP layer turns the errno into a status with lb_error_http_status() (the mapping is the
 * contract below, so modules choose their errno with the client-visible status in mind):
 *
 *   -EINVAL, -EISDIR, -ENOTDIR, -EROFS, -ENAMETOOLONG, -ELOOP  400 bad_request
 *   -ENOKEY                                                    401 unauthorized
 *   -EACCES, -EPERM                                            403 forbidden
 *   -ENOENT, -ESRCH                                            404 not_found
 *   -EEXIST, -EBUSY, -EALREADY                                 409 conflict
 *   -ESTALE                                                    410 gone
 *   -LB_E_LOST                                                 410 sandbox_lost
 *   -EFBIG, -EMSGSIZE                                          413 payload_too_large
 *   -EOPNOTSUPP                                                422 unenforceable
 *   -EAGAIN, -EUSERS                                           429 overloaded (with Retry-After:
 *                                                              retry_after_s, else 1)
 *   -EREMOTEIO, -ETIMEDOUT, -ECONNREFUSED, -ECHILD             502 provider_error
 *   -ESHUTDOWN                                                 503 draining
 *   -ENOSYS                                                    501 not_implemented
 *   anything else (-EIO: the store failed, -ENOMEM, ...)       500 internal
 *
 * Thread-safety: a struct lb_error belongs to its caller; the functions here touch only it.
 */
#ifndef LB_ERROR_H
#define LB_ERROR_H

#include <stddef.h>

#define LB_ERROR_MESSAGE_MAX 512

struct lb_error {
    int code;                           /* negative errno, 0 when unset */
    char message[LB_ERROR_MESSAGE_MAX]; /* one readable sentence, NUL-terminated; always valid
                                         * UTF-8 when set by lb_error_set/keep (invalid bytes
                                         * become U+FFFD, a cut is made between characters) */
    long retry_after_s; /* a 429's Retry-After, whole seconds (>= 1); 0: unset (1 is sent).
                         * lb_error_set and lb_error_clear reset it; set it after them */
};

/* Set err (if non-NULL) to code and a printf-formatted message. Returns code, so a caller can
 * write `return lb_error_set(err, -EINVAL, "bad path '%s'", p);`. code must be negative. */
int lb_error_set(struct lb_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Like lb_error_set, but keeps an earlier message if err already holds one (code != 0).
 * Useful on cleanup paths where the first failure is the interesting one. */
int lb_error_keep(struct lb_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Like lb_error_keep, but the returned code and err->code are code even when an earlier
 * message is kept: the detail of a lower layer (a transport's "connection refused") under the
 * caller's meaning (-EREMOTEIO: the backend failed, 502). Returns code. */
int lb_error_recode(struct lb_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Reset err to "no error". NULL is accepted. */
void lb_error_clear(struct lb_error *err);

/* The errno that names an unknown image (404 image_not_found). */
#define LB_E_IMAGE_NOT_FOUND ENOMEDIUM

/* The errno that names a lost sandbox (410 sandbox_lost): its init died outside lendbox's
 * control (killed from the host, OOM of the init, a container removed behind lendbox's back).
 * A provider answers it for an operation on a sandbox whose record it still has but whose init
 * is gone; lending confirms it against the record (lend/lost.c) before a client sees it. */
#define LB_E_LOST EOWNERDEAD

/* HTTP status and API error code (static string, e.g. "bad_request") for a negative errno. */
int lb_error_http_status(int code, const char **api_code);

#endif
