/* check_supervise.c - the lendbox-supervise binary ($LENDBOX_SUPERVISE, default
 * build/lendbox-supervise) run directly on the host, outside any sandbox, in the modes that need
 * no namespace: command mode's status lines (exit, signal, timeout, the shell's 127 and 126 for
 * a command that cannot run, a bad cwd or user, bad arguments) and its tree kill, framed mode's
 * frames, harness mode's launch, claim, fence and receipt, and PTY mode's session files. These
 * pin what every launch path shares (the exec tail, the detached holder and its ready byte) so a
 * change to one mode's code cannot silently change another's. Every process a case starts is
 * waited for (pidfd) before the case ends. The modes inside a sandbox are tested end to end in
 * tests/e2e (test_exec, test_activation, test_pty, test_forgery). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* What one run of the supervisor gave: its exit status, stdout, stderr and status-fd bytes. */
struct sup_run {
    int rc;
    char out[16384], err[4096], status[2048];
    size_t out_len;
};

/* a hang guard well under the case's timeout, so a hang fails by assertion and cleans up */
#define HANG_MS 20000

/* every case's directory is made below base, which main makes and removes */
static char base[64], dir[96];

static const char *supervise_path(void)
{
    const char *s = getenv("LENDBOX_SUPERVISE");

    return s && *s ? s : "build/lendbox-supervise";
}

/* SIGKILL every child of this process until none is left (as a subreaper, every orphan of the
 * supervisors a case ran, a holder or a kept background process, comes to us) and reap them.
 * Returns how many were found alive. */
static int kill_children(void)
{
    char path[64], buf[4096];
    int found = 0;

    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)getpid(), (int)getpid());
    for (;;) {
        int fd, n_pids = 0;
        ssize_t n;
        char *p, *end;

        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return found;
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        buf[n > 0 ? n : 0] = '\0';
        for (p = buf;; p = end) {
            long pid = strtol(p, &end, 10);

            if (end == p)
                break;
            (void)kill((pid_t)pid, SIGKILL);
            n_pids++;
        }
        if (!n_pids)
            return found;
        found += n_pids;
        (void)waitpid(-1, NULL, 0);
    }
}

static void remove_dir(const char *path)
{
    char cmd[160];

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "check_supervise: cannot remove %s\n", path);
}

static void setup(void)
{
    char path[sizeof(dir)];

    /* orphans of what a case starts become our children, so cleanup reaches every one */
    ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
    snprintf(path, sizeof(path), "%s/case-XXXXXX", base);
    ck_assert_ptr_nonnull(mkdtemp(path));
    memcpy(dir, path, sizeof(dir));
}

/* A passing case has left no process behind. (A failing one ends with _exit: its orphans come
 * to main, a subreaper too, which kills them and removes every case's directory.) */
static void teardown(void)
{
    int left = kill_children();

    remove_dir(dir);
    dir[0] = '\0';
    ck_assert_msg(left == 0, "%d processes of the case were still running", left);
}

/* Run the supervisor with args (NULL-terminated, argv[0] added here); fd 3 is a status pipe
 * when with_status, fd 5 is pass_fd when >= 0. Reads its stdout, stderr and status to EOF,
 * then reaps it. */
