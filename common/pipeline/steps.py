"""Running one attempt of a step: a subprocess in its own session, in the step's folder, watched
for time and memory.

Time (``timeout``) counts from the moment the process starts, which is after the step's pools
are held, so waiting in a queue never eats into it. Memory is the resident size of all the
step's processes together, read from /proc a few times a second. Either limit, or the
pipeline's deadline, ends every process of the step (SIGTERM, then SIGKILL).

When the engine stops a busy worker (SIGUSR2, raised here as an exception; SIGKILL 10 s later)
the step is ended the same way within ``PIPELINE_KILL_GRACE`` (5 s), so its status is written
before the worker goes. A step dies with SIGKILL if its worker dies first: the worker's child is
a guard (:mod:`common.pipeline.guard`) that is told of the worker's death (PR_SET_PDEATHSIG) and
kills the step's whole process group, the program a shell forked included.
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from common.errors import error_line
from common.linux import die_with_parent
from common.results.layout import STEP_STDERR, STEP_STDOUT
from common.results.regular_file import refuse_unless_regular

from .. import settings
from ..settings import without_launcher
from ..signals import STEP_HELD_SIGNALS, WALLTIME_SIGNAL, held_signals
from . import proctree, variables
from .container import container_command
from .definition import Step
from .sizes import format_bytes

#: seconds between SIGTERM and SIGKILL where no run gave its PIPELINE_KILL_GRACE
KILL_GRACE = settings.DEFAULTS.kill_grace


POLL_SECONDS = 0.05
MEMORY_POLL_SECONDS = 0.2
#: The folder holding the ``common`` package: python steps import the same code as the engine.
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
#: The program that runs each step's own (:mod:`common.pipeline.guard`), run as a file: it imports nothing of ours.
GUARD = str(Path(__file__).resolve().with_name("guard.py"))


@dataclass
class Attempt:
    """How one run of a step ended. Times are seconds since the epoch."""

    status: str  # "ok", "failed" or "timeout"
    exit_code: Optional[int]
    started: float
    ended: float
    reason: str = ""
    max_rss_bytes: Optional[int] = None  # the peak sampled (memory limit set); None: no sample saw the step
    stdout_offset: int = 0  # where this attempt's output starts in stdout.log
    cost: float = 0.0  # what the step reported on its standard output (COST_KEY lines)

    def as_dict(self) -> Dict[str, object]:
        return asdict(self)


def inner_command(step: Step, in_container: bool = False, agent: Optional[str] = None) -> List[str]:
    """The program and arguments of the step itself (before any container wrapping); a prompt
    step runs the agent command, which reads the prompt on its standard input."""
    if step.command is not None:
        return ["/bin/sh", "-c", step.command]
    if step.prompt is not None:
        if not agent:
            raise ValueError("no agent command to run the prompt (--agent 'CMD' or PIPELINE_AGENT)")
        return ["/bin/sh", "-c", agent]
    python = "python3" if in_container else sys.executable
    return [python, "-m", "common.pipeline.call", step.python]


def step_argv(step: Step, run_dir: str, apptainer: Optional[str], agent: Optional[str] = None,
              code: Sequence[str] = ()) -> List[str]:
    """The step's command line; in its container, ``code`` (a python step's import path:
    :func:`python_paths`) is bound at its own path, so the step imports there what it would on
    the node."""
    if step.container is None:
        return inner_command(step, agent=agent)
    return container_command(step, inner_command(step, in_container=True, agent=agent), run_dir,
                             apptainer or "apptainer", code=code if step.python is not None else ())


def python_paths(pipeline_vars: Mapping[str, str]) -> List[str]:
    """Where a python step's modules are found: the engine's code (its ``common.pipeline.call``
    runs the function), the definition file's folder and the folder the pipeline was started from."""
    paths = [PROJECT_ROOT, pipeline_vars.get(variables.DEFINITION_DIR), pipeline_vars.get(variables.LAUNCH_DIR)]
    return list(dict.fromkeys(path for path in paths if path))


