"""The image data sets every app uses: MNIST, Fashion-MNIST (IDX files) and scikit-learn's digits.

All three come back in one shape, :class:`Dataset`: uint8 images on 0-255 and int64 labels 0-9,
so an app never cares where the pixels came from. IDX files are read whole (one
``np.frombuffer`` per file, not one image at a time) and checked, so a corrupt or truncated
download fails with one clear line instead of a reshape error deep inside a worker.

torchvision (and so torch) is never imported by a rank: where a file is missing, its mirrors are
read from torchvision's source, and a child process downloads (``python -m common.data child
mirrors|download``) where one answers, so rank 0 stays free of torch's start-up and memory, and a
torchvision that fails to import (with a CPU build of torch) is one line of the child's. Offline,
that is said without the child (and so before whether torchvision would import).

``python -m common.data download NAME [FOLDER]`` does the same download for users: on a login node
with the internet, before a job whose compute nodes have none.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import gzip
import hashlib
import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional
from urllib.parse import urlparse

import numpy as np

from .argtypes import OneLineParser
from .argtypes import folder as folder_path
from .errors import UsageError, quoted
from .items import seed32

DATASETS = ("mnist", "fashion-mnist", "digits")

#: the four IDX files of MNIST and of Fashion-MNIST (plain or ``.gz``)
IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}

#: where Debian's ``dataset-fashion-mnist`` package puts the files
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
#: how long a child may take to import torchvision, and to download a data set
TORCHVISION_IMPORT_SECONDS = 300
DOWNLOAD_SECONDS = 3600

#: torchvision's class and the folder it downloads into, under the root it is given
_TORCHVISION = {"mnist": ("MNIST", "MNIST/raw"), "fashion-mnist": ("FashionMNIST", "FashionMNIST/raw")}

#: IDX type codes -> big-endian numpy dtypes
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

#: digits: held-out share and the fixed split (the test set must never depend on --seed)
DIGITS_TEST_SIZE = 0.25
DIGITS_SPLIT_STATE = 0


@dataclass
class Dataset:
    """Images as uint8 (n, h, w) on 0-255 and int64 labels 0-9, already split."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    def identity(self) -> str:
        """A hash of the images and labels themselves (not of the files' names or compression): the
        same data read from a moved or unpacked copy has the same identity, other data another."""
        digest = hashlib.sha256()
        for array in (self.x_train, self.y_train, self.x_test, self.y_test):
            contiguous = np.ascontiguousarray(array)
            digest.update(f"{contiguous.dtype.str}{contiguous.shape};".encode())
            digest.update(memoryview(contiguous).cast("B"))
        return f"sha256:{digest.hexdigest()[:16]}"

    @property
    def n_classes(self) -> int:
        """Highest label + 1 (0 for no labels at all, so an empty split fails where it is checked)."""
        labels = np.concatenate([self.y_train.ravel(), self.y_test.ravel()])
        return int(labels.max()) + 1 if labels.size else 0


def default_data_dir() -> Path:
    """``data/`` in the current folder: where the data are downloaded when found nowhere."""
    return Path("data")


def reference_download_dir(name: str) -> Path:
    """``./MNIST/raw`` (``./FashionMNIST/raw``): where the reference's ``torchvision`` download,
    rooted at the current folder, left the IDX files; looked at after ``data/``."""
    return Path(_TORCHVISION[name][1])


# ----- finding files -----
def _check_name(name: str) -> None:
    if name not in DATASETS:
        raise UsageError(f"unknown dataset {name!r}: choose one of {', '.join(DATASETS)}")


