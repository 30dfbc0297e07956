/*
 * kvctl_ops.c - kvctl's operator commands, over the daemon's HTTP sockets
 * (the contract is daemon/OPS.md).
 *
 * Read-only commands (status, tiers, top, config get, keys, health) ask the
 * stats socket, which anyone who reaches the socket directory may use;
 * state-changing ones (config set, evict, flush, pin, unpin) ask the admin
 * socket, which the daemon opens to root, its own user and admin.group.
 *
 * Every command returns an exit status: 0 success, 1 the operation failed
 * (the daemon is not running, refused the request, answered an error, or
 * is degraded for `health`), 2 bad usage. A failure is one line on stderr
 * that names the socket or the request and why.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "tools/kvctl.h"
#include "tools/kvctl_http.h"

static const char *const tier_names[] = {"g1", "g2", "g3"};
static const char *const miss_reasons[] = {"absent",   "evicted", "corrupt",
                                           "io_error", "timeout", "not_shareable"};
static const char *const directions[] = {"g1_to_g2", "g2_to_g1", "g2_to_g3", "g3_to_g2"};
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* The admin socket's rule, said wherever a refusal is reported. */
#define ADMIN_RULE "the admin socket needs root, the daemon's user, or a member of admin.group"

/* --- one request ------------------------------------------------------------------ */

/* The error text of a JSON error body ({"error": ...}), else the body. */
static const char *error_text(json_t *o, const kvctl_http_resp *r) {
  const char *e = json_string_value(json_object_get(o, "error"));
  if (e) return e;
  return r->len ? r->body : "(no body)";
}

/*
 * Makes one request to the stats socket (admin = 0) or the admin socket
 * and parses its JSON body. A 2xx, or the status `also` (0: none), is a
 * success: 0 with *out (a JSON object the caller decrefs) and, when status
 * is not NULL, *status. Anything else is reported on stderr and EXIT_FAIL
 * returned: an unreachable daemon, a refusal (403), an error answer, a body
 * that is not a JSON object. With raw not NULL the body text is kept there
 * too (the caller frees it).
 */
static int call(const ctl *c, int admin, const char *method, const char *target, int also,
                int *status, json_t **out, char **raw) {
  const char *sock = admin ? c->admin_sock : c->stats_sock;
  kvctl_http_resp r = {0};
  int rc = kvctl_http(sock, method, target, c->timeout_ms, &r);
  if (rc) {
    if (rc == -ENOENT || rc == -ECONNREFUSED || rc == -ENOTDIR)
      fprintf(stderr, "kvctl: cannot reach kvcached at %s: %s (is the daemon running?)\n", sock,
              strerror(-rc));
    else if ((rc == -EACCES || rc == -EPERM) && admin)
      fprintf(stderr, "kvctl: cannot reach kvcached at %s: %s (" ADMIN_RULE ")\n", sock,
              strerror(-rc));
    else if (rc == -EACCES || rc == -EPERM)
      fprintf(stderr,
              "kvctl: cannot reach kvcached at %s: %s (the socket directory's group may "
              "enter it)\n",
              sock, strerror(-rc));
    else if (rc == -ETIMEDOUT)
      fprintf(stderr, "kvctl: %s %s: no answer from %s within %d ms\n", method, target, sock,
              c->timeout_ms);
    else if (rc == -EPROTO)
      fprintf(stderr, "kvctl: %s %s: %s did not answer in HTTP/1.1 (is it kvcached's?)\n", method,
              target, sock);
    else if (rc == -ENAMETOOLONG)
      fprintf(stderr, "kvctl: cannot reach kvcached at %s: socket path too long\n", sock);
    else fprintf(stderr, "kvctl: %s %s on %s: %s\n", method, target, sock, strerror(-rc));
    return EXIT_FAIL;
  }
  json_error_t jerr;
  json_t *o = json_loadb(r.body, r.len, 0, &jerr);
  int good = (r.status >= 200 && r.status < 300) || r.status == also;
  if (r.status == 403) {
    fprintf(stderr, "kvctl: %s %s refused by %s: %s (" ADMIN_RULE ")\n", method, target, sock,
            error_text(o, &r));
  } else if (r.status == 404 && !json_is_object(o)) {
    fprintf(stderr, "kvctl: %s %s: this kvcached does not serve it (404)\n", method, target);
  } else if (!good) {
    fprintf(stderr, "kvctl: %s %s: %s (HTTP %d)\n", method, target, error_text(o, &r), r.status);
  } else if (!json_is_object(o)) {
    fprintf(stderr, "kvctl: %s %s: the answer is not a JSON object: %s\n", method, target,
            o ? "another JSON value" : jerr.text);
  } else {
    if (status) *status = r.status;
    if (raw) {
      *raw = r.body;
      r.body = NULL;
    }
    kvctl_http_resp_free(&r);
    *out = o;
    return 0;
  }
  json_decref(o);
  kvctl_http_resp_free(&r);
  return EXIT_FAIL;
}

