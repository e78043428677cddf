/*
 * local_net.c - see local_net.h.
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
#include "provider/local/net.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <linux/if.h>
#include <linux/ip.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
#include <nftables/libnftables.h>

#include "provider/local/local_internal.h"
#include "util/clock.h"
#include "util/fault.h"
#include "util/log.h"
#include "util/metrics.h"

#define MAX_SLOTS (1u << 20)
#define NFT_CMD_MAX 16384
#define HOSTS_MAX 8192

struct local_net_host {
    uint32_t base;   /* first address of the range, host order */
    int prefix;      /* range prefix length */
    uint32_t nslots; /* /31 pairs in the range */
    char range[80];  /* "a.b.c.d/p" as configured, normalised */
    char table[64];
    bool nat_default; /* [network] inherit = nat */
    int api_port;
    char unavailable[256]; /* why networks cannot be enforced here; "" when they can */

    pthread_mutex_t lock; /* guards the slot bitmap and the gauges */
    uint8_t *used;
    uint32_t next;

    pthread_mutex_t nft_lock; /* a libnftables context is not thread-safe */
    struct nft_ctx *nft;
    bool set_up; /* the table and its static rules are in place (guarded by nft_lock) */
};

static const char *const mode_names[LOCAL_NET_MODES] = {
    [LOCAL_NET_NONE] = "none",
    [LOCAL_NET_MODEL_ONLY] = "model_only",
    [LOCAL_NET_MODEL_AND_TOOLS] = "model_and_tools",
    [LOCAL_NET_NAT] = "nat",
};

static const enum lb_counter mode_gauges[LOCAL_NET_MODES] = {
    [LOCAL_NET_NONE] = LB_M_COUNTERS, /* not counted */
    [LOCAL_NET_MODEL_ONLY] = LB_M_NET_MODEL_ONLY,
    [LOCAL_NET_MODEL_AND_TOOLS] = LB_M_NET_MODEL_AND_TOOLS,
    [LOCAL_NET_NAT] = LB_M_NET_NAT,
};

static void addr_text(uint32_t a, char buf[INET_ADDRSTRLEN])
{
    struct in_addr in = {.s_addr = htonl(a)};

    inet_ntop(AF_INET, &in, buf, INET_ADDRSTRLEN);
}

static bool addr_parse(const char *s, uint32_t *out)
{
    struct in_addr in;

    if (!s || inet_pton(AF_INET, s, &in) != 1)
        return false;
    *out = ntohl(in.s_addr);
    return true;
}

static bool is_loopback(uint32_t a)
{
    return (a >> 24) == 127;
}

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
static int nft_run(struct local_net_host *h, const char *cmds, struct lb_error *err)
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

