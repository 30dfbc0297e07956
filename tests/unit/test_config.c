/* test_config.c - configuration: sizes, files, flags, bad values with a
 * message that names the line, enum options, the command-line flags made
 * from the option table, and the shipped default file. */
#include <criterion/criterion.h>
#include <errno.h>
#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/config.h"
#include "tiers/quant.h"
#include "tests/lib/tmpdir.h"

Test(config, sizes) {
  uint64_t v;
  cr_assert_eq(kv_parse_size("4096", &v), 0);
  cr_assert_eq(v, 4096);
  cr_assert_eq(kv_parse_size("64K", &v), 0);
  cr_assert_eq(v, 65536);
  cr_assert_eq(kv_parse_size("512m", &v), 0);
  cr_assert_eq(v, 512ull << 20);
  cr_assert_eq(kv_parse_size("2GiB", &v), 0);
  cr_assert_eq(v, 2ull << 30);
  cr_assert_eq(kv_parse_size("1TB", &v), 0);
  cr_assert_eq(v, 1ull << 40);
  const char *bad[] = {"",          "G", "-1", "1X", "12 34", "1.5G", "99999999999999999999",
                       "16777216T", NULL};
  for (int i = 0; bad[i]; i++) cr_assert_eq(kv_parse_size(bad[i], &v), -EINVAL, "'%s'", bad[i]);
  cr_assert_eq(kv_parse_size(NULL, &v), -EINVAL);
}

static char *write_tmp(const char *text) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/kvconf-XXXXXX");
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  return path;
}

Test(config, file_overrides_defaults) {
  kv_config c;
  char err[256];
  kv_config_defaults(&c);
  cr_assert_eq(c.g2_capacity, 1ull << 30);
  char *p = write_tmp("[g2]\ncapacity = 256M\nlock = no\n[cache]\npolicy = lru2\n");
  cr_assert_eq(kv_config_load(&c, p, err, sizeof err), 0, "%s", err);
  unlink(p);
  cr_assert_eq(c.g2_capacity, 256ull << 20);
  cr_assert_eq(c.g2_lock, 0);
  cr_assert_str_eq(c.policy, "lru2");
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), 0);
}

Test(config, errors_name_the_file_line_and_option) {
  kv_config c;
  char err[256];
  kv_config_defaults(&c);
  char *p = write_tmp("[g2]\ncapacity = 1G\npage_size = lots\n");
  cr_assert_eq(kv_config_load(&c, p, err, sizeof err), -EINVAL);
  cr_assert(strstr(err, ":3:") && strstr(err, "page_size"), "%s", err);
  unlink(p);
  p = write_tmp("[g2]\ncolour = blue\n");
  cr_assert_eq(kv_config_load(&c, p, err, sizeof err), -EINVAL);
  cr_assert(strstr(err, ":2:") && strstr(err, "colour"), "%s", err);
  unlink(p);
  p = write_tmp("[g2\ncapacity = 1G\n");
  cr_assert_eq(kv_config_load(&c, p, err, sizeof err), -EINVAL);
  unlink(p);
  cr_assert_eq(kv_config_load(&c, "/nonexistent/kv.conf", err, sizeof err), -ENOENT);
  cr_assert(strstr(err, "/nonexistent/kv.conf"));
}

Test(config, validation_catches_bad_combinations) {
  kv_config c;
  char err[256];
  kv_config_defaults(&c);
  cr_assert_eq(kv_config_set(&c, "cache.policy", "fifo-ish", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "lru"), "lists the known policies: %s", err);
  kv_config_defaults(&c);
  kv_config_set(&c, "g2.page_size", "5000", err, sizeof err);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL);
  kv_config_defaults(&c);
  /* Closed sets are refused when read (test enum_options_...). */
  cr_assert_eq(kv_config_set(&c, "log.level", "chatty", err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "log.level"), "%s", err);
  /* G1: enable and backend are closed sets; a pool needs bytes. */
  kv_config_defaults(&c);
  cr_assert_eq(c.g1_enable, KV_CFG_G1_AUTO);
  cr_assert_eq(c.g1_backend, KV_DEV_AUTO);
  cr_assert_eq(c.g1_capacity, 1ull << 30);
  cr_assert_str_eq(c.g1_device, "0");
  cr_assert_eq(kv_config_set(&c, "g1.enable", "maybe", err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "g1.enable"), "%s", err);
  kv_config_defaults(&c);
  cr_assert_eq(kv_config_set(&c, "g1.backend", "opencl", err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "g1.backend"), "%s", err);
  kv_config_defaults(&c);
  cr_assert_eq(kv_config_set(&c, "g1.capacity", "0", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL);
  cr_assert_eq(kv_config_set(&c, "g1.enable", "off", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), 0, "%s", err);
  kv_config_defaults(&c);
  cr_assert_eq(kv_config_set(&c, "g1.backend", "sim", err, sizeof err), 0);
  cr_assert_eq(kv_config_set(&c, "g1.device", "3", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), 0, "%s", err);
  int ord[KV_CFG_G1_DEVICES_MAX];
  cr_assert_eq(kv_config_g1_devices(&c, ord), 1);
  cr_assert_eq(ord[0], 3);
  /* A pool per device: a list, in its order. */
  cr_assert_eq(kv_config_set(&c, "g1.device", "2, 0,7,1,3,4,5,6", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), 0, "%s", err);
  cr_assert_eq(kv_config_g1_devices(&c, ord), 8);
  cr_assert_eq(ord[0], 2);
  cr_assert_eq(ord[1], 0);
  cr_assert_eq(ord[7], 6);
  static const char *const bad[] = {"",
                                    " ",
                                    "0,",
                                    ",0",
                                    "0,,1",
                                    "1,1",
                                    "256",
                                    "99999999999",
                                    "-1",
                                    "0x1",
                                    "a",
                                    "0 1",
                                    "0,1,2,3,4,5,6,7,8"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cr_assert_eq(kv_config_set(&c, "g1.device", bad[i], err, sizeof err), 0);
    cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL, "g1.device = '%s'", bad[i]);
    cr_assert(strstr(err, "g1.device"), "%s", err);
  }
  cr_assert_eq(kv_config_set(&c, "nosuch", "1", err, sizeof err), -ENOENT);
  cr_assert_eq(kv_config_set(&c, "g2.nosuch", "1", err, sizeof err), -ENOENT);
  char big[64];
  memset(big, 'x', sizeof big - 1);
  big[63] = 0;
  cr_assert_eq(kv_config_set(&c, "cache.policy", big, err, sizeof err), -EINVAL);
}

