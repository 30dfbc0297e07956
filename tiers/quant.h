/*
 * quant.h - opt-in lossy precision for the cold tiers (issue 30, item 3):
 * a block of 16-bit KV elements (BF16 or FP16) stored as FP8 (OCP E4M3,
 * "e4m3fn": 4 exponent bits, bias 7, 3 mantissa bits, largest 448, no
 * infinities, NaN 0x7F/0xFF) or INT8, with one float32 scale per group of
 * `group` consecutive elements: a group is one token's one head (head_dim
 * elements) in the layouts engines keep, so the scales are per token and
 * per head. Decoding gives the engine's own dtype back. Pure functions
 * over caller buffers; no state, no I/O.
 *
 * Stored bytes: the groups' scales first (float32, little-endian, one per
 * group), then one byte per element (the code), so a block of n elements
 * in groups of g is kv_quant_size(n, g) = n + 4 * (n / g) bytes: with
 * head_dim 64, 53% of the 16-bit block's bytes; with 128, 52%.
 *
 * Per group, the scale is amax / 448 (FP8) or amax / 127 (INT8), amax the
 * group's largest magnitude (0: every code is 0). FP8 codes are the
 * elements times 448 / amax (the scale's inverse, within a rounding),
 * rounded to the nearest E4M3 value (ties to even), subnormals included;
 * INT8 codes the nearest integer (ties to even). The element error is at most half a step: for FP8, 2^-4 of the
 * element's own magnitude (normal codes; amax * 2^-10 / 448 near zero),
 * for INT8 amax / 254; then rounding back to BF16 (2^-9 relative) or FP16
 * (2^-12). What that costs a model is measured, not assumed:
 * tools/bench/kv_quality.py, BENCHMARKS.md.
 *
 * A block with an infinite or NaN element is refused (-EINVAL): the caller
 * keeps it exact. KV the engines write is finite.
 */
#ifndef KV_TIERS_QUANT_H
#define KV_TIERS_QUANT_H

#include <stddef.h>
#include <stdint.h>

typedef enum { KV_QUANT_FP8 = 1, KV_QUANT_INT8 = 2 } kv_quant_kind;
typedef enum { KV_QDT_BF16 = 1, KV_QDT_FP16 = 2 } kv_quant_dtype;

/* Bytes stored for n elements in groups of g (g divides n). */
static inline size_t kv_quant_size(size_t n, unsigned g) { return n + 4 * (n / g); }

/* Codes src[0..n) (16-bit elements of dtype dt) into dst
 * (kv_quant_size(n, g) bytes). 0; -EINVAL for a kind or dtype not above,
 * g of 0 or not dividing n, n of 0, or a non-finite element (dst then
 * holds nothing meaningful). */
int kv_quant_encode(kv_quant_kind k, kv_quant_dtype dt, const void *src, size_t n, unsigned g,
                    void *dst);

/* Decodes stored (kv_quant_size(n, g) bytes written by kv_quant_encode
 * with the same k, n and g) into dst: n elements of dtype dt. 0, or
 * -EINVAL as above, or for a scale that is negative or not finite (bytes
 * not written by kv_quant_encode: the caller's CRC of the stored bytes is
 * what finds damage). */
int kv_quant_decode(kv_quant_kind k, kv_quant_dtype dt, const void *stored, size_t n, unsigned g,
                    void *dst);

/* One E4M3 code of x (|x| <= 448 after scaling; larger saturates to
 * +-448, NaN gives 0x7F), and its value: the conversions above, for tests
 * and tools. */
uint8_t kv_fp8_e4m3(float x);
float kv_fp8_e4m3_value(uint8_t c);

/* "fp8", "int8", or NULL; and back (0 for an unknown name). */
const char *kv_quant_name(kv_quant_kind k);
kv_quant_kind kv_quant_parse(const char *name);

#endif
