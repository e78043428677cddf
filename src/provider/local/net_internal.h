/*
 * net_internal.h - what the files of the local provider's network share (private to net.c,
 * net_nft.c, net_policy.c and net_link.c; the rest of the provider sees net.h only): the
 * network host, the address helpers, the nftables runner and what else more than one of them
 * uses. net_nft.c is their base: it calls none of the other three.
 */
#ifndef LB_PROVIDER_LOCAL_NET_INTERNAL_H
#define LB_PROVIDER_LOCAL_NET_INTERNAL_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "provider/local/net.h"

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

/* a (host order) in dotted-quad form into buf. */
static inline void local_net_addr_text(uint32_t a, char buf[INET_ADDRSTRLEN])
{
    struct in_addr in = {.s_addr = htonl(a)};

    inet_ntop(AF_INET, &in, buf, INET_ADDRSTRLEN);
}

/* s parsed into *out (host order); false when it is not an IPv4 address or NULL. */
static inline bool local_net_addr_parse(const char *s, uint32_t *out)
{
    struct in_addr in;

    if (!s || inet_pton(AF_INET, s, &in) != 1)
        return false;
    *out = ntohl(in.s_addr);
    return true;
}

/* ---- net.c -------------------------------------------------------------------------------- */
/* The host end's interface name of sandbox id: "lb" + 13 base32 characters of a 64-bit FNV-1a
 * hash, so a stop finds the link from the id alone. */
void local_net_ifname(const char *id, char out[16]);
/* Take a free /31 of the range into n->slot (next fit) and count it in n->mode's gauge.
 * -EUSERS when the range is full. Thread-safe (h->lock). */
int local_net_slot_alloc(struct local_net_host *h, struct local_net *n);

/* ---- net_nft.c ---------------------------------------------------------------------------- */
/* Run one nft script (a transaction; cmds NULL: none), making the table and its static rules
 * first if this is their first use. 0, or -EREMOTEIO with nft's first error line in err.
 * Thread-safe (h->nft_lock). */
int local_net_nft_run(struct local_net_host *h, const char *cmds, struct lb_error *err);
/* Append the element commands of n (verb "add" or "delete") to buf (size bytes, from *off,
 * which advances). 0, or -ENOSPC when they do not fit. */
int local_net_nft_elements(struct local_net_host *h, const struct local_net *n, const char *verb,
                           char *buf, size_t size, size_t *off);

#endif
