/*
 * stop.c - stopping a sandbox of the local provider: one stop of an id at a time (the stopping
 * set, which endpoint requests enter too), and the teardown itself: relays, thaw, kill the init
 * and wait for its pid namespace to empty, sweep the slot's ids when that is not enough, remove
 * cgroups, the network link and rules, the data, the image root's mounts and the sandbox's
 * directory, then free its uid and address slots.
 */
#include "provider/local/local_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"

#define SWEEP_STEP_MS 10
#define THAW_WAIT_MS 2000
#define KNOWN_EXIT_MS 1000 /* bound on the waits after the init that no pidfd ends */
#define KNOWN_PIDS_MAX 64
#define REAP_FIRST_MS 100 /* first wait for a killed init before looking for orphans */
#define REAP_MAX_MS 1600  /* longest wait between two looks */

/* How many stops swept /proc for the ids of a slot (local_slot_sweeps). */
static atomic_ulong slot_sweeps;

/* ---- removal -------------------------------------------------------------------------- */

/* rm -r without following symlinks and with O(1) fds and stack, however deep the tree: the
 * walk descends into a non-empty directory, and climbs back with ".." once it is empty. Only
 * runs after every process that could change the tree is dead. */
static int rmtree(const char *path)
{
    int depth = 0, fd, r = 0;

    fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : -errno;
    for (;;) {
        bool descended = false;
        struct dirent *de;
        DIR *d = fdopendir(fd);

        if (!d) {
            r = -errno;
            close(fd);
            return r;
        }
        while ((de = readdir(d))) {
            const char *name = de->d_name;
            int child;

            if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
                continue;
            if (unlinkat(dirfd(d), name, 0) == 0 || errno == ENOENT)
                continue;
            if (errno != EISDIR && errno != EPERM) {
                r = -errno;
                break;
            }
            if (unlinkat(dirfd(d), name, AT_REMOVEDIR) == 0 || errno == ENOENT)
                continue;
            if (errno != ENOTEMPTY && errno != EEXIST) {
                r = -errno;
                break;
            }
            child = openat(dirfd(d), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (child < 0) {
                r = -errno;
                break;
            }
            fd = child;
            descended = true;
            depth++;
            break;
        }
        if (descended) {
            closedir(d);
            continue;
        }
        if (r < 0 || depth == 0) {
            closedir(d);
            break;
        }
        /* empty now: back up; the parent's rescan removes it */
        fd = openat(dirfd(d), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        closedir(d);
        if (fd < 0)
            return -errno;
        depth--;
    }
    if (r == 0 && rmdir(path) < 0 && errno != ENOENT)
        r = -errno;
    return r;
}

/* Wait until pidfd's process has exited or deadline passes. */
static bool wait_pidfd(int pidfd, int64_t deadline_ms)
{
    for (;;) {
        struct pollfd p = {.fd = pidfd, .events = POLLIN};
        int64_t left = deadline_ms - clock_mono_ms();
        int n;

        if (left < 0)
            left = 0;
        n = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
        if (n > 0)
            return true;
        if (n == 0)
            return false;
        if (errno != EINTR)
            return false;
    }
}

unsigned long local_slot_sweeps(void)
{
    return atomic_load(&slot_sweeps);
}

/* Pidfds of the exec helpers that run in the sandbox d (the processes of its ids outside its
 * pid namespace that the daemon started) into fds, at most max; how many. Under lp->lock: a
 * helper still linked in lp->running is not reaped, so its pid is still the helper. */
static int exec_helper_pidfds(struct local_provider *lp, const struct local_desc *d, int *fds,
                              int max)
{
    int n = 0;

    if (d->cg.ndirs == 0)
        return 0;
    pthread_mutex_lock(&lp->lock);
    for (struct local_running_exec *e = lp->running; e && n < max; e = e->next) {
        if (!e->cg || e->cg->ndirs == 0 || strcmp(e->cg->dirs[0], d->cg.dirs[0]) != 0)
            continue;
        fds[n] = (int)syscall(SYS_pidfd_open, e->helper, 0);
        if (fds[n] >= 0)
            n++;
    }
    pthread_mutex_unlock(&lp->lock);
    return n;
}

/* Wait (never past until) for bwrap's monitor to exit, and reap it when it is our child
 * (lendboxd is a subreaper). Through monfd when it could be pinned; else only a monitor that
 * is our own child is waited for, by its pid (an unreaped child's pid cannot be reused) and
 * at most KNOWN_EXIT_MS, so that a failed pidfd_open (EMFILE) leaves no zombie behind. */
static void wait_monitor(int monfd, pid_t monitor, int64_t until)
{
    if (monitor <= 1)
        return;
    if (monfd >= 0) {
        siginfo_t si;

        (void)wait_pidfd(monfd, until);
        /* exactly the pinned monitor, when it is our child (else ECHILD): no /proc read of
         * its parent, and never another child of ours that took a dead monitor's pid */
        (void)waitid(P_PIDFD, (id_t)monfd, &si, WEXITED | WNOHANG);
        return;
    }
    if (until > clock_mono_ms() + KNOWN_EXIT_MS)
        until = clock_mono_ms() + KNOWN_EXIT_MS;
    while (local_proc_ppid(monitor) == getpid() && waitpid(monitor, NULL, WNOHANG) == 0 &&
           clock_mono_ms() < until)
        clock_sleep_ms(SWEEP_STEP_MS);
}

/* After a clean init death: wait for the processes of the sandbox's ids that the daemon knows
 * to run outside its pid namespace: bwrap's monitor and the exec helpers, which exit as soon
 * as the init and their supervisor (inside the namespace) are gone. Their exits are events
 * that come, so they are awaited up to deadline_ms (a loaded machine may take more than a
 * moment); then, while the sandbox has a cgroup, at most KNOWN_EXIT_MS more until that is
 * empty (what the daemon does not know of: an exec worker's helper already unlinked). True
 * when the cgroup was seen empty (cgroup_is_empty), so the caller need not read it again. */
static bool wait_known_pids(struct local_provider *lp, const struct local_desc *d, int monfd,
                            pid_t monitor, int64_t deadline_ms)
{
    int fds[KNOWN_PIDS_MAX], n;
    int64_t until;

    wait_monitor(monfd, monitor, deadline_ms);
    n = exec_helper_pidfds(lp, d, fds, KNOWN_PIDS_MAX);
    for (int i = 0; i < n; i++) {
        (void)wait_pidfd(fds[i], deadline_ms);
        close(fds[i]);
    }
    until = clock_mono_ms() + KNOWN_EXIT_MS;
    if (until > deadline_ms)
        until = deadline_ms;
    /* an exec worker unlinks its helper before it reaps it, and a file transfer's helper is
     * not linked at all: those leave the cgroup on their own, as soon as they have exited */
    for (;;) {
        if (cgroup_is_empty(&d->cg))
            return true;
        if (d->cg.version == 0 || clock_mono_ms() >= until)
            return false;
        clock_sleep_ms(SWEEP_STEP_MS);
    }
}

/* Remove a storage-dir sandbox's data: the descriptor's directory, and <data_dir>/<id> of the
 * current configuration (a sandbox that crashed before its descriptor named one). Only runs
 * once every process of the sandbox is dead. */
static int remove_data(struct local_provider *lp, const char *id, const struct local_desc *d,
                       struct lb_error *err)
{
    char guess[4352];
    int r = 0;

    if (d->data[0])
        r = rmtree(d->data);
    if (r == 0 && lp->data_dir) {
        snprintf(guess, sizeof(guess), "%s/%s", lp->data_dir, id);
        r = rmtree(guess);
    }
    if (r < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot remove the data of sandbox '%s': %s", id,
                            strerror(-r));
    return 0;
}

/* Thaw the sandbox's freezer if it is frozen, waiting (at most THAW_WAIT_MS, and never past
 * deadline_ms) until the kernel says it is thawed. */
static void sandbox_thaw(const struct local_desc *d, int64_t deadline_ms)
{
    int64_t left = deadline_ms - clock_mono_ms();
    bool frozen = false;

    if (!d->cg.version)
        return;
    cgroup_is_frozen(&d->cg, &frozen);
    if (frozen)
        (void)cgroup_set_frozen(&d->cg, false,
                                left < 0              ? 0
                                : left < THAW_WAIT_MS ? left
                                                      : THAW_WAIT_MS,
                                NULL);
}

/* ---- directories moved aside ---------------------------------------------------------- */

#define REMOVED_DIR "removed" /* in the state dir: dead sandboxes' directories, to remove */

void local_defer_cleanup(struct lb_provider *p)
{
    atomic_store(&((struct local_provider *)p)->defer_removal, true);
}

/* Move the dead sandbox's directory dir to <state_dir>/removed/<id>: 0, or -errno when it
 * cannot be (the caller removes it in place then). */
static int move_aside(struct local_provider *lp, const char *id, const char *dir)
{
    char to[4400];

    if (snprintf(to, sizeof(to), "%s/" REMOVED_DIR, lp->state_dir) >= (int)sizeof(to))
        return -ENAMETOOLONG;
    /* made once per sweep (nothing removes it before the next start) */
    if (!atomic_load(&lp->removed_made)) {
        if (mkdir(to, 0700) < 0 && errno != EEXIST)
            return -errno;
        atomic_store(&lp->removed_made, true);
    }
    if (snprintf(to, sizeof(to), "%s/" REMOVED_DIR "/%s", lp->state_dir, id) >= (int)sizeof(to))
        return -ENAMETOOLONG;
    return rename(dir, to) < 0 ? -errno : 0;
}

static void *removed_reaper_main(void *arg)
{
    struct local_provider *lp = arg;
    char path[4400];
    struct dirent *de;
    DIR *dh;
    int n = 0, failed = 0;

    snprintf(path, sizeof(path), "%s/" REMOVED_DIR, lp->state_dir);
    dh = opendir(path);
    if (!dh)
        return NULL;
    while (!atomic_load(&lp->reaper_quit) && (de = readdir(dh))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/" REMOVED_DIR "/%s", lp->state_dir, de->d_name);
        if (rmtree(path) < 0)
            failed++;
        else
            n++;
    }
    closedir(dh);
    if (n || failed)
        log_info("removed %d stopped sandboxes' directories of an earlier run (%d could not be)", n,
                 failed);
    return NULL;
}

int local_removed_start(struct local_provider *lp)
{
    char path[4400];
    int r;

    snprintf(path, sizeof(path), "%s/" REMOVED_DIR, lp->state_dir);
    if (access(path, F_OK) < 0)
        return 0;
    r = pthread_create(&lp->reaper, NULL, removed_reaper_main, lp);
    if (r != 0)
        return -r;
    lp->reaper_started = true;
    return 0;
}

void local_removed_stop(struct local_provider *lp)
{
    if (!lp->reaper_started)
        return;
    atomic_store(&lp->reaper_quit, true);
    pthread_join(lp->reaper, NULL);
    lp->reaper_started = false;
}

/* Is the descriptor's init alive and the very process it names (pid and start time, one read
 * of its /proc stat)? 0 and its parent into *ppid, or -ENOENT. */
static int init_parent(const struct local_desc *d, pid_t *ppid)
{
    uint64_t st;

    if (local_proc_parent(d->pid, ppid, &st) < 0 || st != d->start_time)
        return -ENOENT;
    return 0;
}

/* SIGKILL the sandbox's init, if it is alive: SIGKILL to a pid namespace's init kills every
 * process in it, and the init's exit (what its pidfd reports) waits until they are all gone.
 * *pidfd_out: the init's pidfd (-1: no live init); *monfd_out, *monitor_out: bwrap's monitor,
 * pinned and killed with it (-1: none). 0, or -EREMOTEIO (nothing is left open). */
static int kill_init(const char *id, const struct local_desc *d, int *pidfd_out, int *monfd_out,
                     pid_t *monitor_out, struct lb_error *err)
{
    int pidfd = -1, monfd = -1, r;
    pid_t monitor = -1, ppid = -1;

    /* Each look at the init reads its /proc stat once, for its start time (is it still the
     * descriptor's process?) and its parent together: a shutdown sweep does this for every
     * sandbox at once, while their processes die and /proc reads are slow. */
    if (d->pid > 0 && init_parent(d, &monitor) == 0) {
        /* monitor: bwrap's, outside the namespace */
        pidfd = (int)syscall(SYS_pidfd_open, d->pid, 0);
        /* the monitor (bwrap, running as the sandbox's root), pinned while it is still the
         * live init's parent; not an init that is ours or pid 1's since its monitor died */
        if (pidfd >= 0 && monitor > 1 && monitor != getpid())
            monfd = (int)syscall(SYS_pidfd_open, monitor, 0);
        else
            monitor = -1;
        /* still the descriptor's init after its pidfd was opened: then the pidfd is its (a
         * pid is not reused while its process lives), and, read at the same moment, still
         * the child of the pinned monitor */
        if (pidfd >= 0 && init_parent(d, &ppid) < 0) {
            if (monfd >= 0)
                close(monfd);
            close(pidfd);
            pidfd = monfd = -1;
            monitor = -1;
        }
        if (monitor > 1) {
            uint32_t mu = 0;
            bool mz = false;

            if (ppid != monitor || local_proc_uid(monitor, &mu, &mz) < 0 ||
                mu - d->uid >= LOCAL_SLOT_IDS) {
                if (monfd >= 0)
                    close(monfd);
                monfd = -1;
                monitor = -1; /* not the sandbox's monitor: nothing to wait for */
            }
        }
        if (pidfd >= 0 && syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0) < 0 &&
            errno != ESRCH) {
            r = lb_error_set(err, -EREMOTEIO, "cannot kill sandbox '%s' (pid %d): %s", id,
                             (int)d->pid, strerror(errno));
            if (monfd >= 0)
                close(monfd);
            close(pidfd);
            return r;
        }
        /* and the monitor with it: left alone, it exits only after it has been scheduled to
         * see its child's death, one more wakeup per stop that a loaded machine makes long;
         * killed, it dies alongside the init (an init it has not reaped yet comes to us, the
         * subreaper, and is reaped below) */
        if (monfd >= 0)
            (void)syscall(SYS_pidfd_send_signal, monfd, SIGKILL, NULL, 0);
    }
    *pidfd_out = pidfd;
    *monfd_out = monfd;
    *monitor_out = monitor;
    return 0;
}

/* ---- stops begun ahead (stop_begin) ---------------------------------------------------- */

/* A sandbox whose init stop_begin killed: its pidfds, for the stop that finishes it. */
struct local_begun {
    char id[129]; /* local_id_is_valid: at most 128 */
    int pidfd, monfd;
    pid_t monitor;
    struct local_begun *next;
};

/* Take id's begun stop out of the list: true and its fds (the caller's), or false. */
static bool begun_take(struct local_provider *lp, const char *id, int *pidfd, int *monfd,
                       pid_t *monitor)
{
    struct local_begun **pp, *b = NULL;

    pthread_mutex_lock(&lp->stop_lock);
    for (pp = &lp->begun; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->id, id) == 0) {
            b = *pp;
            *pp = b->next;
            break;
        }
    }
    pthread_mutex_unlock(&lp->stop_lock);
    if (!b)
        return false;
    *pidfd = b->pidfd;
    *monfd = b->monfd;
    *monitor = b->monitor;
    free(b);
    return true;
}

