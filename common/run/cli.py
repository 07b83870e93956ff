"""The engine's command-line flags, shared by every app, and one-line errors for bad input."""
from __future__ import annotations

import argparse
import difflib
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional

from common.argtypes import OneLineParser, at_least, folder
from common.errors import UsageError, quoted
from common.settings import DEFAULT_GRACE, DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_SETUP_TIMEOUT

#: items derive their seeds with numpy's SeedSequence, which takes any non-negative integer; consumers
#: that need a 32-bit seed (scikit-learn) derive one from it. The bound only keeps the journal readable.
MAX_SEED = 2 ** 256 - 1
#: the reference's (shermanlo77/multinode-gpu-study) seed
REFERENCE_SEED = 169514335042358758700408908237337905507
#: the longest --heartbeat-timeout (a day)
MAX_HEARTBEAT_TIMEOUT = 24 * 3600.0
#: the longest --worker-timeout and --item-timeout (30 days; 0 means no limit)
MAX_TIMEOUT = 30 * 24 * 3600.0
#: the most --retries: an item that always fails would otherwise be tried for ever (as a pipeline
#: step's max_retries)
MAX_RETRIES = 1000
#: torch/BLAS threads per worker: past this, thread stacks and per-thread buffers exhaust memory
MAX_THREADS = 1024
#: worker processes on one GPU: each holds a CUDA context (about 300-500 MiB) and a copy of its data
MAX_WORKERS_PER_GPU = 64
#: CPU worker processes of one rank: each is a Python process with a copy of its data (tens of MiB at
#: least) and three pipes; past this no node has the memory, and the rank's bookkeeping of them alone
#: (a list of a billion) would exhaust it before the file-descriptor check could refuse
MAX_WORKERS = 4096


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default only where there is one worth showing (not None, not False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False or "default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


class Parser(OneLineParser):
    """The apps' parser: a bad argument is one line with the nearest flag named, and only rank 0
    prints help."""

    def __init__(self, *args: Any, quiet: bool = False, **kwargs: Any):
        self.quiet = quiet
        #: the ``--results`` of a command line that gives none, from its other arguments
        self.default_results: Optional[Callable[[argparse.Namespace], Path]] = None
        self._given: List[str] = []  # the arguments being parsed, for the hints of error()
        # no prefixes (OneLineParser): --fold would be --folds, --resum --resume; a misspelt flag is told instead
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        self._given = [str(arg) for arg in (sys.argv[1:] if args is None else args)]
        parsed, extras = super().parse_known_args(args, namespace)
        if self.default_results is not None and getattr(parsed, "results", ...) is None:
            parsed.results = self.default_results(parsed)
            parsed.results_given = False  # a --resume may look in the folder an earlier version defaulted to
        return parsed, extras

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message}{self._did_you_mean(message) or self._swallowed(message)} (see --help)")

    def _swallowed(self, message: str) -> str:
        """For a flag whose value is optional (the pipelines' ``--resume [RUN_ID/STEP_ID]``, the status
        command's ``--watch [S]``) given before a positional argument, which it took as its value."""
        for flag, value in zip(self._given, self._given[1:]):
            action = self._option_string_actions.get(flag)
            if action is None or action.nargs != argparse.OPTIONAL or value.startswith("-"):
                continue
            # a value it could not take, where it names something that exists (the folder meant), or a
            # positional argument left missing
            if message.startswith("the following arguments are required") or (
                    f"argument {flag}" in message and os.path.exists(value)):
                return (f" ({flag} took {quoted(value)} as its {action.metavar or 'value'}: give {flag} after "
                        f"the positional arguments, or {flag}={action.metavar or 'VALUE'} for a value)")
        return ""

    def _did_you_mean(self, message: str) -> str:
        """For a misspelt flag (``--result``, ``--gpus``), the flag it is closest to."""
        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return ""
        known = [name for name in self._option_string_actions if name.startswith("--")]
        guesses = []
        for word in message[len(prefix):].split():
            flag = word.split("=", 1)[0]
            close = difflib.get_close_matches(flag, known, n=1, cutoff=0.75) if flag.startswith("--") else []
            if close:
                guesses.append((flag, close[0]))
        if len(guesses) == 1:
            return f" (did you mean {guesses[0][1]}?)"
        return f" (did you mean {', '.join(f'{right} for {wrong}' for wrong, right in guesses)}?)" if guesses else ""

    def _print_message(self, message: str, file: Any = None) -> None:
        if not self.quiet:
            super()._print_message(message, file)


