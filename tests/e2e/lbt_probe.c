/*
 * lbt_probe.c - a hostile program the e2e tests upload into sandboxes (test_forgery.c).
 *
 *   lbt-probe forge LOG [--hold]
 *       The forger (a leftover agent process against a grader's exec): runs until killed, watching
 * /proc for lendbox-supervise processes (comm "supervise", not pid 1). On each new one it tries,
 * and logs one line per attempt ("<pid> <attempt> ok|<errno name>"): pidfd_getfd of fds 0-3, open
 * of /proc/<pid>/fd/{1,3} for writing, opendir of /proc/<pid>/fd, open of /proc/<pid>/mem and
 * ptrace(PTRACE_SEIZE). Whatever it gets it uses: "exit 0" into every stolen fd (the status channel
 * is fd 3) and "FORGED" into the stolen stdout, and keeps every stolen fd open (to stall the exec).
 * With --hold it also opens the stdout and stderr of every other process it sees (the commands:
 * /proc/<pid>/fd, else pidfd_getfd) and holds them, writing nothing; with
 *       --write it also writes "FORGED" into them (what exclusive execs are for).
 *       Its pid goes to LOG.pid.
 *   lbt-probe zombie-leader FILE
 *       Starts a thread that appends a line to FILE every 100 ms, forever, then ends its main
 *       thread alone (exit(2), not exit_group): the process shows as a zombie while its
 *       thread runs, which a sweep that skips zombies never ends.
 *   lbt-probe passgrab DIR LOG
 *       The receipt thief of the docker provider's pass directory: runs until killed, looping
 *       over DIR (/run/lendbox/pass) as fast as it can. Each new entry is logged ("saw NAME");
 *       it opens every entry read-write and connects to every socket (waiting up to 2 s for an
 *       fd by SCM_RIGHTS). Whatever fd it gets it logs ("open NAME ok", "fd NAME ok") and
 *       forges a receipt into it (cleanup confirmed, return code 0) now and every 20 ms for
 *       5 s, holding it. A connection that got no fd is logged once ("conn NAME nofd").
 *       Its pid goes to LOG.pid.
 *   lbt-probe shm KEY
 *       Makes a SysV shared memory segment of 4 KiB under KEY (a number, 0x... for hex) and
 *       ends, leaving it (what python3's ctypes does in the images that have python3).
 *   lbt-probe syscalls [NAME...]
 *       Calls each named syscall (all it knows without names) with harmless arguments and
 *       prints "NAME ERRNONAME" ("NAME ok" on success). Arguments are chosen so that without
 *       a seccomp filter most calls give an error other than EPERM (or succeed).
 */
#include <dirent.h>
#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/keyctl.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <sys/shm.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/timex.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *errname(int e)
{
    switch (e) {
    case 0:
        return "ok";
    case EPERM:
        return "EPERM";
    case EACCES:
        return "EACCES";
    case ENOSYS:
        return "ENOSYS";
    case EINVAL:
        return "EINVAL";
    case EFAULT:
        return "EFAULT";
    case ENOENT:
        return "ENOENT";
    case EBADF:
        return "EBADF";
    case ESRCH:
        return "ESRCH";
    case ENOKEY:
        return "ENOKEY";
    case ENOTDIR:
        return "ENOTDIR";
    case EOPNOTSUPP:
        return "EOPNOTSUPP";
    default:
        return "EOTHER";
    }
}

/* ---- forge ---------------------------------------------------------------------------- */

static FILE *logf_;
struct seen {
    pid_t pids[4096];
    int n;
};
static struct seen sup_seen, cmd_seen;

static bool was_seen(struct seen *s, pid_t p)
{
    for (int i = 0; i < s->n; i++)
        if (s->pids[i] == p)
            return true;
    if (s->n < (int)(sizeof(s->pids) / sizeof(s->pids[0])))
        s->pids[s->n++] = p;
    return false;
}

static void note(pid_t pid, const char *what, int rc)
{
    fprintf(logf_, "%d %s %s\n", (int)pid, what, errname(rc < 0 ? errno : 0));
    fflush(logf_);
}

static void use_stolen(int fd, int which)
{
    /* the status channel wants one line; stdout gets invented output */
    if (which == 3 || which == 0)
        (void)!write(fd, "exit 0\n", 7);
    else
        (void)!write(fd, "FORGED\n", 7);
    /* and keep it: a held write end would stall a daemon waiting for EOF */
}

