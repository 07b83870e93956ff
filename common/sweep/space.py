"""The points of a sweep: a grid, an explicit list, or random samples, each checked as the user wrote
it (one-line :class:`UsageError` for anything wrong), and each point's item key.

A key is made of the parameter values themselves (``C=10,gamma=0.001``, ``,repeat=2`` for the
later repeats), never of a position: adding values to a grid adds keys and leaves the others as
they were, so ``--resume`` runs only the new points.
"""
from __future__ import annotations

import itertools
import json
import math
import numbers
import operator
import sys
import zlib
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Tuple

import numpy as np

from common.results.outputs import to_jsonable

from .. import userfile
from ..errors import UsageError, kind_of, quoted, short

#: the distributions a --space may name, each with what its two bounds must be
DISTRIBUTIONS = ("uniform", "loguniform", "int", "choice")
#: the largest float: a "uniform" or "loguniform" bound past it (an int such as 10**400) is none
FLOAT_MAX = sys.float_info.max
#: the bounds an "int" distribution may have: numpy draws int64s
INT64 = (-2 ** 63, 2 ** 63 - 1)
#: the most points (times --repeats) one sweep may have: rank 0 keeps every item and result in memory
#: (about 900 bytes each, bench_scale); a typo's 10^8 samples would fill the node's memory first
MAX_ITEMS = 1_000_000
#: the largest --grid, --points or --space file read: far more than MAX_ITEMS points take
MAX_FILE_BYTES = 256 * 2**20
#: spawn-key tag of the sample draws, so they never share a stream with an item's own seed
_SAMPLE_TAG = 0x5A3F1E


def load_file(path: Path, what: str) -> Any:
    """A JSON file, or YAML (``.yaml``/``.yml``, with PyYAML) as one value (:mod:`common.userfile`)."""
    shown = f"{what} {quoted(path)}"
    try:
        text = userfile.read_text(Path(path), MAX_FILE_BYTES, shown, "a sweep's parameters (is it the right file?)")
    except OSError as error:
        raise UsageError(f"{shown}: cannot read it ({getattr(error, 'strerror', None) or error})") from None
    return userfile.parse(text, Path(path), shown)


def check_count(count: int, repeats: int, what: str) -> None:
    """Refuse a sweep of more than MAX_ITEMS items (``count`` points x ``repeats``) before it is built."""
    if count * repeats > MAX_ITEMS:
        times = f" x --repeats {repeats}" if repeats > 1 else ""
        raise UsageError(f"{what}: {count:,} points{times} is {count * repeats:,} items, more than one run takes "
                         f"({MAX_ITEMS:,}); split the sweep into several runs")


def _check_name(name: Any, where: str) -> str:
    if isinstance(name, (bool, int, float)) or name is None:  # YAML reads an unquoted 123, 1e-3, true or null so
        raise UsageError(f"{where}: parameter name {name!r} is not a string but {type(name).__name__} (in YAML, quote "
                         f"a name such as 123, 1e-3, true or null)")
    if not isinstance(name, str) or not name or any(c in name for c in ",=\n"):
        raise UsageError(f"{where}: parameter name {name!r} must be a non-empty string without ',', '=' or a newline")
    return name


def _plain(value: Any, where: str) -> Any:
    """A parameter value as JSON holds it (numpy scalars, tuples converted); refused if it is not JSON-able."""
    kind = type(value)
    if kind is int or kind is str or kind is bool or value is None or (kind is float and math.isfinite(value)):
        return value  # most values: a 20,000-point grid is checked on every rank
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and not math.isfinite(value):
        raise UsageError(f"{where}: {value!r} is not a value JSON can hold")  # numpy's too (a numpy float is fine)
    plain = to_jsonable(value)
    try:
        json.dumps(plain, allow_nan=False)
    except (TypeError, ValueError):
        raise UsageError(f"{where}: value {value!r} (a {type(value).__name__}) is not a JSON value") from None
    return plain


def _same(value: Any, text: str) -> Any:
    """What two values listed twice share: the number itself for an int or float (1 and 1.0 are
    one number; their keys, and so their seeds, differ), else the text of the key."""
    return value if type(value) in (int, float) else text


