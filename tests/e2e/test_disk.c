/*
 * test_disk.c - acceptance for disk bounds: no sandbox can fill the disk of all
 * lending, and no writable mount bypasses the sandbox's limits.
 *
 * - a sandbox that writes past resources.disk_mib gets ENOSPC inside; other sessions still
 *   seed and exec; its release works and leaves nothing in the state dir
 * - a state dir on a small tmpfs filled from outside: /readyz is 503, releases and deletes
 *   still succeed and are recorded (on the store's space reserve), new seeds are 503 until
 *   space returns, then /readyz is 200 and seeds work again
 * - resources.disk_mib outside 1..limits.max_disk_mib is 400
 * - every writable mount inside a sandbox (findmnt) is a tmpfs of the documented size, or a
 *   device node, /proc or /dev/pts; / and /dev are read-only
 * - uploads to /dev/shm past its size, and PUTs past disk_mib, are 413 and leave nothing
 * - local.storage = dir: workdirs under local.data_dir, disk_mib is 422, release removes them
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

/* The fixture's daemon: state dir under /var/tmp, which the sandboxes' read-only host binds
 * expose, so the tmpfs hiding it is among the mounts checked. */
static struct lbt_daemon D;

#define TMP_SIZE_MIB 80
#define MAX_DISK_MIB 2048

static const char *const ARGS[] = {"--set", "local.tmp_size_mib=80", "--set",
                                   "limits.max_disk_mib=2048", NULL};

