/*
 * test_ipc_sock.c - the listening socket and its directory (modes, the
 * lock, a stale socket replaced, a live one refused, a non-socket never
 * removed), connect/accept errors, peer credentials in one process and
 * across fork, and sending a frame: partial writes, timeouts, a dead peer.
 */
#include "ipc/sock.h"

#include "base/clock.h"
#include "tests/lib/tmpdir.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmp[64];
static char dir[128];

static void setup(void) {
  snprintf(tmp, sizeof tmp, "/tmp/kv-ipc-XXXXXX");
  cr_assert_not_null(mkdtemp(tmp));
  snprintf(dir, sizeof dir, "%s/run", tmp);
}

static void teardown(void) {
  if (kvt_rmtree(tmp) != 0) cr_log_warn("could not remove %s", tmp);
}

static mode_t mode_of(const char *path) {
  struct stat st;
  cr_assert_eq(lstat(path, &st), 0, "stat %s: %s", path, strerror(errno));
  return st.st_mode & 07777;
}

/* A socket file with nobody behind it, as a daemon killed with -9 leaves. */
static void make_stale(const char *path) {
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%.107s", path);
  cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  close(s);
}

TestSuite(listen, .init = setup, .fini = teardown);

Test(listen, refuses_a_live_daemon) {
  kv_listener a, b;
  cr_assert_eq(kv_listen(&a, dir, "kvcached.sock", NULL), 0);
  cr_assert_eq(kv_listen(&b, dir, "kvcached.sock", NULL), -EADDRINUSE);
  cr_assert_eq(b.fd, -1);
  cr_assert_eq(b.lock_fd, -1);
  /* a's socket is untouched and still answers */
  int c = kv_sock_connect(a.path, 0);
  cr_assert_geq(c, 0, "%s", strerror(-c));
  close(c);
  kv_listener_close(&a);
}

