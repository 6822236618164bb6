"""Length grouping for bucketed padding (``data.bucket``): each batch's samples in the order of their length.

Bucketed padding cuts each sub-batch to its longest real sequence (ids that are not padding, 0); sorted by that
length before it is cut into sub-batches, a batch's short sequences are cut short. Which samples form each batch,
and so the update, does not change; only each sample's row (and its dropout draws) does. The grouping is part of
the epoch's order, so every way a batch reaches the step (resumed too) sees it alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LengthGroups:
    """Groups each of an epoch's batches (``batch_sizes``, in order) by the samples' real ``lengths`` (by index)."""

    lengths: np.ndarray
    batch_sizes: tuple[int, ...]
    """The sample count of each batch of an epoch; samples past their sum (a dropped remainder) stay in order."""

    def __call__(self, order: np.ndarray) -> np.ndarray:
        """``order`` (an epoch's, of sample indices) with each batch's samples in the order of their lengths."""
        batched = min(sum(self.batch_sizes), len(order))
        head = order[:batched]
        batch = np.repeat(np.arange(len(self.batch_sizes)), self.batch_sizes)[:batched]
        # lexsort is stable and sorts by its last key first: by batch, then by length within the batch.
        grouped = head[np.lexsort((self.lengths[head], batch))]
        return np.concatenate([grouped, order[batched:]]).astype(order.dtype, copy=False)
