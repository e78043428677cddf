/*
 * pty.h - PTY sessions and detached execs (API.md "PTY"; NeMo Gym's sandbox.pty and detached
 * exec): a terminal (or, with pty false, three pipes) that lives in the sandbox under
 * lendbox-supervise --pty-launch, outlives the request that made it and the daemon itself, and
 * whose output can be replayed from a byte offset.
 *
 * Where things are. Each session has a directory <dir>/<sid> on the host (dir is
 * <state_dir>/pty, mode 0700: only the daemon and the fd it passes reach it). The launch exec
 * runs `lendbox-supervise --pty-launch --dir-fd 4 ...` through lend_exec (the path every exec
 * takes, with the same cwd, env and user handling) with that directory as its pass fd; the
 * holder it starts (its own session in the sandbox, so it survives the exec and a daemon
 * restart) writes there:
 *
 *   out.K, err.K   output segments: logical bytes K*256 KiB .. (K+1)*256 KiB of the stream;
 *                  the 5 newest are kept, so at least 1 MiB of history is always retained
 *   exit           the exit code (128+N for signal N), renamed into place after the last
 *                  output byte was written: present means drained
 *   in, ctl        FIFOs: raw input bytes; control lines ("resize R C", "signal N", "kill")
 *   pid            the holder's pid in the sandbox (informative)
 *
 * and the daemon writes <dir>/<sid>.meta (the sandbox id and mode) and <dir>/<sid>.holder (the
 * SHA-256 of the current attach token), 0600, beside the directory and never in it. Nothing
 * in the session directory is trusted (the sandbox writes it): the daemon reaches it only
 * through a directory fd, never follows a symlink, never opens a FIFO but in/ctl (and those
 * only if they are FIFOs), serves only regular single-link segments of at most 256 KiB, sweeps
 * away what the holder never writes, and removes it without following links (see
 * docs/operations.md "PTY sessions"). Sessions are rediscovered from the directory at start, so a
 * kill -9 and restart of lendboxd loses nothing. One inotify thread watches every session directory
 * and wakes the parked long-polls (output, wait) of a session when its files change: a poll
 * never holds a worker. A stop of the sandbox (any stop through lending) removes its
 * sessions; its processes die with the sandbox's cgroup.
 *
 * Thread-safety: every function may be called from any thread. Functions marked "quick" only
 * touch memory and local files (fine on an HTTP thread); pty_create blocks on the provider
 * (a worker's job).
 */
#ifndef LB_PTY_H
#define LB_PTY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lend/lend.h"
#include "store/store.h"
#include "util/error.h"

#define LB_PTY_SID_MAX 40
/* A session id is "pty-" and hex; a code context's (lend/context.h) is this prefix and hex. */
#define LB_CONTEXT_PREFIX "ctx-"
#define LB_PTY_TOKEN_MAX 65

struct lb_ptys;

struct lb_pty_config {
    const char *dir;      /* <state_dir>/pty; created (0700) if missing */
    int64_t max_sessions; /* sessions per sandbox, exited ones until deleted ([limits]
                             max_pty_sessions) */
};

/* Start the service: scan dir for sessions left by an earlier run, start the watcher thread.
 * lend and store stay the caller's and must outlive the service. Registers itself as lend's
 * stopped hook. -ENOMEM, -errno (dir unusable) with a message. */
int pty_service_new(const struct lb_pty_config *cfg, struct lb_lend *lend, struct lb_store *store,
                    struct lb_ptys **out, struct lb_error *err);
/* Stop the watcher and free (NULL-safe). Sessions and their directories stay (they outlive
 * the daemon); call after http_stop (no parked request refers to the service any more). */
void pty_service_free(struct lb_ptys *p);

struct lb_pty_create {
    const char *command; /* run as /bin/sh -c; NULL: a login shell (bash -l, else sh -l) */
    const char *cwd;     /* NULL: the sandbox's workdir */
    json_t *env;         /* object of strings or NULL (merged over the seed's, as exec) */
    const char *user;    /* NULL: the exec default; passed to lend_exec unchanged */
    int rows, cols;      /* 1..65535 */
    bool pty;            /* false: pipes, stdout and stderr apart (detached exec) */
    bool context;        /* a code context's interpreter: the id starts with LB_CONTEXT_PREFIX */
    bool *fence_held;    /* NULL, or the operate-token fence the caller holds, handed to the
                            launch's lend_exec (lb_exec_params.fence_held); what is still held
                            when pty_create returns is the caller's to leave */
};

/* Create a session in sandbox_id and start its process. sid_out receives the session id.
 * Blocks on the provider (run it on a worker). Errors: -ENOENT (no such running sandbox),
 * -ENOSYS (the sandbox's provider has no PTY capability: 501), -EAGAIN (the sandbox has
 * max_sessions live sessions: 429), -EREMOTEIO (the launch failed; message from the sandbox),
 * -ENOMEM. */
