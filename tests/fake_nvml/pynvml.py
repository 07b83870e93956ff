"""A stand-in for NVML (``pynvml``, from nvidia-ml-py) on a machine without an NVIDIA driver.

Put this folder first on PYTHONPATH and the engine's GPU monitor samples FAKE_NVML_GPUS (default 8)
GPUs whose utilisation, memory, temperature and power move with time, as a driver would report
them. GPU 1 is a MIG-like slice: NVML refuses its utilisation, power and temperature.
"""
import math
import os
import time

NVML_TEMPERATURE_GPU = 0
_COUNT = int(os.environ.get("FAKE_NVML_GPUS", "8"))
_started = False


class NVMLError(Exception):
    pass


class _Utilization:
    def __init__(self, gpu):
        self.gpu, self.memory = gpu, gpu // 2


class _Memory:
    def __init__(self, used, total):
        self.used, self.total, self.free = used, total, total - used


def _index(handle):
    if not _started:
        raise NVMLError("NVML_ERROR_UNINITIALIZED")
    return int(handle.split("-")[1])


def nvmlInit():
    global _started
    _started = True


def nvmlShutdown():
    global _started
    _started = False


def nvmlDeviceGetCount():
    return _COUNT


def nvmlDeviceGetHandleByIndex(index):
    if not 0 <= index < _COUNT:
        raise NVMLError("NVML_ERROR_INVALID_ARGUMENT")
    return f"handle-{index}"


def nvmlDeviceGetHandleByUUID(uuid):
    raise NVMLError("NVML_ERROR_NOT_FOUND")


def nvmlDeviceGetUUID(handle):
    return f"GPU-0000000{_index(handle)}-fake".encode()


def _phase(index):
    return math.sin(time.time() / 2.0 + index)


def nvmlDeviceGetUtilizationRates(handle):
    index = _index(handle)
    if index == 1:
        raise NVMLError("NVML_ERROR_NOT_SUPPORTED")
    return _Utilization(int(60 + 35 * _phase(index)))


def nvmlDeviceGetMemoryInfo(handle, version=None):  # noqa: ARG001 (nvidia-ml-py's signature)
    index = _index(handle)
    return _Memory(int((8000 + 2000 * _phase(index)) * 2**20), 40960 * 2**20)


def nvmlDeviceGetTemperature(handle, sensor):
    index = _index(handle)
    if index == 1:
        raise NVMLError("NVML_ERROR_NOT_SUPPORTED")
    return int(55 + 10 * _phase(index))


def nvmlDeviceGetPowerUsage(handle):
    index = _index(handle)
    if index == 1:
        raise NVMLError("NVML_ERROR_NOT_SUPPORTED")
    return int((200 + 80 * _phase(index)) * 1000)  # milliwatts
