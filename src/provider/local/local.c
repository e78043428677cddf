/*
 * local.c - the local provider (see local.h): the provider object, uid slot allocation,
 * descriptors, status, list, stop, pause/resume. create, exec and the file operations live in
 * local_create.c, local_exec.c and local_files.c (local_internal.h ties them together).
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
#include <fcntl.h>
#include <inttypes.h>
#include <linux/keyctl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/log.h"

#define UID_COUNT_MAX 32768u /* slots: 2^31 / LOCAL_SLOT_IDS */
#define SWEEP_STEP_MS 10
#define FREEZE_TIMEOUT_MS 5000
#define THAW_WAIT_MS 2000
#define DESCRIPTOR_MAX 16384

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ---- ids, dirs, uids ------------------------------------------------------------------ */

bool local_id_is_valid(const char *id)
{
    size_t i, n;

    if (!id)
        return false;
    n = strnlen(id, 129);
    if (n == 0 || n > 128 || id[0] == '.')
        return false;
    for (i = 0; i < n; i++) {
        char c = id[i];

        if (!(('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return false;
    }
    return true;
}

void local_sandbox_dir(const struct local_provider *lp, const char *id, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%s", lp->sandboxes_dir, id);
}

/* ---- host-wide slot claims ---------------------------------------------------------------
 * Every slot in use is claimed host-wide, so no two lendboxd (whatever their state dirs and
 * uid_base) ever use overlapping ids at once: a stop kills every process of the slot's ids.
 * A claim is the file LOCAL_SLOT_CLAIM_DIR/<first id of the slot>, made with O_EXCL, holding
 * the claimer's identity ("<dev>:<ino> <state dir>\n" of its state dir). uid_base is a multiple
 * of LOCAL_SLOT_IDS, so two daemons' slots either coincide or are disjoint. A claim whose state
 * dir no longer exists (or is another directory now) is stale and may be removed; a daemon that
 * died keeps its claims (its sandboxes outlive it) until it starts again and drops the ones of
 * no live sandbox. /run is a tmpfs: every claim goes at reboot, and so does every sandbox. */

/* The claim file's path of the slot whose first id is first. */
static void claim_path(uint32_t first, char *buf, size_t size)
{
    snprintf(buf, size, "%s/%" PRIu32, LOCAL_SLOT_CLAIM_DIR, first);
}

/* The claim's content: 0, or -errno when the file cannot be read. */
static int claim_read(const char *path, char *buf, size_t size)
{
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

    if (fd < 0)
        return -errno;
    n = read(fd, buf, size - 1);
    close(fd);
    if (n < 0)
        return -EIO;
    buf[n] = '\0';
    return 0;
}

/* Is the claim's owner provably gone: its state dir no longer exists or is another directory? */
static bool claim_is_stale(const char *content)
{
    unsigned long long dev, ino;
    char path[4096];
    struct stat st;

    if (sscanf(content, "%llu:%llu %4095[^\n]", &dev, &ino, path) != 3)
        return false; /* being written right now, or not ours to judge */
    if (stat(path, &st) < 0)
        return errno == ENOENT || errno == ENOTDIR;
    return (unsigned long long)st.st_dev != dev || (unsigned long long)st.st_ino != ino;
}

/* Remove the claim at path if it is still the stale one; under the claim dir's lock, so a
 * claim made after another daemon's check is never removed. */
static void claim_remove_stale(const char *path)
{
    char content[4200];
    int lk = open(LOCAL_SLOT_CLAIM_DIR "/.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);

    if (lk < 0)
        return;
    if (flock(lk, LOCK_EX) == 0 && claim_read(path, content, sizeof(content)) == 0 &&
        claim_is_stale(content))
        (void)unlink(path);
    close(lk);
}

/* Claim the slot whose first id is first. 0 when it is ours now (also when it already named us),
 * -EBUSY when another live daemon holds it, another -errno when the claim dir is unusable. */
static int claim_take(const struct local_provider *lp, uint32_t first)
{
    char path[128], content[4200];
    int tries, fd;

    claim_path(first, path, sizeof(path));
    for (tries = 0; tries < 2; tries++) {
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd >= 0) {
            size_t len = strlen(lp->claim_id);
            ssize_t n = write(fd, lp->claim_id, len);

            close(fd);
            if (n != (ssize_t)len) {
                (void)unlink(path);
                return -EIO;
            }
            return 0;
        }
        if (errno != EEXIST)
            return -errno;
        if (claim_read(path, content, sizeof(content)) < 0)
            continue; /* removed meanwhile: try again */
        if (strcmp(content, lp->claim_id) == 0)
            return 0;
        if (!claim_is_stale(content))
            return -EBUSY;
        claim_remove_stale(path);
    }
    return -EBUSY;
}

/* Drop our claim of the slot whose first id is first (never another daemon's). */
static void claim_drop(const struct local_provider *lp, uint32_t first)
{
    char path[128], content[4200];

    claim_path(first, path, sizeof(path));
    if (claim_read(path, content, sizeof(content)) == 0 && strcmp(content, lp->claim_id) == 0)
        (void)unlink(path);
}

/* ---- uid slots -------------------------------------------------------------------------- */

/* Is uid the first host id of one of our slots (a sandbox's root)? */
static bool local_uid_in_range(const struct local_provider *lp, uint32_t uid)
{
    return uid >= lp->uid_base && (uid - lp->uid_base) % LOCAL_SLOT_IDS == 0 &&
           (uid - lp->uid_base) / LOCAL_SLOT_IDS < lp->uid_count;
}

static bool uid_bit_get(const struct local_provider *lp, uint32_t bit)
{
    return lp->uid_used[bit / 8] & (1u << (bit % 8));
}

static void uid_bit_set(struct local_provider *lp, uint32_t bit, bool on)
{
    if (on)
        lp->uid_used[bit / 8] |= (uint8_t)(1u << (bit % 8));
    else
        lp->uid_used[bit / 8] &= (uint8_t) ~(1u << (bit % 8));
}

int local_uid_alloc(struct local_provider *lp, uint32_t *uid)
{
    uint32_t i, bit;
    int r = -EUSERS;

    pthread_mutex_lock(&lp->lock);
    for (i = 0; i < lp->uid_count; i++) {
        bit = (lp->uid_next + i) % lp->uid_count;
        if (uid_bit_get(lp, bit))
            continue;
        /* a slot another lendboxd holds is skipped, not an error */
        r = claim_take(lp, lp->uid_base + bit * LOCAL_SLOT_IDS);
        if (r == -EBUSY) {
            r = -EUSERS;
            continue;
        }
        if (r < 0) {
            log_error("cannot claim a uid slot in %s: %s", LOCAL_SLOT_CLAIM_DIR, strerror(-r));
            r = -EUSERS;
            break;
        }
        uid_bit_set(lp, bit, true);
        lp->uid_next = (bit + 1) % lp->uid_count;
        *uid = lp->uid_base + bit * LOCAL_SLOT_IDS;
        r = 0;
        break;
    }
    pthread_mutex_unlock(&lp->lock);
    return r;
}

/* The slot-aligned first ids (absolute: multiples of LOCAL_SLOT_IDS) of the one or two slots
 * that the LOCAL_SLOT_IDS ids from uid on cover: a uid of an older version (one uid per
 * sandbox) need not be slot-aligned. Returns how many (1 or 2). */
static int uid_slots(uint32_t uid, uint32_t first[2])
{
    first[0] = uid - uid % LOCAL_SLOT_IDS;
    if (uid % LOCAL_SLOT_IDS == 0 || first[0] > UINT32_MAX - LOCAL_SLOT_IDS)
        return 1;
    first[1] = first[0] + LOCAL_SLOT_IDS;
    return 2;
}

/* Mark the slot(s) of an adopted sandbox (uid: its first id) in use, here and host-wide. */
static void local_uid_mark(struct local_provider *lp, uint32_t uid)
{
    uint32_t first[2];
    int i, n;

    if (uid == 0)
        return;
    n = uid_slots(uid, first);
    pthread_mutex_lock(&lp->lock);
    for (i = 0; i < n; i++) {
        bool ours = local_uid_in_range(lp, first[i]);
        uint32_t bit = ours ? (first[i] - lp->uid_base) / LOCAL_SLOT_IDS : 0;
        int r;

        if (ours && uid_bit_get(lp, bit))
            continue; /* claimed already: marks come with every descriptor load */
        r = claim_take(lp, first[i]);
        if (r < 0)
            log_warn("sandbox uid %" PRIu32 ": cannot claim the host ids %" PRIu32 "..%" PRIu32
                     " (%s)",
                     uid, first[i], first[i] + (LOCAL_SLOT_IDS - 1),
                     r == -EBUSY ? "another lendboxd holds them" : strerror(-r));
        if (ours)
            uid_bit_set(lp, bit, true);
    }
    pthread_mutex_unlock(&lp->lock);
}

void local_uid_free(struct local_provider *lp, uint32_t uid)
{
    uint32_t first[2];
    int i, n;

    if (uid == 0)
        return;
    n = uid_slots(uid, first);
    pthread_mutex_lock(&lp->lock);
    for (i = 0; i < n; i++) {
        claim_drop(lp, first[i]);
        if (local_uid_in_range(lp, first[i]))
            uid_bit_set(lp, (first[i] - lp->uid_base) / LOCAL_SLOT_IDS, false);
    }
    pthread_mutex_unlock(&lp->lock);
}

/* At start, after every live sandbox's slots are marked: drop our claims of slots that no
 * sandbox uses any more (a crash between a sandbox's removal and its claim's), and make the
 * claim dir. One readdir, at start only. */
static int claims_start(struct local_provider *lp, struct lb_error *err)
{
    struct stat st;

    if ((mkdir("/run/lendbox", 0755) < 0 && errno != EEXIST) ||
        (mkdir(LOCAL_SLOT_CLAIM_DIR, 0755) < 0 && errno != EEXIST))
        return lb_error_set(err, -EREMOTEIO, "cannot make '%s': %s", LOCAL_SLOT_CLAIM_DIR,
                            strerror(errno));
    if (lstat(LOCAL_SLOT_CLAIM_DIR, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
        return lb_error_set(err, -EREMOTEIO, "'%s' is not a directory of this user",
                            LOCAL_SLOT_CLAIM_DIR);
    if (stat(lp->state_dir, &st) < 0)
        return lb_error_set(err, -EREMOTEIO, "cannot stat '%s': %s", lp->state_dir,
                            strerror(errno));
    if (asprintf(&lp->claim_id, "%llu:%llu %s\n", (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino, lp->state_dir) < 0) {
        lp->claim_id = NULL;
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    return 0;
}

/* Drop our claims that no live sandbox of ours accounts for (called after local_list). */
static void claims_sweep(struct local_provider *lp, json_t *all)
{
    char path[300], content[4200];
    struct dirent *de;
    DIR *dir = opendir(LOCAL_SLOT_CLAIM_DIR);
    size_t i;

    if (!dir)
        return;
    while ((de = readdir(dir))) {
        char *end;
        unsigned long v;
        bool used = false;

        errno = 0;
        v = strtoul(de->d_name, &end, 10);
        if (de->d_name[0] < '0' || de->d_name[0] > '9' || *end || errno || v > UINT32_MAX)
            continue;
        snprintf(path, sizeof(path), "%s/%s", LOCAL_SLOT_CLAIM_DIR, de->d_name);
        if (claim_read(path, content, sizeof(content)) < 0 || strcmp(content, lp->claim_id))
            continue;
        for (i = 0; all && i < json_array_size(all) && !used; i++) {
            json_t *u =
                json_object_get(json_object_get(json_array_get(all, i), "descriptor"), "uid");
            uint32_t first[2];
            int k, n;

            if (!json_is_integer(u) || json_integer_value(u) <= 0 ||
                json_integer_value(u) > UINT32_MAX)
                continue;
            n = uid_slots((uint32_t)json_integer_value(u), first);
            for (k = 0; k < n; k++)
                used = used || first[k] == (uint32_t)v;
        }
        if (!used) {
            log_info("dropping the claim of host ids %lu.. (no sandbox uses them)", v);
            (void)unlink(path);
        }
    }
    closedir(dir);
}

/* ---- /proc ---------------------------------------------------------------------------- */

/* Fields of /proc/<pid>/stat after the command name (which may hold spaces and ')', so they
 * start after the last ')'): state (field 3), parent pid (4), start time (22). 0, -ENOENT when
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
    char path[64], buf[1024];
    unsigned long long st;
    const char *p;
    ssize_t n;
    int fd, pp, sid;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ESRCH ? -ENOENT : -errno;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -ENOENT;
    buf[n] = '\0';
    p = strrchr(buf, ')');
    if (!p || sscanf(p + 1,
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

bool local_desc_alive(const struct local_desc *d)
{
    uint64_t st;

    return d->pid > 0 && local_proc_start_time(d->pid, &st) == 0 && st == d->start_time;
}

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

bool local_desc_exiting(const struct local_desc *d)
{
    char path[64], buf[1024];
    unsigned long flags;
    const char *p;

    if (!local_desc_alive(d))
        return false;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)d->pid);
    if (local_read_small(path, buf, sizeof(buf)) < 0)
        return false;
    p = strrchr(buf, ')');
    /* field 9, the kernel's task flags; PF_EXITING (0x4) is set as the exit begins, before a
     * pid namespace's init kills the rest of its namespace */
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %lu", &flags) != 1)
        return false;
    return (flags & 0x4) != 0;
}

/* Real uid and state of pid from /proc/<pid>/status; -ENOENT when gone. */
static int proc_uid(pid_t pid, uint32_t *uid, bool *zombie)
{
    char path[64], buf[2048];
    unsigned int u;
    const char *p;
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -ENOENT;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -ENOENT;
    buf[n] = '\0';
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

/* SIGKILL every live process whose real uid is one of the slot's ids (first: its first id,
 * the sandbox's root). Returns how many were still alive. A pid is pinned with a pidfd and
 * its uid read again before the kill, so a reused pid is safe. */
static int kill_uid(uint32_t uid)
{
    struct dirent *de;
    int alive = 0;
    DIR *d;

    d = opendir("/proc");
    if (!d)
        return -errno;
    while ((de = readdir(d))) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        uint32_t u;
        bool zombie;
        int pfd;

        if (*end || pid <= 0 || pid > INT_MAX)
            continue;
        if (proc_uid((pid_t)pid, &u, &zombie) < 0 || !uid_in_slot(u, uid) || zombie)
            continue;
        pfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
        if (pfd < 0)
            continue;
        if (proc_uid((pid_t)pid, &u, &zombie) == 0 && uid_in_slot(u, uid) && !zombie) {
            alive++;
            (void)syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0);
        }
        close(pfd);
    }
    closedir(d);
    return alive;
}

/* Parent pid of pid (also of a zombie), or -1. */
static pid_t proc_ppid(pid_t pid)
{
    uint64_t start_time;
    pid_t ppid;
    char state;

    return proc_stat(pid, &state, &ppid, &start_time) == 0 ? ppid : -1;
}

/* Reap this process's zombie children that ran as one of the slot's ids (bwrap's monitor process:
 * lendboxd is a child subreaper, so the monitor of a sandbox it started becomes its child). */
static void reap_uid_children(uint32_t uid)
{
    struct dirent *de;
    pid_t self = getpid();
    DIR *d = opendir("/proc");

    if (!d)
        return;
    while ((de = readdir(d))) {
        long pid = strtol(de->d_name, NULL, 10);
        uint32_t u;
        bool zombie;

        if (pid <= 0 || proc_uid((pid_t)pid, &u, &zombie) < 0 || !uid_in_slot(u, uid) || !zombie)
            continue;
        if (proc_ppid((pid_t)pid) == self)
            (void)waitpid((pid_t)pid, NULL, WNOHANG);
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

/* Wait (until deadline_ms) for our child pid to exit, and reap it. */
static void reap_child(pid_t pid, int64_t deadline_ms)
{
    (void)local_wait_child(pid, deadline_ms, NULL);
}

/* Is pid in the pid namespace whose inode is pidns? */
static bool proc_in_pidns(pid_t pid, ino_t pidns)
{
    char path[64];
    struct stat sb;

    snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)pid);
    return stat(path, &sb) == 0 && sb.st_ino == pidns;
}

static int kill_closure(pid_t root, pid_t sid, ino_t pidns, const struct lb_cgroup *cg);

int local_kill_tree(pid_t root, const struct lb_cgroup *cg)
{
    return kill_closure(root, 0, 0, cg);
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
    return kill_closure(0, sid, sb.st_ino, &d->cg);
}

/* SIGKILL root (0: none) and the members of session sid (0: none) that live in the pid
 * namespace pidns, and every descendant of them; how many were signalled, or -errno. */
static int kill_closure(pid_t root, pid_t sid, ino_t pidns, const struct lb_cgroup *cg)
{
    pid_t *pids = NULL, *parents = NULL;
    uint64_t *starts = NULL;
    size_t n = 0, nall = 0, cap = 0, i;
    struct dirent *de;
    bool grew = true;
    int killed = 0;
    DIR *d;

    /* one snapshot of (pid, parent) for every process; then the closure from the seeds */
    d = opendir("/proc");
    if (!d)
        return -errno;
    while ((de = readdir(d))) {
        char *end, state;
        long pid = strtol(de->d_name, &end, 10);
        uint64_t st;
        pid_t pp, ps;

        if (*end || pid <= 0 || pid > INT_MAX ||
            proc_stat_session((pid_t)pid, &state, &pp, &ps, &st) < 0)
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
        pids[nall] = (pid_t)pid;
        /* a member of the session is a seed, whatever its parent: -1 marks it */
        parents[nall] = sid > 0 && ps == sid && proc_in_pidns((pid_t)pid, pidns) ? -1 : pp;
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
            syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0) == 0)
            killed++;
        close(pfd);
    }
out:
    free(pids);
    free(parents);
    free(starts);
    return killed;
}

/* ---- descriptors ---------------------------------------------------------------------- */

void local_desc_release(struct local_desc *d)
{
    cgroup_release(&d->cg);
    local_net_release(&d->net);
}

static int local_desc_from_json(const json_t *j, const char *id, struct local_desc *d)
{
    json_int_t pid = 0, st = 0, uid = 0;
    const char *workdir = LOCAL_DEFAULT_WORKDIR, *data = NULL, *base, *image = NULL;
    json_t *cg = NULL, *net = NULL;
    int r;

    memset(d, 0, sizeof(*d));
    if (!json_is_object(j) ||
        json_unpack((json_t *)j, "{s?I,s?I,s:I,s?s,s?o,s?s,s?o,s?s}", "pid", &pid, "start_time",
                    &st, "uid", &uid, "workdir", &workdir, "cgroup", &cg, "data", &data, "net",
                    &net, "image", &image) < 0)
        return -EINVAL;
    if (image && (!provider_path_is_valid(image) || strlen(image) >= sizeof(d->image)))
        return -EINVAL;
    if (local_net_from_json(net, &d->net) < 0)
        return -EINVAL;
    if (pid < 0 || pid > INT_MAX || st < 0 || uid <= 0 || uid > UINT32_MAX ||
        !provider_path_is_valid(workdir) || strlen(workdir) >= sizeof(d->workdir))
        return -EINVAL;
    /* a data directory is removed at stop: only ever <some dir>/<this id> */
    if (data && (!provider_path_is_valid(data) || strlen(data) >= sizeof(d->data) ||
                 !(base = strrchr(data, '/')) || strcmp(base + 1, id) != 0))
        return -EINVAL;
    if (data)
        snprintf(d->data, sizeof(d->data), "%s", data);
    if (image)
        snprintf(d->image, sizeof(d->image), "%s", image);
    r = cgroup_from_json(cg, id, &d->cg);
    if (r < 0)
        return r;
    d->pid = (pid_t)pid;
    d->start_time = (uint64_t)st;
    d->uid = (uint32_t)uid;
    snprintf(d->workdir, sizeof(d->workdir), "%s", workdir);
    return 0;
}

json_t *local_desc_to_json(const struct local_desc *d, const char *dir)
{
    json_t *o, *cg = cgroup_to_json(&d->cg);

    if (!cg)
        return NULL;
    o = json_pack("{s:I,s:I,s:I,s:s,s:s,s:o}", "pid", (json_int_t)d->pid, "start_time",
                  (json_int_t)d->start_time, "uid", (json_int_t)d->uid, "dir", dir, "workdir",
                  d->workdir, "cgroup", cg);
    if (o && d->data[0] && json_object_set_new(o, "data", json_string(d->data)) < 0) {
        json_decref(o);
        return NULL;
    }
    if (o && d->image[0] && json_object_set_new(o, "image", json_string(d->image)) < 0) {
        json_decref(o);
        return NULL;
    }
    if (o && d->net.mode != LOCAL_NET_NONE) {
        json_t *net = local_net_to_json(&d->net);

        if (!net || json_object_set_new(o, "net", net) < 0) {
            json_decref(o);
            return NULL;
        }
    }
    if (o && d->pid == 0) {
        /* not started (yet): no pid at all rather than a misleading 0 */
        json_object_del(o, "pid");
        json_object_del(o, "start_time");
    }
    return o;
}

int local_desc_save(const struct local_desc *d, const char *dir, struct lb_error *err)
{
    char path[4352], tmp[4352];
    json_t *j = local_desc_to_json(d, dir);
    char *text = NULL;
    size_t len, off = 0;
    int fd = -1, r = 0;

    if (!j)
        return lb_error_set(err, -ENOMEM, "out of memory");
    text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!text)
        return lb_error_set(err, -ENOMEM, "out of memory");
    len = strlen(text);
    snprintf(path, sizeof(path), "%s/" LOCAL_DESCRIPTOR_FILE, dir);
    snprintf(tmp, sizeof(tmp), "%s/." LOCAL_DESCRIPTOR_FILE ".tmp", dir);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot write '%s': %s", tmp, strerror(errno));
        goto out;
    }
    while (off < len) {
        ssize_t n = write(fd, text + off, len - off);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = lb_error_set(err, -EREMOTEIO, "cannot write '%s': %s", tmp, strerror(errno));
            goto out;
        }
        off += (size_t)n;
    }
    /* No fsync: the file must survive a crash of lendboxd (the page cache does that); a power
     * loss takes the sandboxes with it. */
    if (rename(tmp, path) < 0)
        r = lb_error_set(err, -EREMOTEIO, "cannot save '%s': %s", path, strerror(errno));
out:
    if (fd >= 0)
        close(fd);
    if (r < 0)
        (void)unlink(tmp);
    free(text);
    return r;
}

