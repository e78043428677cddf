/*
 * test_images.c - issue 9, the image store: images built on this machine from the
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
    ck_assert_int_eq(sscanf(strstr(out, "sha256:"), "%79s", digest), 1);
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
    /* the same over HTTP: listed, DELETE refused while in use, upload import not built yet */
    lbt_json(&d, "GET", "/v1/images", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    {
        json_t *imgs = json_object_get(r.json, "images"), *img = json_array_get(imgs, 0);

        ck_assert_int_eq(json_array_size(imgs), 1);
        ck_assert_str_eq(json_string_value(json_object_get(img, "name")), "busy");
        ck_assert_int_eq(strncmp(json_string_value(json_object_get(img, "digest")), "sha256:", 7),
                         0);
        ck_assert_int_gt(json_integer_value(json_object_get(img, "size_bytes")), 1000000);
        ck_assert_int_gt(json_integer_value(json_object_get(img, "created_at")), 0);
    }
    lbt_resp_free(&r);
    lbt_request(&d, "DELETE", "/v1/images/busy", "", NULL, 0, NULL, &r);
    lbt_assert_error(&r, 409, "conflict");
    lbt_resp_free(&r);
    lbt_request(&d, "POST", "/v1/images?name=x", "", "abc", 3, "application/x-tar", &r);
    lbt_assert_error(&r, 501, "not_implemented");
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

static void release(struct lbt_daemon *d, const char *rsid)
{
    struct lbt_resp r;
    char path[128];

    snprintf(path, sizeof(path), "/v1/sessions/%s/release", rsid);
    lbt_json(d, "POST", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "release %s: %ld %s", rsid, r.status, r.body);
    lbt_resp_free(&r);
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
    /* the writable root is sized by resources.disk_mib */
    release(&d, "rs-img-b");
    seed_on(&d, "rs-img-c", "\"image\": \"busy\", \"resources\": {\"disk_mib\": 8}", b, sizeof(b));
    res = lbt_exec_ok(&d, b, "",
                      "{\"command\": \"dd if=/dev/zero of=/big bs=1M count=16 2>&1; echo rc=$?\"}");
    text = (char *)json_string_value(json_object_get(res, "stdout"));
    ck_assert_msg(strstr(text, "No space left on device") && strstr(text, "rc=1"), "%s", text);
    json_decref(res);

    /* the daemon killed -9 and restarted: a release still unmounts everything */
    lbt_daemon_kill(&d);
    lbt_daemon_restart(&d, NULL);
    release(&d, "rs-img-a");
    release(&d, "rs-img-c");
    ck_assert_int_eq(count_mounts(d.state_dir), 0);
    after = tree_sum(path);
    ck_assert_str_eq(before, after); /* the image is byte-identical */
    free(before);
    free(after);
    unlink(host_marker);
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
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
