/*
 * lxd.c - the LXD provider (see lxd.h): its engine hooks (engine.h) for instances (create,
 * start, remove, state, freeze, list), the ops table, construction and the start-up checks
 * (server, members, pool). The API transport is in lxd_api.c, the exec hooks in lxd_exec.c,
 * the files API in lxd_files.c.
 */
#include "provider/lxd/lxd_internal.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/fault.h"
#include "util/log.h"
#include "util/metrics.h"
#include "util/token.h"

#define SMALL_BODY_BYTES (4 * 1024 * 1024)
#define SUPERVISE_MAX_BYTES (64 * 1024 * 1024)

/* The API extensions this provider uses (GET /1.0 "api_extensions"). */
static const char *const required_extensions[] = {
    "instances",                     /* /1.0/instances */
    "container_exec_recording",      /* exec record-output */
    "container_exec_user_group_cwd", /* exec user/group */
    "file_append",                   /* X-LXD-write: overwrite */
    "api_filtering",                 /* list by config.user.lendbox.instance */
    "id_map_base",                   /* security.idmap.base: lendbox picks each id range */
};

static json_t *new_descriptor(const char *name, const char *location, const char *workdir,
                              uint32_t id_base)
{
    json_t *d = json_pack("{s:s,s:s,s:s}", "name", name, "location", location ? location : "",
                          "workdir", workdir ? workdir : "/workspace");

    if (d && id_base && json_object_set_new(d, "id_base", json_integer(id_base)) < 0) {
        json_decref(d);
        return NULL;
    }
    return d;
}

/* A cluster with no Online member (or a target member that is not Online) cannot take a new
 * instance: -EREMOTEIO at once rather than after LXD's own waits. The member this daemon talks
 * to answered this very call: it counts as Online whatever the list says (under load, while
 * another member is dead, its own heartbeat can lag and the list show it Offline). */
static int check_members(struct lb_lxd *l, struct lb_error *err)
{
    json_t *j = NULL, *m;
    size_t i, online = 0;
    bool target_member = l->target && l->target[0] != '@', target_online = false;
    int r;

    if (!l->clustered)
        return 0;
    r = engine_get_json(&l->eng, "/1.0/cluster/members?recursion=1", "cluster member list", 0, &j,
                        err);
    if (r < 0)
        return r == -ENOENT ? -EREMOTEIO : r;
    json_array_foreach(json_object_get(j, "metadata"), i, m) {
        const char *st = json_string_value(json_object_get(m, "status")) ?: "";
        const char *name = json_string_value(json_object_get(m, "server_name")) ?: "";

        if (strcmp(st, "Online") != 0 && (!l->member[0] || strcmp(name, l->member) != 0))
            continue;
        online++;
        if (target_member && strcmp(name, l->target) == 0)
            target_online = true;
    }
    if (online == 0)
        r = lb_error_set(err, -EREMOTEIO, "the LXD cluster has no Online member");
    else if (target_member && !target_online)
        r = lb_error_set(err, -EREMOTEIO, "LXD cluster member '%s' (lxd.target) is not Online",
                         l->target);
    json_decref(j);
    return r;
}

static int check_network(struct lb_lxd *l, const struct lb_sandbox_spec *spec, struct lb_error *err)
{
    int r = engine_check_network(&l->eng, spec, err);

    if (r < 0)
        return r;
    if (spec->resources.disk_mib > 0 && !l->pool_has_quota)
        return lb_error_set(err, -EOPNOTSUPP,
                            "resources.disk_mib cannot be enforced by the lxd provider: storage "
                            "pool '%s' has no quotas (driver dir)",
                            l->pool);
    return 0;
}

/* A path lendbox may write into raw.lxc (an lxc.mount.entry field): absolute, of
 * [A-Za-z0-9._+@-] components, none of them "." or "..", no "//", not "/" itself, short. Any
 * other (spaces, newlines, '#', '=') could end the entry and start another LXC key. */
