/*
 * dev_checks.h - checks of the G1 device (cuda/dev.h) that run the same on
 * either backend: test_dev.c runs them on the simulation under criterion,
 * tests/gpu/gpu_test_dev.c on a CUDA device. Each dc_* returns NULL when
 * the check holds, else a message naming the failed condition (file:line).
 * Declared here, defined in dev_checks.c (kvtestlib).
 * A check opens its own device; the ones that fork do so before opening,
 * since a CUDA context does not survive fork().
 */
#ifndef KV_TESTS_LIB_DEV_CHECKS_H
#define KV_TESTS_LIB_DEV_CHECKS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "cuda/dev.h"

extern char dc_msg[512]; /* the message of the last failed check */

/* Formats "file:line: message" into dc_msg; returns dc_msg. */
const char *dc_fmt(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Fails the check (after cleanup label-free code: callers free on exit). */
#define DC_REQ(cond, ...)                      \
  do {                                         \
    if (!(cond)) {                             \
      dc_fmt(__FILE__, __LINE__, __VA_ARGS__); \
      goto fail;                               \
    }                                          \
  } while (0)
#define DC_OK(call)                                                        \
  do {                                                                     \
    int dc_rc_ = (call);                                                   \
    DC_REQ(dc_rc_ == 0, "%s = %d (%s)", #call, dc_rc_, strerror(-dc_rc_)); \
  } while (0)

#define DC_HANG_MS 60000 /* a guard against a hang, not a timing assertion */

/* kv_dev_open of backend be (uuid: NULL for the default device). */
int dc_open(kv_dev **d, kv_dev_backend be, const uint8_t *uuid);

/* The uuid of device `ordinal` of backend be into u. 0 or -errno. */
int dc_uuid_of(kv_dev_backend be, int ordinal, uint8_t u[16]);

/* Reaps `want` completions into out (waiting on the fd with poll). -1 on a
 * hang (DC_HANG_MS without progress) or more than want. */
int dc_reap_n(kv_dev *d, kv_dev_done *out, unsigned want);

/* Receives one message of at most cap bytes on sock with the descriptor
 * it carries in *fd (-1 when none). The byte count, or -1 (errno set). */
ssize_t dc_recv_fd(int sock, void *buf, size_t cap, int *fd);

/* A device, a pool and a host buffer to copy between. */
typedef struct dc_env {
  kv_dev *d;
  kv_dev_pool *p;
  uint8_t *dev; /* pool base */
  uint8_t *h;   /* registered host buffer */
  size_t bytes; /* of each */
} dc_env;

/* The export descriptor's codec: round trips, truncations, bad bytes. */
const char *dc_export_codec(void);

/* A pool exported to a forked worker over SCM_RIGHTS: each side sees what
 * the other wrote. */
const char *dc_share_fork(kv_dev_backend be);

/* Import refusals: another device's uuid, a kind of the other backend. */
const char *dc_import_errors(kv_dev_backend be);

/* A device with a pool and a registered host buffer of bytes each. 0 or
 * -errno; dc_env_close frees what was made either way. */
int dc_env_open(dc_env *e, kv_dev_backend be, size_t bytes);
void dc_env_close(dc_env *e);

/* One host range registered with two kv_devs of the process (a daemon
 * with a pool per GPU registers each G2 arena with every device): both
 * take it, both copy from and to it, and it stays usable by one after the
 * other lets it go, whichever registered it first. */
const char *dc_shared_host(kv_dev_backend be);

/* Many blocks per submission; each tag reaped exactly once with status 0;
 * the completion fd readable; reaping in parts leaves it readable. */
const char *dc_batch(kv_dev_backend be);

/* FIFO within a direction: completions in submission order, and the last
 * of many writes to one place wins. */
const char *dc_fifo(kv_dev_backend be);

/* H2D, D2H and D2D in flight at once, each on its own region. */
const char *dc_concurrent(kv_dev_backend be);

/* Bad submissions are refused whole, with nothing to reap. */
const char *dc_refusals(kv_dev_backend be);

/* An injected failure is reaped with its status; the next is clean. */
const char *dc_inject(kv_dev_backend be);

/* kv_dev_close with copies in flight: every copy lands before it returns. */
const char *dc_close_inflight(kv_dev_backend be);

const char *dc_random(kv_dev_backend be, unsigned rounds, uint32_t seed);

/* Copies added one at a time go as one submission per direction; every tag
 * comes back once with its submission's status; a submission refused whole
 * is retried copy by copy so the bad copy fails alone, reaped before any
 * wait; an injected failure reaches every tag of its submission; a
 * direction that fills (max) is submitted at once; the bytes land. */
const char *dc_batcher(kv_dev_backend be);

#endif
