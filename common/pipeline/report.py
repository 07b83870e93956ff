"""The pipelines x steps table of summary.md, collecting each run's step statuses, and the
plan that ``--dry-run`` prints."""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from ..app import finite_number
from ..errors import counted, error_line, markdown_cell, short
from .definition import Pipeline, Step
from .flow import RunLayout, read_status, total_cost

STATUS_MARK = {"ok": "ok", "failed": "FAILED", "timeout": "TIMEOUT", "skipped": "skipped", "missing": "-",
               "stopped": "stopped"}


def statuses_on_disk(layout: RunLayout, pipeline: Pipeline) -> Dict[str, Dict[str, Any]]:
    """The status.json of every step that has one (a failed pipeline's result is not journaled)."""
    found = {}
    for step in pipeline.steps:
        status = read_status(layout, step.id)
        if status is not None:
            found[step.id] = status
    return found


#: how long a skipped step's reason may be in the table (summary.json and its status.json hold it whole)
SKIP_REASON_CHARS = 60


def _cell(status: Mapping[str, Any], started: bool = True) -> str:
    """A step's cell; ``started``: its pipeline began, so a step without a record was not reached
    (a stop came first), where a pipeline not started shows "-" for each."""
    mark = STATUS_MARK.get(status.get("status", "missing"), str(status.get("status")))
    if status.get("status") in (None, "missing"):
        return "not reached" if started else mark
    if status.get("status") == "skipped":  # why, as its status.json says (a bare "skipped" needed that file)
        reason = status.get("reason")
        if not isinstance(reason, str) or not reason:
            return mark
        reason = " ".join(reason.split())
        cut = reason if len(reason) <= SKIP_REASON_CHARS else reason[:SKIP_REASON_CHARS - 3].rstrip() + "..."
        return f"skipped: {markdown_cell(cut)}"
    parts = [mark]
    if status.get("attempts", 1) > 1:
        parts.append(f"x{status['attempts']}")
    # a step ended with its worker (--item-timeout, a killed worker) wrote no status: its time is not known
    parts.append("(ended with its worker)" if status.get("ended_with_worker") else f"{status.get('seconds') or 0:.1f} s")
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
    lines = [_row(["pipeline", "status", *map(markdown_cell, columns)]), "|---" * (len(columns) + 2) + "|"]
    for run_id, run in pipelines.items():
        steps = run.get("steps", {})
        started = run.get("status") != "not started"
        lines.append(_row([markdown_cell(run_id), str(run.get("status", "?")),
                           *[_cell(steps[c], started) if c in steps else "" for c in columns]]))
    return "\n".join(lines)


def _row(cells: List[str]) -> str:
    """A Markdown table row of these cells."""
    return "| " + " | ".join(cells) + " |"


def handled_failures(pipelines: Mapping[str, Mapping[str, Any]]) -> List[str]:
    """``RUN/STEP`` of each step that failed (or timed out) in a pipeline that still ended ok: its
    ``on_fail`` went on, so a plain ``--resume`` would not run it again, only ``--resume RUN/STEP``
    (the format document: "if training completes but evaluation fails, resume from the
    evaluation step"). A pipeline that ended in an earlier run keeps its names; one resumed now from a
    later step names only the steps that ran now (the earlier failure was before the step resumed from)."""
    named = []
    for run_id, run in pipelines.items():
        steps = run.get("steps", {})
        resumed_now = any(not status.get("previous_run") for status in steps.values())
        if run.get("status") == "ok":
            before = list(steps)
        elif run.get("status") == "failed" and run.get("resume_at") in steps:
            # failed later, unhandled: a plain --resume goes on at that step, past the ones handled before it
            # (the example's evaluate failed, went on to report, which failed for it: evaluate is what to run)
            before = _steps_before(steps, run["resume_at"])
        else:
            continue
        named += [f"{run_id}/{step}" for step in before if steps[step].get("status") in ("failed", "timeout")
                  and not (resumed_now and steps[step].get("previous_run"))]
    return named


def _steps_before(steps: Mapping[str, Any], at: str) -> List[str]:
    """The steps, in the pipeline's order, before ``at``: those a plain --resume from it keeps."""
    order = list(steps)
    return order[:order.index(at)]


