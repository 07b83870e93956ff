"""Slurm batch scripts: the generator, and the project's CPU scripts on a real throw-away Slurm.

The generator tests need no Slurm. The others start munge, slurmctld and slurmd for the session
(``slurm_cluster.slurm``) and skip, saying why, where that cannot be done (not root, not installed).
"""
from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from common.errors import quoted
from common.slurm.shipped import SHIPPED, shipped_scripts
from helpers import REPO, TOY, generate_script, journal_entries, read_summary, run, values, wait_for_results, wait_until
from slurm_cluster import slurm  # noqa: F401  (the session's Slurm, a fixture)

GENERATOR = [sys.executable, "-m", "common.slurm"]


# ----- the generator and the shipped scripts (no Slurm needed) -----

def test_shipped_scripts_are_what_the_generator_makes():
    on_disk = {path.name: path.read_text() for path in (REPO / "slurm").glob("*.sbatch")}
    assert on_disk == shipped_scripts(), "slurm/ is out of date: run python -m common.slurm --shipped slurm"


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_script_is_walltime_safe_bash_running_a_real_program(name):
    path = REPO / "slurm" / name
    text = path.read_text()
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    for line in ("#SBATCH --output=%x-%j.out", "#SBATCH --open-mode=append", "#SBATCH --requeue",
                 "#SBATCH --signal=B:USR1@300", "scontrol requeue", "srun --mpi=pmi2"):
        assert line in text, f"{name} lacks {line!r}"
    if "4nodes" in name:
        assert "#SBATCH --nodes=4" in text and "#SBATCH --ntasks-per-node=1" in text
    if "cpu" not in name:
        assert "#SBATCH --gpus-per-node=4" in text and "add_default --gpu all" in text
    words = shlex.split(SHIPPED[name])
    program = words[words.index("--") + 1:]
    assert importlib.util.find_spec(program[0]) is not None, f"{name} runs a module that does not exist"
    for arg in program[1:]:
        if arg.endswith((".json", ".yaml", ".yml", ".py")):
            assert (REPO / arg).is_file(), f"{name} names {arg}, which does not exist"