static bool lxc_path_is_plain(const char *path)
{
    size_t n = strlen(path);

    if (n < 2 || n > 200 || path[0] != '/' || path[n - 1] == '/' ||
        strspn(path, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+@-/") != n ||
        strstr(path, "//") || strstr(path, "/./") || strstr(path, "/../"))
        return false;
    return strcmp(path + n - 2, "/.") != 0 && strcmp(path + n - 3, "/..") != 0;
}

/* raw.lxc: /tmp, /run and /dev/shm as tmpfs mounts of their own, so that they are not in the
 * root file system (a snapshot's copy of the root leaves them out) and start empty; each
 * bounded by disk_mib when the spec gives one (else by the instance's memory limit, which
 * their pages are charged to). With lxd.supervise_host_path, the supervisor bound read-only
 * from the member's host at LXD_SUPERVISE_PATH (no files API at a seed: it would start LXD's
 * file server in the instance, ~0.15 s) and the workdir made by LXC at the start ("create=dir"
 * of an entry that mounts nothing: "optional" lets its bind of "none" fail) when its path is
 * plain (hook_finish makes any other). Entries are mounted in order: the bind lands on /run's
 * tmpfs. 0, or -ENAMETOOLONG when size is too small. */
static int mounts_lxc(const struct lb_lxd *l, const struct lb_sandbox_spec *spec,
                      const char *workdir, char *buf, size_t size)
{
    char opt[64] = "";
    int n;

    if (spec->resources.disk_mib > 0)
        snprintf(opt, sizeof(opt), ",size=%lldm", (long long)spec->resources.disk_mib);
    n = snprintf(buf, size,
                 "lxc.mount.entry = tmpfs tmp tmpfs rw,nosuid,nodev,mode=1777%s,create=dir 0 0\n"
                 "lxc.mount.entry = tmpfs run tmpfs rw,nosuid,nodev,mode=755%s,create=dir 0 0\n"
                 "lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,mode=1777%s,create=dir 0 "
                 "0\n",
                 opt, opt, opt);
    if (l->supervise_host && n > 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n,
                      "lxc.mount.entry = %s %s none bind,ro,nosuid,nodev,create=file 0 0\n",
                      l->supervise_host, LXD_SUPERVISE_PATH + 1);
    if (l->supervise_host && lxc_path_is_plain(workdir) && n > 0 && (size_t)n < size) {
        n += snprintf(buf + n, size - (size_t)n,
                      "lxc.mount.entry = none %s none bind,optional,create=dir 0 0\n", workdir + 1);
    }
    return n > 0 && (size_t)n < size ? 0 : -ENAMETOOLONG;
}

/* The create request: from the image alias image, or (from_snapshot) a copy of the stopped
 * instance image that a snapshot made (lxd_snapshot.c), without its snapshot label; its own
 * id range from id_base (the slot prepare took). */
static json_t *create_body(struct lb_lxd *l, const char *id, const struct lb_sandbox_spec *spec,
                           const char *image, bool from_snapshot, uint32_t id_base)
{
    const struct lb_resources *res = &spec->resources;
    json_t *conf = json_pack("{s:s,s:s,s:s}", LXD_LABEL_INSTANCE, l->eng.instance,
                             LXD_LABEL_SANDBOX, id, "security.idmap.isolated", "true");
    json_t *root = json_pack("{s:s,s:s,s:s}", "type", "disk", "path", "/", "pool", l->pool);
    json_t *source;
    char v[64], mounts[2048];

    if (!conf || !root)
        goto fail;
    if (id_base) {
        snprintf(v, sizeof(v), "%lu", (unsigned long)id_base);
        json_object_set_new(conf, "security.idmap.base", json_string(v));
        snprintf(v, sizeof(v), "%u", IDCLAIM_SLOT_IDS);
        json_object_set_new(conf, "security.idmap.size", json_string(v));
    }
    if (mounts_lxc(l, spec, spec->workdir ? spec->workdir : "/workspace", mounts, sizeof(mounts)) <
        0)
        goto fail;
    json_object_set_new(conf, "raw.lxc", json_string(mounts));
    /* a copy takes the source's config but for what the request names: "" unsets its
     * snapshot label and the limits of the sandbox it was taken from (this spec's, if any,
     * are set below) */
    if (from_snapshot) {
        static const char *const unset[] = {LXD_LABEL_SNAPSHOT, "limits.cpu.allowance",
                                            "limits.memory", "limits.memory.swap",
                                            "limits.processes"};

        for (size_t i = 0; i < sizeof(unset) / sizeof(unset[0]); i++)
            json_object_set_new(conf, unset[i], json_string(""));
    }
    if (res->cpu > 0) {
        snprintf(v, sizeof(v), "%lldms/100ms", (long long)(res->cpu * 100 + 0.5));
        json_object_set_new(conf, "limits.cpu.allowance", json_string(v));
    }
    if (res->memory_mib > 0) {
        snprintf(v, sizeof(v), "%lldMiB", (long long)res->memory_mib);
        json_object_set_new(conf, "limits.memory", json_string(v));
        json_object_set_new(conf, "limits.memory.swap", json_string("false"));
    }
    if (res->pids > 0) {
        snprintf(v, sizeof(v), "%lld", (long long)res->pids);
        json_object_set_new(conf, "limits.processes", json_string(v));
    }
    if (res->disk_mib > 0) {
        snprintf(v, sizeof(v), "%lldMiB", (long long)res->disk_mib);
        json_object_set_new(root, "size", json_string(v));
    }
    source = from_snapshot
                 ? json_pack("{s:s,s:s,s:b}", "type", "copy", "source", image, "instance_only", 1)
                 : json_pack("{s:s,s:s}", "type", "image", "alias", image);
    if (!source)
        goto fail;
    /* no profile: no NIC whatever the default profile holds; the root disk is ours */
    return json_pack("{s:s,s:s,s:o,s:[],s:o,s:{s:o}}", "name", id, "type", "container", "source",
                     source, "profiles", "config", conf, "devices", "root", root);
fail:
    json_decref(conf);
    json_decref(root);
    return NULL;
}

static int hook_prepare(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                        const struct lb_sandbox_spec *spec, struct engine_instance *inst,
                        struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)e;
    int r;

    snprintf(inst->name, sizeof(inst->name), "%s", ref->id);
    r = check_network(l, spec, err);
    if (r == 0)
        r = check_members(l, err);
    if (r == 0 && idslots_alloc(&l->idmap, &inst->id_base) < 0)
        r = lb_error_set(err, -EUSERS,
                         "no free id range for a new LXD instance: all %lu slots of lxd.idmap "
                         "are in use (here or by another lendboxd on this host)",
                         (unsigned long)l->idmap.count);
    return r;
}