/* Parse <dir>/descriptor.json. -ENOENT when it does not exist. */
static int desc_read_file(const char *dir, const char *id, struct local_desc *d, json_t **raw)
{
    char path[4352], buf[DESCRIPTOR_MAX];
    size_t len = 0;
    json_t *j;
    int fd, r;

    snprintf(path, sizeof(path), "%s/" LOCAL_DESCRIPTOR_FILE, dir);
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? -ENOENT : -EINVAL;
    for (;;) {
        ssize_t n = read(fd, buf + len, sizeof(buf) - len);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len == sizeof(buf))
            break;
    }
    close(fd);
    j = len < sizeof(buf) ? json_loadb(buf, len, JSON_REJECT_DUPLICATES, NULL) : NULL;
    if (!j)
        return -EINVAL;
    r = local_desc_from_json(j, id, d);
    if (r == 0 && raw)
        *raw = j;
    else
        json_decref(j);
    return r;
}

int local_desc_load(struct local_provider *lp, const struct lb_sandbox_ref *ref,
                    struct local_desc *d, struct lb_error *err)
{
    char dir[4352];
    struct stat st;
    int r;

    memset(d, 0, sizeof(*d));
    if (!ref || !local_id_is_valid(ref->id))
        return lb_error_set(err, -EINVAL, "invalid sandbox id");
    if (ref->descriptor) {
        r = local_desc_from_json(ref->descriptor, ref->id, d);
        if (r < 0)
            return lb_error_set(err, r == -ENOMEM ? r : -EINVAL,
                                "sandbox '%s' has a malformed descriptor", ref->id);
        /* a stale descriptor of a removed sandbox must not claim a uid reused since */
        local_sandbox_dir(lp, ref->id, dir, sizeof(dir));
        if (lstat(dir, &st) == 0) {
            local_uid_mark(lp, d->uid);
            local_net_mark_slot(lp, &d->net);
        }
        return 0;
    }
    local_sandbox_dir(lp, ref->id, dir, sizeof(dir));
    if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
        return lb_error_set(err, -ENOENT, "no such sandbox '%s'", ref->id);
    r = desc_read_file(dir, ref->id, d, NULL);
    if (r < 0) {
        /* The directory exists but create never got as far as a descriptor: nothing ran. */
        memset(d, 0, sizeof(*d));
        snprintf(d->workdir, sizeof(d->workdir), "%s", LOCAL_DEFAULT_WORKDIR);
        return 0;
    }
    local_uid_mark(lp, d->uid);
    local_net_mark_slot(lp, &d->net);
    return 0;
}

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

