#!/usr/bin/env bash
# spread_reads.sh -- strong reads with 16 clients, all sent to the leader and spread over the
# three members, for Cairn and for etcd 3.4, back to back on this machine (docs/benchmarks.md,
# "Strong reads spread over the cluster"). Prints one JSON report per line into $OUT/results.jsonl.
#
# usage: bench/scripts/spread_reads.sh [--duration SECS] [--repeats N] [--out DIR] [--node-cpus F] [--clients N]
# --node-cpus F: each member (Cairn node or etcd server) runs in its own CPU cgroup limited to F
#      cores (cgroup v1 cpu.cfs_quota_us, or cgroup v2 cpu.max; needs root), as if each had its own
#      machine of F cores; the load generator is not limited. Without it the members share the
#      machine's cores, so spreading reads can add no CPU.
# env: CAIRN (the binary; default: built with cargo --release), ETCD_BASELINE (default
#      ../shared/tools/etcd-baseline next to the checkout: its load generator measures etcd),
#      ETCD_BASE_PORT (22379), QUIET_MAX (0.3) / QUIET_WAIT (45) as in compare.sh.
# Cairn: `cairn bench read --consistency strong --clients 16 --connections 16 --target leader|all`
# on a fresh `cairn dev` (default follower_strong_reads = read-index: followers serve strong reads
# through a read index). etcd: the baseline's `etcdload get` (linearizable) with 16 clients over
# 16 connections, to the leader, then round-robin over the three members. Both stores first get
# the same 10,000-key space written. Everything started here is stopped by its pid on exit.
set -euo pipefail

DURATION=10 REPEATS=2 OUT="" NODE_CPUS="" CLIENTS=16
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) DURATION=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --node-cpus) NODE_CPUS=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown arg: $1" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
QUIET_MAX=${QUIET_MAX:-0.3} QUIET_WAIT=${QUIET_WAIT:-45}
ETCD_BASELINE=${ETCD_BASELINE:-$ROOT/../shared/tools/etcd-baseline}
BASE_PORT=${ETCD_BASE_PORT:-22379}
export ETCDCTL_API=3
log() { echo "[$(date +%T)] $*" >&2; }
[ -d "$ETCD_BASELINE/loadgen" ] || { log "no etcd baseline at $ETCD_BASELINE (set ETCD_BASELINE)"; exit 2; }
command -v etcd >/dev/null || { log "etcd is not installed (Debian: etcd-server etcd-client)"; exit 2; }
if [ -z "${CAIRN:-}" ]; then
  log "building cairn (cargo --release)"
  (cd "$ROOT" && cargo build --release --quiet -p cairn-cli --bin cairn)
  CAIRN="${CARGO_TARGET_DIR:-$ROOT/target}/release/cairn"
fi
LG_TARGET=${LG_TARGET:-/tmp/etcd-baseline-target}
log "building the etcd load generator into $LG_TARGET"
CARGO_TARGET_DIR=$LG_TARGET cargo build --release --quiet --manifest-path "$ETCD_BASELINE/loadgen/Cargo.toml"
LG="$LG_TARGET/release/etcdload"

[ -n "$OUT" ] || OUT="/tmp/cairn-spread-reads.$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"; RES="$OUT/results.jsonl"; : >"$RES"
WORK=$(mktemp -d /tmp/cairn-spread-reads.XXXXXX)
PIDS=()
stop_all() {
  local p
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true
  done
  PIDS=()
}
CGROUPS=()
# limit_cpu NAME PID: PID (all its threads, and every thread it starts later) into a cgroup of
# $NODE_CPUS cores. A no-op without --node-cpus.
limit_cpu() {
  [ -n "$NODE_CPUS" ] || return 0
  local name=$1 pid=$2 quota dir
  quota=$(awk -v f="$NODE_CPUS" 'BEGIN{printf "%d", f*100000}')
  if [ -d /sys/fs/cgroup/cpu ]; then
    dir=/sys/fs/cgroup/cpu/cairn-bench-$name; mkdir -p "$dir"
    echo 100000 >"$dir/cpu.cfs_period_us"; echo "$quota" >"$dir/cpu.cfs_quota_us"
  else
    dir=/sys/fs/cgroup/cairn-bench-$name; mkdir -p "$dir"; echo "$quota 100000" >"$dir/cpu.max"
  fi
  echo "$pid" >"$dir/cgroup.procs"; CGROUPS+=("$dir")
}
drop_cgroups() {
  local d
  for d in "${CGROUPS[@]}"; do rmdir "$d" 2>/dev/null || true; done
  CGROUPS=()
}
trap 'stop_all; drop_cgroups; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

