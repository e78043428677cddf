/*
 * reset.c - the local provider's in-place reset (local_reset, local_internal.h): a sandbox of
 * image host with tmpfs storage is returned to how create.c made it by lendbox-supervise
 * --reset (supervisor/mode_reset.c), which keeps its namespaces, cgroup, network and uid slot,
 * so a reset costs no bwrap, no cgroup and no namespace. Everything an episode can change in
 * such a sandbox is in its pid namespace (processes), its tmpfs mounts (/tmp, /run, /dev/shm,
 * the workdir), its IPC namespace and its hostname: its root is the host's, read-only, its
 * /dev read-only, and its processes can neither mount (seccomp, no capabilities) nor change
 * its network (no capabilities). A sandbox with an image (an overlay root), a data directory
 * (storage dir) or a snapshot's workspace is not one: -EOPNOTSUPP, and lend_reset stops and
 * creates it as before; nor is one whose init's limits, nice value or CPUs the episode changed
 * (its processes run as the init's uid: prlimit, setpriority and sched_setaffinity on pid 1
 * succeed), compared with what its create recorded (local_init_attrs_save).
 */
#include "provider/local/local_internal.h"
#include "provider/local/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "supervisor/signals.h"
#include "util/buf.h"
#include "util/clock.h"
#include "util/fault.h"
#include "util/log.h"

enum { RFD_IN, RFD_OUT, RFD_ERR, RFD_STATUS, RFD_NS, RFD_SUPERVISE = RFD_NS + 5, RFD_COUNT };

static const char *const reset_ns_names[5] = {"user", "mnt", "pid", "uts", "ipc"};

struct reset_child {
    const int *fds;
    char **argv;
};

/* The spawned child (spawn.h): a session keyring of its own, its fds in place, the helper. */
static int reset_child_exec(void *arg)
{
    const struct reset_child *c = arg;
    char *envp[] = {NULL};
    int e;

    sup_signals_reset();
    (void)syscall(SYS_setsid);
    /* the helper, and the child it forks into the sandbox, on the CPU the daemon's thread is
     * on, which waits for them: a reset is a chain of short waits on each other, and a wakeup
     * on another, idle CPU costs more than the work (a VM's vCPUs sleep). It kills and mounts;
     * nothing it starts outlives it. */
    {
        cpu_set_t one;
        int cpu = sched_getcpu();

        if (cpu >= 0) {
            CPU_ZERO(&one);
            CPU_SET(cpu, &one);
            (void)sched_setaffinity(0, sizeof(one), &one);
        }
    }
    if (local_child_new_session_keyring() < 0) {
        e = errno;
        local_child_report(c->fds[RFD_STATUS], "error cannot make a session keyring", e);
        return e;
    }
    if (local_child_place_fds(c->fds, RFD_COUNT) < 0) {
        e = errno;
        local_child_report(c->fds[RFD_STATUS], "error cannot set up fds", e);
        return e;
    }
    (void)syscall(SYS_close_range, RFD_COUNT, ~0U, 0);
    execve(c->argv[0], c->argv, envp);
    e = errno;
    local_child_report(RFD_STATUS, "error cannot execute lendbox-supervise", e);
    return e;
}

/* May the sandbox of d (directory dir) be reset in place to spec? */
static bool reset_fits(const struct local_provider *lp, const struct local_desc *d, const char *dir,
                       const struct lb_sandbox_spec *spec)
{
    char img[4400];

    if (lp->storage != LOCAL_STORAGE_TMPFS || d->data[0] || d->image[0] || !spec || !spec->image ||
        strcmp(spec->image, "host") != 0 || !d->workdir[0] ||
        (spec->workdir && strcmp(spec->workdir, d->workdir) != 0))
        return false;
    /* an overlay root (a snapshot's workspace over host) has its directory "img" */
    snprintf(img, sizeof(img), "%s/img", dir);
    return access(img, F_OK) < 0 && errno == ENOENT;
}

static int64_t reset_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Hand the reset to the spare helper (reset_spare.c), if one waits: its pid and in *sock its
 * socket (the caller gives both back: local_reset_spare_back or _lost), or 0 (none, or it did not
 * take the request: the caller execs a helper). fds as reset_run's, argv the helper's; the spare
 * gets fds[RFD_STATUS..RFD_SUPERVISE] and argv[2..8] and the CPU. */
