"""Apptainer definition files, checked without building (apptainer cannot be installed here).

What a build would trip over is checked for real: every file a definition copies exists, every
path its commands use inside the image was copied there, every project module it runs exists and
takes the flags given, the pinned versions agree with the project's, and the runscript, run by a
real shell with this environment's python, passes arguments and exit codes through.
"""
from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

REPO = Path(__file__).resolve().parents[1]
DEFINITIONS = sorted((REPO / "apptainer").glob("*.def"))
PROJECT_ROOT_IN_IMAGE = "/opt/multinode-gpu"
REQUIREMENTS = {"cuda11.def": "requirements-cu11.txt", "cuda12.def": "requirements-cu12.txt"}


def sections(path: Path) -> Dict[str, str]:
    """``{"header": ..., "files": ..., "post": ...}``: the body of every ``%section``."""
    parts: Dict[str, List[str]] = {"header": []}
    current = "header"
    for line in path.read_text().splitlines():
        match = re.match(r"^%(\w+)\s*$", line)
        if match:
            current = match.group(1)
            parts[current] = []
        else:
            parts[current].append(line)
    return {name: "\n".join(lines) for name, lines in parts.items()}


def commands(script: str) -> List[List[str]]:
    """The script's commands as words (continuation lines joined, comments dropped)."""
    joined = script.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if shlex.split(line, comments=True)]


def copied(definition: Dict[str, str]) -> Dict[str, str]:
    """Destination in the image -> source in the repository, from ``%files``."""
    pairs = {}
    for words in commands(definition["files"]):
        source, destination = words
        pairs[destination.rstrip("/")] = source
    return pairs


def python_module_calls(script: str) -> List[List[str]]:
    """Every ``python -m MODULE ARGS...`` call in a script: ``[MODULE, ARGS...]``."""
    calls = []
    for words in commands(script):
        for i, word in enumerate(words[:-2]):
            if Path(word).name in ("python", "python3") and words[i + 1] == "-m":
                calls.append(words[i + 2:])
    return calls


def test_there_are_cuda11_cuda12_and_cpu_definitions():
    assert {path.name for path in DEFINITIONS} >= {"cuda11.def", "cuda12.def", "cpu.def"}


@pytest.mark.parametrize("path", DEFINITIONS, ids=lambda p: p.name)
def test_definition_has_what_a_build_needs(path):
    definition = sections(path)
    header = dict(line.split(":", 1) for line in definition["header"].splitlines()
                  if ":" in line and not line.startswith("#"))
    assert header["Bootstrap"].strip() == "docker" and header["From"].strip()
    for name in ("files", "environment", "post", "runscript", "test", "help"):
        assert definition.get(name, "").strip(), f"{path.name} has no %{name}"


@pytest.mark.parametrize("path", DEFINITIONS, ids=lambda p: p.name)
def test_every_copied_file_exists(path):
    pairs = copied(sections(path))
    assert pairs
    for destination, source in pairs.items():
        assert (REPO / source).exists(), f"{path.name} copies {source}, which is not in the repository"
        assert destination == f"{PROJECT_ROOT_IN_IMAGE}/{source}"
    # What `pip install /opt/multinode-gpu` needs to build the project, and what it installs.
    for needed in ("setup.cfg", "pyproject.toml", "README.md", "common", "mnist_svm", "mnist_nn"):
        assert needed in pairs.values(), f"{path.name} does not copy {needed}"


@pytest.mark.parametrize("path", DEFINITIONS, ids=lambda p: p.name)
def test_every_path_the_build_uses_in_the_image_was_copied(path):
    definition = sections(path)
    pairs = copied(definition)
    script = definition["post"] + "\n" + definition["test"]
    for used in re.findall(re.escape(PROJECT_ROOT_IN_IMAGE) + r"/([\w./-]+)", script):
        assert f"{PROJECT_ROOT_IN_IMAGE}/{used}" in pairs, f"{path.name} uses {used} without copying it"
    if path.name in REQUIREMENTS:
        assert f"-r {PROJECT_ROOT_IN_IMAGE}/{REQUIREMENTS[path.name]}" in definition["post"].replace("\\\n", " ")


