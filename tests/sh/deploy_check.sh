#!/usr/bin/env bash
# deploy_check.sh - the files of deploy/ are valid for the tools that read
# them: the systemd unit passes `systemd-analyze verify` without a warning
# and its command line is one the daemon accepts; the Prometheus config and
# alert rules pass promtool (check config, check rules, and the rules' unit
# tests); the Grafana dashboard is JSON and names only metrics of
# daemon/OPS.md; the Kubernetes manifest parses as YAML, its kvcached.conf
# passes `kvctl check-config`, and its stats port is bound to the pod's IP
# only, published nowhere else, and open to Prometheus's pods alone. A part whose tool is missing
# is skipped with the reason; with every tool missing, the test is skipped.
source "$(dirname "$0")/lib.bash"

D=$SRC/deploy
UNIT=$D/systemd/kvcached.service
ran=0

# --- systemd ---------------------------------------------------------------------------
if ! command -v systemd-analyze >/dev/null; then
  echo "skip - systemd unit: systemd-analyze not found (apt-get install systemd)"
else
  ran=$((ran + 1))
  check "the unit exists" test -f "$UNIT"
  # verify resolves ExecStart: point it at the built daemon.
  sed "s|^ExecStart=/usr/local/bin/kvcached|ExecStart=$BIN/kvcached|" "$UNIT" > "$T/kvcached.service"
  grep -q "^ExecStart=$BIN/kvcached " "$T/kvcached.service" && ok "ExecStart rewritten to the built daemon" \
    || bad "no ExecStart=/usr/local/bin/kvcached line to rewrite"
  systemd-analyze verify "$T/kvcached.service" >"$T/verify" 2>&1
  rc=$?
  [ "$rc" -eq 0 ] && ok "systemd-analyze verify passes" || bad "systemd-analyze verify exit $rc: $(cat "$T/verify")"
  if grep -q "kvcached" "$T/verify"; then bad "verify warns about the unit: $(grep kvcached "$T/verify")"
  else ok "verify prints no warning about the unit"; fi
  grep -v kvcached "$T/verify" | sed 's/^/note: (not about the unit) /'
  # The check above can fail: verify does report a bad key on this systemd.
  mkdir -p "$T/bad"
  sed 's/^Restart=on-failure$/&\nFrobnicate=yes/' "$T/kvcached.service" > "$T/bad/kvcached.service"
  systemd-analyze verify "$T/bad/kvcached.service" 2>&1 | grep -q "Unknown key 'Frobnicate'" \
    && ok "verify reports an unknown key (the warning check works)" || bad "verify misses an unknown key"

  for want in "Type=notify" "ExecReload=/bin/kill -HUP \$MAINPID" "RuntimeDirectory=kvcached" \
              "StateDirectory=kvcached" "LimitMEMLOCK=infinity" "User=kvcached" "Group=kvcached" \
              "Restart=on-failure" "ProtectSystem=strict" "ProtectHome=yes" "PrivateTmp=yes" \
              "NoNewPrivileges=yes" "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6" \
              "SystemCallFilter=@system-service io_uring_setup io_uring_enter io_uring_register" \
              "DeviceAllow=char-nvidia* rw"; do
    grep -qxF "$want" "$UNIT" && ok "unit has $want" || bad "unit lacks $want"
  done
  grep -q "^ExecStart=/usr/local/bin/kvcached --config /etc/kvcached/kvcached.conf --foreground" "$UNIT" \
    && ok "ExecStart runs the installed daemon on /etc/kvcached/kvcached.conf in the foreground" \
    || bad "ExecStart line"
  # The daemon accepts the unit's arguments (on the repository's configuration).
  args=$(sed -n 's|^ExecStart=/usr/local/bin/kvcached ||p' "$UNIT" | sed "s|/etc/kvcached/kvcached.conf|$D/kvcached.conf|")
  # shellcheck disable=SC2086
  if "$BIN/kvcached" $args --print-config >"$T/cfg" 2>"$T/cfgerr"; then ok "kvcached accepts the unit's arguments"
  else bad "kvcached rejects the unit's arguments: $(cat "$T/cfgerr")"; fi
  LISTEN=$(sed -n 's/.*--set stats.listen=\([^ ]*\).*/\1/p' "$UNIT")
  check "the unit sets stats.listen" test -n "$LISTEN"
  grep -q "^listen = $LISTEN\$" "$T/cfg" && ok "stats.listen takes effect ($LISTEN)" || bad "stats.listen not in --print-config"
  if systemd-analyze security --offline=yes "$T/kvcached.service" >"$T/sec" 2>&1; then
    score=$(sed -n 's/.*Overall exposure level for kvcached.service: \([0-9.]*\).*/\1/p' "$T/sec")
    echo "note: systemd-analyze security exposure: ${score:-?} (0 safest, 10 unsafe)"
    [ -n "$score" ] && awk -v s="$score" 'BEGIN { exit !(s < 4.0) }' && ok "exposure level below 4.0 (OK)" \
      || bad "exposure level ${score:-unknown}: $(tail -3 "$T/sec")"
  fi
