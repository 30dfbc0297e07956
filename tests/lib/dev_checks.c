/* dev_checks.c - checks of the G1 device on either backend (dev_checks.h). */
#include "tests/lib/dev_checks.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda/batch.h"
#include "cuda/dev.h"
#include "ipc/sock.h"

char dc_msg[512];

const char *dc_fmt(const char *file, int line, const char *fmt, ...) {
  int k = snprintf(dc_msg, sizeof dc_msg, "%s:%d: ", file, line);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dc_msg + k, sizeof dc_msg - (size_t)k, fmt, ap);
  va_end(ap);
  return dc_msg;
}

int dc_open(kv_dev **d, kv_dev_backend be, const uint8_t *uuid) {
  kv_dev_opts o = {.backend = be, .uuid = uuid};
  return kv_dev_open(d, &o);
}

int dc_uuid_of(kv_dev_backend be, int ordinal, uint8_t u[16]) {
  kv_dev *d;
  int rc = kv_dev_open(&d, &(kv_dev_opts){.backend = be, .ordinal = ordinal});
  if (rc) return rc;
  kv_dev_uuid(d, u);
  kv_dev_close(d);
  return 0;
}

static void dc_fill(uint8_t *p, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    p[i] = (uint8_t)x;
  }
}

/* Reaps `want` completions into out (waiting on the fd with poll). -1 on a
 * hang (DC_HANG_MS without progress) or more than want. */
int dc_reap_n(kv_dev *d, kv_dev_done *out, unsigned want) {
  unsigned got = 0;
  while (got < want) {
    struct pollfd p = {.fd = kv_dev_completion_fd(d), .events = POLLIN};
    int r = poll(&p, 1, DC_HANG_MS);
    if (r == 0) return -1;
    if (r < 0 && errno != EINTR) return -1;
    if (r > 0) got += kv_dev_reap(d, out + got, want - got);
  }
  kv_dev_done extra;
  return kv_dev_reap(d, &extra, 1) == 0 ? 0 : -1;
}

/* One submission, waited for. 0 or its status (or -ETIME on a hang). */
static int dc_copy_wait(kv_dev *d, kv_dev_dir dir, void *dst, const void *src, size_t n) {
  kv_dev_copy c = {dst, src, n};
  int rc = kv_dev_submit(d, dir, &c, 1, 0xfeed);
  if (rc) return rc;
  kv_dev_done done;
  if (dc_reap_n(d, &done, 1)) return -ETIME;
  return done.tag == 0xfeed ? done.status : -EPROTO;
}

/* ---- export codec (pure) ------------------------------------------------------- */

const char *dc_export_codec(void) {
  kv_dev_export x, y;
  uint8_t buf[KV_DEVX_ENCODED_MAX + 8];
  for (int kind = 1; kind <= 3; kind++) {
    memset(&x, 0, sizeof x);
    x.kind = (uint8_t)kind;
    x.fd = 7;
    x.bytes = (64ull << 20) + (uint64_t)kind;
    dc_fill(x.uuid, 16, (uint32_t)kind);
    if (kind == KV_DEVX_LEGACY_IPC) {
      x.handle_len = KV_DEVX_HANDLE_MAX;
      dc_fill(x.handle, KV_DEVX_HANDLE_MAX, 99);
    }
    int n = kv_dev_export_encode(&x, buf, sizeof buf);
    DC_REQ(n > 0 && n <= KV_DEVX_ENCODED_MAX, "encode kind %d = %d", kind, n);
    DC_REQ(kv_dev_export_encode(&x, buf, (size_t)n - 1) == -ENOSPC, "short buffer accepted");
    DC_OK(kv_dev_export_decode(buf, (size_t)n, &y));
    DC_REQ(y.kind == x.kind && y.bytes == x.bytes && y.handle_len == x.handle_len &&
               !memcmp(y.uuid, x.uuid, 16) && !memcmp(y.handle, x.handle, x.handle_len),
           "round trip of kind %d differs", kind);
    DC_REQ(y.fd == -1, "decode left fd %d", y.fd);
    /* Every truncation and one byte too many are refused. */
    for (int k = 0; k < n; k++)
      DC_REQ(kv_dev_export_decode(buf, (size_t)k, &y) == -EINVAL, "truncated to %d accepted", k);
    buf[n] = 0;
    DC_REQ(kv_dev_export_decode(buf, (size_t)n + 1, &y) == -EINVAL, "trailing byte accepted");
    /* Each header byte flipped: refused, or (uuid, bytes, handle) decoded as given. */
    for (int k = 0; k < 16; k++) {
      uint8_t save = buf[k];
      buf[k] ^= 0x5a;
      int rc = kv_dev_export_decode(buf, (size_t)n, &y);
      DC_REQ(k >= 8 ? rc == 0 : rc == -EINVAL, "flipped byte %d: %d", k, rc);
      buf[k] = save;
    }
  }
  /* A wrong handle length for the kind, bytes 0, an unknown kind. */
  memset(&x, 0, sizeof x);
  x.kind = KV_DEVX_VMM_FD;
  x.bytes = 4096;
  x.handle_len = 8;
  DC_REQ(kv_dev_export_encode(&x, buf, sizeof buf) == -EINVAL, "VMM with a handle encoded");
  x.handle_len = 0;
  x.bytes = 0;
  DC_REQ(kv_dev_export_encode(&x, buf, sizeof buf) == -EINVAL, "0 bytes encoded");
  x.kind = 9;
  x.bytes = 1;
  DC_REQ(kv_dev_export_encode(&x, buf, sizeof buf) == -EINVAL, "kind 9 encoded");
  /* Random garbage never crashes and is never accepted without the magic. */
  uint8_t junk[256];
  for (uint32_t s = 0; s < 20000; s++) {
    dc_fill(junk, sizeof junk, s);
    size_t len = s % sizeof junk;
    if (s & 1) memcpy(junk, "KVDX\x01", 5);
    int rc = kv_dev_export_decode(junk, len, &y);
    DC_REQ(rc == 0 || rc == -EINVAL, "garbage decode = %d", rc);
    DC_REQ(rc == -EINVAL || (s & 1), "garbage without magic accepted");
  }
  DC_REQ(kv_dev_export_decode(NULL, 40, &y) == -EINVAL, "NULL accepted");
  return NULL;
fail:
  return dc_msg;
}

