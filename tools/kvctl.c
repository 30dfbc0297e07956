/*
 * kvctl.c - the operator's tool for kvcached: main(), the command line,
 * and the commands that speak the worker protocol.
 *
 * Offline commands (version, policies, check-config) need no daemon. The
 * operator commands (status, tiers, top, config, keys, health, evict,
 * flush, pin, unpin; kvctl_ops.c) speak HTTP to the daemon's stats and
 * admin sockets (daemon/OPS.md). The rest talk over the worker socket:
 * `status --worker` asks for the daemon's STATUS (raw protocol, without a
 * HELLO, so it binds no tenant; a daemon that insists on a session is
 * asked through libkvclient instead), and `lookup`, `put` and `get` open a
 * libkvclient session in the namespace the command line describes (tenant
 * and layout), using the inline PUT/GET slow path for block bytes.
 *
 * Exit status, for scripts (in the manner of LMDB's mdb_stat): 0 success,
 * 1 the operation failed (daemon not running, key not found, block exists,
 * I/O error), 2 bad usage (unknown command or option, malformed key).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/hex.h"
#include "client/kvclient.h"
#include "daemon/config.h"
#include "ipc/reader.h"
#include "ipc/sock.h"
#include "proto/wire.h"
#include "tiers/evict.h"
#include "tools/kvctl.h"

#define DEFAULT_SOCKET KV_SOCKET_PATH
#define DEFAULT_BLOCK  4096u

static void usage(FILE *f) {
  fprintf(f, "usage: kvctl COMMAND [options] [args]\n"
             "       kvctl [options] COMMAND [args]   (options may come first, as in git)\n"
             "\n"
             "read-only commands (the stats socket, DIR/" KV_STATS_SOCKET_NAME "):\n"
             "  status [--json]         tiers, hit rate, misses by reason, sessions, latency\n"
             "                          (--json: the daemon's /stats as it is)\n"
             "  tiers [--json]          one line per tier: state, capacity, used, blocks,\n"
             "                          hits, evictions\n"
             "  top [--interval S] [--count N] [--json]\n"
             "                          a live view from successive /stats, every S seconds\n"
             "                          (default 1) until interrupted or for N frames: hit\n"
             "                          rate, requests/s, bytes/s per direction, occupancy\n"
             "  config get [NAME] [--json]\n"
             "                          the effective configuration, or one setting's value\n"
             "  keys [--limit N] [--tier g2|g3] [--ns HEX] [--json]\n"
             "                          a sample of the indexed blocks (N: 1 to 1000, default 20)\n"
             "  health [--live]         exit 0 healthy, 1 degraded or unreachable; --live:\n"
             "                          exit 0 whenever the daemon answers (a liveness probe)\n"
             "\n"
             "state-changing commands (the admin socket, DIR/" KV_ADMIN_SOCKET_NAME ";\n"
             "root, the daemon's user or a member of admin.group):\n"
             "  config set NAME VALUE   change a live setting (g2.capacity, g3.capacity,\n"
             "                          cache.policy, g3.admit, g3.min_prio, log.level)\n"
             "  evict --tier g2|g3 [--ns HEX] [--count N]\n"
             "                          evict up to N blocks (default: all that can go)\n"
             "                          through the policy; G2 victims may go to G3\n"
             "  flush [--tier g2|g3] [--ns HEX]\n"
             "                          drop every unpinned block in scope, no demotion\n"
             "  pin --ns HEX KEY...     pin blocks until unpinned (exit 1 if some are missing)\n"
             "  unpin --ns HEX KEY...   release them\n"
             "\n"
             "worker-protocol commands (DIR/" KV_SOCKET_NAME "):\n"
             "  status --worker [--json]\n"
             "                          the worker socket's STATUS: G2 arenas and tenants\n"
             "  lookup KEY...           resident prefix length of the keys, and each key's tier\n"
             "  put KEY (--file F | --value STRING) [--parent KEY] [--prio N]\n"
             "                          store one block (inline path); the data is padded\n"
             "                          with zeros to the block size\n"
             "  get KEY [--out F]       fetch one block's bytes (to stdout, or to F)\n"
             "\n"
             "offline commands:\n"
             "  policies                list the eviction policies this build has\n"
             "  check-config FILE [--no-machine]\n"
             "                          run kvcached's start-up checks on a configuration\n"
             "                          file, against this machine too (memory, RLIMIT_MEMLOCK,\n"
             "                          G3 filesystems, admin.group) unless --no-machine;\n"
             "                          exit 1 if kvcached would refuse it\n"
             "  version                 print kvctl's version\n"
             "\n"
             "connection:\n"
             "  -d, --socket-dir DIR    the daemon's socket directory (default: the directory\n"
             "                          of $KVCACHED_SOCKET, else " KV_SOCKET_DIR ")\n"
             "  -s, --socket PATH       the worker socket (default: $KVCACHED_SOCKET, else\n"
             "                          " DEFAULT_SOCKET "); the stats and admin sockets\n"
             "                          are looked for beside it\n"
             "      --timeout MS        wait at most MS milliseconds for a reply (default 10000)\n"
             "\n"
             "namespace (lookup, put, get): blocks are seen only by the same tenant and layout\n"
             "  -t, --tenant NAME       tenant (default \"kvctl\")\n"
             "  -b, --block-bytes N     block size, K/M suffixes allowed (default 4096;\n"
             "                          put: the data's size when it is larger)\n"
             "      --dtype NAME        dtype of the layout (default \"u8\")\n"
             "      --tokens-per-block N, --layers N, --kv-heads N, --head-dim N,\n"
             "      --tp-rank R, --tp-size S   the rest of the layout (1, 0, 0, 0, 0, 1)\n"
             "      --salt HEX          namespace salt (0 to 64 bytes, default none)\n"
             "\n"
             "keys:\n"
             "  KEY is a hex digest of 1 to 32 bytes (2 to 64 hex digits, optional 0x);\n"
             "      --str               take KEYs and --parent as literal strings (1 to 32 bytes)\n"
             "  --ns HEX is a namespace's digest as `kvctl keys` shows it (8 to 64 hex digits;\n"
             "  a prefix selects it)\n"
             "\n"
             "output:\n"
             "  -j, --json              JSON output\n"
             "  -o, --out F             get: write the block to F instead of stdout\n"
             "  -h, --help              this text\n"
             "\n"
             "exit status: 0 success, 1 the operation failed (daemon not running, key not\n"
             "found, refused, degraded, ...), 2 bad usage\n");
}

/* Parses an unsigned decimal in [lo, hi]. 0 or -EINVAL. */
static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out) {
  char *end;
  errno = 0;
  if (!s[0] || s[0] == '-') return -EINVAL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return -EINVAL;
  *out = (uint32_t)v;
  return 0;
}

