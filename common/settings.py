"""Every environment variable of ours, in one place: its type, default and meaning.

A run reads them all once as it starts, never at import (:func:`read_all`; the engine and the
pipeline app hand its :class:`RunSettings` to what uses each, through their constructors and
arguments): a value that is not what the variable takes is refused in one line
naming it (exit 2) instead of being silently replaced by the default or raising later in a
thread. Booleans take ``1``/``true`` (on) and ``0``/``false``/empty (off); seconds are finite,
positive and below a stated bound; an empty seconds or text setting means its default. The README's table
of environment variables lists the same.

The pipeline app's variables whose validity depends on the definition or its flags (the family
``PIPELINE_RESOURCE_<NAME>``/``SWARM_RESOURCE_<name>``, ``PIPELINE_AGENT``, needed only by prompt
steps, and the queue timeouts below, which ``--queue-timeout`` replaces) are checked where the
pipeline app reads its definition (``common.pipeline.app``).
The launcher's, Slurm's and CUDA's own variables are read by the functions below, by
``common.devices`` (CUDA_VISIBLE_DEVICES, which it also sets for each worker) and by
``common.ranks.mpi`` (whether a launcher started this process, and the MPICH netmod that srun's
pmi2 needs, which it sets before MPI starts).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple, Union

from .errors import UsageError

#: a rank silent for this long is lost; the default beats Slurm's own node-failure handling
DEFAULT_HEARTBEAT_TIMEOUT = 30.0
#: a worker silent this long is killed. Generous: a native library that holds the GIL through a long
#: call (possibly a cuML fit) silences the worker's heartbeat thread just as a hang does
DEFAULT_WORKER_TIMEOUT = 300.0
#: a worker's setup (App.setup_worker: data loaded once, a model built) may take this long: its
#: heartbeat goes on meanwhile, so a setup stuck on a dead filesystem or a lock is found by this alone
DEFAULT_SETUP_TIMEOUT = 3600.0
#: after a stop is asked, the items running may finish for this long (--grace) before their workers end
DEFAULT_GRACE = 60.0
TRUE_WORDS = ("1", "true")
FALSE_WORDS = ("", "0", "false")


@dataclass(frozen=True)
class Setting:
    """One environment variable: ``kind`` is "seconds", "bool" or "text"; ``maximum`` bounds seconds, and
    ``minimum`` (when above 0) the periods of what a run writes or prints: 1e-300 would be a busy loop."""

    name: str
    kind: str
    default: Union[float, bool, None]
    meaning: str
    maximum: float = math.inf
    minimum: float = 0.0


#: the shortest period of a file rewritten or a line printed while a run goes on
MIN_PERIOD = 0.1

NO_MPI = Setting("MULTINODE_GPU_NO_MPI", "bool", False,
                 "run as a single rank without joining MPI (no launcher needed)")
HOLD_SECONDS = Setting("MULTINODE_GPU_HOLD_SECONDS", "seconds", 20.0,
                       "how often rank 0 rewrites the results folder's hold.json (stale after 3 periods)", 3600.0,
                       MIN_PERIOD)
PROGRESS_SECONDS = Setting("MULTINODE_GPU_PROGRESS_SECONDS", "seconds", 30.0,
                           "seconds between plain progress lines when stderr is not a terminal", 86400.0, MIN_PERIOD)
STATUS_SECONDS = Setting("MULTINODE_GPU_STATUS_SECONDS", "seconds", 5.0,
                         "how often status.json is rewritten (and the other ranks report to rank 0)", 3600.0, MIN_PERIOD)
KILL_GRACE = Setting("PIPELINE_KILL_GRACE", "seconds", 5.0,
                     "seconds between SIGTERM and SIGKILL when a pipeline step is ended", 3600.0)
LOCK_DIR = Setting("PIPELINE_LOCK_DIR", "text", None,
                   "folder of the node-wide GPU slot locks of pipeline steps "
                   "(default /dev/shm/multinode-gpu-pipeline-<uid>)")
APPTAINER = Setting("PIPELINE_APPTAINER", "text", None,
                    "the apptainer program for steps with a container (default apptainer or singularity on PATH)")
CONTAINER = Setting("PIPELINE_CONTAINER", "text", None,
                    "the Apptainer image of pipeline steps whose definition names none (--container wins)")
#: a year: longer waits are no limit at all, and past ~1e11 s the clock's arithmetic overflows
MAX_QUEUE_TIMEOUT = 365 * 24 * 3600
QUEUE_TIMEOUT = Setting("PIPELINE_QUEUE_TIMEOUT", "seconds", None,
                        "the longest a pipeline step waits for its pools (--queue-timeout wins; default: no limit)",
                        MAX_QUEUE_TIMEOUT)
SWARM_QUEUE_TIMEOUT = Setting("SWARM_QUEUE_TIMEOUT", "seconds", None,
                              "the pipeline format's own name for PIPELINE_QUEUE_TIMEOUT (which wins)", MAX_QUEUE_TIMEOUT)

#: every variable a run reads, checked when it starts (the README's table lists the same); not the queue
#: timeouts, which only a pipeline run reads, where --queue-timeout wins (and SWARM_QUEUE_TIMEOUT may be
#: set for the format's own tools): common.pipeline.app checks them
ALL: Tuple[Setting, ...] = (NO_MPI, HOLD_SECONDS, PROGRESS_SECONDS, STATUS_SECONDS, KILL_GRACE, LOCK_DIR, APPTAINER,
                            CONTAINER)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def value(setting: Setting, environ: Optional[Mapping[str, str]] = None) -> Union[float, bool, str, None]:
    """The setting's value from ``environ`` (the process's environment by default), or its default
    when unset; a value it does not take raises :class:`UsageError` naming the variable."""
    environ = os.environ if environ is None else environ
    text = environ.get(setting.name)
    if text is None:
        return setting.default
    if setting.kind == "bool":
        word = text.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise UsageError(f"{setting.name}={_shown(text)}: expected 1 or true (on), 0, false or empty (off)")
    if setting.kind == "seconds":
        if not text.strip():  # empty: the default, as unset (a job script's VAR= to clear it)
            return setting.default
        try:
            seconds = float(text)
        except ValueError:
            raise UsageError(f"{setting.name}={_shown(text)}: expected a number of seconds") from None
        if not (0 < seconds and setting.minimum <= seconds <= setting.maximum):  # also refuses nan and inf
            least = f"at least {setting.minimum:g}" if setting.minimum > 0 else "more than 0"
            raise UsageError(f"{setting.name}={_shown(text)}: must be {least} and at most {setting.maximum:g} seconds")
        return seconds
    return text or None  # empty: the default, as unset


@dataclass(frozen=True)
class RunSettings:
    """Every setting of :data:`ALL`, read once as a run starts (:func:`read_all`) and handed to what
    uses it: a run sees one value of each from start to end."""

    no_mpi: bool
    hold_seconds: float
    progress_seconds: float
    status_seconds: float
    kill_grace: float
    lock_dir: Optional[str]
    apptainer: Optional[str]
    container: Optional[str]


#: RunSettings' field of each setting
FIELDS = {NO_MPI: "no_mpi", HOLD_SECONDS: "hold_seconds", PROGRESS_SECONDS: "progress_seconds",
          STATUS_SECONDS: "status_seconds", KILL_GRACE: "kill_grace", LOCK_DIR: "lock_dir", APPTAINER: "apptainer",
          CONTAINER: "container"}


def read_all(environ: Optional[Mapping[str, str]] = None) -> RunSettings:
    """Every setting read once: the first bad one raises :class:`UsageError` (one line naming it)."""
    return RunSettings(**{FIELDS[setting]: value(setting, environ) for setting in ALL})


#: every setting's default: what a part built outside a run (a test, a benchmark) is given
DEFAULTS = read_all({})


def launcher_rank(environ: Optional[Mapping[str, str]] = None) -> int:
    """This process's rank as its MPI launcher set it (hydra, Open MPI, Slurm), 0 without one: who
    prints an error found before MPI is joined."""
    environ = os.environ if environ is None else environ
    # Open MPI's first: its mpirun leaves a PMI_RANK inherited from an outer launcher (srun --pty) as it was
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        text = environ.get(name, "")
        if text.isascii() and text.isdigit():
            return int(text)
    return 0


def in_slurm_job(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether this process runs inside a Slurm job (a batch script's, which requeues at the walltime)."""
    return slurm_job(environ)[0] is not None


