/* config.c - the option table and its readers (see config.h). */
#include "daemon/config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <ini.h>
#include <math.h>
#include <pwd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sodium.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "base/hex.h"
#include "base/log.h"
#include "base/paths.h"
#include "daemon/admin.h"
#include "daemon/server.h"
#include "ipc/sock.h"
#include "tiers/evict.h"
#include "tiers/g3.h"
#include "tiers/g4_cluster.h"
#include "tiers/quant.h"

typedef enum { OPT_SIZE, OPT_BOOL, OPT_STR, OPT_U32, OPT_ENUM } opt_type;

/* One name of an enum option. A value may have more than one name: the
 * first is the one written back, the others are accepted as well. */
typedef struct opt_name {
  const char *name;
  int value;
} opt_name;

typedef struct opt {
  const char *section, *name;
  opt_type type;
  size_t off, len; /* len: buffer size for OPT_STR */
  const char *def;
  const char *doc;
  const opt_name *names; /* OPT_ENUM: its names, ending with {NULL} */
  const char *flag;      /* an older spelling of its command-line flag, or NULL */
} opt;

/* Enum options are stored as the field's C enum, the size of an int. */
_Static_assert(sizeof(kv_g3_backend) == sizeof(int) && sizeof(kv_admit) == sizeof(int) &&
                   sizeof(kv_log_level) == sizeof(int) && sizeof(kv_cfg_g1_enable) == sizeof(int) &&
                   sizeof(kv_dev_backend) == sizeof(int),
               "an enum option is an int");

static const opt_name g1_enable_names[] = {
    {"auto", KV_CFG_G1_AUTO}, {"on", KV_CFG_G1_ON}, {"off", KV_CFG_G1_OFF}, {NULL, 0}};
static const opt_name g1_backend_names[] = {
    {"auto", KV_DEV_AUTO}, {"cuda", KV_DEV_CUDA}, {"sim", KV_DEV_SIM}, {NULL, 0}};
static const opt_name g3_backend_names[] = {{"auto", KV_G3_BACKEND_AUTO},
                                            {"uring", KV_G3_BACKEND_URING},
                                            {"threads", KV_G3_BACKEND_THREADS},
                                            {NULL, 0}};
static const opt_name g3_admit_names[] = {{"always", KV_ADMIT_ALWAYS},
                                          {"second-use", KV_ADMIT_SECOND_USE},
                                          {"min-prio", KV_ADMIT_MIN_PRIO},
                                          {NULL, 0}};
static const opt_name g4_admit_names[] = {
    {"always", KV_ADMIT_ALWAYS}, {"second-use", KV_ADMIT_SECOND_USE}, {NULL, 0}};
static const opt_name g4_codec_names[] = {
    {"off", KV_G4_CODEC_OFF}, {"auto", KV_G4_CODEC_AUTO}, {NULL, 0}};
static const opt_name g3_codec_names[] = {
    {"off", KV_G3_CODEC_OFF}, {"auto", KV_G3_CODEC_AUTO}, {NULL, 0}};
static const opt_name log_level_names[] = {{"debug", KV_LOG_DEBUG}, {"info", KV_LOG_INFO},
                                           {"warn", KV_LOG_WARN},   {"warning", KV_LOG_WARN},
                                           {"error", KV_LOG_ERROR}, {NULL, 0}};

