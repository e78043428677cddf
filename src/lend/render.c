/*
 * render.c - the JSON a lending call answers with: leases, sandbox objects, and the operate
 * token a lease carries. See lend.h and API.md.
 */
#include "lend/lend_private.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/token.h"

/* ---------- rendering ---------- */

/* A usage figure as JSON: the number, or null where the host cannot tell (< 0). */
static json_t *usage_int(int64_t v)
{
    return v < 0 ? json_null() : json_integer((json_int_t)v);
}

/* see lend_private.h */
json_t *lend_usage_json(const struct lb_usage *u)
{
    return json_pack("{s:o,s:o,s:o,s:o,s:o,s:o}", "cpu_s",
                     u->cpu_s < 0 ? json_null() : json_real(u->cpu_s), "memory_bytes",
                     usage_int(u->memory_bytes), "memory_peak_bytes",
                     usage_int(u->memory_peak_bytes), "pids", usage_int(u->pids), "oom_kills",
                     usage_int(u->oom_kills), "disk_bytes", usage_int(u->disk_bytes));
}

int lend_operate_token(struct lb_lend *l, const char *id, int64_t generation, char token[4 + 65])
{
    char mac[LB_SHA256_HEX + 1], msg[LB_ID_MAX + 32];
    int r;

    /* generation 0 is the seed's token; every reset mints the next one */
    if (generation > 0)
        snprintf(msg, sizeof(msg), "%s#%lld", id, (long long)generation);
    else
        snprintf(msg, sizeof(msg), "%s", id);
    r = token_hmac_hex(l->operate_key, l->cfg.operate_key_len, msg, mac);

    if (r < 0)
        return r;
    snprintf(token, 4 + 65, "lbo_%s", mac);
    return 0;
}

const char *lend_spec_string(const struct lb_record *r, const char *key, const char *def,
                             json_t **holder)
{
    json_t *spec = r->spec_json ? json_loads(r->spec_json, 0, NULL) : NULL;
    const char *v = spec ? json_string_value(json_object_get(spec, key)) : NULL;

    *holder = spec;
    return v ? v : def;
}

/* The record's labels (a seed's "labels" or "metadata") as a new object; {} when none. */
static json_t *lend_spec_labels(json_t *spec)
{
    json_t *labels = json_object_get(spec, "labels");

    return json_is_object(labels) ? json_deep_copy(labels) : json_object();
}

int64_t lend_spec_token_generation(const json_t *spec)
{
    json_int_t g = json_integer_value(json_object_get(spec, "token_generation"));

    return g > 0 ? (int64_t)g : 0;
}

/* see lend_internal.h */
int lend_operate_token_hash(void *lend, const char *id, char *hash)
{
    char token[4 + 65];
    int r = lend_operate_token(lend, id, 0, token);

    if (r == 0)
        token_sha256_hex(token, strlen(token), hash);
    return r;
}

json_t *lend_render_lease_spec(struct lb_lend *l, const struct lb_record *r, json_t *spec,
                               bool reused)
{
    char token[4 + 65] = "";
    const char *image = json_string_value(json_object_get(spec, "image"));
    const char *workdir = json_string_value(json_object_get(spec, "workdir"));
    json_t *lease;

    if (lend_operate_token(l, r->id, lend_spec_token_generation(spec), token) < 0)
        token[0] = '\0';
    lease = json_pack("{s:s?,s:s?,s:s,s:s,s:s?,s:s,s:o,s:o,s:b,s:{s:s,s:s,s:s,s:s,s:s}}",
                      "resources_session_id", r->rsid, "task_id", r->task_id, "sandbox_id", r->id,
                      "state", store_state_name(r->state), "provider", r->provider, "image",
                      image ? image : "host" /* older records: host */, "created_at",
                      clock_json_rfc3339(r->created_at), "expires_at",
                      clock_json_rfc3339(r->expires_at), "reused", reused, "access", "sandbox_id",
                      r->id, "scope", "operate", "token", token, "base_url", l->cfg.public_url,
                      "workdir", workdir ? workdir : l->cfg.workdir);
    if (lease) {
        json_object_set_new(lease, "metadata", lend_spec_labels(spec));
        json_object_set_new(lease, "last_activity_at",
                            r->state == LB_STATE_LENT ? clock_json_rfc3339(lend_last_activity(l, r))
                                                      : json_null());
    }
    return lease;
}

json_t *lend_render_lease(struct lb_lend *l, const struct lb_record *r, bool reused)
{
    json_t *spec = r->spec_json ? json_loads(r->spec_json, 0, NULL) : NULL;
    json_t *lease = lend_render_lease_spec(l, r, spec, reused);

    json_decref(spec);
    return lease;
}

static const char *record_status_guess(enum lb_record_state s)
{
    switch (s) {
    case LB_STATE_STARTING:
        return "starting";
    case LB_STATE_LENT:
    case LB_STATE_STOPPING:
    case LB_STATE_WARM:
        return "running";
    case LB_STATE_STOPPED:
        return "stopped";
    default:
        return "error";
    }
}

/* The record's image reference: "image" (the name the seed resolved to) and "image_digest"
 * (the stored tree it named then; null for host and trees placed by hand). */
static void lend_render_image_ref(json_t *j, const struct lb_record *r)
{
    json_t *spec = NULL;
    const char *image = lend_spec_string(r, "image", "host", &spec);
    const char *digest = json_string_value(json_object_get(spec, "image_digest"));

    json_object_set_new(j, "image", json_string(image));
    json_object_set_new(j, "image_digest", digest ? json_string(digest) : json_null());
    json_decref(spec);
}

json_t *lend_render_sandbox(const struct lb_record *r, const char *status, bool details)
{
    json_t *j = json_pack("{s:s,s:s,s:s,s:s?,s:o,s:o,s:s?}", "sandbox_id", r->id, "status",
                          status ? status : record_status_guess(r->state), "state",
                          store_state_name(r->state), "provider", r->provider, "created_at",
                          clock_json_rfc3339(r->created_at), "expires_at",
                          clock_json_rfc3339(r->expires_at), "resources_session_id", r->rsid);

    if (j) {
        json_t *spec = r->spec_json ? json_loads(r->spec_json, 0, NULL) : NULL;
        const char *wd = json_string_value(json_object_get(spec, "workdir"));

        json_object_set_new(j, "metadata", lend_spec_labels(spec));
        json_object_set_new(j, "workdir", wd ? json_string(wd) : json_null());
        json_decref(spec);
    }
    if (j && details) {
        json_object_set_new(j, "task_id", r->task_id ? json_string(r->task_id) : json_null());
        json_object_set_new(j, "stop_reason",
                            r->stop_reason ? json_string(r->stop_reason) : json_null());
        json_object_set_new(j, "stop_attempts", json_integer(r->stop_attempts));
        json_object_set_new(j, "last_error",
                            r->last_error ? json_string(r->last_error) : json_null());
        json_object_set_new(j, "next_attempt_at", clock_json_rfc3339(r->next_attempt_at));
        json_object_set_new(j, "updated_at", clock_json_rfc3339(r->updated_at));
        lend_render_image_ref(j, r);
    }
    return j;
}

/* see lend_internal.h */
bool lend_record_resetting(const struct lb_record *r)
{
    json_t *spec = r->spec_json ? json_loads(r->spec_json, 0, NULL) : NULL;
    bool resetting = json_is_true(json_object_get(spec, "resetting"));

    json_decref(spec);
    return resetting;
}
