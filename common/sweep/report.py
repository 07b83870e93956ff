"""A sweep's outputs at rank 0: results.csv (one row per item), results.jsonl (whole returns), the
best points for ``--minimise``/``--maximise`` and one figure of that value against each parameter.

summary.md and report.html get these through the engine (``App.summary_markdown``); every file is
written atomically, as the engine's own.
"""
from __future__ import annotations

import contextlib
import csv
import difflib
import gc
import io
import itertools
import json
import math
import operator
import shlex
import statistics
import warnings
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from common.app import finite_number
from common.errors import counted, kind_of, markdown_cell, short
from common.results.layout import RESULTS_CSV, RESULTS_JSONL, SWEEP_FIGURE_STEM, ResultsLayout, figure_names, png_name
from common.results.outputs import atomic_write_text, new_figure, save_figure

from .space import function_name, point_key, value_text

if TYPE_CHECKING:  # only for the annotations: app imports this module
    from ..app import RunInfo
    from .app import Plan

FIGURE = SWEEP_FIGURE_STEM
#: what the sweep writes at the top of the results folder
OUTPUT_NAMES = (RESULTS_CSV, RESULTS_JSONL, *figure_names(FIGURE))
#: best points listed in summary.md and summary.json
BEST_ROWS = 5
#: a numeric parameter whose values span this factor or more is drawn on a log axis
LOG_SPAN = 100.0
#: past this many points a panel's marks are drawn as pixels in the SVG and PDF (the axes stay vectors)
RASTER_POINTS = 5000


#: a name no result has
_ABSENT = object()


def _number(value: Any) -> bool:
    """An int or a float (NaN too), not a bool: what --minimise may name."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool, int, float))


#: types whose values all pass :func:`_scalar`
_SCALARS = frozenset((str, bool, int, float, type(None)))


def _finished(run: "RunInfo") -> List[Any]:
    """(item, record) of every finished item, in item order."""
    records = run.records
    return [(item, records[item.key]) for item in run.items if item.key in records]


def _names(dicts: List[Mapping[str, Any]], keep: Any = None) -> List[str]:
    """The keys of ``dicts`` in order of first appearance (those whose value passes ``keep``)."""
    if keep is None or (keep is _scalar and _SCALARS.issuperset(map(type, _values(dicts)))):
        return list(dict.fromkeys(itertools.chain.from_iterable(dicts)))  # every one kept: at C speed
    names: Dict[str, None] = {}
    for entry in dicts:
        for name, value in entry.items():
            if keep(value):
                names.setdefault(name, None)
    return list(names)


def _values(dicts: List[Mapping[str, Any]]) -> Iterator[Any]:
    return itertools.chain.from_iterable(map(operator.methodcaller("values"), dicts))


#: the names of numbers a misnamed --minimise/--maximise lists (a return of 10,000 keys made an 89 KB line)
NAMES_SHOWN = 20

#: results.csv's own columns: a parameter of one of these names is written as ``param.NAME``, a
#: returned value as ``result.NAME``
RESERVED_COLUMNS = ("key", "repeat", "seed", "seconds", "host", "device")


def _columns(parameters: List[str], values: List[str]) -> List[str]:
    """results.csv's header, one name per column: a parameter named like one of its own columns is
    ``param.NAME``, a returned value named like those or a parameter ``result.NAME`` (as documented,
    whatever the order of the names); a name that is taken still (a parameter literally named
    "param.seed" beside "seed") gets its prefix again, so that every CSV reader keeps each column."""
    wanted = [(f"param.{name}", "param", True) if name in RESERVED_COLUMNS else (name, "param", False)
              for name in parameters]
    wanted += [(f"result.{name}", "result", True) if name in RESERVED_COLUMNS or name in parameters
               else (name, "result", False) for name in values]
    taken = {"key", *RESERVED_COLUMNS}
    names: List[str] = [""] * len(wanted)
    # the documented renames first, then the names as they are
    for index in sorted(range(len(wanted)), key=lambda i: not wanted[i][2]):
        name, prefix, _ = wanted[index]
        while name in taken:
            name = f"{prefix}.{name}"
        taken.add(name)
        names[index] = name
    return ["key", *names[:len(parameters)], "repeat", "seed", *names[len(parameters):], "seconds", "host", "device"]


#: the types whose values go into results.csv as they are (others through :func:`_cell`)
_PLAIN = frozenset((str, int, float))


def _json_chunks() -> Callable[[Any, int], Any]:
    """``json.dumps`` (its default separators) of one value as a sequence of strings to join,
    without the set-up ``json.dumps`` makes on every call: the C encoder made once, where this
    Python has it (called as ``chunks(value, 0)``)."""
    plain = json.JSONEncoder()
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return lambda value, _: (json.JSONEncoder(allow_nan=False).encode(value),)
    return make({}, plain.default, json.encoder.encode_basestring_ascii, None, plain.key_separator,
                plain.item_separator, False, False, False)


def _finite(value: Any) -> Any:
    """``value`` with every float that is not finite (inf, -inf, NaN) as None: results.jsonl is
    strict JSON (``Infinity`` is not JSON, and fails JSON.parse, jq and most readers)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _strict_json(chunks: Callable[[Any, int], Any], value: Any) -> str:
    """``json.dumps`` of ``value`` by ``chunks``, with a float that is not finite written as null."""
    try:
        return "".join(chunks(value, 0))
    except ValueError:  # an inf or a NaN (the encoder refuses them)
        return "".join(chunks(_finite(value), 0))