/* Did a create's POST itself fail because LXD could not dial the member it placed the
 * instance on ("Unable to connect to: ADDR", "connection refused", "no route to host"), or
 * because it found no member to place it on (while a member is dead, the cluster's own
 * heartbeats can lag and leave none Online: "No suitable cluster member could be found")?
 * Then nothing was made. */
static bool create_not_made(const struct lb_error *e)
{
    return strncmp(e->message, "LXD: POST /1.0/instances", 24) == 0 &&
           (strstr(e->message, "Unable to connect") || strstr(e->message, "connection refused") ||
            strstr(e->message, "no route to host") ||
            strstr(e->message, "No suitable cluster member"));
}

/* A create's POST that failed on the way to the member LXD placed it on: not dialled (above),
 * or cut off after it was sent ("i/o timeout", "Missing event connection": the member may have
 * taken it, so that instance may exist). Worth once more on another member. A failure of the
 * operation's wait (the member died while it created) is not this. */
static bool create_unreachable(const struct lb_error *e)
{
    return create_not_made(e) ||
           (strncmp(e->message, "LXD: POST /1.0/instances", 24) == 0 &&
            (strstr(e->message, "i/o timeout") || strstr(e->message, "Missing event connection")));
}

/* Another member for a create that LXD placed on a member it cannot reach (one that died: the
 * cluster marks it offline only after its heartbeats are missed, cluster.offline_threshold,
 * 20 s by default, and places new instances on it until then): an Online member whose address
 * failure does not name, taken in turn, into out; when failure names no member (LXD found none
 * to place it on), the member this daemon talks to, which just answered. 0, -ENOENT when there
 * is none, or engine_get_json's errors. */
static int create_other_member(struct lb_lxd *l, const char *failure, char *out, size_t size,
                               struct lb_error *err)
{
    static atomic_uint turn;
    json_t *j = NULL, *m;
    const char *cand[64];
    size_t i, n = 0;
    bool named = false;
    int r;

    r = engine_get_json(&l->eng, "/1.0/cluster/members?recursion=1", "cluster member list", 0, &j,
                        err);
    if (r < 0)
        return r;
    json_array_foreach(json_object_get(j, "metadata"), i, m) {
        const char *name = json_string_value(json_object_get(m, "server_name"));
        const char *url = json_string_value(json_object_get(m, "url")) ?: "";
        const char *addr = strstr(url, "://") ? strstr(url, "://") + 3 : url;

        if (*addr && strstr(failure, addr)) {
            named = true;
            continue;
        }
        if (name && *name && n < sizeof(cand) / sizeof(cand[0]) &&
            strcmp(json_string_value(json_object_get(m, "status")) ?: "", "Online") == 0)
            cand[n++] = name;
    }
    if (!named && l->member[0])
        snprintf(out, size, "%s", l->member);
    else if (!named || n == 0)
        r = -ENOENT;
    else
        snprintf(out, size, "%s", cand[atomic_fetch_add(&turn, 1) % n]);
    json_decref(j);
    return r;
}

static int hook_make(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                     const struct lb_sandbox_spec *spec, const char *image, int64_t timeout_ms,
                     struct engine_instance *inst, struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)e;
    char path[512], enc_target[200] = "", holder_at[128] = "";
    const char *target = l->target;
    struct lb_error cerr = {0};
    json_t *body, *op = NULL;
    int r;

    if (inst->from_snapshot && !target && l->clustered) {
        /* a copy names where it goes (LXD 5.0.2 places none): beside the snapshot's instance,
         * so the copy stays on one member */
        r = lxd_snapshot_location(l, image, holder_at, sizeof(holder_at), err);
        if (r < 0)
            return r;
        target = holder_at[0] ? holder_at : NULL;
    }
    body = create_body(l, ref->id, spec, image, inst->from_snapshot, inst->id_base);
    if (!body)
        return lb_error_set(err, -ENOMEM, "out of memory");
    if (target) {
        char *enc = curl_easy_escape(NULL, target, 0);

        snprintf(enc_target, sizeof(enc_target), "?target=%s", enc ? enc : "");
        curl_free(enc);
    }
    snprintf(path, sizeof(path), "/1.0/instances%s", enc_target);
    r = lxd_async(l, NULL, "POST", path, body, timeout_ms, &op, &cerr);
    if (r < 0 && !target && l->clustered && create_unreachable(&cerr)) {
        /* placed by the cluster on a member it cannot reach: once more on another member (a
         * pinned lxd.target is never moved) */
        char other[128], *enc;
        struct lb_error merr = {0};

        /* a POST cut off after it was sent may have made the instance on that member: its
         * removal comes before its id range is given back, whatever the retry does */
        if (!create_not_made(&cerr))
            inst->maybe_made = true;
        if (create_other_member(l, cerr.message, other, sizeof(other), &merr) == 0 &&
            (enc = curl_easy_escape(NULL, other, 0))) {
            log_warn_sbx(ref->id, "lxd: create placed on an unreachable member (%s); on member %s",
                         cerr.message, other);
            snprintf(path, sizeof(path), "/1.0/instances?target=%s", enc);
            curl_free(enc);
            lb_error_clear(&cerr);
            r = lxd_async(l, NULL, "POST", path, body, timeout_ms, &op, &cerr);
        }
    }
    json_decref(body);
    if (r == 0) {
        /* the create's operation ran on the member that holds the instance: its location
         * spares finish a lookup of the instance ("" when LXD named none: finish looks) */
        const char *at = json_string_value(json_object_get(op, "location"));

        if (at && *at && strlen(at) < sizeof(inst->handle))
            snprintf(inst->handle, sizeof(inst->handle), "%s", at);
        json_decref(op);
        return 0;
    }
    /* unless LXD refused the request (4xx) or could not reach a member for it, the instance
     * may exist: its operation failed, or the member died while it took the POST ("EOF") */
    if (r != -ENOENT && !create_not_made(&cerr) && !strstr(cerr.message, "(HTTP 4"))
        inst->maybe_made = true;
    if (strstr(cerr.message, "already exists"))
        return -EEXIST;
    if (inst->from_snapshot && r == -ENOENT)
        return lb_error_set(err, -LB_E_IMAGE_NOT_FOUND,
                            "LXD has no instance '%s' of the snapshot any more: %s", image,
                            cerr.message);
    if (r == -ENOENT || strstr(cerr.message, "mage alias not found") ||
        strstr(cerr.message, "mage not found"))
        return lb_error_set(err, -LB_E_IMAGE_NOT_FOUND, "LXD has no image alias '%s': %s", image,
                            cerr.message);
    return lb_error_keep(err, r, "%s", cerr.message);
}

