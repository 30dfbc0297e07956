/* g4_cluster.c - Redis Cluster routing over hiredis async contexts on a
 * libuv loop (see g4_cluster.h; the design is in G4.md).
 *
 * Pieces, top to bottom: CRC16 and slots; the hiredis <-> libuv adapter;
 * the reply limits (hiredis' reader functions); the node table and the
 * state summary; connections and host names;
 * requests (deadline list, deferred delivery, sending, replies and
 * redirections); the slot map; the housekeeping timer; open and close.
 *
 * Lifetimes. A node lives while the map names it (master of a slot, or
 * master or replica of a CLUSTER SLOTS range), while it is a seed, or while
 * a command is addressed to it (sent and not answered, or waiting for its
 * host name); after that the housekeeping timer closes and frees it (never
 * from inside a hiredis callback of its own). A request lives until its
 * callback has been delivered and hiredis has given back every callback it
 * owes for it (a timed-out command is still in hiredis' queue until its
 * reply comes or its connection goes). A host name lookup runs on libuv's
 * thread pool and outlives its node if the node gave up waiting for it.
 * The client is freed when its two timers, every adapter's poll handle and
 * every lookup have finished, after the last callback. */
#include "tiers/g4_cluster.h"

#include <errno.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/sds.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "tiers/g4_format.h"

/* The reply limits read the reader's task stack (rstack) of hiredis 0.14;
 * 1.x keeps it elsewhere (and has limits of its own to set instead). */
#if HIREDIS_MAJOR != 0 || HIREDIS_MINOR != 14
#error "g4_cluster.c's reply limits are written for hiredis 0.14's reader"
#endif
_Static_assert(KV_G4C_STRING_MAX == (size_t)KV_G4_PAYLOAD_MAX + KV_G4_HDR_LEN,
               "the longest string by default is the longest G4 value");

#define SUB          "g4"
#define HOUSE_MS     50  /* housekeeping period */
#define REFRESH_GAP  100 /* at least this long between two map reads */
#define REFRESH_FAIL 200 /* a failed map read is retried after this */
#define HOST_MAX     256 /* a DNS name is at most 253 bytes */
#define IP_MAX       64  /* INET6_ADDRSTRLEN, and a margin */
#define BUCKETS      (2 * KV_G4C_NODES_MAX) /* of the node hash, a power of 2 */
/* A connection's unsent bytes (hiredis' output buffer) taken before further
 * commands wait in its node's list: hiredis moves what is left to the
 * buffer's front after each write, so a buffer of many values costs time
 * quadratic in its size (and memory the kernel's socket buffer already
 * bounds). One command is always taken, however long. */
#define OBUF_MAX     (1u << 20)
/* A readable connection is read up to this many times (16 KiB each, hiredis'
 * read size) in one turn of the loop while the socket has bytes: one value
 * of 256 KiB is not 16 turns of the loop. */
#define READS_MAX    64
/* A reader's buffer, once empty, is kept up to this size (hiredis' default
 * is 16 KiB: a buffer that grew to hold a value is freed and grown again,
 * realloc by realloc, for the next one). */
#define READER_KEEP  (2u << 20)
/* The rest of a string being read is read in one call (read_rest) when it
 * is at least READ_REST_MIN bytes (hiredis' own read size), at most
 * READ_REST_MAX (a reader's buffer kept). */
#define READ_REST_MIN (16u << 10)
#define READ_REST_MAX READER_KEEP
/* A connection is read at most this many bytes a turn (and one read
 * more): READS_MAX reads of hiredis' size. */
#define READ_TURN_BYTES ((size_t)READS_MAX * READ_REST_MIN)

_Static_assert((BUCKETS & (BUCKETS - 1)) == 0, "BUCKETS is a power of 2");
/* ---- CRC16 and slots ----------------------------------------------------- */

/* CRC16-CCITT (XMODEM) a byte at a time: the table holds each byte's
 * remainder, built once (the bitwise loop cost 2% of the loop's time while
 * loading 64 KiB blocks from G4: it names the slot of every command). */
static uint16_t crc16_tab[256];
static pthread_once_t crc16_once = PTHREAD_ONCE_INIT;
static void crc16_init(void) {
  for (unsigned v = 0; v < 256; v++) {
    uint16_t crc = (uint16_t)(v << 8);
    for (int b = 0; b < 8; b++) crc = (uint16_t)(crc & 0x8000 ? (crc << 1) ^ 0x1021 : crc << 1);
    crc16_tab[v] = crc;
  }
}

