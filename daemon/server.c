/* server.c - the worker socket (see server.h). */
#include "daemon/server.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "daemon/accept.h"
#include "ipc/reader.h"

#define MAX_OUT_FDS 4

struct kvd_conn {
  uv_poll_t poll;
  int fd;
  kvd_server *srv;
  kvd_session sess;
  kvd_sink *sink;
  kv_reader rd;
  kv_buf out;
  size_t out_acc; /* of out's bytes, those counted in the daemon's total (out_sync) */
  struct {
    size_t at;
    int fd[2];
    unsigned n;
  } ofd[MAX_OUT_FDS]; /* fds to send with byte `at` of out */
  unsigned nofd;
  int events;
  int closing;
  kv_peercred cred;
  uint64_t accepted_ms;   /* kv_now_ms() at accept: the HELLO deadline's start */
  kv_hdr refused;         /* the header check_header() refused */
  uint32_t refused_limit; /* and the limit it was over; 0: none refused */
  kvd_conn *next, **pprev;
};


static void on_conn(uv_poll_t *h, int status, int events);
static void conn_close(kvd_conn *c, const char *why);
static int conn_flush(kvd_conn *c);
static void set_events(kvd_conn *c);
static uint32_t worker_budget(kvd_server *s);

/* --- replies owed: every connection's, and the daemon's total --------------- */

/* Brings the daemon's total up to date with c->out. */
static void out_sync(kvd_conn *c) {
  kvd_stats *st = &c->srv->d->st;
  st->out_bytes += c->out.len;
  st->out_bytes -= c->out_acc;
  c->out_acc = c->out.len;
}

/* The open connection that owes the most bytes; NULL when none owes any. */
static kvd_conn *out_largest(kvd_server *s) {
  kvd_conn *m = NULL;
  for (kvd_conn *c = s->conns; c; c = c->next)
    if (!c->closing && c->out.len && (!m || c->out.len > m->out.len)) m = c;
  return m;
}

/* While the replies every connection owes add up to more than
 * limits.out_bytes, closes the connection that owes the most: it is the
 * one not reading. Counted; logged at most once a second with a count. */
static void out_enforce(kvd_server *s) {
  kvd *d = s->d;
  while (d->st.out_bytes > d->st.out_limit) {
    kvd_conn *v = out_largest(s);
    if (!v) return;
    d->st.out_closed++;
    uint64_t quiet;
    if (kvd_ratelog_due(&s->out_log, &quiet))
      kv_warn("server",
              "session %llu (pid %d uid %d) owes %zu bytes of replies, the most of any connection, "
              "while all connections owe %llu bytes, over limits.out_bytes (%llu): closing it "
              "(%llu more closed since the last such line)",
              (unsigned long long)v->sess.id, (int)v->cred.pid, (int)v->cred.uid, v->out.len,
              (unsigned long long)d->st.out_bytes, (unsigned long long)d->st.out_limit,
              (unsigned long long)quiet);
    conn_close(v, "owes the most replies over limits.out_bytes");
  }
}

/* A deferred reply: queue it behind what is waiting and send what we can. */
static void sink_deliver(kvd_sink *s, const kv_buf *frame) {
  kvd_conn *c = s->conn;
  if (!c || c->closing) return;
  if (kv_buf_append(&c->out, frame->p, frame->len)) {
    conn_close(c, "out of memory for a reply");
    return;
  }
  out_sync(c);
  if (conn_flush(c) < 0) {
    conn_close(c, "peer gone while sending");
    return;
  }
  out_enforce(c->srv);
  if (!c->closing) set_events(c);
}

static void conn_free_cb(uv_handle_t *h) {
  kvd_conn *c = h->data;
  kv_reader_free(&c->rd);
  kv_buf_free(&c->out);
  close(c->fd);
  free(c);
}

