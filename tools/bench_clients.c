/*
 * bench_clients.c - the client processes of one benchmark run against a
 * running daemon (bench_daemon.c, bench_replay.c).
 *
 * kvb_run_clients forks n clients. Each sets itself up (its own connection,
 * its buffers) and calls kvb_sync_wait: it says it is ready, then waits for
 * the start. When every client is ready (or gone), the parent runs
 * all_ready, lets them all go at once - by closing the go pipe - and waits
 * for them. A client that cannot start, or exits non-zero, fails the run;
 * if some never got ready, the others are killed rather than left waiting.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tools/kvbench.h"

#include "base/clock.h"

void kvb_sync_wait(kvb_sync *s) {
  char b = 1;
  if (s->passed) return;
  s->passed = 1;
  if (write(s->ready_w, &b, 1) != 1) _exit(3);
  while (read(s->go_r, &b, 1) > 0) {} /* the parent closes it: go */
}

int kvb_run_clients(const char *cmd, uint32_t n, const kvb_clients_ops *ops, void *arg,
                    double *elapsed) {
  int ready[2], go[2];
  if (pipe(ready) || pipe(go)) {
    fprintf(stderr, "%s: pipe: %s\n", cmd, strerror(errno));
    return -1;
  }
  pid_t pids[KVB_MAX_CLIENTS];
  uint32_t started = 0;
  for (uint32_t i = 0; i < n && i < KVB_MAX_CLIENTS; i++) {
    fflush(NULL);
    pid_t p = fork();
    if (p < 0) {
      fprintf(stderr, "%s: fork: %s\n", cmd, strerror(errno));
      break;
    }
    if (p == 0) {
      close(ready[0]);
      close(go[1]);
      kvb_sync s = {ready[1], go[0], 0};
      _exit(ops->child(arg, i, &s));
    }
    pids[started++] = p;
  }
  close(ready[1]);
  close(go[0]);
  /* Everybody ready (or gone), then go. */
  uint32_t nready = 0;
  while (nready < started) {
    struct pollfd pf = {ready[0], POLLIN, 0};
    char b;
    if (poll(&pf, 1, 120000) <= 0 || read(ready[0], &b, 1) != 1) break;
    nready++;
  }
  if (ops->all_ready && nready == started) ops->all_ready(arg);
  double t0 = kv_now_s();
  close(go[1]);
  int failed = started < n || nready < started;
  for (uint32_t i = 0; i < started; i++) {
    if (nready < started) kill(pids[i], SIGKILL);
    int st;
    while (waitpid(pids[i], &st, 0) < 0 && errno == EINTR) {}
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      failed = 1;
      const char *why = ops->why ? ops->why(arg, i) : NULL;
      fprintf(stderr, "%s: client %u: %s\n", cmd, i, why ? why : "died");
    }
  }
  if (elapsed) *elapsed = kv_now_s() - t0;
  close(ready[0]);
  return failed ? -1 : 0;
}