/* GET target on the stats socket: call() without the options. */
static int get_json(const ctl *c, const char *target, json_t **out, char **raw) {
  return call(c, 0, "GET", target, 0, NULL, out, raw);
}

/* Builds "path?k=v&k=v" from pairs (NULL values skipped), URL-encoding
 * the values. 0, or -ENAMETOOLONG. */
static int build_target(char *out, size_t cap, const char *path, const char *const *kv,
                        int npairs) {
  size_t at = (size_t)snprintf(out, cap, "%s", path);
  if (at >= cap) return -ENAMETOOLONG;
  char sepc = '?';
  for (int i = 0; i < npairs; i++) {
    const char *k = kv[2 * i], *v = kv[2 * i + 1];
    if (!v) continue;
    int n = snprintf(out + at, cap - at, "%c%s=", sepc, k);
    if (n < 0 || (size_t)n >= cap - at) return -ENAMETOOLONG;
    at += (size_t)n;
    if (kvctl_url_encode(out, cap, &at, v)) return -ENAMETOOLONG;
    sepc = '&';
  }
  return 0;
}

/* Prints a JSON value compactly on one line. */
static void print_json(json_t *o) {
  char *s = json_dumps(o, JSON_COMPACT | JSON_ENCODE_ANY);
  if (s) printf("%s\n", s);
  free(s);
}

/* A member as a number (integer or real); 0 when absent or not one. */
static double num(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  return json_is_number(v) ? json_number_value(v) : 0;
}

static uint64_t unum(json_t *o, const char *k) {
  double d = num(o, k);
  return d > 0 ? (uint64_t)d : 0;
}

/* The options check of a command that takes no operands: 0, or a usage
 * error. */
static int no_args(const ctl *c, const char *cmd, unsigned allowed) {
  int rc = kvctl_only(c, cmd, allowed);
  if (rc) return rc;
  if (c->nargs) return bad_usage("%s takes no arguments ('%s')", cmd, c->args[0]);
  return 0;
}

/* --- status and tiers ----------------------------------------------------------------- */

static void print_tier_table(json_t *tiers) {
  printf("%-4s %-8s %11s %11s %6s %10s %12s %10s\n", "TIER", "STATE", "CAPACITY", "USED", "USE%",
         "BLOCKS", "HITS", "EVICTIONS");
  for (size_t i = 0; i < NELEM(tier_names); i++) {
    json_t *t = json_object_get(tiers, tier_names[i]);
    const char *state = json_string_value(json_object_get(t, "state"));
    if (!json_is_object(t) || json_is_false(json_object_get(t, "enabled"))) {
      printf("%-4s %-8s %11s %11s %6s %10s %12s %10s\n", tier_names[i], state ? state : "off", "-",
             "-", "-", "-", "-", "-");
      continue;
    }
    char cap[32], used[32], pct[16];
    uint64_t capb = unum(t, "capacity_bytes"), usedb = unum(t, "used_bytes");
    kvctl_human_bytes(capb, cap, sizeof cap);
    kvctl_human_bytes(usedb, used, sizeof used);
    if (capb) snprintf(pct, sizeof pct, "%.1f", 100.0 * (double)usedb / (double)capb);
    else snprintf(pct, sizeof pct, "-");
    printf("%-4s %-8s %11s %11s %6s %10llu %12llu %10llu\n", tier_names[i], state ? state : "?",
           cap, used, pct, (unsigned long long)unum(t, "blocks"),
           (unsigned long long)unum(t, "hits"), (unsigned long long)unum(t, "evictions"));
  }
}

/* Hits over hits plus misses, in [0, 1]; -1 when there were none. */
static double hit_rate(double hits, double misses) {
  return hits + misses > 0 ? hits / (hits + misses) : -1;
}

