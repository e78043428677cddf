/*
 * test_images.c - the image store: images built on this machine from the
 * busybox-static package (tests/images/make-test-image), nothing from a registry.
 *
 * - `lendboxd image import` from a docker-save tarball, an OCI archive and an OCI layout;
 *   importing the same image again unpacks nothing ("already stored") and leaves the stored
 *   tree byte-identical; `image list` shows names, digests and sizes; `image rm` removes the
 *   name and, with its last name, the tree; bad names, registry sources and unknown images
 *   are refused
 * - a seed naming an imported image runs on it (the image's /etc/os-release, not the host's);
 *   `image rm` is refused while the sandbox is live and works after its release
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static char img_dir[64]; /* made by make-test-image */
static char state[64];   /* a state dir for the subcommand-only tests */

static void build_image(void)
{
    char cmd[512];

    snprintf(img_dir, sizeof(img_dir), "/tmp/lbt-img-%d", (int)getpid());
    snprintf(cmd, sizeof(cmd), "%s/tests/images/make-test-image %s lbt-marker-%d >/dev/null",
             getenv("LENDBOX_SRCDIR"), img_dir, (int)getpid());
    ck_assert_msg(system(cmd) == 0, "make-test-image failed");
}

static void setup(void)
{
    build_image();
    snprintf(state, sizeof(state), "/tmp/lbt-imgstate-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(state));
}

static void teardown(void)
{
    char cmd[256];

    snprintf(cmd, sizeof(cmd), "rm -rf %s %s", img_dir, state);
    (void)system(cmd);
}

/* Run `lendboxd -s state_dir image ARGS`; *out gets stdout+stderr (caller frees); returns the
 * exit status. */
static int image_cli(const char *state_dir, const char *args, char **out)
{
    char cmd[1024], buf[4096];
    size_t n;
    FILE *p;
    int st;

    snprintf(cmd, sizeof(cmd), "%s -s %s image %s 2>&1", getenv("LENDBOXD"), state_dir, args);
    p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    n = fread(buf, 1, sizeof(buf) - 1, p);
    buf[n] = '\0';
    st = pclose(p);
    *out = strdup(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* sha256 over every path, mode, owner and content of a tree */
static char *tree_sum(const char *dir)
{
    char cmd[512], buf[128] = "";
    FILE *p;

    snprintf(cmd, sizeof(cmd),
             "cd %s && find . -printf '%%p %%m %%U %%G %%l\\n' | sort | sha256sum; "
             "find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum",
             dir);
    p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    ck_assert(fread(buf, 1, sizeof(buf) - 1, p) > 64);
    pclose(p);
    return strdup(buf);
}

static void assert_has(const char *text, const char *needle)
{
    ck_assert_msg(strstr(text, needle), "'%s' not in: %s", needle, text);
}

START_TEST(test_import_list_rm)
{
    char args[512], path[256], *out, *sum1, *sum2, digest[80];
    struct stat st;

    /* docker-save tarball */
    snprintf(args, sizeof(args), "import %s/image.tar busy", img_dir);
    ck_assert_int_eq(image_cli(state, args, &out), 0);
    assert_has(out, "busy sha256:");
    ck_assert_ptr_null(strstr(out, "already stored"));
    ck_assert_int_eq(sscanf(strstr(out, "busy sha256:") + 5, "%79s", digest), 1);
    free(out);
    snprintf(path, sizeof(path), "%s/images/busy", state);
    sum1 = tree_sum(path);
    snprintf(path, sizeof(path), "%s/images/busy/etc/os-release", state);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_uid, 0); /* owned as the image says, not by the importer */

    /* into a state dir no daemon has made yet */
    snprintf(path, sizeof(path), "%s/fresh", state);
    snprintf(args, sizeof(args), "import %s/image.tar busy", img_dir);
    ck_assert_int_eq(image_cli(path, args, &out), 0);
    free(out);
    snprintf(path, sizeof(path), "%s/fresh/images/busy/etc/os-release", state);
    ck_assert(lbt_path_exists(path));

    /* again: nothing unpacked, the tree unchanged */
    snprintf(args, sizeof(args), "import docker-archive:%s/image.tar busy", img_dir);
    ck_assert_int_eq(image_cli(state, args, &out), 0);
    assert_has(out, "(already stored)");
    assert_has(out, digest);
    free(out);
    snprintf(path, sizeof(path), "%s/images/busy", state);
    sum2 = tree_sum(path);
    ck_assert_str_eq(sum1, sum2);
    free(sum2);

    /* OCI archive and OCI layout: the same OCI image, one tree for both names */
    snprintf(args, sizeof(args), "import oci-archive:%s/image.oci.tar busy-oci", img_dir);
    ck_assert_int_eq(image_cli(state, args, &out), 0);
    ck_assert_ptr_null(strstr(out, "already stored"));
    free(out);
    snprintf(args, sizeof(args), "import %s/layout busy-layout", img_dir);
    ck_assert_int_eq(image_cli(state, args, &out), 0);
    assert_has(out, "(already stored)");
    free(out);

    ck_assert_int_eq(image_cli(state, "list", &out), 0);
    assert_has(out, "busy sha256:");
    assert_has(out, "busy-layout sha256:");
    assert_has(out, "busy-oci sha256:");
    free(out);

    /* refused: bad names, registry sources, missing sources, unknown images */
    snprintf(args, sizeof(args), "import %s/image.tar host", img_dir);
    ck_assert_int_eq(image_cli(state, args, &out), 1);
    assert_has(out, "invalid image name");
    free(out);
    snprintf(args, sizeof(args), "import %s/image.tar ../x", img_dir);
    ck_assert_int_eq(image_cli(state, args, &out), 1);
    free(out);
    ck_assert_int_eq(image_cli(state, "import docker://debian:12 deb", &out), 1);
    assert_has(out, "unsupported image source");
    free(out);
    ck_assert_int_eq(image_cli(state, "import /nonexistent/image.tar x", &out), 1);
    free(out);
    snprintf(args, sizeof(args), "import %s/layout/index.json bad", img_dir);
    ck_assert_int_eq(image_cli(state, args, &out), 1);
    free(out);
    ck_assert_int_eq(image_cli(state, "rm nope", &out), 1);
    assert_has(out, "no image 'nope'");
    free(out);

    /* no half import is left behind */
    snprintf(args, sizeof(args), "ls -A %s/images/.store/tmp | wc -l | grep -qx 0", state);
    ck_assert_int_eq(system(args), 0);

    /* rm: the name goes; the shared tree stays until its last name goes */
    ck_assert_int_eq(image_cli(state, "rm busy-oci", &out), 0);
    free(out);
    snprintf(path, sizeof(path), "%s/images/busy-layout/etc/os-release", state);
    ck_assert(lbt_path_exists(path));
    ck_assert_int_eq(image_cli(state, "rm busy-layout", &out), 0);
    free(out);
    ck_assert_int_eq(image_cli(state, "rm busy", &out), 0);
    free(out);
    ck_assert_int_eq(image_cli(state, "list", &out), 0);
    ck_assert_str_eq(out, "");
    free(out);
    snprintf(args, sizeof(args), "ls -A %s/images/.store/sha256 | wc -l | grep -qx 0", state);
    ck_assert_int_eq(system(args), 0);
    free(sum1);
}
END_TEST

START_TEST(test_seed_on_image_and_rm_in_use)
{
    struct lbt_daemon d;
    char args[512], *out, *text, sbx[64];
    json_t *lease;
    struct lbt_resp r;

    LBT_SKIP_ON_VARIANT("image", "asserts the exact list of a fresh image store, and the variant "
                                 "links its own image into every daemon's store");
    lbt_daemon_start(&d, NULL);
    snprintf(args, sizeof(args), "import %s/image.tar busy", img_dir);
    ck_assert_int_eq(image_cli(d.state_dir, args, &out), 0);
    free(out);

    /* unknown image: 404 image_not_found, nothing lent */
    lbt_json(&d, "POST", "/v1/sessions/rs-noimg/seed", "",
             "{\"task_id\": \"t\", \"image\": \"no-such-image\"}", &r);
    lbt_assert_error(&r, 404, "image_not_found");
    lbt_resp_free(&r);
    lbt_json(&d, "GET", "/v1/sessions/rs-noimg", "", NULL, &r);
    ck_assert_int_eq(r.status, 404);
    lbt_resp_free(&r);

    lease = lbt_seed(&d, "rs-img", "task-img", "\"image\": \"busy\"");
    ck_assert_str_eq(json_string_value(json_object_get(lease, "image")), "busy");
    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    text = lbt_sh(&d, sbx, "cat /etc/os-release");
    snprintf(args, sizeof(args), "ID=lbt-marker-%d", (int)getpid());
    assert_has(text, args);
    free(text);

    ck_assert_int_eq(image_cli(d.state_dir, "rm busy", &out), 1);
    assert_has(out, "in use");
    free(out);
    /* the same over HTTP: listed, DELETE refused while in use */
    lbt_json(&d, "GET", "/v1/images", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    {
        json_t *imgs = json_object_get(r.json, "images"), *img = json_array_get(imgs, 0);

        ck_assert_int_eq(json_array_size(imgs), 1);
        ck_assert_str_eq(json_string_value(json_object_get(img, "name")), "busy");
        ck_assert_int_eq(strncmp(json_string_value(json_object_get(img, "digest")), "sha256:", 7),
                         0);
        ck_assert_int_gt(json_integer_value(json_object_get(img, "size_bytes")), 1000000);
        /* RFC 3339 UTC, as every timestamp of the API */
        ck_assert_int_eq(strlen(json_string_value(json_object_get(img, "created_at"))), 20);
        ck_assert_int_eq(json_string_value(json_object_get(img, "created_at"))[19], 'Z');
    }
    lbt_resp_free(&r);
    lbt_request(&d, "DELETE", "/v1/images/busy", "", NULL, 0, NULL, &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);
    lbt_request(&d, "GET", "/v1/images", NULL, NULL, 0, NULL, &r);
    ck_assert_int_eq(r.status, 401);
    lbt_resp_free(&r);
    ck_assert_int_eq(image_cli(d.state_dir, "list", &out), 0);
    assert_has(out, "busy sha256:");
    free(out);

    lbt_json(&d, "POST", "/v1/sessions/rs-img/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    lbt_request(&d, "DELETE", "/v1/images/busy", "", NULL, 0, NULL, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
    lbt_request(&d, "DELETE", "/v1/images/busy", "", NULL, 0, NULL, &r);
    lbt_assert_error(&r, 404, "image_not_found");
    lbt_resp_free(&r);
    lbt_json(&d, "GET", "/v1/images", "", NULL, &r);
    ck_assert_int_eq(json_array_size(json_object_get(r.json, "images")), 0);
    lbt_resp_free(&r);
    ck_assert_int_eq(image_cli(d.state_dir, "list", &out), 0);
    ck_assert_str_eq(out, "");
    free(out);
    lbt_daemon_cleanup(&d);
}
END_TEST

START_TEST(test_interrupted_import)
{
    char cmd[1024], *out;
    struct lbt_daemon d;
    pid_t pid;
    int st;

    LBT_SKIP_ON_VARIANT("image", "asserts that a daemon's start leaves a fresh image store "
                                 "empty, and the variant links its own image into it");

    /* a failure right before publishing: nothing named, nothing stored, nothing left */
    snprintf(cmd, sizeof(cmd),
             "LENDBOX_FAULTS=image.publish=fail %s -s %s image import %s/image.tar busy "
             ">/dev/null 2>&1",
             getenv("LENDBOXD"), state, img_dir);
    st = system(cmd);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    ck_assert_int_eq(image_cli(state, "list", &out), 0);
    ck_assert_str_eq(out, "");
    free(out);
    snprintf(cmd, sizeof(cmd),
             "test -z \"$(find %s/images/.store/tmp %s/images/.store/sha256 -mindepth 1)\"", state,
             state);
    ck_assert_int_eq(system(cmd), 0);

    /* kill -9 while unpacked but not published: no half image visible; the daemon's start
     * removes what the import left */
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char src[128];

        snprintf(src, sizeof(src), "%s/image.tar", img_dir);
        setenv("LENDBOX_FAULTS", "image.publish=delay:60000", 1);
        execl(getenv("LENDBOXD"), "lendboxd", "-s", state, "image", "import", src, "busy",
              (char *)NULL);
        _exit(127);
    }
    snprintf(cmd, sizeof(cmd), "ls %s/images/.store/tmp/*/entry/image.json >/dev/null 2>&1", state);
    for (int i = 0; i < 400 && system(cmd) != 0; i++)
        lbt_sleep_ms(50);
    ck_assert_int_eq(system(cmd), 0); /* unpacked, waiting to publish */
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    ck_assert_int_eq(image_cli(state, "list", &out), 0);
    ck_assert_str_eq(out, "");
    free(out);
    lbt_daemon_start_at(&d, state, NULL, NULL);
    snprintf(cmd, sizeof(cmd),
             "test -z \"$(find %s/images/.store/tmp %s/images/.store/sha256 -mindepth 1)\"", state,
             state);
    ck_assert_int_eq(system(cmd), 0);
    /* and an import afterwards works */
    snprintf(cmd, sizeof(cmd), "import %s/image.tar busy", img_dir);
    ck_assert_int_eq(image_cli(state, cmd, &out), 0);
    free(out);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* mounts of the host's mount table whose line contains needle */
static int count_mounts(const char *needle)
{
    char line[8192];
    FILE *f = fopen("/proc/self/mountinfo", "r");
    int n = 0;

    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

static void seed_on(struct lbt_daemon *d, const char *rsid, const char *extra, char *sbx,
                    size_t size)
{
    json_t *lease = lbt_seed(d, rsid, "task-img", extra);

    snprintf(sbx, size, "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
}

START_TEST(test_writable_root)
{
    struct lbt_daemon d;
    char args[512], path[512], host_marker[128], a[64], b[64], *out, *text, *before, *after;
    json_t *res;
    FILE *f;

    lbt_daemon_start(&d, NULL);
    snprintf(args, sizeof(args), "import %s/image.tar busy", img_dir);
    ck_assert_int_eq(image_cli(d.state_dir, args, &out), 0);
    free(out);
    snprintf(path, sizeof(path), "%s/images/busy", d.state_dir);
    before = tree_sum(path);
    /* a host-only file under the host's /root */
    snprintf(host_marker, sizeof(host_marker), "/root/lbt-host-marker-%d", (int)getpid());
    f = fopen(host_marker, "w");
    ck_assert_ptr_nonnull(f);
    fputs("host\n", f);
    fclose(f);

    seed_on(&d, "rs-img-a", "\"image\": \"busy\"", a, sizeof(a));
    seed_on(&d, "rs-img-b", "\"image\": \"busy\"", b, sizeof(b));
    /* the image's root, owned by the sandbox's root; no host file */
    text = lbt_sh(&d, a, "stat -c %u /etc/os-release /bin/busybox; ls -A /root; echo end");
    ck_assert_str_eq(text, "0\n0\nend\n");
    free(text);
    /* setuid bits and device nodes of the image grant nothing: / is nosuid, nodev; the
     * store itself is root's alone */
    text = lbt_sh(&d, a, "grep ' / / ' /proc/self/mountinfo");
    ck_assert_msg(strstr(text, "nosuid") && strstr(text, "nodev"), "%s", text);
    free(text);
    {
        struct stat sst;
        char store[300];

        snprintf(store, sizeof(store), "%s/images", d.state_dir);
        ck_assert_int_eq(stat(store, &sst), 0);
        ck_assert_int_eq(sst.st_mode & 07777, 0700);
    }
    /* the image's Env and WorkingDir apply to exec; explicit env and cwd override them */
    text = lbt_sh(&d, a, "pwd; echo $LB_IMAGE_VAR; echo $PATH");
    snprintf(path, sizeof(path), "/srv\nlbt-marker-%d\n/usr/local/bin:/bin\n", (int)getpid());
    ck_assert_str_eq(text, path);
    free(text);
    res = lbt_exec_ok(&d, a, "",
                      "{\"command\": \"pwd; echo $LB_IMAGE_VAR\", \"cwd\": \"/workspace\", "
                      "\"env\": {\"LB_IMAGE_VAR\": \"mine\"}}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "/workspace\nmine\n");
    json_decref(res);
    snprintf(path, sizeof(path), "%s/images/busy", d.state_dir);
    /* apt-get-style writes into /usr/local/bin and /etc succeed as the sandbox's root */
    text = lbt_sh(&d, a,
                  "echo 'echo tool-ran' > /usr/local/bin/tool && chmod 755 /usr/local/bin/tool && "
                  "echo changed > /etc/os-release && echo new > /etc/new.conf && "
                  "rm /bin/ls && tool && cat /etc/os-release");
    ck_assert_str_eq(text, "tool-ran\nchanged\n");
    free(text);
    /* ... privately: the other sandbox on the same image sees the image */
    text = lbt_sh(&d, b,
                  "ls /usr/local/bin /etc/new.conf 2>&1; test -e /bin/ls && echo has-ls; "
                  "cat /etc/os-release");
    ck_assert_ptr_nonnull(strstr(text, "No such file"));
    ck_assert_ptr_nonnull(strstr(text, "has-ls"));
    snprintf(args, sizeof(args), "ID=lbt-marker-%d", (int)getpid());
    ck_assert_ptr_nonnull(strstr(text, args));
    free(text);
    /* the writable root and /workspace share one budget, resources.disk_mib: 100 MiB do not
     * fit in 64, nor do 40 in / and 40 more in /workspace */
    lbt_release_session(&d, "rs-img-b");
    seed_on(&d, "rs-img-c", "\"image\": \"busy\", \"resources\": {\"disk_mib\": 64}", b, sizeof(b));
    res = lbt_exec_ok(
        &d, b, "", "{\"command\": \"dd if=/dev/zero of=/big bs=1M count=100 2>&1; echo rc=$?\"}");
    text = (char *)json_string_value(json_object_get(res, "stdout"));
    ck_assert_msg(strstr(text, "No space left on device") && strstr(text, "rc=1"), "%s", text);
    json_decref(res);
    res = lbt_exec_ok(&d, b, "",
                      "{\"command\": \"rm /big; dd if=/dev/zero of=/big bs=1M count=40 2>/dev/null "
                      "&& echo root-ok; dd if=/dev/zero of=/workspace/big bs=1M count=40 2>&1; "
                      "echo rc=$?\"}");
    text = (char *)json_string_value(json_object_get(res, "stdout"));
    ck_assert_msg(strstr(text, "root-ok") && strstr(text, "No space left on device") &&
                      strstr(text, "rc=1"),
                  "%s", text);
    json_decref(res);
    /* ... and nobody else is affected: the other sandbox writes, the daemon answers */
    text = lbt_sh(&d, a, "dd if=/dev/zero of=/workspace/f bs=1M count=8 2>/dev/null && echo ok");
    ck_assert_str_eq(text, "ok\n");
    free(text);
    lbt_assert_healthy(&d);

    /* the daemon killed -9 and restarted: a release still unmounts everything */
    lbt_daemon_kill(&d);
    lbt_daemon_restart(&d, NULL);
    lbt_release_session(&d, "rs-img-a");
    lbt_release_session(&d, "rs-img-c");
    ck_assert_int_eq(count_mounts(d.state_dir), 0);
    after = tree_sum(path);
    ck_assert_str_eq(before, after); /* the image is byte-identical */
    free(before);
    free(after);
    unlink(host_marker);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* The whole file at path (malloc'd; *len its size). */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    ck_assert_msg(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc((size_t)n + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* POST /v1/images?name=NAME with the file at path as the body */
static void post_image(struct lbt_daemon *d, const char *name, const char *path, bool chunked,
                       struct lbt_resp *r)
{
    char url[256];
    size_t len;
    char *body = slurp(path, &len);

    snprintf(url, sizeof(url), "/v1/images?name=%s", name);
    lbt_request_ex(d, "POST", url, "", body, len, "application/x-tar", NULL, chunked, r);
    free(body);
}

/* how many entries a directory has (find -mindepth 1 -maxdepth 1) */
static int count_entries(const char *dir)
{
    char cmd[512], buf[32] = "";
    FILE *p;

    snprintf(cmd, sizeof(cmd), "find %s -mindepth 1 -maxdepth 1 | wc -l", dir);
    p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(fgets(buf, sizeof(buf), p));
    pclose(p);
    return atoi(buf);
}

/* Make OUT (a docker-archive, or an OCI archive with oci) from the test layout with umoci
 * config ARGS applied. */
static void variant_image(const char *config_args, const char *out, bool oci)
{
    char cmd[1024];

    snprintf(cmd, sizeof(cmd),
             "set -e; rm -rf %s/v; cp -a %s/layout %s/v; umoci config --image %s/v:img --tag v %s;"
             " skopeo --insecure-policy copy -q oci:%s/v:v %s:%s%s; rm -rf %s/v",
             img_dir, img_dir, img_dir, img_dir, config_args, img_dir,
             oci ? "oci-archive" : "docker-archive", out, oci ? ":v" : ":lbvariant:latest",
             img_dir);
    ck_assert_msg(system(cmd) == 0, "%s", cmd);
}

START_TEST(test_http_import)
{
    const char *args[] = {"--set", "limits.max_image_bytes=2097152", NULL};
    struct lbt_daemon d;
    struct lbt_resp r;
    char path[512], digest[80], tmp[600], *out;
    const char *created;

    lbt_daemon_start(&d, args);
    snprintf(tmp, sizeof(tmp), "%s/images/.store/tmp", d.state_dir);

    /* an OCI archive (1.4 MB): 201 with name, digest, size, created_at */
    snprintf(path, sizeof(path), "%s/image.oci.tar", img_dir);
    post_image(&d, "busy", path, false, &r);
    ck_assert_msg(r.status == 201, "%ld %s", r.status, r.body);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "name")), "busy");
    snprintf(digest, sizeof(digest), "%s", json_string_value(json_object_get(r.json, "digest")));
    ck_assert_int_eq(strlen(digest), 71);
    ck_assert_int_gt(json_integer_value(json_object_get(r.json, "size_bytes")), 1000000);
    created = json_string_value(json_object_get(r.json, "created_at"));
    ck_assert_msg(created && strlen(created) == 20 && created[19] == 'Z', "%s", r.body);
    ck_assert(json_is_false(json_object_get(r.json, "already_stored")));
    lbt_resp_free(&r);
    ck_assert_int_eq(image_cli(d.state_dir, "list", &out), 0);
    assert_has(out, digest);
    free(out);
    /* again, streamed chunked: a no-op, the same digest */
    post_image(&d, "busy", path, true, &r);
    ck_assert_msg(r.status == 201, "%ld %s", r.status, r.body);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "digest")), digest);
    ck_assert(json_is_true(json_object_get(r.json, "already_stored")));
    lbt_resp_free(&r);
    /* the daemon's list over HTTP */
    lbt_json(&d, "GET", "/v1/images", "", NULL, &r);
    ck_assert_int_eq(json_array_size(json_object_get(r.json, "images")), 1);
    lbt_resp_free(&r);

    /* past limits.max_image_bytes (the docker-save tarball is 2.8 MB): 413, announced or
     * streamed, and nothing is left */
    snprintf(path, sizeof(path), "%s/image.tar", img_dir);
    /* announced (no Expect: 100-continue): the body is read and dropped before the 413, so
     * the answer is never lost to a reset of the unread connection; again and again */
    for (int i = 0; i < 10; i++) {
        post_image(&d, "big", path, false, &r);
        lbt_assert_error(&r, 413, "payload_too_large");
        lbt_resp_free(&r);
    }
    post_image(&d, "big", path, true, &r);
    lbt_assert_error(&r, 413, "payload_too_large");
    assert_has(r.body, "2097152");
    lbt_resp_free(&r);

    /* not an archive: 400 with the reason; a bad or missing name: 400 */
    lbt_request(&d, "POST", "/v1/images?name=junk", "", "not a tarball at all", 20,
                "application/x-tar", &r);
    lbt_assert_error(&r, 400, "bad_request");
    assert_has(r.body, "not an image archive");
    lbt_resp_free(&r);
    lbt_request(&d, "POST", "/v1/images?name=host", "", "x", 1, "application/x-tar", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    lbt_request(&d, "POST", "/v1/images", "", "x", 1, "application/x-tar", &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    /* admin only */
    lbt_request(&d, "POST", "/v1/images?name=x", NULL, "x", 1, "application/x-tar", &r);
    ck_assert_int_eq(r.status, 401);
    lbt_resp_free(&r);

    /* another architecture: 422, nothing stored */
    snprintf(path, sizeof(path), "%s/arm.tar", img_dir);
    variant_image("--architecture arm64", path, true);
    post_image(&d, "armimg", path, false, &r);
    lbt_assert_error(&r, 422, "unenforceable");
    assert_has(r.body, "architecture is arm64");
    lbt_resp_free(&r);
    snprintf(tmp, sizeof(tmp), "import %s armimg", path); /* the same from the command line */
    ck_assert_int_eq(image_cli(d.state_dir, tmp, &out), 1);
    assert_has(out, "architecture is arm64");
    free(out);
    lbt_json(&d, "GET", "/v1/images", "", NULL, &r);
    ck_assert_int_eq(json_array_size(json_object_get(r.json, "images")), 1);
    lbt_resp_free(&r);
    snprintf(tmp, sizeof(tmp), "%s/images/.store/tmp", d.state_dir);
    ck_assert_int_eq(count_entries(tmp), 0); /* no upload or import left behind */
    lbt_daemon_cleanup(&d);
}
END_TEST

START_TEST(test_http_import_killed)
{
    const char *slow[] = {"--set", "faults.spec=image.publish=delay:60000", NULL};
    struct lbt_daemon d;
    struct lbt_resp r;
    char cmd[2048], tmp[300], *out;
    pid_t pid;
    int st;

    lbt_daemon_start(&d, NULL);
    snprintf(tmp, sizeof(tmp), "%s/images/.store/tmp", d.state_dir);
    /* killed mid-upload: half the archive sent, the rest held back */
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        snprintf(cmd, sizeof(cmd),
                 "(head -c 1000000 %s/image.tar; sleep 30) | curl -s -o /dev/null -X POST -T - "
                 "-H 'Authorization: Bearer %s' '%s/v1/images?name=busy'",
                 img_dir, d.admin_token, d.base_url);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    snprintf(cmd, sizeof(cmd), "test \"$(stat -c %%s %s/upload-* 2>/dev/null)\" -gt 0 2>/dev/null",
             tmp);
    for (int i = 0; i < 200 && system(cmd) != 0; i++)
        lbt_sleep_ms(50);
    ck_assert_int_eq(system(cmd), 0); /* the body is streaming into the store */
    lbt_daemon_kill(&d);
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    ck_assert_int_eq(image_cli(d.state_dir, "list", &out), 0);
    ck_assert_str_eq(out, ""); /* nothing half-visible */
    free(out);
    /* restarted with the import slowed right before it publishes */
    lbt_daemon_restart(&d, slow);
    ck_assert_int_eq(count_entries(tmp), 0); /* the start removed the partial upload */
    {
        char path[512];

        snprintf(path, sizeof(path), "%s/image.oci.tar", img_dir);
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            snprintf(cmd, sizeof(cmd),
                     "curl -s -o /dev/null -X POST --data-binary @%s "
                     "-H 'Authorization: Bearer %s' '%s/v1/images?name=busy'",
                     path, d.admin_token, d.base_url);
            execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
            _exit(127);
        }
    }
    snprintf(cmd, sizeof(cmd), "ls %s/*/entry/image.json >/dev/null 2>&1", tmp);
    for (int i = 0; i < 400 && system(cmd) != 0; i++)
        lbt_sleep_ms(50);
    ck_assert_int_eq(system(cmd), 0); /* unpacked, waiting to publish */
    lbt_daemon_kill(&d);
    waitpid(pid, &st, 0);
    ck_assert_int_eq(image_cli(d.state_dir, "list", &out), 0);
    ck_assert_str_eq(out, "");
    free(out);
    lbt_daemon_restart(&d, NULL);
    ck_assert_int_eq(count_entries(tmp), 0);
    snprintf(tmp, sizeof(tmp), "%s/images/.store/sha256", d.state_dir);
    ck_assert_int_eq(count_entries(tmp), 0);
    lbt_json(&d, "GET", "/v1/images", "", NULL, &r);
    ck_assert_int_eq(json_array_size(json_object_get(r.json, "images")), 0);
    lbt_resp_free(&r);
    lbt_daemon_cleanup(&d);
}
END_TEST

/* podman save (a docker-archive podman wrote) and podman's own image store
 * (containers-storage:), with podman in a private --root/--runroot (vfs, runc, cgroupfs) */
START_TEST(test_podman_sources)
{
    char pod[128], cmd[2048], *out, *a, *b;
    snprintf(pod, sizeof(pod), "%s/podman", img_dir);
    snprintf(cmd, sizeof(cmd),
             "set -e; P='podman --root %s/root --runroot %s/run --storage-driver vfs --runtime "
             "runc --cgroup-manager cgroupfs --events-backend file'; $P load -q -i %s/image.tar "
             ">/dev/null; $P save -q -o %s/podman.tar localhost/lbtest:latest 2>/dev/null || "
             "$P save -q -o %s/podman.tar docker.io/library/lbtest:latest",
             pod, pod, img_dir, img_dir, img_dir);
    ck_assert_msg(system(cmd) == 0, "podman load/save failed");

    snprintf(cmd, sizeof(cmd), "import %s/podman.tar from-podman-save", img_dir);
    ck_assert_int_eq(image_cli(state, cmd, &out), 0);
    assert_has(out, "from-podman-save sha256:");
    free(out);
    snprintf(cmd, sizeof(cmd),
             "import containers-storage:[vfs@%s/root+%s/run]docker.io/library/lbtest:latest "
             "from-podman-store",
             pod, pod);
    ck_assert_int_eq(image_cli(state, cmd, &out), 0);
    assert_has(out, "from-podman-store sha256:");
    free(out);
    /* the same files as the docker-save import of the same image */
    snprintf(cmd, sizeof(cmd), "import %s/image.tar from-docker-save", img_dir);
    ck_assert_int_eq(image_cli(state, cmd, &out), 0);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s/images/from-podman-save", state);
    a = tree_sum(cmd);
    snprintf(cmd, sizeof(cmd), "%s/images/from-docker-save", state);
    b = tree_sum(cmd);
    ck_assert_str_eq(a, b);
    free(b);
    snprintf(cmd, sizeof(cmd), "%s/images/from-podman-store", state);
    b = tree_sum(cmd);
    ck_assert_str_eq(a, b);
    free(a);
    free(b);
    snprintf(cmd, sizeof(cmd), "%s/images/from-podman-store/etc/os-release", state);
    ck_assert(lbt_path_exists(cmd));
}
END_TEST

/* What the layers hold, seen from a sandbox: whiteouts, links, setuid, devices, ownership */
START_TEST(test_image_layers)
{
    struct lbt_daemon d;
    char args[512], sbx[64], dir[512], cmd[1024], *out, *text;
    uid_t uid;
    struct stat st;

    lbt_daemon_start(&d, NULL);
    snprintf(args, sizeof(args), "import %s/image.tar busy", img_dir);
    ck_assert_int_eq(image_cli(d.state_dir, args, &out), 0);
    assert_has(out, "skipped 2 device node(s)"); /* devices: skipped at import, logged */
    free(out);
    seed_on(&d, "rs-layers", "\"image\": \"busy\"", sbx, sizeof(sbx));
    uid = lbt_sandbox_uid(&d, sbx);

    /* whiteout: deleted in layer 3; layer 3's own file is there */
    text = lbt_sh(&d, sbx, "test -e /etc/gone.txt && echo present; cat /srv/layer3.txt");
    ck_assert_str_eq(text, "layer3\n");
    free(text);
    /* a symlink and a hard link */
    snprintf(args, sizeof(args), "os-release\nID=lbt-marker-%d\n", (int)getpid());
    text = lbt_sh(&d, sbx, "readlink /etc/os-link; grep ID= /etc/os-link");
    ck_assert_str_eq(text, args);
    free(text);
    text = lbt_sh(&d, sbx,
                  "test $(stat -c %i /srv/data.txt) = $(stat -c %i /srv/data-hard.txt) && "
                  "stat -c %h /srv/data.txt && cat /srv/data-hard.txt");
    ck_assert_str_eq(text, "2\ndata\n");
    free(text);
    /* device nodes: skipped */
    text = lbt_sh(&d, sbx, "ls -A /dev-test; echo end");
    ck_assert_str_eq(text, "end\n");
    free(text);
    /* ownership: the image root's files belong to the sandbox's root; on the host the same
     * files (through the sandbox's idmapped mount) belong to the sandbox's own uid, never 0 */
    text = lbt_sh(&d, sbx, "stat -c '%u %g %a' /opt/suid/euid /etc/passwd /srv");
    ck_assert_str_eq(text, "0 0 4755\n0 0 644\n0 0 755\n");
    free(text);
    snprintf(dir, sizeof(dir), "%s/sandboxes/%s/img/root", d.state_dir, sbx);
    snprintf(cmd, sizeof(cmd), "%s/opt/suid/euid", dir);
    if (stat(cmd, &st) == 0) { /* the daemon's mounts are visible here (no private mount ns) */
        ck_assert_int_eq(st.st_uid, uid);
        ck_assert_int_ne(st.st_uid, 0);
    }
    /* setuid grants no host privilege: the store is root's alone (0700), so a host user
     * cannot reach its setuid-root binary; the copy seen through the sandbox's mounts is
     * owned by the sandbox's uid (not root) on a nosuid mount */
    /* (a shell as host user nobody: setpriv itself would still hold root's capabilities
     * while it resolves the path) */
    snprintf(cmd, sizeof(cmd),
             "setpriv --reuid=65534 --regid=65534 --clear-groups /bin/sh -c "
             "'%s/images/busy/opt/suid/euid' 2>&1",
             d.state_dir);
    {
        FILE *p = popen(cmd, "r");
        char buf[256] = "";
        size_t n;

        ck_assert_ptr_nonnull(p);
        n = fread(buf, 1, sizeof(buf) - 1, p);
        buf[n] = '\0';
        pclose(p);
        ck_assert_msg(strstr(buf, "Permission denied") && !strstr(buf, "\n0\n"), "%s", buf);
    }
    snprintf(cmd, sizeof(cmd), "%s/opt/suid/euid", dir);
    if (lbt_path_exists(cmd)) {
        snprintf(cmd, sizeof(cmd),
                 "out=$(setpriv --reuid=65534 --regid=65534 --clear-groups /bin/sh -c "
                 "'%s/opt/suid/euid' 2>&1); echo \"$out\"; "
                 "test \"$out\" = 65534 || echo \"$out\" | grep -q 'Permission denied'",
                 dir);
        ck_assert_int_eq(system(cmd), 0); /* nosuid: neither root nor the sandbox's uid */
    }
    /* every mount the daemon made for the sandbox's root is nosuid and nodev */
    {
        char line[8192], needle[128];
        FILE *f = fopen("/proc/self/mountinfo", "r");
        int n = 0;

        snprintf(needle, sizeof(needle), "/%s/img", sbx);
        ck_assert_ptr_nonnull(f);
        while (fgets(line, sizeof(line), f)) {
            if (!strstr(line, needle))
                continue;
            n++;
            ck_assert_msg(strstr(line, "nosuid") && strstr(line, "nodev"), "%s", line);
        }
        fclose(f);
        ck_assert_int_eq(n, 3); /* img (the tmpfs), img/lower, img/root */
    }
    /* inside: the setuid binary runs as the sandbox's root, which is the sandbox's host uid */
    text = lbt_sh(&d, sbx,
                  "/opt/suid/euid; grep -c nosuid /proc/self/mountinfo >/dev/null "
                  "&& grep ' / / ' /proc/self/mountinfo | grep -c nosuid");
    ck_assert_str_eq(text, "0\n1\n");
    free(text);
    lbt_release_session(&d, "rs-layers");
    lbt_daemon_cleanup(&d);
}
END_TEST

/* The image's User is the default user of execs (any id 0..65535 is mapped); a
 * User outside the sandbox's ids is refused at seed (422) */
START_TEST(test_image_user)
{
    struct lbt_daemon d;
    struct lbt_resp r;
    char path[512], args[600], sbx[64], *out, *text;
    json_t *res;

    lbt_daemon_start(&d, NULL);
    snprintf(path, sizeof(path), "%s/user-nobody.tar", img_dir);
    variant_image("--config.user nobody", path, false);
    snprintf(args, sizeof(args), "import %s nobody-img", path);
    ck_assert_int_eq(image_cli(d.state_dir, args, &out), 0);
    free(out);
    snprintf(path, sizeof(path), "%s/user-num.tar", img_dir);
    variant_image("--config.user 1234:1234", path, false);
    snprintf(args, sizeof(args), "import %s num-img", path);
    ck_assert_int_eq(image_cli(d.state_dir, args, &out), 0);
    free(out);
    snprintf(path, sizeof(path), "%s/user-big.tar", img_dir);
    variant_image("--config.user 70000", path, false);
    snprintf(args, sizeof(args), "import %s big-img", path);
    ck_assert_int_eq(image_cli(d.state_dir, args, &out), 0);
    free(out);
    snprintf(path, sizeof(path), "%s/user-root.tar", img_dir);
    variant_image("--config.user root:root", path, false);
    snprintf(args, sizeof(args), "import %s root-img", path);
    ck_assert_int_eq(image_cli(d.state_dir, args, &out), 0);
    free(out);

    lbt_json(&d, "POST", "/v1/sessions/rs-big/seed", "",
             "{\"task_id\": \"t\", \"image\": \"big-img\"}", &r);
    lbt_assert_error(&r, 422, "unenforceable");
    assert_has(r.body, "70000");
    lbt_resp_free(&r);
    lbt_json(&d, "GET", "/v1/sessions/rs-big", "", NULL, &r);
    ck_assert_int_eq(r.status, 404); /* nothing lent */
    lbt_resp_free(&r);

    seed_on(&d, "rs-nobody", "\"image\": \"nobody-img\"", sbx, sizeof(sbx));
    text = lbt_sh(&d, sbx, "id -u; id -g");
    ck_assert_str_eq(text, "65534\n65534\n");
    free(text);
    res = lbt_exec_ok(&d, sbx, "", "{\"command\": \"id -u\", \"user\": \"root\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "0\n");
    json_decref(res);
    lbt_release_session(&d, "rs-nobody");

    seed_on(&d, "rs-num", "\"image\": \"num-img\"", sbx, sizeof(sbx));
    text = lbt_sh(&d, sbx, "id -u; id -g");
    ck_assert_str_eq(text, "1234\n1234\n");
    free(text);
    lbt_release_session(&d, "rs-num");

    seed_on(&d, "rs-root", "\"image\": \"root-img\"", sbx, sizeof(sbx));
    text = lbt_sh(&d, sbx, "id -u; id -g");
    ck_assert_str_eq(text, "0\n0\n");
    free(text);
    res = lbt_exec_ok(&d, sbx, "", "{\"command\": \"id -u\", \"user\": \"nobody\"}");
    ck_assert_str_eq(json_string_value(json_object_get(res, "stdout")), "65534\n");
    json_decref(res);
    lbt_exec(&d, sbx, "", "{\"command\": \"id -u\", \"user\": \"nosuchuser\"}", &r);
    lbt_assert_error(&r, 400, "bad_request"); /* an explicit user is checked itself */
    assert_has(r.body, "unknown user \\\"nosuchuser\\\"");
    lbt_resp_free(&r);
    lbt_release_session(&d, "rs-root");
    lbt_daemon_cleanup(&d);
}
END_TEST

/* A name imported anew: its old tree stays while a sandbox uses it, then is collected */
START_TEST(test_reimport_gc)
{
    struct lbt_daemon d;
    struct lbt_resp r;
    char path[512], old_hex[80], store[300], sbx[64], args[600], *text;

    lbt_daemon_start(&d, NULL);
    snprintf(store, sizeof(store), "%s/images/.store/sha256", d.state_dir);
    snprintf(path, sizeof(path), "%s/image.oci.tar", img_dir);
    post_image(&d, "busy", path, false, &r);
    ck_assert_int_eq(r.status, 201);
    snprintf(old_hex, sizeof(old_hex), "%s",
             json_string_value(json_object_get(r.json, "digest")) + 7);
    lbt_resp_free(&r);
    seed_on(&d, "rs-gc", "\"image\": \"busy\"", sbx, sizeof(sbx));

    /* busy re-imported as another image (its config differs) */
    snprintf(path, sizeof(path), "%s/other.tar", img_dir);
    variant_image("--config.env LB_OTHER=1", path, true);
    post_image(&d, "busy", path, false, &r);
    ck_assert_msg(r.status == 201, "%ld %s", r.status, r.body);
    ck_assert_str_ne(json_string_value(json_object_get(r.json, "digest")) + 7, old_hex);
    lbt_resp_free(&r);
    ck_assert_int_eq(count_entries(store), 2); /* the old tree: in use by the live sandbox */
    snprintf(args, sizeof(args), "ID=lbt-marker-%d\n", (int)getpid());
    text = lbt_sh(&d, sbx, "grep ID= /etc/os-release");
    ck_assert_str_eq(text, args);
    free(text);
    lbt_release_session(&d, "rs-gc");
    /* the next import (or removal, or start) collects it */
    post_image(&d, "busy", path, false, &r);
    ck_assert_int_eq(r.status, 201);
    lbt_resp_free(&r);
    ck_assert_int_eq(count_entries(store), 1);
    snprintf(path, sizeof(path), "%s/%s", store, old_hex);
    ck_assert(!lbt_path_exists(path));
    lbt_daemon_cleanup(&d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("images");
    TCase *tc = tcase_create("store");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_import_list_rm);
    tcase_add_test(tc, test_seed_on_image_and_rm_in_use);
    tcase_add_test(tc, test_writable_root);
    tcase_add_test(tc, test_interrupted_import);
    tcase_add_test(tc, test_http_import);
    tcase_add_test(tc, test_http_import_killed);
    tcase_add_test(tc, test_podman_sources);
    tcase_add_test(tc, test_image_layers);
    tcase_add_test(tc, test_image_user);
    tcase_add_test(tc, test_reimport_gc);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
