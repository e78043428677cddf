/*
 * engine.c - the engine base's drivers for status, pause/resume, list and the end of execs
 * (see engine.h): the rules written once, the requests in the backend's hooks.
 */
#include "provider/engine/engine.h"

#include <errno.h>

static int pause_or_resume(struct lb_provider *p, const struct lb_sandbox_ref *ref, bool pause,
                           struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;
    enum lb_sandbox_status st;
    struct lb_error ferr = {0};
    int r;

    r = e->hooks->set_frozen(e, ref, pause, &ferr);
    if (r == -ENOENT)
        return lb_error_set(err, -ENOENT, "no such sandbox");
    if (r < 0 && r != -ETIMEDOUT && e->hooks->state(e, ref, &st, NULL) == 0 &&
        st == (pause ? LB_STATUS_PAUSED : LB_STATUS_RUNNING))
        return 0; /* already so: idempotent */
    if (r < 0)
        return lb_error_keep(err, r == -ETIMEDOUT ? r : -EREMOTEIO, "%s", ferr.message);
    return 0;
}

int engine_status(struct lb_provider *p, const struct lb_sandbox_ref *ref,
                  enum lb_sandbox_status *out, struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;

    return e->hooks->state(e, ref, out, err);
}

int engine_pause(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_error *err)
{
    return pause_or_resume(p, ref, true, err);
}

int engine_resume(struct lb_provider *p, const struct lb_sandbox_ref *ref, struct lb_error *err)
{
    return pause_or_resume(p, ref, false, err);
}

int engine_list(struct lb_provider *p, json_t **out, struct lb_error *err)
{
    struct lb_engine *e = (struct lb_engine *)p;
    json_t *items = NULL, *arr = NULL, *item;
    size_t i;
    int r;

    r = e->hooks->list_raw(e, &items, err);
    if (r < 0)
        goto out;
    arr = json_array();
    if (!arr) {
        r = lb_error_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    json_array_foreach(items, i, item) {
        const char *id = NULL;
        json_t *desc = e->hooks->list_entry(e, item, &id);

        if (desc)
            json_array_append_new(arr,
                                  json_pack("{s:s,s:o}", "sandbox_id", id, "descriptor", desc));
    }
    *out = arr;
    arr = NULL;
out:
    json_decref(arr);
    json_decref(items);
    return r;
}

int engine_end_execs(struct lb_provider *p)
{
    return gates_end(&((struct lb_engine *)p)->gates);
}

void engine_release(struct lb_engine *e)
{
    gates_release(&e->gates);
}