void local_stop_begin(struct lb_provider *p, const struct lb_sandbox_ref *ref)
{
    struct local_provider *lp = (struct local_provider *)p;
    struct local_begun *b;
    struct local_desc d;
    int pidfd = -1, monfd = -1;
    pid_t monitor = -1;

    if (!ref || !local_id_is_valid(ref->id) ||
        local_stopping_enter(lp, ref->id, clock_mono_ms() + 1000) < 0)
        return;
    if (local_desc_load(lp, ref, &d, NULL) == 0) {
        if (kill_init(ref->id, &d, &pidfd, &monfd, &monitor, NULL) == 0 && pidfd >= 0) {
            b = calloc(1, sizeof(*b));
            if (b) {
                snprintf(b->id, sizeof(b->id), "%s", ref->id);
                b->pidfd = pidfd;
                b->monfd = monfd;
                b->monitor = monitor;
                pthread_mutex_lock(&lp->stop_lock);
                b->next = lp->begun;
                lp->begun = b;
                pthread_mutex_unlock(&lp->stop_lock);
            } else { /* killed all the same: the stop sweeps the slot's ids */
                if (monfd >= 0)
                    close(monfd);
                close(pidfd);
            }
        }
        local_desc_release(&d);
    }
    local_stopping_leave(lp, ref->id);
}

