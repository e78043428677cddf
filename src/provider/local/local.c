/*
 * local.c - the local provider (see local.h): its ops table, construction, capabilities and
 * destruction, and the small ops that only read a sandbox (status, OOM kills, list, endpoint)
 * or freeze it (pause, resume). Every other op and helper lives in a file of its own below this
 * one (local_internal.h has the map); none of them calls back into this file.
 *
 * A sandbox is identified by its init's pid plus that process's start time, so a reused pid
 * is never mistaken for it. Every process of a sandbox runs as one of the sandbox's own host
 * ids (a slot of LOCAL_SLOT_IDS: sandbox id N is host id slot + N), which stop uses as the
 * final sweep: after the init (and with it its pid namespace) is killed, every remaining
 * process with a uid of the slot (bwrap's outer monitor, a half-started exec) is killed too.
 */
#include "provider/local/local_internal.h"

#include <dirent.h>
#include <errno.h>
#include <linux/capability.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"
#include "util/mem.h"

#define UID_COUNT_MAX 32768u /* slots: 2^31 / LOCAL_SLOT_IDS */
#define FREEZE_TIMEOUT_MS 5000

/* ---- ops ------------------------------------------------------------------------------- */

static int local_status(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                        enum lb_sandbox_status *out, struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    struct local_desc d;
    bool frozen = false;
    int r;

    r = local_desc_load(lp, ref, &d, err);
    if (r == -ENOENT) {
        lb_error_clear(err);
        *out = LB_STATUS_STOPPED;
        return 0;
    }
    if (r < 0)
        return r;
    if (local_desc_alive(&d)) {
        cgroup_is_frozen(&d.cg, &frozen);
        *out = frozen ? LB_STATUS_PAUSED : LB_STATUS_RUNNING;
    } else {
        *out = LB_STATUS_STOPPED;
    }
    local_desc_release(&d);
    return 0;
}

static int local_oom_kills(struct lb_provider *p, const struct lb_sandbox_ref *ref, uint64_t *count,
                           int64_t *limit_bytes, struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    struct local_desc d;
    int r = local_desc_load_running(lp, ref, &d, err);

    if (r < 0)
        return r;
    if ((r = cgroup_read_oom_kills(&d.cg, count, limit_bytes)) < 0)
        r = lb_error_set(err, r, "cannot read the OOM-kill count of sandbox '%s': %s", ref->id,
                         strerror(-r));
    local_desc_release(&d);
    return r;
}

static int local_list(struct lb_provider *p, json_t **out, struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    struct dirent *de;
    json_t *arr;
    DIR *dir;
    int r = 0;

    arr = json_array();
    if (!arr)
        return lb_error_set(err, -ENOMEM, "out of memory");
    dir = opendir(lp->sandboxes_dir);
    if (!dir) {
        json_decref(arr);
        return lb_error_set(err, -EREMOTEIO, "cannot read '%s': %s", lp->sandboxes_dir,
                            strerror(errno));
    }
    while ((de = readdir(dir))) {
        char path[4352];
        struct local_desc d;
        json_t *raw = NULL, *item;
        struct stat st;

        if (!local_id_is_valid(de->d_name))
            continue;
        local_sandbox_dir(lp, de->d_name, path, sizeof(path));
        if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode))
            continue;
        if (local_desc_read_file(path, de->d_name, &d, &raw) == 0) {
            local_uid_mark(lp, d.uid);
            local_net_mark_slot(lp, &d.net);
            local_desc_release(&d);
        }
        item =
            json_pack("{s:s,s:o}", "sandbox_id", de->d_name, "descriptor", raw ? raw : json_null());
        if (!item || json_array_append_new(arr, item) < 0) {
            r = lb_error_set(err, -ENOMEM, "out of memory");
            break;
        }
    }
    closedir(dir);
    if (r < 0) {
        json_decref(arr);
        return r;
    }
    *out = arr;
    return 0;
}

