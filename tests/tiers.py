"""Test tiers, read from each test's code so that a new test file needs no marker to land in the right one.

A test's tier is the costliest thing its code starts (its function, the fixtures it uses and the
functions they call, in tests/ and in the project, followed a few calls deep):

- ``inprocess``: nothing but this Python process;
- ``processes``: programs or worker processes (``subprocess``, ``multiprocessing``, ``os.fork``, ...);
- ``mpi``: a real mpiexec job: ``MPIEXEC``/"mpiexec" in a test's code, or ``ranks=`` other than 1
  given to a function that starts processes (tests/helpers.py's ``run``/``start`` and whatever
  wraps them; a helper that takes ``ranks`` itself leaves the choice to its callers);
- ``slurm``: the throw-away Slurm of tests/slurm_cluster.py (``SlurmCluster``, the ``slurm`` fixture);
- ``vcluster``: the virtual multi-node cluster of tests/vcluster.py (``VirtualCluster``, ``vcluster``).

A tier marker the test or its module sets (``pytestmark = pytest.mark.mpi``) wins. Where a value
cannot be read from the code (``ranks=n`` with ``n`` computed), the costlier tier is assumed.
"""
from __future__ import annotations

import ast
import asyncio
import builtins
import concurrent.futures
import importlib
import inspect
import multiprocessing
import os
import pty
import subprocess
import sys
import sysconfig
import textwrap
from collections import ChainMap
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Set

#: cheapest first; ``make check`` runs the first two
TIERS = ("inprocess", "processes", "mpi", "slurm", "vcluster")
INPROCESS, PROCESSES, MPI, SLURM, VCLUSTER = range(len(TIERS))

REPO = Path(__file__).resolve().parents[1]
#: where Python's and the installed libraries' code lives: not followed
LIBRARIES = {Path(sysconfig.get_path(name)).resolve() for name in ("stdlib", "platstdlib", "purelib", "platlib")}
#: calls followed from a test into helpers and project code
DEPTH = 4
#: classes whose use means a Slurm or a virtual cluster (by name: tests/slurm_cluster.py, tests/vcluster.py)
CLUSTERS = {"SlurmCluster": SLURM, "VirtualCluster": VCLUSTER}
#: words in a test's own code that start an MPI job
MPI_WORDS = {"MPIEXEC", "mpiexec", "mpirun"}


def _spawners() -> Set[int]:
    """ids of the standard library's callables that start a process."""
    found = [subprocess.Popen, subprocess.run, subprocess.call, subprocess.check_call, subprocess.check_output,
             subprocess.getoutput, subprocess.getstatusoutput, os.system, os.popen, multiprocessing.Process,
             multiprocessing.Pool, multiprocessing.get_context, concurrent.futures.ProcessPoolExecutor, pty.spawn,
             pty.fork, asyncio.create_subprocess_exec, asyncio.create_subprocess_shell]
    found += [getattr(os, name) for name in dir(os) if name.startswith(("fork", "spawn", "posix_spawn", "exec"))]
    return {id(function) for function in found}


class Classifier:
    """Tier of a test item; what it learns about helper functions is kept for the next item."""

    def __init__(self) -> None:
        self.spawners = _spawners()
        self.known: Dict[Any, int] = {}  # function -> tier of a call to it (its ``ranks`` left to the caller)
        # a test or fixture read once for all the tests that share it (the autouse fixtures: every test;
        # a parametrized test: each parameter set); reading is most of collection's time otherwise
        self.own: Dict[Any, int] = {}  # (function, its parameters) -> tier
        self.trees: Dict[Any, Optional[ast.AST]] = {}  # function -> its parsed code

    def tier(self, function: Callable, fixtures: Iterator[Callable], params: Dict[str, Any]) -> str:
        """The test ``function``'s tier, with the fixture functions it uses and its parameters."""
        level = self.level_of(function, DEPTH, params, own=True)
        for fixture in fixtures:
            level = max(level, self.level_of(fixture, DEPTH, {}, own=True))
        return TIERS[level]

    # ----- one function -----
    def level_of(self, function: Any, depth: int, params: Optional[Dict[str, Any]], own: bool) -> int:
        """``own``: the test or a fixture itself (its parameters are known, or not: never "the caller's")."""
        function = inspect.unwrap(function)
        cluster = CLUSTERS.get(getattr(function, "__name__", ""))
        if cluster is not None and own_code(function):
            return cluster
        if not own and function in self.known:
            return self.known[function]
        key = (function, depth, _hashable(params)) if own else None
        if key is not None and key in self.own:
            return self.own[key]
        if function not in self.trees:
            self.trees[function] = _tree(function)
        tree = self.trees[function]
        if tree is None or depth <= 0:
            return INPROCESS
        if not own:
            self.known[function] = INPROCESS  # a recursive call adds nothing
        level = _Visitor(self, function, depth, params if own else None).level(tree)
        if own:
            self.own[key] = level
        else:
            self.known[function] = level
        return level

    def resolve(self, node: ast.AST, scope: Dict[str, Any]) -> Any:
        """The object a name or dotted name stands for in ``scope`` (a function's globals), or None."""
        if isinstance(node, ast.Name):
            if node.id in scope:
                return scope[node.id]
            return getattr(builtins, node.id, None)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value, scope)
            if base is not None:
                try:
                    return inspect.getattr_static(base, node.attr)
                except AttributeError:
                    return None
        return None