static pid_t reset_give_spare(struct local_provider *lp, const int *fds, char **argv, int *sock_out)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int) * (RFD_COUNT - RFD_STATUS))];
    } ctl;
    char payload[8192];
    size_t len = 0;
    int sock = -1, cpu = sched_getcpu();
    pid_t pid = local_reset_spare_take(lp, &sock);
    struct iovec iov;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    struct cmsghdr *c;
    ssize_t n;

    *sock_out = -1;
    if (pid <= 0)
        return 0;
    for (int i = 2; i < 9; i++) {
        size_t k = strlen(argv[i]) + 1;

        if (len + k > sizeof(payload) - 16)
            goto refused;
        memcpy(payload + len, argv[i], k);
        len += k;
    }
    len += (size_t)snprintf(payload + len, 16, "%d", cpu >= 0 ? cpu : -1) + 1;
    iov.iov_base = payload;
    iov.iov_len = len;
    memset(&ctl, 0, sizeof(ctl));
    m.msg_control = ctl.b;
    m.msg_controllen = sizeof(ctl.b);
    c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (RFD_COUNT - RFD_STATUS));
    memcpy(CMSG_DATA(c), fds + RFD_STATUS, sizeof(int) * (RFD_COUNT - RFD_STATUS));
    do
        n = sendmsg(sock, &m, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)len)
        goto refused;
    *sock_out = sock;
    return pid;
refused: /* (it died, say): ended, and the caller execs a helper */
    local_reset_spare_kill(lp, pid, sock);
    return 0;
}

/* Run the helper with fds (RFD_NS.. and RFD_SUPERVISE set), wait for it (never past
 * deadline_ms: killed then). When it said "reset N" and exited 0: N >= 0, the zombies it left
 * for their parents outside the sandbox to reap; else a negative errno. */
static int reset_run(struct local_provider *lp, const char *id, int *fds, char **argv,
                     int64_t deadline_ms, struct lb_error *err)
{
    struct lb_buf status = {.max = 4096};
    struct reset_child rc = {fds, argv};
    int status_r = -1, ws = 0, r;
    int64_t started_us = reset_now_us();
    pid_t helper = 0;
    int spare_sock = -1;
    bool spare;
    char chunk[512];

    r = local_pipe(&status_r, &fds[RFD_STATUS]);
    if (r < 0) {
        r = lb_error_set(err, -EREMOTEIO, "pipe: %s", strerror(-r));
        goto out;
    }
    helper = reset_give_spare(lp, fds, argv, &spare_sock);
    spare = helper > 0;
    if (helper == 0) {
        fds[RFD_IN] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        fds[RFD_OUT] = open("/dev/null", O_WRONLY | O_CLOEXEC);
        fds[RFD_ERR] = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (fds[RFD_IN] < 0 || fds[RFD_OUT] < 0 || fds[RFD_ERR] < 0) {
            r = lb_error_set(err, -EREMOTEIO, "cannot open /dev/null: %s", strerror(errno));
            goto out;
        }
        r = spawn_vfork(reset_child_exec, &rc, &helper);
    }
    local_close_fd(&fds[RFD_STATUS]);
    if (r < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot start lendbox-supervise --reset: %s",
                         strerror(-r));
        goto out;
    }
    for (;;) {
        struct pollfd p = {.fd = status_r, .events = POLLIN};
        int64_t left = deadline_ms - clock_mono_ms();
        ssize_t n;

        if (left <= 0) {
            (void)kill(helper, SIGKILL);
            break;
        }
        if (poll(&p, 1, (int)(left > 1000 ? 1000 : left)) <= 0)
            continue;
        n = read(status_r, chunk, sizeof(chunk));
        if (n > 0) {
            (void)lb_buf_append_capped(&status, chunk, (size_t)n);
            /* its one line is all it says: its exit (below) need not close every copy of the
             * pipe (a vfork-style child of another thread holds one until its exec) */
            if (memchr(chunk, '\n', (size_t)n))
                break;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        break;
    }
    if (spare && status.len > 5 && strncmp(status.data, "reset", 5) == 0 &&
        status.data[status.len - 1] == '\n') {
        /* its child wrote this last: the spare goes back to its namespaces, says so, and
         * waits for the next reset (or, when it does not come back, is ended: the reset is
         * done all the same) */
        local_reset_spare_back(lp, helper, spare_sock, deadline_ms);
    } else {
        if (spare) { /* it ends after a reset that failed: ended here in any case */
            close(spare_sock);
            (void)kill(helper, SIGKILL);
        }
        while (waitpid(helper, &ws, 0) < 0 && errno == EINTR)
            ;
        if (spare)
            local_reset_spare_lost(lp);
    }
    if (lb_buf_append_capped(&status, "", 1) < 0 || !status.data) {
        r = lb_error_set(err, -EREMOTEIO, "the in-place reset of sandbox '%s' said nothing", id);
        goto out;
    }
    if (WIFEXITED(ws) && WEXITSTATUS(ws) == 0 && strncmp(status.data, "reset", 5) == 0) {
        /* "reset N": N zombies of the sandbox wait for a parent outside it (lendboxd, a
         * subreaper, when it killed an exec's helper that did not exit in time) */
        r = atoi(status.data + 5);
        status.data[strcspn(status.data, "\n")] = '\0';
        log_debug_sbx(id, "sandbox %s: helper %s ran %lld µs, said: %s", id,
                      spare ? "(the spare)" : "(exec'd)", (long long)(reset_now_us() - started_us),
                      status.data);
    } else {
        char text[1024];

        status.data[strcspn(status.data, "\n")] = '\0';
        local_errno_text(status.data, text, sizeof(text));
        r = lb_error_set(err, -EREMOTEIO, "the in-place reset of sandbox '%s' failed: %s", id,
                         text[0] ? text : "(no status)");
    }
out:
    local_close_fd(&status_r);
    for (int i = 0; i < RFD_COUNT; i++)
        local_close_fd(&fds[i]);
    lb_buf_release(&status);
    return r;
}

