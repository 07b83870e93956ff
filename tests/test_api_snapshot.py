"""The fakes and the project's GPU calls against benchmarks/api_snapshot.json, the signatures of the
pinned libraries (cuML 25.06 and 26.02, CuPy 13.6 and 14.2, torch.cuda, nvidia-ml-py) as
``python -m benchmarks.api_snapshot`` read them: a pin that changes a signature the project uses
fails here, without a GPU, once the snapshot is rewritten."""
from __future__ import annotations

import functools
import importlib.util
import inspect
import json

import numpy as np
import pytest

from benchmarks.api_snapshot import SNAPSHOT, USED, WHERE_PRESENT, plain
from helpers import REPO

FAKE_GPU = REPO / "tests" / "fake_gpu"
FAKE_NVML = REPO / "tests" / "fake_nvml" / "pynvml.py"
RECORDED = json.loads(SNAPSHOT.read_text())
#: the project's torch.cuda calls (benchmarks/gpu_check.py, benchmarks/bench_nn.py, mnist_nn/train.py,
#: mnist_nn/app.py), as (args, kwargs)
TORCH_CALLS = {"is_available": ((), {}), "device_count": ((), {}), "get_device_name": ((0,), {}),
               "get_device_properties": ((0,), {}), "set_sync_debug_mode": (("warn",), {}), "empty_cache": ((), {}),
               "mem_get_info": (("cuda:0",), {}), "memory_allocated": (("cuda:0",), {}),
               "memory_reserved": (("cuda:0",), {}), "synchronize": ((), {})}


def signature(text: str) -> inspect.Signature:
    namespace: dict = {}
    exec(f"def f{text}: pass", namespace)  # the snapshot's own text: literals only
    return inspect.signature(namespace["f"])


def recorded(package: str) -> list:
    return sorted(RECORDED[package].items())


def test_the_snapshot_holds_both_pinned_cumls_and_every_name_the_project_uses():
    assert {"25.06.00", "26.02.00"} <= set(RECORDED["cuml"]) and {"13.6.0", "14.2.0"} <= set(RECORDED["cupy"])
    for package, objects in USED.items():
        wanted = {f"{path}.{name}" for path, names in objects.items() for name in names}
        optional = {f"{path}.{name}" for path, names in WHERE_PRESENT.get(package, {}).items() for name in names}
        for version, signatures in recorded(package):
            assert wanted <= set(signatures) <= wanted | optional, (package, version)
    # nvidia-ml-py 13 (the H200's of make gpu-check) has the temperature call the project tries first
    assert "pynvml.nvmlDeviceGetTemperatureV" in RECORDED["nvidia-ml-py"]["13.610.43"]


def test_the_fake_cuml_svc_constructor_is_the_pinned_ones_exactly(fake_gpu_modules):
    from cuml.svm import SVC

    for version, signatures in recorded("cuml"):
        assert plain(inspect.signature(SVC.__init__)) == signatures["cuml.svm.SVC.__init__"], version
    newest = RECORDED["cuml"][max(RECORDED["cuml"])]
    for method in ("fit", "predict", "decision_function"):
        assert plain(inspect.signature(getattr(SVC, method))) == newest[f"cuml.svm.SVC.{method}"], method


def test_every_call_mnist_svm_makes_to_cuml_binds_on_every_pinned_version(fake_gpu_modules, monkeypatch):
    """CumlBackend's own calls (recorded from a fit and a prediction of each --multiclass) against
    each version's signatures; the removed ``multiclass_strategy`` would not bind."""
    import cuml.svm

    from common.data import load_dataset
    from mnist_svm.backends import CumlBackend

    calls, depth = [], [0]

    def recording(name):
        method = getattr(cuml.svm.SVC, name)

        @functools.wraps(method)  # the signature stays the fake's: get_params reads __init__'s
        def record(self, *args, **kwargs):
            if not depth[0]:  # the backend's calls, not the fake's own (scikit-learn's wrappers, predict)
                calls.append((name, args, kwargs))
            depth[0] += 1
            try:
                return method(self, *args, **kwargs)
            finally:
                depth[0] -= 1
        return record

    for name in ("__init__", "fit", "predict", "decision_function"):
        monkeypatch.setattr(cuml.svm.SVC, name, recording(name))
    data = load_dataset("digits", subsample=200, seed=0)
    for multiclass in ("ovr", "ovo"):
        backend = CumlBackend(data, multiclass)
        backend.predict(backend.fit(1.0, 1e-3, np.arange(150)), "train", np.arange(150, 200))
    assert {name for name, _, _ in calls} == {"__init__", "fit", "predict", "decision_function"}
    for _, signatures in recorded("cuml"):
        for name, args, kwargs in calls:
            signature(signatures[f"cuml.svm.SVC.{name}"]).bind("self", *args, **kwargs)
        with pytest.raises(TypeError):
            signature(signatures["cuml.svm.SVC.__init__"]).bind("self", multiclass_strategy="ovr")


