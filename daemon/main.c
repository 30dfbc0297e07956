/*
 * main.c - kvcached: start-up, the event loop, signals, shutdown.
 *
 * Start-up reads the configuration (defaults, then --config FILE, then
 * flags), brings up the tiers it configures (G2 always; G1 when a CUDA
 * device answers), logs one "ready" line, and runs the libuv loop until
 * SIGTERM or SIGINT. SIGHUP re-reads the configuration file and applies
 * what can change live. Exit status: 0 on a clean stop, 1 on a start-up
 * failure, 2 on bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "cuda/gpu.h"
#include "daemon/config.h"
#include "daemon/log.h"
#include "proto/errors.h"
#include "tiers/arena.h"
#include "tiers/core.h"

typedef struct daemon_state {
  kv_config cfg;
  const char *config_path;
  kv_arena g2;
  kv_core core;
  uv_loop_t loop;
  uv_signal_t sigterm, sigint, sighup;
} daemon_state;

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvcached [options]\n"
          "  -c, --config FILE       read options from FILE (INI; see deploy/kvcached.conf)\n"
          "      --g2-capacity SIZE  bytes of G2 host memory (K/M/G suffixes)\n"
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
  memcpy(d->cfg.log_level, fresh.log_level, sizeof fresh.log_level);
  if (fresh.g2_capacity != d->cfg.g2_capacity || strcmp(fresh.policy, d->cfg.policy))
    kv_warn("daemon", "SIGHUP: g2.capacity and cache.policy change only on restart");
  kv_info("daemon", "SIGHUP: configuration re-read (log.level=%s)", fresh.log_level);
}

static int parse_args(daemon_state *d, int argc, char **argv) {
  enum { OPT_G2CAP = 256, OPT_POLICY, OPT_LOGLEVEL, OPT_PRINT, OPT_FG };
  static const struct option lo[] = {
      {"config", required_argument, 0, 'c'},
      {"g2-capacity", required_argument, 0, OPT_G2CAP},
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
  kv_config_defaults(&d->cfg);

  /* First pass: the configuration file, so that flags override it. */
  for (int i = 1; i < argc; i++) {
    if ((!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config")) && i + 1 < argc)
      d->config_path = argv[i + 1];
    else if (!strncmp(argv[i], "--config=", 9))
      d->config_path = argv[i] + 9;
  }
  if (d->config_path && kv_config_load(&d->cfg, d->config_path, err, sizeof err)) {
    fprintf(stderr, "kvcached: %s\n", err);
    return 1;
  }

  int ch;
  while ((ch = getopt_long(argc, argv, "c:o:Vh", lo, NULL)) != -1) {
    int rc = 0;
    switch (ch) {
    case 'c': break;
    case OPT_G2CAP: rc = kv_config_set(&d->cfg, "g2.capacity", optarg, err, sizeof err); break;
    case OPT_POLICY: rc = kv_config_set(&d->cfg, "cache.policy", optarg, err, sizeof err); break;
    case OPT_LOGLEVEL: rc = kv_config_set(&d->cfg, "log.level", optarg, err, sizeof err); break;
    case 'o': {
      char *eq = strchr(optarg, '=');
      if (!eq) { snprintf(err, sizeof err, "--set wants SECTION.NAME=VALUE"); rc = -EINVAL; break; }
      *eq = 0;
      rc = kv_config_set(&d->cfg, optarg, eq + 1, err, sizeof err);
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
  if (kv_config_validate(&d->cfg, err, sizeof err)) {
    fprintf(stderr, "kvcached: %s\n", err);
    return 2;
  }
  if (print) {
    kv_config_print(&d->cfg, stdout);
    exit(0);
  }
  return 0;
}

int main(int argc, char **argv) {
  static daemon_state d;
  int rc = parse_args(&d, argc, argv);
  if (rc) return rc;
  kv_log_threshold = kv_log_parse_level(d.cfg.log_level);
  kv_info("daemon", "kvcached %s starting (pid %d)", KV_VERSION, (int)getpid());

  kv_gpu_info gpu;
  kv_gpu_probe(&gpu);
  if (gpu.ndev > 0)
    kv_info("g1", "%d CUDA device(s) found", gpu.ndev);
  else
    kv_info("g1", "G1 disabled: %s", gpu.reason);

  kv_arena_opts ao = {.capacity = d.cfg.g2_capacity,
                      .page_bytes = d.cfg.g2_page_size,
                      .no_lock = !d.cfg.g2_lock};
  rc = kv_arena_init(&d.g2, &ao);
  if (rc) {
    kv_error("g2", "cannot create the G2 arena of %llu bytes: %s",
             (unsigned long long)d.cfg.g2_capacity, kv_strerror(rc));
    return 1;
  }
  kv_core_opts co = {.policy = d.cfg.policy};
  rc = kv_core_init(&d.core, &co);
  if (rc) {
    kv_error("core", "cannot start the cache core: %s", kv_strerror(rc));
    kv_arena_fini(&d.g2);
    return 1;
  }

  uv_loop_init(&d.loop);
  uv_signal_init(&d.loop, &d.sigterm);
  uv_signal_init(&d.loop, &d.sigint);
  uv_signal_init(&d.loop, &d.sighup);
  d.sighup.data = &d;
  uv_signal_start(&d.sigterm, on_stop, SIGTERM);
  uv_signal_start(&d.sigint, on_stop, SIGINT);
  uv_signal_start(&d.sighup, on_hup, SIGHUP);

  kv_info("daemon", "ready: G2 %zu bytes in %u pages of %zu (%s), policy %s",
          d.g2.capacity, d.g2.npages, d.g2.page_bytes,
          d.g2.locked ? "locked" : "not locked", d.core.policy->name);
  uv_run(&d.loop, UV_RUN_DEFAULT);

  uv_close((uv_handle_t *)&d.sigterm, NULL);
  uv_close((uv_handle_t *)&d.sigint, NULL);
  uv_close((uv_handle_t *)&d.sighup, NULL);
  uv_run(&d.loop, UV_RUN_DEFAULT);
  uv_loop_close(&d.loop);
  kv_core_fini(&d.core);
  kv_arena_fini(&d.g2);
  kv_info("daemon", "stopped cleanly");
  return 0;
}
