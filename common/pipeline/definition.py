"""Pipeline definitions: read a JSON (or YAML) file and check every field before anything runs.

The format is one JSON Schema (schema.py); here are what a schema cannot say: ``matrix``
expansion, steps named by ``next``/``on_fail`` exist, loops are bounded, memory sizes, image
files, commands the system can start. Every problem becomes a :class:`common.errors.UsageError`
with one line that names the file, the pipeline and the step, so the engine can print it and
exit 2 without writing anything.
"""
from __future__ import annotations

import itertools
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .. import userfile
from ..errors import UsageError, as_written, quoted
from .loops import unbounded_cycle
from .schema import (
    CONDITIONS,
    MAX_MATRIX,
    MAX_NAME_LENGTH,
    MAX_RETRIES,
    MAX_RETRY_DELAY,
    NAME,
    POOL,
    check_matrix,
    did_you_mean,
    first_error,
)
from .sizes import parse_memory

__all__ = ["CONDITIONS", "MAX_NAME_LENGTH", "MAX_RETRIES", "Mount", "Pipeline", "Step", "check_pools",
           "load_definition", "parse_definition", "resolve_image"]

POOL_PATTERN = re.compile(POOL[1:-1])
NAME_PATTERN = re.compile(NAME[1:-1])
IMAGE_URI = re.compile(r"^[a-z][a-z0-9+.-]*://")
#: Linux's MAX_ARG_STRLEN (32 pages): the longest single argument or NAME=value, its NUL included
MAX_ARG_STRLEN = 32 * 4096
MATRIX_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: where the pipeline's shared folder is bound inside a container (as well as at its own path)
SHARED_IN_CONTAINER = "/shared"
#: the one step of a par() task's pipeline: RESULTS/TASK/task/output.md
TASK_STEP = "task"
#: the ways to give steps with mounts an image, named when none is given
IMAGE_WAYS = "pass --container IMAGE, or set PIPELINE_CONTAINER"
#: /shared as a path of its own: the format's file-passing folder, which only a container binds to the
#: pipeline's own RUN_ID/shared. Not the end of another path (x/shared, ~/shared, $HOME/shared,
#: "$DIR"/shared, $(pwd)/shared, `pwd`/shared, host:/shared), nor /shared.old or /shared-data; quoted
#: or in a Markdown code span (`/shared/x`, ``/shared/x``), it is
SHARED_PATH = re.compile(r"(?<![\w.~$}/):-])(?<![^\s=:(\[{,`][\"'`])/shared(?![\w-]|\.\w)")


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    readonly: bool = False


@dataclass(frozen=True)
class Step:
    """One step as written, checked; ``memory`` in bytes, ``resources`` as {pool: count}."""

    id: str
    command: Optional[str] = None
    python: Optional[str] = None
    prompt: Optional[str] = None
    model: Optional[str] = None
    tools: Tuple[str, ...] = ()
    gpu: bool = False
    resources: Mapping[str, int] = field(default_factory=dict)
    timeout: Optional[float] = None
    on_fail: Optional[str] = None
    condition: Optional[str] = None
    next: Optional[str] = None
    max_retries: Optional[int] = None
    retry_delay: float = 0.0
    env: Mapping[str, str] = field(default_factory=dict)
    memory: Optional[int] = None
    memory_text: Optional[str] = None
    container: Optional[str] = None
    mounts: Tuple[Mount, ...] = ()

    @property
    def kind(self) -> str:
        """'command', 'python' or 'prompt'."""
        return "command" if self.command is not None else "python" if self.python is not None else "prompt"

    @property
    def pools(self) -> Dict[str, int]:
        """Every pool the step holds while it runs, the GPU included."""
        pools = dict(self.resources)
        if self.gpu:
            pools["gpu"] = 1
        return pools

    def retry_wait(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1, 2, ...): ``retry_delay``, doubled each time."""
        return min(self.retry_delay * 2.0 ** min(retry - 1, 64), float(MAX_RETRY_DELAY))


@dataclass(frozen=True)
class Pipeline:
    name: str
    steps: Tuple[Step, ...]
    deadline_seconds: Optional[float] = None
    budget: Optional[float] = None
    matrix: Mapping[str, str] = field(default_factory=dict)  # this pipeline's values, when expanded from one

    def index(self, step_id: str) -> int:
        for position, step in enumerate(self.steps):
            if step.id == step_id:
                return position
        raise KeyError(step_id)

    @property
    def step_ids(self) -> List[str]:
        return [step.id for step in self.steps]


class _Where:
    """Builds the one-line message: 'FILE: pipeline 'p', step 's': problem'."""

    def __init__(self, source: str, pipeline: Optional[str] = None, step: Optional[str] = None, task: bool = False):
        self.source, self.pipeline, self.step, self.task = source, pipeline, step, task

    def error(self, problem: str) -> UsageError:
        parts = [self.source]
        if self.task:  # a par() task: a pipeline of one step, named by the task alone ('task-1', or #1)
            parts.append(f"task {self.pipeline}" if str(self.pipeline).startswith("#") else f"task {self.pipeline!r}")
        elif self.pipeline is not None:
            parts.append(f"pipeline {self.pipeline!r}")
        if self.step is not None and not self.task:
            parts.append(f"step {self.step!r}")
        return UsageError(": ".join([", ".join(parts), problem]))


def _valid_name(value: Any) -> Optional[str]:
    return value if isinstance(value, str) and NAME_PATTERN.fullmatch(value) and len(value) <= MAX_NAME_LENGTH else None


# ----- matrix -----
def _slug(value: Any) -> str:
    """A matrix value as it may appear in a name: 0.02 -> '0_02'."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", _text(value))


