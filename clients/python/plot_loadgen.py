#!/usr/bin/python3
"""Turns `moeserve loadgen --out FILE.json` reports into PNG charts.

    clients/python/plot_loadgen.py run.json [more.json ...] --out-dir plots/

Writes, one series per input file:
  latency_vs_throughput.png  output tokens/s against TTFT and TPOT (median and p99), one point per
                             sweep level, labelled with its rate or concurrency;
  cost_vs_batch.png          $ per million output tokens against the server's mean batch size.
"""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path) as f:
        report = json.load(f)
    levels = report.get("levels")
    if not isinstance(levels, list) or not levels:
        raise ValueError(f"{path}: no 'levels' list (is this a moeserve loadgen --out file?)")
    return report, levels


def series_name(path, report):
    w = report.get("workload", {})
    return f"{os.path.basename(path)} (prompt {w.get('prompt_len')}, out {w.get('output_len')})"


def plot_latency(runs, out):
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, levels in runs:
        x = [lv["output_throughput"] for lv in levels]
        for ax, metric in zip(axes, ["ttft_ms", "tpot_ms"]):
            med = [lv[metric]["median"] for lv in levels]
            p99 = [lv[metric]["p99"] for lv in levels]
            line, = ax.plot(x, med, "o-", label=f"{name} median")
            ax.plot(x, p99, "x--", color=line.get_color(), alpha=0.6, label=f"{name} p99")
            for xi, yi, lv in zip(x, med, levels):
                ax.annotate(lv["label"], (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
    for ax, title in zip(axes, ["time to first token", "time per output token"]):
        ax.set_xlabel("output tokens / s")
        ax.set_ylabel("ms")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Latency against throughput, per sweep level")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_cost(runs, out):
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for name, levels in runs:
        pts = [(lv["server"]["mean_batch_size"], lv["cost"]["usd_per_million_output_tokens"], lv["label"])
               for lv in levels if "server" in lv and lv["output_tokens"] > 0]
        if not pts:
            continue
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name)
        for b, c, label in pts:
            ax.annotate(label, (b, c), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("mean batch size (sequences per engine step)")
    ax.set_ylabel("$ per million output tokens")
    ax.set_title("Cost per token against batch size")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="+", help="loadgen JSON reports")
    p.add_argument("--out-dir", default=".", help="directory for the PNG files")
    args = p.parse_args()
    runs = []
    for path in args.reports:
        try:
            report, levels = load(path)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        runs.append((series_name(path, report), levels))
    os.makedirs(args.out_dir, exist_ok=True)
    outs = [os.path.join(args.out_dir, "latency_vs_throughput.png"), os.path.join(args.out_dir, "cost_vs_batch.png")]
    plot_latency(runs, outs[0])
    plot_cost(runs, outs[1])
    for o in outs:
        print(f"wrote {o}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
