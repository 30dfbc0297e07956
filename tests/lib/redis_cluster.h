/*
 * redis_cluster.h - a real Redis Cluster for the G4 tests, on loopback in a
 * temporary directory, driven through tests/lib/redis_cluster.sh (which
 * says how nodes are configured). A watchdog started with it stops every
 * node when the test process ends, however it ends.
 */
#ifndef KV_TESTS_LIB_REDIS_CLUSTER_H
#define KV_TESTS_LIB_REDIS_CLUSTER_H

#include <hiredis/hiredis.h>
#include <sys/types.h>

#define KVT_RC_NODES_MAX 16

typedef struct kvt_rc {
  char dir[256];    /* the temporary directory, removed by kvt_rc_stop */
  char script[512]; /* redis_cluster.sh */
  int nports;
  int ports[KVT_RC_NODES_MAX]; /* masters first, as created */
  char why[256];    /* why start skipped or failed */
} kvt_rc;

/* Starts a cluster; opts are more options of `redis_cluster.sh start`
 * ("--masters 3 --replicas 1", "--password pw", or ""). src_dir is the
 * source tree (KV_SOURCE_DIR). 0; 77 when redis is not installed (rc->why
 * says so: the test skips); -1 on failure (rc->why). */
int kvt_rc_start(kvt_rc *rc, const char *src_dir, const char *opts);

/* Runs `redis_cluster.sh VERB DIR [port]` (kill, start-node, wait-ok, stop;
 * port 0 for none). Its exit status. */
int kvt_rc_do(kvt_rc *rc, const char *verb, int port);

/* Stops every node and removes the directory. */
void kvt_rc_stop(kvt_rc *rc);

/* For criterion tests (redis_cluster_cr.c; a failure fails the test):
 * one command on node port of 127.0.0.1, blocking (hiredis' own client),
 * AUTH password first when it is not NULL; its reply, which the caller
 * frees. */
redisReply *kvt_rc_adm(int port, const char *password, const char *fmt, ...);
/* The port of the master serving slot, as node port's CLUSTER SLOTS says;
 * 0: none. */
int kvt_rc_slot_owner(int port, const char *password, unsigned slot);
/* The pid of rc's node on port (its pid file). */
pid_t kvt_rc_node_pid(const kvt_rc *rc, int port);

#endif
