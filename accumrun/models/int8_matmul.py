"""Keras' int8 products computed in float32: :func:`int8_products_in_float32`.

Keras' int8 ``Dense`` and ``EinsumDense`` quantize their inputs to int8 and multiply them by the int8 kernel through
``tf.matmul(..., output_type=tf.int32)``, TensorFlow's ``BatchMatMulV3``. TensorFlow 2.21's int8 kernel for that op
exists only for the CPU (its kernel registry, ``get_registered_kernels_for_op``), so outside XLA a GPU would run the
product on the host; and on the CPU it is slower than float32's: 2.6 times on a 2-core AMD EPYC with AVX-512 VNNI,
where LoRA on an int8 base trained at two thirds of float LoRA's speed (``docs/benchmarks-lora.md``, Runs 12 and
14).

Cast to float32, the operands are the same integers, and every product of two of them is exact. The sum is exact too
while each partial sum stays below 2**24, which holds for any inner dimension up to 1,040 (1,040 * 127 * 127 < 2**24):
there the result is the integer Keras' int32 product gives, and the layer's output is the same to the bit. Over a
longer inner dimension a partial sum may round, by at most one float32 rounding per addition, where Keras rounds
once when it casts the int32 sum to float32. A GPU that multiplies float32 in TensorFloat-32 keeps these integers
exact too: they need 7 bits of its 10.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

_active = threading.local()
_installing = threading.Lock()
_installed = False


@contextlib.contextmanager
def int8_products_in_float32() -> Iterator[None]:
    """Inside, in this thread, Keras' ``matmul`` and ``einsum`` of int8 operands multiply them in float32 and return
    float32, which Keras' int8 layers cast to their compute dtype as they cast the int32 product. Every other product
    is Keras' own."""
    _install()
    depth = getattr(_active, "depth", 0)
    _active.depth = depth + 1
    try:
        yield
    finally:
        _active.depth = depth


def _install() -> None:
    """Put the dispatch in front of the TensorFlow backend's ``matmul`` and ``einsum``, once per process: Keras'
    ``ops`` look them up on that module at each call. The dispatch reads the depth of this thread's scopes, since a
    strategy's replicas trace in threads of their own."""
    from keras.src.backend.tensorflow import numpy

    global _installed
    with _installing:
        if _installed:
            return
        original_matmul, original_einsum = numpy.matmul, numpy.einsum

        def matmul(x1: Any, x2: Any) -> Any:
            if _in_float32(x1, x2):
                return original_matmul(*_float32(x1, x2))
            return original_matmul(x1, x2)

        def einsum(subscripts: str, *operands: Any, **kwargs: Any) -> Any:
            if _in_float32(*operands):
                return original_einsum(subscripts, *_float32(*operands), **kwargs)
            return original_einsum(subscripts, *operands, **kwargs)

        numpy.matmul, numpy.einsum = matmul, einsum
        _installed = True


def _in_float32(*operands: Any) -> bool:
    if not getattr(_active, "depth", 0):
        return False
    return all(getattr(x, "dtype", None) == tf.int8 for x in operands)


def _float32(*operands: Any) -> list[Any]:
    """``operands`` cast to float32, each cast once all of them exist. A kernel's cast reads the kernel alone, and
    TensorFlow's executor runs an op as soon as its inputs exist: without the wait, every layer's float32 kernel
    would be made at the start of the step and held until its product (the base in float32: the peak of LoRA on the
    int8 base of ``benchmarks/lora_memory.py`` rose from 898 to 1,164 MiB). XLA (``training.jit_compile``) drops
    control dependencies and schedules the casts itself."""
    tensors = [tf.convert_to_tensor(x) for x in operands]
    with tf.control_dependencies(tensors):
        return [tf.cast(x, tf.float32) for x in tensors]
