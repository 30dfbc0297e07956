/* test_g1_client.c - libkvclient's side of G1, without kvcached: its
 * import of a HELLO reply's G1 entry refuses bad values with a reason (the
 * fd closed either way), and against fake daemons that cannot select this
 * device's pool it says why. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/errors.h"
#include "client/g1.h"
#include "client/kvclient.h"
#include "cuda/dev.h"
#include "ipc/reader.h"
#include "ipc/sock.h"
#include "proto/wire.h"
#include "tests/lib/dev_checks.h"

#define BLOCK 65536u

static void sim_uuid(int ordinal, uint8_t u[16]) {
  cr_assert_eq(dc_uuid_of(KV_DEV_SIM, ordinal, u), 0);
}

/* The client's import of the entry: bad values give a reason, not a crash,
 * and the fd is closed either way. */
static int memfd_of(size_t n) {
  int fd = memfd_create("g1-test", MFD_CLOEXEC);
  cr_assert_geq(fd, 0);
  cr_assert_eq(ftruncate(fd, (off_t)n), 0);
  return fd;
}

static int is_closed(int fd) { return fcntl(fd, F_GETFD) < 0 && errno == EBADF; }

Test(g1_client, corrupt_entries_give_reasons) {
  kv_dev *d;
  cr_assert_eq(kv_dev_open(&d, &(kv_dev_opts){.backend = KV_DEV_SIM}), 0);
  kv_dev_pool *pool;
  cr_assert_eq(kv_dev_pool_create(d, 1 << 20, &pool), 0);
  kv_dev_export x;
  cr_assert_eq(kv_dev_pool_export(pool, &x), 0);
  uint8_t enc[KV_DEVX_ENCODED_MAX];
  int n = kv_dev_export_encode(&x, enc, sizeof enc);
  cr_assert_gt(n, 0);

  kvc__g1 g;
  /* Corrupt magic. */
  memset(&g, 0, sizeof g);
  uint8_t bad[KV_DEVX_ENCODED_MAX];
  memcpy(bad, enc, (size_t)n);
  bad[0] ^= 0xff;
  int fd = dup(x.fd);
  cr_assert_eq(kvc__g1_import(&g, KV_TI_G1_SIM_FD, bad, (size_t)n, fd), KV_EBADFRAME);
  cr_assert_eq(g.info.available, 0);
  cr_assert(strstr(g.info.reason, "does not decode"), "%s", g.info.reason);
  cr_assert(is_closed(fd));
  /* Truncated. */
  memset(&g, 0, sizeof g);
  fd = dup(x.fd);
  cr_assert_eq(kvc__g1_import(&g, KV_TI_G1_SIM_FD, enc, (size_t)n - 1, fd), KV_EBADFRAME);
  cr_assert(is_closed(fd));
  /* Entry kind and export kind disagree. */
  memset(&g, 0, sizeof g);
  fd = dup(x.fd);
  cr_assert_eq(kvc__g1_import(&g, KV_TI_G1_VMM_FD, enc, (size_t)n, fd), KV_EBADFRAME);
  /* Unknown kind. */
  memset(&g, 0, sizeof g);
  fd = dup(x.fd);
  cr_assert_eq(kvc__g1_import(&g, 77, enc, (size_t)n, fd), -EOPNOTSUPP);
  cr_assert(strstr(g.info.reason, "77"), "%s", g.info.reason);
  cr_assert(is_closed(fd));
  /* No fd for an fd kind. */
  memset(&g, 0, sizeof g);
  cr_assert_eq(kvc__g1_import(&g, KV_TI_G1_SIM_FD, enc, (size_t)n, -1), KV_EBADFD);
  cr_assert(strstr(g.info.reason, "fd"), "%s", g.info.reason);
  /* An fd smaller than the pool the export claims. */
  memset(&g, 0, sizeof g);
  fd = memfd_of(4096);
  cr_assert_lt(kvc__g1_import(&g, KV_TI_G1_SIM_FD, enc, (size_t)n, fd), 0);
  cr_assert_eq(g.info.available, 0);
  cr_assert(strstr(g.info.reason, "cannot map"), "%s", g.info.reason);
  cr_assert(is_closed(fd));
  kvc__g1_release(&g);
  /* The real thing imports, and the mapping shows the pool's bytes. */
  memset(&g, 0, sizeof g);
  fd = dup(x.fd);
  cr_assert_eq(kvc__g1_import(&g, KV_TI_G1_SIM_FD, enc, (size_t)n, fd), 0, "%s", g.info.reason);
  cr_assert_eq(g.info.available, 1);
  cr_assert_eq(g.info.bytes, kv_dev_pool_bytes(pool));
  cr_assert(is_closed(fd));
  kvc__g1_release(&g);
  cr_assert_eq(g.info.available, 0);
  cr_assert_eq(kv_dev_pool_destroy(d, pool), 0);
  kv_dev_close(d);
}

/* ---- libkvclient against daemons that cannot select ---------------------------- */

/* A stand-in daemon on one connection: answers HELLO (protocol 1.`minor`)
 * with an arena and a pool on simulated device 0; then, by mode, answers a
 * G1_SELECT with an ERROR (1) or hangs up on it (2). Exits 0 when the
 * worker did what the mode expects (mode 0: it sent nothing after HELLO). */
