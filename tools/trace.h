/*
 * trace.h - Mooncake-format request traces (one JSON object per line:
 * {"timestamp": ms, "input_length": tokens, "output_length": tokens,
 *  "hash_ids": [block ids of the prompt, in order]}), with what an API
 * server knows of a request when the trace has it: "session" (a number or
 * a string), "agent" (a sub-agent's id; "" for the main agent) and "stop"
 * (its response's stop reason, known once the response ends). The file
 * may be gzip-compressed (the tree's agentic trace is).
 */
#ifndef KV_TOOLS_TRACE_H
#define KV_TOOLS_TRACE_H

#include <stddef.h>
#include <stdint.h>

typedef struct kv_trace_req {
  uint64_t ts_ms;
  uint32_t input_len, output_len;
  uint32_t n;       /* blocks */
  uint64_t *ids;    /* points into kv_trace.ids */
  uint64_t session; /* kv_session_id of "session" (a number as its decimal text); 0: none */
  uint64_t agent;   /* kv_session_id of "session/agent" when "agent" is not empty; 0: none */
  uint8_t stop;     /* kv_stop_parse of "stop" (base/hint.h) */
} kv_trace_req;

typedef struct kv_trace {
  kv_trace_req *req;
  size_t nreq;
  uint64_t *ids;
  size_t nids;     /* block references */
  size_t nunique;  /* distinct block ids */
  uint64_t tokens; /* sum of input lengths */
  size_t nsession; /* requests with a session */
} kv_trace;

/* What a replay of a trace hit: block references and the prefix of each
 * request that hit (a block counts while every earlier block of its
 * request hit), blocks that hit anywhere, and prompt tokens (a prefix
 * block is 512 tokens, at most the request's input length). */
typedef struct kv_trace_hits {
  uint64_t refs, prefix_hits, block_hits, tokens, prefix_tokens;
} kv_trace_hits;

/* Counts request q: `prefix` of its blocks hit in its leading run, `any`
 * hit anywhere. */
static inline void kv_trace_count(kv_trace_hits *h, const kv_trace_req *q, uint32_t prefix,
                                  uint32_t any) {
  h->refs += q->n;
  h->prefix_hits += prefix;
  h->block_hits += any;
  h->tokens += q->input_len;
  uint64_t tok = (uint64_t)prefix * 512;
  h->prefix_tokens += tok < q->input_len ? tok : q->input_len;
}

/* Numbers t's references by block: dense[i] (t->nids of them) is in
 * 0..*nunique-1, blocks numbered in order of first reference. 0 or
 * -ENOMEM. */
int kv_trace_dense(const kv_trace *t, uint32_t *dense, size_t *nunique);

/* Loads a trace, plain or gzip. 0, -errno (-EIO: a damaged or cut gzip
 * stream, at line *bad_line), or -EINVAL with the line number in *bad_line. */
int kv_trace_load(kv_trace *t, const char *path, size_t *bad_line);
void kv_trace_free(kv_trace *t);

/* The block key kvbench uses for a trace id: 8 bytes, little-endian. */
static inline void kv_trace_key(uint64_t id, uint8_t out[8]) {
  for (int i = 0; i < 8; i++) out[i] = (uint8_t)(id >> (8 * i));
}

#endif
