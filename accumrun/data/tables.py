"""The tables: ``data.name: csv``, a table with a header row, and ``jsonl``, JSON Lines, one object per line.

A CSV's numeric columns but the labels, ``data.id`` and ``data.weight`` are its features, as float32 in memory. With
``data.text`` (a column, or a JSON key) each sample is that text as token ids, streamed from the file by default
(``data.cache: none``, :mod:`accumrun.data.rows`) or tokenized at load (``memory``). Errors name the file and line.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator, model_validator

from accumrun.data.json_lines import json_objects, read_records, record_text
from accumrun.data.rows import TextColumn, TextRows, csv_records
from accumrun.data.section import (
    DEFAULT_SEQUENCE_LENGTH,
    FileSourceConfig,
    SampleWeights,
    TextTable,
    none_or_memory,
    refuse_image_keys,
)
from accumrun.data.source import ArraySource
from accumrun.data.splits import Splits, checked_weights
from accumrun.data.text import TextSourceConfig
from accumrun.data.tokenizers import TokenizerConfig, text_input, tokenizer_for
from accumrun.data.tokenizers.byte import ByteTokenizerConfig
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
    """The label column, or several: 0/1 columns are a multi-label task's labels, other numbers regression targets."""
    id: str | None = None
    """A column that names each row (not a feature); ``predict`` on a CSV writes it as the ``input`` column."""
    text: str | None = Field(None, min_length=1)
    """A text column: set, each sample is its cell's ``sequence_length`` tokens, and no column is a feature."""
    tokenizer: TokenizerConfig | None = None
    """With ``text``: how its cells become token ids (default ``{name: byte}``)."""
    sequence_length: int | None = Field(None, ge=1)
    """With ``text``: tokens per sample (default 256), cut or padded with id 0."""
    bucket: int | None = Field(None, ge=1)
    """With ``text``: bucketed padding (:attr:`TextSourceConfig.bucket`); it needs ``cache: memory``."""
    cache: Annotated[CacheMode, words(CacheMode), none_or_memory("csv", "rows")] | None = None
    """With ``text``: ``none`` (the default) streams each row's text from the file; ``memory`` tokenizes at load."""

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

    def texts_of(self, path: Path) -> tuple[list[str], list[str] | None]:
        """The texts of a CSV laid out as this run's (its ``text`` column; the label not needed) and each row's
        ``id`` where the run has one and the file has that column: what ``predict`` reads from such a file."""
        assert self.text is not None  # a table of numbers is read by its features
        header, lines, columns, _ = _read_rows(path, str(path))  # read once for both columns
        texts = _text_cells(path, header, columns, lines, self.text)
        return texts, columns.get(self.id) if self.id is not None else None

    @property
    def label_columns(self) -> list[str]:
        """``label`` as a list of columns."""
        return [self.label] if isinstance(self.label, str) else list(self.label)

    @property
    def named_columns(self) -> tuple[str | None, ...]:
        return (*self.label_columns, self.id)

    @property
    def text_table(self) -> TextTable | None:
        return self if self.text is not None else None

    def header_features(self) -> list[str] | None:
        if self.text is not None:
            return None
        return read_table(Path(self.path), "data.path", self.label_columns, id_column=self.id).features


class JsonlConfig(TextSourceConfig):
    """``name: jsonl``: one JSON object per line, its ``text`` key tokenized and its ``label`` key the target."""

    needs = {"path": "the path of a .jsonl file", "label": "the key of each object's label"}
    name: Literal["jsonl"]
    text: str = Field("text", min_length=1)
    """The key of each object's text."""
    label: str = Field(min_length=1)
    """The key of each object's label: class names (numbered in sorted order), class indices or numbers."""
    id: str | None = Field(None, min_length=1)
    """A key that names each object; ``predict`` on a JSON Lines file writes it as the ``input`` column."""
    cache: Annotated[CacheMode, words(CacheMode), none_or_memory("jsonl", "lines")] = CacheMode.NONE
    """``none`` streams each line's text from the file; ``memory`` tokenizes at load (``bucket`` needs it)."""

    def texts_of(self, path: Path) -> tuple[list[str], list[str] | None]:
        """The texts of a JSON Lines file laid out as this run's (its ``text`` key; the label not needed) and each
        object's ``id`` where the run has one and every object that key: what ``predict`` reads from such a file."""
        objects = list(json_objects(path, str(path)))
        texts = [record_text(record, self.text, where) for where, record, _ in objects]
        if self.id is None or any(self.id not in record for _, record, _ in objects):
            return texts, None
        return texts, [str(record[self.id]) for _, record, _ in objects]

    @property
    def text_table(self) -> TextTable | None:
        return self