@pytest.mark.parametrize("args, word", [
    (["--nodes", "0", "--gpus-per-node", "1", "--", "mnist_svm", "4"], "--nodes 0"),
    (["--nodes", "two", "--gpus-per-node", "1", "--", "mnist_svm", "4"], "argument --nodes: invalid int value: 'two' (see --help)"),
    (["--cpu", "--module", "", "--", "mnist_svm", "4"], "--module '': only letters, digits"),  # said "in --bind and --module"
    (["--cpu", "--container", "x.sif", "--bind", "a b", "--", "mnist_svm", "4"], "--bind 'a b': only letters, digits"),
    (["--gpus-per-node", "1", "--time", "25:61:00", "--", "mnist_svm", "4"], "--time"),
    (["--gpus-per-node", "1", "--time", "1 day", "--", "mnist_svm", "4"], "--time"),
    (["--gpus-per-node", "1", "--time", "2-25", "--", "mnist_svm", "4"], "hours after a day count below 24"),
    (["--gpus-per-node", "1", "--time", "90:60", "--", "mnist_svm", "4"], "after the first part must be below 60"),
    (["--gpus-per-node", "1", "--", "python", "-m", "mnist_svm", "4"],
     "command python -m mnist_svm: give the program without its interpreter: -- mnist_svm 4 (the job starts it with "
     "python -m itself)"),
    (["--gpus-per-node", "1", "--", "python3.11", "-m", "mnist_svm", "4"], "give the program without its interpreter"),
    (["--gpus-per-node", "1", "--", ".venv/bin/python3", "tests/toy_app.py", "3"], "-- tests/toy_app.py 3 (the job"),
    (["--gpus-per-node", "1", "--time", "99999-00:00:00", "--", "mnist_svm", "4"], "at most 365 days"),
    (["--gpus-per-node", "1", "--time", "00:04:00", "--", "mnist_svm", "4"], "warning"),
    # Slurm may warn up to 60 s early: every start would stop before any work (it was accepted)
    (["--gpus-per-node", "1", "--time", "00:06:00", "--", "mnist_svm", "4"],
     "--time 00:06:00 leaves 60 s before the 300 s walltime warning, which Slurm may send up to 60 s early"),
    (["--gpus-per-node", "1", "--time", "01:00:00"], "no command"),
    (["--gpus-per-node", "1", "--"], "no command"),
    (["--gpus-per-node", "0", "--", "mnist_svm", "4"], "--gpus-per-node 0"),
    (["--", "mnist_svm", "4"], "a GPU job needs --gpus-per-node N (the GPUs each node gives the run), or --cpu"),
    (["--cpu", "--gpus-per-node", "2", "--", "mnist_svm", "4"], "--cpu"),
    (["--gpus-per-node", "1", "--mpi", "none", "--", "mnist_svm", "4"], "--mpi"),
    (["--gpus-per-node", "1", "--", "mnist-svm;rm", "4"], "module"),
    (["--gpus-per-node", "1", "--bind", "/data", "--", "mnist_svm", "4"], "--container"),
    (["--gpus-per-node", "4", "--ntasks-per-node", "2", "--", "mnist_svm", "4"], "--ntasks-per-node 2 with GPUs"),
    (["--gpus-per-node", "1", "--", "mnist_svm", "4", "--results", "a\nb"], "control characters"),
    (["--nodes", "99999999999", "--gpus-per-node", "1", "--", "mnist_svm", "4"], "--nodes 99999999999: at most"),
    (["--gpus-per-node", "1000", "--", "mnist_svm", "4"], "--gpus-per-node 1000: at most"),
    (["--gpus-per-node", "a100:x", "--", "mnist_svm", "4"], "--gpus-per-node 'a100:x': expected a number of GPUs, or TYPE:N"),
    (["--gpus-per-node", "a100:0", "--", "mnist_svm", "4"], "--gpus-per-node a100:0: a GPU job needs at least one GPU"),
    (["--gpus-per-node", "a$(x):2", "--", "mnist_svm", "4"], "a type is letters, digits and . _ -"),
    (["--gpus-per-node", "gpu:a100:4", "--", "mnist_svm", "4"], "--gpus-per-node 'gpu:a100:4': expected a number"),
    (["--gpus-per-node", "4_0", "--", "mnist_svm", "4"], "--gpus-per-node '4_0': expected a number"),
    (["--gpus-per-node", "a100:1000", "--", "mnist_svm", "4"], "--gpus-per-node a100:1000: at most"),
    (["--cpu", "--gpus-per-node", "0", "--", "mnist_svm", "4"], "--cpu with --gpus-per-node"),
    # the program's own checks and the files it names, before a script waits in the queue
    (["--gpus-per-node", "1", "--", "mnist_sv", "4"], "unknown app 'mnist_sv': expected one of mnist_svm, mnist_nn"),
    (["--gpus-per-node", "1", "--", "mnist_svm", "142"], "mnist_svm: n_tuning 142 with 5 folds is 100,820 fits"),
    (["--gpus-per-node", "1", "--", "mnist_svm", "4", "--folds", "0"], "mnist_svm: --folds must be at least 2"),
    (["--gpus-per-node", "1", "--", "mnist_nn", "1", "1", "--max-epochs", "0"], "mnist_nn: argument --max-epochs"),
    (["--gpus-per-node", "1", "--", "mnist_svm", "4", "--flods", "3"], "unrecognized arguments: --flods 3"),
    (["--gpus-per-node", "1", "--", "mnist_svm", "4", "--gpu", "zero"], "--gpu 'zero'"),
    # GPUs asked for and left idle, or a flag the GPUs would make the run ignore
    (["--gpus-per-node", "4", "--", "mnist_nn", "12", "12", "--gpu", "cpu"], "--gpu cpu in a GPU job"),
    (["--gpus-per-node", "4", "--", "mnist_svm", "4", "--workers", "8"], "--workers 8 with --gpu all: on GPUs"),
    (["--gpus-per-node", "1", "--", "mnist_svm", "4", "--help"], "the job would only print its help"),
    (["--gpus-per-node", "1", "--", "common.pipeline", "no-such.json"], "'no-such.json': no such pipeline definition"),
    (["--gpus-per-node", "1", "--", "common.pipeline", "README.md"], "README.md: not valid JSON"),
    (["--gpus-per-node", "1", "--", "common.pipeline", "examples/pipelines/ml.json", "--resume", "ml/train"],
     "--resume 'ml/train': no pipeline 'ml'"),
    (["--cpu", "--", "mnist_svm", "4", "--gpu", "0"], "a CPU job (--cpu) is given no GPU"),
    (["--cpu", "--", "mnist_svm", "2", "--workers-per-gpu", "3"], "--workers-per-gpu 3 with --gpu cpu"),
    (["--gpus-per-node", "2", "--", "mnist_svm", "2", "--gpu", "cpu", "--workers-per-gpu", "3"],
     "--gpu cpu in a GPU job"),  # its GPUs idle: refused before the workers it would put on none
    (["--gpus-per-node", "1", "--", "no_such_script.py"], "'no_such_script.py': no such file"),
    (["--gpus-per-node", "1", "--container", "no-such.sif", "--", "mnist_svm", "4"],
     "--container 'no-such.sif': no such image file"),
    (["--gpus-per-node", "1", "--container", "x" * 300, "--", "mnist_svm", "4"], "File name too long"),
    (["--shipped", ""], "--shipped: expected a folder, got an empty path"),  # not the current folder
    (["--shipped", "README.md"], "--shipped 'README.md': cannot write"),
    (["--shipped", "README.md/slurm"], "--shipped 'README.md/slurm': cannot write"),
    (["--shipped", "slurm", "--nodes", "2", "--cpu"], "--shipped takes no other options (got --nodes, --cpu)"),
    (["--shipped", "slurm", "--", "mnist_svm", "4"], "--shipped takes no other options (got -- mnist_svm 4)"),
])
def test_bad_combination_is_a_one_line_error(args, word):
    done = generate_script(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert word in done.stderr


def test_a_typed_gpu_request_goes_to_sbatch_and_srun_as_slurm_takes_it():
    """--gpus-per-node a100:4 (clusters with several GPU types): the #SBATCH line and the step ask
    for that type, each rank gets 4 CPUs per GPU, and the script's own command line says it."""
    made = generate_script("--nodes", "2", "--gpus-per-node", "a100:4", "--", "mnist_nn", "1", "1")
    assert made.returncode == 0, made.stderr
    assert "#SBATCH --gpus-per-node=a100:4\n" in made.stdout and "#SBATCH --cpus-per-task=16\n" in made.stdout
    assert made.stdout.count('--gpus-per-node="${SLURM_GPUS_PER_NODE:-a100:4}"') == 2  # the step and its restart
    assert "python -m common.slurm --nodes 2 --gpus-per-node a100:4 " in made.stdout


def test_programs_that_pass_their_own_checks_get_a_script():
    """The shipped apps with good arguments (no data needed on the login node), a pipeline whose
    definition exists, a script file and a user's own importable module."""
    for program in (["mnist_svm", "24", "--batch", "50"], ["mnist_nn", "12", "12", "--dataset", "fashion-mnist"],
                    ["common.pipeline", "examples/pipelines/sweep.json", "--resume"],
                    ["common.pipeline", "examples/pipelines/ml.json", "--resume", "digits-cnn/train"],
                    ["tests/toy_app.py", "3"],
                    ["common.status", "results"]):
        made = generate_script("--gpus-per-node", "1", "--", *program)
        assert made.returncode == 0 and made.stdout.startswith("#!/bin/bash"), made.stderr


def test_a_sweep_from_the_shell_is_checked_before_the_queue(tmp_path):
    """common.sweep is a shipped app: its flags, that its module can be found from the submit folder
    (found, not imported: the job imports it), and that its space's file reads and makes points."""
    (tmp_path / "my_sweep.py").write_text("raise SystemExit('imported on the login node')\ndef fit(params):\n    return {}\n")
    (tmp_path / "grid.json").write_text(json.dumps({"x": [1, 2]}))
    (tmp_path / "bad.json").write_text(json.dumps({"x": 3}))

    def generated(*program: str) -> subprocess.CompletedProcess:
        return subprocess.run([*GENERATOR, "--gpus-per-node", "1", "--", "common.sweep", *program], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)

    good = generated("my_sweep:fit", "--grid", "grid.json", "--minimise", "loss")
    assert good.returncode == 0 and good.stdout.startswith("#!/bin/bash"), good.stderr
    for program, message in ((["my_swep:fit", "--grid", "grid.json"], "common.sweep: cannot find module 'my_swep' from "),
                             (["my_sweep:fit", "--grid", "grid.jsn"], "common.sweep: --grid 'grid.jsn': cannot read it"),
                             (["my_sweep:fit", "--grid", "bad.json"], "the grid's 'x' must be a list of values, got an integer"),
                             (["my_sweep", "--grid", "grid.json"], "must look like module:function"),
                             (["my_sweep:fit"], "say what to sweep: --grid FILE, --points FILE or --space FILE")):
        refused = generated(*program)
        assert refused.returncode == 2 and refused.stdout == "", refused
        assert refused.stderr.count("\n") == 1 and message in refused.stderr, refused.stderr


def test_a_script_named_like_the_interpreter_is_a_script():
    """``-- python_runner.py other.py`` was refused as if ``python_runner.py`` were the interpreter."""
    made = generate_script("--cpu", "--", "tests/python_runner.py", "other.py")
    assert made.returncode == 2 and "no such file" in made.stderr and "interpreter" not in made.stderr, made.stderr
    from common.slurm.spec import program_of

    assert program_of(["python_runner.py", "other.py"]) == (["python", "python_runner.py"], "python_runner")


def test_a_scripts_file_name_sbatch_cannot_read_becomes_a_job_name_it_can(tmp_path):
    """The job's default name is the script's file name, which may hold a space or a quote: sbatch
    splits an #SBATCH line at a space and refuses a lone quote ('Unmatched'), so those became a job
    that could not be submitted."""
    script = tmp_path / "my sweep's.py"
    script.write_text("print('hi')\n")
    made = generate_script("--cpu", "--", str(script))
    assert made.returncode == 0, made.stderr
    assert "#SBATCH --job-name=my_sweep_s\n" in made.stdout, made.stdout[:300]
    named = generate_script("--cpu", "--job-name", "mine", "--", str(script))
    assert "#SBATCH --job-name=mine\n" in named.stdout


def test_every_walltime_form_sbatch_takes_is_taken():
    """``--time 90`` was refused ("expected HH:MM:SS or D-HH:MM:SS"), though sbatch takes minutes,
    MM:SS, HH:MM:SS, D-HH, D-HH:MM and D-HH:MM:SS; the script's #SBATCH line keeps the form given."""
    from common.slurm.spec import parse_walltime

    assert [parse_walltime(text) for text in ("90", "90:30", "12:00:00", "2-12", "2-12:30", "1-00:00:01")] == \
        [5400, 5430, 43200, 216000, 217800, 86401]
    made = generate_script("--gpus-per-node", "1", "--time", "90", "--", "mnist_svm", "4", "--dataset", "digits")
    assert made.returncode == 0 and "#SBATCH --time=90\n" in made.stdout, made.stderr


def test_a_results_folder_the_jobs_resume_would_refuse_is_refused_before_the_queue(tmp_path):
    """The job adds --resume: a --results that is a file, or holds another run's journal (another
    app, seed or set of pipelines), was refused only as the job started, after its wait in the
    queue. The generator now says so; the same run's folder, or a new one, gets its script."""
    definition = tmp_path / "one.json"
    definition.write_text(json.dumps({"name": "one", "steps": [{"id": "a", "command": "true"}]}))
    results = tmp_path / "results"
    ran = run(["-m", "common.pipeline", str(definition), "--gpu", "cpu", "--results", str(results), "--no-progress"])
    assert ran.returncode == 0, ran.stderr
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"name": "other", "steps": [{"id": "a", "command": "true"}]}))
    (tmp_path / "a-file").write_text("x")
    for command, why in [
            (["common.pipeline", str(other), "--results", str(results)], "pipelines ['one'] (journal) vs ['other'] (now)"),
            (["mnist_svm", "2", "--dataset", "digits", "--results", str(results)], "app 'pipeline' (journal) vs 'mnist_svm'"),
            (["common.pipeline", str(definition), "--results", str(results), "--seed", "5"], "seed 0 (journal) vs 5 (now)"),
            (["mnist_svm", "2", "--results", str(tmp_path / "a-file")], f"--results '{tmp_path / 'a-file'}' is not a folder"),
            (["mnist_svm", "2", "--results", str(tmp_path / ("x" * 300))], "cannot write there (File name too long)")]:
        made = generate_script("--cpu", "--venv", "none", "--", *command)
        assert made.returncode == 2 and made.stdout == "", made.stdout[:200] + made.stderr
        assert made.stderr.startswith(f"python -m common.slurm: error: {command[0]}: ") and why in made.stderr, made.stderr
        assert len(made.stderr.splitlines()) == 1, made.stderr
    same = generate_script("--cpu", "--venv", "none", "--", "common.pipeline", str(definition), "--results", str(results))
    assert same.returncode == 0 and same.stdout.startswith("#!/bin/bash"), same.stderr
    fresh = generate_script("--cpu", "--venv", "none", "--", "common.pipeline", str(other), "--results", str(tmp_path / "new"))
    assert fresh.returncode == 0, fresh.stderr


