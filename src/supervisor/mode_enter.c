/*
 * mode_enter.c - enter mode of lendbox-supervise, the local provider's exec helper, run by the
 * daemon as host root outside the sandbox: join the sandbox's cgroups, keyring and namespaces,
 * become its root without capabilities but the three a user switch needs, install its seccomp
 * filter, then start command mode inside it and stay its parent. --enter-view also builds the
 * trusted view of an exclusive exec (a mount namespace over the read-only base image). The
 * argument layout and fds: supervise.c's head comment, "Enter mode".
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "supervisor/supervise_internal.h"

#define ENTER_STATUS_FD 3
#define ENTER_NS 6
#define ENTER_SECCOMP_MAX (64 * 1024)
#define ENTER_CLOSE_RANGE_CLOEXEC (1U << 2) /* linux/close_range.h, Linux 5.11 */

static void enter_fail(const char *what)
{
    proc_write_status(ENTER_STATUS_FD, "error %s: errno %d", what, errno);
    _exit(1);
}

/* Every capability but CAP_SETUID, CAP_SETGID and CAP_SETPCAP gone (bounding, ambient,
 * effective/permitted/inheritable) and no new privileges: as uid 0 of the sandbox's user
 * namespace we got all of them by entering it. The three kept act only inside that namespace
 * (they switch among the sandbox's own ids and shrink the bounding set): the command-mode
 * supervisor needs them to run a command as a sandbox user, and drops all three, bounding set
 * included, in the command before its exec. */
