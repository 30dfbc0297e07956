/* fake_redis.c - a scripted Redis Cluster node (see fake_redis.h). Blocking
 * sockets: the acceptor thread and one thread per connection, stopped by
 * shutting their sockets down. A flood is streamed by its connection's
 * thread after the answer, outside the lock. */
#include "tests/lib/fake_redis.h"

#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tiers/g4_cluster.h"

#define CONNS_MAX 256     /* connections over the fake's life; more are closed */
#define KEYS_MAX  4096    /* keys SET keeps */
#define IN_MAX    (1 << 20) /* the longest command */
#define ARGS_MAX  16

static const char *const names[] = {"PING", "AUTH", "READONLY", "ASKING", "CLUSTER", "GET", "SET"};
#define NNAMES (sizeof names / sizeof *names)

typedef struct conn {
  kvt_fake *f;
  int fd;
  pthread_t th;
} conn;

typedef struct kv {
  char *k, *v;
  size_t kl, vl;
} kv;

struct kvt_fake {
  int lfd, port;
  pthread_t acceptor;
  pthread_mutex_t mu; /* everything below */
  kvt_fake_script s;
  char slots_host[256], moved_host[256];
  unsigned long count[NNAMES + 1]; /* the last: any other command */
  unsigned next_addr;              /* the next made-up address of a MOVED */
  unsigned long long streamed;     /* bytes floods sent */
  int stopping;
  conn conns[CONNS_MAX];
  unsigned nconns;
  kv keys[KEYS_MAX];
  unsigned nkeys;
};

void kvt_fake_addr(unsigned i, char *out, unsigned n) {
  snprintf(out, n, "127.%u.%u.%u", 1 + i / 62500, (i / 250) % 250 + 1, i % 250 + 1);
}

/* ---- replies ------------------------------------------------------------- */

typedef struct sbuf {
  char *p;
  size_t len, cap;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->cap - b->len;
    int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) abort();
    if ((size_t)n < room) {
      b->len += (size_t)n;
      return;
    }
    b->cap = b->cap ? b->cap * 2 : 4096;
    while (b->cap - b->len <= (size_t)n) b->cap *= 2;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
}