def _candidate_dirs(name: str, data_dir: Optional[Path]) -> List[Path]:
    """Folders that may hold the IDX files, in the order they are looked at.

    An explicit ``--data-dir`` is the only place looked at (its root and the usual subfolders):
    results must come from the data the user pointed at, never from a system copy. Without it:
    the default ``data/`` (and its subfolders), then the reference's download in the current
    folder (``./MNIST/raw``), then, for Fashion-MNIST, Debian's copy. The root of ``data/`` is
    searched only for MNIST, so MNIST files lying there are never taken for Fashion-MNIST.
    """
    explicit = data_dir is not None
    root = Path(data_dir) if explicit else default_data_dir()
    if name == "mnist":
        dirs = [root, root / "mnist", root / _TORCHVISION["mnist"][1]]
        return dirs if explicit else dirs + [reference_download_dir(name)]
    dirs = [root / "fashion-mnist", root / _TORCHVISION["fashion-mnist"][1]]
    if explicit:
        return [root] + dirs
    return dirs + [reference_download_dir(name), DEBIAN_FASHION_MNIST]


def _find_in(folder: Path, stem: str, explicit: bool = False) -> Optional[Path]:
    """``stem`` (plain or .gz) in ``folder``. A folder that may not be looked into (is_file passes over
    a missing name only): under an ``explicit`` --data-dir, one line saying so; a default place
    (``data/``, ``./MNIST/raw``, Debian's copy) is then not where the files are."""
    for candidate in (folder / stem, folder / (stem + ".gz")):
        try:
            if candidate.is_file():
                return candidate
        except OSError as error:
            if explicit:
                raise UsageError(f"cannot look for the data set in {quoted(folder)}: {error.strerror or error}") from None
            return None
    return None


def _check_data_dir(data_dir: Optional[Path]) -> None:
    """An explicit --data-dir the filesystem refuses to look up (a name over its limit, no
    permission) is one line, not an OSError from deep in a search."""
    if data_dir is None:
        return
    try:
        os.stat(data_dir)
    except FileNotFoundError:
        pass
    except OSError as error:
        raise UsageError(f"--data-dir {quoted(data_dir)}: cannot be read ({error.strerror or error})") from None


def find_idx_files(name: str, data_dir: Optional[Path] = None) -> Optional[Dict[str, Path]]:
    """The four IDX files of ``name`` from the first folder holding all four, or ``None``."""
    _check_name(name)
    _check_data_dir(data_dir)
    for folder in _candidate_dirs(name, data_dir):
        found = {part: _find_in(folder, stem, data_dir is not None) for part, stem in IDX_FILES.items()}
        if all(found.values()):
            return found  # type: ignore[return-value]
    return None


def _what_is_missing(name: str, data_dir: Optional[Path]) -> str:
    """Which IDX files are missing, from the candidate folder that holds the most of them."""
    folders = _candidate_dirs(name, data_dir)
    if data_dir is not None:
        root = Path(data_dir)
        if root.exists() and not root.is_dir():
            return f"--data-dir {quoted(root)} is not a folder"
        if not root.exists():
            return f"--data-dir {quoted(root)} does not exist (it should hold the IDX files {', '.join(IDX_FILES.values())})"
    explicit = data_dir is not None
    best = max(folders, key=lambda folder: sum(_find_in(folder, stem, explicit) is not None for stem in IDX_FILES.values()))
    missing = [stem for stem in IDX_FILES.values() if _find_in(best, stem, explicit) is None]
    if len(missing) == len(IDX_FILES):
        where = " or ".join(quoted(folder) for folder in folders)
        return f"none of the IDX files {', '.join(IDX_FILES.values())} (plain or .gz) in {where}"
    return f"{quoted(best)} lacks {', '.join(missing)} (plain or .gz)"


#: what a missing data set's message offers instead, unless the app says otherwise (mnist_nn adds --max-macs)
OFFLINE = "--dataset digits"


def _missing_message(name: str, data_dir: Optional[Path], why: str, offline: str = OFFLINE) -> str:
    where = "put the four files in --data-dir" if data_dir is not None else f"put them in {quoted(default_data_dir())}"
    return (f"{name}: {_what_is_missing(name, data_dir)}, and the IDX files cannot be downloaded ({why}); "
            f"{where}, or use {offline}")


