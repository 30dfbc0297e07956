/*
 * bench_presence.c - `kvbench presence`: what a lookup costs a worker, in
 * one run against one running kvcached: kvc_lookup answered from the
 * namespace's presence table (protocol 1.5) beside the same calls asked of
 * the daemon (LOOKUP round trips, KVC_LOOKUP_DAEMON), and, as the
 * reference, a Redis GET of one small value over a Unix socket (hiredis,
 * synchronous), when --redis names the socket.
 *
 * It stores a chain of 256 small blocks under keys private to the run,
 * then for chains of 1, 16 and 256 keys (all resident: the longest answer)
 * times single calls (clock_gettime around each: p50, p99 in ns) and
 * counts calls in a tight loop for --seconds on one thread (calls per
 * second, one core), then deletes its blocks. Prints a markdown table, or
 * JSON with --json.
 */
#include <errno.h>
#include <getopt.h>
#include <hiredis/hiredis.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "client/kvclient.h"
#include "tools/kvbench.h"

#define CHAIN 256

typedef struct row {
  const char *path;
  uint32_t keys;
  double p50, p99, per_s;
} row;

typedef int (*call_fn)(void *arg, uint32_t n);

typedef struct lk {
  kvc *c;
  kvc_key *keys;
} lk;

static int call_lookup(void *arg, uint32_t n) {
  lk *l = arg;
  int h = kvc_lookup(l->c, l->keys, n, NULL);
  return h == (int)n ? 0 : h < 0 ? h : -EIO;
}

static int call_redis(void *arg, uint32_t n) {
  (void)n;
  redisReply *r = redisCommand(arg, "GET kvbench-presence");
  int ok = r && r->type == REDIS_REPLY_STRING;
  if (r) freeReplyObject(r);
  return ok ? 0 : -EIO;
}

/* Times iters single calls, then calls for `seconds`. 0 or the call's error. */
static int measure(call_fn fn, void *arg, uint32_t n, uint32_t iters, double seconds, row *out) {
  uint64_t *ns = malloc(iters * sizeof *ns);
  if (!ns) return -ENOMEM;
  int rc = 0;
  for (uint32_t i = 0; i < iters / 10 && !rc; i++) rc = fn(arg, n); /* warm */
  for (uint32_t i = 0; i < iters && !rc; i++) {
    uint64_t t0 = kv_now_ns();
    rc = fn(arg, n);
    ns[i] = kv_now_ns() - t0;
  }
  if (!rc) {
    qsort(ns, iters, sizeof *ns, kvb_cmp_u64);
    out->p50 = (double)ns[iters / 2];
    out->p99 = (double)ns[(uint64_t)iters * 99 / 100];
    uint64_t calls = 0, t0 = kv_now_ns(), end = t0 + (uint64_t)(seconds * 1e9), t = t0;
    while (!rc && t < end) {
      for (int i = 0; i < 64 && !rc; i++) rc = fn(arg, n);
      calls += 64;
      t = kv_now_ns();
    }
    out->per_s = (double)calls / ((double)(t - t0) / 1e9);
  }
  free(ns);
  return rc;
}

static void usage(void) {
  fprintf(stderr,
          "usage: kvbench presence [--socket PATH] [--redis PATH] [--iters N] [--seconds S] "
          "[--json]\n"
          "  lookups of chains of 1, 16 and 256 resident keys: from the presence table, asked of\n"
          "  the daemon, and a Redis GET over --redis's Unix socket (the reference)\n");
}

