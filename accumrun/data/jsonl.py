"""``data.name: jsonl``: JSON Lines, one object per line, its ``data.text`` key the text and its ``data.label`` key
the label, read as a CSV's label column is. Blank lines are skipped; any other line must be an object with both keys
and a non-empty text, or the error names the file and the line. ``data.cache: none`` (the default) streams the
texts from the file, as a CSV's text column does (:mod:`accumrun.data.rows`); ``memory`` tokenizes them at load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator

from accumrun.data.rows import TextColumn, json_lines
from accumrun.data.section import none_or_memory
from accumrun.data.splits import Splits
from accumrun.data.tables import Table, labelled_splits
from accumrun.data.text import TextSourceConfig
from accumrun.data.tokenizers import tokenizer_for
from accumrun.errors import DataError
from accumrun.kinds import CacheMode
from accumrun.sections import words


class JsonlConfig(TextSourceConfig):
    """``name: jsonl``: one JSON object per line, its ``text`` key tokenized and its ``label`` key the target."""

    needs = {"path": "the path of a .jsonl file", "label": "the key of each object's label"}
    name: Literal["jsonl"]
    text: str = Field("text", min_length=1)
    """The key of each object's text."""
    label: str = Field(min_length=1)
    """The key of each object's label: class names (numbered in sorted order), class indices or numbers."""
    cache: Annotated[CacheMode, words(CacheMode)] = CacheMode.NONE
    """``none`` streams each line's text from the file as the epoch reaches it; ``memory`` tokenizes every text at
    load (``bucket`` needs it)."""

    @field_validator("cache")
    @classmethod
    def _cache_none_or_memory(cls, value: CacheMode) -> CacheMode:
        return none_or_memory(value, "jsonl", "lines")


def load_jsonl(config: JsonlConfig, seed: int) -> Splits:
    """The objects of ``data.path`` (and ``data.validation_path``), tokenized or to stream.

    Raises:
        DataError: a file is missing, empty or not JSON Lines, or a line lacks a key or has a bad value.
    """
    tokenizer = tokenizer_for(config.tokenizer)
    text = TextColumn(config.text, tokenizer, config.sequence_length, stream=config.cache is CacheMode.NONE)
    train = _read(Path(config.path), "data.path", config, text)
    test = None
    if config.validation_path:
        test = _read(Path(config.validation_path), "data.validation_path", config, text)
    return labelled_splits(train, test, vocabulary_size=tokenizer.vocabulary_size)


def _read(path: Path, key: str, config: JsonlConfig, text: TextColumn) -> Table:
    texts, labels, spans = _scan(path, key, config, keep_texts=not text.stream)
    return Table.of_column([], text.samples(path, spans, texts, config.text), labels)


def read_records(path: Path, key: str, config: JsonlConfig) -> tuple[list[str], list[str]]:
    """Each object's text and its label (as a CSV cell would hold it), in the file's order.

    Raises:
        DataError: the file is missing, empty or not JSON Lines, or a line lacks a key or has a bad value.
    """
    texts, labels, _ = _scan(path, key, config, keep_texts=True)
    return texts, labels


def _scan(path: Path, key: str, config: JsonlConfig, keep_texts: bool) -> tuple[list[str], list[str], np.ndarray]:
    """Each object's text (with ``keep_texts``; else checked and let go), label and byte span, in order."""
    if not path.is_file():
        raise DataError(key, "JSON Lines file not found", str(path))
    texts: list[str] = []
    labels: list[str] = []
    spans: list[tuple[int, int]] = []
    try:
        with path.open("rb") as file:
            for number, start, end, raw in json_lines(file):
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                record = _object(path, key, number, line)
                text = _text(path, number, record, config.text)
                if keep_texts:
                    texts.append(text)
                labels.append(_label(path, number, record, config.label))
                spans.append((start, end))
    except OSError as error:
        raise DataError(key, f"cannot read {path} as UTF-8 text: {error}") from None
    except UnicodeDecodeError as error:
        raise DataError(key, f"cannot read {path} as UTF-8 text: line {number}: {error}") from None
    if not labels:
        raise DataError(key, f"{path} is empty; it needs one JSON object per line")
    return texts, labels, np.array(spans, np.int64).reshape(-1, 2)


def _object(path: Path, key: str, number: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(key, f"{path}, line {number}: not JSON ({error.msg}, column {error.colno})") from None
    if not isinstance(record, dict):
        raise DataError(key, f"{path}, line {number}: a JSON {type(record).__name__}, not an object")
    return record


def _text(path: Path, number: int, record: dict[str, Any], name: str) -> str:
    if name not in record:
        raise DataError("data.text", f"{path}, line {number}: no key {name!r}; it has {sorted(record)}")
    text = record[name]
    if not isinstance(text, str):
        raise DataError("data.text", f"{path}, line {number}: {name!r} is not a string", _shown(text))
    if not text:
        raise DataError("data.text", f"{path}, line {number}: {name!r} is empty")
    return text


def _label(path: Path, number: int, record: dict[str, Any], name: str) -> str:
    """The label as a CSV cell would hold it, for :meth:`Table.of_column` to read the same way."""
    if name not in record:
        raise DataError("data.label", f"{path}, line {number}: no key {name!r}; it has {sorted(record)}")
    label = record[name]
    if isinstance(label, bool):  # a bool is an int to Python; as a label it is class 0 or 1
        return str(int(label))
    if not isinstance(label, str | int | float):
        what = f"{path}, line {number}: {name!r} must be a class name or a number"
        raise DataError("data.label", what, _shown(label))
    return str(label)


def _shown(value: Any) -> Any:
    """A bad value for the message: itself, or the start of its JSON when that is long (a large object)."""
    text = json.dumps(value, ensure_ascii=False)
    return value if len(text) <= 40 else text[:37] + "..."
