"""Every name in a results folder, in one place: the engine's files, the pipeline's and sweep's,
and the shipped apps'. Other modules name a file through this module, never by a literal, so a
reader (resume, ``python -m common.status``, report.html, the benchmarks) and the writer cannot
drift apart; tests/test_layout.py keeps it so. Imports nothing but the standard library.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

#: the suffixes every figure is written with (matplotlib, one file each)
FIGURE_SUFFIXES = (".png", ".svg", ".pdf")

# --- the engine's files at the top of a results folder ---
JOURNAL_NAME = "journal.jsonl"
HOLD_NAME = "hold.json"
STATUS_NAME = "status.json"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
REPORT_NAME = "report.html"
TIMELINE_STEM = "timeline"
GPU_USAGE_STEM = "gpu_usage"
GPU_USAGE_CSV = f"{GPU_USAGE_STEM}.csv"
#: the engine's folder of rank and worker logs
LOGS_DIR = "logs"
#: the names of the logs in it: a rank's (``rank0.log``) and its workers' (``rank0-gpu1.log``)
LOG_PATTERN = "rank*.log"
#: hidden files the engine makes and removes: the disk-space reserve, the writability and
#: shared-folder probes
RESERVE_NAME = ".space-reserve"
WRITE_PROBE = ".write-test"
SHARED_PROBE = ".shared-check"


def figure_names(stem: str) -> Tuple[str, ...]:
    """A figure's file names: ``stem.png``, ``stem.svg``, ``stem.pdf``."""
    return tuple(stem + suffix for suffix in FIGURE_SUFFIXES)


#: an atomic write goes through a hidden file beside its target, ``.NAME.<random>.tmp``, renamed over it
TEMPORARY_SUFFIX = ".tmp"


def temporary_prefix(name: str) -> str:
    """The start of the temporary file's name of an atomic write of ``name``."""
    return f".{name}."


def temporary_files(folder: Path, stem: str) -> List[Path]:
    """The temporary files that atomic writes of ``stem.*`` left in ``folder`` (their writer killed)."""
    return sorted(folder.glob(f"{temporary_prefix(stem)}*{TEMPORARY_SUFFIX}"))


def png_name(stem: str) -> str:
    """The figure's ``.png``: what summary.md and report.html show."""
    return stem + FIGURE_SUFFIXES[0]


#: what the engine writes at the top of the results folder (each checked replaceable on --resume)
ENGINE_OUTPUTS = (SUMMARY_JSON, SUMMARY_MD, REPORT_NAME, STATUS_NAME, *figure_names(TIMELINE_STEM),
                  *figure_names(GPU_USAGE_STEM), GPU_USAGE_CSV, JOURNAL_NAME)

# --- a pipeline run: RESULTS/RUN_ID/{shared, progress.json, STEP_ID/...} ---
SHARED_DIR = "shared"
PROGRESS_FILE = "progress.json"
STEP_STATUS_NAME = STATUS_NAME
STEP_STDOUT = "stdout.log"
STEP_STDERR = "stderr.log"
STEP_RESULT = "result.json"
STEP_PROMPT = "prompt.md"
STEP_OUTPUT = "output.md"
#: the files a step's folder holds (each a regular file, where there)
STEP_FILES = (STEP_STATUS_NAME, STEP_STDOUT, STEP_STDERR, STEP_RESULT, STEP_PROMPT, STEP_OUTPUT)

# --- a sweep's files and those the shipped apps write (results.csv is both a sweep's and mnist_nn's) ---
RESULTS_CSV = "results.csv"
RESULTS_JSONL = "results.jsonl"
SWEEP_FIGURE_STEM = "sweep"
MODELS_DIR = "models"
TENSORBOARD_DIR = "tensorboard"
TRAINING_LOG_CSV = "training_log.csv"
CV_RESULTS_CSV = "cv_results.csv"
ENSEMBLE_JSON = "ensemble.json"
ENSEMBLE_ERROR_STEM = "ensemble_error"
TRAINING_CURVES_STEM = "training_curves"
FITS_CSV = "fits.csv"
VALIDATION_ERROR_NPY = "validation_error.npy"
VALIDATION_HEATMAP_STEM = "validation_heatmap"
VALIDATION_BOXPLOTS_STEM = "validation_boxplots"
#: the reference's figure per gamma, validation_error_<i_gamma>, in this folder of the results
PER_GAMMA_FOLDER = "validation_error_by_gamma"
#: mnist_nn's certainty figures' folder in the results, and their names in it
CERTAINTY_FOLDER = "certainty"
TEST_IMAGE_NAME = "test_image_{}"
MISCLASSIFIED_NAME = "first_misclassified_{}"

