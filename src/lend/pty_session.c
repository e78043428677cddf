/*
 * pty_session.c - a PTY session as the other files of the service reach it: the one way the
 * daemon reaches a session directory the sandbox writes (below), the probe that tells whether
 * a session's holder still runs, and the registry lookups (pty_sandbox_of, pty_session_lock).
 * The base of pty.c, pty_watch.c and pty_io.c: it calls none of them. Shares pty_internal.h.
 */
#include "lend/pty_internal.h"
#include "util/fd.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------- the session directory: reached only through these ---------- */

bool pty_sid_is_valid(const char *sid)
{
    size_t n = sid ? strlen(sid) : 0;

    if (n < 8 || n >= LB_PTY_SID_MAX ||
        (strncmp(sid, "pty-", 4) != 0 && strncmp(sid, LB_CONTEXT_PREFIX, 4) != 0))
        return false;
    for (size_t i = 4; i < n; i++)
        if (!((sid[i] >= '0' && sid[i] <= '9') || (sid[i] >= 'a' && sid[i] <= 'f')))
            return false;
    return true;
}

/* The session directory is written by the sandbox (its holder runs as the sandbox's uid and
 * reaches it through the fd it was passed): nothing in it is trusted. Every access goes
 * through a descriptor of the directory (opened O_NOFOLLOW from pty/, which only the daemon
 * reaches), never follows a symlink (O_NOFOLLOW), never blocks on a FIFO (O_NONBLOCK), checks
 * the type (and, for what is served, one link only: no hard link to a host file) with fstat
 * after the open, and reads within bounds. The daemon's own files (meta, holder) are not in
 * it: they are siblings <sid>.meta and <sid>.holder in pty/, 0600. */

/* The session's directory as an fd, or -errno. */
int pty_session_dir_open(const struct lb_ptys *p, const char *sid)
{
    int fd = openat(p->dir_fd, sid, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

    return fd < 0 ? -errno : fd;
}

/* Open a file the holder wrote (a segment or exit) for reading: a regular file with one link,
 * never a symlink or a FIFO. -errno (-EPERM: something else is there). */
int pty_session_open_file(int sdir, const char *name, struct stat *st)
{
    int fd = openat(sdir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);

    if (fd < 0)
        return errno == ELOOP ? -EPERM : -errno;
    if (fstat(fd, st) < 0 || !S_ISREG(st->st_mode) || st->st_nlink != 1) {
        close(fd);
        return -EPERM;
    }
    return fd;
}

int pty_read_text(int fd, char *buf, size_t len)
{
    ssize_t n = read(fd, buf, len - 1);
    int e = errno;

    close(fd);
    if (n < 0)
        return -e;
    buf[n] = '\0';
    return 0;
}

/* Is name a regular file of the holder's (lstat; one link)? Its size in *size. */
bool pty_session_file_ok(int sdir, const char *name, uint64_t *size)
{
    struct stat st;

    if (fstatat(sdir, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) ||
        st.st_nlink != 1)
        return false;
    if (size)
        *size = (uint64_t)st.st_size;
    return true;
}

/* Open a FIFO of the session (in, ctl) for writing without blocking; anything but a FIFO is
 * refused (-EPERM) and never written. -ENXIO: no reader (the holder is gone). */
int pty_session_open_fifo(int sdir, const char *name)
{
    struct stat st;
    int fd = openat(sdir, name, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);

    if (fd < 0)
        return errno == ELOOP || errno == EISDIR ? -EPERM : -errno;
    if (fstat(fd, &st) < 0 || !S_ISFIFO(st.st_mode)) {
        close(fd);
        return -EPERM;
    }
    return fd;
}

#define REMOVE_DEPTH_MAX 8 /* the holder makes no subdirectory: a deeper tree is hostile */

/* Remove name in dir (a file, or a directory and what is in it), never following a symlink:
 * everything is unlinkat on a directory fd opened O_NOFOLLOW. Bounded depth. */
void pty_remove_entry_at(int dir, const char *name, int depth)
{
    DIR *d;
    struct dirent *e;

    if (unlinkat(dir, name, 0) == 0 || (errno != EISDIR && errno != EPERM))
        return;
    if (unlinkat(dir, name, AT_REMOVEDIR) == 0 || depth >= REMOVE_DEPTH_MAX)
        return;
    d = fd_open_dir(openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!d)
        return;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            pty_remove_entry_at(dirfd(d), e->d_name, depth + 1);
    }
    closedir(d);
    (void)unlinkat(dir, name, AT_REMOVEDIR);
}

/* Does the session's holder still run? It holds its FIFOs open for reading as long as it
 * runs: opening one for writing without blocking fails with ENXIO once it is gone. The probe
 * uses "in": the watcher wakes on the closes of "ctl" (the holder's end), and a probe must not
 * wake the very poll that made it. */
bool pty_holder_alive(const struct lb_ptys *p, const char *sid)
{
    int sdir = pty_session_dir_open(p, sid), fd;

    if (sdir < 0)
        return false;
    fd = pty_session_open_fifo(sdir, "in");
    close(sdir);
    if (fd >= 0) {
        close(fd);
        return true;
    }
    /* no reader, no FIFO, or something planted in its place: nobody to serve the session */
    return fd != -ENXIO && fd != -ENOENT && fd != -EPERM;
}

/* ---------- registry lookups ---------- */

int pty_sandbox_of(struct lb_ptys *p, const char *sid, char *sandbox_id, size_t len)
{
    struct session *s = NULL;

    if (!pty_sid_is_valid(sid))
        return -ENOENT;
    pthread_mutex_lock(&p->lock);
    HASH_FIND_STR(p->sessions, sid, s);
    if (s)
        snprintf(sandbox_id, len, "%s", s->sandbox_id);
    pthread_mutex_unlock(&p->lock);
    return s ? 0 : -ENOENT;
}

int pty_not_found(struct lb_error *err, const char *sid)
{
    if (sid && strncmp(sid, LB_CONTEXT_PREFIX, 4) == 0)
        return lb_error_set(err, -ENOENT, "no code context %s", sid);
    return lb_error_set(err, -ENOENT, "no PTY session %s", sid ? sid : "");
}

/* The session (lock held on success); -ENOENT otherwise (unlocked). */
int pty_session_lock(struct lb_ptys *p, const char *sid, struct session **out, struct lb_error *err)
{
    struct session *s = NULL;

    if (!pty_sid_is_valid(sid))
        return pty_not_found(err, sid);
    pthread_mutex_lock(&p->lock);
    HASH_FIND_STR(p->sessions, sid, s);
    if (!s || s->gone) {
        pthread_mutex_unlock(&p->lock);
        return pty_not_found(err, sid);
    }
    *out = s;
    return 0;
}