int local_destroy_sandbox(struct local_provider *lp, const char *id, struct local_desc *d,
                          int64_t deadline_ms, struct lb_error *err)
{
    struct lb_cgroup guess = {0};
    char dir[4352];
    int pidfd = -1, r = 0, left;
    pid_t monitor = -1;
    bool has_dir;

    local_sandbox_dir(lp, id, dir, sizeof(dir));
    has_dir = access(dir, F_OK) == 0;
    /* 0. endpoint relays (their sockets would keep the netns alive) */
    local_relay_close(lp, id);

    /* 0. thaw first: a frozen v1 task does not die, not even of SIGKILL, and a paused
     * sandbox's processes must be able to */
    sandbox_thaw(d, deadline_ms);
    /* 1. the init: SIGKILL to a pid namespace's init kills every process in it, and the
     * init's exit (what its pidfd reports) waits until they are all gone */
    if (d->pid > 0 && local_desc_alive(d)) {
        monitor = proc_ppid(d->pid); /* bwrap's monitor, outside the namespace */
        pidfd = (int)syscall(SYS_pidfd_open, d->pid, 0);
        if (pidfd >= 0 && !local_desc_alive(d)) {
            close(pidfd);
            pidfd = -1;
            monitor = -1;
        }
        if (pidfd >= 0 && syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0) < 0 &&
            errno != ESRCH) {
            r = lb_error_set(err, -EREMOTEIO, "cannot kill sandbox '%s' (pid %d): %s", id,
                             (int)d->pid, strerror(errno));
            goto out;
        }
    }
    /* a pause that raced the kill: thaw again (the kill is pending, they die at once) */
    sandbox_thaw(d, deadline_ms);
    /* The init's exit waits until every process of its namespace is reaped. One whose parent
     * died outside the namespace (an exec helper killed by the sandbox's OOM killer) was
     * adopted by lendboxd, the subreaper: reap such zombies while waiting, or the init would
     * wait for them forever. */
    while (pidfd >= 0) {
        int64_t step = clock_mono_ms() + 100;

        if (wait_pidfd(pidfd, step < deadline_ms ? step : deadline_ms))
            break;
        if (clock_mono_ms() >= deadline_ms) {
            r = lb_error_set(err, -ETIMEDOUT, "sandbox '%s' (pid %d) did not die in time", id,
                             (int)d->pid);
            goto out;
        }
        if (local_uid_in_range(lp, d->uid))
            reap_uid_children(d->uid);
    }
    /* If the monitor died before the init, the init is our child now: reap it too. */
    if (pidfd >= 0 && proc_ppid(d->pid) == getpid())
        (void)waitpid(d->pid, NULL, WNOHANG);
    /* The monitor exits right after the init; when it is our child (lendboxd is a subreaper)
     * reap it rather than leave a zombie. A slow one is no failure. */
    if (monitor > 1 && proc_ppid(monitor) == getpid())
        reap_child(monitor,
                   clock_mono_ms() + 1000 < deadline_ms ? clock_mono_ms() + 1000 : deadline_ms);
    /* 2. A clean init death (seen through its pidfd) took every process of its pid namespace
     * with it; what could still run as the sandbox's ids outside it (bwrap's monitor, exec
     * helpers, which join the sandbox's cgroup) shows in the cgroup. When that is empty there
     * is nothing to search for: the /proc scan below costs O(processes on the host) per stop,
     * which made the shutdown sweep of many sandboxes quadratic. Otherwise (no live init to
     * kill: a sandbox half made when a daemon crashed, or one whose init died; no cgroup; or
     * something left in it) sweep everything running as one of the sandbox's ids. */
    if (pidfd >= 0 && cgroup_is_empty(&d->cg)) {
        /* nothing left */
    } else if (has_dir && local_uid_in_range(lp, d->uid)) {
        while ((left = kill_uid(d->uid)) > 0) {
            if (clock_mono_ms() >= deadline_ms) {
                r = lb_error_set(err, -ETIMEDOUT,
                                 "%d process(es) of sandbox '%s' (uid %" PRIu32
                                 ") did not die in time",
                                 left, id, d->uid);
                goto out;
            }
            sleep_ms(SWEEP_STEP_MS);
        }
        reap_uid_children(d->uid);
    } else if (has_dir && d->uid) {
        log_warn("sbx=%s uid %" PRIu32 " is outside the configured range, not swept", id, d->uid);
    }
    /* 3. cgroups: the descriptor's and wherever this host would have put them */
    r = cgroup_remove(&d->cg, deadline_ms, err);
    if (r < 0)
        goto out;
    r = cgroup_guess(&lp->cg, id, &guess);
    if (r == 0)
        r = cgroup_remove(&guess, deadline_ms, err);
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
    r = rmtree(dir);
    if (r < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot remove '%s': %s", dir, strerror(-r));
        goto out;
    }
    local_uid_free(lp, d->uid);
    local_net_free_slot(lp, &d->net);
