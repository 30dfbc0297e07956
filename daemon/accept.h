/*
 * accept.h - accepting connections when descriptors run out, and the
 * daemon's descriptor budget.
 *
 * A listening socket polled level-triggered whose accept() fails with
 * EMFILE or ENFILE stays readable - the connection waits in the backlog -
 * so the loop calls the handler again at once, forever: a core at 100%
 * and nothing else served. The daemon keeps one reserve descriptor (on
 * /dev/null). At the limit kvd_accept() closes it, accepts the waiting
 * connection into the freed slot, hands it to the caller to be told why
 * (one short non-blocking write), closes it and takes the reserve again:
 * the connection is refused instead of left waiting, and the listener is
 * drained. An error this cannot clear (no reserve, or another accept
 * error) is returned as it is; the caller then stops polling the listener
 * for a while (its sweep timer starts it again).
 *
 * The budget keeps worker connections from taking the descriptors the
 * operator sockets, G3 and the daemon's own files need (kvd_fd_budget()),
 * and the worker socket re-reads it every second, so a limit lowered under
 * the running daemon lowers it too. And because descriptors can run out
 * anyway (the limit lowered below what is open, another thread's files),
 * the operator sockets have reserved descriptors of their own:
 * KVD_FD_OPS_RESERVE more held on /dev/null. At the limit an operator
 * listener spends one of them for the connection waiting (kvd_fd_ops_room,
 * its kvd_room_fn), so /health and /metrics answer however many the
 * workers took; the pool is filled again as descriptors come back
 * (kvd_fd_ops_refill: after an operator connection closes, and each
 * sweep). Everything runs on the loop's thread.
 */
#ifndef KV_DAEMON_ACCEPT_H
#define KV_DAEMON_ACCEPT_H

#include <stdint.h>

/* Descriptors kept beside worker connections and the operator sockets'
 * connections: G3's files, io_uring, LMDB, logging, fds in flight. */
#define KVD_FD_SPARE 32

/* Operator connections served when every other descriptor is taken. */
#define KVD_FD_OPS_RESERVE 4

/* Takes the reserve descriptor if it is not held, and fills the operator
 * pool. 0 or -errno (the first that could not be had). */
int kvd_fd_reserve_init(void);
/* Gives them back (tests). */
void kvd_fd_reserve_fini(void);
/* Descriptors held in the operator pool now (0..KVD_FD_OPS_RESERVE). */
unsigned kvd_fd_ops_held(void);
/* A kvd_room_fn for the operator listeners: closes one descriptor of the
 * pool (1), or 0 when the pool is empty. */
int kvd_fd_ops_room(void *arg);
/* Fills the pool again as far as descriptors allow. */
void kvd_fd_ops_refill(void);

/* Called at the descriptor limit before the reserve is spent: 1 if it
 * closed a descriptor of the caller's (then the accept is tried again). */
typedef int (*kvd_room_fn)(void *arg);
/* Called with a connection refused at the descriptor limit, before it is
 * closed: a short non-blocking write may tell the peer why. */
typedef void (*kvd_refuse_fn)(void *arg, int fd);

/*
 * Accepts one connection from the non-blocking listener lfd; the new fd is
 * close-on-exec and non-blocking. At the descriptor limit room (may be
 * NULL) is asked first to free one. Returns the fd; -EAGAIN when none
 * waits; -EMFILE or -ENFILE when descriptors ran out and one waiting
 * connection was taken with the reserve, given to refuse (may be NULL) and
 * closed - the caller counts it and calls again; or -EMFILE/-ENFILE/-errno
 * with nothing taken (no reserve to spend, or another error): the caller
 * must stop polling lfd for a while, or it would spin. *shed (may be NULL)
 * is set to 1 when a connection was refused, else 0.
 */
int kvd_accept(int lfd, kvd_room_fn room, kvd_refuse_fn refuse, void *arg, int *shed);

/* Descriptors this process has open now (from /proc/self/fd), or -errno. */
int kvd_fds_open(void);

/*
 * How many worker connections fit in the descriptor limit beside `others`
 * descriptors for everything else (the open ones, the operator sockets'
 * connections, KVD_FD_SPARE): at most `want`. When RLIMIT_NOFILE's soft
 * limit is below others + want, it is first raised toward the hard limit
 * (logged). Returns the count (0 when nothing is left), or -errno.
 */
int64_t kvd_fd_budget(uint64_t others, uint64_t want);

#endif
