/*
 * test_archive.c - acceptance: PUT/GET /v1/sandboxes/{id}/archive?path=DIR. A tree with modes,
 * symlinks (inside), a hard link and an empty directory goes in (plain and gzip) and comes back
 * exact; every escape (absolute names, "..", symlinks leaving DIR, a path through a symlink,
 * hard links out, device nodes, FIFOs) is a 400 that leaves nothing in the sandbox and nothing
 * on the host; a body that is not a tar is 400; an archive past the sandbox's storage is 413
 * with nothing left visible, as is one past the sandbox's memory on its tmpfs workdir (the pages
 * are charged to the sandbox); limits.max_file_bytes bounds what a small gzip body inflates to;
 * another sandbox's operate token is refused.
 */
#include <archive.h>
#include <archive_entry.h>
#include <openssl/sha.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static struct lbt_daemon D;
static char SBX[128], TOKEN[128];
static char HOST_DIR[64]; /* a host directory the escapes aim at */

static void remove_host_files(void)
{
    char p[128];

    if (!HOST_DIR[0])
        return;
    snprintf(p, sizeof(p), "%s/evil", HOST_DIR);
    unlink(p);
    rmdir(HOST_DIR);
}

static void prepare(void)
{
    snprintf(HOST_DIR, sizeof(HOST_DIR), "/tmp/lbt-archive-host-%d", (int)getpid());
    remove_host_files();
}

