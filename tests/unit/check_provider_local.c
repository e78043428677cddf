/*
 * check_provider_local.c - the local provider against real bubblewrap.
 *
 * Needs root, bwrap and the static supervisor ($LENDBOX_SUPERVISE, default
 * build/lendbox-supervise). Each test gets a fresh state dir under /tmp and a uid range of
 * its own (derived from its pid, so two test runs at once do not share uids).
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "provider/local/local.h"
#include "provider/local/local_internal.h"
#include "provider/provider.h"
#include "provider/local/seccomp.h"
#include "util/clock.h"

#define MIB (1024 * 1024)
#define UIDS_PER_TEST 16

static char base_dir[96];   /* per test run, made in the runner (parent) process */
static char state_dir[160]; /* per test: <base_dir>/t<pid> */
static char images_dir[192];
static struct lb_local_config cfg;
static struct lb_provider *prov;
static int next_id;

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) < 0 && errno != ENOENT ? -1 : 0;
}

static void rm_rf(const char *path)
{
    (void)nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

static const char *supervise_path(void)
{
    const char *s = getenv("LENDBOX_SUPERVISE");

    return s && *s ? s : "build/lendbox-supervise";
}

/* The config of the test running in process pid (its own uid range). */
static void config_for(struct lb_local_config *c, long pid, const char *dir, const char *images)
{
    memset(c, 0, sizeof(*c));
    c->state_dir = dir;
    c->bwrap_path = "bwrap";
    c->supervise_path = supervise_path();
    c->images_dir = images;
    c->cgroup_parent = "lendbox-test";
    c->uid_base = 1526u * 65536u + (uint32_t)(pid % 850) * UIDS_PER_TEST * 65536u;
    c->uid_count = UIDS_PER_TEST;
}

static struct lb_provider *new_provider(void)
{
    struct lb_error err = {0};
    struct lb_provider *p = NULL;
    int r = provider_local_new(&cfg, &p, &err);

    ck_assert_msg(r == 0, "provider_local_new: %d %s", r, err.message);
    return p;
}

/* Stop every sandbox under dir (a failed test skips its teardown in fork mode). */
static void stop_all(struct lb_provider *p)
{
    json_t *all = NULL, *item;
    size_t i;

    if (provider_list(p, &all, NULL) < 0)
        return;
    json_array_foreach(all, i, item) {
        struct lb_sandbox_ref ref = {.id = json_string_value(json_object_get(item, "sandbox_id"))};

        (void)provider_stop(p, &ref, 10000, NULL);
    }
    json_decref(all);
}

/* Runner process, once per TCase. */
static void run_setup(void)
{
    snprintf(base_dir, sizeof(base_dir), "/tmp/lendbox-ptest.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(base_dir));
    ck_assert_int_eq(chmod(base_dir, 0711), 0); /* bwrap must reach the workspaces */
}

static void run_teardown(void)
{
    struct dirent *de;
    DIR *d = opendir(base_dir);

    while (d && (de = readdir(d))) {
        struct lb_local_config c;
        struct lb_provider *p = NULL;
        char dir[sizeof(base_dir) + 300];

        if (de->d_name[0] != 't')
            continue;
        snprintf(dir, sizeof(dir), "%s/%s", base_dir, de->d_name);
        config_for(&c, strtol(de->d_name + 1, NULL, 10), dir, NULL);
        if (provider_local_new(&c, &p, NULL) == 0) {
            stop_all(p);
            provider_destroy(p);
        }
    }
    if (d)
        closedir(d);
    rm_rf(base_dir);
}

/* Each test (in its own process). */
static void setup(void)
{
    ck_assert_int_eq(setgroups(0, NULL), 0);
    snprintf(state_dir, sizeof(state_dir), "%s/t%ld", base_dir, (long)getpid());
    ck_assert_int_eq(mkdir(state_dir, 0711), 0);
    snprintf(images_dir, sizeof(images_dir), "%s/images", state_dir);
    ck_assert_int_eq(mkdir(images_dir, 0755), 0);
    config_for(&cfg, getpid(), state_dir, images_dir);
    prov = new_provider();
}

static void teardown(void)
{
    if (prov)
        stop_all(prov);
    provider_destroy(prov);
    prov = NULL;
    rm_rf(state_dir);
}

/* ---- helpers ---------------------------------------------------------------------------- */

struct sbx {
    char id[64];
    json_t *desc;
    struct lb_sandbox_ref ref;
    uint32_t uid;
    pid_t pid;
};

static void sbx_create_spec(struct sbx *s, const struct lb_sandbox_spec *spec)
{
    struct lb_error err = {0};
    int r;

    memset(s, 0, sizeof(*s));
    snprintf(s->id, sizeof(s->id), "sbx-t%d-%d", (int)getpid(), next_id++);
    s->ref.id = s->id;
    r = provider_create(prov, &s->ref, spec, &s->desc, &err);
    ck_assert_msg(r == 0, "create: %d %s", r, err.message);
    ck_assert_ptr_nonnull(s->desc);
    s->ref.descriptor = s->desc;
    s->uid = (uint32_t)json_integer_value(json_object_get(s->desc, "uid"));
    s->pid = (pid_t)json_integer_value(json_object_get(s->desc, "pid"));
    ck_assert_uint_ge(s->uid, cfg.uid_base);
    ck_assert_int_gt(s->pid, 0);
}

static void sbx_create(struct sbx *s)
{
    struct lb_sandbox_spec spec = {.image = "host", .workdir = "/workspace"};

    sbx_create_spec(s, &spec);
}

static void sbx_stop(struct sbx *s)
{
    struct lb_error err = {0};
    int r = provider_stop(prov, &s->ref, 10000, &err);

    ck_assert_msg(r == 0, "stop: %d %s", r, err.message);
}

static void sbx_free(struct sbx *s)
{
    json_decref(s->desc);
    s->desc = NULL;
}

struct run_opts {
    const char *cwd;
    int64_t timeout_ms;
    size_t max_output;
    const char *stdin_data;
    size_t stdin_len;
    bool keep_bg;
    const char *user;
    const char *const *env;
};

static int run_argv(struct sbx *s, const char *const *argv, const struct run_opts *o,
                    struct lb_exec_result *res, struct lb_error *err)
{
    struct lb_exec_request req = {
        .argv = argv,
        .cwd = o ? o->cwd : NULL,
        .env = o ? o->env : NULL,
        .user = o ? o->user : NULL,
        .stdin_data = o ? o->stdin_data : NULL,
        .stdin_len = o ? o->stdin_len : 0,
        .timeout_ms = o && o->timeout_ms ? o->timeout_ms : 20000,
        .max_output_bytes = o && o->max_output ? o->max_output : MIB,
        .preserve_background = o ? o->keep_bg : false,
    };

    return provider_exec(prov, &s->ref, &req, res, err);
}

/* sh -c cmd; asserts the exec itself worked. */
static void run(struct sbx *s, const char *cmd, const struct run_opts *o,
                struct lb_exec_result *res)
{
    const char *argv[] = {"sh", "-c", cmd, NULL};
    struct lb_error err = {0};
    int r = run_argv(s, argv, o, res, &err);

    ck_assert_msg(r == 0, "exec '%s': %d %s", cmd, r, err.message);
}

static const char *out_of(const struct lb_buf *b)
{
    return b->data ? b->data : "";
}

/* Live (non-zombie) processes with real uid uid, optionally only those named comm. */
static int count_uid_procs(uint32_t uid, const char *comm)
{
    struct dirent *de;
    int n = 0;
    DIR *d = opendir("/proc");

    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d))) {
        char path[300], buf[4096], name[64] = "";
        unsigned int u = 0;
        char state = 0;
        const char *p;
        ssize_t k;
        int fd;

        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/status", de->d_name);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        k = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (k <= 0)
            continue;
        buf[k] = '\0';
        sscanf(buf, "Name:\t%63s", name);
        p = strstr(buf, "\nState:\t");
        if (p)
            state = p[8];
        p = strstr(buf, "\nUid:\t");
        if (p)
            sscanf(p + 6, "%u", &u);
        if (u == uid && state != 'Z' && state != 'X' && (!comm || strcmp(name, comm) == 0))
            n++;
    }
    closedir(d);
    return n;
}