/* One key from the command line, as hex or (--str) as literal text.
 * 0, or prints why not and returns EXIT_USAGE. */
static int parse_key(const ctl *c, const char *s, kvc_key *k) {
  memset(k, 0, sizeof *k);
  if (c->str_keys) {
    size_t n = strlen(s);
    if (n < 1 || n > KVC_KEY_MAX)
      return bad_usage("bad key '%s': a --str key has 1 to 32 bytes", s);
    memcpy(k->b, s, n);
    k->len = (uint8_t)n;
    return 0;
  }
  int n = kvctl_parse_hex(s, k->b, KVC_KEY_MAX);
  if (n < 1)
    return bad_usage("bad key '%s': not a hex digest of 1 to 32 bytes (--str takes text keys)", s);
  k->len = (uint8_t)n;
  return 0;
}

/* A key as the user gave it: text for --str keys, else lower-case hex. */
static void key_text(const ctl *c, const kvc_key *k, char *out, size_t cap) {
  if (c->str_keys) {
    snprintf(out, cap, "%.*s", (int)k->len, (const char *)k->b);
    return;
  }
  size_t at = 0;
  for (unsigned i = 0; i < k->len && at + 3 <= cap; i++)
    at += (size_t)snprintf(out + at, cap - at, "%02x", k->b[i]);
  if (!k->len && cap) out[0] = 0;
}

/* Every option of the daemon commands. An option may come before the
 * command as after it (kvctl --socket-dir DIR status): main() finds the
 * command with these tables, and parse_opts() reads the options wherever
 * they are; each command refuses those it does not take (kvctl_only). */
enum {
  L_VALUE = 256,
  L_STR,
  L_DTYPE,
  L_TPB,
  L_LAYERS,
  L_HEADS,
  L_HDIM,
  L_RANK,
  L_SIZE,
  L_SALT,
  L_PRIO,
  L_TIMEOUT,
  L_TIER,
  L_NSHEX,
  L_COUNT,
  L_LIMIT,
  L_INTERVAL,
  L_WORKER,
  L_LIVE
};
static const struct option long_opts[] = {{"socket", required_argument, 0, 's'},
                                          {"socket-dir", required_argument, 0, 'd'},
                                          {"timeout", required_argument, 0, L_TIMEOUT},
                                          {"tenant", required_argument, 0, 't'},
                                          {"block-bytes", required_argument, 0, 'b'},
                                          {"dtype", required_argument, 0, L_DTYPE},
                                          {"tokens-per-block", required_argument, 0, L_TPB},
                                          {"layers", required_argument, 0, L_LAYERS},
                                          {"kv-heads", required_argument, 0, L_HEADS},
                                          {"head-dim", required_argument, 0, L_HDIM},
                                          {"tp-rank", required_argument, 0, L_RANK},
                                          {"tp-size", required_argument, 0, L_SIZE},
                                          {"salt", required_argument, 0, L_SALT},
                                          {"str", no_argument, 0, L_STR},
                                          {"json", no_argument, 0, 'j'},
                                          {"out", required_argument, 0, 'o'},
                                          {"parent", required_argument, 0, 'p'},
                                          {"file", required_argument, 0, 'f'},
                                          {"value", required_argument, 0, L_VALUE},
                                          {"prio", required_argument, 0, L_PRIO},
                                          {"help", no_argument, 0, 'h'},
                                          {"tier", required_argument, 0, L_TIER},
                                          {"ns", required_argument, 0, L_NSHEX},
                                          {"count", required_argument, 0, L_COUNT},
                                          {"limit", required_argument, 0, L_LIMIT},
                                          {"interval", required_argument, 0, L_INTERVAL},
                                          {"worker", no_argument, 0, L_WORKER},
                                          {"live", no_argument, 0, L_LIVE},
                                          {0, 0, 0, 0}};
