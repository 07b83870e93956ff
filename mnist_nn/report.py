"""Rank 0's outputs: results.csv, the training log, the saved models, the ensemble's errors.

Everything in results.csv and the model files is a function of the items' results only (no
timings, hosts or orders), so it is identical whatever the layout the run had.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
from pathlib import Path
from typing import Any, Dict, List, Mapping

import numpy as np

from common import (
    RunInfo,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    counted,
    load_dataset,
    percent,  # results.csv and stdout keep the reference's fractions
)
from common.results.layout import (
    CV_RESULTS_CSV,
    ENSEMBLE_ERROR_STEM,
    ENSEMBLE_JSON,
    MODELS_DIR,
    RESULTS_CSV,
    TRAINING_CURVES_STEM,
    TRAINING_LOG_CSV,
)

from .records import cv_scores, decode_array, model_stem, refit_key
from .search import IMAGE_SIZE

RESULT_COLUMNS = ["bootstrap", "candidate", "n_conv_layer", "kernel_size", "n_hidden_layer", "learning_rate",
                  "momentum", "cv_loss", "epochs", "training_error", "test_error"]
LOG_COLUMNS = ["item", "bootstrap", "candidate", "fold", "epoch", "loss", "error", "samples_per_s", "seconds", "lr"]
#: how many of the certainty figures summary.md shows (the others are in the results' certainty/)
SUMMARY_CERTAINTY = 4
CV_COLUMNS = ["bootstrap", "candidate", "n_conv_layer", "kernel_size", "n_hidden_layer", "learning_rate",
              "momentum", "cv_loss", "chosen"]


def csv_text(columns: List[str], rows: List[Mapping[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else repr(row[k]) if isinstance(row[k], float) else row[k])
                         for k in columns})
    return buffer.getvalue()


def model_rows(refits: Mapping[int, Mapping[str, Any]]) -> List[Dict[str, Any]]:
    return [{"bootstrap": b, "candidate": r["candidate"], **r["hyper"], "cv_loss": r["cv_loss"],
             "epochs": r["epochs"], "training_error": r["training_error"], "test_error": r["test_error"]}
            for b, r in sorted(refits.items())]


def log_rows(run: RunInfo) -> List[Dict[str, Any]]:
    rows = []
    for item in run.items:
        record = run.records.get(item.key)
        if record is None:
            continue
        params = item.params
        fold = params.get("fold", "refit")
        for entry in record.result["log"]:
            rows.append({"item": item.key, "bootstrap": params["bootstrap"], "candidate": params.get("candidate"),
                         "fold": fold, **entry})
    return rows


def cv_rows(app: Any, run: RunInfo, refits: Mapping[int, Mapping[str, Any]]) -> List[Dict[str, Any]]:
    args = app.args
    results = run.results()
    rows = []
    for b in range(args.n_bootstrap):
        scores = cv_scores(results, b, args.n_tuning, args.folds)
        for c in range(args.n_tuning):
            rows.append({"bootstrap": b, "candidate": c, **app.candidate(b, c).as_dict(),
                         "cv_loss": scores.get(c), "chosen": int(b in refits and refits[b]["candidate"] == c)})
    return rows


def save_model(folder: Path, bootstrap: int, result: Mapping[str, Any], app: Any) -> Dict[str, Any]:
    """models/bootstrap-<i>.pt (state dict) and .json (what is needed to rebuild and feed it)."""
    stem = folder / model_stem(bootstrap)
    weights, pt = result["weights"], stem.with_suffix(".pt")
    if weights["embedded"] is not None:
        atomic_write_bytes(pt, base64.b64decode(weights["embedded"]))
        present = True
    else:  # written by the worker: here only if --results is shared with its node
        present = pt.exists() and hashlib.sha256(pt.read_bytes()).hexdigest() == weights["sha256"]
    params = {"bootstrap": bootstrap, "candidate": result["candidate"], **result["hyper"],
              "cv_loss": result["cv_loss"], "epochs": result["epochs"], "training_error": result["training_error"],
              "test_error": result["test_error"], "dataset": app.args.dataset, "subsample": app.args.subsample,
              "seed": app.args.seed, "image_size": IMAGE_SIZE, "normalisation": result["normalisation"],
              "state_dict": pt.name, "sha256": weights["sha256"]}
    atomic_write_json(stem.with_suffix(".json"), params)
    return {"bootstrap": bootstrap, "file": f"{MODELS_DIR}/{pt.name}", "present": present}


def majority_votes(probabilities: np.ndarray) -> np.ndarray:
    """The ensemble's digit for each image: the one most models predict (ties to the lowest digit)."""
    votes = probabilities.argmax(2)  # (models, images)
    counts = np.zeros((votes.shape[1], probabilities.shape[2]), dtype=np.int64)
    for model_votes in votes:
        counts[np.arange(votes.shape[1]), model_votes] += 1
    return counts.argmax(1)


