"""Walking one pipeline: which step runs next, retries, fallbacks, pools, deadline, status files.

The rules (also in docs/pipelines.md):
- Steps run in file order. After a step succeeds the walk goes to its ``next``, else the step
  after it. After it fails (``max_retries`` retries in place used up) the walk goes to its
  ``on_fail``; with no ``on_fail`` the pipeline has failed and the walk goes on in file order.
- ``condition: prev.ok`` / ``prev.error`` looks at the last step that ran (skipped steps do not
  count). A step without a condition runs when it was reached through ``next``/``on_fail``, or
  when the pipeline has not failed and the last step that ran succeeded. Others are skipped.
- The first step of a resume (``--resume RUN/STEP``) always runs, whatever its condition.
- A step with ``max_retries: N`` runs at most 1 + N times in one run of the pipeline, and the walk
  arrives at it (running it or skipping it) at most 1 + N times; coming back to it once more through
  a loop ends the pipeline as failed (see loops.py).
- A run from the first step moves an earlier run's ``shared/`` aside (``shared.previous-N``), so no
  step reads a stale file (a metrics file that this run's training never wrote).
- ``deadline_seconds``: when passed, the running step is ended (status timeout) and the rest skipped.
- ``retry_delay``: the wait before a step's first retry, doubled before each later one. No retry
  (and no step) starts once the run is stopping, or once the steps' reported costs passed ``budget``.
- Each step runs in its own folder RUN_ID/STEP_ID (logs appended, never overwritten); a prompt
  step's answer (the agent's standard output) is its ``output.md`` there.
- ``progress.json`` in the run's folder says where the run stopped: a plain ``--resume`` starts
  there again (the step that was running, or the first failure left without ``on_fail``).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Dict, Iterable, List, Optional, Sequence, Tuple

from common.app import finite_number
from common.results.layout import (
    PROGRESS_FILE,
    SHARED_DIR,
    STEP_FILES,
    STEP_OUTPUT,
    STEP_PROMPT,
    STEP_STATUS_NAME,
    STEP_STDERR,
    STEP_STDOUT,
)
from common.results.outputs import atomic_write_json, atomic_write_text, atomic_write_with
from common.results.regular_file import NotRegularFile, in_place, read_regular
from common.workers.worker import PoolTimeout

from .. import settings
from ..signals import STEP_HELD_SIGNALS, held_signals
from . import nodelock
from .container import find_apptainer, missing_apptainer
from .definition import Pipeline, Step
from .steps import Attempt, python_paths, run_attempt, step_argv, step_environment
from .variables import step_variables

#: A line of a step's standard output reporting what it cost: {"pipeline_cost": 0.0123}
COST_KEY = "pipeline_cost"
#: attempts kept in a step's status.json (its logs keep them all)
MAX_HISTORY = 200

#: acquire(pool, count, timeout) -> context manager; raises on waiting longer than timeout.
Acquire = Callable[[str, int, Optional[float]], ContextManager[Any]]


class QueueTimeout(Exception):
    """Waited longer than the queue timeout (or the deadline) for a pool."""


class PoolRefused(Exception):
    """The engine would not grant a pool (unknown, or more than its capacity)."""


def no_pools(pool: str, count: int = 1, timeout: Optional[float] = None) -> ContextManager[None]:
    """For running a pipeline outside the engine: every pool is always free."""
    return contextlib.nullcontext()


@dataclass
class RunLayout:
    """Where a run's files live: RESULTS/RUN_ID/shared and RESULTS/RUN_ID/STEP_ID."""

    results: Path
    run_id: str

    @property
    def run_dir(self) -> Path:
        return self.results / self.run_id

    @property
    def shared(self) -> Path:
        return self.run_dir / SHARED_DIR

    def set_shared_aside(self) -> Optional[Path]:
        """Rename an existing, non-empty ``shared/`` to ``shared.previous-N``; the new name, if any."""
        if not self.shared.is_dir() or not any(self.shared.iterdir()):
            return None
        number = 1
        while os.path.lexists(self.run_dir / f"{SHARED_DIR}.previous-{number}"):  # a dangling link too
            number += 1
        target = self.run_dir / f"{SHARED_DIR}.previous-{number}"
        self.shared.rename(target)
        return target

    def step_dir(self, step_id: str) -> Path:
        return self.run_dir / step_id

    def status_path(self, step_id: str) -> Path:
        return self.step_dir(step_id) / STEP_STATUS_NAME

    @property
    def progress_path(self) -> Path:
        return self.run_dir / PROGRESS_FILE

    def in_the_way(self, step_ids: Sequence[str]) -> Optional[str]:
        """What stands where the run keeps a folder (the run's, shared/, a step's) or a file (its
        progress, a step's status, logs, prompt and output), said in a few words; None where
        nothing does. Found before the run: a file where a step's folder goes, or a FIFO where its
        log goes, would otherwise fail the step as an error of the runner, or block for ever.
        Links and devices as :func:`~common.results.regular_file.in_place` judges them; a log
        may be sent to a device (``/dev/null``)."""
        places = [(self.run_dir, True), (self.shared, True), (self.progress_path, False)]
        for step_id in step_ids:
            places.append((self.step_dir(step_id), True))
            places += [(self.step_dir(step_id) / name, False) for name in STEP_FILES]
        for path, folder in places:
            problem = in_place(path, folder, devices=path.name in (STEP_STDOUT, STEP_STDERR))
            if problem or (path == self.run_dir and not os.path.isdir(path)):  # nothing of the run yet
                return problem
        return None