/* Releases the session at once; the memory goes in the close callback. */
static void conn_close(kvd_conn *c, const char *why) {
  if (c->closing) return;
  c->closing = 1;
  c->sink->conn = NULL;
  c->sink->sess = NULL;
  kvd_sink_put(c->sink);
  kvd *d = c->srv->d;
  d->st.out_bytes -= c->out_acc; /* never sent now: the buffer goes with the connection */
  c->out_acc = 0;
  uint64_t pins = 0, allocs = 0;
  kvd_session_close(d->core, &c->sess, &pins, &allocs);
  kvd_registry_release(&d->reg, c->sess.ns); /* freed if nothing of it is left */
  d->st.pins_released_on_close += pins;
  d->st.allocs_aborted_on_close += allocs;
  d->st.sessions_closed++;
  d->nsessions--;
  c->srv->nconns--;
  uint32_t *per = u32map_get(&c->srv->per_uid, (uint32_t)c->cred.uid);
  if (per && --*per == 0) u32map_del(&c->srv->per_uid, (uint32_t)c->cred.uid);
  if (pins || allocs)
    kv_info("server",
            "session %llu (pid %d) closed (%s): released %llu pins, aborted %llu allocations",
            (unsigned long long)c->sess.id, (int)c->cred.pid, why, (unsigned long long)pins,
            (unsigned long long)allocs);
  else
    kv_debug("server", "session %llu (pid %d) closed (%s)", (unsigned long long)c->sess.id,
             (int)c->cred.pid, why);
  *c->pprev = c->next;
  if (c->next) c->next->pprev = c->pprev;
  uv_poll_stop(&c->poll);
  uv_close((uv_handle_t *)&c->poll, conn_free_cb);
}

static void set_events(kvd_conn *c) {
  int ev = 0;
  if (c->out.len < KVD_OUT_MAX) ev |= UV_READABLE;
  if (c->out.len) ev |= UV_WRITABLE;
  if (ev != c->events) {
    c->events = ev;
    uv_poll_start(&c->poll, ev | UV_DISCONNECT, on_conn);
  }
}

/* Sends what it can without blocking. 0, or -errno: the connection is dead. */
static int conn_flush(kvd_conn *c) {
  while (c->out.len) {
    size_t n = c->out.len;
    int with_fds = c->nofd && c->ofd[0].at == 0;
    if (!with_fds && c->nofd && c->ofd[0].at < n) n = c->ofd[0].at; /* stop before the fd's frame */
    struct iovec iov = {c->out.p, n};
    ssize_t w = kv_sock_sendmsg_fds(c->fd, &iov, 1, with_fds ? c->ofd[0].fd : NULL,
                                    with_fds ? c->ofd[0].n : 0, 1);
    if (w == -EAGAIN) return 0;
    if (w < 0) return (int)w;
    if (with_fds) { memmove(c->ofd, c->ofd + 1, (--c->nofd) * sizeof c->ofd[0]); }
    for (unsigned i = 0; i < c->nofd; i++) c->ofd[i].at -= (size_t)w;
    kv_buf_consume(&c->out, (size_t)w);
    out_sync(c);
    c->srv->d->st.frames_out++;
  }
  return 0;
}

static void handle_frame(kvd_conn *c, const kv_frame *f) {
  kvd *d = c->srv->d;
  kv_msg m;
  d->st.frames_in++;
  if (f->fd >= 0) close(f->fd); /* workers send the daemon no descriptors */
  if (f->fd2 >= 0) close(f->fd2);
  size_t before = c->out.len;
  int rc = kv_msg_decode(f->p, f->len, &m);
  int out_fd[2] = {-1, -1};
  if (rc) {
    d->st.bad_frames++;
    rc = kv_msg_encode_error(&c->out, f->hdr.id, f->hdr.op, rc, kv_strerror(rc));
  } else {
    rc = kvd_handle(d, c->sink, &m, &c->out, out_fd);
  }
  out_sync(c);
  if (rc == KVD_DEFERRED) return;
  if (rc) {
    kv_warn("server", "session %llu: cannot encode a reply to %s: %s",
            (unsigned long long)c->sess.id, kv_op_name(f->hdr.op) ? kv_op_name(f->hdr.op) : "?",
            kv_strerror(rc));
    conn_close(c, "reply failed");
    return;
  }
  if (out_fd[0] >= 0 && c->nofd < MAX_OUT_FDS) {
    c->ofd[c->nofd].at = before;
    c->ofd[c->nofd].fd[0] = out_fd[0];
    c->ofd[c->nofd].fd[1] = out_fd[1];
    c->ofd[c->nofd].n = out_fd[1] >= 0 ? 2 : 1;
    c->nofd++;
  }
}

