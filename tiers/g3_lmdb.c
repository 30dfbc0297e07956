/*
 * g3_lmdb.c - the G3 index in LMDB: (namespace digest ++ key) ->
 * (file, slot, offset, length, crc, seq), plus a meta table naming the
 * store the index belongs to. Written only by the committer thread, in
 * batches; read by the caller thread in read-only transactions.
 *
 * Files: <dirs[0]>/kvg3-index.mdb and kvg3-index.mdb-lock (MDB_NOSUBDIR).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/log.h"
#include "tiers/g3_internal.h"

#define IDX_NAME "kvg3-index.mdb"
static const char meta_store_id[] = "store_id";
static const char meta_format[] = "format";

int g3_mdb_err(int rc) {
  switch (rc) {
  case MDB_SUCCESS: return 0;
  case MDB_NOTFOUND: return -ENOENT;
  case MDB_MAP_FULL: return -ENOSPC;
  case MDB_INVALID:
  case MDB_CORRUPTED:
  case MDB_VERSION_MISMATCH:
  case MDB_PAGE_NOTFOUND:
  case MDB_BAD_TXN: return KV_ECORRUPT;
  default: return rc > 0 ? -rc : -EIO;
  }
}

static int idx_path(char *out, size_t n, const char *dir, const char *suffix) {
  int r = snprintf(out, n, "%s/" IDX_NAME "%s", dir, suffix);
  return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

void g3_idx_unlink(const char *dir) {
  char p[G3_PATH_MAX];
  if (idx_path(p, sizeof p, dir, "") == 0) unlink(p);
  if (idx_path(p, sizeof p, dir, "-lock") == 0) unlink(p);
}

int g3_idx_open(g3_idx *ix, const char *dir, uint64_t nslots, int nosync) {
  char path[G3_PATH_MAX];
  MDB_txn *txn = NULL;
  int rc = idx_path(path, sizeof path, dir, "");
  memset(ix, 0, sizeof *ix);
  if (rc) return rc;
  struct stat st;
  ix->created = lstat(path, &st) != 0;
  /* ~1 KiB of map per slot covers entry, B-tree slack and the copy-on-write
   * pages of a rebuild's single transaction; the map is sparse. */
  uint64_t map = (16ull << 20) + nslots * 1024;
  map = (map + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
  if ((rc = mdb_env_create(&ix->env))) goto err;
  if ((rc = mdb_env_set_maxdbs(ix->env, 2))) goto err;
  if ((rc = mdb_env_set_mapsize(ix->env, (size_t)map))) goto err;
  if ((rc =
           mdb_env_open(ix->env, path, MDB_NOSUBDIR | MDB_NOTLS | (nosync ? MDB_NOSYNC : 0), 0644)))
    goto err;
  int dead = 0;
  mdb_reader_check(ix->env, &dead); /* readers left by a killed process */
  if ((rc = mdb_txn_begin(ix->env, NULL, 0, &txn))) goto err;
  if ((rc = mdb_dbi_open(txn, "entries", MDB_CREATE, &ix->ent))) goto err;
  if ((rc = mdb_dbi_open(txn, "meta", MDB_CREATE, &ix->meta))) goto err;
  rc = mdb_txn_commit(txn);
  txn = NULL;
  if (rc) goto err;
  return 0;
err:
  if (txn) mdb_txn_abort(txn);
  if (ix->env) mdb_env_close(ix->env);
  ix->env = NULL;
  if (ix->created) g3_idx_unlink(dir);
  kv_debug(G3_SUB, "index %s: %s", path, mdb_strerror(rc));
  return g3_mdb_err(rc);
}

void g3_idx_close(g3_idx *ix) {
  if (ix->env) mdb_env_close(ix->env);
  ix->env = NULL;
}

int g3_idx_get_store_id(g3_idx *ix, uint8_t id[G3_STORE_ID_LEN]) {
  MDB_txn *txn;
  int rc = mdb_txn_begin(ix->env, NULL, MDB_RDONLY, &txn);
  if (rc) return g3_mdb_err(rc);
  MDB_val k = {sizeof meta_store_id - 1, (void *)meta_store_id}, v;
  rc = mdb_get(txn, ix->meta, &k, &v);
  if (rc == 0 && v.mv_size != G3_STORE_ID_LEN) rc = MDB_NOTFOUND;
  if (rc == 0) memcpy(id, v.mv_data, G3_STORE_ID_LEN);
  mdb_txn_abort(txn);
  return g3_mdb_err(rc);
}