# what json.dumps writes for a row's own fields: a str (TypeError on another type), an int, a finite float
_string, _int, _float = json.encoder.encode_basestring_ascii, int.__repr__, float.__repr__  # type: ignore[attr-defined]
_INF = float("inf")


def _tables(finished: List[Any], parameters: List[str], values: List[str]) -> Tuple[str, str]:
    """results.csv and results.jsonl, both made in one pass over the finished items (each row's
    cells and its JSON object from the same record, nothing gathered in between). Each line of
    results.jsonl is ``json.dumps`` of {key, point, repeat, seed, result, seconds, host, device},
    written field by field (the row's own fields) where they have their usual types."""
    chunks, join = _json_chunks(), "".join
    lines = []
    cells = []
    single = parameters[0] if len(parameters) == 1 else None
    # a one-parameter point's JSON object, {"name": value}, for an int or str value: its key's text made once
    single_text = "" if single is None else _string(single)
    kind: Any = None
    value: Any = None
    for item, record in finished:
        params = item.params
        point, repeat = params["point"], params["repeat"]
        result, seconds = record.result, round(record.seconds, 6)
        returned, seed = result["return"], result["seed"]
        key, host, device = item.key, record.host, record.device
        if single is not None:
            value = point.get(single)
            kind = type(value)
        line = None
        if type(repeat) is int and type(seed) is int and type(seconds) is float and -_INF < seconds < _INF:
            # csv writes an int as str() and a float as repr(), as json does: one text for both files
            repeat_cell, seed_cell, seconds_cell = _int(repeat), _int(seed), _float(seconds)
            if kind is int and len(point) == 1:
                point_text = f"{{{single_text}: {_int(value)}}}"
            elif kind is str and len(point) == 1:
                point_text = f"{{{single_text}: {_string(value)}}}"
            else:
                point_text = join(chunks(point, 0))
            try:
                line = (f'{{"key": {_string(key)}, "point": {point_text}, "repeat": {repeat_cell}, '
                        f'"seed": {seed_cell}, "result": {_strict_json(chunks, returned)}, '
                        f'"seconds": {seconds_cell}, "host": {_string(host)}, "device": {_string(device)}}}')
            except TypeError:  # a key, host or device not a str: as json.dumps writes the whole row
                pass
        else:
            repeat_cell, seed_cell, seconds_cell = repeat, seed, seconds
        lines.append(line or _strict_json(chunks, {"key": key, "point": point, "repeat": repeat, "seed": seed,
                                                   "result": returned, "seconds": seconds, "host": host,
                                                   "device": device}))
        if kind in _PLAIN:  # the one parameter's value (kind stays None without one)
            row = [key, value, repeat_cell, seed_cell]
        else:
            row = [key]
            row += [v if type(v) in _PLAIN else _cell(v) for v in map(point.get, parameters, itertools.repeat(""))]
            row += (repeat_cell, seed_cell)
        if values:
            get = returned.get if isinstance(returned, dict) else {}.get
            # a value missing, None or not a scalar: an empty cell (bool kept, as csv writes it)
            row += [v if type(v) in _PLAIN else ("" if v is None or not _scalar(v) else _cell(v))
                    for v in map(get, values)]
        row += (seconds_cell, host, device)
        cells.append(row)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(_columns(parameters, values))
    writer.writerows(cells)
    lines.append("")  # each line ends with a newline
    return buffer.getvalue(), "\n".join(lines)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    return value if isinstance(value, (str, int, float)) else json.dumps(value)


