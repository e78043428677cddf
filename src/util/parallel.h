/*
 * parallel.h - a bounded parallel loop: the items of a batch (a fork's children, a batch of
 * seeds) run on the calling thread and at most width - 1 helper threads, each taking the next
 * index not yet taken, so a slow item holds one thread and the others go on.
 */
#ifndef LB_PARALLEL_H
#define LB_PARALLEL_H

#include <stddef.h>

/* Call fn(arg, i) once for every i in [0, n), at most width (>= 1; 0 counts as 1) at once: the
 * caller's thread and up to min(width, n) - 1 threads started here and joined before it
 * returns. A helper thread that cannot be created is left out (the others do its share), so
 * every index runs even without any. fn runs concurrently with itself: what it touches for one
 * index must be that index's own (or locked). Blocks until every call has returned. */
void parallel_run(size_t n, size_t width, void (*fn)(void *arg, size_t i), void *arg);

#endif
