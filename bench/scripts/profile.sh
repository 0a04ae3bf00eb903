#!/usr/bin/env bash
# profile.sh -- load-independent cost of a write on each node of a 3-node cluster on tmpfs:
# instructions (valgrind callgrind, every node under it) or context switches and CPU time
# (perf stat software events), over a fixed number of `cairn bench write` operations.
# Used for docs/benchmarks.md's write-path profile; the machine may be loaded, since neither
# figure depends on wall-clock time (CPU time a little, through caches).
#
# usage: bench/scripts/profile.sh callgrind|perfstat|switches|record --clients N --ops N [--out DIR]
#   switches: every context switch of each node (perf record -e sched:sched_switch -g), per
#   write, by why the thread stopped: asleep in epoll_wait (a tokio worker parked in the I/O
#   driver), asleep on a futex (a worker parked without the driver, the WAL thread waiting
#   for work), or preempted (runnable, displaced by a thread it or another woke).
# env: CAIRN (the binary; default target/release/cairn), BASE_PORT (17400),
#      PRIME_OPS (2000: unmeasured writes first, so every key exists and every path is warm)
#      PERF_HZ (4000) and PERF_CALLGRAPH (-g; e.g. "--call-graph dwarf,16384" for callers
#      through frames without frame pointers): `record` mode's sampling
# Output: one line per node: node id, role, instructions (or context switches and CPU µs)
# per write; callgrind files stay in DIR for callgrind_annotate.
# Every process started here is stopped by its pid on exit.
set -euo pipefail

MODE=$1; shift
CLIENTS=1 OPS=2000 OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --clients) CLIENTS=$2; shift 2 ;;
    --ops) OPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "unknown arg: $1" >&2; exit 2 ;;
  esac
done
case "$MODE" in callgrind|perfstat|switches|record) ;; *) echo "mode: callgrind|perfstat|switches|record" >&2; exit 2 ;; esac
[ "$MODE" = switches ] && RECORD_EVENT=sched:sched_switch
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CAIRN=${CAIRN:-$ROOT/target/release/cairn}
BASE=${BASE_PORT:-17400}
PRIME=${PRIME_OPS:-2000}
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/cairn-profile.XXXXXX)
mkdir -p "$OUT"
DATA=$(mktemp -d /dev/shm/cairn-profile.XXXXXX)
MEMBERS="1=127.0.0.1:$((BASE + 1001))/127.0.0.1:$((BASE + 1)),2=127.0.0.1:$((BASE + 1002))/127.0.0.1:$((BASE + 2)),3=127.0.0.1:$((BASE + 1003))/127.0.0.1:$((BASE + 3))"
EPS=127.0.0.1:$((BASE + 1)),127.0.0.1:$((BASE + 2)),127.0.0.1:$((BASE + 3))
PIDS=() PERFS=()
cleanup() {
  for p in "${PERFS[@]}" "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
  rm -rf "$DATA"
}
trap cleanup EXIT

