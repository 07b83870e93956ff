"""TensorBoard event files per fit, where ``tensorboard`` is installed (``pip install
multinode-gpu[tensorboard]``); without it nothing is written and nothing else changes.

Each fit gets ``<results>/tensorboard/<item key>/`` with its loss, training error, samples/s and
learning rate per epoch, written by the worker once the fit ends (``tensorboard --logdir
<results>/tensorboard`` shows fits as they finish). A fit run again (a retry, a resume) replaces
its folder, so each fit shows once.
"""
from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional

from common.results.layout import TENSORBOARD_DIR

logger = logging.getLogger(__name__)

#: epoch log field -> TensorBoard tag
SCALARS = {"loss": "train/loss", "error": "train/error", "samples_per_s": "speed/samples_per_s", "lr": "train/lr"}


def _summary_writer() -> Optional[Any]:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch.utils.tensorboard needs the tensorboard package
        return None
    return SummaryWriter


def write_fit_events(results: Path, key: str, log: List[Dict[str, Any]]) -> Optional[Path]:
    """The fit's epoch log as TensorBoard scalars; its folder, or None without tensorboard."""
    writer_class = _summary_writer()
    if writer_class is None:
        return None
    folder = Path(results) / TENSORBOARD_DIR / re.sub(r"[^A-Za-z0-9._=,-]", "_", key)
    try:
        shutil.rmtree(folder, ignore_errors=True)
        writer = writer_class(log_dir=str(folder))
        try:
            for entry in log:
                for field, tag in SCALARS.items():
                    if entry.get(field) is not None:
                        writer.add_scalar(tag, entry[field], entry["epoch"])
        finally:
            writer.close()
    except Exception as error:  # noqa: BLE001 - an optional view must never fail the fit it shows
        logger.warning("%s: TensorBoard events not written: %s: %s", key, type(error).__name__, error)
        return None
    return folder
