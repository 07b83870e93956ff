"""Which devices a rank's workers run on: parsing ``--gpu`` and finding GPUs without CUDA.

The parent never initialises CUDA: GPUs are counted from ``CUDA_VISIBLE_DEVICES``, NVML
(``nvidia-ml-py``) or ``nvidia-smi``, and each worker is pinned by setting
``CUDA_VISIBLE_DEVICES`` to exactly its GPU before it starts.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, List, Optional

from . import settings
from .errors import UsageError


@dataclass(frozen=True)
class Device:
    """Where one worker runs. ``physical`` is the value given to ``CUDA_VISIBLE_DEVICES``."""

    kind: str  # "cuda" or "cpu"
    index: int  # GPU index as the user numbers them on this node, or CPU worker number
    physical: Optional[str] = None
    slot: Optional[int] = None  # which of the --workers-per-gpu workers sharing this GPU (None: it has it alone)

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def torch_device(self) -> str:
        """Inside the worker its one GPU is always ``cuda:0``."""
        return "cuda:0" if self.is_gpu else "cpu"

    @property
    def gpu_name(self) -> str:
        """The GPU's own name (``gpu0``), the same for every worker sharing it."""
        return f"gpu{self.index}"

    def __str__(self) -> str:
        if not self.is_gpu:
            return f"cpu{self.index}"
        return self.gpu_name if self.slot is None else f"{self.gpu_name}.{self.slot}"


def slurm_gave_no_gpu() -> bool:
    """Inside a Slurm job that was given no GPU, or whose GPUs Slurm did not name in
    CUDA_VISIBLE_DEVICES (:func:`slurm_gpus_without_cuda_variable` tells the two apart): Slurm sets
    it for every job it gives GPUs unless gres.conf says not to, so unset there means the node's
    GPUs (which NVML still lists where devices are not constrained) are not this job's to take."""
    return settings.in_slurm_job() and "CUDA_VISIBLE_DEVICES" not in os.environ


def slurm_gpus_without_cuda_variable() -> Optional[str]:
    """``NAME=value`` of the Slurm variable saying this job was given GPUs, where Slurm set no
    CUDA_VISIBLE_DEVICES for them (gres.conf ``Flags=no_gpu_env``, or GPUs configured without
    ``File=``); None otherwise. Which of the node's GPUs they are cannot be told safely then
    (Slurm's ids are the node's, CUDA's may be renumbered by a device cgroup)."""
    if not settings.in_slurm_job() or "CUDA_VISIBLE_DEVICES" in os.environ:
        return None
    return settings.slurm_gpus()


def visible_gpus() -> List[str]:
    """Physical ids of the GPUs this process may use, found without initialising CUDA."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return cuda_visible_devices(env)
    if slurm_gave_no_gpu():
        return []
    return node_gpus()


def cuda_visible_devices(value: str) -> List[str]:
    """The GPUs a CUDA_VISIBLE_DEVICES value gives, read by CUDA's rules (as torch's
    ``_parse_visible_devices`` copies them), so that workers are pinned to the GPUs CUDA would show:
    each entry read like ``strtoul`` (``1gpu`` is 1); a negative or unreadable entry ends the list
    (``-1``, ``""``, ``NoDevFiles``: no GPU; ``0,-1,1``: GPU 0 only); a list of UUIDs ends at the
    first entry without the first one's ``GPU-``/``MIG-`` prefix, spaces included (``GPU-a, GPU-b`` is
    GPU-a alone, `` GPU-a`` none: torch 2.7.1 strips the numbers' entries only); a repeated entry
    gives no GPU."""
    prefix = next((p for p in ("GPU-", "MIG-") if value.startswith(p)), None)
    entries = value.split(",") if prefix else [entry.strip() for entry in value.split(",")]
    gpus: List[str] = []
    for entry in entries:
        if prefix is None:
            number = re.match(r"[+-]?[0-9]+", entry)
            if number is None or int(number.group()) < 0:
                break
            entry = str(int(number.group()))
        elif not entry.startswith(prefix):
            break
        if entry in gpus:
            return []
        gpus.append(entry)
    return gpus


def cuda_variable_note() -> str:
    """`` (CUDA_VISIBLE_DEVICES=... gives CUDA none)`` where that variable hides every GPU without
    being one of the usual ways of saying "none" (a repeated entry, or a negative or malformed one
    first), else ``""``."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None or value.strip() in ("", "-1", "none", "NoDevFiles"):
        return ""
    return f" (CUDA_VISIBLE_DEVICES={value!r} gives CUDA none)"


