/*
 * log.h - leveled logging to the journal or stderr.
 *
 * When stderr is connected to the journal ($JOURNAL_STREAM names stderr's device and inode, as
 * systemd sets it for a service), each event is sent with libsystemd's sd_journal_sendv as one
 * structured entry: MESSAGE, PRIORITY (syslog: 3 error, 4 warn, 6 info, 7 debug),
 * SYSLOG_IDENTIFIER=lendboxd, and LB_REQUEST_ID / LB_SANDBOX_ID when the caller names them
 * (journalctl LB_SANDBOX_ID=sbx-... finds one sandbox's story). If the journal refuses an entry,
 * the line goes to stderr with a "<N>" priority prefix instead. Otherwise lines go to stderr,
 * starting with an ISO-8601 UTC time and the level name (log_set_syslog_prefix(true) forces the
 * "<N>" form). Thread-safe: one sendmsg or one write(2) per event.
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
/* The same, with the request id and/or sandbox id the event is about (either may be NULL): in
 * the journal they become the LB_REQUEST_ID and LB_SANDBOX_ID fields; on stderr only the
 * message is written, so put what a reader needs into it too. */
void lb_log_ids(enum lb_log_level level, const char *request_id, const char *sandbox_id,
                const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* log_LEVEL_sbx(sandbox_id, fmt, ...) and log_LEVEL_req(request_id, fmt, ...) */
#define log_error_sbx(sbx, ...) lb_log_ids(LB_LOG_ERROR, NULL, (sbx), __VA_ARGS__)
#define log_warn_sbx(sbx, ...) lb_log_ids(LB_LOG_WARN, NULL, (sbx), __VA_ARGS__)
#define log_info_sbx(sbx, ...) lb_log_ids(LB_LOG_INFO, NULL, (sbx), __VA_ARGS__)
#define log_debug_sbx(sbx, ...)                                                                    \
    do {                                                                                           \
        if (log_get_level() >= LB_LOG_DEBUG)                                                       \
            lb_log_ids(LB_LOG_DEBUG, NULL, (sbx), __VA_ARGS__);                                    \
    } while (0)
#define log_error_req(rid, ...) lb_log_ids(LB_LOG_ERROR, (rid), NULL, __VA_ARGS__)
#define log_debug_req(rid, ...)                                                                    \
    do {                                                                                           \
        if (log_get_level() >= LB_LOG_DEBUG)                                                       \
            lb_log_ids(LB_LOG_DEBUG, (rid), NULL, __VA_ARGS__);                                    \
    } while (0)

#define log_error(...) lb_log(LB_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) lb_log(LB_LOG_WARN, __VA_ARGS__)
#define log_info(...) lb_log(LB_LOG_INFO, __VA_ARGS__)
#define log_debug(...)                                                                             \
    do {                                                                                           \
        if (log_get_level() >= LB_LOG_DEBUG)                                                       \
            lb_log(LB_LOG_DEBUG, __VA_ARGS__);                                                     \
    } while (0)

#endif