uint16_t kv_g4c_crc16(const void *buf, size_t len) {
  pthread_once(&crc16_once, crc16_init);
  const uint8_t *p = buf;
  uint16_t crc = 0;
  for (size_t i = 0; i < len; i++) crc = (uint16_t)(crc << 8) ^ crc16_tab[(crc >> 8) ^ p[i]];
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

enum { N_IDLE, N_RESOLVING, N_CONNECTING, N_READY, N_BACKOFF };

typedef struct req req;
typedef struct lookup lookup;

typedef struct node {
  struct node *hnext; /* the hash chain of (host, port) */
  unsigned idx;       /* in c->tab */
  kv_g4c *c;
  char host[HOST_MAX];
  int port;
  int numeric;           /* host is an IP address: connected to without a lookup */
  redisAsyncContext *ac; /* NULL when not connected */
  int st;
  int failed;       /* the last attempt failed or the connection was lost */
  int backoff_ms;   /* the last delay; 0 after a success */
  uint64_t due;     /* RESOLVING, CONNECTING: deadline; BACKOFF: retry time */
  uint64_t last_rx; /* when a reply last came */
  lookup *lk;       /* RESOLVING: its host name lookup */
  req *whead, *wtail; /* commands waiting: RESOLVING, for the connection;
                       * connected, for room in its output (OBUF_MAX) */
  /* what holds the node in the table */
  int seed;
  unsigned nslots; /* slots it is the master of (c->slot_master) */
  unsigned nshard; /* places it holds in c->shards (master or replica) */
  unsigned busy;   /* requests addressed to it (r->to) without an outcome */
} node;

/* A host name lookup on libuv's thread pool. n is NULL once its node gave
 * up waiting (a timeout, the close): the answer is then dropped. */
struct lookup {
  uv_getaddrinfo_t q;
  kv_g4c *c;
  node *n;
};

typedef struct shard {
  node *master;
  node *rep[4];
  unsigned nrep, rr;
} shard;

typedef void (*req_done_fn)(req *r, const kv_g4c_reply *rep, const struct redisReply *raw);
struct req {
  kv_g4c *c;
  req *prev, *next;   /* c's deadline list, in submission order, until done */
  req *dnext;         /* c's deferred list */
  req *wprev, *wnext; /* the waiting list of to (node.whead) */
  int waiting;
  uint64_t deadline, sent_at;
  char *cmd;
  size_t cmdlen;
  unsigned slot, flags;
  int redirects;
  int refs;     /* hiredis callbacks still owed */
  int done;     /* outcome decided (delivered, or waiting in the deferred list) */
  int deferred; /* in the deferred list: freed once delivered, not before */
  int asking;   /* the next write is ASKING + the command */
  node *fixed;  /* internal: send to this node, not by slot */
  node *ask;    /* the next send goes to this node, with ASKING */
  node *to;     /* where it was sent (or waits) last; counted in to->busy
                 * until done, valid until the outcome is delivered */
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
  uv_timer_t house; /* connect timeouts, reconnects, map reads, node cleanup */
  unsigned handles; /* open uv handles (the timers and adapters' polls) and
                     * host name lookups not finished */
  int closing, in_api;
  kv_g4c_close_cb close_cb;
  void *close_arg;
  node *tab[KV_G4C_NODES_MAX]; /* every node, st.nodes of them */
  node *bucket[BUCKETS];       /* the same, by (host, port) */
  int gc_due;                  /* some node may be unreferenced */
  int full_logged;             /* "table full" said since the last cleanup */
  node *seeds[KV_G4C_SEEDS_MAX];
  unsigned nseeds, rr;
  node *slot_master[KV_G4C_SLOTS];
  shard *slot_shard[KV_G4C_SLOTS];
  shard *shards; /* the last CLUSTER SLOTS' shards */
  unsigned nshards;
  unsigned masters_down; /* nodes with slots (st.masters) that are failed */
  req *head, *tail;      /* deadline list */
  req *dhead, *dtail;    /* deferred list */
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
static void req_fail(req *r, kv_g4c_reason reason, const char *msg);
static void req_write(req *r);
static void node_drop(node *n, const char *why);

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
  /* the reply being read (reply limits, below) */
  uint64_t elements; /* 1 + the elements its arrays announced */
  uint64_t bytes;    /* its string bytes */
  char over[128];    /* why it was refused: the connection's end; "" */
} ev;

static int reader_check(ev *p);

static void node_pump(node *n);

static size_t read_rest(ev *p);

static void ev_poll(uv_poll_t *h, int status, int events) {
  ev *p = h->data;
  int e = status ? p->events : events;
  size_t got = 0; /* bytes read this turn (a read of hiredis' counts its size) */
  for (int i = 0; p->ac && (e & UV_READABLE) && i < READS_MAX && got < READ_TURN_BYTES; i++) {
    size_t n = status ? 0 : read_rest(p);
    if (n == 0) redisAsyncHandleRead(p->ac);
    got += n ? n : READ_REST_MIN;
    if (p->ac && reader_check(p)) node_drop(p->ac->data, p->over);
    int more = 0;
    if (status || !p->ac || ioctl(p->ac->c.fd, FIONREAD, &more) || more <= 0) break;
  }
  if (p->ac && (e & UV_WRITABLE)) {
    redisAsyncHandleWrite(p->ac);
    if (p->ac) node_pump(p->ac->data);
  }
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

/* ---- reply limits ------------------------------------------------------------
 * hiredis 0.14 builds whatever a node sends: "*10000000" is ten million
 * redisReply objects made (and later freed) on the loop, a string is
 * buffered whole before it is built ("$4294967296": 4 GiB held), and a
 * reply to no command trips an assert (the process aborts). Each
 * connection's reader builds with the functions below instead of
 * hiredis' own: the same objects (a calloc'ed redisReply; str malloc'ed,
 * len + 1 bytes, NUL-terminated; element calloc'ed; a child stored at its
 * parent's element[idx]), so freeReplyObject frees them, but each reply
 * (an object without a parent starts one) is counted as it is read and
 * refused (NULL) over the limits of g4_cluster.h. hiredis then fails the
 * reader ("Out of memory"), frees what it built and drops the connection;
 * ev.over holds the real reason, which conn_why gives the commands that
 * fail and the log. A string is built only once all of it is in, so
 * reader_check looks after each read (16 KiB at most) at what the reader
 * holds: the length line of the string being read (hiredis 0.14's rstack)
 * and the part of any other line, and has the connection dropped at once.
 * The normal path costs a few compares per object; a string is copied
 * once, as hiredis does. */

/* The reply p's reader is reading is refused: why (formatted) is kept and
 * counted, once per connection. NULL (a reader function's refusal). */
static void *over(ev *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void *over(ev *p, const char *fmt, ...) {
  if (p->over[0]) return NULL;
  char why[80];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  snprintf(p->over, sizeof p->over, "reply over the limits (%s): connection closed", why);
  p->c->st.replies_refused++;
  return NULL;
}

/* Why ac's connection ended: the reply limits' reason, else hiredis'. */
static const char *conn_why(const redisAsyncContext *ac) {
  const ev *p = ac->ev.data;
  return p && p->over[0] ? p->over : ac->errstr;
}

static size_t reply_bytes_max(const kv_g4c *c) {
  return c->o.max_string + KV_G4C_REPLY_BYTES_EXTRA;
}

/* t is a reply's first object: its counts start; one that answers no
 * command is refused, but an error (a server closing the connection says
 * why, and hiredis reports it). 0, or -1. */
static int reply_start(ev *p, const redisReadTask *t) {
  p->elements = 1;
  p->bytes = 0;
  if (p->ac && !p->ac->replies.head && t->type != REDIS_REPLY_ERROR) {
    over(p, "a reply to no command");
    return -1;
  }
  return 0;
}

static redisReply *reply_new(int type) {
  redisReply *r = calloc(1, sizeof *r);
  if (r) r->type = type;
  return r;
}

static void *reply_link(const redisReadTask *t, redisReply *r) {
  if (t->parent) ((redisReply *)t->parent->obj)->element[t->idx] = r;
  return r;
}

static void *reply_string(const redisReadTask *t, char *str, size_t len) {
  ev *p = t->privdata;
  if (!t->parent && reply_start(p, t)) return NULL;
  int bulk = t->type == REDIS_REPLY_STRING;
  size_t max = bulk ? p->c->o.max_string : KV_G4C_LINE_MAX;
  if (len > max)
    return over(p, "a %s of %zu bytes, more than %zu", bulk ? "string" : "line", len, max);
  p->bytes += len;
  if (p->bytes > reply_bytes_max(p->c))
    return over(p, "%llu string bytes in one reply, more than %zu", (unsigned long long)p->bytes,
                reply_bytes_max(p->c));
  redisReply *r = reply_new(t->type);
  if (!r) return NULL;
  if (!(r->str = malloc(len + 1))) {
    free(r);
    return NULL;
  }
  memcpy(r->str, str, len);
  r->str[len] = 0;
  r->len = len;
  return reply_link(t, r);
}

void *kv_g4c_reply_take(const kv_g4c_reply *r) {
  if (r->kind != KV_G4C_VALUE || !r->raw || r->raw->type != REDIS_REPLY_STRING) return NULL;
  redisReply *raw = (redisReply *)r->raw; /* made by reply_string: malloc'd, freed with free() */
  void *s = raw->str;
  raw->str = NULL;
  raw->len = 0;
  return s;
}

static void *reply_array(const redisReadTask *t, int elements) {
  ev *p = t->privdata;
  if (!t->parent && reply_start(p, t)) return NULL;
  if (elements < 0) return over(p, "an array of %d elements", elements);
  p->elements += (uint64_t)elements;
  if (p->elements > KV_G4C_REPLY_ELEMENTS_MAX)
    return over(p, "an array of %d elements: more than %u in one reply", elements,
                KV_G4C_REPLY_ELEMENTS_MAX);
  redisReply *r = reply_new(REDIS_REPLY_ARRAY);
  if (!r) return NULL;
  if (elements > 0 && !(r->element = calloc((size_t)elements, sizeof *r->element))) {
    free(r);
    return NULL;
  }
  r->elements = (size_t)elements;
  return reply_link(t, r);
}

static void *reply_integer(const redisReadTask *t, long long v) {
  if (!t->parent && reply_start(t->privdata, t)) return NULL;
  redisReply *r = reply_new(REDIS_REPLY_INTEGER);
  if (!r) return NULL;
  r->integer = v;
  return reply_link(t, r);
}

static void *reply_nil(const redisReadTask *t) {
  if (!t->parent && reply_start(t->privdata, t)) return NULL;
  redisReply *r = reply_new(REDIS_REPLY_NIL);
  return r ? reply_link(t, r) : NULL;
}

static redisReplyObjectFunctions reply_fns = {reply_string, reply_array, reply_integer, reply_nil,
                                              freeReplyObject};

/* The length of the string rd is in the middle of, as far as its length
 * line is in (saturating at UINT64_MAX), at rd->buf + rd->pos; its digits
 * so far in *digits. */
static uint64_t string_len(const redisReader *rd, size_t *digits) {
  const char *s = rd->buf + rd->pos;
  size_t pending = rd->len - rd->pos, i = 0;
  uint64_t len = 0;
  for (; i < pending && s[i] >= '0' && s[i] <= '9'; i++)
    len = len > (UINT64_MAX - 9) / 10 ? UINT64_MAX : len * 10 + (uint64_t)(s[i] - '0');
  *digits = i;
  return len;
}

/* What p's reader holds of a reply it has not finished, after a read: a
 * string whose length (as much of it as is in) is over the limits, or
 * more than KV_G4C_LINE_MAX bytes of a line not ended yet (a status, an
 * error, an integer, a length). 0, or -1 (p->over says why). */
static int reader_check(ev *p) {
  const redisReader *rd = p->ac->c.reader;
  if (rd->err || rd->ridx < 0) return 0;
  const redisReadTask *t = &rd->rstack[rd->ridx];
  const char *s = rd->buf + rd->pos;
  size_t pending = rd->len - rd->pos, i = 0;
  int ended = 0;
  if (t->type == REDIS_REPLY_STRING) { /* s: "<length>\r\n<bytes>\r\n", or "-1\r\n" */
    uint64_t len = string_len(rd, &i);
    uint64_t have = t->parent ? p->bytes : 0, max = p->c->o.max_string;
    if (len > max) {
      over(p, "a string of %llu bytes, more than %llu", (unsigned long long)len,
           (unsigned long long)max);
      return -1;
    }
    if (have + len > reply_bytes_max(p->c)) {
      over(p, "%llu string bytes in one reply, more than %zu", (unsigned long long)(have + len),
           reply_bytes_max(p->c));
      return -1;
    }
    ended = i + 1 < pending && s[i] == '\r' && s[i + 1] == '\n'; /* the rest is at most len + 2 */
  }
  if (!ended && pending > KV_G4C_LINE_MAX) {
    over(p, "a line of more than %u bytes", KV_G4C_LINE_MAX);
    return -1;
  }
  return 0;
}

/* hiredis 0.14 exports this, and its async.h does not declare it: what
 * redisAsyncHandleRead does after a read (each reply complete in the
 * reader to its command's callback). */
void redisProcessCallbacks(redisAsyncContext *ac);

/* The bytes still to come of the string p's reader is in the middle of (a
 * value, mostly), when its length line is in and within the limits: the
 * rest of it with its CRLF. 0 otherwise. */
static size_t string_rest(const ev *p) {
  const redisReader *rd = p->ac->c.reader;
  if (rd->err || rd->ridx < 0 || rd->rstack[rd->ridx].type != REDIS_REPLY_STRING) return 0;
  const char *s = rd->buf + rd->pos;
  size_t pending = rd->len - rd->pos, i;
  uint64_t len = string_len(rd, &i);
  if (i == 0 || i + 2 > pending || s[i] != '\r' || s[i + 1] != '\n' || len > p->c->o.max_string)
    return 0;
  uint64_t total = i + 2 + len + 2;
  return total > pending ? (size_t)(total - pending) : 0;
}

/* The rest of the string being read (string_rest, at most READ_REST_MAX),
 * read in one call straight into the reader's buffer, and the replies it
 * completes handled as hiredis would: hiredis reads 16 KiB at a time
 * into a buffer on its stack and copies each into its reader (a 256 KiB
 * value: 16 reads and a copy). The bytes read (1 when none were there
 * yet); 0 when hiredis is to read instead: a rest under READ_REST_MIN, or
 * the read found the connection's end or an error, which hiredis then
 * sees and handles itself. */
static size_t read_rest(ev *p) {
  size_t want = string_rest(p);
  redisAsyncContext *ac = p->ac;
  redisReader *rd = ac->c.reader;
  if (want < READ_REST_MIN || !(ac->c.flags & REDIS_CONNECTED) || ac->c.err) return 0;
  if (want > READ_REST_MAX) want = READ_REST_MAX;
  sds buf = sdsMakeRoomFor(rd->buf, want);
  if (!buf) return 0;
  rd->buf = buf;
  ssize_t n = read(ac->c.fd, rd->buf + rd->len, want);
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  if (n == 0) return 0;
  sdsIncrLen(rd->buf, (int)n);
  rd->len = sdslen(rd->buf);
  redisProcessCallbacks(ac);
  return (size_t)n;
}

/* ---- the node table and the state summary ---------------------------------
 * Nodes are found by (host, port) in a hash, st.nodes of them in tab[], at
 * most KV_G4C_NODES_MAX. A node nothing holds (node_unused) is freed by the
 * housekeeping timer. The state (kv_g4c_get_state) is kept as counts,
 * updated where they change: st.slots (slots with a master), st.masters
 * (nodes that are the master of a slot) and masters_down (those of them
 * whose last attempt failed). */

static unsigned node_hash(const char *host, size_t len, int port) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)host[i]) * 16777619u;
  h = (h ^ (uint32_t)port) * 16777619u;
  return h & (BUCKETS - 1);
}

