/* g4_cluster.c - Redis Cluster routing over hiredis async contexts on a
 * libuv loop (see g4_cluster.h; the design is in G4.md).
 *
 * Pieces, top to bottom: CRC16 and slots; the hiredis <-> libuv adapter;
 * nodes and their connections; requests (deadline list, deferred
 * delivery, sending, replies and redirections); the slot map; the
 * housekeeping timer; open and close.
 *
 * Lifetimes. Nodes live as long as the client (a cluster has few). A
 * request lives until its callback has been delivered and hiredis has
 * given back every callback it owes for it (a timed-out command is still
 * in hiredis' queue until its reply comes or its connection goes). The
 * client is freed when its two timers and every adapter's poll handle have
 * closed, after the last callback. */
#include "tiers/g4_cluster.h"

#include <errno.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"

#define SUB          "g4"
#define HOUSE_MS     50  /* housekeeping period */
#define REFRESH_GAP  100 /* at least this long between two map reads */
#define REFRESH_FAIL 200 /* a failed map read is retried after this */
#define HOST_MAX     64

/* ---- CRC16 and slots ----------------------------------------------------- */

uint16_t kv_g4c_crc16(const void *buf, size_t len) {
  const uint8_t *p = buf;
  uint16_t crc = 0;
  for (size_t i = 0; i < len; i++) {
    crc ^= (uint16_t)(p[i] << 8);
    for (int b = 0; b < 8; b++) crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
  }
  return crc;
}

unsigned kv_g4c_slot(const void *key, size_t len) {
  const char *k = key;
  const char *open = memchr(k, '{', len);
  if (open) {
    size_t from = (size_t)(open - k) + 1;
    const char *close = memchr(k + from, '}', len - from);
    if (close && close > k + from) return kv_g4c_crc16(k + from, (size_t)(close - k - from)) & 16383;
  }
  return kv_g4c_crc16(k, len) & 16383;
}

/* ---- types ---------------------------------------------------------------- */

enum { N_IDLE, N_CONNECTING, N_READY, N_BACKOFF };

typedef struct node {
  struct node *next;
  kv_g4c *c;
  char host[HOST_MAX];
  int port;
  redisAsyncContext *ac; /* NULL when not connected */
  int st;
  int failed;       /* the last attempt failed or the connection was lost */
  int backoff_ms;   /* the last delay; 0 after a success */
  uint64_t due;     /* CONNECTING: connect deadline; BACKOFF: retry time */
  uint64_t last_rx; /* when a reply last came */
} node;

typedef struct shard {
  node *master;
  node *rep[4];
  unsigned nrep, rr;
} shard;

typedef struct req req;
typedef void (*req_done_fn)(req *r, const kv_g4c_reply *rep, const struct redisReply *raw);
struct req {
  kv_g4c *c;
  req *prev, *next; /* c's deadline list, in submission order, until done */
  req *dnext;       /* c's deferred list */
  uint64_t deadline, sent_at;
  char *cmd;
  size_t cmdlen;
  unsigned slot, flags;
  int redirects;
  int refs;   /* hiredis callbacks still owed */
  int done;   /* outcome decided (delivered, or waiting in the deferred list) */
  node *fixed; /* internal: send to this node, not by slot */
  node *ask;   /* the next send is ASKING + the command to this node */
  node *to;    /* where it was sent last */
  kv_g4c_cb cb;
  void *arg;
  req_done_fn internal; /* internal requests: called instead of cb */
  /* a deferred error */
  kv_g4c_reason dreason;
  int derr;
  char dmsg[96];
};

struct kv_g4c {
  uv_loop_t *loop;
  kv_g4c_opts o;
  char *user, *password;
  uv_timer_t tmr;   /* deadlines and deferred deliveries */
  uv_timer_t house; /* connect timeouts, reconnects, map reads */
  unsigned handles; /* open uv handles: the timers and adapters' polls */
  int closing, in_api;
  kv_g4c_close_cb close_cb;
  void *close_arg;
  node *nodes;
  node *seeds[KV_G4C_SEEDS_MAX];
  unsigned nseeds, rr;
  node *slot_master[KV_G4C_SLOTS];
  shard *slot_shard[KV_G4C_SLOTS];
  shard *shards; /* the last CLUSTER SLOTS' shards */
  unsigned nshards;
  req *head, *tail;    /* deadline list */
  req *dhead, *dtail;  /* deferred list */
  int refreshing, have_map;
  uint64_t refresh_due, refresh_last;
  kv_g4c_stats st;
};

