/*
 * bench-common.c - see bench-common.h.
 */
#include "bench-common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
