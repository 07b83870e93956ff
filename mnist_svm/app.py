"""mnist_svm: the reference's RBF-SVM grid search as an engine app.

Items are single (C, gamma, fold) fits, so a 24x24 grid with 5 folds is 2,880 items, each handed
to whichever GPU of any node is free; one last item refits the best pair on the whole training set and
scores it on the test set. Rank 0 turns the results into the reference's outputs.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import math
import sys
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from common import (
    NUMBER,
    App,
    Dataset,
    Device,
    Item,
    RunInfo,
    UsageError,
    add_data_arguments,
    atomic_write_bytes,
    atomic_write_text,
    check_available,
    check_data_flags,
    check_fields,
    check_range,
    ensure_available,
    load_dataset,
    percent,
    resumed_note,
    seed32,
)
from common.results.layout import (
    FITS_CSV,
    PER_GAMMA_FOLDER,
    VALIDATION_BOXPLOTS_STEM,
    VALIDATION_ERROR_NPY,
    VALIDATION_HEATMAP_STEM,
)

from .backends import have_cuml, make_backend
from .grid import REFIT_KEY, Grid, best_point, error_table, grid_items

#: what a (C, gamma, fold) fit and the refit return (``check_result``)
FIT_FIELDS = {"error": NUMBER, "n_support": int, "backend": str}
REFIT_FIELDS = {"C": NUMBER, "gamma": NUMBER, "test_error": NUMBER, "confusion_matrix": list, "n_support": int,
                "n_train": int, "n_test": int, "backend": str}

# 24 x 24 x 5 (the reference) is 2,880 fits; past this many the run would take days even on many
# GPUs, and the journal and fits.csv grow past use: n_tuning 141 with 5 folds, or 100 with 10
MAX_FITS = 100_000


def reference_folds(n: int, folds: int) -> List[tuple]:
    """The reference's folds: contiguous slices between round(linspace(0, n, folds + 1)), as
    (training rows, validation rows)."""
    edges = np.round(np.linspace(0, n, folds + 1)).astype(np.int64)
    rows = np.arange(n)
    return [(np.concatenate([rows[:lo], rows[hi:]]), rows[lo:hi]) for lo, hi in zip(edges[:-1], edges[1:])]


@dataclasses.dataclass
class WorkerState:
    """What a worker keeps between items: the backend holding the data, and the fold rows."""

    backend: Any
    folds: list  # [(train_rows, validation_rows)] per fold
    n_classes: int


class MnistSvm(App):
    name = "mnist_svm"
    use_cuml = False  # set by validate()
    description = "Cross-validated grid search of an RBF SVM (C x gamma x folds), one fit per work item"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--cv", choices=("reference", "stratified"), default="reference",
                            help="reference: contiguous, unshuffled folds (boundaries round(linspace(0, n, folds + 1))); "
                                 "stratified: shuffled by --seed, each fold with the classes' proportions")
        parser.add_argument("--multiclass", choices=("ovr", "ovo"), default="ovr",
                            help="ovr: one binary SVC per class, the largest decision value wins (the reference's "
                                 "cuML multiclass_strategy='ovr', a keyword cuML 25.06 removed: here one binary "
                                 "SVC per class, on the GPU with cuML); ovo: one SVC per pair of classes (libsvm's "
                                 "and cuML's default, decision_function_shape='ovo')")
        parser.add_argument("n_tuning", type=int,
                            help="grid points per axis: log10 C in linspace(-3, 6, n), log10 gamma in linspace(-6, -2, n)")
        add_data_arguments(parser)

    @property
    def grid(self) -> Grid:
        return Grid(self.args.n_tuning, self.args.folds)

    # ----- every rank (check_arguments also in python -m common.slurm) -----
    def check_arguments(self) -> None:
        args = self.args
        if args.n_tuning < 1:
            raise UsageError(f"n_tuning must be at least 1, got {args.n_tuning}")
        fits = args.n_tuning ** 2 * args.folds
        if fits > MAX_FITS:
            raise UsageError(f"n_tuning {args.n_tuning} with {args.folds} folds is {fits:,} fits; "
                             f"at most {MAX_FITS:,} (n_tuning x n_tuning x folds; e.g. n_tuning 141 with 5 folds)")
        check_data_flags(args)

    def validate(self) -> None:
        args = self.args
        if args.gpu is not None and self.on_gpu() and not have_cuml():
            raise UsageError(f"--gpu {args.gpu}: cuML is not installed (install RAPIDS cuML), or use --gpu cpu "
                             f"to fit with scikit-learn")
        check_available(args.dataset, args.data_dir)
        #: decided once from the engine's devices; pickled into the workers with the app
        self.use_cuml = self.on_gpu() and have_cuml()
        if self.on_gpu() and not self.use_cuml:  # the default GPU 0, without cuML
            print("mnist_svm: cuML is not installed: fitting with scikit-learn on the CPU", file=sys.stderr)

    def fingerprint(self) -> Dict[str, Any]:
        args = self.args
        return {"n_tuning": args.n_tuning, "dataset": args.dataset, "folds": args.folds,
                "subsample": args.subsample,
                **({"cv": "reference"} if args.cv == "reference" else {}),
                **({"multiclass": "ovr"} if args.multiclass == "ovr" else {})}

    def fingerprint_left_out(self) -> Dict[str, Any]:
        """--cv and --multiclass are fingerprinted only at their defaults (journals from before them
        were made those ways): one left out was the other value, which a refusal names."""
        return {"cv": "stratified", "multiclass": "ovo"}

    # ----- rank 0 -----
    def prepare(self) -> None:
        """Download if needed, then read the data once here so a bad file stops the run before any work."""
        args = self.args
        ensure_available(args.dataset, args.data_dir)
        data = self._load()
        self._data_identity = data.identity()
        counts = np.bincount(data.y_train)
        counts = counts[counts > 0]
        smallest_class = int(counts.min())
        if smallest_class < args.folds:  # stratified folds need --folds images of every class
            larger = (f" or a --subsample of at least about {args.folds * len(counts)} ({args.folds} images of each "
                      f"of the {len(counts)} classes)" if args.subsample is not None else "")
            raise UsageError(f"--folds {args.folds}: the smallest class of the training images has only "
                             f"{smallest_class}, and each fold needs one of every class; use fewer folds{larger}")

    def items(self) -> list:
        # scikit-learn workers (CPUs, or GPUs without cuML) share a (gamma, fold)'s kernel between its C
        return grid_items(self.grid, share_kernels=not self.use_cuml)

    def complete(self, item: Item, results: Mapping[str, Any]) -> Item:
        """The refit item gets the best (C, gamma) by mean validation error."""
        best = best_point(self.grid, error_table(self.grid, results))
        return dataclasses.replace(item, params={**item.params, **best})

    def data_fingerprint(self) -> Optional[str]:
        return getattr(self, "_data_identity", None)

    def check_result(self, key: str, result: Any) -> None:
        check_fields(result, REFIT_FIELDS if key == REFIT_KEY else FIT_FIELDS)
        check_range(result, ("test_error",) if key == REFIT_KEY else ("error",), 0.0, 1.0)
        check_range(result, ("n_support",), 0)
        if key == REFIT_KEY:
            check_range(result, ("C", "gamma"), math.ulp(0.0))
            _check_confusion_matrix(result["confusion_matrix"], result["n_test"])

    def output_names(self) -> tuple:
        """What finish writes: validation_error.npy, the validation figures, fits.csv."""
        return ("validation_*", FITS_CSV)

    def headline(self, run: RunInfo, summary: Mapping[str, Any]) -> List[str]:
        """The reference's closing prints, worded and formatted as there: the wall time of this run's
        cross-validation fits, then the refit's (C, gamma) and its test error in percent."""
        refit = run.results().get(REFIT_KEY)
        if not refit:
            return []
        fits = [record for key, record in run.records.items() if key != REFIT_KEY and key not in self.journaled]
        earlier = sum(1 for key in self.journaled if key != REFIT_KEY)
        since = resumed_note(len(fits), earlier, "fits")
        timing = ([f"Time taken for k-fold validation: {max(r.end for r in fits) - min(r.start for r in fits)} s{since}"]
                  if fits else [])
        return timing + [f"Best penalty parameter: {refit['C']}", f"Best kernel parameter: {refit['gamma']}",
                         f"Test error: {refit['test_error'] * 100}%"]

    def answer(self, summary: Mapping[str, Any]) -> Optional[str]:
        if summary.get("best_C") is None or summary.get("test_error") is None:
            return None
        return (f"best C {summary['best_C']:.4g}, gamma {summary['best_gamma']:.4g}: cross-validation error "
                f"{percent(summary['cv_error'])}, test error {percent(summary['test_error'])}")

    def finish(self, run: RunInfo) -> Dict[str, Any]:
        grid, folder = self.grid, run.results_dir
        results = run.results()
        table = error_table(grid, results)
        buffer = io.BytesIO()
        np.save(buffer, table)
        atomic_write_bytes(folder / VALIDATION_ERROR_NPY, buffer.getvalue())
        atomic_write_text(folder / FITS_CSV, self._fits_csv(run))
        summary: Dict[str, Any] = {"dataset": self.args.dataset, "n_tuning": grid.n_tuning, "folds": grid.folds,
                                   "subsample": self.args.subsample,
                                   "fits_done": int(np.sum(~np.isnan(table))), "fits_total": int(table.size)}
        try:
            best = best_point(grid, table)
        except RuntimeError:
            return {**summary, "best_C": None, "best_gamma": None, "cv_error": None, "cv_folds": 0,
                    "test_error": None, "confusion_matrix": None}
        # here, not at the top: each worker imports this module, and matplotlib is 0.2 s of its start
        from .plots import plot_boxplots, plot_boxplots_per_gamma, plot_heatmap

        plot_heatmap(grid, table, best["i_C"], best["i_gamma"], folder / VALIDATION_HEATMAP_STEM)
        plot_boxplots(grid, table, folder / VALIDATION_BOXPLOTS_STEM)
        summary["per_gamma_figures"] = plot_boxplots_per_gamma(grid, table, folder)
        refit = results.get(REFIT_KEY) or {}
        summary.update({"best_C": best["C"], "best_gamma": best["gamma"], "cv_error": best["cv_error"],
                        "cv_folds": best["cv_folds"], "best_tied_with": best["tied_with"],
                        "cv_error_std": float(np.nanstd(table[:, best["i_gamma"], best["i_C"]])),
                        "test_error": refit.get("test_error"), "confusion_matrix": refit.get("confusion_matrix"),
                        "n_support": refit.get("n_support"), "n_train": refit.get("n_train"),
                        "n_test": refit.get("n_test"), "backend": refit.get("backend")})
        if refit and (refit.get("C"), refit.get("gamma")) != (best["C"], best["gamma"]):
            summary["refit_note"] = "the refit used the best pair known when it started"
        return summary

    @staticmethod
    def _fits_csv(run: RunInfo) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["C", "gamma", "fold", "i_C", "i_gamma", "error", "n_support", "seconds", "rank", "host",
                         "device", "worker"])
        for item in run.items:
            record = run.records.get(item.key)
            if item.params.get("kind") != "fit" or record is None:
                continue
            params, result = item.params, record.result or {}
            writer.writerow([f"{params['C']:.6g}", f"{params['gamma']:.6g}", params["fold"], params["i_C"],
                             params["i_gamma"], f"{result.get('error', float('nan')):.6f}", result.get("n_support", ""),
                             f"{record.own_seconds:.3f}", record.rank, record.host, record.device, record.worker])
        return out.getvalue()

    def summary_markdown(self, summary: Mapping[str, Any]) -> str:
        if summary.get("best_C") is None:
            return "## Grid search\n\nNo fit finished, so there is no best (C, gamma).\n"
        lines = ["## Grid search", "",
                 "| | value |", "|---|---|",
                 f"| data set | {summary['dataset']}"
                 + (f" ({summary['subsample']} training images)" if summary.get("subsample") else "") + " |",
                 f"| grid | {summary['n_tuning']} C x {summary['n_tuning']} gamma x {summary['folds']} folds "
                 f"({summary['fits_done']} of {summary['fits_total']} fits done) |",
                 f"| best C | {summary['best_C']:.4g} |",
                 f"| best gamma | {summary['best_gamma']:.4g} |",
                 *_ties_row(summary.get("best_tied_with") or []),
                 f"| cross-validation error | {percent(summary['cv_error'])} (std over folds {percent(summary.get('cv_error_std'))}"
                 + (f"; only {summary['cv_folds']} of {summary['folds']} folds finished"
                    if summary.get("cv_folds", summary["folds"]) < summary["folds"] else "") + ") |",
                 f"| test error (refit on all training images) | {percent(summary.get('test_error'))} |", ""]
        matrix = summary.get("confusion_matrix")
        if matrix:
            n = len(matrix)
            lines += ["Confusion matrix on the test set (rows: true class, columns: predicted):", "",
                      "| true \\ predicted | " + " | ".join(str(j) for j in range(n)) + " |",
                      "|---" * (n + 1) + "|"]
            lines += [f"| **{i}** | " + " | ".join(str(v) for v in row) + " |" for i, row in enumerate(matrix)]
            lines.append("")
        lines += ["![mean validation error over the grid](validation_heatmap.png)", "",
                  "![fold errors over C, one panel per gamma](validation_boxplots.png)", ""]
        # scikit-learn's fits of one gamma and fold run together on one kernel (cuML's each on its own)
        shared = ("; the fits of one gamma and fold run together, and each row's `seconds` is an even share of their "
                  "time" if not self.use_cuml else "")
        lines += [f"Files: `validation_error.npy` (folds x gamma x C), `fits.csv` (one row per fit{shared}), "
                  "`validation_heatmap.png`/`.svg`/`.pdf`, `validation_boxplots.png`/`.svg`/`.pdf`, and the "
                  f"reference's figure per gamma `{PER_GAMMA_FOLDER}/validation_error_<i>.png`/`.pdf` "
                  f"(i = 0 for gamma {self.grid.gamma_values[0]:.3g} to {summary['n_tuning'] - 1} for "
                  f"{self.grid.gamma_values[-1]:.3g}).", ""]
        return "\n".join(lines)

    # ----- worker process -----
    def _load(self) -> Dataset:
        args = self.args
        return load_dataset(args.dataset, args.data_dir, subsample=args.subsample, seed=args.seed)

    def setup_worker(self, device: Device) -> WorkerState:
        """Read the data once, put it on the device once, and fix the folds (same on every worker)."""
        from sklearn.model_selection import StratifiedKFold

        data = self._load()
        args = self.args
        if args.cv == "stratified":
            splitter = StratifiedKFold(n_splits=args.folds, shuffle=True, random_state=seed32(args.seed))
            folds = list(splitter.split(np.zeros(len(data.y_train)), data.y_train))
        else:
            folds = reference_folds(len(data.y_train), args.folds)
        backend = make_backend(data, device.is_gpu and self.use_cuml, args.multiclass)
        return WorkerState(backend, folds, data.n_classes)

    def run_item(self, state: WorkerState, item: Item, seed: np.random.SeedSequence) -> Dict[str, Any]:
        """One fit. libsvm and cuML's SVC without probabilities use no randomness, so ``seed`` is unused."""
        from sklearn.metrics import confusion_matrix

        params, backend = item.params, state.backend
        if params["kind"] == "refit":
            rows = np.arange(len(backend.truth["train"]))
            model = backend.fit(params["C"], params["gamma"], rows)
            predicted = backend.predict(model, "test")
            truth = backend.truth["test"]
            matrix = confusion_matrix(truth, predicted, labels=np.arange(state.n_classes))
            return {"C": params["C"], "gamma": params["gamma"], "test_error": float(np.mean(predicted != truth)),
                    "confusion_matrix": matrix.tolist(), "n_support": backend.n_support(model),
                    "n_train": int(len(rows)), "n_test": int(len(truth)), "backend": backend.name}
        return self._fit(state, item, None)

    def run_group(self, state: WorkerState, items: List[Item],
                  seeds: List[np.random.SeedSequence]) -> List[Dict[str, Any]]:
        """The fits of one (gamma, fold) with different C: the training kernel is computed once
        (scikit-learn; libsvm reads it, never writes it), the same matrix each fit would make alone."""
        first = items[0].params
        kernel = state.backend.train_kernel(first["gamma"], state.folds[first["fold"]][0])
        return [self._fit(state, item, kernel) for item in items]

    def _fit(self, state: WorkerState, item: Item, kernel: Any) -> Dict[str, Any]:
        """One (C, gamma, fold) fit, scored on the fold's validation rows."""
        params, backend = item.params, state.backend
        train, validation = state.folds[params["fold"]]
        model = backend.fit(params["C"], params["gamma"], train, kernel)
        predicted = backend.predict(model, "train", validation)
        truth = backend.truth["train"][validation]
        return {"error": float(np.mean(predicted != truth)), "n_support": backend.n_support(model),
                "backend": backend.name}


