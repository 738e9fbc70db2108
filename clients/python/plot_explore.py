#!/usr/bin/python3
"""Turns `moeserve explore --json FILE` into a PNG chart.

    clients/python/plot_explore.py explore.json --out explore.png

One line per layout (ep x pp): predicted tokens/s against the sequences in flight, filled
where the layout fits (weights and KV per device), hollow where it does not; the best layout
at each count is circled.
"""

import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", help="moeserve explore --json output")
    ap.add_argument("--out", default="explore.png", help="PNG to write")
    args = ap.parse_args()
    with open(args.report) as f:
        r = json.load(f)
    if not r.get("layouts"):
        sys.exit(f"{args.report}: no 'layouts' (is this a moeserve explore --json file?)")
    fig, ax = plt.subplots(figsize=(9, 5.5))
    best = {(b["sequences"], b["ep"], b["pp"]) for b in r.get("best", []) if b["ep"] is not None}
    for layout in r["layouts"]:
        pts = layout["points"]
        if not pts:
            continue
        label = f"ep {layout['ep']} x pp {layout['pp']}"
        xs = [p["sequences"] for p in pts]
        ys = [p["tokens_per_second"] for p in pts]
        (line,) = ax.plot(xs, ys, "-", alpha=0.6, label=label)
        for p in pts:
            ax.plot(p["sequences"], p["tokens_per_second"], "o", color=line.get_color(),
                    fillstyle="full" if p["fits"] else "none")
            if (p["sequences"], layout["ep"], layout["pp"]) in best:
                ax.plot(p["sequences"], p["tokens_per_second"], "o", markersize=14, fillstyle="none", color="black")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("decoding sequences in flight")
    ax.set_ylabel("predicted output tokens/s")
    ax.set_title(f"layouts on up to {r['devices']} x {r['hardware']}, context {r['context']} "
                 "(hollow: does not fit; circled: best)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