#define SHORT_OPTS ":s:d:t:b:jo:p:f:h"

/* Parses the options and operands of a daemon command (argv[0] is the
 * command). 0, or an exit status. */
static int parse_opts(ctl *c, int argc, char **argv) {
  const char *env = getenv("KVCACHED_SOCKET");
  snprintf(c->socket, sizeof c->socket, "%s", env && env[0] ? env : DEFAULT_SOCKET);
  c->timeout_ms = 10000;
  c->tenant = "kvctl";
  c->dtype = "u8";
  c->tokens_per_block = 1;
  c->tp_size = 1;
  c->prio = 128;
  c->interval_s = 1.0;
  const char *sockdir = NULL;
  opterr = 0;
  optind = 1;
  int ch;
  while ((ch = getopt_long(argc, argv, SHORT_OPTS, long_opts, NULL)) != -1) {
    uint32_t *u = NULL, lo_v = 0, hi_v = UINT32_MAX;
    unsigned bit = O_LAYOUT;
    switch (ch) {
    case 's':
      bit = O_SOCKET;
      snprintf(c->socket, sizeof c->socket, "%s", optarg);
      break;
    case 'd':
      bit = O_SOCKDIR;
      sockdir = optarg;
      snprintf(c->socket, sizeof c->socket, "%s/" KV_SOCKET_NAME, optarg);
      break;
    case L_TIMEOUT:
      bit = O_TIMEOUT;
      {
        uint32_t v;
        if (parse_u32(optarg, 1, INT32_MAX, &v)) return bad_usage("bad --timeout '%s'", optarg);
        c->timeout_ms = (int)v;
        break;
      }
    case 't':
      bit = O_TENANT;
      c->tenant = optarg;
      break;
    case 'b': {
      bit = O_BLOCK;
      uint64_t v;
      if (kv_parse_size(optarg, &v) || v == 0 || v > KV_INLINE_MAX)
        return bad_usage("bad --block-bytes '%s' (1 byte to 64M)", optarg);
      c->block_bytes = (uint32_t)v;
      break;
    }
    case L_DTYPE:
      bit = O_DTYPE;
      c->dtype = optarg;
      break;
    case L_TPB:
      u = &c->tokens_per_block;
      lo_v = 1;
      break;
    case L_LAYERS: u = &c->layers; break;
    case L_HEADS: u = &c->kv_heads; break;
    case L_HDIM: u = &c->head_dim; break;
    case L_RANK:
      u = &c->tp_rank;
      hi_v = UINT16_MAX;
      break;
    case L_SIZE:
      u = &c->tp_size;
      lo_v = 1;
      hi_v = UINT16_MAX;
      break;
    case L_SALT: {
      bit = O_SALT;
      int n = kvctl_parse_hex(optarg, c->salt, sizeof c->salt);
      if (n < 0) return bad_usage("bad --salt '%s': hex, 0 to 64 bytes", optarg);
      c->salt_len = (size_t)n;
      break;
    }
    case L_STR:
      bit = O_STR;
      c->str_keys = 1;
      break;
    case 'j':
      bit = O_JSON;
      c->json = 1;
      break;
    case 'o':
      bit = O_OUT;
      c->out = optarg;
      break;
    case 'p':
      bit = O_PARENT;
      c->parent = optarg;
      break;
    case 'f':
      bit = O_FILE;
      c->file = optarg;
      break;
    case L_VALUE:
      bit = O_VALUE;
      c->value = optarg;
      break;
    case L_PRIO: {
      bit = O_PRIO;
      uint32_t v;
      if (parse_u32(optarg, 0, 255, &v)) return bad_usage("bad --prio '%s' (0..255)", optarg);
      c->prio = (int)v;
      break;
    }
    case L_TIER:
      bit = O_TIER;
      if (strcmp(optarg, "g2") && strcmp(optarg, "g3"))
        return bad_usage("bad --tier '%s' (g2 or g3)", optarg);
      c->tier = optarg;
      break;
    case L_NSHEX: {
      bit = O_NSHEX;
      size_t n = strlen(optarg), k = 0;
      while (k < n && kv_hex_digit((unsigned char)optarg[k]) >= 0) k++;
      if (k != n || n < 8 || n > 64)
        return bad_usage("bad --ns '%s': a namespace digest of 8 to 64 hex digits", optarg);
      c->ns = optarg;
      break;
    }
    case L_COUNT:
      bit = O_COUNT;
      if (parse_u32(optarg, 1, UINT32_MAX, &c->count))
        return bad_usage("bad --count '%s' (1 or more)", optarg);
      break;
    case L_LIMIT:
      bit = O_LIMIT;
      if (parse_u32(optarg, 1, 1000, &c->limit))
        return bad_usage("bad --limit '%s' (1 to 1000)", optarg);
      break;
    case L_INTERVAL: {
      bit = O_INTERVAL;
      char *end;
      errno = 0;
      double v = strtod(optarg, &end);
      if (errno || end == optarg || *end || !isfinite(v) || v < 0.01 || v > 86400)
        return bad_usage("bad --interval '%s' (seconds, 0.01 to 86400)", optarg);
      c->interval_s = v;
      break;
    }
    case L_WORKER:
      bit = O_WORKER;
      c->worker = 1;
      break;
    case L_LIVE:
      bit = O_LIVE;
      c->live = 1;
      break;
    case 'h': usage(stdout); exit(0);
    case ':': return bad_usage("option '%s' needs a value", argv[optind - 1]);
    default: return bad_usage("unknown option '%s'", argv[optind - 1]);
    }
    if (u) {
      const char *name = argv[optind - 1];
      if (parse_u32(optarg, lo_v, hi_v, u)) return bad_usage("bad value for '%s'", name);
    }
    c->seen |= bit;
  }
  if ((c->seen & O_SOCKET) && (c->seen & O_SOCKDIR))
    return bad_usage("%s", "--socket and --socket-dir name the same thing: give one");
  /* The stats and admin sockets live beside the worker socket. */
  char dir[sizeof c->socket];
  if (sockdir) {
    snprintf(dir, sizeof dir, "%s", sockdir);
  } else {
    snprintf(dir, sizeof dir, "%s", c->socket);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == dir) dir[1] = 0;
    else *slash = 0;
  }
  const char *sep = dir[0] && dir[strlen(dir) - 1] == '/' ? "" : "/";
  if ((size_t)snprintf(c->stats_sock, sizeof c->stats_sock, "%s%s%s", dir, sep,
                       KV_STATS_SOCKET_NAME) >= sizeof c->stats_sock ||
      (size_t)snprintf(c->admin_sock, sizeof c->admin_sock, "%s%s%s", dir, sep,
                       KV_ADMIN_SOCKET_NAME) >= sizeof c->admin_sock)
    return bad_usage("socket directory '%s' is too long for the operator sockets' paths", dir);
  if (c->tp_rank >= c->tp_size) return bad_usage("%s", "--tp-rank must be below --tp-size");
  size_t tl = strlen(c->tenant), dl = strlen(c->dtype);
  if (tl < 1 || tl > KV_TENANT_MAX)
    return bad_usage("bad --tenant '%s' (1 to 64 bytes)", c->tenant);
  if (dl < 1 || dl > KV_DTYPE_MAX) return bad_usage("bad --dtype '%s' (1 to 16 bytes)", c->dtype);
  c->args = argv + optind;
  c->nargs = argc - optind;
  return 0;
}

