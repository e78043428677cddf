/*
 * mountns.c - the mount namespace bwrap starts in (local_internal.h, local_clean_ns_*).
 *
 * The mounts an image or snapshot sandbox needs on the host side (its root's tmpfs, the
 * idmapped image, the overlays: all under <sandboxes>/<id>/img, image.c) live in the daemon's
 * mount namespace. bwrap copies the namespace it starts in and reads /proc/self/mountinfo once
 * per bind it makes (some twenty for a root of the host's top-level entries), and the kernel
 * renders every mount of the copy each time: with N such sandboxes alive each create rendered
 * ~20 x 3N lines (a fork of 64 spent about a quarter of its CPU time in show_mountinfo).
 *
 * So bwrap starts in a copy of a clean namespace that holds only its own sandbox's mounts
 * (create.c moves a clone of its img tree in). The clean namespace is a copy of the daemon's,
 * a slave of it, without (detached in it, read from its own table) the mounts below
 * <sandboxes> and those below /tmp and /run (network namespaces, other services' and tests'
 * mounts come and go there; a sandbox gets private /tmp and /run and never sees them), unless
 * the state dir lives in one. bwrap's own process stays in its copy for the sandbox's life, so
 * what the copy holds stays referenced that long: the mounts under the host directories a
 * sandbox binds (which the sandbox's own namespace holds anyway), /dev's and /proc's.
 *
 * The host's mounts change: where they propagate (a shared /, or lendboxd under systemd's
 * PrivateMounts) they reach the clean namespace at once; where they do not (a private /, as in
 * many containers) each create first asks whether lendboxd's mount table changed outside what
 * the clean namespace leaves out (a poll on /proc/self/mountinfo, then a read of it) and makes
 * a new one if so, and a watcher thread drops it as soon as it changes, so that it holds no
 * copy of a mount the host unmounted while no create comes. Where the daemon's own mounts
 * propagate into it (a shared / without PrivateMounts) nothing is lost: bwrap sees them as it
 * did before, and their unmounts follow them.
 */
#include "provider/local/local_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util/buf.h"
#include "util/clock.h"
#include "util/log.h"

/* after each change seen: the watcher reads the table at most 4 times a second */
#define WATCH_PAUSE_MS 250
/* after a failure to make one: the next create tries again this much later */
#define RETRY_MS 10000

struct local_clean_ns {
    pthread_mutex_t lock;
    int fd;           /* the clean namespace; -1: none now (made at the next create) */
    int mountinfo;    /* our /proc/self/mountinfo, the watcher's */
    int check;        /* the same file again, the creates' (each open file polls apart) */
    uint64_t sig;     /* of our mount table but what the clean namespace leaves out */
    int64_t retry_ms; /* after a failure: no attempt before (monotonic) */
    bool warned;      /* a failure was logged */
    int quit[2];      /* a pipe: its write end closed ends the watcher */
    pthread_t watcher;
    bool watching;
};

/* What a table read needs: what to leave out, and where to put it. */
struct table_job {
    const char *sandboxes_dir, *state_dir;
    char **detach; /* out (may stay NULL): the mount points left out, unescaped */
    size_t n;
    uint64_t sig; /* out */
};

/* Copy mountinfo's escaped field (\ooo) at s, up to a space, into out. */
static void unescape_field(const char *s, char *out, size_t size)
{
    size_t o = 0;

    while (*s && *s != ' ' && o + 1 < size) {
        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
            s[3] >= '0' && s[3] <= '7') {
            out[o++] = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
            s += 4;
        } else {
            out[o++] = *s++;
        }
    }
    out[o] = '\0';
}

/* Is path strictly below dir? */
static bool below(const char *path, const char *dir)
{
    size_t n = strlen(dir);

    return strncmp(path, dir, n) == 0 && path[n] == '/';
}

/* Does the clean namespace leave the mount at point out? */
static bool left_out(const struct table_job *t, const char *point)
{
    if (below(point, t->sandboxes_dir))
        return true;
    if (!below(point, "/tmp") && !below(point, "/run"))
        return false;
    /* not one the state dir lives in (the img mount points must be reachable) */
    return !(strcmp(t->state_dir, point) == 0 || below(t->state_dir, point));
}

/* Read the mount table open at fd: into t its signature but for what the clean namespace
 * leaves out and, when want_detach, the mount points left out. 0 or a negative errno. */