def _text(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _substitute(value: Any, values: Mapping[str, Any], in_name: bool = False) -> Any:
    """``${name}`` of the matrix replaced in a string (other ``${...}``, such as shell variables, kept)."""
    if not isinstance(value, str):
        return value
    convert = _slug if in_name else _text
    return MATRIX_REFERENCE.sub(lambda m: convert(values[m.group(1)]) if m.group(1) in values else m.group(0), value)


def _expand_matrix(raw: Any, where: _Where) -> List[Tuple[Any, Dict[str, str]]]:
    """One pipeline per combination of its ``matrix`` values, ``${name}`` substituted in its name,
    step ids, ``next``/``on_fail``, commands, prompts, models, tools and env values."""
    if not isinstance(raw, dict) or "matrix" not in raw:
        return [(raw, {})]
    matrix = raw["matrix"]
    problem = check_matrix(matrix)
    if problem:
        raise where.error(problem)
    count = math.prod(len(values) for values in matrix.values())
    if count > MAX_MATRIX:
        raise where.error(f"matrix makes {count:,} pipelines, more than {MAX_MATRIX}")
    names = list(matrix)
    expanded = []
    for combination in itertools.product(*matrix.values()):
        values = dict(zip(names, combination))
        copy = {key: value for key, value in raw.items() if key != "matrix"}
        name = raw.get("name")
        if isinstance(name, str):
            copy["name"] = (_substitute(name, values, in_name=True) if MATRIX_REFERENCE.search(name) else
                            "-".join([name] + [f"{key}{_slug(value)}" for key, value in values.items()]))
        if isinstance(raw.get("steps"), list):
            copy["steps"] = [_substitute_step(step, values) for step in raw["steps"]]
        if "container" in raw:
            copy["container"] = _substitute(raw["container"], values)
        expanded.append((copy, {key: _text(value) for key, value in values.items()}))
    return expanded


def _substitute_step(step: Any, values: Mapping[str, Any]) -> Any:
    if not isinstance(step, dict):
        return step
    step = dict(step)
    for key in ("id", "next", "on_fail", "command", "prompt", "model", "container", "tools"):
        if key in step:
            step[key] = _substitute(step[key], values, in_name=key in ("id", "next", "on_fail"))
    if isinstance(step.get("tools"), list):
        step["tools"] = [_substitute(tool, values) for tool in step["tools"]]
    if isinstance(step.get("env"), dict):
        step["env"] = {name: _substitute(text, values) for name, text in step["env"].items()}
    return step


# ----- one step -----
def _argument_limits(command: Optional[str], env: Mapping[str, str], where: _Where) -> None:
    """A command or variable longer than the kernel takes would fail only when the step starts."""
    for what, text in ([("command", command)] if command else []) + [(f"env {k}", f"{k}={v}") for k, v in env.items()]:
        size = len(text.encode("utf-8", "surrogatepass")) + 1
        if size > MAX_ARG_STRLEN:
            raise where.error(f"{what} is {size - 1:,} bytes; the system passes at most {MAX_ARG_STRLEN - 1:,} bytes "
                              "in one argument or variable (write it to a script, or a file the step reads)")
    total = sum(len(text.encode("utf-8", "surrogatepass")) + 1 for text in [command or ""] +
                [f"{k}={v}" for k, v in env.items()])
    room = os.sysconf("SC_ARG_MAX") - sum(len(k) + len(v) + 2 for k, v in os.environ.items()) - 8192
    if total > room:
        raise where.error(f"command and env take {total:,} bytes, more than the system's limit on a command line "
                          f"and its environment leaves ({room:,} bytes with this environment)")


def _number(data: Mapping[str, Any], name: str, where: _Where, default: Optional[float] = None) -> Optional[float]:
    """A number the schema accepted, refused if NaN (which passes every comparison)."""
    value = data.get(name)
    if value is None:
        return default
    if not math.isfinite(value):
        raise where.error(f"{name} must be a finite number, got {as_written(value)}")
    return float(value)


def _integer(value: Any) -> Optional[int]:
    """A count the schema accepted as an integer, which JSON Schema says 2.0 is: kept as 2."""
    return None if value is None else int(value)


def _resources(value: Any, where: _Where) -> Dict[str, int]:
    if value is None:
        return {}
    pools: Dict[str, int] = {}
    for name, count in ({name: 1 for name in value} if isinstance(value, list) else value).items():
        if name.lower() in pools:
            raise where.error(f"resources name pool {name.lower()!r} twice (pool names ignore case)")
        pools[name.lower()] = int(count)  # JSON Schema's integers include 2.0
    if pools.get("gpu", 1) != 1:
        raise where.error("a step holds at most one GPU (resources gpu: 1, or gpu: true)")
    return pools


def _env(value: Any, where: _Where) -> Dict[str, str]:
    env = {}
    for name, text in (value or {}).items():
        if "\0" in str(text):
            raise where.error(f"env {name}: value holds a NUL character, which no environment can carry")
        env[name] = _text(text)
    return env


def resolve_image(value: str, base: Path) -> str:
    """An image as apptainer takes it: a URI as it is, a file as an absolute path (relative to
    ``base``). Raises ValueError, saying where it looked, when the file does not exist."""
    if IMAGE_URI.match(value):  # docker://, library://, oras://: apptainer fetches it
        return value
    path = Path(value).expanduser()
    path = path if path.is_absolute() else base / path
    try:
        found = path.is_file()
    except OSError as error:  # a name over the file system's limit, a folder we may not look into
        raise ValueError(f"container image {as_written(value)}: cannot look for it ({error.strerror or error})") from None
    if not found:
        raise ValueError(f"container image {as_written(value)} does not exist (looked for {as_written(str(path), 200)})")
    return str(path.resolve())


def _image(value: Optional[str], base: Path, where: _Where) -> Optional[str]:
    if value is None:
        return None
    try:
        return resolve_image(value, base)
    except ValueError as error:
        raise where.error(str(error)) from None


#: what apptainer's --bind reads as separators (SRC:DST:OPTS, and a comma before the next bind)
BIND_SEPARATORS = ":,"


def breaks_bind(path: str) -> bool:
    """Whether ``path`` holds a --bind separator, so that it cannot be bound as it is."""
    return any(separator in path for separator in BIND_SEPARATORS)


def _mounts(value: Any, base: Path, where: _Where) -> Tuple[Mount, ...]:
    mounts: List[Mount] = []
    for entry in value or ():
        host, inside = entry["host_path"], entry["container_path"]
        for what, path in (("host_path", host), ("container_path", inside)):
            if breaks_bind(path):
                raise where.error(f"mount {what} must be a path without ':' or ',' (apptainer's --bind separators), "
                                  f"got {as_written(path)}")
        normal = os.path.normpath(inside)
        normal = "/" + normal.lstrip("/") if normal.startswith("/") else normal  # POSIX keeps "//shared" apart
        if normal == SHARED_IN_CONTAINER or normal.startswith(SHARED_IN_CONTAINER + "/"):
            raise where.error(f"mount container_path {as_written(inside)}: {SHARED_IN_CONTAINER} is where the pipeline's "
                              "shared folder is bound; mount elsewhere")
        if any(os.path.normpath(m.container_path) == normal for m in mounts):
            raise where.error(f"two mounts at container_path {as_written(inside)}")
        host_path = Path(host).expanduser()
        host_path = host_path if host_path.is_absolute() else base / host_path
        if breaks_bind(str(host_path)):  # from the definition's folder or the home folder
            raise where.error(f"mount host_path {as_written(host)} is {as_written(str(host_path))}, whose ':' or ',' apptainer's "
                              f"--bind would read as separators; move the folder or give another path")
        mounts.append(Mount(str(host_path), inside, entry.get("readonly", False)))
    return tuple(mounts)


def _tools(value: Any, where: _Where) -> Tuple[str, ...]:
    """A list of tool names or one comma-separated string of them (as the format's document
    writes them, ``"Read,Write,Bash"``), names trimmed; the schema refused empty names."""
    names = [name.strip() for name in (value.split(",") if isinstance(value, str) else value or ())]
    for number, name in enumerate(names):
        if name in names[:number]:
            raise where.error(f"tools lists {as_written(name)} twice")
    return tuple(names)


def _step(data: Dict[str, Any], base: Path, where: _Where, default_image: Optional[str] = None) -> Step:
    """A step the schema accepted, with what the schema cannot check; ``default_image`` (already
    resolved) is the image of a step that names none."""
    where = _Where(where.source, where.pipeline, data["id"], where.task)
    command, python, prompt = data.get("command"), data.get("python"), data.get("prompt")
    for what, text in (("command", command), ("prompt", prompt)):
        if text is not None and "\0" in text:
            raise where.error(f"{what} holds a NUL character, which no shell command can carry")
    env = _env(data.get("env"), where)
    _argument_limits(command, env, where)
    resources = _resources(data.get("resources"), where)
    if data.get("gpu") is False and "gpu" in resources:  # the format's "logical resource" is not a GPU here
        raise where.error("gpu: false with resources [\"gpu\"]: the gpu pool gives a step a GPU here; for a "
                          "resource that is not the GPU, name a pool of its own (resources: [\"licence\"])")
    gpu = data.get("gpu", False) or "gpu" in resources
    resources.pop("gpu", None)
    memory_text = data.get("memory")
    try:
        memory = None if memory_text is None else parse_memory(memory_text)
    except ValueError as error:
        raise where.error(str(error)) from None
    container = _image(data.get("container"), base, where) or default_image
    owners = "the task or the file" if where.task else "the step, its pipeline or the file"
    if "mounts" in data and container is None:
        raise where.error(f"mounts need a container image and none is given: give {owners} a \"container\", "
                          f"{IMAGE_WAYS}")
    # the format's prompts name /shared, which only a container binds to the pipeline's own folder: on the
    # node it is the node's, every run's and pipeline's. Commands and python steps (this runner's own) are
    # given $PIPELINE_SHARED, and a /shared there may be the cluster's own file system, or inside their
    # own container: not checked.
    if prompt and container is None and SHARED_PATH.search(prompt):
        raise where.error(f"its prompt names /shared, which is this pipeline's shared folder only in a container, "
                          f"and no container image is given: give {owners} a \"container\", {IMAGE_WAYS}; or, to "
                          f"run it on the node, have the prompt say \"the shared folder\" without a path (the "
                          f"agent command is given its path as $PIPELINE_SHARED)")
    return Step(id=data["id"], command=command, python=python, prompt=prompt, model=data.get("model"),
                tools=_tools(data.get("tools"), where), gpu=gpu, resources=resources,
                timeout=_number(data, "timeout", where), on_fail=data.get("on_fail"),
                condition=data.get("condition"), next=data.get("next"), max_retries=_integer(data.get("max_retries")),
                retry_delay=_number(data, "retry_delay", where, 0.0), env=env, memory=memory,
                memory_text=None if memory_text is None else str(memory_text),
                container=container, mounts=_mounts(data.get("mounts"), base, where))


def _pipeline(data: Any, base: Path, where: _Where, matrix: Dict[str, str],
              default_image: Optional[str] = None) -> Pipeline:
    name = _valid_name(data.get("name")) if isinstance(data, dict) else None
    if name is not None:
        where = _Where(where.source, name)
    found = first_error("pipeline", data)
    if found is not None:
        path, problem = found
        step_where = where
        if len(path) >= 2 and path[0] == "steps":
            raw_step = data["steps"][path[1]]
            step_id = _valid_name(raw_step.get("id")) if isinstance(raw_step, dict) else None
            step_where = _Where(where.source, where.pipeline, step_id)
        raise step_where.error(problem)
    image = _image(data.get("container"), base, where) or default_image
    steps = [_step(raw, base, where, image) for raw in data["steps"]]
    seen = set()
    for step in steps:
        if step.id in seen:
            raise where.error(f"duplicate step id {step.id!r}")
        seen.add(step.id)
    for step in steps:
        for edge in ("on_fail", "next"):
            target = getattr(step, edge)
            if target is not None and target not in seen:
                hint = did_you_mean(target, sorted(seen))
                raise _Where(where.source, name, step.id).error(f"{edge} names a missing step {as_written(target)}{hint}")
    by_id = {step.id: step for step in steps}
    for step in steps:  # the walk reaches an on_fail just after a failure: prev.ok never holds there
        if step.on_fail is not None and by_id[step.on_fail].condition == "prev.ok":
            raise _Where(where.source, name, step.id).error(
                f"on_fail names step {step.on_fail!r}, whose condition prev.ok never holds after a failure, so "
                f"nothing would handle this one: drop that condition or give on_fail another step")
    pipeline = Pipeline(name=name, steps=tuple(steps), deadline_seconds=_number(data, "deadline_seconds", where),
                        budget=_number(data, "budget", where), matrix=matrix)
    cycle = unbounded_cycle(pipeline)
    if cycle:
        raise where.error(f"loop that can run forever: {' -> '.join(cycle + cycle[:1])}; "
                          "bound it with max_retries on one of its steps that has no condition (a step with a "
                          "condition can be skipped on every lap)")
    return pipeline


# ----- files -----
def shown_path(path: object) -> str:
    """A path for the start of a one-line message: as it is, or quoted (newlines and other control
    characters escaped) where it holds any."""
    text = str(path)
    return text if text.isprintable() else quoted(text)


#: the most a definition file may hold (a 200,000-step file is about 10 MB): past it, the file is
#: something else (``/dev/zero`` would fill the memory)
MAX_DEFINITION_BYTES = 64 << 20


def _check_text(data: Any, source: str) -> None:
    """Every string can be written as UTF-8: JSON's ``"\\ud800"`` escapes make lone surrogates, which
    pass every other check and then fail the step that passes them to its program or agent. Each
    list and mapping is looked at once: YAML aliases name one object many times."""
    pending, seen = [data], set()
    while pending:
        value = pending.pop()
        if isinstance(value, (dict, list)):
            if id(value) in seen:  # YAML's aliases share one object, however often it is named
                continue
            seen.add(id(value))
            pending.extend([*value.keys(), *value.values()] if isinstance(value, dict) else value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                around = value[max(0, error.start - 30):error.start + 30]
                raise UsageError(f"{source}: the text {quoted(around)} holds a lone surrogate (an escape such as "
                                 f"\\ud800 that is no character): write the character itself") from None


def _read(path: Path) -> Any:
    shown = shown_path(path)
    try:
        text = userfile.read_text(path, MAX_DEFINITION_BYTES, shown, "a pipeline definition")
    except FileNotFoundError:
        raise UsageError(f"{shown}: no such pipeline definition") from None
    except OSError as error:
        raise UsageError(f"{shown}: cannot read: {error}") from None
    try:
        return userfile.parse(text, path, shown)
    except UsageError as error:
        if re.match(r"\s*(pipeline|par)\s*\(", text):  # the format document's call, pasted whole
            raise UsageError(f"{error} (this is a pipeline(...) or par(...) call: keep only the JSON between "
                             "its quotes)") from None
        raise


def _file_image(data: Mapping[str, Any], base: Path, where: _Where, default_image: Optional[str]) -> Optional[str]:
    """The ``container`` of a whole file (its pipelines' or tasks' default image), else ``default_image``."""
    if "container" not in data:
        return default_image
    found = first_error("image", {"container": data["container"]})
    if found is not None:
        raise where.error(found[1])
    return _image(data["container"], base, where)


def _task_name(task: Any, number: int, count: int) -> str:
    """A task's pipeline name: its ``id``, else task-N (N zero-padded so that the folders sort)."""
    given = _valid_name(task.get("id")) if isinstance(task, dict) else None
    return given or f"task-{number:0{len(str(count))}d}"


def _tasks(data: Any, where: _Where, base: Path, default_image: Optional[str]) -> List[Pipeline]:
    """A par() file: a list of tasks, or ``{"tasks": [...]}``; each task runs as a pipeline of one
    step, ``task``, named by the task's ``id`` or task-N."""
    if isinstance(data, dict):
        extra = [key for key in data if key not in ("tasks", "container")]
        if extra:
            raise where.error(f"unknown field {as_written(extra[0])} in the file (it holds 'tasks')"
                              f"{did_you_mean(str(extra[0]), ['tasks', 'container'])}")
        default_image = _file_image(data, base, where, default_image)
        data = data["tasks"]
    if not isinstance(data, list) or not data:
        raise where.error("tasks must be a non-empty list")
    if len(data) > MAX_MATRIX:
        raise where.error(f"the file holds {len(data):,} tasks, more than {MAX_MATRIX}")
    pipelines = []
    for number, task in enumerate(data, 1):
        name = _task_name(task, number, len(data))
        task_where = _Where(where.source, name, task=True)
        if not isinstance(task, dict):
            raise _Where(where.source, f"#{number}", task=True).error(f"a task must be an object, got {as_written(task)}")
        found = first_error("task", task)
        if found is not None:
            raise (task_where if _valid_name(task.get("id")) or "id" not in task else
                   _Where(where.source, f"#{number}", task=True)).error(found[1])
        step = {key: value for key, value in task.items() if key != "id"}
        step["id"] = TASK_STEP
        pipelines.append(Pipeline(name=name, steps=(_step(step, base, task_where, default_image),)))
    return pipelines


def parse_definition(data: Any, source: str = "<definition>", base: Path = Path("."),
                     default_image: Optional[str] = None) -> List[Pipeline]:
    """Check an already-loaded definition: one pipeline, ``{"pipelines": [...]}``, or a par() list
    of tasks (``[...]`` or ``{"tasks": [...]}``). ``default_image`` (resolved) is the image of the
    steps whose definition names none (``--container``, ``PIPELINE_CONTAINER``)."""
    where = _Where(source)
    _check_text(data, source)
    if isinstance(data, list) or (isinstance(data, dict) and "tasks" in data and "steps" not in data):
        pipelines = _tasks(data, where, base, default_image)
        raw = []
    elif isinstance(data, dict) and "pipelines" in data:
        raw = data["pipelines"]
        extra = [key for key in data if key not in ("pipelines", "container")]
        if extra:
            raise where.error(f"unknown field {as_written(extra[0])} in the file (it holds 'pipelines')"
                              f"{did_you_mean(str(extra[0]), ['pipelines', 'container'])}")
        if not isinstance(raw, list) or not raw:
            raise where.error("pipelines must be a non-empty list")
        default_image = _file_image(data, base, where, default_image)
        pipelines = []
    elif isinstance(data, dict):
        raw, pipelines = [data], []
    else:
        raise where.error("expected a pipeline object, {\"pipelines\": [...]}, or a list of tasks (par)")
    for number, entry in enumerate(raw):
        entry_where = _Where(source, f"#{number + 1}" if len(raw) > 1 else None)
        for expanded, values in _expand_matrix(entry, entry_where):
            pipelines.append(_pipeline(expanded, base, entry_where, values, default_image))
        if len(pipelines) > MAX_MATRIX:
            raise where.error(f"the file makes more than {MAX_MATRIX} pipelines")
    names = set()
    for pipeline in pipelines:
        if pipeline.name in names:
            raise where.error(f"duplicate pipeline name {pipeline.name!r} (it names the run's folder)")
        names.add(pipeline.name)
    return pipelines


def load_definition(path: Path, default_image: Optional[str] = None) -> List[Pipeline]:
    """Read and check a definition file; relative image and mount paths are relative to it."""
    path = Path(path)
    return parse_definition(_read(path), shown_path(path), path.resolve().parent, default_image)


def check_pools(pipelines: List[Pipeline], capacities: Mapping[str, Optional[int]], source: str) -> None:
    """Every pool a step names must exist, and its count must fit in the pool.

    ``capacities`` maps each known pool to its capacity, or ``None`` where it is only known
    on each node (the GPU pool).
    """
    for pipeline in pipelines:
        for step in pipeline.steps:
            for pool, count in step.resources.items():
                where = _Where(source, pipeline.name, step.id)
                if pool not in capacities:
                    known = sorted(capacities)
                    hint = did_you_mean(pool, known)
                    raise where.error(f"unknown pool {pool!r}{hint}; define it with --resource {pool}=N, "
                                      f"PIPELINE_RESOURCE_{pool.upper()}=N or the format document's SWARM_RESOURCE_{pool}=N "
                                      f"(known: {', '.join(known)})")
                capacity = capacities[pool]
                if capacity is not None and count > capacity:
                    raise where.error(f"asks {count} of pool {pool!r}, which has capacity {capacity}")
