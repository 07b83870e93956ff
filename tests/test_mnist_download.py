"""``python -m mnist_nn 1 1`` downloads MNIST through torchvision when the IDX files are nowhere: here
against a real HTTP server on 127.0.0.1 serving IDX files (there is no outside network), the
download, the checksums and the files' unpacking all torchvision's own. Only what torchvision takes
from class attributes changes: ``MNIST.mirrors`` (where to fetch) and ``MNIST.resources`` (the file
names with the MD5 sums of the files served, which are scikit-learn's digits at 28x28, not MNIST).

make install installs torch with the torchvision built for it, so this runs in make test; it is
skipped only where torchvision is not installed at all (a venv from an older make install: make
install-torchvision adds it). A torchvision that is installed but does not import (one built for
another torch: 'operator torchvision::nms does not exist') fails it."""
from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import http.server
import importlib.util
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, run

if importlib.util.find_spec("torchvision") is None:
    pytest.skip("torchvision is not installed (make install-torchvision)", allow_module_level=True)


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file of unsigned bytes: magic 0x0000080N, the dimensions big-endian, then the data."""
    return struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def served_files(folder: Path) -> dict:
    """MNIST's four gzip'd IDX files, made from the digits (28x28, uint8); name -> MD5. 300 training
    and 100 test images: the download does not depend on their number, and the run that follows it
    fits on them (a quarter of its CPU time with the 1,500 and 297 served before)."""
    from sklearn.datasets import load_digits

    from common.data import resize_images

    images, labels = load_digits(return_X_y=True)
    images = resize_images((images.reshape(-1, 8, 8) * 16).clip(0, 255).astype(np.uint8))
    parts = {"train-images-idx3-ubyte": images[:300], "train-labels-idx1-ubyte": labels[:300].astype(np.uint8),
             "t10k-images-idx3-ubyte": images[300:400], "t10k-labels-idx1-ubyte": labels[300:400].astype(np.uint8)}
    sums = {}
    for stem, array in parts.items():
        data = gzip.compress(idx_bytes(np.ascontiguousarray(array)), mtime=0)
        (folder / f"{stem}.gz").write_bytes(data)
        sums[f"{stem}.gz"] = hashlib.md5(data).hexdigest()
    return sums


@pytest.fixture
def mirror(tmp_path):
    """A real HTTP server on 127.0.0.1 serving the files; yields (url, md5 sums, requested paths)."""
    served = tmp_path / "mirror"
    served.mkdir()
    sums = served_files(served)
    requested: list = []
    with serving(served, requested) as url:
        yield url, sums, requested


@contextlib.contextmanager
def serving(served: Path, requested: list):
    """A real HTTP server on 127.0.0.1 serving the folder ``served``; yields its URL, and appends
    each path asked for to ``requested``."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002  (http.server's own name)
            requested.append(self.path)

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address):
            """torchvision's first GET of each file only looks for a redirect and hangs up: not an error."""

    server = Server(("127.0.0.1", 0), functools.partial(Handler, directory=str(served)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


#: a sitecustomize whose CHANGES run on ``module`` (torchvision.datasets) right after it is imported
SITECUSTOMIZE = """import importlib.machinery
import sys


class _ChangeTorchvisionDatasets:
    def find_spec(self, name, path=None, target=None):
        if name != "torchvision.datasets":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            CHANGES

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _ChangeTorchvisionDatasets())
"""


def mirrored_program(tmp_path, monkeypatch, mirrors, resources) -> str:
    """``python -c`` code that runs mnist_nn with torchvision's MNIST mirrors (and resources) set.
    The rank asks a child process (``python -m common.data child``) for the mirrors and downloads there,
    so the change is made in a sitecustomize on PYTHONPATH, which every process of the run reads.
    It sets them as torchvision.datasets is imported, not by importing it: only the children that
    download import torchvision (4 s of CPU each here), not every rank, worker and helper process."""
    site = tmp_path / "site"
    site.mkdir()
    changes = [f"module.MNIST.mirrors = {mirrors!r}"]
    if resources is not None:
        changes.append(f"module.MNIST.resources = {resources!r}")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.replace("CHANGES", "; ".join(changes)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    return "import runpy; runpy.run_module('mnist_nn', run_name='__main__', alter_sys=True)"


@pytest.mark.timeout(900)  # two runs, each importing a CUDA build of torch on the CPU
def test_mnist_nn_1_1_downloads_mnist_through_torchvision_from_a_mirror(tmp_path, mirror, monkeypatch):
    url, sums, requested = mirror
    # the order torchvision lists them in; each checked against its MD5 by torchvision
    resources = [(name, sums[name]) for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")]
    program = mirrored_program(tmp_path, monkeypatch, [url], resources)
    data = tmp_path / "data"
    # one torch thread: a second only spins on a shared CPU (16.4 s of CPU for the run, 11 s with one)
    result = run(["-c", program, "1", "1", "--data-dir", str(data), "--gpu", "cpu", "--threads", "1", "--max-macs", "3e5",
                  "--max-epochs", "2", "--folds", "2", "--certainty-images", "0", "--no-progress",
                  "--results", str(tmp_path / "r")], cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr
    # torchvision asks for each file twice: once to follow redirects, once to fetch it
    assert set(requested) == {f"/{name}" for name, _ in resources}
    fetched = len(requested)
    raw = data / "MNIST" / "raw"
    for name, _ in resources:
        assert (raw / name.removesuffix(".gz")).is_file(), name  # torchvision unpacked each one
    assert "ensemble test error: " in result.stdout
    again = run(["-c", program, "1", "1", "--data-dir", str(data), "--gpu", "cpu", "--threads", "1", "--max-macs", "3e5",
                 "--max-epochs", "2", "--folds", "2", "--certainty-images", "0", "--no-progress", "--dry-run"],
                cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert len(requested) == fetched, "found where it was downloaded: not fetched again"


def test_an_unreachable_mirror_is_one_line_naming_what_is_missing(tmp_path, monkeypatch):
    program = mirrored_program(tmp_path, monkeypatch, ["http://127.0.0.1:9/"], None)
    result = run(["-c", program, "1", "1", "--data-dir", str(tmp_path / "data"), "--gpu", "cpu",
                  "--results", str(tmp_path / "r")], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot be downloaded" in lines[0] and "Traceback" not in result.stderr
    # the way on without the files is the README's smoke test: the digits alone can draw a 274M-weight net
    assert lines[0].endswith("or use --dataset digits --max-macs 3e5"), lines[0]
    assert not (tmp_path / "r").exists()


#: torchvision 0.22.1's MNIST.download (requirements-cu11.txt's pin; datasets/mnist.py of its wheel),
#: rewritten: it goes on to the next mirror only after a URLError; a file that fails its MD5 raises
#: RuntimeError out of download_and_extract_archive, which ends the download (0.29, installed here,
#: catches both)
DOWNLOAD_0_22_1 = """import os
from urllib.error import URLError


def _download_0_22_1(self):
    from torchvision.datasets.utils import download_and_extract_archive

    if self._check_exists():
        return
    os.makedirs(self.raw_folder, exist_ok=True)
    for filename, md5 in self.resources:
        errors = []
        for mirror in self.mirrors:
            try:
                download_and_extract_archive(mirror + filename, download_root=self.raw_folder, filename=filename, md5=md5)
            except URLError as error:
                errors.append(error)
                continue
            break
        else:
            raise RuntimeError("Error downloading " + filename + ": " + repr(errors))
"""


def test_mirrors_that_each_fail_a_file_give_all_four_between_them_even_on_torchvision_0_22(tmp_path, mirror,
                                                                                          monkeypatch):
    """The first mirror answers with a file that fails its MD5 (a proxy's page, a truncated copy), the
    second lacks another file. torchvision 0.22.1 raises at the corrupt file and never tries its next
    mirror; the download child then tries each mirror alone, and again while a pass unpacks a file
    more, so the two mirrors still give all four files."""
    url, sums, requested = mirror
    resources = sorted(sums.items())
    corrupt, lacking = resources[0][0], resources[2][0]
    bad, partial = tmp_path / "bad-mirror", tmp_path / "partial-mirror"
    for folder in (bad, partial):
        folder.mkdir()
        for name, _ in resources:
            (folder / name).write_bytes((tmp_path / "mirror" / name).read_bytes())
    (bad / corrupt).write_bytes(b"<html>proxy error</html>")
    (partial / lacking).unlink()
    asked_bad: list = []
    asked_partial: list = []
    with serving(bad, asked_bad) as bad_url, serving(partial, asked_partial) as partial_url:
        site = tmp_path / "site"
        site.mkdir()
        changes = (f"module.MNIST.mirrors = {[bad_url, partial_url]!r}; module.MNIST.resources = {resources!r}; "
                   f"module.MNIST.download = _download_0_22_1")
        (site / "sitecustomize.py").write_text(DOWNLOAD_0_22_1 + SITECUSTOMIZE.replace("CHANGES", changes))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
        child = subprocess.run([sys.executable, "-m", "common.data", "download", "mnist", str(tmp_path / "data")],
                               cwd=REPO, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    assert f"/{corrupt}" in asked_bad and f"/{lacking}" in asked_partial, (asked_bad, asked_partial)
    raw = tmp_path / "data" / "MNIST" / "raw"
    for name, md5 in resources:
        assert hashlib.md5((raw / name).read_bytes()).hexdigest() == md5, name
        assert (raw / name.removesuffix(".gz")).is_file(), name


def test_the_download_command_that_fails_says_why_in_its_own_words_and_leaves_no_empty_folders(tmp_path, monkeypatch):
    """python -m common.data download, from a mirror that answers but has no files: exit 1, one line
    naming the command's own folder (it said "put the four files in --data-dir, or use --dataset
    digits", flags it does not have), and no data/MNIST/raw left empty behind (the child made it)."""
    empty = tmp_path / "empty-mirror"
    empty.mkdir()
    asked: list = []
    with serving(empty, asked) as url:
        mirrored_program(tmp_path, monkeypatch, [url], None)
        done = subprocess.run([sys.executable, "-m", "common.data", "download", "mnist"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join([os.environ["PYTHONPATH"], str(REPO)])))
    assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m common.data: error: mnist: cannot be downloaded into "
                                                   "'data' ("), done.stderr
    assert "--data-dir" not in lines[0] and "--dataset" not in lines[0], lines[0]
    assert asked, "the mirror was never asked"
    assert not (tmp_path / "data").exists()
