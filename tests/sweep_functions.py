"""Functions that tests/test_sweep.py runs through ``python -m common.sweep`` (imported from tests/ by
the workers as a user's module would be), each doing what a user's might."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np


def _mark(name: str) -> None:
    """Each run of a point appends a line to a file named after it (SWEEP_MARKS), to count runs."""
    folder = os.environ.get("SWEEP_MARKS")
    if folder:
        with open(Path(folder) / name.replace("/", "_"), "a") as handle:
            handle.write(f"{os.getpid()}\n")


def noisy(params, seed):
    """A number drawn from the item's seed plus a smooth function of the parameters."""
    _mark(",".join(f"{k}={params[k]}" for k in sorted(params)) + f"-{seed}")
    time.sleep(float(os.environ.get("SWEEP_SLEEP", "0")))
    x = float(params.get("x", 0.0))
    draw = float(np.random.default_rng(seed).random())
    return {"loss": (x - 3.0) ** 2 + draw, "draw": draw, "seed_seen": seed, "vector": [x, draw],
            "kind": str(params.get("kind", ""))}


def draws(params, seed, rng):
    """A draw from the 32-bit ``seed`` and one from ``rng``, the item's whole stream."""
    return {"from_seed": float(np.random.default_rng(seed).random()), "from_rng": float(rng.random())}


def everything(params, seed, device, state):
    """Receives all four arguments: shows what a worker hands a function."""
    return {"params": params, "seed": seed, "device": device, "state_pid": state["pid"], "pid": os.getpid()}


def setup(device):
    """Once per worker."""
    return {"pid": os.getpid(), "device": device}


def noop():
    """Nothing at all: the benchmark's per-item overhead."""
    return {}


def raises(params):
    if params["x"] == 2:
        raise ValueError("x=2 is not allowed here")
    return {"loss": params["x"]}


def not_json(params):
    return {"loss": 1.0, "model": {1, 2, 3}} if params["x"] == 1 else {"loss": 0.0}


def not_a_dict(params):
    return 0.5


def many_numbers(params):
    """30 named numbers, none of them a loss."""
    return {f"m{i}": float(i) for i in range(30)}


class _BadMessage(Exception):
    def __str__(self):
        raise ValueError("no message")


def hostile(params):
    """What a user's code may do to its worker: each case must fail its item in one line, the
    worker going on (an unpicklable return killed it on every attempt, for ever)."""
    case = params["case"]
    if case == "unpicklable":
        class Score(float):  # a float (the return check takes it), but pickle cannot find its class
            pass
        return {"loss": Score(0.25)}
    if case == "multiline":
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nSee the documentation")
    if case == "bad message":
        raise _BadMessage()
    if case == "exit":
        sys.exit("bye")
    if case == "unpicklable by OSError":
        class Refuses(float):
            def __reduce__(self):
                raise OSError("no pickling")  # not the pipe's error: the item fails all the same
        return {"loss": Refuses(0.25)}
    return {"loss": 0.5}


def wrong_signature(x, y):
    return {"loss": x + y}


NOT_A_FUNCTION = 3


def leaves_a_thread(params):
    """Starts a thread that never ends (not a daemon), as some libraries' background workers do."""
    threading.Thread(target=threading.Event().wait, name="never-ends").start()
    return {"x": params["x"]}


def leaves_a_process(params):
    """Starts a program it never waits for, which would run for ten minutes; writes its pid to a
    file in SWEEP_MARKS."""
    child = subprocess.Popen(["sleep", "600"])
    with open(Path(os.environ["SWEEP_MARKS"]) / f"child-{params['x']}", "w") as handle:
        handle.write(str(child.pid))
    return {"x": params["x"]}


def raises_its_text(params):
    """A value of Markdown's special characters; one starting "fail" is raised as the error's message."""
    if params["kind"].startswith("fail"):
        raise ValueError(params["kind"])
    return {"loss": float(len(params["kind"]))}


async def awaited(params):
    """async def: a worker calling it would get a coroutine, never run."""
    return {"x": params["x"]}


def hangs(device):
    """A setup that never returns (a read from a dead network filesystem, a lock never released)."""
    threading.Event().wait()


def diverges(params, seed):
    """lr 1.0 diverges (NaN) for odd seeds and is very good otherwise; the others are fine."""
    if params["lr"] == 1.0:
        return {"loss": float("nan") if seed % 2 else 0.01}
    return {"loss": 0.5 + params["lr"]}


def _square(value: int) -> int:
    return value * value


def uses_processes(params):
    """Works in processes of its own, as a DataLoader with num_workers, a multiprocessing Pool or
    scikit-learn's n_jobs do: a Pool, a ProcessPoolExecutor, and a process started and joined."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    spawn = multiprocessing.get_context("spawn")
    values = range(int(params["x"]) + 3)
    with spawn.Pool(2) as pool:
        by_pool = sum(pool.map(_square, values))
    with ProcessPoolExecutor(2, mp_context=spawn) as executor:
        by_executor = sum(executor.map(_square, values))
    child = spawn.Process(target=_square, args=(3,), daemon=True)  # a DataLoader's workers are daemons
    child.start()
    child.join()
    return {"pool": by_pool, "executor": by_executor, "child_exit": child.exitcode}


def leaves_a_multiprocessing_process(params):
    """Starts a multiprocessing process that would run for ten minutes and never joins it (Python's
    exit waits for such a one); writes its pid to a file in SWEEP_MARKS."""
    import multiprocessing

    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,))
    child.start()
    with open(Path(os.environ["SWEEP_MARKS"]) / f"child-{params['x']}", "w") as handle:
        handle.write(str(child.pid))
    return {"x": params["x"]}


def changes_folder(params):
    """Says where it started, then moves to the folder above (os.chdir), as a script written to be
    run alone may."""
    started_in = os.getcwd()
    os.chdir(os.path.dirname(started_in))
    return {"started_in": started_in}


def huge_message(params):
    """Fails with a message of two million characters (an array printed whole into it)."""
    raise ValueError(f"x={params['x']} " + "x" * 2_000_000)


def writes_in_the_background(params):
    """Hands a write to a ThreadPoolExecutor and another to a thread, each a second away, and
    returns at once (a checkpoint saved in the background); each writes a file in SWEEP_MARKS."""
    from concurrent.futures import ThreadPoolExecutor

    folder = Path(os.environ["SWEEP_MARKS"])

    def write(name: str) -> None:
        time.sleep(1.0)
        (folder / f"{name}-{params['x']}").write_text("done")

    ThreadPoolExecutor(1).submit(write, "by-an-executor")  # never shut down, as a forgetful user leaves it
    threading.Thread(target=write, args=("by-a-thread",)).start()
    return {"x": params["x"]}


def raises_mostly(params, seed):
    """lr 1.0 raises for odd seeds and is very good otherwise (an "assert loss is finite")."""
    if params["lr"] == 1.0 and seed % 2:
        raise FloatingPointError("the loss diverged")
    return {"loss": 0.01 if params["lr"] == 1.0 else 0.5 + params["lr"]}


def square(params):
    """x squared: x and -x tie."""
    return {"loss": float(params["x"]) ** 2}


def chatty(params):
    """Prints as a training loop does, to stdout and to stderr, before it returns."""
    for epoch in range(20):
        print(f"x={params['x']} epoch {epoch}: loss {1.0 / (epoch + 1):.3f}", flush=True)
    print(f"x={params['x']} done", file=sys.stderr, flush=True)
    return {"loss": float(params["x"])}
