/*
 * auth.h - who a bearer token is: the admin (its SHA-256 equals the admin token's) or the
 * operate token of one sandbox (its hash is in that sandbox's record). Compares are constant
 * time (util/token.h); only hashes are kept.
 *
 * Thread-safety: auth_authorize may run on any thread at once; it reads the store, never a
 * provider, so it is fine on an HTTP thread.
 */
#ifndef LB_AUTH_H
#define LB_AUTH_H

#include "http/http.h"
#include "store/store.h"
#include "util/error.h"

struct lb_auth;

/* admin_token_hash: hex SHA-256 of the admin token (copied). st stays the caller's and must
 * outlive the result. *out the caller's (auth_free). -EINVAL for a malformed hash, -ENOMEM. */
int auth_new(const char *admin_token_hash, struct lb_store *st, struct lb_auth **out,
             struct lb_error *err);
void auth_free(struct lb_auth *a);

/* The http layer's authorize hook (lb_authorize_fn) over auth (a struct lb_auth): 0 and *who,
 * -ENOKEY (401) for a missing or unknown token, -EACCES (403) for an operate token on an admin
 * route or on another sandbox. For LB_AUTH_SESSION routes sandbox_id is the path's resources
 * session id: the operate token of the session's live sandbox passes, or (when the session has
 * no live sandbox) that of any sandbox the session had; another operate token is -EACCES. */
int auth_authorize(void *auth, const char *token, enum lb_auth_need need, const char *sandbox_id,
                   enum lb_principal *who, struct lb_error *err);

#endif
