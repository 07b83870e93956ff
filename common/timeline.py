"""timeline.png/svg: one row per worker of every rank, one bar per item, failures marked (items that
timed out and workers killed for their silence in their own colours)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Mapping

from .outputs import new_figure, save_figure

#: bar colour by outcome: ``ok``, else the bar's ``why`` (common.messages.Failed.kind)
COLOURS = {"ok": "tab:blue", "failed": "tab:red", "timeout": "tab:orange", "silent": "tab:purple"}
LABELS = {"failed": "failed (red)", "timeout": "timed out (orange)", "silent": "worker silent, killed (purple)"}


def plot_timeline(bars: List[Mapping], path_without_suffix: Path) -> list:
    """``bars``: dicts with worker, start, end (epoch seconds), ok (bool) and, for a failure, maybe why
    ("failed", "timeout" or "silent")."""
    def row_order(name: str) -> tuple:
        """rank0-cpu2 < rank0-cpu10 < rank1-gpu0.0 < rank1-gpu0.1 < rank1-gpu1.0 (--workers-per-gpu)."""
        rank, _, device = name.partition("-")
        kind = device.rstrip("0123456789.")
        numbers = [int(part) for part in device[len(kind):].split(".") if part.isdigit()]
        return (int(rank[4:]) if rank[4:].isdigit() else 0, kind, numbers)

    workers = sorted({bar["worker"] for bar in bars}, key=row_order)
    rows = {name: index for index, name in enumerate(workers)}
    origin = min((bar["start"] for bar in bars), default=0.0)
    fig, ax = new_figure(10, 1.2 + 0.35 * max(1, len(workers)))
    spans = {}  # (worker, outcome) -> [(start, width)], built in one pass
    for bar in bars:
        spans.setdefault((bar["worker"], _outcome(bar)), []).append(
            (bar["start"] - origin, max(bar["end"] - bar["start"], 1e-3)))
    many = len(bars) > 1000  # thousands of rectangles: draw them as pixels, even in the SVG
    for (worker, outcome), row in spans.items():
        ax.broken_barh(row, (rows[worker] - 0.35, 0.7), facecolors=COLOURS[outcome],
                       edgecolor="white", linewidth=0 if many else 0.3, rasterized=many)
    ax.set_yticks(range(len(workers)), workers)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first item started")
    counts = {kind: sum(1 for bar in bars if _outcome(bar) == kind) for kind in LABELS}
    ax.set_title(f"{len(bars)} item runs on {len(workers)} workers"
                 + "".join(f", {count} {LABELS[kind]}" for kind, count in counts.items() if count))
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, path_without_suffix)


def _outcome(bar: Mapping) -> str:
    return "ok" if bar["ok"] else bar.get("why") if bar.get("why") in LABELS else "failed"
