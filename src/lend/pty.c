/*
 * pty.c - see pty.h.
 */
#include "lend/pty.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uthash.h>

#include "util/clock.h"
#include "util/log.h"
#include "util/token.h"

#define SUPERVISE_PATH "/run/lendbox/supervise"
#define SEG_BYTES (256 * 1024) /* as lendbox-supervise's PTY_SEG_BYTES */
#define LAUNCH_TIMEOUT_MS 30000
#define INPUT_WAIT_MS 5000
#define META_MAX 4096
#define WATCH_MASK                                                                                 \
    (IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | IN_DELETE_SELF | IN_MOVE_SELF)
#define LOGIN_SHELL "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi"

struct waiter {
    struct lb_park *park;
    bool err_stream;
    bool exit_only; /* a wait: output does not wake it */
    struct waiter *next;
};

struct session {
    char sid[LB_PTY_SID_MAX];
    char sandbox_id[LB_ID_MAX];
    bool pty;
    bool gone;                      /* deleted: the directory is being removed */
    char holder[LB_SHA256_HEX + 1]; /* "" : not held */
    int wd;                         /* inotify watch, -1: none */
    struct waiter *waiters;
    UT_hash_handle hh;
};

struct lb_ptys {
    struct lb_pty_config cfg;
    char *dir;
    int dir_fd; /* <state_dir>/pty, root only: the daemon's own files and the session dirs */
    struct lb_lend *lend;
    struct lb_store *store;
    pthread_mutex_t lock; /* guards sessions and every session's fields */
    struct session *sessions;
    int ino;     /* inotify fd */
    int stop[2]; /* the watcher's stop pipe */
    pthread_t thread;
    bool thread_started;
};

/* ---------- helpers ---------- */