/* A create retried after a crash: the instance that exists keeps its own range, so the slot
 * prepare took goes back and the instance's is marked. */
static int hook_find_own(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                         struct engine_instance *inst, struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)e;
    uint32_t id_base = 0;
    int r = lxd_find_own(l, ref->id, inst->handle, sizeof(inst->handle), &id_base, err);

    if (r == 0 && id_base != inst->id_base) {
        lxd_idmap_mark(l, id_base);
        lxd_idmap_free(l, inst->id_base);
        inst->id_base = id_base;
    }
    return r;
}

static int hook_start(struct lb_engine *e, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                      struct engine_instance *inst, struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)e;
    json_t *start = json_pack("{s:s}", "action", "start");
    struct lb_error serr = {0};
    char path[512];
    int r;

    if (!start)
        return lb_error_set(err, -ENOMEM, "out of memory");
    snprintf(path, sizeof(path), "/1.0/instances/%s/state", ref->id);
    r = lxd_async(l, NULL, "PUT", path, start, timeout_ms, NULL, &serr);
    /* a start that fails in "forkstart" (LXD 5.0.2 handing a range newuidmap refuses, when it
     * chooses one: an instance of an older version, which has no security.idmap.base) or
     * meets another operation on the instance is tried again */
    for (int i = 0;
         i < 3 && r < 0 && (strstr(serr.message, "forkstart") || strstr(serr.message, "is busy"));
         i++) {
        /* after a failed forkstart LXD stops the instance: wait for that too */
        log_warn_sbx(ref->id, "lxd: start failed (%s); starting again", serr.message);
        lb_error_clear(&serr);
        usleep((useconds_t)(500000 * (i + 1)));
        r = lxd_async(l, NULL, "PUT", path, start, timeout_ms, NULL, &serr);
    }
    json_decref(start);
    if (r < 0 && strstr(serr.message, "already running"))
        r = 0;
    else if (r < 0)
        r = lb_error_keep(err, r, "%s", serr.message);
    return r;
}

/* Once it runs: where it runs (when not known yet), then the supervisor pushed into it and
 * the workdir made; with lxd.supervise_host_path both came with the start (mounts_lxc), but a
 * workdir whose path raw.lxc cannot carry. */
static int hook_finish(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                       const struct lb_sandbox_spec *spec, struct engine_instance *inst,
                       json_t **out, struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)e;
    const char *workdir = spec->workdir ? spec->workdir : "/workspace";
    struct lb_sandbox_ref own = {.id = ref->id};
    json_t *desc;
    int r = 0;

    if (!inst->handle[0] &&
        lxd_find_own(l, ref->id, inst->handle, sizeof(inst->handle), NULL, err) < 0)
        return -EREMOTEIO;
    desc = new_descriptor(ref->id, inst->handle, workdir, inst->id_base);
    if (!desc)
        return lb_error_set(err, -ENOMEM, "out of memory");
    own.descriptor = desc;
    /* /run is the instance's own tmpfs (mounts_lxc) and the workdir's parent is most often
     * there too: one request per directory, not one per path component */
    if (!l->supervise_host) {
        r = lxd_make_dir_likely(l, &own, LXD_SUPERVISE_DIR, err);
        if (r == 0)
            r = lxd_put_file(l, &own, LXD_SUPERVISE_PATH, -1, l->supervise_data, l->supervise_len,
                             0755, err);
    }
    if (r == 0 && (!l->supervise_host || !lxc_path_is_plain(workdir)))
        r = lxd_make_dir_likely(l, &own, workdir, err);
    if (r < 0) {
        json_decref(desc);
        return r;
    }
    *out = desc;
    return 0;
}

