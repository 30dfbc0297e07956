/*
 * g3_rebuild.c - recovering the G3 index from the record headers.
 *
 * Reads every slot's header sector - in parallel ranges (up to 8 per file,
 * 16 threads at a time), in 1 MiB reads that take several headers at once
 * where slots are small, one 4 KiB read per slot where they are large -,
 * keeps the headers that are valid for this store and sit where they claim
 * to (file, slot), picks for each key the record with the newest sequence
 * number - optionally only among those whose payload still matches its CRC
 * - and replaces the whole index with them in one LMDB transaction, so a
 * crash during a rebuild leaves the old index or the new one, never a mix.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/crc32c.h"
#include "base/errors.h"
#include "base/log.h"
#include "tiers/g3_internal.h"

#define SCAN_CHUNK          (1u << 20)
#define SCAN_PARTS_PER_FILE 8
#define SCAN_THREADS        16

typedef struct scan_part {
  const g3_file *f;
  unsigned fi;
  uint32_t from, to; /* slot range */
  const uint8_t *id;
  g3_rentry *c;
  size_t nc, capc;
  uint64_t scanned, records;
  int rc;
  pthread_t t;
} scan_part;

static int cand_push(scan_part *p, const g3_rec *rec) {
  if (p->nc == p->capc) {
    size_t nn = p->capc ? p->capc * 2 : 256;
    g3_rentry *c = realloc(p->c, nn * sizeof *c);
    if (!c) return -ENOMEM;
    p->c = c;
    p->capc = nn;
  }
  g3_rentry *e = &p->c[p->nc++];
  e->klen = (uint8_t)g3_ikey(e->k, rec->ns, rec->key, rec->keylen);
  e->v = (g3_ival){.file = p->fi,
                   .fslot = rec->slot,
                   .len = rec->len,
                   .crc = rec->crc,
                   .off = g3_data_pos(&p->f->sb, rec->slot),
                   .seq = rec->seq,
                   .stored = rec->stored};
  e->scrc = rec->scrc;
  return 0;
}

/* Scans the headers of slots [from, to) of one file. */
static void *scan_range(void *arg) {
  scan_part *p = arg;
  const g3_sb *sb = &p->f->sb;
  uint64_t stride = sb->stride;
  uint32_t per = stride * 4 <= SCAN_CHUNK ? (uint32_t)(SCAN_CHUNK / stride) : 1;
  uint8_t *buf = NULL;
  if (posix_memalign((void **)&buf, G3_SECTOR, (size_t)(per - 1) * stride + G3_SECTOR)) {
    p->rc = -ENOMEM;
    return NULL;
  }
  for (uint32_t s = p->from; s < p->to; s += per) {
    uint32_t n = p->to - s < per ? p->to - s : per;
    size_t len = (size_t)(n - 1) * stride + G3_SECTOR;
    ssize_t r = g3_pread_full(p->f->fd, buf, len, g3_hdr_pos(sb, s));
    if (r < 0) {
      p->rc = (int)r;
      break;
    }
    uint32_t j = 0;
    for (; j < n && (uint64_t)j * stride + G3_SECTOR <= (uint64_t)r; j++) {
      g3_rec rec;
      p->scanned++;
      if (g3_rec_decode(&rec, buf + (size_t)j * stride)) continue;
      if (memcmp(rec.store_id, p->id, G3_STORE_ID_LEN) || rec.file != p->fi || rec.slot != s + j ||
          (rec.stored ? rec.stored : rec.len) > sb->slot_bytes)
        continue;
      p->records++;
      if ((p->rc = cand_push(p, &rec))) break;
    }
    if (p->rc || j < n) break; /* an error, or the file ends early */
  }
  free(buf);
  return NULL;
}