#: every name above, for tests/test_layout.py
NAMES = (JOURNAL_NAME, HOLD_NAME, STATUS_NAME, SUMMARY_JSON, SUMMARY_MD, REPORT_NAME, TIMELINE_STEM,
         *figure_names(TIMELINE_STEM), GPU_USAGE_STEM, *figure_names(GPU_USAGE_STEM), GPU_USAGE_CSV, LOGS_DIR,
         RESERVE_NAME, WRITE_PROBE, SHARED_PROBE, SHARED_DIR, PROGRESS_FILE, STEP_STDOUT, STEP_STDERR,
         STEP_RESULT, STEP_PROMPT, STEP_OUTPUT, RESULTS_CSV, RESULTS_JSONL, *figure_names(SWEEP_FIGURE_STEM),
         MODELS_DIR, TENSORBOARD_DIR, TRAINING_LOG_CSV, CV_RESULTS_CSV, ENSEMBLE_JSON, ENSEMBLE_ERROR_STEM,
         TRAINING_CURVES_STEM, FITS_CSV, VALIDATION_ERROR_NPY, VALIDATION_HEATMAP_STEM, VALIDATION_BOXPLOTS_STEM,
         PER_GAMMA_FOLDER, CERTAINTY_FOLDER, TEST_IMAGE_NAME, MISCLASSIFIED_NAME)


@dataclass(frozen=True)
class ResultsLayout:
    """Where each of the engine's files lives in one results folder (``--results``)."""

    root: Path

    @property
    def journal(self) -> Path:
        return self.root / JOURNAL_NAME

    @property
    def hold(self) -> Path:
        return self.root / HOLD_NAME

    def hold_temporary(self, token: str) -> Path:
        """Where a hold is written before it is renamed into place."""
        return self.root / f".{HOLD_NAME}.{token}"

    def hold_stale(self, token: str) -> Path:
        """Where a stale hold is set aside before it is removed."""
        return self.root / f".{HOLD_NAME}.{token}.stale"

    @staticmethod
    def is_hold_file(name: str) -> bool:
        """The hold or one of its temporary names."""
        return name == HOLD_NAME or name.startswith(f".{HOLD_NAME}.")

    @property
    def status(self) -> Path:
        return self.root / STATUS_NAME

    @property
    def summary_json(self) -> Path:
        return self.root / SUMMARY_JSON

    @property
    def summary_md(self) -> Path:
        return self.root / SUMMARY_MD

    @property
    def report(self) -> Path:
        return self.root / REPORT_NAME

    @property
    def timeline(self) -> Path:
        """The timeline's stem (the figure is written with each of FIGURE_SUFFIXES)."""
        return self.root / TIMELINE_STEM

    @property
    def gpu_usage(self) -> Path:
        """The GPU usage figure's stem."""
        return self.root / GPU_USAGE_STEM

    @property
    def gpu_usage_csv(self) -> Path:
        return self.root / GPU_USAGE_CSV

    @property
    def logs(self) -> Path:
        return self.root / LOGS_DIR

    def rank_log(self, rank: int) -> Path:
        return self.logs / rank_log_name(rank)

    @property
    def reserve(self) -> Path:
        return self.root / RESERVE_NAME

    @property
    def shared_probe(self) -> Path:
        return self.logs / SHARED_PROBE


def rank_log_name(rank: int) -> str:
    """A rank's log's name in the logs folder (``rank0.log``)."""
    return f"rank{rank}.log"


#: where rank 0's log is, as messages name it (rank 0's tracebacks are there)
RANK0_LOG = f"{LOGS_DIR}/{rank_log_name(0)}"


def worker_name(rank: int, device: object) -> str:
    """A worker's name, ``rank0-gpu1`` (``rank0-gpu1.2`` with --workers-per-gpu): its log's name,
    its row in the timeline, its series in the GPU usage figure."""
    return f"rank{rank}-{device}"


def worker_rank_and_device(name: str) -> tuple:
    """(rank, device) of a :func:`worker_name`; rank 0 where the name is not one."""
    rank, _, device = name.partition("-")
    return (int(rank[4:]) if rank.startswith("rank") and rank[4:].isdigit() else 0), device


def worker_log(logs_dir: Path, worker_name: str) -> Path:
    """A worker's log in the logs folder."""
    return Path(logs_dir) / f"{worker_name}.log"
