/* sink.c - where a deferred reply goes (see sink.h). */
#include "daemon/sink.h"

#include <stdlib.h>

#include "proto/wire.h"

void kvd_sink_put(kvd_sink *s) {
  if (--s->refs == 0) free(s);
}

void kvd_sink_reply(kvd_sink *s, const kv_msg *m) {
  if (!s->conn) return;
  kv_buf out;
  kv_buf_init(&out);
  if (kv_msg_encode(&out, m) == 0) s->deliver(s, &out);
  kv_buf_free(&out);
}
