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
 * a slave of it, with every mount below <sandboxes> detached (the sandboxes' img trees: the
 * only mounts the daemon makes). The host's mounts change under it: where they
 * propagate (a shared /, or lendboxd under systemd's PrivateMounts) they reach it at once;
 * where they do not (a private /, as in many containers) a thread watching the daemon's
 * mount table (poll on /proc/self/mountinfo) drops the clean namespace when the table changed
 * outside <sandboxes>, and the next create makes a new one: new sandboxes see the host's
 * mounts as they are, and no copy of one the host unmounted is kept. Where the daemon's own mounts
 * propagate into the clean namespace (a shared / without PrivateMounts) nothing is lost: bwrap sees
 * them as it did before, and their unmounts follow them.
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
#include <sys/mount.h>
#include <unistd.h>

#include "util/buf.h"
#include "util/clock.h"
#include "util/log.h"

/* after each change seen: the watcher reads the table at most 4 times a second */
#define WATCH_PAUSE_MS 250

struct local_clean_ns {
    pthread_mutex_t lock;
    int fd;        /* the clean namespace; -1: none yet (made at the next create) */
    int mountinfo; /* our /proc/self/mountinfo, watched for changes */
    uint64_t sig;  /* of our mount table outside <sandboxes> when fd was made */
    bool failed;   /* making one failed: no more attempts (logged once) */
    int quit[2];   /* a pipe: its write end closed ends the watcher */
    pthread_t watcher;
    bool watching;
};

struct build_job {
    char **detach; /* mount points to detach in the new namespace (unescaped) */
    size_t n;
    int fd; /* out */
    int err;
    const char *step;
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

/* Read our mount table: its signature but for the mounts below under (a directory, no
 * trailing slash) into *sig and, when detach is not NULL, the mount points below under
 * (malloc'd, *n of them).
 * 0 or a negative errno. */
static int table_read(int fd, const char *under, uint64_t *sig, char ***detach, size_t *n)
{
    struct lb_buf b = {.max = 64 << 20};
    char chunk[8192], point[4352];
    size_t ulen = strlen(under), cap = 0;
    uint64_t h = 1469598103934665603ULL;
    ssize_t k;
    int r = 0;

    if (detach) {
        *detach = NULL;
        *n = 0;
    }
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
        if (strncmp(point, under, ulen) == 0 && point[ulen] == '/') {
            if (detach) {
                if (*n == cap) {
                    char **grown = realloc(*detach, (cap ? cap * 2 : 16) * sizeof(char *));

                    if (!grown) {
                        r = -ENOMEM;
                        goto out;
                    }
                    *detach = grown;
                    cap = cap ? cap * 2 : 16;
                }
                if (!((*detach)[*n] = strdup(point))) {
                    r = -ENOMEM;
                    goto out;
                }
                (*n)++;
            }
            continue;
        }
        for (const char *c = line; *c; c++) /* FNV-1a */
            h = (h ^ (unsigned char)*c) * 1099511628211ULL;
        h = (h ^ '\n') * 1099511628211ULL;
    }
    *sig = h;
out:
    if (r < 0 && detach) {
        for (size_t i = 0; i < *n; i++)
            free((*detach)[i]);
        free(*detach);
        *detach = NULL;
        *n = 0;
    }
    lb_buf_release(&b);
    return r;
}

/* A thread of its own: unsharing the mount namespace (and the fs attributes with it) is
 * allowed to one thread of a process and changes nothing for the others. The thread ends
 * here; the namespace lives on through the fd. */
static void *build_main(void *arg)
{
    struct build_job *j = arg;

    j->fd = -1;
    if (unshare(CLONE_NEWNS | CLONE_FS) < 0) {
        j->step = "unshare";
        goto fail;
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0) {
        j->step = "make / a slave";
        goto fail;
    }
    /* deepest last in the table: detach from the end (a parent takes its children along) */
    for (size_t i = j->n; i > 0; i--)
        (void)umount2(j->detach[i - 1], MNT_DETACH); /* gone with its parent already: fine */
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
    struct build_job j = {NULL, 0, -1, 0, NULL};
    uint64_t sig = 0;
    pthread_t t;
    int r;

    r = table_read(c->mountinfo, lp->sandboxes_dir, &sig, &j.detach, &j.n);
    if (r < 0) {
        j.err = -r;
        j.step = "read /proc/self/mountinfo";
        goto out;
    }
    r = pthread_create(&t, NULL, build_main, &j);
    if (r != 0) {
        j.err = r;
        j.step = "pthread_create";
        goto out;
    }
    pthread_join(t, NULL);
out:
    for (size_t i = 0; i < j.n; i++)
        free(j.detach[i]);
    free(j.detach);
    if (j.fd < 0) {
        if (!c->failed)
            log_warn("cannot make the mount namespace bwrap starts in (%s: %s): sandboxes start "
                     "in the daemon's",
                     j.step ? j.step : "?", strerror(j.err));
        c->failed = true;
        local_close_fd(&c->fd);
        return -(j.err ? j.err : EIO);
    }
    local_close_fd(&c->fd);
    c->fd = j.fd;
    c->sig = sig;
    return 0;
}

/* The watcher: when our mount table changes outside <sandboxes> (the host's mounts), the
 * clean namespace is dropped at once (it would hold copies of what the host unmounted: a
 * loop device could not be detached) and the next create makes a new one. */
static void *watch_main(void *arg)
{
    struct local_provider *lp = arg;
    struct local_clean_ns *c = lp->clean_ns;

    for (;;) {
        struct pollfd p[2] = {{.fd = c->mountinfo, .events = POLLPRI},
                              {.fd = c->quit[0], .events = POLLIN}};
        uint64_t sig;

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
        if (c->fd >= 0 && table_read(c->mountinfo, lp->sandboxes_dir, &sig, NULL, NULL) == 0 &&
            sig != c->sig) {
            local_close_fd(&c->fd);
            log_info("the host's mounts changed: new sandboxes start from them as they are now");
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
    if (c->mountinfo < 0 || pipe2(c->quit, O_CLOEXEC) < 0) {
        r = -errno;
        log_warn("cannot watch /proc/self/mountinfo (%s): sandboxes start in the daemon's mount "
                 "namespace",
                 strerror(-r));
        local_close_fd(&c->mountinfo);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return r;
    }
    lp->clean_ns = c;
    pthread_mutex_lock(&c->lock);
    r = clean_ns_build(lp, c);
    pthread_mutex_unlock(&c->lock);
    if (r == 0) {
        r = -pthread_create(&c->watcher, NULL, watch_main, lp);
        c->watching = r == 0;
        if (r < 0) { /* unwatched, it could hold what the host unmounts: none */
            log_warn("cannot watch the host's mounts (%s): sandboxes start in the daemon's "
                     "mount namespace",
                     strerror(-r));
            local_close_fd(&c->fd);
            c->failed = true;
        }
    }
    return r;
}

int local_clean_ns_get(struct local_provider *lp)
{
    struct local_clean_ns *c = lp->clean_ns;
    int fd = -1;

    if (!c)
        return -1;
    pthread_mutex_lock(&c->lock);
    if (c->fd < 0 && !c->failed)
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
    pthread_mutex_destroy(&c->lock);
    free(c);
    lp->clean_ns = NULL;
}
