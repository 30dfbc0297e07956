/* kvfile.c - reading a safetensors file of 16-bit KV (kvfile.h). */
#include "tools/kvfile.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/le.h"

#define HDR_MAX         (64u << 20) /* a safetensors JSON header longer is refused */

int kv_kvfile_load(const char *path, kvfile *f) {
  memset(f, 0, sizeof *f);
  f->path = path;
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    fprintf(stderr, "%s: %s\n", path, strerror(errno));
    return -1;
  }
  uint8_t le[8];
  char *hdr = NULL;
  json_t *js = NULL;
  int rc = -1;
  if (fread(le, 1, 8, fp) != 8 || fseek(fp, 0, SEEK_END) != 0) goto bad;
  long size = ftell(fp);
  uint64_t hlen = kv_ld64(le);
  if (size < 8 || hlen > HDR_MAX || hlen > (uint64_t)size - 8) goto bad;
  hdr = malloc(hlen + 1);
  if (!hdr || fseek(fp, 8, SEEK_SET) != 0 || fread(hdr, 1, hlen, fp) != hlen) goto bad;
  json_error_t err;
  js = json_loadb(hdr, hlen, 0, &err);
  if (!json_is_object(js)) goto bad;
  uint64_t lo = UINT64_MAX, hi = 0, sum = 0, avail = (uint64_t)size - 8 - hlen;
  const char *name;
  json_t *t;
  json_object_foreach(js, name, t) {
    if (!strcmp(name, "__metadata__")) continue;
    const char *dt = json_string_value(json_object_get(t, "dtype"));
    json_t *off = json_object_get(t, "data_offsets");
    if (!dt || (strcmp(dt, "F16") && strcmp(dt, "BF16"))) {
      fprintf(stderr, "%s: tensor %s is %s, not F16 or BF16\n", path, name, dt ? dt : "?");
      goto out;
    }
    if (f->dtype[0] && strcmp(f->dtype, dt)) {
      fprintf(stderr, "%s: tensors of two dtypes (%s, %s)\n", path, f->dtype, dt);
      goto out;
    }
    snprintf(f->dtype, sizeof f->dtype, "%s", dt);
    json_int_t a = json_integer_value(json_array_get(off, 0));
    json_int_t b = json_integer_value(json_array_get(off, 1));
    if (json_array_size(off) != 2 || a < 0 || b < a || (uint64_t)b > avail || (b - a) % 2) goto bad;
    if ((uint64_t)a < lo) lo = (uint64_t)a;
    if ((uint64_t)b > hi) hi = (uint64_t)b;
    sum += (uint64_t)(b - a);
  }
  if (!f->dtype[0] || sum != hi - lo || sum == 0) goto bad;
  f->len = (size_t)sum;
  f->data = malloc(f->len);
  if (!f->data || fseek(fp, (long)(8 + hlen + lo), SEEK_SET) != 0 ||
      fread(f->data, 1, f->len, fp) != f->len)
    goto bad;
  rc = 0;
  goto out;
bad:
  fprintf(stderr, "%s: not a safetensors file of 16-bit tensors this reads\n", path);
out:
  if (rc) free(f->data);
  json_decref(js);
  free(hdr);
  fclose(fp);
  return rc;
}

