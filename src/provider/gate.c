/*
 * gate.c - exec admission per sandbox for every provider (see gate.h): a list of the sandboxes
 * with execs in flight, each with its count of plain execs and whether an exclusive one holds it.
 */
#include "provider/gate.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct lb_gate {
    struct lb_gate *next;
    char id[LB_ID_MAX];
    int plain;      /* plain execs in flight */
    bool exclusive; /* an exclusive exec holds the sandbox */
};

/* One mutex for every gate set: a zeroed struct lb_gates needs no init, and the lists are
 * short and held for a walk only. */
static pthread_mutex_t gates_mutex = PTHREAD_MUTEX_INITIALIZER;

static struct lb_gate **gate_find(struct lb_gates *g, const char *id)
{
    struct lb_gate **pp;

    for (pp = &g->list; *pp && strcmp((*pp)->id, id) != 0; pp = &(*pp)->next)
        ;
    return pp;
}

int gates_enter(struct lb_gates *g, const char *id, bool exclusive, struct lb_error *err)
{
    struct lb_gate **pp, *e;
    int r = 0;

    if (strlen(id) >= LB_ID_MAX)
        return lb_error_set(err, -EINVAL, "invalid sandbox id");
    pthread_mutex_lock(&gates_mutex);
    if (atomic_load(&g->ended)) {
        r = lb_error_set(err, -ESHUTDOWN,
                         "the daemon is shutting down and no longer runs commands");
        goto out;
    }
    pp = gate_find(g, id);
    e = *pp;
    if (!e) {
        e = calloc(1, sizeof(*e));
        if (!e) {
            r = lb_error_set(err, -ENOMEM, "out of memory");
            goto out;
        }
        memcpy(e->id, id, strlen(id) + 1);
        e->next = g->list;
        g->list = e;
    }
    if (e->exclusive) {
        r = lb_error_set(err, -EBUSY, "an exclusive exec is running in sandbox '%s'", id);
        goto out;
    }
    if (exclusive)
        e->exclusive = true;
    else
        e->plain++;
out:
    pthread_mutex_unlock(&gates_mutex);
    return r;
}

void gates_leave(struct lb_gates *g, const char *id, bool exclusive)
{
    struct lb_gate **pp, *e;

    pthread_mutex_lock(&gates_mutex);
    pp = gate_find(g, id);
    e = *pp;
    if (e) {
        if (exclusive)
            e->exclusive = false;
        else if (e->plain > 0)
            e->plain--;
        if (e->plain == 0 && !e->exclusive) {
            *pp = e->next;
            free(e);
        }
    }
    pthread_mutex_unlock(&gates_mutex);
}

int gates_plain_running(struct lb_gates *g, const char *id)
{
    struct lb_gate *e;
    int n;

    pthread_mutex_lock(&gates_mutex);
    e = *gate_find(g, id);
    n = e ? e->plain : 0;
    pthread_mutex_unlock(&gates_mutex);
    return n;
}

int gates_end(struct lb_gates *g)
{
    int n = 0;

    pthread_mutex_lock(&gates_mutex);
    atomic_store(&g->ended, true);
    for (struct lb_gate *e = g->list; e; e = e->next)
        n += e->plain + (e->exclusive ? 1 : 0);
    pthread_mutex_unlock(&gates_mutex);
    return n;
}

bool gates_ended(struct lb_gates *g)
{
    return atomic_load(&g->ended);
}

void gates_release(struct lb_gates *g)
{
    pthread_mutex_lock(&gates_mutex);
    while (g->list) {
        struct lb_gate *e = g->list;

        g->list = e->next;
        free(e);
    }
    pthread_mutex_unlock(&gates_mutex);
}
