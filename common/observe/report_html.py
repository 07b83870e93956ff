"""report.html: one self-contained page beside summary.md, to open from the login node.

It is summary.md rendered (the run's counts, the GPU table, failures, the app's own results) with
every figure it shows inlined, the timeline and GPU use added where summary.md does not show them,
and the failed attempts' tracebacks from the journal. Nothing is fetched when it opens: figures are
data URIs, the style is inline, and no script runs.
"""
from __future__ import annotations

import base64
import html
import json
import logging
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from common.errors import error_line
from common.results.journal import JournalReader, Kind
from common.results.layout import (
    GPU_USAGE_CSV,
    GPU_USAGE_STEM,
    JOURNAL_NAME,
    LOGS_DIR,
    REPORT_NAME,
    SUMMARY_JSON,
    SUMMARY_MD,
    TIMELINE_STEM,
    ResultsLayout,
    png_name,
)
from common.results.outputs import atomic_write_text
from common.results.regular_file import NotRegularFile

log = logging.getLogger("multinode_gpu")

#: an SVG larger than this is inlined as its PNG instead (thousands of shapes are slow to draw)
MAX_SVG_BYTES = 2 * 2**20
#: tracebacks shown (the most recent failed attempts)
MAX_TRACEBACKS = 50
_EXTRA_FIGURES = ((png_name(TIMELINE_STEM), "Timeline", "one row per worker of every rank, one bar per item; failures in red"),
                  (png_name(GPU_USAGE_STEM), "GPU use", f"every GPU of every node over the run ({GPU_USAGE_CSV} has the samples)"))

_STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1d2329; background: #f6f7f9; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 28px 48px; background: #fff; min-height: 100vh; }
h1 { font-size: 1.6em; margin: 0.2em 0 0.6em; } h2 { font-size: 1.25em; margin-top: 1.8em; border-bottom: 1px solid #dde1e6; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 0 0 18px; padding: 0; list-style: none; }
.cards li { border: 1px solid #dde1e6; border-radius: 8px; padding: 8px 14px; min-width: 92px; }
.cards b { display: block; font-size: 1.35em; } .cards span { color: #5a6570; font-size: 0.9em; }
.complete b.state { color: #1a7f37; } .failed b.state, .stopped b.state { color: #b3261e; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.93em; }
th, td { border: 1px solid #dde1e6; padding: 4px 9px; text-align: left; vertical-align: top; }
th { background: #f0f2f5; } code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 0.9em; }
pre { background: #f6f8fa; padding: 10px; white-space: pre-wrap; overflow-wrap: anywhere; }
img { max-width: 100%; height: auto; display: block; margin: 10px 0; }
figure { margin: 1em 0; } figcaption { color: #5a6570; font-size: 0.9em; }
details { margin: 6px 0; } summary { cursor: pointer; }
footer { color: #5a6570; font-size: 0.85em; margin-top: 3em; }
"""


def _data_uri(png: Path) -> Optional[str]:
    """A figure as a data URI: its SVG where there is one of a sensible size, else the PNG."""
    svg = png.with_suffix(".svg")
    if svg.is_file() and svg.stat().st_size <= MAX_SVG_BYTES:
        return "data:image/svg+xml;base64," + base64.b64encode(svg.read_bytes()).decode()
    if png.is_file():
        return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    return None


def _markdown_html(text: str) -> str:
    """summary.md as HTML; raw HTML in it (an item's error message) is shown as text, not obeyed."""
    import markdown

    md = markdown.Markdown(extensions=["tables", "fenced_code"])
    md.preprocessors.deregister("html_block")
    md.inlinePatterns.deregister("html")
    return md.convert(text)


def warm_up() -> None:
    """Import markdown and load its extensions (what the first :func:`write_report` spends most of
    its time on), for a caller that waits for something else meanwhile (the timeline's drawing)."""
    try:
        _markdown_html("| a |\n|---|\n| 1 |\n\n```\nx\n```\n")
    except Exception:  # noqa: BLE001 - only a head start: write_report says what fails
        pass


def _inline_images(body: str, results: Path) -> str:
    def replace(match: "re.Match[str]") -> str:
        tag, source = match.group(0), html.unescape(match.group(2))
        if re.match(r"^[a-z]+:", source) or source.startswith("/"):
            return tag  # not one of the run's files
        path = results / source
        uri = _data_uri(path)
        if uri is None:
            return f'<p class="missing">figure {html.escape(source)} is missing</p>'
        return f'{match.group(1)}"{uri}"'

    return re.sub(r'(<img\b[^>]*?\bsrc=)"([^"]*)"', replace, body)


def _tracebacks(results: Path) -> List[Dict[str, Any]]:
    """The last failed attempts with their tracebacks, from the journal."""
    try:
        reader = JournalReader(ResultsLayout(results).journal, attempts=True, only=(Kind.ATTEMPT_FAILED,)).update()
    except NotRegularFile:
        return []
    return reader.attempts[-MAX_TRACEBACKS:]


def _cards(summary: Mapping[str, Any]) -> str:
    failed = len(summary.get("failed_items") or [])
    ranks = summary.get("ranks", "?")
    workers = sum(len(w.get("devices", [])) for w in summary.get("workers") or [])
    cards = [("state", summary.get("status", "?"), "status"),
             ("", f"{summary.get('items_done', 0)} of {summary.get('items_total', 0)}", "items done"),
             ("", str(failed), "failed"),
             ("", str(summary.get("items_resumed", 0)), "from an earlier run"),
             ("", f"{float(summary.get('wall_seconds') or 0):.1f} s", "wall time"),
             ("", str(ranks), "rank" if ranks == 1 else "ranks"),
             ("", str(workers), "worker" if workers == 1 else "workers")]
    items = "".join(f'<li><b class="{cls}">{html.escape(str(value))}</b><span>{html.escape(label)}</span></li>'
                    for cls, value, label in cards)
    return f'<ul class="cards" id="counts">{items}</ul>'


def write_report(results: Path) -> Optional[Path]:
    """Write report.html from summary.json, summary.md and the figures beside them. A failure is a
    warning in the log: the summary, already written, is what counts."""
    try:
        return _write_report(Path(results))
    except Exception as error:  # noqa: BLE001 - a report must never cost the run its exit code
        log.warning("%s not written: %s: %s", REPORT_NAME, type(error).__name__, error)
        return None


def _write_report(results: Path) -> Optional[Path]:
    try:
        summary = json.loads(ResultsLayout(results).summary_json.read_text())
        text = ResultsLayout(results).summary_md.read_text()
    except (OSError, ValueError):
        return None
    title_line, _, rest = text.partition("\n")
    body = _inline_images(_markdown_html(rest), results)
    extra = []
    for name, title, caption in _EXTRA_FIGURES:
        path = results / name
        if path.is_file() and f"({name})" not in rest:
            uri = _data_uri(path)
            extra.append(f'<h2>{title}</h2><figure><img alt="{html.escape(title)}" src="{uri}">'
                         f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    attempts = _tracebacks(results)
    if attempts:
        extra.append(f"<h2>Failed attempts ({len(attempts)} most recent)</h2>")
        for entry in attempts:
            error = entry.get("error")
            head = (f"{entry.get('key')}, attempt {entry.get('attempt', '?')} on {entry.get('worker', '?')}: "
                    f"{error_line(error) if isinstance(error, str) else ''}")
            detail = entry.get("traceback") or entry.get("error") or ""
            extra.append(f"<details><summary>{html.escape(head)}</summary><pre>{html.escape(detail)}</pre></details>")
    title = title_line.lstrip("# ").strip() or "run report"
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n"
            f'<body class="{html.escape(str(summary.get("status", "")))}"><main>\n'
            f"<h1>{html.escape(title)}</h1>\n{_cards(summary)}\n{body}\n" + "\n".join(extra)
            + f"\n<footer>{html.escape(str(results))}: {SUMMARY_MD}, {SUMMARY_JSON}, {JOURNAL_NAME} and {LOGS_DIR}/ hold the "
              f"same and more. Started {html.escape(str(summary.get('started', '?')))}.</footer>\n"
              f"</main></body></html>\n")
    atomic_write_text(ResultsLayout(results).report, page)
    return ResultsLayout(results).report