/* The node (host[0..hostlen), port), added if new. 0 and *out; -EINVAL
 * (not a host name or address, not a port), -ENOSPC (the table is full),
 * -ENOMEM. */
static int node_get(kv_g4c *c, const char *host, size_t hostlen, int port, node **out) {
  if (hostlen == 0 || hostlen >= HOST_MAX || memchr(host, 0, hostlen) || port <= 0 || port > 65535)
    return -EINVAL;
  unsigned b = node_hash(host, hostlen, port);
  for (node *n = c->bucket[b]; n; n = n->hnext)
    if (n->port == port && !memcmp(n->host, host, hostlen) && !n->host[hostlen]) {
      *out = n;
      return 0;
    }
  if (c->st.nodes >= KV_G4C_NODES_MAX) return -ENOSPC;
  node *n = calloc(1, sizeof *n);
  if (!n) return -ENOMEM;
  memcpy(n->host, host, hostlen);
  n->port = port;
  n->c = c;
  unsigned char addr[sizeof(struct in6_addr)];
  n->numeric = uv_inet_pton(AF_INET, n->host, addr) == 0 || uv_inet_pton(AF_INET6, n->host, addr) == 0;
  n->hnext = c->bucket[b];
  c->bucket[b] = n;
  n->idx = c->st.nodes++;
  c->tab[n->idx] = n;
  *out = n;
  return 0;
}

