#!/usr/bin/env bash
# The rolling-upgrade, rollback and downgrade runbooks of docs/upgrading.md, followed step by
# step on five local nodes (loopback ports 19001-19005 and 19101-19105), as an operator would:
#   OLD=path/to/cairn-0.1.0 NEW=path/to/cairn DIR=scratch-dir tests/compat/drills/upgrade-five-nodes.sh
# (`jepsen-tests upgrade` builds 0.1.0 into target/compat/cairn-0.1.0.) Prints each step and
# what `cairn status` says; read the output, it is not a test.
set -uo pipefail
OLD=${OLD:?set OLD to a cairn 0.1.0 binary}
NEW=${NEW:?set NEW to the cairn binary to upgrade to}
D=${DIR:?set DIR to a scratch directory}/data
rm -rf $D; mkdir -p $D
MEMBERS=$(for i in 1 2 3 4 5; do printf "%s=127.0.0.1:1910%s/127.0.0.1:1900%s," $i $i $i; done); MEMBERS=${MEMBERS%,}
export CAIRN_ENDPOINTS=$(for i in 1 2 3 4 5; do printf "127.0.0.1:1900%s," $i; done); CAIRN_ENDPOINTS=${CAIRN_ENDPOINTS%,}
declare -A PID
start() { # id binary
  "$2" agent --node-id $1 --data-dir $D/node-$1 --client-address 127.0.0.1:1900$1 --peer-address 127.0.0.1:1910$1 --members "$MEMBERS" --log-level warn >>$D/node-$1.log 2>&1 &
  PID[$1]=$!
}
stop() { kill -TERM ${PID[$1]}; wait ${PID[$1]} 2>/dev/null; echo "  node $1 stopped (exit $?)"; }
leader() { $NEW status -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["leader_id"])'; }
cv() { $NEW status -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["cluster_version"])'; }
wait_caught_up() { # id
  for _ in $(seq 1 100); do
    ok=$($NEW status -o json 2>/dev/null | python3 -c "
import json,sys; s=json.load(sys.stdin)
m=[m for m in s['members'] if m['id']==$1][0]
print('yes' if m.get('reachable') and m.get('lag_entries',1)==0 else 'no')" 2>/dev/null)
    [ "$ok" = yes ] && return 0; sleep 0.2
  done; echo "  node $1 did not catch up"; return 1
}
writes() { # prefix count
  for i in $(seq 1 $2); do $NEW write --type demo.v1.Thing --name $1-$i --data-json "{\"i\":$i}" >/dev/null || echo "  write $1-$i FAILED"; done
}
replace() { # id binary
  echo "== replace node $1 with $($2 --version)"; stop $1; start $1 $2; wait_caught_up $1 && echo "  node $1 caught up; cluster version $(cv)"
}

echo "== 5 nodes of $($OLD --version)"; for i in 1 2 3 4 5; do start $i $OLD; done; sleep 4
$NEW status; writes before 50
$NEW snapshot save $D/before-upgrade.snap
L=$(leader); echo "leader: $L"
for i in 1 2 3 4 5; do [ $i = $L ] && continue; replace $i $NEW; writes during-$i 10; done
echo "== cluster version with 4 of 5 upgraded: $(cv)"
$NEW write-status --type demo.v1.Thing --name before-1 --status-key health --status '{"observed_generation":"1"}' >/dev/null; echo "  write-status exit $? (1 expected: FAILED_PRECONDITION)"
echo "== rollback one member before the rise"; F=$(( L % 5 + 1 )); replace $F $OLD; writes rolled-back 10; replace $F $NEW
echo "== the leader last: transfer, then replace"; $NEW transfer-leader; replace $L $NEW
sleep 4; echo "== cluster version after the last member: $(cv)"
$NEW status
$NEW write-status --type demo.v1.Thing --name before-1 --status-key health --status '{"observed_generation":"1"}' >/dev/null && echo "  write-status works at 0.2"
echo "== downgrade runbook"; $NEW cluster downgrade --to 0.1
for i in 1 2 3 4 5; do [ $i = "$(leader)" ] && continue; replace $i $OLD; writes after-down-$i 5; done
L=$(leader); $NEW transfer-leader; replace $L $OLD
sleep 2; $NEW status
N=$($NEW list --type demo.v1.Thing -o json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["resources"]))'); echo "== resources on the 0.1.0 cluster: $N (expected 50 + 4x10 + 10 + 4x5 = 120)"
$NEW read --type demo.v1.Thing --name before-1 -o json | python3 -c 'import json,sys; r=json.load(sys.stdin); print("  before-1 status kept:", r.get("status"))'
echo "== forward again: every member new, then cancel"
for i in 1 2 3 4 5; do [ $i = "$(leader)" ] && continue; replace $i $NEW; done
L=$(leader); $NEW transfer-leader; replace $L $NEW
$NEW cluster downgrade --cancel; sleep 4; echo "  cluster version: $(cv)"
for i in 1 2 3 4 5; do stop $i; done
grep -h "FATAL\|panicked" $D/node-*.log | head
echo "== done"
