/*
 * net.h - the local provider's per-sandbox network (private to src/provider/local/; made by
 * net.c, net_nft.c, net_policy.c and net_link.c, which share net_internal.h).
 *
 * A sandbox that asks for a network (model_only, model_and_tools, or inherit with
 * [network] inherit = nat) gets one veth pair: the host end "lb<13 chars>" (named from a hash
 * of the sandbox id, so a stop can find it from the id alone) with the even address of a /31
 * taken from [network] range, the other end moved into the sandbox's network namespace by the
 * init's pid, renamed eth0, with the odd address and a default route through the host end.
 * Links are made with libnl-route-3; the sandbox's side is configured from a short-lived
 * thread that setns()es into the sandbox's netns (the daemon is root of the initial user
 * namespace, so it has CAP_NET_ADMIN over every sandbox's netns).
 *
 * Policy lives on the host side only, in the nftables table "inet <[network] nft_table>"
 * (libnftables): static rules that look up sets keyed by the host end's interface name, so
 * installing or removing one sandbox's policy is a handful of set elements (cost independent
 * of how many sandboxes live) and the sandbox's own root, which has no capability in the
 * host's network namespace, can change none of it. Refused destinations get REJECT (TCP reset
 * or ICMP admin-prohibited), never a silent drop. DNS (port 53) is refused everywhere, IPv6 is
 * closed (the host end has IPv6 disabled and the rules reject it), the daemon's API port is
 * refused on every host address.
 *
 * A server on the daemon host's loopback (model_server http://127.0.0.1:8000) is reachable as
 * host.lendbox.internal (the host end's address, written into the sandbox's /etc/hosts): its
 * listed TCP ports are DNATed to the loopback address, with route_localnet set on that one
 * interface; other ports of the host end are refused.
 *
 * Crash safety: the slot (the /31) is recorded in the sandbox's descriptor before any link or
 * rule exists, and the provider marks the slots of every descriptor it finds at start, so no
 * two live sandboxes share an address after a kill -9 mid-seed. Teardown is idempotent (a link
 * already gone, elements already deleted are success).
 */
#ifndef LB_PROVIDER_LOCAL_NET_H
#define LB_PROVIDER_LOCAL_NET_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "provider/local/local.h"
#include "provider/provider.h"

#define LOCAL_NET_MAX_ALLOW 64
#define LOCAL_NET_MAX_LOCAL 32
#define LOCAL_NET_HOST_NAME "host.lendbox.internal"

enum local_net_mode {
    LOCAL_NET_NONE = 0, /* loopback only: no link at all */
    LOCAL_NET_MODEL_ONLY,
    LOCAL_NET_MODEL_AND_TOOLS,
    LOCAL_NET_NAT,
    LOCAL_NET_MODES
};

/* One sandbox's network, as recorded in its descriptor ("net"). Addresses in host order. */
struct local_net {
    enum local_net_mode mode;
    int32_t slot;    /* index of the /31 in the range; -1: none */
    char ifname[16]; /* host end */
    uint32_t host_addr, sbx_addr;
    uint32_t allow[LOCAL_NET_MAX_ALLOW]; /* allowed IPv4 destinations, every port */
    size_t n_allow;
    struct {
        uint16_t port;
        uint32_t target;          /* loopback address the port is forwarded to */
    } local[LOCAL_NET_MAX_LOCAL]; /* host.lendbox.internal ports */
    size_t n_local;
    struct {
        uint32_t addr; /* a non-loopback address of the daemon's host */
        uint16_t port;
    } hostport[LOCAL_NET_MAX_LOCAL]; /* allowed (address, TCP port) pairs on the host itself */
    size_t n_hostport;
    char *hosts_text; /* /etc/hosts for the sandbox, only between prepare and create */
};

struct local_provider;
struct local_net_host;

/* Set up the network part of the provider: parse the range, make the nftables table and its
 * static rules (keeping the sets, so sandboxes of an earlier run keep their policy). A host
 * without nftables or CAP_NET_ADMIN is no error: networked seeds then answer -EOPNOTSUPP with
 * the reason. -EINVAL for a bad range or inherit value, -ENOMEM. */
int local_net_init(struct local_provider *lp, const struct lb_local_net_config *cfg,
                   struct lb_error *err);
void local_net_destroy(struct local_provider *lp);

/* Decide the sandbox's network from req: resolve the model and tool servers (getaddrinfo;
 * URLs through libcurl's URL parser), check it can be enforced, take a slot, and prepare the
 * /etc/hosts text. n is filled (mode LOCAL_NET_NONE when no link is needed). -EOPNOTSUPP
 * (422) with what is missing, -EINVAL for a malformed server, -EUSERS when the range is full.
 * On success with a slot, the caller owns it (local_net_free_slot) and n->hosts_text. */
int local_net_prepare(struct local_provider *lp, const char *id,
                      const struct lb_network_request *req, struct local_net *n,
                      struct lb_error *err);

/* Write n->hosts_text to <dir>/hosts (0644) and put its path in path (size bytes); path ""
 * when the sandbox keeps the image's /etc/hosts. */
int local_net_write_hosts(const struct local_net *n, const char *dir, char *path, size_t size,
                          struct lb_error *err);

/* Install the policy, make the veth pair, move one end into the netns of pid and configure
 * both ends. -EREMOTEIO on failure (the caller tears down). */
int local_net_attach(struct local_provider *lp, const struct local_net *n, pid_t pid,
                     struct lb_error *err);

/* Remove the link and every rule element of the sandbox; idempotent. Without a recorded
 * network, still removes a link named from id. */
int local_net_detach(struct local_provider *lp, const char *id, const struct local_net *n,
                     struct lb_error *err);

/* Mark n's slot used (a descriptor found on disk) / give it back. */
void local_net_mark_slot(struct local_provider *lp, const struct local_net *n);
void local_net_free_slot(struct local_provider *lp, const struct local_net *n);

/* "http://<sandbox address>:<port>" for a sandbox with a link; -ENOSYS without one. */
int local_net_endpoint(const struct local_net *n, int port, char **url_out, struct lb_error *err);

/* Descriptor form; NULL from to_json means "no network" (or out of memory when mode != NONE).
 * from_json of NULL gives mode NONE. -EINVAL when malformed. */
json_t *local_net_to_json(const struct local_net *n);
int local_net_from_json(const json_t *j, struct local_net *n);
void local_net_release(struct local_net *n);

#endif