static void put_bulk(sbuf *b, const char *s, size_t n) {
  put(b, "$%zu\r\n", n);
  if (b->cap - b->len < n + 3) {
    while (b->cap - b->len < n + 3) b->cap *= 2;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  put(b, "\r\n");
}

/* [first, last, [host, port, id]] */
static void put_range(sbuf *b, unsigned first, unsigned last, const char *host, int port) {
  put(b, "*3\r\n:%u\r\n:%u\r\n*3\r\n", first, last);
  put_bulk(b, host, strlen(host));
  put(b, ":%d\r\n$40\r\n%040d\r\n", port, port);
}

static void cluster_slots(kvt_fake *f, sbuf *b) {
  const char *self = f->slots_host[0] ? f->slots_host : "127.0.0.1";
  if (f->s.bad_range == 1) {
    put(b, "*1\r\n");
    put_range(b, 0, 16384, self, f->port);
  } else if (f->s.bad_range == 2) {
    put(b, "*2\r\n");
    put_range(b, 0, 100, self, f->port);
    put_range(b, 50, 16383, self, f->port);
  } else if (!f->s.ranges) {
    put(b, "*1\r\n");
    put_range(b, 0, 16383, self, f->port);
  } else {
    put(b, "*%u\r\n", f->s.ranges);
    for (unsigned i = 0; i < f->s.ranges; i++) {
      char addr[32];
      if (f->s.nodes) kvt_fake_addr(i % f->s.nodes, addr, sizeof addr);
      put_range(b, i % 16384, i % 16384, f->s.nodes ? addr : self, f->port);
    }
  }
}

/* A reply streamed after the answer (fake_redis.h: floods). */
typedef struct stream {
  enum { S_NONE, S_FLOOD, S_NESTED, S_TRICKLE } kind;
  unsigned long long n; /* elements; the string's announced length */
} stream;

static void put_fill(sbuf *b, char c, size_t n) {
  if (b->cap - b->len < n + 1) {
    b->cap = b->cap ? b->cap : 4096;
    while (b->cap - b->len < n + 1) b->cap *= 2;
    b->p = realloc(b->p, b->cap);
    if (!b->p) abort();
  }
  memset(b->p + b->len, c, n);
  b->len += n;
}

static kv *find(kvt_fake *f, const char *k, size_t kl) {
  for (unsigned i = 0; i < f->nkeys; i++)
    if (f->keys[i].kl == kl && !memcmp(f->keys[i].k, k, kl)) return &f->keys[i];
  return NULL;
}

static void answer(kvt_fake *f, int argc, const char **argv, const size_t *lens, sbuf *b,
                   stream *st) {
  unsigned which = NNAMES;
  for (unsigned i = 0; i < NNAMES; i++)
    if (strlen(names[i]) == lens[0] && !strncasecmp(names[i], argv[0], lens[0])) which = i;
  pthread_mutex_lock(&f->mu);
  f->count[which]++;
  const char *name = which < NNAMES ? names[which] : "?";
  if (!strcmp(name, "PING")) {
    put(b, "+PONG\r\n");
  } else if (!strcmp(name, "AUTH") || !strcmp(name, "READONLY") || !strcmp(name, "ASKING")) {
    put(b, "+OK\r\n");
  } else if (!strcmp(name, "CLUSTER") && argc == 2 && lens[1] == 5 && !strncasecmp(argv[1], "SLOTS", 5)) {
    if (f->s.flood) {
      st->kind = f->s.flood_nested ? S_NESTED : S_FLOOD;
      st->n = f->s.flood;
    } else {
      cluster_slots(f, b);
    }
  } else if ((!strcmp(name, "GET") && argc == 2) || (!strcmp(name, "SET") && argc >= 3)) {
    unsigned slot = kv_g4c_slot(argv[1], lens[1]);
    if (f->s.moved) {
      char addr[32];
      kvt_fake_addr(f->next_addr++, addr, sizeof addr);
      put(b, "-MOVED %u %s:%d\r\n", slot, addr, f->port);
    } else if (f->moved_host[0]) {
      put(b, "-MOVED %u %s:%d\r\n", slot, f->moved_host, f->port);
    } else if (name[0] == 'G' && f->s.huge_bulk) {
      st->kind = S_TRICKLE;
      st->n = f->s.huge_bulk;
    } else if (name[0] == 'G' && f->s.long_error) {
      put(b, "-ERR ");
      put_fill(b, 'x', f->s.long_error > 5 ? (size_t)f->s.long_error - 5 : 0);
      put(b, "\r\n");
    } else if (name[0] == 'G') {
      kv *e = find(f, argv[1], lens[1]);
      if (e)
        put_bulk(b, e->v, e->vl);
      else
        put(b, "$-1\r\n");
    } else {
      kv *e = find(f, argv[1], lens[1]);
      if (!e && f->nkeys < KEYS_MAX) {
        e = &f->keys[f->nkeys++];
        e->k = malloc(lens[1]);
        memcpy(e->k, argv[1], lens[1]);
        e->kl = lens[1];
        e->v = NULL;
      }
      if (e) {
        free(e->v);
        e->v = malloc(lens[2] ? lens[2] : 1);
        memcpy(e->v, argv[2], lens[2]);
        e->vl = lens[2];
        put(b, "+OK\r\n");
      } else {
        put(b, "-OOM too many keys for the fake\r\n");
      }
    }
    if (f->s.unsolicited) put(b, "+OK\r\n");
  } else {
    put(b, "-ERR unknown command for the fake\r\n");
  }
  pthread_mutex_unlock(&f->mu);
}

/* ---- requests -------------------------------------------------------------- */

/* tag, a decimal number, CRLF at p[*i..n). 1 (*i past it), 0 incomplete,
 * -1 malformed. */
static int num(const char *p, size_t n, size_t *i, char tag, long *out) {
  size_t j = *i;
  if (j >= n) return 0;
  if (p[j++] != tag) return -1;
  long v = 0;
  size_t digits = 0;
  for (; j < n && p[j] >= '0' && p[j] <= '9'; j++, digits++) {
    if (digits > 9) return -1;
    v = v * 10 + (p[j] - '0');
  }
  if (j + 2 > n) return 0;
  if (!digits || p[j] != '\r' || p[j + 1] != '\n') return -1;
  *i = j + 2;
  *out = v;
  return 1;
}

/* One command "*N\r\n" then N "$L\r\n<L bytes>\r\n" at p[0..n): its length,
 * 0 if incomplete, -1 if malformed. */
static long parse(const char *p, size_t n, int *argc, const char **argv, size_t *lens) {
  size_t i = 0;
  long cnt, len;
  int r = num(p, n, &i, '*', &cnt);
  if (r <= 0) return r;
  if (cnt < 1 || cnt > ARGS_MAX) return -1;
  for (long a = 0; a < cnt; a++) {
    if ((r = num(p, n, &i, '$', &len)) <= 0) return r;
    if ((size_t)len > IN_MAX) return -1;
    if (i + (size_t)len + 2 > n) return 0;
    argv[a] = p + i;
    lens[a] = (size_t)len;
    i += (size_t)len + 2;
  }
  *argc = (int)cnt;
  return (long)i;
}

static int send_all(int fd, const char *p, size_t n) {
  for (size_t off = 0; off < n;) {
    ssize_t w = send(fd, p + off, n - off, MSG_NOSIGNAL);
    if (w <= 0) return -1;
    off += (size_t)w;
  }
  return 0;
}

static int stream_send(conn *cn, const char *p, size_t n) {
  if (send_all(cn->fd, p, n)) return -1;
  pthread_mutex_lock(&cn->f->mu);
  cn->f->streamed += n;
  pthread_mutex_unlock(&cn->f->mu);
  return 0;
}

/* Sends st's flood in 64 KiB chunks, made as they go. 0, or -1: the
 * connection went. */
static int stream_reply(conn *cn, const stream *st) {
  enum { CHUNK = 64 << 10, PER = 320, ROOM = 16 + 4 * PER };
  char *buf = malloc(CHUNK);
  if (!buf) return -1;
  int rc = 0;
  size_t len;
  if (st->kind == S_TRICKLE) {
    len = (size_t)snprintf(buf, CHUNK, "$%llu\r\n", st->n);
    rc = stream_send(cn, buf, len);
    memset(buf, 'x', 16 << 10);
    for (unsigned long long left = st->n; left && !rc;) {
      size_t k = left < (16 << 10) ? (size_t)left : (16 << 10);
      rc = stream_send(cn, buf, k);
      left -= k;
      nanosleep(&(struct timespec){0, 5000000L}, NULL);
    }
    if (!rc) rc = stream_send(cn, "\r\n", 2);
  } else {
    unsigned long long left = st->n;
    unsigned long long top = st->kind == S_NESTED ? (left + PER - 1) / PER : left;
    len = (size_t)snprintf(buf, CHUNK, "*%llu\r\n", top);
    while (!rc) {
      while (left && len + ROOM < CHUNK) {
        unsigned k = 1;
        if (st->kind == S_NESTED) {
          k = left < PER ? (unsigned)left : PER;
          len += (size_t)snprintf(buf + len, CHUNK - len, "*%u\r\n", k);
        }
        for (unsigned i = 0; i < k; i++, len += 4) memcpy(buf + len, ":1\r\n", 4);
        left -= k;
      }
      rc = stream_send(cn, buf, len);
      len = 0;
      if (!left) break;
    }
  }
  free(buf);
  return rc;
}

static void *conn_main(void *arg) {
  conn *cn = arg;
  char *in = malloc(IN_MAX);
  size_t have = 0;
  sbuf out = {0};
  while (in) {
    ssize_t got = recv(cn->fd, in + have, IN_MAX - have, 0);
    if (got <= 0) break;
    have += (size_t)got;
    long used = 0;
    int argc;
    const char *argv[ARGS_MAX];
    size_t lens[ARGS_MAX];
    out.len = 0;
    while (have && (used = parse(in, have, &argc, argv, lens)) > 0) {
      stream st = {S_NONE, 0};
      answer(cn->f, argc, argv, lens, &out, &st);
      memmove(in, in + used, have - (size_t)used);
      have -= (size_t)used;
      if (st.kind != S_NONE) { /* what came before it, then the flood */
        if (send_all(cn->fd, out.p, out.len) || stream_reply(cn, &st)) goto done;
        out.len = 0;
      }
    }
    if (have && (used < 0 || have == IN_MAX)) break;
    if (send_all(cn->fd, out.p, out.len)) goto done;
  }
done:
  free(out.p);
  free(in);
  return NULL;
}

static void *accept_main(void *arg) {
  kvt_fake *f = arg;
  for (;;) {
    int fd = accept(f->lfd, NULL, NULL);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return NULL; /* shut down */
    }
    pthread_mutex_lock(&f->mu);
    if (f->stopping || f->nconns == CONNS_MAX) {
      pthread_mutex_unlock(&f->mu);
      close(fd);
      continue;
    }
    conn *cn = &f->conns[f->nconns];
    cn->f = f;
    cn->fd = fd;
    if (pthread_create(&cn->th, NULL, conn_main, cn) == 0)
      f->nconns++;
    else
      close(fd);
    pthread_mutex_unlock(&f->mu);
  }
}

