"""The engine's bookkeeping pieces on their own: scheduler, resource pools, journal."""
from __future__ import annotations

import errno
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from common.errors import UsageError
from common.items import Item, ItemSeeds
from common.messages import Handout
from common.ranks.scheduler import Scheduler
from common.results.journal import read_journal
from common.workers.resources import ResourceBroker
from common.workers.worker import _run_group


def keep(item, results):
    return item


def test_groups_leave_together_and_short_items_in_chunks():
    items = [Item(f"g{i}", group="a", cost=2) for i in range(3)] + [Item(f"s{i}", cost=1) for i in range(5)]
    scheduler = Scheduler(items, {}, retries=0, complete=keep)
    assert [handout.item.key for handout in scheduler.take(chunk=4)] == ["g0", "g1", "g2"]
    assert [handout.item.key for handout in scheduler.take(chunk=4)] == ["s0", "s1", "s2", "s3"]
    assert [handout.item.key for handout in scheduler.take(chunk=4)] == ["s4"]
    assert scheduler.take() is None


def test_dependency_cycles_are_refused():
    items = [Item("a", after=("b",)), Item("b", after=("a",)), Item("c")]
    with pytest.raises(ValueError, match="cycle"):
        Scheduler(items, {}, retries=0, complete=keep)


def test_resumed_dependents_are_rebuilt_from_their_dependencies():
    items = [Item("x"), Item("sum", after=("x",))]

    def complete(item, results):
        return Item(item.key, {"total": results["x"] + 1}, after=item.after)

    scheduler = Scheduler(items, {"x": 41, "sum": 42}, retries=0, complete=complete)
    assert scheduler.items["sum"].params == {"total": 42}
    assert scheduler.all_resolved()


def test_a_resumed_later_wave_item_that_cannot_be_built_fails_and_releases_what_waits_for_it():
    """A resume whose journal holds every dependency of an item but not the item (its complete()
    failed in the run before): the item fails for good again, and an item waiting for it is
    released and built without it, as when the build fails while the run goes on."""
    built = []

    def complete(item, results):
        if item.key == "b":
            raise RuntimeError("boom")
        built.append((item.key, dict(results)))
        return item

    items = [Item("a"), Item("b", after=("a",)), Item("c", after=("b",))]
    scheduler = Scheduler(items, {"a": 1}, retries=0, complete=complete)
    assert scheduler.failed == {"b": "could not build the item from its dependencies: RuntimeError: boom"}
    assert built == [("c", {})] and [handout.item.key for handout in scheduler.take()] == ["c"]
    scheduler.handed("c")
    assert scheduler.done("c", 3) and scheduler.all_resolved()


def test_a_cancelled_request_no_longer_blocks_the_queue_behind_it():
    broker = ResourceBroker({"gpu": 4})
    assert broker.request("gpu", "A", 3) == ["A"]
    assert broker.request("gpu", "B", 2) == []
    assert broker.request("gpu", "C", 1) == []
    cancelled, granted = broker.cancel("gpu", "B")
    assert cancelled and granted == ["C"]
    with pytest.raises(ValueError):
        broker.request("gpu", "D", 0)


