"""A call whose backward pass waits for its upstream gradient: :func:`deferred_backward`.

TensorFlow's executor runs an op as soon as its inputs exist. A backward op that reads only forward values therefore
runs during the forward pass, and its result is held until the gradient that uses it arrives. Keras' int8 ``Dense``
and ``EinsumDense`` are such a case: their custom gradient dequantizes the kernel (``cast(kernel) / scale``), from the
kernel alone, so every quantized layer's float32 kernel was made at once and held through the forward pass (a stack of
12 frozen 1024 x 1024 int8 layers: 51.6 MiB of TensorFlow's tensors above the weights in one gradient, against 7.6
MiB with the dequantization waiting, and 4.2 MiB for the same layers in float32).

The call runs inside a ``tf.custom_gradient`` that records it on a tape of its own. Its gradient is that tape's,
computed under a control dependency on the upstream gradient: the same ops on the same values, each started only
once the gradient reaches the call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf


def deferred_backward(call: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``call(*args, **kwargs)``, whose backward ops start only once the gradient of its outputs exists. The
    gradient flows to the floating-point tensors among ``args`` and ``kwargs`` (an input passed by keyword too) and
    to the trainable variables the call reads; everything else (``training``, masks, ids) is bound as it is. Under
    XLA (``training.jit_compile``) control dependencies are not kept, so the backward runs when XLA schedules it."""
    flat = tf.nest.flatten((list(args), kwargs))
    floating = [i for i, value in enumerate(flat) if isinstance(value, tf.Tensor) and value.dtype.is_floating]
    structure: list[Any] = []

    @tf.custom_gradient
    def run(*tensors: tf.Tensor) -> Any:
        values = list(flat)
        for i, tensor in zip(floating, tensors, strict=True):
            values[i] = tensor
        call_args, call_kwargs = tf.nest.pack_sequence_as((list(args), kwargs), values)
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            outputs = call(*call_args, **call_kwargs)
        structure[:] = [outputs]
        flat_outputs = tf.nest.flatten(outputs)

        def gradient(*upstream: tf.Tensor, variables: Sequence[tf.Variable] = ()) -> Any:
            with tf.control_dependencies(upstream):
                grads = tape.gradient(
                    flat_outputs,
                    [*tensors, *variables],
                    output_gradients=list(upstream),
                    unconnected_gradients=tf.UnconnectedGradients.ZERO,
                )
            return grads[: len(tensors)], grads[len(tensors) :]

        return flat_outputs, gradient

    outputs = run(*[flat[i] for i in floating])
    return tf.nest.pack_sequence_as(structure[0], outputs)