/* Real time, not the loop's cached uv_now(): a loop that was not run for
 * a while (a caller busy before submitting) must not make fresh deadlines
 * stale. A timer that libuv fires early by that clock is re-armed. */
static uint64_t now_ms(kv_g4c *c) {
  (void)c;
  return (uint64_t)kv_now_ms();
}

static const char *const reason_names[] = {
#define KV_G4C_REASON_NAME(name, label) label,
    KV_G4C_REASON_MAP(KV_G4C_REASON_NAME)
#undef KV_G4C_REASON_NAME
};

const char *kv_g4c_reason_name(int r) {
  return r >= 0 && r < KV_G4C_R_COUNT ? reason_names[r] : "?";
}

const char *kv_g4c_state_name(kv_g4c_state s) {
  switch (s) {
  case KV_G4C_OK: return "ok";
  case KV_G4C_DEGRADED: return "degraded";
  case KV_G4C_DOWN: return "down";
  }
  return "?";
}

static int reason_err(kv_g4c_reason r) {
  switch (r) {
  case KV_G4C_R_NONE: return 0;
  case KV_G4C_R_TIMEOUT: return -ETIMEDOUT;
  case KV_G4C_R_CONN: return -ENOTCONN;
  case KV_G4C_R_MOVED:
  case KV_G4C_R_ASK: return -EREMOTE;
  case KV_G4C_R_OOM: return -ENOSPC;
  case KV_G4C_R_DOWN: return -EAGAIN;
  case KV_G4C_R_AUTH: return -EACCES;
  case KV_G4C_R_CLOSED: return -ECANCELED;
  default: return -EPROTO;
  }
}

static void maybe_free_client(kv_g4c *c);
static void refresh_soon(kv_g4c *c);
static void on_tmr(uv_timer_t *t);

/* ---- the hiredis <-> libuv adapter ----------------------------------------
 * hiredis 0.14's adapters/libuv.h ignores a poll error: libuv reports
 * POLLERR (a refused connect, a reset) as status UV_EBADF and stops the
 * handle, the adapter returns, and hiredis never learns the socket failed:
 * its commands wait forever. This one lets hiredis read and write on an
 * error so that it sees the socket's error and disconnects (as hiredis 1.x
 * does), and counts its handles so the client knows when all are closed. */

typedef struct ev {
  uv_poll_t h;
  redisAsyncContext *ac;
  kv_g4c *c;
  int events;
} ev;

static void ev_poll(uv_poll_t *h, int status, int events) {
  ev *p = h->data;
  int e = status ? p->events : events;
  if (p->ac && (e & UV_READABLE)) redisAsyncHandleRead(p->ac);
  if (p->ac && (e & UV_WRITABLE)) redisAsyncHandleWrite(p->ac);
}

static void ev_set(ev *p, int add, int del) {
  p->events = (p->events | add) & ~del;
  if (p->events)
    uv_poll_start(&p->h, p->events, ev_poll);
  else
    uv_poll_stop(&p->h);
}
static void ev_add_read(void *d) { ev_set(d, UV_READABLE, 0); }
static void ev_del_read(void *d) { ev_set(d, 0, UV_READABLE); }
static void ev_add_write(void *d) { ev_set(d, UV_WRITABLE, 0); }
static void ev_del_write(void *d) { ev_set(d, 0, UV_WRITABLE); }

static void ev_closed(uv_handle_t *h) {
  ev *p = h->data;
  kv_g4c *c = p->c;
  free(p);
  c->handles--;
  maybe_free_client(c);
}

static void ev_cleanup(void *d) {
  ev *p = d;
  p->ac = NULL;
  uv_close((uv_handle_t *)&p->h, ev_closed);
}

static int ev_attach(kv_g4c *c, redisAsyncContext *ac) {
  ev *p = calloc(1, sizeof *p);
  if (!p) return -ENOMEM;
  int rc = uv_poll_init(c->loop, &p->h, ac->c.fd);
  if (rc < 0) {
    free(p);
    return rc;
  }
  p->h.data = p;
  p->ac = ac;
  p->c = c;
  c->handles++;
  ac->ev.data = p;
  ac->ev.addRead = ev_add_read;
  ac->ev.delRead = ev_del_read;
  ac->ev.addWrite = ev_add_write;
  ac->ev.delWrite = ev_del_write;
  ac->ev.cleanup = ev_cleanup;
  return 0;
}

