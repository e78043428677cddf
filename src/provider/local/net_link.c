/*
 * net_link.c - a networked sandbox's link: the veth pair made over netlink (libnl-route-3),
 * one end moved into the sandbox's netns and configured from a short-lived thread that joins
 * it, attach (policy first, then the link) and detach (link first, then the policy), and the
 * endpoint URL of a sandbox with a link.
 */
#include "provider/local/net_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/ip.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <netlink/addr.h>
#include <netlink/errno.h>
#include <netlink/netlink.h>
#include <netlink/route/addr.h>
#include <netlink/route/link.h>
#include <netlink/route/link/inet.h>
#include <netlink/route/link/inet6.h>
#include <netlink/route/link/veth.h>
#include <netlink/route/nexthop.h>
#include <netlink/route/route.h>
#include <netlink/socket.h>

#include "provider/local/local_internal.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/metrics.h"

/* ---- links ---------------------------------------------------------------------------- */

static int nl_open(struct nl_sock **out)
{
    struct nl_sock *s = nl_socket_alloc();
    int r;

    if (!s)
        return -NLE_NOMEM;
    r = nl_connect(s, NETLINK_ROUTE);
    if (r < 0) {
        nl_socket_free(s);
        return r;
    }
    *out = s;
    return 0;
}

/* Add a/31 to the link with index ifindex. */
static int nl_add_addr(struct nl_sock *s, int ifindex, uint32_t a)
{
    struct rtnl_addr *ra = rtnl_addr_alloc();
    uint32_t be = htonl(a);
    struct nl_addr *local = nl_addr_build(AF_INET, &be, 4);
    int r = -NLE_NOMEM;

    if (ra && local) {
        nl_addr_set_prefixlen(local, 31);
        rtnl_addr_set_ifindex(ra, ifindex);
        r = rtnl_addr_set_local(ra, local);
        if (r == 0)
            r = rtnl_addr_add(s, ra, 0);
    }
    nl_addr_put(local);
    rtnl_addr_put(ra);
    return r;
}

/* Bring the named link up; *ifindex gets its index. */
static int nl_link_up(struct nl_sock *s, const char *name, int *ifindex)
{
    struct rtnl_link *orig = NULL, *change = rtnl_link_alloc();
    int r = -NLE_NOMEM;

    if (change) {
        r = rtnl_link_get_kernel(s, 0, name, &orig);
        if (r == 0) {
            *ifindex = rtnl_link_get_ifindex(orig);
            rtnl_link_set_flags(change, IFF_UP);
            r = rtnl_link_change(s, orig, change, 0);
        }
    }
    rtnl_link_put(orig);
    rtnl_link_put(change);
    return r;
}

static int nl_default_route(struct nl_sock *s, int ifindex, uint32_t gw)
{
    struct rtnl_route *rt = rtnl_route_alloc();
    struct rtnl_nexthop *nh = rtnl_route_nh_alloc();
    uint32_t zero = 0, be = htonl(gw);
    struct nl_addr *dst = nl_addr_build(AF_INET, &zero, 4), *via = nl_addr_build(AF_INET, &be, 4);
    int r = -NLE_NOMEM;

    if (rt && nh && dst && via) {
        nl_addr_set_prefixlen(dst, 0);
        rtnl_route_set_family(rt, AF_INET);
        rtnl_route_set_table(rt, RT_TABLE_MAIN);
        r = rtnl_route_set_dst(rt, dst);
        rtnl_route_nh_set_ifindex(nh, ifindex);
        rtnl_route_nh_set_gateway(nh, via);
        rtnl_route_add_nexthop(rt, nh);
        nh = NULL; /* the route owns it */
        if (r == 0)
            r = rtnl_route_add(s, rt, NLM_F_CREATE);
    }
    if (nh)
        rtnl_route_nh_free(nh);
    nl_addr_put(dst);
    nl_addr_put(via);
    rtnl_route_put(rt);
    return r;
}

/* Set per-link settings through netlink (RTM_SETLINK with IFLA_AF_SPEC), so lendboxd needs no
 * writable /proc/sys (the shipped unit has ProtectKernelTunables=yes). With route_localnet the
 * link's IPv4 route_localnet is set to 1 (the DNAT to loopback needs it); without, IPv6 address
 * generation is turned off instead (IN6_ADDR_GEN_MODE_NONE: no link-local address, so the link
 * sends no router solicitation or other IPv6 of its own; the nft rules reject IPv6 anyway). Call
 * before the link is up. Returns 0 or a negative libnl error. */
/* Turn IPv4 forwarding on for one link only (net.ipv4.conf.<name>.forwarding = 1, through
 * netlink like nl_link_set_conf): the kernel decides forwarding by the input interface, so
 * packets from the sandbox may be forwarded without the host-wide net.ipv4.ip_forward.
 * Returns 0 or a negative libnl error. */