def _best(finished: List[Any], metric: str, goal: str, repeats: int) -> List[Dict[str, Any]]:
    """Points ranked by their mean of ``metric`` over repeats, best first. ``n``: the repeats that
    returned a finite value, of the ``repeats`` every point has. A point where some did not (a
    training that diverged to NaN in 5 of 6 seeds, or raised) ranks after every point whose
    repeats all did, whatever the mean of the rest: its one lucky repeat is no evidence that it is best."""
    by_point: Dict[str, Dict[str, Any]] = {}
    for item, record in finished:
        returned = record.result["return"]
        value = returned.get(metric) if isinstance(returned, dict) else None
        point = item.params["point"]
        entry = by_point.setdefault(point_key(point), {"params": point, "values": []})
        if finite_number(value):
            entry["values"].append(float(value))
    ranked = []
    for key, entry in by_point.items():
        values = entry["values"]
        if values:
            ranked.append({"key": key, "params": entry["params"], "mean": _mean(values),
                           "sd": _sd(values) if len(values) > 1 else None, "n": len(values),
                           "repeats": repeats, "min": min(values), "max": max(values)})
    sign = -1.0 if goal == "max" else 1.0
    ranked.sort(key=lambda e: (e["n"] < e["repeats"], sign * e["mean"]))
    return ranked


def first_result_warning(plan: "Plan", returned: Any) -> Optional[str]:
    """Where the first result holds no number under the name --minimise/--maximise gives (a
    misspelt name): said as it comes, not only once every item has run. A null is no sign of one: a training that
    diverged returns NaN, which reaches rank 0 as null (JSON has no NaN)."""
    if not plan.metric or not isinstance(returned, dict) or not _misnamed(plan.metric, [returned]):
        return None
    hint = _ranked_by_resume(plan, [returned])
    return (f"the first result holds no number named {plan.metric!r} ({_returned(plan.metric, [returned])}), so "
            f"nothing may be ranked; the run goes on" + (f", and {hint}" if hint else ""))


def _misnamed(metric: str, dicts: List[Mapping[str, Any]]) -> bool:
    """No result gives ``metric`` a number or null (a NaN): the name is not one the function returns
    as a number, rather than a number no run of it reached."""
    return not any(metric in entry and (entry[metric] is None or _number(entry[metric])) for entry in dicts)


def _returned(metric: str, dicts: List[Mapping[str, Any]]) -> str:
    """What the function returned instead of a number named ``metric``: the names of its numbers
    (the first NAMES_SHOWN), and the kind of value it gave that name, if any."""
    numbers = _names(dicts, _number)
    shown = ", ".join(map(repr, numbers[:NAMES_SHOWN])) + (f" and {len(numbers) - NAMES_SHOWN} more"
                                                           if len(numbers) > NAMES_SHOWN else "")
    returned = f"the function returned numbers named {shown}" if numbers else "the function returned no named numbers"
    given = next((entry[metric] for entry in dicts if metric in entry), _ABSENT)
    if given is not _ABSENT and not _number(given):
        returned = f"it returned {metric!r} as {kind_of(given)}; {returned}"
    return returned


def _ranked_by_resume(plan: "Plan", dicts: List[Mapping[str, Any]]) -> Optional[str]:
    """How to rank what finished without running it again, where the name looks misspelt and the
    function returned other numbers: the metric is not in the run's fingerprint, so a --resume that
    names another takes every finished item's result from the journal. The name meant is the
    closest number returned, where one is close (quoted for the shell). None: no other name to give."""
    metric = plan.metric or ""
    numbers = [name for name in _names(dicts, _number) if name != metric]
    if not numbers or not _misnamed(metric, dicts):
        return None
    close = difflib.get_close_matches(metric, numbers, n=1, cutoff=0.6)
    name = shlex.quote(close[0]) if close and not close[0].startswith("-") else "NAME"  # "-x": read as a flag
    return f"a --resume with {_flag(plan.goal)} {name} ranks the finished items without running them again"


