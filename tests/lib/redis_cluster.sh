#!/usr/bin/env bash
# redis_cluster.sh - a throwaway Redis Cluster on loopback for the G4 tests:
# N masters with R replicas each, every node in DIR/<port>/ (config, nodes.conf,
# log, pid file), ports chosen free at random in 12000..15999 (cluster bus
# ports +10000: below the ephemeral range).
#
#   redis_cluster.sh start DIR [--masters 3] [--replicas 1] [--password PW]
#                    [--node-timeout MS] [--owner PID]
#       starts the nodes, creates the cluster, waits until every node says
#       cluster_state:ok, knows every other node and every replica's link is
#       up; prints "ports P1 P2 ..." (masters first, as created) and writes
#       them to DIR/ports. With --owner, a watchdog stops the cluster when
#       process PID ends (a test that crashes leaves nothing behind).
#       Exit 0; 77 when redis-server or redis-cli is missing (skip); 1 on
#       failure, with everything it started stopped again.
#   redis_cluster.sh stop DIR              kill -9 every node and the watchdog
#   redis_cluster.sh kill-all DIR          kill -9 every node (the watchdog stays)
#   redis_cluster.sh kill DIR PORT         kill -9 one node
#   redis_cluster.sh start-node DIR PORT   start a stopped node again (same
#                                          config and nodes.conf); waits for PING
#   redis_cluster.sh wait-ok DIR [SECONDS] wait for cluster_state:ok on the
#                                          nodes that run (default 20 s)
#   redis_cluster.sh run DIR [start options] -- CMD...
#       start, run CMD with REDIS_CLUSTER_PORTS set, stop (also on failure)
set -uo pipefail

die() { echo "redis_cluster: $*" >&2; exit 1; }
have() { command -v redis-server >/dev/null && command -v redis-cli >/dev/null; }

