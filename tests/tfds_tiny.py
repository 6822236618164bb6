"""A TFDS dataset made from the seed, prepared locally (nothing is downloaded), for the ``tfds`` source's test.

Only imported where ``tensorflow-datasets`` is installed. TFDS reads a builder's source file to find its
metadata, so the builder lives at a module's top level rather than inside the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow_datasets as tfds


class AccumrunTiny(tfds.core.GeneratorBasedBuilder):
    """Two classes of random 8x8 images: 23 for training, 6 for testing."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self) -> tfds.core.DatasetInfo:
        features = {
            "image": tfds.features.Image(shape=(8, 8, 3)),
            "label": tfds.features.ClassLabel(names=["cat", "dog"]),
        }
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[int, dict[str, Any]]]]:
        return {"train": self._generate_examples(23, 0), "test": self._generate_examples(6, 1)}

    def _generate_examples(self, count: int, seed: int) -> Iterator[tuple[int, dict[str, Any]]]:
        rng = np.random.default_rng(seed)
        for i in range(count):
            yield i, {"image": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), "label": i % 2}
