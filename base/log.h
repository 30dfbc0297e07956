/*
 * log.h - structured logging for kvcached and its library.
 *
 * One line per event on stderr: "<time> <level> <subsystem>: <message>".
 * When stderr is the systemd journal (JOURNAL_STREAM names stderr's device
 * and inode), each event goes to the journal instead, with the fields
 * PRIORITY, SYSLOG_IDENTIFIER=kvcached and KV_SUBSYSTEM, so `journalctl
 * KV_SUBSYSTEM=g3` selects one subsystem.
 *
 * Repeated warnings and errors are rate-limited: the same (subsystem,
 * format string) logs at most KV_LOG_BURST times per KV_LOG_INTERVAL_MS;
 * the rest are counted, and the next one let through is preceded by one
 * "suppressed N messages like: <format>" line.
 *
 * Thread-safe (one write(2) per line; the rate limiter takes a mutex only
 * for warnings and errors). The level threshold is global and may be
 * changed at any time; messages below it cost one comparison.
 */
#ifndef KV_BASE_LOG_H
#define KV_BASE_LOG_H

#include <stdarg.h>
#include <stdint.h>

typedef enum { KV_LOG_DEBUG, KV_LOG_INFO, KV_LOG_WARN, KV_LOG_ERROR } kv_log_level;

#define KV_LOG_BURST       10
#define KV_LOG_INTERVAL_MS 10000

extern int kv_log_threshold; /* default KV_LOG_INFO */

void kv_log(kv_log_level lvl, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void kv_vlog(kv_log_level lvl, const char *subsys, const char *fmt, va_list ap);
/* The level's name ("info"), or "?" */
const char *kv_log_level_name(int lvl);
/* Messages suppressed by the rate limiter so far (all keys together). */
uint64_t kv_log_suppressed(void);
/* 1 if events go to the journal (decided once, at the first message). */
int kv_log_to_journal(void);

#define kv_debug(sub, ...)                                                        \
  do {                                                                            \
    if (kv_log_threshold <= KV_LOG_DEBUG) kv_log(KV_LOG_DEBUG, sub, __VA_ARGS__); \
  } while (0)
#define kv_info(sub, ...)                                                       \
  do {                                                                          \
    if (kv_log_threshold <= KV_LOG_INFO) kv_log(KV_LOG_INFO, sub, __VA_ARGS__); \
  } while (0)
#define kv_warn(sub, ...)  kv_log(KV_LOG_WARN, sub, __VA_ARGS__)
#define kv_error(sub, ...) kv_log(KV_LOG_ERROR, sub, __VA_ARGS__)

#endif
