"""The GPU monitor: naming a GPU to NVML, sampling it over time, the usage report and figure.

NVML needs an NVIDIA driver, which this machine lacks; ``tests/fake_nvml/pynvml.py`` stands in for
the ``pynvml`` module (the monitor imports it as it would the real one), with nvidia-ml-py's
signatures, errors and ``str`` UUIDs.
"""
import csv
import importlib.util
import sys
import time
from pathlib import Path

import pytest

from common.devices import Device
from common.observe import gpu_monitor
from common.observe.gpu_monitor import GpuMonitor, Sample, nvml_handle
from common.observe.gpu_usage import write_gpu_usage

FAKE_NVML = Path(__file__).resolve().parent / "fake_nvml" / "pynvml.py"


def load_fake_nvml(monkeypatch, **env: str):
    """The fake pynvml, loaded afresh under ``env`` (FAKE_NVML_GPUS, FAKE_NVML_DENIED, ...), as pynvml."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_NVML)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def nvml_of_two_gpus(monkeypatch):
    """The faithful stand-in for pynvml (its errors, ``str`` UUIDs), with two GPUs, initialised."""
    monkeypatch.setenv("FAKE_NVML_GPUS", "2")
    spec = importlib.util.spec_from_file_location("fake_pynvml", FAKE_NVML)
    nvml = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nvml)
    nvml.nvmlInit()
    return nvml


@pytest.mark.parametrize("ident, handle", [("1", "handle-1"), ("GPU-00000001-fa4e-4000-8000-000000000001", "handle-1"),
                                           ("GPU-00000000", "handle-0"), ("GPU-00000001-fa4e", "handle-1")])
def test_a_gpu_is_found_by_index_uuid_or_the_uuid_prefix_cuda_accepts(monkeypatch, ident, handle):
    assert nvml_handle(nvml_of_two_gpus(monkeypatch), ident) == handle


def test_an_unknown_uuid_or_index_is_not_matched(monkeypatch):
    nvml = nvml_of_two_gpus(monkeypatch)
    with pytest.raises(LookupError):
        nvml_handle(nvml, "GPU-ffff")
    with pytest.raises(LookupError):  # CUDA's index past the GPUs this process may open
        nvml_handle(nvml, "2")


def test_gpus_a_device_cgroup_denies_are_not_counted_and_cuda_indexes_skip_them(monkeypatch):
    """Under Slurm's ConstrainDevices NVML counts all the node's GPUs but refuses the handles of
    those not the job's (NO_PERMISSION), while CUDA lists only the job's, from 0: the monitor took
    CUDA's GPU 0 as NVML's GPU 0 (another job's, or refused: the GPU went unmonitored), and a run
    without CUDA_VISIBLE_DEVICES pinned workers to GPUs they could not open."""
    from common import devices

    nvml = load_fake_nvml(monkeypatch, FAKE_NVML_GPUS="4", FAKE_NVML_DENIED="0,2")
    assert devices.node_gpus() == ["0", "1"]  # the job's two, as CUDA numbers them
    nvml.nvmlInit()
    try:
        assert [nvml_handle(nvml, ident) for ident in ("0", "1")] == ["handle-1", "handle-3"]
        assert nvml_handle(nvml, nvml.fake_uuid(3)[:12]) == "handle-3"  # a prefix: the others' are not looked at
        with pytest.raises(LookupError):
            nvml_handle(nvml, "2")
        with pytest.raises(nvml.NVMLError_NoPermission):  # as a real driver: another job's GPU, by UUID
            nvml.nvmlDeviceGetHandleByUUID(nvml.fake_uuid(2))
        with pytest.raises(LookupError):
            nvml_handle(nvml, nvml.fake_uuid(2))
    finally:
        nvml.nvmlShutdown()
    monitor = GpuMonitor([Device("cuda", 0, "0"), Device("cuda", 1, "1")], interval=0.02)
    monitor.start()
    time.sleep(0.2)
    monitor.stop()
    assert {name: series["physical"] for name, series in monitor.series().items()} == {"gpu0": "0", "gpu1": "1"}
    assert monitor.series()["gpu0"]["samples"] and monitor.series()["gpu1"]["samples"]


def test_a_gpu_nvml_fails_on_keeps_its_place_and_the_others_are_still_found(monkeypatch):
    """A GPU lost (NVML_ERROR_GPU_IS_LOST), another job's or not: the GPUs after it keep their numbers,
    and it alone goes unmonitored (an error there left every GPU of the node unmonitored)."""
    from common import devices

    nvml = load_fake_nvml(monkeypatch, FAKE_NVML_GPUS="4", FAKE_NVML_LOST="1")
    assert devices.node_gpus() == ["0", "1", "2", "3"]
    nvml.nvmlInit()
    try:
        assert [nvml_handle(nvml, ident) for ident in ("0", "2", "3")] == ["handle-0", "handle-2", "handle-3"]
        with pytest.raises(LookupError):
            nvml_handle(nvml, "1")
        assert nvml_handle(nvml, nvml.fake_uuid(3)[:12]) == "handle-3"
    finally:
        nvml.nvmlShutdown()


def sample(util, memory, temperature=None, power=None, at=0.0):
    return Sample(at, util, memory, 40960.0, temperature, power)


def usage_report(samples):
    """What the monitor reports of one GPU that gave ``samples`` (its own accumulation, as its
    sampling thread feeds it)."""
    monitor = GpuMonitor([])
    for one in samples:
        monitor._add("gpu0", one)
    return monitor.report()["gpu0"]


def test_a_measure_nvml_cannot_give_is_reported_as_none_and_the_others_still_are():
    # a MIG slice: no utilisation, memory known
    report = usage_report([sample(None, 100.0), sample(None, 300.0)])
    assert report == {"samples": 2, "util_mean_percent": None, "util_peak_percent": None,
                      "memory_mean_mib": 200.0, "memory_peak_mib": 300.0, "temperature_mean_c": None,
                      "temperature_peak_c": None, "power_mean_w": None, "power_peak_w": None}
    report = usage_report([sample(50.0, 10.0, 60.0, 250.0), sample(None, 30.0), sample(70.0, None, 70.0, 150.0)])
    assert report["util_mean_percent"] == 60.0 and report["util_peak_percent"] == 70.0
    assert report["memory_mean_mib"] == 20.0 and report["memory_peak_mib"] == 30.0
    assert report["temperature_mean_c"] == 65.0 and report["power_peak_w"] == 250.0


@pytest.fixture
def fake_nvml(monkeypatch):
    return load_fake_nvml(monkeypatch)


def test_samples_over_time_with_a_fake_nvml(fake_nvml):
    """Two GPUs, the second a MIG-like slice without utilisation, temperature or power."""
    monitor = GpuMonitor([Device("cuda", 0, "0"), Device("cuda", 1, "1"), Device("cpu", 0)], interval=0.02)
    monitor.start()
    time.sleep(0.5)
    recent = {view["gpu"]: view for view in monitor.recent()}
    report = monitor.stop()
    series = monitor.series()  # after stop, as the engine reads it: no sample can land in between
    assert set(report) == set(series) == set(recent) == {"gpu0", "gpu1"}
    full, mig = report["gpu0"], report["gpu1"]
    assert full["samples"] >= 5 and full["samples"] == len(series["gpu0"]["samples"])
    assert 25 <= full["util_mean_percent"] <= full["util_peak_percent"] <= 95
    assert 6000 <= full["memory_mean_mib"] <= full["memory_peak_mib"] <= 10000
    assert 45 <= full["temperature_peak_c"] <= 65 and 120 <= full["power_peak_w"] <= 280
    assert mig["util_mean_percent"] is None and mig["power_mean_w"] is None and mig["memory_peak_mib"] > 0
    times = [s[0] for s in series["gpu0"]["samples"]]
    assert times == sorted(times) and times[-1] - times[0] >= 0.2
    assert recent["gpu0"]["memory_total_mib"] == 40960 and recent["gpu0"]["util_recent_percent"] is not None
    assert recent["gpu1"]["util_percent"] is None and recent["gpu1"]["physical"] == "1"


def test_gpus_named_by_uuid_or_its_prefix_are_sampled_through_nvml_as_the_bindings_answer(fake_nvml):
    """CUDA_VISIBLE_DEVICES may name GPUs by UUID: NVML finds the whole UUID itself, and the start
    of one (which CUDA accepts) among the UUIDs it gives (``str``, as nvidia-ml-py decodes them)."""
    whole, prefix = fake_nvml.fake_uuid(3), fake_nvml.fake_uuid(5)[:12]
    monitor = GpuMonitor([Device("cuda", 0, whole), Device("cuda", 1, prefix)], interval=0.02)
    monitor.start()
    time.sleep(0.2)
    report = monitor.stop()
    assert set(report) == {"gpu0", "gpu1"} and all(r["samples"] >= 2 for r in report.values())
    assert monitor.series()["gpu1"]["physical"] == prefix
    fake_nvml.nvmlInit()
    try:
        assert nvml_handle(fake_nvml, whole) == "handle-3" and nvml_handle(fake_nvml, prefix) == "handle-5"
        with pytest.raises(LookupError):
            nvml_handle(fake_nvml, "GPU-ffffffff")
    finally:
        fake_nvml.nvmlShutdown()
    with pytest.raises(fake_nvml.NVMLError_Uninitialized):  # shut down: NVML answers nothing more
        fake_nvml.nvmlDeviceGetCount()


def _symbol_not_found(nvml):
    """A binding whose C symbol the driver lacks, as nvidia-ml-py's answers it."""
    def call(*args, **kwargs):
        raise nvml.NVMLError(nvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    return call


@pytest.mark.parametrize("where", ["driver dropped the old call", "bindings dropped the old call",
                                   "bindings older than V (12.535)", "driver older than V",
                                   "driver takes another V structure"])
def test_the_temperature_is_read_whichever_of_the_two_nvml_calls_this_driver_and_bindings_have(
        fake_nvml, monkeypatch, where):
    """nvidia-ml-py 13 deprecates nvmlDeviceGetTemperature for nvmlDeviceGetTemperatureV ("will be
    removed in CUDA 14.0"); its bindings stay while a newer driver drops the symbol (the call then
    raises NVMLError_FunctionNotFound), and nvidia-ml-py 12.535 or an older driver has no V: the
    monitor reports the temperature in each case."""
    if where == "driver dropped the old call":
        monkeypatch.setattr(fake_nvml, "nvmlDeviceGetTemperature", _symbol_not_found(fake_nvml))
    elif where == "bindings dropped the old call":
        monkeypatch.delattr(fake_nvml, "nvmlDeviceGetTemperature")
    elif where == "bindings older than V (12.535)":
        monkeypatch.delattr(fake_nvml, "nvmlDeviceGetTemperatureV")
    elif where == "driver older than V":
        monkeypatch.setattr(fake_nvml, "nvmlDeviceGetTemperatureV", _symbol_not_found(fake_nvml))
    else:
        def mismatch(*args, **kwargs):
            raise fake_nvml.NVMLError(fake_nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        monkeypatch.setattr(fake_nvml, "nvmlDeviceGetTemperatureV", mismatch)
    monitor = GpuMonitor([Device("cuda", 0, "0")], interval=0.02)
    monitor.start()
    time.sleep(0.2)
    report = monitor.stop()
    assert 45 <= report["gpu0"]["temperature_mean_c"] <= 65


def test_a_long_run_keeps_a_bounded_series_with_exact_mean_and_peak(fake_nvml, monkeypatch):
    monkeypatch.setattr(gpu_monitor, "MAX_POINTS", 100)
    monitor = GpuMonitor([Device("cuda", 0, "0")])
    for second in range(1000):
        monitor._add("gpu0", sample(float(second % 100), 1000.0 + second, at=float(second)))
    points = monitor.series()["gpu0"]["samples"]
    assert 50 <= len(points) <= 100, len(points)
    assert points[0][0] < 10 and points[-1][0] > 990  # still the whole run
    assert sum(p[1] for p in points) / len(points) == pytest.approx(49.5, abs=1.0)
    totals = gpu_monitor._report(monitor._totals["gpu0"])
    assert totals["samples"] == 1000 and totals["util_peak_percent"] == 99.0 and totals["memory_peak_mib"] == 1999.0


def test_gpu_usage_figure_and_csv_from_every_rank(tmp_path):
    reports = [{"rank": rank, "host": f"node{rank}", "gpu_series": {
        f"gpu{index}": {"physical": str(index), "samples": [tuple(sample(10.0 * t + index, 500.0 + t, 50.0, 200.0,
                                                                           at=1000.0 + t)) for t in range(20)]}
        for index in range(2)}} for rank in range(2)]
    reports.append({"rank": 2, "host": "node2", "gpu_series": {}})  # a CPU-only rank
    assert write_gpu_usage(reports, tmp_path) == "gpu_usage.png"
    for suffix, magic in ((".png", b"\x89PNG"), (".svg", b"<?xml"), (".pdf", b"%PDF")):
        assert (tmp_path / f"gpu_usage{suffix}").read_bytes().startswith(magic), suffix
    rows = list(csv.DictReader((tmp_path / "gpu_usage.csv").open()))
    assert len(rows) == 2 * 2 * 20
    assert {row["gpu"] for row in rows} == {"rank0-gpu0", "rank0-gpu1", "rank1-gpu0", "rank1-gpu1"}
    assert {row["host"] for row in rows} == {"node0", "node1"}
    first = next(row for row in rows if row["gpu"] == "rank1-gpu1")
    assert float(first["util_percent"]) == 1.0 and float(first["power_w"]) == 200.0
    assert write_gpu_usage([{"rank": 0, "host": "a", "gpu_series": {}}], tmp_path / "none") is None
