#!/usr/bin/env bash
# An operator's OOM drill, by hand (root, memory cgroups v1 at /sys/fs/cgroup/memory):
# 3 nodes in 700 MiB memory cgroups, one writer of 512 KiB resources with new names until
# the kernel kills a node; then the dead node is restarted in its cgroup twice (each life may
# be OOM-killed again: that is the kernel, not a failed start), then with 8 GiB. A life that
# exits by itself (a FATAL exit code) or a last life that is not up after 40 s is a failed
# restart. Prints one RESULT line; loops: `for r in $(seq 1 20); do ./oom-kill-restart.sh $r; done`.
# Uses ports 17001-17003 and 18001-18003; docs/testing.md has the results.
set -u
BIN=${BIN:-target/release/cairn}
RUN=${1:?usage: oom-kill-restart.sh RUN_NUMBER}
ROOT=${ROOT:-/tmp/cairn-oom-drill}/run-$RUN
LIMIT=700M
rm -rf "$ROOT"; mkdir -p "$ROOT"
MEMBERS="1=127.0.0.1:18001/127.0.0.1:17001,2=127.0.0.1:18002/127.0.0.1:17002,3=127.0.0.1:18003/127.0.0.1:17003"
declare -A PID
start() {
  local id=$1 limit=$2
  local cg=/sys/fs/cgroup/memory/cairn-repro-$id
  mkdir -p $cg; echo $limit > $cg/memory.limit_in_bytes
  ( echo $BASHPID > $cg/cgroup.procs; exec $BIN agent --node-id $id --data-dir $ROOT/node-$id \
     --client-address 127.0.0.1:1700$id --peer-address 127.0.0.1:1800$id --members $MEMBERS \
     --log-level info >> $ROOT/node-$id.log 2>&1 ) &
  PID[$id]=$!
}
for i in 1 2 3; do start $i $LIMIT; done
sleep 4
$BIN bench write --endpoints 127.0.0.1:17001,127.0.0.1:17002,127.0.0.1:17003 --value-size 524288 --sequential-keys --key-space 1000000 --duration 150 --warmup 0 --clients 1 > $ROOT/bench.out 2>&1 &
BENCH=$!
dead=""
for t in $(seq 1 150); do
  sleep 1
  for i in 1 2 3; do kill -0 ${PID[$i]} 2>/dev/null || { dead=$i; break 2; }; done
done
kill $BENCH 2>/dev/null; wait $BENCH 2>/dev/null
result="no-kill"
if [ -n "$dead" ]; then
  wait ${PID[$dead]}; rc=$?
  result="node $dead died rc=$rc"
  verdict=OK
  for life in 2 3 4; do
    if [ $life = 4 ]; then start $dead 8G; else start $dead $LIMIT; fi
    for t in $(seq 1 40); do sleep 1; kill -0 ${PID[$dead]} 2>/dev/null || break; done
    if kill -0 ${PID[$dead]} 2>/dev/null; then
      result="$result; life $life up"
      [ $life = 4 ] && break
      kill -9 ${PID[$dead]}; wait ${PID[$dead]} 2>/dev/null; sleep 1; continue
    fi
    wait ${PID[$dead]}; rc=$?
    if [ $rc = 137 ]; then result="$result; life $life OOM-killed"; [ $life = 4 ] && verdict=FAILED
    else result="$result; life $life EXITED rc=$rc"; verdict=FAILED; fi
  done
  if [ $verdict = FAILED ]; then grep FATAL $ROOT/node-$dead.log | tail -1 | cut -c1-300; cp -a $ROOT $ROOT.failed 2>/dev/null; fi
else verdict=NOKILL; fi
for i in 1 2 3; do kill -9 ${PID[$i]} 2>/dev/null; done; wait 2>/dev/null
echo "RESULT run $RUN: $verdict ($result)"
rm -rf $ROOT/node-*/raft-log $ROOT/node-*/snapshots
