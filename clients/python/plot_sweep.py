#!/usr/bin/python3
"""Turns `moeserve bench --sweep-batch ... --out FILE.json` into PNG charts.

    clients/python/plot_sweep.py sweep.json --out-dir plots/

Writes:
  step_time_vs_batch.png   observed decode step time per context (points), the roofline bound of
                           the profile's peaks (dashed) and the calibrated model (solid), knees marked;
  cost_vs_batch.png        $ per million tokens against batch size (at the profile's price);
  achieved_fractions.png   achieved FLOP/s and memory bandwidth as fractions of the calibrated peaks.
"""

import argparse
import json
import os
import sys
import warnings
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
warnings.filterwarnings("ignore", message="Data has no positive values")
import matplotlib.pyplot as plt  # noqa: E402


def by_context(points):
    groups = defaultdict(list)
    for p in points:
        groups[p["context"]].append(p)
    for ctx in groups:
        groups[ctx].sort(key=lambda p: p["batch"])
    return dict(sorted(groups.items()))


def plot_step_time(report, groups, out):
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    knees = {k["context"]: k for k in report.get("knees", [])}
    for ctx, pts in groups.items():
        b = [p["batch"] for p in pts]
        line, = ax.plot(b, [p["observed_s"] * 1e3 for p in pts], "o", label=f"observed, context {ctx}")
        c = line.get_color()
        ax.plot(b, [p["bound_s"] * 1e3 for p in pts], "--", color=c, alpha=0.6, label=f"roofline bound, context {ctx}")
        ax.plot(b, [p["calibrated_s"] * 1e3 for p in pts], "-", color=c, alpha=0.8, label=f"calibrated, context {ctx}")
        k = knees.get(ctx)
        if k and k.get("measured"):
            ax.axvline(k["measured"], color=c, linestyle=":", alpha=0.7)
            ax.annotate(f"knee {k['measured']:.1f}", (k["measured"], 0.02), xycoords=("data", "axes fraction"),
                        rotation=90, fontsize=7, color=c)
    ax.set_xlabel("decode batch size")
    ax.set_ylabel("step time (ms)")
    eff = report.get("efficiency", {})
    ax.set_title(f"Decode step time on {report.get('backend', '?')}\n"
                 f"calibrated: GEMM {eff.get('compute', 0):.2f}, attention {eff.get('attention', 0):.2f}, "
                 f"memory {eff.get('memory', 0):.2f}, overlap {eff.get('overlap', 0):.2f}; "
                 f"median error {100 * report.get('calibrated_median_abs_error', 0):.1f}%", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_cost(report, groups, out):
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for ctx, pts in groups.items():
        ax.plot([p["batch"] for p in pts], [p["usd_per_million_tokens"] for p in pts], "o-", label=f"context {ctx}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("decode batch size")
    ax.set_ylabel("$ per million tokens")
    price = report.get("hardware", {}).get("price_per_hour", 0)
    ax.set_title(f"Cost per token against batch size (${price:.2f}/hour)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_fractions(groups, out):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ctx, pts in groups.items():
        b = [p["batch"] for p in pts]
        axes[0].plot(b, [p["achieved_flops_fraction"] for p in pts], "o-", label=f"context {ctx}")
        axes[1].plot(b, [p["achieved_bandwidth_fraction"] for p in pts], "o-", label=f"context {ctx}")
    for ax, title in zip(axes, ["achieved FLOP/s / peak", "achieved bandwidth / peak"]):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("decode batch size")
        ax.set_title(title)
        ax.axhline(1.0, color="gray", linestyle="--", alpha=0.5)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", help="bench --sweep-batch --out JSON")
    p.add_argument("--out-dir", default=".", help="directory for the PNG files")
    args = p.parse_args()
    try:
        with open(args.report) as f:
            report = json.load(f)
        points = report["points"]
        if not points:
            raise ValueError("no points")
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {args.report}: not a sweep report ({e})", file=sys.stderr)
        return 2
    groups = by_context(points)
    os.makedirs(args.out_dir, exist_ok=True)
    outs = [os.path.join(args.out_dir, n) for n in ("step_time_vs_batch.png", "cost_vs_batch.png",
                                                     "achieved_fractions.png")]
    plot_step_time(report, groups, outs[0])
    plot_cost(report, groups, outs[1])
    plot_fractions(groups, outs[2])
    for o in outs:
        print(f"wrote {o}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
