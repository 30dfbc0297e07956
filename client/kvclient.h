/*
 * kvclient.h - libkvclient, the library inference workers link to use
 * kvcached. This is its one public header; it compiles on its own (C99 or
 * C++), and the library's ABI is C.
 *
 * A handle (kvc) is one connection and one session: HELLO is said at
 * kvc_open() with the worker's tenant and KV layout, and the daemon's G2
 * arena for that tenant is mapped into this process. Block bytes never go
 * through the socket: kvc_load() and kvc_alloc() return pointers into that
 * mapping, where the worker reads and writes blocks directly.
 *
 * Ownership: pins (from kvc_load) and allocations (from kvc_alloc) belong
 * to the handle's connection. kvc_close() - or the process dying - releases
 * them all at once in the daemon. Pointers returned for a block stay valid
 * while the block is pinned (load) or allocated (alloc) and the handle is
 * open; reading a block after kvc_release() reads whatever the slot holds
 * next.
 *
 * Thread-safety: a handle is used by one thread at a time (no internal
 * lock); use one handle per thread, or serialise. Different handles are
 * independent. kvc_chain_hash(), kvc_chain_keys(), kvc_strerror(), kvc_version(),
 * kvc_page_block_bytes() and kvc_cuda_error() (per thread) are safe from
 * any thread; so are kvc_pages_* and kvc_memcpy_batch with c NULL.
 *
 * Two ways to call: blocking calls (kvc_lookup, ...) wait for their reply,
 * with the handle's timeout; the non-blocking form submits requests
 * (kvc_submit_*) and collects their completions (kvc_poll), driven by the
 * caller's own loop through kvc_fd(). Both may be mixed on one handle: a
 * blocking call keeps the completions of earlier submissions for kvc_poll.
 *
 * Errors: every function returns 0 (or a count) on success and a negative
 * number on failure: -errno, or a kvcached error code (kvc_strerror() names
 * both; proto/PROTOCOL.md lists them). Per-block results carry the same
 * codes: a block is a hit only when its status is 0.
 *
 * Checksums (protocol 1.2; daemon/OPS.md, "Trust model"): the workers of a
 * tenant share its G2 arena and can write any block in it, committed or
 * not, so the bytes a load points at are only as good as the last worker
 * that touched them. Writers checksum what they store (kvc_copy_crc fills
 * a slot and returns its CRC-32C in one pass; kvc_commit_crc hands the
 * CRCs to the daemon, which never reads the bytes for them); readers
 * verify what they use (kvc_read copies a block out and checks the copy in
 * the same pass; kvc_verify checks in place). A block that fails is
 * reported to the daemon, which checks its own copy and drops the block if
 * that fails too, and is never handed to the caller as data.
 */
#ifndef KVCLIENT_H
#define KVCLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVC_DIGEST_BYTES 32
#define KVC_KEY_MAX      32
#define KVC_BATCH_MAX    4096

/* Tiers, as the daemon reports them. */
#define KVC_G1        0
#define KVC_G2        1
#define KVC_G3        2
#define KVC_TIER_NONE 0xff

/* A block key: an opaque digest of 1..32 bytes. All keys of one call must
 * have the same length. */
typedef struct kvc_key {
  uint8_t len;
  uint8_t b[KVC_KEY_MAX];
} kvc_key;

typedef struct kvc_layout {
  uint32_t block_bytes;      /* bytes per block, > 0 */
  uint32_t tokens_per_block; /* > 0 */
  uint32_t layers, kv_heads, head_dim;
  uint16_t tp_rank, tp_size; /* tp_rank < tp_size; tp_size 1 if no TP */
  const char *dtype;         /* "bf16", "fp8", ... (1..16 bytes) */
} kvc_layout;

