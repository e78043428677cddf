/*
 * proc.c - what the local provider reads from /proc and does with it: a process's stat fields
 * (start time, parent, session), whether a sandbox's init is the very process its descriptor
 * names, killing a process tree, an exec's session or every process of a uid slot, and reaping
 * the daemon's children; what an in-place reset may keep of a sandbox's init (its limits,
 * nice value and CPUs, recorded at create).
 */
#include "provider/local/local_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"

/* How long a kill that answers for its processes waits for them to end, and for how many. */
#define KILL_WAIT_MS 2000
#define KILL_WAIT_MAX 256
#define KILL_PASSES 8

/* ---- /proc ---------------------------------------------------------------------------- */

ssize_t local_read_small(const char *path, char *buf, size_t size)
{
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return -1;
    n = read(fd, buf, size - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    return n;
}

/* /proc/<pid>/<name> into buf as local_read_small does: the byte count, or -ENOENT when the
 * process is gone (or the file cannot be read). */
static ssize_t proc_read(pid_t pid, const char *name, char *buf, size_t size)
{
    char path[64];
    ssize_t n;

    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, name);
    n = local_read_small(path, buf, size);
    return n < 0 ? -ENOENT : n;
}

/* /proc/<pid>/stat into buf; *tail points just past the command name (which may hold spaces
 * and ')', so the fields start after the last ')'), at field 3. 0, -ENOENT when gone, -EIO
 * when there is no ')'. */
static int proc_stat_read(pid_t pid, char *buf, size_t size, const char **tail)
{
    if (proc_read(pid, "stat", buf, size) < 0)
        return -ENOENT;
    *tail = strrchr(buf, ')');
    if (!*tail)
        return -EIO;
    (*tail)++;
    return 0;
}

/* State (field 3), parent pid (4) and start time (22) of /proc/<pid>/stat. 0, -ENOENT when
 * the process is gone, -EIO when the line does not parse. */
static int proc_stat_session(pid_t pid, char *state, pid_t *ppid, pid_t *session,
                             uint64_t *start_time);

static int proc_stat(pid_t pid, char *state, pid_t *ppid, uint64_t *start_time)
{
    return proc_stat_session(pid, state, ppid, NULL, start_time);
}

/* Fields 3 (state), 4 (ppid), 6 (session, as the host sees it) and 22 (start time) of
 * /proc/<pid>/stat; session may be NULL. -ENOENT when gone. */
static int proc_stat_session(pid_t pid, char *state, pid_t *ppid, pid_t *session,
                             uint64_t *start_time)
{
    char buf[1024];
    unsigned long long st;
    const char *p;
    int pp, sid, r = proc_stat_read(pid, buf, sizeof(buf), &p);

    if (r < 0)
        return r;
    if (sscanf(p,
               " %c %d %*d %d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d "
               "%*d %*d %llu",
               state, &pp, &sid, &st) != 4)
        return -EIO;
    *ppid = (pid_t)pp;
    if (session)
        *session = (pid_t)sid;
    *start_time = st;
    return 0;
}

int local_proc_start_time(pid_t pid, uint64_t *start_time)
{
    char state;
    pid_t ppid;
    int r = proc_stat(pid, &state, &ppid, start_time);

    if (r == 0 && (state == 'Z' || state == 'X'))
        return -ENOENT; /* dead, only not yet reaped */
    return r;
}

int local_proc_parent(pid_t pid, pid_t *ppid, uint64_t *start_time)
{
    char state;
    int r = proc_stat(pid, &state, ppid, start_time);

    if (r == 0 && (state == 'Z' || state == 'X'))
        return -ENOENT;
    return r;
}

bool local_desc_alive(const struct local_desc *d)
{
    uint64_t st;

    return d->pid > 0 && local_proc_start_time(d->pid, &st) == 0 && st == d->start_time;
}

bool local_desc_exiting(const struct local_desc *d)
{
    char buf[1024];
    unsigned long flags;
    const char *p;

    if (!local_desc_alive(d) || proc_stat_read(d->pid, buf, sizeof(buf), &p) < 0)
        return false;
    /* field 9, the kernel's task flags; PF_EXITING (0x4) is set as the exit begins, before a
     * pid namespace's init kills the rest of its namespace */
    if (sscanf(p, " %*c %*d %*d %*d %*d %*d %lu", &flags) != 1)
        return false;
    return (flags & 0x4) != 0;
}

