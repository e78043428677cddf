/*
 * fault.h (provider) - a provider that wraps another and injects the named faults of
 * util/fault.h before each operation (provider.create, provider.stop, ...). Injected failures
 * are reported as provider failures (-EREMOTEIO / -ETIMEDOUT), exactly as a real one would be.
 */
#ifndef LB_PROVIDER_FAULT_H
#define LB_PROVIDER_FAULT_H

#include <stdbool.h>

#include "provider/provider.h"

/* Wrap inner (the wrapper takes ownership: destroying it destroys inner). create_timeout_ms
 * bounds a hanging create. *out owned by the caller. -ENOMEM. */
int provider_fault_wrap(struct lb_provider *inner, int64_t create_timeout_ms,
                        struct lb_provider **out);

/* The same wrapper under another name and with its own fault points ("<points>.create", ...,
 * e.g. "fault.exec"): the registry's "fault" provider is the local provider seen through one,
 * so that tests can run two providers side by side and fail one of them. owns_inner false:
 * destroying the wrapper leaves inner alone. name and points are copied (< 32 and < 16
 * bytes, else -EINVAL). -ENOMEM. */
int provider_fault_wrap_as(struct lb_provider *inner, int64_t create_timeout_ms, const char *name,
                           const char *points, bool owns_inner, struct lb_provider **out);

#endif