def test_an_image_given_as_a_uri_is_noted_with_how_to_build_it_once():
    made = generate_script("--cpu", "--venv", "none", "--container", "docker://python:3.11", "--",
                           "mnist_svm", "2", "--dataset", "digits")
    assert made.returncode == 0 and "apptainer exec docker://python:3.11" in made.stdout, made.stderr
    assert made.stderr == ("python -m common.slurm: note: --container docker://python:3.11: every node's apptainer asks "
                           "the registry for it at each start of the job, and the first start pulls and converts it on "
                           "all nodes at once; build it once here instead (apptainer build image.sif "
                           "docker://python:3.11) and give --container image.sif\n")
    plain = generate_script("--cpu", "--venv", "none", "--", "mnist_svm", "2", "--dataset", "digits")
    assert plain.returncode == 0 and plain.stderr == "", plain.stderr


def test_a_data_set_missing_here_is_noted_before_the_queue(tmp_path, monkeypatch):
    """The GPU scripts read MNIST by default; submitted from a folder without it, the job would try
    to download it on a compute node, after its wait in the queue (many have no internet): the
    generator says so, and how to download it first, but still writes the script."""
    def generated(*program: str) -> subprocess.CompletedProcess:  # --venv: the note of test_a_venv_... only
        return subprocess.run([*GENERATOR, "--gpus-per-node", "1", "--venv", str(REPO / ".venv"), "--", *program],
                              cwd=tmp_path, capture_output=True, text=True, timeout=60)

    missing = generated("mnist_svm", "24")
    assert missing.returncode == 0 and missing.stdout.startswith("#!/bin/bash"), missing.stderr
    assert missing.stderr.count("\n") == 1 and missing.stderr.startswith("python -m common.slurm: note: mnist: its "
                                                                        "files are not in data/"), missing.stderr
    assert missing.stderr.rstrip().endswith("download them here first: python -m common.data download mnist data")
    elsewhere = generated("mnist_nn", "1", "1", "--data-dir", "scratch/my mnist")
    assert "not in 'scratch/my mnist' here" in elsewhere.stderr, elsewhere.stderr
    assert "download mnist 'scratch/my mnist'" in elsewhere.stderr  # a command that can be pasted
    import common.data
    from common.slurm.program import check_program, data_note

    monkeypatch.setattr(common.data, "find_idx_files", lambda *args: None)  # no Debian copy here either
    assert "the reference's ./FashionMNIST/raw" in (data_note(check_program(["mnist_nn", "1", "1", "--dataset", "fashion-mnist"])) or "")
    # in a container, --data-dir is the container's path (a --bind target): not this host's to look at
    assert data_note(check_program(["mnist_svm", "4", "--data-dir", "/data"]), container="img.sif") is None
    assert generated("mnist_svm", "4", "--dataset", "digits").stderr == ""  # scikit-learn's: nothing to fetch


