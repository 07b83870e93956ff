"""The timeline's drawing process (common.observe.timeline.TimelineDrawer): a real child process that draws
what rank 0 would have drawn, byte for byte, raises rank 0's errors in rank 0, and never outlives
its parent."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from common.observe.timeline import TimelineDrawer, plot_timeline
from helpers import REPO, alive, wait_until

FORMATS = ("png", "svg", "pdf")


def bars(count: int = 1500) -> list:
    """Enough bars to be drawn as pixels (over 1,000), some failed and timed out."""
    return [{"worker": f"rank{i % 3}-cpu{i % 2}", "start": 1e9 + i * 0.001, "end": 1e9 + i * 0.001 + (i % 7) * 3e-4,
             "ok": i % 97 != 0, **({"why": "timeout"} if i % 291 == 0 else {})} for i in range(count)]


def test_the_child_draws_the_same_bytes_as_rank_0(tmp_path):
    drawer = TimelineDrawer().start()
    try:
        assert drawer.draw(bars(), tmp_path / "child" / "timeline")
        written = drawer.result()
    finally:
        drawer.close()
    assert written == [tmp_path / "child" / f"timeline.{form}" for form in FORMATS]
    plot_timeline(bars(), tmp_path / "here" / "timeline")
    for form in FORMATS:
        assert (tmp_path / "child" / f"timeline.{form}").read_bytes() == (tmp_path / "here" / f"timeline.{form}").read_bytes()


def test_an_error_of_the_drawing_is_raised_in_the_parent(tmp_path):
    (tmp_path / "a_file").write_text("")
    drawer = TimelineDrawer().start()
    assert drawer.draw(bars(10), tmp_path / "a_file" / "timeline")
    with pytest.raises(OSError) as raised:
        drawer.result()
    assert raised.value.filename == str(tmp_path / "a_file")


def test_a_dead_child_means_no_answer_and_nothing_is_left_running(tmp_path):
    drawer = TimelineDrawer().start()
    pid = drawer._process.pid
    os.kill(pid, signal.SIGKILL)
    drawer.draw(bars(10), tmp_path / "timeline")  # may or may not see it dead yet
    assert drawer.result(timeout=30) is None  # the caller then draws itself
    assert not alive(pid)
    assert not drawer.draw(bars(10), tmp_path / "timeline")  # closed: nothing to hand to


def test_close_kills_a_child_still_at_work_and_reaps_it():
    drawer = TimelineDrawer().start()
    pid = drawer._process.pid
    drawer.close()
    assert not psutil.pid_exists(pid)  # killed and reaped: not even a zombie


def test_the_child_ignores_stop_signals_and_dies_with_its_parent():
    parent = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom common.observe.timeline import TimelineDrawer\n"
                               "d = TimelineDrawer().start()\nprint(d._process.pid, flush=True)\ntime.sleep(600)"],
                              cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert wait_until(lambda: "common.observe.timeline" in " ".join(psutil.Process(child).cmdline()), timeout=30)
        os.kill(child, signal.SIGTERM)
        os.kill(child, signal.SIGINT)
        time.sleep(0.5)
        assert alive(child)  # the parent decides how a stop ends
        parent.kill()
        parent.wait(timeout=30)
        assert wait_until(lambda: not alive(child), timeout=30)
    finally:
        parent.kill()
        parent.wait()


def test_the_title_counts_in_words_and_says_when_items_share_a_bar(tmp_path, monkeypatch):
    """A review of the demo's figures: mnist_svm's said "81 attempts on 2 workers" above 21 bars (the
    fits of a grid point run together, one bar), and a run whose one busy worker did everything "20
    attempts on 1 workers"."""
    from common.observe import timeline
    from common.results import outputs

    titles = []
    monkeypatch.setattr(outputs, "save_figure", lambda fig, path: titles.append(fig.axes[0].get_title()) or [])
    one = [{"worker": "rank0-cpu0", "start": 1e9 + i, "end": 1e9 + i + 0.5, "ok": True} for i in range(20)]
    timeline.plot_timeline(one, tmp_path / "one")
    group = [{"worker": f"rank0-cpu{i % 2}", "start": 1e9 + i // 4, "end": 1e9 + i // 4 + 0.5, "ok": True}
             for i in range(8)]
    timeline.plot_timeline(group, tmp_path / "group")
    timeline.plot_timeline([{**bar, "worker": "rank0-cpu0"} for bar in group[:4]], tmp_path / "a-group")
    assert titles == ["20 attempts on 1 worker", "8 attempts (4 bars: items run together share one) on 2 workers",
                      "4 attempts (1 bar: items run together share one) on 1 worker"]