int local_reset(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                const struct lb_sandbox_spec *spec, const char *hostname, int64_t timeout_ms,
                struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    int64_t deadline = clock_mono_ms() + (timeout_ms > 0 ? timeout_ms : 1);
    char dir[4352], host[64], tmp[24], run[24], shm[24], wd[24], uid[24], path[64];
    struct lb_resources none = {0};
    struct mount_sizes sizes;
    struct lb_error terr = {0};
    struct local_desc d;
    int fds[RFD_COUNT], r;
    bool frozen = false;

    for (int i = 0; i < RFD_COUNT; i++)
        fds[i] = -1;
    if (!ref || !local_id_is_valid(ref->id) || (hostname && !local_id_is_valid(hostname)))
        return lb_error_set(err, -EINVAL, "invalid sandbox id");
    if (!lp->reset_in_place)
        return lb_error_set(err, -EOPNOTSUPP, "in-place resets are off (local.reset_in_place)");
    r = local_desc_load_running(lp, ref, &d, err);
    if (r < 0)
        return r;
    local_sandbox_dir(lp, ref->id, dir, sizeof(dir));
    if (!reset_fits(lp, &d, dir, spec)) {
        r = lb_error_set(err, -EOPNOTSUPP, "sandbox '%s' cannot be reset in place", ref->id);
        goto out;
    }
    /* the init is kept: only as its create made it (an agent may have limited or reniced it,
     * which would outlive the episode); else a new sandbox */
    if (!local_init_attrs_kept(dir, d.pid)) {
        log_info_sbx(ref->id,
                     "sandbox %s: its init's limits, priority or CPUs were changed: reset by a "
                     "stop and a create",
                     ref->id);
        r = lb_error_set(err, -EOPNOTSUPP, "sandbox '%s': its init was changed", ref->id);
        goto out;
    }
    /* tests: held here, the init checked, nothing killed yet (what an episode's process may
     * still change) */
    r = fault_hit("reset.checked", 0, err);
    if (r < 0)
        goto out;
    /* a paused sandbox's processes must be able to die */
    if (d.cg.version)
        cgroup_is_frozen(&d.cg, &frozen);
    if (frozen && cgroup_set_frozen(&d.cg, false, 2000, &terr) < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot thaw sandbox '%s': %s", ref->id, terr.message);
        goto out;
    }
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof(path), "/proc/%d/ns/%s", (int)d.pid, reset_ns_names[i]);
        fds[RFD_NS + i] = open(path, O_RDONLY | O_CLOEXEC);
        if (fds[RFD_NS + i] < 0) {
            r = lb_error_set(err, -EREMOTEIO, "cannot open %s: %s", path, strerror(errno));
            goto out;
        }
    }
    /* the pid may have been reused between the load and the opens */
    if (!local_desc_alive(&d)) {
        r = lb_error_set(err, -EREMOTEIO, "sandbox '%s' stopped during its reset", ref->id);
        goto out;
    }
    fds[RFD_SUPERVISE] = open(lp->supervise_path, O_PATH | O_CLOEXEC);
    if (fds[RFD_SUPERVISE] < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot open %s: %s", lp->supervise_path,
                         strerror(errno));
        goto out;
    }
    local_mount_sizes(lp, spec ? &spec->resources : &none, &sizes);
    /* what create.c gives bwrap: the id (a recycle's: the id it is handed over to next) */
    snprintf(host, sizeof(host), "%.63s", hostname ? hostname : ref->id);
    snprintf(tmp, sizeof(tmp), "%" PRId64, sizes.tmp_mib);
    snprintf(run, sizeof(run), "%" PRId64, sizes.run_mib);
    snprintf(shm, sizeof(shm), "%" PRId64, sizes.shm_mib);
    snprintf(wd, sizeof(wd), "%" PRId64, sizes.workdir_mib);
    snprintf(uid, sizeof(uid), "%" PRIu32, d.uid);
    /* the episode's endpoint URLs (relays, which carry no token) end with it: the next
     * episode's first endpoint request makes its relay on a new port */
    local_relay_close(lp, ref->id);
    {
        char *argv[] = {
            lp->supervise_path, "--reset", host, d.workdir, tmp, run, shm, wd, uid, NULL};

        r = reset_run(lp, ref->id, fds, argv, deadline, err);
    }
    if (r > 0) {
        local_reap_uid_children(d.uid);
        r = 0;
    }
    /* again, now that nothing of the episode runs: a process of it could have changed the
     * init between the look above and the kill (a loop of prlimit on pid 1) */
    if (r == 0 && !local_init_attrs_kept(dir, d.pid)) {
        log_info_sbx(ref->id,
                     "sandbox %s: its init's limits, priority or CPUs were changed during its "
                     "reset: reset by a stop and a create",
                     ref->id);
        r = lb_error_set(err, -EOPNOTSUPP, "sandbox '%s': its init was changed", ref->id);
    }
    /* the next episode's usage counts from here */
    if (r == 0)
        local_usage_base_save(ref->id, dir, &d.cg);