def test_a_venv_missing_from_the_submit_folder_is_noted_and_a_python_missing_on_the_node_is_one_line(tmp_path):
    """A sweep of one's own module is submitted from one's own folder, which has no .venv: the job
    ran whatever python the PATH it was submitted with had, and where there was none, srun failed
    every rank. The generator notes it (naming the venv running it); the script says so in one
    line before starting anything."""
    (tmp_path / "mine.py").write_text("def fit(params):\n    return {}\n")
    (tmp_path / "grid.json").write_text(json.dumps({"x": [1]}))

    def generated(*options: str, program=("common.sweep", "mine:fit", "--grid", "grid.json")):
        return subprocess.run([*GENERATOR, "--cpu", *options, "--", *program], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)

    made = generated()
    assert made.returncode == 0 and made.stdout.startswith("#!/bin/bash"), made.stderr
    assert made.stderr == "python -m common.slurm: note: --venv .venv: no virtual environment there from this folder, " \
        "where the job starts; it would run the python on the PATH it is submitted with; give --venv " \
        f"{shlex.quote(sys.prefix)} (the one running this)\n", made.stderr
    assert generated("--venv", sys.prefix).stderr == "" and generated("--venv", "none").stderr == ""
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "activate").write_text("")
    assert generated().stderr == ""
    # a --setup in a module of its own is looked for as the function's is
    refused = generated(program=("common.sweep", "mine:fit", "--grid", "grid.json", "--setup", "mnie:load"))
    assert refused.returncode == 2 and refused.stdout == "", refused
    assert refused.stderr == f"python -m common.slurm: error: common.sweep: --setup cannot find module 'mnie' from " \
                             f"{quoted(str(tmp_path))}, where the job starts\n", refused.stderr
    # the job finds no python on its node (no venv, none active at sbatch): one line, exit 2, no step (srun would
    # fail every rank with exit 2 and slurmstepd's "execve(): python: No such file or directory")
    script, env, calls = recorded_job(tmp_path, 'echo started >> "$CALLS"; exit 0')
    env["PATH"] = f"{tmp_path / 'bin'}:/usr/bin:/bin"
    assert shutil.which("python", path=env["PATH"]) is None
    ran = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 2 and not calls.exists(), ran.stdout + ran.stderr
    assert f"python: not on PATH on {socket.gethostname()} (give the generator --venv, or --module): the run was not " \
           "started" in ran.stdout + ran.stderr, ran.stdout + ran.stderr


def test_the_image_a_node_lacks_is_named_in_quotes():
    """The check on each node printed `the image multinode-gpu-cu12.sif: ...`: the quotes around it
    were the shell's, which ended the string."""
    text = (REPO / "slurm" / "mnist_svm-4nodes-apptainer.sbatch").read_text()
    line = next(line for line in text.splitlines() if line.strip().startswith("log \"the image"))
    shown = subprocess.run(["bash", "-c", f"log() {{ echo \"$*\"; }}; hostname() {{ echo node1; }}; PWD=/sub; {line.strip()}"],
                           capture_output=True, text=True, timeout=10).stdout
    assert shown.startswith('the image "multinode-gpu-cu12.sif": no such file or folder in /sub on node1'), shown


def test_placeholders_in_the_users_arguments_and_spaces_around_time_stay_as_given():
    made = generate_script("--gpus-per-node", "1", "--time", " 02:00:00 ", "--", "mnist_svm", "24", "--results", "{{warning}}")
    assert made.returncode == 0, made.stderr
    assert "APP_ARGS=(24 --results '{{warning}}')" in made.stdout
    # the script's example of other arguments names another folder, not a second --results
    assert "#   sbatch THIS_SCRIPT 24 --results /scratch/me/run1\n" in made.stdout
    assert "#SBATCH --time=02:00:00\n" in made.stdout and "--time 02:00:00 --" in made.stdout


def other_notes(stderr: str) -> list:
    """The generator's lines but its note that MNIST is not here (test_a_data_set_missing_here_...)."""
    return [line for line in stderr.splitlines() if not line.startswith("python -m common.slurm: note: mnist: ")]


def container_job(tmp_path: Path, bind: str):
    """A 2-node GPU job script in a container binding ``bind``, and how to run it with ``srun``
    replaced by a recorder of its arguments (apptainer cannot run here): (generator's result, run)."""
    image = tmp_path / "img.sif"
    image.write_bytes(b"")  # the generator checks that the image exists
    made = generate_script("--nodes", "2", "--gpus-per-node", "2", "--time", "01:00:00", "--container", str(image),
                    "--bind", bind, "--", "mnist_nn", "1", "1")
    assert made.returncode == 0, made.stderr
    script = tmp_path / "job.sbatch"
    script.write_text(made.stdout)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    recorder = bin_dir / "srun"
    recorder.write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$ARGV_FILE"\nexit 0\n')
    recorder.chmod(0o755)
    apptainer = bin_dir / "apptainer"  # on PATH, as the script checks (srun's recorder never runs it)
    apptainer.write_text("#!/bin/bash\nexit 99\n")
    apptainer.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ARGV_FILE=str(tmp_path / "argv"),
               SLURM_SUBMIT_DIR=str(tmp_path), SLURM_JOB_ID="7", SLURM_JOB_NUM_NODES="2",
               SLURM_CPUS_PER_TASK="8")
    return made, lambda *script_args, **changes: subprocess.run(
        ["bash", str(script), *script_args], env={k: v for k, v in {**env, **changes}.items() if v is not None},
        capture_output=True, text=True, timeout=30)


