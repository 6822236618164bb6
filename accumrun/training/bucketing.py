"""What ``data.bucket`` (bucketed padding) needs of the run, checked once the data is loaded and the model built."""

from __future__ import annotations

import keras

from accumrun.config.schema import Config
from accumrun.data.dataset import Dataset
from accumrun.errors import ConfigError


def check_bucket(config: Config, dataset: Dataset, model: keras.Model) -> None:
    """Refuse bucketed padding without every training sample's length before an epoch (to order each batch by
    length), a model that takes token ids of any length, and shapes that XLA need not know."""
    bucket = config.data.token_bucket
    if bucket is None:
        return
    if dataset.train.lengths is None:
        streams = dataset.train.streaming
        raise ConfigError(
            "data.bucket",
            f"orders each batch's texts by length, which needs their token ids in memory, and {streams}: set "
            "data.cache: memory",
            bucket,
        )
    if config.training.jit_compile:
        raise ConfigError(
            "data.bucket",
            "cuts sub-batches to lengths known only on the device; XLA (training.jit_compile) needs them at "
            "tracing: set one or the other",
            bucket,
        )
    if model.input_shape[1] is not None:
        raise ConfigError(
            "data.bucket",
            f"the model takes exactly {model.input_shape[1]} tokens; bucketed padding needs one that takes any "
            "length (the built-in transformer does)",
            bucket,
        )
