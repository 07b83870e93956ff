"""timeline.png/svg: one row per worker of every rank, one bar per item, failures marked (items that
timed out and workers killed for their silence in their own colours; attempts a stop of the run
ended, which run again on --resume, in grey).

:class:`TimelineDrawer` draws it in a process of its own, started with the run (``python -m
common.observe.timeline`` is that process)."""
from __future__ import annotations

import os
import pickle
import select
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Optional

from common.errors import FAILED, SILENT, TIMED_OUT, counted
from common.results.layout import worker_rank_and_device
from common.signals import DRAWER_IGNORED_SIGNALS, signals_blocked

#: bar colour by outcome: ``ok``, else the bar's ``why`` (common.messages.Failed.kind)
COLOURS = {"ok": "tab:blue", FAILED: "tab:red", TIMED_OUT: "tab:orange", SILENT: "tab:purple", "stopped": "tab:gray"}
LABELS = {FAILED: "failed (red)", TIMED_OUT: "timed out (orange)", SILENT: "worker silent, killed (purple)",
          "stopped": "ended by the run's stop (grey)"}


def plot_timeline(bars: List[Mapping], path_without_suffix: Path) -> list:
    """``bars``: dicts with worker, start, end (epoch seconds), ok (bool) and, for a failure, maybe why
    ("failed", "timeout" or "silent")."""
    from matplotlib.collections import PolyCollection

    from common.results.outputs import new_figure, save_figure  # numpy: imported by the drawing's warm-up thread

    def row_order(name: str) -> tuple:
        """rank0-cpu2 < rank0-cpu10 < rank1-gpu0.0 < rank1-gpu0.1 < rank1-gpu1.0 (--workers-per-gpu)."""
        rank, device = worker_rank_and_device(name)
        kind = device.rstrip("0123456789.")
        numbers = [int(part) for part in device[len(kind):].split(".") if part.isdigit()]
        return (rank, kind, numbers)

    workers = sorted({bar["worker"] for bar in bars}, key=row_order)
    rows = {name: index for index, name in enumerate(workers)}
    origin = min((bar["start"] for bar in bars), default=0.0)
    fig, ax = new_figure(10, 1.2 + 0.35 * max(1, len(workers)))
    spans = {}  # (worker, outcome) -> [(start, width)], built in one pass
    for bar in bars:
        spans.setdefault((bar["worker"], _outcome(bar)), []).append(
            (bar["start"] - origin, max(bar["end"] - bar["start"], 1e-3)))
    many = len(bars) > 1000  # thousands of rectangles: draw them as pixels, even in the SVG
    for (worker, outcome), row in spans.items():
        ax.add_collection(PolyCollection(_rectangles(row, rows[worker] - 0.35, 0.7), facecolors=COLOURS[outcome],
                                         edgecolor="white", linewidth=0 if many else 0.3, rasterized=many))
    ax.set_yticks(range(len(workers)), workers)
    ax.invert_yaxis()
    ax.set_xlabel("seconds since the first item started")
    counts = {kind: sum(1 for bar in bars if _outcome(bar) == kind) for kind in LABELS}
    # attempts, not items: an item retried is a bar per attempt (summary.md counts the items that failed for good);
    # the items of a group run together share one bar (mnist_svm's fits of a grid point: 81 attempts, 21 bars)
    shared = len({(bar["worker"], bar["start"], bar["end"]) for bar in bars})
    together = f" ({counted(shared, 'bar')}: items run together share one)" if shared < len(bars) else ""
    ax.set_title(f"{counted(len(bars), 'attempt')}{together} on {counted(len(workers), 'worker')}"
                 + "".join(f", {count} {LABELS[kind]}" for kind, count in counts.items() if count))
    ax.grid(axis="x", alpha=0.3)
    return save_figure(fig, path_without_suffix)


def _rectangles(spans: List[tuple], bottom: float, height: float) -> Any:
    """The corners of one row's bars, as ``Axes.broken_barh`` makes them, but built as one array:
    broken_barh converts each bar on its own, about 0.1 s of the end of a run of 5,000 items."""
    import numpy as np

    starts, widths = np.array(spans, dtype=float).reshape(-1, 2).T
    corners = np.empty((len(starts), 4, 2))
    corners[:, :2, 0] = starts[:, None]
    corners[:, 2:, 0] = (starts + widths)[:, None]
    corners[:, [0, 3], 1] = bottom
    corners[:, [1, 2], 1] = bottom + height
    return corners


def _outcome(bar: Mapping) -> str:
    return "ok" if bar["ok"] else bar.get("why") if bar.get("why") in LABELS else "failed"


#: the longest the end of a run waits for the drawing process before drawing in its own
DRAW_TIMEOUT = 600.0
#: the niceness of the drawing process's warm-up thread: the warm-up (matplotlib's import and first
#: use, about 0.6 s of CPU) takes what the rank's loop and the workers leave. Only that thread's: the
#: drawing itself, which the end of the run waits for, runs at the rank's own priority (an
#: unprivileged process cannot lower its niceness again once raised). Where the kernel groups the
#: processes of a session (sched_autogroup, on by default on most desktops and VMs), the child, in a
#: session of its own, competes as a group of its own and this niceness weighs nothing against the
#: rank's processes: measured so, and with the child in the rank's session instead (process_group=0,
#: where the niceness holds), the warm-up was left for the end of short CPU-bound runs: last result
#: to exit 2.99 s against 1.12 s, launch 1.75 against 1.89 s (5,000 no-op items, 1 rank x 2 workers,
#: 2 cores shared with other sessions, medians of 6 interleaved runs), so the child keeps its session
DRAWER_NICENESS = 10


