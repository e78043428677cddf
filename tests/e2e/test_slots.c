/*
 * test_slots.c - host-wide uid slot claims: two daemons configured with the same uid_base on
 * different state dirs never use the same slot (a stop kills every process of the slot's ids),
 * a crashed daemon's slots stay claimed for its surviving sandboxes, and an adopted sandbox
 * whose uid is not slot-aligned (an older version's) blocks every slot its ids reach into.
 * And the harness's own host-wide claims (lbt_claim), which keep two test runs at once apart.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define SLOT_IDS 65536u
#define CLAIM_DIR "/run/lendbox/slots"

static struct lbt_daemon D1, D2;

/* The second daemon: its own state dir, the first one's uid_base. */
static void start_d2(void)
{
    static char set[64];
    const char *args[] = {"--set", set, NULL};

    snprintf(set, sizeof(set), "local.uid_base=%u", D1.uid_base);
    lbt_daemon_start(&D2, args);
    D2.uid_base = D1.uid_base;
}

/* Seed rsid on d; returns its slot's first host id, the sandbox id into sbx. */
static uid_t seed(struct lbt_daemon *d, const char *rsid, char *sbx, size_t size)
{
    json_t *lease = lbt_seed(d, rsid, "task-slots", NULL);
    uid_t u;

    snprintf(sbx, size, "%s", json_string_value(json_object_get(lease, "sandbox_id")));
    json_decref(lease);
    u = lbt_sandbox_uid(d, sbx);
    ck_assert_uint_eq((u - d->uid_base) % SLOT_IDS, 0);
    ck_assert_uint_lt(u - d->uid_base, d->uid_count * SLOT_IDS);
    return u;
}

/* Does the claim of the slot starting at first name d's state dir? (false: no claim file) */
static bool claimed_by(struct lbt_daemon *d, uid_t first)
{
    char path[128], want[PATH_MAX + 4], buf[PATH_MAX + 64] = "", *real;
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "%s/%u", CLAIM_DIR, (unsigned)first);
    f = fopen(path, "r");
    if (!f)
        return false;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    real = realpath(d->state_dir, NULL);
    ck_assert_ptr_nonnull(real);
    snprintf(want, sizeof(want), " %s\n", real);
    free(real);
    return strstr(buf, want) != NULL;
}

static void assert_exec_ok(struct lbt_daemon *d, const char *sbx)
{
    char *out = lbt_sh(d, sbx, "echo alive");

    ck_assert_str_eq(out, "alive\n");
    free(out);
}

static bool in(uid_t u, const uid_t *set, int n)
{
    for (int i = 0; i < n; i++)
        if (set[i] == u)
            return true;
    return false;
}

START_TEST(test_same_base_disjoint_slots)
{
    char s1[4][64], s2[8][64], sx[64], rsid[32];
    uid_t u1[4], u2[8], u;

    LBT_SKIP_ON_VARIANT("docker", "about the local provider's id slots");
    start_d2();
    for (int i = 0; i < 4; i++) {
        snprintf(rsid, sizeof(rsid), "slots-a%d", i);
        u1[i] = seed(&D1, rsid, s1[i], sizeof(s1[i]));
        snprintf(rsid, sizeof(rsid), "slots-b%d", i);
        u2[i] = seed(&D2, rsid, s2[i], sizeof(s2[i]));
    }
    /* same range, slot-aligned: distinct first ids are disjoint slots */
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(!in(u1[i], u2, 4), "both daemons use slot %u", (unsigned)u1[i]);
        ck_assert_msg(claimed_by(&D1, u1[i]), "slot %u not claimed by daemon 1", (unsigned)u1[i]);
        ck_assert_msg(claimed_by(&D2, u2[i]), "slot %u not claimed by daemon 2", (unsigned)u2[i]);
    }
    /* releasing all of daemon 2's leaves daemon 1's running, and frees daemon 2's claims */
    for (int i = 0; i < 4; i++) {
        snprintf(rsid, sizeof(rsid), "slots-b%d", i);
        lbt_release_session(&D2, rsid);
        ck_assert(!claimed_by(&D2, u2[i]));
    }
    for (int i = 0; i < 4; i++) {
        ck_assert_int_gt(lbt_count_live_procs_of_uid(u1[i]), 0);
        assert_exec_ok(&D1, s1[i]);
    }
    /* daemon 1 dies (kill -9): its sandboxes live on, and daemon 2 keeps off their slots */
    lbt_daemon_kill(&D1);
    for (int i = 0; i < 4; i++) {
        snprintf(rsid, sizeof(rsid), "slots-c%d", i);
        u2[i] = seed(&D2, rsid, s2[i], sizeof(s2[i]));
        ck_assert_msg(!in(u2[i], u1, 4), "daemon 2 took dead daemon 1's live slot %u",
                      (unsigned)u2[i]);
    }
    /* daemon 1 again: it re-claims its slots, its sandboxes work, and nobody shares */
    lbt_daemon_restart(&D1, NULL);
    for (int i = 0; i < 4; i++) {
        ck_assert(claimed_by(&D1, u1[i]));
        assert_exec_ok(&D1, s1[i]);
        assert_exec_ok(&D2, s2[i]);
    }
    for (int i = 4; i < 6; i++) {
        snprintf(rsid, sizeof(rsid), "slots-c%d", i);
        u2[i] = seed(&D2, rsid, s2[i], sizeof(s2[i]));
        ck_assert(!in(u2[i], u1, 4));
    }
    u = seed(&D1, "slots-a4", sx, sizeof(sx));
    ck_assert(!in(u, u2, 6) && !in(u, u1, 4));
    for (int i = 0; i < 6; i++) {
        snprintf(rsid, sizeof(rsid), "slots-c%d", i);
        lbt_release_session(&D2, rsid);
    }
    for (int i = 0; i < 4; i++) {
        assert_exec_ok(&D1, s1[i]);
        snprintf(rsid, sizeof(rsid), "slots-a%d", i);
        lbt_release_session(&D1, rsid);
        ck_assert(!claimed_by(&D1, u1[i]));
    }
    lbt_release_session(&D1, "slots-a4");
}
END_TEST