def test_script_runs_the_program_in_the_container_with_the_engine_flags(tmp_path):
    """The script's own logic, with ``srun`` replaced by a recorder."""
    (tmp_path / "data").mkdir()
    bind = f"{tmp_path / 'data'}:/data"
    made, job = container_job(tmp_path, bind)
    assert other_notes(made.stderr) == []

    def srun_argv(*script_args: str):
        done = job(*script_args)
        assert done.returncode == 0, done.stdout + done.stderr
        return (tmp_path / "argv").read_text().splitlines()

    launch = ["--mpi=pmi2", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=8", "--gpus-per-node=2",
              "--kill-on-bad-exit=0", "--no-kill", "apptainer", "exec", "--nv", "--bind", bind, str(tmp_path / "img.sif"),
              "python", "-m", "mnist_nn"]
    assert srun_argv() == launch + ["1", "1", "--gpu", "all", "--grace", "240", "--resume"]
    # Arguments after the script replace the defaults; flags they set are not added again.
    assert srun_argv("2", "2", "--gpu", "0", "--resume") == launch + ["2", "2", "--gpu", "0", "--resume", "--grace", "240"]


def test_pmix_with_the_mpich_wheel_is_written_with_a_note(tmp_path):
    """srun --mpi=pmix suits an Open MPI build; the project's images and this environment (make
    install's mpich wheel) carry MPICH without PMIx: written (a site's own build may be Open MPI),
    with one note."""
    image = tmp_path / "img.sif"
    image.write_bytes(b"")
    import importlib.metadata

    try:
        importlib.metadata.distribution("mpich")
        wheel_here = True
    except importlib.metadata.PackageNotFoundError:  # an environment with its own MPI: no note without a container
        wheel_here = False
    for where, container in (("the project's images carry", ["--container", str(image)]),
                             ("this environment's mpi4py runs on", [])):
        made = generate_script("--gpus-per-node", "1", *container, "--mpi", "pmix", "--", "mnist_nn", "1", "1")
        assert made.returncode == 0 and "srun --mpi=pmix " in made.stdout, made.stderr
        noted = [f"python -m common.slurm: note: --mpi pmix: {where} the mpich wheel, built without PMIx, whose "
                 f"ranks would each start as a world of size 1; keep pmix only for an Open MPI build (docs/slurm.md), "
                 f"else use --mpi pmi2"]
        assert other_notes(made.stderr) == (noted if container or wheel_here else []), made.stderr
    assert other_notes(generate_script("--gpus-per-node", "1", "--container", str(image), "--", "mnist_nn", "1",
                                       "1").stderr) == []


def test_a_bind_source_missing_on_the_node_ends_the_job_in_one_line_before_srun(tmp_path):
    """apptainer would refuse the mount on every rank and the step be started again three times: the
    script checks each source first (several joined by commas too); the generator notes one it cannot
    see (it may be on the compute nodes only) and still writes the script."""
    (tmp_path / "data").mkdir()
    missing = tmp_path / "scratch"
    made, job = container_job(tmp_path, f"{tmp_path / 'data'}:/data,{missing}:/scratch:ro")
    assert other_notes(made.stderr) == [f"python -m common.slurm: note: --bind {missing}: not found on this host; the "
                                        f"job checks it again on its first node and ends with one line if it is "
                                        f"missing there"]
    done = job()
    assert done.returncode == 2, done.stdout + done.stderr
    assert not (tmp_path / "argv").exists()  # srun never ran
    assert done.stdout.splitlines()[-1].endswith(f"--bind {missing}: no such file or folder on "
                                                 f"{socket.gethostname()}: the run was not started"), done.stdout
    missing.mkdir()  # there now (a folder the compute nodes have): the job starts
    assert job().returncode == 0 and (tmp_path / "argv").exists()


def test_no_apptainer_or_no_image_on_the_node_ends_the_job_in_one_line_before_srun(tmp_path):
    """Without apptainer on PATH (a module not loaded) srun failed on every rank, even tried the
    checkout's apptainer/ folder ("Permission denied"), and the step was started again three times;
    an image gone since the script was made, the same. Each is now one line and exit 2, srun never run."""
    (tmp_path / "data").mkdir()
    made, job = container_job(tmp_path, f"{tmp_path / 'data'}:/data")
    (tmp_path / "bin" / "apptainer").unlink()
    done = job(PATH=f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert done.returncode == 2 and not (tmp_path / "argv").exists(), done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].endswith(f"apptainer: not on PATH on {socket.gethostname()} (load its module: "
                                                 f"--module): the run was not started"), done.stdout
    (tmp_path / "bin" / "apptainer").write_text("#!/bin/bash\nexit 99\n")
    (tmp_path / "bin" / "apptainer").chmod(0o755)
    (tmp_path / "img.sif").unlink()
    done = job()
    assert done.returncode == 2 and not (tmp_path / "argv").exists(), done.stdout + done.stderr
    image = tmp_path / "img.sif"
    assert done.stdout.splitlines()[-1].endswith(f'the image "{image}": no such file or folder on '
                                                 f"{socket.gethostname()}: the run was not started")
    (tmp_path / "img.sif").write_bytes(b"")
    assert job().returncode == 0 and (tmp_path / "argv").exists()


def test_a_script_run_outside_a_job_or_in_salloc_or_whose_module_fails_says_so(tmp_path):
    """bash THIS_SCRIPT outside Slurm gave "SLURM_JOB_NUM_NODES: unbound variable", and inside an
    salloc without --cpus-per-task "SLURM_CPUS_PER_TASK: unbound variable"; a module that did not load
    was passed over and the run went on without it."""
    (tmp_path / "data").mkdir()
    made, job = container_job(tmp_path, f"{tmp_path / 'data'}:/data")
    script = tmp_path / "job.sbatch"
    done = job(SLURM_JOB_ID=None)
    assert done.returncode == 2 and done.stdout == "" and not (tmp_path / "argv").exists(), done
    assert done.stderr == f"{script}: not in a Slurm job: submit it with sbatch {script} [arguments]\n"
    assert job(SLURM_CPUS_PER_TASK=None).returncode == 0  # salloc -N2 without --cpus-per-task: one CPU a task
    assert "--cpus-per-task=1" in (tmp_path / "argv").read_text().splitlines()
    with_module = generate_script("--nodes", "2", "--cpu", "--time", "01:00:00", "--module", "nosuch/1.0", "--",
                                  "mnist_nn", "1", "1")
    assert with_module.returncode == 0, with_module.stderr
    script.write_text(with_module.stdout)
    (tmp_path / "argv").unlink()
    done = job()  # no module command here at all: as a misspelt module, it fails
    assert done.returncode == 2 and not (tmp_path / "argv").exists(), done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].endswith("module load nosuch/1.0 failed: the run was not started"), done.stdout
    module = tmp_path / "bin" / "module"
    module.write_text("#!/bin/bash\nexit 0\n")
    module.chmod(0o755)
    assert job().returncode == 0 and (tmp_path / "argv").exists()