/* deploy/kvcached.conf documents every option: it must parse, validate,
 * and (commented values aside) equal the built-in defaults. */
Test(config, shipped_default_file_matches_the_defaults) {
  kv_config def, file;
  char err[256];
  kv_config_defaults(&def);
  kv_config_defaults(&file);
  cr_assert_eq(kv_config_load(&file, KV_SOURCE_DIR "/deploy/kvcached.conf", err, sizeof err), 0,
               "%s", err);
  cr_assert_eq(memcmp(&def, &file, sizeof def), 0);
  /* Every option the table knows appears in the file. */
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  kv_config_print(&def, m);
  fclose(m);
  FILE *f = fopen(KV_SOURCE_DIR "/deploy/kvcached.conf", "r");
  char text[16384] = {0};
  fread(text, 1, sizeof text - 1, f);
  fclose(f);
  char *save = NULL;
  for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (line[0] == '#' || line[0] == '[') continue;
    char name[64];
    sscanf(line, "%63s", name);
    cr_assert(strstr(text, name), "deploy/kvcached.conf lacks option %s", name);
  }
  free(buf);
}

/* [tenant.NAME]: who may act as a tenant and its shares, from a file or
 * from flags; names resolved when read. */
Test(config, tenant_sections_name_credentials_and_shares) {
  kv_config c;
  char err[256];
  kv_config_defaults(&c);
  cr_assert_eq(c.ntenants, 0);
  char *p = write_tmp("[tenant.alice]\nuids = root, 1001,1001\ngids = root\ng2_share = 25%\n"
                      "g3_share = 1G\n[tenant.bob]\ngids = 2000\n");
  cr_assert_eq(kv_config_load(&c, p, err, sizeof err), 0, "%s", err);
  unlink(p);
  cr_assert_eq(c.ntenants, 2);
  const kv_cfg_tenant *a = kv_config_tenant(&c, "alice", 5);
  cr_assert_not_null(a);
  cr_assert_eq(a->nuids, 2, "a repeated uid counts once");
  cr_assert_eq(a->uids[0], 0);
  cr_assert_eq(a->uids[1], 1001);
  cr_assert_eq(a->ngids, 1);
  cr_assert_eq(a->gids[0], 0);
  cr_assert_eq(a->g2_share.kind, KV_SHARE_PCT);
  cr_assert_eq(a->g2_share.v, 2500);
  cr_assert_eq(a->g3_share.kind, KV_SHARE_BYTES);
  cr_assert_eq(a->g3_share.v, 1ull << 30);
  /* Flags add to or override the file's sections. */
  cr_assert_eq(kv_config_set(&c, "tenant.bob.g2_share", "12.5%", err, sizeof err), 0, "%s", err);
  cr_assert_eq(kv_config_set(&c, "tenant.carol.v1.uids", "7", err, sizeof err), 0, "%s", err);
  cr_assert_eq(c.ntenants, 3);
  cr_assert_str_eq(c.tenants[2].name, "carol.v1");
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), 0, "%s", err);
  uint64_t part[KV_CFG_TENANTS_MAX];
  cr_assert_eq(kv_config_split(&c, 1, 1000000, part, err, sizeof err), 0);
  cr_assert_eq(part[0], 250000);
  cr_assert_eq(part[1], 125000);
  cr_assert_eq(part[2], 625000, "a tenant without a share gets what the others leave");
  /* --print-config writes sections that read back the same. */
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  kv_config_print(&c, m);
  fclose(m);
  p = write_tmp(buf);
  free(buf);
  kv_config back;
  kv_config_defaults(&back);
  cr_assert_eq(kv_config_load(&back, p, err, sizeof err), 0, "%s", err);
  unlink(p);
  cr_assert_eq(memcmp(&back, &c, sizeof c), 0);
}