def _read_json(path: Path, what: str) -> Any:
    """The JSON in one of a run's own files, or None where it is missing, damaged or not a regular
    file (read without waiting: a FIFO in its place would block for ever)."""
    try:
        return json.loads(read_regular(path, what))
    except (OSError, ValueError, RecursionError, NotRegularFile):
        return None


def read_progress(layout: RunLayout) -> Optional[Dict[str, Any]]:
    """The run's progress.json (where it stopped), or None."""
    progress = _read_json(layout.progress_path, "a pipeline's progress")
    return progress if isinstance(progress, dict) else None


#: the longest line that can report a cost; longer lines are read in pieces of this size
COST_LINE_LIMIT = 4096


def read_cost_and_output(stdout_log: Path, offset: int, output: Optional[Path]) -> float:
    """The costs an attempt reported (COST_KEY lines of its stdout from ``offset``); with
    ``output``, the rest of that stdout is copied there (a prompt step's output.md). Read in
    pieces and copied as it is read: a step's gigabytes of output, or one line of them without a
    newline, need no more memory than a piece."""
    cost = 0.0

    def copy(sink: Optional[Any]) -> None:
        nonlocal cost
        try:
            handle = open(stdout_log, "rb")
        except OSError:
            return
        with handle:
            handle.seek(offset)
            starts_line = True
            while True:
                try:
                    piece = handle.readline(COST_LINE_LIMIT)
                except OSError:
                    return
                if not piece:
                    return
                whole_line, starts_line = starts_line and len(piece) < COST_LINE_LIMIT, piece.endswith(b"\n")
                value = _reported_cost(piece) if whole_line else None
                if value is not None:
                    cost = total_cost([cost, value])
                elif sink is not None:
                    sink.write(piece)

    if output is not None:
        atomic_write_with(output, copy)
    else:
        copy(None)
    return cost


def _reported_cost(line: bytes) -> Optional[float]:
    """The cost a line of a step's stdout reports (``{"COST_KEY": 0.12}``), or None."""
    if COST_KEY.encode() not in line or not line.lstrip().startswith(b"{"):
        return None
    try:
        value = json.loads(line).get(COST_KEY)
    except (ValueError, AttributeError):
        return None
    if finite_number(value):
        return max(0.0, float(value))
    return None


def total_cost(costs: Iterable[float]) -> float:
    """Costs added up, at most the largest float: two reported costs of 1e308 made ``inf``, which
    JSON cannot hold (status.json and summary.json said ``Infinity``, which other readers refuse)."""
    try:
        return min(math.fsum(costs), sys.float_info.max)
    except OverflowError:  # fsum's own intermediate overflow
        return sys.float_info.max


def _peak(values: Any) -> Optional[int]:
    """The highest resident memory sampled over this run's attempts of a step; None where no sample
    saw it (every attempt ended before the first, or the step has no memory limit)."""
    sampled = [value for value in values if isinstance(value, int) and value > 0]
    return max(sampled) if sampled else None


