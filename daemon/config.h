/*
 * config.h - kvcached's configuration: one table of options, read from an
 * INI file and overridden by command-line flags.
 *
 * Every option is declared once, in config.c's table, with its section,
 * name, type, default and one line of documentation; the file parser, the
 * command-line flags (--SECTION.NAME=VALUE, generated from the table),
 * `kvcached --help` and `--print-config`, and the tests all read that table.
 * An option with a closed set of values is an enum: its names are listed
 * once, in the table, and are parsed into the field's C enum when the
 * option is read (a name outside the list is an error that lists them).
 * deploy/kvcached.conf is the commented default file (a test checks that it
 * names every option and parses to the defaults).
 */
#ifndef KV_DAEMON_CONFIG_H
#define KV_DAEMON_CONFIG_H

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "base/log.h"
#include "base/size.h"
#include "cuda/dev.h"
#include "tiers/core.h"
#include "tiers/g3.h"
#include "tiers/g4_format.h"

/*
 * Tenants (daemon/OPS.md, "Tenants and credentials"): INI sections
 * [tenant.NAME] (or flags --set tenant.NAME.KEY=VALUE) with keys
 *   uids      users that may act as NAME: uids or user names, comma-separated
 *   gids      groups whose members may: gids or group names
 *   g2_share  its part of g2.capacity: a percentage ("25%", "12.5%") or a size
 *   g3_share  its part of the SSD tier, the same way
 * Names are resolved when the option is read (an unknown user or group is
 * an error). A tenant that names nobody, shares over 100% of a tier, or
 * room too small for a tenant without a share are errors of
 * kv_config_validate(). No section: one tenant that every peer able to
 * reach the worker socket acts as (ntenants == 0).
 */
#define KV_CFG_TENANTS_MAX     32 /* [tenant.NAME] sections */
#define KV_CFG_TENANT_IDS_MAX  16 /* uids, and gids, of one tenant */
#define KV_CFG_TENANT_NAME_MAX 64

enum { KV_SHARE_UNSET = 0, KV_SHARE_PCT, KV_SHARE_BYTES };
typedef struct kv_cfg_share {
  uint8_t kind; /* KV_SHARE_* */
  uint64_t v;   /* KV_SHARE_PCT: hundredths of a percent (10000 = all); bytes */
} kv_cfg_share;

typedef struct kv_cfg_tenant {
  char name[KV_CFG_TENANT_NAME_MAX + 1];
  uint32_t uids[KV_CFG_TENANT_IDS_MAX], gids[KV_CFG_TENANT_IDS_MAX];
  uint32_t nuids, ngids;
  kv_cfg_share g2_share, g3_share;
  uint8_t cold_precision; /* 0: exact; KV_QUANT_FP8, KV_QUANT_INT8 (tiers/quant.h): its
                             16-bit namespaces' blocks in G4 */
} kv_cfg_tenant;

/* g1.enable */
typedef enum { KV_CFG_G1_AUTO = 0, KV_CFG_G1_ON, KV_CFG_G1_OFF } kv_cfg_g1_enable;
/* g4.codec: G4 values of 16-bit namespaces coded (tiers/codec.h), or not */
typedef enum { KV_G4_CODEC_OFF = 0, KV_G4_CODEC_AUTO } kv_cfg_g4_codec;
/* g3.codec: G3 blocks of 16-bit namespaces coded (tiers/codec.h), or not */
typedef enum { KV_G3_CODEC_OFF = 0, KV_G3_CODEC_AUTO } kv_cfg_g3_codec;

