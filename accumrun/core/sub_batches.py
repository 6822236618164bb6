"""How a batch is cut into sub-batches: the one rule shared by the compiled step, BatchNorm and the reports.

Sub-batch ``i`` of a batch of ``n`` samples cut ``s`` ways holds samples ``[i*n//s, (i+1)*n//s)``
(:func:`part_bounds`). The sizes differ by at most one, none is empty while ``s <= n``, and they sum to ``n``. A
batch with fewer samples than ``s`` (a short last batch) is cut into ``n`` sub-batches of one sample.

Across ``R`` replicas (tf.distribute) the same rule first deals the batch out: replica ``r`` takes samples
``[r*n//R, (r+1)*n//R)`` and cuts its slice into sub-batches as above. A replica's slice may be empty when the
batch has fewer samples than there are replicas.

The sizes and descriptions are plain Python, for ``accumrun check`` and the reports. The functions that cut
tensors (:func:`sub_batch_loops`, :func:`replica_rows`, :func:`piece_loop`) import TensorFlow when called, so that
importing this module does not load it.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import tensorflow as tf


def part_bounds(index: Any, count: Any, parts: Any) -> tuple[Any, Any]:
    """Where part ``index`` of ``count`` rows cut ``parts`` ways starts and ends: ``[index*count//parts,
    (index+1)*count//parts)``. The one rule, for Python ints and for tensors on the device alike."""
    return index * count // parts, (index + 1) * count // parts


def effective_subdivisions(batch: int, subdivisions: int) -> int:
    """The number of sub-batches a batch of ``batch`` samples is actually cut into."""
    return max(1, min(subdivisions, batch))


def sub_batch_sizes(batch: int, subdivisions: int) -> list[int]:
    """The size of each sub-batch, in order, for a batch of ``batch`` samples."""
    s = effective_subdivisions(batch, subdivisions)
    return [end - start for start, end in (part_bounds(i, batch, s) for i in range(s))]


def describe_batch(batch: int, subdivisions: int) -> str:
    """A one-line description such as ``batch 10 = 3 sub-batches x 3-4 samples``."""
    sizes = sub_batch_sizes(batch, subdivisions)
    noun = "sub-batch" if len(sizes) == 1 else "sub-batches"
    unit = "sample" if max(sizes) == 1 else "samples"
    return f"batch {batch:,} = {len(sizes)} {noun} x {_span(sizes)} {unit}"


def replica_sizes(batch: int, replicas: int) -> list[int]:
    """How many samples of a batch of ``batch`` each of ``replicas`` replicas takes, in replica order."""
    return [end - start for start, end in (part_bounds(r, batch, replicas) for r in range(replicas))]


def replica_sub_batch_sizes(batch: int, replicas: int, subdivisions: int) -> list[int]:
    """The size of every sub-batch that the replicas run for one batch, replica after replica."""
    return [size for part in replica_sizes(batch, replicas) if part for size in sub_batch_sizes(part, subdivisions)]


def _span(values: list[int]) -> str:
    low, high = min(values), max(values)
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def describe_replica_batch(batch: int, subdivisions: int, replicas: int) -> str:
    """A one-line description such as ``batch 17 = 2 replicas x 8-9 samples, each in 4 sub-batches x 2-3
    samples``."""
    parts = replica_sizes(batch, replicas)
    counts = [effective_subdivisions(part, subdivisions) for part in parts if part]
    sizes = replica_sub_batch_sizes(batch, replicas, subdivisions)
    return (
        f"batch {batch:,} = {replicas} replica{'s' if replicas != 1 else ''} x {_span(parts)} samples, "
        f"each in {_span(counts)} sub-batch{'es' if max(counts) != 1 else ''} x {_span(sizes)} "
        f"sample{'s' if max(sizes) != 1 else ''}"
    )


def epoch_batches(train_size: int, batch_size: int, drop_remainder: bool) -> tuple[int, int]:
    """``(updates per epoch, size of the last batch)`` for ``train_size`` samples in batches of ``batch_size``."""
    full, rest = divmod(train_size, batch_size)
    if rest and not drop_remainder:
        return full + 1, rest
    return full, batch_size


def batch_sizes(samples: int, batch_size: int, drop_remainder: bool = False) -> list[int]:
    """The size of each batch of a pass over ``samples`` in batches of ``batch_size``."""
    count, last = epoch_batches(samples, batch_size, drop_remainder)
    return [batch_size] * (count - 1) + [last] if count else []


def describe_plan(train_size: int, batch_size: int, subdivisions: int, drop_remainder: bool, replicas: int = 1) -> str:
    """The derived sizes of an epoch, for example ``batch 256 = 8 sub-batches x 32 samples; 42 updates per
    epoch``, naming the short last batch when there is one; with several ``replicas``, how each batch is dealt
    out to them first."""
    updates, last = epoch_batches(train_size, batch_size, drop_remainder)

    def describe(batch: int) -> str:
        if replicas == 1:
            return describe_batch(batch, subdivisions)
        return describe_replica_batch(batch, subdivisions, replicas)

    text = f"{describe(batch_size)}; {updates:,} update{'s' if updates != 1 else ''} per epoch"
    if last != batch_size:
        text += f" (last {describe(last)})"
    elif drop_remainder and train_size % batch_size:
        text += f" ({train_size % batch_size:,} samples dropped each epoch)"
    return text


def starts_by_size(batch: int, subdivisions: int) -> list[tuple[int, list[int]]]:
    """The sub-batches of a batch of ``batch`` samples grouped by size (at most two sizes, smallest first): each
    size with the rows where its sub-batches start."""
    sizes = sub_batch_sizes(batch, subdivisions)
    starts = [0, *itertools.accumulate(sizes[:-1])]
    return [
        (size, [start for start, length in zip(starts, sizes, strict=True) if length == size])
        for size in sorted(set(sizes))
    ]


Cut = tuple["tf.Tensor", Any, "tf.Tensor"]
"""``(x_sub, y_sub, first_row)``: a sub-batch's rows of the inputs and targets (a tensor, or targets weighted per
sample, see :mod:`accumrun.core.targets`), and where it starts."""


@dataclass(frozen=True)
class SubBatchLoop:
    """One loop over sub-batches on the device: ``take(index)`` for each ``index`` in ``indices`` is a
    :data:`Cut`. ``static`` says whether every sub-batch's shape is known when the step is traced."""

    indices: tf.Tensor
    take: Callable[[tf.Tensor], Cut]
    static: bool


def sub_batch_loops(x: tf.Tensor, y: Any, subdivisions: int) -> list[SubBatchLoop]:
    """The loops that cut the batch ``(x, y)`` into its sub-batches, by the rule, on the device; ``y`` may be a
    structure (targets and their weights), cut alike.

    When the batch's size is known at tracing, the sub-batches of each size run in a loop of their own, each
    slicing a fixed size at a list of starts, so that every slice has a static shape (TensorFlow then runs the
    loop faster on small sub-batches, and XLA can compile it at all). Otherwise (the short last batch, a replica's
    slice) one loop cuts sub-batch ``i`` at :func:`part_bounds`, an empty batch into no sub-batch.

    Raises:
        ValueError: ``subdivisions`` is below 1 (the cut divides by it).
    """
    import tensorflow as tf

    if subdivisions < 1:
        raise ValueError(f"subdivisions must be >= 1, got {subdivisions}")
    if x.shape[0] is not None:
        return [
            SubBatchLoop(tf.constant(starts), functools.partial(_rows_at, x, y, size), static=True)
            for size, starts in starts_by_size(int(x.shape[0]), subdivisions)
        ]
    n = tf.shape(x)[0]
    s = tf.minimum(tf.constant(subdivisions, tf.int32), n)

    def take(i: tf.Tensor) -> Cut:
        start, end = part_bounds(i, n, s)
        return x[start:end], tf.nest.map_structure(lambda t: t[start:end], y), start

    return [SubBatchLoop(tf.range(s), take, static=False)]


def _rows_at(x: tf.Tensor, y: Any, size: int, start: tf.Tensor) -> Cut:
    """Rows ``[start, start + size)`` of ``x`` and ``y``, with the static size ``size``, and ``start``."""
    import tensorflow as tf

    return _rows(x, start, size), tf.nest.map_structure(lambda t: _rows(t, start, size), y), start


def _rows(t: tf.Tensor, start: tf.Tensor, size: int) -> tf.Tensor:
    import tensorflow as tf

    rank = t.shape.rank
    return tf.slice(t, [start] + [0] * (rank - 1), [size] + [-1] * (rank - 1))


def replica_rows(tensors: tuple[Any, ...], replica: tf.Tensor, replicas: int) -> tuple[Any, ...]:
    """Replica ``replica``'s slice of each of ``tensors`` (which share their first dimension, and may be
    structures: targets and their weights), by the rule."""
    import tensorflow as tf

    start, end = part_bounds(replica, tf.shape(tf.nest.flatten(tensors)[0])[0], replicas)
    return tuple(tf.nest.map_structure(lambda t: t[start:end], tensors))


def piece_loop(x: tf.Tensor, piece: int) -> tuple[tf.Tensor, Callable[[tf.Tensor], tf.Tensor]]:
    """``(indices, take)``: ``x`` in consecutive pieces of ``piece`` rows (the last may be shorter), for a pass
    that needs no exact split (BatchNorm's population statistics); ``take(i)`` is piece ``i``."""
    import tensorflow as tf

    count = (tf.shape(x)[0] + piece - 1) // piece
    return tf.range(count), lambda i: x[i * piece : (i + 1) * piece]