. "$HERE/quiet.sh"  # busy_cores, wait_quiet
{
  echo "date: $(date -u +%FT%TZ)"; echo "cairn: $("$CAIRN" --version)"
  echo "etcd: $(etcd --version | head -1)"
  echo "kernel: $(uname -r)  cpus: $(nproc)  model: $(lscpu | sed -n 's/^Model name: *//p')"
  echo "node cpus: ${NODE_CPUS:-unlimited (the members share the machine)}"
} >"$OUT/env.txt"
cat "$OUT/env.txt" >&2

# ---- Cairn
log "starting cairn dev"
"$CAIRN" dev --data-dir "$WORK/cairn" --log-level warn --fresh >"$OUT/dev.log" 2>&1 &
PIDS+=($!)
t=0
until grep -q "leader is node" "$OUT/dev.log" 2>/dev/null; do
  t=$((t + 1)); [ $t -le 200 ] || { log "no cluster after 40 s"; tail -20 "$OUT/dev.log" >&2; exit 1; }
  sleep 0.2
done
n=0
for p in $(pgrep -P "${PIDS[0]}"); do n=$((n + 1)); limit_cpu "cairn$n" "$p"; done
[ -z "$NODE_CPUS" ] || [ "$n" = 3 ] || { log "cairn dev has $n nodes, expected 3"; exit 1; }
export CAIRN_ENDPOINTS=127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
cbench() {
  local label=$1; shift
  wait_quiet; log "  $label"
  timeout 900 "$CAIRN" bench "$@" --label "$label" -o json \
    | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' >>"$RES"
}
cbench "cairn keys: 10000 puts" write --sequential-keys --key-space 10000 --max-ops 10000 \
  --clients 64 --connections 1 --warmup 0 --duration 120
for r in $(seq 1 "$REPEATS"); do
  cbench "cairn get strong c=$CLIENTS leader run$r" read --consistency strong --clients "$CLIENTS" --connections "$CLIENTS" \
    --target leader --duration "$DURATION" --max-ops 5000000
  cbench "cairn get strong c=$CLIENTS spread run$r" read --consistency strong --clients "$CLIENTS" --connections "$CLIENTS" \
    --target all --duration "$DURATION" --max-ops 5000000
done
stop_all
drop_cgroups

# ---- etcd
CLUSTER="" EPS=""
for i in 1 2 3; do
  c=$((BASE_PORT + (i - 1) * 10)); p=$((c + 1))
  CLUSTER+="${CLUSTER:+,}n$i=http://127.0.0.1:$p"; EPS+="${EPS:+,}http://127.0.0.1:$c"
done
for i in 1 2 3; do
  c=$((BASE_PORT + (i - 1) * 10)); p=$((c + 1))
  etcd --name "n$i" --data-dir "$WORK/etcd$i" \
    --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
    --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
    --initial-cluster "$CLUSTER" --initial-cluster-token cairn-spread-reads --initial-cluster-state new \
    --logger zap >>"$WORK/etcd$i.log" 2>&1 &
  PIDS+=($!); limit_cpu "etcd$i" "$!"
done
t=0
until etcdctl --endpoints="$EPS" --command-timeout=2s endpoint health >/dev/null 2>&1; do
  t=$((t + 1)); [ $t -le 60 ] || { log "etcd not healthy after 30 s"; exit 1; }
  sleep 0.5
done
L=$(( $("$LG" leader --endpoints "$EPS") + 1 ))
LEP="http://127.0.0.1:$((BASE_PORT + (L - 1) * 10))"
pids_csv() { local IFS=,; echo "${PIDS[*]}"; }
ebench() {
  local label=$1 mode=$2; shift 2
  wait_quiet; log "  $label"
  timeout 900 "$LG" "$mode" --label "$label" --watch-pids "$(pids_csv)" "$@" >>"$RES"
}
ebench "etcd keys: puts c=64" put --endpoints "$LEP" --clients 64 --conns 1 --duration 5 --max-ops 10000
for r in $(seq 1 "$REPEATS"); do
  ebench "etcd get linearizable c=$CLIENTS leader run$r" get --endpoints "$LEP" --clients "$CLIENTS" --conns "$CLIENTS" \
    --duration "$DURATION" --max-ops 5000000
  ebench "etcd get linearizable c=$CLIENTS spread run$r" get --endpoints "$EPS" --clients "$CLIENTS" --conns "$CLIENTS" \
    --duration "$DURATION" --max-ops 5000000
done
stop_all
python3 - "$RES" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in rows:
    ops = r.get("ops_per_s") or r.get("throughput_ops_per_s") or r.get("ops_per_sec")
    lat = r.get("lat_ms") or r.get("latency", {}).get("all") or r.get("latency", {}).get("read") or {}
    print(f'{r.get("label"):45s} {ops!s:>12} ops/s  p50 {lat.get("p50", lat.get("p50_ms", "?"))}')
PY
log "results in $RES"
