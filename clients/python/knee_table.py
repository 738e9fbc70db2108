#!/usr/bin/python3
"""Summarises decode sweeps (`moeserve bench --sweep-batch ... --out FILE.json`) as a Markdown
table of where the knee sits against the critical batch, one row per model and weight dtype.

    clients/python/knee_table.py sweep1.json sweep2.json ... [--plot knees.png]

Columns: experts hit per layer at batch 1 and at the critical batch, the critical batch (compute
time = memory time at the profile's peaks), the knee of the roofline bound and the measured knee
as multiples of it (ranges over every context and file), how many of those measured ratios lie
within a factor 1.5, and the calibrated model's median error. With --plot, a PNG of the measured
knee against the roofline bound's knee (both over the critical batch), one marker per model,
with the band the bar allows (1/1.5 to 1.5) shaded.
"""

import argparse
import json
import os
import sys
from collections import defaultdict


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweeps", nargs="+", help="JSON files written by moeserve bench --sweep-batch --out")
    ap.add_argument("--plot", help="also write this PNG")
    args = ap.parse_args()
    rows = defaultdict(list)
    for path in args.sweeps:
        with open(path) as f:
            j = json.load(f)
        if "knees" not in j:
            sys.exit(f"{path}: no \"knees\" (not a decode sweep report)")
        # "PATH (dummy weights, ...)" or "preset small (seed 0, ...)": the name before " (".
        name = j["model"].split(" (")[0]
        key = (os.path.basename(name).removesuffix(".json"), j["weight_dtype"])
        if not j["knees"]:
            print(f"{path}: no knees (fewer than two batch sizes per context); skipped", file=sys.stderr)
            continue
        for k in j["knees"]:
            if k.get("predicted_critical_batch") is None:
                # The machine's FLOP/byte is above what a sequence adds: no compute-bound batch.
                print(f"{path}: context {k['context']}: {k.get('no_critical_batch_reason', 'no critical batch')}; "
                      "skipped", file=sys.stderr)
                continue
            rows[key].append((k, j["calibrated_median_abs_error"], j["points_beating_bound"]))

    def span(values, fmt="{:.2f}"):
        lo, hi = min(values), max(values)
        return fmt.format(lo) if lo == hi else (fmt + "-" + fmt).format(lo, hi)

    print("| model | weights | experts hit, batch 1 / critical | critical batch | bound knee / critical "
          "| measured knee / critical | within 1.5x | median error | faster than bound |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (model, dtype), ks in sorted(rows.items()):
        knees = [k for k, _, _ in ks]
        crit = [k["predicted_critical_batch"] for k in knees]
        measured = [k["measured_over_critical_batch"] for k in knees]
        inside = sum(1 for r in measured if 1 / 1.5 <= r <= 1.5)
        hits = "{:.1f} / {}".format(knees[0]["experts_hit_batch1"],
                                     span([k["experts_hit_at_critical_batch"] for k in knees], "{:.1f}"))
        print(f"| {model} | {dtype} | {hits} | {span(crit, '{:.0f}')} | "
              f"{span([k['predicted_knee_over_critical_batch'] for k in knees])} | {span(measured)} | "
              f"{inside}/{len(measured)} | {span([100 * e for _, e, _ in ks], '{:.1f}')}% | "
              f"{max(b for _, _, b in ks)} |")


    if args.plot:
        plot(rows, args.plot)


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5.5))
    ax.axhspan(1 / 1.5, 1.5, color="tab:green", alpha=0.12, label="within 1.5x of the critical batch")
    ax.plot([0.1, 1.6], [0.1, 1.6], color="grey", linestyle=":", linewidth=1, label="measured knee = bound's knee")
    markers = "osD^v<>px*"
    for i, ((model, dtype), ks) in enumerate(sorted(rows.items())):
        xs = [k["predicted_knee_over_critical_batch"] for k, _, _ in ks]
        ys = [k["measured_over_critical_batch"] for k, _, _ in ks]
        ax.scatter(xs, ys, marker=markers[i % len(markers)], s=36, label=f"{model}, {dtype}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("knee of the roofline bound / critical batch")
    ax.set_ylabel("measured knee / critical batch")
    ax.set_title("Where the decode knee sits against the critical batch")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
