/*
 * clock.h - time helpers. Wall-clock times are Unix seconds (int64_t); intervals use the
 * monotonic clock in milliseconds. Thread-safe.
 */
#ifndef LB_CLOCK_H
#define LB_CLOCK_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* Wall clock, Unix seconds. */
int64_t clock_now_s(void);
/* Monotonic clock, milliseconds since an arbitrary origin. */
int64_t clock_mono_ms(void);
/* Sleep ms milliseconds (<= 0: not at all), resumed after signals. Thread-safe. */
void clock_sleep_ms(int64_t ms);
/* The CLOCK_REALTIME time ms milliseconds (>= 0) from now: the deadline pthread_cond_timedwait
 * takes for a condition variable on the default clock. */
struct timespec clock_realtime_after_ms(int64_t ms);
/* Format Unix seconds as RFC 3339 UTC ("2026-11-29T08:34:01Z") into out (>= 21 bytes). */
void clock_format_rfc3339(int64_t unix_s, char *out, size_t out_len);
/* A time as the API renders times: RFC 3339 UTC as a JSON string, JSON null for <= 0. A new
 * reference; NULL only without memory. */
json_t *clock_json_rfc3339(int64_t unix_s);

#endif