def recorded_job(tmp_path: Path, srun: str, command: tuple = ("mnist_nn", "1", "1")) -> tuple:
    """A generated CPU script for ``command`` whose ``srun`` runs ``srun`` (bash), whose ``scontrol``
    records its arguments and whose ``squeue`` says the job's time left as $SQUEUE_LEFT (unset:
    nothing, as where squeue cannot answer): (the script, its environment, the file of calls)."""
    made = generate_script("--nodes", "2", "--cpu", "--time", "01:00:00", "--", *command)
    assert made.returncode == 0, made.stderr
    script = tmp_path / "job.sbatch"
    script.write_text(made.stdout)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", srun), ("scontrol", 'echo "scontrol $*" >> "$CALLS"'),
                       ("squeue", 'echo "${SQUEUE_LEFT:-}"')):
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CALLS=str(calls), SLURM_SUBMIT_DIR=str(tmp_path),
               SLURM_JOB_ID="7", SLURM_JOB_NUM_NODES="2", SLURM_CPUS_PER_TASK="2")
    return script, env, calls


def warned_once_started(script: Path, env: dict, calls: Path) -> tuple:
    """Run the recorded job, send its shell the walltime warning once its step has started: (exit
    code, what the script printed)."""
    job = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert wait_until(lambda: calls.exists() and calls.read_text() == "started\n", timeout=20)
    job.send_signal(signal.SIGUSR1)
    out, _ = job.communicate(timeout=30)
    return job.returncode, out


def test_a_walltime_warning_while_the_step_is_down_starts_no_new_step_and_requeues(tmp_path):
    """The step ends abnormally (a rank lost), and Slurm's USR1 comes during the pause before it is
    started again: no new step (it would run into the walltime kill), exit 75 and a requeue, so the
    job's next start resumes. ``srun`` and ``scontrol`` are recorders (no Slurm needed)."""
    script, env, calls = recorded_job(tmp_path, 'echo started >> "$CALLS"; exit 137')
    job = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 20
    while not (calls.exists() and calls.read_text() == "started\n") and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the script has seen the step end and sleeps before starting it again
    job.send_signal(signal.SIGUSR1)
    out, _ = job.communicate(timeout=30)
    assert job.returncode == 75, out
    assert calls.read_text().splitlines() == ["started", "scontrol requeue 7"], out
    assert "not starting it again" in out and "starting it again with --resume" not in out, out


def test_a_stop_this_script_got_no_signal_for_is_requeued_and_said_so(tmp_path):
    """Exit 75 with no signal to the batch shell: a signal to the steps alone (sbatch --signal=USR1@N
    on the command line, which drops B:; scancel --signal=USR2 without --batch), which the engine
    cannot be told from a run that stopped of itself (a full disk). Requeued, as a walltime stop,
    and the log says so rather than "stopped before the walltime"."""
    script, env, calls = recorded_job(tmp_path, 'echo started >> "$CALLS"; echo "toy: stopped (SIGUSR1)" >&2; exit 75')
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 75, done.stdout + done.stderr
    assert calls.read_text().splitlines() == ["started", "scontrol requeue 7"], done.stdout
    assert done.stdout.splitlines()[-1].endswith(
        "stopped (exit 75) with no signal to this script: requeueing; the next start continues with --resume (where "
        "the run's lines above say it stopped of itself, such as on a full disk, fix that or scancel 7)"), done.stdout


