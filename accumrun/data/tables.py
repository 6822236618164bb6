"""``data.name: csv``: a table with a header row; ``data.label`` names the target column.

The other columns are the features, as float32, held in memory. A column with no number in it (an id, a name)
is not a feature and is left out; a column of numbers with a cell that is not one is an error that names the
file, the row and the column. The label column may hold numbers (class indices or regression values) or class
names, which are then numbered in sorted order.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from accumrun.config.schema import CsvConfig
from accumrun.data.splits import ArraySplit, Splits
from accumrun.errors import DataError


def load_csv(config: CsvConfig, seed: int) -> Splits:
    """The table at ``data.path`` (and ``data.validation_path``, with the same columns).

    Raises:
        DataError: a file is missing or empty, lacks the label column, or has a non-numeric feature cell.
    """
    train = read_table(Path(config.path), "data.path", config.label)
    test = None
    if config.validation_path:
        test = read_table(Path(config.validation_path), "data.validation_path", config.label, train.features)
    names = train.class_names
    if test is not None and (names is None) != (test.class_names is None):
        raise DataError("data.validation_path", f"has {_kind(test)} labels where data.path has {_kind(train)} ones")
    if names is not None and test is not None and test.class_names is not None:
        unknown = sorted(set(test.class_names) - set(names))
        if unknown:
            raise DataError("data.validation_path", f"has labels that data.path does not: {unknown}")
        test = test.renumbered(names)
    return Splits(train.split, test.split if test else None, class_names=names, features=train.features)


class Table:
    """One CSV file read: its feature columns, features and labels, and class names when labels are text."""

    def __init__(self, features: list[str], x: np.ndarray, labels: list[str]) -> None:
        self.features = features
        self.x = x
        self._labels = labels
        numeric = _numbers(labels)
        if numeric is not None:
            self.class_names: list[str] | None = None
            self.y = numeric
        else:
            self.class_names = sorted(set(labels))
            self.y = self._numbered(self.class_names)

    def renumbered(self, names: list[str]) -> Table:
        """The same table with its text labels numbered as in ``names`` (the training file's classes)."""
        self.class_names = names
        self.y = self._numbered(names)
        return self

    def _numbered(self, names: list[str]) -> np.ndarray:
        index = {name: i for i, name in enumerate(names)}
        return np.array([index[label] for label in self._labels], dtype=np.int32)

    @property
    def split(self) -> ArraySplit:
        return ArraySplit(self.x, self.y)


def read_table(path: Path, key: str, label: str, features: list[str] | None = None) -> Table:
    """Read ``path``; with ``features``, the file must have those feature columns (a validation file)."""
    header, lines, columns = _read_columns(path, key)
    if label not in header:
        raise DataError("data.label", f"{path} has no column '{label}'; its columns are {header}", label)
    if features is None:
        features = [name for name in header if name != label and any(_is_number(cell) for cell in columns[name])]
        if not features:
            raise DataError(key, f"{path} has no numeric feature column besides '{label}'")
    missing = [name for name in features if name not in columns]
    if missing:
        raise DataError(key, f"{path} lacks the feature columns {missing} that data.path has")
    return Table(features, _numeric(path, key, columns, features, lines), columns[label])


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
    if not path.is_file():
        raise DataError(key, "CSV file not found", str(path))
    try:
        # utf-8-sig: a spreadsheet's byte-order mark would otherwise become part of the first column's name.
        with path.open(newline="", encoding="utf-8-sig") as file:
            # Blank lines (a trailing one, say) are no rows; the others keep their line numbers for messages.
            numbered = [(number, row) for number, row in enumerate(csv.reader(file), start=1) if any(row)]
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
    return header, lines, {name: [row[i].strip() for row in body] for i, name in enumerate(header)}


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
