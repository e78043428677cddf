/* log.c - see log.h. */
#include "util/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = LB_LOG_INFO;
static atomic_int log_prefix = -1; /* -1: decide from $JOURNAL_STREAM on first use */

int log_parse_level(const char *name, enum lb_log_level *out)
{
    static const struct {
        const char *name;
        enum lb_log_level level;
    } names[] = {{"error", LB_LOG_ERROR},
                 {"warn", LB_LOG_WARN},
                 {"warning", LB_LOG_WARN},
                 {"info", LB_LOG_INFO},
                 {"debug", LB_LOG_DEBUG}};

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (strcasecmp(name, names[i].name) == 0) {
            *out = names[i].level;
            return 0;
        }
    }
    return -EINVAL;
}

void log_set_level(enum lb_log_level level)
{
    atomic_store(&log_level, (int)level);
}

enum lb_log_level log_get_level(void)
{
    return (enum lb_log_level)atomic_load(&log_level);
}

void log_set_syslog_prefix(bool on)
{
    atomic_store(&log_prefix, on ? 1 : 0);
}

void lb_log(enum lb_log_level level, const char *fmt, ...)
{
    static const char *const names[8] = {"", "", "", "error", "warn", "", "info", "debug"};
    char line[2048];
    int n = 0, saved = errno;
    va_list ap;

    if ((int)level > atomic_load(&log_level))
        return;
    if (atomic_load(&log_prefix) < 0)
        atomic_store(&log_prefix, getenv("JOURNAL_STREAM") ? 1 : 0);
    if (atomic_load(&log_prefix) == 1) {
        n = snprintf(line, sizeof(line), "<%d>", (int)level);
    } else {
        struct timespec ts;
        struct tm tm;

        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        n = snprintf(line, sizeof(line),
                     "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s lendboxd: ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, names[level & 7]);
    }
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    (void)!write(STDERR_FILENO, line, (size_t)n);
    errno = saved;
}
