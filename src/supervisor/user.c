/*
 * user.c - users and groups of a sandbox's own /etc/passwd and /etc/group (see user.h).
 */
#include "supervisor/user.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/openat2.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FILE_MAX (4 * 1024 * 1024)

static void say(char *why, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t len, const char *fmt, ...)
{
    va_list ap;

    if (!why || !len)
        return;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
}

/* All of rootfd/path (a regular file, opened inside the root) into *out (NUL-terminated,
 * the caller frees). A missing file is an empty one. 0 or -errno. */
static int read_in_root(int rootfd, const char *path, char **out)
{
    struct open_how how = {.flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY,
                           .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
    struct stat st;
    size_t len = 0;
    char *buf;
    int fd, r = 0;

    *out = NULL;
    fd = (int)syscall(SYS_openat2, rootfd, path, &how, sizeof(how));
    if (fd < 0 && (errno == ENOENT || errno == ENOTDIR)) {
        *out = strdup("");
        return *out ? 0 : -ENOMEM;
    }
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > FILE_MAX) {
        r = S_ISREG(st.st_mode) ? -EFBIG : -EINVAL;
        goto out;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        r = -ENOMEM;
        goto out;
    }
    while (len < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + len, (size_t)st.st_size - len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = -errno;
            free(buf);
            goto out;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    *out = buf;
out:
    close(fd);
    return r;
}

/* Split line (modified in place) at ':' into at most max fields; how many. */
static size_t split(char *line, char **f, size_t max)
{
    size_t n = 0;

    f[n++] = line;
    for (char *p = line; *p && n < max; p++) {
        if (*p == ':') {
            *p = '\0';
            f[n++] = p + 1;
        }
    }
    return n;
}

/* A decimal id 0..SUP_USER_ID_MAX: 0, -EINVAL not a number, -ERANGE too large. */
static int parse_id(const char *s, uint32_t *out)
{
    unsigned long v = 0;

    if (!*s)
        return -EINVAL;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return -EINVAL;
        v = v * 10 + (unsigned long)(*p - '0');
        if (v > 0xffffffffUL)
            return -ERANGE;
    }
    if (v > SUP_USER_ID_MAX)
        return -ERANGE;
    *out = (uint32_t)v;
    return 0;
}

/* Next line of *cursor (modified in place), or NULL at the end. */
static char *next_line(char **cursor)
{
    char *line = *cursor, *nl;

    if (!line || !*line)
        return NULL;
    nl = strchr(line, '\n');
    if (nl) {
        *nl = '\0';
        *cursor = nl + 1;
    } else {
        *cursor = line + strlen(line);
    }
    return line;
}

static bool member_of(const char *members, const char *name)
{
    size_t n = strlen(name);

    while (*members) {
        size_t len = strcspn(members, ",");

        if (len == n && strncmp(members, name, n) == 0)
            return true;
        members += len;
        if (*members == ',')
            members++;
    }
    return false;
}

static void add_group(struct sup_user *u, uint32_t gid)
{
    for (size_t i = 0; i < u->ngroups; i++)
        if (u->groups[i] == gid)
            return;
    if (u->ngroups < SUP_USER_GROUPS_MAX)
        u->groups[u->ngroups++] = gid;
}