typedef struct kvc_opts {
  const char *socket_path; /* NULL: $KVCACHED_SOCKET, else /run/kvcached/kvcached.sock */
  const char *tenant;      /* 1..64 bytes */
  const char *group;       /* TP group name, NULL for none */
  const void *salt;        /* 0..64 bytes namespace salt, may be NULL */
  size_t salt_len;
  kvc_layout layout;
  int timeout_ms;         /* for blocking calls; 0: 10000, -1: none */
  int no_g1;              /* 1: do not offer G1 import (KV_CAP_G1) in HELLO */
  const uint8_t *g1_uuid; /* the device this worker computes on (16 bytes, CUDA's
                              * uuid); NULL: the calling thread's current CUDA
                              * device, if any. kvc_open maps that device's pool. */
} kvc_opts;

typedef struct kvc kvc;

/* Connects, says HELLO and maps the G2 arena. 0 with *out set, or an
 * error (-ENOENT / -ECONNREFUSED: no daemon; -EPERM: the tenant is not
 * configured, or this process's uid and groups may not act as it;
 * -EINVAL: bad options; ...). */
int kvc_open(const kvc_opts *o, kvc **out);
/* Closes the connection (the daemon releases every pin and allocation of
 * it) and unmaps the arena. NULL is allowed. */
void kvc_close(kvc *c);

/* What HELLO answered. */
uint64_t kvc_session_id(const kvc *c);
uint32_t kvc_slot_bytes(const kvc *c);

/* G1: when the daemon has a device pool and this library can import it
 * (the HELLO reply carries the first device's pool's export, cuda/dev.h),
 * kvc_open maps it once. A worker on another device (kvc_opts.g1_uuid, or
 * the current CUDA device) asks the daemon for that device's pool instead
 * (G1_SELECT). A pool on a simulated device is taken as offered unless
 * g1_uuid names another. When there is no pool to map (G1 off in the
 * daemon, no pool on this worker's device, a handle kind it cannot map, no
 * driver), the session works on G2 as before and kvc_g1_info says why. */
#define KVC_G1_CUDA 1
#define KVC_G1_SIM  2 /* the daemon's simulated device (g1.backend = sim) */
struct kv_dev;
typedef struct kvc_g1 {
  int available;    /* 1: the pool is mapped in this process */
  char reason[320]; /* when not: why ("" when the daemon offered none) */
  uint8_t uuid[16]; /* the pool's device */
  int backend;      /* KVC_G1_CUDA or KVC_G1_SIM; 0 when not available */
  uint8_t kind;     /* how it was shared: KV_TI_G1_* (proto/wire.h) */
  void *base;       /* device address of the pool in this process */
  uint64_t bytes;
  struct kv_dev *dev; /* the device (cuda/dev.h), for copies; owned by c */
} kvc_g1;
/* Fills *out. 0, or -EINVAL (NULL). */
int kvc_g1_info(const kvc *c, kvc_g1 *out);
/* The device address of [offset, offset + len) of the pool (a block's
 * offset comes from the daemon). 0, -ENODEV (no G1 in this session),
 * -ERANGE (outside the pool, or len 0), -EINVAL (NULL). */
int kvc_g1_ptr(const kvc *c, uint64_t offset, uint64_t len, void **out);

/* One block's result from load or alloc. */
typedef struct kvc_block {
  int32_t status;  /* 0: usable; else why not (KV_ENOTFOUND: absent, ...) */
  uint8_t tier;    /* where ptr points: KVC_G2 (host) or KVC_G1 (a device
                   * address in the imported pool), KVC_TIER_NONE on error */
  uint8_t has_crc; /* 1: crc is the block's committed CRC (a usable block of a
                    * load from a daemon of protocol 1.2 or later); else 0 */
  void *ptr;       /* the block's bytes in this process, NULL on error */
  uint32_t length;
  uint32_t crc; /* with has_crc: the CRC-32C the block was committed with
                   * (kvc_read and kvc_verify check against it); else 0 */
} kvc_block;

/* Longest resident prefix of keys[0..n): returns its length (>= 0) or an
 * error; tiers (may be NULL) gets each key's tier or KVC_TIER_NONE. For a
 * TP group the length is one every rank has. */
int kvc_lookup(kvc *c, const kvc_key *keys, uint32_t n, uint8_t *tiers);
/* As kvc_lookup, for a worker that computes the holes of a prefix alone:
 * tiers names every block found, and a daemon with G4 asks it past its
 * first miss too (protocol 1.4, KV_LOOKUP_ALL; an older daemon answers as
 * kvc_lookup, which names the local tiers' blocks after a hole too). */