static int table_read(int fd, struct table_job *t, bool want_detach)
{
    struct lb_buf b = {.max = 64 << 20};
    char chunk[8192], point[4352];
    uint64_t h = 1469598103934665603ULL;
    size_t cap = 0;
    ssize_t k;
    int r = 0;

    t->detach = NULL;
    t->n = 0;
    if (lseek(fd, 0, SEEK_SET) < 0)
        return -errno;
    while ((k = read(fd, chunk, sizeof(chunk))) > 0)
        if (lb_buf_append_capped(&b, chunk, (size_t)k) < 0) {
            r = -ENOMEM;
            goto out;
        }
    if (k < 0 || !b.data || lb_buf_append_capped(&b, "", 1) < 0) {
        r = k < 0 ? -errno : -EIO;
        goto out;
    }
    for (char *line = b.data, *next; line && *line; line = next) {
        const char *f = line;

        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        for (int i = 0; i < 4 && f; i++) { /* the mount point is the fifth field */
            f = strchr(f, ' ');
            if (f)
                f++;
        }
        if (!f)
            continue;
        unescape_field(f, point, sizeof(point));
        if (left_out(t, point)) {
            if (!want_detach)
                continue;
            if (t->n == cap) {
                char **grown = realloc(t->detach, (cap ? cap * 2 : 16) * sizeof(char *));

                if (!grown) {
                    r = -ENOMEM;
                    goto out;
                }
                t->detach = grown;
                cap = cap ? cap * 2 : 16;
            }
            if (!(t->detach[t->n] = strdup(point))) {
                r = -ENOMEM;
                goto out;
            }
            t->n++;
            continue;
        }
        for (const char *c = line; *c; c++) /* FNV-1a */
            h = (h ^ (unsigned char)*c) * 1099511628211ULL;
        h = (h ^ '\n') * 1099511628211ULL;
    }
    t->sig = h;
out:
    if (r < 0) {
        for (size_t i = 0; i < t->n; i++)
            free(t->detach[i]);
        free(t->detach);
        t->detach = NULL;
        t->n = 0;
    }
    lb_buf_release(&b);
    return r;
}

struct build_job {
    struct table_job t;
    int fd; /* out */
    int err;
    const char *step;
};

/* A thread of its own: unsharing the mount namespace (and the fs attributes with it) is
 * allowed to one thread of a process and changes nothing for the others. It reads the new
 * namespace's own table (a sandbox's mounts made meanwhile are in it too) and detaches what
 * is left out. The thread ends here; the namespace lives on through the fd. */
static void *build_main(void *arg)
{
    struct build_job *j = arg;
    int own;

    j->fd = -1;
    if (unshare(CLONE_NEWNS | CLONE_FS) < 0) {
        j->step = "unshare";
        goto fail;
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0) {
        j->step = "make / a slave";
        goto fail;
    }
    own = open("/proc/thread-self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (own < 0 || (errno = -table_read(own, &j->t, true)) != 0) {
        if (own >= 0)
            close(own);
        j->step = "read the new namespace's mount table";
        goto fail;
    }
    close(own);
    /* deepest last in the table: detach from the end (a parent takes its children along).
     * Each reached without following a symlink (a host user may swap a directory of /tmp
     * for one to / between the read and the detach), then detached through its fd. */
    for (size_t i = j->t.n; i > 0; i--) {
        struct open_how how = {.flags = O_PATH | O_CLOEXEC, .resolve = RESOLVE_NO_SYMLINKS};
        int fd = (int)syscall(SYS_openat2, AT_FDCWD, j->t.detach[i - 1], &how, sizeof(how));
        char via[64];

        if (fd < 0)
            continue; /* gone with its parent already, or a symlink on its way: not ours */
        snprintf(via, sizeof(via), "/proc/thread-self/fd/%d", fd);
        (void)umount2(via, MNT_DETACH); /* EINVAL: not a mount's root (any more) */
        close(fd);
    }
    j->fd = open("/proc/thread-self/ns/mnt", O_RDONLY | O_CLOEXEC);
    if (j->fd < 0) {
        j->step = "open /proc/thread-self/ns/mnt";
        goto fail;
    }
    return NULL;
fail:
    j->err = errno;
    return NULL;
}

/* Make a new clean namespace into c->fd (the old one closed); c->lock held. */
static int clean_ns_build(const struct local_provider *lp, struct local_clean_ns *c)
{
    struct build_job j = {{lp->sandboxes_dir, lp->state_dir, NULL, 0, 0}, -1, 0, NULL};
    struct table_job ours = {lp->sandboxes_dir, lp->state_dir, NULL, 0, 0};
    pthread_t t;
    int r;

    local_close_fd(&c->fd);
    /* the signature is of our own table (a copy's mounts have other ids), read before the copy
     * is made: a change in between shows at the next look as one more change */
    r = table_read(c->check, &ours, false);
    if (r < 0) {
        j.err = -r;
        j.step = "read /proc/self/mountinfo";
    } else if ((r = pthread_create(&t, NULL, build_main, &j)) != 0) {
        j.err = r;
        j.step = "pthread_create";
    } else {
        pthread_join(t, NULL);
    }
    for (size_t i = 0; i < j.t.n; i++)
        free(j.t.detach[i]);
    free(j.t.detach);
    if (j.fd < 0) {
        if (!c->warned)
            log_warn("cannot make the mount namespace bwrap starts in (%s: %s): sandboxes start "
                     "in the daemon's until it can (tried again every %d s)",
                     j.step ? j.step : "?", strerror(j.err), RETRY_MS / 1000);
        c->warned = true;
        c->retry_ms = clock_mono_ms() + RETRY_MS;
        return -(j.err ? j.err : EIO);
    }
    c->fd = j.fd;
    c->sig = ours.sig;
    return 0;
}