int local_proc_uid(pid_t pid, uint32_t *uid, bool *zombie)
{
    char buf[2048];
    unsigned int u;
    const char *p;

    if (proc_read(pid, "status", buf, sizeof(buf)) < 0)
        return -ENOENT;
    p = strstr(buf, "\nUid:");
    if (!p || sscanf(p + 5, "%u", &u) != 1)
        return -EIO;
    p = strstr(buf, "\nState:");
    *zombie = p && (strncmp(p + 7, "\tZ", 2) == 0 || strncmp(p + 7, "\tX", 2) == 0);
    *uid = u;
    return 0;
}

/* Is u one of the LOCAL_SLOT_IDS host ids of the slot whose first id is first? */
static bool uid_in_slot(uint32_t u, uint32_t first)
{
    return u >= first && u - first < LOCAL_SLOT_IDS;
}

pid_t local_proc_next_pid(DIR *d)
{
    struct dirent *de;

    while ((de = readdir(d))) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);

        if (*end == '\0' && pid > 0 && pid <= INT_MAX)
            return pid;
    }
    return 0;
}

/* SIGKILL every live process whose real uid is one of the slot's ids (first: its first id,
 * the sandbox's root). Returns how many were still alive. A pid is pinned with a pidfd and
 * its uid read again before the kill, so a reused pid is safe. */
int local_kill_uid(uint32_t uid)
{
    DIR *d = opendir("/proc");
    int alive = 0;
    pid_t pid;

    if (!d)
        return -errno;
    while ((pid = local_proc_next_pid(d)) > 0) {
        uint32_t u;
        bool zombie;
        int pfd;

        if (local_proc_uid(pid, &u, &zombie) < 0 || !uid_in_slot(u, uid) || zombie)
            continue;
        pfd = (int)syscall(SYS_pidfd_open, pid, 0);
        if (pfd < 0)
            continue;
        if (local_proc_uid(pid, &u, &zombie) == 0 && uid_in_slot(u, uid) && !zombie) {
            alive++;
            (void)syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0);
        }
        close(pfd);
    }
    closedir(d);
    return alive;
}

/* Parent pid of pid (also of a zombie), or -1. */
pid_t local_proc_ppid(pid_t pid)
{
    uint64_t start_time;
    pid_t ppid;
    char state;

    return proc_stat(pid, &state, &ppid, &start_time) == 0 ? ppid : -1;
}

/* Reap this process's zombie children that ran as one of the slot's ids (bwrap's monitor process:
 * lendboxd is a child subreaper, so the monitor of a sandbox it started becomes its child). */
void local_reap_uid_children(uint32_t uid)
{
    pid_t self = getpid(), pid;
    DIR *d = opendir("/proc");

    if (!d)
        return;
    while ((pid = local_proc_next_pid(d)) > 0) {
        uint32_t u;
        bool zombie;

        if (local_proc_uid(pid, &u, &zombie) < 0 || !uid_in_slot(u, uid) || !zombie)
            continue;
        if (local_proc_ppid(pid) == self)
            (void)waitpid(pid, NULL, WNOHANG);
    }
    closedir(d);
}

int local_wait_child(pid_t pid, int64_t deadline_ms, int *status)
{
    int fd = (int)syscall(SYS_pidfd_open, pid, 0), st = 0;
    pid_t w;

    if (fd >= 0) {
        for (;;) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            int64_t left = deadline_ms - clock_mono_ms();
            int n = poll(&p, 1, left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left);

            if (n >= 0 || errno != EINTR)
                break;
        }
        close(fd);
    }
    while ((w = waitpid(pid, &st, WNOHANG)) < 0 && errno == EINTR)
        ;
    if (w == 0)
        return -ETIMEDOUT;
    if (w < 0)
        return -errno;
    if (status)
        *status = st;
    return 0;
}

static void *reaper_main(void *arg)
{
    pid_t pid = (pid_t)(intptr_t)arg;

    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return NULL;
}

void local_reap_later(pid_t pid)
{
    pthread_attr_t attr;
    pthread_t t;

    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    if (pthread_create(&t, &attr, reaper_main, (void *)(intptr_t)pid) != 0)
        log_warn("cannot start a reaper for process %d; it stays a zombie once it exits", (int)pid);
    pthread_attr_destroy(&attr);
}

/* Is pid in the pid namespace whose inode is pidns? */
static bool proc_in_pidns(pid_t pid, ino_t pidns)
{
    char path[64];
    struct stat sb;

    snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)pid);
    return stat(path, &sb) == 0 && sb.st_ino == pidns;
}

static int kill_closure(pid_t root, pid_t sid, ino_t pidns, const struct lb_cgroup *cg,
                        int64_t wait_ms);