def test_a_damaged_journal_is_a_usage_error(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_text('{"type":"header","fingerprint":{}}\n[1,2]\n{"type":"result","key":"a","result":1}\n')
    with pytest.raises(UsageError, match="damaged"):
        read_journal(path)


def test_a_resumed_later_wave_item_runs_again_when_its_inputs_changed():
    """Built from partial results back then (a dependency failed and is retried now), or from
    results that would now build it differently: its journaled result must not be reused."""
    items = [Item("x"), Item("y"), Item("sum", after=("x", "y"))]

    def complete(item, results):
        return Item(item.key, {"total": sum(results.values())}, after=item.after)

    # y failed in the earlier run: sum was built from x alone; now y will run, so sum must follow it.
    partial = Scheduler(items, {"x": 1, "sum": 1}, 0, complete, {"sum": {"total": 1}})
    assert partial.stale == ["sum"] and not partial.all_resolved()
    # Everything finished, and complete() builds sum as it ran: the result holds.
    holds = Scheduler(items, {"x": 1, "y": 2, "sum": 3}, 0, complete, {"sum": {"total": 3}})
    assert holds.stale == [] and holds.all_resolved()
    # Everything finished, but sum ran with other params than complete() builds now: run it again.
    changed = Scheduler(items, {"x": 1, "y": 2, "sum": 1}, 0, complete, {"sum": {"total": 1}})
    assert changed.stale == ["sum"] and changed.ready_count == 1


def test_check_fields_says_what_is_wrong_with_a_result():
    from common.app import NUMBER, NUMBER_OR_NONE, check_fields

    fields = {"error": NUMBER, "loss": NUMBER_OR_NONE, "log": list}
    check_fields({"error": 0.5, "loss": None, "log": [], "extra": 1}, fields)
    check_fields({"error": 1, "loss": 2.0, "log": [1]}, fields)
    for result, problem in [([], "a list, not a JSON object"), ({"loss": 1, "log": []}, "no 'error'"),
                            ({"error": "0.5", "loss": 1, "log": []}, "'error' is a str"),
                            ({"error": True, "loss": 1, "log": []}, "'error' is True"),
                            ({"error": 0.5, "loss": 1, "log": {}}, "'log' is a dict")]:
        with pytest.raises(ValueError, match=re.escape(problem)):
            check_fields(result, fields)


def test_an_items_oserror_travels_as_errno_and_path_beside_the_unchanged_text(tmp_path):
    """Rank 0 tells a full disk from the fields (write_failures.item_error), not from the text."""
    target = tmp_path / "it's full"

    def run_item(state, item, seed):
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    [full] = _run_group(SimpleNamespace(run_item=run_item), None, [Handout(Item("a"), 1)], ItemSeeds(0).sequence)
    assert (full.errno, full.path) == (errno.ENOSPC, str(target))
    assert full.error == f"OSError: [Errno 28] No space left on device: {str(target)!r}"

    def run_other(state, item, seed):
        raise RuntimeError("OSError: [Errno 28] No space left on device: 'looks like one'")

    [other] = _run_group(SimpleNamespace(run_item=run_other), None, [Handout(Item("b"), 1)], ItemSeeds(0).sequence)
    assert (other.errno, other.path) == (None, "")


def test_a_pasted_command_names_the_python_that_ran(tmp_path):
    """The resume command said "python ..." also where the run's python was a virtual environment's,
    run by its path, and "python" on PATH another one (without the run's packages): pasted, it failed
    with "No module named ...". "python" only where that finds the one that ran."""
    from common.run.cli import python_command

    venv, other = tmp_path / "venv" / "bin", tmp_path / "usr" / "bin"
    for folder in (venv, other):
        folder.mkdir(parents=True)
        (folder / "python").write_text("")
        (folder / "python").chmod(0o755)
    (venv / "python3").symlink_to(venv / "python")
    assert python_command({"PATH": f"{venv}:{other}"}, str(venv / "python")) == "python"
    assert python_command({"PATH": f"{venv}:{other}"}, str(venv / "python3")) == "python"  # python3 -m ...
    assert python_command({"PATH": str(other)}, str(venv / "python")) == str(venv / "python")
    assert python_command({"PATH": ""}, str(venv / "python")) == str(venv / "python")
    # a folder whose python is another program (Python 2 beside the python3 that ran)
    (other / "python3").write_text("")
    assert python_command({"PATH": str(other)}, str(other / "python3")) == str(other / "python3")
    spaced = tmp_path / "my envs" / "bin"
    spaced.mkdir(parents=True)
    assert python_command({"PATH": str(other)}, str(spaced / "python")) == f"'{spaced / 'python'}'"



def test_a_flag_that_took_a_positional_argument_as_its_value_is_said(tmp_path, monkeypatch):
    """The pipelines' ``--resume [RUN_ID/STEP_ID]`` before the definition took the definition as the
    step to resume from, and the error said only "required: definition"; the status command's
    ``--watch [S]`` before the folder said "invalid float value"."""
    from common.pipeline.app import PipelineApp
    from common.run.cli import build_parser
    from common.status import _parser

    with pytest.raises(UsageError) as error:
        build_parser(PipelineApp, quiet=True).parse_args(["--resume", "defs.json"])
    assert str(error.value) == ("the following arguments are required: definition (--resume took 'defs.json' as its "
                                "RUN_ID/STEP_ID: give --resume after the positional arguments, or "
                                "--resume=RUN_ID/STEP_ID for a value) (see --help)")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "r").mkdir(parents=True)
    with pytest.raises(UsageError) as error:
        _parser().parse_args(["--watch", "results/r"])
    assert "(--watch took 'results/r' as its S: give --watch after the positional arguments" in str(error.value)
    with pytest.raises(UsageError) as error:  # a number mistyped: no folder of that name, said as it was
        _parser().parse_args(["r", "--watch", "2s"])
    assert str(error.value) == "argument --watch: invalid float value: '2s' (see --help)"
    assert build_parser(PipelineApp, quiet=True).parse_args(["defs.json", "--resume"]).resume is True


