/*
 * spawn.c - spawn_vfork: clone(CLONE_VM | CLONE_VFORK) with a stack of the call's own (see
 * spawn.h for the rules a child follows).
 */
#include "provider/local/spawn.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define SPAWN_STACK_BYTES (64 * 1024)

struct spawn_call {
    spawn_child_fn fn;
    void *arg;
    volatile int child_errno; /* set by the child when fn gave up; read after it released us */
};

static int spawn_trampoline(void *p)
{
    struct spawn_call *c = p;
    int e = c->fn(c->arg);

    c->child_errno = e > 0 ? e : EINVAL;
    _exit(127);
}

pid_t spawn_clone_blocked(int (*fn)(void *), void *stack_top, int flags, void *arg)
{
    sigset_t all, old;
    pid_t pid;
    int e;

    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid = clone(fn, stack_top, flags, arg);
    e = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return pid < 0 ? -e : pid;
}

int spawn_vfork(spawn_child_fn fn, void *arg, pid_t *pid_out)
{
    struct spawn_call on_stack = {fn, arg, 0}, *callp = &on_stack;
    int dumpable = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0), r = 0;
    char *stack;
    pid_t pid;

    *pid_out = 0;
    if (SPAWN_CLONE_VM == 0) {
        /* a child with a copy of our memory tells child_errno back through a shared page */
        callp =
            mmap(NULL, sizeof(*callp), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (callp == MAP_FAILED)
            return -errno;
        *callp = on_stack;
    }
    stack = malloc(SPAWN_STACK_BYTES);
    if (!stack) {
        r = -ENOMEM;
        goto out;
    }
    pid = spawn_clone_blocked(spawn_trampoline, stack + SPAWN_STACK_BYTES,
                              SPAWN_CLONE_VM | CLONE_VFORK | SIGCHLD, callp);
    /* a uid change in the child cleared the dumpable flag of the memory it shared with us */
    if (dumpable == 1 && prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 1)
        (void)prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    free(stack);
    if (pid < 0) {
        r = pid;
        goto out;
    }
    if (callp->child_errno) {
        r = -callp->child_errno;
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        goto out;
    }
    *pid_out = pid;
out:
    if (callp != &on_stack)
        munmap(callp, sizeof(*callp));
    return r;
}