typedef struct kv_config {
  char socket_dir[96];         /* [daemon] socket_dir */
  uint64_t g2_capacity;        /* [g2] capacity */
  uint64_t g2_page_size;       /* [g2] page_size */
  int g2_lock;                 /* [g2] lock */
  uint32_t g2_tenants;         /* [g2] tenants */
  char g3_path[256];           /* [g3] path: directories, comma-separated; "" = no G3 */
  uint64_t g3_capacity;        /* [g3] capacity, per directory */
  uint64_t g3_block_bytes;     /* [g3] block_bytes: the largest block G3 takes */
  uint64_t g3_slot_bytes;      /* [g3] slot_bytes: the SSD slot size; 0: block_bytes */
  int g3_codec;                /* [g3] codec: KV_G3_CODEC_OFF, _AUTO */
  uint32_t g3_codec_threads;   /* [g3] codec_threads: G3's coder threads */
  uint32_t g3_queue_depth;     /* [g3] queue_depth */
  kv_g3_backend g3_backend;    /* [g3] backend: auto, uring, threads */
  kv_admit g3_admit;           /* [g3] admit: always, second-use, min-prio */
  uint32_t g3_min_prio;        /* [g3] min_prio */
  uint32_t g3_retry_ms;        /* [g3] retry_ms: probe a full G3, reopen an unavailable one */
  char policy[32];             /* [cache] policy */
  uint32_t retain_max_s;       /* [cache] retain_max_s: hint retention granted at most */
  uint32_t hint_sessions;      /* [cache] hint_sessions: sessions remembered at most */
  kv_log_level log_level;      /* [log] level: debug, info, warn (or warning), error */
  uint32_t load_timeout_ms;    /* [daemon] load_timeout_ms */
  char stats_listen[64];       /* [stats] listen: host:port for the TCP stats listener; "" = off */
  uint32_t limits_connections; /* [limits] connections: worker connections at once */
  uint32_t limits_connections_per_uid; /* [limits] connections_per_uid */
  uint32_t limits_hello_timeout_ms;    /* [limits] hello_timeout_ms: 0 = none */
  uint64_t limits_out_bytes;           /* [limits] out_bytes: 0 = a share of memory */
  uint32_t stats_connections;          /* [stats] connections: on the Unix stats socket */
  uint32_t stats_tcp_connections;      /* [stats] tcp_connections: on stats.listen */
  uint32_t stats_request_timeout_ms;   /* [stats] request_timeout_ms: every HTTP socket */
  uint32_t admin_connections;          /* [admin] connections */
  char admin_group[64];            /* [admin] group: members may use the admin socket; "" = none */
  kv_cfg_g1_enable g1_enable;      /* [g1] enable: auto, on, off */
  uint64_t g1_capacity;            /* [g1] capacity: bytes of the device pool */
  kv_dev_backend g1_backend;       /* [g1] backend: auto, cuda, sim (auto is CUDA) */
  char g1_device[64];              /* [g1] device: CUDA ordinals, comma-separated: a pool on each */
  uint32_t limit_pins_per_session; /* [limits] pins_per_session */
  uint32_t limit_allocs_per_session;    /* [limits] allocs_per_session */
  uint32_t limit_session_share;         /* [limits] session_share (percent) */
  uint32_t limit_namespaces_per_tenant; /* [limits] namespaces_per_tenant */
  char g4_seeds[512];                   /* [g4] seeds: ip:port, comma-separated; "" = no G4 */
  char g4_user[64];                     /* [g4] user: ACL user ("" = AUTH with password only) */
  char g4_password[128];                /* [g4] password ("" = no AUTH) */
  char g4_prefix[KV_G4_PREFIX_MAX + 1]; /* [g4] prefix of every Redis key name */
  uint32_t g4_ttl_s;                    /* [g4] ttl_s: EX of every SET */
  uint32_t g4_timeout_ms;               /* [g4] timeout_ms: per Redis command */
  int g4_replica_reads;                 /* [g4] replica_reads */
  uint32_t g4_lookup_blocks;            /* [g4] lookup_blocks: keys asked per LOOKUP at most */
  uint32_t g4_backlog_blocks;           /* [g4] backlog_blocks: owed writes kept at most */
  uint32_t g4_absent_ms;                /* [g4] absent_ms: a key G4 lacked is not asked again */
  uint32_t g4_map_refresh_ms;           /* [g4] map_refresh_ms: slot map re-read while healthy */
  kv_admit g4_admit;                    /* [g4] admit: always, second-use */
  int g4_codec;                         /* [g4] codec: KV_G4_CODEC_OFF, _AUTO */
  char g4_key_file[256];                /* [g4] key_file: the fleet's secret (kv_config_g4_keys) */
  char g4_old_key_file[256];            /* [g4] old_key_file: the previous one, while rotating */
  char g4_old_key_until[32];            /* [g4] old_key_until: YYYY-MM-DDTHH:MM:SSZ */
  uint32_t ntenants;                    /* [tenant.NAME] sections, in their order */
  kv_cfg_tenant tenants[KV_CFG_TENANTS_MAX];
} kv_config;

