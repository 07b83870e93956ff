"""What a batch job asks for, checked before any script is written.

A :class:`JobSpec` holds the resources (nodes, GPUs, walltime) and the program to run; every
bad combination is a :class:`~common.errors.UsageError` with one line that says what to fix.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, fields
from pathlib import PurePosixPath
from typing import List, Optional, Tuple

from ..errors import UsageError

MPI_PLUGINS = ("pmi2", "pmix")
#: more nodes than any cluster has: a typo (the largest GPU machines have about 10,000)
MAX_NODES = 100_000
#: more GPUs per node, ranks per node or CPUs per rank than any node has
MAX_PER_NODE = {"--gpus-per-node": 256, "--ntasks-per-node": 4096, "--cpus-per-task": 16384}
#: Slurm's six walltime forms (sbatch(1), --time), each with the parts it gives; ASCII digits only:
#: Python's \d also takes other scripts' digits, which sbatch refuses after submission
_TIME_FORMS = [(re.compile(pattern), parts) for pattern, parts in [
    (r"^([0-9]+)$", ("minutes",)),
    (r"^([0-9]+):([0-9]+)$", ("minutes", "seconds")),
    (r"^([0-9]+):([0-9]+):([0-9]+)$", ("hours", "minutes", "seconds")),
    (r"^([0-9]+)-([0-9]+)$", ("days", "hours")),
    (r"^([0-9]+)-([0-9]+):([0-9]+)$", ("days", "hours", "minutes")),
    (r"^([0-9]+)-([0-9]+):([0-9]+):([0-9]+)$", ("days", "hours", "minutes", "seconds")),
]]
#: the forms, as the errors name them
TIME_FORMS_SAID = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
#: more restarts than anyone means; a number this size also stays inside the script's integer test
MAX_REQUEUES = 1000
#: a Python interpreter's name (python, python3, python3.11), not a script's (python_runner.py)
_INTERPRETER = re.compile(r"^python[0-9.]*$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
#: how much earlier than asked Slurm may send the walltime warning (sbatch(1), --signal)
SIGNAL_EARLY_SECONDS = 60
_SAFE_WORD = re.compile(r"^[\w.,:@%+=/-]+$")


#: the longest --time taken: a year
MAX_WALLTIME_DAYS = 365


def parse_walltime(text: str) -> int:
    """Seconds in a Slurm walltime, in any of the forms sbatch takes (``90``, ``12:00:00``, ``2-12``)."""
    match, names = next(((found, names) for found, names in ((pattern.match(text.strip()), names)
                                                              for pattern, names in _TIME_FORMS) if found), (None, ()))
    if match is None:
        raise UsageError(f"--time {text!r}: expected {TIME_FORMS_SAID} (as sbatch takes them), e.g. 24:00:00")
    parts = dict(zip(names, (int(part) for part in match.groups())))
    days, hours, minutes, seconds = (parts.get(name, 0) for name in ("days", "hours", "minutes", "seconds"))
    # the first part is a count of its unit (90 minutes); a later one is below the next unit up
    if seconds > 59 or (minutes > 59 and names[0] != "minutes") or (hours > 23 and names[0] == "days"):
        raise UsageError(f"--time {text!r}: minutes and seconds after the first part must be below 60, hours "
                         f"after a day count below 24")
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    if total <= 0:
        raise UsageError(f"--time {text!r}: the walltime must be longer than zero")
    if total > MAX_WALLTIME_DAYS * 86400:  # a typo (days for hours): no partition gives it, and sbatch would refuse
        raise UsageError(f"--time {text!r}: the walltime must be at most {MAX_WALLTIME_DAYS} days")
    return total


def program_of(command: List[str]) -> Tuple[List[str], str]:
    """The python invocation for ``command[0]`` and the job's default name.

    ``mnist_svm`` or ``common.pipeline`` run as modules (``python -m``); a path ending in
    ``.py`` runs as a script.
    """
    target = command[0]
    if _INTERPRETER.match(PurePosixPath(target).name) and len(command) > 1 and (
            command[1] == "-m" or command[1].endswith(".py")):  # `-- python -m mnist_svm 24`
        module = command[1] == "-m"
        rest = command[2:] if module else command[1:]
        raise UsageError(f"command {shlex.join(command[:len(command) - len(rest) + 1])}: give the program without "
                         f"its interpreter: -- {shlex.join(rest)} (the job starts it with "
                         f"python{' -m' if module else ''} itself)")
    if target.endswith(".py"):
        return ["python", target], PurePosixPath(target).stem
    if not _MODULE.match(target):
        raise UsageError(f"command {target!r}: expected a module (mnist_svm, mnist_nn, common.pipeline) or a .py file")
    return ["python", "-m", target], target.rsplit(".", 1)[-1]


_GPUS = re.compile(r"^(?:([A-Za-z0-9][\w.-]*):)?([0-9]+)$", re.ASCII)


def parse_gpus(text: Optional[str]) -> Tuple[Optional[str], Optional[int]]:
    """``--gpus-per-node``'s ``N`` or ``TYPE:N`` (Slurm's typed request): (type or None, N). ASCII
    digits only, as ``--time``: Python's int() would also take "4_0", "+4" and other scripts' digits."""
    if text is None:
        return None, None
    match = _GPUS.match(text.strip())
    if match is None:
        raise UsageError(f"--gpus-per-node {text!r}: expected a number of GPUs, or TYPE:N as Slurm takes it "
                         f"(a100:4; a type is letters, digits and . _ -)")
    return match.group(1), int(match.group(2))


@dataclass
class JobSpec:
    """One batch job: resources, how to launch, and the program with its arguments."""

    command: List[str]
    nodes: int = 1
    gpus_per_node: Optional[int] = None  # None: not given (a CPU job's, or a GPU job's mistake)
    gpu_type: Optional[str] = None  # --gpus-per-node a100:4: the GPU type Slurm's gres names ("a100")
    time: str = "01:00:00"
    cpu: bool = False
    ntasks_per_node: int = 1
    cpus_per_task: Optional[int] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    container: Optional[str] = None
    binds: List[str] = field(default_factory=list)
    mpi: str = "pmi2"
    warning: int = 300
    grace: Optional[int] = None
    job_name: Optional[str] = None
    modules: List[str] = field(default_factory=list)
    venv: Optional[str] = ".venv"
    max_requeues: int = 20

    def __post_init__(self) -> None:
        self.time = self.time.strip()  # what reaches the #SBATCH line and the generator command

    def check(self) -> "JobSpec":
        """Raise UsageError for any combination Slurm or the engine would reject later."""
        if not self.command:
            raise UsageError("no command: put the program after '--', e.g. -- mnist_svm 24 --batch 50")
        program_of(self.command)
        for word in self.command:
            if any(ord(char) < 32 for char in word):
                raise UsageError(f"{word!r}: control characters (a newline, a tab) cannot go into the batch script")
        if self.nodes < 1:
            raise UsageError(f"--nodes {self.nodes}: a job needs at least one node")
        if self.nodes > MAX_NODES:
            raise UsageError(f"--nodes {self.nodes}: at most {MAX_NODES:,} (more than any cluster has)")
        for flag, value, shown in (("--gpus-per-node", self.gpus_per_node, self.gpus),
                                   ("--ntasks-per-node", self.ntasks_per_node, self.ntasks_per_node),
                                   ("--cpus-per-task", self.cpus_per_task, self.cpus_per_task)):
            if value is not None and value > MAX_PER_NODE[flag]:
                raise UsageError(f"{flag} {shown}: at most {MAX_PER_NODE[flag]:,} (more than any node has)")
        if self.ntasks_per_node < 1:
            raise UsageError(f"--ntasks-per-node {self.ntasks_per_node}: needs at least one task per node")
        if self.cpu and self.gpus_per_node is not None:
            raise UsageError("--cpu with --gpus-per-node: a CPU job asks for no GPUs (drop one of them)")
        if not self.cpu and self.gpus_per_node is None:
            raise UsageError("a GPU job needs --gpus-per-node N (the GPUs each node gives the run), or --cpu for a "
                             "CPU job")
        if not self.cpu and self.gpus_per_node < 1:
            raise UsageError(f"--gpus-per-node {self.gpus}: a GPU job needs at least one GPU per node (or use --cpu)")
        if not self.cpu and self.ntasks_per_node > 1:
            raise UsageError(f"--ntasks-per-node {self.ntasks_per_node} with GPUs: each rank uses every GPU of its node, "
                             f"so ranks on one node would share them; use 1 (the default) or --cpu")
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise UsageError(f"--cpus-per-task {self.cpus_per_task}: needs at least one CPU")
        if self.mpi not in MPI_PLUGINS:
            raise UsageError(f"--mpi {self.mpi!r}: expected one of {', '.join(MPI_PLUGINS)} (none would give every rank a world of size 1)")
        seconds = parse_walltime(self.time)
        if not 60 <= self.warning <= 65535:
            raise UsageError(f"--warning {self.warning}: the walltime warning must be 60 to 65535 seconds before the end")
        if self.warning >= seconds:
            raise UsageError(f"--time {self.time} is not longer than the {self.warning} s walltime warning: ask for more time or a smaller --warning")
        if seconds - self.warning <= SIGNAL_EARLY_SECONDS:  # sbatch(1), --signal: "up to 60 seconds earlier"
            raise UsageError(f"--time {self.time} leaves {seconds - self.warning} s before the {self.warning} s walltime "
                             f"warning, which Slurm may send up to {SIGNAL_EARLY_SECONDS} s early: a start, and every "
                             f"requeued one, could be stopped before any work; ask for more time or a smaller --warning")
        if self.grace is not None and not 0 <= self.grace < self.warning:
            raise UsageError(f"--grace {self.grace}: must be at least 0 and below the {self.warning} s walltime warning")
        if not 0 <= self.max_requeues <= MAX_REQUEUES:
            raise UsageError(f"--max-requeues {self.max_requeues}: must be 0 to {MAX_REQUEUES}")
        for name, value in (("--partition", self.partition), ("--account", self.account),
                            ("--container", self.container), ("--job-name", self.job_name),
                            ("--venv", self.venv)):
            if value is not None and not _SAFE_WORD.match(value):
                raise UsageError(f"{name} {value!r}: only letters, digits and . , : @ % + = / - _ are allowed")
        for name, values in (("--bind", self.binds), ("--module", self.modules)):
            for value in values:
                if not _SAFE_WORD.match(value):
                    raise UsageError(f"{name} {value!r}: only letters, digits and . , : @ % + = / - _ are allowed")
        if self.binds and not self.container:
            raise UsageError("--bind without --container: binds only apply inside a container")
        return self

    # ----- derived values -----
    @property
    def bind_sources(self) -> List[str]:
        """The host paths of the --bind values (apptainer's ``SRC[:DST[:OPTS]]``, several joined by commas)."""
        return [spec.split(":", 1)[0] for bind in self.binds for spec in bind.split(",") if spec.split(":", 1)[0]]

    @property
    def name(self) -> str:
        """--job-name, else the program's name; a script's file name may hold what an #SBATCH line
        cannot (sbatch splits it at a space, fails on a lone quote): those characters become '_'."""
        return self.job_name or re.sub(r"[^\w.+-]", "_", program_of(self.command)[1], flags=re.ASCII) or "job"

    @property
    def python(self) -> List[str]:
        return program_of(self.command)[0]

    @property
    def app_args(self) -> List[str]:
        return list(self.command[1:])

    @property
    def default_grace(self) -> int:
        """Seconds the run may spend finishing items: the warning less a minute to flush and requeue."""
        if self.grace is not None:
            return self.grace
        return max(self.warning - 60, self.warning // 2)

    @property
    def default_cpus_per_task(self) -> int:
        """CPUs per rank: what was asked, else 1 per CPU worker or 4 per GPU."""
        if self.cpus_per_task is not None:
            return self.cpus_per_task
        return 1 if self.cpu else 4 * self.gpus_per_node

    @property
    def gpus(self) -> str:
        """The GPUs per node as Slurm's --gpus-per-node takes them: ``4`` or ``a100:4``."""
        return f"{self.gpu_type}:{self.gpus_per_node}" if self.gpu_type else str(self.gpus_per_node)

    def argv(self) -> List[str]:
        """The generator's command line that makes this spec (written into the script)."""
        words = ["--nodes", str(self.nodes)]
        words += ["--cpu"] if self.cpu else ["--gpus-per-node", self.gpus]
        if self.ntasks_per_node != 1:
            words += ["--ntasks-per-node", str(self.ntasks_per_node)]
        if self.cpus_per_task is not None:
            words += ["--cpus-per-task", str(self.cpus_per_task)]
        words += ["--time", self.time]
        for flag, value in (("--partition", self.partition), ("--account", self.account),
                            ("--container", self.container), ("--job-name", self.job_name)):
            if value is not None:
                words += [flag, value]
        for bind in self.binds:
            words += ["--bind", bind]
        for module in self.modules:
            words += ["--module", module]
        default = {f.name: f.default for f in fields(self)}
        if self.venv != default["venv"]:
            words += ["--venv", self.venv or "none"]
        for flag, name in (("--mpi", "mpi"), ("--warning", "warning"), ("--grace", "grace"),
                           ("--max-requeues", "max_requeues")):
            if getattr(self, name) != default[name]:
                words += [flag, str(getattr(self, name))]
        return words + ["--"] + list(self.command)

    def command_line(self) -> str:
        return "python -m common.slurm " + shlex.join(self.argv())
