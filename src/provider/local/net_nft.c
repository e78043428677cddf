/*
 * net_nft.c - the nftables table that holds every networked sandbox's egress policy: its static
 * rules, made on first use, and the set elements of one sandbox.
 *
 * The nftables table (names in [network] nft_table, "lendbox" by default):
 *
 *   sets   ifs       ifname                      host ends of every networked sandbox
 *          nat_ifs   ifname                      those with inherit = nat
 *          allow4    ifname . ipv4_addr          allowed destinations (every port)
 *          hostside4 ifname . ipv4_addr          the host end's own address (host.lendbox.internal)
 *          lport4    ifname . inet_service       host.lendbox.internal ports
 *          allowp4   ifname . ipv4_addr . inet_service   host-local servers: listed ports only
 *   map    lmap4     ifname . inet_service : ipv4_addr   where such a port goes (127.x)
 *   chains filter_pre (filter, prerouting) sends every packet from a sandbox through chain
 *          sbx, which decides before routing: a refused packet is rejected at once even where
 *          the host would drop it silently (IPv4 forwarding off). Packets to more than one host
 *          (broadcast, multicast, anycast) are dropped first, in every mode; the host's own
 *          addresses are refused next but for the listed ports. forward rejects new
 *          connections into sandboxes from anywhere (other sandboxes too); nat_pre DNATs
 *          host.lendbox.internal ports, nat_post masquerades forwarded sandbox traffic.
 *
 * The static rules are rewritten at every start (flush + add in one transaction, so there is
 * no moment without them); the sets keep their elements, so adopted sandboxes keep their
 * policy. A sandbox's elements are added before its link exists and removed after the link is
 * gone. Removal adds and then deletes each element in one transaction, which makes it
 * idempotent (deleting an absent element alone would fail the whole batch).
 */
#include "provider/local/net_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nftables/libnftables.h>

#include "provider/local/local_internal.h"

/* ---- nftables ------------------------------------------------------------------------- */
/* Run one nft script (a transaction) with nft_lock held. On failure err gets nft's first
 * error line. */
static int nft_run_locked(struct local_net_host *h, const char *cmds, struct lb_error *err)
{
    const char *msg;
    int r;

    r = nft_run_cmd_from_buffer(h->nft, cmds);
    msg = nft_ctx_get_error_buffer(h->nft);
    if (r != 0) {
        size_t n = msg ? strcspn(msg, "\n") : 0;

        lb_error_set(err, -EREMOTEIO, "nftables: %.*s", (int)(n > 200 ? 200 : n),
                     n ? msg : "failed");
    }
    return r != 0 ? -EREMOTEIO : 0;
}

static int nft_setup(struct local_net_host *h, struct lb_error *err);

/* Run cmds, setting the table up first if this is the first use. */
int local_net_nft_run(struct local_net_host *h, const char *cmds, struct lb_error *err)
{
    int r = 0;

    pthread_mutex_lock(&h->nft_lock);
    if (!h->set_up)
        r = nft_setup(h, err);
    if (r == 0 && cmds)
        r = nft_run_locked(h, cmds, err);
    pthread_mutex_unlock(&h->nft_lock);
    return r;
}

/* Make the table, its sets and its static rules; nft_lock held. Done on first use (a seed
 * asking for a network, or a networked sandbox found at start), so a daemon that never lends
 * a network never touches the host's nftables. */
