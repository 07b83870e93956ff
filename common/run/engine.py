"""``main(AppClass)`` (called through :func:`common.run.runner.main`): everything between the command line and the results folder.

Order of events on every rank: parse and validate (all ranks agree before anything is written),
rank 0 checks the results folder and journal and prepares data, each rank spawns its workers,
rank 0 leads the distribution while the others follow, then rank 0 writes the outputs.
"""
from __future__ import annotations

import contextlib
import datetime
import errno
import fnmatch
import json
import logging
import multiprocessing
import os
import resource
import socket
import stat
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from common import settings, startup
from common.app import UNNAMED_APP, App, RunInfo
from common.devices import resolve_devices, visible_gpus
from common.errors import (
    EXIT_FAILED_ITEMS,
    EXIT_NO_PROGRESS,
    EXIT_NOT_WRITTEN,
    EXIT_OK,
    EXIT_STOPPED,
    EXIT_USAGE,
    UsageError,
    counted,
    described,
    error_line,
    markdown_cell,
    quoted,
)
from common.items import Item, check_items, check_seed_form
from common.messages import Bye
from common.observe.gpu_monitor import GpuMonitor
from common.observe.gpu_usage import write_gpu_usage
from common.observe.logs import add_file_log, log_to_files, setup_logging
from common.observe.progress import Progress
from common.observe.report_html import warm_up as warm_up_report
from common.observe.report_html import write_report
from common.observe.timeline import TimelineDrawer, plot_timeline
from common.ranks.distribute import Follower, Leader
from common.ranks.liveness import FollowerWatch, PeerWatch
from common.ranks.mpi import world
from common.ranks.scheduler import Scheduler
from common.results.failures import WriteFailures, about_results, free_reserve, reserve_space
from common.results.hold import Hold, check_free
from common.results.journal import FORMAT_VERSION as JOURNAL_FORMAT
from common.results.journal import Journal, Kind, describe_difference, holds_journal, read_header, read_journal
from common.results.layout import (
    ENGINE_OUTPUTS,
    GPU_USAGE_STEM,
    HOLD_NAME,
    JOURNAL_NAME,
    LOG_PATTERN,
    LOGS_DIR,
    RANK0_LOG,
    RESERVE_NAME,
    STATUS_NAME,
    SUMMARY_JSON,
    SUMMARY_MD,
    TIMELINE_STEM,
    WRITE_PROBE,
    ResultsLayout,
    png_name,
    temporary_files,
    worker_name,
)
from common.results.outputs import atomic_write_json, atomic_write_text, check_replaceable, preload_figures, to_jsonable
from common.results.regular_file import in_place, refuse_unless_regular
from common.results.status_file import RankReporter, StatusWriter
from common.run.cli import MAX_THREADS, build_parser, module_command, run_it
from common.signals import WALLTIME_SIGNAL, StopFlag, ignore_stop_signals, start_resource_tracker
from common.workers.pool import PoolSettings, WorkerPool
from common.workers.spawnable import module_beside_main, unreachable_from_workers
from common.workers.watchdog import Watchdog

log = logging.getLogger("multinode_gpu")

#: seconds a busy worker gets to end what it started (pipeline steps) once the run is over
WORKER_KILL_AFTER = 10.0

#: open files a rank needs (MPI, logs, journal, figures), and more for each of its workers (the pipe
#: to it, its sentinel, what multiprocessing opens while starting it): about 3 measured, 8 allowed
FILES_PER_RANK = 64
FILES_PER_WORKER = 8


@dataclass(frozen=True)
class _Refusal:
    """Why a rank will not run: a usage error's ``message``, or (``exit_code``) argparse's own
    exit, as for --help. Sent between ranks as it is, so no rank parses another's text."""

    message: str = ""
    exit_code: Optional[int] = None
    host: str = ""


def _agree(comm: Any, refusal: Optional[_Refusal]) -> Optional[_Refusal]:
    """Every rank's refusal (or None) -> the first one, on every rank. A usage error that not every
    rank has (a --data-dir one node cannot see) names the node and rank it comes from."""
    if refusal is not None:
        refusal = replace(refusal, host=socket.gethostname().split(".")[0])
    reports = comm.allgather(refusal)
    refusals = [(rank, r) for rank, r in enumerate(reports) if r is not None]
    if not refusals:
        return None
    rank, first = refusals[0]
    if first.exit_code is not None or len(refusals) == len(reports):
        return first
    return replace(first, message=f"on {first.host} (rank {rank}): {first.message}")


def _validate_everywhere(comm: Any, app_class: type, argv: List[str]):
    """Parse and check arguments and devices on every rank; returns (app, devices, notice) or an error."""
    gpus = visible_gpus()
    peers = _same_node_peers(comm, socket.gethostname(), gpus)
    try:
        args = build_parser(app_class, quiet=comm.rank != 0).parse_args(argv)
        if unreachable_from_workers(app_class):  # every worker would die importing it, three times over
            raise UsageError(f"{app_class.__name__} is defined where the spawned workers cannot import it from (a "
                             f"package's __main__.py, python -c, standard input): define it in a module of its own "
                             f"({module_beside_main()}) and import it from there")
        app = app_class(args)
        try:  # the app's own setting, refused before any worker starts
            check_seed_form(app.seed_form)
        except ValueError as error:
            raise UsageError(f"{app_class.__name__}.{error}") from None
        # ranks of one node that see the same GPUs share them out
        devices, notice = resolve_devices(args.gpu, args.workers, gpus, peers.index(comm.rank), len(peers),
                                          args.workers_per_gpu)
        app.devices = devices  # decided once, here: validate() and every later method read them
        if not getattr(args, "dry_run", False):  # a dry run starts no worker
            _check_open_files(len(devices), comm.size)
        app.check_arguments()
        app.validate()
        return (app, devices, notice), None
    except UsageError as error:
        return None, _Refusal(str(error))
    except SystemExit as exit_:  # --help
        # as Python exits: 0 for None, the number, 1 for a message
        code = exit_.code
        return None, _Refusal(exit_code=0 if code is None else code if isinstance(code, int) else 1)


def _check_open_files(workers: int, ranks: int) -> None:
    """Raise the soft limit on open files to what the rank needs (up to the hard limit), or refuse
    the run in one line naming the limit: past it a worker cannot be started, and the run would
    stop half-way with workers left waiting."""
    needed = FILES_PER_RANK + FILES_PER_WORKER * workers + 2 * ranks
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard == resource.RLIM_INFINITY or hard >= needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        return
    raise UsageError(f"the limit on open files (ulimit -n) is {hard}; {workers} worker(s) on this rank need at "
                     f"least {needed}: raise it (ulimit -n {max(1024, needed)}) or start fewer workers")


def _end_children() -> None:
    """Kill this rank's workers (an unexpected error ends the run): multiprocessing would otherwise
    wait for them at exit, and they wait for their rank: a hang that even SIGTERM cannot end."""
    for child in multiprocessing.active_children():
        child.kill()
    for child in multiprocessing.active_children():
        child.join(5)


#: the fingerprint's entry for ``App.data_fingerprint``: what the items were computed on
DATA_FINGERPRINT = "data_identity"


def engine_fingerprint(args: Any) -> Dict[str, Any]:
    """The engine's arguments that change results, fingerprinted for every app (an app's own
    ``fingerprint`` adds only its arguments): the seed, and --threads where given (a BLAS or torch
    reduction's bits depend on its thread count). Not --gpu or --workers: the same seed gives the
    same answer on any number of devices, and a requeued job may resume on other nodes."""
    threads = getattr(args, "threads", None)
    return {"seed": args.seed, **({} if threads is None else {"threads": threads})}


def _check_results_folder(app: App, hold_seconds: float) -> Tuple[Dict[str, Any], Hold, List[Item]]:
    """Rank 0: refuse a folder another run holds, refuse to overwrite a journal or to resume
    another run; then make the folder and take its hold. Sets ``app.journaled`` from the journal
    being resumed."""
    fingerprint = _judge_results_folder(app)
    items = _app_items(app)  # before the folder is made: a mistake in them writes nothing
    folder: Path = app.args.results
    place = folder
    try:
        for place in (folder, folder / LOGS_DIR):
            place.mkdir(parents=True, exist_ok=True)
            # a name of this process's own: two runs started at once on one folder (one to be refused
            # by the hold) must not remove each other's probe
            probe = place / f"{WRITE_PROBE}.{socket.gethostname()}.{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        place = folder
        hold = Hold(folder, refresh=hold_seconds)
        hold.acquire()
    except OSError as error:
        raise _cannot_write(folder, place, error.strerror or str(error)) from None
    return fingerprint, hold, items