def over_budget(pipelines: Mapping[str, Mapping[str, Any]], definition: str) -> List[str]:
    """A line for each failed pipeline where a plain --resume would fail again before its first
    step: the steps before the one it goes on from (``resume_at``), whose costs it counts, spent
    more than the budget. Where that step's own cost passed it, the resume runs it anew."""
    notes = []
    for run_id, run in pipelines.items():
        steps, at, budget = run.get("steps") or {}, run.get("resume_at"), run.get("budget")
        if run.get("status") != "failed" or at not in steps or not finite_number(budget):
            continue
        kept = total_cost(cost for cost in (steps[step].get("cost") for step in _steps_before(steps, at))
                          if finite_number(cost))
        if kept > budget:
            notes.append(f"pipeline {run_id}: the steps before {at}, where a --resume goes on, spent {kept:g} of its "
                         f"budget of {budget:g}; a --resume counts that and would fail again at once: raise \"budget\" "
                         f"in {definition} first")
    return notes


def answer(pipelines: Mapping[str, Mapping[str, Any]]) -> Optional[str]:
    """summary.md's first line: how many pipelines ended how, and the steps failed along the way."""
    if not pipelines:
        return None
    counts = Counter(str(run.get("status", "?")) for run in pipelines.values())
    line = f"{len(pipelines)} pipeline{'s' if len(pipelines) > 1 else ''}: " + ", ".join(
        f"{count} {status}" for status, count in sorted(counts.items(), key=lambda pair: (pair[0] != "ok", pair[0])))
    handled = handled_failures(pipelines)
    if handled:
        line += f"; failed along the way (their pipeline went on): {', '.join(handled)}"
    return line


def headline(pipelines: Mapping[str, Mapping[str, Any]]) -> List[str]:
    """The closing lines of a complete run whose pipelines ended ok though a step failed: the run
    says "complete", and these say which step to run again after a fix, and how."""
    handled = handled_failures(pipelines)
    if not handled:
        return []
    return [f"pipeline: {len(handled)} step{'s' if len(handled) > 1 else ''} failed and {'their' if len(handled) > 1 else 'its'} "
            f"pipeline went on (on_fail): {', '.join(handled)}",
            "pipeline: to run one again after a fix, with the steps after it: the same command with "
            + _resume_words(handled)]


def _resume_words(handled: List[str]) -> str:
    """``--resume RUN/STEP`` for the one step, or for one of several."""
    return f"--resume {handled[0]}" if len(handled) == 1 else f"--resume RUN/STEP (one of those: --resume {handled[0]}, ...)"


def summary_markdown(pipelines: Mapping[str, Mapping[str, Any]]) -> str:
    if not pipelines:
        return ""
    lines = ["## Pipelines", "", "Each cell: status, attempts (xN when more than one), run time, GPU. "
             "Logs and status.json of step S of run R are in `R/S/`; shared files in `R/shared/`.", "",
             pipelines_table(pipelines), ""]
    problems = [(run_id, run["reason"]) for run_id, run in pipelines.items() if run.get("reason")]
    if problems:
        lines += ["| pipeline | why it failed |", "|---|---|"]
        lines += [f"| {markdown_cell(run_id)} | {markdown_cell(error_line(reason))} |"  # a row: one line
                  for run_id, reason in problems] + [""]
    handled = handled_failures(pipelines)
    if handled:
        lines += ["Failed along the way, their pipeline going on through `on_fail`: "
                  + ", ".join(f"`{step}`" for step in handled) + ". A plain `--resume` does not run them again (it "
                  f"runs no pipeline that ended ok, and one that failed later from where it failed); after a fix, add "
                  f"`{_resume_words(handled)}` (that step and those after it) to the command above.", ""]
    outputs = [(run_id, step, status) for run_id, run in pipelines.items()
               for step, status in run.get("steps", {}).items() if status.get("output")]
    if outputs:
        lines += ["### Step outputs", "", "Each step's result, its `output.md` (a prompt step's: the agent's answer; "
                  "a failed step's: what it wrote before it failed).", "",
                  "| pipeline | step | status | output | cost |", "|---|---|---|---|---|"]
        lines += [f"| {markdown_cell(run_id)} | {markdown_cell(step)} | {markdown_cell(str(status.get('status', '?')))} "
                  f"| [{markdown_cell(status['output'])}]({status['output']}){' (empty)' if status.get('output_bytes') == 0 else ''} "
                  f"| {status.get('cost') or 0:g} |"
                  for run_id, step, status in outputs] + [""]
    costs = {run_id: _cost(run) for run_id, run in pipelines.items() if run.get("cost")}
    if costs:
        lines += ["Reported costs: " + ", ".join(f"{run_id} {cost}" for run_id, cost in costs.items()), ""]
    return "\n".join(lines)


