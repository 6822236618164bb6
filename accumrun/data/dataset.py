"""A dataset: a source's splits checked for their task, the validation split, ``data.cache`` and class weights.

Shuffling and splitting depend on ``seed`` (and the epoch) alone, never on the batch size or the subdivisions. No
TensorFlow here but where ``data.cache`` decodes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np

from accumrun.data.registry import SOURCES
from accumrun.data.section import DataSection
from accumrun.data.source import ArraySource, Source
from accumrun.data.source import epoch_order as epoch_order  # tests read the order from here
from accumrun.data.splits import Splits, hold_out
from accumrun.errors import ConfigError, DataError
from accumrun.kinds import CacheMode, Precision, Task

_CLASS_WEIGHT = "training.class_weight"
# Far beyond any classifier head this tool builds, and well inside int32, to which labels are cast.
_MAX_CLASSES = 1_000_000
_COMPACT = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16))
_FULL_SCALE = {np.dtype(np.uint8): 1 / 255, np.dtype(np.uint16): 1 / 65535}
"""What ``rescale: auto`` multiplies unsigned integers by: their full range to [0, 1]."""


@dataclass(frozen=True)
class Dataset:
    """The training and (optional) validation splits, checked, and the task their targets pose. ``class_names``,
    ``skipped``, ``features`` and ``vocabulary_size`` are the source's (:class:`~accumrun.data.splits.Splits`)."""

    name: str
    train: Source
    val: Source | None
    task: Task
    classes: int | None
    """Classes (classification), labels (multi_label) or token ids (causal_lm); None for regression."""
    class_names: list[str] | None = None
    scale: float = 1.0
    """What ``rescale: auto`` multiplies raw samples by: the source's own, else 1/255 (uint8), 1/65535 (uint16) or 1."""
    skipped: int = 0
    features: list[str] | None = None
    vocabulary_size: int | None = None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """One sample's shape as stored (before augmentation)."""
        return self.train.sample_shape

    @property
    def dtype(self) -> np.dtype:
        """The samples' stored dtype: uint8 for images, int32 for token ids, else float32 or a small integer type."""
        return self.train.dtype

    @property
    def target_shape(self) -> tuple[int, ...]:
        """One sample's target: ``()`` for a class index, ``(k,)`` for k labels or values (or next tokens)."""
        return self.train.target_shape

    @property
    def outputs(self) -> int:
        """How many outputs a model needs: one per class, label or target value; binary needs one, P(class 1)."""
        if self.task is Task.BINARY:
            return 1
        return self.classes if self.classes is not None else int(np.prod(self.target_shape))

    @property
    def labels(self) -> list[str] | None:
        """The outputs' names (``labels.json``): class names or indices; None for regression and a language model."""
        if self.classes is None or self.task is Task.CAUSAL_LM:
            return None
        return self.class_names if self.class_names is not None else [str(i) for i in range(self.classes)]

    @property
    def train_size(self) -> int:
        return self.train.size

    @property
    def val_size(self) -> int:
        return 0 if self.val is None else self.val.size

    @property
    def streamed(self) -> bool:
        """Whether the samples are read as they are needed rather than held as arrays in memory."""
        return self.train.streamed

    def settled_by_output(self, width: int | None) -> Dataset:
        """``task: auto``'s last word: two classes and a model of one output unit pose a binary task."""
        if self.task is Task.CLASSIFICATION and self.classes == 2 and width == 1:
            return dataclasses.replace(self, task=Task.BINARY)
        return self

    def describe_targets(self) -> str:
        """``10 classes``, ``2 classes (binary: cat, dog)``, ``5 labels (multi-label)`` and the like."""
        if self.task is Task.BINARY:
            negative, positive = self.labels or ["0", "1"]
            return f"2 classes (binary: {negative}, {positive})"
        return {
            Task.CLASSIFICATION: f"{self.classes} classes",
            Task.MULTI_LABEL: f"{self.classes} labels (multi-label)",
            Task.CAUSAL_LM: f"next tokens of {self.classes} ids",
        }.get(self.task, f"regression targets of shape {self.target_shape}")


def sample_floats(precision: Precision) -> type[np.floating]:
    """What real-valued samples and targets are held in under ``training.precision``: float64 under float64,
    else float32 (a mixed-precision model casts them itself)."""
    return np.float64 if precision is Precision.FLOAT64 else np.float32


