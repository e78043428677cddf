/*
 * local_exclusive.c - exclusive execs: the sweep that leaves only
 * the sandbox's init alive (see local_internal.h), so that a grader's command runs with
 * nothing of the agent left (no process of the agent can watch for it, forge its result or
 * hold its pipes).
 *
 * Which processes are the sandbox's: those whose pid namespace is its init's. The daemon's
 * exec helpers join the sandbox's cgroup and namespaces but stay in the host's pid namespace
 * themselves (only their children are born inside), so they are never hit. Races with
 * processes that fork while the sweep runs: each pass freezes the cgroup first (nothing can
 * fork while frozen), kills, thaws, and the passes repeat until one finds nothing; without a
 * freezer the repetition alone converges, since every survivor of a pass is a child forked by
 * a process that pass killed. Each kill goes through a pidfd taken after the namespace check
 * and checked again, so a pid reused meanwhile is not hit.
 */
#include "provider/local/local_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"

#define FREEZE_MS 2000
#define PASS_PAUSE_MS 10

void local_exec_gates_release(struct local_provider *lp)
{
    gates_release(&lp->gates);
}

/* Is pid in the pid namespace ns (device + inode of /proc/<init>/ns/pid)? *zombie says whether
 * it has exited but is not reaped yet. */
static bool proc_in_ns(pid_t pid, const struct stat *ns, bool *zombie, pid_t *ppid)
{
    char path[64], buf[512];
    struct stat st;
    const char *p;

    snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)pid);
    if (stat(path, &st) < 0 || st.st_dev != ns->st_dev || st.st_ino != ns->st_ino)
        return false;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (local_read_small(path, buf, sizeof(buf)) < 0)
        return false;
    p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || p[2] == 'X')
        return false;
    *zombie = p[2] == 'Z';
    if (ppid) {
        int v = 0;

        *ppid = sscanf(p + 3, " %d", &v) == 1 ? (pid_t)v : 0;
    }
    return true;
}

/* A zombie of the namespace whose parent is outside it (an exec's supervisor, whose helper
 * lives outside): it runs nothing and its parent, not the sandbox's init, reaps it. When that
 * parent is us (the helper died first and we are the subreaper), reap it now. Such a zombie
 * does not hold up the sweep. */
static bool zombie_of_outside_parent(pid_t pid, pid_t ppid, const struct stat *ns)
{
    char path[64];
    struct stat st;

    if (ppid <= 0)
        return false;
    if (ppid == getpid()) {
        siginfo_t si;

        (void)waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG);
        return true;
    }
    snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)ppid);
    return stat(path, &st) == 0 && (st.st_dev != ns->st_dev || st.st_ino != ns->st_ino);
}

/* SIGKILL every live process of the namespace but the init. Returns how many were found,
 * zombies included (a sweep is only done once their parents reaped them, so a command never
 * even sees the agent's dead). */
static int kill_pass(pid_t init, const struct stat *ns)
{
    int found = 0;
    pid_t v;
    DIR *dir = opendir("/proc");

    if (!dir)
        return -errno;
    while ((v = local_proc_next_pid(dir)) > 0) {
        bool zombie = false;
        pid_t ppid = 0;
        int pfd;

        if (v == init || !proc_in_ns(v, ns, &zombie, &ppid))
            continue;
        if (zombie && zombie_of_outside_parent((pid_t)v, ppid, ns))
            continue;
        found++;
        /* A zombie is signalled too: a thread-group leader that exited while its other
         * threads run shows as a zombie, and only a SIGKILL to the group ends them (a true
         * zombie ignores it and is counted until its parent reaps it). */
        pfd = (int)syscall(SYS_pidfd_open, (pid_t)v, 0);
        if (pfd < 0)
            continue; /* gone meanwhile */
        if (proc_in_ns((pid_t)v, ns, &zombie, NULL))
            (void)syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0);
        close(pfd);
    }
    closedir(dir);
    return found;
}

int local_sandbox_quiesce(struct local_provider *lp, const char *id, const struct local_desc *d,
                          int64_t deadline_ms, struct lb_error *err)
{
    char path[64];
    struct stat ns;
    int passes = 0, killed = 0;

    snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)d->pid);
    if (stat(path, &ns) < 0 || !local_desc_alive(d))
        return lb_error_set(err, -ENOENT, "sandbox '%s' is not running", id);
    for (;;) {
        int others = gates_plain_running(&lp->gates, id), found;
        bool frozen = false;

        /* frozen, nothing forks between the scan and the kill */
        if (cgroup_set_frozen(&d->cg, true, FREEZE_MS, NULL) == 0)
            frozen = true;
        found = kill_pass(d->pid, &ns);
        if (frozen || d->cg.version != 0)
            (void)cgroup_set_frozen(&d->cg, false, FREEZE_MS, NULL);
        if (found < 0)
            return lb_error_set(err, -EREMOTEIO, "cannot list processes: %s", strerror(-found));
        passes++;
        killed += found;
        if (found == 0 && others == 0)
            break;
        if (clock_mono_ms() >= deadline_ms)
            return lb_error_set(err, -ETIMEDOUT,
                                "sandbox '%s' still has %d process(es) and %d exec(s) in flight "
                                "after the exclusive sweep",
                                id, found, others);
        usleep(PASS_PAUSE_MS * 1000);
    }
    if (!local_desc_alive(d))
        return lb_error_set(err, -ENOENT, "sandbox '%s' stopped during the exclusive sweep", id);
    log_debug("sbx=%s exclusive: %d process(es) killed in %d pass(es)", id, killed, passes);
    return 0;
}
