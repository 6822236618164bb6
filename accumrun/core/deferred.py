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

from accumrun.core.flat_call import FlatCall


def deferred_backward(call: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``call(*args, **kwargs)``, whose backward ops start only once the gradient of its outputs exists. The
    gradient flows to the floating-point tensors among ``args`` and ``kwargs`` (:class:`FlatCall`) and to the
    trainable variables the call reads. Under XLA (``training.jit_compile``) control dependencies are not kept, so
    the backward runs when XLA schedules it."""
    flat_call = FlatCall(call, args, kwargs)

    @tf.custom_gradient
    def run(*tensors: tf.Tensor) -> Any:
        with tf.GradientTape() as tape:
            tape.watch(tensors)
            outputs = flat_call(*tensors)

        def gradient(*upstream: tf.Tensor, variables: Sequence[tf.Variable] = ()) -> Any:
            with tf.control_dependencies(upstream):
                grads = tape.gradient(
                    outputs,
                    [*tensors, *variables],
                    output_gradients=list(upstream),
                    unconnected_gradients=tf.UnconnectedGradients.ZERO,
                )
            return grads[: len(tensors)], grads[len(tensors) :]

        return outputs, gradient

    return flat_call.structured(run(*flat_call.inputs))
