/*
 * docker_api.c - the Docker Engine API transport, the base of the docker provider's files:
 * requests with a buffered answer (docker_call), transport failures as this provider's error,
 * and the names a sandbox has on the engine and the host (its container, its pass dir). It
 * calls nothing above it (docker.c, docker_exec.c, docker_files.c, docker_pass.c).
 */
#include "provider/docker/docker_internal.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>

#define SMALL_BODY_BYTES (4 * 1024 * 1024)

void docker_pass_dir(const struct lb_docker *d, const char *id, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%s", d->pass_dir, id);
}

void docker_name(const struct lb_docker *d, const char *id, char *buf, size_t size)
{
    snprintf(buf, size, "lendbox-%s-%s", d->eng.instance, id);
}

int docker_call(struct lb_docker *d, const char *method, const char *path, const json_t *body,
                int64_t timeout_ms, struct lb_httpc_response *resp, struct lb_error *err)
{
    struct lb_httpc_request req = {.method = method,
                                   .path = path,
                                   .timeout_ms = timeout_ms,
                                   .max_body_bytes = SMALL_BODY_BYTES};
    int r = httpc_call_json(d->eng.http, &req, body, resp, err);

    return r < 0 ? docker_transport_error(r, err) : 0;
}

int docker_transport_error(int r, struct lb_error *err)
{
    if (r == -ETIMEDOUT || r == -ECANCELED || r == -EFBIG)
        return r;
    /* the transport's own message stays; its errno (-EIO, -ECONNREFUSED...) becomes the
     * provider's "the backend failed" (provider.h: 502) */
    return lb_error_recode(err, -EREMOTEIO, "the docker engine cannot be reached");
}

int docker_list_ours(struct lb_docker *d, const char *path_prefix, const char *what,
                     json_t **items_out, struct lb_error *err)
{
    char filter[256], path[1024], *enc;
    json_t *j = NULL;
    int r;

    snprintf(filter, sizeof(filter), "{\"label\":[\"%s=%s\"]}", DOCKER_LABEL_INSTANCE,
             d->eng.instance);
    enc = curl_easy_escape(NULL, filter, 0);
    if (!enc)
        return lb_error_set(err, -ENOMEM, "out of memory");
    snprintf(path, sizeof(path), "%sfilters=%s", path_prefix, enc);
    curl_free(enc);
    r = engine_get_json(&d->eng, path, what, 60000, &j, err);
    if (r == 0 && !json_is_array(j))
        r = lb_error_set(err, -EREMOTEIO, "docker engine: unreadable %s", what);
    if (r == 0)
        *items_out = json_incref(j);
    json_decref(j);
    return r;
}