int kvc_lookup_all(kvc *c, const kvc_key *keys, uint32_t n, uint8_t *tiers);

/* Lookups without a round trip (protocol 1.5): kvc_open maps the session's
 * namespace's presence table, read-only, and kvc_lookup and kvc_lookup_all
 * answer from it, with the meaning a daemon's answer has (an answer is the
 * daemon's state at one instant during the call). They ask the daemon
 * instead when the table cannot say: G4 configured and the local run
 * shorter than the keys, a TP group (the daemon keeps no table for one:
 * its ranks must agree on one length), a daemon before 1.5, a table the
 * daemon replaced (it is mapped again, once), keys the daemon would refuse
 * (its error is then returned). The kvc_submit_lookup* forms always ask
 * the daemon. KVC_LOOKUP_DAEMON (or KVCACHED_LOOKUP=daemon in the
 * environment at kvc_open) asks the daemon always. A LOAD after a lookup
 * answered locally tells the daemon so, which counts the blocks it did not
 * have (kvcached_presence_contradicted_total): a stale "present" ends
 * there, as a miss. */
#define KVC_LOOKUP_AUTO   0
#define KVC_LOOKUP_DAEMON 1
/* 0, -EINVAL, or the error that broke the connection (AUTO maps the table
 * now if it was not; DAEMON unmaps it). */
int kvc_set_lookup(kvc *c, int mode);
typedef struct kvc_lookup_info {
  int mode;         /* KVC_LOOKUP_* */
  int mapped;       /* 1: a presence table is mapped */
  uint64_t bytes;   /* its size */
  uint64_t local;   /* lookups answered from it */
  uint64_t daemon;  /* lookups asked of the daemon (kvc_lookup, kvc_lookup_all) */
  uint64_t maps;    /* tables mapped (PRESENCE) */
  uint64_t retired; /* answers not given because the table was replaced meanwhile */
  char reason[160]; /* when not mapped: why */
} kvc_lookup_info;
int kvc_lookup_stats(const kvc *c, kvc_lookup_info *out);

/* Pins each block in `tier` (KVC_G2, or KVC_G1 when kvc_g1_info says G1 is
 * available: else -ENODEV) and fills out[i]. Returns how many blocks are
 * usable (status 0), or an error for the whole request. A LOAD to G1
 * brings blocks up from G2 or G3 (device copies); a block whose copy to G1
 * failed comes back usable in G2 (out[i].tier says which). Pinned blocks
 * must be released with kvc_release(). A usable block's bytes are not
 * verified yet: read them with kvc_read (or check them with kvc_verify)
 * before using them. */
int kvc_load(kvc *c, uint8_t tier, const kvc_key *keys, uint32_t n, kvc_block *out);
/* Drops this handle's pins. status (may be NULL) gets each key's result.
 * Returns how many were released, or an error. */
int kvc_release(kvc *c, const kvc_key *keys, uint32_t n, int32_t *status);

/* Reserves a slot per key (parents may be NULL, or parents[i].len 0 for
 * none); out[i].ptr is where the worker writes the block's bytes. The
 * block is invisible until kvc_commit(). Returns how many slots were
 * reserved, or an error. Per key: KV_EEXISTS (the key exists, or another
 * worker is writing it), KV_EALLPINNED (G2 full of pinned blocks), -EAGAIN
 * (no room came within the daemon's daemon.load_timeout_ms while victims
 * were being written to the SSD - the daemon waits that long for the room
 * before answering: retry later). */
int kvc_alloc(kvc *c, uint8_t tier, uint8_t prio, const kvc_key *keys, const kvc_key *parents,
              uint32_t n, kvc_block *out);
/* Makes written blocks visible (the daemon checksums them, on its own
 * thread: prefer kvc_commit_crc) / drops them. Returns how many succeeded,
 * or an error; status may be NULL. */
int kvc_commit(kvc *c, const kvc_key *keys, uint32_t n, int32_t *status);
int kvc_abort(kvc *c, const kvc_key *keys, uint32_t n, int32_t *status);

