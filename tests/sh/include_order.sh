#!/usr/bin/env bash
# include_order.sh - the folders depend one way only (tools/dev/layers.sh):
# the tree passes, and a copy of it with any one back-edge of the kinds the
# tree once had fails, naming the file: a tier including the daemon's
# logger, the protocol including a tier's header, the daemon including the
# core's internal header, a folder's CMakeLists
# compiling another folder's source, a library linking one beside it.
# Calls too, read from this build's objects: the build passes, and a copy
# of its objects with one call back up planted (linked into the caller's
# object with ld -r) fails, naming the caller: each of the knots the tree
# once had, inside the daemon, the core and libkvclient, and a tier calling
# the daemon; a new source not placed in its folder's order fails too.
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
copy
touch "$T/tree/daemon/newpart.c"
expect_exit 1 "a source not placed in daemon/'s order is refused" \
  bash "$SRC/tools/dev/layers.sh" "$T/tree"
check "  and the report names it" grep -q "^daemon/newpart.c: not placed" "$T/out"

B=$(dirname "$BIN")
expect_exit 0 "the build's objects call one way" bash "$SRC/tools/dev/layers.sh" "$SRC" "$B"
objects() { # a copy of the build's objects (not the tests') in $T/b
  rm -rf "$T/b" && mkdir -p "$T/b"
  (cd "$B" && find . -path ./tests -prune -o -path '*/CMakeFiles/*.dir/*.o' -print |
     tar -cf - -T -) | tar -C "$T/b" -xf - || exit 1
}
plants() { # plants "description" OBJECT SYMBOL CALLER: OBJECT calls SYMBOL; refused, naming CALLER
  objects
  printf 'extern void %s(void);\nvoid kv_planted_call(void) { %s(); }\n' "$3" "$3" >"$T/plant.c"
  cc -c -o "$T/plant.o" "$T/plant.c" && ld -r -o "$T/merged.o" "$T/b/$2" "$T/plant.o" &&
    mv "$T/merged.o" "$T/b/$2" || exit 1
  expect_exit 1 "$1 is refused" bash "$SRC/tools/dev/layers.sh" "$SRC" "$T/b"
  check "  and the report names $4 calling $3" grep -q "^$4: calls $3 of " "$T/out"
}
D=daemon/CMakeFiles/kvdaemon.dir
plants "G3's watch calling the daemon's start (kvd.c)" $D/g3_watch.c.o kvd_init daemon/g3_watch
plants "G4 calling LOOKUP's handler" $D/g4.c.o kvd_handle daemon/g4
plants "a metric calling the stats routes" $D/metrics.c.o kvd_stats_json daemon/metrics
plants "the worker socket calling the loop" $D/server.c.o kvd_main daemon/server
plants "LOAD calling the opcode table" $D/load.c.o kvd_handle daemon/load
plants "the core calling G3's moves" tiers/CMakeFiles/kvtiers.dir/core.c.o kv_core_attach_g3 \
  tiers/core
plants "libkvclient's session calling the engine's side" \
  client/CMakeFiles/kvclient.dir/client.c.o kvc_g2_register_cuda client/client
plants "the core calling the daemon" tiers/CMakeFiles/kvtiers.dir/core.c.o kvd_main tiers/core
check "  (said as a folder not below)" grep -q "daemon/ is not below tiers/" "$T/out"
objects
expect_exit 0 "an untouched copy of the objects passes" \
  bash "$SRC/tools/dev/layers.sh" "$SRC" "$T/b"
finish
