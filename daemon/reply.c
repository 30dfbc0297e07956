/*
 * reply.c - what the operations share, below them all (tools/dev/layers.sh):
 * a reply's header, ERROR replies, a request's keys copied out, the count
 * and log of a session's refused share, and LOOKUP's answer, which
 * handlers.c gives at once and g4.c once the cluster's blocks are in.
 * Declared in kvd.h. Loop thread only.
 */
#include <string.h>

#include "base/errors.h"
#include "base/log.h"
#include "daemon/kvd.h"

kv_msg kvd_reply_to(const kv_msg *req) {
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = req->op;
  m.flags = KV_F_REPLY;
  m.id = req->id;
  return m;
}

kv_msg kvd_error_to(const kv_msg *req, int status) {
  kv_msg m = kvd_reply_to(req);
  m.op = KV_OP_ERROR;
  m.status = status;
  m.error.req_op = req->op;
  m.error.msg.p = kv_strerror(status);
  m.error.msg.len = (uint32_t)strlen(m.error.msg.p);
  return m;
}

int kvd_fail(kv_buf *out, const kv_msg *req, int status, const char *msg) {
  return kv_msg_encode_error(out, req->id, req->op, status, msg ? msg : kv_strerror(status));
}

void kvd_share_refused(kvd *d, kvd_session *s, const char *what) {
  d->st.share_refused++;
  if (s->share_logged) return;
  s->share_logged = 1;
  kvd_ns *n = kvd_registry_ns(&d->reg, s->ns);
  const char *tenant = d->reg.tenants[n->tenant].cfg.name;
  kv_warn("server",
          "session %llu (pid %d uid %u) may %s no more: it holds %u blocks pinned or allocated, "
          "its limits.session_share (%u%%) of the G2 slots of tenant '%s'; its keys get KV_ESHARE "
          "until it releases, commits or aborts (logged once a session)",
          (unsigned long long)s->id, (int)s->peer_pid, (unsigned)s->peer_uid, what, s->held_max,
          (unsigned)d->cfg.limit_session_share, tenant[0] ? tenant : "(default)");
}

/* Copies the request's keys into d->keys. */
int kvd_load_keys(kvd *d, const kv_keyvec *v) {
  for (uint32_t i = 0; i < v->n; i++) {
    int rc = kv_keyvec_get(v, i, &d->keys[i]);
    if (rc) return rc;
  }
  return 0;
}

/* LOOKUP's answer (kvd.h). */
kv_msg kvd_lookup_answer(kvd *d, int reg_ns, uint32_t core_ns, const kv_key *keys, uint32_t n,
                         const kv_msg *req) {
  int hit = kvd_registry_lookup(&d->reg, reg_ns, keys, n, d->tiers);
  if (hit < 0) return kvd_error_to(req, hit);
  for (uint32_t i = 0; i < n; i++)
    if (d->tiers[i] == KV_TIER_NONE) kvd_miss_classify(d, reg_ns, core_ns, &keys[i]);
  kv_msg m = kvd_reply_to(req);
  m.lookup_rep.hit_len = (uint32_t)hit;
  m.lookup_rep.n = n;
  m.lookup_rep.tiers = d->tiers;
  return m;
}
