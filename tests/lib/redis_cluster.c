/* redis_cluster.c - a Redis Cluster for the G4 tests (see redis_cluster.h). */
#include "tests/lib/redis_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/lib/tmpdir.h"

static int status_of(int st) { return st == -1 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128; }

int kvt_rc_start(kvt_rc *rc, const char *src_dir, const char *opts) {
  memset(rc, 0, sizeof *rc);
  snprintf(rc->script, sizeof rc->script, "%s/tests/lib/redis_cluster.sh", src_dir);
  if (kvt_mkdtemp(rc->dir, sizeof rc->dir, "kvt-redis") < 0) {
    snprintf(rc->why, sizeof rc->why, "cannot make a temporary directory");
    return -1;
  }
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "bash '%s' start '%s/c' --owner %d %s 2>'%s/start.err'", rc->script, rc->dir,
           (int)getpid(), opts ? opts : "", rc->dir);
  FILE *f = popen(cmd, "r");
  if (!f) {
    snprintf(rc->why, sizeof rc->why, "cannot run %.200s", rc->script);
    return -1;
  }
  char line[512] = "";
  char *got = fgets(line, sizeof line, f);
  int st = status_of(pclose(f));
  if (st == 77) {
    snprintf(rc->why, sizeof rc->why, "%s", got ? line : "redis not installed");
    rc->why[strcspn(rc->why, "\n")] = 0;
    kvt_rmtree(rc->dir);
    return 77;
  }
  if (st != 0 || !got || strncmp(line, "ports ", 6)) {
    char err[200] = "";
    char path[300];
    snprintf(path, sizeof path, "%s/start.err", rc->dir);
    FILE *e = fopen(path, "r");
    if (e) {
      size_t n = fread(err, 1, sizeof err - 1, e);
      err[n] = 0;
      fclose(e);
    }
    snprintf(rc->why, sizeof rc->why, "cluster start failed (%d): %.200s", st, err);
    kvt_rmtree(rc->dir);
    return -1;
  }
  char *p = line + 6;
  while (*p && rc->nports < KVT_RC_NODES_MAX) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p) break;
    rc->ports[rc->nports++] = (int)v;
    p = end;
  }
  return 0;
}

int kvt_rc_do(kvt_rc *rc, const char *verb, int port) {
  char cmd[2048];
  if (port)
    snprintf(cmd, sizeof cmd, "bash '%s' %s '%s/c' %d", rc->script, verb, rc->dir, port);
  else
    snprintf(cmd, sizeof cmd, "bash '%s' %s '%s/c'", rc->script, verb, rc->dir);
  return status_of(system(cmd));
}

void kvt_rc_stop(kvt_rc *rc) {
  if (!rc->dir[0]) return;
  kvt_rc_do(rc, "stop", 0);
  kvt_rmtree(rc->dir);
  rc->dir[0] = 0;
}
