/*
 * image_user.c - an image's user ("name", "uid", "uid:gid", "name:group") resolved to numeric ids
 * from the image's own /etc/passwd and /etc/group, read confined to its root (see image.h).
 */
#include "image/image.h"
#include "image/image_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Read up to max bytes of root/rel, resolved inside root (symlinks cannot climb out). The
 * caller frees *out (NUL-terminated). */
static int read_in_root(const char *root, const char *rel, size_t max, char **out)
{
    struct open_how how = {.flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW,
                           .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
    char *buf;
    ssize_t n;
    size_t len = 0;
    int dfd, fd, r = 0;

    *out = NULL;
    dfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    how.flags = O_RDONLY | O_CLOEXEC;
    fd = (int)syscall(SYS_openat2, dfd, rel, &how, sizeof(how));
    r = fd < 0 ? -errno : 0;
    close(dfd);
    if (r < 0)
        return r;
    buf = malloc(max + 1);
    if (!buf) {
        close(fd);
        return -ENOMEM;
    }
    while (len < max && (n = read(fd, buf + len, max - len)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = -errno;
            break;
        }
        len += (size_t)n;
    }
    close(fd);
    if (r < 0) {
        free(buf);
        return r;
    }
    buf[len] = '\0';
    *out = buf;
    return 0;
}

/* The id of name in an /etc/passwd or /etc/group text (field 3), or -1. */
static long lookup_id(const char *db, const char *name)
{
    size_t nl = strlen(name);

    for (const char *line = db; line && *line;
         line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        const char *f;

        if (strncmp(line, name, nl) != 0 || line[nl] != ':')
            continue;
        f = strchr(line + nl + 1, ':'); /* past the password field */
        if (!f)
            return -1;
        return strtol(f + 1, NULL, 10);
    }
    return -1;
}

/* part as a number, or looked up in the image's file (etc/passwd or etc/group); -1: unknown */
static long resolve_id(const char *rootfs, const char *file, const char *part)
{
    char *end, *db = NULL;
    long id;

    if (*part >= '0' && *part <= '9') {
        id = strtol(part, &end, 10);
        return *end ? -1 : id;
    }
    if (read_in_root(rootfs, file, 1 << 20, &db) < 0)
        return -1;
    id = lookup_id(db, part);
    free(db);
    return id;
}

int image_resolve_user(const char *images_dir, const char *name, char **user_out,
                       struct lb_error *err)
{
    char hex[65], rootfs[IMAGE_PATH_MAX + 128], spec[256];
    const char *user;
    char *group;
    json_t *j;
    long uid, gid = 0;
    int r;

    *user_out = NULL;
    r = image_load_entry(images_dir, name, hex, &j, err);
    if (r < 0)
        return r;
    /* a snapshot's users are its base tree's (a layer may lack /etc/passwd) */
    snprintf(rootfs, sizeof(rootfs), "%s/" STORE "/sha256/%s/rootfs", images_dir,
             json_is_string(json_object_get(j, "root"))
                 ? json_string_value(json_object_get(j, "root"))
                 : hex);
    user = json_string_value(json_object_get(j, "user"));
    if (!user || !*user) {
        json_decref(j);
        return 0; /* none: root, as for every image */
    }
    snprintf(spec, sizeof(spec), "%s", user);
    json_decref(j);
    group = strchr(spec, ':');
    if (group)
        *group++ = '\0';
    uid = resolve_id(rootfs, "etc/passwd", spec);
    if (uid < 0)
        return lb_error_set(err, -EOPNOTSUPP,
                            "image '%s' runs as user '%s', which its /etc/passwd does not name",
                            name, spec);
    if (group && *group) {
        gid = resolve_id(rootfs, "etc/group", group);
        if (gid < 0)
            return lb_error_set(err, -EOPNOTSUPP,
                                "image '%s' runs as group '%s', which its /etc/group does not "
                                "name",
                                name, group);
    }
    if (uid > 65535 || gid > 65535)
        return lb_error_set(err, -EOPNOTSUPP,
                            "image '%s' runs as user '%s' (uid %ld, gid %ld), which is not mapped "
                            "in a sandbox: its ids are 0..65535",
                            name, user ? spec : "", uid, gid);
    {
        char ids[64];

        if (group && *group)
            snprintf(ids, sizeof(ids), "%ld:%ld", uid, gid);
        else /* the user's own primary group and groups, from the sandbox's files */
            snprintf(ids, sizeof(ids), "%ld", uid);
        *user_out = strdup(ids);
    }
    return *user_out ? 0 : lb_error_set(err, -ENOMEM, "out of memory");
}
