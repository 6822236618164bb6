"""The bytes a run holds whatever its sub-batch, by arithmetic: the weights in their dtype, the optimizer's state,
the float32 accumulators (the gradient sum and one sub-batch's gradients of the trainable weights) and the input.
``check --memory`` adds traced activations to it, ``accumrun plan`` and ``memory_budget`` measured ones."""

from __future__ import annotations

import math
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from accumrun.kinds import Feed


@dataclass
class Footprint:
    """The fixed bytes of a run: those that do not grow with the sub-batch, but the input where it is streamed."""

    parameters: int
    optimizer_state: int
    accumulators: int
    input_per_sample: int
    """Bytes of one sample as stored."""
    batch_size: int
    feed: Feed
    """``batch`` (the whole batch on the device) or ``sub_batch`` (one streamed sub-batch at a time)."""

    def input_bytes(self, sub_batch: int) -> int:
        """The input on the device: the batch, or with streamed sub-batches, one of them."""
        return self.input_per_sample * (self.batch_size if self.feed is Feed.BATCH else sub_batch)

    def fixed(self, sub_batch: int) -> int:
        """Weights, optimizer state, accumulators and the input, with sub-batches of ``sub_batch`` samples."""
        return self.parameters + self.optimizer_state + self.accumulators + self.input_bytes(sub_batch)


def variable_bytes(variables: list) -> int:
    """The bytes of ``variables``, each in its own dtype (an int8 kernel one byte a value)."""
    return sum(int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size for v in variables)


def footprint(
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    sample_shape: tuple[int, ...],
    batch_size: int,
    *,
    sample_bytes: int = 4,
    feed: Feed = Feed.BATCH,
) -> Footprint:
    """The fixed bytes of a built model and optimizer; a value of a sample takes ``sample_bytes`` as stored (1 for
    uint8), and ``feed`` says whether the input is a batch or a sub-batch."""
    return Footprint(
        parameters=variable_bytes(model.variables),
        optimizer_state=variable_bytes(optimizer.variables),
        accumulators=2 * sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables),  # float32
        input_per_sample=math.prod(sample_shape) * sample_bytes,
        batch_size=batch_size,
        feed=feed,
    )


def candidate_subdivisions(batch_size: int, configured: int | None) -> list[int]:
    """Powers of two below the batch size (at most 12 of them), the batch size, and the configured value."""
    candidates = {2**i for i in range(12) if 2**i < batch_size} | {batch_size}
    return sorted(candidates | ({configured} if configured else set()))