/* A failed connection or HELLO, said clearly. Returns EXIT_FAIL. */
static int open_failed(const ctl *c, int rc) {
  if (rc == -ENOENT || rc == -ECONNREFUSED || rc == -ENOTDIR)
    fprintf(stderr, "kvctl: cannot reach kvcached at %s: %s (is the daemon running?)\n", c->socket,
            kvc_strerror(rc));
  else if (rc == -EACCES)
    fprintf(stderr, "kvctl: cannot connect to %s: %s (the socket's group may connect)\n", c->socket,
            kvc_strerror(rc));
  else if (rc == -ENAMETOOLONG)
    fprintf(stderr, "kvctl: cannot connect to %s: socket path too long\n", c->socket);
  else if (rc == -EPERM)
    fprintf(stderr,
            "kvctl: %s: tenant '%s' refused: it is not configured, or this user may not "
            "act as it (the daemon's [tenant.NAME] sections; its log says which)\n",
            c->socket, c->tenant);
  else if (rc == -EDQUOT)
    fprintf(stderr,
            "kvctl: %s: tenant '%s' has all the namespaces the daemon allows it "
            "(limits.namespaces_per_tenant)\n",
            c->socket, c->tenant);
  else fprintf(stderr, "kvctl: %s: session refused: %s\n", c->socket, kvc_strerror(rc));
  return EXIT_FAIL;
}

static int is_connect_error(int rc) {
  return rc == -ENOENT || rc == -ECONNREFUSED || rc == -ENOTDIR || rc == -EACCES || rc == -EPERM ||
         rc == -ENAMETOOLONG;
}

/* Opens a session in the command line's namespace with block size bb. */
static int open_session(const ctl *c, uint32_t bb, kvc **out) {
  kvc_opts o = {.socket_path = c->socket,
                .tenant = c->tenant,
                .salt = c->salt_len ? c->salt : NULL,
                .salt_len = c->salt_len,
                .layout = {.block_bytes = bb,
                           .tokens_per_block = c->tokens_per_block,
                           .layers = c->layers,
                           .kv_heads = c->kv_heads,
                           .head_dim = c->head_dim,
                           .tp_rank = (uint16_t)c->tp_rank,
                           .tp_size = (uint16_t)c->tp_size,
                           .dtype = c->dtype},
                .timeout_ms = c->timeout_ms};
  /* An operator's lookup asks the daemon, which counts and classifies it,
   * and makes the namespace no presence table (kvclient.h). */
  setenv("KVCACHED_LOOKUP", "daemon", 1);
  int rc = kvc_open(&o, out);
  return rc ? open_failed(c, rc) : 0;
}

