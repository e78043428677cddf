/*
 * log.h - leveled logging to stderr.
 *
 * Lines go to stderr. Under systemd (JOURNAL_STREAM set, or log_set_syslog_prefix(true)) each line
 * starts with a syslog "<N>" priority prefix, which journald turns into the entry's priority;
 * otherwise with an ISO-8601 UTC time and the level name. Thread-safe: one write(2) per line.
 */
#ifndef LB_LOG_H
#define LB_LOG_H

#include <stdbool.h>

enum lb_log_level {
    LB_LOG_ERROR = 3, /* syslog LOG_ERR */
    LB_LOG_WARN = 4,  /* LOG_WARNING */
    LB_LOG_INFO = 6,  /* LOG_INFO */
    LB_LOG_DEBUG = 7, /* LOG_DEBUG */
};

/* Parse "error", "warn"/"warning", "info", "debug". Returns 0 or -EINVAL. */
int log_parse_level(const char *name, enum lb_log_level *out);
void log_set_level(enum lb_log_level level);
enum lb_log_level log_get_level(void);
/* Force (or forbid) the "<N>" prefix; the default follows $JOURNAL_STREAM. */
void log_set_syslog_prefix(bool on);

void lb_log(enum lb_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) lb_log(LB_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) lb_log(LB_LOG_WARN, __VA_ARGS__)
#define log_info(...) lb_log(LB_LOG_INFO, __VA_ARGS__)
#define log_debug(...)                                                                             \
    do {                                                                                           \
        if (log_get_level() >= LB_LOG_DEBUG)                                                       \
            lb_log(LB_LOG_DEBUG, __VA_ARGS__);                                                     \
    } while (0)

#endif