static bool path_exists(const char *p)
{
    struct stat st;

    return lstat(p, &st) == 0;
}

static char *read_fd_all(int fd, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    ssize_t k;

    ck_assert_ptr_nonnull(buf);
    while ((k = read(fd, buf + n, cap - n)) > 0) {
        n += (size_t)k;
        if (n == cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
    }
    ck_assert_int_ge(k, 0);
    *len = n;
    return buf;
}

/* file_open + read all; returns the errno-style result. */
static int read_file(struct sbx *s, const char *path, char **data, size_t *len)
{
    struct lb_error err = {0};
    uint64_t size = 0;
    int fd = -1, r;

    r = provider_file_open(prov, &s->ref, path, &fd, &size, &err);
    if (r < 0)
        return r;
    *data = read_fd_all(fd, len);
    ck_assert_uint_eq(size, *len);
    close(fd);
    return 0;
}

static int write_file(struct sbx *s, const char *path, const void *data, size_t len, int mode)
{
    struct lb_error err = {0};

    return provider_file_write(prov, &s->ref, path, data, len, mode, &err);
}

/* ---- tests ------------------------------------------------------------------------------- */

START_TEST(test_exec_basics)
{
    struct lb_exec_result res = {0};
    enum lb_sandbox_status st;
    struct sbx s;

    sbx_create(&s);
    ck_assert_int_eq(provider_status(prov, &s.ref, &st, NULL), 0);
    ck_assert_int_eq(st, LB_STATUS_RUNNING);

    run(&s, "echo hi", NULL, &res);
    ck_assert_int_eq(res.return_code, 0);
    ck_assert_int_eq(res.error_type, LB_EXEC_OK);
    ck_assert_str_eq(out_of(&res.out), "hi\n");
    ck_assert(!res.out.truncated);
    ck_assert_int_ge(res.duration_ms, 0);
    provider_exec_result_release(&res);

    run(&s, "echo oops >&2; exit 3", NULL, &res);
    ck_assert_int_eq(res.return_code, 3);
    ck_assert_int_eq(res.error_type, LB_EXEC_OK);
    ck_assert_str_eq(out_of(&res.err), "oops\n");
    provider_exec_result_release(&res);

    run(&s, "kill -TERM $$", NULL, &res);
    ck_assert_int_eq(res.return_code, 128 + 15);
    provider_exec_result_release(&res);

    /* default cwd is the workdir, and we are root inside */
    run(&s, "pwd; id -u; hostname", NULL, &res);
    {
        char want[160];

        snprintf(want, sizeof(want), "/workspace\n0\n%s\n", s.id);
        ck_assert_str_eq(out_of(&res.out), want);
    }
    provider_exec_result_release(&res);

    /* stdin, env, cwd */
    {
        const char *env[] = {"FOO=bar", "PATH=/usr/bin:/bin", NULL};
        struct run_opts o = {
            .stdin_data = "line1\nline2\n", .stdin_len = 12, .env = env, .cwd = "/tmp"};

        run(&s, "cat; echo \"$FOO\"; pwd", &o, &res);
        ck_assert_int_eq(res.return_code, 0);
        ck_assert_str_eq(out_of(&res.out), "line1\nline2\nbar\n/tmp\n");
        provider_exec_result_release(&res);
    }
    /* a command that does not read a large stdin must not hurt the daemon */
    {
        size_t n = 4 * MIB;
        char *big = calloc(1, n);
        struct run_opts o = {.stdin_data = big, .stdin_len = n};

        ck_assert_ptr_nonnull(big);
        run(&s, "exit 0", &o, &res);
        ck_assert_int_eq(res.return_code, 0);
        provider_exec_result_release(&res);
        run(&s, "wc -c", &o, &res);
        ck_assert_str_eq(out_of(&res.out), "4194304\n");
        provider_exec_result_release(&res);
        free(big);
    }
    /* not found is the command's own result, like a shell */
    {
        const char *argv[] = {"no-such-command-xyz", NULL};
        struct lb_error err = {0};

        ck_assert_int_eq(run_argv(&s, argv, NULL, &res, &err), 0);
        ck_assert_int_eq(res.return_code, 127);
        ck_assert_int_eq(res.error_type, LB_EXEC_OK);
        provider_exec_result_release(&res);
    }
    /* users */
    {
        struct run_opts o = {.user = "root"};
        struct lb_error err = {0};
        const char *argv[] = {"true", NULL};

        run(&s, "true", &o, &res);
        provider_exec_result_release(&res);
        o.user = "nobody"; /* any user of the sandbox's passwd */
        run(&s, "id -u", &o, &res);
        ck_assert_str_eq(out_of(&res.out), "65534\n");
        provider_exec_result_release(&res);
        o.user = "nosuchuser";
        ck_assert_int_eq(run_argv(&s, argv, &o, &res, &err), -EINVAL);
        ck_assert_ptr_nonnull(strstr(err.message, "unknown user \"nosuchuser\""));
    }
    sbx_stop(&s);
    sbx_free(&s);
}
END_TEST

START_TEST(test_exec_bad_cwd)
{
    struct lb_exec_result res = {0};
    struct run_opts o = {.cwd = "/nope"};
    struct sbx s;

    sbx_create(&s);
    run(&s, "echo never", &o, &res);
    ck_assert_int_eq(res.return_code, LB_RETURN_CODE_RUNTIME);
    ck_assert_int_eq(res.error_type, LB_EXEC_SANDBOX);
    ck_assert_str_eq(out_of(&res.out), "");
    ck_assert_msg(strstr(out_of(&res.err), "cwd '/nope' does not exist"), "stderr: %s",
                  out_of(&res.err));
    provider_exec_result_release(&res);
    sbx_stop(&s);
    sbx_free(&s);
}
END_TEST

START_TEST(test_exec_timeout_kills_tree)
{
    struct lb_exec_result res = {0};
    struct run_opts o = {.timeout_ms = 1000};
    int64_t t0;
    struct sbx s;

    sbx_create(&s);
    t0 = clock_mono_ms();
    run(&s, "echo started; setsid sleep 1000 & sleep 1000", &o, &res);
    ck_assert_int_lt(clock_mono_ms() - t0, 3000);
    ck_assert_int_eq(res.return_code, LB_RETURN_CODE_RUNTIME);
    ck_assert_int_eq(res.error_type, LB_EXEC_TIMEOUT);
    ck_assert_str_eq(out_of(&res.out), "started\n");
    ck_assert_int_eq(count_uid_procs(s.uid, "sleep"), 0);
    provider_exec_result_release(&res);

    /* also a normal exit takes its background with it ... */
    o.timeout_ms = 10000;
    run(&s, "setsid sleep 1000 & sleep 1000 & echo ok", &o, &res);
    ck_assert_int_eq(res.return_code, 0);
    ck_assert_str_eq(out_of(&res.out), "ok\n");
    ck_assert_int_eq(count_uid_procs(s.uid, "sleep"), 0);
    provider_exec_result_release(&res);

    /* ... unless asked to keep it */
    o.keep_bg = true;
    run(&s, "setsid sleep 1000 >/dev/null 2>&1 & echo ok", &o, &res);
    ck_assert_int_eq(res.return_code, 0);
    /* it may still be between fork and exec of sleep */
    for (int i = 0; i < 200 && count_uid_procs(s.uid, "sleep") == 0; i++)
        usleep(10000);
    ck_assert_int_eq(count_uid_procs(s.uid, "sleep"), 1);
    provider_exec_result_release(&res);

    sbx_stop(&s);
    ck_assert_int_eq(count_uid_procs(s.uid, NULL), 0);
    sbx_free(&s);
}
END_TEST

START_TEST(test_exec_output_cap)
{
    struct lb_exec_result res = {0};
    struct run_opts o = {.max_output = MIB};
    struct sbx s;
    size_t i;

    sbx_create(&s);
    run(&s, "head -c 5242880 /dev/zero | tr '\\0' x; echo done >&2", &o, &res);
    ck_assert_int_eq(res.return_code, 0);
    ck_assert_uint_eq(res.out.len, MIB);
    ck_assert(res.out.truncated);
    for (i = 0; i < res.out.len; i++)
        ck_assert_int_eq(res.out.data[i], 'x');
    ck_assert_str_eq(out_of(&res.err), "done\n");
    ck_assert(!res.err.truncated);
    provider_exec_result_release(&res);
    sbx_stop(&s);
    sbx_free(&s);
}
END_TEST

START_TEST(test_files_round_trip)
{
    struct lb_exec_result res = {0};
    unsigned char bin[1024];
    char *data = NULL;
    size_t len = 0, i;
    struct sbx s;

    for (i = 0; i < sizeof(bin); i++)
        bin[i] = (unsigned char)(i * 7);
    sbx_create(&s);

    ck_assert_int_eq(write_file(&s, "/workspace/a/b/c/data.bin", bin, sizeof(bin), -1), 0);
    ck_assert_int_eq(read_file(&s, "/workspace/a/b/c/data.bin", &data, &len), 0);
    ck_assert_uint_eq(len, sizeof(bin));
    ck_assert_int_eq(memcmp(data, bin, len), 0);
    free(data);

    ck_assert_int_eq(write_file(&s, "/workspace/empty", "", 0, -1), 0);
    ck_assert_int_eq(read_file(&s, "/workspace/empty", &data, &len), 0);
    ck_assert_uint_eq(len, 0);
    free(data);

    /* replace, mode, ownership and visibility from inside; parents outside the workspace */
    ck_assert_int_eq(write_file(&s, "/workspace/a/b/c/data.bin", "new", 3, 0755), 0);
    ck_assert_int_eq(write_file(&s, "/tmp/x/y.txt", "tmp\n", 4, -1), 0);
    run(&s,
        "cat /workspace/a/b/c/data.bin; stat -c ' %a %u' /workspace/a/b/c/data.bin "
        "/workspace/empty /workspace/a; cat /tmp/x/y.txt; ls -a /workspace/a/b/c",
        NULL, &res);
    ck_assert_str_eq(out_of(&res.out), "new 755 0\n 644 0\n 755 0\ntmp\n.\n..\ndata.bin\n");
    provider_exec_result_release(&res);

    /* and what a command wrote is readable */
    run(&s, "printf 'from inside' > /workspace/out.txt", NULL, &res);
    provider_exec_result_release(&res);
    ck_assert_int_eq(read_file(&s, "/workspace/out.txt", &data, &len), 0);
    ck_assert_uint_eq(len, 11);
    ck_assert_int_eq(memcmp(data, "from inside", 11), 0);
    free(data);

    sbx_stop(&s);
    sbx_free(&s);
}
END_TEST

START_TEST(test_files_errors)
{
    struct lb_error err = {0};
    struct lb_exec_result res = {0};
    char *data = NULL;
    size_t len;
    int r;
    struct sbx s;

    sbx_create(&s);
    run(&s, "mkdir -p /workspace/dir/sub && mkfifo /workspace/fifo", NULL, &res);
    ck_assert_int_eq(res.return_code, 0);
    provider_exec_result_release(&res);

    ck_assert_int_eq(write_file(&s, "/workspace/dir", "x", 1, -1), -EISDIR);
    ck_assert_int_eq(read_file(&s, "/workspace/dir", &data, &len), -EISDIR);
    ck_assert_int_eq(read_file(&s, "/workspace/missing", &data, &len), -ENOENT);
    ck_assert_int_eq(read_file(&s, "/workspace/fifo", &data, &len), -EINVAL);
    ck_assert_int_eq(read_file(&s, "/etc/shadow", &data, &len), -EACCES);
    r = write_file(&s, "/usr/lendbox-test-file", "x", 1, -1);
    ck_assert_msg(r == -EROFS || r == -EACCES, "write /usr: %d", r);
    ck_assert(!path_exists("/usr/lendbox-test-file"));
    r = write_file(&s, "/etc/passwd", "x", 1, -1);
    ck_assert_msg(r == -EROFS || r == -EACCES, "write /etc/passwd: %d", r);
    ck_assert_int_eq(write_file(&s, "/workspace/fifo/x", "x", 1, -1), -ENOTDIR);
    ck_assert_int_eq(provider_file_write(prov, &s.ref, "relative", "x", 1, -1, &err), -EINVAL);
    ck_assert_int_eq(provider_file_write(prov, &s.ref, "/workspace/../etc", "x", 1, -1, &err),
                     -EINVAL);
    /* /proc magic links are not followed (refused either way) */
    r = read_file(&s, "/proc/1/root/etc/hostname", &data, &len);
    ck_assert_msg(r == -ELOOP || r == -EACCES, "magic link: %d", r);
    sbx_stop(&s);
    sbx_free(&s);
}
END_TEST

START_TEST(test_files_symlink_escape)
{
    char host_file[sizeof(base_dir) + 32], cmd[512];
    struct lb_exec_result res = {0};
    char *data = NULL, buf[64];
    size_t len;
    struct sbx s;
    int fd;

    snprintf(host_file, sizeof(host_file), "%s/host-secret.XXXXXX", base_dir);
    fd = mkstemp(host_file);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "host-secret", 11), 11);
    close(fd);
    chmod(host_file, 0644);

    sbx_create(&s);
    snprintf(cmd, sizeof(cmd),
             "ln -s %s /workspace/abs && ln -s ../../../../../../..%s /workspace/rel && "
             "ln -s / /workspace/root",
             host_file, host_file);
    run(&s, cmd, NULL, &res);
    ck_assert_int_eq(res.return_code, 0);
    provider_exec_result_release(&res);

    ck_assert_int_eq(read_file(&s, "/workspace/abs", &data, &len), -ENOENT);
    ck_assert_int_eq(read_file(&s, "/workspace/rel", &data, &len), -ENOENT);
    snprintf(cmd, sizeof(cmd), "/workspace/root%s", host_file);
    ck_assert_int_eq(read_file(&s, cmd, &data, &len), -ENOENT);
    /* a write lands inside the sandbox; the host file is untouched */
    snprintf(cmd, sizeof(cmd), "/workspace/root%s", host_file);
    ck_assert_int_eq(write_file(&s, cmd, "sandbox", 7, -1), 0);
    ck_assert_int_eq(write_file(&s, "/workspace/abs", "sandbox", 7, -1), 0);
    ck_assert_int_eq(read_file(&s, host_file, &data, &len), 0);
    ck_assert_uint_eq(len, 7);
    ck_assert_int_eq(memcmp(data, "sandbox", 7), 0);
    free(data);

    fd = open(host_file, O_RDONLY | O_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(read(fd, buf, sizeof(buf)), 11);
    ck_assert_int_eq(memcmp(buf, "host-secret", 11), 0);
    close(fd);
    unlink(host_file);
    sbx_stop(&s);
    sbx_free(&s);
}
END_TEST