Test(listen, refuses_a_live_daemon_in_another_process) {
  int ready[2];
  cr_assert_eq(pipe(ready), 0);
  pid_t pid = fork();
  if (pid == 0) {
    kv_listener l;
    char ok = kv_listen(&l, dir, "k.sock", NULL) == 0 ? 'y' : 'n';
    if (write(ready[1], &ok, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char ok = 0;
  cr_assert_eq(read(ready[0], &ok, 1), 1);
  cr_assert_eq(ok, 'y');
  kv_listener l;
  cr_assert_eq(kv_listen(&l, dir, "k.sock", NULL), -EADDRINUSE);
  /* kill -9: the lock goes with the process, the file stays, and is replaced */
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  char path[256];
  snprintf(path, sizeof path, "%s/k.sock", dir);
  cr_assert_eq(access(path, F_OK), 0, "the dead daemon's socket file is still there");
  cr_assert_eq(kv_sock_connect(path, 0), -ECONNREFUSED);
  cr_assert_eq(kv_listen(&l, dir, "k.sock", NULL), 0);
  int c = kv_sock_connect(path, 0);
  cr_assert_geq(c, 0);
  close(c);
  kv_listener_close(&l);
}

Test(listen, refuses_a_live_socket_without_lock) {
  /* someone listens on the path without our lock file */
  cr_assert_eq(mkdir(dir, 0750), 0);
  char path[256];
  snprintf(path, sizeof path, "%s/x.sock", dir);
  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%.107s", path);
  cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(listen(s, 4), 0);
  kv_listener l;
  cr_assert_eq(kv_listen(&l, dir, "x.sock", NULL), -EADDRINUSE);
  cr_assert_eq(access(path, F_OK), 0, "a live socket file is never removed");
  close(s);
}

Test(listen, replaces_a_stale_socket) {
  cr_assert_eq(mkdir(dir, 0750), 0);
  char path[256];
  snprintf(path, sizeof path, "%s/s.sock", dir);
  make_stale(path);
  cr_assert_eq(kv_sock_connect(path, 0), -ECONNREFUSED);
  kv_listener l;
  cr_assert_eq(kv_listen(&l, dir, "s.sock", NULL), 0);
  int c = kv_sock_connect(path, 0);
  cr_assert_geq(c, 0);
  int a = kv_sock_accept(l.fd, 0);
  cr_assert_geq(a, 0);
  close(a);
  close(c);
  kv_listener_close(&l);
}

Test(listen, never_removes_a_file_that_is_not_a_socket) {
  cr_assert_eq(mkdir(dir, 0750), 0);
  char path[256];
  snprintf(path, sizeof path, "%s/f.sock", dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs("precious", f);
  fclose(f);
  kv_listener l;
  cr_assert_eq(kv_listen(&l, dir, "f.sock", NULL), -EEXIST);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_eq(st.st_size, 8);
  /* a symlink to elsewhere is not a socket either */
  char link[256];
  snprintf(link, sizeof link, "%s/l.sock", dir);
  cr_assert_eq(symlink(path, link), 0);
  cr_assert_eq(kv_listen(&l, dir, "l.sock", NULL), -EEXIST);
}

Test(listen, bad_names_and_directories) {
  kv_listener l;
  cr_assert_eq(kv_listen(&l, dir, "a/b", NULL), -EINVAL);
  cr_assert_eq(kv_listen(&l, dir, "", NULL), -EINVAL);
  cr_assert_eq(kv_listen(&l, NULL, "x", NULL), -EINVAL);
  char name[120];
  memset(name, 'n', sizeof name - 1);
  name[sizeof name - 1] = 0;
  cr_assert_eq(kv_listen(&l, dir, name, NULL), -ENAMETOOLONG);
  /* dir is a regular file */
  char file[200];
  snprintf(file, sizeof file, "%s/plain", tmp);
  close(open(file, O_CREAT | O_WRONLY, 0600));
  cr_assert_eq(kv_listen(&l, file, "x.sock", NULL), -ENOTDIR);
  /* the parent of dir is missing: not created */
  char deep[200];
  snprintf(deep, sizeof deep, "%s/a/b", tmp);
  cr_assert_eq(kv_listen(&l, deep, "x.sock", NULL), -ENOENT);
  cr_assert_eq(l.fd, -1);
  kv_listener_close(&l); /* harmless on a failed listener */
}

Test(listen, modes) {
  mode_t old = umask(077); /* a strict umask must not narrow the modes we ask */
  kv_listener l;
  cr_assert_eq(kv_listen(&l, dir, "m.sock", NULL), 0);
  cr_assert_eq(mode_of(dir), 0750, "directory %o", mode_of(dir));
  cr_assert_eq(mode_of(l.path), 0660, "socket %o", mode_of(l.path));
  kv_listener_close(&l);
  umask(0); /* nor a lax one widen them */
  kv_listen_opts o = {.sock_mode = 0600};
  cr_assert_eq(kv_listen(&l, dir, "n.sock", &o), 0);
  cr_assert_eq(mode_of(l.path), 0600);
  cr_assert_eq(mode_of(dir), 0750, "an existing directory is left as it is");
  kv_listener_close(&l);
  char d2[200];
  snprintf(d2, sizeof d2, "%s/other", tmp);
  o = (kv_listen_opts){.dir_mode = 0700, .sock_mode = 0666};
  cr_assert_eq(kv_listen(&l, d2, "o.sock", &o), 0);
  cr_assert_eq(mode_of(d2), 0700);
  cr_assert_eq(mode_of(l.path), 0666);
  kv_listener_close(&l);
  umask(old);
}

Test(listen, close_removes_the_socket_keeps_the_lock_file) {
  kv_listener l;
  cr_assert_eq(kv_listen(&l, dir, "c.sock", NULL), 0);
  char path[KV_SOCK_PATH_MAX], lock[KV_SOCK_PATH_MAX + 8];
  snprintf(path, sizeof path, "%s", l.path);
  snprintf(lock, sizeof lock, "%s.lock", path);
  kv_listener_close(&l);
  kv_listener_close(&l);
  cr_assert_eq(access(path, F_OK), -1);
  cr_assert_eq(access(lock, F_OK), 0);
  cr_assert_eq(kv_sock_connect(path, 0), -ENOENT);
  cr_assert_eq(kv_listen(&l, dir, "c.sock", NULL), 0, "the lock was released");
  kv_listener_close(&l);
}

Test(listen, nonblocking_accept) {
  kv_listen_opts o = {.flags = KV_SOCK_NONBLOCK};
  kv_listener l;
  cr_assert_eq(kv_listen(&l, dir, "nb.sock", &o), 0);
  cr_assert_eq(kv_sock_accept(l.fd, 0), -EAGAIN);
  int c = kv_sock_connect(l.path, KV_SOCK_NONBLOCK);
  cr_assert_geq(c, 0);
  cr_assert(fcntl(c, F_GETFL) & O_NONBLOCK);
  cr_assert(fcntl(c, F_GETFD) & FD_CLOEXEC);
  int a = kv_sock_accept(l.fd, KV_SOCK_NONBLOCK);
  cr_assert_geq(a, 0);
  cr_assert(fcntl(a, F_GETFL) & O_NONBLOCK);
  cr_assert(fcntl(a, F_GETFD) & FD_CLOEXEC);
  cr_assert(fcntl(l.fd, F_GETFD) & FD_CLOEXEC);
  cr_assert(fcntl(l.lock_fd, F_GETFD) & FD_CLOEXEC);
  close(a);
  close(c);
  kv_listener_close(&l);
}

Test(connect, errors) {
  cr_assert_eq(kv_sock_connect("/nonexistent/kv/sock", 0), -ENOENT);
  cr_assert_eq(kv_sock_connect("", 0), -EINVAL);
  char longp[200];
  memset(longp, 'p', sizeof longp - 1);
  longp[sizeof longp - 1] = 0;
  cr_assert_eq(kv_sock_connect(longp, 0), -ENAMETOOLONG);
}

Test(peercred, socketpair_in_one_process) {
  int sv[2];
  cr_assert_eq(kv_sock_pair(sv), 0);
  kv_peercred c;
  cr_assert_eq(kv_sock_peercred(sv[0], &c), 0);
  cr_assert_eq(c.pid, getpid());
  cr_assert_eq(c.uid, getuid());
  cr_assert_eq(c.gid, getgid());
  close(sv[0]);
  close(sv[1]);
}

Test(peercred, a_forked_client, .init = setup, .fini = teardown) {
  kv_listener l;
  cr_assert_eq(kv_listen(&l, dir, "p.sock", NULL), 0);
  pid_t pid = fork();
  if (pid == 0) {
    int c = kv_sock_connect(l.path, 0);
    if (c < 0) _exit(1);
    char b;
    if (read(c, &b, 1) != 1) _exit(2); /* hold on until the parent has looked */
    _exit(0);
  }
  int a = kv_sock_accept(l.fd, 0);
  cr_assert_geq(a, 0);
  kv_peercred c;
  cr_assert_eq(kv_sock_peercred(a, &c), 0);
  cr_assert_eq(c.pid, pid, "peer pid %d, child %d", (int)c.pid, (int)pid);
  cr_assert_eq(c.uid, getuid());
  /* and the child sees the daemon side: this process */
  cr_assert_eq(write(a, "x", 1), 1);
  int st;
  waitpid(pid, &st, 0);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  close(a);
  kv_listener_close(&l);
}

Test(send, whole_frame_through_partial_writes) {
  int sv[2];
  cr_assert_eq(kv_sock_pair(sv), 0);
  cr_assert_eq(kv_sock_set_nonblock(sv[0], 1), 0);
  size_t n = 8u << 20; /* far more than the socket buffer */
  uint8_t *big = malloc(n);
  for (size_t i = 0; i < n; i++) big[i] = (uint8_t)(i * 7);
  pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    uint8_t *got = malloc(n);
    size_t have = 0;
    while (have < n) {
      ssize_t r = read(sv[1], got + have, n - have);
      if (r <= 0) _exit(1);
      have += (size_t)r;
    }
    _exit(memcmp(got, big, n) ? 2 : 0);
  }
  close(sv[1]);
  struct iovec iov[3] = {{big, 1000}, {big + 1000, 0}, {big + 1000, n - 1000}};
  cr_assert_eq(kv_sock_send_frame(sv[0], iov, 3, -1, 10000), 0);
  int st;
  waitpid(pid, &st, 0);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %d", st);
  close(sv[0]);
  free(big);
}

Test(send, timeout_when_nobody_reads) {
  int sv[2];
  cr_assert_eq(kv_sock_pair(sv), 0);
  size_t n = 16u << 20;
  uint8_t *big = calloc(1, n);
  struct iovec iov = {big, n};
  int64_t t0 = kv_now_ms();
  /* a blocking socket too: the send never blocks past the deadline */
  cr_assert_eq(kv_sock_send_frame(sv[0], &iov, 1, -1, 100), -ETIMEDOUT);
  int64_t dt = kv_now_ms() - t0;
  cr_assert(dt >= 90 && dt < 2000, "took %lld ms", (long long)dt);
  free(big);
  close(sv[0]);
  close(sv[1]);
}

Test(send, dead_peer_is_epipe_not_sigpipe) {
  int sv[2];
  cr_assert_eq(kv_sock_pair(sv), 0);
  close(sv[1]);
  struct iovec iov = {"hello", 5};
  cr_assert_eq(kv_sock_send_frame(sv[0], &iov, 1, -1, 100), -EPIPE);
  cr_assert_eq(kv_sock_send_frame(sv[0], &iov, 0, -1, 100), -EINVAL);
  struct iovec empty = {"", 0};
  cr_assert_eq(kv_sock_send_frame(sv[0], &empty, 1, -1, 100), -EINVAL);
  close(sv[0]);
}
