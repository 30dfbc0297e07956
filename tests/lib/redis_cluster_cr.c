/* redis_cluster_cr.c - the cluster by hand, for criterion tests (see
 * redis_cluster.h): a failure fails the calling test. */
#include <criterion/criterion.h>
#include <stdarg.h>

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
