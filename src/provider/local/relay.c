/*
 * relay.c - endpoints of sandboxes without a network link (loopback only): a TCP relay
 * the daemon runs, listening on 127.0.0.1:<ephemeral> of the host and connecting, for each
 * client, to 127.0.0.1:<port> inside the sandbox's network namespace.
 *
 * Shape: one accept thread per (sandbox, port), made on the first endpoint request (so after a
 * daemon restart the next request makes a new one, on a new port); one thread per relayed
 * connection, which creates its sandbox-side socket after setns() into the sandbox's netns
 * (the thread stays there until it ends; no other thread of the daemon ever moves) and copies
 * bytes both ways with poll(). Relayed connections are few (a developer's browser, a grader
 * fetching a page), so a thread each keeps it simple.
 *
 * Ending: the stop of a sandbox shuts down its listeners and every relayed socket, waits for
 * the threads, and frees the relay; a sandbox socket also keeps the netns alive, so this must
 * happen at every stop.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "provider/local/local_internal.h"
#include "util/log.h"

#define RELAY_BUF 65536
#define RELAY_MAX_CONNS 64

struct relay {
    struct relay *next;
    char id[129];
    int port;       /* inside the sandbox */
    int listen_fd;  /* host side, 127.0.0.1 */
    int netns_fd;   /* the sandbox's network namespace */
    uint16_t lport; /* where listen_fd listens */
    pthread_t accepter;
    int conns[RELAY_MAX_CONNS]; /* client fds of live connections (-1: free) */
    int nthreads;               /* live connection threads */
    bool closing;
};

struct relay_host {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    struct relay *list;
};

struct conn_job {
    struct relay_host *rh;
    struct relay *r;
    int client;
    int slot;
};

static struct relay_host *relay_host(struct local_provider *lp)
{
    return lp->relays;
}

/* Copy what is readable from `from` to `to`; false at EOF or error. */
static bool pump(int from, int to, char *buf)
{
    ssize_t n = read(from, buf, RELAY_BUF), off = 0;

    if (n <= 0)
        return n < 0 && (errno == EINTR || errno == EAGAIN);
    while (off < n) {
        ssize_t w = write(to, buf + off, (size_t)(n - off));

        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        off += w;
    }
    return true;
}

static void *conn_main(void *arg)
{
    struct conn_job *j = arg;
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons((uint16_t)j->r->port)};
    char *buf = malloc(RELAY_BUF);
    int s = -1;

    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (buf && setns(j->r->netns_fd, CLONE_NEWNET) == 0)
        s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s >= 0 && connect(s, (struct sockaddr *)&in, sizeof(in)) == 0) {
        bool up = true, down = true;

        while (up || down) {
            struct pollfd p[2] = {{.fd = up ? j->client : -1, .events = POLLIN},
                                  {.fd = down ? s : -1, .events = POLLIN}};

            if (poll(p, 2, -1) < 0 && errno != EINTR)
                break;
            if (up && p[0].revents && !pump(j->client, s, buf)) {
                up = false;
                shutdown(s, SHUT_WR);
            }
            if (down && p[1].revents && !pump(s, j->client, buf)) {
                down = false;
                shutdown(j->client, SHUT_WR);
            }
        }
    }
    if (s >= 0)
        close(s);
    free(buf);
    pthread_mutex_lock(&j->rh->lock);
    j->r->conns[j->slot] = -1;
    close(j->client);
    j->r->nthreads--;
    pthread_cond_broadcast(&j->rh->changed);
    pthread_mutex_unlock(&j->rh->lock);
    free(j);
    return NULL;
}

static void *accept_main(void *arg)
{
    struct relay_host *rh = ((void **)arg)[0];
    struct relay *r = ((void **)arg)[1];

    free(arg);
    for (;;) {
        int c = accept4(r->listen_fd, NULL, NULL, SOCK_CLOEXEC), slot;
        struct conn_job *j;
        pthread_attr_t attr;
        pthread_t t;

        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            break; /* shut down */
        }
        pthread_mutex_lock(&rh->lock);
        for (slot = 0; slot < RELAY_MAX_CONNS && r->conns[slot] >= 0; slot++)
            ;
        j = slot < RELAY_MAX_CONNS && !r->closing ? calloc(1, sizeof(*j)) : NULL;
        if (!j) {
            pthread_mutex_unlock(&rh->lock);
            close(c);
            continue;
        }
        *j = (struct conn_job){rh, r, c, slot};
        r->conns[slot] = c;
        r->nthreads++;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, conn_main, j) != 0) {
            r->conns[slot] = -1;
            r->nthreads--;
            close(c);
            free(j);
        }
        pthread_attr_destroy(&attr);
        pthread_mutex_unlock(&rh->lock);
    }
    return NULL;
}

