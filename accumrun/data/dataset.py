"""A dataset as numpy arrays: a source's arrays checked, the task its targets pose, the validation split, and
the per-epoch sample order.

Samples become float32. Targets become int32 class indices (classification), float32 0/1 rows (multi_label) or
float32 values of at least one column (regression). Shuffling and splitting depend on ``seed`` (and the
epoch) alone, never on the batch size or the subdivisions, so runs that differ only in those see the same data
in the same order. No TensorFlow here: ``accumrun check`` loads data to report sizes without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from accumrun.config.schema import DataConfig
from accumrun.data.sources import SOURCES
from accumrun.errors import ConfigError, DataError

# Far beyond any classifier head this tool builds, and well inside int32, to which labels are cast.
_MAX_CLASSES = 1_000_000

Task = Literal["classification", "regression", "multi_label"]


@dataclass(frozen=True)
class Dataset:
    """Training and (optional) validation arrays, ready for the model, and the task their targets pose."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray | None
    y_val: np.ndarray | None
    task: Task
    classes: int | None
    """The number of classes (classification) or labels (multi_label); None for regression."""

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    @property
    def target_shape(self) -> tuple[int, ...]:
        """One sample's target: ``()`` for a class index, ``(k,)`` for k labels or values."""
        return tuple(self.y_train.shape[1:])

    @property
    def outputs(self) -> int:
        """How many outputs a model needs: one per class or label, one per target value."""
        return self.classes if self.classes is not None else int(np.prod(self.target_shape))

    @property
    def train_size(self) -> int:
        return len(self.y_train)

    @property
    def val_size(self) -> int:
        return 0 if self.y_val is None else len(self.y_val)

    def describe_targets(self) -> str:
        """``10 classes``, ``5 labels (multi-label)`` or ``regression targets of shape (3,)``."""
        if self.task == "classification":
            return f"{self.classes} classes"
        if self.task == "multi_label":
            return f"{self.classes} labels (multi-label)"
        return f"regression targets of shape {self.target_shape}"


def load_dataset(config: DataConfig, seed: int) -> Dataset:
    """Load the configured dataset, settle its task and split off the validation data.

    Raises:
        DataError: a file is missing or malformed, or the arrays are inconsistent or do not fit the task.
        ConfigError: ``validation_split: test`` for a source without a test split.
    """
    splits = SOURCES[config.name].load(config, seed)
    task: Task = infer_task(np.asarray(splits.y_train)) if config.task == "auto" else config.task
    x_train, y_train = _checked("train", splits.x_train, splits.y_train, task)
    x_val: np.ndarray | None
    y_val: np.ndarray | None
    if config.validation_split == "test":
        if splits.x_test is None or splits.y_test is None:
            raise ConfigError("data.validation_split", f"dataset '{config.name}' has no test split", "test")
        x_val, y_val = _checked("test", splits.x_test, splits.y_test, task)
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
    if y_val is not None and y_val.shape[1:] != y_train.shape[1:]:
        raise DataError("data", f"test targets have shape {y_val.shape[1:]}, training targets {y_train.shape[1:]}")
    classes: int | None = None
    if task == "classification":
        labels = y_train if y_val is None else np.concatenate([y_train, y_val])
        classes = max(int(labels.max()) + 1, 2)
    elif task == "multi_label":
        classes = int(y_train.shape[1])
    return Dataset(config.name, x_train, y_train, x_val, y_val, task, classes)


def infer_task(y: np.ndarray) -> Task:
    """The task that targets ``y`` pose, for ``task: auto``: one integer per sample (or a column of them) is a
    class index; rows of several 0/1 values are multi-label; any other numbers are regression targets."""
    numeric = np.issubdtype(y.dtype, np.number) and not np.issubdtype(y.dtype, np.complexfloating)
    if not numeric and y.dtype != bool:
        return "classification"  # not numbers at all: _checked explains what class labels must be
    column = y[:, 0] if y.ndim == 2 and y.shape[1] == 1 else y
    if column.ndim == 1 and (y.dtype == bool or _integral(column)):
        return "classification"
    if y.ndim == 2 and np.isin(y, (0, 1)).all():
        return "multi_label"
    return "regression"


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