static int nft_setup(struct local_net_host *h, struct lb_error *err)
{
    char *cmds = NULL, api[192] = "";
    const char *t = h->table;
    int r, len;

    if (h->api_port > 0)
        snprintf(api, sizeof(api),
                 "add rule inet %s sbx fib daddr type local tcp dport %d reject with tcp reset\n",
                 t, h->api_port);
    len = asprintf(
        &cmds,
        "add table inet %1$s\n"
        "add set inet %1$s ifs { type ifname; }\n"
        "add set inet %1$s nat_ifs { type ifname; }\n"
        "add set inet %1$s allow4 { type ifname . ipv4_addr; }\n"
        "add set inet %1$s hostside4 { type ifname . ipv4_addr; }\n"
        "add set inet %1$s lport4 { type ifname . inet_service; }\n"
        "add set inet %1$s allowp4 { type ifname . ipv4_addr . inet_service; }\n"
        "add map inet %1$s lmap4 { type ifname . inet_service : ipv4_addr; }\n"
        "add chain inet %1$s filter_pre { type filter hook prerouting priority filter; policy "
        "accept; }\n"
        "add chain inet %1$s forward { type filter hook forward priority filter; policy accept; "
        "}\n"
        "add chain inet %1$s nat_pre { type nat hook prerouting priority dstnat; policy "
        "accept; }\n"
        "add chain inet %1$s nat_post { type nat hook postrouting priority srcnat; policy "
        "accept; }\n"
        "add chain inet %1$s sbx\n"
        "flush chain inet %1$s filter_pre\n"
        "flush chain inet %1$s forward\n"
        "flush chain inet %1$s nat_pre\n"
        "flush chain inet %1$s nat_post\n"
        "flush chain inet %1$s sbx\n"
        "add rule inet %1$s nat_pre meta l4proto tcp iifname . ip daddr @hostside4 dnat ip to "
        "iifname . tcp dport map @lmap4\n"
        "add rule inet %1$s filter_pre iifname @ifs jump sbx\n"
        /* Never to more than one host, whatever the mode and the allow lists: a broadcast
         * (255.255.255.255, 0.0.0.0/8, any subnet broadcast of the host), multicast or anycast
         * destination reaches the host's sockets bound to the wildcard address, and the
         * host's neighbours. Dropped, not rejected: no ICMP error answers such a packet. */
        "add rule inet %1$s sbx fib daddr type { broadcast, multicast, anycast } drop\n"
        "add rule inet %1$s sbx ip daddr { 0.0.0.0/8, 224.0.0.0/4, 255.255.255.255 } drop\n"
        "add rule inet %1$s sbx ip6 daddr ff00::/8 drop\n"
        "add rule inet %1$s sbx ct state established,related accept\n"
        "%2$s"
        "add rule inet %1$s sbx meta l4proto { tcp, udp } th dport 53 reject\n"
        "add rule inet %1$s sbx ip daddr 127.0.0.0/8 ct status dnat iifname . tcp dport "
        "@lport4 accept\n"
        "add rule inet %1$s sbx meta l4proto tcp iifname . ip daddr . tcp dport @allowp4 accept\n"
        /* the host's own addresses: only the listed ports above, in every mode (TCP with a
         * reset: the host's ICMP errors to one address are rate-limited, so a refusal by
         * ICMP alone can be lost and the connect then waits for its SYN's retransmission) */
        "add rule inet %1$s sbx fib daddr type local meta l4proto tcp reject with tcp reset\n"
        "add rule inet %1$s sbx fib daddr type local reject with icmpx admin-prohibited\n"
        "add rule inet %1$s sbx iifname . ip daddr @allow4 accept\n"
        "add rule inet %1$s sbx iifname @nat_ifs ip daddr { 169.254.0.0/16, %3$s } reject "
        "with icmpx admin-prohibited\n"
        "add rule inet %1$s sbx iifname @nat_ifs meta nfproto ipv4 accept\n"
        "add rule inet %1$s sbx meta l4proto tcp reject with tcp reset\n"
        "add rule inet %1$s sbx reject with icmpx admin-prohibited\n"
        "add rule inet %1$s forward oifname @ifs ct state established,related accept\n"
        "add rule inet %1$s forward oifname @ifs reject with icmpx admin-prohibited\n"
        "add rule inet %1$s nat_post iifname @ifs oifname != @ifs masquerade\n",
        t, api, h->range);
    if (len < 0)
        return lb_error_set(err, -ENOMEM, "out of memory");
    r = nft_run_locked(h, cmds, err);
    free(cmds);
    if (r == 0)
        h->set_up = true;
    else
        lb_error_keep(err, -EREMOTEIO, "nftables is not usable on this host");
    return r;
}

/* Append the element commands of n (verb "add" or "delete") to buf. */
int local_net_nft_elements(struct local_net_host *h, const struct local_net *n, const char *verb,
                           char *buf, size_t size, size_t *off)
{
    const char *t = h->table, *i = n->ifname;
    char a[INET_ADDRSTRLEN], b[INET_ADDRSTRLEN];
    size_t k;
    int w;

#define EMIT(...)                                                                                  \
    do {                                                                                           \
        w = snprintf(buf + *off, size - *off, __VA_ARGS__);                                        \
        if (w < 0 || (size_t)w >= size - *off)                                                     \
            return -ENOSPC;                                                                        \
        *off += (size_t)w;                                                                         \
    } while (0)

    local_net_addr_text(n->host_addr, a);
    EMIT("%s element inet %s hostside4 { \"%s\" . %s }\n", verb, t, i, a);
    for (k = 0; k < n->n_allow; k++) {
        local_net_addr_text(n->allow[k], a);
        EMIT("%s element inet %s allow4 { \"%s\" . %s }\n", verb, t, i, a);
    }
    for (k = 0; k < n->n_hostport; k++) {
        local_net_addr_text(n->hostport[k].addr, a);
        EMIT("%s element inet %s allowp4 { \"%s\" . %s . %u }\n", verb, t, i, a,
             n->hostport[k].port);
    }
    for (k = 0; k < n->n_local; k++) {
        local_net_addr_text(n->local[k].target, b);
        EMIT("%s element inet %s lport4 { \"%s\" . %u }\n", verb, t, i, n->local[k].port);
        if (strcmp(verb, "delete") == 0)
            EMIT("%s element inet %s lmap4 { \"%s\" . %u }\n", verb, t, i, n->local[k].port);
        else
            EMIT("%s element inet %s lmap4 { \"%s\" . %u : %s }\n", verb, t, i, n->local[k].port,
                 b);
    }
    if (n->mode == LOCAL_NET_NAT)
        EMIT("%s element inet %s nat_ifs { \"%s\" }\n", verb, t, i);
    /* last on add, so a sandbox's packets meet no rule before its elements are all in */
    EMIT("%s element inet %s ifs { \"%s\" }\n", verb, t, i);
#undef EMIT
    return 0;
}