static int set_frozen(struct lb_provider *p, const struct lb_sandbox_ref *ref, bool frozen,
                      struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    struct local_desc d;
    int r;

    r = local_desc_load_running(lp, ref, &d, err);
    if (r < 0)
        return r;
    if (d.cg.version == 0)
        r = lb_error_set(err, -ENOSYS, "sandbox '%s' has no cgroup to freeze", ref->id);
    else
        r = cgroup_set_frozen(&d.cg, frozen, FREEZE_TIMEOUT_MS, err);
    local_desc_release(&d);
    return r;
}

static int local_pause(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                       struct lb_error *err)
{
    return set_frozen(p, ref, true, err);
}

static int local_resume(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                        struct lb_error *err)
{
    return set_frozen(p, ref, false, err);
}

static int local_endpoint(struct lb_provider *p, const struct lb_sandbox_ref *ref, int port,
                          char **url_out, struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    struct local_desc d;
    int r;

    if (!ref || !local_id_is_valid(ref->id))
        return lb_error_set(err, -EINVAL, "invalid sandbox id");
    /* as a stop of the same id does: a relay made now is closed by any later stop, and none
     * is made for a sandbox a stop just removed */
    r = local_stopping_enter(lp, ref->id, clock_mono_ms() + 5000);
    if (r == -ETIMEDOUT)
        return lb_error_set(err, -EREMOTEIO, "a stop of sandbox '%s' is under way", ref->id);
    if (r < 0)
        return lb_error_set(err, r, "out of memory");
    r = local_desc_load_running(lp, ref, &d, err);
    if (r == 0) {
        if (d.net.mode == LOCAL_NET_NONE)
            r = local_relay_endpoint(lp, ref->id, &d, port, url_out, err);
        else
            r = local_net_endpoint(&d.net, port, url_out, err);
        local_desc_release(&d);
    }
    local_stopping_leave(lp, ref->id);
    return r;
}

static void local_destroy(struct lb_provider *p)
{
    struct local_provider *lp = (struct local_provider *)p;

    if (!lp)
        return;
    local_removed_stop(lp);
    local_reset_spare_stop(lp);
    local_clean_ns_close(lp);
    local_relay_destroy(lp);
    local_net_destroy(lp);
    cgroup_host_release(&lp->cg);
    free(lp->stopping); /* empty: no stop runs once the provider is destroyed */
    local_begun_release(lp);
    local_exec_gates_release(lp);
    pthread_cond_destroy(&lp->stopped);
    pthread_mutex_destroy(&lp->lock);
    pthread_mutex_destroy(&lp->stop_lock);
    pthread_mutex_destroy(&lp->uid_lock);
    free((void *)lp->uid_used);
    char **const strings[] = {&lp->claim_id,   &lp->sandboxes_dir,  &lp->state_dir,
                              &lp->bwrap_path, &lp->supervise_path, &lp->images_dir,
                              &lp->data_dir};

    mem_free_strings(strings, sizeof(strings) / sizeof(strings[0]));
    seccomp_filter_release(&lp->seccomp);
    free(lp);
}

/* Everything but GPUs and terminals; no disk limit where workdirs are plain directories. */
static void local_caps(struct lb_provider *p, struct lb_provider_caps *out)
{
    const struct local_provider *lp = (const struct local_provider *)p;

    *out = (struct lb_provider_caps){
        .network_modes = LB_NET_LOOPBACK | LB_NET_NAT | LB_NET_MODEL_ONLY | LB_NET_MODEL_AND_TOOLS,
        .cpu_limit = true,
        .memory_limit = true,
        .pids_limit = true,
        .disk_limit = lp->storage != LOCAL_STORAGE_DIR,
        .images = true,
        .users = true,
        .pause = true,
        .endpoints = true,
        .pass_fd = true,
        .pty = true, /* lendbox-supervise --pty-launch with the session directory as pass fd */
        .exclusive = true,
        .trusted_view = true,
        .snapshot = true,
        .reset = true,
        .image_store = true,
    };
}

