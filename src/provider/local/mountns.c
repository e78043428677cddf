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
 * where they do not (a private /, as in many containers) a create that finds the daemon's
 * mount table changed outside <sandboxes> since the clean namespace was made (polled, at
 * most once a second) makes a new one first. Where the daemon's own mounts propagate into
 * the clean namespace (a shared / without PrivateMounts) nothing is lost: bwrap sees them as
 * it did before, and their unmounts follow them.
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

#define CHECK_EVERY_MS 1000

struct local_clean_ns {
    pthread_mutex_t lock;
    int fd;           /* the clean namespace; -1: none (bwrap starts in ours) */
    int mountinfo;    /* our /proc/self/mountinfo, polled for changes */
    uint64_t sig;     /* of our mount table outside the state dir when fd was made */
    int64_t check_ms; /* the next poll, not before (monotonic) */
    bool failed;      /* making one failed: no more attempts (logged once) */
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

int local_clean_ns_open(struct local_provider *lp)
{
    struct local_clean_ns *c = calloc(1, sizeof(*c));
    int r;

    if (!c)
        return -ENOMEM;
    pthread_mutex_init(&c->lock, NULL);
    c->fd = -1;
    c->mountinfo = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
    if (c->mountinfo < 0) {
        r = -errno;
        log_warn("cannot read /proc/self/mountinfo (%s): sandboxes start in the daemon's mount "
                 "namespace",
                 strerror(-r));
        pthread_mutex_destroy(&c->lock);
        free(c);
        return r;
    }
    lp->clean_ns = c;
    r = clean_ns_build(lp, c);
    c->check_ms = clock_mono_ms() + CHECK_EVERY_MS;
    return r;
}

int local_clean_ns_get(struct local_provider *lp)
{
    struct local_clean_ns *c = lp->clean_ns;
    int fd = -1;

    if (!c)
        return -1;
    pthread_mutex_lock(&c->lock);
    if (c->fd >= 0 && clock_mono_ms() >= c->check_ms) {
        struct pollfd p = {.fd = c->mountinfo, .events = POLLPRI};
        uint64_t sig;

        c->check_ms = clock_mono_ms() + CHECK_EVERY_MS;
        /* POLLPRI: our mount table changed since the last poll (the poll resets it) */
        if (poll(&p, 1, 0) > 0 && (p.revents & (POLLPRI | POLLERR)) &&
            table_read(c->mountinfo, lp->sandboxes_dir, &sig, NULL, NULL) == 0 && sig != c->sig &&
            clean_ns_build(lp, c) == 0)
            log_info("the host's mounts changed: new sandboxes start from them as they are now");
    }
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
    local_close_fd(&c->fd);
    local_close_fd(&c->mountinfo);
    pthread_mutex_destroy(&c->lock);
    free(c);
    lp->clean_ns = NULL;
}
