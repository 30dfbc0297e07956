/*
 * kvd.c - the daemon's life in one place: its state brought up and torn
 * down (kvd_init, kvd_fini), and kvd_main, which builds the loop, registers
 * every event source on it - the worker socket, the operator sockets, the
 * housekeeping tick, the G1 devices' completions, the SSD tier's watch and
 * completions, the signals - runs it, and takes it all down in reverse.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include <systemd/sd-daemon.h>

#include "base/clock.h"
#include "base/errors.h"
#include "base/log.h"
#include "daemon/admin.h"
#include "daemon/kvd.h"
#include "daemon/server.h"
#include "ipc/sock.h"
#include "tiers/evict.h"

#define TICK_MS 100

/* The per-request scratch arrays kvd_init allocates. */
static void scratch_free(kvd *d) {
  free(d->keys);
  free(d->tiers);
  free(d->status);
  free(d->loads);
  free(d->allocs);
  free(d->blocks);
  d->keys = NULL;
}

/* A namespace without sessions, freed (its presence table goes before its
 * core id is reused), or in a TP group now (one rank's table no longer
 * answers). */
static void ns_changed(void *arg, uint32_t core_ns) { kvd_presence_drop(arg, core_ns); }

int kvd_init(kvd *d) {
  int rc;
  d->start_ms = (uint64_t)kv_now_ms();
  d->next_session_id = 1;
  kvd_defer_init(&d->load_wait, &kvd_load_defer_ops);
  kvd_defer_init(&d->alloc_wait, &kvd_alloc_defer_ops);
  d->keys = malloc(KV_BATCH_MAX * sizeof *d->keys);
  d->tiers = malloc(KV_BATCH_MAX);
  d->status = malloc(KV_BATCH_MAX * sizeof *d->status);
  d->loads = malloc(KV_BATCH_MAX * sizeof *d->loads);
  d->allocs = malloc(KV_BATCH_MAX * sizeof *d->allocs);
  d->blocks = malloc(KV_BATCH_MAX * sizeof *d->blocks);
  if (!d->keys || !d->tiers || !d->status || !d->loads || !d->allocs || !d->blocks) {
    rc = -ENOMEM;
    goto fail_scratch;
  }
  kv_core_opts co = {.policy = d->cfg.policy,
                     .retain_max_s = d->cfg.retain_max_s,
                     .sessions_max = d->cfg.hint_sessions};
  rc = kv_core_new(&d->core, &co);
  if (rc) {
    kv_error("core", "cannot start the cache core: %s", kv_strerror(rc));
    goto fail_scratch;
  }
  if (d->cfg.retain_max_s == 0) kv_core_set_retain_max(d->core, 0); /* 0 in opts: the default */
  if ((rc = kvd_g1s_open(&d->g1, &d->cfg))) goto fail_core;
  for (unsigned i = 0; i < d->g1.n; i++) {
    kvd_g1 *g = &d->g1.g[i];
    if (!g->on) continue;
    g->core_pool = kv_core_attach_g1(d->core, &g->slots, kvd_g1_copy, g);
    if (g->core_pool < 0) {
      rc = g->core_pool;
      kv_error("g1", "cannot attach the pool of device %d to the cache core: %s", g->ordinal,
               kv_strerror(rc));
      goto fail_g1;
    }
    g->done = kvd_g1_copied;
    g->done_arg = d;
  }
  kvd_presence_init(&d->pres, d->core);
  kv_core_on_visible(d->core, kvd_presence_visible, &d->pres);
  kvd_registry_opts ro = {.cfg = &d->cfg,
                          .lock = d->cfg.g2_lock,
                          .core = d->core,
                          .ns_changed_fn = ns_changed,
                          .ns_changed_arg = &d->pres};
  if (d->g1.on) {
    ro.register_fn = kvd_g1s_arena_register;
    ro.unregister_fn = kvd_g1s_arena_unregister;
    ro.register_arg = &d->g1;
  }
  rc = kvd_registry_init(&d->reg, &ro);
  if (rc) {
    kv_error("g2", "cannot create the G2 arenas (%llu bytes for %u tenant(s)): %s",
             (unsigned long long)d->cfg.g2_capacity, d->cfg.ntenants ? d->cfg.ntenants : 1,
             kv_strerror(rc));
    goto fail_g1;
  }
  /* A G3 that cannot be opened leaves the daemon on G2 alone (g3_watch.h). */
  if (d->cfg.g3_path[0] && (rc = kvd_g3_open(d, 0, d->g3w.why, sizeof d->g3w.why)))
    kvd_g3_unavailable(d, rc);
  if ((rc = kvd_metrics_init(d))) {
    kv_error("daemon", "cannot set up the metrics: %s", kv_strerror(rc));
    goto fail_g3;
  }
  kvd_session_init(&d->admin, 0);
  return 0;

fail_g3:
  if (d->g3) kv_g3_close(d->g3);
  d->g3 = NULL;
  kvd_registry_fini(&d->reg);
fail_g1:
  kvd_g1s_close(&d->g1);
fail_core:
  kv_core_free(d->core);
fail_scratch:
  scratch_free(d);
  return rc;
}

