/*
 * wire.h - kvcached's wire protocol: frame header, messages, limits, and the
 * strict encoders and decoders that the daemon and libkvclient share.
 *
 * proto/PROTOCOL.md is the normative description of every byte; this header
 * is its C face. In short: a frame is a 32-byte little-endian header
 * (kv_hdr) followed by `len` payload bytes whose layout depends on the
 * opcode and on whether the frame is a request or a reply (KV_F_REPLY).
 *
 * Decoding is zero-copy: kv_msg_decode() fills a kv_msg whose pointers
 * point into the frame buffer (valid as long as that buffer is), and never
 * allocates. Variable-size arrays of the wire are exposed as "vectors" that
 * hold either a host array (set by a caller that encodes) or a pointer to
 * the packed wire bytes (set by the decoder); the kv_*vec_get() accessors
 * read both, so a decoded message can be re-encoded as is.
 *
 * Every encoding is canonical: a frame that kv_msg_decode() accepts is
 * reproduced byte for byte by kv_msg_encode() of the decoded message. The
 * tests and the fuzzers check exactly that.
 *
 * Errors: KV_EBADFRAME (malformed), KV_EBADVERSION (header version),
 * KV_EBADOP (unknown opcode), -EMSGSIZE (payload length over the limit),
 * -E2BIG (batch count over KV_BATCH_MAX), -EINVAL (encoder given a field the
 * protocol cannot carry), and kv_buf's -ENOMEM/-ENOBUFS.
 */
#ifndef KV_PROTO_WIRE_H
#define KV_PROTO_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/errors.h"
#include "base/hint.h"
#include "base/key.h"

/* ---- versions and limits -------------------------------------------------- */

#define KV_PROTO_MAGIC 0x4443564Bu /* bytes "KVCD" */
#define KV_PROTO_MAJOR 1           /* in every header; a change breaks peers */
/* negotiated by HELLO; additions only (1: G1_SELECT; 2: COMMIT with CRCs,
 * corrupt reports, LOAD2; 3: HINT; 4: KV_LOOKUP_ALL, KV_COMMIT_G4;
 * 5: PRESENCE, KV_LOAD_LOCAL) */
#define KV_PROTO_MINOR 5

#define KV_HDR_SIZE 32

#define KV_BATCH_MAX          4096        /* keys (or entries) in one batch */
#define KV_TENANT_MAX         64          /* bytes of a tenant name (1..64) */
#define KV_GROUP_MAX          64          /* bytes of a TP group name (0..64) */
#define KV_SALT_MAX           64          /* bytes of a namespace salt (0..64) */
#define KV_DTYPE_MAX          16          /* bytes of a dtype name (1..16) */
#define KV_TIERINFO_MAX       8           /* entries in HELLO reply's tier-info list */
#define KV_TIERINFO_BYTES_MAX 1024        /* bytes of one tier-info entry's value */
#define KV_ERRMSG_MAX         255         /* bytes of an ERROR reply's message */
#define KV_INLINE_MAX         (64u << 20) /* bytes of one block through PUT/GET */

/* Largest payload of a control frame (every frame but the two below). */
#define KV_PAYLOAD_MAX_CTRL (1u << 20)
/* Largest payload of a PUT request or a GET reply: the block and its key. */
#define KV_PAYLOAD_MAX_DATA (KV_INLINE_MAX + 128u)
/* Largest STATUS reply text: what fits a control frame. */
#define KV_STATUS_TEXT_MAX  (KV_PAYLOAD_MAX_CTRL - 4u)
/* Bytes of a PUT request besides its block: prio, key and parent (str8 of
 * up to KV_KEY_MAX bytes each) and the block's length. */
#define KV_PUT_OVERHEAD     (1u + 2u * (1u + KV_KEY_MAX) + 4u)

/* ---- header ----------------------------------------------------------------- */

