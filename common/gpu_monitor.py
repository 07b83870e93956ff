"""Per-GPU utilisation and memory, sampled with NVML in a background thread of each rank."""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

from .devices import Device


class GpuMonitor:
    """Samples every ``interval`` s; ``stop()`` returns mean and peak per GPU (empty without NVML)."""

    def __init__(self, devices: List[Device], interval: float = 1.0):
        # one entry per GPU, however many workers share it (--workers-per-gpu)
        self.devices = list({d.gpu_name: d for d in devices if d.is_gpu}.values())
        self.interval = interval
        self.samples: Dict[str, List[tuple]] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._nvml = None

    def start(self) -> None:
        if not self.devices:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:
            return  # no NVML: nothing to sample, the run goes on
        handles = {}
        for device in self.devices:
            try:  # a GPU NVML cannot reach is left out, not the others
                handles[device.gpu_name] = nvml_handle(pynvml, device.physical or str(device.index))
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
            for name, handle in self._handles.items():
                self.samples.setdefault(name, []).append(self._sample(handle))

    def _sample(self, handle: Any) -> Tuple[Optional[float], Optional[float]]:
        """(utilisation %, memory used MiB), each None where NVML does not give it: a MIG slice
        has no utilisation, but its memory is still worth reporting."""
        nvml, util, memory = self._nvml, None, None
        try:
            util = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:
            pass
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
        except Exception:
            pass
        return util, memory

    def stop(self) -> Dict[str, Dict[str, float]]:
        if self._thread is None:
            return {}
        self._stop.set()
        self._thread.join(self.interval + 1)
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass
        return {name: usage_report(samples) for name, samples in self.samples.items()}


def usage_report(samples: List[Tuple[Optional[float], Optional[float]]]) -> Dict[str, Optional[float]]:
    """Mean and peak of each measure over the samples that have it (None where none has)."""
    report: Dict[str, Optional[float]] = {"samples": len(samples)}
    for position, measure, unit in ((0, "util", "percent"), (1, "memory", "mib")):
        values = [sample[position] for sample in samples if sample[position] is not None]
        report[f"{measure}_mean_{unit}"] = sum(values) / len(values) if values else None
        report[f"{measure}_peak_{unit}"] = max(values) if values else None
    return report


def nvml_handle(nvml: Any, ident: str) -> Any:
    """The NVML handle of a GPU named as CUDA_VISIBLE_DEVICES names it: an index (NVML's PCI order,
    which workers see too: worker_pool sets CUDA_DEVICE_ORDER=PCI_BUS_ID), a UUID, or the start of
    one (CUDA accepts ``GPU-8932f937``; NVML wants the whole UUID)."""
    if ident.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(ident))
    try:
        return nvml.nvmlDeviceGetHandleByUUID(ident)
    except Exception:
        pass
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        if (uuid.decode() if isinstance(uuid, bytes) else uuid).startswith(ident):
            return handle
    raise LookupError(f"no GPU with UUID {ident}")