def grid_space(grid: Any, repeats: int = 1) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Every combination of a grid's lists, the first parameter varying slowest, and each point's
    :func:`point_key`, made from each value's text once (the texts the check for a value listed
    twice makes) rather than once per point; refused
    before it is built where, with ``repeats``, it would be more than MAX_ITEMS items."""
    if not isinstance(grid, Mapping):
        raise UsageError(f"the grid must be an object of parameter -> list of values, got {kind_of(grid)}")
    if not grid:
        raise UsageError("the grid is empty: give at least one parameter with a list of values")
    axes = []
    for name, values in grid.items():
        _check_name(name, "the grid")
        if getattr(values, "ndim", 0) and callable(getattr(values, "tolist", None)):
            values = values.tolist()  # grid={"lr": np.logspace(-4, -1, 4)}, or torch.logspace: its values
        if isinstance(values, range):  # range(1, 4): its numbers, in order
            values = list(values)
        if isinstance(values, Iterator):  # a generator: its values, in order; an endless one is refused
            values = list(itertools.islice(values, MAX_ITEMS + 1))
            if len(values) > MAX_ITEMS:
                raise UsageError(f"the grid's {name!r} gives more than {MAX_ITEMS:,} values (an endless "
                                 f"iterator?): give a list")
        if isinstance(values, (set, frozenset)):  # its order, and so the items' order, would change from run to run
            raise UsageError(f"the grid's {name!r} is a set, whose order is not kept from one run to the next: "
                             f"give a list (sorted() of it, for one)")
        if isinstance(values, Mapping) and len(values) == 1 and next(iter(values)) in DISTRIBUTIONS:
            raise UsageError(f"the grid's {name!r} is a distribution ({short(values)}): a random space is given "
                             f"with --space FILE --samples N (space= in sweep.main); a grid lists its values")
        if not isinstance(values, (list, tuple)):
            one = (f"; write [{json.dumps(values)}] for one value"
                   if values is None or isinstance(values, (str, bool, int, float)) else "")
            raise UsageError(f"the grid's {name!r} must be a list of values, got {kind_of(values)} "
                             f"({short(values)}){one}")
        if not values:
            raise UsageError(f"the grid's {name!r} is an empty list: the grid would have no point")
        plain = [_plain(v, f"the grid's {name!r}") for v in values]
        seen: Dict[Any, str] = {}
        for value in plain:
            text = value_text(value)
            same = _same(value, text)
            if same in seen:
                first = seen[same]
                if first == text:
                    raise UsageError(f"the grid's {name!r} lists {text} twice")
                raise UsageError(f"the grid's {name!r} lists {first} and {text}: one number, which would be two "
                                 f"items with two seeds; keep one")
            seen[same] = text
        axes.append((name, plain, [f"{name}={text}" for text in seen.values()]))
    check_count(math.prod(len(plain) for _, plain, _ in axes), repeats, "the grid")
    names = [name for name, _, _ in axes]
    points = [dict(zip(names, combo)) for combo in itertools.product(*[plain for _, plain, _ in axes])]
    parts = [texts for _, _, texts in axes]
    if len(parts) == 1:
        return points, parts[0]
    # a key lists the names sorted (point_key): each combination's parts picked in that order
    order = operator.itemgetter(*sorted(range(len(names)), key=names.__getitem__))
    return points, [",".join(order(combo)) for combo in itertools.product(*parts)]


def list_points(points: Any) -> List[Dict[str, Any]]:
    """An explicit list of points (dicts), each checked."""
    if not isinstance(points, (list, tuple)):
        raise UsageError(f"the points must be a list of objects (parameter -> value), got {kind_of(points)}")
    if not points:
        raise UsageError("the list of points is empty")
    result = []
    for number, point in enumerate(points, 1):
        if not isinstance(point, Mapping) or not point:
            raise UsageError(f"point {number} must be a non-empty object (parameter -> value), got {point!r}")
        result.append({_check_name(name, f"point {number}"): _plain(value, f"point {number}'s {name!r}")
                       for name, value in point.items()})
    return result


def _bounds(name: str, spec: Any, kind: str) -> tuple:
    where = f"the space's {name!r} ({kind})"
    if not isinstance(spec, (list, tuple)) or len(spec) != 2:
        raise UsageError(f"{where} needs [low, high], got {spec!r}")
    low, high = spec
    number = int if kind == "int" else (int, float)
    # an int is finite however large (math.isfinite would overflow on it): the checks below bound it
    if any(isinstance(b, bool) or not isinstance(b, number) or not (isinstance(b, int) or math.isfinite(b))
           for b in (low, high)):
        raise UsageError(f"{where}: bounds must be finite {'integers' if kind == 'int' else 'numbers'}, got {spec!r}")
    if low > high or (kind != "int" and low == high):
        raise UsageError(f"{where}: bounds in the wrong order ({low!r} is not below {high!r})")
    if kind == "loguniform" and low <= 0:
        raise UsageError(f"{where}: bounds must be positive, got {low!r}")
    if kind == "int" and not INT64[0] <= low <= high <= INT64[1]:  # what numpy draws integers in
        raise UsageError(f"{where}: bounds must lie within 64-bit integers ({INT64[0]} to {INT64[1]}), got {spec!r}")
    if kind != "int" and not all(abs(b) <= FLOAT_MAX for b in (low, high)):
        raise UsageError(f"{where}: bounds must lie within a float's range (+-{FLOAT_MAX:.3g}), got {spec!r}")
    if kind == "uniform" and not math.isfinite(float(high) - float(low)):
        raise UsageError(f"{where}: bounds too far apart for a float ({low!r} to {high!r})")
    return low, high


def check_space(space: Any) -> Dict[str, tuple]:
    """A random-search space: parameter -> ``{"uniform"|"loguniform"|"int": [low, high]}`` or
    ``{"choice": [values]}``; returns parameter -> (distribution, arguments)."""
    if not isinstance(space, Mapping):
        raise UsageError(f"the space must be an object of parameter -> distribution, got {kind_of(space)}")
    if not space:
        raise UsageError("the space is empty: give at least one parameter with a distribution")
    checked = {}
    for name, spec in space.items():
        _check_name(name, "the space")
        if not isinstance(spec, Mapping) or len(spec) != 1:
            raise UsageError(f"the space's {name!r} must be one of {{\"uniform\": [low, high]}}, {{\"loguniform\": "
                             f"[low, high]}}, {{\"int\": [low, high]}} or {{\"choice\": [values]}}, got {spec!r}")
        (kind, arguments), = spec.items()
        if kind not in DISTRIBUTIONS:
            raise UsageError(f"the space's {name!r}: unknown distribution {kind!r} (known: {', '.join(DISTRIBUTIONS)})")
        if kind == "choice":
            if not isinstance(arguments, (list, tuple)) or not arguments:
                raise UsageError(f"the space's {name!r} (choice) needs a non-empty list of values, got {arguments!r}")
            values = [_plain(v, f"the space's {name!r}") for v in arguments]
            seen: Dict[Any, str] = {}
            for value in values:  # 1 and 1.0: one number drawn under two keys, with two seeds (a value
                text = value_text(value)  # listed twice as written is a weight: it is drawn more often)
                first = seen.setdefault(_same(value, text), text)
                if first != text:
                    raise UsageError(f"the space's {name!r} (choice) lists {first} and {text}: one number, which "
                                     f"would be drawn as two items with two seeds; keep one")
            checked[name] = (kind, values)
        else:
            checked[name] = (kind, _bounds(name, arguments, kind))
    return checked


def sample_points(space: Any, samples: int, seed: int) -> List[Dict[str, Any]]:
    """``samples`` points drawn from the space: sample i's value of each parameter comes from its own
    stream (``seed``, i, the parameter's name), so asking for more samples keeps the first ones,
    and adding a parameter leaves the others' values as they were."""
    checked = check_space(space)
    tags = {name: zlib.crc32(name.encode("utf-8")) for name in checked}  # each parameter's stream
    named: Dict[int, str] = {}
    for name, tag in tags.items():  # two names of one stream would draw the same numbers: rare, but never silent
        if tag in named:
            raise UsageError(f"the space's {named[tag]!r} and {name!r} would draw the same random numbers (their "
                             f"names have the same CRC-32, which picks each parameter's stream): rename one")
        named[tag] = name
    points = []
    for index in range(samples):
        point = {}
        for name, (kind, arguments) in checked.items():
            rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(_SAMPLE_TAG, index, tags[name])))
            if kind == "uniform":
                point[name] = float(rng.uniform(*arguments))
            elif kind == "loguniform":
                point[name] = float(math.exp(rng.uniform(math.log(arguments[0]), math.log(arguments[1]))))
            elif kind == "int":
                point[name] = int(rng.integers(arguments[0], arguments[1], endpoint=True))
            else:
                point[name] = arguments[int(rng.integers(len(arguments)))]
        points.append(point)
    return points