typedef enum kv_op {
  KV_OP_HELLO = 1,
  KV_OP_LOOKUP = 2,
  KV_OP_LOAD = 3,
  KV_OP_RELEASE = 4,
  KV_OP_ALLOC = 5,
  KV_OP_COMMIT = 6,
  KV_OP_ABORT = 7,
  KV_OP_PREFETCH = 8,
  KV_OP_DELETE = 9,
  KV_OP_SET_PRIORITY = 10,
  KV_OP_PUT = 11,
  KV_OP_GET = 12,
  KV_OP_STATUS = 13,
  KV_OP_ERROR = 14,     /* reply only: the request failed as a whole */
  KV_OP_G1_SELECT = 15, /* since 1.1: the G1 pool of the worker's device */
  KV_OP_LOAD2 = 16,     /* since 1.2: LOAD whose reply carries each block's committed CRC */
  KV_OP_HINT = 17,      /* since 1.3: engine hints (base/hint.h) */
  KV_OP_PRESENCE = 18,  /* since 1.5: the namespace's presence table (proto/presence.h) */
  KV_OP_COUNT           /* one past the last opcode; not an opcode */
} kv_op;

/* Header flags. Any other bit set is KV_EBADFRAME. */
#define KV_F_REPLY 0x0001u /* a reply (daemon -> worker) */
#define KV_F_FD \
  0x0002u /* an fd travels with this frame: the G2 arena (HELLO
                            * reply), the G1 pool (G1_SELECT reply) or the
                            * presence table (PRESENCE reply) */
#define KV_F_FD2 \
  0x0004u /* a second fd travels, after the first (the G1 pool);
                            * only with KV_F_FD, only on a HELLO reply */
#define KV_F_KNOWN (KV_F_REPLY | KV_F_FD | KV_F_FD2)

/* HELLO capability bits. Unknown bits are ignored by the receiver and never
 * granted in the reply: they are how a minor version adds a feature. */
#define KV_CAP_G1 0x00000001u /* the worker can import G1 (device) memory */

/* Batch request flags (kv_batch_req.flags); each is valid on its op only. */
#define KV_DEL_ALL 0x01u /* DELETE: every block of the session's namespace */
#define KV_COMMIT_CRC \
  0x02u /* COMMIT (1.2): n x u32 follow the keys, the CRC-32C of
                              * each block as its writer computed it (kv_batch_req.crcs) */
#define KV_REL_CORRUPT \
  0x04u /* RELEASE (1.2): the reader found these blocks' bytes
                              * failing their committed CRC (the daemon re-checks) */
#define KV_COMMIT_G4 \
  0x10u /* COMMIT (1.4): answered once each block's G4 write has ended; \
         * a block committed here but not written there: KV_EDEGRADED */
#define KV_LOOKUP_ALL \
  0x08u /* LOOKUP (1.4): G4 is asked past its first miss too, and \
         * every block it has is brought in, not only a leading run */
#define KV_LOAD_LOCAL \
  0x20u /* LOAD, LOAD2 (1.5): the keys come from a lookup the worker \
         * answered from its presence table (the daemon counts those \
         * the LOAD finds missing: kvcached_presence_contradicted_total) */

/* Tier-info kinds (HELLO reply). Unknown kinds are skipped by clients. */
#define KV_TI_G1_VMM_FD     1 /* G1 pool, CUDA VMM POSIX-fd handle (the fd: KV_F_FD2) */
#define KV_TI_G1_LEGACY_IPC 2 /* G1 pool, legacy cudaIpcMemHandle in the value, no fd */
#define KV_TI_G1_SIM_FD     3 /* G1 pool, simulated device memory (memfd: KV_F_FD2) */
#define KV_TI_G1_NONE       4 /* no G1 pool for this worker: the value is the reason (text) */
#define KV_TI_G1_VMM        KV_TI_G1_VMM_FD /* older names */
#define KV_TI_G1_CUDAIPC    KV_TI_G1_LEGACY_IPC

typedef struct kv_hdr {
  uint32_t magic;   /* KV_PROTO_MAGIC */
  uint16_t version; /* KV_PROTO_MAJOR */
  uint16_t op;      /* kv_op */
  uint16_t flags;   /* KV_F_* */
  uint16_t rsv0;    /* zero */
  uint32_t len;     /* payload bytes after the header */
  uint64_t id;      /* request id; a reply carries its request's id */
  int32_t status;   /* 0; negative in an ERROR reply */
  uint32_t rsv1;    /* zero */
} kv_hdr;

