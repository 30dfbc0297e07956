/* g3_watch.c - the SSD tier at run time, from the daemon's side (see
 * g3_watch.h). */
#include "daemon/g3_watch.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/clock.h"
#include "base/errors.h"
#include "base/log.h"
#include "daemon/kvd.h"
#include "ipc/sock.h"

#define WATCH_MS       500            /* how often the files are checked */
#define BACKOFF_MAX_MS (300u * 1000u) /* reopening: at most every 5 minutes */

const char *const kvd_g3_problem_names[KVD_G3P_COUNT] = {"none",     "no_space", "permission",
                                                         "bad_path", "in_use",   "corrupt",
                                                         "removed",  "io_error", "other"};

static kvd_g3_problem problem_of_err(int err) {
  switch (err) {
  case 0: return KVD_G3P_NONE;
  case -ENOSPC:
  case -EFBIG:
  case -EDQUOT: return KVD_G3P_NO_SPACE;
  case -EACCES:
  case -EPERM:
  case -EROFS: return KVD_G3P_PERMISSION;
  case -ENOTDIR:
  case -ENOENT:
  case -EISDIR:
  case -ENAMETOOLONG:
  case -ELOOP:
  case -EEXIST: return KVD_G3P_BAD_PATH;
  case -EBUSY:
  case -EWOULDBLOCK: return KVD_G3P_IN_USE;
  case KV_ECORRUPT: return KVD_G3P_CORRUPT;
  case -EIO: return KVD_G3P_IO_ERROR;
  default: return KVD_G3P_OTHER;
  }
}

kvd_g3_problem kvd_g3_problem_of(const kvd *d) {
  if (!d->g3) return problem_of_err(d->g3w.err);
  kv_g3_stats gs;
  kv_g3_get_stats(d->g3, &gs);
  if (gs.state == KV_G3_OK) return KVD_G3P_NONE;
  if (gs.state == KV_G3_FULL) return KVD_G3P_NO_SPACE;
  if (!strcmp(gs.state_what, "store file removed")) return KVD_G3P_REMOVED;
  kvd_g3_problem p = problem_of_err(gs.state_err);
  return p == KVD_G3P_NONE || p == KVD_G3P_OTHER ? KVD_G3P_IO_ERROR : p;
}

void kvd_g3_unavailable(kvd *d, int rc) {
  kvd_g3w *w = &d->g3w;
  uint64_t now = (uint64_t)kv_now_ms();
  w->err = rc;
  w->down_ms = now;
  w->backoff_ms = d->cfg.g3_retry_ms;
  w->next_try_ms = w->backoff_ms ? now + w->backoff_ms : 0;
  if (!w->why[0]) snprintf(w->why, sizeof w->why, "%s", kv_strerror(rc));
  kv_error("g3", "the SSD tier in %s is unavailable: %s; running on G2 alone%s", d->cfg.g3_path,
           w->why, w->backoff_ms ? ", trying again from time to time" : " until restarted");
}

/* Opens the SSD tier on the configured directories and attaches it
 * (g3_watch.h). */
int kvd_g3_open(kvd *d, int lock_wait_ms, char *why, size_t whylen) {
  char paths[sizeof d->cfg.g3_path];
  const char *names[KV_G3_MAX_DIRS];
  kv_g3_dir dirs[KV_G3_MAX_DIRS];
  int nd = kv_config_g3_dirs(&d->cfg, paths, names, KV_G3_MAX_DIRS); /* checked at start */
  unsigned n = nd > 0 ? (unsigned)nd : 0;
  why[0] = 0;
  for (unsigned i = 0; i < n; i++) {
    if (mkdir(names[i], 0750) < 0 && errno != EEXIST) {
      int rc = -errno;
      snprintf(why, whylen, "cannot create %s: %s", names[i], strerror(-rc));
      return rc;
    }
    dirs[i] = (kv_g3_dir){names[i], d->cfg.g3_capacity};
  }
  if (n == 0) return 0;
  kv_g3_opts o = {.dirs = dirs,
                  .ndirs = n,
                  .block_bytes = (uint32_t)d->cfg.g3_block_bytes,
                  .slot_bytes = (uint32_t)d->cfg.g3_slot_bytes,
                  .queue_depth = d->cfg.g3_queue_depth,
                  .codec_threads = d->cfg.g3_codec_threads,
                  .backend = d->cfg.g3_backend,
                  .lock_wait_ms = lock_wait_ms,
                  /* No G2 arena is registered as io_uring fixed buffers:
                   * workers hold the memfd writable and can punch holes in
                   * it (fallocate, MADV_REMOVE), which would leave the
                   * registration pinning pages no longer in the file, and
                   * every later G3 read landing where G2 cannot see it.
                   * Plain reads map the arena's current pages per I/O. */
                  .arena = NULL};
  kv_g3_open_info info;
  int rc = kv_g3_open(&d->g3, &o, &info);
  if (rc == -EINVAL) {
    /* Existing files made with another slot size: keep theirs (blocks
     * larger than their slots are then not written, or only coded). */
    o.slot_bytes = KV_G3_SLOT_KEEP;
    rc = kv_g3_open(&d->g3, &o, &info);
    if (rc == 0)
      kv_warn("g3", "existing files use %u-byte slots, not the configured %llu; keeping theirs",
              info.slot_bytes, (unsigned long long)kv_config_g3_slot(&d->cfg));
  }
  if (rc) {
    snprintf(why, whylen, "%s", info.why[0] ? info.why : kv_strerror(rc));
    return rc;
  }
  kv_core_g3_opts go = {.admit = d->cfg.g3_admit, .min_prio = (uint8_t)d->cfg.g3_min_prio};
  rc = kv_core_attach_g3(d->core, d->g3, &go);
  if (rc >= 0) {
    kv_g3_stats gs;
    kv_g3_get_stats(d->g3, &gs);
    int sr = kvd_registry_g3_shares(&d->reg, &d->cfg, gs.capacity_bytes);
    if (sr) rc = sr;
  }
  if (rc < 0) {
    snprintf(why, whylen, "cannot attach the SSD tier to the cache core: %s", kv_strerror(rc));
    kv_g3_close(d->g3);
    d->g3 = NULL;
    return rc;
  }
  kv_info("g3", "%u slots of %u bytes in %u file(s), %llu blocks served from before (warm)%s",
          info.slots, info.slot_bytes, n, (unsigned long long)info.indexed,
          info.rebuilt ? ", index rebuilt from the records" : "");
  return 0;
}

