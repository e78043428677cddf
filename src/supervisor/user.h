/*
 * user.h - who a sandbox command runs as: a user of the sandbox's own /etc/passwd and
 * /etc/group (never the host's), looked up without NSS. Compiled into the static
 * lendbox-supervise (which switches to the user in every launch path) and into the daemon
 * (which checks the user before it starts an exec, so an unknown one is a 400).
 *
 * NeMo Gym mirrored: exec's `user` (SandboxProvider.exec(..., user)) is "a name or a number",
 * as docker exec's --user: NAME, UID, NAME:GROUP or UID:GID.
 */
#ifndef LB_SUPERVISOR_USER_H
#define LB_SUPERVISOR_USER_H

#include <stddef.h>
#include <stdint.h>

/* Ids a sandbox maps: 0 .. SUP_USER_ID_MAX. */
#define SUP_USER_ID_MAX 65535u
#define SUP_USER_GROUPS_MAX 64

struct sup_user {
    uint32_t uid, gid;                    /* in the sandbox's user namespace */
    uint32_t groups[SUP_USER_GROUPS_MAX]; /* supplementary: gid, then /etc/group's */
    size_t ngroups;
    char home[512]; /* passwd's home; "/root" for uid 0 without an entry, else "/" */
};

/* Resolve spec ("NAME", "UID", "NAME:GROUP", "UID:GID"; NULL or "" = root) against
 * etc/passwd and etc/group under rootfd (a directory fd of the sandbox's root; paths are
 * resolved with openat2 RESOLVE_IN_ROOT, so symlinks stay inside it; only regular files are
 * read, at most 4 MiB each). A number absent from passwd is that uid with gid = uid and home
 * "/". Supplementary groups: the primary gid plus every /etc/group entry whose member list
 * names the user; nothing else (never the caller's groups). Fills *u. Returns 0; -ENOENT
 * unknown user or group (why says which, e.g. `unknown user "bob"`), -ERANGE an id outside
 * 0..65535, -EINVAL a malformed spec, other negative errno when a file cannot be read (a
 * missing file counts as empty). why (may be NULL) gets a one-line reason. Thread-safe. */
int sup_user_resolve(int rootfd, const char *spec, struct sup_user *u, char *why, size_t why_len);

/* Become u for good: an empty bounding set, setgroups(exactly u->groups), setresgid,
 * setresuid, then an empty capability set (a command never keeps the capabilities its launcher
 * had). For a single-threaded process (a forked child). 0 or -errno. */
int sup_user_switch(const struct sup_user *u);

/* Empty bounding (when CAP_SETPCAP allows), effective, permitted and inheritable capability
 * sets. 0 or -errno. */
int sup_user_drop_caps(void);

#endif
