#!/usr/bin/python3
"""Turns `moeserve price-sheet --json FILE.json` into PNG charts.

    clients/python/plot_price_sheet.py sheet.json --out-dir plots/

Writes:
  price_vs_context.png  $ per million output tokens against context (log-log), predicted and,
                        when the sheet was measured, measured; the context where KV reads equal
                        weight reads and where KV fills the memory marked;
  fast_mode.png         price multiple against speed multiple as the batch shrinks from the
                        operating batch to 1, the latency floor marked (no price buys more);
  unit_prices.png       input, output and cached-input prices per tier, predicted beside measured.
"""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SHEETS = (("predicted", "tab:blue", "--"), ("measured", "tab:red", "-"))


def plot_context(j, out):
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    for name, color, style in SHEETS:
        if name not in j:
            continue
        curve = j[name]["context"]["curve"]
        ax.plot([p["context"] for p in curve], [p["usd_per_million_output"] for p in curve], style, color=color,
                marker="o", label=name)
        limited = [p for p in curve if p["memory_limited"]]
        if limited:
            ax.plot([p["context"] for p in limited], [p["usd_per_million_output"] for p in limited], "s",
                    color=color, fillstyle="none", markersize=10, label=f"{name}: batch cut by memory")
    ctx = j["predicted"]["context"]
    ax.axvline(ctx["kv_equals_weights_context"], color="gray", linestyle=":", label="KV reads = weight reads")
    ax.axvline(ctx["batch_shrinks_context"], color="black", linestyle=":", label="KV fills memory")
    ax.set_xlabel("context (tokens per sequence)")
    ax.set_ylabel("$ per million output tokens")
    ax.set_title("Price against context: the cliff")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_fast(j, out):
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ax.set_yscale("log")
    for name, color, style in SHEETS:
        if name not in j:
            continue
        fast = j[name]["fast_mode"]
        curve = fast["curve"]
        ax.plot([f["speed_multiple"] for f in curve], [f["price_multiple"] for f in curve], style, color=color,
                marker="o", label=name)
        for f in curve:
            ax.annotate(str(f["batch"]), (f["speed_multiple"], f["price_multiple"]), fontsize=7, color=color,
                        xytext=(3, 3), textcoords="offset points")
        ax.axvline(fast["max_speed_multiple"], color=color, linestyle=":", label=f"{name}: floor (batch 1)")
    ax.set_xlabel("speed per sequence, x the operating batch's")
    ax.set_ylabel("price per output token, x the operating batch's")
    ax.set_title("Fast mode: a smaller batch (labels: batch size)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def plot_units(j, out):
    labels = ["input", "output"] + [f"cached ({t['tier']})" for t in j["predicted"]["cached_input"]]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    ax.set_yscale("log")
    names = [n for n, _, _ in SHEETS if n in j]
    width = 0.8 / len(names)
    for i, (name, color, _) in enumerate(s for s in SHEETS if s[0] in j):
        s = j[name]
        values = [s["input"]["usd_per_million"], s["output"]["usd_per_million"]] + [
            t["usd_per_million"] for t in s["cached_input"]]
        ax.bar([x + i * width for x in range(len(labels))], values, width, color=color, label=name)
    ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(labels))])
    ax.set_xticklabels(labels, rotation=15)
    ax.set_ylabel("$ per million tokens")
    ax.set_title("Unit prices")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sheet", help="JSON written by `moeserve price-sheet --json`")
    ap.add_argument("--out-dir", default=".", help="directory for the PNG files")
    args = ap.parse_args()
    with open(args.sheet) as f:
        j = json.load(f)
    if "predicted" not in j:
        sys.exit(f"{args.sheet}: not a price-sheet JSON (no 'predicted')")
    os.makedirs(args.out_dir, exist_ok=True)
    for name, fn in (("price_vs_context.png", plot_context), ("fast_mode.png", plot_fast),
                     ("unit_prices.png", plot_units)):
        path = os.path.join(args.out_dir, name)
        fn(j, path)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