/* Nothing holds n: not a seed, not in the map, no command addressed to
 * it, no lookup; and it may be freed now (not inside one of its own
 * connection's callbacks). */
static int node_unused(const node *n) {
  return !n->seed && !n->nslots && !n->nshard && !n->busy && !n->lk &&
         !(n->ac && (n->ac->c.flags & REDIS_IN_CALLBACK));
}

/* Removes n from the table, closes its connection (hiredis gives back
 * what it holds: requests that are done already) and frees it. */
static void node_free(kv_g4c *c, node *n) {
  node **p = &c->bucket[node_hash(n->host, strlen(n->host), n->port)];
  while (*p != n) p = &(*p)->hnext;
  *p = n->hnext;
  node *last = c->tab[--c->st.nodes];
  last->idx = n->idx;
  c->tab[n->idx] = last;
  c->tab[c->st.nodes] = NULL;
  redisAsyncContext *ac = n->ac;
  n->ac = NULL;
  if (ac) redisAsyncFree(ac);
  free(n);
}

/* Frees every node nothing holds, keep excepted. O(nodes). */
static void nodes_gc(kv_g4c *c, const node *keep) {
  unsigned freed = 0;
  c->gc_due = 0;
  for (unsigned i = c->st.nodes; i-- > 0;) { /* node_free moves the last node to i */
    node *n = c->tab[i];
    if (n != keep && node_unused(n)) {
      node_free(c, n);
      freed++;
    }
  }
  if (freed) {
    c->full_logged = 0;
    kv_debug(SUB, "%u nodes no longer in the map freed, %u left", freed, c->st.nodes);
  }
}

/* n's last attempt failed (1) or it connected (0). */
static void node_set_failed(node *n, int failed) {
  kv_g4c *c = n->c;
  if (n->failed == failed) return;
  n->failed = failed;
  if (!n->nslots) return;
  if (failed)
    c->masters_down++;
  else
    c->masters_down--;
}

/* The master of slot s is n now (NULL: none). */
static void set_slot(kv_g4c *c, unsigned s, node *n) {
  node *old = c->slot_master[s];
  if (old == n) return;
  if (!old)
    c->st.slots++;
  else if (!--old->nslots) {
    c->st.masters--;
    if (old->failed) c->masters_down--;
    c->gc_due = 1;
  }
  if (!n)
    c->st.slots--;
  else if (!n->nslots++) {
    c->st.masters++;
    if (n->failed) c->masters_down++;
  }
  c->slot_master[s] = n;
}

/* The nodes of shard s lose their place in it (map_apply gave it). */
static void shard_release(kv_g4c *c, shard *s) {
  if (s->master && !--s->master->nshard) c->gc_due = 1;
  for (unsigned i = 0; i < s->nrep; i++)
    if (!--s->rep[i]->nshard) c->gc_due = 1;
}

kv_g4c_state kv_g4c_get_state(const kv_g4c *c) {
  if (!c->have_map || c->st.slots == 0 || c->masters_down >= c->st.masters) return KV_G4C_DOWN;
  return c->masters_down || c->st.slots < KV_G4C_SLOTS ? KV_G4C_DEGRADED : KV_G4C_OK;
}

void kv_g4c_get_stats(const kv_g4c *c, kv_g4c_stats *st) {
  *st = c->st;
  st->state = kv_g4c_get_state(c);
}

/* ---- connections and host names --------------------------------------------
 * A node named by an IP address is connected to at once (hiredis'
 * getaddrinfo of an address does not block). A host name is looked up
 * first with uv_getaddrinfo, on libuv's thread pool, at every connection
 * (the name may point elsewhere since); commands for the node wait in its
 * list meanwhile, as they wait in hiredis' buffer while a connection is
 * made. The lookup and the connection each have connect_timeout_ms. */

