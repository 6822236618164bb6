"""Sources of arrays: ``digits`` (bundled), ``npz``, ``mnist`` and ``fashion_mnist`` (IDX files, downloadable) and
``synthetic`` (made from the seed), loaded in their stored dtype (:mod:`accumrun.data.dataset` checks them)."""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from accumrun.data.section import DataSection, SampleWeights
from accumrun.data.source import ArraySource
from accumrun.data.splits import Splits, checked_weights
from accumrun.errors import DataError
from accumrun.kinds import Task

DATASETS_DIR = Path(__file__).resolve().parent.parent.parent / "datasets"
"""Where bundled data lives, and where ``accumrun download`` puts files by default."""
DIGITS_FILE = DATASETS_DIR / "digits.npz"

IDX_FILES = {
    "x_train": "train-images-idx3-ubyte.gz",
    "y_train": "train-labels-idx1-ubyte.gz",
    "x_test": "t10k-images-idx3-ubyte.gz",
    "y_test": "t10k-labels-idx1-ubyte.gz",
}


class DigitsConfig(DataSection):
    """``name: digits``: the bundled 8x8 digits."""

    reads_path = False
    name: Literal["digits"] = "digits"


class NpzConfig(SampleWeights, DataSection):
    """``name: npz``: arrays ``x`` and ``y`` (or ``x_train``, ``y_train`` and optionally a test pair) in a file."""

    needs = {"path": "the path of an .npz file"}
    name: Literal["npz"]
    path: str = Field(min_length=1)


class IdxConfig(DataSection):
    """``name: mnist`` or ``fashion_mnist``: the four IDX files, from ``path`` or ``datasets/NAME``."""

    name: Literal["mnist", "fashion_mnist"]


class SyntheticConfig(DataSection):
    """``name: synthetic``: learnable data of any task, made from the seed."""

    reads_path = False
    name: Literal["synthetic"]
    samples: int = Field(2048, ge=1)
    shape: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [28, 28, 1], min_length=1)
    classes: int = Field(10, ge=2)


@dataclass(frozen=True)
class Download:
    """Where a source's four IDX files are published, with each file's MD5."""

    url: str
    md5: dict[str, str]


def load_digits(config: DigitsConfig, seed: int) -> Splits:
    """The bundled 8x8 digits (``datasets/digits.npz``): uint8 counts of 0..16, which ``rescale: auto`` maps to
    [0, 1]."""
    if not DIGITS_FILE.is_file():
        raise DataError("data.name", f"the bundled file {DIGITS_FILE} is missing; run datasets/make_digits.py")
    with np.load(DIGITS_FILE) as arrays:
        return Splits(ArraySource(arrays["x"], arrays["y"]), scale=1 / 16)


def load_npz(config: NpzConfig, seed: int) -> Splits:
    """Arrays ``x`` and ``y``, or ``x_train``, ``y_train`` (and optionally ``x_test``, ``y_test``); with
    ``data.weight: w``, the weights ``w``, or ``w_train`` (and ``w_test`` beside a test pair)."""
    path = Path(config.path)
    if not path.is_file():
        raise DataError("data.path", "npz file not found", config.path)
    try:
        with path.open("rb") as file:
            magic = file.read(6)
        # A zip or a .npy, else numpy takes the file for a pickle and advises loading it unsafely.
        if not magic.startswith((b"PK", b"\x93NUMPY")):
            raise DataError("data.path", "cannot read as .npz: not a zip of arrays, as numpy.savez writes", config.path)
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise DataError("data.path", "is a single array, not an .npz archive of named arrays", config.path)
        with loaded as arrays:
            keys = set(arrays.files)
            if {"x_train", "y_train"} <= keys:
                train = _npz_split(arrays, config, "_train")
                test = _npz_split(arrays, config, "_test") if {"x_test", "y_test"} <= keys else None
                return Splits(train, test)
            if {"x", "y"} <= keys:
                return Splits(_npz_split(arrays, config, ""))
    except (OSError, ValueError) as error:
        raise DataError("data.path", f"cannot read as .npz: {error}", config.path) from None
    raise DataError("data.path", f"needs arrays 'x' and 'y' (or 'x_train' and 'y_train'); it has {sorted(keys)}")