void kvd_fini(kvd *d) {
  uint64_t pins = 0, allocs = 0;
  kvd_defer_cancel_all(&d->load_wait); /* their connections are closed: nobody is answered */
  kvd_session_close(d->core, &d->admin, &pins, &allocs);
  if (pins) kv_info("admin", "released %llu pin(s) the operator held", (unsigned long long)pins);
  if (d->g3) {
    /* Every write in flight completes and the last index batch commits. */
    kv_g3_close(d->g3);
    d->g3 = NULL;
    kv_info("g3", "index synced and closed");
  }
  kvd_metrics_fini(d);
  kvd_trust_fini(&d->trust);
  kv_core_on_visible(d->core, NULL, NULL);
  kvd_presence_fini(&d->pres);
  kv_core_free(d->core);
  kvd_registry_fini(&d->reg); /* unregisters the arenas from the device */
  kvd_g1s_close(&d->g1);
  scratch_free(d);
}

/* --- completions -------------------------------------------------------------- */

void kvd_g1_copied(void *arg, uint64_t tag, int status) {
  kvd *d = arg;
  kv_core_g1_done(d->core, tag, status);
  kvd_defer_retry(&d->load_wait); /* G1 room may have come */
}

/* --- the loop ------------------------------------------------------------------ */

typedef struct daemon_state {
  kvd d;
  const char *config_path;
  kvd_server srv;
  kvd_ops ops;
  uv_loop_t loop;
  uv_timer_t tick;
  uv_signal_t sigterm, sigint, sighup;
  uv_prepare_t turn;               /* times each turn of the loop (on_turn) */
  uint64_t turn_at, turn_idle;     /* the last turn's start, and the loop's idle time then */
} daemon_state;

/* Before the loop waits for events: the turn that ends here (since the
 * last wait began, less the time blocked in it) goes into d.m.loop, so a
 * callback that holds the loop shows as a long turn. */
static void on_turn(uv_prepare_t *h) {
  daemon_state *st = h->data;
  uint64_t now = uv_hrtime(), idle = uv_metrics_idle_time(&st->loop);
  if (st->turn_at && now - st->turn_at >= idle - st->turn_idle)
    kvd_hist_add(&st->d.m.loop, now - st->turn_at - (idle - st->turn_idle));
  st->turn_at = now;
  st->turn_idle = idle;
}

/* Housekeeping: requests that waited for room too long, namespaces whose
 * last block went, corrupt reports, soft capacity limits set live. */
