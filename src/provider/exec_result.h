/*
 * exec_result.h - the supervisor's status line and runtime results, for every provider.
 *
 * lendbox-supervise ends every command it runs with one status line (supervise.c, "Status"):
 * "exit N", "signal N", "timeout" or "error TEXT". The local provider reads it from a pipe,
 * the engine providers from the framed stream's 's' frame (engine/framed.h); both turn it into
 * a struct lb_exec_result here, so the two meanings cannot drift apart. A runtime result is one
 * that is not the command's: return code LB_RETURN_CODE_RUNTIME, an error type and a message.
 *
 * Thread-safety: none needed; each call touches only the result it is given.
 */
#ifndef LB_PROVIDER_EXEC_RESULT_H
#define LB_PROVIDER_EXEC_RESULT_H

#include "provider/provider.h"

enum lb_exec_status_kind {
    LB_EXEC_STATUS_EXIT,       /* value: the exit code */
    LB_EXEC_STATUS_SIGNAL,     /* value: the signal number */
    LB_EXEC_STATUS_TIMEOUT,    /* the supervisor killed the command's tree at its timeout */
    LB_EXEC_STATUS_ERROR,      /* text: why the command could not be run */
    LB_EXEC_STATUS_UNREADABLE, /* none of the above */
};

struct lb_exec_status {
    enum lb_exec_status_kind kind;
    long value;       /* EXIT, SIGNAL */
    const char *text; /* ERROR: points into the line given to exec_status_parse, else NULL */
};

/* Parse one status line: NUL-terminated, a trailing "\n" (and anything after it) is not part
 * of it and must be cut by the caller. Returns 0, or -EINVAL (kind UNREADABLE) when the line
 * is none of the forms. */
int exec_status_parse(const char *line, struct lb_exec_status *out);

/* Rewrite an error text for the message (the local provider turns ": errno N" into strerror
 * text); out has size bytes, always NUL-terminated. */
typedef void (*lb_exec_text_fn)(const char *in, char *out, size_t size);

/* Set res from the status line (as exec_status_parse takes it): EXIT N gives return code N,
 * SIGNAL N 128 + N, both error type LB_EXEC_OK; TIMEOUT a runtime result of type
 * LB_EXEC_TIMEOUT; ERROR a runtime result of type LB_EXEC_SANDBOX whose message is the text
 * (through text_of when not NULL) and is also appended to res->err as a line of its own;
 * UNREADABLE a runtime result of type LB_EXEC_SANDBOX noted as exec_result_note does. */
void exec_result_apply_status(struct lb_exec_result *res, const char *line,
                              lb_exec_text_fn text_of);

/* Make res a runtime result of type with a printf message (res->err is not touched). */
void exec_result_set_runtime(struct lb_exec_result *res, enum lb_exec_error type, const char *fmt,
                             ...) __attribute__((format(printf, 3, 4)));

/* Make res a runtime result of type with message why, and append why to res->err as a line
 * "lendbox: WHY" of its own (docs/api.md: sandbox failures are told on stderr too). */
void exec_result_note(struct lb_exec_result *res, enum lb_exec_error type, const char *why);

/* Append msg to b as a line of its own: a newline first when b does not end with one, one
 * after it. Capped by b's cap (lb_buf_append_capped). */
void exec_result_append_line(struct lb_buf *b, const char *msg);

#endif
