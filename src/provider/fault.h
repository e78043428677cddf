/*
 * fault.h (provider) - a provider that wraps another and injects the named faults of
 * util/fault.h before each operation (provider.create, provider.stop, ...). Injected failures
 * are reported as provider failures (-EREMOTEIO / -ETIMEDOUT), exactly as a real one would be.
 */
#ifndef LB_PROVIDER_FAULT_H
#define LB_PROVIDER_FAULT_H

#include "provider/provider.h"

/* Wrap inner (the wrapper takes ownership: destroying it destroys inner). create_timeout_ms
 * bounds a hanging create. *out owned by the caller. -ENOMEM. */
int provider_fault_wrap(struct lb_provider *inner, int64_t create_timeout_ms,
                        struct lb_provider **out);

#endif