#: the tied pairs summary.md names (the rest are counted; summary.json has them all)
MAX_TIES_SHOWN = 5


def _ties_row(tied: List[Mapping[str, float]]) -> List[str]:
    """summary.md's row for the other pairs at the best's cross-validation error: the first in
    (gamma, C) order was refitted, as the reference's argmin takes it."""
    if not tied:
        return []
    named = ", ".join(f"C {pair['C']:.4g} gamma {pair['gamma']:.4g}" for pair in tied[:MAX_TIES_SHOWN])
    more = f" and {len(tied) - MAX_TIES_SHOWN} more" if len(tied) > MAX_TIES_SHOWN else ""
    return [f"| tied with it (the first was refitted) | {named}{more} |"]


def _check_confusion_matrix(matrix: List[Any], n_test: int) -> None:
    """Raise ValueError unless ``matrix`` is what the refit writes: a square table of counts
    (ints, none negative) of the ``n_test`` test images; the summary and its table are made from it."""
    size = len(matrix)
    square = size > 0 and all(type(row) is list and len(row) == size for row in matrix)
    if not square or not all(type(count) is int and count >= 0 for row in matrix for count in row):
        raise ValueError("'confusion_matrix' is not a square table of counts")
    if sum(map(sum, matrix)) != n_test:
        raise ValueError(f"'confusion_matrix' counts {sum(map(sum, matrix))} test images, not n_test {n_test}")
