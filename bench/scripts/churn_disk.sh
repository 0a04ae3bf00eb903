#!/usr/bin/env bash
# churn_disk.sh -- the data dir under churn (docs/benchmarks.md, "Disk under churn"): a fresh
# three-node `cairn dev`, then 1,000,000 overwrites of 1,000 resources (256-byte values, 64
# clients on 4 connections); every 2 s, each node's data dir size, applied data and the
# commit index are sampled into $OUT/samples.txt (unix time, commit index, three data_bytes,
# three data dir sizes in bytes). No compaction or defragmentation command is ever run.
#
# usage: bench/scripts/churn_disk.sh [--ops N] [--value-size B] [--out DIR]
# env: CAIRN (the binary; default target/release/cairn).
set -euo pipefail
OPS=1000000
VALUE=256
OUT=/tmp/cairn-churn
while [ $# -gt 0 ]; do
  case "$1" in
    --ops) OPS=$2; shift 2 ;;
    --value-size) VALUE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
B=${CAIRN:-target/release/cairn}
rm -rf "$OUT"; mkdir -p "$OUT"
"$B" dev --fresh --data-dir "$OUT/dev" --base-port 17000 > "$OUT/dev.out" 2>&1 &
DEV=$!
SAMPLER=
trap 'kill $SAMPLER 2>/dev/null || true; kill -INT $DEV 2>/dev/null || true; wait $DEV 2>/dev/null || true' EXIT
sleep 5
EP=127.0.0.1:17001,127.0.0.1:17002,127.0.0.1:17003
( while kill -0 $DEV 2>/dev/null; do
    state=$("$B" status -o json --endpoints $EP 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["commit_index"], " ".join(str(m.get("data_bytes",0)) for m in d["members"]))' 2>/dev/null || echo "- - - -")
    sizes=$(for n in 1 2 3; do du -sb "$OUT/dev/node-$n" 2>/dev/null | cut -f1; done | tr '\n' ' ')
    echo "$(date +%s) $state $sizes"
    sleep 2
  done ) > "$OUT/samples.txt" &
SAMPLER=$!
"$B" bench write --endpoints $EP --clients 64 --connections 4 --key-space 1000 --value-size "$VALUE" --max-ops "$OPS" --duration 3600 | tee "$OUT/bench.out"
sleep 6
echo "samples in $OUT/samples.txt"
