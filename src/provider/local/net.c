/*
 * net.c - the local provider's network (see net.h): setting it up and tearing it down, the
 * slots of [network] range (one /31 per networked sandbox), and a sandbox's network in its
 * descriptor. The nftables table is in net_nft.c, deciding a sandbox's network from its request
 * in net_policy.c, its links in net_link.c (net_internal.h ties them together).
 */
#include "provider/local/net_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <nftables/libnftables.h>

#include "provider/local/local_internal.h"
#include "util/log.h"
#include "util/metrics.h"

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

        if (local_net_nft_run(h, NULL, &e) < 0)
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

int local_net_slot_alloc(struct local_net_host *h, struct local_net *n)
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
    if (*slash || p < 8 || p > 30 || !local_net_addr_parse(buf, &a))
        goto bad;
    mask = p == 0 ? 0 : ~0u << (32 - p);
    h->base = a & mask;
    h->prefix = (int)p;
    h->nslots = (1u << (32 - p)) / 2;
    if (h->nslots > MAX_SLOTS)
        h->nslots = MAX_SLOTS;
    local_net_addr_text(h->base, buf);
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

/* ---- interface names ------------------------------------------------------------------ */

void local_net_ifname(const char *id, char out[16])
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

/* ---- descriptor ----------------------------------------------------------------------- */

json_t *local_net_to_json(const struct local_net *n)
{
    char a[INET_ADDRSTRLEN], b[INET_ADDRSTRLEN];
    json_t *o, *allow, *local, *hostports;

    if (n->mode == LOCAL_NET_NONE)
        return NULL;
    local_net_addr_text(n->host_addr, a);
    local_net_addr_text(n->sbx_addr, b);
    allow = json_array();
    local = json_array();
    for (size_t k = 0; allow && k < n->n_allow; k++) {
        char t[INET_ADDRSTRLEN];

        local_net_addr_text(n->allow[k], t);
        json_array_append_new(allow, json_string(t));
    }
    for (size_t k = 0; local && k < n->n_local; k++) {
        char t[INET_ADDRSTRLEN];

        local_net_addr_text(n->local[k].target, t);
        json_array_append_new(local, json_pack("{s:i,s:s}", "port", n->local[k].port, "target", t));
    }
    o = json_pack("{s:s,s:i,s:s,s:s,s:s,s:o*,s:o*}", "mode", mode_names[n->mode], "slot",
                  (int)n->slot, "ifname", n->ifname, "host", a, "addr", b, "allow", allow, "local",
                  local);
    if (o && n->n_hostport) {
        hostports = json_array();
        for (size_t k = 0; hostports && k < n->n_hostport; k++) {
            char t[INET_ADDRSTRLEN];

            local_net_addr_text(n->hostport[k].addr, t);
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

/* One {"port": 1..65535, <addr_key>: "a.b.c.d"} of a descriptor's port lists. */
static bool port_addr_parse(json_t *v, const char *addr_key, uint16_t *port, uint32_t *addr)
{
    json_int_t p = 0;
    const char *a = NULL;

    if (json_unpack(v, "{s:I,s:s}", "port", &p, addr_key, &a) < 0 || p < 1 || p > 65535 ||
        !local_net_addr_parse(a, addr))
        return false;
    *port = (uint16_t)p;
    return true;
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
        strlen(ifname) >= sizeof(n->ifname) || !local_net_addr_parse(host, &n->host_addr) ||
        !local_net_addr_parse(addr, &n->sbx_addr) || json_array_size(allow) > LOCAL_NET_MAX_ALLOW ||
        json_array_size(local) > LOCAL_NET_MAX_LOCAL)
        return -EINVAL;
    n->mode = (enum local_net_mode)m;
    n->slot = (int32_t)slot;
    snprintf(n->ifname, sizeof(n->ifname), "%s", ifname);
    json_array_foreach(allow, k, v) {
        if (!local_net_addr_parse(json_string_value(v), &n->allow[n->n_allow++]))
            return -EINVAL;
    }
    json_array_foreach(local, k, v) {
        if (!port_addr_parse(v, "target", &n->local[k].port, &n->local[k].target))
            return -EINVAL;
    }
    n->n_local = json_array_size(local);
    hostports = json_object_get(j, "hostports");
    if (json_array_size(hostports) > LOCAL_NET_MAX_LOCAL)
        return -EINVAL;
    json_array_foreach(hostports, k, v) {
        if (!port_addr_parse(v, "addr", &n->hostport[k].port, &n->hostport[k].addr))
            return -EINVAL;
    }
    n->n_hostport = json_array_size(hostports);
    return 0;
}

void local_net_release(struct local_net *n)
{
    free(n->hosts_text);
    n->hosts_text = NULL;
}
