/* errors.c - messages and names for kvcached's error codes (see errors.h). */
#include "base/errors.h"

#include <errno.h>
#include <string.h>

const char *kv_strerror(int err) {
  switch (err) {
#define KV_ERR_MSG(name, off, msg) \
  case KV_E##name: return msg;
    KV_ERRNO_MAP(KV_ERR_MSG)
#undef KV_ERR_MSG
  default: break;
  }
  if (err < 0 && err > -KV_ERR_BASE) return strerror(-err);
  if (err == 0) return "success";
  return "unknown error";
}

const char *kv_err_name(int err) {
  switch (err) {
#define KV_ERR_NAME(name, off, msg) \
  case KV_E##name: return "KV_E" #name;
    KV_ERRNO_MAP(KV_ERR_NAME)
#undef KV_ERR_NAME
  default: break;
  }
  if (err < 0 && err > -KV_ERR_BASE) {
    const char *n = strerrorname_np(-err);
    return n ? n : "EUNKNOWN";
  }
  return err == 0 ? "OK" : "EUNKNOWN";
}
