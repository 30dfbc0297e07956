/*
 * size.h - sizes as operators write them: "512M", "4G", "1TiB".
 *
 * Shared by the configuration, the admin routes and the tools' options.
 */
#ifndef KV_BASE_SIZE_H
#define KV_BASE_SIZE_H

#include <stdint.h>

/* Parses a size: digits with an optional K, M, G or T suffix (powers of
 * 1024), optionally followed by "B"/"iB". 0 or -EINVAL (empty, junk,
 * negative, overflow). */
int kv_parse_size(const char *s, uint64_t *out);

#endif
