/*
 * hint.h - the vocabulary of engine hints: what an engine may tell the
 * daemon about the requests and sessions behind the blocks it stores.
 *
 * Hints are advice for eviction. A session is a conversation, an agent run,
 * a chat: whatever the engine's API layer groups requests by (OpenAI's
 * prompt_cache_key, a chat id). It travels as a 64-bit id, non-zero, that
 * the client derives from its own identifier (kv_session_id below, the same
 * function in libkvclient and the Python package, so two engines that name a
 * session alike agree on its id). The daemon scopes every session by
 * namespace: one tenant's hints never reach another tenant's blocks.
 *
 * Kinds (the HINT request, protocol 1.3, PROTOCOL.md):
 *   SESSION   these blocks belong to session S (sent by whoever stored or
 *             loaded them; the latest session to name a block owns it)
 *   FINISHED  a request of session S finished, with its stop reason; the
 *             keys, if any, are that request's blocks
 *   END       session S is over: its blocks will not be asked for again by it
 * A retention time (seconds, 0: none) may come with SESSION and FINISHED:
 * the client asks that the session's blocks be kept that long since its
 * last request; the daemon caps it (hints.retain_max_s).
 */
#ifndef KV_BASE_HINT_H
#define KV_BASE_HINT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum kv_hint_kind {
  KV_HINT_SESSION = 1,
  KV_HINT_FINISHED = 2,
  KV_HINT_END = 3,
  KV_HINT_KIND_COUNT /* one past the last kind */
} kv_hint_kind;

/* Stop reasons of a finished request's response. */
typedef enum kv_stop {
  KV_STOP_UNKNOWN = 0,  /* not said */
  KV_STOP_END_TURN = 1, /* the model ended its turn: the user speaks next */
  KV_STOP_TOOL_USE = 2, /* the model called a tool: the next request follows soon */
  KV_STOP_MAX_TOKENS = 3,
  KV_STOP_STOP_SEQUENCE = 4,
  KV_STOP_ABORTED = 5, /* cancelled, preempted for good, client went away */
  KV_STOP_OTHER = 6,
  KV_STOP_COUNT /* one past the last reason */
} kv_stop;

/* "end_turn", "tool_use", ...; "unknown" for 0, NULL past the last. */
static inline const char *kv_stop_name(unsigned s) {
  static const char *const names[KV_STOP_COUNT] = {"unknown",       "end_turn", "tool_use",
                                                   "max_tokens",    "stop_sequence",
                                                   "aborted",       "other"};
  return s < KV_STOP_COUNT ? names[s] : NULL;
}

/* The reason a name stands for; OpenAI's and Anthropic's spellings both
 * ("stop" is end_turn, "length" max_tokens, "tool_calls" tool_use, "abort"
 * aborted). A name not known is KV_STOP_OTHER, NULL or "" is UNKNOWN. */
static inline kv_stop kv_stop_parse(const char *s) {
  if (!s || !*s) return KV_STOP_UNKNOWN;
  static const struct {
    const char *name;
    kv_stop stop;
  } tab[] = {{"unknown", KV_STOP_UNKNOWN},
             {"end_turn", KV_STOP_END_TURN},
             {"stop", KV_STOP_END_TURN},
             {"tool_use", KV_STOP_TOOL_USE},
             {"tool_calls", KV_STOP_TOOL_USE},
             {"function_call", KV_STOP_TOOL_USE},
             {"max_tokens", KV_STOP_MAX_TOKENS},
             {"length", KV_STOP_MAX_TOKENS},
             {"stop_sequence", KV_STOP_STOP_SEQUENCE},
             {"aborted", KV_STOP_ABORTED},
             {"abort", KV_STOP_ABORTED}};
  for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
    if (strcmp(s, tab[i].name) == 0) return tab[i].stop;
  return KV_STOP_OTHER;
}

/* A session's id from its identifier: FNV-1a 64 of the bytes, 0 mapped to
 * 1 (0 means "no session" on the wire). Not a secret and not collision
 * proof: a collision mixes two sessions' advice inside one namespace. */
static inline uint64_t kv_session_id(const void *p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++) {
    h ^= ((const uint8_t *)p)[i];
    h *= 0x100000001b3ull;
  }
  return h ? h : 1;
}

#endif
