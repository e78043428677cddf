/*
 * docker_env.h - support for the docker-provider e2e tests (test_docker*.c): a private podman
 * API service (tests/podman-service: runc, cgroupfs, storage under its own temp dir, the test
 * image built from the local busybox-static package), daemons configured with
 * provider.name = docker against it, and direct questions to the engine (which containers
 * of an instance exist). Header-only (static functions): each test program includes it once.
 *
 * Real parts only: the real engine API (podman's Docker-compatible service), the real daemon.
 * Real Docker Engine is not installable on this machine; these tests run on podman only.
 */
#ifndef LBT_DOCKER_ENV_H
#define LBT_DOCKER_ENV_H

#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static char dk_dir[256];  /* the podman service's temp dir */
static char dk_sock[300]; /* its socket */

/* Run tests/podman-service CMD on dk_dir; returns its exit status. */
static __attribute__((unused)) int dk_service(const char *cmd)
{
    char line[1024];
    const char *src = getenv("LENDBOX_SRCDIR");
    int st;

    snprintf(line, sizeof(line), "'%s/tests/podman-service' %s '%s'", src ? src : ".", cmd, dk_dir);
    st = system(line);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

/* Start the service for this test program; false (with a printed SKIP) when podman cannot
 * run here. */
static __attribute__((unused)) bool dk_setup(const char *prog)
{
    snprintf(dk_dir, sizeof(dk_dir), "/tmp/lbt-podman-%d-XXXXXX", (int)getpid());
    if (!mkdtemp(dk_dir)) {
        printf("%s: SKIP: cannot make a temp dir for podman\n", prog);
        return false;
    }
    snprintf(dk_sock, sizeof(dk_sock), "%s/podman.sock", dk_dir);
    if (dk_service("start") != 0) {
        printf("%s: SKIP: podman cannot run here (see the message above); the docker provider "
               "was not tested\n",
               prog);
        dk_service("stop");
        return false;
    }
    return true;
}

static __attribute__((unused)) void dk_teardown(void)
{
    char line[600];

    dk_service("stop");
    snprintf(line, sizeof(line), "rm -rf '%s' 2>/dev/null", dk_dir);
    if (system(line) != 0) {
        /* leftovers of a vfs storage are harmless in /tmp */
    }
}

/* SIGKILL the podman service (containers keep running, as they do when an engine dies). */
static __attribute__((unused)) void dk_kill_service(void)
{
    char path[400], buf[32] = "";
    FILE *f;

    snprintf(path, sizeof(path), "%s/service.pid", dk_dir);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(buf, sizeof(buf), f));
    fclose(f);
    ck_assert_int_eq(kill((pid_t)atoi(buf), SIGKILL), 0);
    lbt_sleep_ms(200);
}

static __attribute__((unused)) void dk_restart_service(void)
{
    ck_assert_int_eq(dk_service("restart-service"), 0);
}

struct dk_body {
    char *data;
    size_t len;
};

static __attribute__((unused)) size_t dk_on_body(char *p, size_t s, size_t n, void *arg)
{
    struct dk_body *b = arg;
    char *grown = realloc(b->data, b->len + s * n + 1);

    if (!grown)
        return 0;
    b->data = grown;
    memcpy(b->data + b->len, p, s * n);
    b->len += s * n;
    b->data[b->len] = '\0';
    return s * n;
}

/* GET path from the engine (directly, not through lendbox); the parsed JSON (caller decrefs),
 * NULL if the engine does not answer. */
static __attribute__((unused)) json_t *dk_engine_get(const char *path)
{
    struct dk_body b = {0};
    char url[1024];
    json_t *j = NULL;
    CURL *h = curl_easy_init();

    snprintf(url, sizeof(url), "http://d%s", path);
    curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, dk_sock);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, dk_on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
    if (curl_easy_perform(h) == CURLE_OK && b.data)
        j = json_loads(b.data, 0, NULL);
    curl_easy_cleanup(h);
    free(b.data);
    return j;
}

/* Containers (any state) labelled with instance; -1 if the engine does not answer. */
static __attribute__((unused)) int dk_count_containers(const char *instance)
{
    char filter[256], path[512], *enc;
    json_t *j;
    int n;

    snprintf(filter, sizeof(filter), "{\"label\":[\"io.lendbox.instance=%s\"]}", instance);
    enc = curl_easy_escape(NULL, filter, 0);
    snprintf(path, sizeof(path), "/v1.41/containers/json?all=true&filters=%s", enc);
    curl_free(enc);
    j = dk_engine_get(path);
    n = json_is_array(j) ? (int)json_array_size(j) : -1;
    json_decref(j);
    return n;
}

/* Wait up to ms for the instance to have want containers; returns the last count. */
static __attribute__((unused)) int dk_wait_containers(const char *instance, int want, long ms)
{
    int n = -1;

    for (long t = 0; t <= ms; t += 100) {
        n = dk_count_containers(instance);
        if (n == want)
            break;
        lbt_sleep_ms(100);
    }
    return n;
}

/* A daemon on the docker provider, instance label inst (unique per test), extra args. */
struct dk_daemon {
    struct lbt_daemon d;
    char inst[64];
    char args[16][400];
    const char *argv[40];
};

static __attribute__((unused)) void dk_args(struct dk_daemon *x, const char *tag,
                                            const char *const *extra)
{
    int n = 0, a = 0;

    snprintf(x->inst, sizeof(x->inst), "lbt%d%s", (int)getpid(), tag);
    snprintf(x->args[a], sizeof(x->args[a]), "provider.name=docker");
    x->argv[n++] = "--set", x->argv[n++] = x->args[a++];
    snprintf(x->args[a], sizeof(x->args[a]), "docker.socket=%s", dk_sock);
    x->argv[n++] = "--set", x->argv[n++] = x->args[a++];
    snprintf(x->args[a], sizeof(x->args[a]), "docker.default_image=lbtest:latest");
    x->argv[n++] = "--set", x->argv[n++] = x->args[a++];
    snprintf(x->args[a], sizeof(x->args[a]), "docker.instance=%s", x->inst);
    x->argv[n++] = "--set", x->argv[n++] = x->args[a++];
    for (int i = 0; extra && extra[i] && n < 38; i++)
        x->argv[n++] = extra[i];
    x->argv[n] = NULL;
}

static __attribute__((unused)) void dk_start(struct dk_daemon *x, const char *tag,
                                             const char *const *extra)
{
    dk_args(x, tag, extra);
    lbt_daemon_start(&x->d, x->argv);
}

static __attribute__((unused)) void dk_restart(struct dk_daemon *x, const char *tag,
                                               const char *const *extra)
{
    dk_args(x, tag, extra);
    lbt_daemon_restart(&x->d, x->argv);
}

#endif
