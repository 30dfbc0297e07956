/*
 * errors.h - kvcached's error codes.
 *
 * Every function of the project returns 0 (or a count) on success and a
 * negative number on failure: either -errno, or one of the domain errors
 * below, which live in a reserved range (-KV_ERR_BASE ... ) so they never
 * collide with an errno value. kv_strerror() and kv_err_name() describe both.
 * The numeric values are part of the wire protocol (proto/PROTOCOL.md):
 * never renumber an entry, only append.
 */
#ifndef KV_BASE_ERRORS_H
#define KV_BASE_ERRORS_H

#define KV_ERR_BASE 10000

/* X(name, value offset, message) */
#define KV_ERRNO_MAP(X)                                                   \
  X(EXISTS, 1, "block already exists")                                    \
  X(NOTFOUND, 2, "block not found")                                       \
  X(ALLPINNED, 3, "tier full and every block in it is pinned")            \
  X(PINUNDERFLOW, 4, "unpin of a block that is not pinned")               \
  X(BADSTATE, 5, "block is in the wrong state for this operation")        \
  X(TOOBIG, 6, "size larger than the tier's page or slot limit")          \
  X(CORRUPT, 7, "stored bytes failed their checksum")                     \
  X(BADFRAME, 8, "malformed frame")                                       \
  X(BADVERSION, 9, "unsupported protocol version")                        \
  X(BADOP, 10, "unknown opcode")                                          \
  X(NOTOWNER, 11, "operation on an allocation this session does not own") \
  X(NOSESSION, 12, "no HELLO on this connection")                         \
  X(DEGRADED, 13, "tier is degraded and not admitting")                   \
  X(NOTSHAREABLE, 14, "memory cannot be shared with this process")        \
  X(BADFD, 15, "missing, unexpected or truncated file descriptor on a frame")   \
  X(SHARE, 16, "this connection holds its share of its tenant's G2 slots")

enum {
#define KV_ERR_ENUM(name, off, msg) KV_E##name = -(KV_ERR_BASE + (off)),
  KV_ERRNO_MAP(KV_ERR_ENUM)
#undef KV_ERR_ENUM
};

/* Human message for a -errno or KV_E* value; never NULL. */
const char *kv_strerror(int err);
/* Short symbolic name ("ENOSPC", "KV_EEXISTS"); never NULL. */
const char *kv_err_name(int err);

#endif
