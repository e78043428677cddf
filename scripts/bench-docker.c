/*
 * bench-docker.c - lendbox-bench-docker: the docker provider's operations done directly
 * against the engine's API (no lendbox), to measure lendbox's overhead per operation. Each
 * episode does what the provider does: seed = container create (the provider's body: image,
 * supervisor bind mount, tmpfs workdir and /tmp, no network, labels) + start; exec = exec
 * create + start of `lendbox-supervise --framed ... -- true`, reading the stream to its end;
 * release = DELETE ?force. Sequential (concurrency 1). Not a test: nothing is asserted.
 *
 *   lendbox-bench-docker SOCKET IMAGE SUPERVISE EPISODES
 */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *sock;

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

struct sink {
    char buf[65536];
    size_t len;
};

static size_t sink_write(char *p, size_t size, size_t n, void *user)
{
    struct sink *s = user;
    size_t add = size * n;

    if (s->len + add < sizeof(s->buf)) {
        memcpy(s->buf + s->len, p, add);
        s->len += add;
        s->buf[s->len] = '\0';
    }
    return add;
}

static long call(const char *method, const char *path, const char *body, struct sink *s)
{
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    char url[1024];
    long code = 0;
    CURL *c = curl_easy_init();

    s->len = 0;
    s->buf[0] = '\0';
    snprintf(url, sizeof(url), "http://localhost/v1.41%s", path);
    curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, sock);
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
    curl_easy_cleanup(c);
    return code;
}

/* The "Id" of a JSON answer into id. */
static int id_of(const char *json, char *id, size_t size)
{
    const char *p = strstr(json, "\"Id\":\"");

    if (!p)
        return -1;
    snprintf(id, size, "%.64s", p + 6);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static void report(const char *step, double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    printf("  %-8s p50 %7.2f ms   p99 %7.2f ms   max %7.2f ms\n", step, v[n / 2],
           v[(int)((n - 1) * 0.99)], v[n - 1]);
}

int main(int argc, char **argv)
{
    static struct sink s;
    char body[2048], path[512], name[64], id[80];
    double *seed, *exec, *rel;
    int n;

    if (argc < 5) {
        fprintf(stderr, "usage: lendbox-bench-docker SOCKET IMAGE SUPERVISE EPISODES\n");
        return 2;
    }
    sock = argv[1];
    n = atoi(argv[4]);
    seed = calloc((size_t)n, sizeof(double));
    exec = calloc((size_t)n, sizeof(double));
    rel = calloc((size_t)n, sizeof(double));
    curl_global_init(CURL_GLOBAL_DEFAULT);
    for (int i = 0; i < n; i++) {
        double t0 = now_ms(), t1, t2, t3;

        snprintf(name, sizeof(name), "bench-direct-%d-%d", (int)getpid(), i);
        snprintf(body, sizeof(body),
                 "{\"Image\":\"%s\",\"Cmd\":[\"/run/lendbox/supervise\",\"--init\","
                 "\"--ready-fd\",\"1\"],\"Entrypoint\":[],\"WorkingDir\":\"/workspace\","
                 "\"Labels\":{\"io.lendbox.instance\":\"bench\",\"io.lendbox.sandbox\":\"%s\"},"
                 "\"NetworkDisabled\":true,\"HostConfig\":{\"Binds\":[\"%s:/run/lendbox/"
                 "supervise:ro\"],\"NetworkMode\":\"none\",\"PidsLimit\":4096,\"Tmpfs\":{"
                 "\"/workspace\":\"rw,size=1024m,mode=1777\",\"/tmp\":\"rw,size=1024m,"
                 "mode=1777\"}}}",
                 argv[2], name, argv[3]);
        snprintf(path, sizeof(path), "/containers/create?name=%s", name);
        if (call("POST", path, body, &s) != 201) {
            fprintf(stderr, "create failed: %s\n", s.buf);
            return 1;
        }
        snprintf(path, sizeof(path), "/containers/%s/start", name);
        if (call("POST", path, NULL, &s) != 204) {
            fprintf(stderr, "start failed: %s\n", s.buf);
            return 1;
        }
        t1 = now_ms();
        snprintf(path, sizeof(path), "/containers/%s/exec", name);
        if (call("POST", path,
                 "{\"AttachStdout\":true,\"AttachStderr\":true,\"Tty\":false,\"Cmd\":["
                 "\"/run/lendbox/supervise\",\"--framed\",\"--max-output\",\"1048576\","
                 "\"--timeout-ms\",\"180000\",\"--cwd\",\"/workspace\",\"--\",\"true\"]}",
                 &s) != 201 ||
            id_of(s.buf, id, sizeof(id)) < 0) {
            fprintf(stderr, "exec create failed: %s\n", s.buf);
            return 1;
        }
        snprintf(path, sizeof(path), "/exec/%s/start", id);
        if (call("POST", path, "{\"Detach\":false,\"Tty\":false}", &s) != 200) {
            fprintf(stderr, "exec start failed\n");
            return 1;
        }
        t2 = now_ms();
        snprintf(path, sizeof(path), "/containers/%s?force=true&v=true", name);
        if (call("DELETE", path, NULL, &s) != 204 && s.len && !strstr(s.buf, "\"Id\"")) {
            fprintf(stderr, "remove failed: %s\n", s.buf);
            return 1;
        }
        t3 = now_ms();
        seed[i] = t1 - t0;
        exec[i] = t2 - t1;
        rel[i] = t3 - t2;
    }
    printf("direct engine API, concurrency 1: %d episodes\n", n);
    report("seed", seed, n);
    report("exec", exec, n);
    report("release", rel, n);
    free(seed);
    free(exec);
    free(rel);
    return 0;
}
