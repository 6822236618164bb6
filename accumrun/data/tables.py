"""``data.name: csv``: a table with a header row; ``data.label`` names the target column, or several.

With ``data.text``, each sample is that column's text as token ids (see :mod:`accumrun.data.text`), and no column
is a feature. Else the other columns are the features, as float32, held in memory. A column with no number in it
(a name) and the ``data.id`` and ``data.weight`` columns are not features and are left out (the weight column holds
each row's weight, a finite number >= 0); a column of numbers with a cell that is not one is an error that names
the file, the row and the column. One label column may hold numbers (class indices or regression
values) or class names, which are then numbered in sorted order. Several label columns hold numbers: all 0 or 1,
they are a multi-label task's labels, named by their columns; else the targets of a regression.

A text column streams by default (``data.cache: none``), as a text folder does: startup reads and checks every row
(the same checks and errors as in memory), keeps the labels, weights and each row's byte span in the file, but no
text, and each text is read back from the file and tokenized as the epoch's order reaches it (a
:class:`~accumrun.data.rows.TextRows`; see :mod:`accumrun.data.rows`). ``data.cache: memory`` tokenizes every
text at load instead and trains from the token ids in memory (which ``data.bucket`` needs).
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
from pydantic import Field, ValidationInfo, field_validator, model_validator

from accumrun.data.rows import CsvRecords, TextRows
from accumrun.data.section import (
    DEFAULT_SEQUENCE_LENGTH,
    FileSourceConfig,
    SampleWeights,
    none_or_memory,
    refuse_image_keys,
)
from accumrun.data.splits import ArraySplit, Splits, checked_weights
from accumrun.data.text import TextColumn, checked_cells
from accumrun.data.tokenizer_sections import ByteTokenizerConfig, TokenizerConfig
from accumrun.data.tokenizers import Tokenizer, text_input
from accumrun.errors import DataError
from accumrun.kinds import CacheMode
from accumrun.sections import words


class CsvConfig(SampleWeights, FileSourceConfig):
    """``name: csv``: a table with a header row; the other numeric columns are the features."""

    needs = {"path": "the path of a .csv file", "label": "the name of the label column"}
    name: Literal["csv"]
    label: (
        Annotated[str, Field(min_length=1)] | Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    )
    """The label column, or several: 0/1 columns are the labels of a multi-label task (named by their columns),
    other numbers the targets of a regression."""
    id: str | None = None
    """A column that names each row (not a feature); ``predict`` on a CSV writes it as the ``input`` column."""
    text: str | None = Field(None, min_length=1)
    """A text column: set, each sample is its cell's ``sequence_length`` tokens, and no column is a feature."""
    tokenizer: TokenizerConfig | None = None
    """With ``text``: how its cells become token ids (default ``{name: byte}``)."""
    sequence_length: int | None = Field(None, ge=1)
    """With ``text``: tokens per sample (default 256), cut or padded with id 0."""
    bucket: int | None = Field(None, ge=1)
    """With ``text``: bucketed padding, as for the text sources (:attr:`TextSourceConfig.bucket`); it needs
    ``cache: memory``."""
    cache: Annotated[CacheMode, words(CacheMode)] | None = None
    """With ``text`` (default ``none``): ``none`` streams, each row's text read back from the file and tokenized
    as the epoch's order reaches it; ``memory`` tokenizes every text at load and trains from the token ids in
    memory. A table of numbers is always held in memory and takes no ``cache``."""

    @field_validator("cache")
    @classmethod
    def _cache_none_or_memory(cls, value: CacheMode | None) -> CacheMode | None:
        return none_or_memory(value, "csv", "rows")

    @field_validator("bucket")
    @classmethod
    def _bucket_needs_text(cls, value: int | None, info: ValidationInfo) -> int | None:
        # ``text`` is validated before ``bucket`` (declared first); when it failed, its own error says so.
        if value is not None and "text" in info.data and info.data["text"] is None:
            raise ValueError("pads token ids: it applies to a text column; set data.text too")
        return value

    @model_validator(mode="after")
    def _text_keys(self) -> CsvConfig:
        if self.text is None:
            if self.tokenizer is not None or self.sequence_length is not None:
                raise ValueError("tokenizer and sequence_length apply to a text column: set data.text too")
            if self.cache is not None:
                raise ValueError(
                    "cache applies to a text column (a table of numbers is held in memory): set data.text too"
                )
            return self
        refuse_image_keys(self)
        # Filled in here, not as field defaults, so a table of numbers records no tokenizer in its config.yaml.
        self.tokenizer = self.tokenizer or ByteTokenizerConfig(name="byte")
        self.sequence_length = self.sequence_length or DEFAULT_SEQUENCE_LENGTH
        self.cache = self.cache or CacheMode.NONE
        return self

    @property
    def label_columns(self) -> list[str]:
        """``label`` as a list of columns."""
        return [self.label] if isinstance(self.label, str) else list(self.label)

    @property
    def text_settings(self) -> tuple[TokenizerConfig, int] | None:
        if self.text is None:
            return None
        assert self.tokenizer is not None and self.sequence_length is not None  # filled in with data.text
        return self.tokenizer, self.sequence_length

    @property
    def token_bucket(self) -> int | None:
        return self.bucket

    @property
    def id_column(self) -> str | None:
        return self.id

    @property
    def named_columns(self) -> tuple[str | None, ...]:
        return (*self.label_columns, self.id)


