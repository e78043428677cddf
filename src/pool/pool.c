/* pool.c - see pool.h. A ring buffer of jobs under one mutex and a condition variable; keyed
 * jobs wait in a FIFO per key (not in the ring) while an earlier job of their key runs. */
#include "pool/pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>

/* A worker's stack. Under ThreadSanitizer (its interceptors and instrumented frames take more
 * of each stack) the libnftables parser, which a worker runs when it sets up a sandbox's
 * network, overflowed 256 KiB. */
#if defined(__SANITIZE_THREAD__)
#define POOL_STACK_BYTES (1024 * 1024)
#else
#define POOL_STACK_BYTES (256 * 1024)
#endif

struct key_job {
    lb_job_fn fn;
    void *arg;
    struct key_job *next;
};

/* A key with jobs queued in the ring or running (active, at most active_max), and the ones
 * waiting behind them. */
struct key_queue {
    char *key;
    struct key_job *head, *tail;
    size_t n_waiting;
    size_t active, active_max;
    UT_hash_handle hh;
};

struct pool_job {
    lb_job_fn fn;
    void *arg;
    struct key_queue *key; /* NULL: not keyed */
};

struct lb_pool {
    pthread_mutex_t lock;
    pthread_cond_t has_job;
    struct pool_job *ring;
    size_t cap, head, count, running;
    size_t keyed_waiting; /* jobs in the key queues: count + keyed_waiting <= cap */
    struct key_queue *keys;
    bool stopping, stopped;
    pthread_t *threads;
    size_t n_threads;
};

/* Put a job into the ring; the caller holds the lock and made sure there is room. */
static void ring_push(struct lb_pool *p, lb_job_fn fn, void *arg, struct key_queue *k)
{
    p->ring[(p->head + p->count) % p->cap] = (struct pool_job){fn, arg, k};
    p->count++;
    pthread_cond_signal(&p->has_job);
}

/* A job of key k ended: start the next one of k, or forget k. Lock held. */
static void key_job_done(struct lb_pool *p, struct key_queue *k)
{
    struct key_job *next = k->head;

    k->active--;
    if (!next) {
        if (k->active > 0)
            return;
        HASH_DEL(p->keys, k);
        free(k->key);
        free(k);
        return;
    }
    k->head = next->next;
    if (!k->head)
        k->tail = NULL;
    k->n_waiting--;
    p->keyed_waiting--;
    k->active++;
    ring_push(p, next->fn, next->arg, k);
    free(next);
}

static void *pool_worker(void *arg)
{
    struct lb_pool *p = arg;

    pthread_mutex_lock(&p->lock);
    for (;;) {
        struct pool_job job;

        while (p->count == 0 && !p->stopping)
            pthread_cond_wait(&p->has_job, &p->lock);
        if (p->count == 0 && p->stopping)
            break;
        job = p->ring[p->head];
        p->head = (p->head + 1) % p->cap;
        p->count--;
        p->running++;
        pthread_mutex_unlock(&p->lock);
        job.fn(job.arg);
        pthread_mutex_lock(&p->lock);
        p->running--;
        if (job.key)
            key_job_done(p, job.key);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

int pool_new(size_t n_workers, size_t queue_max, struct lb_pool **out)
{
    struct lb_pool *p;
    int r = 0;

    if (n_workers == 0 || queue_max == 0)
        return -EINVAL;
    p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->has_job, NULL);
    p->cap = queue_max;
    p->ring = calloc(queue_max, sizeof(*p->ring));
    p->threads = calloc(n_workers, sizeof(*p->threads));
    if (!p->ring || !p->threads) {
        r = -ENOMEM;
        goto fail;
    }
    for (; p->n_threads < n_workers; p->n_threads++) {
        pthread_attr_t attr;

        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, POOL_STACK_BYTES);
        r = -pthread_create(&p->threads[p->n_threads], &attr, pool_worker, p);
        pthread_attr_destroy(&attr);
        if (r < 0)
            goto fail;
    }
    *out = p;
    return 0;
fail:
    pool_destroy(p);
    return r;
}

int pool_submit(struct lb_pool *p, lb_job_fn fn, void *arg)
{
    int r = 0;

    pthread_mutex_lock(&p->lock);
    if (p->stopping)
        r = -ESHUTDOWN;
    else if (p->count + p->keyed_waiting >= p->cap)
        r = -EAGAIN;
    else
        ring_push(p, fn, arg, NULL);
    pthread_mutex_unlock(&p->lock);
    return r;
}

int pool_submit_keyed(struct lb_pool *p, const char *key, size_t key_max, lb_job_fn fn, void *arg)
{
    return pool_submit_shared(p, key, 1, key_max ? key_max : SIZE_MAX, fn, arg);
}

int pool_submit_shared(struct lb_pool *p, const char *key, size_t active_max, size_t waiting_max,
                       lb_job_fn fn, void *arg)
{
    struct key_queue *k;
    struct key_job *j = NULL;
    int r = 0;

    if (!key)
        return pool_submit(p, fn, arg);
    if (active_max == 0)
        return -EINVAL;
    pthread_mutex_lock(&p->lock);
    HASH_FIND_STR(p->keys, key, k);
    if (p->stopping) {
        r = -ESHUTDOWN;
    } else if (p->count + p->keyed_waiting >= p->cap) {
        r = -EAGAIN;
    } else if (k && k->active >= k->active_max && k->n_waiting >= waiting_max) {
        r = -EBUSY;
    } else if (!k) {
        k = calloc(1, sizeof(*k));
        if (!k || !(k->key = strdup(key))) {
            free(k);
            r = -ENOMEM;
        } else {
            k->active = 1;
            k->active_max = active_max;
            HASH_ADD_KEYPTR(hh, p->keys, k->key, strlen(k->key), k);
            ring_push(p, fn, arg, k);
        }
    } else if (k->active < k->active_max) {
        k->active++;
        ring_push(p, fn, arg, k);
    } else if (!(j = calloc(1, sizeof(*j)))) {
        r = -ENOMEM;
    } else {
        /* active_max jobs of this key are queued or running: wait behind them, off the ring */
        j->fn = fn;
        j->arg = arg;
        if (k->tail)
            k->tail->next = j;
        else
            k->head = j;
        k->tail = j;
        k->n_waiting++;
        p->keyed_waiting++;
    }
    pthread_mutex_unlock(&p->lock);
    return r;
}

size_t pool_queued(struct lb_pool *p)
{
    size_t n;

    pthread_mutex_lock(&p->lock);
    n = p->count + p->keyed_waiting;
    pthread_mutex_unlock(&p->lock);
    return n;
}

size_t pool_running(struct lb_pool *p)
{
    size_t n;

    pthread_mutex_lock(&p->lock);
    n = p->running;
    pthread_mutex_unlock(&p->lock);
    return n;
}

void pool_stop(struct lb_pool *p)
{
    pthread_mutex_lock(&p->lock);
    if (p->stopped) {
        pthread_mutex_unlock(&p->lock);
        return;
    }
    p->stopping = true;
    p->stopped = true;
    pthread_cond_broadcast(&p->has_job);
    pthread_mutex_unlock(&p->lock);
    for (size_t i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
}

void pool_destroy(struct lb_pool *p)
{
    if (!p)
        return;
    pool_stop(p);
    pthread_cond_destroy(&p->has_job);
    pthread_mutex_destroy(&p->lock);
    free(p->ring);
    free(p->threads);
    free(p);
}