def test_nan_for_a_number_flag_is_said_to_be_no_number():
    """``--grace nan`` said "must be at least 0, got nan"."""
    import argparse

    from common.argtypes import at_least

    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected a number, got 'nan'$"):
        at_least(0, float)("nan")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^must be at least 0, got -1$"):
        at_least(0, float)("-1")
    assert at_least(1)("3") == 3 and at_least(0, float)("2.5") == 2.5


@pytest.mark.parametrize("kind, text, message", [
    # inf (or 1e400, which float() makes inf): a --grace that waits forever, a --max-macs that is off
    (float, "inf", "expected a finite number, got 'inf'"),
    (float, "1e400", "expected a finite number, got '1e400'"),
    # an integer too large for a float crashed the NaN check (OverflowError, a traceback)
    (int, "9" * 400, "must be at most 99, got 999999999999999999999999... (400 characters)"),
    # past Python's 4,300-digit limit it was "expected an integer", echoing every digit
    (int, "9" * 5000, "must be at most 99, got 999999999999999999999999... (5,000 characters)"),
    (int, "-" + "9" * 5000, "must be at least 0, got -99999999999999999999999... (5,001 characters)"),
    (int, "²", "expected an integer, got '²'"),  # was "too large"
])
def test_numbers_past_every_bound_are_one_short_line(kind, text, message):
    import argparse

    from common.argtypes import at_least

    with pytest.raises(argparse.ArgumentTypeError) as refused:
        at_least(0, kind, maximum=99)(text)
    assert str(refused.value).startswith(message), str(refused.value)



def test_an_attempt_cut_off_by_a_stop_is_drawn_from_live_ranks_at_its_latest_start(tmp_path):
    """At the end of a stop's wait, rank 0 draws each item still in flight from what the ranks last
    said their workers run: a lost rank's last word is stale (its items went to others), and of two
    live ranks' words on one item the later start is its attempt (a review drew 900 s for a 50 s
    attempt from a lost rank's old snapshot)."""
    from common.ranks.distribute import Leader
    from common.results.status_file import StatusWriter

    rank0 = SimpleNamespace(workers={}, rank=0, host="n0", given_up={})
    writer = StatusWriter(tmp_path, app="toy", command="c", layout=[{"rank": r, "host": f"n{r}"} for r in range(5)],
                          items_total=3, items_resumed=0, started_at=0.0, pool=rank0,
                          monitor=SimpleNamespace(recent=lambda: []), every=5.0)

    def running(worker: str, key: str, since: float) -> dict:
        return {"worker": worker, "device": "cpu0", "pid": 1, "state": "running", "key": key, "since": since}

    writer.absorb(1, {"rank": 1, "host": "n1", "workers": [running("rank1-cpu0", "k1", 950.0)], "gpus": []})
    writer.absorb(2, {"rank": 2, "host": "n2", "workers": [running("rank2-cpu0", "k1", 100.0),
                                                          running("rank2-cpu1", "k2", 960.0)], "gpus": []})
    writer.absorb(3, {"rank": 3, "host": "n3", "workers": [running("rank3-cpu0", "k3", 900.0),
                                                          {"worker": "rank3-cpu1", "state": "idle"}], "gpus": []})
    writer.absorb(1, {"rank": 1, "host": "n1", "workers": [running("rank1-cpu0", "k1", 950.0),
                                                          running("rank1-cpu1", "k3", 980.0)], "gpus": []})
    writer.absorb(4, {"rank": 4, "host": "n4", "workers": [running("rank4-cpu0", "k4", 900.0)], "gpus": []})
    # rank 4's word is older than its worker's failed attempt (a retry elsewhere not told yet): not drawn
    failed = [{"worker": "rank4-cpu0", "start": 900.0, "end": 940.0, "ok": False, "why": "failed"}]
    leader = SimpleNamespace(scheduler=SimpleNamespace(in_flight={"k1": 1, "k2": 1, "k3": 1, "k4": 1}), status=writer,
                             clock=SimpleNamespace(time=lambda: 1000.0), lost={2: {"why": "silent"}}, cut_bars={},
                             bars=failed, records={})
    Leader._draw_cut_off(leader)
    assert leader.cut_bars == {
        "k1": {"worker": "rank1-cpu0", "start": 950.0, "end": 1000.0, "ok": False, "why": "stopped"},
        "k3": {"worker": "rank1-cpu1", "start": 980.0, "end": 1000.0, "ok": False, "why": "stopped"}}


