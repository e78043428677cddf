/*
 * signals.h - every signal back to its default action and unblocked, for a child about to
 * exec what a sandbox runs. Header only, so that the static lendbox-supervise and the daemon's
 * local provider (which forks its own helpers) share it without a library between them.
 */
#ifndef LB_SUPERVISOR_SIGNALS_H
#define LB_SUPERVISOR_SIGNALS_H

#include <signal.h>
#include <string.h>

/* Set every signal but SIGKILL and SIGSTOP to SIG_DFL (those glibc keeps for itself refuse;
 * that is fine) and clear the signal mask. Async-signal-safe: callable in a child after fork.
 * Changes the calling thread's mask and the process's dispositions. */
static inline void sup_signals_reset(void)
{
    struct sigaction sa;
    sigset_t none;
    int s;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_DFL;
    for (s = 1; s < NSIG; s++) {
        if (s != SIGKILL && s != SIGSTOP)
            (void)sigaction(s, &sa, NULL);
    }
    sigemptyset(&none);
    (void)sigprocmask(SIG_SETMASK, &none, NULL);
}

#endif
