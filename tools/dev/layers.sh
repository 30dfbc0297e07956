#!/usr/bin/env bash
# layers.sh - checks that the source folders depend one way only:
#
#   base <- proto <- ipc <- {tiers, cuda} <- {client, daemon} <- tools
#
# A file may include headers of its own folder and of folders below it,
# never of a folder beside it or above it; a folder's internal headers
# (NAME_int.h, NAME_internal.h: e.g. the core's struct in tiers/core_int.h)
# only from inside that folder (and from tests/). Each folder's CMakeLists.txt
# builds only its own files (no source compiled by path from another
# folder) and links only the libraries of folders below it.
#
# Calls, with a build tree: inside a folder, too, files call one way. Each
# folder's sources are listed below (`order`), top to bottom, as layers:
# a file may call (reference a function or variable defined in) only files
# listed after it, and another folder's files only in a folder below its
# own. A lower file reports upward through a callback or an interface the
# upper file hands it, never by naming the upper file's function. The
# references are read from the objects' symbol tables (nm): what an object
# leaves undefined, matched with the object that defines it. A source
# missing from its folder's list, or listed but not in the tree, is a
# violation too: a new file is placed in its layer when it is added.
# Usage: layers.sh [ROOT [BUILD]]  (ROOT: default the tree this script is
# in; BUILD: a configured and built tree of ROOT, for the calls; without it
# only includes and CMake files are checked, and it says so). Prints each
# violation as FILE[:LINE]: what; exits 1 if there is any, 0 otherwise.
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
build=${2:-}
[ -z "$build" ] || build=$(cd "$build" && pwd) || exit 2
cd "$root" || exit 2

declare -A rank=([base]=0 [proto]=1 [ipc]=2 [tiers]=3 [cuda]=3 [client]=4 [daemon]=4 [tools]=5)
declare -A lib=([kvbase]=base [kvproto]=proto [kvipc]=ipc [kvtiers]=tiers [kvcuda]=cuda
                [kvclient]=client [kvclient_static]=client [kvdaemon]=daemon)
bad=0
say() { echo "$1"; bad=1; }
# may folder $1 use folder $2?
allowed() { [ "$1" = "$2" ] || [ "${rank[$2]}" -lt "${rank[$1]}" ]; }

