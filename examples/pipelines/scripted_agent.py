#!/usr/bin/env python3
"""A scripted stand-in for an AI agent, to try prompt pipelines (agent.json) without one.

Run as the pipeline's agent command::

    python -m common.pipeline examples/pipelines/agent.json \
        --agent 'python3 "$PIPELINE_LAUNCH_DIR/examples/pipelines/scripted_agent.py"'

Like a real agent, it reads the prompt on standard input, sees ``PIPELINE_MODEL`` and
``PIPELINE_TOOLS``, works in the step's folder (its current folder) and the run's shared folder
(``$PIPELINE_SHARED``), answers in Markdown on standard output (the step's ``output.md``) and
reports what it cost in one JSON line, ``{"pipeline_cost": 0.01}``. Instead of thinking, it
follows the prompt's lines that start with ``>>``:

    >> write FILE TEXT          write TEXT to $PIPELINE_SHARED/FILE
    >> need FILE                fail unless $PIPELINE_SHARED/FILE exists
    >> fail-above VALUE LIMIT MESSAGE   fail with MESSAGE when the number VALUE is above LIMIT
    >> fail MESSAGE             fail with MESSAGE
    >> show FILE                put $PIPELINE_SHARED/FILE into the answer
    >> cost AMOUNT              report AMOUNT as this answer's cost

A failure is a message on standard error and exit code 1, as an agent that gave up would do.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> int:
    prompt = sys.stdin.read()
    shared = Path(os.environ.get("PIPELINE_SHARED", "."))
    step = os.environ.get("PIPELINE_STEP_ID", "?")
    answer = [f"# {step}", "", f"Model: {os.environ.get('PIPELINE_MODEL') or 'default'}; "
              f"tools: {os.environ.get('PIPELINE_TOOLS') or 'none'}.", "", "## Task", ""]
    answer += [line for line in prompt.splitlines() if not line.startswith(">>")] + ["", "## Done", ""]
    cost = 0.0
    for line in prompt.splitlines():
        if not line.startswith(">>"):
            continue
        verb, _, rest = line[2:].strip().partition(" ")
        if verb == "write":
            name, _, text = rest.partition(" ")
            (shared / name).parent.mkdir(parents=True, exist_ok=True)
            (shared / name).write_text(text + "\n")
            answer.append(f"- wrote `{name}`")
        elif verb == "need" and not (shared / rest).exists():
            print(f"{step}: cannot go on: {rest} is missing from the shared folder", file=sys.stderr)
            return 1
        elif verb == "fail-above":
            value, limit, message = (rest.split(" ", 2) + ["", ""])[:3]
            if float(value) > float(limit):
                print(f"{step}: {message}", file=sys.stderr)
                return 1
        elif verb == "fail":
            print(f"{step}: {rest}", file=sys.stderr)
            return 1
        elif verb == "show":
            path = shared / rest
            text = path.read_text().strip() if path.exists() else "(missing)"
            answer += [f"- `{rest}`:", "", "```", text, "```", ""]
        elif verb == "cost":
            cost += float(rest)
    print("\n".join(answer))
    print(json.dumps({"pipeline_cost": cost}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