out:
    cgroup_release(&guess);
    if (pidfd >= 0)
        close(pidfd);
    return r;
}

/* ---- ops ------------------------------------------------------------------------------- */

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
static int stopping_enter(struct local_provider *lp, const char *id, int64_t deadline_ms)
{
    struct timespec until = {.tv_sec = deadline_ms / 1000,
                             .tv_nsec = (long)(deadline_ms % 1000) * 1000000L};
    char *copy = strdup(id);
    int r = 0;

    if (!copy)
        return -ENOMEM;
    pthread_mutex_lock(&lp->lock);
    while (stopping_find(lp, id) >= 0) {
        if (pthread_cond_timedwait(&lp->stopped, &lp->lock, &until) == ETIMEDOUT &&
            stopping_find(lp, id) >= 0) {
            pthread_mutex_unlock(&lp->lock);
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
    pthread_mutex_unlock(&lp->lock);
    if (r < 0)
        free(copy);
    return r;
}

static void stopping_leave(struct local_provider *lp, const char *id)
{
    ssize_t i;

    pthread_mutex_lock(&lp->lock);
    i = stopping_find(lp, id);
    if (i >= 0) {
        free(lp->stopping[i]);
        lp->stopping[i] = lp->stopping[--lp->nstopping];
    }
    pthread_cond_broadcast(&lp->stopped);
    pthread_mutex_unlock(&lp->lock);
}

static int local_stop(struct lb_provider *p, const struct lb_sandbox_ref *ref, int64_t timeout_ms,
                      struct lb_error *err)
{
    struct local_provider *lp = (struct local_provider *)p;
    int64_t deadline = clock_mono_ms() + (timeout_ms > 0 ? timeout_ms : 1);
    struct local_desc d;
    int r;

    if (!ref || !local_id_is_valid(ref->id))
        return lb_error_set(err, -EINVAL, "invalid sandbox id");
    r = stopping_enter(lp, ref->id, deadline);
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
    stopping_leave(lp, ref->id);
    return r;
}

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
    int r = local_desc_load(lp, ref, &d, err);

    if (r < 0)
        return r;
    if (!local_desc_alive(&d))
        r = lb_error_set(err, -ENOENT, "sandbox '%s' is not running", ref->id);
    else if ((r = cgroup_read_oom_kills(&d.cg, count, limit_bytes)) < 0)
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
        if (desc_read_file(path, de->d_name, &d, &raw) == 0) {
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

    r = local_desc_load(lp, ref, &d, err);
    if (r < 0)
        return r;
    if (!local_desc_alive(&d))
        r = lb_error_set(err, -ENOENT, "sandbox '%s' is not running", ref->id);
    else if (d.cg.version == 0)
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
    r = stopping_enter(lp, ref->id, clock_mono_ms() + 5000);
    if (r == -ETIMEDOUT)
        return lb_error_set(err, -EREMOTEIO, "a stop of sandbox '%s' is under way", ref->id);
    if (r < 0)
        return lb_error_set(err, r, "out of memory");
    r = local_desc_load(lp, ref, &d, err);
    if (r == 0) {
        if (!local_desc_alive(&d))
            r = lb_error_set(err, -ENOENT, "sandbox '%s' is not running", ref->id);
        else if (d.net.mode == LOCAL_NET_NONE)
            r = local_relay_endpoint(lp, ref->id, &d, port, url_out, err);
        else
            r = local_net_endpoint(&d.net, port, url_out, err);
        local_desc_release(&d);
    }
    stopping_leave(lp, ref->id);
    return r;
}

static void local_destroy(struct lb_provider *p)
{
    struct local_provider *lp = (struct local_provider *)p;

    if (!lp)
        return;
    local_relay_destroy(lp);
    local_net_destroy(lp);
    cgroup_host_release(&lp->cg);
    free(lp->stopping); /* empty: no stop runs once the provider is destroyed */
    local_exec_gates_release(lp);
    pthread_cond_destroy(&lp->stopped);
    pthread_mutex_destroy(&lp->lock);
    free(lp->uid_used);
    free(lp->claim_id);
    free(lp->sandboxes_dir);
    free(lp->state_dir);
    free(lp->bwrap_path);
    free(lp->supervise_path);
    free(lp->images_dir);
    free(lp->data_dir);
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
    .endpoint = local_endpoint,
    .oom_kills = local_oom_kills,
    .end_execs = local_end_execs,
    .destroy = local_destroy,
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
    pthread_mutex_init(&lp->lock, NULL);
    {
        pthread_condattr_t ca;

        /* stopping_enter's deadlines are monotonic */
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&lp->stopped, &ca);
        pthread_condattr_destroy(&ca);
    }
    lp->uid_used = calloc((cfg->uid_count + 7) / 8, 1);
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
        r = claims_start(lp, err);
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
    claims_sweep(lp, all);
    json_decref(all);
    *out = &lp->base;
    return 0;

fail:
    local_destroy(&lp->base);
    return r;
}

int local_pipe(int *r, int *w)
{
    int p[2];

    if (pipe2(p, O_CLOEXEC) < 0)
        return -errno;
    *r = p[0];
    *w = p[1];
    return 0;
}

void local_close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* ---- helpers for forked children (async-signal-safe only) ------------------------------ */

int local_child_place_fds(const int *fds, int n)
{
    int tmp[32], i;

    if (n > 32)
        return -EINVAL;
    /* first out of the way (above n), so moving one never clobbers another */
    for (i = 0; i < n; i++) {
        tmp[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, n);
        if (tmp[i] < 0)
            return -errno;
    }
    for (i = 0; i < n; i++) {
        if (dup2(tmp[i], i) < 0)
            return -errno;
    }
    return 0;
}

void local_child_reset_signals(void)
{
    struct sigaction sa;
    sigset_t none;
    int s;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_DFL;
    for (s = 1; s < NSIG; s++) {
        if (s != SIGKILL && s != SIGSTOP)
            (void)sigaction(s, &sa, NULL);
    }
    sigemptyset(&none);
    (void)sigprocmask(SIG_SETMASK, &none, NULL);
}

/* Set once by local_keyrings_probe (before any sandbox), read-only afterwards. */
static bool keyrings_probed, keyrings_refused;

/* Is this process under a seccomp filter ("Seccomp: 2" in /proc/self/status)? */
static bool under_seccomp_filter(void)
{
    char buf[4096];
    const char *p;

    if (local_read_small("/proc/self/status", buf, sizeof(buf)) < 0)
        return false;
    p = strstr(buf, "\nSeccomp:");
    return p && atoi(p + 9) == 2;
}

bool local_keyrings_refused(void)
{
    return keyrings_refused;
}

void local_keyrings_probe(void)
{
    int st = 0;
    pid_t pid;

    if (keyrings_probed)
        return;
    keyrings_probed = true;
    /* in a child, so the daemon keeps the session keyring it was given */
    pid = fork();
    if (pid == 0) {
        if (syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, NULL, 0, 0, 0) < 0)
            _exit(errno > 0 && errno < 255 ? errno : 255);
        _exit(0);
    }
    if (pid < 0) {
        log_warn("cannot probe the kernel keyring: fork: %s", strerror(errno));
        return;
    }
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    /* Only a seccomp filter's EPERM counts: a filter is inherited by every process the daemon
     * starts and cannot be lifted, so no sandbox can use a keyring either. (An LSM's refusal,
     * EACCES, is not known to hold for the sandboxes' own domains.) */
    if (WIFEXITED(st) && WEXITSTATUS(st) == EPERM && under_seccomp_filter()) {
        keyrings_refused = true;
        log_warn("this host refuses the kernel keyring calls to lendboxd (keyctl: %s, under a "
                 "seccomp filter: a container's or systemd's): every sandbox inherits the "
                 "refusal, so sandboxes and execs start without a session keyring of their own",
                 strerror(EPERM));
    }
}

