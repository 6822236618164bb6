"""The noise scale: an observer inside the step estimates each batch's ``|G|^2`` and ``tr(S)``
(:mod:`accumrun.core.noise`); this hook sums them over each epoch into its row, and averages them exponentially
across epochs.

The running sums live in the :class:`~accumrun.training.checkpoints.Position`, so a checkpoint carries them and a
resumed epoch logs what the uninterrupted one would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import tensorflow as tf

from accumrun.config.schema import TrainingConfig
from accumrun.core.noise import GradientNoise
from accumrun.training.checkpoints import Position
from accumrun.training.hooks import BatchEnd, Hook
from accumrun.training.measurement import Measurement, Measuring

DECAY = 0.9
"""How much of the exponential averages each update keeps."""

SQ_NORM, TRACE, UPDATES, UNITS = "noise.sq_norm", "noise.trace", "noise.updates", "noise.units"
SQ_NORM_EMA, TRACE_EMA = "noise.sq_norm_ema", "noise.trace_ema"

REFERENCE = "McCandlish et al. 2018"
"""Where the noise scale, and what it means for the batch, come from."""

NOT_MEASURED = (
    "noise_scale is not measured: each batch is one sub-batch on one device (subdivisions 1), so there is no smaller "
    "batch to compare it with"
)


class NoiseScale(Hook):
    """Logs ``gradient_sq_norm`` and ``gradient_trace_cov`` (each the epoch's mean over its measured updates),
    ``gradient_noise_scale`` (their ratio, left out unless the ``|G|^2`` mean is positive) and
    ``gradient_noise_scale_ema`` (the ratio of their exponential averages, carried across epochs); at the end,
    ``echo`` states the last logged noise scale beside the batch: ``batch_size`` samples, or for a token-level
    objective (None) the mean real tokens of the batches measured. ``columns`` are the observer's in the step's
    measures; a run whose batches are each one sub-batch on one device has no smaller batch to compare with, and no
    such observer (None): it says so at its start, and measures nothing."""

    def __init__(self, echo: Callable[[str], None], batch_size: int | None, columns: slice | None) -> None:
        self._echo = echo
        self._batch_size = batch_size
        self._columns = columns
        self._last: tuple[int, float, float] | None = None
        """The last epoch that logged a noise scale (1-based), the scale, and its units per batch."""

    def on_run_start(self, position: Position) -> None:
        if self._columns is None:
            self._echo(NOT_MEASURED)

    def on_batch_end(self, batches: BatchEnd) -> None:
        updates, sums, carried = batches.updates, batches.position.measure_sums, batches.position.carried_measures
        for k in range(batches.count if self._columns is not None else 0):
            sq_norm, trace, valid = (float(value) for value in updates.measures[k][self._columns])
            if not updates.applied[k] or not valid:
                continue
            for key, value in ((SQ_NORM, sq_norm), (TRACE, trace), (UPDATES, 1.0), (UNITS, float(updates.units[k]))):
                sums[key] = sums.get(key, 0.0) + value
            for key, value in ((SQ_NORM_EMA, sq_norm), (TRACE_EMA, trace)):
                carried[key] = DECAY * carried.get(key, 0.0) + (1.0 - DECAY) * value

    def epoch_figures(self, position: Position, ends_call: bool) -> dict[str, float]:
        sums, carried = position.measure_sums, position.carried_measures
        updates = sums.get(UPDATES, 0.0)
        if not updates:
            return {}
        sq_norm, trace = sums[SQ_NORM] / updates, sums[TRACE] / updates
        figures = {"gradient_sq_norm": sq_norm, "gradient_trace_cov": trace}
        if sq_norm > 0:
            figures["gradient_noise_scale"] = trace / sq_norm
            self._last = (position.epoch + 1, trace / sq_norm, sums[UNITS] / updates)
        if carried.get(SQ_NORM_EMA, 0.0) > 0:
            figures["gradient_noise_scale_ema"] = carried[TRACE_EMA] / carried[SQ_NORM_EMA]
        return figures

    def on_stop(self, stopped: str | None) -> None:
        if self._last is not None:
            self._echo(noise_scale_line(*self._last, self._batch_size))


def noise_scale_line(epoch: int, noise_scale: float, tokens: float, batch_size: int | None) -> str:
    """The noise scale beside the batch, and what it means for the batch (McCandlish et al. 2018): up to about the
    noise scale, a larger batch still needs nearly proportionally fewer updates; beyond it, a larger batch mostly
    costs compute. In tokens where ``batch_size`` is None (a batch of ``tokens`` real tokens on average)::

        gradient noise scale ~626 samples at epoch 8: batch 256 is below it, so a batch of up to about 600 would
        still need nearly proportionally fewer updates (McCandlish et al. 2018)
    """
    if batch_size is not None:
        batch, unit, approximate = float(batch_size), "samples", ""
    else:
        batch, unit, approximate = tokens, "tokens", "~"
    where = f"gradient noise scale ~{noise_scale:,.0f} {unit} at epoch {epoch}: batch {approximate}{batch:,.0f} is"
    if batch > noise_scale:
        return f"{where} above it, so a larger batch would mostly cost compute, saving few updates ({REFERENCE})"
    return (
        f"{where} below it, so a batch of up to about {_rounded(noise_scale):,.0f} would still need nearly "
        f"proportionally fewer updates ({REFERENCE})"
    )


def _rounded(value: float) -> float:
    """``value`` to one significant digit (626 -> 600): the noise scale is an estimate, and a batch size a choice."""
    return float(f"{value:.0e}")


def noise_scale_note(training: TrainingConfig, measured: bool) -> str | None:
    """What ``check`` says of the noise scale: that it is not measured, and why, or how often it is."""
    if not measured:
        return NOT_MEASURED
    if training.noise_scale_every > 1:
        return f"noise_scale is measured on one update in every {training.noise_scale_every}"
    return None


def _observer(training: TrainingConfig, updates: tf.Variable) -> GradientNoise:
    return GradientNoise(training.noise_scale_every, updates)


def _hook(measuring: Measuring) -> NoiseScale:
    return NoiseScale(measuring.echo, measuring.batch_size, measuring.observers.columns(GradientNoise.name))


def _line(figures: Mapping[str, float]) -> str | None:
    if "gradient_noise_scale" in figures:
        return f"noise scale {figures['gradient_noise_scale']:,.0f}"
    if "gradient_sq_norm" in figures:
        return "noise scale n/a (the |G|^2 estimate is not positive: the gradient is lost in its noise this epoch)"
    return None


MEASUREMENT = Measurement(hook=_hook, observer=_observer, line=_line, note=noise_scale_note)
"""The gradient noise scale (``gradient_sq_norm``, ``gradient_trace_cov``, ``gradient_noise_scale``,
``gradient_noise_scale_ema``)."""