/* The largest payload the daemon takes in a request of opcode op on c,
 * judged from the header, before any payload is buffered: before HELLO, a
 * HELLO's; after it, what the opcode's layout allows, and for PUT the
 * session's block and its keys. An unknown opcode gets the control limit,
 * so that it can be skipped with KV_EBADOP. */
static uint32_t frame_limit(kvd_conn *c, uint16_t op) {
  if (c->sess.ns < 0) return kv_req_payload_max(KV_OP_HELLO);
  if (op == KV_OP_PUT) {
    uint64_t m =
        KV_PUT_OVERHEAD + (uint64_t)kvd_registry_ns(&c->srv->d->reg, c->sess.ns)->block_bytes;
    return m < KV_PAYLOAD_MAX_DATA ? (uint32_t)m : KV_PAYLOAD_MAX_DATA;
  }
  uint32_t m = kv_req_payload_max(op);
  return m ? m : KV_PAYLOAD_MAX_CTRL;
}

/* The reader's header check (kv_reader_set_check). */
static int check_header(void *arg, const kv_hdr *h) {
  kvd_conn *c = arg;
  uint32_t lim = frame_limit(c, h->op);
  if (h->len <= lim) return 0;
  c->refused = *h;
  c->refused_limit = lim;
  return -EMSGSIZE;
}

/* The ERROR that answers a stream error r, and the log line. */
static void refuse_stream(kvd_conn *c, int r) {
  kvd *d = c->srv->d;
  char why[192];
  const char *msg = kv_strerror(r);
  uint64_t id = 0;
  uint16_t op = 0;
  d->st.bad_frames++;
  if (r == -EMSGSIZE && c->refused_limit) {
    d->st.frames_over_limit++;
    id = c->refused.id;
    op = c->refused.op;
    const char *name = kv_op_name(op);
    char opbuf[24];
    if (!name) snprintf(opbuf, sizeof opbuf, "opcode %u", (unsigned)op), name = opbuf;
    snprintf(why, sizeof why, "%s of %u bytes is over this connection's limit of %u bytes%s", name,
             (unsigned)c->refused.len, (unsigned)c->refused_limit,
             c->sess.ns < 0 ? " (no HELLO yet)" : "");
    msg = why;
    kv_warn("server", "session %llu (pid %d uid %d): %s: closing", (unsigned long long)c->sess.id,
            (int)c->cred.pid, (int)c->cred.uid, why);
  }
  kv_buf tmp;
  kv_buf_init(&tmp);
  if (kv_msg_encode_error(&tmp, id, op, r, msg) == 0) {
    struct iovec iov = {tmp.p, tmp.len};
    kv_sock_send_frame(c->fd, &iov, 1, -1, 100);
  }
  kv_buf_free(&tmp);
}

static void conn_read(kvd_conn *c) {
  for (;;) {
    kv_frame f;
    int r;
    while ((r = kv_reader_next(&c->rd, &f)) == 1) {
      handle_frame(c, &f);
      if (!c->closing) out_enforce(c->srv);
      if (c->closing) return;
      if (c->out.len >= KVD_OUT_MAX) return; /* back-pressure: drain first */
    }
    if (r < 0) {
      /* The stream cannot be resynchronised: say why, once, and close. */
      refuse_stream(c, r);
      conn_close(c, kv_strerror(r));
      return;
    }
    ssize_t n = kv_reader_fill(&c->rd, c->fd, 1);
    if (n == -EAGAIN) return;
    if (n == 0) {
      conn_close(c, "end of stream");
      return;
    }
    if (n < 0) {
      if (n == -ECONNRESET) conn_close(c, "connection reset");
      else conn_close(c, kv_strerror((int)n));
      return;
    }
  }
}

