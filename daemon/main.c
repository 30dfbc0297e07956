/*
 * main.c - kvcached: start-up, the event loop, signals, shutdown.
 *
 * Start-up reads the configuration (defaults, then --config FILE, then
 * flags), brings up the tiers it configures (G2 always; G1 when a CUDA
 * device answers; G3 when it can be opened, else it runs without it and
 * says why: daemon/g3_watch.h), listens on the worker socket, then on the stats and
 * admin sockets (daemon/OPS.md), logs one "ready" line, tells systemd
 * (sd_notify READY=1; STOPPING=1 when asked to stop), and runs the libuv
 * loop until SIGTERM or SIGINT. SIGHUP re-reads the configuration file and applies
 * what can change live. Exit status: 0 on a clean stop, 1 on a start-up
 * failure, 2 on bad usage or a configuration kv_config_check refuses (before
 * anything is created).
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include <systemd/sd-daemon.h>

#include "daemon/admin.h"
#include "daemon/config.h"
#include "daemon/kvd.h"
#include "base/log.h"
#include "daemon/server.h"
#include "base/errors.h"

typedef struct daemon_state {
  kvd d;
  const char *config_path;
  kvd_server srv;
  kvd_ops ops;
  uv_loop_t loop;
  uv_signal_t sigterm, sigint, sighup;
} daemon_state;

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvcached [options]\n"
          "  -c, --config FILE       read options from FILE (INI; see deploy/kvcached.conf)\n"
          "      --socket-dir DIR    directory of the worker socket\n"
          "      --g2-capacity SIZE  bytes of G2 host memory (K/M/G suffixes)\n"
          "      --g3-path DIRS      SSD tier directories, comma-separated ('' for none)\n"
          "      --g3-capacity SIZE  bytes of SSD per G3 directory\n"
          "      --policy NAME       eviction policy\n"
          "      --log-level LEVEL   debug, info, warn or error\n"
          "  -o, --set SECTION.NAME=VALUE  set any option\n"
          "      --print-config      print the effective configuration and exit\n"
          "      --foreground        stay in the foreground (always the case; for\n"
          "                          service managers that pass it)\n"
          "  -V, --version           print the version and exit\n"
          "  -h, --help              this text\n");
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
  kv_log_threshold = kv_log_parse_level(fresh.log_level);
  memcpy(d->d.cfg.log_level, fresh.log_level, sizeof fresh.log_level);
  if (fresh.g2_capacity != d->d.cfg.g2_capacity || strcmp(fresh.policy, d->d.cfg.policy))
    kv_warn("daemon", "SIGHUP: g2.capacity and cache.policy change only on restart");
  if (fresh.ntenants != d->d.cfg.ntenants ||
      memcmp(fresh.tenants, d->d.cfg.tenants, fresh.ntenants * sizeof fresh.tenants[0]))
    kv_warn("daemon", "SIGHUP: [tenant.NAME] sections change only on restart: the running ones stay");
  kv_info("daemon", "SIGHUP: configuration re-read (log.level=%s)", fresh.log_level);
}

/* A finding of kv_config_check, logged (kvctl check-config prints the same text). */
static void log_finding(void *arg, kv_cfg_level level, const char *msg) {
  if (level == KV_CFG_REFUSE) kv_error("config", "%s", msg);
  else kv_warn("config", "%s", msg);
}