def load_csv(config: CsvConfig, seed: int) -> Splits:
    """The table at ``data.path`` (and ``data.validation_path``, with the same columns); with ``data.text``, each
    sample is that column's cell as token ids.

    Raises:
        DataError: a file is missing or empty, lacks a label, id, weight or text column, has a non-numeric
            feature cell or an empty text cell.
    """
    text = _text_column(config)
    labels, id_column, weight = config.label_columns, config.id, config.weight
    train = read_table(Path(config.path), "data.path", labels, id_column=id_column, weight_column=weight, text=text)
    test = None
    if config.validation_path:
        path = Path(config.validation_path)
        test = read_table(path, "data.validation_path", labels, train.features, id_column, weight, text)
    if text is not None:
        return labelled_splits(train, test, vocabulary_size=text.tokenizer.vocabulary_size)
    return labelled_splits(train, test, features=train.features)


def _text_column(config: CsvConfig) -> TextColumn | None:
    """The CSV's text column, or None for a table of numbers."""
    text = text_input(config)
    if config.text is None or text is None:
        return None
    return TextColumn(config.text, *text, stream=config.cache is CacheMode.NONE)


def labelled_splits(train: Table, test: Table | None, **keys: Any) -> Splits:
    """The splits of a training table and a validation table with the same kind of labels, text labels numbered
    by the training table's classes; ``keys`` are the other fields of :class:`Splits`.

    Raises:
        DataError: the validation table's labels are of another kind, or name a class the training table lacks.
    """
    names = train.class_names
    if test is not None and (names is None) != (test.class_names is None):
        raise DataError("data.validation_path", f"has {_kind(test)} labels where data.path has {_kind(train)} ones")
    if names is not None and test is not None and test.class_names is not None and train.text_labels:
        unknown = sorted(set(test.class_names) - set(names))
        if unknown:
            raise DataError("data.validation_path", f"has labels that data.path does not: {unknown}")
        test = test.renumbered(names)
    return Splits(train.split, test.split if test else None, class_names=names, **keys)


class Table:
    """One CSV file read: its feature columns, features (or token ids, or the text records to stream) and targets,
    and the class names when the labels are text (or the label columns' names, for several 0/1 columns)."""

    def __init__(
        self,
        features: list[str],
        x: np.ndarray | TextRows,
        y: np.ndarray,
        class_names: list[str] | None,
        texts: list[str],
    ) -> None:
        self.features = features
        self.x = x
        self.y = y
        self.class_names = class_names
        self._texts = texts  # a text label column's cells, to number again by another file's classes
        self.w: np.ndarray | None = None
        """The rows' weights (``data.weight``), or None."""

    @classmethod
    def of_column(cls, features: list[str], x: np.ndarray | TextRows, cells: list[str]) -> Table:
        """A table with one label column: numbers as they are, or class names numbered in sorted order."""
        numeric = _numbers(cells)
        if numeric is not None:
            return cls(features, x, numeric, None, [])
        names = sorted(set(cells))
        return cls(features, x, _numbered(cells, names), names, cells)

    @classmethod
    def of_columns(
        cls, path: Path, features: list[str], x: np.ndarray | TextRows, columns: dict[str, list[str]]
    ) -> Table:
        """A table with several label columns, one output each: multi-label when all are 0 or 1.

        Raises:
            DataError: a label cell that is not a number.
        """
        y = np.empty((len(next(iter(columns.values()))), len(columns)), dtype=np.float32)
        for j, (name, cells) in enumerate(columns.items()):
            numbers = _numbers(cells)
            if numbers is None:
                raise DataError("data.label", f"{path}, column '{name}': several label columns must hold numbers")
            y[:, j] = numbers
        if np.isin(y, (0.0, 1.0)).all():
            return cls(features, x, y.astype(np.int32), list(columns), [])
        return cls(features, x, y, None, [])

    @property
    def text_labels(self) -> bool:
        """Whether the labels were class names in one column (numbered by :meth:`of_column`)."""
        return bool(self._texts)

    def renumbered(self, names: list[str]) -> Table:
        """The same table with its text labels numbered as in ``names`` (the training file's classes)."""
        self.class_names = names
        self.y = _numbered(self._texts, names)
        return self

    @property
    def split(self) -> ArraySplit | TextRows:
        if not isinstance(self.x, np.ndarray):
            return replace(self.x, y=self.y, w=self.w)
        return ArraySplit(self.x, self.y, self.w)