#define O(field) offsetof(kv_config, field)
/* An entry leaves out names and flag when it has none. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
static const opt opts[] = {
    {"daemon", "socket_dir", OPT_STR, O(socket_dir), sizeof(((kv_config *)0)->socket_dir),
     KV_SOCKET_DIR, "directory of the worker socket (kvcached.sock); created 0750 if missing", NULL,
     "socket-dir"},
    {"daemon", "load_timeout_ms", OPT_U32, O(load_timeout_ms), 0, "5000",
     "a LOAD or ALLOC waiting this long for G2 room answers its waiting blocks "
     "with a timeout (LOAD) or -EAGAIN (ALLOC)"},
    {"g2", "capacity", OPT_SIZE, O(g2_capacity), 0, "1G",
     "bytes of pinned host memory for the G2 tier (K/M/G/T suffixes)", NULL, "g2-capacity"},
    {"g2", "page_size", OPT_SIZE, O(g2_page_size), 0, "64M",
     "G2 is carved into pages of this size, each holding blocks of one size; "
     "the largest block must fit in one page"},
    {"g2", "lock", OPT_BOOL, O(g2_lock), 0, "yes",
     "mlock G2 so it is never swapped (needs RLIMIT_MEMLOCK; falls back to "
     "unlocked with a warning)"},
    {"g2", "tenants", OPT_U32, O(g2_tenants), 0, "1",
     "no longer used, must be 1: tenants, each with a G2 arena of its own, are "
     "[tenant.NAME] sections (daemon/OPS.md)"},
    {"g1", "enable", OPT_ENUM, O(g1_enable), 0, "auto",
     "G1 device pools: auto (on when a CUDA device answers), on (start fails without "
     "a device), off",
     g1_enable_names},
    {"g1", "capacity", OPT_SIZE, O(g1_capacity), 0, "1G",
     "bytes of device memory in the G1 pool of each device (rounded up to the allocation "
     "granularity)"},
    {"g1", "backend", OPT_ENUM, O(g1_backend), 0, "auto",
     "auto (CUDA), cuda, or sim (device memory simulated in shared host memory: tests, demos)",
     g1_backend_names},
    {"g1", "device", OPT_STR, O(g1_device), sizeof(((kv_config *)0)->g1_device), "0",
     "device ordinals, comma-separated (up to 8): a pool of g1.capacity on each; "
     "a worker gets the pool of the device it computes on"},
    {"g3", "path", OPT_STR, O(g3_path), sizeof(((kv_config *)0)->g3_path), "/var/lib/kvcached",
     "directories of the SSD tier, comma-separated (one preallocated file each, "
     "created if missing); empty: no G3",
     NULL, "g3-path"},
    {"g3", "capacity", OPT_SIZE, O(g3_capacity), 0, "4G",
     "bytes of SSD per G3 directory (the file is preallocated to about this)", NULL, "g3-capacity"},
    {"g3", "block_bytes", OPT_SIZE, O(g3_block_bytes), 0, "256K",
     "the largest block G3 takes (larger blocks are not demoted), and its slot size unless "
     "slot_bytes says otherwise; existing files keep the slot size they were made with"},
    {"g3", "slot_bytes", OPT_SIZE, O(g3_slot_bytes), 0, "0",
     "SSD slot size when smaller than block_bytes (rounded up to 4K): coded blocks whose stored "
     "form fits take a slot, others are not written to G3; 0: block_bytes"},
    {"g3", "codec", OPT_ENUM, O(g3_codec), 0, "off",
     "G3 blocks of namespaces whose dtype is 16-bit (bf16, fp16) stored losslessly coded when "
     "that makes them smaller: auto, or off (tiers/codec.h)",
     g3_codec_names},
    {"g3", "codec_threads", OPT_U32, O(g3_codec_threads), 0, "2",
     "threads coding and decoding G3's coded blocks (g3.codec, a tenant's cold_precision), off "
     "the event loop: 1..64"},
    {"g3", "queue_depth", OPT_U32, O(g3_queue_depth), 0, "32", "G3 block I/Os in flight at once"},
    {"g3", "backend", OPT_ENUM, O(g3_backend), 0, "auto",
     "auto (io_uring, else a thread pool), uring, or threads", g3_backend_names},
    {"g3", "admit", OPT_ENUM, O(g3_admit), 0, "always",
     "which G2 victims are written to SSD: always, second-use, or min-prio", g3_admit_names},
    {"g3", "min_prio", OPT_U32, O(g3_min_prio), 0, "128",
     "with admit = min-prio: the lowest priority written to SSD (0..255)"},
    {"g3", "retry_ms", OPT_U32, O(g3_retry_ms), 0, "5000",
     "ms between tries while G3 is full (one write let through) or could not be opened "
     "(doubling up to 5 min); 0: never"},
    {"g4", "seeds", OPT_STR, O(g4_seeds), sizeof(((kv_config *)0)->g4_seeds), "",
     "Redis Cluster nodes to learn the cluster from, ip:port, comma-separated (IP addresses: "
     "names would be resolved blocking the loop); empty: no G4 (tiers/G4.md)"},
    {"g4", "user", OPT_STR, O(g4_user), sizeof(((kv_config *)0)->g4_user), "",
     "ACL user to AUTH as (with g4.password); empty: AUTH with the password alone"},
    {"g4", "password", OPT_STR, O(g4_password), sizeof(((kv_config *)0)->g4_password), "",
     "password for AUTH on every connection (crosses the network in clear: hiredis has no TLS "
     "here); empty: no AUTH"},
    {"g4", "prefix", OPT_STR, O(g4_prefix), sizeof(((kv_config *)0)->g4_prefix), KV_G4_PREFIX,
     "prefix of every G4 key name (printable, no space, no braces, at most 32 bytes; may be empty)"},
    {"g4", "ttl_s", OPT_U32, O(g4_ttl_s), 0, "3600",
     "seconds a G4 value lives (every SET has EX): bounds what a deleted namespace leaves"},
    {"g4", "timeout_ms", OPT_U32, O(g4_timeout_ms), 0, "200",
     "a Redis command unanswered this long is a miss (a LOOKUP waits for G4 at most this long)"},
    {"g4", "replica_reads", OPT_BOOL, O(g4_replica_reads), 0, "no",
     "G4 reads may go to replicas (may be older or missing, never wrong: values are checked)"},
    {"g4", "lookup_blocks", OPT_U32, O(g4_lookup_blocks), 0, "256",
     "keys past the local prefix a LOOKUP asks G4 for at most (1..1024)"},
    {"g4", "backlog_blocks", OPT_U32, O(g4_backlog_blocks), 0, "16384",
     "blocks whose G4 write is owed (committed while G4 was not ok) kept, oldest dropped first"},
    {"g4", "absent_ms", OPT_U32, O(g4_absent_ms), 0, "250",
     "a key G4 answered absent is not asked again for this long (0: always asked)"},
    {"g4", "map_refresh_ms", OPT_U32, O(g4_map_refresh_ms), 0, "30000",
     "the slot map is re-read this often while all is well (replicas join it so: replica_reads)"},
    {"g4", "admit", OPT_ENUM, O(g4_admit), 0, "always",
     "which committed blocks are written to G4: always (at commit), or second-use (when a "
     "LOAD or GET uses them a second time)",
     g4_admit_names},
    {"g4", "codec", OPT_ENUM, O(g4_codec), 0, "off",
     "values of namespaces whose dtype is 16-bit (bf16, fp16) stored losslessly coded when that "
     "makes them smaller: auto, or off (tiers/codec.h)",
     g4_codec_names},
    {"g4", "key_file", OPT_STR, O(g4_key_file), sizeof(((kv_config *)0)->g4_key_file), "",
     "file holding the fleet's secret that signs and verifies G4 values (64 to 128 hex digits; "
     "owned by kvcached's user, mode 0600 or 0400; the same on every node); required with "
     "g4.seeds"},
    {"g4", "old_key_file", OPT_STR, O(g4_old_key_file), sizeof(((kv_config *)0)->g4_old_key_file),
     "", "during a key rotation: the previous secret's file, whose values are still accepted "
     "until g4.old_key_until (never used to sign); empty: none"},
    {"g4", "old_key_until", OPT_STR, O(g4_old_key_until),
     sizeof(((kv_config *)0)->g4_old_key_until), "",
     "end of the rotation window, UTC, as 2026-12-01T00:00:00Z: after it values signed by "
     "g4.old_key_file are refused (a miss)"},
    {"cache", "policy", OPT_STR, O(policy), sizeof(((kv_config *)0)->policy),
     NULL /* kv_evict_default */,
     "eviction policy: adapt, aged, aged0, reuse, lru, lru2, lfuda, arc, s3fifo, tinylfu or auto", NULL, "policy"},
    {"cache", "retain_max_s", OPT_U32, O(retain_max_s), 0, "3600",
     "engine hints: the most seconds of retention a session's blocks are granted after its "
     "last request, whatever a client asks (0: none granted)"},
    {"cache", "hint_sessions", OPT_U32, O(hint_sessions), 0, "65536",
     "engine hints: sessions remembered at most, shared by tenants (a tenant's new session "
     "forgets its own least recently hinted one once it holds its even part)"},
    {"log", "level", OPT_ENUM, O(log_level), 0, "info",
     "least severe level logged: debug, info, warn, error", log_level_names, "log-level"},
    {"stats", "listen", OPT_STR, O(stats_listen), sizeof(((kv_config *)0)->stats_listen), "",
     "also serve /metrics and /health (no other route) over TCP on host:port "
     "(e.g. 127.0.0.1:9464); empty: Unix socket only"},
    {"stats", "connections", OPT_U32, O(stats_connections), 0, "64",
     "connections at once on the stats socket; when full, the one that waited longest for a "
     "complete request makes room for a new one"},
    {"stats", "tcp_connections", OPT_U32, O(stats_tcp_connections), 0, "16",
     "connections at once on stats.listen, counted apart from the Unix socket's"},
    {"stats", "request_timeout_ms", OPT_U32, O(stats_request_timeout_ms), 0, "10000",
     "an HTTP request (stats, TCP, admin) not complete this long after its start (the accept, "
     "or its first byte on a kept-alive connection) is answered 408 and its connection closed"},
    {"limits", "connections", OPT_U32, O(limits_connections), 0, "4096",
     "worker connections open at once (fewer when RLIMIT_NOFILE leaves less room); "
     "more are refused with an ERROR"},
    {"limits", "connections_per_uid", OPT_U32, O(limits_connections_per_uid), 0, "1024",
     "worker connections open at once from one user (peer uid); more are refused with an ERROR"},
    {"limits", "hello_timeout_ms", OPT_U32, O(limits_hello_timeout_ms), 0, "10000",
     "a worker connection without a session this long after it was accepted is closed; 0: never"},
    {"limits", "out_bytes", OPT_SIZE, O(limits_out_bytes), 0, "0",
     "replies all worker connections may owe at once; past it the one owing the most is closed; "
     "0 = 1/32 of the memory, 64M to 2G"},
    {"limits", "pins_per_session", OPT_U32, O(limit_pins_per_session), 0, "1048576",
     "pins one worker connection may hold, repeats counted; past it a LOAD's key answers -EDQUOT"},
    {"limits", "allocs_per_session", OPT_U32, O(limit_allocs_per_session), 0, "65536",
     "uncommitted allocations one worker connection may hold; past it an ALLOC's key answers "
     "-EDQUOT"},
    {"limits", "session_share", OPT_U32, O(limit_session_share), 0, "50",
     "percent of its tenant's G2 slots one worker connection may hold pinned or allocated, "
     "together; past it a key answers KV_ESHARE (100 = no such limit)"},
    {"limits", "namespaces_per_tenant", OPT_U32, O(limit_namespaces_per_tenant), 0, "4096",
     "namespaces one tenant may have at once (those with sessions or blocks); past it a HELLO for "
     "a "
     "new one answers -EDQUOT"},
    {"admin", "group", OPT_STR, O(admin_group), sizeof(((kv_config *)0)->admin_group), "",
     "members of this group may use the admin socket (besides root and the daemon's user)"},
    {"admin", "connections", OPT_U32, O(admin_connections), 0, "16",
     "connections at once on the admin socket (full: as stats.connections)"},
};
#pragma GCC diagnostic pop
#undef O
#define NOPTS (sizeof opts / sizeof opts[0])

static int parse_bool(const char *s, int *out) {
  static const char *yes[] = {"1", "yes", "true", "on"}, *no[] = {"0", "no", "false", "off"};
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(s, yes[i]) == 0) {
      *out = 1;
      return 0;
    }
    if (strcasecmp(s, no[i]) == 0) {
      *out = 0;
      return 0;
    }
  }
  return -EINVAL;
}

/* The name an enum option's value is written as, or NULL. */
static const char *enum_name(const opt *o, int v) {
  for (const opt_name *n = o->names; n->name; n++)
    if (n->value == v) return n->name;
  return NULL;
}

/* "a, b, c": an enum option's names, one for each value. */
static void enum_list(const opt *o, const char *sep, char *out, size_t len) {
  size_t at = 0;
  out[0] = 0;
  for (const opt_name *n = o->names; n->name && at < len; n++)
    if (enum_name(o, n->value) == n->name)
      at += (size_t)snprintf(out + at, len - at, "%s%s", at ? sep : "", n->name);
}