static void hook_rollback(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                          const struct engine_instance *inst, bool made)
{
    struct lb_lxd *l = (struct lb_lxd *)e;
    struct lb_error rerr = {0};

    /* a create whose outcome is unknown: removed like a made one (404 is fine), else its
     * range could go to another instance while this one runs with it */
    if ((made || inst->maybe_made) &&
        lxd_remove_instance(l, ref->id, inst->handle, l->call_timeout_ms * 2, true, &rerr) < 0) {
        /* its range stays taken while the instance may still run (the stop's retry frees it) */
        log_warn_sbx(ref->id, "lxd: cannot remove instance %s of a failed create: %s", ref->id,
                     rerr.message);
        return;
    }
    lxd_idmap_free(l, inst->id_base);
}

static int hook_remove(struct lb_engine *e, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                       struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)e;
    uint32_t id_base = lxd_idmap_of_descriptor(ref->descriptor);
    struct lb_error ferr = {0};
    char where[128];
    int r;

    /* no descriptor (a failed create whose instance may exist): its range from LXD, to give
     * back once the instance is gone */
    if (!id_base && !ref->descriptor)
        (void)lxd_find_own(l, ref->id, where, sizeof(where), &id_base, &ferr);
    r = lxd_remove_instance(l, ref->id, lxd_member_of(ref), timeout_ms, true, err);
    /* the instance is gone: its range is free (a descriptor of an older version names none;
     * its slots are swept at the next start) */
    if (r == 0)
        lxd_idmap_free(l, id_base);
    return r;
}

static int hook_state(struct lb_engine *e, const struct lb_sandbox_ref *ref,
                      enum lb_sandbox_status *out, struct lb_error *err)
{
    return lxd_state((struct lb_lxd *)e, ref, out, err);
}

/* The usage hook: GET /1.0/instances/I/state on the instance's member. metadata.cpu.usage
 * (ns), memory.usage and memory.usage_peak (bytes; a peak of 0 is one LXD does not know, as
 * on cgroup v2 hosts without memory.peak), processes, disk.root.usage (bytes; absent where
 * the storage driver cannot tell, as on the dir driver without a quota). LXD counts no OOM
 * kills: oom_kills stays unknown. */
static int hook_usage(struct lb_engine *e, const struct lb_sandbox_ref *ref, struct lb_usage *out,
                      struct lb_error *err)
{
    struct lb_httpc_response resp;
    json_t *j = NULL, *md, *mem;
    char path[256];
    int64_t ns;
    int r;

    snprintf(path, sizeof(path), "/1.0/instances/%s/state", ref->id);
    r = lxd_call((struct lb_lxd *)e, lxd_member_of(ref), "GET", path, NULL, 0, &resp, err);
    if (r == 0 && resp.status != 200)
        r = lxd_answer_error(&resp, "instance state", err);
    if (r == 0) {
        j = httpc_response_json(&resp);
        if (!json_is_object(json_object_get(j, "metadata")))
            r = lb_error_set(err, -EREMOTEIO, "LXD: unreadable instance state");
    }
    httpc_response_release(&resp);
    if (r < 0)
        goto out;
    md = json_object_get(j, "metadata");
    mem = json_object_get(md, "memory");
    ns = engine_usage_figure(json_object_get(json_object_get(md, "cpu"), "usage"));
    out->cpu_s = ns < 0 ? -1 : (double)ns / 1e9;
    out->memory_bytes = engine_usage_figure(json_object_get(mem, "usage"));
    out->memory_peak_bytes = engine_usage_figure(json_object_get(mem, "usage_peak"));
    if (out->memory_peak_bytes == 0)
        out->memory_peak_bytes = -1;
    out->pids = engine_usage_figure(json_object_get(md, "processes"));
    out->disk_bytes = engine_usage_figure(
        json_object_get(json_object_get(json_object_get(md, "disk"), "root"), "usage"));
out:
    json_decref(j);
    return r;
}

static int hook_set_frozen(struct lb_engine *e, const struct lb_sandbox_ref *ref, bool freeze,
                           struct lb_error *err)
{
    json_t *body = json_pack("{s:s}", "action", freeze ? "freeze" : "unfreeze");
    char path[256];
    int r;

    if (!body)
        return lb_error_set(err, -ENOMEM, "out of memory");
    snprintf(path, sizeof(path), "/1.0/instances/%s/state", ref->id);
    r = lxd_async((struct lb_lxd *)e, lxd_member_of(ref), "PUT", path, body, 0, NULL, err);
    json_decref(body);
    return r;
}

/* Every instance of this daemon, each one's id range marked in use; then the claims of ranges
 * no instance and no create under way accounts for are dropped (a crash between a removal and
 * its give-back). */
static int hook_list_raw(struct lb_engine *e, json_t **items_out, struct lb_error *err)
{
    struct lb_lxd *l = (struct lb_lxd *)e;
    json_t *j = NULL, *items, *c;
    size_t i;
    int r = lxd_list_labelled(e, LXD_LABEL_INSTANCE, e->instance, "instance list", &j, err);

    items = json_object_get(j, "metadata");
    if (r == 0 && !json_is_array(items))
        r = lb_error_set(err, -EREMOTEIO, "LXD: unreadable instance list");
    if (r == 0) {
        json_array_foreach(items, i, c) {
            json_t *conf = json_object_get(c, "config");

            if (strcmp(json_string_value(json_object_get(conf, LXD_LABEL_INSTANCE)) ?: "",
                       l->eng.instance) == 0)
                lxd_idmap_mark(l, lxd_idmap_of_config(conf));
        }
        if (l->idmap_ready)
            idslots_sweep(&l->idmap);
        *items_out = json_incref(items);
    }
    json_decref(j);
    return r;
}

