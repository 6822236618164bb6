"""Per-sample weights: ``data.weight`` as the sources read it, checked, and ``training.class_weight`` turned into
one weight per training sample.

Both end as the split's ``w`` (see :mod:`accumrun.data.splits`), which travels with the targets to the step. Class
weights weight the training split alone, as Keras' ``class_weight`` does; ``data.weight`` weights every split that
has it, so the validation loss is weighted as Keras' ``validation_data=(x, y, sample_weight)`` weights it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

import numpy as np

from accumrun.data.splits import with_weights
from accumrun.errors import ConfigError, DataError

if TYPE_CHECKING:  # the sources, which the dataset loads, check their weights here
    from accumrun.data.dataset import Dataset

_KEY = "training.class_weight"


def checked_weights(w: np.ndarray, where: str, samples: int) -> np.ndarray:
    """``w`` as float32, one weight per sample; ``where`` says where it was read (for the message).

    Raises:
        DataError: ``w`` is not one real number per sample, or holds a negative, NaN or Inf weight.
    """
    if w.ndim == 2 and w.shape[1] == 1:
        w = w[:, 0]
    if w.ndim != 1 or len(w) != samples:
        raise DataError("data.weight", f"{where}: needs one weight per sample ({samples:,})", w.shape)
    if not (np.issubdtype(w.dtype, np.integer) or np.issubdtype(w.dtype, np.floating)):
        raise DataError("data.weight", f"{where}: weights must be real numbers", str(w.dtype))
    bad = ~np.isfinite(w) | (w < 0)
    if bad.any():
        raise DataError("data.weight", f"{where}: weights must be finite and >= 0", float(w[bad][0]))
    return w.astype(np.float32)


def per_class(setting: dict[str, float] | Literal["balanced"], dataset: Dataset) -> np.ndarray:
    """Each class's weight, in class-index order: ``balanced`` is scikit-learn's n_samples / (n_classes * count)
    over the training split, n_classes counting the classes it holds (``compute_class_weight("balanced",
    classes=np.unique(y), y=y)``); a class it lacks keeps 1.0, as does a class the mapping leaves out.

    Raises:
        ConfigError: the targets are not class labels, or the mapping names a class the data does not have.
    """
    names = dataset.labels
    if names is None or dataset.train.y.ndim != 1:
        raise ConfigError(_KEY, f"needs class labels; the targets are {dataset.describe_targets()}")
    weights = np.ones(len(names), np.float64)
    if setting == "balanced":
        counts = np.bincount(dataset.train.y, minlength=len(names))
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
    return dataclasses.replace(dataset, train=with_weights(dataset.train, weights[dataset.train.y]))
