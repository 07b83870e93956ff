"""Pipeline definitions: read a JSON (or YAML) file and check every field before anything runs.

Every problem becomes a :class:`common.errors.UsageError` with one line that names the file,
the pipeline and the step, so the engine can print it and exit 2 without writing anything.
"""
from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import UsageError
from .loops import unbounded_cycle
from .sizes import parse_memory

NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]+")
#: pipeline names and step ids name folders: well under the file systems' 255 bytes a name
MAX_NAME_LENGTH = 100
POOL_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
ENV_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PYTHON_TARGET_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
CONDITIONS = ("prev.ok", "prev.error")
#: A step id may not name the run's shared folder.
RESERVED_STEP_IDS = ("shared",)
#: A pipeline name may not name what the engine writes beside the runs.
RESERVED_PIPELINE_NAMES = ("logs",)
IMAGE_URI = re.compile(r"^[a-z][a-z0-9+.-]*://")

FILE_FIELDS = ("pipelines",)
PIPELINE_FIELDS = ("name", "deadline_seconds", "steps")
STEP_FIELDS = ("id", "command", "python", "gpu", "resources", "timeout", "on_fail", "condition", "next",
               "max_retries", "env", "memory", "container", "mounts")
MOUNT_FIELDS = ("host_path", "container_path", "readonly")


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
    gpu: bool = False
    resources: Mapping[str, int] = field(default_factory=dict)
    timeout: Optional[float] = None
    on_fail: Optional[str] = None
    condition: Optional[str] = None
    next: Optional[str] = None
    max_retries: Optional[int] = None
    env: Mapping[str, str] = field(default_factory=dict)
    memory: Optional[int] = None
    memory_text: Optional[str] = None
    container: Optional[str] = None
    mounts: Tuple[Mount, ...] = ()

    @property
    def pools(self) -> Dict[str, int]:
        """Every pool the step holds while it runs, the GPU included."""
        pools = dict(self.resources)
        if self.gpu:
            pools["gpu"] = 1
        return pools


@dataclass(frozen=True)
class Pipeline:
    name: str
    steps: Tuple[Step, ...]
    deadline_seconds: Optional[float] = None

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

    def __init__(self, source: str, pipeline: Optional[str] = None, step: Optional[str] = None):
        self.source, self.pipeline, self.step = source, pipeline, step

    def error(self, problem: str) -> UsageError:
        parts = [self.source]
        if self.pipeline is not None:
            parts.append(f"pipeline {self.pipeline!r}")
        if self.step is not None:
            parts.append(f"step {self.step!r}")
        return UsageError(": ".join([", ".join(parts), problem]))


def _did_you_mean(name: str, choices, otherwise: str = "") -> str:
    """' (did you mean 'x'?)' for the closest of ``choices``, else ``otherwise``."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else otherwise


def _check_fields(data: Mapping[str, Any], valid: Tuple[str, ...], where: _Where, what: str) -> None:
    for name in data:
        if name not in valid:
            hint = _did_you_mean(str(name), valid, otherwise=f" (valid: {', '.join(valid)})")
            raise where.error(f"unknown field {name!r} in {what}{hint}")


def _seconds(value: Any, name: str, where: _Where) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise where.error(f"{name} must be a number of seconds, got {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an integer too large for a float
        finite = False
    if not finite:
        raise where.error(f"{name} must be a finite number of seconds, got {_short(value)}")
    if value <= 0:
        raise where.error(f"{name} must be positive, got {value!r}")
    return float(value)


def _short(value: Any, limit: int = 60) -> str:
    """``repr`` of a value, cut to one readable line (a 400-digit number stays one line)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _name(value: Any, what: str, where: _Where) -> str:
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        raise where.error(f"{what} {_short(value)} is malformed: use letters, digits, '-' and '_' only")
    if len(value) > MAX_NAME_LENGTH:  # it names a folder (and a file inside it)
        raise where.error(f"{what} {_short(value)} is longer than {MAX_NAME_LENGTH} characters")
    return value


def _resources(value: Any, where: _Where) -> Dict[str, int]:
    if value is None:
        return {}
    if isinstance(value, list):
        if not all(isinstance(name, str) for name in value):
            raise where.error(f"resources must be pool names or {{name: count}}, got {value!r}")
        if len(set(value)) != len(value):
            raise where.error(f"resources lists a pool twice: {value!r}")
        value = {name: 1 for name in value}
    if not isinstance(value, dict):
        raise where.error(f"resources must be a list of pool names or {{name: count}}, got {value!r}")
    pools = {}
    for name, count in value.items():
        if not isinstance(name, str) or not POOL_PATTERN.fullmatch(name):
            raise where.error(f"pool name {name!r} is malformed: a letter, then letters, digits, '_'")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise where.error(f"pool {name!r}: count must be a positive integer, got {count!r}")
        pools[name.lower()] = count
    if pools.get("gpu", 1) != 1:
        raise where.error("a step holds at most one GPU (resources gpu: 1, or gpu: true)")
    return pools


