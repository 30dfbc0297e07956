#!/usr/bin/env bash
# outside_paths.sh - checks that no tracked file names a path outside the
# repository: a clone must find everything the tree points at inside
# itself, or in the system places a deployment owns.
#
# What is checked: every file `git ls-files` lists (text files only; a
# tracked symbolic link by its target). A path is a run of the characters
# [A-Za-z0-9_.+@%~/-]; what stands right before the run (a quote, a
# bracket, a `$`, a `)`) says where the path starts from.
#
# Rule 1, climbing out. A path with a `..` component and a `/` is
# resolved from the folder of the file that names it (a Markdown link, an
# #include, the part after `$(dirname "$0")` or `${root}`). It is refused
# when
#   a. it climbs above the repository's root from there, or
#   b. what it names from there is not a tracked file or folder, and it
#      climbs above the root when read from the root instead: scripts and
#      documents mostly mean paths from the root or the working directory
#      (`$root` then `..`/data, or a doc in daemon/ that says "see
#      `..`/data/x"), and a path that names nothing in the tree from its
#      own folder means that.
#   A leading `$NAME/` is a variable's value, so the path starts after it;
#   a component cut short by `$`, `*`, `?`, `{` or `[` is left out of the
#   existence check. A bare `..` without a `/` is not a path here (ranges
#   in prose, jq's `..`); neither are Python's os.path.join(x, "..") parts.
# Rule 2, absolute paths of a development machine. A path under a
#   top-level folder that holds people's own files rather than the
#   system's (home, root, Users, work, workspace, workspaces, scratch), or
#   under the checkout's own absolute path wherever it lies, is refused.
#   System paths a deployment uses (/etc, /run, /var, /usr, /opt, /tmp,
#   /dev, /proc, /sys, /mnt, ...) are fine, and so are `~/` paths (the
#   running user's). A run that follows `)`, `}` or `$` is the rest of an
#   expanded path, not an absolute one.
# Rule 3, links. A tracked symbolic link whose target is absolute, or
#   climbs above the root from the link's folder, is refused.
#
# Nothing is allowed by exception. Should a legitimate case need one, add
# it as a narrow, commented rule here, never a blanket skip of a file.
#
# Usage: outside_paths.sh [ROOT]  (default: the tree this script is in; it
# must be the top of a git checkout). Prints each violation as FILE:LINE:
# what (FILE: for a link), and exits 1 if there is any, 0 if none, 2 when
# ROOT is not a git checkout.
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root" || exit 2
top=$(git rev-parse --show-toplevel 2>/dev/null) || {
  echo "outside_paths.sh: $root is not a git checkout" >&2
  exit 2
}
here=$(pwd -P)
if [ "$(cd "$top" && pwd -P)" != "$here" ]; then
  echo "outside_paths.sh: $root is not the top of its git checkout ($top is)" >&2
  exit 2
fi

PATHCH='A-Za-z0-9_.+@%~/-'
HOMES='home|root|Users|work|workspace|workspaces|scratch'