static void seed(void)
{
    json_t *lease = lbt_seed(&D, "archive-1", "task-archive", NULL);

    snprintf(SBX, sizeof(SBX), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    snprintf(TOKEN, sizeof(TOKEN), "%s",
             json_string_value(json_object_get(json_object_get(lease, "access"), "token")));
    json_decref(lease);
}

/* ---------- building archives ---------- */

struct tar {
    struct archive *a;
    char *buf;
    size_t cap, used;
};

static void tar_begin(struct tar *t, bool gzip)
{
    t->cap = 64 * 1024 * 1024;
    t->buf = malloc(t->cap);
    ck_assert_ptr_nonnull(t->buf);
    t->a = archive_write_new();
    archive_write_set_format_pax_restricted(t->a);
    if (gzip)
        archive_write_add_filter_gzip(t->a);
    ck_assert_int_eq(archive_write_open_memory(t->a, t->buf, t->cap, &t->used), ARCHIVE_OK);
}

/* type: 'f' file, 'd' directory, 'l' symlink (to), 'h' hard link (to), 'c' char device, 'p'
 * FIFO. */
static void tar_add(struct tar *t, char type, const char *name, int mode, const char *to,
                    const void *data, size_t len)
{
    struct archive_entry *e = archive_entry_new();

    archive_entry_set_pathname(e, name);
    archive_entry_set_perm(e, (mode_t)mode);
    switch (type) {
    case 'd':
        archive_entry_set_filetype(e, AE_IFDIR);
        break;
    case 'l':
        archive_entry_set_filetype(e, AE_IFLNK);
        archive_entry_set_symlink(e, to);
        break;
    case 'h':
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_hardlink(e, to);
        break;
    case 'c':
        archive_entry_set_filetype(e, AE_IFCHR);
        archive_entry_set_rdevmajor(e, 1);
        archive_entry_set_rdevminor(e, 3);
        break;
    case 'p':
        archive_entry_set_filetype(e, AE_IFIFO);
        break;
    default:
        archive_entry_set_filetype(e, AE_IFREG);
        archive_entry_set_size(e, (la_int64_t)len);
        break;
    }
    ck_assert_int_eq(archive_write_header(t->a, e), ARCHIVE_OK);
    if (type == 'f' && len > 0)
        ck_assert_int_eq(archive_write_data(t->a, data, len), (la_ssize_t)len);
    archive_entry_free(e);
}

static void tar_end(struct tar *t)
{
    ck_assert_int_eq(archive_write_close(t->a), ARCHIVE_OK);
    archive_write_free(t->a);
    t->a = NULL;
}

static void archive_url(char *url, size_t n, const char *sbx, const char *dir)
{
    snprintf(url, n, "/v1/sandboxes/%s/archive?path=%s", sbx, dir);
}

static void put_archive(const char *sbx, const char *token, const char *dir, const void *body,
                        size_t len, struct lbt_resp *r)
{
    char url[512];

    archive_url(url, sizeof(url), sbx, dir);
    lbt_request(&D, "PUT", url, token, body, len, "application/x-tar", r);
}

/* What the sandbox holds under dir, one line per entry: type, mode, name[ -> target]. */
static char *listing(const char *dir)
{
    char cmd[512];

    snprintf(
        cmd, sizeof(cmd),
        "cd '%s' && find . -mindepth 1 | LC_ALL=C sort | while read -r p; do "
        "if [ -L \"$p\" ]; then echo \"l $p -> $(readlink \"$p\")\"; "
        "elif [ -d \"$p\" ]; then echo \"d $(stat -c %%a \"$p\") $p\"; "
        "else echo \"f $(stat -c '%%a %%h %%s' \"$p\") $p $(sha256sum < \"$p\" | cut -c1-8)\"; fi; "
        "done",
        dir);
    return lbt_sh(&D, SBX, cmd);
}

/* Does anything whose name starts with ".lendbox-archive-" remain under /workspace? */
static void assert_no_stage(void)
{
    char *out = lbt_sh(&D, SBX, "find /workspace -name '.lendbox-archive-*' | wc -l");

    ck_assert_str_eq(out, "0\n");
    free(out);
}

/* The first 8 hex digits of data's SHA-256. */
static void sha8(const void *data, size_t len, char out[9])
{
    unsigned char md[SHA256_DIGEST_LENGTH];

    SHA256(data, len, md);
    for (int i = 0; i < 4; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
}

/* ---------- tests ---------- */

START_TEST(test_round_trip)
{
    static const char a_txt[] = "hello archive\n";
    static const char run_sh[] = "#!/bin/sh\necho run\n";
    unsigned char *blob = malloc(100000);
    struct tar t;
    struct lbt_resp r;
    char url[512], *out;
    struct archive *rd;
    struct archive_entry *e;
    int seen = 0;

    ck_assert_ptr_nonnull(blob);
    lbt_fill_random(blob, 100000, 24);
    tar_begin(&t, false);
    tar_add(&t, 'd', "./", 0755, NULL, NULL, 0);
    tar_add(&t, 'd', "./tree/", 0750, NULL, NULL, 0);
    tar_add(&t, 'f', "./tree/a.txt", 0640, NULL, a_txt, strlen(a_txt));
    tar_add(&t, 'f', "tree/run.sh", 04755, NULL, run_sh, strlen(run_sh)); /* setuid dropped */
    tar_add(&t, 'f', "tree/sub/b.bin", 0600, NULL, blob, 100000);         /* parent implied */
    tar_add(&t, 'l', "tree/link", 0777, "a.txt", NULL, 0);
    tar_add(&t, 'l', "tree/sub/up", 0777, "../a.txt", NULL, 0);
    tar_add(&t, 'd', "tree/empty", 0700, NULL, NULL, 0);
    tar_add(&t, 'h', "tree/hard", 0640, "tree/a.txt", NULL, 0);
    tar_add(&t, 'd', "tree/sticky/", 01777, NULL, NULL, 0);
    tar_end(&t);
    put_archive(SBX, "", "/workspace/rt", t.buf, t.used, &r);
    ck_assert_msg(r.status == 200, "PUT: %ld %s", r.status, r.body);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "path")), "/workspace/rt");
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "entries")), 9);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "bytes")),
                     (json_int_t)(strlen(a_txt) + strlen(run_sh) + 100000));
    ck_assert_int_eq(json_object_size(r.json), 3);
    lbt_resp_free(&r);
    out = listing("/workspace/rt");
    {
        char want[2048], ha[9], hr[9], hb[9];

        sha8(a_txt, strlen(a_txt), ha);
        sha8(run_sh, strlen(run_sh), hr);
        sha8(blob, 100000, hb);
        /* LXD's file API makes no hard links: there a hard link is a copy of its target */
        int links = lbt_variant_is("lxd") ? 1 : 2;
        /* nor sticky directories: its file API takes the permission bits only */
        const char *sticky = lbt_variant_is("lxd") ? "777" : "1777";

        snprintf(want, sizeof(want),
                 "d 750 ./tree\n"
                 "f 640 %d 14 ./tree/a.txt %s\n"
                 "d 700 ./tree/empty\n"
                 "f 640 %d 14 ./tree/hard %s\n"
                 "l ./tree/link -> a.txt\n"
                 "f 755 1 %zu ./tree/run.sh %s\n"
                 "d %s ./tree/sticky\n"
                 "d 755 ./tree/sub\n"
                 "f 600 1 100000 ./tree/sub/b.bin %s\n"
                 "l ./tree/sub/up -> ../a.txt\n",
                 links, ha, links, ha, strlen(run_sh), hr, sticky, hb);
        ck_assert_str_eq(out, want);
    }
    free(out);
    out = lbt_sh(&D, SBX, "stat -c '%u %g %a' /workspace/rt /workspace/rt/tree/a.txt");
    ck_assert_str_eq(out, "0 0 755\n0 0 640\n");
    free(out);
    assert_no_stage();

    free(t.buf);
    /* gzip, into the existing directory: merged (a file replaced, one added, the rest kept) */
    tar_begin(&t, true);
    tar_add(&t, 'f', "tree/a.txt", 0644, NULL, "new\n", 4);
    tar_add(&t, 'f', "tree/empty/added", 0600, NULL, "x", 1);
    tar_end(&t);
    put_archive(SBX, TOKEN, "/workspace/rt", t.buf, t.used, &r); /* the operate token */
    ck_assert_msg(r.status == 200, "PUT gzip: %ld %s", r.status, r.body);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "entries")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "bytes")), 5);
    lbt_resp_free(&r);
    out = lbt_sh(&D, SBX,
                 "cat /workspace/rt/tree/a.txt; stat -c %a /workspace/rt/tree/a.txt; "
                 "cat /workspace/rt/tree/hard; cat /workspace/rt/tree/empty/added; echo; "
                 "stat -c %a /workspace/rt/tree/empty; ls /workspace/rt/tree | wc -l");
    ck_assert_str_eq(out, "new\n644\nhello archive\nx\n700\n7\n");
    free(out);
    assert_no_stage();

    /* GET: the same tree back */
    archive_url(url, sizeof(url), SBX, "/workspace/rt/tree");
    lbt_request(&D, "GET", url, TOKEN, NULL, 0, NULL, &r);
    ck_assert_msg(r.status == 200, "GET: %ld %s", r.status, r.body);
    ck_assert_msg(strcasestr(r.headers, "Content-Type: application/x-tar") != NULL, "%s",
                  r.headers);
    rd = archive_read_new();
    archive_read_support_format_tar(rd);
    ck_assert_int_eq(archive_read_open_memory(rd, r.body, r.len), ARCHIVE_OK);
    while (archive_read_next_header(rd, &e) == ARCHIVE_OK) {
        const char *n = archive_entry_pathname(e);
        char data[100001];
        la_ssize_t got = 0;

        if (archive_entry_filetype(e) == AE_IFREG)
            got = archive_read_data(rd, data, sizeof(data));
        if (!strcmp(n, "sub/b.bin")) {
            ck_assert_int_eq(got, 100000);
            ck_assert(memcmp(data, blob, 100000) == 0);
            ck_assert_int_eq(archive_entry_perm(e), 0600);
            seen |= 1;
        } else if (!strcmp(n, "link")) {
            ck_assert_int_eq(archive_entry_filetype(e), AE_IFLNK);
            ck_assert_str_eq(archive_entry_symlink(e), "a.txt");
            seen |= 2;
        } else if (!strcmp(n, "empty/")) {
            ck_assert_int_eq(archive_entry_filetype(e), AE_IFDIR);
            ck_assert_int_eq(archive_entry_perm(e), 0700);
            seen |= 4;
        } else if (!strcmp(n, "run.sh")) {
            ck_assert_int_eq(got, (la_ssize_t)strlen(run_sh));
            ck_assert(memcmp(data, run_sh, strlen(run_sh)) == 0);
            ck_assert_int_eq(archive_entry_perm(e), 0755);
            seen |= 8;
        } else if (!strcmp(n, "sub/up")) {
            ck_assert_str_eq(archive_entry_symlink(e), "../a.txt");
            seen |= 16;
        } else if (!strcmp(n, "sticky/")) {
            ck_assert_int_eq(archive_entry_perm(e), lbt_variant_is("lxd") ? 0777 : 01777);
            seen |= 32;
        }
        ck_assert_msg(n[0] != '/' && strstr(n, "..") == NULL, "entry name %s", n);
    }
    ck_assert_int_eq(seen, 63);
    archive_read_free(rd);
    lbt_resp_free(&r);
    free(blob);
    free(t.buf);
}
END_TEST

