/*
 * clock.h - time helpers. Wall-clock times are Unix seconds (int64_t); intervals use the
 * monotonic clock in milliseconds. Thread-safe.
 */
#ifndef LB_CLOCK_H
#define LB_CLOCK_H

#include <jansson.h>
#include <pthread.h>
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
/* Initialise the condition variable c (not yet initialised; destroyed by its owner with
 * pthread_cond_destroy) for deadlines on the monotonic clock: pthread_cond_timedwait on c takes
 * a CLOCK_MONOTONIC time, which a wall-clock step neither ends nor stretches. */
void clock_cond_init_mono(pthread_cond_t *c);
/* Format Unix seconds as RFC 3339 UTC ("2026-11-29T08:34:01Z") into out (>= 21 bytes). */
void clock_format_rfc3339(int64_t unix_s, char *out, size_t out_len);
/* A time as the API renders times: RFC 3339 UTC as a JSON string, JSON null for <= 0. A new
 * reference; NULL only without memory. */
json_t *clock_json_rfc3339(int64_t unix_s);

#endif
