/*
 * g3_internal.h - what the G3 store's own files share: the store structure,
 * an operation, the I/O engine interface, and the internal functions of the
 * commit pipeline, the files, the LMDB index and the rebuild scan. Not a
 * public header: only tiers/g3*.c and the G3 tests include it.
 *
 * Who touches what:
 *   caller thread  - the public API and kv_g3_poll: slot states, counters,
 *                    the op free list. No lock.
 *   engine threads - transfers of submitted ops; verification of reads.
 *   committer      - fdatasync and the LMDB write transaction of a batch.
 * Ops travel caller -> engine -> (committer) -> done list -> caller; each
 * hand-off is a mutex-protected FIFO, so an op has one owner at a time.
 */
#ifndef KV_TIERS_G3_INTERNAL_H
#define KV_TIERS_G3_INTERNAL_H

#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/uio.h>
#include <time.h>

#include "tiers/g3.h"
#include "tiers/g3_format.h"

#define G3_SUB      "g3" /* log subsystem */
#define G3_PATH_MAX 1024

/* ---- files ----------------------------------------------------------------- */
typedef struct g3_file {
  int fd;
  int direct;        /* opened with O_DIRECT */
  int formatted;     /* made new at this open */
  int created;       /* the file did not exist before this open */
  uint64_t fs_avail; /* g3_file_format's -ENOSPC: bytes it found free */
  g3_sb sb;
  uint32_t base;     /* store-wide number of its slot 0 */
  uint32_t *freestk; /* free slots (file-local numbers), caller thread */
  uint32_t nfree;
  char path[G3_PATH_MAX];
} g3_file;

/* ---- operations -------------------------------------------------------------- */
enum { G3_OP_WRITE = 1, G3_OP_READ, G3_OP_DEL };

typedef struct g3_op {
  struct g3_op *next;
  uint8_t kind;   /* G3_OP_* */
  uint8_t expect; /* KV_G3_EXPECT_* for reads */
  uint8_t keylen;
  uint8_t io_short; /* a transfer hit the end of the file */
  uint32_t slot;    /* store-wide */
  uint32_t file, fslot;
  uint32_t len, iolen; /* payload bytes; rounded to KV_G3_ALIGN */
  uint64_t seq;
  uint32_t crc;
  uint8_t *buf;
  uint8_t ns[KV_G3_NS_BYTES], key[KV_G3_KEY_MAX];
  uint8_t hdr[G3_REC_LEN]; /* write: header to store; read: header found */
  /* coding (KV_G3_CODE writes, reads of coded blocks) */
  uint8_t code;            /* a write: code it first (1 lossless, else a G3_CODEC_*) */
  uint8_t qdt;             /* lossy: the elements' kv_quant_dtype */
  uint32_t group;          /* lossy: elements per scale */
  uint32_t *crc_out;       /* a read: kv_g3_expect.crc_out */
  uint8_t codec_failed;    /* a read: its stored bytes failed (CRC, decoding) */
  uint32_t stored, scrc;   /* coded: stored length and its CRC32C; 0: raw */
  uint8_t *dst;            /* coded: the caller's buffer (write: its block) */
  uint8_t *xbuf;           /* the op's own slot-sized buffer (kept on reuse) */
  uint64_t code_ns;        /* time spent coding or decoding */
  int io_err;              /* first failed transfer's -errno */
  int res;                 /* final status */
  const char *why;         /* reason a read failed verification */
  /* engine-private */
  uint32_t ebuf;        /* header buffer index */
  uint32_t edone[2];    /* bytes moved: [0] header (a write: header and
                          * payload, one transfer), [1] payload */
  struct iovec eiov[2]; /* a vectored transfer in flight */
  uint8_t epending;     /* transfers not finished */
  /* caller */
  kv_g3_cb cb;
  void *arg;
} g3_op;

typedef struct g3_queue {
  g3_op *head, *tail;
  uint32_t n;
} g3_queue;

