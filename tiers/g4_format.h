/*
 * g4_format.h - the G4 value format and Redis key naming: what a block looks
 * like in the cluster tier. Pure functions, no I/O (tiers/G4.md has the byte
 * layout; this file and G4.md must agree).
 *
 * A G4 value is self-describing: a KV_G4_HDR_LEN-byte header (magic,
 * version, header length, key length, payload length, payload CRC32C, the
 * id of the secret that signed it, namespace digest, key, MAC, header
 * CRC32C) then the payload. Every multi-byte field is little-endian. A
 * reader checks a value against the namespace and key it asked for, its
 * length, both checksums and its MAC before it serves a byte: a value
 * another node wrote for another block, a value cut short, a value from a
 * newer format, a flipped bit, a value nobody holding the fleet's secret
 * wrote - each is refused with its own reason (kv_g4_miss), so the caller
 * counts misses by reason. A refused value is a miss, never a wrong hit.
 *
 * Authentication: the MAC is Poly1305 over the header up to the MAC and
 * the payload, in one pass, under a one-time key made by ChaCha20 of the
 * value's random 12-byte nonce (in the header) and a key derived from the
 * fleet's secret (kv_g4_secret: 32 to 64 bytes that every daemon of the
 * fleet holds and nothing else does) - the construction of RFC 8439's
 * ChaCha20-Poly1305, about four times cheaper than a keyed BLAKE2b
 * (Poly1305 by OpenSSL's libcrypto, whose vector code is 2.5 times
 * libsodium's; libsodium where libcrypto fails: the same tags). The
 * CRCs catch accidents; the MAC catches intent: whoever can reach the
 * cluster but lacks the secret cannot make a value a reader accepts (they
 * can delete one: a miss). The header names the secret by a 4-byte id
 * derived from it, so a reader picks the one key that may verify it: the
 * current secret, or during a rotation the old one, until its end
 * (kv_g4_keys.old_until). A value may be replayed under its own name
 * (the MAC covers the namespace and key, so never under another's).
 *
 * Redis keys: "<prefix><hex ns digest>:<hex key>", e.g.
 * "kv:0a1b...(64 digits):9f8e...(2..64 digits)". The whole name is hashed
 * (no hash tag), so one namespace's blocks spread over every slot and every
 * master; batched reads go per node, pipelined, not one MGET.
 */
#ifndef KV_TIERS_G4_FORMAT_H
#define KV_TIERS_G4_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#define KV_G4_NS_BYTES    32 /* namespace digest (as KV_G3_NS_BYTES) */
#define KV_G4_KEY_MAX     32 /* key bytes, 1..32 */
#define KV_G4_VERSION     2
#define KV_G4_VERSION_CODED 3 /* a value whose payload is stored coded */
/* How a coded value's payload is stored (its header's byte 10) */
#define KV_G4_CODING_PLANES 1 /* lossless: tiers/codec.h (0 reads as this) */
#define KV_G4_CODING_FP8    2 /* lossy: tiers/quant.h's FP8 codes */
#define KV_G4_CODING_INT8   3 /* lossy: tiers/quant.h's INT8 codes */
#define KV_G4_HDR_LEN     128u
#define KV_G4_MAGIC       0x3447564Bu /* "KVG4" as little-endian bytes */
#define KV_G4_PREFIX      "kv:"       /* default Redis key prefix */
#define KV_G4_PREFIX_MAX  32
/* Longest Redis key name, NUL included: prefix, 64 + 1 + 64 digits. */
#define KV_G4_RKEY_MAX    (KV_G4_PREFIX_MAX + 2 * KV_G4_NS_BYTES + 1 + 2 * KV_G4_KEY_MAX + 1)
#define KV_G4_PAYLOAD_MAX (512u << 20) /* Redis' largest string, less the header */
#define KV_G4_MAC_BYTES   16 /* Poly1305 */
#define KV_G4_NONCE_BYTES 12 /* random, per value: its one-time MAC key's */
#define KV_G4_SECRET_MIN  32 /* bytes of a fleet's secret (crypto_generichash's key) */
#define KV_G4_SECRET_MAX  64

typedef struct kv_g4_key {
  uint8_t ns[KV_G4_NS_BYTES]; /* namespace digest */
  uint8_t len;                /* 1..KV_G4_KEY_MAX */
  uint8_t b[KV_G4_KEY_MAX];
} kv_g4_key;

