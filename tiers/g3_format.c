/* g3_format.c - G3 superblock and record header encoding (see g3_format.h). */
#include "tiers/g3_format.h"

#include <errno.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/errors.h"
#include "base/le.h"
#include "tiers/codec.h"

const uint8_t g3_sb_magic[8] = {'K', 'V', 'G', '3', 'S', 'U', 'P', 'R'};

int g3_layout(uint64_t capacity, uint32_t slot_bytes, g3_sb *sb) {
  if (slot_bytes == 0 || slot_bytes % G3_SECTOR || slot_bytes > UINT32_MAX - G3_SECTOR)
    return -EINVAL;
  memset(sb, 0, sizeof *sb);
  sb->slot_bytes = slot_bytes;
  sb->data_off = G3_DATA_OFF;
  sb->stride = (uint64_t)slot_bytes + G3_SECTOR;
  uint64_t n = capacity > G3_DATA_OFF ? (capacity - G3_DATA_OFF) / sb->stride : 0;
  if (n > UINT32_MAX / 2) n = UINT32_MAX / 2;
  if (n == 0) return -ENOSPC;
  sb->nslots = (uint32_t)n;
  sb->file_bytes = sb->data_off + n * sb->stride;
  return 0;
}

/* Superblock:
 *   0 magic[8] | 8 u16 version | 10 u16 length | 12 u32 file | 16 u32 nfiles
 *  20 u32 slot_bytes | 24 u32 nslots | 28 u32 flags (0) | 32 u64 data_off
 *  40 u64 stride | 48 u64 file_bytes | 56 store_id[16] | 72 u64 created
 *  80 reserved (0) | 124 u32 CRC32C of bytes 0..123 */
void g3_sb_encode(const g3_sb *sb, uint8_t *out) {
  memset(out, 0, G3_SB_LEN);
  memcpy(out, g3_sb_magic, 8);
  kv_st16(out + 8, G3_VERSION);
  kv_st16(out + 10, G3_SB_LEN);
  kv_st32(out + 12, sb->file);
  kv_st32(out + 16, sb->nfiles);
  kv_st32(out + 20, sb->slot_bytes);
  kv_st32(out + 24, sb->nslots);
  kv_st64(out + 32, sb->data_off);
  kv_st64(out + 40, sb->stride);
  kv_st64(out + 48, sb->file_bytes);
  memcpy(out + 56, sb->store_id, G3_STORE_ID_LEN);
  kv_st64(out + 72, sb->created);
  kv_st32(out + 124, kv_crc32c(0, out, 124));
}

int g3_sb_decode(g3_sb *sb, const uint8_t *in) {
  if (memcmp(in, g3_sb_magic, 8) || kv_ld16(in + 8) != G3_VERSION ||
      kv_ld16(in + 10) != G3_SB_LEN || kv_ld32(in + 124) != kv_crc32c(0, in, 124))
    return KV_ECORRUPT;
  memset(sb, 0, sizeof *sb);
  sb->file = kv_ld32(in + 12);
  sb->nfiles = kv_ld32(in + 16);
  sb->slot_bytes = kv_ld32(in + 20);
  sb->nslots = kv_ld32(in + 24);
  sb->data_off = kv_ld64(in + 32);
  sb->stride = kv_ld64(in + 40);
  sb->file_bytes = kv_ld64(in + 48);
  memcpy(sb->store_id, in + 56, G3_STORE_ID_LEN);
  sb->created = kv_ld64(in + 72);
  /* Geometry must be what g3_layout would produce for some capacity. */
  if (sb->slot_bytes == 0 || sb->slot_bytes % G3_SECTOR || sb->nslots == 0 ||
      sb->data_off < G3_SECTOR || sb->data_off % G3_SECTOR ||
      sb->stride != (uint64_t)sb->slot_bytes + G3_SECTOR ||
      sb->file_bytes != sb->data_off + (uint64_t)sb->nslots * sb->stride)
    return KV_ECORRUPT;
  return 0;
}