static int set_opt(kv_config *c, const opt *o, const char *v, char *err, size_t errlen) {
  void *p = (char *)c + o->off;
  switch (o->type) {
  case OPT_ENUM: {
    for (const opt_name *n = o->names; n->name; n++)
      if (!strcmp(v, n->name)) {
        *(int *)p = n->value;
        return 0;
      }
    char list[128];
    enum_list(o, ", ", list, sizeof list);
    snprintf(err, errlen, "%s.%s: '%s': expected one of: %s", o->section, o->name, v, list);
    return -EINVAL;
  }
  case OPT_SIZE:
    if (kv_parse_size(v, p) == 0) return 0;
    snprintf(err, errlen, "%s.%s: '%s' is not a size (e.g. 512M, 4G)", o->section, o->name, v);
    return -EINVAL;
  case OPT_BOOL:
    if (parse_bool(v, p) == 0) return 0;
    snprintf(err, errlen, "%s.%s: '%s' is not yes/no", o->section, o->name, v);
    return -EINVAL;
  case OPT_U32: {
    uint64_t x;
    if (kv_parse_size(v, &x) == 0 && x <= UINT32_MAX) {
      *(uint32_t *)p = (uint32_t)x;
      return 0;
    }
    snprintf(err, errlen, "%s.%s: '%s' is not a count", o->section, o->name, v);
    return -EINVAL;
  }
  case OPT_STR:
    if (strlen(v) >= o->len) {
      snprintf(err, errlen, "%s.%s: value longer than %zu bytes", o->section, o->name, o->len - 1);
      return -EINVAL;
    }
    memcpy(p, v, strlen(v) + 1);
    return 0;
  }
  return -EINVAL;
}

void kv_config_defaults(kv_config *c) {
  char err[128];
  memset(c, 0, sizeof *c);
  for (size_t i = 0; i < NOPTS; i++)
    set_opt(c, &opts[i], opts[i].def ? opts[i].def : kv_evict_default, err, sizeof err);
}

static const opt *find_opt(const char *section, const char *name) {
  for (size_t i = 0; i < NOPTS; i++)
    if (strcmp(opts[i].section, section) == 0 && strcmp(opts[i].name, name) == 0) return &opts[i];
  return NULL;
}

/* --- [tenant.NAME] ---------------------------------------------------------------- */

static int tenant_name_ok(const char *s, size_t n) {
  if (n == 0 || n > KV_CFG_TENANT_NAME_MAX) return 0;
  for (size_t i = 0; i < n; i++)
    if (!isalnum((unsigned char)s[i]) && !strchr("._-@", s[i])) return 0;
  return 1;
}

const kv_cfg_tenant *kv_config_tenant(const kv_config *c, const char *name, size_t len) {
  for (uint32_t i = 0; i < c->ntenants; i++)
    if (strlen(c->tenants[i].name) == len && !memcmp(c->tenants[i].name, name, len))
      return &c->tenants[i];
  return NULL;
}

/* One id of a uids/gids list: a number, or a name resolved now. */
static int parse_id(const char *s, int group, uint32_t *out) {
  if (isdigit((unsigned char)*s)) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v >= UINT32_MAX) return -EINVAL; /* (uid_t)-1 names nobody */
    *out = (uint32_t)v;
    return 0;
  }
  char buf[16384];
  int rc;
  if (group) {
    struct group g, *gp = NULL;
    rc = getgrnam_r(s, &g, buf, sizeof buf, &gp);
    if (!rc && gp) *out = (uint32_t)gp->gr_gid;
  } else {
    struct passwd p, *pp = NULL;
    rc = getpwnam_r(s, &p, buf, sizeof buf, &pp);
    if (!rc && pp) *out = (uint32_t)pp->pw_uid;
  }
  if (rc) return -rc;
  return *out == UINT32_MAX ? -ENOENT : 0;
}

static int parse_ids(const char *v, int group, uint32_t *ids, uint32_t *n, const char *what,
                     char *err, size_t errlen) {
  char list[1024];
  if (strlen(v) >= sizeof list) {
    snprintf(err, errlen, "%s: list longer than %zu bytes", what, sizeof list - 1);
    return -EINVAL;
  }
  memcpy(list, v, strlen(v) + 1);
  uint32_t k = 0;
  char *save = NULL;
  for (char *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
    while (isspace((unsigned char)*p)) p++;
    char *e = p + strlen(p);
    while (e > p && isspace((unsigned char)e[-1])) *--e = 0;
    if (!*p) continue;
    uint32_t id = UINT32_MAX;
    int rc = parse_id(p, group, &id);
    if (rc) {
      snprintf(err, errlen, "%s: '%s' is not a %s%s%s", what, p,
               group ? "gid or group name" : "uid or user name",
               rc == -EINVAL || rc == -ENOENT ? "" : ": ",
               rc == -EINVAL || rc == -ENOENT ? "" : strerror(-rc));
      return -EINVAL;
    }
    uint32_t j = 0;
    while (j < k && ids[j] != id) j++;
    if (j < k) continue;
    if (k == KV_CFG_TENANT_IDS_MAX) {
      snprintf(err, errlen, "%s: more than %d entries", what, KV_CFG_TENANT_IDS_MAX);
      return -EINVAL;
    }
    ids[k++] = id;
  }
  *n = k;
  return 0;
}

/* "25%", "12.5%" (hundredths at most), a size, or "" (unset). Members are
 * set one by one: the padding stays as kv_config_defaults left it. */
static int parse_share(const char *v, kv_cfg_share *out) {
  while (isspace((unsigned char)*v)) v++;
  size_t n = strlen(v);
  while (n && isspace((unsigned char)v[n - 1])) n--;
  if (n == 0) {
    out->kind = KV_SHARE_UNSET;
    out->v = 0;
    return 0;
  }
  if (v[n - 1] != '%') {
    uint64_t b;
    if (kv_parse_size(v, &b)) return -EINVAL;
    out->kind = KV_SHARE_BYTES;
    out->v = b;
    return 0;
  }
  char num[32];
  if (n - 1 == 0 || n - 1 >= sizeof num) return -EINVAL;
  memcpy(num, v, n - 1);
  num[n - 1] = 0;
  int dots = 0, frac = 0;
  for (char *p = num; *p; p++) {
    if (*p == '.') {
      if (dots++ || p == num) return -EINVAL;
      continue;
    }
    if (!isdigit((unsigned char)*p)) return -EINVAL;
    frac += dots;
  }
  if (frac > 2) return -EINVAL;
  double x = strtod(num, NULL);
  if (!(x >= 0 && x <= 100)) return -EINVAL;
  out->kind = KV_SHARE_PCT;
  out->v = (uint64_t)llround(x * 100);
  return 0;
}

static int set_tenant(kv_config *c, const char *name, size_t nlen, const char *key,
                      const char *value, char *err, size_t errlen) {
  if (!tenant_name_ok(name, nlen)) {
    snprintf(err, errlen, "tenant '%.*s': names are 1 to %d letters, digits and ._-@",
             (int)(nlen < 80 ? nlen : 80), name, KV_CFG_TENANT_NAME_MAX);
    return -EINVAL;
  }
  kv_cfg_tenant *t = (kv_cfg_tenant *)kv_config_tenant(c, name, nlen);
  kv_cfg_tenant fresh;
  int add = !t;
  if (add) {
    if (c->ntenants == KV_CFG_TENANTS_MAX) {
      snprintf(err, errlen, "tenant.%.*s: more than %d tenants", (int)nlen, name,
               KV_CFG_TENANTS_MAX);
      return -EINVAL;
    }
    memset(&fresh, 0, sizeof fresh);
    memcpy(fresh.name, name, nlen);
    t = &fresh;
  }
  char key_name[KV_CFG_TENANT_NAME_MAX + 48];
  snprintf(key_name, sizeof key_name, "tenant.%.*s.%s", (int)nlen, name, key);
  int rc = 0;
  if (!strcmp(key, "uids")) {
    rc = parse_ids(value, 0, t->uids, &t->nuids, key_name, err, errlen);
  } else if (!strcmp(key, "gids")) {
    rc = parse_ids(value, 1, t->gids, &t->ngids, key_name, err, errlen);
  } else if (!strcmp(key, "g2_share") || !strcmp(key, "g3_share")) {
    rc = parse_share(value, key[1] == '2' ? &t->g2_share : &t->g3_share);
    if (rc)
      snprintf(err, errlen, "%s: '%s' is not a percentage (e.g. 25%%) or a size", key_name, value);
  } else if (!strcmp(key, "cold_precision")) {
    kv_quant_kind k = kv_quant_parse(value);
    if (k || !strcmp(value, "exact"))
      t->cold_precision = (uint8_t)k;
    else {
      snprintf(err, errlen, "%s: '%s' is not exact, fp8 or int8", key_name, value);
      rc = -EINVAL;
    }
  } else {
    snprintf(err, errlen,
             "'%s': no such option (a tenant has uids, gids, g2_share, g3_share, cold_precision)",
             key_name);
    return -ENOENT;
  }
  if (rc == 0 && add) c->tenants[c->ntenants++] = fresh;
  return rc;
}

