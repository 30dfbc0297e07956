/* log.c - structured logging (see log.h). */
#include "daemon/log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int kv_log_threshold = KV_LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void kv_vlog(kv_log_level lvl, const char *subsys, const char *fmt, va_list ap) {
  if ((int)lvl < kv_log_threshold) return;
  char line[1024];
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                   tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000L,
                   level_names[lvl], subsys ? subsys : "-");
  if (n < 0) return;
  if ((size_t)n < sizeof line) {
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    if (m > 0) n += m;
  }
  if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
  line[n++] = '\n';
  ssize_t w;
  do { w = write(STDERR_FILENO, line, (size_t)n); } while (w < 0 && errno == EINTR);
}

void kv_log(kv_log_level lvl, const char *subsys, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  kv_vlog(lvl, subsys, fmt, ap);
  va_end(ap);
}

int kv_log_parse_level(const char *s) {
  for (int i = 0; i < 4; i++)
    if (strcmp(s, level_names[i]) == 0) return i;
  if (strcmp(s, "warning") == 0) return KV_LOG_WARN;
  return -EINVAL;
}