/* --- status -------------------------------------------------------------------- */

/* STATUS without a HELLO: connect, ask, read one reply. 0 with *json set
 * (caller frees), or an error (KV_ENOSESSION: the daemon wants a HELLO). */
static int raw_status(const ctl *c, char **json) {
  int fd = kv_sock_connect(c->socket, 0);
  if (fd < 0) return fd;
  kv_buf b;
  kv_buf_init(&b);
  kv_reader rd;
  kv_reader_init(&rd, 0);
  kv_msg m;
  memset(&m, 0, sizeof m);
  m.op = KV_OP_STATUS;
  m.id = 1;
  int rc = kv_msg_encode(&b, &m);
  if (rc) goto out;
  struct iovec iov = {b.p, b.len};
  rc = kv_sock_send_frame(fd, &iov, 1, -1, c->timeout_ms);
  if (rc) goto out;
  kv_frame f;
  rc = kv_reader_recv(&rd, fd, &f, c->timeout_ms);
  if (rc == 0) rc = -ECONNRESET;
  if (rc < 0) goto out;
  if (f.fd >= 0) close(f.fd);
  kv_msg r;
  rc = kv_msg_decode(f.p, f.len, &r);
  if (rc) goto out;
  if (r.op == KV_OP_ERROR) {
    rc = r.status < 0 ? r.status : KV_EBADFRAME;
  } else if (r.op != KV_OP_STATUS || !(r.flags & KV_F_REPLY) || r.id != 1) {
    rc = KV_EBADFRAME;
  } else {
    char *s = malloc(r.status_text.len + 1);
    if (!s) {
      rc = -ENOMEM;
      goto out;
    }
    memcpy(s, r.status_text.p, r.status_text.len);
    s[r.status_text.len] = 0;
    *json = s;
  }
out:
  kv_reader_free(&rd);
  kv_buf_free(&b);
  close(fd);
  return rc;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

/* A scalar as table text; byte counts get a human size beside them. */
static void scalar_text(const char *name, json_t *v, char *out, size_t cap) {
  switch (json_typeof(v)) {
  case JSON_STRING: {
    const char *t = json_string_value(v);
    snprintf(out, cap, "%s", t[0] ? t : "-");
    break;
  }
  case JSON_INTEGER: {
    long long x = (long long)json_integer_value(v);
    if (ends_with(name, "_bytes") && x >= 1024) {
      char h[32];
      kvctl_human_bytes((uint64_t)x, h, sizeof h);
      snprintf(out, cap, "%lld (%s)", x, h);
    } else {
      snprintf(out, cap, "%lld", x);
    }
    break;
  }
  case JSON_REAL: snprintf(out, cap, "%g", json_real_value(v)); break;
  case JSON_TRUE: snprintf(out, cap, "yes"); break;
  case JSON_FALSE: snprintf(out, cap, "no"); break;
  case JSON_NULL: snprintf(out, cap, "-"); break;
  default:
    snprintf(out, cap, "(%zu entries)",
             json_is_array(v) ? json_array_size(v) : json_object_size(v));
  }
}

static int is_table(json_t *v) {
  return json_is_array(v) && json_array_size(v) > 0 && json_is_object(json_array_get(v, 0));
}

/* Every scalar of o as "path value" rows, depth first. */
static void print_rows(json_t *o, const char *prefix) {
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    char path[128], text[160];
    snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", k);
    if (json_is_object(v)) {
      print_rows(v, path);
    } else if (!is_table(v)) {
      scalar_text(k, v, text, sizeof text);
      printf("%-24s %s\n", path, text);
    }
  }
}

/* Arrays of objects (e.g. g2.tenants) as tables of their own: one column
 * per member of the first row, each as wide as its widest cell. */
#define MAX_COLS 16
static void print_tables(json_t *o, const char *prefix) {
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    char path[128], text[160];
    snprintf(path, sizeof path, "%s%s%s", prefix, prefix[0] ? "." : "", k);
    if (json_is_object(v)) {
      print_tables(v, path);
      continue;
    }
    if (!is_table(v)) continue;
    json_t *first = json_array_get(v, 0), *cv, *row;
    const char *cols[MAX_COLS], *col;
    int width[MAX_COLS], ncol = 0;
    json_object_foreach(first, col, cv) {
      if (ncol == MAX_COLS) break;
      cols[ncol] = col;
      width[ncol++] = (int)strlen(col);
    }
    size_t i;
    json_array_foreach(v, i, row) {
      for (int c = 0; c < ncol; c++) {
        json_t *x = json_object_get(row, cols[c]);
        if (x) scalar_text(cols[c], x, text, sizeof text);
        else snprintf(text, sizeof text, "-");
        if ((int)strlen(text) > width[c]) width[c] = (int)strlen(text);
      }
    }
    printf("\n%s:\n", path);
    for (int c = 0; c < ncol; c++) printf("  %-*s", width[c], cols[c]);
    printf("\n");
    json_array_foreach(v, i, row) {
      for (int c = 0; c < ncol; c++) {
        json_t *x = json_object_get(row, cols[c]);
        if (x) scalar_text(cols[c], x, text, sizeof text);
        else snprintf(text, sizeof text, "-");
        printf("  %-*s", width[c], text);
      }
      printf("\n");
    }
  }
}