START_TEST(test_isolation)
{
    struct lb_exec_result res = {0};
    char path[64], buf[4096], cmd[512];
    unsigned int uid = 0;
    const char *p;
    ssize_t n;
    int fd, pids = 0;
    struct sbx s;

    sbx_create(&s);
    /* only the sandbox's own processes: init, the supervisor, the shell, ls */
    run(&s, "ls /proc | grep '^[0-9]*$'", NULL, &res);
    for (p = out_of(&res.out); *p; p++)
        pids += *p == '\n';
    ck_assert_msg(pids >= 2 && pids <= 5, "pids: %s", out_of(&res.out));
    ck_assert_ptr_nonnull(strstr(out_of(&res.out), "1\n"));
    provider_exec_result_release(&res);

    run(&s, "touch /usr/lendbox-x", NULL, &res);
    ck_assert_int_ne(res.return_code, 0);
    provider_exec_result_release(&res);
    run(&s, "cat /etc/shadow", NULL, &res);
    ck_assert_int_ne(res.return_code, 0);
    provider_exec_result_release(&res);
    /* no network but loopback */
    run(&s, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", NULL, &res);
    ck_assert_str_eq(out_of(&res.out), "lo\n");
    provider_exec_result_release(&res);
    /* the daemon's state dir (under the host's /tmp) is not visible */
    snprintf(cmd, sizeof(cmd), "ls %s", state_dir);
    run(&s, cmd, NULL, &res);
    ck_assert_int_ne(res.return_code, 0);
    provider_exec_result_release(&res);

    /* on the host, the init runs as the sandbox's uid */
    snprintf(path, sizeof(path), "/proc/%d/status", (int)s.pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    ck_assert_int_gt(n, 0);
    buf[n] = '\0';
    p = strstr(buf, "\nUid:\t");
    ck_assert_ptr_nonnull(p);
    sscanf(p + 6, "%u", &uid);
    ck_assert_uint_eq(uid, s.uid);
    ck_assert_uint_ne(uid, 0);
    sbx_stop(&s);
    sbx_free(&s);
}
END_TEST

START_TEST(test_stop)
{
    struct lb_exec_result res = {0};
    enum lb_sandbox_status st;
    struct lb_error err = {0};
    json_t *dirs;
    char dir[300];
    const char *argv[] = {"true", NULL};
    struct sbx s;
    size_t i;
    json_t *v;
    int fd;
    uint64_t size;

    sbx_create(&s);
    run(&s, "sleep 1000 >/dev/null 2>&1 &", &(struct run_opts){.keep_bg = true}, &res);
    provider_exec_result_release(&res);
    ck_assert_int_gt(count_uid_procs(s.uid, NULL), 0);
    snprintf(dir, sizeof(dir), "%s/sandboxes/%s", state_dir, s.id);
    ck_assert(path_exists(dir));
    dirs = json_object_get(json_object_get(s.desc, "cgroup"), "dirs");

    sbx_stop(&s);
    ck_assert_int_eq(count_uid_procs(s.uid, NULL), 0);
    ck_assert(!path_exists(dir));
    json_array_foreach(dirs, i, v) {
        ck_assert_msg(!path_exists(json_string_value(v)), "cgroup %s left", json_string_value(v));
    }
    /* idempotent, and gone means gone */
    ck_assert_int_eq(provider_stop(prov, &s.ref, 10000, &err), 0);
    ck_assert_int_eq(run_argv(&s, argv, NULL, &res, &err), -ENOENT);
    ck_assert_int_eq(provider_file_open(prov, &s.ref, "/etc/hostname", &fd, &size, &err), -ENOENT);
    ck_assert_int_eq(provider_file_write(prov, &s.ref, "/workspace/x", "x", 1, -1, &err), -ENOENT);
    ck_assert_int_eq(provider_status(prov, &s.ref, &st, &err), 0);
    ck_assert_int_eq(st, LB_STATUS_STOPPED);
    /* unknown ids are gone too */
    {
        struct lb_sandbox_ref none = {.id = "sbx-never-existed"};

        ck_assert_int_eq(provider_stop(prov, &none, 1000, &err), 0);
        ck_assert_int_eq(provider_status(prov, &none, &st, &err), 0);
        ck_assert_int_eq(st, LB_STATUS_STOPPED);
    }
    sbx_free(&s);
}
END_TEST

START_TEST(test_restart_adopts)
{
    struct lb_exec_result res = {0};
    struct lb_provider *second;
    json_t *all = NULL, *item;
    struct lb_sandbox_ref byid;
    struct lb_error err = {0};
    enum lb_sandbox_status st;
    struct sbx s, t;
    size_t i;
    bool found = false;

    sbx_create(&s);
    /* the daemon "restarts": a fresh provider over the same state */
    provider_destroy(prov);
    prov = second = new_provider();
    ck_assert_int_eq(provider_list(prov, &all, &err), 0);
    json_array_foreach(all, i, item) {
        if (strcmp(json_string_value(json_object_get(item, "sandbox_id")), s.id) == 0) {
            found = true;
            ck_assert(json_equal(json_object_get(item, "descriptor"), s.desc));
        }
    }
    json_decref(all);
    ck_assert(found);

    run(&s, "echo adopted", NULL, &res);
    ck_assert_str_eq(out_of(&res.out), "adopted\n");
    provider_exec_result_release(&res);
    ck_assert_int_eq(provider_status(prov, &s.ref, &st, &err), 0);
    ck_assert_int_eq(st, LB_STATUS_RUNNING);

    /* a new sandbox never gets the uid of one the new instance did not create */
    sbx_create(&t);
    ck_assert_uint_ne(t.uid, s.uid);
    sbx_stop(&t);
    sbx_free(&t);

    /* stop from the id alone (a crash before the record got the descriptor) */
    byid = (struct lb_sandbox_ref){.id = s.id};
    ck_assert_int_eq(provider_stop(prov, &byid, 10000, &err), 0);
    ck_assert_int_eq(count_uid_procs(s.uid, NULL), 0);
    ck_assert_int_eq(provider_status(prov, &s.ref, &st, &err), 0);
    ck_assert_int_eq(st, LB_STATUS_STOPPED);
    sbx_free(&s);
}
END_TEST

START_TEST(test_pause_resume)
{
    struct lb_exec_result res = {0};
    struct lb_error err = {0};
    enum lb_sandbox_status st;
    const char *argv[] = {"true", NULL};
    struct sbx s;

    sbx_create(&s);
    if (json_is_null(json_object_get(s.desc, "cgroup"))) {
        ck_assert_int_eq(prov->ops->pause(prov, &s.ref, &err), -ENOSYS);
        sbx_stop(&s);
        sbx_free(&s);
        return;
    }
    ck_assert_int_eq(prov->ops->pause(prov, &s.ref, &err), 0);
    ck_assert_int_eq(provider_status(prov, &s.ref, &st, &err), 0);
    ck_assert_int_eq(st, LB_STATUS_PAUSED);
    ck_assert_int_eq(run_argv(&s, argv, NULL, &res, &err), -EBUSY);
    ck_assert_int_eq(prov->ops->resume(prov, &s.ref, &err), 0);
    ck_assert_int_eq(provider_status(prov, &s.ref, &st, &err), 0);
    ck_assert_int_eq(st, LB_STATUS_RUNNING);
    run(&s, "echo thawed", NULL, &res);
    ck_assert_str_eq(out_of(&res.out), "thawed\n");
    provider_exec_result_release(&res);
    /* a paused sandbox still stops */
    ck_assert_int_eq(prov->ops->pause(prov, &s.ref, &err), 0);
    sbx_stop(&s);
    ck_assert_int_eq(count_uid_procs(s.uid, NULL), 0);
    sbx_free(&s);
}
END_TEST

START_TEST(test_limits)
{
    struct lb_sandbox_spec spec = {
        .image = "host", .workdir = "/workspace", .resources = {.pids = 40, .memory_mib = 64}};
    struct lb_exec_result res = {0};
    json_t *dirs, *v;
    bool saw_pids = false, saw_mem = false;
    size_t i;
    struct sbx s;

    sbx_create_spec(&s, &spec);
    dirs = json_object_get(json_object_get(s.desc, "cgroup"), "dirs");
    ck_assert_uint_gt(json_array_size(dirs), 0);
    json_array_foreach(dirs, i, v) {
        char path[512], buf[64] = "";
        int fd;

        snprintf(path, sizeof(path), "%s/pids.max", json_string_value(v));
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ck_assert_int_gt(read(fd, buf, sizeof(buf) - 1), 0);
        close(fd);
        ck_assert_str_eq(buf, "40\n");
        saw_pids = true;
    }
    ck_assert(saw_pids);
    json_array_foreach(dirs, i, v) {
        char path[512], buf[64] = "";
        int fd;

        snprintf(path, sizeof(path), "%s/memory.limit_in_bytes", json_string_value(v));
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            snprintf(path, sizeof(path), "%s/memory.max", json_string_value(v));
        if (fd < 0)
            fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ck_assert_int_gt(read(fd, buf, sizeof(buf) - 1), 0);
        close(fd);
        ck_assert_str_eq(buf, "67108864\n");
        saw_mem = true;
    }
    ck_assert(saw_mem);
    /* the limit holds for exec'd commands */
    run(&s, "for i in $(seq 60); do sleep 5 & done 2>/dev/null; echo n=$(jobs -p | wc -l)",
        &(struct run_opts){.timeout_ms = 20000}, &res);
    ck_assert_msg(strcmp(out_of(&res.out), "n=60\n") != 0, "out: %s", out_of(&res.out));
    provider_exec_result_release(&res);
    sbx_stop(&s);
    sbx_free(&s);
}
END_TEST

START_TEST(test_image_dir)
{
    struct lb_sandbox_spec spec = {.image = "mini", .workdir = "/workspace"};
    struct lb_sandbox_spec bad = {.image = "nope", .workdir = "/workspace"};
    struct lb_exec_result res = {0};
    struct lb_sandbox_ref ref = {.id = "sbx-bad-image"};
    struct lb_error err = {0};
    json_t *desc = NULL;
    char path[300], *data = NULL;
    const char *argv[] = {"/bin/sh", "-c", "true", NULL};
    size_t len;
    int fd;
    struct sbx s;

    snprintf(path, sizeof(path), "%s/mini", images_dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/mini/etc", images_dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/mini/etc/marker", images_dir);
    fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "mini\n", 5), 5);
    close(fd);

    ck_assert_int_eq(provider_create(prov, &ref, &bad, &desc, &err), -LB_E_IMAGE_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(err.message, "unknown image"));

    sbx_create_spec(&s, &spec);
    ck_assert_int_eq(read_file(&s, "/etc/marker", &data, &len), 0);
    ck_assert_uint_eq(len, 5);
    free(data);
    ck_assert_int_eq(read_file(&s, "/etc/hostname", &data, &len), -ENOENT);
    ck_assert_int_eq(write_file(&s, "/workspace/f", "x", 1, -1), 0);
    ck_assert_int_eq(run_argv(&s, argv, NULL, &res, &err), 0);
    ck_assert_int_eq(res.return_code, 127); /* no shell in this image */
    provider_exec_result_release(&res);
    sbx_stop(&s);
    sbx_free(&s);
}
END_TEST