static void on_conn(uv_poll_t *h, int status, int events) {
  kvd_conn *c = h->data;
  if (c->closing) return;
  if (status < 0) {
    conn_close(c, uv_strerror(status));
    return;
  }
  if (events & UV_READABLE) conn_read(c);
  if (c->closing) return;
  if (conn_flush(c) < 0) {
    conn_close(c, "peer gone while sending");
    return;
  }
  if (events & UV_DISCONNECT && !(events & UV_READABLE)) {
    conn_close(c, "hang-up");
    return;
  }
  /* Reading may have stopped for back-pressure with frames still buffered. */
  if (c->out.len < KVD_OUT_MAX && kv_reader_pending(&c->rd)) conn_read(c);
  if (!c->closing) set_events(c);
}

/* One ERROR frame to a connection about to be closed unserved; it never
 * waits (the socket is new: its buffer is empty). */
static void send_refusal(int fd, int status, const char *msg) {
  kv_buf b;
  kv_buf_init(&b);
  if (kv_msg_encode_error(&b, 0, 0, status, msg) == 0) {
    struct iovec iov = {b.p, b.len};
    kv_sock_sendmsg(fd, &iov, 1, -1, 1);
  }
  kv_buf_free(&b);
}

/* kvd_accept()'s refusal at the descriptor limit: nothing may allocate an
 * fd here (not even a log line to the journal). */
static void refuse_fd_limit(void *arg, int fd) {
  (void)arg;
  send_refusal(fd, -EAGAIN, "kvcached is out of file descriptors: try again later");
}

static void refuse(kvd_server *s, int fd, kvd_refused why, const kv_peercred *cred,
                   const char *msg) {
  send_refusal(fd, -EAGAIN, msg);
  close(fd);
  s->d->st.conns_refused[why]++;
  kv_warn("server", "refused a worker connection from pid %d uid %d (%s): %s", (int)cred->pid,
          (int)cred->uid, kvd_refused_names[why], msg);
}

/* Stops polling the listener until the next sweep, so that an accept
 * error that does not clear cannot make the loop spin. */
static void pause_listener(kvd_server *s, int err) {
  kv_warn("server", "accept: %s: not accepting for a second", kv_strerror(err));
  if (s->paused || !s->listening) return;
  s->paused = 1;
  uv_poll_stop(&s->lpoll);
}

static void on_accept(uv_poll_t *h, int status, int events) {
  kvd_server *s = h->data;
  kvd *d = s->d;
  for (;;) {
    int shed;
    int fd = kvd_accept(s->lst.fd, NULL, refuse_fd_limit, s, &shed);
    if (fd == -EAGAIN) return;
    if (shed) {
      d->st.conns_refused[KVD_REFUSED_FD_LIMIT]++;
      kv_warn("server", "out of file descriptors (%s): refused a worker connection",
              kv_strerror(fd));
      continue;
    }
    if (fd < 0) {
      pause_listener(s, fd);
      return;
    }
    kv_peercred cred = {0};
    int crc = kv_sock_peercred(fd, &cred);
    char msg[160];
    if (crc || cred.uid == (uid_t)-1) {
      snprintf(msg, sizeof msg, "cannot read the peer's credentials: %s",
               crc ? kv_strerror(crc) : "no uid");
      refuse(s, fd, KVD_REFUSED_NO_CREDENTIALS, &cred, msg);
      continue;
    }
    if (s->nconns >= s->max_conns) {
      int by_fds = s->max_conns < d->cfg.limits_connections;
      snprintf(msg, sizeof msg, "too many worker connections: %u open (%s)", s->nconns,
               by_fds ? "all that RLIMIT_NOFILE leaves room for" : "limits.connections");
      refuse(s, fd, by_fds ? KVD_REFUSED_FD_LIMIT : KVD_REFUSED_TOTAL, &cred, msg);
      continue;
    }
    uint32_t *per = u32map_get(&s->per_uid, (uint32_t)cred.uid);
    if (per && *per >= d->cfg.limits_connections_per_uid) {
      snprintf(msg, sizeof msg,
               "too many worker connections from uid %u: %u open "
               "(limits.connections_per_uid)",
               (unsigned)cred.uid, *per);
      refuse(s, fd, KVD_REFUSED_PER_UID, &cred, msg);
      continue;
    }
    kvd_conn *c = calloc(1, sizeof *c);
    kvd_sink *sink = calloc(1, sizeof *sink);
    if (!c || !sink || u32map_add(&s->per_uid, (uint32_t)cred.uid, 1)) {
      free(c);
      free(sink);
      kv_warn("server", "out of memory: refusing a connection");
      close(fd);
      continue;
    }
    c->fd = fd;
    c->srv = s;
    c->sink = sink;
    c->cred = cred;
    c->accepted_ms = (uint64_t)kv_now_ms();
    sink->deliver = sink_deliver;
    sink->conn = c;
    sink->sess = &c->sess;
    sink->refs = 1;
    kvd_session_init(&c->sess, s->d->next_session_id++);
    c->sess.peer_uid = (uint32_t)cred.uid;
    c->sess.peer_gid = (uint32_t)cred.gid;
    c->sess.peer_pid = (int32_t)cred.pid;
    c->sess.peer_fd = fd;
    kv_reader_init(&c->rd, 0);
    kv_reader_set_check(&c->rd, check_header, c);
    kv_buf_init(&c->out);
    uv_poll_init(s->loop, &c->poll, fd);
    c->poll.data = c;
    c->next = s->conns;
    c->pprev = &s->conns;
    if (s->conns) s->conns->pprev = &c->next;
    s->conns = c;
    s->nconns++;
    s->d->nsessions++;
    s->d->st.sessions_opened++;
    set_events(c);
    kv_debug("server", "session %llu: pid %d uid %d connected", (unsigned long long)c->sess.id,
             (int)c->cred.pid, (int)c->cred.uid);
  }
}