/* ---- the API --------------------------------------------------------------- */

int kvt_fake_start(kvt_fake **out) {
  kvt_fake *f = calloc(1, sizeof *f);
  if (!f) return -ENOMEM;
  pthread_mutex_init(&f->mu, NULL);
  f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  int rc = 0;
  if (f->lfd < 0 || bind(f->lfd, (struct sockaddr *)&a, sizeof a) || listen(f->lfd, 128) ||
      getsockname(f->lfd, (struct sockaddr *)&a, &al))
    rc = -errno;
  else if ((rc = -pthread_create(&f->acceptor, NULL, accept_main, f)) == 0) {
    f->port = ntohs(a.sin_port);
    *out = f;
    return 0;
  }
  if (f->lfd >= 0) close(f->lfd);
  free(f);
  return rc;
}

int kvt_fake_port(const kvt_fake *f) { return f->port; }

void kvt_fake_set(kvt_fake *f, const kvt_fake_script *s) {
  pthread_mutex_lock(&f->mu);
  f->s = *s;
  snprintf(f->slots_host, sizeof f->slots_host, "%s", s->slots_host ? s->slots_host : "");
  snprintf(f->moved_host, sizeof f->moved_host, "%s", s->moved_host ? s->moved_host : "");
  f->s.slots_host = f->s.moved_host = NULL;
  pthread_mutex_unlock(&f->mu);
}