def value_text(value: Any) -> str:
    """A parameter value in a key or a table: as JSON writes it, but a plain word bare (``rbf``, not
    ``"rbf"``) where that cannot be read as another value (``"1"``, ``"true"`` keep their quotes)."""
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is float and math.isfinite(value):
        return repr(value)  # as json.dumps writes it
    if kind is str and value and value.strip() == value and not any(c in value for c in ',="[]{}\n'):
        try:
            json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def point_key(point: Mapping[str, Any], repeat: int = 0) -> str:
    """``C=10,gamma=0.001`` (names sorted, values as :func:`value_text` writes them), with
    ``,repeat=R`` from the second repeat on: the first repeat keeps the point's own key, so adding
    repeats later adds items."""
    key = ",".join([f"{name}={value_text(point[name])}" for name in sorted(point)])
    return key if repeat == 0 else f"{key},repeat={repeat}"


def check_unique(points: List[Dict[str, Any]]) -> List[str]:
    """Refuse a space where two points are the same (they would be one item); returns each point's key."""
    seen: Dict[Any, Tuple[int, str]] = {}
    for number, point in enumerate(points, 1):
        key = point_key(point)
        same = tuple((name, _same(point[name], value_text(point[name]))) for name in sorted(point))
        first = seen.setdefault(same, (number, key))
        if first[0] != number:
            numbers = "" if first[1] == key else f" in numbers ({first[1]})"
            raise UsageError(f"point {number} ({key}) is the same as point {first[0]}{numbers}: each point must be "
                             f"listed once")
    return [key for _, key in seen.values()]


def function_name(function: Callable[..., Any]) -> str:
    """``module:qualname``; a script's ``__main__`` is named by the script's file (``my_sweep:fit``),
    as ``python -m common.sweep my_sweep:fit`` names it, so either front door resumes the other's run."""
    module = function.__module__
    if module in ("__main__", "__mp_main__"):
        path = getattr(sys.modules.get(module), "__file__", None)
        module = Path(path).stem if path else module
    return f"{module}:{function.__qualname__}"
