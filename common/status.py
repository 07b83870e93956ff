"""``python -m common.status RESULTS [--watch [S]]``: what a job is doing, from its results folder.

Made for the login node, which sees the results folder but cannot reach the compute nodes: it reads
``status.json`` (rank 0 rewrites it every few seconds) and the journal (newer by up to those few
seconds), and says when the status file has gone stale, that is, when the job is gone.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Set, TextIO, Tuple

from common.observe.progress import format_seconds
from common.results.hold import last_refreshed, process_gone, read_hold, silent_for
from common.results.journal import JournalReader, WorkerTally, holds_journal
from common.results.layout import JOURNAL_NAME, RANK0_LOG, STATUS_NAME, ResultsLayout
from common.results.regular_file import NotRegularFile, read_regular
from common.results.status_file import STATUS_SECONDS
from common.run.cli import Parser, run_it

from .errors import (
    EXIT_FAILED_ITEMS,
    EXIT_NO_PROGRESS,
    EXIT_OK,
    EXIT_STATUS_NOT_WRITTEN,
    EXIT_STOPPED,
    UsageError,
    error_line,
    quoted,
)

#: the file is stale (rank 0 stopped writing it) after this many of its refresh intervals, plus a
#: margin for a shared filesystem's attribute caching and the nodes' clocks
STALE_INTERVALS = 4
STALE_MARGIN_SECONDS = 5.0
#: a rank whose snapshot is older than this many intervals is shown as silent
SILENT_INTERVALS = 3
FINAL_STATES = ("complete", "failed", "stopped")
#: the longest --watch period (a day): longer is no refresh at all, and past ~1e9 s sleep() overflows
MAX_WATCH_SECONDS = 86400.0
#: what a status.json whose fields have the wrong types raises while it is described: it then
#: counts as damaged, as one that is not JSON does
DAMAGED = (TypeError, ValueError, AttributeError, KeyError, OverflowError, IndexError)


class NotAResultsFolder(Exception):
    pass


#: what every run's status.json holds (a pipeline step's status.json, also named so, does not)
RUN_STATUS_FIELDS = ("app", "state", "updated", "items_total")


def read_status(path: Path) -> Optional[dict]:
    """The status file, or None where there is none (a job from before it, or not yet started).
    It is replaced atomically, so a read never sees half of one; a damaged one, or one that is
    not a run's (a pipeline step's), counts as absent. :class:`NotRegularFile` where it is a FIFO
    or another file that is not one."""
    try:
        value = json.loads(read_regular(path, "the status file"))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) and all(name in value for name in RUN_STATUS_FIELDS) else None


def _read_summary(path: Path) -> Optional[dict]:
    """A finished run's summary.json, or None (absent, damaged, or a FIFO: never waited on)."""
    try:
        value = json.loads(read_regular(path, "the summary"))
    except (OSError, ValueError, RecursionError, NotRegularFile):
        return None
    return value if isinstance(value, dict) else None


def _when(epoch: Optional[float]) -> str:
    if not epoch:
        return "?"
    return datetime.datetime.fromtimestamp(epoch).isoformat(sep=" ", timespec="seconds")


def _ago(epoch: Optional[float], now: float) -> str:
    return "?" if not epoch else f"{format_seconds(max(0.0, now - epoch))} ago"


