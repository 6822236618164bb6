"""``training.class_weight`` turned into one weight per training sample (the training split's ``w``).

Class weights weight the training split alone, as Keras' ``class_weight`` does: validation and ``evaluate`` are
not weighted by class. They cannot be combined with ``data.weight`` (Keras refuses ``class_weight`` with
``sample_weight`` too).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from accumrun.data.dataset import Dataset
from accumrun.errors import ConfigError

_KEY = "training.class_weight"


def per_class(setting: dict[str, float] | Literal["balanced"], dataset: Dataset) -> np.ndarray:
    """Each class's weight, in class-index order: ``balanced`` is scikit-learn's n_samples / (n_classes * count)
    over the training split, n_classes counting the classes it holds (``compute_class_weight("balanced",
    classes=np.unique(y), y=y)``); a class it lacks keeps 1.0, as does a class the mapping leaves out.

    Raises:
        ConfigError: the targets are not class labels, or the mapping names a class the data does not have.
    """
    names = dataset.labels
    if names is None or dataset.target_shape != ():
        raise ConfigError(_KEY, f"needs class labels; the targets are {dataset.describe_targets()}")
    weights = np.ones(len(names), np.float64)
    if setting == "balanced":
        counts = np.bincount(dataset.train.labels, minlength=len(names))
        present = counts > 0
        weights[present] = dataset.train_size / (present.sum() * counts[present])
        return weights
    unknown = [name for name in setting if name not in names]
    if unknown:
        shown = names if len(names) <= 10 else [*names[:10], "..."]
        raise ConfigError(_KEY, f"names no class {unknown[0]!r}; the classes are {shown}", unknown[0])
    for name, weight in setting.items():
        weights[names.index(name)] = weight
    return weights


def with_class_weights(dataset: Dataset, setting: dict[str, float] | Literal["balanced"] | None) -> Dataset:
    """``dataset`` with its training samples weighted by their classes' weights (itself without a setting).

    Raises:
        ConfigError: see :func:`per_class`.
    """
    if setting is None:
        return dataset
    weights = per_class(setting, dataset).astype(np.float32)
    return dataclasses.replace(dataset, train=dataset.train.with_weights(weights[dataset.train.labels]))
