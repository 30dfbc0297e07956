/* test_g3_format.c - G3 on-disk format: layout arithmetic, superblock and
 * record header round trips, and every damaged header byte detected. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "base/errors.h"
#include "tiers/g3_format.h"

Test(g3_format, layout_fits_and_aligns) {
  uint32_t slots[] = {4096, 65536, 262144, 1 << 20, 4 << 20};
  uint64_t caps[] = {4ull << 20, 64ull << 20, 1ull << 30, 100ull << 30};
  for (size_t i = 0; i < 5; i++)
    for (size_t j = 0; j < 4; j++) {
      g3_sb sb;
      int rc = g3_layout(caps[j], slots[i], &sb);
      if (rc == -ENOSPC) continue;
      cr_assert_eq(rc, 0);
      cr_assert_leq(sb.file_bytes, caps[j]);
      cr_assert_eq(sb.data_off, G3_DATA_OFF);
      cr_assert_eq(sb.stride, slots[i] + G3_SECTOR);
      /* one more slot would not fit */
      cr_assert_gt(sb.file_bytes + sb.stride, caps[j]);
      /* header sector, then payload, slot after slot, all 4 KiB aligned */
      cr_assert_eq(g3_data_pos(&sb, 0), g3_hdr_pos(&sb, 0) + G3_SECTOR);
      cr_assert_eq(g3_hdr_pos(&sb, 1), g3_data_pos(&sb, 0) + slots[i]);
      cr_assert_eq(g3_data_pos(&sb, 7) % G3_SECTOR, 0);
      cr_assert_eq(g3_data_pos(&sb, sb.nslots - 1) + slots[i], sb.file_bytes);
    }
  g3_sb sb;
  cr_assert_eq(g3_layout((1 << 20) + 8191, 4096, &sb), -ENOSPC);
  cr_assert_eq(g3_layout((1 << 20) + 8192, 4096, &sb), 0);
  cr_assert_eq(sb.nslots, 1);
  cr_assert_eq(g3_layout(1 << 30, 1000, &sb), -EINVAL);
}

Test(g3_format, superblock_round_trip) {
  g3_sb sb, back;
  cr_assert_eq(g3_layout(1ull << 30, 262144, &sb), 0);
  sb.file = 3;
  sb.nfiles = 4;
  memset(sb.store_id, 0x42, sizeof sb.store_id);
  sb.created = 1700000000;
  uint8_t buf[G3_SECTOR] = {0};
  g3_sb_encode(&sb, buf);
  cr_assert_eq(g3_sb_decode(&back, buf), 0);
  cr_assert_eq(memcmp(&sb, &back, sizeof sb), 0);
  for (unsigned i = 0; i < G3_SB_LEN; i++) {
    buf[i] ^= 0x01;
    cr_assert_eq(g3_sb_decode(&back, buf), KV_ECORRUPT, "byte %u", i);
    buf[i] ^= 0x01;
  }
}

static g3_rec sample(void) {
  g3_rec r;
  memset(&r, 0, sizeof r);
  memset(r.store_id, 7, sizeof r.store_id);
  r.seq = 0x0102030405060708ull;
  r.len = 262144;
  r.crc = 0xdeadbeef;
  r.slot = 12345;
  r.file = 2;
  r.keylen = 20;
  for (int i = 0; i < 32; i++) r.ns[i] = (uint8_t)i;
  for (int i = 0; i < 20; i++) r.key[i] = (uint8_t)(0x80 + i);
  return r;
}

Test(g3_format, record_round_trip) {
  g3_rec r = sample(), back;
  uint8_t buf[G3_SECTOR] = {0};
  g3_rec_encode(&r, buf);
  cr_assert_eq(g3_rec_decode(&back, buf), 0);
  cr_assert_eq(memcmp(&r, &back, sizeof r), 0);
  /* little-endian fields where G3.md says */
  cr_assert_eq(memcmp(buf, "KVG3", 4), 0);
  cr_assert_eq(buf[24], 0x08);
  cr_assert_eq(buf[46], 20);
}

Test(g3_format, record_every_byte_checked) {
  g3_rec r = sample(), back;
  uint8_t buf[G3_SECTOR] = {0};
  g3_rec_encode(&r, buf);
  for (unsigned i = 0; i < G3_REC_LEN; i++)
    for (int bit = 0; bit < 8; bit++) {
      buf[i] ^= (uint8_t)(1 << bit);
      cr_assert_eq(g3_rec_decode(&back, buf), KV_ECORRUPT, "byte %u bit %d", i, bit);
      buf[i] ^= (uint8_t)(1 << bit);
    }
}

Test(g3_format, record_blank_and_bad_keylen) {
  uint8_t buf[G3_SECTOR] = {0};
  g3_rec back, r = sample();
  cr_assert_eq(g3_rec_decode(&back, buf), -ENOENT);
  r.keylen = 0;
  g3_rec_encode(&r, buf);
  cr_assert_eq(g3_rec_decode(&back, buf), KV_ECORRUPT);
  r.keylen = 33;
  g3_rec_encode(&r, buf);
  cr_assert_eq(g3_rec_decode(&back, buf), KV_ECORRUPT);
}