int local_child_new_session_keyring(void)
{
    if (syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, NULL, 0, 0, 0) < 0 && errno != ENOSYS &&
        !(keyrings_refused && errno == EPERM))
        return -1;
    return 0;
}

void local_child_report(int fd, const char *msg, int err_no)
{
    char buf[256], num[16];
    size_t n = 0, k = 0;
    const char *e = ": errno ";

    while (*msg && n < sizeof(buf) - 32)
        buf[n++] = *msg++;
    while (*e)
        buf[n++] = *e++;
    if (err_no <= 0)
        err_no = 0;
    do {
        num[k++] = (char)('0' + err_no % 10);
        err_no /= 10;
    } while (err_no && k < sizeof(num));
    while (k)
        buf[n++] = num[--k];
    buf[n++] = '\n';
    (void)!write(fd, buf, n);
}

/* ---- messages --------------------------------------------------------------------------- */

/* The kernel's per-string bound on execve's arguments and environment (MAX_ARG_STRLEN). */
static long arg_strlen_max(void)
{
    long page = sysconf(_SC_PAGESIZE);

    return 32 * (page > 0 ? page : 4096);
}

void local_describe_e2big(char *buf, size_t size)
{
    long all = sysconf(_SC_ARG_MAX);

    snprintf(buf, size,
             "argument list too long (limit %ld bytes for the arguments and environment "
             "together, %ld bytes for one argument or variable)",
             all > 0 ? all : 131072L, arg_strlen_max());
}

