/* buf.c - the growable or fixed byte buffer encoders append to (buf.h). */
#include "base/buf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define KV_BUF_MIN 256

void kv_buf_init(kv_buf *b) {
  b->p = NULL;
  b->len = b->cap = 0;
  b->fixed = 0;
}

void kv_buf_init_fixed(kv_buf *b, void *mem, size_t cap) {
  b->p = mem;
  b->len = 0;
  b->cap = mem ? cap : 0;
  b->fixed = 1;
}

void kv_buf_free(kv_buf *b) {
  if (!b->fixed) {
    free(b->p);
    b->p = NULL;
    b->cap = 0;
  }
  b->len = 0;
}

int kv_buf_reserve(kv_buf *b, size_t extra) {
  if (extra > KV_BUF_MAX || b->len > KV_BUF_MAX - extra) return b->fixed ? -ENOBUFS : -EMSGSIZE;
  size_t need = b->len + extra;
  if (need <= b->cap) return 0;
  if (b->fixed) return -ENOBUFS;
  size_t cap = b->cap ? b->cap : KV_BUF_MIN;
  while (cap < need) cap = cap > KV_BUF_MAX / 2 ? KV_BUF_MAX : cap * 2;
  uint8_t *p = realloc(b->p, cap);
  if (!p) return -ENOMEM;
  b->p = p;
  b->cap = cap;
  return 0;
}

int kv_buf_append(kv_buf *b, const void *p, size_t n) {
  int rc = kv_buf_reserve(b, n);
  if (rc) return rc;
  if (n) memcpy(b->p + b->len, p, n);
  b->len += n;
  return 0;
}

void kv_buf_consume(kv_buf *b, size_t n) {
  if (n >= b->len) {
    b->len = 0;
    return;
  }
  memmove(b->p, b->p + n, b->len - n);
  b->len -= n;
}