/* Closes connections that have no session limits.hello_timeout_ms after
 * their accept, and resumes a paused listener. */
static void on_sweep(uv_timer_t *t) {
  kvd_server *s = t->data;
  kvd *d = s->d;
  if (s->paused && s->listening) {
    s->paused = 0;
    uv_poll_start(&s->lpoll, UV_READABLE, on_accept);
  }
  kvd_conn *big = out_largest(s);
  d->st.out_max_conn = big ? big->out.len : 0;
  /* The descriptor limit may have changed under the daemon (prlimit):
   * once a second, the worker budget follows it, and the operator pool is
   * filled from descriptors that came back. */
  if (kv_now_ms() - s->budget_ms >= 1000) {
    s->budget_ms = kv_now_ms();
    kvd_fd_ops_refill();
    s->max_conns = worker_budget(s);
    d->st.conns_max = s->max_conns;
  }
  uint32_t limit = d->cfg.limits_hello_timeout_ms;
  if (!limit) return;
  uint64_t now = (uint64_t)kv_now_ms();
  for (kvd_conn *c = s->conns, *next; c; c = next) {
    next = c->next;
    if (c->closing || c->sess.ns >= 0 || now - c->accepted_ms < limit) continue;
    char msg[96];
    snprintf(msg, sizeof msg, "no HELLO within limits.hello_timeout_ms (%u ms)", (unsigned)limit);
    send_refusal(c->fd, -ETIMEDOUT, msg);
    d->st.hello_timeouts++;
    kv_warn("server", "session %llu (pid %d uid %d): %s: closing", (unsigned long long)c->sess.id,
            (int)c->cred.pid, (int)c->cred.uid, msg);
    conn_close(c, "no HELLO in time");
  }
}

/* The worker connections the descriptor limit leaves room for, beside the
 * operator sockets' connections and KVD_FD_SPARE: the descriptors open now
 * but the worker connections' own. 0 when none. Logged when it changes and
 * is under limits.connections. */