def streamed_rows(path: Path, spans: np.ndarray, tokenizer: Tokenizer, length: int, text: str | int) -> TextRows:
    """The records at ``spans`` of ``path``, to stream; their labels are the :class:`Table`'s (set by
    :attr:`Table.split`)."""
    return TextRows(str(path), spans, np.zeros(len(spans), np.int32), tokenizer, length, text)


def _numbered(cells: list[str], names: list[str]) -> np.ndarray:
    index = {name: i for i, name in enumerate(names)}
    return np.array([index[cell] for cell in cells], dtype=np.int32)


def read_table(
    path: Path,
    key: str,
    labels: list[str],
    features: list[str] | None = None,
    id_column: str | None = None,
    weight_column: str | None = None,
    text: TextColumn | None = None,
) -> Table:
    """Read ``path`` with its ``labels`` columns (and ``id_column`` and ``weight_column``, which are no features);
    with ``features``, the file must have those feature columns (a validation file); with ``text``, the samples
    are that column's tokens (or its records, to stream) and no column is a feature."""
    # A streamed text is read again when it is trained on: only whether each cell is empty is kept (unless the
    # column is also read as something else).
    streamed = text is not None and text.stream and text.column not in (*labels, id_column, weight_column)
    rows = _read_rows(path, key, drop=text.column if text is not None and streamed else None)
    header, lines, columns = rows.header, rows.lines, rows.columns
    unknown = [name for name in labels if name not in header]
    if unknown:
        shown = unknown[0] if len(unknown) == 1 else unknown
        raise DataError("data.label", f"{path} has no column {shown!r}; its columns are {header}", shown)
    text_column = text.column if text is not None else None
    for column, config_key in ((id_column, "data.id"), (weight_column, "data.weight"), (text_column, "data.text")):
        if column is not None and column not in header:
            raise DataError(config_key, f"{path} has no column {column!r}; its columns are {header}", column)
    x: np.ndarray | TextRows
    if text is not None:
        features = []
        if text.stream:
            checked_cells(path, text.column, columns[text.column], lines)
            x = streamed_rows(path, rows.spans, text.tokenizer, text.length, rows.column_index(text.column))
        else:
            x = text.tokens(path, columns[text.column], lines)
    else:
        if features is None:
            features = _feature_columns(path, key, header, columns, [*labels, id_column, weight_column])
        missing = [name for name in features if name not in columns]
        if missing:
            raise DataError(key, f"{path} lacks the feature columns {missing} that data.path has")
        x = _numeric(path, key, columns, features, lines)
    if len(labels) == 1:
        table = Table.of_column(features, x, columns[labels[0]])
    else:
        table = Table.of_columns(path, features, x, {name: columns[name] for name in labels})
    if weight_column is not None:
        cells = _numeric(path, "data.weight", columns, [weight_column], lines)[:, 0]
        table.w = checked_weights(cells, f"{path}, column {weight_column!r}", len(cells))
    return table


def _feature_columns(
    path: Path, key: str, header: list[str], columns: dict[str, list[str]], others: list[str | None]
) -> list[str]:
    """The columns with a number in them, but ``others`` (the labels, the id and weight columns).

    Raises:
        DataError: there is none.
    """
    features = [name for name in header if name not in others and any(_is_number(cell) for cell in columns[name])]
    if not features:
        labels = [name for name in others if name is not None]
        raise DataError(key, f"{path} has no numeric feature column besides {', '.join(map(repr, labels))}")
    return features


def read_texts(path: Path, key: str, column: str) -> list[str]:
    """The texts of the CSV's text column ``column`` (``data.text``), in row order.

    Raises:
        DataError: the file is missing or malformed, lacks the column, or has an empty text cell.
    """
    header, lines, columns = _read_columns(path, key)
    if column not in header:
        raise DataError("data.text", f"{path} has no column {column!r}; its columns are {header}", column)
    return list(checked_cells(path, column, columns[column], lines))