def _cannot_write(folder: Path, place: Path, why: str) -> UsageError:
    """The one line for a results folder that cannot be written: at ``place``, the folder or its logs/."""
    where = "there" if place != folder / LOGS_DIR else f"in its {LOGS_DIR}/ folder"
    return UsageError(f"--results {quoted(folder)}: cannot write {where} ({why})")


def _app_items(app: App) -> List[Item]:
    """Rank 0: the app's items, checked (:func:`common.items.check_items`): a mistake in them is one
    line naming it (exit 2), not a traceback from deep in the run."""
    owner = f"{type(app).__name__}.items()"
    if type(app).items is App.items:
        raise UsageError(f"{type(app).__name__} defines no items(): an app returns its list of common.Item from it")
    if type(app).run_item is App.run_item and type(app).run_group is App.run_group:
        raise UsageError(f"{type(app).__name__} defines no run_item(state, item, seed): the function each worker "
                         f"runs for an item")
    try:
        return check_items(owner, app.items())
    except ValueError as error:
        raise UsageError(str(error)) from None


def _judge_results_folder(app: App) -> Dict[str, Any]:
    """What :func:`_check_results_folder` refuses, found without writing anything (a dry run
    refuses the same); returns the run's fingerprint and sets ``app.journaled``."""
    args = app.args
    fingerprint = {"app": app.name, **engine_fingerprint(args), **app.fingerprint()}
    _resume_where_it_was(app, fingerprint)
    folder: Path = args.results
    journal_path = ResultsLayout(folder).journal
    old_data = None  # the data the journal's items were computed on, where it says
    kept_threads = None  # a resume without --threads: the count the journal's runs used
    try:
        os.stat(folder)
    except FileNotFoundError:
        pass
    except OSError as error:  # a name over the filesystem's limit, a loop of links, no permission
        raise UsageError(f"--results {quoted(folder)}: cannot write there ({error.strerror or error})") from None
    _check_writable(folder)  # found without writing: a dry run refuses it too
    killed_run = False  # a hold left by a run that died (killed, or its node lost) without releasing it
    if folder.is_dir():
        for name, what in ((JOURNAL_NAME, "the journal"), (HOLD_NAME, "the results folder's hold"),
                           (STATUS_NAME, "the status file")):
            refuse_unless_regular(folder / name, what)  # a FIFO would make its reader wait for ever
        _check_logs_and_reserve(folder)
        killed_run = check_free(folder) is not None  # read-only: a live run's hold is refused before anything else
    journaled = holds_journal(journal_path)  # an empty one: a run killed before its header, which finished nothing
    if journaled:
        if not args.resume:
            other = _other_run(journal_path, fingerprint, app)
            if other:  # --resume would only be refused next (two functions of one module, by default)
                raise UsageError(f"{quoted(folder)} already holds the journal of another run ({other}); choose "
                                 f"another --results (or continue that run with its own arguments and --resume)")
            raise UsageError(f"{quoted(folder)} already holds the journal of an earlier run; pass --resume to continue it "
                             f"or choose another --results")
        starts: List[dict] = []
        header, app.journaled = read_journal(journal_path, starts)
        old = header.get("fingerprint") if isinstance(header, dict) else None
        old = _journaled_app(old, app)
        if not isinstance(old, dict):
            raise UsageError(f"cannot resume {quoted(folder)}: its journal's first line is not a run's header "
                             f"(damaged?); use another --results")
        made = header.get("format", JOURNAL_FORMAT)  # a journal from before the field: the first format
        if type(made) is not int or made != JOURNAL_FORMAT:  # a newer version's records may mean other things
            raise UsageError(f"cannot resume {quoted(folder)}: its journal is of format {repr(made)[:40]}, and this "
                             f"multinode-gpu reads format {JOURNAL_FORMAT} (made by another version?); resume it "
                             f"with that version, or use another --results")
        old_data = old.pop(DATA_FINGERPRINT, None)  # judged after prepare(), which reads the data
        given = old.get("threads")  # the run resumed was given --threads: a resume without it keeps it too
        asked = getattr(args, "threads", None)
        keep_given = asked is None and type(given) is int and 1 <= given <= MAX_THREADS
        if keep_given:
            fingerprint["threads"] = given
        left_out = app.fingerprint_left_out()
        compared = fingerprint
        if given is None and asked is not None:  # the run used the default count, which its start records
            used = _threads_resumed(starts)
            if used is not None:
                left_out = {**left_out, "threads": used}  # a refusal names the count the run used
                if asked == used:  # the same count, named now: the same results
                    compared = {name: value for name, value in fingerprint.items() if name != "threads"}
        if old != compared:
            raise UsageError(f"cannot resume {quoted(folder)}: it was made with other arguments "
                             f"({describe_difference(old, compared, left_out)}); use the same "
                             f"arguments or another --results")
        if getattr(args, "threads", None) is None:
            kept_threads = given if keep_given else _threads_resumed(starts)  # taken once nothing below refuses
        for key, record in app.journaled.items():
            try:
                app.check_result(key, record.result)
            except ValueError as problem:
                raise UsageError(f"cannot resume {quoted(folder)}: its journal's result of {key} is not one {app.name} "
                                 f"writes ({problem}): the journal is damaged; use another --results") from None
    elif folder.exists() and not folder.is_dir():
        raise UsageError(f"--results {quoted(folder)}: exists and is not a folder")
    own = _own_entries(folder, app) if folder.is_dir() else []
    if own:  # an earlier run's outputs: each must be replaceable at the end, or the run would do its
        # work and then leave new figures beside an old summary (a user's other files are not looked at)
        check_replaceable(folder, ENGINE_OUTPUTS, skip=[name for name in os.listdir(folder) if name not in own]
                          + [LOGS_DIR, HOLD_NAME])
    app.prepare()  # its own one-line errors (a --resume of nothing, ...) say more than a clash
    data = app.data_fingerprint()
    if data is not None:
        if old_data is not None and old_data != data:
            raise UsageError(f"cannot resume {quoted(folder)}: its items were computed on other data (data "
                             f"{old_data} (journal) vs {data} (now): another --data-dir, or files that changed); use "
                             f"the same data or another --results")
        fingerprint[DATA_FINGERPRINT] = data
    if not journaled:  # a run killed at its start leaves its hold and logs (appended to) before its journal,
        # or an empty journal before its header: not a clash (logs of nobody's hold are someone else's)
        started = (JOURNAL_NAME, *([LOGS_DIR] if killed_run else []))
        clashes = [name for name in own if name not in started
                   and (not (folder / name).is_dir() or any((folder / name).iterdir()))]
        if clashes:  # someone's files named like ours, or results whose journal is gone: never overwrite them
            named = f"{', '.join(clashes[:3])}{', ...' if len(clashes) > 3 else ''}"
            if "*" in app.output_names():  # an app that claims every name (App's default)
                raise UsageError(f"--results {quoted(folder)}: holds files but no journal of a run ({named}), and "
                                 f"{app.name} writes a new or empty folder; choose another --results")
            raise UsageError(f"--results {quoted(folder)}: holds files but no journal of a run ({named}), which this "
                             f"run would overwrite; move them away or choose another --results")
    if kept_threads is not None:
        args.threads = kept_threads
        if not getattr(args, "dry_run", False):
            log.info("%s: resuming with %s per worker, as the run being resumed (results depend on the count)",
                     app.name, counted(kept_threads, "torch/BLAS thread"))
    if args.resume and not journaled and not getattr(args, "dry_run", False):
        # a Slurm job's first start; or a relative --results pasted in another folder, which would
        # otherwise start the run from nothing without a word
        log.info("%s: --resume: no journal in %s, so the run starts from the beginning", app.name, folder.absolute())
    return fingerprint


def _resume_where_it_was(app: App, fingerprint: dict) -> None:
    """A --resume without --results of a run made before a sweep script or pipeline definition had
    a default folder of its own: its journal is in ``results/<app>`` (results/sweep,
    results/pipeline), and the new default holds none. Resumed there, said, rather than started
    again from nothing in the new folder (a Slurm job's every start passes --resume)."""
    args = app.args
    if not args.resume or getattr(args, "results_given", True) or holds_journal(ResultsLayout(args.results).journal):
        return
    # an app of the user's that sets no name was "app" before its name came from its module
    for earlier in [Path("results") / app.name] + ([Path("results") / UNNAMED_APP] if app.name_from_module else []):
        journal = ResultsLayout(earlier).journal
        if (Path(args.results) != earlier and holds_journal(journal)
                and _other_run(journal, fingerprint, app) is None):
            break
    else:
        return
    said = (f"{app.name}: --resume: this run's journal is in {quoted(str(earlier))}, the default folder of earlier "
            f"versions (now {quoted(str(args.results))}): resuming it there")
    print(said, file=sys.stderr)
    log.info(said)
    args.results = earlier


