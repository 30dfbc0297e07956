/*
 * kvctl_cli.c - kvctl's command-line helpers, shared by main() (kvctl.c)
 * and the commands (kvctl.c, kvctl_ops.c): the usage error with the
 * current command's usage line, the check of options a command does not
 * take, hex digests and byte counts as a person writes them. Contracts in
 * kvctl.h. Below every command: it calls none of them.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/hex.h"
#include "tools/kvctl.h"

/* One usage line per command, printed under a usage error. */
static const struct cmd_usage {
  const char *name, *line;
} cmd_usages[] = {
    {"status", "status [--json] [--socket-dir DIR] | status --worker [--json] [--socket PATH]"},
    {"tiers", "tiers [--json] [--socket-dir DIR]"},
    {"top", "top [--interval SECONDS] [--count N] [--json] [--socket-dir DIR]"},
    {"config", "config get [NAME] [--json] | config set NAME VALUE [--socket-dir DIR]"},
    {"evict", "evict --tier g2|g3 [--ns HEX] [--count N] [--socket-dir DIR]"},
    {"flush", "flush [--tier g2|g3] [--ns HEX] [--socket-dir DIR]"},
    {"pin", "pin --ns HEX KEY... [--socket-dir DIR]"},
    {"unpin", "unpin --ns HEX KEY... [--socket-dir DIR]"},
    {"keys", "keys [--limit N] [--tier g2|g3] [--ns HEX] [--json] [--socket-dir DIR]"},
    {"health", "health [--live] [--socket-dir DIR]"},
    {"lookup", "lookup KEY... [--json] [namespace options] [--socket PATH]"},
    {"put", "put KEY (--file F | --value STRING) [--parent KEY] [--prio N] [namespace options]"},
    {"get", "get KEY [--out F] [namespace options] [--socket PATH]"},
    {"check-config", "check-config FILE [--no-machine]"},
};
static const char *cur_usage; /* the usage line of the command being run */

void kvctl_set_usage(const char *cmd) {
  cur_usage = NULL;
  for (size_t i = 0; i < sizeof cmd_usages / sizeof cmd_usages[0]; i++)
    if (!strcmp(cmd, cmd_usages[i].name)) cur_usage = cmd_usages[i].line;
}

static void usage_tail(void) {
  if (cur_usage) fprintf(stderr, "usage: kvctl %s\n", cur_usage);
  fprintf(stderr, "(kvctl --help for usage)\n");
}

int bad_usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "kvctl: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  usage_tail();
  return EXIT_USAGE;
}

/* Decodes hex text (optional 0x) of 0..max bytes into out. Returns the
 * byte count, or -EINVAL (odd length, not hex, too long). */
int kvctl_parse_hex(const char *s, uint8_t *out, size_t max) {
  if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s += 2;
  return kv_hex_decode(s, strlen(s), out, max);
}

int kvctl_only(const ctl *c, const char *cmd, unsigned allowed) {
  static const char *names[] = {
      "--socket",       "--socket-dir", "--timeout", "--tenant", "--block-bytes", "--dtype",
      "layout options", "--salt",       "--str",     "--json",   "--out",         "--parent",
      "--file",         "--value",      "--prio",    "--tier",   "--ns",          "--count",
      "--limit",        "--interval",   "--worker",  "--live"};
  unsigned extra = c->seen & ~allowed;
  for (unsigned i = 0; extra && i < sizeof names / sizeof names[0]; i++, extra >>= 1) {
    if (!(extra & 1)) continue;
    return bad_usage("%s does not take %s", cmd, names[i]);
  }
  return 0;
}

void kvctl_human_bytes(uint64_t v, char *out, size_t cap) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double d = (double)v;
  int u = 0;
  while (d >= 1024 && u < 4) d /= 1024, u++;
  if (u == 0) snprintf(out, cap, "%llu B", (unsigned long long)v);
  else snprintf(out, cap, "%.1f %s", d, unit[u]);
}