/* The last attempt to reach n failed, or its connection was lost: a
 * backoff before the next. */
static void node_failed(node *n, const char *why) {
  kv_g4c *c = n->c;
  c->st.conn_fails++;
  if (!n->failed) kv_warn(SUB, "%s:%d: %s", n->host, n->port, why && *why ? why : "connection lost");
  node_set_failed(n, 1);
  n->st = N_BACKOFF;
  int lo = c->o.backoff_min_ms, hi = c->o.backoff_max_ms;
  n->backoff_ms = n->backoff_ms ? n->backoff_ms * 2 : lo;
  if (n->backoff_ms > hi) n->backoff_ms = hi;
  n->due = now_ms(c) + (uint64_t)n->backoff_ms;
  refresh_soon(c);
}

/* The connection of n failed or was lost (ac is the context it had). */
static void node_flush(node *n, const char *why);

static void node_lost(node *n, const redisAsyncContext *ac, const char *why) {
  kv_g4c *c = n->c;
  if (n->ac != ac) return;
  n->ac = NULL;
  if (c->closing) {
    n->st = N_IDLE;
    return;
  }
  node_failed(n, why);
  node_flush(n, why && why[0] ? why : "connection lost"); /* those waiting for room */
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
  node_set_failed(n, 0);
  n->backoff_ms = 0;
  n->c->st.connects++;
}

static void on_disconnect(const redisAsyncContext *ac, int status) {
  node_lost(ac->data, ac, conn_why(ac));
}

static void on_auth(redisAsyncContext *ac, void *r, void *priv) {
  redisReply *reply = r;
  node *n = ac->data;
  if (reply && reply->type == REDIS_REPLY_ERROR)
    kv_warn(SUB, "%s:%d: %s refused: %s", n->host, n->port, (const char *)priv, reply->str);
}

/* Connects n to ip (its host, or the address its name resolved to). 0, or
 * -1: the attempt failed (n is in backoff). */
static int node_connect(node *n, const char *ip) {
  kv_g4c *c = n->c;
  redisAsyncContext *ac = redisAsyncConnect(ip, n->port);
  if (!ac) {
    node_failed(n, "cannot allocate a connection");
    return -1;
  }
  if (ac->err) {
    n->ac = ac;
    node_lost(n, ac, ac->errstr);
    redisAsyncFree(ac);
    return -1;
  }
  ac->data = n;
  if (ev_attach(c, ac) < 0) {
    n->ac = ac;
    node_lost(n, ac, "cannot watch the socket");
    redisAsyncFree(ac);
    return -1;
  }
  ac->c.reader->fn = &reply_fns; /* the reply limits */
  ac->c.reader->privdata = ac->ev.data;
  ac->c.reader->maxbuf = READER_KEEP;
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
  return 0;
}

static void wait_del(req *r) {
  node *n = r->to;
  if (r->wprev)
    r->wprev->wnext = r->wnext;
  else
    n->whead = r->wnext;
  if (r->wnext)
    r->wnext->wprev = r->wprev;
  else
    n->wtail = r->wprev;
  r->wprev = r->wnext = NULL;
  r->waiting = 0;
}

/* The commands waiting for n (its lookup, or room): written to its
 * connection, or failed (CONN, why) if it has none. */
static void node_flush(node *n, const char *why) {
  req *r;
  while ((r = n->whead)) {
    wait_del(r);
    if (n->ac)
      req_write(r);
    else
      req_fail(r, KV_G4C_R_CONN, why);
  }
}

/* Moves the commands waiting for room in n's output into it, oldest first,
 * while it has room (after hiredis wrote some of it). */
static void node_pump(node *n) {
  req *r;
  while (n->ac && (r = n->whead) && sdslen(n->ac->c.obuf) < OBUF_MAX) {
    wait_del(r);
    req_write(r);
  }
}

static void on_lookup(uv_getaddrinfo_t *q, int status, struct addrinfo *ai) {
  lookup *lk = q->data;
  kv_g4c *c = lk->c;
  node *n = lk->n;
  /* IPv4 first, as hiredis does */
  const struct addrinfo *pick = NULL;
  for (const struct addrinfo *a = ai; a && !pick; a = a->ai_next)
    if (a->ai_family == AF_INET) pick = a;
  for (const struct addrinfo *a = ai; a && !pick; a = a->ai_next)
    if (a->ai_family == AF_INET6) pick = a;
  char ip[IP_MAX] = "";
  if (status == 0 && pick && pick->ai_family == AF_INET)
    uv_ip4_name((const struct sockaddr_in *)pick->ai_addr, ip, sizeof ip);
  else if (status == 0 && pick)
    uv_ip6_name((const struct sockaddr_in6 *)pick->ai_addr, ip, sizeof ip);
  uv_freeaddrinfo(ai);
  free(lk);
  if (n) { /* still waited for: the client is not closing */
    n->lk = NULL;
    char why[96];
    snprintf(why, sizeof why, "cannot resolve the host name: %s",
             status ? uv_strerror(status) : "no IPv4 or IPv6 address");
    if (!ip[0])
      node_failed(n, why);
    else if (node_connect(n, ip) == 0)
      kv_debug(SUB, "%s:%d: resolved to %s", n->host, n->port, ip);
    node_flush(n, ip[0] ? "node unreachable" : why);
  }
  c->handles--;
  maybe_free_client(c);
}

/* Starts the lookup of n's host name; commands for n wait until it ends.
 * 1, or -1: it could not start (n is in backoff). */
static int node_resolve(node *n) {
  kv_g4c *c = n->c;
  lookup *lk = calloc(1, sizeof *lk);
  if (!lk) {
    node_failed(n, "cannot allocate a host name lookup");
    return -1;
  }
  lk->c = c;
  lk->n = n;
  lk->q.data = lk;
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  int rc = uv_getaddrinfo(c->loop, &lk->q, on_lookup, n->host, NULL, &hints);
  if (rc < 0) {
    free(lk);
    char why[96];
    snprintf(why, sizeof why, "cannot look the host name up: %s", uv_strerror(rc));
    node_failed(n, why);
    return -1;
  }
  c->handles++;
  n->lk = lk;
  n->st = N_RESOLVING;
  n->due = now_ms(c) + (uint64_t)c->o.connect_timeout_ms;
  return 1;
}

/* n no longer waits for its lookup (a timeout, the close): the lookup is
 * cancelled if it has not started, its answer dropped if it has. */