void local_begun_release(struct local_provider *lp)
{
    while (lp->begun) {
        struct local_begun *b = lp->begun;

        lp->begun = b->next;
        if (b->monfd >= 0)
            close(b->monfd);
        close(b->pidfd);
        free(b);
    }
}

int local_destroy_sandbox(struct local_provider *lp, const char *id, struct local_desc *d,
                          int64_t deadline_ms, struct lb_error *err)
{
    struct lb_cgroup guess = {0};
    char dir[4352];
    int pidfd = -1, monfd = -1, r = 0, left;
    pid_t monitor = -1;
    bool has_dir, empty = false;

    local_sandbox_dir(lp, id, dir, sizeof(dir));
    has_dir = access(dir, F_OK) == 0;
    /* 0. endpoint relays (their sockets would keep the netns alive) */
    local_relay_close(lp, id);

    /* 0. thaw first: a frozen v1 task does not die, not even of SIGKILL, and a paused
     * sandbox's processes must be able to */
    sandbox_thaw(d, deadline_ms);
    /* 1. the init (killed already when a stop_begin did) */
    if (!begun_take(lp, id, &pidfd, &monfd, &monitor)) {
        r = kill_init(id, d, &pidfd, &monfd, &monitor, err);
        if (r < 0)
            goto out;
    }
    /* a pause that raced the kill: thaw again (the kill is pending, they die at once) */
    sandbox_thaw(d, deadline_ms);
    /* The init's exit waits until every process of its namespace is reaped. One whose parent
     * died outside the namespace (an exec helper killed by the sandbox's OOM killer) was
     * adopted by lendboxd, the subreaper: reap such zombies while waiting, or the init would
     * wait for them forever. */
    for (int64_t wait_ms = REAP_FIRST_MS; pidfd >= 0;) {
        int64_t step = clock_mono_ms() + wait_ms;

        /* the /proc scan below costs O(processes on the host): a loaded machine, where many
         * dying sandboxes take long to die, must not make every stop scan every moment, so
         * the waits between scans grow (the orphan it looks for is rare) */
        if (wait_ms < REAP_MAX_MS)
            wait_ms *= 2;
        if (wait_pidfd(pidfd, step < deadline_ms ? step : deadline_ms))
            break;
        if (clock_mono_ms() >= deadline_ms) {
            r = lb_error_set(err, -ETIMEDOUT, "sandbox '%s' (pid %d) did not die in time", id,
                             (int)d->pid);
            goto out;
        }
        if (local_uid_in_range(lp, d->uid))
            local_reap_uid_children(d->uid);
    }
    /* If the monitor died before the init, the init is our child now: reap it too (exactly
     * that process, through its pidfd: ECHILD when it is not ours; no /proc read, and no
     * other child of ours that took its pid number since) */
    if (pidfd >= 0) {
        siginfo_t si;

        (void)waitid(P_PIDFD, (id_t)pidfd, &si, WEXITED | WNOHANG);
    }
    /* The monitor and the exec helpers exit right after the init: wait for them (a slow one
     * is no failure), whoever their parent is (after a restart the monitor is not ours). */
    if (pidfd >= 0) {
        siginfo_t si;

        empty = wait_known_pids(lp, d, monfd, monitor, deadline_ms);
        /* a monitor that died before it reaped the init left it to us: reap exactly that
         * process (its pidfd), whatever pid it had */
        (void)waitid(P_PIDFD, (id_t)pidfd, &si, WEXITED | WNOHANG);
        if (!empty) /* that zombie, now reaped, may have been what was left */
            empty = cgroup_is_empty(&d->cg);
    }
    /* 2. A clean init death (seen through its pidfd) took every process of its pid namespace
     * with it; what could still run as the sandbox's ids outside it (bwrap's monitor, exec
     * helpers, which join the sandbox's cgroup, and were waited for above) shows in the
     * cgroup. When that is empty there is nothing to search for: the /proc scan below costs
     * O(processes on the host) per stop, which made the shutdown sweep of many sandboxes
     * quadratic. Otherwise (no live init to kill: a sandbox half made when a daemon crashed,
     * or one whose init died; no cgroup; or something left in it) sweep everything running as
     * one of the sandbox's ids. */
    if (pidfd >= 0 && empty) {
        /* nothing left */
    } else if (has_dir && local_uid_in_range(lp, d->uid)) {
        atomic_fetch_add(&slot_sweeps, 1);
        while ((left = local_kill_uid(d->uid)) > 0) {
            if (clock_mono_ms() >= deadline_ms) {
                r = lb_error_set(err, -ETIMEDOUT,
                                 "%d process(es) of sandbox '%s' (uid %" PRIu32
                                 ") did not die in time",
                                 left, id, d->uid);
                goto out;
            }
            clock_sleep_ms(SWEEP_STEP_MS);
        }
        local_reap_uid_children(d->uid);
    } else if (has_dir && d->uid) {
        log_warn("sbx=%s uid %" PRIu32 " is outside the configured range, not swept", id, d->uid);
    }
    /* 3. cgroups: the descriptor's and wherever this host would have put them */
    r = cgroup_remove(&d->cg, deadline_ms, err);
    if (r < 0)
        goto out;
    r = cgroup_guess(&lp->cg, id, &guess);
    if (r == 0)
        r = cgroup_remove_except(&guess, &d->cg, deadline_ms, err);
    else
        lb_error_set(err, r, "out of memory");
    if (r < 0)
        goto out;
    /* 3b. the network link and its rules (the link usually went with the netns already) */
    r = local_net_detach(lp, id, &d->net, err);
    if (r < 0)
        goto out;
    /* 4. the data directory (storage dir), then the sandbox's directory, and then the uid and
     * the address are free; in this order, so a sandbox directory outlives what it accounts
     * for */
    r = remove_data(lp, id, d, err);
    if (r < 0 || !has_dir)
        goto out;
    /* an image's root mounts first: rmtree must never walk into them */
    r = local_image_unmount(dir, err);
    if (r < 0)
        goto out;
    /* a shutdown sweep moves the directory aside (its files are dead: nothing runs as the
     * slot's ids and nothing is mounted in it any more) */
    if (!atomic_load(&lp->defer_removal) || move_aside(lp, id, dir) < 0)
        r = rmtree(dir);
    if (r < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot remove '%s': %s", dir, strerror(-r));
        goto out;
    }
    local_uid_free(lp, d->uid);
    local_net_free_slot(lp, &d->net);
out:
    cgroup_release(&guess);
    if (monfd >= 0)
        close(monfd);
    if (pidfd >= 0)
        close(pidfd);
    return r;
}