class _Visitor(ast.NodeVisitor):
    def __init__(self, classifier: Classifier, function: Any, depth: int, params: Optional[Dict[str, Any]]):
        self.classifier = classifier
        names = getattr(function, "__globals__", None)
        if names is None:
            module = inspect.getmodule(function)
            names = vars(module) if module else {}
        self.scope = ChainMap({}, names)  # the function's own imports in front of its module's names
        self.depth = depth
        self.params = params  # the test's parameters; None: a helper (its ``ranks`` is the caller's)
        self.arguments = set(_parameters(function))
        self.test_code = _test_code(function)
        self.found = INPROCESS

    def level(self, tree: ast.AST) -> int:
        self.visit(tree)
        return self.found

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            module = _loaded(alias.name)
            if module is not None:
                if alias.asname:
                    self.scope[alias.asname] = module
                else:
                    self.scope.setdefault(alias.name.split(".")[0], _loaded(alias.name.split(".")[0]))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        """An import inside a function: its names are the function's (``from helpers import run``)."""
        module = _loaded(node.module or "") if node.level == 0 else None
        for alias in node.names:
            if module is not None and hasattr(module, alias.name):
                self.scope[alias.asname or alias.name] = getattr(module, alias.name)

    def visit_Name(self, node: ast.Name) -> None:
        if self.test_code and node.id in MPI_WORDS and "ranks" not in self.arguments:
            self.found = max(self.found, MPI)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        """A program's name or path (``"mpiexec"``, ``".../bin/mpiexec"``), not a sentence that names it."""
        if (self.test_code and isinstance(node.value, str) and "ranks" not in self.arguments
                and not any(c.isspace() for c in node.value) and Path(node.value).name in MPI_WORDS):
            self.found = max(self.found, MPI)

    def visit_Expr(self, node: ast.Expr) -> None:
        if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):  # docstrings say, not do
            self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        callee = self.classifier.resolve(node.func, self.scope)
        if callee is None:
            return
        if id(callee) in self.classifier.spawners or (getattr(callee, "__module__", None) or "").startswith("multiprocessing"):
            self.found = max(self.found, PROCESSES)
            return
        if not own_code(callee):
            return
        level = self.classifier.level_of(callee, self.depth - 1, None, own=False)
        self.found = max(self.found, level)
        if level >= PROCESSES and "ranks" in _parameters(callee) and self._ranks(node, callee) != 1:
            self.found = max(self.found, MPI)

    def _ranks(self, call: ast.Call, callee: Any) -> Any:
        """The ``ranks`` this call passes (1 when it passes none), or None where the code does not say."""
        parameters = list(inspect.signature(callee).parameters.values())
        value = next((keyword.value for keyword in call.keywords if keyword.arg == "ranks"), None)
        position = [p.name for p in parameters].index("ranks")
        positional = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters[:position + 1])
        if (value is None and positional and len(call.args) > position
                and not any(isinstance(a, ast.Starred) for a in call.args[:position + 1])):
            value = call.args[position]
        if value is None:
            starred = positional and any(isinstance(a, ast.Starred) for a in call.args)  # a keyword-only ranks it cannot fill
            if any(keyword.arg is None for keyword in call.keywords) or starred:
                return None  # **kwargs, or *args where ranks may be positional: could be anything
            default = inspect.signature(callee).parameters["ranks"].default
            return default if isinstance(default, int) else None
        if isinstance(value, ast.Constant):
            return value.value
        if isinstance(value, ast.Name):
            if value.id in self.arguments:
                if self.params is None:
                    return 1  # the caller decides (its own call is looked at)
                return self.params.get(value.id)
            constant = self.scope.get(value.id)
            return constant if isinstance(constant, int) else None
        return None


def _hashable(params: Optional[Dict[str, Any]]) -> Any:
    """``params`` as a dictionary key (each value by its repr: a parameter may be a list)."""
    return tuple(sorted((name, repr(value)) for name, value in (params or {}).items()))


def _loaded(name: str) -> Any:
    """The module ``name`` where it is imported already, or is this checkout's own (importing it is cheap)."""
    if name in sys.modules:
        return sys.modules[name]
    top = name.split(".")[0]
    if (Path(__file__).parent / f"{top}.py").exists() or (REPO / top / "__init__.py").exists():
        try:
            return importlib.import_module(name)
        except Exception:  # whatever it raises at import: not followed then
            return None
    return None


def _source_path(code: Any) -> Optional[Path]:
    try:
        return Path(inspect.getsourcefile(code) or "").resolve()
    except TypeError:
        return None


def own_code(code: Any) -> bool:
    """A function or class of the tests or the project (followed), not of Python or a library."""
    if not (inspect.isfunction(code) or inspect.isclass(code) or inspect.ismethod(code)):
        return False
    path = _source_path(code)
    return path is not None and path.exists() and not any(path.is_relative_to(root) for root in LIBRARIES)


def _test_code(code: Any) -> bool:
    """Own code outside the project's packages (tests/ or a test file elsewhere): where a word such
    as "mpiexec" means a program started, not a message about one."""
    path = _source_path(code)
    if path is None or not own_code(code):
        return False
    if path.is_relative_to(REPO) and len(path.relative_to(REPO).parts) > 1:
        return not (REPO / path.relative_to(REPO).parts[0] / "__init__.py").exists()
    return True


def _parameters(function: Any) -> list:
    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return []


def _tree(function: Any) -> Optional[ast.AST]:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None
