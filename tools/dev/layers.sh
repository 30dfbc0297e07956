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
# Usage: layers.sh [ROOT]  (default: the tree this script is in). Prints
# each violation as FILE:LINE: what; exits 1 if there is any, 0 otherwise.
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
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
  while IFS= read -r cm; do
    while IFS=: read -r line text; do
      for other in "${!rank[@]}"; do
        [ "$other" = "$dir" ] && continue
        if grep -qE "(CMAKE_SOURCE_DIR\}|\.\.)/$other/[^ )]*\.(c|cu)\b" <<<"$text"; then
          say "$cm:$line: $dir/ compiles a source of $other/"
        fi
      done
      if grep -q 'target_link_libraries' <<<"$text"; then
        for l in $(grep -oE '\bkv[a-z_]+\b' <<<"$text"); do
          to=${lib[$l]:-}
          [ -n "$to" ] || continue
          # a target's own name is the first word: not a dependency
          first=$(sed -E 's/.*target_link_libraries\(([^ ]+).*/\1/' <<<"$text")
          [ "$l" = "$first" ] && continue
          allowed "$dir" "$to" || say "$cm:$line: $dir/ links $l ($to/ is not below $dir/)"
        done
      fi
    done < <(grep -n '' "$cm")
  done < <(find "$dir" -name CMakeLists.txt -o -name '*.cmake')
done
exit $bad
