/*
 * mode_reset.c - reset mode of lendbox-supervise: a running sandbox of image host returned in
 * place to how bwrap made it, keeping its namespaces, cgroup, network and uid slot. Run by the
 * daemon as host root outside the sandbox (see supervise.c's head comment, "Reset mode").
 *
 * What a sandbox of image host holds that an episode can change, and how each goes back:
 * - processes: every process of its pid namespace but the init is killed with one kill(-1)
 *   from inside the namespace (the kernel walks the task list under the lock a fork takes, so
 *   nothing forked meanwhile is missed; a process that left its session or double-forked is
 *   still in the namespace), repeated until /proc of the namespace shows nothing but the init
 *   and us (the init reaps them);
 * - writable mounts: /tmp, /run, /dev/shm and the workdir are tmpfs mounts made by bwrap;
 *   each is detached and a fresh tmpfs of the same size, mode and flags mounted in its place
 *   (the old one is freed by the kernel once nothing holds it: its processes are dead). The
 *   supervisor bound at /run/lendbox/supervise is bound again, read-only, from a clone of the
 *   daemon's binary taken on the host. The root (the host's, read-only) and /dev (read-only)
 *   cannot have changed, but for the devpts instance at /dev/pts, whose root and ptmx the
 *   sandbox's root owns: their modes are set back; sandbox processes cannot mount
 *   (seccomp, no capabilities);
 * - IPC: every SysV shared memory segment, semaphore set and message queue of its IPC
 *   namespace is removed, and every POSIX message queue (on a detached mount of the namespace's
 *   mqueue file system, mounted nowhere); POSIX shared memory and semaphores live in /dev/shm;
 * - the hostname is set back.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

#include "supervisor/supervise_internal.h"

#define RESET_STATUS_FD 3
#define RESET_NS_FD 4 /* user (not entered), mnt, pid, uts, ipc */
#define RESET_SUPERVISE_FD 9
#define RESET_SPARE_SOCK_FD 3       /* --reset-spare: the request socket, until the request came */
#define RESET_SPARE_FDS 7           /* a request's fds: what --reset has as 3..9 */
#define RESET_SPARE_ARGS 8          /* a request's strings: --reset's seven arguments and the CPU */
#define RESET_SPARE_SOCK_HIGH_FD 20 /* the request socket while a reset runs */
#define RESET_SPARE_HIGH_FD 21      /* 21..24: the spare's own namespaces */
#define RESET_SPARE_BACK "b"        /* the spare to the daemon: back, waiting for the next */
#define RESET_KILL_MS 5000          /* bound on the wait for the killed processes to be reaped */
#define RESET_SUPERVISE_PATH "/run/lendbox/supervise"

static void reset_fail(const char *what)
{
    proc_write_status(RESET_STATUS_FD, "error %s: errno %d", what, errno);
    _exit(1);
}

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* When each step of the reset ended (µs, monotonic), for its status line. */
enum { STEP_START, STEP_NS, STEP_CHILD, STEP_KILL, STEP_MOUNTS, STEP_IPC, STEP_COUNT };
static int64_t steps[STEP_COUNT];
static int kill_rounds; /* kill(-1) and a look at /proc, until none was left */

/* /proc/<pid>/stat into buf (NUL-terminated), a pointer to its ") " after the command name
 * ("<pid> (<comm>) <state> <ppid> ..."), or NULL when the process is gone. */
static char *read_stat(long pid, char *buf, size_t size)
{
    char path[64];
    ssize_t n = -1;
    char *p;
    int fd;

    snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        n = read(fd, buf, size - 1);
        close(fd);
    }
    if (n <= 0)
        return NULL;
    buf[n] = '\0';
    p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] ? p : NULL;
}

/* Is pid (of the sandbox's pid namespace) a zombie whose parent is outside it (its parent pid
 * 0 as seen here)? Such a process is dead: only its parent can reap it, and that parent is
 * lendboxd or its exec helper (lendboxd, a child subreaper, inherits an exec's supervisor when
 * it kills a helper that did not exit in time), which reaps it after the reset. A process gone
 * meanwhile counts too. */
static bool dead_outside(long pid)
{
    char stat[512];
    const char *p = read_stat(pid, stat, sizeof(stat));

    return !p || (p[2] == 'Z' && p[3] == ' ' && p[4] == '0' && p[5] == ' ');
}

/* How many processes /proc (the sandbox's, of its pid namespace) lists besides the init, us
 * and zombies whose parent is outside (counted in *outside); -1 when it cannot be read.
 * *one: one of them (0: none). */