/* value: 0 u8 version | 1 u8 0 | 2 u16 file | 4 u32 slot | 8 u64 offset
 *       16 u32 len | 20 u32 crc | 24 u64 seq
 * version 2 (a coded record) adds: 32 u32 stored length | 36 u32 0 */
size_t g3_ival_encode(const g3_ival *v, uint8_t *o) {
  memset(o, 0, G3_IVAL_LEN);
  o[0] = v->stored ? 2 : 1;
  o[2] = (uint8_t)v->file;
  o[3] = (uint8_t)(v->file >> 8);
  for (int i = 0; i < 4; i++) o[4 + i] = (uint8_t)(v->fslot >> 8 * i);
  for (int i = 0; i < 8; i++) o[8 + i] = (uint8_t)(v->off >> 8 * i);
  for (int i = 0; i < 4; i++) o[16 + i] = (uint8_t)(v->len >> 8 * i);
  for (int i = 0; i < 4; i++) o[20 + i] = (uint8_t)(v->crc >> 8 * i);
  for (int i = 0; i < 8; i++) o[24 + i] = (uint8_t)(v->seq >> 8 * i);
  if (!v->stored) return G3_IVAL_LEN_RAW;
  for (int i = 0; i < 4; i++) o[32 + i] = (uint8_t)(v->stored >> 8 * i);
  return G3_IVAL_LEN;
}

int g3_ival_decode(g3_ival *v, const void *in, size_t len) {
  const uint8_t *p = in;
  if (!(len == G3_IVAL_LEN_RAW && p[0] == 1) && !(len == G3_IVAL_LEN && p[0] == 2))
    return KV_ECORRUPT;
  memset(v, 0, sizeof *v);
  v->file = (uint32_t)p[2] | (uint32_t)p[3] << 8;
  for (int i = 3; i >= 0; i--) v->fslot = v->fslot << 8 | p[4 + i];
  for (int i = 7; i >= 0; i--) v->off = v->off << 8 | p[8 + i];
  for (int i = 3; i >= 0; i--) v->len = v->len << 8 | p[16 + i];
  for (int i = 3; i >= 0; i--) v->crc = v->crc << 8 | p[20 + i];
  for (int i = 7; i >= 0; i--) v->seq = v->seq << 8 | p[24 + i];
  if (p[0] == 2) {
    for (int i = 3; i >= 0; i--) v->stored = v->stored << 8 | p[32 + i];
    if (v->stored == 0 || v->stored >= v->len) return KV_ECORRUPT;
  }
  return 0;
}

unsigned g3_ikey(uint8_t *out, const uint8_t *ns, const uint8_t *key, unsigned keylen) {
  memcpy(out, ns, KV_G3_NS_BYTES);
  memcpy(out + KV_G3_NS_BYTES, key, keylen);
  return KV_G3_NS_BYTES + keylen;
}

int g3_idx_scan(g3_idx *ix, int (*fn)(const uint8_t *k, unsigned klen, const g3_ival *v, void *arg),
                void *arg) {
  MDB_txn *txn;
  MDB_cursor *cur;
  int rc = mdb_txn_begin(ix->env, NULL, MDB_RDONLY, &txn);
  if (rc) return g3_mdb_err(rc);
  if ((rc = mdb_cursor_open(txn, ix->ent, &cur))) {
    mdb_txn_abort(txn);
    return g3_mdb_err(rc);
  }
  MDB_val k, v;
  int ret = 0;
  for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
       rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
    g3_ival iv;
    int bad = g3_ival_decode(&iv, v.mv_data, v.mv_size) != 0 || k.mv_size <= KV_G3_NS_BYTES ||
              k.mv_size > G3_IKEY_MAX;
    if (bad) iv.file = UINT32_MAX; /* the callback drops it */
    if ((ret = fn(k.mv_data, (unsigned)k.mv_size, &iv, arg))) break;
  }
  mdb_cursor_close(cur);
  mdb_txn_abort(txn);
  if (ret) return ret;
  return rc == MDB_NOTFOUND ? 0 : g3_mdb_err(rc);
}

