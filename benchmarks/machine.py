"""What a benchmark ran on, for its report."""
from __future__ import annotations

import platform


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as info:
            found = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), None)
    except OSError:
        found = None
    return found or platform.processor() or platform.machine() or "cpu"