def test_each_script_module_and_definition_gets_a_default_results_folder_of_its_own(monkeypatch):
    """The README's two sweep examples, or ml.json and agent.json, run one after the other without
    --results shared results/sweep (results/pipeline), and the second was refused as another run's."""
    from common.pipeline.app import PipelineApp
    from common.run.cli import build_parser
    from common.sweep.app import Preset, SweepApp
    from mnist_svm.app import MnistSvm

    def results(app_class, *argv: str) -> Path:
        return build_parser(app_class, quiet=True).parse_args(list(argv)).results

    assert results(PipelineApp, "examples/pipelines/ml.json") == Path("results/ml")
    assert results(PipelineApp, "agent.yaml", "--results", "elsewhere") == Path("elsewhere")
    assert results(SweepApp, "my_sweeps.svm:fit") == Path("results/svm")
    assert results(MnistSvm, "2") == Path("results/mnist_svm")
    def scripted(path: str) -> type:
        """sweep.main(fit) in the program started: fit defined in ``path``, run as __main__ (as the script
        itself, or under python -m cProfile, or as a package's __main__.py)."""
        namespace = {"__name__": "__main__"}
        exec(compile("def fit(params):\n    return {}\n", path, "exec"), namespace)
        return type("SweepApp", (SweepApp,), {"preset": Preset(function=namespace["fit"]), "module": ""})

    assert results(scripted("/somewhere/svm_digits.py")) == Path("results/svm_digits")
    assert results(scripted("/somewhere/pk/__main__.py")) == Path("results/pk")
    assert results(scripted("<string>")) == Path("results/sweep")  # python -c
    help_text = build_parser(scripted("/somewhere/svm_digits.py"), quiet=True).format_help().replace("\n", " ")
    assert "default: results/svm_digits)" in help_text
    # its function imported from a module: the program started names it (python -m pkg.runner)
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", SimpleNamespace(name="pkg.runner"), raising=False)
    assert results(type("SweepApp", (SweepApp,), {"preset": Preset(function=len), "module": ""})) == Path("results/runner")
    assert "(default: results/mnist_svm)" in build_parser(MnistSvm, quiet=True).format_help()


def test_an_apps_default_name_is_its_modules_and_a_named_subclass_keeps_its_own():
    """A subclass of an unnamed base of the user's took the base's name, set on the base; two apps in
    modules of one package (proj/svm.py, proj/nn.py) both got "proj"."""
    from common.app import App

    def app(module: str, *bases: type, **body) -> type:
        return type("Made", bases or (App,), {"__module__": module, **body})

    assert app("myapp.app").name == "myapp" and app("myapp.__main__").name == "myapp"
    assert (app("proj.svm").name, app("proj.nn").name) == ("proj.svm", "proj.nn")
    base = app("labkit.base")
    assert (base.name, app("user.app", base).name, app("user.app", base).name_from_module) == ("labkit.base", "user", True)
    named = app("labkit.named", name="mine")
    assert (app("user.app", named).name, app("user.app", named).name_from_module) == ("mine", False)
    assert app("lab kit.app").name == "lab_kit"

