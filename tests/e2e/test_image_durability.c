/*
 * test_image_durability.c - the default image, and crashes around a
 * sandbox on an image. The image is built on this machine from the busybox-static package
 * (tests/images/make-test-image), nothing from a registry.
 *
 * - [local] default_image: a seed without "image" runs on the first image of the list that is
 *   in the store ("host" explicitly last), "image": "host" stays the host's root; an unusable
 *   value stops the daemon at start
 * - the record names the image and its digest (GET /v1/sandboxes)
 * - a failure right after the image root is mounted leaves no mount and no sandbox dir
 * - kill -9 of the daemon during a seed on an image (fault image.mounted=delay, the root's
 *   mounts made, no init yet), then a restart: reconciliation unmounts them and removes the
 *   sandbox's directory with its upper dir; the session can be seeded again
 * - a sandbox that vanished while the daemon was down (its init killed): the restart's
 *   reconciliation unmounts what it left
 * Mounts are counted under this test's own state dirs only (other daemons run here too).
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

static void setup(void)
{
    char cmd[512];

    snprintf(img_dir, sizeof(img_dir), "/tmp/lbt-imgdur-%d", (int)getpid());
    snprintf(cmd, sizeof(cmd), "%s/tests/images/make-test-image %s lbt-marker-%d >/dev/null",
             getenv("LENDBOX_SRCDIR"), img_dir, (int)getpid());
    ck_assert_msg(system(cmd) == 0, "make-test-image failed");
}

static void teardown(void)
{
    char cmd[256];

    snprintf(cmd, sizeof(cmd), "rm -rf %s", img_dir);
    (void)system(cmd);
}

static void import_busy(struct lbt_daemon *d, const char *name)
{
    char cmd[1024];

    snprintf(cmd, sizeof(cmd), "%s -s %s image import %s/image.tar %s >/dev/null 2>&1",
             getenv("LENDBOXD"), d->state_dir, img_dir, name);
    ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
}

/* Mounts of the host's mount table under dir. */
static int count_mounts_under(const char *dir)
{
    char line[8192], needle[512];
    FILE *f = fopen("/proc/self/mountinfo", "re");
    int n = 0;

    ck_assert_ptr_nonnull(f);
    snprintf(needle, sizeof(needle), " %s/", dir);
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

static void sandbox_dir(const struct lbt_daemon *d, const char *id, char *buf, size_t size)
{
    snprintf(buf, size, "%s/sandboxes/%s", d->state_dir, id);
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

/* The lease's sandbox id into sbx; returns the lease's image (static copy). */
static const char *seed(struct lbt_daemon *d, const char *rsid, const char *extra, char *sbx,
                        size_t size)
{
    static char image[128];
    json_t *lease = lbt_seed(d, rsid, "task-imgdur", extra);

    snprintf(sbx, size, "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    snprintf(image, sizeof(image), "%s", json_string_value(json_object_get(lease, "image")));
    json_decref(lease);
    return image;
}

static const char *record_str(json_t *rec, const char *key)
{
    return json_string_value(json_object_get(rec, key));
}

START_TEST(test_default_image)
{
    const char *const args[] = {"--set", "local.default_image=base host", NULL};
    struct lbt_daemon d;
    char sbx[64], cmd[1024], state[64], *text;
    json_t *list, *rec;
    int st;

    lbt_daemon_start(&d, args);
    /* no image "base" in the store yet: the list falls through to the explicit host */
    ck_assert_str_eq(seed(&d, "rs-a", NULL, sbx, sizeof(sbx)), "host");
    text = lbt_sh(&d, sbx, ". /etc/os-release; echo $ID");
    ck_assert_str_eq(text, "debian\n"); /* the host's */
    free(text);
    release(&d, "rs-a");

    /* imported: seeds without "image" run on it, read at each seed (no restart) */
    import_busy(&d, "base");
    ck_assert_str_eq(seed(&d, "rs-b", NULL, sbx, sizeof(sbx)), "base");
    text = lbt_sh(&d, sbx, "cat /etc/os-release");
    snprintf(cmd, sizeof(cmd), "ID=lbt-marker-%d", (int)getpid());
    ck_assert_msg(strstr(text, cmd), "%s", text);
    free(text);
    /* the record names the image and the digest it had at seed time */
    list = lbt_list_sandboxes(&d);
    rec = lbt_find_record(list, sbx);
    ck_assert_ptr_nonnull(rec);
    ck_assert_str_eq(record_str(rec, "image"), "base");
    ck_assert_int_eq(strncmp(record_str(rec, "image_digest"), "sha256:", 7), 0);
    ck_assert_int_eq(strlen(record_str(rec, "image_digest")), 7 + 64);
    json_decref(list);

    /* "host" stays the explicit host root */
    ck_assert_str_eq(seed(&d, "rs-c", "\"image\": \"host\"", sbx, sizeof(sbx)), "host");
    text = lbt_sh(&d, sbx, ". /etc/os-release; echo $ID");
    ck_assert_str_eq(text, "debian\n"); /* the host's */
    free(text);
    list = lbt_list_sandboxes(&d);
    rec = lbt_find_record(list, sbx);
    ck_assert_str_eq(record_str(rec, "image"), "host");
    ck_assert(json_is_null(json_object_get(rec, "image_digest")));
    json_decref(list);
    release(&d, "rs-b");
    release(&d, "rs-c");
    lbt_daemon_cleanup(&d);

    /* a single name that is not there: 404 image_not_found naming it, nothing lent */
    {
        const char *const only[] = {"--set", "local.default_image=missing", NULL};
        struct lbt_resp r;

        lbt_daemon_start(&d, only);
        lbt_json(&d, "POST", "/v1/sessions/rs-d/seed", "", "{\"task_id\": \"t\"}", &r);
        lbt_assert_error(&r, 404, "image_not_found");
        ck_assert_msg(strstr(r.body, "missing"), "%s", r.body);
        lbt_resp_free(&r);
        lbt_daemon_cleanup(&d);
    }

    /* an unusable value stops the daemon at start, saying why */
    snprintf(state, sizeof(state), "/tmp/lbt-imgdur-state-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(state));
    snprintf(cmd, sizeof(cmd),
             "timeout 20 %s -s %s --listen 127.0.0.1:0 --set 'local.default_image=../etc' "
             ">%s.log 2>&1",
             getenv("LENDBOXD"), state, state);
    st = system(cmd);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 124,
                  "daemon with a bad default_image: status %d", st);
    snprintf(cmd, sizeof(cmd), "grep -q \"default image '../etc'\" %s.log", state);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof(cmd), "rm -rf %s %s.log", state, state);
    (void)system(cmd);
}
END_TEST

START_TEST(test_failure_after_mount_leaves_nothing)
{
    const char *const args[] = {"--set", "faults.spec=image.mounted=fail", NULL};
    struct lbt_daemon d;
    struct lbt_resp r;
    char path[512];
    json_t *list;

    lbt_daemon_start(&d, args);
    import_busy(&d, "busy");
    lbt_json(&d, "POST", "/v1/sessions/rs-f/seed", "", "{\"task_id\": \"t\", \"image\": \"busy\"}",
             &r);
    lbt_assert_error(&r, 502, "provider_error");
    lbt_resp_free(&r);
    ck_assert_int_eq(count_mounts_under(d.state_dir), 0);
    list = lbt_list_sandboxes(&d);
    ck_assert_int_eq(json_array_size(list), 1);
    ck_assert_str_eq(record_str(json_array_get(list, 0), "state"), "stopped");
    sandbox_dir(&d, record_str(json_array_get(list, 0), "sandbox_id"), path, sizeof(path));
    ck_assert_msg(!lbt_path_exists(path), "%s is left", path);
    json_decref(list);
    lbt_daemon_cleanup(&d);
}
END_TEST

START_TEST(test_kill_during_seed_on_image)
{
    const char *const args[] = {"--set", "faults.spec=image.mounted=delay:60000", NULL};
    struct lbt_daemon d;
    struct lbt_async *a;
    struct lbt_resp r;
    char path[512], id[64] = "", sbx[64];
    json_t *list, *rec;
    int i;

    lbt_daemon_start(&d, args);
    import_busy(&d, "busy");
    a = lbt_async_json(&d, "POST", "/v1/sessions/rs-k/seed", "",
                       "{\"task_id\": \"t\", \"image\": \"busy\"}");
    /* the root's three mounts (upper tmpfs, idmapped image, overlay), no init yet */
    for (i = 0; i < 400 && count_mounts_under(d.state_dir) < 3; i++)
        lbt_sleep_ms(50);
    ck_assert_int_eq(count_mounts_under(d.state_dir), 3);
    lbt_daemon_kill(&d);
    lbt_async_join(a, &r);
    ck_assert_int_ne(r.status, 200);
    lbt_resp_free(&r);
    ck_assert_int_eq(count_mounts_under(d.state_dir), 3); /* left by the crash */

    lbt_daemon_restart(&d, NULL);
    /* ready means reconciled: the starting record was stopped, its mounts and dir are gone */
    ck_assert_int_eq(count_mounts_under(d.state_dir), 0);
    list = lbt_list_sandboxes(&d);
    ck_assert_int_eq(json_array_size(list), 1);
    rec = json_array_get(list, 0);
    snprintf(id, sizeof(id), "%s", record_str(rec, "sandbox_id"));
    ck_assert_str_eq(record_str(rec, "state"), "stopped");
    ck_assert_str_eq(record_str(rec, "image"), "busy");
    json_decref(list);
    sandbox_dir(&d, id, path, sizeof(path));
    ck_assert_msg(!lbt_path_exists(path), "%s is left", path);

    /* the session works again, and its release leaves no mount and no upper dir */
    seed(&d, "rs-k", "\"image\": \"busy\"", sbx, sizeof(sbx));
    ck_assert_int_eq(count_mounts_under(d.state_dir), 3);
    sandbox_dir(&d, sbx, path, sizeof(path));
    strcat(path, "/img/upper");
    ck_assert(lbt_path_exists(path));
    release(&d, "rs-k");
    ck_assert_int_eq(count_mounts_under(d.state_dir), 0);
    ck_assert(!lbt_path_exists(path));
    lbt_daemon_cleanup(&d);
}
END_TEST

START_TEST(test_vanished_sandbox_unmounted)
{
    struct lbt_daemon d;
    char path[512], sbx[64];
    json_t *desc, *list, *rec;
    pid_t init;

    lbt_daemon_start(&d, NULL);
    import_busy(&d, "busy");
    seed(&d, "rs-v", "\"image\": \"busy\"", sbx, sizeof(sbx));
    ck_assert_int_eq(count_mounts_under(d.state_dir), 3);
    desc = lbt_read_descriptor(&d, sbx);
    ck_assert_ptr_nonnull(desc);
    init = (pid_t)json_integer_value(json_object_get(desc, "pid"));
    json_decref(desc);
    ck_assert_int_gt(init, 1);

    /* the daemon dies, then the sandbox: its mounts stay in the daemon's namespace */
    lbt_daemon_kill(&d);
    ck_assert_int_eq(kill(init, SIGKILL), 0);
    for (int i = 0; i < 200 && kill(init, 0) == 0; i++)
        lbt_sleep_ms(25);
    ck_assert_int_eq(count_mounts_under(d.state_dir), 3);

    lbt_daemon_restart(&d, NULL);
    ck_assert_int_eq(count_mounts_under(d.state_dir), 0);
    sandbox_dir(&d, sbx, path, sizeof(path));
    ck_assert_msg(!lbt_path_exists(path), "%s is left", path);
    list = lbt_list_sandboxes(&d);
    rec = lbt_find_record(list, sbx);
    ck_assert_ptr_nonnull(rec);
    ck_assert_str_eq(record_str(rec, "state"), "stopped");
    ck_assert_str_eq(record_str(rec, "stop_reason"), "vanished");
    json_decref(list);
    lbt_daemon_cleanup(&d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("image_durability");
    TCase *tc = tcase_create("image_durability");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_default_image);
    tcase_add_test(tc, test_failure_after_mount_leaves_nothing);
    tcase_add_test(tc, test_kill_during_seed_on_image);
    tcase_add_test(tc, test_vanished_sandbox_unmounted);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
