"""A missing MNIST is downloaded by a child process: no rank imports torchvision, so none imports
torch. torchvision is the fake of tests/fake_torchvision (the real one cannot reach its mirrors
here): it imports torch and writes small IDX files, from a "mirror" this test serves."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from helpers import REPO

FAKE_TORCHVISION = REPO / "tests" / "fake_torchvision"


def test_a_missing_mnist_is_downloaded_by_a_child_and_the_rank_never_imports_torch(tmp_path):
    """Two children import torchvision (seconds of CPU each): validate's, which asks for the mirrors,
    and rank 0's download; the download does not ask for the mirrors once more."""
    data, results = tmp_path / "data", tmp_path / "results"
    imports = tmp_path / "torchvision-imports"
    script = ("import sys\n"
              "from common.run.runner import main\n"
              "from mnist_svm.app import MnistSvm\n"
              f"code = main(MnistSvm, ['1', '--dataset', 'mnist', '--data-dir', {str(data)!r}, '--gpu', 'cpu', '--threads', '1', "
              f"'--no-progress', '--results', {str(results)!r}])\n"
              "print('exit', code, 'torch' in sys.modules, 'torchvision' in sys.modules)\n")
    with socket.create_server(("127.0.0.1", 0)) as mirror:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FAKE_TORCHVISION), str(REPO)]),
                   FAKE_TORCHVISION_MIRROR=f"http://127.0.0.1:{mirror.getsockname()[1]}/",
                   FAKE_TORCHVISION_IMPORTS=str(imports))
        proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-4:] == ["exit", "0", "False", "False"], proc.stdout
    stems = ["t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "train-images-idx3-ubyte", "train-labels-idx1-ubyte"]
    # as torchvision leaves them: each .gz beside its unpacked file
    assert sorted(p.name for p in (data / "MNIST" / "raw").iterdir()) == sorted(stems + [f"{s}.gz" for s in stems])
    assert (results / "summary.json").is_file()
    assert len(imports.read_text().split()) == 2


def test_a_download_whose_torchvision_cannot_be_imported_says_so_and_leaves_no_data_folder(tmp_path, monkeypatch):
    """ensure_available alone (rank 0's download, called without validate's check first): its one
    child finds no torchvision; one line says so, and the data folder it made is gone again."""
    from common.data import ensure_available
    from common.errors import UsageError

    broken = tmp_path / "broken" / "torchvision"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    monkeypatch.setenv("PYTHONPATH", str(broken.parent))
    with pytest.raises(UsageError) as raised:
        ensure_available("mnist", tmp_path / "data")
    assert "torchvision cannot be imported: operator torchvision::nms does not exist" in str(raised.value)
    assert "\n" not in str(raised.value) and not (tmp_path / "data").exists()


def test_a_torchvision_that_cannot_be_imported_is_one_line_naming_why(tmp_path):
    broken = tmp_path / "broken" / "torchvision"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(broken.parent), str(REPO)]))
    proc = subprocess.run([sys.executable, "-m", "mnist_svm", "1", "--dataset", "mnist", "--data-dir",
                           str(tmp_path / "data"), "--gpu", "cpu", "--results", str(tmp_path / "results")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "torchvision cannot be imported: operator torchvision::nms does not exist" in proc.stderr
    assert not (tmp_path / "results").exists()


def test_fashion_mnist_is_downloaded_into_its_own_folder_by_the_child(tmp_path):
    """The child of ``ensure_available`` for Fashion-MNIST: torchvision's FashionMNIST class, its
    files in FashionMNIST/raw, loaded as the IDX files the apps read."""
    from common.data import read_idx

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FAKE_TORCHVISION), str(REPO)]))
    proc = subprocess.run([sys.executable, "-m", "common.data", "download", "fashion-mnist", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    raw = tmp_path / "FashionMNIST" / "raw"
    assert sorted(p.name for p in raw.glob("*.gz")) == ["t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
                                                        "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"]
    assert read_idx(raw / "train-images-idx3-ubyte").shape == (150, 28, 28)
    assert read_idx(raw / "t10k-labels-idx1-ubyte.gz").shape == (40,)


def data_command(*args: str, cwd, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.data", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(FAKE_TORCHVISION), str(REPO)]),
                                                **env))


def test_the_users_download_command_fills_data_once_and_refuses_bad_arguments_in_one_line(tmp_path):
    """``python -m common.data download mnist data``, which the Slurm generator and docs/slurm.md tell
    users to run on a login node, was the child's own entry point: with no folder it was an
    IndexError traceback, an unknown name a bare KeyError ("'nope'", exit 3), no arguments "list
    index out of range", and it said nothing when it worked."""
    done = data_command("download", "mnist", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "mnist: downloaded into 'data/MNIST/raw' (--data-dir 'data')\n", done.stdout
    assert sorted(p.name for p in (tmp_path / "data" / "MNIST" / "raw").glob("*-ubyte")) == [
        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "train-images-idx3-ubyte", "train-labels-idx1-ubyte"]
    again = data_command("download", "mnist", "data", cwd=tmp_path)
    assert again.returncode == 0 and again.stdout.startswith("mnist: already in "), again.stdout + again.stderr
    (tmp_path / "a-file").write_text("x")
    for args, line in [((), "the following arguments are required: COMMAND (see --help)"),
                       (("fetch",), "argument COMMAND: invalid choice: 'fetch' (choose from 'download') (see --help)"),
                       (("download",), "the following arguments are required: NAME (see --help)"),
                       (("download", "nope"), "unknown dataset 'nope': choose one of mnist, fashion-mnist, digits"),
                       (("download", "mnist", "a-file"), "'a-file' is not a folder")]:
        refused = data_command(*args, cwd=tmp_path)
        assert (refused.returncode, refused.stdout) == (2, ""), (args, refused.stdout + refused.stderr)
        assert refused.stderr == f"python -m common.data: error: {line}\n", (args, refused.stderr)
    digits = data_command("download", "digits", cwd=tmp_path)
    assert digits.returncode == 0 and "nothing to download" in digits.stdout


def test_the_fake_torchvision_takes_what_torchvision_takes(tmp_path):
    """tests/fake_torchvision's dataset classes against the installed torchvision's (the real
    one cannot download here): the same constructor and class attribute ``mirrors``."""
    import importlib.util
    import inspect

    real = pytest.importorskip("torchvision.datasets")
    spec = importlib.util.spec_from_file_location("fake_tv_datasets", FAKE_TORCHVISION / "torchvision" / "datasets.py")
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)

    def plain(function):
        parameters = inspect.signature(function).parameters.values()
        return [(p.name, p.kind, p.default) for p in parameters]

    for name in ("MNIST", "FashionMNIST"):
        assert plain(getattr(fake, name).__init__) == plain(getattr(real, name).__init__), name
        assert isinstance(getattr(fake, name).mirrors, list) and isinstance(getattr(real, name).mirrors, list)
    with pytest.raises(RuntimeError, match="Dataset not found"):
        fake.MNIST(root=str(tmp_path), train=True, download=False)
