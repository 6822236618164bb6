"""What a loader gives (:class:`Splits`), and the rules that cut and weight a split: the validation hold-out and
``data.weight``. Each kind of split is a :class:`~accumrun.data.source.Source`; arrays in memory, an ArraySource.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accumrun.data.source import Source
from accumrun.errors import DataError
from accumrun.kinds import Task


def hold_out(size: int, fraction: float, seed: int, shuffle: bool, files: bool) -> tuple[np.ndarray, np.ndarray]:
    """The indices that ``validation_split: fraction`` keeps for training and holds out: the tail of a permutation
    drawn by the seed with ``data.shuffle``, and always for ``files`` (listed class by class, their tail would be the
    last class); else the samples' own tail, as Keras takes it. A learned vocabulary reads this rule too.

    Raises:
        DataError: the fraction holds out no sample.
    """
    count = round(size * fraction)
    if count == 0:
        raise DataError("data.validation_split", f"leaves no validation sample out of {size}", fraction)
    order = np.random.default_rng(seed).permutation(size) if shuffle or files else np.arange(size)
    return order[: size - count], order[size - count :]


def checked_weights(w: np.ndarray, where: str, samples: int) -> np.ndarray:
    """``data.weight`` as float32, one weight per sample; ``where`` says where it was read (for the message). It
    weights every split, validation too, as Keras weights ``validation_data=(x, y, sample_weight)``.

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

    train: Source
    test: Source | None = None
    class_names: list[str] | None = None
    """The classes' names in label order, where the source names them (an image folder's subfolders)."""
    skipped: int = 0
    """Files passed over because they are not images."""
    scale: float | None = None
    """What ``rescale: auto`` multiplies raw samples by, where the source knows (digits' counts of 0..16)."""
    features: list[str] | None = None
    """A table's feature columns, in the order the model takes them (``features.json``)."""
    vocabulary_size: int | None = None
    """For token ids (a text source): how many ids the tokenizer has, padding's 0 among them."""
    task: Task | None = None
    """The one task the source poses, where it poses only one (a text corpus: ``causal_lm``)."""
