/* gpu_test_dev.c - the G1 device checks of test_dev.c (dev_checks.h) on a
 * CUDA device: AUTO picks CUDA, VMM export/import across fork, the legacy
 * IPC fallback forced by KV_DEV_LEGACY_IPC=1, batch copies, FIFO, refusals,
 * injected failures, close with copies in flight, a random run against a
 * memcpy model. Each check runs in a process of its own (a CUDA context
 * does not survive fork(), and the sharing checks fork). Exit: 0 all
 * passed, 1 a check failed, 77 no CUDA device here (with the reason). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/lib/dev_checks.h"

static const char *check_auto_is_cuda(void) {
  char why[KV_DEV_REASON_MAX];
  kv_dev *d = NULL;
  kv_dev_opts o = {.reason = why, .reason_len = sizeof why};
  unsetenv("KV_DEV_BACKEND");
  DC_OK(kv_dev_open(&d, &o));
  DC_REQ(kv_dev_backend_of(d) == KV_DEV_CUDA, "AUTO chose %s: %s",
         kv_dev_backend_name(kv_dev_backend_of(d)), why);
  uint8_t u[16];
  kv_dev_uuid(d, u);
  kv_dev *e = NULL;
  o = (kv_dev_opts){.backend = KV_DEV_CUDA, .uuid = u};
  DC_OK(kv_dev_open(&e, &o));
  DC_REQ(kv_dev_ordinal(e) == kv_dev_ordinal(d), "opened by uuid: another ordinal");
  kv_dev_close(e);
  kv_dev_close(d);
  return NULL;
fail:
  kv_dev_close(d);
  return dc_msg;
}

/* The pool's export kind with the current environment. */
static const char *check_kind(int want) {
  kv_dev *d = NULL;
  kv_dev_pool *p;
  DC_OK(dc_open(&d, KV_DEV_CUDA, NULL));
  int rc = kv_dev_pool_create(d, 3 << 20, &p);
  DC_REQ(rc == 0, "pool_create = %d: %s", rc, kv_dev_reason(d));
  kv_dev_export x;
  DC_OK(kv_dev_pool_export(p, &x));
  DC_REQ(x.kind == want, "export kind %u, want %d (%s)", x.kind, want, kv_dev_reason(d));
  DC_REQ(want != KV_DEVX_VMM_FD || x.fd >= 0, "VMM export without an fd");
  printf("    pool of %zu bytes exported as kind %u%s%s\n", kv_dev_pool_bytes(p), x.kind,
         kv_dev_reason(d)[0] ? ": " : "", kv_dev_reason(d));
  DC_OK(kv_dev_pool_destroy(d, p));
  kv_dev_close(d);
  return NULL;
fail:
  kv_dev_close(d);
  return dc_msg;
}

static const char *c_auto(void) { return check_auto_is_cuda(); }
static const char *c_codec(void) { return dc_export_codec(); }
static const char *c_vmm_kind(void) { return check_kind(KV_DEVX_VMM_FD); }
static const char *c_vmm_share(void) { return dc_share_fork(KV_DEV_CUDA); }
static const char *c_legacy_kind(void) {
  setenv("KV_DEV_LEGACY_IPC", "1", 1);
  return check_kind(KV_DEVX_LEGACY_IPC);
}
static const char *c_legacy_share(void) {
  setenv("KV_DEV_LEGACY_IPC", "1", 1);
  return dc_share_fork(KV_DEV_CUDA);
}
static const char *c_import(void) { return dc_import_errors(KV_DEV_CUDA); }
static const char *c_batch(void) { return dc_batch(KV_DEV_CUDA); }
static const char *c_fifo(void) { return dc_fifo(KV_DEV_CUDA); }
static const char *c_conc(void) { return dc_concurrent(KV_DEV_CUDA); }
static const char *c_refuse(void) { return dc_refusals(KV_DEV_CUDA); }
static const char *c_inject(void) { return dc_inject(KV_DEV_CUDA); }
static const char *c_close(void) { return dc_close_inflight(KV_DEV_CUDA); }
static const char *c_batcher(void) { return dc_batcher(KV_DEV_CUDA); }
static const char *c_random(void) { return dc_random(KV_DEV_CUDA, 2000, 777); }
static const char *c_shared_host(void) { return dc_shared_host(KV_DEV_CUDA); }
/* What a worker asks the daemon for: the current device's uuid is the one
 * kv_dev_open gives device 0 (the default current device). */
static const char *check_current_uuid(void) {
  kv_dev *d = NULL;
  uint8_t cur[16], u[16];
  DC_OK(kv_dev_current_uuid(cur));
  DC_OK(dc_open(&d, KV_DEV_CUDA, NULL));
  kv_dev_uuid(d, u);
  DC_REQ(!memcmp(cur, u, 16), "current device uuid differs from device 0's");
  kv_dev_close(d);
  return NULL;
fail:
  kv_dev_close(d);
  return dc_msg;
}

static const struct {
  const char *name;
  const char *(*fn)(void);
} checks[] = {
    {"auto_is_cuda", c_auto},
    {"export_codec", c_codec},
    {"vmm_export_kind", c_vmm_kind},
    {"vmm_share_fork", c_vmm_share},
    {"legacy_kind", c_legacy_kind},
    {"legacy_share_fork", c_legacy_share},
    {"import_refusals", c_import},
    {"batches", c_batch},
    {"fifo", c_fifo},
    {"directions_at_once", c_conc},
    {"refusals", c_refuse},
    {"injected_failure", c_inject},
    {"close_inflight", c_close},
    {"random_vs_model", c_random},
    {"batcher", c_batcher},
    {"host_range_two_devices", c_shared_host},
    {"current_uuid", check_current_uuid},
};

/* Runs fn in a child; its exit status (0 pass, 1 fail, 77 skip). */
static int in_child(const char *(*fn)(void)) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    const char *m = fn();
    if (m) fprintf(stderr, "    %s\n", m);
    fflush(stdout);
    _exit(m ? 1 : 0);
  }
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return 1;
  if (WIFSIGNALED(st)) {
    fprintf(stderr, "    killed by signal %d\n", WTERMSIG(st));
    return 1;
  }
  return WEXITSTATUS(st);
}

static const char *probe(void) {
  char why[KV_DEV_REASON_MAX] = "";
  kv_dev *d = NULL;
  kv_dev_opts o = {.backend = KV_DEV_CUDA, .reason = why, .reason_len = sizeof why};
  if (kv_dev_open(&d, &o)) {
    printf("no CUDA device: %s\n", why);
    fflush(stdout);
    _exit(77);
  }
  kv_dev_close(d);
  return NULL;
}

int main(void) {
  unsetenv("KV_DEV_LEGACY_IPC");
  int rc = in_child(probe);
  if (rc == 77) return 77;
  if (rc) {
    fprintf(stderr, "gpu_test_dev: the device probe failed\n");
    return 1;
  }
  int failed = 0;
  for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
    rc = in_child(checks[i].fn);
    printf("%-4s %s\n", rc ? "FAIL" : "ok", checks[i].name);
    failed += rc != 0;
  }
  printf("gpu_test_dev: %zu checks, %d failed\n", sizeof checks / sizeof checks[0], failed);
  return failed ? 1 : 0;
}
