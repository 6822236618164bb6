"""What ``accumrun predict`` reads, as splits stored the way the run's own were, each sample named for the output.

Arrays and tables are checked here against the shape the model takes: a wrong input is one clear error, not a
failure deep inside the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from accumrun.data.files import IMAGE_EXTENSIONS, ImageFiles, TextFiles
from accumrun.data.section import TextTable
from accumrun.data.source import ArraySource, Source
from accumrun.data.tables import read_column, read_features
from accumrun.data.text import read_text
from accumrun.data.tokenizers import Tokenizer
from accumrun.errors import DataError


@dataclass(frozen=True)
class InputKind:
    """What the model takes: a sample's shape and dtype, and whether it reads images, text or a table's features."""

    sample_shape: tuple[int, ...]
    dtype: np.dtype
    images: bool = False
    tokenizer: Tokenizer | None = None
    features: list[str] | None = None
    id_column: str | None = None
    """The CSV column that names each row (``data.id``), when the run has one."""
    text_table: TextTable | None = None
    """The run's source, when its texts come from a table: files laid out as its own are read the same way."""

    @property
    def table_suffix(self) -> str | None:
        """The suffix of a file laid out as the run's text table (``.csv`` or ``.jsonl``), else None."""
        return None if self.text_table is None else f".{self.text_table.name}"

    def describe(self) -> str:
        if self.images:
            return "image files or folders of them, or an .npz with x"
        if self.tokenizer is not None:
            table = f", a {self.table_suffix} laid out as the training data" if self.table_suffix else ""
            return f".txt files or folders of them{table}, or an .npz of token ids x"
        if self.features is not None:
            return "a CSV with the feature columns, or an .npz with x"
        return "an .npz with x"


@dataclass(frozen=True)
class InputGroup:
    """Samples read from one or more inputs, with one name per sample: the path as given, or the row index."""

    names: list[str]
    split: Source