def results_folder_refusal(app: App, own: Optional[Dict[str, Any]]) -> Optional[str]:
    """Why a job resuming ``app``'s run in its --results would be refused as it starts, found here
    without writing (the Slurm generator's check on the login node, where a job refused after its
    wait in the queue is the costliest typo): a path that is not a folder, or a journal of another
    run (another app, seed or arguments). ``own``: the app's fingerprint, None where it cannot be
    had before the job (a sweep's names its function, which is not imported here): then only the
    app and the engine's arguments are compared. None where it would start; a hold (a run still
    going) is not judged, since a job may be submitted to follow one."""
    folder = Path(app.args.results)
    journal_path = ResultsLayout(folder).journal
    try:
        if folder.exists() and not folder.is_dir():
            return f"--results {quoted(folder)} is not a folder"
        if not journal_path.is_file() or not holds_journal(journal_path):
            return None
    except OSError as error:  # a name over the filesystem's limit, no permission: as the run would say it
        return f"--results {quoted(folder)}: cannot write there ({error.strerror or error})"
    fingerprint = {"app": app.name, **engine_fingerprint(app.args), **(own or {})}
    other = _other_run(journal_path, fingerprint, app, partial=own is None)
    return (f"--results {quoted(folder)} holds the journal of another run ({other}), which the job's --resume "
            f"would refuse to continue; choose another --results, or give the job that run's arguments") if other else None


def _journaled_app(old: Any, app: App) -> Any:
    """The journal's fingerprint, where an earlier version ran this app as "app" (an App subclass
    that set no name, before its name came from its module), as this app's."""
    if isinstance(old, dict) and app.name_from_module and old.get("app") == UNNAMED_APP:
        return {**old, "app": app.name}
    return old


def _other_run(journal_path: Path, fingerprint: dict, app: App, partial: bool = False) -> Optional[str]:
    """How the run whose journal this is differs from ``app``'s with ``fingerprint``, from its header
    (the first line); None where it is the same run (or its header cannot be read: the resume says
    why). ``partial``: ``fingerprint`` lacks the app's own arguments, and only the names it has are
    compared."""
    header = read_header(journal_path)
    old = _journaled_app(header.get("fingerprint") if header is not None else None, app)
    if not isinstance(old, dict):
        return None
    # what a resume may take from the run, or judges later: not a difference of arguments
    ignored = (DATA_FINGERPRINT, "threads")
    old = {name: value for name, value in old.items() if name not in ignored}
    now = {name: value for name, value in fingerprint.items() if name not in ignored}
    if partial:
        old = {name: value for name, value in old.items() if name in now}
    return None if old == now else describe_difference(old, now, app.fingerprint_left_out())


def _threads_resumed(starts: List[dict]) -> Optional[int]:
    """The thread count every worker of the journal's earlier runs used, where they all used one:
    a resume without --threads keeps it (a reduction's bits depend on it, and the default, the
    cores over the workers, changes with --workers or the node), so that it ends with the results
    of an uninterrupted run. None where the runs used several (nodes of different sizes)."""
    used = {entry.get("threads") for start in starts for entry in (start.get("layout") or [])
            if isinstance(entry, dict) and isinstance(entry.get("threads"), int)
            and not isinstance(entry.get("threads"), bool)}  # a journal from before the field: none said
    if len(used) != 1:
        return None
    threads = used.pop()
    return threads if 1 <= threads <= MAX_THREADS else None


def _check_logs_and_reserve(folder: Path) -> None:
    """The logs folder and the disk-space reserve an earlier run left: a FIFO where a rank's or a
    worker's log goes would block its open for ever (a worker's: the run waits for a worker that
    never starts), and so would one where the reserve goes; a file where the folder goes, or a
    link to nothing, is said as such. Names the run does not write are not looked at, and a log
    sent to a device (``/dev/null``) is let be."""
    logs = folder / LOGS_DIR
    problem = in_place(logs, folder=True, keeps="its logs folder")
    if problem:
        raise UsageError(f"{problem}; move it away")
    if logs.is_dir():
        with os.scandir(logs) as entries:
            for entry in entries:
                if not fnmatch.fnmatchcase(entry.name, LOG_PATTERN):
                    continue
                try:
                    mode = os.stat(entry.path).st_mode
                except OSError:  # a link to a log not made yet: its open makes it
                    continue
                if not stat.S_ISCHR(mode):
                    refuse_unless_regular(entry.path, "a log", mode)
    refuse_unless_regular(folder / RESERVE_NAME, "the disk-space reserve")


def _check_writable(folder: Path) -> None:
    """Refuse, without writing anything, a results folder that cannot be made or written: a link
    to nothing (mkdir would say "File exists"), a read-only filesystem, no permission. Judged on
    the folder, or on the nearest folder above it that exists, and on its logs/ folder where it has one."""
    if folder.is_symlink() and not folder.exists():
        raise UsageError(f"--results {quoted(folder)}: a symbolic link to {quoted(os.readlink(folder))}, which does "
                         f"not exist")
    place = folder
    while not place.exists() and place != place.parent:
        place = place.parent
    try:  # a folder that may not be entered raises here (Path.is_dir passes over ENOENT, not EACCES): said below
        logs = (place == folder and os.access(folder, os.X_OK) and (folder / LOGS_DIR).is_dir()
                and not os.access(folder / LOGS_DIR, os.W_OK | os.X_OK))
    except OSError:
        logs = False
    if logs:  # a resume writes there too: said for what it is, not as the folder's
        place = folder / LOGS_DIR
    elif not place.is_dir() or os.access(place, os.W_OK | os.X_OK):
        return  # a file on the way is said where the folder is made
    try:
        read_only = bool(os.statvfs(place).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    raise _cannot_write(folder, place, "Read-only file system" if read_only else "Permission denied")


def _own_entries(folder: Path, app: App) -> List[str]:
    """The names at the top of ``folder`` that this run writes: the engine's outputs, its logs
    folder and the app's ``output_names`` (the hold aside: ``check_free`` has judged it)."""
    patterns = (*ENGINE_OUTPUTS, LOGS_DIR, *app.output_names())
    return sorted(name for name in os.listdir(folder)
                  if not ResultsLayout.is_hold_file(name)
                  and any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns))


def main(app_class: type, argv: Optional[List[str]] = None) -> int:
    """Run an app from the command line on this rank; returns the exit code (same on every rank)."""
    startup.guard_standard_streams()  # a closed pipe or a full stdout never changes the outcome
    try:
        return _main(app_class, argv)
    finally:  # the exit code is decided: a signal during the interpreter's shutdown must not change it
        ignore_stop_signals()


