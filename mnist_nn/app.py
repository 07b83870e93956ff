"""mnist_nn as an engine app: which fits exist, how each runs on a worker, and what rank 0 writes.

Items:
  first wave   ``b=00,c=01,f=3``: bootstrap 0, random candidate 1, validate on fold 3; the folds
               of one candidate form a group (``b=00,c=01``) that a worker trains side by side
  second wave  ``b=00,refit``: waits for every fit of bootstrap 0, refits the candidate with the
               lowest mean K-fold validation loss on the whole bootstrap sample
Candidates are drawn from ``--seed`` and (bootstrap, candidate) only, and the bootstrap
resampling from ``--seed`` and the bootstrap only, so results do not depend on the layout.
"""
from __future__ import annotations

import argparse
import base64
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from common.app import NUMBER, NUMBER_OR_NONE, App, RunInfo, check_fields
from common.cli import at_least
from common.data import add_data_arguments, check_data_arguments, ensure_available, load_dataset
from common.devices import Device
from common.errors import UsageError
from common.items import Item, torch_seed

from .search import Candidate, draw_candidate
from .stacking import stacks_on_cpu

#: what a fold's fit and a refit return, and each entry of their epoch logs (``check_result``)
LOG_FIELDS = {"epoch": int, "loss": NUMBER_OR_NONE, "error": NUMBER, "samples_per_s": NUMBER, "seconds": NUMBER,
              "lr": NUMBER}
FIT_FIELDS = {"val_loss": NUMBER_OR_NONE, "val_error": NUMBER, "epochs": int, "log": list}
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

logger = logging.getLogger(__name__)


def fit_key(bootstrap: int, candidate: int, fold: int) -> str:
    return f"b={bootstrap:02d},c={candidate:02d},f={fold}"


def refit_key(bootstrap: int) -> str:
    return f"b={bootstrap:02d},refit"


def model_stem(bootstrap: int) -> str:
    return f"bootstrap-{bootstrap}"