static const struct lb_provider_ops local_ops = {
    .name = "local",
    .version = LB_PROVIDER_OPS_VERSION,
    .caps = local_caps,
    .create = local_create,
    .stop = local_stop,
    .status = local_status,
    .exec = local_exec,
    .file_write = local_file_write,
    .upload_begin = local_upload_begin,
    .upload_commit = local_upload_commit,
    .upload_abort = local_upload_abort,
    .upload_error = local_upload_error,
    .upload_reserve = local_upload_reserve,
    .file_open = local_file_open,
    .list = local_list,
    .pause = local_pause,
    .resume = local_resume,
    .snapshot = local_snapshot,
    .reset_in_place = local_reset,
    .hand_over = local_hand_over,
    .endpoint = local_endpoint,
    .oom_kills = local_oom_kills,
    .end_execs = local_end_execs,
    .defer_cleanup = local_defer_cleanup,
    .stop_begin = local_stop_begin,
    .destroy = local_destroy,
    .usage = local_usage,
    .archive_put = local_archive_put,
    .archive_get = local_archive_get,
};

/* ---- construction ---------------------------------------------------------------------- */

/* name with '/' must be executable as is; else the first executable match in $PATH. */
static char *find_program(const char *name)
{
    const char *path = getenv("PATH");
    char buf[4352];

    if (strchr(name, '/'))
        return access(name, X_OK) == 0 ? realpath(name, NULL) : NULL;
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t n = strcspn(path, ":");

        if (n > 0 && n < sizeof(buf) - 256) {
            snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, path, name);
            if (access(buf, X_OK) == 0)
                return realpath(buf, NULL);
        }
        path += n;
        if (*path == ':')
            path++;
    }
    return NULL;
}

/* bwrap runs as the sandbox's uid and resolves every bind source with realpath(), also
 * the /proc/self/fd/N of --bind-fd: each directory above path must be searchable by others. */
static int check_searchable(const char *path, struct lb_error *err)
{
    char buf[4352];
    char *slash;

    snprintf(buf, sizeof(buf), "%s", path);
    while ((slash = strrchr(buf, '/'))) {
        struct stat st;

        slash[slash == buf ? 1 : 0] = '\0';
        if (stat(buf, &st) < 0 || !(st.st_mode & S_IXOTH))
            return lb_error_set(err, -EINVAL,
                                "'%s' must be searchable by other users (o+x): bwrap runs as "
                                "the sandbox's uid and has to reach '%s'",
                                buf, path);
        if (slash == buf)
            break;
    }
    return 0;
}

/* local.storage and local.data_dir. tmpfs needs nothing on the host. dir makes the data dir
 * (0711: bwrap, as each sandbox's uid, must reach <data_dir>/<id>; nobody can list it) and
 * warns when it shares a file system with the state dir. */
static int setup_storage(struct local_provider *lp, const struct lb_local_config *cfg,
                         struct lb_error *err)
{
    char def[4352], child[4352];
    struct stat a, b;
    const char *dir;