/* ---- nodes ----------------------------------------------------------------- */

static node *node_get(kv_g4c *c, const char *host, size_t hostlen, int port) {
  if (hostlen == 0 || hostlen >= HOST_MAX || port <= 0 || port > 65535) return NULL;
  for (node *n = c->nodes; n; n = n->next)
    if (n->port == port && strlen(n->host) == hostlen && !memcmp(n->host, host, hostlen)) return n;
  node *n = calloc(1, sizeof *n);
  if (!n) return NULL;
  memcpy(n->host, host, hostlen);
  n->port = port;
  n->c = c;
  n->next = c->nodes;
  c->nodes = n;
  c->st.nodes++;
  return n;
}

/* "host:port" (the last colon: IPv6 addresses have others). */
static node *node_parse(kv_g4c *c, const char *s, size_t len, const node *from) {
  const char *colon = NULL;
  for (size_t i = len; i-- > 0;)
    if (s[i] == ':') {
      colon = s + i;
      break;
    }
  if (!colon) return NULL;
  char *end;
  char num[8];
  size_t pl = len - (size_t)(colon - s) - 1;
  if (pl == 0 || pl >= sizeof num) return NULL;
  memcpy(num, colon + 1, pl);
  num[pl] = 0;
  long port = strtol(num, &end, 10);
  if (*end) return NULL;
  size_t hl = (size_t)(colon - s);
  if (hl == 0 && from) return node_get(c, from->host, strlen(from->host), (int)port);
  return node_get(c, s, hl, (int)port);
}

/* The connection of n failed or was lost (ac is the context it had). */
static void node_lost(node *n, const redisAsyncContext *ac, const char *why) {
  kv_g4c *c = n->c;
  if (n->ac != ac) return;
  n->ac = NULL;
  if (c->closing) {
    n->st = N_IDLE;
    return;
  }
  c->st.conn_fails++;
  if (!n->failed) kv_warn(SUB, "%s:%d: %s", n->host, n->port, why && *why ? why : "connection lost");
  n->failed = 1;
  n->st = N_BACKOFF;
  int lo = c->o.backoff_min_ms, hi = c->o.backoff_max_ms;
  n->backoff_ms = n->backoff_ms ? n->backoff_ms * 2 : lo;
  if (n->backoff_ms > hi) n->backoff_ms = hi;
  n->due = now_ms(c) + (uint64_t)n->backoff_ms;
  refresh_soon(c);
}

/* Drops n's connection now (a connect timeout, a node that stopped
 * answering); hiredis fails what it still holds for it. Never from inside
 * one of n's own connect or disconnect callbacks. */
static void node_drop(node *n, const char *why) {
  redisAsyncContext *ac = n->ac;
  if (!ac) return;
  node_lost(n, ac, why);
  n->ac = NULL;
  redisAsyncFree(ac);
}

static void on_connect(const redisAsyncContext *ac, int status) {
  node *n = ac->data;
  if (status != REDIS_OK) {
    node_lost(n, ac, ac->errstr);
    return;
  }
  if (n->ac != ac) return;
  if (n->failed) kv_info(SUB, "%s:%d: connected again", n->host, n->port);
  n->st = N_READY;
  n->failed = 0;
  n->backoff_ms = 0;
  n->c->st.connects++;
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
  node_lost(ac->data, ac, ac->errstr);
}

static void on_auth(redisAsyncContext *ac, void *r, void *priv) {
  redisReply *reply = r;
  node *n = ac->data;
  if (reply && reply->type == REDIS_REPLY_ERROR)
    kv_warn(SUB, "%s:%d: %s refused: %s", n->host, n->port, (const char *)priv, reply->str);
}

/* n's connection, made now if n has none and is not waiting out a backoff;
 * NULL if it cannot be used. */