if [ "$MODE" = callgrind ]; then
  TIMING=(--election-timeout-ms 20000 --heartbeat-interval-ms 2000)
  WRAP=(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$OUT/callgrind.out.node%q{PROFILE_NODE}")
else
  TIMING=() WRAP=()
fi
for id in 1 2 3; do
  PROFILE_NODE=$id "${WRAP[@]}" "$CAIRN" agent --node-id $id --data-dir "$DATA/node-$id" \
    --client-address 127.0.0.1:$((BASE + id)) --peer-address 127.0.0.1:$((BASE + 1000 + id)) \
    --members "$MEMBERS" --log-level warn "${TIMING[@]}" >"$OUT/node-$id.log" 2>&1 &
  PIDS+=($!)
done
leader=""
for _ in $(seq 1 600); do
  leader=$("$CAIRN" status --endpoints "$EPS" -o json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("leader_id") or "")' 2>/dev/null || true)
  [ -n "$leader" ] && [ "$leader" != 0 ] && break
  sleep 0.5
done
[ -n "$leader" ] || { echo "no leader" >&2; tail "$OUT"/node-*.log >&2; exit 1; }
bench() {  # bench CLIENTS OPS
  "$CAIRN" bench write --endpoints "$EPS" --clients "$1" --connections 1 --warmup 0 \
    --duration 3600 --max-ops "$2" --op-timeout-ms 600000 -o json
}
bench 64 "$PRIME" >"$OUT/prime.json"
if [ "$MODE" = callgrind ]; then
  for p in "${PIDS[@]}"; do callgrind_control -i on "$p" >/dev/null; done
  bench "$CLIENTS" "$OPS" >"$OUT/run.json"
  for p in "${PIDS[@]}"; do callgrind_control -d "$p" >/dev/null; done
  for id in 1 2 3; do
    f=$(ls "$OUT"/callgrind.out.node$id.* | sort -V | tail -1)
    ir=$(callgrind_annotate "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    role=follower; [ "$id" = "$leader" ] && role=leader
    echo "node $id $role: $ir instructions, $((ir / OPS)) per write ($f)"
  done
elif [ "$MODE" = record ] || [ "$MODE" = switches ]; then
  for id in 1 2 3; do
    perf record -e ${RECORD_EVENT:-cpu-clock -F ${PERF_HZ:-4000}} ${PERF_CALLGRAPH:--g} -p "${PIDS[$((id - 1))]}" -o "$OUT/perf.data.node$id" 2>/dev/null &
    PERFS+=($!)
  done
  sleep 0.5
  bench "$CLIENTS" "$OPS" >"$OUT/run.json"
  for p in "${PERFS[@]}"; do kill -INT "$p"; done
  wait "${PERFS[@]}" 2>/dev/null || true
  PERFS=()
  echo "leader: node $leader; perf report -i $OUT/perf.data.nodeN"
  if [ "$MODE" = switches ]; then
    for id in 1 2 3; do
      role=follower; [ "$id" = "$leader" ] && role=leader
      perf script -i "$OUT/perf.data.node$id" -F comm,event,trace,ip,sym 2>/dev/null |
        python3 -c '
import collections, re, sys
ops, name = int(sys.argv[1]), sys.argv[2]
counts, total = collections.Counter(), 0
for block in sys.stdin.read().split("\n\n"):
    lines = [l.strip() for l in block.strip().split("\n") if l.strip()]
    if not lines:
        continue
    state = re.search(r"prev_state=(\S+)", lines[0])
    stack = " ".join(lines[1:])
    if "epoll_wait" in stack:
        why = "asleep in epoll_wait"
    elif state and state.group(1) == "R":
        why = "preempted"
    elif "futex" in stack:
        why = "asleep on a futex"
    else:
        why = "asleep, other"
    counts[(lines[0].split()[0], why)] += 1
    total += 1
print("%s: %.2f context switches per write" % (name, total / ops))
for (thread, why), n in counts.most_common():
    if n / ops >= 0.01:
        print("  %.2f %s, %s" % (n / ops, thread, why))
' "$OPS" "node $id $role"
    done
  fi
else
  for id in 1 2 3; do
    perf stat -e context-switches,cpu-migrations,task-clock -p "${PIDS[$((id - 1))]}" \
      -o "$OUT/perf.node$id" &
    PERFS+=($!)
  done
  sleep 0.5
  bench "$CLIENTS" "$OPS" >"$OUT/run.json"
  for p in "${PERFS[@]}"; do kill -INT "$p"; done
  wait "${PERFS[@]}" 2>/dev/null || true
  PERFS=()
  for id in 1 2 3; do
    cs=$(awk '/context-switches/ {gsub(",", "", $1); print $1}' "$OUT/perf.node$id")
    ms=$(awk '/task-clock/ {gsub(",", "", $1); print $1}' "$OUT/perf.node$id")
    role=follower; [ "$id" = "$leader" ] && role=leader
    python3 -c "print('node $id $role: %.2f context switches, %.1f us CPU per write' % ($cs / $OPS, $ms * 1000 / $OPS))"
  done
fi
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("bench:", json.dumps(r)[:600])' "$OUT/run.json"