#: NVML's NVML_ERROR_NO_PERMISSION: a GPU the process may not open
NVML_NO_PERMISSION = 4


def nvml_usable_handles(nvml: Any) -> List[Any]:
    """NVML's handles of the GPUs this process may open, in NVML's order, numbered as CUDA numbers
    them for the workers (CUDA_DEVICE_ORDER=PCI_BUS_ID; NVML's order is the PCI bus's on the nodes
    we know of, though nvml.h promises no order): NVML counts every GPU of the node, also those a
    device cgroup denies this job (Slurm's ConstrainDevices), whose handles raise NO_PERMISSION;
    CUDA, as nvidia-smi, lists only the others, so CUDA's GPU k is the k-th of these. A GPU NVML
    fails on otherwise (lost, unknown error) keeps its place as None: the GPUs after it keep their
    numbers, and it is left unmonitored. ``nvml``: an initialised pynvml."""
    handles: List[Any] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handles.append(nvml.nvmlDeviceGetHandleByIndex(index))
        except nvml.NVMLError as error:
            if getattr(error, "value", None) != NVML_NO_PERMISSION:
                handles.append(None)
    return handles


def node_gpus() -> List[str]:
    """Indexes, as CUDA numbers them, of the GPUs on this node that this process may open (NVML,
    else ``nvidia-smi -L``), whatever CUDA_VISIBLE_DEVICES says; none without a driver.
    Initialises no CUDA."""
    try:
        import pynvml  # provided by nvidia-ml-py

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(len(nvml_usable_handles(pynvml)))]
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
            return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU ")]
        except (OSError, subprocess.SubprocessError):
            pass
    return []


def names_cpu(spec: Optional[str]) -> bool:
    """Whether ``--gpu`` says ``cpu`` (None, the default, does not)."""
    return spec is not None and spec.strip().lower() == "cpu"


def parse_gpu_spec(spec: Optional[str]) -> Optional[List[int]]:
    """Syntax check of ``--gpu``: ``None`` for cpu, ``[]`` for all, else the indexes."""
    if spec is None:
        return [0]
    text = spec.strip().lower()
    if text == "cpu":
        return None
    if text == "all":
        return []
    try:
        indexes = [int(part) for part in text.split(",")]
    except ValueError:
        raise UsageError(f"--gpu {spec!r}: expected 'cpu', 'all' or GPU numbers such as 0,1,2") from None
    if any(i < 0 for i in indexes) or len(set(indexes)) != len(indexes):
        raise UsageError(f"--gpu {spec!r}: GPU numbers must be distinct and not negative")
    return indexes


def check_workers_per_gpu(spec: Optional[str], per_gpu: int) -> None:
    """``--workers-per-gpu`` N > 1 with ``--gpu cpu``: refused, as it would be silently ignored
    (checked where the devices are decided, and by the job-script generator before the queue). The
    default ``--gpu``'s fallback to the CPU where there is no GPU keeps it: a GPU job's flag there."""
    if per_gpu > 1 and names_cpu(spec):
        raise UsageError(f"--workers-per-gpu {per_gpu} with --gpu {spec}: workers share GPUs, and there are "
                         f"none; on the CPU, --workers N sets the workers")


def check_workers_on_gpus(spec: Optional[str], workers: int) -> None:
    """``--workers`` N > 1 with GPUs named by ``--gpu``: refused, as it would be silently ignored
    (a worker per GPU; ``--workers-per-gpu`` puts several on each). The default ``--gpu`` keeps it:
    a CPU command that falls back to the CPU where there is no GPU."""
    if workers > 1 and spec is not None and not names_cpu(spec):
        raise UsageError(f"--workers {workers} with --gpu {spec}: on GPUs each worker has a GPU of its own "
                         f"(--workers counts CPU workers); --workers-per-gpu N runs N workers on each GPU")