int kv_config_set(kv_config *c, const char *dotted, const char *value, char *err, size_t errlen) {
  if (!strncmp(dotted, "tenant.", 7)) {
    const char *last = strrchr(dotted, '.');
    if (last > dotted + 7)
      return set_tenant(c, dotted + 7, (size_t)(last - dotted - 7), last + 1, value, err, errlen);
  }
  const char *dot = strchr(dotted, '.');
  char section[32];
  if (!dot || (size_t)(dot - dotted) >= sizeof section) {
    snprintf(err, errlen, "'%s': options are named section.name", dotted);
    return -ENOENT;
  }
  memcpy(section, dotted, (size_t)(dot - dotted));
  section[dot - dotted] = 0;
  const opt *o = find_opt(section, dot + 1);
  if (!o) {
    snprintf(err, errlen, "'%s': no such option", dotted);
    return -ENOENT;
  }
  return set_opt(c, o, value, err, errlen);
}

typedef struct load_ctx {
  kv_config *c;
  char *err;
  size_t errlen;
  int rc;
  const char *path;
} load_ctx;

static int on_ini(void *user, const char *section, const char *name, const char *value) {
  load_ctx *x = user;
  if (x->rc) return 0;
  if (!strncmp(section, "tenant.", 7)) {
    if (set_tenant(x->c, section + 7, strlen(section + 7), name, value, x->err, x->errlen)) {
      x->rc = -EINVAL;
      return 0;
    }
    return 1;
  }
  const opt *o = find_opt(section, name);
  if (!o) {
    snprintf(x->err, x->errlen, "unknown option [%s] %s", section, name);
    x->rc = -EINVAL;
    return 0;
  }
  if (set_opt(x->c, o, value, x->err, x->errlen)) {
    x->rc = -EINVAL;
    return 0;
  }
  return 1;
}

int kv_config_load(kv_config *c, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    int e = errno;
    snprintf(err, errlen, "%s: %s", path, strerror(e));
    return -e;
  }
  char msg[256] = "syntax error";
  load_ctx x = {c, msg, sizeof msg, 0, path};
  /* inih stops at the first line a handler refuses and returns its number. */
  int line = ini_parse_file(f, on_ini, &x);
  fclose(f);
  if (line != 0) {
    snprintf(err, errlen, "%s:%d: %s", path, line, msg);
    return -EINVAL;
  }
  return 0;
}

int kv_config_g1_devices(const kv_config *c, int ord[KV_CFG_G1_DEVICES_MAX]) {
  int n = 0;
  const char *p = c->g1_device;
  for (;;) {
    while (*p == ' ') p++;
    if (*p < '0' || *p > '9') return -EINVAL;
    int v = 0;
    while (*p >= '0' && *p <= '9' && v <= 255) v = v * 10 + (*p++ - '0');
    if (v > 255 || n == KV_CFG_G1_DEVICES_MAX) return -EINVAL;
    for (int i = 0; i < n; i++)
      if (ord[i] == v) return -EINVAL;
    ord[n++] = v;
    while (*p == ' ') p++;
    if (*p == 0) return n;
    if (*p++ != ',') return -EINVAL;
  }
}

static uint64_t share_bytes(const kv_cfg_share *s, uint64_t capacity) {
  if (s->kind == KV_SHARE_BYTES) return s->v;
  return (uint64_t)((unsigned __int128)capacity * s->v / 10000);
}

int kv_config_split(const kv_config *c, int tier, uint64_t capacity,
                    uint64_t out[KV_CFG_TENANTS_MAX], char *err, size_t errlen) {
  uint64_t fixed = 0;
  uint32_t unset = 0;
  for (uint32_t i = 0; i < c->ntenants; i++) {
    const kv_cfg_share *s = tier == 1 ? &c->tenants[i].g2_share : &c->tenants[i].g3_share;
    if (s->kind == KV_SHARE_UNSET) {
      unset++;
      continue;
    }
    out[i] = share_bytes(s, capacity);
    fixed += out[i];
    if (out[i] > capacity || fixed > capacity) {
      snprintf(err, errlen, "the tenants' g%d_share add up to more than the %s (%llu bytes)",
               tier + 1, tier == 1 ? "g2.capacity" : "SSD tier", (unsigned long long)capacity);
      return -EINVAL;
    }
  }
  for (uint32_t i = 0; i < c->ntenants; i++) {
    const kv_cfg_share *s = tier == 1 ? &c->tenants[i].g2_share : &c->tenants[i].g3_share;
    if (s->kind == KV_SHARE_UNSET) out[i] = (capacity - fixed) / unset;
  }
  return 0;
}

static int validate_tenants(const kv_config *c, char *err, size_t errlen) {
  if (c->g2_tenants != 1) {
    snprintf(err, errlen,
             "g2.tenants is no longer used (it bound arenas to whichever tenant names came "
             "first): name each tenant in a [tenant.NAME] section, with the uids or gids that may "
             "act as it (daemon/OPS.md)");
    return -EINVAL;
  }
  uint64_t part[KV_CFG_TENANTS_MAX];
  for (uint32_t i = 0; i < c->ntenants; i++) {
    if (!c->tenants[i].nuids && !c->tenants[i].ngids) {
      snprintf(err, errlen, "tenant.%s: names no uids and no gids: nobody could act as it",
               c->tenants[i].name);
      return -EINVAL;
    }
  }
  if (kv_config_split(c, 1, c->g2_capacity, part, err, errlen)) return -EINVAL;
  for (uint32_t i = 0; i < c->ntenants; i++) {
    if (part[i] < 4096) {
      snprintf(err, errlen, "tenant.%s: its G2 share is %llu bytes, under 4K%s", c->tenants[i].name,
               (unsigned long long)part[i],
               c->tenants[i].g2_share.kind ? "" : " (what the other shares leave, split evenly)");
      return -EINVAL;
    }
  }
  char buf[sizeof c->g3_path];
  const char *dirv[KV_G3_MAX_DIRS];
  int dirs = c->g3_path[0] ? kv_config_g3_dirs(c, buf, dirv, KV_G3_MAX_DIRS) : 0;
  if (dirs <= 0 || !c->ntenants) return 0;
  uint64_t g3cap = c->g3_capacity * (uint64_t)dirs;
  if (kv_config_split(c, 2, g3cap, part, err, errlen)) return -EINVAL;
  for (uint32_t i = 0; i < c->ntenants; i++) {
    if (part[i] < kv_config_g3_slot(c) && c->tenants[i].g3_share.kind == KV_SHARE_UNSET) {
      snprintf(err, errlen,
               "tenant.%s: its G3 share (what the other shares leave, split evenly) is "
               "%llu bytes, less than one G3 slot",
               c->tenants[i].name, (unsigned long long)part[i]);
      return -EINVAL;
    }
  }
  return 0;
}

/* --- checks (config.h: kv_config_check) -------------------------------------- */

typedef struct chk {
  kv_config_report_fn fn;
  void *arg;
  int refused;
} chk;

__attribute__((format(printf, 3, 4))) static void say(chk *k, kv_cfg_level level, const char *fmt,
                                                      ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (level == KV_CFG_REFUSE) k->refused++;
  if (k->fn) k->fn(k->arg, level, msg);
}
#define REFUSE(...) say(k, KV_CFG_REFUSE, __VA_ARGS__)
#define WARN(...)   say(k, KV_CFG_WARN, __VA_ARGS__)

/* "1.5 GiB" */
static const char *hsize(uint64_t v, char *out, size_t cap) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double x = (double)v;
  int u = 0;
  while (x >= 1024 && u < 6) x /= 1024, u++;
  if (u == 0) snprintf(out, cap, "%llu B", (unsigned long long)v);
  else snprintf(out, cap, "%.1f %s", x, unit[u]);
  return out;
}

uint64_t kv_config_g3_slot(const kv_config *c) {
  return c->g3_slot_bytes ? c->g3_slot_bytes : c->g3_block_bytes;
}

int kv_config_g3_dirs(const kv_config *c, char *buf, const char **dirs, unsigned max) {
  memcpy(buf, c->g3_path, sizeof c->g3_path);
  buf[sizeof c->g3_path - 1] = 0;
  unsigned n = 0;
  char *p = buf;
  while (*p) {
    char *comma = strchr(p, ',');
    char *next = comma ? comma + 1 : p + strlen(p);
    if (comma) *comma = 0;
    while (*p == ' ') p++;
    size_t len = strlen(p);
    while (len && p[len - 1] == ' ') p[--len] = 0;
    if (len) {
      if (n == max) return -E2BIG;
      dirs[n++] = p;
    }
    p = next;
  }
  return (int)n;
}

