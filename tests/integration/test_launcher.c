/* test_launcher.c - the tests' daemon launcher (tests/lib/daemon.h) on a
 * real kvcached: configuration text in an existing directory, its socket
 * paths, a kill and a restart in the same directory, an exit before
 * serving reported with its status, and a fresh directory removed. */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "base/paths.h"
#include "tests/lib/daemon.h"
#include "tests/lib/metrics.h"
#include "tests/lib/tmpdir.h"

static const char *const base_args[] = {
    "--g2-capacity", "2M", "--set", "g2.lock=no", "--g3-path", "", "--log-level", "warn", NULL};

static long long stat_of(const kvt_daemon *d, const char *path) {
  static char resp[1 << 20];
  const char *body;
  cr_assert_eq(kvt_http(d->stats, "GET", "/stats", resp, sizeof resp, &body), 200);
  json_t *o = json_loads(body, 0, NULL);
  cr_assert_not_null(o, "%s", body);
  long long v = -1;
  cr_assert_eq(kvt_json_num(o, path, &v), 0, "%s", path);
  json_decref(o);
  return v;
}

Test(launcher, config_text_in_an_existing_directory_then_restart, .timeout = 60) {
  char dir[64], want[192];
  cr_assert_eq(kvt_mkdtemp(dir, sizeof dir, "kvt-launcher"), 0);
  kvt_daemon d;
  const char *const args[] = {"--set", "g2.lock=no", "--g3-path", "", "--log-level", "warn", NULL};
  kvt_daemon_opts o = {.dir = dir, .config = "[g2]\ncapacity = 3M\npage_size = 1M\n", .args = args};
  cr_assert_eq(kvt_daemon_start(&d, &o), 0);
  snprintf(want, sizeof want, "%s/%s", dir, KV_SOCKET_NAME);
  cr_assert_str_eq(d.sock, want);
  snprintf(want, sizeof want, "%s/%s", dir, KV_STATS_SOCKET_NAME);
  cr_assert_str_eq(d.stats, want);
  snprintf(want, sizeof want, "%s/%s", dir, KV_ADMIN_SOCKET_NAME);
  cr_assert_str_eq(d.admin, want);
  cr_assert_eq(stat_of(&d, "tiers.g2.capacity_bytes"), 3 << 20, "the configuration text was read");
  int st = kvt_daemon_kill(&d, SIGKILL);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  cr_assert_eq(d.pid, 0);
  cr_assert_eq(kvt_daemon_kill(&d, SIGTERM), -ECHILD, "nothing left to signal");
  cr_assert_eq(kvt_daemon_restart(&d), 0, "a restart in the same directory");
  cr_assert_eq(stat_of(&d, "tiers.g2.capacity_bytes"), 3 << 20);
  cr_assert_eq(kvt_daemon_stop(&d), 0, "a clean stop");
  kvt_daemon_free(&d);
  struct stat sb;
  cr_assert_eq(stat(dir, &sb), 0, "a directory it did not make stays");
  cr_assert_eq(kvt_rmtree(dir), 0);
}

Test(launcher, an_exit_before_serving_gives_its_status, .timeout = 60) {
  const char *const sets[] = {"no.such_option=1", NULL};
  kvt_daemon d;
  kvt_daemon_opts o = {.args = base_args, .sets = sets};
  int rc = kvt_daemon_start(&d, &o);
  cr_assert_gt(rc, 0, "kvcached refused its configuration: %d", rc);
  cr_assert_eq(d.pid, 0);
  struct stat sb;
  cr_assert_neq(stat(d.dir, &sb), 0, "the fresh directory is gone");
  kvt_daemon_free(&d);
}
