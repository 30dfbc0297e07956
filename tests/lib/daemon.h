/*
 * daemon.h - the one launcher of kvcached for the tests: the daemon built
 * beside the running program (bin/kvcached; $KVCACHED_BIN overrides), with
 * any command-line words, --set values and configuration text, on an
 * existing directory or a fresh one under /tmp. The child dies with the
 * test (PR_SET_PDEATHSIG). No criterion here: functions return a status,
 * and print why they failed on stderr.
 */
#ifndef KV_TESTS_LIB_DAEMON_H
#define KV_TESTS_LIB_DAEMON_H

#include <sys/resource.h>
#include <sys/types.h>

#define KVT_ARGS_MAX 96

typedef struct kvt_daemon_opts {
  const char *dir; /* socket directory, existing; NULL: a fresh one (removed by kvt_daemon_free) */
  const char
      *config; /* INI text, written to DIR/kvcached.conf and read with --config; may be NULL */
  const char *const *args; /* further command-line words, NULL-terminated; may be NULL */
  const char *const *sets; /* values each given as --set VALUE, NULL-terminated; may be NULL */
  rlim_t nofile;           /* nonzero: the daemon's RLIMIT_NOFILE (soft and hard) */
  int wait_ms;             /* how long it may take to serve; 0: 5000 */
} kvt_daemon_opts;

typedef struct kvt_daemon {
  char dir[128];   /* --socket-dir */
  char sock[192];  /* DIR/KV_SOCKET_NAME, the worker socket */
  char stats[192]; /* DIR/KV_STATS_SOCKET_NAME */
  char admin[192]; /* DIR/KV_ADMIN_SOCKET_NAME */
  pid_t pid;       /* > 0 while it runs */
  int own_dir;     /* dir was made by kvt_daemon_start */
  rlim_t nofile;
  int wait_ms;
  int argc;
  char *argv[KVT_ARGS_MAX + 1]; /* kept for kvt_daemon_restart */
} kvt_daemon;

/* Starts kvcached --socket-dir DIR [--config DIR/kvcached.conf] ARGS...
 * [--set S]... and waits until its admin socket accepts (bound last, after
 * the worker socket; waiting takes no worker connection). 0 once it
 * serves; its exit status (> 0; 128 + signal) when it exits before it does
 * (d->pid 0, a fresh directory removed); -errno when it could not be run
 * or did not serve in time (then killed). d needs no initialisation. */
int kvt_daemon_start(kvt_daemon *d, const kvt_daemon_opts *o);

/* Runs it again with the same words in the same directory (after a stop
 * or kill). As kvt_daemon_start. */
int kvt_daemon_restart(kvt_daemon *d);

/* Sends sig and waits for the exit; the directory stays. The wait status,
 * or -ECHILD when it was not running. */
int kvt_daemon_kill(kvt_daemon *d, int sig);

/* SIGTERM and wait. 0 when it exited with status 0 (or was not running),
 * else 1. The directory stays. */
int kvt_daemon_stop(kvt_daemon *d);

/* Kills it (SIGKILL) if it still runs, removes the directory when the
 * launcher made it, and frees the kept words. */
void kvt_daemon_free(kvt_daemon *d);

#endif
