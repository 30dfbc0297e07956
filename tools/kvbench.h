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

#endif
