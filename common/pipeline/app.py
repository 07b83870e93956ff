"""The pipeline runner as an engine app: one work item per pipeline, its steps run in the worker.

The engine spreads the pipelines of a file over every worker of every rank (one per GPU, pinned
to it) and journals each pipeline that finishes, so a plain ``--resume`` skips them. A resume
from a step (``--resume RUN_ID/STEP_ID``) becomes an item of its own, ``RUN_ID@from=STEP_ID``,
that the engine runs although the pipeline itself may be journaled.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import settings
from ..app import App, RunInfo, finite_number
from ..devices import Device
from ..errors import ItemFailed, UsageError, error_line, quoted, short
from ..items import Item, item_seed, torch_seed
from . import nodelock, report
from .container import CONTAINER_ENV, default_image, find_apptainer, missing_apptainer
from .definition import POOL_PATTERN, Pipeline, breaks_bind, check_pools, load_definition, shown_path
from .flow import INTERRUPTED, STOPPING, PipelineRunner, RunLayout, RunStopping, read_progress
from .report import plan_text, statuses_on_disk, summary_markdown

if TYPE_CHECKING:  # a pipeline's processes need no numpy of their own (0.1 s of CPU each)
    import numpy as np

RESOURCE_ENV_PREFIX = "PIPELINE_RESOURCE_"
#: the name the pipeline format itself uses, read beside ours (ours wins where both are set)
SWARM_RESOURCE_PREFIX = "SWARM_RESOURCE_"
AGENT_ENV = "PIPELINE_AGENT"
GPU_POOL = "gpu"


class PipelineFailed(ItemFailed):
    """A pipeline ended as failed; its steps' status.json files say why (no traceback: the
    pipeline's outcome, not an error of the runner)."""


