/* daemon.c - the one launcher of kvcached for the tests (daemon.h). */
#include "tests/lib/daemon.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/paths.h"
#include "ipc/sock.h"
#include "tests/lib/tmpdir.h"

/* $KVCACHED_BIN, else kvcached beside this program. */
static int exe_path(char *out, size_t n) {
  const char *env = getenv("KVCACHED_BIN");
  if (env && *env) return snprintf(out, n, "%s", env) < (int)n ? 0 : -ENAMETOOLONG;
  ssize_t k = readlink("/proc/self/exe", out, n - 16);
  if (k <= 0) return -errno;
  out[k] = 0;
  strcpy(strrchr(out, '/') + 1, "kvcached");
  return 0;
}

static int add_arg(kvt_daemon *d, const char *w) {
  if (d->argc == KVT_ARGS_MAX) return -E2BIG;
  if (!(d->argv[d->argc] = strdup(w))) return -ENOMEM;
  d->argv[++d->argc] = NULL;
  return 0;
}

static int write_config(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) return -errno;
  int rc = fputs(text, f) < 0 ? -EIO : 0;
  if (fclose(f) && !rc) rc = -errno;
  return rc;
}

static int can_connect(const char *path) {
  int fd = kv_sock_connect(path, 0);
  if (fd < 0) return 0;
  close(fd);
  return 1;
}

static void drop_dir(kvt_daemon *d) {
  if (d->own_dir && d->dir[0]) kvt_rmtree(d->dir);
  d->own_dir = 0;
}

int kvt_daemon_restart(kvt_daemon *d) {
  char exe[512];
  int rc = exe_path(exe, sizeof exe);
  if (rc) {
    fprintf(stderr, "    cannot find kvcached: %s\n", strerror(-rc));
    return rc;
  }
  fflush(NULL); /* the child must not carry this process's buffered output */
  d->pid = fork();
  if (d->pid < 0) {
    rc = -errno;
    d->pid = 0;
    return rc;
  }
  if (d->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    struct rlimit rl = {d->nofile, d->nofile};
    if (d->nofile && setrlimit(RLIMIT_NOFILE, &rl)) _exit(126);
    execv(exe, d->argv);
    fprintf(stderr, "    cannot run %s: %s\n", exe, strerror(errno));
    _exit(127);
  }
  for (int waited = 0; waited < d->wait_ms; waited += 20) {
    if (can_connect(d->admin)) return 0; /* bound last, after the worker socket */
    int st;
    if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
      d->pid = 0;
      return WIFEXITED(st) ? (WEXITSTATUS(st) ? WEXITSTATUS(st) : 255) : 128 + WTERMSIG(st);
    }
    usleep(20000);
  }
  fprintf(stderr, "    kvcached did not serve within %d ms\n", d->wait_ms);
  kvt_daemon_kill(d, SIGKILL);
  return -ETIMEDOUT;
}

int kvt_daemon_start(kvt_daemon *d, const kvt_daemon_opts *o) {
  memset(d, 0, sizeof *d);
  d->nofile = o->nofile;
  d->wait_ms = o->wait_ms > 0 ? o->wait_ms : 5000;
  int rc = 0;
  if (o->dir) snprintf(d->dir, sizeof d->dir, "%s", o->dir);
  else if (!(rc = kvt_mkdtemp(d->dir, sizeof d->dir, "kvt-daemon"))) d->own_dir = 1;
  if (rc) return rc;
  snprintf(d->sock, sizeof d->sock, "%s/%s", d->dir, KV_SOCKET_NAME);
  snprintf(d->stats, sizeof d->stats, "%s/%s", d->dir, KV_STATS_SOCKET_NAME);
  snprintf(d->admin, sizeof d->admin, "%s/%s", d->dir, KV_ADMIN_SOCKET_NAME);
  const char *head[] = {"kvcached", "--socket-dir", d->dir, NULL};
  for (int i = 0; head[i] && !rc; i++) rc = add_arg(d, head[i]);
  if (o->config && !rc) {
    char conf[256];
    snprintf(conf, sizeof conf, "%s/kvcached.conf", d->dir);
    rc = write_config(conf, o->config);
    if (!rc) rc = add_arg(d, "--config");
    if (!rc) rc = add_arg(d, conf);
  }
  for (int i = 0; o->args && o->args[i] && !rc; i++) rc = add_arg(d, o->args[i]);
  for (int i = 0; o->sets && o->sets[i] && !rc; i++) {
    rc = add_arg(d, "--set");
    if (!rc) rc = add_arg(d, o->sets[i]);
  }
  if (!rc) rc = kvt_daemon_restart(d);
  if (rc > 0) drop_dir(d);
  return rc;
}

int kvt_daemon_kill(kvt_daemon *d, int sig) {
  if (d->pid <= 0) return -ECHILD;
  kill(d->pid, sig);
  int st = 0;
  waitpid(d->pid, &st, 0);
  d->pid = 0;
  return st;
}

int kvt_daemon_stop(kvt_daemon *d) {
  if (d->pid <= 0) return 0;
  int st = kvt_daemon_kill(d, SIGTERM);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
  fprintf(stderr, "    kvcached did not stop cleanly (status %d)\n", st);
  return 1;
}

void kvt_daemon_free(kvt_daemon *d) {
  if (d->pid > 0) kvt_daemon_kill(d, SIGKILL);
  drop_dir(d);
  for (int i = 0; i < d->argc; i++) free(d->argv[i]);
  d->argc = 0;
  d->argv[0] = NULL;
}
