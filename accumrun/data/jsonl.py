"""``data.name: jsonl``: JSON Lines, one object per line, whose ``data.text`` key holds the text and whose
``data.label`` key holds the label.

Labels are read as a CSV's label column is: class names (numbered in sorted order), class indices, or other
numbers (regression targets). Lines end at ``"\n"``; blank lines are skipped; every other line must be an object
with both keys and a non-empty text, or the error names the file and the line.

``data.cache: none`` (the default) streams, as a text folder does: startup reads and checks every line, keeps each
record's label and byte span but not its text, and the texts are read back from the file and tokenized as the
epoch's order reaches them (a :class:`~accumrun.data.rows.TextRows`; see :mod:`accumrun.data.rows`). ``memory``
tokenizes every text at load and trains from the token ids in memory (which ``data.bucket`` needs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator

from accumrun.data.rows import json_lines
from accumrun.data.section import none_or_memory
from accumrun.data.splits import Splits
from accumrun.data.tables import Table, labelled_splits, streamed_rows
from accumrun.data.text import TextSourceConfig
from accumrun.data.tokenizers import Tokenizer, tokenizer_for
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
    """``none`` streams: each line's text is read back from the file and tokenized as the epoch's order reaches
    it. ``memory`` tokenizes every text once, at load, and trains from the token ids in memory (``bucket`` needs
    it)."""

    @field_validator("cache")
    @classmethod
    def _cache_none_or_memory(cls, value: CacheMode) -> CacheMode:
        return none_or_memory(value, "jsonl", "lines")


def load_jsonl(config: JsonlConfig, seed: int) -> Splits:
    """The objects of ``data.path`` (and ``data.validation_path``): their texts tokenized (``cache: memory``), or
    their byte spans, to stream (``cache: none``).

    Raises:
        DataError: a file is missing, empty or not JSON Lines, or a line lacks a key or has a bad value.
    """
    tokenizer = tokenizer_for(config.tokenizer)
    train = _read(Path(config.path), "data.path", config, tokenizer)
    test = None
    if config.validation_path:
        test = _read(Path(config.validation_path), "data.validation_path", config, tokenizer)
    return labelled_splits(train, test, vocabulary_size=tokenizer.vocabulary_size)


def _read(path: Path, key: str, config: JsonlConfig, tokenizer: Tokenizer) -> Table:
    stream = config.cache is CacheMode.NONE
    texts, labels, spans = _scan(path, key, config, keep_texts=not stream)
    if stream:
        return Table.of_column([], streamed_rows(path, spans, tokenizer, config.sequence_length, config.text), labels)
    return Table.of_column([], tokenizer.encode(texts, config.sequence_length), labels)


def read_records(path: Path, key: str, config: JsonlConfig) -> tuple[list[str], list[str]]:
    """Each object's text and its label (as a CSV cell would hold it), in the file's order.

    Raises:
        DataError: the file is missing, empty or not JSON Lines, or a line lacks a key or has a bad value.
    """
    texts, labels, _ = _scan(path, key, config, keep_texts=True)
    return texts, labels


def _scan(path: Path, key: str, config: JsonlConfig, keep_texts: bool) -> tuple[list[str], list[str], np.ndarray]:
    """Each object's text (with ``keep_texts``; else each is checked and let go), its label, and its line's byte
    span, in the file's order."""
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