cli() { # cli DIR PORT args...
  local dir=$1 port=$2; shift 2
  local pw=()
  [ -s "$dir/password" ] && pw=(--no-auth-warning -a "$(cat "$dir/password")")
  timeout 5 redis-cli -h 127.0.0.1 -p "$port" "${pw[@]}" "$@"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# waits until pid is gone (or a zombie: its parent may not reap it soon)
wait_gone() {
  local i
  for ((i = 0; i < 250; i++)); do
    [ -r "/proc/$1/stat" ] || return 0
    grep -q '^[^)]*) Z' "/proc/$1/stat" 2>/dev/null && return 0
    sleep 0.02
  done
}

node_pid() { [ -s "$1/$2/redis.pid" ] && cat "$1/$2/redis.pid"; }

# start_node DIR PORT: waits until it answers PING. The node that answers
# must be this one (its process_id the pid it wrote: Redis writes it once
# it listens): another cluster started at the same moment (criterion runs
# tests two at a time) may have found the same ports free and taken one
# first, and this node, unable to bind, exited in the background while the
# other answered for it. Then this fails, and start picks other ports.
start_node() {
  local dir=$1 port=$2 i pid
  rm -f "$dir/$port/redis.pid"
  redis-server "$dir/$port/redis.conf" || return 1
  for ((i = 0; i < 100; i++)); do
    if [ "$(cli "$dir" "$port" ping 2>/dev/null)" = PONG ]; then
      pid=$(cli "$dir" "$port" info server 2>/dev/null | tr -d '\r' | sed -n 's/^process_id://p')
      [ -n "$pid" ] && [ "$pid" = "$(node_pid "$dir" "$port")" ] && return 0
      echo "redis_cluster: port $port answered for another node (pid ${pid:-?})" >&2
      return 1
    fi
    sleep 0.05
  done
  echo "redis_cluster: node $port did not start: $(tail -3 "$dir/$port/redis.log" 2>/dev/null)" >&2
  return 1
}

stop_all() {
  local dir=$1
  [ -s "$dir/watchdog.pid" ] && kill "$(cat "$dir/watchdog.pid")" 2>/dev/null
  rm -f "$dir/watchdog.pid"
  kill_nodes "$dir"
}

kill_nodes() {
  local dir=$1 p pid
  for p in "$dir"/*/redis.pid; do
    [ -s "$p" ] || continue
    pid=$(cat "$p")
    # only a redis-server (a stale pid file may name another process by now)
    grep -qa redis-server "/proc/$pid/cmdline" 2>/dev/null || { rm -f "$p"; continue; }
    kill -9 "$pid" 2>/dev/null
    wait_gone "$pid"
    rm -f "$p"
  done
  return 0
}

wait_ok() { # wait_ok DIR SECONDS
  local dir=$1 secs=${2:-20} port ok i info n
  n=$(wc -l <"$dir/ports")
  for ((i = 0; i < secs * 10; i++)); do
    ok=1
    for port in $(cat "$dir/ports"); do
      [ -n "$(node_pid "$dir" "$port")" ] || continue
      info=$(cli "$dir" "$port" cluster info 2>/dev/null | tr -d '\r')
      grep -q '^cluster_state:ok' <<<"$info" || { ok=0; break; }
      grep -q "^cluster_known_nodes:$n\$" <<<"$info" || { ok=0; break; }
      grep -q '^cluster_slots_ok:16384$' <<<"$info" || { ok=0; break; }
      if cli "$dir" "$port" role 2>/dev/null | head -1 | grep -q slave; then
        cli "$dir" "$port" info replication 2>/dev/null | tr -d '\r' | grep -q '^master_link_status:up' ||
          { ok=0; break; }
      fi
    done
    [ $ok = 1 ] && return 0
    sleep 0.1
  done
  echo "redis_cluster: not ok after ${secs}s" >&2
  return 1
}

start() {
  local dir=$1; shift
  local masters=3 replicas=1 password="" timeout=1000 owner=""
  while [ $# -gt 0 ]; do
    case $1 in
      --masters) masters=$2; shift 2 ;;
      --replicas) replicas=$2; shift 2 ;;
      --password) password=$2; shift 2 ;;
      --node-timeout) timeout=$2; shift 2 ;;
      --owner) owner=$2; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  have || { echo "skipped: redis-server or redis-cli not installed (apt-get install redis-server redis-tools)"; exit 77; }
  mkdir -p "$dir" || die "cannot make $dir"
  printf '%s' "$password" >"$dir/password"
  local n=$((masters * (1 + replicas))) attempt base i port ports=()
  trap 'stop_all "$dir"' EXIT
  for ((attempt = 0; attempt < 8; attempt++)); do
    stop_all "$dir"
    ports=()
    base=$((12000 + (RANDOM * 4 + $$) % 3900))
    for ((i = 0; i < n; i++)); do
      port=$((base + i))
      port_free "$port" && port_free $((port + 10000)) || { ports=(); break; }
      ports+=("$port")
    done
    [ ${#ports[@]} -eq "$n" ] || continue
    local started=1
    for port in "${ports[@]}"; do
      mkdir -p "$dir/$port"
      rm -f "$dir/$port/nodes.conf"
      {
        echo "port $port"
        echo "bind 127.0.0.1"
        echo "dir $dir/$port"
        echo "daemonize yes"
        echo "pidfile $dir/$port/redis.pid"
        echo "logfile $dir/$port/redis.log"
        echo "cluster-enabled yes"
        echo "cluster-config-file nodes.conf"
        echo "cluster-node-timeout $timeout"
        echo "cluster-replica-validity-factor 0"
        echo "cluster-require-full-coverage no"
        echo "save \"\""
        echo "appendonly no"
        echo "protected-mode no"
        if [ -n "$password" ]; then echo "requirepass $password"; echo "masterauth $password"; fi
      } >"$dir/$port/redis.conf"
      start_node "$dir" "$port" || { started=0; break; }
    done
    [ $started = 1 ] && break
    ports=()
  done
  [ ${#ports[@]} -eq "$n" ] || die "could not start $n nodes"
  printf '%s\n' "${ports[@]}" >"$dir/ports"
  local addrs=() pw=()
  for port in "${ports[@]}"; do addrs+=("127.0.0.1:$port"); done
  [ -n "$password" ] && pw=(--no-auth-warning -a "$password")
  timeout 60 redis-cli "${pw[@]}" --cluster create "${addrs[@]}" --cluster-replicas "$replicas" \
    --cluster-yes >"$dir/create.log" 2>&1 || die "cluster create failed: $(tail -5 "$dir/create.log")"
  wait_ok "$dir" 30 || die "cluster did not settle"
  if [ -n "$owner" ]; then
    setsid bash -c 'while kill -0 '"$owner"' 2>/dev/null; do sleep 0.5; done; exec bash "$0" stop "$1"' \
      "$0" "$dir" </dev/null >/dev/null 2>&1 &
    echo $! >"$dir/watchdog.pid"
  fi
  trap - EXIT
  echo "ports ${ports[*]}"
}

cmd=${1:-}
[ $# -ge 2 ] || die "usage: redis_cluster.sh start|stop|kill|start-node|wait-ok|run DIR ..."
dir=$2
shift 2
case $cmd in
  start) start "$dir" "$@" ;;
  stop) stop_all "$dir" ;;
  kill-all) kill_nodes "$dir" ;;
  kill)
    pid=$(node_pid "$dir" "$1") || die "no node $1"
    kill -9 "$pid" 2>/dev/null
    wait_gone "$pid"
    rm -f "$dir/$1/redis.pid" ;;
  start-node) start_node "$dir" "$1" ;;
  wait-ok) wait_ok "$dir" "${1:-20}" ;;
  run)
    opts=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
    [ "${1:-}" = -- ] && shift
    out=$(start "$dir" "${opts[@]}")
    rc=$?
    [ $rc -eq 0 ] || { echo "$out"; exit $rc; }
    trap 'stop_all "$dir"' EXIT
    REDIS_CLUSTER_PORTS=${out#ports } "$@" ;;
  *) die "unknown command $cmd" ;;
esac