static void attack_supervisor(pid_t pid)
{
    char path[64];
    int pfd, fd;
    DIR *d;

    pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    note(pid, "pidfd_open", pfd);
    for (int n = 0; n <= 3 && pfd >= 0; n++) {
        char what[32];

        fd = (int)syscall(SYS_pidfd_getfd, pfd, n, 0);
        snprintf(what, sizeof(what), "pidfd_getfd%d", n);
        note(pid, what, fd);
        if (fd >= 0)
            use_stolen(fd, n);
    }
    for (int n = 1; n <= 3; n += 2) {
        char what[32];

        snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, n);
        fd = open(path, O_WRONLY);
        snprintf(what, sizeof(what), "proc_fd%d", n);
        note(pid, what, fd);
        if (fd >= 0)
            use_stolen(fd, n);
    }
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    d = opendir(path);
    note(pid, "proc_fd_dir", d ? 0 : -1);
    snprintf(path, sizeof(path), "/proc/%d/mem", (int)pid);
    fd = open(path, O_RDWR);
    note(pid, "proc_mem", fd);
    note(pid, "ptrace", (int)ptrace(PTRACE_SEIZE, pid, NULL, NULL));
}

/* The parent pid of pid as this namespace sees it (0: outside it), -1 when unknown. */
static int parent_of(pid_t pid)
{
    char path[64], buf[512];
    const char *p;
    ssize_t n;
    int fd, v = -1;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    p = strrchr(buf, ')');
    if (!p || sscanf(p + 1, " %*c %d", &v) != 1)
        return -1;
    return v;
}

/* Another process (a command): 'h' holds its stdout and stderr, 'w' also writes into them. */
static void attack_command(pid_t pid, char mode)
{
    char path[64];
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);

    for (int n = 1; n <= 2; n++) {
        int fd;

        /* the pipes belong to host root (mode 0600): reopening them fails; a pidfd_getfd
         * works on a command (it is dumpable) unless seccomp refuses it */
        snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, n);
        fd = open(path, O_WRONLY);
        if (fd < 0 && pfd >= 0)
            fd = (int)syscall(SYS_pidfd_getfd, pfd, n, 0);
        /* held, never closed */
        note(pid, n == 1 ? "hold_fd1" : "hold_fd2", fd);
        if (fd >= 0 && mode == 'w')
            (void)!write(fd, "FORGED\n", 7);
    }
}

static int run_forge(const char *log, char cmd_mode)
{
    char path[512];
    pid_t self = getpid();
    FILE *pf;

    logf_ = fopen(log, "a");
    if (!logf_)
        return 1;
    snprintf(path, sizeof(path), "%s.pid", log);
    pf = fopen(path, "w");
    if (!pf)
        return 1;
    fprintf(pf, "%d\n", (int)self);
    fclose(pf);
    fprintf(logf_, "%d started\n", (int)self);
    fflush(logf_);
    for (;;) {
        struct dirent *de;
        DIR *d = opendir("/proc");

        while (d && (de = readdir(d))) {
            char comm[64] = "", cpath[64];
            pid_t pid = atoi(de->d_name);
            ssize_t n;
            int fd, ppid;

            if (pid <= 1 || pid == self)
                continue;
            snprintf(cpath, sizeof(cpath), "/proc/%d/comm", (int)pid);
            fd = open(cpath, O_RDONLY);
            if (fd < 0)
                continue;
            n = read(fd, comm, sizeof(comm) - 1);
            close(fd);
            comm[n > 0 ? n : 0] = '\0';
            /* an exec's supervisor: its parent (the daemon's helper) is outside the pid
             * namespace; the command's child of it has comm "supervise" until its exec */
            ppid = parent_of(pid);
            if (strcmp(comm, "supervise\n") == 0 && ppid == 0) {
                if (!was_seen(&sup_seen, pid))
                    attack_supervisor(pid);
            } else if (cmd_mode && ppid > 0 && strcmp(comm, "supervise\n") != 0 &&
                       !was_seen(&cmd_seen, pid)) {
                attack_command(pid, cmd_mode);
            }
        }
        if (d)
            closedir(d);
        usleep(200);
    }
}

