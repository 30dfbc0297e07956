/*
 * log.h - structured logging for kvcached and its library.
 *
 * One line per event on stderr: "<time> <level> <subsystem>: <message>".
 * Thread-safe (one write(2) per line). The level threshold is global and
 * may be changed at any time; messages below it cost one comparison.
 */
#ifndef KV_DAEMON_LOG_H
#define KV_DAEMON_LOG_H

#include <stdarg.h>

typedef enum { KV_LOG_DEBUG, KV_LOG_INFO, KV_LOG_WARN, KV_LOG_ERROR } kv_log_level;

extern int kv_log_threshold;  /* default KV_LOG_INFO */

void kv_log(kv_log_level lvl, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void kv_vlog(kv_log_level lvl, const char *subsys, const char *fmt, va_list ap);
/* Parses "debug|info|warn|error"; returns the level or -EINVAL. */
int kv_log_parse_level(const char *s);

#define kv_debug(sub, ...) do { if (kv_log_threshold <= KV_LOG_DEBUG) kv_log(KV_LOG_DEBUG, sub, __VA_ARGS__); } while (0)
#define kv_info(sub, ...)  do { if (kv_log_threshold <= KV_LOG_INFO)  kv_log(KV_LOG_INFO,  sub, __VA_ARGS__); } while (0)
#define kv_warn(sub, ...)  kv_log(KV_LOG_WARN,  sub, __VA_ARGS__)
#define kv_error(sub, ...) kv_log(KV_LOG_ERROR, sub, __VA_ARGS__)

#endif
