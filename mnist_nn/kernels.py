"""The hidden layer's CPU kernels (``hidden_kernels.c``): built on first use, loaded with ctypes.

They are compiled with the machine's C compiler (``$CC``, else ``cc``) into a per-user cache,
once per source, compiler and instruction set, so a source checkout, an installed package and
a read-only container image all get them. Where they cannot be had (no compiler, a CPU
without AVX2 and FMA, not x86-64 Linux, or ``MNIST_NN_CPU_KERNELS=0``), ``blocked`` runs the
same step with torch's products: slower, and not the same bits.

The AVX-512 and AVX2 builds give the same bits (``tests/test_mnist_nn_kernels.py``), so every
node of a cluster trains a net the same way whichever of the two its CPU has.
"""
from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import List, Optional, Tuple

import torch

SOURCE = Path(__file__).with_name("hidden_kernels.c")
#: compiler flags per instruction set; no fast-math and -ffp-contract=off: only the source's own
#: fused multiply-adds, and no reordered sums
ISA_FLAGS = {"avx512": ["-mavx512f", "-mavx2", "-mfma"], "avx2": ["-mavx2", "-mfma"]}
COMMON_FLAGS = ["-O3", "-fno-fast-math", "-ffp-contract=off", "-shared", "-fPIC"]
#: set to 0 to train with torch's products instead
SWITCH = "MNIST_NN_CPU_KERNELS"


