/*
 * mountns.c - the mount namespace bwrap starts in (local_internal.h, local_clean_ns_open).
 *
 * The mounts an image or snapshot sandbox needs on the host side (its root's tmpfs, the
 * idmapped image, the overlays: all under <sandboxes>/<id>/img, image.c) live in the daemon's
 * mount namespace. bwrap copies the namespace it starts in and reads /proc/self/mountinfo once
 * per bind it makes (some twenty for a root of the host's top-level entries), and the kernel
 * renders every mount of the copy each time: with N such sandboxes alive each create renders
 * ~20 x 3N lines (a fork of 64 spent a quarter of its CPU time in show_mountinfo).
 *
 * So bwrap starts in a namespace of its own that holds only its sandbox's mounts: a copy of a
 * clean namespace (made here at the provider's start: a copy of the daemon's, a slave of it so
 * that the host's later mounts and unmounts reach it, with the sandboxes of an earlier run
 * detached), into which the spawned child moves a clone of its own sandbox's img tree
 * (create.c). The daemon's own mounts are unchanged. Where the daemon's mounts are shared
 * (a host whose / is a shared mount and no PrivateMounts), its sandboxes' mounts propagate into
 * the clean namespace as before: the same as without it, only not faster.
 */
#include "provider/local/local_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/log.h"

struct clean_ns_job {
    const char *sandboxes_dir;
    int fd;  /* out: the namespace, or -1 */
    int err; /* out: errno of the step that failed */
    const char *step;
};

/* A thread of its own: unsharing the mount namespace (and the fs attributes with it) is
 * allowed to one thread of a process and changes nothing for the others. The thread ends
 * here; the namespace lives on through the fd. */
static void *clean_ns_main(void *arg)
{
    struct clean_ns_job *j = arg;
    DIR *d;
    struct dirent *e;

    j->fd = -1;
    if (unshare(CLONE_NEWNS | CLONE_FS) < 0) {
        j->step = "unshare";
        goto fail;
    }
    if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0) {
        j->step = "make / a slave";
        goto fail;
    }
    /* an earlier run's sandboxes (adopted): their mounts are not for the new ones */
    d = opendir(j->sandboxes_dir);
    while (d && (e = readdir(d))) {
        char img[4400];

        if (e->d_name[0] == '.')
            continue;
        snprintf(img, sizeof(img), "%s/%s/img", j->sandboxes_dir, e->d_name);
        (void)umount2(img, MNT_DETACH); /* EINVAL: not a mount point, nothing to do */
    }
    if (d)
        closedir(d);
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

int local_clean_ns_open(struct local_provider *lp)
{
    struct clean_ns_job j = {lp->sandboxes_dir, -1, 0, NULL};
    pthread_t t;
    int r;

    lp->clean_ns = -1;
    r = pthread_create(&t, NULL, clean_ns_main, &j);
    if (r != 0)
        return -r;
    pthread_join(t, NULL);
    if (j.fd < 0) {
        log_warn("cannot make the mount namespace bwrap starts in (%s: %s): sandboxes start in "
                 "the daemon's",
                 j.step ? j.step : "?", strerror(j.err));
        return -j.err;
    }
    lp->clean_ns = j.fd;
    return 0;
}

void local_clean_ns_close(struct local_provider *lp)
{
    local_close_fd(&lp->clean_ns);
}
