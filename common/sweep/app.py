"""The sweep as an engine app: a user's function run once per point (and repeat) on every GPU of
every node, with the engine's journal, resume, retries and reports.

Two front doors build the same :class:`SweepApp`: :func:`main` from a script
(``sweep.main(fit, grid={...})``) and ``python -m common.sweep MODULE:FUNCTION --grid FILE``.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import json
import logging
import math
import multiprocessing
import numbers
import operator
import os
import pickle
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from common.argtypes import at_least
from common.results.outputs import json_key, to_jsonable
from common.workers.spawnable import unreachable_from_workers

from ..app import App, RunInfo
from ..errors import EXIT_USAGE, ItemFailed, UsageError, kind_of, quoted
from ..items import Item, item_seed
from . import report
from .space import (
    check_count,
    check_unique,
    function_name,
    grid_space,
    list_points,
    load_file,
    point_key,
    sample_points,
)

log = logging.getLogger("multinode_gpu")

#: the names a sweep function's parameters may have, and what each receives
ARGUMENTS = ("params", "seed", "device", "state", "rng")
#: what a function taking ``**kwargs`` receives: the arguments of before ``rng`` (a Generator per item
#: costs some 15 us, and a wrapper passing its ``**kwargs`` on must not meet a name it never knew)
KWARGS_ARGUMENTS = ARGUMENTS[:4]


@dataclass
class Preset:
    """What :func:`main` was given in Python: the function and its space (instead of files)."""

    function: Callable[..., Any]
    grid: Any = None
    space: Any = None
    points: Any = None
    setup: Optional[Callable[..., Any]] = None
    samples: Optional[int] = None
    repeats: int = 1
    minimise: Optional[str] = None
    maximise: Optional[str] = None
    unguarded: str = ""  # "FILE:LINE" of a main() call outside `if __name__ == "__main__":`


@dataclass
class Plan:
    """Every rank's resolved sweep: the function, its setup, the points and how results are judged."""

    function: Callable[..., Any]
    setup: Optional[Callable[..., Any]]
    points: List[Dict[str, Any]]
    kind: str  # "grid", "points" or "samples"
    repeats: int
    metric: Optional[str] = None
    goal: str = "min"  # "min" or "max"
    wants: Tuple[str, ...] = field(default_factory=tuple)  # which of ARGUMENTS the function takes
    keys: List[str] = field(default_factory=list)  # point_key of each point (empty: made from the points)
    # each parameter's values in the order the user gave them (the grid's, the list's, a space's choices),
    # as points: the figure's axes of values that are not numbers (empty: the points themselves)
    listed: List[Dict[str, Any]] = field(default_factory=list)


def _points(kind: str, value: Any, args: Any) -> Tuple[List[Dict[str, Any]], Optional[List[str]]]:
    """The points of a space as read (``kind``: grid, points or samples) and their keys; bad input
    is a UsageError."""
    try:
        if kind == "grid":
            points, keys = grid_space(value, args.repeats)
        elif kind == "points":
            check_count(len(value) if isinstance(value, (list, tuple)) else 0, args.repeats, "the list of points")
            points = list_points(value)
            keys = check_unique(points)
        else:
            check_count(args.samples, args.repeats, f"--samples {args.samples}")
            drawn = {point_key(p): p for p in sample_points(value, args.samples, args.seed)}
            points, keys = list(drawn.values()), list(drawn)  # a small space may draw a point twice
    except RecursionError:  # a YAML anchor inside itself (x: &a [*a]), or nesting deeper than Python recurses
        raise UsageError(f"the {kind if kind != 'samples' else 'space'}: a value nested too deeply, or one that "
                         f"contains itself (a YAML anchor used inside itself)") from None
    clash = next((point for point in points if "repeat" in point), None) if args.repeats > 1 else None
    if clash is not None:
        raise UsageError(f"a parameter named 'repeat' (the point {point_key(clash)}) and --repeats can give two "
                         f"items one key (the point a=1,repeat=1 and --repeats' repeat=1 of the point a=1): rename "
                         f"the parameter")
    return points, keys


