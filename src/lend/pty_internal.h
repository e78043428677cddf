/*
 * pty_internal.h - what the PTY service's files share, and nothing else includes: pty.c
 * (registry, create, attach, delete), pty_watch.c (the inotify watcher and its waiters),
 * pty_io.c (output replay, input, control), pty_session.c (the session-directory helpers,
 * the holder probe, the lookups) and context.c (code contexts, built on the public calls; it
 * uses the session's busy flag and lookups). Calls go one way: context.c -> pty.c ->
 * pty_watch.c -> pty_io.c, and each of them -> pty_session.c, which calls none of them.
 *
 * Locking: p->lock guards p->sessions and every session's fields; functions named *_locked
 * expect it held. Errors are negative errnos; with an err argument, detail goes there.
 */
#ifndef LB_PTY_INTERNAL_H
#define LB_PTY_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <uthash.h>

#include "lend/pty.h"
#include "util/token.h"

struct pty_waiter; /* pty_watch.c's */

struct session {
    char sid[LB_PTY_SID_MAX];
    char sandbox_id[LB_ID_MAX];
    bool pty;
    bool gone;                      /* deleted: the directory is being removed */
    bool busy;                      /* a code context's run is under way (context.c) */
    char holder[LB_SHA256_HEX + 1]; /* "" : not held */
    int wd;                         /* inotify watch, -1: none */
    struct pty_waiter *waiters;
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

/* ---------- pty_session.c: the session directory (untrusted: written by the sandbox) ---------- */

/* Is sid a session id the service makes ("pty-" and hex)? */
bool pty_sid_is_valid(const char *sid);
/* The session's directory as an fd (the caller's), or -errno. */
int pty_session_dir_open(const struct lb_ptys *p, const char *sid);
/* Open a file the holder wrote for reading: a regular file with one link, never a symlink or a
 * FIFO. The fd (the caller's; *st filled) or -errno (-EPERM: something else is there). */
int pty_session_open_file(int sdir, const char *name, struct stat *st);
/* Read up to len-1 bytes (len >= 1) of fd into buf, NUL-terminated, and close fd (taken in
 * every case). 0 or -errno of the read. */
int pty_read_text(int fd, char *buf, size_t len);
/* Is name a regular file of the holder's (lstat; one link)? Its size in *size (may be NULL). */
bool pty_session_file_ok(int sdir, const char *name, uint64_t *size);
/* Open a FIFO of the session (in, ctl) for writing without blocking: the fd (the caller's),
 * -EPERM (not a FIFO: never written), -ENXIO (no reader: the holder is gone), -errno. */
int pty_session_open_fifo(int sdir, const char *name);
/* Remove name in dir (a file, or a directory and what is in it) without following a symlink;
 * depth bounds the recursion (callers pass 0). */
void pty_remove_entry_at(int dir, const char *name, int depth);
/* Does the session's holder still run (its "in" FIFO has a reader)? Opens nothing but "in". */
bool pty_holder_alive(const struct lb_ptys *p, const char *sid);

/* ---------- pty_session.c: registry lookups ---------- */

/* -ENOENT with "no PTY session <sid>". */
int pty_not_found(struct lb_error *err, const char *sid);
/* The live session sid in *out with p->lock held (the caller unlocks); -ENOENT unlocked. */
int pty_session_lock(struct lb_ptys *p, const char *sid, struct session **out,
                     struct lb_error *err);

/* ---------- pty_watch.c: the watcher and its waiters ---------- */

/* Make the inotify fd and the stop pipe (p->ino, p->stop). -errno. */
int pty_watcher_open(struct lb_ptys *p, struct lb_error *err);
/* Start the watcher thread. -EAGAIN. */
int pty_watcher_start(struct lb_ptys *p, struct lb_error *err);
/* Stop and join the watcher thread, if it runs. */
void pty_watcher_stop(struct lb_ptys *p);
/* Close what pty_watcher_open made (after pty_watcher_stop). */
void pty_watcher_close(struct lb_ptys *p);
/* Watch the session's directory (s->wd; -1 and a warning when it cannot be watched). */
void pty_watcher_add_locked(struct lb_ptys *p, struct session *s);
/* Wake and drop the session's waiters and stop watching its directory. */
void pty_watcher_forget_locked(struct lb_ptys *p, struct session *s);
/* Wake and drop the session's waiters (a takeover, the session's end). */
void pty_wake_all_locked(struct session *s);

#endif