/* --- checksums: the writer computes, the reader verifies -------------------- */

/* Copies len bytes from src to dst (they must not overlap) and returns the
 * CRC-32C of the bytes written to dst, in one pass (VPCLMULQDQ or SSE4.2
 * where the CPU has them: the data is checksummed from the registers that
 * store it, so the CRC is of exactly what dst holds even if src changes
 * meanwhile). What a writer uses to fill a block from kvc_alloc: dst is
 * written with non-temporal stores where it is aligned as slots are (not
 * read first, not kept in this core's cache: the block is for other
 * processes), fenced before the call returns. Any thread. */
uint32_t kvc_copy_crc(void *dst, const void *src, size_t len);
/* CRC-32C (Castagnoli) of p[0..len), continuing from crc (0 to start), for
 * a block written in place by other means. Any thread. */
uint32_t kvc_crc32c(uint32_t crc, const void *p, size_t len);

/* kvc_commit, with crcs[i] the CRC-32C of keys[i]'s block as written (from
 * kvc_copy_crc or kvc_crc32c over the slot). The daemon keeps it as the
 * block's checksum without reading the bytes; a wrong one only makes
 * readers reject the block. With a daemon before protocol 1.2 this is
 * kvc_commit (the daemon computes). crcs may be NULL only when n is 0. */
int kvc_commit_crc(kvc *c, const kvc_key *keys, const uint32_t *crcs, uint32_t n, int32_t *status);
/* kvc_commit_crc (crcs may be NULL: kvc_commit) answered once each block
 * committed here has also been written to the fleet's tier, G4, so that
 * another node's LOOKUP finds it (a prefill node handing a prompt to a
 * decode node). status[i] 0: committed here and in G4; KV_EDEGRADED:
 * committed here only (G4 off, down, busy, or the write failed); anything
 * else as for kvc_commit. Returns how many are 0. The reply waits for the
 * writes, at most about the daemon's g4.timeout_ms. -EOPNOTSUPP with a
 * daemon before protocol 1.4 (nothing sent). */
int kvc_commit_shared(kvc *c, const kvc_key *keys, const uint32_t *crcs, uint32_t n,
                      int32_t *status);

/*
 * Copies the loaded block b (key: its key) into dst (b->length bytes,
 * which must not overlap the block) and checks the CRC of the copy against
 * b->crc in the same pass, so what dst holds is exactly what was verified.
 * 0: dst holds the committed bytes. KV_ECORRUPT: they are not (dst holds
 * garbage: do not use it); the block is reported to the daemon (a RELEASE
 * of this handle's pin with KV_REL_CORRUPT: the daemon checks its own copy
 * and drops the block if that fails too) and b is marked unusable (status
 * KV_ECORRUPT, ptr NULL), its pin gone: do not release it again. Other
 * errors, with nothing copied: -EINVAL (NULL, or b not a usable block),
 * -EOPNOTSUPP (no CRC to check: a daemon before protocol 1.2, a block from
 * kvc_alloc, or a G1 block on a real GPU, which the CPU cannot read).
 */
int kvc_read(kvc *c, const kvc_key *key, kvc_block *b, void *dst);
/*
 * As kvc_read, in place: checks the CRC over the block's own bytes (0 or
 * KV_ECORRUPT, reported as above). Weaker than kvc_read: the bytes are
 * shared memory that a worker of the tenant may change after the check;
 * only a copy (kvc_read) is known to hold what was verified. For readers
 * that use the block where it is (a CPU pass over it before a device copy).
 */
int kvc_verify(kvc *c, const kvc_key *key, kvc_block *b);

/* A hint to bring blocks up to `tier`. Returns how many were queued. */
int kvc_prefetch(kvc *c, uint8_t tier, const kvc_key *keys, uint32_t n);
/* Deletes blocks (n == 0 and keys NULL: every block of the namespace).
 * Returns how many were deleted, or an error. Blocks pinned, being written
 * or being copied between tiers are skipped (not counted). */
