/* auth.c - see auth.h. */
#include "auth/auth.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "util/token.h"

struct lb_auth {
    char admin_token_hash[LB_SHA256_HEX + 1];
    struct lb_store *store;
};

int auth_new(const char *admin_token_hash, struct lb_store *st, struct lb_auth **out,
             struct lb_error *err)
{
    struct lb_auth *a;

    *out = NULL;
    if (!admin_token_hash || strlen(admin_token_hash) != LB_SHA256_HEX)
        return lb_error_set(err, -EINVAL, "the admin token hash is not a hex SHA-256");
    a = calloc(1, sizeof(*a));
    if (!a)
        return lb_error_set(err, -ENOMEM, "out of memory");
    memcpy(a->admin_token_hash, admin_token_hash, LB_SHA256_HEX + 1);
    a->store = st;
    *out = a;
    return 0;
}

void auth_free(struct lb_auth *a)
{
    free(a);
}

/* LB_AUTH_SESSION: the operate token (hash) of the session's live sandbox, or, when the
 * session has none, of any sandbox the session had (its last activation stays readable to the
 * agent that ran it). */
static int auth_authorize_session(struct lb_auth *a, const char *hash, const char *rsid,
                                  enum lb_principal *who, struct lb_error *err)
{
    struct lb_record mine = {0}, live = {0};
    int r = store_get_by_token_hash(a->store, hash, &mine, NULL);

    if (r < 0)
        return lb_error_set(err, -ENOKEY, "unknown bearer token");
    if (rsid && mine.rsid && strcmp(mine.rsid, rsid) == 0 &&
        (store_get_live_by_rsid(a->store, rsid, &live, NULL) < 0 || strcmp(live.id, mine.id) == 0))
        *who = LB_PRINCIPAL_OPERATE;
    else
        r = lb_error_set(err, -EACCES,
                         "this operate token belongs to a sandbox not lent to session %s",
                         rsid ? rsid : "");
    store_record_release(&mine);
    store_record_release(&live);
    return r;
}

int auth_authorize(void *auth, const char *token, enum lb_auth_need need, const char *sandbox_id,
                   enum lb_principal *who, struct lb_error *err)
{
    struct lb_auth *a = auth;
    char hash[LB_SHA256_HEX + 1];
    struct lb_record rec = {0};
    int r;

    token_sha256_hex(token, strlen(token), hash);
    if (token_equal(hash, a->admin_token_hash)) {
        *who = LB_PRINCIPAL_ADMIN;
        return 0;
    }
    if (need == LB_AUTH_SESSION) /* sandbox_id is the path's resources session id */
        return auth_authorize_session(a, hash, sandbox_id, who, err);
    if (need == LB_AUTH_SANDBOX && sandbox_id &&
        store_get_sandbox(a->store, sandbox_id, &rec, NULL) == 0) {
        bool ok = rec.token_hash[0] && token_equal(hash, rec.token_hash);

        store_record_release(&rec);
        if (ok) {
            *who = LB_PRINCIPAL_OPERATE;
            return 0;
        }
    }
    r = store_get_by_token_hash(a->store, hash, &rec, NULL);
    store_record_release(&rec);
    if (r == 0)
        return lb_error_set(err, -EACCES,
                            need == LB_AUTH_ADMIN
                                ? "an operate token may not do this; it needs the admin token"
                                : "this operate token belongs to another sandbox");
    return lb_error_set(err, -ENOKEY, "unknown bearer token");
}
