/* log.c - see log.h. */
#include "util/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <systemd/sd-journal.h>
#include <time.h>
#include <unistd.h>

static atomic_int log_level = LB_LOG_INFO;
static atomic_int log_prefix = -1; /* 0 plain, 1 "<N>" lines, 2 journal; -1: decide on first use */

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

/* Is stderr the stream systemd connected to the journal? $JOURNAL_STREAM is "DEV:INODE" of it;
 * a stderr redirected elsewhere by a child of the service does not match. */
static bool stderr_is_journal(void)
{
    const char *e = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;

    if (!e || sscanf(e, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
        return false;
    return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

/* One structured journal entry; 0 or negative errno (then the caller writes to stderr). */
static int log_journal(enum lb_log_level level, const char *request_id, const char *sandbox_id,
                       const char *msg)
{
    char prio[16], *fields[5] = {0};
    struct iovec iov[5];
    int n = 0, r = 0;

    snprintf(prio, sizeof(prio), "PRIORITY=%d", (int)level);
    if (asprintf(&fields[n++], "MESSAGE=%s", msg) < 0 ||
        (request_id && asprintf(&fields[n++], "LB_REQUEST_ID=%s", request_id) < 0) ||
        (sandbox_id && asprintf(&fields[n++], "LB_SANDBOX_ID=%s", sandbox_id) < 0)) {
        fields[n - 1] = NULL;
        r = -ENOMEM;
        goto out;
    }
    for (int i = 0; i < n; i++)
        iov[i] = (struct iovec){fields[i], strlen(fields[i])};
    iov[n++] = (struct iovec){prio, strlen(prio)};
    iov[n++] = (struct iovec){(char *)"SYSLOG_IDENTIFIER=lendboxd", 26};
    r = sd_journal_sendv(iov, n);
out:
    for (int i = 0; i < 5; i++)
        free(fields[i]);
    return r;
}

static void log_write(enum lb_log_level level, const char *request_id, const char *sandbox_id,
                      const char *fmt, va_list ap)
{
    static const char *const names[8] = {"", "", "", "error", "warn", "", "info", "debug"};
    char msg[2048], line[2112];
    int n, mode = atomic_load(&log_prefix);

    if (mode < 0) {
        mode = stderr_is_journal() ? 2 : 0;
        atomic_store(&log_prefix, mode);
    }
    if (vsnprintf(msg, sizeof(msg), fmt, ap) < 0)
        return;
    if (mode == 2 && log_journal(level, request_id, sandbox_id, msg) == 0)
        return;
    if (mode != 0) {
        n = snprintf(line, sizeof(line), "<%d>%s\n", (int)level, msg);
    } else {
        struct timespec ts;
        struct tm tm;

        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s lendboxd: %s\n",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                     ts.tv_nsec / 1000000, names[level & 7], msg);
    }
    if (n < 0)
        return;
    if (n >= (int)sizeof(line)) {
        n = (int)sizeof(line) - 1;
        line[n - 1] = '\n';
    }
    (void)!write(STDERR_FILENO, line, (size_t)n);
}

/* log_write unless level is filtered out; errno is left as the caller had it. */
static void log_emit(enum lb_log_level level, const char *request_id, const char *sandbox_id,
                     const char *fmt, va_list ap)
{
    int saved = errno;

    if ((int)level <= atomic_load(&log_level))
        log_write(level, request_id, sandbox_id, fmt, ap);
    errno = saved;
}

void lb_log(enum lb_log_level level, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    log_emit(level, NULL, NULL, fmt, ap);
    va_end(ap);
}

void lb_log_ids(enum lb_log_level level, const char *request_id, const char *sandbox_id,
                const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    log_emit(level, request_id, sandbox_id, fmt, ap);
    va_end(ap);
}