/* Does this process have CAP_NET_ADMIN (bit 12 of CapEff)? */
static bool has_net_admin(void)
{
    char buf[4096];
    unsigned long long eff = 0;
    const char *p;

    if (local_read_small("/proc/self/status", buf, sizeof(buf)) < 0)
        return false;
    p = strstr(buf, "\nCapEff:");
    if (!p || sscanf(p + 8, "%llx", &eff) != 1)
        return false;
    return (eff >> 12) & 1;
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
static int nft_elements(struct local_net_host *h, const struct local_net *n, const char *verb,
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

    addr_text(n->host_addr, a);
    EMIT("%s element inet %s hostside4 { \"%s\" . %s }\n", verb, t, i, a);
    for (k = 0; k < n->n_allow; k++) {
        addr_text(n->allow[k], a);
        EMIT("%s element inet %s allow4 { \"%s\" . %s }\n", verb, t, i, a);
    }
    for (k = 0; k < n->n_hostport; k++) {
        addr_text(n->hostport[k].addr, a);
        EMIT("%s element inet %s allowp4 { \"%s\" . %s . %u }\n", verb, t, i, a,
             n->hostport[k].port);
    }
    for (k = 0; k < n->n_local; k++) {
        addr_text(n->local[k].target, b);
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

/* ---- slots ---------------------------------------------------------------------------- */

static void slot_set(struct local_net_host *h, const struct local_net *n, bool used)
{
    uint32_t s;
    bool was, adopt = false;

    if (n->mode == LOCAL_NET_NONE || n->slot < 0 || (uint32_t)n->slot >= h->nslots)
        return;
    s = (uint32_t)n->slot;
    pthread_mutex_lock(&h->lock);
    was = h->used[s / 8] & (1u << (s % 8));
    if (used)
        h->used[s / 8] |= (uint8_t)(1u << (s % 8));
    else
        h->used[s / 8] &= (uint8_t) ~(1u << (s % 8));
    if (was != used && used && !h->set_up && h->nft)
        adopt = true;
    if (was != used && mode_gauges[n->mode] != LB_M_COUNTERS) {
        if (used)
            metrics_add(mode_gauges[n->mode], 1);
        else
            metrics_sub(mode_gauges[n->mode], 1);
    }
    pthread_mutex_unlock(&h->lock);
    /* a networked sandbox of an earlier run: refresh the static rules (the API port may have
     * changed); its set elements are still in the kernel */
    if (adopt) {
        struct lb_error e = {0};

        if (nft_run(h, NULL, &e) < 0)
            log_warn("network: cannot refresh the rules of table inet %s: %s", h->table, e.message);
    }
}

void local_net_mark_slot(struct local_provider *lp, const struct local_net *n)
{
    if (lp->net)
        slot_set(lp->net, n, true);
}

void local_net_free_slot(struct local_provider *lp, const struct local_net *n)
{
    if (lp->net)
        slot_set(lp->net, n, false);
}

static int slot_alloc(struct local_net_host *h, struct local_net *n)
{
    uint32_t i, s;
    int r = -EUSERS;

    pthread_mutex_lock(&h->lock);
    for (i = 0; i < h->nslots; i++) {
        s = (h->next + i) % h->nslots;
        if (!(h->used[s / 8] & (1u << (s % 8)))) {
            h->used[s / 8] |= (uint8_t)(1u << (s % 8));
            h->next = (s + 1) % h->nslots;
            n->slot = (int32_t)s;
            r = 0;
            break;
        }
    }
    if (r == 0 && mode_gauges[n->mode] != LB_M_COUNTERS)
        metrics_add(mode_gauges[n->mode], 1);
    pthread_mutex_unlock(&h->lock);
    return r;
}

/* ---- init ----------------------------------------------------------------------------- */

static int parse_range(struct local_net_host *h, const char *range, struct lb_error *err)
{
    char buf[64], *slash;
    uint32_t a, mask;
    long p;

    if (!range || strlen(range) >= sizeof(buf))
        goto bad;
    snprintf(buf, sizeof(buf), "%s", range);
    slash = strchr(buf, '/');
    if (!slash)
        goto bad;
    *slash = '\0';
    p = strtol(slash + 1, &slash, 10);
    if (*slash || p < 8 || p > 30 || !addr_parse(buf, &a))
        goto bad;
    mask = p == 0 ? 0 : ~0u << (32 - p);
    h->base = a & mask;
    h->prefix = (int)p;
    h->nslots = (1u << (32 - p)) / 2;
    if (h->nslots > MAX_SLOTS)
        h->nslots = MAX_SLOTS;
    addr_text(h->base, buf);
    snprintf(h->range, sizeof(h->range), "%s/%d", buf, h->prefix);
    return 0;
bad:
    return lb_error_set(err, -EINVAL,
                        "network.range must be an IPv4 CIDR with a prefix from 8 to 30, not '%s'",
                        range ? range : "");
}

static bool table_name_is_valid(const char *t)
{
    size_t n = t ? strlen(t) : 0;

    if (n == 0 || n > 32)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = t[i];

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || (i > 0 && c == '-')))
            return false;
    }
    return true;
}

int local_net_init(struct local_provider *lp, const struct lb_local_net_config *cfg,
                   struct lb_error *err)
{
    struct local_net_host *h = calloc(1, sizeof(*h));
    const char *inherit = cfg && cfg->inherit ? cfg->inherit : "none";
    const char *table = cfg && cfg->nft_table ? cfg->nft_table : "lendbox";
    int r;

    if (!h)
        return lb_error_set(err, -ENOMEM, "out of memory");
    pthread_mutex_init(&h->lock, NULL);
    pthread_mutex_init(&h->nft_lock, NULL);
    lp->net = h;
    r = parse_range(h, cfg && cfg->range ? cfg->range : "10.213.0.0/16", err);
    if (r < 0)
        return r;
    if (strcmp(inherit, "none") && strcmp(inherit, "nat"))
        return lb_error_set(err, -EINVAL, "network.inherit must be none or nat, not '%s'", inherit);
    if (!table_name_is_valid(table))
        return lb_error_set(err, -EINVAL,
                            "network.nft_table must be 1-32 characters of [A-Za-z0-9_-]");
    h->nat_default = strcmp(inherit, "nat") == 0;
    snprintf(h->table, sizeof(h->table), "%s", table);
    h->api_port = cfg ? cfg->api_port : 0;
    h->used = calloc((h->nslots + 7) / 8, 1);
    if (!h->used)
        return lb_error_set(err, -ENOMEM, "out of memory");

