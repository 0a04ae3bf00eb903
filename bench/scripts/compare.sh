#!/usr/bin/env bash
# compare.sh -- Cairn's side of docs/benchmarks.md: the workloads of the etcd baseline
# (shared/tools/etcd-baseline/run.sh), run with `cairn bench` against a fresh release
# `cairn dev` cluster on loopback. Prints one JSON report per line into $OUT/results.jsonl.
#
# usage: bench/scripts/compare.sh [--duration SECS] [--repeats N] [--failover-trials N]
#                                 [--memory-keys N] [--idle-secs N] [--skip-failover] [--skip-memory]
#                                 [--growth-writes N] [--out DIR]
# --idle-secs N (default 0 = skip): at the end, leave the cluster idle N s and report whether the
#      term moved (a spurious election).
# --growth-writes N (default 0 = skip): after the snapshot phase, N more writes (64 clients),
#      then the one-client put again: its p50 against the fresh cluster's first one-client run
#      is the log-growth figure (the write-path target: within 10 % after 1,000,000 writes).
# env: CAIRN (the binary; default: built with cargo --release into $CARGO_TARGET_DIR),
#      QUIET_MAX (0.3) / QUIET_WAIT (45): before each run wait up to QUIET_WAIT s for the rest
#      of the machine to use < QUIET_MAX cores, as the etcd script does.
# The targets table of docs/benchmarks.md: bench/scripts/targets.py CAIRN_OUT/results.jsonl ETCD_OUT/results.jsonl.
# Everything is bounded: each run has a duration and an op cap; every process started here is
# stopped by its pid on exit.
set -euo pipefail

DURATION=10 REPEATS=3 TRIALS=3 MEM_KEYS=100000 IDLE=0 SKIP_FO=0 SKIP_MEM=0 GROWTH=0 OUT=""
QUIET_MAX=${QUIET_MAX:-0.3} QUIET_WAIT=${QUIET_WAIT:-45}
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) DURATION=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --failover-trials) TRIALS=$2; shift 2 ;;
    --memory-keys) MEM_KEYS=$2; shift 2 ;;
    --idle-secs) IDLE=$2; shift 2 ;;
    --skip-failover) SKIP_FO=1; shift ;;
    --skip-memory) SKIP_MEM=1; shift ;;
    --growth-writes) GROWTH=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown arg: $1" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
log() { echo "[$(date +%T)] $*" >&2; }
if [ -z "${CAIRN:-}" ]; then
  log "building cairn (cargo --release)"
  (cd "$ROOT" && cargo build --release --quiet -p cairn-cli --bin cairn)
  CAIRN="${CARGO_TARGET_DIR:-$ROOT/target}/release/cairn"
fi
[ -n "$OUT" ] || OUT="/tmp/cairn-bench-results.$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"; RES="$OUT/results.jsonl"; : >"$RES"
DATA=$(mktemp -d /tmp/cairn-bench-dev.XXXXXX)
EPS=127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
export CAIRN_ENDPOINTS=$EPS
DEV_PID=""

