/* harness.c - see harness.h. */
#include "harness.h"

#include <curl/curl.h>
#include <pthread.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/resource.h>
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

/* <state_dir>.pid holds the pid of the daemon last spawned on that state dir, so that a
 * daemon restarted inside a forked test can still be stopped by the fixture's teardown. */
static void lbt_write_pid_file(const struct lbt_daemon *d)
{
    char path[300];
    FILE *f;

    snprintf(path, sizeof(path), "%s.pid", d->state_dir);
    f = fopen(path, "we");
    if (f) {
        fprintf(f, "%d\n", (int)d->pid);
        fclose(f);
    }
}

static bool lbt_proc_cmdline(const char *pid, char *buf, size_t size);

/* Is pid a running process (present, and not a zombie)? */
static bool lbt_pid_live(pid_t pid)
{
    char path[64], buf[512];
    const char *p;
    ssize_t len;
    int fd;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    len = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (len <= 0)
        return false;
    buf[len] = '\0';
    p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

/* Is pid alive (not a zombie) and a lendboxd on state_dir? */
static bool lbt_pid_is_daemon(pid_t pid, const char *state_dir)
{
    char name[32], buf[4096];

    snprintf(name, sizeof(name), "%d", (int)pid);
    return lbt_pid_live(pid) && lbt_proc_cmdline(name, buf, sizeof(buf)) &&
           strstr(buf, "lendboxd") && strstr(buf, state_dir);
}

/* ---------- variants (LENDBOX_E2E_VARIANT) ----------
 * A variant changes what every daemon the harness starts runs its sandboxes on. Each has a
 * name, the image seeds get by default, and a prepare step run before each spawn (also a
 * restart) that may set up the state dir and add "--set" arguments ahead of the test's own
 * (which therefore win). To add one (docker, a warm pool): a prepare function and a row in
 * lbt_variants[]. */
struct lbt_variant_def {
    const char *name;
    const char *default_image; /* what a seed without "image" runs on */
    /* add arguments to argv[*n...] (at most LBT_VARIANT_MAX_ARGS) and prepare d's state dir;
     * NULL: nothing to do */
    void (*prepare)(struct lbt_daemon *d, const char **argv, int *n);
    /* once per test program, before its suite runs (in the parent of the forked tests):
     * false when the variant cannot run here (printed; the program then passes as skipped);
     * NULL: nothing to do */
    bool (*setup)(const char *prog);
    void (*teardown)(void); /* after the suite; NULL: nothing */
};
#define LBT_VARIANT_MAX_ARGS 12

#define LBT_VARIANT_IMAGE "lbt-variant"

/* The image variant's pre-imported store: built once (tests/images/make-variant-image,
 * cached and locked), shared read-only by every daemon; its digest's hex. */
static char lbt_variant_store[512], lbt_variant_hex[65];

static void lbt_variant_image_store(void)
{
    char cmd[1536], link[1024], target[256];
    const char *dir = getenv("LENDBOX_E2E_IMAGE_DIR");
    const char *src = getenv("LENDBOX_SRCDIR") ? getenv("LENDBOX_SRCDIR") : ".";
    ssize_t len;

    if (lbt_variant_hex[0])
        return;
    if (dir && *dir)
        snprintf(lbt_variant_store, sizeof(lbt_variant_store), "%s", dir);
    else
        snprintf(lbt_variant_store, sizeof(lbt_variant_store), "%s/build/e2e-image", src);
    snprintf(link, sizeof(link), "%s/state/images/" LBT_VARIANT_IMAGE, lbt_variant_store);
    snprintf(cmd, sizeof(cmd), "%s/stamp", lbt_variant_store);
    /* built once (make e2e-image builds it first); never rebuilt under running tests */
    if (!lbt_path_exists(cmd) || readlink(link, target, sizeof(target) - 1) <= 0) {
        snprintf(cmd, sizeof(cmd), "'%s/tests/images/make-variant-image' '%s' >&2", src,
                 lbt_variant_store);
        ck_assert_msg(system(cmd) == 0, "variant image: %s failed", cmd);
    }
    len = readlink(link, target, sizeof(target) - 1);
    ck_assert_msg(len > 0, "variant image: no %s", link);
    target[len] = '\0';
    /* .store/sha256/<hex>/rootfs */
    ck_assert_msg(len == 14 + 64 + 7 && strncmp(target, ".store/sha256/", 14) == 0,
                  "variant image: unexpected link %s", target);
    memcpy(lbt_variant_hex, target + 14, 64);
    lbt_variant_hex[64] = '\0';
}

/* images/.store/sha256/<hex> -> the shared store's tree, images/lbt-variant -> it: the daemon
 * sees an imported image (config and all) without an import of its own. */
static void lbt_variant_image_prepare(struct lbt_daemon *d, const char **argv, int *n)
{
    static const char *const subdirs[] = {"images", "images/.store", "images/.store/sha256"};
    char path[1024], target[1024];

    lbt_variant_image_store();
    mkdir(d->state_dir, 0711);
    for (size_t i = 0; i < sizeof(subdirs) / sizeof(subdirs[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", d->state_dir, subdirs[i]);
        ck_assert_msg(mkdir(path, 0700) == 0 || errno == EEXIST, "mkdir %s", path);
    }
    snprintf(path, sizeof(path), "%s/images/.store/sha256/%s", d->state_dir, lbt_variant_hex);
    snprintf(target, sizeof(target), "%s/state/images/.store/sha256/%s", lbt_variant_store,
             lbt_variant_hex);
    ck_assert_msg(symlink(target, path) == 0 || errno == EEXIST, "symlink %s", path);
    snprintf(path, sizeof(path), "%s/images/" LBT_VARIANT_IMAGE, d->state_dir);
    snprintf(target, sizeof(target), ".store/sha256/%s/rootfs", lbt_variant_hex);
    ck_assert_msg(symlink(target, path) == 0 || errno == EEXIST, "symlink %s", path);
    argv[(*n)++] = "--set";
    argv[(*n)++] = "local.default_image=" LBT_VARIANT_IMAGE;
}

/* The docker variant: one private podman API service per test program (tests/podman-service:
 * its own storage, runc, the test image lbtest:latest), started before the suite in the parent
 * so every forked test and every daemon of the program shares it; or the one named by
 * LENDBOX_E2E_PODMAN_DIR (already started, e.g. by make e2e-docker, and left running). */
#define LBT_VARIANT_DOCKER_IMAGE "lbtest:latest"
static char lbt_podman_dir[256], lbt_podman_socket_set[320];
static bool lbt_podman_owned;

static int lbt_podman_service(const char *cmd)
{
    char line[1024];
    const char *src = getenv("LENDBOX_SRCDIR") ? getenv("LENDBOX_SRCDIR") : ".";
    int st;

    snprintf(line, sizeof(line), "'%s/tests/podman-service' %s '%s' >&2", src, cmd, lbt_podman_dir);
    st = system(line);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

static void lbt_run_list_add(const char *line);

static bool lbt_variant_docker_setup(const char *prog)
{
    const char *dir = getenv("LENDBOX_E2E_PODMAN_DIR");
    char sock[300];

    if (dir && *dir) {
        snprintf(lbt_podman_dir, sizeof(lbt_podman_dir), "%s", dir);
        snprintf(sock, sizeof(sock), "%s/podman.sock", dir);
        if (!lbt_path_exists(sock)) {
            printf("%s: SKIP: no podman service at %s (podman cannot run here?); the docker "
                   "variant was not tested\n",
                   prog, dir);
            return false;
        }
    } else {
        snprintf(lbt_podman_dir, sizeof(lbt_podman_dir), "/tmp/lbt-podman-%d-XXXXXX",
                 (int)getpid());
        if (!mkdtemp(lbt_podman_dir)) {
            printf("%s: SKIP: cannot make a temp dir for podman\n", prog);
            return false;
        }
        lbt_podman_owned = true;
        {
            char line[300];

            snprintf(line, sizeof(line), "podman\t%s\n", lbt_podman_dir);
            lbt_run_list_add(line);
        }
        if (lbt_podman_service("start") != 0) {
            printf("%s: SKIP: podman cannot run here (see the message above); the docker "
                   "variant was not tested\n",
                   prog);
            lbt_podman_service("stop");
            return false;
        }
    }
    snprintf(lbt_podman_socket_set, sizeof(lbt_podman_socket_set), "docker.socket=%s/podman.sock",
             lbt_podman_dir);
    return true;
}

static void lbt_variant_docker_teardown(void)
{
    char line[600];

    if (!lbt_podman_owned)
        return;
    lbt_podman_service("stop");
    snprintf(line, sizeof(line), "rm -rf '%s' 2>/dev/null", lbt_podman_dir);
    if (system(line) != 0) {
        /* leftovers of a vfs storage in /tmp are harmless */
    }
}

/* provider.name = docker on the program's service; the instance label defaults to one derived
 * from the state dir, so daemons (and their containers) never mix. */
static void lbt_variant_docker_prepare(struct lbt_daemon *d, const char **argv, int *n)
{
    (void)d;
    ck_assert_msg(lbt_podman_socket_set[0], "docker variant: no podman service set up");
    argv[(*n)++] = "--set";
    argv[(*n)++] = "provider.name=docker";
    argv[(*n)++] = "--set";
    argv[(*n)++] = lbt_podman_socket_set;
    argv[(*n)++] = "--set";
    argv[(*n)++] = "docker.default_image=" LBT_VARIANT_DOCKER_IMAGE;
}

struct lbt_engine_body {
    char *data;
    size_t len;
};

static size_t lbt_engine_on_body(char *p, size_t size, size_t nmemb, void *arg)
{
    struct lbt_engine_body *b = arg;
    char *grown = realloc(b->data, b->len + size * nmemb + 1);

    if (!grown)
        return 0;
    b->data = grown;
    memcpy(b->data + b->len, p, size * nmemb);
    b->len += size * nmemb;
    b->data[b->len] = '\0';
    return size * nmemb;
}

static int lbt_lxd_count_instances(const char *needle, bool running_only);

int lbt_variant_count_containers(const char *needle, bool running_only)
{
    if (lbt_variant_is("lxd"))
        return lbt_lxd_count_instances(needle, running_only);

    struct lbt_engine_body b = {0};
    char url[1024], filter[300], sock[300], *enc;
    json_t *j = NULL;
    int n = -1;
    CURL *h;

    if (!lbt_podman_socket_set[0])
        return -1;
    snprintf(sock, sizeof(sock), "%s/podman.sock", lbt_podman_dir);
    snprintf(filter, sizeof(filter), "{\"name\":[\"%s\"]}", needle);
    h = curl_easy_init();
    ck_assert_ptr_nonnull(h);
    enc = curl_easy_escape(h, filter, 0);
    snprintf(url, sizeof(url), "http://d/v1.41/containers/json?all=%s&filters=%s",
             running_only ? "false" : "true", enc);
    curl_free(enc);
    curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, sock);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, lbt_engine_on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
    if (curl_easy_perform(h) == CURLE_OK && b.data)
        j = json_loads(b.data, 0, NULL);
    curl_easy_cleanup(h);
    free(b.data);
    if (json_is_array(j))
        n = (int)json_array_size(j);
    json_decref(j);
    return n;
}

/* One request to this run's podman service: method on path (an API path with its query);
 * the answer's body (malloc'd, the caller frees; NULL when none) and HTTP status into *status. */
static char *lbt_podman_request(const char *method, const char *path, long *status)
{
    struct lbt_engine_body b = {0};
    char url[1200], sock[300];
    CURL *h;

    *status = 0;
    snprintf(sock, sizeof(sock), "%s/podman.sock", lbt_podman_dir);
    snprintf(url, sizeof(url), "http://d%s", path);
    h = curl_easy_init();
    ck_assert_ptr_nonnull(h);
    curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, sock);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, lbt_engine_on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 60L);
    if (curl_easy_perform(h) == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(h);
    return b.data;
}

json_t *lbt_podman_get(const char *path)
{
    char full[1100], *body;
    json_t *j;
    long status;

    if (!lbt_podman_socket_set[0])
        return NULL;
    snprintf(full, sizeof(full), "/v1.41%s", path);
    body = lbt_podman_request("GET", full, &status);
    j = body && status == 200 ? json_loads(body, 0, NULL) : NULL;
    free(body);
    return j;
}

int lbt_variant_remove_containers(const char *needle)
{
    char path[1024], filter[300], *enc, *body;
    json_t *j, *c;
    size_t i;
    long status;
    int n = 0;
    CURL *h;

    ck_assert_msg(lbt_variant_is("docker") && lbt_podman_socket_set[0],
                  "lbt_variant_remove_containers: only on the docker variant");
    snprintf(filter, sizeof(filter), "{\"name\":[\"%s\"]}", needle);
    h = curl_easy_init();
    ck_assert_ptr_nonnull(h);
    enc = curl_easy_escape(h, filter, 0);
    snprintf(path, sizeof(path), "/v1.41/containers/json?all=true&filters=%s", enc);
    curl_free(enc);
    curl_easy_cleanup(h);
    body = lbt_podman_request("GET", path, &status);
    j = body ? json_loads(body, 0, NULL) : NULL;
    free(body);
    ck_assert_msg(status == 200 && json_is_array(j), "listing containers: %ld", status);
    json_array_foreach(j, i, c) {
        const char *id = json_string_value(json_object_get(c, "Id"));

        ck_assert_ptr_nonnull(id);
        snprintf(path, sizeof(path), "/v1.41/containers/%s?force=true", id);
        free(lbt_podman_request("DELETE", path, &status));
        ck_assert_msg(status == 204 || status == 200, "removing container %s: %ld", id, status);
        n++;
    }
    json_decref(j);
    return n;
}

/* The lxd variant: the two-member LXD cluster of scripts/lxd-cluster (member a's unix socket,
 * the busybox image alias lendbox-test); LENDBOX_E2E_LXD_SOCKET names the socket of one already
 * up (make e2e-lxd), else `scripts/lxd-cluster up` runs once per program (idempotent, fast when
 * up; it is left up). The script exits 77 where LXD cannot run: the program then skips. */
#define LBT_VARIANT_LXD_IMAGE "lendbox-test"
static char lbt_lxd_socket[600], lbt_lxd_socket_set[640];

static bool lbt_variant_lxd_setup(const char *prog)
{
    const char *sock = getenv("LENDBOX_E2E_LXD_SOCKET");
    const char *src = getenv("LENDBOX_SRCDIR") ? getenv("LENDBOX_SRCDIR") : ".";
    const char *script = getenv("LENDBOX_E2E_LXD_CLUSTER");
    char cmd[1024], line[512], last[512] = "";
    FILE *f;
    int st;

    if (sock && *sock) {
        snprintf(lbt_lxd_socket, sizeof(lbt_lxd_socket), "%s", sock);
    } else {
        snprintf(cmd, sizeof(cmd), "'%s' up", script && *script ? script : "scripts/lxd-cluster");
        if (!(script && *script))
            snprintf(cmd, sizeof(cmd), "'%s/scripts/lxd-cluster' up", src);
        f = popen(cmd, "r");
        if (!f) {
            printf("%s: SKIP: cannot run %s; the lxd variant was not tested\n", prog, cmd);
            return false;
        }
        while (fgets(line, sizeof(line), f)) {
            fputs(line, stderr);
            snprintf(last, sizeof(last), "%s", line);
        }
        st = pclose(f);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            printf("%s: SKIP: %s failed (status %d: %s); the lxd variant was not tested\n", prog,
                   cmd, WIFEXITED(st) ? WEXITSTATUS(st) : -1, last);
            return false;
        }
        last[strcspn(last, "\n")] = '\0';
        if (strncmp(last, "socket=", 7) != 0) {
            printf("%s: SKIP: %s printed no socket= line; the lxd variant was not tested\n", prog,
                   cmd);
            return false;
        }
        snprintf(lbt_lxd_socket, sizeof(lbt_lxd_socket), "%s", last + 7);
    }
    if (!lbt_path_exists(lbt_lxd_socket)) {
        printf("%s: SKIP: no LXD socket at %s; the lxd variant was not tested\n", prog,
               lbt_lxd_socket);
        return false;
    }
    snprintf(lbt_lxd_socket_set, sizeof(lbt_lxd_socket_set), "lxd.socket=%s", lbt_lxd_socket);
    return true;
}

/* provider.name = lxd through member a's socket; the instance label derives from the state
 * dir, so daemons (and their instances) never mix. */
static void lbt_variant_lxd_prepare(struct lbt_daemon *d, const char **argv, int *n)
{
    (void)d;
    ck_assert_msg(lbt_lxd_socket_set[0], "lxd variant: no LXD cluster set up");
    argv[(*n)++] = "--set";
    argv[(*n)++] = "provider.name=lxd";
    argv[(*n)++] = "--set";
    argv[(*n)++] = lbt_lxd_socket_set;
    argv[(*n)++] = "--set";
    argv[(*n)++] = "lxd.default_image=" LBT_VARIANT_LXD_IMAGE;
}

const char *lbt_variant_lxd_socket(void)
{
    return lbt_lxd_socket[0] ? lbt_lxd_socket : NULL;
}

static json_t *lbt_lxd_once(const char *method, const char *path, const char *body)
{
    struct lbt_engine_body b = {0};
    struct curl_slist *hdrs = NULL;
    char url[1024];
    json_t *j = NULL;
    CURL *h;

    if (!lbt_lxd_socket[0])
        return NULL;
    h = curl_easy_init();
    ck_assert_ptr_nonnull(h);
    snprintf(url, sizeof(url), "http://lxd%s", path);
    curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, lbt_lxd_socket);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    if (body) {
        hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    }
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, lbt_engine_on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 90L);
    if (curl_easy_perform(h) == CURLE_OK && b.data)
        j = json_loads(b.data, 0, NULL);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    free(b.data);
    return j;
}