static bool sid_is_valid(const char *sid)
{
    size_t n = sid ? strlen(sid) : 0;

    if (n < 8 || n >= LB_PTY_SID_MAX || strncmp(sid, "pty-", 4) != 0)
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
static int session_dir_open(const struct lb_ptys *p, const char *sid)
{
    int fd = openat(p->dir_fd, sid, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

    return fd < 0 ? -errno : fd;
}

/* Open a file the holder wrote (a segment or exit) for reading: a regular file with one link,
 * never a symlink or a FIFO. -errno (-EPERM: something else is there). */
static int session_open_file(int sdir, const char *name, struct stat *st)
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

/* Is name a regular file of the holder's (lstat; one link)? Its size in *size. */
static bool session_file_ok(int sdir, const char *name, uint64_t *size)
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
static int session_open_fifo(int sdir, const char *name)
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
static void remove_entry_at(int dir, const char *name, int depth)
{
    DIR *d;
    struct dirent *e;
    int fd;

    if (unlinkat(dir, name, 0) == 0 || (errno != EISDIR && errno != EPERM))
        return;
    if (unlinkat(dir, name, AT_REMOVEDIR) == 0 || depth >= REMOVE_DEPTH_MAX)
        return;
    fd = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            remove_entry_at(dirfd(d), e->d_name, depth + 1);
    }
    closedir(d);
    (void)unlinkat(dir, name, AT_REMOVEDIR);
}

/* Write pty/<sid>.<name> (daemon-only, 0600) atomically: a fresh tmp file (O_EXCL, never a
 * symlink), then rename. */
static int write_file_atomic(const struct lb_ptys *p, const char *sid, const char *name,
                             const char *text)
{
    char path[LB_PTY_SID_MAX + 32], tmp[LB_PTY_SID_MAX + 48];
    size_t n = strlen(text);
    int fd, r = 0;

    snprintf(path, sizeof(path), "%s.%s", sid, name);
    snprintf(tmp, sizeof(tmp), "%s.%s.tmp", sid, name);
    (void)unlinkat(p->dir_fd, tmp, 0); /* left by a crash */
    fd = openat(p->dir_fd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    if (write(fd, text, n) != (ssize_t)n || fsync(fd) < 0)
        r = errno ? -errno : -EIO;
    close(fd);
    if (r == 0 && renameat(p->dir_fd, tmp, p->dir_fd, path) < 0)
        r = -errno;
    if (r < 0)
        (void)unlinkat(p->dir_fd, tmp, 0);
    return r;
}

/* Read up to len-1 bytes of pty/<sid>.<name> (the daemon's) into buf, NUL-terminated. */
static int read_own(const struct lb_ptys *p, const char *sid, const char *name, char *buf,
                    size_t len)
{
    char path[LB_PTY_SID_MAX + 32];
    struct stat st;
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "%s.%s", sid, name);
    fd = openat(p->dir_fd, path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -EPERM;
    }
    n = read(fd, buf, len - 1);
    close(fd);
    if (n < 0)
        return -errno;
    buf[n] = '\0';
    return 0;
}

/* Read up to len-1 bytes of the holder's file name (exit) into buf, NUL-terminated. */
static int read_small(const struct lb_ptys *p, const char *sid, const char *name, char *buf,
                      size_t len)
{
    struct stat st;
    ssize_t n;
    int sdir = session_dir_open(p, sid), fd;

    if (sdir < 0)
        return sdir;
    fd = session_open_file(sdir, name, &st);
    close(sdir);
    if (fd < 0)
        return fd;
    n = read(fd, buf, len - 1);
    close(fd);
    if (n < 0)
        return -errno;
    buf[n] = '\0';
    return 0;
}

/* Remove pty/<sid>/ and what is in it, and the daemon's pty/<sid>.meta and .holder. */
static void remove_session_dir(const struct lb_ptys *p, const char *sid)
{
    char own[LB_PTY_SID_MAX + 32];
    int tries = 0;

    /* a holder still ending (DELETE) may add its exit file meanwhile: a few passes */
    do
        remove_entry_at(p->dir_fd, sid, 0);
    while (faccessat(p->dir_fd, sid, F_OK, AT_SYMLINK_NOFOLLOW) == 0 && ++tries < 5);
    if (faccessat(p->dir_fd, sid, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
        log_warn("pty: cannot remove %s/%s", p->dir, sid);
    snprintf(own, sizeof(own), "%s.meta", sid);
    (void)unlinkat(p->dir_fd, own, 0);
    snprintf(own, sizeof(own), "%s.holder", sid);
    (void)unlinkat(p->dir_fd, own, 0);
}

static bool sandbox_is_running(struct lb_ptys *p, const char *sandbox_id)
{
    struct lb_record rec = {0};
    bool ok =
        store_get_sandbox(p->store, sandbox_id, &rec, NULL) == 0 && rec.state == LB_STATE_LENT;

    store_record_release(&rec);
    return ok;
}

static void wake_all_locked(struct session *s)
{
    for (struct waiter *w = s->waiters, *next; w; w = next) {
        next = w->next;
        http_wake(w->park);
        http_park_release(w->park);
        free(w);
    }
    s->waiters = NULL;
}

/* Drop a session from memory (lock held): wake its waiters, stop watching it. */
static void session_forget_locked(struct lb_ptys *p, struct session *s)
{
    HASH_DEL(p->sessions, s);
    wake_all_locked(s);
    if (s->wd >= 0)
        (void)inotify_rm_watch(p->ino, s->wd);
    free(s);
}

static struct session *session_add_locked(struct lb_ptys *p, const char *sid,
                                          const char *sandbox_id, bool pty)
{
    struct session *s = calloc(1, sizeof(*s));
    char path[PATH_MAX];

    if (!s)
        return NULL;
    snprintf(s->sid, sizeof(s->sid), "%s", sid);
    snprintf(s->sandbox_id, sizeof(s->sandbox_id), "%s", sandbox_id);
    s->pty = pty;
    snprintf(path, sizeof(path), "%s/%s", p->dir, sid);
    s->wd = inotify_add_watch(p->ino, path, WATCH_MASK | IN_DONT_FOLLOW | IN_ONLYDIR);
    if (s->wd < 0)
        log_warn("pty: cannot watch %s: %s (its long-polls wait for their deadline)", path,
                 strerror(errno));
    HASH_ADD_STR(p->sessions, sid, s);
    return s;
}

/* ---------- the watcher ---------- */

/* Does the session's holder still run? It holds its FIFOs open for reading as long as it
 * runs: opening one for writing without blocking fails with ENXIO once it is gone. The probe
 * uses "in": the watcher wakes on the closes of "ctl" (the holder's end), and a probe must not
 * wake the very poll that made it. */
static bool holder_alive(const struct lb_ptys *p, const char *sid)
{
    int sdir = session_dir_open(p, sid), fd;

    if (sdir < 0)
        return false;
    fd = session_open_fifo(sdir, "in");
    close(sdir);
    if (fd >= 0) {
        close(fd);
        return true;
    }
    /* no reader, no FIFO, or something planted in its place: nobody to serve the session */
    return fd != -ENXIO && fd != -ENOENT && fd != -EPERM;
}

static void on_event(struct lb_ptys *p, const struct inotify_event *ev)
{
    struct session *s, *tmp;

    pthread_mutex_lock(&p->lock);
    HASH_ITER(hh, p->sessions, s, tmp) {
        if (s->wd != ev->wd)
            continue;
        bool ctl_end = false;

        if (ev->mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF))
            s->wd = -1;
        /* a close of ctl is the holder's end, or a resize/signal request's: only the first
         * counts (the probe opens "in", which wakes nobody) */
        if (ev->len > 0 && strcmp(ev->name, "ctl") == 0)
            ctl_end = !holder_alive(p, s->sid);
        for (struct waiter **pw = &s->waiters; *pw;) {
            struct waiter *w = *pw;
            const char *stream = w->err_stream ? "err." : "out.";
            bool hit = !(ev->len > 0) || (!w->exit_only && strncmp(ev->name, stream, 4) == 0) ||
                       strcmp(ev->name, "exit") == 0 || ctl_end;

            if (!hit) {
                pw = &w->next;
                continue;
            }
            *pw = w->next;
            http_wake(w->park);
            http_park_release(w->park);
            free(w);
        }
        break;
    }
    pthread_mutex_unlock(&p->lock);
}

static void *watch_main(void *arg)
{
    struct lb_ptys *p = arg;
    char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));

    for (;;) {
        struct pollfd pf[2] = {{.fd = p->ino, .events = POLLIN},
                               {.fd = p->stop[0], .events = POLLIN}};
        ssize_t n;

        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (pf[1].revents)
            break;
        n = read(p->ino, buf, sizeof(buf));
        if (n <= 0)
            continue;
        for (char *c = buf; c < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)c;

            on_event(p, ev);
            c += sizeof(*ev) + ev->len;
        }
    }
    return NULL;
}

