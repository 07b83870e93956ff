"""mnist_nn as an engine app: which fits exist, how each runs on a worker, and what rank 0 writes.

Items:
  first wave   ``b=00,c=01,f=3``: bootstrap 0, random candidate 1, validate on fold 3
  second wave  ``b=00,refit``: waits for every fit of bootstrap 0, refits the candidate with the
               lowest mean K-fold validation loss on the whole bootstrap sample
Candidates are drawn from ``--seed`` and (bootstrap, candidate) only, and the bootstrap
resampling from ``--seed`` and the bootstrap only, so results do not depend on the layout.
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from common import (
    NUMBER,
    NUMBER_OR_NONE,
    OFFLINE,
    REFERENCE_SEED,
    App,
    Device,
    Item,
    RunInfo,
    UsageError,
    add_data_arguments,
    at_least,
    check_available,
    check_data_flags,
    check_fields,
    check_range,
    ensure_available,
    load_dataset,
    percent,
    resumed_note,
    torch_seed,
)
from common.results.layout import (
    CERTAINTY_FOLDER,
    CV_RESULTS_CSV,
    ENSEMBLE_ERROR_STEM,
    ENSEMBLE_JSON,
    MODELS_DIR,
    RESULTS_CSV,
    TENSORBOARD_DIR,
    TRAINING_CURVES_STEM,
    TRAINING_LOG_CSV,
)

from .records import check_probabilities, cv_scores, encode_array, fit_key, model_stem, refit_key
from .search import TRAIN_BYTES_PER_WEIGHT, Candidate, draw_candidate, reference_candidates
from .tensorboard_log import write_fit_events

#: what a fold's fit and a refit return, and each entry of their epoch logs (``check_result``)
LOG_FIELDS = {"epoch": int, "loss": NUMBER_OR_NONE, "error": NUMBER, "samples_per_s": NUMBER, "seconds": NUMBER,
              "lr": NUMBER}
FIT_FIELDS = {"val_loss": NUMBER_OR_NONE, "val_error": NUMBER, "epochs": int, "log": list}
#: a refit's candidate as the summary and the saved model read it: search.Candidate's fields
HYPER_FIELDS = {field.name: NUMBER if field.type == "float" else int for field in dataclasses.fields(Candidate)}
REFIT_FIELDS = {"candidate": int, "hyper": dict, "cv_loss": NUMBER_OR_NONE, "epochs": int, "log": list,
                "training_error": NUMBER, "training_loss": NUMBER_OR_NONE, "test_error": NUMBER,
                "test_probabilities": dict, "weights": dict, "normalisation": dict}

if TYPE_CHECKING:
    from .train import EpochHook

#: a refit's state dict travels inside its result (the journal) up to this size; a bigger one is
#: written by the worker straight into ``<results>/models/`` (shared between nodes on a cluster)
EMBED_LIMIT_BYTES = 64 * 2 ** 20
#: the reference's 12 12 is 732 fits of about a minute each on an A100; past this many the item
#: list alone takes rank 0 minutes and gigabytes, and the run would take years
MAX_FITS = 100_000
#: what a missing MNIST's message offers instead: the README's smoke test on any machine (without the
#: --max-macs the one candidate drawn on the digits can have 274M weights: minutes to hours on a CPU)
OFFLINE_SMOKE = "--dataset digits --max-macs 3e5"
#: --max-macs at least this: below it, drawing a candidate takes thousands of tries (0.07% of the
#: reference's nets take at most 300,000 multiply-adds an image)
MIN_MAX_MACS = 300_000
#: on a CPU, rank 0 warns before a run with nets past this many weights: each of their fits takes
#: minutes to hours there
CPU_WARN_WEIGHTS = 100_000_000

logger = logging.getLogger(__name__)


class MnistNN(App):
    name = "mnist_nn"
    description = ("Fits an ensemble of conv nets: each is tuned by random search with K-fold cross-validation "
                   "on its own bootstrap (within folds) sample; reports each model's and the ensemble's test error")
    default_seed = REFERENCE_SEED

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("n_bootstrap", type=at_least(1), help="number of bootstrap samples (models)")
        parser.add_argument("n_tuning", type=at_least(1), help="random candidates tried per bootstrap sample")
        add_data_arguments(parser)
        parser.add_argument("--max-epochs", type=at_least(1), default=20,
                            help="most epochs of a fit (it stops earlier once the loss falls by less than 20%%)")
        parser.add_argument("--batch-size", type=at_least(1), default=10, help="images per SGD step")
        parser.add_argument("--draws", choices=("reference", "keyed"), default="reference",
                            help="reference: the reference's bootstraps and candidates for the same --seed and "
                                 "training-set size (one generator per bootstrap: permutation, contiguous folds "
                                 "resampled within themselves, then the candidates in order); keyed: each "
                                 "bootstrap and candidate from its own key (shuffled KFold; candidates do not "
                                 "depend on the data size)")
        parser.add_argument("--epoch-loss", choices=("reference", "mean"), default="reference",
                            help="reference: an epoch's (and a validation fold's) loss is the sum of its batches' "
                                 "mean losses and a fit stops once it is above 0.8 x the previous epoch's; mean: "
                                 "the mean over images, stopping once not below 0.8 x (fold losses comparable "
                                 "whatever the fold sizes)")
        parser.add_argument("--normalise", choices=("reference", "data"), default="reference",
                            help="reference: pixels x/255 - 0.5 (ToTensor, Normalize(0.5, 1)); data: scaled by the "
                                 "training set's own mean and standard deviation")
        parser.add_argument("--max-macs", type=at_least(MIN_MAX_MACS, float), default=None, metavar="N",
                            help="NOT the reference's search: draw only nets whose forward pass takes at most N "
                                 "multiply-adds an image (so at most N weights; e.g. 3e5, the least taken), redrawing "
                                 "bigger ones; for CPUs, where the reference's nets of hundreds of millions of weights "
                                 "take hours")
        parser.add_argument("--certainty-images", type=at_least(0), default=100, metavar="N",
                            help="a certainty figure (each digit's probability over the models, as the reference's) "
                                 "for each of the first N test images, and one for the first test image the "
                                 "ensemble misclassifies, in <results>/certainty/ (0: none; outputs only, so "
                                 "--resume may change it)")

    # ----- every rank (check_arguments also in python -m common.slurm) -----
    def check_arguments(self) -> None:
        args = self.args
        fits = args.n_bootstrap * (args.n_tuning * args.folds + 1)
        if fits > MAX_FITS:
            raise UsageError(f"{args.n_bootstrap} bootstraps x ({args.n_tuning} candidates x {args.folds} folds + 1 "
                             f"refit) is {fits:,} fits; at most {MAX_FITS:,} (the reference's 12 12 is 732)")
        check_data_flags(args)

    def validate(self) -> None:
        check_available(self.args.dataset, self.args.data_dir, self._offline())

    def fingerprint(self) -> Dict[str, Any]:
        args = self.args
        limit = {} if args.max_macs is None else {"max_macs": args.max_macs}  # journals from before it resume
        return {"n_bootstrap": args.n_bootstrap, "n_tuning": args.n_tuning,
                "dataset": args.dataset, "subsample": args.subsample, "max_epochs": args.max_epochs,
                "batch_size": args.batch_size, "folds": args.folds, **limit,
                **{name: "reference" for name in ("draws", "epoch_loss", "normalise")
                   if getattr(args, name) == "reference"}}

    def fingerprint_left_out(self) -> Dict[str, Any]:
        """A journal from before --draws, --epoch-loss and --normalise was made their other way; the
        fingerprint still leaves those values out (so such journals resume)."""
        return {"draws": "keyed", "epoch_loss": "mean", "normalise": "data"}

    # ----- rank 0 -----
    def prepare(self) -> None:
        args = self.args
        ensure_available(args.dataset, args.data_dir, self._offline())
        dataset = load_dataset(args.dataset, args.data_dir, subsample=args.subsample, seed=args.seed)
        if len(dataset.y_train) < 2 * args.folds:
            raise UsageError(f"{args.dataset}: {len(dataset.y_train)} training images are too few for "
                             f"--folds {args.folds}")
        if args.batch_size > len(dataset.y_train):
            raise UsageError(f"--batch-size {args.batch_size} is more than the {len(dataset.y_train)} training images")
        self.n_train = len(dataset.y_train)
        self._data_identity = dataset.identity()

    def data_fingerprint(self) -> Optional[str]:
        return getattr(self, "_data_identity", None)

    def candidate(self, bootstrap: int, number: int) -> Candidate:
        return self.candidates(bootstrap)[number]

    def candidates(self, bootstrap: int) -> List[Candidate]:
        """With --draws reference, needs ``n_train`` (set by ``prepare``)."""
        args = self.args
        cache = self.__dict__.setdefault("_candidates", {})
        if bootstrap not in cache:
            if args.draws == "reference":
                cache[bootstrap] = reference_candidates(args.seed, bootstrap, self.n_train, args.folds,
                                                        args.n_tuning, args.max_macs)
            else:
                cache[bootstrap] = [draw_candidate(args.seed, bootstrap, c, args.max_macs)
                                    for c in range(args.n_tuning)]
        return cache[bootstrap]

    def items(self) -> List[Item]:
        args = self.args
        share = (args.folds - 1) / args.folds
        items: List[Item] = []
        refits: List[Item] = []
        every: List[Candidate] = []
        for b in range(args.n_bootstrap):
            keys, drawn = [], self.candidates(b)
            every += drawn
            for c, candidate in enumerate(drawn):
                for f in range(args.folds):
                    keys.append(fit_key(b, c, f))
                    items.append(Item(keys[-1], {"kind": "fit", "bootstrap": b, "candidate": c, "fold": f,
                                                 "hyper": candidate.as_dict()}, cost=candidate.cost * share))
            biggest = max(candidate.cost for candidate in drawn)
            refits.append(Item(refit_key(b), {"kind": "refit", "bootstrap": b}, cost=biggest, after=tuple(keys)))
        if not self.on_gpu():
            warn_big_nets(every)
        return items + refits

    def complete(self, item: Item, results: Mapping[str, Any]) -> Item:
        """Choose the candidate with the lowest mean validation loss over all K folds."""
        b = item.params["bootstrap"]
        scores = cv_scores(results, b, self.args.n_tuning, self.args.folds)
        if not scores:
            raise ValueError(f"bootstrap {b}: no candidate has all {self.args.folds} folds done")
        best = min(scores, key=lambda c: (scores[c], c))
        params = dict(item.params, candidate=best, hyper=self.candidate(b, best).as_dict(),
                      cv_loss=None if math.isinf(scores[best]) else scores[best])
        return Item(item.key, params, cost=item.cost, after=item.after)

    def check_result(self, key: str, result: Any) -> None:
        refit = key.endswith(",refit")
        check_fields(result, REFIT_FIELDS if refit else FIT_FIELDS)
        check_range(result, ("training_error", "test_error") if refit else ("val_error",), 0.0, 1.0)
        check_range(result, ("epochs",), 0)
        for entry in result["log"]:
            check_fields(entry, LOG_FIELDS)
            check_range(entry, ("error",), 0.0, 1.0)
        if refit:
            check_fields(result["hyper"], HYPER_FIELDS)
            check_fields(result["test_probabilities"], {"shape": list, "float32_base64": str})
            check_probabilities(result["test_probabilities"])
            check_fields(result["weights"], {"sha256": str, "bytes": int, "embedded": (str, type(None))})
            check_fields(result["normalisation"], {"mean": NUMBER, "std": NUMBER})

    def finish(self, run: RunInfo) -> Dict[str, Any]:
        from .report import write_outputs

        return write_outputs(self, run)

    def _offline(self) -> str:
        """What a missing MNIST's line offers instead: the smoke test's flags, --max-macs where not given."""
        return OFFLINE_SMOKE if self.args.max_macs is None else OFFLINE

    def output_names(self) -> tuple:
        """What finish and the workers write (the reference's figure names too: prob_*, test_*)."""
        return (RESULTS_CSV, TRAINING_LOG_CSV, CV_RESULTS_CSV, ENSEMBLE_JSON, f"{ENSEMBLE_ERROR_STEM}.*",
                f"{TRAINING_CURVES_STEM}.*", f"{CERTAINTY_FOLDER}*", "prob_*", "test_[0-9]*", "test_errn*", MODELS_DIR,
                TENSORBOARD_DIR)

    def headline(self, run: RunInfo, summary: Mapping[str, Any]) -> List[str]:
        """The reference's closing prints: the run's wall time, the ensemble's (majority vote) test error."""
        if summary.get("ensemble_test_error") is None:
            return []
        earlier = summary.get("items_resumed") or 0
        since = resumed_note(summary["items_done"] - earlier, earlier, "items")
        from .report import partial_note

        return [f"Time taken {summary['wall_seconds']} s{since}",
                f"ensemble test error{partial_note(summary)}: {summary['ensemble_test_error']}"]

    def answer(self, summary: Mapping[str, Any]) -> Optional[str]:
        from .report import partial_note

        if summary.get("ensemble_test_error") is None:
            return None
        error = percent(summary["ensemble_test_error"])  # as summary.md's tables and figure (stdout: the reference's fraction)
        if summary["models"] == 1 or partial_note(summary):  # one model is no vote; the note counts them
            return f"ensemble test error{partial_note(summary)}: {error}"
        return f"ensemble test error: {error} (majority vote of {summary['models']} models)"

    def summary_markdown(self, summary: Mapping[str, Any]) -> str:
        from .report import summary_markdown

        return summary_markdown(summary)

    # ----- worker -----
    def setup_worker(self, device: Device) -> Dict[str, Any]:
        """Load the data set onto this worker's device once; make its runs reproducible."""
        from .train import keep_freed_memory, make_reproducible, to_device

        make_reproducible()  # for the worker's life
        if not device.is_gpu:
            keep_freed_memory()
        args = self.args
        dataset = load_dataset(args.dataset, args.data_dir, subsample=args.subsample, seed=args.seed)
        # --workers-per-gpu > 1: what one worker's caching allocator keeps, its siblings cannot use
        # (require_gpu_room counts only its own cache), so each item gives it back
        return {"data": to_device(dataset, device.torch_device, args.normalise), "folds": {},
                "release_cache": device.is_gpu and device.slot is not None}

    def folds(self, state: Dict[str, Any], bootstrap: int) -> List[np.ndarray]:
        from .sampling import bootstrap_folds, reference_bootstrap

        if bootstrap not in state["folds"] and self.args.draws == "reference":
            state["folds"][bootstrap] = reference_bootstrap(len(state["data"].y_train), self.args.folds,
                                                            self.args.seed, bootstrap)[0]
        if bootstrap not in state["folds"]:
            state["folds"][bootstrap] = bootstrap_folds(len(state["data"].y_train), self.args.folds, self.args.seed,
                                                        bootstrap)
        return state["folds"][bootstrap]

    def run_item(self, state: Dict[str, Any], item: Item, seed: np.random.SeedSequence) -> Dict[str, Any]:
        try:
            if item.params["kind"] == "fit":
                result = self.fit_fold(state, item, seed)
            else:
                result = self.refit(state, item, seed)
        finally:
            if state.get("release_cache"):  # the item's net and activations are freed by now
                import torch

                torch.cuda.empty_cache()
        write_fit_events(self.args.results, item.key, result["log"])  # where tensorboard is installed
        return result

    def fit_fold(self, state: Dict[str, Any], item: Item, seed: np.random.SeedSequence) -> Dict[str, Any]:
        """One candidate trained on the other folds of its bootstrap sample, scored on its own fold."""
        import torch

        from .sampling import fold_indexes
        from .train import evaluate, fit

        args, data, params = self.args, state["data"], item.params
        training, validation = fold_indexes(self.folds(state, params["bootstrap"]), params["fold"])
        net, log = fit(data.x_train, data.y_train, training, Candidate(**params["hyper"]), args.max_epochs,
                       args.batch_size, torch_seed(seed), on_epoch=epoch_logger(item.key), epoch_loss=args.epoch_loss)
        rows = torch.from_numpy(validation).to(data.device)
        scores = evaluate(net, data.x_train.index_select(0, rows), data.y_train.index_select(0, rows),
                          args.batch_size if args.epoch_loss == "reference" else None)
        return {"val_loss": finite_or_none(scores["loss"]), "val_error": scores["error"], "epochs": len(log),
                "log": log}

    def refit(self, state: Dict[str, Any], item: Item, seed: np.random.SeedSequence) -> Dict[str, Any]:
        """The chosen candidate on the whole bootstrap sample; scored on the training and test sets."""
        import torch

        from .sampling import bootstrap_sample
        from .train import evaluate, fit, predict_logits

        args, data, params = self.args, state["data"], item.params
        b = params["bootstrap"]
        candidate = Candidate(**params["hyper"])
        net, log = fit(data.x_train, data.y_train, bootstrap_sample(self.folds(state, b)), candidate, args.max_epochs,
                       args.batch_size, torch_seed(seed), on_epoch=epoch_logger(item.key), epoch_loss=args.epoch_loss)
        train_scores = evaluate(net, data.x_train, data.y_train)
        logits = predict_logits(net, data.x_test)
        probabilities = torch.softmax(logits.float(), 1).cpu().numpy().astype("<f4")
        test_error = float((logits.argmax(1) != data.y_test).double().mean())  # float64, as numpy's mean
        return {"candidate": params["candidate"], "hyper": candidate.as_dict(), "cv_loss": params["cv_loss"],
                "epochs": len(log), "log": log, "training_error": train_scores["error"],
                "training_loss": finite_or_none(train_scores["loss"]), "test_error": test_error,
                "test_probabilities": encode_array(probabilities),
                "weights": self.keep_weights(net, b),
                "normalisation": {"mean": data.mean, "std": data.std}}

    def keep_weights(self, net: Any, bootstrap: int) -> Dict[str, Any]:
        """The state dict as torch.save bytes: in the result when small, else as a file in the results.

        A big net (the largest reference nets: 1.46 billion weights, 5.8 GB) goes straight from its
        host copy into the file, hashed as it is written, rather than through a BytesIO and the bytes
        copied out of it (three host copies, about 17 GB)."""
        import hashlib
        import io

        import torch

        from common import atomic_write_with

        host = {k: v.detach().cpu() for k, v in net.state_dict().items()}
        if sum(t.numel() * t.element_size() for t in host.values()) <= EMBED_LIMIT_BYTES:
            buffer = io.BytesIO()
            torch.save(host, buffer)
            raw = buffer.getbuffer()
            if len(raw) <= EMBED_LIMIT_BYTES:
                return {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw),
                        "embedded": base64.b64encode(raw).decode("ascii")}
        writer = HashingWriter()
        atomic_write_with(Path(self.args.results) / MODELS_DIR / f"{model_stem(bootstrap)}.pt",
                          lambda handle: torch.save(host, writer.into(handle)))
        return {"sha256": writer.sha256.hexdigest(), "bytes": writer.bytes, "embedded": None}