START_TEST(test_adopted_unaligned_uid_blocks_its_slots)
{
    char sa[64], sx[64], rsid[32], path[400], sql[512];
    uid_t ua, odd, u;
    json_t *desc;
    sqlite3 *db;

    LBT_SKIP_ON_VARIANT("docker", "about the local provider's id slots");
    ua = seed(&D1, "slots-old", sa, sizeof(sa));
    /* as if an older version had given it a uid that is not slot-aligned: its ids reach into
     * the slot of ua and the next one */
    lbt_daemon_kill(&D1);
    odd = ua + SLOT_IDS / 2;
    desc = lbt_read_descriptor(&D1, sa);
    ck_assert_ptr_nonnull(desc);
    ck_assert_int_eq(json_object_set_new(desc, "uid", json_integer(odd)), 0);
    snprintf(path, sizeof(path), "%s/sandboxes/%s/descriptor.json", D1.state_dir, sa);
    ck_assert_int_eq(json_dump_file(desc, path, 0), 0);
    json_decref(desc);
    /* and the daemon's own record of it, as an upgrade would find both */
    snprintf(path, sizeof(path), "%s/lendbox.db", D1.state_dir);
    ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
    snprintf(sql, sizeof(sql),
             "UPDATE sandboxes SET descriptor_json = json_set(descriptor_json, '$.uid', %u) "
             "WHERE id = '%s'",
             (unsigned)odd, sa);
    ck_assert_int_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    ck_assert_int_eq(sqlite3_changes(db), 1);
    sqlite3_close(db);
    lbt_daemon_restart(&D1, NULL);
    ck_assert_msg(claimed_by(&D1, ua), "slot %u not claimed", (unsigned)ua);
    ck_assert_msg(claimed_by(&D1, ua + SLOT_IDS), "slot %u not claimed", (unsigned)ua + SLOT_IDS);
    /* neither daemon hands out either slot (both allocators start at the range's start) */
    start_d2();
    for (int i = 0; i < 3; i++) {
        snprintf(rsid, sizeof(rsid), "slots-n%d", i);
        u = seed(&D1, rsid, sx, sizeof(sx));
        ck_assert_msg(u != ua && u != ua + SLOT_IDS, "daemon 1 reused slot %u", (unsigned)u);
        snprintf(rsid, sizeof(rsid), "slots-m%d", i);
        u = seed(&D2, rsid, sx, sizeof(sx));
        ck_assert_msg(u != ua && u != ua + SLOT_IDS, "daemon 2 took slot %u", (unsigned)u);
    }
    ck_assert_int_gt(lbt_count_live_procs_of_uid(ua), 0);
    /* its release frees both */
    lbt_release_session(&D1, "slots-old");
    ck_assert(!claimed_by(&D1, ua));
    ck_assert(!claimed_by(&D1, ua + SLOT_IDS));
    for (int i = 0; i < 3; i++) {
        snprintf(rsid, sizeof(rsid), "slots-n%d", i);
        lbt_release_session(&D1, rsid);
        snprintf(rsid, sizeof(rsid), "slots-m%d", i);
        lbt_release_session(&D2, rsid);
    }
}
END_TEST