static redisAsyncContext *node_ac(node *n) {
  kv_g4c *c = n->c;
  if (n->ac) return n->ac;
  if (c->closing || (n->st == N_BACKOFF && now_ms(c) < n->due)) return NULL;
  redisAsyncContext *ac = redisAsyncConnect(n->host, n->port);
  if (!ac) return NULL;
  if (ac->err) {
    n->ac = ac;
    node_lost(n, ac, ac->errstr);
    redisAsyncFree(ac);
    return NULL;
  }
  ac->data = n;
  if (ev_attach(c, ac) < 0) {
    n->ac = ac;
    node_lost(n, ac, "cannot watch the socket");
    redisAsyncFree(ac);
    return NULL;
  }
  redisAsyncSetConnectCallback(ac, on_connect);
  redisAsyncSetDisconnectCallback(ac, on_disconnect);
  n->ac = ac;
  n->st = N_CONNECTING;
  n->due = now_ms(c) + (uint64_t)c->o.connect_timeout_ms;
  /* queued ahead of everything else on this connection */
  if (c->password) {
    if (c->user)
      redisAsyncCommand(ac, on_auth, (void *)"AUTH", "AUTH %s %s", c->user, c->password);
    else
      redisAsyncCommand(ac, on_auth, (void *)"AUTH", "AUTH %s", c->password);
  }
  if (c->o.read_replicas) redisAsyncCommand(ac, on_auth, (void *)"READONLY", "READONLY");
  return ac;
}

/* Usable now, or worth a try. */
static int node_usable(const node *n) {
  return n->ac || n->st != N_BACKOFF || now_ms(n->c) >= n->due;
}

/* ---- requests -------------------------------------------------------------- */

static void req_free(req *r) {
  free(r->cmd);
  free(r);
}

static void tmr_arm(kv_g4c *c) {
  if (c->closing) return;
  uint64_t now = now_ms(c);
  if (c->dhead)
    uv_timer_start(&c->tmr, on_tmr, 0, 0);
  else if (c->head)
    uv_timer_start(&c->tmr, on_tmr, c->head->deadline > now ? c->head->deadline - now : 0, 0);
  else
    uv_timer_stop(&c->tmr);
}

static void list_del(kv_g4c *c, req *r) {
  if (r->prev)
    r->prev->next = r->next;
  else
    c->head = r->next;
  if (r->next)
    r->next->prev = r->prev;
  else
    c->tail = r->prev;
  r->prev = r->next = NULL;
}

static size_t reply_bytes(const redisReply *r) {
  if (!r) return 0;
  if (r->type == REDIS_REPLY_ARRAY) {
    size_t n = 0;
    for (size_t i = 0; i < r->elements; i++) n += reply_bytes(r->element[i]);
    return n;
  }
  return r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ? r->len : 0;
}

/* Calls r's callback with rep and frees r if hiredis owes nothing for it. */
static void deliver(req *r, const kv_g4c_reply *rep, const redisReply *raw) {
  kv_g4c *c = r->c;
  if (r->internal) {
    r->internal(r, rep, raw);
  } else {
    c->st.in_flight--;
    if (rep->kind == KV_G4C_VALUE)
      c->st.values++;
    else if (rep->kind == KV_G4C_NIL)
      c->st.nils++;
    else
      c->st.errors[rep->reason]++;
    r->cb(c, rep, r->arg);
  }
  if (!r->refs) req_free(r);
}

/* Fails r with reason: now, or from the loop when inside an API call. */
static void req_fail(req *r, kv_g4c_reason reason, const char *msg) {
  kv_g4c *c = r->c;
  if (r->done) return;
  r->done = 1;
  list_del(c, r);
  if (c->in_api || c->closing) {
    r->dreason = reason;
    r->derr = reason_err(reason);
    snprintf(r->dmsg, sizeof r->dmsg, "%s", msg ? msg : kv_g4c_reason_name(reason));
    r->dnext = NULL;
    if (c->dtail)
      c->dtail->dnext = r;
    else
      c->dhead = r;
    c->dtail = r;
    tmr_arm(c);
    return;
  }
  kv_g4c_reply rep = {.kind = KV_G4C_ERROR, .reason = reason, .err = reason_err(reason),
                      .str = msg ? msg : kv_g4c_reason_name(reason)};
  rep.len = strlen(rep.str);
  deliver(r, &rep, NULL);
}

static void run_deferred(kv_g4c *c) {
  req *r;
  while ((r = c->dhead)) {
    c->dhead = r->dnext;
    if (!c->dhead) c->dtail = NULL;
    kv_g4c_reply rep = {.kind = KV_G4C_ERROR, .reason = r->dreason, .err = r->derr,
                        .str = r->dmsg, .len = strlen(r->dmsg)};
    deliver(r, &rep, NULL);
  }
}

static void on_reply(redisAsyncContext *ac, void *reply, void *priv);

