/* accept.c - accepting at the descriptor limit, and the descriptor budget
 * (see accept.h). */
#include "daemon/accept.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/log.h"
#include "ipc/sock.h"

static int reserve = -1;
static int ops[KVD_FD_OPS_RESERVE];
static unsigned nops;

void kvd_fd_ops_refill(void) {
  while (nops < KVD_FD_OPS_RESERVE) {
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ops[nops++] = fd;
  }
}

unsigned kvd_fd_ops_held(void) { return nops; }

int kvd_fd_ops_room(void *arg) {
  (void)arg;
  if (!nops) return 0;
  close(ops[--nops]);
  return 1;
}

int kvd_fd_reserve_init(void) {
  int rc = 0;
  if (reserve < 0) {
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) rc = -errno;
    else reserve = fd;
  }
  kvd_fd_ops_refill();
  if (!rc && nops < KVD_FD_OPS_RESERVE) rc = -EMFILE;
  return rc;
}

void kvd_fd_reserve_fini(void) {
  if (reserve >= 0) close(reserve);
  reserve = -1;
  while (nops) close(ops[--nops]);
}

int kvd_accept(int lfd, kvd_room_fn room, kvd_refuse_fn refuse, void *arg, int *shed) {
  if (shed) *shed = 0;
  int fd = kv_sock_accept(lfd, KV_SOCK_NONBLOCK);
  if (fd >= 0 || fd == -EAGAIN) return fd;
  if (fd != -EMFILE && fd != -ENFILE) return fd;
  if (room && room(arg)) {
    fd = kv_sock_accept(lfd, KV_SOCK_NONBLOCK);
    if (fd >= 0 || fd == -EAGAIN || (fd != -EMFILE && fd != -ENFILE)) return fd;
  }
  if (reserve < 0) return fd;
  close(reserve);
  reserve = -1;
  int c = kv_sock_accept(lfd, KV_SOCK_NONBLOCK);
  if (c >= 0) {
    if (refuse) refuse(arg, c);
    close(c);
    if (shed) *shed = 1;
  }
  kvd_fd_reserve_init(); /* the slot just freed; failing, the next limit pauses */
  if (c >= 0) return fd;
  return c;
}

int kvd_fds_open(void) {
  DIR *dir = opendir("/proc/self/fd");
  if (!dir) return -errno;
  int n = 0;
  for (struct dirent *e; (e = readdir(dir));)
    if (e->d_name[0] != '.') n++;
  closedir(dir);
  return n > 0 ? n - 1 : 0; /* not the directory's own */
}

int64_t kvd_fd_budget(uint64_t others, uint64_t want) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl)) return -errno;
  uint64_t need = others + want;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need &&
      (rl.rlim_max == RLIM_INFINITY || rl.rlim_max > rl.rlim_cur)) {
    struct rlimit nr = rl;
    nr.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &nr) == 0) {
      kv_info("server", "RLIMIT_NOFILE raised from %llu to %llu descriptors",
              (unsigned long long)rl.rlim_cur, (unsigned long long)nr.rlim_cur);
      rl = nr;
    } else {
      kv_warn("server", "cannot raise RLIMIT_NOFILE from %llu to %llu: %s",
              (unsigned long long)rl.rlim_cur, (unsigned long long)nr.rlim_cur,
              kv_strerror(-errno));
    }
  }
  if (rl.rlim_cur == RLIM_INFINITY) return (int64_t)want;
  if (rl.rlim_cur <= others) return 0;
  uint64_t room = rl.rlim_cur - others;
  return (int64_t)(room < want ? room : want);
}
