/*
 * sink.h - where a deferred reply goes.
 *
 * Most requests are answered while they are handled. A LOAD that must
 * bring blocks up from the SSD is answered later, from a G3 completion; by
 * then its connection may be gone. The connection owns a sink; pending
 * requests hold references to it. When the connection closes it clears
 * conn and sess, so a late completion finds nobody to answer and touches
 * no freed memory; the sink itself goes with its last reference.
 */
#ifndef KV_DAEMON_SINK_H
#define KV_DAEMON_SINK_H

#include <stdint.h>

#include "base/buf.h"
#include "daemon/session.h"

typedef struct kvd_sink kvd_sink;
struct kvd_sink {
  /* Appends one encoded frame for the connection and sends what it can. */
  void (*deliver)(kvd_sink *s, const kv_buf *frame);
  void *conn;        /* the connection; NULL once it closed */
  kvd_session *sess; /* its session; NULL once it closed */
  uint32_t refs;
};

static inline void kvd_sink_get(kvd_sink *s) { s->refs++; }
void kvd_sink_put(kvd_sink *s);

/* Encodes the deferred reply m and delivers it, if the connection is still
 * there (otherwise nothing is owed to anybody). */
struct kv_msg;
void kvd_sink_reply(kvd_sink *s, const struct kv_msg *m);

#endif
