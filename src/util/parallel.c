/* parallel.c - a bounded parallel loop (see parallel.h). */
#include "util/parallel.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct parallel_loop {
    size_t n;
    atomic_size_t next; /* the next index not yet taken */
    void (*fn)(void *arg, size_t i);
    void *arg;
};

static void *parallel_worker(void *arg)
{
    struct parallel_loop *p = arg;
    size_t i;

    while ((i = atomic_fetch_add(&p->next, 1)) < p->n)
        p->fn(p->arg, i);
    return NULL;
}

void parallel_run(size_t n, size_t width, void (*fn)(void *arg, size_t i), void *arg)
{
    struct parallel_loop p = {.n = n, .fn = fn, .arg = arg};
    pthread_t *th = NULL;
    size_t helpers = 0, want;

    atomic_init(&p.next, 0);
    if (width == 0)
        width = 1;
    want = (width < n ? width : n);
    if (want > 1)
        th = calloc(want - 1, sizeof(*th));
    for (size_t k = 0; th && k + 1 < want; k++) {
        if (pthread_create(&th[helpers], NULL, parallel_worker, &p) != 0)
            break; /* fewer helpers: this thread and those started do the rest */
        helpers++;
    }
    parallel_worker(&p);
    for (size_t k = 0; k < helpers; k++)
        pthread_join(th[k], NULL);
    free(th);
}
