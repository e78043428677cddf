/*
 * conn.c - connections still sending their request line and headers: the header deadline, the
 * per-address cap on them, and the watch thread that cuts them and logs the summaries.
 */
#include "http/http_internal.h"

#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"

#define HTTP_WARN_INTERVAL_MS 10000 /* at most one summary of connection warnings per this */

/* ---------- header deadline ---------- */

/* Header deadline: libmicrohttpd's connection timeout is an idle timer, so a client sending one
 * header line every few seconds would keep a connection forever, and enough of them from one
 * address fill its per-address limit. Each connection is therefore tracked from accept
 * (NOTIFY_CONNECTION) until its request line and headers are all in (the access handler's
 * first call), and again from the end of each request until the next one's headers are in:
 * while "waiting" it is on a list in deadline order and on its address's list. The watch
 * thread shuts down (shutdown(2): libmicrohttpd then sees the end and closes it) every
 * connection past header_timeout_s; an address holding per_ip_incomplete waiting connections
 * has its oldest one shut down when another arrives, so a trickling client cannot keep others
 * from the same address out for long. A connection's fd is only touched under conn_lock while
 * it is tracked, and libmicrohttpd reports the close (NOTIFY_CLOSED, which takes conn_lock)
 * before it closes the fd, so the fd shut down is never one reused by another connection. */

static size_t ip_bucket(const unsigned char *addr, unsigned char len)
{
    uint32_t x = 2166136261u; /* FNV-1a */

    for (unsigned char i = 0; i < len; i++)
        x = (x ^ addr[i]) * 16777619u;
    return x % HTTP_IP_BUCKETS;
}

static void conn_set_addr(struct http_conn *c, const struct sockaddr *sa)
{
    static const unsigned char v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

    c->addr_len = 0;
    if (sa && sa->sa_family == AF_INET) {
        memcpy(c->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        c->addr_len = 4;
    } else if (sa && sa->sa_family == AF_INET6) {
        const unsigned char *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;

        if (memcmp(a, v4mapped, 12) == 0) {
            memcpy(c->addr, a + 12, 4);
            c->addr_len = 4;
        } else {
            memcpy(c->addr, a, 16);
            c->addr_len = 16;
        }
    }
}

/* Append c to l through its link which. */
static void conn_list_append(struct conn_list *l, struct http_conn *c, enum conn_link which)
{
    c->link[which].prev = l->tail;
    c->link[which].next = NULL;
    if (l->tail)
        l->tail->link[which].next = c;
    else
        l->head = c;
    l->tail = c;
}

/* Take c out of l (which it is on through its link which). */
static void conn_list_remove(struct conn_list *l, struct http_conn *c, enum conn_link which)
{
    struct http_conn *prev = c->link[which].prev, *next = c->link[which].next;

    if (prev)
        prev->link[which].next = next;
    else
        l->head = next;
    if (next)
        next->link[which].prev = prev;
    else
        l->tail = prev;
    c->link[which].prev = c->link[which].next = NULL;
}

void http_conn_wait_end_locked(struct http_conn *c)
{
    struct lb_http *h = c->h;
    struct http_ip *ip = c->ip;

    if (!c->waiting)
        return;
    c->waiting = false;
    conn_list_remove(&h->waiting, c, CONN_LINK_SERVER);
    if (!ip)
        return;
    conn_list_remove(&ip->conns, c, CONN_LINK_IP);
    c->ip = NULL;
    if (--ip->waiting == 0) {
        struct http_ip **pp = &h->ips[ip_bucket(ip->addr, ip->len)];

        while (*pp != ip)
            pp = &(*pp)->next;
        *pp = ip->next;
        free(ip);
    }
}

/* Close c from our side: libmicrohttpd sees the end of the connection and closes it. */
static void conn_cut_locked(struct http_conn *c)
{
    http_conn_wait_end_locked(c);
    shutdown(c->fd, SHUT_RDWR);
}

static struct http_ip *ip_find_locked(struct lb_http *h, const unsigned char *addr,
                                      unsigned char len)
{
    struct http_ip *ip = h->ips[ip_bucket(addr, len)];

    while (ip && !(ip->len == len && memcmp(ip->addr, addr, len) == 0))
        ip = ip->next;
    return ip;
}

/* c starts waiting for a request line and headers, due header_timeout_s from now. */
void http_conn_wait_begin_locked(struct http_conn *c)
{
    struct lb_http *h = c->h;
    struct http_ip *ip;

    if (c->waiting)
        return;
    c->waiting = true;
    c->target_len = 0;
    c->deadline_ms = clock_mono_ms() + (int64_t)h->cfg.header_timeout_s * 1000;
    conn_list_append(&h->waiting, c, CONN_LINK_SERVER);
    if (h->waiting.head == c)
        pthread_cond_signal(&h->conn_cond); /* the watch thread slept with nothing to watch */
    if (c->addr_len == 0 || h->cfg.per_ip_incomplete == 0)
        return;
    /* at the address's cap its oldest waiting connection makes room (cutting the last one
     * frees the entry: look it up again) */
    ip = ip_find_locked(h, c->addr, c->addr_len);
    while (ip && ip->waiting >= h->cfg.per_ip_incomplete) {
        conn_cut_locked(ip->conns.head);
        h->cut_cap++;
        metrics_add(LB_M_HTTP_CUT_CAP, 1);
        ip = ip_find_locked(h, c->addr, c->addr_len);
    }
    if (!ip) {
        size_t b = ip_bucket(c->addr, c->addr_len);

        ip = calloc(1, sizeof(*ip));
        if (!ip)
            return; /* not counted per address; the deadline still holds */
        memcpy(ip->addr, c->addr, c->addr_len);
        ip->len = c->addr_len;
        ip->next = h->ips[b];
        h->ips[b] = ip;
    }
    c->ip = ip;
    conn_list_append(&ip->conns, c, CONN_LINK_IP);
    if (++ip->waiting > h->waiting_max) {
        h->waiting_max = ip->waiting;
        metrics_set(LB_M_HTTP_WAITING_MAX, h->waiting_max);
    }
}

/* NOTIFY_CONNECTION: a connection was accepted (STARTED) or is about to be closed (CLOSED). */
void http_notify_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                            enum MHD_ConnectionNotificationCode toe)
{
    struct lb_http *h = cls;
    struct http_conn *c = *socket_context;

    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fd =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *addr =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);

        c = fd ? calloc(1, sizeof(*c)) : NULL;
        *socket_context = c;
        if (!c)
            return; /* untracked: only libmicrohttpd's idle timeout bounds it */
        c->h = h;
        c->fd = fd->connect_fd;
        conn_set_addr(c, addr ? addr->client_addr : NULL);
        pthread_mutex_lock(&h->conn_lock);
        http_conn_wait_begin_locked(c);
        pthread_mutex_unlock(&h->conn_lock);
        return;
    }
    if (!c)
        return;
    pthread_mutex_lock(&h->conn_lock);
    http_conn_wait_end_locked(c);
    pthread_mutex_unlock(&h->conn_lock);
    free(c);
    *socket_context = NULL;
}

