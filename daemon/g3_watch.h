/*
 * g3_watch.h - the SSD tier at run time, from the daemon's side. A G3 that
 * cannot be opened at start does not stop the daemon: it runs on G2 alone,
 * says why (error log, /health, kvcached_g3_problem) and tries again,
 * from g3.retry_ms, doubling to 5 minutes. While G3 is open, a timer
 * checks every half second that its files are still there (kv_g3_check: a
 * removed directory turns it degraded) and, while it is full, lets a probe
 * write through every g3.retry_ms (kv_g3_retry): it becomes ok by itself
 * once space returns. Opening it, the timer and the completion poll live
 * here. Loop thread only.
 */
#ifndef KV_DAEMON_G3_WATCH_H
#define KV_DAEMON_G3_WATCH_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct kvd;

/* Why G3 is not ok: the `reason` label of kvcached_g3_problem. */
typedef enum {
  KVD_G3P_NONE = 0,   /* ok, or not configured */
  KVD_G3P_NO_SPACE,   /* ENOSPC, EFBIG, EDQUOT: full, or the file does not fit */
  KVD_G3P_PERMISSION, /* EACCES, EPERM (an immutable file), EROFS */
  KVD_G3P_BAD_PATH,   /* a path that is not a directory, or cannot be made */
  KVD_G3P_IN_USE,     /* its files are locked by another store */
  KVD_G3P_CORRUPT,    /* an index that cannot be read or rebuilt */
  KVD_G3P_REMOVED,    /* a store file was removed while in use */
  KVD_G3P_IO_ERROR,   /* an I/O error */
  KVD_G3P_OTHER,
  KVD_G3P_COUNT
} kvd_g3_problem;
extern const char *const kvd_g3_problem_names[KVD_G3P_COUNT];

typedef struct kvd_g3w {
  int err;              /* why G3 could not be opened; 0 when open or not configured */
  char why[448];        /* ... in words: what failed, where, and the reason */
  uint64_t down_ms;     /* when it first failed (kv_now_ms) */
  uint64_t next_try_ms; /* when to try opening again (0: never) */
  uint64_t backoff_ms;
  uint64_t last_probe_ms;
  uv_loop_t *loop;
  uv_timer_t timer;
  uv_poll_t poll;
  int timing, polling;
} kvd_g3w;

/* Opens the SSD tier on the configured directories and attaches it to the
 * core. lock_wait_ms as in kv_g3_opts. 0, or an error with
 * nothing left open and why[0..n) saying what failed. */
int kvd_g3_open(struct kvd *d, int lock_wait_ms, char *why, size_t n);

/* kvd_init, after kvd_g3_open failed with rc: records it, logs it at error
 * level and schedules the next attempt. The daemon goes on without G3. */
void kvd_g3_unavailable(struct kvd *d, int rc);

/* Starts the timer (and the completion poll, if G3 is open) on loop;
 * kvd_g3w_stop stops and closes both (run the loop once more to finish
 * the close). 0 or a libuv error. */
int kvd_g3w_start(struct kvd *d, uv_loop_t *loop);
void kvd_g3w_stop(struct kvd *d);

/* The current problem (KVD_G3P_NONE when G3 is ok or not configured). */
kvd_g3_problem kvd_g3_problem_of(const struct kvd *d);

/* Delivers G3 completions, then retries what waits for room (LOADs, then
 * ALLOCs) and keeps a soft g2.capacity. */
void kvd_g3_poll(struct kvd *d);

#endif