def _checked(split: str, x: np.ndarray, y: np.ndarray, task: Task) -> tuple[np.ndarray, np.ndarray]:
    """Validate one split: float32 samples (images get a channel axis), and targets as the task needs them."""
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim < 2:
        raise DataError(f"data.x_{split}", "needs one row per sample (at least 2 dimensions)", x.shape)
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == bool):
        raise DataError(f"data.x_{split}", "samples must be numeric", str(x.dtype))
    if np.issubdtype(x.dtype, np.complexfloating):
        raise DataError(f"data.x_{split}", "samples must be real numbers", str(x.dtype))
    if len(x) != len(y):
        raise DataError(f"data.y_{split}", f"has {len(y)} labels for {len(x)} samples")
    if len(y) == 0:
        raise DataError(f"data.x_{split}", "is empty")
    y = _TARGET_CHECKS[task](split, y)
    x = x.astype(np.float32, copy=False)
    if not np.all(np.isfinite(x)):
        raise DataError(f"data.x_{split}", "samples contain NaN or Inf")
    if x.ndim == 3:
        x = x[..., np.newaxis]
    return x, y


def _class_indices(split: str, y: np.ndarray) -> np.ndarray:
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(
            f"data.y_{split}", "class labels must be one integer class index per sample (or set data.task)", y.shape
        )
    if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating) or y.dtype == bool):
        # Text or complex labels: the integrality test below cannot even be asked of them.
        raise DataError(f"data.y_{split}", "labels must be integer class indices", y.flat[0].item())
    if not (y.dtype == bool or _integral(y)):
        raise DataError(f"data.y_{split}", "labels must be integer class indices", _first_bad(y))
    if y.min() < 0:
        raise DataError(f"data.y_{split}", "labels must be >= 0", int(y.min()))
    if y.max() > _MAX_CLASSES:
        raise DataError(f"data.y_{split}", f"labels must be class indices below {_MAX_CLASSES:,}", int(y.max()))
    return y.astype(np.int32)


def _multi_hot(split: str, y: np.ndarray) -> np.ndarray:
    if y.ndim != 2 or not _real(y):
        raise DataError(f"data.y_{split}", "multi-label targets must be one row of 0/1 values per sample", y.shape)
    if not np.isin(y, (0, 1)).all():
        raise DataError(f"data.y_{split}", "multi-label targets must be 0 or 1", float(y[~np.isin(y, (0, 1))][0]))
    return y.astype(np.float32)


def _values(split: str, y: np.ndarray) -> np.ndarray:
    if not _real(y):
        raise DataError(f"data.y_{split}", "regression targets must be real numbers", str(y.dtype))
    y = y.astype(np.float32)
    if not np.all(np.isfinite(y)):
        raise DataError(f"data.y_{split}", "regression targets contain NaN or Inf")
    # One value per sample is a column of one: the model's output and the loss then have the same shape.
    return y[:, np.newaxis] if y.ndim == 1 else y


_TARGET_CHECKS: dict[Task, Callable[[str, np.ndarray], np.ndarray]] = {
    "classification": _class_indices,
    "multi_label": _multi_hot,
    "regression": _values,
}


def _real(y: np.ndarray) -> bool:
    return y.dtype == bool or (np.issubdtype(y.dtype, np.number) and not np.issubdtype(y.dtype, np.complexfloating))


def _integral(y: np.ndarray) -> bool:
    if np.issubdtype(y.dtype, np.integer):
        return True
    return bool(np.issubdtype(y.dtype, np.floating) and np.all(np.isfinite(y)) and np.all(y == np.round(y)))


def _first_bad(y: np.ndarray) -> float:
    bad = y[~np.isfinite(y) | (y != np.round(y))]
    return float(bad[0]) if len(bad) else float(y[0])
