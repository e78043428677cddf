/*
 * launch.c - how lendbox-supervise starts what it runs: the forked child's last steps before
 * its exec (every signal to its default, the --user switch or no capability, HOME), shared by
 * command, harness and PTY modes. A base over user.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "supervisor/supervise_internal.h"

/* --untrusted-dir (an exclusive exec's workdir, which the agent wrote): a HOME there would
 * put the agent's files where programs look for their own (~/.local, dotfiles) */
static const char *untrusted_dir;

/* Every signal back to its default action and unblocked (for what we exec). */
void launch_reset_signals(void)
{
    struct sigaction sa;
    sigset_t none;
    int s;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_DFL;
    for (s = 1; s < NSIG; s++) {
        if (s != SIGKILL && s != SIGSTOP)
            (void)sigaction(s, &sa, NULL); /* glibc-internal signals fail; fine */
    }
    sigemptyset(&none);
    (void)sigprocmask(SIG_SETMASK, &none, NULL);
}

int launch_user_prepare(const char *spec, struct sup_user *u, bool *have, char *why, size_t why_len)
{
    int rootfd, r;

    *have = false;
    if (!spec)
        return 0;
    rootfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0) {
        snprintf(why, why_len, "cannot open /: %s", strerror(errno));
        return -errno;
    }
    r = sup_user_resolve(rootfd, spec, u, why, why_len);
    close(rootfd);
    *have = r == 0;
    return r;
}

void launch_set_untrusted_dir(const char *dir)
{
    untrusted_dir = dir;
}

static bool path_is_at_or_below(const char *path, const char *dir)
{
    size_t n = strlen(dir);

    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

/* In the forked child, right before the exec of every launch path (command, harness, PTY):
 * become the user (have) or stay who we are, in both cases without a capability, bounding set
 * included (the exec helper leaves the supervisor CAP_SETUID, CAP_SETGID and CAP_SETPCAP in the
 * sandbox's user namespace, for this switch alone); HOME from passwd when the environment has
 * none. 0 or -errno. */
int launch_user_become(const struct sup_user *u, bool have)
{
    struct sup_user self;
    char num[16];
    int r;

    if (have) {
        r = sup_user_switch(u);
        if (r < 0)
            return r;
    } else {
        (void)sup_user_drop_caps();
    }
    if (!getenv("HOME")) {
        int rootfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        const char *home = NULL;

        snprintf(num, sizeof(num), "%u", (unsigned)getuid());
        if (have)
            home = u->home;
        else if (rootfd >= 0 && sup_user_resolve(rootfd, num, &self, NULL, 0) == 0)
            home = self.home;
        if (home && untrusted_dir && path_is_at_or_below(home, untrusted_dir))
            home = "/tmp";
        if (home)
            (void)setenv("HOME", home, 1);
        if (rootfd >= 0)
            close(rootfd);
    }
    return 0;
}