/*
 * Parses the first KV_HDR_SIZE bytes of p and checks what keeps a byte
 * stream in sync: the magic (KV_EBADFRAME), the version (KV_EBADVERSION)
 * and the payload length against kv_payload_max() (-EMSGSIZE). n below
 * KV_HDR_SIZE is KV_EBADFRAME. Everything else (flags, opcode, reserved
 * fields) is left to kv_msg_decode(), so a reader can still skip one bad
 * frame. Returns 0 and fills *h, or the error (with *h filled as far as
 * it could be read).
 */
int kv_hdr_parse(const void *p, size_t n, kv_hdr *h);

/* Writes h as KV_HDR_SIZE bytes at p. No checks. */
void kv_hdr_write(void *p, const kv_hdr *h);

/* The largest payload a frame of opcode `op` may carry (request when
 * reply == 0). An unknown opcode gets the control limit, so that a reader
 * can skip it and the receiver answer KV_EBADOP. */
uint32_t kv_payload_max(uint16_t op, int reply);

/* The largest request payload that opcode op's layout (PROTOCOL.md,
 * section 7) allows: a HELLO with every string at its limit, a batch or an
 * ALLOC of KV_BATCH_MAX keys of KV_KEY_MAX bytes, a PUT of a KV_INLINE_MAX
 * block (KV_PUT_OVERHEAD + KV_INLINE_MAX), ...; never above
 * kv_payload_max(op, 0). 0 for ERROR and unknown opcodes, which have no
 * request layout. A receiver uses it to refuse an oversized request from
 * its header alone. */
uint32_t kv_req_payload_max(uint16_t op);

/* "LOOKUP", ...; NULL for an unknown opcode. */
const char *kv_op_name(uint16_t op);

/* ---- message parts ---------------------------------------------------------- */

/* A string or byte string inside a frame: not NUL-terminated. */
typedef struct kv_str {
  const char *p;
  uint32_t len;
} kv_str;

typedef struct kv_bytes {
  const uint8_t *p;
  uint32_t len;
} kv_bytes;

/*
 * n keys, all klen bytes long (1..KV_KEY_MAX; 0 iff n == 0), the i-th at
 * p + i * stride. stride 0 means klen (packed, as on the wire). A decoded
 * vector is packed and points into the frame.
 */
typedef struct kv_keyvec {
  const uint8_t *p;
  uint32_t n;
  uint8_t klen;
  uint16_t stride;
} kv_keyvec;

/* Points v at an array of n kv_key (all of one length) without copying.
 * 0, or -EINVAL when lengths differ or one is 0 or > KV_KEY_MAX. */
int kv_keyvec_from_keys(kv_keyvec *v, const kv_key *keys, uint32_t n);
/* The i-th key's bytes (klen of them); i < n. */
static inline const uint8_t *kv_keyvec_at(const kv_keyvec *v, uint32_t i) {
  return v->p + (size_t)i * (v->stride ? v->stride : v->klen);
}
/* Copies the i-th key into *out; i < n. 0, or -EINVAL (i out of range). */
int kv_keyvec_get(const kv_keyvec *v, uint32_t i, kv_key *out);

/* Per-key status: 0, or a negative -errno / KV_E* (never positive). */
typedef struct kv_statvec {
  uint32_t n;
  const int32_t *v;    /* encode: host array */
  const uint8_t *wire; /* decode: n packed little-endian i32 */
} kv_statvec;
/* The i-th status (i < n), from v or wire. */
int32_t kv_statvec_get(const kv_statvec *s, uint32_t i);

/* LOAD and LOAD2 reply entry. A hit: status 0, tier G1/G2, length > 0. A
 * miss: status < 0 (its reason), tier KV_TIER_NONE, offset 0, length 0,
 * crc 0. crc travels in LOAD2 replies only (a LOAD reply ignores it when
 * encoding and decodes it as 0). */
typedef struct kv_load_ent {
  int32_t status;
  uint8_t tier;
  uint64_t offset; /* byte offset of the slot in the tier's shared memory */
  uint32_t length; /* bytes */
  uint32_t crc;    /* LOAD2: the CRC-32C the block was committed with */
} kv_load_ent;

typedef struct kv_loadvec {
  uint32_t n;
  const kv_load_ent *v;
  const uint8_t *wire; /* n packed entries: 17 bytes (LOAD) or 21 (LOAD2) */
  uint8_t with_crc;    /* decoded from a LOAD2 reply: wire entries carry the crc */
} kv_loadvec;
void kv_loadvec_get(const kv_loadvec *l, uint32_t i, kv_load_ent *out);