static json_t *hook_list_entry(struct lb_engine *e, json_t *c, const char **id_out)
{
    struct lb_lxd *l = (struct lb_lxd *)e;
    json_t *conf = json_object_get(c, "config");
    const char *id = json_string_value(json_object_get(conf, LXD_LABEL_SANDBOX));
    const char *inst = json_string_value(json_object_get(conf, LXD_LABEL_INSTANCE));
    const char *name = json_string_value(json_object_get(c, "name"));

    /* the filter is LXD's; check again, and that the name is the sandbox id */
    if (!id || !inst || !name || strcmp(inst, l->eng.instance) != 0 || strcmp(name, id) != 0)
        return NULL;
    *id_out = id;
    return new_descriptor(id, json_string_value(json_object_get(c, "location")), NULL,
                          lxd_idmap_of_config(conf));
}

static void hook_release(struct lb_engine *e)
{
    struct lb_lxd *l = (struct lb_lxd *)e;

    lxd_cleanup_stop(l);
    free(l->url);
    free(l->target);
    free(l->supervise_data);
    free(l->supervise_host);
    if (l->idmap_ready)
        idslots_release(&l->idmap);
}

/* Beyond the engine's: activations' receipts through a file in the instance (receipt_file).
 * Not: users by name (LXD's exec takes numeric ids only, exec_uid), fd passing, exclusive
 * execs (the pushed supervisor and the receipt are files in the instance that its root can
 * rewrite, so a grading result could be forged); disk_mib only on a pool with quotas. */
static void hook_caps(struct lb_engine *e, struct lb_provider_caps *out)
{
    out->disk_limit = ((struct lb_lxd *)e)->pool_has_quota;
    out->receipt_file = true;
    /* a reset is a remove and a create under the same name: every process, mount and
     * namespace of the instance goes with it (lend/reset.c) */
    out->reset = true;
}

static int hook_call(struct lb_engine *e, const char *method, const char *path, const json_t *body,
                     int64_t timeout_ms, struct lb_httpc_response *resp, struct lb_error *err)
{
    return lxd_call((struct lb_lxd *)e, NULL, method, path, body, timeout_ms, resp, err);
}

static int hook_file_open(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *path,
                          int *fd_out, uint64_t *size_out, struct lb_error *err)
{
    return lxd_file_open(e, ref, path, fd_out, size_out, err);
}

static int hook_put_file(struct lb_engine *e, const struct lb_sandbox_ref *ref, const char *path,
                         int fd, const void *data, uint64_t len, int mode, struct lb_error *err)
{
    return lxd_put_file((struct lb_lxd *)e, ref, path, fd, data, len, mode, err);
}

static const struct engine_hooks lxd_hooks = {
    .name = "lxd",
    .noun = "instance",
    ENGINE_HOOKS_BY_NAME,
    .exec_check = lxd_exec_check,
    .exec_run = lxd_exec_run,
    .usage = hook_usage,
    .commit = lxd_commit,
    .snapshot_images = lxd_snapshot_images,
    .image_remove = lxd_image_remove,
    .archive_put = lxd_archive_put,
    .archive_get = lxd_archive_get,
    .call = hook_call,
    .answer_error = lxd_answer_error,
    .engine_label = "LXD",
};

/* GET /1.0: trusted, every extension we use; whether it is clustered. */
static int check_server(struct lb_lxd *l, struct lb_error *err)
{
    struct lb_httpc_response resp;
    json_t *j = NULL, *md, *exts;
    const char *auth;
    int r;

    r = lxd_call(l, NULL, "GET", "/1.0", NULL, 0, &resp, err);
    if (r < 0) {
        r = lb_error_keep(err, -EREMOTEIO, "cannot reach the LXD server at %s",
                          httpc_endpoint(l->eng.http));
        goto out;
    }
    j = json_loadb(resp.body.data, resp.body.len, 0, NULL);
    md = json_object_get(j, "metadata");
    auth = json_string_value(json_object_get(md, "auth"));
    if (resp.status != 200 || !auth) {
        r = lb_error_set(err, -EREMOTEIO,
                         "%s does not answer GET /1.0 like an LXD server (HTTP %ld)",
                         httpc_endpoint(l->eng.http), resp.status);
        goto out;
    }
    if (strcmp(auth, "trusted") != 0) {
        r = lb_error_set(err, -EREMOTEIO,
                         "the LXD server at %s does not trust this client (auth: %s): add the "
                         "client certificate with `lxc config trust add`",
                         httpc_endpoint(l->eng.http), auth);
        goto out;
    }
    exts = json_object_get(md, "api_extensions");
    for (size_t k = 0; k < sizeof(required_extensions) / sizeof(required_extensions[0]); k++) {
        bool found = false;
        size_t i;
        json_t *e;

        json_array_foreach(exts, i, e)
            found = found || strcmp(json_string_value(e) ?: "", required_extensions[k]) == 0;
        if (!found) {
            r = lb_error_set(err, -EREMOTEIO,
                             "the LXD server at %s lacks the API extension '%s' that the lxd "
                             "provider needs (LXD 5.0 or later has it)",
                             httpc_endpoint(l->eng.http), required_extensions[k]);
            goto out;
        }
    }
    l->clustered =
        json_is_true(json_object_get(json_object_get(md, "environment"), "server_clustered"));
    snprintf(l->member, sizeof(l->member), "%s",
             json_string_value(json_object_get(json_object_get(md, "environment"), "server_name"))
                 ?: "");
    if (l->target) {
        bool found = false;
        size_t i;
        json_t *e;

        json_array_foreach(exts, i, e)
            found = found || strcmp(json_string_value(e) ?: "",
                                    l->target[0] == '@' ? "clustering_groups" : "clustering") == 0;
        if (!found || !l->clustered) {
            r = lb_error_set(err, -EINVAL, "lxd.target '%s' needs a clustered LXD server%s",
                             l->target, l->target[0] == '@' ? " with cluster groups" : "");
            goto out;
        }
    }
out:
    json_decref(j);
    httpc_response_release(&resp);
    return r;
}

