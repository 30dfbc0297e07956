/* redis_cluster_cr.c - the cluster by hand, for criterion tests (see
 * redis_cluster.h): a failure fails the calling test. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>

#include "tests/lib/redis_cluster.h"

redisReply *kvt_rc_adm(int port, const char *password, const char *fmt, ...) {
  struct timeval tv = {5, 0};
  redisContext *x = redisConnectWithTimeout("127.0.0.1", port, tv);
  cr_assert(x && !x->err, "connect to %d", port);
  if (password) freeReplyObject(redisCommand(x, "AUTH %s", password));
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(x, fmt, ap);
  va_end(ap);
  cr_assert(r, "command on %d: %s", port, x->errstr);
  redisFree(x);
  return r;
}

int kvt_rc_slot_owner(int port, const char *password, unsigned slot) {
  redisReply *r = kvt_rc_adm(port, password, "CLUSTER SLOTS");
  int owner = 0;
  for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
    redisReply *e = r->element[i];
    if ((unsigned)e->element[0]->integer <= slot && slot <= (unsigned)e->element[1]->integer)
      owner = (int)e->element[2]->element[1]->integer;
  }
  freeReplyObject(r);
  return owner;
}

pid_t kvt_rc_node_pid(const kvt_rc *rc, int port) {
  char path[400];
  snprintf(path, sizeof path, "%s/c/%d/redis.pid", rc->dir, port);
  FILE *f = fopen(path, "r");
  cr_assert(f, "%s", path);
  int pid = 0;
  cr_assert_eq(fscanf(f, "%d", &pid), 1);
  fclose(f);
  return (pid_t)pid;
}