def test_the_fake_cupy_has_the_pinned_signature_of_each_function_used(fake_gpu_modules):
    import cupy

    signatures = RECORDED["cupy"][cupy.__version__]
    for key, text in signatures.items():
        assert plain(inspect.signature(getattr(cupy, key.split(".")[-1]))) == text, key


def test_every_call_mnist_svm_makes_to_cupy_binds_on_every_pinned_version(fake_gpu_modules, monkeypatch):
    """CumlBackend's calls into CuPy (a fit and a prediction of each --multiclass, and the support
    count) against CuPy 13.6's and 14.2's signatures."""
    import cupy

    from common.data import load_dataset
    from mnist_svm.backends import CumlBackend

    calls = []

    def recording(name):
        function = getattr(cupy, name)

        @functools.wraps(function)
        def record(*args, **kwargs):
            calls.append((name, args, kwargs))
            return function(*args, **kwargs)
        return record

    for name in USED["cupy"]["cupy"]:
        monkeypatch.setattr(cupy, name, recording(name))
    data = load_dataset("digits", subsample=200, seed=0)
    for multiclass in ("ovr", "ovo"):
        backend = CumlBackend(data, multiclass)
        model = backend.fit(1.0, 1e-3, np.arange(150))
        backend.predict(model, "train", np.arange(150, 200))
        backend.n_support(model)
    assert {name for name, _, _ in calls} == set(USED["cupy"]["cupy"])
    for _, signatures in recorded("cupy"):
        for name, args, kwargs in calls:
            signature(signatures[f"cupy.{name}"]).bind(*args, **kwargs)


def test_the_fake_nvml_has_the_real_signatures():
    spec = importlib.util.spec_from_file_location("fake_pynvml", FAKE_NVML)
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    for version, signatures in recorded("nvidia-ml-py"):
        for key, text in signatures.items():
            assert plain(inspect.signature(getattr(fake, key.split(".")[-1]))) == text, (version, key)


def test_the_fake_nvml_is_the_installed_nvidia_ml_py_in_what_it_defines():
    """Every function the fake defines has the installed nvidia-ml-py's signature (the project's
    dependency, here without a driver), and an error code makes the same class with the same text."""
    real = pytest.importorskip("pynvml")
    spec = importlib.util.spec_from_file_location("fake_pynvml", FAKE_NVML)
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    functions = [name for name, value in vars(fake).items() if name.startswith("nvml") and callable(value)]
    assert "nvmlDeviceGetTemperatureV" in functions and "nvmlDeviceGetHandleByUUID" in functions
    for name in functions:
        assert plain(inspect.signature(getattr(fake, name))) == plain(inspect.signature(getattr(real, name))), name
    codes = [value for name, value in vars(fake).items() if name.startswith("NVML_ERROR_")]
    assert len(codes) >= 4
    for code in codes:
        made, expected = fake.NVMLError(code), real.NVMLError(code)
        assert type(made).__name__ == type(expected).__name__ and made.value == expected.value == code
        assert str(made) == str(expected), code
        assert isinstance(made, fake.NVMLError) and isinstance(made, getattr(fake, type(expected).__name__))
    for name in ("NVML_TEMPERATURE_GPU", "nvmlTemperature_v1"):
        assert getattr(fake, name) == getattr(real, name), name


#: the project's NVML calls (common/observe/gpu_monitor.py, common/devices.py), as (args, kwargs)
NVML_CALLS = {"nvmlInit": ((), {}), "nvmlShutdown": ((), {}), "nvmlDeviceGetCount": ((), {}),
              "nvmlDeviceGetHandleByIndex": ((0,), {}), "nvmlDeviceGetHandleByUUID": (("GPU-0",), {}),
              "nvmlDeviceGetUUID": (("h",), {}), "nvmlDeviceGetUtilizationRates": (("h",), {}),
              "nvmlDeviceGetMemoryInfo": (("h",), {}), "nvmlDeviceGetTemperature": (("h", 0), {}),
              "nvmlDeviceGetTemperatureV": (("h", 0), {}), "nvmlDeviceGetPowerUsage": (("h",), {})}


def test_the_projects_nvml_calls_bind_on_every_recorded_nvidia_ml_py():
    """Each call as the project makes it; the temperature's V only where the release has it."""
    for _, signatures in recorded("nvidia-ml-py"):
        for name, (args, kwargs) in NVML_CALLS.items():
            if f"pynvml.{name}" in signatures or name != "nvmlDeviceGetTemperatureV":
                signature(signatures[f"pynvml.{name}"]).bind(*args, **kwargs)


def test_the_projects_torch_cuda_calls_bind_on_the_recorded_torch():
    for _, signatures in recorded("torch"):
        for name, (args, kwargs) in TORCH_CALLS.items():
            signature(signatures[f"torch.cuda.{name}"]).bind(*args, **kwargs)
