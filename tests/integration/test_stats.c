/* test_stats.c - what a real kvcached measures: miss reasons (absent,
 * evicted, not_shareable), request latency counts, the /metrics text
 * against the names of daemon/OPS.md, /stats, /keys. The pieces alone are
 * in tests/unit/test_stats_unit.c. */
#include "tests/lib/fixture.h"

#include "base/errors.h"
#include "daemon/stats.h"

static char resp[1 << 20];

static const char *scrape(void) {
  const char *body;
  cr_assert_eq(ops_req(ops_d.stats, "GET", "/metrics", resp, sizeof resp, &body), 200);
  cr_assert(strstr(resp, "Content-Type: text/plain; version=0.0.4"), "%.200s", resp);
  return body;
}

static void setup(void) { ops_start(NULL, NULL); }
TestSuite(stats, .init = setup, .fini = ops_stop, .timeout = 60);

Test(stats, miss_reasons_and_request_latency) {
  kvc *c = ops_open("t1");
  /* the daemon's LOOKUP, which classifies its misses (a worker's presence
   * table answers without the daemon: daemon/OPS.md, "Miss reasons") */
  cr_assert_eq(kvc_set_lookup(c, KVC_LOOKUP_DAEMON), 0);
  ops_store(c, 1, 4);
  json_t *o = ops_json(ops_d.admin, "POST", "/flush", 200);
  cr_assert_eq(ops_num(o, "dropped"), 4);
  json_decref(o);
  kvc_key keys[3] = {KC(1), KC(2), KC(99)};
  uint8_t tiers[3];
  cr_assert_eq(kvc_lookup(c, keys, 3, tiers), 0); /* 1, 2 evicted; 99 never seen */
  kvc_block out[1];
  kvc_key k3 = KC(3);
  cr_assert_eq(kvc_load(c, KVC_G2, &k3, 1, out), 0); /* a LOAD miss on an evicted key */
  cr_assert_neq(out[0].status, 0);
  ops_store(c, 5, 5);
  kvc_key k5 = KC(5);
  cr_assert_eq(kvc_load(c, KVC_G2, &k5, 1, out), 1);
  cr_assert_eq(kvc_release(c, &k5, 1, NULL), 1);
  kvc_delete(c, &k5, 1);
  cr_assert_eq(kvc_lookup(c, &k5, 1, tiers), 0); /* deleted: forgotten, absent */
  const char *m = scrape();
  cr_assert_eq(kvt_metric_value(m, "kvcached_misses_total{reason=\"evicted\"}"), 3, "%s", m);
  cr_assert_eq(kvt_metric_value(m, "kvcached_misses_total{reason=\"absent\"}"), 2);
  cr_assert_eq(kvt_metric_value(m, "kvcached_misses_total{reason=\"not_shareable\"}"), 0);
  cr_assert_eq(kvt_metric_value(m, "kvcached_request_duration_seconds_count{op=\"lookup\"}"), 2);
  cr_assert_eq(kvt_metric_value(m, "kvcached_request_duration_seconds_count{op=\"load\"}"), 2);
  cr_assert_eq(
      kvt_metric_value(m, "kvcached_request_duration_seconds_bucket{op=\"load\",le=\"+Inf\"}"), 2);
  cr_assert_eq(kvt_metric_value(m, "kvcached_requests_total{op=\"lookup\"}"), 2);
  cr_assert_eq(kvt_metric_value(m, "kvcached_requests_total{op=\"commit\"}"), 5);
  cr_assert_eq(kvt_metric_value(m, "kvcached_sessions"), 1);
  cr_assert_eq(kvt_metric_value(m, "kvcached_g3_state{state=\"off\"}"), 1);
  cr_assert_eq(kvt_metric_value(m, "kvcached_copy_ops_total{direction=\"g2_to_g3\"}"), 0);
  /* what the default policy does: its own order (no hints yet), H from 0 */
  cr_assert_eq(kvt_metric_value(m, "kvcached_eviction_order{tier=\"g2\",order=\"adapt\"}"), 1);
  cr_assert_eq(kvt_metric_value(m, "kvcached_eviction_order_switches_total{tier=\"g2\"}"), 0);
  cr_assert_not_null(strstr(m, "\nkvcached_eviction_bonus_capacities{tier=\"g2\"} "));
  json_t *s = ops_json(ops_d.stats, "GET", "/stats", 200);
  cr_assert_eq(ops_num(s, "misses.evicted"), 3);
  cr_assert_eq(ops_num(s, "latency_us.lookup.count"), 2);
  cr_assert_gt(ops_num(s, "latency_us.lookup.p99"), 0);
  cr_assert_gt(ops_num(s, "latency_us.loop_turn.count"), 0);
  cr_assert_eq(ops_num(s, "pid"), ops_d.pid);
  json_decref(s);
  kvc_close(c);
}