static node *route(kv_g4c *c, req *r) {
  if (r->fixed) return r->fixed;
  if (r->ask) return r->ask;
  shard *s = c->slot_shard[r->slot];
  if (c->o.read_replicas && (r->flags & KV_G4C_READONLY) && s && s->nrep) {
    for (unsigned i = 0; i < s->nrep; i++) {
      node *n = s->rep[s->rr++ % s->nrep];
      if (n->st == N_READY) return n;
      if (!n->ac && node_usable(n)) node_ac(n); /* ready for the next reads */
    }
  }
  node *n = c->slot_master[r->slot];
  if (n) return n;
  /* no map for this slot: any node answers with a MOVED */
  for (unsigned i = 0; i < c->nseeds; i++) {
    node *s2 = c->seeds[c->rr++ % c->nseeds];
    if (node_usable(s2)) return s2;
  }
  return NULL;
}

/* Sends r where it belongs now; on failure fails it (CONN or DOWN). */
static void req_send(req *r) {
  kv_g4c *c = r->c;
  node *n = route(c, r);
  if (!n) {
    req_fail(r, KV_G4C_R_DOWN, "no node serves the slot");
    return;
  }
  redisAsyncContext *ac = node_ac(n);
  if (!ac) {
    req_fail(r, KV_G4C_R_CONN, "node unreachable");
    return;
  }
  if (r->ask) redisAsyncCommand(ac, NULL, NULL, "ASKING");
  r->ask = NULL;
  if (redisAsyncFormattedCommand(ac, on_reply, r, r->cmd, r->cmdlen) != REDIS_OK) {
    req_fail(r, KV_G4C_R_CONN, "connection closing");
    return;
  }
  r->refs++;
  r->to = n;
  r->sent_at = now_ms(c);
  c->st.bytes_out += r->cmdlen;
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK ..." -> slot and node */
static node *parse_redirect(kv_g4c *c, const char *s, size_t len, const node *from, unsigned *slot) {
  const char *sp = memchr(s, ' ', len);
  if (!sp) return NULL;
  char *end;
  unsigned long v = strtoul(sp + 1, &end, 10);
  if (end == sp + 1 || *end != ' ' || v >= KV_G4C_SLOTS) return NULL;
  *slot = (unsigned)v;
  return node_parse(c, end + 1, len - (size_t)(end + 1 - s), from);
}

static int prefix(const char *s, size_t len, const char *p) {
  size_t n = strlen(p);
  return len >= n && !memcmp(s, p, n);
}

static void on_error_reply(req *r, node *from, const redisReply *reply) {
  kv_g4c *c = r->c;
  const char *s = reply->str;
  size_t len = reply->len;
  int moved = prefix(s, len, "MOVED "), ask = prefix(s, len, "ASK ");
  if (moved || ask) {
    unsigned slot;
    node *to = parse_redirect(c, s, len, from, &slot);
    if (!to) {
      req_fail(r, KV_G4C_R_OTHER, s);
      return;
    }
    if (++r->redirects > c->o.max_redirects) {
      req_fail(r, moved ? KV_G4C_R_MOVED : KV_G4C_R_ASK, s);
      return;
    }
    if (moved) {
      c->st.moved++;
      c->slot_master[slot] = to;
      c->slot_shard[slot] = NULL;
      refresh_soon(c);
      if (r->fixed) r->fixed = to;
    } else {
      c->st.ask++;
      r->ask = to;
    }
    req_send(r);
    return;
  }
  kv_g4c_reason why = KV_G4C_R_OTHER;
  if (prefix(s, len, "OOM"))
    why = KV_G4C_R_OOM;
  else if (prefix(s, len, "CLUSTERDOWN") || prefix(s, len, "LOADING") || prefix(s, len, "TRYAGAIN") ||
           prefix(s, len, "MASTERDOWN"))
    why = KV_G4C_R_DOWN;
  else if (prefix(s, len, "NOAUTH") || prefix(s, len, "WRONGPASS") || prefix(s, len, "NOPERM"))
    why = KV_G4C_R_AUTH;
  if (why == KV_G4C_R_DOWN) refresh_soon(c);
  req_fail(r, why, s);
}

static void on_reply(redisAsyncContext *ac, void *rp, void *priv) {
  redisReply *reply = rp;
  req *r = priv;
  node *n = ac->data;
  kv_g4c *c = r->c;
  r->refs--;
  if (reply) {
    n->last_rx = now_ms(c);
    c->st.bytes_in += reply_bytes(reply);
  }
  if (r->done) {
    if (!r->refs) req_free(r);
    return;
  }
  if (!reply) {
    if (c->closing) {
      req_fail(r, KV_G4C_R_CLOSED, NULL);
      return;
    }
    node_lost(n, ac, ac->errstr);
    req_fail(r, KV_G4C_R_CONN, ac->errstr[0] ? ac->errstr : "connection lost");
    return;
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    on_error_reply(r, n, reply);
    return;
  }
  r->done = 1;
  list_del(c, r);
  kv_g4c_reply rep = {.kind = reply->type == REDIS_REPLY_NIL ? KV_G4C_NIL : KV_G4C_VALUE};
  if (rep.kind == KV_G4C_VALUE) {
    rep.raw = reply;
    if (reply->type == REDIS_REPLY_STRING || reply->type == REDIS_REPLY_STATUS) {
      rep.str = reply->str;
      rep.len = reply->len;
    }
    rep.integer = reply->integer;
  }
  deliver(r, &rep, reply);
}

/* A request, appended to the deadline list. NULL: -ENOMEM. */
static req *req_new(kv_g4c *c, int argc, const char *const *argv, const size_t *argvlen) {
  req *r = calloc(1, sizeof *r);
  if (!r) return NULL;
  int n = redisFormatCommandArgv(&r->cmd, argc, (const char **)argv, argvlen);
  if (n < 0 || !r->cmd) {
    free(r);
    return NULL;
  }
  r->cmdlen = (size_t)n;
  r->c = c;
  r->deadline = now_ms(c) + (uint64_t)c->o.timeout_ms;
  r->prev = c->tail;
  if (c->tail)
    c->tail->next = r;
  else
    c->head = r;
  c->tail = r;
  if (c->head == r) tmr_arm(c);
  return r;
}

int kv_g4c_command(kv_g4c *c, const void *key, size_t keylen, unsigned flags, int argc,
                   const char *const *argv, const size_t *argvlen, kv_g4c_cb cb, void *arg) {
  if (argc < 1 || !argv || !key || keylen == 0 || !cb) return -EINVAL;
  if (c->closing) return -ESHUTDOWN;
  req *r = req_new(c, argc, argv, argvlen);
  if (!r) return -ENOMEM;
  r->slot = kv_g4c_slot(key, keylen);
  r->flags = flags;
  r->cb = cb;
  r->arg = arg;
  c->st.commands++;
  c->st.in_flight++;
  int saved = c->in_api;
  c->in_api = 1;
  req_send(r);
  c->in_api = saved;
  return 0;
}

/* A node that has answered nothing since r was sent has hung (or its host
 * vanished without a reset): drop its connection, so that what it holds
 * fails now and a reconnect (after a backoff) finds out. */
static void on_timeout(kv_g4c *c, req *r) {
  node *n = r->to;
  uint64_t sent = r->sent_at;
  int held = r->refs; /* if so, r outlives its callback */
  req_fail(r, KV_G4C_R_TIMEOUT, "timed out");
  if (n && held && n->ac && n->last_rx < sent) node_drop(n, "no reply: connection dropped");
}

static void on_tmr(uv_timer_t *t) {
  kv_g4c *c = t->data;
  run_deferred(c);
  uint64_t now = now_ms(c);
  while (c->head && c->head->deadline <= now) on_timeout(c, c->head);
  run_deferred(c);
  tmr_arm(c);
}

/* ---- the slot map ---------------------------------------------------------- */

static void refresh_soon(kv_g4c *c) {
  uint64_t t = c->refresh_last + REFRESH_GAP;
  if (c->refresh_due > t) c->refresh_due = t;
}

static node *slots_node(kv_g4c *c, const redisReply *e, const node *from) {
  if (!e || e->type != REDIS_REPLY_ARRAY || e->elements < 2) return NULL;
  const redisReply *ip = e->element[0], *port = e->element[1];
  if (ip->type != REDIS_REPLY_STRING || port->type != REDIS_REPLY_INTEGER) return NULL;
  if (ip->len == 1 && ip->str[0] == '?') return NULL; /* endpoint unknown */
  if (ip->len == 0) return node_get(c, from->host, strlen(from->host), (int)port->integer);
  return node_get(c, ip->str, ip->len, (int)port->integer);
}

/* Applies a CLUSTER SLOTS reply from node `from`. 0 or -EPROTO. */
static int map_apply(kv_g4c *c, const redisReply *r, const node *from) {
  if (!r || r->type != REDIS_REPLY_ARRAY) return -EPROTO;
  shard *sh = calloc(r->elements ? r->elements : 1, sizeof *sh);
  if (!sh) return -ENOMEM;
  for (size_t i = 0; i < r->elements; i++) {
    const redisReply *e = r->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->type != REDIS_REPLY_INTEGER) {
      free(sh);
      return -EPROTO;
    }
    shard *s = &sh[i];
    s->master = slots_node(c, e->element[2], from);
    for (size_t j = 3; j < e->elements && s->nrep < 4; j++) {
      node *rep = slots_node(c, e->element[j], from);
      if (rep) s->rep[s->nrep++] = rep;
    }
  }
  free(c->shards);
  c->shards = sh;
  c->nshards = (unsigned)r->elements;
  memset(c->slot_master, 0, sizeof c->slot_master);
  memset(c->slot_shard, 0, sizeof c->slot_shard);
  unsigned slots = 0, masters = 0;
  for (size_t i = 0; i < r->elements; i++) {
    const redisReply *e = r->element[i];
    long long a = e->element[0]->integer, b = e->element[1]->integer;
    if (!sh[i].master || a < 0 || b >= KV_G4C_SLOTS || a > b) continue;
    for (long long s = a; s <= b; s++) {
      if (!c->slot_master[s]) slots++;
      c->slot_master[s] = sh[i].master;
      c->slot_shard[s] = &sh[i];
    }
    int seen = 0;
    for (size_t j = 0; j < i; j++) seen |= sh[j].master == sh[i].master;
    masters += !seen;
  }
  if (slots != c->st.slots || masters != c->st.masters || !c->have_map)
    kv_info(SUB, "slot map from %s:%d: %u masters, %u of %u slots", from->host, from->port, masters,
            slots, KV_G4C_SLOTS);
  c->st.slots = slots;
  c->st.masters = masters;
  c->have_map = 1;
  return 0;
}