static double sum_members(json_t *o, const char *const *names, size_t n, const char *member) {
  double s = 0;
  for (size_t i = 0; i < n; i++) {
    json_t *v = json_object_get(o, names[i]);
    s += member ? num(v, member) : (json_is_number(v) ? json_number_value(v) : 0);
  }
  return s;
}

/* A cold tier's coding (/stats' "codec" of g3 or g4), when it did any. */
static void codec_line(const char *what, json_t *cj) {
  if (unum(cj, "coded") + unum(cj, "raw") + unum(cj, "decoded"))
    printf("%-12s coded %llu, raw %llu, decoded %llu; stored ratio %.2f\n", what,
           (unsigned long long)unum(cj, "coded"), (unsigned long long)unum(cj, "raw"),
           (unsigned long long)unum(cj, "decoded"),
           json_number_value(json_object_get(cj, "ratio")));
}

/* The sum of an object's numbers. */
static double sum_all(json_t *o) {
  double s = 0;
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) s += json_is_number(v) ? json_number_value(v) : 0;
  return s;
}

static void print_status(const ctl *c, json_t *st) {
  json_t *tiers = json_object_get(st, "tiers"), *misses = json_object_get(st, "misses");
  json_t *pol = json_object_get(st, "policy");
  const char *ver = json_string_value(json_object_get(st, "version"));
  const char *ev = json_string_value(json_object_get(pol, "eviction"));
  const char *adm = json_string_value(json_object_get(pol, "admission"));
  uint64_t up = unum(st, "uptime_s");
  printf("kvcached %s, pid %llu, up %llud %02lluh%02llum%02llus; eviction %s, admission %s\n",
         ver ? ver : "?", (unsigned long long)unum(st, "pid"), (unsigned long long)(up / 86400),
         (unsigned long long)(up / 3600 % 24), (unsigned long long)(up / 60 % 60),
         (unsigned long long)(up % 60), ev ? ev : "?", adm ? adm : "?");
  printf("stats socket %s\n\n", c->stats_sock);
  print_tier_table(tiers);
  double hits = sum_members(tiers, tier_names, NELEM(tier_names), "hits");
  double miss = sum_members(misses, miss_reasons, NELEM(miss_reasons), NULL);
  double hr = hit_rate(hits, miss);
  printf("\n%-12s ", "hit rate");
  if (hr < 0) printf("-");
  else printf("%.1f%%", 100 * hr);
  printf(" (%.0f hits, %.0f misses; %llu lookups)\n", hits, miss,
         (unsigned long long)unum(st, "lookups"));
  printf("%-12s", "misses");
  for (size_t i = 0; i < NELEM(miss_reasons); i++)
    printf(" %s %llu%s", miss_reasons[i], (unsigned long long)unum(misses, miss_reasons[i]),
           i + 1 < NELEM(miss_reasons) ? "," : "\n");
  printf("%-12s %llu, pins %llu, uncommitted allocations %llu\n", "sessions",
         (unsigned long long)unum(st, "sessions"), (unsigned long long)unum(st, "pins"),
         (unsigned long long)unum(st, "uncommitted"));
  printf("%-12s demotions %llu, admissions refused %llu\n", "g3",
         (unsigned long long)unum(st, "demotions"),
         (unsigned long long)unum(st, "admissions_refused"));
  json_t *g3 = json_object_get(st, "g3");
  codec_line("g3 codec", json_object_get(g3, "codec"));
  if (unum(g3, "too_large"))
    printf("%-12s %llu blocks larger than a slot not written\n", "g3 too large",
           (unsigned long long)unum(g3, "too_large"));
  json_t *g4 = json_object_get(st, "g4");
  const char *g4s = json_string_value(json_object_get(g4, "state"));
  if (g4s && strcmp(g4s, "off")) {
    json_t *g4m = json_object_get(g4, "misses"), *g4w = json_object_get(g4, "writes");
    char bi[32], bo[32];
    kvctl_human_bytes(unum(g4, "bytes_in"), bi, sizeof bi);
    kvctl_human_bytes(unum(g4, "bytes_out"), bo, sizeof bo);
    printf("%-12s %s (%llu masters, %llu slots): hits %llu, misses %.0f, writes %llu of %.0f; "
           "in %s, out %s\n",
           "g4", g4s, (unsigned long long)unum(g4, "masters"), (unsigned long long)unum(g4, "slots"),
           (unsigned long long)unum(g4, "hits"), sum_all(g4m), (unsigned long long)unum(g4w, "ok"),
           sum_all(g4w), bi, bo);
    codec_line("g4 codec", json_object_get(g4, "codec"));
  } else {
    printf("%-12s off\n", "g4");
  }
  json_t *pr = json_object_get(st, "presence");
  if (json_is_object(pr)) {
    char pb[32];
    kvctl_human_bytes(unum(pr, "bytes"), pb, sizeof pb);
    printf("%-12s %llu namespaces mapped by workers, %s; %llu updates, %llu maps, "
           "%llu contradicted by a LOAD\n",
           "presence", (unsigned long long)unum(pr, "namespaces"), pb,
           (unsigned long long)unum(pr, "updates"), (unsigned long long)unum(pr, "maps"),
           (unsigned long long)unum(pr, "contradicted"));
  }
  json_t *traffic = json_object_get(st, "traffic");
  printf("%-12s", "traffic");
  for (size_t i = 0; i < NELEM(directions); i++) {
    json_t *x = json_object_get(traffic, directions[i]);
    char b[32];
    kvctl_human_bytes(unum(x, "bytes"), b, sizeof b);
    printf(" %s %s (%llu ops)%s", directions[i], b, (unsigned long long)unum(x, "ops"),
           i + 1 < NELEM(directions) ? "," : "\n");
  }
  json_t *lat = json_object_get(st, "latency_us"), *l;
  const char *name;
  json_object_foreach(lat, name, l) {
    if (!json_is_object(l)) continue;
    printf("%-12s %s p50 %llu us, p99 %llu us (%llu)\n", "latency", name,
           (unsigned long long)unum(l, "p50"), (unsigned long long)unum(l, "p99"),
           (unsigned long long)unum(l, "count"));
  }
}