def _repeats_text(entry: Mapping[str, Any]) -> str:
    """"3", or "1 of 6" where some repeats returned no finite value."""
    return f"{entry['n']}" if entry["n"] == entry["repeats"] else f"{entry['n']} of {entry['repeats']}"


def _mean(values: List[float]) -> float:
    """The mean, also of values near the float limit (``fmean`` raises OverflowError where their
    sum would pass it)."""
    try:
        return statistics.fmean(values)
    except OverflowError:
        return sum(value / len(values) for value in values)


def _sd(values: List[float]) -> float:
    """The sample standard deviation; inf where it is past the float limit (``stdev`` raises)."""
    try:
        return statistics.stdev(values)
    except OverflowError:
        return math.inf


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while the rows are made: they make no cycles (reference
    counting frees them), yet each few hundred of them would start a collection that walks the
    run's every item and record again (a third of the time, for 20,000 rows)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def write(run: "RunInfo", plan: "Plan", left_out: int = 0) -> Dict[str, Any]:
    """Write the sweep's files into ``run.results_dir``; returns summary.json's ``sweep`` field.
    ``left_out``: results in the journal of items not in this run (a resume given a smaller grid,
    fewer --samples or --repeats), which are not in the files."""
    folder = Path(run.results_dir)
    with _collector_paused():
        finished = _finished(run)
        parameters = _names([item.params["point"] for item, _ in finished]) or _names(plan.points)
        returns = [record.result["return"] for _, record in finished]
        values = _names([returned for returned in returns if isinstance(returned, dict)], _scalar)
        table, lines = _tables(finished, parameters, values)
        ranked = _best(finished, plan.metric, plan.goal, plan.repeats) if plan.metric else []
        shared = _shared_seeds(finished)
    atomic_write_text(folder / RESULTS_CSV, table)
    atomic_write_text(folder / RESULTS_JSONL, lines)
    sweep: Dict[str, Any] = {"function": function_name(plan.function), "kind": plan.kind, "points": len(plan.points),
                             "repeats": plan.repeats, "parameters": parameters, "returned": values,
                             "metric": plan.metric, "goal": plan.goal if plan.metric else None,
                             "best": [], "figure": None, "files": [RESULTS_CSV, RESULTS_JSONL]}
    if shared:
        sweep["shared_seeds"] = shared
    if left_out:
        sweep["journal_left_out"] = left_out
    carried: Dict[str, Any] = {}  # the ranking a resume without either flag leaves out, kept for the next one
    if plan.metric and not ranked:
        dicts = [returned for returned in returns if isinstance(returned, dict)]
        hint = _ranked_by_resume(plan, dicts)
        sweep["note"] = f"no result holds a finite number named {plan.metric!r} ({_returned(plan.metric, dicts)})" \
                        + (f"; {hint}" if hint else "")
    elif plan.metric is None:  # a summary.json here is the run this one resumes (else the folder was refused)
        dropped = _earlier_ranking(folder)
        if dropped is not None:  # a resume given neither flag: say so, rather than drop the figure without a word
            flag, metric = dropped
            sweep["note"] = (f"this resume was given neither --minimise nor --maximise, and the run it resumes ranked "
                             f"by {metric!r}: give {flag} {metric} to rank and draw it")
            carried = {RANKING_KEPT: [flag, metric]}  # said again by a further resume without either
    elif plan.metric:  # points none of whose repeats returned a finite metric: in results.csv, not ranked
        unranked = {point_key(item.params["point"]) for item, _ in finished} - {entry["key"] for entry in ranked}
        if unranked:
            sweep["unranked"] = len(unranked)
            odd = next((value for item, record in finished if point_key(item.params["point"]) in unranked
                        for value in [record.result["return"].get(plan.metric)]
                        if value is not None and not finite_number(value) and not isinstance(value, float)), None)
            if odd is not None:  # a string, a bool, a list: not a number, which the note must not call missing
                sweep["unranked_example"] = short(odd, 40)
    sweep["best"] = ranked[:BEST_ROWS]
    if ranked:  # points at the best's mean (and as many repeats): the first in item order is named best
        sweep["best_ties"] = sum(1 for entry in ranked[1:] if (entry["n"], entry["mean"]) == (ranked[0]["n"], ranked[0]["mean"]))
    _remove_figure(folder)  # an earlier run's, of its metric
    if ranked:
        try:
            with warnings.catch_warnings():  # numpy's overflow warnings on axes spanning the float range
                warnings.simplefilter("ignore", RuntimeWarning)
                _figure(ranked, parameters, plan.metric, plan.goal, folder / FIGURE, plan.listed + plan.points)
            sweep["figure"] = png_name(FIGURE)
        except (ValueError, OverflowError) as error:  # values matplotlib cannot lay out (near the float limit)
            _remove_figure(folder)
            sweep["figure_note"] = f"the figure of {plan.metric!r} could not be drawn: {error}"
    return {"sweep": sweep, **carried}


