"""Per-GPU utilisation and memory, sampled with NVML in a background thread of each rank."""
from __future__ import annotations

import threading
from typing import Dict, List, Optional

from .devices import Device


class GpuMonitor:
    """Samples every ``interval`` s; ``stop()`` returns mean and peak per GPU (empty without NVML)."""

    def __init__(self, devices: List[Device], interval: float = 1.0):
        self.devices = [d for d in devices if d.is_gpu]
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
            # a number is an NVML index: workers see GPUs in PCI order too (worker_pool sets
            # CUDA_DEVICE_ORDER=PCI_BUS_ID); a GPU NVML cannot reach is left out, not the others
            ident = device.physical or str(device.index)
            try:
                if ident.isdigit():
                    handles[str(device)] = pynvml.nvmlDeviceGetHandleByIndex(int(ident))
                else:
                    handles[str(device)] = pynvml.nvmlDeviceGetHandleByUUID(ident)
            except Exception:
                continue
        if not handles:
            pynvml.nvmlShutdown()
            return
        self._nvml, self._handles = pynvml, handles
        self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nvml = self._nvml
        while not self._stop.wait(self.interval):
            for name, handle in self._handles.items():
                try:
                    util = nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                    memory = nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
                except Exception:
                    continue
                self.samples.setdefault(name, []).append((util, memory))

    def stop(self) -> Dict[str, Dict[str, float]]:
        if self._thread is None:
            return {}
        self._stop.set()
        self._thread.join(self.interval + 1)
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass
        report = {}
        for name, samples in self.samples.items():
            utils = [s[0] for s in samples]
            memory = [s[1] for s in samples]
            report[name] = {"samples": len(samples), "util_mean_percent": sum(utils) / len(utils),
                            "util_peak_percent": max(utils), "memory_mean_mib": sum(memory) / len(memory),
                            "memory_peak_mib": max(memory)}
        return report