int kvctl_status(ctl *c) {
  int rc = no_args(c, "status", O_CONN | O_JSON);
  if (rc) return rc;
  json_t *st;
  char *raw = NULL;
  if ((rc = get_json(c, "/stats", &st, &raw))) return rc;
  if (c->json) printf("%s\n", raw);
  else print_status(c, st);
  free(raw);
  json_decref(st);
  return 0;
}

int kvctl_tiers(ctl *c) {
  int rc = no_args(c, "tiers", O_CONN | O_JSON);
  if (rc) return rc;
  json_t *st;
  if ((rc = get_json(c, "/stats", &st, NULL))) return rc;
  json_t *tiers = json_object_get(st, "tiers");
  if (!json_is_object(tiers)) {
    fprintf(stderr, "kvctl: GET /stats: no \"tiers\" object in the answer\n");
    json_decref(st);
    return EXIT_FAIL;
  }
  if (c->json) print_json(tiers);
  else print_tier_table(tiers);
  json_decref(st);
  return 0;
}

/* --- top ------------------------------------------------------------------------------ */

static volatile sig_atomic_t interrupted;
static void on_signal(int sig) {
  (void)sig;
  interrupted = 1;
}

/* Sleeps s seconds, or less when a signal sets `interrupted`. */
static void nap(double s) {
  struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
  while (!interrupted && nanosleep(&ts, &ts) && errno == EINTR) {}
}

/* b - a for counters; a counter that went back (a restarted daemon)
 * counts from zero. */
static double delta(double a, double b) { return b >= a ? b - a : b; }

/* One frame of `top`, from the samples a (earlier) and b, dt seconds
 * apart: a JSON object (the caller decrefs). */