/* kvcached_loop_turn_seconds counts the time the loop's callbacks held
 * it, not its waits: a second of quiet between two requests adds turns
 * (the requests, the scrape, the tick) but far less than a second. */
Test(stats, loop_turns_count_callbacks_not_waits) {
  kvc *c = ops_open("t1");
  ops_store(c, 1, 2);
  const char *m = scrape();
  double n0 = kvt_metric_value(m, "kvcached_loop_turn_seconds_count{loop=\"main\"}");
  double s0 = kvt_metric_value(m, "kvcached_loop_turn_seconds_sum{loop=\"main\"}");
  cr_assert_gt(n0, 0, "%s", m);
  usleep(1000 * 1000);
  kvc_key k = KC(1);
  uint8_t tiers[1];
  cr_assert_eq(kvc_lookup(c, &k, 1, tiers), 1);
  m = scrape();
  double n1 = kvt_metric_value(m, "kvcached_loop_turn_seconds_count{loop=\"main\"}");
  double s1 = kvt_metric_value(m, "kvcached_loop_turn_seconds_sum{loop=\"main\"}");
  cr_assert_gt(n1, n0 + 1, "turns %g -> %g", n0, n1);
  cr_assert_lt(s1 - s0, 0.5, "the turns took %g s of a quiet second", s1 - s0);
  cr_assert_eq(
      kvt_metric_value(m, "kvcached_loop_turn_seconds_bucket{loop=\"main\",le=\"+Inf\"}"), n1);
  kvc_close(c);
}

/* Issue 16 item 12: kvcached_hits_total counted LOOKUP hits only while the
 * misses counted LOAD's too, so a workload of LOADs showed "hit rate 0.0%"
 * after five hits. Five LOAD hits (and one miss) are five hits everywhere
 * the daemon reports them: the metric, /stats, the wire STATUS, and kvctl
 * status's hit rate. */
Test(stats, load_hits_count_as_hits_like_their_misses) {
  kvc *c = ops_open("t1");
  ops_store(c, 1, 5);
  kvc_key keys[6];
  kvc_block out[6];
  for (int i = 0; i < 6; i++) keys[i] = KC((uint64_t)i + 1); /* 6 was never stored */
  cr_assert_eq(kvc_load(c, KVC_G2, keys, 6, out), 5);
  for (int i = 0; i < 5; i++) cr_assert_eq(out[i].status, 0);
  cr_assert_eq(out[5].status, KV_ENOTFOUND);
  cr_assert_eq(kvc_release(c, keys, 5, NULL), 5);
  const char *m = scrape();
  cr_assert_eq(kvt_metric_value(m, "kvcached_hits_total{tier=\"g2\"}"), 5, "%s", m);
  cr_assert_eq(kvt_metric_value(m, "kvcached_misses_total{reason=\"absent\"}"), 1);
  json_t *st = ops_json(ops_d.stats, "GET", "/stats", 200);
  cr_assert_eq(ops_num(st, "tiers.g2.hits"), 5);
  char *text = NULL;
  cr_assert_eq(kvc_status(c, &text), 0);
  json_t *w = json_loads(text, 0, NULL);
  free(text);
  cr_assert_not_null(w);
  cr_assert_eq(ops_num(w, "core.hits_g2"), 5);
  cr_assert_eq(ops_num(w, "core.misses"), 1, "the same misses as the metric");
  /* STATUS shows the tiers as /stats does, G1 included. */
  json_t *wt = json_object_get(w, "tiers"), *g1 = json_object_get(wt, "g1");
  cr_assert(json_is_object(g1), "STATUS has no tiers.g1");
  cr_assert(json_equal(g1, json_object_get(json_object_get(st, "tiers"), "g1")));
  cr_assert_eq(ops_num(w, "tiers.g2.hits"), 5);
  json_decref(st);
  json_decref(w);
  kvc_close(c);
  char cmd[256], line[256] = "";
  snprintf(cmd, sizeof cmd, KV_BIN_DIR "/kvctl status --socket-dir %s", ops_d.dir);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  char buf[256];
  while (fgets(buf, sizeof buf, p))
    if (!strncmp(buf, "hit rate", 8)) snprintf(line, sizeof line, "%s", buf);
  cr_assert_eq(pclose(p), 0);
  cr_assert(strstr(line, "83.3% (5 hits, 1 misses;"), "kvctl status: %s", line);
}

