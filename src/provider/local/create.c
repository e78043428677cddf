/*
 * create.c - the local provider's create: make the sandbox directory and cgroup, build
 * the bwrap command line, start bwrap as the sandbox's uid (spawn_vfork: no copy of the
 * daemon), and wait until lendbox-supervise --init runs as the sandbox's pid 1.
 *
 * Spawning from a multi-threaded daemon: every string, fd and argv array is made before the
 * spawn; the child only makes raw syscalls and async-signal-safe calls. The daemon's fds are
 * all O_CLOEXEC, and the child closes everything above the fds it hands to bwrap anyway.
 * setgroups/setresgid/setresuid are raw syscalls: the glibc wrappers would try to broadcast
 * the change to threads that do not exist in the child.
 *
 * fds handed to bwrap: 0 /dev/null, 1 /dev/null, 2 a pipe that captures bwrap's errors,
 * 3 --info-fd (bwrap writes {"child-pid": N}), 4 the ready pipe (the init writes one byte),
 * 5 an O_PATH fd of the workdir's data directory (--bind-fd; storage dir) or /dev/null (storage
 * tmpfs: unused), 6 an O_PATH fd of the supervisor (--ro-bind-fd), 7 a memfd with the seccomp
 * filter (--seccomp, loaded by bwrap right before it execs the init; /dev/null when the filter
 * is off), 8 the sandbox's user namespace (--userns: made by userns.c, mapping the
 * sandbox's whole slot of 65536 ids; bwrap's own --unshare-user could map only its one uid).
 * bwrap 0.8 still realpath()s
 * /proc/self/fd/N as the sandbox's uid, so the path to the data directory must be searchable
 * by others: the data dir is 0711 and <data_dir>/<id> 0700 (owned by the sandbox's uid), so
 * nobody else can list or enter either.
 *
 * Storage: nothing a sandbox writes lands on the state dir's file system. Every writable
 * mount is a tmpfs sized from the sandbox's limits (mount_sizes below), made by bwrap inside
 * the sandbox's mount namespace: the kernel frees it when the namespace dies, a restarted
 * daemon reaches it through /proc/<init>/root like any other file, and pages a sandbox
 * process writes are charged to the sandbox's memory cgroup. / and /dev are read-only.
 * A future writable root layer (an overlay upper dir) belongs on such a sized tmpfs too.
 */
#include "provider/local/local_internal.h"
#include "provider/local/spawn.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/mount.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "image/image.h"
#include "util/buf.h"
#include "util/clock.h"
#include "util/fault.h"
#include "util/log.h"

/* bound on the cleanup of a sandbox that failed to start */
#define READY_TIMEOUT_MS 10000
#define STDERR_GRACE_MS 500
#define STDERR_MAX 2048
#define INFO_MAX 4096
#define CHILD_ENV_PATH "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

enum {
    FD_STDIN,
    FD_STDOUT,
    FD_STDERR,
    FD_INFO,
    FD_READY,
    FD_WORKSPACE,
    FD_SUPERVISE,
    FD_SECCOMP,
    FD_USERNS,
    FD_COUNT
};

/* A growable NULL-terminated argv of owned strings. */
struct strv {
    char **v;
    size_t n, cap;
    bool oom;
};

static void strv_add(struct strv *s, const char *str)
{
    char *copy;

    if (s->oom)
        return;
    if (s->n + 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        char **nv = realloc(s->v, cap * sizeof(*nv));

        if (!nv) {
            s->oom = true;
            return;
        }
        s->v = nv;
        s->cap = cap;
    }
    copy = strdup(str);
    if (!copy) {
        s->oom = true;
        return;
    }
    s->v[s->n++] = copy;
    s->v[s->n] = NULL;
}

static void strv_add2(struct strv *s, const char *a, const char *b)
{
    strv_add(s, a);
    strv_add(s, b);
}

static void strv_add3(struct strv *s, const char *a, const char *b, const char *c)
{
    strv_add(s, a);
    strv_add(s, b);
    strv_add(s, c);
}

