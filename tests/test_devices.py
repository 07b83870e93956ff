"""``--gpu`` and the GPUs a rank may use: CUDA_VISIBLE_DEVICES as Slurm and users set it."""
import pytest

from common.devices import Device, resolve_devices, visible_gpus
from common.errors import UsageError


@pytest.mark.parametrize("value, gpus", [("2,3", ["2", "3"]), ("GPU-8932f937,GPU-1c2d", ["GPU-8932f937", "GPU-1c2d"]),
                                         ("", []), ("-1", []), ("NoDevFiles", [])])
def test_cuda_visible_devices_names_the_gpus(monkeypatch, value, gpus):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert visible_gpus() == gpus


@pytest.mark.parametrize("value, gpus", [("0,-1,1", ["0"]), ("0,,1", ["0"]), ("0,0", []), ("1gpu,2ampere", ["1", "2"]),
                                         ("+3", ["3"]), ("GPU-8932f937,1", ["GPU-8932f937"]), ("MIG-a,MIG-a", []),
                                         ("none", []), (" 2, 3", ["2", "3"]), ("GPU-8932f937, GPU-1c2d", ["GPU-8932f937"]),
                                         (" GPU-8932f937", [])])
def test_cuda_visible_devices_is_read_by_cudas_rules(monkeypatch, value, gpus):
    """As torch 2.7.1's ``_parse_visible_devices`` copies CUDA (torch/cuda/__init__.py of its wheel,
    lines 698-767): a negative or unreadable entry ends the list, a repeated one hides every GPU, an
    entry is read like strtoul after its spaces are stripped, UUIDs end at the first entry without
    their prefix, spaces not stripped. Workers are pinned to the GPUs CUDA itself would show, no others."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", value)
    assert visible_gpus() == gpus


def test_a_cuda_variable_that_hides_every_gpu_is_named_when_no_gpu_is_found(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,0")
    assert "CUDA_VISIBLE_DEVICES='0,0' gives CUDA none" in resolve_devices(None, 1)[1]
    with pytest.raises(UsageError, match=r"has no GPU \(CUDA_VISIBLE_DEVICES='0,0' gives CUDA none"):
        resolve_devices("all", 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")  # the usual "none": nothing to explain
    assert resolve_devices(None, 1)[1] == "no GPU found: running on CPU (use --gpu cpu to silence this)"


def test_workers_with_gpus_named_are_refused_not_ignored():
    """--gpu all --workers 4 ran one worker per GPU and dropped the 4 without a word; the default
    --gpu keeps --workers (a CPU command that falls back to the CPU where there is no GPU)."""
    with pytest.raises(UsageError, match=r"--workers 4 with --gpu all: on GPUs each worker has a GPU of its own"):
        resolve_devices("all", 4, gpus=["5", "7"])
    assert len(resolve_devices("cpu", 4, gpus=["5", "7"])[0]) == 4
    assert resolve_devices(None, 4, gpus=["5", "7"])[0] == [Device("cuda", 0, "5")]


def test_gpu_all_gives_one_worker_per_visible_gpu_numbered_as_the_user_sees_them():
    devices, notice = resolve_devices("all", 1, gpus=["5", "7"])
    assert devices == [Device("cuda", 0, "5"), Device("cuda", 1, "7")] and notice is None
    assert resolve_devices("1", 1, gpus=["5", "7"])[0] == [Device("cuda", 1, "7")]


def test_no_gpu_falls_back_to_cpu_by_default_and_is_an_error_when_asked_for():
    devices, notice = resolve_devices(None, 2, gpus=[])
    assert devices == [Device("cpu", 0), Device("cpu", 1)] and "no GPU found" in notice
    with pytest.raises(UsageError, match="has no GPU"):
        resolve_devices("all", 1, gpus=[])


def test_in_a_slurm_job_given_no_gpu_the_nodes_gpus_are_not_taken(monkeypatch):
    """NVML lists every GPU of the node where Slurm does not constrain devices; they are other jobs'."""
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert visible_gpus() == []
    assert resolve_devices(None, 1)[0] == [Device("cpu", 0)]
    with pytest.raises(UsageError, match="Slurm gave this job no GPU .* --gpus-per-node"):
        resolve_devices("all", 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # a job given two GPUs
    assert visible_gpus() == ["0", "1"]


@pytest.mark.parametrize("variable", ["SLURM_STEP_GPUS=0,1", "SLURM_JOB_GPUS=2", "SLURM_GPUS_ON_NODE=4"])
def test_a_slurm_job_given_gpus_without_cuda_visible_devices_is_told_so(monkeypatch, variable):
    """gres.conf Flags=no_gpu_env: Slurm gives GPUs and sets no CUDA_VISIBLE_DEVICES. Neither "no
    GPU" nor a silent run on the CPU: one line naming what Slurm did set, and what to do."""
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE"):
        monkeypatch.delenv(name, raising=False)
    name, value = variable.split("=")
    monkeypatch.setenv(name, value)
    for spec in (None, "all", "1"):
        with pytest.raises(UsageError, match=f"Slurm gave this job GPUs on .* \\({variable}\\) but set no "
                                             f"CUDA_VISIBLE_DEVICES"):
            resolve_devices(spec, 1)
    assert resolve_devices("cpu", 2)[0] == [Device("cpu", 0), Device("cpu", 1)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # set in the job script, as the line says
    assert resolve_devices(None, 1)[0] == [Device("cuda", 0, "0")]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.delenv(name)
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "0")  # Slurm's way of saying none
    assert resolve_devices(None, 1)[0] == [Device("cpu", 0)]


def test_ranks_of_one_node_that_see_the_same_gpus_share_them_out():
    """mpirun -n 8 over two 4-GPU nodes, no GPU bound to each task: each rank takes its own share."""
    gpus = ["0", "1", "2", "3"]
    shares = [resolve_devices("all", 1, gpus, position, 2)[0] for position in (0, 1)]
    assert shares == [[Device("cuda", 0, "0"), Device("cuda", 1, "1")], [Device("cuda", 2, "2"), Device("cuda", 3, "3")]]
    assert [resolve_devices("1,2,3", 1, gpus, p, 3)[0] for p in range(3)] == [[Device("cuda", i, str(i))] for i in (1, 2, 3)]
    # the default (GPU 0 alone): rank i takes GPU i, and ranks past the GPUs take turns
    assert [resolve_devices(None, 1, gpus, p, 4)[0][0].index for p in range(4)] == [0, 1, 2, 3]
    assert [resolve_devices(None, 1, ["0"], p, 2)[0][0].index for p in range(2)] == [0, 0]
    with pytest.raises(UsageError, match="2 ranks on .* would share its 1 GPU"):
        resolve_devices("3", 1, gpus, 1, 2)
    assert resolve_devices("cpu", 2, gpus, 1, 2)[0] == [Device("cpu", 0), Device("cpu", 1)]


def test_workers_per_gpu_gives_each_gpu_several_workers_and_the_monitor_counts_it_once():
    """--workers-per-gpu 2 over GPUs 5 and 7: four workers, two pinned to each; one NVML entry per GPU."""
    from common.observe.gpu_monitor import GpuMonitor

    devices, _ = resolve_devices("all", 1, gpus=["5", "7"], per_gpu=2)
    assert [(str(d), d.physical) for d in devices] == [("gpu0.0", "5"), ("gpu0.1", "5"), ("gpu1.0", "7"), ("gpu1.1", "7")]
    assert [d.gpu_name for d in GpuMonitor(devices).devices] == ["gpu0", "gpu1"]
    assert resolve_devices("all", 1, gpus=["5", "7"], per_gpu=1)[0] == [Device("cuda", 0, "5"), Device("cuda", 1, "7")]
    with pytest.raises(UsageError, match="--workers-per-gpu 3 with --gpu cpu: workers share GPUs, and there are none"):
        resolve_devices("cpu", 2, gpus=["5"], per_gpu=3)  # asked for the CPU: the flag would be ignored
    # the default falls back to the CPU where there is no GPU: the flag then is a GPU job's, not an error
    assert resolve_devices(None, 2, gpus=[], per_gpu=3)[0] == [Device("cpu", 0), Device("cpu", 1)]
    shares = [resolve_devices("all", 1, ["0", "1"], position, 2, per_gpu=2)[0] for position in (0, 1)]
    assert [[str(d) for d in share] for share in shares] == [["gpu0.0", "gpu0.1"], ["gpu1.0", "gpu1.1"]]