int kvc_delete(kvc *c, const kvc_key *keys, uint32_t n);
/* Sets blocks' priority (0..255, lower evicted first). */
int kvc_set_priority(kvc *c, uint8_t prio, const kvc_key *keys, uint32_t n, int32_t *status);

/* --- engine hints (protocol 1.3): advice for eviction -------------------------
 *
 * A session is what the engine's API layer groups requests by: a
 * conversation, an agent run (OpenAI's prompt_cache_key, a chat id). Tell
 * the daemon which session stores or loaded blocks (kvc_hint_session,
 * after their ALLOC - before the COMMIT, so that they come in with their
 * session - or their LOAD), that a request finished and why
 * (kvc_hint_finished, from wherever the engine learns it; no keys needed),
 * and that a session is over (kvc_hint_end). The daemon uses them to keep
 * the blocks of sessions likely to come back and let go first those of
 * sessions likely done (tiers/EVICTION.md); wrong or missing hints cost a
 * little hit rate at most, never bytes or correctness. retain_s asks that
 * the session's blocks be kept that long after its last request (0: no
 * ask); the daemon caps it. Hints reach only the handle's namespace.
 * Each returns how many of the keys were blocks committed or being written
 * (0 when n is 0), or an error: -EOPNOTSUPP when the daemon predates
 * protocol 1.3, -EINVAL
 * for session 0 or a stop reason out of range. status (may be NULL): per
 * key, 0 or KV_ENOTFOUND.
 */
#define KVC_STOP_UNKNOWN       0
#define KVC_STOP_END_TURN      1 /* the user speaks next */
#define KVC_STOP_TOOL_USE      2 /* a tool result follows soon */
#define KVC_STOP_MAX_TOKENS    3
#define KVC_STOP_STOP_SEQUENCE 4
#define KVC_STOP_ABORTED       5
#define KVC_STOP_OTHER         6

/* A hint session's id from its name: FNV-1a 64 (0 becomes 1), the same in
 * the Python package, so engines that name a session alike agree on its id.
 * (Not kvc_session_id: that is the daemon's id of this connection.) */
uint64_t kvc_hint_session_id(const void *name, size_t len);
/* KVC_STOP_* for a stop reason's name: "end_turn"/"stop", "tool_use"/
 * "tool_calls", "max_tokens"/"length", "stop_sequence", "aborted"/"abort";
 * another name is KVC_STOP_OTHER, NULL or "" KVC_STOP_UNKNOWN. */
int kvc_stop_parse(const char *name);
int kvc_hint_session(kvc *c, uint64_t session, const kvc_key *keys, uint32_t n, uint32_t retain_s,
                     int32_t *status);
int kvc_hint_finished(kvc *c, uint64_t session, int stop, const kvc_key *keys, uint32_t n,
                      uint32_t retain_s, int32_t *status);
int kvc_hint_end(kvc *c, uint64_t session);

/* The slow inline path (tools, tests): the bytes travel in the frame.
 * len must be the namespace's block_bytes. get copies at most cap bytes
 * into buf and returns the block's length. */
int kvc_put(kvc *c, const kvc_key *key, const kvc_key *parent, uint8_t prio, const void *data,
            uint32_t len);
int kvc_get(kvc *c, const kvc_key *key, void *buf, uint32_t cap);

/* The daemon's status as JSON text; the caller frees *json with free(). */
int kvc_status(kvc *c, char **json);

/* --- non-blocking form ------------------------------------------------------ */

/* The socket, for poll/epoll/a libuv uv_poll: readable means kvc_poll()
 * has something to do. */
int kvc_fd(const kvc *c);

/* A finished request. For lookups, `result` is the hit length; for loads
 * and allocs the count of usable blocks; per-key results went into the
 * arrays given at submission. */
typedef struct kvc_completion {
  uint64_t id; /* what kvc_submit_* returned */
  int op;      /* KVC_OP_LOOKUP, ... */
  int result;  /* as the blocking call would return */
  void *user;  /* the submission's user pointer */
} kvc_completion;

#define KVC_OP_LOOKUP  2
#define KVC_OP_LOAD    3
#define KVC_OP_RELEASE 4
#define KVC_OP_ALLOC   5
#define KVC_OP_COMMIT  6