    if (!has_net_admin()) {
        snprintf(h->unavailable, sizeof(h->unavailable),
                 "lendboxd has no CAP_NET_ADMIN, so it cannot make links or nftables rules");
    } else if (!(h->nft = nft_ctx_new(NFT_CTX_DEFAULT))) {
        snprintf(h->unavailable, sizeof(h->unavailable), "libnftables cannot be initialised");
    } else {
        nft_ctx_buffer_output(h->nft);
        nft_ctx_buffer_error(h->nft);
    }
    if (h->unavailable[0])
        log_warn("network: %s; seeds asking for a network will get 422", h->unavailable);
    else
        log_info("network: range %s, inherit = %s, nftables table inet %s", h->range, inherit,
                 h->table);
    return 0;
}

void local_net_destroy(struct local_provider *lp)
{
    struct local_net_host *h = lp->net;

    if (!h)
        return;
    if (h->nft)
        nft_ctx_free(h->nft);
    free(h->used);
    pthread_mutex_destroy(&h->lock);
    pthread_mutex_destroy(&h->nft_lock);
    free(h);
    lp->net = NULL;
}

/* ---- prepare -------------------------------------------------------------------------- */

/* Interface name from the sandbox id: "lb" + 13 base32 characters of a 64-bit FNV-1a hash. */
static void ifname_for(const char *id, char out[16])
{
    static const char alphabet[] = "0123456789abcdefghjkmnpqrstvwxyz";
    uint64_t x = 14695981039346656037ull;

    for (const char *c = id; *c; c++) {
        x ^= (unsigned char)*c;
        x *= 1099511628211ull;
    }
    out[0] = 'l';
    out[1] = 'b';
    for (int i = 0; i < 13; i++) {
        out[2 + i] = alphabet[x & 31];
        x >>= 5;
    }
    out[15] = '\0';
}

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

    addr_text(a, text);
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
                addr_text(a, text);
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
                addr_text(a, text);
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
            addr_text(a, text);
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
    r = nft_run(h, NULL, &e);
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
    ifname_for(id, n->ifname);
    r = slot_alloc(h, n);
    if (r < 0) {
        r = lb_error_set(err, -EUSERS, "no free address left in network.range %s", h->range);
        goto fail;
    }
    n->host_addr = h->base + 2 * (uint32_t)n->slot;
    n->sbx_addr = n->host_addr + 1;
    addr_text(n->host_addr, a);
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
    r = nft_elements(h, n, "add", cmds, sizeof(cmds), &off);
    if (r == 0)
        r = nft_run(h, cmds, err);
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
        ifname_for(id, name);
    /* 1. the link (deleting one end deletes both; the kernel also does it when the sandbox's
     * netns dies) */
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
    if (!n || n->mode == LOCAL_NET_NONE)
        return 0;
    /* 2. the rule elements: add-then-delete in one transaction is idempotent */
    r = nft_elements(h, n, "add", cmds, sizeof(cmds), &off);
    if (r == 0)
        r = nft_elements(h, n, "delete", cmds, sizeof(cmds), &off);
    if (r < 0)
        return lb_error_set(err, -EREMOTEIO, "the sandbox's rules are too long");
    r = nft_run(h, cmds, err);
    if (r < 0)
        return lb_error_keep(err, -EREMOTEIO, "cannot remove the rules of %s", name);
    return 0;
}

int local_net_endpoint(const struct local_net *n, int port, char **url_out, struct lb_error *err)
{
    char a[INET_ADDRSTRLEN];

    if (n->mode == LOCAL_NET_NONE)
        return lb_error_set(err, -ENOSYS, "this sandbox has no network link");
    addr_text(n->sbx_addr, a);
    if (asprintf(url_out, "http://%s:%d", a, port) < 0) {
        *url_out = NULL;
        return lb_error_set(err, -ENOMEM, "out of memory");
    }
    return 0;
}

/* ---- descriptor ----------------------------------------------------------------------- */

