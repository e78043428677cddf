/*
 * net_policy.c - deciding a sandbox's network from its request before anything is made: the
 * mode, the model and tool servers (parsed with libcurl's URL parser, resolved, refused when
 * the sandbox must never reach them), what the nftables elements will allow, a slot of the
 * range, and the /etc/hosts text the sandbox gets.
 */
#include "provider/local/net_internal.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "provider/local/local_internal.h"
#include "util/fault.h"
#include "util/metrics.h"

static bool is_loopback(uint32_t a)
{
    return (a >> 24) == 127;
}

/* ---- prepare -------------------------------------------------------------------------- */

static bool forwarding_on(void)
{
    char c = '0';
    int fd = open("/proc/sys/net/ipv4/ip_forward", O_RDONLY | O_CLOEXEC);

    if (fd >= 0) {
        if (read(fd, &c, 1) != 1)
            c = '0';
        close(fd);
    }
    return c == '1';
}

/* Is IPv4 forwarding on for the interface the host reaches a through (the one a's replies come
 * in on, which the kernel asks before forwarding them into the sandbox's link)? The interface
 * is the one holding the source address the kernel picks for a (a connected UDP socket sends
 * nothing). The global net.ipv4.ip_forward = 1 sets every interface's switch too. On false,
 * ifname holds the interface's name when known ("" else). */
static bool uplink_forwarding_on(uint32_t a, char ifname[IFNAMSIZ])
{
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(9)}, src = {0};
    socklen_t len = sizeof(src);
    struct ifaddrs *all = NULL, *i;
    char path[96], c = '0';
    int s, fd;

    ifname[0] = '\0';
    dst.sin_addr.s_addr = htonl(a);
    s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return false;
    if (connect(s, (struct sockaddr *)&dst, sizeof(dst)) < 0 ||
        getsockname(s, (struct sockaddr *)&src, &len) < 0) {
        close(s);
        return false;
    }
    close(s);
    if (getifaddrs(&all) < 0)
        return false;
    for (i = all; i; i = i->ifa_next) {
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            ((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr.s_addr == src.sin_addr.s_addr) {
            snprintf(ifname, IFNAMSIZ, "%s", i->ifa_name);
            break;
        }
    }
    freeifaddrs(all);
    if (!ifname[0])
        return false;
    snprintf(path, sizeof(path), "/proc/sys/net/ipv4/conf/%s/forwarding", ifname);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &c, 1) != 1)
            c = '0';
        close(fd);
    }
    return c == '1';
}