def ensemble_errors(probabilities: np.ndarray, labels: np.ndarray) -> Dict[str, float]:
    """Test errors of the majority vote (ties to the lowest digit) and of the mean probability."""
    return {"majority_vote": float(np.mean(majority_votes(probabilities) != labels)),
            "mean_probability": float(np.mean(probabilities.mean(0).argmax(1) != labels))}


def write_outputs(app: Any, run: RunInfo) -> Dict[str, Any]:
    from .plots import plot_certainty, plot_ensemble_errors, plot_training_curves

    args = app.args
    folder = Path(run.results_dir)
    refits = {b: run.records[refit_key(b)].result for b in range(args.n_bootstrap) if refit_key(b) in run.records}
    models = model_rows(refits)
    atomic_write_text(folder / RESULTS_CSV, csv_text(RESULT_COLUMNS, models))
    logs = log_rows(run)
    atomic_write_text(folder / TRAINING_LOG_CSV, csv_text(LOG_COLUMNS, logs))
    atomic_write_text(folder / CV_RESULTS_CSV, csv_text(CV_COLUMNS, cv_rows(app, run, refits)))
    saved = [save_model(folder / MODELS_DIR, b, result, app) for b, result in sorted(refits.items())]
    missing = [s["file"] for s in saved if not s["present"]]
    summary: Dict[str, Any] = {"models": len(refits), "bootstraps": args.n_bootstrap,
                               # an ensemble of fewer models than asked for: their refit failed or was not run
                               "bootstraps_without_model": [b for b in range(args.n_bootstrap) if b not in refits],
                               "chosen_models": models,
                               "model_test_errors": [m["test_error"] for m in models],
                               "model_training_errors": [m["training_error"] for m in models],
                               "ensemble_test_error": None, "ensemble_test_error_mean_probability": None,
                               "models_missing": missing}
    if missing:
        summary["models_missing_note"] = ("written by workers on other nodes into their own results folder: "
                                          "make --results a shared folder")
    plot_training_curves(logs, folder / TRAINING_CURVES_STEM, args.epoch_loss)
    if not refits:
        return summary
    dataset = load_dataset(args.dataset, args.data_dir)  # only its test set is used: never subsampled
    probabilities = np.stack([decode_array(refits[b]["test_probabilities"]) for b in sorted(refits)])
    votes = majority_votes(probabilities)
    errors = ensemble_errors(probabilities, dataset.y_test)
    summary["ensemble_test_error"] = errors["majority_vote"]
    summary["ensemble_test_error_mean_probability"] = errors["mean_probability"]
    atomic_write_text(folder / ENSEMBLE_JSON, json.dumps({**errors, "models": models}, indent=2) + "\n")
    plot_ensemble_errors([m["test_error"] for m in models], [m["bootstrap"] for m in models], errors,
                         folder / ENSEMBLE_ERROR_STEM)
    certainty = plot_certainty(probabilities, dataset.x_test, dataset.y_test, votes, args.certainty_images, folder)
    summary["certainty_figures"] = certainty["test_images"] + [m["figure"] for m in certainty["misclassified"]]
    summary["certainty_test_images"] = len(certainty["test_images"])
    summary["certainty_first_misclassified"] = certainty["misclassified"][0] if certainty["misclassified"] else None
    return summary


def models_text(summary: Mapping[str, Any]) -> str:
    """How many models the ensemble has, and which bootstraps have none (their refit failed)."""
    without = summary.get("bootstraps_without_model") or []
    if not without:
        return str(summary["models"])
    names = ", ".join(str(b) for b in without)
    whose = "its refit" if len(without) == 1 else "their refits"
    return (f"{summary['models']} of {summary.get('bootstraps', '?')} (bootstrap{'s' if len(without) > 1 else ''} "
            f"{names} without one: {whose} did not finish)")


