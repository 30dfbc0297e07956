/*
 * g3.h - the G3 tier: KV blocks on local SSD files, crash-consistent and warm
 * after a restart. The design, the on-disk format and the failure rules are
 * written down in tiers/G3.md.
 *
 * A store is one preallocated file per configured directory, opened with
 * O_DIRECT and cut into fixed slots. Each slot holds one block: its payload
 * in the data area and a self-describing 4 KiB record header in the header
 * table (magic, version, namespace digest, key, length, sequence number,
 * payload CRC32C, header CRC32C). An LMDB index maps (namespace, key) to
 * (file, offset, length, seq, crc); a block's bytes are durable before its
 * index entry commits, and a lost index can be rebuilt from the headers.
 *
 * Division of labour with the cache core: G3 allocates slots (O(1)) and
 * moves bytes; the core decides what goes where and what is evicted, and
 * keeps its own record per block (slot, seq, crc). At start the core calls
 * kv_g3_foreach() to learn what the store holds.
 *
 * I/O is asynchronous: io_uring (registered G2 buffers, no copy) or a thread
 * pool of pread/pwrite behind the same interface. Completions are delivered
 * on the caller's thread by kv_g3_poll(), which the daemon runs when the
 * eventfd kv_g3_fd() becomes readable.
 *
 * Threading: every function here is called from one thread (the daemon's
 * loop), like the block index. The store's own threads never call back.
 * Errors: 0 (or a count) on success, negative errno or KV_E* (base/errors.h).
 */
#ifndef KV_TIERS_G3_H
#define KV_TIERS_G3_H

#include <stddef.h>
#include <stdint.h>

#include "tiers/arena.h"