/* ---- one stop per id ------------------------------------------------------------------ */

static ssize_t stopping_find(const struct local_provider *lp, const char *id)
{
    size_t i;

    for (i = 0; i < lp->nstopping; i++) {
        if (strcmp(lp->stopping[i], id) == 0)
            return (ssize_t)i;
    }
    return -1;
}

/* Enter / leave the one stop of id allowed at a time. Waiting for a stop of the same id is
 * bounded by deadline_ms (monotonic): -ETIMEDOUT past it. */
int local_stopping_enter(struct local_provider *lp, const char *id, int64_t deadline_ms)
{
    struct timespec until = {.tv_sec = deadline_ms / 1000,
                             .tv_nsec = (long)(deadline_ms % 1000) * 1000000L};
    char *copy = strdup(id);
    int r = 0;

    if (!copy)
        return -ENOMEM;
    pthread_mutex_lock(&lp->stop_lock);
    while (stopping_find(lp, id) >= 0) {
        if (pthread_cond_timedwait(&lp->stopped, &lp->stop_lock, &until) == ETIMEDOUT &&
            stopping_find(lp, id) >= 0) {
            pthread_mutex_unlock(&lp->stop_lock);
            free(copy);
            return -ETIMEDOUT;
        }
    }
    if (lp->nstopping == lp->stopping_cap) {
        size_t cap = lp->stopping_cap ? lp->stopping_cap * 2 : 16;
        char **nv = realloc(lp->stopping, cap * sizeof(*nv));

        if (nv) {
            lp->stopping = nv;
            lp->stopping_cap = cap;
        }
    }
    if (lp->nstopping < lp->stopping_cap)
        lp->stopping[lp->nstopping++] = copy;
    else
        r = -ENOMEM;
    pthread_mutex_unlock(&lp->stop_lock);
    if (r < 0)
        free(copy);
    return r;
}

