"""The clock the engine's loops read and sleep on, given to them in their constructors.

The real one is the :mod:`time` module itself (``SYSTEM_CLOCK``); the tests and benchmarks give
a simulated one (``common.testing.inprocess.fake_time``), so heartbeat timeouts and item durations can be
simulated seconds without patching any module.
"""
from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """What the engine uses of :mod:`time`."""

    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


#: the real clock: the time module has exactly this interface
SYSTEM_CLOCK: Clock = time