json_t *local_net_to_json(const struct local_net *n)
{
    char a[INET_ADDRSTRLEN], b[INET_ADDRSTRLEN];
    json_t *o, *allow, *local, *hostports;

    if (n->mode == LOCAL_NET_NONE)
        return NULL;
    addr_text(n->host_addr, a);
    addr_text(n->sbx_addr, b);
    allow = json_array();
    local = json_array();
    for (size_t k = 0; allow && k < n->n_allow; k++) {
        char t[INET_ADDRSTRLEN];

        addr_text(n->allow[k], t);
        json_array_append_new(allow, json_string(t));
    }
    for (size_t k = 0; local && k < n->n_local; k++) {
        char t[INET_ADDRSTRLEN];

        addr_text(n->local[k].target, t);
        json_array_append_new(local, json_pack("{s:i,s:s}", "port", n->local[k].port, "target", t));
    }
    o = json_pack("{s:s,s:i,s:s,s:s,s:s,s:o*,s:o*}", "mode", mode_names[n->mode], "slot",
                  (int)n->slot, "ifname", n->ifname, "host", a, "addr", b, "allow", allow, "local",
                  local);
    if (o && n->n_hostport) {
        hostports = json_array();
        for (size_t k = 0; hostports && k < n->n_hostport; k++) {
            char t[INET_ADDRSTRLEN];

            addr_text(n->hostport[k].addr, t);
            json_array_append_new(hostports,
                                  json_pack("{s:s,s:i}", "addr", t, "port", n->hostport[k].port));
        }
        if (!hostports || json_object_set_new(o, "hostports", hostports) < 0) {
            json_decref(o);
            o = NULL;
        }
    }
    return o;
}

int local_net_from_json(const json_t *j, struct local_net *n)
{
    const char *mode = NULL, *ifname = NULL, *host = NULL, *addr = NULL;
    json_t *allow = NULL, *local = NULL, *hostports, *v;
    json_int_t slot = -1;
    size_t k;
    int m;

    memset(n, 0, sizeof(*n));
    n->slot = -1;
    if (!j || json_is_null(j))
        return 0;
    if (json_unpack((json_t *)j, "{s:s,s:I,s:s,s:s,s:s,s?o,s?o}", "mode", &mode, "slot", &slot,
                    "ifname", &ifname, "host", &host, "addr", &addr, "allow", &allow, "local",
                    &local) < 0)
        return -EINVAL;
    for (m = 1; m < LOCAL_NET_MODES && strcmp(mode, mode_names[m]); m++)
        ;
    if (m == LOCAL_NET_MODES || slot < 0 || slot >= (json_int_t)MAX_SLOTS ||
        strlen(ifname) >= sizeof(n->ifname) || !addr_parse(host, &n->host_addr) ||
        !addr_parse(addr, &n->sbx_addr) || json_array_size(allow) > LOCAL_NET_MAX_ALLOW ||
        json_array_size(local) > LOCAL_NET_MAX_LOCAL)
        return -EINVAL;
    n->mode = (enum local_net_mode)m;
    n->slot = (int32_t)slot;
    snprintf(n->ifname, sizeof(n->ifname), "%s", ifname);
    json_array_foreach(allow, k, v) {
        if (!addr_parse(json_string_value(v), &n->allow[n->n_allow++]))
            return -EINVAL;
    }
    json_array_foreach(local, k, v) {
        json_int_t port = 0;
        const char *target = NULL;

        if (json_unpack(v, "{s:I,s:s}", "port", &port, "target", &target) < 0 || port < 1 ||
            port > 65535 || !addr_parse(target, &n->local[n->n_local].target))
            return -EINVAL;
        n->local[n->n_local++].port = (uint16_t)port;
    }
    hostports = json_object_get(j, "hostports");
    if (json_array_size(hostports) > LOCAL_NET_MAX_LOCAL)
        return -EINVAL;
    json_array_foreach(hostports, k, v) {
        json_int_t port = 0;
        const char *target = NULL;

        if (json_unpack(v, "{s:s,s:I}", "addr", &target, "port", &port) < 0 || port < 1 ||
            port > 65535 || !addr_parse(target, &n->hostport[n->n_hostport].addr))
            return -EINVAL;
        n->hostport[n->n_hostport++].port = (uint16_t)port;
    }
    return 0;
}

void local_net_release(struct local_net *n)
{
    free(n->hosts_text);
    n->hosts_text = NULL;
}