def read_inputs(paths: Sequence[str], kind: InputKind, *, lines: bool = False) -> list[InputGroup]:
    """The samples of ``paths``, in order: consecutive image files make one group, each folder, ``.npz`` or table
    another. Rows are named by index (or ``id_column``), prefixed by the file when several are given. A text file is
    one sample, or with ``lines`` each line that holds more than spaces, named ``PATH:LINE``; a file laid out as the
    run's text table (``text_table``) gives a sample per row.

    Raises:
        DataError: a path is missing or of a kind the run does not take, or holds no samples the model takes.
    """
    groups: list[InputGroup] = []
    images: list[str] = []
    prefix = len(paths) > 1
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise DataError(given, "no such file or folder")
        if kind.text_table is not None and path.is_file() and path.suffix.lower() == kind.table_suffix:
            texts, ids = kind.text_table.texts_of(path)
            groups.append(_rows(given, _encoded(texts, kind), prefix, ids))
            continue
        if kind.tokenizer is not None and (path.is_dir() or path.suffix.lower() == ".txt"):
            files = [given] if path.is_file() else sorted(str(p) for p in path.rglob("*.txt") if p.is_file())
            if not files:
                raise DataError(given, "holds no .txt files")
            groups.append(_text_group(files, kind.tokenizer, kind.sample_shape, lines))
            continue
        image_file = path.is_file() and path.suffix.lower() in IMAGE_EXTENSIONS
        if (image_file or path.is_dir()) and not kind.images:
            raise DataError(given, f"is an image or a folder; this run's model takes {kind.describe()}")
        if image_file:
            images.append(given)
            continue
        if images:
            groups.append(_image_group(images, kind))
            images = []
        if path.is_dir():
            found = sorted(str(p) for p in path.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
            if not found:
                raise DataError(given, f"holds no images ({', '.join(IMAGE_EXTENSIONS)})")
            groups.append(_image_group(found, kind))
        elif path.suffix.lower() == ".npz":
            groups.append(_rows(given, _npz(path, kind), prefix))
        elif path.suffix.lower() == ".csv" and kind.features is not None:
            ids = read_column(path, kind.id_column) if kind.id_column is not None else None
            groups.append(_rows(given, read_features(path, kind.features), prefix, ids))
        else:
            raise DataError(given, f"is not an input this run takes ({kind.describe()})")
    if images:
        groups.append(_image_group(images, kind))
    return groups


def _image_group(paths: list[str], kind: InputKind) -> InputGroup:
    height, width, channels = kind.sample_shape
    return InputGroup(paths, ImageFiles(np.array(paths), np.zeros(len(paths), np.int32), (height, width), channels))


def _text_group(paths: list[str], tokenizer: Tokenizer, sample_shape: tuple[int, ...], lines: bool) -> InputGroup:
    """Text files, each one sample (or each line one, with ``lines``), tokenized as the run's training texts were;
    a DataError where a file is not UTF-8, is empty, or with ``lines`` holds no line of text."""
    (length,) = sample_shape
    if not lines:
        for path in paths:
            read_text(Path(path), path)
        return InputGroup(paths, TextFiles(np.array(paths), np.zeros(len(paths), np.int32), tokenizer, length))
    names: list[str] = []
    texts: list[str] = []
    for path in paths:
        text = read_text(Path(path), path)
        # Lines end at "\n" alone (not at the other breaks str.splitlines knows), with a "\r" before it dropped.
        kept = {f"{path}:{n}": line.removesuffix("\r") for n, line in enumerate(text.split("\n"), 1) if line.strip()}
        if not kept:
            raise DataError(path, "holds no line of text")
        names += kept
        texts += kept.values()
    return InputGroup(names, ArraySource(tokenizer.encode(texts, length), np.zeros(len(texts), np.int32)))


def _encoded(texts: list[str], kind: InputKind) -> np.ndarray:
    """``texts`` as the run's token ids, tokenized to its training length."""
    assert kind.tokenizer is not None  # a text table's run reads text
    (length,) = kind.sample_shape
    return kind.tokenizer.encode(texts, length)


def _rows(given: str, x: np.ndarray, prefix: bool, ids: list[str] | None = None) -> InputGroup:
    """The rows of ``x``, named by ``ids`` (a CSV's ``data.id`` column) or by their index."""
    row_names = ids if ids is not None else [str(i) for i in range(len(x))]
    names = [f"{given}:{name}" if prefix else name for name in row_names]
    return InputGroup(names, ArraySource(x, np.zeros(len(x), np.int32)))


def _npz(path: Path, kind: InputKind) -> np.ndarray:
    """The ``x`` array, checked against the model's sample shape and brought to its dtype (exactly, if integer)."""
    where = str(path)
    try:
        with np.load(path) as archive:
            if "x" not in archive:
                raise DataError(where, f"has no array 'x'; it has {sorted(archive.files)}")
            x = archive["x"]
    except (OSError, ValueError) as error:
        raise DataError(where, f"cannot read it as .npz: {error}") from None
    if x.ndim == 0 or len(x) == 0:
        raise DataError(where, "x holds no samples")
    if (*x.shape[1:], 1) == kind.sample_shape:  # grayscale images stored without their channel axis
        x = x[..., np.newaxis]
    if tuple(x.shape[1:]) != kind.sample_shape:
        raise DataError(where, f"x holds samples of shape {tuple(x.shape[1:])}; the model takes {kind.sample_shape}")
    if not np.issubdtype(x.dtype, np.number):
        raise DataError(where, f"x is {x.dtype.name}, not numbers")
    converted = x.astype(kind.dtype)
    if np.issubdtype(kind.dtype, np.integer) and not np.array_equal(converted, x):
        raise DataError(
            where,
            f"x is {x.dtype.name} with values that {kind.dtype.name} cannot hold; give the samples as the run's "
            f"source stores them ({kind.dtype.name})",
        )
    return converted