def _shared_seeds(finished: List[Any]) -> Dict[str, Any]:
    """The items whose 32-bit ``seed`` another item of the run also got (two keys' hashes meet in
    32 bits: among n items, with odds of about n**2 / 2**33, some 120 pairs at 1,000,000), in groups
    of one seed: those items' ``seed`` gives the same draws; the function's ``rng`` never does. {}
    where every seed is its item's own."""
    counts = Counter(record.result["seed"] for _, record in finished)
    shared = {seed for seed, count in counts.items() if count > 1}
    if not shared:
        return {}
    keys: Dict[int, List[str]] = {}
    for item, record in finished:
        if record.result["seed"] in shared:
            keys.setdefault(record.result["seed"], []).append(item.key)
    return {"items": sum(map(len, keys.values())), "groups": [[seed, found] for seed, found in keys.items()]}


#: the field of summary.json that keeps a ranking (flag and value) its run did not use (a stopped run,
#: which writes no sweep section, or a resume given neither flag), for a later resume's note
RANKING_KEPT = "sweep_ranking"


def _flag(goal: str) -> str:
    return "--maximise" if goal == "max" else "--minimise"


def ranking_kept(run: "RunInfo", plan: "Plan") -> Dict[str, Any]:
    """summary.json's field of a stopped run: the ranking this run was given, else the one it
    resumed, so that a later resume given neither flag still names it."""
    ranking = (_flag(plan.goal), plan.metric) if plan.metric else _earlier_ranking(Path(run.results_dir))
    return {RANKING_KEPT: list(ranking)} if ranking is not None else {}


def _earlier_ranking(folder: Path) -> Optional[Tuple[str, str]]:
    """("--minimise" or "--maximise", metric) of the run whose summary.json is in ``folder``, where
    it ranked its points (or an earlier one did, which it carried on: RANKING_KEPT); None where none
    did, or the summary cannot be read."""
    try:
        summary = json.loads(ResultsLayout(folder).summary_json.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict):
        return None
    earlier = summary.get("sweep") if isinstance(summary.get("sweep"), dict) else {}
    metric, carried = earlier.get("metric"), summary.get(RANKING_KEPT)
    if isinstance(metric, str) and metric:
        return _flag(earlier.get("goal")), metric
    if isinstance(carried, list) and len(carried) == 2 and carried[0] in ("--minimise", "--maximise") \
            and isinstance(carried[1], str) and carried[1]:
        return carried[0], carried[1]
    return None


def _remove_figure(folder: Path) -> None:
    """The sweep figure's files (PNG, SVG, PDF), where there are any."""
    for name in OUTPUT_NAMES[2:]:
        (folder / name).unlink(missing_ok=True)


