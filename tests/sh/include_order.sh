#!/usr/bin/env bash
# include_order.sh - the folders depend one way only (tools/dev/layers.sh):
# the tree passes, and a copy of it with any one back-edge of the kinds the
# tree once had fails, naming the file: a tier including the daemon's
# logger, the protocol including a tier's header, the daemon including the
# core's internal header, a folder's CMakeLists
# compiling another folder's source, a library linking one beside it.
source "$(dirname "$0")/lib.bash"

expect_exit 0 "the tree depends one way" bash "$SRC/tools/dev/layers.sh" "$SRC"

# A copy of the source folders, to break one edge at a time.
copy() {
  rm -rf "$T/tree" && mkdir -p "$T/tree/tools/dev"
  (cd "$SRC" && cp -r base proto ipc tiers cuda client daemon tools "$T/tree/") || exit 1
}
breaks() { # breaks "description" FILE TEXT: FILE gets TEXT appended; the check must fail naming FILE
  copy
  printf '%s\n' "$3" >>"$T/tree/$2"
  expect_exit 1 "$1 is refused" bash "$SRC/tools/dev/layers.sh" "$T/tree"
  check "  and the report names $2" grep -q "^$2:" "$T/out"
}
breaks "tiers/ including daemon/'s header" tiers/core.c '#include "daemon/kvd.h"'
breaks "proto/ including a tier's header" proto/wire.h '#include "tiers/block.h"'
breaks "base/ including proto/" base/log.c '#include "proto/wire.h"'
breaks "cuda/ including tiers/ (beside it)" cuda/dev.c '  #  include "tiers/arena.h"'
breaks "client/ including daemon/ (beside it)" client/client.c '#include "daemon/config.h"'
breaks "daemon/ including the core's insides" daemon/stats.c '#include "tiers/core_int.h"'
breaks "client/ including the device's insides" client/engine.c '#include "cuda/dev_int.h"'
breaks "ipc/ including client/" ipc/sock.h '#include "client/kvclient.h"'
breaks "daemon/ compiling a tier's source" daemon/CMakeLists.txt 'target_sources(kvdaemon PRIVATE ${CMAKE_SOURCE_DIR}/tiers/core_admin.c)'
breaks "client/ compiling the protocol's source" client/CMakeLists.txt 'set(X ${CMAKE_SOURCE_DIR}/proto/wire.c)'
breaks "tiers/ linking the daemon" tiers/CMakeLists.txt 'target_link_libraries(kvtiers PUBLIC kvdaemon)'
copy
expect_exit 0 "an untouched copy passes" bash "$SRC/tools/dev/layers.sh" "$T/tree"
finish