def test_a_pipeline_resumed_from_a_step_goes_on_from_where_it_stopped_when_requeued(tmp_path):
    """sbatch SCRIPT DEF --resume RUN/STEP: the first start runs the pipeline again from STEP; a
    requeued start, or a step started again after a lost rank, goes on with a plain --resume from
    where the last one stopped. Both ran STEP again each time: a step longer than one start never
    finished, and each requeue threw away what the last had done past it."""
    srun = 'echo "$*" >> "$CALLS"; if [ "$(wc -l < "$CALLS")" -eq 1 ] && [ -n "${FIRST_EXIT:-}" ]; then exit $FIRST_EXIT; fi'
    script, env, calls = recorded_job(tmp_path, srun, ("common.pipeline", "examples/pipelines/sweep.json"))
    definition = ["examples/pipelines/sweep.json"]

    def argvs(*args: str, **extra: str) -> list:
        calls.unlink(missing_ok=True)
        done = subprocess.run(["bash", str(script), *args], env=dict(env, **extra), capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        return [line.split(" common.pipeline ", 1)[1].split() for line in calls.read_text().splitlines()], done.stdout

    first, _ = argvs(*definition, "--resume", "sweep/train", "--grace", "5")
    assert first == [definition + ["--resume", "sweep/train", "--grace", "5", "--gpu", "cpu", "--workers", "2"]]
    for given in (["--resume", "sweep/train", "--grace", "5"], ["--resume=sweep/train", "--grace", "5"]):
        requeued, out = argvs(*definition, *given, SLURM_RESTART_COUNT="1")
        assert requeued == [definition + ["--resume", "--grace", "5", "--gpu", "cpu", "--workers", "2"]], out
        assert "--resume sweep/train was for the first start: this one goes on with a plain --resume" in out, out
    assert argvs(*definition, SLURM_RESTART_COUNT="3")[0] == [
        definition + ["--gpu", "cpu", "--workers", "2", "--grace", "240", "--resume"]]
    relaunched, out = argvs(*definition, "--resume", "sweep/train", FIRST_EXIT="137")
    assert relaunched == [definition + ["--resume", "sweep/train", "--gpu", "cpu", "--workers", "2", "--grace", "240"],
                          definition + ["--resume", "--gpu", "cpu", "--workers", "2", "--grace", "240"]], out


def test_a_run_whose_items_never_fit_the_time_is_not_requeued(tmp_path):
    """The run exits 76: stopped by the walltime warning before any item of this start finished.
    A requeue with the same --time would cut them off again, 20 times over: the job ends, says
    why, and is not requeued."""
    # the trap ends its sleep too: a child left holding the script's stdout would hold communicate() for 30 s
    srun = 'trap \'echo stop >> "$CALLS"; kill $child; exit 76\' USR1; echo started >> "$CALLS"; sleep 30 & child=$!; wait'
    code, out = warned_once_started(*recorded_job(tmp_path, srun))
    assert code == 76, out
    calls = tmp_path / "calls"
    assert calls.read_text().splitlines() == ["started", "stop"], out
    assert "before any item of this start finished" in out and "submit again with a longer --time" in out, out


def test_a_step_started_again_that_finishes_nothing_is_still_requeued(tmp_path):
    """A rank was lost late in the job and the step started again: it had what was left of the
    job's time, not a whole start, so its 76 (nothing of it finished) is a stop like any other:
    the job is requeued, and its next start has the whole --time."""
    srun = ('if [ -e "$CALLS" ]; then trap \'echo stop >> "$CALLS"; kill $child; exit 76\' USR1; echo again >> "$CALLS"; '
            'sleep 30 & child=$!; wait; else echo started >> "$CALLS"; exit 137; fi')
    script, env, calls = recorded_job(tmp_path, srun)
    job = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert wait_until(lambda: calls.exists() and calls.read_text() == "started\nagain\n", timeout=30)
    job.send_signal(signal.SIGUSR1)
    out, _ = job.communicate(timeout=30)
    assert job.returncode == 75, out
    assert calls.read_text().splitlines() == ["started", "again", "stop", "scontrol requeue 7"], out


def test_a_walltime_warning_as_the_step_goes_down_ends_the_job_as_stopped(tmp_path):
    """USR1 reaches the shell while the step is ending abnormally (srun ignores it here and exits
    137): stopped (75) and requeued, as in the pause after it, with no step started again."""
    script, env, calls = recorded_job(tmp_path, 'echo started >> "$CALLS"; trap "" USR1; kill -USR1 $PPID; sleep 0.3; '
                                                'exit 137')
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 75, done.stdout + done.stderr
    assert calls.read_text().splitlines() == ["started", "scontrol requeue 7"], done.stdout
    assert "ended abnormally (exit 137) after SIGUSR1: not starting it again" in done.stdout, done.stdout


def test_the_walltimes_term_after_its_warning_still_requeues(tmp_path):
    """The run is still saving its journal when the walltime comes: Slurm's TERM follows the USR1
    warning. The job was stopped by the warning and is requeued (before, the TERM overwrote it and
    the chain of requeues ended, as for a job cancelled by hand)."""
    srun = ('sleep 30 & child=$!; trap \'trap "" USR1; echo stop >> "$CALLS"; kill -TERM $PPID; sleep 0.5; kill $child; '
            'exit 75\' USR1; echo started >> "$CALLS"; wait')
    code, out = warned_once_started(*recorded_job(tmp_path, srun))
    assert code == 75, out
    assert (tmp_path / "calls").read_text().splitlines() == ["started", "stop", "scontrol requeue 7"], out
    assert "got SIGTERM" in out and "requeueing; the next start continues with --resume" in out, out


def test_a_cancel_after_the_warning_is_not_taken_for_the_walltime(tmp_path):
    """scancel while the run stops for the warning: Slurm's TERM, but squeue says the time limit is
    still 4 minutes away. Not the walltime: the job is not requeued (before, it came back and ran
    again under the same id until a second scancel). At 20 s left, the same TERM is the walltime."""
    srun = ('sleep 30 & child=$!; trap \'trap "" USR1; echo stop >> "$CALLS"; kill -TERM $PPID; sleep 0.5; kill $child; '
            'exit 75\' USR1; echo started >> "$CALLS"; wait')
    for left, requeued in (("4:10", False), ("0:20", True)):
        script, env, calls = recorded_job(tmp_path, srun)
        calls.unlink(missing_ok=True)
        job = subprocess.Popen(["bash", str(script)], env=dict(env, SQUEUE_LEFT="1:00:00"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        assert wait_until(lambda calls=calls: calls.exists() and calls.read_text() == "started\n", timeout=20)
        (tmp_path / "bin" / "squeue").write_text(f"#!/bin/bash\necho {left}\n")  # time has passed
        job.send_signal(signal.SIGUSR1)
        out, _ = job.communicate(timeout=30)
        assert job.returncode == 75, out
        assert ("scontrol requeue 7" in calls.read_text()) == requeued, out
        if not requeued:
            assert "then SIGTERM came 250 s before the time limit (scancel): not requeueing" in out, out
        shutil.rmtree(tmp_path / "bin")


def test_a_time_limit_within_the_warning_starts_nothing_though_the_warning_is_late(tmp_path):
    """sbatch --time 00:01:30 on a script warned 300 s ahead: Slurm's USR1 comes seconds into the
    run, every start stopped it and requeued the job, twenty times. squeue's time left says so
    before the run starts: nothing started, nothing requeued, exit 75, one line."""
    script, env, calls = recorded_job(tmp_path, 'echo started >> "$CALLS"')
    done = subprocess.run(["bash", str(script)], env=dict(env, SQUEUE_LEFT="1:28"), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 75, done.stdout + done.stderr
    assert not calls.exists(), calls.read_text()
    assert "only 88 s are left before the job's time limit, no more than the walltime warning's 300 s" in done.stdout
    started = subprocess.run(["bash", str(script)], env=dict(env, SQUEUE_LEFT="1-00:00:00"), capture_output=True,
                             text=True, timeout=60)
    assert started.returncode == 0 and calls.read_text() == "started\n", started.stdout


def test_the_tasks_get_the_scripts_environment_under_sbatch_export_none(tmp_path):
    """sbatch --export=NONE sets SLURM_EXPORT_ENV=NONE in the script, which srun then applies to its
    tasks: no module, no virtual environment, no PATH. The script makes it ALL before srun."""
    script, env, calls = recorded_job(tmp_path, 'echo "export=$SLURM_EXPORT_ENV" >> "$CALLS"')
    done = subprocess.run(["bash", str(script)], env=dict(env, SLURM_EXPORT_ENV="NONE"), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert calls.read_text().splitlines() == ["export=ALL"], done.stdout
    # submitted from a folder without the virtual environment: the log says so, and which python runs
    assert f"no virtual environment at .venv in {tmp_path} (submitted from another folder?): using /" in done.stdout


@pytest.mark.parametrize("first, hint, at", [
    ("USR1", "(the walltime warning: is --time shorter than ", "\nrestarts=${SLURM_RESTART_COUNT:-0}\n"),
    ("TERM", "", "\nrestarts=${SLURM_RESTART_COUNT:-0}\n"),
    ("USR1", "(the walltime warning: is --time shorter than ", '\ncd "${SLURM_SUBMIT_DIR:-.}"')],  # during set-up
    ids=["usr1", "term", "usr1-during-set-up"])
def test_a_stop_before_the_run_started_starts_nothing_and_requeues_nothing(tmp_path, first, hint, at):
    """A --time shorter than the warning: USR1 comes at once, and a requeued job would get the same
    limit, twenty times over. Neither srun nor a requeue; one line and exit 75. During the set-up
    (module load, the virtual environment) too, which USR1's default action ended without a word."""
    script, env, calls = recorded_job(tmp_path, 'echo started >> "$CALLS"')
    # the signal raised by the script itself at that line, as Slurm's would come
    text = script.read_text().replace(at, f"\nkill -s {first} $${at}", 1)
    assert text != script.read_text()
    script.write_text(text)
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 75, done.stdout + done.stderr
    assert not calls.exists(), calls.read_text()  # no srun, no scontrol requeue
    last = done.stdout.splitlines()[-1]
    assert f"SIG{first} came before the run started{(' ' + hint) if hint else ':'}" in last, done.stdout
    assert last.endswith(": not starting it, not requeueing"), done.stdout


# ----- the project's CPU scripts on a real Slurm -----

def submit_env(slurm) -> dict:  # noqa: F811
    """The cluster's client environment, with this interpreter's python first on PATH."""
    env = slurm.env
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def job_log(folder: Path) -> str:
    return "\n".join(path.read_text(errors="replace") for path in sorted(folder.glob("*.out")))


def test_cpu_script_runs_two_ranks_with_the_results_of_a_plain_run(slurm, tmp_path):  # noqa: F811
    args = ["3", "--dataset", "digits", "--subsample", "300", "--folds", "2", "--no-progress"]
    in_slurm, plain = tmp_path / "slurm", tmp_path / "plain"
    done = subprocess.run(["sbatch", "--wait", f"--output={tmp_path}/%x-%j.out", "slurm/mnist_svm-cpu.sbatch",
                           *args, "--results", str(in_slurm)],
                          cwd=REPO, env=submit_env(slurm), capture_output=True, text=True, timeout=180)
    log = job_log(tmp_path)
    assert done.returncode == 0, done.stderr + log
    assert "finished" in log
    summary = read_summary(in_slurm)
    assert summary["ranks"] == 2  # srun --mpi=none would have made two worlds of size 1
    assert summary["failed_items"] == [] and summary["items_done"] == summary["items_total"]

    reference = run(["-m", "mnist_svm", *args, "--gpu", "cpu", "--results", str(plain)])
    assert reference.returncode == 0, reference.stderr
    expected = read_summary(plain)
    assert np.array_equal(np.load(in_slurm / "validation_error.npy"), np.load(plain / "validation_error.npy"))
    for key in ("best_C", "best_gamma", "cv_error", "test_error", "confusion_matrix"):
        assert summary[key] == expected[key], key


def signal_toy_job(slurm, tmp_path: Path, name: str, n_items: int, signal_name: str):
    """Submit the toy app on 2 ranks (the CPU variant of the template, as ``--submit`` hands it to
    sbatch), send ``signal_name`` to the batch shell once 4 items are done, as Slurm's
    ``--signal=B:...`` and ``scancel --batch`` do, and wait for the job: (submit process, job id, log)."""
    results, markers = tmp_path / "toy", tmp_path / "markers"
    markers.mkdir()
    env = dict(submit_env(slurm), SBATCH_WAIT="1", SBATCH_OUTPUT=f"{tmp_path}/%x-%j.out")
    submit = subprocess.Popen(
        [*GENERATOR, "--nodes", "1", "--cpu", "--ntasks-per-node", "2", "--time", "00:30:00",
         "--job-name", name, "--submit", "--", os.path.relpath(TOY, REPO), str(n_items), "--sleep", "1",
         "--marker-dir", str(markers), "--no-progress", "--results", str(results)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job = ""
    try:
        deadline = time.monotonic() + 30
        while not job and time.monotonic() < deadline:
            job = subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], env=env,
                                 capture_output=True, text=True).stdout.strip()
            time.sleep(0.2)
        assert job, "the job was not submitted"
        wait_for_results(results, 4, timeout=90)
        subprocess.run(["scancel", f"--signal={signal_name}", "--batch", job], env=env, check=True)
        submit.communicate(timeout=150)
    finally:
        if submit.poll() is None:
            subprocess.run(["scancel", job], env=env)
            submit.kill()
    return submit, job, job_log(tmp_path)


def test_walltime_signal_requeues_the_job_which_resumes_without_recomputing(slurm, tmp_path):  # noqa: F811
    n_items = 24
    results, markers, reference = tmp_path / "toy", tmp_path / "markers", tmp_path / "plain"
    # What Slurm does at --signal=B:USR1@300: signal the batch shell only.
    submit, job, log = signal_toy_job(slurm, tmp_path, "requeue-test", n_items, "USR1")
    assert submit.returncode == 0, log
    assert int(slurm.job_field(job, "Restarts")) >= 1
    assert "got SIGUSR1" in log and "requeueing" in log and "start 2" in log and "finished" in log

    keys = [entry["key"] for entry in journal_entries(results) if entry.get("type") == "result"]
    assert len(keys) == n_items and len(set(keys)) == n_items  # every item journaled once
    runs = {path.name: len(path.read_text().splitlines()) for path in markers.iterdir()}
    assert runs == {key: 1 for key in keys}  # and computed once: finished items were not redone
    summary = read_summary(results)
    assert summary["items_resumed"] >= 4 and summary["ranks"] == 2

    plain = run([TOY, str(n_items), "--gpu", "cpu", "--no-progress", "--results", str(reference)])
    assert plain.returncode == 0, plain.stderr
    assert values(results) == values(reference)


def test_sigterm_to_the_batch_shell_stops_the_run_gracefully_without_requeueing(slurm, tmp_path):  # noqa: F811
    """``scancel --signal=TERM --batch``: srun answers a SIGTERM of its own by SIGKILLing every task,
    so the script must not pass TERM on; the run gets USR1, finishes its running items, and the job
    ends stopped (exit 75), not requeued."""
    results, markers = tmp_path / "toy", tmp_path / "markers"
    submit, job, log = signal_toy_job(slurm, tmp_path, "cancel-test", 40, "TERM")
    assert submit.returncode == 75, log
    assert "got SIGTERM" in log and "not requeueing" in log, log
    assert int(slurm.job_field(job, "Restarts")) == 0
    summary = read_summary(results)
    assert summary["status"] == "stopped" and summary["failed_items"] == []
    journaled = {entry["key"] for entry in journal_entries(results) if entry.get("type") == "result"}
    started = {path.name for path in markers.iterdir()}
    assert journaled == started, "an item that started was abandoned instead of finishing in its grace"