#: the fields of a step's status.json and their types (each may be null but those of
#: STATUS_REQUIRED): a field of another type (a file edited by hand) makes the file no status,
#: instead of a traceback in the summary of this run and of every later one. ``_status`` writes
#: them; tests/test_pipeline_folders.py reads back every kind of status a run writes.
STATUS_REQUIRED = ("status", "attempts")
STATUS_FIELDS: Dict[str, Any] = {
    "step": str, "run": str, "status": str, "reason": str, "exit_code": int, "attempts": int, "started": float,
    "ended": float, "seconds": float, "queued_seconds": float, "gpu": (str, int), "memory_limit": str,
    "max_rss_bytes": int, "cost": float, "history": list, "output": str, "output_bytes": int, "previous_run": bool,
    "ended_with_worker": bool}


def _of_type(value: Any, kind: Any) -> bool:
    """JSON's types as Python reads them: a bool is no number, an int is a float."""
    if kind is bool:
        return isinstance(value, bool)
    if kind is float:
        kind = (int, float)
    return isinstance(value, kind) and not isinstance(value, bool)


def read_status(layout: RunLayout, step_id: str) -> Optional[Dict[str, Any]]:
    """A step's status.json, or None where there is none or it is not one (damaged, edited by
    hand): a JSON object whose status is a string and whose other fields have their types
    (``STATUS_FIELDS``). Such a step counts as not run."""
    status = _read_json(layout.status_path(step_id), "a step's status")
    if not isinstance(status, dict) or any(status.get(name) is None for name in STATUS_REQUIRED):
        return None
    if any(status.get(name) is not None and not _of_type(status[name], kind) for name, kind in STATUS_FIELDS.items()):
        return None
    return status


@dataclass
class _Walk:
    """What the walk has seen so far."""

    prev_ok: Optional[bool] = None  # outcome of the last step that ran; None before any
    failed: bool = False  # an unhandled failure happened
    reason: str = ""
    ended_by: str = ""  # what ended the walk early (a budget, a deadline, a loop): the steps left are skipped for it
    resume_at: Optional[str] = None  # where a plain --resume starts again: the first unhandled failure
    spent: float = 0.0  # the costs the steps reported
    runs: Dict[str, int] = field(default_factory=dict)
    arrivals: Dict[str, int] = field(default_factory=dict)  # each time the walk reached a step
    statuses: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    order: List[str] = field(default_factory=list)

    def fail(self, reason: str, at: str) -> None:
        """An unhandled failure at step ``at`` (the first one is where a plain --resume starts)."""
        if not self.failed:
            self.failed, self.reason = True, reason
        self.resume_at = self.resume_at or at

    def end(self, reason: str, at: str) -> None:
        """The walk ends here (a budget or deadline passed, a bounded step reached once too often),
        whatever failed before: the pipeline's reason says both, and the steps left say this one."""
        if self.failed:
            self.reason = f"{self.reason}; then {reason}"
        self.fail(reason, at)
        self.ended_by = reason


INTERRUPTED = "interrupted: the run was stopped"
STOPPING = "not started: the run is stopping"


class RunStopping(Exception):
    """The run was asked to stop (walltime): the pipeline starts nothing more; --resume goes on."""


def _signals_held():
    """Hold back the engine's stop signals (SIGUSR2 ends a busy worker) while we write a record."""
    return held_signals(STEP_HELD_SIGNALS)


def _should_run(step: Step, walk: _Walk, via_edge: bool) -> Optional[str]:
    """None if the step runs, else why it is skipped."""
    if step.condition == "prev.ok":
        return None if walk.prev_ok is not False else "condition prev.ok: the previous step failed"
    if step.condition == "prev.error":
        return None if walk.prev_ok is False else "condition prev.error: the previous step did not fail"
    if via_edge:
        return None
    if walk.failed:
        return "an earlier step failed"
    if walk.prev_ok is False:
        return "the previous step failed"
    return None