START_TEST(test_failed_create_cleans_up)
{
    struct lb_sandbox_spec spec = {.image = "host", .workdir = "/workspace"};
    struct lb_sandbox_ref ref = {.id = "sbx-fails"};
    struct lb_error err = {0};
    struct lb_provider *bad;
    json_t *desc = NULL, *all = NULL;
    char dir[300];

    provider_destroy(prov);
    cfg.bwrap_path = "/bin/false";
    prov = bad = new_provider();
    ck_assert_int_eq(provider_create(prov, &ref, &spec, &desc, &err), -EREMOTEIO);
    ck_assert_ptr_null(desc);
    snprintf(dir, sizeof(dir), "%s/sandboxes/sbx-fails", state_dir);
    ck_assert(!path_exists(dir));
    ck_assert_int_eq(provider_list(prov, &all, &err), 0);
    ck_assert_uint_eq(json_array_size(all), 0);
    json_decref(all);
    /* invalid requests never touch anything */
    spec.workdir = "relative";
    ck_assert_int_eq(provider_create(prov, &ref, &spec, &desc, &err), -EINVAL);
    ref.id = "../escape";
    spec.workdir = "/workspace";
    ck_assert_int_eq(provider_create(prov, &ref, &spec, &desc, &err), -EINVAL);
}
END_TEST

