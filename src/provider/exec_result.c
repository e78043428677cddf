/*
 * exec_result.c - the supervisor's status line into a struct lb_exec_result, and runtime
 * results, for every provider (see exec_result.h).
 */
#include "provider/exec_result.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int exec_status_parse(const char *line, struct lb_exec_status *out)
{
    *out = (struct lb_exec_status){.kind = LB_EXEC_STATUS_UNREADABLE};
    if (sscanf(line, "exit %ld", &out->value) == 1)
        out->kind = LB_EXEC_STATUS_EXIT;
    else if (sscanf(line, "signal %ld", &out->value) == 1)
        out->kind = LB_EXEC_STATUS_SIGNAL;
    else if (strcmp(line, "timeout") == 0)
        out->kind = LB_EXEC_STATUS_TIMEOUT;
    else if (strncmp(line, "error ", 6) == 0) {
        out->kind = LB_EXEC_STATUS_ERROR;
        out->text = line + 6;
    } else {
        out->value = 0;
        return -EINVAL;
    }
    return 0;
}

void exec_result_append_line(struct lb_buf *b, const char *msg)
{
    if (b->len > 0 && b->data[b->len - 1] != '\n')
        (void)lb_buf_append_capped(b, "\n", 1);
    (void)lb_buf_append_capped(b, msg, strlen(msg));
    (void)lb_buf_append_capped(b, "\n", 1);
}

void exec_result_set_runtime(struct lb_exec_result *res, enum lb_exec_error type, const char *fmt,
                             ...)
{
    va_list ap;

    res->return_code = LB_RETURN_CODE_RUNTIME;
    res->error_type = type;
    va_start(ap, fmt);
    vsnprintf(res->message, sizeof(res->message), fmt, ap);
    va_end(ap);
}

void exec_result_note(struct lb_exec_result *res, enum lb_exec_error type, const char *why)
{
    char line[sizeof(res->message) + 16];

    exec_result_set_runtime(res, type, "%s", why);
    snprintf(line, sizeof(line), "lendbox: %s", why);
    exec_result_append_line(&res->err, line);
}

void exec_result_apply_status(struct lb_exec_result *res, const char *line, lb_exec_text_fn text_of)
{
    struct lb_exec_status st;
    char why[sizeof(res->message)];

    (void)exec_status_parse(line, &st);
    switch (st.kind) {
    case LB_EXEC_STATUS_EXIT:
        res->return_code = (int)st.value;
        res->error_type = LB_EXEC_OK;
        break;
    case LB_EXEC_STATUS_SIGNAL:
        res->return_code = 128 + (int)st.value;
        res->error_type = LB_EXEC_OK;
        break;
    case LB_EXEC_STATUS_TIMEOUT:
        exec_result_set_runtime(res, LB_EXEC_TIMEOUT, "%s",
                                "the command did not end within its timeout; its process tree "
                                "was killed");
        break;
    case LB_EXEC_STATUS_ERROR:
        if (text_of)
            text_of(st.text, res->message, sizeof(res->message));
        else
            snprintf(res->message, sizeof(res->message), "%s", st.text);
        res->return_code = LB_RETURN_CODE_RUNTIME;
        res->error_type = LB_EXEC_SANDBOX;
        exec_result_append_line(&res->err, res->message);
        break;
    case LB_EXEC_STATUS_UNREADABLE:
        snprintf(why, sizeof(why), "unreadable status from the supervisor: %.300s", line);
        exec_result_note(res, LB_EXEC_SANDBOX, why);
        break;
    }
}