static int enter_drop_capabilities(void)
{
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];
    const uint32_t keep = (1u << CAP_SETUID) | (1u << CAP_SETGID) | (1u << CAP_SETPCAP);

    for (int cap = 0; cap <= 63; cap++)
        if (cap != CAP_SETUID && cap != CAP_SETGID && cap != CAP_SETPCAP &&
            prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
            return -1;
    (void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    memset(data, 0, sizeof(data));
    data[0].effective = data[0].permitted = keep;
    if (syscall(SYS_capset, &hdr, data) < 0)
        return -1;
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
}

static int enter_install_seccomp(int fd)
{
    static struct sock_filter prog[ENTER_SECCOMP_MAX / sizeof(struct sock_filter)];
    struct sock_fprog fprog;
    size_t off = 0;
    ssize_t n;

    while ((n = pread(fd, (char *)prog + off, sizeof(prog) - off, (off_t)off)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        off += (size_t)n;
        if (off == sizeof(prog)) {
            errno = E2BIG;
            return -1;
        }
    }
    if (off == 0 || off % sizeof(struct sock_filter)) {
        errno = EINVAL;
        return -1;
    }
    fprog.len = (unsigned short)(off / sizeof(struct sock_filter));
    fprog.filter = prog;
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog);
}

/* The trusted view of an exclusive exec (enter mode, --enter-view). */

#define VIEW_RUN_MAX_MIB 64

/* What a grader's view is made of: base, the image's read-only tree on the host (NULL: the
 * sandbox's own root, already read-only: image host), already idmapped to the sandbox's ids
 * (the overlay's lower layer) or not (idmap: the image tree itself); hosts, a host file bound
 * at /etc/hosts (NULL: none); the workdir, bound from the sandbox at its path; tmp_mib, the
 * size of the fresh /tmp. base_fd and hosts_fd are their detached clones (open_tree), taken on
 * the host. */
struct enter_view {
    const char *base, *hosts, *workdir;
    bool idmap;
    int64_t tmp_mib;
    int base_fd, hosts_fd;
};

/* Top-level names of the base the view does not take from it: the sandbox's /proc and /dev,
 * and fresh /tmp and /run. */
static bool view_skipped(const char *name)
{
    static const char *const skip[] = {"proc", "dev", "tmp", "run", "lost+found"};

    for (size_t i = 0; i < sizeof(skip) / sizeof(skip[0]); i++) {
        if (strcmp(name, skip[i]) == 0)
            return true;
    }
    return false;
}

/* Fill dst (a directory of the view's tmpfs) from src (the same place in the base): every
 * directory bound (recursively, so read-only and idmapped as the base is), every symlink
 * copied, every regular file bound; but for the entry named by the first component of rest
 * (the workdir's path below this level), which becomes a directory of the tmpfs filled the
 * same way one level down, so the workdir's mount point exists whatever the image holds. At
 * the top, the names of view_skipped are left out. 0 or -1 (errno set). */
static int view_fill(const char *src, const char *dst, const char *rest, bool top)
{
    char next[NAME_MAX + 1] = "", s[PATH_MAX], t[PATH_MAX], link[PATH_MAX];
    size_t len = strcspn(rest, "/");
    struct dirent *de;
    struct stat st;
    DIR *d;
    int r = 0;

    if (len > NAME_MAX) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(next, rest, len);
    next[len] = '\0';
    d = src ? opendir(src) : NULL;
    while (d && (de = readdir(d))) {
        const char *n = de->d_name;
        ssize_t k;

        if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0 || strcmp(n, next) == 0 ||
            (top && view_skipped(n)))
            continue;
        if ((size_t)snprintf(s, sizeof(s), "%s/%s", src, n) >= sizeof(s) ||
            (size_t)snprintf(t, sizeof(t), "%s/%s", dst, n) >= sizeof(t) || lstat(s, &st) < 0)
            continue;
        if (S_ISLNK(st.st_mode)) {
            k = readlink(s, link, sizeof(link) - 1);
            if (k < 0)
                continue;
            link[k] = '\0';
            if (symlink(link, t) < 0)
                goto fail;
        } else if (S_ISDIR(st.st_mode)) {
            if (mkdir(t, 0755) < 0 || mount(s, t, NULL, MS_BIND | MS_REC, NULL) < 0)
                goto fail;
        } else if (S_ISREG(st.st_mode)) {
            int fd = open(t, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);

            if (fd < 0)
                goto fail;
            close(fd);
            if (mount(s, t, NULL, MS_BIND, NULL) < 0)
                goto fail;
        }
    }
    if (len == 0)
        goto out;
    if ((size_t)snprintf(t, sizeof(t), "%s/%s", dst, next) >= sizeof(t) ||
        (mkdir(t, 0755) < 0 && errno != EEXIST))
        goto fail;
    /* one level down: the base's directory of that name, when it is a directory */
    if (src && (size_t)snprintf(s, sizeof(s), "%s/%s", src, next) < sizeof(s) &&
        lstat(s, &st) == 0 && S_ISDIR(st.st_mode))
        r = view_fill(s, t, rest + len + (rest[len] == '/'), false);
    else
        r = view_fill(NULL, t, rest + len + (rest[len] == '/'), false);
    goto out;
fail:
    r = -1;
out:
    if (d) {
        int e = errno;

        closedir(d);
        errno = e;
    }
    return r;
}

static int view_tmpfs(const char *target, const char *mode, int64_t mib)
{
    char opts[64];

    snprintf(opts, sizeof(opts), "mode=%s,size=%lldm", mode, (long long)mib);
    return mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, opts);
}

/* In the sandbox's user and mount namespaces, with their capabilities: a mount namespace of
 * this exec's own (nothing mounted here reaches the sandbox, nor the other way) whose / holds
 * nothing the sandbox's processes could write but the workdir. With a base: a read-only tmpfs
 * filled from the base (view_fill), the sandbox's /proc and /dev (with a fresh /dev/shm), a
 * fresh /tmp and /run, the workdir, /etc/hosts; then pivot_root into it and the sandbox's own
 * root detached. Without (image host, whose / is the host's, read-only): the sandbox's root
 * with a fresh /tmp, /run and /dev/shm. Ends with the cwd at /. Fails through enter_fail. */