/* Submit without waiting; the arrays (keys and crcs are copied;
 * tiers/out/status are filled later) must stay valid until the completion
 * is returned; kvc_submit_commit_crc's completion says KVC_OP_COMMIT.
 * Return the request id (> 0) or an error. The request may block for at
 * most the handle's timeout when the socket's send buffer is full. */
int64_t kvc_submit_lookup(kvc *c, const kvc_key *keys, uint32_t n, uint8_t *tiers, void *user);
int64_t kvc_submit_lookup_all(kvc *c, const kvc_key *keys, uint32_t n, uint8_t *tiers,
                              void *user);
int64_t kvc_submit_load(kvc *c, uint8_t tier, const kvc_key *keys, uint32_t n, kvc_block *out,
                        void *user);
int64_t kvc_submit_release(kvc *c, const kvc_key *keys, uint32_t n, int32_t *status, void *user);
int64_t kvc_submit_alloc(kvc *c, uint8_t tier, uint8_t prio, const kvc_key *keys,
                         const kvc_key *parents, uint32_t n, kvc_block *out, void *user);
int64_t kvc_submit_commit(kvc *c, const kvc_key *keys, uint32_t n, int32_t *status, void *user);
int64_t kvc_submit_commit_shared(kvc *c, const kvc_key *keys, const uint32_t *crcs, uint32_t n,
                                 int32_t *status, void *user);
int64_t kvc_submit_commit_crc(kvc *c, const kvc_key *keys, const uint32_t *crcs, uint32_t n,
                              int32_t *status, void *user);
/* A hint without waiting (kind: 1 session, 2 finished, 3 end; the
 * arguments as the blocking calls'); its completion says KVC_OP_HINT. */
#define KVC_OP_HINT 17
int64_t kvc_submit_hint(kvc *c, int kind, uint64_t session, int stop, uint32_t retain_s,
                        const kvc_key *keys, uint32_t n, int32_t *status, void *user);

/* Reads what has arrived without blocking and returns up to max finished
 * requests (0 if none yet), or an error (the connection is then dead). */
int kvc_poll(kvc *c, kvc_completion *out, int max);
/* Requests submitted and not yet returned by kvc_poll(). */
int kvc_pending(const kvc *c);

/* ---- for engines: G2 as DMA memory, paged layouts, batched copies ---------- */

/*
 * Registers this handle's G2 mapping with CUDA on the calling thread's
 * current device (cudaHostRegister with cudaHostRegisterPortable |
 * cudaHostRegisterMapped), so an engine's copies between G2 blocks and its
 * device tensors are DMA (not staged pageable copies), and kernels can
 * reach G2 blocks in place. The registration is the worker's, of the
 * worker's own mapping, in its own process (the daemon registers its own
 * mapping of the same arena in its process: neither serves the other). It
 * pins the whole arena: expect it to take a while for a large one.
 * Idempotent (0 when already registered); undone by kvc_close, which the
 * caller must call only once its streams no longer use G2 blocks.
 * 0; -ENODEV: no CUDA in this build, no driver or no device (nothing
 * changed; kvc_g2_info().reason says why); -EIO: the driver refused
 * (nothing changed, reason set); -ENOMEM; -EINVAL (NULL). With
 * KV_DEV_BACKEND=sim in the environment the simulated device (cuda/dev.h,
 * backend SIM) records the registration instead (kv_dev_host_register on
 * a SIM kv_dev owned by the handle), so the paths above the CUDA calls run
 * in CI; such a registration serves KVC_MEM_HOST only (KVC_MEM_CUDA on its
 * blocks is -ENODEV). The calling thread's current device is left as it
 * was, here and in kvc_close.
 */
int kvc_g2_register_cuda(kvc *c);

typedef struct kvc_g2 {
  void *base; /* the G2 arena mapped in this process */
  uint64_t bytes;
  int registered;   /* 0, KVC_G1_CUDA or KVC_G1_SIM */
  char reason[256]; /* why kvc_g2_register_cuda failed; "" otherwise */
} kvc_g2;
/* Fills *out. 0, or -EINVAL (NULL). */
int kvc_g2_info(const kvc *c, kvc_g2 *out);

