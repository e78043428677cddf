/*
 * pty.c - the PTY service (see pty.h): its registry of sessions (start, rediscovery after a
 * restart, the end of a sandbox's sessions with the sandbox), create, attach and delete. The
 * watcher and its waiters are in pty_watch.c; output replay, input and control in pty_io.c;
 * the one way the daemon reaches a session directory the sandbox writes, and the lookups the
 * other files share, in pty_session.c. Shares pty_internal.h.
 */
#include "lend/pty_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/log.h"
#include "util/token.h"

#define SUPERVISE_PATH "/run/lendbox/supervise"
#define LAUNCH_TIMEOUT_MS 30000
#define META_MAX 4096
#define LOGIN_SHELL "if [ -x /bin/bash ]; then exec /bin/bash -l; else exec /bin/sh -l; fi"

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
    int fd;

    snprintf(path, sizeof(path), "%s.%s", sid, name);
    fd = openat(p->dir_fd, path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return -EPERM;
    }
    return pty_read_text(fd, buf, len);
}

/* Remove pty/<sid>/ and what is in it, and the daemon's pty/<sid>.meta and .holder. */
static void remove_session_dir(const struct lb_ptys *p, const char *sid)
{
    char own[LB_PTY_SID_MAX + 32];
    int tries = 0;

    /* a holder still ending (DELETE) may add its exit file meanwhile: a few passes */
    do
        pty_remove_entry_at(p->dir_fd, sid, 0);
    while (faccessat(p->dir_fd, sid, F_OK, AT_SYMLINK_NOFOLLOW) == 0 && ++tries < 5);
    if (faccessat(p->dir_fd, sid, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
        log_warn("pty: cannot remove %s/%s", p->dir, sid);
    snprintf(own, sizeof(own), "%s.meta", sid);
    (void)unlinkat(p->dir_fd, own, 0);
    snprintf(own, sizeof(own), "%s.holder", sid);
    (void)unlinkat(p->dir_fd, own, 0);
}

/* ---------- the registry ---------- */

/* Drop a session from memory (lock held): wake its waiters, stop watching it. */
static void session_forget_locked(struct lb_ptys *p, struct session *s)
{
    HASH_DEL(p->sessions, s);
    pty_watcher_forget_locked(p, s);
    free(s);
}

static struct session *session_add_locked(struct lb_ptys *p, const char *sid,
                                          const char *sandbox_id, bool pty)
{
    struct session *s = calloc(1, sizeof(*s));

    if (!s)
        return NULL;
    snprintf(s->sid, sizeof(s->sid), "%s", sid);
    snprintf(s->sandbox_id, sizeof(s->sandbox_id), "%s", sandbox_id);
    s->pty = pty;
    pty_watcher_add_locked(p, s);
    HASH_ADD_STR(p->sessions, sid, s);
    return s;
}

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
    if (!sbx || !store_sandbox_is_lent(p->store, sbx)) {
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
    r = pty_watcher_open(p, err);
    if (r < 0)
        goto fail;
    r = openat(p->dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (r < 0 || !(d = fdopendir(r))) {
        if (r >= 0)
            close(r);
        r = lb_error_set(err, -errno, "cannot read '%s': %s", p->dir, strerror(errno));
        goto fail;
    }
    pthread_mutex_lock(&p->lock);
    while ((e = readdir(d))) {
        if (pty_sid_is_valid(e->d_name)) {
            load_session(p, e->d_name);
        } else if ((strncmp(e->d_name, "pty-", 4) == 0 ||
                    strncmp(e->d_name, LB_CONTEXT_PREFIX, 4) == 0) &&
                   strchr(e->d_name, '.')) {
            /* the daemon's <sid>.meta/.holder(.tmp): kept only with their session */
            char sid[LB_PTY_SID_MAX];
            size_t n = (size_t)(strchr(e->d_name, '.') - e->d_name);

            snprintf(sid, sizeof(sid), "%.*s", (int)(n < sizeof(sid) ? n : 0), e->d_name);
            if (!pty_sid_is_valid(sid) ||
                faccessat(p->dir_fd, sid, F_OK, AT_SYMLINK_NOFOLLOW) < 0 ||
                strstr(e->d_name, ".tmp"))
                (void)unlinkat(p->dir_fd, e->d_name, 0);
        }
    }
    pthread_mutex_unlock(&p->lock);
    closedir(d);
    r = pty_watcher_start(p, err);
    if (r < 0)
        goto fail;
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
    pty_watcher_stop(p);
    if (p->lend)
        lend_set_stopped_hook(p->lend, NULL, NULL);
    HASH_ITER(hh, p->sessions, s, tmp) {
        HASH_DEL(p->sessions, s);
        pty_wake_all_locked(s);
        free(s);
    }
    pty_watcher_close(p);
    if (p->dir_fd >= 0)
        close(p->dir_fd);
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
    char sid[LB_PTY_SID_MAX], path[PATH_MAX], rows[16], cols[16], *meta = NULL;
    char *argv[18], *user = NULL;
    size_t n = 0, k = 0;
    int r, dir_fd = -1;
    bool made = false;

    r = lend_sandbox_caps(p->lend, sandbox_id, &caps, err);
    if (r < 0)
        return r;
    if (!caps.pty)
        return lb_error_set(err, -ENOSYS,
                            "the provider of sandbox %s has no PTY sessions (detached execs and "
                            "code contexts included)",
                            sandbox_id);
    memcpy(sid, c->context ? LB_CONTEXT_PREFIX : "pty-", 5);
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
    if (mkdirat(p->dir_fd, sid, 0700) < 0 || (dir_fd = pty_session_dir_open(p, sid)) < 0 ||
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
        .fence_held = c->fence_held,
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

/* ---------- attach and delete ---------- */

int pty_check_token(struct lb_ptys *p, const char *sid, const char *token, struct lb_error *err)
{
    char hash[LB_SHA256_HEX + 1];
    struct session *s;
    int r = pty_session_lock(p, sid, &s, err);

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

int pty_attach(struct lb_ptys *p, const char *sid, bool takeover, char token_out[LB_PTY_TOKEN_MAX],
               struct lb_error *err)
{
    char token[LB_PTY_TOKEN_MAX], hash[LB_SHA256_HEX + 1];
    struct session *s;
    int r = pty_session_lock(p, sid, &s, err);

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
    pty_wake_all_locked(s); /* the old holder's parked polls answer 409 now */
    pthread_mutex_unlock(&p->lock);
    snprintf(token_out, LB_PTY_TOKEN_MAX, "%s", token);
    return 0;
}

int pty_delete(struct lb_ptys *p, const char *sid, struct lb_error *err)
{
    struct session *s;
    int r = pty_session_lock(p, sid, &s, err), fd = -1, sdir;

    if (r < 0)
        return r;
    session_forget_locked(p, s);
    pthread_mutex_unlock(&p->lock);
    /* the holder kills its process tree and then exits; its files go with the directory */
    sdir = pty_session_dir_open(p, sid);
    if (sdir >= 0) {
        fd = pty_session_open_fifo(sdir, "ctl");
        close(sdir);
    }
    if (fd >= 0) {
        (void)!write(fd, "kill\n", 5);
        close(fd);
    }
    remove_session_dir(p, sid);
    return 0;
}
