#!/usr/bin/env python3
"""targets.py CAIRN_RESULTS ETCD_RESULTS -- the write-path targets of docs/benchmarks.md as one
markdown table, from `compare.sh`'s results.jsonl (Cairn) and `etcd-baseline/run.sh`'s
results.jsonl (etcd), measured back to back. Repeated runs (`runN` labels) are reduced to their
median. Ratios are Cairn / etcd (for latency and CPU, lower is better; for ops/s, higher)."""
import json
import statistics
import sys


def rows(path):
    out = []
    for line in open(path):
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def runs(rs, prefix):
    return [r for r in rs if str(r.get("label", "")).startswith(prefix)]


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def cairn_fig(rs, prefix):
    picked = runs(rs, prefix)
    if not picked:
        return None
    def lat(r, q):
        return (r.get("latency", {}).get("write") or r.get("latency", {}).get("read") or {}).get(q)
    def cpu(r):
        # The report's own figure per node (cpu_us_per_op), summed over the nodes.
        vals = [s.get("cpu_us_per_op") for s in r.get("servers", [])]
        return sum(vals) if vals and None not in vals else None
    def switches(r):
        vals = [s.get("context_switches_per_op") for s in r.get("servers", [])]
        return sum(vals) if vals and None not in vals else None
    return {
        "ops": median([r.get("ops_per_s") for r in picked]),
        "p50": median([lat(r, "p50_ms") for r in picked]),
        "p99": median([lat(r, "p99_ms") for r in picked]),
        "cpu_us": median([cpu(r) for r in picked]),
        "switches": median([switches(r) for r in picked]),
        "n": len(picked),
    }


def etcd_fig(rs, prefix):
    picked = runs(rs, prefix)
    if not picked:
        return None
    return {
        "ops": median([r.get("ops_per_s") for r in picked]),
        "p50": median([r["lat_ms"]["p50"] for r in picked]),
        "p99": median([r["lat_ms"]["p99"] for r in picked]),
        "cpu_us": median([r["server_cpu_cores"] / r["ops_per_s"] * 1e6 for r in picked if r.get("ops_per_s")]),
        "n": len(picked),
    }


def fmt(v, digits=2, unit=""):
    return "–" if v is None else f"{v:,.{digits}f}{unit}"


def ratio(a, b):
    return "–" if a is None or b in (None, 0) else f"{a / b:.2f}×"


def main():
    cairn, etcd = rows(sys.argv[1]), rows(sys.argv[2])
    print("| target | etcd 3.4 | Cairn | Cairn / etcd | target met |")
    print("| --- | --- | --- | --- | --- |")

    c1, e1 = cairn_fig(cairn, "put c=1 run"), etcd_fig(etcd, "put c=1 run")
    if c1 and e1:
        r = c1["p50"] / e1["p50"]
        print(f"| put, 1 client: p50 ≤ etcd's (aim 0.6×) | {fmt(e1['p50'])} ms ({fmt(e1['ops'], 0)} ops/s) | "
              f"{fmt(c1['p50'])} ms ({fmt(c1['ops'], 0)} ops/s) | {r:.2f}× | {'yes' if r <= 1 else 'no'} |")
    for conns in ("1", "64"):
        c, e = cairn_fig(cairn, f"put c=64 conns={conns} run"), etcd_fig(etcd, f"put c=64 conns={conns} run")
        if c and e:
            r = c["ops"] / e["ops"]
            print(f"| put, 64 clients on {conns} connection{'s' if conns != '1' else ''}: ≥ 2× etcd's ops/s (aim 3×) | "
                  f"{fmt(e['ops'], 0)} ops/s | {fmt(c['ops'], 0)} ops/s | {r:.2f}× | {'yes' if r >= 2 else 'no'} |")
            r99 = c["p99"] / e["p99"]
            print(f"| put, 64 clients on {conns} connection{'s' if conns != '1' else ''}: p99 ≤ etcd's | "
                  f"{fmt(e['p99'])} ms | {fmt(c['p99'])} ms | {r99:.2f}× | {'yes' if r99 <= 1 else 'no'} |")
    c, e = cairn_fig(cairn, "put c=64 conns=1 run"), etcd_fig(etcd, "put c=64 conns=1 run")
    if c and e and c["cpu_us"] and e["cpu_us"]:
        r = c["cpu_us"] / e["cpu_us"]
        print(f"| CPU per write, all nodes (64 clients, 1 connection): below etcd's | {fmt(e['cpu_us'], 0)} µs | "
              f"{fmt(c['cpu_us'], 0)} µs ({fmt(c['switches'], 1)} context switches) | {r:.2f}× | {'yes' if r < 1 else 'no'} |")
    grown = [r for r in cairn if str(r.get("label", "")).startswith("put c=1 after ")]
    if c1 and grown:
        g = cairn_fig(cairn, "put c=1 after ")
        r = g["p50"] / c1["p50"]
        print(f"| put, 1 client, p50 after the growth writes ({grown[0]['label'][len('put c=1 after '):]}): within 10 % of fresh | – | "
              f"{fmt(g['p50'])} ms (fresh {fmt(c1['p50'])} ms) | {r:.2f}× of fresh | {'yes' if r <= 1.1 else 'no'} |")
    for name, cp, ep in (("get, strong / linearizable, 16 clients", "get strong", "get linearizable c=16 conns=1 (after puts)"),
                         ("get, eventual / serializable, 16 clients", "get eventual", "get serializable c=16 conns=1 (after puts)")):
        c, e = cairn_fig(cairn, cp), etcd_fig(etcd, ep)
        if c and e:
            print(f"| {name} | {fmt(e['ops'], 0)} ops/s, p99 {fmt(e['p99'])} ms | {fmt(c['ops'], 0)} ops/s, p99 {fmt(c['p99'])} ms | "
                  f"{ratio(c['ops'], e['ops'])} | – |")


main()