def load_dataset(config: DataSection, seed: int, floats: type[np.floating] = np.float32) -> Dataset:
    """Load the configured dataset, settle its task, split off the validation data and apply ``data.cache``.
    Real-valued samples and targets are held as ``floats`` (float64 under ``training.precision: float64``).

    Raises:
        DataError: a file is missing or malformed, the samples do not fit the task, or the cache cannot be written.
        ConfigError: ``validation_split: test`` without a test split, or a task that the source cannot pose.
    """
    splits = SOURCES[config.name].load(config, seed)
    task = _task(config, splits)
    if splits.train.labelled_files and not task.class_labels:
        raise ConfigError(
            "data.task",
            f"data.name: {config.name} gives class labels, so it poses classification (or binary)",
            task.value,
        )
    if task is Task.BINARY and splits.class_names is not None and len(splits.class_names) != 2:
        raise DataError("data", f"binary needs two classes; the source has {len(splits.class_names)}", task.value)
    tokens = splits.vocabulary_size is not None
    train = _checked("train", splits.train, task, tokens, floats)
    val: Source | None = None
    held_out = "validation" if config.validation_file else "test"
    # The loaders give data.validation_path as the test split.
    if (config.validation_file and splits.test is not None) or config.validation_split == "test":
        if splits.test is None:
            raise ConfigError("data.validation_split", f"dataset '{config.name}' has no test split", "test")
        val = _checked(held_out, splits.test, task, tokens, floats)
    elif config.validation_split > 0:
        # Windows and rows are numbered in their files' order, streamed or held: the same hold-out either way.
        kept, held = hold_out(train.size, config.validation_split, seed, config.shuffle, files=train.labelled_files)
        train, val = train.subset(kept), train.subset(held)
    if train.size == 0:
        raise DataError("data", "no training samples are left after the validation split", splits.train.size)
    if val is not None:
        for what, got, wanted in (
            ("samples", val.sample_shape, train.sample_shape),
            ("targets", val.target_shape, train.target_shape),
        ):
            if got != wanted:
                raise DataError("data", f"{held_out} {what} have shape {got}, training {what} {wanted}")
    classes = _classes(splits, task, train, val)
    mode, cache_dir = config.cache_wrapper
    if mode is not CacheMode.NONE and train.keys is not None:
        # Imported here: it decodes with TensorFlow, which listing and checking the files does not need.
        from accumrun.data.cache import cached

        train = cached(train, mode, cache_dir)
        val = None if val is None else cached(val, mode, cache_dir)
    scale = splits.scale if splits.scale is not None else _FULL_SCALE.get(train.dtype, 1.0)
    return Dataset(
        config.name,
        train,
        val,
        task,
        classes,
        splits.class_names,
        scale,
        splits.skipped,
        splits.features,
        splits.vocabulary_size,
    )


def per_class(setting: dict[str, float] | Literal["balanced"], dataset: Dataset) -> np.ndarray:
    """Each class's ``training.class_weight``, by class index: ``balanced`` is scikit-learn's n_samples / (n_classes *
    count) over the classes the training split holds; any other class keeps 1.0.

    Raises:
        ConfigError: the targets are not class labels, or the mapping names a class the data does not have.
    """
    names = dataset.labels
    if names is None or dataset.target_shape != ():
        raise ConfigError(_CLASS_WEIGHT, f"needs class labels; the targets are {dataset.describe_targets()}")
    weights = np.ones(len(names), np.float64)
    if setting == "balanced":
        counts = np.bincount(dataset.train.labels, minlength=len(names))
        present = counts > 0
        weights[present] = dataset.train_size / (present.sum() * counts[present])
        return weights
    unknown = [name for name in setting if name not in names]
    if unknown:
        shown = names if len(names) <= 10 else [*names[:10], "..."]
        raise ConfigError(_CLASS_WEIGHT, f"names no class {unknown[0]!r}; the classes are {shown}", unknown[0])
    for name, weight in setting.items():
        weights[names.index(name)] = weight
    return weights


def with_class_weights(dataset: Dataset, setting: dict[str, float] | Literal["balanced"] | None) -> Dataset:
    """``dataset`` with its training samples (alone, as Keras' ``class_weight``) weighted by their classes' weights;
    raises as :func:`per_class`."""
    if setting is None:
        return dataset
    weights = per_class(setting, dataset).astype(np.float32)
    return dataclasses.replace(dataset, train=dataset.train.with_weights(weights[dataset.train.labels]))


def _classes(splits: Splits, task: Task, train: Source, val: Source | None) -> int | None:
    """How many outputs the targets name (classes, labels or token ids); None for regression."""
    if splits.class_names is not None:
        return len(splits.class_names)
    if task is Task.CLASSIFICATION:
        labels = train.labels if val is None else np.concatenate([train.labels, val.labels])
        return max(int(labels.max()) + 1, 2)
    if task is Task.MULTI_LABEL:
        return int(train.target_shape[0])
    return {Task.BINARY: 2, Task.CAUSAL_LM: splits.vocabulary_size}.get(task)


def _task(config: DataSection, splits: Splits) -> Task:
    """The task ``data.task`` names, or for ``auto`` the one the source poses or its targets read as."""
    if config.task == "auto":
        return splits.task if splits.task is not None else infer_task(np.asarray(splits.train.labels))
    if splits.task is not None and config.task is not splits.task:
        raise ConfigError(
            "data.task",
            f"data.name: {config.name} poses {splits.task.value} (or set data.task: auto)",
            config.task.value,
        )
    if config.task is Task.CAUSAL_LM and splits.task is not Task.CAUSAL_LM:
        raise ConfigError(
            "data.task",
            f"causal_lm predicts each next token of a text corpus; data.name: {config.name} holds labelled samples "
            "(use data.name: text_corpus)",
            config.task.value,
        )
    return config.task


