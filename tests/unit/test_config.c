/* test_config.c - configuration: sizes, files, flags, bad values with a
 * message that names the line, and the shipped default file. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/config.h"

Test(config, sizes) {
  uint64_t v;
  cr_assert_eq(kv_parse_size("4096", &v), 0); cr_assert_eq(v, 4096);
  cr_assert_eq(kv_parse_size("64K", &v), 0); cr_assert_eq(v, 65536);
  cr_assert_eq(kv_parse_size("512m", &v), 0); cr_assert_eq(v, 512ull << 20);
  cr_assert_eq(kv_parse_size("2GiB", &v), 0); cr_assert_eq(v, 2ull << 30);
  cr_assert_eq(kv_parse_size("1TB", &v), 0); cr_assert_eq(v, 1ull << 40);
  const char *bad[] = {"", "G", "-1", "1X", "12 34", "1.5G", "99999999999999999999", "16777216T", NULL};
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
  cr_assert_eq(kv_config_set(&c, "log.level", "chatty", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL);
  /* G1: enable and backend are closed sets; a pool needs bytes. */
  kv_config_defaults(&c);
  cr_assert_str_eq(c.g1_enable, "auto");
  cr_assert_str_eq(c.g1_backend, "auto");
  cr_assert_eq(c.g1_capacity, 1ull << 30);
  cr_assert_str_eq(c.g1_device, "0");
  cr_assert_eq(kv_config_set(&c, "g1.enable", "maybe", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "g1.enable"), "%s", err);
  kv_config_defaults(&c);
  cr_assert_eq(kv_config_set(&c, "g1.backend", "opencl", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL);
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
  static const char *const bad[] = {"", " ", "0,", ",0", "0,,1", "1,1", "256", "99999999999",
                                    "-1", "0x1", "a", "0 1", "0,1,2,3,4,5,6,7,8"};
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
  cr_assert_eq(kv_config_load(&file, KV_SOURCE_DIR "/deploy/kvcached.conf", err, sizeof err), 0, "%s", err);
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
  cr_assert_eq(kv_config_set(&c, "tenant.alice.uids", "no-such-user-kvcached", err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "tenant.alice.uids") && strstr(err, "no-such-user-kvcached"), "%s", err);
  cr_assert_eq(kv_config_set(&c, "tenant.alice.gids", "no-such-group-kvcached", err, sizeof err), -EINVAL);
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
  static const struct { const char *opt, *val, *says; } bad[] = {
      {"g3.queue_depth", "1000000", "g3.queue_depth"},
      {"g3.queue_depth", "0", "g3.queue_depth"},
      {"g3.block_bytes", "0", "g3.block_bytes"},
      {"g3.block_bytes", "8G", "larger than g3.capacity"},
      {"g3.block_bytes", "4000K", "holds no slot"}, /* 1M + 4K + 4000K > 4M */
      {"g3.path", "/a,/b,/a", "names /a twice"},
      {"g3.path", " , ", "names no directory"},
      {"daemon.socket_dir", "/tmp/0123456789012345678901234567890123456789012345678901234567890123456789012345678901234",
       "daemon.socket_dir"},
  };
  char err[256];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    kv_config c;
    kv_config_defaults(&c);
    cr_assert_eq(kv_config_set(&c, "g3.capacity", "4M", err, sizeof err), 0);
    cr_assert_eq(kv_config_set(&c, bad[i].opt, bad[i].val, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL, "%s = %s", bad[i].opt, bad[i].val);
    cr_assert(strstr(err, bad[i].says), "%s = %s: %s", bad[i].opt, bad[i].val, err);
    findings f = {0};
    cr_assert_eq(kv_config_check(&c, 0, collect, &f), -EINVAL);
    cr_assert_eq(f.refused, 1, "%s = %s: one finding, not %d", bad[i].opt, bad[i].val, f.refused);
  }
  /* Without G3 its sizes do not matter; more than 64 directories do. */
  kv_config c;
  kv_config_defaults(&c);
  cr_assert_eq(kv_config_set(&c, "g3.block_bytes", "0", err, sizeof err), 0);
  cr_assert_eq(kv_config_set(&c, "g3.path", "", err, sizeof err), 0);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), 0, "%s", err);
  char many[256] = "";
  for (int i = 0; i < 65; i++) snprintf(many + strlen(many), sizeof many - strlen(many), "%sd%d", i ? "," : "", i);
  cr_assert_eq(kv_config_set(&c, "g3.path", many, err, sizeof err), 0, "%s", err);
  cr_assert_eq(kv_config_validate(&c, err, sizeof err), -EINVAL);
  cr_assert(strstr(err, "more than 64"), "%s", err);
  /* Every refusal is reported, not only the first. */
  kv_config_defaults(&c);
  kv_config_set(&c, "g3.queue_depth", "0", err, sizeof err);
  kv_config_set(&c, "g3.block_bytes", "0", err, sizeof err);
  kv_config_set(&c, "log.level", "chatty", err, sizeof err);
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