static void on_tick(uv_timer_t *t) {
  kvd *d = t->data;
  kvd_defer_expire(&d->load_wait, (uint64_t)kv_now_ms(), d->cfg.load_timeout_ms);
  kvd_defer_expire(&d->alloc_wait, (uint64_t)kv_now_ms(), d->cfg.load_timeout_ms);
  kvd_registry_sweep(&d->reg); /* namespaces whose last block went */
  if (d->trust.npend) kvd_trust_sweep(d);
  if (kv_core_limit(d->core, KV_G2) || kv_core_limit(d->core, KV_G3))
    kv_core_enforce_limits(d->core);
  kvd_g4_tick(d);
}

static void on_stop(uv_signal_t *h, int signum) {
  kv_info("daemon", "%s: stopping", signum == SIGTERM ? "SIGTERM" : "SIGINT");
  sd_notify(0, "STOPPING=1");
  uv_stop(h->loop);
}

static void on_hup(uv_signal_t *h, int signum) {
  daemon_state *d = h->data;
  if (!d->config_path) {
    kv_info("daemon", "SIGHUP: no configuration file to re-read");
    return;
  }
  kv_config fresh;
  char err[256];
  kv_config_defaults(&fresh);
  if (kv_config_load(&fresh, d->config_path, err, sizeof err) ||
      kv_config_validate(&fresh, err, sizeof err)) {
    kv_warn("daemon", "SIGHUP: keeping the running configuration: %s", err);
    return;
  }
  kv_log_threshold = fresh.log_level;
  d->d.cfg.log_level = fresh.log_level;
  if (fresh.g2_capacity != d->d.cfg.g2_capacity ||
      kv_evict_lookup(fresh.policy) != kv_evict_lookup(d->d.cfg.policy))
    kv_warn("daemon", "SIGHUP: g2.capacity and cache.policy change only on restart");
  if (fresh.ntenants != d->d.cfg.ntenants ||
      memcmp(fresh.tenants, d->d.cfg.tenants, fresh.ntenants * sizeof fresh.tenants[0]))
    kv_warn("daemon",
            "SIGHUP: [tenant.NAME] sections change only on restart: the running ones stay");
  kv_info("daemon", "SIGHUP: configuration re-read (log.level=%s)",
          kv_config_enum_name("log.level", fresh.log_level));
}

/* The event sources beside the sockets: none of them stops the start.
 * sources_stop closes them but the tick (kvd_main closes it first). */
static void sources_start(daemon_state *st) {
  int rc;
  if ((rc = kvd_g1s_start(&st->d.g1, &st->loop)))
    kv_warn("g1", "cannot poll the device's completions: %s", uv_strerror(rc));
  if ((rc = kvd_g3w_start(&st->d, &st->loop)))
    kv_error("g3", "cannot watch the SSD tier: %s", uv_strerror(rc));
  kvd_g4_start(&st->d, &st->loop); /* logs why when it cannot: no G4 then */
  uv_timer_init(&st->loop, &st->tick);
  st->tick.data = &st->d;
  uv_timer_start(&st->tick, on_tick, TICK_MS, TICK_MS);
  uv_unref((uv_handle_t *)&st->tick);
  uv_prepare_init(&st->loop, &st->turn);
  st->turn.data = st;
  uv_prepare_start(&st->turn, on_turn);
  uv_unref((uv_handle_t *)&st->turn);
  uv_signal_init(&st->loop, &st->sigterm);
  uv_signal_init(&st->loop, &st->sigint);
  uv_signal_init(&st->loop, &st->sighup);
  st->sighup.data = st;
  uv_signal_start(&st->sigterm, on_stop, SIGTERM);
  uv_signal_start(&st->sigint, on_stop, SIGINT);
  uv_signal_start(&st->sighup, on_hup, SIGHUP);
}

static void sources_stop(daemon_state *st) {
  kvd_g4_stop(&st->d); /* LOOKUPs waiting on it are answered from G1-G3, or dropped */
  kvd_g1s_stop(&st->d.g1);
  kvd_g3w_stop(&st->d);
  uv_close((uv_handle_t *)&st->turn, NULL);
  uv_close((uv_handle_t *)&st->sigterm, NULL);
  uv_close((uv_handle_t *)&st->sigint, NULL);
  uv_close((uv_handle_t *)&st->sighup, NULL);
}

