"""How a batch is cut into sub-batches: the one rule shared by the compiled step and the reports.

Sub-batch ``i`` of a batch of ``n`` samples cut ``s`` ways holds samples ``[i*n//s, (i+1)*n//s)``. The sizes
differ by at most one, none is empty while ``s <= n``, and they sum to ``n``. A batch with fewer samples than
``s`` (a short last batch) is cut into ``n`` sub-batches of one sample.

Across ``R`` replicas (tf.distribute) the same rule first deals the batch out: replica ``r`` takes samples
``[r*n//R, (r+1)*n//R)`` and cuts its slice into sub-batches as above. A replica's slice may be empty when the
batch has fewer samples than there are replicas.
"""

from __future__ import annotations


def effective_subdivisions(batch: int, subdivisions: int) -> int:
    """The number of sub-batches a batch of ``batch`` samples is actually cut into."""
    return max(1, min(subdivisions, batch))


def sub_batch_sizes(batch: int, subdivisions: int) -> list[int]:
    """The size of each sub-batch, in order, for a batch of ``batch`` samples."""
    s = effective_subdivisions(batch, subdivisions)
    return [(i + 1) * batch // s - i * batch // s for i in range(s)]


def describe_batch(batch: int, subdivisions: int) -> str:
    """A one-line description such as ``batch 10 = 3 sub-batches x 3-4 samples``."""
    sizes = sub_batch_sizes(batch, subdivisions)
    low, high = min(sizes), max(sizes)
    each = f"{low:,}" if low == high else f"{low:,}-{high:,}"
    noun = "sub-batch" if len(sizes) == 1 else "sub-batches"
    unit = "sample" if high == 1 else "samples"
    return f"batch {batch:,} = {len(sizes)} {noun} x {each} {unit}"


def replica_sizes(batch: int, replicas: int) -> list[int]:
    """How many samples of a batch of ``batch`` each of ``replicas`` replicas takes, in replica order."""
    return [(r + 1) * batch // replicas - r * batch // replicas for r in range(replicas)]


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