void local_stopping_leave(struct local_provider *lp, const char *id)
{
    ssize_t i;

    pthread_mutex_lock(&lp->stop_lock);
    i = stopping_find(lp, id);
    if (i >= 0) {
        free(lp->stopping[i]);
        lp->stopping[i] = lp->stopping[--lp->nstopping];
    }
    pthread_cond_broadcast(&lp->stopped);
    pthread_mutex_unlock(&lp->stop_lock);
}

int local_stop(struct lb_provider *p, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
               struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    int64_t deadline = clock_mono_ms() + (timeout_ms > 0 ? timeout_ms : 1);
    struct local_desc d;
    int r;

    if (!ref || !local_id_is_valid(ref->id))
        return lb_error_set(err, -EINVAL, "invalid sandbox id");
    r = local_stopping_enter(lp, ref->id, deadline);
    if (r == -ETIMEDOUT)
        return lb_error_set(err, r, "another stop of sandbox '%s' did not end in time", ref->id);
    if (r < 0)
        return lb_error_set(err, r, "out of memory");
    r = local_desc_load(lp, ref, &d, err);
    if (r == -ENOENT) {
        lb_error_clear(err);
        r = 0;
    } else if (r == 0) {
        r = local_destroy_sandbox(lp, ref->id, &d, deadline, err);
        local_desc_release(&d);
    }
    local_stopping_leave(lp, ref->id);
    return r;
}