def step_environment(base: Mapping[str, str], pipeline_vars: Mapping[str, str], step: Step,
                     gpu: Optional[str]) -> Dict[str, str]:
    """The worker's environment without launcher variables, the PIPELINE_* variables, the GPU
    (or none), a prompt step's model and tools, then the step's own ``env`` ($PIPELINE_* in its
    values expanded)."""
    env = without_launcher(base)  # a step may start an MPI job of its own
    env.update(pipeline_vars)
    env["CUDA_VISIBLE_DEVICES"] = gpu if gpu is not None else ""
    if step.prompt is not None:
        env[variables.MODEL] = step.model or ""
        env[variables.TOOLS] = ",".join(step.tools)
    if step.python is not None:  # in a container too, where step_argv binds these folders
        env["PYTHONPATH"] = os.pathsep.join(python_paths(pipeline_vars) + [p for p in [env.get("PYTHONPATH")] if p])
    for name, value in step.env.items():
        env[name] = expand(value, pipeline_vars)
    return env


def expand(value: str, variables: Mapping[str, str]) -> str:
    """``value`` with ``$NAME`` and ``${NAME}`` of ``variables`` replaced, whole names only and in one
    pass: ``$PIPELINE_NAMES`` is not ``$PIPELINE_NAME`` and an "S", and a value that holds a ``$``
    is not expanded again. Other names are left as written (the shell of a command sees them)."""
    def replace(match: "re.Match[str]") -> str:
        name = match.group(1) or match.group(2)
        return variables.get(name, match.group(0))

    return _VARIABLE.sub(replace, value)


#: ``${NAME}`` or ``$NAME`` (the longest name: what a shell would read)
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def guarded(argv: Sequence[str]) -> List[str]:
    """``argv`` under the guard that ends the step's processes with this worker (see its module)."""
    return [sys.executable, "-I", "-S", GUARD, str(os.getpid()), *argv]


def _die_with_worker() -> None:
    """In the child: SIGKILL it if the worker that started it dies (it is in its own session).

    Slurm passes the walltime warning (USR1) to every process of the job step, steps included;
    by default it would kill the step at once. Ignored, the step runs on through the run's --grace
    (a program that wants the warning, to checkpoint, installs its own handler); the run ends a
    step that must stop with TERM, then KILL."""
    die_with_parent(signal.SIGKILL)
    signal.signal(WALLTIME_SIGNAL, signal.SIG_IGN)


def _open_log(path: Path, attempt: int):
    """The log, appended to: a retry, a resume or a later run never overwrites an earlier attempt's.
    Opened without waiting, and refused unless a regular file: a FIFO another step left in its
    place would block the open for ever (a step's timeout starts only once it runs)."""
    try:
        mode: Optional[int] = os.stat(path).st_mode
    except OSError:  # not there yet
        mode = None
    if mode is not None and not stat.S_ISCHR(mode):
        refuse_unless_regular(path, "a step's log", mode)  # a FIFO without a reader: said, not ENXIO
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY, 0o666)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISCHR(mode):  # a device (/dev/null) takes what is written without waiting
            refuse_unless_regular(path, "a step's log", mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    handle = open(fd, "ab")
    if handle.tell() > 0:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        handle.write(f"\n----- attempt {attempt} ({stamp}) -----\n".encode())
        handle.flush()
    return handle


#: how much of the end of an attempt's stderr is read for its last line
STDERR_TAIL_BYTES = 4096
#: a terminal's colour and cursor sequences, and the other control characters (a tab aside) and a
#: character cut in two at the tail's start: none belongs in a reason, summary.md or a terminal line
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ufffd]")


