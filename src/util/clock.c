/* clock.c - see clock.h. */
#include "util/clock.h"

#include <errno.h>

#include <stdio.h>
#include <time.h>

int64_t clock_now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec;
}

int64_t clock_mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct timespec clock_realtime_after_ms(int64_t ms)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    return ts;
}

void clock_cond_init_mono(pthread_cond_t *c)
{
    pthread_condattr_t ca;

    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(c, &ca);
    pthread_condattr_destroy(&ca);
}

void clock_format_rfc3339(int64_t unix_s, char *out, size_t out_len)
{
    time_t t = (time_t)unix_s;
    struct tm tm;

    gmtime_r(&t, &tm);
    strftime(out, out_len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void clock_sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};

    if (ms <= 0)
        return;
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

json_t *clock_json_rfc3339(int64_t unix_s)
{
    char buf[32];

    if (unix_s <= 0)
        return json_null();
    clock_format_rfc3339(unix_s, buf, sizeof(buf));
    return json_string(buf);
}
