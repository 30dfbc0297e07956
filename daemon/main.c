/*
 * main.c - kvcached: the command line. The daemon's life is kvd_main's
 * (daemon/kvd.c).
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
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/log.h"
#include "daemon/config.h"
#include "daemon/kvd.h"

/* The heap keeps what it freed, up to HEAP_KEEP bytes at its top, and
 * serves from it every allocation under HEAP_MMAP_MIN (glibc's own choice
 * moves with the sizes freed, and gives memory back as soon as 2x the
 * largest lies free at the top). The daemon's large buffers come and go in
 * bursts: a LOOKUP that reads G4 holds up to g4.lookup_blocks values of a
 * block each (hiredis' reply strings and its read buffer), all freed when
 * it is answered; with glibc's choice each burst gave its pages back and
 * the next one took them again, a page fault and a cleared page per 4 KiB
 * (a sixth of loads' time from G4 at 1 MiB blocks: tiers/G4.md). What the
 * daemon holds longer (the G2 arena, the index, G3's buffers) is mapped on
 * its own and not counted here. */
#define HEAP_KEEP     (64u << 20)
#define HEAP_MMAP_MIN (32u << 20) /* glibc's largest: a block bigger than this is mapped */

/* What the command line says: the configuration, and its file if any. */
typedef struct args {
  kv_config cfg;
  const char *config_path;
} args;

static void usage(FILE *f) {
  fprintf(f, "usage: kvcached [options]\n"
             "  -c, --config FILE       read options from FILE (INI; see deploy/kvcached.conf)\n"
             "  -o, --set SECTION.NAME=VALUE  set any option (tenant.NAME.KEY=VALUE too)\n"
             "      --print-config      print the effective configuration and exit\n"
             "      --foreground        stay in the foreground (always the case; for\n"
             "                          service managers that pass it)\n"
             "  -V, --version           print the version and exit\n"
             "  -h, --help              this text\n"
             "\n");
  kv_config_usage(f);
}

/* A finding of kv_config_check, logged (kvctl check-config prints the same text). */
static void log_finding(void *arg, kv_cfg_level level, const char *msg) {
  if (level == KV_CFG_REFUSE) kv_error("config", "%s", msg);
  else kv_warn("config", "%s", msg);
}

static int parse_args(args *d, int argc, char **argv) {
  enum { OPT_PRINT = 256, OPT_FG, OPT_TABLE /* + an option's index in the table */ };
  static const struct option fixed[] = {{"config", required_argument, 0, 'c'},
                                        {"set", required_argument, 0, 'o'},
                                        {"print-config", no_argument, 0, OPT_PRINT},
                                        {"foreground", no_argument, 0, OPT_FG},
                                        {"version", no_argument, 0, 'V'},
                                        {"help", no_argument, 0, 'h'}};
  enum { NFIXED = sizeof fixed / sizeof fixed[0] };
  struct option lo[NFIXED + 128];
  char err[256];
  int print = 0, ch;
  memcpy(lo, fixed, sizeof fixed);
  if (kv_config_getopt(lo + NFIXED, sizeof lo / sizeof lo[0] - NFIXED, OPT_TABLE) < 0) {
    fprintf(stderr, "kvcached: the option table has more flags than fit\n");
    return 1;
  }
  kv_config_defaults(&d->cfg);

  /* First pass: the configuration file, so that flags override it. */
  opterr = 0;
  while ((ch = getopt_long(argc, argv, "c:o:Vh", lo, NULL)) != -1)
    if (ch == 'c') d->config_path = optarg;
  opterr = 1;
  optind = 0;
  if (d->config_path && kv_config_load(&d->cfg, d->config_path, err, sizeof err)) {
    fprintf(stderr, "kvcached: %s\n", err);
    return 1;
  }

  while ((ch = getopt_long(argc, argv, "c:o:Vh", lo, NULL)) != -1) {
    int rc = 0;
    switch (ch) {
    case 'c': break;
    case 'o': {
      char *eq = strchr(optarg, '=');
      if (!eq) {
        snprintf(err, sizeof err, "--set wants SECTION.NAME=VALUE");
        rc = -EINVAL;
        break;
      }
      *eq = 0;
      rc = kv_config_set(&d->cfg, optarg, eq + 1, err, sizeof err);
      break;
    }
    case OPT_PRINT: print = 1; break;
    case OPT_FG: break;
    case 'V': printf("kvcached %s\n", KV_VERSION); exit(0);
    case 'h': usage(stdout); exit(0);
    default:
      if (ch < OPT_TABLE) {
        usage(stderr);
        return 2;
      }
      rc = kv_config_set_index(&d->cfg, ch - OPT_TABLE, optarg, err, sizeof err);
      break;
    }
    if (rc) {
      fprintf(stderr, "kvcached: %s\n", err);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "kvcached: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  /* Nothing is built before the configuration has passed every check
   * (config.h), against this machine too unless it is only printed. */
  kv_log_threshold = d->cfg.log_level;
  if (kv_config_check(&d->cfg, print ? 0 : KV_CFG_CHECK_MACHINE, log_finding, NULL)) {
    kv_error("config", "configuration refused: not starting");
    return 2;
  }
  if (print) {
    kv_config_print(&d->cfg, stdout);
    exit(0);
  }
  return 0;
}

int main(int argc, char **argv) {
  static args a;
  int rc = parse_args(&a, argc, argv);
  if (rc) return rc;
  kv_log_threshold = a.cfg.log_level;
  if (!mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_MIN) || !mallopt(M_TRIM_THRESHOLD, HEAP_KEEP))
    kv_info("daemon", "the heap's thresholds were not taken (another allocator): its own stay");
  kv_info("daemon", "kvcached %s starting (pid %d)", KV_VERSION, (int)getpid());
  return kvd_main(&a.cfg, a.config_path);
}
