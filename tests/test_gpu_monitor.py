"""The GPU monitor's pure parts: naming a GPU to NVML, and the usage report.

NVML needs an NVIDIA driver, which this machine lacks; ``FakeNvml`` answers the few NVML calls
``nvml_handle`` makes, as the driver would for two GPUs.
"""
import pytest

from common.gpu_monitor import nvml_handle, usage_report


class FakeNvml:
    UUIDS = ["GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "GPU-1c2d3e4f-0000-1111-2222-333344445555"]

    def nvmlDeviceGetCount(self):
        return len(self.UUIDS)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self.UUIDS):
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return f"handle-{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.UUIDS:  # NVML wants the whole UUID
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return f"handle-{self.UUIDS.index(uuid)}"

    def nvmlDeviceGetUUID(self, handle):
        return self.UUIDS[int(handle.split("-")[1])].encode()  # older bindings give bytes


@pytest.mark.parametrize("ident, handle", [("1", "handle-1"), (FakeNvml.UUIDS[1], "handle-1"),
                                           ("GPU-8932f937", "handle-0"), ("GPU-1c2d", "handle-1")])
def test_a_gpu_is_found_by_index_uuid_or_the_uuid_prefix_cuda_accepts(ident, handle):
    assert nvml_handle(FakeNvml(), ident) == handle


def test_an_unknown_uuid_is_not_matched():
    with pytest.raises(LookupError):
        nvml_handle(FakeNvml(), "GPU-ffff")


def test_a_measure_nvml_cannot_give_is_reported_as_none_and_the_others_still_are():
    # a MIG slice: no utilisation, memory known
    report = usage_report([(None, 100.0), (None, 300.0)])
    assert report == {"samples": 2, "util_mean_percent": None, "util_peak_percent": None,
                      "memory_mean_mib": 200.0, "memory_peak_mib": 300.0}
    report = usage_report([(50.0, 10.0), (None, 30.0), (70.0, None)])
    assert report["util_mean_percent"] == 60.0 and report["util_peak_percent"] == 70.0
    assert report["memory_mean_mib"] == 20.0 and report["memory_peak_mib"] == 30.0
