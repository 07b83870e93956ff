"""Session fixtures shared by several test modules (one definition each, so one instance per session),
and each test's tier marker (tests/tiers.py): ``make check`` runs ``-m "inprocess or processes"``."""
import fcntl
import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

import pytest

import helpers
from tiers import MPI, TIERS, Classifier, own_code
from vcluster import vcluster  # noqa: F401  (the virtual multi-node cluster)

# the programs the tests start run as from an activated virtual environment, where a pasted command's
# "python" is the interpreter that ran (common.run.cli.python_command): the commands they print say so
os.environ["PATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(sys.executable)), os.environ.get("PATH", "")])
# one OpenBLAS thread in every program the tests start that the engine gives no thread count (ranks,
# the timeline's drawer, data downloads; workers get theirs from the pool, which overrides this): the
# test processes share the machine's cores, and numpy's import starts OpenBLAS's other threads, which
# spin for about 0.06 s of CPU each on the way. Measured on 2 cores: `import numpy` 0.15 -> 0.08 s of
# CPU; tests/test_engine.py and test_sweep.py (-n 2, 2 runs each) 118 -> 104 s of CPU, 69.7 -> 64.9 s.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


#: pytest's cache entry of the tiers tests/tiers.py read from the code (half of collection's time, in
#: each pytest-xdist worker), with the stamp of the code they were read from
TIER_CACHE = "multinode-gpu/tiers"
#: the folders whose code a test's tier is read from
CODE_FOLDERS = ("tests", "common", "mnist_nn", "mnist_svm", "benchmarks", "examples")


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session: pytest.Session):
    """pytest rewrites each test module's asserts as it imports it, and keeps the result in
    tests/__pycache__ only where Python may write bytecode: where PYTHONDONTWRITEBYTECODE is set
    (here, and in many images) every pytest process rewrote every module at every run (5 s of its
    10 s collection). Bytecode is written while the test modules are collected, and only then:
    the programs the tests start still see the variable (the project's own code is compiled by
    make install)."""
    before = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        yield
    finally:
        sys.dont_write_bytecode = before


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Every test gets one tier marker (``_tier``): as read from the code last time, where the code
    has not changed since (pytest's cache), else read again."""
    cache = getattr(config, "cache", None)
    stamp = _code_stamp()
    saved = cache.get(TIER_CACHE, None) if cache is not None else None
    known: Dict[str, str] = saved["tiers"] if isinstance(saved, dict) and saved.get("stamp") == stamp else {}
    classifier, found = None, {}
    for item in items:
        if any(item.get_closest_marker(tier) for tier in TIERS):
            continue
        tier = known.get(item.nodeid)
        if tier not in TIERS:
            classifier = classifier or Classifier()
            tier = found[item.nodeid] = _tier(item, classifier)
        item.add_marker(getattr(pytest.mark, tier))
    if found and cache is not None:
        cache.set(TIER_CACHE, {"stamp": stamp, "tiers": {**known, **found}})


def _code_stamp() -> str:
    """What changes when any code a tier is read from changes: each file's name, size and time."""
    entries = []
    for folder in CODE_FOLDERS:
        for root, folders, files in os.walk(helpers.REPO / folder):
            folders[:] = sorted(name for name in folders if name != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    status = os.stat(os.path.join(root, name))
                    entries.append(f"{os.path.relpath(os.path.join(root, name), helpers.REPO)}:{status.st_size}:"
                                   f"{status.st_mtime_ns}")
    return hashlib.sha256("\n".join([sys.version, *entries]).encode()).hexdigest()


def _tier(item: pytest.Item, classifier: Classifier) -> str:
    """The tier its code shows (tests/tiers.py)."""
    function = getattr(item, "function", None)
    if function is None:  # not a Python test function: nothing to read, assume it starts programs
        return "processes"
    fixture_info = getattr(item, "_fixtureinfo", None)
    definitions = fixture_info.name2fixturedefs.values() if fixture_info else ()
    fixtures = [chain[-1].func for chain in definitions if chain and own_code(chain[-1].func)]
    callspec = getattr(item, "callspec", None)
    return classifier.tier(function, fixtures, dict(callspec.params) if callspec else {})


@pytest.fixture
def fake_gpu_modules(monkeypatch: pytest.MonkeyPatch):
    """tests/fake_gpu's cuML and CuPy importable in this process; taken out of sys.modules
    afterwards, so no other test sees a cuML."""
    monkeypatch.syspath_prepend(str(helpers.REPO / "tests" / "fake_gpu"))
    yield
    for name in [n for n in sys.modules if n.split(".")[0] in ("cuml", "cupy")]:
        del sys.modules[name]


@pytest.fixture
def private_node_slots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline tests': node-wide GPU slots of this test only (other test runs on the machine hold
    their own), and no image, agent or pool size from the caller's environment."""
    monkeypatch.setenv("PIPELINE_LOCK_DIR", str(tmp_path / "locks"))
    for name in ("PIPELINE_CONTAINER", "PIPELINE_AGENT", "SWARM_RESOURCE_gpu", "PIPELINE_RESOURCE_GPU"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def mpi_jobs_only_in_their_tiers(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test below the ``mpi`` tier that starts an MPI job through tests/helpers.py fails, saying
    so, instead of making ``make check`` slow: the tier its code showed was wrong."""
    tier = next((tier for tier in TIERS if request.node.get_closest_marker(tier)), None)
    if tier is None or TIERS.index(tier) >= MPI:
        return
    command = helpers.command

    def refusing(program, ranks: int = 1):
        if ranks > 1:
            pytest.fail(f"this test starts {ranks} MPI ranks but its tier is {tier!r}: "
                        f"mark it @pytest.mark.mpi (tests/tiers.py did not see it)", pytrace=False)
        return command(program, ranks)

    monkeypatch.setattr(helpers, "command", refusing)


@dataclass(frozen=True)
class SmallNnRun:
    """What the session's one ``helpers.NN_SMALL`` mnist_nn run left."""
    results: Path  # its results folder, ``--results .``: a user's folder that held notes.txt before
    stdout: List[str]  # the lines it printed (the reference's headline)
    rank_0_imported_torch: bool


@pytest.fixture(scope="session")
def nn_small_run(tmp_path_factory: pytest.TempPathFactory) -> SmallNnRun:
    """One real mnist_nn run for every test that only reads its outputs, once per session: under
    pytest-xdist the first worker to need it makes it (its files and what it said, in the folder the
    session's workers share) and the others wait for it and read it (each run is half a minute of CPU
    here). Run as python -m mnist_nn runs it, ``main(MnistNN, argv)``, by a script that then says
    whether rank 0 ever imported torch (only the workers need it); in a user's folder with
    ``--results .``, as reference users run it."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # pytest-N/, not popen-gwN/
    record = shared / "nn_small.json"
    with open(shared / "nn_small.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes: after the run, or at once
        if not record.exists():
            record.write_text(json.dumps(_nn_small(shared / "nn_small" / "work")))
    made = json.loads(record.read_text())
    return SmallNnRun(Path(made["results"]), made["stdout"], made["rank_0_imported_torch"])


def _nn_small(folder: Path) -> Dict[str, Any]:
    """The run itself, in ``folder`` (made here, with a user's notes.txt); what it left, as JSON."""
    shutil.rmtree(folder, ignore_errors=True)  # a run that failed in another pytest-xdist worker
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine\n")
    script = ("import sys\n"
              "from common.run.runner import main\n"
              "from mnist_nn.app import MnistNN\n"
              f"code = main(MnistNN, {helpers.NN_SMALL + ['--results', '.']!r})\n"
              "print('exit', code, 'torch' in sys.modules)\n")
    proc = helpers.run(["-c", script], cwd=folder, timeout=300)
    assert proc.returncode == 0, proc.stderr
    *stdout, last = proc.stdout.splitlines()
    assert last.split()[:2] == ["exit", "0"], proc.stdout
    return {"results": str(folder), "stdout": stdout, "rank_0_imported_torch": last.split()[2] == "True"}
