/*
 * docker_snapshot.c - the docker provider's snapshot hooks (engine.h, "snapshots"): the
 * workdir's archive (GET /containers/{name}/archive), the container's root as an image
 * (POST /commit into the repository localhost/lendbox-snapshot-<instance> under a random tag;
 * the image carries the container's labels, this daemon's instance label among them), the
 * archive put back into a container of a seed (PUT .../archive), and the listing and removal
 * of those images.
 */
#include "provider/docker/docker_internal.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define SNAPSHOT_TIMEOUT_MS (30 * 60 * 1000)

/* "localhost/lendbox-snapshot-<instance, lower case>" into buf. */
static void snapshot_repo(const struct lb_docker *d, char *buf, size_t size)
{
    size_t n;

    snprintf(buf, size, "localhost/lendbox-snapshot-%s", d->eng.instance);
    for (n = 0; buf[n]; n++)
        buf[n] = (char)tolower((unsigned char)buf[n]);
}

/* The engine's answer as an error: 404 -ENOENT, 409 -EBUSY, else -EREMOTEIO. */
static int answer_error(const struct lb_httpc_response *resp, const char *what,
                        struct lb_error *err)
{
    char m[300];

    httpc_json_message(resp, "message", m, sizeof(m));
    return lb_error_set(err,
                        resp->status == 404   ? -ENOENT
                        : resp->status == 409 ? -EBUSY
                                              : -EREMOTEIO,
                        "docker engine: %s failed (HTTP %ld): %s", what, resp->status, m);
}

/* The most a workdir's archive may write into the image store (fd: the archive's file): what
 * its file system has free less a margin for the store's other writers (a tenth of its size, at
 * least 256 MiB); 0 when there is less. The archive holds a sparse file at its full length, so
 * without this bound an agent's files could fill the host's disk. */
static uint64_t archive_room(int fd)
{
    const uint64_t min_margin = 256ull << 20;
    struct statvfs sv;
    uint64_t total, avail, margin;

    if (fstatvfs(fd, &sv) < 0)
        return 0;
    total = (uint64_t)sv.f_blocks * sv.f_frsize;
    avail = (uint64_t)sv.f_bavail * sv.f_frsize;
    margin = total / 10 > min_margin ? total / 10 : min_margin;
    return avail > margin ? avail - margin : 0;
}

int docker_workdir_archive(struct lb_engine *e, const struct lb_sandbox_ref *ref, int fd,
                           char *workdir, size_t size, struct lb_error *err)
{
    struct lb_docker *d = (struct lb_docker *)e;
    struct lb_httpc_response resp = {0};
    char name[256], path[1024];
    const char *wd;
    json_t *j = NULL;
    uint64_t room;
    int r;

    docker_name(d, ref->id, name, sizeof(name));
    snprintf(path, sizeof(path), "/containers/%s/json", name);
    r = engine_get_json(e, path, "inspect", 30000, &j, err);
    if (r == -ENOENT)
        return lb_error_set(err, -ENOENT, "no such sandbox");
    if (r < 0)
        return r;
    wd = json_string_value(json_object_get(json_object_get(j, "Config"), "WorkingDir"));
    if (!wd || wd[0] != '/' || strlen(wd) >= size) {
        r = lb_error_set(err, -EREMOTEIO, "docker engine: container %s has no workdir", name);
        goto out;
    }
    snprintf(workdir, size, "%s", wd);
    room = archive_room(fd);
    if (room == 0) {
        r = lb_error_set(err, -ENOSPC, "the image store has no room for the workdir's archive");
        goto out;
    }
    r = docker_get_archive(d, ref->id, wd, fd, room, &resp, err);
    if (r < 0)
        r = r == -EFBIG ? lb_error_set(err, -ENOSPC,
                                       "the workdir's archive is larger than the image store's "
                                       "room (%llu MiB)",
                                       (unsigned long long)(room >> 20))
                        : docker_transport_error(r, err);
    else if (resp.status != 200)
        r = answer_error(&resp, "workdir archive", err);
out:
    json_decref(j);
    httpc_response_release(&resp);
    return r;
}