Test(config, tenant_mistakes_are_errors_that_name_the_option) {
  kv_config c;
  char err[256];
  kv_config_defaults(&c);
  cr_assert_eq(kv_config_set(&c, "tenant.alice.uids", "no-such-user-kvcached", err, sizeof err),
               -EINVAL);
  cr_assert(strstr(err, "tenant.alice.uids") && strstr(err, "no-such-user-kvcached"), "%s", err);
  cr_assert_eq(kv_config_set(&c, "tenant.alice.gids", "no-such-group-kvcached", err, sizeof err),
               -EINVAL);
  cr_assert(strstr(err, "gid or group name"), "%s", err);
  cr_assert_eq(kv_config_set(&c, "tenant.alice.colour", "blue", err, sizeof err), -ENOENT);
  cr_assert_eq(kv_config_set(&c, "tenant.a lice.uids", "1", err, sizeof err), -EINVAL);
  cr_assert_eq(kv_config_set(&c, "tenant.alice.g2_share", "101%", err, sizeof err), -EINVAL);
  cr_assert_eq(kv_config_set(&c, "tenant.alice.g2_share", "1.125%", err, sizeof err), -EINVAL);
  cr_assert_eq(kv_config_set(&c, "tenant.alice.g2_share", "lots", err, sizeof err), -EINVAL);
  cr_assert_eq(c.ntenants, 0, "a refused option adds no tenant");
  /* A tenant nobody may use. */
  cr_assert_eq(kv_config_set(&c, "tenant.alice.g2_share", "10%", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "tenant.alice") && strstr(err, "nobody"), "%s", err);
  /* Shares over the whole tier. */
  cr_assert_eq(kv_config_set(&c, "tenant.alice.uids", "1", err, sizeof err), 0);
  cr_assert_eq(kv_config_set(&c, "tenant.alice.g2_share", "60%", err, sizeof err), 0);
  cr_assert_eq(kv_config_set(&c, "tenant.bob.uids", "2", err, sizeof err), 0);
  cr_assert_eq(kv_config_set(&c, "tenant.bob.g2_share", "50%", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "g2_share"), "%s", err);
  cr_assert_eq(kv_config_set(&c, "tenant.bob.g2_share", "40%", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), 0, "%s", err);
  cr_assert_eq(kv_config_set(&c, "tenant.bob.g3_share", "5T", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "g3_share"), "%s", err);
  cr_assert_eq(kv_config_tenant(&c, "bob", 3)->cold_precision, 0, "exact by default");
  cr_assert_eq(kv_config_set(&c, "tenant.bob.cold_precision", "int8", err, sizeof err), 0);
  cr_assert_eq(kv_config_tenant(&c, "bob", 3)->cold_precision, KV_QUANT_INT8);
  cr_assert_eq(kv_config_set(&c, "tenant.bob.cold_precision", "exact", err, sizeof err), 0);
  cr_assert_eq(kv_config_tenant(&c, "bob", 3)->cold_precision, 0);
  cr_assert_eq(kv_config_set(&c, "tenant.bob.cold_precision", "fp4", err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "cold_precision"), "%s", err);
  /* g2.tenants no longer binds arenas first-come. */
  kv_config_defaults(&c);
  cr_assert_eq(kv_config_set(&c, "g2.tenants", "2", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "[tenant.NAME]"), "%s", err);
}

typedef struct findings {
  int refused, warned;
  char last[512];
} findings;
static void collect(void *arg, kv_cfg_level level, const char *msg) {
  findings *f = arg;
  if (level == KV_CFG_REFUSE) f->refused++;
  else f->warned++;
  snprintf(f->last, sizeof f->last, "%s", msg);
}

/* Issue 16 item 11: these passed kv_config_validate (and so `kvctl
 * check-config`) although kvcached refused them, or failed on them after
 * building part of its state. */
Test(config, the_daemons_start_up_checks_are_configuration_checks) {
  static const struct {
    const char *opt, *val, *says;
  } bad[] = {
      {"g3.queue_depth", "1000000", "g3.queue_depth"},
      {"g3.queue_depth", "0", "g3.queue_depth"},
      {"g3.block_bytes", "0", "g3.block_bytes"},
      {"g3.block_bytes", "8G", "larger than g3.capacity"},
      {"g3.block_bytes", "4000K", "holds no slot"}, /* 1M + 4K + 4000K > 4M */
      {"g3.slot_bytes", "512K", "larger than g3.block_bytes"}, /* block_bytes 256K */
      {"g3.codec_threads", "0", "g3.codec_threads"},
      {"g3.codec_threads", "65", "g3.codec_threads"},
      {"g3.path", "/a,/b,/a", "names /a twice"},
      {"g3.path", " , ", "names no directory"},
      {"daemon.socket_dir",
       "/tmp/0123456789012345678901234567890123456789012345678901234567890123456789012345678901234",
       "daemon.socket_dir"},
  };
  char err[256];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    kv_config c;
    kv_config_defaults(&c);
    cr_assert_eq(kv_config_set(&c, "g3.capacity", "4M", err, sizeof err), 0);
    cr_assert_eq(kv_config_set(&c, bad[i].opt, bad[i].val, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL, "%s = %s", bad[i].opt,
                 bad[i].val);
    cr_assert(strstr(err, bad[i].says), "%s = %s: %s", bad[i].opt, bad[i].val, err);
    findings f = {0};
    cr_assert_eq(kv_config_check(&c, 0, collect, &f), -EINVAL);
    cr_assert_eq(f.refused, 1, "%s = %s: one finding, not %d", bad[i].opt, bad[i].val, f.refused);
  }
  /* Smaller slots than blocks: the layout is checked with the slots. */
  {
    kv_config c;
    kv_config_defaults(&c);
    cr_assert_eq(kv_config_set(&c, "g3.capacity", "4M", err, sizeof err), 0);
    cr_assert_eq(kv_config_set(&c, "g3.block_bytes", "4000K", err, sizeof err), 0);
    cr_assert_eq(kv_config_set(&c, "g3.slot_bytes", "1M", err, sizeof err), 0);
    cr_assert_eq(kv_config_validate(&c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kv_config_g3_slot(&c), 1u << 20);
  }
  /* Without G3 its sizes do not matter; more than 64 directories do. */
  kv_config c;
  kv_config_defaults(&c);
  cr_assert_eq(kv_config_set(&c, "g3.block_bytes", "0", err, sizeof err), 0);
  cr_assert_eq(kv_config_set(&c, "g3.path", "", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), 0, "%s", err);
  char many[256] = "";
  for (int i = 0; i < 65; i++)
    snprintf(many + strlen(many), sizeof many - strlen(many), "%sd%d", i ? "," : "", i);
  cr_assert_eq(kv_config_set(&c, "g3.path", many, err, sizeof err), 0, "%s", err);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "more than 64"), "%s", err);
  /* Every refusal is reported, not only the first. */
  kv_config_defaults(&c);
  kv_config_set(&c, "g3.queue_depth", "0", err, sizeof err);
  kv_config_set(&c, "g3.block_bytes", "0", err, sizeof err);
  kv_config_set(&c, "g2.page_size", "5000", err, sizeof err);
  findings f = {0};
  cr_assert_eq(kv_config_check(&c, 0, collect, &f), -EINVAL);
  cr_assert_eq(f.refused, 3);
}