def _number(value: Optional[float], unit: str = "", digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{unit}"


@dataclass(frozen=True)
class Gone:
    """Why a job the status file says is running is not: ``certain`` where its rank 0's process
    or hold says so, a guess from the status file's silence alone otherwise."""

    why: str
    certain: bool


def gone(results: Path, status: Optional[Dict[str, Any]], now: float) -> Optional[Gone]:
    """Why a run the status file says is running (or stopping) is not, or None while it may be.
    The status file not refreshed for several of its periods: the job was probably killed (seen
    from anywhere). The hold it keeps on its results folder (the same rank 0 pid) says more: its
    process is gone (a SIGKILL, an out-of-memory kill: seen at once from rank 0's own host), or it
    still refreshes the hold, as it did after the status file went quiet (alive: its status lags).
    A run writing its outputs ("finishing", a while for many figures) refreshes no status file, but
    still its hold: its process, or a hold gone silent, tells (it said "finishing" for ever after a
    SIGKILL there)."""
    if not status or status.get("state") not in ("running", "stopping", "finishing"):
        return None
    try:
        holder = read_hold(results)
    except NotRegularFile:  # not a hold the engine wrote: the status file alone tells
        holder = None
    mine = holder is not None and not holder.get("damaged") and holder.get("pid") == status.get("pid")
    if mine:
        rank_0 = f"(rank 0, pid {holder.get('pid')} on {holder.get('host')})"
        why = process_gone(holder)
        if why is not None:
            return Gone(f"{why} {rank_0}", certain=True)
        silent = silent_for(holder, now)
        if silent is not None and status.get("state") == "finishing":
            return Gone(f"its hold on the results folder has not been refreshed for {format_seconds(silent)} {rank_0}",
                        certain=True)
    if status.get("state") == "finishing":
        return None
    every = float(status.get("every") or STATUS_SECONDS)
    quiet_since = float(status.get("updated") or 0) + STALE_INTERVALS * every + STALE_MARGIN_SECONDS
    if now <= quiet_since or (mine and last_refreshed(holder) > quiet_since and silent_for(holder, now) is None):
        return None
    return Gone(f"the status file has not been refreshed for {format_seconds(now - float(status.get('updated') or 0))} "
                f"(every {every:g} s while the job runs)", certain=False)


_UNKNOWN = object()


def describe(results: Path, status: Optional[dict], journal: JournalReader, now: float,
             why_gone: Any = _UNKNOWN) -> str:
    """The report as text: what ``python -m common.status`` prints. ``why_gone``: :func:`gone`'s
    answer where the caller has it (``--watch`` ends on the same answer it shows)."""
    if status is None and journal.header is None:
        files = ResultsLayout(results)
        has_status, has_journal = files.status.exists(), files.journal.exists()
        if has_journal and not has_status and not holds_journal(files.journal):  # an empty journal
            raise NotAResultsFolder(f"{quoted(results)}: its run was killed as it started (its {JOURNAL_NAME} is "
                                    f"empty): nothing had finished; run it again")
        if has_status or has_journal:
            raise NotAResultsFolder(f"{quoted(results)}: not the results folder of a run: its {STATUS_NAME} and "
                                    f"{JOURNAL_NAME} are not a run's (a pipeline step's folder? give the folder "
                                    f"that --results named)")
        raise NotAResultsFolder(f"{quoted(results)}: no {STATUS_NAME} and no {JOURNAL_NAME}: not the results folder "
                                f"of a run (or the run has not started yet)")
    summary = _read_summary(ResultsLayout(results).summary_json)
    lines: List[str] = []
    if status is None:  # a run from before the status file: the journal alone
        fingerprint = (journal.header or {}).get("fingerprint")
        app = fingerprint.get("app", "?") if isinstance(fingerprint, dict) else "?"
        state = summary.get("status") if summary else "unknown (no readable status file)"
        lines.append(f"{app}: {state}")
        lines.append(f"items    {len(journal.done)} done, {len(journal.failed)} failed (from the journal; the total "
                     f"is not known without {STATUS_NAME})")
        lines += _failures([{"key": k, "error": error_line(e)} for k, e in journal.failed.items()], len(journal.failed))
        return "\n".join(lines + _journal_problem(journal)) + "\n"

    every = float(status.get("every") or STATUS_SECONDS)
    state = status.get("state", "?")
    age = now - float(status.get("updated") or 0)
    if why_gone is _UNKNOWN:
        why_gone = gone(results, status, now)
    lost = why_gone is not None  # what the file says of running items, the rate and the workers is stale
    if why_gone is not None and not why_gone.certain:
        shown = f"GONE? {why_gone.why}: the job was probably killed; rerun it with --resume to finish"
    elif why_gone is not None:
        shown = f"GONE: {why_gone.why}: the job was killed; rerun it with --resume to finish"
    elif state == "finishing":
        shown = (f"finishing: writing the outputs (since {_ago(status.get('updated'), now)}; if this lasts for long, "
                 f"see {RANK0_LOG}: the job may have ended there)")
    else:
        shown = state
        if state in ("stopping", "stopped") and status.get("stopping"):
            shown += f" ({status['stopping']})"
        elif state == "failed" and status.get("stopping"):  # --stop-after-failures: the rest never ran
            shown += f" (stopped: {status['stopping']})"
    lines.append(f"{status.get('app', '?')}: {shown}")
    lines.append(f"command  {status.get('command', '')}")
    lines.append(f"status   updated {_ago(status.get('updated'), now)} by rank 0 on {status.get('host', '?')} "
                 f"(pid {status.get('pid', '?')})")

    total = int(status.get("items_total") or 0)
    counted = int(status.get("items_done") or 0)
    # the journal may be a moment ahead of the status file; of a killed job it is what survived (results
    # still waiting for their batch's write when it was killed run again on resume)
    survived = lost and journal.header is not None
    done = len(journal.done) if survived else max(counted, len(journal.done))
    unsaved = max(0, counted - done) if survived else 0
    done = min(done, total) if total else done
    failed = max(int(status.get("items_failed") or 0), len(journal.failed))
    share = f" ({100.0 * done / total:.1f}%)" if total else ""
    running = status.get("items_running", 0) if state not in FINAL_STATES and not lost else 0
    # the file's count is up to a refresh older than the journal's: never more than the journal leaves
    running = max(0, min(int(running or 0), total - done - len(journal.failed))) if total else running
    resumed = int(status.get("items_resumed") or 0)
    # handed out: running, or queued at a worker to start the moment its item ends
    lines.append(f"items    {done} of {total} done{share}, {failed} failed, {running} handed out"
                 + (f"; {resumed} from an earlier run" if resumed else "")
                 + (f"; {unsaved} more had finished but {'was' if unsaved == 1 else 'were'} not yet in the journal "
                    f"when it was killed (a resume runs {'it' if unsaved == 1 else 'them'} again)" if unsaved else ""))
    elapsed = (float(status.get("updated") or now) if state in FINAL_STATES else now) - float(status.get("started") or now)
    rate = status.get("rate_per_second")
    if state in FINAL_STATES:
        if summary and isinstance(summary.get("wall_seconds"), (int, float)) and _same_start(summary, status):
            elapsed = float(summary["wall_seconds"])  # as summary.md says it
        lines.append(f"time     started {_when(status.get('started'))}, ran {format_seconds(elapsed)}")
    elif lost:  # until its last sign of life: the status file's refresh or the journal's last line
        ran = max(float(status.get("updated") or now), journal.last or 0.0) - float(status.get("started") or now)
        mean = (done - resumed) / ran if ran > 0 else None  # the status file's rate may be from its first write
        lines.append(f"time     started {_when(status.get('started'))}, ran at least {format_seconds(ran)}; "
                     f"mean rate {_number(mean, ' items/s', 3)}, no ETA (the job is not running)")
    else:
        eta = status.get("eta_seconds")
        if not rate and done > counted:  # the file's rate is from before these
            rate = None
        elif isinstance(rate, (int, float)) and rate > 0 and isinstance(status.get("items_remaining"), int):
            eta = _eta(status, journal, rate)
        until = "no ETA (stopping)" if state == "stopping" else f"ETA {format_seconds(eta)}"
        lines.append(f"rate     {_number(rate, ' items/s', 3)}, {until}; "
                     f"started {_when(status.get('started'))}, {format_seconds(elapsed)} ago")
    # the summary's where it is this run's, else the status file's (a stop while the outputs were written
    # leaves no summary, or an earlier run's)
    resume = (summary.get("resume_command") if summary and _same_start(summary, status) else None) \
        or status.get("resume_command")
    crash = status.get("error") if state == "failed" and not lost else None
    again = run_it(len(status.get("ranks") or []) or 1)  # how the command said below is run
    if crash:  # rank 0 itself failed (a bug): what finished is journaled, and a resume goes on from it
        lines.append(f"error    rank 0 failed: {crash} (the traceback is in {RANK0_LOG})")
    # the items ended but the app's outputs could not be written (its finish() raised): a resume writes them
    outputs = summary.get("outputs_error") if state == "failed" and summary and _same_start(summary, status) else None
    outputs_failed = isinstance(outputs, dict) and not crash
    if outputs_failed:
        lines.append(f"error    writing the outputs failed: {outputs.get('error') or '?'} (the traceback is in "
                     f"{RANK0_LOG}); every result is journaled")
    gave_up = state == "failed" and bool(status.get("stopping")) and not lost  # --stop-after-failures
    if ((state == "stopped" or lost) or crash or outputs_failed or gave_up) and isinstance(resume, str) and resume:
        first = ("after a fix, " if crash or outputs_failed or gave_up else
                 "with a longer --time (no item finished in the job's time), " if status.get("no_progress") else "")
        lines.append(f"resume   {first}{again} {resume}")
    elif state == "failed" and failed and isinstance(resume, str) and resume and not lost:
        lines.append(f"retry    the failed items {again} {resume}")

    moved = _moved(results, status)
    if moved and any(line.startswith(("resume ", "retry ")) for line in lines):
        lines.append(moved)
    elsewhere = _launched_elsewhere(status)
    if elsewhere and any(line.startswith(("resume ", "retry ")) for line in lines):
        lines.append(elsewhere)
    lines += _ranks(status, journal, every, now, lost)
    if state not in FINAL_STATES and not lost:
        lines += _workers(status, now, journal.done_this_run | set(journal.failed), journal.workers, every,
                          journal.attempt_ends)
    lines += _gpu_totals(summary["gpu_usage"]) if state in FINAL_STATES and summary and summary.get("gpu_usage") \
        else _gpus(status, age if lost else None)
    lines += _failures(status.get("failures") or [{"key": k, "error": error_line(e)} for k, e in journal.failed.items()], failed)
    if state in FINAL_STATES and ResultsLayout(results).report.exists():
        lines.append(f"report   {ResultsLayout(results).report}")
    return "\n".join(lines + _journal_problem(journal)) + "\n"


def _eta(status: dict, journal: JournalReader, rate: float) -> Optional[float]:
    """The time left at the file's rate for what is left by the journal, which is up to a refresh
    ahead of the file: its count less what this run's journal lines resolved since (at 26 of 30 done
    by the journal, the file's "ETA 6s" was from when it counted 12). Both count this run only (a
    resume runs some journaled items again, a refit after retried fits: not left by the whole journal)."""
    ahead = max(0, len(journal.done_this_run) - int(status.get("items_this_run") or 0)) \
        + max(0, len(journal.failed) - int(status.get("items_failed") or 0))
    left = max(0, int(status["items_remaining"]) - ahead)
    return left / rate if left else None


def _moved(results: Path, status: dict) -> Optional[str]:
    """The note for a folder moved or copied since its job ran: the commands above name where it was."""
    was, inode = status.get("results_dir"), status.get("results_inode")
    try:
        here = results.resolve()
        if not isinstance(was, str) or Path(was) == here:
            return None
        there = os.path.exists(was)
        if there and os.path.samefile(was, here):
            return None  # the same folder by another path (a link)
        # the same inode where the job's path leads nowhere: renamed (mv), or seen through a container's bind mount
        renamed_or_mounted = not there and inode == os.stat(here).st_ino
    except (OSError, RuntimeError, ValueError):
        return None
    if renamed_or_mounted:
        return (f"moved    this folder was {quoted(was)} when the job ran, a path not found here: if it was renamed, "
                f"give --results {quoted(str(here))} in the command above (a --resume of a path with no journal starts "
                f"the run afresh); seen through a container's bind mount, give the command there as it is")
    return f"moved    this folder was {quoted(was)} when the job ran: in the command above, give --results {quoted(str(here))}"


def _launched_elsewhere(status: dict) -> Optional[str]:
    """The note for a status command run in another folder than the job's: the commands above may
    name files and modules by paths relative to where the job was launched."""
    launched = status.get("launch_dir")
    if not isinstance(launched, str):
        return None
    try:
        if os.path.samefile(launched, os.getcwd()):  # by a link to it too: the same folder
            return None
    except (OSError, ValueError):  # gone since, or this folder is: where it was is said all the same
        pass
    return (f"folder   the job was launched in {quoted(launched)}: the command above reads its relative paths (and "
            f"a user's module) from there: cd {shlex.quote(launched)} first")


def _journal_problem(journal: JournalReader) -> List[str]:
    """What --resume would refuse in the journal, said where the status file alone says all is well."""
    if journal.problem is None:
        return []
    return [f"journal  {JOURNAL_NAME}: {journal.problem}; --resume refuses it until it is mended "
            f"(the finished items are in it)"]


def _same_start(summary: dict, status: dict) -> bool:
    """Whether summary.json is the run's that status.json describes (one whose summary could not be
    written leaves an earlier run's): the same start, to the second."""
    try:
        epoch = float(status.get("started"))
        written = datetime.datetime.fromisoformat(summary.get("started"))
        if written.tzinfo is None:  # a summary of an earlier version: local time, as this machine's
            return written == datetime.datetime.fromtimestamp(epoch).replace(microsecond=0)
        return int(written.timestamp()) == int(epoch)
    except (TypeError, ValueError, OverflowError, OSError):
        return False


def _ranks(status: dict, journal: JournalReader, every: float, now: float, gone: bool = False) -> List[str]:
    """One line per rank; of a job that is gone, when each was last heard from (none is "ok")."""
    ranks = status.get("ranks") or []
    lost = {entry.get("rank"): entry for entry in journal.lost.values()}
    parts: List[Tuple[str, bool]] = []  # (what is said of the rank, whether it is ok)
    for rank in ranks:
        number, host = rank.get("rank"), rank.get("host", "?")
        where = f"rank {number} on {host}"
        if rank.get("lost") or number in lost:
            parts.append((f"{where}: LOST ({rank.get('lost') or lost[number].get('why', '')})", False))
        elif rank.get("broken"):
            parts.append((f"{where}: no worker could start ({rank['broken']})", False))
        elif gone:
            heard = rank.get("heard")
            parts.append((f"{where}: gone with the job" + (
                f" (last heard {format_seconds(now - heard)} ago)" if isinstance(heard, (int, float)) else ""), False))
        elif status.get("state") in ("running", "stopping") and rank.get("heard") \
                and now - rank["heard"] > SILENT_INTERVALS * every + every:
            parts.append((f"{where}: silent for {format_seconds(now - rank['heard'])}", False))
        else:
            parts.append((f"{where}: ok", True))
    if not parts:
        return []
    not_ok = sum(1 for _, ok in parts if not ok)
    head = f"ranks    {len(parts)}" + (f", {not_ok} not ok" if not_ok else "")
    return [head] + [f"  {text}" for text, _ in parts]


def _workers(status: dict, now: float, resolved: Set[str], tallies: Mapping[str, WorkerTally],
             every: float, attempt_ends: Optional[Mapping[str, float]] = None) -> List[str]:
    """The workers as the status file saw them; ``resolved``: keys the journal has since seen
    finish or fail (the file is up to ``every`` s older than the journal: not shown as running);
    ``tallies``: each worker's items finished in this run, from the journal, which give a worker
    whose items take less than a refresh its pace rather than an item that ended;
    ``attempt_ends``: the end of each key's latest failed attempt (one that ended after the file
    saw it start is not shown running, for longer than --item-timeout lets it)."""
    attempt_ends = attempt_ends or {}
    workers = status.get("workers") or []
    if not workers:
        return []
    updated = float(status.get("updated") or 0)
    busy = sum(1 for w in workers if w.get("state") == "running")
    lines = [f"workers  {len(workers)}, {busy} running an item"]
    width = max(len(w.get("worker", "")) for w in workers)
    for w in workers:
        where = f"{w.get('worker', '?'):<{width}}  {w.get('host', '?')}"
        tally = tallies.get(w.get("worker", ""))
        # "starting" in a file older than the worker's results (a follower's snapshot comes with the
        # next refresh): busy, as the journal says; not one whose results are older than the file (a
        # worker started again after a crash keeps its name)
        started = (w.get("state") == "starting" and tally is not None and tally.last_end is not None
                   and tally.last_end > updated)
        if (w.get("state") == "running" and w.get("key") in resolved) or started:
            # busy: an item ended since the file's last refresh (else the worker may have had no more)
            if tally is None or tally.last_end is None or (now - tally.last_end > every and not started):
                lines.append(f"  {where}  {w.get('key')} ended; what it runs next shows at the next refresh")
            else:
                lines.append(f"  {where}  busy: {tally.items} done in this run, {_pace(tally.seconds / tally.items)} "
                             f"each, the last ended {_pace(max(0.0, now - tally.last_end))} ago")
        elif w.get("state") == "running" and attempt_ends.get(w.get("key"), -math.inf) >= w.get("since", math.inf):
            lines.append(f"  {where}  {w.get('key')}: that attempt ended without a result; what it runs next shows "
                         f"at the next refresh")
        elif w.get("state") == "running":
            extra = f" (+{w['together'] - 1} run with it)" if w.get("together", 1) > 1 else ""
            attempt = f", attempt {w['attempt']}" if (w.get("attempt") or 1) > 1 else ""
            done = f"; {tally.items} done in this run" if tally is not None else ""
            lines.append(f"  {where}  {w.get('key')}{extra} for {format_seconds(now - w['since'])}{attempt}{done}")
        elif w.get("state") == "given up":
            lines.append(f"  {where}  given up: {w.get('error', '')}")
        else:
            lines.append(f"  {where}  {w.get('state', '?')}")
    return lines


def _pace(seconds: float) -> str:
    """Seconds as :func:`format_seconds` gives them, with a tenth below 10 s (items of a second)
    and in milliseconds below 0.1 s."""
    if seconds < 0.1:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds:.1f}s" if seconds < 10 else format_seconds(seconds)