#define KV_CFG_G1_DEVICES_MAX 8 /* devices in g1.device */
#define KV_CFG_G4_LOOKUP_MAX  1024 /* g4.lookup_blocks at most */
#define KV_CFG_G4_BACKLOG_MAX (1u << 20) /* g4.backlog_blocks at most (72 MiB) */

/* The seeds of g4.seeds, in its order, each "ip:port" without its
 * surrounding spaces, pointing into buf (at least sizeof g4_seeds). Returns
 * how many, or -E2BIG (more than max) / -EINVAL (an empty entry). */
int kv_config_g4_seeds(const kv_config *c, char *buf, const char **seeds, unsigned max);

/*
 * The secrets that authenticate G4 values (tiers/g4_format.h), into *keys:
 * g4.key_file (cur) and, when set, g4.old_key_file (old, accepted until
 * g4.old_key_until). A key file holds 64 to 128 hex digits (a secret of 32
 * to 64 bytes; spaces and newlines around them are ignored), and must be a
 * regular file (a symbolic link to one is followed) owned by this
 * process's effective uid with no group or other permission bits (0600,
 * 0400): it is the fleet's secret. Reads the files (blocking: at start and
 * in checks only). 0, or -EINVAL / -errno with a message naming the option
 * and the file in err (*keys then holds no secret). No key file set:
 * -ENOENT. The caller wipes *keys (sodium_memzero) when done with it.
 */
int kv_config_g4_keys(const kv_config *c, kv_g4_keys *keys, char *err, size_t errlen);

/* g4.old_key_until as Unix seconds into *t: 0, or -EINVAL when it is not
 * YYYY-MM-DDTHH:MM:SSZ (UTC) naming a real time. Empty: -ENOENT. */
int kv_config_g4_until(const kv_config *c, int64_t *t);

/* Fills *c with the defaults. */
void kv_config_defaults(kv_config *c);

/* Reads an INI file over *c. On error returns -errno (cannot read) or
 * -EINVAL, with a message naming the file, line and option in err. */
int kv_config_load(kv_config *c, const char *path, char *err, size_t errlen);

/* Sets one option by "section.name" (as flags do) from its text value.
 * 0, or -ENOENT (no such option) / -EINVAL (bad value), message in err. */
int kv_config_set(kv_config *c, const char *dotted, const char *value, char *err, size_t errlen);

/*
 * The checks kvcached makes on a configuration before it serves, in one
 * place, so that the daemon and `kvctl check-config` never disagree.
 *
 * On its own (flags 0), the configuration is checked for ranges, the
 * eviction policy's name and values that depend on each other (closed
 * sets are enums, refused when read): what the daemon would
 * refuse, or fail on after building part of its state (g3.queue_depth,
 * g3.block_bytes against g3.capacity, socket paths that do not fit).
 *
 * With KV_CFG_CHECK_MACHINE, also against the machine this process runs
 * on (daemon/OPS.md, "Configuration checks"): admin.group must name a
 * group; g2.capacity must be at most 90% of MemTotal (a warning above
 * MemAvailable); with g2.lock, a warning when RLIMIT_MEMLOCK (without
 * CAP_IPC_LOCK) is below g2.capacity, as G2 then runs unlocked; each
 * g3.path directory, or its parent when kvcached would create it, must
 * exist, and the G3 files must fit in their filesystems' free space
 * (preallocation would fail), counting what existing store files hold;
 * with G4 on, its key files must be valid (kv_config_g4_keys: owner, mode,
 * contents). Alone: G4 on needs g4.key_file, g4.old_key_file needs
 * g4.old_key_until (a valid UTC time); G4 without g4.password is a
 * warning, and so is an old key past its window.
 *
 * Every finding goes to fn (may be NULL), with KV_CFG_REFUSE when the
 * daemon does not start with it and KV_CFG_WARN when it starts anyway; the
 * message names the option and has no trailing newline. Returns 0 when
 * nothing was refused, else -EINVAL.
 */