static void run_sup(struct sup_run *r, const char *const *args, bool with_status, int pass_fd)
{
    int out[2], err[2], st[2] = {-1, -1};
    const char *argv[32] = {supervise_path()};
    size_t lens[3] = {0, 0, 0}, caps[3];
    char *bufs[3];
    int fds[3], ws = 0;
    pid_t pid;

    memset(r, 0, sizeof(*r));
    for (size_t i = 0; args[i]; i++) {
        ck_assert_uint_lt(i + 2, sizeof(argv) / sizeof(argv[0]));
        argv[i + 1] = args[i];
    }
    ck_assert_int_eq(pipe2(out, O_CLOEXEC), 0);
    ck_assert_int_eq(pipe2(err, O_CLOEXEC), 0);
    if (with_status)
        ck_assert_int_eq(pipe2(st, O_CLOEXEC), 0);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* every source out of the targets' way first (fds 20 and up), then onto its target */
        int src[5] = {open("/dev/null", O_RDONLY | O_CLOEXEC), out[1], err[1], st[1], pass_fd};
        const int dst[5] = {0, 1, 2, 3, 5};

        for (int i = 0; i < 5; i++)
            if (src[i] >= 0 && (src[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 20)) < 0)
                _exit(120);
        for (int i = 0; i < 5; i++)
            if (src[i] >= 0 && dup2(src[i], dst[i]) < 0)
                _exit(120);
        execv(argv[0], (char **)argv);
        _exit(121);
    }
    close(out[1]);
    close(err[1]);
    if (with_status)
        close(st[1]);
    fds[0] = out[0], fds[1] = err[0], fds[2] = st[0];
    bufs[0] = r->out, bufs[1] = r->err, bufs[2] = r->status;
    caps[0] = sizeof(r->out), caps[1] = sizeof(r->err), caps[2] = sizeof(r->status);
    for (;;) {
        struct pollfd p[3];
        int open_n = 0;

        for (int i = 0; i < 3; i++) {
            p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
            open_n += fds[i] >= 0;
        }
        if (!open_n)
            break;
        /* a hang guard, not a speed check: the runs here take milliseconds */
        ck_assert_msg(poll(p, 3, HANG_MS) > 0, "the supervisor did not finish: %s", args[0]);
        for (int i = 0; i < 3; i++) {
            ssize_t n;

            if (fds[i] < 0 || !p[i].revents)
                continue;
            n = read(fds[i], bufs[i] + lens[i], caps[i] - 1 - lens[i]);
            if (n <= 0) {
                close(fds[i]);
                fds[i] = -1;
            } else {
                lens[i] += (size_t)n;
                ck_assert_uint_lt(lens[i], caps[i] - 1);
            }
        }
    }
    r->out_len = lens[0];
    ck_assert_int_eq(waitpid(pid, &ws, 0), pid);
    ck_assert_msg(WIFEXITED(ws), "the supervisor was killed by signal %d", WTERMSIG(ws));
    r->rc = WEXITSTATUS(ws);
}

/* Wait until process pid (not our child) has ended. */
static void wait_gone(pid_t pid)
{
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    struct pollfd p;

    if (pfd < 0) {
        ck_assert_int_eq(errno, ESRCH);
        return;
    }
    p = (struct pollfd){.fd = pfd, .events = POLLIN};
    ck_assert_msg(poll(&p, 1, HANG_MS) == 1, "process %d did not end", (int)pid);
    close(pfd);
    (void)waitpid(pid, NULL, WNOHANG); /* reaped here when it came to us */
}

static bool alive(pid_t pid)
{
    return kill(pid, 0) == 0;
}

/* "launched PID\n" on stdout: the holder's pid. */
static pid_t launched_pid(const struct sup_run *r)
{
    int pid = 0;
    char nl = 0;

    ck_assert_msg(sscanf(r->out, "launched %d%c", &pid, &nl) == 2 && nl == '\n' && pid > 1,
                  "not a launch: '%s' (stderr '%s')", r->out, r->err);
    return pid;
}