int kv_config_g4_seeds(const kv_config *c, char *buf, const char **seeds, unsigned max) {
  memcpy(buf, c->g4_seeds, sizeof c->g4_seeds);
  buf[sizeof c->g4_seeds - 1] = 0;
  unsigned n = 0;
  if (!buf[0]) return 0;
  for (char *p = buf; p;) { /* every entry, the one after a last comma too */
    char *comma = strchr(p, ',');
    if (comma) *comma = 0;
    while (*p == ' ') p++;
    size_t len = strlen(p);
    while (len && p[len - 1] == ' ') p[--len] = 0;
    if (!len) return -EINVAL;
    if (n == max) return -E2BIG;
    seeds[n++] = p;
    p = comma ? comma + 1 : NULL;
  }
  return (int)n;
}

/* Whether s is "IPv4:port" or "[IPv6]:port" with a port 1..65535. */
static int ip_port_ok(const char *s) {
  const char *colon = strrchr(s, ':');
  char *end = NULL;
  unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
  if (!colon || colon == s || !colon[1] || *end || port == 0 || port > 65535) return 0;
  char host[64];
  size_t hl = (size_t)(colon - s);
  if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') {
    s++;
    hl -= 2;
  }
  if (hl >= sizeof host) return 0;
  memcpy(host, s, hl);
  host[hl] = 0;
  unsigned char addr[16];
  return inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
}

int kv_config_g4_until(const kv_config *c, int64_t *t) {
  const char *s = c->g4_old_key_until;
  if (!s[0]) return -ENOENT;
  struct tm tm = {0}, back;
  const char *end = strptime(s, "%Y-%m-%dT%H:%M:%SZ", &tm);
  if (!end || *end) return -EINVAL;
  back = tm;
  time_t v = timegm(&back); /* normalizes back */
  /* strptime takes 2026-02-31: a time that does not read back is none */
  if (v == (time_t)-1 || back.tm_mday != tm.tm_mday ||
      back.tm_mon != tm.tm_mon || back.tm_year != tm.tm_year || back.tm_hour != tm.tm_hour ||
      back.tm_min != tm.tm_min || back.tm_sec != tm.tm_sec)
    return -EINVAL;
  *t = (int64_t)v;
  return 0;
}

#define KEY_FILE_MAX 1024 /* bytes a key file may have: 128 digits and room for spaces */

/* The secret in key file `path` (option `what`) into *s (config.h). */
static int read_secret(const char *what, const char *path, kv_g4_secret *s, char *err,
                       size_t errlen) {
  static const char make[] = "make one with `head -c 32 /dev/urandom | od -An -v -tx1 | tr -d "
                             "' \\n'` and give every node the same";
  char text[KEY_FILE_MAX + 1];
  uint8_t raw[KV_G4_SECRET_MAX];
  struct stat st;
  int rc = 0;
  size_t n = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    rc = -errno;
    snprintf(err, errlen, "%s: cannot open %s: %s", what, path, strerror(-rc));
    return rc;
  }
  if (fstat(fd, &st)) {
    rc = -errno;
    snprintf(err, errlen, "%s: cannot stat %s: %s", what, path, strerror(-rc));
  } else if (!S_ISREG(st.st_mode)) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: %s is not a regular file", what, path);
  } else if (st.st_uid != geteuid()) {
    rc = -EPERM;
    snprintf(err, errlen,
             "%s: %s is owned by uid %u, not by the user kvcached runs as (uid %u): the "
             "fleet's secret must be that user's alone (chown it)",
             what, path, (unsigned)st.st_uid, (unsigned)geteuid());
  } else if (st.st_mode & 077) {
    rc = -EPERM;
    snprintf(err, errlen,
             "%s: %s has mode %04o: the fleet's secret must not be readable by its group or "
             "others (chmod 600)",
             what, path, (unsigned)(st.st_mode & 07777));
  } else if (st.st_size > KEY_FILE_MAX) {
    rc = -EINVAL;
    snprintf(err, errlen, "%s: %s is %lld bytes: a key file holds 64 to 128 hex digits", what,
             path, (long long)st.st_size);
  }
  while (!rc && n < KEY_FILE_MAX) {
    ssize_t r = read(fd, text + n, KEY_FILE_MAX - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rc = -errno;
      snprintf(err, errlen, "%s: cannot read %s: %s", what, path, strerror(-rc));
    }
    if (r <= 0) break;
    n += (size_t)r;
  }
  close(fd);
  if (!rc) {
    size_t a = 0, b = n;
    while (a < b && isspace((unsigned char)text[a])) a++;
    while (b > a && isspace((unsigned char)text[b - 1])) b--;
    size_t digits = b - a;
    int len = digits >= 2 * KV_G4_SECRET_MIN && digits <= 2 * KV_G4_SECRET_MAX
                  ? kv_hex_decode(text + a, digits, raw, sizeof raw)
                  : -EINVAL;
    if (len < 0) {
      rc = -EINVAL;
      snprintf(err, errlen,
               "%s: %s must hold 64 to 128 hex digits (a secret of 32 to 64 bytes), with only "
               "spaces or newlines around them (it holds %zu characters): %s",
               what, path, digits, make);
    } else {
      rc = kv_g4_secret_init(s, raw, (size_t)len);
      if (rc) snprintf(err, errlen, "%s: %s: %s", what, path, strerror(-rc));
    }
  }
  sodium_memzero(text, sizeof text);
  sodium_memzero(raw, sizeof raw);
  return rc;
}

int kv_config_g4_keys(const kv_config *c, kv_g4_keys *keys, char *err, size_t errlen) {
  memset(keys, 0, sizeof *keys);
  if (!c->g4_key_file[0]) {
    snprintf(err, errlen, "g4.key_file is not set");
    return -ENOENT;
  }
  int rc = read_secret("g4.key_file", c->g4_key_file, &keys->cur, err, errlen);
  if (!rc && c->g4_old_key_file[0]) {
    rc = read_secret("g4.old_key_file", c->g4_old_key_file, &keys->old, err, errlen);
    if (!rc && kv_config_g4_until(c, &keys->old_until)) {
      rc = -EINVAL;
      snprintf(err, errlen, "g4.old_key_until: '%s' is not a UTC time as 2026-12-01T00:00:00Z",
               c->g4_old_key_until);
    }
    if (!rc && keys->old.id == keys->cur.id &&
        (keys->old.len != keys->cur.len ||
         sodium_memcmp(keys->old.b, keys->cur.b, keys->cur.len))) {
      rc = -EINVAL; /* one chance in 2^32: the header's id would not tell them apart */
      snprintf(err, errlen, "g4.old_key_file: its secret has the same id as g4.key_file's: make "
                            "another new secret");
    }
  }
  if (rc) sodium_memzero(keys, sizeof *keys);
  return rc;
}