static int others_alive(long *one, int *outside)
{
    pid_t self = getpid();
    struct dirent *de;
    DIR *d = opendir("/proc");
    int n = 0;

    *one = 0;
    *outside = 0;
    if (!d)
        return -1;
    while ((de = readdir(d))) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);

        if (*end || pid <= 1 || pid == self)
            continue;
        if (dead_outside(pid)) {
            (*outside)++;
            continue;
        }
        *one = pid;
        n++;
    }
    closedir(d);
    return n;
}

/* A process's /proc/<pid>/stat up to its state letter ("<pid> (<comm>) <state>") into buf. */
static void process_state(long pid, char *buf, size_t size)
{
    char stat[512];
    char *p = read_stat(pid, stat, sizeof(stat));

    if (!p) {
        snprintf(buf, size, "%ld (gone)", pid);
        return;
    }
    p[3] = '\0';
    snprintf(buf, size, "%s", stat);
}

/* Every process of the pid namespace but the init and us, killed and reaped. The init reaps
 * them; the first look comes 50 µs after the kill and the pause doubles up to 1 ms, since a
 * sandbox that ran little is empty within a few hundred microseconds and a fixed 1 ms pause
 * was most of a reset's time. Returns how many zombies are left for parents outside the
 * namespace to reap (dead_outside). */
static int reset_processes(void)
{
    int64_t until = now_ms() + RESET_KILL_MS;
    useconds_t pause_us = 50;
    int n, outside;
    long one;

    for (;;) {
        kill_rounds++;
        if (kill(-1, SIGKILL) < 0 && errno != ESRCH)
            reset_fail("cannot kill the sandbox's processes");
        n = others_alive(&one, &outside);
        if (n < 0)
            reset_fail("cannot read the sandbox's /proc");
        if (n == 0)
            return outside;
        if (now_ms() > until) {
            char state[512];

            process_state(one, state, sizeof(state));
            proc_write_status(RESET_STATUS_FD,
                              "error the sandbox's processes did not die in time (%d left, one "
                              "of them: %s): errno %d",
                              n, state, ETIMEDOUT);
            _exit(1);
        }
        usleep(pause_us);
        if (pause_us < 1000)
            pause_us = pause_us * 2 > 1000 ? 1000 : pause_us * 2;
    }
}

/* Replace the tmpfs at path by a fresh one of mib MiB and mode (octal text), owned by the
 * sandbox's root (host id uid). */
static void reset_tmpfs(const char *path, const char *mode, int64_t mib, long uid)
{
    char opts[128];

    snprintf(opts, sizeof(opts), "mode=%s,size=%lld,uid=%ld,gid=%ld", mode,
             (long long)mib * 1024 * 1024, uid, uid);
    if (umount2(path, MNT_DETACH | UMOUNT_NOFOLLOW) < 0)
        reset_fail("cannot detach a writable mount");
    if (mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0)
        reset_fail("cannot mount a fresh tmpfs");
}

/* The ids of /proc/sysvipc/<what> (second column), removed with rm. */
static void reset_sysv(const char *what, int (*rm)(int id))
{
    char path[64], line[512];
    bool any = true;

    snprintf(path, sizeof(path), "/proc/sysvipc/%s", what);
    for (int round = 0; any && round < 100; round++) {
        FILE *f = fopen(path, "re");

        if (!f)
            reset_fail("cannot read /proc/sysvipc");
        any = false;
        if (!fgets(line, sizeof(line), f)) { /* the header */
            fclose(f);
            break;
        }
        while (fgets(line, sizeof(line), f)) {
            long key, id;

            if (sscanf(line, "%ld %ld", &key, &id) != 2)
                continue;
            any = true;
            if (rm((int)id) < 0 && errno != EINVAL && errno != EIDRM) {
                fclose(f);
                reset_fail("cannot remove a SysV IPC object");
            }
        }
        fclose(f);
    }
}

static int rm_shm(int id)
{
    return shmctl(id, IPC_RMID, NULL);
}

static int rm_sem(int id)
{
    return semctl(id, 0, IPC_RMID);
}

static int rm_msg(int id)
{
    return msgctl(id, IPC_RMID, NULL);
}

/* Every POSIX message queue of the IPC namespace: on a detached mount of its mqueue file
 * system (fsopen, fsmount: in no mount namespace, so neither the sandbox's nor a copy of it,
 * whose teardown would cost more than the rest of the reset), gone when its fd is closed. */
