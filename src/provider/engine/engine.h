/*
 * engine.h - the engine base: what the providers that drive a container engine over its API
 * (docker/, lxd/) share, written once. A backend embeds struct lb_engine first in its own
 * struct, points its ops table at the engine_* drivers below and fills struct engine_hooks
 * with what differs between engines (the requests themselves). The drivers hold the rules:
 * "no such sandbox" on a missing instance, pause/resume that are idempotent, the label check
 * of a listing, exec admission and its end at shutdown.
 *
 * Dependency rule: engine/ calls only its hooks, provider.h, gate.h, exec_result.h and util/;
 * it never names a backend.
 *
 * Thread-safety: the drivers are as thread-safe as the provider interface asks (provider.h):
 * any thread, at once, as long as the hooks are.
 */
#ifndef LB_PROVIDER_ENGINE_H
#define LB_PROVIDER_ENGINE_H

#include <jansson.h>
#include <stdbool.h>

#include "provider/gate.h"
#include "provider/provider.h"

struct lb_engine;

struct engine_hooks {
    /* The instance's state: LB_STATUS_STOPPED when the engine has no such instance. 0, or a
     * negative errno (-EREMOTEIO, -ETIMEDOUT) with err set when err is not NULL. */
    int (*state)(struct lb_engine *e, const struct lb_sandbox_ref *ref, enum lb_sandbox_status *out,
                 struct lb_error *err);
    /* Ask the engine to pause (frozen) or resume the instance. 0 when it did; -ENOENT when it
     * has no such instance; -ETIMEDOUT; any other negative errno when it refused or could
     * not be asked (the driver then checks whether the instance is already so). err says
     * why. */
    int (*set_frozen)(struct lb_engine *e, const struct lb_sandbox_ref *ref, bool frozen,
                      struct lb_error *err);
    /* Every instance the engine lists under this daemon's instance label (the engine's own
     * filter), as a JSON array the caller owns. 0 or a negative errno with err set. */
    int (*list_raw)(struct lb_engine *e, json_t **items_out, struct lb_error *err);
    /* One item of list_raw: when it is a sandbox of this daemon (the labels checked again,
     * not trusting the engine's filter), its id into *id_out (borrowed from item) and a new
     * descriptor (the caller owns it); NULL when it is not ours (or out of memory). */
    json_t *(*list_entry)(struct lb_engine *e, json_t *item, const char **id_out);
};

/* Embedded first in a backend's provider struct (struct lb_docker, struct lb_lxd). */
struct lb_engine {
    struct lb_provider base;
    const struct engine_hooks *hooks;
    struct lb_gates gates; /* exec admission; gates.ended: end_execs was called */
};

/* The provider's status op: hooks->state. */
int engine_status(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                  enum lb_sandbox_status *out, struct lb_error *err);
/* The pause and resume ops: hooks->set_frozen; -ENOENT "no such sandbox" when the instance
 * is gone; 0 when the engine refused but the instance is already so; else -ETIMEDOUT or
 * -EREMOTEIO with the engine's reason. */
int engine_pause(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_error *err);
int engine_resume(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_error *err);
/* The list op: [{"sandbox_id", "descriptor"}] of the items hooks->list_entry takes as ours. */
int engine_list(struct lb_provider *p, json_t **out, struct lb_error *err);
/* The end_execs op: no exec is admitted from now on; returns how many are in flight. */
int engine_end_execs(struct lb_provider *p);
/* Free what the engine base holds (the backend's destroy calls it; no exec runs). */
void engine_release(struct lb_engine *e);

#endif