class HashingWriter:
    """A write-only file that passes what it is given on to ``handle`` and hashes it on the way."""

    def __init__(self) -> None:
        import hashlib

        self.sha256, self.bytes, self.handle = hashlib.sha256(), 0, None

    def into(self, handle: Any) -> "HashingWriter":
        self.handle = handle
        return self

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        self.bytes += len(memoryview(data).cast("B"))
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


def epoch_logger(key: str) -> EpochHook:
    """A line in the worker's log (``<results>/logs/``) per epoch of item ``key``'s fit, as it
    ends: ``tail -f`` shows how far a long fit has got."""
    def on_epoch(entry: Dict[str, Any]) -> None:
        loss = "diverged" if entry["loss"] is None else f"{entry['loss']:.4f}"
        logger.info("%s epoch %d: loss %s, error %.4f, %.0f samples/s", key, entry["epoch"], loss, entry["error"],
                    entry["samples_per_s"])
    return on_epoch


def warn_big_nets(candidates: Sequence[Candidate]) -> None:
    """Rank 0, on CPUs, before the run: once, how big the biggest nets are and how to draw smaller ones
    (in the engine's log: on stderr with the rank's prefix, and in logs/rank0.log)."""
    big = [c for c in candidates if c.n_weights > CPU_WARN_WEIGHTS]
    if big:
        top = max(big, key=lambda c: c.n_weights)
        rank_log = logging.getLogger("multinode_gpu")
        if len(big) == 1:
            which = "the one candidate has" if len(candidates) == 1 else f"1 of the {len(candidates)} candidates has"
            size = f"{top.n_weights / 1e6:.0f}M weights"
        else:
            which = f"{len(big)} of the {len(candidates)} candidates have"
            size = f"over {CPU_WARN_WEIGHTS // 10 ** 6}M weights, the biggest {top.n_weights / 1e6:.0f}M"
        rank_log.warning("%s %s (%s: about %.1f GiB to train); on a CPU each of %s fits takes minutes to hours. "
                         "--max-macs N draws only nets of at most N multiply-adds an image (not the reference's "
                         "search; e.g. --max-macs 3e5)", which, size, top.describe(),
                         top.n_weights * TRAIN_BYTES_PER_WEIGHT / 2 ** 30, "its" if len(big) == 1 else "their")


def finite_or_none(value: float) -> Optional[float]:
    """JSON has no NaN or infinity: a diverged fit's loss is recorded as null."""
    return value if math.isfinite(value) else None