int sup_user_resolve(int rootfd, const char *spec, struct sup_user *u, char *why, size_t why_len)
{
    char user[256], name[256] = "", *group = NULL, *passwd = NULL, *groups = NULL, *cur, *line;
    bool found = false, numeric;
    uint32_t id = 0;
    int r;

    memset(u, 0, sizeof(*u));
    if (!spec || !*spec)
        spec = "root";
    if (strlen(spec) >= sizeof(user)) {
        say(why, why_len, "user name is too long");
        return -EINVAL;
    }
    snprintf(user, sizeof(user), "%s", spec);
    group = strchr(user, ':');
    if (group)
        *group++ = '\0';
    if (!*user || (group && !*group) || strchr(user, '\n') || (group && strchr(group, ':'))) {
        say(why, why_len, "invalid user \"%s\"", spec);
        return -EINVAL;
    }
    r = parse_id(user, &id);
    if (r == -ERANGE) {
        say(why, why_len, "user %s is outside the sandbox's ids (0..65535)", user);
        return r;
    }
    numeric = r == 0;

    r = read_in_root(rootfd, "etc/passwd", &passwd);
    if (r < 0) {
        say(why, why_len, "cannot read the sandbox's /etc/passwd: %s", strerror(-r));
        goto out;
    }
    cur = passwd;
    while ((line = next_line(&cur))) {
        char *f[7];
        uint32_t uid, gid;

        if (split(line, f, 7) < 7 || parse_id(f[2], &uid) < 0 || parse_id(f[3], &gid) < 0)
            continue;
        if (numeric ? uid != id : strcmp(f[0], user) != 0)
            continue;
        found = true;
        u->uid = uid;
        u->gid = gid;
        snprintf(name, sizeof(name), "%s", f[0]);
        snprintf(u->home, sizeof(u->home), "%s", *f[5] ? f[5] : "/");
        break;
    }
    if (!found && strcmp(user, "root") == 0) { /* an image without a passwd entry for root */
        numeric = true;
        id = 0;
    }
    if (!found && !numeric) {
        say(why, why_len, "unknown user \"%s\"", user);
        r = -ENOENT;
        goto out;
    }
    if (!found) {
        u->uid = u->gid = id;
        snprintf(u->home, sizeof(u->home), "%s", id == 0 ? "/root" : "/");
    }

    r = read_in_root(rootfd, "etc/group", &groups);
    if (r < 0) {
        say(why, why_len, "cannot read the sandbox's /etc/group: %s", strerror(-r));
        goto out;
    }
    if (group) {
        bool gfound = false;

        r = parse_id(group, &id);
        if (r == -ERANGE) {
            say(why, why_len, "group %s is outside the sandbox's ids (0..65535)", group);
            goto out;
        }
        if (r == 0) {
            u->gid = id;
            gfound = true;
        }
        r = 0;
        for (cur = groups; !gfound && (line = next_line(&cur));) {
            char *f[4];

            if (split(line, f, 4) >= 3 && strcmp(f[0], group) == 0 && parse_id(f[2], &id) == 0) {
                u->gid = id;
                gfound = true;
            }
        }
        if (!gfound) {
            say(why, why_len, "unknown group \"%s\"", group);
            r = -ENOENT;
            goto out;
        }
        free(groups);
        groups = NULL;
        r = read_in_root(rootfd, "etc/group", &groups); /* the search above cut it up */
        if (r < 0)
            goto out;
    }
    add_group(u, u->gid);
    if (name[0]) {
        for (cur = groups; (line = next_line(&cur));) {
            char *f[4];

            if (split(line, f, 4) == 4 && parse_id(f[2], &id) == 0 && member_of(f[3], name))
                add_group(u, id);
        }
    }
    r = 0;
out:
    free(passwd);
    free(groups);
    return r;
}

/* Empty the bounding set (needs CAP_SETPCAP; without it nothing is dropped). */
static void drop_bounding(void)
{
    for (int cap = 0; cap <= 63; cap++)
        (void)syscall(SYS_prctl, PR_CAPBSET_DROP, cap, 0, 0, 0);
}

int sup_user_drop_caps(void)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3];

    drop_bounding();
    memset(none, 0, sizeof(none));
    return syscall(SYS_capset, &hdr, none) < 0 ? -errno : 0;
}

int sup_user_switch(const struct sup_user *u)
{
    gid_t g[SUP_USER_GROUPS_MAX];

    for (size_t i = 0; i < u->ngroups; i++)
        g[i] = (gid_t)u->groups[i];
    drop_bounding(); /* first: the uid change below takes CAP_SETPCAP away */
    /* raw syscalls: the caller is a forked child (glibc would try to reach other threads) */
    if (syscall(SYS_setgroups, u->ngroups, g) < 0 ||
        syscall(SYS_setresgid, u->gid, u->gid, u->gid) < 0 ||
        syscall(SYS_setresuid, u->uid, u->uid, u->uid) < 0)
        return -errno;
    return sup_user_drop_caps();
}
