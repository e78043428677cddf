/*
 * render.c - an activation's answers (API.md) from its record: the execute result, the close
 * result, the cleanup object, the outcome read from a receipt, and the compact text with the
 * stored artifacts spliced in unparsed. Memory only: nothing here reads a file or a provider.
 * Shares activation_internal.h.
 */
#include "activation/activation_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/utf8.h"

/* Valid UTF-8 text of len bytes (invalid sequences become U+FFFD). */
json_t *act_json_text(const void *data, size_t len)
{
    struct lb_buf clean;
    json_t *s;

    lb_buf_init(&clean, 0);
    if (utf8_sanitize(data ? data : "", len, &clean) < 0) {
        lb_buf_release(&clean);
        return NULL;
    }
    s = json_stringn(clean.data ? clean.data : "", clean.len);
    lb_buf_release(&clean);
    return s;
}

/* API.md's cleanup object from a receipt; malformed diagnostic fields get defaults. */
static json_t *render_cleanup(const json_t *receipt)
{
    json_t *rc = json_object_get(receipt, "return_code"), *e = json_object_get(receipt, "error");

    if (!receipt)
        return json_null();
    return json_pack("{s:b,s:o,s:b,s:o}", "cleanup_confirmed", act_receipt_confirmed(receipt),
                     "return_code", json_is_integer(rc) ? json_copy(rc) : json_null(), "timed_out",
                     json_is_true(json_object_get(receipt, "timed_out")), "error",
                     json_is_string(e) ? json_copy(e) : json_null());
}

/* finished / timed_out / failed, and for failed why. */
static const char *outcome(const json_t *receipt, const char **why)
{
    const json_t *launched = json_object_get(receipt, "launched");
    const char *e = json_string_value(json_object_get(receipt, "error"));

    *why = NULL;
    if (!receipt) {
        *why = "the harness supervisor left no receipt";
        return "failed";
    }
    if (json_is_false(launched)) {
        *why = "the activation was closed before the harness was launched";
        return "failed";
    }
    if (json_is_true(json_object_get(receipt, "timed_out")))
        return "timed_out";
    if (json_is_string(json_object_get(receipt, "oom_message"))) {
        *why = json_string_value(json_object_get(receipt, "oom_message"));
        return "failed";
    }
    if (e) {
        *why = e;
        return "failed";
    }
    if (!act_receipt_confirmed(receipt)) {
        *why = "the harness's cleanup was not confirmed";
        return "failed";
    }
    if (json_is_true(json_object_get(receipt, "stop_requested"))) {
        *why = "the harness was stopped by a close before it ended";
        return "failed";
    }
    return "finished";
}

static json_t *stored_artifacts(const struct lb_activation *act, json_t *spec)
{
    json_t *art = act->artifacts_json ? json_loads(act->artifacts_json, 0, NULL) : NULL;
    json_t *collect = json_object_get(spec, "collect"), *v;
    size_t idx;

    if (art)
        return art;
    art = json_object(); /* not collected (yet): every path null */
    json_array_foreach(collect, idx, v)
        if (json_is_string(v))
            json_object_set_new(art, json_string_value(v), json_null());
    return art;
}

/* "oom" when a memory-limit kill ended the harness (act_note_oom), else NULL (JSON null). */
static const char *receipt_error_type(const json_t *receipt, const char *why_override)
{
    return !why_override && !json_is_true(json_object_get(receipt, "timed_out")) &&
                   json_is_string(json_object_get(receipt, "oom_message"))
               ? "oom"
               : NULL;
}

/* The execute result of API.md from the record. why overrides the receipt's reason. */
json_t *act_render_result(const struct lb_activation *act, const char *why_override)
{
    json_t *receipt = act->receipt_json ? json_loads(act->receipt_json, 0, NULL) : NULL;
    json_t *spec = act->spec_json ? json_loads(act->spec_json, 0, NULL) : NULL;
    json_t *rc = json_object_get(receipt, "return_code"), *out;
    const char *why, *state = outcome(receipt, &why);

    if (why_override) {
        state = "failed";
        why = why_override;
    }
    out = json_pack("{s:s,s:s,s:o,s:o,s:s?,s:o,s:I,s:s?,s:s?}", "activation_id", act->id, "state",
                    state, "return_code", json_is_integer(rc) ? json_copy(rc) : json_null(),
                    "artifacts", stored_artifacts(act, spec), "capture_error", act->capture_error,
                    "cleanup", render_cleanup(receipt), "output_log_bytes",
                    (json_int_t)(act->output_log_bytes > 0 ? act->output_log_bytes : 0), "error",
                    why, "error_type", receipt_error_type(receipt, why_override));
    if (out && strcmp(state, "finished") != 0) {
        size_t n = act->log_len > RESULT_LOG_TAIL ? RESULT_LOG_TAIL : act->log_len;

        json_object_set_new(out, "output_log_tail",
                            act_json_text(act->log ? act->log + act->log_len - n : NULL, n));
    }
    json_decref(receipt);
    json_decref(spec);
    return out;
}

json_t *act_render_close(const struct lb_activation *act)
{
    json_t *receipt = act->receipt_json ? json_loads(act->receipt_json, 0, NULL) : NULL;
    json_t *spec = act->spec_json ? json_loads(act->spec_json, 0, NULL) : NULL;
    json_t *out = json_pack("{s:b,s:s,s:s,s:o,s:s?,s:o,s:I,s:s?}", "closed", 1, "activation_id",
                            act->id, "state", store_act_state_name(act->state), "artifacts",
                            stored_artifacts(act, spec), "capture_error", act->capture_error,
                            "cleanup", render_cleanup(receipt), "output_log_bytes",
                            (json_int_t)(act->output_log_bytes > 0 ? act->output_log_bytes : 0),
                            "error_type", receipt_error_type(receipt, NULL));
    json_t *rc = json_object_get(receipt, "return_code");

    if (out) /* the same return code as execute and GET report */
        json_object_set_new(out, "return_code", json_is_integer(rc) ? json_copy(rc) : json_null());

    json_decref(receipt);
    json_decref(spec);
    return out;
}

/* res as compact JSON text, with raw (stored JSON text, taken; NULL: none) spliced in as its
 * last member "artifacts": the stored artifacts are copied, never parsed. */
int act_render_text(const json_t *res, char *raw, char **text, size_t *len, struct lb_error *err)
{
    char *small = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII), *all = NULL;
    size_t n = small ? strlen(small) : 0, k;
    int r = 0;

    *text = NULL;
    *len = 0;
    if (!small || n < 2 || small[n - 1] != '}') {
        r = lb_error_set(err, -ENOMEM, "out of memory rendering the activation");
        goto out;
    }
    if (!raw) {
        *text = small;
        *len = n;
        small = NULL;
        goto out;
    }
    k = strlen(raw);
    all = malloc(n + k + 16);
    if (!all) {
        r = lb_error_set(err, -ENOMEM, "out of memory rendering the activation");
        goto out;
    }
    memcpy(all, small, --n); /* without the closing brace */
    if (n > 1)
        all[n++] = ',';
    memcpy(all + n, "\"artifacts\":", 12);
    n += 12;
    free(small); /* copied: freed before the large copy */
    small = NULL;
    memcpy(all + n, raw, k);
    n += k;
    all[n++] = '}';
    all[n] = '\0';
    *text = all;
    *len = n;
out:
    free(small);
    free(raw);
    return r;
}