int kvbench_presence(int argc, char **argv) {
  const char *sock = NULL, *redis = NULL;
  uint32_t iters = 20000;
  double secs = 1;
  int json = 0;
  static const struct option opts[] = {{"socket", 1, 0, 's'}, {"redis", 1, 0, 'r'},
                                       {"iters", 1, 0, 'i'},  {"seconds", 1, 0, 'S'},
                                       {"json", 0, 0, 'j'},   {"help", 0, 0, 'h'},
                                       {0, 0, 0, 0}};
  int o;
  optind = 1;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
    case 's': sock = optarg; break;
    case 'r': redis = optarg; break;
    case 'i': iters = (uint32_t)strtoul(optarg, NULL, 10); break;
    case 'S': secs = strtod(optarg, NULL); break;
    case 'j': json = 1; break;
    case 'h': usage(); return 0;
    default: usage(); return 2;
    }
  }
  if (iters < 100 || secs <= 0) {
    usage();
    return 2;
  }
  kvc *loc = NULL, *dmn = NULL;
  int rc = kvb_open(sock, "kvbench-presence", 4096, 16, &loc);
  if (!rc) rc = kvb_open(sock, "kvbench-presence", 4096, 16, &dmn);
  if (rc) {
    kvb_say_open_error("presence", sock, rc);
    kvc_close(loc);
    return 1;
  }
  kvc_lookup_info li;
  kvc_lookup_stats(loc, &li);
  if (!li.mapped) {
    fprintf(stderr, "kvbench presence: no presence table: %s\n", li.reason);
    kvc_close(loc);
    kvc_close(dmn);
    return 1;
  }
  kvc_set_lookup(dmn, KVC_LOOKUP_DAEMON);
  /* a chain private to this run */
  kvc_key keys[CHAIN], none = {0};
  uint64_t run = (uint64_t)getpid() << 32 ^ kv_now_ns();
  for (uint32_t i = 0; i < CHAIN; i++) {
    uint64_t v[2] = {run, i};
    keys[i] = (kvc_key){.len = 16};
    memcpy(keys[i].b, v, 16);
    kvc_block b;
    rc = kvc_alloc(loc, KVC_G2, 128, &keys[i], i ? &keys[i - 1] : &none, 1, &b);
    if (rc == 1) rc = kvc_commit(loc, &keys[i], 1, NULL) == 1 ? 0 : -EIO;
    else rc = rc < 0 ? rc : b.status;
    if (rc) {
      fprintf(stderr, "kvbench presence: storing the chain: %s\n", kvc_strerror(rc));
      goto out;
    }
  }
  row rows[8];
  int nrows = 0;
  static const uint32_t lens[] = {1, 16, 256};
  for (int li2 = 0; li2 < 3 && !rc; li2++) {
    lk a = {loc, keys}, b = {dmn, keys};
    row *r = &rows[nrows++];
    *r = (row){.path = "presence table", .keys = lens[li2]};
    rc = measure(call_lookup, &a, lens[li2], iters, secs, r);
    if (rc) break;
    r = &rows[nrows++];
    *r = (row){.path = "daemon LOOKUP", .keys = lens[li2]};
    rc = measure(call_lookup, &b, lens[li2], iters / 4, secs, r);
  }
  if (!rc && redis) {
    redisContext *rc2 = redisConnectUnix(redis);
    redisReply *s = rc2 && !rc2->err ? redisCommand(rc2, "SET kvbench-presence 1") : NULL;
    if (!s) {
      fprintf(stderr, "kvbench presence: redis at %s: %s\n", redis,
              rc2 ? rc2->errstr : "cannot connect");
      rc = -ECONNREFUSED;
    } else {
      freeReplyObject(s);
      row *r = &rows[nrows++];
      *r = (row){.path = "Redis GET (Unix socket)", .keys = 1};
      rc = measure(call_redis, rc2, 1, iters / 4, secs, r);
    }
    if (rc2) redisFree(rc2);
  }
  if (rc) {
    fprintf(stderr, "kvbench presence: %s\n", kvc_strerror(rc));
    goto out;
  }
  kvc_lookup_stats(loc, &li);
  if (li.daemon) { /* a local answer must never have fallen back */
    fprintf(stderr, "kvbench presence: %llu lookups of the table's client went to the daemon\n",
            (unsigned long long)li.daemon);
    rc = -EIO;
    goto out;
  }
  if (json) {
    json_t *a = json_array();
    for (int i = 0; i < nrows; i++)
      json_array_append_new(a, json_pack("{s:s,s:i,s:f,s:f,s:f}", "path", rows[i].path, "keys",
                                         (int)rows[i].keys, "p50_ns", rows[i].p50, "p99_ns",
                                         rows[i].p99, "calls_per_s", rows[i].per_s));
    char *s = json_dumps(a, JSON_COMPACT);
    printf("%s\n", s);
    free(s);
    json_decref(a);
  } else {
    printf("| lookup | keys | p50 | p99 | calls/s (one core) |\n|---|---:|---:|---:|---:|\n");
    for (int i = 0; i < nrows; i++)
      printf("| %s | %u | %.2f us | %.2f us | %.3g |\n", rows[i].path, rows[i].keys,
             rows[i].p50 / 1e3, rows[i].p99 / 1e3, rows[i].per_s);
  }
out:
  kvc_delete(loc, keys, CHAIN);
  kvc_close(loc);
  kvc_close(dmn);
  return rc ? 1 : 0;
}
