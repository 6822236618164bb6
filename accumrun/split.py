"""How a batch is cut into sub-batches: the one rule shared by the compiled step and the reports.

Sub-batch ``i`` of a batch of ``n`` samples cut ``s`` ways holds samples ``[i*n//s, (i+1)*n//s)``. The sizes
differ by at most one, none is empty while ``s <= n``, and they sum to ``n``. A batch with fewer samples than
``s`` (a short last batch) is cut into ``n`` sub-batches of one sample.
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


def epoch_batches(train_size: int, batch_size: int, drop_remainder: bool) -> tuple[int, int]:
    """``(updates per epoch, size of the last batch)`` for ``train_size`` samples in batches of ``batch_size``."""
    full, rest = divmod(train_size, batch_size)
    if rest and not drop_remainder:
        return full + 1, rest
    return full, batch_size


def describe_plan(train_size: int, batch_size: int, subdivisions: int, drop_remainder: bool) -> str:
    """The derived sizes of an epoch, for example ``batch 256 = 8 sub-batches x 32 samples; 42 updates per
    epoch``, naming the short last batch when there is one."""
    updates, last = epoch_batches(train_size, batch_size, drop_remainder)
    text = f"{describe_batch(batch_size, subdivisions)}; {updates:,} update{'s' if updates != 1 else ''} per epoch"
    if last != batch_size:
        text += f" (last {describe_batch(last, subdivisions)})"
    elif drop_remainder and train_size % batch_size:
        text += f" ({train_size % batch_size:,} samples dropped each epoch)"
    return text
