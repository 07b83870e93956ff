"""The example's data: a data set from common.data as normalised 28x28 float tensors, with a
stratified validation split of the training set (fixed, so train and evaluate agree)."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch
from sklearn.model_selection import train_test_split

from common.data import load_dataset, resize_images

IMAGE_SIZE = 28
VALIDATION_FRACTION = 0.2
SPLIT_STATE = 0


def _to_tensor(images: np.ndarray, mean: float, std: float) -> torch.Tensor:
    if images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
        images = resize_images(images, IMAGE_SIZE)
    scaled = (images.astype(np.float32) / 255.0 - mean) / std
    return torch.from_numpy(scaled).unsqueeze(1)


def load_splits(dataset: str = "digits", data_dir: Optional[str] = None, subsample: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """x/y for train, validation and test; normalised with the training set's mean and std."""
    data = load_dataset(dataset, data_dir, subsample=subsample, seed=SPLIT_STATE)
    train, val = train_test_split(np.arange(len(data.y_train)), test_size=VALIDATION_FRACTION,
                                  stratify=data.y_train, random_state=SPLIT_STATE)
    pixels = data.x_train[train].astype(np.float32) / 255.0
    mean, std = float(pixels.mean()), float(pixels.std()) or 1.0
    return {
        "x_train": _to_tensor(data.x_train[train], mean, std), "y_train": torch.from_numpy(data.y_train[train]),
        "x_val": _to_tensor(data.x_train[val], mean, std), "y_val": torch.from_numpy(data.y_train[val]),
        "x_test": _to_tensor(data.x_test, mean, std), "y_test": torch.from_numpy(data.y_test),
    }
