"""A dataset as numpy arrays: a source's arrays checked, the validation split, and the per-epoch sample order.

Samples become float32 and labels int32. Shuffling and splitting depend on ``seed`` (and the
epoch) alone, never on the batch size or the subdivisions, so runs that differ only in those see the same data
in the same order. No TensorFlow here: ``accumrun check`` loads data to report sizes without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accumrun.config.schema import DataConfig
from accumrun.data.sources import SOURCES
from accumrun.errors import ConfigError, DataError

# Far beyond any classifier head this tool builds, and well inside int32, to which labels are cast.
_MAX_CLASSES = 1_000_000


@dataclass(frozen=True)
class Dataset:
    """Training and (optional) validation arrays, ready for the model."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray | None
    y_val: np.ndarray | None
    classes: int

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def train_size(self) -> int:
        return len(self.y_train)

    @property
    def val_size(self) -> int:
        return 0 if self.y_val is None else len(self.y_val)


def load_dataset(config: DataConfig, seed: int) -> Dataset:
    """Load the configured dataset and split off the validation data.

    Raises:
        DataError: a file is missing or malformed, or the arrays are inconsistent.
        ConfigError: ``validation_split: test`` for a source without a test split.
    """
    splits = SOURCES[config.name].load(config, seed)
    x_train, y_train = _checked("train", splits.x_train, splits.y_train)
    x_val: np.ndarray | None
    y_val: np.ndarray | None
    if config.validation_split == "test":
        if splits.x_test is None or splits.y_test is None:
            raise ConfigError("data.validation_split", f"dataset '{config.name}' has no test split", "test")
        x_val, y_val = _checked("test", splits.x_test, splits.y_test)
    elif config.validation_split > 0:
        x_train, y_train, x_val, y_val = _split_off_validation(
            x_train, y_train, config.validation_split, seed, config.shuffle
        )
    else:
        x_val = y_val = None
    if len(y_train) == 0:
        raise DataError("data", "no training samples are left after the validation split", len(splits.y_train))
    if x_val is not None and x_val.shape[1:] != x_train.shape[1:]:
        raise DataError("data", f"test samples have shape {x_val.shape[1:]}, training samples {x_train.shape[1:]}")
    labels = y_train if y_val is None else np.concatenate([y_train, y_val])
    classes = max(int(labels.max()) + 1, 2)
    return Dataset(config.name, x_train, y_train, x_val, y_val, classes)


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order in which training samples are visited in ``epoch`` (0-based): a function of these alone."""
    if not shuffle:
        return np.arange(size)
    return np.random.default_rng([seed, epoch]).permutation(size)


def _split_off_validation(
    x: np.ndarray, y: np.ndarray, fraction: float, seed: int, shuffle: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    count = round(len(y) * fraction)
    if count == 0:
        raise DataError("data.validation_split", f"leaves no validation sample out of {len(y)}", fraction)
    # Without shuffling, hold out the tail, as Keras' validation_split does.
    order = np.random.default_rng(seed).permutation(len(y)) if shuffle else np.arange(len(y))
    val, train = order[len(y) - count :], order[: len(y) - count]
    return x[train], y[train], x[val], y[val]


def _checked(split: str, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate one split and bring it to float32 samples (images get a channel axis) and int32 labels."""
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim < 2:
        raise DataError(f"data.x_{split}", "needs one row per sample (at least 2 dimensions)", x.shape)
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
        raise DataError(f"data.x_{split}", "samples must be numeric", str(x.dtype))
    if np.issubdtype(x.dtype, np.complexfloating):
        raise DataError(f"data.x_{split}", "samples must be real numbers", str(x.dtype))
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(f"data.y_{split}", "labels must be one integer class index per sample", y.shape)
    if len(x) != len(y):
        raise DataError(f"data.y_{split}", f"has {len(y)} labels for {len(x)} samples")
    if len(y) == 0:
        raise DataError(f"data.x_{split}", "is empty")
    if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating) or y.dtype == bool):
        # Text or complex labels: the integrality test below cannot even be asked of them.
        raise DataError(f"data.y_{split}", "labels must be integer class indices", y.flat[0].item())
    integral = (
        np.issubdtype(y.dtype, np.integer)
        or y.dtype == bool
        or (np.issubdtype(y.dtype, np.floating) and np.all(np.isfinite(y)) and np.all(y == np.round(y)))
    )
    if not integral:
        raise DataError(f"data.y_{split}", "labels must be integer class indices", _first_bad(y))
    if y.min() < 0:
        raise DataError(f"data.y_{split}", "labels must be >= 0", int(y.min()))
    if y.max() > _MAX_CLASSES:
        raise DataError(f"data.y_{split}", f"labels must be class indices below {_MAX_CLASSES:,}", int(y.max()))
    x = x.astype(np.float32, copy=False)
    if not np.all(np.isfinite(x)):
        raise DataError(f"data.x_{split}", "samples contain NaN or Inf")
    if x.ndim == 3:
        x = x[..., np.newaxis]
    return x, y.astype(np.int32)


def _first_bad(y: np.ndarray) -> float:
    bad = y[~np.isfinite(y) | (y != np.round(y))]
    return float(bad[0]) if len(bad) else float(y[0])