def load_csv(config: CsvConfig, seed: int) -> Splits:
    """The table at ``data.path`` (and ``data.validation_path``, with its columns); DataErrors name bad files."""
    settings = text_input(config)
    text = None
    if config.text is not None and settings is not None:
        text = TextColumn(config.text, *settings, stream=config.cache is CacheMode.NONE)

    def read(path: str, key: str, features: list[str] | None = None) -> Table:
        return read_table(Path(path), key, config.label_columns, features, config.id, config.weight, text)

    train = read(config.path, "data.path")
    test = read(config.validation_path, "data.validation_path", train.features) if config.validation_path else None
    keys = {"features": train.features} if text is None else {"vocabulary_size": text.tokenizer.vocabulary_size}
    return labelled_splits(train, test, **keys)


def load_jsonl(config: JsonlConfig, seed: int) -> Splits:
    """The objects of ``data.path`` (and ``data.validation_path``), as :func:`read_records` reads them."""
    tokenizer = tokenizer_for(config.tokenizer)
    text = TextColumn(config.text, tokenizer, config.sequence_length, stream=config.cache is CacheMode.NONE)

    def read(path: Path, key: str) -> Table:
        texts, labels, spans = read_records(path, key, config.text, config.label, keep_texts=not text.stream)
        return Table.labelled(path, [], text.samples(path, spans, texts, config.text), {config.label: labels})

    train = read(Path(config.path), "data.path")
    test = read(Path(config.validation_path), "data.validation_path") if config.validation_path else None
    return labelled_splits(train, test, vocabulary_size=tokenizer.vocabulary_size)


def labelled_splits(train: Table, test: Table | None, **keys: Any) -> Splits:
    """The splits of a training and a validation table, text labels numbered by the training table's classes;
    ``keys`` are the other fields of :class:`Splits`. Validation labels of another kind, or of a class the training
    table lacks, are a DataError."""
    names = train.class_names
    if test is not None and (names is None) != (test.class_names is None):
        test_kind, train_kind = ("text", "numeric") if names is None else ("numeric", "text")
        raise DataError("data.validation_path", f"has {test_kind} labels where data.path has {train_kind} ones")
    if names is not None and test is not None and test.class_names is not None and train.label_cells:
        unknown = sorted(set(test.class_names) - set(names))
        if unknown:
            raise DataError("data.validation_path", f"has labels that data.path does not: {unknown}")
        test.class_names, test.y = names, _numbered(test.label_cells, names)
    return Splits(train.split, test.split if test else None, class_names=names, **keys)


@dataclass
class Table:
    """One table read: its feature columns, samples (features, token ids or records to stream), targets and
    weights, and the class names of text labels (or the label columns' names, for several 0/1 columns)."""

    features: list[str]
    x: np.ndarray | TextRows
    y: np.ndarray
    class_names: list[str] | None = None
    label_cells: list[str] = field(default_factory=list)
    """A text label column's cells, to number again by another file's classes."""
    w: np.ndarray | None = None

    @classmethod
    def labelled(
        cls, path: Path, features: list[str], x: np.ndarray | TextRows, columns: dict[str, list[str]]
    ) -> Table:
        """A table with its label ``columns``: one holds numbers, or class names numbered in sorted order; several
        must hold numbers (a DataError else), one output each: multi-label when all are 0 or 1."""
        if len(columns) == 1:
            (cells,) = columns.values()
            numeric = _numbers(cells)
            if numeric is not None:
                return cls(features, x, numeric)
            names = sorted(set(cells))
            return cls(features, x, _numbered(cells, names), names, cells)
        y = np.empty((len(next(iter(columns.values()))), len(columns)), dtype=np.float64)
        for j, (name, cells) in enumerate(columns.items()):
            numbers = _numbers(cells)
            if numbers is None:
                raise DataError("data.label", f"{path}, column '{name}': several label columns must hold numbers")
            y[:, j] = numbers
        if np.isin(y, (0.0, 1.0)).all():
            return cls(features, x, y.astype(np.int32), list(columns))
        return cls(features, x, y)

    @property
    def split(self) -> ArraySource | TextRows:
        if not isinstance(self.x, np.ndarray):
            return replace(self.x, y=self.y, w=self.w)
        return ArraySource(self.x, self.y, self.w)


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
    header, lines, columns, spans = _read_rows(path, key, drop=text.column if text is not None and streamed else None)
    unknown = [name for name in labels if name not in header]
    if unknown:
        shown = unknown[0] if len(unknown) == 1 else unknown
        raise DataError("data.label", f"{path} has no column {shown!r}; its columns are {header}", shown)
    for column, config_key in ((id_column, "data.id"), (weight_column, "data.weight")):
        if column is not None and column not in header:
            raise DataError(config_key, f"{path} has no column {column!r}; its columns are {header}", column)
    x: np.ndarray | TextRows
    if text is not None:
        features = []
        texts = _text_cells(path, header, columns, lines, text.column)
        x = text.samples(path, spans, texts, _last_index(header, text.column))
    else:
        if features is None:  # the columns with a number in them, but the labels, the id and weight columns
            others = [*labels, id_column, weight_column]
            features = [name for name in header if name not in others and any(map(_is_number, columns[name]))]
            if not features:
                named = ", ".join(repr(name) for name in others if name is not None)
                raise DataError(key, f"{path} has no numeric feature column besides {named}")
        missing = [name for name in features if name not in columns]
        if missing:
            raise DataError(key, f"{path} lacks the feature columns {missing} that data.path has")
        x = _numeric(path, key, columns, features, lines)
    table = Table.labelled(path, features, x, {name: columns[name] for name in labels})
    if weight_column is not None:
        cells = _numeric(path, "data.weight", columns, [weight_column], lines)[:, 0]
        table.w = checked_weights(cells, f"{path}, column {weight_column!r}", len(cells))
    return table


