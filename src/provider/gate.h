/*
 * gate.h - exec admission per sandbox, the same for every provider: an exclusive exec (a
 * grader's, which first stops every other process of the sandbox) runs alone, and after
 * gates_end no exec is admitted (the daemon is shutting down).
 *
 * Rules: a plain exec is refused (-EBUSY) while an exclusive exec holds the sandbox; an
 * exclusive exec is refused while another exclusive one holds it; a running plain exec never
 * keeps an exclusive one out (the exclusive exec kills its processes).
 *
 * Thread-safety: every function may be called from any thread at once on one struct lb_gates,
 * except gates_release (only when no exec runs, nothing else calls in). All gate sets share
 * one process-wide mutex, held only for a walk of one short list, so a zeroed struct lb_gates
 * (calloc, = {0}) is a valid empty set: there is no init function.
 */
#ifndef LB_PROVIDER_GATE_H
#define LB_PROVIDER_GATE_H

#include <stdatomic.h>
#include <stdbool.h>

#include "util/error.h"

/* A sandbox id is shorter than this (as the store's records hold it, store.h). */
#ifndef LB_ID_MAX
#define LB_ID_MAX 64
#endif

struct lb_gate; /* one sandbox with execs in flight (gate.c) */

struct lb_gates {
    struct lb_gate *list; /* sandboxes with execs in flight (few entries) */
    atomic_bool ended;    /* gates_end ran; also an httpc abort flag for running execs */
};

/* Admit an exec of sandbox id. Returns 0 (pair it with gates_leave), -EBUSY while an exclusive
 * exec holds the sandbox ("an exclusive exec is running in sandbox '<id>'"), -ESHUTDOWN after
 * gates_end (the caller answers an LB_EXEC_SANDBOX result "shutting down"), -EINVAL for an id
 * of LB_ID_MAX bytes or more, or -ENOMEM; err says why. */
int gates_enter(struct lb_gates *g, const char *id, bool exclusive, struct lb_error *err);

/* The end of an exec gates_enter admitted with the same id and exclusive. */
void gates_leave(struct lb_gates *g, const char *id, bool exclusive);

/* How many plain (not exclusive) execs of sandbox id are in flight. */
int gates_plain_running(struct lb_gates *g, const char *id);

/* Refuse every later gates_enter (-ESHUTDOWN) and set g->ended. Returns how many execs are in
 * flight now (they are admitted and have not left). Idempotent. */
int gates_end(struct lb_gates *g);

/* Has gates_end run? */
bool gates_ended(struct lb_gates *g);

/* Free what g holds (at the provider's destroy, when no exec runs). g is empty afterwards. */
void gates_release(struct lb_gates *g);

#endif
