/*
 * g3_rebuild.c - recovering the G3 index from the record headers.
 *
 * Reads each file's header table sequentially (1 MiB at a time), keeps the
 * headers that are valid for this store and sit where they claim to
 * (file, slot), picks for each key the record with the newest sequence
 * number - optionally only among those whose payload still matches its CRC
 * - and replaces the whole index with them in one LMDB transaction, so a
 * crash during a rebuild leaves the old index or the new one, never a mix.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/log.h"
#include "proto/errors.h"
#include "tiers/crc32c.h"
#include "tiers/g3_internal.h"

#define SCAN_SECTORS 256

static int cand_cmp(const void *a, const void *b) {
  const g3_rentry *x = a, *y = b;
  unsigned n = x->klen < y->klen ? x->klen : y->klen;
  int c = memcmp(x->k, y->k, n);
  if (c) return c;
  if (x->klen != y->klen) return x->klen < y->klen ? -1 : 1;
  if (x->v.seq != y->v.seq) return x->v.seq > y->v.seq ? -1 : 1; /* newest first */
  if (x->v.file != y->v.file) return x->v.file < y->v.file ? -1 : 1;
  return x->v.fslot < y->v.fslot ? -1 : x->v.fslot > y->v.fslot;
}

static int same_key(const g3_rentry *x, const g3_rentry *y) {
  return x->klen == y->klen && !memcmp(x->k, y->k, x->klen);
}

static int payload_ok(const g3_file *f, const g3_rentry *e, uint8_t *buf) {
  uint32_t iolen = (e->v.len + KV_G3_ALIGN - 1) / KV_G3_ALIGN * KV_G3_ALIGN;
  ssize_t r = g3_pread_full(f->fd, buf, iolen, e->v.off);
  return r == (ssize_t)iolen && kv_crc32c(0, buf, e->v.len) == e->v.crc;
}

int g3_rebuild_scan(g3_file *files, unsigned nfiles, const uint8_t id[G3_STORE_ID_LEN], g3_idx *ix,
                    int verify, kv_g3_rebuild_info *info) {
  kv_g3_rebuild_info inf;
  memset(&inf, 0, sizeof inf);
  g3_rentry *c = NULL, *out = NULL;
  size_t nc = 0, capc = 0, nout = 0;
  uint8_t *buf = NULL, *pbuf = NULL;
  uint32_t maxslot = 0;
  int rc = 0;
  if (posix_memalign((void **)&buf, G3_SECTOR, (size_t)SCAN_SECTORS * G3_SECTOR)) {
    buf = NULL;
    rc = -ENOMEM;
    goto out;
  }
  for (unsigned i = 0; i < nfiles; i++) {
    const g3_file *f = &files[i];
    if (f->fd < 0 || f->formatted) continue;
    inf.files++;
    if (f->sb.slot_bytes > maxslot) maxslot = f->sb.slot_bytes;
    for (uint32_t s = 0; s < f->sb.nslots; s += SCAN_SECTORS) {
      uint32_t n = f->sb.nslots - s < SCAN_SECTORS ? f->sb.nslots - s : SCAN_SECTORS;
      ssize_t r = g3_pread_full(f->fd, buf, (size_t)n * G3_SECTOR, g3_hdr_pos(&f->sb, s));
      if (r < 0) {
        rc = (int)r;
        kv_warn(G3_SUB, "rebuild: reading headers of %s: %s", f->path, strerror(-rc));
        goto out;
      }
      uint32_t got = (uint32_t)(r / G3_SECTOR);
      for (uint32_t j = 0; j < got; j++) {
        g3_rec rec;
        inf.scanned++;
        if (g3_rec_decode(&rec, buf + (size_t)j * G3_SECTOR)) continue;
        if (memcmp(rec.store_id, id, G3_STORE_ID_LEN) || rec.file != i || rec.slot != s + j ||
            rec.len > f->sb.slot_bytes)
          continue;
        inf.records++;
        if (nc == capc) {
          size_t nn = capc ? capc * 2 : 1024;
          g3_rentry *p = realloc(c, nn * sizeof *c);
          if (!p) { rc = -ENOMEM; goto out; }
          c = p;
          capc = nn;
        }
        g3_rentry *e = &c[nc++];
        e->klen = (uint8_t)g3_ikey(e->k, rec.ns, rec.key, rec.keylen);
        e->v = (g3_ival){.file = i, .fslot = rec.slot, .len = rec.len, .crc = rec.crc,
                         .off = g3_data_pos(&f->sb, rec.slot), .seq = rec.seq};
      }
      if (got < n) break; /* the file ends early: nothing more to find */
    }
  }
  if (nc) qsort(c, nc, sizeof *c, cand_cmp);
  if (verify && nc && posix_memalign((void **)&pbuf, G3_SECTOR, maxslot)) {
    pbuf = NULL;
    rc = -ENOMEM;
    goto out;
  }
  out = malloc((nc ? nc : 1) * sizeof *out);
  if (!out) { rc = -ENOMEM; goto out; }
  for (size_t i = 0; i < nc;) {
    size_t j = i, pick = SIZE_MAX;
    for (; j < nc && same_key(&c[i], &c[j]); j++) {
      if (pick != SIZE_MAX) continue;
      if (verify && !payload_ok(&files[c[j].v.file], &c[j], pbuf)) {
        inf.bad_payload++;
        continue;
      }
      pick = j;
    }
    if (pick != SIZE_MAX) out[nout++] = c[pick];
    i = j;
  }
  inf.superseded = inf.records - nout - inf.bad_payload;
  rc = g3_idx_replace(ix, out, nout, id);
  if (rc == 0) inf.indexed = nout;
out:
  free(buf);
  free(pbuf);
  free(c);
  free(out);
  if (info) *info = inf;
  return rc;
}