/* An engine's paged KV layout: cuda/kernels.h's kv_kern_layout, field for
 * field (same order, same types), with the same meaning: per layer, a
 * tensor [num_pages][2 (K, V)][page_tokens][kv_heads][head_dim] of
 * elem_bytes-wide elements, or a strided view of one (page_stride,
 * kv_stride in bytes, 0: dense; the vLLM flash-attention layout
 * [2, num_pages, ...] is page_stride = half, kv_stride = num_pages * half,
 * half = page_tokens * kv_heads * head_dim * elem_bytes). */
typedef struct kvc_page_layout {
  uint32_t layers, page_tokens, kv_heads, head_dim, elem_bytes, num_pages;
  uint64_t page_stride, kv_stride;
} kvc_page_layout;
#define KVC_MEM_HOST 0 /* engine tensors and blocks are host memory: memcpy */
#define KVC_MEM_CUDA \
  1 /* engine tensors are device memory of the current device: one kernel
                        * launch on `stream` */
/* Bytes of one block (kv_kern_block_bytes): layers * 2 * page_tokens *
 * kv_heads * head_dim * elem_bytes, the block_bytes to declare in HELLO
 * (kvc_layout, with tokens_per_block = page_tokens); 0 for a bad geometry
 * (a zero field, elem_bytes not 1, 2 or 4, more than 256 layers, strides
 * that overlap, a block over UINT32_MAX bytes). */
uint64_t kvc_page_block_bytes(const kvc_page_layout *lo);
/*
 * cuda/kernels.h's gather (page page_ids[i] of every layer -> block
 * blocks[i]) and scatter (block blocks[i] -> page page_ids[i] of every
 * layer), i < n, with the same contract and the same block format
 * ([layers][2][page_tokens][kv_heads][head_dim], no padding): layers[]
 * holds lo->layers tensor bases; a gather may name a page twice but its
 * blocks must not overlap, a scatter may not name a page twice. layers,
 * page_ids and blocks are host arrays, free again when the call returns.
 *
 * mem KVC_MEM_HOST: everything is host memory; done on return. A block
 * inside c's G1 pool on a real GPU is -EFAULT (device memory).
 * mem KVC_MEM_CUDA: blocks may be G1 pointers (device) or G2 pointers of a
 * handle whose mapping is registered (kvc_g2_register_cuda): c (may be
 * NULL when no block is in G2) lets the library translate a G2 pointer
 * into its device-side address (cudaHostGetDevicePointer of the arena
 * base, computed once at registration), and a G2 block of a handle that
 * is not registered is -EFAULT (never a silent pageable access). stream: a
 * cudaStream_t (NULL: legacy default). Returns once queued: the copy is
 * done when the stream says so, and the blocks (G2 slots, pins) must stay
 * the engine's until then.
 *
 * Either mode: a block that overlaps c's G2 mapping without lying inside
 * it is -EFAULT. Checked in this order, before anything is copied:
 * arguments (-EINVAL, -ENOMEM), G2 and G1 blocks (-EFAULT; -ENODEV for G2
 * blocks registered with the simulation under KVC_MEM_CUDA), the device.
 * n 0 (with a good geometry) is 0 and does nothing.
 * 0, -EINVAL (kernels.h's checks, or mem unknown), -ENODEV (KVC_MEM_CUDA
 * without CUDA: no CUDA in this build, no driver or no device), -EFAULT,
 * -EIO (CUDA error); kvc_cuda_error() gives the text behind -ENODEV/-EIO.
 */
int kvc_pages_gather(kvc *c, const kvc_page_layout *lo, void *const *layers,
                     const uint32_t *page_ids, void *const *blocks, size_t n, int mem,
                     void *stream);
int kvc_pages_scatter(kvc *c, const kvc_page_layout *lo, void *const *layers,
                      const uint32_t *page_ids, void *const *blocks, size_t n, int mem,
                      void *stream);

