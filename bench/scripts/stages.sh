#!/usr/bin/env bash
# stages.sh -- where one write's time goes, stage by stage, on the leader: starts three
# `cairn agent`s with --write-stage-timing on a data root (a disk, or tmpfs to take the disk
# away), runs `cairn bench write` with N clients on one connection, and prints the leader's
# median and p99 of every stage of `cairn_write_stage_seconds` (see server/src/raft/stages.rs).
# One client count per run: the exporter's quantiles cover a sliding window, so each count gets
# a fresh cluster. docs/benchmarks.md has the figures.
#
# usage: bench/scripts/stages.sh [--root DIR] [--duration SECS] [--clients N]
#   --root DIR     where the nodes' data dirs go (default: a fresh dir under /tmp; give a dir
#                  on /dev/shm for tmpfs)
# env: CAIRN (the binary; default target/release/cairn)
# Every process started here is stopped by its pid on exit.
set -euo pipefail

ROOT_DIR="" DURATION=10 CLIENTS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --root) ROOT_DIR=$2; shift 2 ;;
    --duration) DURATION=$2; shift 2 ;;
    --clients) CLIENTS=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown arg: $1" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CAIRN=${CAIRN:-$REPO/target/release/cairn}
[ -x "$CAIRN" ] || { echo "no cairn binary at $CAIRN (cargo build --release -p cairn-cli)" >&2; exit 2; }
[ -n "$ROOT_DIR" ] || ROOT_DIR=$(mktemp -d /tmp/cairn-stages.XXXXXX)
mkdir -p "$ROOT_DIR"
log() { echo "[$(date +%T)] $*" >&2; }

BASE=27500
MEMBERS=""
for id in 1 2 3; do
  MEMBERS="$MEMBERS${MEMBERS:+,}$id=127.0.0.1:$((BASE + 100 + id))/127.0.0.1:$((BASE + id))"
done
ENDPOINTS="127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2)),127.0.0.1:$((BASE + 3))"
PIDS=()
stop() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop EXIT

for id in 1 2 3; do
  rm -rf "$ROOT_DIR/node-$id"
  "$CAIRN" agent --node-id "$id" --data-dir "$ROOT_DIR/node-$id" \
    --client-address "127.0.0.1:$((BASE + id))" --peer-address "127.0.0.1:$((BASE + 100 + id))" \
    --metrics-address "127.0.0.1:$((BASE + 200 + id))" --members "$MEMBERS" \
    --write-stage-timing --log-level warn >"$ROOT_DIR/node-$id.log" 2>&1 &
  PIDS+=($!)
done

leader=""
for _ in $(seq 1 100); do
  leader=$("$CAIRN" status --endpoints "$ENDPOINTS" -o json 2>/dev/null \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["leader_id"] or "")' 2>/dev/null || true)
  [ -n "$leader" ] && [ "$leader" != 0 ] && break
  sleep 0.2
done
[ -n "$leader" ] && [ "$leader" != 0 ] || { echo "no leader; logs in $ROOT_DIR" >&2; exit 1; }
log "leader: node $leader; data under $ROOT_DIR ($(df -T "$ROOT_DIR" | awk 'NR==2 {print $2}'))"

c=$CLIENTS
log "write, $c client(s), $DURATION s"
"$CAIRN" bench write --endpoints "127.0.0.1:$((BASE + leader))" --clients "$c" --connections 1 \
  --duration "$DURATION"
curl -fsS "http://127.0.0.1:$((BASE + 200 + leader))/metrics" | python3 -c '
import re, sys
rows = {}
for line in sys.stdin:
    m = re.match(r"cairn_write_stage_seconds\{stage=\"(\w+)\",quantile=\"([0-9.]+)\"\} (\S+)", line)
    if m:
        rows.setdefault(m.group(1), {})[m.group(2)] = float(m.group(3)) * 1e6
order = ["queue", "propose", "replicate", "commit", "apply", "answer", "total"]
print("| stage | p50 (us) | p99 (us) |")
print("| --- | --- | --- |")
for s in order:
    if s in rows:
        print("| %s | %.0f | %.0f |" % (s, rows[s].get("0.5", float("nan")), rows[s].get("0.99", float("nan"))))
'
