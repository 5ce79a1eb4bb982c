#!/usr/bin/env python3
"""The table of scripts/bench-ab.sh: every figure of `gdsfs bench stage`,
`lease` and `loader` per round for binary A and binary B, and B/A of the
medians.

    python3 scripts/bench-ab.py A.jsonl B.jsonl [A_NAME B_NAME]

Exits 1 when a file holds no report or the two hold different figures.
"""
import json
import statistics
import sys


def figures(path):
    """{figure name: (unit, [value per round])} from one binary's reports."""
    out = {}

    def add(name, unit, value):
        if value is None:
            return
        out.setdefault(name, (unit, []))[1].append(float(value))

    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            rep = json.loads(line)
            res = rep.get("result") or {}
            kind = rep.get("bench")
            if kind == "stage":
                for row in res.get("rows") or []:
                    if row.get("kind") in ("defaults", "baseline"):
                        add("stage: " + row["name"], "GB/s", row.get("warm_gbps"))
            elif kind == "lease":
                for row in res.get("rows") or []:
                    for size, ms in sorted((row.get("median_ms") or {}).items()):
                        add("lease: %s %s" % (row["name"], size), "ms", ms)
            elif kind == "loader":
                for name, ep in sorted((res.get("epochs") or {}).items()):
                    leases = ep.get("lease_gbps") or []
                    if leases:
                        add("loader: %s leases, first epoch" % name, "GB/s", leases[0])
                        add("loader: %s leases, best epoch" % name, "GB/s", max(leases))
                big = res.get("big") or {}
                if big.get("load_gbps"):
                    add("loader: gdsfs.load not resident, best", "GB/s", max(big["load_gbps"]))
    return out


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip())
        return 2
    names = argv[3:5] if len(argv) >= 5 else ["A", "B"]
    a, b = figures(argv[1]), figures(argv[2])
    if not a or not b:
        print("bench-ab: no report in %s" % (argv[1] if not a else argv[2]))
        return 1
    print("A = %s\nB = %s\n" % (names[0], names[1]))
    print("%-58s %-5s %-24s %-24s %s" % ("figure", "unit", "A rounds", "B rounds", "B/A (medians)"))
    bad = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            print("%-58s only in %s" % (name, "A" if name in a else "B"))
            bad = 1
            continue
        unit, av = a[name]
        _, bv = b[name]
        ma, mb = statistics.median(av), statistics.median(bv)
        ratio = "%.3f" % (mb / ma) if ma else "-"
        fmt = lambda vs: " ".join("%.3f" % v for v in vs)  # noqa: E731
        print("%-58s %-5s %-24s %-24s %s" % (name, unit, fmt(av), fmt(bv), ratio))
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv))