def _capacity(text: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{where}: capacity must be a whole number, got {short(text)}") from None
    if value < 1:
        raise UsageError(f"{where}: capacity must be at least 1, got {short(value)}")
    return value


def configured_pools(resource_flags: List[str], environ: Mapping[str, str]) -> Dict[str, int]:
    """Pool capacities from ``SWARM_RESOURCE_<name>=N``, then ``PIPELINE_RESOURCE_<NAME>=N``, then
    ``--resource NAME=N`` (each later one wins; only the winner's value must be a capacity, so a
    flag mends a bad variable left in the environment; one pool in two flags is refused). A variable
    set empty is as unset, as every setting's (common.settings: a job script's ``VAR=`` clears it)."""
    given: Dict[str, Tuple[str, str]] = {}  # pool -> (its value, where it was given)
    for prefix in (SWARM_RESOURCE_PREFIX, RESOURCE_ENV_PREFIX):
        for name, value in sorted(environ.items()):
            if name.startswith(prefix) and len(name) > len(prefix) and value.strip():
                pool = name[len(prefix):].lower()
                if not POOL_PATTERN.fullmatch(pool):
                    raise UsageError(f"{name}: pool name is malformed: a letter, then letters, digits, '_'")
                given[pool] = (value, name)
    flagged: Dict[str, str] = {}
    for flag in resource_flags:
        pool, _, value = flag.partition("=")
        if not _ or not POOL_PATTERN.fullmatch(pool):
            raise UsageError(f"--resource {short(flag)}: expected NAME=N, such as gpu=2 or licence=1")
        if pool.lower() in flagged:  # as a key given twice in a file: which one was meant?
            raise UsageError(f"--resource {short(flag)}: pool {pool.lower()!r} is already given by --resource "
                             f"{short(flagged[pool.lower()])} (pool names ignore case); give it once")
        flagged[pool.lower()] = flag
        given[pool.lower()] = (value, f"--resource {flag}")
    return {pool: _capacity(value, where) for pool, (value, where) in given.items()}


def queue_timeout(flag: Optional[float], environ: Mapping[str, str]) -> Optional[float]:
    """Seconds a step may wait for its pools: ``--queue-timeout``, else ``PIPELINE_QUEUE_TIMEOUT``,
    else ``SWARM_QUEUE_TIMEOUT`` (two seconds settings of common.settings, read and checked here only:
    the flag replaces them unread); None: no limit."""
    if flag is None:
        for setting in (settings.QUEUE_TIMEOUT, settings.SWARM_QUEUE_TIMEOUT):
            seconds = settings.value(setting, environ)
            if seconds is not None:
                return float(seconds)
    if flag is not None and not (0 < flag <= settings.MAX_QUEUE_TIMEOUT):  # also refuses nan
        raise UsageError(f"--queue-timeout: must be a positive number of seconds up to {settings.MAX_QUEUE_TIMEOUT:,}, "
                         f"got {flag:g}")
    return flag


def pipelines_fingerprint(pipelines: List[Pipeline]) -> Dict[str, Any]:
    """What a resume must share with the run it resumes: the set of pipelines. Definitions are meant
    to be edited between a failure and a resume (fix a step, resume from it)."""
    return {"pipelines": sorted(pipeline.name for pipeline in pipelines)}


def parse_resume_target(value: Any, pipelines: List[Pipeline]) -> Optional[Tuple[str, str]]:
    """``RUN_ID/STEP_ID`` of ``--resume`` as (pipeline, step); None for a plain ``--resume``."""
    if not isinstance(value, str):
        return None
    run_id, _, step_id = value.partition("/")
    by_name = {p.name: p for p in pipelines}
    if not _ or not run_id or not step_id:
        raise UsageError(f"--resume {short(value)}: expected RUN_ID/STEP_ID (such as train-cnn/evaluate), "
                         "or --resume alone to go on with the unfinished pipelines")
    if run_id not in by_name:
        raise UsageError(f"--resume {short(value)}: no pipeline {short(run_id)} in the definition "
                         f"(it has: {', '.join(sorted(by_name))})")
    if step_id not in by_name[run_id].step_ids:
        raise UsageError(f"--resume {short(value)}: pipeline {run_id!r} has no step {short(step_id)} "
                         f"(it has: {', '.join(by_name[run_id].step_ids)})")
    return run_id, step_id


def agent_command(flag: Optional[str], environ: Mapping[str, str], pipelines: List[Pipeline], source: str) -> Optional[str]:
    """The shell command that runs prompt steps: ``--agent``, else ``PIPELINE_AGENT``. A prompt
    step with neither is refused before anything runs."""
    agent = flag if flag is not None else (environ.get(AGENT_ENV) or None)  # an empty variable: unset
    if agent is not None and not agent.strip():
        raise UsageError(f"{'--agent' if flag is not None else AGENT_ENV}: the agent command is empty")
    prompts = [(pipeline, step) for pipeline in pipelines for step in pipeline.steps if step.prompt is not None]
    if agent is None and prompts:
        pipeline, step = prompts[0]
        raise UsageError(f"{source}, pipeline {pipeline.name!r}, step {step.id!r}: a prompt step needs an "
                         f"agent command: pass --agent 'CMD' or set {AGENT_ENV} (it reads the prompt on "
                         "its standard input)")
    # run with /bin/sh -c by every prompt step: a syntax error fails them all. This node's sh reads it
    # only for the steps it runs here: a container's sh may be bash, which reads more (<(...))
    if agent is not None and any(step.container is None for _, step in prompts):
        _check_shell_syntax(agent, "--agent" if flag is not None else AGENT_ENV)
    relative = _relative_file(agent) if agent is not None and prompts else None
    if relative is not None:  # found here, but the step's folder is where it runs: every prompt step would fail
        raise UsageError(f"{'--agent' if flag is not None else AGENT_ENV}: {relative!r} is a file in this folder, but the "
                         f"agent runs in each prompt step's own folder: write it as \"$PIPELINE_LAUNCH_DIR/{os.path.normpath(relative)}\" "
                         "(this folder) or as an absolute path")
    return agent


def _check_shell_syntax(command: str, name: str) -> None:
    """Refuse a command ``/bin/sh -c`` could not parse (an unclosed quote), in the shell's own
    words (``sh -n`` reads it without running anything)."""
    try:
        checked = subprocess.run(["/bin/sh", "-n", "-c", command], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):  # no shell to ask: the step says it when it runs
        return
    if checked.returncode != 0:
        said = " ".join(checked.stderr.split())[:200] or f"exit code {checked.returncode}"
        raise UsageError(f"{name}: the shell cannot read the agent command ({said})")


#: programs whose first argument that is not an option is the script they run
INTERPRETERS = re.compile(r"(python|pypy)[0-9.]*|bash|sh|zsh|dash|Rscript|julia|node|perl|ruby")
#: words before the program that the shell or a wrapper takes (its program follows them)
WRAPPERS = ("env", "time", "nice", "exec", "command", "nohup")


def _relative_file(command: str) -> Optional[str]:
    """The program named by a relative path (``./agent``, ``bin/agent``: a bare name is looked up
    on PATH), or the script an interpreter is given (``python3 agent.py``), where it is a file
    here; None otherwise (a command that changes folder first, ``cd ... && ...``, is taken as it is)."""
    try:
        words = shlex.split(command)
    except ValueError:  # unbalanced quotes: the shell says so when the step runs
        return None
    while words and (words[0] in WRAPPERS or ("=" in words[0] and not words[0].startswith(("=", "/", ".")))
                     or (words[0].startswith("-") and len(words) > 1)):  # env A=1, time -p, VAR=value
        words = words[1:]
    if not words or words[0] in ("cd", "pushd"):
        return None
    named = [words[0]] if "/" in words[0] else []
    if INTERPRETERS.fullmatch(os.path.basename(words[0])):
        named += [next((word for word in words[1:] if not word.startswith("-")), "")]
    for word in named:
        if not word or word.startswith(("$", "~")) or os.path.isabs(word):
            continue
        with contextlib.suppress(OSError, ValueError):
            if os.path.isfile(word):
                return word
    return None


@dataclass
class WorkerState:
    gpu: Optional[str]  # the physical GPU of this worker, or None on a CPU worker
    acquire: Callable[..., Any]
    host: str
    node_slots: List[str]  # the node-wide slot files a GPU step may take (nodelock)
    stop_asked: Callable[[], bool]


class PipelineApp(App):
    name = "pipeline"
    module = "common.pipeline"
    default_retries = 0  # steps have their own max_retries and on_fail; --retries N reruns whole pipelines
    items_resume_part_way = True  # a pipeline cut off goes on from its first unfinished step
    resume_target = True  # --resume RUN_ID/STEP_ID
    answer_counts_failures = True  # "2 pipelines: 1 ok, 1 failed"
    description = ("Run pipelines of steps (train -> evaluate -> report) with GPU and other resource pools, "
                   "fallbacks, retries and resume; the pipelines of a file spread over every GPU of every node.")

    @classmethod
    def results_name(cls, args: argparse.Namespace) -> str:
        """Each definition its own folder: ``ml.json`` -> ``results/ml``."""
        definition = getattr(args, "definition", None)
        return Path(definition).stem if definition else cls.name

    @classmethod
    def results_name_help(cls) -> str:
        return "DEFINITION's name (ml.json -> results/ml)"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("definition", type=Path, help="pipeline definition (JSON, or YAML with PyYAML)")
        parser.add_argument("--resource", action="append", default=[], metavar="NAME=N",
                            help="capacity of a resource pool (repeatable); also PIPELINE_RESOURCE_<NAME>=N. "
                                 "The gpu pool is per node and defaults to its GPUs (its workers without GPU)")
        parser.add_argument("--queue-timeout", type=float, default=None, metavar="SECONDS",
                            help="fail a step that waits longer for its pools (also PIPELINE_QUEUE_TIMEOUT or "
                                 "SWARM_QUEUE_TIMEOUT); default: wait as long as it takes")
        parser.add_argument("--agent", default=None, metavar="CMD",
                            help="shell command that runs prompt steps: the prompt on its standard input, "
                                 "PIPELINE_MODEL and PIPELINE_TOOLS in its environment, its standard output "
                                 "saved as the step's output.md (also PIPELINE_AGENT)")
        parser.add_argument("--container", default=None, metavar="IMAGE",
                            help="image (file or URI) of the steps whose definition names none: they run in it "
                                 f"with apptainer (also {CONTAINER_ENV}); a step's or pipeline's own 'container' wins")
        parser.add_argument("--dry-run", action="store_true",
                            help="check the definition and the results folder as the run would, print the plan "
                                 "(pipelines, steps, pools, conditions) and exit without running or writing anything")
        parser.add_argument("--schema", action="store_true",
                            help="print the definition format as JSON Schema (for editors) and exit")

    # ----- every rank -----
    @property
    def results(self) -> Path:
        """The results folder, absolute: the steps run in folders of their own. Read from the
        arguments each time: a --resume may have found the run in an earlier version's default."""
        return Path(self.args.results).absolute()

    def validate(self) -> None:
        # the run's settings, read as it starts on this rank (its workers get them with the app)
        self.run_settings = settings.read_all()
        image = default_image(self.args.container, os.environ)
        self.pipelines = load_definition(self.args.definition, default_image=image)
        self.by_name = {p.name: p for p in self.pipelines}
        self.capacities = configured_pools(self.args.resource, os.environ)
        self.queue_timeout = queue_timeout(self.args.queue_timeout, os.environ)
        known: Dict[str, Optional[int]] = dict(self.capacities)
        known.setdefault(GPU_POOL, None)  # per node, known on each node
        check_pools(self.pipelines, known, shown_path(self.args.definition))
        if any(s.container for p in self.pipelines for s in p.steps) and find_apptainer(self.run_settings.apptainer) is None:
            raise UsageError(f"{shown_path(self.args.definition)}: a step runs in a container, but "
                             f"{missing_apptainer(self.run_settings.apptainer)}")
        self.resume_from = parse_resume_target(self.args.resume, self.pipelines)
        self.agent = agent_command(self.args.agent, os.environ, self.pipelines, shown_path(self.args.definition))
        if any(s.container for p in self.pipelines for s in p.steps) and breaks_bind(str(self.results)):
            raise UsageError(f"--results {self.results}: a step runs in a container, and apptainer's --bind would read "
                             "the ':' or ',' in this path as separators; choose a results folder without them")
        self.definition_dir = Path(self.args.definition).absolute().parent
        self.explicit_gpu_pool = GPU_POOL in self.capacities
        uses_slots = self.explicit_gpu_pool or any(device.is_gpu for device in self.devices)  # as setup_worker
        if uses_slots and any(GPU_POOL in step.pools for pipeline in self.pipelines for step in pipeline.steps):
            try:  # where the node-wide GPU slots live (made now, as the first GPU step would): refused now
                nodelock.lock_dir(self.run_settings.lock_dir)
            except FileExistsError as error:  # mkdir's "[Errno 17] File exists": a file, or a link to nothing
                raise UsageError(f"{settings.LOCK_DIR.name}: the node-wide GPU slots cannot live there: "
                                 f"{quoted(error.filename)} exists and is not a folder") from None
            except OSError as error:
                said = f"{error.strerror}: {quoted(error.filename)}" if error.strerror and error.filename else error
                raise UsageError(f"{settings.LOCK_DIR.name}: the node-wide GPU slots cannot live there: {said}") from None

    def plan_text(self) -> str:
        """What a run would do, for --dry-run (the engine has checked the results folder first):
        read-only; with --resume, where each pipeline goes on, or that it is finished."""
        starts = {}
        if self.resume_from:
            run_id, step_id = self.resume_from
            for pipeline in self.pipelines:  # the others are not run at all, finished or not
                starts[pipeline.name] = (f"resume from step {step_id!r}" if pipeline.name == run_id else
                                         f"not run: --resume {run_id}/{step_id} runs {run_id!r} alone" +
                                         ("" if self._finished_key(pipeline.name, self.journaled) else " (unfinished)"))
        elif self.args.resume:
            for pipeline in self.pipelines:
                point = self.resume_point(pipeline)
                starts[pipeline.name] = ("finished: --resume skips it" if self._finished_key(pipeline.name, self.journaled)
                                         else f"--resume goes on at step {point!r}" if point
                                         else "--resume: from the first step")
        capacities: Dict[str, Any] = dict(self.capacities)
        if capacities.get(GPU_POOL) is None:  # what pools() gives the run: its GPUs, else one per worker
            gpus = len(self.gpus())
            capacities[GPU_POOL] = (f"{gpus} per rank (its GPUs)" if gpus
                                    else f"{self.args.workers} per rank (no GPU: one per worker)")
        return plan_text(self.pipelines, capacities, self.queue_timeout, self.agent, starts, self.results,
                         len(self.devices))

    def resume_point(self, pipeline: Pipeline) -> Optional[str]:
        """The step where a plain --resume goes on with an unfinished pipeline (its progress.json),
        or None to run it from its first step."""
        layout = RunLayout(self.results, pipeline.name)
        progress = read_progress(layout)
        if progress is None and layout.progress_path.exists() and layout.shared.is_dir():
            self._damaged_progress(pipeline, layout, "not a JSON object")
        if not progress or progress.get("state") == "ok" or not layout.shared.is_dir():
            return None
        point = progress.get("resume_at")
        if point is not None and not (isinstance(point, str) and point in pipeline.step_ids):
            self._damaged_progress(pipeline, layout, f"it resumes at {point!r}, which is no step of {pipeline.name!r} "
                                   f"(renamed or removed from the definition?)")
        return point

    def _damaged_progress(self, pipeline: Pipeline, layout: RunLayout, why: str) -> None:
        """A progress.json that cannot say where to go on: refused rather than silently starting the
        pipeline again from its first step (which would set its shared/ aside)."""
        raise UsageError(f"{quoted(layout.progress_path)}: cannot say where to go on ({why}); say where "
                         f"{pipeline.name!r} goes on with "
                         f"--resume {pipeline.name}/STEP, or remove the file to run it from its first step")

    def fingerprint(self) -> Dict[str, Any]:
        return pipelines_fingerprint(self.pipelines)

    def output_names(self) -> Tuple[str, ...]:
        """A folder per pipeline (RESULTS/RUN_ID/): ``--results .`` works beside the definition and a
        user's other files."""
        return tuple(pipeline.name for pipeline in self.pipelines)

    def pools(self) -> Dict[str, Any]:
        # the engine's devices: --gpu as given, and only this rank's share of a node's GPUs
        gpu = self.capacities.get(GPU_POOL) or len(self.gpus()) or self.args.workers
        pools = {name: (capacity, "global") for name, capacity in self.capacities.items() if name != GPU_POOL}
        pools[GPU_POOL] = (gpu, "node")
        self.gpu_capacity = gpu  # for the workers' node-wide slots (a worker sees only its own GPU)
        return pools

    # ----- rank 0 -----
    def prepare(self) -> None:
        for pipeline in self._to_run():  # their earlier folders: nothing of another kind in their places
            problem = RunLayout(self.results, pipeline.name).in_the_way(pipeline.step_ids)
            if problem:
                raise UsageError(f"{problem}; move it away")
        if self.resume_from:
            run_id, step_id = self.resume_from
            shared = RunLayout(self.results, run_id).shared
            if not shared.is_dir():
                raise UsageError(f"--resume {run_id}/{step_id}: {shared} does not exist; nothing to resume "
                                 "(run the pipeline first, with the same --results)")
        elif self.args.resume:  # where each unfinished pipeline goes on: a damaged progress.json is refused now
            for pipeline in self._to_run():
                self.resume_point(pipeline)

    def _to_run(self) -> List[Pipeline]:
        """The pipelines this run runs: the one resumed from a step, or those not finished (the
        finished ones' folders are only read, for the summary)."""
        if self.resume_from:
            return [self.by_name[self.resume_from[0]]]
        return [pipeline for pipeline in self.pipelines if self._finished_key(pipeline.name, self.journaled) is None]

    def _finished_key(self, pipeline: str, records: Mapping[str, Any]) -> Optional[str]:
        """The key of the run that finished the pipeline, or None where none did or a later run of it
        left it unfinished: a resume from a step that failed or was stopped is in no journal record,
        but its progress.json says so (every run of the pipeline rewrites it as it goes)."""
        key = self._newest_key(pipeline, records)
        if key is None:
            return None
        progress = read_progress(RunLayout(self.results, pipeline))
        return key if progress is None or progress.get("state") == "ok" else None

    @staticmethod
    def _newest_key(pipeline: str, records: Mapping[str, Any]) -> Optional[str]:
        """The key of the pipeline's newest journaled run: a whole run, or a resume from a step."""
        def ended(key: str) -> float:
            result = records[key].result
            return float(result.get("ended") or 0.0) if isinstance(result, dict) else 0.0

        keys = [k for k in records if k == pipeline or k.startswith(pipeline + "@from=")]
        return max(keys, key=ended) if keys else None

    def items(self) -> List[Item]:
        journaled = self.journaled  # every pipeline the journal holds as finished
        done = list(journaled)
        if self.resume_from:
            run_id, step_id = self.resume_from
            return [Item(key=_fresh_key(f"{run_id}@from={step_id}", done), params={"run_id": run_id, "start": step_id})]
        items = []
        for pipeline in self.pipelines:
            # A pipeline finished by a resume from a step counts as finished: its newest record stands.
            finished = self._finished_key(pipeline.name, journaled)
            key, params = finished or pipeline.name, {"run_id": pipeline.name, "start": None}
            if self.args.resume and finished is None:  # unfinished: go on where it stopped, shared/ as it is
                start = self.resume_point(pipeline)
                if start is not None:
                    params = {"run_id": pipeline.name, "start": start, "keep_shared": True}
                if key in journaled:  # finished once, then left unfinished by a later run: a fresh key
                    key = _fresh_key(f"{pipeline.name}@from={start or pipeline.steps[0].id}", done)
            items.append(Item(key=key, params=params, cost=float(1 + sum(s.gpu for s in pipeline.steps))))
        return items

    def draws_figures(self) -> bool:
        return False  # its report is tables and text

    def finish(self, run: RunInfo) -> Dict[str, Any]:
        """Every pipeline of the file: this run's outcome where it ran, else its newest journaled run."""
        return {"pipelines": self._pipelines(run, stopped=False)}

    def where_stopped(self, run: RunInfo) -> Dict[str, Any]:
        """The same table for a run stopped before the end: the pipelines it did not finish are
        "stopped" (some steps done, as their status files say) or "not started", not failed."""
        return {"pipelines": self._pipelines(run, stopped=True)}

    def _pipelines(self, run: RunInfo, stopped: bool) -> Dict[str, Dict[str, Any]]:
        errors = {f["key"]: f.get("error") or "" for f in run.failed_items}
        this_run = {item.params["run_id"]: item for item in run.items}
        journaled = {**self.journaled, **run.records}
        pipelines = {}
        for pipeline in self.pipelines:
            run_id, item = pipeline.name, this_run.get(pipeline.name)
            layout = RunLayout(self.results, run_id)
            key = item.key if item is not None else self._finished_key(run_id, journaled)
            record = journaled.get(key) if key is not None else None
            if record is not None:
                summary = dict(record.result)
                if key in self.journaled:  # finished in an earlier run, not run now: every step is that run's
                    summary["steps"] = _as_earlier(summary.get("steps", {}), [s.id for s in pipeline.steps])
            elif item is not None and stopped and item.key not in errors:  # not handed out, or not finished
                steps = _steps_on_disk(layout, pipeline, item)
                steps = {step.id: _as_stopped(steps.get(step.id, {"status": "missing"})) for step in pipeline.steps}
                done = any(status["status"] != "missing" for status in steps.values())
                summary = {"run_id": run_id, "status": "stopped" if done else "not started", "reason": "",
                           "steps": steps}
            elif item is not None:  # failed: its result never reached the journal; read its steps from disk
                steps = _steps_on_disk(layout, pipeline, item)
                progress = read_progress(layout) or {}
                failure = (errors.get(item.key) or "not run").strip()
                walked = progress.get("reason") if progress.get("state") == "failed" else None
                # the walk's reason, whole, as the runner recorded it, where this attempt's failure is that walk's
                # (it ends with the reason: a progress.json left by an earlier attempt that the runner failed
                # before rewriting does not); else (its worker killed, the runner's own error) the error's line
                fresh = isinstance(walked, str) and walked.strip() and failure.endswith(walked.strip())
                error = walked.strip() if fresh else error_line(failure)
                running = progress.get("resume_at") if progress.get("state") == "running" else None
                if isinstance(running, str) and running not in steps:  # killed with its worker (--item-timeout)
                    steps[running] = {"status": "failed", "reason": error, "attempts": 1, "ended_with_worker": True}
                # every step in the pipeline's order: those it never reached are "missing", a column each
                steps = {step.id: steps.get(step.id, {"status": "missing"}) for step in pipeline.steps}
                if stopped and progress.get("state") == "stopped":  # ended by the stop (the runner's record)
                    steps = {step: _as_stopped(status) for step, status in steps.items()}
                    summary = {"run_id": run_id, "status": "stopped", "reason": "", "steps": steps}
                else:
                    summary = {"run_id": run_id, "status": "failed", "reason": error, "steps": steps}
                    at = progress.get("resume_at")
                    if fresh and isinstance(at, str) and at in steps:  # its first unhandled failure: where a
                        summary["resume_at"] = at  # plain --resume goes on (failures handled before it it skips)
                spent = progress.get("spent")  # what its steps reported, as a finished run's summary says it
                if finite_number(spent):
                    summary.update(cost=spent, budget=pipeline.budget)
            else:  # not run now, and never finished: what an earlier run left on disk (stopped: not failed)
                steps = {step: status for step, status in
                         ((step, _as_stopped(status)) for step, status in statuses_on_disk(layout, pipeline).items())
                         if status.get("status") != "missing"}
                summary = {"run_id": run_id, "status": "unfinished" if steps else "not run",
                           "reason": "not finished in an earlier run" if steps else "", "steps": steps}
            summary["steps"] = {step: {k: v for k, v in status.items() if k != "history"}
                                for step, status in summary.get("steps", {}).items()}
            pipelines[run_id] = summary
        return pipelines

    def summary_markdown(self, summary: Mapping[str, Any]) -> str:
        return summary_markdown(summary.get("pipelines", {}))

    def headline(self, run: RunInfo, summary: Mapping[str, Any]) -> List[str]:
        return report.headline(summary.get("pipelines", {}))

    def answer(self, summary: Mapping[str, Any]) -> Optional[str]:
        return report.answer(summary.get("pipelines", {}))

    def retry_notes(self, summary: Mapping[str, Any]) -> List[str]:
        return report.over_budget(summary.get("pipelines", {}), shown_path(self.args.definition))

    # ----- worker -----
    def setup_worker(self, device: Device) -> WorkerState:
        from common.workers import worker

        gpu = device.physical if device.is_gpu else None
        gpus_here = len(self.gpus())  # GPUs, not workers: --workers-per-gpu puts several on one
        capacity = getattr(self, "gpu_capacity", 1)
        # Node-wide: always a GPU; on a node without GPU only a gpu pool sized on purpose (--resource gpu=N)
        slots = nodelock.slot_names(gpu, gpus_here, capacity) if gpu is not None or self.explicit_gpu_pool else []
        return WorkerState(gpu=gpu, acquire=worker.acquire, host=socket.gethostname().split(".")[0],
                           node_slots=slots, stop_asked=worker.stop_requested)

    def run_item(self, state: WorkerState, item: Item, seed: np.random.SeedSequence) -> Dict[str, Any]:
        run_id, start = item.params["run_id"], item.params["start"]
        # PIPELINE_SEED: from --seed and the pipeline's name, whichever step a run of it starts from
        runner = PipelineRunner(self.by_name[run_id], RunLayout(self.results, run_id), acquire=state.acquire,
                                queue_timeout=self.queue_timeout, gpu=state.gpu,
                                seed=torch_seed(item_seed(self.args.seed, run_id)),
                                agent=self.agent, node_slots=state.node_slots, stop_asked=state.stop_asked,
                                definition_dir=self.definition_dir, run_settings=self.run_settings)
        try:
            result = runner.run(start, keep_shared=item.params.get("keep_shared", False))
        except RunStopping as stopped:
            raise PipelineFailed(f"pipeline {run_id}: the run is stopping; step {stopped} did not start "
                                 "(or retry); --resume goes on from there") from None
        result["host"] = state.host
        if result["status"] != "ok":
            raise PipelineFailed(f"pipeline {run_id}: {result['reason']}")
        return result


def _fresh_key(key: str, done: Sequence[str]) -> str:
    """``key``, or ``key#N`` where the journal holds it already (a resume from the same step
    again): a key the journal holds is skipped as done."""
    earlier = [k for k in done if k == key or k.startswith(key + "#")]
    return f"{key}#{len(earlier) + 1}" if earlier else key


def _steps_on_disk(layout: RunLayout, pipeline: Pipeline, item: Item) -> Dict[str, Dict[str, Any]]:
    """The status files of the item's pipeline, those before the step a resume started from
    (kept, not run again) marked as an earlier run's."""
    start = item.params.get("start")
    kept = pipeline.step_ids[:pipeline.index(start)] if start is not None else []
    return _as_earlier(statuses_on_disk(layout, pipeline), kept)


def _as_stopped(status: Dict[str, Any]) -> Dict[str, Any]:
    """A step of a stopped run as its table shows it: one the stop kept from starting (recorded as
    failed, "not started: the run is stopping") as not reached, one it interrupted as ``stopped``
    (its status.json says failed, "interrupted: the run was stopped"): neither failed for the stop."""
    if status.get("reason") == STOPPING:
        return {"status": "missing"}
    return dict(status, status="stopped") if status.get("reason") == INTERRUPTED else status


def _as_earlier(steps: Dict[str, Dict[str, Any]], ids: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """``steps`` with those of ``ids`` marked as an earlier run's (summary.md: "(earlier run)")."""
    return {step: dict(status, previous_run=True) if step in ids else status for step, status in steps.items()}
