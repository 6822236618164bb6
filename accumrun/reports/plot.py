"""Loss curves of runs: training and validation loss per epoch from their ``metrics.jsonl`` rows, and the
sharpness beside its 2/learning-rate line and the gradient noise scale beside the batch size, where a run measured
them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accumrun.errors import DataError
from accumrun.rundir.atomic import write_atomically

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_MARKER_EPOCHS = 30  # beyond this many epochs markers merge into a thick line and only add clutter
_DASHED = {"sharpness": "sharpness_limit", "gradient_noise_scale": "batch_size"}
"""A panel's companion, dashed in its curve's colour: the sharpness's stability limit, the noise scale's batch."""
_Y_LABELS = {"sharpness": "largest Hessian eigenvalue", "gradient_noise_scale": "samples"}


def plot_curves(curves: dict[str, list[dict[str, Any]]], out: Path, title: str = "") -> Path:
    """Draw training and validation loss against epoch, one line per curve, and save the figure at ``out`` in the
    format its suffix names (PNG without one; its folder created; written atomically, so it is either complete or
    absent); return ``out``.

    ``curves`` maps a legend label to metrics rows (as from :func:`accumrun.rundir.metrics.load_metrics`) with
    ``epoch`` and ``loss``; the validation panel is left out when no row has ``val_loss``, the sharpness panel (with
    each curve's ``sharpness_limit`` dashed) when none has ``sharpness``, the noise-scale panel (with each curve's
    ``batch_size`` dashed) when none has ``gradient_noise_scale``. An empty ``curves``, or a curve without
    rows, is a DataError.
    """
    # Imported here so that importing accumrun (and `accumrun --help`) does not pay for matplotlib.
    from matplotlib.figure import Figure

    if not curves:
        raise DataError("curves", "no curves to plot")
    for label, rows in curves.items():
        if not rows:
            raise DataError(f"curves[{label!r}]", "has no rows")

    panels = _panels(curves)
    markers = max(len(rows) for rows in curves.values()) <= _MARKER_EPOCHS

    # The Figure API draws with Agg on savefig without touching pyplot's global backend or figure registry.
    width = {1: 7, 2: 11, 3: 15, 4: 19}[len(panels)]
    figure = Figure(figsize=(width, 4.5), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for ax, (key, name) in zip(axes, panels, strict=True):
        _draw_panel(ax, curves, key, name, markers=markers)

    # One shared legend below the panels: long labels get the full width instead of covering the curves.
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:  # none when no row has a "loss"; an empty legend would only warn
        # About 15 small-font characters per inch; a column also needs room for its line sample.
        columns = max(1, min(len(labels), int(width * 15) // (max(map(len, labels)) + 8)))
        figure.legend(handles, labels, loc="outside lower center", ncols=columns, fontsize="small", frameon=False)
    if title:
        figure.suptitle(title)

    kind = out.suffix.lower().removeprefix(".") or "png"  # the temporary's name does not say it
    return write_atomically(out, lambda temporary: figure.savefig(temporary, dpi=120, format=kind))


def _panels(curves: dict[str, list[dict[str, Any]]]) -> list[tuple[str, str]]:
    """Each panel's key and title: the training loss, and the validation loss, the sharpness and the noise scale
    where some curve has them."""
    panels = [("loss", "training loss")]
    if any("val_loss" in row for rows in curves.values() for row in rows):
        panels.append(("val_loss", "validation loss"))
    if any("sharpness" in row for rows in curves.values() for row in rows):
        # An adaptive optimizer (Adam and its kin) has no stability limit to draw.
        limited = any("sharpness_limit" in row for rows in curves.values() for row in rows)
        panels.append(("sharpness", f"sharpness ({'dashed: its stability limit' if limited else 'no limit'})"))
    if any("gradient_noise_scale" in row for rows in curves.values() for row in rows):
        panels.append(("gradient_noise_scale", "gradient noise scale (dashed: the batch size)"))
    return panels


def _draw_panel(ax: Axes, curves: dict[str, list[dict[str, Any]]], key: str, name: str, *, markers: bool) -> None:
    """One panel: ``key`` (``loss``, ``val_loss``, ``sharpness`` or ``gradient_noise_scale``) against epoch for every
    curve that has it; the sharpness with its curve's ``sharpness_limit``, the noise scale with its ``batch_size``,
    dashed."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogFormatter, MaxNLocator, NullLocator

    class PlainLogFormatter(LogFormatter):
        # LogFormatter picks which ticks to label; print those as 0.3 rather than 3e-01 or 3x10^-1.
        def __call__(self, x: float, pos: int | None = None) -> str:
            return f"{x:g}" if super().__call__(x, pos) else ""

    values: list[float] = []
    for index, (label, rows) in enumerate(curves.items()):
        points = [(row["epoch"], row[key]) for row in rows if key in row]
        if not points:
            continue
        epochs, losses = zip(*points, strict=True)
        values += losses
        # Fixed colour per label, so a curve without val_loss does not shift the colours of the others.
        ax.plot(epochs, losses, label=label, color=f"C{index}", marker="o" if markers else None, markersize=3)
        if key in _DASHED:
            limits = [(row["epoch"], row[_DASHED[key]]) for row in rows if _DASHED[key] in row]
            if limits:
                ax.plot(*zip(*limits, strict=True), color=f"C{index}", linestyle="--", linewidth=1)
                values += [limit for _, limit in limits]
    if values and min(values) > 0:
        span = (min(values), max(values))
        ax.set_yscale("log")  # losses span decades; a linear axis flattens everything after epoch 1
        if span[1] < 10 * span[0]:
            # Within a decade a log axis may have no tick but its base (0.9 to 1.6 has only 1): tick it as a
            # linear axis would, at round values.
            # Round ticks from one at or below the lowest value, so that a label sits there; where six put that one
            # at zero (0.07 to 0.6), twelve finer ones find one above it.
            for bins in (6, 12):
                ticks = [t for t in MaxNLocator(nbins=bins, steps=[1, 2, 2.5, 5, 10]).tick_values(*span) if t > 0]
                if ticks[0] <= span[0]:
                    break
            ax.set_ylim(min(ticks[0], span[0]), max(ticks[-1], span[1]))
            ax.yaxis.set_major_locator(FixedLocator(ticks))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
            ax.yaxis.set_minor_locator(NullLocator())
        else:
            # Label some minor ticks too when the curves span under two decades, or there may be one label only.
            for set_formatter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
                set_formatter(PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
            # Down to a whole decade, so that a labelled tick sits at or below the lowest value: 0.02 to 20 would
            # otherwise show no label below 0.1.
            ax.set_ylim(bottom=10 ** math.floor(math.log10(span[0])))
    ax.set(title=name, xlabel="epoch", ylabel=_Y_LABELS.get(key, "loss"))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, which="major", alpha=0.4)
    ax.grid(True, which="minor", alpha=0.15)