static json_t *seed_with(struct lbt_daemon *d, const char *rsid, const char *resources, char *sbx,
                         size_t sbx_len)
{
    char extra[256];
    json_t *lease;

    snprintf(extra, sizeof(extra), "\"resources\": %s", resources);
    lease = lbt_seed(d, rsid, "task-disk", extra);
    snprintf(sbx, sbx_len, "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    return lease;
}

static void release_ok(struct lbt_daemon *d, const char *rsid, const char *sbx)
{
    struct lbt_resp r;
    char path[256];

    snprintf(path, sizeof(path), "/v1/sessions/%s/release", rsid);
    lbt_json(d, "POST", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "release %s: %ld %s", rsid, r.status, r.body);
    ck_assert(json_is_true(json_object_get(r.json, "released")));
    ck_assert_str_eq(json_string_value(json_object_get(r.json, "sandbox_id")), sbx);
    lbt_resp_free(&r);
}

/* Files of at least min_bytes anywhere under dir (recursively), not counting skip. */
static int count_big_files(const char *dir, long long min_bytes, const char *skip)
{
    char cmd[600], buf[64];
    FILE *p;
    int n = 0;

    /* on dir's own file system: an image root's mounts under a sandbox's directory are not
     * host disk (its upper dir is a tmpfs, lower the read-only image); the daemon's own copy
     * of the supervisor (about 1 MiB) is not a sandbox's data either */
    snprintf(cmd, sizeof(cmd),
             "find '%s' -xdev -name lower -prune -o -type f -size +%lldc ! -name '%s' "
             "! -name lendbox-supervise -print | wc -l",
             dir, min_bytes - 1, skip);
    p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    if (fgets(buf, sizeof(buf), p))
        n = atoi(buf);
    pclose(p);
    return n;
}

/* A sandbox dd's past its disk_mib: ENOSPC inside, at exactly its quota; another session
 * seeds and runs meanwhile; the release works and leaves nothing in the state dir. */
START_TEST(test_quota_enospc_inside)
{
    char filler[128], other[128], dir[400];
    json_t *lease, *res;
    char *out;
    const char *err_text;

    lease = seed_with(&D, "disk-filler", "{\"disk_mib\": 16}", filler, sizeof(filler));
    json_decref(lease);
    res = lbt_exec_ok(&D, filler, "",
                      "{\"command\": \"dd if=/dev/zero of=/workspace/fill bs=1M count=64; "
                      "echo rc=$?; stat -c %s /workspace/fill\"}");
    out = (char *)json_string_value(json_object_get(res, "stdout"));
    err_text = json_string_value(json_object_get(res, "stderr"));
    ck_assert_msg(strstr(err_text, "No space left on device") != NULL, "stderr: %s", err_text);
    ck_assert_msg(strstr(out, "rc=1\n16777216\n") != NULL, "stdout: %s", out);
    json_decref(res);

    /* the host's state dir holds none of it */
    ck_assert_int_eq(count_big_files(D.state_dir, 1024 * 1024, "lendbox.db.reserve"), 0);

    /* other sessions are unaffected */
    lease = seed_with(&D, "disk-other", "{\"disk_mib\": 8}", other, sizeof(other));
    json_decref(lease);
    out = lbt_sh(&D, other, "echo fine > /workspace/a && cat /workspace/a");
    ck_assert_str_eq(out, "fine\n");
    free(out);

    release_ok(&D, "disk-filler", filler);
    snprintf(dir, sizeof(dir), "%s/sandboxes/%s", D.state_dir, filler);
    ck_assert_msg(!lbt_path_exists(dir), "%s is left", dir);
    ck_assert_int_eq(count_big_files(D.state_dir, 1024 * 1024, "lendbox.db.reserve"), 0);
    release_ok(&D, "disk-other", other);
}
END_TEST

static void seed_expect(struct lbt_daemon *d, const char *rsid, const char *resources, long status,
                        const char *code)
{
    char path[256], body[512];
    struct lbt_resp r;

    snprintf(path, sizeof(path), "/v1/sessions/%s/seed", rsid);
    snprintf(body, sizeof(body), "{\"task_id\": \"t\", \"resources\": %s}", resources);
    lbt_json(d, "POST", path, "", body, &r);
    ck_assert_msg(r.status == status, "seed %s: %ld %s", resources, r.status, r.body);
    if (code)
        lbt_assert_error(&r, status, code);
    lbt_resp_free(&r);
}

START_TEST(test_disk_mib_validation)
{
    struct lbt_resp r;
    json_t *list;

    seed_expect(&D, "disk-v", "{\"disk_mib\": 0}", 400, "bad_request");
    seed_expect(&D, "disk-v", "{\"disk_mib\": -1}", 400, "bad_request");
    seed_expect(&D, "disk-v", "{\"disk_mib\": 1.5}", 400, "bad_request");
    seed_expect(&D, "disk-v", "{\"disk_mib\": \"64\"}", 400, "bad_request");
    seed_expect(&D, "disk-v", "{\"disk_mib\": null}", 400, "bad_request");
    seed_expect(&D, "disk-v", "{\"disk_mib\": 16777217}", 400, "bad_request");
    seed_expect(&D, "disk-v", "{\"disk_mib\": 2049}", 400, "bad_request"); /* max_disk_mib */
    /* nothing was recorded for the session */
    list = lbt_list_sandboxes(&D);
    ck_assert_int_eq(lbt_count_records_of_session(list, "disk-v"), 0);
    json_decref(list);
    /* the bounds themselves are fine */
    seed_expect(&D, "disk-v", "{\"disk_mib\": 2048}", 200, NULL);
    lbt_json(&D, "POST", "/v1/sessions/disk-v/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
    seed_expect(&D, "disk-v1", "{\"disk_mib\": 1}", 200, NULL);
    lbt_json(&D, "POST", "/v1/sessions/disk-v1/release", "", NULL, &r);
    ck_assert_int_eq(r.status, 200);
    lbt_resp_free(&r);
}
END_TEST

/* Check every mount findmnt lists inside sbx: read-only, or a tmpfs whose size is in
 * want (target -> MiB), or a device node / /proc / /dev/pts. Each target of want must appear. */
struct want_size {
    const char *target;
    long mib;
    bool seen;
};

static void check_mounts(const char *sbx, struct want_size *want, size_t n_want)
{
    char *out = lbt_sh(&D, sbx, "findmnt -rn -o TARGET,FSTYPE,OPTIONS");
    static const char *const devices[] = {"/dev/null",   "/dev/zero",    "/dev/full",
                                          "/dev/random", "/dev/urandom", "/dev/tty"};
    char *save = NULL, *line;
    bool root_ro = false, dev_ro = false;
    /* on an image (the image variant) / is the writable overlay over it, its upper dir a tmpfs
     * of disk_mib (the workdir's size): statfs of / shows that tmpfs */
    bool image = !lbt_variant_on_host();

    for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char target[1024], fstype[64], opts[1024];
        bool rw, ok = false;

        ck_assert_int_eq(sscanf(line, "%1023s %63s %1023s", target, fstype, opts), 3);
        rw = strncmp(opts, "rw", 2) == 0 && (opts[2] == ',' || opts[2] == '\0');
        if (strcmp(target, "/") == 0)
            root_ro = !rw;
        if (strcmp(target, "/dev") == 0)
            dev_ro = !rw;
        if (!rw)
            continue;
        if (strcmp(fstype, "tmpfs") == 0) {
            for (size_t i = 0; i < n_want; i++) {
                char size[64];

                if (strcmp(target, want[i].target) != 0)
                    continue;
                snprintf(size, sizeof(size), ",size=%ldk,", want[i].mib * 1024);
                ck_assert_msg(strstr(opts, size) != NULL, "%s: want %s in %s", target, size, opts);
                want[i].seen = ok = true;
            }
        } else if (strcmp(fstype, "overlay") == 0 && image && strcmp(target, "/") == 0) {
            char *size = lbt_sh(&D, sbx, "df -k --output=size / | tail -1 | tr -d ' '");

            ck_assert_int_eq(atol(size), want[0].mib * 1024);
            free(size);
            root_ro = ok = true; /* writable, but only within its own quota */
        } else if (strcmp(fstype, "proc") == 0) {
            ok = strcmp(target, "/proc") == 0;
        } else if (strcmp(fstype, "devpts") == 0) {
            ok = strcmp(target, "/dev/pts") == 0;
        } else if (strcmp(fstype, "devtmpfs") == 0) {
            for (size_t i = 0; i < sizeof(devices) / sizeof(devices[0]); i++)
                ok = ok || strcmp(target, devices[i]) == 0;
        }
        if (!ok) {
            /* A host mount under a directory the sandbox cannot enter (a container engine's
             * storage under a root-only 0700 dir, say) stays as the host made it: bubblewrap
             * cannot remount what it cannot reach, and neither can the sandbox reach it. */
            char cmd[1200], *seen;

            snprintf(cmd, sizeof(cmd), "stat -- '%s' >/dev/null 2>&1 && echo reachable || true",
                     target);
            seen = lbt_sh(&D, sbx, cmd);
            ok = strstr(seen, "reachable") == NULL;
            free(seen);
        }
        ck_assert_msg(ok, "writable mount without a size from the limits: %s", line);
    }
    ck_assert_msg(root_ro && dev_ro, "/ and /dev must be read-only");
    for (size_t i = 0; i < n_want; i++)
        ck_assert_msg(want[i].seen, "no writable tmpfs at %s", want[i].target);
    free(out);
}

/* The documented rule: workdir = disk_mib; /tmp = min(tmp_size_mib, disk_mib);
 * /run = min(64, disk_mib); /dev/shm = min(memory_mib, disk_mib), or disk_mib. */
START_TEST(test_mount_sizes)
{
    char sbx[128], hider[1200];
    struct want_size a[] = {{"/workspace", 100, false},
                            {"/tmp", TMP_SIZE_MIB, false},
                            {"/run", 64, false},
                            {"/dev/shm", 32, false}};
    struct want_size b[] = {{"/workspace", 20, false},
                            {"/tmp", 20, false},
                            {"/run", 20, false},
                            {"/dev/shm", 20, false}};
    struct want_size c[] = {{"/workspace", 1024, false},
                            {"/tmp", TMP_SIZE_MIB, false},
                            {"/run", 64, false},
                            {"/dev/shm", 1024, false}};
    json_t *lease;
    char *out;

    lease = seed_with(&D, "disk-m1", "{\"disk_mib\": 100, \"memory_mib\": 32}", sbx, sizeof(sbx));
    json_decref(lease);
    check_mounts(sbx, a, 4);
    /* the state dir is behind an empty, read-only tmpfs (on an image: not there at all) */
    snprintf(hider, sizeof(hider),
             "test -e %s || { echo absent; exit 0; }; "
             "findmnt -rn -o FSTYPE,OPTIONS %s | cut -d, -f1; ls -A %s | wc -l",
             D.state_dir, D.state_dir, D.state_dir);
    out = lbt_sh(&D, sbx, hider);
    ck_assert_str_eq(out, lbt_variant_on_host() ? "tmpfs ro\n0\n" : "absent\n");
    free(out);
    release_ok(&D, "disk-m1", sbx);

    lease = seed_with(&D, "disk-m2", "{\"disk_mib\": 20}", sbx, sizeof(sbx));
    json_decref(lease);
    check_mounts(sbx, b, 4);
    release_ok(&D, "disk-m2", sbx);

    /* no resources: limits.default_disk_mib (1024) */
    lease = lbt_seed(&D, "disk-m3", "t", NULL);
    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    check_mounts(sbx, c, 4);
    out = lbt_sh(&D, sbx, "touch /dev/x 2>&1; touch /x 2>&1; true");
    ck_assert_msg(strstr(out, "/dev/x': Read-only file system") &&
                      strstr(out, "/x': Read-only file system"),
                  "%s", out);
    free(out);
    release_ok(&D, "disk-m3", sbx);
}
END_TEST

/* Three 100 MiB uploads to /dev/shm with memory_mib 64: /dev/shm is 64 MiB, so each is 413 and
 * leaves nothing behind (they used to land, uncharged, in bwrap's unsized /dev). */
START_TEST(test_shm_upload_limit)
{
    size_t len = 100u << 20;
    char *data = malloc(len), sbx[128], name[64];
    struct lbt_resp r;
    json_t *lease;
    char *out;

    ck_assert_ptr_nonnull(data);
    memset(data, 'x', len);
    lease = seed_with(&D, "disk-shm", "{\"memory_mib\": 64}", sbx, sizeof(sbx));
    json_decref(lease);
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof(name), "/dev/shm/up%d", i);
        lbt_file_put(&D, sbx, "", name, NULL, data, len, &r);
        lbt_assert_error(&r, 413, "payload_too_large");
        ck_assert_msg(
            strstr(json_string_value(json_object_get(json_object_get(r.json, "error"), "message")),
                   "64 MiB") != NULL,
            "%s", r.body);
        lbt_resp_free(&r);
    }
    out = lbt_sh(&D, sbx,
                 "ls -A /dev/shm | wc -l; df -k --output=used /dev/shm | tail -1 | tr -d ' '");
    ck_assert_str_eq(out, "0\n0\n");
    free(out);
    /* what fits still goes in */
    lbt_file_put(&D, sbx, "", "/dev/shm/small", NULL, data, 1u << 20, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
    free(data);
    /* tmpfs pages a sandbox writes are charged to its memory cgroup: 100 MiB into the 1 GiB
     * workdir is stopped by memory_mib 64 (the writer is killed) */
    {
        json_t *res = lbt_exec_ok(&D, sbx, "",
                                  "{\"command\": \"dd if=/dev/zero of=/workspace/f bs=1M "
                                  "count=100 2>/dev/null; echo rc=$?; stat -c %s /workspace/f\"}");
        const char *o = json_string_value(json_object_get(res, "stdout"));
        long long size = -1;

        ck_assert_msg(strncmp(o, "rc=137\n", 7) == 0, "stdout: %s", o);
        ck_assert_int_eq(sscanf(o + 7, "%lld", &size), 1);
        ck_assert_msg(size > 0 && size <= 64ll << 20, "size %lld", size);
        json_decref(res);
    }
    release_ok(&D, "disk-shm", sbx);
}
END_TEST