int local_kill_tree(pid_t root, const struct lb_cgroup *cg)
{
    return kill_closure(root, 0, 0, cg, 0);
}

int local_kill_tree_wait(pid_t root, const struct lb_cgroup *cg, int64_t wait_ms)
{
    return kill_closure(root, 0, 0, cg, wait_ms);
}

int local_kill_session(const struct local_desc *d, pid_t sid)
{
    char path[64];
    struct stat sb;

    if (sid <= 0 || d->pid <= 0)
        return -EINVAL;
    snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)d->pid);
    if (stat(path, &sb) < 0)
        return -errno;
    return kill_closure(0, sid, sb.st_ino, &d->cg, KILL_WAIT_MS);
}

/* Wait until each of the n pidfds says its process has ended, or until wait_ms passed. */
static void wait_pidfds(const int *fds, size_t n, int64_t wait_ms)
{
    struct pollfd p[KILL_WAIT_MAX];
    int64_t deadline = clock_mono_ms() + wait_ms, left;
    size_t np = 0;

    for (size_t i = 0; i < n && np < KILL_WAIT_MAX; i++)
        p[np++] = (struct pollfd){.fd = fds[i], .events = POLLIN};
    while (np > 0 && (left = deadline - clock_mono_ms()) > 0) {
        if (poll(p, np, (int)left) < 0 && errno != EINTR)
            return;
        for (size_t i = 0; i < np;)
            if (p[i].revents)
                p[i] = p[--np];
            else
                i++;
    }
}

/* One pass of kill_closure over one snapshot of /proc. */
static int kill_closure_pass(pid_t root, pid_t sid, ino_t pidns, const struct lb_cgroup *cg,
                             int64_t wait_ms)
{
    int waitfds[KILL_WAIT_MAX];
    size_t nwait = 0;
    pid_t *pids = NULL, *parents = NULL;
    uint64_t *starts = NULL;
    size_t n = 0, nall = 0, cap = 0, i;
    bool grew = true;
    int killed = 0;
    pid_t pid;
    DIR *d;

    /* one snapshot of (pid, parent) for every process; then the closure from the seeds */
    d = opendir("/proc");
    if (!d)
        return -errno;
    while ((pid = local_proc_next_pid(d)) > 0) {
        char state;
        uint64_t st;
        pid_t pp, ps;

        if (proc_stat_session(pid, &state, &pp, &ps, &st) < 0)
            continue;
        if (state == 'Z' || state == 'X')
            continue;
        if (nall == cap) {
            size_t nc = cap ? cap * 2 : 1024;
            pid_t *np = realloc(pids, nc * sizeof(*np)), *nq;
            uint64_t *ns;

            if (np)
                pids = np;
            nq = np ? realloc(parents, nc * sizeof(*nq)) : NULL;
            if (nq)
                parents = nq;
            ns = nq ? realloc(starts, nc * sizeof(*ns)) : NULL;
            if (!ns) {
                closedir(d);
                killed = -ENOMEM;
                goto out;
            }
            starts = ns;
            cap = nc;
        }
        pids[nall] = pid;
        /* a member of the session is a seed, whatever its parent: -1 marks it */
        parents[nall] = sid > 0 && ps == sid && proc_in_pidns(pid, pidns) ? -1 : pp;
        starts[nall++] = st;
    }
    closedir(d);
    /* move the seeds (root, the session's members) to the front: [0, n) */
    for (i = 0; i < nall; i++) {
        if (pids[i] == root || parents[i] == -1) {
            pid_t tp = pids[n], tq = parents[n];
            uint64_t ts = starts[n];

            pids[n] = pids[i], parents[n] = parents[i], starts[n] = starts[i];
            pids[i] = tp, parents[i] = tq, starts[i] = ts;
            n++;
        }
    }
    while (grew && n > 0) {
        grew = false;
        for (i = n; i < nall; i++) {
            bool child = false;

            for (size_t k = 0; k < n && !child; k++)
                child = parents[i] == pids[k];
            if (child) {
                pid_t tp = pids[n], tq = parents[n];
                uint64_t ts = starts[n];

                pids[n] = pids[i], parents[n] = parents[i], starts[n] = starts[i];
                pids[i] = tp, parents[i] = tq, starts[i] = ts;
                n++;
                grew = true;
            }
        }
    }
    /* A frozen task does not die (v1): let the tree's processes run for their kill. */
    if (cg && cg->version)
        (void)cgroup_unfreeze_procs(cg, pids, n);
    for (i = 0; i < n; i++) {
        int pfd = (int)syscall(SYS_pidfd_open, pids[i], 0);
        uint64_t st;

        if (pfd < 0)
            continue;
        /* the pid is pinned now: is it still the process of the snapshot? */
        if (local_proc_start_time(pids[i], &st) == 0 && st == starts[i] &&
            syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0) == 0) {
            killed++;
            if (wait_ms > 0 && nwait < KILL_WAIT_MAX) {
                waitfds[nwait++] = pfd;
                continue;
            }
        }
        close(pfd);
    }
    /* a killed process is not gone at once (it has to be scheduled to exit): the callers
     * that answer "the command's processes are gone" wait for it */
    wait_pidfds(waitfds, nwait, wait_ms);
    for (i = 0; i < nwait; i++)
        close(waitfds[i]);
