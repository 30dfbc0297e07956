/* gpu_daemon.h - a kvcached of its own for the GPU programs that act as its
 * worker (gpu_test_client.c, gpu_bench_client.c): the daemon built beside
 * the program, on a private socket directory, G3 off, G2 unlocked, stopped
 * with SIGTERM (and killed with this process: PR_SET_PDEATHSIG).
 * Header-only; functions print why they failed on stderr and return
 * nonzero. */
#ifndef KV_TESTS_GPU_DAEMON_H
#define KV_TESTS_GPU_DAEMON_H

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/sock.h"

typedef struct gd_daemon {
  char dir[64];
  char sock[128];
  pid_t pid;
} gd_daemon;

/* Starts kvcached with --g2-capacity g2 and `--set s` for each of sets
 * (NULL-terminated, at most 16). 0 once it serves. */
static inline int gd_start(gd_daemon *d, const char *g2, const char *const *sets) {
  char exe[512];
  memset(d, 0, sizeof *d);
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 32);
  if (n <= 0) {
    fprintf(stderr, "    readlink /proc/self/exe: %s\n", strerror(errno));
    return 1;
  }
  exe[n] = 0;
  strcpy(strrchr(exe, '/') + 1, "kvcached");
  snprintf(d->dir, sizeof d->dir, "/tmp/kvgpu-XXXXXX");
  if (!mkdtemp(d->dir)) {
    fprintf(stderr, "    mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  snprintf(d->sock, sizeof d->sock, "%s/kvcached.sock", d->dir);
  const char *argv[48] = {"kvcached", "--socket-dir", d->dir, "--g2-capacity", g2,
                          "--set", "g2.lock=no", "--g3-path", "", "--log-level", "warn"};
  int k = 11;
  for (int i = 0; sets && sets[i] && i < 16; i++) {
    argv[k++] = "--set";
    argv[k++] = sets[i];
  }
  argv[k] = NULL;
  fflush(NULL); /* the child must not carry this process's buffered output */
  d->pid = fork();
  if (d->pid < 0) {
    fprintf(stderr, "    fork: %s\n", strerror(errno));
    return 1;
  }
  if (d->pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execv(exe, (char *const *)argv);
    fprintf(stderr, "    cannot run %s: %s\n", exe, strerror(errno));
    _exit(127);
  }
  for (int i = 0; i < 1500; i++) { /* 30 s: pinning a large G2 takes a while */
    int fd = kv_sock_connect(d->sock, 0);
    if (fd >= 0) {
      close(fd);
      return 0;
    }
    int st;
    if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
      fprintf(stderr, "    kvcached exited (status %d) before serving\n", st);
      d->pid = 0;
      return 1;
    }
    usleep(20000);
  }
  fprintf(stderr, "    kvcached did not serve within 30 s\n");
  return 1;
}

/* SIGTERM, wait, remove the directory. 0 when it stopped cleanly. */
static inline int gd_stop(gd_daemon *d) {
  int st = 0, rc = 0;
  if (d->pid > 0) {
    kill(d->pid, SIGTERM);
    waitpid(d->pid, &st, 0);
    d->pid = 0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "    kvcached did not stop cleanly (status %d)\n", st);
      rc = 1;
    }
  }
  if (d->dir[0]) {
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", d->dir);
    if (system(cmd)) { /* a leftover temporary directory is not a failure */
    }
    d->dir[0] = 0;
  }
  return rc;
}

#endif
