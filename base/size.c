/* size.c - size parsing (size.h). */
#include "base/size.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

int kv_parse_size(const char *s, uint64_t *out) {
  if (!s) return -EINVAL;
  while (isspace((unsigned char)*s)) s++;
  if (!isdigit((unsigned char)*s)) return -EINVAL;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno) return -EINVAL;
  unsigned shift = 0;
  switch (toupper((unsigned char)*end)) {
  case 'K':
    shift = 10;
    end++;
    break;
  case 'M':
    shift = 20;
    end++;
    break;
  case 'G':
    shift = 30;
    end++;
    break;
  case 'T':
    shift = 40;
    end++;
    break;
  default: break;
  }
  if (shift && (*end == 'i' || *end == 'I')) end++;
  if (*end == 'B' || *end == 'b') end++;
  while (isspace((unsigned char)*end)) end++;
  if (*end) return -EINVAL;
  if (shift && v > (UINT64_MAX >> shift)) return -EINVAL;
  *out = (uint64_t)v << shift;
  return 0;
}
