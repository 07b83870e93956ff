"""The contract between an application and the engine.

An app says *what* the work is; the engine (``common.run.runner``) decides where and when it runs.
Subclass :class:`App`, override what you need, and start it with
``raise SystemExit(common.run.runner.main(MyApp))`` from the app's ``__main__``.

Where each method runs:
  every rank     ``add_arguments`` (class method), ``check_arguments``, ``validate`` (``devices``
                 already set), ``pools``
  rank 0         ``fingerprint`` (and ``fingerprint_left_out``), ``output_names``, ``prepare``,
                 ``check_result``, ``items``, ``complete``, ``finish``, ``headline``
  worker process ``setup_worker`` once, then ``run_item`` per item (never MPI here)
The instance is pickled into the spawned workers, so keep big data out of ``__init__``;
load it in ``setup_worker``.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, field, fields
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple, Union

from .devices import Device
from .items import Item
from .settings import DEFAULT_WORKER_TIMEOUT

if TYPE_CHECKING:  # numpy only where an app or an item's seed needs it: not in rank 0's start
    import numpy as np


@dataclass
class Record:
    """One finished item as the journal keeps it."""

    key: str
    result: Any
    seconds: float = 0.0
    rank: int = 0
    host: str = ""
    device: str = ""
    worker: str = ""
    start: float = 0.0
    end: float = 0.0
    attempt: int = 1
    group_size: int = 1  # items run together with it (its start/end are the whole group's)
    params: Any = None  # for an item of a later wave: the params App.complete gave it

    @property
    def own_seconds(self) -> float:
        """Its share of the time it ran: a group's items (``App.run_group``) share the group's."""
        return self.seconds / max(1, self.group_size)

    def __reduce__(self) -> tuple:
        """Pickled as its fields in a row, unpickled through ``__init__``: rank 0 unpickles a record
        per result, and a dataclass's default (a dict of its fields, then set into the new
        instance's ``__dict__``) takes three times as long and leaves each record a dict of its own."""
        return Record, _record_row(self)


#: a record's fields in order, as one tuple (``Record(*row)`` makes it again)
_record_row = attrgetter(*(f.name for f in fields(Record)))


@dataclass
class RunInfo:
    """What rank 0 knows at the end, handed to ``App.finish``."""

    results_dir: Path
    items: List[Item]
    records: Dict[str, Record]  # key -> record, for every finished item (this run and resumed)
    failed_items: List[Dict[str, Any]] = field(default_factory=list)  # {"key", "error"}

    def results(self) -> Dict[str, Any]:
        """key -> result, in item order."""
        return {item.key: self.records[item.key].result for item in self.items if item.key in self.records}


#: the name every App subclass that set none had before names came from modules: a journal of such a
#: run resumes under the new name (:func:`common.run.engine._journaled_app`)
UNNAMED_APP = "app"


def _name_of_module(cls: type) -> str:
    """An app's default name: the module that defines it, less a last part ``app`` or ``__main__``
    (``myapp`` for myapp/app.py, ``proj.svm`` for proj/svm.py), or the script's (or the package's,
    for its ``__main__.py``) file name where it is defined in the program's main module
    (``__mp_main__`` in a spawned worker), as a folder name."""
    module = cls.__module__
    if module in ("__main__", "__mp_main__"):
        path = Path(getattr(sys.modules.get(module), "__file__", None) or cls.__name__)
        named = path.parent.name if path.stem == "__main__" else path.stem
    else:
        parts = module.split(".")
        named = ".".join(parts[:-1] if len(parts) > 1 and parts[-1] in ("app", "__main__") else parts)
    return re.sub(r"[^\w.-]", "_", named, flags=re.ASCII).strip(".") or UNNAMED_APP