static int cmd_status(ctl *c) {
  if (!c->worker) return kvctl_status(c);
  int rc = kvctl_only(c, "status --worker", O_CONN | O_JSON | O_NS | O_WORKER);
  if (rc) return rc;
  if (c->nargs) return bad_usage("status takes no arguments ('%s')", c->args[0]);
  char *text = NULL;
  rc = raw_status(c, &text);
  if (rc == KV_ENOSESSION) {
    /* This daemon answers STATUS only inside a session. */
    kvc *k;
    if ((rc = open_session(c, c->block_bytes ? c->block_bytes : DEFAULT_BLOCK, &k))) return rc;
    rc = kvc_status(k, &text);
    kvc_close(k);
  } else if (is_connect_error(rc)) {
    return open_failed(c, rc);
  }
  if (rc < 0) {
    fprintf(stderr, "kvctl: status from %s: %s\n", c->socket, kvc_strerror(rc));
    return EXIT_FAIL;
  }
  json_error_t jerr;
  json_t *o = json_loads(text, 0, &jerr);
  if (!json_is_object(o)) {
    fprintf(stderr, "kvctl: status from %s is not a JSON object: %s\n", c->socket, jerr.text);
    json_decref(o);
    free(text);
    return EXIT_FAIL;
  }
  if (c->json) {
    printf("%s\n", text);
  } else {
    printf("%-24s %s\n", "socket", c->socket);
    print_rows(o, "");
    print_tables(o, "");
  }
  json_decref(o);
  free(text);
  return 0;
}

/* --- lookup -------------------------------------------------------------------- */

static const char *tier_name(uint8_t t) {
  switch (t) {
  case KVC_G1: return "G1";
  case KVC_G2: return "G2";
  case KVC_G3: return "G3";
  case KVC_TIER_NONE: return "-";
  default: return "?";
  }
}

static int cmd_lookup(ctl *c) {
  int rc = kvctl_only(c, "lookup", O_CONN | O_NS | O_JSON);
  if (rc) return rc;
  if (c->nargs < 1) return bad_usage("%s", "lookup needs at least one KEY");
  if (c->nargs > KVC_BATCH_MAX) return bad_usage("%s", "lookup takes at most 4096 keys");
  uint32_t n = (uint32_t)c->nargs;
  kvc_key *keys = calloc(n, sizeof *keys);
  uint8_t *tiers = malloc(n);
  if (!keys || !tiers) {
    free(keys);
    free(tiers);
    fprintf(stderr, "kvctl: out of memory\n");
    return EXIT_FAIL;
  }
  for (uint32_t i = 0; i < n && !rc; i++) {
    rc = parse_key(c, c->args[i], &keys[i]);
    if (!rc && keys[i].len != keys[0].len)
      rc = bad_usage("key '%s' differs in length from the first: the keys of one lookup have "
                     "one length",
                     c->args[i]);
  }
  kvc *k = NULL;
  if (!rc) rc = open_session(c, c->block_bytes ? c->block_bytes : DEFAULT_BLOCK, &k);
  if (!rc) {
    int hit = kvc_lookup(k, keys, n, tiers);
    if (hit < 0) {
      fprintf(stderr, "kvctl: lookup: %s\n", kvc_strerror(hit));
      rc = EXIT_FAIL;
    } else if (c->json) {
      json_t *arr = json_array();
      for (uint32_t i = 0; i < n; i++) {
        char kt[80];
        key_text(c, &keys[i], kt, sizeof kt);
        json_array_append_new(arr, json_pack("{s:s,s:s}", "key", kt, "tier", tier_name(tiers[i])));
      }
      json_t *o = json_pack("{s:i,s:i,s:o}", "hit_len", hit, "n", (int)n, "keys", arr);
      char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
      if (s) printf("%s\n", s);
      free(s);
      json_decref(o);
    } else {
      printf("resident prefix: %d of %u\n", hit, n);
      printf("%-66s %s\n", "KEY", "TIER");
      for (uint32_t i = 0; i < n; i++) {
        char kt[80];
        key_text(c, &keys[i], kt, sizeof kt);
        printf("%-66s %s\n", kt, tier_name(tiers[i]));
      }
    }
  }
  kvc_close(k);
  free(keys);
  free(tiers);
  return rc;
}

/* --- put / get ----------------------------------------------------------------- */

