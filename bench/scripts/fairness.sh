#!/bin/bash
# fairness.sh -- a well-behaved writer (1 client, 100 writes/s) alone, then beside a runaway (64
# clients on 4 connections at full speed), on a three-node cluster with grants, all to the leader
# (docs/benchmarks.md, "Fairness"); the runaway's grant first without a rate limit, then with
# requests_per_second = 2000; two rounds of each. (bench asks the cluster's status to find the
# leader, hence admin on both grants: a grant is one caller whatever its roles.) env: CAIRN (default target/release/cairn), OUT.
set -u
B=${CAIRN:-target/release/cairn}
D=${OUT:-/tmp/cairn-fairness}; rm -rf "$D"; mkdir -p "$D"
mk() { $B token new 2>/dev/null; }
read -r ADMIN ADMIN_H < <(mk | paste -sd' ')
read -r RUN RUN_H < <(mk | paste -sd' ')
read -r GOOD GOOD_H < <(mk | paste -sd' ')
echo "$ADMIN" > $D/node.token
cfg() { # $1 = extra line for the runaway grant
cat > $D/auth.toml <<CFG
[auth]
node_token_file = "$D/node.token"

[[auth.grants]]
name = "harness"
$ADMIN_H
admin = true

[[auth.grants]]
name = "runaway"
$RUN_H
write = { types = ["bench.*"], tenancies = ["*"] }
admin = true
$1

[[auth.grants]]
name = "good"
$GOOD_H
write = { types = ["bench.*"], tenancies = ["*"] }
admin = true
CFG
}
MEMBERS=1=127.0.0.1:18101/127.0.0.1:18001,2=127.0.0.1:18102/127.0.0.1:18002,3=127.0.0.1:18103/127.0.0.1:18003
start() {
  rm -rf $D/n1 $D/n2 $D/n3
  for n in 1 2 3; do
    $B agent --config $D/auth.toml --node-id $n --data-dir $D/n$n --client-address 127.0.0.1:1800$n --peer-address 127.0.0.1:1810$n --members $MEMBERS --log-level warn > $D/n$n.log 2>&1 &
  done
  sleep 6
  $B status --endpoints 127.0.0.1:18001,127.0.0.1:18002,127.0.0.1:18003 --token $ADMIN | head -1
}
stop() { pkill -f "data-dir $D/n" ; sleep 2; }
good() { $B bench write --endpoints 127.0.0.1:18001,127.0.0.1:18002,127.0.0.1:18003 --token $GOOD --clients 1 --rate 100 --duration $1 --warmup 2 --namespace good --label "$2"; }
runaway() { $B bench write --endpoints 127.0.0.1:18001,127.0.0.1:18002,127.0.0.1:18003 --token $RUN --clients 64 --connections 4 --duration $1 --warmup 0 --namespace runaway --label "$2"; }
round() { # $1 label
  good 20 "good alone ($1)" 2>&1 | grep -E "^write|label|ops/s" 
  runaway 30 "runaway ($1)" > $D/runaway.out 2>&1 &
  local runaway_pid=$!
  sleep 4
  good 20 "good beside the runaway ($1)" 2>&1 | grep -E "^write|ops/s"
  wait $runaway_pid
  grep -E "^write|ops/s|errors" $D/runaway.out
}
for i in 1 2; do
  cfg ""; start; echo "== no rate limit on the runaway, run $i"; round "no limit"; stop
  cfg "requests_per_second = 2000"; start; echo "== runaway requests_per_second = 2000, run $i"; round "2000/s"; stop
done
