/*
 * buf.h - a small byte buffer that encoders append frames to.
 *
 * Two kinds: a growable buffer (kv_buf_init: heap memory, doubled as
 * needed, up to KV_BUF_MAX) and a fixed one over caller memory
 * (kv_buf_init_fixed: never grown, never freed; an append that does not fit
 * fails with -ENOBUFS). Appends are all-or-nothing: on error the buffer is
 * unchanged. Not thread-safe; one owner at a time.
 */
#ifndef KV_BASE_BUF_H
#define KV_BASE_BUF_H

#include <stddef.h>
#include <stdint.h>

/* Largest size a growable buffer reaches: one maximal data frame and a bit. */
#define KV_BUF_MAX ((size_t)80 << 20)

typedef struct kv_buf {
  uint8_t *p; /* bytes [0, len) are the content */
  size_t len;
  size_t cap;
  int fixed; /* caller memory: never grown or freed */
} kv_buf;

/* An empty growable buffer; allocates nothing until the first append. */
void kv_buf_init(kv_buf *b);

/* A buffer over caller memory mem[0..cap); it is never grown or freed. */
void kv_buf_init_fixed(kv_buf *b, void *mem, size_t cap);

/* Frees a growable buffer's memory and leaves it empty and reusable.
 * For a fixed buffer only empties it. Safe to call twice. */
void kv_buf_free(kv_buf *b);

/* Empties the buffer, keeping its memory. */
static inline void kv_buf_reset(kv_buf *b) { b->len = 0; }

/*
 * Makes room for `extra` more bytes after len. Returns 0; -ENOBUFS when a
 * fixed buffer is too small; -EMSGSIZE when len + extra exceeds KV_BUF_MAX;
 * -ENOMEM. On error nothing changes.
 */
int kv_buf_reserve(kv_buf *b, size_t extra);

/* Appends n bytes (reserve + copy). 0 or kv_buf_reserve()'s errors. */
int kv_buf_append(kv_buf *b, const void *p, size_t n);

/* Drops the first n bytes (n <= len), moving the rest to the front. */
void kv_buf_consume(kv_buf *b, size_t n);

#endif