/* A PUT larger than disk_mib is 413, leaves no partial file, and frees what it took. */
START_TEST(test_put_past_quota)
{
    size_t len = 12u << 20;
    char *data = malloc(len), sbx[128];
    struct lbt_resp r;
    json_t *lease;
    char *out;

    ck_assert_ptr_nonnull(data);
    memset(data, 'y', len);
    lease = seed_with(&D, "disk-put", "{\"disk_mib\": 8}", sbx, sizeof(sbx));
    json_decref(lease);
    lbt_file_put(&D, sbx, "", "/workspace/sub/big.bin", NULL, data, len, &r);
    lbt_assert_error(&r, 413, "payload_too_large");
    ck_assert_msg(strstr(r.body, "8 MiB") != NULL, "%s", r.body);
    lbt_resp_free(&r);
    out = lbt_sh(
        &D, sbx,
        "ls -A /workspace/sub | wc -l; df -k --output=used /workspace | tail -1 | tr -d ' '");
    ck_assert_str_eq(out, "0\n0\n");
    free(out);
    /* bytes written inside and through the API share the quota */
    out = lbt_sh(&D, sbx, "head -c 6291456 /dev/zero > /workspace/inside && echo ok");
    ck_assert_str_eq(out, "ok\n");
    free(out);
    lbt_file_put(&D, sbx, "", "/workspace/more.bin", NULL, data, 4u << 20, &r);
    lbt_assert_error(&r, 413, "payload_too_large");
    lbt_resp_free(&r);
    lbt_file_put(&D, sbx, "", "/workspace/more.bin", NULL, data, 1u << 20, &r);
    ck_assert_int_eq(r.status, 204);
    lbt_resp_free(&r);
    free(data);
    release_ok(&D, "disk-put", sbx);
}
END_TEST

