"""Writing results so that a killed run never leaves a half-written file behind."""
from __future__ import annotations

import functools
import io
import json
import os
import struct
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, Iterable, List, Optional, Sequence

from common.errors import UsageError, quoted
from common.results.layout import TEMPORARY_SUFFIX, temporary_prefix


@functools.lru_cache(maxsize=None)
def _umask() -> int:
    """The process's umask, read once, at the first atomic write rather than at import: from
    /proc/self/status (Linux 4.7 and later), which changes nothing. Only where that cannot be read is
    it set for a moment and put back, which a thread creating a file meanwhile would see."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes, *, parents: bool = True) -> None:
    """Write to a temporary file beside ``path``, then rename it over ``path``."""
    atomic_write_with(path, lambda handle: handle.write(data), parents=parents)


def atomic_write_with(path: Path, write: Callable[[BinaryIO], Any], *, parents: bool = True) -> None:
    """``write(handle)`` into a temporary file beside ``path``, then rename it over ``path``: for
    what is too big to hold in memory as bytes first. ``parents=False`` for a file rewritten while
    a run goes on (status.json, the hold): where its folder was moved or deleted meanwhile, raise
    FileNotFoundError rather than make an empty results folder again at the old place."""
    path = Path(path)
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix(path.name), suffix=TEMPORARY_SUFFIX)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; results are for the whole group to read
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


#: ``FS_IOC_GETFLAGS`` and its immutable and append-only bits (``chattr +i``, ``chattr +a``)
_GETFLAGS, _IMMUTABLE, _APPEND_ONLY = 0x80086601, 0x10, 0x20


def _inode_flags(path: Path) -> int:
    """The file's inode flags where the filesystem has them (ext4, xfs, btrfs, tmpfs), else 0."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(fd, _GETFLAGS, bytes(8))[:4])[0]
    except OSError:  # ENOTTY: NFS, Lustre, GPFS have no such flags
        return 0
    finally:
        os.close(fd)


def check_replaceable(folder: Path, files: Iterable[str] = (), skip: Iterable[str] = ()) -> None:
    """Before a run writes into ``folder`` again (``--resume``): every output an earlier run left
    there can be replaced at the end, so the run does not do its work and then fail half-way
    through its outputs, leaving new figures beside an old summary. Refuses (UsageError) an
    immutable or append-only file or folder anywhere under ``folder`` (but in ``skip``), and a
    folder where one of ``files`` (names the run writes) should be."""
    folder = Path(folder)
    for name in files:
        if (folder / name).is_dir():
            raise UsageError(f"--results {quoted(folder)}: {quoted(folder / name)} is a folder, where the run "
                             f"writes a file; move it away")
    skipped = set(skip)
    for root, dirs, names in os.walk(folder):
        if Path(root) == folder:
            dirs[:] = [name for name in dirs if name not in skipped]
            names = [name for name in names if name not in skipped]
        for name in dirs + names:
            path = Path(root) / name
            flags = _inode_flags(path)
            if flags & (_IMMUTABLE | _APPEND_ONLY):
                kind = "immutable" if flags & _IMMUTABLE else "append-only"
                raise UsageError(f"--results {quoted(folder)}: {quoted(path)} is {kind} (lsattr shows it), so the "
                                 f"run could not replace it at the end; chattr -{'i' if flags & _IMMUTABLE else 'a'} "
                                 f"it or choose another --results")


def atomic_write_text(path: Path, text: str, *, parents: bool = True) -> None:
    """UTF-8; text that cannot be (a path or argument of bytes that are not UTF-8, which Python
    holds as lone surrogates) is written as its escape (``\\udcff``), as stderr shows it, instead of
    failing the run's outputs at the end."""
    atomic_write_bytes(path, text.encode("utf-8", "backslashreplace"), parents=parents)


def json_key(key: Any) -> str:
    """A key as json spells it (true, false, null; a number's repr), anything else as str()."""
    if type(key) is str:
        return key
    if key is True or key is False or key is None:
        return json.dumps(key)
    return str(key)


