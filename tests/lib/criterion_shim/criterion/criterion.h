/*
 * criterion.h (shim) - the few criterion macros tests/unit/test_presence_table.c
 * uses, as plain C, so that its tests can run as one program under
 * ThreadSanitizer (criterion's own runner does not start under TSan:
 * tests/sh/presence_tsan.sh). Test(suite, name) defines suite_name(); an
 * assertion that fails prints where and aborts.
 */
#ifndef KV_TESTS_CRITERION_SHIM_H
#define KV_TESTS_CRITERION_SHIM_H

#include <stdio.h>
#include <stdlib.h>

#define Test(suite, name, ...) void suite##_##name(void)
#define cr_assert(c, ...)                                            \
  do {                                                               \
    if (!(c)) {                                                      \
      fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #c); \
      abort();                                                       \
    }                                                                \
  } while (0)
#define cr_assert_eq(a, b, ...)  cr_assert((a) == (b))
#define cr_assert_neq(a, b, ...) cr_assert((a) != (b))
#define cr_assert_gt(a, b, ...)  cr_assert((a) > (b))
#define cr_assert_geq(a, b, ...) cr_assert((a) >= (b))
#define cr_log_info(...)         (printf(__VA_ARGS__), printf("\n"), fflush(stdout))

#endif
