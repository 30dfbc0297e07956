/*
 * test_proto_doc.c - proto/PROTOCOL.md says what the code does: every
 * error code of base/errors.h with its numeric value, every opcode with
 * its value, every limit with its value, the header size and magic. A new
 * error, opcode or limit fails this test until it is documented.
 */
#include "proto/wire.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ROWS 512

/* The table rows of PROTOCOL.md, as trimmed first and second cells. */
static char cell0[MAX_ROWS][96], cell1[MAX_ROWS][96];
static int nrows;

static void trim_into(char *dst, size_t cap, const char *s, size_t n) {
  while (n && (*s == ' ' || *s == '\t')) s++, n--;
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) n--;
  if (n >= cap) n = cap - 1;
  memcpy(dst, s, n);
  dst[n] = 0;
}

static void load_doc(void) {
  FILE *f = fopen(KV_SOURCE_DIR "/proto/PROTOCOL.md", "r");
  cr_assert_not_null(f, "proto/PROTOCOL.md is missing");
  char line[1024];
  nrows = 0;
  while (fgets(line, sizeof line, f) && nrows < MAX_ROWS) {
    if (line[0] != '|') continue;
    char *a = line + 1, *b = strchr(a, '|');
    if (!b) continue;
    char *c = strchr(b + 1, '|');
    if (!c) continue;
    trim_into(cell0[nrows], sizeof cell0[0], a, (size_t)(b - a));
    trim_into(cell1[nrows], sizeof cell1[0], b + 1, (size_t)(c - b - 1));
    nrows++;
  }
  fclose(f);
}

/* A row whose first cell is `first` and second `second`. */
static int has_row(const char *first, const char *second) {
  for (int i = 0; i < nrows; i++)
    if (!strcmp(cell0[i], first) && !strcmp(cell1[i], second)) return 1;
  return 0;
}

/* The number that starts the second cell of the row named `name`. */
static long long row_value(const char *name) {
  for (int i = 0; i < nrows; i++)
    if (!strcmp(cell0[i], name)) return strtoll(cell1[i], NULL, 10);
  return -1;
}

Test(protocol_md, documents_every_error_code) {
  load_doc();
  char v[32], n[64];
#define CHECK_ERR(name, off, msg)           \
  snprintf(v, sizeof v, "%d", KV_E##name);  \
  snprintf(n, sizeof n, "`KV_E%s`", #name); \
  cr_assert(has_row(v, n), "PROTOCOL.md lacks the row | %s | %s |", v, n);
  KV_ERRNO_MAP(CHECK_ERR)
#undef CHECK_ERR
}

Test(protocol_md, documents_every_opcode) {
  load_doc();
  for (unsigned op = KV_OP_HELLO; op < KV_OP_COUNT; op++) {
    char v[16], n[64];
    snprintf(v, sizeof v, "%u", op);
    snprintf(n, sizeof n, "`%s`", kv_op_name((uint16_t)op));
    cr_assert(has_row(v, n), "PROTOCOL.md lacks the row | %s | %s |", v, n);
  }
}

Test(protocol_md, documents_every_limit) {
  load_doc();
  static const struct {
    const char *name;
    long long value;
  } lim[] = {
      {"`KV_HDR_SIZE`", KV_HDR_SIZE},
      {"`KV_BATCH_MAX`", KV_BATCH_MAX},
      {"`KV_KEY_MAX`", KV_KEY_MAX},
      {"`KV_TENANT_MAX`", KV_TENANT_MAX},
      {"`KV_GROUP_MAX`", KV_GROUP_MAX},
      {"`KV_SALT_MAX`", KV_SALT_MAX},
      {"`KV_DTYPE_MAX`", KV_DTYPE_MAX},
      {"`KV_TIERINFO_MAX`", KV_TIERINFO_MAX},
      {"`KV_TIERINFO_BYTES_MAX`", KV_TIERINFO_BYTES_MAX},
      {"`KV_ERRMSG_MAX`", KV_ERRMSG_MAX},
      {"`KV_INLINE_MAX`", KV_INLINE_MAX},
      {"`KV_PAYLOAD_MAX_CTRL`", KV_PAYLOAD_MAX_CTRL},
      {"`KV_PAYLOAD_MAX_DATA`", KV_PAYLOAD_MAX_DATA},
      {"`KV_STATUS_TEXT_MAX`", KV_STATUS_TEXT_MAX},
      {"`KV_PUT_OVERHEAD`", KV_PUT_OVERHEAD},
  };
  for (size_t i = 0; i < sizeof lim / sizeof lim[0]; i++)
    cr_assert_eq(row_value(lim[i].name), lim[i].value, "PROTOCOL.md: %s should be %lld",
                 lim[i].name, lim[i].value);
}

/* The BATCH flag bits, in section 7's table of them. */
Test(protocol_md, documents_the_batch_flags) {
  load_doc();
  static const struct {
    const char *name;
    unsigned value;
  } fl[] = {{"`KV_DEL_ALL`", KV_DEL_ALL},
            {"`KV_COMMIT_CRC`", KV_COMMIT_CRC},
            {"`KV_REL_CORRUPT`", KV_REL_CORRUPT},
            {"`KV_LOOKUP_ALL`", KV_LOOKUP_ALL},
            {"`KV_COMMIT_G4`", KV_COMMIT_G4}};
  for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++) {
    char v[16];
    snprintf(v, sizeof v, "0x%02x", fl[i].value);
    cr_assert(has_row(fl[i].name, v), "PROTOCOL.md lacks the row | %s | %s |", fl[i].name, v);
  }
}

Test(protocol_md, documents_the_header) {
  load_doc();
  cr_assert(has_row("0", "4"), "magic at offset 0, 4 bytes");
  cr_assert(has_row("4", "2"), "version at offset 4");
  cr_assert(has_row("12", "4"), "length at offset 12");
  cr_assert(has_row("16", "8"), "id at offset 16");
  cr_assert(has_row("24", "4"), "status at offset 24");
  cr_assert_eq(KV_PROTO_MAGIC, 0x4443564Bu);
  cr_assert_eq(KV_PROTO_MAJOR, 1);
}
