/*
 * desc.c - where a sandbox of the local provider lives and what describes it: id validity, its
 * directory under <state_dir>/sandboxes, and its descriptor (parse, JSON form, atomic save,
 * load from the ref or from <dir>/descriptor.json). Loading a descriptor of a sandbox whose
 * directory exists marks its uid slot and network slot used (slots.c, net.c).
 */
#include "provider/local/local_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DESCRIPTOR_MAX 16384

/* ---- ids, dirs ------------------------------------------------------------------------ */

bool local_id_is_valid(const char *id)
{
    size_t i, n;

    if (!id)
        return false;
    n = strnlen(id, 129);
    if (n == 0 || n > 128 || id[0] == '.')
        return false;
    for (i = 0; i < n; i++) {
        char c = id[i];

        if (!(('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return false;
    }
    return true;
}

void local_sandbox_dir(const struct local_provider *lp, const char *id, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%s", lp->sandboxes_dir, id);
}

/* ---- descriptors ---------------------------------------------------------------------- */

void local_desc_release(struct local_desc *d)
{
    cgroup_release(&d->cg);
    local_net_release(&d->net);
}

static int local_desc_from_json(const json_t *j, const char *id, struct local_desc *d)
{
    json_int_t pid = 0, st = 0, uid = 0;
    const char *workdir = LOCAL_DEFAULT_WORKDIR, *data = NULL, *base, *image = NULL, *name = NULL;
    json_t *cg = NULL, *net = NULL;
    int r;

    memset(d, 0, sizeof(*d));
    if (!json_is_object(j) ||
        json_unpack((json_t *)j, "{s?I,s?I,s:I,s?s,s?o,s?s,s?o,s?s,s?s}", "pid", &pid, "start_time",
                    &st, "uid", &uid, "workdir", &workdir, "cgroup", &cg, "data", &data, "net",
                    &net, "image", &image, "name", &name) < 0)
        return -EINVAL;
    /* a handed-over sandbox's cgroup and data directory carry the id it was made under */
    if (name) {
        if (!local_id_is_valid(name) || strlen(name) >= sizeof(d->name))
            return -EINVAL;
        snprintf(d->name, sizeof(d->name), "%s", name);
        id = d->name;
    }
    if (image && (!provider_path_is_valid(image) || strlen(image) >= sizeof(d->image)))
        return -EINVAL;
    if (local_net_from_json(net, &d->net) < 0)
        return -EINVAL;
    if (pid < 0 || pid > INT_MAX || st < 0 || uid <= 0 || uid > UINT32_MAX ||
        !provider_path_is_valid(workdir) || strlen(workdir) >= sizeof(d->workdir))
        return -EINVAL;
    /* a data directory is removed at stop: only ever <some dir>/<this id> */
    if (data && (!provider_path_is_valid(data) || strlen(data) >= sizeof(d->data) ||
                 !(base = strrchr(data, '/')) || strcmp(base + 1, id) != 0))
        return -EINVAL;
    if (data)
        snprintf(d->data, sizeof(d->data), "%s", data);
    if (image)
        snprintf(d->image, sizeof(d->image), "%s", image);
    r = cgroup_from_json(cg, id, &d->cg);
    if (r < 0)
        return r;
    d->pid = (pid_t)pid;
    d->start_time = (uint64_t)st;
    d->uid = (uint32_t)uid;
    snprintf(d->workdir, sizeof(d->workdir), "%s", workdir);
    return 0;
}

json_t *local_desc_to_json(const struct local_desc *d, const char *dir)
{
    json_t *o, *cg = cgroup_to_json(&d->cg);

    if (!cg)
        return NULL;
    o = json_pack("{s:I,s:I,s:I,s:s,s:s,s:o}", "pid", (json_int_t)d->pid, "start_time",
                  (json_int_t)d->start_time, "uid", (json_int_t)d->uid, "dir", dir, "workdir",
                  d->workdir, "cgroup", cg);
    if (o && d->data[0] && json_object_set_new(o, "data", json_string(d->data)) < 0) {
        json_decref(o);
        return NULL;
    }
    if (o && d->image[0] && json_object_set_new(o, "image", json_string(d->image)) < 0) {
        json_decref(o);
        return NULL;
    }
    if (o && d->name[0] && json_object_set_new(o, "name", json_string(d->name)) < 0) {
        json_decref(o);
        return NULL;
    }
    if (o && d->net.mode != LOCAL_NET_NONE) {
        json_t *net = local_net_to_json(&d->net);

        if (!net || json_object_set_new(o, "net", net) < 0) {
            json_decref(o);
            return NULL;
        }
    }
    if (o && d->pid == 0) {
        /* not started (yet): no pid at all rather than a misleading 0 */
        json_object_del(o, "pid");
        json_object_del(o, "start_time");
    }
    return o;
}

int local_desc_save(const struct local_desc *d, const char *dir, struct lb_error *err)
{
    return local_desc_save_in(d, dir, dir, err);
}

int local_desc_save_in(const struct local_desc *d, const char *in, const char *dir,
                       struct lb_error *err)
{
    char path[4352], tmp[4352];
    json_t *j = local_desc_to_json(d, dir);
    char *text = NULL;
    size_t len, off = 0;
    int fd = -1, r = 0;

    if (!j)
        return lb_error_set(err, -ENOMEM, "out of memory");
    text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!text)
        return lb_error_set(err, -ENOMEM, "out of memory");
    len = strlen(text);
    snprintf(path, sizeof(path), "%s/" LOCAL_DESCRIPTOR_FILE, in);
    snprintf(tmp, sizeof(tmp), "%s/." LOCAL_DESCRIPTOR_FILE ".tmp", in);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot write '%s': %s", tmp, strerror(errno));
        goto out;
    }
    while (off < len) {
        ssize_t n = write(fd, text + off, len - off);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = lb_error_set(err, -EREMOTEIO, "cannot write '%s': %s", tmp, strerror(errno));
            goto out;
        }
        off += (size_t)n;
    }
    /* No fsync: the file must survive a crash of lendboxd (the page cache does that); a power
     * loss takes the sandboxes with it. */
    if (rename(tmp, path) < 0)
        r = lb_error_set(err, -EREMOTEIO, "cannot save '%s': %s", path, strerror(errno));
out:
    if (fd >= 0)
        close(fd);
    if (r < 0)
        (void)unlink(tmp);
    free(text);
    return r;
}

