/* cgroup.c - see cgroup.h. */
#include "provider/local/cgroup.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"

#ifndef CGROUP_MOUNT /* overridable to exercise v2 code on a hybrid host */
#define CGROUP_MOUNT "/sys/fs/cgroup"
#endif
#define CPU_PERIOD_US 100000
#define POLL_STEP_MS 10

static const char *const v1_controllers[] = {"memory", "pids", "cpu", "freezer"};
/* v1/hybrid hierarchies without controllers that systemd tracks units' processes by. */
static const struct {
    const char *name;
    long magic;
} v1_tracking[] = {{"systemd", CGROUP_SUPER_MAGIC}, {"unified", CGROUP2_SUPER_MAGIC}};

static bool fs_is(const char *path, long magic)
{
    struct statfs st;

    return statfs(path, &st) == 0 && (long)st.f_type == magic;
}

static int read_small(const char *dir, const char *name, char *buf, size_t size)
{
    char path[4352];
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    n = read(fd, buf, size - 1);
    if (n < 0) {
        n = -errno;
        close(fd);
        return (int)n;
    }
    close(fd);
    buf[n] = '\0';
    return 0;
}

static int write_small(const char *dir, const char *name, const char *value)
{
    char path[4352];
    size_t len = strlen(value);
    ssize_t n;
    int fd, r = 0;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    n = write(fd, value, len);
    if (n < 0)
        r = -errno;
    else if ((size_t)n != len)
        r = -EIO;
    close(fd);
    return r;
}