/* ---- a full state dir ---- */

static long readyz(struct lbt_daemon *d, char *msg, size_t msg_len)
{
    struct lbt_resp r;
    long st;

    lbt_request(d, "GET", "/readyz", NULL, NULL, 0, NULL, &r);
    st = r.status;
    if (msg)
        snprintf(msg, msg_len, "%s", r.body ? r.body : "");
    if (st == 503)
        lbt_assert_error(&r, 503, "draining");
    lbt_resp_free(&r);
    return st;
}

static long wait_readyz(struct lbt_daemon *d, long want, char *msg, size_t msg_len)
{
    long st = 0;

    for (int i = 0; i < 100 && st != want; i++) {
        st = readyz(d, msg, msg_len);
        if (st != want)
            lbt_sleep_ms(100);
    }
    return st;
}

/* Write zeros to path until the file system is full; returns the bytes written. */
static long long fill_up(const char *path)
{
    static char chunk[65536];
    long long total = 0;
    size_t sz = sizeof(chunk);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

    ck_assert_int_ge(fd, 0);
    while (sz >= 512) {
        ssize_t n = write(fd, chunk, sz);

        if (n > 0) {
            total += n;
            continue;
        }
        ck_assert_msg(n < 0 && errno == ENOSPC, "filling %s: %s", path, strerror(errno));
        sz /= 2; /* the last pages */
    }
    close(fd);
    return total;
}