int lbt_lxd_cluster(const char *args)
{
    const char *script = getenv("LENDBOX_E2E_LXD_CLUSTER");
    const char *src = getenv("LENDBOX_SRCDIR") ? getenv("LENDBOX_SRCDIR") : ".";
    char cmd[1024];
    int st;

    if (script && *script)
        snprintf(cmd, sizeof(cmd), "'%s' %s >&2", script, args);
    else
        snprintf(cmd, sizeof(cmd), "'%s/scripts/lxd-cluster' %s >&2", src, args);
    st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void lbt_lxd_location(const char *id, char *buf, size_t size)
{
    char path[256];
    json_t *j;

    snprintf(path, sizeof(path), "/1.0/instances/%s", id);
    j = lbt_lxd_get(path);
    ck_assert_ptr_nonnull(j);
    snprintf(buf, size, "%s",
             json_string_value(json_object_get(json_object_get(j, "metadata"), "location")) ?: "");
    json_decref(j);
}

json_t *lbt_lxd_get(const char *path)
{
    return lbt_lxd_once("GET", path, NULL);
}

json_t *lbt_lxd_request(const char *method, const char *path, const char *body)
{
    json_t *j = lbt_lxd_once(method, path, body), *w;
    const char *op = json_string_value(json_object_get(j, "operation"));
    char wait[600];
    size_t base;

    if (!op || !*op)
        return j;
    base = strcspn(op, "?");
    snprintf(wait, sizeof(wait), "%.*s/wait?timeout=60%s%s", (int)base, op, op[base] ? "&" : "",
             op[base] ? op + base + 1 : "");
    w = lbt_lxd_once("GET", wait, NULL);
    json_decref(j);
    return w;
}

/* lxd: instances whose name contains needle or whose user.lendbox.instance is needle;
 * running_only: Running or Frozen. */
static int lbt_lxd_count_instances(const char *needle, bool running_only)
{
    json_t *j = lbt_lxd_get("/1.0/instances?recursion=1"), *c;
    size_t i;
    int n = -1;

    if (json_is_array(json_object_get(j, "metadata"))) {
        n = 0;
        json_array_foreach(json_object_get(j, "metadata"), i, c) {
            const char *name = json_string_value(json_object_get(c, "name")) ?: "";
            const char *inst = json_string_value(
                json_object_get(json_object_get(c, "config"), "user.lendbox.instance"));
            const char *st = json_string_value(json_object_get(c, "status")) ?: "";

            if (!strstr(name, needle) && !(inst && strcmp(inst, needle) == 0))
                continue;
            if (running_only && strcmp(st, "Running") != 0 && strcmp(st, "Frozen") != 0)
                continue;
            n++;
        }
    }
    json_decref(j);
    return n;
}

/* The pool variant: every daemon keeps a small warm pool of the default class (every test
 * passes with a pool configured). Small, so that refills do not swamp two cores; a test
 * that sets pool.size itself wins. */
static void lbt_variant_pool_prepare(struct lbt_daemon *d, const char **argv, int *n)
{
    (void)d;
    argv[(*n)++] = "--set";
    argv[(*n)++] = "pool.size=" LBT_VARIANT_POOL_SIZE;
}

/* The lxd-pool variant: the lxd variant's daemons, each with the pool variant's warm pool, and
 * the supervisor bound from the host (lxd.supervise_host_path: the cluster's members run on
 * this host) rather than pushed, as a deployment that wants fast seeds runs it. */
static void lbt_variant_lxd_pool_prepare(struct lbt_daemon *d, const char **argv, int *n)
{
    static char setting[PATH_MAX + 64];
    const char *sup = getenv("LENDBOX_SUPERVISE");
    char path[PATH_MAX];

    lbt_variant_lxd_prepare(d, argv, n);
    lbt_variant_pool_prepare(d, argv, n);
    ck_assert_msg(sup && realpath(sup, path), "lxd-pool variant: no $LENDBOX_SUPERVISE");
    snprintf(setting, sizeof(setting), "lxd.supervise_host_path=%s", path);
    argv[(*n)++] = "--set";
    argv[(*n)++] = setting;
}

static const struct lbt_variant_def lbt_variants[] = {
    {"host", "host", NULL, NULL, NULL},
    {"image", LBT_VARIANT_IMAGE, lbt_variant_image_prepare, NULL, NULL},
    {"docker", LBT_VARIANT_DOCKER_IMAGE, lbt_variant_docker_prepare, lbt_variant_docker_setup,
     lbt_variant_docker_teardown},
    {"lxd", LBT_VARIANT_LXD_IMAGE, lbt_variant_lxd_prepare, lbt_variant_lxd_setup, NULL},
    {"pool", "host", lbt_variant_pool_prepare, NULL, NULL},
    {"lxd-pool", LBT_VARIANT_LXD_IMAGE, lbt_variant_lxd_pool_prepare, lbt_variant_lxd_setup, NULL},
};

static const struct lbt_variant_def *lbt_variant_def(void)
{
    const char *want = getenv("LENDBOX_E2E_VARIANT");

    if (!want || !*want)
        want = "host";
    for (size_t i = 0; i < sizeof(lbt_variants) / sizeof(lbt_variants[0]); i++)
        if (strcmp(lbt_variants[i].name, want) == 0)
            return &lbt_variants[i];
    fprintf(stderr, "harness: unknown LENDBOX_E2E_VARIANT '%s' (have:", want);
    for (size_t i = 0; i < sizeof(lbt_variants) / sizeof(lbt_variants[0]); i++)
        fprintf(stderr, " %s", lbt_variants[i].name);
    fprintf(stderr, ")\n");
    exit(2);
}

const char *lbt_variant(void)
{
    return lbt_variant_def()->name;
}

bool lbt_variant_is(const char *name)
{
    const char *v = lbt_variant(), *dash = strchr(v, '-');
    size_t len = strlen(name);

    /* a combined variant ("lxd-pool") is each of its parts */
    if (strcmp(v, name) == 0)
        return true;
    return dash && len > 0 &&
           ((strncmp(v, name, len) == 0 && v + len == dash) || strcmp(dash + 1, name) == 0);
}

const char *lbt_variant_image(void)
{
    return lbt_variant_def()->default_image;
}

const char *lbt_variant_provider(void)
{
    return lbt_variant_is("docker") ? "docker" : lbt_variant_is("lxd") ? "lxd" : "local";
}

bool lbt_variant_engine(void)
{
    return lbt_variant_is("docker") || lbt_variant_is("lxd");
}

const char *lbt_variant_lacks(const char *capability)
{
    if (lbt_variant_is("lxd") && strcmp(capability, "sealed_receipt") == 0)
        return "the lxd provider has no fd passing (pass_fd): the harness supervisor's receipt "
               "is a file inside the instance (capability receipt_file), which the instance's "
               "own processes can forge";
    if (lbt_variant_is("lxd") && strcmp(capability, "exclusive") == 0)
        return "the lxd provider does not claim exclusive (the pushed supervisor and the receipt "
               "are files the instance's root can rewrite): an exclusive exec is 422";
    if ((lbt_variant_is("lxd") || lbt_variant_is("docker")) &&
        strcmp(capability, "trusted_view") == 0)
        return "the provider has no base-image view for graders (the container's root is the "
               "agent's): an exclusive exec without agent_root is 422";
    if (lbt_variant_is("lxd") && strcmp(capability, "user_names") == 0)
        return "LXD's exec takes numeric uids only";
    if (lbt_variant_is("lxd") && strcmp(capability, "disk_quota") == 0)
        return "the test cluster's storage pool is 'dir': no disk quotas (disk_mib is 422)";
    return NULL;
}

bool lbt_variant_on_host(void)
{
    return strcmp(lbt_variant_image(), "host") == 0;
}

void lbt_skip_note(const char *test, const char *why)
{
    fprintf(stderr, "SKIP %s on variant %s: %s\n", test, lbt_variant(), why);
}

/* ---------- the program's daemon registry ----------
 * Every daemon any process of a test program spawns (the runner's fixtures, a forked test, a
 * restart) is listed in a file the runner owns (lbt_run_suite): uid range, state dir, log. After
 * the suite the runner goes through the state dirs still there: a daemon still running on one is
 * stopped (SIGTERM: its shutdown sweep), and sandboxes still recorded in one are stopped by a
 * daemon started on it for that. So what a test ended half-way left (a Check timeout kills the
 * test with SIGKILL, no teardown runs; a daemon with lending.shutdown_sweep=no) is gone when
 * the program ends. Only the runner process reads it; every process appends (O_APPEND, one
 * write per line). */
static char lbt_registry_path[64];

/* ---- host-wide claims (harness.h) ---- */

#define LBT_MAX_CLAIMS 256
static struct {
    char kind[24];
    int index, fd;
} lbt_claims[LBT_MAX_CLAIMS];
static int lbt_n_claims;

/* Take index i of kind (flock, not waiting): its fd, or -1 when another process holds it. */
static int lbt_claim_one(const char *kind, int i)
{
    char path[128];
    int fd;

    snprintf(path, sizeof(path), LBT_CLAIM_DIR "/%s.%d", kind, i);
    fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    ck_assert_msg(fd >= 0, "cannot open the claim %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        ck_assert_msg(errno == EWOULDBLOCK, "flock %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

int lbt_claim(const char *kind, int count, int n, bool (*ok)(int first, int n))
{
    unsigned r = 0;
    int fds[64];

    ck_assert_msg(n >= 1 && n <= 64 && n <= count && strlen(kind) < sizeof(lbt_claims[0].kind),
                  "lbt_claim %s: bad arguments", kind);
    ck_assert_msg(lbt_n_claims + n <= LBT_MAX_CLAIMS, "lbt_claim: too many claims");
    if (mkdir(LBT_CLAIM_DIR, 0755) < 0)
        ck_assert_msg(errno == EEXIST, "mkdir " LBT_CLAIM_DIR ": %s", strerror(errno));
    if (getrandom(&r, sizeof(r), 0) != sizeof(r))
        r = (unsigned)getpid() * 2654435761u;
    for (int t = 0; t < count - n + 1; t++) {
        int first = (int)((r + (unsigned)t) % (unsigned)(count - n + 1)), k;

        for (k = 0; k < n; k++)
            if ((fds[k] = lbt_claim_one(kind, first + k)) < 0)
                break;
        if (k == n && (!ok || ok(first, n))) {
            for (k = 0; k < n; k++) {
                snprintf(lbt_claims[lbt_n_claims].kind, sizeof(lbt_claims[0].kind), "%s", kind);
                lbt_claims[lbt_n_claims].index = first + k;
                lbt_claims[lbt_n_claims++].fd = fds[k];
            }
            return first;
        }
        while (k-- > 0)
            close(fds[k]);
    }
    ck_abort_msg("no %d free %s claim(s) in " LBT_CLAIM_DIR " (of %d)", n, kind, count);
    return -1;
}

void lbt_release(const char *kind, int first, int n)
{
    for (int i = 0; i < lbt_n_claims;) {
        if (strcmp(lbt_claims[i].kind, kind) == 0 && lbt_claims[i].index >= first &&
            lbt_claims[i].index < first + n) {
            close(lbt_claims[i].fd);
            lbt_claims[i] = lbt_claims[--lbt_n_claims];
        } else {
            i++;
        }
    }
}

/* Uid blocks of 64 slots in [1526, 14966) slots: in [10^8, 10^9), apart from the single-uid
 * ranges older builds' tests take from [1.1 * 10^9, 2^31). */
#define LBT_UID_BLOCK_FIRST 1526u
#define LBT_UID_BLOCK_SLOTS 64u
#define LBT_UID_BLOCKS 210

/* No lendboxd claims a slot of blocks [first, first + n) (one left by a process that ended, or
 * a daemon that does not take its range from here). */
static bool lbt_uid_blocks_unused(int first, int n)
{
    for (unsigned s = 0; s < (unsigned)n * LBT_UID_BLOCK_SLOTS; s++) {
        char path[96];

        snprintf(path, sizeof(path), "/run/lendbox/slots/%u",
                 (LBT_UID_BLOCK_FIRST + (unsigned)first * LBT_UID_BLOCK_SLOTS + s) * 65536u);
        if (access(path, F_OK) == 0)
            return false;
    }
    return true;
}

unsigned lbt_claim_uid_range(unsigned slots)
{
    int n = (int)((slots + LBT_UID_BLOCK_SLOTS - 1) / LBT_UID_BLOCK_SLOTS);
    int first = lbt_claim("uid", LBT_UID_BLOCKS, n, lbt_uid_blocks_unused);

    return (LBT_UID_BLOCK_FIRST + (unsigned)first * LBT_UID_BLOCK_SLOTS) * 65536u;
}

void lbt_release_uid_range(unsigned uid_base, unsigned slots)
{
    unsigned first = uid_base / 65536u;

    if (first < LBT_UID_BLOCK_FIRST || uid_base % 65536u)
        return;
    lbt_release("uid", (int)((first - LBT_UID_BLOCK_FIRST) / LBT_UID_BLOCK_SLOTS),
                (int)((slots + LBT_UID_BLOCK_SLOTS - 1) / LBT_UID_BLOCK_SLOTS));
}

/* Append line to $LENDBOX_RUN_DIR/run.list, the run's list that tests/leftover-check reads
 * after make check (what processes are the run's: its daemons' uid ranges, its podman roots). */
static void lbt_run_list_add(const char *line)
{
    const char *dir = getenv("LENDBOX_RUN_DIR");
    char path[512];
    size_t len = strlen(line);
    int fd;

    if (!dir || !*dir)
        return;
    snprintf(path, sizeof(path), "%s/run.list", dir);
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, line, len) != (ssize_t)len)
        fprintf(stderr, "harness: cannot append to %s\n", path);
    if (fd >= 0)
        close(fd);
}

static void lbt_registry_add(const struct lbt_daemon *d)
{
    char line[3200];
    int fd, len;

    snprintf(line, sizeof(line), "daemon\t%s\t%u\t%u\n", d->state_dir, d->uid_base, d->uid_count);
    lbt_run_list_add(line);
    if (!lbt_registry_path[0])
        return;
    len = snprintf(line, sizeof(line), "%u\t%u\t%s\t%s\t%s\n", d->uid_base, d->uid_count,
                   d->state_dir, d->log_path, d->last_args);
    fd = open(lbt_registry_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    if (len > 0 && len < (int)sizeof(line) && write(fd, line, (size_t)len) != len)
        fprintf(stderr, "harness: cannot record a daemon in %s\n", lbt_registry_path);
    close(fd);
}

static bool lbt_has_sandbox_dirs(const struct lbt_daemon *d);
static void lbt_respawn_same(struct lbt_daemon *d);

/* Processes that are a live lendboxd on state_dir (its "--state-dir DIR" argument), up to max. */
static int lbt_daemons_on(const char *state_dir, pid_t *out, int max)
{
    DIR *dir = opendir("/proc");
    struct dirent *e;
    char want[300];
    int n = 0;

    if (!dir)
        return 0;
    snprintf(want, sizeof(want), "--state-dir %s ", state_dir);
    while ((e = readdir(dir)) && n < max) {
        char buf[4096];
        size_t len;

        if (e->d_name[0] < '1' || e->d_name[0] > '9' || !lbt_proc_cmdline(e->d_name, buf, 4000))
            continue;
        len = strlen(buf);
        buf[len] = ' ';
        buf[len + 1] = '\0';
        if (strstr(buf, "lendboxd") && strstr(buf, want) && lbt_pid_live(atoi(e->d_name)))
            out[n++] = atoi(e->d_name);
    }
    closedir(dir);
    return n;
}

/* One state dir of the registry: stop what still runs on it, sweep what it still records. */
static void lbt_registry_sweep_one(struct lbt_daemon *d)
{
    char cmd[1024];
    pid_t pids[8];
    int n = lbt_daemons_on(d->state_dir, pids, 8);

    for (int i = 0; i < n; i++) {
        fprintf(stderr, "harness: lendboxd %d on %s still runs after the suite; stopping it\n",
                (int)pids[i], d->state_dir);
        kill(pids[i], SIGTERM);
    }
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 1200 && lbt_pid_live(pids[i]); k++)
            lbt_sleep_ms(50);
        if (lbt_pid_live(pids[i]))
            kill(pids[i], SIGKILL);
    }
    if (lbt_has_sandbox_dirs(d)) {
        fprintf(stderr, "harness: sandboxes left in %s after the suite; stopping them\n",
                d->state_dir);
        lbt_respawn_same(d);
        lbt_daemon_stop(d);
    }
    if (!getenv("LBT_KEEP")) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s' '%s.pid'", d->state_dir, d->log_path,
                 d->state_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "harness: could not remove %s\n", d->state_dir);
    }
}