int g3_idx_apply(kv_g3 *g, g3_op *ops) {
  MDB_txn *txn;
  int rc = mdb_txn_begin(g->ix.env, NULL, 0, &txn);
  if (rc) return g3_mdb_err(rc);
  uint64_t puts = 0, dels = 0;
  for (g3_op *op = ops; op; op = op->next) {
    uint8_t kb[G3_IKEY_MAX], vb[G3_IVAL_LEN];
    MDB_val k = {g3_ikey(kb, op->ns, op->key, op->keylen), kb}, v;
    if (op->kind == G3_OP_WRITE) {
      if (op->res) continue;
      g3_ival iv = {.file = op->file,
                    .fslot = op->fslot,
                    .len = op->len,
                    .crc = op->crc,
                    .off = g3_data_pos(&g->files[op->file].sb, op->fslot),
                    .seq = op->seq,
                    .stored = op->stored};
      v.mv_size = g3_ival_encode(&iv, vb);
      v.mv_data = vb;
      if ((rc = mdb_put(txn, g->ix.ent, &k, &v, 0))) goto err;
      puts++;
    } else if (op->kind == G3_OP_DEL) {
      rc = mdb_get(txn, g->ix.ent, &k, &v);
      if (rc == MDB_NOTFOUND) continue;
      if (rc) goto err;
      g3_ival iv;
      if (g3_ival_decode(&iv, v.mv_data, v.mv_size) == 0 &&
          (iv.file != op->file || iv.fslot != op->fslot))
        continue; /* the key was re-pointed to another slot: keep it */
      if ((rc = mdb_del(txn, g->ix.ent, &k, NULL))) goto err;
      dels++;
    }
  }
  if ((rc = mdb_txn_commit(txn))) return g3_mdb_err(rc);
  atomic_fetch_add(&g->a_txns, 1);
  atomic_fetch_add(&g->a_puts, puts);
  atomic_fetch_add(&g->a_dels, dels);
  return 0;
err:
  mdb_txn_abort(txn);
  return g3_mdb_err(rc);
}

int g3_idx_del_keys(g3_idx *ix, const uint8_t *keys, const uint8_t *lens, size_t n) {
  MDB_txn *txn;
  int rc = mdb_txn_begin(ix->env, NULL, 0, &txn);
  if (rc) return g3_mdb_err(rc);
  for (size_t i = 0; i < n; i++) {
    MDB_val k = {lens[i], (void *)(keys + i * G3_IKEY_MAX)};
    rc = mdb_del(txn, ix->ent, &k, NULL);
    if (rc && rc != MDB_NOTFOUND) {
      mdb_txn_abort(txn);
      return g3_mdb_err(rc);
    }
  }
  return g3_mdb_err(mdb_txn_commit(txn));
}

int g3_idx_replace(g3_idx *ix, const g3_rentry *e, size_t n, const uint8_t id[G3_STORE_ID_LEN]) {
  MDB_txn *txn;
  int rc = mdb_txn_begin(ix->env, NULL, 0, &txn);
  if (rc) return g3_mdb_err(rc);
  if ((rc = mdb_drop(txn, ix->ent, 0))) goto err;
  for (size_t i = 0; i < n; i++) {
    uint8_t vb[G3_IVAL_LEN];
    MDB_val k = {e[i].klen, (void *)e[i].k}, v = {g3_ival_encode(&e[i].v, vb), vb};
    if ((rc = mdb_put(txn, ix->ent, &k, &v, 0))) goto err;
  }
  MDB_val mk = {sizeof meta_store_id - 1, (void *)meta_store_id};
  MDB_val mv = {G3_STORE_ID_LEN, (void *)id};
  if ((rc = mdb_put(txn, ix->meta, &mk, &mv, 0))) goto err;
  uint8_t fmt[4] = {G3_VERSION, 0, 0, 0};
  MDB_val fk = {sizeof meta_format - 1, (void *)meta_format}, fv = {sizeof fmt, fmt};
  if ((rc = mdb_put(txn, ix->meta, &fk, &fv, 0))) goto err;
  return g3_mdb_err(mdb_txn_commit(txn));
err:
  mdb_txn_abort(txn);
  return g3_mdb_err(rc);
}