/* Is a assigned to one of this host's interfaces? */
static bool addr_is_local(uint32_t a)
{
    struct ifaddrs *all = NULL, *i;
    bool found = false;

    if (getifaddrs(&all) < 0)
        return false;
    for (i = all; i && !found; i = i->ifa_next) {
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            ntohl(((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr.s_addr) == a)
            found = true;
    }
    freeifaddrs(all);
    return found;
}

/* Does a reach more than one host: limited broadcast, "this network" (0.0.0.0/8), multicast
 * (224.0.0.0/4), the reserved 240.0.0.0/4, or the broadcast address of a subnet of one of this
 * host's interfaces? */
static bool addr_is_group(uint32_t a)
{
    struct ifaddrs *all = NULL, *i;
    bool found = (a >> 24) == 0 || (a >> 28) == 0xe || (a >> 28) == 0xf;

    if (found || getifaddrs(&all) < 0)
        return found;
    for (i = all; i && !found; i = i->ifa_next) {
        const struct sockaddr *b = i->ifa_broadaddr;

        if ((i->ifa_flags & IFF_BROADCAST) && i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            b && b->sa_family == AF_INET &&
            ntohl(((const struct sockaddr_in *)(const void *)b)->sin_addr.s_addr) == a)
            found = true;
    }
    freeifaddrs(all);
    return found;
}

/* Split a server (URL, or host[:port]) into host and port (0: none given, no scheme). */
static int server_parse(const char *server, char **host, int *port, struct lb_error *err)
{
    CURLU *u = curl_url();
    char *with_scheme = NULL, *h = NULL, *p = NULL;
    bool has_scheme = strstr(server, "://") != NULL;
    int r = 0;

    *host = NULL;
    *port = 0;
    if (!u)
        return lb_error_set(err, -ENOMEM, "out of memory");
    if (!has_scheme && asprintf(&with_scheme, "http://%s", server) < 0) {
        curl_url_cleanup(u);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    if (curl_url_set(u, CURLUPART_URL, has_scheme ? server : with_scheme, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &h, 0) != CURLUE_OK || !h || !*h) {
        r = lb_error_set(err, -EINVAL, "'%s' is not a URL or host[:port]", server);
        goto out;
    }
    if (curl_url_get(u, CURLUPART_PORT, &p, has_scheme ? CURLU_DEFAULT_PORT : 0) == CURLUE_OK && p)
        *port = atoi(p);
    /* IPv6 literals come back in brackets */
    if (h[0] == '[') {
        size_t n = strlen(h);

        memmove(h, h + 1, n - 1);
        h[n - 2] = '\0';
    }
    *host = strdup(h);
    if (!*host)
        r = lb_error_set(err, -ENOMEM, "out of memory");
out:
    curl_free(h);
    curl_free(p);
    curl_url_cleanup(u);
    free(with_scheme);
    return r;
}

static void allow_add(struct local_net *n, uint32_t a)
{
    for (size_t k = 0; k < n->n_allow; k++) {
        if (n->allow[k] == a)
            return;
    }
    if (n->n_allow < LOCAL_NET_MAX_ALLOW)
        n->allow[n->n_allow++] = a;
}

/* Resolve one server and add what it allows to n; hosts lines to hosts. */
static void hostport_add(struct local_net *n, uint32_t a, int port)
{
    for (size_t k = 0; k < n->n_hostport; k++) {
        if (n->hostport[k].addr == a && n->hostport[k].port == port)
            return;
    }
    if (n->n_hostport < LOCAL_NET_MAX_LOCAL) {
        n->hostport[n->n_hostport].addr = a;
        n->hostport[n->n_hostport++].port = (uint16_t)port;
    }
}

/* Refuse a server the sandbox must never reach: the daemon's own API, or an address of the
 * sandbox range (other sandboxes, the host ends of their links). */
static int server_check_forbidden(const struct local_net_host *h, const char *server, uint32_t a,
                                  int port, bool on_host, struct lb_error *err)
{
    uint32_t mask = h->prefix ? ~UINT32_C(0) << (32 - h->prefix) : 0;
    char text[INET_ADDRSTRLEN];

    local_net_addr_text(a, text);
    if (addr_is_group(a))
        return lb_error_set(err, -EOPNOTSUPP,
                            "'%s' (%s) is a broadcast, multicast or reserved address; a sandbox "
                            "may reach single hosts only",
                            server, text);
    if ((a & mask) == (h->base & mask))
        return lb_error_set(err, -EOPNOTSUPP,
                            "'%s' (%s) is inside network.range %s, the daemon's own sandbox "
                            "addresses; a sandbox may not reach other sandboxes",
                            server, text, h->range);
    if (on_host && h->api_port > 0 && port == h->api_port)
        return lb_error_set(err, -EOPNOTSUPP,
                            "'%s' (%s:%d) is the lendbox daemon's own API; a sandbox may not "
                            "reach it",
                            server, text, port);
    return 0;
}

static int server_add(const struct local_net_host *h, const char *server, struct local_net *n,
                      char *hosts, size_t *hosts_len, struct lb_error *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL, *ai;
    struct in_addr probe;
    char *host = NULL, text[INET_ADDRSTRLEN];
    bool literal, any4 = false, any6 = false;
    int port = 0, r, g;

    r = server_parse(server, &host, &port, err);
    if (r < 0)
        return r;
    literal = inet_pton(AF_INET, host, &probe) == 1;
    g = getaddrinfo(host, NULL, &hints, &res);
    if (g != 0) {
        r = lb_error_set(err, -EOPNOTSUPP, "cannot resolve '%s' (of '%s'): %s", host, server,
                         g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
        goto out;
    }
    for (ai = res; ai; ai = ai->ai_next) {
        uint32_t a;
        bool on_host;

        if (ai->ai_family == AF_INET6)
            any6 = true;
        if (ai->ai_family != AF_INET)
            continue;
        any4 = true;
        a = ntohl(((struct sockaddr_in *)(void *)ai->ai_addr)->sin_addr.s_addr);
        on_host = is_loopback(a) || addr_is_local(a);
        r = server_check_forbidden(h, server, a, port, on_host, err);
        if (r < 0)
            goto out;
        if (is_loopback(a)) {
            size_t k;

            if (port <= 0) {
                r = lb_error_set(err, -EOPNOTSUPP,
                                 "'%s' is on this host's loopback: give its port (the sandbox "
                                 "reaches only listed ports as " LOCAL_NET_HOST_NAME ")",
                                 server);
                goto out;
            }
            for (k = 0; k < n->n_local && n->local[k].port != port; k++)
                ;
            if (k < n->n_local && n->local[k].target != a) {
                r = lb_error_set(err, -EOPNOTSUPP,
                                 "two loopback servers share port %d; " LOCAL_NET_HOST_NAME
                                 " can forward a port to one of them only",
                                 port);
                goto out;
            }
            if (k == n->n_local && n->n_local < LOCAL_NET_MAX_LOCAL) {
                n->local[k].port = (uint16_t)port;
                n->local[k].target = a;
                n->n_local++;
            }
            continue;
        }
        if (on_host) {
            /* An address of the daemon's host: every host port would be open through it, so
             * only the listed port is, as for loopback servers. */
            if (port <= 0) {
                local_net_addr_text(a, text);
                r = lb_error_set(err, -EOPNOTSUPP,
                                 "'%s' (%s) is an address of this host: give its port (the "
                                 "sandbox reaches only listed ports of the daemon's host)",
                                 server, text);
                goto out;
            }
            hostport_add(n, a, port);
        } else {
            char uplink[IFNAMSIZ];

            /* the sandbox's own link forwards (set at attach); the replies need forwarding
             * on the interface they come in on */
            if (!uplink_forwarding_on(a, uplink)) {
                local_net_addr_text(a, text);
                r = lb_error_set(err, -EOPNOTSUPP,
                                 "'%s' (%s) is not on this host and IPv4 forwarding is off on "
                                 "the interface it is reached through (%s): set "
                                 "net.ipv4.conf.%s.forwarding = 1 or net.ipv4.ip_forward = 1",
                                 server, text, uplink[0] ? uplink : "unknown",
                                 uplink[0] ? uplink : "<uplink>");
                goto out;
            }
            allow_add(n, a);
        }
        if (!literal && *hosts_len < HOSTS_MAX - 512) {
            local_net_addr_text(a, text);
            *hosts_len += (size_t)snprintf(hosts + *hosts_len, HOSTS_MAX - *hosts_len, "%s\t%s\n",
                                           text, host);
        }
    }
    if (!any4) {
        r = lb_error_set(err, -EOPNOTSUPP,
                         "'%s' resolves to IPv6 addresses only%s; the local provider enforces "
                         "IPv4 egress only",
                         server, any6 ? "" : " (or none)");
        goto out;
    }
out:
    if (res)
        freeaddrinfo(res);
    free(host);
    return r;
}

static int net_prepare(struct local_provider *lp, const char *id,
                       const struct lb_network_request *req, struct local_net *n,
                       struct lb_error *err)
{
    struct local_net_host *h = lp->net;
    const char *access = req && req->access ? req->access : "inherit";
    struct lb_error e = {0};
    char *hosts = NULL, a[INET_ADDRSTRLEN];
    size_t hosts_len = 0;
    bool needs_forwarding = false;
    int r;

    memset(n, 0, sizeof(*n));
    n->slot = -1;
    if (strcmp(access, "inherit") == 0)
        n->mode = h && h->nat_default ? LOCAL_NET_NAT : LOCAL_NET_NONE;
    else if (strcmp(access, "model_only") == 0)
        n->mode = LOCAL_NET_MODEL_ONLY;
    else if (strcmp(access, "model_and_tools") == 0)
        n->mode = LOCAL_NET_MODEL_AND_TOOLS;
    else
        return lb_error_set(err, -EINVAL, "unknown network access '%s'", access);
    if (n->mode == LOCAL_NET_NONE)
        return 0;
    if (!h)
        return lb_error_set(err, -EOPNOTSUPP,
                            "network access '%s' cannot be enforced: this "
                            "provider was built without networking",
                            access);
    r = fault_hit("network.enforce", 0, err);
    if (r < 0) {
        metrics_add(LB_M_NET_UNENFORCEABLE, 1);
        return lb_error_set(err, -EOPNOTSUPP,
                            "network access '%s' cannot be enforced: nftables is not available "
                            "(injected fault network.enforce)",
                            access);
    }
    if (h->unavailable[0]) {
        metrics_add(LB_M_NET_UNENFORCEABLE, 1);
        return lb_error_set(err, -EOPNOTSUPP, "network access '%s' cannot be enforced: %s", access,
                            h->unavailable);
    }
    r = local_net_nft_run(h, NULL, &e);
    if (r < 0) {
        metrics_add(LB_M_NET_UNENFORCEABLE, 1);
        return lb_error_set(err, -EOPNOTSUPP, "network access '%s' cannot be enforced: %s", access,
                            e.message);
    }
    if (n->mode != LOCAL_NET_NAT && (!req->model_server || !*req->model_server))
        return lb_error_set(err, -EINVAL, "network access '%s' needs a model_server", access);
    hosts = malloc(HOSTS_MAX);
    if (!hosts)
        return lb_error_set(err, -ENOMEM, "out of memory");
    hosts_len = (size_t)snprintf(hosts, HOSTS_MAX,
                                 "# written by lendboxd: DNS is closed in this sandbox\n"
                                 "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost "
                                 "ip6-loopback\n");
    if (n->mode != LOCAL_NET_NAT) {
        r = server_add(h, req->model_server, n, hosts, &hosts_len, err);
        for (size_t i = 0; r == 0 && n->mode == LOCAL_NET_MODEL_AND_TOOLS && req->tool_servers &&
                           req->tool_servers[i];
             i++)
            r = server_add(h, req->tool_servers[i], n, hosts, &hosts_len, err);
        if (r < 0)
            goto fail;
    } else {
        needs_forwarding = true;
    }
    if (needs_forwarding && !forwarding_on()) {
        r = lb_error_set(err, -EOPNOTSUPP,
                         "network access '%s' needs IPv4 forwarding (a destination is not on "
                         "this host), and net.ipv4.ip_forward is 0",
                         n->mode == LOCAL_NET_NAT ? "inherit (nat)" : access);
        goto fail;
    }
    local_net_ifname(id, n->ifname);
    r = local_net_slot_alloc(h, n);
    if (r < 0) {
        r = lb_error_set(err, -EUSERS, "no free address left in network.range %s", h->range);
        goto fail;
    }
    n->host_addr = h->base + 2 * (uint32_t)n->slot;
    n->sbx_addr = n->host_addr + 1;
    local_net_addr_text(n->host_addr, a);
    hosts_len += (size_t)snprintf(hosts + hosts_len, HOSTS_MAX - hosts_len,
                                  "%s\t" LOCAL_NET_HOST_NAME "\n", a);
    n->hosts_text = hosts;
    return 0;
fail:
    free(hosts);
    if (r == -EOPNOTSUPP)
        metrics_add(LB_M_NET_UNENFORCEABLE, 1);
    n->mode = LOCAL_NET_NONE;
    return r;
}

int local_net_prepare(struct local_provider *lp, const char *id,
                      const struct lb_network_request *req, struct local_net *n,
                      struct lb_error *err)
{
    int r = net_prepare(lp, id, req, n, err);

    if (r < 0) { /* nothing taken: the caller has no network to undo */
        n->mode = LOCAL_NET_NONE;
        n->slot = -1;
    }
    return r;
}

int local_net_write_hosts(const struct local_net *n, const char *dir, char *path, size_t size,
                          struct lb_error *err)
{
    size_t len, off = 0;
    int fd;

    path[0] = '\0';
    if (n->mode == LOCAL_NET_NONE || !n->hosts_text)
        return 0;
    snprintf(path, size, "%s/hosts", dir);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 || fchmod(fd, 0644) < 0)
        goto fail;
    len = strlen(n->hosts_text);
    while (off < len) {
        ssize_t w = write(fd, n->hosts_text + off, len - off);

        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            goto fail;
        off += (size_t)w;
    }
    close(fd);
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    return lb_error_set(err, -EREMOTEIO, "cannot write '%s': %s", path, strerror(errno));
}