/* Reads all of path into a new buffer. 0, or -errno. */
static int read_file(const char *path, uint8_t **out, size_t *len) {
  FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
  if (!f) return -errno;
  size_t cap = 65536, n = 0;
  uint8_t *p = malloc(cap);
  int rc = p ? 0 : -ENOMEM;
  while (!rc) {
    if (n == cap) {
      if (cap > KV_INLINE_MAX) {
        rc = -EFBIG;
        break;
      }
      uint8_t *q = realloc(p, cap * 2);
      if (!q) {
        rc = -ENOMEM;
        break;
      }
      p = q;
      cap *= 2;
    }
    size_t got = fread(p + n, 1, cap - n, f);
    n += got;
    if (got == 0) {
      if (ferror(f)) rc = -EIO;
      break;
    }
  }
  if (f != stdin) fclose(f);
  if (rc) {
    free(p);
    return rc;
  }
  *out = p;
  *len = n;
  return 0;
}

static int cmd_put(ctl *c) {
  int rc = kvctl_only(c, "put", O_CONN | O_NS | O_PARENT | O_FILE | O_VALUE | O_PRIO);
  if (rc) return rc;
  if (c->nargs != 1) return bad_usage("%s", "put takes exactly one KEY");
  if (!!c->file == !!c->value)
    return bad_usage("%s", "put needs one of --file F or --value STRING");
  kvc_key key, parent = {0};
  if ((rc = parse_key(c, c->args[0], &key))) return rc;
  if (c->parent && (rc = parse_key(c, c->parent, &parent))) return rc;
  uint8_t *data = NULL;
  size_t len = 0;
  if (c->file) {
    int e = read_file(c->file, &data, &len);
    if (e) {
      fprintf(stderr, "kvctl: %s: %s\n", c->file,
              e == -EFBIG ? "larger than 64 MiB" : strerror(-e));
      return EXIT_FAIL;
    }
  } else {
    len = strlen(c->value);
  }
  uint32_t bb = c->block_bytes;
  if (!bb) bb = len > DEFAULT_BLOCK ? (uint32_t)len : DEFAULT_BLOCK;
  if (len > bb || len > KV_INLINE_MAX) {
    fprintf(stderr, "kvctl: put: %zu bytes of data do not fit a block of %u bytes\n", len, bb);
    free(data);
    return EXIT_USAGE;
  }
  uint8_t *block = calloc(1, bb);
  if (!block) {
    free(data);
    fprintf(stderr, "kvctl: out of memory\n");
    return EXIT_FAIL;
  }
  memcpy(block, data ? (const void *)data : (const void *)c->value, len);
  free(data);
  kvc *k;
  rc = open_session(c, bb, &k);
  if (!rc) {
    int e = kvc_put(k, &key, c->parent ? &parent : NULL, (uint8_t)c->prio, block, bb);
    if (e) {
      fprintf(stderr, "kvctl: put %s: %s\n", c->args[0], kvc_strerror(e));
      rc = EXIT_FAIL;
    } else if (!(c->seen & O_BLOCK) && bb != DEFAULT_BLOCK) {
      fprintf(stderr,
              "kvctl: stored with block size %u: give --block-bytes %u to lookup or get it\n", bb,
              bb);
    }
    kvc_close(k);
  }
  free(block);
  return rc;
}

/* Writes all of p to fd. 0, or -errno. */
static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static int cmd_get(ctl *c) {
  int rc = kvctl_only(c, "get", O_CONN | O_NS | O_OUT);
  if (rc) return rc;
  if (c->nargs != 1) return bad_usage("%s", "get takes exactly one KEY");
  kvc_key key;
  if ((rc = parse_key(c, c->args[0], &key))) return rc;
  uint32_t bb = c->block_bytes ? c->block_bytes : DEFAULT_BLOCK;
  uint8_t *buf = malloc(bb);
  if (!buf) {
    fprintf(stderr, "kvctl: out of memory\n");
    return EXIT_FAIL;
  }
  kvc *k;
  if ((rc = open_session(c, bb, &k))) {
    free(buf);
    return rc;
  }
  int n = kvc_get(k, &key, buf, bb);
  kvc_close(k);
  if (n < 0) {
    fprintf(stderr, "kvctl: get %s: %s\n", c->args[0], kvc_strerror(n));
    free(buf);
    return EXIT_FAIL;
  }
  size_t len = (uint32_t)n < bb ? (uint32_t)n : bb;
  int fd = STDOUT_FILENO, e;
  if (c->out) {
    fd = open(c->out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      fprintf(stderr, "kvctl: %s: %s\n", c->out, strerror(errno));
      free(buf);
      return EXIT_FAIL;
    }
  }
  e = write_all(fd, buf, len);
  if (c->out && close(fd) && !e) e = -errno;
  if (e) {
    fprintf(stderr, "kvctl: %s: %s\n", c->out ? c->out : "stdout", strerror(-e));
    rc = EXIT_FAIL;
  } else if (c->out) {
    printf("%s: %zu bytes written to %s\n", c->args[0], len, c->out);
  }
  free(buf);
  return rc;
}

/* --- offline commands -------------------------------------------------------------- */

typedef struct check_ctx {
  const char *file;
  int errors, warnings;
} check_ctx;

/* One finding, in the words the daemon logs it with. */
static void print_finding(void *arg, kv_cfg_level level, const char *msg) {
  check_ctx *x = arg;
  if (level == KV_CFG_REFUSE) x->errors++;
  else x->warnings++;
  fprintf(stderr, "kvctl: %s: %s: %s\n", x->file, level == KV_CFG_REFUSE ? "error" : "warning",
          msg);
}