#define KV_G3_NS_BYTES        32    /* namespace digest */
#define KV_G3_KEY_MAX         32    /* key bytes, 1..32 */
#define KV_G3_ALIGN           4096u /* I/O alignment: buffers, lengths, offsets */
#define KV_G3_MAX_DIRS        64
#define KV_G3_QUEUE_DEPTH_MAX 4096 /* kv_g3_opts.queue_depth */
#define KV_G3_SLOT_KEEP       UINT32_MAX /* kv_g3_opts.slot_bytes: the files' own */
#define KV_G3_CODEC_THREADS_MAX 64       /* kv_g3_opts.codec_threads */
#define KV_G3_HIST_BUCKETS    24 /* kv_g3_stats' codec times: bucket i counts
                                  * <= 2^i us, the last one above (daemon/metrics.h's) */

typedef struct kv_g3 kv_g3;

typedef enum {
  KV_G3_BACKEND_AUTO = 0, /* io_uring, else the thread pool (logged) */
  KV_G3_BACKEND_URING,    /* io_uring only: open fails if it is refused */
  KV_G3_BACKEND_THREADS,  /* pread/pwrite on a pool of queue_depth threads */
} kv_g3_backend;

typedef enum {
  KV_G3_SYNC_BATCH = 0, /* fdatasync the files once per index batch (default) */
  KV_G3_SYNC_DSYNC,     /* every write carries RWF_DSYNC / O_DSYNC semantics */
  KV_G3_SYNC_NONE,      /* no flush: survives kill -9, not power loss */
} kv_g3_sync;

typedef enum {
  KV_G3_DIRECT_AUTO = 0, /* O_DIRECT; buffered (logged) if the fs refuses it */
  KV_G3_DIRECT_ON,       /* O_DIRECT or fail */
  KV_G3_DIRECT_OFF,      /* buffered I/O through the page cache */
} kv_g3_direct;

typedef enum {
  KV_G3_OK = 0,   /* admitting writes */
  KV_G3_DEGRADED, /* an I/O error: no new writes, stored blocks still served */
  KV_G3_FULL,     /* the filesystem refused space (ENOSPC/EFBIG): no new writes */
} kv_g3_state;

typedef struct kv_g3_dir {
  const char *path;  /* an existing directory; the file is <path>/kvg3-<i>.dat */
  uint64_t capacity; /* bytes of SSD for this directory (file size, about) */
} kv_g3_dir;

/* Fault injection for tests, in the spirit of SPDK's error bdev. Every hook
 * is optional. io() runs on the store's I/O threads before each transfer;
 * returning a negative errno completes that transfer with it, unissued. */
typedef struct kv_g3_fault {
  int (*io)(void *arg, int is_write, int is_header, unsigned file, uint64_t off, uint32_t len);
  void *arg;
  int refuse_direct; /* errno to fail open(O_DIRECT) with (EINVAL: as tmpfs) */
  int refuse_uring;  /* errno to fail io_uring setup with (ENOSYS, EPERM) */
  int refuse_fixed;  /* errno to fail buffer registration with */
} kv_g3_fault;

typedef struct kv_g3_opts {
  const kv_g3_dir *dirs; /* 1..KV_G3_MAX_DIRS; file i lives in dirs[i]; the
                          * LMDB index lives in dirs[0] */
  unsigned ndirs;
  uint32_t block_bytes; /* largest block, > 0; a slot holds
                          * round_up(block_bytes, 4096) bytes unless
                          * slot_bytes says otherwise. 0 on reopen: take
                          * the slot size the files were made with. */
  uint32_t slot_bytes;  /* payload bytes per slot of a new store, rounded
                          * up to 4096, at most round_up(block_bytes): a
                          * block larger than its slot is stored only
                          * coded (kv_g3_write_ex, KV_G3_CODE), and only
                          * if its coded form fits. 0: round_up(block_bytes).
                          * On reopen the files' slot size must be this
                          * (-EINVAL otherwise), or KV_G3_SLOT_KEEP: take
                          * theirs whatever it is. */
  uint32_t codec_threads; /* threads coding and decoding blocks, at most
                          * KV_G3_CODEC_THREADS_MAX; 0: 2 */
  uint32_t queue_depth; /* block I/Os in flight at once; 0: 32 */
  kv_g3_backend backend;
  kv_g3_sync sync;
  kv_g3_direct direct;
  int reformat;         /* 1: discard whatever the directories hold */
  kv_arena *arena;      /* G2 arena to register as io_uring fixed buffers
                          * (NULL: none; I/O from it is still no-copy, its
                          * pages pinned per I/O). Only memory no other
                          * process can punch holes in: a registration
                          * keeps the pages it pinned, so after a hole is
                          * punched reads land in pages the mapping no
                          * longer shows (kvcached passes NULL). */
  uint32_t commit_max;  /* most blocks per index transaction; 0: 4096 */
  int commit_window_us; /* group commit: a batch waits up to this long
                          * from its first write for more while writes are
                          * still in flight, to share one fdatasync and one
                          * index commit; 0: 50000, < 0: commit at once */
  int lock_wait_ms;     /* how long open waits for the files' lock held by
                          * another opener, or by a killed one's in-flight
                          * io_uring requests; 0: 5000, < 0: do not wait */
  const kv_g3_fault *fault;
} kv_g3_opts;

/* What kv_g3_open found and chose. */
typedef struct kv_g3_open_info {
  uint64_t indexed;      /* blocks in the index, served from now on */
  uint64_t dropped;      /* index entries discarded as invalid at open */
  uint32_t slots;        /* slots in all files */
  uint32_t slot_bytes;   /* payload bytes per slot */
  int formatted;         /* files newly created (or reformatted) */
  int rebuilt;           /* the index was missing or stale and was rebuilt */
  kv_g3_backend backend; /* URING or THREADS, as running */
  int direct;            /* 1 if O_DIRECT is in use */
  int fixed_buffers;     /* 1 if the arena is registered with io_uring */
  unsigned set_aside;    /* damaged files renamed <name>.corrupt-<time> */
  char why[384];         /* kv_g3_open failed: what could not be done,
                            * the path and the reason ("" on success) */
} kv_g3_open_info;

typedef struct kv_g3_key {
  uint8_t ns[KV_G3_NS_BYTES]; /* namespace digest */
  uint8_t len;                /* 1..KV_G3_KEY_MAX */
  uint8_t b[KV_G3_KEY_MAX];
} kv_g3_key;

/* What a read expects to find; mismatch -> KV_ECORRUPT. */
#define KV_G3_EXPECT_SEQ 1u
#define KV_G3_EXPECT_CRC 2u
/* ... and a lossy record (kv_g3_write_ex, KV_G3_FP8 or KV_G3_INT8) is
 * accepted whatever its CRC (the CRC of its decoded bytes, which the
 * caller learns from crc_out): for a caller whose namespace allows lossy
 * blocks. Without it a lossy record is refused (KV_ECORRUPT). */
#define KV_G3_EXPECT_LOSSY 4u
typedef struct kv_g3_expect {
  kv_g3_key key;  /* always checked */
  uint32_t len;   /* always checked */
  uint64_t seq;   /* checked with KV_G3_EXPECT_SEQ */
  uint32_t crc;   /* checked with KV_G3_EXPECT_CRC */
  unsigned flags; /* at least one of the first two */
  uint32_t *crc_out; /* may be NULL: set, before cb(0), to the CRC32C of the
                      * bytes delivered (the block's; a lossy record's own) */
} kv_g3_expect;

/* An indexed block, as kv_g3_foreach() reports it. */
typedef struct kv_g3_entry {
  kv_g3_key key;
  uint32_t slot; /* store-wide slot number, for read/remove */
  uint32_t file;
  uint64_t offset; /* of the payload in the file */
  uint32_t len;
  uint32_t crc;
  uint64_t seq;
} kv_g3_entry;

typedef struct kv_g3_stats {
  kv_g3_state state;
  uint64_t slots, slots_free, slots_stored; /* slots_stored: indexed blocks */
  uint64_t capacity_bytes;                  /* slots * slot payload */
  uint64_t stored_bytes;                    /* payload bytes indexed */
  uint64_t reads, read_bytes;               /* verified successful reads */
  uint64_t writes, write_bytes;             /* writes durable and indexed */
  uint64_t read_failed;                     /* reads completed with an error */
  uint64_t write_failed;
  uint64_t corrupt;     /* reads failing verification (KV_ECORRUPT) */
  uint64_t short_reads; /* ... of which: the file ended early */
  uint64_t io_errors;   /* transfers failing with an errno */
  uint64_t nospace;     /* writes refused by the filesystem (ENOSPC/EFBIG) */
  uint64_t dropped;     /* index entries removed after failed reads */
  uint64_t removed;     /* entries removed by kv_g3_remove */
  uint64_t index_txns;  /* LMDB transactions committed */
  uint64_t index_puts, index_dels;
  uint64_t syncs;          /* fdatasync calls */
  uint64_t inflight;       /* operations submitted and not yet delivered */
  uint64_t slots_retiring; /* removed or freed, free once their index delete
                            * commits and their reads end (kv_g3_poll) */
  int state_err;           /* what moved the state from ok: -errno or KV_E*
                            * (-ENOENT for a removed file); 0 while ok */
  const char *state_what;  /* which operation: "write", "read", "index
                            * delete", "store file removed"; "" while ok */
  uint64_t probes;         /* writes let through while full (kv_g3_retry) */
  /* Coding (kv_g3_write_ex with KV_G3_CODE; tiers/G3.md, "Coded blocks"),
   * on the store's coder threads. */
  uint64_t coded;          /* blocks written coded */
  uint64_t coded_raw;      /* ... asked to be, written raw: coding gained nothing */
  uint64_t too_large;      /* writes refused (-EMSGSIZE): larger than a slot,
                            * raw and (where asked) coded */
  uint64_t decoded;        /* reads of coded blocks decoded and verified */
  uint64_t decode_failed;  /* ... failing verification of their stored bytes
                            * or their decoding (counted in corrupt too) */
  uint64_t codec_in, codec_out; /* bytes of the blocks written coded, and
                                 * their stored bytes (in / out: the ratio) */
  uint64_t held_bytes;     /* bytes indexed blocks take in their slots:
                            * stored length for coded ones, else length */
  uint64_t coded_stored;   /* indexed blocks stored coded */
  uint64_t code_hist[KV_G3_HIST_BUCKETS + 1], code_ns;     /* coding times */
  uint64_t decode_hist[KV_G3_HIST_BUCKETS + 1], decode_ns; /* decoding times */
} kv_g3_stats;

/* Completion: status is 0 or a negative error. Called by kv_g3_poll (or a
 * blocking helper) on the caller's thread; may submit new operations. */
typedef void (*kv_g3_cb)(int status, void *arg);

/* ---- lifetime ------------------------------------------------------------ */

/*
 * Opens (creating or reformatting as needed) the store described by o, and
 * starts its I/O threads. Existing files are reused with their own layout;
 * the index is read (or rebuilt from the record headers if it is missing or
 * belongs to other files) and every indexed slot is marked allocated: the
 * caller learns them with kv_g3_foreach(). A file whose superblock is
 * damaged, or that sits at another position of the store, is never
 * reformatted in place: it is renamed <name>.corrupt-<unix time> (logged at
 * error level, counted in info->set_aside) and a fresh file takes its
 * place. info (may be NULL) says what was found. On success *out is the
 * store. Errors, with nothing left open and no file or index this call
 * created left behind (info->why says what failed, where and why):
 * -EINVAL (bad options, or block_bytes differing from the files' slot size),
 * -ENOSPC (a directory cannot hold one slot, or its filesystem has not the
 * room for the file: checked before preallocating), -EBUSY (the files are
 * in use), -ENOSYS/-EPERM (backend URING refused), KV_ECORRUPT (unreadable
 * index), -errno (-EACCES, -EPERM, -ENOTDIR, -EROFS ... from the files).
 */
int kv_g3_open(kv_g3 **out, const kv_g3_opts *o, kv_g3_open_info *info);

/* Waits for every operation in flight and delivers its callback, commits
 * the last index batch, stops the threads and frees the store. NULL is a
 * no-op. The files and the index stay on disk for the next open. */
void kv_g3_close(kv_g3 *g);

/* ---- completion delivery ------------------------------------------------- */

/* An eventfd that becomes readable when completions are waiting. Poll it for
 * POLLIN (uv_poll_start) and call kv_g3_poll(). Owned by the store. */
int kv_g3_fd(const kv_g3 *g);

/* Reaps finished operations and calls their callbacks, on this thread.
 * Never blocks. Returns the number of callbacks called. */
int kv_g3_poll(kv_g3 *g);

/* Blocks until no operation is in flight, delivering callbacks as they
 * finish. Returns the number of callbacks called. */
int kv_g3_drain(kv_g3 *g);

/* ---- slots --------------------------------------------------------------- */

/* Allocates a free slot, round-robin across files. O(1). 0 with *slot set;
 * -ENOSPC if no slot is free or the state is FULL, KV_EDEGRADED if the
 * store is degraded. Nothing is changed on error. */
int kv_g3_alloc(kv_g3 *g, uint32_t *slot);

/* Returns an allocated slot that holds no indexed block (never written, its
 * write failed, or its entry was dropped by a failed read). O(1). -EINVAL:
 * no such slot; -EALREADY: not allocated; -EBUSY: a write is in flight or
 * the slot holds an indexed block (use kv_g3_remove). */
int kv_g3_free(kv_g3 *g, uint32_t slot);

/* Removes the indexed block in `slot`, whose key is k, and frees the slot.
 * The index delete is batched; the slot becomes allocatable only once it is
 * committed and reads in flight on it are done, so an index entry never
 * points at a slot being rewritten. A slot with no indexed block is just
 * freed. -EINVAL (no such slot or bad key), -EALREADY (slot not allocated),
 * -EBUSY (a write is in flight). */
int kv_g3_remove(kv_g3 *g, uint32_t slot, const kv_g3_key *k);

/* Calls fn for every indexed block (committed entries, in key order) until
 * fn returns non-zero, which is then returned. 0 after the last, or a
 * negative error from the index. fn must not call into the store. */
int kv_g3_foreach(kv_g3 *g, int (*fn)(const kv_g3_entry *e, void *arg), void *arg);

/* ---- I/O ------------------------------------------------------------------ */

/*
 * Writes one block into an allocated, empty slot: the payload buf[0..len)
 * and its record header; once both are durable (per the sync policy) the
 * index entry (k -> slot, len, seq, crc) is committed in the next batch, and
 * only then cb(0) runs. A key already indexed elsewhere is re-pointed here.
 * buf must be KV_G3_ALIGN-aligned and readable for len rounded up to
 * KV_G3_ALIGN (a G2 slot is); it must stay untouched until cb. crc: the
 * payload's CRC32C if the caller has it, else pass kv_g3_write_crc_none.
 * Immediate errors (nothing started): -EINVAL (bad slot, key, alignment, len
 * 0 or above the slot size), -EBUSY (slot not allocated-and-empty), -ENOSPC
 * (state FULL), KV_EDEGRADED, -ENOMEM. Completion errors: -ENOSPC/-EFBIG
 * (store turns FULL), -EIO and other errnos (store turns DEGRADED); the slot
 * is then empty again and the caller frees it.
 */
int kv_g3_write(kv_g3 *g, uint32_t slot, const kv_g3_key *k, uint64_t seq, const void *buf,
                uint32_t len, int64_t crc, kv_g3_cb cb, void *arg);
#define kv_g3_write_crc_none ((int64_t)-1)

/*
 * kv_g3_write with flags: KV_G3_CODE codes the block (tiers/codec.h, a
 * block of 16-bit elements) on the store's coder threads before it is
 * written: stored coded when that makes it smaller and it fits a slot,
 * else raw when it fits a slot, else the write completes with -EMSGSIZE
 * (no I/O; the slot is empty again, the store stays ok; counted in
 * too_large). Without KV_G3_CODE a len above the slot size is -EMSGSIZE at
 * once. len may be up to the store's largest block (kv_g3_block_max).
 */
#define KV_G3_CODE 1u
/* Lossy instead (a tenant's cold_precision; tiers/quant.h): FP8 or INT8
 * codes of the block's 16-bit elements (BF16 with KV_G3_BF16, else FP16),
 * one scale per group of KV_G3_GROUP(g) elements (a token's head: g the
 * head_dim, dividing the block's elements). The record's CRC is that of
 * what the codes decode to, not the block's; a read delivers those bytes
 * and their CRC (kv_g3_expect.crc_out) and is accepted only with
 * KV_G3_EXPECT_LOSSY. A block with a non-finite element, or whose codes
 * would not fit a slot or not be smaller, is written raw when it fits.
 * Exclusive with KV_G3_CODE. */
#define KV_G3_FP8                2u
#define KV_G3_INT8               4u
#define KV_G3_BF16               8u
#define KV_G3_GROUP(g)           ((unsigned)(g) << 16)
#define KV_G3_GROUP_OF(flags)    ((flags) >> 16)
int kv_g3_write_ex(kv_g3 *g, uint32_t slot, const kv_g3_key *k, uint64_t seq, const void *buf,
                   uint32_t len, int64_t crc, unsigned flags, kv_g3_cb cb, void *arg);

/*
 * Reads the block in `slot` into buf (KV_G3_ALIGN-aligned, room for
 * e->len rounded up to KV_G3_ALIGN) and verifies it: record header sane
 * (magic, version, header CRC, this store, this slot), key, namespace and
 * length as expected, seq and/or crc as e->flags ask, payload CRC32C as
 * recorded. A coded block is read into the op's own buffer, its stored
 * bytes checked against their CRC32C, decoded into buf on a coder thread
 * and the decoded bytes checked against the block's CRC32C; the record's
 * stored length must be the index's. cb(0) only if all of that holds; otherwise cb(KV_ECORRUPT)
 * (bad bytes, bad header, short read) or cb(-errno) (the transfer failed),
 * the index entry is dropped and the counters say why; the slot stays
 * allocated to the caller (kv_g3_free it). Immediate errors: -EINVAL (bad
 * slot, alignment or expectation), KV_ENOTFOUND (slot holds no block),
 * -EBUSY (too many reads on the slot), -ENOMEM.
 */
int kv_g3_read(kv_g3 *g, uint32_t slot, const kv_g3_expect *e, void *buf, kv_g3_cb cb, void *arg);

/* Blocking forms for tools and tests: submit, then poll until this
 * operation completes (delivering other callbacks too). Return its status. */
int kv_g3_write_sync(kv_g3 *g, uint32_t slot, const kv_g3_key *k, uint64_t seq, const void *buf,
                     uint32_t len);
int kv_g3_read_sync(kv_g3 *g, uint32_t slot, const kv_g3_expect *e, void *buf);

/* ---- state and statistics ------------------------------------------------- */

kv_g3_state kv_g3_get_state(const kv_g3 *g);
/* "ok", "degraded", "full". */
const char *kv_g3_state_name(kv_g3_state s);
/* Admits writes again after the operator fixed the cause (space freed, disk
 * replaced). The next failure logs again. */
void kv_g3_resume(kv_g3 *g);
/* While FULL: lets one write through to see whether space has come back
 * (call it now and then, e.g. every few seconds). The next kv_g3_alloc
 * succeeds if a slot is free and kv_g3_write takes that slot; if the write
 * succeeds the store is OK again (logged at info), if it fails it stays
 * FULL, quietly (the counters count it). Returns 1 if a probe was armed, 0
 * if the state is not FULL or a probe is already armed or in flight. */
int kv_g3_retry(kv_g3 *g);
/* Whether a write would be admitted now: OK, or FULL with a probe armed. */
int kv_g3_writable(const kv_g3 *g);
/* Checks that the data files and the index are still linked in their
 * directories (fstat: a removed directory takes them with it). A removed
 * one turns the store DEGRADED (state_what "store file removed", logged at
 * error level once): no new writes, as nothing written would survive a
 * restart; what it holds stays readable through the open files. Call it
 * now and then (the daemon does, every second). Returns the state. */
kv_g3_state kv_g3_check(kv_g3 *g);
/* A snapshot of the counters. */
void kv_g3_get_stats(const kv_g3 *g, kv_g3_stats *st);
/* Payload bytes per slot (a multiple of KV_G3_ALIGN). */
uint32_t kv_g3_slot_bytes(const kv_g3 *g);
/* The largest block a write takes (kv_g3_opts.block_bytes, or the slot
 * size when it was 0): above the slot size only coded. */
uint32_t kv_g3_block_max(const kv_g3 *g);
/* The largest sequence number indexed at open (0 if none): new writes
 * should use larger ones. */
uint64_t kv_g3_max_seq(const kv_g3 *g);
/* "uring" or "threads". */
const char *kv_g3_backend_name(kv_g3_backend b);
/* The layout kv_g3_open gives a new file of at most `capacity` bytes for
 * blocks of up to block_bytes: its slots and its size in bytes (either
 * pointer may be NULL). Pure. 0, -EINVAL (block_bytes 0 or above
 * UINT32_MAX - KV_G3_ALIGN), or -ENOSPC (not one slot fits). */
int kv_g3_layout_of(uint64_t capacity, uint64_t block_bytes, uint32_t *slots, uint64_t *file_bytes);

/* ---- recovery -------------------------------------------------------------- */

typedef struct kv_g3_rebuild_info {
  uint64_t scanned;     /* slots whose header was read */
  uint64_t records;     /* headers valid for this store */
  uint64_t indexed;     /* entries written (newest seq per key) */
  uint64_t superseded;  /* older records of a key indexed elsewhere */
  uint64_t bad_payload; /* valid headers whose payload failed its CRC */
  uint32_t files;
} kv_g3_rebuild_info;

/*
 * Rebuilds the LMDB index of a closed store from its files: reads every
 * file's superblock and record headers, keeps for each key the record with
 * the newest seq, and replaces the index with exactly those, in one
 * transaction. With verify_payload, a record is kept only if its payload
 * reads back with the CRC its header records (reads every stored byte).
 * o->dirs names the files as for open (capacity and block_bytes are not
 * used; lock_wait_ms, direct and fault are). info may be NULL. -ENOENT if
 * dirs[0] holds no store file, KV_ECORRUPT if its superblock is unreadable,
 * -EBUSY if the store is open elsewhere, -errno.
 */
int kv_g3_rebuild_index(const kv_g3_opts *o, int verify_payload, kv_g3_rebuild_info *info);

#endif
