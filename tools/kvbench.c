/*
 * kvbench.c - kvcached's benchmarks. Each subcommand prints one JSON object
 * on stdout (with --json, compact) and a human summary on stderr.
 * Exit status: 0 done, 1 the benchmark failed, 2 bad usage.
 */
#include <stdio.h>
#include <string.h>

#include "tools/kvbench.h"

static const struct {
  const char *name, *summary;
  int (*fn)(int, char **);
} cmds[] = {
    {"core-replay", "replay a Mooncake trace through the cache core (no daemon)",
     kvbench_core_replay},
    {"g3", "G3 SSD tier write/read throughput; `g3 rebuild` rebuilds its index", kvbench_g3},
    {"lookup", "a running daemon: batched LOOKUP keys/s, single-key round trip", kvbench_lookup},
    {"load", "a running daemon: LOAD and copy out resident G2 blocks, GB/s", kvbench_load},
    {"store", "a running daemon: ALLOC, copy in, COMMIT, GB/s", kvbench_store},
    {"memcpy", "the reference for load: the same copies from plain memory", kvbench_memcpy},
    {"swapin", "a running daemon: LOAD blocks that were demoted to G3, GB/s", kvbench_swapin},
    {"replay", "a running daemon: replay a Mooncake trace with N worker processes", kvbench_replay},
    {"presence", "a running daemon: lookups from the presence table, the daemon, Redis GET",
     kvbench_presence},
    {"scale", "index and policy at 10^4..10^7 blocks: lookup ns, bytes per block", kvbench_scale},
};

static void usage(FILE *f) {
  fprintf(f, "usage: kvbench COMMAND [options]   (kvbench COMMAND --help)\n\ncommands:\n");
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    fprintf(f, "  %-12s %s\n", cmds[i].name, cmds[i].summary);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
    usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 1, argv + 1);
  fprintf(stderr, "kvbench: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