START_TEST(test_unaligned_base_refused)
{
    const char *daemon = getenv("LENDBOXD") ? getenv("LENDBOXD") : "build/lendboxd";
    const char *sup =
        getenv("LENDBOX_SUPERVISE") ? getenv("LENDBOX_SUPERVISE") : "build/lendbox-supervise";
    char dir[] = "/tmp/lbt-slots-XXXXXX", cmd[2048], buf[4096];
    size_t got;
    FILE *p;
    int st;

    LBT_SKIP_ON_VARIANT("docker", "about the local provider's id slots");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd),
             "timeout 120 '%s' --state-dir '%s' --listen 127.0.0.1:0 --set local.supervise='%s' "
             "--set local.uid_base=%u 2>&1",
             daemon, dir, sup, D1.uid_base + 1);
    p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    got = fread(buf, 1, sizeof(buf) - 1, p);
    buf[got] = '\0';
    st = pclose(p);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) != 0, "daemon started: %s", buf);
    ck_assert_msg(strstr(buf, "is not a multiple of 65536") != NULL, "output: %s", buf);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* --- lbt_claim: four processes claiming at once get four distinct indexes and hold them (a
 * flock by anyone else fails); a holder killed by SIGKILL frees exactly its index --- */
START_TEST(test_harness_claims_exclusive)
{
    char kind[32], path[128];
    int got[2], go[2], k[2], seen[4] = {0}, held_by[4], again;
    pid_t kids[4], parent = getpid();

    snprintf(kind, sizeof(kind), "selftest-%d", (int)getpid());
    ck_assert_int_eq(pipe(got), 0);
    ck_assert_int_eq(pipe(go), 0);
    for (int i = 0; i < 4; i++) {
        kids[i] = fork();
        ck_assert_int_ge(kids[i], 0);
        if (kids[i] == 0) {
            char c;

            if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent ||
                read(go[0], &c, 1) != 1)
                _exit(2);
            k[0] = i;
            k[1] = lbt_claim(kind, 4, 1, NULL);
            if (write(got[1], k, sizeof(k)) != sizeof(k))
                _exit(3);
            for (;;)
                pause(); /* holds the claim until killed */
        }
    }
    ck_assert_int_eq(write(go[1], "xxxx", 4), 4); /* all four claim at once */
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(read(got[0], k, sizeof(k)), sizeof(k));
        ck_assert_msg(k[1] >= 0 && k[1] < 4 && !seen[k[1]], "index %d handed out twice", k[1]);
        seen[k[1]] = 1;
        held_by[k[0]] = k[1];
    }
    for (int i = 0; i < 4; i++) {
        int fd;

        snprintf(path, sizeof(path), LBT_CLAIM_DIR "/%s.%d", kind, i);
        fd = open(path, O_RDWR | O_CLOEXEC);
        ck_assert_int_ge(fd, 0);
        ck_assert_msg(flock(fd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK,
                      "claim %s is not held", path);
        close(fd);
    }
    /* the holder's SIGKILL frees its index, and only that one */
    kill(kids[2], SIGKILL);
    ck_assert_int_eq(waitpid(kids[2], NULL, 0), kids[2]);
    again = lbt_claim(kind, 4, 1, NULL);
    ck_assert_int_eq(again, held_by[2]);
    for (int i = 0; i < 4; i++) {
        if (i != 2) {
            kill(kids[i], SIGKILL);
            ck_assert_int_eq(waitpid(kids[i], NULL, 0), kids[i]);
        }
    }
    lbt_release(kind, 0, 4);
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof(path), LBT_CLAIM_DIR "/%s.%d", kind, i);
        unlink(path);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("slots");
    TCase *tc = tcase_create("slots");

    tcase_set_timeout(tc, 300);
    /* D2 is started by some tests; cleaning up a daemon never started does nothing */
    lbt_fixture_add(tc, &(struct lbt_fixture){.d = &D1}, false);
    lbt_test_daemon_cleanup(tc, &D2);
    tcase_add_test(tc, test_same_base_disjoint_slots);
    tcase_add_test(tc, test_adopted_unaligned_uid_blocks_its_slots);
    tcase_add_test(tc, test_unaligned_base_refused);
    suite_add_tcase(s, tc);
    tc = tcase_create("claims");
    tcase_add_test(tc, test_harness_claims_exclusive);
    suite_add_tcase(s, tc);
    return lbt_run_suite(s);
}
