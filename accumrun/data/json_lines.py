"""Reading ``data.name: jsonl``'s file: JSON Lines, one object per line, each with its text, its label and its
line's byte span; a DataError names the file and line of anything wrong."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from accumrun.errors import DataError


def read_records(
    path: Path, key: str, text_key: str, label_key: str, keep_texts: bool = True
) -> tuple[list[str], list[str], np.ndarray]:
    """Each object's text under ``text_key`` (with ``keep_texts``; else checked and let go), its label under
    ``label_key`` (as a CSV cell would hold it) and its line's byte span, in order; a DataError names a file that is
    missing, empty or not JSON Lines, or the line that lacks a key or has a bad value."""
    texts: list[str] = []
    labels: list[str] = []
    spans: list[tuple[int, int]] = []
    for where, record, span in json_objects(path, key):
        text = record_text(record, text_key, where)
        if keep_texts:
            texts.append(text)
        labels.append(_label(record, label_key, where))
        spans.append(span)
    return texts, labels, np.array(spans, np.int64).reshape(-1, 2)


def json_objects(path: Path, key: str) -> Iterator[tuple[str, dict[str, Any], tuple[int, int]]]:
    """Each JSON object of the file at ``path``, with where it is (``PATH, line N``) and its line's byte span; a
    DataError names a file that is missing, empty or not JSON Lines, or the line that is not an object."""
    if not path.is_file():
        raise DataError(key, "JSON Lines file not found", str(path))
    found = False
    try:
        with path.open("rb") as file:
            end = 0
            for number, raw in enumerate(file, start=1):
                start, end = end, end + len(raw)
                if number == 1 and raw.startswith(codecs.BOM_UTF8):  # a byte-order mark is in no span
                    raw, start = raw[len(codecs.BOM_UTF8) :], len(codecs.BOM_UTF8)
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                where = f"{path}, line {number}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataError(key, f"{where}: not JSON ({error.msg}, column {error.colno})") from None
                if not isinstance(record, dict):
                    raise DataError(key, f"{where}: a JSON {type(record).__name__}, not an object")
                found = True
                yield where, record, (start, end)
    except OSError as error:
        raise DataError(key, f"cannot read {path} as UTF-8 text: {error}") from None
    except UnicodeDecodeError as error:
        raise DataError(key, f"cannot read {path} as UTF-8 text: line {number}: {error}") from None
    if not found:
        raise DataError(key, f"{path} is empty; it needs one JSON object per line")


def record_text(record: dict[str, Any], name: str, where: str) -> str:
    """The object's text under key ``name``: a string that is not empty."""
    text = _value(record, name, "data.text", where)
    if not isinstance(text, str):
        raise DataError("data.text", f"{where}: {name!r} is not a string", _shown(text))
    if not text:
        raise DataError("data.text", f"{where}: {name!r} is empty")
    return text


def _label(record: dict[str, Any], name: str, where: str) -> str:
    """The object's label under key ``name``, as a CSV cell would hold it (for :meth:`Table.labelled` to read
    alike)."""
    label = _value(record, name, "data.label", where)
    if isinstance(label, bool):  # a bool is an int to Python; as a label it is class 0 or 1
        label = int(label)
    if not isinstance(label, str | int | float):
        raise DataError("data.label", f"{where}: {name!r} must be a class name or a number", _shown(label))
    return str(label)


def _value(record: dict[str, Any], name: str, key: str, where: str) -> Any:
    if name not in record:
        raise DataError(key, f"{where}: no key {name!r}; it has {sorted(record)}")
    return record[name]


def _shown(value: Any) -> Any:
    """A bad value for the message: itself, or the start of its JSON when that is long (a large object)."""
    text = json.dumps(value, ensure_ascii=False)
    return value if len(text) <= 40 else text[:37] + "..."