Test(stats, every_metric_of_the_contract_is_exported) {
  static const char *const names[] = {"kvcached_build_info",
                                      "kvcached_uptime_seconds",
                                      "kvcached_tier_capacity_bytes",
                                      "kvcached_tier_used_bytes",
                                      "kvcached_tier_blocks",
                                      "kvcached_hits_total",
                                      "kvcached_misses_total",
                                      "kvcached_lookups_total",
                                      "kvcached_copy_bytes_total",
                                      "kvcached_copy_ops_total",
                                      "kvcached_copy_duration_seconds",
                                      "kvcached_evictions_total",
                                      "kvcached_demotions_total",
                                      "kvcached_admissions_refused_total",
                                      "kvcached_pinned_blocks",
                                      "kvcached_uncommitted_allocations",
                                      "kvcached_sessions",
                                      "kvcached_sessions_opened_total",
                                      "kvcached_requests_total",
                                      "kvcached_request_duration_seconds",
                                      "kvcached_g3_state",
                                      "kvcached_g3_io_errors_total",
                                      "kvcached_g3_corrupt_total",
                                      "kvcached_bad_frames_total"};
  const char *m = scrape();
  char line[128];
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    snprintf(line, sizeof line, "# TYPE %s ", names[i]);
    cr_expect(strstr(m, line), "no %s in /metrics", names[i]);
  }
  /* ... and each is named in the contract. */
  FILE *f = fopen(KV_SOURCE_DIR "/daemon/OPS.md", "r");
  cr_assert_not_null(f);
  static char doc[65536];
  doc[fread(doc, 1, sizeof doc - 1, f)] = 0;
  fclose(f);
  for (const char *p = m; (p = strstr(p, "# TYPE ")); p += 7) {
    char name[96];
    sscanf(p + 7, "%95s", name);
    cr_expect(strstr(doc, name), "%s is exported but not in daemon/OPS.md", name);
  }
  for (int d = 0; d < KVD_DIR_COUNT; d++) {
    snprintf(line, sizeof line, "kvcached_copy_duration_seconds_count{direction=\"%s\"}",
             kvd_dir_names[d]);
    cr_expect_eq(kvt_metric_value(m, line), 0, "%s", line);
  }
}

Test(stats, keys_samples_the_index) {
  kvc *c = ops_open("t1");
  ops_store(c, 1, 30);
  json_t *o = ops_json(ops_d.stats, "GET", "/keys", 200);
  cr_assert_eq(ops_num(o, "total"), 30);
  cr_assert_eq(json_array_size(json_object_get(o, "keys")), 20, "default limit");
  json_t *k = json_array_get(json_object_get(o, "keys"), 0);
  cr_assert_eq(strlen(json_string_value(json_object_get(k, "key"))), 16);
  cr_assert_eq(strlen(json_string_value(json_object_get(k, "ns"))), 64);
  cr_assert_str_eq(json_string_value(json_array_get(json_object_get(k, "tiers"), 0)), "g2");
  cr_assert_eq(ops_num(k, "bytes"), OPS_BLOCK);
  cr_assert_eq(ops_num(k, "prio"), 128);
  json_decref(o);
  o = ops_json(ops_d.stats, "GET", "/keys?limit=5&tier=g2", 200);
  cr_assert_eq(json_array_size(json_object_get(o, "keys")), 5);
  json_decref(o);
  o = ops_json(ops_d.stats, "GET", "/keys?tier=g3", 200);
  cr_assert_eq(ops_num(o, "total"), 0);
  json_decref(o);
  kvc_close(c);
}