/* One archive: a good file, then the escaping entry. 400, nothing kept anywhere. */
static void escape_case(const char *what, void (*add)(struct tar *t))
{
    struct tar t;
    struct lbt_resp r;
    char cmd[256], *out;

    tar_begin(&t, false);
    tar_add(&t, 'f', "ok.txt", 0644, NULL, "ok\n", 3);
    add(&t);
    tar_end(&t);
    put_archive(SBX, TOKEN, "/workspace/esc/inner", t.buf, t.used, &r);
    ck_assert_msg(r.status == 400, "%s: %ld %s", what, r.status, r.body);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    /* the same into an existing directory */
    put_archive(SBX, TOKEN, "/workspace/esc", t.buf, t.used, &r);
    ck_assert_msg(r.status == 400, "%s (existing dir): %ld %s", what, r.status, r.body);
    lbt_resp_free(&r);
    free(t.buf);
    snprintf(cmd, sizeof(cmd),
             "ls -A /workspace/esc; ls -A / | grep -c -e evil -e ok.txt; "
             "ls -A /workspace | grep -c -e evil -e ok.txt; ls /tmp | grep -c evil; true");
    out = lbt_sh(&D, SBX, cmd);
    ck_assert_msg(strcmp(out, "0\n0\n0\n") == 0, "%s: left %s", what, out);
    free(out);
    ck_assert_msg(!lbt_path_exists(HOST_DIR), "%s: %s made on the host", what, HOST_DIR);
    ck_assert(!lbt_path_exists("/evil"));
    ck_assert(!lbt_path_exists("/tmp/evil"));
}

static char NAME[256];

static void add_dotdot(struct tar *t)
{
    tar_add(t, 'f', "../evil", 0644, NULL, "x", 1);
}
static void add_deep_dotdot(struct tar *t)
{
    tar_add(t, 'f', "a/../../../../../../../../tmp/evil", 0644, NULL, "x", 1);
}
static void add_absolute(struct tar *t)
{
    snprintf(NAME, sizeof(NAME), "%s/evil", HOST_DIR);
    tar_add(t, 'f', NAME, 0644, NULL, "x", 1);
}
static void add_symlink_abs(struct tar *t)
{
    tar_add(t, 'l', "evil", 0777, "/tmp", NULL, 0);
    tar_add(t, 'f', "evil/evil", 0644, NULL, "x", 1);
}
static void add_symlink_up(struct tar *t)
{
    tar_add(t, 'l', "sub/evil", 0777, "../../..", NULL, 0);
}
static void add_through_symlink(struct tar *t)
{
    /* an inside symlink is fine, but no entry is written through one */
    tar_add(t, 'd', "real", 0755, NULL, NULL, 0);
    tar_add(t, 'l', "lnk", 0777, "real", NULL, 0);
    tar_add(t, 'f', "lnk/evil", 0644, NULL, "x", 1);
}
static void add_hardlink_out(struct tar *t)
{
    tar_add(t, 'h', "evil", 0644, "/etc/passwd", NULL, 0);
}
static void add_hardlink_up(struct tar *t)
{
    tar_add(t, 'h', "evil", 0644, "../ok.txt", NULL, 0);
}
static void add_hardlink_missing(struct tar *t)
{
    tar_add(t, 'h', "evil", 0644, "not-in-archive", NULL, 0);
}
static void add_device(struct tar *t)
{
    tar_add(t, 'c', "evil", 0666, NULL, NULL, 0);
}
static void add_fifo(struct tar *t)
{
    tar_add(t, 'p', "evil", 0666, NULL, NULL, 0);
}
static void add_symlink_chain(struct tar *t)
{
    /* each reads as inside; followed, x leads two levels above DIR */
    tar_add(t, 'l', "s", 0777, ".", NULL, 0);
    tar_add(t, 'l', "x", 0777, "s/s/../..", NULL, 0);
}
static void add_too_deep(struct tar *t)
{
    static char deep[1024];

    /* 257 levels: deeper than the merge into an existing directory checks */
    deep[0] = '\0';
    for (int i = 0; i < 256; i++)
        strcat(deep, "a/");
    strcat(deep, "evil");
    tar_add(t, 'f', deep, 0644, NULL, "x", 1);
}

