/*
 * mode_init.c - lendbox-supervise as a sandbox's pid 1 (--init --ready-fd N for bwrap, or no
 * argument at all as an engine container's /sbin/init): the ready byte, stdio on /dev/null,
 * and reaping whatever is reparented to it until the sandbox is stopped from outside (SIGPWR
 * for an engine's clean stop). The protocol: supervise.c's head comment.
 */
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "supervisor/supervise_internal.h"

int mode_init_run(int ready_fd)
{
    static const int ignored[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE};
    struct sigaction sa;
    sigset_t chld;
    size_t i;
    int fd;

    if (ready_fd < 0) {
        (void)close_range(3, ~0U, 0);
    } else {
        if (ready_fd > 3)
            (void)close_range(3, (unsigned)ready_fd - 1, 0);
        (void)close_range((unsigned)ready_fd + 1, ~0U, 0);
        if (write(ready_fd, "R", 1) != 1)
            return 1;
        (void)close(ready_fd);
    }
    fd = open("/dev/null", O_RDWR);
    if (fd >= 0) {
        for (i = 0; i < 3; i++) {
            if (fd != (int)i)
                (void)dup2(fd, (int)i);
        }
        if (fd > 2)
            (void)close(fd);
    }
    if (chdir("/") < 0) {
        /* nothing to do about it; keep running */
    }

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_IGN;
    for (i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++)
        (void)sigaction(ignored[i], &sa, NULL);
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (ready_fd < 0)
        sigaddset(&chld, SIGPWR); /* an engine's clean stop (LXD) */
    (void)sigprocmask(SIG_BLOCK, &chld, NULL);

    for (;;) {
        /* SIGCHLD stays pending while blocked, so no exit is missed between the two. */
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        if (sigwaitinfo(&chld, NULL) == SIGPWR)
            return 0;
    }
}
