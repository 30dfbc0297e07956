/*
 * g3_format.h - the G3 on-disk format: file layout, superblock and record
 * header, encoded and checked. Pure functions, no I/O (see G3.md for the
 * byte layout; this file and G3.md must agree).
 *
 * A store file:
 *   [0, 4096)                       superblock
 *   [data_off, +nslots*stride)      slots; slot i at data_off + i*stride:
 *                                   its record header sector (4096 bytes),
 *                                   then its payload (slot_bytes)
 * stride = 4096 + slot_bytes; data_off = 1 MiB. Every multi-byte field is
 * little-endian. A header sector holds one G3_REC_LEN-byte record and
 * zeros. Header and payload are adjacent, so a block is one contiguous
 * range, written with one vectored transfer and read as one sequential
 * stream.
 */
#ifndef KV_TIERS_G3_FORMAT_H
#define KV_TIERS_G3_FORMAT_H

#include <stdint.h>

#define G3_VERSION      1
#define G3_SECTOR       4096u      /* superblock and header sector size */
#define G3_SB_LEN       128u       /* meaningful bytes of the superblock */
#define G3_REC_LEN      128u       /* meaningful bytes of a record header */
#define G3_DATA_OFF     (1u << 20) /* the slots start at 1 MiB */
#define G3_STORE_ID_LEN 16
#define G3_REC_MAGIC    0x3347564Bu  /* "KVG3" as little-endian bytes */
#define G3_REC_VERSION_CODED 2      /* a record whose payload is coded */
#define G3_REC_CODED    1u          /* record flag (byte 47): payload coded */
#define G3_CODEC_PLANES 1u          /* codec ids (byte 120): tiers/codec.h */
#define G3_CODEC_FP8    2u          /* tiers/quant.h, lossy */
#define G3_CODEC_INT8   3u
extern const uint8_t g3_sb_magic[8]; /* "KVG3SUPR" */

typedef struct g3_sb {
  uint32_t file;       /* index of this file in the store */
  uint32_t nfiles;     /* files when the store was made */
  uint32_t slot_bytes; /* payload bytes per slot, multiple of G3_SECTOR */
  uint32_t nslots;
  uint64_t data_off, stride, file_bytes;
  uint8_t store_id[G3_STORE_ID_LEN];
  uint64_t created; /* unix seconds */
} g3_sb;

typedef struct g3_rec {
  uint8_t store_id[G3_STORE_ID_LEN];
  uint64_t seq;
  uint32_t len;  /* payload bytes */
  uint32_t crc;  /* CRC32C of the payload */
  uint32_t slot; /* slot within its file */
  uint16_t file;
  uint8_t keylen;
  uint8_t ns[32];
  uint8_t key[32];
  /* A coded record (version 2, flag G3_REC_CODED): the payload holds
   * `stored` bytes (1..len-1) of codec `codec` (tiers/codec.h's id), whose
   * CRC32C is scrc; len and crc still say the block's own bytes. 0 for a
   * raw record (version 1, as every record before coding). */
  uint32_t stored, scrc;
  uint8_t codec; /* G3_CODEC_* */
  uint8_t qdt;   /* a lossy codec's elements: kv_quant_dtype (1 BF16, 2 FP16) */
} g3_rec;

/* Lays out a file of at most `capacity` bytes with slots of `slot_bytes`
 * (a multiple of G3_SECTOR): fills nslots, data_off, stride, file_bytes.
 * -ENOSPC if not even one slot fits, -EINVAL for a bad slot size. */
int g3_layout(uint64_t capacity, uint32_t slot_bytes, g3_sb *sb);

/* Encodes into out[0..G3_SB_LEN), checksum included. */
void g3_sb_encode(const g3_sb *sb, uint8_t *out);
/* 0, or KV_ECORRUPT (bad magic, version, checksum or geometry). */
int g3_sb_decode(g3_sb *sb, const uint8_t *in);

/* Encodes into out[0..G3_REC_LEN), header checksum included. */
void g3_rec_encode(const g3_rec *r, uint8_t *out);
/* 0; -ENOENT if the sector was never written (all zero); KV_ECORRUPT for a
 * bad magic, version, key length or header checksum, and for a version 1
 * record with flags or a version 2 one whose flags, codec or stored length
 * are not what a coded record has. */
int g3_rec_decode(g3_rec *r, const uint8_t *in);

static inline uint64_t g3_hdr_pos(const g3_sb *sb, uint32_t slot) {
  return sb->data_off + (uint64_t)slot * sb->stride;
}
static inline uint64_t g3_data_pos(const g3_sb *sb, uint32_t slot) {
  return g3_hdr_pos(sb, slot) + G3_SECTOR;
}

#endif