class PipelineRunner:
    """Runs one pipeline in the calling process (an engine worker, or a test)."""

    def __init__(self, pipeline: Pipeline, layout: RunLayout, *, acquire: Acquire = no_pools,
                 queue_timeout: Optional[float] = None, gpu: Optional[str] = None, seed: int = 0,
                 base_env: Optional[Dict[str, str]] = None, agent: Optional[str] = None,
                 node_slots: Sequence[str] = (), stop_asked: Callable[[], bool] = lambda: False,
                 launch_dir: Optional[Path] = None, definition_dir: Optional[Path] = None,
                 run_settings: Optional[settings.RunSettings] = None):
        """``run_settings``: the run's, read as it started (read from ``base_env`` where not given)."""
        self.pipeline, self.layout, self.acquire = pipeline, layout, acquire
        self.queue_timeout, self.gpu, self.seed = queue_timeout, gpu, seed
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.settings = run_settings or settings.read_all(self.base_env)
        self.agent, self.node_slots, self.stop_asked = agent, list(node_slots), stop_asked
        self.launch_dir = Path(launch_dir or os.getcwd()).resolve()
        self.definition_dir = Path(definition_dir).resolve() if definition_dir is not None else self.launch_dir
        self.deadline: Optional[float] = None  # time.monotonic() instant
        self.run_started = time.time()
        self._launched = False  # whether the step's current attempt got past its pools and started

    # ----- one step -----
    def _pipeline_vars(self, step: Step, attempt: int) -> Dict[str, str]:
        return step_variables(name=self.pipeline.name, run_id=self.layout.run_id, run_dir=self.layout.run_dir,
                              shared=self.layout.shared, step_id=step.id, step_dir=self.layout.step_dir(step.id),
                              attempt=attempt, seed=self.seed, launch_dir=self.launch_dir,
                              definition_dir=self.definition_dir)

    def _wait_limit(self, began: float) -> tuple:
        """(seconds left to wait for a pool, why the wait ends): the queue timeout or the deadline."""
        limits = []
        if self.queue_timeout is not None:
            limits.append((began + self.queue_timeout - time.monotonic(), f"queue timeout {self.queue_timeout:g} s"))
        if self.deadline is not None:
            limits.append((self.deadline - time.monotonic(), "pipeline deadline passed"))
        return min(limits) if limits else (None, "")

    def _hold_pools(self, stack: contextlib.ExitStack, step: Step) -> float:
        """Acquire the step's pools (sorted by name, so no two steps deadlock); seconds waited."""
        began = time.monotonic()
        for pool, count in sorted(step.pools.items()):
            wait, why = self._wait_limit(began)
            if wait is not None and wait <= 0:
                raise QueueTimeout(f"{why} while waiting for pool {pool!r}")
            try:
                stack.enter_context(self.acquire(pool, count, wait))
            except PoolTimeout:
                raise QueueTimeout(f"{why} while waiting for pool {pool!r}") from None
            except Exception as error:
                raise PoolRefused(f"pool {pool!r} refused: {error}") from None
        if step.gpu and self.node_slots:  # last: it is held while nothing else is waited for
            wait, why = self._wait_limit(began)
            if wait is not None and wait <= 0:
                raise QueueTimeout(f"{why} while waiting for a node-wide GPU slot")
            try:
                stack.enter_context(nodelock.hold_slot(self.node_slots, wait, stop=self.stop_asked,
                                                       chosen_dir=self.settings.lock_dir))
            except nodelock.SlotWaitStopped:
                raise RunStopping(step.id) from None
            except nodelock.SlotTimeout as error:
                raise QueueTimeout(f"{why} while waiting for a node-wide GPU slot ({error})") from None
            except OSError as error:
                raise PoolRefused(f"node-wide GPU slot: {error}") from None
        return time.monotonic() - began

    def _attempt(self, step: Step, attempt: int) -> tuple:
        """One run of the step with its pools held; (Attempt, seconds queued)."""
        queued_since = time.time()
        with contextlib.ExitStack() as stack:
            try:
                queued = self._hold_pools(stack, step)
            except (QueueTimeout, PoolRefused) as error:
                now = time.time()
                return Attempt("failed", None, now, now, str(error)), now - queued_since
            if self.stop_asked():  # asked while the step waited for its pools: it does not start
                raise RunStopping(step.id)
            gpu = self.gpu if step.gpu else None
            variables = self._pipeline_vars(step, attempt)
            env = step_environment(self.base_env, variables, step, gpu)
            apptainer = find_apptainer(self.settings.apptainer) if step.container else None
            step_dir = self.layout.step_dir(step.id)
            try:
                if step.container and apptainer is None:  # here, on this node: rank 0's node had one
                    raise ValueError(missing_apptainer(self.settings.apptainer))
                argv = step_argv(step, str(self.layout.run_dir.resolve()), apptainer, self.agent,
                                 code=python_paths(variables))
            except ValueError as error:
                now = time.time()
                return Attempt("failed", None, now, now, str(error)), queued
            prompt = None
            if step.prompt is not None:
                prompt = step_dir / STEP_PROMPT
                atomic_write_text(prompt, step.prompt)
            self._launched = True  # from here on, a stop interrupts the step; before, it never started
            result = run_attempt(argv, env=env, step_dir=step_dir, attempt=attempt, timeout=step.timeout,
                                 memory=step.memory, stop_at=self.deadline, stdin=prompt,
                                 kill_grace=self.settings.kill_grace)
            output = step_dir / STEP_OUTPUT if step.prompt is not None else None
            result.cost = read_cost_and_output(step_dir / STEP_STDOUT, result.stdout_offset, output)
            return result, queued

    def _status(self, step: Step, status: str, reason: str, attempts: int, started: Optional[float],
                ended: Optional[float], seconds: float, exit_code: Optional[int] = None, **extra: Any) -> Dict[str, Any]:
        return {"step": step.id, "run": self.layout.run_id, "status": status, "reason": reason,
                "exit_code": exit_code, "attempts": attempts, "started": started, "ended": ended,
                "seconds": seconds, **extra, "gpu": self.gpu if step.gpu and status != "skipped" else None}

    def _write_status(self, step: Step, status: Dict[str, Any]) -> None:
        self.layout.step_dir(step.id).mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.layout.status_path(step.id), status)

    def _skip(self, walk: _Walk, step: Step, reason: str) -> None:
        status = self._status(step, "skipped", reason, walk.runs.get(step.id, 0), None, None, 0.0)
        if step.id not in walk.statuses:  # a step that ran earlier in a loop keeps its record
            walk.statuses[step.id] = status
            self._write_status(step, status)

    def _earlier_history(self, step: Step) -> List[Dict[str, Any]]:
        """The attempts an earlier run (or an earlier lap of a loop) recorded for the step: kept."""
        status = read_status(self.layout, step.id) or {}
        history = status.get("history") if status.get("status") != "skipped" else None
        return [h for h in history if isinstance(h, dict)][-MAX_HISTORY:] if isinstance(history, list) else []

    def _wait_before_retry(self, step: Step, retry: int) -> Optional[str]:
        """Sleep ``retry_delay`` (doubled for each retry), watching for a stop; why not to retry, if so."""
        wait = step.retry_wait(retry)
        if self.deadline is not None and time.monotonic() + wait >= self.deadline:
            return f"no retry: the deadline would pass during its retry_delay of {wait:g} s"
        until = time.monotonic() + wait
        while True:
            if self.stop_asked():
                return STOPPING
            left = until - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(0.2, left))

    def _history_entry(self, attempt: Attempt, queued: float) -> Dict[str, Any]:
        """An attempt as the step's status.json ``history`` lists it."""
        return dict(attempt.as_dict(), queued_seconds=round(queued, 3), run_started=self.run_started)

    def _run_step(self, walk: _Walk, step: Step) -> Dict[str, Any]:
        """Run the step, retrying in place while its max_retries allow (after its retry_delay);
        write and return its status. Raises :class:`RunStopping` when a stop cut its retries short."""
        earlier = self._earlier_history(step)
        output = self.layout.step_dir(step.id) / STEP_OUTPUT
        older_output = _file_identity(output)  # an earlier run's, unless an attempt now writes it again
        history: List[Dict[str, Any]] = []
        limit = None if step.max_retries is None else 1 + step.max_retries
        not_retried = ""
        while True:
            walk.runs[step.id] = walk.runs.get(step.id, 0) + 1
            began = time.time()
            self._launched = False
            try:
                attempt, queued = self._attempt(step, walk.runs[step.id])
            except BaseException as error:  # the worker is being stopped by its rank: record it, then go
                with _signals_held():  # a second stop signal must not cut the record short
                    # ended while it waited for its pools: it did not start (not "failed" in a stopped run)
                    reason = ((INTERRUPTED if self._launched else STOPPING) if not isinstance(error, Exception)
                              else STOPPING
                              if isinstance(error, RunStopping)
                              else f"error in the pipeline runner: {type(error).__name__}: {error}")
                    ended = time.time()
                    cut = self._history_entry(Attempt("failed", None, began, ended, reason), 0.0)  # listed too
                    self._write_status(step, self._status(step, "failed", reason, walk.runs[step.id], began, ended,
                                                          round(ended - began, 3),
                                                          history=(earlier + history + [cut])[-MAX_HISTORY:]))
                raise
            walk.spent = total_cost([walk.spent, attempt.cost])
            history.append(self._history_entry(attempt, queued))
            deadline_passed = self.deadline is not None and time.monotonic() >= self.deadline
            if attempt.status == "ok" or limit is None or walk.runs[step.id] >= limit or deadline_passed:
                break
            if self._over_budget(walk):
                not_retried = f"no retry: {self._budget_reason(walk)}"
                break
            not_retried = self._wait_before_retry(step, len(history)) or ""
            if not_retried:
                break
        last = history[-1]
        reason = f"{last['reason']}; {not_retried}" if not_retried else last["reason"]
        status = self._status(step, last["status"], reason, walk.runs[step.id], history[0]["started"],
                              last["ended"], round(sum(h["ended"] - h["started"] for h in history), 3),
                              exit_code=last["exit_code"],
                              queued_seconds=round(sum(h["queued_seconds"] for h in history), 3))
        status.update(memory_limit=step.memory_text, max_rss_bytes=_peak(h.get("max_rss_bytes") for h in history),
                      cost=round(total_cost(h["cost"] for h in history), 6), history=(earlier + history)[-MAX_HISTORY:])
        identity = _file_identity(output) if output.is_file() else None
        written = identity is not None and (older_output is None or identity != older_output)
        status["output"] = str(output.relative_to(self.layout.results)) if written else None
        status["output_bytes"] = identity[2] if written and identity is not None else None  # its size
        self._write_status(step, status)
        if not_retried == STOPPING:
            raise RunStopping(step.id)
        return status

    def _over_budget(self, walk: _Walk) -> bool:
        return self.pipeline.budget is not None and walk.spent > self.pipeline.budget

    def _budget_reason(self, walk: _Walk) -> str:
        return f"budget {self.pipeline.budget:g} passed: the steps reported {walk.spent:g}"

    def _write_progress(self, walk: _Walk, state: str, current: Optional[str]) -> None:
        """Where a plain --resume starts again: the first unhandled failure, else the current step;
        for a failed walk, its reason (the run's summary reads it here, not from the item's error)."""
        atomic_write_json(self.layout.progress_path, {
            "pipeline": self.pipeline.name, "state": state, "resume_at": walk.resume_at or current,
            "spent": round(walk.spent, 6), "run_started": self.run_started, "updated": time.time(),
            **({"reason": walk.reason} if state == "failed" else {})})

    # ----- the walk -----
    def run(self, start: Optional[str] = None, keep_shared: bool = False) -> Dict[str, Any]:
        """Run the pipeline (from step ``start`` on a resume); return its summary.

        ``keep_shared``: a plain --resume going on from where the run stopped uses shared/ as it
        is, even from the first step. Raises :class:`RunStopping` (after recording where to go on)
        when the run is asked to stop: no further step or retry starts.
        """
        began, clock = time.time(), time.monotonic()
        self.run_started = began
        if self.pipeline.deadline_seconds is not None:
            self.deadline = clock + self.pipeline.deadline_seconds
        steps, walk = self.pipeline.steps, _Walk()
        position = 0 if start is None else self.pipeline.index(start)
        if position == 0 and not keep_shared:
            self.layout.set_shared_aside()
        self.layout.shared.mkdir(parents=True, exist_ok=True)
        earlier: Dict[str, Dict[str, Any]] = {}
        kept_failure: Optional[Tuple[str, str]] = None  # (reason, step) of the first kept unhandled failure
        for step in steps[:position]:  # a resume: earlier steps are kept as they were
            earlier[step.id] = dict(read_status(self.layout, step.id) or {"status": "missing"}, previous_run=True)
            kept = earlier[step.id].get("status")
            if kept not in ("ok", "skipped", "missing") and not step.on_fail and kept_failure is None:
                # its failure stands, the pipeline's too: judged after the walk, whose steps run as on any resume
                kept_failure = (f"step {step.id!r} failed in an earlier run: {earlier[step.id].get('reason') or kept}",
                                step.id)
        # ... and so is what they cost: the budget counts it (a resume must not start spending afresh)
        walk.spent = total_cost(cost for cost in (status.get("cost") for status in earlier.values())
                                if finite_number(cost))
        via_edge = start is not None
        first = start is not None  # the step a resume starts from runs, whatever its condition
        while position < len(steps):
            step = steps[position]
            if self.deadline is not None and time.monotonic() >= self.deadline:
                walk.end(f"deadline of {self.pipeline.deadline_seconds:g} s passed", step.id)
                break
            limit = None if step.max_retries is None else 1 + step.max_retries
            walk.arrivals[step.id] = walk.arrivals.get(step.id, 0) + 1
            if limit is not None and (walk.runs.get(step.id, 0) >= limit or walk.arrivals[step.id] > limit):
                walk.end(f"step {step.id!r} reached again after its {limit} runs (max_retries {step.max_retries})"
                              if walk.runs.get(step.id, 0) >= limit else
                              f"step {step.id!r} reached {walk.arrivals[step.id]} times, more than its {limit} "
                              f"(max_retries {step.max_retries}; skips count)", step.id)
                break
            skip = None if first else _should_run(step, walk, via_edge)
            first = False
            if skip is not None:
                self._skip(walk, step, skip)
                position, via_edge = position + 1, False
                continue
            if self._over_budget(walk):
                walk.end(self._budget_reason(walk), step.id)
                break
            if self.stop_asked():
                self._write_progress(walk, "stopped", step.id)
                raise RunStopping(step.id)
            self._write_progress(walk, "running", step.id)
            try:
                status = self._run_step(walk, step)
            except RunStopping:
                self._write_progress(walk, "stopped", step.id)
                raise
            walk.statuses[step.id], walk.prev_ok = status, status["status"] == "ok"
            walk.order.append(step.id)
            if status["status"] == "ok":
                position, via_edge = (self.pipeline.index(step.next), True) if step.next else (position + 1, False)
            elif self.deadline is not None and time.monotonic() >= self.deadline:
                walk.end(f"deadline of {self.pipeline.deadline_seconds:g} s passed during step {step.id!r}", step.id)
                break
            elif step.on_fail:
                position, via_edge = self.pipeline.index(step.on_fail), True
            else:
                walk.fail(f"step {step.id!r} failed: {status['reason']}", step.id)
                position, via_edge = position + 1, False
        if kept_failure is not None:  # the first unhandled failure, where a plain --resume goes on
            reason, at = kept_failure
            walk.failed, walk.resume_at = True, at
            walk.reason = reason if not walk.reason else f"{reason}; then {walk.reason}"
        for step in steps:  # what a jump, a deadline or an exhausted loop left unvisited
            if step.id not in walk.statuses and step.id not in earlier:
                self._skip(walk, step, walk.ended_by or (walk.reason if walk.failed else "not reached"))
        self._write_progress(walk, "failed" if walk.failed else "ok", None)
        statuses = {**earlier, **walk.statuses}
        return {"run_id": self.layout.run_id, "pipeline": self.pipeline.name,
                "status": "failed" if walk.failed else "ok", "reason": walk.reason, "resumed_from": start,
                "started": began, "ended": time.time(), "seconds": round(time.monotonic() - clock, 3),
                "cost": round(walk.spent, 6), "budget": self.pipeline.budget, "order": walk.order,
                "steps": {s.id: statuses[s.id] for s in steps if s.id in statuses}}


def _file_identity(path: Path) -> Optional[Tuple[int, int, int, int]]:
    """What tells a file rewritten from the one that was there (inode, device, size, mtime), None
    where there is none: compared, not the mtime against the clock, which a shared filesystem's
    server keeps, not this node."""
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_ino, info.st_dev, info.st_size, info.st_mtime_ns)