fi

# --- Prometheus --------------------------------------------------------------------------
if ! command -v promtool >/dev/null; then
  echo "skip - Prometheus files: promtool not found (apt-get install prometheus)"
else
  ran=$((ran + 1))
  expect_exit 0 "promtool check config prometheus.yml" promtool check config "$D/prometheus/prometheus.yml"
  grep -q "SUCCESS: 1 rule files found" "$T/out" && ok "the config loads the alert rules" || bad "rule file not found: $(cat "$T/out")"
  expect_exit 0 "promtool check rules kvcached-alerts.yml" promtool check rules "$D/prometheus/kvcached-alerts.yml"
  expect_exit 0 "promtool test rules: every alert fires where it should and only there" \
    promtool test rules "$D/prometheus/kvcached-alerts.test.yml"
  for a in KvcachedDown KvcachedG3Degraded KvcachedG3Full KvcachedHitRateCollapse \
           KvcachedCorruptReadsRising KvcachedLoadLatencyHigh KvcachedG2NearlyFullOfPins \
           KvcachedG4Down KvcachedG4ValuesRefused; do
    grep -q "alert: $a\$" "$D/prometheus/kvcached-alerts.yml" && ok "alert $a" || bad "no alert $a"
    grep -q "alertname=\"$a\"" "$D/prometheus/kvcached-alerts.test.yml" && ok "alert $a is unit-tested" \
      || bad "alert $a has no unit test"
  done
  [ -n "${LISTEN:-}" ] && { grep -q "\"$LISTEN\"" "$D/prometheus/prometheus.yml" \
    && ok "Prometheus scrapes the unit's stats.listen" || bad "prometheus.yml does not scrape $LISTEN"; }
fi

# --- metric names against OPS.md -----------------------------------------------------------
# The table's first column names the metrics; histograms also have
# _bucket, _sum and _count series.
grep '^| `kvcached_' "$SRC/daemon/OPS.md" | cut -d'|' -f2 | grep -o 'kvcached_[a-z0-9_]*' | sort -u > "$T/ops_metrics"
grep '^| `kvcached_' "$SRC/daemon/OPS.md" | grep '| histogram' | cut -d'|' -f2 | grep -o 'kvcached_[a-z0-9_]*' \
  | while read -r m; do printf '%s_bucket\n%s_sum\n%s_count\n' "$m" "$m" "$m"; done >> "$T/ops_metrics"
check "OPS.md's metric table is found" test "$(wc -l < "$T/ops_metrics")" -ge 20
# names_known FILE WHAT: every kvcached_* name in FILE is in OPS.md.
names_known() {
  grep -o 'kvcached_[a-z0-9_]*' "$1" | sort -u > "$T/used"
  local unknown
  unknown=$(grep -vxF -f "$T/ops_metrics" "$T/used" | tr '\n' ' ')
  [ -z "$unknown" ] && ok "$2 names only OPS.md metrics ($(wc -l < "$T/used") names)" \
    || bad "$2 names metrics OPS.md does not have: $unknown"
}
names_known "$D/prometheus/kvcached-alerts.yml" "kvcached-alerts.yml"

# --- Grafana ----------------------------------------------------------------------------------
if ! command -v jq >/dev/null; then
  echo "skip - Grafana dashboard: jq not found (apt-get install jq)"
else
  ran=$((ran + 1))
  DASH=$D/grafana/kvcached-dashboard.json
  expect_exit 0 "the dashboard is JSON" jq -e '.panels | length > 0' "$DASH"
  jq -r '.. | .expr? // empty' "$DASH" > "$T/exprs"
  check "the dashboard has queries" test -s "$T/exprs"
  names_known "$T/exprs" "the dashboard"
  check "panel ids are unique" test "$(jq '[.. | objects | select(has("gridPos")) | .id] | (length == (unique | length))' "$DASH")" = true
  for m in kvcached_tier_used_bytes kvcached_hits_total kvcached_misses_total kvcached_copy_bytes_total \
           kvcached_request_duration_seconds_bucket kvcached_g3_state kvcached_sessions kvcached_pinned_blocks; do
    grep -q "$m" "$T/exprs" && ok "the dashboard shows $m" || bad "the dashboard lacks $m"
  done
  grep -q 'histogram_quantile(0.99' "$T/exprs" && grep -q 'histogram_quantile(0.5' "$T/exprs" \
    && ok "the dashboard shows p50 and p99 from the histograms" || bad "no p50/p99"
fi

# --- Kubernetes ----------------------------------------------------------------------------------
K8S=$D/k8s/kvcached-daemonset.yaml
# Debian's interpreter, which sees python3-yaml (another python3 may come
# first on PATH)
PY3=python3
[ -x /usr/bin/python3 ] && PY3=/usr/bin/python3
if ! $PY3 -c 'import yaml' 2>/dev/null; then
  echo "skip - Kubernetes manifest: $PY3 has no yaml module (apt-get install python3-yaml)"