static inline void g3_q_push(g3_queue *q, g3_op *op) {
  op->next = NULL;
  if (q->tail) q->tail->next = op;
  else q->head = op;
  q->tail = op;
  q->n++;
}
static inline g3_op *g3_q_pop(g3_queue *q) {
  g3_op *op = q->head;
  if (op) {
    q->head = op->next;
    if (!q->head) q->tail = NULL;
    q->n--;
    op->next = NULL;
  }
  return op;
}

/* ---- thread pools (g3_pool.c) ---------------------------------------------- */
/* fn(arg, op, state) runs on a pool thread for each op pushed, in FIFO
 * order across the threads; *state is the thread's own (NULL at first),
 * and fn(arg, NULL, state) is its last call, as the thread ends. */
typedef void (*g3_pool_fn)(void *arg, g3_op *op, void **state);
typedef struct g3_pool {
  pthread_t *t;
  unsigned n;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  g3_queue q;
  int stop;
  g3_pool_fn fn;
  void *arg;
} g3_pool;
/* Starts n threads: 0, or -errno with none left running. */
int g3_pool_start(g3_pool *p, unsigned n, g3_pool_fn fn, void *arg);
void g3_pool_push(g3_pool *p, g3_op *op); /* any thread */
/* Lets the threads finish the queue, then joins them. A pool that failed
 * to start, or was stopped, is a no-op. */
void g3_pool_stop(g3_pool *p);

/* ---- I/O engines ------------------------------------------------------------- */
/* Called by the engine, on its thread, when both transfers of op are done
 * (op->io_err, op->io_short, op->hdr for reads set): g3.c's, which
 * verifies a read or passes a write to the committer; the op then reaches
 * the done list. The engine gives op up with the call. */
typedef void (*g3_io_done_fn)(kv_g3 *g, g3_op *op);

typedef struct g3_engine_ops {
  const char *name;
  kv_g3_backend kind;
  /* Starts the engine, which reports each finished op to done (kept until
   * stop). 0, or -errno with nothing left running. */
  int (*start)(kv_g3 *g, g3_io_done_fn done);
  /* Queues op for its transfers (header and payload: one vectored write,
   * or two reads); never fails. When they are done the engine calls the
   * done given to start. Any thread. */
  void (*submit)(kv_g3 *g, g3_op *op);
  /* Finishes every submitted op, then stops and frees the engine. */
  void (*stop)(kv_g3 *g);
} g3_engine_ops;

extern const g3_engine_ops g3_engine_uring;
extern const g3_engine_ops g3_engine_threads;

/* ---- the store --------------------------------------------------------------- */
enum {               /* slot states (caller thread) */
       G3S_FREE = 0, /* on a free stack */
       G3S_ALLOC,    /* the caller's, holds no indexed block */
       G3S_WRITING,  /* a write is in flight */
       G3S_STORED,   /* holds an indexed block (or one whose entry is committing) */
       G3S_DEAD,     /* the caller's; its entry was dropped after a failed read */
       G3S_RETIRING, /* given back; free once its delete commits and reads end */
};
#define G3F_DELPEND 1 /* an index delete for this slot is not yet committed */

typedef struct g3_idx {
  MDB_env *env;
  MDB_dbi ent, meta;
  int created; /* the index files did not exist before this open */
} g3_idx;

struct kv_g3 {
  kv_g3_opts opts;
  const kv_g3_fault *fault;
  g3_file *files;
  unsigned nfiles;
  uint32_t nslots, slot_bytes, qd;
  uint32_t block_max; /* largest block a write takes */
  uint8_t store_id[G3_STORE_ID_LEN];
  int direct, fixed;
  kv_g3_backend backend;