static json_t *top_frame(json_t *a, json_t *b, double dt) {
  json_t *ta = json_object_get(a, "tiers"), *tb = json_object_get(b, "tiers");
  double hits = 0, miss = 0, reqs = 0;
  for (size_t i = 0; i < NELEM(tier_names); i++)
    hits += delta(num(json_object_get(ta, tier_names[i]), "hits"),
                  num(json_object_get(tb, tier_names[i]), "hits"));
  json_t *ma = json_object_get(a, "misses"), *mb = json_object_get(b, "misses");
  for (size_t i = 0; i < NELEM(miss_reasons); i++)
    miss += delta(num(ma, miss_reasons[i]), num(mb, miss_reasons[i]));
  json_t *ra = json_object_get(a, "requests"), *rb = json_object_get(b, "requests"), *v;
  const char *op;
  json_object_foreach(rb, op, v) {
    if (json_is_number(v)) reqs += delta(num(ra, op), json_number_value(v));
  }
  double hr = hit_rate(hits, miss);
  json_t *f = json_object();
  json_object_set_new(f, "interval_s", json_real(dt));
  json_object_set_new(f, "hit_rate", hr < 0 ? json_null() : json_real(hr));
  json_object_set_new(f, "requests_per_s", json_real(reqs / dt));
  json_object_set_new(f, "lookups_per_s",
                      json_real(delta(num(a, "lookups"), num(b, "lookups")) / dt));
  /* presence tables (protocol 1.5): the entries the daemon wrote to them */
  json_t *pa = json_object_get(a, "presence"), *pb = json_object_get(b, "presence");
  json_object_set_new(f, "presence_updates_per_s",
                      json_real(delta(num(pa, "updates"), num(pb, "updates")) / dt));
  json_t *bps = json_object(), *occ = json_object();
  json_t *xa = json_object_get(a, "traffic"), *xb = json_object_get(b, "traffic");
  for (size_t i = 0; i < NELEM(directions); i++)
    json_object_set_new(bps, directions[i],
                        json_real(delta(num(json_object_get(xa, directions[i]), "bytes"),
                                        num(json_object_get(xb, directions[i]), "bytes")) /
                                  dt));
  for (size_t i = 0; i < NELEM(tier_names); i++) {
    json_t *t = json_object_get(tb, tier_names[i]);
    double capb = num(t, "capacity_bytes");
    int on = json_is_object(t) && !json_is_false(json_object_get(t, "enabled")) && capb > 0;
    json_object_set_new(occ, tier_names[i],
                        on ? json_real(num(t, "used_bytes") / capb) : json_null());
  }
  json_object_set_new(f, "bytes_per_s", bps);
  json_object_set_new(f, "occupancy", occ);
  return f;
}

static void print_top_frame(const ctl *c, json_t *f, json_t *st, int tty) {
  if (tty) printf("\033[H\033[J");
  char when[32];
  time_t t = time(NULL);
  struct tm tm;
  strftime(when, sizeof when, "%H:%M:%S", localtime_r(&t, &tm));
  printf("kvcached pid %llu  %s  every %gs  (%s)\n", (unsigned long long)unum(st, "pid"), when,
         c->interval_s, tty ? "ctrl-c to stop" : c->stats_sock);
  json_t *hr = json_object_get(f, "hit_rate");
  if (json_is_number(hr)) printf("hit rate %5.1f%%", 100 * json_number_value(hr));
  else printf("hit rate     -");
  printf("   requests %.1f/s   lookups %.1f/s\n", num(f, "requests_per_s"),
         num(f, "lookups_per_s"));
  json_t *pr = json_object_get(st, "presence");
  printf("presence  %llu namespaces mapped, %.1f updates/s\n",
         (unsigned long long)unum(pr, "namespaces"), num(f, "presence_updates_per_s"));
  json_t *bps = json_object_get(f, "bytes_per_s");
  for (size_t i = 0; i < NELEM(directions); i++) {
    char b[32];
    kvctl_human_bytes((uint64_t)num(bps, directions[i]), b, sizeof b);
    printf("%-9s %12s/s%s", directions[i], b, i % 2 ? "\n" : "   ");
  }
  json_t *occ = json_object_get(f, "occupancy"), *tiers = json_object_get(st, "tiers");
  for (size_t i = 0; i < NELEM(tier_names); i++) {
    json_t *o = json_object_get(occ, tier_names[i]), *ti = json_object_get(tiers, tier_names[i]);
    const char *state = json_string_value(json_object_get(ti, "state"));
    if (!json_is_number(o)) {
      printf("%s  %-8s -\n", tier_names[i], state ? state : "off");
      continue;
    }
    double p = json_number_value(o);
    char used[32], cap[32], bar[41];
    kvctl_human_bytes(unum(ti, "used_bytes"), used, sizeof used);
    kvctl_human_bytes(unum(ti, "capacity_bytes"), cap, sizeof cap);
    int fill = (int)lround(fmin(fmax(p, 0), 1) * 40);
    memset(bar, '#', (size_t)fill);
    memset(bar + fill, '.', (size_t)(40 - fill));
    bar[40] = 0;
    printf("%s  %-8s [%s] %5.1f%%  %s of %s, %llu blocks\n", tier_names[i], state ? state : "?",
           bar, 100 * p, used, cap, (unsigned long long)unum(ti, "blocks"));
  }
  if (!tty) printf("\n");
}

