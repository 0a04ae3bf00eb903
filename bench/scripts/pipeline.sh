#!/usr/bin/env bash
# pipeline.sh -- write throughput against the number of write entries the leader keeps in
# flight (`write_proposals_in_flight_max`) and the number of clients: for each in-flight value a
# fresh `cairn dev` (default settings otherwise), then `cairn bench write` at each client count
# on one connection. Prints one line per run (ops/s, p50, p99, the servers' cores and CPU per
# write, context switches per write) and appends each run's JSON report to $OUT/results.jsonl.
#
# usage: bench/scripts/pipeline.sh [--in-flight "1 2 4 8"] [--clients "1 16 64 256"]
#                                  [--connections N] [--duration SECS] [--out DIR]
# env: CAIRN (the binary; default target/release/cairn), QUIET_MAX (0.3) / QUIET_WAIT (30):
#      before each run wait up to QUIET_WAIT s for the machine to use < QUIET_MAX cores.
# Every process started here is stopped by its pid on exit.
set -euo pipefail

IN_FLIGHT="1 2 4 8" CLIENTS="1 16 64 256" CONNECTIONS=1 DURATION=10 OUT=""
QUIET_MAX=${QUIET_MAX:-0.3} QUIET_WAIT=${QUIET_WAIT:-30}
while [ $# -gt 0 ]; do
  case "$1" in
    --in-flight) IN_FLIGHT=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    --connections) CONNECTIONS=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown arg: $1" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CAIRN=${CAIRN:-$REPO/target/release/cairn}
[ -x "$CAIRN" ] || { echo "no cairn binary at $CAIRN (cargo build --release -p cairn-cli)" >&2; exit 2; }
[ -n "$OUT" ] || OUT="/tmp/cairn-pipeline.$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"; RES="$OUT/results.jsonl"; : >"$RES"
log() { echo "[$(date +%T)] $*" >&2; }

DATA="" DEV_PID=""
stop_dev() {
  [ -n "$DEV_PID" ] || return 0
  kill -TERM "$DEV_PID" 2>/dev/null || true
  for _ in $(seq 1 200); do kill -0 "$DEV_PID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$DEV_PID" 2>/dev/null || true
  wait "$DEV_PID" 2>/dev/null || true
  DEV_PID=""
  [ -z "$DATA" ] || rm -rf "$DATA"
}
trap stop_dev EXIT
trap 'exit 130' INT TERM

. "$HERE/quiet.sh"  # busy_cores, wait_quiet

{
  echo "date: $(date -u +%FT%TZ)"; echo "cairn: $("$CAIRN" --version)"
  echo "kernel: $(uname -r)  cpus: $(nproc)  model: $(lscpu | sed -n 's/^Model name: *//p')"
  echo "tmp mount: $(findmnt -no SOURCE,FSTYPE,OPTIONS -T /tmp)"
} | tee "$OUT/env.txt" >&2

printf '%-9s %-8s %10s %8s %8s %7s %9s %9s\n' in_flight clients ops/s p50_ms p99_ms cores cpu_us/op csw/op
for n in $IN_FLIGHT; do
  DATA=$(mktemp -d /tmp/cairn-pipeline-dev.XXXXXX)
  CAIRN_WRITE_PROPOSALS_IN_FLIGHT_MAX=$n "$CAIRN" dev --data-dir "$DATA" --log-level warn \
    >"$OUT/dev.$n.log" 2>&1 &
  DEV_PID=$!
  t=0
  until grep -q "leader is node" "$OUT/dev.$n.log" 2>/dev/null; do
    t=$((t + 1)); [ $t -le 200 ] || { log "no cluster after 40 s"; tail -20 "$OUT/dev.$n.log" >&2; exit 1; }
    sleep 0.2
  done
  export CAIRN_ENDPOINTS=127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
  for c in $CLIENTS; do
    wait_quiet
    timeout 300 "$CAIRN" bench write --clients "$c" --connections "$CONNECTIONS" \
      --duration "$DURATION" --label "in_flight=$n clients=$c" -o json \
      | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' >>"$RES"
    tail -1 "$RES" | N=$n python3 -c 'import json,os,sys
r=json.load(sys.stdin); w=r["latency"]["write"]; s=r["servers"]
cores=sum(x["cpu_cores"] or 0 for x in s); cpu=sum(x["cpu_us_per_op"] or 0 for x in s)
csw=sum(x["context_switches_per_op"] or 0 for x in s)
print("%-9s %-8s %10.0f %8.2f %8.2f %7.2f %9.1f %9.2f" % (os.environ["N"], r["clients"], r["ops_per_s"], w["p50_ms"], w["p99_ms"], cores, cpu, csw))'
  done
  stop_dev
done