def _env(value: Any, where: _Where) -> Dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise where.error(f"env must be an object of NAME: value, got {value!r}")
    env = {}
    for name, text in value.items():
        if not ENV_NAME_PATTERN.fullmatch(str(name)):
            raise where.error(f"env name {name!r} is not a valid variable name")
        if isinstance(text, bool) or not isinstance(text, (str, int, float)):
            raise where.error(f"env {name}: value must be a string or a number, got {text!r}")
        if "\0" in str(text):
            raise where.error(f"env {name}: value holds a NUL character, which no environment can carry")
        env[str(name)] = str(text)
    return env


def _image(value: Any, base: Path, where: _Where) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise where.error(f"container must be the path of an image, got {value!r}")
    if IMAGE_URI.match(value):  # docker://, library://, oras://: apptainer fetches it
        return value
    path = Path(value).expanduser()
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise where.error(f"container image {value!r} does not exist (looked for {path})")
    return str(path.resolve())


def _mounts(value: Any, container: Optional[str], base: Path, where: _Where) -> Tuple[Mount, ...]:
    if value is None:
        return ()
    if container is None:
        raise where.error("mounts are given but no container")
    if not isinstance(value, list):
        raise where.error(f"mounts must be a list of {{host_path, container_path, readonly}}, got {value!r}")
    mounts = []
    for entry in value:
        if not isinstance(entry, dict):
            raise where.error(f"a mount must be an object {{host_path, container_path, readonly}}, got {entry!r}")
        _check_fields(entry, MOUNT_FIELDS, where, "a mount")
        host, inside, readonly = entry.get("host_path"), entry.get("container_path"), entry.get("readonly", False)
        if not isinstance(host, str) or not host:
            raise where.error(f"mount host_path must be a path, got {host!r}")
        if not isinstance(inside, str) or not inside.startswith("/") or ":" in inside or ":" in host:
            raise where.error(f"mount container_path must be an absolute path without ':', got {inside!r}")
        if not isinstance(readonly, bool):
            raise where.error(f"mount readonly must be true or false, got {readonly!r}")
        host_path = Path(host).expanduser()
        host_path = host_path if host_path.is_absolute() else base / host_path
        mounts.append(Mount(str(host_path), inside, readonly))
    return tuple(mounts)


def _named_object(data: Any, field: str, what: str, reserved: Tuple[str, ...], why_reserved: str,
                  where: _Where) -> str:
    """The checked name of a step or pipeline object (a dict with a valid, unreserved name)."""
    if not isinstance(data, dict):
        raise where.error(f"a {what} must be an object with {field}, got {type(data).__name__}")
    name = _name(data.get(field), f"{what} {field}", where)
    if name in reserved:
        raise where.error(f"{what} {field} {name!r} is reserved ({why_reserved})")
    return name


def _step(data: Any, base: Path, where: _Where) -> Step:
    step_id = _named_object(data, "id", "step", RESERVED_STEP_IDS, "the run's shared folder", where)
    where = _Where(where.source, where.pipeline, step_id)
    _check_fields(data, STEP_FIELDS, where, "a step")
    command, python = data.get("command"), data.get("python")
    if (command is None) == (python is None):
        raise where.error("give exactly one of 'command' (a shell command) or 'python' (module:function)")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise where.error(f"command must be a non-empty string, got {command!r}")
    if command is not None and "\0" in command:
        raise where.error("command holds a NUL character, which no shell command can carry")
    if python is not None and (not isinstance(python, str) or not PYTHON_TARGET_PATTERN.fullmatch(python)):
        raise where.error(f"python must be 'module:function', got {python!r}")
    gpu = data.get("gpu", False)
    if not isinstance(gpu, bool):
        raise where.error(f"gpu must be true or false, got {gpu!r}")
    resources = _resources(data.get("resources"), where)
    gpu = gpu or "gpu" in resources
    resources.pop("gpu", None)
    condition = data.get("condition")
    if condition is not None and condition not in CONDITIONS:
        raise where.error(f"condition must be one of {', '.join(CONDITIONS)}, got {condition!r}")
    retries = data.get("max_retries")
    if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int) or retries < 0):
        raise where.error(f"max_retries must be a whole number >= 0, got {retries!r}")
    for edge in ("on_fail", "next"):
        if data.get(edge) is not None and not isinstance(data[edge], str):
            raise where.error(f"{edge} must name a step, got {data[edge]!r}")
    memory_text = data.get("memory")
    try:
        memory = None if memory_text is None else parse_memory(memory_text)
    except ValueError as error:
        raise where.error(str(error)) from None
    container = _image(data.get("container"), base, where)
    return Step(id=step_id, command=command, python=python, gpu=gpu, resources=resources,
                timeout=_seconds(data.get("timeout"), "timeout", where), on_fail=data.get("on_fail"),
                condition=condition, next=data.get("next"), max_retries=retries, env=_env(data.get("env"), where),
                memory=memory, memory_text=None if memory_text is None else str(memory_text),
                container=container, mounts=_mounts(data.get("mounts"), container, base, where))