def _figure(ranked: List[Dict[str, Any]], parameters: List[str], metric: str, goal: str, path: Path,
            points: Sequence[Mapping[str, Any]] = ()) -> Any:
    """One panel per parameter: each point's mean (repeats as a bar from their lowest to highest
    value), and the best value at each of the parameter's values as a line (where points share its
    values: a grid's, a random choice's, not random samples'; or where it is the only parameter that
    varies). Values that are not numbers stand in the order ``points`` (the space's) gives them,
    not in the ranking's. The legend is on the first panel with a line. Returns the figure."""
    columns = min(3, len(parameters))
    rows = math.ceil(len(parameters) / columns)
    fig, axes = new_figure(4.2 * columns, 3.3 * rows, rows, columns, squeeze=False)
    pick = min if goal == "min" else max
    lined = []  # the panels with a best line
    # each parameter's values over the space (its points, else those ranked): whether a point that gave
    # no finite value (a diverged lr) is left out of the ranking does not change what the space shares
    space = {name: [value_text(p[name]) for p in (points or [e["params"] for e in ranked]) if name in p]
             for name in parameters}
    varying = [name for name in parameters if len(set(space[name])) > 1]  # one value (a fixed batch) is no axis
    for index, ax in enumerate(axes.flat):
        if index >= len(parameters):
            ax.set_visible(False)
            continue
        name = parameters[index]
        entries = [e for e in ranked if name in e["params"]]
        xs = [e["params"][name] for e in entries]
        numeric = all(finite_number(x) for x in xs)
        if numeric:
            positions = [float(x) for x in xs]
        else:
            present = {value_text(x) for x in xs}
            given = [value_text(point[name]) for point in points if name in point]  # the grid's order, say
            labels = [label for label in dict.fromkeys(given + [value_text(x) for x in xs]) if label in present]
            positions = [labels.index(value_text(x)) for x in xs]
            ax.set_xticks(range(len(labels)), labels, rotation=30 if max(map(len, labels)) > 6 else 0)
            ax.set_xlim(-0.5, len(labels) - 0.5)
        means = [e["mean"] for e in entries]
        spread = np.array([[e["mean"] - e["min"] for e in entries], [e["max"] - e["mean"] for e in entries]])
        many = len(entries) > RASTER_POINTS  # a vector mark each: a 30 MB SVG at 100,000 points
        if any(e["n"] > 1 for e in entries):
            ax.errorbar(positions, means, yerr=spread, fmt="o", ms=3, alpha=0.45, color="tab:blue", elinewidth=1,
                        label="point (repeats: lowest to highest)", rasterized=many)
        else:
            ax.plot(positions, means, "o", ms=3, alpha=0.45, color="tab:blue", label="point", rasterized=many)
        best: Dict[float, float] = {}
        for x, mean in zip(positions, means):
            best[x] = pick(best.get(x, mean), mean)
        order = sorted(best)
        # a value shared by two points on average (a grid's, a random choice's): a line through the best
        # of each says something; a value each (random samples, even integers that repeat once or twice)
        # would join every point, a zigzag. The only parameter that varies: the line is its curve.
        shared = len(space[name]) >= 2 * len(set(space[name])) or varying == [name]
        if shared and len(order) >= 2:
            ax.plot(order, [best[x] for x in order], "-", color="tab:red", lw=1.5,
                    label=f"best ({'lowest' if goal == 'min' else 'highest'})")
            lined.append(ax)
        positive = [x for x in positions if x > 0] if numeric else []
        if positive and min(positions) >= 0 and max(positive) / min(positive) >= LOG_SPAN:
            if min(positions) > 0:
                ax.set_xscale("log")
            else:  # a grid with 0 (weight decay 0, 1e-5, ..., 1e-2): log beyond the smallest step, 0 kept
                ax.set_xscale("symlog", linthresh=min(positive))
        ax.set_xlabel(name)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    (lined or [axes.flat[0]])[0].legend(fontsize=7)
    save_figure(fig, path)
    return fig