def to_jsonable(value: Any) -> Any:
    """numpy scalars and arrays, torch tensors, Paths and tuples as plain JSON values."""
    kind = type(value)
    if kind is str or kind is int or value is None or kind is bool:  # most values: rank 0 journals every result
        return value
    if kind is float:
        return None if value != value else value  # NaN is not JSON
    if isinstance(value, dict):
        return {json_key(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    np = sys.modules.get("numpy")  # a numpy value exists only where numpy was imported: never imported here
    if np is not None and isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if np is not None and isinstance(value, np.generic):
        plain = value.item()  # a NaN of numpy's as None too, as a resume reads it back
        return plain if isinstance(plain, np.generic) else to_jsonable(plain)  # a long double stays one: not JSON
    torch = sys.modules.get("torch")  # {"loss": loss} with loss a tensor, maybe on the GPU: its number(s)
    if torch is not None and isinstance(value, torch.Tensor):
        return to_jsonable(value.detach().cpu().tolist())
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and value != value:  # NaN is not JSON
        return None
    return value


def atomic_write_json(path: Path, value: Any, *, parents: bool = True) -> None:
    atomic_write_text(path, json.dumps(to_jsonable(value), indent=2, sort_keys=False) + "\n", parents=parents)


def preload_figures(figures: bool = True) -> threading.Thread:
    """A daemon thread (not started) that imports what the end-of-run figures and report need
    (matplotlib and its PNG, SVG and PDF backends, the fonts, markdown: about a second of CPU) and
    uses each once: started while the items run and rank 0 is idle, the run's end need not wait for
    it. ``figures=False`` (rank 0 draws none): markdown only."""
    def load() -> None:
        try:
            import markdown as markdown_module

            markdown_module.markdown("# warm-up\n\n| a |\n|---|\n| 1 |", extensions=["tables", "fenced_code"])
            if not figures:
                return
            import matplotlib.backends.backend_agg  # noqa: F401
            import matplotlib.backends.backend_pdf  # noqa: F401
            import matplotlib.backends.backend_svg  # noqa: F401
            import matplotlib.figure  # noqa: F401

            warm_up_figures()
        except Exception:  # only a head start: the figures import what they need anyway, and say what fails
            pass

    # The caller joins it before drawing anything itself: matplotlib is not to be used from two threads at once
    return threading.Thread(target=load, name="preload-figures", daemon=True)


def warm_up_figures(enough: Optional[threading.Event] = None) -> None:
    """One small figure laid out and saved in every format: the fonts, text layout, rasterised
    parts and each backend's first use, so that the real figures are drawn at once. Once
    ``enough`` is set it stops after the step it is in (the real drawing has begun, and makes
    those first uses itself)."""
    fig, ax = new_figure(2, 1)
    ax.broken_barh([(0, 1)], (0, 1), rasterized=True)
    ax.set_title("warm-up")
    steps = [fig.draw_without_rendering] + [
        functools.partial(fig.savefig, io.BytesIO(), format=form, **_SAVE_OPTIONS[form]) for form in FIGURE_FORMATS]
    for step in steps:
        if enough is not None and enough.is_set():
            return
        step()


def new_figure(width: float, height: float, rows: int = 1, columns: int = 1, **subplots: Any) -> tuple:
    """(figure, axes) outside pyplot's global state, so no display or GUI backend is needed;
    ``subplots`` go to ``Figure.subplots`` (``squeeze``, ``gridspec_kw``, ...)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    return fig, fig.subplots(rows, columns, **subplots)


#: the formats of every figure: PNG (summary.md, report.html), SVG (sharp in a browser), PDF (papers, as the reference)
FIGURE_FORMATS = ("png", "svg", "pdf")
#: a set of many figures of one kind (a hundred certainty figures, a box plot per gamma): no SVG, the slowest to
#: write and to open
FIGURE_SET_FORMATS = ("png", "pdf")
#: no creation date in SVG and PDF: the same figure gives the same bytes, run after run
_SAVE_OPTIONS: Dict[str, Dict[str, Any]] = {"png": {"dpi": 120}, "svg": {"metadata": {"Date": None}},
                                            "pdf": {"metadata": {"CreationDate": None}}}


def save_figure(fig: Any, path_without_suffix: Path, formats: Sequence[str] = FIGURE_FORMATS, *,
                tight: bool = True) -> List[Path]:
    """Save a matplotlib figure in each of ``formats`` (atomically); returns the paths.

    ``tight`` crops to what is drawn, measured once rather than once per format as
    ``bbox_inches="tight"`` does; ``tight=False`` keeps the figure's own size (a figure redrawn
    for many images, all the same size). Figures come from :func:`new_figure`, outside pyplot:
    nothing to close, and one figure can be redrawn and saved again."""
    import io

    import matplotlib

    base = Path(path_without_suffix)
    box = None
    if tight:
        fig.draw_without_rendering()
        box = fig.get_tightbbox().padded(matplotlib.rcParams["savefig.pad_inches"])
    written = []
    with matplotlib.rc_context({"svg.hashsalt": "multinode-gpu"}):  # the SVG's ids: else random each time
        for form in formats:
            buffer = io.BytesIO()
            fig.savefig(buffer, format=form, bbox_inches=box, **_SAVE_OPTIONS[form])
            target = base.with_suffix(f".{form}")
            atomic_write_bytes(target, buffer.getvalue())
            written.append(target)
    return written