/* ---- pool shared with another process ---------------------------------------- */

ssize_t dc_recv_fd(int sock, void *buf, size_t cap, int *fd) {
  char cbuf[CMSG_SPACE(sizeof(int))];
  struct iovec iov = {buf, cap};
  struct msghdr mh = {
      .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
  ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
  *fd = -1;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
      memcpy(fd, CMSG_DATA(c), sizeof(int));
  return n;
}

#define DC_SHARE_BYTES ((size_t)1 << 20)

/* The worker: imports the pool, reads what the daemon wrote (D2H), writes
 * its own pattern after it (H2D). Returns the process's exit status. */
static int dc_share_child(int sock, kv_dev_backend be) {
  uint8_t enc[KV_DEVX_ENCODED_MAX];
  int fd = -1;
  kv_dev *d = NULL;
  kv_dev_map *m = NULL;
  uint8_t *h = malloc(2 * DC_SHARE_BYTES), *want = malloc(DC_SHARE_BYTES);
  kv_dev_export x;
  ssize_t n = dc_recv_fd(sock, enc, sizeof enc, &fd);
  DC_REQ(h && want, "malloc");
  DC_REQ(n > 0, "child: no export received");
  DC_OK(kv_dev_export_decode(enc, (size_t)n, &x));
  if (x.kind != KV_DEVX_LEGACY_IPC) DC_REQ(fd >= 0, "child: no fd came with the export");
  x.fd = fd;
  DC_OK(dc_open(&d, be, x.uuid));
  int rc = kv_dev_pool_import(d, &x, &m);
  DC_REQ(rc == 0, "child: import = %d: %s", rc, kv_dev_reason(d));
  if (fd >= 0) close(fd);
  fd = -1;
  DC_REQ(kv_dev_map_bytes(m) >= 2 * DC_SHARE_BYTES, "child: map too small");
  DC_OK(kv_dev_host_register(d, h, 2 * DC_SHARE_BYTES));
  uint8_t *base = kv_dev_map_base(m);
  DC_OK(dc_copy_wait(d, KV_DEV_D2H, h, base, DC_SHARE_BYTES));
  dc_fill(want, DC_SHARE_BYTES, 1);
  DC_REQ(!memcmp(h, want, DC_SHARE_BYTES), "child: the daemon's bytes differ");
  dc_fill(h + DC_SHARE_BYTES, DC_SHARE_BYTES, 2);
  DC_OK(dc_copy_wait(d, KV_DEV_H2D, base + DC_SHARE_BYTES, h + DC_SHARE_BYTES, DC_SHARE_BYTES));
  DC_OK(kv_dev_unmap(d, m));
  m = NULL;
  DC_OK(kv_dev_host_unregister(d, h));
  kv_dev_close(d);
  free(h);
  free(want);
  return write(sock, "k", 1) == 1 ? 0 : 1;
fail:
  fprintf(stderr, "worker: %s\n", dc_msg);
  if (fd >= 0) close(fd);
  kv_dev_close(d);
  free(h);
  free(want);
  return 1;
}

const char *dc_share_fork(kv_dev_backend be) {
  int sv[2];
  kv_dev *d = NULL;
  uint8_t *h = NULL;
  pid_t pid = -1;
  DC_OK(kv_sock_pair(sv));
  pid = fork();
  DC_REQ(pid >= 0, "fork");
  if (pid == 0) {
    close(sv[0]);
    _exit(dc_share_child(sv[1], be));
  }
  close(sv[1]);
  DC_OK(dc_open(&d, be, NULL));
  kv_dev_pool *p;
  int rc = kv_dev_pool_create(d, 4 * DC_SHARE_BYTES, &p);
  DC_REQ(rc == 0, "pool_create = %d: %s", rc, kv_dev_reason(d));
  h = malloc(2 * DC_SHARE_BYTES);
  DC_REQ(h, "malloc");
  DC_OK(kv_dev_host_register(d, h, 2 * DC_SHARE_BYTES));
  dc_fill(h, DC_SHARE_BYTES, 1);
  uint8_t *base = kv_dev_pool_base(p);
  DC_OK(dc_copy_wait(d, KV_DEV_H2D, base, h, DC_SHARE_BYTES));
  kv_dev_export x;
  DC_OK(kv_dev_pool_export(p, &x));
  uint8_t enc[KV_DEVX_ENCODED_MAX];
  int n = kv_dev_export_encode(&x, enc, sizeof enc);
  DC_REQ(n > 0, "encode = %d", n);
  struct iovec iov = {enc, (size_t)n};
  DC_REQ(kv_sock_sendmsg(sv[0], &iov, 1, x.fd, 0) == n, "send export");
  char ok = 0;
  DC_REQ(read(sv[0], &ok, 1) == 1 && ok == 'k', "the worker failed (its stderr says why)");
  int st = 0;
  DC_REQ(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
         "worker exit status %d", st);
  pid = -1;
  DC_OK(dc_copy_wait(d, KV_DEV_D2H, h, base + DC_SHARE_BYTES, DC_SHARE_BYTES));
  dc_fill(h + DC_SHARE_BYTES, DC_SHARE_BYTES, 2);
  DC_REQ(!memcmp(h, h + DC_SHARE_BYTES, DC_SHARE_BYTES), "the worker's bytes differ");
  DC_OK(kv_dev_pool_destroy(d, p));
  kv_dev_close(d);
  close(sv[0]);
  free(h);
  return NULL;
fail:
  if (pid > 0) {
    close(sv[0]);
    waitpid(pid, NULL, 0);
  }
  kv_dev_close(d);
  free(h);
  return dc_msg;
}

/* Import refusals: another device's uuid, a kind of the other backend. */
const char *dc_import_errors(kv_dev_backend be) {
  kv_dev *d = NULL;
  kv_dev_pool *p;
  kv_dev_map *m = NULL;
  DC_OK(dc_open(&d, be, NULL));
  DC_OK(kv_dev_pool_create(d, 1 << 20, &p));
  kv_dev_export x;
  DC_OK(kv_dev_pool_export(p, &x));
  kv_dev_export bad = x;
  bad.uuid[3] ^= 1;
  DC_REQ(kv_dev_pool_import(d, &bad, &m) == -ENODEV, "other uuid: not -ENODEV");
  DC_REQ(strstr(kv_dev_reason(d), "another device"), "reason: %s", kv_dev_reason(d));
  bad = x;
  bad.kind = kv_dev_backend_of(d) == KV_DEV_SIM ? KV_DEVX_VMM_FD : KV_DEVX_SIM_FD;
  DC_REQ(kv_dev_pool_import(d, &bad, &m) == -EOPNOTSUPP, "other kind: not -EOPNOTSUPP");
  DC_REQ(kv_dev_reason(d)[0], "no reason");
  bad = x;
  bad.kind = 77;
  DC_REQ(kv_dev_pool_import(d, &bad, &m) == -EINVAL, "kind 77: not -EINVAL");
  DC_REQ(m == NULL, "a map came back from a failure");
  DC_OK(kv_dev_pool_destroy(d, p));
  kv_dev_close(d);
  return NULL;
fail:
  kv_dev_close(d);
  return dc_msg;
}

/* ---- the copy engine ----------------------------------------------------------- */

int dc_env_open(dc_env *e, kv_dev_backend be, size_t bytes) {
  memset(e, 0, sizeof *e);
  int rc = dc_open(&e->d, be, NULL);
  if (!rc) rc = kv_dev_pool_create(e->d, bytes, &e->p);
  if (rc) return rc;
  e->dev = kv_dev_pool_base(e->p);
  e->bytes = bytes;
  e->h = malloc(bytes);
  if (!e->h) return -ENOMEM;
  return kv_dev_host_register(e->d, e->h, bytes);
}

void dc_env_close(dc_env *e) {
  kv_dev_close(e->d); /* frees the pool and the registration too */
  free(e->h);
  memset(e, 0, sizeof *e);
}

/* One host range registered with two kv_devs of the process (a daemon
 * with a pool per GPU registers each G2 arena with every device): both
 * take it, both copy from and to it, and it stays usable by one after the
 * other lets it go, whichever registered it first. */
const char *dc_shared_host(kv_dev_backend be) {
  dc_env e;
  kv_dev *d2 = NULL;
  kv_dev_pool *p2 = NULL;
  uint8_t *back = malloc(4096);
  DC_REQ(back, "malloc");
  DC_OK(dc_env_open(&e, be, 1 << 20));
  DC_OK(dc_open(&d2, be, NULL));
  DC_OK(kv_dev_pool_create(d2, 1 << 20, &p2));
  DC_OK(kv_dev_host_register(d2, e.h, e.bytes));
  DC_REQ(kv_dev_host_register(d2, e.h, e.bytes) == -EINVAL,
         "a second registration with one kv_dev");
  uint8_t *dev2 = kv_dev_pool_base(p2);
  for (int round = 0; round < 2; round++) {
    dc_fill(e.h, 4096, 7u + (uint32_t)round);
    DC_OK(dc_copy_wait(d2, KV_DEV_H2D, dev2, e.h, 4096));
    DC_OK(dc_copy_wait(e.d, KV_DEV_H2D, e.dev, e.h, 4096));
    memset(e.h, 0, 4096);
    DC_OK(dc_copy_wait(d2, KV_DEV_D2H, e.h, dev2, 4096));
    dc_fill(back, 4096, 7u + (uint32_t)round);
    DC_REQ(!memcmp(e.h, back, 4096), "round %d: bytes through the second device", round);
    memset(e.h, 0, 4096);
    DC_OK(dc_copy_wait(e.d, KV_DEV_D2H, e.h, e.dev, 4096));
    DC_REQ(!memcmp(e.h, back, 4096), "round %d: bytes through the first device", round);
    /* The second lets the range go (it did not make the registration) and
     * takes it again; the first still copies in between. */
    DC_OK(kv_dev_host_unregister(d2, e.h));
    DC_OK(dc_copy_wait(e.d, KV_DEV_D2H, e.h, e.dev, 4096));
    DC_REQ(!memcmp(e.h, back, 4096), "round %d: first device after the second let go", round);
    DC_OK(kv_dev_host_register(d2, e.h, e.bytes));
  }
  /* Now the registrant lets go first: the other still copies. */
  DC_OK(kv_dev_host_unregister(e.d, e.h));
  dc_fill(e.h, 4096, 99);
  DC_OK(dc_copy_wait(d2, KV_DEV_H2D, dev2, e.h, 4096));
  DC_OK(kv_dev_host_unregister(d2, e.h));
  DC_OK(kv_dev_host_register(d2, e.h, e.bytes)); /* registers it anew */
  memset(e.h, 0, 4096);
  DC_OK(dc_copy_wait(d2, KV_DEV_D2H, e.h, dev2, 4096));
  dc_fill(back, 4096, 99);
  DC_REQ(!memcmp(e.h, back, 4096), "bytes after the registrant let go");
  kv_dev_close(d2);
  dc_env_close(&e);
  free(back);
  return NULL;
fail:
  kv_dev_close(d2);
  dc_env_close(&e);
  free(back);
  return dc_msg;
}

/* Many blocks per submission; each tag reaped exactly once with status 0;
 * the completion fd readable; reaping in parts leaves it readable. */
const char *dc_batch(kv_dev_backend be) {
  dc_env e;
  enum { NSUB = 16, NBLK = 64, BLK = 16384 };
  DC_OK(dc_env_open(&e, be, (size_t)NSUB * NBLK * BLK));
  dc_fill(e.h, e.bytes, 5);
  kv_dev_copy v[NBLK];
  for (unsigned s = 0; s < NSUB; s++) {
    for (unsigned i = 0; i < NBLK; i++) {
      /* block i of submission s lands in reverse order on the device */
      size_t off = ((size_t)s * NBLK + i) * BLK;
      v[i] = (kv_dev_copy){e.dev + e.bytes - off - BLK, e.h + off, BLK};
    }
    DC_OK(kv_dev_submit(e.d, KV_DEV_H2D, v, NBLK, 1000 + s));
  }
  DC_REQ(kv_dev_inflight(e.d) == NSUB, "inflight %u", kv_dev_inflight(e.d));
  DC_OK(kv_dev_wait(e.d, DC_HANG_MS));
  struct pollfd pf = {.fd = kv_dev_completion_fd(e.d), .events = POLLIN};
  DC_REQ(poll(&pf, 1, DC_HANG_MS) == 1 && (pf.revents & POLLIN), "fd not readable");
  kv_dev_done done[NSUB];
  unsigned got = 0, seen[NSUB] = {0};
  while (got < NSUB) {
    DC_REQ(poll(&pf, 1, DC_HANG_MS) == 1, "fd not readable with %u left", NSUB - got);
    unsigned k = kv_dev_reap(e.d, done + got, 1); /* one at a time */
    for (unsigned i = got; i < got + k; i++) {
      DC_REQ(done[i].tag >= 1000 && done[i].tag < 1000 + NSUB, "stray tag %llu",
             (unsigned long long)done[i].tag);
      DC_REQ(done[i].status == 0, "status %d", done[i].status);
      seen[done[i].tag - 1000]++;
    }
    got += k;
  }
  for (unsigned s = 0; s < NSUB; s++) DC_REQ(seen[s] == 1, "tag %u reaped %u times", s, seen[s]);
  DC_REQ(kv_dev_reap(e.d, done, NSUB) == 0, "reaped more than submitted");
  DC_REQ(kv_dev_inflight(e.d) == 0, "inflight %u after reaping", kv_dev_inflight(e.d));
  DC_REQ(poll(&pf, 1, 0) == 0, "fd still readable with the queue empty");
  /* Read the whole pool back and check the reversal. */
  uint8_t *back = malloc(e.bytes);
  DC_REQ(back, "malloc");
  memcpy(back, e.h, e.bytes);
  DC_OK(dc_copy_wait(e.d, KV_DEV_D2H, e.h, e.dev, e.bytes));
  int same = 1;
  for (size_t b = 0; b < e.bytes / BLK && same; b++)
    same = !memcmp(e.h + e.bytes - (b + 1) * BLK, back + b * BLK, BLK);
  free(back);
  DC_REQ(same, "device bytes differ");
  dc_env_close(&e);
  return NULL;
fail:
  dc_env_close(&e);
  return dc_msg;
}

/* FIFO within a direction: completions in submission order, and the last
 * of many writes to one place wins. */
const char *dc_fifo(kv_dev_backend be) {
  dc_env e;
  enum { NSUB = 200, BLK = 4096 };
  DC_OK(dc_env_open(&e, be, (size_t)(NSUB + 1) * BLK));
  for (unsigned s = 0; s < NSUB; s++) memset(e.h + (size_t)s * BLK, (int)(s & 0xff), BLK);
  for (unsigned s = 0; s < NSUB; s++) {
    kv_dev_copy c = {e.dev, e.h + (size_t)s * BLK, BLK};
    DC_OK(kv_dev_submit(e.d, KV_DEV_H2D, &c, 1, s));
  }
  kv_dev_done done[NSUB];
  DC_REQ(dc_reap_n(e.d, done, NSUB) == 0, "reap");
  for (unsigned s = 0; s < NSUB; s++)
    DC_REQ(done[s].tag == s && done[s].status == 0, "completion %u is tag %llu", s,
           (unsigned long long)done[s].tag);
  uint8_t *last = e.h + (size_t)NSUB * BLK;
  DC_OK(dc_copy_wait(e.d, KV_DEV_D2H, last, e.dev, BLK));
  DC_REQ(!memcmp(last, e.h + (size_t)(NSUB - 1) * BLK, BLK), "not the last write");
  dc_env_close(&e);
  return NULL;
fail:
  dc_env_close(&e);
  return dc_msg;
}

/* H2D, D2H and D2D in flight at once, each on its own region. */
const char *dc_concurrent(kv_dev_backend be) {
  dc_env e;
  enum { R = 1 << 20, N = 64 };
  DC_OK(dc_env_open(&e, be, 6 * (size_t)R));
  /* device: [0,R) H2D target, [R,2R) D2H source, [2R,3R) D2D source,
   * [3R,4R) D2D target; host: [0,R) H2D source, [R,2R) D2H target */
  dc_fill(e.h, R, 11);
  dc_fill(e.h + 2 * R, R, 12);
  dc_fill(e.h + 3 * R, R, 13);
  DC_OK(dc_copy_wait(e.d, KV_DEV_H2D, e.dev + R, e.h + 2 * R, R));
  DC_OK(dc_copy_wait(e.d, KV_DEV_H2D, e.dev + 2 * R, e.h + 3 * R, R));
  size_t b = R / N;
  for (unsigned i = 0; i < N; i++) {
    kv_dev_copy h2d = {e.dev + i * b, e.h + i * b, b};
    kv_dev_copy d2h = {e.h + R + i * b, e.dev + R + i * b, b};
    kv_dev_copy d2d = {e.dev + 3 * R + i * b, e.dev + 2 * R + i * b, b};
    DC_OK(kv_dev_submit(e.d, KV_DEV_H2D, &h2d, 1, i));
    DC_OK(kv_dev_submit(e.d, KV_DEV_D2H, &d2h, 1, 1000 + i));
    DC_OK(kv_dev_submit(e.d, KV_DEV_D2D, &d2d, 1, 2000 + i));
  }
  kv_dev_done done[3 * N];
  DC_REQ(dc_reap_n(e.d, done, 3 * N) == 0, "reap");
  unsigned next[3] = {0, 1000, 2000};
  for (unsigned i = 0; i < 3 * N; i++) {
    unsigned dir = (unsigned)(done[i].tag / 1000);
    DC_REQ(dir < 3 && done[i].tag == next[dir], "direction %u out of order", dir);
    DC_REQ(done[i].status == 0, "status %d", done[i].status);
    next[dir]++;
  }
  DC_REQ(!memcmp(e.h + R, e.h + 2 * R, R), "D2H bytes differ");
  DC_OK(dc_copy_wait(e.d, KV_DEV_D2H, e.h + 2 * R, e.dev, R));
  DC_REQ(!memcmp(e.h, e.h + 2 * R, R), "H2D bytes differ");
  DC_OK(dc_copy_wait(e.d, KV_DEV_D2H, e.h + 2 * R, e.dev + 3 * R, R));
  DC_REQ(!memcmp(e.h + 3 * R, e.h + 2 * R, R), "D2D bytes differ");
  dc_env_close(&e);
  return NULL;
fail:
  dc_env_close(&e);
  return dc_msg;
}

/* Bad submissions are refused whole, with nothing to reap. */
const char *dc_refusals(kv_dev_backend be) {
  dc_env e;
  uint8_t *stray = malloc(8192);
  DC_OK(dc_env_open(&e, be, 1 << 20));
  DC_REQ(stray, "malloc");
  kv_dev_copy ok = {e.dev, e.h, 4096};
  kv_dev_copy v[2] = {ok, {e.dev + 4096, stray, 4096}};
  DC_REQ(kv_dev_submit(e.d, KV_DEV_H2D, v, 2, 1) == -EFAULT, "unregistered host source");
  DC_REQ(strstr(kv_dev_reason(e.d), "registered host"), "reason: %s", kv_dev_reason(e.d));
  v[1] = (kv_dev_copy){stray, e.dev, 4096};
  DC_REQ(kv_dev_submit(e.d, KV_DEV_D2H, v + 1, 1, 1) == -EFAULT, "unregistered host dest");
  v[1] = (kv_dev_copy){e.dev + kv_dev_pool_bytes(e.p) - 100, e.h, 4096};
  DC_REQ(kv_dev_submit(e.d, KV_DEV_H2D, v + 1, 1, 1) == -EFAULT, "past the pool's end");
  DC_REQ(strstr(kv_dev_reason(e.d), "pool"), "reason: %s", kv_dev_reason(e.d));
  v[1] = (kv_dev_copy){e.h + 8192, e.h, 4096};
  DC_REQ(kv_dev_submit(e.d, KV_DEV_D2D, v + 1, 1, 1) == -EFAULT, "host memory as device");
  v[1] = (kv_dev_copy){e.dev + 100, e.dev, 4096};
  DC_REQ(kv_dev_submit(e.d, KV_DEV_D2D, v + 1, 1, 1) == -EINVAL, "overlap");
  v[1] = (kv_dev_copy){e.dev, e.h, 0};
  DC_REQ(kv_dev_submit(e.d, KV_DEV_H2D, v + 1, 1, 1) == -EINVAL, "0 bytes");
  v[1] = (kv_dev_copy){(void *)(uintptr_t)-16, e.h, 4096};
  DC_REQ(kv_dev_submit(e.d, KV_DEV_H2D, v + 1, 1, 1) == -EFAULT, "wrapping address");
  DC_REQ(kv_dev_submit(e.d, KV_DEV_H2D, &ok, 0, 1) == -EINVAL, "0 copies");
  DC_REQ(kv_dev_submit(e.d, (kv_dev_dir)7, &ok, 1, 1) == -EINVAL, "direction 7");
  DC_REQ(kv_dev_memcpy_sync(e.d, KV_DEV_H2D, e.dev, stray, 64) == -EFAULT, "sync unregistered");
  DC_REQ(kv_dev_inflight(e.d) == 0, "a refused submission is in flight");
  kv_dev_done done;
  DC_REQ(kv_dev_reap(e.d, &done, 1) == 0, "a refused submission was reaped");
  /* The rule's guards: no unregister or destroy while unreaped. */
  DC_OK(kv_dev_submit(e.d, KV_DEV_H2D, &ok, 1, 9));
  DC_REQ(kv_dev_host_unregister(e.d, e.h) == -EBUSY, "unregister while in flight");
  DC_REQ(kv_dev_pool_destroy(e.d, e.p) == -EBUSY, "destroy while in flight");
  DC_REQ(dc_reap_n(e.d, &done, 1) == 0 && done.tag == 9 && done.status == 0, "reap");
  DC_OK(kv_dev_host_unregister(e.d, e.h));
  DC_REQ(kv_dev_host_unregister(e.d, e.h) == -ENOENT, "double unregister");
  DC_REQ(kv_dev_submit(e.d, KV_DEV_H2D, &ok, 1, 1) == -EFAULT, "after unregister");
  DC_OK(kv_dev_pool_destroy(e.d, e.p));
  DC_OK(kv_dev_host_register(e.d, e.h, e.bytes));
  DC_REQ(kv_dev_submit(e.d, KV_DEV_H2D, &ok, 1, 1) == -EFAULT, "into a destroyed pool");
  DC_REQ(kv_dev_host_register(e.d, e.h + 4096, 4096) == -EINVAL, "overlapping registration");
  dc_env_close(&e);
  free(stray);
  return NULL;
fail:
  dc_env_close(&e);
  free(stray);
  return dc_msg;
}

/* An injected failure is reaped with its status; the next is clean. */
const char *dc_inject(kv_dev_backend be) {
  dc_env e;
  DC_OK(dc_env_open(&e, be, 1 << 20));
  kv_dev_copy v[4];
  for (int i = 0; i < 4; i++) v[i] = (kv_dev_copy){e.dev + i * 4096, e.h + i * 4096, 4096};
  DC_REQ(kv_dev_inject_fail_next(e.d, 0) == -EINVAL, "status 0 injected");
  DC_OK(kv_dev_inject_fail_next(e.d, -EIO));
  DC_REQ(kv_dev_submit(e.d, KV_DEV_H2D, v, 0, 1) == -EINVAL, "bad submission");
  DC_OK(kv_dev_submit(e.d, KV_DEV_D2H, (kv_dev_copy[]){{e.h, e.dev, 64}}, 1, 1));
  DC_OK(kv_dev_submit(e.d, KV_DEV_H2D, v, 4, 2));
  kv_dev_done done[2];
  DC_REQ(dc_reap_n(e.d, done, 2) == 0, "reap");
  for (int i = 0; i < 2; i++) {
    int want = done[i].tag == 1 ? -EIO : 0;
    DC_REQ(done[i].status == want, "tag %llu status %d, want %d", (unsigned long long)done[i].tag,
           done[i].status, want);
  }
  dc_env_close(&e);
  return NULL;
fail:
  dc_env_close(&e);
  return dc_msg;
}

/* kv_dev_close with copies in flight: every copy lands before it returns. */
const char *dc_close_inflight(kv_dev_backend be) {
  dc_env e;
  enum { R = 8 << 20, N = 512 };
  uint8_t *want = malloc(R);
  DC_OK(dc_env_open(&e, be, R));
  DC_REQ(want, "malloc");
  dc_fill(want, R, 21);
  memcpy(e.h, want, R);
  DC_OK(dc_copy_wait(e.d, KV_DEV_H2D, e.dev, e.h, R));
  memset(e.h, 0, R);
  size_t b = R / N;
  for (unsigned i = 0; i < N; i++) {
    kv_dev_copy c = {e.h + i * b, e.dev + i * b, b};
    DC_OK(kv_dev_submit(e.d, KV_DEV_D2H, &c, 1, i));
  }
  kv_dev_close(e.d);
  e.d = NULL;
  DC_REQ(!memcmp(e.h, want, R), "a copy was lost at close");
  free(e.h);
  free(want);
  return NULL;
fail:
  dc_env_close(&e);
  free(want);
  return dc_msg;
}

/* Thousands of random copies, each round a set of submissions on all
 * directions that do not conflict, checked byte for byte against memcpy
 * on a model of both memories. */
static int dc_overlaps(uintptr_t a, size_t n, const uintptr_t *lo, const size_t *len, int k) {
  for (int i = 0; i < k; i++)
    if (a < lo[i] + len[i] && lo[i] < a + n) return 1;
  return 0;
}

static uint32_t dc_rnd(uint32_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 17;
  *x ^= *x << 5;
  return *x;
}

const char *dc_random(kv_dev_backend be, unsigned rounds, uint32_t seed) {
  dc_env e;
  enum { R = 4 << 20, MAXC = 32, MAXS = 8 };
  uint8_t *mh = malloc(R), *md = malloc(R);
  DC_OK(dc_env_open(&e, be, R));
  DC_REQ(mh && md, "malloc");
  dc_fill(mh, R, seed);
  dc_fill(md, R, seed + 1);
  memcpy(e.h, md, R);
  DC_OK(dc_copy_wait(e.d, KV_DEV_H2D, e.dev, e.h, R));
  memcpy(e.h, mh, R);
  uint32_t x = seed | 1;
#define DC_RND() dc_rnd(&x)
  unsigned ncopies = 0;
  for (unsigned r = 0; r < rounds; r++) {
    uintptr_t wlo[MAXC * MAXS], rlo[MAXC * MAXS];
    size_t wlen[MAXC * MAXS], rlen[MAXC * MAXS];
    int nw = 0, nr = 0;
    kv_dev_copy all[MAXS][MAXC];
    unsigned alln[MAXS];
    kv_dev_dir alld[MAXS];
    unsigned ns = 1 + DC_RND() % MAXS;
    for (unsigned s = 0; s < ns; s++) {
      kv_dev_dir dir = (kv_dev_dir)(DC_RND() % 3);
      unsigned want = 1 + DC_RND() % MAXC, n = 0;
      for (unsigned t = 0; t < want * 4 && n < want; t++) {
        size_t len = 1 + DC_RND() % (DC_RND() % 4 ? 4096 : 65536);
        size_t so = DC_RND() % (R - len), dof = DC_RND() % (R - len);
        uint8_t *src = (dir == KV_DEV_H2D ? e.h : e.dev) + so;
        uint8_t *dst = (dir == KV_DEV_D2H ? e.h : e.dev) + dof;
        uintptr_t s0 = (uintptr_t)src, d0 = (uintptr_t)dst;
        if (s0 < d0 + len && d0 < s0 + len) continue;
        if (dc_overlaps(d0, len, wlo, wlen, nw) || dc_overlaps(d0, len, rlo, rlen, nr) ||
            dc_overlaps(s0, len, wlo, wlen, nw))
          continue;
        wlo[nw] = d0, wlen[nw++] = len;
        rlo[nr] = s0, rlen[nr++] = len;
        all[s][n++] = (kv_dev_copy){dst, src, len};
      }
      alln[s] = n;
      alld[s] = dir;
      if (n) DC_OK(kv_dev_submit(e.d, dir, all[s], n, ((uint64_t)r << 8) | s));
    }
    kv_dev_done done[MAXS];
    unsigned nsub = 0;
    for (unsigned s = 0; s < ns; s++) nsub += alln[s] > 0;
    DC_REQ(dc_reap_n(e.d, done, nsub) == 0, "round %u: reap", r);
    for (unsigned i = 0; i < nsub; i++)
      DC_REQ(done[i].status == 0 && (done[i].tag >> 8) == r, "round %u: bad completion", r);
    /* The model: no conflicts within a round, so order does not matter. */
    for (unsigned s = 0; s < ns; s++)
      for (unsigned i = 0; i < alln[s]; i++) {
        const kv_dev_copy *c = &all[s][i];
        uint8_t *dm = alld[s] == KV_DEV_D2H ? mh : md;
        const uint8_t *sm = alld[s] == KV_DEV_H2D ? mh : md;
        size_t doff = (size_t)((uint8_t *)c->dst - (alld[s] == KV_DEV_D2H ? e.h : e.dev));
        size_t soff = (size_t)((const uint8_t *)c->src - (alld[s] == KV_DEV_H2D ? e.h : e.dev));
        memcpy(dm + doff, sm + soff, c->bytes);
        ncopies++;
      }
  }
#undef DC_RND
  DC_REQ(ncopies >= rounds, "only %u copies", ncopies);
  DC_REQ(!memcmp(e.h, mh, R), "host memory differs from the model after %u copies", ncopies);
  DC_OK(dc_copy_wait(e.d, KV_DEV_D2H, e.h, e.dev, R));
  DC_REQ(!memcmp(e.h, md, R), "device memory differs from the model after %u copies", ncopies);
  dc_env_close(&e);
  free(mh);
  free(md);
  return NULL;
fail:
  dc_env_close(&e);
  free(mh);
  free(md);
  return dc_msg;
}

/* ---- the batcher (cuda/batch.h) ------------------------------------------------ */

/* Reaps `want` tags from b into out, a few at a time; -1 on a hang or on
 * more than want. */
static int dc_breap_n(kv_dev_batcher *b, kv_dev_done *out, unsigned want) {
  unsigned got = 0;
  while (got < want) {
    unsigned k = kv_dev_batch_reap(b, out + got, want - got < 7 ? want - got : 7);
    if (k == 0 && kv_dev_wait(b->dev, DC_HANG_MS) == -ETIMEDOUT) return -1;
    got += k;
  }
  kv_dev_done extra;
  return kv_dev_batch_reap(b, &extra, 1) == 0 ? 0 : -1;
}

/* Copies added one at a time go as one submission per direction; every tag
 * comes back once with its submission's status; a submission refused whole
 * is retried copy by copy so the bad copy fails alone, reaped before any
 * wait; an injected failure reaches every tag of its submission; a
 * direction that fills (max) is submitted at once; the bytes land. */
const char *dc_batcher(kv_dev_backend be) {
  dc_env e;
  kv_dev_batcher b;
  memset(&b, 0, sizeof b);
  enum { NH = 300, ND = 40, BLK = 4096 };
  static kv_dev_done done[NH + ND];
  uint8_t *want = NULL;
  DC_OK(dc_env_open(&e, be, 4u << 20));
  DC_OK(kv_dev_batcher_init(&b, e.d, 0));
  DC_REQ(kv_dev_batcher_init(&b, e.d, KV_DEV_BATCH_MAX + 1) == -EINVAL, "max over the device's");
  dc_fill(e.h, e.bytes, 9);
  /* Device blocks NH.. hold a pattern to read back. */
  DC_OK(dc_copy_wait(e.d, KV_DEV_H2D, e.dev + (size_t)NH * BLK, e.h + (size_t)NH * BLK,
                     (size_t)ND * BLK));
  want = malloc(e.bytes);
  DC_REQ(want, "malloc");
  memcpy(want, e.h, e.bytes);
  for (unsigned i = 0; i < NH; i++) { /* host block i -> device block NH - 1 - i */
    kv_dev_copy c = {e.dev + (size_t)(NH - 1 - i) * BLK, e.h + (size_t)i * BLK, BLK};
    DC_OK(kv_dev_batch_add(&b, KV_DEV_H2D, &c, 1 + i));
  }
  for (unsigned i = 0; i < ND; i++) { /* device block NH + i -> host block 512 + i */
    kv_dev_copy c = {e.h + (size_t)(512 + i) * BLK, e.dev + (size_t)(NH + i) * BLK, BLK};
    DC_OK(kv_dev_batch_add(&b, KV_DEV_D2H, &c, 1001 + i));
  }
  kv_dev_copy zero = {e.dev, e.h, 0};
  DC_REQ(kv_dev_batch_add(&b, KV_DEV_H2D, &zero, 7) == -EINVAL, "a copy of 0 bytes queued");
  DC_REQ(kv_dev_batch_add(&b, (kv_dev_dir)KV_DEV_NDIR, &zero, 7) == -EINVAL, "a bad direction");
  DC_REQ(kv_dev_inflight(e.d) == 0, "submitted before the flush: %u", kv_dev_inflight(e.d));
  DC_REQ(kv_dev_batch_queued(&b) == NH + ND, "queued %u", kv_dev_batch_queued(&b));
  DC_REQ(kv_dev_batch_reap(&b, done, 1) == 0, "reaped before the flush");
  DC_REQ(kv_dev_batch_flush(&b) == 2, "not one submission per direction");
  DC_REQ(kv_dev_inflight(e.d) == 2, "inflight %u", kv_dev_inflight(e.d));
  DC_REQ(b.submissions[KV_DEV_H2D] == 1 && b.copies[KV_DEV_H2D] == NH,
         "H2D: %llu submissions, %llu copies", (unsigned long long)b.submissions[KV_DEV_H2D],
         (unsigned long long)b.copies[KV_DEV_H2D]);
  DC_REQ(kv_dev_batch_queued(&b) == 0 && kv_dev_batch_flush(&b) == 0, "a second flush submitted");
  DC_REQ(dc_breap_n(&b, done, NH + ND) == 0, "reaping %u tags", NH + ND);
  {
    static unsigned seen[NH + ND];
    memset(seen, 0, sizeof seen);
    for (unsigned i = 0; i < NH + ND; i++) {
      uint64_t t = done[i].tag;
      DC_REQ(done[i].status == 0, "tag %llu: status %d", (unsigned long long)t, done[i].status);
      DC_REQ((t >= 1 && t <= NH) || (t >= 1001 && t < 1001 + ND), "stray tag %llu",
             (unsigned long long)t);
      seen[t <= NH ? t - 1 : NH + t - 1001]++;
    }
    for (unsigned i = 0; i < NH + ND; i++)
      DC_REQ(seen[i] == 1, "tag #%u reaped %u times", i, seen[i]);
  }
  DC_REQ(kv_dev_inflight(e.d) == 0, "inflight after reaping");
  for (unsigned i = 0; i < ND; i++)
    DC_REQ(!memcmp(e.h + (size_t)(512 + i) * BLK, want + (size_t)(NH + i) * BLK, BLK),
           "D2H block %u", i);
  DC_OK(dc_copy_wait(e.d, KV_DEV_D2H, e.h + (size_t)600 * BLK, e.dev, (size_t)NH * BLK));
  for (unsigned i = 0; i < NH; i++)
    DC_REQ(!memcmp(e.h + (size_t)(600 + NH - 1 - i) * BLK, want + (size_t)i * BLK, BLK),
           "H2D block %u", i);

  /* One copy from unregistered memory: the others go on without it. */
  static uint8_t stray[BLK];
  kv_dev_copy r[3] = {
      {e.dev, e.h, BLK}, {e.dev + BLK, stray, BLK}, {e.dev + 2 * BLK, e.h + BLK, BLK}};
  for (unsigned i = 0; i < 3; i++) DC_OK(kv_dev_batch_add(&b, KV_DEV_H2D, &r[i], 50 + i));
  DC_REQ(kv_dev_batch_flush(&b) == 2, "the good copies were not submitted");
  DC_REQ(b.split[KV_DEV_H2D] == 1 && b.refused[KV_DEV_H2D] == 1, "split %llu refused %llu",
         (unsigned long long)b.split[KV_DEV_H2D], (unsigned long long)b.refused[KV_DEV_H2D]);
  DC_REQ(kv_dev_batch_reap(&b, done, 1) == 1 && done[0].tag == 51 && done[0].status == -EFAULT,
         "the refused copy is not reaped first with -EFAULT (tag %llu, %d)",
         (unsigned long long)done[0].tag, done[0].status);
  DC_REQ(dc_breap_n(&b, done, 2) == 0, "the other two");
  for (unsigned i = 0; i < 2; i++)
    DC_REQ(done[i].tag != 51 && done[i].status == 0, "tag %llu: %d",
           (unsigned long long)done[i].tag, done[i].status);

  /* An injected failure reaches every copy of its submission. */
  DC_OK(kv_dev_inject_fail_next(e.d, -EIO));
  for (unsigned i = 0; i < 4; i++) {
    kv_dev_copy c = {e.dev + (size_t)i * BLK, e.h + (size_t)i * BLK, BLK};
    DC_OK(kv_dev_batch_add(&b, KV_DEV_H2D, &c, 60 + i));
  }
  DC_REQ(kv_dev_batch_flush(&b) == 1, "one submission");
  DC_REQ(dc_breap_n(&b, done, 4) == 0, "four tags");
  for (unsigned i = 0; i < 4; i++)
    DC_REQ(done[i].status == -EIO, "tag %llu: %d", (unsigned long long)done[i].tag, done[i].status);
  kv_dev_batcher_fini(&b);

  /* A full direction is submitted at once; a refusal there waits in the
   * batcher for the next reap, counted by kv_dev_batch_ready. */
  DC_OK(kv_dev_batcher_init(&b, e.d, 2));
  DC_REQ(kv_dev_batch_ready(&b) == 0, "ready before any add");
  DC_OK(kv_dev_batch_add(&b, KV_DEV_H2D, &r[1], 80));
  DC_OK(kv_dev_batch_add(&b, KV_DEV_H2D, &r[0], 81));
  DC_REQ(kv_dev_batch_queued(&b) == 0 && kv_dev_batch_ready(&b) == 1, "queued %u, ready %u",
         kv_dev_batch_queued(&b), kv_dev_batch_ready(&b));
  DC_REQ(dc_breap_n(&b, done, 2) == 0, "the refused copy and the good one");
  DC_REQ(done[0].tag == 80 && done[0].status == -EFAULT, "tag %llu: %d",
         (unsigned long long)done[0].tag, done[0].status);
  DC_REQ(done[1].tag == 81 && done[1].status == 0, "tag %llu: %d", (unsigned long long)done[1].tag,
         done[1].status);
  DC_REQ(kv_dev_batch_ready(&b) == 0, "ready after reaping");
  kv_dev_batcher_fini(&b);
  DC_OK(kv_dev_batcher_init(&b, e.d, 8));
  for (unsigned i = 0; i < 20; i++) {
    kv_dev_copy c = {e.dev + (size_t)i * BLK, e.h + (size_t)i * BLK, BLK};
    DC_OK(kv_dev_batch_add(&b, KV_DEV_H2D, &c, 70 + i));
  }
  DC_REQ(b.submissions[KV_DEV_H2D] == 2 && kv_dev_batch_queued(&b) == 4,
         "%llu submissions, %u queued", (unsigned long long)b.submissions[KV_DEV_H2D],
         kv_dev_batch_queued(&b));
  DC_REQ(kv_dev_batch_flush(&b) == 1, "the rest");
  DC_REQ(dc_breap_n(&b, done, 20) == 0, "twenty tags");
  for (unsigned i = 0; i < 20; i++)
    DC_REQ(done[i].tag == 70 + i, "FIFO: #%u is %llu", i, (unsigned long long)done[i].tag);
  kv_dev_batcher_fini(&b);
  free(want);
  dc_env_close(&e);
  return NULL;
fail:
  kv_dev_batcher_fini(&b);
  free(want);
  dc_env_close(&e);
  return dc_msg;
}