struct http_conn *http_conn_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

    return ci ? ci->socket_context : NULL;
}

/* The URI log callback: the request line is in. Keeps the request target's length (as sent,
 * query included) for the access handler's check. Returns the request's initial context:
 * none. */
void *http_uri_log(void *cls, const char *uri, struct MHD_Connection *conn)
{
    struct http_conn *c = http_conn_of(conn);

    (void)cls;
    if (c)
        c->target_len = strlen(uri);
    return NULL;
}

/* Log a summary of what was counted since the last one, at most once per interval. Called on
 * the watch thread with conn_lock held; unlocks it while logging. */
static void conn_warn_summary_locked(struct lb_http *h, int64_t now)
{
    uint64_t deadline = h->cut_deadline, cap = h->cut_cap, suppressed = h->mhd_suppressed;
    char last[sizeof(h->mhd_last)];

    if (now - h->warn_since < HTTP_WARN_INTERVAL_MS)
        return;
    h->warn_since = now;
    h->cut_deadline = h->cut_cap = h->mhd_suppressed = h->mhd_logged = 0;
    if (!deadline && !cap && !suppressed)
        return;
    memcpy(last, h->mhd_last, sizeof(last));
    pthread_mutex_unlock(&h->conn_lock);
    if (deadline || cap)
        log_warn("connections closed before their request headers were in, in the last %d s: "
                 "%llu past the header deadline (server.header_timeout_s = %u s), %llu past %u "
                 "incomplete requests from one address (server.per_ip_incomplete)",
                 HTTP_WARN_INTERVAL_MS / 1000, (unsigned long long)deadline,
                 h->cfg.header_timeout_s, (unsigned long long)cap, h->cfg.per_ip_incomplete);
    if (suppressed)
        log_warn("libmicrohttpd: %llu more warnings in the last %d s, not logged one by one "
                 "(the last: %s)",
                 (unsigned long long)suppressed, HTTP_WARN_INTERVAL_MS / 1000, last);
    pthread_mutex_lock(&h->conn_lock);
}

/* The watch thread: cuts connections past their header deadline, logs the summaries. */
void *http_conn_main(void *arg)
{
    struct lb_http *h = arg;

    pthread_mutex_lock(&h->conn_lock);
    while (!h->conn_thread_stop) {
        int64_t now = clock_mono_ms(), wake = now + HTTP_WARN_INTERVAL_MS;
        struct timespec ts;

        while (h->waiting.head && h->waiting.head->deadline_ms <= now) {
            conn_cut_locked(h->waiting.head);
            h->cut_deadline++;
            metrics_add(LB_M_HTTP_CUT_DEADLINE, 1);
        }
        conn_warn_summary_locked(h, now);
        if (h->waiting.head && h->waiting.head->deadline_ms < wake)
            wake = h->waiting.head->deadline_ms;
        if (h->warn_since + HTTP_WARN_INTERVAL_MS < wake)
            wake = h->warn_since + HTTP_WARN_INTERVAL_MS;
        if (wake <= now)
            wake = now + 1;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        {
            int64_t ns = (int64_t)ts.tv_nsec + (wake - now) * 1000000;

            ts.tv_sec += (time_t)(ns / 1000000000);
            ts.tv_nsec = (long)(ns % 1000000000);
        }
        pthread_cond_timedwait(&h->conn_cond, &h->conn_lock, &ts);
    }
    pthread_mutex_unlock(&h->conn_lock);
    return NULL;
}
