/* harness.c - see harness.h. */
#include "harness.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void lbt_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static char *lbt_read_file(const char *path)
{
    FILE *f = fopen(path, "re");
    char *buf;
    long n;

    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = calloc(1, (size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf)
        buf[strcspn(buf, "\n")] = '\0';
    return buf;
}

static void lbt_spawn(struct lbt_daemon *d, const char *const *extra)
{
    const char *bin = getenv("LENDBOXD") ? getenv("LENDBOXD") : "build/lendboxd";
    const char *sup = getenv("LENDBOX_SUPERVISE");
    const char *argv[64];
    char listen_path[300], sup_set[512];
    int n = 0, fd;

    snprintf(listen_path, sizeof(listen_path), "%s/listen", d->state_dir);
    unlink(listen_path);
    argv[n++] = bin;
    argv[n++] = "--state-dir";
    argv[n++] = d->state_dir;
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--log-level";
    argv[n++] = "debug";
    argv[n++] = "--set";
    argv[n++] = "lending.sweep_interval_s=1";
    if (sup) {
        snprintf(sup_set, sizeof(sup_set), "local.supervise=%s", sup);
        argv[n++] = "--set";
        argv[n++] = sup_set;
    }
    for (int i = 0; extra && extra[i] && n < 62; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    fd = open(d->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    ck_assert_int_ge(fd, 0);
    d->pid = fork();
    ck_assert_int_ge(d->pid, 0);
    if (d->pid == 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(fd);
    /* Wait for the listen file, then for readiness. */
    for (int i = 0; i < 400; i++) {
        char *addr = lbt_read_file(listen_path);
        int status;

        if (addr && *addr) {
            snprintf(d->base_url, sizeof(d->base_url), "http://%s", addr);
            free(addr);
            break;
        }
        free(addr);
        if (waitpid(d->pid, &status, WNOHANG) == d->pid)
            ck_abort_msg("lendboxd exited during startup (see %s)", d->log_path);
        lbt_sleep_ms(25);
    }
    ck_assert_msg(d->base_url[0], "lendboxd did not write %s", listen_path);
    for (int i = 0; i < 800; i++) {
        struct lbt_resp r;

        lbt_request(d, "GET", "/readyz", NULL, NULL, 0, NULL, &r);
        long st = r.status;
        lbt_resp_free(&r);
        if (st == 200) {
            char tok_path[300];
            char *tok;

            snprintf(tok_path, sizeof(tok_path), "%s/admin.token", d->state_dir);
            tok = lbt_read_file(tok_path);
            ck_assert_ptr_nonnull(tok);
            snprintf(d->admin_token, sizeof(d->admin_token), "%s", tok);
            free(tok);
            return;
        }
        lbt_sleep_ms(25);
    }
    ck_abort_msg("lendboxd never became ready (see %s)", d->log_path);
}

void lbt_daemon_start(struct lbt_daemon *d, const char *const *extra_args)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->state_dir, sizeof(d->state_dir), "/tmp/lendbox-e2e-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d->state_dir));
    snprintf(d->log_path, sizeof(d->log_path), "%s.log", d->state_dir);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    lbt_spawn(d, extra_args);
}

void lbt_daemon_restart(struct lbt_daemon *d, const char *const *extra_args)
{
    d->base_url[0] = '\0';
    lbt_spawn(d, extra_args);
}

int lbt_daemon_stop(struct lbt_daemon *d)
{
    int status = 0;

    if (d->pid <= 0)
        return 0;
    kill(d->pid, SIGTERM);
    for (int i = 0; i < 1200; i++) {
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            d->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        }
        lbt_sleep_ms(50);
    }
    kill(d->pid, SIGKILL);
    waitpid(d->pid, &status, 0);
    d->pid = 0;
    return -1;
}

void lbt_daemon_kill(struct lbt_daemon *d)
{
    if (d->pid <= 0)
        return;
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    d->pid = 0;
}

void lbt_daemon_cleanup(struct lbt_daemon *d)
{
    char cmd[600];

    if (d->pid > 0)
        lbt_daemon_stop(d);
    if (d->state_dir[0] && !getenv("LBT_KEEP")) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", d->state_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "harness: could not remove %s\n", d->state_dir);
    }
}

struct lbt_sink {
    char *data;
    size_t len;
};

static size_t lbt_write(char *p, size_t size, size_t n, void *user)
{
    struct lbt_sink *s = user;
    size_t add = size * n;
    char *q = realloc(s->data, s->len + add + 1);

    if (!q)
        return 0;
    memcpy(q + s->len, p, add);
    s->data = q;
    s->len += add;
    s->data[s->len] = '\0';
    return add;
}

static size_t lbt_header(char *p, size_t size, size_t n, void *user)
{
    struct lbt_resp *r = user;
    size_t add = size * n, have = strlen(r->headers);

    if (have + add < sizeof(r->headers)) {
        memcpy(r->headers + have, p, add);
        r->headers[have + add] = '\0';
    }
    if (add > 14 && strncasecmp(p, "X-Request-Id:", 13) == 0) {
        size_t len = add - 13;
        const char *v = p + 13;

        while (len && (*v == ' '))
            v++, len--;
        while (len && (v[len - 1] == '\r' || v[len - 1] == '\n'))
            len--;
        if (len < sizeof(r->request_id)) {
            memcpy(r->request_id, v, len);
            r->request_id[len] = '\0';
        }
    }
    return add;
}

void lbt_request(struct lbt_daemon *d, const char *method, const char *path, const char *token,
                 const void *body, size_t body_len, const char *content_type,
                 struct lbt_resp *resp)
{
    CURL *c = curl_easy_init();
    struct curl_slist *hdrs = NULL;
    struct lbt_sink sink = {0};
    char url[4096], h[600];
    CURLcode cc;

    memset(resp, 0, sizeof(*resp));
    ck_assert_ptr_nonnull(c);
    snprintf(url, sizeof(url), "%s%s", d->base_url, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, lbt_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, lbt_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, resp);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 600L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    if (token) {
        snprintf(h, sizeof(h), "Authorization: Bearer %s", *token ? token : d->admin_token);
        hdrs = curl_slist_append(hdrs, h);
    }
    if (body) {
        snprintf(h, sizeof(h), "Content-Type: %s", content_type ? content_type : "application/json");
        hdrs = curl_slist_append(hdrs, h);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    }
    hdrs = curl_slist_append(hdrs, "Expect:");
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    if (!strcmp(method, "HEAD"))
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    cc = curl_easy_perform(c);
    if (cc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &resp->status);
    else
        resp->status = -1;
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(c);
    resp->body = sink.data ? sink.data : calloc(1, 1);
    resp->len = sink.len;
    if (resp->len > 0 && resp->body[0] == '{')
        resp->json = json_loadb(resp->body, resp->len, 0, NULL);
}

void lbt_json(struct lbt_daemon *d, const char *method, const char *path, const char *token,
              const char *body_json, struct lbt_resp *resp)
{
    lbt_request(d, method, path, token, body_json, body_json ? strlen(body_json) : 0, NULL, resp);
}

void lbt_resp_free(struct lbt_resp *resp)
{
    free(resp->body);
    json_decref(resp->json);
    memset(resp, 0, sizeof(*resp));
}

json_t *lbt_seed(struct lbt_daemon *d, const char *rsid, const char *task_id,
                 const char *extra_members)
{
    char path[300], body[8192];
    struct lbt_resp r;
    json_t *lease;

    snprintf(path, sizeof(path), "/v1/sessions/%s/seed", rsid);
    snprintf(body, sizeof(body), "{\"task_id\": \"%s\"%s%s}", task_id,
             extra_members ? ", " : "", extra_members ? extra_members : "");
    lbt_json(d, "POST", path, "", body, &r);
    ck_assert_msg(r.status == 200, "seed %s: status %ld body %s", rsid, r.status, r.body);
    lease = json_incref(r.json);
    lbt_resp_free(&r);
    ck_assert_ptr_nonnull(lease);
    return lease;
}

const char *lbt_error_code(const struct lbt_resp *resp)
{
    const char *code = json_string_value(
        json_object_get(json_object_get(resp->json, "error"), "code"));

    return code ? code : "";
}

static bool lbt_proc_uid(const char *pid, uid_t *uid)
{
    char path[300];
    struct stat st;

    snprintf(path, sizeof(path), "/proc/%s", pid);
    if (stat(path, &st) < 0)
        return false;
    *uid = st.st_uid;
    return true;
}

int lbt_count_procs_of_uid(uid_t uid)
{
    DIR *dir = opendir("/proc");
    struct dirent *e;
    int n = 0;

    ck_assert_ptr_nonnull(dir);
    while ((e = readdir(dir))) {
        uid_t u;

        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        if (lbt_proc_uid(e->d_name, &u) && u == uid)
            n++;
    }
    closedir(dir);
    return n;
}

int lbt_count_procs_cmdline(const char *needle)
{
    DIR *dir = opendir("/proc");
    struct dirent *e;
    int n = 0;

    ck_assert_ptr_nonnull(dir);
    while ((e = readdir(dir))) {
        char path[300], buf[4096];
        ssize_t len;
        int fd;

        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        len = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (len <= 0)
            continue;
        for (ssize_t i = 0; i < len; i++)
            if (buf[i] == '\0')
                buf[i] = ' ';
        buf[len] = '\0';
        if (strstr(buf, needle))
            n++;
    }
    closedir(dir);
    return n;
}

bool lbt_path_exists(const char *path)
{
    struct stat st;

    return lstat(path, &st) == 0;
}

uid_t lbt_sandbox_uid(struct lbt_daemon *d, const char *sandbox_id)
{
    char path[400];
    json_t *desc;
    uid_t uid;

    snprintf(path, sizeof(path), "%s/sandboxes/%s/descriptor.json", d->state_dir, sandbox_id);
    desc = json_load_file(path, 0, NULL);
    ck_assert_msg(desc != NULL, "no descriptor at %s", path);
    uid = (uid_t)json_integer_value(json_object_get(desc, "uid"));
    json_decref(desc);
    ck_assert_uint_gt(uid, 0);
    return uid;
}