/* Issue 19 item 5: a g2.capacity that is not a whole number of
 * g2.page_size pages was cut down to whole pages (97M of 64M pages held
 * 64 MiB) and reported so. The arena holds what was configured, its last
 * page shorter, and STATUS, /stats and /metrics report it. */
TestSuite(g2_capacity, .fini = ops_stop, .timeout = 60);

static long long status_num(kvc *c, const char *path) {
  char *text = NULL;
  cr_assert_eq(kvc_status(c, &text), 0);
  json_t *w = json_loads(text, 0, NULL);
  free(text);
  cr_assert_not_null(w);
  long long v = ops_num(w, path);
  json_decref(w);
  return v;
}

Test(g2_capacity, the_arena_holds_what_was_configured) {
  const char *const sets[] = {"g2.capacity=97M", "g2.page_size=64M", NULL};
  ops_start(NULL, sets);
  const long long want = 97ll << 20;
  kvc *c = ops_open("t1");
  cr_assert_eq(status_num(c, "g2.capacity_bytes"), want, "STATUS: %lld",
               status_num(c, "g2.capacity_bytes"));
  cr_assert_eq(status_num(c, "g2.configured_bytes"), want);
  cr_assert_eq(status_num(c, "tiers.g2.capacity_bytes"), want);
  cr_assert_eq(ops_stat("tiers.g2.capacity_bytes"), want);
  cr_assert_eq(ops_stat("tiers.g2.configured_bytes"), want);
  cr_assert_eq(ops_metric("kvcached_tier_capacity_bytes{tier=\"g2\"}"), want);
  cr_assert_eq(ops_metric("kvcached_tier_configured_bytes{tier=\"g2\"}"), want);
  /* ... and holds it: 97 MiB of blocks, every one still there. */
  const uint64_t n = (uint64_t)want / OPS_BLOCK;
  ops_store(c, 1, n);
  cr_assert_eq(ops_resident(c, 1, n), (int)n);
  cr_assert_eq(ops_stat("tiers.g2.used_bytes"), want);
  kvc_close(c);
}

/* Each tenant's arena holds its g2_share of g2.capacity, whole pages or not. */
Test(g2_capacity, each_tenant_arena_holds_its_share) {
  const char *const sets[] = {"g2.capacity=200M", "g2.page_size=64M", NULL};
  ops_start("alice,bob", sets);
  const long long each = 100ll << 20;
  json_t *s = ops_json(ops_d.stats, "GET", "/stats", 200);
  json_t *ts = json_object_get(s, "tenants");
  cr_assert_eq(json_array_size(ts), 2);
  for (size_t i = 0; i < 2; i++) {
    cr_assert_eq(ops_num(json_array_get(ts, i), "g2_capacity_bytes"), each);
    cr_assert_eq(ops_num(json_array_get(ts, i), "g2_configured_bytes"), each);
  }
  cr_assert_eq(ops_num(s, "tiers.g2.capacity_bytes"), 2 * each);
  cr_assert_eq(ops_num(s, "tiers.g2.configured_bytes"), 2 * each);
  json_decref(s);
  kvc *c = ops_open("bob");
  cr_assert_eq(status_num(c, "g2.capacity_bytes"), 2 * each);
  kvc_close(c);
}

static void setup2(void) { ops_start("alice,bob", NULL); }
TestSuite(stats2, .init = setup2, .fini = ops_stop, .timeout = 60);

Test(stats2, a_key_held_by_another_tenant_is_not_shareable) {
  kvc *a = ops_open("alice"), *b = ops_open("bob");
  cr_assert_eq(kvc_set_lookup(b, KVC_LOOKUP_DAEMON), 0); /* as above: the daemon classifies */
  ops_store(a, 7, 7);
  kvc_key k = KC(7), other = KC(8);
  uint8_t t;
  cr_assert_eq(kvc_lookup(b, &k, 1, &t), 0, "isolation");
  cr_assert_eq(kvc_lookup(b, &other, 1, &t), 0);
  const char *m = scrape();
  cr_assert_eq(kvt_metric_value(m, "kvcached_misses_total{reason=\"not_shareable\"}"), 1, "%s", m);
  cr_assert_eq(kvt_metric_value(m, "kvcached_misses_total{reason=\"absent\"}"), 1);
  kvc_close(a);
  kvc_close(b);
}
