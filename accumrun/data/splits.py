"""What a loader gives: arrays in memory (:class:`ArraySplit`, the kind every in-memory source is), the
:class:`Splits` of a source, and the rules that cut them: the validation hold-out and (from
:mod:`accumrun.data.source`) the order in which an epoch visits a split's samples. The other kinds of source live
in their own modules (image and text files, :mod:`accumrun.data.files`; TFRecord, :mod:`accumrun.data.records`;
a text table's rows, :mod:`accumrun.data.rows`; a corpus's windows, :mod:`accumrun.data.corpus`), each a
:class:`~accumrun.data.source.Source`.

Samples keep the dtype their source stores: uint8 images stay one byte per value on the host and cross to the
device as such; the model's input layers cast and rescale them, one sub-batch at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accumrun.data.files import IMAGE_EXTENSIONS as IMAGE_EXTENSIONS
from accumrun.data.files import ImageFiles as ImageFiles
from accumrun.data.files import TextFiles as TextFiles
from accumrun.data.source import ArraySplit as ArraySplit
from accumrun.data.source import Source
from accumrun.data.source import epoch_order as epoch_order
from accumrun.errors import DataError
from accumrun.kinds import Task

Split = Source
"""One split of a dataset, as a source gives it (or ``data.cache`` keeps it)."""


def seeded_hold_out(shuffle: bool, files: bool) -> bool:
    """Whether the validation hold-out is drawn by the seed: with ``data.shuffle``, and always for a split of files
    (they are listed class by class, so their tail would be the last class)."""
    return shuffle or files


def hold_out(size: int, fraction: float, seed: int, shuffle: bool) -> tuple[np.ndarray, np.ndarray]:
    """The indices of the samples that ``validation_split: fraction`` keeps for training and of those it holds out
    for validation: a seeded permutation's tail (without ``shuffle``, the samples' own tail, as Keras'
    ``validation_split`` takes). The one rule for the hold-out, which a learned vocabulary reads too, so it learns
    from exactly the training samples.

    Raises:
        DataError: the fraction holds out no sample.
    """
    count = round(size * fraction)
    if count == 0:
        raise DataError("data.validation_split", f"leaves no validation sample out of {size}", fraction)
    order = np.random.default_rng(seed).permutation(size) if shuffle else np.arange(size)
    return order[: size - count], order[size - count :]


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
    None leaves it to the dtype: 1/255 for uint8, nothing for floats."""
    features: list[str] | None = None
    """A table's feature columns, in the order the model takes them."""
    vocabulary_size: int | None = None
    """For token ids (a text source): how many ids the tokenizer has, padding's 0 among them."""
    task: Task | None = None
    """The one task the source poses, where it poses only one (a text corpus: ``causal_lm``); None: read from the
    targets."""