/* The sweep is a test of its own (lbt_registry_sweep runs it): Check's assertions, which the
 * harness's functions use, work only inside a test. */
START_TEST(lbt_registry_sweep_test)
{
    char path[sizeof(lbt_registry_path)], **lines = NULL, *line = NULL, seen[64][256];
    size_t cap = 0, n_lines = 0;
    int n_seen = 0;
    FILE *f;

    snprintf(path, sizeof(path), "%s", lbt_registry_path);
    lbt_registry_path[0] = '\0'; /* the sweep's own restarts are not recorded */
    f = fopen(path, "re");
    while (f && getline(&line, &cap, f) > 0) {
        lines = realloc(lines, (n_lines + 1) * sizeof(*lines));
        ck_assert_ptr_nonnull(lines);
        lines[n_lines++] = line;
        line = NULL;
        cap = 0;
    }
    free(line);
    if (f)
        fclose(f);
    /* the last spawn on a state dir says how it ran last */
    for (size_t k = n_lines; k-- > 0;) {
        struct lbt_daemon d = {0};
        char *state, *log, *args, *end;
        bool dup = false;

        lines[k][strcspn(lines[k], "\n")] = '\0';
        d.uid_base = (unsigned)strtoul(lines[k], &end, 10);
        d.uid_count = (unsigned)strtoul(end, &end, 10);
        state = *end == '\t' ? end + 1 : NULL;
        log = state ? strchr(state, '\t') : NULL;
        args = log ? strchr(log + 1, '\t') : NULL;
        if (!args)
            continue;
        *log++ = '\0';
        *args++ = '\0';
        for (int i = 0; i < n_seen && !dup; i++)
            dup = strcmp(seen[i], state) == 0;
        if (dup || strlen(state) >= sizeof(seen[0]))
            continue;
        if (n_seen < 64)
            snprintf(seen[n_seen++], sizeof(seen[0]), "%s", state);
        if (!lbt_path_exists(state))
            continue;
        snprintf(d.state_dir, sizeof(d.state_dir), "%s", state);
        snprintf(d.log_path, sizeof(d.log_path), "%s", log);
        snprintf(d.last_args, sizeof(d.last_args), "%s", args);
        lbt_registry_sweep_one(&d);
    }
    for (size_t k = 0; k < n_lines; k++)
        free(lines[k]);
    free(lines);
}
END_TEST