/* Has our mount table changed, outside what the clean namespace leaves out, since it was
 * made? fd: a mountinfo fd whose poll state is the caller's; c->lock held. A table that
 * cannot be read counts as changed. */
static bool table_changed(const struct local_provider *lp, struct local_clean_ns *c, int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLPRI};
    struct table_job t = {lp->sandboxes_dir, lp->state_dir, NULL, 0, 0};

    /* POLLPRI: the table changed since this fd's last poll (the poll resets it) */
    if (poll(&p, 1, 0) <= 0 || !(p.revents & (POLLPRI | POLLERR)))
        return false;
    return table_read(fd, &t, false) < 0 || t.sig != c->sig;
}

/* The watcher: drops the clean namespace as soon as the host's mounts change (so that it
 * holds no copy of one the host unmounted), whether or not a create comes. */
static void *watch_main(void *arg)
{
    struct local_provider *lp = arg;
    struct local_clean_ns *c = lp->clean_ns;

    for (;;) {
        struct pollfd p[2] = {{.fd = c->mountinfo, .events = POLLPRI},
                              {.fd = c->quit[0], .events = POLLIN}};

        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents)
            break;
        if (!(p[0].revents & (POLLPRI | POLLERR)))
            continue;
        pthread_mutex_lock(&c->lock);
        if (c->fd >= 0) {
            struct table_job t = {lp->sandboxes_dir, lp->state_dir, NULL, 0, 0};

            if (table_read(c->mountinfo, &t, false) < 0 || t.sig != c->sig) {
                local_close_fd(&c->fd);
                log_info("the host's mounts changed: new sandboxes start from them as they are "
                         "now");
            }
        }
        pthread_mutex_unlock(&c->lock);
        clock_sleep_ms(WATCH_PAUSE_MS);
    }
    return NULL;
}

int local_clean_ns_open(struct local_provider *lp)
{
    struct local_clean_ns *c = calloc(1, sizeof(*c));
    int r;

    if (!c)
        return -ENOMEM;
    pthread_mutex_init(&c->lock, NULL);
    c->fd = -1;
    c->quit[0] = c->quit[1] = -1;
    c->mountinfo = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    c->check = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (c->mountinfo < 0 || c->check < 0 || pipe2(c->quit, O_CLOEXEC) < 0) {
        r = -errno;
        goto fail;
    }
    lp->clean_ns = c;
    r = -pthread_create(&c->watcher, NULL, watch_main, lp);
    if (r < 0) { /* unwatched, it could hold what the host unmounts: none */
        lp->clean_ns = NULL;
        goto fail;
    }
    c->watching = true;
    pthread_mutex_lock(&c->lock);
    r = clean_ns_build(lp, c);
    pthread_mutex_unlock(&c->lock);
    return r;
fail:
    log_warn("cannot watch the host's mounts (%s): sandboxes start in the daemon's mount "
             "namespace",
             strerror(-r));
    local_close_fd(&c->mountinfo);
    local_close_fd(&c->check);
    local_close_fd(&c->quit[0]);
    local_close_fd(&c->quit[1]);
    pthread_mutex_destroy(&c->lock);
    free(c);
    return r;
}

int local_clean_ns_get(struct local_provider *lp)
{
    struct local_clean_ns *c = lp->clean_ns;
    int fd = -1;

    if (!c)
        return -1;
    pthread_mutex_lock(&c->lock);
    /* a host mount made a moment ago must be there: a change since the last create's look
     * (the watcher may be pausing) makes it again */
    if (c->fd >= 0 && table_changed(lp, c, c->check))
        local_close_fd(&c->fd);
    if (c->fd < 0 && clock_mono_ms() >= c->retry_ms)
        (void)clean_ns_build(lp, c);
    if (c->fd >= 0)
        fd = fcntl(c->fd, F_DUPFD_CLOEXEC, 0);
    pthread_mutex_unlock(&c->lock);
    return fd;
}

void local_clean_ns_close(struct local_provider *lp)
{
    struct local_clean_ns *c = lp->clean_ns;

    if (!c)
        return;
    local_close_fd(&c->quit[1]);
    if (c->watching)
        pthread_join(c->watcher, NULL);
    local_close_fd(&c->quit[0]);
    local_close_fd(&c->fd);
    local_close_fd(&c->mountinfo);
    local_close_fd(&c->check);
    pthread_mutex_destroy(&c->lock);
    free(c);
    lp->clean_ns = NULL;
}