def infer_task(y: np.ndarray) -> Task:
    """The task that targets ``y`` pose, for ``task: auto``: one integer per sample (or a column of them) is a
    class index; rows of several 0/1 values are multi-label; any other numbers are regression targets."""
    if not _real(y):
        return Task.CLASSIFICATION  # not numbers at all: _checked explains what class labels must be
    column = y[:, 0] if y.ndim == 2 and y.shape[1] == 1 else y
    if column.ndim == 1 and (y.dtype == bool or _integral(column)):
        return Task.CLASSIFICATION
    if y.ndim == 2 and np.isin(y, (0, 1)).all():
        return Task.MULTI_LABEL
    return Task.REGRESSION


def _checked(name: str, split: Source, task: Task, tokens: bool, floats: type[np.floating]) -> Source:
    """One split with its targets checked for the task; arrays (but token ids) also get compact samples."""
    held = split.in_memory
    if held is None:  # a corpus's windows keep their targets, their own token ids, in the token file
        return split.with_targets(lambda y: _checked_targets(task, name, np.asarray(y), floats))
    x, y = np.asarray(held.x), np.asarray(held.y)
    if x.ndim < 2:
        raise DataError(f"data.x_{name}", "needs one row per sample (at least 2 dimensions)", x.shape)
    if not _real(x):
        kind = "real numbers" if np.issubdtype(x.dtype, np.complexfloating) else "numeric"
        raise DataError(f"data.x_{name}", f"samples must be {kind}", str(x.dtype))
    if len(x) != len(y):
        raise DataError(f"data.y_{name}", f"has {len(y)} labels for {len(x)} samples")
    if len(y) == 0:
        raise DataError(f"data.x_{name}", "is empty")
    y = _checked_targets(task, name, y, floats)
    if not tokens:
        # Integers of one or two bytes keep their dtype (a quarter or half of float32's memory; cast on the device).
        if x.dtype == bool:
            x = x.astype(np.uint8)
        elif x.dtype not in _COMPACT:
            x = x.astype(floats, copy=False)
        if x.dtype == floats and not np.all(np.isfinite(x)):
            raise DataError(f"data.x_{name}", "samples contain NaN or Inf")
        if x.ndim == 3:
            x = x[..., np.newaxis]
    return ArraySource(x, y, held.w)


def _checked_targets(task: Task, split: str, y: np.ndarray, floats: type[np.floating] = np.float32) -> np.ndarray:
    """``y`` checked for the task, as int32 class indices or token ids, or 0/1 rows or values as ``floats``."""
    key = f"data.y_{split}"
    if task is Task.CAUSAL_LM:
        if y.ndim != 2 or not np.issubdtype(y.dtype, np.integer) or (y.size and y.min() < 0):
            raise DataError(key, "next-token targets must be one row of token ids >= 0 per sample", y.shape)
        return y.astype(np.int32)
    if task is Task.MULTI_LABEL:
        if y.ndim != 2 or not _real(y):
            hint = " (for one 0/1 label per sample use data.task: binary)" if y.ndim == 1 else ""
            raise DataError(key, f"multi-label targets must be one row of 0/1 values per sample{hint}", y.shape)
        if not np.isin(y, (0, 1)).all():
            raise DataError(key, "multi-label targets must be 0 or 1", float(y[~np.isin(y, (0, 1))][0]))
        return y.astype(floats)
    if task is Task.REGRESSION:
        if not _real(y):
            raise DataError(key, "regression targets must be real numbers", str(y.dtype))
        y = y.astype(floats)
        if not np.all(np.isfinite(y)):
            raise DataError(key, "regression targets contain NaN or Inf")
        # One value per sample is a column of one: the model's output and the loss then have the same shape.
        return y[:, np.newaxis] if y.ndim == 1 else y
    if len(y) == 0:
        raise DataError(key, "is empty")
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(key, "class labels must be one integer class index per sample (or set data.task)", y.shape)
    if not _real(y):
        # Text or complex labels: the integrality test below cannot even be asked of them.
        raise DataError(key, "labels must be integer class indices", y.flat[0].item())
    if not (y.dtype == bool or _integral(y)):
        raise DataError(key, "labels must be integer class indices", float(y[~np.isfinite(y) | (y != np.round(y))][0]))
    if y.min() < 0:
        raise DataError(key, "labels must be >= 0", int(y.min()))
    if y.max() > _MAX_CLASSES:
        raise DataError(key, f"labels must be class indices below {_MAX_CLASSES:,}", int(y.max()))
    if task is Task.BINARY and y.max() > 1:
        raise DataError(key, "binary labels must be 0 or 1 (or set data.task: classification)", int(y.max()))
    return y.astype(np.int32)


def _real(y: np.ndarray) -> bool:
    return y.dtype == bool or (np.issubdtype(y.dtype, np.number) and not np.issubdtype(y.dtype, np.complexfloating))


def _integral(y: np.ndarray) -> bool:
    """Whether real (not bool) numbers ``y`` are all integers."""
    return np.issubdtype(y.dtype, np.integer) or bool(np.all(np.isfinite(y)) and np.all(y == np.round(y)))
