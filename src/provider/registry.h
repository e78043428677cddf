/*
 * registry.h - the kinds of provider this build has, and the providers one daemon runs.
 *
 * A provider kind is one row of registry.c's table: its name (what `[provider] name` and
 * `[provider] enabled` name, what a seed's "provider" names and what every record stores), the
 * config section its keys live in, and a constructor that maps the daemon's configuration to
 * its own and opens it. Registering a new provider is one row there plus its keys in
 * util/config.c's table (see provider.h, "Adding a provider").
 *
 * The daemon opens the default provider and every enabled one into a struct lb_registry at
 * start (registry_open); each is behind the fault-injection switch (provider/fault.h, points
 * provider.*). Lending picks the provider of a new sandbox with registry_choose and sends every
 * later call on a sandbox to the provider its record names (registry_get).
 *
 * Thread-safety: a registry is read-only once opened: every function but registry_add,
 * registry_open and registry_free may be called from any thread.
 */
#ifndef LB_PROVIDER_REGISTRY_H
#define LB_PROVIDER_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>

#include "provider/provider.h"
#include "util/config.h"
#include "util/error.h"

struct lb_registry;

/* What a constructor gets beside the configuration: things the daemon resolved at start. */
struct lb_provider_env {
    const struct lb_config *cfg;      /* the daemon's whole configuration, read-only */
    const char *supervise_path;       /* the static lendbox-supervise binary (absolute) */
    const char *images_dir;           /* the image store (image/image.h) */
    int api_port;                     /* the daemon's API port, to refuse to sandboxes; 0: none */
    const struct lb_registry *opened; /* the providers opened before this one (table order) */
};

struct lb_provider_kind {
    const char *name;    /* "local", "docker", ...: [a-z0-9_]+, < 32 bytes */
    const char *section; /* the config section of its keys ("local"); NULL: none */
    /* Open a provider from env (nothing of env is kept but what it copies). On success *out is
     * the caller's (provider_destroy). Errors: -EINVAL for a bad key value, -ENOENT for a
     * missing program or socket, -EREMOTEIO when the backend does not answer, -ENOMEM. */
    int (*open)(const struct lb_provider_env *env, struct lb_provider **out, struct lb_error *err);
    bool fault_wrapped; /* open's provider is already behind the fault switch (kind "fault") */
    /* `lendboxd image import --provider NAME`: publish an image of len bytes at fd (from its
     * offset 0) to the backend under alias, up to timeout_ms; p is a provider this kind
     * opened; its id into fingerprint. NULL when the kind has no image store of its own. Today
     * lxd's: provider_lxd_image_publish (lxd.h) says what it takes and returns. */
    int (*image_publish)(struct lb_provider *p, int fd, uint64_t len, const char *alias,
                         int64_t timeout_ms, char *fingerprint, size_t size, struct lb_error *err);
};

/* The kind named name, or NULL. The returned row is static. */
const struct lb_provider_kind *registry_find_kind(const char *name);

/* The names of every kind of this build, ", "-separated, into buf (for messages). */
void registry_kind_names(char *buf, size_t len);

/* Which providers to open: the default (first) and the enabled list (names separated by
 * spaces or commas; NULL or "" for none; the default may be listed again; a repeat is
 * ignored). *names_out is a new NULL-terminated array of new strings (free with
 * registry_names_free), *n_out its length. -EINVAL naming an unknown provider (and the ones
 * this build has), -ENOMEM. */
int registry_parse_enabled(const char *default_name, const char *enabled, char ***names_out,
                           size_t *n_out, struct lb_error *err);
void registry_names_free(char **names);

/* An empty registry (*out the caller's, free with registry_free). -ENOMEM. */
int registry_new(struct lb_registry **out);

/* Add an opened provider, taking ownership (also on failure): the first added is the default.
 * -EEXIST for a second provider of the same name, -EINVAL for a provider whose ops are not
 * LB_PROVIDER_OPS_VERSION, -ENOMEM. Not thread-safe: only while setting up. */
int registry_add(struct lb_registry *reg, struct lb_provider *prov, struct lb_error *err);

/* Open the daemon's providers: env->cfg's [provider] name (the default, registry_default) and
 * [provider] enabled, in the table's order, each behind the fault switch. env->opened is set by
 * this function. Errors as registry_parse_enabled and the kinds' open; nothing stays open on
 * failure. */
int registry_open(const struct lb_provider_env *env, struct lb_registry **out,
                  struct lb_error *err);

/* The provider of that name, or NULL if it is not enabled. Borrowed: lives as long as reg. */
struct lb_provider *registry_get(const struct lb_registry *reg, const char *name);
/* The default provider (NULL for an empty registry). Borrowed. */
struct lb_provider *registry_default(const struct lb_registry *reg);
/* How many providers, and the i-th (borrowed; the default is 0). */
size_t registry_count(const struct lb_registry *reg);
struct lb_provider *registry_at(const struct lb_registry *reg, size_t i);

/* The provider for a new sandbox: the default when requested is NULL, else the enabled one of
 * that name. -EOPNOTSUPP (422) naming the enabled providers when it is unknown or not
 * enabled. *out borrowed. */
int registry_choose(const struct lb_registry *reg, const char *requested, struct lb_provider **out,
                    struct lb_error *err);

/* provider_end_execs on every provider; returns how many execs were ended. */
int registry_end_execs(const struct lb_registry *reg);

/* Destroy every provider (last first) and the registry; NULL-safe. Sandboxes keep running. */
void registry_free(struct lb_registry *reg);

/* provider_defer_cleanup on every provider: call right before the shutdown sweep. */
void registry_defer_cleanup(const struct lb_registry *reg);

/* For the fault switch host.keyrings: make the kernel keyring calls fail with EPERM for this
 * whole process and everything it starts, as a container's default seccomp filter does to a
 * daemon in it (the local provider's seccomp_refuse_keyrings_to_self, named here so that only
 * registry.c includes a backend's header). Irreversible; call before any thread or sandbox
 * exists. 0, or -EIO with the reason in err. */
int registry_refuse_keyrings_to_self(struct lb_error *err);

#endif