static int fake_daemon(int lfd, int minor, int mode) {
  int s = accept(lfd, NULL, NULL);
  if (s < 0) return 20;
  kv_reader rd;
  kv_reader_init(&rd, 0);
  kv_frame f;
  kv_msg m;
  if (kv_reader_recv(&rd, s, &f, 5000) != 1 || kv_msg_decode(f.p, f.len, &m) || m.op != KV_OP_HELLO)
    return 21;
  kv_dev *d;
  kv_dev_pool *pool;
  kv_dev_export x;
  uint8_t enc[KV_DEVX_ENCODED_MAX];
  if (kv_dev_open(&d, &(kv_dev_opts){.backend = KV_DEV_SIM}) ||
      kv_dev_pool_create(d, 1 << 20, &pool) || kv_dev_pool_export(pool, &x))
    return 22;
  int n = kv_dev_export_encode(&x, enc, sizeof enc);
  int arena = memfd_create("fake-arena", MFD_CLOEXEC);
  if (n < 0 || arena < 0 || ftruncate(arena, 1 << 20)) return 23;
  kv_tierinfo ti = {.tier = KV_G1, .kind = KV_TI_G1_SIM_FD, .len = (uint16_t)n, .p = enc};
  kv_msg r;
  memset(&r, 0, sizeof r);
  r.op = KV_OP_HELLO;
  r.flags = KV_F_REPLY | KV_F_FD | KV_F_FD2;
  r.id = m.id;
  r.hello_rep = (kv_hello_rep){.ver_major = 1,
                               .ver_minor = (uint16_t)minor,
                               .caps = KV_CAP_G1,
                               .session_id = 1,
                               .arena_bytes = 1 << 20,
                               .slot_align = 4096,
                               .slot_bytes = BLOCK,
                               .ntierinfo = 1,
                               .tierinfo = &ti};
  kv_buf b;
  kv_buf_init(&b);
  if (kv_msg_encode(&b, &r)) return 24;
  struct iovec iov = {b.p, b.len};
  int fds[2] = {arena, x.fd};
  if (kv_sock_send_frame_fds(s, &iov, 1, fds, 2, 5000)) return 25;
  int rc = kv_reader_recv(&rd, s, &f, 5000);
  if (mode == 0) return rc == 0 ? 0 : 26; /* the worker closed, asking nothing */
  if (rc != 1 || kv_msg_decode(f.p, f.len, &m) || m.op != KV_OP_G1_SELECT) return 27;
  if (mode == 2) return 0; /* hang up */
  kv_buf_reset(&b);
  if (kv_msg_encode_error(&b, m.id, KV_OP_G1_SELECT, KV_EBADOP, NULL)) return 28;
  iov = (struct iovec){b.p, b.len};
  if (kv_sock_send_frame(s, &iov, 1, -1, 5000)) return 29;
  rc = kv_reader_recv(&rd, s, &f, 5000);
  return rc == 0 ? 0 : 30;
}

/* Runs a worker on simulated device 3 against fake_daemon(minor, mode):
 * kvc_open's result, and the G1 reason when it opened. */
static int against_fake(int minor, int mode, char *reason, size_t cap) {
  char dir[] = "/tmp/kvfake-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char path[64];
  snprintf(path, sizeof path, "%s/s", dir);
  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  cr_assert_eq(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(listen(lfd, 1), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) _exit(fake_daemon(lfd, minor, mode));
  close(lfd);
  uint8_t u3[16];
  sim_uuid(3, u3);
  kvc_opts o = {
      .socket_path = path,
      .tenant = "t1",
      .g1_uuid = u3,
      .timeout_ms = 5000,
      .layout = {.block_bytes = BLOCK, .tokens_per_block = 16, .tp_size = 1, .dtype = "bf16"}};
  kvc *c = NULL;
  int rc = kvc_open(&o, &c);
  reason[0] = 0;
  if (rc == 0) {
    kvc_g1 g;
    cr_assert_eq(kvc_g1_info(c, &g), 0);
    cr_assert_eq(g.available, 0, "device 0's pool mapped for a worker on device 3");
    snprintf(reason, cap, "%s", g.reason);
    kvc_close(c);
  }
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the fake daemon saw otherwise: %d",
            WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  unlink(path);
  rmdir(dir);
  return rc;
}

Test(g1_client, daemons_that_cannot_give_this_devices_pool) {
  char why[400];
  int open_fds = 0;
  for (int fd = 0; fd < 1024; fd++) open_fds += fcntl(fd, F_GETFD) >= 0;
  /* 1.0: no G1_SELECT is sent; G2, and why. */
  cr_assert_eq(against_fake(0, 0, why, sizeof why), 0);
  cr_assert(strstr(why, "protocol 1.0"), "%s", why);
  /* It refuses G1_SELECT: G2, and why. */
  cr_assert_eq(against_fake(1, 1, why, sizeof why), 0);
  cr_assert(strstr(why, "refused G1_SELECT"), "%s", why);
  /* It hangs up on G1_SELECT: kvc_open fails, nothing leaks. */
  cr_assert_lt(against_fake(1, 2, why, sizeof why), 0);
  int now = 0;
  for (int fd = 0; fd < 1024; fd++) now += fcntl(fd, F_GETFD) >= 0;
  cr_assert_eq(now, open_fds, "fds leaked: %d before, %d after", open_fds, now);
}