def _main(app_class: type, argv: Optional[List[str]]) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    failures = WriteFailures()  # the run's failed writes to its results folder
    stop = StopFlag(lambda: failures.first)
    # from the first moment: a walltime signal during start-up still ends cleanly, and so does one
    # that came while the program was still importing
    stop.take_over()
    try:  # every environment variable of ours, read now: garbage is one line, not a later traceback
        run_settings = settings.read_all()
        startup.check_working_folder()
    except UsageError as error:  # before MPI is joined: the launcher's rank 0 says it
        if settings.launcher_rank() == 0:
            print(f"{app_class.name}: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    comm = world(run_settings.no_mpi)
    launched = settings.launcher_sizes()
    if launched and comm.size not in launched and not run_settings.no_mpi:
        # each rank alone in a world of its own: N runs of rank 0 racing for one results folder
        if settings.launcher_rank() == 0:
            print(f"{app_class.name}: error: {_world_mismatch(launched[0], comm.size)}", file=sys.stderr)
        return EXIT_USAGE
    setup_logging(comm.rank)
    valid, refusal = _validate_everywhere(comm, app_class, argv)
    refusal = _agree(comm, refusal)
    if refusal is not None and refusal.exit_code is not None:
        return refusal.exit_code
    # asked to stop while starting: nothing is written. Said before a refusal, which the stop may have caused:
    # a program the checks started (a data set's download) dies of a Ctrl-C or SIGTERM to the whole group
    if any(comm.allgather(stop.why is not None)):
        if comm.rank == 0:
            print(f"{app_class.name}: stopped ({stop.why or 'another rank was signalled'}) before the run "
                  f"started; nothing was written", file=sys.stderr)
        return EXIT_STOPPED
    if refusal is not None:
        if comm.rank == 0:
            print(f"{app_class.name}: error: {refusal.message}", file=sys.stderr)
        return EXIT_USAGE
    app, devices, notice = valid
    app.devices = devices
    if getattr(app.args, "dry_run", False):
        return _dry_run(comm, app)
    checked, failed = _on_rank_0(comm, app, lambda: _check_results_folder(app, run_settings.hold_seconds))
    if failed:
        return EXIT_USAGE
    app.args.threads = comm.bcast(app.args.threads)  # a resume keeps its earlier run's (rank 0 read it)
    app.args.results = comm.bcast(app.args.results)  # and its folder, where an earlier version's default held it
    fingerprint, hold, items = checked or (None, None, None)
    ending = Ending()
    try:
        code = _run(comm, app, notice, fingerprint, argv, stop, failures, items, ending, run_settings)
    except Exception as error:
        _end_children()
        if hold is not None:
            hold.release()
        ending.print()
        if isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE):  # a limit, not a bug
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            message = (f"{app_class.name}: error: {error.strerror} (this rank's limit on open files, ulimit -n, is "
                       f"{limit}): its workers were stopped; raise the limit and rerun with --resume")
            log.error(message)
            if comm.rank == 0 or comm.size == 1:
                print(message, file=sys.stderr)
            if comm.size > 1:
                logging.shutdown()
                comm.abort(EXIT_FAILED_ITEMS)
            return EXIT_FAILED_ITEMS
        if comm.size > 1:  # the other ranks would wait for this one for ever: end the whole job
            log.exception("unexpected error; aborting all %d ranks", comm.size)
            logging.shutdown()
            comm.abort(1)
        log_to_files(f"unexpected error:\n{traceback.format_exc().rstrip()}")  # stderr gets it as Python prints it
        raise
    if hold is not None:
        hold.release()
    ending.print()  # the run's folder says how it ended: a launcher dying as these pass loses nothing
    if not comm.finalize:  # a rank is gone: MPI_Finalize would wait for it forever
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        if comm.rank == 0 and comm.size > 1:
            # MPI_Abort is how a job ends with a rank missing: the launcher ends every process it
            # can reach (the lost rank's too) and exits with ``code`` (hydra; srun reports the step failed)
            comm.abort(code)
        os._exit(code)
    return code


def _dry_run(comm: Any, app: App) -> int:
    """--dry-run: rank 0 refuses what the run would refuse (the results folder: a journal without
    --resume, another run's journal, a run holding it, ...), then prints each item the run would
    run (with --resume, those the journal does not hold yet) as one JSON line; nothing written,
    no hold taken."""
    def plan() -> None:
        _judge_results_folder(app)  # prepares the app
        text = app.plan_text()
        if text is not None:
            print(text, end="")
        else:
            items = _app_items(app)
            left = [item for item in items if item.key not in app.journaled]
            for item in left:
                print(json.dumps({"key": item.key, "params": to_jsonable(dict(item.params))}))
            if items and not left:  # a finished run: say so, rather than print nothing at all
                print(f"{app.name}: nothing to run: the journal holds every item ({len(items)})", file=sys.stderr)
        lost = startup.stdout_lost()
        if lost:
            print(f"{app.name}: error: --dry-run: the plan could not be written to stdout ({lost})", file=sys.stderr)
        return lost

    lost, failed = _on_rank_0(comm, app, plan)
    return EXIT_USAGE if failed else EXIT_NOT_WRITTEN if comm.bcast(lost) else EXIT_OK


def _on_rank_0(comm: Any, app: App, work: Callable[[], Any]) -> Tuple[Any, bool]:
    """``work()`` on rank 0; its UsageError, told to every rank, is one line on stderr.
    Returns (what it returned on rank 0, whether it failed), the failure on every rank."""
    result, error = None, None
    if comm.rank == 0:
        try:
            result = work()
        except UsageError as problem:
            error = str(problem)
        except Exception:
            if comm.size > 1:  # the other ranks wait in the broadcast below for ever: end the whole job
                log.exception("unexpected error on rank 0; aborting all %d ranks", comm.size)
                logging.shutdown()
                comm.abort(1)
            raise
    error = comm.bcast(error)
    if error and comm.rank == 0:
        print(f"{app.name}: error: {error}", file=sys.stderr)
    return result, bool(error)


def _run(comm: Any, app: App, notice: Optional[str], fingerprint: Optional[dict], argv: List[str],
         stop: StopFlag, failures: WriteFailures, items: Optional[List[Item]], ending: Ending,
         run_settings: settings.RunSettings) -> int:
    """The run on this rank. Rank 0 starts its timeline's drawing process first: it starts its
    interpreter while rank 0 makes the plan and the journal, and imports matplotlib while the
    workers start and the items run, in a thread at niceness 10 (it takes what they leave), so
    that the end of even a short run finds it ready (started with the first result, as before, it
    was still importing at the end of a run of seconds). It never outlives the run."""
    drawer = _start_drawer() if comm.rank == 0 else None
    try:
        # multiprocessing's resource tracker, which starting a worker needs: its interpreter (a third
        # one beside the 2 workers' on 2 cores) starts now, not at the same time as the workers'
        start_resource_tracker()
        return _run_rank(comm, app, notice, fingerprint, argv, stop, failures, drawer, items, ending, run_settings)
    finally:
        if drawer is not None:
            drawer.close()