int kvctl_top(ctl *c) {
  int rc = no_args(c, "top", O_CONN | O_JSON | O_INTERVAL | O_COUNT);
  if (rc) return rc;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal; /* no SA_RESTART: a nap ends at once */
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  int tty = !c->json && isatty(STDOUT_FILENO);
  json_t *prev;
  if ((rc = get_json(c, "/stats", &prev, NULL))) return rc;
  double t_prev = kv_now_s();
  for (uint32_t frame = 0; !c->count || frame < c->count; frame++) {
    nap(c->interval_s);
    if (interrupted) break;
    json_t *cur;
    if ((rc = get_json(c, "/stats", &cur, NULL))) break;
    double t = kv_now_s();
    json_t *f = top_frame(prev, cur, t - t_prev > 0 ? t - t_prev : c->interval_s);
    if (c->json) print_json(f);
    else print_top_frame(c, f, cur, tty);
    fflush(stdout);
    json_decref(f);
    json_decref(prev);
    prev = cur;
    t_prev = t;
  }
  json_decref(prev);
  return rc;
}

/* --- config ---------------------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int config_get(ctl *c) {
  if (c->nargs > 2) return bad_usage("%s", "config get takes at most one NAME");
  const char *name = c->nargs == 2 ? c->args[1] : NULL;
  json_t *cfg;
  char *raw = NULL;
  int rc = get_json(c, "/config", &cfg, &raw);
  if (rc) return rc;
  if (name) {
    json_t *v = json_object_get(cfg, name);
    if (!v) {
      fprintf(stderr, "kvctl: no setting '%s' (kvctl config get lists them)\n", name);
      rc = EXIT_FAIL;
    } else if (c->json) {
      json_t *one = json_pack("{s:O}", name, v);
      print_json(one);
      json_decref(one);
    } else {
      printf("%s\n", json_is_string(v) ? json_string_value(v) : "");
      if (!json_is_string(v)) print_json(v);
    }
  } else if (c->json) {
    printf("%s\n", raw);
  } else {
    size_t n = json_object_size(cfg), i = 0;
    const char **keys = calloc(n ? n : 1, sizeof *keys), *k;
    json_t *v;
    if (!keys) {
      fprintf(stderr, "kvctl: out of memory\n");
      rc = EXIT_FAIL;
    } else {
      json_object_foreach(cfg, k, v) keys[i++] = k;
      qsort(keys, n, sizeof *keys, cmp_str);
      for (i = 0; i < n; i++) {
        json_t *x = json_object_get(cfg, keys[i]);
        if (json_is_string(x)) {
          printf("%s = %s\n", keys[i], json_string_value(x));
        } else {
          char *s = json_dumps(x, JSON_COMPACT | JSON_ENCODE_ANY);
          printf("%s = %s\n", keys[i], s ? s : "?");
          free(s);
        }
      }
      free(keys);
    }
  }
  free(raw);
  json_decref(cfg);
  return rc;
}

static int config_set(ctl *c) {
  if (c->nargs != 3) return bad_usage("%s", "config set takes NAME and VALUE");
  const char *name = c->args[1], *value = c->args[2];
  if (!name[0] || !strchr(name, '.'))
    return bad_usage("bad setting name '%s' (SECTION.NAME, e.g. g2.capacity)", name);
  char target[8192];
  const char *kv[] = {"name", name, "value", value};
  if (build_target(target, sizeof target, "/config", kv, 2))
    return bad_usage("%s", "config set: NAME and VALUE too long");
  json_t *o;
  char *raw = NULL;
  int rc = call(c, 1, "POST", target, 0, NULL, &o, &raw);
  if (rc) return rc;
  if (c->json) {
    printf("%s\n", raw);
  } else {
    const char *prev = json_string_value(json_object_get(o, "previous"));
    const char *now = json_string_value(json_object_get(o, "value"));
    printf("%s: %s -> %s\n", name, prev ? prev : "?", now ? now : value);
  }
  free(raw);
  json_decref(o);
  return 0;
}

int kvctl_config(ctl *c) {
  int rc = kvctl_only(c, "config", O_CONN | O_JSON);
  if (rc) return rc;
  if (c->nargs < 1) return bad_usage("%s", "config needs 'get' or 'set'");
  if (!strcmp(c->args[0], "get")) return config_get(c);
  if (!strcmp(c->args[0], "set")) return config_set(c);
  return bad_usage("unknown config command '%s' (get or set)", c->args[0]);
}

/* --- evict, flush ------------------------------------------------------------------------ */

/* POSTs target on the admin socket and prints `what` N from the answer's
 * member `member` (or the raw answer with --json). */