static void on_slots(req *r, const kv_g4c_reply *rep, const struct redisReply *raw) {
  kv_g4c *c = r->c;
  c->refreshing = 0;
  if (c->closing) return;
  uint64_t now = now_ms(c);
  if (rep->kind == KV_G4C_VALUE && map_apply(c, raw, r->to) == 0) {
    c->st.refreshes++;
    c->refresh_due = c->o.refresh_ms < 0 ? UINT64_MAX : now + (uint64_t)c->o.refresh_ms;
    return;
  }
  c->st.refresh_fails++;
  c->refresh_due = now + REFRESH_FAIL;
}

/* Reads the map from the next node that may answer: the map's masters and
 * the seeds, in turn. */
static void refresh_start(kv_g4c *c) {
  node *pick = NULL;
  unsigned total = c->st.nodes;
  for (unsigned i = 0; i < total && !pick; i++) {
    unsigned k = c->rr++ % total, j = 0;
    node *n = c->nodes;
    while (j++ < k && n) n = n->next;
    if (n && node_usable(n)) pick = n;
  }
  c->refresh_last = now_ms(c);
  if (!pick) {
    c->refresh_due = c->refresh_last + REFRESH_FAIL;
    return;
  }
  static const char *const argv[] = {"CLUSTER", "SLOTS"};
  req *r = req_new(c, 2, argv, NULL);
  if (!r) {
    c->refresh_due = c->refresh_last + REFRESH_FAIL;
    return;
  }
  r->fixed = pick;
  r->internal = on_slots;
  c->refreshing = 1;
  c->refresh_due = UINT64_MAX;
  req_send(r);
}

