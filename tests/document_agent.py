#!/usr/bin/env python3
"""A scripted agent for the pipeline format document's own prompts, which it runs unchanged.

Like an agent, it reads the prompt on standard input, does what the prompt's paths say, answers in
Markdown on standard output and reports a cost line. Its reading of a prompt is literal: every
absolute path after the word "to" ("Save the final checkpoint to /shared/checkpoints/model_final.pt")
is a file to write; every other absolute path is a file to read, which must exist unless "if it
exists" or "(if available)" follows it. A written file is JSON saying which step wrote it (with
a fresh token) and the SHA-256 of each file read; the answer lists both, and for each top folder
of those paths (/shared, /data, /output) whether it can be written.

    python document_agent.py [--fail STEP_ID]... [--sleep SECONDS]

``--fail STEP_ID`` fails that step's first attempt (exit 1, a message on standard error) before
it writes anything; ``--sleep`` works that long before answering (to see steps overlap or not).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

PATH = r"/[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*(?<![.-])"
OPTIONAL = re.compile(r"\s*(?:if it exists|\(if available\))")


def read_prompt(prompt: str) -> Tuple[List[str], List[str], List[str]]:
    """(files to write, files to read, files to read if they exist), in the prompt's order."""
    writes, reads, optional = [], [], []
    for match in re.finditer(r"(?<![\w/])" + PATH, prompt):
        path = match.group(0)
        before = prompt[:match.start()].rstrip()
        if before.endswith(" to") or before == "to":
            writes.append(path)
        elif OPTIONAL.match(prompt, match.end()):
            optional.append(path)
        else:
            reads.append(path)
    return writes, reads, optional


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail", action="append", default=[])
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()
    prompt = sys.stdin.read()
    step, attempt = os.environ.get("PIPELINE_STEP_ID", "?"), os.environ.get("PIPELINE_ATTEMPT", "1")
    writes, reads, optional = read_prompt(prompt)
    if step in args.fail and attempt == "1":
        print(f"{step}: CUDA out of memory (a scripted failure)", file=sys.stderr)
        return 1
    seen: Dict[str, str] = {}
    for name in reads + optional:
        path = Path(name)
        if path.is_file():
            seen[name] = digest(path)
        elif name in reads:
            print(f"{step}: cannot go on: {name} does not exist", file=sys.stderr)
            return 1
    time.sleep(args.sleep)
    written = {}
    for name in writes:
        path = Path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"written_by": step, "pipeline": os.environ.get("PIPELINE_NAME"),
                                    "attempt": int(attempt), "token": secrets.token_hex(8), "read": seen}) + "\n")
        written[name] = digest(path)
    tops = sorted({"/" + name.split("/")[1] for name in writes + reads + optional})
    answer = [f"# {step}", "", f"Model: {os.environ.get('PIPELINE_MODEL') or 'default'}; "
              f"tools: {os.environ.get('PIPELINE_TOOLS') or 'none'}.", ""]
    answer += [f"- read {name} sha256 {sha}" for name, sha in seen.items()]
    answer += [f"- wrote {name} sha256 {sha}" for name, sha in written.items()]
    answer += [f"- {top} writable: {'yes' if os.access(top, os.W_OK) else 'no'}" for top in tops]
    print("\n".join(answer))
    print(json.dumps({"pipeline_cost": 0.01}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