def _text_cells(
    path: Path, header: list[str], columns: dict[str, list[str]], lines: list[int], column: str
) -> list[str]:
    """The cells of text column ``column``, each a sample's text; a missing column or an empty cell is a DataError."""
    if column not in header:
        raise DataError("data.text", f"{path} has no column {column!r}; its columns are {header}", column)
    for cell, line in zip(columns[column], lines, strict=True):
        if not cell:
            raise DataError("data.text", f"{path}, line {line}: the text in column {column!r} is empty")
    return columns[column]


def read_texts(path: Path, key: str, column: str) -> list[str]:
    """The texts of the CSV's text column ``column``, in row order, checked as :func:`load_csv` checks them."""
    header, lines, columns, _ = _read_rows(path, key)
    return _text_cells(path, header, columns, lines, column)


def read_column(path: Path, name: str) -> list[str] | None:
    """The cells of column ``name`` of the CSV at ``path``, or None when it has no such column."""
    _, _, columns, _ = _read_rows(path, str(path))
    return columns.get(name)


def read_features(path: Path, features: list[str]) -> np.ndarray:
    """The ``features`` columns of the CSV at ``path``, in order, as float32 rows (predict's inputs), checked."""
    header, lines, columns, _ = _read_rows(path, str(path))
    missing = [name for name in features if name not in columns]
    if missing:
        raise DataError(str(path), f"lacks the feature columns {missing} that the run trained on; it has {header}")
    return _numeric(path, str(path), columns, features, lines)


def _last_index(names: list[str], name: str) -> int:
    """Where the last ``name`` is in ``names``: the column that a repeated name's cells come from."""
    return len(names) - 1 - names[::-1].index(name)


def _read_rows(
    path: Path, key: str, drop: str | None = None
) -> tuple[list[str], list[int], dict[str, list[str]], np.ndarray]:
    """A CSV with at least one row: its header, each row's line number (its record's, the header's being 1), each
    column's cells (the last column of a name, where names repeat; of column ``drop``, a streamed text, only whether
    each is empty) and each row's bytes ``[start, end)`` in the file."""
    if not path.is_file():
        raise DataError(key, "CSV file not found", str(path))
    numbered: list[tuple[int, list[str]]] = []
    spans: list[tuple[int, int]] = []
    dropped: int | None = None
    try:
        # utf-8-sig: a spreadsheet's byte-order mark would otherwise become part of the first column's name.
        with path.open(newline="", encoding="utf-8-sig") as file:
            for number, (start, end, row) in enumerate(csv_records(file, path), start=1):
                if not any(row):  # blank lines (a trailing one, say) are no rows; the others keep their numbers
                    continue
                if not numbered:
                    names = [name.strip() for name in row]
                    dropped = _last_index(names, drop) if drop in names else None
                elif dropped is not None and dropped < len(row):
                    row[dropped] = "\x00" if row[dropped].strip() else ""  # only whether it is empty is kept
                numbered.append((number, row))
                spans.append((start, end))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataError(key, f"cannot read {path} as CSV: {error}") from None
    if not numbered:
        raise DataError(key, f"{path} is empty; it needs a header row and one row per sample")
    header = [name.strip() for name in numbered[0][1]]
    if len(numbered) == 1:
        raise DataError(key, f"{path} has a header but no rows")
    for number, row in numbered[1:]:
        if len(row) != len(header):
            raise DataError(key, f"{path}, row {number}: {len(row)} cells for {len(header)} columns")
    columns = {name: [row[i].strip() for _, row in numbered[1:]] for i, name in enumerate(header)}
    return header, [number for number, _ in numbered[1:]], columns, np.array(spans[1:], np.int64).reshape(-1, 2)


def _numeric(path: Path, key: str, columns: dict[str, list[str]], features: list[str], lines: list[int]) -> np.ndarray:
    """The ``features`` columns as float64 rows (the dataset holds them as the run's precision asks); a cell that is
    not a finite number is an error naming it."""
    x = np.empty((len(lines), len(features)), dtype=np.float64)
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