int docker_commit(struct lb_engine *e, const struct lb_sandbox_ref *ref, char *image, size_t size,
                  struct lb_error *err)
{
    struct lb_docker *d = (struct lb_docker *)e;
    struct lb_httpc_response resp = {0};
    char name[256], repo[128], path[1024];
    unsigned char rnd[8];
    const char *id;
    json_t *body = json_object(), *j = NULL;
    int r;

    if (!body)
        return lb_error_set(err, -ENOMEM, "out of memory");
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) {
        r = lb_error_set(err, -EIO, "cannot draw a tag: %s", strerror(errno));
        goto out;
    }
    docker_name(d, ref->id, name, sizeof(name));
    snapshot_repo(d, repo, sizeof(repo));
    /* pause=false: the engine base froze the container already */
    snprintf(path, sizeof(path),
             "/commit?container=%s&repo=%s&tag=%02x%02x%02x%02x%02x%02x%02x%02x&pause=false", name,
             repo, rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    r = docker_call(d, "POST", path, body, SNAPSHOT_TIMEOUT_MS, &resp, err);
    if (r < 0)
        goto out;
    if (resp.status != 201 && resp.status != 200) {
        r = answer_error(&resp, "commit", err);
        goto out;
    }
    j = httpc_response_json(&resp);
    id = json_string_value(json_object_get(j, "Id"));
    if (!id || !*id || strlen(id) + 8 >= size) {
        r = lb_error_set(err, -EREMOTEIO, "docker engine: commit answered no image id");
        goto out;
    }
    snprintf(image, size, "%s%s", strncmp(id, "sha256:", 7) == 0 ? "" : "sha256:", id);
out:
    json_decref(j);
    json_decref(body);
    httpc_response_release(&resp);
    return r;
}

int docker_put_tar(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *dir, int fd,
                   struct lb_error *err)
{
    struct lb_httpc_response resp = {0};
    struct stat st;
    int r;

    if (fstat(fd, &st) < 0 || lseek(fd, 0, SEEK_SET) < 0)
        return lb_error_set(err, -EIO, "cannot read the workdir's archive: %s", strerror(errno));
    r = docker_put_archive((struct lb_docker *)e, ref->id, dir, fd, (uint64_t)st.st_size, &resp,
                           err);
    if (r == 0 && resp.status != 200 && resp.status != 204)
        r = answer_error(&resp, "workdir restore", err);
    httpc_response_release(&resp);
    return r;
}

int docker_snapshot_images(struct lb_engine *e, json_t **out, struct lb_error *err)
{
    char repo[128];
    json_t *j = NULL, *item, *tag, *arr;
    size_t i, k, n;
    int r;

    *out = NULL;
    snapshot_repo((struct lb_docker *)e, repo, sizeof(repo));
    n = strlen(repo);
    r = docker_list_ours((struct lb_docker *)e, "/images/json?", "image list", &j, err);
    if (r < 0)
        return r;
    arr = json_array();
    if (!arr) {
        json_decref(j);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    json_array_foreach(j, i, item) {
        const char *id = json_string_value(json_object_get(item, "Id"));

        /* ours: one of its tags is in this daemon's snapshot repository */
        json_array_foreach(json_object_get(item, "RepoTags"), k, tag) {
            const char *t = json_string_value(tag);

            if (id && t && strncmp(t, repo, n) == 0 && t[n] == ':') {
                json_array_append_new(arr, json_string(id));
                break;
            }
        }
    }
    json_decref(j);
    *out = arr;
    return 0;
}

int docker_image_remove(struct lb_engine *e, const char *image, struct lb_error *err)
{
    struct lb_httpc_response resp = {0};
    char path[512];
    int r;

    snprintf(path, sizeof(path), "/images/%s", image);
    r = docker_call((struct lb_docker *)e, "DELETE", path, NULL, 120000, &resp, err);
    if (r == 0 && resp.status != 200)
        r = answer_error(&resp, "image remove", err);
    httpc_response_release(&resp);
    return r;
}