/* The "ready" lines and systemd's READY=1. */
static void ready(daemon_state *st) {
  uint64_t locked = 0, cap = 0;
  for (uint32_t i = 0; i < st->d.reg.ntenants; i++) {
    cap += st->d.reg.tenants[i].arena.capacity;
    locked += st->d.reg.tenants[i].arena.locked;
  }
  char g1desc[32] = "off";
  kvd_g1 *g1first = kvd_g1s_first(&st->d.g1);
  if (g1first)
    snprintf(g1desc, sizeof g1desc, "%s on %u device(s)",
             kv_dev_backend_name(kv_dev_backend_of(g1first->dev)), st->d.g1.on);
  kv_info("daemon",
          "ready: socket %s, G2 %llu bytes for %u tenant(s) (%s), G1 %s, G3 %s, policy %s",
          st->srv.lst.path, (unsigned long long)cap, st->d.reg.ntenants,
          locked == st->d.reg.ntenants ? "locked" : "not locked", g1desc,
          st->d.g3        ? st->d.cfg.g3_path
          : st->d.g3w.err ? "unavailable"
                          : "off",
          kv_core_policy_name(st->d.core));
  kv_info("daemon", "operator sockets: %s (stats%s%s), %s (admin)", st->ops.stats.ulst.path,
          st->d.cfg.stats_listen[0] ? ", and TCP " : "", st->d.cfg.stats_listen,
          st->ops.admin.ulst.path);
  sd_notifyf(0, "READY=1\nSTATUS=serving %s; G2 %llu bytes, G3 %s, policy %s\nMAINPID=%d",
             st->srv.lst.path, (unsigned long long)cap,
             st->d.g3        ? "on"
             : st->d.g3w.err ? "unavailable"
                             : "off",
             kv_core_policy_name(st->d.core), (int)getpid());
}

int kvd_main(const kv_config *cfg, const char *config_path) {
  static daemon_state st;
  st.d.cfg = *cfg;
  st.config_path = config_path;
  /* A file size limit fails the write (EFBIG: G3 turns full) rather than
   * killing the daemon. */
  signal(SIGXFSZ, SIG_IGN);
  if (kvd_init(&st.d)) return 1; /* G1 too: daemon/g1.h logs whether it is on */
  uv_loop_init(&st.loop);
  uv_loop_configure(&st.loop, UV_METRICS_IDLE_TIME); /* on_turn's */
  if (kvd_server_start(&st.srv, &st.d, &st.loop)) goto fail_loop;
  if (kvd_ops_start(&st.ops, &st.d, &st.loop)) goto fail_server;
  sources_start(&st);
  ready(&st);
  uv_run(&st.loop, UV_RUN_DEFAULT);

  /* Stop accepting, send what is owed, release every session. The tick
   * goes with the operator sockets: nothing expires during the drain. */
  kvd_ops_stop(&st.ops);
  uv_close((uv_handle_t *)&st.tick, NULL);
  kvd_server_stop_listening(&st.srv);
  kvd_defer_cancel_all(&st.d.alloc_wait); /* answered -ECANCELED while their connections are open */
  kvd_server_close_all(&st.srv, 1000);
  sources_stop(&st);
  uv_run(&st.loop, UV_RUN_DEFAULT);
  uv_loop_close(&st.loop);
  kvd_fini(&st.d);
  kv_info("daemon", "stopped cleanly");
  return 0;

fail_server:
  kvd_server_stop_listening(&st.srv);
  uv_run(&st.loop, UV_RUN_NOWAIT);
fail_loop:
  uv_loop_close(&st.loop);
  kvd_fini(&st.d);
  return 1;
}