  /* caller thread */
  uint8_t *sstate, *snread, *sflag;
  uint32_t *slen;
  uint32_t *sstored; /* a coded block's stored length; 0: raw */
  unsigned rr; /* next file to allocate from */
  uint64_t nfree;
  uint64_t nretiring; /* slots in G3S_RETIRING */
  kv_g3_state state;
  int state_err; /* what moved it from OK */
  const char *state_what;
  int probe_armed;     /* kv_g3_retry: the next alloc is let through */
  uint32_t probe_slot; /* the probe's slot, UINT32_MAX if none */
  int removed;         /* kv_g3_check found a file unlinked */
  uint64_t max_seq;
  kv_g3_stats st;
  g3_op *op_free;
  uint32_t nxfree; /* free ops holding a buffer for coded blocks (op_put) */
  uint64_t inflight;
  int corrupt_logged;

  /* engine */
  const g3_engine_ops *eng;
  void *eng_priv;
  int eng_started;

  /* index and commit pipeline */
  g3_idx ix;
  pthread_t committer;
  int committer_started;
  pthread_mutex_t cmu;
  pthread_cond_t ccv;
  g3_queue cq;
  struct timespec cq_t0; /* when the first op of cq arrived (monotonic) */
  int cstop;
  atomic_uint_fast64_t a_txns, a_syncs, a_puts, a_dels;
  atomic_uint wr_engine; /* writes submitted and not yet finished by the engine */
  int window_us;         /* group commit window */

  /* coder threads (g3_codec.c) */
  struct g3_pool *coders;

  /* completions */
  pthread_mutex_t dmu;
  g3_queue dq;
  int efd;
};

/* Runs the fault hook for one transfer: 0 or the -errno to fail it with. */
static inline int g3_fault_io(kv_g3 *g, const g3_op *op, int is_header, uint64_t off,
                              uint32_t len) {
  if (!g->fault || !g->fault->io) return 0;
  int r = g->fault->io(g->fault->arg, op->kind == G3_OP_WRITE, is_header, op->file, off, len);
  return r < 0 ? r : 0;
}

/* g3_commit.c: the committer thread and the done list. */
int g3_pipe_start(kv_g3 *g);
void g3_pipe_stop(kv_g3 *g);
void g3_commit_push(kv_g3 *g, g3_op *op); /* any thread */
/* Engine thread: a write's transfers are over (op->res set): to the
 * committer if they succeeded, else straight to the done list. */
void g3_write_finished(kv_g3 *g, g3_op *op);
void g3_done_push(kv_g3 *g, g3_op *op); /* any thread */
g3_op *g3_done_take(kv_g3 *g);          /* caller: the whole list, FIFO */

/* g3_codec.c: the coder threads. A write op with op->code is coded (or
 * left raw, or failed with -EMSGSIZE) and then submitted to the engine; a
 * read op of a coded block, its transfers done, is verified and decoded
 * (g3_verify_read) and pushed to the done list. */
int g3_coders_start(kv_g3 *g, unsigned n);
void g3_coders_stop(kv_g3 *g); /* after every op is done */
void g3_coders_submit(kv_g3 *g, g3_op *op); /* any thread */
/* g3.c: a read's verification (decoding included for a coded block): 0 or
 * the op's result. Any thread that owns op. */
int g3_verify_read(kv_g3 *g, g3_op *op);
/* g3.c: the header of write op, from its fields (stored ones included). */
void g3_write_hdr(kv_g3 *g, g3_op *op);

/* g3_files.c: the data files. */
/* Opens the file of dirs[i] (creating it if create), with O_DIRECT as the
 * policy allows; f->direct says what was got, f->created whether it was
 * made now. 0 or -errno; a file this call created is removed again when
 * it fails. */
int g3_file_open(g3_file *f, const char *dir, unsigned i, int create, kv_g3_direct mode,
                 const kv_g3_fault *fault);
/* Takes f's exclusive flock, waiting up to wait_ms (0: 5000, < 0: no
 * wait). The lock also outlives a killed owner until the kernel has
 * finished its io_uring requests on the file, so once it is held no write
 * of a previous owner can land under us. 0, -EBUSY or -errno. */