Test(config, g3_path_is_split_as_the_daemon_opens_it) {
  kv_config c;
  char err[256], buf[sizeof c.g3_path];
  const char *dirs[4];
  kv_config_defaults(&c);
  kv_config_set(&c, "g3.path", " /a , /b/c,,/d ", err, sizeof err);
  cr_assert_eq(kv_config_g3_dirs(&c, buf, dirs, 4), 3);
  cr_assert_str_eq(dirs[0], "/a");
  cr_assert_str_eq(dirs[1], "/b/c");
  cr_assert_str_eq(dirs[2], "/d");
  cr_assert_eq(kv_config_g3_dirs(&c, buf, dirs, 2), -E2BIG);
  kv_config_set(&c, "g3.path", "", err, sizeof err);
  cr_assert_eq(kv_config_g3_dirs(&c, buf, dirs, 4), 0);
}

/* The machine's checks run only when asked: a file may be meant for
 * another machine. */
Test(config, machine_checks_only_when_asked) {
  kv_config c;
  char err[256];
  kv_config_defaults(&c);
  kv_config_set(&c, "g3.path", "", err, sizeof err);
  kv_config_set(&c, "admin.group", "no-such-group-kvtest", err, sizeof err);
  findings f = {0};
  cr_assert_eq(kv_config_check(&c, 0, collect, &f), 0);
  cr_assert_eq(kv_config_check(&c, KV_CFG_CHECK_MACHINE, collect, &f), -EINVAL);
  cr_assert(strstr(f.last, "admin.group: no group named 'no-such-group-kvtest'"), "%s", f.last);
  kv_config_defaults(&c);
  kv_config_set(&c, "g3.path", "", err, sizeof err);
  kv_config_set(&c, "g2.capacity", "1000T", err, sizeof err);
  kv_config_set(&c, "g2.lock", "no", err, sizeof err);
  memset(&f, 0, sizeof f);
  cr_assert_eq(kv_config_check(&c, 0, collect, &f), 0);
  cr_assert_eq(kv_config_check(&c, KV_CFG_CHECK_MACHINE, collect, &f), -EINVAL);
  cr_assert(strstr(f.last, "more than 90% of this machine's memory"), "%s", f.last);
}

/* Every enum option takes each of its names into its C enum, writes the
 * value back by its first name, and refuses any other word with the list. */
