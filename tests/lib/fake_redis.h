/*
 * fake_redis.h - a scripted, hostile Redis Cluster node for the G4
 * client's tests: a thread serving 127.0.0.1 on an ephemeral port, one
 * more thread per connection, speaking enough RESP for kv_g4c (CLUSTER
 * SLOTS, GET, SET, READONLY, ASKING, AUTH, PING; anything else gets an
 * error). Keys live in memory (GET and SET). What it answers is the
 * script's, changed at any time.
 *
 * The addresses it makes up ("a new address each time") are 127.A.B.C on
 * its own port, A >= 1: loopback addresses where nothing listens, so a
 * connection to one is refused at once.
 *
 * Floods (flood, huge_bulk) are streamed as they are sent, never held
 * whole: the fake's own memory stays small whatever it announces; the
 * stream ends when the connection goes (or at its end).
 */
#ifndef KV_TESTS_LIB_FAKE_REDIS_H
#define KV_TESTS_LIB_FAKE_REDIS_H

typedef struct kvt_fake kvt_fake;

typedef struct kvt_fake_script {
  /* CLUSTER SLOTS. ranges 0: one range 0..16383 served by slots_host on
   * the fake's port. ranges N > 0: N one-slot ranges (range i is slot
   * i % 16384, so past 16384 they repeat), range i's master the made-up
   * address number i % nodes (nodes 0: the fake itself). */
  unsigned ranges, nodes;
  const char *slots_host; /* the fake's own name in the map; NULL: 127.0.0.1 */
  int bad_range;          /* 1: a range 0..16384; 2: two ranges that overlap */
  /* GET and SET */
  int moved;              /* -MOVED <the key's slot> <a new address each time> */
  const char *moved_host; /* -MOVED <the key's slot> moved_host:<the fake's port> */
  /* CLUSTER SLOTS flooded with `flood` integer elements (streamed): flat,
   * one array of them; nested, arrays of 320 of them (as many as needed) */
  unsigned long flood;
  int flood_nested;
  /* GET: a string announcing huge_bulk bytes ("$4294967296"), its bytes
   * then trickled, 16 KiB every 5 ms */
  unsigned long long huge_bulk;
  /* GET: an error line of long_error bytes, "-ERR xxx...", at once */
  unsigned long long long_error;
  /* GET and SET: "+OK" after the answer, a reply to no command */
  int unsolicited;
} kvt_fake_script;

/* Starts a fake node (answering as the default script: all zeros). 0 and
 * *out, or -errno. */
int kvt_fake_start(kvt_fake **out);
int kvt_fake_port(const kvt_fake *f);
/* The script from now on (strings copied). */
void kvt_fake_set(kvt_fake *f, const kvt_fake_script *s);
/* How many commands named cmd ("CLUSTER", "GET", ...) it has answered. */
unsigned long kvt_fake_count(kvt_fake *f, const char *cmd);
/* Bytes its floods sent, over its life. */
unsigned long long kvt_fake_streamed(kvt_fake *f);
/* Made-up address number i ("127.A.B.C"), into out[0..n). */
void kvt_fake_addr(unsigned i, char *out, unsigned n);
/* Closes every connection, joins the threads, frees f. */
void kvt_fake_stop(kvt_fake *f);

#endif
