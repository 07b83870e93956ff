"""``report`` step: a final shared/report.md from the training and evaluation files.

When evaluation did not produce its metrics, the report says which steps failed and why
(their status and the end of their stderr.log) and the step exits 1, so the pipeline is
recorded as failed while its report still explains the failure.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from .settings import read_json, run_dir, shared_dir

STDERR_TAIL_LINES = 8


def _load(path: Path) -> Optional[Dict[str, Any]]:
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def _step_statuses(folder: Path) -> List[Dict[str, Any]]:
    """The status.json of every step of this run that has one, in the order they started."""
    statuses = []
    for status_file in folder.glob("*/status.json"):
        status = _load(status_file)
        if status:
            statuses.append(status)
    return sorted(statuses, key=lambda s: (s.get("started") is None, s.get("started") or 0))


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-STDERR_TAIL_LINES:])


def main() -> Dict[str, Any]:
    shared, folder = shared_dir(), run_dir()
    name = os.environ.get("PIPELINE_RUN_ID", folder.name)
    training = _load(shared / "training_metrics.json")
    metrics = _load(shared / "metrics.json")
    statuses = _step_statuses(folder)
    lines = [f"# Pipeline {name}", "", "## Steps", "", "| step | status | attempts | seconds | why |",
             "|---|---|---|---|---|"]
    for s in statuses:
        lines.append(f"| {s['step']} | {s['status']} | {s.get('attempts', '')} | {s.get('seconds') or 0:.1f} | "
                     f"{s.get('reason') or ''} |")
    lines.append("")
    if training:
        lines += ["## Training", "", f"- trained by step `{training['step']}` on {training['device']}: "
                  f"{len(training['epochs'])} epochs, batch size {training['settings']['batch_size']}, "
                  f"learning rate {training['settings']['learning_rate']:g}",
                  f"- model: {json.dumps(training['model'])}",
                  f"- final validation accuracy: {training['val_accuracy']:.4f}", "",
                  "| epoch | loss | validation accuracy |", "|---|---|---|"]
        lines += [f"| {e['epoch']} | {e['loss']:.4f} | {e['val_accuracy']:.4f} |" for e in training["epochs"]]
        lines.append("")
        fallback = [s for s in statuses if s["status"] in ("failed", "timeout") and s["step"] != training["step"]
                    and s["step"].startswith("train")]
        for s in fallback:
            lines += [f"The first training attempt (`{s['step']}`) failed ({s.get('reason')}); "
                      f"`{training['step']}` trained the model instead.", ""]
    else:
        lines += ["## Training", "", "No training metrics: training did not finish.", ""]
    if metrics:
        lines += ["## Evaluation", "", f"- test accuracy: {metrics['accuracy']:.4f} on {metrics['n_test']} images",
                  f"- macro F1: {metrics['macro_f1']:.4f}", "- per class and confusion matrix: `eval_report.md`", ""]
    else:
        lines += ["## What went wrong", "", "Evaluation produced no metrics. Steps that failed:", ""]
        for s in statuses:
            if s["status"] in ("failed", "timeout"):
                lines += [f"- `{s['step']}`: {s['status']} ({s.get('reason') or 'no reason recorded'})"]
                tail = _tail(folder / s["step"] / "stderr.log")
                if tail:
                    lines += ["", "```", tail, "```", ""]
        lines.append("")
    (shared / "report.md").write_text("\n".join(lines))
    print(f"wrote {shared / 'report.md'}")
    if not metrics:
        print("evaluation failed: see report.md", file=sys.stderr)
        raise SystemExit(1)
    return {"accuracy": metrics["accuracy"]}