/* The default profile's root disk pool and whether its driver has quotas. */
static int find_pool(struct lb_lxd *l, struct lb_error *err)
{
    struct lb_httpc_response resp;
    json_t *j = NULL;
    const char *pool, *driver;
    char path[256];
    int r;

    r = lxd_call(l, NULL, "GET", "/1.0/profiles/default", NULL, 0, &resp, err);
    if (r < 0)
        goto out;
    j = resp.status == 200 ? json_loadb(resp.body.data, resp.body.len, 0, NULL) : NULL;
    pool = json_string_value(json_object_get(
        json_object_get(json_object_get(json_object_get(j, "metadata"), "devices"), "root"),
        "pool"));
    if (!pool || strlen(pool) >= sizeof(l->pool) || strchr(pool, '/')) {
        r = lb_error_set(err, -EREMOTEIO,
                         "the LXD default profile has no root disk device naming a pool");
        goto out;
    }
    snprintf(l->pool, sizeof(l->pool), "%s", pool);
    json_decref(j);
    j = NULL;
    httpc_response_release(&resp);
    snprintf(path, sizeof(path), "/1.0/storage-pools/%s", l->pool);
    r = lxd_call(l, NULL, "GET", path, NULL, 0, &resp, err);
    if (r < 0)
        goto out;
    j = resp.status == 200 ? json_loadb(resp.body.data, resp.body.len, 0, NULL) : NULL;
    driver = json_string_value(json_object_get(json_object_get(j, "metadata"), "driver"));
    if (!driver) {
        r = lb_error_set(err, -EREMOTEIO, "LXD: cannot read storage pool '%s'", l->pool);
        goto out;
    }
    l->pool_has_quota = strcmp(driver, "dir") != 0;
    metrics_provider_storage("lxd", l->pool, driver);
    if (l->pool_has_quota)
        log_info("lxd provider: root pool %s (driver %s)", l->pool, driver);
    else
        log_warn("lxd provider: root pool %s has driver dir: every instance's root is a whole "
                 "copy of its image (slow creates, snapshots and forks) and resources.disk_mib is "
                 "refused; a pool on btrfs, zfs or lvm makes roots copy-on-write, with quotas",
                 l->pool);
out:
    json_decref(j);
    httpc_response_release(&resp);
    return r;
}

/* The whole supervisor binary at path (at most SUPERVISE_MAX_BYTES) into *data (malloc'd, the
 * caller's) and *len. 0, -ENOENT (cannot open), -EINVAL (empty, too big, not a file), -EIO,
 * -ENOMEM. */
static int read_binary(const char *path, void **data, size_t *len, struct lb_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    size_t got = 0;
    char *buf = NULL;
    int r = 0;

    *data = NULL;
    *len = 0;
    if (fd < 0)
        return lb_error_set(err, -ENOENT, "cannot open the supervisor '%s': %s", path,
                            strerror(errno));
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
        st.st_size > SUPERVISE_MAX_BYTES) {
        r = lb_error_set(err, -EINVAL, "'%s' is not a usable supervisor binary", path);
        goto out;
    }
    buf = malloc((size_t)st.st_size);
    if (!buf) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            r = lb_error_set(err, -EIO, "cannot read '%s'", path);
            goto out;
        }
        got += (size_t)n;
    }
    *data = buf;
    *len = got;
    buf = NULL;
out:
    free(buf);
    close(fd);
    return r;
}

static int read_supervisor(struct lb_lxd *l, struct lb_error *err)
{
    return read_binary(l->eng.supervise_path, &l->supervise_data, &l->supervise_len, err);
}

/* lxd.supervise_host_path: a plain path (it goes into raw.lxc), of a file others may execute
 * (inside, the instance's root is not its owner), the same bytes as the daemon's supervisor
 * where this host has it; a host without it (lendboxd off the cluster) cannot check. */