/* The [g4] checks. */
static void check_g4(const kv_config *c, chk *k) {
  if (!kv_g4_prefix_ok(c->g4_prefix))
    REFUSE("g4.prefix: '%s' must be at most %d printable bytes with no space and no braces "
           "(a brace would make a hash tag: tiers/G4.md)",
           c->g4_prefix, KV_G4_PREFIX_MAX);
  if (!c->g4_seeds[0]) return;
  char buf[sizeof c->g4_seeds];
  const char *seeds[KV_G4C_SEEDS_MAX];
  int n = kv_config_g4_seeds(c, buf, seeds, KV_G4C_SEEDS_MAX);
  if (n == -E2BIG) REFUSE("g4.seeds names more than %d nodes", KV_G4C_SEEDS_MAX);
  else if (n <= 0) REFUSE("g4.seeds: '%s' has an empty entry (leave it empty for no G4)", c->g4_seeds);
  for (int i = 0; i < n; i++)
    if (!ip_port_ok(seeds[i]))
      REFUSE("g4.seeds: '%s' is not ip:port (an IPv4 or [IPv6] address: host names are not "
             "resolved)",
             seeds[i]);
  if (c->g4_user[0] && !c->g4_password[0]) REFUSE("g4.user needs g4.password");
  if (c->g4_ttl_s == 0) REFUSE("g4.ttl_s must be at least 1 (every G4 value expires)");
  if (c->g4_timeout_ms == 0 || c->g4_timeout_ms > 60000)
    REFUSE("g4.timeout_ms: %u is not 1..60000", c->g4_timeout_ms);
  if (c->g4_lookup_blocks == 0 || c->g4_lookup_blocks > KV_CFG_G4_LOOKUP_MAX)
    REFUSE("g4.lookup_blocks: %u is not 1..%d", c->g4_lookup_blocks, KV_CFG_G4_LOOKUP_MAX);
  if (c->g4_backlog_blocks > KV_CFG_G4_BACKLOG_MAX)
    REFUSE("g4.backlog_blocks: %u is not 0..%u", c->g4_backlog_blocks, KV_CFG_G4_BACKLOG_MAX);
  if (c->g4_absent_ms > 60000) REFUSE("g4.absent_ms: %u is not 0..60000", c->g4_absent_ms);
  if (c->g4_map_refresh_ms < 100 || c->g4_map_refresh_ms > 3600000)
    REFUSE("g4.map_refresh_ms: %u is not 100..3600000", c->g4_map_refresh_ms);
  /* Values are authenticated with the fleet's secret (tiers/G4.md): without
   * one, anything that reaches the cluster could write blocks readers take. */
  if (!c->g4_key_file[0])
    REFUSE("g4.key_file is required with g4.seeds: a file holding the fleet's secret (64 hex "
           "digits, the same on every node), which signs and verifies every G4 value (README, "
           "\"The shared tier\")");
  int64_t until = 0;
  int urc = kv_config_g4_until(c, &until);
  if (urc == -EINVAL)
    REFUSE("g4.old_key_until: '%s' is not a UTC time as 2026-12-01T00:00:00Z",
           c->g4_old_key_until);
  if (c->g4_old_key_file[0] && urc == -ENOENT)
    REFUSE("g4.old_key_file needs g4.old_key_until: the end of the rotation window, after which "
           "values signed by the old secret are refused");
  else if (!c->g4_old_key_file[0] && urc == 0)
    WARN("g4.old_key_until is set without g4.old_key_file: nothing to accept until then");
  else if (c->g4_old_key_file[0] && urc == 0 && until <= (int64_t)time(NULL))
    WARN("g4.old_key_until: %s has passed: values signed by g4.old_key_file are refused "
         "(remove both)",
         c->g4_old_key_until);
  if (!c->g4_password[0])
    WARN("g4: no g4.password (nor g4.user): any process that reaches the Redis Cluster can read "
         "G4 values and delete them (forged ones are refused: g4.key_file); give kvcached an "
         "ACL user with a password (README, \"The shared tier\")");
}

/* The key files of [g4], against this machine (they are read). */
static void check_g4_keys(const kv_config *c, chk *k) {
  int64_t until;
  if (!c->g4_seeds[0] || !c->g4_key_file[0] ||
      (c->g4_old_key_file[0] && kv_config_g4_until(c, &until)))
    return; /* off, or refused alone */
  kv_g4_keys keys;
  char err[512];
  if (kv_config_g4_keys(c, &keys, err, sizeof err)) REFUSE("%s", err);
  sodium_memzero(&keys, sizeof keys);
}

int kv_config_admin_gid(const kv_config *c, gid_t *gid) {
  struct group gr, *gp = NULL;
  size_t cap = 16384;
  for (;;) {
    char *buf = malloc(cap);
    if (!buf) return -ENOMEM;
    int e = getgrnam_r(c->admin_group, &gr, buf, cap, &gp);
    if (e == 0 && gp) *gid = gp->gr_gid;
    free(buf);
    if (e == ERANGE && cap < (1u << 22)) {
      cap *= 4;
      continue;
    }
    if (e) return -e;
    return gp ? 0 : -ENOENT;
  }
}

/* The checks on the configuration alone. */
static void check_alone(const kv_config *c, chk *k) {
  if (!c->socket_dir[0]) {
    REFUSE("daemon.socket_dir must not be empty");
  } else {
    /* Every socket the daemon makes there, and its ".lock", must fit sun_path. */
    static const char *const names[] = {KV_SOCKET_NAME, KV_STATS_SOCKET_NAME, KV_ADMIN_SOCKET_NAME};
    size_t longest = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
      if (strlen(names[i]) > longest) longest = strlen(names[i]);
    size_t most = KV_SOCK_PATH_MAX - 1 - 1 - longest;
    if (strlen(c->socket_dir) > most)
      REFUSE("daemon.socket_dir: '%s' is %zu bytes; at most %zu fit (its sockets' paths must "
             "fit a Unix socket address)",
             c->socket_dir, strlen(c->socket_dir), most);
  }
  if (c->g2_capacity < 4096) REFUSE("g2.capacity must be at least 4K");
  else if (c->g2_tenants == 0 || c->g2_capacity / c->g2_tenants < 4096)
    REFUSE("g2.tenants must be at least 1, with 4K of g2.capacity each");
  if (c->g2_page_size == 0 || c->g2_page_size % 4096)
    REFUSE("g2.page_size must be a non-zero multiple of 4K");
  int ord[KV_CFG_G1_DEVICES_MAX];
  if (kv_config_g1_devices(c, ord) < 0)
    REFUSE("g1.device: '%s' is not a list of 1 to %d distinct device ordinals "
           "(0..255, comma-separated)",
           c->g1_device, KV_CFG_G1_DEVICES_MAX);
  if (c->g1_enable != KV_CFG_G1_OFF && c->g1_capacity == 0)
    REFUSE("g1.capacity must be more than 0 unless g1.enable = off");
  if (c->g3_min_prio > 255) REFUSE("g3.min_prio must be 0..255");
  if (c->g3_path[0]) {
    char buf[sizeof c->g3_path];
    const char *dirs[KV_G3_MAX_DIRS];
    int n = kv_config_g3_dirs(c, buf, dirs, KV_G3_MAX_DIRS);
    if (n == -E2BIG) REFUSE("g3.path names more than %d directories", KV_G3_MAX_DIRS);
    else if (n == 0)
      REFUSE("g3.path: '%s' names no directory (leave it empty for no G3)", c->g3_path);
    for (int i = 0; i < n; i++)
      for (int j = 0; j < i; j++)
        if (!strcmp(dirs[i], dirs[j])) REFUSE("g3.path names %s twice", dirs[i]);
    char a[32], b[32];
    if (c->g3_capacity < (2u << 20)) REFUSE("g3.capacity must be at least 2M");
    if (c->g3_queue_depth < 1 || c->g3_queue_depth > KV_G3_QUEUE_DEPTH_MAX)
      REFUSE("g3.queue_depth: %u is not 1..%d", c->g3_queue_depth, KV_G3_QUEUE_DEPTH_MAX);
    if (c->g3_codec_threads < 1 || c->g3_codec_threads > KV_G3_CODEC_THREADS_MAX)
      REFUSE("g3.codec_threads: %u is not 1..%d", c->g3_codec_threads, KV_G3_CODEC_THREADS_MAX);
    int lrc = kv_g3_layout_of(c->g3_capacity, kv_config_g3_slot(c), NULL, NULL);
    if (c->g3_block_bytes == 0) REFUSE("g3.block_bytes must be more than 0");
    else if (c->g3_slot_bytes > c->g3_block_bytes)
      REFUSE("g3.slot_bytes (%llu) is larger than g3.block_bytes (%llu)",
             (unsigned long long)c->g3_slot_bytes, (unsigned long long)c->g3_block_bytes);
    else if (c->g3_block_bytes > c->g3_capacity)
      REFUSE("g3.block_bytes (%llu) is larger than g3.capacity (%llu)",
             (unsigned long long)c->g3_block_bytes, (unsigned long long)c->g3_capacity);
    else if (lrc == -EINVAL)
      REFUSE("g3.block_bytes: %llu is too large for an SSD slot",
             (unsigned long long)c->g3_block_bytes);
    else if (lrc == -ENOSPC && c->g3_capacity >= (2u << 20))
      REFUSE("g3.capacity (%s) holds no slot of %s (%s): a G3 file needs 1 MiB, "
             "then 4 KiB plus the slot rounded up to 4 KiB per slot",
             hsize(c->g3_capacity, a, sizeof a),
             c->g3_slot_bytes ? "g3.slot_bytes" : "g3.block_bytes",
             hsize(kv_config_g3_slot(c), b, sizeof b));
  }
  if (!kv_evict_lookup(c->policy)) {
    char known[256];
    size_t n = 0;
    known[0] = 0;
    for (int i = 0; kv_evict_policies[i] && n < sizeof known; i++) {
      int w = snprintf(known + n, sizeof known - n, " %s", kv_evict_policies[i]->name);
      if (w < 0) break;
      n += (size_t)w;
    }
    REFUSE("cache.policy: unknown policy '%s' (known:%s)", c->policy, known);
  }
  if (c->load_timeout_ms == 0) REFUSE("daemon.load_timeout_ms must be at least 1");
  if (c->stats_listen[0]) {
    const char *colon = strrchr(c->stats_listen, ':');
    char *end = NULL;
    unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
    if (!colon || colon == c->stats_listen || !colon[1] || *end || port == 0 || port > 65535) {
      REFUSE("stats.listen: '%s' is not host:port", c->stats_listen);
    } else {
      /* The host is an address literal (IPv6 in brackets): nothing to resolve. */
      char host[64];
      size_t hl = (size_t)(colon - c->stats_listen);
      const char *h = c->stats_listen;
      if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
      }
      unsigned char addr[16];
      int ok = hl < sizeof host;
      if (ok) {
        memcpy(host, h, hl);
        host[hl] = 0;
        ok = inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;
      }
      if (!ok)
        REFUSE("stats.listen: '%.*s' is not an IPv4 or [IPv6] address",
               (int)(colon - c->stats_listen), c->stats_listen);
    }
  }
  if (c->limits_out_bytes && c->limits_out_bytes < (1u << 20))
    REFUSE("limits.out_bytes: %llu bytes is under 1M (0 chooses a share of the memory)",
           (unsigned long long)c->limits_out_bytes);
  if (c->limit_session_share == 0 || c->limit_session_share > 100)
    REFUSE("limits.session_share: %u is not a percentage from 1 to 100",
           (unsigned)c->limit_session_share);
  if (c->limit_pins_per_session == 0 || c->limit_allocs_per_session == 0 ||
      c->limit_namespaces_per_tenant == 0)
    REFUSE("limits.pins_per_session, limits.allocs_per_session and "
           "limits.namespaces_per_tenant must be at least 1");
  if (c->limits_connections == 0 || c->limits_connections_per_uid == 0)
    REFUSE("limits.connections and limits.connections_per_uid must be at least 1");
  if (c->stats_connections == 0 || c->stats_tcp_connections == 0 || c->admin_connections == 0 ||
      c->stats_request_timeout_ms == 0)
    REFUSE("stats.connections, stats.tcp_connections, stats.request_timeout_ms and "
           "admin.connections must be at least 1");
  char terr[256];
  if (validate_tenants(c, terr, sizeof terr)) REFUSE("%s", terr);
  check_g4(c, k);
}

