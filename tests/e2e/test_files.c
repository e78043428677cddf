/*
 * test_files.c - acceptance: PUT/GET /v1/sandboxes/{id}/files round trips byte-exact (all byte
 * values, NULs, empty, 1 MiB, 64 MiB), parents are created, missing files are 404, invalid
 * paths are 400, symlinks and ".." never reach the host, and the host's /etc/shadow is refused.
 */
#include <fcntl.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static struct lbt_daemon D;
static char SBX[128];

/* The host-side files of test_symlink_to_host: named by the fixture (this process) and
 * removed by its teardown, however the forked test ends. */
static char HOST_FILE[64], HOST_DIR[64], HOST_VICTIM[128];

static void remove_host_files(void)
{
    if (HOST_VICTIM[0])
        unlink(HOST_VICTIM);
    if (HOST_FILE[0])
        unlink(HOST_FILE);
    if (HOST_DIR[0])
        rmdir(HOST_DIR);
}

static void prepare(void)
{
    snprintf(HOST_FILE, sizeof(HOST_FILE), "/tmp/lbt-host-secret-%d", (int)getpid());
    snprintf(HOST_DIR, sizeof(HOST_DIR), "/tmp/lbt-host-dir-%d", (int)getpid());
    snprintf(HOST_VICTIM, sizeof(HOST_VICTIM), "%s/planted.txt", HOST_DIR);
    remove_host_files();
}