def _gpus(status: dict, stale_for: Optional[float] = None) -> List[str]:
    """The GPUs' last sample; ``stale_for``: seconds since it was taken, where the job is gone (so
    that no one reads a dead job's last figures as what its GPUs do now)."""
    gpus = status.get("gpus") or []
    if not gpus:
        return []
    lines = ["GPUs     last sample (mean of the last minute)" if stale_for is None else
             f"GPUs     last sample, taken {format_seconds(stale_for)} ago, before the job went silent "
             f"(mean of the minute before it)"]
    for g in gpus:
        memory = _number(g.get("memory_mib"), digits=0)
        if g.get("memory_total_mib"):
            memory += f"/{g['memory_total_mib']:.0f}"
        lines.append(f"  rank{g.get('rank')}-{g.get('gpu')}  {g.get('host', '?')}  "
                     f"util {_number(g.get('util_percent'), '%')} ({_number(g.get('util_recent_percent'), '%')})  "
                     f"memory {memory} MiB ({_number(g.get('memory_recent_mib'))})  "
                     f"{_number(g.get('temperature_c'), ' C')}  {_number(g.get('power_w'), ' W')}")
    return lines


def _gpu_totals(usage: Dict[str, Dict[str, Any]]) -> List[str]:
    """A finished run's mean (peak) per GPU, from summary.json."""
    lines = ["GPUs     mean (peak) over the run"]
    for name, stats in usage.items():
        lines.append(f"  {name}  util {_number(stats.get('util_mean_percent'), '%')} "
                     f"({_number(stats.get('util_peak_percent'), '%')})  "
                     f"memory {_number(stats.get('memory_mean_mib'))} ({_number(stats.get('memory_peak_mib'))}) MiB  "
                     f"{_number(stats.get('temperature_mean_c'), ' C')} ({_number(stats.get('temperature_peak_c'), ' C')})  "
                     f"{_number(stats.get('power_mean_w'), ' W')} ({_number(stats.get('power_peak_w'), ' W')})")
    return lines