static int post_count(ctl *c, const char *target, const char *member, const char *what) {
  json_t *o;
  char *raw = NULL;
  int rc = call(c, 1, "POST", target, 0, NULL, &o, &raw);
  if (rc) return rc;
  if (c->json) printf("%s\n", raw);
  else
    printf("%s %llu block%s%s%s\n", what, (unsigned long long)unum(o, member),
           unum(o, member) == 1 ? "" : "s", c->tier ? " from " : "", c->tier ? c->tier : "");
  free(raw);
  json_decref(o);
  return 0;
}

int kvctl_evict(ctl *c) {
  int rc = no_args(c, "evict", O_CONN | O_JSON | O_TIER | O_NSHEX | O_COUNT);
  if (rc) return rc;
  if (!c->tier) return bad_usage("%s", "evict needs --tier g2|g3");
  char count[16], target[256];
  snprintf(count, sizeof count, "%u", c->count);
  const char *kv[] = {"tier", c->tier, "ns", c->ns, "count", c->count ? count : NULL};
  if (build_target(target, sizeof target, "/evict", kv, 3))
    return bad_usage("%s", "evict: arguments too long");
  return post_count(c, target, "evicted", "evicted");
}

int kvctl_flush(ctl *c) {
  int rc = no_args(c, "flush", O_CONN | O_JSON | O_TIER | O_NSHEX);
  if (rc) return rc;
  char target[256];
  const char *kv[] = {"tier", c->tier, "ns", c->ns};
  if (build_target(target, sizeof target, "/flush", kv, 2))
    return bad_usage("%s", "flush: arguments too long");
  return post_count(c, target, "dropped", "dropped");
}

/* --- pin, unpin -------------------------------------------------------------------------- */

/* Keys per request: a request line well under the daemon's 64 KiB limit. */
#define PIN_TARGET_MAX 16384

static int pin_common(ctl *c, const char *cmd, int pin) {
  int rc = kvctl_only(c, cmd, O_CONN | O_JSON | O_NSHEX);
  if (rc) return rc;
  if (!c->ns) return bad_usage("%s needs --ns HEX (the namespace, as `kvctl keys` shows it)", cmd);
  if (c->nargs < 1) return bad_usage("%s needs at least one KEY", cmd);
  /* Keys as lower-case hex, validated before anything is sent. */
  char(*hex)[65] = calloc((size_t)c->nargs, sizeof *hex);
  if (!hex) {
    fprintf(stderr, "kvctl: out of memory\n");
    return EXIT_FAIL;
  }
  for (int i = 0; i < c->nargs && !rc; i++) {
    uint8_t k[32];
    int n = kvctl_parse_hex(c->args[i], k, sizeof k);
    if (n < 1) {
      rc = bad_usage("bad key '%s': not a hex digest of 1 to 32 bytes", c->args[i]);
      break;
    }
    for (int j = 0; j < n; j++) snprintf(hex[i] + 2 * j, 3, "%02x", k[j]);
  }
  const char *path = pin ? "/pin" : "/unpin", *member = pin ? "pinned" : "unpinned";
  uint64_t done = 0, missing = 0;
  json_t *answers = json_array();
  char *target = malloc(PIN_TARGET_MAX);
  if (!rc && (!target || !answers)) {
    fprintf(stderr, "kvctl: out of memory\n");
    rc = EXIT_FAIL;
  }
  /* One request per batch of keys that fits PIN_TARGET_MAX. */
  for (int i = 0; !rc && i < c->nargs;) {
    size_t at = (size_t)snprintf(target, PIN_TARGET_MAX, "%s?ns=%s&keys=", path, c->ns);
    int first = i;
    while (i < c->nargs && at + strlen(hex[i]) + 2 < PIN_TARGET_MAX) {
      at +=
          (size_t)snprintf(target + at, PIN_TARGET_MAX - at, "%s%s", i > first ? "," : "", hex[i]);
      i++;
    }
    json_t *o;
    if ((rc = call(c, 1, "POST", target, 0, NULL, &o, NULL))) break;
    json_t *d = json_object_get(o, member);
    done += json_is_number(d) ? unum(o, member) : unum(o, "pinned");
    missing += unum(o, "missing");
    json_array_append_new(answers, o);
  }
  if (!rc) {
    if (c->json && json_array_size(answers) == 1) print_json(json_array_get(answers, 0));
    else if (c->json) {
      json_t *sum =
          json_pack("{s:I,s:I}", member, (json_int_t)done, "missing", (json_int_t)missing);
      print_json(sum);
      json_decref(sum);
    } else {
      printf("%s %llu of %d key%s\n", member, (unsigned long long)done, c->nargs,
             c->nargs == 1 ? "" : "s");
    }
    if (missing) {
      fprintf(stderr, "kvctl: %s: %llu of %d key%s not found in namespace %s\n", cmd,
              (unsigned long long)missing, c->nargs, c->nargs == 1 ? "" : "s", c->ns);
      rc = EXIT_FAIL;
    }
  }
  json_decref(answers);
  free(target);
  free(hex);
  return rc;
}

