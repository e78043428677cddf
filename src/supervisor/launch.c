/*
 * launch.c - how lendbox-supervise starts what it runs: the forked child's last steps before
 * its exec (every signal to its default, the --user switch or no capability, HOME, the exec
 * itself with the shell's 126/127), shared by command, harness and PTY modes, and the detached
 * holder (fork, one ready byte, "launched PID") shared by the harness and PTY launchers.
 * A base over user.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "supervisor/signals.h"
#include "supervisor/supervise_internal.h"

/* --untrusted-dir (an exclusive exec's workdir, which the agent wrote): a HOME there would
 * put the agent's files where programs look for their own (~/.local, dotfiles) */
static const char *untrusted_dir;

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
static int user_become(const struct sup_user *u, bool have)
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

/* Tell err_fd (when there is one) why the exec did not happen: the errno, as an int. */
static void report_errno(int err_fd, int e)
{
    if (err_fd >= 0 && write(err_fd, &e, sizeof(e)) != (ssize_t)sizeof(e)) {
        /* the supervisor then reports the exit status alone */
    }
}

void launch_exec(char **argv, bool own, const struct sup_user *u, bool have_user, int err_fd)
{
    int e;

    sup_signals_reset();
    e = own ? 0 : user_become(u, have_user);
    if (e < 0) {
        e = -e;
        report_errno(err_fd, e);
        dprintf(2, "lendbox-supervise: cannot become the user: %s\n", strerror(e));
        _exit(126);
    }
    if (own)
        execv("/proc/self/exe", argv);
    else
        execvp(argv[0], argv);
    e = errno;
    report_errno(err_fd, e);
    dprintf(2, "lendbox-supervise: cannot run '%s': %s\n", argv[0], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
}

int launch_holder(launch_holder_fn fn, const struct sup_options *o, const struct sup_user *user,
                  bool have_user)
{
    int ready[2];
    ssize_t n;
    pid_t pid;
    char b;

    if (pipe2(ready, O_CLOEXEC) < 0)
        return -errno;
    pid = fork();
    if (pid < 0) {
        int e = errno;

        (void)close(ready[0]);
        (void)close(ready[1]);
        return -e;
    }
    if (pid == 0) {
        (void)close(ready[0]);
        _exit(fn(o, ready[1], user, have_user));
    }
    (void)close(ready[1]);
    do
        n = read(ready[0], &b, 1);
    while (n < 0 && errno == EINTR);
    (void)close(ready[0]);
    if (n != 1)
        return -ECHILD;
    printf("launched %d\n", (int)pid);
    return 0;
}