# Every tracked file and every folder above one: what a path may name
# (keyed with a leading /, the root being "/").
declare -A known=([/]=1)
files=()
links=()
while IFS= read -r -d '' ent; do
  meta=${ent%%$'\t'*}
  f=${ent#*$'\t'}
  mode=${meta%% *}
  known[/$f]=1
  d=$f
  while [[ $d == */* ]]; do
    d=${d%/*}
    known[/$d]=1
  done
  case $mode in
    120000) links+=("$f") ;;
    160000) ;; # a submodule: no file here to read
    *) [ -f "$f" ] && files+=("$f") ;;
  esac
done < <(git ls-files -s -z)

bad=0
say() { echo "$1"; bad=1; }

# resolve DIR PATH: prints PATH read from folder DIR (both relative to the
# root), normalised; fails when it climbs above the root.
resolve() {
  local -a parts out=()
  local p
  IFS=/ read -ra parts <<<"$1/$2"
  for p in "${parts[@]}"; do
    case $p in
      '' | .) ;;
      ..)
        [ ${#out[@]} -gt 0 ] || return 1
        unset 'out[${#out[@]}-1]'
        ;;
      *) out+=("$p") ;;
    esac
  done
  local IFS=/
  echo "${out[*]}"
}

# climbs FILE LINE PATH CUT: rule 1 for PATH named in FILE (relative,
# from the folder of FILE); CUT=1 when its last component is cut short.
climbs() {
  local f=$1 n=$2 p=$3 cut=$4 dir r q
  dir=$(dirname "$f")
  [ "$dir" = . ] && dir=
  if ! r=$(resolve "$dir" "$p"); then
    if [ -n "$dir" ]; then
      say "$f:$n: '$p' climbs out of the repository from $dir/"
    else
      say "$f:$n: '$p' climbs out of the repository"
    fi
    return
  fi
  if [ "$cut" = 1 ]; then
    q=.
    [[ $p == */* ]] && q=${p%/*}
    r=$(resolve "$dir" "$q")
  fi
  [ -n "${known[/$r]+x}" ] && return
  if [ -n "$dir" ] && ! resolve "" "$p" >/dev/null; then
    say "$f:$n: '$p' names nothing in the tree from $dir/, and climbs out of it from the root"
  fi
}

# absolute FILE LINE PATH: rule 2.
absolute() {
  local f=$1 n=$2 p=$3
  while [[ $p == //* ]]; do p=${p#/}; done
  if [[ $p =~ ^/($HOMES)/ ]]; then
    say "$f:$n: '$p' is a path of a development machine (/${BASH_REMATCH[1]}/...)"
  elif [ "$here" != / ] && { [ "$p" = "$here" ] || [[ $p == "$here"/* ]]; }; then
    say "$f:$n: '$p' is this checkout's own absolute path"
  fi
}

# check_line FILE LINE TEXT: every path-like run of TEXT against rules 1, 2.
check_line() {
  local f=$1 n=$2 rest=$3 tok pre ctx nxt cut
  while [[ $rest =~ [$PATHCH]+ ]]; do
    tok=${BASH_REMATCH[0]}
    pre=${rest%%"$tok"*}
    ctx=${pre: -1}
    rest=${rest:${#pre}+${#tok}}
    nxt=${rest:0:1}
    cut=0
    [[ $nxt == [\$*?{[] ]] && [[ $tok != */ ]] && cut=1
    if [ "$ctx" = '$' ]; then
      # $NAME/rest: the variable is the start, the rest is relative to it
      [[ $tok == */* ]] || continue
      tok=${tok#*/}
      ctx=')'
    fi
    # an absolute path, unless it follows an expansion or starts by
    # climbing (`"$(dirname "$0")"/..`: what comes before is the start)
    if [[ $tok == /* ]] && [[ $ctx != [\)\}] ]] && [[ /$tok/ != //../* ]]; then
      absolute "$f" "$n" "$tok"
      continue
    fi
    [[ $tok == */* ]] || continue
    [[ /$tok/ == */../* ]] || continue
    climbs "$f" "$n" "${tok#/}" "$cut"
  done
}

# Lines worth a closer look: a `..` beside a `/`, a home-like top folder,
# or the checkout's own path.
esc_here=$(sed 's/[][\.*^$+?(){}|]/\\&/g' <<<"$here")
pattern="\\.\\./|/\\.\\.|/($HOMES)/|$esc_here"
if [ ${#files[@]} -gt 0 ]; then
  while IFS= read -r -d '' f && IFS= read -r rest; do
    n=${rest%%:*}
    check_line "$f" "$n" "${rest#*:}"
  done < <(printf '%s\0' "${files[@]}" | xargs -0 grep -nIHZE -e "$pattern" -- 2>/dev/null)
fi

for l in "${links[@]}"; do
  if [ -L "$l" ]; then
    t=$(readlink "$l")
  else
    t=$(git cat-file -p ":$l" 2>/dev/null) # a checkout without symbolic links
  fi
  if [[ $t == /* ]]; then
    say "$l: a link to the absolute path '$t'"
    continue
  fi
  dir=$(dirname "$l")
  [ "$dir" = . ] && dir=
  resolve "$dir" "$t" >/dev/null || say "$l: a link to '$t', out of the repository"
done
exit $bad