def _npz_split(arrays: np.lib.npyio.NpzFile, config: NpzConfig, suffix: str) -> ArraySource:
    """The arrays ``x<suffix>`` and ``y<suffix>``, and the weights ``<data.weight><suffix>`` when it is set."""
    x, y = arrays[f"x{suffix}"], arrays[f"y{suffix}"]
    if config.weight is None:
        return ArraySource(x, y)
    name = f"{config.weight}{suffix}"
    if name not in arrays.files:
        raise DataError("data.weight", f"{config.path} has no array {name!r}; it has {sorted(arrays.files)}")
    return ArraySource(x, y, checked_weights(arrays[name], f"{config.path}, array {name!r}", len(y)))


def load_idx_folder(config: IdxConfig, seed: int) -> Splits:
    """The four IDX files of MNIST or Fashion-MNIST, from ``data.path`` or ``datasets/NAME``, as uint8."""
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
                f"(or get them from {DOWNLOADS[config.name].url})",
            )
        arrays[key] = read_idx(file)
    return Splits(ArraySource(arrays["x_train"], arrays["y_train"]), ArraySource(arrays["x_test"], arrays["y_test"]))


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file of unsigned bytes (gzip-compressed when its name ends in ``.gz``); DataError where it is
    not gzip when it should be, has a bad magic number or is truncated."""
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as error:
        raise DataError("data.path", f"{path} is not a readable gzip file: {error}") from None
    if len(raw) < 4 or raw[0:2] != b"\x00\x00" or raw[2] != 0x08:
        raise DataError("data.path", f"{path} is not an IDX file of unsigned bytes (bad magic number)", raw[:4].hex())
    rank = raw[3]
    header = 4 + 4 * rank
    if len(raw) < header:
        raise DataError("data.path", f"{path} is truncated inside its header")
    shape = struct.unpack(f">{rank}I", raw[4:header])
    expected = int(np.prod(shape))
    if len(raw) - header != expected:
        raise DataError(
            "data.path", f"{path} holds {len(raw) - header:,} data bytes; its header {shape} needs {expected:,}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def load_synthetic(config: SyntheticConfig, seed: int) -> Splits:
    """Learnable data of any task, made from the seed: Gaussian blobs around a prototype per class (two for
    binary), labels set where a random linear function is positive (multi-label), or a smooth random function."""
    rng = np.random.default_rng(seed)
    shape = tuple(config.shape)
    if config.task == "auto" or config.task.class_labels:
        classes = 2 if config.task is Task.BINARY else config.classes
        prototypes = rng.normal(size=(classes, *shape)).astype(np.float32)
        labels = rng.integers(classes, size=config.samples)
        noise = rng.normal(scale=2.0, size=(config.samples, *shape)).astype(np.float32)
        return Splits(ArraySource(prototypes[labels] + noise, labels))
    x = rng.normal(size=(config.samples, *shape)).astype(np.float32)
    flat = x.reshape(config.samples, -1)
    if config.task is Task.MULTI_LABEL:
        weights = rng.normal(size=(flat.shape[1], config.classes)) / np.sqrt(flat.shape[1])
        return Splits(ArraySource(x, (flat @ weights > 0).astype(np.int64)))
    weights = rng.normal(size=flat.shape[1]) / np.sqrt(flat.shape[1])
    return Splits(ArraySource(x, (np.tanh(flat @ weights) * 2.0).astype(np.float32)))


# Where the IDX files are published, for ``accumrun download``; the checksums are torchvision's MNIST/FashionMNIST
# ``resources`` and the Fashion-MNIST README's.
DOWNLOADS = {
    "mnist": Download(
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
        {
            "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
            "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
            "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
            "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
        },
    ),
    "fashion_mnist": Download(
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        {
            "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
            "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
            "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
            "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
        },
    ),
}
