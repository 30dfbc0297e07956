/*
 * codec.h - a lossless codec for blocks of 16-bit KV elements (BF16, FP16):
 * what a cold tier (G3, G4) may store instead of a block's raw bytes.
 * Pure functions over caller buffers and a per-thread context; no I/O.
 *
 * How it codes: each little-endian 2-byte element is split into two byte
 * planes, the high bytes (sign and exponent: BF16's sign and 7 exponent
 * bits, FP16's sign, 5 exponent bits and 2 mantissa bits; highly
 * repetitive in a trained model's KV) and the low bytes (mostly mantissa,
 * close to random), and each plane is compressed alone with zstd at a fast
 * level. A plane that does not shrink is stored as it is. On the SmolLM2
 * sample of bench/kv in 64 KiB blocks: BF16 ratio 1.47 (high plane 2.7,
 * low plane 1.01), FP16 1.16 (1.37, 1.01); plain zstd level 1 on the same
 * unsplit blocks gives 1.27 and 1.08. kvcodec-bench (tools/bench_codec.c)
 * measures the ratios and speeds.
 *
 * Stored bytes (self-describing; every multi-byte field little-endian):
 *
 *   off size field
 *     0    4 magic 0x5A43564B ("KVCZ" as bytes)
 *     4    1 version (KV_CODEC_VERSION, 1)
 *     5    1 codec id (KV_CODEC_ZSTD_PLANES, 1)
 *     6    1 element size in bytes (2)
 *     7    1 plane count (2)
 *     8    4 original length n (bytes; even, 2..KV_CODEC_LEN_MAX)
 *    12    4 plane 0 stored length (the high bytes)
 *    16    4 plane 1 stored length (the low bytes)
 *    20    1 plane 0 coding: 0 raw (stored length n/2), 1 zstd frame
 *    21    1 plane 1 coding (same)
 *    22    2 reserved, 0
 *    24      plane 0's stored bytes, then plane 1's; nothing after them
 *
 * A decoder accepts stored bytes only if every field is one it knows, the
 * original length is the caller's, the two planes fill the rest exactly, a
 * raw plane is n/2 bytes and a zstd plane decompresses to exactly n/2
 * bytes; anything else is -EBADMSG, never a read or write outside the
 * buffers it was given, never an allocation sized by the stored bytes.
 * Damage inside a plane is mostly not seen here: a raw plane's never, and
 * a zstd plane's only where it breaks the frame (its frames carry no
 * checksum; of random flips in the body of a BF16 block, about 4% are
 * refused). Such stored bytes decode to n wrong bytes, no more: the
 * callers keep a CRC32C of the uncompressed bytes (G3's record header,
 * G4's payload CRC) and check it after decoding, so a silently wrong
 * decode is a miss there, never a wrong block.
 *
 * Who uses it: G4 (daemon/g4.c, g4.codec = auto: tiers/G4.md's version-3
 * values) and G3 (tiers/g3_codec.c, g3.codec = auto: tiers/G3.md's
 * version-2 records), as below. How a tier uses it: off the
 * event loop (G3's I/O threads, a pool), for a namespace whose layout's
 * dtype is 16-bit, encode the block on the way down; on KV_CODEC_NOGAIN
 * (or any error) store the raw bytes as today. The record then says which
 * it holds - for example a flag bit in G3's header byte 47 or G4's byte 9
 * (0 today: raw), or the stored bytes' own magic - and both lengths: the
 * block's length n, whose CRC32C (G3 bytes 36..39, G4 bytes 16..19) the
 * reader checks after kv_codec_decode as now, and the stored length, with
 * a second CRC over the stored bytes so that damage to them is a miss
 * before decoding. A record without the flag is raw, so old records stay
 * readable. The encoder never returns n bytes or more, so a compressed
 * record is never larger than the raw one; in G3, whose slots are of one
 * size per store, the bytes read and written shrink at once, the space
 * only with slots sized for stored lengths (G4's values are their own
 * length).
 *
 * Threads: a context is used by one thread at a time (it holds zstd's
 * compression and decompression contexts and the planes' scratch); make
 * one per thread and reuse it: creating one costs allocations.
 *
 * Odd lengths: n must be a positive multiple of 2 (whole elements);
 * kv_codec_encode refuses an odd n with -EINVAL (a caller stores such a
 * block raw), and kv_codec_decode refuses it with -EINVAL too.
 */