/* After the suite: sweep every state dir of the registry (in a forked test of a suite of its
 * own, named so that CK_RUN_SUITE/CK_RUN_CASE do not skip it); false when the sweep failed. */
static bool lbt_registry_sweep(void)
{
    Suite *s;
    TCase *tc;
    SRunner *sr;
    bool ok;

    if (!lbt_registry_path[0] || !lbt_path_exists(lbt_registry_path))
        return true;
    s = suite_create("lbt-sweep");
    tc = tcase_create("sweep");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, lbt_registry_sweep_test);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run(sr, "lbt-sweep", "sweep", CK_SILENT);
    ok = srunner_ntests_failed(sr) == 0;
    if (!ok)
        fprintf(stderr, "harness: the sweep after the suite failed (see above)\n");
    srunner_free(sr);
    unlink(lbt_registry_path);
    lbt_registry_path[0] = '\0';
    return ok;
}

/* d->last_args from extra (NULL-terminated, may be NULL). extra may point into d->last_args'
 * unpacked copy (lbt_respawn_same): packed through a local buffer. */
static void lbt_pack_args(struct lbt_daemon *d, const char *const *extra)
{
    char buf[sizeof(d->last_args)];
    size_t off = 0;

    buf[0] = '\0';
    for (int i = 0; extra && extra[i]; i++) {
        size_t len = strlen(extra[i]);

        if (strchr(extra[i], '\t') || off + len + 2 > sizeof(buf))
            break; /* cannot be kept: the clean-up restarts with what fits */
        memcpy(buf + off, extra[i], len);
        off += len;
        buf[off++] = '\t';
        buf[off] = '\0';
    }
    memcpy(d->last_args, buf, off + 1);
}

/* Restart d (stopped) with the extra arguments of its last spawn but its fault specs, and its
 * shutdown sweep on (the last setting wins), to stop the sandboxes it left. */
static void lbt_respawn_same(struct lbt_daemon *d)
{
    char buf[sizeof(d->last_args)], *p = buf, *tab;
    const char *argv[64];
    int n = 0;

    snprintf(buf, sizeof(buf), "%s", d->last_args);
    while (n < 61 && (tab = strchr(p, '\t'))) {
        *tab = '\0';
        if (n > 0 && !strcmp(argv[n - 1], "--set") && !strncmp(p, "faults.", 7))
            n--; /* no injected fault: the sweep must work */
        else if (strcmp(p, "--no-shutdown-sweep") != 0)
            argv[n++] = p;
        p = tab + 1;
    }
    argv[n++] = "--set";
    argv[n++] = "lending.shutdown_sweep=yes";
    argv[n] = NULL;
    lbt_daemon_restart(d, argv);
}

/* Does extra (NULL-terminated, may be NULL) hold "--set" followed by a setting with prefix? */
static bool lbt_args_set(const char *const *extra, const char *prefix)
{
    for (int i = 0; extra && extra[i] && extra[i + 1]; i++)
        if (strcmp(extra[i], "--set") == 0 && strncmp(extra[i + 1], prefix, strlen(prefix)) == 0)
            return true;
    return false;
}

static unsigned long lbt_spawn_nofile;

void lbt_set_daemon_fd_limit(unsigned long n)
{
    lbt_spawn_nofile = n;
}

static void lbt_spawn(struct lbt_daemon *d, const char *const *extra)
{
    const char *bin = getenv("LENDBOXD") ? getenv("LENDBOXD") : "build/lendboxd";
    const char *sup = getenv("LENDBOX_SUPERVISE");
    const char *argv[64 + LBT_VARIANT_MAX_ARGS];
    char listen_path[300], sup_set[512], uid_base[64], uid_count[64];
    bool own_base = false, own_count = false;
    pid_t parent;
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
    /* a test that gives the range itself (--set local.uid_base=N) has it, passed once, and d
     * says so (the harness's own value would be a dead argument, and d's range a wrong one) */
    for (int i = 0; extra && extra[i] && extra[i + 1]; i++) {
        if (strcmp(extra[i], "--set") != 0)
            continue;
        if (strncmp(extra[i + 1], "local.uid_base=", 15) == 0)
            d->uid_base = (unsigned)strtoul(extra[i + 1] + 15, NULL, 10), own_base = true;
        else if (strncmp(extra[i + 1], "local.uid_count=", 16) == 0)
            d->uid_count = (unsigned)strtoul(extra[i + 1] + 16, NULL, 10), own_count = true;
    }
    snprintf(uid_base, sizeof(uid_base), "local.uid_base=%u", d->uid_base);
    snprintf(uid_count, sizeof(uid_count), "local.uid_count=%u", d->uid_count);
    if (!own_base) {
        argv[n++] = "--set";
        argv[n++] = uid_base;
    }
    if (!own_count) {
        argv[n++] = "--set";
        argv[n++] = uid_count;
    }
    if (sup) {
        snprintf(sup_set, sizeof(sup_set), "local.supervise=%s", sup);
        argv[n++] = "--set";
        argv[n++] = sup_set;
    }
    if (lbt_variant_def()->prepare) {
        int before = n;

        lbt_variant_def()->prepare(d, argv, &n);
        ck_assert_int_le(n - before, LBT_VARIANT_MAX_ARGS);
    }
    for (int i = 0; extra && extra[i] && n < 62 + LBT_VARIANT_MAX_ARGS; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    lbt_pack_args(d, extra);
    fd = open(d->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    ck_assert_int_ge(fd, 0);
    lbt_registry_add(d);
    parent = getpid();
    d->pid = fork();
    ck_assert_int_ge(d->pid, 0);
    if (d->pid == 0) {
        /* Own process group: Check kills a forked test's group when the test ends (SIGKILL, so
         * the daemon would never sweep). Instead the daemon gets SIGTERM when the process that
         * started it ends, however it ends (a failed assertion, a Check timeout, the program
         * killed): it then runs its own bounded shutdown sweep (drain_timeout_s), which stops
         * its sandboxes and removes their cgroups, mounts, links, nft tables and slot claims. */
        setpgid(0, 0);
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent)
            _exit(125); /* the starter is already gone */
        dup2(fd, 1);
        dup2(fd, 2);
        if (lbt_spawn_nofile) {
            struct rlimit rl = {lbt_spawn_nofile, lbt_spawn_nofile};

            if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
                _exit(126);
        }
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(fd);
    lbt_write_pid_file(d);
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
            /* variant pool: the test's seeds find the pool full, so they take warm sandboxes */
            lbt_pool_settle(d);
            return;
        }
        lbt_sleep_ms(25);
    }
    ck_abort_msg("lendboxd never became ready (see %s)", d->log_path);
}

/* Daemons started by this process and not cleaned up yet: an unchecked fixture whose setup
 * fails after starting its daemon never runs its teardown, so they are cleaned up at exit
 * (only by the process that started them, not by the forked tests). */
#define LBT_MAX_DAEMONS 16
static struct lbt_daemon *lbt_live[LBT_MAX_DAEMONS];
static pid_t lbt_live_owner;

static void lbt_atexit_cleanup(void)
{
    if (getpid() != lbt_live_owner)
        return;
    for (int i = 0; i < LBT_MAX_DAEMONS; i++)
        if (lbt_live[i])
            lbt_daemon_cleanup(lbt_live[i]);
}

static void lbt_track(struct lbt_daemon *d, bool add)
{
    if (add && lbt_live_owner != getpid()) {
        memset(lbt_live, 0, sizeof(lbt_live));
        if (lbt_live_owner == 0)
            atexit(lbt_atexit_cleanup);
        lbt_live_owner = getpid();
    }
    for (int i = 0; i < LBT_MAX_DAEMONS; i++) {
        if (!add && lbt_live[i] == d)
            lbt_live[i] = NULL;
        if (add && !lbt_live[i]) {
            lbt_live[i] = d;
            return;
        }
    }
}