/* A stale descriptor (stop retried after success) must not hurt a newer sandbox that got the
 * same uid; and stops of one sandbox from several threads at once all succeed. */
struct stopper {
    struct lb_sandbox_ref ref;
    int r;
};

static void *stop_thread(void *arg)
{
    struct stopper *st = arg;

    st->r = provider_stop(prov, &st->ref, 10000, NULL);
    return NULL;
}

START_TEST(test_stale_stop_and_uid_reuse)
{
    struct lb_exec_result res = {0};
    struct stopper st[4];
    pthread_t th[4];
    struct sbx a, b;
    int i;

    provider_destroy(prov);
    cfg.uid_count = 1;
    prov = new_provider();
    sbx_create(&a);
    for (i = 0; i < 4; i++) {
        st[i] = (struct stopper){.ref = a.ref, .r = -1};
        if (i % 2)
            st[i].ref.descriptor = NULL;
        ck_assert_int_eq(pthread_create(&th[i], NULL, stop_thread, &st[i]), 0);
    }
    for (i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(st[i].r, 0);
    }
    sbx_create(&b);
    ck_assert_uint_eq(a.uid, b.uid);
    /* the stale stop of a, with and without its descriptor */
    sbx_stop(&a);
    a.ref.descriptor = NULL;
    sbx_stop(&a);
    run(&b, "echo still here", NULL, &res);
    ck_assert_str_eq(out_of(&res.out), "still here\n");
    provider_exec_result_release(&res);
    sbx_stop(&b);
    sbx_free(&a);
    sbx_free(&b);
}
END_TEST