class MnistNN(App):
    name = "mnist_nn"
    description = ("Fits an ensemble of conv nets: each is tuned by random search with K-fold cross-validation "
                   "on its own bootstrap (within folds) sample; reports each model's and the ensemble's test error")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("n_bootstrap", type=at_least(1), help="number of bootstrap samples (models)")
        parser.add_argument("n_tuning", type=at_least(1), help="random candidates tried per bootstrap sample")
        add_data_arguments(parser)
        parser.add_argument("--max-epochs", type=at_least(1), default=20,
                            help="most epochs of a fit (it stops earlier once the loss falls by less than 20%%)")
        parser.add_argument("--batch-size", type=at_least(1), default=10, help="images per SGD step")

    # ----- every rank -----
    def validate(self) -> None:
        args = self.args
        fits = args.n_bootstrap * (args.n_tuning * args.folds + 1)
        if fits > MAX_FITS:
            raise UsageError(f"{args.n_bootstrap} bootstraps x ({args.n_tuning} candidates x {args.folds} folds + 1 "
                             f"refit) is {fits:,} fits; at most {MAX_FITS:,} (the reference's 12 12 is 732)")
        check_data_arguments(args)

    def fingerprint(self) -> Dict[str, Any]:
        args = self.args
        return {"n_bootstrap": args.n_bootstrap, "n_tuning": args.n_tuning, "seed": args.seed,
                "dataset": args.dataset, "subsample": args.subsample, "max_epochs": args.max_epochs,
                "batch_size": args.batch_size, "folds": args.folds}

    # ----- rank 0 -----
    def prepare(self) -> None:
        args = self.args
        ensure_available(args.dataset, args.data_dir)
        dataset = load_dataset(args.dataset, args.data_dir, subsample=args.subsample, seed=args.seed)
        if len(dataset.y_train) < 2 * args.folds:
            raise UsageError(f"{args.dataset}: {len(dataset.y_train)} training images are too few for "
                             f"--folds {args.folds}")
        if args.batch_size > len(dataset.y_train):
            raise UsageError(f"--batch-size {args.batch_size} is more than the {len(dataset.y_train)} training images")

    def candidates(self, bootstrap: int) -> List[Candidate]:
        return [draw_candidate(self.args.seed, bootstrap, c) for c in range(self.args.n_tuning)]

    def items(self) -> List[Item]:
        args = self.args
        share = (args.folds - 1) / args.folds
        items: List[Item] = []
        refits: List[Item] = []
        for b in range(args.n_bootstrap):
            keys, drawn = [], self.candidates(b)
            for c, candidate in enumerate(drawn):
                for f in range(args.folds):
                    keys.append(fit_key(b, c, f))
                    items.append(Item(keys[-1], {"kind": "fit", "bootstrap": b, "candidate": c, "fold": f,
                                                 "hyper": candidate.as_dict()}, cost=candidate.cost * share,
                                      group=self.group(b, c, candidate)))
            biggest = max(candidate.cost for candidate in drawn)
            refits.append(Item(refit_key(b), {"kind": "refit", "bootstrap": b}, cost=biggest, after=tuple(keys)))
        return items + refits

    def group(self, bootstrap: int, number: int, candidate: Candidate) -> str:
        """The folds of a candidate go to one worker together, to train stacked: always on GPUs; on
        CPUs (``--gpu cpu``, or no GPU here) only where stacking measured faster (small nets, see
        ``stacking.stacks_on_cpu``), bigger nets' folds being better spread over the workers.
        Results are the same either way."""
        if not self.on_gpu() and not stacks_on_cpu(candidate, self.args.folds):
            return ""
        return f"b={bootstrap:02d},c={number:02d}"

    def complete(self, item: Item, results: Mapping[str, Any]) -> Item:
        """Choose the candidate with the lowest mean validation loss over all K folds."""
        b = item.params["bootstrap"]
        scores = cv_scores(results, b, self.args.n_tuning, self.args.folds)
        if not scores:
            raise ValueError(f"bootstrap {b}: no candidate has all {self.args.folds} folds done")
        best = min(scores, key=lambda c: (scores[c], c))
        params = dict(item.params, candidate=best, hyper=draw_candidate(self.args.seed, b, best).as_dict(),
                      cv_loss=None if math.isinf(scores[best]) else scores[best])
        return Item(item.key, params, cost=item.cost, after=item.after)

    def check_result(self, key: str, result: Any) -> None:
        refit = key.endswith(",refit")
        check_fields(result, REFIT_FIELDS if refit else FIT_FIELDS)
        for entry in result["log"]:
            check_fields(entry, LOG_FIELDS)
        if refit:
            check_fields(result["test_probabilities"], {"shape": list, "float32_base64": str})
            check_fields(result["weights"], {"sha256": str, "bytes": int, "embedded": (str, type(None))})
            check_fields(result["normalisation"], {"mean": NUMBER, "std": NUMBER})

    def finish(self, run: RunInfo) -> Dict[str, Any]:
        from .report import write_outputs

        return write_outputs(self, run)

    def summary_markdown(self, summary: Mapping[str, Any]) -> str:
        from .report import summary_markdown

        return summary_markdown(summary)

    # ----- worker -----
    def setup_worker(self, device: Device) -> Dict[str, Any]:
        """Load the data set onto this worker's device once; make its runs reproducible."""
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        import torch

        from .train import keep_freed_memory, to_device

        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        # full float32 everywhere, as training's own products: no TF32 in evaluation's cuDNN convolution
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        if not device.is_gpu:
            from .kernels import load

            keep_freed_memory()
            logger.info(load()[1])  # built here, once per worker, before any fit is timed
        args = self.args
        dataset = load_dataset(args.dataset, args.data_dir, subsample=args.subsample, seed=args.seed)
        return {"data": to_device(dataset, device.torch_device), "folds": {}}

    def folds(self, state: Dict[str, Any], bootstrap: int) -> List[np.ndarray]:
        from .sampling import bootstrap_folds

        if bootstrap not in state["folds"]:
            state["folds"][bootstrap] = bootstrap_folds(len(state["data"].y_train), self.args.folds, self.args.seed,
                                                        bootstrap)
        return state["folds"][bootstrap]

    def run_item(self, state: Dict[str, Any], item: Item, seed: np.random.SeedSequence) -> Dict[str, Any]:
        if item.params["kind"] == "fit":
            return self.run_group(state, [item], [seed])[0]
        return self.refit(state, item, seed)

    def run_group(self, state: Dict[str, Any], items: List[Item],
                  seeds: List[np.random.SeedSequence]) -> List[Dict[str, Any]]:
        """The folds of one candidate (whichever arrived) train side by side where that is faster
        (``stacking.stack_size``), else one after the other or in smaller stacks.

        A fold's result is the same whichever folds came with it: a stacked net does exactly
        the arithmetic it would do alone (``train.fit_group``).
        """
        import torch

        from .sampling import fold_indexes
        from .stacking import stack_size
        from .train import evaluate, fit_group, net_from_state

        args, data = self.args, state["data"]
        candidate = Candidate(**items[0].params["hyper"])
        splits = [fold_indexes(self.folds(state, item.params["bootstrap"]), item.params["fold"]) for item in items]
        trainings, init_seeds = [training for training, _ in splits], [torch_seed(seed) for seed in seeds]
        size = stack_size(candidate, len(items), data.device)
        stacks = [list(range(len(items)))[start:start + size] for start in range(0, len(items), size)]
        results: Dict[int, Dict[str, Any]] = {}
        for stack in stacks:  # each stack's nets are scored and let go before the next one trains
            trained = fit_group(data.x_train, data.y_train, [trainings[k] for k in stack], candidate,
                                args.max_epochs, args.batch_size, [init_seeds[k] for k in stack],
                                on_epoch=epoch_logger([items[k].key for k in stack]))
            for k, (weights, log) in zip(stack, trained):
                rows = torch.from_numpy(splits[k][1]).to(data.device)
                scores = evaluate(net_from_state(candidate, weights), data.x_train.index_select(0, rows),
                                  data.y_train.index_select(0, rows))
                results[k] = {"val_loss": finite_or_none(scores["loss"]), "val_error": scores["error"],
                              "epochs": len(log), "log": log}
            del trained, weights  # the last net's state too: the next stack's budget has no room for it
        return [results[k] for k in range(len(items))]

    def refit(self, state: Dict[str, Any], item: Item, seed: np.random.SeedSequence) -> Dict[str, Any]:
        """The chosen candidate on the whole bootstrap sample; scored on the training and test sets."""
        import torch

        from .sampling import bootstrap_sample
        from .train import evaluate, fit, predict_logits

        args, data, params = self.args, state["data"], item.params
        b = params["bootstrap"]
        candidate = Candidate(**params["hyper"])
        net, log = fit(data.x_train, data.y_train, bootstrap_sample(self.folds(state, b)), candidate, args.max_epochs,
                       args.batch_size, torch_seed(seed), on_epoch=epoch_logger([item.key]))
        train_scores = evaluate(net, data.x_train, data.y_train)
        logits = predict_logits(net, data.x_test)
        probabilities = torch.softmax(logits.float(), 1).cpu().numpy().astype("<f4")
        test_error = float((logits.argmax(1) != data.y_test).float().mean())
        return {"candidate": params["candidate"], "hyper": candidate.as_dict(), "cv_loss": params["cv_loss"],
                "epochs": len(log), "log": log, "training_error": train_scores["error"],
                "training_loss": finite_or_none(train_scores["loss"]), "test_error": test_error,
                "test_probabilities": encode_array(probabilities),
                "weights": self.keep_weights(net, b),
                "normalisation": {"mean": data.mean, "std": data.std}}

    def keep_weights(self, net: Any, bootstrap: int) -> Dict[str, Any]:
        """The state dict as torch.save bytes: in the result when small, else as a file in the results."""
        import hashlib
        import io

        import torch

        from common.outputs import atomic_write_bytes

        buffer = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in net.state_dict().items()}, buffer)
        raw = buffer.getvalue()
        digest = hashlib.sha256(raw).hexdigest()
        if len(raw) <= EMBED_LIMIT_BYTES:
            return {"sha256": digest, "bytes": len(raw), "embedded": base64.b64encode(raw).decode("ascii")}
        atomic_write_bytes(Path(self.args.results) / "models" / f"{model_stem(bootstrap)}.pt", raw)
        return {"sha256": digest, "bytes": len(raw), "embedded": None}