/* Why kv_g4_check refused a value. Append only: the names are metric labels. */
#define KV_G4_MISS_MAP(X)                                                    \
  X(OK, "ok")                 /* accepted */                                 \
  X(SHORT, "short")           /* cut short: fewer bytes than the header, or \
                                 than header and payload */                  \
  X(MAGIC, "magic")           /* not a G4 value at all */                    \
  X(VERSION, "version")       /* a G4 value of another format version */     \
  X(HEADER_CRC, "header_crc") /* the header failed its checksum */           \
  X(KEY, "key")               /* another namespace or key than asked */      \
  X(LENGTH, "length")         /* bytes beyond the payload, or a payload   \
                                 length other than the caller expects */     \
  X(PAYLOAD_CRC, "payload_crc") /* the payload failed its checksum */       \
  X(MAC, "mac")               /* intact, but not signed by a secret this  \
                                 reader accepts: forged, another fleet's, \
                                 or an old secret past its window */        \
  X(DECODE, "decode")         /* a coded value, intact and signed, whose  \
                                 stored bytes do not decode to the block  \
                                 (its CRC): the caller's check, after    \
                                 kv_g4_check */
typedef enum {
#define KV_G4_MISS_ENUM(name, label) KV_G4_MISS_##name,
  KV_G4_MISS_MAP(KV_G4_MISS_ENUM)
#undef KV_G4_MISS_ENUM
  KV_G4_MISS_COUNT
} kv_g4_miss;

/* The reason's metric label ("payload_crc"), or "?". */
const char *kv_g4_miss_name(int why);

/* A fleet's secret, as a daemon holds it. */
typedef struct kv_g4_secret {
  uint8_t b[KV_G4_SECRET_MAX];
  uint8_t len;    /* KV_G4_SECRET_MIN..KV_G4_SECRET_MAX; 0: none */
  uint32_t id;    /* its id in a value's header (kv_g4_secret_init) */
  uint8_t mk[32]; /* its MAC key: ChaCha20's, for the one-time keys */
} kv_g4_secret;

/* The secrets a reader accepts: cur, which also signs every value written,
 * and during a rotation old, accepted while now < old_until (Unix
 * seconds) and never used to sign. */
typedef struct kv_g4_keys {
  kv_g4_secret cur;
  kv_g4_secret old; /* len 0: none */
  int64_t old_until;
} kv_g4_keys;

/* Fills *s with b[0..len), its id: the first 4 bytes (little-endian) of
 * BLAKE2b-256 keyed with it over "kvcached-g4-secret-id", so that the id
 * tells nothing of the secret, and its MAC key: BLAKE2b-256 keyed with it
 * over "kvcached-g4-mac-key". 0, -EINVAL for a len out of
 * KV_G4_SECRET_MIN..KV_G4_SECRET_MAX, or -ENOSYS when libsodium cannot
 * start (nothing written). Initializes libsodium (sodium_init), which also
 * picks its fastest BLAKE2b for this CPU. */
int kv_g4_secret_init(kv_g4_secret *s, const uint8_t *b, size_t len);

/* Bytes of the value that carries `len` payload bytes. */
static inline size_t kv_g4_value_len(uint32_t len) { return KV_G4_HDR_LEN + (size_t)len; }

/* Writes the header for payload[0..len), whose CRC32C must be `crc`,
 * signed with secret s under a fresh random nonce (two headers of one
 * block differ), into out[0..KV_G4_HDR_LEN): the payload is read twice,
 * for its CRC and for the MAC (it may already lie at out +
 * KV_G4_HDR_LEN). A signed value's payload matches its CRC, so readers of
 * it need only the MAC's pass (the header says so: kv_g4_check). The
 * payload follows the header in the value; it is the caller's to place
 * (or to send as a second part of the same string), and it must be these
 * bytes. 0; KV_ECORRUPT when the payload does not match crc (bytes that
 * changed since their CRC was taken: nothing is signed); -EINVAL for a
 * key length out of 1..KV_G4_KEY_MAX, a len over KV_G4_PAYLOAD_MAX or a
 * secret without a valid length. Nothing is written on an error. */
int kv_g4_encode_hdr(const kv_g4_key *k, const kv_g4_secret *s, const void *payload, uint32_t len,
                     uint32_t crc, uint8_t *out);