int g3_file_lock(g3_file *f, int wait_ms);
/* Reads and decodes f's superblock: 0, KV_ECORRUPT, -ENOENT (empty file). */
int g3_file_read_sb(g3_file *f);
/* Discards f's contents and lays it out afresh for sb (durably). -ENOSPC,
 * with f->fs_avail set and nothing changed, when the filesystem has not
 * the room for the whole file (checked before anything is allocated, so a
 * file too large for its filesystem never fills it first). */
int g3_file_format(g3_file *f, const g3_sb *sb);
void g3_file_close(g3_file *f);
/* pread/pwrite of the whole range, retrying short transfers: the byte count
 * (less than len only at end of file), or -errno. */
ssize_t g3_pread_full(int fd, void *buf, size_t len, uint64_t off);
ssize_t g3_pwrite_full(int fd, const void *buf, size_t len, uint64_t off, int dsync);

/* g3_lmdb.c: the index. */
/* Opens (creating) the index in dir; ix->created says whether it was made
 * now. A failed open removes the files it created. 0 or -errno. */
int g3_idx_open(g3_idx *ix, const char *dir, uint64_t nslots, int nosync);
void g3_idx_close(g3_idx *ix);
/* Removes the index files of dir (used before a rebuild of a broken one). */
void g3_idx_unlink(const char *dir);
/* The store id in the meta table: 0, -ENOENT if none. */
int g3_idx_get_store_id(g3_idx *ix, uint8_t id[G3_STORE_ID_LEN]);
/* Index value encoding: 32 bytes (version 1, a raw record), or 40
 * (version 2, a coded one: its stored length too). */
#define G3_IVAL_LEN     40
#define G3_IVAL_LEN_RAW 32
typedef struct g3_ival {
  uint32_t file, fslot, len, crc;
  uint64_t off, seq;
  uint32_t stored; /* a coded record's stored length; 0: raw */
} g3_ival;
/* The value's encoded length (G3_IVAL_LEN_RAW or G3_IVAL_LEN). */
size_t g3_ival_encode(const g3_ival *v, uint8_t *out);
int g3_ival_decode(g3_ival *v, const void *in, size_t len);
/* Index key: ns digest then key bytes. Returns its length. */
unsigned g3_ikey(uint8_t *out, const uint8_t *ns, const uint8_t *key, unsigned keylen);
/* Calls fn(key, keylen, value) for every entry, in one read transaction. */
int g3_idx_scan(g3_idx *ix, int (*fn)(const uint8_t *k, unsigned klen, const g3_ival *v, void *arg),
                void *arg);
/* Applies a committer batch in one transaction: puts for good writes,
 * deletes-if-pointing-at-slot for deletes. 0 or -errno. */
int g3_idx_apply(kv_g3 *g, g3_op *ops);
/* Deletes the listed keys (each G3_IKEY_MAX bytes apart, lengths in lens). */
int g3_idx_del_keys(g3_idx *ix, const uint8_t *keys, const uint8_t *lens, size_t n);
#define G3_IKEY_MAX (KV_G3_NS_BYTES + KV_G3_KEY_MAX)
/* Replaces every entry (and the store id) in one transaction. */
typedef struct g3_rentry {
  uint8_t k[G3_IKEY_MAX];
  uint8_t klen;
  g3_ival v;
  uint32_t scrc; /* a coded record's stored bytes' CRC32C (rebuild's check) */
} g3_rentry;
int g3_idx_replace(g3_idx *ix, const g3_rentry *e, size_t n, const uint8_t id[G3_STORE_ID_LEN]);
/* An LMDB return code as -errno. */
int g3_mdb_err(int rc);

/* g3_rebuild.c: scans the files' headers (and payloads, if verify) and
 * replaces the index with the newest valid record of each key. */
int g3_rebuild_scan(g3_file *files, unsigned nfiles, const uint8_t id[G3_STORE_ID_LEN], g3_idx *ix,
                    int verify, kv_g3_rebuild_info *info);

#endif
