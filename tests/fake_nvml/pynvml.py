"""A stand-in for NVML (``pynvml``, from nvidia-ml-py) on a machine without an NVIDIA driver.

Put this folder first on PYTHONPATH and the engine's GPU monitor samples FAKE_NVML_GPUS (default 8)
GPUs whose utilisation, memory, temperature and power move with time, as a driver would report
them. GPU 1 is a MIG-like slice: NVML refuses its utilisation, power and temperature. The GPUs
FAKE_NVML_DENIED lists (NVML indexes, "0,2") are counted but refused with NO_PERMISSION, as a
device cgroup makes NVML answer for GPUs that are not the job's; those FAKE_NVML_LOST lists, with
GPU_IS_LOST.

It behaves as nvidia-ml-py 13.615.71 does where the project can tell: the signatures (checked
against the recorded ones and the installed module by tests/test_api_snapshot.py); ``NVMLError``
made from an error code, as the subclass for that code (``NVMLError_NotFound``, ...), with
``.value`` and the library's text; every call but ``nvmlInit`` refused before ``nvmlInit`` and after
the last ``nvmlShutdown`` (reference counted); UUIDs as ``str`` (the bindings decode them), and
``nvmlDeviceGetHandleByUUID`` finding a GPU by its whole UUID, given as ``str`` or ``bytes``.
"""
import math
import os
import time

NVML_TEMPERATURE_GPU = 0
nvmlTemperature_v1 = 0x100000C

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25

_COUNT = int(os.environ.get("FAKE_NVML_GPUS", "8"))
# GPUs of the node a device cgroup denies this process (Slurm's ConstrainDevices): NVML counts them,
# and refuses their handles with NO_PERMISSION
_DENIED = {int(index) for index in os.environ.get("FAKE_NVML_DENIED", "").split(",") if index.strip()}
# GPUs that fell off the bus: NVML counts them, and answers GPU_IS_LOST
_LOST = {int(index) for index in os.environ.get("FAKE_NVML_LOST", "").split(",") if index.strip()}
_state = {"initialised": 0}  # nvmlInit's reference count, as the bindings keep it


class NVMLError(Exception):
    """nvidia-ml-py's: made from an error code, as that code's subclass."""

    _valClassMapping = {}
    _errcode_to_string = {NVML_ERROR_UNINITIALIZED: "Uninitialized", NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
                          NVML_ERROR_NOT_SUPPORTED: "Not Supported", NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
                          NVML_ERROR_NOT_FOUND: "Not Found", NVML_ERROR_GPU_IS_LOST: "GPU is lost",
                          NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found"}

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        error = Exception.__new__(typ)
        error.value = value
        return error

    def __str__(self):  # a code the bindings do not list: the driver's text, which there is not here
        return NVMLError._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other):
        return self.value == other.value


def _error_class(name, value):
    def new(typ, *args):
        return NVMLError.__new__(typ, value)

    subclass = type(name, (NVMLError,), {"__new__": new})
    NVMLError._valClassMapping[value] = subclass
    return subclass


NVMLError_Uninitialized = _error_class("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _error_class("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _error_class("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _error_class("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_NotFound = _error_class("NVMLError_NotFound", NVML_ERROR_NOT_FOUND)
NVMLError_FunctionNotFound = _error_class("NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND)
NVMLError_GpuIsLost = _error_class("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_ArgumentVersionMismatch = _error_class("NVMLError_ArgumentVersionMismatch",
                                                 NVML_ERROR_ARGUMENT_VERSION_MISMATCH)


class _Utilization:
    def __init__(self, gpu):
        self.gpu, self.memory = gpu, gpu // 2


class _Memory:
    def __init__(self, used, total):
        self.used, self.total, self.free = used, total, total - used


def fake_uuid(index):
    """GPU ``index``'s UUID, in the driver's form."""
    return f"GPU-{index:08x}-fa4e-4000-8000-{index:012x}"


def _check_initialised():
    if not _state["initialised"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)


def _index(handle):
    _check_initialised()
    return int(handle.split("-")[1])


def nvmlInit():
    _state["initialised"] += 1


def nvmlShutdown():
    _check_initialised()
    _state["initialised"] -= 1


def nvmlDeviceGetCount():
    _check_initialised()
    return _COUNT


def nvmlDeviceGetHandleByIndex(index):
    _check_initialised()
    if not 0 <= index < _COUNT:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    if index in _DENIED:
        raise NVMLError(NVML_ERROR_NO_PERMISSION)
    if index in _LOST:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return f"handle-{index}"


def nvmlDeviceGetHandleByUUID(uuid):
    _check_initialised()
    text = uuid.decode() if isinstance(uuid, bytes) else uuid
    for index in range(_COUNT):
        if fake_uuid(index) == text:  # the whole UUID: NVML takes no prefix
            if index in _DENIED:
                raise NVMLError(NVML_ERROR_NO_PERMISSION)
            return f"handle-{index}"
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetUUID(handle):
    return fake_uuid(_index(handle))


def _phase(index):
    return math.sin(time.time() / 2.0 + index)


def nvmlDeviceGetUtilizationRates(handle):
    index = _index(handle)
    if index == 1:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return _Utilization(int(60 + 35 * _phase(index)))


def nvmlDeviceGetMemoryInfo(handle, version=None):  # noqa: ARG001 (nvidia-ml-py's signature)
    index = _index(handle)
    return _Memory(int((8000 + 2000 * _phase(index)) * 2**20), 40960 * 2**20)


def _temperature(handle):
    index = _index(handle)
    if index == 1:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int(55 + 10 * _phase(index))


def nvmlDeviceGetTemperatureV(handle, sensor, version=nvmlTemperature_v1):
    if version != nvmlTemperature_v1:
        raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    return _temperature(handle)


def nvmlDeviceGetTemperature(handle, sensor):  # deprecated in 13.x for nvmlDeviceGetTemperatureV
    return _temperature(handle)


def nvmlDeviceGetPowerUsage(handle):
    index = _index(handle)
    if index == 1:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return int((200 + 80 * _phase(index)) * 1000)  # milliwatts
