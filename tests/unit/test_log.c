/* test_log.c - the daemon's log lines: their shape, the rate limit on
 * repeated warnings, and that stderr stays the sink unless it is really
 * the journal. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"

static FILE *capture;

/* Sends stderr to a temporary file for the rest of the test. */
static void capture_stderr(void) {
  capture = tmpfile();
  cr_assert_not_null(capture);
  cr_assert_geq(dup2(fileno(capture), 2), 0);
}

static int count_lines(const char *needle, char *first, size_t firstlen) {
  fflush(stderr);
  rewind(capture);
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, capture))
    if (strstr(line, needle)) {
      if (n++ == 0 && first) snprintf(first, firstlen, "%s", line);
    }
  return n;
}

Test(log, lines_have_time_level_subsystem_and_message) {
  capture_stderr();
  kv_warn("g3", "disk %s is %d%% full", "nvme0", 97);
  char line[512] = "";
  cr_assert_eq(count_lines("disk nvme0 is 97% full", line, sizeof line), 1);
  /* 2026-11-21T04:14:46.945Z warn g3: disk nvme0 is 97% full */
  int y, mo, d, h, mi, s, ms;
  char lvl[16], sub[16];
  cr_assert_eq(
      sscanf(line, "%d-%d-%dT%d:%d:%d.%dZ %15s %15[^:]:", &y, &mo, &d, &h, &mi, &s, &ms, lvl, sub),
      9, "unexpected shape: %s", line);
  cr_assert_str_eq(lvl, "warn");
  cr_assert_str_eq(sub, "g3");
  cr_assert_eq(kv_log_to_journal(), 0);
}

Test(log, repeated_warnings_are_rate_limited_per_format) {
  capture_stderr();
  for (int i = 0; i < KV_LOG_BURST + 15; i++) kv_warn("g3", "read of slot %d failed", i);
  for (int i = 0; i < 3; i++) kv_error("net", "peer %d went away", i);
  cr_assert_eq(count_lines("read of slot", NULL, 0), KV_LOG_BURST, "only a burst gets through");
  cr_assert_eq(count_lines("went away", NULL, 0), 3, "another format has its own budget");
  cr_assert_eq(kv_log_suppressed(), 15);
}

Test(log, info_lines_below_the_threshold_cost_nothing_and_print_nothing) {
  capture_stderr();
  kv_log_threshold = KV_LOG_WARN;
  kv_info("daemon", "ready");
  kv_log_threshold = KV_LOG_INFO;
  kv_info("daemon", "ready again");
  cr_assert_eq(count_lines("ready", NULL, 0), 1);
}

/* JOURNAL_STREAM naming some other file than stderr: stderr stays the
 * sink (systemd sets it for the service's stderr only). */
Test(log, a_journal_stream_that_is_not_stderr_is_ignored) {
  struct stat st;
  cr_assert_eq(stat("/", &st), 0);
  char v[64];
  snprintf(v, sizeof v, "%lu:%lu", (unsigned long)st.st_dev, (unsigned long)st.st_ino);
  setenv("JOURNAL_STREAM", v, 1);
  capture_stderr();
  kv_warn("daemon", "still on stderr");
  cr_assert_eq(count_lines("still on stderr", NULL, 0), 1);
  cr_assert_eq(kv_log_to_journal(), 0);
}
