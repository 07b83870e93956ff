"""Runs a ``python: module:function`` step: ``python -m common.pipeline.call module:function``.

The function is called without arguments; it reads its settings from the environment
(``PIPELINE_SHARED``, ``PIPELINE_STEP_DIR``, the step's ``env``). A dict it returns is saved as
``result.json`` in the step's folder. An exception fails the step (traceback in stderr.log).
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from common.pipeline.variables import STEP_DIR
from common.results.layout import STEP_RESULT


def resolve(target: str) -> Callable[[], Any]:
    module_name, function_name = target.split(":", 1)
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    return getattr(module, function_name)


def main(argv: list = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or ":" not in argv[0]:
        print("usage: python -m common.pipeline.call module:function", file=sys.stderr)
        return 2
    result = resolve(argv[0])()
    step_dir = os.environ.get(STEP_DIR)
    if isinstance(result, dict) and step_dir:
        Path(step_dir, STEP_RESULT).write_text(json.dumps(result, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