class App:
    """Base class of an application. Override what you need."""

    #: program name; the default results folder is ``results/<name>`` (see :meth:`results_name`),
    #: and the journal records it (a --resume of another app's run is refused). Default, for a
    #: subclass that sets none: its module's (``myapp`` for myapp/app.py, see ``_name_of_module``),
    #: or the script's file name, so that apps in modules of their own never share a folder by default
    name: str = "app"
    #: whether ``name`` was made from the module (the class, and none of its bases, sets one)
    name_from_module: bool = False
    #: one line for ``--help``
    description: str = ""
    #: what follows ``python -m`` to start the app (default: ``name``)
    module: str = ""
    #: default of ``--retries``: extra attempts for an item that fails
    default_retries: int = 1
    #: --seed when none is given
    default_seed: int = 0
    #: default of ``--worker-timeout``: seconds of silence (a hung worker) before a worker is killed
    default_worker_timeout: float = DEFAULT_WORKER_TIMEOUT
    #: default of ``--item-timeout``: seconds an item may run (None: no limit)
    default_item_timeout: Optional[float] = None
    #: whether ``--resume`` may name a target (``--resume RUN_ID/STEP_ID`` for pipelines)
    resume_target: bool = False
    #: whether ``answer`` counts the failed items itself (a pipeline's: "2 pipelines: 1 ok, 1 failed"); else
    #: summary.md adds that a failed run's answer is of the items that finished
    answer_counts_failures: bool = False
    #: whether an item cut off by a stop keeps part of its work for the resume (a pipeline's finished
    #: steps): a run that finished no item may still have progressed, so it is not said to have
    #: made none (exit 76, which the batch scripts do not requeue)
    items_resume_part_way: bool = False
    #: what ``run_item``/``run_group`` get as each item's seed: "sequence", the item's own numpy
    #: SeedSequence (``item_seed``), or "int32", its first 32-bit word (``item_seed32`` of it, an
    #: int; what a sweep function gets), made in a quarter of the time: for items of microseconds
    seed_form: str = "sequence"

    def __init__(self, args: argparse.Namespace):
        self.args = args
        #: rank 0, set before ``items()``: every result the journal held when the run started
        #: (``--resume``), by key; empty for a fresh run
        self.journaled: Dict[str, Record] = {}
        #: every rank, set by the engine before ``check_arguments``/``validate`` from --gpu, --workers
        #: and --workers-per-gpu (ranks sharing a node's GPUs already split): the devices this rank's
        #: workers run on. Apps read these and never parse --gpu again.
        self.devices: List[Device] = []

    def on_gpu(self) -> bool:
        """Whether this rank's workers run on GPUs (the engine's devices)."""
        return any(d.is_gpu for d in self.devices)

    def gpus(self) -> List[str]:
        """This rank's distinct GPUs by name (``gpu0``; one each, however many workers share it)."""
        return list(dict.fromkeys(d.gpu_name for d in self.devices if d.is_gpu))

    # ----- command line (every rank) -----
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # named by a class of the user's (a base of theirs that is named by its module is not)
        if any("name" in vars(klass) and not vars(klass).get("name_from_module") for klass in cls.__mro__
               if klass is not App):
            cls.name_from_module = False
        else:
            cls.name, cls.name_from_module = _name_of_module(cls), True

    @classmethod
    def results_name(cls, args: argparse.Namespace) -> str:
        """The default results folder's name under ``results/``: the app's. An app that runs the
        user's own script or definition (the sweep, the pipelines) names it after that, so that
        two of them never share a folder by default."""
        return cls.name

    @classmethod
    def results_name_help(cls) -> str:
        """:meth:`results_name` as ``--help`` says it, before any argument is known."""
        return cls.name

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add the app's own arguments; the engine's (--gpu, --seed, ...) are already there."""

    def check_arguments(self) -> None:
        """Raise ``common.errors.UsageError`` for arguments that make no sense whatever the machine:
        checks of the values alone (no files, devices or data). Runs on every rank before
        ``validate``, and in ``python -m common.slurm`` before it prints a batch script."""

    def validate(self) -> None:
        """Raise ``common.errors.UsageError`` on bad input for this machine (data that cannot be
        had, a library or device missing), after ``check_arguments``, before anything is written."""

    # ----- rank 0 -----
    def fingerprint(self) -> Dict[str, Any]:
        """The app's own arguments that change results; ``--resume`` refuses a journal made with
        others. The engine adds its own (--seed, --threads) itself."""
        return {}

    def fingerprint_left_out(self) -> Dict[str, Any]:
        """What an argument ``fingerprint`` leaves out stands for, where that is not the argument's
        default (a value left out so that journals from before the argument resume): the refusal of
        a resume names it, instead of "the default"."""
        return {}

    def prepare(self) -> None:
        """Rank 0, once, before any work starts (e.g. download data). May raise UsageError."""

    def data_fingerprint(self) -> Optional[str]:
        """Rank 0, after ``prepare``: what identifies the data the items compute on (a hash of their
        content, e.g. ``common.data.Dataset.identity``), or None. A journal records it, and
        ``--resume`` on other data (another ``--data-dir`` holding other files) is refused, where
        its items would otherwise mix results of two data sets."""
        return None

    def plan_text(self) -> Optional[str]:
        """Rank 0, for ``--dry-run``, once the arguments and the results folder are checked (with
        ``--resume``, ``journaled`` holds what is done): the plan in the app's own words, or None
        for the engine's (each item the run would run as a JSON line)."""
        return None

    def items(self) -> List[Item]:
        """Every item of the run, later waves included (they name what they wait for in ``after``)."""
        raise NotImplementedError

    def complete(self, item: Item, results: Mapping[str, Any]) -> Item:
        """Rank 0: fill in a dependent item from the results of the items it waited for.

        ``results`` maps each finished key of ``item.after`` to its result (a permanently
        failed dependency is absent). Raise to fail the item.
        """
        return item

    def check_result(self, key: str, result: Any) -> None:
        """Rank 0, for each result read back from the journal by ``--resume``: raise ValueError,
        saying what is wrong, where ``result`` is not what this app's item ``key`` returns (a
        journal edited or damaged by hand); the run then stops with a one-line error before any
        work, instead of failing in ``finish``. ``check_fields`` does the usual checks."""

    def finish(self, run: RunInfo) -> Dict[str, Any]:
        """Rank 0, after all items: write the app's outputs; return extra fields for summary.json."""
        return {}

    def where_stopped(self, run: RunInfo) -> Dict[str, Any]:
        """Rank 0, for a run that stopped before the end (walltime, a signal): extra fields for
        summary.json saying where the app's work stands, for ``summary_markdown`` to show. Writes
        nothing: the outputs wait for the run that completes. The default says nothing more than
        the engine's counts; an app with a few long items (the pipeline app) lists them."""
        return {}

    def draws_figures(self) -> bool:
        """Whether ``finish`` draws matplotlib figures. Rank 0 then imports matplotlib and warms it
        up while the items run (about a second of CPU), so that the end of the run does not wait
        for it; an app that draws none says False and spares rank 0 that second."""
        return True

    def summary_markdown(self, summary: Mapping[str, Any]) -> str:
        """The app's part of summary.md (the engine adds run facts and failures)."""
        return ""

    def headline(self, run: RunInfo, summary: Mapping[str, Any]) -> List[str]:
        """Rank 0, after a complete run's outputs are written: the lines the engine prints on
        stdout at the very end (the numbers a user of the app looks for first, such as the
        reference's closing prints). ``summary`` is summary.json's content. Not called for a
        stopped run, one with failed items, or ``--dry-run``."""
        return []

    def retry_notes(self, summary: Mapping[str, Any]) -> List[str]:
        """Rank 0, for a run with failed items: what to change before the ``--resume`` that runs
        them again, where a plain resume would only fail the same way (a pipeline whose budget is
        spent). Said on stderr and in summary.md before that command; ``summary`` is summary.json's
        content."""
        return []

    def answer(self, summary: Mapping[str, Any]) -> Optional[str]:
        """The run's answer in one line (markdown), shown right under summary.md's title, before
        the run's facts: what a user opening the folder looks for first (the best point and its
        error, say). ``summary`` is summary.json's content; None: no such line."""
        return None

    def first_result_warning(self, result: Any) -> Optional[str]:
        """Rank 0, once, on the first result the run gets: a line to print at once where that result
        shows the outputs will not be what the user asked for (a sweep's ``--minimise`` naming a value
        its function does not return), so that it is read hours before the end. None: nothing to say."""
        return None

    def output_names(self) -> Tuple[str, ...]:
        """The names (``fnmatch`` patterns) of what ``finish`` and the workers write at the top of
        the results folder: files, and folders such as ``models``. A run without a journal to
        resume is refused in a folder already holding one of these or one of the engine's, so
        ``--results .`` works beside a user's other files and never overwrites them. The
        default ``*`` claims every name: such an app needs a new or empty folder."""
        return ("*",)

    # ----- every rank -----
    def pools(self) -> Dict[str, Any]:
        """Every rank: named resource pools workers may acquire: ``{name: (capacity, "node"|"global")}``
        (a "node" pool's capacity is this rank's)."""
        return {}

    # ----- worker process -----
    def setup_worker(self, device: Device) -> Any:
        """Once per worker process: load data onto the device; the return value is ``state``."""
        return None

    def run_item(self, state: Any, item: Item, seed: np.random.SeedSequence | int) -> Any:
        """Do one item and return a JSON-able result (numbers, strings, lists, dicts). ``seed``: the
        item's own SeedSequence (an int where ``seed_form`` is "int32")."""
        raise NotImplementedError

    def run_group(self, state: Any, items: List[Item], seeds: List[np.random.SeedSequence | int]) -> List[Any]:
        """Do several items of one ``Item.group`` together; one result per item, in order. ``seeds``:
        each item's, as ``run_item`` gets it (SeedSequences, or ints where ``seed_form`` is "int32").

        Override to share work between them (e.g. train same-shaped models in one batched step);
        the result of an item must not depend on which others came with it. If this raises, every
        item of the group has failed this attempt."""
        return [self.run_item(state, item, seed) for item, seed in zip(items, seeds)]


