"""mnist_nn's TensorBoard event files: written per fit where tensorboard is installed, read back
with TensorBoard's own reader; nothing written where it is not."""
import sys

import pytest

from mnist_nn.tensorboard_log import write_fit_events

LOG = [{"epoch": 1, "loss": 2.1, "error": 0.61, "samples_per_s": 900.0, "seconds": 1.2, "lr": 0.05},
       {"epoch": 2, "loss": 1.3, "error": 0.32, "samples_per_s": 950.0, "seconds": 1.1, "lr": 0.05},
       {"epoch": 3, "loss": None, "error": 0.90, "samples_per_s": 940.0, "seconds": 1.1, "lr": 0.05}]


def test_each_fit_gets_its_scalars_per_epoch(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is an optional extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_fit_events(tmp_path, "b=00,c=01,f=2", LOG[:1])  # a first attempt, replaced by the retry below
    folder = write_fit_events(tmp_path, "b=00,c=01,f=2", LOG)
    assert folder == tmp_path / "tensorboard" / "b=00,c=01,f=2"
    events = EventAccumulator(str(folder))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"train/loss", "train/error", "speed/samples_per_s", "train/lr"}
    assert [(e.step, round(e.value, 4)) for e in events.Scalars("train/loss")] == [(1, 2.1), (2, 1.3)]  # no NaN
    assert [e.step for e in events.Scalars("train/error")] == [1, 2, 3]
    assert events.Scalars("speed/samples_per_s")[1].value == 950.0


def test_without_tensorboard_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as without the package
    assert write_fit_events(tmp_path, "b=00,refit", LOG) is None
    assert list(tmp_path.iterdir()) == []