def _run_rank(comm: Any, app: App, notice: Optional[str], fingerprint: Optional[dict], argv: List[str],
              stop: StopFlag, failures: WriteFailures, drawer: Optional[TimelineDrawer],
              items: Optional[List[Item]], ending: Ending, run_settings: settings.RunSettings) -> int:
    """``items``: rank 0's, checked before the results folder was made (None on the other ranks);
    ``ending``: where rank 0's last lines wait for the hold's release."""
    args, devices = app.args, app.devices
    host = socket.gethostname().split(".")[0]
    results: Path = args.results
    if notice and comm.rank == 0:
        log.info(notice)
    files = ResultsLayout(results)
    files.logs.mkdir(parents=True, exist_ok=True)  # on every node: results need not be shared
    add_file_log(str(files.rank_log(comm.rank)),
                 f"rank {comm.rank} of {comm.size} on {host} (pid {os.getpid()}): {', '.join(map(str, devices))}",
                 failures)
    _check_results_shared(comm, results, host)
    threads = _thread_count(comm, host, app.name, len(devices), args.threads)
    pool_specs = app.pools()
    node_pools = {name: cap for name, (cap, scope) in pool_specs.items() if scope == "node"}
    global_pools = {name: cap for name, (cap, scope) in pool_specs.items() if scope != "node"}
    if comm.rank == 0:
        assert items is not None
        known = {item.key for item in items}
        resumed = {key: record for key, record in app.journaled.items() if key in known}
        scheduler = Scheduler(items, {k: r.result for k, r in resumed.items()}, args.retries, app.complete,
                              {k: r.params for k, r in resumed.items() if r.params is not None})
        for key in scheduler.stale:
            del resumed[key]
    # with the layout, whether anything is left to run (rank 0's word): a resume of a run whose items
    # are all journaled starts no worker on any rank, since each would import and set up its app
    # (mnist_nn's torch and data: seconds of CPU) only to be ended at once
    entry = {"rank": comm.rank, "host": host, "pid": os.getpid(), "devices": [str(d) for d in devices], "threads": threads}
    gathered = comm.allgather((entry, scheduler.all_resolved() if comm.rank == 0 else None))
    layout = [entry for entry, _ in gathered]
    nothing_to_run = gathered[0][1]
    total_capacity = sum(len(entry["devices"]) for entry in layout)
    started_at = time.time()

    leader = None
    if comm.rank == 0:
        journal_path = files.journal
        journal = Journal(journal_path, {"fingerprint": fingerprint, "command": module_command(argv)},
                          write_failures=failures)
        journal.add_event(Kind.START, time=started_at, ranks=comm.size, layout=layout, resumed=len(resumed))
        reserve_space(results)  # room for the summary should the disk fill up
        log.info("%s: %s (%d already in the journal) on %s, %s: %s", app.name, counted(len(items), "item"),
                 len(resumed), counted(comm.size, "rank"), counted(total_capacity, "worker"), _placement(layout))
        progress = Progress(len(items), len(resumed), app.name, enabled=not args.no_progress,
                            every=run_settings.progress_seconds)

    settings = PoolSettings(rank=comm.rank, host=host, logs_dir=files.logs, seed=args.seed, threads=threads,
                            batch=args.batch, node_pools=node_pools, global_pools=tuple(global_pools))
    watchdog = Watchdog(args.worker_timeout, args.item_timeout, settings.logs_dir,
                        setup_timeout=getattr(args, "setup_timeout", None))
    # stop: a worker that ends once a stop was asked is not started again
    pool = WorkerPool(app, devices, settings, watchdog, stop_asked=stop)
    monitor = GpuMonitor(devices)
    monitor.start()
    if not nothing_to_run:
        pool.start()
    # started once rank 0 is idle while items run (a busy rank 0, or starting workers, would only be slowed)
    # matplotlib too where rank 0 will draw: the app's figures, or the GPU usage figure
    preloading = preload_figures(app.draws_figures() or app.on_gpu()) if comm.rank == 0 else None
    if comm.rank == 0:  # status.json for python -m common.status
        status = StatusWriter(results, app=app.name, command=module_command(argv),
                              resume_command=_resume_command(app, argv), layout=layout, items_total=len(items),
                              items_resumed=len(resumed), started_at=started_at, pool=pool, monitor=monitor,
                              write_failures=failures, every=run_settings.status_seconds)
    else:
        status = RankReporter(pool, monitor, every=run_settings.status_seconds)
    # rank 0's watch over its followers (which watch its heartbeats in turn)
    liveness = (FollowerWatch(comm, args.heartbeat_timeout, {entry["rank"]: entry["host"] for entry in layout})
                if comm.rank == 0 else None)
    try:  # pool.join() at the very end: rank 0 writes its outputs while its idle workers exit
        try:
            if comm.rank == 0:
                leader = Leader(comm, pool, scheduler, journal, progress=progress, liveness=liveness, stop_signal=stop,
                                grace=args.grace, total_capacity=total_capacity, global_pools=global_pools,
                                status=status, on_idle=preloading.start, write_failures=failures,
                                stop_after_failures=args.stop_after_failures,
                                first_result=lambda result: _named(app, app.first_result_warning(result)))
                try:
                    outcome = leader.run()
                except Exception as error:  # a bug: the status file must not say "running" until it goes stale
                    status.finished(leader, EXIT_FAILED_ITEMS, error_line(described(error)))
                    raise
                status.write(leader, "finishing")
            else:
                follower = Follower(comm, pool, stop, PeerWatch(comm, [0], args.heartbeat_timeout), status=status)
                outcome = follower.run()
        finally:  # kill_after: time for an item to end what it started (pipeline steps)
            # idle workers exit on their own while rank 0 writes the outputs and a follower says its
            # bye (it waited for them before: about 0.1 s more at the end of every multi-rank run);
            # pool.join() below reaps them. A worker still starting (importing torch) is waited for here,
            # up to WORKER_KILL_AFTER: rank 0's heartbeats go on meanwhile, or its followers, which wait
            # for its release, would take it for lost under a --heartbeat-timeout shorter than that
            with liveness.keeping_alive() if liveness is not None else contextlib.nullcontext():
                pool.shutdown(kill_after=WORKER_KILL_AFTER, wait=False)
        report = {"rank": comm.rank, "host": host, "gpu": monitor.stop(), "gpu_series": monitor.series()}
        if comm.rank != 0:
            return _follower_end(comm, follower, outcome, report, layout[0]["host"])
        # from here until the release the followers wait, each watching rank 0's silence
        with leader.liveness.keeping_alive():
            byes = leader.await_byes(args.heartbeat_timeout + WORKER_KILL_AFTER)
            reports = [report] + [byes[rank] for rank in sorted(byes)]
            progress.close()
            if preloading.is_alive():  # matplotlib in one thread at a time: the figures below wait for the warm-up
                preloading.join(60)
            try:
                with stop.writing_outputs():
                    code = _finish(app, argv, fingerprint, outcome, leader, journal, resumed, items, layout, reports,
                                   started_at, failures, drawer, walltime=stop.first == WALLTIME_SIGNAL,
                                   ending=ending)
            except KeyboardInterrupt:  # Ctrl-C three times while writing them: what finished is journaled
                ending.lines.clear()  # what it queued before (a headline) no longer holds
                ending.say(f"{app.name}: stopped (Ctrl-C three times) while writing the outputs; every finished "
                           f"item is journaled: write them {run_it(comm.size)} {_resume_command(app, argv)}")
                code = EXIT_STOPPED
            except Exception:  # a bug: the status file must not say "finishing" for ever (the traceback follows)
                status.finished(leader, EXIT_FAILED_ITEMS)
                raise
            status.finished(leader, code)
        journal.close()
        free_reserve(results)
        if not leader.release(code) or not comm.flush(args.heartbeat_timeout):
            comm.finalize = False  # MPI_Finalize would wait for a rank that is gone
        return code
    finally:
        if drawer is not None:
            drawer.close()  # it never outlives the run (a stop, an error)
        pool.join()


def _check_results_shared(comm: Any, results: Path, host: str) -> None:
    """Warn (rank 0, once) about each node that does not see rank 0's results folder: its
    workers' logs stay on that node's own disk. A collective call, at start-up."""
    if comm.size == 1:
        return
    token = uuid.uuid4().hex if comm.rank == 0 else None
    mark = ResultsLayout(results).shared_probe
    if token:
        mark.write_text(token)
    token = comm.bcast(token)
    try:
        sees = mark.read_text() == token
    except OSError:
        sees = False
    blind = sorted({where for where, ok in comm.allgather((host, sees)) if not ok})
    if comm.rank == 0:
        mark.unlink(missing_ok=True)
        for where in blind:
            log.warning("the results folder %s is not visible from %s: its ranks' and workers' logs stay on that "
                        "node's disk (%s:%s); use a folder every node sees", results, where, where,
                        ResultsLayout(results).logs)


def _follower_end(comm: Any, follower: Follower, outcome: str, report: dict, leader_host: str) -> int:
    """A follower's last words: its report to rank 0, or, when rank 0 fell silent, a stop of its own."""
    if outcome == "lost":
        comm.finalize = False
        message = (f"rank {comm.rank}: lost rank 0 on {leader_host} (no message for {follower.silence:.0f} s); "
                   f"stopped this rank's workers and exiting; finished items are in rank 0's journal: "
                   f"rerun with --resume to finish")
        log.error(message)
        print(message, file=sys.stderr)
        return EXIT_STOPPED
    comm.send(Bye(report), 0)
    release = follower.await_release()
    if release is None:
        comm.finalize = False
        message = (f"rank {comm.rank}: lost rank 0 on {leader_host} while it wrote the outputs (no message for "
                   f"{follower.silence:.0f} s); exiting: rerun with --resume to finish")
        log.error(message)
        print(message, file=sys.stderr)
        return EXIT_STOPPED
    if not release.finalize or not comm.flush(follower.liveness.timeout):
        comm.finalize = False
        # rank 0 ends the job with MPI_Abort; leaving first would make some launchers (hydra) kill
        # rank 0 before it does, and report that instead of the run's exit code
        time.sleep(follower.liveness.timeout)
    return release.code