out:
    free(pids);
    free(parents);
    free(starts);
    return killed;
}

/* SIGKILL root (0: none) and the members of session sid (0: none) that live in the pid
 * namespace pidns, and every descendant of them; how many were signalled, or -errno. With
 * wait_ms > 0, each pass returns once the first KILL_WAIT_MAX of its processes have ended or
 * wait_ms passed. A process that forked after the pass read /proc and before its kill leaves a
 * child the pass did not see: with a session, passes repeat until one finds none of its members
 * to kill (at most KILL_PASSES); a tree without a session has one pass (the child of a killed
 * parent is reparented away from the tree, so a later pass would not find it either). */
static int kill_closure(pid_t root, pid_t sid, ino_t pidns, const struct lb_cgroup *cg,
                        int64_t wait_ms)
{
    int total = 0;

    for (int pass = 0; pass < KILL_PASSES; pass++) {
        /* root's pid may be another process's after the first pass killed it */
        int n = kill_closure_pass(pass == 0 ? root : 0, sid, pidns, cg, wait_ms);

        if (n < 0)
            return total > 0 ? total : n;
        total += n;
        if (n == 0 || sid <= 0)
            break;
    }
    return total;
}

/* ---------- what an in-place reset may keep of the init ---------- */

#define INIT_ATTRS_FILE "init.attrs"
#define INIT_ATTRS_MAX 8192

/* What a sandbox process may change of the init (its uid is theirs): its resource limits
 * (/proc/PID/limits), nice value, scheduling policy and priority, I/O priority and CPUs, as
 * text into buf. 0, or -1 when pid cannot be read. */
static int init_attrs_text(pid_t pid, char *buf, size_t size)
{
    cpu_set_t cpus;
    ssize_t got = proc_read(pid, "limits", buf, size);
    struct sched_param param = {0};
    size_t n;
    int nice_value, policy;
    long io;

    if (got < 0)
        return -1;
    n = (size_t)got;
    errno = 0;
    nice_value = getpriority(PRIO_PROCESS, (id_t)pid);
    if ((nice_value == -1 && errno) || sched_getaffinity(pid, sizeof(cpus), &cpus) < 0)
        return -1;
    policy = sched_getscheduler(pid);
    io = syscall(SYS_ioprio_get, 1 /* IOPRIO_WHO_PROCESS */, (int)pid);
    if (policy < 0 || sched_getparam(pid, &param) < 0 || io < 0)
        return -1;
    n += (size_t)snprintf(buf + n, size - n, "nice %d\nsched %d %d\nioprio %ld\ncpus", nice_value,
                          policy, param.sched_priority, io);
    for (int c = 0; c < CPU_SETSIZE && n + 8 < size; c++)
        if (CPU_ISSET(c, &cpus))
            n += (size_t)snprintf(buf + n, size - n, " %d", c);
    return 0;
}

void local_init_attrs_save(const char *dir, pid_t pid)
{
    char path[4400], text[INIT_ATTRS_MAX];
    int fd;

    snprintf(path, sizeof(path), "%s/" INIT_ATTRS_FILE, dir);
    if (init_attrs_text(pid, text, sizeof(text)) < 0 ||
        (fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0)
        return;
    if (write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        (void)unlink(path);
    close(fd);
}

bool local_init_attrs_kept(const char *dir, pid_t pid)
{
    char path[4400], was[INIT_ATTRS_MAX], now[INIT_ATTRS_MAX];

    snprintf(path, sizeof(path), "%s/" INIT_ATTRS_FILE, dir);
    return local_read_small(path, was, sizeof(was)) > 0 &&
           init_attrs_text(pid, now, sizeof(now)) == 0 && strcmp(was, now) == 0;
}