#ifndef KV_TIERS_CODEC_H
#define KV_TIERS_CODEC_H

#include <stddef.h>
#include <stdint.h>

#define KV_CODEC_MAGIC       0x5A43564Bu /* "KVCZ" as little-endian bytes */
#define KV_CODEC_VERSION     1
#define KV_CODEC_ZSTD_PLANES 1  /* codec id: byte planes, each zstd or raw */
#define KV_CODEC_HDR_LEN     24u
#define KV_CODEC_LEN_MAX     (1u << 30) /* largest n: blocks are far smaller */
#define KV_CODEC_LEVEL       1          /* zstd level by default */

/* kv_codec_encode's answer when the stored bytes would not be smaller than
 * the block: store it raw. Neither an errno nor a domain error of
 * base/errors.h (it never leaves the process). */
#define KV_CODEC_NOGAIN (-20001)

typedef struct kv_codec kv_codec;

/* A context coding at zstd `level`: 0 for the codec's tuned one (level
 * KV_CODEC_LEVEL matching only runs of 7 bytes or more, from a small hash
 * table: on bench/kv's BF16 blocks both smaller and 3 times faster than
 * plain level 1), else that plain zstd level (negative ones code no
 * literals: no use here). NULL when out of memory or the level is out of
 * zstd's range. The stored bytes are the same format whatever the level:
 * any context decodes them. */
kv_codec *kv_codec_new(int level);
void kv_codec_free(kv_codec *c); /* NULL is fine */

/* The codec's name for metrics and logs: "zstd-planes". */
const char *kv_codec_name(void);

/* The largest stored length kv_codec_encode returns for an n-byte block:
 * n - 1 (it returns KV_CODEC_NOGAIN rather than anything longer); a dst of
 * that many bytes never gives -ENOSPC. 0 for an n it refuses. */
size_t kv_codec_bound(size_t n);

/* Encodes src[0..n) into dst[0..cap). Returns the stored length (at least
 * KV_CODEC_HDR_LEN, less than n); KV_CODEC_NOGAIN when it would not be
 * smaller than n (an incompressible block; also any n below
 * KV_CODEC_HDR_LEN + 2); -EINVAL for an odd n, n of 0 or over
 * KV_CODEC_LEN_MAX, or a NULL argument; -ENOSPC when cap is below
 * kv_codec_bound(n) and the stored bytes do not fit in it; -ENOMEM when
 * the context's scratch cannot grow to n. dst's contents are undefined
 * after an error (src and dst must not overlap). */
long kv_codec_encode(kv_codec *c, const void *src, size_t n, void *dst, size_t cap);

/* Decodes stored[0..len) into dst[0..n), n the block's length, which the
 * caller knows from its record. 0 only when it wrote exactly n bytes;
 * -EBADMSG for anything malformed (see above: wrong magic, version, codec,
 * element size or plane count, a length other than n, planes that do not
 * fill len exactly, a plane that decompresses to another size or fails);
 * -EINVAL for an odd n, n of 0 or over KV_CODEC_LEN_MAX, or a NULL
 * argument; -ENOMEM when the context's scratch cannot grow to n. Never
 * writes outside dst[0..n) nor reads outside stored[0..len); dst's
 * contents are undefined after an error. */
int kv_codec_decode(kv_codec *c, const void *stored, size_t len, void *dst, size_t n);

/* This thread's context (made on first use, freed when the thread ends)
 * and, in *room (when room is not NULL), scratch of at least n bytes kept
 * with it: what the tiers' coding threads (G3's coders, G4's thread pool)
 * code with. NULL when out of memory. */
kv_codec *kv_codec_thread(size_t n, uint8_t **room);

/* The original length stored bytes claim (header only, nothing else
 * checked), or -EBADMSG when len is below the header or the magic,
 * version or codec is not this one: for a caller that must size dst
 * before kv_codec_decode. */
long kv_codec_stored_n(const void *stored, size_t len);

#endif
