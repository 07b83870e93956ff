"""The signatures of the GPU libraries' calls this project makes, into a checked-in snapshot.

PYTHONPATH=. python -m benchmarks.api_snapshot [--out FILE] [--source PACKAGE VERSION FOLDER]

For each library (cuML, CuPy, torch.cuda, nvidia-ml-py's pynvml) it records, under the version
installed, the signature of every function or method in ``USED``, read with ``inspect`` from the
installed package; entries of other versions already in the file are kept, so running it on the
CUDA 11 stack and on the CUDA 12 stack records both pins. ``--source`` reads them instead from a
source checkout of that version (for a library that cannot be imported here: cuML without a GPU),
from the ``def`` lines, with ``ast``. tests/test_api_snapshot.py checks the fakes (tests/fake_gpu,
tests/fake_nvml) and the project's own calls against every version in the file: run this wherever
the GPU stack is installed, and whenever a pin in requirements-cu11.txt / -cu12.txt changes.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

SNAPSHOT = Path(__file__).resolve().parent / "api_snapshot.json"

#: distribution -> {object path: [its functions or methods the project calls]}; "" is the object itself
USED: Dict[str, Dict[str, List[str]]] = {
    "cuml": {"cuml.svm.SVC": ["__init__", "fit", "predict", "decision_function"]},
    "cupy": {"cupy": ["asarray", "asnumpy", "asfortranarray", "unique", "concatenate", "stack", "argmax"]},
    "torch": {"torch.cuda": ["is_available", "device_count", "get_device_name", "get_device_properties",
                             "set_sync_debug_mode", "empty_cache", "mem_get_info", "memory_allocated",
                             "memory_reserved", "synchronize"]},
    "nvidia-ml-py": {"pynvml": ["nvmlInit", "nvmlShutdown", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
                                "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetUUID", "nvmlDeviceGetUtilizationRates",
                                "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTemperature", "nvmlDeviceGetPowerUsage"]},
}
#: what the project calls only where the installed release has it (looked up with getattr, the
#: other call its fallback): recorded for the versions that define it
WHERE_PRESENT: Dict[str, Dict[str, List[str]]] = {
    "nvidia-ml-py": {"pynvml": ["nvmlDeviceGetTemperatureV"]},  # from 13.x; nvmlDeviceGetTemperature before
}
#: distributions under other names: cuml-cu12, cupy-cuda12x, ...
DISTRIBUTIONS = {"cuml": ("cuml-cu12", "cuml-cu11", "cuml"),
                 "cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x", "cupy"),  # 13x: the H200's image
                 "torch": ("torch",), "torchvision": ("torchvision",), "mpi4py": ("mpi4py",),
                 "nvidia-ml-py": ("nvidia-ml-py",)}
#: --source: the files of a checkout that define each object (where the package's layout puts them)
SOURCE_FILES = {
    "cuml.svm.SVC": ["python/cuml/cuml/svm/svc.py", "python/cuml/cuml/svm/svc.pyx"],
    "cupy": ["cupy/__init__.py", "cupy/_creation/from_data.py", "cupy/_manipulation/kind.py",
             "cupy/_manipulation/add_remove.py", "cupy/_manipulation/join.py", "cupy/_sorting/search.py"],
    "torch.cuda": ["torch/cuda/__init__.py", "torch/cuda/memory.py"],
    "pynvml": ["pynvml.py"],
}


def plain(signature: inspect.Signature) -> str:
    """The signature without annotations: names, kinds and defaults are what a call meets."""
    return str(signature.replace(parameters=[p.replace(annotation=inspect.Parameter.empty)
                                             for p in signature.parameters.values()],
                                 return_annotation=inspect.Signature.empty))


def class_name(path: str) -> Optional[str]:
    """``SVC`` of ``cuml.svm.SVC``; None where the path is a module's (``torch.cuda``)."""
    last = path.split(".")[-1]
    return last if last[0].isupper() else None


def from_installed(path: str, names: List[str], where_present: Sequence[str] = ()) -> Dict[str, str]:
    in_class = class_name(path)
    owner: Any = importlib.import_module(path.rpartition(".")[0] if in_class else path)
    if in_class:
        owner = getattr(owner, in_class)
    present = [name for name in where_present if hasattr(owner, name)]
    return {f"{path}.{name}": plain(inspect.signature(getattr(owner, name))) for name in [*names, *present]}


def _def_header(text: str, name: str, in_class: Optional[str]) -> Optional[str]:
    """The source of ``def name(...)`` (at the top level, or in ``class in_class``), up to its colon."""
    start = 0
    if in_class:
        found = re.search(rf"^class {in_class}\b", text, re.M)
        if not found:
            return None
        start = found.end()
    indent = "    " if in_class else ""
    found = re.search(rf"^{indent}(?:cp)?def {name}\(", text[start:], re.M)
    if not found:
        return None
    begin, depth = start + found.start(), 0
    for i in range(start + found.end() - 1, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            end = text.index(":", i) if "->" not in text[i:text.index(":", i)] else text.index(":\n", i)
            return text[begin:end + 1].strip().removeprefix("cp")
    return None


def from_source(path: str, names: List[str], folder: Path, where_present: Sequence[str] = ()) -> Dict[str, str]:
    in_class = class_name(path)
    texts = [(folder / f).read_text() for f in SOURCE_FILES[path] if (folder / f).is_file()]
    found: Dict[str, str] = {}
    for name in [*names, *where_present]:
        header = next((h for h in (_def_header(t, name, in_class) for t in texts) if h), None)
        if header is None and name in where_present:
            continue
        if header is None:
            raise SystemExit(f"api_snapshot: no `def {name}` of {path} in {folder}")
        function = ast.parse(header + "\n    pass\n").body[0]
        for arg in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs,
                    function.args.vararg, function.args.kwarg]:
            if arg is not None:
                arg.annotation = None
        found[f"{path}.{name}"] = f"({ast.unparse(function.args)})"
    return found


def installed_version(package: str) -> Optional[str]:
    for distribution in DISTRIBUTIONS[package]:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SNAPSHOT, help="the snapshot (entries of other versions are kept)")
    parser.add_argument("--source", nargs=3, action="append", default=[], metavar=("PACKAGE", "VERSION", "FOLDER"),
                        help="read PACKAGE's signatures for VERSION from a source checkout instead")
    args = parser.parse_args(argv)
    snapshot: Dict[str, Dict[str, Dict[str, str]]] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    sources = {package: (version, Path(folder)) for package, version, folder in args.source}
    for package, objects in USED.items():
        optional = WHERE_PRESENT.get(package, {})
        if package in sources:
            version, folder = sources[package]
            found = {k: v for path, names in objects.items()
                     for k, v in from_source(path, names, folder, optional.get(path, [])).items()}
            origin = f"source {folder.name}"
        else:
            version = installed_version(package)
            if version is None:
                print(f"api_snapshot: {package}: not installed, its entries kept", file=sys.stderr)
                continue
            try:
                found = {k: v for path, names in objects.items()
                         for k, v in from_installed(path, names, optional.get(path, [])).items()}
            except Exception as error:  # cuML without a GPU, say
                print(f"api_snapshot: {package} {version}: cannot be read ({type(error).__name__}: {error})",
                      file=sys.stderr)
                continue
            origin = "installed"
        snapshot.setdefault(package, {})[version] = found
        print(f"api_snapshot: {package} {version} ({origin}): {len(found)} signatures")
    args.out.write_text(json.dumps({p: dict(sorted(v.items())) for p, v in sorted(snapshot.items())}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
