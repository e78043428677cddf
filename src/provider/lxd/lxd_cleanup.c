/*
 * lxd_cleanup.c - the lxd provider's exec logs deleted after the exec answered. LXD keeps each
 * exec's recorded output (stdout and stderr) on its member's disk until it is deleted or its
 * instance is; deleting both in the exec's own path cost two more round trips (~8 ms each on
 * the member the daemon talks to, ~20 ms each forwarded to another member). A thread of the
 * provider takes them off a bounded queue instead; a full queue (or none) deletes in the
 * caller, as before.
 */
#include "provider/lxd/lxd_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"
#include "util/log.h"

void lxd_delete_log(struct lb_lxd *l, const char *member, const char *log_path)
{
    struct lb_httpc_request req = {.method = "DELETE",
                                   .path = log_path,
                                   .timeout_ms = l->call_timeout_ms,
                                   .max_body_bytes = 65536};
    struct lb_httpc_response resp = {0};

    (void)lxd_do(l, member, &req, &resp, NULL);
    httpc_response_release(&resp);
}

static void *cleanup_main(void *arg)
{
    struct lb_lxd *l = arg;
    struct lxd_cleanup *c = &l->cleanup;

    pthread_mutex_lock(&c->mu);
    for (;;) {
        struct lxd_cleanup_job job;

        while (c->len == 0 && !c->stopping)
            pthread_cond_wait(&c->cv, &c->mu);
        if (c->len == 0)
            break; /* stopping, and nothing left */
        job = c->jobs[c->head];
        c->head = (c->head + 1) % LXD_CLEANUP_JOBS;
        c->len--;
        c->busy = true;
        pthread_mutex_unlock(&c->mu);
        lxd_delete_log(l, job.member[0] ? job.member : NULL, job.path);
        pthread_mutex_lock(&c->mu);
        c->busy = false;
        if (c->len == 0)
            pthread_cond_broadcast(&c->idle);
    }
    pthread_cond_broadcast(&c->idle);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int lxd_cleanup_start(struct lb_lxd *l, struct lb_error *err)
{
    struct lxd_cleanup *c = &l->cleanup;
    int r;

    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    clock_cond_init_mono(&c->idle);
    c->inited = true;
    r = pthread_create(&c->thread, NULL, cleanup_main, l);
    if (r != 0)
        return lb_error_set(err, -r, "cannot start the lxd provider's cleanup thread: %s",
                            strerror(r));
    c->running = true;
    return 0;
}

void lxd_cleanup_log(struct lb_lxd *l, const char *member, const char *log_path)
{
    struct lxd_cleanup *c = &l->cleanup;
    bool queued = false;

    if (c->running && strlen(log_path) < sizeof(c->jobs[0].path) &&
        (!member || strlen(member) < sizeof(c->jobs[0].member))) {
        pthread_mutex_lock(&c->mu);
        if (c->len < LXD_CLEANUP_JOBS && !c->stopping) {
            struct lxd_cleanup_job *job = &c->jobs[(c->head + c->len) % LXD_CLEANUP_JOBS];

            snprintf(job->member, sizeof(job->member), "%s", member ? member : "");
            snprintf(job->path, sizeof(job->path), "%s", log_path);
            c->len++;
            queued = true;
            pthread_cond_signal(&c->cv);
        }
        pthread_mutex_unlock(&c->mu);
    }
    if (!queued)
        lxd_delete_log(l, member, log_path);
}

int lxd_cleanup_settle(struct lb_lxd *l, int64_t timeout_ms)
{
    struct lxd_cleanup *c = &l->cleanup;
    struct timespec until;
    int r = 0;

    if (!c->running)
        return 0;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mu);
    while ((c->len > 0 || c->busy) && r == 0)
        if (pthread_cond_timedwait(&c->idle, &c->mu, &until) == ETIMEDOUT)
            r = -ETIMEDOUT;
    pthread_mutex_unlock(&c->mu);
    return r;
}

void lxd_cleanup_stop(struct lb_lxd *l)
{
    struct lxd_cleanup *c = &l->cleanup;

    if (!c->inited)
        return;
    if (c->running) {
        /* what is queued gets one call timeout; what is left goes with its instance */
        bool late = lxd_cleanup_settle(l, l->call_timeout_ms) < 0;

        pthread_mutex_lock(&c->mu);
        if (late)
            log_warn("lxd provider: %zu exec logs left undeleted at the end (they go with their "
                     "instances)",
                     c->len);
        c->stopping = true;
        c->len = 0;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
        c->running = false;
    }
    pthread_cond_destroy(&c->cv);
    pthread_cond_destroy(&c->idle);
    pthread_mutex_destroy(&c->mu);
    c->inited = false;
}

int provider_lxd_settle(struct lb_provider *p, int64_t timeout_ms)
{
    if (!p || strcmp(p->ops->name, "lxd") != 0)
        return -EINVAL;
    return lxd_cleanup_settle((struct lb_lxd *)p, timeout_ms);
}