/*
 * Batched copies (e.g. G2 blocks -> a device staging buffer).
 * KVC_MEM_HOST: memcpy each, in order, synchronously.
 * KVC_MEM_CUDA: one cudaMemcpyBatchAsync (direction inferred from the
 * addresses, UVA; location hints from cudaPointerGetAttributes; a loop of
 * cudaMemcpyAsync on the legacy default stream, which the batch call
 * refuses, and from then on in this process when the driver refuses the
 * batch call, as cuda/dev_cuda.c does) on `stream`; returns once queued.
 * Copies of one batch are not ordered against each other. A host side
 * inside c's G2 mapping must be registered (else -EFAULT; a side that
 * overlaps the mapping without lying inside it is -EFAULT in either
 * mode); c may be NULL when none is.
 * Every copy is checked before any is made: all or nothing.
 * 0, -EINVAL (n 0 is fine and does nothing; v NULL, bytes 0, NULL
 * pointers, a copy whose source and destination overlap, mem unknown are
 * -EINVAL), -ENODEV, -EFAULT, -EIO (CUDA error; when the driver refused a
 * copy of the loop, the ones before it are queued: synchronize the stream
 * before reusing any), -ENOMEM.
 */
typedef struct kvc_copy {
  void *dst;
  const void *src;
  size_t bytes;
} kvc_copy;
int kvc_memcpy_batch(kvc *c, const kvc_copy *v, size_t n, int mem, void *stream);

/* Text of this thread's last CUDA error behind -EIO/-ENODEV from the calls
 * above (kvc_g2_register_cuda, kvc_pages_*, kvc_memcpy_batch), or "": each
 * of those calls clears it first. Never NULL. */
const char *kvc_cuda_error(void);

/* --- helpers ---------------------------------------------------------------- */

/* Message for any error this library returns; never NULL. */
const char *kvc_strerror(int err);

/* The library's version, "MAJOR.MINOR.PATCH". */
const char *kvc_version(void);

/*
 * The canonical chained block hash, for engines that have none of their own:
 *
 *   digest = BLAKE2b-256(key = salt,
 *                        "kvcached-chain-v1" || parent || LE32(ntokens) ||
 *                        LE32(token[0]) .. LE32(token[n-1]) || extra)
 *
 * `parent` is the previous block's digest, or NULL for the first block of a
 * sequence (hashed as 32 zero bytes). `salt` (may be NULL/0) keys the hash,
 * so two deployments or tenants with different salts never share a digest;
 * a salt shorter than 16 or longer than 64 bytes is first hashed to 32.
 * `extra` (may be NULL/0) carries whatever else decides the KV (LoRA id,
 * multimodal input hashes). A cryptographic hash: a collision would serve
 * one user's KV to another. Writes KVC_DIGEST_BYTES to out. Returns 0, or
 * -EINVAL for a NULL out or a NULL tokens with ntokens > 0.
 */
int kvc_chain_hash(uint8_t out[KVC_DIGEST_BYTES], const uint8_t parent[KVC_DIGEST_BYTES],
                   const int32_t *tokens, size_t ntokens, const void *extra, size_t extra_len,
                   const void *salt, size_t salt_len);

/* The keys of a whole sequence in one call: out[i] (KVC_DIGEST_BYTES each,
 * back to back) = kvc_chain_hash(out[i-1], or `parent` for i = 0, of tokens
 * [i * tokens_per_block, (i+1) * tokens_per_block), extra, salt), for every
 * FULL block (a partial last block gets no key), at most max_keys. The
 * same digests as kvc_chain_hash, block by block, at a fraction of the
 * cost: the salt's key is derived once and there is one call per sequence.
 * Returns the number of keys written, or -EINVAL (tokens_per_block 0, NULL
 * arrays with lengths). */
int kvc_chain_keys(uint8_t *out, size_t max_keys, const uint8_t parent[KVC_DIGEST_BYTES],
                   const int32_t *tokens, size_t ntokens, uint32_t tokens_per_block,
                   const void *extra, size_t extra_len, const void *salt, size_t salt_len);

#ifdef __cplusplus
}
#endif
#endif