out:
    for (int i = 0; i < RFD_COUNT; i++)
        local_close_fd(&fds[i]);
    local_desc_release(&d);
    return r;
}

int local_hand_over(struct lb_provider *p, const struct lb_sandbox_ref *ref, const char *new_id,
                    json_t **desc_out, struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    char dir[4352], to[4352];
    struct local_desc d;
    struct stat st;
    int r;

    *desc_out = NULL;
    if (!ref || !local_id_is_valid(ref->id) || !local_id_is_valid(new_id) ||
        strcmp(ref->id, new_id) == 0)
        return lb_error_set(err, -EINVAL, "invalid sandbox id");
    r = local_desc_load_running(lp, ref, &d, err);
    if (r < 0)
        return r;
    local_sandbox_dir(lp, ref->id, dir, sizeof(dir));
    local_sandbox_dir(lp, new_id, to, sizeof(to));
    if (lstat(to, &st) == 0 || errno != ENOENT) {
        r = lb_error_set(err, -EEXIST, "sandbox '%s' exists already", new_id);
        goto out;
    }
    /* its cgroup (a cgroup v2 directory cannot be renamed) and data directory keep the id it was
     * made under: the descriptor names it, and is written, naming its directory to be, before
     * the rename (a crash in between leaves a descriptor that reads under either id) */
    if (!d.name[0])
        snprintf(d.name, sizeof(d.name), "%s", ref->id);
    r = local_desc_save_in(&d, dir, to, err);
    if (r < 0)
        goto out;
    if (rename(dir, to) < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot rename '%s' to '%s': %s", dir, to,
                         strerror(errno));
        goto out;
    }
    *desc_out = local_desc_to_json(&d, to);
    if (!*desc_out)
        r = lb_error_set(err, -ENOMEM, "out of memory");
    else
        log_info_sbx(new_id, "sandbox %s handed over to %s (made as %s)", ref->id, new_id, d.name);
out:
    local_desc_release(&d);
    return r;
}
