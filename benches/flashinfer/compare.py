#!/usr/bin/env python3
"""Side-by-side table of our decode timings against FlashInfer's better path, per shape name,
with the geomean speedup (> 1: ours is faster); with XQA.json, XQA's time as a third column and
the speedup over the faster of the two.

usage: compare.py OURS.json FI.json [XQA.json]
OURS.json: `paged-decode bench --json` rows ({"name", "us", ...}); FI.json from bench.py;
XQA.json from xqa.py. XQA's time counts only where its output was checked and is within
XQA_TOL of the reference (it rounds q to fp8; its E5M2 output is wrong). The rows left out of
the geomean (a side without a time) are counted below it.
"""
import json
import math
import sys

# XQA's relative error on the rows it runs right: about 4e-2, from q rounded to fp8.
XQA_TOL = 0.1


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    ours = {r["name"]: r for r in json.load(open(sys.argv[1]))}
    fi = json.load(open(sys.argv[2]))
    xqa = {r["name"]: r for r in json.load(open(sys.argv[3]))} if len(sys.argv) == 4 else None
    xqa_head = f" {'XQA us':>8s}" if xqa is not None else ""
    vs = "vs best" if xqa is not None else "speedup"
    print(f"{'shape':30s} {'ours us':>9s} {'FI best us':>11s} {vs:>8s} {'ours TB/s':>10s}{xqa_head}")
    logs, left_out, xqa_wrong = [], [], []
    for r in fi:
        o = ours.get(r["name"])
        xr = (xqa or {}).get(r["name"], {})
        x = xr.get("xqa_us")
        xqa_col = (f" {x:8.1f}" if x is not None else f" {'-':>8s}") if xqa is not None else ""
        if x is not None and not xr.get("xqa_relerr", math.inf) <= XQA_TOL:
            xqa_wrong.append(r["name"])
            xqa_col += " (wrong output: not counted)"
            x = None
        if o is None or r.get("best_us") is None or o.get("us") is None:
            left_out.append(r["name"])
            print(f"{r['name']:30s} {'-':>9s} {str(r.get('best_us')):>11s}")
            continue
        best = min(r["best_us"], x) if x is not None else r["best_us"]
        speedup = best / o["us"]
        logs.append(math.log(speedup))
        tb_s = r["bytes"] / (o["us"] * 1e-6) / 1e12
        print(f"{r['name']:30s} {o['us']:9.1f} {r['best_us']:11.1f} {speedup:8.2f} {tb_s:10.2f}{xqa_col}")
    if logs:
        print(f"geomean speedup over {len(logs)} shapes: {math.exp(sum(logs) / len(logs)):.3f}   "
              f"worst: {math.exp(min(logs)):.3f}")
    if left_out:
        print(f"left out of the geomean (a side without a time): {len(left_out)}: {', '.join(left_out)}")
    if xqa_wrong:
        print(f"XQA not counted (output beyond {XQA_TOL} of the reference): {', '.join(xqa_wrong)}")


if __name__ == "__main__":
    sys.exit(main())