for dir in "${!rank[@]}"; do
  [ -d "$dir" ] || continue
  # includes, in C, CUDA and header files (Python bindings are not C)
  while IFS=: read -r file line inc; do
    to=${inc%%/*}
    [ -n "${rank[$to]+x}" ] || continue
    allowed "$dir" "$to" || say "$file:$line: $dir/ includes $inc ($to/ is not below $dir/)"
    if [ "$to" != "$dir" ] && [[ $inc =~ _int(ernal)?\.h$ ]]; then
      say "$file:$line: $dir/ includes $inc, internal to $to/"
    fi
  done < <(grep -rnoE --include='*.c' --include='*.h' --include='*.cu' \
             '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[a-z_]+/[^"]+"' "$dir" |
           sed -E 's/:[[:space:]]*#[[:space:]]*include[[:space:]]+"/:/; s/"$//')
  # CMake: sources by path from other folders; libraries from folders not below
  # (bash's own regex matching: a fork per line is slow on a loaded machine)
  src_re='(CMAKE_SOURCE_DIR\}|\.\.)/([a-z]+)/[^ )]*\.(c|cu)([^a-z0-9_]|$)'
  link_re='target_link_libraries\(([^ )]+)(.*)'
  while IFS= read -r cm; do
    n=0
    while IFS= read -r text; do
      n=$((n + 1))
      rest=$text
      while [[ $rest =~ $src_re ]]; do
        other=${BASH_REMATCH[2]}
        if [ "$other" != "$dir" ] && [ -n "${rank[$other]+x}" ]; then
          say "$cm:$n: $dir/ compiles a source of $other/"
        fi
        rest=${rest#*"${BASH_REMATCH[0]}"}
      done
      [[ $text =~ $link_re ]] || continue
      # a target's own name is the first word: not a dependency
      for l in ${BASH_REMATCH[2]//[()]/ }; do
        to=${lib[$l]:-}
        [ -n "$to" ] || continue
        allowed "$dir" "$to" || say "$cm:$n: $dir/ links $l ($to/ is not below $dir/)"
      done
    done <"$cm"
  done < <(find "$dir" -name CMakeLists.txt -o -name '*.cmake')
done
# Each folder's sources, top to bottom (see the header). Within a line,
# too, a file calls only those after it; lines group a layer. The daemon's:
# its life (main, then kvd: start, stop, the loop); the sockets' two sides
# (admin, server: the worker socket); the operations (handlers: the opcode
# table, stats' routes and STATUS, load and alloc); the services they use
# (G4, the G3 watch, trust), then what operations and services share
# (replies, requests that wait, the G1 pools); the state under them all
# (sessions, reply sinks, the registry, HTTP, accept); at the bottom what
# every layer feeds (metrics, the ghost table) and the configuration.
# The core's (tiers/core*): hints, operator operations, G1's and G3's moves
# on top of core.c, every block's state, which reaches G3 only through the
# demotion callback core_g3.c hands it.
declare -A order=(
  [base]="log errors hex size buf crc32c"
  [proto]="wire_enc wire_dec wire presence"
  [ipc]="reader sock"
  [cuda]="batch dev
          dev_cuda dev_sim dev_none dev_done
          gpu_cuda gpu_none
          kernels kernels_host"
  [tiers]="core_hint core_admin core_g1 core_g3 core
           evict_policies evict_auto evict_adapt evict_reuse evict_arc evict_s3fifo
           evict_tinylfu evict_hint evict_mini evict evict_heap evict_util sessions index arena
           g3 g3_codec g3_rebuild g3_commit g3_threads g3_uring g3_pool g3_files g3_lmdb
           g3_format
           g4_cluster g4_format
           codec quant"
  [client]="engine client presence g1 chain_hash version"
  [daemon]="main
            kvd
            admin server
            handlers stats load alloc
            g4 g3_watch trust
            reply defer g1 g4_owed presence
            session sink registry http accept
            metrics ghost config"
  [tools]="kvbench bench_presence bench_replay bench_daemon bench_clients bench_scale bench_g3
           bench_core belady trace
           bench_codec quant_tool
           kvfile
           kvctl kvctl_ops kvctl_cli kvctl_http"
)

declare -A pos  # folder/file -> its place in the folder's order
for dir in "${!order[@]}"; do
  i=0
  for f in ${order[$dir]}; do
    pos[$dir/$f]=$i; i=$((i + 1))
    [ -e "$dir/$f.c" ] || [ -e "$dir/$f.cu" ] ||
      say "tools/dev/layers.sh: $dir/$f is listed in the order but has no source"
  done
  while IFS= read -r src; do
    f=${src##*/}; f=${f%.*}
    [ -n "${pos[$dir/$f]+x}" ] || say "$src: not placed in $dir/'s order (tools/dev/layers.sh)"
  done < <(find "$dir" -maxdepth 1 \( -name '*.c' -o -name '*.cu' \) | sort)
done
if [ -z "$build" ]; then
  echo "layers.sh: calls not checked (no build tree given)" >&2
  exit $bad
fi
# Objects of the folders' own targets (not tests/), as folder/file.
declare -A obj_of def
while IFS= read -r o; do
  rel=${o#"$build"/}; dir=${rel%%/*}
  [ -n "${rank[$dir]+x}" ] || continue
  f=${o##*.dir/}; f=${f%.o}; f=${f%.*}
  obj_of[$o]=$dir/$f
done < <(find "$build" -path "$build/tests" -prune -o -path '*/CMakeFiles/*.dir/*.o' -print)
[ ${#obj_of[@]} -gt 0 ] || { echo "layers.sh: no objects under $build: build it first" >&2; exit 2; }
# One nm for every definition, one for every reference: "object symbol".
objs=("${!obj_of[@]}")
while read -r o sym; do def[$sym]=${obj_of[$o]}; done < <(
  nm -A --defined-only -g "${objs[@]}" | awk 'NF == 3 { sub(/:[0-9a-f]*$/, "", $1); print $1, $3 }')
calls=$(while read -r o sym; do
  from=${obj_of[$o]}; fdir=${from%%/*}
  to=${def[$sym]:-}
  [ -n "$to" ] && [ "$to" != "$from" ] || continue
  tdir=${to%%/*}
  if [ "$tdir" != "$fdir" ]; then
    allowed "$fdir" "$tdir" || echo "$from: calls $sym of $to ($tdir/ is not below $fdir/)"
  elif [ -n "${pos[$from]+x}" ] && [ -n "${pos[$to]+x}" ] && [ "${pos[$to]}" -le "${pos[$from]}" ]; then
    echo "$from: calls $sym of $to, above it in $fdir/'s order (tools/dev/layers.sh)"
  fi
done < <(nm -A -u "${objs[@]}" | awk '{ sub(/:$/, "", $1); print $1, $NF }') | sort -u)
[ -z "$calls" ] || say "$calls"
exit $bad