/* A stop after a clean init death waits for the processes of the sandbox's ids that the daemon
 * knows to run outside its pid namespace (bwrap's monitor, exec helpers) instead of sweeping
 * /proc for them: here a sandbox made by a daemon that has since exited (its monitor is no
 * child of ours), with an exec in flight (its helper exits only after the init's death). */
struct sleeper {
    struct sbx *s;
    int r;
};

static void *sleeper_main(void *arg)
{
    struct sleeper *sl = arg;
    const char *argv[] = {"sleep", "30", NULL};
    struct lb_exec_result res = {0};

    sl->r = run_argv(sl->s, argv, NULL, &res, NULL);
    provider_exec_result_release(&res);
    return NULL;
}

START_TEST(test_stop_waits_for_known_pids)
{
    char buf[16384], path[64], stat[1024];
    struct sleeper sl = {0};
    struct lb_error err = {0};
    unsigned long sweeps;
    size_t len = 0;
    int fds[2], st = 0, ppid = 0;
    struct sbx s;
    pthread_t th;
    pid_t c;

    ck_assert_int_eq(pipe(fds), 0);
    c = fork();
    ck_assert_int_ge(c, 0);
    if (c == 0) {
        char *text;

        close(fds[0]);
        sbx_create(&s);
        text = json_dumps(s.desc, JSON_COMPACT);
        if (!text || write(fds[1], text, strlen(text)) != (ssize_t)strlen(text))
            _exit(1);
        _exit(0);
    }
    close(fds[1]);
    for (ssize_t n; (n = read(fds[0], buf + len, sizeof(buf) - 1 - len)) > 0;)
        len += (size_t)n;
    close(fds[0]);
    ck_assert_int_eq(waitpid(c, &st, 0), c);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    buf[len] = '\0';
    memset(&s, 0, sizeof(s));
    s.desc = json_loads(buf, 0, NULL);
    ck_assert_ptr_nonnull(s.desc);
    snprintf(s.id, sizeof(s.id), "%s",
             strrchr(json_string_value(json_object_get(s.desc, "dir")), '/') + 1);
    s.ref = (struct lb_sandbox_ref){.id = s.id, .descriptor = s.desc};
    s.uid = (uint32_t)json_integer_value(json_object_get(s.desc, "uid"));
    s.pid = (pid_t)json_integer_value(json_object_get(s.desc, "pid"));
    /* the init's parent is bwrap's monitor, and no child of this process */
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)s.pid);
    ck_assert_int_gt(local_read_small(path, stat, sizeof(stat)), 0);
    ck_assert_int_eq(sscanf(strrchr(stat, ')') + 1, " %*c %d", &ppid), 1);
    ck_assert_int_gt(ppid, 1);
    ck_assert_int_ne(ppid, getpid());

    sl.s = &s;
    sl.r = 1;
    ck_assert_int_eq(pthread_create(&th, NULL, sleeper_main, &sl), 0);
    for (int i = 0; i < 400 && count_uid_procs(s.uid, "sleep") == 0; i++)
        usleep(25 * 1000);
    ck_assert_int_eq(count_uid_procs(s.uid, "sleep"), 1);

    sweeps = local_slot_sweeps();
    ck_assert_msg(provider_stop(prov, &s.ref, 10000, &err) == 0, "stop: %s", err.message);
    ck_assert_uint_eq(local_slot_sweeps(), sweeps);
    pthread_join(th, NULL);
    ck_assert_int_lt(sl.r, 0); /* the exec ended with its sandbox */
    ck_assert_int_eq(count_uid_procs(s.uid, NULL), 0);
    ck_assert(!path_exists(json_string_value(json_object_get(s.desc, "dir"))));
    sbx_free(&s);
}
END_TEST

