/*
 * crc32c.h - CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the
 * checksum of every G3 record and payload.
 *
 * The SSE4.2 crc32 instruction is used when the CPU has it (checked once at
 * run time, no build flag needed), running three independent streams and
 * combining them so the instruction's latency is hidden; otherwise a
 * slicing-by-8 table. Both give the same value for every input (tested).
 * Thread-safe; no allocation.
 */
#ifndef KV_BASE_CRC32C_H
#define KV_BASE_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of buf[0..len) continuing from `crc` (0 to start). Chaining is
 * exact: crc32c(crc32c(0, a, n), b, m) == crc32c of a then b.
 * crc32c(0, "123456789", 9) == 0xE3069283. */
uint32_t kv_crc32c(uint32_t crc, const void *buf, size_t len);

/* The same with the portable table code, whatever the CPU (for tests). */
uint32_t kv_crc32c_sw(uint32_t crc, const void *buf, size_t len);

/* The same with the SSE4.2 code. Must only be called when
 * kv_crc32c_hw_available() returns 1. */
uint32_t kv_crc32c_hw(uint32_t crc, const void *buf, size_t len);

/* 1 if this CPU runs the hardware path (x86-64 with SSE4.2), else 0. */
int kv_crc32c_hw_available(void);

/*
 * Copies len bytes from src to dst (which must not overlap) and returns the
 * CRC-32C of the bytes written to dst, continuing from `crc` (chaining as
 * kv_crc32c). The CRC describes dst, not src: on the hardware path each
 * word is checksummed from the register that stores it, on the table path
 * dst is checksummed right after each chunk of KV_CRC_COPY_CHUNK bytes is
 * copied; so a src that changes during the copy can never give dst bytes
 * other than the ones the CRC covers. One pass over the data: what a
 * writer uses to fill a block and get its checksum, and what a reader uses
 * to copy a block out and verify what it got.
 */
#define KV_CRC_COPY_CHUNK 16384
uint32_t kv_crc32c_copy(uint32_t crc, void *dst, const void *src, size_t len);
/* As kv_crc32c_copy, for a dst that this thread will not read again soon
 * (a block written for other processes): on the hardware paths the bulk of
 * it is written with non-temporal stores (on the VPCLMULQDQ path when dst
 * is 32-byte aligned), which skip reading dst's lines before writing them
 * and leave them out of the cache; they are fenced (sfence) before the
 * call returns, so a message sent after it finds the bytes in place. The
 * table path is kv_crc32c_copy_sw's. */
uint32_t kv_crc32c_copy_nt(uint32_t crc, void *dst, const void *src, size_t len);
/* The same on the table path, and on the SSE4.2 path (only when
 * kv_crc32c_hw_available()), for tests. */
uint32_t kv_crc32c_copy_sw(uint32_t crc, void *dst, const void *src, size_t len);
uint32_t kv_crc32c_copy_hw(uint32_t crc, void *dst, const void *src, size_t len);
uint32_t kv_crc32c_copy_nt_hw(uint32_t crc, void *dst, const void *src, size_t len);
/* The same by carry-less folding (AVX2 + VPCLMULQDQ; the non-temporal form
 * streams only into a 32-byte aligned dst), only when
 * kv_crc32c_clmul_available(); kv_crc32c_copy and kv_crc32c_copy_nt use
 * it when the CPU has it. */
uint32_t kv_crc32c_copy_clmul(uint32_t crc, void *dst, const void *src, size_t len);
uint32_t kv_crc32c_copy_nt_clmul(uint32_t crc, void *dst, const void *src, size_t len);
int kv_crc32c_clmul_available(void);

#endif