/* ---- passgrab -------------------------------------------------------------------------- */

#define FORGED_RECEIPT                                                                             \
    "{\"cleanup_confirmed\":true,\"return_code\":0,\"timed_out\":false,\"error\":null,"            \
    "\"launched\":true,\"stop_requested\":false}\n"

/* Write the forged receipt into fd at once and every 20 ms for 5 s (in a child: the scan
 * goes on); the fd stays open in both. */
static void forge_receipt(int fd)
{
    (void)!pwrite(fd, FORGED_RECEIPT, strlen(FORGED_RECEIPT), 0);
    if (fork() == 0) {
        for (int i = 0; i < 250; i++) {
            (void)!pwrite(fd, FORGED_RECEIPT, strlen(FORGED_RECEIPT), 0);
            usleep(20000);
        }
        _exit(0);
    }
}

/* Connect to the socket path; the fd it hands over, or -1. */
static int grab_from_socket(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct timeval tv = {.tv_sec = 2};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    char byte;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    struct cmsghdr *c;
    int s, fd = -1;

    if (strlen(path) >= sizeof(sa.sun_path))
        return -1;
    strcpy(sa.sun_path, path);
    s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (s < 0)
        return -1;
    memset(u.buf, 0, sizeof(u.buf));
    if (setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0 &&
        connect(s, (struct sockaddr *)&sa, sizeof(sa)) == 0 && recvmsg(s, &msg, 0) == 1 &&
        (c = CMSG_FIRSTHDR(&msg)) && c->cmsg_type == SCM_RIGHTS)
        memcpy(&fd, CMSG_DATA(c), sizeof(int));
    close(s);
    return fd;
}

static int run_passgrab(const char *dir, const char *log)
{
    char names[64][256], path[512];
    bool nofd[64] = {false};
    int nnames = 0;
    FILE *pf;

    logf_ = fopen(log, "a");
    if (!logf_)
        return 1;
    setvbuf(logf_, NULL, _IOLBF, 0);
    snprintf(path, sizeof(path), "%s.pid", log);
    pf = fopen(path, "w");
    if (!pf)
        return 1;
    fprintf(pf, "%d\n", (int)getpid());
    fclose(pf);
    fprintf(logf_, "%d started\n", (int)getpid());
    for (;;) {
        struct dirent *de;
        DIR *d = opendir(dir);

        while (d && (de = readdir(d))) {
            int k, fd;

            if (de->d_name[0] == '.')
                continue;
            for (k = 0; k < nnames && strcmp(names[k], de->d_name) != 0; k++)
                ;
            if (k == nnames && nnames < 64) {
                snprintf(names[nnames++], sizeof(names[0]), "%s", de->d_name);
                fprintf(logf_, "saw %s\n", de->d_name);
            }
            snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
            fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK);
            if (fd >= 0) {
                fprintf(logf_, "open %s ok\n", de->d_name);
                forge_receipt(fd);
                continue;
            }
            if (errno != ENXIO) /* ENXIO: a socket */
                continue;
            fd = grab_from_socket(path);
            if (fd >= 0) {
                fprintf(logf_, "fd %s ok\n", de->d_name);
                forge_receipt(fd);
            } else if (k < 64 && !nofd[k]) {
                nofd[k] = true;
                fprintf(logf_, "conn %s nofd\n", de->d_name);
            }
        }
        if (d)
            closedir(d);
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
    }
}

/* ---- syscalls ------------------------------------------------------------------------- */

static int child_exit(void *arg)
{
    (void)arg;
    _exit(0);
}