/* Parse <dir>/descriptor.json. -ENOENT when it does not exist. */
int local_desc_read_file(const char *dir, const char *id, struct local_desc *d, json_t **raw)
{
    char path[4352], buf[DESCRIPTOR_MAX];
    size_t len = 0;
    json_t *j;
    int fd, r;

    snprintf(path, sizeof(path), "%s/" LOCAL_DESCRIPTOR_FILE, dir);
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? -ENOENT : -EINVAL;
    for (;;) {
        ssize_t n = read(fd, buf + len, sizeof(buf) - len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len == sizeof(buf))
            break;
    }
    close(fd);
    j = len < sizeof(buf) ? json_loadb(buf, len, JSON_REJECT_DUPLICATES, NULL) : NULL;
    if (!j)
        return -EINVAL;
    r = local_desc_from_json(j, id, d);
    if (r == 0 && raw)
        *raw = j;
    else
        json_decref(j);
    return r;
}

int local_desc_load(struct local_provider *lp, const struct lb_sandbox_ref *ref,
                    struct local_desc *d, struct lb_error *err)
{
    char dir[4352];
    struct stat st;
    int r;

    memset(d, 0, sizeof(*d));
    if (!ref || !local_id_is_valid(ref->id))
        return lb_error_set(err, -EINVAL, "invalid sandbox id");
    if (ref->descriptor) {
        r = local_desc_from_json(ref->descriptor, ref->id, d);
        if (r < 0)
            return lb_error_set(err, r == -ENOMEM ? r : -EINVAL,
                                "sandbox '%s' has a malformed descriptor", ref->id);
        /* a stale descriptor of a removed sandbox must not claim a uid reused since */
        local_sandbox_dir(lp, ref->id, dir, sizeof(dir));
        if (lstat(dir, &st) == 0) {
            local_uid_mark(lp, d->uid);
            local_net_mark_slot(lp, &d->net);
        }
        return 0;
    }
    local_sandbox_dir(lp, ref->id, dir, sizeof(dir));
    if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
        return lb_error_set(err, -ENOENT, "no such sandbox '%s'", ref->id);
    r = local_desc_read_file(dir, ref->id, d, NULL);
    if (r < 0) {
        /* The directory exists but create never got as far as a descriptor: nothing ran. */
        memset(d, 0, sizeof(*d));
        snprintf(d->workdir, sizeof(d->workdir), "%s", LOCAL_DEFAULT_WORKDIR);
        return 0;
    }
    local_uid_mark(lp, d->uid);
    local_net_mark_slot(lp, &d->net);
    return 0;
}

int local_desc_load_running(struct local_provider *lp, const struct lb_sandbox_ref *ref,
                            struct local_desc *d, struct lb_error *err)
{
    int r = local_desc_load(lp, ref, d, err);

    if (r < 0 || local_desc_alive(d))
        return r;
    r = local_not_running(lp, ref->id, d, err);
    local_desc_release(d);
    return r;
}

int local_not_running(struct local_provider *lp, const char *id, const struct local_desc *d,
                      struct lb_error *err)
{
    char dir[4352];
    struct stat st;

    local_sandbox_dir(lp, id, dir, sizeof(dir));
    if (d->pid <= 0 || lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
        return lb_error_set(err, -ENOENT, "sandbox '%s' is not running", id);
    return lb_error_set(err, -LB_E_LOST,
                        "sandbox '%s' was lost: its init (pid %d) is gone, and no stop of lendbox "
                        "ended it",
                        id, (int)d->pid);
}