Test(config, enum_options_take_their_names_and_list_them_when_refused) {
  static const struct {
    const char *opt;
    size_t off;
    const char *names[6];
    int values[6];
    const char *list;
  } enums[] = {
      {"g1.enable",
       offsetof(kv_config, g1_enable),
       {"auto", "on", "off"},
       {KV_CFG_G1_AUTO, KV_CFG_G1_ON, KV_CFG_G1_OFF},
       "auto, on, off"},
      {"g1.backend",
       offsetof(kv_config, g1_backend),
       {"auto", "cuda", "sim"},
       {KV_DEV_AUTO, KV_DEV_CUDA, KV_DEV_SIM},
       "auto, cuda, sim"},
      {"g3.backend",
       offsetof(kv_config, g3_backend),
       {"auto", "uring", "threads"},
       {KV_G3_BACKEND_AUTO, KV_G3_BACKEND_URING, KV_G3_BACKEND_THREADS},
       "auto, uring, threads"},
      {"g3.admit",
       offsetof(kv_config, g3_admit),
       {"always", "second-use", "min-prio"},
       {KV_ADMIT_ALWAYS, KV_ADMIT_SECOND_USE, KV_ADMIT_MIN_PRIO},
       "always, second-use, min-prio"},
      {"log.level",
       offsetof(kv_config, log_level),
       {"debug", "info", "warn", "warning", "error"},
       {KV_LOG_DEBUG, KV_LOG_INFO, KV_LOG_WARN, KV_LOG_WARN, KV_LOG_ERROR},
       "debug, info, warn, error"},
  };
  char err[256];
  for (size_t i = 0; i < sizeof enums / sizeof enums[0]; i++) {
    kv_config c;
    for (int k = 0; enums[i].names[k]; k++) {
      kv_config_defaults(&c);
      const char *name = enums[i].names[k];
      cr_assert_eq(kv_config_set(&c, enums[i].opt, name, err, sizeof err), 0, "%s = %s: %s",
                   enums[i].opt, name, err);
      int v;
      memcpy(&v, (const char *)&c + enums[i].off, sizeof v);
      cr_assert_eq(v, enums[i].values[k], "%s = %s", enums[i].opt, name);
      const char *back = kv_config_enum_name(enums[i].opt, v);
      cr_assert_not_null(back);
      cr_assert(!strcmp(back, name) || !strcmp(name, "warning"), "%s = %s reads back as %s",
                enums[i].opt, name, back);
      cr_assert_eq(kv_config_validate(&c, err, sizeof err), 0, "%s = %s: %s", enums[i].opt, name,
                   err);
    }
    static const char *const bad[] = {"bogus", "", "AUTO", "on ", "2"};
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
      kv_config_defaults(&c);
      kv_config before = c;
      cr_assert_eq(kv_config_set(&c, enums[i].opt, bad[b], err, sizeof err), -EINVAL, "%s = '%s'",
                   enums[i].opt, bad[b]);
      char want[160];
      snprintf(want, sizeof want, "%s: '%s': expected one of: %s", enums[i].opt, bad[b],
               enums[i].list);
      cr_assert_str_eq(err, want);
      cr_assert_eq(memcmp(&before, &c, sizeof c), 0, "a refused value changes nothing");
    }
    /* In a file, the same refusal names the line. */
    char text[96];
    snprintf(text, sizeof text, "[%.*s]\n\n%s = bogus\n",
             (int)(strchr(enums[i].opt, '.') - enums[i].opt), enums[i].opt,
             strchr(enums[i].opt, '.') + 1);
    char *p = write_tmp(text);
    kv_config_defaults(&c);
    cr_assert_eq(kv_config_load(&c, p, err, sizeof err), -EINVAL);
    unlink(p);
    cr_assert(strstr(err, ":3:") && strstr(err, enums[i].list), "%s", err);
  }
  cr_assert_null(kv_config_enum_name("g3.admit", 99));
  cr_assert_null(kv_config_enum_name("g3.capacity", 0), "not an enum option");
  cr_assert_null(kv_config_enum_name("g3.nosuch", 0));
}

/* parse: the flags of argv (NULL-ended) over the defaults, as kvcached
 * reads its table's flags. */
static int parse(kv_config *c, const char *const *args, char *err, size_t errlen) {
  struct option lo[160];
  cr_assert_gt(kv_config_getopt(lo, sizeof lo / sizeof lo[0], 1000), 0);
  char *argv[40] = {"kvcached"};
  int argc = 1;
  for (; args[argc - 1] && argc < 39; argc++) argv[argc] = (char *)args[argc - 1];
  cr_assert_null(args[argc - 1], "more flags than argv holds");
  argv[argc] = NULL;
  kv_config_defaults(c);
  optind = 0;
  opterr = 0;
  int ch, rc = 0;
  while (!rc && (ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
    cr_assert_geq(ch, 1000, "flag %s refused", argv[optind - 1]);
    rc = kv_config_set_index(c, ch - 1000, optarg, err, errlen);
  }
  return rc;
}

/* --SECTION.NAME=VALUE, --SECTION.NAME VALUE and the older spellings set
 * the same fields as a file and kv_config_set (--set) do. */
Test(config, long_options_set_the_same_fields_as_the_file_and_set) {
  static const char *const set[][2] = {
      {"daemon.socket_dir", "/tmp/kvsock"},
      {"g2.capacity", "256M"},
      {"g2.lock", "no"},
      {"g3.queue_depth", "8"},
      {"g3.admit", "min-prio"},
      {"g1.backend", "sim"},
      {"log.level", "warning"},
      {"cache.policy", "lru2"},
      {"stats.listen", "127.0.0.1:9464"},
  };
  enum { N = sizeof set / sizeof set[0] };
  kv_config want, file, eq, sep, old;
  char err[256], text[1024] = "", flags[N][96], sepflags[N][64];
  const char *eqv[N + 1], *sepv[2 * N + 1];
  kv_config_defaults(&want);
  for (size_t i = 0; i < N; i++) {
    cr_assert_eq(kv_config_set(&want, set[i][0], set[i][1], err, sizeof err), 0, "%s", err);
    const char *dot = strchr(set[i][0], '.');
    snprintf(text + strlen(text), sizeof text - strlen(text), "[%.*s]\n%s = %s\n",
             (int)(dot - set[i][0]), set[i][0], dot + 1, set[i][1]);
    snprintf(flags[i], sizeof flags[i], "--%s=%s", set[i][0], set[i][1]);
    eqv[i] = flags[i];
    snprintf(sepflags[i], sizeof sepflags[i], "--%s", set[i][0]);
    sepv[2 * i] = sepflags[i];
    sepv[2 * i + 1] = set[i][1];
  }
  eqv[N] = NULL;
  sepv[2 * N] = NULL;
  char *p = write_tmp(text);
  kv_config_defaults(&file);
  cr_assert_eq(kv_config_load(&file, p, err, sizeof err), 0, "%s", err);
  unlink(p);
  cr_assert_eq(parse(&eq, eqv, err, sizeof err), 0, "%s", err);
  cr_assert_eq(parse(&sep, sepv, err, sizeof err), 0, "%s", err);
  static const char *const olds[] = {"--socket-dir",
                                     "/tmp/kvsock",
                                     "--g2-capacity=256M",
                                     "--g2.lock",
                                     "no",
                                     "--g3.queue_depth=8",
                                     "--g3.admit",
                                     "min-prio",
                                     "--g1.backend=sim",
                                     "--log-level=warning",
                                     "--policy",
                                     "lru2",
                                     "--stats.listen=127.0.0.1:9464",
                                     NULL};
  cr_assert_eq(parse(&old, olds, err, sizeof err), 0, "%s", err);
  cr_assert_eq(memcmp(&want, &file, sizeof want), 0, "the file");
  cr_assert_eq(memcmp(&want, &eq, sizeof want), 0, "--SECTION.NAME=VALUE");
  cr_assert_eq(memcmp(&want, &sep, sizeof want), 0, "--SECTION.NAME VALUE");
  cr_assert_eq(memcmp(&want, &old, sizeof want), 0, "the older spellings");
  /* A bad value through a flag: the same message as from --set. */
  char err2[256];
  kv_config c;
  cr_assert_eq(parse(&c, (const char *const[]){"--g3.admit=often", NULL}, err, sizeof err),
               -EINVAL);
  cr_assert_eq(kv_config_set(&c, "g3.admit", "often", err2, sizeof err2), -EINVAL);
  cr_assert_str_eq(err, err2);
  /* Each of the table's options has its flag. */
  struct option lo[160];
  int n = kv_config_getopt(lo, sizeof lo / sizeof lo[0], 0);
  cr_assert_gt(n, 0);
  cr_assert_null(lo[n].name);
  cr_assert_eq(kv_config_getopt(lo, 3, 0), -ENOSPC);
}

typedef struct help_ctx {
  const char *text;
  int n;
} help_ctx;
static void in_help(void *arg, const char *section, const char *name, const char *value) {
  help_ctx *h = arg;
  char flag[96];
  snprintf(flag, sizeof flag, "\n  --%s.%s=", section, name);
  cr_assert(strstr(h->text, flag), "--help lacks %s.%s", section, name);
  h->n++;
}

/* --help lists every option of the table, with its doc line and default. */
Test(config, help_lists_every_table_option) {
  char *buf = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&buf, &len);
  kv_config_usage(m);
  fclose(m);
  kv_config c;
  kv_config_defaults(&c);
  help_ctx h = {buf, 0};
  kv_config_foreach(&c, in_help, &h);
  cr_assert_gt(h.n, 30);
  cr_assert(strstr(buf, "  --g3.admit=always|second-use|min-prio\n"), "%s", buf);
  cr_assert(strstr(buf, "  --log.level=debug|info|warn|error, --log-level\n"), "%s", buf);
  cr_assert(strstr(buf, "  --g2.capacity=SIZE, --g2-capacity\n      bytes of pinned host memory"),
            "%s", buf);
  cr_assert(strstr(buf, "(default: always)\n"), "%s", buf);
  free(buf);
}