/* ---- state and housekeeping ---------------------------------------------- */

kv_g4c_state kv_g4c_get_state(const kv_g4c *c) {
  if (!c->have_map || c->st.slots == 0) return KV_G4C_DOWN;
  unsigned up = 0, down = 0;
  for (unsigned i = 0; i < c->nshards; i++) {
    node *m = c->shards[i].master;
    if (!m) continue;
    int seen = 0;
    for (unsigned j = 0; j < i; j++) seen |= c->shards[j].master == m;
    if (seen) continue;
    if (m->failed)
      down++;
    else
      up++;
  }
  if (up == 0) return KV_G4C_DOWN;
  return down || c->st.slots < KV_G4C_SLOTS ? KV_G4C_DEGRADED : KV_G4C_OK;
}

void kv_g4c_get_stats(const kv_g4c *c, kv_g4c_stats *st) {
  *st = c->st;
  st->state = kv_g4c_get_state(c);
}

static void on_house(uv_timer_t *t) {
  kv_g4c *c = t->data;
  uint64_t now = now_ms(c);
  for (node *n = c->nodes; n; n = n->next)
    if (n->st == N_CONNECTING && n->ac && now >= n->due) node_drop(n, "connect timed out");
  /* the map's masters come back on their own */
  for (unsigned i = 0; i < c->nshards; i++) {
    node *m = c->shards[i].master;
    if (m && !m->ac && m->st == N_BACKOFF && now >= m->due) node_ac(m);
  }
  if (!c->refreshing && now >= c->refresh_due) refresh_start(c);
  run_deferred(c);
}