stop_dev() {
  [ -n "$DEV_PID" ] || return 0
  kill -TERM "$DEV_PID" 2>/dev/null || true
  for _ in $(seq 1 200); do kill -0 "$DEV_PID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$DEV_PID" 2>/dev/null && kill -KILL "$DEV_PID" 2>/dev/null || true
  wait "$DEV_PID" 2>/dev/null || true
  DEV_PID=""
}
cleanup() { stop_dev; rm -rf "$DATA"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

DEV_STARTS=0
start_dev() {  # start_dev [--fresh] : a 3-node cluster in $DATA, waits for a leader
  DEV_STARTS=$((DEV_STARTS + 1))
  local dlog="$OUT/dev.$DEV_STARTS.log" t=0
  "$CAIRN" dev --data-dir "$DATA" --log-level warn "$@" >"$dlog" 2>&1 &
  DEV_PID=$!
  until grep -q "leader is node" "$dlog" 2>/dev/null; do
    t=$((t + 1)); [ $t -le 200 ] || { log "no cluster after 40 s"; tail -20 "$dlog" >&2; exit 1; }
    kill -0 "$DEV_PID" 2>/dev/null || { log "cairn dev exited"; tail -20 "$dlog" >&2; exit 1; }
    sleep 0.2
  done
}
. "$HERE/quiet.sh"  # busy_cores, wait_quiet
bench() {  # bench LABEL WORKLOAD [args...]
  local label=$1; shift
  wait_quiet
  log "  $label  (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  timeout 900 "$CAIRN" bench "$@" --label "$label" -o json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' >>"$RES"
}

{
  echo "date: $(date -u +%FT%TZ)"; echo "cairn: $("$CAIRN" --version)"
  echo "kernel: $(uname -r)  cpus: $(nproc)  model: $(lscpu | sed -n 's/^Model name: *//p')"
  echo "tmp mount: $(findmnt -no SOURCE,FSTYPE,OPTIONS -T /tmp)"
  echo "load: $(cat /proc/loadavg)"
} >"$OUT/env.txt"
cat "$OUT/env.txt" >&2

log "starting cairn dev in $DATA"
start_dev --fresh

for r in $(seq 1 "$REPEATS"); do
  bench "put c=1 run$r" write --clients 1 --connections 1 --duration "$DURATION" --max-ops 200000
  bench "put c=64 conns=1 run$r" write --clients 64 --connections 1 --duration "$DURATION" --max-ops 1000000
  bench "put c=64 conns=64 run$r" write --clients 64 --connections 64 --duration "$DURATION" --max-ops 1000000
done
bench "get strong c=16 conns=1" read --consistency strong --clients 16 --connections 1 --duration "$DURATION" --max-ops 2000000
bench "get eventual c=16 conns=1" read --consistency eventual --clients 16 --connections 1 --duration "$DURATION" --max-ops 2000000
bench "watch 1 writer -> 1000 watchers" watch --watchers 1000 --clients 1 --write-interval-ms 20 --duration "$DURATION"

if [ "$SKIP_MEM" = 0 ]; then
  MEM_NS="mem$(date +%s)"
  bench "memory: $MEM_KEYS creates of 256 B" write --namespace "$MEM_NS" --sequential-keys \
    --key-space "$MEM_KEYS" --max-ops "$MEM_KEYS" --clients 64 --connections 1 --warmup 0 --duration 600
fi

# Snapshot save and restore of the memory phase's resources (the etcd script's phase d: save
# through the leader, restore offline into a new data dir, then serve it and count).
if [ "$SKIP_MEM" = 0 ]; then
  SNAP="$OUT/snap.cairn"; RESTORED=$(mktemp -d /tmp/cairn-bench-restored.XXXXXX)
  # The leader's resource count, from `cairn status -o json` (one entry per member).
  resource_count() {
    "$CAIRN" status "$@" -o json | python3 -c 'import json,sys
print(next(m["resource_count"] for m in json.load(sys.stdin)["members"] if m.get("role") == "leader"))'
  }
  source_count=$(resource_count)
  wait_quiet; log "  snapshot save"
  t0=$(date +%s.%N); timeout 300 "$CAIRN" snapshot save "$SNAP" >"$OUT/snapshot-save.txt" 2>&1; t1=$(date +%s.%N)
  log "  snapshot restore --offline"
  t2=$(date +%s.%N)
  timeout 300 "$CAIRN" snapshot restore --offline "$SNAP" --data-dir "$RESTORED/n1" \
    --members 1=127.0.0.1:18101/127.0.0.1:18100 >"$OUT/snapshot-restore.txt" 2>&1
  t3=$(date +%s.%N)
  "$CAIRN" agent --node-id 1 --data-dir "$RESTORED/n1" --client-address 127.0.0.1:18100 \
    --peer-address 127.0.0.1:18101 --members 1=127.0.0.1:18101/127.0.0.1:18100 --log-level warn \
    >"$OUT/restored.log" 2>&1 &
  RPID=$!
  count="null"
  for _ in $(seq 1 120); do
    count=$(resource_count --endpoints 127.0.0.1:18100 2>/dev/null) && break
    count="null"; sleep 0.25
  done
  t4=$(date +%s.%N)
  kill -TERM "$RPID" 2>/dev/null || true; wait "$RPID" 2>/dev/null || true; rm -rf "$RESTORED"
  python3 -c "import json,os,sys; a=[float(x) for x in sys.argv[1:6]]; print(json.dumps({'label':'snapshot','workload':'snapshot','resources':int(sys.argv[6]),'file_bytes':os.path.getsize(sys.argv[7]),'save_s':a[1]-a[0],'restore_offline_s':a[3]-a[2],'restored_serving_s':a[4]-a[3],'restored_count':None if sys.argv[8]=='null' else int(sys.argv[8])}))" \
    "$t0" "$t1" "$t2" "$t3" "$t4" "$source_count" "$SNAP" "$count" >>"$RES"
  rm -f "$SNAP"
fi

if [ "$GROWTH" -gt 0 ]; then
  bench "growth: $GROWTH writes, c=64 conns=1" write --clients 64 --connections 1 --warmup 0 \
    --duration 7200 --max-ops "$GROWTH"
  bench "put c=1 after $GROWTH more writes" write --clients 1 --connections 1 --duration "$DURATION" --max-ops 200000
fi

if [ "$SKIP_FO" = 0 ]; then
  for t in $(seq 1 "$TRIALS"); do
    wait_quiet
    sleep 3
    log "  failover trial $t"
    line=$(timeout 60 "$CAIRN" bench failover --label "failover trial $t" -o json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))') || line='{"label":"failover trial '"$t"'","failover":null}'
    echo "$line" >>"$RES"
    stop_dev; start_dev   # the killed node comes back with its data; the others restart too
  done
fi
if [ "$IDLE" -gt 0 ]; then
  term() { "$CAIRN" status -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["term"])'; }
  sleep 5; t0=$(term); log "  idle for $IDLE s from term $t0"
  sleep "$IDLE"; t1=$(term)
  echo "{\"label\":\"idle $IDLE s\",\"workload\":\"idle\",\"term_before\":$t0,\"term_after\":$t1}" >>"$RES"
fi
stop_dev
log "results: $RES"