/* A /proc/meminfo field in bytes; 0 if unknown. */
static uint64_t meminfo(const char *field) {
  FILE *f = fopen("/proc/meminfo", "re");
  if (!f) return 0;
  char line[128];
  uint64_t v = 0;
  size_t fl = strlen(field);
  while (fgets(line, sizeof line, f)) {
    unsigned long long kb;
    if (!strncmp(line, field, fl) && line[fl] == ':' && sscanf(line + fl + 1, "%llu", &kb) == 1) {
      v = kb > UINT64_MAX / 1024 ? UINT64_MAX : (uint64_t)kb * 1024;
      break;
    }
  }
  fclose(f);
  return v;
}

/* 1 if this process may lock memory beyond RLIMIT_MEMLOCK (CAP_IPC_LOCK). */
static int can_lock_any(void) {
  FILE *f = fopen("/proc/self/status", "re");
  if (!f) return 0;
  char line[128];
  unsigned long long caps = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "CapEff: %llx", &caps) == 1) break;
  fclose(f);
  return (caps >> 14) & 1; /* CAP_IPC_LOCK */
}

/* One filesystem holding G3 files, and what they need of it. */
typedef struct g3_fs {
  dev_t dev;
  const char *first; /* its first directory in g3.path */
  unsigned ndirs;
  uint64_t need, free, size;
} g3_fs;

static void check_g3_space(const kv_config *c, chk *k) {
  char buf[sizeof c->g3_path], a[32], b[32], e[32];
  const char *dirs[KV_G3_MAX_DIRS];
  int n = kv_config_g3_dirs(c, buf, dirs, KV_G3_MAX_DIRS);
  uint64_t file_bytes;
  if (n <= 0 || kv_g3_layout_of(c->g3_capacity, kv_config_g3_slot(c), NULL, &file_bytes)) return;
  g3_fs fs[KV_G3_MAX_DIRS];
  struct stat seen[KV_G3_MAX_DIRS];
  const char *seen_name[KV_G3_MAX_DIRS];
  unsigned nfs = 0, nseen = 0;
  for (int i = 0; i < n; i++) {
    const char *dir = dirs[i], *where = dir;
    char parent[sizeof c->g3_path];
    struct stat st;
    if (stat(dir, &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        WARN("g3.path: %s is not a directory: kvcached would run on G2 alone", dir);
        continue;
      }
      for (unsigned j = 0; j < nseen; j++)
        if (seen[j].st_dev == st.st_dev && seen[j].st_ino == st.st_ino)
          WARN("g3.path: %s and %s are the same directory", seen_name[j], dir);
      seen_name[nseen] = dir;
      seen[nseen++] = st;
    } else if (errno == ENOENT) {
      /* kvcached creates the last directory only. */
      snprintf(parent, sizeof parent, "%s", dir);
      char *slash = strrchr(parent, '/');
      while (slash && slash > parent && slash[1] == 0) {
        *slash = 0;
        slash = strrchr(parent, '/');
      }
      if (!slash) snprintf(parent, sizeof parent, ".");
      else if (slash == parent) parent[1] = 0;
      else *slash = 0;
      if (stat(parent, &st) || !S_ISDIR(st.st_mode)) {
        WARN("g3.path: %s does not exist, nor does its parent %s (kvcached creates only the "
             "last directory): kvcached would run on G2 alone",
             dir, parent);
        continue;
      }
      where = parent;
    } else {
      WARN("g3.path: %s: %s", dir, strerror(errno));
      continue;
    }
    struct statvfs vfs;
    if (statvfs(where, &vfs)) {
      WARN("g3.path: cannot tell the free space of %s: %s", where, strerror(errno));
      continue;
    }
    /* A store file already there is reused or formatted again in place. */
    uint64_t have = 0;
    char file[sizeof c->g3_path + 32];
    struct stat fst;
    snprintf(file, sizeof file, "%s/kvg3-%d.dat", dir, i);
    if (where == dir && stat(file, &fst) == 0 && S_ISREG(fst.st_mode))
      have = (uint64_t)fst.st_blocks * 512;
    unsigned f = 0;
    while (f < nfs && fs[f].dev != st.st_dev) f++;
    if (f == nfs) {
      fs[nfs++] =
          (g3_fs){.dev = st.st_dev,
                  .first = dir,
                  .free = (uint64_t)(geteuid() == 0 ? vfs.f_bfree : vfs.f_bavail) * vfs.f_frsize,
                  .size = (uint64_t)vfs.f_blocks * vfs.f_frsize};
    }
    fs[f].ndirs++;
    fs[f].need += file_bytes > have ? file_bytes - have : 0;
  }
  for (unsigned f = 0; f < nfs; f++) {
    if (fs[f].need <= fs[f].free) continue;
    char more[64] = "";
    if (fs[f].ndirs > 1)
      snprintf(more, sizeof more, " and %u more director%s on its filesystem", fs[f].ndirs - 1,
               fs[f].ndirs > 2 ? "ies" : "y");
    WARN("g3.capacity: the G3 file%s in %s%s need%s %s, but the filesystem has %s free "
         "(of %s): preallocation would fail, so kvcached would run on G2 alone, retrying "
         "every g3.retry_ms",
         fs[f].ndirs > 1 ? "s" : "", fs[f].first, more, fs[f].ndirs > 1 ? "" : "s",
         hsize(fs[f].need, a, sizeof a), hsize(fs[f].free, b, sizeof b),
         hsize(fs[f].size, e, sizeof e));
  }
}

