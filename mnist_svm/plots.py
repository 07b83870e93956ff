"""The figures of a grid search: a heatmap of mean validation error, and the reference's box plots
(all gammas in one figure, and one figure per gamma as the reference wrote them)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, List

import numpy as np
from matplotlib.colors import LogNorm
from matplotlib.patches import Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

from common import FIGURE_SET_FORMATS, counted, new_figure, save_figure
from common.results.layout import PER_GAMMA_FOLDER

from .grid import Grid, fold_mean


def plot_heatmap(grid: Grid, table: np.ndarray, best_i_c: int, best_i_gamma: int, path: Path) -> List[Path]:
    """Mean validation error over C (x) by gamma (y), both on log scales, the best pair starred."""
    mean = fold_mean(table)
    log_c, log_gamma = np.log10(grid.c_values), np.log10(grid.gamma_values)
    percent = mean * 100
    finite = percent[np.isfinite(percent)]
    # a log colour scale keeps the good corner readable next to the 90 % failures
    norm = LogNorm(vmin=max(float(finite.min()), 0.01), vmax=max(float(finite.max()), 0.02)) if finite.size else None
    fig, axes = new_figure(6.4, 5.0, squeeze=False)
    ax = axes[0][0]
    image = ax.imshow(np.clip(percent, 0.01, None), origin="lower", aspect="auto", cmap="viridis_r", norm=norm,
                      extent=_extent(log_c) + _extent(log_gamma))
    bar = fig.colorbar(image, ax=ax, label="mean validation error (%)")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    bar.ax.yaxis.set_major_formatter(plain)
    bar.ax.yaxis.set_minor_formatter(plain)
    if norm is not None and norm.vmax < 10 * norm.vmin:  # within a decade a log bar labels its low end only
        bar.set_ticks([t for t in MaxNLocator(nbins=5).tick_values(norm.vmin, norm.vmax) if norm.vmin <= t <= norm.vmax])
        bar.ax.yaxis.set_minor_formatter(NullFormatter())
    folds_done = np.sum(~np.isnan(table), axis=0)  # a mean of fewer folds than the title says is marked so
    partial = (folds_done > 0) & (folds_done < grid.folds)
    if grid.n_tuning <= 8:
        step = (_extent(log_gamma)[1] - _extent(log_gamma)[0]) / grid.n_tuning
        for i_gamma in range(grid.n_tuning):
            for i_c in range(grid.n_tuning):
                value = percent[i_gamma, i_c]
                dark = norm is not None and np.isfinite(value) and norm(max(value, 0.01)) > 0.5
                shift = -0.3 * step if (i_c, i_gamma) == (best_i_c, best_i_gamma) else 0.0
                text = "failed" if np.isnan(value) else f"{value:.1f}"
                if partial[i_gamma, i_c]:
                    text += f"\n({folds_done[i_gamma, i_c]}/{grid.folds} folds)"
                ax.text(log_c[i_c], log_gamma[i_gamma] + shift, text,
                        ha="center", va="center", fontsize=8, color="white" if dark else "black")
    else:  # too many cells for numbers: the partial ones hatched
        width, height = ((edges[1] - edges[0]) / grid.n_tuning for edges in (_extent(log_c), _extent(log_gamma)))
        for i_gamma, i_c in zip(*np.nonzero(partial)):
            ax.add_patch(Rectangle((log_c[i_c] - width / 2, log_gamma[i_gamma] - height / 2), width, height,
                                   fill=False, hatch="///", edgecolor="white", linewidth=0))
    ax.plot(log_c[best_i_c], log_gamma[best_i_gamma], marker="*", markersize=16, color="red",
            markeredgecolor="white", linestyle="none")
    # ticks on the cells, labelled with the grid's own values: whole-number log10 ticks fell between
    # the rows (log10 gamma -4.67 read as 1e-5 against the box plots' 2.15e-05)
    ax.set_xticks(*_value_ticks(grid.c_values))
    ax.set_yticks(*_value_ticks(grid.gamma_values))
    if 4 < len(grid.c_values) <= MAX_TICKS:  # values side by side ("2.68e+03" beside "5.18e+04") ran together
        ax.tick_params(axis="x", labelrotation=90)
    ax.set_xlabel("C (log scale)")
    ax.set_ylabel("gamma (log scale)")
    missing = f"\n{counted(int(partial.sum()), 'cell')}: the mean of the folds that finished" if partial.any() else ""
    ax.set_title(f"{grid.folds}-fold cross-validation error; best (star): "
                 f"C={grid.c_values[best_i_c]:.3g}, gamma={grid.gamma_values[best_i_gamma]:.3g}{missing}", fontsize=10)
    return save_figure(fig, path)


#: the most cells on an axis of the heatmap that each get a tick with its value
MAX_TICKS = 8


def _value_ticks(values: np.ndarray) -> tuple:
    """(positions, labels) of the heatmap's ticks on log10 positions: up to ``MAX_TICKS`` values,
    one on each cell, named with its value; a finer grid (cells too narrow for their values), the
    powers of ten its cells span."""
    logs = np.log10(values)
    if len(values) <= MAX_TICKS:
        return logs, [f"{value:.3g}" for value in values]
    powers = np.arange(math.ceil(logs.min() - 1e-9), math.floor(logs.max() + 1e-9) + 1)
    return powers, [f"$10^{{{power}}}$" for power in powers]


def _extent(values: np.ndarray) -> list:
    """Cell edges around evenly spaced centres (one value: a unit-wide cell)."""
    step = (values[-1] - values[0]) / (len(values) - 1) if len(values) > 1 else 1.0
    return [values[0] - step / 2, values[-1] + step / 2]


def _boxplot_panel(ax: Any, grid: Grid, table: np.ndarray, i_gamma: int) -> None:
    """The fold errors (%) at each C for one gamma, boxes at their log10 C as the reference drew them."""
    log_c = np.log10(grid.c_values)
    step = (log_c[-1] - log_c[0]) / (len(log_c) - 1) if len(log_c) > 1 else 1.0
    data = [column[~np.isnan(column)] * 100 for column in table[:, i_gamma, :].T]
    # boxes at their log10 C, so the axis reads as numbers however fine the grid
    ax.boxplot(data, positions=log_c, widths=0.6 * step, manage_ticks=False)
    ax.set_xlim(*_extent(log_c))


def plot_boxplots(grid: Grid, table: np.ndarray, path: Path) -> List[Path]:
    """One panel per gamma: the fold errors at each C, as the reference drew them."""
    columns = min(grid.n_tuning, 4)
    rows = math.ceil(grid.n_tuning / columns)
    fig, axes = new_figure(3.6 * columns, 2.8 * rows, rows, columns, squeeze=False)
    for i_gamma in range(rows * columns):
        ax = axes[i_gamma // columns][i_gamma % columns]
        if i_gamma >= grid.n_tuning:
            ax.set_visible(False)
            continue
        _boxplot_panel(ax, grid, table, i_gamma)
        ax.set_title(f"gamma = {grid.gamma_values[i_gamma]:.3g}", fontsize=9)
        ax.set_xlabel("log10 C", fontsize=8)
        ax.set_ylabel("validation error (%)", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_boxplots_per_gamma(grid: Grid, table: np.ndarray, folder: Path) -> List[str]:
    """The reference's figures: one per gamma (``validation_error_<i>``, PNG and PDF), the fold
    errors at each C; the same panels as ``plot_boxplots``, each on its own page. Returns their
    names relative to ``folder``, without suffix."""
    names = []
    for i_gamma in range(grid.n_tuning):
        fig, ax = new_figure(6.4, 4.8)
        _boxplot_panel(ax, grid, table, i_gamma)
        gamma = grid.gamma_values[i_gamma]
        ax.set_title(f"log10 gamma = {np.log10(gamma):.4g} (gamma = {gamma:.3g})")
        ax.set_xlabel("log10 C")
        ax.set_ylabel(f"validation error over {grid.folds} folds (%)")
        name = f"{PER_GAMMA_FOLDER}/validation_error_{i_gamma}"
        save_figure(fig, Path(folder) / name, FIGURE_SET_FORMATS)
        names.append(name)
    return names