/* ---------- start and stop ---------- */

static void on_sandbox_stopped(void *ctx, const char *sandbox_id)
{
    struct lb_ptys *p = ctx;
    struct session *s, *tmp;
    char(*sids)[LB_PTY_SID_MAX] = NULL;
    size_t n = 0, cap = 0;

    pthread_mutex_lock(&p->lock);
    HASH_ITER(hh, p->sessions, s, tmp) {
        if (strcmp(s->sandbox_id, sandbox_id) != 0)
            continue;
        if (n == cap) {
            void *m = realloc(sids, (cap = cap ? cap * 2 : 8) * sizeof(*sids));

            if (!m)
                break;
            sids = m;
        }
        snprintf(sids[n++], LB_PTY_SID_MAX, "%s", s->sid);
        session_forget_locked(p, s);
    }
    pthread_mutex_unlock(&p->lock);
    for (size_t i = 0; i < n; i++)
        remove_session_dir(p, sids[i]);
    if (n)
        log_info("sbx=%s removed %zu PTY session(s) with the sandbox", sandbox_id, n);
    free(sids);
}

/* Load one session directory left by an earlier run. */
static void load_session(struct lb_ptys *p, const char *sid)
{
    char meta[META_MAX], holder[LB_SHA256_HEX + 2];
    json_t *m;
    const char *sbx;

    if (read_own(p, sid, "meta", meta, sizeof(meta)) < 0 || !(m = json_loads(meta, 0, NULL))) {
        /* a create that died before its meta was in: nothing can be running for it */
        remove_session_dir(p, sid);
        return;
    }
    sbx = json_string_value(json_object_get(m, "sandbox_id"));
    if (!sbx || !sandbox_is_running(p, sbx)) {
        remove_session_dir(p, sid);
    } else {
        struct session *s =
            session_add_locked(p, sid, sbx, json_is_true(json_object_get(m, "pty")));

        if (s && read_own(p, sid, "holder", holder, sizeof(holder)) == 0 &&
            strlen(holder) == LB_SHA256_HEX)
            memcpy(s->holder, holder, sizeof(s->holder));
    }
    json_decref(m);
}

int pty_service_new(const struct lb_pty_config *cfg, struct lb_lend *lend, struct lb_store *store,
                    struct lb_ptys **out, struct lb_error *err)
{
    struct lb_ptys *p = calloc(1, sizeof(*p));
    DIR *d;
    struct dirent *e;
    int r;

