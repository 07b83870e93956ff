"""A pipeline definition whose path holds a newline: refused in one line (exit 2), nothing written."""
from __future__ import annotations

import json

from helpers import run
from test_odd_results_files import assert_one_line_refusal


def test_a_definition_path_with_a_newline_is_one_line(tmp_path):
    odd = tmp_path / "two\nlines.json"
    for exists in (False, True):
        if exists:
            odd.write_text(json.dumps({"name": "p", "steps": [{"id": "s", "command": "true"}]}) + "x")
        proc = run(["-m", "common.pipeline", str(odd), "--gpu", "cpu", "--results", str(tmp_path / "res")])
        assert_one_line_refusal(proc, "lines.json")
    assert not (tmp_path / "res").exists()