@pytest.mark.parametrize("path", DEFINITIONS, ids=lambda p: p.name)
def test_every_project_command_exists_and_takes_its_flags(path):
    definition = sections(path)
    calls = python_module_calls(definition["test"] + "\n" + definition["post"])
    assert any(call[0] == "mnist_nn" and call[1:3] == ["1", "1"] for call in calls), "%test must run the smoke test"
    for module, *args in calls:
        if module in ("pip", "venv"):
            continue
        assert importlib.util.find_spec(module) is not None, f"{path.name} runs python -m {module}: no such module"
        assert module.split(".")[0] in copied(definition).values()
        helptext = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True,
                                  text=True, timeout=120).stdout
        for flag in [arg for arg in args if arg.startswith("--")]:
            assert re.search(re.escape(flag) + r"(?![\w-])", helptext), f"{path.name}: python -m {module} has no {flag}"
    assert subprocess.run(["sh", "-n", "-c", definition["test"]]).returncode == 0
    assert subprocess.run(["sh", "-n", "-c", definition["post"]]).returncode == 0


@pytest.mark.parametrize("name, requirements", sorted(REQUIREMENTS.items()))
def test_cuda_definitions_install_the_pinned_gpu_stack_from_the_indexes_named(name, requirements):
    text = (REPO / requirements).read_text()
    pins = [line.split("==")[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert pins[:2] == ["torch", "torchvision"] and any(p.startswith("cuml-") for p in pins) \
        and any(p.startswith("cupy-") for p in pins)
    post = sections(REPO / "apptainer" / name)["post"]
    for url in re.findall(r"--extra-index-url (\S+)", post):
        assert url in text, f"{name} installs from {url}, which {requirements} does not name"


def test_cpu_definition_uses_the_torch_the_project_is_tested_with():
    makefile_pin = re.search(r"^TORCH\s*\?=\s*torch==(\S+)", (REPO / "Makefile").read_text(), re.M).group(1)
    post = sections(REPO / "apptainer" / "cpu.def")["post"]
    assert f"torch=={makefile_pin}+cpu" in post


@pytest.mark.parametrize("path", DEFINITIONS, ids=lambda p: p.name)
def test_runscript_is_python_with_the_arguments_passed_through(path, tmp_path):
    """``apptainer run IMAGE -m mnist_nn 1 1`` must be ``python -m mnist_nn 1 1``."""
    runscript = tmp_path / "runscript"
    runscript.write_text(sections(path)["runscript"] + "\n")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}  # `python` is this environment's
    shown = subprocess.run(["sh", str(runscript), "-c", "import sys; print(sys.argv[1:])", "a", "b c", "--x=1"],
                           env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == "['a', 'b c', '--x=1']"
    # -m runs a project module, and its exit code comes back (a usage error is 2).
    module = subprocess.run(["sh", str(runscript), "-m", "common.slurm", "--nodes", "0", "--", "mnist_nn", "1", "1"],
                            env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert module.returncode == 2 and "--nodes 0" in module.stderr


def test_both_cuda_definitions_run_one_test_section():
    cuda11, cuda12 = (sections(REPO / "apptainer" / name)["test"] for name in ("cuda11.def", "cuda12.def"))
    assert cuda11 == cuda12


def test_the_cuda_test_section_passes_in_a_build_inside_a_gpu_job(tmp_path):
    """``apptainer build`` runs %test without --nv and with the host's environment: inside a GPU
    Slurm job CUDA_VISIBLE_DEVICES=0 reaches it, but there is no driver and no nvidia-smi in the
    image. The section, run by a real shell with this environment's python as the image's, must
    pass (the smoke run on the CPU), not fail the build."""
    import shutil

    bin_dir = tmp_path / "bin"  # what the image has on PATH: python and the core utilities, no nvidia-smi
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')  # a venv's, as itself
    (bin_dir / "python").chmod(0o755)
    (bin_dir / "mktemp").symlink_to(shutil.which("mktemp"))
    script = tmp_path / "test.sh"
    script.write_text(sections(REPO / "apptainer" / "cuda12.def")["test"] + "\n")
    env = {"PATH": str(bin_dir), "CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_ID": "4242", "HOME": str(tmp_path),
           "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}  # PYTHONPATH: the image's installed project
    proc = subprocess.run([shutil.which("sh"), str(script)], env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "mnist_nn: complete" in proc.stdout + proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
    # its one certainty figure (of the default hundred: the build's time), drawn in the mktemp folder
    assert [path.name for path in tmp_path.glob("*/results/mnist_nn/certainty/test_image_*.png")] == ["test_image_0.png"]