def resolve_devices(spec: Optional[str], workers: int, gpus: Optional[List[str]] = None, position: int = 0,
                    sharing: int = 1, per_gpu: int = 1) -> tuple:
    """The devices of this rank's workers, and a notice for the user (or ``None``).

    ``per_gpu`` workers share each GPU (``--workers-per-gpu``): devices ``gpu0.0``, ``gpu0.1``, ...

    ``spec`` None is the default: GPU 0 where there is one, else CPU with a notice. ``sharing``
    ranks of this node see the same ``gpus`` (``mpirun -n 8`` over two 4-GPU nodes, with no GPU
    bound to each task), this rank being number ``position`` of them: they share the GPUs out
    (``share_gpus``) instead of each starting workers on all of them.
    """
    indexes = parse_gpu_spec(spec)
    gpus = visible_gpus() if gpus is None else gpus
    notice = None
    given = slurm_gpus_without_cuda_variable() if not gpus else None
    if given is not None and indexes is not None:
        raise UsageError(f"--gpu {spec or '0 (the default)'}: Slurm gave this job GPUs on {os.uname().nodename} "
                         f"({given}) but set no CUDA_VISIBLE_DEVICES (gres.conf Flags=no_gpu_env?): set it in "
                         f"the job script to those GPUs as CUDA numbers them here (and run through srun on the "
                         f"job's nodes), or use --gpu cpu")
    hidden = cuda_variable_note() if not gpus else ""
    if indexes == [0] and spec is None and not gpus:
        indexes, notice = None, f"no GPU found{hidden}: running on CPU (use --gpu cpu to silence this)"
    if indexes is None:
        check_workers_per_gpu(spec, per_gpu)
        return [Device("cpu", i) for i in range(workers)], notice
    check_workers_on_gpus(spec, workers)
    if not gpus and slurm_gave_no_gpu():
        raise UsageError(f"--gpu {spec}: Slurm gave this job no GPU on {os.uname().nodename} "
                         "(CUDA_VISIBLE_DEVICES is unset); ask for them with --gpus-per-node or --gres=gpu:N, "
                         "set CUDA_VISIBLE_DEVICES where whole nodes come without GPU resources, or use --gpu cpu")
    if not gpus:
        raise UsageError(f"--gpu {spec}: this node ({os.uname().nodename}) has no GPU{hidden}; use --gpu cpu")
    if indexes == []:
        indexes = list(range(len(gpus)))
    missing = [i for i in indexes if i >= len(gpus)]
    if missing:
        raise UsageError(f"--gpu {spec}: no GPU {missing[0]} on {os.uname().nodename}, which has {len(gpus)} (0-{len(gpus) - 1})")
    if sharing > 1:
        indexes = share_gpus(spec, indexes, len(gpus), position, sharing)
    if per_gpu > 1:
        return [Device("cuda", i, gpus[i], slot) for i in indexes for slot in range(per_gpu)], notice
    return [Device("cuda", i, gpus[i]) for i in indexes], notice


def share_gpus(spec: Optional[str], indexes: List[int], count: int, position: int, sharing: int) -> List[int]:
    """Rank ``position`` of ``sharing`` ranks on one node that see the same ``count`` GPUs: its
    share of the ``--gpu`` list ``indexes``, a contiguous slice, so that no GPU gets two ranks'
    workers. With the default ``--gpu`` (GPU 0), rank i takes GPU i, and where there are fewer
    GPUs than ranks they take turns (``mpiexec -n 2`` on a one-GPU machine shares GPU 0, as before)."""
    if spec is None:
        return [position % count]
    if len(indexes) < sharing:
        raise UsageError(f"--gpu {spec}: {sharing} ranks on {os.uname().nodename} would share its {len(indexes)} "
                         f"GPU(s); start at most {len(indexes)} rank(s) per node (one rank drives all of its "
                         "node's GPUs) or give each rank its own GPUs (srun --gpus-per-task)")
    return indexes[position * len(indexes) // sharing:(position + 1) * len(indexes) // sharing]