/* [g4]: off by default; seeds are IP:port lists; each mistake is refused by
 * the shared check with the option's name. */
Test(config, g4_options_are_checked) {
  kv_config c;
  char err[256];
  kv_config_defaults(&c);
  cr_assert_str_eq(c.g4_seeds, "");
  cr_assert_str_eq(c.g4_prefix, "kv:");
  cr_assert_eq(c.g4_ttl_s, 3600);
  cr_assert_eq(c.g4_timeout_ms, 200);
  cr_assert_eq(c.g4_replica_reads, 0);
  cr_assert_eq(c.g4_lookup_blocks, 256);
  cr_assert_eq(c.g4_backlog_blocks, 16384);
  cr_assert_eq(c.g4_absent_ms, 250);
  cr_assert_eq(c.g4_map_refresh_ms, 30000);
  cr_assert_eq(c.g4_admit, KV_ADMIT_ALWAYS);
  cr_assert_eq(kv_config_set(&c, "g4.seeds", "127.0.0.1:7000, 10.0.0.2:7001,[::1]:7002", err,
                             sizeof err),
               0);
  cr_assert_eq(kv_config_set(&c, "g4.key_file", "/etc/kvcached/g4.key", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), 0, "%s", err);
  char buf[sizeof c.g4_seeds];
  const char *s[8];
  cr_assert_eq(kv_config_g4_seeds(&c, buf, s, 8), 3);
  cr_assert_str_eq(s[1], "10.0.0.2:7001");
  cr_assert_str_eq(s[2], "[::1]:7002");
  cr_assert_eq(kv_config_set(&c, "g4.admit", "second-use", err, sizeof err), 0);
  cr_assert_eq(c.g4_admit, KV_ADMIT_SECOND_USE);
  cr_assert_eq(kv_config_set(&c, "g4.admit", "min-prio", err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "g4.admit"), "%s", err);
  cr_assert_eq(c.g4_codec, KV_G4_CODEC_OFF);
  cr_assert_eq(kv_config_set(&c, "g4.codec", "auto", err, sizeof err), 0);
  cr_assert_eq(c.g4_codec, KV_G4_CODEC_AUTO);
  cr_assert_eq(kv_config_set(&c, "g4.codec", "zstd", err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "g4.codec"), "%s", err);
  cr_assert_eq(c.g3_codec, KV_G3_CODEC_OFF);
  cr_assert_eq(kv_config_set(&c, "g3.codec", "auto", err, sizeof err), 0);
  cr_assert_eq(c.g3_codec, KV_G3_CODEC_AUTO);
  cr_assert_eq(kv_config_set(&c, "g3.codec", "zstd", err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "g3.codec"), "%s", err);
  static const struct {
    const char *key, *value, *says;
  } bad[] = {
      {"g4.seeds", "redis-0:7000", "g4.seeds"},   /* a host name */
      {"g4.seeds", "127.0.0.1", "g4.seeds"},      /* no port */
      {"g4.seeds", "127.0.0.1:0", "g4.seeds"},    /* port 0 */
      {"g4.seeds", "127.0.0.1:7000,", "g4.seeds"}, /* an empty entry */
      {"g4.prefix", "kv{a}:", "g4.prefix"},        /* a hash tag */
      {"g4.prefix", "k v", "g4.prefix"},
      {"g4.ttl_s", "0", "g4.ttl_s"},
      {"g4.timeout_ms", "0", "g4.timeout_ms"},
      {"g4.lookup_blocks", "0", "g4.lookup_blocks"},
      {"g4.lookup_blocks", "5000", "g4.lookup_blocks"},
      {"g4.backlog_blocks", "2000000", "g4.backlog_blocks"},
      {"g4.absent_ms", "60001", "g4.absent_ms"},
      {"g4.map_refresh_ms", "50", "g4.map_refresh_ms"},
      {"g4.user", "alice", "g4.user"}, /* without a password */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    kv_config_defaults(&c);
    cr_assert_eq(kv_config_set(&c, "g4.seeds", "127.0.0.1:7000", err, sizeof err), 0);
    cr_assert_eq(kv_config_set(&c, "g4.key_file", "/etc/kvcached/g4.key", err, sizeof err), 0);
    cr_assert_eq(kv_config_set(&c, bad[i].key, bad[i].value, err, sizeof err), 0);
    cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL, "%s = '%s'", bad[i].key,
                 bad[i].value);
    cr_assert(strstr(err, bad[i].says), "%s = '%s': %s", bad[i].key, bad[i].value, err);
  }
  /* the password is never shown */
  kv_config_defaults(&c);
  cr_assert_eq(kv_config_set(&c, "g4.password", "hunter2", err, sizeof err), 0);
  char *out = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&out, &len);
  kv_config_print(&c, m);
  fclose(m);
  cr_assert_null(strstr(out, "hunter2"));
  free(out);
}

