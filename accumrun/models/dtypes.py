"""The dtype of a built-in model's output layer, read from Keras' dtype policy when the model is built. Keras is
imported when asked, so that the model kinds load with the config, without TensorFlow."""

from __future__ import annotations


def logits_dtype() -> str:
    """float32 under float32 or a mixed-precision policy, so the softmax and the loss are float32 too; float64 under
    the float64 policy (``training.precision: float64``)."""
    import keras

    return "float64" if keras.mixed_precision.dtype_policy().name == "float64" else "float32"
