/*
 * g4_format.h - the G4 value format and Redis key naming: what a block looks
 * like in the cluster tier. Pure functions, no I/O (tiers/G4.md has the byte
 * layout; this file and G4.md must agree).
 *
 * A G4 value is self-describing: a KV_G4_HDR_LEN-byte header (magic,
 * version, header length, key length, payload length, payload CRC32C,
 * namespace digest, key, header CRC32C) then the payload. Every multi-byte
 * field is little-endian. A reader checks a value against the namespace and
 * key it asked for, its length and both checksums before it serves a byte:
 * a value another node wrote for another block, a value cut short, a value
 * from a newer format, a flipped bit - each is refused with its own reason
 * (kv_g4_miss), so the caller counts misses by reason. A refused value is a
 * miss, never a wrong hit.
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
#define KV_G4_VERSION     1
#define KV_G4_HDR_LEN     96u
#define KV_G4_MAGIC       0x3447564Bu /* "KVG4" as little-endian bytes */
#define KV_G4_PREFIX      "kv:"       /* default Redis key prefix */
#define KV_G4_PREFIX_MAX  32
/* Longest Redis key name, NUL included: prefix, 64 + 1 + 64 digits. */
#define KV_G4_RKEY_MAX    (KV_G4_PREFIX_MAX + 2 * KV_G4_NS_BYTES + 1 + 2 * KV_G4_KEY_MAX + 1)
#define KV_G4_PAYLOAD_MAX (512u << 20) /* Redis' largest string, less the header */

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
  X(PAYLOAD_CRC, "payload_crc") /* the payload failed its checksum */
typedef enum {
#define KV_G4_MISS_ENUM(name, label) KV_G4_MISS_##name,
  KV_G4_MISS_MAP(KV_G4_MISS_ENUM)
#undef KV_G4_MISS_ENUM
  KV_G4_MISS_COUNT
} kv_g4_miss;

/* The reason's metric label ("payload_crc"), or "?". */
const char *kv_g4_miss_name(int why);

/* Bytes of the value that carries `len` payload bytes. */
static inline size_t kv_g4_value_len(uint32_t len) { return KV_G4_HDR_LEN + (size_t)len; }

/* Writes the header for `len` payload bytes with CRC32C `crc` into
 * out[0..KV_G4_HDR_LEN). The payload follows the header in the value; it is
 * the caller's to place (or to send as a second part of the same string).
 * 0, or -EINVAL for a key length out of 1..KV_G4_KEY_MAX or a len over
 * KV_G4_PAYLOAD_MAX (nothing written). */
int kv_g4_encode_hdr(const kv_g4_key *k, uint32_t len, uint32_t crc, uint8_t *out);

/* Writes a whole value: header then payload[0..len), into out, which holds
 * kv_g4_value_len(len) bytes. The payload's CRC is computed while it is
 * copied. Returns the value's length, or -EINVAL as kv_g4_encode_hdr. */
long kv_g4_encode(const kv_g4_key *k, const void *payload, uint32_t len, uint8_t *out);

/* What a checked value holds: the payload (pointing into the value). */
typedef struct kv_g4_view {
  const uint8_t *payload;
  uint32_t len;
  uint32_t crc;
} kv_g4_view;

/* Checks val[0..n) as the value of block `expect`. expect_len is the
 * payload length the caller expects, or 0 for any. On success fills *v and
 * returns 0. Otherwise returns KV_EBADVERSION (KV_G4_MISS_VERSION) or
 * KV_ECORRUPT (every other reason), sets *why (when why is not NULL) and
 * leaves *v alone. Checks in order: magic (when 4 bytes are there), room for
 * the header, version, header CRC, namespace and key, expected length,
 * value length, payload CRC; so a value cut short anywhere is a SHORT miss
 * (never a PAYLOAD_CRC one), and a value without the magic is MAGIC however
 * short. */
int kv_g4_check(const void *val, size_t n, const kv_g4_key *expect, uint32_t expect_len,
                kv_g4_view *v, kv_g4_miss *why);

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