def _failures(failures: List[dict], count: int) -> List[str]:
    if not count:
        return []
    lines = [f"failed   {count}" + (f" (the last {len(failures)} listed)" if len(failures) < count else "")]
    lines += [f"  {f.get('key')}: {f.get('error', '')}" for f in failures]
    return lines


def exit_code(state: Optional[str], why_gone: Optional[Gone], no_progress: bool = False) -> int:
    """The job's state as the code the job itself ends with, so that a script branches on it
    without reading the text: 0 running or complete, 1 failed, 75 stopped or gone (``--resume``
    finishes it; the code a Slurm script requeues on), 76 stopped by the walltime before any of its
    items finished (a requeue with the same --time would only repeat it)."""
    if why_gone is None and state == "stopped" and no_progress:
        return EXIT_NO_PROGRESS
    if why_gone is not None or state == "stopped":
        return EXIT_STOPPED
    return EXIT_FAILED_ITEMS if state == "failed" else EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m common.status",  # a bad argument: one line, exit 2, as the apps say it
                    description="What a job is doing, from its results folder (status.json and the journal that "
                                "the job keeps current there). Exit code: 0 running or complete, 1 failed, 75 "
                                "stopped or gone (rerun it with --resume), 76 stopped before any item finished in "
                                "the job's time (give it a longer --time), 2 not a run's results folder.")
    parser.add_argument("results", type=Path, help="the job's results folder (--results)")
    parser.add_argument("--watch", nargs="?", type=float, const=2.0, default=None, metavar="S",
                        help="refresh every S seconds (default 2) until the job ends; Ctrl-C to leave")
    return parser