def partial_note(summary: Mapping[str, Any]) -> str:
    """`` (of 1 of 2 models)`` where the ensemble lacks some, else nothing."""
    if not summary.get("bootstraps_without_model"):
        return ""
    return f" (of {summary['models']} of {summary.get('bootstraps', '?')} models)"


def summary_markdown(summary: Mapping[str, Any]) -> str:
    errors = summary.get("model_test_errors") or []
    lines = ["## mnist_nn: bagged conv nets", ""]
    if summary.get("ensemble_test_error") is None:  # the fits that ran still have their curves and log
        lines += ["No model was refitted: no ensemble.", "",
                  "Files: `cv_results.csv` (every candidate's CV loss), `training_log.csv` (every epoch of every "
                  "fit that finished); the figure also as `.svg` and `.pdf`.", "",
                  "![training curves](training_curves.png)", ""]
        return "\n".join(lines) + "\n"
    lines += [f"- models: {models_text(summary)}; test error of each: " + ", ".join(map(percent, errors)),
              f"- ensemble test error{partial_note(summary)}: majority vote {percent(summary['ensemble_test_error'])}, "
              f"mean probability {percent(summary['ensemble_test_error_mean_probability'])} "
              f"(best single model {percent(min(errors))})", ""]
    lines += model_table(summary["chosen_models"])
    if summary.get("models_missing"):
        lines += [f"- model files missing here: {', '.join(summary['models_missing'])} "
                  f"({summary.get('models_missing_note', '')})", ""]
    lines += ["Files: `results.csv` (one row per model), `cv_results.csv` (every candidate's CV loss), "
              "`training_log.csv` (every epoch of every fit), `models/bootstrap-<i>.pt` + `.json`; each figure also as "
              "`.svg` and `.pdf`" + (" (the certainty figures as `.pdf`)." if summary.get("certainty_figures") else
                                      " (no certainty figures: `--certainty-images 0`)."), "",
              "![ensemble error](ensemble_error.png)", "", "![training curves](training_curves.png)", ""]
    lines += certainty_markdown(summary)
    return "\n".join(lines) + "\n"


def certainty_markdown(summary: Mapping[str, Any]) -> List[str]:
    """summary.md shows the first few certainty figures and the misclassified one; the rest are in the folder."""
    count, wrong = summary.get("certainty_test_images") or 0, summary.get("certainty_first_misclassified")
    if not count:
        return []
    shown = summary["certainty_figures"][:min(count, SUMMARY_CERTAINTY)]
    lines = ["### Certainty: each digit's probability over the models", "",
             f"{counted(count, 'figure')} in `certainty/`, one per test image from the first (`test_image_<i>.png`, "
             f"`.pdf`); {'the first ' + str(len(shown)) + ' shown here' if len(shown) < count else 'shown here'}:", ""]
    lines += [f"![certainty, {name.rpartition('/')[2].replace('_', ' ')}]({name}.png)" for name in shown]
    if wrong is None:
        return lines + ["", "The ensemble's majority vote misclassifies no test image.", ""]
    return lines + ["", f"The first test image the ensemble's majority vote misclassifies ({wrong['index']}: label "
                        f"{wrong['label']}, vote {wrong['vote']}):", "",
                    f"![certainty, first misclassified]({wrong['figure']}.png)", ""]


def model_table(models: List[Mapping[str, Any]]) -> List[str]:
    """summary.md's table: each bootstrap's chosen candidate, its CV loss and its errors."""
    number = lambda value, form: "n/a" if value is None else format(value, form)  # noqa: E731
    lines = ["| bootstrap | candidate | conv channels | kernel | hidden | learning rate | momentum | CV loss "
             "| epochs | training error | test error |", "|---" * 11 + "|"]
    lines += [f"| {m['bootstrap']} | {m['candidate']} | {m['n_conv_layer']} | {m['kernel_size']} | "
              f"{m['n_hidden_layer']} | {m['learning_rate']:.3g} | {m['momentum']:.3g} | {number(m['cv_loss'], '.4f')} | "
              f"{m['epochs']} | {percent(m['training_error'])} | {percent(m['test_error'])} |"
              for m in models]
    return lines + [""]
