"""A result's journal line is made without a dict (rank 0's cost per result): it must be the very
line the general encoder writes, and read back as the record it came from."""
from __future__ import annotations

import collections
import enum
import json
import time
from pathlib import Path

import numpy as np
import pytest

from common.app import Record
from common.results.journal import (
    _ENCODER,
    _PLAIN_JSON,
    _RECORD_FIELDS,
    Journal,
    _app_value,
    _result_line,
    describe_difference,
    read_journal,
)
from common.results.outputs import to_jsonable


class Level(enum.IntEnum):
    HIGH = 3


RESULTS = [None, 1, 2.5, float("nan"), "é\n\"x\u2028", {"a": np.float32(1.5), "b": [1, np.arange(3)]}, np.int64(4),
           True, [float("inf")], {"nested": {"deep": [None, "ü"]}},
           # plain JSON, written at C speed: it must be the same line
           {"seed": 7, "return": {"loss": 0.125, "ok": True, "none": None, "s": "x"}}, {}, [], (1, (2, "3")),
           collections.OrderedDict([("b", 1), ("a", 2)]), {"level": Level.HIGH, Level.HIGH: np.float64(0.1)},
           # keys JSON spells itself, and ones it refuses
           {1: "int", 2.5: "float", None: "n", np.float64(1.5): "np"}, {True: "t", False: "f"},
           {float("nan"): 1, float("inf"): 2}, {(1, 2): "tuple key"}, {np.int64(3): "numpy key"},
           {"path": Path("/a/b")}, {"deep": [{"x": float("-inf")}]}, -0.0, 1e300, 2 ** 70]


def general_line(record: Record) -> bytes:
    entry = {"type": "result"}
    for name in _RECORD_FIELDS:
        entry[name] = getattr(record, name)
    return _ENCODER.encode(to_jsonable(entry)).encode()


@pytest.mark.parametrize("result", RESULTS)
@pytest.mark.parametrize("params", [None, {"C": 1.0, "path": "x", "seeds": np.array([1, 2])}])
def test_the_fast_line_is_the_general_encoders_line(result, params):
    now = time.time()
    record = Record(key="k\u00e9y\"1", result=result, seconds=0.25, rank=2, host="hôte", device="cuda:0",
                    worker="rank2-gpu0.1", start=now, end=now + 1 / 3, attempt=2, group_size=5, params=params)
    assert _result_line(record) == general_line(record)


@pytest.mark.parametrize("odd", [{"seconds": float("nan")}, {"rank": np.int64(3)}, {"start": 1}, {"host": None}])
def test_an_engine_field_of_another_type_takes_the_general_way(tmp_path, odd):
    with pytest.raises((TypeError, ValueError)):
        _result_line(Record(key="k", result=None, **odd))
    journal = Journal(tmp_path / "journal.jsonl", {"fingerprint": {}})
    journal.append_result(Record(key="odd", result={"x": 1}, **odd))
    journal.append_result(Record(key="plain", result=[1, 2]))
    journal.close()
    _, records = read_journal(tmp_path / "journal.jsonl")
    assert records["plain"].result == [1, 2] and records["odd"].result == {"x": 1}
    name, value = next(iter(odd.items()))
    assert getattr(records["odd"], name) == json.loads(json.dumps(to_jsonable(value)))


def test_values_the_fast_way_refuses_leave_nothing_behind():
    """json's C encoder keeps the ids of the containers it is inside and leaves them when a value
    is refused: they must not pile up, one or more per result, over a run of numpy returns."""
    assert _PLAIN_JSON is not None
    refused = [{"loss": np.float32(0.5)}, {"a": [1, {"b": float("nan")}]}, [{"x": float("inf")}], {(1, 2): 1}]
    for _ in range(100):
        for value in refused:
            assert _app_value(value) == _ENCODER.encode(to_jsonable(value))
    assert _PLAIN_JSON.markers == {}


