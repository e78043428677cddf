/*
 * spawn.h - start a program from the multi-threaded daemon without copying it: the child
 * shares the daemon's memory (clone CLONE_VM | CLONE_VFORK, what posix_spawn does) and the
 * calling thread waits until the child has called execve (or given up). A fork copies the
 * daemon's page tables and makes every page it touches afterwards copy-on-write; measured in
 * docs/perf.md, that was the largest daemon-side cost of an episode.
 *
 * What a child may do before its execve (the rules of vfork):
 *   - only async-signal-safe calls and raw syscalls; no malloc, no locks, no stdio;
 *   - nothing that could block for long or be stopped from outside: the calling thread (a
 *     daemon worker) is suspended until the child execs. In particular a child must never
 *     enter a sandbox (its uid, user/pid namespace or cgroup) before execve, where a sandbox
 *     process could SIGSTOP or a pause could freeze it. The exec path therefore execs a
 *     separate helper (lendbox-supervise --enter) that enters the sandbox in its own memory;
 *     bwrap's child only takes the fresh sandbox's uid and cgroup, which no sandbox process
 *     can reach yet;
 *   - setresuid in the child also clears the dumpable flag of the shared memory (the kernel
 *     does it on every uid change): spawn_vfork restores it for the daemon afterwards.
 * All signals are blocked in the child until it unblocks them (sup_signals_reset), so
 * no daemon signal handler runs on the shared memory.
 */
#ifndef LB_SPAWN_H
#define LB_SPAWN_H

#include <sched.h>
#include <sys/types.h>

/* SPAWN_CLONE_VM: CLONE_VM, or 0 under ThreadSanitizer. Its clone interceptor runs fork
 * bookkeeping in every child, which in a child that shares our memory rewrites the runtime's
 * state of the whole daemon (a SIGSEGV in a child beside a running parent; lost
 * happens-before edges, so false race reports, after a vfork-style one). Under TSan the
 * children of spawn_vfork and of the user-namespace helper therefore get a copy of our memory;
 * they read their arguments and tell us back only through pipes or a shared page, so they
 * behave the same, only slower to start. */
#if defined(__SANITIZE_THREAD__)
#define SPAWN_CLONE_VM 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SPAWN_CLONE_VM 0
#endif
#endif
#ifndef SPAWN_CLONE_VM
#define SPAWN_CLONE_VM CLONE_VM
#endif

/* The child's work: runs in the child on a stack of its own; it ends in execve (never
 * returns) or returns an errno value (> 0) after reporting the failure itself, and the child
 * then exits with status 127. */
typedef int (*spawn_child_fn)(void *arg);

/* clone(2) of fn(arg) on the stack whose top is stack_top (the stack grows down on every
 * architecture lendbox runs on), with every signal blocked in the caller's thread across the
 * call, so that the child starts with them all blocked (a child sharing our memory must never
 * run one of the daemon's signal handlers). Returns the child's pid, or -errno. */
pid_t spawn_clone_blocked(int (*fn)(void *), void *stack_top, int flags, void *arg);

/* Start fn(arg) in a vfork-style child (SIGCHLD on exit, so the caller reaps it). Returns 0
 * with *pid_out once the child exec'd; -errno when clone failed, or the child's own errno
 * when fn gave up (the child is reaped then, *pid_out = 0). Thread-safe: each call has its
 * own stack; only the calling thread waits. */
int spawn_vfork(spawn_child_fn fn, void *arg, pid_t *pid_out);

#endif
