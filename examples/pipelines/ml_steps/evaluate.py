"""``evaluate`` step: the trained model on the test set; metrics to shared/metrics.json and a
readable shared/eval_report.md (accuracy, precision, recall and F1 per class, confusion matrix)."""
from __future__ import annotations

import os
from typing import Any, Dict, List

import torch
from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

from .data import load_splits
from .settings import read_json, setting, shared_dir, write_json
from .train import EVAL_BATCH, build_model


def _markdown(metrics: Dict[str, Any]) -> str:
    labels: List[int] = metrics["labels"]
    lines = [f"# Evaluation on the {metrics['dataset']} test set", "",
             f"- test images: {metrics['n_test']}", f"- accuracy: {metrics['accuracy']:.4f}",
             f"- macro F1: {metrics['macro_f1']:.4f}", "",
             "| class | precision | recall | F1 | support |", "|---|---|---|---|---|"]
    for i, label in enumerate(labels):
        lines.append(f"| {label} | {metrics['precision'][i]:.3f} | {metrics['recall'][i]:.3f} | "
                     f"{metrics['f1'][i]:.3f} | {metrics['support'][i]} |")
    lines += ["", "Confusion matrix (rows: true class, columns: predicted):", "",
              "| true \\ predicted | " + " | ".join(str(label) for label in labels) + " |",
              "|---" * (len(labels) + 1) + "|"]
    for label, row in zip(labels, metrics["confusion_matrix"]):
        lines.append(f"| **{label}** | " + " | ".join(str(count) for count in row) + " |")
    return "\n".join(lines) + "\n"


def main() -> Dict[str, Any]:
    shared = shared_dir()
    checkpoint = shared / "checkpoints" / "model_final.pt"
    if not checkpoint.is_file():
        raise SystemExit(f"no trained model at {checkpoint}: did the train step run?")
    config = read_json(shared / "checkpoints" / "model.json")
    dataset = setting("DATASET", "digits")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = build_model(config)
    model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=True))
    model.to(device).eval()
    data = load_splits(dataset, setting("DATA_DIR", None))
    x, y = data["x_test"].to(device), data["y_test"].numpy()
    with torch.no_grad():
        predicted = torch.cat([model(x[i:i + EVAL_BATCH]).argmax(1) for i in range(0, len(x), EVAL_BATCH)]).cpu().numpy()
    labels = list(range(10))
    precision, recall, f1, support = precision_recall_fscore_support(y, predicted, labels=labels, zero_division=0)
    metrics = {"dataset": dataset, "n_test": int(len(y)), "device": str(device), "labels": labels,
               "accuracy": float(accuracy_score(y, predicted)), "macro_f1": float(f1.mean()),
               "precision": precision.tolist(), "recall": recall.tolist(), "f1": f1.tolist(),
               "support": support.tolist(), "confusion_matrix": confusion_matrix(y, predicted, labels=labels).tolist(),
               "step": os.environ.get("PIPELINE_STEP_ID", "evaluate")}
    write_json(shared / "metrics.json", metrics)
    (shared / "eval_report.md").write_text(_markdown(metrics))
    print(f"test accuracy {metrics['accuracy']:.4f}, macro F1 {metrics['macro_f1']:.4f}")
    return {"accuracy": metrics["accuracy"], "macro_f1": metrics["macro_f1"]}
