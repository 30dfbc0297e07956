/* trace.c - Mooncake trace loader (see trace.h). */
#include "tools/trace.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <xxhash.h>
#include <zlib.h>

#include "base/hint.h"

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 1024;
  while (c < need) c *= 2;
  void *n = realloc(*p, c * elem);
  if (!n) return -ENOMEM;
  *p = n;
  *cap = c;
  return 0;
}

/* Numbers ids[0..n) by block, 0.. in order of first reference, into
 * dense (NULL: only counted); the count in *nunique. 0 or -ENOMEM. */
static int number_ids(const uint64_t *ids, size_t n, uint32_t *dense, size_t *nunique) {
  size_t cap = 64;
  while (cap < n * 2) cap <<= 1;
  uint64_t *set = malloc(cap * sizeof *set);
  uint32_t *num = malloc(cap * sizeof *num);
  if (!set || !num) {
    free(set);
    free(num);
    return -ENOMEM;
  }
  memset(num, 0xff, cap * sizeof *num); /* UINT32_MAX: empty */
  uint32_t u = 0;
  for (size_t i = 0; i < n; i++) {
    size_t h = XXH3_64bits(&ids[i], 8) & (cap - 1);
    while (num[h] != UINT32_MAX && set[h] != ids[i]) h = (h + 1) & (cap - 1);
    if (num[h] == UINT32_MAX) set[h] = ids[i], num[h] = u++;
    if (dense) dense[i] = num[h];
  }
  free(set);
  free(num);
  *nunique = u;
  return 0;
}

int kv_trace_dense(const kv_trace *t, uint32_t *dense, size_t *nunique) {
  return number_ids(t->ids, t->nids, dense, nunique);
}

/* What an API server knows of the request: its session (and sub-agent)
 * and its stop reason. A session given as a number is named by its
 * decimal text, so "7" and 7 are the same session. */
static void hint_fields(kv_trace_req *r, json_t *o) {
  json_t *sess = json_object_get(o, "session"), *agent = json_object_get(o, "agent");
  json_t *stop = json_object_get(o, "stop");
  char name[512];
  int n = -1;
  if (json_is_integer(sess))
    n = snprintf(name, sizeof name, "%lld", (long long)json_integer_value(sess));
  else if (json_is_string(sess) && json_string_length(sess))
    n = snprintf(name, sizeof name, "%s", json_string_value(sess));
  if (n > 0 && (size_t)n < sizeof name) {
    r->session = kv_session_id(name, (size_t)n);
    if (json_is_string(agent) && json_string_length(agent)) {
      int m = snprintf(name + n, sizeof name - (size_t)n, "/%s", json_string_value(agent));
      if (m > 0 && (size_t)(n + m) < sizeof name) r->agent = kv_session_id(name, (size_t)(n + m));
    }
  }
  r->stop = (uint8_t)kv_stop_parse(json_is_string(stop) ? json_string_value(stop) : NULL);
}

/* The next line of f (gzip, or plain: zlib reads a file that is not gzip
 * as it is) into *buf, grown as needed: its length, 0 at the end, or
 * -EIO (a damaged or cut gzip stream) / -ENOMEM. */
static ssize_t gz_line(gzFile f, char **buf, size_t *cap) {
  size_t len = 0;
  for (;;) {
    if (*cap - len < 2) {
      size_t ncap = *cap ? 2 * *cap : 4096;
      char *nb = ncap > INT_MAX ? NULL : realloc(*buf, ncap);
      if (!nb) return -ENOMEM;
      *buf = nb;
      *cap = ncap;
    }
    if (!gzgets(f, *buf + len, (int)(*cap - len))) {
      int err = Z_OK;
      gzerror(f, &err);
      if (err != Z_OK && err != Z_STREAM_END) return -EIO;
      return (ssize_t)len;
    }
    len += strlen(*buf + len);
    if (len && (*buf)[len - 1] == '\n') return (ssize_t)len;
  }
}

int kv_trace_load(kv_trace *t, const char *path, size_t *bad_line) {
  memset(t, 0, sizeof *t);
  gzFile f = gzopen(path, "rb");
  if (!f) return errno ? -errno : -ENOMEM;
  size_t capreq = 0, capids = 0, lineno = 0, linecap = 0;
  char *line = NULL;
  ssize_t len;
  int rc = 0;
  size_t *offs = NULL, capoffs = 0;
  while ((len = gz_line(f, &line, &linecap)) != 0) {
    if (len < 0) {
      rc = (int)len;
      lineno++;
      break;
    }
    lineno++;
    if (len <= 1) continue;
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    json_t *ids = o ? json_object_get(o, "hash_ids") : NULL;
    json_t *ts = o ? json_object_get(o, "timestamp") : NULL;
    json_t *in = o ? json_object_get(o, "input_length") : NULL;
    json_t *out = o ? json_object_get(o, "output_length") : NULL;
    if (!o || !json_is_array(ids) || !json_is_integer(in)) {
      json_decref(o);
      rc = -EINVAL;
      break;
    }
    size_t n = json_array_size(ids);
    if (grow((void **)&t->req, &capreq, t->nreq + 1, sizeof *t->req) ||
        grow((void **)&offs, &capoffs, t->nreq + 1, sizeof *offs) ||
        grow((void **)&t->ids, &capids, t->nids + n, sizeof *t->ids)) {
      json_decref(o);
      rc = -ENOMEM;
      break;
    }
    for (size_t i = 0; i < n; i++) {
      json_t *v = json_array_get(ids, i);
      if (!json_is_integer(v) || json_integer_value(v) < 0) {
        rc = -EINVAL;
        break;
      }
      t->ids[t->nids + i] = (uint64_t)json_integer_value(v);
    }
    if (rc) {
      json_decref(o);
      break;
    }
    kv_trace_req *r = &t->req[t->nreq];
    r->ts_ms = json_is_integer(ts) ? (uint64_t)json_integer_value(ts) : 0;
    r->input_len = (uint32_t)json_integer_value(in);
    r->output_len = json_is_integer(out) ? (uint32_t)json_integer_value(out) : 0;
    r->n = (uint32_t)n;
    r->session = r->agent = 0;
    hint_fields(r, o);
    t->nsession += r->session != 0;
    offs[t->nreq] = t->nids;
    t->nids += n;
    t->tokens += r->input_len;
    t->nreq++;
    json_decref(o);
  }
  free(line);
  gzclose(f);
  if (!rc) {
    for (size_t i = 0; i < t->nreq; i++) t->req[i].ids = t->ids + offs[i];
    if (number_ids(t->ids, t->nids, NULL, &t->nunique)) t->nunique = 0;
    if (t->nreq == 0) rc = -EINVAL;
  } else if (bad_line) {
    *bad_line = lineno;
  }
  free(offs);
  if (rc) kv_trace_free(t);
  return rc;
}

void kv_trace_free(kv_trace *t) {
  free(t->req);
  free(t->ids);
  memset(t, 0, sizeof *t);
}
