/*
 * lxd_image.c - images into LXD: provider_lxd_image_publish (lxd.h).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/evp.h>

#include "image/image.h"
#include "provider/lxd/lxd_internal.h"
#include "util/clock.h"

/* Point alias at fingerprint: create it, or move it when it exists. */
static int set_alias(struct lb_lxd *l, const char *alias, const char *fingerprint,
                     struct lb_error *err)
{
    struct lb_httpc_response resp = {0};
    char path[256], m[300];
    json_t *body = json_pack("{s:s,s:s,s:s}", "name", alias, "target", fingerprint, "description",
                             "lendbox image");
    char *esc = NULL;
    int r;

    if (!body)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = lxd_call(l, NULL, "POST", "/1.0/images/aliases", body, 0, &resp, err);
    if (r == 0 && resp.status == 409) {
        /* it exists: move it (PUT replaces target and description) */
        httpc_response_release(&resp);
        json_object_del(body, "name");
        esc = curl_easy_escape(NULL, alias, 0);
        if (!esc) {
            r = lb_error_set(err, -ENOMEM, "out of memory");
            goto out;
        }
        snprintf(path, sizeof(path), "/1.0/images/aliases/%s", esc);
        r = lxd_call(l, NULL, "PUT", path, body, 0, &resp, err);
    }
    if (r == 0 && resp.status != 200 && resp.status != 201)
        r = lb_error_set(err, -EREMOTEIO, "LXD: setting the alias '%s' failed (HTTP %ld): %s",
                         alias, resp.status, httpc_json_message(&resp, "error", m, sizeof(m)));
out:
    curl_free(esc);
    httpc_response_release(&resp);
    json_decref(body);
    return r;
}

/* LXD's fingerprint of a unified tarball: the SHA-256 of the file, as 64 hex digits. */
static int tarball_fingerprint(int fd, char hex[65], struct lb_error *err)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned char buf[65536], md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    off_t off = 0;
    int r = 0;

    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        r = lb_error_set(err, -ENOMEM, "cannot start a SHA-256");
        goto out;
    }
    for (;;) {
        ssize_t n = pread(fd, buf, sizeof(buf), off);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = lb_error_set(err, -EIO, "cannot read the tarball: %s", strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        if (EVP_DigestUpdate(ctx, buf, (size_t)n) != 1) {
            r = lb_error_set(err, -EIO, "SHA-256 failed");
            goto out;
        }
        off += n;
    }
    if (EVP_DigestFinal_ex(ctx, md, &md_len) != 1 || md_len != 32) {
        r = lb_error_set(err, -EIO, "SHA-256 failed");
        goto out;
    }
    for (unsigned i = 0; i < md_len; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
out:
    EVP_MD_CTX_free(ctx);
    return r;
}

int provider_lxd_image_publish(struct lb_provider *p, int fd, uint64_t len, const char *alias,
                               int64_t timeout_ms, char *fingerprint, size_t size,
                               struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)p;
    static const char *const headers[] = {"X-LXD-public: false", NULL};
    struct lb_httpc_request req = {.method = "POST",
                                   .path = "/1.0/images",
                                   .content_type = "application/octet-stream",
                                   .headers = headers,
                                   .body_fd = fd,
                                   .body_fd_len = len,
                                   .timeout_ms = timeout_ms,
                                   .max_body_bytes = 65536};
    struct lb_httpc_response resp = {0};
    json_t *j = NULL, *md = NULL;
    const char *op, *fp;
    char m[300], hex[65], path[128];
    int64_t t0 = clock_mono_ms();
    int r;

    if (!p || strcmp(p->ops->name, "lxd") != 0)
        return lb_error_set(err, -EINVAL, "not an lxd provider");
    if (size < sizeof(hex))
        return lb_error_set(err, -EINVAL, "no room for a fingerprint");
    if (!image_name_is_valid(alias))
        return lb_error_set(err, -EINVAL, "'%s' is not a valid image name", alias ? alias : "");
    if (fd <= 0 || lseek(fd, 0, SEEK_SET) < 0)
        return lb_error_set(err, -EINVAL, "the tarball cannot be read from its start");
    r = tarball_fingerprint(fd, hex, err);
    if (r < 0)
        goto out;
    /* the same tarball again (LXD refuses a second upload of a fingerprint): alias only */
    snprintf(path, sizeof(path), "/1.0/images/%s", hex);
    r = lxd_call(l, NULL, "GET", path, NULL, 0, &resp, err);
    if (r < 0)
        goto out;
    if (resp.status == 200) {
        snprintf(fingerprint, size, "%s", hex);
        r = set_alias(l, alias, hex, err);
        goto out;
    }
    httpc_response_release(&resp);
    r = lxd_do(l, NULL, &req, &resp, err);
    if (r < 0)
        goto out;
    if (resp.status != 202 && resp.status != 200) {
        r = lb_error_set(err, -EREMOTEIO, "LXD: the image upload failed (HTTP %ld): %s",
                         resp.status, httpc_json_message(&resp, "error", m, sizeof(m)));
        goto out;
    }
    j = json_loadb(resp.body.data, resp.body.len, 0, NULL);
    op = json_string_value(json_object_get(j, "operation"));
    if (!op || !*op) {
        r = lb_error_set(err, -EREMOTEIO, "LXD: the image upload answered no operation");
        goto out;
    }
    {
        int64_t left = timeout_ms - (clock_mono_ms() - t0);

        r = lxd_wait_operation(l, NULL, op, left > 1000 ? left : 1000, &md, err);
    }
    if (r < 0)
        goto out;
    fp = json_string_value(json_object_get(json_object_get(md, "metadata"), "fingerprint"));
    if (!fp || strlen(fp) + 1 > size || size < sizeof(hex)) {
        r = lb_error_set(err, -EREMOTEIO, "LXD: the image upload gave no fingerprint");
        goto out;
    }
    snprintf(fingerprint, size, "%s", fp);
    r = set_alias(l, alias, fp, err);
out:
    json_decref(md);
    json_decref(j);
    httpc_response_release(&resp);
    return r;
}