def _cost(run: Mapping[str, Any]) -> str:
    """A pipeline's reported cost, marked where it passed the budget: its last step can pass it with
    no step left for the budget to stop, and the pipeline then ends as its steps did."""
    cost, budget = run["cost"], run.get("budget")
    over = isinstance(budget, (int, float)) and cost > budget
    return f"{cost:g}" + (f" (**over its budget of {budget:g}**)" if over else "")


def _what(step: Step) -> str:
    if step.command is not None:
        return f"command {short(step.command, 50)}"
    if step.python is not None:
        return f"python {step.python}"
    extra = "".join([f", model {step.model}" if step.model else "",
                     f", tools {','.join(step.tools)}" if step.tools else ""])
    return f"prompt {short(step.prompt, 40)}{extra}"


def plan_text(pipelines: List[Pipeline], capacities: Mapping[str, Any], queue_timeout: Optional[float],
              agent: Optional[str], starts: Mapping[str, str], results: Path, workers: int) -> str:
    """The plan of ``--dry-run``: pipelines, their steps, pools (capacity, or its words), conditions
    and jumps, in words. ``workers``: this rank's, each running one step at a time."""
    pools = ", ".join(f"{name}={cap}" for name, cap in sorted(capacities.items()))
    lines = [f"Dry run: {counted(len(pipelines), 'pipeline')}; nothing is run or written.",
             f"results: {results}",
             f"workers: {workers} on this rank, each running one step at a time, so at most {workers} at once here "
             f"(pools permitting; more with --workers N on the CPU, or one per GPU with --gpu all on a GPU node)",
             f"pools: {pools}; queue timeout: "
             f"{'none' if queue_timeout is None else f'{queue_timeout:g} s'}",
             f"agent: {agent if agent else '(none; no prompt steps)'}", ""]
    for pipeline in pipelines:
        extra = [f"deadline {pipeline.deadline_seconds:g} s" if pipeline.deadline_seconds else "",
                 f"budget {pipeline.budget:g}" if pipeline.budget else "",
                 "matrix " + ", ".join(f"{k}={v}" for k, v in pipeline.matrix.items()) if pipeline.matrix else "",
                 starts.get(pipeline.name, "")]
        lines.append(f"pipeline {pipeline.name}" + "".join(f"; {e}" for e in extra if e))
        for number, step in enumerate(pipeline.steps, 1):
            parts = [_what(step)]
            pools_held = ", ".join(f"{pool}" + (f" x{count}" if count > 1 else "") for pool, count in sorted(step.pools.items()))
            if pools_held:
                parts.append(f"holds {pools_held}")
            if step.condition:
                parts.append(f"if {step.condition}")
            if step.timeout:
                parts.append(f"timeout {step.timeout:g} s")
            if step.memory_text:
                parts.append(f"memory {step.memory_text}")
            if step.max_retries is not None:
                delay = f", delay {step.retry_delay:g} s doubling" if step.retry_delay else ""
                parts.append(f"max_retries {step.max_retries}{delay}")
            if step.next:
                parts.append(f"then {step.next}")
            if step.on_fail:
                parts.append(f"on failure {step.on_fail}")
            if step.container:
                parts.append(f"in {step.container}" + (" with --nv" if step.gpu else "") +
                             ", shared/ bound at /shared")
            if step.mounts:
                parts.append("mounts " + ", ".join(f"{m.host_path} at {m.container_path}" + (" (read-only)" if m.readonly
                                                                                             else "") for m in step.mounts))
            lines.append(f"  {number}. {step.id}: " + "; ".join(parts))
        lines.append("")
    missing = sorted({m.host_path for p in pipelines for s in p.steps for m in s.mounts if not os.path.exists(m.host_path)})
    if missing:  # apptainer refuses to start a step whose bind source is missing (exit 255)
        lines += [f"Not on this node ({os.uname().nodename}): {', '.join(missing)}; a step that mounts "
                  "one fails where it is missing.", ""]
    return "\n".join(lines)
