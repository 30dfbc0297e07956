/* log.c - structured logging: stderr lines or journal fields, and a rate
 * limiter for repeated warnings and errors (see log.h). */
#include "base/log.h"

#include "base/clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#define SD_JOURNAL_SUPPRESS_LOCATION
#include <systemd/sd-journal.h>

int kv_log_threshold = KV_LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};
static const int level_prio[] = {LOG_DEBUG, LOG_INFO, LOG_WARNING, LOG_ERR};

const char *kv_log_level_name(int lvl) { return lvl >= 0 && lvl < 4 ? level_names[lvl] : "?"; }

/* --- where lines go ---------------------------------------------------------- */

static pthread_once_t sink_once = PTHREAD_ONCE_INIT;
static int journal;

static void decide_sink(void) {
  const char *js = getenv("JOURNAL_STREAM");
  struct stat st;
  unsigned long long dev, ino;
  if (js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0 &&
      (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino)
    journal = 1;
}

int kv_log_to_journal(void) {
  pthread_once(&sink_once, decide_sink);
  return journal;
}

static void emit(kv_log_level lvl, const char *subsys, const char *msg) {
  if (kv_log_to_journal()) {
    if (sd_journal_send("MESSAGE=%s: %s", subsys, msg, "PRIORITY=%d", level_prio[lvl],
                        "SYSLOG_IDENTIFIER=kvcached", "KV_SUBSYSTEM=%s", subsys, NULL) == 0)
      return;
  }
  char line[1200];
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: %s",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                   ts.tv_nsec / 1000000L, level_names[lvl], subsys, msg);
  if (n < 0) return;
  if ((size_t)n >= sizeof line - 1) n = (int)sizeof line - 2;
  line[n++] = '\n';
  ssize_t w;
  do { w = write(STDERR_FILENO, line, (size_t)n); } while (w < 0 && errno == EINTR);
}

/* --- the rate limiter -------------------------------------------------------- */

#define RL_SLOTS 64

typedef struct rl_slot {
  const char *subsys, *fmt; /* the key: pointers to string literals */
  uint64_t window_ms;
  uint32_t count;      /* messages in the current window */
  uint64_t suppressed; /* not shown since the last one shown */
} rl_slot;

static pthread_mutex_t rl_lock = PTHREAD_MUTEX_INITIALIZER;
static rl_slot rl[RL_SLOTS];
static uint64_t rl_total;

uint64_t kv_log_suppressed(void) {
  pthread_mutex_lock(&rl_lock);
  uint64_t n = rl_total;
  pthread_mutex_unlock(&rl_lock);
  return n;
}

/* 1 if the message may be shown; *was_suppressed: messages dropped before it. */
static int rl_admit(const char *subsys, const char *fmt, uint64_t *was_suppressed) {
  uintptr_t h = ((uintptr_t)fmt * 0x9E3779B97F4A7C15ull) ^ (uintptr_t)subsys;
  rl_slot *s = &rl[(h >> 7) % RL_SLOTS];
  uint64_t now = kv_now_ms();
  int ok;
  pthread_mutex_lock(&rl_lock);
  if (s->fmt != fmt || s->subsys != subsys) { /* a new key takes the slot */
    *s = (rl_slot){subsys, fmt, now, 0, 0};
  } else if (now - s->window_ms >= KV_LOG_INTERVAL_MS) {
    s->window_ms = now;
    s->count = 0;
  }
  ok = s->count < KV_LOG_BURST;
  if (ok) {
    s->count++;
    *was_suppressed = s->suppressed;
    s->suppressed = 0;
  } else {
    s->suppressed++;
    rl_total++;
  }
  pthread_mutex_unlock(&rl_lock);
  return ok;
}

void kv_vlog(kv_log_level lvl, const char *subsys, const char *fmt, va_list ap) {
  if ((int)lvl < kv_log_threshold || (unsigned)lvl > KV_LOG_ERROR) return;
  if (!subsys) subsys = "-";
  if (lvl >= KV_LOG_WARN) {
    uint64_t dropped = 0;
    if (!rl_admit(subsys, fmt, &dropped)) return;
    if (dropped) {
      char note[256];
      snprintf(note, sizeof note, "suppressed %llu messages like: %.180s",
               (unsigned long long)dropped, fmt);
      emit(lvl, subsys, note);
    }
  }
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  emit(lvl, subsys, msg);
}

void kv_log(kv_log_level lvl, const char *subsys, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  kv_vlog(lvl, subsys, fmt, ap);
  va_end(ap);
}