int kvctl_pin(ctl *c) { return pin_common(c, "pin", 1); }

int kvctl_unpin(ctl *c) { return pin_common(c, "unpin", 0); }

/* --- keys --------------------------------------------------------------------------------- */

int kvctl_keys(ctl *c) {
  int rc = no_args(c, "keys", O_CONN | O_JSON | O_TIER | O_NSHEX | O_LIMIT);
  if (rc) return rc;
  char limit[16], target[256];
  snprintf(limit, sizeof limit, "%u", c->limit);
  const char *kv[] = {"limit", c->limit ? limit : NULL, "tier", c->tier, "ns", c->ns};
  if (build_target(target, sizeof target, "/keys", kv, 3))
    return bad_usage("%s", "keys: arguments too long");
  json_t *o;
  char *raw = NULL;
  if ((rc = get_json(c, target, &o, &raw))) return rc;
  json_t *keys = json_object_get(o, "keys"), *k;
  if (c->json) {
    printf("%s\n", raw);
  } else if (!json_is_array(keys)) {
    fprintf(stderr, "kvctl: GET %s: no \"keys\" array in the answer\n", target);
    rc = EXIT_FAIL;
  } else {
    int kw = 3;
    size_t i;
    json_array_foreach(keys, i, k) {
      const char *s = json_string_value(json_object_get(k, "key"));
      if (s && (int)strlen(s) > kw) kw = (int)strlen(s);
    }
    printf("%-*s  %-16s  %-5s  %10s  %4s  %4s  %8s\n", kw, "KEY", "NS", "TIERS", "BYTES", "PINS",
           "PRIO", "HITS");
    json_array_foreach(keys, i, k) {
      const char *key = json_string_value(json_object_get(k, "key"));
      const char *ns = json_string_value(json_object_get(k, "ns"));
      char tiers[32] = "", *p = tiers;
      json_t *tl = json_object_get(k, "tiers"), *t;
      size_t j;
      json_array_foreach(tl, j, t) {
        const char *tn = json_string_value(t);
        if (!tn) continue;
        int n = snprintf(p, sizeof tiers - (size_t)(p - tiers), "%s%s", j ? "," : "", tn);
        if (n < 0 || (size_t)n >= sizeof tiers - (size_t)(p - tiers)) break;
        p += n;
      }
      printf("%-*s  %-16.16s  %-5s  %10llu  %4llu  %4llu  %8llu\n", kw, key ? key : "?",
             ns ? ns : "?", tiers[0] ? tiers : "-", (unsigned long long)unum(k, "bytes"),
             (unsigned long long)unum(k, "pins"), (unsigned long long)unum(k, "prio"),
             (unsigned long long)unum(k, "hits"));
    }
    printf("%zu of %llu blocks shown\n", json_array_size(keys),
           (unsigned long long)unum(o, "total"));
  }
  free(raw);
  json_decref(o);
  return rc;
}

/* --- health -------------------------------------------------------------------------------- */

int kvctl_health(ctl *c) {
  int rc = no_args(c, "health", O_CONN | O_LIVE);
  if (rc) return rc;
  json_t *o;
  int status = 0;
  if ((rc = call(c, 0, "GET", "/health", 503, &status, &o, NULL))) return rc;
  const char *s = json_string_value(json_object_get(o, "status"));
  if (status == 200) {
    printf("%s\n", s ? s : "ok");
  } else {
    printf("%s:", s ? s : "degraded");
    json_t *reasons = json_object_get(o, "reasons"), *r;
    size_t i;
    json_array_foreach(reasons, i, r)
        printf("%s %s", i ? "," : "", json_string_value(r) ? json_string_value(r) : "?");
    printf("\n");
    if (!c->live) rc = EXIT_FAIL;
  }
  json_decref(o);
  return rc;
}