void kvd_g3_poll(kvd *d) {
  if (!d->g3) return;
  kv_g3_poll(d->g3);
  kvd_defer_retry(&d->load_wait);
  kvd_defer_retry(&d->alloc_wait);
  if (kv_core_limit(d->core, KV_G2)) kv_core_enforce_limits(d->core); /* a soft g2.capacity */
}

static void on_poll(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  kvd_g3_poll(h->data);
}

static void start_poll(kvd *d) {
  kvd_g3w *w = &d->g3w;
  if (w->polling || !d->g3 || !w->loop) return;
  int rc = uv_poll_init(w->loop, &w->poll, kv_g3_fd(d->g3));
  if (rc == 0) rc = uv_poll_start(&w->poll, UV_READABLE, on_poll);
  if (rc) {
    kv_error("g3", "cannot poll the SSD tier's completions: %s", uv_strerror(rc));
    return;
  }
  w->poll.data = d;
  w->polling = 1;
}

/* G3 could not be opened: try again (without waiting for a lock: the loop
 * must not stall), backing off. A failure for the same reason as the last
 * is logged at debug level only. */
static void try_reopen(kvd *d, uint64_t now) {
  kvd_g3w *w = &d->g3w;
  char why[sizeof w->why];
  int rc = kvd_g3_open(d, -1, why, sizeof why);
  if (rc == 0) {
    kv_info("g3", "the SSD tier in %s is up after %llu s unavailable", d->cfg.g3_path,
            (unsigned long long)((now - w->down_ms) / 1000));
    w->err = 0;
    w->why[0] = 0;
    w->next_try_ms = 0;
    start_poll(d);
    return;
  }
  if (problem_of_err(rc) != problem_of_err(w->err) || strcmp(why, w->why))
    kv_error("g3", "the SSD tier in %s is still unavailable: %s", d->cfg.g3_path, why);
  else kv_debug("g3", "the SSD tier in %s is still unavailable: %s", d->cfg.g3_path, why);
  w->err = rc;
  snprintf(w->why, sizeof w->why, "%s", why);
  w->backoff_ms = w->backoff_ms * 2 < BACKOFF_MAX_MS ? w->backoff_ms * 2 : BACKOFF_MAX_MS;
  w->next_try_ms = now + w->backoff_ms;
}

static void on_timer(uv_timer_t *t) {
  kvd *d = t->data;
  kvd_g3w *w = &d->g3w;
  uint64_t now = (uint64_t)kv_now_ms();
  if (!d->g3) {
    if (w->err && w->next_try_ms && now >= w->next_try_ms) try_reopen(d, now);
    return;
  }
  if (kv_g3_check(d->g3) == KV_G3_FULL && d->cfg.g3_retry_ms &&
      now - w->last_probe_ms >= d->cfg.g3_retry_ms) {
    w->last_probe_ms = now;
    kv_g3_retry(d->g3);
  }
}

int kvd_g3w_start(kvd *d, uv_loop_t *loop) {
  kvd_g3w *w = &d->g3w;
  w->loop = loop;
  if (!d->g3 && !w->err) return 0; /* no G3 configured */
  start_poll(d);
  int rc = uv_timer_init(loop, &w->timer);
  if (rc) return rc;
  w->timer.data = d;
  uv_timer_start(&w->timer, on_timer, WATCH_MS, WATCH_MS);
  uv_unref((uv_handle_t *)&w->timer);
  w->timing = 1;
  return 0;
}

void kvd_g3w_stop(kvd *d) {
  kvd_g3w *w = &d->g3w;
  if (w->polling) {
    uv_poll_stop(&w->poll);
    uv_close((uv_handle_t *)&w->poll, NULL);
    w->polling = 0;
  }
  if (w->timing) {
    uv_timer_stop(&w->timer);
    uv_close((uv_handle_t *)&w->timer, NULL);
    w->timing = 0;
  }
}