START_TEST(test_escapes_refused)
{
    char *out = lbt_sh(&D, SBX, "mkdir -p /workspace/esc && echo ok");

    ck_assert_str_eq(out, "ok\n");
    free(out);
    escape_case("..", add_dotdot);
    escape_case("deep ..", add_deep_dotdot);
    escape_case("absolute name", add_absolute);
    escape_case("absolute symlink", add_symlink_abs);
    escape_case("symlink climbing out", add_symlink_up);
    escape_case("write through a symlink", add_through_symlink);
    escape_case("hard link out", add_hardlink_out);
    escape_case("hard link with ..", add_hardlink_up);
    escape_case("hard link to no earlier entry", add_hardlink_missing);
    escape_case("device node", add_device);
    escape_case("fifo", add_fifo);
    escape_case("257 levels deep", add_too_deep);
    escape_case("symlink chain climbing out", add_symlink_chain);
    assert_no_stage();
}
END_TEST

START_TEST(test_not_a_tar)
{
    static const char text[] = "this is not a tar archive, only some text\n";
    static const unsigned char
        gz_text[] = {0x1f, 0x8b, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                     0x03, 0xcb, 0x48, 0xcd, 0xc9, 0xc9, 0xe7, 0x02, 0x00,
                     0x20, 0x30, 0x3a, 0x36, 0x06, 0x00, 0x00, 0x00}; /* gzip of "hello\n" */
    struct lbt_resp r;
    char url[512], *out;

    put_archive(SBX, "", "/workspace/nt", text, strlen(text), &r);
    lbt_assert_error(&r, 400, "bad_request");
    ck_assert_msg(
        strstr(json_string_value(json_object_get(json_object_get(r.json, "error"), "message")),
               "not a tar") != NULL,
        "%s", r.body);
    lbt_resp_free(&r);
    put_archive(SBX, "", "/workspace/nt", "", 0, &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    put_archive(SBX, "", "/workspace/nt", gz_text, sizeof(gz_text), &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    {
        struct tar t;

        tar_begin(&t, false);
        tar_add(&t, 'd', "same", 0755, NULL, NULL, 0);
        tar_add(&t, 'f', "same", 0644, NULL, "x", 1);
        tar_end(&t);
        put_archive(SBX, "", "/workspace/nt", t.buf, t.used, &r);
        lbt_assert_error(&r, 400, "bad_request");
        lbt_resp_free(&r);
        free(t.buf);
        /* the other order: a file, then a directory of its name */
        tar_begin(&t, false);
        tar_add(&t, 'f', "same", 0644, NULL, "x", 1);
        tar_add(&t, 'd', "same", 0755, NULL, NULL, 0);
        tar_end(&t);
        put_archive(SBX, "", "/workspace/nt", t.buf, t.used, &r);
        lbt_assert_error(&r, 400, "bad_request");
        lbt_resp_free(&r);
        free(t.buf);
    }
    out = lbt_sh(&D, SBX, "ls -A /workspace | grep -c '^nt$'; true");
    ck_assert_str_eq(out, "0\n");
    free(out);
    assert_no_stage();
    /* bad paths and kinds */
    put_archive(SBX, "", "/workspace/../etc", text, strlen(text), &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    put_archive(SBX, "", "/", text, strlen(text), &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    out = lbt_sh(&D, SBX, "echo x > /workspace/afile && echo ok");
    free(out);
    archive_url(url, sizeof(url), SBX, "/workspace/afile");
    lbt_request(&D, "GET", url, "", NULL, 0, NULL, &r);
    lbt_assert_error(&r, 400, "bad_request");
    lbt_resp_free(&r);
    archive_url(url, sizeof(url), SBX, "/workspace/missing");
    lbt_request(&D, "GET", url, "", NULL, 0, NULL, &r);
    lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
}
END_TEST

START_TEST(test_past_storage)
{
    LBT_SKIP_UNLESS_CAN("disk_quota");
    json_t *lease = lbt_seed(&D, "archive-small", "t", "\"resources\": {\"disk_mib\": 4}");
    const char *sbx = json_string_value(json_object_get(lease, "sandbox_id"));
    size_t n = 3 * 1024 * 1024;
    unsigned char *blob = malloc(n);
    struct tar t;
    struct lbt_resp r;
    char *out;

    ck_assert_ptr_nonnull(blob);
    lbt_fill_random(blob, n, 7);
    tar_begin(&t, false);
    tar_add(&t, 'f', "one.bin", 0644, NULL, blob, n);
    tar_add(&t, 'f', "two.bin", 0644, NULL, blob, n); /* 6 MiB > 4 MiB */
    tar_end(&t);
    put_archive(sbx, "", "/workspace/big", t.buf, t.used, &r);
    lbt_assert_error(&r, 413, "payload_too_large");
    lbt_resp_free(&r);
    put_archive(sbx, "", "/workspace", t.buf, t.used, &r); /* an existing directory */
    lbt_assert_error(&r, 413, "payload_too_large");
    lbt_resp_free(&r);
    out = lbt_sh(&D, sbx, "ls -A /workspace | wc -l; du -sk /workspace | cut -f1");
    {
        int entries = -1, kib = -1;

        ck_assert_int_eq(sscanf(out, "%d %d", &entries, &kib), 2);
        ck_assert_msg(entries == 0, "left in /workspace: %s", out);
        ck_assert_msg(kib < 64, "space still used: %s", out);
    }
    free(out);
    /* what fits goes in */
    free(t.buf);
    tar_begin(&t, false);
    tar_add(&t, 'f', "one.bin", 0644, NULL, blob, n);
    tar_end(&t);
    put_archive(sbx, "", "/workspace/big", t.buf, t.used, &r);
    ck_assert_msg(r.status == 200, "PUT 3 MiB: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    free(t.buf);
    free(blob);
    json_decref(lease);
    lbt_release_session(&D, "archive-small");
}
END_TEST

/* Files extracted onto a memory-backed mount (the tmpfs workdir) are charged to the sandbox's
 * memory: past its memory_mib the archive is 413 naming it, with nothing kept. */
START_TEST(test_memory_charged)
{
    LBT_SKIP_ON_ENGINE("an engine writes the files itself, charged as the engine charges them; "
                       "the daemon's helper in the sandbox's memory cgroup is the local "
                       "provider's");
    json_t *lease = lbt_seed(&D, "archive-mem", "t", "\"resources\": {\"memory_mib\": 32}");
    const char *sbx = json_string_value(json_object_get(lease, "sandbox_id"));
    size_t n = 48 * 1024 * 1024;
    unsigned char *blob = malloc(n);
    struct tar t;
    struct lbt_resp r;
    char *out;

    ck_assert_ptr_nonnull(blob);
    lbt_fill_random(blob, n, 11);
    tar_begin(&t, false);
    tar_add(&t, 'f', "big.bin", 0644, NULL, blob, n);
    tar_end(&t);
    put_archive(sbx, "", "/workspace/mem", t.buf, t.used, &r);
    lbt_assert_error(&r, 413, "payload_too_large");
    ck_assert_msg(strstr(r.body, "memory") != NULL, "%s", r.body);
    lbt_resp_free(&r);
    out = lbt_sh(&D, sbx, "ls -A /workspace | wc -l");
    ck_assert_str_eq(out, "0\n");
    free(out);
    free(t.buf);
    /* what fits goes in, and is the sandbox's */
    tar_begin(&t, false);
    tar_add(&t, 'f', "small.bin", 0644, NULL, blob, 4 * 1024 * 1024);
    tar_end(&t);
    put_archive(sbx, "", "/workspace/mem", t.buf, t.used, &r);
    ck_assert_msg(r.status == 200, "PUT 4 MiB: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    free(t.buf);
    free(blob);
    json_decref(lease);
    lbt_release_session(&D, "archive-mem");
}
END_TEST

/* While an admin's exclusive exec runs, an operate-token archive is refused (409 conflict
 * naming the exec) and leaves nothing; the admin's still goes in. */
START_TEST(test_exclusive_fence)
{
    struct tar t;
    struct lbt_resp r;
    struct lbt_async *excl;
    char path[200], *out;

    LBT_SKIP_UNLESS_CAN("exclusive");

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", SBX);
    tar_begin(&t, false);
    tar_add(&t, 'f', "f.txt", 0644, NULL, "f", 1);
    tar_end(&t);
    /* without a trusted view (docker) an exclusive exec runs on the agent's root */
    excl = lbt_async_json(&D, "POST", path, "",
                          lbt_variant_lacks("trusted_view")
                              ? "{\"exclusive\": true, \"agent_root\": true, "
                                "\"command\": \"sleep 3; exit 4\"}"
                              : "{\"exclusive\": true, \"command\": \"sleep 3; exit 4\"}");
    if (lbt_variant_engine()) {
        /* no host uid to watch: the exclusive exec runs once an operate-token archive is
         * refused (those before it land in /workspace/probe) */
        long st = 0;

        for (int i = 0; i < 500 && st != 409; i++) {
            put_archive(SBX, TOKEN, "/workspace/probe", t.buf, t.used, &r);
            st = r.status;
            lbt_resp_free(&r);
            if (st != 409)
                lbt_sleep_ms(20);
        }
        ck_assert_int_eq(st, 409);
    } else {
        uid_t uid = lbt_sandbox_uid(&D, SBX);

        while (lbt_count_procs_of_uid_exact(uid, "sleep 3") == 0)
            lbt_sleep_ms(10);
    }
    put_archive(SBX, TOKEN, "/workspace/fenced", t.buf, t.used, &r);
    lbt_assert_error(&r, 409, "conflict");
    ck_assert_msg(strstr(r.body, "exclusive exec") != NULL, "%s", r.body);
    lbt_resp_free(&r);
    put_archive(SBX, "", "/workspace/by-admin", t.buf, t.used, &r);
    ck_assert_msg(r.status == 200, "admin during exclusive: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    lbt_async_join(excl, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "return_code")), 4);
    lbt_resp_free(&r);
    out = lbt_sh(&D, SBX, "ls -A /workspace | grep -c -e fenced -e by-admin; true");
    ck_assert_str_eq(out, "1\n");
    free(out);
    free(t.buf);
}
END_TEST

START_TEST(test_other_sandbox_token)
{
    json_t *lease = lbt_seed(&D, "archive-other", "t", NULL);
    const char *other_token =
        json_string_value(json_object_get(json_object_get(lease, "access"), "token"));
    struct tar t;
    struct lbt_resp r;
    char url[512], *out;

    tar_begin(&t, false);
    tar_add(&t, 'f', "x.txt", 0644, NULL, "x", 1);
    tar_end(&t);
    put_archive(SBX, other_token, "/workspace/other", t.buf, t.used, &r);
    ck_assert_msg(r.status == 403 || r.status == 401, "PUT: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    archive_url(url, sizeof(url), SBX, "/workspace");
    lbt_request(&D, "GET", url, other_token, NULL, 0, NULL, &r);
    ck_assert_msg(r.status == 403 || r.status == 401, "GET: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    lbt_request(&D, "GET", url, "not-a-token", NULL, 0, NULL, &r);
    lbt_assert_error(&r, 401, "unauthorized");
    lbt_resp_free(&r);
    out = lbt_sh(&D, SBX, "ls -A /workspace | grep -c '^other$'; true");
    ck_assert_str_eq(out, "0\n");
    free(out);
    free(t.buf);
    json_decref(lease);
    lbt_release_session(&D, "archive-other");
}
END_TEST

/* A tree 100 directories deep (the agent's to make) comes out whole and goes back in over
 * itself: the walk of a GET and the merge of a PUT into an existing directory recurse once
 * per level on a worker's small stack. */
START_TEST(test_deep_tree)
{
    char deep[512] = "", cmd[1200], url[512];
    struct lbt_resp r, p;
    struct archive *rd;
    struct archive_entry *e;
    int dirs = 0, files = 0;
    char *out;

    for (int i = 0; i < 100; i++)
        strcat(deep, i ? "/d" : "d");
    snprintf(cmd, sizeof(cmd), "mkdir -p /workspace/deep/%s && echo x > /workspace/deep/%s/f", deep,
             deep);
    free(lbt_sh(&D, SBX, cmd));
    archive_url(url, sizeof(url), SBX, "/workspace/deep");
    lbt_request(&D, "GET", url, "", NULL, 0, NULL, &r);
    ck_assert_msg(r.status == 200, "GET: %ld %s", r.status, r.body);
    rd = archive_read_new();
    archive_read_support_format_tar(rd);
    ck_assert_int_eq(archive_read_open_memory(rd, r.body, r.len), ARCHIVE_OK);
    while (archive_read_next_header(rd, &e) == ARCHIVE_OK) {
        if (archive_entry_filetype(e) == AE_IFDIR)
            dirs++;
        else if (!strcmp(archive_entry_pathname(e) + strlen(deep) + 1, "f"))
            files++;
    }
    archive_read_free(rd);
    ck_assert_int_eq(dirs, 100);
    ck_assert_int_eq(files, 1);
    put_archive(SBX, "", "/workspace/deep", r.body, r.len, &p);
    ck_assert_msg(p.status == 200, "PUT: %ld %s", p.status, p.body);
    ck_assert_int_eq(json_integer_value(json_object_get(p.json, "entries")), 101);
    lbt_resp_free(&p);
    lbt_resp_free(&r);
    snprintf(cmd, sizeof(cmd), "cat /workspace/deep/%s/f; rm -rf /workspace/deep", deep);
    out = lbt_sh(&D, SBX, cmd);
    ck_assert_str_eq(out, "x\n");
    free(out);
    assert_no_stage();
}
END_TEST

/* A daemon killed mid-extraction leaves its stage (".lendbox-archive-<random>", partly filled)
 * in the sandbox: the next put into the same directory, or one that makes a new directory
 * beside it, removes every stage no live put holds. */
START_TEST(test_stale_stage_swept)
{
    struct tar t;
    struct lbt_resp r;
    char *out;

    LBT_SKIP_ON_ENGINE("about the local provider's staging directories; an engine takes the "
                       "checked archive whole, with no stage in the sandbox");
    out = lbt_sh(&D, SBX,
                 "mkdir -p /workspace/st/.lendbox-archive-00112233aabbccdd/sub && "
                 "echo half > /workspace/st/.lendbox-archive-00112233aabbccdd/sub/f && "
                 "mkdir -p /workspace/.lendbox-archive-0123456789abcdef/x && "
                 "chmod 500 /workspace/.lendbox-archive-0123456789abcdef && echo ok");

    ck_assert_str_eq(out, "ok\n");
    free(out);
    tar_begin(&t, false);
    tar_add(&t, 'f', "a", 0644, NULL, "a\n", 2);
    tar_end(&t);
    put_archive(SBX, TOKEN, "/workspace/st", t.buf, t.used, &r);
    ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
    lbt_resp_free(&r);
    put_archive(SBX, TOKEN, "/workspace/st2", t.buf, t.used, &r);
    ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
    lbt_resp_free(&r);
    free(t.buf);
    assert_no_stage();
    out =
        lbt_sh(&D, SBX, "ls -A /workspace/st /workspace/st2; rm -rf /workspace/st /workspace/st2");
    ck_assert_str_eq(out, "/workspace/st:\na\n\n/workspace/st2:\na\n");
    free(out);
}
END_TEST

/* A GET never follows what the agent planted out of its sandbox: links in DIR come as links,
 * a DIR through a symlink resolves in the sandbox's root (the host's directory of that name is
 * not read), a DIR through /proc's links to a root is refused. */
START_TEST(test_get_planted_links)
{
    char cmd[512], url[512], p[128], *out;
    struct lbt_resp r;
    FILE *f;

    ck_assert_int_eq(mkdir(HOST_DIR, 0755), 0);
    snprintf(p, sizeof(p), "%s/evil", HOST_DIR);
    f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs("host secret\n", f);
    fclose(f);
    snprintf(cmd, sizeof(cmd),
             "mkdir -p /workspace/g && ln -s %s /workspace/g/h && ln -s /proc/1/root%s "
             "/workspace/g/p && ln -s /proc/self/root /workspace/g/r && echo ok",
             HOST_DIR, HOST_DIR);
    out = lbt_sh(&D, SBX, cmd);
    ck_assert_str_eq(out, "ok\n");
    free(out);
    archive_url(url, sizeof(url), SBX, "/workspace/g");
    lbt_request(&D, "GET", url, TOKEN, NULL, 0, NULL, &r);
    ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
    ck_assert(memmem(r.body, r.len, "host secret", 11) == NULL);
    lbt_resp_free(&r);
    /* lxd's file API does not follow a DIR that is itself a symlink: 400 "not a directory" */
    archive_url(url, sizeof(url), SBX, "/workspace/g/h");
    lbt_request(&D, "GET", url, TOKEN, NULL, 0, NULL, &r);
    if (lbt_variant_is("lxd"))
        lbt_assert_error(&r, 400, "bad_request");
    else
        lbt_assert_error(&r, 404, "not_found");
    lbt_resp_free(&r);
    archive_url(url, sizeof(url), SBX, "/workspace/g/p");
    lbt_request(&D, "GET", url, TOKEN, NULL, 0, NULL, &r);
    if (lbt_variant_is("lxd"))
        lbt_assert_error(&r, 400, "bad_request");
    else if (lbt_variant_engine()) /* the engine resolves the link inside the container */
        lbt_assert_error(&r, 404, "not_found");
    else /* the sandbox's root may not look into its init */
        lbt_assert_error(&r, 403, "forbidden");
    lbt_resp_free(&r);
    archive_url(url, sizeof(url), SBX, "/workspace/g/r/tmp");
    lbt_request(&D, "GET", url, TOKEN, NULL, 0, NULL, &r);
    if (lbt_variant_is("lxd")) { /* resolved inside the container: its own /tmp at most */
        ck_assert_msg(r.status == 200 || r.status == 404, "%ld %s", r.status, r.body);
        ck_assert(memmem(r.body, r.len, "host secret", 11) == NULL);
    } else {
        lbt_assert_error(&r, 404, "not_found"); /* the daemon has no pid in the sandbox's /proc */
    }
    lbt_resp_free(&r);
    free(lbt_sh(&D, SBX, "rm -rf /workspace/g"));
    remove_host_files();
}
END_TEST

/* A GET of url with TOKEN on a raw connection whose reader stops after the status line: the
 * answer (larger than the socket buffers) stays unsent, its spool held. The socket. */
static int stuck_get(const char *url)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    const char *port = strrchr(D.base_url, ':');
    int fd = socket(AF_INET, SOCK_STREAM, 0), small = 4096;
    char req[1024], got[16];
    size_t n = 0;

    ck_assert_int_ge(fd, 0);
    ck_assert_ptr_nonnull(port);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    sa.sin_port = htons((uint16_t)atoi(port + 1));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n",
             url, TOKEN);
    ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    while (n < 12) {
        ssize_t k = read(fd, got + n, 12 - n);

        ck_assert_int_gt(k, 0);
        n += (size_t)k;
    }
    ck_assert_int_eq(memcmp(got, "HTTP/1.1 200", 12), 0);
    return fd;
}

/* Each archive request holds a temporary file of the daemon's host (up to max_file_bytes) until
 * its answer is sent: an agent that never reads its answers holds at most two of them; a
 * third archive request with its token is 429 until one is let go (the admin's are not). */
START_TEST(test_spools_bounded)
{
    char url[512], *out;
    struct lbt_resp r;
    int a, b, i;

    out = lbt_sh(&D, SBX,
                 "mkdir -p /workspace/big && head -c 16777216 /dev/urandom > /workspace/big/f "
                 "&& echo ok");
    ck_assert_str_eq(out, "ok\n");
    free(out);
    archive_url(url, sizeof(url), SBX, "/workspace/big");
    a = stuck_get(url);
    b = stuck_get(url);
    lbt_request(&D, "GET", url, TOKEN, NULL, 0, NULL, &r);
    lbt_assert_error(&r, 429, "overloaded");
    ck_assert_msg(strstr(r.body, "already in flight") != NULL, "%s", r.body);
    ck_assert_msg(strcasestr(r.headers, "Retry-After: 1") != NULL, "%s", r.headers);
    lbt_resp_free(&r);
    put_archive(SBX, TOKEN, "/workspace/other", "", 0, &r);
    lbt_assert_error(&r, 429, "overloaded");
    lbt_resp_free(&r);
    put_archive(SBX, "", "/workspace/other", "", 0, &r); /* the admin is not held up */
    lbt_assert_error(&r, 400, "bad_request");            /* an empty body is no tar */
    lbt_resp_free(&r);
    close(a);
    close(b);
    for (i = 0; i < 100; i++) { /* the daemon lets go of the answers once it sees them gone */
        lbt_request(&D, "GET", url, TOKEN, NULL, 0, NULL, &r);
        if (r.status != 429)
            break;
        lbt_resp_free(&r);
        usleep(100 * 1000);
    }
    ck_assert_msg(r.status == 200, "%ld %s", r.status, r.body);
    ck_assert_uint_gt(r.len, 16777216);
    lbt_resp_free(&r);
    free(lbt_sh(&D, SBX, "rm -rf /workspace/big"));
}
END_TEST

/* A daemon with a small limits.max_file_bytes: a gzip bomb (a small body that inflates past it)
 * is 413 with nothing kept, and a GET of a tree past it is 413. */
static struct lbt_daemon SMALL_D;
static const char *const SMALL_ARGS[] = {"--set", "limits.max_file_bytes=1048576", NULL};

START_TEST(test_bomb_bounded)
{
    json_t *lease = lbt_seed(&SMALL_D, "archive-bomb", "t", NULL);
    const char *sbx = json_string_value(json_object_get(lease, "sandbox_id"));
    size_t n = 4 * 1024 * 1024;
    unsigned char *zeros = calloc(1, n);
    struct tar t;
    struct lbt_resp r;
    char url[512], cmd[512];

    ck_assert_ptr_nonnull(zeros);
    tar_begin(&t, true);
    tar_add(&t, 'f', "small", 0644, NULL, "s", 1);
    tar_add(&t, 'f', "zeros", 0644, NULL, zeros, n);
    tar_end(&t);
    ck_assert_uint_lt(t.used, 1048576); /* the body itself is within the limit */
    archive_url(url, sizeof(url), sbx, "/workspace/bomb");
    lbt_request(&SMALL_D, "PUT", url, "", t.buf, t.used, "application/gzip", &r);
    lbt_assert_error(&r, 413, "payload_too_large");
    ck_assert_msg(strstr(r.body, "max_file_bytes") != NULL, "%s", r.body);
    lbt_resp_free(&r);
    free(t.buf);
    snprintf(cmd, sizeof(cmd),
             "{\"command\": \"ls -A /workspace | wc -l; "
             "head -c 1500000 /dev/zero > /workspace/big; echo done\"}");
    lbt_exec(&SMALL_D, sbx, "", cmd, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "stdout")), "0\ndone\n");
    lbt_resp_free(&r);
    /* GET of a tree past the limit */
    archive_url(url, sizeof(url), sbx, "/workspace");
    lbt_request(&SMALL_D, "GET", url, "", NULL, 0, NULL, &r);
    lbt_assert_error(&r, 413, "payload_too_large");
    lbt_resp_free(&r);
    free(zeros);
    json_decref(lease);
    lbt_release_session(&SMALL_D, "archive-bomb");
}
END_TEST

/* Small gzip bodies whose headers cost the daemon, not the sandbox: the same 4000-byte
 * directory name repeated (its name kept for every entry until the modes are applied) and
 * nothing but "./" headers (no entry counted, only inflated) are 413 with nothing kept. */
START_TEST(test_header_bombs)
{
    json_t *lease = lbt_seed(&SMALL_D, "archive-headers", "t", NULL);
    const char *sbx = json_string_value(json_object_get(lease, "sandbox_id"));
    char deep[4100] = "", url[512];
    struct tar t;
    struct lbt_resp r;
    char *out;

    for (int i = 0; i < 16; i++) { /* 16 components of 249 bytes */
        size_t n = strlen(deep);

        if (i)
            deep[n++] = '/';
        memset(deep + n, 'a' + i, 249);
        deep[n + 249] = '\0';
    }
    tar_begin(&t, true);
    for (int i = 0; i < 9000; i++) /* 36 MB of names */
        tar_add(&t, 'd', deep, 0755, NULL, NULL, 0);
    tar_end(&t);
    ck_assert_uint_lt(t.used, 1048576);
    archive_url(url, sizeof(url), sbx, "/workspace/names");
    lbt_request(&SMALL_D, "PUT", url, "", t.buf, t.used, "application/gzip", &r);
    lbt_assert_error(&r, 413, "payload_too_large");
    ck_assert_msg(strstr(r.body, "directory entries") != NULL, "%s", r.body);
    lbt_resp_free(&r);
    free(t.buf);

    tar_begin(&t, true);
    for (int i = 0; i < 200001; i++)
        tar_add(&t, 'd', "./", 0755, NULL, NULL, 0);
    tar_end(&t);
    ck_assert_uint_lt(t.used, 1048576);
    archive_url(url, sizeof(url), sbx, "/workspace/roots");
    lbt_request(&SMALL_D, "PUT", url, "", t.buf, t.used, "application/gzip", &r);
    lbt_assert_error(&r, 413, "payload_too_large");
    ck_assert_msg(strstr(r.body, "more than 200000 entries") != NULL, "%s", r.body);
    lbt_resp_free(&r);
    free(t.buf);
    out = lbt_sh(&SMALL_D, sbx, "ls -A /workspace | wc -l");
    ck_assert_str_eq(out, "0\n");
    free(out);
    json_decref(lease);
    lbt_release_session(&SMALL_D, "archive-headers");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("archive");
    TCase *tc = tcase_create("archive");

    lbt_fixture_add(tc,
                    &(struct lbt_fixture){
                        .d = &D, .prepare = prepare, .seed = seed, .release = remove_host_files},
                    true);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_escapes_refused);
    tcase_add_test(tc, test_not_a_tar);
    tcase_add_test(tc, test_past_storage);
    tcase_add_test(tc, test_memory_charged);
    tcase_add_test(tc, test_exclusive_fence);
    tcase_add_test(tc, test_other_sandbox_token);
    tcase_add_test(tc, test_deep_tree);
    tcase_add_test(tc, test_stale_stage_swept);
    tcase_add_test(tc, test_get_planted_links);
    tcase_add_test(tc, test_spools_bounded);
    suite_add_tcase(s, tc);
    tc = tcase_create("bounded"); /* its own daemon */
    lbt_fixture_add(tc, &(struct lbt_fixture){.d = &SMALL_D, .args = SMALL_ARGS}, true);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_bomb_bounded);
    tcase_add_test(tc, test_header_bombs);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