int pty_create(struct lb_ptys *p, const char *sandbox_id, const struct lb_pty_create *c,
               char sid_out[LB_PTY_SID_MAX], struct lb_error *err);

/* The sandbox a session belongs to (for authorization). Quick. -ENOENT. */
int pty_sandbox_of(struct lb_ptys *p, const char *sid, char *sandbox_id, size_t len);

/* Is token (the X-Attach-Token of a request, NULL when it has none) acceptable for sid? A
 * request without a token is (it acts as admin/operate, not as a holder); one with a token
 * must carry the current holder's. Quick. 0, -ENOENT, -EBUSY (409: superseded by a
 * takeover, or never issued). */
int pty_check_token(struct lb_ptys *p, const char *sid, const char *token, struct lb_error *err);

/* What GET output answers for stream (err: stderr) from offset since. */
struct lb_pty_chunk {
    int fd; /* >= 0: serve len bytes of fd from file_off (the caller owns fd) */
    uint64_t file_off, len;
    uint64_t next; /* X-Next-Offset */
    uint64_t end;  /* bytes written to the stream so far */
    bool exited;   /* the process exited and all its output is in (exit_code valid) */
    int exit_code;
};

/* Read from since. Quick. Errors: -ENOENT (unknown session), -ESTALE (410: since is older
 * than the retained window), -EINVAL (400: since is past the end), -EIO. fd is -1 when
 * there is nothing (yet) from since. */
int pty_read(struct lb_ptys *p, const char *sid, bool err_stream, uint64_t since,
             struct lb_pty_chunk *out, struct lb_error *err);

/* The exit code once the process exited and its output is drained. Quick. 0, -ENOENT,
 * -EAGAIN (still running). */
int pty_exit_code(struct lb_ptys *p, const char *sid, int *code, struct lb_error *err);

/* How the service wakes a waiting poll (a parked HTTP request, for the routes) without knowing
 * what it is. wake ends the wait: called from any thread (the watcher's, or pty_watch's caller),
 * possibly more than once, never with the service's lock order reversed (it must not call back
 * into the service). release drops the service's reference to ctx: called once, after which
 * neither is called again. */
struct lb_pty_waker {
    void (*wake)(void *ctx);
    void (*release)(void *ctx);
    void *ctx; /* the waiter's reference, handed over to the service by pty_watch */
};

/* Wait support: register waker (copied; the service takes over its reference to ctx and
 * releases it). It is woken when the session's files change (for stream err_stream, the exit,
 * a takeover, or the session's end), or at once when the event already happened: output past
 * since (since >= 0), or the exit (since < 0: wait). An unknown session (or no memory) wakes
 * and releases it at once. Unlink it with pty_unwatch(p, ctx) once the wait ends (idempotent:
 * it releases ctx unless that happened already). Quick. */
void pty_watch(struct lb_ptys *p, const char *sid, bool err_stream, int64_t since,
               const struct lb_pty_waker *waker);
void pty_unwatch(struct lb_ptys *p, const void *ctx);

/* Write input bytes to the session's terminal (or stdin). Waits up to about 5 s for room
 * (run it on a worker). -ENOENT, -EBUSY (409: the process has exited), -EAGAIN (the terminal
 * took nothing for 5 s: 429). */
int pty_input(struct lb_ptys *p, const char *sid, const void *data, size_t len,
              struct lb_error *err);
/* Resize the terminal. Quick. -ENOENT, -EBUSY (exited), -EINVAL. */
int pty_resize(struct lb_ptys *p, const char *sid, int rows, int cols, struct lb_error *err);
/* Send signal number sig to the terminal's foreground process group (pipe mode: the command's
 * group). Quick. -ENOENT, -EBUSY (exited), -EINVAL. */
int pty_signal(struct lb_ptys *p, const char *sid, int sig, struct lb_error *err);
/* Issue a new attach token (32 hex bytes into token_out). Held and !takeover: -EBUSY (409).
 * A takeover wakes the parked polls of the session (the old holder's get 409). Quick. */
int pty_attach(struct lb_ptys *p, const char *sid, bool takeover, char token_out[LB_PTY_TOKEN_MAX],
               struct lb_error *err);
/* End the session: kill its process tree, remove its directory. Quick. -ENOENT. */
int pty_delete(struct lb_ptys *p, const char *sid, struct lb_error *err);

/* The signal number of a name ("INT", "SIGINT", "9"), or -1. */
int pty_signal_number(const char *name);

/* Sessions live right now (all sandboxes), for metrics. */
size_t pty_count(struct lb_ptys *p);

#endif
