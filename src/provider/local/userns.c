/*
 * userns.c - user namespaces the daemon makes itself (see local_internal.h): a
 * sandbox's, mapping its whole slot of ids (bwrap joins it with --userns), and an image
 * mount's (its idmap).
 *
 * The helper that holds a fresh user namespace while the daemon writes its maps is cloned
 * with CLONE_VM (no copy of the daemon's page tables: a fork of a large daemon costs tens of
 * ms) onto a small stack of its own. It shares the daemon's memory, so it touches nothing of
 * it (bare syscalls only; a failure only ends it): it asks for SIGKILL when the thread that
 * made it dies (PR_SET_PDEATHSIG), becomes the namespace's owner (a sandbox's: the slot's
 * first id, so bwrap, running as that id, may join it), unshares its user namespace, says so
 * with one byte on a pipe and waits for the SIGKILL that ends it. The daemon writes
 * uid_map/gid_map from outside (host root may map any range; setgroups stays allowed, so the
 * sandbox's supervisor can give a user its groups), opens /proc/<helper>/ns/user, and kills
 * and reaps the helper: the fd alone keeps the namespace alive, and nothing stays running.
 */
#include "provider/local/local_internal.h"
#include "provider/local/spawn.h"
#include "util/fault.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define HELPER_STACK (64 * 1024)
#define HELPER_WAIT_MS 10000

struct userns_helper {
    uid_t owner; /* 0: the clone itself made the namespace */
    int ready_w;
    pid_t parent; /* the daemon: the helper dies with it */
};

/* syscall() in the helper: 0 or -errno. A failing call writes errno, which (no CLONE_SETTLS) is
 * the creating thread's; that thread is blocked in poll meanwhile and ignores errno there. */
static long helper_call(long nr, long a, long b, long c)
{
    long r = syscall(nr, a, b, c);

    return r < 0 ? -(long)errno : r;
}

static int userns_child_main(void *arg)
{
    const struct userns_helper *h = arg;
    char c = 0; /* 0: done; else the errno of what failed */
    long r = 0;

    /* Our fd table is a copy of the daemon's (no CLONE_FILES): keep only the ready pipe, so a
     * helper outliving the daemon could never hold its lock, listening socket or clients. */
    if (h->ready_w > 0)
        (void)helper_call(SYS_close_range, 0, (long)h->ready_w - 1, 0);
    (void)helper_call(SYS_close_range, (long)h->ready_w + 1, ~0U, 0);
    if (h->owner != 0) {
        r = helper_call(SYS_setgroups, 0, 0, 0);
        if (r == 0)
            r = helper_call(SYS_setresgid, h->owner, h->owner, h->owner);
        if (r == 0)
            r = helper_call(SYS_setresuid, h->owner, h->owner, h->owner);
        if (r == 0)
            r = helper_call(SYS_unshare, CLONE_NEWUSER, 0, 0);
        c = (char)(r < 0 && -r < 127 ? -r : r < 0 ? EPERM : 0);
    }
    /* Die with the daemon. Set after the uid change, which clears it; then make sure the
     * daemon did not die before it was set (we would have been reparented already). */
    (void)helper_call(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0);
    if (helper_call(SYS_getppid, 0, 0, 0) != h->parent)
        helper_call(SYS_exit, 1, 0, 0);
    if (helper_call(SYS_write, h->ready_w, (long)&c, 1) != 1 || c != 0)
        helper_call(SYS_exit, 1, 0, 0);
    for (;;)
        (void)syscall(SYS_pause);
    return 0;
}

int local_userns_open(uid_t owner, uid_t first, uint32_t count, int *fd_out)
{
    static const char *const files[] = {"uid_map", "gid_map"};
    struct userns_helper h = {.owner = owner, .ready_w = -1, .parent = getpid()};
    char path[64], map[64], c;
    int r = 0, st, mfd, ready_r = -1, ready_w = -1;
    char *stack = NULL;
    pid_t pid = -1;

    *fd_out = -1;
    r = local_pipe(&ready_r, &ready_w);
    if (r < 0)
        return r;
    h.ready_w = ready_w; /* h is shared with the helper (CLONE_VM): never written after clone */
    stack = malloc(HELPER_STACK);
    if (!stack) {
        r = -ENOMEM;
        goto out;
    }
    /* The helper shares our memory: it must never run one of the daemon's signal handlers.
     * It starts with every signal blocked (and stays so: it is only ever SIGKILLed). */
    pid = spawn_clone_blocked(userns_child_main, stack + HELPER_STACK,
                              SPAWN_CLONE_VM | SIGCHLD | (owner == 0 ? CLONE_NEWUSER : 0), &h);
    if (pid < 0) {
        r = pid;
        pid = -1;
        goto out;
    }
    local_close_fd(&ready_w);
    {
        struct pollfd p = {.fd = ready_r, .events = POLLIN};
        int n;

        do
            n = poll(&p, 1, HELPER_WAIT_MS);
        while (n < 0 && errno == EINTR);
        if (n <= 0 || read(ready_r, &c, 1) != 1 || c != 0) {
            r = n == 0 ? -ETIMEDOUT : c > 0 ? -c : -EPERM; /* it could not make the namespace */
            goto out;
        }
    }
    /* named fault points: the helper is up and the maps not yet written. A sandbox's own
     * namespace (owner: its slot's first id) and the daemon-owned one an image's idmapped
     * mount uses are told apart, so a fault aimed at one never delays the other. */
    r = fault_hit(owner != 0 ? "userns.helper" : "userns.idmap_helper", 0, NULL);
    if (r < 0)
        goto out;
    snprintf(map, sizeof(map), "0 %u %u\n", (unsigned)first, (unsigned)count);
    for (int i = 0; i < 2 && r == 0; i++) {
        snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, files[i]);
        mfd = open(path, O_WRONLY | O_CLOEXEC);
        if (mfd < 0 || write(mfd, map, strlen(map)) != (ssize_t)strlen(map))
            r = -errno;
        if (mfd >= 0)
            close(mfd);
    }
    if (r == 0) {
        snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)pid);
        *fd_out = open(path, O_RDONLY | O_CLOEXEC);
        if (*fd_out < 0)
            r = -errno;
    }
out:
    if (pid > 0) {
        (void)kill(pid, SIGKILL);
        while (waitpid(pid, &st, __WALL) < 0 && errno == EINTR)
            ;
    }
    free(stack); /* the helper is gone: its stack is free */
    local_close_fd(&ready_w);
    local_close_fd(&ready_r);
    return r;
}
