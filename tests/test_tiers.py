"""The test tiers (tests/tiers.py through tests/conftest.py): a new test file without a marker
lands in the tier its code shows; a test that starts an MPI job below the mpi tier fails, saying so.
Each case runs the real pytest, with this suite's conftest, on a file written for it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import REPO

TESTS = REPO / "tests"

NEW_FILE = '''
import subprocess

import pytest

from helpers import TOY, run
from slurm_cluster import slurm  # noqa: F401

RANKS = 2


def two_ranks_of(program, ranks=1):
    """A helper that passes ``ranks`` on: its caller decides (mpiexec -n 2 would be MPI)."""
    return run(program, ranks=ranks)


def test_arithmetic():
    """Says mpiexec in its docstring and does nothing of the kind."""
    assert 1 + 1 == 2


def test_a_program():
    subprocess.run(["true"], check=True)


def test_a_toy_run():
    run([TOY, "2"])


def test_two_ranks():
    run([TOY, "2"], ranks=2)


def test_two_ranks_from_a_constant():
    run([TOY, "2"], RANKS)


def test_through_a_helper_one_rank():
    two_ranks_of([TOY, "2"])


def test_through_a_helper_two_ranks():
    two_ranks_of([TOY, "2"], ranks=2)


def test_imports_its_helper_inside():
    from helpers import start
    start([TOY, "2"], ranks=3)


@pytest.mark.parametrize("ranks", [1, 2])
def test_parametrized(ranks):
    run([TOY, "2"], ranks=ranks)


@pytest.fixture
def two_rank_run():
    return run([TOY, "2"], ranks=2)


def test_through_a_fixture(two_rank_run):
    assert two_rank_run


def test_on_slurm(slurm):  # noqa: F811
    assert slurm


def test_on_the_virtual_cluster(vcluster):
    assert vcluster


@pytest.mark.mpi
def test_marked_by_hand():
    assert True
'''

EXPECTED = {
    "inprocess": ["test_arithmetic"],
    "processes": ["test_a_program", "test_a_toy_run", "test_through_a_helper_one_rank", "test_parametrized[1]"],
    "mpi": ["test_two_ranks", "test_two_ranks_from_a_constant", "test_through_a_helper_two_ranks",
            "test_imports_its_helper_inside", "test_parametrized[2]", "test_through_a_fixture", "test_marked_by_hand"],
    "slurm": ["test_on_slurm"],
    "vcluster": ["test_on_the_virtual_cluster"],
}


#: a plugin that prints each collected test's tier, once the conftest has given them
PRINT_TIERS = '''
import json

from tiers import TIERS


def pytest_collection_finish(session):
    for item in session.items:
        print("TIER", item.name, json.dumps([mark.name for mark in item.iter_markers() if mark.name in TIERS]))
'''


def pytest_with_this_conftest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest on ``folder`` with tests/conftest.py as a plugin and the project's settings (markers)."""
    (folder / "print_tiers.py").write_text(PRINT_TIERS)
    return subprocess.run([sys.executable, "-m", "pytest", "-c", str(REPO / "setup.cfg"), "--rootdir", str(folder),
                           "-p", "conftest", "-p", "print_tiers", "-p", "no:cacheprovider",
                           "-W", "error::pytest.PytestUnknownMarkWarning", *args, str(folder)], cwd=folder,
                          env=dict(os.environ, PYTHONPATH=f"{TESTS}:{folder}"), capture_output=True, text=True,
                          timeout=120)


def tiers_of(done: subprocess.CompletedProcess) -> dict:
    """test name -> the tier markers it was collected with."""
    assert done.returncode == 0, done.stdout + done.stderr
    return {line.split()[1]: json.loads(line.split(" ", 2)[2]) for line in done.stdout.splitlines()
            if line.startswith("TIER ")}


def test_a_new_file_without_markers_is_sorted_into_tiers_by_what_its_code_starts(tmp_path):
    (tmp_path / "test_new.py").write_text(textwrap.dedent(NEW_FILE))
    tiers = tiers_of(pytest_with_this_conftest(tmp_path, "--collect-only", "-q"))
    assert tiers == {name: [tier] for tier, names in EXPECTED.items() for name in names}


def test_make_check_selects_exactly_the_tiers_that_start_no_mpi_job_slurm_or_cluster(tmp_path):
    """With the marker expression of the Makefile's check target."""
    expression = re.search(r'^check:.*?-m "([^"]+)"', (REPO / "Makefile").read_text(), re.M | re.S).group(1)
    (tmp_path / "test_new.py").write_text(textwrap.dedent(NEW_FILE))
    selected = tiers_of(pytest_with_this_conftest(tmp_path, "--collect-only", "-q", "-m", expression))
    assert sorted(selected) == sorted(EXPECTED["inprocess"] + EXPECTED["processes"]), expression


def test_an_mpi_job_below_the_mpi_tier_fails_in_one_line_before_mpiexec_starts(tmp_path):
    results = tmp_path / "never-written"
    (tmp_path / "test_hidden.py").write_text(textwrap.dedent(f'''
        import pytest

        from helpers import TOY, run


        @pytest.mark.processes
        def test_hides_its_ranks():
            run([TOY, "2", "--results", {str(results)!r}], ranks=2)
        '''))
    done = pytest_with_this_conftest(tmp_path, "-q")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "this test starts 2 MPI ranks but its tier is 'processes': mark it @pytest.mark.mpi" in done.stdout
    assert not results.exists()