    if (!cfg->storage || strcmp(cfg->storage, "tmpfs") == 0) {
        lp->storage = LOCAL_STORAGE_TMPFS;
        log_info("local provider: each sandbox's workdir is a tmpfs of its resources.disk_mib");
        return 0;
    }
    if (strcmp(cfg->storage, "dir") != 0)
        return lb_error_set(err, -EINVAL, "local.storage must be tmpfs or dir, not '%s'",
                            cfg->storage);
    lp->storage = LOCAL_STORAGE_DIR;
    snprintf(def, sizeof(def), "%s/data", lp->state_dir);
    dir = cfg->data_dir ? cfg->data_dir : def;
    if (mkdir(dir, 0711) < 0 && errno != EEXIST)
        return lb_error_set(err, -EREMOTEIO, "cannot make data dir '%s': %s", dir, strerror(errno));
    lp->data_dir = realpath(dir, NULL);
    if (!lp->data_dir || strlen(lp->data_dir) > 2048)
        return lb_error_set(err, -EREMOTEIO,
                            "cannot resolve data dir '%s' (or it is over 2048 bytes)", dir);
    if (chmod(lp->data_dir, 0711) < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot chmod data dir '%s': %s", lp->data_dir,
                            strerror(errno));
    snprintf(child, sizeof(child), "%s/sbx", lp->data_dir);
    if (check_searchable(child, err) < 0)
        return -EINVAL;
    if (stat(lp->state_dir, &a) == 0 && stat(lp->data_dir, &b) == 0 && a.st_dev == b.st_dev)
        log_warn("local.data_dir '%s' is on the state dir's file system: a sandbox that fills its "
                 "workdir fills the records' disk too (stops still finish on the store's "
                 "reserve); give it a file system of its own",
                 lp->data_dir);
    log_info("local provider: sandbox workdirs are directories under %s (no per-sandbox quota)",
             lp->data_dir);
    return 0;
}

/* Sandboxes run lendbox-supervise from a copy the daemon makes at start in its own state dir,
 * owned by root with mode 0711 (exec-only): a binary its user cannot read is non-dumpable from
 * its exec on, so no sandbox process can ptrace it or take its descriptors in the instant before
 * its own PR_SET_DUMPABLE call (see src/supervisor/supervise.c). Copying does not depend on how
 * the installed file's mode was set (a build tree's 0755, a packager's 0755). The copy replaces
 * the last one by rename: running sandboxes keep the inode they were started with. On success
 * *path is replaced by the copy's path (malloc'd). */
static int install_private_supervisor(const char *state_dir, char **path, struct lb_error *err)
{
    char *dst = NULL, *tmp = NULL;
    int in = -1, out = -1, r = 0;
    struct stat st;

    if (asprintf(&dst, "%s/lendbox-supervise", state_dir) < 0) {
        dst = NULL;
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    if (asprintf(&tmp, "%s/.lendbox-supervise.tmp", state_dir) < 0) {
        tmp = NULL;
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    in = open(*path, O_RDONLY | O_CLOEXEC);
    if (in < 0 || fstat(in, &st) < 0 || !S_ISREG(st.st_mode)) {
        r = lb_error_set(err, -EREMOTEIO, "cannot read '%s': %s", *path, strerror(errno));
        goto out;
    }
    (void)unlink(tmp);
    out = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0700);
    if (out < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot create '%s': %s", tmp, strerror(errno));
        goto out;
    }
    /* read/write, not copy_file_range: that answers EXDEV across file system types */
    for (;;) {
        char buf[65536];
        ssize_t n = read(in, buf, sizeof(buf)), w = 0;

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = lb_error_set(err, -EREMOTEIO, "cannot read '%s': %s", *path, strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        while (w < n) {
            ssize_t k = write(out, buf + w, (size_t)(n - w));

            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0) {
                r = lb_error_set(err, -EREMOTEIO, "cannot write '%s': %s", tmp, strerror(errno));
                goto out;
            }
            w += k;
        }
    }
    if (fchown(out, 0, 0) < 0 || fchmod(out, 0711) < 0 || close(out) < 0) {
        out = -1;
        r = lb_error_set(err, -EREMOTEIO, "cannot make '%s' root-owned and exec-only: %s", tmp,
                         strerror(errno));
        goto out;
    }
    out = -1;
    if (rename(tmp, dst) < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot rename '%s' to '%s': %s", tmp, dst,
                         strerror(errno));
        goto out;
    }
    free(*path);
    *path = dst;
    dst = NULL;
out:
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    if (r < 0 && tmp)
        (void)unlink(tmp);
    free(tmp);
    free(dst);
    return r;
}

