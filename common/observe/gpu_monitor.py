"""Per-GPU utilisation, memory, temperature and power, sampled with NVML in a background thread of
each rank: exact mean and peak for the summary, a bounded series for gpu_usage.png/.csv, and the
last minute for the status file."""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Deque, Dict, List, NamedTuple, Optional

from common.devices import Device, nvml_usable_handles

#: a series longer than this is halved (neighbours averaged): a week at 1 s stays a few hundred kB
MAX_POINTS = 4000
#: the status file shows each GPU's last sample and its mean over this many seconds
RECENT_SECONDS = 60.0


class Sample(NamedTuple):
    """One reading of one GPU; a measure NVML does not give (a MIG slice's utilisation) is None."""

    time: float
    util_percent: Optional[float]
    memory_mib: Optional[float]
    memory_total_mib: Optional[float]
    temperature_c: Optional[float]
    power_w: Optional[float]


MEASURES = ("util_percent", "memory_mib", "temperature_c", "power_w")
#: summary key prefix and unit of each measure (util_mean_percent, memory_peak_mib, ...)
_REPORT_NAMES = {"util_percent": ("util", "percent"), "memory_mib": ("memory", "mib"),
                 "temperature_c": ("temperature", "c"), "power_w": ("power", "w")}


def _mean_sample(samples: List[Sample]) -> Sample:
    """The average of neighbouring samples (each measure over those that have it)."""
    def mean(values: List[Optional[float]]) -> Optional[float]:
        known = [v for v in values if v is not None]
        return sum(known) / len(known) if known else None

    return Sample(*(mean([s[i] for s in samples]) for i in range(len(Sample._fields))))


class _Series:
    """Samples kept at a resolution that halves whenever ``MAX_POINTS`` are reached."""

    def __init__(self) -> None:
        self.points: List[Sample] = []
        self.stride = 1
        self._pending: List[Sample] = []

    def add(self, sample: Sample) -> None:
        self._pending.append(sample)
        if len(self._pending) < self.stride:
            return
        self.points.append(_mean_sample(self._pending) if self.stride > 1 else sample)
        self._pending = []
        if len(self.points) >= MAX_POINTS:
            self.points = [_mean_sample(self.points[i:i + 2]) for i in range(0, len(self.points), 2)]
            self.stride *= 2

    def all(self) -> List[Sample]:
        return self.points + ([_mean_sample(self._pending)] if self._pending else [])


