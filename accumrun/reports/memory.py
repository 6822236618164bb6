"""``accumrun check --memory``: what a run will hold in memory, per sub-batch size, before it runs.

Fixed costs come from the variables (parameters, optimizer state, float32 accumulators) and the input, in its
stored dtype (:mod:`accumrun.core.footprint`). Activations grow with the sub-batch: the forward pass of one sub-batch
is traced (not run) and every batch-sized tensor it produces is counted, since the backward pass keeps them. That is
an upper bound of the forward activations and leaves out the allocator's overhead and the backward pass's
transients, so treat totals as estimates; ``accumrun plan`` measures them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import keras
import tensorflow as tf

from accumrun.config.memory_budget import mib
from accumrun.core.footprint import Footprint, candidate_subdivisions, footprint
from accumrun.core.sub_batches import sub_batch_sizes
from accumrun.kinds import Feed

# Ops whose outputs alias or describe other tensors rather than allocate activations.
_NOT_ALLOCATING = {"Placeholder", "Identity", "ReadVariableOp", "Const", "Shape", "Reshape", "NoOp"}


@dataclass
class MemoryEstimate(Footprint):
    """Bytes a run holds: the fixed ones, and activations per sample of the sub-batch."""

    activations_per_sample: float

    def total(self, sub_batch: int) -> float:
        """The estimated peak in bytes with sub-batches of ``sub_batch`` samples."""
        return self.fixed(sub_batch) + self.activations_per_sample * sub_batch


def forward_activation_bytes(model: keras.Model, sample_shape: tuple[int, ...], sub_batch: int) -> int:
    """The bytes of the batch-sized tensors one training-mode forward pass of ``sub_batch`` samples makes."""
    spec = tf.TensorSpec([sub_batch, *sample_shape], model.inputs[0].dtype if model.inputs else tf.float32)
    graph = tf.function(lambda x: model(x, training=True)).get_concrete_function(spec).graph
    outputs = [output for op in graph.get_operations() if op.type not in _NOT_ALLOCATING for output in op.outputs]
    return sum(
        out.shape.num_elements() * out.dtype.size
        for out in outputs
        if out.shape.rank and out.shape[0] == sub_batch and out.shape.is_fully_defined() and out.dtype.is_floating
    )


def estimate_memory(
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    sample_shape: tuple[int, ...],
    batch_size: int,
    traced_sub_batch: int,
    *,
    sample_bytes: int = 4,
    feed: Feed = Feed.BATCH,
) -> MemoryEstimate:
    """Estimate a run's memory from its (built) model and optimizer and one traced sub-batch; a value of a sample
    takes ``sample_bytes`` as stored (1 for uint8), and ``feed`` says whether the input is a batch or a sub-batch."""
    fixed = footprint(model, optimizer, sample_shape, batch_size, sample_bytes=sample_bytes, feed=feed)
    return MemoryEstimate(
        **vars(fixed),
        activations_per_sample=forward_activation_bytes(model, sample_shape, traced_sub_batch) / traced_sub_batch,
    )


def memory_report(
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    batch_size: int,
    subdivisions: int | None,
    *,
    sample_bytes: int = 4,
    feed: Feed = Feed.BATCH,
) -> list[str]:
    """``check --memory``'s lines for a built model and optimizer: the estimate from the largest sub-batch of the
    configured ``subdivisions`` (the whole batch when they are not fixed), a row per candidate, the configured one
    marked."""
    traced = max(sub_batch_sizes(batch_size, subdivisions or 1))
    sample_shape = tuple(model.input_shape[1:])
    estimate = estimate_memory(model, optimizer, sample_shape, batch_size, traced, sample_bytes=sample_bytes, feed=feed)
    return format_estimate(estimate, subdivisions)


def format_estimate(estimate: MemoryEstimate, configured: int | None) -> list[str]:
    """The estimate as lines: the fixed costs, then one row per candidate subdivisions."""

    per_sample = f"{estimate.input_per_sample:,} bytes per sample as stored"
    if estimate.feed is Feed.BATCH:
        whole = mib(estimate.input_per_sample * estimate.batch_size)
        held = f"{whole} (data.feed: batch, {estimate.batch_size:,} samples; {per_sample})"
    else:
        held = f"one sub-batch, in the total below (data.feed: sub_batch; {per_sample})"
    lines = [
        "memory estimate (upper bound of forward activations; no allocator overhead):",
        f"  parameters       {mib(estimate.parameters)}",
        f"  optimizer state  {mib(estimate.optimizer_state)}",
        f"  accumulators     {mib(estimate.accumulators)} (gradient sum + one sub-batch's gradients, float32)",
        f"  input            {held}",
        f"  {'subdivisions':>12}  {'sub-batch':>9}  {'activations':>14}  {'total':>14}",
    ]
    for subdivisions in candidate_subdivisions(estimate.batch_size, configured):
        sub_batch = math.ceil(estimate.batch_size / subdivisions)
        mark = "  <- configured" if subdivisions == configured else ""
        lines.append(
            f"  {subdivisions:>12,}  {sub_batch:>9,}  {mib(estimate.activations_per_sample * sub_batch):>14}"
            f"  {mib(estimate.total(sub_batch)):>14}{mark}"
        )
    return lines