def slurm_job(environ: Optional[Mapping[str, str]] = None) -> Tuple[Optional[str], Optional[str]]:
    """(SLURM_JOB_ID, SLURM_RESTART_COUNT) of this process's Slurm job, None where unset (or empty):
    a requeued job keeps its id and counts its restarts."""
    environ = os.environ if environ is None else environ
    return environ.get("SLURM_JOB_ID") or None, environ.get("SLURM_RESTART_COUNT")


#: what Slurm sets where it gives a job or step GPUs, whether or not it sets CUDA_VISIBLE_DEVICES
SLURM_GPU_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE")


def slurm_gpus(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``NAME=value`` of the first of ``SLURM_GPU_VARIABLES`` that says this job was given GPUs, else None."""
    environ = os.environ if environ is None else environ
    for name in SLURM_GPU_VARIABLES:
        text = environ.get(name, "").strip()
        if text and text not in ("0", "(null)", "N/A"):
            return f"{name}={text}"
    return None


def launcher_sizes(environ: Optional[Mapping[str, str]] = None) -> List[int]:
    """How many ranks this process's MPI launcher started, as each launcher's variable says it
    (Open MPI: OMPI_COMM_WORLD_SIZE; hydra's mpiexec and srun's pmi2: PMI_SIZE), in that order; empty
    where none does. The world MPI joins must be one of them: Open MPI's mpirun leaves a PMI_SIZE
    inherited from an outer launcher as it was. A worker or a step process never sees them
    (:func:`without_launcher`)."""
    environ = os.environ if environ is None else environ
    sizes = []
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        text = environ.get(name, "")
        if text.isascii() and text.isdigit() and int(text) > 0:
            sizes.append(int(text))
    return sizes


# Variables through which a child process would find (and re-join) the rank's MPI job.
LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "HYDRA_", "HYDI_", "MPIR_", "MPI_LOCAL", "OMPI_", "PRTE_", "I_MPI_",
                     "SLURM_PMI", "SLURM_PMIX", "SLURM_MPI_TYPE")


def without_launcher(env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` less the MPI launcher's variables: what a worker or a step process must be given.

    A child that initialises MPI with its parent's launcher variables kills MPICH jobs, segfaults
    Open MPI 5 and hangs Open MPI 4 (see the README)."""
    return {name: value for name, value in env.items() if not name.startswith(LAUNCHER_PREFIXES)}
