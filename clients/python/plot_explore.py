#!/usr/bin/python3
"""Turns `moeserve explore --json FILE` into a PNG chart.

    clients/python/plot_explore.py explore.json --out explore.png

One line per layout (ep x pp, and the scale-up domain size where it is not one domain of all
the devices: `explore --domain-sizes`): predicted tokens/s against the sequences in flight, filled
where the layout fits (weights and KV per device), hollow where it does not; the best layout
at each count is circled. With `explore --measure`, each point measured on this machine is a
cross in its layout's colour (ranks as threads) or a plus (as processes), at its measured
tokens/s, beside the predicted circle for the layout as it ran here.
"""

import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def key(d):
    """A layout's identity: ep, pp and its domain size (0: one domain)."""
    return (d["ep"], d["pp"], d.get("domain_size", 0))


def plot_measured(ax, measured, colours):
    """Measured tokens/s (x: ranks as threads, +: processes) beside the prediction as run here."""
    for m in measured:
        same = [c for k, c in colours.items() if k[:2] == (m["ep"], m["pp"])]
        colour = colours.get(key(m), same[0] if same else "black")
        marker = "P" if m["ranks_as"] == "processes" else "X"
        ax.plot(m["sequences"], m["measured_tokens_per_second"], marker, color=colour, markersize=8)
        ax.plot(m["sequences"], m["predicted_tokens_per_second"], "o", color=colour, markersize=4, alpha=0.5)


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
    best = {(b["sequences"],) + key(b) for b in r.get("best", []) if b["ep"] is not None}
    colours = {}
    for layout in r["layouts"]:
        pts = layout["points"]
        if not pts:
            continue
        label = f"ep {layout['ep']} x pp {layout['pp']}"
        if layout.get("domain_size", 0):
            label += f", domains of {layout['domain_size']}"
        xs = [p["sequences"] for p in pts]
        ys = [p["tokens_per_second"] for p in pts]
        (line,) = ax.plot(xs, ys, "-", alpha=0.6, label=label)
        colours[key(layout)] = line.get_color()
        for p in pts:
            ax.plot(p["sequences"], p["tokens_per_second"], "o", color=line.get_color(),
                    fillstyle="full" if p["fits"] else "none")
            if (p["sequences"],) + key(layout) in best:
                ax.plot(p["sequences"], p["tokens_per_second"], "o", markersize=14, fillstyle="none", color="black")
    plot_measured(ax, r.get("measured", []), colours)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("decoding sequences in flight")
    ax.set_ylabel("output tokens/s" + (" (predicted; measured where marked)" if r.get("measured") else " (predicted)"))
    measured = "; x/+: measured as threads/processes, small o: predicted as run here" if r.get("measured") else ""
    ax.set_title(f"layouts on up to {r['devices']} x {r['hardware']}, context {r['context']}\n"
                 f"(hollow: does not fit; circled: best{measured})", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