static int nl_link_set_forwarding(struct nl_sock *s, const char *name)
{
    struct rtnl_link *orig = NULL, *change = rtnl_link_alloc();
    int r = -NLE_NOMEM;

    if (change) {
        r = rtnl_link_get_kernel(s, 0, name, &orig);
        if (r == 0)
            r = rtnl_link_inet_set_conf(change, IPV4_DEVCONF_FORWARDING, 1);
        if (r == 0)
            r = rtnl_link_change(s, orig, change, 0);
    }
    rtnl_link_put(orig);
    rtnl_link_put(change);
    return r;
}

static int nl_link_set_conf(struct nl_sock *s, const char *name, bool route_localnet)
{
    struct rtnl_link *orig = NULL, *change = rtnl_link_alloc();
    int r = -NLE_NOMEM;

    if (change) {
        r = rtnl_link_get_kernel(s, 0, name, &orig);
        if (r == 0) {
            if (route_localnet)
                r = rtnl_link_inet_set_conf(change, IPV4_DEVCONF_ROUTE_LOCALNET, 1);
            else
                r = rtnl_link_inet6_set_addr_gen_mode(change, IN6_ADDR_GEN_MODE_NONE);
        }
        if (r == 0)
            r = rtnl_link_change(s, orig, change, 0);
    }
    rtnl_link_put(orig);
    rtnl_link_put(change);
    return r;
}

struct inside_job {
    int netns_fd;
    const struct local_net *n;
    char what[160]; /* the step that failed */
    int r;          /* libnl or -errno */
};

/* Thread body: join the sandbox's netns and configure eth0 there. The thread ends with its
 * netns; the daemon's other threads are never moved. */
static void *inside_configure(void *arg)
{
    struct inside_job *j = arg;
    struct nl_sock *s = NULL;
    int ifindex = 0, r;

    if (setns(j->netns_fd, CLONE_NEWNET) < 0) {
        j->r = -errno;
        snprintf(j->what, sizeof(j->what), "setns into the sandbox: %s", strerror(errno));
        return NULL;
    }
    r = nl_open(&s);
    if (r < 0) {
        snprintf(j->what, sizeof(j->what), "netlink socket: %s", nl_geterror(r));
        goto out;
    }
    /* no IPv6 on the link unless ever needed: no link-local address, no router solicitation;
     * best effort (fails on a kernel without IPv6, which needs nothing) */
    (void)nl_link_set_conf(s, "eth0", false);
    r = nl_link_up(s, "lo", &ifindex);
    if (r == 0)
        r = nl_link_up(s, "eth0", &ifindex);
    if (r < 0) {
        snprintf(j->what, sizeof(j->what), "link up inside: %s", nl_geterror(r));
        goto out;
    }
    r = nl_add_addr(s, ifindex, j->n->sbx_addr);
    if (r < 0) {
        snprintf(j->what, sizeof(j->what), "address inside: %s", nl_geterror(r));
        goto out;
    }
    r = nl_default_route(s, ifindex, j->n->host_addr);
    if (r < 0)
        snprintf(j->what, sizeof(j->what), "default route inside: %s", nl_geterror(r));
out:
    if (s)
        nl_socket_free(s);
    j->r = r;
    return NULL;
}

int local_net_attach(struct local_provider *lp, const struct local_net *n, pid_t pid,
                     struct lb_error *err)
{
    struct local_net_host *h = lp->net;
    struct inside_job job = {.netns_fd = -1, .n = n};
    struct nl_sock *s = NULL;
    char cmds[NFT_CMD_MAX], path[128];
    size_t off = 0;
    pthread_t t;
    int ifindex = 0, r;

