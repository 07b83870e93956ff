"""A small engine app for the engine's own tests and benchmarks.

python tests/toy_app.py N [--sleep S] [--done-dir D] [--fail-key K] [--kill-key K] [--slow-key K] [--gil-key K] [--lognormal SIGMA] [--wave]
Each item returns numbers drawn from its own seed, so results show whether seeding is right.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# a slow import (the tests' stand-in for a worker importing torch), in the rank and in each worker
time.sleep(float(os.environ.get("TOY_IMPORT_SLEEP", "0")))

from common import App, Item, RunInfo, atomic_write_json, atomic_write_text  # noqa: E402


class ToyApp(App):
    name = "toy"
    description = "Toy items for the engine's tests"

    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument("n_items", type=int)
        parser.add_argument("--sleep", type=float, default=0.0, help="seconds per item (mean if --lognormal)")
        parser.add_argument("--lognormal", type=float, default=0.0, help="sigma of lognormal item durations")
        parser.add_argument("--ascending", action="store_true", help="durations rise with the item number (a grid)")
        parser.add_argument("--fail-key", default=None, help="this item always raises")
        parser.add_argument("--kill-key", default=None, help="this item SIGKILLs its worker on the first attempt")
        parser.add_argument("--usr2-key", default=None, help="this item sends SIGUSR2 to its worker, every attempt")
        parser.add_argument("--slow-key", default=None, help="this item sleeps --slow-seconds (every attempt)")
        parser.add_argument("--slow-seconds", type=float, default=3600.0)
        parser.add_argument("--gil-key", default=None,
                            help="on its first attempt this item hangs in C code holding the GIL (libc sleep through "
                                 "ctypes.PyDLL, which keeps the GIL) for --gil-seconds")
        parser.add_argument("--gil-seconds", type=int, default=3600)
        parser.add_argument("--marker-dir", type=Path, default=None, help="each run of an item touches a file here")
        parser.add_argument("--done-dir", type=Path, default=None,
                            help="each item that ends writes its end time (epoch s) to a file named by its key here")
        parser.add_argument("--wave", action="store_true", help="add a second wave: one sum per 4 items")
        parser.add_argument("--broken-setup", action="store_true", help="every worker fails to start")
        parser.add_argument("--crashing-setup", action="store_true", help="every worker dies (SIGKILL) while starting")
        parser.add_argument("--swallowing-setup", type=float, default=0.0,
                            help="every worker's set-up sleeps this long inside a bare except, as a library's "
                                 "import may: a signal's exception raised there is swallowed")
        parser.add_argument("--stubborn-setup-rank0", type=float, default=0.0,
                            help="rank 0's workers' set-up takes this long whatever signal comes (as a long import in "
                                 "C code would)")
        parser.add_argument("--checking-seconds", type=float, default=0.0,
                            help="validate() runs the program sleep for this long, and refuses the run if it fails")
        parser.add_argument("--swallowing-seed-form", type=float, default=0.0,
                            help="a worker's first read of the app's seed_form sleeps this long inside a bare except "
                                 "(code of the worker's own start-up that swallows a signal's exception)")
        parser.add_argument("--swallow-key", default=None,
                            help="this item sleeps --slow-seconds inside a bare except, as an item's library may: "
                                 "its rank's signal to end the worker is swallowed")
        parser.add_argument("--spawn-markers", type=Path, default=None,
                            help="the rank touches a file here each time it pickles the app for a worker it spawns")
        parser.add_argument("--broken-finish", action="store_true", help="rank 0's finish() raises")
        parser.add_argument("--finish-seconds", type=float, default=0.0,
                            help="rank 0's finish() takes this long (a slow figure) before it writes values.json")
        parser.add_argument("--group", type=int, default=0, help="items i // GROUP form a group run together")
        parser.add_argument("--child-seconds", type=float, default=0.0,
                            help="each item runs the program sleep for this long and fails if it does not end well "
                                 "(an item's own tool)")

    @property
    def seed_form(self):
        if self.args.swallowing_seed_form and multiprocessing.parent_process() is not None:
            try:
                time.sleep(self.args.swallowing_seed_form)
            except:  # noqa: E722 - what the option stands for
                pass
        return "sequence"

    def __getstate__(self):
        # pickled by the rank for each worker it spawns (the spawn start method): counted where asked
        if self.args.spawn_markers is not None:
            self.args.spawn_markers.mkdir(parents=True, exist_ok=True)
            (self.args.spawn_markers / f"{os.getpid()}-{time.monotonic_ns()}").touch()
        return self.__dict__

    def validate(self):
        from common import UsageError

        if self.args.n_items < 1:
            raise UsageError(f"n_items must be at least 1, got {self.args.n_items}")
        self.on_rank0 = os.environ.get("PMI_RANK", "0") == "0"  # MPICH's mpiexec; its workers get this app
        if self.args.checking_seconds:  # a check that runs a program (as a data set's download does)
            print("checking", flush=True)
            if subprocess.run(["sleep", str(self.args.checking_seconds)]).returncode != 0:
                raise UsageError("the check's program failed")

    def fingerprint(self):
        return {"n_items": self.args.n_items, "wave": self.args.wave,
                "lognormal": self.args.lognormal}

    def durations(self):
        rng = np.random.default_rng(12345)
        if self.args.lognormal:
            raw = rng.lognormal(0.0, self.args.lognormal, self.args.n_items)
            raw = np.sort(raw) if getattr(self.args, "ascending", False) else raw
            return raw / raw.mean() * self.args.sleep
        return np.full(self.args.n_items, self.args.sleep)

    def items(self):
        durations = self.durations()
        group = self.args.group
        items = [Item(f"item-{i:04d}", {"i": i, "sleep": float(durations[i])}, cost=float(durations[i]),
                      group=f"g{i // group}" if group else "")
                 for i in range(self.args.n_items)]
        if self.args.wave:
            for g in range(0, self.args.n_items, 4):
                deps = tuple(f"item-{i:04d}" for i in range(g, min(g + 4, self.args.n_items)))
                items.append(Item(f"sum-{g // 4:03d}", {}, after=deps))
        return items

    def complete(self, item, results):
        return Item(item.key, {"sum": sum(r["value"] for r in results.values()), "sleep": 0.0}, item.cost, item.after)

    def setup_worker(self, device):
        if self.args.broken_setup:
            raise OSError("cannot load the toy data")
        if self.args.crashing_setup:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.args.stubborn_setup_rank0 and self.on_rank0:
            end = time.monotonic() + self.args.stubborn_setup_rank0
            while time.monotonic() < end:
                try:
                    time.sleep(end - time.monotonic())
                except:  # noqa: E722 - what the option stands for
                    pass
        if self.args.swallowing_setup:
            try:
                time.sleep(self.args.swallowing_setup)
            except:  # noqa: E722 - what the option stands for
                pass
        return {"pid": os.getpid()}

    def run_item(self, state, item, seed):
        if self.args.marker_dir is not None:
            marker = self.args.marker_dir / item.key
            with open(marker, "a") as handle:
                handle.write(f"{os.getpid()}\n")
        if item.key == self.args.kill_key and not (self.args.marker_dir and _runs(self.args.marker_dir / item.key) > 1):
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)
        if item.key == self.args.usr2_key:  # a stray SIGUSR2 each time: cut off, handed out again, then counted
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(5)
        if item.key == self.args.swallow_key:
            try:
                time.sleep(self.args.slow_seconds)
            except:  # noqa: E722 - what the option stands for
                pass
        if item.key == self.args.gil_key and not (self.args.marker_dir and _runs(self.args.marker_dir / item.key) > 1):
            # no thread of this process runs meanwhile. libc's sleep returns early when a handled signal
            # comes (the rank's dump signal, before it kills a silent worker); a hung native call
            # does not, so neither does this one: it sleeps again until --gil-seconds are over
            libc, end = ctypes.PyDLL(None), time.monotonic() + self.args.gil_seconds
            while time.monotonic() < end:
                libc.sleep(max(1, int(end - time.monotonic())))
        if item.key == self.args.slow_key:
            time.sleep(self.args.slow_seconds)
        if item.key == self.args.fail_key:
            raise RuntimeError(f"item {item.key} always fails")
        if item.params.get("sleep"):
            time.sleep(item.params["sleep"])
        if self.args.child_seconds:
            subprocess.run(["sleep", str(self.args.child_seconds)], check=True)
        value = float(np.random.default_rng(seed).random()) + item.params.get("sum", 0.0)
        if self.args.done_dir is not None:
            # whole or absent, even under a SIGKILL (its temporary file's name starts with a dot)
            atomic_write_text(self.args.done_dir / item.key, repr(time.time()))
        return {"value": value, "pid": state["pid"], "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "cuda_order": os.environ.get("CUDA_DEVICE_ORDER")}

    def run_group(self, state, items, seeds):
        results = [self.run_item(state, item, seed) for item, seed in zip(items, seeds)]
        for result in results:
            result["group_size"] = len(items)
        return results

    def draws_figures(self):
        return False  # values.json only

    def finish(self, run: RunInfo):
        if self.args.broken_finish:
            raise RuntimeError("a bug in finish()")
        time.sleep(self.args.finish_seconds)
        values = {key: result["value"] for key, result in run.results().items()}
        atomic_write_json(run.results_dir / "values.json", values)
        return {"n_values": len(values)}

    def summary_markdown(self, summary):
        return f"## Toy values\n\n`values.json`: {summary.get('n_values')} values"


def _runs(path):
    try:
        return len(path.read_text().splitlines())
    except OSError:
        return 0


if __name__ == "__main__":
    from common import main

    raise SystemExit(main(ToyApp))