/* n u32 values (COMMIT's CRCs). */
typedef struct kv_u32vec {
  uint32_t n;
  const uint32_t *v;   /* encode: host array */
  const uint8_t *wire; /* decode: n packed little-endian u32 */
} kv_u32vec;
/* The i-th value (i < n), from v or wire. */
uint32_t kv_u32vec_get(const kv_u32vec *u, uint32_t i);

/* ALLOC reply entry: status 0 and the slot's offset, or status < 0 and 0. */
typedef struct kv_alloc_ent {
  int32_t status;
  uint64_t offset;
} kv_alloc_ent;

typedef struct kv_allocvec {
  uint32_t n;
  const kv_alloc_ent *v;
  const uint8_t *wire; /* n packed 12-byte entries */
} kv_allocvec;
void kv_allocvec_get(const kv_allocvec *a, uint32_t i, kv_alloc_ent *out);

/* One entry of HELLO reply's tier-info list (room for G1 export info). */
typedef struct kv_tierinfo {
  uint8_t tier; /* kv_tier */
  uint8_t kind; /* KV_TI_* (opaque to the codec) */
  uint16_t len; /* <= KV_TIERINFO_BYTES_MAX */
  const uint8_t *p;
} kv_tierinfo;

/* G1_SELECT: the worker names the device it computes on (CUDA's uuid of
 * it); the reply is one tier-info entry, tier KV_G1: the export of the
 * daemon's pool on that device (its fd, for kinds that have one, travels
 * with KV_F_FD), or KV_TI_G1_NONE with the reason there is none. */
#define KV_UUID_BYTES 16
typedef struct kv_g1_select_req {
  uint8_t uuid[KV_UUID_BYTES];
} kv_g1_select_req;

/* ---- messages ----------------------------------------------------------------- */

typedef struct kv_layout {
  uint32_t block_bytes;      /* > 0 */
  uint32_t tokens_per_block; /* > 0 */
  uint32_t layers;
  uint32_t kv_heads;
  uint32_t head_dim;
  uint16_t tp_rank; /* < tp_size */
  uint16_t tp_size; /* > 0 */
  kv_str dtype;     /* 1..KV_DTYPE_MAX bytes of UTF-8 */
} kv_layout;

typedef struct kv_hello_req {
  uint16_t ver_major; /* the protocol version the worker wants (its highest) */
  uint16_t ver_minor;
  uint32_t caps; /* KV_CAP_* the worker offers */
  kv_str tenant; /* 1..KV_TENANT_MAX bytes of UTF-8 */
  kv_str group;  /* TP group, 0..KV_GROUP_MAX bytes (0: none) */
  kv_bytes salt; /* 0..KV_SALT_MAX bytes */
  kv_layout layout;
} kv_hello_req;

typedef struct kv_hello_rep {
  uint16_t ver_major; /* the version spoken on this connection */
  uint16_t ver_minor;
  uint32_t caps; /* KV_CAP_* granted */
  uint64_t session_id;
  uint32_t ns_id;
  uint64_t arena_bytes; /* G2 arena size; > 0 iff the arena fd travels (KV_F_FD) */
  uint32_t slot_align;
  uint32_t slot_bytes;
  uint8_t ntierinfo;            /* <= KV_TIERINFO_MAX */
  const kv_tierinfo *tierinfo;  /* encode: host array */
  const uint8_t *tierinfo_wire; /* decode: the packed list */
} kv_hello_rep;
/* The i-th tier-info entry (i < ntierinfo), from either form. */
void kv_hello_tierinfo(const kv_hello_rep *r, unsigned i, kv_tierinfo *out);