def _thread_count(comm: Any, host: str, name: str, workers: int, given: Optional[int]) -> int:
    """Torch/BLAS threads per worker: ``given`` (--threads, or kept by a resume), else the rank's
    cores divided by its workers, and by the other ranks on the same node when they share those
    cores (mpiexec -n 2 on one machine; not srun with --cpus-per-task). Where the count puts more
    threads than cores on them, the first of those ranks says so once. A collective call."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    peers = _same_node_peers(comm, host, cores)
    sharing = len(peers)
    fair = max(1, len(cores) // (workers * sharing))
    threads = given or fair
    if threads > fair and threads * workers * sharing > len(cores) and comm.rank == peers[0]:
        log.warning("%s: rank %d: %s x %s%s on %s: more threads than cores slow "
                    "every worker down; --threads %d fits in a new run (a reduction's last bits can then differ "
                    "from a run with %d; a resume keeps the count of the run it resumes: there, fewer workers fit)",
                    name, comm.rank, counted(workers, "worker"), counted(threads, "thread"),
                    f" x {sharing} ranks on this node" if sharing > 1 else "", counted(len(cores), "core"), fair, threads)
    return threads


def _same_node_peers(comm: Any, host: str, what: Any) -> List[int]:
    """The ranks on ``host`` that report the same ``what`` as this one (its GPUs, its cores), in
    rank order, this one included: those that must share them out. A collective call."""
    return [rank for rank, seen in enumerate(comm.allgather((host, what))) if seen == (host, what)]


def _finish(app: App, argv: List[str], fingerprint: dict, outcome: str, leader: Leader, journal: Journal, resumed: dict,
            items: list, layout: list, reports: list, started_at: float, failures: WriteFailures,
            drawer: Optional[TimelineDrawer] = None, *, walltime: bool = False, ending: Ending) -> int:
    """Rank 0: the app's outputs, summary.json and summary.md, the timeline; the exit code; what
    to say at the end, in ``ending``. ``walltime``: the first stop signal was Slurm's walltime warning."""
    args = app.args
    again = run_it(len(layout))  # how the commands said below are run
    results: Path = args.results
    files = ResultsLayout(results)
    scheduler = leader.scheduler
    records = {**resumed, **leader.records}
    journal.check_place()
    failure = failures.first
    if failure is not None and failure.moved_away:  # outputs written now would have no journal behind them
        print(f"{app.name}: stopped: {failure.describe()}; nothing more is written ({len(records)} of {len(items)} "
              f"items had finished, in that journal); if it was renamed, move it back, then finish "
              f"{again} {_resume_command(app, argv)}", file=sys.stderr)
        return EXIT_STOPPED
    failed = [{"key": key, "error": error} for key, error in scheduler.failed.items()]
    final_items = [scheduler.items[item.key] for item in items]
    ended_at = time.time()
    gpu = {worker_name(r["rank"], name): stats for r in reports for name, stats in r["gpu"].items()}
    this_run = list(leader.records.values())
    busy = sum(record.own_seconds for record in this_run)
    # the attempts that gave no result (failed, timed out, ended by a stop): a group's once, as its bars
    lost_attempts = {(bar["worker"], bar["start"], bar["end"]) for bar in leader.other_bars() if not bar["ok"]}
    lost_seconds = sum(max(0.0, end - start) for _, start, end in lost_attempts)
    summary: Dict[str, Any] = {
        "app": app.name,
        "status": {"complete": "complete" if not failed else "failed", "stopped": "stopped"}[outcome],
        "command": module_command(argv),
        "fingerprint": fingerprint,
        "items_total": len(items),
        "items_done": len(records),
        "items_resumed": len(resumed),
        "items_this_run": len(this_run),
        "failed_items": failed,
        "ranks": len(layout),
        "workers": layout,
        # with its UTC offset: read on a machine in another time zone (a laptop, a login node), it is the same time
        "started": datetime.datetime.fromtimestamp(started_at).astimezone().isoformat(timespec="seconds"),
        "wall_seconds": round(ended_at - started_at, 3),
        "item_seconds_total": round(busy, 3),
        "attempt_seconds_without_result": round(lost_seconds, 3),
        "item_seconds_mean": round(busy / len(this_run), 4) if this_run else None,
        "gpu_usage": gpu,
        "lost_ranks": list(leader.lost.values()),
    }
    if outcome != "stopped" and failures.first is None:
        # the figures can take a while (mnist_nn's 100 certainty figures: about 20 s on a CPU): say so,
        # rather than fall silent after 100%
        log.info("%s: the items ended in %.1f s; writing the outputs", app.name, summary["wall_seconds"])
    bars = leader.timeline_bars()
    # the child draws the timeline while this process syncs the journal and writes the GPU figure and the
    # app's outputs
    drawing = bool(bars) and failures.first is None and drawer is not None and drawer.draw(bars, files.timeline)
    journal.sync()  # a filesystem that allocates late says now whether the journal is whole
    full = failures.first is not None  # the run stopped on it: what room is left is for the summary
    if full:
        if drawing and drawer is not None:  # no timeline then
            _abandon_drawing(drawer, files)
            drawing = False
        free_reserve(results)
    if bars and not full and not drawing:
        _written(failures, results, "the timeline", files.root / png_name(TIMELINE_STEM),
                 lambda: plot_timeline(bars, files.timeline))
    summary["gpu_usage_plot"] = None if full else _written(failures, results, "the GPU usage figure",
                                                           files.root / png_name(GPU_USAGE_STEM),
                                                           lambda: write_gpu_usage(reports, results))
    run = None
    outputs_error = None
    interrupted = False  # Ctrl-C three times (common.signals.StopFlag) while the app wrote its files
    if outcome != "stopped" and failures.first is None:
        run = RunInfo(results_dir=results, items=final_items, records=records, failed_items=failed)
        try:
            summary.update(_written(failures, results, "the outputs", results, lambda: app.finish(run)) or {})
        except KeyboardInterrupt:  # the summary below says so: the app's files are part this run's, part earlier
            interrupted = True
        except Exception as error:  # the app's own code: its results stay journaled for a --resume after a fix
            outputs_error, trace = " ".join(f"{type(error).__name__}: {error}".split()), traceback.format_exc()
            log_to_files(f"{app.name}: writing the outputs failed:\n{trace.rstrip()}")
            summary["status"] = "failed"
            summary["outputs_error"] = {"error": outputs_error, "traceback": trace}
    if drawing and drawer is not None and not interrupted:  # done before the summary and report.html, which show it
        try:
            warm_up_report()  # while the child draws
            if _written(failures, results, "the timeline", files.root / png_name(TIMELINE_STEM), drawer.result) is None \
                    and failures.first is None:  # no answer from the child: drawn here after all
                _written(failures, results, "the timeline", files.root / png_name(TIMELINE_STEM),
                         lambda: plot_timeline(bars, files.timeline))
        except KeyboardInterrupt:  # the app's files were written; the summary below is still an earlier run's
            interrupted = True
    if interrupted:  # Ctrl-C three times: no wait for the timeline; the summary says what became of the outputs
        if drawing and drawer is not None:
            _abandon_drawing(drawer, files)
        summary.update(status="stopped", outputs_interrupted=True,  # resume_command: below, as a stop's
                       stopped_because="Ctrl-C three times while the outputs were being written")
    where: Dict[str, Any] = {}  # a stopped run's summary.md shows the app's part only where it said more
    if outcome == "stopped" and failures.first is None:
        stopped = RunInfo(results_dir=results, items=final_items, records=records, failed_items=failed)
        try:
            where = app.where_stopped(stopped) or {}
        except Exception:  # the app's own code: the summary of a stopped run is written without it
            log_to_files(f"{app.name}: saying where the stopped run stands failed:\n{traceback.format_exc().rstrip()}")
            where = {}
        summary.update(where)
    failure = failures.first
    if failure is not None:  # what finished is journaled; --resume writes the rest
        outcome = summary["status"] = "stopped"
        summary["stopped_because"] = failure.describe()
        summary["no_space"] = failure.no_space
        summary["items_journaled"] = _journaled(journal.path, items)
    if leader.gave_up and failure is None:  # said as a stop's reason, and the run failed: no requeue
        summary["status"] = "failed"
        summary["stopped_because"] = leader.stopping
    elif outcome == "stopped" and isinstance(leader.stopping, str) and not summary.get("stopped_because"):
        summary["stopped_because"] = leader.stopping  # the signal: a walltime warning or a cancel, told apart
    if outcome == "stopped" or interrupted:
        summary["resume_command"] = _resume_command(app, argv)
        summary["items_cut_off"] = leader.cut_off  # still running when the wait for them ended
        summary["attempts_cut_off"] = len(leader.cut_attempts())  # of those, drawn grey (where their start was told)
        if outcome == "stopped" and failure is None and not leader.gave_up and _made_no_progress(app, leader, walltime):
            summary["no_progress"] = True  # exit 76: a requeue with the same --time would only repeat it
    elif failed:  # a resume runs the failed items again (after a fix, or for a failure of the moment)
        summary["retry_command"] = _resume_command(app, argv)
        summary["retry_notes"] = _retry_notes(app, summary)
    # a run that wrote none of its outputs (stopped); one whose finish() failed part-way has said so itself
    earlier = _earlier_outputs(files.summary_json) if run is None else None
    if earlier is not None:  # the app's files of an earlier run were left as they were
        summary["earlier_outputs"] = earlier
    # this run's items' timeline; a run that ran none (stopped before any, or a resume with nothing left)
    # has none to show, whatever an earlier run left in the folder
    drawn = bool(bars) and failures.first is None and (files.root / png_name(TIMELINE_STEM)).is_file()
    summary["timeline_plot"] = png_name(TIMELINE_STEM) if drawn else None
    if run is not None:  # the seconds after the items ended: the figures, the app's files
        summary["outputs_seconds"] = round(time.time() - ended_at, 3)
    _written(failures, results, SUMMARY_JSON, files.summary_json, lambda: atomic_write_json(files.summary_json, summary))
    _written(failures, results, SUMMARY_MD, files.summary_md,
             lambda: atomic_write_text(files.summary_md, _summary_markdown(app, summary, not interrupted and (
                 outcome != "stopped" or bool(where)))))
    late = failures.first if failure is None else None
    if late is not None:  # the summary itself: summary.json and the outputs beside it may disagree
        ending.say(f"{app.name}: stopped: {late.describe()}: the outputs in {quoted(str(results))} are incomplete; "
                 f"{late.remedy()}, then write them {again} "
                 f"{_resume_command(app, argv)}")
        return EXIT_STOPPED
    if failure is None:
        write_report(results)
    if failure is not None:
        journaled = summary["items_journaled"]
        ending.say(f"{app.name}: stopped: {failure.describe()}; {'?' if journaled is None else journaled} of "
                 f"{len(items)} items are safely journaled; {failure.remedy()}, then finish {again} "
                 f"{summary['resume_command']}")
        return EXIT_STOPPED
    if interrupted:
        ending.say(f"{app.name}: stopped (Ctrl-C three times) while writing the outputs; every finished item is "
                 f"journaled: write them {again} {summary['resume_command']}")
        return EXIT_STOPPED
    if outcome == "stopped" and leader.gave_up:
        ending.say(f"{app.name}: failed: {leader.stopping}: stopped with {len(records)} of {len(items)} items done; "
                 f"their errors are in {results}/{SUMMARY_MD}; after a fix (or with a larger --stop-after-failures, "
                 f"where such failures are expected), finish {again} {summary['resume_command']}")
        return EXIT_FAILED_ITEMS
    if outcome == "stopped":
        stalled = bool(summary.get("no_progress"))
        ended, caveat = (("a second stop signal ended the wait for them", "where it was the job's time limit (not a "
                          "cancel), ") if leader.wait_cut_short else ("--grace ended", ""))
        said = (f"; none finished in this run's {summary['wall_seconds']:.0f} s, and the "
                f"{counted(leader.cut_off, 'item')} still running when {ended} were cut off: {caveat}a job requeued "
                f"with the same --time would cut them off again; give it a longer --time" if stalled else "")
        ending.say(f"{app.name}: stopped ({leader.stopping}) with {len(records)} of {len(items)} items done{said}; "
                 f"finish {again} {summary['resume_command']}")
        return EXIT_NO_PROGRESS if stalled else EXIT_STOPPED
    if outputs_error is not None:
        ending.say(f"{app.name}: failed: {len(records)} of {len(items)} items done, but writing the outputs failed: "
                 f"{outputs_error} (traceback in {RANK0_LOG}); every result is journaled: after "
                 f"a fix, write the outputs {again} "
                 f"{_resume_command(app, argv)}")
        return EXIT_FAILED_ITEMS
    if not failed and run is not None:  # complete: the app's headline, as the reference's closing prints
        try:  # a list of lines; None (a forgotten return) or a generator that raises are its errors too
            headline = [str(line) for line in app.headline(run, summary) or ()]
        except Exception as error:  # the app's own code: its outputs are written; say so, in one line
            log_to_files(f"{app.name}: making its closing lines failed:\n{traceback.format_exc().rstrip()}")
            ending.say(f"{app.name}: its closing lines could not be made: {error_line(described(error))} (the traceback "
                     f"is in {RANK0_LOG})")
            headline = []
        for line in headline:
            ending.headline(line)
    earlier = f" ({len(resumed)} from an earlier run)" if resumed else ""  # of those done, not of the failed
    counts = f"{len(records)} of {len(items)} items" + (f" done{earlier}, {len(failed)} failed" if failed else earlier)
    outputs = f", the outputs {summary['outputs_seconds']:.1f} s more" if summary.get("outputs_seconds") else ""
    ending.say(f"{app.name}: {summary['status']}: {counts}{',' if failed else ''} in "
             f"{summary['wall_seconds']:.1f} s{outputs}; results in {results}/ ({SUMMARY_MD})")
    if failed:
        for note in summary["retry_notes"]:
            ending.say(f"{app.name}: {note}")
        ending.say(f"{app.name}: run the failed items again {again} {summary['retry_command']}")
    return EXIT_FAILED_ITEMS if failed else EXIT_OK