def split_target(target: str, what: str = "MODULE:FUNCTION") -> Tuple[str, str]:
    """(module, function) of ``module:function``, the module to be found from the current folder
    (as ``python -m`` finds one: the folder goes on ``sys.path``)."""
    module_name, colon, name = target.partition(":")
    if not colon or not module_name or not name:
        raise UsageError(f"{what} must look like module:function (my_sweep:fit), got {target!r}")
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:  # a file: a likely first try
        file = Path(module_name)
        where = "" if file.parent == Path(".") else f", from the folder that holds it (cd {quoted(file.parent)})"
        raise UsageError(f"{what} names a module, not a file: {file.name.removesuffix('.py')}:{name}{where}, "
                         f"got {target!r}")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return module_name, name


def resolve(target: str, what: str = "MODULE:FUNCTION") -> Callable[..., Any]:
    """Import ``module:function`` (the module found from the current folder, as ``python -m`` would)."""
    module_name, name = split_target(target, what)
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # ImportError, SyntaxError, or whatever its top level raised
        detail = " ".join(f"{type(error).__name__}: {error}".split())
        raise UsageError(f"cannot import {module_name!r} (from {quoted(os.getcwd())}): {detail}") from None
    except SystemExit as exit_:  # its top level ends the program (sys.exit, its own argparse)
        raise UsageError(f"importing {module_name!r} (from {quoted(os.getcwd())}) exited the program "
                         f"(SystemExit: {exit_.code}): a module to sweep must not run anything when imported; "
                         f"put that under `if __name__ == \"__main__\":`") from None
    found: Any = module
    missing = object()
    for part in name.split("."):
        found = getattr(found, part, missing)
        if found is missing:
            raise UsageError(f"module {module_name!r} ({quoted(getattr(module, '__file__', module_name))}) has no "
                             f"{name!r}")
    if not callable(found):  # a name set to None, 3, a list: said as what it is, not as missing
        raise UsageError(f"{what} {target!r} is not a function but "
                         f"{'None' if found is None else f'a value of type {type(found).__name__}'}")
    return found


def _wanted(function: Callable[..., Any], has_setup: bool = True) -> Tuple[str, ...]:
    """Which of ARGUMENTS the function takes by name; anything else it requires is refused.
    Without a setup there is no ``state``: ``**kwargs`` does not receive it and a ``state`` with a
    default keeps its default (one without is refused by the caller)."""
    name = getattr(function, "__qualname__", repr(function))
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        raise UsageError(f"cannot read the parameters of {name!r}") from None
    wants = []
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            given = [argument for argument in KWARGS_ARGUMENTS if has_setup or argument != "state"]
            return tuple(dict.fromkeys([*wants, *given]))
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if parameter.name in ARGUMENTS and parameter.kind is not inspect.Parameter.POSITIONAL_ONLY:
            if parameter.name == "state" and not has_setup and parameter.default is not inspect.Parameter.empty:
                continue
            wants.append(parameter.name)
        elif parameter.default is inspect.Parameter.empty:
            if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
                raise UsageError(f"{name}() takes {parameter.name!r} positional-only (before '/'): a sweep function "
                                 f"receives its arguments by name ({', '.join(ARGUMENTS)})")
            raise UsageError(f"{name}() takes {parameter.name!r}, which is none of {', '.join(ARGUMENTS)} "
                             f"(a sweep function's parameters are named after what it receives)")
    return tuple(wants)


def _check_setup(setup: Callable[..., Any]) -> None:
    """``setup(device)`` (or ``setup()``) is how each worker calls it: one that needs more is refused
    here, not by every worker three times and then every item."""
    name = getattr(setup, "__qualname__", repr(setup))
    try:
        signature = inspect.signature(setup)
    except (TypeError, ValueError):
        return  # a builtin: the worker's call says
    try:
        signature.bind("cpu") if signature.parameters else signature.bind()
    except TypeError as error:
        raise UsageError(f"setup {name}() cannot be called as each worker calls it, with the device or with "
                         f"nothing ({error})") from None


