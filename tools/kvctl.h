/*
 * kvctl.h - what kvctl's files share: the parsed command line, the exit
 * statuses, and the helpers every command uses to report bad usage.
 *
 * kvctl.c holds main(), the option parser and the commands that speak the
 * worker protocol (lookup, put, get, status --worker); kvctl_ops.c the
 * commands that speak HTTP to the daemon's stats and admin sockets
 * (daemon/OPS.md); kvctl_cli.c the command-line helpers below (usage
 * errors, option checks, hex and byte counts), which both use and which
 * call neither; kvctl_http.c the HTTP client.
 */
#ifndef KVCTL_H
#define KVCTL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/paths.h"
#include "ipc/sock.h"
#include "proto/wire.h"

/* Exit statuses, for scripts (in the manner of LMDB's mdb_stat). */
#define EXIT_FAIL  1
#define EXIT_USAGE 2

/* Options; `seen` records which were given, so that an option a command
 * does not take is a usage error, not silently ignored. */
enum {
  O_SOCKET = 1 << 0,
  O_SOCKDIR = 1 << 1,
  O_TIMEOUT = 1 << 2,
  O_TENANT = 1 << 3,
  O_BLOCK = 1 << 4,
  O_DTYPE = 1 << 5,
  O_LAYOUT = 1 << 6,
  O_SALT = 1 << 7,
  O_STR = 1 << 8,
  O_JSON = 1 << 9,
  O_OUT = 1 << 10,
  O_PARENT = 1 << 11,
  O_FILE = 1 << 12,
  O_VALUE = 1 << 13,
  O_PRIO = 1 << 14,
  O_TIER = 1 << 15,
  O_NSHEX = 1 << 16,
  O_COUNT = 1 << 17,
  O_LIMIT = 1 << 18,
  O_INTERVAL = 1 << 19,
  O_WORKER = 1 << 20,
  O_LIVE = 1 << 21,
};
#define O_CONN (O_SOCKET | O_SOCKDIR | O_TIMEOUT)
#define O_NS   (O_TENANT | O_BLOCK | O_DTYPE | O_LAYOUT | O_SALT | O_STR)

typedef struct ctl {
  unsigned seen;
  char socket[KV_SOCK_PATH_MAX + 64];     /* the worker socket */
  char stats_sock[KV_SOCK_PATH_MAX + 64]; /* <socket dir>/kvcached-stats.sock */
  char admin_sock[KV_SOCK_PATH_MAX + 64]; /* <socket dir>/kvcached-admin.sock */
  int timeout_ms;
  const char *tenant, *dtype;
  uint32_t block_bytes;
  uint32_t tokens_per_block, layers, kv_heads, head_dim;
  uint32_t tp_rank, tp_size;
  uint8_t salt[KV_SALT_MAX];
  size_t salt_len;
  int str_keys, json, prio;
  const char *out, *parent, *file, *value;
  const char *tier;      /* --tier: "g2" or "g3" (validated) */
  const char *ns;        /* --ns: 8 to 64 hex digits (validated) */
  uint32_t count, limit; /* --count, --limit (0: not given) */
  double interval_s;     /* --interval (top) */
  int worker, live;      /* status --worker, health --live */
  int nargs;
  char **args;
} ctl;

/* The command-line helpers (kvctl_cli.c). */

/* Makes cmd's usage line (if it has one) the one bad_usage prints. */
void kvctl_set_usage(const char *cmd);

/* Prints "kvctl: <message>" and the current command's usage line;
 * returns EXIT_USAGE. */
__attribute__((format(printf, 1, 2))) int bad_usage(const char *fmt, ...);

/* Options c has that `allowed` lacks are a usage error (EXIT_USAGE, said
 * clearly); else 0. */
int kvctl_only(const ctl *c, const char *cmd, unsigned allowed);

/* Parses a hex digest (optional 0x) of 1..max bytes into out. Returns the
 * byte count, or -EINVAL. */
int kvctl_parse_hex(const char *s, uint8_t *out, size_t max);

/* "12.3 MiB" */
void kvctl_human_bytes(uint64_t v, char *out, size_t cap);

/* The operator commands (kvctl_ops.c). Each returns an exit status. */
int kvctl_status(ctl *c);
int kvctl_tiers(ctl *c);
int kvctl_top(ctl *c);
int kvctl_config(ctl *c);
int kvctl_evict(ctl *c);
int kvctl_flush(ctl *c);
int kvctl_pin(ctl *c);
int kvctl_unpin(ctl *c);
int kvctl_keys(ctl *c);
int kvctl_health(ctl *c);

#endif