static void view_enter(const struct enter_view *v)
{
    char wd[PATH_MAX];
    struct stat st;

    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        enter_fail("cannot make the grading view's mount namespace");
    if (v->base_fd < 0) {
        if (view_tmpfs("/tmp", "1777", v->tmp_mib) < 0 ||
            view_tmpfs("/run", "0755",
                       v->tmp_mib < VIEW_RUN_MAX_MIB ? v->tmp_mib : VIEW_RUN_MAX_MIB) < 0 ||
            (stat("/dev/shm", &st) == 0 && view_tmpfs("/dev/shm", "1777", v->tmp_mib) < 0) ||
            chdir("/") < 0)
            enter_fail("cannot mount the grading view's /tmp, /run and /dev/shm");
        return;
    }
    /* built on a tmpfs over the sandbox's /tmp (a mount point its processes cannot move) */
    if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m") < 0 ||
        chdir("/tmp") < 0 || mkdir(".base", 0700) < 0 ||
        syscall(SYS_move_mount, v->base_fd, "", AT_FDCWD, ".base", 0x4 /* F_EMPTY_PATH */) < 0)
        enter_fail("cannot mount the image's base tree");
    if (view_fill(".base", ".", v->workdir + 1, true) < 0)
        enter_fail("cannot fill the grading view from the image's base tree");
    if (umount2(".base", MNT_DETACH) < 0 || rmdir(".base") < 0)
        enter_fail("cannot unmount the image's base tree");
    if ((size_t)snprintf(wd, sizeof(wd), ".%s", v->workdir) >= sizeof(wd))
        enter_fail("the workdir's path is too long");
    if ((mkdir("proc", 0555) < 0 && errno != EEXIST) || mkdir("dev", 0755) < 0 ||
        mkdir("tmp", 01777) < 0 || mkdir("run", 0755) < 0 ||
        mount("/proc", "proc", NULL, MS_BIND | MS_REC, NULL) < 0 ||
        mount("/dev", "dev", NULL, MS_BIND | MS_REC, NULL) < 0 ||
        (stat("dev/shm", &st) == 0 && view_tmpfs("dev/shm", "1777", v->tmp_mib) < 0) ||
        view_tmpfs("tmp", "1777", v->tmp_mib) < 0 ||
        view_tmpfs("run", "0755", v->tmp_mib < VIEW_RUN_MAX_MIB ? v->tmp_mib : VIEW_RUN_MAX_MIB) <
            0)
        enter_fail("cannot mount the grading view's /proc, /dev, /tmp and /run");
    if (mount(v->workdir, wd, NULL, MS_BIND | MS_REC, NULL) < 0)
        enter_fail("cannot mount the workdir in the grading view");
    if (v->hosts_fd >= 0 && lstat("etc/hosts", &st) == 0 && S_ISREG(st.st_mode) &&
        syscall(SYS_move_mount, v->hosts_fd, "", AT_FDCWD, "etc/hosts", 0x4) < 0)
        enter_fail("cannot mount /etc/hosts in the grading view");
    if (mount(NULL, ".", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
        enter_fail("cannot make the grading view's root read-only");
    if (syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
        enter_fail("cannot enter the grading view");
}

/* On the host, before any namespace is entered: detached clones of the base and the hosts
 * file (read-only, as the host has them), for view_enter. An image tree (idmap) is mapped as
 * local_image.c maps the overlay's lower layer, 0..65535 -> the sandbox's ids, through the
 * sandbox's own user namespace (userns_fd), read-only, nosuid and nodev. */
static void view_open(struct enter_view *v, int userns_fd)
{
    const unsigned clone = 1 /* OPEN_TREE_CLONE */ | O_CLOEXEC;
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID |
                                          MOUNT_ATTR_NODEV,
                              .userns_fd = (uint64_t)userns_fd};

    v->base_fd = v->hosts_fd = -1;
    if (v->base &&
        (v->base_fd = (int)syscall(SYS_open_tree, AT_FDCWD, v->base, clone | AT_RECURSIVE)) < 0)
        enter_fail("cannot clone the image's base tree");
    if (v->base && v->idmap &&
        syscall(SYS_mount_setattr, v->base_fd, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr,
                sizeof(attr)) < 0)
        enter_fail("cannot idmap the image's base tree");
    if (v->hosts && (v->hosts_fd = (int)syscall(SYS_open_tree, AT_FDCWD, v->hosts, clone)) < 0)
        enter_fail("cannot clone the sandbox's hosts file");
}

static int enter_run(int argc, char **argv, struct enter_view *view)
{
    static const int ns_types[ENTER_NS] = {CLONE_NEWUSER, CLONE_NEWNS,  CLONE_NEWPID,
                                           CLONE_NEWNET,  CLONE_NEWUTS, CLONE_NEWIPC};
    int64_t nchild, ncg, seccomp_fd, nofile, nenv;
    struct rlimit lim;
    char **env, **cmd;
    int i, ws = 0, self_fd;
    pid_t g;
    bool keyrings_refused = false;
    const char *host = NULL;

    if (argc > 2 && strcmp(argv[2], "--keyrings-refused") == 0) {
        keyrings_refused = true;
        argv[2] = argv[1];
        argv++;
        argc--;
    }
    if (argc > 3 && strcmp(argv[2], "--host") == 0) {
        host = argv[3];
        argv[3] = argv[1];
        argv += 2;
        argc -= 2;
    }
    if (argc < 8 || proc_parse_int64(argv[2], 4, 5, &nchild) < 0 ||
        proc_parse_int64(argv[3], 0, 16, &ncg) < 0 ||
        proc_parse_int64(argv[4], -1, 64, &seccomp_fd) < 0 ||
        proc_parse_int64(argv[5], 1, INT_MAX, &nofile) < 0 ||
        proc_parse_int64(argv[6], 0, argc, &nenv) < 0 || 7 + nenv + 1 >= argc ||
        strcmp(argv[7 + nenv], "--") != 0) {
        proc_write_status(ENTER_STATUS_FD, "error bad lendbox-supervise --enter arguments");
        return 2;
    }
    env = argv + 7;
    argv[7 + nenv] = NULL; /* ends env */
    cmd = argv + 7 + nenv + 1;
    /* The supervisor we start is this very binary, run through this fd, never the file at
     * cmd[0] inside the sandbox: the sandbox's root owns /run there and could rename
     * /run/lendbox and put a program of its own at that path. Opened here, on the host, before
     * any namespace is entered. */
    self_fd = open("/proc/self/exe", O_PATH | O_CLOEXEC);
    if (self_fd < 0)
        enter_fail("cannot open the supervisor's own binary");
    if (syscall(SYS_setgroups, 0, NULL) < 0)
        enter_fail("cannot drop supplementary groups");
    for (i = 0; i < ncg; i++) {
        if (write((int)nchild + ENTER_NS + i, "0", 1) != 1)
            enter_fail("cannot join the sandbox cgroup");
    }
    /* a session keyring of this exec's own, not the daemon's (nor another exec's) */
    if (syscall(SYS_keyctl, 1 /* KEYCTL_JOIN_SESSION_KEYRING */, NULL, 0, 0, 0) < 0 &&
        errno != ENOSYS && !(keyrings_refused && errno == EPERM))
        enter_fail("cannot make a session keyring");
    if (view)
        view_open(view, (int)nchild); /* the first namespace fd: the sandbox's user namespace */
    for (i = 0; i < ENTER_NS; i++) {
        if (syscall(SYS_setns, (int)nchild + i, ns_types[i]) < 0)
            enter_fail("cannot enter the sandbox namespaces");
    }
    /* uid/gid 0 of the sandbox's user namespace: its host uid, never host root */
    if (syscall(SYS_setresgid, 0, 0, 0) < 0 || syscall(SYS_setresuid, 0, 0, 0) < 0)
        enter_fail("cannot become the sandbox's root");
    /* an exclusive exec's own mount namespace, made with the sandbox's capabilities */
    if (view)
        view_enter(view);
    /* else a command could remount the read-only host directories writable or bind-mount
     * over the supervisor */
    if (enter_drop_capabilities() < 0)
        enter_fail("cannot drop capabilities");
    umask(022); /* the daemon's 077 is not the sandbox's business */
    /* A fork, not a clone sharing our memory until its exec: that child, in the sandbox's pid
     * namespace as the sandbox's root, can be stopped by any sandbox process before its exec,
     * and the "supervisor" line below (which lets a reset's or a release's fence go up) must
     * not wait for it. */
    g = fork();
    if (g == 0) {
        struct utsname u;

        /* Inside the pid namespace now, so a reset's kill loop ends this process, unless it
         * came after that loop: the sandbox is then the next episode's, recycled under another
         * id whose hostname the reset set before its kill (mode_reset.c). An exec of the old
         * id must not run there. */
        if (host && (uname(&u) < 0 || strcmp(u.nodename, host) != 0)) {
            proc_write_status(ENTER_STATUS_FD,
                              "error the sandbox is no longer %s (it was reset under another "
                              "id): errno %d",
                              host, ENOENT);
            _exit(127);
        }
        /* then the filter (which may refuse uname: security.seccomp_deny), in this process
         * only: it refuses keyctl, which the keyring above needed; the helper above runs no
         * sandbox code and no sandbox process can reach it */
        if (seccomp_fd >= 0 && enter_install_seccomp((int)seccomp_fd) < 0) {
            proc_write_status(ENTER_STATUS_FD, "error cannot install the seccomp filter: errno %d",
                              errno);
            _exit(127);
        }
        /* close-on-exec rather than closed: self_fd must live until the exec */
        (void)syscall(SYS_close_range, (unsigned)nchild, ~0U, ENTER_CLOSE_RANGE_CLOEXEC);
        lim.rlim_cur = lim.rlim_max = (rlim_t)nofile;
        if (setrlimit(RLIMIT_NOFILE, &lim) < 0) {
            proc_write_status(ENTER_STATUS_FD,
                              "error cannot set the sandbox's open-file limit: errno %d", errno);
            _exit(127);
        }
        syscall(SYS_execveat, self_fd, "", cmd, env, AT_EMPTY_PATH);
        proc_write_status(ENTER_STATUS_FD, "error cannot execute %s: errno %d", cmd[0], errno);
        _exit(127);
    }
    if (g < 0)
        enter_fail("fork inside the sandbox failed");
    /* one write, so one line; any order with the supervisor's own status line */
    proc_write_status(ENTER_STATUS_FD, "supervisor %d", (int)g);
    (void)syscall(SYS_close_range, 0, ~0U, 0);
    while (waitpid(g, &ws, 0) < 0 && errno == EINTR)
        ;
    return WIFSIGNALED(ws) ? 128 + WTERMSIG(ws) : 0;
}

int mode_enter_run(int argc, char **argv)
{
    return enter_run(argc, argv, NULL);
}

int mode_enter_view_run(int argc, char **argv)
{
    bool root = strcmp(argv[2], "root") == 0;
    struct enter_view v = {.base = root ? NULL : argv[3],
                           .idmap = strcmp(argv[2], "image") == 0,
                           .hosts = strcmp(argv[4], "-") ? argv[4] : NULL,
                           .workdir = argv[5]};

    if ((!root && !v.idmap && strcmp(argv[2], "mounted") != 0) || (!root && argv[3][0] != '/') ||
        argv[5][0] != '/' || strcmp(argv[5], "/") == 0 ||
        proc_parse_int64(argv[6], 1, INT64_MAX / 2, &v.tmp_mib) < 0) {
        proc_write_status(ENTER_STATUS_FD, "error bad lendbox-supervise --enter-view arguments");
        return 2;
    }
    /* the rest as --enter's, from NCHILD on */
    return enter_run(argc - 5, argv + 5, &v);
}