static int check_supervise_host(struct lb_lxd *l, const char *path, struct lb_error *err)
{
    struct stat st;
    void *data = NULL;
    size_t len = 0;
    int r;

    if (!lxc_path_is_plain(path))
        return lb_error_set(err, -EINVAL,
                            "lxd.supervise_host_path '%s' must be an absolute path of letters, "
                            "digits and ._+@- (it goes into each instance's raw.lxc)",
                            path);
    if (stat(path, &st) < 0) { /* (its mode is read below) */
        if (errno != ENOENT)
            return lb_error_set(err, -EINVAL, "cannot look at lxd.supervise_host_path '%s': %s",
                                path, strerror(errno));
        log_warn("lxd provider: lxd.supervise_host_path %s is not on this host: every member's "
                 "host must have it, the same build as %s",
                 path, l->eng.supervise_path);
        return 0;
    }
    r = read_binary(path, &data, &len, err);
    if (r < 0)
        return lb_error_recode(err, -EINVAL, "lxd.supervise_host_path '%s' cannot be read", path);
    if (!(st.st_mode & S_IXOTH))
        r = lb_error_set(err, -EINVAL,
                         "lxd.supervise_host_path '%s' must be a file others may execute "
                         "(mode 0711 or 0755): an instance's root is not its owner",
                         path);
    else if (len != l->supervise_len || memcmp(data, l->supervise_data, len) != 0)
        r = lb_error_set(err, -EINVAL,
                         "lxd.supervise_host_path '%s' is not the same build as the daemon's "
                         "supervisor '%s'",
                         path, l->eng.supervise_path);
    free(data);
    return r;
}

int provider_lxd_new(const struct lb_lxd_config *cfg, struct lb_provider **out,
                     struct lb_error *err)
{
    struct lb_engine *e;
    struct lb_lxd *l;
    int r;

    if ((!cfg->engine.socket || !*cfg->engine.socket) && (!cfg->url || !*cfg->url))
        return lb_error_set(err, -EINVAL, "the lxd provider needs lxd.socket or lxd.url");
    if (!cfg->engine.supervise_path || !cfg->engine.state_dir)
        return lb_error_set(err, -EINVAL, "the lxd provider needs the supervisor and a state dir");
    if (cfg->target && *cfg->target &&
        (strlen(cfg->target) > 63 ||
         strspn(cfg->target, "@abcdefghijklmnopqrstuvwxyz"
                             "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") != strlen(cfg->target)))
        return lb_error_set(err, -EINVAL, "lxd.target '%s' is not a member or @group name",
                            cfg->target);
    r = engine_new(sizeof(*l), &lxd_hooks, &cfg->engine, &e, err);
    if (r < 0)
        return r;
    l = (struct lb_lxd *)e;
    l->eng.supervise_inside = LXD_SUPERVISE_PATH;
    l->eng.create_timeout_ms = cfg->create_timeout_ms > 0 ? cfg->create_timeout_ms : 60000;
    l->eng.ready_timeout = true; /* a spec's ready_timeout_ms bounds the create */
    /* each instance's id range is lendbox's (lxd_idmap.c): creates run side by side */
    l->eng.create_concurrency = cfg->create_concurrency > 0 ? (int)cfg->create_concurrency : 8;
    l->call_timeout_ms = cfg->call_timeout_ms > 0 ? cfg->call_timeout_ms : 15000;
    l->url = cfg->url && *cfg->url ? strdup(cfg->url) : NULL;
    l->target = cfg->target && *cfg->target ? strdup(cfg->target) : NULL;
    if ((cfg->url && *cfg->url && !l->url) || (cfg->target && *cfg->target && !l->target)) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    r = read_supervisor(l, err);
    if (r == 0 && cfg->supervise_host_path && *cfg->supervise_host_path) {
        r = check_supervise_host(l, cfg->supervise_host_path, err);
        if (r == 0 && !(l->supervise_host = strdup(cfg->supervise_host_path)))
            r = lb_error_set(err, -ENOMEM, "out of memory");
    }
    if (r == 0)
        r = lxd_idmap_init(l, cfg->idmap_base, cfg->idmap_count, cfg->engine.state_dir, err);
    if (r < 0)
        goto fail;
    if (l->eng.socket) {
        r = httpc_new(l->eng.socket, "", &l->eng.http, err);
    } else {
        struct lb_httpc_tls tls = {
            .cert = cfg->cert, .key = cfg->key, .server_cert = cfg->server_cert};

        r = httpc_new_https(l->url, &tls, "", &l->eng.http, err);
    }
    if (r < 0)
        goto fail;
    r = check_server(l, err);
    if (r == 0)
        r = find_pool(l, err);
    if (r == 0)
        r = lxd_cleanup_start(l, err);
    if (r < 0)
        goto fail;
    log_info("lxd provider: %s%s, instance %s, default image %s, target %s, supervisor %s%s",
             httpc_endpoint(l->eng.http), l->clustered ? " (clustered)" : "", l->eng.instance,
             l->eng.default_image ? l->eng.default_image : "(none)",
             l->target ? l->target : "(cluster's)",
             l->supervise_host ? "bound from the member's " : "pushed",
             l->supervise_host ? l->supervise_host : "");
    *out = &l->eng.base;
    return 0;
fail:
    l->eng.ops.destroy(&l->eng.base);
    return r;
}