/* Zombies among this process's children that ran as one of the ids of the slot at uid. */
static int count_slot_zombie_children(uint32_t uid)
{
    struct dirent *de;
    int n = 0;
    DIR *d = opendir("/proc");

    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d))) {
        char path[300], buf[4096];
        unsigned int u = 0;
        int ppid = 0;
        char state = 0;
        const char *p;
        ssize_t k;
        int fd;

        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/status", de->d_name);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        k = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (k <= 0)
            continue;
        buf[k] = '\0';
        p = strstr(buf, "\nState:\t");
        if (p)
            state = p[8];
        p = strstr(buf, "\nPPid:\t");
        if (p)
            sscanf(p + 7, "%d", &ppid);
        p = strstr(buf, "\nUid:\t");
        if (p)
            sscanf(p + 6, "%u", &u);
        if (state == 'Z' && ppid == (int)getpid() && u >= uid && u - uid < LOCAL_SLOT_IDS)
            n++;
    }
    closedir(d);
    return n;
}

/* A stop of a sandbox this process started, as a child subreaper like lendboxd: bwrap's
 * monitor (our child) and the init die together, and both are reaped: nothing of the slot's
 * ids is left, not even a zombie child of ours (an init whose monitor died before reaping it
 * comes to us), and no /proc sweep was needed. */
START_TEST(test_stop_reaps_monitor_and_init)
{
    unsigned long sweeps;
    struct sbx s;

    ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
    for (int i = 0; i < 3; i++) {
        sbx_create(&s);
        sweeps = local_slot_sweeps();
        sbx_stop(&s);
        ck_assert_uint_eq(local_slot_sweeps(), sweeps);
        ck_assert_int_eq(count_uid_procs(s.uid, NULL), 0);
        ck_assert_int_eq(count_slot_zombie_children(s.uid), 0);
        sbx_free(&s);
    }
}
END_TEST

