"""common/results/layout.py owns every name in a results folder: no other module of the engine or the
apps spells one as a literal, so a writer and its readers cannot drift apart."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import List, Set

from common.results import layout
from common.results.layout import ResultsLayout

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("common", "mnist_svm", "mnist_nn", "benchmarks")
#: methods whose first argument is a JSON field, not a file name ("models": a count in summary.json)
FIELD_METHODS = {"get", "pop", "setdefault"}


def _fields(tree: ast.AST) -> Set[int]:
    """ids of the constants that name a JSON field: dict keys, subscripts, .get("x") and docstrings."""
    fields: Set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            fields.update(id(key) for key in node.keys if key is not None)
        elif isinstance(node, ast.Subscript):
            fields.add(id(node.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in FIELD_METHODS and node.args:
            fields.add(id(node.args[0]))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            fields.add(id(node.value))  # a docstring
    return fields


def literal_names(path: Path, names: Set[str], root: Path = ROOT) -> List[str]:
    """'file:line: "name"' for each string constant in ``path`` that spells one of ``names``."""
    tree = ast.parse(path.read_text(), str(path))
    fields = _fields(tree)
    return [f"{path.relative_to(root)}:{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
            and id(node) not in fields]


def test_no_module_spells_a_results_folder_name():
    names = set(layout.NAMES)
    sources = [path for folder in CHECKED for path in sorted((ROOT / folder).rglob("*.py"))
               if path != Path(layout.__file__).resolve()]
    assert len(sources) > 50
    found = [hit for path in sources for hit in literal_names(path, names)]
    assert not found, "name these through common/results/layout.py:\n" + "\n".join(found)


def test_the_check_finds_a_literal_and_spares_a_field(tmp_path):
    source = tmp_path / "module.py"
    source.write_text('"""A docstring naming summary.json."""\n'
                      'summary = {"models": 3}\n'
                      'count = summary["models"] + summary.get("models")\n'
                      'path = folder / "summary.json"\n')
    assert literal_names(source, set(layout.NAMES), tmp_path) == ["module.py:4: 'summary.json'"]


def test_names_are_unique_and_the_layout_places_them():
    assert len(set(layout.ENGINE_OUTPUTS)) == len(layout.ENGINE_OUTPUTS)
    files = ResultsLayout(Path("/r"))
    assert files.journal == Path("/r/journal.jsonl")
    assert files.rank_log(2) == Path("/r/logs/rank2.log")
    assert files.hold_temporary("t").name == ".hold.json.t" and ResultsLayout.is_hold_file(".hold.json.t.stale")
    assert not ResultsLayout.is_hold_file("hold.json.bak")
    assert {files.summary_json.name, files.summary_md.name, files.report.name, files.status.name,
            files.gpu_usage_csv.name} <= set(layout.ENGINE_OUTPUTS)
    assert layout.figure_names(layout.TIMELINE_STEM) == ("timeline.png", "timeline.svg", "timeline.pdf")