/* Issue 34 item 1: G4 values are signed with the fleet's secret. G4 on
 * needs a key file; a key file anyone but kvcached's user can read, one
 * that is missing, short or not hex, and a rotation window that is not a
 * UTC time are refused by the check the daemon and `kvctl check-config`
 * make; no g4.password is a warning. */
static void key_file(const char *path, const char *text, mode_t mode) {
  FILE *f = fopen(path, "w");
  cr_assert(f, "%s", path);
  fputs(text, f);
  fclose(f);
  cr_assert_eq(chmod(path, mode), 0);
}

/* kv_config_check against this machine: its result, findings in *f. */
static int check_g4(const char *dir, const char *const *sets, findings *f) {
  kv_config c;
  char err[256], v[300];
  kv_config_defaults(&c);
  kv_config_set(&c, "g3.path", "", err, sizeof err);
  kv_config_set(&c, "g2.capacity", "64M", err, sizeof err);
  kv_config_set(&c, "g2.lock", "no", err, sizeof err);
  kv_config_set(&c, "g4.seeds", "127.0.0.1:7000", err, sizeof err);
  kv_config_set(&c, "g4.password", "pw", err, sizeof err);
  for (int i = 0; sets[i]; i += 2) {
    const char *val = sets[i + 1];
    if (val[0] == '@') { /* a file in dir */
      snprintf(v, sizeof v, "%s/%s", dir, val + 1);
      val = v;
    }
    cr_assert_eq(kv_config_set(&c, sets[i], val, err, sizeof err), 0, "%s", err);
  }
  memset(f, 0, sizeof *f);
  return kv_config_check(&c, KV_CFG_CHECK_MACHINE, collect, f);
}

#define HEX64 "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