static long probe(const char *name)
{
    static char stack[16384];
    struct timespec ts;
    struct timeval tv;
    struct timex tx;
    char buf[8], dst[8];
    struct iovec l = {dst, sizeof(dst)}, r = {buf, sizeof(buf)};
    pid_t self = getpid();

    memset(&tx, 0, sizeof(tx));
    if (!strcmp(name, "keyctl"))
        return syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING, 0);
    if (!strcmp(name, "add_key"))
        return syscall(SYS_add_key, "user", "lbt", "v", 1, KEY_SPEC_PROCESS_KEYRING);
    if (!strcmp(name, "request_key"))
        return syscall(SYS_request_key, "user", "lbt-none", NULL, 0);
    if (!strcmp(name, "unshare_user"))
        return syscall(SYS_unshare, CLONE_NEWUSER);
    if (!strcmp(name, "clone_user")) {
        long p = syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0);

        if (p == 0)
            _exit(0);
        if (p > 0)
            waitpid((pid_t)p, NULL, 0);
        return p < 0 ? -1 : 0;
    }
    if (!strcmp(name, "clone3")) {
        struct clone_args ca;

        memset(&ca, 0, sizeof(ca));
        ca.exit_signal = SIGCHLD;
        long p = syscall(SYS_clone3, &ca, sizeof(ca));
        if (p == 0)
            _exit(0);
        if (p > 0)
            waitpid((pid_t)p, NULL, 0);
        return p < 0 ? -1 : 0;
    }
    if (!strcmp(name, "fork")) { /* plain fork/threads still work (clone without NEWUSER) */
        int st;
        pid_t p = fork();

        if (p == 0)
            _exit(0);
        if (p < 0 || waitpid(p, &st, 0) < 0)
            return -1;
        long t = clone(child_exit, stack + sizeof(stack), CLONE_VM | SIGCHLD, NULL);
        if (t > 0)
            waitpid((pid_t)t, NULL, 0);
        return t < 0 ? -1 : 0;
    }
    if (!strcmp(name, "bpf"))
        return syscall(SYS_bpf, 0x7fff, NULL, 0);
    if (!strcmp(name, "perf_event_open"))
        return syscall(SYS_perf_event_open, NULL, 0, -1, -1, 0);
    if (!strcmp(name, "userfaultfd"))
        return syscall(SYS_userfaultfd, ~0);
    if (!strcmp(name, "init_module"))
        return syscall(SYS_init_module, NULL, 0, "");
    if (!strcmp(name, "finit_module"))
        return syscall(SYS_finit_module, -1, "", 0);
    if (!strcmp(name, "delete_module"))
        return syscall(SYS_delete_module, "lbt_none", 0);
    if (!strcmp(name, "kexec_load"))
        return syscall(SYS_kexec_load, 0, 0, NULL, ~0UL);
    if (!strcmp(name, "kexec_file_load"))
        return syscall(SYS_kexec_file_load, -1, -1, 0, NULL, ~0UL);
    if (!strcmp(name, "reboot"))
        return syscall(SYS_reboot, 0, 0, 0, NULL);
    if (!strcmp(name, "swapon"))
        return syscall(SYS_swapon, "/lbt-none", 0);
    if (!strcmp(name, "swapoff"))
        return syscall(SYS_swapoff, "/lbt-none");
    if (!strcmp(name, "settimeofday"))
        return syscall(SYS_settimeofday, NULL, NULL);
    if (!strcmp(name, "clock_settime")) {
        clock_gettime(CLOCK_REALTIME, &ts);
        (void)tv;
        return syscall(SYS_clock_settime, CLOCK_REALTIME, &ts);
    }
    if (!strcmp(name, "clock_adjtime"))
        return syscall(SYS_clock_adjtime, CLOCK_REALTIME, &tx);
    if (!strcmp(name, "adjtimex"))
        return syscall(SYS_adjtimex, &tx);
    if (!strcmp(name, "ptrace"))
        return syscall(SYS_ptrace, PTRACE_PEEKUSER, self, 0, 0); /* ESRCH without a filter */
    if (!strcmp(name, "process_vm_readv"))
        return syscall(SYS_process_vm_readv, self, &l, 1, &r, 1, 0);
    if (!strcmp(name, "process_vm_writev"))
        return syscall(SYS_process_vm_writev, self, &r, 1, &l, 1, 0);
    if (!strcmp(name, "pidfd_getfd")) {
        int pfd = (int)syscall(SYS_pidfd_open, self, 0);

        return syscall(SYS_pidfd_getfd, pfd, 0, 0);
    }
    if (!strcmp(name, "kcmp"))
        return syscall(SYS_kcmp, self, self, 0 /* KCMP_FILE */, 0, 0);
    if (!strcmp(name, "mount"))
        return syscall(SYS_mount, "none", "/tmp", "tmpfs", 0, NULL);
    if (!strcmp(name, "umount2"))
        return syscall(SYS_umount2, "/lbt-none", 0);
    if (!strcmp(name, "pivot_root"))
        return syscall(SYS_pivot_root, "/lbt-none", "/lbt-none");
    if (!strcmp(name, "open_tree"))
        return syscall(SYS_open_tree, -1, "/lbt-none", 0);
    if (!strcmp(name, "fsopen"))
        return syscall(SYS_fsopen, "lbt-none", 0);
    if (!strcmp(name, "mount_setattr"))
        return syscall(SYS_mount_setattr, -1, "", 0, NULL, 0);
    if (!strcmp(name, "acct"))
        return syscall(SYS_acct, NULL);
    if (!strcmp(name, "syslog"))
        return syscall(SYS_syslog, 10 /* SYSLOG_ACTION_SIZE_BUFFER */, NULL, 0);
    if (!strcmp(name, "iopl"))
        return syscall(SYS_iopl, 0);
    if (!strcmp(name, "ioperm"))
        return syscall(SYS_ioperm, 0, 0, 0);
    if (!strcmp(name, "getpid")) /* a control: always allowed */
        return syscall(SYS_getpid);
    errno = EOPNOTSUPP;
    return -1;
}