def test_a_difference_in_an_argument_left_at_its_default_names_the_default():
    """Apps leave an argument at its default out of their fingerprint (older journals resume): the
    refusal says "the default" there, not None, which the user never gave."""
    assert describe_difference({"seed": 1}, {"seed": 2}) == "seed 1 (journal) vs 2 (now)"
    # every difference at once, not the next one after the first is fixed
    assert describe_difference({"folds": 5, "seed": 1, "x": 0}, {"folds": 3, "seed": 5, "x": 0}) == \
        "folds 5 (journal) vs 3 (now), seed 1 (journal) vs 5 (now)"
    assert describe_difference({"draws": "reference"}, {}) == "draws 'reference' (journal) vs the default (now)"
    assert describe_difference({}, {"max_macs": 1e6}) == "max_macs the default (journal) vs 1000000.0 (now)"
    assert describe_difference({"subsample": None}, {"subsample": 300}) == "subsample None (journal) vs 300 (now)"
    # what an app says a left-out value stands for (mnist_nn leaves out --draws keyed): not "the default"
    assert describe_difference({}, {"draws": "reference"}, {"draws": "keyed"}) == "draws 'keyed' (journal) vs 'reference' (now)"
    assert describe_difference({"draws": "reference"}, {}, {"draws": "keyed"}) == "draws 'reference' (journal) vs 'keyed' (now)"
    # another app's journal: only that is said (mnist_nn's left-out values are no mnist_svm run's)
    svm, nn = {"app": "mnist_svm", "n_tuning": 8, "folds": 5}, {"app": "mnist_nn", "n_bootstrap": 1, "folds": 5}
    assert describe_difference(svm, nn, {"draws": "keyed", "normalise": "data"}) == \
        "app 'mnist_svm' (journal) vs 'mnist_nn' (now)"


def test_the_one_reader_takes_odd_lines_as_each_of_its_three_readers_did(tmp_path):
    """JournalReader replaced three readers: --resume's strict one, which reads the header, the
    results and the starts only (a start's layout checked where the starts are wanted), and the
    status command's and the report's lenient ones, which pass over a line whose key is not a string."""
    from common.errors import UsageError
    from common.results.journal import JournalReader

    path = tmp_path / "journal.jsonl"
    lines = [{"type": "header", "key": 7, "fingerprint": {"app": "toy"}},  # a key on the header: kept as before
             {"type": "result", "key": "a", "result": 1, "seconds": 0.1, "end": 5.0},
             {"type": "result", "key": None, "end": 6.0},  # not the engine's: skipped by the lenient readers
             {"type": "rank_lost", "rank": [1], "items": []},  # damaged, but not read on resume
             {"type": "start", "time": 7.0, "layout": "x"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines[:2] + lines[3:]))
    header, records = read_journal(path)  # resume's look at what it skips: no starts wanted
    assert header["fingerprint"] == {"app": "toy"} and list(records) == ["a"]
    with pytest.raises(UsageError, match="line 4 is not a journal record"):  # the starts wanted: their layout read
        read_journal(path, [])
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    lenient = JournalReader(path).update()
    assert lenient.done == {"a"} and lenient.last == 7.0 and len(lenient.starts) == 1 and lenient.lost == {}
    with pytest.raises(UsageError, match="line 3 is not a journal record"):
        read_journal(path)


@pytest.mark.parametrize("line", ['{"this": "is not a record"}', '{"type": []}', "null"])
def test_a_line_no_engine_writes_is_what_resume_refuses_and_status_reports(tmp_path, line):
    """An object of no kind the engine writes was skipped by --resume; once refused, the status
    command said nothing of it (its note covered only the kinds a resume reads), and a type that is
    a list would have raised from the kind lookup."""
    from common.errors import UsageError
    from common.results.journal import JournalReader

    journal = tmp_path / "journal.jsonl"
    journal.write_text(json.dumps({"type": "header", "fingerprint": {"app": "x"}, "format": 1}) + "\n" + line + "\n"
                       + json.dumps({"type": "stop", "why": "SIGUSR1", "time": 1.0}) + "\n")
    assert JournalReader(journal).update().problem == "line 2 is not a journal record: damaged"
    with pytest.raises(UsageError, match=r"line 2 is not a journal record; the journal is damaged$"):
        JournalReader(journal, strict=True).update()
