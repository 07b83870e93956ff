"""The pipelines x steps table of summary.md, and collecting each run's step statuses."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping

from .definition import Pipeline
from .flow import RunLayout, read_status

STATUS_MARK = {"ok": "ok", "failed": "FAILED", "timeout": "TIMEOUT", "skipped": "skipped", "missing": "-"}


def statuses_on_disk(layout: RunLayout, pipeline: Pipeline) -> Dict[str, Dict[str, Any]]:
    """The status.json of every step that has one (a failed pipeline's result is not journaled)."""
    found = {}
    for step in pipeline.steps:
        status = read_status(layout, step.id)
        if status is not None:
            found[step.id] = status
    return found


def _cell(status: Mapping[str, Any]) -> str:
    mark = STATUS_MARK.get(status.get("status", "missing"), str(status.get("status")))
    if status.get("status") in (None, "missing", "skipped"):
        return mark
    parts = [mark]
    if status.get("attempts", 1) > 1:
        parts.append(f"x{status['attempts']}")
    parts.append(f"{status.get('seconds') or 0:.1f} s")
    if status.get("gpu") not in (None, ""):
        parts.append(f"GPU {status['gpu']}")
    if status.get("previous_run"):
        parts.append("(earlier run)")
    return " ".join(parts)


def pipelines_table(pipelines: Mapping[str, Mapping[str, Any]]) -> str:
    """Markdown: one row per pipeline, one column per step id (in the order first seen)."""
    columns: List[str] = []
    for run in pipelines.values():
        columns += [step for step in run.get("steps", {}) if step not in columns]
    lines = ["| pipeline | status | " + " | ".join(columns) + " |", "|---" * (len(columns) + 2) + "|"]
    for run_id, run in pipelines.items():
        steps = run.get("steps", {})
        cells = [_cell(steps[c]) if c in steps else "" for c in columns]
        lines.append(f"| {run_id} | {run.get('status', '?')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_markdown(pipelines: Mapping[str, Mapping[str, Any]]) -> str:
    if not pipelines:
        return ""
    lines = ["## Pipelines", "", "Each cell: status, attempts (xN when more than one), run time, GPU. "
             "Logs and status.json of step S of run R are in `R/S/`; shared files in `R/shared/`.", "",
             pipelines_table(pipelines), ""]
    problems = [(run_id, run["reason"]) for run_id, run in pipelines.items() if run.get("reason")]
    if problems:
        lines += ["| pipeline | why it failed |", "|---|---|"]
        lines += [f"| {run_id} | {reason} |" for run_id, reason in problems] + [""]
    return "\n".join(lines)
