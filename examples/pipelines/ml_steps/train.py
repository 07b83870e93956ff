"""``train`` step: fit one small CNN (the reference's architecture) with SGD; checkpoints and per-epoch metrics to shared/.

Settings (env): DATASET (digits), DATA_DIR, SUBSAMPLE, EPOCHS (5), BATCH_SIZE (32),
LEARNING_RATE (0.02), MOMENTUM (0.9), N_CONV_LAYER (8), KERNEL_SIZE (5), N_HIDDEN_LAYER (64).
Writes ``shared/checkpoints/model_final.pt`` (state dict), ``shared/checkpoints/model.json``
(architecture) and ``shared/training_metrics.json``. A loss that is not finite or far above
chance level (a learning rate too high) fails the step, which is what the pipeline's ``train-retry`` fallback is for.
"""
from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, Dict

import torch

from .data import IMAGE_SIZE, load_splits
from .settings import setting, shared_dir, write_json

EVAL_BATCH = 2048
#: Ten times the loss of guessing uniformly among 10 classes: far past it, training has diverged.
DIVERGED_LOSS = 10 * math.log(10)


class Net(torch.nn.Module):
    """Conv2d(1, n_conv_layer, kernel_size) -> flatten -> ReLU -> Linear(n_hidden_layer) -> ReLU -> Linear(10):
    the architecture of the reference's nets (mnist_nn's), written here so the example needs no app."""

    def __init__(self, n_conv_layer: int, kernel_size: int, n_hidden_layer: int, image_size: int = IMAGE_SIZE):
        super().__init__()
        side = image_size - kernel_size + 1
        self.conv = torch.nn.Conv2d(1, n_conv_layer, kernel_size)
        self.hidden = torch.nn.Linear(n_conv_layer * side * side, n_hidden_layer)
        self.output = torch.nn.Linear(n_hidden_layer, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(torch.flatten(self.conv(x), 1))
        x = torch.relu(self.hidden(x))
        return self.output(x)


def build_model(config: Dict[str, int]) -> torch.nn.Module:
    return Net(config["n_conv_layer"], config["kernel_size"], config["n_hidden_layer"])


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        predicted = torch.cat([model(x[i:i + EVAL_BATCH]).argmax(1) for i in range(0, len(x), EVAL_BATCH)])
    model.train()
    return float((predicted == y).double().mean())  # float64, as numpy's mean


def main() -> Dict[str, Any]:
    settings = {
        "dataset": setting("DATASET", "digits"), "subsample": setting("SUBSAMPLE", None, int),
        "epochs": setting("EPOCHS", 5, int), "batch_size": setting("BATCH_SIZE", 32, int),
        "learning_rate": setting("LEARNING_RATE", 0.02, float), "momentum": setting("MOMENTUM", 0.9, float),
    }
    config = {"n_conv_layer": setting("N_CONV_LAYER", 8, int), "kernel_size": setting("KERNEL_SIZE", 5, int),
              "n_hidden_layer": setting("N_HIDDEN_LAYER", 64, int)}
    seed = setting("PIPELINE_SEED", 0, int)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"training on {device} (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}): "
          f"{settings} {config}", flush=True)
    torch.manual_seed(seed)
    data = {k: v.to(device) for k, v in load_splits(settings["dataset"], setting("DATA_DIR", None),
                                                    settings["subsample"]).items()}
    model = build_model(config).to(device)
    optimiser = torch.optim.SGD(model.parameters(), lr=settings["learning_rate"], momentum=settings["momentum"])
    loss_function = torch.nn.CrossEntropyLoss()
    generator = torch.Generator(device="cpu").manual_seed(seed)
    n, batch = len(data["y_train"]), settings["batch_size"]
    epochs = []
    started = time.perf_counter()
    for epoch in range(1, settings["epochs"] + 1):
        epoch_start, total = time.perf_counter(), 0.0
        order = torch.randperm(n, generator=generator).to(device)
        for i in range(0, n, batch):
            index = order[i:i + batch]
            optimiser.zero_grad()
            loss = loss_function(model(data["x_train"][index]), data["y_train"][index])
            loss.backward()
            optimiser.step()
            total += float(loss.detach()) * len(index)
        mean_loss = total / n
        if not math.isfinite(mean_loss) or mean_loss > DIVERGED_LOSS:
            print(f"epoch {epoch}: loss {mean_loss}: training diverged "
                  f"(learning rate {settings['learning_rate']:g} is too high)", file=sys.stderr)
            raise SystemExit(3)
        val = accuracy(model, data["x_val"], data["y_val"])
        epochs.append({"epoch": epoch, "loss": mean_loss, "val_accuracy": val,
                       "seconds": round(time.perf_counter() - epoch_start, 3)})
        print(f"epoch {epoch}: loss {mean_loss:.4f}, validation accuracy {val:.4f}", flush=True)
    seconds = time.perf_counter() - started
    checkpoints = shared_dir() / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, checkpoints / "model_final.pt.tmp")
    os.replace(checkpoints / "model_final.pt.tmp", checkpoints / "model_final.pt")
    write_json(checkpoints / "model.json", config)
    metrics = {"settings": settings, "model": config, "seed": seed, "device": str(device),
               "step": os.environ.get("PIPELINE_STEP_ID", "train"), "epochs": epochs,
               "loss_per_epoch": [e["loss"] for e in epochs],
               "val_accuracy": epochs[-1]["val_accuracy"] if epochs else None,
               "n_train": n, "n_val": len(data["y_val"]), "seconds": round(seconds, 3),
               "samples_per_second": round(n * len(epochs) / seconds, 1) if seconds > 0 else None}
    write_json(shared_dir() / "training_metrics.json", metrics)
    return {"val_accuracy": metrics["val_accuracy"], "epochs": len(epochs)}
