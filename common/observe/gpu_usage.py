"""gpu_usage.png/.svg/.pdf and gpu_usage.csv: every GPU of every node over the whole run, from the
series each rank's ``GpuMonitor`` kept and rank 0 gathered."""
from __future__ import annotations

import csv
import io
import logging
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from common.errors import counted
from common.observe.gpu_monitor import Sample
from common.results.layout import GPU_USAGE_STEM, ResultsLayout, png_name, worker_name
from common.results.outputs import atomic_write_text, new_figure, save_figure

log = logging.getLogger("multinode_gpu")

_PANELS = (("util_percent", "utilisation %"), ("memory_mib", "memory used, MiB"),
           ("temperature_c", "temperature, °C"), ("power_w", "power, W"))


def gathered_series(reports: List[Mapping[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """"rank0-gpu1" -> {"host", "physical", "samples": [Sample, ...]} from every rank's report."""
    series = {}
    for report in reports:
        for name, entry in (report.get("gpu_series") or {}).items():
            samples = [Sample(*values) for values in entry["samples"]]
            if samples:
                series[worker_name(report["rank"], name)] = {"host": report["host"], "physical": entry.get("physical"),
                                                          "samples": samples}
    return series


def write_gpu_usage(reports: List[Mapping[str, Any]], results: Path) -> Optional[str]:
    """Write the CSV and the figure where any GPU was sampled; the figure's PNG name, else None."""
    series = gathered_series(reports)
    if not series:
        return None
    try:
        atomic_write_text(ResultsLayout(Path(results)).gpu_usage_csv, _csv(series))
        _plot(series, ResultsLayout(Path(results)).gpu_usage)
    except Exception as error:  # noqa: BLE001 - the figure must never cost the run its summary
        log.warning("%s not written: %s: %s", png_name(GPU_USAGE_STEM), type(error).__name__, error)
        return None
    return png_name(GPU_USAGE_STEM)


def _csv(series: Mapping[str, Mapping[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["time", "gpu", "host", "physical", *Sample._fields[1:]])
    rows = [(sample.time, name, entry["host"], entry["physical"], *sample[1:])
            for name, entry in series.items() for sample in entry["samples"]]
    for row in sorted(rows, key=lambda row: (row[0], row[1])):
        writer.writerow(["" if value is None else round(value, 3) if isinstance(value, float) else value
                         for value in row])
    return buffer.getvalue()


def _plot(series: Mapping[str, Mapping[str, Any]], path_without_suffix: Path) -> None:
    from matplotlib.lines import Line2D

    panels = [(field, label) for field, label in _PANELS
              if any(getattr(s, field) is not None for entry in series.values() for s in entry["samples"])]
    if not panels:  # sampled, but NVML gave no measure at all: the CSV says so
        panels = [_PANELS[0]]
    origin = min(entry["samples"][0].time for entry in series.values())
    names = sorted(series)
    colours = {name: f"C{index % 10}" for index, name in enumerate(names)}
    styles = {name: ("-", "--", ":", "-.")[index // 10 % 4] for index, name in enumerate(names)}
    fig, axes = new_figure(10, 0.6 + 2.0 * len(panels), len(panels), 1, squeeze=False, sharex=True)
    for ax, (field, label) in zip(axes[:, 0], panels):
        for name in names:
            points = [(s.time - origin, getattr(s, field)) for s in series[name]["samples"]
                      if getattr(s, field) is not None]
            if points:
                ax.plot(*zip(*points), linewidth=1.0, color=colours[name], linestyle=styles[name])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if field == "util_percent":
            ax.set_ylim(0, 105)
    axes[-1, 0].set_xlabel("seconds since the first sample")
    axes[0, 0].set_title(f"GPU use: {counted(len(series), 'GPU')} on {counted(len({e['host'] for e in series.values()}), 'node')}")
    # one entry per GPU, even one that NVML gives only some measures of (a MIG slice)
    handles = [Line2D([], [], color=colours[name], linestyle=styles[name], label=f"{name} ({series[name]['host']})")
               for name in names]
    axes[0, 0].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", frameon=False)
    save_figure(fig, path_without_suffix)