/* kvcached's own checks (kv_config_check), against this machine unless
 * --no-machine: exit 1 when kvcached would refuse to start with the file. */
static int cmd_check_config(int argc, char **argv) {
  const char *file = NULL;
  unsigned flags = KV_CFG_CHECK_MACHINE;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--no-machine")) flags &= ~KV_CFG_CHECK_MACHINE;
    else if (argv[i][0] == '-' && argv[i][1])
      return bad_usage("check-config does not take %s", argv[i]);
    else if (file) return bad_usage("%s", "check-config takes one FILE");
    else file = argv[i];
  }
  if (!file) return bad_usage("%s", "check-config takes one FILE");
  kv_config c;
  char err[256];
  kv_config_defaults(&c);
  if (kv_config_load(&c, file, err, sizeof err)) {
    fprintf(stderr, "kvctl: %s\n", err);
    return EXIT_FAIL;
  }
  check_ctx x = {file, 0, 0};
  if (kv_config_check(&c, flags, print_finding, &x)) {
    fprintf(stderr, "kvctl: %s: refused (%d error%s): kvcached would not start with it\n", file,
            x.errors, x.errors == 1 ? "" : "s");
    return EXIT_FAIL;
  }
  if (x.warnings)
    printf("%s: ok, with %d warning%s\n", file, x.warnings, x.warnings == 1 ? "" : "s");
  else printf("%s: ok\n", file);
  return 0;
}

/* 1 if option word a (as given: "--socket-dir", "-d", "-jd") takes the
 * next word as its value, by the tables getopt_long reads. */
static int takes_value(const char *a) {
  if (a[1] == '-') {
    if (strchr(a, '=')) return 0;
    const struct option *hit = NULL;
    int n = 0;
    size_t len = strlen(a + 2);
    for (const struct option *o = long_opts; o->name; o++) {
      if (strncmp(o->name, a + 2, len)) continue;
      if (strlen(o->name) == len) return o->has_arg == required_argument; /* exact */
      hit = o; /* an abbreviation, as getopt_long takes one that is unique */
      n++;
    }
    return n == 1 && hit->has_arg == required_argument;
  }
  for (const char *p = a + 1; *p; p++) {
    const char *o = *p != ':' ? strchr(SHORT_OPTS, *p) : NULL;
    if (!o) return 0;
    if (o[1] == ':') return p[1] == 0; /* else its value is the rest of the word */
  }
  return 0;
}

/* The index of the command word: the first that is neither an option nor
 * an option's value; 0 if there is none. */
static int command_index(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || !a[1]) return i;
    if (!strcmp(a, "--")) return 0;
    if (takes_value(a)) i++;
  }
  return 0;
}

int main(int argc, char **argv) {
  static const struct {
    const char *name;
    int (*fn)(ctl *);
  } daemon_cmds[] = {{"status", cmd_status},   {"lookup", cmd_lookup}, {"put", cmd_put},
                     {"get", cmd_get},         {"tiers", kvctl_tiers}, {"top", kvctl_top},
                     {"config", kvctl_config}, {"evict", kvctl_evict}, {"flush", kvctl_flush},
                     {"pin", kvctl_pin},       {"unpin", kvctl_unpin}, {"keys", kvctl_keys},
                     {"health", kvctl_health}};
  if (argc < 2) {
    usage(stderr);
    return EXIT_USAGE;
  }
  int k = command_index(argc, argv);
  if (k == 0) {
    for (int i = 1; i < argc; i++)
      if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
        usage(stdout);
        return 0;
      }
    fprintf(stderr, "kvctl: no command after the options\n");
    usage(stderr);
    return EXIT_USAGE;
  }
  if (k > 1) { /* options first: the command goes to the front, they follow it */
    char *word = argv[k];
    memmove(&argv[2], &argv[1], (size_t)(k - 1) * sizeof *argv);
    argv[1] = word;
  }
  const char *cmd = argv[1];
  kvctl_set_usage(cmd);
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  if (!strcmp(cmd, "version")) {
    printf("kvctl %s\n", KV_VERSION);
    return 0;
  }
  if (!strcmp(cmd, "policies")) {
    for (int i = 0; kv_evict_policies[i]; i++)
      printf("%-8s %s%s\n", kv_evict_policies[i]->name, kv_evict_policies[i]->summary,
             strcmp(kv_evict_policies[i]->name, kv_evict_default) ? "" : " [default]");
    return 0;
  }
  if (!strcmp(cmd, "check-config")) return cmd_check_config(argc - 1, argv + 1);
  for (size_t i = 0; i < sizeof daemon_cmds / sizeof daemon_cmds[0]; i++) {
    if (strcmp(cmd, daemon_cmds[i].name)) continue;
    ctl c;
    memset(&c, 0, sizeof c);
    int rc = parse_opts(&c, argc - 1, argv + 1);
    return rc ? rc : daemon_cmds[i].fn(&c);
  }
  fprintf(stderr, "kvctl: unknown command '%s'\n", cmd);
  usage(stderr);
  return EXIT_USAGE;
}