def build_parser(app_class: Any, quiet: bool = False) -> Parser:
    # an app without a module of its own (sweep.main in a user's script): the program as it was started
    program = f"python -m {app_class.module}" if app_class.module else module_command([])
    parser = Parser(prog=program, description=app_class.description, quiet=quiet, formatter_class=_HelpFormatter)
    app_class.add_arguments(parser)
    engine = parser.add_argument_group("engine (distribution over ranks, GPUs and workers)")
    engine.add_argument("--gpu", default=None, metavar="GPU",
                        help="GPUs each rank uses: numbers such as 0,1,2, 'all', or 'cpu' "
                             "(default: GPU 0 where there is one, else CPU)")
    engine.add_argument("--workers", type=at_least(1, maximum=MAX_WORKERS), default=1,
                        help="worker processes per rank when running on CPU")
    engine.add_argument("--workers-per-gpu", type=at_least(1, maximum=MAX_WORKERS_PER_GPU), default=1,
                        help="worker processes sharing each GPU, each pinned to it (small items leave a big GPU idle)")
    engine.add_argument("--threads", type=at_least(1, maximum=MAX_THREADS), default=None,
                        help="torch/BLAS threads per worker (default: the rank's cores / its workers / ranks sharing "
                             "them; a --resume keeps its run's)")
    engine.add_argument("--batch", type=at_least(1), default=None,
                        help="replace a worker by a fresh process after this many items (frees leaked GPU memory; "
                             "not a training batch size; default: never)")
    engine.add_argument("--seed", type=at_least(0, maximum=MAX_SEED), default=app_class.default_seed,
                        help="seed of every item's randomness (any non-negative integer)")
    resume_help = "continue the run in --results, skipping every item its journal holds"
    if app_class.resume_target:  # the pipelines' --resume RUN_ID/STEP_ID
        engine.add_argument("--resume", nargs="?", const=True, default=False, metavar="RUN_ID/STEP_ID",
                            help=resume_help + "; with RUN_ID/STEP_ID, run that pipeline again from that step")
    else:  # a flag: `--resume tiny:fit` leaves tiny:fit to the positional arguments
        engine.add_argument("--resume", action="store_true", help=resume_help)
    engine.add_argument("--retries", type=at_least(0, maximum=MAX_RETRIES), default=app_class.default_retries,
                        help=f"extra attempts for an item that fails (at most {MAX_RETRIES})")
    engine.add_argument("--stop-after-failures", type=at_least(1), default=None, metavar="N",
                        help="stop the run once N items have failed for good (after their --retries) instead of "
                             "trying every item: a bug that fails them all does not spend the allocation; after a "
                             "fix, --resume runs the rest (default: never; exit code 1, not requeued)")
    engine.add_argument("--grace", type=at_least(0, float, maximum=MAX_TIMEOUT), default=DEFAULT_GRACE,
                        help="seconds to let running items finish after Ctrl-C (SIGINT), SIGTERM, SIGUSR1 or SIGHUP; "
                             "a second one ends the wait")
    engine.add_argument("--heartbeat-timeout", type=at_least(1, float, maximum=MAX_HEARTBEAT_TIMEOUT),
                        default=DEFAULT_HEARTBEAT_TIMEOUT,
                        help="seconds of silence after which a rank is declared lost (its items go to the others; "
                             "a rank that loses rank 0 stops)")
    engine.add_argument("--worker-timeout", type=at_least(0, float, maximum=MAX_TIMEOUT),
                        default=app_class.default_worker_timeout,
                        help="seconds a worker may say nothing (its heartbeat thread is stopped, or blocked by native "
                             "code holding the GIL) before it is killed, its item retried elsewhere and a new worker "
                             "started; 0: never")
    engine.add_argument("--item-timeout", type=at_least(0, float, maximum=MAX_TIMEOUT),
                        default=app_class.default_item_timeout,
                        help="seconds an item (or a group run together) may run before it is killed with its "
                             "worker and retried (--retries); 0: no limit" +
                             ("" if app_class.default_item_timeout else " (default: no limit)"))
    engine.add_argument("--setup-timeout", type=at_least(0, float, maximum=MAX_TIMEOUT), default=DEFAULT_SETUP_TIMEOUT,
                        help="seconds a worker's setup (its data loaded, its model built) may take before it is "
                             "killed and started again (after 3 failed starts its device is given up); 0: no limit "
                             f"(default: {DEFAULT_SETUP_TIMEOUT:g})")
    engine.add_argument("--results", type=folder, default=None,
                        help=f"results folder (default: results/{app_class.results_name_help()})")
    parser.default_results = lambda args: Path("results") / app_class.results_name(args)
    engine.add_argument("--no-progress", action="store_true", help="no progress bar")
    if "--dry-run" not in parser._option_string_actions:  # an app may have its own (the pipelines')
        engine.add_argument("--dry-run", action="store_true",
                            help="check the arguments and the results folder as the run would, print each "
                                 "work item it would run as one JSON line ({key, params}) and exit without "
                                 "running, writing or holding anything")
    return parser


def python_command(environ: Optional[Mapping[str, str]] = None, executable: Optional[str] = None) -> str:
    """The interpreter as a pasted command names it: ``python`` where that finds the one running now
    (an activated virtual environment, a module loaded), else its path (a venv's python run by its
    path: a bare ``python`` would be another one, without the run's packages)."""
    environ = os.environ if environ is None else environ
    executable = sys.executable if executable is None else executable
    if not executable:
        return "python"
    found = shutil.which("python", path=environ.get("PATH", ""))
    try:  # the same folder (a venv's python is a link to the system's: that alone would not tell them apart)
        # and the same program (a folder's python may be Python 2 beside the python3 that ran)
        if found and os.path.dirname(os.path.abspath(found)) == os.path.dirname(os.path.abspath(executable)) \
                and os.path.samefile(found, executable):
            return "python"
    except OSError:
        pass
    return shlex.quote(executable)


def run_it(ranks: int) -> str:
    """How to run a command the engine prints (a resume, a retry): a run of several ranks goes on
    under its launcher (mpiexec, srun) with as many ranks; a run of one, as printed."""
    return f"with the same launcher ({ranks} ranks) and:" if ranks > 1 else "with:"


def module_command(argv: list) -> str:
    """How this program was started, for the resume hint: ``python -m mnist_svm ...``."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    program = f"-m {spec.name.rsplit('.__main__', 1)[0]}" if spec is not None else (sys.argv[0] if sys.argv else "")
    python = python_command()
    return " ".join([python, program, shlex.join(argv)]) if argv else f"{python} {program}"