/* The checks against this machine. */
static void check_machine(const kv_config *c, chk *k) {
  char a[32], b[32];
  if (c->admin_group[0]) {
    gid_t gid;
    int rc = kv_config_admin_gid(c, &gid);
    if (rc == -ENOENT) REFUSE("admin.group: no group named '%s'", c->admin_group);
    else if (rc) REFUSE("admin.group: cannot look up '%s': %s", c->admin_group, strerror(-rc));
  }
  uint64_t total = meminfo("MemTotal"), avail = meminfo("MemAvailable");
  if (total && c->g2_capacity > total / 10 * 9)
    REFUSE("g2.capacity: %s is more than 90%% of this machine's memory (MemTotal %s)",
           hsize(c->g2_capacity, a, sizeof a), hsize(total, b, sizeof b));
  else if (avail && c->g2_capacity > avail)
    WARN("g2.capacity: %s is more than the memory available now (MemAvailable %s): "
         "the system may swap or run out of memory as G2 fills",
         hsize(c->g2_capacity, a, sizeof a), hsize(avail, b, sizeof b));
  struct rlimit rl;
  if (c->g2_lock && getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      c->g2_capacity > rl.rlim_cur && !can_lock_any())
    WARN("g2.lock: RLIMIT_MEMLOCK is %s, below g2.capacity (%s): G2 will run unlocked "
         "(raise LimitMEMLOCK= in systemd, or set g2.lock = no)",
         hsize((uint64_t)rl.rlim_cur, a, sizeof a), hsize(c->g2_capacity, b, sizeof b));
  if (c->g3_path[0]) check_g3_space(c, k);
  check_g4_keys(c, k);
}

int kv_config_check(const kv_config *c, unsigned flags, kv_config_report_fn fn, void *arg) {
  chk k = {fn, arg, 0};
  check_alone(c, &k);
  if (flags & KV_CFG_CHECK_MACHINE) check_machine(c, &k);
  return k.refused ? -EINVAL : 0;
}

typedef struct first_err {
  char *err;
  size_t len;
  int have;
} first_err;
static void keep_first(void *arg, kv_cfg_level level, const char *msg) {
  first_err *f = arg;
  if (level != KV_CFG_REFUSE || f->have) return;
  snprintf(f->err, f->len, "%s", msg);
  f->have = 1;
}

int kv_config_validate(const kv_config *c, char *err, size_t errlen) {
  first_err f = {err, errlen, 0};
  return kv_config_check(c, 0, keep_first, &f);
}
#undef REFUSE
#undef WARN

/* A tenant's key as text (uids, gids, g2_share, g3_share, cold_precision:
 * k = 0..4). */
static void tenant_value(const kv_cfg_tenant *t, int k, char *v, size_t len) {
  v[0] = 0;
  if (k == 4) {
    const char *n = kv_quant_name((kv_quant_kind)t->cold_precision);
    snprintf(v, len, "%s", n ? n : "exact");
    return;
  }
  if (k < 2) {
    const uint32_t *ids = k ? t->gids : t->uids;
    uint32_t n = k ? t->ngids : t->nuids;
    size_t at = 0;
    for (uint32_t i = 0; i < n && at < len; i++)
      at += (size_t)snprintf(v + at, len - at, "%s%u", i ? "," : "", ids[i]);
    return;
  }
  const kv_cfg_share *s = k == 2 ? &t->g2_share : &t->g3_share;
  if (s->kind == KV_SHARE_BYTES) snprintf(v, len, "%llu", (unsigned long long)s->v);
  else if (s->kind == KV_SHARE_PCT)
    snprintf(v, len, "%llu.%02llu%%", (unsigned long long)(s->v / 100),
             (unsigned long long)(s->v % 100));
}

static const char *const tenant_keys[] = {"uids", "gids", "g2_share", "g3_share",
                                          "cold_precision"};
#define TENANT_KEYS ((int)(sizeof tenant_keys / sizeof tenant_keys[0]))

/* An enum option's current value as its name. */
static const char *value_name(const opt *o, const void *p) {
  const char *n = enum_name(o, *(const int *)p);
  return n ? n : "?";
}

const char *kv_config_enum_name(const char *dotted, int value) {
  for (size_t i = 0; i < NOPTS; i++) {
    const opt *o = &opts[i];
    size_t sl = strlen(o->section);
    if (o->type == OPT_ENUM && !strncmp(dotted, o->section, sl) && dotted[sl] == '.' &&
        !strcmp(dotted + sl + 1, o->name))
      return enum_name(o, value);
  }
  return NULL;
}

int kv_config_getopt(struct option *out, size_t max, int base) {
  static char dotted[NOPTS][64];
  size_t n = 0;
  for (size_t i = 0; i < NOPTS; i++) {
    snprintf(dotted[i], sizeof dotted[i], "%s.%s", opts[i].section, opts[i].name);
    const char *spelling[2] = {dotted[i], opts[i].flag};
    for (int k = 0; k < 2 && spelling[k]; k++) {
      if (n + 1 >= max) return -ENOSPC;
      out[n++] = (struct option){spelling[k], required_argument, NULL, base + (int)i};
    }
  }
  out[n] = (struct option){NULL, 0, NULL, 0};
  return (int)n;
}

int kv_config_set_index(kv_config *c, int index, const char *value, char *err, size_t errlen) {
  if (index < 0 || (size_t)index >= NOPTS) {
    snprintf(err, errlen, "no option number %d", index);
    return -ENOENT;
  }
  return set_opt(c, &opts[index], value, err, errlen);
}

void kv_config_usage(FILE *f) {
  static const char *const what[] = {
      [OPT_SIZE] = "SIZE", [OPT_BOOL] = "yes|no", [OPT_STR] = "TEXT", [OPT_U32] = "N"};
  fprintf(f, "options, as flags or in the configuration file ([SECTION] NAME = VALUE):\n");
  for (size_t i = 0; i < NOPTS; i++) {
    const opt *o = &opts[i];
    char list[128];
    if (o->type == OPT_ENUM) enum_list(o, "|", list, sizeof list);
    else snprintf(list, sizeof list, "%s", what[o->type]);
    fprintf(f, "  --%s.%s=%s", o->section, o->name, list);
    if (o->flag) fprintf(f, ", --%s", o->flag);
    const char *def = o->def ? o->def : kv_evict_default;
    fprintf(f, "\n      %s (default: %s)\n", o->doc, *def ? def : "''");
  }
}

/* A text option's value as shown: a secret (g4.password) is never shown. */
static const char *str_value(const opt *o, const void *p) {
  if (o->off == offsetof(kv_config, g4_password) && *(const char *)p) return "(set)";
  return p;
}

void kv_config_print(const kv_config *c, FILE *f) {
  const char *sect = "";
  for (size_t i = 0; i < NOPTS; i++) {
    const opt *o = &opts[i];
    if (strcmp(sect, o->section)) fprintf(f, "%s[%s]\n", i ? "\n" : "", sect = o->section);
    const void *p = (const char *)c + o->off;
    fprintf(f, "# %s (default: %s)\n%s = ", o->doc, o->def ? o->def : kv_evict_default, o->name);
    switch (o->type) {
    case OPT_SIZE: fprintf(f, "%llu\n", (unsigned long long)*(const uint64_t *)p); break;
    case OPT_BOOL: fprintf(f, "%s\n", *(const int *)p ? "yes" : "no"); break;
    case OPT_U32: fprintf(f, "%u\n", *(const uint32_t *)p); break;
    case OPT_STR: fprintf(f, "%s\n", str_value(o, p)); break;
    case OPT_ENUM: fprintf(f, "%s\n", value_name(o, p)); break;
    }
  }
  for (uint32_t i = 0; i < c->ntenants; i++) {
    fprintf(f, "\n[tenant.%s]\n", c->tenants[i].name);
    for (int k = 0; k < TENANT_KEYS; k++) {
      char v[256];
      tenant_value(&c->tenants[i], k, v, sizeof v);
      fprintf(f, "%s = %s\n", tenant_keys[k], v);
    }
  }
}

void kv_config_foreach(const kv_config *c, kv_config_fn fn, void *arg) {
  for (size_t i = 0; i < NOPTS; i++) {
    const opt *o = &opts[i];
    const void *p = (const char *)c + o->off;
    char v[32];
    const char *val = v;
    switch (o->type) {
    case OPT_SIZE: snprintf(v, sizeof v, "%llu", (unsigned long long)*(const uint64_t *)p); break;
    case OPT_BOOL: val = *(const int *)p ? "yes" : "no"; break;
    case OPT_U32: snprintf(v, sizeof v, "%u", *(const uint32_t *)p); break;
    case OPT_STR: val = str_value(o, p); break;
    case OPT_ENUM: val = value_name(o, p); break;
    }
    fn(arg, o->section, o->name, val);
  }
  for (uint32_t i = 0; i < c->ntenants; i++) {
    char sect[KV_CFG_TENANT_NAME_MAX + 8], v[256];
    snprintf(sect, sizeof sect, "tenant.%s", c->tenants[i].name);
    for (int k = 0; k < TENANT_KEYS; k++) {
      tenant_value(&c->tenants[i], k, v, sizeof v);
      fn(arg, sect, tenant_keys[k], v);
    }
  }
}