def cpu_isa() -> Optional[str]:
    """The best of ``ISA_FLAGS`` this CPU runs (Linux x86-64 only), or None."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    except OSError:
        return None
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags and "fma" in flags:
        return "avx2"
    return None


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/multinode-gpu`` (``~/.cache``), or a per-user temporary folder where that
    cannot be written (a read-only home in a container)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "multinode-gpu"
    try:
        base.mkdir(parents=True, exist_ok=True)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    fallback = Path(tempfile.gettempdir()) / f"multinode-gpu-{os.getuid()}"
    fallback.mkdir(mode=0o700, exist_ok=True)
    status = fallback.lstat()
    if status.st_uid != os.getuid() or status.st_mode & 0o022 or not fallback.is_dir() or fallback.is_symlink():
        # someone else's folder: a library found there could be anything
        raise PermissionError(f"{fallback} is not this user's own folder")
    return fallback


def build(isa: str, fresh: bool = False) -> Path:
    """The shared library for ``isa``, compiled unless the cache has it for this source, compiler
    (path and version) and flags, or ``fresh``; a failed compile raises
    ``subprocess.CalledProcessError``. Workers building at once take turns on a lock (one compiles,
    the others then find its library), and it is written under a temporary name and renamed, so
    no one loads a half-written file."""
    compiler = os.environ.get("CC") or "cc"
    command = shlex.split(compiler)  # CC may be "ccache gcc"
    path = shutil.which(command[0]) if command else None
    if path is None:
        raise FileNotFoundError(f"no C compiler {compiler!r}")
    command[0] = path
    flags = COMMON_FLAGS + ISA_FLAGS[isa]
    version = _run(command + ["--version"], timeout=60).stdout.split(b"\n")[0]
    key = hashlib.sha256(SOURCE.read_bytes() + version + " ".join(command + flags).encode()).hexdigest()[:16]
    target = cache_dir() / f"hidden_kernels-{isa}-{key}.so"
    with open(target.parent / "hidden_kernels.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if fresh or not target.exists():
            fd, partial = tempfile.mkstemp(prefix=".partial-", suffix=".so", dir=target.parent)
            os.close(fd)
            try:
                _run(command + flags + [str(SOURCE), "-o", partial], timeout=300, check=True)
                os.replace(partial, target)
            finally:
                if os.path.exists(partial):
                    os.unlink(partial)
    return target


def _run(command: List[str], timeout: float, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=check)


class HiddenKernels:
    """``hidden_forward`` and ``hidden_backward`` of one build. Arguments are 2-D float32 CPU
    tensors (views of a block's columns) whose rows are contiguous; ctypes lets other threads
    run meanwhile."""

    def __init__(self, library: Path, isa: str):
        self.isa = isa
        self.library = library
        lib = ctypes.CDLL(str(library))
        i, n, p, f = ctypes.c_int, ctypes.c_long, ctypes.c_void_p, ctypes.c_float
        self._forward = lib.hidden_forward
        self._forward.argtypes = [i, i, n, p, n, p, n, p, n]
        self._forward.restype = None
        self._backward = lib.hidden_backward
        self._backward.argtypes = [i, i, n, p, n, p, n, p, p, n, p, n, f, f]
        self._backward.restype = None

    def forward(self, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
        """out (B, H) = x (B, n) @ w (H, n).T"""
        (B, n), (H, _) = _rows(x), _rows(w)
        _rows(out)
        _shapes(w.shape[1] == n and out.shape == (B, H), x, w, out)
        self._forward(B, H, n, x.data_ptr(), x.stride(0), w.data_ptr(), w.stride(0), out.data_ptr(), out.stride(0))

    def backward(self, x: torch.Tensor, dz: torch.Tensor, w: torch.Tensor, v: torch.Tensor, gi: torch.Tensor,
                 momentum: float, learning_rate: float) -> None:
        """gi (B, n) = dz (B, H) @ w (H, n), then v = momentum * v + learning_rate * dz.T @ x; w -= v."""
        (B, n), (H, _) = _rows(x), _rows(w)
        for t in (dz, v, gi):
            _rows(t)
        _shapes(dz.shape == (B, H) and v.shape == w.shape == (H, n) and gi.shape == (B, n) and v.stride() == w.stride(),
                x, dz, w, v, gi)
        self._backward(B, H, n, x.data_ptr(), x.stride(0), dz.data_ptr(), dz.stride(0), w.data_ptr(), v.data_ptr(),
                       w.stride(0), gi.data_ptr(), gi.stride(0), momentum, learning_rate)


def _rows(t: torch.Tensor) -> Tuple[int, int]:
    if t.dtype != torch.float32 or t.device.type != "cpu" or t.dim() != 2 or t.stride(1) != 1:
        raise ValueError(f"need a 2-D float32 CPU tensor with contiguous rows, not {t.dtype} {tuple(t.stride())}")
    if t.shape[0] >= 2 ** 31:
        raise ValueError(f"{t.shape[0]} rows: the kernels take fewer than 2^31")
    return t.shape[0], t.shape[1]


def _shapes(fit: bool, *tensors: torch.Tensor) -> None:
    """The kernels write through raw pointers: shapes that do not fit would write out of bounds."""
    if not fit:
        raise ValueError(f"shapes that do not fit: {', '.join(str(tuple(t.shape)) for t in tensors)}")


@functools.lru_cache(maxsize=None)
def load(isa: Optional[str] = None) -> Tuple[Optional[HiddenKernels], str]:
    """(kernels, a line saying which) for this CPU, or for ``isa`` (tests); kernels is None, and the
    line says why, where they cannot be had. Where AVX-512's build fails, AVX2's is tried; a cached
    library that will not load (damaged) is built again once."""
    if isa is None and switched_off():
        return None, f"CPU kernels off ({SWITCH}=0): torch's products"
    choices = [isa] if isa else {"avx512": ["avx512", "avx2"], "avx2": ["avx2"], None: []}[cpu_isa()]
    if not choices:
        return None, "CPU kernels need x86-64 Linux with AVX2 and FMA: torch's products"
    reason = ""
    for choice in choices:
        for fresh in (False, True):
            try:
                library = build(choice, fresh=fresh)
                return HiddenKernels(library, choice), f"CPU kernels: {choice} ({library})"
            except (OSError, subprocess.SubprocessError) as error:
                lines = (getattr(error, "stderr", b"") or b"").decode(errors="replace").splitlines()
                reason = next((line.strip() for line in lines if "error" in line), str(error))
                if not isinstance(error, OSError) or isinstance(error, FileNotFoundError):
                    break  # a compile that failed, or no compiler: building again will not help
    return None, f"CPU kernels could not be built or loaded ({reason}): torch's products"


def hidden_kernels() -> Optional[HiddenKernels]:
    """This CPU's kernels, or None (also while ``MNIST_NN_CPU_KERNELS=0``, read at each call)."""
    return None if switched_off() else load()[0]


def switched_off() -> bool:
    """Whether ``MNIST_NN_CPU_KERNELS=0`` asks for torch's products."""
    return os.environ.get(SWITCH, "1") == "0"