class TimelineDrawer:
    """timeline.png/svg/pdf drawn by a child process started with the run, which imports matplotlib
    and warms it up while the items run: the end of the run hands it the bars and goes on with the
    other outputs, instead of importing matplotlib and drawing thousands of bars first.

    Nothing is lost or left behind: where the child cannot start, dies or takes longer than
    ``DRAW_TIMEOUT``, the caller draws in its own process (:meth:`result` says so); an error of the
    drawing itself (a full disk) is raised by :meth:`result` as if the caller had drawn; the child
    dies with its parent (SIGKILL on Linux), ignores the stop signals that its parent handles, and
    :meth:`close` kills it if it still runs, so no child writes after the program exits."""

    def __init__(self) -> None:
        self._process: Optional[subprocess.Popen] = None
        self._sending: Optional[threading.Thread] = None

    def start(self) -> "TimelineDrawer":
        from common.settings import without_launcher  # its child must not see the MPI launcher's variables

        top = sys.modules[__name__.split(".")[0]]
        root = str(Path(top.__file__).resolve().parents[1])  # where the package is, for the child's import
        env = without_launcher(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        # the stop signals blocked in this thread meanwhile: the child inherits the block through fork and
        # exec, so one that reaches the whole job while it still imports waits until it ignores them
        with signals_blocked(DRAWER_IGNORED_SIGNALS):
            try:
                self._process = subprocess.Popen([sys.executable, "-m", __name__, str(os.getpid())], env=env,
                                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                 stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
            except OSError:
                self._process = None  # drawn in the caller's process instead
        return self

    def draw(self, bars: List[Mapping], path_without_suffix: Path) -> bool:
        """Hand the bars to the child (in a thread: it may still be warming up); False where there
        is no child to draw them (then the caller draws)."""
        process = self._process
        if process is None or process.poll() is not None:
            return False
        request = pickle.dumps(_Request(bars, Path(path_without_suffix)), protocol=pickle.HIGHEST_PROTOCOL)

        def send() -> None:
            try:
                assert process.stdin is not None
                process.stdin.write(request)
                process.stdin.close()
            except (OSError, ValueError):
                pass  # the child died: result() finds no answer and says so

        self._sending = threading.Thread(target=send, name="timeline-bars", daemon=True)
        self._sending.start()
        return True

    def result(self, timeout: float = DRAW_TIMEOUT) -> Optional[list]:
        """The paths written, once the child is done; None where it gave no answer (the caller then
        draws itself). What the drawing raised in the child is raised here."""
        process = self._process
        if process is None or process.stdout is None:
            return None
        try:
            ready, _, _ = select.select([process.stdout], [], [], timeout)
            answer = pickle.load(process.stdout) if ready else None
        except (EOFError, OSError, pickle.UnpicklingError):
            answer = None
        self.close()
        if not isinstance(answer, _Answer):
            return None
        if answer.error is not None:
            raise answer.error
        return answer.paths

    def close(self) -> None:
        """Kill the child if it still runs, and reap it."""
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        if self._sending is not None:
            self._sending.join()


@dataclass(frozen=True)
class _Request:
    """What the run hands its drawing process: the bars and where to write the figure."""

    bars: List[Mapping]
    path: Path


@dataclass(frozen=True)
class _Answer:
    """What the drawing process answers: the paths written, or what the drawing raised."""

    paths: Optional[List[Path]] = None
    error: Optional[BaseException] = None


def _warm_up_nicely(enough: threading.Event) -> None:
    """:func:`common.results.outputs.warm_up_figures` in a thread of its own at ``DRAWER_NICENESS``
    (Linux: niceness is a thread's), so that the main thread draws at full priority. It stops once
    ``enough`` is set (the run's bars have come): warming up further would only hold the end of a
    short run longer."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), DRAWER_NICENESS)
    except (OSError, AttributeError):
        pass
    try:
        from common.results.outputs import warm_up_figures

        warm_up_figures(enough)
    except Exception:
        pass  # only a head start


def _child(parent: int) -> int:
    """The drawing process: warm up, then draw the one timeline it is given on stdin and answer
    an :class:`_Answer` on stdout. EOF on stdin (its parent ended): exit."""
    from common.linux import die_with_parent

    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above
        return 0
    for number in DRAWER_IGNORED_SIGNALS:
        signal.signal(number, signal.SIG_IGN)  # the parent decides how a stop ends; it kills this one
    signal.pthread_sigmask(signal.SIG_UNBLOCK, DRAWER_IGNORED_SIGNALS)  # blocked since the fork (TimelineDrawer.start)
    bars_came = threading.Event()
    warming = threading.Thread(target=_warm_up_nicely, args=(bars_came,), name="warm-up", daemon=True)
    warming.start()
    try:
        request = pickle.load(sys.stdin.buffer)
    except (EOFError, OSError, pickle.UnpicklingError):
        return 0
    bars_came.set()  # a warm-up still under way ends after its current step
    warming.join()  # matplotlib in one thread at a time
    try:
        answer = _Answer(paths=plot_timeline(request.bars, request.path))
    except Exception as error:  # noqa: BLE001 -- raised again in the parent
        answer = _Answer(error=error)
    try:
        data = pickle.dumps(answer)
    except Exception:  # an exception that does not pickle: its text
        data = pickle.dumps(_Answer(error=RuntimeError(f"the timeline: {answer.error!r}")))
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":  # run from the module proper, so that _Answer pickles as its parent reads it
    from common.observe.timeline import _child as child

    sys.exit(child(int(sys.argv[1])))
