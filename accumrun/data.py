"""Datasets as numpy arrays: the registry of loaders, the validation split and the per-epoch sample order.

Every loader returns float32 samples and int32 labels. Shuffling and splitting depend on ``seed`` (and the
epoch) alone, never on the batch size or the subdivisions, so runs that differ only in those see the same data
in the same order. No TensorFlow here: ``accumrun check`` loads data to report sizes without it.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accumrun.config import DataConfig
from accumrun.errors import ConfigError, DataError

DATASETS_DIR = Path(__file__).resolve().parent.parent / "datasets"
DIGITS_FILE = DATASETS_DIR / "digits.npz"

IDX_FILES = {
    "x_train": "train-images-idx3-ubyte.gz",
    "y_train": "train-labels-idx1-ubyte.gz",
    "x_test": "t10k-images-idx3-ubyte.gz",
    "y_test": "t10k-labels-idx1-ubyte.gz",
}
IDX_SOURCES = {
    "mnist": "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "fashion_mnist": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
}
_IDX_UBYTE = 0x08
_ZIP_MAGIC = b"PK"
_NPY_MAGIC = b"\x93NUMPY"
# Far beyond any classifier head this tool builds, and well inside int32, to which labels are cast.
_MAX_CLASSES = 1_000_000


@dataclass(frozen=True)
class Splits:
    """What a loader returns: training arrays and, when the source has one, a test split."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None = None
    y_test: np.ndarray | None = None


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
    splits = _LOADERS[config.name](config, seed)
    x_train, y_train = _checked("train", splits.x_train, splits.y_train)
    if config.validation_split == "test":
        if splits.x_test is None:
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


# --- loaders -------------------------------------------------------------------------------------------------


def _load_digits(config: DataConfig, seed: int) -> Splits:
    if not DIGITS_FILE.is_file():
        raise DataError("data.name", f"the bundled file {DIGITS_FILE} is missing; run datasets/make_digits.py")
    with np.load(DIGITS_FILE) as arrays:
        # The UCI pixels are counts of 0..16; scale them to [0, 1].
        return Splits(arrays["x"].astype(np.float32) / 16.0, arrays["y"])


def _load_npz(config: DataConfig, seed: int) -> Splits:
    path = Path(config.path)
    if not path.is_file():
        raise DataError("data.path", "npz file not found", config.path)
    try:
        with path.open("rb") as file:
            magic = file.read(len(_NPY_MAGIC))
        # Without this, numpy takes any other file for a pickle and advises loading it unsafely.
        if not magic.startswith((_ZIP_MAGIC, _NPY_MAGIC)):
            raise DataError("data.path", "cannot read as .npz: not a zip of arrays, as numpy.savez writes", config.path)
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise DataError("data.path", "is a single array, not an .npz archive of named arrays", config.path)
        with loaded as arrays:
            keys = set(arrays.files)
            if {"x_train", "y_train"} <= keys:
                test = (arrays["x_test"], arrays["y_test"]) if {"x_test", "y_test"} <= keys else (None, None)
                return Splits(arrays["x_train"], arrays["y_train"], *test)
            if {"x", "y"} <= keys:
                return Splits(arrays["x"], arrays["y"])
    except (OSError, ValueError) as error:
        raise DataError("data.path", f"cannot read as .npz: {error}", config.path) from None
    raise DataError("data.path", f"needs arrays 'x' and 'y' (or 'x_train' and 'y_train'); it has {sorted(keys)}")


def _load_idx_folder(config: DataConfig, seed: int) -> Splits:
    folder = Path(config.path) if config.path else DATASETS_DIR / config.name
    arrays = {}
    for key, filename in IDX_FILES.items():
        file = folder / filename
        if not file.is_file() and (folder / filename.removesuffix(".gz")).is_file():
            file = folder / filename.removesuffix(".gz")
        if not file.is_file():
            raise DataError(
                "data.path",
                f"{file} not found; fetch the four IDX files with `accumrun download {config.name} --to {folder}` "
                f"(or get them from {IDX_SOURCES[config.name]})",
            )
        arrays[key] = read_idx(file)
    # IDX images are 0..255 bytes; scale them to [0, 1].
    return Splits(
        arrays["x_train"].astype(np.float32) / 255.0,
        arrays["y_train"],
        arrays["x_test"].astype(np.float32) / 255.0,
        arrays["y_test"],
    )


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file of unsigned bytes (gzip-compressed when its name ends in ``.gz``).

    Raises:
        DataError: the file is not gzip when it should be, has a bad magic number or is truncated.
    """
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as error:
        raise DataError("data.path", f"{path} is not a readable gzip file: {error}") from None
    if len(raw) < 4 or raw[0:2] != b"\x00\x00" or raw[2] != _IDX_UBYTE:
        raise DataError("data.path", f"{path} is not an IDX file of unsigned bytes (bad magic number)", raw[:4].hex())
    rank = raw[3]
    header = 4 + 4 * rank
    if len(raw) < header:
        raise DataError("data.path", f"{path} is truncated inside its header")
    shape = struct.unpack(f">{rank}I", raw[4:header])
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise DataError(
            "data.path",
            f"{path} holds {len(raw) - header:,} data bytes; its header {shape} needs {expected:,}",
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _load_synthetic(config: DataConfig, seed: int) -> Splits:
    """Gaussian blobs around one random prototype per class: learnable, yet not separable by a glance."""
    rng = np.random.default_rng(seed)
    shape = tuple(config.shape)
    prototypes = rng.normal(size=(config.classes, *shape)).astype(np.float32)
    labels = rng.integers(config.classes, size=config.samples)
    noise = rng.normal(scale=2.0, size=(config.samples, *shape)).astype(np.float32)
    return Splits(prototypes[labels] + noise, labels)


_LOADERS: dict[str, Callable[[DataConfig, int], Splits]] = {
    "digits": _load_digits,
    "npz": _load_npz,
    "mnist": _load_idx_folder,
    "fashion_mnist": _load_idx_folder,
    "synthetic": _load_synthetic,
}