static void node_unlookup(node *n) {
  lookup *lk = n->lk;
  if (!lk) return;
  n->lk = NULL;
  lk->n = NULL;
  uv_cancel((uv_req_t *)&lk->q);
}

/* A connection for n, started now if n has none and is not waiting out a
 * backoff: 0 when n->ac takes commands (connecting or ready), 1 while n's
 * host name is looked up (commands wait in n's list), -1 when n cannot be
 * used now. */
static int node_open(node *n) {
  kv_g4c *c = n->c;
  if (n->ac) return 0;
  if (n->st == N_RESOLVING) return 1;
  if (c->closing || (n->st == N_BACKOFF && now_ms(c) < n->due)) return -1;
  return n->numeric ? node_connect(n, n->host) : node_resolve(n);
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

/* r is addressed to n now: counted in n->busy while r has no outcome. */
static void req_set_to(req *r, node *n) {
  if (r->to == n) return;
  if (r->to && !--r->to->busy) r->c->gc_due = 1;
  r->to = n;
  if (n) n->busy++;
}

/* r has its outcome: off the deadline list and any waiting list, no longer
 * counted by its node (r->to stays readable until the outcome is
 * delivered: only the housekeeping timer frees nodes). */
static void req_done(req *r) {
  kv_g4c *c = r->c;
  r->done = 1;
  list_del(c, r);
  if (r->waiting) wait_del(r);
  if (r->to && !--r->to->busy) c->gc_due = 1;
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
  req_done(r);
  if (c->in_api || c->closing) {
    r->dreason = reason;
    r->derr = reason_err(reason);
    snprintf(r->dmsg, sizeof r->dmsg, "%s", msg ? msg : kv_g4c_reason_name(reason));
    r->dnext = NULL;
    r->deferred = 1;
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
    r->deferred = 0;
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
      if (!n->ac && node_usable(n)) node_open(n); /* ready for the next reads */
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

/* Writes r to its node's connection (r->to->ac); on failure fails it. */
static void req_write(req *r) {
  kv_g4c *c = r->c;
  redisAsyncContext *ac = r->to->ac;
  if (r->asking) redisAsyncCommand(ac, NULL, NULL, "ASKING");
  r->asking = 0;
  if (redisAsyncFormattedCommand(ac, on_reply, r, r->cmd, r->cmdlen) != REDIS_OK) {
    req_fail(r, KV_G4C_R_CONN, "connection closing");
    return;
  }
  r->refs++;
  r->sent_at = now_ms(c);
  c->st.bytes_out += r->cmdlen;
}

/* Sends r where it belongs now, or queues it on a node whose host name is
 * being looked up; on failure fails it (CONN or DOWN). */
static void req_send(req *r) {
  kv_g4c *c = r->c;
  node *n = route(c, r);
  if (!n) {
    req_fail(r, KV_G4C_R_DOWN, "no node serves the slot");
    return;
  }
  r->asking = r->ask != NULL;
  r->ask = NULL;
  req_set_to(r, n);
  int st = node_open(n);
  if (st < 0) {
    req_fail(r, KV_G4C_R_CONN, "node unreachable");
    return;
  }
  if (st > 0 || n->whead || sdslen(n->ac->c.obuf) >= OBUF_MAX) {
    /* until the lookup ends or the output has room (node_pump), or r's
     * deadline; behind those waiting already, in submission order */
    r->waiting = 1;
    r->wnext = NULL;
    r->wprev = n->wtail;
    if (n->wtail)
      n->wtail->wnext = r;
    else
      n->whead = r;
    n->wtail = r;
    return;
  }
  req_write(r);
}

/* "host:port" (the last colon: IPv6 addresses have others); an empty host
 * is from's. 0, or -EINVAL. */
static int parse_addr(const char *s, size_t len, const node *from, const char **host, size_t *hostlen,
                      int *port) {
  const char *colon = NULL;
  for (size_t i = len; i-- > 0;)
    if (s[i] == ':') {
      colon = s + i;
      break;
    }
  if (!colon) return -EINVAL;
  char *end;
  char num[8];
  size_t pl = len - (size_t)(colon - s) - 1;
  if (pl == 0 || pl >= sizeof num) return -EINVAL;
  memcpy(num, colon + 1, pl);
  num[pl] = 0;
  long p = strtol(num, &end, 10);
  if (*end || p <= 0 || p > 65535) return -EINVAL;
  *host = s;
  *hostlen = (size_t)(colon - s);
  if (*hostlen == 0 && from) {
    *host = from->host;
    *hostlen = strlen(from->host);
  }
  *port = (int)p;
  return 0;
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK ..." -> slot and address */
static int parse_redirect(const char *s, size_t len, const node *from, unsigned *slot, const char **host,
                          size_t *hostlen, int *port) {
  const char *sp = memchr(s, ' ', len);
  if (!sp) return -EINVAL;
  char *end;
  unsigned long v = strtoul(sp + 1, &end, 10);
  if (end == sp + 1 || *end != ' ' || v >= KV_G4C_SLOTS) return -EINVAL;
  *slot = (unsigned)v;
  return parse_addr(end + 1, len - (size_t)(end + 1 - s), from, host, hostlen, port);
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
    kv_g4c_reason why = moved ? KV_G4C_R_MOVED : KV_G4C_R_ASK;
    unsigned slot;
    const char *host;
    size_t hostlen;
    int port;
    node *to;
    if (parse_redirect(s, len, from, &slot, &host, &hostlen, &port)) {
      req_fail(r, KV_G4C_R_OTHER, s);
      return;
    }
    if (++r->redirects > c->o.max_redirects) {
      req_fail(r, why, s);
      return;
    }
    int rc = node_get(c, host, hostlen, port, &to);
    if (rc == -ENOSPC) {
      if (!c->full_logged)
        kv_warn(SUB, "%u nodes known, the most there may be: a redirection to %.*s:%d fails", c->st.nodes,
                (int)hostlen, host, port);
      c->full_logged = 1;
      req_fail(r, why, "redirected to a new node, and the node table is full");
      return;
    }
    if (rc) {
      req_fail(r, rc == -ENOMEM ? why : KV_G4C_R_OTHER, rc == -ENOMEM ? "out of memory" : s);
      return;
    }
    if (moved) {
      c->st.moved++;
      set_slot(c, slot, to);
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
    if (!r->refs && !r->deferred) req_free(r);
    return;
  }
  if (!reply) {
    if (c->closing) {
      req_fail(r, KV_G4C_R_CLOSED, NULL);
      return;
    }
    const char *why = conn_why(ac);
    node_lost(n, ac, why);
    req_fail(r, KV_G4C_R_CONN, why[0] ? why : "connection lost");
    return;
  }
  if (reply->type == REDIS_REPLY_ERROR) {
    on_error_reply(r, n, reply);
    return;
  }
  req_done(r);
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

/* A request for cmd[0..len) (RESP, malloc'ed: r takes it, or frees it on
 * failure), appended to the deadline list. NULL: -ENOMEM. */
static req *req_new(kv_g4c *c, char *cmd, size_t len) {
  req *r = calloc(1, sizeof *r);
  if (!r) {
    free(cmd);
    return NULL;
  }
  r->cmd = cmd;
  r->cmdlen = len;
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

size_t kv_g4c_resp(char *out, int argc, const char *const *argv, const size_t *argvlen, int hole,
                   size_t *hole_at) {
  char line[32];
  size_t at = (size_t)snprintf(line, sizeof line, "*%d\r\n", argc);
  if (out) memcpy(out, line, at);
  for (int i = 0; i < argc; i++) {
    size_t len = argvlen ? argvlen[i] : strlen(argv[i]);
    size_t ll = (size_t)snprintf(line, sizeof line, "$%zu\r\n", len);
    if (out) memcpy(out + at, line, ll);
    at += ll;
    if (i == hole) {
      if (hole_at) *hole_at = at;
    } else if (out) {
      memcpy(out + at, argv[i], len);
    }
    at += len;
    if (out) memcpy(out + at, "\r\n", 2);
    at += 2;
  }
  return at;
}

static int command(kv_g4c *c, const void *key, size_t keylen, unsigned flags, char *cmd,
                   size_t len, kv_g4c_cb cb, void *arg) {
  req *r = req_new(c, cmd, len);
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

/* The RESP of argv (kv_g4c_resp), malloc'ed, its length in *len; NULL
 * when out of memory. */
static char *resp_new(int argc, const char *const *argv, const size_t *argvlen, size_t *len) {
  *len = kv_g4c_resp(NULL, argc, argv, argvlen, -1, NULL);
  char *cmd = malloc(*len);
  if (cmd) kv_g4c_resp(cmd, argc, argv, argvlen, -1, NULL);
  return cmd;
}

int kv_g4c_command(kv_g4c *c, const void *key, size_t keylen, unsigned flags, int argc,
                   const char *const *argv, const size_t *argvlen, kv_g4c_cb cb, void *arg) {
  if (argc < 1 || !argv || !key || keylen == 0 || !cb) return -EINVAL;
  if (c->closing) return -ESHUTDOWN;
  size_t len;
  char *cmd = resp_new(argc, argv, argvlen, &len);
  if (!cmd) return -ENOMEM;
  return command(c, key, keylen, flags, cmd, len, cb, arg);
}

int kv_g4c_command_resp(kv_g4c *c, const void *key, size_t keylen, unsigned flags, char *cmd,
                        size_t len, kv_g4c_cb cb, void *arg) {
  if (!cmd || len == 0 || !key || keylen == 0 || !cb || c->closing) {
    free(cmd);
    return c->closing ? -ESHUTDOWN : -EINVAL;
  }
  return command(c, key, keylen, flags, cmd, len, cb, arg);
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

/* ---- the slot map ----------------------------------------------------------
 * A CLUSTER SLOTS reply is checked whole before anything changes, then
 * applied in time linear in its size. The old map's nodes that the new one
 * does not name are freed by the next housekeeping, or at once when the
 * new map needs their room in the table. */

static void refresh_soon(kv_g4c *c) {
  uint64_t t = c->refresh_last + REFRESH_GAP;
  if (c->refresh_due > t) c->refresh_due = t;
}

/* At most KV_G4C_SLOTS ranges [first, last, master, replicas...], each
 * within 0..16383, no slot in two of them. 0, or -EPROTO and why. */
static int map_check(const redisReply *r, char *why, size_t wlen) {
  if (!r || r->type != REDIS_REPLY_ARRAY) {
    snprintf(why, wlen, "not an array");
    return -EPROTO;
  }
  if (r->elements > KV_G4C_SLOTS) {
    snprintf(why, wlen, "%zu ranges, more than there are slots", r->elements);
    return -EPROTO;
  }
  uint64_t seen[KV_G4C_SLOTS / 64] = {0};
  for (size_t i = 0; i < r->elements; i++) {
    const redisReply *e = r->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 || e->element[0]->type != REDIS_REPLY_INTEGER ||
        e->element[1]->type != REDIS_REPLY_INTEGER) {
      snprintf(why, wlen, "range %zu malformed", i);
      return -EPROTO;
    }
    long long a = e->element[0]->integer, b = e->element[1]->integer;
    if (a < 0 || b >= KV_G4C_SLOTS || a > b) {
      snprintf(why, wlen, "range %lld..%lld not within 0..%d", a, b, KV_G4C_SLOTS - 1);
      return -EPROTO;
    }
    for (long long s = a; s <= b; s++) { /* at most KV_G4C_SLOTS in all: the first repeat stops it */
      if (seen[s / 64] >> (s % 64) & 1) {
        snprintf(why, wlen, "slot %lld in two ranges", s);
        return -EPROTO;
      }
      seen[s / 64] |= 1ull << (s % 64);
    }
  }
  return 0;
}

/* The node a CLUSTER SLOTS entry names ([host, port, ...]; an empty host:
 * from's), added if new. NULL when it names none ("?": endpoint unknown),
 * is malformed, or the table is full even after freeing what nothing
 * holds (counted in *full: no second cleanup then). */
static node *slots_node(kv_g4c *c, const redisReply *e, const node *from, unsigned *full) {
  if (e->type != REDIS_REPLY_ARRAY || e->elements < 2) return NULL;
  const redisReply *ip = e->element[0], *port = e->element[1];
  if (ip->type != REDIS_REPLY_STRING || port->type != REDIS_REPLY_INTEGER) return NULL;
  if (ip->len == 1 && ip->str[0] == '?') return NULL;
  if (port->integer <= 0 || port->integer > 65535) return NULL;
  const char *host = ip->len ? ip->str : from->host;
  size_t hostlen = ip->len ? ip->len : strlen(from->host);
  node *n = NULL;
  int rc = node_get(c, host, hostlen, (int)port->integer, &n);
  if (rc == -ENOSPC && !*full) {
    nodes_gc(c, from);
    rc = node_get(c, host, hostlen, (int)port->integer, &n);
  }
  if (rc == -ENOSPC) ++*full;
  return rc ? NULL : n;
}

/* Applies a CLUSTER SLOTS reply from node `from`. 0, or -EPROTO (refused,
 * the map unchanged), -ENOMEM. */
static int map_apply(kv_g4c *c, const redisReply *r, node *from) {
  char why[96];
  int rc = map_check(r, why, sizeof why);
  if (rc) {
    kv_warn(SUB, "slot map from %s:%d refused: %s", from->host, from->port, why);
    return rc;
  }
  shard *sh = calloc(r->elements ? r->elements : 1, sizeof *sh);
  if (!sh) return -ENOMEM;
  unsigned slots0 = c->st.slots, masters0 = c->st.masters;
  /* the old map goes; its nodes stay while something else holds them */
  for (unsigned s = 0; s < KV_G4C_SLOTS; s++) set_slot(c, s, NULL);
  memset(c->slot_shard, 0, sizeof c->slot_shard);
  for (unsigned i = 0; i < c->nshards; i++) shard_release(c, &c->shards[i]);
  free(c->shards);
  c->shards = sh;
  c->nshards = (unsigned)r->elements;
  unsigned full = 0;
  for (size_t i = 0; i < r->elements; i++) {
    const redisReply *e = r->element[i];
    shard *s = &sh[i];
    /* each node held as soon as found: a cleanup for room spares it */
    if ((s->master = slots_node(c, e->element[2], from, &full))) s->master->nshard++;
    for (size_t j = 3; j < e->elements && s->nrep < 4; j++) {
      node *rep = slots_node(c, e->element[j], from, &full);
      if (!rep) continue;
      rep->nshard++;
      s->rep[s->nrep++] = rep;
    }
    if (!s->master) continue;
    for (long long x = e->element[0]->integer; x <= e->element[1]->integer; x++) {
      set_slot(c, (unsigned)x, s->master);
      c->slot_shard[x] = s;
    }
  }
  if (full)
    kv_warn(SUB, "slot map from %s:%d names more than %d nodes: %u left out (their slots unmapped)",
            from->host, from->port, KV_G4C_NODES_MAX, full);
  if (c->st.slots != slots0 || c->st.masters != masters0 || !c->have_map)
    kv_info(SUB, "slot map from %s:%d: %u masters, %u of %u slots", from->host, from->port,
            c->st.masters, c->st.slots, KV_G4C_SLOTS);
  c->have_map = 1;
  c->gc_due = 1;
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

/* Reads the map from the next node that may answer, among the map's nodes
 * and the seeds, in turn: a connected one if there is one (a map full of
 * unreachable or made-up nodes does not keep it from the good ones). */
static void refresh_start(kv_g4c *c) {
  node *pick = NULL;
  unsigned total = c->st.nodes;
  for (int pass = 0; pass < 2 && !pick; pass++)
    for (unsigned i = 0; i < total && !pick; i++) {
      node *n = c->tab[(c->rr + i) % total];
      if ((n->seed || n->nslots || n->nshard) && (pass ? node_usable(n) : n->st == N_READY)) {
        pick = n;
        c->rr += i + 1;
      }
    }
  c->refresh_last = now_ms(c);
  if (!pick) {
    c->refresh_due = c->refresh_last + REFRESH_FAIL;
    return;
  }
  static const char *const argv[] = {"CLUSTER", "SLOTS"};
  size_t len;
  char *cmd = resp_new(2, argv, NULL, &len);
  req *r = cmd ? req_new(c, cmd, len) : NULL;
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

/* ---- housekeeping ----------------------------------------------------------- */

static void on_house(uv_timer_t *t) {
  kv_g4c *c = t->data;
  uint64_t now = now_ms(c);
  for (unsigned i = 0; i < c->st.nodes && !c->closing; i++) {
    node *n = c->tab[i];
    if (n->st == N_CONNECTING && n->ac && now >= n->due) {
      node_drop(n, "connect timed out");
    } else if (n->st == N_RESOLVING && now >= n->due) {
      node_unlookup(n);
      node_failed(n, "host name not resolved within the connect timeout");
      node_flush(n, "host name not resolved in time");
    } else if (n->nslots && !n->ac && n->st == N_BACKOFF && now >= n->due) {
      node_open(n); /* the map's masters come back on their own */
    }
  }
  if (c->closing) return;
  if (c->gc_due) nodes_gc(c, NULL);
  if (!c->refreshing && now >= c->refresh_due) refresh_start(c);
  run_deferred(c);
}

/* ---- open and close ------------------------------------------------------- */

static void free_client(kv_g4c *c) {
  for (unsigned i = 0; i < c->st.nodes; i++) free(c->tab[i]);
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
      o->backoff_min_ms < 0 || o->backoff_max_ms < 0 || o->max_redirects < 0 ||
      o->max_string > SIZE_MAX / 4)
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
  if (!c->o.max_string) c->o.max_string = KV_G4C_STRING_MAX;
  c->o.seeds = NULL;
  c->o.user = c->o.password = NULL;
  int rc = -ENOMEM;
  if ((o->user && !(c->user = strdup(o->user))) || (o->password && !(c->password = strdup(o->password))))
    goto err;
  for (unsigned i = 0; i < o->nseeds; i++) {
    const char *host;
    size_t hostlen;
    int port;
    node *n;
    rc = -EINVAL;
    if (!o->seeds[i] || parse_addr(o->seeds[i], strlen(o->seeds[i]), NULL, &host, &hostlen, &port)) goto err;
    rc = node_get(c, host, hostlen, port, &n);
    if (rc) {
      if (rc != -ENOMEM) rc = -EINVAL;
      goto err;
    }
    n->seed = 1;
    c->seeds[c->nseeds++] = n;
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
  for (unsigned i = 0; i < c->st.nodes; i++) {
    node *n = c->tab[i];
    redisAsyncContext *ac = n->ac;
    n->ac = NULL;
    n->st = N_IDLE;
    node_unlookup(n);           /* its answer is dropped; the client waits for it */
    if (ac) redisAsyncFree(ac); /* its callbacks fail their requests: CLOSED */
  }
  while (c->head) req_fail(c->head, KV_G4C_R_CLOSED, NULL);
  uv_close((uv_handle_t *)&c->tmr, timer_closed);
  uv_close((uv_handle_t *)&c->house, timer_closed);
  c->in_api--;
}