def _pipeline(data: Any, base: Path, where: _Where) -> Pipeline:
    name = _named_object(data, "name", "pipeline", RESERVED_PIPELINE_NAMES,
                         "the engine writes that folder in the results folder", where)
    where = _Where(where.source, name)
    _check_fields(data, PIPELINE_FIELDS, where, "a pipeline")
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise where.error("steps must be a non-empty list")
    steps = [_step(raw, base, where) for raw in raw_steps]
    seen = set()
    for step in steps:
        if step.id in seen:
            raise where.error(f"duplicate step id {step.id!r}")
        seen.add(step.id)
    for step in steps:
        for edge in ("on_fail", "next"):
            target = getattr(step, edge)
            if target is not None and target not in seen:
                hint = _did_you_mean(target, sorted(seen))
                raise _Where(where.source, name, step.id).error(f"{edge} names a missing step {target!r}{hint}")
    pipeline = Pipeline(name=name, steps=tuple(steps),
                        deadline_seconds=_seconds(data.get("deadline_seconds"), "deadline_seconds", where))
    cycle = unbounded_cycle(pipeline)
    if cycle:
        raise where.error(f"loop that can run forever: {' -> '.join(cycle + cycle[:1])}; "
                          "give one of its steps without a condition max_retries to bound it")
    return pipeline


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such pipeline definition") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"{path}: cannot read: {error}") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise UsageError(f"{path}: YAML needs PyYAML (pip install 'multinode-gpu[yaml]'), or write JSON") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise UsageError(f"{path}: not valid YAML: {' '.join(str(error).split())}") from None
        except RecursionError:
            raise UsageError(f"{path}: not valid YAML: nested too deeply") from None
    try:
        return json.loads(text)
    except ValueError as error:  # JSONDecodeError, or an integer over Python's digit limit
        raise UsageError(f"{path}: not valid JSON: {' '.join(str(error).split())}") from None
    except RecursionError:
        raise UsageError(f"{path}: not valid JSON: nested too deeply") from None


def parse_definition(data: Any, source: str = "<definition>", base: Path = Path(".")) -> List[Pipeline]:
    """Check an already-loaded definition: one pipeline, or ``{"pipelines": [...]}``."""
    where = _Where(source)
    if isinstance(data, dict) and "pipelines" in data:
        _check_fields(data, FILE_FIELDS, where, "the file (it holds 'pipelines')")
        raw = data["pipelines"]
        if not isinstance(raw, list) or not raw:
            raise where.error("pipelines must be a non-empty list")
    elif isinstance(data, dict):
        raw = [data]
    else:
        raise where.error("expected a pipeline object or {\"pipelines\": [...]}")
    pipelines = [_pipeline(entry, base, _Where(source, f"#{number + 1}" if len(raw) > 1 else None))
                 for number, entry in enumerate(raw)]
    names = set()
    for pipeline in pipelines:
        if pipeline.name in names:
            raise where.error(f"duplicate pipeline name {pipeline.name!r} (it names the run's folder)")
        names.add(pipeline.name)
    return pipelines


def load_definition(path: Path) -> List[Pipeline]:
    """Read and check a definition file; relative image and mount paths are relative to it."""
    path = Path(path)
    return parse_definition(_read(path), str(path), path.resolve().parent)


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
                    hint = _did_you_mean(pool, known)
                    raise where.error(f"unknown pool {pool!r}{hint}; define it with --resource {pool}=N "
                                      f"or PIPELINE_RESOURCE_{pool.upper()}=N (known: {', '.join(known)})")
                capacity = capacities[pool]
                if capacity is not None and count > capacity:
                    raise where.error(f"asks {count} of pool {pool!r}, which has capacity {capacity}")