/* Record header:
 *   0 u32 magic "KVG3" | 4 u16 version | 6 u16 length (128) | 8 store_id[16]
 *  24 u64 seq | 32 u32 payload length | 36 u32 payload CRC32C | 40 u32 slot
 *  44 u16 file | 46 u8 key length | 47 u8 flags | 48 ns[32] | 80 key[32]
 * 112 u32 stored length | 116 u32 stored bytes' CRC32C | 120 u8 codec
 * 121 u8 a lossy codec's dtype | 122 reserved (0) | 124 u32 CRC32C of 0..123
 * Version 1 (raw payload): flags and bytes 112..123 are 0. Version 2 (coded
 * payload): flags G3_REC_CODED, codec G3_CODEC_* (1 lossless, 2 FP8, 3 INT8;
 * a lossy one's dtype 1 BF16 or 2 FP16, else 0), stored length 1..length-1;
 * a lossy record's CRC (36) is that of its decoded bytes. */
void g3_rec_encode(const g3_rec *r, uint8_t *out) {
  memset(out, 0, G3_REC_LEN);
  kv_st32(out, G3_REC_MAGIC);
  kv_st16(out + 4, r->stored ? G3_REC_VERSION_CODED : G3_VERSION);
  kv_st16(out + 6, G3_REC_LEN);
  memcpy(out + 8, r->store_id, G3_STORE_ID_LEN);
  kv_st64(out + 24, r->seq);
  kv_st32(out + 32, r->len);
  kv_st32(out + 36, r->crc);
  kv_st32(out + 40, r->slot);
  kv_st16(out + 44, r->file);
  out[46] = r->keylen;
  memcpy(out + 48, r->ns, 32);
  memcpy(out + 80, r->key, r->keylen <= 32 ? r->keylen : 32);
  if (r->stored) {
    out[47] = G3_REC_CODED;
    kv_st32(out + 112, r->stored);
    kv_st32(out + 116, r->scrc);
    out[120] = r->codec;
    out[121] = r->qdt;
  }
  kv_st32(out + 124, kv_crc32c(0, out, 124));
}

int g3_rec_decode(g3_rec *r, const uint8_t *in) {
  uint8_t any = 0;
  for (unsigned i = 0; i < G3_REC_LEN; i++) any |= in[i];
  if (!any) return -ENOENT;
  unsigned ver = kv_ld16(in + 4);
  if (kv_ld32(in) != G3_REC_MAGIC || (ver != G3_VERSION && ver != G3_REC_VERSION_CODED) ||
      kv_ld16(in + 6) != G3_REC_LEN || kv_ld32(in + 124) != kv_crc32c(0, in, 124))
    return KV_ECORRUPT;
  memset(r, 0, sizeof *r);
  memcpy(r->store_id, in + 8, G3_STORE_ID_LEN);
  r->seq = kv_ld64(in + 24);
  r->len = kv_ld32(in + 32);
  r->crc = kv_ld32(in + 36);
  r->slot = kv_ld32(in + 40);
  r->file = kv_ld16(in + 44);
  r->keylen = in[46];
  if (r->keylen == 0 || r->keylen > 32 || r->len == 0) return KV_ECORRUPT;
  if (ver == G3_VERSION) {
    if (in[47]) return KV_ECORRUPT; /* flags unknown to a raw record */
  } else {
    r->stored = kv_ld32(in + 112);
    r->scrc = kv_ld32(in + 116);
    r->codec = in[120];
    r->qdt = in[121];
    int lossy = r->codec == G3_CODEC_FP8 || r->codec == G3_CODEC_INT8;
    if (in[47] != G3_REC_CODED || (r->codec != G3_CODEC_PLANES && !lossy) || r->stored == 0 ||
        r->stored >= r->len || (lossy ? r->qdt < 1 || r->qdt > 2 : r->qdt != 0))
      return KV_ECORRUPT;
  }
  memcpy(r->ns, in + 48, 32);
  memcpy(r->key, in + 80, r->keylen);
  return 0;
}