Test(config, g4_key_files_are_checked) {
  char dir[128], p[256];
  cr_assert_eq(kvt_mkdtemp(dir, sizeof dir, "kvg4key"), 0);
  snprintf(p, sizeof p, "%s/good", dir);
  key_file(p, HEX64 "\n", 0600);
  snprintf(p, sizeof p, "%s/readonly", dir);
  key_file(p, "  " HEX64 HEX64 "\n\n", 0400); /* 64 bytes, spaces around */
  snprintf(p, sizeof p, "%s/world", dir);
  key_file(p, HEX64 "\n", 0644);
  snprintf(p, sizeof p, "%s/group", dir);
  key_file(p, HEX64 "\n", 0640);
  snprintf(p, sizeof p, "%s/short", dir);
  key_file(p, "00112233445566778899aabbccddeeff00112233445566778899aabbccddee\n", 0600);
  snprintf(p, sizeof p, "%s/nothex", dir);
  key_file(p, "0011223344556677889Xaabbccddeeff00112233445566778899aabbccddeeff\n", 0600);
  snprintf(p, sizeof p, "%s/empty", dir);
  key_file(p, "", 0600);
  snprintf(p, sizeof p, "%s/sub", dir);
  cr_assert_eq(mkdir(p, 0700), 0);
  findings f;

  /* good: a key file of 64 hex digits; one of 128 with spaces around */
  const char *good[] = {"g4.key_file", "@good", NULL};
  cr_assert_eq(check_g4(dir, good, &f), 0, "%s", f.last);
  cr_assert_eq(f.warned, 0, "%s", f.last);
  const char *good2[] = {"g4.key_file", "@readonly", "g4.old_key_file", "@good",
                         "g4.old_key_until", "2099-01-01T00:00:00Z", NULL};
  cr_assert_eq(check_g4(dir, good2, &f), 0, "%s", f.last);
  /* and what the daemon reads: the secrets, their ids, the window's end */
  kv_config c;
  char err[512];
  kv_config_defaults(&c);
  snprintf(p, sizeof p, "%s/readonly", dir);
  kv_config_set(&c, "g4.key_file", p, err, sizeof err);
  snprintf(p, sizeof p, "%s/good", dir);
  kv_config_set(&c, "g4.old_key_file", p, err, sizeof err);
  kv_config_set(&c, "g4.old_key_until", "2099-01-01T00:00:00Z", err, sizeof err);
  kv_g4_keys keys;
  cr_assert_eq(kv_config_g4_keys(&c, &keys, err, sizeof err), 0, "%s", err);
  cr_assert_eq(keys.cur.len, 64);
  cr_assert_eq(keys.old.len, 32);
  cr_assert_eq(keys.old.b[1], 0x11);
  cr_assert_eq(keys.old_until, 4070908800);
  kv_g4_secret s;
  cr_assert_eq(kv_g4_secret_init(&s, keys.old.b, 32), 0);
  cr_assert_eq(s.id, keys.old.id);
  cr_assert_neq(keys.cur.id, keys.old.id);

  static const struct {
    const char *sets[7];
    const char *says;
  } bad[] = {
      {{NULL}, "g4.key_file is required"},
      {{"g4.key_file", "@missing", NULL}, "cannot open"},
      {{"g4.key_file", "@world", NULL}, "mode 0644"},
      {{"g4.key_file", "@group", NULL}, "mode 0640"},
      {{"g4.key_file", "@short", NULL}, "64 to 128 hex digits"},
      {{"g4.key_file", "@nothex", NULL}, "64 to 128 hex digits"},
      {{"g4.key_file", "@empty", NULL}, "64 to 128 hex digits"},
      {{"g4.key_file", "@sub", NULL}, "not a regular file"},
      {{"g4.key_file", "@good", "g4.old_key_file", "@world", "g4.old_key_until",
        "2099-01-01T00:00:00Z", NULL},
       "g4.old_key_file"},
      {{"g4.key_file", "@good", "g4.old_key_file", "@readonly", NULL}, "needs g4.old_key_until"},
      {{"g4.key_file", "@good", "g4.old_key_file", "@readonly", "g4.old_key_until", "2026-12-01",
        NULL},
       "g4.old_key_until: '2026-12-01'"},
      {{"g4.key_file", "@good", "g4.old_key_file", "@readonly", "g4.old_key_until",
        "2026-02-30T00:00:00Z", NULL},
       "g4.old_key_until"},
      {{"g4.key_file", "@good", "g4.old_key_file", "@readonly", "g4.old_key_until",
        "2026-12-01T00:00:00", NULL},
       "g4.old_key_until"},
      {{"g4.key_file", "@good", "g4.old_key_file", "@readonly", "g4.old_key_until",
        "2026-12-01T00:00:00Z+1", NULL},
       "g4.old_key_until"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cr_assert_eq(check_g4(dir, bad[i].sets, &f), -EINVAL, "case %zu: refused", i);
    cr_assert(strstr(f.last, bad[i].says), "case %zu: %s", i, f.last);
  }
  /* only when G4 is on: a key file nobody reads is no finding */
  kv_config_defaults(&c);
  kv_config_set(&c, "g3.path", "", err, sizeof err);
  kv_config_set(&c, "g2.capacity", "64M", err, sizeof err);
  kv_config_set(&c, "g2.lock", "no", err, sizeof err);
  snprintf(p, sizeof p, "%s/world", dir);
  kv_config_set(&c, "g4.key_file", p, err, sizeof err);
  memset(&f, 0, sizeof f);
  cr_assert_eq(kv_config_check(&c, KV_CFG_CHECK_MACHINE, collect, &f), 0, "%s", f.last);
  /* a key file of another user (as root: chown it) */
  if (geteuid() == 0) {
    snprintf(p, sizeof p, "%s/good", dir);
    cr_assert_eq(chown(p, 1, 1), 0);
    cr_assert_eq(check_g4(dir, good, &f), -EINVAL);
    cr_assert(strstr(f.last, "owned by uid 1"), "%s", f.last);
  }
  /* warnings: no password; an old key past its window */
  kv_config_defaults(&c);
  kv_config_set(&c, "g4.seeds", "127.0.0.1:7000", err, sizeof err);
  kv_config_set(&c, "g4.key_file", "/etc/kvcached/g4.key", err, sizeof err);
  memset(&f, 0, sizeof f);
  cr_assert_eq(kv_config_check(&c, 0, collect, &f), 0, "%s", f.last);
  cr_assert_eq(f.warned, 1);
  cr_assert(strstr(f.last, "no g4.password"), "%s", f.last);
  kv_config_set(&c, "g4.password", "pw", err, sizeof err);
  kv_config_set(&c, "g4.old_key_file", "/etc/kvcached/g4.old", err, sizeof err);
  kv_config_set(&c, "g4.old_key_until", "2020-01-01T00:00:00Z", err, sizeof err);
  memset(&f, 0, sizeof f);
  cr_assert_eq(kv_config_check(&c, 0, collect, &f), 0, "%s", f.last);
  cr_assert_eq(f.warned, 1);
  cr_assert(strstr(f.last, "has passed"), "%s", f.last);
  cr_assert_eq(kvt_rmtree(dir), 0);
}
