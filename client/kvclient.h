/*
 * kvclient.h - libkvclient, the library inference workers link to use
 * kvcached. This is its one public header; it compiles on its own.
 *
 * Thread-safety: every function here is safe to call from any thread.
 */
#ifndef KVCLIENT_H
#define KVCLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVC_DIGEST_BYTES 32

/* The library's version, "MAJOR.MINOR.PATCH". */
const char *kvc_version(void);

/*
 * The canonical chained block hash, for engines that have none of their own:
 *
 *   digest = BLAKE2b-256(key = salt,
 *                        "kvcached-chain-v1" || parent || LE32(ntokens) ||
 *                        LE32(token[0]) .. LE32(token[n-1]) || extra)
 *
 * `parent` is the previous block's digest, or NULL for the first block of a
 * sequence (hashed as 32 zero bytes). `salt` (may be NULL/0) keys the hash,
 * so two deployments or tenants with different salts never share a digest;
 * a salt longer than 64 bytes is first hashed down. `extra` (may be NULL/0)
 * carries whatever else decides the KV (LoRA id, multimodal input hashes).
 * A cryptographic hash: a collision would serve one user's KV to another.
 * Writes KVC_DIGEST_BYTES to out. Returns 0, or -EINVAL for a NULL out or
 * a NULL tokens with ntokens > 0.
 */
int kvc_chain_hash(uint8_t out[KVC_DIGEST_BYTES],
                   const uint8_t parent[KVC_DIGEST_BYTES],
                   const int32_t *tokens, size_t ntokens,
                   const void *extra, size_t extra_len,
                   const void *salt, size_t salt_len);

#ifdef __cplusplus
}
#endif
#endif