def _torchvision_child(*argv: str, timeout: float) -> subprocess.CompletedProcess:
    """``python -m common.data child ARGV`` in a child process (torchvision imports torch: not here)."""
    package_root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    try:
        return subprocess.run([sys.executable, "-m", "common.data", CHILD, *argv], capture_output=True, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 1, "", f"torchvision took more than {timeout:.0f} s")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def _no_torchvision(child: subprocess.CompletedProcess) -> str:
    return (f"torchvision cannot be imported: {_last_line(child.stderr)}; install the torchvision built "
            f"for this torch (in a checkout: make install-torchvision)")


def _mirrors(name: str) -> tuple:
    """(torchvision's download mirrors for ``name``, None), or (None, why torchvision cannot download)."""
    child = _torchvision_child("mirrors", name, timeout=TORCHVISION_IMPORT_SECONDS)
    if child.returncode != 0:
        return None, _no_torchvision(child)
    return json.loads(_last_line(child.stdout)), None


def _mirrors_in_source(name: str) -> Optional[List[str]]:
    """torchvision's mirrors for ``name`` read from its source, without importing it (torch takes
    seconds to import); None where they cannot be read so (no torchvision, another layout), or where
    a ``sitecustomize``/``usercustomize`` that names torchvision ran: it may change them as
    torchvision imports (as a site pointing torchvision at its own mirror would). Debian's and
    Ubuntu's own sitecustomize (apport's hook) does not."""
    if any(_names_torchvision(sys.modules.get(name)) for name in ("sitecustomize", "usercustomize")):
        return None
    try:
        spec = importlib.util.find_spec("torchvision")
        folder = next(iter(spec.submodule_search_locations or []), None) if spec else None
        if folder is None:
            return None
        tree = ast.parse((Path(folder) / "datasets" / "mnist.py").read_text())
        body = next(node.body for node in tree.body
                    if isinstance(node, ast.ClassDef) and node.name == _TORCHVISION[name][0])
        value = next(statement.value for statement in body if isinstance(statement, ast.Assign)
                     and [getattr(target, "id", None) for target in statement.targets] == ["mirrors"])
        mirrors = ast.literal_eval(value)
    except (ImportError, ValueError, OSError, SyntaxError, TypeError, StopIteration):
        return None
    return mirrors if isinstance(mirrors, list) and mirrors and all(isinstance(m, str) for m in mirrors) else None


def _names_torchvision(module: Any) -> bool:
    """Whether a loaded module's source mentions torchvision (unreadable source: assumed so)."""
    if module is None:
        return False
    try:
        return "torchvision" in Path(module.__file__).read_text(errors="replace")
    except (OSError, TypeError, AttributeError):
        return True