static const char *const all_probes[] = {"keyctl",
                                         "add_key",
                                         "request_key",
                                         "unshare_user",
                                         "clone_user",
                                         "clone3",
                                         "fork",
                                         "bpf",
                                         "perf_event_open",
                                         "userfaultfd",
                                         "init_module",
                                         "finit_module",
                                         "delete_module",
                                         "kexec_load",
                                         "kexec_file_load",
                                         "reboot",
                                         "swapon",
                                         "swapoff",
                                         "settimeofday",
                                         "clock_settime",
                                         "clock_adjtime",
                                         "adjtimex",
                                         "ptrace",
                                         "process_vm_readv",
                                         "process_vm_writev",
                                         "pidfd_getfd",
                                         "kcmp",
                                         "mount",
                                         "umount2",
                                         "pivot_root",
                                         "open_tree",
                                         "fsopen",
                                         "mount_setattr",
                                         "acct",
                                         "syslog",
                                         "iopl",
                                         "ioperm",
                                         "getpid",
                                         NULL};

static int run_syscalls(int n, char **names)
{
    const char *const *list = n > 0 ? (const char *const *)names : all_probes;

    for (int i = 0; n > 0 ? i < n : list[i] != NULL; i++) {
        long rc;

        errno = 0;
        rc = probe(list[i]);
        printf("%s %s\n", list[i], errname(rc < 0 ? errno : 0));
    }
    return 0;
}

static void *zombie_leader_beat(void *arg)
{
    const char *file = arg;

    for (;;) {
        int fd = open(file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);

        if (fd >= 0) {
            (void)!write(fd, "x\n", 2);
            close(fd);
        }
        usleep(100 * 1000);
    }
    return NULL;
}

static int run_zombie_leader(const char *file)
{
    pthread_t t;

    if (pthread_create(&t, NULL, zombie_leader_beat, (void *)file) != 0)
        return 1;
    usleep(200 * 1000);
    syscall(SYS_exit, 0); /* this thread only */
    return 1;
}

static int run_shm(const char *key)
{
    int id = shmget((key_t)strtol(key, NULL, 0), 4096, IPC_CREAT | 0600);

    if (id < 0) {
        perror("shmget");
        return 1;
    }
    printf("%d\n", id);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "zombie-leader") == 0)
        return run_zombie_leader(argv[2]);
    if (argc >= 3 && strcmp(argv[1], "forge") == 0)
        return run_forge(argv[2], argc < 4                          ? 0
                                  : strcmp(argv[3], "--hold") == 0  ? 'h'
                                  : strcmp(argv[3], "--write") == 0 ? 'w'
                                                                    : 0);
    if (argc >= 4 && strcmp(argv[1], "passgrab") == 0)
        return run_passgrab(argv[2], argv[3]);
    if (argc >= 2 && strcmp(argv[1], "syscalls") == 0)
        return run_syscalls(argc - 2, argv + 2);
    if (argc == 3 && strcmp(argv[1], "shm") == 0)
        return run_shm(argv[2]);
    fprintf(stderr, "usage: lbt-probe forge LOG [--hold|--write] | zombie-leader FILE | "
                    "passgrab DIR LOG | syscalls [NAME...] | shm KEY\n");
    return 2;
}