def read_column(path: Path, name: str) -> list[str] | None:
    """The cells of column ``name`` of the CSV at ``path``, or None when it has no such column."""
    _, _, columns = _read_columns(path, str(path))
    return columns.get(name)


def read_features(path: Path, features: list[str]) -> np.ndarray:
    """The ``features`` columns of the CSV at ``path``, in that order, as float32 rows (inputs to predict on).

    Raises:
        DataError: the file is missing or malformed, lacks a feature column, or has a cell that is not a number.
    """
    header, lines, columns = _read_columns(path, str(path))
    missing = [name for name in features if name not in columns]
    if missing:
        raise DataError(str(path), f"lacks the feature columns {missing} that the run trained on; it has {header}")
    return _numeric(path, str(path), columns, features, lines)


def _read_columns(path: Path, key: str) -> tuple[list[str], list[int], dict[str, list[str]]]:
    """The header, each row's line number, and each column's cells, of a CSV with at least one row."""
    rows = _read_rows(path, key)
    return rows.header, rows.lines, rows.columns


class _Rows(NamedTuple):
    header: list[str]
    lines: list[int]
    """Each row's line number (its record's, counting the header as 1), for messages."""
    columns: dict[str, list[str]]
    spans: np.ndarray
    """Each row's bytes ``[start, end)`` in the file, int64."""

    def column_index(self, name: str) -> int:
        """The index of the column that ``columns[name]`` holds (the last of that name)."""
        return len(self.header) - 1 - self.header[::-1].index(name)


_KEPT = "\x00"
"""What a dropped text cell that is not empty becomes (see :func:`_read_rows`)."""


def _read_rows(path: Path, key: str, drop: str | None = None) -> _Rows:
    """The rows of a CSV with at least one: the header, each row's line number and byte span, and each column's
    cells, but those of column ``drop`` (a streamed text), of which only whether each is empty is kept."""
    if not path.is_file():
        raise DataError(key, "CSV file not found", str(path))
    numbered: list[tuple[int, list[str]]] = []
    spans: list[tuple[int, int]] = []
    dropped: int | None = None
    try:
        # utf-8-sig: a spreadsheet's byte-order mark would otherwise become part of the first column's name.
        with path.open(newline="", encoding="utf-8-sig") as file:
            for number, (start, end, row) in enumerate(CsvRecords(file, path), start=1):
                if not any(row):  # blank lines (a trailing one, say) are no rows; the others keep their numbers
                    continue
                if not numbered:
                    names = [name.strip() for name in row]
                    dropped = len(names) - 1 - names[::-1].index(drop) if drop in names else None
                elif dropped is not None and dropped < len(row):
                    row[dropped] = _KEPT if row[dropped].strip() else ""
                numbered.append((number, row))
                spans.append((start, end))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataError(key, f"cannot read {path} as CSV: {error}") from None
    if not numbered:
        raise DataError(key, f"{path} is empty; it needs a header row and one row per sample")
    header = [name.strip() for name in numbered[0][1]]
    lines, body = [number for number, _ in numbered[1:]], [row for _, row in numbered[1:]]
    if not body:
        raise DataError(key, f"{path} has a header but no rows")
    for number, row in zip(lines, body, strict=True):
        if len(row) != len(header):
            raise DataError(key, f"{path}, row {number}: {len(row)} cells for {len(header)} columns")
    columns = {name: [row[i].strip() for row in body] for i, name in enumerate(header)}
    return _Rows(header, lines, columns, np.array(spans[1:], np.int64).reshape(-1, 2))


def _numeric(path: Path, key: str, columns: dict[str, list[str]], features: list[str], lines: list[int]) -> np.ndarray:
    """The ``features`` columns as float32 rows; a cell that is not a finite number is an error naming it."""
    x = np.empty((len(lines), len(features)), dtype=np.float32)
    for j, name in enumerate(features):
        for i, cell in enumerate(columns[name]):
            try:
                x[i, j] = float(cell)
            except ValueError:
                raise DataError(key, f"{path}, row {lines[i]}, column '{name}': not a number", cell) from None
    if not np.all(np.isfinite(x)):
        i, j = np.argwhere(~np.isfinite(x))[0]
        raise DataError(key, f"{path}, row {lines[i]}, column '{features[j]}': NaN or Inf", columns[features[j]][i])
    return x


def _kind(table: Table) -> str:
    return "numeric" if table.class_names is None else "text"


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _numbers(cells: list[str]) -> np.ndarray | None:
    """The labels as numbers (int64 when all are whole), or None when any is text."""
    try:
        values = np.array([float(cell) for cell in cells])
    except ValueError:
        return None
    return values.astype(np.int64) if np.all(values == np.round(values)) else values