def _retry_notes(app: App, summary: Dict[str, Any]) -> List[str]:
    """The app's notes for the retry of its failed items (App.retry_notes), each one line; none
    where its own code fails (logged), as for its answer line."""
    try:
        return [error_line(str(note)) for note in app.retry_notes(summary) or ()]
    except Exception:
        log_to_files(f"{app.name}: its notes for the retry failed:\n{traceback.format_exc().rstrip()}")
        return []


def _abandon_drawing(drawer: TimelineDrawer, files: ResultsLayout) -> None:
    """End the timeline's drawing process; a drawing cut short leaves no half-written file."""
    drawer.close()
    _remove_temporary(files.root, TIMELINE_STEM)


def _world_mismatch(launched: int, size: int) -> str:
    """Why this process's MPI world is not the one its launcher started, in one line."""
    try:
        import mpi4py  # noqa: F401
        why = ("the launcher and the MPI library do not work together (under srun: --mpi=pmi2 for the mpich "
               "wheel, see docs/slurm.md; or a launcher of another MPI than mpi4py's)")
    except ImportError:
        why = "mpi4py is not installed in this Python (pip install mpi4py mpich)"
    return (f"the launcher started {launched} ranks, but MPI joined this one to a world of {size}: {why}; "
            f"nothing was run")


def _named(app: App, line: Optional[str]) -> Optional[str]:
    """An app's line as rank 0 prints its own: after the app's name."""
    return f"{app.name}: {line}" if line else None


def _resume_command(app: App, argv: List[str]) -> str:
    """The command that finishes this run: the same, with a plain ``--resume`` (once). A resume
    from a step (the pipelines' ``--resume RUN/STEP``) loses its target: the plain one goes on from
    where this run stopped."""
    kept, words = [], iter(argv)
    for word in words:
        if word == "--resume":
            if app.resume_target:  # argparse took the next word as its target unless it is an option
                following = next(words, None)
                if following is not None and following.startswith("-"):
                    kept.append(following)
            continue
        if not word.startswith("--resume="):
            kept.append(word)
    return module_command(kept + ["--resume"])


def _start_drawer() -> TimelineDrawer:
    """Rank 0's timeline drawer, started (see :class:`TimelineDrawer`)."""
    return TimelineDrawer().start()


def _remove_temporary(folder: Path, stem: str) -> None:
    """The temporary files of ``stem``'s figures that a killed drawing left (``atomic_write_bytes``'s)."""
    for leftover in temporary_files(folder, stem):
        try:
            leftover.unlink()
        except OSError:
            pass


def _written(failures: WriteFailures, results: Path, what: str, path: Path, write: Callable[[], Any]) -> Any:
    """``write()``, one of rank 0's end-of-run outputs; a write that fails for lack of space (or on
    a file of the results folder) is noted in ``failures``, not raised: the run then ends as stopped
    (exit 75)."""
    try:
        return write()
    except OSError as error:
        if not about_results(error, results):
            raise
        failures.note(what, error.filename2 or error.filename or path, error)  # a rename's target
        free_reserve(results)
        return None