    *out = NULL;
    if (!p || !(p->dir = strdup(cfg->dir))) {
        free(p);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    p->cfg = *cfg;
    p->cfg.dir = p->dir;
    p->lend = lend;
    p->store = store;
    p->stop[0] = p->stop[1] = -1;
    pthread_mutex_init(&p->lock, NULL);
    p->dir_fd = -1;
    p->ino = -1;
    if ((mkdir(p->dir, 0700) < 0 && errno != EEXIST) ||
        (p->dir_fd = open(p->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
        fchmod(p->dir_fd, 0700) < 0) {
        r = lb_error_set(err, -errno, "cannot create '%s': %s", p->dir, strerror(errno));
        goto fail;
    }
    p->ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (p->ino < 0 || pipe2(p->stop, O_CLOEXEC) < 0) {
        r = lb_error_set(err, -errno, "cannot start the PTY watcher: %s", strerror(errno));
        goto fail;
    }
    r = openat(p->dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (r < 0 || !(d = fdopendir(r))) {
        if (r >= 0)
            close(r);
        r = lb_error_set(err, -errno, "cannot read '%s': %s", p->dir, strerror(errno));
        goto fail;
    }
    pthread_mutex_lock(&p->lock);
    while ((e = readdir(d))) {
        if (sid_is_valid(e->d_name)) {
            load_session(p, e->d_name);
        } else if (strncmp(e->d_name, "pty-", 4) == 0 && strchr(e->d_name, '.')) {
            /* the daemon's pty-<hex>.meta/.holder(.tmp): kept only with their session */
            char sid[LB_PTY_SID_MAX];
            size_t n = (size_t)(strchr(e->d_name, '.') - e->d_name);

            snprintf(sid, sizeof(sid), "%.*s", (int)(n < sizeof(sid) ? n : 0), e->d_name);
            if (!sid_is_valid(sid) || faccessat(p->dir_fd, sid, F_OK, AT_SYMLINK_NOFOLLOW) < 0 ||
                strstr(e->d_name, ".tmp"))
                (void)unlinkat(p->dir_fd, e->d_name, 0);
        }
    }
    pthread_mutex_unlock(&p->lock);
    closedir(d);
    if (pthread_create(&p->thread, NULL, watch_main, p) != 0) {
        r = lb_error_set(err, -EAGAIN, "cannot start the PTY watcher thread");
        goto fail;
    }
    p->thread_started = true;
    if (HASH_COUNT(p->sessions))
        log_info("pty: %u session(s) found from an earlier run", HASH_COUNT(p->sessions));
    lend_set_stopped_hook(lend, on_sandbox_stopped, p);
    *out = p;
    return 0;
fail:
    pty_service_free(p);
    return r;
}

void pty_service_free(struct lb_ptys *p)
{
    struct session *s, *tmp;

    if (!p)
        return;
    if (p->thread_started) {
        (void)!write(p->stop[1], "x", 1);
        pthread_join(p->thread, NULL);
    }
    if (p->lend)
        lend_set_stopped_hook(p->lend, NULL, NULL);
    HASH_ITER(hh, p->sessions, s, tmp) {
        HASH_DEL(p->sessions, s);
        wake_all_locked(s);
        free(s);
    }
    if (p->ino >= 0)
        close(p->ino);
    if (p->dir_fd >= 0)
        close(p->dir_fd);
    if (p->stop[0] >= 0)
        close(p->stop[0]);
    if (p->stop[1] >= 0)
        close(p->stop[1]);
    pthread_mutex_destroy(&p->lock);
    free(p->dir);
    free(p);
}

size_t pty_count(struct lb_ptys *p)
{
    size_t n;

    pthread_mutex_lock(&p->lock);
    n = HASH_COUNT(p->sessions);
    pthread_mutex_unlock(&p->lock);
    return n;
}

/* ---------- create ---------- */

int pty_create(struct lb_ptys *p, const char *sandbox_id, const struct lb_pty_create *c,
               char sid_out[LB_PTY_SID_MAX], struct lb_error *err)
{
    struct lb_provider_caps caps;
    struct lb_exec_result res = {0};
    json_t *env = NULL;
    struct session *s, *tmp;
    char sid[LB_PTY_SID_MAX] = "pty-", path[PATH_MAX], rows[16], cols[16], *meta = NULL;
    char *argv[18], *user = NULL;
    size_t n = 0, k = 0;
    int r, dir_fd = -1;
    bool made = false;

    r = lend_sandbox_caps(p->lend, sandbox_id, &caps, err);
    if (r < 0)
        return r;
    if (!caps.pty)
        return lb_error_set(err, -ENOSYS,
                            "the provider of sandbox %s has no PTY sessions (detached execs "
                            "included)",
                            sandbox_id);
    if (token_random_hex(16, sid + 4) < 0)
        return lb_error_set(err, -EIO, "no randomness for a session id");
    /* reserve the place first: the cap holds against concurrent creates */
    pthread_mutex_lock(&p->lock);
    HASH_ITER(hh, p->sessions, s, tmp) {
        if (strcmp(s->sandbox_id, sandbox_id) == 0)
            n++;
    }
    if ((int64_t)n >= p->cfg.max_sessions) {
        pthread_mutex_unlock(&p->lock);
        return lb_error_set(err, -EAGAIN,
                            "sandbox %s has %zu PTY sessions, the most allowed "
                            "(limits.max_pty_sessions)",
                            sandbox_id, n);
    }
    snprintf(path, sizeof(path), "%s/%s", p->dir, sid);
    /* the holder writes here as the sandbox's uid (any uid of it, once users come): the
     * directory is open to all, and reachable only through the fd we pass (pty/ is 0700) */
    if (mkdirat(p->dir_fd, sid, 0700) < 0 || (dir_fd = session_dir_open(p, sid)) < 0 ||
        fchmod(dir_fd, 0777) < 0) {
        r = lb_error_set(err, -EIO, "cannot create '%s': %s", path, strerror(errno));
        pthread_mutex_unlock(&p->lock);
        made = dir_fd >= 0;
        goto out;
    }
    made = true;
    s = session_add_locked(p, sid, sandbox_id, c->pty);
    pthread_mutex_unlock(&p->lock);
    if (!s) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    {
        json_t *m = json_pack("{s:s,s:b}", "sandbox_id", sandbox_id, "pty", c->pty);

        meta = m ? json_dumps(m, JSON_COMPACT) : NULL;
        json_decref(m);
    }
    if (!meta || (r = write_file_atomic(p, sid, "meta", meta)) < 0) {
        r = lb_error_set(err, -EIO, "cannot record the session: %s", strerror(meta ? -r : ENOMEM));
        goto out;
    }
    snprintf(rows, sizeof(rows), "%d", c->rows);
    snprintf(cols, sizeof(cols), "%d", c->cols);
    argv[k++] = SUPERVISE_PATH;
    argv[k++] = "--pty-launch";
    argv[k++] = "--dir-fd";
    argv[k++] = "4"; /* the exec's pass fd */
    argv[k++] = "--rows";
    argv[k++] = rows;
    argv[k++] = "--cols";
    argv[k++] = cols;
    if (!c->pty)
        argv[k++] = "--no-pty";
    /* the request's user, else the image's User: the holder runs the command as that user
     * (the launcher and holder stay the sandbox's root: only root reaches the supervisor) */
    r = lend_exec_user(p->lend, sandbox_id, c->user, &user, err);
    if (r < 0)
        goto out;
    if (user) {
        argv[k++] = "--user";
        argv[k++] = user;
    }
    argv[k++] = "--";
    argv[k++] = "/bin/sh";
    argv[k++] = "-c";
    argv[k++] = (char *)(c->command ? c->command : LOGIN_SHELL);
    argv[k] = NULL;
    /* a terminal gets a TERM unless the request names one (as terminal servers do) */
    env = c->env ? json_copy(c->env) : json_object();
    if (!env) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    if (c->pty && !json_object_get(env, "TERM"))
        json_object_set_new(env, "TERM", json_string("xterm-256color"));
    struct lb_exec_params ep = {
        .argv = argv,
        .cwd = c->cwd,
        .env = env,
        .user = c->user,
        .timeout_ms = LAUNCH_TIMEOUT_MS,
        .preserve_background = true, /* the holder outlives the launch exec */
        .pass_fd = dir_fd,
    };
    r = lend_exec(p->lend, sandbox_id, &ep, &res, err);
    if (r < 0)
        goto out;
    if (res.error_type != LB_EXEC_OK || res.return_code != 0) {
        const char *why = res.message[0] ? res.message : res.err.data ? res.err.data : "";
        int wl = res.message[0] ? (int)strlen(res.message) : (int)res.err.len;

        r = lb_error_set(err, -EREMOTEIO, "the PTY session could not be started (exit %d): %.*s",
                         res.return_code, wl > 400 ? 400 : wl, why);
        goto out;
    }
    snprintf(sid_out, LB_PTY_SID_MAX, "%s", sid);
    log_info("sbx=%s PTY session %s started (%s)", sandbox_id, sid, c->pty ? "pty" : "pipes");
    r = 0;
out:
    provider_exec_result_release(&res);
    json_decref(env);
    if (dir_fd >= 0)
        close(dir_fd);
    free(meta);
    free(user);
    if (r < 0 && made) {
        pthread_mutex_lock(&p->lock);
        HASH_FIND_STR(p->sessions, sid, s);
        if (s)
            session_forget_locked(p, s);
        pthread_mutex_unlock(&p->lock);
        remove_session_dir(p, sid);
    }
    return r;
}

/* ---------- lookups ---------- */

int pty_sandbox_of(struct lb_ptys *p, const char *sid, char *sandbox_id, size_t len)
{
    struct session *s = NULL;

    if (!sid_is_valid(sid))
        return -ENOENT;
    pthread_mutex_lock(&p->lock);
    HASH_FIND_STR(p->sessions, sid, s);
    if (s)
        snprintf(sandbox_id, len, "%s", s->sandbox_id);
    pthread_mutex_unlock(&p->lock);
    return s ? 0 : -ENOENT;
}

static int not_found(struct lb_error *err, const char *sid)
{
    return lb_error_set(err, -ENOENT, "no PTY session %s", sid ? sid : "");
}

/* The session (lock held on success); -ENOENT otherwise (unlocked). */
static int session_lock(struct lb_ptys *p, const char *sid, struct session **out,
                        struct lb_error *err)
{
    struct session *s = NULL;

    if (!sid_is_valid(sid))
        return not_found(err, sid);
    pthread_mutex_lock(&p->lock);
    HASH_FIND_STR(p->sessions, sid, s);
    if (!s || s->gone) {
        pthread_mutex_unlock(&p->lock);
        return not_found(err, sid);
    }
    *out = s;
    return 0;
}

int pty_check_token(struct lb_ptys *p, const char *sid, const char *token, struct lb_error *err)
{
    char hash[LB_SHA256_HEX + 1];
    struct session *s;
    int r = session_lock(p, sid, &s, err);

    if (r < 0 || !token) {
        if (r == 0)
            pthread_mutex_unlock(&p->lock);
        return r;
    }
    token_sha256_hex(token, strlen(token), hash);
    if (!s->holder[0] || !token_equal(hash, s->holder))
        r = lb_error_set(err, -EBUSY,
                         "this attach token is not the session's: another client took it over");
    pthread_mutex_unlock(&p->lock);
    return r;
}

/* The holder is gone without an exit status: the session ended with its sandbox (released,
 * deleted: 404, as for a deleted session), or its holder was killed (502). */
static int holder_lost(struct lb_ptys *p, struct lb_error *err, const char *sid)
{
    char sandbox[LB_ID_MAX];

    if (pty_sandbox_of(p, sid, sandbox, sizeof(sandbox)) < 0 || !sandbox_is_running(p, sandbox))
        return not_found(err, sid);
    return lb_error_set(err, -EREMOTEIO,
                        "PTY session %s ended without an exit status: its holder process in the "
                        "sandbox was killed",
                        sid);
}

/* ---------- output ---------- */

struct seg_range {
    bool any;
    uint64_t lo, hi; /* lowest and highest segment index present */
};

/* Index of a segment name PREFIX.K (K decimal, no sign, no leading zero but "0"), or -1. */
static int64_t segment_index(const char *name, const char *prefix)
{
    size_t pl = strlen(prefix);
    const char *d = name + pl;
    char *end;
    unsigned long long k;

    if (strncmp(name, prefix, pl) != 0 || *d < '0' || *d > '9' || (d[0] == '0' && d[1]))
        return -1;
    errno = 0;
    k = strtoull(d, &end, 10);
    return errno || *end || k > (unsigned long long)INT64_MAX / SEG_BYTES ? -1 : (int64_t)k;
}

/* The names the holder writes besides the segments (lendbox-supervise's PTY mode). */
static bool holder_name(const char *n)
{
    static const char *const names[] = {"exit", "in", "ctl", "pid", ".exit.tmp", ".pid.tmp"};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(n, names[i]) == 0)
            return true;
    return false;
}

#define SWEEP_SEGS 6 /* segments kept by the sweep: the holder's 5 and the one it opens next */

/* Find the range of PREFIX segments in the session directory, and sweep it: whatever the
 * holder never writes (other names, directories, symlinks, FIFOs or hard links where a file
 * belongs, segments over SEG_BYTES or behind the retained window) is removed, so a sandbox
 * that got hold of the directory cannot grow it past about SWEEP_SEGS segments per stream
 * for longer than until the next read. */
static void scan_segments(int sdir, const char *prefix, struct seg_range *sr)
{
    struct seg_range both[2] = {{0}};
    static const char *const prefixes[2] = {"out.", "err."};
    struct dirent *e;
    DIR *d;
    int fd = openat(sdir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);

    memset(sr, 0, sizeof(*sr));
    if (fd < 0 || !(d = fdopendir(fd))) {
        if (fd >= 0)
            close(fd);
        return;
    }
    for (int pass = 0; pass < 2; pass++) { /* 1: ranges known, remove the old segments */
        rewinddir(d);
        while ((e = readdir(d))) {
            const char *n = e->d_name;
            uint64_t size;
            int64_t k = -1;
            int i;

            if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0)
                continue;
            for (i = 0; i < 2 && k < 0; i++)
                k = segment_index(n, prefixes[i]);
            i--;
            if (k < 0) {
                if (pass == 0 && !holder_name(n)) {
                    log_warn("pty: removing '%s' from a session directory (not the holder's)", n);
                    remove_entry_at(dirfd(d), n, 0);
                }
                continue;
            }
            if (pass == 0) {
                if (!session_file_ok(dirfd(d), n, &size) || size > SEG_BYTES) {
                    log_warn("pty: removing '%s' from a session directory (not a segment)", n);
                    remove_entry_at(dirfd(d), n, 0);
                    continue;
                }
                if (!both[i].any || (uint64_t)k < both[i].lo)
                    both[i].lo = (uint64_t)k;
                if (!both[i].any || (uint64_t)k > both[i].hi)
                    both[i].hi = (uint64_t)k;
                both[i].any = true;
            } else if ((uint64_t)k + SWEEP_SEGS <= both[i].hi) {
                (void)unlinkat(dirfd(d), n, 0);
            }
        }
    }
    closedir(d);
    for (int i = 0; i < 2; i++) {
        if (both[i].any && both[i].hi >= SWEEP_SEGS && both[i].lo + SWEEP_SEGS <= both[i].hi)
            both[i].lo = both[i].hi - SWEEP_SEGS + 1;
        if (strcmp(prefix, prefixes[i]) == 0)
            *sr = both[i];
    }
}

int pty_read(struct lb_ptys *p, const char *sid, bool err_stream, uint64_t since,
             struct lb_pty_chunk *out, struct lb_error *err)
{
    const char *prefix = err_stream ? "err." : "out.";
    char name[64], exit_text[32];
    struct seg_range sr;
    struct session *s;
    struct stat stt;
    uint64_t size;
    int r = session_lock(p, sid, &s, err), fd, sdir;

    memset(out, 0, sizeof(*out));
    out->fd = -1;
    if (r < 0)
        return r;
    pthread_mutex_unlock(&p->lock);
    sdir = session_dir_open(p, sid);
    if (sdir < 0)
        return not_found(err, sid);
    /* the exit file first: it is renamed in after the last byte, so the end read after it
     * is final */
    if (read_small(p, sid, "exit", exit_text, sizeof(exit_text)) == 0) {
        out->exited = true;
        out->exit_code = atoi(exit_text);
    }
    scan_segments(sdir, prefix, &sr);
    if (!sr.any) {
        sr.lo = sr.hi = 0; /* not started yet: an empty stream */
        out->end = 0;
    } else {
        snprintf(name, sizeof(name), "%s%" PRIu64, prefix, sr.hi);
        if (!session_file_ok(sdir, name, &size) || size > SEG_BYTES)
            size = 0;
        out->end = sr.hi * SEG_BYTES + size;
    }
    r = 0;
    if (since > out->end) {
        r = lb_error_set(err, -EINVAL,
                         "since %" PRIu64 " is past the end of the output (%" PRIu64
                         " bytes so far)",
                         since, out->end);
        goto out;
    }
    if (since < sr.lo * SEG_BYTES) {
        r = lb_error_set(err, -ESTALE,
                         "since %" PRIu64 " is older than the retained window (it starts at "
                         "%" PRIu64 ")",
                         since, sr.lo * SEG_BYTES);
        goto out;
    }
    out->next = since;
    if (since == out->end) {
        /* nothing more: is anyone still there to write it? (the exit file comes before the
         * holder lets go of ctl, so a second look settles a race with a normal end) */
        if (!out->exited && !holder_alive(p, sid)) {
            if (read_small(p, sid, "exit", exit_text, sizeof(exit_text)) == 0) {
                out->exited = true;
                out->exit_code = atoi(exit_text);
                goto out;
            }
            r = holder_lost(p, err, sid);
        }
        goto out;
    }
    snprintf(name, sizeof(name), "%s%" PRIu64, prefix, since / SEG_BYTES);
    fd = session_open_file(sdir, name, &stt);
    if (fd == -EPERM) {
        r = lb_error_set(err, -EREMOTEIO,
                         "PTY session %s: %s is not an output segment the holder wrote (a "
                         "symlink, FIFO or link was planted in its place); it is not served",
                         sid, name);
        goto out;
    }
    if (fd < 0) {
        r = lb_error_set(err, -ESTALE, "since %" PRIu64 " left the retained window just now",
                         since);
        goto out;
    }
    out->file_off = since % SEG_BYTES;
    size = (uint64_t)stt.st_size > SEG_BYTES ? SEG_BYTES : (uint64_t)stt.st_size;
    if (size <= out->file_off) { /* the segment is being started */
        close(fd);
        goto out;
    }
    out->fd = fd;
    out->len = size - out->file_off;
    out->next = since + out->len;
out:
    close(sdir);
    return r;
}

int pty_exit_code(struct lb_ptys *p, const char *sid, int *code, struct lb_error *err)
{
    char text[32];
    struct session *s;
    int r = session_lock(p, sid, &s, err);

    if (r < 0)
        return r;
    pthread_mutex_unlock(&p->lock);
    if (read_small(p, sid, "exit", text, sizeof(text)) < 0) {
        if (holder_alive(p, sid))
            return -EAGAIN;
        if (read_small(p, sid, "exit", text, sizeof(text)) < 0)
            return holder_lost(p, err, sid);
    }
    *code = atoi(text);
    return 0;
}

void pty_watch(struct lb_ptys *p, const char *sid, bool err_stream, int64_t since,
               struct lb_park *park)
{
    struct waiter *w = calloc(1, sizeof(*w));
    struct lb_pty_chunk c;
    struct session *s = NULL;
    bool ready;

    pthread_mutex_lock(&p->lock);
    if (sid_is_valid(sid))
        HASH_FIND_STR(p->sessions, sid, s);
    if (!s || !w) {
        pthread_mutex_unlock(&p->lock);
        free(w);
        http_wake(park);
        http_park_release(park);
        return;
    }
    w->park = park;
    w->err_stream = err_stream;
    w->exit_only = since < 0;
    w->next = s->waiters;
    s->waiters = w;
    pthread_mutex_unlock(&p->lock);
    /* registered: now the event cannot be missed; has it happened already? */
    if (since < 0) {
        int code;

        ready = pty_exit_code(p, sid, &code, NULL) != -EAGAIN;
    } else if (pty_read(p, sid, err_stream, (uint64_t)since, &c, NULL) < 0) {
        ready = true;
    } else {
        ready = c.exited || (since >= 0 && c.end > (uint64_t)since);
        if (c.fd >= 0)
            close(c.fd);
    }
    if (ready)
        http_wake(park); /* its free_arg unlinks it (pty_unwatch) */
}

void pty_unwatch(struct lb_ptys *p, struct lb_park *park)
{
    struct session *s, *tmp;

    pthread_mutex_lock(&p->lock);
    HASH_ITER(hh, p->sessions, s, tmp) {
        for (struct waiter **pw = &s->waiters; *pw; pw = &(*pw)->next) {
            if ((*pw)->park == park) {
                struct waiter *w = *pw;

                *pw = w->next;
                http_park_release(w->park);
                free(w);
                pthread_mutex_unlock(&p->lock);
                return;
            }
        }
    }
    pthread_mutex_unlock(&p->lock);
}

/* ---------- input and control ---------- */

static bool session_exited(struct lb_ptys *p, const char *sid)
{
    int sdir = session_dir_open(p, sid);
    bool exited = sdir >= 0 && session_file_ok(sdir, "exit", NULL);

    if (sdir >= 0)
        close(sdir);
    return exited;
}

/* Open a FIFO of the session for writing, without blocking. */
static int open_fifo(struct lb_ptys *p, const char *sid, const char *name, struct lb_error *err)
{
    int sdir = session_dir_open(p, sid), fd;

    if (sdir < 0)
        return not_found(err, sid);
    fd = session_open_fifo(sdir, name);
    close(sdir);
    if (fd >= 0)
        return fd;
    if (fd == -EPERM)
        return lb_error_set(err, -EREMOTEIO,
                            "PTY session %s: its %s is not the holder's FIFO (something was "
                            "planted in its place); nothing was written",
                            sid, name);
    if (fd == -ENXIO || session_exited(p, sid))
        return lb_error_set(err, -EBUSY, "the session's process has exited");
    if (fd == -ENOENT)
        return not_found(err, sid);
    return lb_error_set(err, -EIO, "cannot reach the session: %s", strerror(-fd));
}

int pty_input(struct lb_ptys *p, const char *sid, const void *data, size_t len,
              struct lb_error *err)
{
    struct session *s;
    int64_t deadline = clock_mono_ms() + INPUT_WAIT_MS;
    size_t done = 0;
    int r = session_lock(p, sid, &s, err), fd;

    if (r < 0)
        return r;
    pthread_mutex_unlock(&p->lock);
    if (session_exited(p, sid))
        return lb_error_set(err, -EBUSY, "the session's process has exited");
    fd = open_fifo(p, sid, "in", err);
    if (fd < 0)
        return fd;
    while (done < len) {
        ssize_t w = write(fd, (const char *)data + done, len - done);

        if (w > 0) {
            done += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            int64_t left = deadline - clock_mono_ms();

            if (left > 0 && poll(&pf, 1, (int)(left > 100 ? 100 : left)) >= 0)
                continue;
            r = lb_error_set(err, -EAGAIN,
                             "the terminal took %zu of %zu bytes and nothing more for %d s", done,
                             len, INPUT_WAIT_MS / 1000);
            break;
        }
        r = lb_error_set(err, -EBUSY, "the session's process has exited");
        break;
    }
    close(fd);
    return r;
}

static int send_control(struct lb_ptys *p, const char *sid, const char *line, struct lb_error *err)
{
    struct session *s;
    size_t n = strlen(line);
    int r = session_lock(p, sid, &s, err), fd;

    if (r < 0)
        return r;
    pthread_mutex_unlock(&p->lock);
    fd = open_fifo(p, sid, "ctl", err);
    if (fd < 0)
        return fd;
    /* one short line: a single atomic pipe write */
    if (write(fd, line, n) != (ssize_t)n)
        r = lb_error_set(err, errno == EAGAIN ? -EAGAIN : -EBUSY,
                         "the session did not take the request: %s", strerror(errno));
    close(fd);
    return r;
}

int pty_resize(struct lb_ptys *p, const char *sid, int rows, int cols, struct lb_error *err)
{
    char line[64];

    if (rows < 1 || rows > 65535 || cols < 1 || cols > 65535)
        return lb_error_set(err, -EINVAL, "rows and cols must be 1-65535");
    snprintf(line, sizeof(line), "resize %d %d\n", rows, cols);
    return send_control(p, sid, line, err);
}

int pty_signal(struct lb_ptys *p, const char *sid, int sig, struct lb_error *err)
{
    char line[32];

    if (sig < 1 || sig >= NSIG)
        return lb_error_set(err, -EINVAL, "no such signal");
    snprintf(line, sizeof(line), "signal %d\n", sig);
    return send_control(p, sid, line, err);
}

int pty_signal_number(const char *name)
{
    static const struct {
        const char *name;
        int sig;
    } names[] = {{"HUP", SIGHUP},   {"INT", SIGINT},     {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
                 {"TERM", SIGTERM}, {"USR1", SIGUSR1},   {"USR2", SIGUSR2}, {"STOP", SIGSTOP},
                 {"CONT", SIGCONT}, {"WINCH", SIGWINCH}, {"ALRM", SIGALRM}, {"TSTP", SIGTSTP},
                 {"PIPE", SIGPIPE}, {"ABRT", SIGABRT}};
    char *end;
    long v;

    if (!name || !*name)
        return -1;
    if (strncmp(name, "SIG", 3) == 0)
        name += 3;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(name, names[i].name) == 0)
            return names[i].sig;
    v = strtol(name, &end, 10);
    return *end || v < 1 || v >= NSIG ? -1 : (int)v;
}

int pty_attach(struct lb_ptys *p, const char *sid, bool takeover, char token_out[LB_PTY_TOKEN_MAX],
               struct lb_error *err)
{
    char token[LB_PTY_TOKEN_MAX], hash[LB_SHA256_HEX + 1];
    struct session *s;
    int r = session_lock(p, sid, &s, err);

    if (r < 0)
        return r;
    if (s->holder[0] && !takeover) {
        pthread_mutex_unlock(&p->lock);
        return lb_error_set(err, -EBUSY,
                            "session %s is held by another client (attach with takeover)", sid);
    }
    if (token_random_hex(16, token) < 0) {
        pthread_mutex_unlock(&p->lock);
        return lb_error_set(err, -EIO, "no randomness for a token");
    }
    token_sha256_hex(token, strlen(token), hash);
    /* recorded before it is handed out, so a restart keeps the holder */
    r = write_file_atomic(p, sid, "holder", hash);
    if (r < 0) {
        pthread_mutex_unlock(&p->lock);
        return lb_error_set(err, -EIO, "cannot record the holder: %s", strerror(-r));
    }
    memcpy(s->holder, hash, sizeof(s->holder));
    wake_all_locked(s); /* the old holder's parked polls answer 409 now */
    pthread_mutex_unlock(&p->lock);
    snprintf(token_out, LB_PTY_TOKEN_MAX, "%s", token);
    return 0;
}

int pty_delete(struct lb_ptys *p, const char *sid, struct lb_error *err)
{
    struct session *s;
    int r = session_lock(p, sid, &s, err), fd = -1, sdir;

    if (r < 0)
        return r;
    session_forget_locked(p, s);
    pthread_mutex_unlock(&p->lock);
    /* the holder kills its process tree and then exits; its files go with the directory */
    sdir = session_dir_open(p, sid);
    if (sdir >= 0) {
        fd = session_open_fifo(sdir, "ctl");
        close(sdir);
    }
    if (fd >= 0) {
        (void)!write(fd, "kill\n", 5);
        close(fd);
    }
    remove_session_dir(p, sid);
    return 0;
}