/*
 * The request body of every op that names a batch of keys: LOOKUP, LOAD,
 * LOAD2, RELEASE, COMMIT, ABORT, PREFETCH, DELETE, SET_PRIORITY. A field an
 * op does not use must be 0.
 *   tier:  LOAD, LOAD2, PREFETCH: the target tier, KV_G1 or KV_G2.
 *   prio:  SET_PRIORITY: the new priority (0..255, lower evicted first).
 *   flags: DELETE: KV_DEL_ALL (then keys.n must be 0); COMMIT:
 *          KV_COMMIT_CRC (then crcs.n == keys.n), KV_COMMIT_G4; RELEASE:
 *          KV_REL_CORRUPT;
 *          LOOKUP: KV_LOOKUP_ALL; LOAD, LOAD2: KV_LOAD_LOCAL.
 *   crcs:  COMMIT with KV_COMMIT_CRC: the CRC-32C of each key's block, after
 *          the keys on the wire; otherwise n == 0.
 */
typedef struct kv_batch_req {
  uint8_t tier;
  uint8_t prio;
  uint8_t flags;
  kv_keyvec keys;
  kv_u32vec crcs;
} kv_batch_req;

/* ALLOC: reserve slots for new blocks in `tier` (KV_G1 or KV_G2). Entry i
 * is keys[i] with parent parents[i] when has_parent[i] is 1. has_parent and
 * parents may be NULL/empty (no parents) when encoding; decoded, both are
 * set and parents has the keys' length. */
typedef struct kv_alloc_req {
  uint8_t tier;
  uint8_t prio;
  kv_keyvec keys;
  const uint8_t *has_parent; /* n bytes, each 0 or 1 */
  kv_keyvec parents;         /* absent entries: bytes ignored (zero on the wire) */
} kv_alloc_req;
/* Entry i's parent key bytes (keys.klen of them), or NULL if it has none. */
const uint8_t *kv_alloc_parent(const kv_alloc_req *a, uint32_t i);

/* HINT (1.3): advice about session `session` (non-zero) of the caller's
 * namespace; base/hint.h says what each kind means.
 *   kind      KV_HINT_SESSION, KV_HINT_FINISHED or KV_HINT_END
 *   stop      FINISHED: the request's stop reason (kv_stop); otherwise 0
 *   retain_s  SESSION, FINISHED: seconds to keep the session's blocks after
 *             its last request (0: none); END: 0
 *   keys      SESSION: the blocks (1..); FINISHED: the request's blocks
 *             (0..); END: none
 * The reply is STATUSES, one per key (KV_ENOTFOUND: not resident). */
typedef struct kv_hint_req {
  uint8_t kind;
  uint8_t stop;
  uint32_t retain_s;
  uint64_t session;
  kv_keyvec keys;
} kv_hint_req;

/* PRESENCE (1.5): the request is one byte of flags (0). The reply maps
 * the session's namespace's presence table: bytes (> 0) of it, whose fd
 * travels with KV_F_FD, and flags (KV_PRES_* of proto/presence.h, as the
 * table's header has them then). A session whose answers no table can give
 * (a TP group's: its ranks must agree on one length) gets an ERROR
 * -EOPNOTSUPP. */
typedef struct kv_presence_rep {
  uint64_t bytes;
  uint32_t flags;
} kv_presence_rep;

typedef struct kv_lookup_rep {
  uint32_t hit_len; /* resident prefix length (TP-group consistent), <= n */
  uint32_t n;
  const uint8_t *tiers; /* n bytes: KV_G1, KV_G2, KV_G3 or KV_TIER_NONE */
} kv_lookup_rep;

typedef struct kv_delete_rep {
  uint64_t deleted; /* blocks deleted */
  kv_statvec st;    /* per key; n == 0 for KV_DEL_ALL */
} kv_delete_rep;

typedef struct kv_put_req {
  uint8_t prio;
  kv_bytes key;    /* 1..KV_KEY_MAX */
  kv_bytes parent; /* 0 (none) .. KV_KEY_MAX */
  kv_bytes data;   /* 1..KV_INLINE_MAX */
} kv_put_req;

typedef struct kv_get_rep {
  uint8_t tier;  /* where the bytes were found */
  kv_bytes data; /* 1..KV_INLINE_MAX */
} kv_get_rep;

typedef struct kv_error_rep {
  uint16_t req_op; /* the opcode of the failed request (may be unknown) */
  kv_str msg;      /* 0..KV_ERRMSG_MAX bytes of UTF-8 */
} kv_error_rep;