int kv_g3_rebuild_index(const kv_g3_opts *o, int verify_payload, kv_g3_rebuild_info *info) {
  if (info) memset(info, 0, sizeof *info);
  if (!o || !o->dirs || o->ndirs == 0 || o->ndirs > KV_G3_MAX_DIRS) return -EINVAL;
  g3_file *files = calloc(o->ndirs, sizeof *files);
  g3_idx ix = {0};
  uint64_t slots = 0;
  int rc = 0;
  if (!files) return -ENOMEM;
  for (unsigned i = 0; i < o->ndirs; i++) files[i].fd = -1;
  for (unsigned i = 0; i < o->ndirs; i++) {
    g3_file *f = &files[i];
    if (!o->dirs[i].path) { rc = -EINVAL; goto out; }
    rc = g3_file_open(f, o->dirs[i].path, i, 0, o->direct, o->fault);
    if (rc == 0) rc = g3_file_lock(f, o->lock_wait_ms);
    if (rc == 0) rc = g3_file_read_sb(f);
    if (rc == -ENOENT && i == 0) goto out;
    if (rc == 0 && (f->sb.file != i ||
                    (i > 0 && memcmp(f->sb.store_id, files[0].sb.store_id, G3_STORE_ID_LEN))))
      rc = KV_ECORRUPT;
    if (rc) {
      if (i == 0 || rc == -EBUSY) goto out;
      kv_warn(G3_SUB, "rebuild: skipping %s: %s", f->path, kv_strerror(rc));
      g3_file_close(f);
      rc = 0;
      continue;
    }
    slots += f->sb.nslots;
  }
  rc = g3_idx_open(&ix, o->dirs[0].path, slots, 0);
  if (rc == KV_ECORRUPT) {
    kv_warn(G3_SUB, "rebuild: index in %s unreadable: recreating it", o->dirs[0].path);
    g3_idx_unlink(o->dirs[0].path);
    rc = g3_idx_open(&ix, o->dirs[0].path, slots, 0);
  }
  if (rc) goto out;
  rc = g3_rebuild_scan(files, o->ndirs, files[0].sb.store_id, &ix, verify_payload, info);
  g3_idx_close(&ix);
out:
  for (unsigned i = 0; i < o->ndirs; i++) g3_file_close(&files[i]);
  free(files);
  return rc;
}
