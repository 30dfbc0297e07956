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
/* The block index and the default policy at 10^4..10^7 blocks (bench_scale.c). */
int kvbench_scale(int argc, char **argv);

/* Shared by the benchmarks of a running daemon (bench_daemon.c). */
#include <stddef.h>
#include <stdint.h>
struct kvc;
double kvb_now_s(void);   /* CLOCK_MONOTONIC */
uint64_t kvb_now_ns(void);
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

#endif