/* A state dir the host image's binds would expose (under /var) is covered by a tmpfs. */
START_TEST(test_state_dir_hidden)
{
    struct lb_exec_result res = {0};
    struct lb_provider *main_prov = prov;
    char dir[96], cmd[200];
    struct sbx s;

    snprintf(dir, sizeof(dir), "/var/tmp/lendbox-ptest.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(chmod(dir, 0711), 0);
    cfg.state_dir = dir;
    prov = new_provider();
    sbx_create(&s);
    snprintf(cmd, sizeof(cmd), "ls -A %s; ls -d /var/tmp", dir);
    run(&s, cmd, NULL, &res);
    ck_assert_int_eq(res.return_code, 0);
    ck_assert_str_eq(out_of(&res.out), "/var/tmp\n");
    provider_exec_result_release(&res);
    sbx_stop(&s);
    sbx_free(&s);
    provider_destroy(prov);
    prov = main_prov;
    rm_rf(dir);
}
END_TEST

struct par {
    struct sbx *s;
    int ok;
};

static void *par_exec(void *arg)
{
    struct par *pa = arg;
    int i;

    for (i = 0; i < 5; i++) {
        struct lb_exec_result res = {0};
        const char *argv[] = {"sh", "-c", "echo $((6 * 7))", NULL};
        struct lb_error err = {0};

        if (run_argv(pa->s, argv, NULL, &res, &err) == 0 && res.return_code == 0 && res.out.data &&
            strcmp(res.out.data, "42\n") == 0)
            pa->ok++;
        provider_exec_result_release(&res);
    }
    return NULL;
}

START_TEST(test_parallel)
{
    struct sbx s[3];
    struct par pa[6];
    pthread_t th[6];
    json_t *all = NULL;
    int i;

    for (i = 0; i < 3; i++)
        sbx_create(&s[i]);
    ck_assert_uint_ne(s[0].uid, s[1].uid);
    ck_assert_uint_ne(s[1].uid, s[2].uid);
    ck_assert_int_eq(provider_list(prov, &all, NULL), 0);
    ck_assert_uint_eq(json_array_size(all), 3);
    json_decref(all);
    for (i = 0; i < 6; i++) {
        pa[i] = (struct par){.s = &s[i % 3]};
        ck_assert_int_eq(pthread_create(&th[i], NULL, par_exec, &pa[i]), 0);
    }
    for (i = 0; i < 6; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(pa[i].ok, 5);
    }
    for (i = 0; i < 3; i++) {
        sbx_stop(&s[i]);
        sbx_free(&s[i]);
    }
}
END_TEST

/* Slots taken, marked and given back by many threads at once (the slot bitmap is cleared
 * without a lock): no slot is ever held twice, a held slot's host-wide claim exists, and
 * afterwards every slot can be taken again, each once, and none is left claimed. */
#define SLOT_THREADS 4
#define SLOT_ROUNDS 200

struct slot_churn {
    struct local_provider *lp;
    atomic_int *held; /* one per slot: 1 while a thread holds it */
    int bad;
};

static bool slot_claimed(uint32_t first)
{
    char path[128];

    snprintf(path, sizeof(path), "%s/%" PRIu32, LOCAL_SLOT_CLAIM_DIR, first);
    return access(path, F_OK) == 0;
}

static void *slot_churn_main(void *arg)
{
    struct slot_churn *c = arg;

    for (int i = 0; i < SLOT_ROUNDS; i++) {
        uint32_t uid = 0, slot;

        if (local_uid_alloc(c->lp, &uid) < 0) {
            c->bad++;
            continue;
        }
        slot = (uid - c->lp->uid_base) / LOCAL_SLOT_IDS;
        if (atomic_exchange(&c->held[slot], 1) != 0 || !slot_claimed(uid))
            c->bad++;
        local_uid_mark(c->lp, uid);
        atomic_store(&c->held[slot], 0);
        local_uid_free(c->lp, uid);
    }
    return NULL;
}

START_TEST(test_slots_concurrent)
{
    struct local_provider *lp = (struct local_provider *)prov;
    atomic_int held[UIDS_PER_TEST] = {0};
    struct slot_churn c[SLOT_THREADS];
    pthread_t th[SLOT_THREADS];
    uint32_t uids[UIDS_PER_TEST], extra;
    int i, j;

    ck_assert_uint_eq(lp->uid_count, UIDS_PER_TEST);
    for (i = 0; i < SLOT_THREADS; i++) {
        c[i] = (struct slot_churn){.lp = lp, .held = held};
        ck_assert_int_eq(pthread_create(&th[i], NULL, slot_churn_main, &c[i]), 0);
    }
    for (i = 0; i < SLOT_THREADS; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(c[i].bad, 0);
    }
    for (i = 0; i < UIDS_PER_TEST; i++) {
        ck_assert_int_eq(local_uid_alloc(lp, &uids[i]), 0);
        ck_assert(slot_claimed(uids[i]));
        for (j = 0; j < i; j++)
            ck_assert_uint_ne(uids[i], uids[j]);
    }
    ck_assert_int_eq(local_uid_alloc(lp, &extra), -EUSERS);
    for (i = 0; i < UIDS_PER_TEST; i++)
        local_uid_free(lp, uids[i]);
    for (i = 0; i < UIDS_PER_TEST; i++)
        ck_assert(!slot_claimed(lp->uid_base + (uint32_t)i * LOCAL_SLOT_IDS));
}
END_TEST

/* Rough numbers for the report: create / exec / stop of one sandbox. */
START_TEST(test_timing)
{
    int64_t c = 0, e = 0, st = 0, t;
    int i, n = 5;

    for (i = 0; i < n; i++) {
        struct lb_exec_result res = {0};
        struct sbx s;

        t = clock_mono_ms();
        sbx_create(&s);
        c += clock_mono_ms() - t;
        t = clock_mono_ms();
        run(&s, "true", NULL, &res);
        e += clock_mono_ms() - t;
        provider_exec_result_release(&res);
        t = clock_mono_ms();
        sbx_stop(&s);
        st += clock_mono_ms() - t;
        sbx_free(&s);
    }
    fprintf(stderr,
            "local provider timing (mean of %d): create %" PRId64 " ms, exec %" PRId64
            " ms, stop %" PRId64 " ms\n",
            n, c / n, e / n, st / n);
}
END_TEST

START_TEST(test_path_is_valid)
{
    ck_assert(provider_path_is_valid("/"));
    ck_assert(provider_path_is_valid("/a/b.c/..d"));
    ck_assert(!provider_path_is_valid(NULL));
    ck_assert(!provider_path_is_valid(""));
    ck_assert(!provider_path_is_valid("a/b"));
    ck_assert(!provider_path_is_valid("/a/"));
    ck_assert(!provider_path_is_valid("/a//b"));
    ck_assert(!provider_path_is_valid("/a/./b"));
    ck_assert(!provider_path_is_valid("/a/.."));
    ck_assert(!provider_path_is_valid("/.."));
    ck_assert_str_eq(provider_status_name(LB_STATUS_PAUSED), "paused");
    ck_assert_str_eq(provider_status_name(LB_STATUS_STOPPED), "stopped");
}
END_TEST

/* The default filter builds, extra names add rules, unknown names are refused with the name in
 * the message, and the memfd holds the same program. */
START_TEST(test_seccomp_filter_build)
{
    struct lb_seccomp f, g;
    struct lb_error err = {0};
    char buf[65536];
    ssize_t n;
    int fd;

    ck_assert_int_eq(seccomp_filter_build(NULL, &f, &err), 0);
    ck_assert_uint_gt(f.prog.len, 10);
    ck_assert_uint_eq(f.size_bytes, f.prog.len * sizeof(struct sock_filter));
    ck_assert_int_eq(seccomp_filter_build("uname, getcpu personality", &g, &err), 0);
    ck_assert_uint_gt(g.prog.len, f.prog.len);
    seccomp_filter_release(&g);
    ck_assert_int_eq(seccomp_filter_build("uname no_such_call", &g, &err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.message, "no_such_call"));
    ck_assert_uint_eq(g.prog.len, 0);
    fd = seccomp_filter_memfd(&f);
    ck_assert_int_ge(fd, 0);
    n = read(fd, buf, sizeof(buf));
    ck_assert_int_eq(n, (ssize_t)f.size_bytes);
    ck_assert_int_eq(memcmp(buf, f.prog.filter, f.size_bytes), 0);
    close(fd);
    seccomp_filter_release(&f);
    seccomp_filter_release(&f); /* twice is harmless */
}
END_TEST

/* What forked children report as "errno N" reaches users as words, E2BIG with its limits. */
START_TEST(test_errno_text)
{
    char out[512];
    const char *argv[] = {"/bin/sh", "-c", "true", NULL};
    const char *env[] = {"PATH=/bin", NULL};
    char *big = malloc(200001);

    local_errno_text("error cannot execute /run/lendbox/supervise: errno 7", out, sizeof(out));
    ck_assert_msg(strstr(out, "cannot execute /run/lendbox/supervise: argument list too long "
                              "(limit ") &&
                      strstr(out, "131072 bytes for one argument"),
                  "%s", out);
    ck_assert_ptr_null(strstr(out, "errno"));
    local_errno_text("lendbox: fork: errno 11", out, sizeof(out));
    ck_assert_str_eq(out, "lendbox: fork: Resource temporarily unavailable");
    local_errno_text("no number here: errno x", out, sizeof(out));
    ck_assert_str_eq(out, "no number here: errno x");
    local_errno_text("a: errno 2, b: errno 13", out, 24); /* cut, still terminated */
    ck_assert_uint_eq(strlen(out), 23);

    ck_assert_int_eq(local_check_exec_args(argv, env, out, sizeof(out)), 0);
    ck_assert_ptr_nonnull(big);
    memset(big, 'x', 200000);
    big[200000] = '\0';
    argv[2] = big;
    ck_assert_int_eq(local_check_exec_args(argv, env, out, sizeof(out)), -E2BIG);
    ck_assert_str_eq(out, "argument list too long: one argument or environment variable is "
                          "200000 bytes (limit 131072 bytes each)");
    free(big);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("provider_local");
    TCase *pure = tcase_create("pure");
    TCase *tc = tcase_create("bwrap");

    tcase_add_test(pure, test_path_is_valid);
    tcase_add_test(pure, test_seccomp_filter_build);
    tcase_add_test(pure, test_errno_text);
    suite_add_tcase(s, pure);

    tcase_add_unchecked_fixture(tc, run_setup, run_teardown);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_exec_basics);
    tcase_add_test(tc, test_exec_bad_cwd);
    tcase_add_test(tc, test_exec_timeout_kills_tree);
    tcase_add_test(tc, test_exec_output_cap);
    tcase_add_test(tc, test_files_round_trip);
    tcase_add_test(tc, test_files_errors);
    tcase_add_test(tc, test_files_symlink_escape);
    tcase_add_test(tc, test_isolation);
    tcase_add_test(tc, test_stop);
    tcase_add_test(tc, test_restart_adopts);
    tcase_add_test(tc, test_pause_resume);
    tcase_add_test(tc, test_limits);
    tcase_add_test(tc, test_image_dir);
    tcase_add_test(tc, test_state_dir_hidden);
    tcase_add_test(tc, test_stale_stop_and_uid_reuse);
    tcase_add_test(tc, test_stop_waits_for_known_pids);
    tcase_add_test(tc, test_stop_reaps_monitor_and_init);
    tcase_add_test(tc, test_failed_create_cleans_up);
    tcase_add_test(tc, test_parallel);
    tcase_add_test(tc, test_slots_concurrent);
    tcase_add_test(tc, test_timing);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    int failed;

    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