def _params_text(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{name}={value_text(value)}" for name, value in params.items())


def _number_text(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.6g}"


def markdown(sweep: Mapping[str, Any]) -> str:
    """The sweep's part of summary.md (and so of report.html)."""
    if not sweep:
        return ""
    lines = [f"## Sweep of `{sweep['function']}`", "",
             f"- {sweep['points']} points ({sweep['kind']}) x {counted(sweep['repeats'], 'repeat')}; parameters: "
             + ", ".join(f"`{p}`" for p in sweep["parameters"]),
             "- `results.csv`: one row per item (parameters, repeat, seed, every scalar returned, seconds, host, "
             "device); `results.jsonl`: each item's whole return", ""]
    if sweep.get("note"):
        lines += [f"Nothing to rank: {sweep['note']}.", ""]
    if sweep.get("shared_seeds"):
        lines += [shared_seeds_line(sweep["shared_seeds"], markdown_cell) + ".", ""]
    if sweep.get("journal_left_out"):
        lines += [left_out_line(sweep["journal_left_out"], bool(sweep.get("metric"))) + ".", ""]
    if sweep.get("figure_note"):
        lines += [f"No figure: {sweep['figure_note']}.", ""]
    best = sweep.get("best") or []
    if best:
        metric = sweep["metric"]
        parameters = sweep["parameters"]
        lines += [f"### Best points by `{metric}` ({'lowest' if sweep['goal'] == 'min' else 'highest'} mean over "
                  f"repeats)", "",
                  "| | " + " | ".join(map(markdown_cell, parameters)) + f" | {markdown_cell(metric)} | sd | repeats |",
                  "|---" * (len(parameters) + 4) + "|"]
        for place, entry in enumerate(best, 1):
            lines.append(f"| {place} | " + " | ".join(markdown_cell(value_text(entry["params"][p])) if p in entry["params"] else ""
                                                     for p in parameters)
                         + f" | {_number_text(entry['mean'])} | {_number_text(entry['sd'])} | {_repeats_text(entry)} |")
        lines.append("")
    if sweep.get("unranked"):
        count = sweep["unranked"]
        example = sweep.get("unranked_example")
        kinds = (f"NaN, infinite, missing, or not a number, such as {markdown_cell(example)}" if example
                 else "NaN, infinite or missing")
        lines += [f"{counted(count, 'point')} returned no finite `{sweep['metric']}` ({kinds}) and "
                  f"{'are' if count != 1 else 'is'} not ranked; {RESULTS_CSV} has {'them' if count != 1 else 'it'}.", ""]
    if sweep.get("figure"):
        lines += [f"![{sweep['metric']} against each parameter]({sweep['figure']})", ""]
    return "\n".join(lines)


def shared_seeds_line(shared: Mapping[str, Any], shown: Callable[[str], str] = str) -> str:
    """Which items got one 32-bit seed, and what to take instead (keys through ``shown``)."""
    seed, keys = shared["groups"][0]
    more = shared["items"] - len(keys)
    return (f"{shared['items']} items share a 32-bit seed with another ({' and '.join(map(shown, keys))}: "
            f"{seed}{f'; {more} more in summary.json, sweep.shared_seeds' if more else ''}), so their `seed` gives the "
            f"same draws; a "
            f"function that takes `rng` gets each item's own stream")


def left_out_line(count: int, ranked: bool) -> str:
    """Results the journal holds of items this run has not (a resume given a smaller grid or list,
    fewer --samples or --repeats): said, since a best of the rest reads as the best of all that ran."""
    it = "it" if count == 1 else "them"
    return (f"{counted(count, 'result')} in the journal {'is' if count == 1 else 'are'} of items not in this run "
            f"(points not in this space, or repeats or samples past its --repeats or --samples), left out of "
            f"results.csv{' and the ranking' if ranked else ''} (the journal keeps {it}: a --resume with the arguments "
            f"that ran {it} takes {it} again)")


def headline(sweep: Mapping[str, Any]) -> List[str]:
    """The line printed on stdout after a complete run: the best point, where a metric was named
    (or why nothing was ranked: a misspelt name should not pass for a run without one)."""
    notes = [f"note: {shared_seeds_line(sweep['shared_seeds'])}"] if sweep.get("shared_seeds") else []
    if sweep.get("journal_left_out"):
        notes.append(f"note: {left_out_line(sweep['journal_left_out'], bool(sweep.get('metric')))}")
    best = best_line(sweep)
    if best is None:
        return ([f"nothing to rank: {sweep['note']}"] if sweep.get("note") else []) + notes
    return [best, *notes]


def best_line(sweep: Mapping[str, Any]) -> Optional[str]:
    """"best METRIC: VALUE at PARAMS" (the run's answer), or None where nothing was ranked."""
    best = sweep.get("best") or []
    if not best:
        return None
    top = best[0]
    if top["n"] < top["repeats"]:  # every point had a repeat with no finite value
        repeats = (f" (mean of the {top['n']} of {top['repeats']} repeats that returned a finite value)" if top["n"] > 1
                   else f" (the one of {top['repeats']} repeats that returned a finite value)")
    else:
        repeats = f" (mean of {top['n']} repeats)" if top["n"] > 1 else ""
    ties = sweep.get("best_ties") or 0
    tied = (f" ({counted(ties, 'other point')} {'ties' if ties == 1 else 'tie'} with it: the first in the space's "
            f"order is named)" if ties else "")
    return f"best {sweep['metric']}: {top['mean']!r}{repeats} at {_params_text(top['params'])}{tied}"