static void seed(void)
{
    json_t *lease = lbt_seed(&D, "files-1", "task-files", NULL);

    snprintf(SBX, sizeof(SBX), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
}

static void sha256_hex(const void *data, size_t len, char out[65])
{
    unsigned char md[SHA256_DIGEST_LENGTH];

    SHA256(data, len, md);
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
}

/* PUT data at path, GET it back, and check the size and hash the sandbox itself sees. */
static void round_trip(const char *path, const void *data, size_t len)
{
    struct lbt_resp r;
    char cmd[600], want[128], hex[65];
    char *out;

    lbt_file_put(&D, SBX, "", path, NULL, data, len, &r);
    ck_assert_msg(r.status == 204, "PUT %s (%zu bytes): %ld %.500s", path, len, r.status, r.body);
    ck_assert_uint_eq(r.len, 0);
    lbt_assert_request_id(&r, NULL);
    lbt_resp_free(&r);
    lbt_file_get(&D, SBX, "", path, &r);
    ck_assert_msg(r.status == 200, "GET %s: %ld %.500s", path, r.status, r.body);
    ck_assert_msg(strstr(r.headers, "application/octet-stream") != NULL, "headers: %s", r.headers);
    ck_assert_uint_eq(r.len, len);
    ck_assert(len == 0 || memcmp(r.body, data, len) == 0);
    lbt_resp_free(&r);
    sha256_hex(data, len, hex);
    snprintf(cmd, sizeof(cmd), "wc -c < '%s'; sha256sum < '%s' | cut -d' ' -f1", path, path);
    out = lbt_sh(&D, SBX, cmd);
    snprintf(want, sizeof(want), "%zu\n%s\n", len, hex);
    ck_assert_str_eq(out, want);
    free(out);
}

START_TEST(test_all_byte_values)
{
    unsigned char buf[256 * 4];

    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (unsigned char)(i % 256);
    round_trip("/workspace/bytes.bin", buf, sizeof(buf));
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (unsigned char)(255 - i % 256);
    round_trip("/tmp/bytes-reversed.bin", buf, sizeof(buf));
}
END_TEST

START_TEST(test_nuls_and_empty)
{
    unsigned char nuls[4096] = {0};

    nuls[100] = 'x';
    round_trip("/workspace/nuls.bin", nuls, sizeof(nuls));
    round_trip("/workspace/only-nuls.bin", nuls, 100);
    round_trip("/workspace/empty.bin", "", 0);
    /* overwriting with less leaves exactly the new content */
    round_trip("/workspace/nuls.bin", "\0", 1);
}
END_TEST

START_TEST(test_one_mib)
{
    size_t len = 1024 * 1024;
    unsigned char *buf = malloc(len);

    ck_assert_ptr_nonnull(buf);
    lbt_fill_random(buf, len, 1);
    round_trip("/workspace/one-mib.bin", buf, len);
    free(buf);
}
END_TEST

START_TEST(test_64_mib)
{
    size_t len = 64 * 1024 * 1024;
    unsigned char *buf = malloc(len);

    ck_assert_ptr_nonnull(buf);
    lbt_fill_random(buf, len, 64);
    round_trip("/workspace/big/64-mib.bin", buf, len);
    free(buf);
    free(lbt_sh(&D, SBX, "rm /workspace/big/64-mib.bin"));
}
END_TEST

START_TEST(test_parents_created_and_mode)
{
    struct lbt_resp r;
    char *out;

    round_trip("/workspace/deep/a/b/c/file.txt", "deep\n", 5);
    out = lbt_sh(&D, SBX, "test -d /workspace/deep/a/b/c && cat /workspace/deep/a/b/c/file.txt");
    ck_assert_str_eq(out, "deep\n");
    free(out);
    lbt_file_put(&D, SBX, "", "/workspace/tool.sh", "0755", "#!/bin/sh\necho tool\n", 20, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
    out = lbt_sh(&D, SBX, "stat -c %a /workspace/tool.sh; /workspace/tool.sh");
    ck_assert_str_eq(out, "755\ntool\n");
    free(out);
}
END_TEST

START_TEST(test_missing_file)
{
    struct lbt_resp r;

    lbt_file_get(&D, SBX, "", "/workspace/does-not-exist.txt", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    lbt_file_get(&D, SBX, "", "/no/such/dir/file", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
}
END_TEST

/* A daemon of the docker variant with a 1 MiB file limit, started and stopped by the
 * fixture (this process, so that a failed test never leaves it running). */
static struct lbt_daemon LIMIT_D;

static const char *const LIMIT_ARGS[] = {"--set", "limits.max_file_bytes=1048576", NULL};

/* docker spools a download (the engine's tar, then the file) on the host: a file larger than
 * limits.max_file_bytes is refused from the engine's stat before anything is spooled, 413 as
 * an upload past the limit is (and one reached through a symlink, whose stat is the link's, is
 * cut off once the spool reaches the limit); one of exactly the limit is served. Local, image and
 * lxd variants serve files their own way (local streams any size from the file). */
START_TEST(test_docker_download_limit)
{
    struct lbt_resp r;
    char sbx[128];
    json_t *lease, *res;

    if (!lbt_variant_is("docker")) {
        lbt_skip_note(__func__, "only the docker provider spools downloads");
        return;
    }
    lease = lbt_seed(&LIMIT_D, "files-limit", "task-files", NULL);
    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    res = lbt_exec_ok(&LIMIT_D, sbx, "",
                      "{\"command\": \"head -c 1048576 /dev/zero > /tmp/at && head -c 1048577 "
                      "/dev/zero > /tmp/over && truncate -s 4G /tmp/sparse && ln -s /tmp/sparse "
                      "/tmp/link\"}");
    json_decref(res);

    lbt_file_get(&LIMIT_D, sbx, "", "/tmp/at", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(r.len, 1048576);
    lbt_resp_free(&r);
    lbt_file_get(&LIMIT_D, sbx, "", "/tmp/over", &r);
    lbt_assert_error(&r, 413, "payload_too_large");
    ck_assert_ptr_nonnull(strstr(r.body, "1048577 bytes"));
    ck_assert_ptr_nonnull(strstr(r.body, "limits.max_file_bytes"));
    lbt_resp_free(&r);
    lbt_file_get(&LIMIT_D, sbx, "", "/tmp/sparse", &r);
    lbt_assert_error(&r, 413, "payload_too_large");
    ck_assert_msg(strstr(r.body, "4294967296 bytes"), "%s", r.body);
    lbt_resp_free(&r);
    /* through a symlink the stat does not give the target's size: the spool stops at the limit */
    lbt_file_get(&LIMIT_D, sbx, "", "/tmp/link", &r);
    lbt_assert_error(&r, 413, "payload_too_large");
    ck_assert_ptr_nonnull(strstr(r.body, "limits.max_file_bytes"));
    lbt_resp_free(&r);
    lbt_json(&LIMIT_D, "POST", "/v1/sessions/files-limit/release", "", "{}", &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
}
END_TEST

START_TEST(test_invalid_paths)
{
    static const char *const bad[] = {"/workspace/../etc/passwd",
                                      "/workspace/a/../../x",
                                      "/..",
                                      "workspace/rel.txt",
                                      "rel.txt",
                                      ""};
    struct lbt_resp r;
    char url[300];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        lbt_file_get(&D, SBX, "", bad[i], &r);
        lbt_assert_error(&r, 400, "bad_request");
        lbt_resp_free(&r);
        lbt_file_put(&D, SBX, "", bad[i], NULL, "x", 1, &r);
        lbt_assert_error(&r, 400, "bad_request");
        lbt_resp_free(&r);
    }
    /* no path at all */
    snprintf(url, sizeof(url), "/v1/sandboxes/%s/files", SBX);
    lbt_request(&D, "GET", url, "", NULL, 0, NULL, &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    /* nothing was written by the refused PUTs */
    ck_assert(!lbt_path_exists("/x"));
    lbt_file_get(&D, SBX, "", "/x", &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
}
END_TEST

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "re");
    char *buf = calloc(1, 4096);

    ck_assert_ptr_nonnull(f);
    *len = fread(buf, 1, 4095, f);
    fclose(f);
    return buf;
}

START_TEST(test_symlink_to_host)
{
    const char *host_file = HOST_FILE, *host_dir = HOST_DIR, *victim = HOST_VICTIM;
    const char secret[] = "host secret\n";
    char cmd[600];
    struct lbt_resp r;
    struct stat before, after;
    size_t len;
    char *out, *content;
    int fd = open(host_file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, secret, strlen(secret)), (int)strlen(secret));
    close(fd);
    ck_assert_int_eq(mkdir(host_dir, 0700), 0);
    /* readable and writable by anyone, as much of the host's /tmp is: only the way paths are
     * resolved can keep the sandbox out */
    ck_assert_int_eq(chmod(host_file, 0666), 0);
    ck_assert_int_eq(chmod(host_dir, 0777), 0);
    ck_assert_int_eq(stat(host_file, &before), 0);

    /* the sandbox's /tmp is its own: the host file is not there */
    snprintf(cmd, sizeof(cmd), "test ! -e %s && test ! -e %s && echo private", host_file, host_dir);
    out = lbt_sh(&D, SBX, cmd);
    ck_assert_str_eq(out, "private\n");
    free(out);
    /* symlinks made inside the sandbox, absolute and relative, to the host-only paths */
    snprintf(cmd, sizeof(cmd),
             "ln -s %s /workspace/link && ln -s ../../../../../..%s /workspace/rel-link && "
             "ln -s %s /workspace/dir-link && ln -s %s /tmp/tmp-link && echo made",
             host_file, host_file, host_dir, host_file);
    out = lbt_sh(&D, SBX, cmd);
    ck_assert_str_eq(out, "made\n");
    free(out);

    /* read through them: 404, never the host's bytes */
    static const char *const links[] = {"/workspace/link", "/workspace/rel-link", "/tmp/tmp-link"};
    for (size_t i = 0; i < 3; i++) {
        lbt_file_get(&D, SBX, "", links[i], &r);
        lbt_assert_error(&r, 404, "not_found");
        ck_assert(strstr(r.body, "host secret") == NULL);
        lbt_resp_free(&r);
    }
    /* write through them: whatever the status, the host file stays as it was */
    for (size_t i = 0; i < 3; i++) {
        lbt_file_put(&D, SBX, "", links[i], NULL, "pwned\n", 6, &r);
        ck_assert_msg(r.status == 204 || (r.status >= 400 && r.status < 500), "PUT %s: %ld",
                      links[i], r.status);
        lbt_assert_request_id(&r, NULL);
        lbt_resp_free(&r);
    }
    lbt_file_put(&D, SBX, "", "/workspace/dir-link/planted.txt", NULL, "pwned\n", 6, &r);
    ck_assert_msg(r.status == 204 || (r.status >= 400 && r.status < 500), "PUT: %ld %s", r.status,
                  r.body);
    lbt_resp_free(&r);
    content = slurp(host_file, &len);
    ck_assert_uint_eq(len, strlen(secret));
    ck_assert_str_eq(content, secret);
    free(content);
    ck_assert_int_eq(stat(host_file, &after), 0);
    ck_assert_uint_eq(after.st_ino, before.st_ino);
    ck_assert_int_eq(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
    ck_assert_int_eq(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
    ck_assert_msg(!lbt_path_exists(victim), "%s appeared on the host", victim);
}
END_TEST

START_TEST(test_host_shadow_refused)
{
    struct lbt_resp r;
    struct stat before, after;
    char *out;

    ck_assert_int_eq(stat("/etc/shadow", &before), 0);
    /* the sandbox's root cannot read it either: it is not host root */
    out = lbt_sh(&D, SBX, "cat /etc/shadow >/dev/null 2>&1; echo $?");
    ck_assert_str_ne(out, "0\n");
    free(out);
    lbt_file_get(&D, SBX, "", "/etc/shadow", &r);
    if (!lbt_variant_on_host()) {
        /* on an image the host's /etc is not there at all, and / is the sandbox's own
         * (writable) root: nothing written there reaches the host */
        lbt_assert_error(&r, 404, "not_found");
        lbt_resp_free(&r);
        lbt_file_put(&D, SBX, "", "/etc/lbt-planted", NULL, "x", 1, &r);
        lbt_resp_free(&r);
        ck_assert(!lbt_path_exists("/etc/lbt-planted"));
        ck_assert_int_eq(stat("/etc/shadow", &after), 0);
        ck_assert_int_eq(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
        return;
    }
    lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    lbt_file_put(&D, SBX, "", "/etc/shadow", NULL, "root::0:0:::::\n", 15, &r);
    ck_assert_msg(r.status == 400 || r.status == 403, "PUT /etc/shadow: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    lbt_file_put(&D, SBX, "", "/etc/lbt-planted", NULL, "x", 1, &r);
    ck_assert_msg(r.status == 400 || r.status == 403, "PUT /etc/lbt-planted: %ld %s", r.status,
                  r.body);
    lbt_resp_free(&r);
    ck_assert_int_eq(stat("/etc/shadow", &after), 0);
    ck_assert_int_eq(after.st_mtim.tv_sec, before.st_mtim.tv_sec);
    ck_assert_int_eq(after.st_mtim.tv_nsec, before.st_mtim.tv_nsec);
    ck_assert_int_eq(after.st_size, before.st_size);
    ck_assert(!lbt_path_exists("/etc/lbt-planted"));
}
END_TEST

/* GET with a Range header; returns the response (caller frees). */
static void get_range(const char *path, const char *range, const char *method, struct lbt_resp *r)
{
    char url[600], hdr[128];
    const char *headers[] = {hdr, NULL};

    snprintf(url, sizeof(url), "/v1/sandboxes/%s/files?path=%s", SBX, path);
    snprintf(hdr, sizeof(hdr), "Range: %s", range);
    lbt_request_ex(&D, method, url, "", NULL, 0, NULL, range ? headers : NULL, false, r);
}

START_TEST(test_range_and_head)
{
    static const struct {
        const char *range;
        long status;
        const char *body, *content_range;
    } cases[] = {
        {"bytes=2-4", 206, "234", "Content-Range: bytes 2-4/10"},
        {"bytes=5-", 206, "56789", "Content-Range: bytes 5-9/10"},
        {"bytes=-3", 206, "789", "Content-Range: bytes 7-9/10"},
        {"bytes=-30", 206, "0123456789", "Content-Range: bytes 0-9/10"},
        {"bytes=8-100", 206, "89", "Content-Range: bytes 8-9/10"},
        {"bytes=0-0", 206, "0", "Content-Range: bytes 0-0/10"},
        /* not one satisfiable byte range: ignored, the whole file (RFC 9110) */
        {"bytes=1-2,4-5", 200, "0123456789", NULL},
        {"items=1-2", 200, "0123456789", NULL},
        {"bytes=4-2", 200, "0123456789", NULL},
    };
    struct lbt_resp r;

    lbt_file_put(&D, SBX, "", "/workspace/range.txt", NULL, "0123456789", 10, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        get_range("/workspace/range.txt", cases[i].range, "GET", &r);
        ck_assert_msg(r.status == cases[i].status, "%s: %ld %s", cases[i].range, r.status, r.body);
        ck_assert_uint_eq(r.len, strlen(cases[i].body));
        ck_assert(memcmp(r.body, cases[i].body, r.len) == 0);
        if (cases[i].content_range)
            ck_assert_msg(strcasestr(r.headers, cases[i].content_range), "%s: headers %s",
                          cases[i].range, r.headers);
        else
            ck_assert(!strcasestr(r.headers, "Content-Range"));
        ck_assert(strcasestr(r.headers, "Accept-Ranges: bytes"));
        lbt_resp_free(&r);
    }
    /* unsatisfiable: 416 with the size, as a JSON error */
    get_range("/workspace/range.txt", "bytes=10-", "GET", &r);
    lbt_assert_error(&r, 416, "range_not_satisfiable");
    ck_assert(strcasestr(r.headers, "Content-Range: bytes */10"));
    lbt_resp_free(&r);
    get_range("/workspace/range.txt", "bytes=-0", "GET", &r);
    lbt_assert_error(&r, 416, "range_not_satisfiable");
    lbt_resp_free(&r);
    /* HEAD: the headers of the GET, no body */
    get_range("/workspace/range.txt", NULL, "HEAD", &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_uint_eq(r.len, 0);
    ck_assert_msg(strcasestr(r.headers, "Content-Length: 10"), "headers: %s", r.headers);
    lbt_resp_free(&r);
    get_range("/workspace/range.txt", "bytes=2-4", "HEAD", &r);
    ck_assert_int_eq(r.status, 206);
    ck_assert_uint_eq(r.len, 0);
    ck_assert(strcasestr(r.headers, "Content-Length: 3"));
    lbt_resp_free(&r);
    get_range("/workspace/missing.txt", NULL, "HEAD", &r);
    ck_assert_int_eq(r.status, 404);
    ck_assert_uint_eq(r.len, 0);
    lbt_resp_free(&r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("files");
    TCase *tc = tcase_create("files");

    lbt_fixture_add(tc,
                    &(struct lbt_fixture){
                        .d = &D, .prepare = prepare, .seed = seed, .release = remove_host_files},
                    true);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_all_byte_values);
    tcase_add_test(tc, test_nuls_and_empty);
    tcase_add_test(tc, test_one_mib);
    tcase_add_test(tc, test_64_mib);
    tcase_add_test(tc, test_parents_created_and_mode);
    tcase_add_test(tc, test_missing_file);
    tcase_add_test(tc, test_invalid_paths);
    tcase_add_test(tc, test_symlink_to_host);
    tcase_add_test(tc, test_host_shadow_refused);
    tcase_add_test(tc, test_range_and_head);
    suite_add_tcase(s, tc);
    tc = tcase_create("download_limit"); /* its own daemon */
    if (lbt_variant_is("docker"))
        lbt_fixture_add(
            tc, &(struct lbt_fixture){.d = &LIMIT_D, .args = LIMIT_ARGS, .stop_clean = true}, true);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_docker_download_limit);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
