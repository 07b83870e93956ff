"""common/'s layers, read from the code: every import points down, so each layer can be changed and
tested without the ones above it (the rule each subpackage's docstring states)."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterable, Iterator, Set, Tuple

import common

COMMON = Path(common.__file__).parent

#: lowest first: a module may import its own layer and those before it, never one after it
LAYERS = ("root", "results", "observe", "workers", "ranks", "run", "top")
#: at the top: the commands and what is built on the engine (they may import any layer)
TOP = {"status", "pipeline", "sweep", "slurm", "testing", "__init__"}


def layer_of(module: str) -> str:
    """``common.results.journal`` -> "results"; a root module (``common.items``) -> "root"."""
    parts = module.split(".")[1:]
    if not parts:
        return "top"
    head = parts[0]
    if head in TOP:
        return "top"
    if (COMMON / head).is_dir():
        return head
    return "root"


def modules() -> Iterator[Tuple[str, Path]]:
    for path in sorted(COMMON.rglob("*.py")):
        parts = path.relative_to(COMMON.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def imports(module: str, path: Path) -> Set[str]:
    """The common.* modules ``path`` imports (relative imports resolved)."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("common."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            if target == "common":  # from common import settings: the modules named
                found.update(f"common.{alias.name}" for alias in node.names)
            elif target.startswith("common."):
                found.add(target)
    return found


def test_every_subpackage_is_a_known_layer_with_a_docstring() -> None:
    packages = {path.name for path in COMMON.iterdir() if (path / "__init__.py").exists()}
    assert packages - TOP == set(LAYERS) - {"root", "top"}
    for name in packages:
        docstring = ast.get_docstring(ast.parse((COMMON / name / "__init__.py").read_text()))
        assert docstring, f"common/{name}/__init__.py says nothing about what it owns"


def test_imports_point_down() -> None:
    upward: Dict[str, Set[str]] = {}
    for module, path in modules():
        rank = LAYERS.index(layer_of(module))
        for target in imports(module, path):
            if LAYERS.index(layer_of(target)) > rank:
                upward.setdefault(module, set()).add(target)
    assert not upward, "imports that point up a layer: " + "; ".join(
        f"{module} -> {', '.join(sorted(targets))}" for module, targets in sorted(upward.items()))


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    """The rule is not vacuous: a results module importing the runner is caught."""
    path = tmp_path / "journal.py"
    path.write_text("from ..run.runner import main\nfrom common.observe import progress\n")
    found = imports("common.results.journal", path)
    assert found == {"common.run.runner", "common.observe"}
    assert all(LAYERS.index(layer_of(target)) > LAYERS.index("results") for target in found)


#: what each package on top may import of the others on top (their docstrings' rule): slurm/ checks a
#: pipeline definition as the runner would; nothing else on top builds on another
TOP_MAY_IMPORT = {"slurm": {"pipeline"}, "pipeline": set(), "sweep": set(), "testing": set(), "status": set()}


def top_package(module: str) -> str:
    """``common.pipeline.flow`` -> "pipeline"; "" for a module below the top (or common itself)."""
    parts = module.split(".")[1:]
    return parts[0] if parts and parts[0] in TOP and parts[0] != "__init__" else ""


def crossings_between_top_packages(sources: Iterable[Tuple[str, Path]]) -> Dict[str, Set[str]]:
    """module -> what it imports of the other top packages that its package may not."""
    crossing: Dict[str, Set[str]] = {}
    for module, path in sources:
        own = top_package(module)
        if not own:
            continue
        for target in imports(module, path):
            other = top_package(target)
            if other and other != own and other not in TOP_MAY_IMPORT[own]:
                crossing.setdefault(module, set()).add(target)
    return crossing


def test_the_packages_on_top_import_only_what_their_docstrings_allow() -> None:
    assert set(TOP_MAY_IMPORT) == TOP - {"__init__"}
    crossing = crossings_between_top_packages(modules())
    assert not crossing, "imports between packages on top that their docstrings do not allow: " + "; ".join(
        f"{module} -> {', '.join(sorted(targets))}" for module, targets in sorted(crossing.items()))


def test_the_top_check_sees_a_sweep_importing_the_pipeline_runner(tmp_path: Path) -> None:
    """Not vacuous: sweep/ importing pipeline/ is caught, slurm/ importing it is allowed."""
    path = tmp_path / "planted.py"
    path.write_text("from common.pipeline.flow import PipelineRunner\nfrom ..results import journal\n")
    found = crossings_between_top_packages([("common.sweep.planted", path), ("common.slurm.planted", path)])
    assert found == {"common.sweep.planted": {"common.pipeline.flow"}}


#: what the case studies may import of the engine: ``common``'s own names, and the results folder's
#: file names (their own files' too: one owner for every name in that folder)
CASE_STUDY_MAY_IMPORT = {"common", "common.results.layout"}


def engine_imports_of_case_studies() -> Dict[str, Set[str]]:
    """{module of mnist_nn/ or mnist_svm/: the common modules it imports from}, names of ``common``
    itself left as ``common``."""
    found: Dict[str, Set[str]] = {}
    for package in ("mnist_nn", "mnist_svm"):
        for path in sorted((COMMON.parent / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("common"):
                    found.setdefault(str(path.relative_to(COMMON.parent)), set()).add(node.module)
                elif isinstance(node, ast.Import):
                    found.setdefault(str(path.relative_to(COMMON.parent)), set()).update(
                        alias.name for alias in node.names if alias.name.startswith("common"))
    return found


def test_the_case_studies_use_the_engine_through_its_public_api() -> None:
    """mnist_nn and mnist_svm are what researchers copy: they import the engine's names from
    ``common`` (its public API, ``common.__all__``), so the internals below may move; every name
    they take from it is one it has."""
    found = engine_imports_of_case_studies()
    assert found, "no case study imports the engine: the check reads nothing"
    beyond = {module: sorted(targets - CASE_STUDY_MAY_IMPORT) for module, targets in found.items()
              if targets - CASE_STUDY_MAY_IMPORT}
    assert not beyond, beyond
    names = {alias.name for package in ("mnist_nn", "mnist_svm")
             for path in (COMMON.parent / package).rglob("*.py")
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) and node.module == "common" and not node.level
             for alias in node.names}
    assert names and not names - set(common.__all__), sorted(names - set(common.__all__))