void lbt_daemon_start(struct lbt_daemon *d, const char *const *extra_args)
{
    char dir[] = "/tmp/lendbox-e2e-XXXXXX";

    ck_assert_ptr_nonnull(mkdtemp(dir));
    lbt_daemon_start_at(d, dir, NULL, extra_args);
}

void lbt_daemon_start_at(struct lbt_daemon *d, const char *state_dir, const char *log_path,
                         const char *const *extra_args)
{
    memset(d, 0, sizeof(*d));
    ck_assert_uint_lt(strlen(state_dir), sizeof(d->state_dir));
    snprintf(d->state_dir, sizeof(d->state_dir), "%s", state_dir);
    if (log_path)
        snprintf(d->log_path, sizeof(d->log_path), "%s", log_path);
    else
        snprintf(d->log_path, sizeof(d->log_path), "%s.log", d->state_dir);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    lbt_track(d, true);
    /* 64 slots of 65536 ids of its own (or as many as the test gives), unless the test gives
     * the range */
    d->uid_count = 64;
    for (int i = 0; extra_args && extra_args[i] && extra_args[i + 1]; i++)
        if (strcmp(extra_args[i], "--set") == 0 &&
            strncmp(extra_args[i + 1], "local.uid_count=", 16) == 0)
            d->uid_count = (unsigned)strtoul(extra_args[i + 1] + 16, NULL, 10);
    if (!lbt_args_set(extra_args, "local.uid_base=")) {
        d->uid_base = lbt_claim_uid_range(d->uid_count);
        d->uid_claimed = d->uid_count;
    }
    lbt_spawn(d, extra_args);
}

void lbt_daemon_restart(struct lbt_daemon *d, const char *const *extra_args)
{
    d->base_url[0] = '\0';
    lbt_spawn(d, extra_args);
}

/* Has pid ended? Reaps it when it is our child; a process that is not (a daemon a forked test
 * started, or the fixture's daemon seen from a forked test) counts as ended once it is gone
 * or a zombie. *status gets the wait status when it was reaped here. */
static bool lbt_pid_ended(pid_t pid, int *status)
{
    if (waitpid(pid, status, WNOHANG) == pid)
        return true;
    if (errno != ECHILD)
        return false;
    return !lbt_pid_live(pid);
}

int lbt_daemon_stop(struct lbt_daemon *d)
{
    return lbt_daemon_stop_within(d, 60);
}

