/* kvbench.h - the subcommands of kvbench, one file each. */
#ifndef KV_TOOLS_KVBENCH_H
#define KV_TOOLS_KVBENCH_H

int kvbench_core_replay(int argc, char **argv);
int kvbench_g3(int argc, char **argv);
/* Against a running kvcached (bench_daemon.c), and the plain-memory
 * reference for `load`. */
int kvbench_lookup(int argc, char **argv);
int kvbench_load(int argc, char **argv);
int kvbench_store(int argc, char **argv);
int kvbench_memcpy(int argc, char **argv);
/* Blocks demoted to G3, then LOADed back (bench_daemon.c). */
int kvbench_swapin(int argc, char **argv);
/* A Mooncake trace replayed through a running kvcached (bench_replay.c). */
int kvbench_replay(int argc, char **argv);
/* Lookups from the presence table beside the daemon's and Redis's (bench_presence.c). */
int kvbench_presence(int argc, char **argv);
/* The block index and the default policy at 10^4..10^7 blocks (bench_scale.c). */
int kvbench_scale(int argc, char **argv);

/* Shared by the benchmarks of a running daemon (bench_daemon.c). */
#include <stddef.h>
#include <stdint.h>
struct kvc;
int kvb_cmp_u64(const void *a, const void *b); /* for qsort */
/* A session on `socket` (NULL: the default) for tenant and a layout of
 * one u8 layer of block_bytes, with a 30 s timeout; kvc_open()'s result. */
int kvb_open(const char *socket, const char *tenant, uint32_t block_bytes,
             uint32_t tokens_per_block, struct kvc **out);
/* Says on stderr why a session could not be opened (and whether the
 * daemon is running). */
void kvb_say_open_error(const char *cmd, const char *socket, int rc);
/* dst = arg, or arg/kvcached.sock when is_dir; -ENAMETOOLONG (said on
 * stderr) if it does not fit. */
int kvb_socket_opt(char *dst, size_t cap, int is_dir, const char *arg, const char *cmd);

/* The client processes of one run (bench_clients.c). */
#define KVB_MAX_CLIENTS 64
typedef struct kvb_sync {
  int ready_w, go_r;
  int passed;
} kvb_sync;
/* In a client: says it is ready (set up, or failed), then waits for the
 * start. Once per client; later calls return at once. */
void kvb_sync_wait(kvb_sync *s);
typedef struct kvb_clients_ops {
  /* Runs in client i (a forked process), calls kvb_sync_wait(s) once set
   * up (or failed), and returns its exit status: 0 when it succeeded. */
  int (*child)(void *arg, uint32_t i, kvb_sync *s);
  /* In the parent once every client is ready, before the start; may be NULL. */
  void (*all_ready)(void *arg);
  /* Why client i failed (its own words), or NULL; may be NULL. */
  const char *(*why)(void *arg, uint32_t i);
} kvb_clients_ops;
/* Forks n (at most KVB_MAX_CLIENTS) clients, starts them together, waits
 * for them all; *elapsed (may be NULL) gets the seconds from the start to
 * the last exit. 0, or -1 when one could not start or failed (said on
 * stderr, prefixed with cmd). */
int kvb_run_clients(const char *cmd, uint32_t n, const kvb_clients_ops *ops, void *arg,
                    double *elapsed);

#endif
