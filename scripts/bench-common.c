/*
 * bench-common.c - see bench-common.h.
 */
#include "bench-common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

double bench_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

/* Room for add more bytes and the NUL. */
static int sink_reserve(struct bench_sink *s, size_t add)
{
    size_t cap = s->cap ? s->cap : 4096;
    char *p;

    while (cap < s->len + add + 1)
        cap *= 2;
    if (cap == s->cap)
        return 0;
    p = realloc(s->buf, cap);
    if (!p)
        return -1;
    s->buf = p;
    s->cap = cap;
    return 0;
}

static size_t sink_write(char *p, size_t size, size_t n, void *user)
{
    struct bench_sink *s = user;
    size_t add = size * n;

    if (sink_reserve(s, add) < 0)
        return 0; /* curl fails the transfer */
    memcpy(s->buf + s->len, p, add);
    s->len += add;
    s->buf[s->len] = '\0';
    return add;
}

void bench_sink_release(struct bench_sink *s)
{
    free(s->buf);
    s->buf = NULL;
    s->len = s->cap = 0;
}

long bench_http(CURL *c, const char *method, const char *url, const char *body, const char *token,
                const char *unix_socket, struct bench_sink *s)
{
    struct curl_slist *h = NULL;
    char auth[512];
    long code = 0;

    s->len = 0;
    if (sink_reserve(s, 0) < 0)
        return 0;
    s->buf[0] = '\0';
    curl_easy_reset(c);
    if (token) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token);
        h = curl_slist_append(h, auth);
    }
    h = curl_slist_append(h, "Content-Type: application/json");
    if (unix_socket) {
        curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, unix_socket);
        curl_easy_setopt(c, CURLOPT_FORBID_REUSE, 1L);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (body)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, s);
    if (curl_easy_perform(c) == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    return code;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

/* The index of the pct-th percentile of m sorted samples (nearest rank: the smallest sample
 * with at least pct% of the samples at or below it). */
static int nearest_rank(int m, int pct)
{
    int rank = (m * pct + 99) / 100;

    return rank > 0 ? rank - 1 : 0;
}

void bench_stat_of(double *v, int n, struct bench_stat *st)
{
    int m = 0;

    for (int i = 0; i < n; i++)
        if (v[i] >= 0)
            v[m++] = v[i];
    for (int i = m; i < n; i++)
        v[i] = -1; /* so that a second call sees the same samples */
    qsort(v, (size_t)m, sizeof(double), cmp_double);
    st->n_ok = m;
    st->p50_ms = m ? v[nearest_rank(m, 50)] : 0;
    st->p99_ms = m ? v[nearest_rank(m, 99)] : 0;
    st->max_ms = m ? v[m - 1] : 0;
}

void bench_print_stat(const char *step, double *v, int n)
{
    struct bench_stat st;

    bench_stat_of(v, n, &st);
    if (st.n_ok == 0) {
        printf("  %-8s no successful samples\n", step);
        return;
    }
    printf("  %-8s p50 %7.2f ms   p99 %7.2f ms   max %7.2f ms\n", step, st.p50_ms, st.p99_ms,
           st.max_ms);
}

int bench_lendbox_episode(CURL *c, const struct bench_lendbox *lb, const char *session,
                          struct bench_sink *s, double ms[3])
{
    char url[512], sbx[64];
    double t0, t1, t2, t3;
    const char *p;

    snprintf(url, sizeof(url), "%s/v1/sessions/%s/seed", lb->url, session);
    t0 = bench_now_ms();
    if (bench_http(c, "POST", url, lb->seed_body, lb->token, NULL, s) != 200 ||
        !(p = strstr(s->buf, "\"sandbox_id\":\""))) {
        fprintf(stderr, "seed failed: %s\n", s->buf);
        return -1;
    }
    snprintf(sbx, sizeof(sbx), "%.30s", p + 14);
    t1 = bench_now_ms();
    snprintf(url, sizeof(url), "%s/v1/sandboxes/%s/exec", lb->url, sbx);
    if (bench_http(c, "POST", url, "{\"argv\":[\"true\"]}", lb->token, NULL, s) != 200 ||
        !strstr(s->buf, "\"return_code\":0")) {
        fprintf(stderr, "exec failed: %s\n", s->buf);
        return -1;
    }
    t2 = bench_now_ms();
    snprintf(url, sizeof(url), "%s/v1/sessions/%s/release", lb->url, session);
    if (bench_http(c, "POST", url, "{}", lb->token, NULL, s) != 200) {
        fprintf(stderr, "release failed: %s\n", s->buf);
        return -1;
    }
    t3 = bench_now_ms();
    ms[0] = t1 - t0;
    ms[1] = t2 - t1;
    ms[2] = t3 - t2;
    return 0;
}

/* An engine request: path below /v1.41. */
static long engine(CURL *c, const struct bench_docker *d, const char *method, const char *path,
                   const char *body, struct bench_sink *s)
{
    char url[1024];

    snprintf(url, sizeof(url), "http://localhost/v1.41%s", path);
    return bench_http(c, method, url, body, NULL, d->socket, s);
}

int bench_docker_episode(CURL *c, const struct bench_docker *d, const char *name,
                         struct bench_sink *s, double ms[3])
{
    char body[2048], path[512], id[80];
    double t0 = bench_now_ms(), t1, t2, t3;
    const char *p;

    snprintf(body, sizeof(body),
             "{\"Image\":\"%s\",\"Cmd\":[\"/run/lendbox/supervise\",\"--init\","
             "\"--ready-fd\",\"1\"],\"Entrypoint\":[],\"WorkingDir\":\"/workspace\","
             "\"Labels\":{\"io.lendbox.instance\":\"bench\",\"io.lendbox.sandbox\":\"%s\"},"
             "\"NetworkDisabled\":true,\"HostConfig\":{\"Binds\":[\"%s:/run/lendbox/"
             "supervise:ro\"],\"NetworkMode\":\"none\",\"PidsLimit\":4096,\"Tmpfs\":{"
             "\"/workspace\":\"rw,size=1024m,mode=1777\",\"/tmp\":\"rw,size=1024m,"
             "mode=1777\"}}}",
             d->image, name, d->supervise);
    snprintf(path, sizeof(path), "/containers/create?name=%s", name);
    if (engine(c, d, "POST", path, body, s) != 201) {
        fprintf(stderr, "create failed: %s\n", s->buf);
        return -1;
    }
    snprintf(path, sizeof(path), "/containers/%s/start", name);
    if (engine(c, d, "POST", path, NULL, s) != 204) {
        fprintf(stderr, "start failed: %s\n", s->buf);
        goto remove;
    }
    t1 = bench_now_ms();
    snprintf(path, sizeof(path), "/containers/%s/exec", name);
    if (engine(c, d, "POST", path,
               "{\"AttachStdout\":true,\"AttachStderr\":true,\"Tty\":false,\"Cmd\":["
               "\"/run/lendbox/supervise\",\"--framed\",\"--max-output\",\"1048576\","
               "\"--timeout-ms\",\"180000\",\"--cwd\",\"/workspace\",\"--\",\"true\"]}",
               s) != 201 ||
        !(p = strstr(s->buf, "\"Id\":\""))) {
        fprintf(stderr, "exec create failed: %s\n", s->buf);
        goto remove;
    }
    snprintf(id, sizeof(id), "%.64s", p + 6);
    snprintf(path, sizeof(path), "/exec/%s/start", id);
    if (engine(c, d, "POST", path, "{\"Detach\":false,\"Tty\":false}", s) != 200) {
        fprintf(stderr, "exec start failed\n");
        goto remove;
    }
    t2 = bench_now_ms();
    snprintf(path, sizeof(path), "/containers/%s?force=true&v=true", name);
    if (engine(c, d, "DELETE", path, NULL, s) != 204 && s->len && !strstr(s->buf, "\"Id\"")) {
        fprintf(stderr, "remove failed: %s\n", s->buf);
        return -1;
    }
    t3 = bench_now_ms();
    ms[0] = t1 - t0;
    ms[1] = t2 - t1;
    ms[2] = t3 - t2;
    return 0;
remove:
    snprintf(path, sizeof(path), "/containers/%s?force=true&v=true", name);
    (void)engine(c, d, "DELETE", path, NULL, s);
    return -1;
}

/* ---------- the bwrap floor ---------- */

struct strv {
    char **v;
    size_t n, cap;
};

static void strv_add(struct strv *a, const char *s)
{
    if (a->n + 2 > a->cap) {
        a->cap = a->cap ? a->cap * 2 : 64;
        a->v = realloc(a->v, a->cap * sizeof(*a->v));
        if (!a->v) {
            perror("realloc");
            abort();
        }
    }
    a->v[a->n++] = strdup(s);
    a->v[a->n] = NULL;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* What src/provider/local/create.c's build_argv gives a host-root sandbox of the default class
 * (storage tmpfs, no limits, no network, default sizes): a tmpfs root with every top-level
 * entry of / bound read-only (symlinks recreated), /proc, a read-only /dev, sized tmpfs on
 * /dev/shm, /tmp, /run and the workdir, the supervisor bound from an fd, / remounted
 * read-only. Left out: --info-fd and the seccomp filter (the daemon's init runs under it). */
static void floor_build_argv(struct bench_floor *f, const char *bwrap, const char *workdir)
{
    static const char *const skip[] = {".", "..", "proc", "dev", "tmp", "run", "lost+found"};
    struct strv a = {0};
    char **names = NULL;
    size_t n = 0;
    struct dirent *de;
    DIR *d = opendir("/");

    strv_add(&a, bwrap);
    const char *const head[] = {"--unshare-user",
                                "--uid",
                                "0",
                                "--gid",
                                "0",
                                "--unshare-pid",
                                "--unshare-net",
                                "--unshare-ipc",
                                "--unshare-uts",
                                "--new-session",
                                "--as-pid-1",
                                "--hostname",
                                "sbx-floor",
                                "--tmpfs",
                                "/"};
    for (size_t i = 0; i < sizeof(head) / sizeof(head[0]); i++)
        strv_add(&a, head[i]);
    while (d && (de = readdir(d))) {
        bool skipped = strcmp(de->d_name, workdir + 1) == 0;

        for (size_t k = 0; k < sizeof(skip) / sizeof(skip[0]); k++)
            skipped = skipped || strcmp(de->d_name, skip[k]) == 0;
        if (skipped)
            continue;
        names = realloc(names, (n + 1) * sizeof(*names));
        names[n++] = strdup(de->d_name);
    }
    if (d)
        closedir(d);
    qsort(names, n, sizeof(*names), cmp_str);
    for (size_t i = 0; i < n; i++) {
        char src[512], target[4097];
        ssize_t len;

        snprintf(src, sizeof(src), "/%s", names[i]);
        len = readlink(src, target, sizeof(target) - 1);
        if (len >= 0) {
            target[len] = '\0';
            strv_add(&a, "--symlink");
            strv_add(&a, target);
        } else {
            strv_add(&a, "--ro-bind");
            strv_add(&a, src);
        }
        strv_add(&a, src);
        free(names[i]);
    }
    free(names);
    const char *const tail[] = {"--proc",   "/proc",      "--dev",      "/dev",    "--remount-ro",
                                "/dev",     "--size",     "1073741824", "--tmpfs", "/dev/shm",
                                "--size",   "1073741824", "--tmpfs",    "/tmp",    "--size",
                                "67108864", "--tmpfs",    "/run",       "--size",  "1073741824",
                                "--tmpfs",  workdir};
    for (size_t i = 0; i < sizeof(tail) / sizeof(tail[0]); i++)
        strv_add(&a, tail[i]);
    if (f->supervise_fd >= 0) {
        strv_add(&a, "--ro-bind-fd");
        strv_add(&a, "3");
        strv_add(&a, "/run/lendbox/supervise");
    }
    strv_add(&a, "--remount-ro");
    strv_add(&a, "/");
    strv_add(&a, "--");
    strv_add(&a, "true");
    f->argv = a.v;
    if (getenv("LENDBOX_BENCH_DEBUG"))
        for (size_t i = 0; i < a.n; i++)
            fprintf(stderr, "%s%c", a.v[i], i + 1 < a.n ? ' ' : '\n');
}

int bench_floor_episode(const struct bench_floor *f, double *ms)
{
    static char *const envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
    double t0 = bench_now_ms();
    int status;
    pid_t pid = fork();

    if (pid < 0)
        return -1;
    if (pid == 0) {
        /* dup2 of an fd onto itself keeps its FD_CLOEXEC: clear it */
        if (f->supervise_fd >= 0 && (dup2(f->supervise_fd, 3) < 0 || fcntl(3, F_SETFD, 0) < 0))
            _exit(126);
        (void)syscall(SYS_close_range, f->supervise_fd >= 0 ? 4 : 3, ~0U, 0);
        if (syscall(SYS_setgroups, 0, NULL) < 0 ||
            syscall(SYS_setresgid, f->uid, f->uid, f->uid) < 0 ||
            syscall(SYS_setresuid, f->uid, f->uid, f->uid) < 0)
            _exit(126);
        execve(f->argv[0], f->argv, envp);
        _exit(127);
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    *ms = bench_now_ms() - t0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "floor: bwrap exited with status %d\n", status);
        return -1;
    }
    return 0;
}

int bench_floor_init(struct bench_floor *f, const char *bwrap, const char *workdir,
                     const char *supervise, uid_t uid)
{
    f->argv = NULL;
    f->uid = uid;
    f->supervise_fd = -1;
    if (supervise && (f->supervise_fd = open(supervise, O_PATH | O_CLOEXEC)) < 0) {
        perror(supervise);
        return -1;
    }
    floor_build_argv(f, bwrap, workdir);
    return 0;
}

void bench_floor_release(struct bench_floor *f)
{
    if (f->argv) {
        for (char **p = f->argv; *p; p++)
            free(*p);
        free(f->argv);
    }
    if (f->supervise_fd >= 0)
        close(f->supervise_fd);
    f->argv = NULL;
    f->supervise_fd = -1;
}