static void read_file(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n;

    ck_assert_msg(fd >= 0, "cannot open %s: %s", path, strerror(errno));
    n = read(fd, buf, cap - 1);
    ck_assert_int_ge(n, 0);
    buf[n] = '\0';
    close(fd);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

static pid_t read_pid_file(const char *path)
{
    char text[32];

    read_file(path, text, sizeof(text));
    return (pid_t)atoi(text);
}

START_TEST(test_command_status_lines)
{
    char noexec[PATH_MAX], want[PATH_MAX + 100];
    struct sup_run r;

    run_sup(&r,
            (const char *[]){"--status-fd", "3", "--timeout-ms", "60000", "--", "sh", "-c",
                             "echo out; echo err >&2; exit 3", NULL},
            true, -1);
    ck_assert_int_eq(r.rc, 0);
    ck_assert_str_eq(r.status, "exit 3\n");
    ck_assert_str_eq(r.out, "out\n");
    ck_assert_str_eq(r.err, "err\n");

    run_sup(&r,
            (const char *[]){"--status-fd", "3", "--timeout-ms", "60000", "--", "sh", "-c",
                             "kill -9 $$", NULL},
            true, -1);
    ck_assert_str_eq(r.status, "signal 9\n");

    /* a command that cannot run: the shell's 127 and 126, said on stderr */
    run_sup(&r,
            (const char *[]){"--status-fd", "3", "--timeout-ms", "60000", "--",
                             "/nonexistent/lbt-cmd", NULL},
            true, -1);
    ck_assert_int_eq(r.rc, 0);
    ck_assert_str_eq(r.status, "exit 127\n");
    ck_assert_str_eq(r.err, "lendbox-supervise: cannot run '/nonexistent/lbt-cmd': No such file "
                            "or directory\n");
    snprintf(noexec, sizeof(noexec), "%s/noexec", dir);
    write_file(noexec, "#!/bin/sh\n", 0644);
    run_sup(&r, (const char *[]){"--status-fd", "3", "--timeout-ms", "60000", "--", noexec, NULL},
            true, -1);
    ck_assert_str_eq(r.status, "exit 126\n");
    snprintf(want, sizeof(want), "lendbox-supervise: cannot run '%s': Permission denied\n", noexec);
    ck_assert_str_eq(r.err, want);

    run_sup(&r,
            (const char *[]){"--status-fd", "3", "--timeout-ms", "60000", "--cwd",
                             "/nonexistent/lbt-dir", "--", "true", NULL},
            true, -1);
    ck_assert_str_eq(r.status, "error cwd '/nonexistent/lbt-dir' does not exist\n");
    run_sup(&r,
            (const char *[]){"--status-fd", "3", "--timeout-ms", "60000", "--user",
                             "lbt-no-such-user", "--", "true", NULL},
            true, -1);
    ck_assert_str_eq(r.status, "error unknown user \"lbt-no-such-user\"\n");

    /* bad usage: exit 2, and the status fd says so when it was given */
    run_sup(&r, (const char *[]){"--status-fd", "3", "--", "true", NULL}, true, -1);
    ck_assert_int_eq(r.rc, 2);
    ck_assert_str_eq(r.status, "error bad lendbox-supervise arguments\n");
    ck_assert_ptr_nonnull(strstr(r.err, "usage: lendbox-supervise --init --ready-fd N\n"));
}
END_TEST

START_TEST(test_command_tree)
{
    char pidfile[PATH_MAX], script[PATH_MAX + 64];
    struct sup_run r;
    pid_t bg;

    snprintf(pidfile, sizeof(pidfile), "%s/bg.pid", dir);
    /* the timeout ends the command and what it started in the background */
    snprintf(script, sizeof(script), "sleep 1000 >/dev/null 2>&1 & echo $! >%s; wait", pidfile);
    run_sup(
        &r,
        (const char *[]){"--status-fd", "3", "--timeout-ms", "300", "--", "sh", "-c", script, NULL},
        true, -1);
    ck_assert_str_eq(r.status, "timeout\n");
    bg = read_pid_file(pidfile);
    ck_assert_int_gt(bg, 1);
    ck_assert(!alive(bg));

    /* a command that exits leaves nothing behind... */
    snprintf(script, sizeof(script), "sleep 1000 >/dev/null 2>&1 & echo $! >%s", pidfile);
    run_sup(&r,
            (const char *[]){"--status-fd", "3", "--timeout-ms", "60000", "--", "sh", "-c", script,
                             NULL},
            true, -1);
    ck_assert_str_eq(r.status, "exit 0\n");
    bg = read_pid_file(pidfile);
    ck_assert(!alive(bg));

    /* ...unless --keep-background */
    run_sup(&r,
            (const char *[]){"--status-fd", "3", "--timeout-ms", "60000", "--keep-background", "--",
                             "sh", "-c", script, NULL},
            true, -1);
    ck_assert_str_eq(r.status, "exit 0\n");
    bg = read_pid_file(pidfile);
    ck_assert(alive(bg));
    ck_assert_int_eq(kill(bg, SIGKILL), 0);
    wait_gone(bg);
}
END_TEST

/* The frames of a framed run, each type's payloads joined; order: the types in arrival order. */
struct frames {
    char o[4096], e[4096], t[8], s[1100], order[64];
};

static void parse_frames(const struct sup_run *r, struct frames *f)
{
    size_t off = 0, n = 0;

    memset(f, 0, sizeof(*f));
    while (off < r->out_len) {
        const unsigned char *h = (const unsigned char *)r->out + off;
        size_t len, have;
        char *dst;

        ck_assert_uint_ge(r->out_len - off, 5);
        len = (size_t)h[1] << 24 | (size_t)h[2] << 16 | (size_t)h[3] << 8 | h[4];
        ck_assert_uint_ge(r->out_len - off - 5, len);
        dst = h[0] == 'o' ? f->o : h[0] == 'e' ? f->e : h[0] == 'T' ? f->t : f->s;
        ck_assert_msg(strchr("oeTs", h[0]) != NULL, "unknown frame type %d", h[0]);
        have = strlen(dst);
        memcpy(dst + have, h + 5, len);
        dst[have + len] = '\0';
        if (n + 1 < sizeof(f->order))
            f->order[n++] = (char)h[0];
        off += 5 + len;
    }
}

START_TEST(test_framed)
{
    char in[PATH_MAX];
    struct frames f;
    struct sup_run r;

    /* stdout cut at 4 bytes ('T' says so), stderr whole, the status frame last */
    run_sup(&r,
            (const char *[]){"--framed", "--max-output", "4", "--timeout-ms", "60000", "--", "sh",
                             "-c", "printf 0123456789; echo err >&2; exit 2", NULL},
            false, -1);
    ck_assert_int_eq(r.rc, 0);
    parse_frames(&r, &f);
    ck_assert_str_eq(f.o, "0123");
    ck_assert_str_eq(f.e, "err\n");
    ck_assert_str_eq(f.t, "o");
    ck_assert_str_eq(f.s, "exit 2");
    ck_assert_int_eq(f.order[strlen(f.order) - 1], 's');

    /* stdin from a file, which is gone once open */
    snprintf(in, sizeof(in), "%s/stdin", dir);
    write_file(in, "from the file\n", 0600);
    run_sup(&r,
            (const char *[]){"--framed", "--max-output", "1000", "--timeout-ms", "60000",
                             "--stdin-file", in, "--", "cat", NULL},
            false, -1);
    parse_frames(&r, &f);
    ck_assert_str_eq(f.o, "from the file\n");
    ck_assert_str_eq(f.s, "exit 0");
    ck_assert_int_eq(access(in, F_OK), -1);

    /* a command that cannot run: 127 in the status frame, the reason as stderr bytes */
    run_sup(&r,
            (const char *[]){"--framed", "--max-output", "1000", "--timeout-ms", "60000", "--",
                             "/nonexistent/lbt-framed", NULL},
            false, -1);
    parse_frames(&r, &f);
    ck_assert_str_eq(f.s, "exit 127");
    ck_assert_str_eq(f.e, "lendbox-supervise: cannot run '/nonexistent/lbt-framed': No such "
                          "file or directory\n");

    /* the command kills its supervisor: every process the exec left (a setsid child, a double
     * fork's orphan, the command itself) is killed, not left to whoever adopts orphans (this
     * process, a subreaper), and the status says so */
    run_sup(&r,
            (const char *[]){
                "--framed", "--max-output", "1000", "--timeout-ms", "60000", "--", "sh", "-c",
                "setsid sleep 600 & sh -c 'sleep 601 &'; kill -9 $PPID; sleep 602", NULL},
            false, -1);
    parse_frames(&r, &f);
    ck_assert_msg(
        strncmp(f.s, "error the exec's supervisor was killed by signal 9 (SIGKILL, ",
                strlen("error the exec's supervisor was killed by signal 9 (SIGKILL, ")) == 0 &&
            strstr(f.s, "; the command's outcome is unknown; lendbox killed the ") &&
            strstr(f.s, " processes the exec left running"),
        "status: %s", f.s);
    ck_assert_int_eq(kill_children(), 0);
}
END_TEST

/* --harness-launch DIR/NAME with its receipt in DIR/NAME.receipt; argv after "--". */
static void harness_launch(struct sup_run *r, const char *name, const char *const *argv)
{
    char act[PATH_MAX], receipt[PATH_MAX + 16];
    const char *args[24] = {"--harness-launch",
                            act,
                            "--receipt-file",
                            receipt,
                            "--timeout-ms",
                            "60000",
                            "--cleanup-timeout-ms",
                            "2000",
                            "--"};
    size_t n = 9;

    snprintf(act, sizeof(act), "%s/%s", dir, name);
    snprintf(receipt, sizeof(receipt), "%s/%s.receipt", dir, name);
    for (size_t i = 0; argv[i]; i++)
        args[n++] = argv[i];
    args[n] = NULL;
    run_sup(r, args, false, -1);
}

START_TEST(test_harness)
{
    char path[PATH_MAX + 32], text[2048];
    struct sup_run r;

    /* a harness that runs: launched, its output in output.log, its code in the receipt */
    harness_launch(&r, "ok", (const char *[]){"sh", "-c", "echo hello; exit 5", NULL});
    ck_assert_int_eq(r.rc, 0);
    wait_gone(launched_pid(&r));
    snprintf(path, sizeof(path), "%s/ok.receipt", dir);
    read_file(path, text, sizeof(text));
    ck_assert_str_eq(text, "{\"cleanup_confirmed\": true, \"return_code\": 5, \"timed_out\": "
                           "false, \"error\": null, \"launched\": true, \"stop_requested\": "
                           "false}\n");
    snprintf(path, sizeof(path), "%s/ok/output.log", dir);
    read_file(path, text, sizeof(text));
    ck_assert_str_eq(text, "hello\n");
    /* the claim is taken: a second launch is refused */
    harness_launch(&r, "ok", (const char *[]){"true", NULL});
    ck_assert_int_eq(r.rc, 4);
    ck_assert_str_eq(r.out, "already launched\n");

    /* a harness that cannot run: 127 and the reason in the receipt */
    harness_launch(&r, "missing", (const char *[]){"/nonexistent/lbt-harness", NULL});
    ck_assert_int_eq(r.rc, 0);
    wait_gone(launched_pid(&r));
    snprintf(path, sizeof(path), "%s/missing.receipt", dir);
    read_file(path, text, sizeof(text));
    ck_assert_str_eq(text, "{\"cleanup_confirmed\": true, \"return_code\": 127, \"timed_out\": "
                           "false, \"error\": \"cannot run '/nonexistent/lbt-harness': No such "
                           "file or directory\", \"launched\": true, \"stop_requested\": false}\n");

    /* a stop before the launch fences it */
    snprintf(path, sizeof(path), "%s/fenced", dir);
    run_sup(&r, (const char *[]){"--harness-stop", path, NULL}, false, -1);
    ck_assert_int_eq(r.rc, 0);
    ck_assert_str_eq(r.out, "fenced\n");
    harness_launch(&r, "fenced", (const char *[]){"true", NULL});
    ck_assert_int_eq(r.rc, 3);
    ck_assert_str_eq(r.out, "fenced\n");
    snprintf(path, sizeof(path), "%s/fenced.receipt", dir);
    ck_assert_int_eq(access(path, F_OK), -1);
}
END_TEST

/* --pty-launch on session directory DIR/name; waits for the holder to end. */
static void pty_session(const char *name, const char *const *tail, const char *want_exit)
{
    const char *args[16] = {"--pty-launch", "--dir-fd", "5"};
    char path[PATH_MAX + 16], text[64];
    struct sup_run r;
    size_t n = 3;
    int dfd;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    ck_assert_int_ge(dfd, 0);
    for (size_t i = 0; tail[i]; i++)
        args[n++] = tail[i];
    args[n] = NULL;
    run_sup(&r, args, false, dfd);
    close(dfd);
    ck_assert_int_eq(r.rc, 0);
    wait_gone(launched_pid(&r));
    snprintf(path, sizeof(path), "%s/%s/exit", dir, name);
    read_file(path, text, sizeof(text));
    ck_assert_str_eq(text, want_exit);
}

START_TEST(test_pty)
{
    char path[PATH_MAX + 16], text[512];

    /* pipes: stdout and stderr in their own segment files */
    pty_session(
        "pipes",
        (const char *[]){"--no-pty", "--", "sh", "-c", "printf out; printf err >&2; exit 4", NULL},
        "4\n");
    snprintf(path, sizeof(path), "%s/pipes/out.0", dir);
    read_file(path, text, sizeof(text));
    ck_assert_str_eq(text, "out");
    snprintf(path, sizeof(path), "%s/pipes/err.0", dir);
    read_file(path, text, sizeof(text));
    ck_assert_str_eq(text, "err");

    /* a terminal: the command's stdin is a tty */
    pty_session("tty", (const char *[]){"--", "sh", "-c", "test -t 0 && printf tty; exit 6", NULL},
                "6\n");
    snprintf(path, sizeof(path), "%s/tty/out.0", dir);
    read_file(path, text, sizeof(text));
    ck_assert_str_eq(text, "tty");

    /* a command that cannot run: 127, the reason on its stderr */
    pty_session("missing", (const char *[]){"--no-pty", "--", "/nonexistent/lbt-pty", NULL},
                "127\n");
    snprintf(path, sizeof(path), "%s/missing/err.0", dir);
    read_file(path, text, sizeof(text));
    ck_assert_str_eq(text, "lendbox-supervise: cannot run '/nonexistent/lbt-pty': No such file "
                           "or directory\n");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("supervise");
    TCase *tc = tcase_create("supervise");
    SRunner *sr;
    int failed, left;

    /* a failed case's orphans (a hung supervisor, a holder) come here, to be ended below */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
        return 1;
    snprintf(base, sizeof(base), "/tmp/check-supervise-XXXXXX");
    if (!mkdtemp(base))
        return 1;
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_command_status_lines);
    tcase_add_test(tc, test_command_tree);
    tcase_add_test(tc, test_framed);
    tcase_add_test(tc, test_harness);
    tcase_add_test(tc, test_pty);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    left = kill_children();
    if (left)
        fprintf(stderr, "check_supervise: ended %d processes the failed cases left\n", left);
    remove_dir(base);
    return failed || left ? 1 : 0;
}