static bool file_exists(const char *dir, const char *name)
{
    char path[4352];

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

/* mount + "/" + parent with single slashes and no trailing one. */
static char *join_base(const char *mount, const char *parent)
{
    char tmp[4352], *out;
    size_t i, j = 0;

    snprintf(tmp, sizeof(tmp), "%s/%s", mount, parent);
    out = malloc(strlen(tmp) + 1);
    if (!out)
        return NULL;
    for (i = 0; tmp[i]; i++) {
        if (tmp[i] == '/' && j > 0 && out[j - 1] == '/')
            continue;
        out[j++] = tmp[i];
    }
    while (j > 1 && out[j - 1] == '/')
        j--;
    out[j] = '\0';
    return out;
}

static bool parent_is_valid(const char *parent)
{
    const char *p;

    if (!*parent || strlen(parent) > 256)
        return false;
    for (p = parent; *p; p++) {
        if (!(('a' <= *p && *p <= 'z') || ('A' <= *p && *p <= 'Z') || ('0' <= *p && *p <= '9') ||
              *p == '-' || *p == '_' || *p == '.' || *p == '/'))
            return false;
    }
    return strstr(parent, "..") == NULL;
}

static int mkdir_p(const char *path);

/* Can sandbox cgroups be made under base in the hierarchy mounted at mount? Makes base. A
 * read-only mount (nspawn mounts v1 controllers so in containers) or a base that cannot be
 * made is logged and refused: using it would only fail seeds, and stops on dirs that can
 * never be removed. */
static bool hierarchy_usable(const char *mount, const char *base, const char *ctrl)
{
    struct statvfs sv;
    int r;

    if (statvfs(mount, &sv) == 0 && (sv.f_flag & ST_RDONLY)) {
        log_warn("cgroup hierarchy %s (%s) is mounted read-only: not used, so sandboxes get no "
                 "%s cgroup",
                 mount, ctrl, ctrl);
        return false;
    }
    r = mkdir_p(base);
    if (r < 0) {
        log_warn("cgroup hierarchy %s (%s) is unusable: cannot make %s: %s; not used", mount, ctrl,
                 base, strerror(-r));
        return false;
    }
    return true;
}

/* Add the hierarchy mounted at mount to h if it is usable. 0 (added or not) or -ENOMEM. */
static int host_add(struct lb_cgroup_host *h, const char *mount, const char *parent,
                    const char *ctrl)
{
    char *base;

    if (h->nbase >= LB_CGROUP_MAX_DIRS)
        return 0;
    base = join_base(mount, parent);
    if (!base)
        return -ENOMEM;
    if (!hierarchy_usable(mount, base, ctrl)) {
        free(base);
        return 0;
    }
    h->base[h->nbase] = base;
    h->ctrl[h->nbase++] = ctrl;
    return 0;
}

int cgroup_host_detect(struct lb_cgroup_host *h, const char *parent)
{
    size_t i;
    int r, ncontrollers;

    memset(h, 0, sizeof(*h));
    if (!parent)
        parent = "lendbox";
    if (!parent_is_valid(parent)) {
        log_warn("cgroup parent '%s' is not a plain path, sandboxes get no cgroups", parent);
        return 0;
    }
    if (fs_is(CGROUP_MOUNT, CGROUP2_SUPER_MAGIC)) {
        r = host_add(h, CGROUP_MOUNT, parent, "unified");
        h->version = h->nbase ? 2 : 0;
        return r;
    }
    for (i = 0; i < sizeof(v1_controllers) / sizeof(v1_controllers[0]); i++) {
        char mount[64];

        snprintf(mount, sizeof(mount), CGROUP_MOUNT "/%s", v1_controllers[i]);
        if (!fs_is(mount, CGROUP_SUPER_MAGIC))
            continue;
        r = host_add(h, mount, parent, v1_controllers[i]);
        if (r < 0)
            goto fail;
    }
    ncontrollers = h->nbase;
    /* Even without a usable controller: they keep the sandboxes out of the unit's cgroup. */
    for (i = 0; i < sizeof(v1_tracking) / sizeof(v1_tracking[0]); i++) {
        char mount[64];

        snprintf(mount, sizeof(mount), CGROUP_MOUNT "/%s", v1_tracking[i].name);
        if (!fs_is(mount, v1_tracking[i].magic))
            continue;
        r = host_add(h, mount, parent, v1_tracking[i].name);
        if (r < 0)
            goto fail;
    }
    if (ncontrollers == 0 && h->nbase > 0)
        log_warn("no usable cgroup controller (memory, pids, cpu, freezer): sandboxes get no "
                 "resource limits and cannot be paused");
    h->version = h->nbase ? 1 : 0;
    return 0;

fail:
    cgroup_host_release(h);
    return r;
}

void cgroup_host_release(struct lb_cgroup_host *h)
{
    int i;

    for (i = 0; i < h->nbase; i++)
        free(h->base[i]);
    memset(h, 0, sizeof(*h));
}

void cgroup_release(struct lb_cgroup *cg)
{
    int i;

    for (i = 0; i < cg->ndirs; i++)
        free(cg->dirs[i]);
    memset(cg, 0, sizeof(*cg));
}

static int mkdir_p(const char *path)
{
    char tmp[4352];
    char *p;

    if (strlen(path) >= sizeof(tmp))
        return -ENAMETOOLONG;
    strcpy(tmp, path);
    for (p = tmp + 1;; p++) {
        if (*p == '/' || !*p) {
            char c = *p;

            *p = '\0';
            if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
                return -errno;
            *p = c;
            if (!c)
                return 0;
        }
    }
}

/* v2: turn on the controllers the limits need in every ancestor of base (best effort; a
 * cgroup that holds processes refuses, and then the limit files are simply missing). */
static void v2_enable_controllers(const char *base)
{
    static const char *const want[] = {"cpu", "memory", "pids"};
    char dir[4352], avail[512];
    size_t len = strlen(CGROUP_MOUNT);
    size_t i;

    snprintf(dir, sizeof(dir), "%s", base);
    for (;;) {
        char save = dir[len];

        dir[len] = '\0';
        if (read_small(dir, "cgroup.controllers", avail, sizeof(avail)) == 0) {
            for (i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
                char op[32];
                int r;

                if (!strstr(avail, want[i]))
                    continue;
                snprintf(op, sizeof(op), "+%s", want[i]);
                r = write_small(dir, "cgroup.subtree_control", op);
                if (r < 0)
                    log_debug("cgroup: cannot enable %s in %s: %s", want[i], dir, strerror(-r));
            }
        }
        dir[len] = save;
        if (!save)
            break;
        len += 1 + strcspn(dir + len + 1, "/");
    }
}

static int add_dir(struct lb_cgroup *cg, const char *base, const char *id)
{
    char *d;

    if (asprintf(&d, "%s/%s", base, id) < 0)
        return -ENOMEM;
    cg->dirs[cg->ndirs++] = d;
    return 0;
}

int cgroup_guess(const struct lb_cgroup_host *h, const char *id, struct lb_cgroup *out)
{
    int i, r;

    memset(out, 0, sizeof(*out));
    out->version = h->version;
    for (i = 0; i < h->nbase; i++) {
        r = add_dir(out, h->base[i], id);
        if (r < 0) {
            cgroup_release(out);
            return r;
        }
    }
    return 0;
}

/* The dir of cg that carries file (a controller's interface file), or NULL. */
static const char *dir_with(const struct lb_cgroup *cg, const char *file)
{
    int i;

    for (i = 0; i < cg->ndirs; i++) {
        if (file_exists(cg->dirs[i], file))
            return cg->dirs[i];
    }
    return NULL;
}

static int set_limit(const struct lb_cgroup *cg, const char *what, const char *file,
                     const char *value, struct lb_error *err)
{
    const char *dir = dir_with(cg, file);
    int r;

    if (!dir)
        return lb_error_set(err, -EOPNOTSUPP,
                            "cannot enforce the %s limit: no cgroup with %s on this host", what,
                            file);
    r = write_small(dir, file, value);
    if (r < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot set %s/%s to %s: %s", dir, file, value,
                            strerror(-r));
    return 0;
}

static int apply_limits(const struct lb_cgroup *cg, const struct lb_resources *res,
                        struct lb_error *err)
{
    char v[64];
    int r;

    if (res->memory_mib > 0) {
        int64_t bytes = res->memory_mib * 1024 * 1024;

        snprintf(v, sizeof(v), "%" PRId64, bytes);
        if (cg->version == 2) {
            r = set_limit(cg, "memory", "memory.max", v, err);
            if (r == 0 && dir_with(cg, "memory.swap.max"))
                r = set_limit(cg, "memory", "memory.swap.max", "0", err);
        } else {
            r = set_limit(cg, "memory", "memory.limit_in_bytes", v, err);
            if (r == 0 && dir_with(cg, "memory.memsw.limit_in_bytes"))
                r = set_limit(cg, "memory", "memory.memsw.limit_in_bytes", v, err);
        }
        if (r < 0)
            return r;
    }
    if (res->pids > 0) {
        snprintf(v, sizeof(v), "%" PRId64, res->pids);
        r = set_limit(cg, "pids", "pids.max", v, err);
        if (r < 0)
            return r;
    }
    if (res->cpu > 0) {
        int64_t quota = (int64_t)(res->cpu * CPU_PERIOD_US);

        if (quota < 1000)
            quota = 1000;
        if (cg->version == 2) {
            snprintf(v, sizeof(v), "%" PRId64 " %d", quota, CPU_PERIOD_US);
            r = set_limit(cg, "cpu", "cpu.max", v, err);
        } else {
            snprintf(v, sizeof(v), "%d", CPU_PERIOD_US);
            r = set_limit(cg, "cpu", "cpu.cfs_period_us", v, err);
            snprintf(v, sizeof(v), "%" PRId64, quota);
            if (r == 0)
                r = set_limit(cg, "cpu", "cpu.cfs_quota_us", v, err);
        }
        if (r < 0)
            return r;
    }
    return 0;
}

int cgroup_create(const struct lb_cgroup_host *h, const char *id, const struct lb_resources *res,
                  struct lb_cgroup *out, struct lb_error *err)
{
    bool limits = res->memory_mib > 0 || res->pids > 0 || res->cpu > 0;
    int i, r;

    memset(out, 0, sizeof(*out));
    if (h->version == 0) {
        if (limits)
            return lb_error_set(err, -EOPNOTSUPP,
                                "resource limits need cgroups, and none are usable here");
        return 0;
    }
    out->version = h->version;
    for (i = 0; i < h->nbase; i++) {
        char dir[4352];

        /* v1: a memory or cpu cgroup only when that limit is asked for. Every exec moves its
         * process into each of the sandbox's cgroups, and each v1 move waits for an RCU grace
         * period: fewer hierarchies, faster execs. (pids and freezer are always needed.) */
        if (h->version == 1 && h->ctrl[i] &&
            ((!strcmp(h->ctrl[i], "memory") && res->memory_mib <= 0) ||
             (!strcmp(h->ctrl[i], "cpu") && res->cpu <= 0)))
            continue;
        r = mkdir_p(h->base[i]);
        if (r == 0 && h->version == 2)
            v2_enable_controllers(h->base[i]);
        snprintf(dir, sizeof(dir), "%s/%s", h->base[i], id);
        if (r == 0 && mkdir(dir, 0755) < 0 && errno != EEXIST)
            r = -errno;
        if (r < 0) {
            log_warn("sbx=%s cannot make cgroup '%s': %s, ignoring", id, dir, strerror(-r));
            continue;
        }
        r = add_dir(out, h->base[i], id);
        if (r < 0)
            goto fail;
    }
    if (out->ndirs == 0)
        out->version = 0;
    if (limits && out->ndirs == 0) {
        r = lb_error_set(err, -EOPNOTSUPP, "resource limits need cgroups, and none could be made");
        goto fail;
    }
    r = apply_limits(out, res, err);
    if (r < 0)
        goto fail;
    return 0;

fail:
    (void)cgroup_remove(out, clock_mono_ms(), NULL);
    cgroup_release(out);
    if (r == -ENOMEM)
        lb_error_keep(err, r, "out of memory");
    return r;
}

json_t *cgroup_to_json(const struct lb_cgroup *cg)
{
    json_t *o, *dirs;
    int i;

    if (cg->version == 0 || cg->ndirs == 0)
        return json_null();
    dirs = json_array();
    for (i = 0; dirs && i < cg->ndirs; i++) {
        if (json_array_append_new(dirs, json_string(cg->dirs[i])) < 0) {
            json_decref(dirs);
            return NULL;
        }
    }
    o = json_pack("{s:i,s:o}", "version", cg->version, "dirs", dirs);
    return o;
}

int cgroup_from_json(const json_t *j, const char *id, struct lb_cgroup *out)
{
    size_t idlen = strlen(id), i;
    json_t *dirs, *v;
    json_int_t version;

    memset(out, 0, sizeof(*out));
    if (!j || json_is_null(j))
        return 0;
    if (json_unpack((json_t *)j, "{s:I,s:o}", "version", &version, "dirs", &dirs) < 0 ||
        (version != 1 && version != 2) || !json_is_array(dirs) ||
        json_array_size(dirs) > LB_CGROUP_MAX_DIRS)
        return -EINVAL;
    out->version = (int)version;
    json_array_foreach(dirs, i, v) {
        const char *d = json_string_value(v);
        size_t len = d ? strlen(d) : 0;

        if (!d || !provider_path_is_valid(d) ||
            strncmp(d, CGROUP_MOUNT "/", sizeof(CGROUP_MOUNT)) != 0 || len <= idlen + 1 ||
            d[len - idlen - 1] != '/' || strcmp(d + len - idlen, id) != 0) {
            cgroup_release(out);
            return -EINVAL;
        }
        out->dirs[out->ndirs] = strdup(d);
        if (!out->dirs[out->ndirs]) {
            cgroup_release(out);
            return -ENOMEM;
        }
        out->ndirs++;
    }
    return 0;
}

int cgroup_open_procs(const struct lb_cgroup *cg, int fds[LB_CGROUP_MAX_DIRS], int *n)
{
    char path[4352];
    int i, r;

    *n = 0;
    for (i = 0; i < cg->ndirs; i++) {
        snprintf(path, sizeof(path), "%s/cgroup.procs", cg->dirs[i]);
        fds[i] = open(path, O_WRONLY | O_CLOEXEC);
        if (fds[i] < 0) {
            r = -errno;
            while (i-- > 0)
                close(fds[i]);
            return r;
        }
    }
    *n = cg->ndirs;
    return 0;
}

bool cgroup_is_empty(const struct lb_cgroup *cg)
{
    char path[4352], c;

    if (cg->version == 0 || cg->ndirs == 0)
        return false;
    for (int i = 0; i < cg->ndirs; i++) {
        ssize_t n;
        int fd;

        snprintf(path, sizeof(path), "%s/cgroup.procs", cg->dirs[i]);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return false;
        do
            n = read(fd, &c, 1);
        while (n < 0 && errno == EINTR);
        close(fd);
        if (n != 0)
            return false;
    }
    return true;
}

int cgroup_open_memory_procs(const struct lb_cgroup *cg, int *fd)
{
    const char *dir = dir_with(cg, cg->version == 2 ? "memory.max" : "memory.limit_in_bytes");
    char path[4352];

    *fd = -1;
    if (!dir)
        return -ENOENT;
    snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
    *fd = open(path, O_WRONLY | O_CLOEXEC);
    return *fd < 0 ? -errno : 0;
}

int cgroup_memory_usage_path(const struct lb_cgroup *cg, char *buf, size_t size)
{
    const char *file = cg->version == 2 ? "memory.current" : "memory.usage_in_bytes";
    const char *dir = dir_with(cg, file);

    if (!dir || (size_t)snprintf(buf, size, "%s/%s", dir, file) >= size)
        return -ENOENT;
    return 0;
}

/* The freezer dir and the file that shows/sets its state. */
static const char *freezer(const struct lb_cgroup *cg, const char **file)
{
    *file = cg->version == 2 ? "cgroup.freeze" : "freezer.state";
    return dir_with(cg, *file);
}

void cgroup_is_frozen(const struct lb_cgroup *cg, bool *out)
{
    const char *file = cg->version == 2 ? "cgroup.freeze" : "freezer.state";
    char buf[64];
    int r = -ENOENT;

    *out = false;
    /* the first dir that has the file, as freezer() finds it, but opened at once instead of
     * looked for first: every stop asks this (twice), and path walks on cgroupfs are not free
     * while a shutdown sweep removes thousands of cgroups */
    for (int i = 0; i < cg->ndirs && r == -ENOENT; i++)
        r = read_small(cg->dirs[i], file, buf, sizeof(buf));
    if (r < 0)
        return;
    if (cg->version == 2)
        *out = buf[0] == '1';
    else
        *out = strncmp(buf, "FROZEN", 6) == 0 || strncmp(buf, "FREEZING", 8) == 0;
}

/* Has the kernel finished freezing (or thawing)? */
static bool freeze_settled(const struct lb_cgroup *cg, const char *dir, bool frozen)
{
    char buf[512];

    if (cg->version == 2) {
        const char *p;

        if (read_small(dir, "cgroup.events", buf, sizeof(buf)) < 0)
            return false;
        p = strstr(buf, "frozen ");
        return p && (p[7] == '1') == frozen;
    }
    if (read_small(dir, "freezer.state", buf, sizeof(buf)) < 0)
        return false;
    return strncmp(buf, frozen ? "FROZEN" : "THAWED", 6) == 0;
}

int cgroup_set_frozen(const struct lb_cgroup *cg, bool frozen, int64_t timeout_ms,
                      struct lb_error *err)
{
    const char *file, *dir = freezer(cg, &file);
    int64_t deadline = clock_mono_ms() + timeout_ms;
    const char *value;
    int r;

    if (!dir)
        return lb_error_set(err, -ENOSYS, "this sandbox has no cgroup freezer");
    if (cg->version == 2)
        value = frozen ? "1" : "0";
    else
        value = frozen ? "FROZEN" : "THAWED";
    r = write_small(dir, file, value);
    if (r < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot write %s to %s/%s: %s", value, dir, file,
                            strerror(-r));
    while (!freeze_settled(cg, dir, frozen)) {
        if (clock_mono_ms() >= deadline)
            return lb_error_set(err, -ETIMEDOUT, "the sandbox did not %s in time",
                                frozen ? "freeze" : "thaw");
        /* v1 retries a stuck freeze when FROZEN is written again */
        if (cg->version == 1 && frozen)
            (void)write_small(dir, file, value);
        clock_sleep_ms(POLL_STEP_MS);
    }
    return 0;
}

/* rmdir said EROFS: the cgroup file system is read-only (rmdir checks that before it looks
 * the name up, so even a dir that does not exist gets EROFS). Not a stop failure either way:
 * a missing dir was never made, and an existing one cannot be removed by any retry. */
static void remove_read_only(const char *dir)
{
    struct stat st;

    if (stat(dir, &st) == 0)
        log_warn("cgroup '%s' is on a read-only file system: left in place", dir);
}

int cgroup_unfreeze_procs(const struct lb_cgroup *cg, const pid_t *pids, size_t n)
{
    const char *file, *dir = freezer(cg, &file);
    char parent[4352], *slash;
    size_t i;
    int failed = 0;

    if (!dir || cg->version != 1)
        return 0;
    snprintf(parent, sizeof(parent), "%s", dir);
    slash = strrchr(parent, '/');
    if (!slash || slash == parent)
        return (int)n;
    *slash = '\0';
    for (i = 0; i < n; i++) {
        char num[32];
        int r;

        snprintf(num, sizeof(num), "%d", (int)pids[i]);
        r = write_small(parent, "cgroup.procs", num);
        if (r < 0 && r != -ESRCH)
            failed++;
    }
    return failed;
}

/* The number after "key " on a line of text, or -1. */
static int64_t keyed_value(const char *text, const char *key)
{
    size_t len = strlen(key);
    const char *p = text;

    while (p && *p) {
        if (strncmp(p, key, len) == 0 && p[len] == ' ')
            return strtoll(p + len + 1, NULL, 10);
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return -1;
}

int cgroup_read_oom_kills(const struct lb_cgroup *cg, uint64_t *count, int64_t *limit_bytes)
{
    const char *events = cg->version == 2 ? "memory.events" : "memory.oom_control";
    const char *limit = cg->version == 2 ? "memory.max" : "memory.limit_in_bytes";
    const char *dir = dir_with(cg, events);
    char buf[1024];
    int64_t v;

    if (!dir)
        return -ENOENT;
    if (read_small(dir, events, buf, sizeof(buf)) < 0 || (v = keyed_value(buf, "oom_kill")) < 0)
        return -EIO;
    if (count)
        *count = (uint64_t)v;
    if (limit_bytes) {
        *limit_bytes = 0;
        /* "max" (v2) or a page-rounded huge number (v1) mean no limit */
        if (read_small(dir, limit, buf, sizeof(buf)) == 0 && buf[0] >= '0' && buf[0] <= '9') {
            long long b = strtoll(buf, NULL, 10);

            if (b > 0 && b < (1LL << 60))
                *limit_bytes = b;
        }
    }
    return 0;
}

/* The decimal number file holds in dir (a counter such as memory.current), or -1. */
static int64_t read_number(const char *dir, const char *file)
{
    char buf[64], *end;
    long long v;

    if (!dir || read_small(dir, file, buf, sizeof(buf)) < 0)
        return -1;
    errno = 0;
    v = strtoll(buf, &end, 10);
    if (errno != 0 || end == buf || v < 0)
        return -1;
    return v;
}

/* How many lines dir's cgroup.procs lists (its processes), or -1. */
static int64_t count_procs(const char *dir)
{
    char path[4352], buf[4096];
    int64_t lines = 0;
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    while ((n = read(fd, buf, sizeof(buf))) > 0)
        for (ssize_t i = 0; i < n; i++)
            lines += buf[i] == '\n';
    close(fd);
    return n < 0 ? -1 : lines;
}

void cgroup_read_usage(const struct lb_cgroup *cg, struct lb_usage *out)
{
    bool v2 = cg->version == 2;
    char buf[1024];
    uint64_t kills;
    int64_t v;
    int i;

    if (cg->version == 0)
        return;
    /* CPU: usage_usec of a cgroup2 cpu.stat (a v1 cpu hierarchy's cpu.stat has none) */
    for (i = 0; i < cg->ndirs && out->cpu_s < 0; i++)
        if (read_small(cg->dirs[i], "cpu.stat", buf, sizeof(buf)) == 0 &&
            (v = keyed_value(buf, "usage_usec")) >= 0)
            out->cpu_s = (double)v / 1e6;
    if (out->cpu_s < 0 && (v = read_number(dir_with(cg, "cpuacct.usage"), "cpuacct.usage")) >= 0)
        out->cpu_s = (double)v / 1e9;
    out->memory_bytes =
        v2 ? read_number(dir_with(cg, "memory.current"), "memory.current")
           : read_number(dir_with(cg, "memory.usage_in_bytes"), "memory.usage_in_bytes");
    out->memory_peak_bytes =
        v2 ? read_number(dir_with(cg, "memory.peak"), "memory.peak")
           : read_number(dir_with(cg, "memory.max_usage_in_bytes"), "memory.max_usage_in_bytes");
    out->pids = read_number(dir_with(cg, "pids.current"), "pids.current");
    if (out->pids < 0 && cg->ndirs > 0)
        out->pids = count_procs(cg->dirs[0]);
    if (cgroup_read_oom_kills(cg, &kills, NULL) == 0)
        out->oom_kills = (int64_t)kills;
}

bool cgroup_restart_peak(const struct lb_cgroup *cg)
{
    const char *dir;

    if (cg->version != 1)
        return false; /* v2 memory.peak restarts per open file only */
    dir = dir_with(cg, "memory.max_usage_in_bytes");
    return !dir || write_small(dir, "memory.max_usage_in_bytes", "0") == 0;
}

/* Remove one cgroup dir as cgroup_remove does. */
static int remove_dir(const char *dir, int64_t deadline_ms, struct lb_error *err)
{
    while (rmdir(dir) < 0 && errno != ENOENT) {
        if (errno == EROFS) {
            remove_read_only(dir);
            break;
        }
        if (errno != EBUSY)
            return lb_error_set(err, -EREMOTEIO, "cannot remove cgroup '%s': %s", dir,
                                strerror(errno));
        if (clock_mono_ms() >= deadline_ms)
            return lb_error_set(err, -ETIMEDOUT, "cgroup '%s' is still busy", dir);
        clock_sleep_ms(POLL_STEP_MS);
    }
    return 0;
}

int cgroup_remove(const struct lb_cgroup *cg, int64_t deadline_ms, struct lb_error *err)
{
    return cgroup_remove_except(cg, NULL, deadline_ms, err);
}

/* Does cg name dir? */
static bool names_dir(const struct lb_cgroup *cg, const char *dir)
{
    for (int i = 0; cg && i < cg->ndirs; i++) {
        if (strcmp(cg->dirs[i], dir) == 0)
            return true;
    }
    return false;
}

int cgroup_remove_except(const struct lb_cgroup *cg, const struct lb_cgroup *removed,
                         int64_t deadline_ms, struct lb_error *err)
{
    for (int i = 0; i < cg->ndirs; i++) {
        int r;

        if (names_dir(removed, cg->dirs[i]))
            continue;
        r = remove_dir(cg->dirs[i], deadline_ms, err);
        if (r < 0)
            return r;
    }
    return 0;
}