def main(argv: Optional[List[str]] = None, out: TextIO = sys.stdout) -> int:
    try:
        args = _parser().parse_args(argv)
    except UsageError as error:
        print(f"python -m common.status: error: {error}", file=sys.stderr)
        return 2
    if args.watch is not None and not 0 < args.watch <= MAX_WATCH_SECONDS:  # also refuses nan
        print(f"python -m common.status: error: --watch takes a positive number of seconds up to "
              f"{MAX_WATCH_SECONDS:g}, got {args.watch:g}", file=sys.stderr)
        return 2
    results: Path = args.results
    try:
        os.stat(results)
    except FileNotFoundError:
        pass
    except OSError as error:  # a name over the filesystem's limit, no permission: --watch would never see it
        print(f"python -m common.status: error: {quoted(results)}: {error.strerror or error}", file=sys.stderr)
        return 2
    if results.is_dir() and not os.access(results, os.X_OK):  # its files cannot be looked up: one line, not a traceback
        print(f"python -m common.status: error: {quoted(results)}: cannot read it (Permission denied)", file=sys.stderr)
        return 2
    if results.exists() and not results.is_dir():
        print(f"python -m common.status: error: {quoted(results)}: is not a folder (give a run's --results folder)",
              file=sys.stderr)
        return 2
    if not results.is_dir() and args.watch is None:
        print(f"python -m common.status: error: {quoted(results)}: no such folder", file=sys.stderr)
        return 2
    journal = JournalReader(ResultsLayout(results).journal)
    clear = args.watch is not None and out.isatty()
    try:
        while True:
            try:
                journal.update()
                status = read_status(ResultsLayout(results).status)
            except NotRegularFile as problem:  # a FIFO would make every read wait for ever
                print(f"python -m common.status: error: {problem}", file=sys.stderr)
                return 2
            why_gone, state = None, None
            try:
                if not results.is_dir():  # --watch started before the job: wait for it
                    raise NotAResultsFolder(f"{results}: no such folder yet")
                now = time.time()
                try:
                    why_gone = gone(results, status, now)
                    text = describe(results, status, journal, now, why_gone)
                    state = status.get("state") if status is not None else None
                except DAMAGED:  # a field of the wrong type: the file counts as damaged, the journal alone speaks
                    why_gone, state, text = None, None, describe(results, None, journal, now)
                if state is None:  # the journal alone: the state its summary gives, if any (as the text says)
                    state = (_read_summary(ResultsLayout(results).summary_json) or {}).get("status")
            except NotAResultsFolder as problem:
                if args.watch is None:
                    print(f"python -m common.status: error: {problem}", file=sys.stderr)
                    return 2
                text = f"waiting: {problem}\n"
            try:
                if clear:
                    out.write("\x1b[H\x1b[2J")
                elif args.watch is not None:
                    out.write(f"--- {_when(time.time())}\n")
                out.write(text)
                out.flush()
            except BrokenPipeError:  # the reader left (| head -1): nothing more to tell it, and no failure
                _let_go_of(out)
                return 0
            except OSError as error:  # a full disk (> /dev/full): not one of the job's states (1 is failed)
                _let_go_of(out)
                try:
                    print(f"python -m common.status: error: the status could not be written to stdout "
                          f"({error.strerror or error})", file=sys.stderr)
                except OSError:  # stderr full too (2>&1): the exit code alone says it
                    _let_go_of(sys.stderr)
                return EXIT_STATUS_NOT_WRITTEN
            # ends with the job: done, stopped, failed, or gone without a word (killed); by its status
            # file alone (a summary.json may be an earlier run's while this one runs)
            if args.watch is None or (status or {}).get("state") in FINAL_STATES or why_gone is not None:
                return exit_code(state, why_gone, bool((status or {}).get("no_progress")))
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _let_go_of(out: TextIO) -> None:
    """Point a stream whose reader left at /dev/null, so that the interpreter's last flush of what
    it still buffers raises nothing either (Python's documented way)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    raise SystemExit(main())