int local_relay_init(struct local_provider *lp)
{
    struct relay_host *rh = calloc(1, sizeof(*rh));

    if (!rh)
        return -ENOMEM;
    pthread_mutex_init(&rh->lock, NULL);
    pthread_cond_init(&rh->changed, NULL);
    lp->relays = rh;
    return 0;
}

/* Shut r down and wait for its threads; r is unlinked already. */
static void relay_end(struct relay_host *rh, struct relay *r)
{
    pthread_mutex_lock(&rh->lock);
    r->closing = true;
    shutdown(r->listen_fd, SHUT_RDWR);
    for (int i = 0; i < RELAY_MAX_CONNS; i++) {
        if (r->conns[i] >= 0)
            shutdown(r->conns[i], SHUT_RDWR);
    }
    pthread_mutex_unlock(&rh->lock);
    pthread_join(r->accepter, NULL);
    pthread_mutex_lock(&rh->lock);
    while (r->nthreads > 0)
        pthread_cond_wait(&rh->changed, &rh->lock);
    pthread_mutex_unlock(&rh->lock);
    close(r->listen_fd);
    close(r->netns_fd);
    free(r);
}

int local_relay_endpoint(struct local_provider *lp, const char *id, const struct local_desc *d,
                         int port, char **url_out, struct lb_error *err)
{
    struct relay_host *rh = relay_host(lp);
    struct sockaddr_in in = {.sin_family = AF_INET};
    socklen_t len = sizeof(in);
    struct relay *r;
    char path[64];
    void **arg;

    pthread_mutex_lock(&rh->lock);
    for (r = rh->list; r && !(strcmp(r->id, id) == 0 && r->port == port); r = r->next)
        ;
    if (r) {
        int lport = r->lport;

        pthread_mutex_unlock(&rh->lock);
        return asprintf(url_out, "http://127.0.0.1:%d", lport) < 0
                   ? lb_error_set(err, -ENOMEM, "out of memory")
                   : 0;
    }
    pthread_mutex_unlock(&rh->lock);

    r = calloc(1, sizeof(*r));
    arg = calloc(2, sizeof(*arg));
    if (!r || !arg) {
        free(r);
        free(arg);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    snprintf(r->id, sizeof(r->id), "%s", id);
    r->port = port;
    for (int i = 0; i < RELAY_MAX_CONNS; i++)
        r->conns[i] = -1;
    snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)d->pid);
    r->netns_fd = open(path, O_RDONLY | O_CLOEXEC);
    r->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* the netns is the sandbox's only if its init is still the descriptor's process */
    if (r->netns_fd < 0 || !local_desc_alive(d) || r->listen_fd < 0 ||
        bind(r->listen_fd, (struct sockaddr *)&in, sizeof(in)) < 0 ||
        listen(r->listen_fd, 16) < 0 ||
        getsockname(r->listen_fd, (struct sockaddr *)&in, &len) < 0) {
        int e = errno;

        if (r->netns_fd >= 0)
            close(r->netns_fd);
        if (r->listen_fd >= 0)
            close(r->listen_fd);
        free(r);
        free(arg);
        return lb_error_set(err, -EREMOTEIO, "cannot start a relay for port %d: %s", port,
                            strerror(e));
    }
    r->lport = ntohs(in.sin_port);
    arg[0] = rh;
    arg[1] = r;
    if (pthread_create(&r->accepter, NULL, accept_main, arg) != 0) {
        close(r->netns_fd);
        close(r->listen_fd);
        free(r);
        free(arg);
        return lb_error_set(err, -EREMOTEIO, "cannot start a relay thread");
    }
    pthread_mutex_lock(&rh->lock);
    r->next = rh->list;
    rh->list = r;
    pthread_mutex_unlock(&rh->lock);
    log_info("sbx=%s relay 127.0.0.1:%u -> port %d inside", id, r->lport, port);
    return asprintf(url_out, "http://127.0.0.1:%u", r->lport) < 0
               ? lb_error_set(err, -ENOMEM, "out of memory")
               : 0;
}

void local_relay_close(struct local_provider *lp, const char *id)
{
    struct relay_host *rh = relay_host(lp);
    struct relay **pp, *gone = NULL, *r;

    if (!rh)
        return;
    pthread_mutex_lock(&rh->lock);
    for (pp = &rh->list; *pp;) {
        r = *pp;
        if (!id || strcmp(r->id, id) == 0) {
            *pp = r->next;
            r->next = gone;
            gone = r;
        } else {
            pp = &r->next;
        }
    }
    pthread_mutex_unlock(&rh->lock);
    while (gone) {
        r = gone;
        gone = r->next;
        relay_end(rh, r);
    }
}

void local_relay_destroy(struct local_provider *lp)
{
    struct relay_host *rh = relay_host(lp);

    if (!rh)
        return;
    local_relay_close(lp, NULL);
    pthread_cond_destroy(&rh->changed);
    pthread_mutex_destroy(&rh->lock);
    free(rh);
    lp->relays = NULL;
}
