/*
 * lxd_api.c - the LXD REST API transport, the base of the lxd provider's files: requests
 * (lxd_do, lxd_call) counted per cluster member, answers' error messages, operations
 * (lxd_async, lxd_wait_operation) and an instance's state. It calls nothing above it
 * (lxd.c, lxd_exec.c, lxd_files.c).
 */
#include "provider/lxd/lxd_internal.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/metrics.h"

#define SMALL_BODY_BYTES (4 * 1024 * 1024)

const char *lxd_member_of(const struct lb_sandbox_ref *ref)
{
    const char *m = ref ? json_string_value(json_object_get(ref->descriptor, "location")) : NULL;

    return m && *m ? m : "-";
}

static int64_t call_ms(const struct lb_lxd *l, int64_t timeout_ms)
{
    return timeout_ms > 0 ? timeout_ms : l->call_timeout_ms;
}

/* A path we send: ours, or one LXD answered (an operation, an exec's log). Only plain /1.0/
 * paths: no userinfo or authority tricks ('@', "//"), no "..", no header or request-line
 * breaks, so an answer can never point a request anywhere but the LXD API. */
static bool lxd_path_is_safe(const char *path)
{
    return path && (strncmp(path, "/1.0/", 5) == 0 || strcmp(path, "/1.0") == 0) &&
           !strchr(path, '@') && !strstr(path, "//") && !strstr(path, "..") &&
           !strpbrk(path, "\r\n\t \\");
}

/* The end of every request: counted for member (a failure is a transport error or a 5xx);
 * r, httpc's return, as this provider's error. */
static int lxd_done(const char *member, int r, const struct lb_httpc_response *resp,
                    struct lb_error *err)
{
    metrics_member_call("lxd", member, r < 0 || resp->status >= 500);
    if (r == 0 || r == -ETIMEDOUT || r == -ECANCELED || r == -EFBIG || r == -EINVAL)
        return r;
    /* whatever the transport said: the provider failed (502) */
    return lb_error_recode(err, -EREMOTEIO, "the LXD server cannot be reached");
}

static int refuse_path(const char *path, struct lb_error *err)
{
    return lb_error_set(err, -EREMOTEIO, "LXD: refusing an unexpected API path '%.80s'",
                        path ? path : "");
}

int lxd_do(struct lb_lxd *l, const char *member, const struct lb_httpc_request *req,
           struct lb_httpc_response *resp, struct lb_error *err)
{
    if (!lxd_path_is_safe(req->path))
        return refuse_path(req->path, err);
    return lxd_done(member, httpc_do(l->eng.http, req, resp, err), resp, err);
}

int lxd_call(struct lb_lxd *l, const char *member, const char *method, const char *path,
             const json_t *body, int64_t timeout_ms, struct lb_httpc_response *resp,
             struct lb_error *err)
{
    struct lb_httpc_request req = {.method = method,
                                   .path = path,
                                   .timeout_ms = call_ms(l, timeout_ms),
                                   .max_body_bytes = SMALL_BODY_BYTES};

    memset(resp, 0, sizeof(*resp));
    if (!lxd_path_is_safe(path))
        return refuse_path(path, err);
    return lxd_done(member, httpc_call_json(l->eng.http, &req, body, resp, err), resp, err);
}

void lxd_wait_path(const char *op, int64_t secs, char *buf, size_t size)
{
    size_t base = strcspn(op, "?");

    /* a cluster answers "/1.0/operations/ID?project=default": the wait goes before the query */
    snprintf(buf, size, "%.*s/wait?timeout=%lld%s%s", (int)base, op, (long long)secs,
             op[base] ? "&" : "", op[base] ? op + base + 1 : "");
}

int lxd_answer_error(const struct lb_httpc_response *resp, const char *what, struct lb_error *err)
{
    char m[300];

    httpc_json_message(resp, "error", m, sizeof(m));
    return lb_error_set(err, resp->status == 404 ? -ENOENT : -EREMOTEIO,
                        "LXD: %s failed (HTTP %ld): %s", what, resp->status, m);
}