else
  ran=$((ran + 1))
  cat >"$T/k8s_check.py" <<'EOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
kinds = {d["kind"]: d for d in docs}
assert set(kinds) >= {"ConfigMap", "DaemonSet"}, kinds.keys()
open(sys.argv[2], "w").write(kinds["ConfigMap"]["data"]["kvcached.conf"])
pod = kinds["DaemonSet"]["spec"]["template"]["spec"]
c = pod["containers"][0]
host = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
assert "/run/kvcached" in host.values(), host
mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
assert any(mounts.get(n) == "/run/kvcached" for n, p in host.items() if p == "/run/kvcached")
assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
assert c["securityContext"].get("privileged") is False
for probe in ("readinessProbe", "livenessProbe"):
    cmd = c[probe]["exec"]["command"]
    assert cmd[0].endswith("kvctl") and cmd[1] == "health", cmd
assert "--live" in c["livenessProbe"]["exec"]["command"]
assert c["args"][:2] == ["--config", "/etc/kvcached/kvcached.conf"], c["args"]
# The stats port: the pod's own IP, scraped by Prometheus and by nothing else.
assert "--set" in c["args"] and "stats.listen=$(POD_IP):9464" in c["args"], c["args"]
env = {e["name"]: e for e in c.get("env", [])}
assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP", env.get("POD_IP")
conf = kinds["ConfigMap"]["data"]["kvcached.conf"]
assert not [l for l in conf.splitlines() if "=" in l and l.split("=")[0].strip() == "listen"
            and l.split("=", 1)[1].strip()], "the ConfigMap binds stats.listen itself"
assert not pod.get("hostNetwork"), "hostNetwork puts the stats port on the node's addresses"
for p in c.get("ports", []):
    assert "hostPort" not in p, p
assert "Service" not in kinds, "a Service exposes the pod's ports"
ann = kinds["DaemonSet"]["spec"]["template"]["metadata"]["annotations"]
assert ann["prometheus.io/port"] == "9464" and ann["prometheus.io/path"] == "/metrics", ann
np = kinds.get("NetworkPolicy")
assert np, "no NetworkPolicy limits who reaches the stats port"
labels = kinds["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
sel = np["spec"]["podSelector"]["matchLabels"]
assert sel and all(labels.get(k) == v for k, v in sel.items()), (sel, labels)
assert "Ingress" in np["spec"]["policyTypes"], np["spec"]
for rule in np["spec"].get("ingress", []):
    assert rule.get("from"), "an ingress rule open to every source"
    for peer in rule["from"]:
        assert peer.get("namespaceSelector", {}).get("matchLabels"), peer
    assert [(p.get("protocol", "TCP"), p["port"]) for p in rule["ports"]] == [("TCP", 9464)], rule
print("ok")
EOF
  expect_exit 0 "the manifest parses as YAML and has what it must" $PY3 "$T/k8s_check.py" "$K8S" "$T/k8s.conf"
  # The check can fail: a manifest that binds every address, publishes the
  # port on the node, or lets pods of any namespace in is refused.
  sed 's/^    # listen: set in the container.s args.*$/    listen = 0.0.0.0:9464/' "$K8S" > "$T/k8s_any.yaml"
  expect_exit 1 "a ConfigMap with listen = 0.0.0.0:9464 is refused" $PY3 "$T/k8s_check.py" "$T/k8s_any.yaml" "$T/x.conf"
  sed 's/^              containerPort: 9464$/&\n              hostPort: 9464/' "$K8S" > "$T/k8s_hostport.yaml"
  expect_exit 1 "a hostPort on the metrics port is refused" $PY3 "$T/k8s_check.py" "$T/k8s_hostport.yaml" "$T/x.conf"
  sed '/^        - namespaceSelector:$/,/^              kubernetes.io\/metadata.name:/d; s/^          podSelector:$/        - podSelector:/' \
    "$K8S" > "$T/k8s_open.yaml"
  expect_exit 1 "a NetworkPolicy without a namespace selector is refused" $PY3 "$T/k8s_check.py" "$T/k8s_open.yaml" "$T/x.conf"
  # What the kubelet runs: the args with $(POD_IP) expanded.
  if "$BIN/kvcached" --config "$T/k8s.conf" --foreground --set stats.listen=10.1.2.3:9464 --print-config \
       >"$T/k8s.print" 2>"$T/k8s.err" && grep -q '^listen = 10.1.2.3:9464$' "$T/k8s.print"; then
    ok "kvcached takes the manifest's arguments with a pod IP"
  else
    bad "kvcached and the manifest's arguments: $(cat "$T/k8s.err")"
  fi
  # Sized for a GPU node, not for the machine running the tests: its own checks only.
  expect_exit 0 "the ConfigMap's kvcached.conf passes kvctl check-config" "$BIN/kvctl" check-config --no-machine "$T/k8s.conf"
fi

if [ "$ran" -eq 0 ]; then
  echo "skip: none of systemd-analyze, promtool, jq, python3-yaml is installed"
  exit 77
fi
finish