/* Scans every file's headers; *out gets the candidates (caller frees). */
static int scan_all(g3_file *files, unsigned nfiles, const uint8_t *id, g3_rentry **out,
                    size_t *nout, kv_g3_rebuild_info *inf) {
  scan_part *parts = calloc((size_t)nfiles * SCAN_PARTS_PER_FILE, sizeof *parts);
  size_t np = 0, total = 0;
  int rc = 0;
  if (!parts) return -ENOMEM;
  for (unsigned i = 0; i < nfiles; i++) {
    const g3_file *f = &files[i];
    if (f->fd < 0 || f->formatted) continue;
    inf->files++;
    uint32_t k = f->sb.nslots < SCAN_PARTS_PER_FILE ? f->sb.nslots : SCAN_PARTS_PER_FILE;
    for (uint32_t j = 0; j < k; j++)
      parts[np++] = (scan_part){.f = f,
                                .fi = i,
                                .id = id,
                                .from = (uint32_t)((uint64_t)f->sb.nslots * j / k),
                                .to = (uint32_t)((uint64_t)f->sb.nslots * (j + 1) / k)};
  }
  for (size_t w = 0; w < np; w += SCAN_THREADS) { /* waves of threads */
    size_t end = w + SCAN_THREADS < np ? w + SCAN_THREADS : np;
    int started[SCAN_THREADS] = {0};
    for (size_t j = w; j < end; j++)
      started[j - w] = pthread_create(&parts[j].t, NULL, scan_range, &parts[j]) == 0;
    for (size_t j = w; j < end; j++) {
      if (started[j - w]) pthread_join(parts[j].t, NULL);
      else scan_range(&parts[j]); /* no thread: scan here */
    }
  }
  for (size_t j = 0; j < np; j++) {
    inf->scanned += parts[j].scanned;
    inf->records += parts[j].records;
    total += parts[j].nc;
    if (parts[j].rc && !rc) {
      rc = parts[j].rc;
      kv_warn(G3_SUB, "rebuild: reading headers of %s: %s", parts[j].f->path, kv_strerror(rc));
    }
  }
  g3_rentry *c = rc ? NULL : malloc((total ? total : 1) * sizeof *c);
  if (!rc && !c) rc = -ENOMEM;
  for (size_t j = 0, at = 0; j < np; j++) {
    if (c && parts[j].nc) memcpy(c + at, parts[j].c, parts[j].nc * sizeof *c);
    at += parts[j].nc;
    free(parts[j].c);
  }
  free(parts);
  *out = c;
  *nout = rc ? 0 : total;
  return rc;
}

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

/* A raw payload against its CRC; a coded one's stored bytes against
 * theirs (decoding is left to the read, which checks the block's CRC). */
static int payload_ok(const g3_file *f, const g3_rentry *e, uint8_t *buf) {
  uint32_t n = e->v.stored ? e->v.stored : e->v.len;
  uint32_t iolen = (n + KV_G3_ALIGN - 1) / KV_G3_ALIGN * KV_G3_ALIGN;
  ssize_t r = g3_pread_full(f->fd, buf, iolen, e->v.off);
  return r == (ssize_t)iolen && kv_crc32c(0, buf, n) == (e->v.stored ? e->scrc : e->v.crc);
}

int g3_rebuild_scan(g3_file *files, unsigned nfiles, const uint8_t id[G3_STORE_ID_LEN], g3_idx *ix,
                    int verify, kv_g3_rebuild_info *info) {
  kv_g3_rebuild_info inf;
  memset(&inf, 0, sizeof inf);
  g3_rentry *c = NULL, *out = NULL;
  size_t nc = 0, nout = 0;
  uint8_t *pbuf = NULL;
  uint32_t maxslot = 0;
  for (unsigned i = 0; i < nfiles; i++)
    if (files[i].fd >= 0 && !files[i].formatted && files[i].sb.slot_bytes > maxslot)
      maxslot = files[i].sb.slot_bytes;
  int rc = scan_all(files, nfiles, id, &c, &nc, &inf);
  if (rc) goto out;
  if (nc) qsort(c, nc, sizeof *c, cand_cmp);
  if (verify && nc && posix_memalign((void **)&pbuf, G3_SECTOR, maxslot)) {
    pbuf = NULL;
    rc = -ENOMEM;
    goto out;
  }
  out = malloc((nc ? nc : 1) * sizeof *out);
  if (!out) {
    rc = -ENOMEM;
    goto out;
  }
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
    if (!o->dirs[i].path) {
      rc = -EINVAL;
      goto out;
    }
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
