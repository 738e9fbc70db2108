#!/usr/bin/env python3
"""Summarises benchmarks/decode_bound.sh: per round and as medians, batch-1 decode time against
the memory-bandwidth bound (weight and KV bytes touched over the read bandwidth calibrated just
before), for each model and thread count.

    clients/python/bound_table.py DECODE_BOUND_DIR [--json OUT.json]
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="OUT_DIR of benchmarks/decode_bound.sh")
    ap.add_argument("--json", help="also write the table here")
    args = ap.parse_args()
    rows = {}
    for path in sorted(glob.glob(os.path.join(args.dir, "sweep_*_t*.json"))):
        m = re.search(r"sweep_(\d+)_(\w+?)_t(\d+)\.json$", path)
        if not m:
            continue
        round_, model, threads = int(m.group(1)), m.group(2), int(m.group(3))
        with open(path) as f:
            sweep = json.load(f)
        with open(os.path.join(args.dir, f"hw_{round_}_t{threads}.json")) as f:
            hw = json.load(f)
        point = next(p for p in sweep["points"] if p["batch"] == 1)
        read = hw["measurements"]["read_bytes_per_second"]
        # The bound against the read bandwidth alone (the profile's takes the best of read,
        # triad and GEMV stream).
        fraction = point["bytes"] / read / point["observed_s"]
        rows.setdefault((model, threads), []).append(
            {"round": round_, "observed_ms": point["observed_s"] * 1e3, "tokens_per_s": point["tokens_per_s"],
             "bytes": point["bytes"], "read_gbps": read / 1e9, "fraction_of_read_bound": fraction})
    if not rows:
        sys.exit(f"bound_table.py: no sweep_*_t*.json in {args.dir}")
    print(f"{'model':>8} {'threads':>7} {'rounds':>6} {'MB/token':>9} {'read GB/s (med)':>16} {'tok/s (med)':>12} "
          f"{'of bound (med)':>15} {'range':>13}")
    table = []
    for (model, threads), rs in sorted(rows.items()):
        fr = [r["fraction_of_read_bound"] for r in rs]
        entry = {"model": model, "threads": threads, "rounds": len(rs),
                 "median_fraction_of_read_bound": statistics.median(fr), "min": min(fr), "max": max(fr),
                 "median_read_gbps": statistics.median(r["read_gbps"] for r in rs),
                 "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs), "per_round": rs}
        table.append(entry)
        print(f"{model:>8} {threads:>7} {len(rs):>6} {rs[0]['bytes'] / 1e6:>9.1f} {entry['median_read_gbps']:>16.1f} "
              f"{entry['median_tokens_per_s']:>12.1f} {entry['median_fraction_of_read_bound']:>15.2f} "
              f"{min(fr):>6.2f}-{max(fr):<6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)


if __name__ == "__main__":
    main()
