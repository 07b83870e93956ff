"""A results folder deleted or renamed while its run goes on: the run stops (one line, exit 75) and
never ends "complete" in a folder without the journal that backs it (mnist_svm and the pipeline app,
real processes)."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from helpers import journal_entries, read_summary, run, start, wait_until

#: --threads 1: numpy's second thread would mostly spin on a shared CPU; the property does not depend on it
SVM = ["-m", "mnist_svm", "8", "--dataset", "digits", "--subsample", "200", "--folds", "2", "--gpu", "cpu",
       "--threads", "1", "--no-progress"]


def _results(folder: Path) -> int:
    return sum(1 for entry in journal_entries(folder) if entry.get("type") == "result")


def _claims_complete(folder: Path) -> bool:
    summary = folder / "summary.json"
    status = folder / "status.json"
    return ((summary.exists() and json.loads(summary.read_text()).get("status") == "complete")
            or (status.exists() and json.loads(status.read_text()).get("state") == "complete"))


def _take_away(process, results: Path, how: str, moved: Path) -> None:
    """With rank 0 stopped (SIGSTOP; its workers go on), delete or rename its results folder."""
    os.kill(process.pid, signal.SIGSTOP)
    try:
        if how == "rm":
            for _ in range(100):  # its workers go on: one may add a file between rmtree's listing and rmdir
                try:
                    shutil.rmtree(results)
                    break
                except OSError as error:
                    if error.errno != errno.ENOTEMPTY:
                        raise
            assert not results.exists()
        else:
            results.rename(moved)
    finally:
        os.kill(process.pid, signal.SIGCONT)


@pytest.mark.parametrize("how", ["rm", "mv"])
def test_mnist_svm_stops_when_its_results_folder_goes_away(tmp_path, how):
    results, moved = tmp_path / "res", tmp_path / "moved"
    process = start([*SVM, "--results", str(results)])
    assert wait_until(lambda: _results(results) >= 40, timeout=180, every=0.01), "the run made no progress"
    _take_away(process, results, how, moved)
    out, err = process.communicate(timeout=180)
    assert process.returncode == 75, err
    said = [line for line in err.splitlines() if line.startswith("mnist_svm:")]  # not the rank's log lines
    assert len(said) == 1 and said[0].startswith("mnist_svm: stopped: the results folder"), err
    assert "during the run" in said[0] and said[0].endswith("--resume"), said[0]
    assert "complete" not in out + err and "Test error" not in out
    for folder in (results, moved):
        assert not _claims_complete(folder)
        assert not (folder / "summary.json").exists() and not (folder / "report.html").exists()
    if how == "mv":  # everything journaled went with the folder: moved back, --resume finishes it
        kept = _results(moved)
        assert kept >= 40
        assert not results.exists(), sorted(str(path.relative_to(results)) for path in results.rglob("*"))
        moved.rename(results)
        again = run([*SVM, "--results", str(results), "--resume"])
        assert again.returncode == 0, again.stderr
        summary = read_summary(results)
        assert summary["status"] == "complete" and summary["items_resumed"] == kept


def test_the_pipeline_app_stops_when_its_results_folder_is_deleted(tmp_path):
    definition = tmp_path / "sweep.json"
    definition.write_text(json.dumps({"name": "p", "matrix": {"n": [str(i) for i in range(12)]},
                                      "steps": [{"id": "work", "command": "sleep 0.3"}]}))
    results = tmp_path / "res"
    process = start(["-m", "common.pipeline", str(definition), "--gpu", "cpu", "--workers", "2",
                     "--results", str(results)])
    assert wait_until(lambda: _results(results) >= 2, timeout=180), "no pipeline finished"
    _take_away(process, results, "rm", tmp_path / "unused")
    out, err = process.communicate(timeout=180)
    assert process.returncode == 75, err
    said = [line for line in err.splitlines() if line.startswith("pipeline: stopped")]
    assert len(said) == 1 and said[0].startswith("pipeline: stopped: the results folder"), err
    assert "during the run" in said[0], said[0]
    assert not _claims_complete(results) and not (results / "summary.json").exists()
    assert not (results / "summary.md").exists()


def test_a_file_rewritten_during_a_run_never_makes_its_moved_folder_again(tmp_path):
    """status.json and the hold are rewritten while the run goes on: where their folder was moved
    away meanwhile, the write fails instead of making an empty results folder at the old place
    (what the test above caught, rank 0 rewriting status.json before it noticed the move)."""
    from common.results.outputs import atomic_write_json

    results = tmp_path / "res"
    results.mkdir()
    atomic_write_json(results / "status.json", {"state": "running"}, parents=False)
    results.rename(tmp_path / "moved")
    with pytest.raises(FileNotFoundError):
        atomic_write_json(results / "status.json", {"state": "running"}, parents=False)
    assert not results.exists()
    atomic_write_json(results / "sub" / "summary.json", {}, parents=True)  # end outputs still make their folders
    assert (results / "sub" / "summary.json").exists()