/* Has this process CAP_SYS_CHROOT in its effective set? */
static bool has_cap_sys_chroot(void)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];

    memset(data, 0, sizeof(data));
    if (syscall(SYS_capget, &hdr, data) < 0)
        return false;
    return (data[CAP_SYS_CHROOT / 32].effective & (1U << (CAP_SYS_CHROOT % 32))) != 0;
}

int provider_local_new(const struct lb_local_config *cfg, struct lb_provider **out,
                       struct lb_error *err)
{
    struct local_provider *lp;
    json_t *all = NULL;
    int r;

    if (!cfg || !cfg->state_dir || !cfg->supervise_path || cfg->uid_base == 0 ||
        cfg->uid_count == 0 || cfg->uid_count > UID_COUNT_MAX ||
        (uint64_t)cfg->uid_base + (uint64_t)cfg->uid_count * LOCAL_SLOT_IDS > INT32_MAX)
        return lb_error_set(err, -EINVAL,
                            "local provider: state_dir, supervise_path and a uid range "
                            "(1 <= uid_count <= %u slots of %u ids, uid_base + uid_count * %u "
                            "<= 2^31 - 1) are required",
                            UID_COUNT_MAX, LOCAL_SLOT_IDS, LOCAL_SLOT_IDS);
    if (cfg->uid_base % LOCAL_SLOT_IDS != 0)
        return lb_error_set(err, -EINVAL,
                            "[local] uid_base = %" PRIu32 " is not a multiple of %u (slots are "
                            "claimed host-wide by their first id): use %" PRIu32 " or %" PRIu32
                            ", or 0 for a derived one",
                            cfg->uid_base, LOCAL_SLOT_IDS,
                            cfg->uid_base - cfg->uid_base % LOCAL_SLOT_IDS,
                            cfg->uid_base - cfg->uid_base % LOCAL_SLOT_IDS + LOCAL_SLOT_IDS);
    lp = calloc(1, sizeof(*lp));
    if (!lp)
        return lb_error_set(err, -ENOMEM, "out of memory");
    lp->base.ops = &local_ops;
    lp->uid_base = cfg->uid_base;
    lp->uid_count = cfg->uid_count;
    lp->create_timeout_ms = cfg->create_timeout_ms > 0 ? cfg->create_timeout_ms : 10000;
    lp->tmp_size_mib = cfg->tmp_size_mib > 0 ? cfg->tmp_size_mib : 1024;
    lp->sandbox_nofile = cfg->sandbox_nofile > 0 ? cfg->sandbox_nofile : 1024;
    lp->reset_in_place = cfg->reset_in_place;
    pthread_mutex_init(&lp->lock, NULL);
    pthread_mutex_init(&lp->stop_lock, NULL);
    pthread_mutex_init(&lp->uid_lock, NULL);
    clock_cond_init_mono(&lp->stopped); /* local_stopping_enter's deadlines are monotonic */
    lp->uid_used = calloc((cfg->uid_count + 7) / 8, sizeof(*lp->uid_used));
    if (!lp->uid_used) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto fail;
    }

    lp->bwrap_path = find_program(cfg->bwrap_path ? cfg->bwrap_path : "bwrap");
    if (!lp->bwrap_path) {
        r = lb_error_set(err, -ENOENT, "bubblewrap ('%s') not found",
                         cfg->bwrap_path ? cfg->bwrap_path : "bwrap");
        goto fail;
    }
    lp->supervise_path = find_program(cfg->supervise_path);
    if (!lp->supervise_path || !strchr(cfg->supervise_path, '/')) {
        r = lb_error_set(err, -ENOENT, "lendbox-supervise ('%s') not found or not executable",
                         cfg->supervise_path);
        goto fail;
    }
    if (mkdir(cfg->state_dir, 0755) < 0 && errno != EEXIST) {
        r = lb_error_set(err, -EREMOTEIO, "cannot make '%s': %s", cfg->state_dir, strerror(errno));
        goto fail;
    }
    lp->state_dir = realpath(cfg->state_dir, NULL);
    if (!lp->state_dir || strlen(lp->state_dir) > 2048 ||
        asprintf(&lp->sandboxes_dir, "%s/sandboxes", lp->state_dir) < 0) {
        lp->sandboxes_dir = NULL;
        r = lb_error_set(err, -EREMOTEIO, "cannot resolve '%s' (or its path is over 2048 bytes)",
                         cfg->state_dir);
        goto fail;
    }
    if ((mkdir(lp->sandboxes_dir, 0711) < 0 && errno != EEXIST) ||
        chmod(lp->sandboxes_dir, 0711) < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot make '%s': %s", lp->sandboxes_dir,
                         strerror(errno));
        goto fail;
    }
    r = check_searchable(lp->sandboxes_dir, err);
    if (r == 0)
        r = local_claims_start(lp, err);
    if (r == 0)
        r = install_private_supervisor(lp->state_dir, &lp->supervise_path, err);
    if (r == 0)
        r = check_searchable(lp->supervise_path, err);
    if (r == 0)
        r = setup_storage(lp, cfg, err);
    if (r < 0)
        goto fail;
    if (!cfg->seccomp_off) {
        r = seccomp_filter_build(cfg->seccomp_deny, &lp->seccomp, err);
        if (r < 0)
            goto fail;
    } else {
        log_warn("the seccomp filter is off ([security] seccomp = no): sandbox processes may "
                 "use keyctl, ptrace, bpf, nested user namespaces and the rest of the kernel");
    }
    if (cfg->images_dir) {
        lp->images_dir = realpath(cfg->images_dir, NULL);
        if (!lp->images_dir)
            log_warn("images dir '%s' is unusable (%s), only image 'host' is available",
                     cfg->images_dir, strerror(errno));
    }
    if (local_relay_init(lp) < 0) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    local_keyrings_probe();
    r = local_net_init(lp, &cfg->net, err);
    if (r < 0)
        goto fail;
    r = cgroup_host_detect(&lp->cg, cfg->cgroup_parent);
    if (r < 0) {
        r = lb_error_set(err, r, "out of memory");
        goto fail;
    }
    if (lp->cg.version == 0)
        log_warn("no usable cgroups: sandboxes get no resource limits and cannot be paused");
    /* sandboxes of an earlier run keep their uids */
    r = local_list(&lp->base, &all, err);
    if (r < 0)
        goto fail;
    local_claims_sweep(lp, all);
    json_decref(all);
    /* entering a mount namespace from outside its user namespace (the clean one bwrap starts
     * in, a sandbox's at an in-place reset) takes CAP_SYS_CHROOT besides CAP_SYS_ADMIN: a
     * daemon without it (a unit's CapabilityBoundingSet) does neither */
    if (!has_cap_sys_chroot()) {
        log_warn("lendboxd lacks CAP_SYS_CHROOT: sandboxes start in its own mount namespace%s",
                 lp->reset_in_place ? ", and every reset is a stop and a create" : "");
        lp->reset_in_place = false;
    } else {
        (void)local_clean_ns_open(lp); /* no harm without it: bwrap starts in ours */
    }
    if (lp->reset_in_place) {
        r = local_reset_spare_start(lp);
        if (r < 0) /* no harm: each in-place reset execs its own helper */
            log_warn("cannot start the spare reset helper's thread: %s", strerror(-r));
    }
    r = local_removed_start(lp);
    if (r < 0) /* no harm: the directories stay until a later start removes them */
        log_warn("cannot start removing the stopped sandboxes' directories of an earlier run: %s",
                 strerror(-r));
    *out = &lp->base;
    return 0;

fail:
    local_destroy(&lp->base);
    return r;
}