def _download_problem(name: str, timeout: float = 3.0) -> Optional[str]:
    """Why the IDX files cannot be downloaded here (torchvision, or no mirror reachable), or ``None``.
    Offline (a compute node, often), that is known without importing torchvision in a child."""
    mirrors = _mirrors_in_source(name)
    read = mirrors is not None
    if not read:
        mirrors, problem = _mirrors(name)
        if problem:
            return problem
    for url in mirrors:
        parsed = urlparse(url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            with socket.create_connection((parsed.hostname, port), timeout=timeout):
                return _mirrors(name)[1] if read else None  # reachable: torchvision must import to fetch
        except OSError:
            continue
    return "offline: no download mirror can be reached"


#: the child's exit code when torchvision cannot be imported (a failed download: 1)
_CHILD_NO_TORCHVISION = 3
#: the first argument of the child's command line (``python -m common.data child ...``)
CHILD = "child"


def _child_main(argv: List[str]) -> int:
    """The child's side: ``mirrors NAME`` prints them as JSON; ``download NAME ROOT`` fetches both
    splits into ROOT. A failure is one line on stderr and exit 1 (``_CHILD_NO_TORCHVISION``: no
    torchvision)."""
    try:
        import torchvision.datasets as tvd

        dataset_class = getattr(tvd, _TORCHVISION[argv[1]][0])  # AttributeError: a torchvision without it
    except Exception as error:  # ImportError, or RuntimeError from a CUDA-only build
        print(str(error).splitlines()[0] if str(error) else type(error).__name__, file=sys.stderr)
        return _CHILD_NO_TORCHVISION
    if argv[0] == "mirrors":
        print(json.dumps(list(getattr(dataset_class, "mirrors", None) or [])))
        return 0
    failure = _download_from_any_mirror(dataset_class, Path(argv[2]))
    if failure is None:
        return 0
    lines = [line.strip() for line in str(failure).splitlines() if line.strip()]
    # torchvision's "Error downloading NAME:" is followed by each mirror's reason on the next lines
    text = " ".join(lines[:3]) if lines and lines[0].endswith(":") else (lines[0] if lines else "")
    print(f"download failed: {type(failure).__name__}: {text}", file=sys.stderr)
    return 1


def _download_from_any_mirror(dataset_class: Any, root: Path) -> Optional[BaseException]:
    """Both splits of ``dataset_class`` into ``root``; None, or the last failure.

    torchvision's own loop first (0.29, installed here, and 0.28 try the next mirror for each file
    that fails); then each mirror alone, because 0.22 (requirements-cu11.txt) goes on to the next
    only after a URLError and ends the download where a mirror serves a file that fails its MD5 (a
    proxy's error page). Passes repeat while one unpacks a file more: torchvision skips the files
    already verified, so mirrors that each lack some file still give all four between them."""
    mirrors = list(getattr(dataset_class, "mirrors", None) or [])
    tries = [mirrors] + ([[mirror] for mirror in mirrors] if len(mirrors) > 1 else [])
    raw = root / dataset_class.__name__ / "raw"

    def unpacked() -> int:
        try:
            return sum(1 for entry in raw.iterdir() if entry.suffix != ".gz")
        except OSError:
            return 0

    failure: Optional[BaseException] = None
    before, now = -1, unpacked()
    while now > before:
        for chosen in tries:
            if mirrors:
                dataset_class.mirrors = chosen
            try:
                dataset_class(root=str(root), train=True, download=True)
                dataset_class(root=str(root), train=False, download=True)
                return None
            except Exception as error:  # noqa: BLE001 -- the next try, then one line
                failure = error
        before, now = now, unpacked()
    return failure


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The data flags every case study takes (--dataset, --data-dir, --subsample, --folds)."""
    parser.add_argument("--dataset", choices=DATASETS, default="mnist", help="data set")
    parser.add_argument("--data-dir", type=folder_path, default=None,
                        help="folder of the IDX files (or its mnist/, fashion-mnist/, MNIST/raw/, FashionMNIST/raw/), "
                             "shared by every node, and the only place looked at; when not given: data/ (MNIST "
                             "only), data/mnist/ or data/fashion-mnist/, data/MNIST/raw/ or data/FashionMNIST/raw/, "
                             "then ./MNIST/raw or "
                             "./FashionMNIST/raw (the reference's torchvision download), then for Fashion-MNIST "
                             "/usr/share/datasets/fashion-mnist; a download goes to data/")
    parser.add_argument("--subsample", type=int, default=None, metavar="N",
                        help="use N training images (stratified) for quick runs; the test set is kept whole")
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds")


def check_data_flags(args: argparse.Namespace) -> None:
    """The data flags' values alone make sense (no file looked at)."""
    if getattr(args, "dataset", None) == "digits" and getattr(args, "data_dir", None) is not None:
        raise UsageError(f"--data-dir {quoted(args.data_dir)} with --dataset digits: the digits come with "
                         f"scikit-learn and are read from no folder; drop --data-dir or name the data set its "
                         f"files are (--dataset mnist or fashion-mnist)")
    if args.folds < 2:
        raise UsageError(f"--folds must be at least 2, got {args.folds}")
    if args.subsample is not None and args.subsample < 2 * args.folds:
        raise UsageError(f"--subsample {args.subsample}: needs at least 2 images per fold "
                         f"({2 * args.folds} for --folds {args.folds})")


def check_available(name: str, data_dir: Optional[Path] = None, offline: str = OFFLINE) -> None:
    """Cheap check on every rank: the files are there, or there is a way to download them;
    ``offline``: the flags the message offers instead (the app's quick run without the files)."""
    _check_name(name)
    if name == "digits" or find_idx_files(name, data_dir) is not None:
        return
    if data_dir is not None and Path(data_dir).exists() and not Path(data_dir).is_dir():
        raise UsageError(f"{name}: --data-dir {quoted(data_dir)} is not a folder")
    problem = _download_problem(name)
    if problem:
        raise UsageError(_missing_message(name, data_dir, problem, offline))


def ensure_available(name: str, data_dir: Optional[Path] = None, offline: str = OFFLINE) -> None:
    """Rank 0, before any work: download the IDX files once through torchvision if missing."""
    _check_name(name)
    if name == "digits" or find_idx_files(name, data_dir) is not None:
        return
    why = download(name, Path(data_dir) if data_dir is not None else default_data_dir())
    if why is not None:
        raise UsageError(_missing_message(name, data_dir, why, offline))
    if find_idx_files(name, data_dir) is None:
        raise UsageError(_missing_message(name, data_dir, "the download left no IDX files", offline))


def download(name: str, root: Path) -> Optional[str]:
    """``name``'s IDX files into ``root`` through torchvision, in a child process; None once done,
    else why not. A download that failed leaves none of the folders it made (``root``, its
    ``MNIST/raw``) where they hold nothing."""
    made = [folder for folder in [root, *root.parents] if not folder.exists()]
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return f"cannot make {quoted(root)}: {error.strerror or error}"
    # one child imports torchvision (seconds of CPU) and downloads: validate() has just checked on this
    # rank that it imports and a mirror answers, so it is not asked for its mirrors once more first
    child = _torchvision_child("download", name, str(root), timeout=DOWNLOAD_SECONDS)
    if child.returncode == 0:
        return None
    inside = root / reference_download_dir(name)  # torchvision's CLASS/raw, made by the child
    for folder in [inside, inside.parent, *made]:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only where empty
    return _no_torchvision(child) if child.returncode == _CHILD_NO_TORCHVISION else _last_line(child.stderr)


# ----- reading -----
def read_idx(path: Path) -> np.ndarray:
    """The whole array of an IDX file (plain or gzip), checked against its header.

    Raises UsageError (one line naming the file) for a bad magic number, an unknown type, or
    a payload whose size does not match the dimensions (truncated or padded).
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise UsageError(f"{quoted(path)}: cannot read: {error.strerror or error}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as error:
            raise UsageError(f"{quoted(path)}: corrupt gzip data ({error})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES or not 1 <= raw[3] <= 4:
        raise UsageError(f"{quoted(path)}: not an IDX file (bad magic number {raw[:4].hex() or 'empty'})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UsageError(f"{quoted(path)}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = math.prod(dims) * dtype.itemsize  # Python ints: a header of huge dimensions cannot overflow
    if len(raw) - header != expected:
        state = "truncated" if len(raw) - header < expected else "longer than its header says"
        raise UsageError(f"{quoted(path)}: {state}: {len(raw) - header} data bytes for dimensions "
                         f"{'x'.join(map(str, dims))} ({expected} expected)")
    array = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return array.astype(dtype.newbyteorder("="))  # native order, and a writable copy


#: the first labels of each split of the published files. MNIST and Fashion-MNIST use the same file
#: names, shapes and classes, so a folder of one given as the other would load and train without a
#: sound: these tell them apart (a data set of one's own starting so by chance: about 1 in 10^16)
PUBLISHED_FIRST_LABELS = {
    "mnist": {"y_train": (5, 0, 4, 1, 9, 2, 1, 3, 1, 4, 3, 5, 3, 6, 1, 7),
              "y_test": (7, 2, 1, 0, 4, 1, 4, 9, 5, 9, 0, 6, 9, 0, 1, 5)},
    "fashion-mnist": {"y_train": (9, 0, 0, 3, 0, 2, 7, 2, 5, 5, 0, 9, 5, 5, 7, 9),
                      "y_test": (9, 2, 1, 1, 6, 1, 4, 6, 5, 7, 4, 5, 7, 3, 4, 1)},
}


def _check_not_the_other(name: str, files: Dict[str, Path], parts: Dict[str, np.ndarray]) -> None:
    """Refuse, in one line, the files of MNIST given as Fashion-MNIST or the other way round."""
    if name not in PUBLISHED_FIRST_LABELS:
        return
    for other, starts in PUBLISHED_FIRST_LABELS.items():
        if other == name:
            continue
        for part, start in starts.items():
            if tuple(parts[part][:len(start)].tolist()) == start:
                raise UsageError(f"--dataset {name}, but {quoted(files[part])} is {other}'s: its labels begin as the "
                                 f"published {other} files' do (the two use the same file names); use --dataset {other}")


def _read_idx_dataset(name: str, files: Dict[str, Path]) -> Dataset:
    """The four IDX files as a Dataset, checked against each other; each problem one line naming the file."""
    parts = {part: read_idx(path) for part, path in files.items()}
    for split in ("train", "test"):
        images, labels = parts[f"x_{split}"], parts[f"y_{split}"]
        images_file, labels_file = files[f"x_{split}"], files[f"y_{split}"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise UsageError(f"{quoted(images_file)}: images {images.shape} do not match labels "
                             f"{labels.shape} in {quoted(labels_file)}")
        if len(images) == 0:
            raise UsageError(f"{quoted(images_file)}: no images (the {split} split is empty)")
        if 0 in images.shape[1:]:
            raise UsageError(f"{quoted(images_file)}: images of {'x'.join(map(str, images.shape[1:]))} pixels: no pixels")
        if images.dtype != np.uint8:
            raise UsageError(f"{quoted(images_file)}: expected uint8 images, got {images.dtype}")
        if labels.dtype.kind not in "iu" or not 0 <= labels.min() <= labels.max() <= 9:
            raise UsageError(f"{quoted(labels_file)}: expected integer labels 0-9, got {labels.dtype} "
                             f"from {labels.min()} to {labels.max()}")
    _check_not_the_other(name, files, parts)
    classes = np.unique(parts["y_train"])
    if len(classes) < 2:  # nothing to classify: no app should train (or cross-validate) on it
        raise UsageError(f"{quoted(files['y_train'])}: every training label is {classes[0]}: a classifier needs "
                         f"images of at least two classes")
    if parts["x_train"].shape[1:] != parts["x_test"].shape[1:]:
        raise UsageError(f"{quoted(files['x_train'])}: images of {'x'.join(map(str, parts['x_train'].shape[1:]))} pixels, "
                         f"but {'x'.join(map(str, parts['x_test'].shape[1:]))} in {quoted(files['x_test'])}")
    return Dataset(name, parts["x_train"], parts["y_train"].astype(np.int64),
                   parts["x_test"], parts["y_test"].astype(np.int64))


def _load_digits() -> Dataset:
    """scikit-learn's 1,797 8x8 digits rescaled from 0-16 to 0-255, split 75/25 stratified."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=DIGITS_TEST_SIZE, stratify=labels, random_state=DIGITS_SPLIT_STATE)
    return Dataset("digits", x_train, y_train, x_test, y_test)


def stratified_subsample(labels: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """Sorted indexes of ``n`` items keeping the class proportions, chosen by ``seed``."""
    from sklearn.model_selection import train_test_split

    total = len(labels)
    n_classes = len(np.unique(labels))
    # each message names the one bound it breaks: a range here would disagree with the folds' own lower
    # bound (check_data_flags), which this function does not know
    if n > total:
        raise UsageError(f"--subsample {n}: more than the {total} training images there are")
    if n < n_classes:
        raise UsageError(f"--subsample {n}: fewer than the {n_classes} classes (it keeps at least one image of each)")
    if n == total:
        return np.arange(total)
    chosen, _ = train_test_split(np.arange(total), train_size=n, stratify=labels, random_state=seed32(seed))
    return np.sort(chosen)


def load_dataset(name: str, data_dir: Optional[Path] = None, *, subsample: Optional[int] = None,
                 seed: int = 0) -> Dataset:
    """Load a data set; ``subsample`` keeps N training images (stratified, by ``seed``).

    The test set is never subsampled, so test errors stay comparable between runs.
    """
    _check_name(name)
    if name == "digits":
        dataset = _load_digits()
    else:
        files = find_idx_files(name, data_dir)
        if files is None:
            raise UsageError(_missing_message(name, data_dir, "not downloaded yet"))
        dataset = _read_idx_dataset(name, files)
    if subsample is not None:
        keep = stratified_subsample(dataset.y_train, subsample, seed)
        dataset.x_train, dataset.y_train = dataset.x_train[keep], dataset.y_train[keep]
    return dataset


def resize_images(images: np.ndarray, size: int = 28) -> np.ndarray:
    """Bilinear resize of (n, h, w) images to (n, size, size), e.g. digits 8x8 -> MNIST's 28x28.

    uint8 in -> uint8 out (rounded, on 0-255); any other dtype -> float32. Deterministic (CPU).
    """
    import torch
    import torch.nn.functional as F

    images = np.asarray(images)
    if images.ndim != 3:
        raise ValueError(f"expected (n, h, w) images, got shape {images.shape}")
    tensor = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32)).unsqueeze(1)
    resized = F.interpolate(tensor, size=(size, size), mode="bilinear", align_corners=False).squeeze(1).numpy()
    if images.dtype == np.uint8:
        return np.clip(np.rint(resized), 0, 255).astype(np.uint8)
    return resized.astype(np.float32, copy=False)


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m common.data download NAME [FOLDER]``: the IDX files of NAME into FOLDER (data/ by
    default, where the apps look), through torchvision as a run would. Exit 0 once they are there, 1
    where they could not be downloaded, 2 for a bad argument."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [CHILD]:
        return _child_main(argv[1:])
    prog = "python -m common.data"
    parser = OneLineParser(prog=prog, description="Download a data set's IDX files to where the apps look for them: "
                                                  "on a login node, before a job whose compute nodes have no internet.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fetch = commands.add_parser("download", help="fetch NAME's four IDX files (through torchvision)")
    fetch.add_argument("name", metavar="NAME", help=f"{', '.join(_TORCHVISION)} (digits come with scikit-learn)")
    fetch.add_argument("folder", metavar="FOLDER", nargs="?", type=folder_path, default=default_data_dir(),
                          help="where they go, the apps' --data-dir (default: data/, where the apps look without one)")
    try:
        args = parser.parse_args(argv)
        _check_name(args.name)
        if args.folder.exists() and not args.folder.is_dir():
            raise UsageError(f"{quoted(args.folder)} is not a folder")
    except UsageError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    if args.name == "digits":
        print("digits: they come with scikit-learn; nothing to download")
        return 0
    there = find_idx_files(args.name, args.folder) is not None
    if not there:
        why = download(args.name, args.folder)
        if why is None and find_idx_files(args.name, args.folder) is None:
            why = "the download left no IDX files"
        if why is not None:
            print(f"{prog}: error: {args.name}: cannot be downloaded into {quoted(args.folder)} ({why})", file=sys.stderr)
            return 1
    found = find_idx_files(args.name, args.folder) or {}
    where = ", ".join(sorted({quoted(path.parent) for path in found.values()}))
    print(f"{args.name}: {'already in' if there else 'downloaded into'} {where} (--data-dir {quoted(args.folder)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