typedef enum { KV_CFG_WARN = 1, KV_CFG_REFUSE = 2 } kv_cfg_level;
typedef void (*kv_config_report_fn)(void *arg, kv_cfg_level level, const char *msg);
#define KV_CFG_CHECK_MACHINE 1u
int kv_config_check(const kv_config *c, unsigned flags, kv_config_report_fn fn, void *arg);

/* kv_config_check without the machine: 0, or -EINVAL with the first
 * refusal's message in err (warnings are not reported). */
int kv_config_validate(const kv_config *c, char *err, size_t errlen);

/* The directories of g3.path, in its order, each without its surrounding
 * spaces; empty entries are skipped. buf (sizeof c->g3_path bytes) holds
 * them; dirs[0..max) point into it. Returns how many (0: no G3), or -E2BIG
 * (more than max). */
int kv_config_g3_dirs(const kv_config *c, char *buf, const char **dirs, unsigned max);
/* The G3 slot size a new store gets: g3.slot_bytes, or g3.block_bytes
 * when that is 0. */
uint64_t kv_config_g3_slot(const kv_config *c);

/* The group id of admin.group into *gid: 0, -ENOENT (no such group), or
 * -errno (the group database could not be read). */
int kv_config_admin_gid(const kv_config *c, gid_t *gid);

/* The ordinals of g1.device, in its order, into ord. Returns how many
 * (1..KV_CFG_G1_DEVICES_MAX), or -EINVAL (empty, not a number, above 255,
 * named twice, too many). */
int kv_config_g1_devices(const kv_config *c, int ord[KV_CFG_G1_DEVICES_MAX]);

/* Splits `capacity` bytes of a tier (1: G2, by g2_share; 2: G3, by
 * g3_share) among the configured tenants, in their order, into out:
 * percentages of capacity and sizes as given, what remains evenly among
 * those without a share. 0, or -EINVAL with a message when the shares add
 * up to more than capacity. */
int kv_config_split(const kv_config *c, int tier, uint64_t capacity,
                    uint64_t out[KV_CFG_TENANTS_MAX], char *err, size_t errlen);

/* The tenant section of that name, or NULL. */
const kv_cfg_tenant *kv_config_tenant(const kv_config *c, const char *name, size_t len);

/* The name an enum option's value is written as: ("g3.admit",
 * KV_ADMIT_MIN_PRIO) is "min-prio". NULL when dotted names no enum option
 * or value is none of its. */
const char *kv_config_enum_name(const char *dotted, int value);

/*
 * The options as command-line flags, for getopt_long: every option of the
 * table as --SECTION.NAME (--g3.admit=min-prio, --g3.admit min-prio), and
 * the older spellings some have (--socket-dir, --g2-capacity, --g3-path,
 * --g3-capacity, --policy, --log-level). Each takes a value, and has val =
 * base + the option's index in the table. Writes at most max entries and a
 * zero entry after them; returns how many, or -ENOSPC.
 */
int kv_config_getopt(struct option *out, size_t max, int base);

/* Sets the option of that index (a flag's val less base) from its text
 * value: 0, or -ENOENT / -EINVAL with a message in err, as kv_config_set. */
int kv_config_set_index(kv_config *c, int index, const char *value, char *err, size_t errlen);

/* Writes the flags of every option for --help: its spellings, its values
 * (an enum's names), its documentation and its default. */
void kv_config_usage(FILE *f);

/* Writes every option with its documentation and current value, as INI. */
void kv_config_print(const kv_config *c, FILE *f);

/* Calls fn with every option's section, name and current value as text
 * (sizes in bytes, booleans yes/no), in the table's order. */
typedef void (*kv_config_fn)(void *arg, const char *section, const char *name, const char *value);
void kv_config_foreach(const kv_config *c, kv_config_fn fn, void *arg);

#endif
