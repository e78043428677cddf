/*
 * context.h - code contexts (API.md "Toolbox"): a Python interpreter in a sandbox that keeps its
 * state between runs, held the way PTY sessions are held (lend/pty.h), so that it outlives the
 * request that made it and the daemon itself.
 *
 * A context is a PTY session in pipe mode whose id starts with LB_CONTEXT_PREFIX ("ctx-") and
 * whose command is `python3 -u -c DRIVER`: DRIVER is lendbox's driver (context_driver.py, built
 * into lendboxd and passed as that argument: nothing on a file system the agent could change,
 * and each context gets its own copy). The driver reads one JSON request a line on its stdin
 * (written through the session's input FIFO) and answers one JSON line on its stdout (read from
 * the session's output segments, matched by a random request id); a run's own output is
 * captured apart. An interrupt is SIGINT to the interpreter (the session's signal control).
 * Contexts count toward limits.max_pty_sessions, end with their sandbox (release, reset, any
 * stop) like every PTY session, and are found again after a daemon restart.
 *
 * Bounds: stdout, stderr and result each at most CONTEXT_TEXT_MAX characters (longer text is cut
 * and ends with a note saying how much was left out); an error's value 4096 characters and its
 * traceback 16384.
 *
 * Thread-safety: every function may be called from any thread. context_create and context_run
 * block (a worker's job); context_interrupt and context_delete are quick.
 */
#ifndef LB_CONTEXT_H
#define LB_CONTEXT_H

#include <jansson.h>
#include <stdint.h>

#include "lend/pty.h"
#include "util/error.h"

#define CONTEXT_TEXT_MAX 32768

/* Start a context in sandbox_id for language ("python", the only one) and wait until its
 * interpreter answers (at most 30 s). cid_out receives the context id. Blocks. Errors: -ENOENT
 * (no such running sandbox), -LB_E_LOST, -ENOSYS (the provider has no PTY sessions: 501),
 * -EINVAL (another language), -EAGAIN (limits.max_pty_sessions), -EOPNOTSUPP (422: python3
 * did not start in the sandbox; its stderr in the message), -EREMOTEIO, -ENOMEM. fence_held:
 * as lb_pty_create.fence_held (NULL for the admin's requests). */
int context_create(struct lb_ptys *p, const char *sandbox_id, const char *language,
                   bool *fence_held, char cid_out[LB_PTY_SID_MAX], struct lb_error *err);

/* Run code (UTF-8, no NUL) in context cid. At timeout_ms the run is interrupted (SIGINT: the
 * answer's error is a KeyboardInterrupt) and the context lives on; if the interpreter does not
 * answer within 5 s more, -ETIMEDOUT. *out (the caller's) is {"stdout", "stderr", "result",
 * "error", "duration_ms"}. Blocks. Errors: -ENOENT (unknown context, or deleted meanwhile),
 * -LB_E_LOST, -EBUSY (409: another run of the context is under way, or its interpreter has
 * exited), -ETIMEDOUT (502), -ESHUTDOWN (503: the daemon began to drain while the run waited;
 * the code goes on in the interpreter), -EREMOTEIO (an answer that is not the driver's),
 * -ENOMEM. */
int context_run(struct lb_ptys *p, const char *cid, const char *code, int64_t timeout_ms,
                json_t **out, struct lb_error *err);

/* Interrupt the run under way (SIGINT to the interpreter; between runs it is ignored). Quick.
 * -ENOENT, -EBUSY (the interpreter has exited). */
int context_interrupt(struct lb_ptys *p, const char *cid, struct lb_error *err);

/* End the context: its interpreter is killed and its session removed. Quick. -ENOENT. */
int context_delete(struct lb_ptys *p, const char *cid, struct lb_error *err);

/* Is id a context id (LB_CONTEXT_PREFIX and hex)? */
bool context_id_is_valid(const char *id);

#endif