/* Await an operation (its path "/1.0/operations/ID") up to timeout_ms. */
int lxd_wait_operation(struct lb_lxd *l, const char *member, const char *op, int64_t timeout_ms,
                       json_t **op_out, struct lb_error *err)
{
    struct lb_httpc_response resp;
    char path[512];
    int64_t secs = timeout_ms / 1000 > 0 ? timeout_ms / 1000 : 1;
    json_t *j = NULL, *md;
    const char *status;
    int r;

    lxd_wait_path(op, secs, path, sizeof(path));
    /* LXD answers when the operation ends or after secs; curl gives it a little more */
    r = lxd_call(l, member, "GET", path, NULL, timeout_ms + 2000, &resp, err);
    if (r < 0)
        goto out;
    if (resp.status != 200) {
        r = lxd_answer_error(&resp, "waiting for an operation", err);
        if (r == -ENOENT)
            r = lb_error_set(err, -EREMOTEIO, "LXD lost operation %s", op);
        goto out;
    }
    j = json_loadb(resp.body.data, resp.body.len, 0, NULL);
    md = json_object_get(j, "metadata");
    status = json_string_value(json_object_get(md, "status")) ?: "";
    if (strcmp(status, "Success") == 0) {
        if (op_out)
            *op_out = json_incref(md);
    } else if (strcmp(status, "Running") == 0 || strcmp(status, "Pending") == 0) {
        r = lb_error_set(err, -ETIMEDOUT, "LXD: %s did not end within %lld ms",
                         json_string_value(json_object_get(md, "description")) ?: "an operation",
                         (long long)timeout_ms);
    } else {
        r = lb_error_set(err, -EREMOTEIO, "LXD: %s failed: %s",
                         json_string_value(json_object_get(md, "description")) ?: "an operation",
                         json_string_value(json_object_get(md, "err")) ?: status);
    }
out:
    json_decref(j);
    httpc_response_release(&resp);
    return r;
}

int lxd_async(struct lb_lxd *l, const char *member, const char *method, const char *path,
              const json_t *body, int64_t timeout_ms, json_t **op_out, struct lb_error *err)
{
    struct lb_httpc_response resp;
    int64_t t0 = clock_mono_ms(), left;
    json_t *j = NULL;
    const char *op;
    char what[64];
    int r;

    if (op_out)
        *op_out = NULL;
    timeout_ms = call_ms(l, timeout_ms);
    r = lxd_call(l, member, method, path, body, timeout_ms, &resp, err);
    if (r < 0)
        goto out;
    if (resp.status != 202 && resp.status != 200) {
        snprintf(what, sizeof(what), "%s %.40s", method, path);
        r = lxd_answer_error(&resp, what, err);
        goto out;
    }
    j = json_loadb(resp.body.data, resp.body.len, 0, NULL);
    op = json_string_value(json_object_get(j, "operation"));
    if (!op || !*op) { /* a sync answer */
        if (op_out)
            *op_out = json_incref(json_object_get(j, "metadata"));
        goto out;
    }
    left = timeout_ms - (clock_mono_ms() - t0);
    if (left < 1000)
        left = 1000;
    r = lxd_wait_operation(l, member, op, left, op_out, err);
out:
    json_decref(j);
    httpc_response_release(&resp);
    return r;
}

/* An instance's status and the status it means (one that ended is an error; one freezing or
 * thawed runs). */
static const struct engine_state_name lxd_states[] = {
    {"Running", LB_STATUS_RUNNING},   {"Frozen", LB_STATUS_PAUSED},
    {"Starting", LB_STATUS_STARTING}, {"Pending", LB_STATUS_STARTING},
    {"Stopped", LB_STATUS_ERROR},     {"Aborting", LB_STATUS_ERROR},
    {"Freezing", LB_STATUS_RUNNING},  {"Thawed", LB_STATUS_RUNNING},
    {NULL, LB_STATUS_UNKNOWN},
};

int lxd_state(struct lb_lxd *l, const struct lb_sandbox_ref *ref, enum lb_sandbox_status *out,
              struct lb_error *err)
{
    struct lb_httpc_response resp;
    char path[256];
    int r;

    snprintf(path, sizeof(path), "/1.0/instances/%s/state", ref->id);
    r = lxd_call(l, lxd_member_of(ref), "GET", path, NULL, 0, &resp, err);
    if (r == 0 && engine_state_answer(&resp, "metadata", "status", lxd_states, out) < 0)
        r = lxd_answer_error(&resp, "instance state", err); /* not 404: -EREMOTEIO */
    httpc_response_release(&resp);
    return r;
}

int lxd_list_labelled(struct lb_engine *e, const char *label, const char *value, const char *what,
                      json_t **out, struct lb_error *err)
{
    char filter[200], path[512], *enc;
    int r;

    *out = NULL;
    snprintf(filter, sizeof(filter), "config.%s eq %s", label, value);
    enc = curl_easy_escape(NULL, filter, 0);
    if (!enc)
        return lb_error_set(err, -ENOMEM, "out of memory");
    snprintf(path, sizeof(path), "/1.0/instances?recursion=1&filter=%s", enc);
    curl_free(enc);
    r = engine_get_json(e, path, what, 0, out, err);
    return r == -ENOENT ? -EREMOTEIO : r; /* a list LXD does not have: it failed */
}