def last_line(path: Path, offset: int) -> str:
    """The last non-empty line written to ``path`` after ``offset`` (this attempt's part of the
    log), at most MAX_LINE_CHARS; "" for none."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(offset, size - STDERR_TAIL_BYTES))
            tail = handle.read(STDERR_TAIL_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line for line in (_CONTROL.sub("", _ANSI.sub("", line)).strip() for line in tail.splitlines()) if line]
    return error_line(lines[-1]) if lines else ""


def run_attempt(argv: Sequence[str], *, env: Mapping[str, str], step_dir: Path, attempt: int = 1,
                timeout: Optional[float] = None, memory: Optional[int] = None,
                stop_at: Optional[float] = None, stdin: Optional[Path] = None,
                kill_grace: float = KILL_GRACE) -> Attempt:
    """Run ``argv`` once in ``step_dir``, with stdout/stderr appended to the step's logs (and
    ``stdin`` as its standard input); end it on a limit, ``kill_grace`` seconds between SIGTERM and
    SIGKILL (time to flush a checkpoint: the run's ``PIPELINE_KILL_GRACE``).

    ``stop_at`` is a ``time.monotonic()`` instant (the pipeline's deadline).
    """
    step_dir.mkdir(parents=True, exist_ok=True)
    proctree.become_subreaper()  # orphans of the step (setsid and a double fork) become our children
    with _open_log(step_dir / STEP_STDOUT, attempt) as out, _open_log(step_dir / STEP_STDERR, attempt) as err, \
            (open(stdin, "rb") if stdin is not None else open(os.devnull, "rb")) as given:
        offset, err_offset = out.tell(), err.tell()
        started, clock = time.time(), time.monotonic()
        try:
            if shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:  # as Popen would say
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
            process = subprocess.Popen(guarded(argv), stdin=given, stdout=out, stderr=err, env=dict(env), cwd=step_dir,
                                       start_new_session=True, preexec_fn=_die_with_worker)
        except OSError as error:
            err.write(f"cannot start {argv[0]}: {error}\n".encode())
            return Attempt("failed", None, started, time.time(), f"cannot start: {error}", stdout_offset=offset)
        since = proctree.start_time(process.pid) or started
        status, reason, next_memory_check = None, "", clock
        peak: Optional[int] = None
        ending_since: Optional[float] = None  # when SIGTERM went out
        try:
            while process.poll() is None:
                now = time.monotonic()
                if timeout is not None and now - clock > timeout:
                    status, reason = "timeout", f"timeout after {timeout:g} s"
                elif stop_at is not None and now > stop_at:
                    status, reason = "timeout", "pipeline deadline passed"
                elif memory is not None and now >= next_memory_check:
                    next_memory_check = now + MEMORY_POLL_SECONDS
                    resident = proctree.resident_bytes(process.pid, since, count_root=False)  # not the guard
                    if resident:  # 0: the step's own processes not started yet, or already gone
                        peak = max(peak or 0, resident)
                    if resident > memory:
                        status = "failed"
                        reason = f"memory limit {format_bytes(memory)} exceeded ({format_bytes(resident)} resident)"
                if status is not None:
                    ending_since = time.monotonic()
                    proctree.end_tree(process.pid, kill_grace, since)
                    break
                time.sleep(POLL_SECONDS)
            code = process.wait()
            ended = time.time()
            # Whatever the step left running in the background goes with it.
            proctree.end_tree(process.pid, 1.0, since)
        except BaseException:
            # The worker is being stopped (or failed): end the step within the grace, stop
            # signals held back, so the caller can still write its status before the worker goes.
            with held_signals(STEP_HELD_SIGNALS):
                spent = 0.0 if ending_since is None else time.monotonic() - ending_since
                proctree.end_tree(process.pid, max(0.5, kill_grace - spent), since)
                if process.poll() is None:
                    process.kill()
                process.wait()
            raise
    if status is None:
        if code == 0:
            status = "ok"
        else:
            status = "failed"
            reason = (f"killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
                      else f"exit code {code}")
    if status != "ok":
        said = last_line(step_dir / STEP_STDERR, err_offset)
        if said:  # what the program said last (apptainer's "FATAL: ...", a traceback's error)
            reason += f" (stderr: {said})"
    return Attempt(status, code, started, ended, reason, peak, stdout_offset=offset)