    if (n->mode == LOCAL_NET_NONE)
        return 0;
    if (!h || h->unavailable[0])
        return lb_error_set(err, -EOPNOTSUPP, "networking is unavailable");
    int64_t t0 = clock_mono_ms(), t1 = 0, t2 = 0, t3 = 0, t4 = 0;
    /* 1. the policy, before the link exists */
    r = local_net_nft_elements(h, n, "add", cmds, sizeof(cmds), &off);
    if (r == 0)
        r = local_net_nft_run(h, cmds, err);
    else
        lb_error_set(err, -EREMOTEIO, "the sandbox's rules are too long");
    if (r < 0) {
        metrics_add(LB_M_NET_RULE_FAILURES, 1);
        return lb_error_keep(err, -EREMOTEIO, "cannot install the sandbox's egress rules");
    }
    /* 2. the veth pair, one end straight into the sandbox's netns */
    r = nl_open(&s);
    if (r < 0) {
        r = lb_error_set(err, -EREMOTEIO, "netlink socket: %s", nl_geterror(r));
        goto out;
    }
    t1 = clock_mono_ms();
    r = rtnl_link_veth_add(s, n->ifname, "eth0", pid);
    t2 = clock_mono_ms();
    if (r < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot make veth %s: %s", n->ifname, nl_geterror(r));
        goto out;
    }
    (void)nl_link_set_conf(s, n->ifname, false);
    if (n->n_local > 0 && (r = nl_link_set_conf(s, n->ifname, true)) < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot set route_localnet on %s: %s", n->ifname,
                         nl_geterror(r));
        goto out;
    }
    if ((n->n_allow > 0 || n->mode == LOCAL_NET_NAT) &&
        (r = nl_link_set_forwarding(s, n->ifname)) < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot turn on forwarding on %s: %s", n->ifname,
                         nl_geterror(r));
        goto out;
    }
    r = nl_link_up(s, n->ifname, &ifindex);
    if (r == 0)
        r = nl_add_addr(s, ifindex, n->host_addr);
    if (r < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot configure %s: %s", n->ifname, nl_geterror(r));
        goto out;
    }
    t3 = clock_mono_ms();
    /* 3. the sandbox's end, from a thread inside its netns */
    snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)pid);
    job.netns_fd = open(path, O_RDONLY | O_CLOEXEC);
    if (job.netns_fd < 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot open %s: %s", path, strerror(errno));
        goto out;
    }
    if (pthread_create(&t, NULL, inside_configure, &job) != 0) {
        r = lb_error_set(err, -EREMOTEIO, "cannot start a thread");
        goto out;
    }
    pthread_join(t, NULL);
    t4 = clock_mono_ms();
    log_debug("%s attached in ms: rules %lld, veth %lld, host end %lld, sandbox end %lld",
              n->ifname, (long long)(t1 - t0), (long long)(t2 - t1), (long long)(t3 - t2),
              (long long)(t4 - t3));
    if (job.r < 0)
        r = lb_error_set(err, -EREMOTEIO, "cannot configure the sandbox's eth0: %s", job.what);
out:
    if (job.netns_fd >= 0)
        close(job.netns_fd);
    if (s)
        nl_socket_free(s);
    if (r < 0)
        metrics_add(LB_M_NET_RULE_FAILURES, 1);
    return r < 0 ? -EREMOTEIO : 0;
}

/* Is there a link named name in the daemon's netns? true when that cannot be told. */
static bool link_exists(const char *name)
{
    struct ifreq ifr = {0};
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), r;

    if (fd < 0)
        return true;
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
    r = ioctl(fd, SIOCGIFINDEX, &ifr) < 0 ? errno : 0;
    close(fd);
    return r != ENODEV;
}

int local_net_detach(struct local_provider *lp, const char *id, const struct local_net *n,
                     struct lb_error *err)
{
    struct local_net_host *h = lp->net;
    struct rtnl_link *link;
    struct nl_sock *s = NULL;
    char name[16], cmds[2 * NFT_CMD_MAX];
    size_t off = 0;
    int r;

    if (!h || !h->nft)
        return 0;
    if (n && n->mode != LOCAL_NET_NONE)
        snprintf(name, sizeof(name), "%s", n->ifname);
    else
        local_net_ifname(id, name);
    /* 1. the link (deleting one end deletes both; the kernel also does it when the sandbox's
     * netns dies). Asked for by name first, which needs no RTNL lock: a netlink delete takes
     * it, and so does the kernel's teardown of every dead sandbox's netns, so the many stops
     * of a shutdown sweep would queue on it for links that are already gone. */
    if (!link_exists(name))
        goto rules;
    r = nl_open(&s);
    if (r < 0)
        return lb_error_set(err, -EREMOTEIO, "netlink socket: %s", nl_geterror(r));
    link = rtnl_link_alloc();
    if (!link) {
        nl_socket_free(s);
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    rtnl_link_set_name(link, name);
    r = rtnl_link_delete(s, link);
    rtnl_link_put(link);
    nl_socket_free(s);
    if (r < 0 && r != -NLE_NODEV && r != -NLE_OBJ_NOTFOUND && r != -NLE_NOADDR)
        return lb_error_set(err, -EREMOTEIO, "cannot delete link %s: %s", name, nl_geterror(r));
rules:
    if (!n || n->mode == LOCAL_NET_NONE)
        return 0;
    /* 2. the rule elements: add-then-delete in one transaction is idempotent */
    r = local_net_nft_elements(h, n, "add", cmds, sizeof(cmds), &off);
    if (r == 0)
        r = local_net_nft_elements(h, n, "delete", cmds, sizeof(cmds), &off);
    if (r < 0)
        return lb_error_set(err, -EREMOTEIO, "the sandbox's rules are too long");
    r = local_net_nft_run(h, cmds, err);
    if (r < 0)
        return lb_error_keep(err, -EREMOTEIO, "cannot remove the rules of %s", name);
    return 0;
}

int local_net_endpoint(const struct local_net *n, int port, char **url_out, struct lb_error *err)
{
    char a[INET_ADDRSTRLEN];

    if (n->mode == LOCAL_NET_NONE)
        return lb_error_set(err, -ENOSYS, "this sandbox has no network link");
    local_net_addr_text(n->sbx_addr, a);
    if (asprintf(url_out, "http://%s:%d", a, port) < 0) {
        *url_out = NULL;
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    return 0;
}
