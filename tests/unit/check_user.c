/* check_user.c - unit tests of src/supervisor/user.c, the lookup of a sandbox's users in its
 * own /etc/passwd and /etc/group: names, numbers, NAME:GROUP, supplementary groups only from
 * the root's group file, unknown users and groups, ids out of range, and symlinks that must
 * stay inside the root. The switch itself is tested end to end in tests/e2e/test_users.c. */
#include <check.h>
#include <stdbool.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "supervisor/user.h"

static char root[64];
static int rootfd = -1;

static void put(const char *rel, const char *text)
{
    char path[256];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", root, rel);
    f = fopen(path, "we");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static void setup(void)
{
    char etc[128];

    snprintf(root, sizeof(root), "/tmp/check-user-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
    snprintf(etc, sizeof(etc), "%s/etc", root);
    ck_assert_int_eq(mkdir(etc, 0755), 0);
    put("etc/passwd", "root:x:0:0:root:/root:/bin/bash\n"
                      "# a comment line\n"
                      "alice:x:1000:1000:Alice:/home/alice:/bin/sh\n"
                      "bob:x:1001:100::/home/bob:/bin/sh\n"
                      "broken:x:notanumber:1:::\n"
                      "big:x:70000:70000::/:/bin/sh\n"
                      "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    put("etc/group", "root:x:0:\n"
                     "users:x:100:alice\n"
                     "alice:x:1000:\n"
                     "wheel:x:10:bob,alice\n"
                     "docker:x:999:bob\n"
                     "nogroup:x:65534:\n");
    rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    ck_assert_int_ge(rootfd, 0);
}

static void teardown(void)
{
    char cmd[128];

    close(rootfd);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
}

static bool has_group(const struct sup_user *u, uint32_t g)
{
    for (size_t i = 0; i < u->ngroups; i++)
        if (u->groups[i] == g)
            return true;
    return false;
}

START_TEST(test_names_and_groups)
{
    struct sup_user u;
    char why[200] = "";

    ck_assert_int_eq(sup_user_resolve(rootfd, "alice", &u, why, sizeof(why)), 0);
    ck_assert_uint_eq(u.uid, 1000);
    ck_assert_uint_eq(u.gid, 1000);
    ck_assert_str_eq(u.home, "/home/alice");
    ck_assert_uint_eq(u.ngroups, 3); /* 1000, users, wheel */
    ck_assert(has_group(&u, 1000) && has_group(&u, 100) && has_group(&u, 10));
    ck_assert(!has_group(&u, 0) && !has_group(&u, 999));

    ck_assert_int_eq(sup_user_resolve(rootfd, "bob", &u, why, sizeof(why)), 0);
    ck_assert_uint_eq(u.uid, 1001);
    ck_assert_uint_eq(u.gid, 100);
    ck_assert_uint_eq(u.ngroups, 3); /* 100, wheel, docker */
    ck_assert(has_group(&u, 100) && has_group(&u, 10) && has_group(&u, 999));

    ck_assert_int_eq(sup_user_resolve(rootfd, "nobody", &u, why, sizeof(why)), 0);
    ck_assert_uint_eq(u.uid, 65534);
    ck_assert_uint_eq(u.ngroups, 1);
    ck_assert(!has_group(&u, 0));

    ck_assert_int_eq(sup_user_resolve(rootfd, NULL, &u, why, sizeof(why)), 0);
    ck_assert_uint_eq(u.uid, 0);
    ck_assert_str_eq(u.home, "/root");
}
END_TEST

START_TEST(test_numbers_and_pairs)
{
    struct sup_user u;
    char why[200] = "";

    /* a uid in passwd is that entry */
    ck_assert_int_eq(sup_user_resolve(rootfd, "1001", &u, why, sizeof(why)), 0);
    ck_assert_uint_eq(u.gid, 100);
    ck_assert(has_group(&u, 999));
    /* one not in passwd: gid = uid, HOME /, no other group */
    ck_assert_int_eq(sup_user_resolve(rootfd, "4242", &u, why, sizeof(why)), 0);
    ck_assert_uint_eq(u.uid, 4242);
    ck_assert_uint_eq(u.gid, 4242);
    ck_assert_str_eq(u.home, "/");
    ck_assert_uint_eq(u.ngroups, 1);
    /* NAME:GROUP and UID:GID */
    ck_assert_int_eq(sup_user_resolve(rootfd, "alice:docker", &u, why, sizeof(why)), 0);
    ck_assert_uint_eq(u.uid, 1000);
    ck_assert_uint_eq(u.gid, 999);
    ck_assert(has_group(&u, 999) && has_group(&u, 100));
    ck_assert_int_eq(sup_user_resolve(rootfd, "5:6", &u, why, sizeof(why)), 0);
    ck_assert_uint_eq(u.uid, 5);
    ck_assert_uint_eq(u.gid, 6);
    ck_assert_int_eq(sup_user_resolve(rootfd, "65535", &u, why, sizeof(why)), 0);
}
END_TEST

START_TEST(test_refusals)
{
    struct sup_user u;
    char why[200] = "";

    ck_assert_int_eq(sup_user_resolve(rootfd, "nosuchuser", &u, why, sizeof(why)), -ENOENT);
    ck_assert_str_eq(why, "unknown user \"nosuchuser\"");
    ck_assert_int_eq(sup_user_resolve(rootfd, "alice:nosuchgroup", &u, why, sizeof(why)), -ENOENT);
    ck_assert_str_eq(why, "unknown group \"nosuchgroup\"");
    ck_assert_int_eq(sup_user_resolve(rootfd, "65536", &u, why, sizeof(why)), -ERANGE);
    ck_assert_int_eq(sup_user_resolve(rootfd, "99999999999999", &u, why, sizeof(why)), -ERANGE);
    ck_assert_int_eq(sup_user_resolve(rootfd, "1:70000", &u, why, sizeof(why)), -ERANGE);
    /* an entry whose ids are out of range or malformed is no user */
    ck_assert_int_eq(sup_user_resolve(rootfd, "big", &u, why, sizeof(why)), -ENOENT);
    ck_assert_int_eq(sup_user_resolve(rootfd, "broken", &u, why, sizeof(why)), -ENOENT);
    ck_assert_int_eq(sup_user_resolve(rootfd, ":", &u, why, sizeof(why)), -EINVAL);
    ck_assert_int_eq(sup_user_resolve(rootfd, "alice:", &u, why, sizeof(why)), -EINVAL);
    ck_assert_int_eq(sup_user_resolve(rootfd, "a:b:c", &u, why, sizeof(why)), -EINVAL);
}
END_TEST

/* The files are the root's: a symlink to an absolute path resolves inside it (never to the
 * host's /etc/passwd), a missing file is empty, a FIFO is refused without blocking. */
START_TEST(test_files_stay_in_the_root)
{
    struct sup_user u;
    char why[200] = "", path[200];

    snprintf(path, sizeof(path), "%s/etc/passwd", root);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(symlink("/etc/passwd.real", path), 0);
    put("etc/passwd.real", "carol:x:1500:1500::/home/carol:/bin/sh\n");
    ck_assert_int_eq(sup_user_resolve(rootfd, "carol", &u, why, sizeof(why)), 0);
    ck_assert_uint_eq(u.uid, 1500);
    /* root: not in this passwd, the host's is not read: uid 0 all the same */
    ck_assert_int_eq(sup_user_resolve(rootfd, "root", &u, why, sizeof(why)), 0);
    ck_assert_uint_eq(u.uid, 0);
    ck_assert_int_eq(sup_user_resolve(rootfd, "nobody", &u, why, sizeof(why)), -ENOENT);

    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(sup_user_resolve(rootfd, "alice", &u, why, sizeof(why)), -ENOENT);
    ck_assert_int_eq(sup_user_resolve(rootfd, "7", &u, why, sizeof(why)), 0);

    ck_assert_int_eq(mkfifo(path, 0644), 0);
    ck_assert_int_lt(sup_user_resolve(rootfd, "alice", &u, why, sizeof(why)), 0);
    ck_assert_ptr_nonnull(strstr(why, "/etc/passwd"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("user");
    TCase *tc = tcase_create("user");
    SRunner *sr;
    int failed;

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_names_and_groups);
    tcase_add_test(tc, test_numbers_and_pairs);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_files_stay_in_the_root);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