static int parse_args(daemon_state *d, int argc, char **argv) {
  enum { OPT_G2CAP = 256, OPT_POLICY, OPT_LOGLEVEL, OPT_PRINT, OPT_FG, OPT_SOCKDIR, OPT_G3PATH,
         OPT_G3CAP };
  static const struct option lo[] = {
      {"config", required_argument, 0, 'c'},
      {"g2-capacity", required_argument, 0, OPT_G2CAP},
      {"socket-dir", required_argument, 0, OPT_SOCKDIR},
      {"g3-path", required_argument, 0, OPT_G3PATH},
      {"g3-capacity", required_argument, 0, OPT_G3CAP},
      {"policy", required_argument, 0, OPT_POLICY},
      {"log-level", required_argument, 0, OPT_LOGLEVEL},
      {"set", required_argument, 0, 'o'},
      {"print-config", no_argument, 0, OPT_PRINT},
      {"foreground", no_argument, 0, OPT_FG},
      {"version", no_argument, 0, 'V'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  char err[256];
  int print = 0;
  kv_config_defaults(&d->d.cfg);

  /* First pass: the configuration file, so that flags override it. */
  for (int i = 1; i < argc; i++) {
    if ((!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config")) && i + 1 < argc)
      d->config_path = argv[i + 1];
    else if (!strncmp(argv[i], "--config=", 9))
      d->config_path = argv[i] + 9;
  }
  if (d->config_path && kv_config_load(&d->d.cfg, d->config_path, err, sizeof err)) {
    fprintf(stderr, "kvcached: %s\n", err);
    return 1;
  }

  int ch;
  while ((ch = getopt_long(argc, argv, "c:o:Vh", lo, NULL)) != -1) {
    int rc = 0;
    switch (ch) {
    case 'c': break;
    case OPT_G2CAP: rc = kv_config_set(&d->d.cfg, "g2.capacity", optarg, err, sizeof err); break;
    case OPT_G3PATH: rc = kv_config_set(&d->d.cfg, "g3.path", optarg, err, sizeof err); break;
    case OPT_G3CAP: rc = kv_config_set(&d->d.cfg, "g3.capacity", optarg, err, sizeof err); break;
    case OPT_SOCKDIR: rc = kv_config_set(&d->d.cfg, "daemon.socket_dir", optarg, err, sizeof err); break;
    case OPT_POLICY: rc = kv_config_set(&d->d.cfg, "cache.policy", optarg, err, sizeof err); break;
    case OPT_LOGLEVEL: rc = kv_config_set(&d->d.cfg, "log.level", optarg, err, sizeof err); break;
    case 'o': {
      char *eq = strchr(optarg, '=');
      if (!eq) { snprintf(err, sizeof err, "--set wants SECTION.NAME=VALUE"); rc = -EINVAL; break; }
      *eq = 0;
      rc = kv_config_set(&d->d.cfg, optarg, eq + 1, err, sizeof err);
      break;
    }
    case OPT_PRINT: print = 1; break;
    case OPT_FG: break;
    case 'V': printf("kvcached %s\n", KV_VERSION); exit(0);
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); return 2;
    }
    if (rc) { fprintf(stderr, "kvcached: %s\n", err); return 2; }
  }
  if (optind < argc) {
    fprintf(stderr, "kvcached: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  /* Nothing is built before the configuration has passed every check
   * (config.h), against this machine too unless it is only printed. */
  int lvl = kv_log_parse_level(d->d.cfg.log_level);
  if (lvl >= 0) kv_log_threshold = lvl;
  if (kv_config_check(&d->d.cfg, print ? 0 : KV_CFG_CHECK_MACHINE, log_finding, NULL)) {
    kv_error("config", "configuration refused: not starting");
    return 2;
  }
  if (print) {
    kv_config_print(&d->d.cfg, stdout);
    exit(0);
  }
  return 0;
}

int main(int argc, char **argv) {
  static daemon_state st;
  int rc = parse_args(&st, argc, argv);
  if (rc) return rc;
  kv_log_threshold = kv_log_parse_level(st.d.cfg.log_level);
  kv_info("daemon", "kvcached %s starting (pid %d)", KV_VERSION, (int)getpid());

  /* A file size limit fails the write (EFBIG: G3 turns full) rather than
   * killing the daemon. */
  signal(SIGXFSZ, SIG_IGN);
  if (kvd_init(&st.d)) return 1; /* G1 too: daemon/g1.h logs whether it is on */
  uv_loop_init(&st.loop);
  if (kvd_server_start(&st.srv, &st.d, &st.loop)) {
    kvd_fini(&st.d);
    uv_loop_close(&st.loop);
    return 1;
  }
  if (kvd_ops_start(&st.ops, &st.d, &st.loop)) {
    kvd_server_stop_listening(&st.srv);
    uv_run(&st.loop, UV_RUN_NOWAIT);
    kvd_fini(&st.d);
    return 1;
  }
  if ((rc = kvd_g1s_start(&st.d.g1, &st.loop)))
    kv_warn("g1", "cannot poll the device's completions: %s", uv_strerror(rc));
  if ((rc = kvd_g3w_start(&st.d, &st.loop)))
    kv_error("g3", "cannot watch the SSD tier: %s", uv_strerror(rc));
  uv_signal_init(&st.loop, &st.sigterm);
  uv_signal_init(&st.loop, &st.sigint);
  uv_signal_init(&st.loop, &st.sighup);
  st.sighup.data = &st;
  uv_signal_start(&st.sigterm, on_stop, SIGTERM);
  uv_signal_start(&st.sigint, on_stop, SIGINT);
  uv_signal_start(&st.sighup, on_hup, SIGHUP);

  uint64_t locked = 0, cap = 0;
  for (uint32_t i = 0; i < st.d.reg.ntenants; i++) {
    cap += st.d.reg.tenants[i].arena.capacity;
    locked += st.d.reg.tenants[i].arena.locked;
  }
  char g1desc[32] = "off";
  kvd_g1 *g1first = kvd_g1s_first(&st.d.g1);
  if (g1first)
    snprintf(g1desc, sizeof g1desc, "%s on %u device(s)",
             kv_dev_backend_name(kv_dev_backend_of(g1first->dev)), st.d.g1.on);
  kv_info("daemon", "ready: socket %s, G2 %llu bytes for %u tenant(s) (%s), G1 %s, G3 %s, policy %s",
          st.srv.lst.path, (unsigned long long)cap, st.d.reg.ntenants,
          locked == st.d.reg.ntenants ? "locked" : "not locked",
          g1desc,
          st.d.g3 ? st.d.cfg.g3_path : st.d.g3w.err ? "unavailable" : "off",
          kv_core_policy_name(st.d.core));
  kv_info("daemon", "operator sockets: %s (stats%s%s), %s (admin)", st.ops.stats.ulst.path,
          st.d.cfg.stats_listen[0] ? ", and TCP " : "", st.d.cfg.stats_listen, st.ops.admin.ulst.path);
  sd_notifyf(0, "READY=1\nSTATUS=serving %s; G2 %llu bytes, G3 %s, policy %s\nMAINPID=%d",
             st.srv.lst.path, (unsigned long long)cap,
             st.d.g3 ? "on" : st.d.g3w.err ? "unavailable" : "off",
             kv_core_policy_name(st.d.core), (int)getpid());
  uv_run(&st.loop, UV_RUN_DEFAULT);

  /* Stop accepting, send what is owed, release every session. */
  kvd_ops_stop(&st.ops);
  kvd_server_stop_listening(&st.srv);
  kvd_allocs_fini(&st.d);
  kvd_server_close_all(&st.srv, 1000);
  kvd_g1s_stop(&st.d.g1);
  kvd_g3w_stop(&st.d);
  uv_close((uv_handle_t *)&st.sigterm, NULL);
  uv_close((uv_handle_t *)&st.sigint, NULL);
  uv_close((uv_handle_t *)&st.sighup, NULL);
  uv_run(&st.loop, UV_RUN_DEFAULT);
  uv_loop_close(&st.loop);
  kvd_fini(&st.d);
  kv_info("daemon", "stopped cleanly");
  return 0;
}