static void strv_free(struct strv *s)
{
    size_t i;

    for (i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof(*s));
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The single component of workdir when it is "/NAME", else NULL. */
static const char *top_level_name(const char *path)
{
    return path[0] == '/' && path[1] && !strchr(path + 1, '/') ? path + 1 : NULL;
}

/* A workdir the local provider can mount its storage at: not "/", not the supervisor, and not
 * in a system directory of the root, whose contents the workdir's tmpfs would hide (a
 * top-level workdir replaces that entry of the image). -EINVAL (400) otherwise. */
static int workdir_check(const char *workdir, struct lb_error *err)
{
    static const char *const system_dirs[] = {"bin",   "boot",  "dev",    "etc",  "lib",
                                              "lib32", "lib64", "libx32", "proc", "run",
                                              "sbin",  "sys",   "tmp",    "usr",  "var"};
    size_t i, len = strcspn(workdir + 1, "/");

    if (!provider_path_is_valid(workdir) || strcmp(workdir, "/") == 0 ||
        strlen(workdir) >= sizeof(((struct local_desc *)0)->workdir) ||
        strcmp(workdir, LOCAL_SUPERVISE_PATH) == 0)
        return lb_error_set(err, -EINVAL, "invalid workdir '%s'", workdir);
    for (i = 0; i < sizeof(system_dirs) / sizeof(system_dirs[0]); i++) {
        if (strlen(system_dirs[i]) == len && strncmp(workdir + 1, system_dirs[i], len) == 0)
            return lb_error_set(err, -EINVAL,
                                "workdir '%s' is in the system directory /%s, which the "
                                "sandbox's storage would hide",
                                workdir, system_dirs[i]);
    }
    return 0;
}

/* Is the first component of path one of the top-level entries root_names binds? */
static bool path_is_bound(const char *path, char **names, size_t n)
{
    size_t i, len = strcspn(path + 1, "/");

    for (i = 0; i < n; i++) {
        if (strlen(names[i]) == len && strncmp(names[i], path + 1, len) == 0)
            return true;
    }
    return false;
}

/* ---- sizes of the writable mounts ----
 *
 * Every writable mount of a sandbox has a size derived from its limits (docs/operations.md,
 * "Sandbox storage"). C is resources.disk_mib (storage tmpfs; LOCAL_DEFAULT_DISK_MIB when the
 * spec sets none), or local.tmp_size_mib with storage dir (whose workdir has no quota):
 *   workdir   C (storage tmpfs)
 *   /tmp      min(local.tmp_size_mib, C)
 *   /run      min(64, C)
 *   /dev/shm  min(memory_mib, C) when memory_mib is set, else C
 *   /, /dev   read-only (bwrap's --dev is an unsized tmpfs); the tmpfs hiding the state and
 *             data dirs is read-only too
 */
#define RUN_SIZE_MIB 64

static int64_t min_mib(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

void local_mount_sizes(const struct local_provider *lp, const struct lb_resources *res,
                       struct mount_sizes *m)
{
    int64_t cap = lp->storage == LOCAL_STORAGE_TMPFS
                      ? (res->disk_mib > 0 ? res->disk_mib : LOCAL_DEFAULT_DISK_MIB)
                      : (res->disk_mib > 0 ? res->disk_mib : lp->tmp_size_mib);

    m->workdir_mib = lp->storage == LOCAL_STORAGE_TMPFS ? cap : 0;
    m->root_mib = cap;
    m->tmp_mib = min_mib(lp->tmp_size_mib, cap);
    m->run_mib = min_mib(RUN_SIZE_MIB, cap);
    m->shm_mib = res->memory_mib > 0 ? min_mib(res->memory_mib, cap) : cap;
}

/* --size BYTES --tmpfs DEST */
static void add_sized_tmpfs(struct strv *a, const char *dest, int64_t mib)
{
    char bytes[32];

    snprintf(bytes, sizeof(bytes), "%lld", (long long)mib * 1024 * 1024);
    strv_add2(a, "--size", bytes);
    strv_add2(a, "--tmpfs", dest);
}

/* The same, mode 1777 (sticky, everyone's): /tmp and /dev/shm, for every user of the sandbox */
static void add_shared_tmpfs(struct strv *a, const char *dest, int64_t mib)
{
    strv_add2(a, "--perms", "1777");
    add_sized_tmpfs(a, dest, mib);
}

/* Is path dir itself or below it? */
static bool path_is_under(const char *path, const char *dir)
{
    size_t n = strlen(dir);

    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* Hide a host directory the binds expose (the state dir, the data dir) behind an empty,
 * read-only tmpfs. */
static void add_hider(struct strv *a, const char *root, const char *dir, char **names, size_t n)
{
    if (dir && strcmp(root, "/") == 0 && path_is_bound(dir, names, n)) {
        strv_add2(a, "--tmpfs", dir);
        strv_add2(a, "--remount-ro", dir);
    }
}

/* /proc, /dev and the writable system mounts every sandbox gets, after its root. Every
 * writable mount is sized (the kernel default is half the host's RAM; the files API's pages are
 * charged to the sandbox's memory cgroup, see files.c, but a sandbox without a memory limit has
 * none); /dev is bwrap's unsized tmpfs, so it is read-only and /dev/shm gets a sized tmpfs of its
 * own. */
static void add_system_mounts(struct strv *a, const struct mount_sizes *sizes)
{
    strv_add2(a, "--proc", "/proc");
    /* /proc/sys read-only: the sandbox's root owns its IPC, network, UTS and pid namespaces,
     * and the kernel lets a namespace's root write their sysctls without capabilities
     * (kernel.shmmni, fs.mqueue.*, net.*, kernel.pid_max, ...): an in-place reset keeps those
     * namespaces, so what one episode wrote would hold for the next. The host's /proc/sys
     * shows the reader's own namespaces' values, so the view inside is unchanged. */
    strv_add3(a, "--ro-bind", "/proc/sys", "/proc/sys");
    strv_add2(a, "--dev", "/dev");
    strv_add2(a, "--remount-ro", "/dev");
    add_shared_tmpfs(a, "/dev/shm", sizes->shm_mib);
    add_shared_tmpfs(a, "/tmp", sizes->tmp_mib);
    add_sized_tmpfs(a, "/run", sizes->run_mib);
}

/* The root filesystem: a tmpfs with every top-level entry of root bound read-only (or
 * recreated as the same symlink), except what the sandbox gets privately. */
static int add_root(struct strv *a, const char *root, const char *workdir,
                    const struct local_provider *lp, const struct mount_sizes *sizes,
                    struct lb_error *err)
{
    static const char *const skip[] = {"proc", "dev", "tmp", "run", "lost+found"};
    const char *wd_name = top_level_name(workdir);
    char **names = NULL, **nn;
    size_t n = 0, cap = 0, i, k;
    struct dirent *de;
    DIR *d;
    int r = 0;

    d = opendir(root);
    if (!d)
        return lb_error_set(err, -EREMOTEIO, "cannot read image root '%s': %s", root,
                            strerror(errno));
    while ((de = readdir(d))) {
        bool skipped = strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
                       (wd_name && strcmp(de->d_name, wd_name) == 0);

        for (k = 0; k < sizeof(skip) / sizeof(skip[0]); k++)
            skipped = skipped || strcmp(de->d_name, skip[k]) == 0;
        if (skipped)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 32;
            nn = realloc(names, cap * sizeof(*nn));
            if (!nn) {
                r = -ENOMEM;
                break;
            }
            names = nn;
        }
        names[n] = strdup(de->d_name);
        if (!names[n]) {
            r = -ENOMEM;
            break;
        }
        n++;
    }
    closedir(d);
    if (r < 0)
        goto out;
    qsort(names, n, sizeof(*names), cmp_str);

    strv_add2(a, "--tmpfs", "/");
    for (i = 0; i < n; i++) {
        char src[4352], dst[512], target[4097];
        struct stat st;
        ssize_t len;

        if (snprintf(src, sizeof(src), "%s%s%s", root, strcmp(root, "/") ? "/" : "", names[i]) >=
                (int)sizeof(src) ||
            snprintf(dst, sizeof(dst), "/%s", names[i]) >= (int)sizeof(dst))
            continue; /* cannot be named; leave it out */
        if (lstat(src, &st) < 0)
            continue; /* vanished meanwhile */
        if (S_ISLNK(st.st_mode)) {
            len = readlink(src, target, sizeof(target) - 1);
            if (len < 0)
                continue;
            target[len] = '\0';
            strv_add3(a, "--symlink", target, dst);
        } else {
            strv_add3(a, "--ro-bind", src, dst);
        }
    }
    add_system_mounts(a, sizes);
    /* hide the daemon's state (tokens, database, other sandboxes' data) if the binds expose it */
    add_hider(a, root, lp->state_dir, names, n);
    if (lp->data_dir && !path_is_under(lp->data_dir, lp->state_dir)) /* else hidden already */
        add_hider(a, root, lp->data_dir, names, n);
out:
    for (i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (r < 0)
        return lb_error_set(err, r, "out of memory");
    return 0;
}

/* A sandbox of an image: the root is the overlay local_image_mount made (writable, copy-on-write
 * over the image), bound whole as /; the rest of the mounts are the same as add_root's. */
static void add_image_root(struct strv *a, const char *overlay_root,
                           const struct mount_sizes *sizes)
{
    strv_add3(a, "--bind", overlay_root, "/");
    add_system_mounts(a, sizes);
}

/* overlay_root: the image's writable root (NULL: root, read-only, as for host); image_ws: the
 * directory on the writable root's tmpfs to bind as the workdir (NULL: a tmpfs of its own) */
static int build_argv(struct local_provider *lp, const char *id, const char *root,
                      const char *overlay_root, const char *image_ws, const char *workdir,
                      const struct lb_resources *res, const char *hosts, struct strv *a,
                      struct lb_error *err)
{
    char num[16], host[64];
    struct mount_sizes sizes;
    int r;

    local_mount_sizes(lp, res, &sizes);

    snprintf(host, sizeof(host), "%.63s", id);
    strv_add(a, lp->bwrap_path);
    snprintf(num, sizeof(num), "%d", FD_USERNS);
    strv_add2(a, "--userns", num); /* the slot's namespace, made by the daemon */
    strv_add2(a, "--uid", "0");
    strv_add2(a, "--gid", "0");
    strv_add(a, "--unshare-pid");
    strv_add(a, "--unshare-net");
    strv_add(a, "--unshare-ipc");
    strv_add(a, "--unshare-uts");
    strv_add(a, "--new-session");
    strv_add(a, "--as-pid-1");
    strv_add2(a, "--hostname", host);
    if (overlay_root)
        add_image_root(a, overlay_root, &sizes);
    else if ((r = add_root(a, root, workdir, lp, &sizes, err)) < 0)
        return r;
    if (hosts && *hosts) /* a networked sandbox's names (net_policy.c) */
        strv_add3(a, "--ro-bind", hosts, "/etc/hosts");
    if (lp->storage == LOCAL_STORAGE_TMPFS && image_ws) {
        strv_add3(a, "--bind", image_ws, workdir); /* disk_mib shared with the root's writes */
    } else if (lp->storage == LOCAL_STORAGE_TMPFS) {
        add_sized_tmpfs(a, workdir, sizes.workdir_mib);
    } else {
        snprintf(num, sizeof(num), "%d", FD_WORKSPACE);
        strv_add3(a, "--bind-fd", num, workdir);
    }
    snprintf(num, sizeof(num), "%d", FD_SUPERVISE);
    strv_add3(a, "--ro-bind-fd", num, LOCAL_SUPERVISE_PATH);
    if (!overlay_root)
        strv_add2(a, "--remount-ro", "/");
    snprintf(num, sizeof(num), "%d", FD_INFO);
    strv_add2(a, "--info-fd", num);
    /* the init runs under the seccomp filter every exec gets, so that nothing in the sandbox
     * (not even a process forked off the init) escapes it */
    if (lp->seccomp.prog.len > 0) {
        snprintf(num, sizeof(num), "%d", FD_SECCOMP);
        strv_add2(a, "--seccomp", num);
    }
    strv_add2(a, "--", LOCAL_SUPERVISE_PATH);
    strv_add(a, "--init");
    snprintf(num, sizeof(num), "%d", FD_READY);
    strv_add2(a, "--ready-fd", num);
    if (a->oom)
        return lb_error_set(err, -ENOMEM, "out of memory");
    return 0;
}

struct spawn {
    int fds[FD_COUNT]; /* what bwrap gets, see the top comment */
    int info_r, ready_r, err_r;
    int cg_fds[LB_CGROUP_MAX_DIRS];
    int ncg;
    uid_t uid;
    struct rlimit nofile; /* the sandbox's RLIMIT_NOFILE, not the daemon's */
    /* mountns.c: the clean namespace bwrap starts in a copy of (-1: the daemon's), and a
     * clone of the sandbox's img tree (-1: none) that goes to img_path in that copy */
    int clean_ns, img_tree;
    char img_path[4400];
};

struct bwrap_child {
    const struct spawn *s;
    char **argv, **envp;
};

/* The spawned child (spawn.h: it shares the daemon's memory until execve): join the fresh
 * sandbox's cgroup, become its uid, exec bwrap. Returns an errno value (after saying why on
 * bwrap's stderr pipe) only on failure. No sandbox process exists yet that could signal it as
 * that uid, and a sandbox being created cannot be paused. */
static int child_exec_bwrap(void *arg)
{
    const struct bwrap_child *c = arg;
    const struct spawn *s = c->s;
    int i, e;

    sup_signals_reset();
    (void)syscall(SYS_setsid);
    /* a namespace of our own, holding none of the other sandboxes' mounts (mountns.c): while
     * host root, before the cgroup (nothing of the sandbox's can reach us yet) */
    if (s->clean_ns >= 0 &&
        (syscall(SYS_setns, s->clean_ns, CLONE_NEWNS) < 0 ||
         syscall(SYS_unshare, CLONE_NEWNS) < 0 ||
         (s->img_tree >= 0 && syscall(SYS_move_mount, s->img_tree, "", AT_FDCWD, s->img_path,
                                      MOVE_MOUNT_F_EMPTY_PATH) < 0))) {
        e = errno;
        local_child_report(s->fds[FD_STDERR], "lendbox: cannot set up bwrap's mount namespace", e);
        return e;
    }
    for (i = 0; i < s->ncg; i++) {
        if (write(s->cg_fds[i], "0", 1) != 1) {
            e = errno;
            local_child_report(s->fds[FD_STDERR], "lendbox: cannot join the sandbox cgroup", e);
            return e;
        }
    }
    /* the sandbox's own session keyring, never the daemon's */
    if (local_child_new_session_keyring() < 0) {
        e = errno;
        local_child_report(s->fds[FD_STDERR], "lendbox: cannot make a session keyring", e);
        return e;
    }
    if (syscall(SYS_setgroups, 0, NULL) < 0 || syscall(SYS_setresgid, s->uid, s->uid, s->uid) < 0 ||
        syscall(SYS_setresuid, s->uid, s->uid, s->uid) < 0) {
        e = errno;
        local_child_report(s->fds[FD_STDERR], "lendbox: cannot switch to the sandbox uid", e);
        return e;
    }
    (void)syscall(SYS_umask, 022); /* the sandbox's files: not the daemon's umask 077 */
    if (local_child_place_fds(s->fds, FD_COUNT) < 0) {
        e = errno;
        local_child_report(s->fds[FD_STDERR], "lendbox: cannot set up fds", e);
        return e;
    }
    (void)syscall(SYS_close_range, FD_COUNT, ~0U, 0);
    /* only now: with many connections open, the daemon's fds (inherited until here) go past
     * the sandbox's limit, and placing ours needs free numbers below it */
    if (syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, &s->nofile, NULL) < 0) {
        e = errno;
        local_child_report(FD_STDERR, "lendbox: cannot set the sandbox's open-file limit", e);
        return e;
    }
    execve(c->argv[0], c->argv, c->envp);
    e = errno;
    local_child_report(FD_STDERR, "lendbox: cannot execute bwrap", e);
    return e;
}

static void spawn_close(struct spawn *s)
{
    int i;

    for (i = 0; i < FD_COUNT; i++)
        local_close_fd(&s->fds[i]);
    local_close_fd(&s->info_r);
    local_close_fd(&s->ready_r);
    local_close_fd(&s->err_r);
    for (i = 0; i < s->ncg; i++)
        local_close_fd(&s->cg_fds[i]);
    s->ncg = 0;
    local_close_fd(&s->img_tree);
    local_close_fd(&s->clean_ns);
}

/* Trimmed text of what bwrap said, for an error message. */
static const char *stderr_text(struct lb_buf *b)
{
    size_t n;

    if (!b->data)
        return "(no output)";
    n = b->len;
    while (n > 0 && (b->data[n - 1] == '\n' || b->data[n - 1] == ' '))
        n--;
    b->data[n] = '\0';
    b->len = n;
    for (size_t i = 0; i < n; i++) {
        if (b->data[i] == '\n')
            b->data[i] = ' ';
    }
    /* our forked children report "errno N" (no strerror there): say it in words */
    if (strstr(b->data, ": errno ")) {
        size_t cap = n + 1024;
        char *t = malloc(cap);

        if (t) {
            local_errno_text(b->data, t, cap);
            b->len = 0;
            b->max = b->len + cap; /* the text only grew by the error names */
            (void)lb_buf_append_capped(b, t, strlen(t));
            free(t);
        }
    }
    return b->len ? b->data : "(no output)";
}

/* Read what is readable from fd into b; false at EOF or error. */
static bool read_into(int fd, struct lb_buf *b)
{
    char chunk[1024];
    ssize_t n = read(fd, chunk, sizeof(chunk));

    if (n < 0 && errno == EINTR)
        return true;
    if (n <= 0)
        return false;
    (void)lb_buf_append_capped(b, chunk, (size_t)n);
    return true;
}

/* Wait for bwrap's info (the init's pid) and the init's ready byte. */
static int wait_ready(struct spawn *s, pid_t *pid_out, int64_t timeout_ms, struct lb_error *err)
{
    int64_t deadline = clock_mono_ms() + timeout_ms, grace_end;
    struct lb_buf info, errs;
    bool ready = false, failed = false;
    json_int_t child = 0;
    int r = 0;

    lb_buf_init(&info, INFO_MAX);
    lb_buf_init(&errs, STDERR_MAX);
    while (!(ready && child > 0)) {
        struct pollfd p[3] = {{.fd = s->info_r, .events = POLLIN},
                              {.fd = s->ready_r, .events = POLLIN},
                              {.fd = s->err_r, .events = POLLIN}};
        int64_t left = deadline - clock_mono_ms();
        int n;

        if (left <= 0) {
            r = lb_error_set(err, -EREMOTEIO,
                             "sandbox was not ready within %lld ms (ready_timeout_s, else "
                             "lending.create_timeout_s): %s",
                             (long long)timeout_ms, stderr_text(&errs));
            goto out;
        }
        n = poll(p, 3, (int)left);
        if (n < 0 && errno != EINTR) {
            r = lb_error_set(err, -EREMOTEIO, "poll: %s", strerror(errno));
            goto out;
        }
        if (p[0].revents && !read_into(s->info_r, &info))
            local_close_fd(&s->info_r);
        if (p[1].revents) {
            char c;
            ssize_t k = read(s->ready_r, &c, 1);

            if (k == 1)
                ready = true;
            else if (k == 0 || errno != EINTR)
                failed = true;
        }
        if (p[2].revents && !read_into(s->err_r, &errs))
            local_close_fd(&s->err_r);
        if (!child && info.data) {
            json_t *j = json_loadb(info.data, info.len, JSON_DISABLE_EOF_CHECK, NULL);

            if (j && json_unpack(j, "{s:I}", "child-pid", &child) < 0)
                child = -1;
            json_decref(j);
        }
        if (failed || child < 0 || (s->info_r < 0 && !child))
            break;
    }
    if (ready && child > 0 && child <= INT_MAX) {
        *pid_out = (pid_t)child;
        goto out;
    }
    /* bwrap failed: let it finish saying why */
    grace_end = clock_mono_ms() + STDERR_GRACE_MS;
    while (s->err_r >= 0 && clock_mono_ms() < grace_end) {
        struct pollfd p = {.fd = s->err_r, .events = POLLIN};

        if (poll(&p, 1, (int)(grace_end - clock_mono_ms())) <= 0 || !read_into(s->err_r, &errs))
            break;
    }
    r = lb_error_set(err, -EREMOTEIO, "sandbox failed to start: %s", stderr_text(&errs));
    if (child > 0 && child <= INT_MAX)
        *pid_out = (pid_t)child; /* so the caller can kill it */
out:
    lb_buf_release(&info);
    lb_buf_release(&errs);
    return r;
}

/* How often a create starts bwrap when it lost the race below. */
#define SPAWN_MOUNT_RACE_TRIES 4

/* Did bwrap fail because a mount under a directory it binds recursively went away while it
 * bound it (its recursive bind lists the submounts, then remounts each with its flags, and one
 * unmounted in between: "Unable to apply mount flags: remount ...": bubblewrap issue #650)? On
 * a host sandbox, whose root binds the host's directories, every mount another sandbox, image
 * or engine makes or drops under them (here: other sandboxes' tmpfs under the state dir in
 * /var) can do it; nothing of the sandbox has run, so it is started again. */
static bool spawn_lost_mount_race(const struct lb_error *err)
{
    /* bwrap's own words, at the start of its report (a caller's path can say anything later on:
     * the workdir is made by a mkdir, never by such a bind) */
    static const char head[] = "sandbox failed to start: bwrap: Can't bind mount /oldroot/";

    if (!err || err->code != -EREMOTEIO || strncmp(err->message, head, sizeof(head) - 1) != 0)
        return false;
    return strstr(err->message, ": Unable to apply mount flags: remount ") ||
           strstr(err->message, ": Unable to remount recursively with correct flags");
}

/* Bring bwrap and the init (pid) to the daemon's nice value (its main thread's) when the
 * calling thread runs at another one: a warm pool's refill threads run nicer (pool.refill_nice)
 * so that creations yield the CPU to requests, and the sandbox they made must not keep that.
 * Linux keeps a nice value per thread; the sandbox's later processes come from request
 * threads. Best effort: a failure is logged. */
static void sandbox_renice(pid_t bwrap, pid_t pid)
{
    int base, mine;

    errno = 0;
    base = getpriority(PRIO_PROCESS, (id_t)getpid());
    if (base == -1 && errno != 0)
        return;
    errno = 0;
    mine = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    if ((mine == -1 && errno != 0) || mine == base)
        return;
    if ((bwrap > 0 && setpriority(PRIO_PROCESS, (id_t)bwrap, base) < 0) ||
        (pid > 0 && setpriority(PRIO_PROCESS, (id_t)pid, base) < 0))
        log_warn("cannot give sandbox init %d the daemon's nice value %d: %s", (int)pid, base,
                 strerror(errno));
}

/* Start bwrap; on success *pid is the sandbox's init. On failure *pid may still name a
 * process to kill (or 0). workspace: the data directory to bind at the workdir, NULL with
 * storage tmpfs. */
static int spawn_sandbox(struct local_provider *lp, const struct local_desc *d, const char *dir,
                         char **argv, const char *workspace, int64_t timeout_ms, pid_t *pid,
                         struct lb_error *err)
{
    char *envp[] = {CHILD_ENV_PATH, NULL};
    struct bwrap_child bc;
    struct spawn s;
    pid_t bwrap = 0;
    int i, r, dfd = -1;

    memset(&s, 0, sizeof(s));
    for (i = 0; i < FD_COUNT; i++)
        s.fds[i] = -1;
    s.info_r = s.ready_r = s.err_r = -1;
    s.clean_ns = local_clean_ns_get(lp);
    s.img_tree = -1;
    s.uid = d->uid;
    s.nofile.rlim_cur = s.nofile.rlim_max = (rlim_t)lp->sandbox_nofile;
    *pid = 0;

    s.fds[FD_STDIN] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    s.fds[FD_STDOUT] = open("/dev/null", O_WRONLY | O_CLOEXEC);
    s.fds[FD_WORKSPACE] = workspace ? open(workspace, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                                    : open("/dev/null", O_PATH | O_CLOEXEC);
    s.fds[FD_SUPERVISE] = open(lp->supervise_path, O_PATH | O_CLOEXEC);
    r = local_userns_open(d->uid, d->uid, LOCAL_SLOT_IDS, &s.fds[FD_USERNS]);
    if (r < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot make the sandbox's user namespace: %s",
                         strerror(-r));
        goto out;
    }
    if (lp->seccomp.prog.len > 0) {
        r = seccomp_filter_memfd(&lp->seccomp);
        s.fds[FD_SECCOMP] = r;
        if (r < 0)
            errno = -r;
    } else {
        s.fds[FD_SECCOMP] = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if (s.fds[FD_STDIN] < 0 || s.fds[FD_STDOUT] < 0 || s.fds[FD_WORKSPACE] < 0 ||
        s.fds[FD_SUPERVISE] < 0 || s.fds[FD_SECCOMP] < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot open the sandbox's files: %s", strerror(errno));
        goto out;
    }
    if ((r = local_pipe(&s.info_r, &s.fds[FD_INFO])) < 0 ||
        (r = local_pipe(&s.ready_r, &s.fds[FD_READY])) < 0 ||
        (r = local_pipe(&s.err_r, &s.fds[FD_STDERR])) < 0) {
        r = lb_error_set(err, -EREMOTEIO, "pipe: %s", strerror(-r));
        goto out;
    }
    /* its own mounts (an image's root, a snapshot's workdir), for the namespace bwrap starts
     * in: a clone of the whole tree, taken here in ours */
    snprintf(s.img_path, sizeof(s.img_path), "%s/img", dir);
    if (s.clean_ns >= 0) {
        struct stat st;

        dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) {
            r = lb_error_set(err, -EREMOTEIO, "cannot open '%s': %s", dir, strerror(errno));
            goto out;
        }
        /* an img directory is always a mount (image.c): one that is not must not start as an
         * empty root */
        if (fstatat(dfd, "img", &st, AT_SYMLINK_NOFOLLOW) == 0) {
            if (!local_is_mount_point(dfd, "img")) {
                r = lb_error_set(err, -EREMOTEIO, "'%s' is not mounted", s.img_path);
                goto out;
            }
            s.img_tree = (int)syscall(SYS_open_tree, AT_FDCWD, s.img_path,
                                      OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
            if (s.img_tree < 0) {
                r = lb_error_set(err, -EREMOTEIO, "cannot clone the sandbox's mounts: %s",
                                 strerror(errno));
                goto out;
            }
        } else if (errno != ENOENT) {
            r = lb_error_set(err, -EREMOTEIO, "cannot look at '%s': %s", s.img_path,
                             strerror(errno));
            goto out;
        }
        local_close_fd(&dfd);
    }
    r = cgroup_open_procs(&d->cg, s.cg_fds, &s.ncg);
    if (r < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot open the sandbox's cgroup: %s", strerror(-r));
        goto out;
    }

    /* bwrap is our child (its monitor process would come to us anyway: lendboxd is a child
     * subreaper); local_stop reaps it (reap_uid_children). A child that failed before its
     * execve said why on the stderr pipe, which wait_ready reads. */
    bc = (struct bwrap_child){&s, argv, envp};
    r = spawn_vfork(child_exec_bwrap, &bc, &bwrap);
    if (r < 0) /* wait_ready fails at once (no write end is left) with the child's report */
        log_warn("cannot start bwrap: %s", strerror(-r));
    /* only bwrap (and the init) keep the write ends */
    for (i = 0; i < FD_COUNT; i++)
        local_close_fd(&s.fds[i]);
    for (i = 0; i < s.ncg; i++)
        local_close_fd(&s.cg_fds[i]);
    s.ncg = 0;
    r = wait_ready(&s, pid, timeout_ms, err);
    if (r == 0)
        sandbox_renice(bwrap, *pid);
out:
    local_close_fd(&dfd);
    spawn_close(&s);
    return r;
}

/* Where the image's root tree is: "/" for host, else <images_dir>/<name>. */
static int image_root(struct local_provider *lp, const char *image, char *buf, size_t size,
                      struct lb_image_layers *layers, struct lb_error *err)
{
    struct stat st;

    memset(layers, 0, sizeof(*layers));
    if (strcmp(image, "host") == 0) {
        snprintf(buf, size, "/");
        layers->host = true;
        return 0;
    }
    if (!local_id_is_valid(image) || !lp->images_dir)
        return lb_error_set(err, -LB_E_IMAGE_NOT_FOUND, "unknown image '%s'", image);
    snprintf(buf, size, "%s/%s", lp->images_dir, image);
    if (stat(buf, &st) < 0 || !S_ISDIR(st.st_mode) ||
        image_layers(lp->images_dir, image, layers, NULL) < 0 || layers->n > LOCAL_IMAGE_LAYERS_MAX)
        return lb_error_set(err, -LB_E_IMAGE_NOT_FOUND, "unknown image '%s'", image);
    if (layers->host) /* a snapshot of a host sandbox: the host's root, its workspace */
        snprintf(buf, size, "/");
    return 0;
}

static int create_sandbox(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                          const struct lb_sandbox_spec *spec, struct lb_image_layers *layers,
                          json_t **descriptor_out, struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    const char *image = spec && spec->image ? spec->image : "host";
    const char *workdir = spec && spec->workdir ? spec->workdir : LOCAL_DEFAULT_WORKDIR;
    struct lb_resources none = {0};
    const struct lb_resources *res = spec ? &spec->resources : &none;
    char root[4352], dir[4352], hosts[4352] = "", overlay[4400] = "", image_ws[4416] = "";
    const char *bottom;
    bool host_root;
    struct strv argv = {0};
    struct local_desc d;
    bool made_dir = false;
    pid_t pid = 0;
    int r;

    memset(&d, 0, sizeof(d));
    *descriptor_out = NULL;
    if (!ref || !local_id_is_valid(ref->id))
        return lb_error_set(err, -EINVAL, "invalid sandbox id");
    r = workdir_check(workdir, err);
    if (r < 0)
        return r;
    if (res->cpu < 0 || res->memory_mib < 0 || res->pids < 0 || res->disk_mib < 0 || res->gpu < 0)
        return lb_error_set(err, -EINVAL, "resource limits must not be negative");
    if (res->gpu > 0 || res->gpu_type)
        return lb_error_set(err, -EOPNOTSUPP,
                            "resources.gpu/gpu_type cannot be enforced: the local provider has "
                            "no GPUs");
    if (lp->storage == LOCAL_STORAGE_DIR && res->disk_mib > 0)
        return lb_error_set(err, -EOPNOTSUPP,
                            "resources.disk_mib cannot be enforced: sandbox workdirs are plain "
                            "directories (local.storage = dir)");
    r = image_root(lp, image, root, sizeof(root), layers, err);
    if (r < 0)
        return r;
    host_root = layers->host;
    /* the bottom tree: the one an image's own files (/etc/hosts) are looked up in */
    bottom = host_root ? root : layers->paths[layers->n - 1];
    /* where a grader's view finds the image again (exec.c), whatever the name points to
     * later */
    if (!host_root && !realpath(root, d.image))
        return lb_error_set(err, -LB_E_IMAGE_NOT_FOUND, "unknown image '%s'", image);
    /* host's / is bound read-only, so bwrap cannot make a deeper workdir's mount point there
     * (a top-level one lives in bwrap's own root tmpfs; an image's root is writable) */
    if (host_root && !top_level_name(workdir)) {
        struct stat wst;

        if (stat(workdir, &wst) < 0 || !S_ISDIR(wst.st_mode))
            return lb_error_set(err, -EOPNOTSUPP,
                                "workdir '%s' does not exist in image 'host', whose root is "
                                "read-only: use a top-level workdir (e.g. /app) or an existing "
                                "directory",
                                workdir);
    }
    /* the network first: an unenforceable request (422) makes nothing */
    r = local_net_prepare(lp, ref->id, spec ? &spec->network : NULL, &d.net, err);
    if (r < 0)
        return r;
    if (d.net.mode != LOCAL_NET_NONE) {
        struct stat hst;
        char etc_hosts[4400];

        /* the sandbox's names go over the image's /etc/hosts (a read-only bind needs it) */
        snprintf(etc_hosts, sizeof(etc_hosts), "%s/etc/hosts", strcmp(bottom, "/") ? bottom : "");
        if (stat(etc_hosts, &hst) < 0 || !S_ISREG(hst.st_mode)) {
            local_net_free_slot(lp, &d.net);
            local_desc_release(&d);
            return lb_error_set(err, -EOPNOTSUPP,
                                "image '%s' has no /etc/hosts file, so the sandbox's network "
                                "names (" LOCAL_NET_HOST_NAME ", servers) cannot be given to it",
                                image);
        }
    }
    snprintf(d.workdir, sizeof(d.workdir), "%s", workdir);
    local_sandbox_dir(lp, ref->id, dir, sizeof(dir));
    if (lp->storage == LOCAL_STORAGE_DIR &&
        snprintf(d.data, sizeof(d.data), "%s/%s", lp->data_dir, ref->id) >= (int)sizeof(d.data)) {
        local_net_free_slot(lp, &d.net);
        local_desc_release(&d);
        return lb_error_set(err, -ENAMETOOLONG, "data directory path is too long");
    }
    r = local_uid_alloc(lp, &d.uid);
    if (r < 0) {
        local_net_free_slot(lp, &d.net);
        local_desc_release(&d);
        return lb_error_set(err, r, "no free sandbox uid (all %" PRIu32 " in use)", lp->uid_count);
    }

    /* the sandbox dir (descriptor only) first: it accounts for everything made after it */
    if (mkdir(dir, 0711) < 0) {
        r = errno == EEXIST
                ? lb_error_set(err, -EEXIST, "sandbox '%s' already exists", ref->id)
                : lb_error_set(err, -EREMOTEIO, "cannot make '%s': %s", dir, strerror(errno));
        local_uid_free(lp, d.uid);
        local_net_free_slot(lp, &d.net);
        local_desc_release(&d);
        return r;
    }
    made_dir = true;
    if (chmod(dir, 0711) < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot chmod '%s': %s", dir, strerror(errno));
        goto fail;
    }
    /* storage dir: <data_dir>/<id>, 0700 and the sandbox's own, so only bwrap (as the uid)
     * can enter it */
    if (d.data[0] && (mkdir(d.data, 0700) < 0 || chown(d.data, d.uid, d.uid) < 0)) {
        r = lb_error_set(err, -EREMOTEIO, "cannot make '%s': %s", d.data, strerror(errno));
        goto fail;
    }
    r = cgroup_create(&lp->cg, ref->id, res, &d.cg, err);
    if (r < 0)
        goto fail;
    /* A descriptor without a pid first: a crash from here on leaves enough to clean up. */
    r = local_desc_save(&d, dir, err);
    if (r < 0)
        goto fail;
    r = local_net_write_hosts(&d.net, dir, hosts, sizeof(hosts), err);
    if (r < 0)
        goto fail;
    /* a sandbox of an image: a writable copy-on-write root over the image, on a tmpfs of the
     * sandbox's disk size; host stays the host's / read-only */
    if (!host_root || (layers->workspace[0] && lp->storage == LOCAL_STORAGE_TMPFS)) {
        const char *paths[LOCAL_IMAGE_LAYERS_MAX];
        struct mount_sizes sizes;

        for (size_t i = 0; i < layers->n; i++)
            paths[i] = layers->paths[i];
        local_mount_sizes(lp, res, &sizes);
        r = local_image_mount(dir, paths, layers->n, d.uid, sizes.root_mib, overlay,
                              sizeof(overlay), err);
        if (r == 0) /* tests: a crash (delay + kill -9) with the root mounted, no init yet */
            r = fault_hit("image.mounted", 0, err);
        if (r < 0)
            goto fail;
        local_image_workspace(dir, image_ws, sizeof(image_ws));
    }
    /* a snapshot's workdir, as it was captured, owned by this sandbox's ids: with storage
     * tmpfs an overlay over the stored tree (nothing copied), with storage dir a copy into
     * its data directory (a plain directory on the host's disk) */
    if (layers->workspace[0]) {
        if (lp->storage == LOCAL_STORAGE_DIR)
            r = local_tree_restore(layers->workspace, d.data, d.uid, err);
        else if (local_image_workspace_has_devices(layers->workspace))
            r = local_tree_restore(layers->workspace, image_ws, d.uid, err);
        else
            r = local_image_mount_workspace(dir, layers->workspace, d.uid, err);
        if (r < 0)
            goto fail;
    }
    r = build_argv(lp, ref->id, root, overlay[0] ? overlay : NULL, image_ws[0] ? image_ws : NULL,
                   workdir, res, hosts, &argv, err);
    if (r < 0)
        goto fail;
    for (int attempt = 1;; attempt++) {
        /* tests: "fail" stands for bwrap losing that race (below), without starting it */
        r = fault_hit("bwrap.mount_race", 0, err);
        if (r < 0)
            r = lb_error_set(err, -EREMOTEIO,
                             "sandbox failed to start: bwrap: Can't bind mount /oldroot/var on "
                             "/newroot/var: Unable to apply mount flags: remount (injected: "
                             "bwrap.mount_race)");
        else
            r = spawn_sandbox(lp, &d, dir, argv.v, d.data[0] ? d.data : NULL,
                              spec && spec->ready_timeout_ms > 0 ? spec->ready_timeout_ms
                                                                 : lp->create_timeout_ms,
                              &pid, err);
        if (r == 0 || attempt == SPAWN_MOUNT_RACE_TRIES || !spawn_lost_mount_race(err))
            break;
        /* nothing of the sandbox ran: bwrap's child died setting up its mounts; what is left
         * of the attempt (its pid namespace's init, if bwrap named one) goes first */
        log_info_sbx(ref->id,
                     "sandbox %s: bwrap lost a race with a host mount that went away (attempt %d "
                     "of %d); starting it again: %s",
                     ref->id, attempt, SPAWN_MOUNT_RACE_TRIES, err->message);
        if (pid > 0)
            (void)kill(pid, SIGKILL);
        local_reap_uid_children(d.uid);
        pid = 0;
    }
    if (r < 0)
        goto fail;
    /* the link and its rules, before the seed returns */
    r = local_net_attach(lp, &d.net, pid, err);
    if (r < 0)
        goto fail;
    d.pid = pid;
    r = local_proc_start_time(pid, &d.start_time);
    if (r < 0) {
        r = lb_error_set(err, -EREMOTEIO, "sandbox init (pid %d) vanished right after start",
                         (int)pid);
        goto fail;
    }
    /* what the init's limits, priority and CPUs are now: an in-place reset keeps the init
     * only while they are so (an agent may change them: same uid) */
    local_init_attrs_save(dir, pid);
    r = local_desc_save(&d, dir, err);
    if (r < 0)
        goto fail;
    *descriptor_out = local_desc_to_json(&d, dir);
    if (!*descriptor_out) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    log_debug("sbx=%s started: pid %d uid %" PRIu32, ref->id, (int)pid, d.uid);
    strv_free(&argv);
    local_desc_release(&d);
    return 0;

fail:
    if (made_dir) {
        struct lb_error ignored;

        /* pid may be unknown or not yet verified: the uid sweep gets everything */
        d.pid = 0;
        if (local_destroy_sandbox(lp, ref->id, &d, clock_mono_ms() + READY_TIMEOUT_MS, &ignored) <
            0)
            log_warn("sbx=%s cleanup after a failed create: %s", ref->id, ignored.message);
    }
    strv_free(&argv);
    local_desc_release(&d);
    return r;
}

int local_create(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                 const struct lb_sandbox_spec *spec, json_t **descriptor_out, struct lb_error *err)
{
    struct lb_image_layers *layers = malloc(sizeof(*layers)); /* 25 KiB: not on the stack */
    int r;

    *descriptor_out = NULL;
    if (!layers)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = create_sandbox(p, ref, spec, layers, descriptor_out, err);
    free(layers);
    return r;
}