class GpuMonitor:
    """Samples every ``interval`` s; ``stop()`` returns mean and peak per GPU (empty without NVML)."""

    def __init__(self, devices: List[Device], interval: float = 1.0):
        # one entry per GPU, however many workers share it (--workers-per-gpu)
        self.devices = list({d.gpu_name: d for d in devices if d.is_gpu}.values())
        self.interval = interval
        self._series: Dict[str, _Series] = {}
        self._recent: Dict[str, Deque[Sample]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._nvml = None
        self._handles: Dict[str, Any] = {}
        self._physical: Dict[str, str] = {}
        self._totals: Dict[str, Dict[str, list]] = {}  # name -> measure -> [sum, count, peak]

    def start(self) -> None:
        if not self.devices:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:
            return  # no NVML: nothing to sample, the run goes on
        handles = {}
        try:  # the node's GPUs listed once for all the devices (a handle each: one NVML call per GPU)
            usable: Optional[List[Any]] = nvml_usable_handles(pynvml)
        except Exception:
            usable = None  # each lookup tries again, and a GPU it fails on is left out
        for device in self.devices:
            try:  # a GPU NVML cannot reach is left out, not the others
                handles[device.gpu_name] = nvml_handle(pynvml, device.physical or str(device.index), usable)
                self._physical[device.gpu_name] = device.physical or str(device.index)
            except Exception:
                continue
        if not handles:
            pynvml.nvmlShutdown()
            return
        self._nvml, self._handles = pynvml, handles
        self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            now = time.time()
            for name, handle in self._handles.items():
                self._add(name, self._sample(handle, now))

    def _add(self, name: str, sample: Sample) -> None:
        with self._lock:
            self._series.setdefault(name, _Series()).add(sample)
            recent = self._recent.setdefault(name, deque(maxlen=max(2, int(RECENT_SECONDS / self.interval) + 1)))
            recent.append(sample)
            totals = self._totals.setdefault(name, {"samples": [0], **{m: [0.0, 0, None] for m in MEASURES}})
            totals["samples"][0] += 1
            for measure in MEASURES:
                value = getattr(sample, measure)
                if value is not None:
                    entry = totals[measure]
                    entry[0] += value
                    entry[1] += 1
                    entry[2] = value if entry[2] is None else max(entry[2], value)

    def _sample(self, handle: Any, now: float) -> Sample:
        """Each measure NVML gives for this GPU; one it refuses is None, not an error."""
        nvml = self._nvml

        def read(call: Any) -> Optional[float]:
            try:
                return float(call())
            except Exception:
                return None

        memory = None
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception:
            pass
        return Sample(now,
                      read(lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                      None if memory is None else memory.used / 2**20,
                      None if memory is None else memory.total / 2**20,
                      read(lambda: _temperature(nvml, handle)),
                      read(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0))  # milliwatts

    def recent(self) -> List[Dict[str, Any]]:
        """Each GPU's last sample and its means over the last ``RECENT_SECONDS`` (status file)."""
        with self._lock:
            windows = {name: list(samples) for name, samples in self._recent.items()}
        views = []
        for name, samples in sorted(windows.items()):
            mean = _mean_sample(samples)
            views.append({"gpu": name, "physical": self._physical.get(name), **samples[-1]._asdict(),
                          "util_recent_percent": mean.util_percent, "memory_recent_mib": mean.memory_mib})
        return views

    def series(self) -> Dict[str, Dict[str, Any]]:
        """name -> {"physical", "samples": [Sample as a tuple, ...]}: what rank 0 plots."""
        with self._lock:
            return {name: {"physical": self._physical.get(name), "samples": [tuple(s) for s in series.all()]}
                    for name, series in self._series.items()}

    def stop(self) -> Dict[str, Dict[str, float]]:
        if self._thread is None:
            return {}
        self._stop.set()
        self._thread.join(self.interval + 1)
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass
        return self.report()

    def report(self) -> Dict[str, Dict[str, Optional[float]]]:
        """Each GPU's mean and peak of each measure, over the samples that have it (None where none has)."""
        with self._lock:
            return {name: _report(totals) for name, totals in self._totals.items()}


def _report(totals: Dict[str, list]) -> Dict[str, Optional[float]]:
    report: Dict[str, Optional[float]] = {"samples": totals["samples"][0]}
    for measure in MEASURES:
        total, count, peak = totals[measure]
        prefix, unit = _REPORT_NAMES[measure]
        report[f"{prefix}_mean_{unit}"] = total / count if count else None
        report[f"{prefix}_peak_{unit}"] = peak
    return report


def _temperature(nvml: Any, handle: Any) -> Any:
    """The GPU's temperature through ``nvmlDeviceGetTemperatureV``, the call nvidia-ml-py 13 says
    will be the only one from CUDA 14 (the old one's bindings may stay while a driver drops the
    symbol, and then only raise). Through the old ``nvmlDeviceGetTemperature`` where the bindings
    are older than V (nvidia-ml-py 12.535 has none), or V answers with an error (a driver without
    its symbol, or one that takes another version of its structure): V's error where both fail."""
    sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
    successor = getattr(nvml, "nvmlDeviceGetTemperatureV", None)
    if successor is None:
        return nvml.nvmlDeviceGetTemperature(handle, sensor)
    try:
        return successor(handle, sensor)
    except nvml.NVMLError as error:
        old = getattr(nvml, "nvmlDeviceGetTemperature", None)
        if old is None:
            raise
        try:
            return old(handle, sensor)
        except nvml.NVMLError:
            raise error from None


def nvml_handle(nvml: Any, ident: str, usable: Optional[List[Any]] = None) -> Any:
    """The NVML handle of a GPU named as CUDA_VISIBLE_DEVICES names it: an index (CUDA's, which in
    PCI order (worker_pool sets CUDA_DEVICE_ORDER=PCI_BUS_ID) counts only the GPUs this job may
    open: NVML's index is the node's, see :func:`common.devices.nvml_usable_handles`), a UUID, or
    the start of one (CUDA accepts ``GPU-8932f937``; NVML wants the whole UUID). ``usable``:
    ``nvml_usable_handles(nvml)`` where the caller has it (else listed here)."""
    if ident.isdigit():
        usable = nvml_usable_handles(nvml) if usable is None else usable
        if int(ident) >= len(usable) or usable[int(ident)] is None:
            raise LookupError(f"no GPU {ident} that NVML can reach (it lists {len(usable)} for this process)")
        return usable[int(ident)]
    try:
        return nvml.nvmlDeviceGetHandleByUUID(ident)
    except nvml.NVMLError:  # not a whole UUID (NVML_ERROR_NOT_FOUND): try it as a prefix
        pass
    for handle in filter(None, nvml_usable_handles(nvml) if usable is None else usable):  # not another job's GPU
        uuid = nvml.nvmlDeviceGetUUID(handle)
        if (uuid.decode() if isinstance(uuid, bytes) else uuid).startswith(ident):
            return handle
    raise LookupError(f"no GPU with UUID {ident}")