void local_errno_text(const char *in, char *out, size_t size)
{
    static const char marker[] = ": errno ";
    size_t o = 0;

    if (size == 0)
        return;
    while (*in && o + 1 < size) {
        if (strncmp(in, marker, sizeof(marker) - 1) == 0 && in[sizeof(marker) - 1] >= '0' &&
            in[sizeof(marker) - 1] <= '9') {
            char *end, text[320];
            long e = strtol(in + sizeof(marker) - 1, &end, 10);

            if (e == E2BIG)
                local_describe_e2big(text, sizeof(text));
            else
                snprintf(text, sizeof(text), "%s", e > 0 ? strerror((int)e) : "unknown error");
            o += (size_t)snprintf(out + o, size - o, ": %s", text);
            if (o >= size)
                o = size - 1;
            in = end;
            continue;
        }
        out[o++] = *in++;
    }
    out[o] = '\0';
}

int local_check_exec_args(const char *const *argv, const char *const *envp, char *why,
                          size_t why_len)
{
    const char *const *lists[2] = {argv, envp};
    long all = sysconf(_SC_ARG_MAX), one = arg_strlen_max();
    size_t total = 0, longest = 0;

    for (int l = 0; l < 2; l++) {
        for (size_t i = 0; lists[l] && lists[l][i]; i++) {
            size_t n = strlen(lists[l][i]) + 1;

            total += n + sizeof(char *);
            if (n > longest)
                longest = n;
        }
    }
    if ((long)longest > one) {
        snprintf(why, why_len,
                 "argument list too long: one argument or environment variable is %zu bytes "
                 "(limit %ld bytes each)",
                 longest - 1, one);
        return -E2BIG;
    }
    if (all > 0 && (long)total > all) {
        snprintf(why, why_len,
                 "argument list too long: the arguments and environment take %zu bytes (limit "
                 "%ld bytes together)",
                 total, all);
        return -E2BIG;
    }
    return 0;
}
