/*
 * lend_internal.h - what lending shares with the services beside it: the sweeper
 * (src/sweeper/), the warm pool (src/warm/) and activations (activation.c): the store and
 * providers it works on, the session locks, the one way a recorded sandbox is stopped, and the
 * pieces of a seed the pool repeats (resources, spec, image check, lease). Routes and main use
 * lend.h; the files of the lending service itself share lend_private.h.
 *
 * Thread-safety: as lend.h; the accessors return what lend_new was given, unchanged for the
 * lending service's life.
 */
#ifndef LB_LEND_INTERNAL_H
#define LB_LEND_INTERNAL_H

#include <stdbool.h>

#include "lend/lend.h"
#include "provider/registry.h"
#include "store/store.h"

/* The store, the enabled providers and the (copied) config of l. Borrowed. */
struct lb_store *lend_store(struct lb_lend *l);
struct lb_registry *lend_providers(struct lb_lend *l);
const struct lb_lend_config *lend_config(struct lb_lend *l);

/* One resources session's lock (seed, release, delete and sweeper stops of a session run one
 * at a time). */
struct lend_session_lock;

/* Take the session's lock, waiting at most session_lock_wait_s (try_only: not at all): no
 * request waits without bound behind another that holds it (a stop is bounded by
 * stop_timeout_s, but a holder may be stuck in ways nobody foresaw). *out is the held lock.
 * -EBUSY (409) past the bound, -ENOMEM; err may be NULL. */
int lend_session_lock(struct lb_lend *l, const char *rsid, bool try_only,
                      struct lend_session_lock **out, struct lb_error *err);
/* Release a lock lend_session_lock took; NULL-safe. */
void lend_session_unlock(struct lb_lend *l, struct lend_session_lock *s);

/* The provider that made the sandbox of record r (borrowed), or NULL with -EREMOTEIO in err
 * when it is not enabled on this daemon (the record is kept; its stops are retried). */
struct lb_provider *lend_provider_of(struct lb_lend *l, const struct lb_record *r,
                                     struct lb_error *err);

/* Stop the sandbox of record r: record "stopping" (with reason; NULL keeps the earlier one),
 * its provider's stop, record "stopped"; when the stop fails, record fail_state
 * (stop_failed/failed_seed) with the error and the next retry's time (backoff) and return
 * -EREMOTEIO. The caller holds the session's lock when r has a session and may race a seed. */
int lend_stop_record(struct lb_lend *l, const struct lb_record *r, const char *reason,
                     enum lb_record_state fail_state, struct lb_error *err);

/* ---- for warm pools (src/warm/) ---- */

/* What a warm pool does for lending. take: serve a seed (the session's lock held, spec checked,
 * image and TTL resolved) from the pool: 0 with *lease_out, -ENOENT for a miss (nothing set;
 * the seed starts a sandbox), or the seed's error. evict: stop one warm sandbox to make room for
 * a seed at max_sandboxes: 0 if one was stopped. Both thread-safe. */
struct lend_pool_hooks {
    int (*take)(void *ctx, const char *rsid, const struct lb_seed_request *req,
                struct lb_provider *prov, const char *image, int64_t ttl_s, json_t **lease_out,
                struct lb_error *err);
    int (*evict)(void *ctx);
    void *ctx;
};
/* The image a seed of provider prov that names none runs on now (what lend_seed resolves): the
 * first name of the provider's default image list, else of lending.default_image, that is
 * "host" or present in the image store, else the list's first name. Written into buf (size
 * bytes, LB_IMAGE_NAME_MAX + 1 is enough) and returned. Reads the image store: the answer
 * changes when an image of the list is imported or removed. */
const char *lend_resolve_default_image(struct lb_lend *l, struct lb_provider *prov, char *buf,
                                       size_t size);
/* Set (or with NULL clear) the pool's hooks; once, before serving or after the pool stopped. */
void lend_set_pool(struct lb_lend *l, const struct lend_pool_hooks *hooks);

/* The hex SHA-256 of sandbox id's operate token into hash (LB_TOKEN_HASH_HEX + 1 bytes); lend
 * is a struct lb_lend * (an lb_store_token_hash_fn). 0 or < 0. */
int lend_operate_token_hash(void *lend, const char *id, char *hash);
/* The lease of record r (API.md); a new reference, NULL without memory. */
json_t *lend_render_lease(struct lb_lend *l, const struct lb_record *r, bool reused);
/* The spec the record of a seed keeps (image, workdir, env, network, labels, ports, resources
 * with disk_mib); a new reference, NULL without memory. */
json_t *lend_spec_json(struct lb_lend *l, const struct lb_seed_request *req, const char *image,
                       int64_t disk_mib);
/* An imported image's User and digest into spec (image_user, image_digest); -EOPNOTSUPP (422)
 * for an image whose User is not mapped. For the local provider's sandboxes only. */
int lend_image_check(struct lb_lend *l, const char *image, json_t *spec, struct lb_error *err);
/* Check a seed's resources against the daemon's limits and fill in the defaults (pids, disk)
 * the provider can enforce. -EINVAL (400) past limits.max_disk_mib. */
int lend_check_resources(struct lb_lend *l, struct lb_provider *prov, struct lb_resources *res,
                         struct lb_error *err);

#endif