unsigned long long kvt_fake_streamed(kvt_fake *f) {
  pthread_mutex_lock(&f->mu);
  unsigned long long n = f->streamed;
  pthread_mutex_unlock(&f->mu);
  return n;
}

unsigned long kvt_fake_count(kvt_fake *f, const char *cmd) {
  unsigned which = NNAMES;
  for (unsigned i = 0; i < NNAMES; i++)
    if (!strcasecmp(names[i], cmd)) which = i;
  pthread_mutex_lock(&f->mu);
  unsigned long n = f->count[which];
  pthread_mutex_unlock(&f->mu);
  return n;
}

void kvt_fake_stop(kvt_fake *f) {
  if (!f) return;
  pthread_mutex_lock(&f->mu);
  f->stopping = 1;
  pthread_mutex_unlock(&f->mu);
  shutdown(f->lfd, SHUT_RDWR); /* accept() returns */
  pthread_join(f->acceptor, NULL);
  for (unsigned i = 0; i < f->nconns; i++) {
    shutdown(f->conns[i].fd, SHUT_RDWR);
    pthread_join(f->conns[i].th, NULL);
    close(f->conns[i].fd);
  }
  close(f->lfd);
  for (unsigned i = 0; i < f->nkeys; i++) {
    free(f->keys[i].k);
    free(f->keys[i].v);
  }
  pthread_mutex_destroy(&f->mu);
  free(f);
}
