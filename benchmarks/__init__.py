"""Benchmarks run by ``make bench`` (``python -m benchmarks``); each compares against its baseline
in the same run and writes its figures to ``bench-results/``."""
from __future__ import annotations

import argparse
from typing import List, Optional


def command_line(module: str, doc: str, epilog: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser of ``python -m MODULE``: its --help says the first paragraph of ``doc`` (the
    module's docstring, without its RST backticks)."""
    return argparse.ArgumentParser(prog=f"python -m {module}", description=doc.split("\n\n")[0].replace("``", ""),
                                   epilog=epilog)


def no_options(module: str, doc: str, argv: Optional[List[str]]) -> None:
    """A benchmark that takes no options: --help describes it (and runs nothing), anything else is
    one line, exit 2."""
    name = module.rsplit(".", 1)[-1]
    command_line(module, doc, f"It takes no options: it writes bench-results/{name}.json and prints its "
                              f"table.").parse_args(argv)