int lbt_daemon_stop_within(struct lbt_daemon *d, int wait_s)
{
    int status = 0;

    if (d->pid <= 0)
        return 0;
    kill(d->pid, SIGTERM);
    for (int i = 0; i < wait_s * 20; i++) {
        errno = 0;
        status = -1;
        if (lbt_pid_ended(d->pid, &status)) {
            d->pid = 0;
            if (status == -1)
                return 0; /* not our child: its exit status is not ours to see */
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
    int status;

    if (d->pid <= 0)
        return;
    kill(d->pid, SIGKILL);
    for (int i = 0; i < 1000; i++) {
        errno = 0;
        if (lbt_pid_ended(d->pid, &status))
            break;
        lbt_sleep_ms(10);
    }
    d->pid = 0;
}

static bool lbt_has_sandbox_dirs(const struct lbt_daemon *d)
{
    char path[300];
    DIR *dir;
    struct dirent *e;
    bool any = false;

    snprintf(path, sizeof(path), "%s/sandboxes", d->state_dir);
    dir = opendir(path);
    if (!dir)
        return false;
    while (!any && (e = readdir(dir)))
        any = e->d_name[0] != '.';
    closedir(dir);
    return any;
}

void lbt_daemon_cleanup(struct lbt_daemon *d)
{
    char cmd[600];

    char pid_path[300];
    FILE *f;
    int other = 0;

    lbt_track(d, false);
    if (d->pid > 0)
        lbt_daemon_stop(d);
    /* A daemon (re)started by a forked test is not our child: stop it by its pid file. */
    snprintf(pid_path, sizeof(pid_path), "%s.pid", d->state_dir);
    f = d->state_dir[0] ? fopen(pid_path, "re") : NULL;
    if (f) {
        if (fscanf(f, "%d", &other) != 1)
            other = 0;
        fclose(f);
        unlink(pid_path);
    }
    if (other > 0 && lbt_pid_is_daemon(other, d->state_dir)) {
        kill(other, SIGTERM);
        for (int i = 0; i < 1200 && lbt_pid_is_daemon(other, d->state_dir); i++)
            lbt_sleep_ms(50);
        if (lbt_pid_is_daemon(other, d->state_dir))
            kill(other, SIGKILL);
    }
    /* Sandboxes left behind (a test failed half-way): a daemon on the same state dir adopts
     * them and its shutdown sweep stops them. */
    if (d->state_dir[0] && d->base_url[0] && lbt_has_sandbox_dirs(d)) {
        fprintf(stderr, "harness: sandboxes left in %s; stopping them\n", d->state_dir);
        lbt_respawn_same(d);
        lbt_daemon_stop(d);
        unlink(pid_path);
    }
    /* A sanitizer report in the daemon's log fails the test (make asan). */
    if (d->log_path[0]) {
        snprintf(cmd, sizeof(cmd),
                 "grep -q -E 'ERROR: (Address|Leak)Sanitizer|runtime error:' '%s'", d->log_path);
        if (system(cmd) == 0) {
            snprintf(cmd, sizeof(cmd),
                     "grep -A30 -E 'ERROR: (Address|Leak)Sanitizer|runtime error:' '%s' >&2",
                     d->log_path);
            (void)!system(cmd);
            ck_abort_msg("sanitizer report in %s", d->log_path);
        }
    }
    if (d->state_dir[0] && !getenv("LBT_KEEP")) {
        snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", d->state_dir, d->log_path);
        if (system(cmd) != 0)
            fprintf(stderr, "harness: could not remove %s\n", d->state_dir);
    }
    if (d->uid_claimed && d->pid <= 0) {
        lbt_release_uid_range(d->uid_base, d->uid_claimed);
        d->uid_claimed = 0;
    }
}

/* ---------- the shared fixture ----------
 * Check's fixtures take no argument: each registered fixture gets a slot, and a pair of
 * trampolines per slot hands the slot to lbt_fixture_setup/teardown. */
#define LBT_MAX_FIXTURES 16
static struct lbt_fixture lbt_fixtures[LBT_MAX_FIXTURES];
static int lbt_n_fixtures;

static void lbt_fixture_setup(const struct lbt_fixture *f)
{
    char dir[300];

    if (f->prepare)
        f->prepare();
    if (f->test_starts)
        return;
    if (f->state_parent) {
        snprintf(dir, sizeof(dir), "%s/lendbox-e2e-XXXXXX", f->state_parent);
        ck_assert_ptr_nonnull(mkdtemp(dir));
        lbt_daemon_start_at(f->d, dir, NULL, f->args);
    } else {
        lbt_daemon_start(f->d, f->args);
    }
    if (f->seed)
        f->seed();
}

static void lbt_fixture_teardown(const struct lbt_fixture *f)
{
    if (f->stop_clean)
        ck_assert_int_eq(lbt_daemon_stop(f->d), 0);
    lbt_daemon_cleanup(f->d);
    if (f->release)
        f->release();
}

#define LBT_FIXTURE_SLOT(i)                                                                        \
    static void lbt_fixture_setup_##i(void)                                                        \
    {                                                                                              \
        lbt_fixture_setup(&lbt_fixtures[i]);                                                       \
    }                                                                                              \
    static void lbt_fixture_teardown_##i(void)                                                     \
    {                                                                                              \
        lbt_fixture_teardown(&lbt_fixtures[i]);                                                    \
    }
LBT_FIXTURE_SLOT(0)
LBT_FIXTURE_SLOT(1)
LBT_FIXTURE_SLOT(2)
LBT_FIXTURE_SLOT(3)
LBT_FIXTURE_SLOT(4)
LBT_FIXTURE_SLOT(5)
LBT_FIXTURE_SLOT(6)
LBT_FIXTURE_SLOT(7)
LBT_FIXTURE_SLOT(8)
LBT_FIXTURE_SLOT(9)
LBT_FIXTURE_SLOT(10)
LBT_FIXTURE_SLOT(11)
LBT_FIXTURE_SLOT(12)
LBT_FIXTURE_SLOT(13)
LBT_FIXTURE_SLOT(14)
LBT_FIXTURE_SLOT(15)

static void (*const lbt_fixture_setups[LBT_MAX_FIXTURES])(void) = {
    lbt_fixture_setup_0,  lbt_fixture_setup_1,  lbt_fixture_setup_2,  lbt_fixture_setup_3,
    lbt_fixture_setup_4,  lbt_fixture_setup_5,  lbt_fixture_setup_6,  lbt_fixture_setup_7,
    lbt_fixture_setup_8,  lbt_fixture_setup_9,  lbt_fixture_setup_10, lbt_fixture_setup_11,
    lbt_fixture_setup_12, lbt_fixture_setup_13, lbt_fixture_setup_14, lbt_fixture_setup_15};
static void (*const lbt_fixture_teardowns[LBT_MAX_FIXTURES])(void) = {
    lbt_fixture_teardown_0,  lbt_fixture_teardown_1,  lbt_fixture_teardown_2,
    lbt_fixture_teardown_3,  lbt_fixture_teardown_4,  lbt_fixture_teardown_5,
    lbt_fixture_teardown_6,  lbt_fixture_teardown_7,  lbt_fixture_teardown_8,
    lbt_fixture_teardown_9,  lbt_fixture_teardown_10, lbt_fixture_teardown_11,
    lbt_fixture_teardown_12, lbt_fixture_teardown_13, lbt_fixture_teardown_14,
    lbt_fixture_teardown_15};

void lbt_fixture_add(TCase *tc, const struct lbt_fixture *f, bool shared)
{
    int i = lbt_n_fixtures;

    if (i >= LBT_MAX_FIXTURES || !f->d) {
        fprintf(stderr, "harness: lbt_fixture_add: %s\n",
                f->d ? "more than 16 fixtures" : "no daemon");
        abort();
    }
    lbt_fixtures[lbt_n_fixtures++] = *f;
    if (shared)
        tcase_add_unchecked_fixture(tc, lbt_fixture_setups[i], lbt_fixture_teardowns[i]);
    else
        tcase_add_checked_fixture(tc, lbt_fixture_setups[i], lbt_fixture_teardowns[i]);
}

void lbt_shared_daemon(TCase *tc, struct lbt_daemon *d, const char *const *args)
{
    struct lbt_fixture f = {.d = d, .args = args};

    lbt_fixture_add(tc, &f, true);
}

void lbt_test_daemon_cleanup(TCase *tc, struct lbt_daemon *d)
{
    struct lbt_fixture f = {.d = d, .test_starts = true};

    lbt_fixture_add(tc, &f, false);
}

struct lbt_sink {
    char *data;
    size_t len, cap;
};

static size_t lbt_write(char *p, size_t size, size_t n, void *user)
{
    struct lbt_sink *s = user;
    size_t add = size * n;

    if (s->len + add + 1 > s->cap) {
        /* geometric growth: a 64 MiB download must not be quadratic (ASan's realloc copies) */
        size_t cap = s->cap ? s->cap : 4096;
        char *q;

        while (cap < s->len + add + 1)
            cap *= 2;
        q = realloc(s->data, cap);
        if (!q)
            return 0;
        s->data = q;
        s->cap = cap;
    }
    memcpy(s->data + s->len, p, add);
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

struct lbt_upload {
    const char *data;
    size_t len, off;
};

static size_t lbt_read_body(char *p, size_t size, size_t n, void *user)
{
    struct lbt_upload *u = user;
    size_t want = size * n, left = u->len - u->off;

    if (want > left)
        want = left;
    if (want > 1000)
        want = 1000; /* several chunks */
    memcpy(p, u->data + u->off, want);
    u->off += want;
    return want;
}

void lbt_request_ex(struct lbt_daemon *d, const char *method, const char *path, const char *token,
                    const void *body, size_t body_len, const char *content_type,
                    const char *const *headers, bool chunked, struct lbt_resp *resp)
{
    CURL *c = curl_easy_init();
    struct curl_slist *hdrs = NULL;
    struct lbt_sink sink = {0};
    struct lbt_upload up = {body, body_len, 0};
    char url[32768], h[600];
    CURLcode cc;

    memset(resp, 0, sizeof(*resp));
    ck_assert_ptr_nonnull(c);
    snprintf(url, sizeof(url), "%s%s", d->base_url, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
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
    for (size_t i = 0; headers && headers[i]; i++)
        hdrs = curl_slist_append(hdrs, headers[i]);
    if (body) {
        snprintf(h, sizeof(h), "Content-Type: %s",
                 content_type ? content_type : "application/json");
        hdrs = curl_slist_append(hdrs, h);
        if (chunked) {
            curl_easy_setopt(c, CURLOPT_POST, 1L);
            curl_easy_setopt(c, CURLOPT_READFUNCTION, lbt_read_body);
            curl_easy_setopt(c, CURLOPT_READDATA, &up);
            hdrs = curl_slist_append(hdrs, "Transfer-Encoding: chunked");
        } else {
            curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
            curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
        }
    }
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
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

void lbt_request(struct lbt_daemon *d, const char *method, const char *path, const char *token,
                 const void *body, size_t body_len, const char *content_type, struct lbt_resp *resp)
{
    lbt_request_ex(d, method, path, token, body, body_len, content_type, NULL, false, resp);
}

void lbt_json(struct lbt_daemon *d, const char *method, const char *path, const char *token,
              const char *body_json, struct lbt_resp *resp)
{
    lbt_request(d, method, path, token, body_json, body_json ? strlen(body_json) : 0, NULL, resp);
}

void lbt_release_session(struct lbt_daemon *d, const char *rsid)
{
    struct lbt_resp r;
    char path[300];

    snprintf(path, sizeof(path), "/v1/sessions/%s/release", rsid);
    lbt_json(d, "POST", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "release %s: %ld %s", rsid, r.status, r.body);
    lbt_resp_free(&r);
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
    snprintf(body, sizeof(body), "{\"task_id\": \"%s\"%s%s}", task_id, extra_members ? ", " : "",
             extra_members ? extra_members : "");
    lbt_json(d, "POST", path, "", body, &r);
    ck_assert_msg(r.status == 200, "seed %s: status %ld body %s", rsid, r.status, r.body);
    lease = json_incref(r.json);
    lbt_resp_free(&r);
    ck_assert_ptr_nonnull(lease);
    return lease;
}

const char *lbt_error_code(const struct lbt_resp *resp)
{
    const char *code =
        json_string_value(json_object_get(json_object_get(resp->json, "error"), "code"));

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

/* How many /proc entries match(pid, ctx). */
static int lbt_count_procs_where(bool (*match)(const char *pid, const void *ctx), const void *ctx)
{
    DIR *dir = opendir("/proc");
    struct dirent *e;
    int n = 0;

    ck_assert_ptr_nonnull(dir);
    while ((e = readdir(dir)))
        if (e->d_name[0] >= '0' && e->d_name[0] <= '9' && match(e->d_name, ctx))
            n++;
    closedir(dir);
    return n;
}

/* The command line of pid, arguments joined by spaces, into buf; false if unreadable/empty. */
static bool lbt_proc_cmdline(const char *pid, char *buf, size_t size)
{
    char path[300];
    ssize_t len;
    int fd;

    snprintf(path, sizeof(path), "/proc/%s/cmdline", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    len = read(fd, buf, size - 1);
    close(fd);
    while (len > 0 && buf[len - 1] == '\0')
        len--;
    if (len <= 0)
        return false;
    for (ssize_t i = 0; i < len; i++)
        if (buf[i] == '\0')
            buf[i] = ' ';
    buf[len] = '\0';
    return true;
}

static bool lbt_match_uid(const char *pid, const void *ctx)
{
    uid_t u;

    return lbt_proc_uid(pid, &u) && u == *(const uid_t *)ctx;
}

int lbt_count_procs_of_uid(uid_t uid)
{
    return lbt_count_procs_where(lbt_match_uid, &uid);
}

/* see harness.h */
pid_t lbt_proc_ppid(pid_t pid)
{
    char path[64], buf[512];
    const char *p;
    ssize_t len;
    char state;
    int ppid;
    int fd;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    len = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (len <= 0)
        return 0;
    buf[len] = '\0';
    p = strrchr(buf, ')');
    if (!p || sscanf(p + 1, " %c %d", &state, &ppid) != 2)
        return 0;
    return ppid;
}

bool lbt_uid_claimed(uid_t uid)
{
    for (int i = 0; i < lbt_n_claims; i++) {
        uid_t lo;

        if (strcmp(lbt_claims[i].kind, "uid") != 0)
            continue;
        lo = (LBT_UID_BLOCK_FIRST + (unsigned)lbt_claims[i].index * LBT_UID_BLOCK_SLOTS) * 65536u;
        if (uid >= lo && uid - lo < LBT_UID_BLOCK_SLOTS * 65536u)
            return true;
    }
    return false;
}

bool lbt_proc_cgroup_has(pid_t pid, const char *needle)
{
    char path[64], buf[4096];
    ssize_t len;
    int fd;

    snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    len = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (len <= 0)
        return false;
    buf[len] = '\0';
    return strstr(buf, needle) != NULL;
}

char *lbt_proc_read(const char *path, size_t *len_out)
{
    size_t len = 0, cap = 0;
    char *text = NULL, chunk[4096];
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return NULL;
    while ((n = read(fd, chunk, sizeof(chunk))) > 0) {
        if (len + (size_t)n + 1 > cap) {
            char *grown = realloc(text, (len + (size_t)n + 1) * 2);

            if (!grown) {
                n = -1;
                break;
            }
            text = grown;
            cap = (len + (size_t)n + 1) * 2;
        }
        memcpy(text + len, chunk, (size_t)n);
        len += (size_t)n;
    }
    close(fd);
    if (n < 0 || !text) {
        free(text);
        return NULL;
    }
    text[len] = '\0';
    if (len_out)
        *len_out = len;
    return text;
}

/* The test program's own pid (Check runs each test in a child of it, and fixtures start daemons
 * in either). */
static pid_t lbt_main_pid;

__attribute__((constructor)) static void lbt_main_pid_init(void)
{
    lbt_main_pid = getpid();
}

static bool lbt_proc_status_uid(const char *pid, uid_t *uid, bool *zombie);

/* On an engine variant, the text that the command line of an engine process of this run holds
 * and another run's never does: podman's conmon names its root (-b DIR/root/...), an LXD
 * instance's monitor ("[lxc monitor] DIR/m/containers NAME") and forkexec name the cluster's
 * directory. NULL when the variant is not an engine or the place is unknown. */
static const char *lbt_engine_marker(char *buf, size_t size)
{
    const char *dir;

    if (lbt_variant_is("docker")) {
        dir = getenv("LENDBOX_E2E_PODMAN_DIR");
        if (!dir || !dir[0])
            return NULL;
        snprintf(buf, size, "%s/root/", dir);
        return buf;
    }
    if (!lbt_variant_is("lxd"))
        return NULL;
    dir = getenv("LXD_CLUSTER_DIR");
    if (dir && dir[0]) {
        snprintf(buf, size, "%s/", dir);
    } else {
        const char *i = getenv("LXD_CLUSTER_INDEX");

        if (i && i[0] && strcmp(i, "0") != 0)
            snprintf(buf, size, "/var/lib/lendbox-lxd-test-%s/", i);
        else
            snprintf(buf, size, "/var/lib/lendbox-lxd-test/");
    }
    return buf;
}

bool lbt_proc_of_run(const char *pid)
{
    pid_t self = getpid(), p = (pid_t)atoi(pid);
    char mbuf[PATH_MAX + 16], cmd[4096], name[32];
    const char *marker = lbt_engine_marker(mbuf, sizeof(mbuf));
    uid_t u;
    bool z;

    if (lbt_variant_engine() && !marker)
        return true;
    if (!lbt_variant_engine() && lbt_proc_status_uid(pid, &u, &z) && lbt_uid_claimed(u))
        return true;
    for (int depth = 0; depth < 64 && p > 1; depth++) {
        if (p == self || p == lbt_main_pid)
            return true;
        snprintf(name, sizeof(name), "%d", (int)p);
        if (marker && lbt_proc_cmdline(name, cmd, sizeof(cmd)) && strstr(cmd, marker))
            return true;
        p = lbt_proc_ppid(p);
    }
    return false;
}

static bool lbt_match_cmdline_has(const char *pid, const void *ctx)
{
    char buf[4096];

    return lbt_proc_cmdline(pid, buf, sizeof(buf)) && strstr(buf, ctx) && lbt_proc_of_run(pid);
}

int lbt_count_procs_cmdline(const char *needle)
{
    return lbt_count_procs_where(lbt_match_cmdline_has, needle);
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

/* ---------- additions for the acceptance tests ---------- */

struct lbt_async {
    pthread_t thread;
    struct lbt_daemon *d;
    char *method, *path, *token, *body;
    struct lbt_resp resp;
    atomic_bool done;
};

static void *lbt_async_main(void *arg)
{
    struct lbt_async *a = arg;

    lbt_json(a->d, a->method, a->path, a->token, a->body, &a->resp);
    atomic_store(&a->done, true);
    return NULL;
}

bool lbt_async_done(struct lbt_async *a)
{
    return atomic_load(&a->done);
}

struct lbt_async *lbt_async_json(struct lbt_daemon *d, const char *method, const char *path,
                                 const char *token, const char *body_json)
{
    struct lbt_async *a = calloc(1, sizeof(*a));

    ck_assert_ptr_nonnull(a);
    a->d = d;
    a->method = strdup(method);
    a->path = strdup(path);
    a->token = token ? strdup(token) : NULL;
    a->body = body_json ? strdup(body_json) : NULL;
    ck_assert_int_eq(pthread_create(&a->thread, NULL, lbt_async_main, a), 0);
    return a;
}

void lbt_async_join(struct lbt_async *a, struct lbt_resp *resp)
{
    pthread_join(a->thread, NULL);
    *resp = a->resp;
    free(a->method);
    free(a->path);
    free(a->token);
    free(a->body);
    free(a);
}

void lbt_exec(struct lbt_daemon *d, const char *sandbox_id, const char *token,
              const char *body_json, struct lbt_resp *resp)
{
    char path[300];

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", sandbox_id);
    lbt_json(d, "POST", path, token, body_json, resp);
}

json_t *lbt_exec_ok(struct lbt_daemon *d, const char *sandbox_id, const char *token,
                    const char *body_json)
{
    struct lbt_resp r;
    json_t *out;

    lbt_exec(d, sandbox_id, token, body_json, &r);
    ck_assert_msg(r.status == 200 && r.json, "exec %s: status %ld body %.2000s", body_json,
                  r.status, r.body);
    lbt_assert_request_id(&r, NULL);
    out = json_incref(r.json);
    lbt_resp_free(&r);
    return out;
}

char *lbt_sh(struct lbt_daemon *d, const char *sandbox_id, const char *command)
{
    json_t *body = json_pack("{s:s}", "command", command);
    char *text = json_dumps(body, JSON_COMPACT);
    json_t *res = lbt_exec_ok(d, sandbox_id, "", text);
    json_t *rc = json_object_get(res, "return_code");
    const char *out = json_string_value(json_object_get(res, "stdout"));
    char *dump = json_dumps(res, JSON_COMPACT), *copy;

    ck_assert_msg(json_is_integer(rc) && json_integer_value(rc) == 0 && out,
                  "command %s failed: %.2000s", command, dump ? dump : "?");
    copy = strdup(out);
    free(dump);
    json_decref(res);
    json_decref(body);
    free(text);
    return copy;
}

bool lbt_sh_until(struct lbt_daemon *d, const char *sandbox_id, const char *command,
                  const char *want, int tries)
{
    for (int i = 0; i < tries; i++) {
        char *out = lbt_sh(d, sandbox_id, command);
        bool got = strcmp(out, want) == 0;

        free(out);
        if (got)
            return true;
        lbt_sleep_ms(100);
    }
    return false;
}

static void lbt_files_path(const char *sandbox_id, const char *path, const char *mode, char *buf,
                           size_t size)
{
    char *esc = curl_easy_escape(NULL, path, 0);

    ck_assert_ptr_nonnull(esc);
    snprintf(buf, size, "/v1/sandboxes/%s/files?path=%s%s%s", sandbox_id, esc, mode ? "&mode=" : "",
             mode ? mode : "");
    curl_free(esc);
}

void lbt_file_put(struct lbt_daemon *d, const char *sandbox_id, const char *token, const char *path,
                  const char *mode, const void *data, size_t len, struct lbt_resp *resp)
{
    char url[4096];

    lbt_files_path(sandbox_id, path, mode, url, sizeof(url));
    lbt_request(d, "PUT", url, token, data ? data : "", len, "application/octet-stream", resp);
}

void lbt_file_get(struct lbt_daemon *d, const char *sandbox_id, const char *token, const char *path,
                  struct lbt_resp *resp)
{
    char url[4096];

    lbt_files_path(sandbox_id, path, NULL, url, sizeof(url));
    lbt_request(d, "GET", url, token, NULL, 0, NULL, resp);
}

void lbt_assert_request_id(const struct lbt_resp *resp, const char *want)
{
    ck_assert_msg(resp->request_id[0], "no X-Request-Id in the response (headers: %s)",
                  resp->headers);
    if (want)
        ck_assert_str_eq(resp->request_id, want);
}

void lbt_assert_error(const struct lbt_resp *resp, long status, const char *code)
{
    json_t *err;
    const char *msg;

    ck_assert_msg(resp->status == status, "expected %ld %s, got %ld: %.1000s", status, code,
                  resp->status, resp->body);
    ck_assert_msg(resp->json != NULL, "error body is not JSON: %.1000s", resp->body);
    ck_assert_msg(strstr(resp->headers, "application/json") != NULL,
                  "error is not application/json: %s", resp->headers);
    ck_assert_int_eq(json_object_size(resp->json), 1);
    err = json_object_get(resp->json, "error");
    ck_assert_msg(json_is_object(err), "no error object: %s", resp->body);
    ck_assert_int_eq(json_object_size(err), 2);
    ck_assert_str_eq(lbt_error_code(resp), code);
    msg = json_string_value(json_object_get(err, "message"));
    ck_assert_msg(msg && *msg, "error without a message: %s", resp->body);
    lbt_assert_request_id(resp, NULL);
}

json_t *lbt_list_sandboxes(struct lbt_daemon *d)
{
    struct lbt_resp r;
    json_t *arr;

    lbt_json(d, "GET", "/v1/sandboxes", "", NULL, &r);
    ck_assert_msg(r.status == 200, "GET /v1/sandboxes: %ld %s", r.status, r.body);
    arr = json_object_get(r.json, "sandboxes");
    ck_assert_msg(json_is_array(arr), "GET /v1/sandboxes: %s", r.body);
    json_incref(arr);
    lbt_resp_free(&r);
    return arr;
}

json_t *lbt_find_record(json_t *sandboxes, const char *id)
{
    size_t i;
    json_t *v;

    json_array_foreach(sandboxes, i, v) {
        const char *sid = json_string_value(json_object_get(v, "sandbox_id"));

        if (sid && !strcmp(sid, id))
            return v;
    }
    return NULL;
}

json_t *lbt_record(struct lbt_daemon *d, const char *id)
{
    json_t *all = lbt_list_sandboxes(d), *r = lbt_find_record(all, id);

    json_incref(r);
    json_decref(all);
    return r;
}

bool lbt_ids_has(const struct lbt_ids *s, const char *id)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->id[i], id) == 0)
            return true;
    return false;
}

void lbt_records_in_state(struct lbt_daemon *d, const char *state, struct lbt_ids *out)
{
    char path[128];
    struct lbt_resp r;
    size_t i;
    json_t *v;

    snprintf(path, sizeof(path), "/v1/sandboxes?state=%s", state);
    lbt_json(d, "GET", path, "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    out->n = 0;
    json_array_foreach(json_object_get(r.json, "sandboxes"), i, v) {
        ck_assert_str_eq(json_string_value(json_object_get(v, "state")), state);
        if (out->n < LBT_IDS_MAX)
            snprintf(out->id[out->n++], sizeof(out->id[0]), "%s",
                     json_string_value(json_object_get(v, "sandbox_id")));
    }
    lbt_resp_free(&r);
}

time_t lbt_parse_time(const char *rfc3339)
{
    struct tm tm = {0};

    ck_assert_ptr_nonnull(rfc3339);
    ck_assert_ptr_nonnull(strptime(rfc3339, "%Y-%m-%dT%H:%M:%S", &tm));
    return timegm(&tm);
}

long lbt_metric(struct lbt_daemon *d, const char *name)
{
    struct lbt_resp r;
    long v = -1;
    const char *p;

    lbt_json(d, "GET", "/metrics", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    p = strstr(r.body, name);
    while (p && p != r.body && p[-1] != '\n')
        p = strstr(p + 1, name);
    if (p)
        v = strtol(p + strlen(name), NULL, 10);
    lbt_resp_free(&r);
    return v;
}

int lbt_count_records_of_session(json_t *sandboxes, const char *rsid)
{
    size_t i;
    json_t *v;
    int n = 0;

    json_array_foreach(sandboxes, i, v) {
        const char *s = json_string_value(json_object_get(v, "resources_session_id"));

        if (s && !strcmp(s, rsid))
            n++;
    }
    return n;
}

void lbt_assert_healthy(struct lbt_daemon *d)
{
    struct lbt_resp r;

    lbt_json(d, "GET", "/healthz", NULL, NULL, &r);
    ck_assert_msg(r.status == 200, "/healthz: %ld %s", r.status, r.body);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "status")), "ok");
    lbt_resp_free(&r);
}

json_t *lbt_read_descriptor(struct lbt_daemon *d, const char *sandbox_id)
{
    char path[400];

    if (snprintf(path, sizeof(path), "%s/sandboxes/%s/descriptor.json", d->state_dir, sandbox_id) >=
        (int)sizeof(path))
        return NULL;
    return json_load_file(path, 0, NULL);
}

static int lbt_cgroup_walk(const char *dir, const char *needle, int depth)
{
    DIR *d;
    struct dirent *e;
    int n = 0;

    if (depth > 16 || !(d = opendir(dir)))
        return 0;
    while ((e = readdir(d))) {
        char sub[4096];
        struct stat st;

        if (e->d_name[0] == '.')
            continue;
        snprintf(sub, sizeof(sub), "%s/%s", dir, e->d_name);
        if (lstat(sub, &st) < 0 || !S_ISDIR(st.st_mode))
            continue;
        if (strstr(e->d_name, needle))
            n++;
        n += lbt_cgroup_walk(sub, needle, depth + 1);
    }
    closedir(d);
    return n;
}

int lbt_count_cgroup_dirs(const char *needle)
{
    return lbt_cgroup_walk("/sys/fs/cgroup", needle, 0);
}

/* Real uid and whether pid is a zombie, from /proc/PID/status. */
static bool lbt_proc_status_uid(const char *pid, uid_t *uid, bool *zombie)
{
    char path[300], buf[4096];
    const char *p;
    ssize_t len;
    unsigned u;
    int fd;

    snprintf(path, sizeof(path), "/proc/%s/status", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    len = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (len <= 0)
        return false;
    buf[len] = '\0';
    p = strstr(buf, "\nUid:");
    if (!p || sscanf(p + 5, "%u", &u) != 1)
        return false;
    *uid = u;
    p = strstr(buf, "\nState:");
    *zombie = p && (strncmp(p + 7, "\tZ", 2) == 0 || strncmp(p + 7, "\tX", 2) == 0);
    return true;
}

static bool lbt_match_live_uid(const char *pid, const void *ctx)
{
    uid_t u;
    bool z;

    return lbt_proc_status_uid(pid, &u, &z) && u == *(const uid_t *)ctx && !z;
}

int lbt_count_live_procs_of_uid(uid_t uid)
{
    return lbt_count_procs_where(lbt_match_live_uid, &uid);
}

static bool lbt_match_cmdline_is(const char *pid, const void *ctx)
{
    char buf[4096];

    return lbt_proc_cmdline(pid, buf, sizeof(buf)) && !strcmp(buf, ctx) && lbt_proc_of_run(pid);
}

int lbt_count_procs_exact(const char *cmdline)
{
    return lbt_count_procs_where(lbt_match_cmdline_is, cmdline);
}

struct lbt_uid_cmdline {
    uid_t uid;
    const char *cmdline;
};

static bool lbt_match_uid_cmdline(const char *pid, const void *ctx)
{
    const struct lbt_uid_cmdline *want = ctx;
    char buf[4096];
    uid_t u;
    bool z;

    return lbt_proc_status_uid(pid, &u, &z) && !z && u == want->uid &&
           lbt_proc_cmdline(pid, buf, sizeof(buf)) && !strcmp(buf, want->cmdline) &&
           lbt_proc_of_run(pid);
}

int lbt_count_procs_of_uid_exact(uid_t uid, const char *cmdline)
{
    struct lbt_uid_cmdline want = {uid, cmdline};

    return lbt_count_procs_where(lbt_match_uid_cmdline, &want);
}

int lbt_log_count(const struct lbt_daemon *d, const char *needle)
{
    FILE *f = fopen(d->log_path, "re");
    char *line = NULL;
    size_t cap = 0;
    int n = 0;

    if (!f)
        return 0;
    while (getline(&line, &cap, f) > 0)
        n += strstr(line, needle) != NULL;
    free(line);
    fclose(f);
    return n;
}

void lbt_wait_accepted(const struct lbt_daemon *d)
{
    const char *hostport = d->base_url + strlen("http://"), *colon = strrchr(hostport, ':');
    char want_local[16], line[512];
    struct in_addr addr;
    char host[64];

    ck_assert_msg(colon && (size_t)(colon - hostport) < sizeof(host), "base url %s", d->base_url);
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = '\0';
    ck_assert_int_eq(inet_pton(AF_INET, host, &addr), 1);
    snprintf(want_local, sizeof(want_local), "%08X:%04X", addr.s_addr, atoi(colon + 1));
    for (;;) {
        FILE *f = fopen("/proc/net/tcp", "re");
        bool found = false, empty = false;

        ck_assert_ptr_nonnull(f);
        while (!found && fgets(line, sizeof(line), f)) {
            char local[64], remote[64];
            unsigned st, txq, rxq;

            /* the listening socket (state 0A): rx_queue is its accept queue's length */
            if (sscanf(line, " %*d: %63s %63s %x %x:%x", local, remote, &st, &txq, &rxq) == 5 &&
                st == 0x0A && !strcmp(local, want_local)) {
                found = true;
                empty = rxq == 0;
            }
        }
        fclose(f);
        ck_assert_msg(found, "no listening socket %s in /proc/net/tcp", want_local);
        if (empty)
            return;
        lbt_sleep_ms(10);
    }
}

bool lbt_request_read(int fd)
{
    struct sockaddr_in me, peer;
    socklen_t len = sizeof(me);
    char line[512], want_local[16], want_remote[16];
    bool found = false, drained = false;
    FILE *f;

    if (getsockname(fd, (struct sockaddr *)&me, &len) < 0 || me.sin_family != AF_INET)
        return false;
    len = sizeof(peer);
    if (getpeername(fd, (struct sockaddr *)&peer, &len) < 0)
        return false;
    /* /proc/net/tcp: the daemon's end is local = its address, remote = ours (hex, the address
     * as the kernel stores it, the port in host order) */
    snprintf(want_local, sizeof(want_local), "%08X:%04X", peer.sin_addr.s_addr,
             ntohs(peer.sin_port));
    snprintf(want_remote, sizeof(want_remote), "%08X:%04X", me.sin_addr.s_addr, ntohs(me.sin_port));
    f = fopen("/proc/net/tcp", "re");
    if (!f)
        return false;
    while (!found && fgets(line, sizeof(line), f)) {
        char local[64], remote[64];
        unsigned st, txq, rxq;

        if (sscanf(line, " %*d: %63s %63s %x %x:%x", local, remote, &st, &txq, &rxq) == 5 &&
            !strcmp(local, want_local) && !strcmp(remote, want_remote)) {
            found = true;
            drained = rxq == 0;
        }
    }
    fclose(f);
    return found && drained;
}

static int lbt_cmp_uid(const void *a, const void *b)
{
    uid_t x = *(const uid_t *)a, y = *(const uid_t *)b;

    return x < y ? -1 : x > y;
}

int lbt_uids_in_range(uid_t lo, uid_t hi, uid_t *out, int max)
{
    DIR *dir = opendir("/proc");
    struct dirent *e;
    int n = 0;

    ck_assert_ptr_nonnull(dir);
    while ((e = readdir(dir))) {
        uid_t u;
        bool z, seen = false;

        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        if (!lbt_proc_status_uid(e->d_name, &u, &z) || z || u < lo || u >= hi)
            continue;
        for (int i = 0; i < n && !seen; i++)
            seen = out[i] == u;
        if (!seen && n < max)
            out[n++] = u;
    }
    closedir(dir);
    qsort(out, (size_t)n, sizeof(*out), lbt_cmp_uid);
    return n;
}

/* ---------- warm pools (variant pool) ---------- */

void lbt_pool_settle(struct lbt_daemon *d)
{
    double until = lbt_now() + 60, stable_since = lbt_now();
    long size = strtol(LBT_VARIANT_POOL_SIZE, NULL, 10);
    int last_warm = -1, last_starting = -1;

    if (!lbt_variant_is("pool") || d->pid <= 0)
        return;
    for (;;) {
        json_t *all = lbt_list_sandboxes(d), *v;
        int warm = 0, starting = 0;
        size_t i;

        json_array_foreach(all, i, v) {
            const char *state = json_string_value(json_object_get(v, "state"));

            if (state && strcmp(state, "warm") == 0)
                warm++;
            else if (state && strcmp(state, "starting") == 0 &&
                     json_is_null(json_object_get(v, "resources_session_id")))
                starting++;
        }
        json_decref(all);
        if (warm != last_warm || starting != last_starting) {
            last_warm = warm;
            last_starting = starting;
            stable_since = lbt_now();
        }
        /* full, or nothing changed for 2 s (no room, failing or stalled creations): the
         * refill threads look at least once a second */
        if ((starting == 0 && warm >= size) || lbt_now() - stable_since > 2 || lbt_now() > until)
            return;
        lbt_sleep_ms(50);
    }
}

json_t *lbt_list_sandboxes_but_pool(struct lbt_daemon *d)
{
    json_t *all = lbt_list_sandboxes(d), *out;
    size_t i;
    json_t *v;

    if (!lbt_variant_is("pool"))
        return all;
    out = json_array();
    ck_assert_ptr_nonnull(out);
    json_array_foreach(all, i, v) {
        if (!json_is_null(json_object_get(v, "resources_session_id")))
            json_array_append(out, v);
    }
    json_decref(all);
    return out;
}

int lbt_warm_ids(struct lbt_daemon *d, char ids[][LBT_ID_MAX], int max)
{
    json_t *all, *v;
    size_t i;
    int n = 0;

    if (d->pid <= 0) /* not running: nothing is warm any more (or nothing answers) */
        return 0;
    all = lbt_list_sandboxes(d);
    json_array_foreach(all, i, v) {
        const char *state = json_string_value(json_object_get(v, "state"));

        if (n < max && state && strcmp(state, "warm") == 0)
            snprintf(ids[n++], LBT_ID_MAX, "%s",
                     json_string_value(json_object_get(v, "sandbox_id")));
    }
    json_decref(all);
    return n;
}

bool lbt_is_warm(struct lbt_daemon *d, const char *id)
{
    char ids[64][LBT_ID_MAX];
    int n = lbt_warm_ids(d, ids, 64);

    for (int i = 0; i < n; i++)
        if (strcmp(ids[i], id) == 0)
            return true;
    return false;
}

int lbt_lent_uids(struct lbt_daemon *d, uid_t lo, uid_t hi, uid_t *out, int max)
{
    char ids[64][LBT_ID_MAX];
    uid_t warm[64];
    int n_ids = lbt_warm_ids(d, ids, 64), n_warm = 0, n, k = 0;

    for (int i = 0; i < n_ids; i++) {
        json_t *desc = lbt_read_descriptor(d, ids[i]);

        if (desc && json_is_integer(json_object_get(desc, "uid")))
            warm[n_warm++] = (uid_t)json_integer_value(json_object_get(desc, "uid"));
        json_decref(desc);
    }
    n = lbt_uids_in_range(lo, hi, out, max);
    for (int i = 0; i < n; i++) {
        bool is_warm = false;

        for (int j = 0; j < n_warm && !is_warm; j++)
            is_warm = out[i] >= warm[j] && out[i] - warm[j] < 65536u; /* its slot */
        if (!is_warm)
            out[k++] = out[i];
    }
    return k;
}

long lbt_proc_status_kb(pid_t pid, const char *field)
{
    char path[64], line[256];
    size_t flen = strlen(field);
    long v = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    f = fopen(path, "re");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, field, flen) && line[flen] == ':') {
            v = strtol(line + flen + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

static const char lbt_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *lbt_b64_encode(const void *data, size_t len)
{
    const unsigned char *p = data;
    char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;

    ck_assert_ptr_nonnull(out);
    for (size_t i = 0; i < len; i += 3) {
        unsigned v = (unsigned)p[i] << 16;

        if (i + 1 < len)
            v |= (unsigned)p[i + 1] << 8;
        if (i + 2 < len)
            v |= p[i + 2];
        *o++ = lbt_b64[(v >> 18) & 63];
        *o++ = lbt_b64[(v >> 12) & 63];
        *o++ = i + 1 < len ? lbt_b64[(v >> 6) & 63] : '=';
        *o++ = i + 2 < len ? lbt_b64[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

unsigned char *lbt_b64_decode(const char *text, size_t *len_out)
{
    size_t n = strlen(text), o = 0;
    unsigned char *out;

    if (n % 4)
        return NULL;
    out = malloc(n / 4 * 3 + 1);
    ck_assert_ptr_nonnull(out);
    for (size_t i = 0; i < n; i += 4) {
        unsigned v = 0;
        int pad = 0;

        for (int k = 0; k < 4; k++) {
            const char *c = strchr(lbt_b64, text[i + k]);

            v <<= 6;
            if (text[i + k] == '=' && i + 4 == n && k >= 2) {
                pad++;
            } else if (!text[i + k] || !c || pad) {
                free(out);
                return NULL;
            } else {
                v |= (unsigned)(c - lbt_b64);
            }
        }
        out[o++] = (unsigned char)(v >> 16);
        if (pad < 2)
            out[o++] = (unsigned char)(v >> 8);
        if (pad < 1)
            out[o++] = (unsigned char)v;
    }
    *len_out = o;
    return out;
}

double lbt_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void lbt_fill_random(void *buf, size_t len, unsigned seed)
{
    unsigned char *p = buf;
    unsigned long long x = 0x9e3779b97f4a7c15ULL ^ seed;

    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (unsigned char)(x >> 24);
    }
}

int lbt_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    int failed;

    if (!lbt_variant_is("host"))
        fprintf(stderr, "harness: variant %s (seeds run on image '%s'%s)\n", lbt_variant(),
                lbt_variant_image(),
                lbt_variant_is("pool") ? ", pool.size=" LBT_VARIANT_POOL_SIZE : "");
    if (lbt_variant_def()->setup && !lbt_variant_def()->setup(program_invocation_short_name)) {
        srunner_free(sr);
        return EXIT_SUCCESS;
    }
    snprintf(lbt_registry_path, sizeof(lbt_registry_path), "/tmp/lbt-daemons-%d.list",
             (int)getpid());
    unlink(lbt_registry_path);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (!lbt_registry_sweep())
        failed++;
    if (lbt_variant_def()->teardown)
        lbt_variant_def()->teardown();
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