/* ---- open and close ------------------------------------------------------- */

static void free_client(kv_g4c *c) {
  node *n = c->nodes;
  while (n) {
    node *next = n->next;
    free(n);
    n = next;
  }
  free(c->shards);
  free(c->user);
  free(c->password);
  free(c);
}

static void maybe_free_client(kv_g4c *c) {
  if (!c->closing || c->handles) return;
  run_deferred(c);
  /* requests still listed were never sent anywhere hiredis could answer */
  while (c->head) req_fail(c->head, KV_G4C_R_CLOSED, NULL);
  run_deferred(c);
  kv_g4c_close_cb cb = c->close_cb;
  void *arg = c->close_arg;
  if (cb) cb(c, arg);
  free_client(c);
}

static void timer_closed(uv_handle_t *h) {
  kv_g4c *c = h->data;
  c->handles--;
  maybe_free_client(c);
}

int kv_g4c_open(uv_loop_t *loop, const kv_g4c_opts *o, kv_g4c **out) {
  if (!loop || !o || !out || o->nseeds == 0 || o->nseeds > KV_G4C_SEEDS_MAX || !o->seeds ||
      (o->user && !o->password) || o->timeout_ms < 0 || o->connect_timeout_ms < 0 ||
      o->backoff_min_ms < 0 || o->backoff_max_ms < 0 || o->max_redirects < 0)
    return -EINVAL;
  kv_g4c *c = calloc(1, sizeof *c);
  if (!c) return -ENOMEM;
  c->loop = loop;
  c->o = *o;
  if (!c->o.timeout_ms) c->o.timeout_ms = 1000;
  if (!c->o.connect_timeout_ms) c->o.connect_timeout_ms = c->o.timeout_ms;
  if (!c->o.backoff_min_ms) c->o.backoff_min_ms = 100;
  if (!c->o.backoff_max_ms) c->o.backoff_max_ms = 2000;
  if (c->o.backoff_max_ms < c->o.backoff_min_ms) c->o.backoff_max_ms = c->o.backoff_min_ms;
  if (!c->o.refresh_ms) c->o.refresh_ms = 30000;
  if (!c->o.max_redirects) c->o.max_redirects = 5;
  c->o.seeds = NULL;
  c->o.user = c->o.password = NULL;
  int rc = -ENOMEM;
  if ((o->user && !(c->user = strdup(o->user))) || (o->password && !(c->password = strdup(o->password))))
    goto err;
  rc = -EINVAL;
  for (unsigned i = 0; i < o->nseeds; i++) {
    if (!o->seeds[i] || !(c->seeds[i] = node_parse(c, o->seeds[i], strlen(o->seeds[i]), NULL))) goto err;
    c->nseeds++;
  }
  uv_timer_init(loop, &c->tmr);
  uv_timer_init(loop, &c->house);
  c->tmr.data = c->house.data = c;
  c->handles = 2;
  uv_timer_start(&c->house, on_house, 0, HOUSE_MS);
  c->refresh_due = 0;
  *out = c;
  return 0;
err:
  free_client(c);
  return rc;
}

void kv_g4c_close(kv_g4c *c, kv_g4c_close_cb cb, void *arg) {
  c->in_api++;
  c->closing = 1;
  c->close_cb = cb;
  c->close_arg = arg;
  for (node *n = c->nodes; n; n = n->next) {
    redisAsyncContext *ac = n->ac;
    n->ac = NULL;
    n->st = N_IDLE;
    if (ac) redisAsyncFree(ac); /* its callbacks fail their requests: CLOSED */
  }
  while (c->head) req_fail(c->head, KV_G4C_R_CLOSED, NULL);
  uv_close((uv_handle_t *)&c->tmr, timer_closed);
  uv_close((uv_handle_t *)&c->house, timer_closed);
  c->in_api--;
}