static void record_is(json_t *list, const char *id, const char *state, const char *reason)
{
    json_t *rec = lbt_find_record(list, id);

    ck_assert_msg(rec != NULL, "no record %s", id);
    ck_assert_str_eq(json_string_value(json_object_get(rec, "state")), state);
    ck_assert_str_eq(json_string_value(json_object_get(rec, "stop_reason")), reason);
}

/* The paths of the full_state_dir tcase are made by its unchecked fixture, in the parent
 * process, so that a test failing half-way still gets its daemons stopped (through their pid
 * files: the shutdown sweep stops their sandboxes), its tmpfs unmounted and its directories
 * removed. */
static char MNT[32], DIR_STATE[2][32], DIR_DATA[32];

static void setup_full(void)
{
    snprintf(MNT, sizeof(MNT), "/tmp/lbt-disk-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(MNT));
    ck_assert_int_eq(mount("tmpfs", MNT, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=0711"), 0);
    for (int i = 0; i < 2; i++) {
        snprintf(DIR_STATE[i], sizeof(DIR_STATE[i]), "/var/tmp/lendbox-e2e-XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(DIR_STATE[i]));
    }
    snprintf(DIR_DATA, sizeof(DIR_DATA), "/var/tmp/lbt-data-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(DIR_DATA));
}

static void stop_leftover(const char *state_dir, const char *log_path)
{
    struct lbt_daemon d;

    if (!lbt_path_exists(state_dir))
        return; /* the test cleaned up after itself */
    memset(&d, 0, sizeof(d));
    snprintf(d.state_dir, sizeof(d.state_dir), "%s", state_dir);
    snprintf(d.log_path, sizeof(d.log_path), "%s.log", log_path ? log_path : state_dir);
    lbt_daemon_cleanup(&d);
}

static void teardown_full(void)
{
    char path[64];

    snprintf(path, sizeof(path), "%s/filler", MNT);
    (void)unlink(path);
    snprintf(path, sizeof(path), "%s/state", MNT);
    stop_leftover(path, MNT);
    if (umount2(MNT, MNT_DETACH) < 0 || rmdir(MNT) < 0)
        fprintf(stderr, "test_disk: cannot remove %s: %s\n", MNT, strerror(errno));
    for (int i = 0; i < 2; i++)
        stop_leftover(DIR_STATE[i], NULL);
    (void)rmdir(DIR_DATA);
}

START_TEST(test_full_state_dir)
{
    static const char *const args[] = {"--set", "server.store_reserve_mib=4", NULL};
    char state[64], log[64], filler[64], reserve[96];
    char s1[128], s2[128], s3[128], s4[128], msg[1024], path[256];
    struct lbt_daemon F;
    struct lbt_resp r;
    struct stat sb;
    json_t *lease, *list;

    snprintf(state, sizeof(state), "%s/state", MNT);
    snprintf(log, sizeof(log), "%s.log", MNT); /* outside the tmpfs */
    snprintf(filler, sizeof(filler), "%s/filler", MNT);
    snprintf(reserve, sizeof(reserve), "%s/lendbox.db.reserve", state);
    lbt_daemon_start_at(&F, state, log, args);
    ck_assert_int_eq(stat(reserve, &sb), 0);
    ck_assert_int_eq(sb.st_size, 4 << 20);

    json_decref(seed_with(&F, "full-1", "{\"disk_mib\": 64}", s1, sizeof(s1)));
    json_decref(seed_with(&F, "full-2", "{\"disk_mib\": 64}", s2, sizeof(s2)));
    json_decref(seed_with(&F, "full-3", "{\"disk_mib\": 64}", s3, sizeof(s3)));
    /* the sandboxes' own data is not on the state dir's file system */
    {
        char *out = lbt_sh(&F, s1, "head -c 33554432 /dev/zero > /workspace/big && echo ok");

        ck_assert_str_eq(out, "ok\n");
        free(out);
    }

    ck_assert_int_gt(fill_up(filler), 0);
    ck_assert_int_eq(wait_readyz(&F, 503, msg, sizeof(msg)), 503);
    ck_assert_msg(strstr(msg, "full") != NULL, "%s", msg);

    /* stops still work and are recorded: the first one spends the reserve */
    release_ok(&F, "full-1", s1);
    ck_assert_msg(!lbt_path_exists(reserve), "the reserve was not spent");
    release_ok(&F, "full-2", s2);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s", s3);
    lbt_json(&F, "DELETE", path, "", NULL, &r);
    ck_assert_msg(r.status == 200, "delete: %ld %s", r.status, r.body);
    lbt_resp_free(&r);
    list = lbt_list_sandboxes(&F);
    record_is(list, s1, "stopped", "released");
    record_is(list, s2, "stopped", "released");
    record_is(list, s3, "stopped", "deleted");
    json_decref(list);
    /* new sandboxes wait: the space freed is the stops' */
    seed_expect(&F, "full-4", "{\"disk_mib\": 8}", 503, "draining");
    ck_assert_int_eq(readyz(&F, NULL, 0), 503);

    /* space returns: ready again, the reserve is back, seeds work */
    ck_assert_int_eq(unlink(filler), 0);
    ck_assert_int_eq(wait_readyz(&F, 200, msg, sizeof(msg)), 200);
    ck_assert_int_eq(stat(reserve, &sb), 0);
    ck_assert_int_eq(sb.st_size, 4 << 20);
    lease = seed_with(&F, "full-4", "{\"disk_mib\": 8}", s4, sizeof(s4));
    json_decref(lease);
    release_ok(&F, "full-4", s4);

    lbt_daemon_cleanup(&F);
}
END_TEST

/* local.storage = dir: the workdir is <data_dir>/<id> on the host, owned by the sandbox's uid
 * and hidden from other sandboxes; disk_mib cannot be enforced there (422); release removes
 * it. Once with the default data dir (<state_dir>/data), once with one of its own; both
 * under /var/tmp, which the sandboxes' host binds expose. */
static void storage_dir_case(bool own_data_dir)
{
    const char *state = DIR_STATE[own_data_dir ? 1 : 0];
    char data[64], set_dir[96], sbx[128], host[256], cmd[1024], *out;
    const char *args[] = {"--set", "local.storage=dir", own_data_dir ? "--set" : NULL, set_dir,
                          NULL};
    struct lbt_daemon G;
    struct stat sb;
    json_t *lease;

    if (own_data_dir)
        snprintf(data, sizeof(data), "%s", DIR_DATA);
    else
        snprintf(data, sizeof(data), "%s/data", state);
    snprintf(set_dir, sizeof(set_dir), "local.data_dir=%s", data);
    lbt_daemon_start_at(&G, state, NULL, args);
    seed_expect(&G, "dir-1", "{\"disk_mib\": 64}", 422, "unenforceable");
    lease = lbt_seed(&G, "dir-1", "t", NULL);
    snprintf(sbx, sizeof(sbx), "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    snprintf(cmd, sizeof(cmd),
             "echo hi > /workspace/f && findmnt -rn -o FSTYPE /workspace; "
             "test -e %s || { echo absent; exit 0; }; "
             "findmnt -rn -o FSTYPE,OPTIONS %s | cut -d, -f1",
             own_data_dir ? data : state, own_data_dir ? data : state);
    out = lbt_sh(&G, sbx, cmd);
    /* a host directory at the workdir; the data (or state) dir behind an empty ro tmpfs (on an
     * image the host's directories are not there at all) */
    ck_assert_msg(strncmp(out, "tmpfs\n", 6) != 0 &&
                      strstr(out, lbt_variant_on_host() ? "\ntmpfs ro\n" : "\nabsent\n"),
                  "%s", out);
    free(out);
    snprintf(host, sizeof(host), "%s/%s/f", data, sbx);
    ck_assert_int_eq(stat(host, &sb), 0);
    ck_assert_uint_eq(sb.st_uid, lbt_sandbox_uid(&G, sbx));
    ck_assert_int_eq(sb.st_size, 3);
    release_ok(&G, "dir-1", sbx);
    snprintf(host, sizeof(host), "%s/%s", data, sbx);
    ck_assert_msg(!lbt_path_exists(host), "%s is left", host);
    lbt_daemon_cleanup(&G);
}

START_TEST(test_storage_dir)
{
    storage_dir_case(false);
    storage_dir_case(true);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("disk");
    TCase *tc = tcase_create("quota");
    TCase *full = tcase_create("full_state_dir");

    lbt_fixture_add(tc, &(struct lbt_fixture){.d = &D, .args = ARGS, .state_parent = "/var/tmp"},
                    true);
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_quota_enospc_inside);
    tcase_add_test(tc, test_disk_mib_validation);
    tcase_add_test(tc, test_mount_sizes);
    tcase_add_test(tc, test_shm_upload_limit);
    tcase_add_test(tc, test_put_past_quota);
    suite_add_tcase(s, tc);
    tcase_add_unchecked_fixture(full, setup_full, teardown_full);
    tcase_set_timeout(full, 180);
    tcase_add_test(full, test_full_state_dir);
    tcase_add_test(full, test_storage_dir);
    suite_add_tcase(s, full);
    return lbt_run_suite(s);
}