/* Writes a whole value: header then payload[0..len), into out, which holds
 * kv_g4_value_len(len) bytes. The payload's CRC is computed while it is
 * copied (so it holds by construction). Returns the value's length, or
 * -EINVAL as kv_g4_encode_hdr. */
long kv_g4_encode(const kv_g4_key *k, const kv_g4_secret *s, const void *payload, uint32_t len,
                  uint8_t *out);

/* Writes the header of a coded value (version KV_G4_VERSION_CODED) into
 * out[0..KV_G4_HDR_LEN): stored[0..slen) are the bytes of a payload of len
 * bytes coded by `coding` (KV_G4_CODING_*; dtype, for the lossy ones: 1
 * BF16, 2 FP16, the elements they decode to), and crc is the CRC32C of
 * what a reader decodes: the payload itself (lossless; the caller checked
 * the payload it coded against it) or its lossy decoding. The header says
 * both lengths and both CRCs (the stored bytes' is computed here); the MAC
 * covers the header and the stored bytes, which follow the header in the
 * value. 0, or -EINVAL as kv_g4_encode_hdr, or for an slen of 0 or not
 * below len (a value that does not shrink is written raw), or an unknown
 * coding or dtype. */
int kv_g4_encode_hdr_coded(const kv_g4_key *k, const kv_g4_secret *s, const void *stored,
                           uint32_t slen, uint32_t len, uint32_t crc, int coding, int dtype,
                           uint8_t *out);

/* What a checked value holds: the payload (pointing into the value), or
 * for a coded value its stored bytes, which the caller decodes to len
 * bytes and checks against crc (a mismatch is a DECODE miss). */
typedef struct kv_g4_view {
  const uint8_t *payload; /* coded: the stored bytes */
  uint32_t len;           /* the block's bytes */
  uint32_t crc;           /* the block's CRC32C */
  uint32_t stored_len;    /* coded: the stored bytes' length; else len */
  int coded;
  int coding, dtype;      /* coded: KV_G4_CODING_* (0 read as PLANES); the lossy ones' dtype
                           * (1 BF16, 2 FP16) */
} kv_g4_view;

/* Checks val[0..n) as the value of block `expect`, signed by a secret of
 * keys as of `now` (Unix seconds: the old secret counts while now <
 * keys->old_until). expect_len is the payload length the caller expects,
 * or 0 for any. On success fills *v and returns 0. Otherwise returns
 * KV_EBADVERSION (KV_G4_MISS_VERSION) or KV_ECORRUPT (every other reason),
 * sets *why (when why is not NULL) and leaves *v alone. Checks in order:
 * magic (when 4 bytes are there), room for the header, version, header
 * CRC, namespace and key, expected length, value length, payload CRC, MAC
 * (the secret named by the header's id, compared in constant time; an id
 * of no secret accepted now is MAC too); so a value cut short anywhere is
 * a SHORT miss (never a PAYLOAD_CRC one), a value without the magic is
 * MAGIC however short, damage by accident keeps its CRC reasons, and only
 * a value intact but not signed by an accepted secret is MAC. A value
 * whose header says its signer checked the payload's CRC (every value
 * kv_g4_encode_hdr writes) costs one pass, the MAC's: its payload CRC is
 * computed only when the MAC fails, to give the reason. */
/* Versions 2 (raw) and 3 (coded) are read: for a coded value, the value
 * length is the header and the stored length, the stored bytes' CRC and
 * the MAC over them take the places of the payload's, and the stored
 * length must be below the payload's (LENGTH otherwise); a coding or a
 * dtype this reader does not know is VERSION. */
int kv_g4_check(const void *val, size_t n, const kv_g4_key *expect, uint32_t expect_len,
                const kv_g4_keys *keys, int64_t now, kv_g4_view *v, kv_g4_miss *why);

/* 1 if prefix may prefix G4 key names: 0..KV_G4_PREFIX_MAX bytes of
 * printable ASCII without space, '{' or '}' (a brace would make a hash tag
 * and pin names to one slot). */
int kv_g4_prefix_ok(const char *prefix);

/* Writes the Redis key name of k under prefix (NULL: KV_G4_PREFIX) and a NUL
 * into out[0..n). Returns its length (no NUL), or -EINVAL for a bad prefix
 * or key length, -ENAMETOOLONG when n is too small (n = KV_G4_RKEY_MAX always
 * suffices). */
int kv_g4_rkey(const char *prefix, const kv_g4_key *k, char *out, size_t n);

#endif