def _earlier_outputs(summary_json: Path) -> Optional[Dict[str, Any]]:
    """When and with how many items the app's files now in the folder were written, from the
    summary this run replaces (a run that wrote none: the one it names in turn); None where no run
    wrote any, or that summary cannot be read. A stopped run says so beside its summary: a user
    reading results.csv there would otherwise take an earlier run's results for this one's."""
    try:
        earlier = json.loads(summary_json.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(earlier, dict):
        return None
    if earlier.get("status") in ("complete", "failed") and not earlier.get("outputs_error"):
        return {key: earlier.get(key) for key in ("started", "items_done", "items_total")}
    carried = earlier.get("earlier_outputs")
    return carried if isinstance(carried, dict) else None


def _journaled(path: Path, items: list) -> Optional[int]:
    """How many of ``items`` the journal on disk holds (what --resume will skip); None if unreadable."""
    try:
        _, records = read_journal(path)
    except UsageError:
        return None
    keys = {item.key for item in items}
    return sum(1 for key in records if key in keys)


def _placement(layout: List[Dict[str, Any]]) -> str:
    """Each rank's host, its workers' devices and their threads: two ranks on one host both have a
    cpu0 (a worker's slot, not a core), and the thread count is what a CPU fit's last bits follow."""
    def threads(entry: Dict[str, Any]) -> str:
        count = entry.get("threads")
        return f"; {counted(count, 'thread')} each" if isinstance(count, int) else ""

    return ", ".join(f"rank {entry['rank']} on {entry['host']} [{', '.join(entry['devices'])}{threads(entry)}]"
                     for entry in layout)


class Ending:
    """Rank 0's lines that say how the run ended: in its log at once (which otherwise ends at the
    start-up lines), on the console only once everything they describe is on disk (the summary,
    status.json's last word, the hold released). Under a launcher the console passes through it,
    and a launcher that dies as they pass (``mpiexec ... | head -2``: SIGPIPE, and hydra kills
    the ranks) then cuts off nothing but the console: the folder still says how the run ended."""

    def __init__(self) -> None:
        self.lines: List[Tuple[bool, str]] = []  # (on stderr, the line)

    def say(self, line: str) -> None:
        """A line on stderr (and in the log)."""
        log_to_files(line, logging.INFO)
        self.lines.append((True, line))

    def headline(self, line: str) -> None:
        """One of the app's closing lines, on stdout."""
        self.lines.append((False, line))

    def print(self) -> None:
        lines, self.lines = self.lines, []
        for on_stderr, line in lines:
            print(line, file=sys.stderr if on_stderr else sys.stdout)
        sys.stdout.flush()
        sys.stderr.flush()


def _made_no_progress(app: App, leader: Leader, walltime: bool) -> bool:
    """Whether a requeue of this Slurm job with the same --time would only repeat this start: the
    walltime warning stopped it before any of its items finished, and items were still running
    when --grace ended. Not where an attempt was started again in the run (a retry, a worker or a
    rank lost: a full start might finish it), nor where an item keeps part of its work (a
    pipeline's finished steps). A second stop signal that ended the wait before --grace did may be
    a cancel or the job's time limit, which only the batch script can tell apart (squeue's time
    left): it does not requeue on 76 (exit 76) and says which it was; it also turns a 76 of a step it
    started again in the same job into a requeue."""
    return (settings.in_slurm_job() and walltime
            and not leader.records and leader.cut_off > 0 and not leader.bars and not leader.lost
            and not app.items_resume_part_way)


def _summary_markdown(app: App, summary: Dict[str, Any], with_app_part: bool = True) -> str:
    """summary.md: the run's facts, then (``with_app_part``) the app's own part."""
    this_run = " (this run)" if summary["items_resumed"] else ""  # the times: a resume's own, not its earlier runs'
    lines = [f"# {app.name}: {summary['status']}", ""]
    try:  # the app's own code: a summary without the line rather than none
        answer = app.answer(summary) if with_app_part else None
    except Exception:
        log_to_files(f"{app.name}: its answer line failed:\n{traceback.format_exc().rstrip()}")
        answer = None
    if answer:  # plain text (user values in it are escaped); a failed run's is of the items that finished
        caveat = (f" (of the items that finished: {counted(len(summary['failed_items']), 'item')} failed)"
                  if summary["failed_items"] and not app.answer_counts_failures else "")
        lines += [f"**{markdown_cell(answer)}**{caveat}", ""]
    journaled = summary.get("items_journaled")  # a full disk: not every result that came could be kept
    kept = (f"; {journaled} of those done are journaled (the others run again on --resume)"
            if journaled is not None and journaled < summary["items_done"] else "")
    lines += [f"- command: `{summary['command']}`",
             f"- items: {summary['items_done']} of {summary['items_total']} done "
             f"({summary['items_resumed']} from an earlier run), {len(summary['failed_items'])} failed{kept}",
             f"- ranks: {summary['ranks']}; workers: {_placement(summary['workers'])}",
             f"- wall time: {summary['wall_seconds']:.1f} s{this_run}; "
             f"item time: {summary['item_seconds_total']:.1f} s{this_run}"
             + (f"; attempts that failed or were stopped: {summary['attempt_seconds_without_result']:.1f} s more"
                if round(summary.get("attempt_seconds_without_result") or 0.0, 1) else ""),
             ""]
    for lost in summary.get("lost_ranks", []):
        lines += [f"- **lost rank {lost['rank']} on {lost['host']}** ({lost['why']}): its "
                  f"{counted(lost['items_reassigned'], 'item')} ran on the other ranks", ""]
    if summary.get("stopped_because"):
        cut = summary.get("items_cut_off") or 0
        lines += [f"**Stopped{' for lack of space' if summary.get('no_space') else ''}**: "
                  f"{summary['stopped_because']}." + (f" {counted(cut, 'item')} still running when the wait for "
                                                      f"{'it' if cut == 1 else 'them'} ended {'was' if cut == 1 else 'were'} "
                                                      f"cut off (grey in the timeline); {'it runs' if cut == 1 else 'they run'} "
                                                      f"again on --resume." if cut else ""), ""]
    # the command is the program's: a run of several ranks goes on under its launcher (mpiexec, srun)
    again = run_it(summary.get("ranks") or 1)
    if summary.get("resume_command"):
        fix = ("After a fix, finish" if summary["status"] == "failed"  # --stop-after-failures
               else "No item finished in the job's time: give the job a longer --time, then finish"
               if summary.get("no_progress") else "Finish")
        lines += [f"Stopped before the end. {fix} {again}", "", f"    {summary['resume_command']}", ""]
    if summary.get("retry_command"):
        notes = summary.get("retry_notes") or []
        failed = len(summary["failed_items"])
        lines += [f"{counted(failed, 'item')} failed. "
                  + ("A plain resume would not do for some: " + " ".join(f"{markdown_cell(note)}." for note in notes)
                     + f" Then run {'it' if failed == 1 else 'them'} again {again}" if notes else
                     f"Run {'it' if failed == 1 else 'them'} again (after a fix, or for a failure of the moment) {again}"),
                  "", f"    {summary['retry_command']}", ""]
    earlier = summary.get("earlier_outputs")
    if summary.get("outputs_interrupted"):
        lines += [f"**The app's files in this folder were being written when this run was stopped**: some may be "
                  f"this run's and some an earlier run's. Every result is in `{JOURNAL_NAME}`; finishing with "
                  f"`--resume` writes them all again.", ""]
    if earlier:
        lines += [f"**The app's files in this folder are an earlier run's** (started {earlier['started']}, "
                  f"{earlier['items_done']} of {earlier['items_total']} items): none of this run's results are in "
                  f"them. Every result is in `{JOURNAL_NAME}`; finishing with `--resume` writes them all again.", ""]
    if summary.get("outputs_error"):
        lines += [f"**The app's outputs could not be written**: {summary['outputs_error']['error']}. Every result "
                  f"is in `{JOURNAL_NAME}`; the traceback is in `{LOGS_DIR}/` and {SUMMARY_JSON}. After a fix, "
                  f"run the command above with `--resume` to write them.", ""]
    if summary["gpu_usage"]:
        lines += ["| GPU | utilisation mean % | peak % | memory mean MiB | peak MiB |", "|---|---|---|---|---|"]
        measures = ("util_mean_percent", "util_peak_percent", "memory_mean_mib", "memory_peak_mib")
        lines += [f"| {name} | " + " | ".join("n/a" if s[m] is None else f"{s[m]:.0f}" for m in measures) + " |"
                  for name, s in summary["gpu_usage"].items()]
        lines.append("")
    if summary.get("gpu_usage_plot"):
        lines += [f"![GPU use over time]({summary['gpu_usage_plot']})", ""]
    if summary["failed_items"]:
        lines += ["## Failed items", "", "| item | error |", "|---|---|"]
        lines += [f"| {markdown_cell(f['key'])} | {markdown_cell(error_line(f['error'] or ''))} |"
                  for f in summary["failed_items"]]
        lines += ["", f"Each failure in full (with its traceback, for an error in the code) is in `{LOGS_DIR}/` and "
                      f"`{JOURNAL_NAME}`.", ""]
    if summary.get("timeline_plot"):
        lines += [f"![timeline]({summary['timeline_plot']})", ""]
    try:
        app_part = (app.summary_markdown(summary) or "").rstrip() if with_app_part else ""
    except Exception as error:  # the app's own code: the run's part of summary.md is written all the same
        log_to_files(f"{app.name}: making its part of {SUMMARY_MD} failed:\n{traceback.format_exc().rstrip()}")
        print(f"{app.name}: its part of {SUMMARY_MD} could not be made: {error_line(described(error))} (the traceback "
              f"is in {RANK0_LOG})", file=sys.stderr)
        app_part = (f"**{app.name}'s own part of this summary could not be made**: "
                    f"{markdown_cell(error_line(described(error)))} (the traceback is in `{RANK0_LOG}`).")
    if app_part:
        lines += [app_part.rstrip(), ""]
    return "\n".join(lines)