def cv_scores(results: Mapping[str, Any], bootstrap: int, n_tuning: int, folds: int) -> Dict[int, float]:
    """Candidate -> mean validation loss, for candidates whose K folds are all done (diverged = inf)."""
    scores = {}
    for c in range(n_tuning):
        found = [results.get(fit_key(bootstrap, c, f)) for f in range(folds)]
        if any(result is None for result in found):
            continue
        losses = [math.inf if r["val_loss"] is None else r["val_loss"] for r in found]
        scores[c] = float(np.mean(losses))
    return scores


def epoch_logger(keys: Sequence[str]) -> EpochHook:
    """A line in the worker's log (``<results>/logs/``) per epoch of fit k (``keys[k]``), as it
    ends: ``tail -f`` shows how far a long fit has got."""
    def on_epoch(k: int, entry: Dict[str, Any]) -> None:
        loss = "diverged" if entry["loss"] is None else f"{entry['loss']:.4f}"
        logger.info("%s epoch %d: loss %s, error %.4f, %.0f samples/s", keys[k], entry["epoch"], loss, entry["error"],
                    entry["samples_per_s"])
    return on_epoch


def finite_or_none(value: float) -> Optional[float]:
    """JSON has no NaN or infinity: a diverged fit's loss is recorded as null."""
    return value if math.isfinite(value) else None


def encode_array(array: np.ndarray) -> Dict[str, Any]:
    """A float32 array as base64 of its little-endian bytes: exact, and 3x smaller than JSON numbers."""
    return {"shape": list(array.shape), "float32_base64": base64.b64encode(array.tobytes()).decode("ascii")}


def decode_array(encoded: Mapping[str, Any]) -> np.ndarray:
    raw = base64.b64decode(encoded["float32_base64"])
    return np.frombuffer(raw, dtype="<f4").reshape(encoded["shape"]).astype(np.float32)