#: ``check_fields`` types: a number (not a bool), or a number or None (JSON null)
NUMBER = (int, float)
NUMBER_OR_NONE = (int, float, type(None))


def resumed_note(this_run: int, earlier: int, what: str) -> str:
    """`` (this run's N of M WHAT; the rest ran in an earlier one)`` after a timing line of a run that
    resumed ``earlier`` of its items, else ``""``: the time is this run's alone."""
    if not earlier:
        return ""
    return f" (this run's {this_run} of {this_run + earlier} {what}; the rest ran in an earlier one)"


def percent(rate: Optional[float]) -> str:
    """An error rate (a fraction) as an app's summary.md gives it: in %, as its figures do ("2.00 %";
    a fraction such as 0.0200 beside a figure of 2 % was read as 0.02 %), or "n/a"."""
    return "n/a" if rate is None else f"{100 * rate:.2f} %"


def finite_number(value: Any) -> bool:
    """Whether a value read from JSON (or returned by a user's code) is a finite int or float: not a
    bool, not NaN or an infinity, which JSON cannot hold."""
    return isinstance(value, NUMBER) and not isinstance(value, bool) and math.isfinite(value)


def check_fields(result: Any, fields: Mapping[str, Union[type, Tuple[type, ...]]]) -> None:
    """Raise ValueError unless ``result`` is a JSON object holding each of ``fields`` with a
    value of its type(s) (``NUMBER`` for numbers: bool is no number here)."""
    if not isinstance(result, dict):
        raise ValueError(f"a {type(result).__name__}, not a JSON object")
    for name, types in fields.items():
        if name not in result:
            raise ValueError(f"no {name!r}")
        value = result[name]
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
            raise ValueError(f"{name!r} is {value!r}")
        if not isinstance(value, types):
            raise ValueError(f"{name!r} is a {type(value).__name__}")


def check_range(result: Mapping[str, Any], names: Tuple[str, ...], low: float, high: float = math.inf) -> None:
    """Raise ValueError unless each of ``names`` in ``result`` (checked by :func:`check_fields`
    first) lies in [``low``, ``high``]: an error rate that is negative, a count below zero or a
    NaN is no result any item makes (a journal edited or damaged by hand)."""
    for name in names:
        value = result[name]
        if value is not None and not low <= value <= high:
            raise ValueError(f"{name!r} is {value!r}, outside [{low:g}, {high:g}]")
