"""What a loader gives (:class:`Splits`), and the rules that cut and weight a split: the validation hold-out and
``data.weight``. Each kind of split is a :class:`~accumrun.data.source.Source` in its own module; arrays in memory
are an :class:`ArraySplit`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accumrun.data.source import ArraySplit as ArraySplit
from accumrun.data.source import Source
from accumrun.errors import DataError
from accumrun.kinds import Task

Split = Source
"""One split of a dataset, as a source gives it (or ``data.cache`` keeps it)."""


def seeded_hold_out(shuffle: bool, files: bool) -> bool:
    """Whether the validation hold-out is drawn by the seed: with ``data.shuffle``, and always for a split of files
    (they are listed class by class, so their tail would be the last class)."""
    return shuffle or files


def hold_out(size: int, fraction: float, seed: int, shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
    """The indices that ``validation_split: fraction`` keeps for training and holds out: a seeded permutation's
    tail (without ``shuffle``, the samples' own tail, as Keras takes it). A learned vocabulary reads this rule too,
    so it learns from exactly the training samples.

    Raises:
        DataError: the fraction holds out no sample.
    """
    count = round(size * fraction)
    if count == 0:
        raise DataError("data.validation_split", f"leaves no validation sample out of {size}", fraction)
    order = np.random.default_rng(seed).permutation(size) if shuffle else np.arange(size)
    return order[: size - count], order[size - count :]


def checked_weights(w: np.ndarray, where: str, samples: int) -> np.ndarray:
    """``data.weight`` as float32, one weight per sample; ``where`` says where it was read (for the message).

    It weights every split that has it, so the validation loss is weighted as Keras weights ``validation_data=(x, y,
    sample_weight)``.

    Raises:
        DataError: ``w`` is not one real number per sample, or holds a negative, NaN or Inf weight.
    """
    if w.ndim == 2 and w.shape[1] == 1:
        w = w[:, 0]
    if w.ndim != 1 or len(w) != samples:
        raise DataError("data.weight", f"{where}: needs one weight per sample ({samples:,})", w.shape)
    if not (np.issubdtype(w.dtype, np.integer) or np.issubdtype(w.dtype, np.floating)):
        raise DataError("data.weight", f"{where}: weights must be real numbers", str(w.dtype))
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        raise DataError("data.weight", f"{where}: weights must be finite and >= 0", float(w[bad][0]))
    return w.astype(np.float32)


@dataclass(frozen=True)
class Splits:
    """What a loader returns: the training split and, when the source has one, a test or validation split."""

    train: Split
    test: Split | None = None
    class_names: list[str] | None = None
    """The classes' names in label order, where the source names them (an image folder's subfolders)."""
    skipped: int = 0
    """Files passed over because they are not images."""
    scale: float | None = None
    """What ``rescale: auto`` multiplies the raw samples by, where the source knows (digits' counts of 0..16);
    None leaves it to the dtype."""
    features: list[str] | None = None
    """A table's feature columns, in the order the model takes them."""
    vocabulary_size: int | None = None
    """For token ids (a text source): how many ids the tokenizer has, padding's 0 among them."""
    task: Task | None = None
    """The one task the source poses, where it poses only one (a text corpus: ``causal_lm``)."""
