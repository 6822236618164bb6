"""Length grouping for bucketed padding (``data.bucket``): the samples of each batch in the order of their length.

Bucketed padding cuts each sub-batch of token ids to its longest real sequence. In the epoch's random order nearly
every sub-batch holds one full-length sequence, so little is cut. With grouping, the samples *within each batch*
are put in the order of their real length (their ids that are not padding, id 0), a stable sort that keeps ties in
the epoch's order, before the batch is cut into sub-batches: each sub-batch then holds sequences of similar length,
and the short ones are cut short.

Which samples form each batch does not change: the epoch's order (a function of the seed and the epoch) still fixes
it, so the update, a sum over the batch's samples, is the same with grouping or without. Only the row each sample
takes within its batch moves, and with it what is keyed by row (dropout's draws, see
:mod:`accumrun.core.draws`). The grouping is part of the order in which the samples are visited, so every way a
batch reaches the step sees it alike: whole batches on the device, streamed sub-batches, the replicas' slices of a
batch, and an epoch resumed after its first batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LengthGroups:
    """Groups each of an epoch's batches (``batch_sizes``, in order) by the samples' real ``lengths``."""

    lengths: np.ndarray
    """Each sample's real length, by its index in the split."""
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