static uint32_t worker_budget(kvd_server *s) {
  kvd *d = s->d;
  uint32_t want = d->cfg.limits_connections;
  uint64_t ops = (uint64_t)d->cfg.stats_connections + d->cfg.admin_connections + 3 +
                 (d->cfg.stats_listen[0] ? d->cfg.stats_tcp_connections : 0);
  int open_now = kvd_fds_open();
  uint64_t mine = open_now > 0 && (uint64_t)open_now > s->nconns ? (uint64_t)open_now - s->nconns
                                                                  : 64;
  uint64_t others = mine + ops + KVD_FD_SPARE;
  int64_t b = kvd_fd_budget(others, want);
  if (b < 0) {
    if (s->max_conns != want)
      kv_warn("server", "cannot read RLIMIT_NOFILE (%s): allowing limits.connections (%u)",
              kv_strerror((int)b), want);
    return want;
  }
  if (b < want && (uint32_t)b != s->max_conns)
    kv_log(b ? KV_LOG_WARN : KV_LOG_ERROR, "server",
           "RLIMIT_NOFILE leaves room for %lld worker connections (limits.connections = %u) beside "
           "%llu descriptors for the daemon and its operator sockets: raise it (LimitNOFILE=) "
           "to serve more",
           (long long)b, want, (unsigned long long)others);
  else if (b == want && s->max_conns && s->max_conns < want)
    kv_info("server", "RLIMIT_NOFILE leaves room for limits.connections (%u) again", want);
  return (uint32_t)b;
}

/* limits.out_bytes, or its default: 1/32 of the memory, 64 MiB to 2 GiB. */
static uint64_t out_limit(const kv_config *cfg) {
  if (cfg->limits_out_bytes) return cfg->limits_out_bytes;
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  uint64_t mem = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
  uint64_t l = mem / 32, lo = (uint64_t)64 << 20, hi = (uint64_t)2 << 30;
  return l < lo ? lo : l > hi ? hi : l;
}

int kvd_server_start(kvd_server *s, kvd *d, uv_loop_t *loop) {
  memset(s, 0, sizeof *s);
  s->d = d;
  s->loop = loop;
  d->st.out_limit = out_limit(&d->cfg);
  int rc = kvd_fd_reserve_init();
  if (rc)
    kv_warn("server", "no reserve descriptor (%s): at the fd limit the listener pauses",
            kv_strerror(rc));
  s->max_conns = worker_budget(s);
  d->st.conns_max = s->max_conns;
  s->budget_ms = kv_now_ms();
  if (!s->max_conns) return -EMFILE;
  kv_listen_opts lo = {.flags = KV_SOCK_NONBLOCK};
  rc = kv_listen(&s->lst, d->cfg.socket_dir, KV_SOCKET_NAME, &lo);
  if (rc) {
    kv_error("server", "cannot listen on %s/%s: %s", d->cfg.socket_dir, KV_SOCKET_NAME,
             rc == -EADDRINUSE ? "another kvcached is serving it" : kv_strerror(rc));
    return rc;
  }
  uv_poll_init(loop, &s->lpoll, s->lst.fd);
  s->lpoll.data = s;
  uv_poll_start(&s->lpoll, UV_READABLE, on_accept);
  s->listening = 1;
  uint32_t every = d->cfg.limits_hello_timeout_ms ? d->cfg.limits_hello_timeout_ms / 4 : 1000;
  every = every < 10 ? 10 : every > 1000 ? 1000 : every;
  uv_timer_init(loop, &s->sweep);
  s->sweep.data = s;
  uv_timer_start(&s->sweep, on_sweep, every, every);
  uv_unref((uv_handle_t *)&s->sweep);
  s->sweeping = 1;
  return 0;
}

void kvd_server_stop_listening(kvd_server *s) {
  if (s->sweeping) {
    s->sweeping = 0;
    uv_timer_stop(&s->sweep);
    uv_close((uv_handle_t *)&s->sweep, NULL);
  }
  if (!s->listening) return;
  s->listening = 0;
  uv_poll_stop(&s->lpoll);
  uv_close((uv_handle_t *)&s->lpoll, NULL);
  kv_listener_close(&s->lst);
}

void kvd_server_close_all(kvd_server *s, int timeout_ms) {
  while (s->conns) {
    kvd_conn *c = s->conns;
    if (c->out.len) {
      struct iovec iov = {c->out.p, c->out.len};
      int with_fds = c->nofd && c->ofd[0].at == 0;
      if (kv_sock_send_frame_fds(c->fd, &iov, 1, with_fds ? c->ofd[0].fd : NULL,
                                 with_fds ? c->ofd[0].n : 0, timeout_ms) == 0)
        kv_buf_reset(&c->out);
    }
    conn_close(c, "daemon stopping");
  }
  u32map_free(&s->per_uid);
}
