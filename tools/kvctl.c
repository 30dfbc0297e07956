/*
 * kvctl.c - the operator's tool for kvcached.
 *
 * Exit status, for scripts: 0 success, 1 the command failed, 2 bad usage.
 */
#include <stdio.h>
#include <string.h>

#include "daemon/config.h"
#include "tiers/evict.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: kvctl COMMAND [args]\n"
          "commands:\n"
          "  version              print kvctl's version\n"
          "  policies             list the eviction policies this build has\n"
          "  check-config FILE    validate a kvcached configuration file\n");
}

static int cmd_check_config(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: kvctl check-config FILE\n");
    return 2;
  }
  kv_config c;
  char err[256];
  kv_config_defaults(&c);
  if (kv_config_load(&c, argv[1], err, sizeof err) || kv_config_validate(&c, err, sizeof err)) {
    fprintf(stderr, "kvctl: %s\n", err);
    return 1;
  }
  printf("%s: ok\n", argv[1]);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) { usage(stderr); return 2; }
  const char *cmd = argv[1];
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) { usage(stdout); return 0; }
  if (!strcmp(cmd, "version")) { printf("kvctl %s\n", KV_VERSION); return 0; }
  if (!strcmp(cmd, "policies")) {
    for (int i = 0; kv_evict_policies[i]; i++)
      printf("%-8s %s%s\n", kv_evict_policies[i]->name, kv_evict_policies[i]->summary,
             strcmp(kv_evict_policies[i]->name, kv_evict_default) ? "" : " [default]");
    return 0;
  }
  if (!strcmp(cmd, "check-config")) return cmd_check_config(argc - 1, argv + 1);
  fprintf(stderr, "kvctl: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}