/*
 * One frame, decoded or to encode. op and (flags & KV_F_REPLY) select the
 * union member:
 *   HELLO          req hello          rep hello_rep
 *   LOOKUP         req batch          rep lookup_rep
 *   LOAD, LOAD2    req batch          rep load_rep (LOAD2: with crc)
 *   RELEASE        req batch          rep statuses
 *   ALLOC          req alloc          rep alloc_rep
 *   COMMIT, ABORT  req batch          rep statuses
 *   PREFETCH       req batch          rep prefetch_queued
 *   DELETE         req batch          rep delete_rep
 *   SET_PRIORITY   req batch          rep statuses
 *   PUT            req put            rep (empty)
 *   GET            req get_key        rep get_rep
 *   STATUS         req status_flags   rep status_text (UTF-8 JSON)
 *   G1_SELECT      req g1_select      rep g1_pool (tier KV_G1)
 *   HINT           req hint           rep statuses
 *   PRESENCE       req presence_flags rep presence_rep (the table's fd)
 *   ERROR          -                  rep error, with status < 0
 */
typedef struct kv_msg {
  uint16_t op;    /* kv_op */
  uint16_t flags; /* KV_F_REPLY, KV_F_FD (set it when an fd travels) */
  int32_t status; /* 0, except an ERROR reply: < 0 */
  uint64_t id;    /* request id: non-zero in requests; replies echo it */
  union {
    kv_hello_req hello;
    kv_batch_req batch;
    kv_alloc_req alloc;
    kv_put_req put;
    kv_bytes get_key;     /* 1..KV_KEY_MAX */
    uint8_t status_flags; /* 0 */
    uint8_t presence_flags; /* 0 */
    kv_g1_select_req g1_select;
    kv_hint_req hint;
    kv_hello_rep hello_rep;
    kv_lookup_rep lookup_rep;
    kv_loadvec load_rep;
    kv_statvec statuses;
    kv_allocvec alloc_rep;
    uint32_t prefetch_queued;
    kv_delete_rep delete_rep;
    kv_get_rep get_rep;
    kv_str status_text; /* 0..KV_STATUS_TEXT_MAX bytes */
    kv_error_rep error;
    kv_tierinfo g1_pool;
    kv_presence_rep presence_rep;
  };
} kv_msg;

/* ---- codec ------------------------------------------------------------------ */

/*
 * Decodes exactly one frame of n bytes: header and payload, no more, no
 * less. On success returns 0 and fills *m with pointers into frame (valid
 * while frame is). On error returns KV_EBADFRAME, KV_EBADVERSION,
 * KV_EBADOP, -EMSGSIZE or -E2BIG; when the header itself parsed, m->op,
 * m->flags and m->id are those of the frame (so an ERROR reply can name
 * the request), and the rest of *m is unspecified. Never reads outside
 * frame[0..n), never allocates, never writes outside *m.
 */
int kv_msg_decode(const void *frame, size_t n, kv_msg *m);

/*
 * Appends m as one frame to b. Checks every field as the decoder would
 * (-EINVAL for a field the protocol cannot carry, -E2BIG for a count over
 * KV_BATCH_MAX, -EMSGSIZE for a payload over the limit, KV_EBADOP for an
 * unknown opcode) and returns kv_buf's -ENOMEM/-ENOBUFS; on any error b is
 * unchanged. The frame is at the old b->len .. b->len.
 */
int kv_msg_encode(kv_buf *b, const kv_msg *m);

/*
 * As kv_msg_encode(), but a frame whose last field is bulk bytes (PUT's and
 * GET reply's data, the STATUS text) is written without those bytes: *tail
 * is set to them and the caller sends them right after what b holds
 * (writev). For other frames *tail is {NULL, 0} and the frame is whole.
 */
int kv_msg_encode_head(kv_buf *b, const kv_msg *m, kv_bytes *tail);

/*
 * Appends an ERROR reply to request `id` (opcode req_op) with status
 * (< 0) and msg (a C string, may be NULL), cut to KV_ERRMSG_MAX bytes at a
 * UTF-8 character boundary. Returns as kv_msg_encode(); -EINVAL for a
 * status >= 0.
 */
int kv_msg_encode_error(kv_buf *b, uint64_t id, uint16_t req_op, int32_t status, const char *msg);

/* 1 if p[0..n) is well-formed UTF-8 without NUL bytes, else 0. */
int kv_utf8_ok(const void *p, size_t n);

#endif