static void reset_mqueues(void)
{
    struct dirent *de;
    int fs, mnt = -1, dfd = -1;
    DIR *d;

    fs = (int)syscall(SYS_fsopen, "mqueue", FSOPEN_CLOEXEC);
    if (fs < 0 || syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0 ||
        (mnt = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC,
                            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)) < 0 ||
        (dfd = openat(mnt, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        reset_fail("cannot mount the sandbox's mqueue file system");
    d = fdopendir(dfd);
    if (!d)
        reset_fail("cannot read the sandbox's mqueue file system");
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (unlinkat(dirfd(d), de->d_name, 0) < 0 && errno != ENOENT)
            reset_fail("cannot remove a POSIX message queue");
    }
    closedir(d);
    close(mnt);
    close(fs);
}

/* Inside the namespaces but the user namespace: the host's root, with every capability over
 * the sandbox's namespaces (reset_enter). What it makes belongs to the sandbox's root (host id
 * uid). */
static int reset_inside(int sup_fd, const char *host, const char *workdir, int64_t tmp_mib,
                        int64_t run_mib, int64_t shm_mib, int64_t workdir_mib, long uid)
{
    struct stat st;
    int fd, zombies;

    steps[STEP_CHILD] = now_us();
    /* the hostname first: an exec that enters after the kill loop below finds it changed when
     * the sandbox is recycled under another id, and refuses to run (mode_enter.c --host) */
    if (sethostname(host, strlen(host)) < 0)
        reset_fail("cannot set the hostname back");
    zombies = reset_processes();
    steps[STEP_KILL] = now_us();
    /* /dev/pts is the devpts instance bwrap mounted (read-write: ptys are made there): its root
     * and ptmx belong to the sandbox's root, which may have changed their mode (0 leaves the
     * next episode no pty; their owner it cannot change, without CAP_CHOWN). Back to bwrap's;
     * its ptys went with their processes. */
    if (chmod("/dev/pts", 0755) < 0 || chmod("/dev/pts/ptmx", 0666) < 0)
        reset_fail("cannot set /dev/pts back");
    reset_tmpfs("/tmp", "1777", tmp_mib, uid);
    reset_tmpfs("/dev/shm", "1777", shm_mib, uid);
    reset_tmpfs(workdir, "755", workdir_mib, uid);
    reset_tmpfs("/run", "755", run_mib, uid);
    if (mkdir("/run/lendbox", 0755) < 0 || chown("/run/lendbox", (uid_t)uid, (gid_t)uid) < 0 ||
        (fd = open(RESET_SUPERVISE_PATH, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444)) < 0 ||
        fchown(fd, (uid_t)uid, (gid_t)uid) < 0 || close(fd) < 0 ||
        syscall(SYS_move_mount, sup_fd, "", AT_FDCWD, RESET_SUPERVISE_PATH,
                0x4 /* MOVE_MOUNT_F_EMPTY_PATH */) < 0 ||
        stat(RESET_SUPERVISE_PATH, &st) < 0 || !S_ISREG(st.st_mode))
        reset_fail("cannot bind the supervisor again");
    steps[STEP_MOUNTS] = now_us();
    reset_sysv("shm", rm_shm);
    reset_sysv("sem", rm_sem);
    reset_sysv("msg", rm_msg);
    reset_mqueues();
    steps[STEP_IPC] = now_us();
    return zombies;
}

/* The child inside the pid namespace (clone, CLONE_VM: on a stack of its own) */
struct reset_child {
    int sup_fd;
    char **argv;
    int64_t tmp_mib, run_mib, shm_mib, wd_mib;
    long uid;
};

static char reset_stack[256 * 1024] __attribute__((aligned(16)));

static int reset_child_run(void *arg)
{
    const struct reset_child *c = arg;
    int zombies;

    /* the helper killed (the daemon's deadline): this child, a process of its own inside the
     * sandbox with the host root's capabilities, goes with it */
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    zombies = reset_inside(c->sup_fd, c->argv[2], c->argv[3], c->tmp_mib, c->run_mib, c->shm_mib,
                           c->wd_mib, c->uid);

    /* "reset", how many zombies lendboxd (or an exec's helper) has to reap, and the steps'
     * times in µs (lendboxd logs them at debug) */
    proc_write_status(RESET_STATUS_FD,
                      "reset %d (µs: enter %lld, clone %lld, kill %lld in %d rounds, mounts %lld, "
                      "ipc %lld)",
                      zombies, (long long)(steps[STEP_NS] - steps[STEP_START]),
                      (long long)(steps[STEP_CHILD] - steps[STEP_NS]),
                      (long long)(steps[STEP_KILL] - steps[STEP_CHILD]), kill_rounds,
                      (long long)(steps[STEP_MOUNTS] - steps[STEP_KILL]),
                      (long long)(steps[STEP_IPC] - steps[STEP_MOUNTS]));
    _exit(0);
}

/* One reset, with fds 3..9 in place (see supervise.c): enter the sandbox's mount, pid, UTS and
 * IPC namespaces (not its user namespace: the host's root keeps every capability over them,
 * and a process that never entered a user namespace may enter another sandbox's namespaces
 * later, so a spare serves one reset after another), do the work in a child inside the pid
 * namespace, and come back to own (our own mount, pid, UTS and IPC namespaces; -1: none, the
 * process ends after this one). The child's exit status: 0 done, 1 failed, 2 bad arguments
 * (fd 3 says why). */
static int reset_enter(int argc, char **argv, const int *own)
{
    static const int ns_types[4] = {CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUTS, CLONE_NEWIPC};
    const unsigned tree_clone = 1 /* OPEN_TREE_CLONE */ | O_CLOEXEC;
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
    int64_t tmp_mib, run_mib, shm_mib, wd_mib, uid;
    int sup_fd, ws = 0;
    pid_t c;

    kill_rounds = 0;
    steps[STEP_START] = now_us();
    /* --reset HOSTNAME WORKDIR TMP_MIB RUN_MIB SHM_MIB WORKDIR_MIB UID */
    if (argc != 9 || !argv[2][0] || strlen(argv[2]) > 64 || argv[3][0] != '/' ||
        strcmp(argv[3], "/") == 0 ||
        proc_parse_int64(argv[4], 1, INT64_MAX / (1 << 20), &tmp_mib) < 0 ||
        proc_parse_int64(argv[5], 1, INT64_MAX / (1 << 20), &run_mib) < 0 ||
        proc_parse_int64(argv[6], 1, INT64_MAX / (1 << 20), &shm_mib) < 0 ||
        proc_parse_int64(argv[7], 1, INT64_MAX / (1 << 20), &wd_mib) < 0 ||
        proc_parse_int64(argv[8], 1, INT32_MAX, &uid) < 0) {
        proc_write_status(RESET_STATUS_FD, "error bad lendbox-supervise --reset arguments");
        return 2;
    }
    /* on the host: a read-only clone of the supervisor, for the fresh /run */
    sup_fd = (int)syscall(SYS_open_tree, RESET_SUPERVISE_FD, "", tree_clone | AT_EMPTY_PATH);
    if (sup_fd <= RESET_SUPERVISE_FD || /* below: fds 0..9 are all the daemon's */
        syscall(SYS_mount_setattr, sup_fd, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0)
        reset_fail("cannot clone the supervisor");
    for (int i = 0; i < 4; i++) {
        if (syscall(SYS_setns, RESET_NS_FD + 1 + i, ns_types[i]) < 0)
            reset_fail("cannot enter the sandbox namespaces");
    }
    steps[STEP_NS] = now_us();
    /* into the pid namespace: a child. Sharing our memory (and run while we wait): a fork's
     * copy of the page tables costs ~0.5 ms on a VM, most of a reset; it uses its own stack,
     * and we only wait for it. Its real and saved ids are the host's root: no process of the
     * sandbox may stop, kill or prlimit it in the moment before it kills them. */
    {
        struct reset_child rc = {sup_fd, argv, tmp_mib, run_mib, shm_mib, wd_mib, (long)uid};

        c = clone(reset_child_run, reset_stack + sizeof(reset_stack),
                  CLONE_VM | CLONE_VFORK | SIGCHLD, &rc);
    }
    if (c < 0)
        reset_fail("fork inside the sandbox failed");
    while (waitpid(c, &ws, 0) < 0 && errno == EINTR)
        ;
    close(sup_fd);
    /* out again: holding none of the sandbox's namespaces (its memory would stay pinned) */
    for (int i = 0; own && i < 4; i++) {
        if (syscall(SYS_setns, own[i], ns_types[i]) < 0)
            _exit(1); /* the daemon ends a spare that did not say "reset" */
    }
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

int mode_reset_run(int argc, char **argv)
{
    if (syscall(SYS_setgroups, 0, NULL) < 0)
        reset_fail("cannot drop supplementary groups");
    return reset_enter(argc, argv, NULL);
}

/* --reset-spare: wait for a request, put its fds where --reset has them, run it, and wait for
 * the next, until the socket ends. */
int mode_reset_spare_run(int argc, char **argv)
{
    static const char *const own_ns[4] = {"mnt", "pid", "uts", "ipc"};
    static char payload[8192];
    int own[4];

    if (argc != 2)
        return 2;
    if (syscall(SYS_setgroups, 0, NULL) < 0)
        return 1;
    /* our own namespaces, to come back to after each reset (above the request's fds) */
    for (int i = 0; i < 4; i++) {
        char path[32];
        int fd;

        snprintf(path, sizeof(path), "/proc/self/ns/%s", own_ns[i]);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        own[i] = fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, RESET_SPARE_HIGH_FD + i);
        if (fd >= 0)
            close(fd);
        if (own[i] < 0)
            return 1;
    }
    for (;;) {
        union {
            struct cmsghdr h;
            char b[CMSG_SPACE(sizeof(int) * RESET_SPARE_FDS)];
        } ctl;
        struct iovec iov = {payload, sizeof(payload) - 1};
        struct msghdr m = {.msg_iov = &iov,
                           .msg_iovlen = 1,
                           .msg_control = ctl.b,
                           .msg_controllen = sizeof(ctl.b)};
        int got[RESET_SPARE_FDS], ngot = 0, high[RESET_SPARE_FDS];
        char *args[RESET_SPARE_ARGS], *p;
        ssize_t n;
        long cpu;

        do
            n = recvmsg(RESET_SPARE_SOCK_FD, &m, MSG_CMSG_CLOEXEC);
        while (n < 0 && errno == EINTR);
        if (n <= 0)
            return 0; /* the daemon closed the socket (or is gone): no reset to do */
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

            for (size_t i = 0; i < k; i++) {
                int fd;

                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                if (ngot < RESET_SPARE_FDS)
                    got[ngot] = fd;
                ngot++;
            }
        }
        if (ngot != RESET_SPARE_FDS || (m.msg_flags & (MSG_CTRUNC | MSG_TRUNC)))
            return 2; /* no status fd to say it on: the daemon reads EOF, "said nothing" */
        payload[n] = '\0';
        p = payload;
        for (int i = 0; i < RESET_SPARE_ARGS; i++) {
            if (p >= payload + n)
                return 2;
            args[i] = p;
            p += strlen(p) + 1;
        }
        /* fds 3..9 as --reset has them: the socket (3) out of the way first, then the
         * request's above 9, then in place */
        if (dup3(RESET_SPARE_SOCK_FD, RESET_SPARE_SOCK_HIGH_FD, O_CLOEXEC) < 0)
            return 2;
        for (int i = 0; i < RESET_SPARE_FDS; i++) {
            high[i] = fcntl(got[i], F_DUPFD_CLOEXEC, RESET_SUPERVISE_FD + 1);
            if (high[i] < 0)
                return 2;
            close(got[i]);
        }
        for (int i = 0; i < RESET_SPARE_FDS; i++) {
            if (dup2(high[i], RESET_STATUS_FD + i) < 0)
                return 2;
            close(high[i]);
        }
        /* on the CPU of the daemon's thread that waits for us (see reset.c) */
        cpu = strtol(args[RESET_SPARE_ARGS - 1], &p, 10);
        if (*p == '\0' && cpu >= 0 && cpu < CPU_SETSIZE) {
            cpu_set_t one;

            CPU_ZERO(&one);
            CPU_SET((int)cpu, &one);
            (void)sched_setaffinity(0, sizeof(one), &one);
        }
        {
            char *av[] = {argv[0], "--reset", args[0], args[1], args[2],
                          args[3], args[4],   args[5], args[6], NULL};

            (void)reset_enter(9, av, own); /* its outcome went out on the status fd */
        }
        /* the request's fds go; the socket comes back to 3 */
        for (int i = 0; i < RESET_SPARE_FDS; i++)
            close(RESET_STATUS_FD + i);
        if (dup2(RESET_SPARE_SOCK_HIGH_FD, RESET_SPARE_SOCK_FD) < 0)
            return 1;
        close(RESET_SPARE_SOCK_HIGH_FD);
        /* back in our own namespaces and listening: say so, whatever the reset's status. The
         * daemon read the reset's outcome on the status pipe, and waits for this before it
         * counts us as waiting (it ends a spare whose reset failed). A child killed after its
         * "reset" line (the sandbox's init killed by a release that came at once: every process of
         * its pid namespace dies) is not a failed reset, and must not end a spare the daemon
         * counts on. */
        do
            n = send(RESET_SPARE_SOCK_FD, RESET_SPARE_BACK, 1, MSG_NOSIGNAL);
        while (n < 0 && errno == EINTR);
        if (n != 1)
            return 0; /* the daemon is gone */
    }
}