def _choices(space: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """A random space's ``choice`` values in the order it lists them, as points of one parameter each
    (drawn points give them in the order drawn)."""
    return [{name: choice} for name, spec in space.items() if isinstance(spec, Mapping)
            for choice in spec.get("choice") or ()]


def _picklable(function: Callable[..., Any], what: str) -> None:
    """Workers are spawned processes: they find the function by its module and name, and a function
    of ``__main__`` by running the script's file again (multiprocessing's 'spawn')."""
    name = getattr(function, "__qualname__", function)
    try:
        pickle.dumps(function)
    except Exception:
        raise UsageError(f"{what} {name!r} cannot be sent to the workers: define it with def at the top level of a "
                         f"module (not a lambda or a nested function)") from None
    if unreachable_from_workers(function):
        raise UsageError(f"{what} {name!r} is defined where the workers cannot import it from (python -c, standard "
                         f"input, a notebook, an interactive session, or a package's __main__.py): put it in a .py "
                         f"file of its own and run that, or import it from one")


def _check_preset(preset: Preset, args: argparse.Namespace) -> None:
    """sweep.main's own arguments, held to what the command line's flags accept: argparse checks
    a flag's value, but a default given in Python (sweep.main's) reaches ``args`` unchecked. A
    whole number of another type (numpy's) becomes an int."""
    for name in ("repeats", "samples"):
        value = getattr(args, name)
        if value is None:
            continue
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
            raise UsageError(f"sweep.main: {name} must be a whole number of at least 1, got {value!r}")
        setattr(args, name, int(value))
    for name in ("minimise", "maximise"):
        value = getattr(preset, name)
        if value is not None and not isinstance(value, str):
            raise UsageError(f"sweep.main: {name} must be the name of a value the function returns, got "
                             f"{kind_of(value)}")
    if preset.minimise is not None and preset.maximise is not None:
        raise UsageError("sweep.main takes minimise= or maximise=, not both")


class SweepApp(App):
    """A function over a space of parameters, one item per point and repeat."""

    name = "sweep"
    module = "common.sweep"
    description = "Run a function over a grid, a list or random samples of parameters on every GPU of every node"
    #: set by :func:`main` on the subclass it makes; None for ``python -m common.sweep``
    preset: Optional[Preset] = None
    #: each item's seed as the function gets it: 32 bits of the item's stream, without its SeedSequence
    seed_form = "int32"

    @classmethod
    def results_name(cls, args: argparse.Namespace) -> str:
        """Each script or module its own folder: ``svm_digits.py`` or ``svm_digits:fit`` ->
        ``results/svm_digits``."""
        if cls.preset is not None:  # sweep.main in the program that was started
            function, main = cls.preset.function, sys.modules.get("__main__")
            code = getattr(function, "__code__", None)
            if getattr(function, "__module__", None) == "__main__" and code is not None:
                # the file that defines it: the script (also under python -m cProfile), or a package's __main__
                path = Path(code.co_filename)
                module = path.parent.name if path.stem == "__main__" else path.stem
            elif getattr(main, "__spec__", None) is not None:  # python -m pkg.script, its function imported
                module = main.__spec__.name.removesuffix(".__main__")
            else:
                module = Path(getattr(main, "__file__", "") or "").stem
        else:
            module = str(getattr(args, "function", "")).partition(":")[0]
        name = module.rpartition(".")[2]
        return name if name and not name.startswith("<") and name != "__main__" else cls.name  # python -c: "<string>"

    @classmethod
    def results_name_help(cls) -> str:
        return cls.results_name(argparse.Namespace()) if cls.preset is not None else "MODULE (a.b:fit -> results/b)"

    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        self.preset = type(self).preset
        self.plan: Optional[Plan] = None
        self.left_out = 0  # rank 0: results in the journal resumed of points not in this space

    def __reduce__(self) -> Any:
        """Workers unpickle a plain SweepApp: the subclass :func:`main` makes exists only in the rank.
        Its plan goes without the points and their keys, which only rank 0 uses (each item brings
        its own point): a big space is not pickled once more per worker."""
        state = dict(self.__dict__)
        if self.plan is not None:
            state["plan"] = replace(self.plan, points=[], keys=[])
        return (SweepApp.__new__, (SweepApp,), state)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        preset = cls.preset
        if preset is None:
            parser.add_argument("function", metavar="MODULE:FUNCTION",
                                help="the function to run, found from the current folder as python -m finds a module")
            space = parser.add_mutually_exclusive_group()
            space.add_argument("--grid", type=Path, metavar="FILE",
                               help="JSON (or YAML) object of parameter -> list of values: every combination")
            space.add_argument("--points", type=Path, metavar="FILE", help="JSON (or YAML) list of points (objects)")
            space.add_argument("--space", type=Path, metavar="FILE",
                               help="JSON (or YAML) object of parameter -> {uniform|loguniform|int: [low, high]} "
                                    "or {choice: [values]}; with --samples N")
            parser.add_argument("--setup", metavar="[MODULE:]FUNCTION", default=None,
                                help="setup(device) run once per worker; its return is the function's 'state'")
        parser.add_argument("--samples", type=at_least(1), default=preset.samples if preset else None,
                            help="random points drawn from the space (from --seed)")
        parser.add_argument("--repeats", type=at_least(1), default=preset.repeats if preset else 1,
                            help="items per point, each with its own seed (bootstraps)")
        goal = parser.add_mutually_exclusive_group()
        goal.add_argument("--minimise", "--minimize", metavar="NAME", default=preset.minimise if preset else None,
                          help="the returned value to minimise: best rows and a figure of it against each parameter")
        goal.add_argument("--maximise", "--maximize", metavar="NAME", default=preset.maximise if preset else None,
                          help="the returned value to maximise")

    def check_arguments(self) -> None:
        args = self.args
        if self.preset is not None:
            _check_preset(self.preset, args)
        if self.preset is not None and args.minimise is not None and args.maximise is not None:
            # one of them is sweep.main's own: the command line's other one replaces it
            if args.minimise == self.preset.minimise:
                args.minimise = None
            elif args.maximise == self.preset.maximise:
                args.maximise = None
        if args.minimise is not None and args.maximise is not None:
            raise UsageError("give --minimise or --maximise, not both")
        for flag in ("minimise", "maximise"):
            if getattr(args, flag) is not None and not str(getattr(args, flag)).strip():
                raise UsageError(f"--{flag} needs the name of a value the function returns")
        if self.preset is not None and self.preset.unguarded:
            _picklable(self.preset.function, "the function")  # a package's __main__.py: guarding it would not do
            raise UsageError(f"{self.preset.unguarded}: sweep.main is called at the top level of the script; call "
                             f"it under `if __name__ == \"__main__\":` (each worker imports the script, and would "
                             f"start a sweep of its own)")
        if self.preset is None:
            chosen = [flag for flag in ("grid", "points", "space") if getattr(args, flag) is not None]
            if not chosen:
                raise UsageError("say what to sweep: --grid FILE, --points FILE or --space FILE --samples N")
            space_given = args.space is not None
        else:
            chosen = [name for name in ("grid", "points", "space") if getattr(self.preset, name) is not None]
            if len(chosen) != 1:
                raise UsageError(f"sweep.main takes one of grid=, points= or space= (got "
                                 f"{', '.join(chosen) or 'none'})")
            space_given = chosen == ["space"]
        if space_given and args.samples is None:
            raise UsageError("a random space needs --samples N (how many points to draw)")
        if not space_given and args.samples is not None:
            raise UsageError("--samples draws from a random space (--space); the grid or list gives its own points")

    def validate(self) -> None:
        """Every rank: import the function, read the space and make its points (all bad input is found here)."""
        args, preset = self.args, self.preset
        if preset is None:
            function = resolve(args.function)
            setup = None
            if args.setup:
                target = args.setup if ":" in args.setup else f"{args.function.partition(':')[0]}:{args.setup}"
                setup = resolve(target, "--setup")
            if args.grid is not None:
                kind, value = "grid", load_file(args.grid, "--grid")
            elif args.points is not None:
                kind, value = "points", load_file(args.points, "--points")
            else:
                kind, value = "samples", load_file(args.space, "--space")
        else:
            function, setup = preset.function, preset.setup
            kind = "samples" if preset.space is not None else ("grid" if preset.grid is not None else "points")
            value = {"grid": preset.grid, "points": preset.points, "samples": preset.space}[kind]
        if not callable(function):
            raise UsageError(f"the sweep function must be a function, got {kind_of(function)}")
        if not isinstance(getattr(function, "__qualname__", None), str):  # a functools.partial, an object with __call__
            raise UsageError(f"the sweep function must be a function defined with def, got {kind_of(function)}: a "
                             f"run is found again on --resume by its function's name, which this has not; wrap "
                             f"it in a def at the top level of a module")
        if setup is not None and not callable(setup):
            raise UsageError(f"setup must be a function, got {kind_of(setup)}")
        for what, given in (("the sweep function", function), ("setup", setup)):
            if inspect.iscoroutinefunction(given) or inspect.isasyncgenfunction(given):  # nothing would await it
                raise UsageError(f"{what} {given.__qualname__!r} is defined with async def, and a worker calls it "
                                 f"as a plain function: define it with def (it may run asyncio.run(...) inside)")
        if inspect.isgeneratorfunction(function):  # each item would fail on the generator it returns
            raise UsageError(f"the sweep function {function.__qualname__!r} yields: it must return a dict of its "
                             f"values (yield gives a generator, not them)")
        wants = _wanted(function, has_setup=setup is not None)
        if "state" in wants and setup is None:  # it would be given None, and fail every item (twice) on it
            where = "--setup MODULE:FUNCTION" if self.preset is None else "setup= in sweep.main"
            raise UsageError(f"{function.__qualname__!r} takes 'state', what a setup function returns once per "
                             f"worker, but no setup is given: give {where}, or drop 'state'")
        _picklable(function, "the function")
        if setup is not None:
            _picklable(setup, "setup")
            _check_setup(setup)
        points, keys = _points(kind, value, args)
        metric = args.minimise or args.maximise
        self.plan = Plan(function, setup, points, kind, args.repeats, metric,
                         "max" if args.maximise else "min", wants, keys, _choices(value) if kind == "samples" else [])

    def check_before_the_queue(self) -> None:
        """What ``python -m common.slurm`` checks on the login node, beyond :meth:`check_arguments`
        (from the shell, not a script's ``sweep.main``): the function's module can be found from
        this folder, where the job starts (found, not imported: its top level may load a GPU library
        or data; only the packages above it are), and the space's file reads and makes its points."""
        args = self.args
        if self.preset is not None:
            return
        targets = [("", args.function)]
        if args.setup and ":" in args.setup:  # a setup without a module is in the function's
            targets.append(("--setup ", args.setup))
        for flag, target in targets:
            module_name, _ = split_target(target, flag.strip() or "MODULE:FUNCTION")
            try:  # a package's __init__ runs to find a module in it; whatever it raises is a module not found here
                found = importlib.util.find_spec(module_name) is not None
            except Exception:
                found = False
            if not found:
                raise UsageError(f"{flag}cannot find module {module_name!r} from {quoted(os.getcwd())}, where the job "
                                 f"starts")
        for kind, flag in (("grid", "grid"), ("points", "points"), ("samples", "space")):
            path = getattr(args, flag)
            if path is not None:
                _points(kind, load_file(path, f"--{flag}"), args)

    def fingerprint(self) -> Dict[str, Any]:
        # not the space: --resume after adding points runs only the new ones
        return {"function": function_name(self.plan.function)}

    def output_names(self) -> Tuple[str, ...]:
        return report.OUTPUT_NAMES

    def items(self) -> List[Item]:
        plan = self.plan
        keys = plan.keys or [point_key(point) for point in plan.points]
        # point_key(point, repeat): the point's key, then ",repeat=R" from the second repeat on
        items = [Item(key if repeat == 0 else f"{key},repeat={repeat}", {"point": point, "repeat": repeat})
                 for key, point in zip(keys, plan.points) for repeat in range(plan.repeats)]
        for item in items:  # a key of another item in the run resumed: its result is not this item's
            record = self.journaled.get(item.key)
            done = record.result.get("repeat") if record is not None and isinstance(record.result, dict) else None
            if done is not None and done != item.params["repeat"]:
                named, repeated = "a point with a parameter named 'repeat'", "--repeats' repeat={} of a point"
                ours, theirs = ((repeated.format(item.params["repeat"]), named) if item.params["repeat"]
                                else (named, repeated.format(done)))
                raise UsageError(f"cannot resume: the item {item.key} is {ours} here, but {theirs} in the journal "
                                 f"(one key, two items); rename the parameter 'repeat' and run in a new --results "
                                 f"folder")
        self.left_out = len(self.journaled.keys() - {item.key for item in items})
        if self.left_out:  # said as the run starts, and again at its end
            log.info("%s: %s", self.name, report.left_out_line(self.left_out, ranked=plan.metric is not None))
        return items

    def check_result(self, key: str, result: Any) -> None:
        if not isinstance(result, dict) or not isinstance(result.get("return"), dict):
            raise ValueError("not a JSON object holding the function's return")
        if isinstance(result.get("seed"), bool) or not isinstance(result.get("seed"), int):
            raise ValueError("no integer seed")
        repeat = result.get("repeat", 0)  # absent in the journals of earlier versions
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 0:
            raise ValueError("a repeat that is not a count")
        if _holds_huge_int(result["return"]):  # what the item's own check refuses, which an earlier version let through
            try:
                checked_result(key, result["return"])
            except TypeError as error:
                raise ValueError(f"{error}; an earlier version let it through") from None

    # ----- worker -----
    def setup_worker(self, device: Any) -> Any:
        """Once per worker: ``setup(device)`` where given; the worker keeps its device's kind beside it."""
        setup = self.plan.setup
        state = None
        if setup is not None:
            try:
                takes = len(inspect.signature(setup).parameters)
            except (TypeError, ValueError):
                takes = 1
            state = setup(device.kind) if takes else setup()
        return (state, device.kind)

    def run_item(self, state: Any, item: Item, seed: Any) -> Any:
        plan = self.plan
        seed32 = seed  # item_seed32 of the item's SeedSequence (seed_form "int32")
        wants = plan.wants
        if wants:  # only what the function takes (most items of a big sweep are short)
            given = {"seed": seed32, "device": state[1], "state": state[0]}
            if "params" in wants:
                given["params"] = dict(item.params["point"])
            if "rng" in wants:  # the item's whole stream (128 bits of its key): no two items share it
                import numpy as np

                given["rng"] = np.random.default_rng(item_seed(self.args.seed, item.key))
            result = plan.function(**{name: given[name] for name in wants})
        else:
            result = plan.function()
        try:
            returned = checked_result(item.key, result)
        except TypeError as error:  # the same return again on a retry: it fails for good at once
            raise ItemFailed(str(error), retry=False, shown_as=type(error).__name__) from None
        # the seed travels with the return: rank 0 writes it in results.csv without deriving it again;
        # the repeat tells a resume this result from another item's of the same key (a parameter 'repeat')
        return {"seed": seed32, "return": returned, "repeat": item.params["repeat"]}

    # ----- rank 0, at the end -----
    def finish(self, run: RunInfo) -> Dict[str, Any]:
        return report.write(run, self.plan, self.left_out)

    def where_stopped(self, run: RunInfo) -> Dict[str, Any]:
        """A stopped run writes no sweep section: it keeps the ranking a later resume is told of."""
        return report.ranking_kept(run, self.plan)

    def draws_figures(self) -> bool:
        return self.plan is None or self.plan.metric is not None  # the figure of --minimise/--maximise's metric

    def summary_markdown(self, summary: Mapping[str, Any]) -> str:
        return report.markdown(summary.get("sweep") or {})

    def first_result_warning(self, result: Any) -> Optional[str]:
        return report.first_result_warning(self.plan, result.get("return") if isinstance(result, dict) else None)

    def headline(self, run: RunInfo, summary: Mapping[str, Any]) -> List[str]:
        return report.headline(summary.get("sweep") or {})

    def answer(self, summary: Mapping[str, Any]) -> Optional[str]:
        return report.best_line(summary.get("sweep") or {})


def checked_result(key: str, result: Any) -> Dict[str, Any]:
    """The function's return as JSON: a dict of JSON values (numpy scalars and arrays converted), or
    a one-line error naming the item and what is not JSON."""
    if type(result) is dict and _flat_json(result):
        return dict(result)  # what to_jsonable makes of it, without walking it twice
    if not isinstance(result, Mapping):
        raise TypeError(f"item {key} returned a {type(result).__name__}, not a dict of JSON values")
    plain = to_jsonable(dict(result))
    if len(plain) != len(result):  # two names one in JSON ({1: ..., "1": ...}): the later replaced the earlier
        names: Dict[str, List[Any]] = {}
        for name in result:
            names.setdefault(json_key(name), []).append(name)
        first, second = next(found for found in names.values() if len(found) > 1)[:2]
        raise TypeError(f"item {key} returned the names {first!r} and {second!r}, which are one name in JSON "
                        f"({json_key(first)!r}): one value would silently replace the other")
    where = _not_json(plain)
    if where is not None:
        path, value = where
        if isinstance(value, int):
            raise TypeError(f"item {key} returned an integer of about {_digits(value)} digits at {path}, past "
                            f"a float's range (results.csv, the statistics and the figures take floats): "
                            f"return it as a string")
        raise TypeError(f"item {key} returned a value that is not JSON at {path}: a {type(value).__name__}")
    return plain


#: the types of the values a return is checked for at C speed (str keys, no NaN: see _flat_json)
_FLAT = frozenset((str, int, float, bool, type(None)))
_NAMES = frozenset((str,))
#: integers from here on (in size) have no float: the report's statistics, figures and sorting fail on them
#: (float() rounds up to 2**1024, past the largest double, from here)
_FLOAT_LIMIT = 2 ** 1024 - 2 ** 970


def _fits_float(value: int) -> bool:
    return -_FLOAT_LIMIT < value < _FLOAT_LIMIT


def _digits(value: int) -> int:
    """How many decimal digits ``value`` has, to within one (str() refuses past 4,300 digits)."""
    return int(abs(value).bit_length() * math.log10(2)) + 1


def _flat_json(result: Dict[Any, Any]) -> bool:
    """Whether ``result`` is a flat dict that to_jsonable would copy as it is: str keys, and
    values of exactly str, int (within a float's range), float (not NaN, which it makes None), bool
    or None."""
    values = result.values()
    types = set(map(type, values))
    # a NaN is the one value of these types not equal to itself: every value compared with itself at C speed
    return (types <= _FLAT and _NAMES.issuperset(map(type, result))
            and (float not in types or all(map(operator.eq, values, values)))
            and (int not in types or all(_fits_float(value) for value in values if type(value) is int)))


def _holds_huge_int(value: Any) -> bool:
    """Whether a journaled return holds an int past a float's range: the resume's check of every
    record, so floats (most values, lists of thousands) are passed over without a call."""
    kind = type(value)
    if kind is int:
        return not _fits_float(value)
    if kind is dict:
        value = value.values()
    elif kind is not list:
        return False
    return any(_holds_huge_int(inner) for inner in value if type(inner) is not float)


def _not_json(value: Any, path: str = "") -> Optional[Tuple[str, Any]]:
    if isinstance(value, int) and not isinstance(value, bool) and not _fits_float(value):
        return (path or "the top", value)
    if value is None or isinstance(value, (str, bool, int, float)):
        return None  # an infinity too: json writes Infinity, which Python reads back
    if isinstance(value, dict):
        for name, inner in value.items():
            found = _not_json(inner, f"{path}[{json.dumps(name)}]")
            if found:
                return found
        return None
    if isinstance(value, list):
        for index, inner in enumerate(value):
            found = _not_json(inner, f"{path}[{index}]")
            if found:
                return found
        return None
    return (path or "the top", value)


def _in_a_worker(frame: Any) -> bool:
    """Whether this process is a worker, which imports the user's script as ``__mp_main__`` before
    it is one (``multiprocessing.parent_process()`` is set only after that import): ``frame`` is
    :func:`main`'s own, whose caller is the script's top level there."""
    caller = frame.f_back if frame is not None else None
    return (multiprocessing.parent_process() is not None
            or getattr(multiprocessing.current_process(), "_inheriting", False)  # spawn's bootstrap (the stdlib's test)
            or (caller is not None and caller.f_globals.get("__name__") == "__mp_main__"))


def _script_call(frame: Any) -> Optional[Tuple[str, int, ast.Module]]:
    """(path, line, parsed source) of the script whose top-level code calls :func:`main`
    (``frame``); None where it is called from a function or the source cannot be read."""
    caller = frame.f_back if frame is not None else None
    if caller is None or caller.f_code.co_name != "<module>" or caller.f_globals.get("__name__") != "__main__":
        return None
    path, line = caller.f_code.co_filename, caller.f_lineno
    try:
        return path, line, ast.parse(Path(path).read_text(), path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None


def _result_dropped(frame: Any) -> bool:
    """Whether the script's call of :func:`main` is a statement of its own (``sweep.main(...)``, not
    ``raise SystemExit(sweep.main(...))``): its exit code would be lost, and the script would end
    with 0 after failed items, a refusal or a stop (a Slurm job not requeued on 75)."""
    found = _script_call(frame)
    if found is None:
        return False
    _, line, tree = found
    caller = frame.f_back
    try:  # where on its line the call is (Python 3.11's positions): `code = sweep.main(...); print(code)`
        _, _, column, _ = list(caller.f_code.co_positions())[caller.f_lasti // 2]
    except (AttributeError, IndexError, ValueError):
        column = None

    def holds(node: ast.stmt) -> bool:
        if column is None:
            return node.lineno <= line <= (node.end_lineno or node.lineno)
        end = (node.end_lineno or node.lineno, node.end_col_offset if node.end_col_offset is not None else 1 << 30)
        return (node.lineno, node.col_offset) <= (line, column) <= end

    statements = [node for node in ast.walk(tree) if isinstance(node, ast.stmt) and holds(node)]
    if column is None and sum(1 for node in statements if node.lineno == line) > 1:
        return False  # two statements begin on the call's line: which one holds it cannot be told
    innermost = max(statements, key=lambda node: (node.lineno, node.col_offset), default=None)
    call = innermost.value if isinstance(innermost, ast.Expr) else None
    if not isinstance(call, ast.Call):
        return False
    if column is not None:  # the statement's call is sweep.main's own, not one it is given to: print(sweep.main(...))
        return (call.lineno, call.col_offset) == (line, column)
    return getattr(call.func, "attr", getattr(call.func, "id", None)) == "main"


def _unguarded_call(frame: Any) -> str:
    """"FILE:LINE" where a script calls :func:`main` (``frame``) in its top-level code but not under
    ``if __name__ == "__main__":``, read from the script's source; "" where it is guarded, called
    from a function (that cannot be told) or the source cannot be read."""
    found = _script_call(frame)
    if found is None:
        return ""
    path, line, tree = found

    def guarded(statements: List[ast.stmt]) -> Optional[bool]:
        for statement in statements:
            if statement.lineno <= line <= (statement.end_lineno or statement.lineno):
                if isinstance(statement, ast.If) and _is_main_guard(statement.test):
                    return any(s.lineno <= line <= (s.end_lineno or s.lineno) for s in statement.body) or None
                inner = [child for field in ("body", "orelse", "finalbody") for child in getattr(statement, field, [])]
                inner += [child for handler in getattr(statement, "handlers", []) for child in handler.body]
                return guarded(inner) if inner else False
        return None

    return "" if guarded(tree.body) is not False else f"{Path(path).name}:{line}"


def _is_main_guard(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(side, ast.Name) and side.id == "__name__" for side in sides)
            and any(isinstance(side, ast.Constant) and side.value == "__main__" for side in sides))


def main(function: Callable[..., Any], *, grid: Any = None, space: Any = None, points: Any = None,
         setup: Optional[Callable[..., Any]] = None, samples: Optional[int] = None, repeats: int = 1,
         minimise: Optional[str] = None, maximise: Optional[str] = None,
         argv: Optional[Sequence[str]] = None, minimize: Optional[str] = None, maximize: Optional[str] = None) -> int:
    """Run ``function`` over ``grid`` (dict of lists), ``points`` (list of dicts) or ``space``
    (random, with ``samples``) as a full engine program: the command line takes every engine flag
    (``--gpu``, ``--results``, ``--resume``, ``--dry-run``, ...). Returns the exit code; call it as
    ``raise SystemExit(sweep.main(...))`` under ``if __name__ == "__main__":`` (a plain
    ``sweep.main(...)`` statement in the script's own code exits with it all the same, where it is
    not 0; one in a function of the user's cannot be seen). ``minimize`` and
    ``maximize`` are ``minimise`` and ``maximise`` (as the command line's ``--minimize``)."""
    for british, american, name in ((minimise, minimize, "minimise"), (maximise, maximize, "maximise")):
        if british is not None and american is not None:  # one would silently win
            print(f"sweep: error: sweep.main takes {name}= or {name.replace('s', 'z', 1)}=, not both", file=sys.stderr)
            return EXIT_USAGE
    minimise = minimize if minimise is None else minimise
    maximise = maximize if maximise is None else maximise
    frame = inspect.currentframe()
    from common.sweep import main as door

    if frame is not None and frame.f_back is not None and frame.f_back.f_code is door.__code__:
        frame = frame.f_back  # called through common.sweep.main: its caller is the script's
    if _in_a_worker(frame):  # found before the run by _unguarded_call where the script can be read
        raise SystemExit("sweep.main ran inside a worker: call it under `if __name__ == \"__main__\":` so that the "
                         "workers, which import your script, do not start a sweep of their own")
    from common.run.runner import main as run

    preset = Preset(function, grid, space, points, setup, samples, repeats, minimise, maximise,
                    _unguarded_call(frame))
    app_class = type("SweepApp", (SweepApp,), {"preset": preset, "module": "", "__module__": __name__})
    code = run(app_class, None if argv is None else list(argv))
    if preset.unguarded or (code and _result_dropped(frame)):  # the code would be lost: the process's, all the same
        raise SystemExit(code)
    return code
