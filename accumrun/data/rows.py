"""How a text table (``jsonl``, or a ``csv`` with ``data.text``) streams (``data.cache: none``): startup reads the
file once, with the in-memory table's checks and errors, and keeps each record's byte span ``[start, end)``, not its
text; training reads the record's bytes back as the epoch reaches it and :func:`record_text` takes its text.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING

import numpy as np

from accumrun.data.source import ReadsBlocks, TokenIds, in_blocks, read_spans, taken
from accumrun.data.tokenizers import Tokenizer

if TYPE_CHECKING:
    import tensorflow as tf


def csv_records(file: IO[str], path: Path) -> Iterator[tuple[int, int, list[str]]]:
    """``(start, end, cells)`` per record of a CSV opened with ``newline=""`` (``utf-8-sig``), blank ones included:
    ``csv.reader`` reads no line past a record's end before it gives it, so counting its lines gives the spans."""
    with path.open("rb") as raw:
        offset = len(codecs.BOM_UTF8) if raw.read(len(codecs.BOM_UTF8)) == codecs.BOM_UTF8 else 0

    def lines() -> Iterator[str]:
        nonlocal offset
        for line in file:
            offset += len(line.encode("utf-8"))  # valid UTF-8 encodes back to the very bytes it came from
            yield line

    start = offset
    for row in csv.reader(lines()):
        yield start, offset, row
        start = offset


def record_text(record: bytes, text: str | int) -> str:
    """The text of one record's bytes: a JSON object's key ``text`` (a str), or a CSV record's stripped cell at
    column ``text`` (an int). A ValueError says the bytes are no such record: the file has changed since startup."""
    try:
        if isinstance(text, str):
            value = json.loads(record)[text]
        else:
            (row,) = csv.reader(io.StringIO(record.decode("utf-8"), newline=""))
            value = row[text].strip()
    except (ValueError, LookupError, TypeError, csv.Error) as error:
        raise ValueError(f"not the record read at startup ({type(error).__name__}: {error})") from None
    if not isinstance(value, str) or not value:
        raise ValueError("not the record read at startup (its text is not a string, or empty)")
    return value


@dataclass(frozen=True)
class TextColumn:
    """A table's text column (or JSON key) as ``length`` token ids, streamed from the file or tokenized at load."""

    column: str
    tokenizer: Tokenizer
    length: int
    stream: bool = False

    def samples(self, path: Path, spans: np.ndarray, texts: Sequence[str], text: str | int) -> np.ndarray | TextRows:
        """``texts`` tokenized, or the records at ``spans`` to stream (``text`` as in :class:`TextRows`)."""
        if not self.stream:
            return self.tokenizer.encode(texts, self.length)
        return TextRows(str(path), spans, np.zeros(len(spans), np.int32), self.tokenizer, self.length, text)


@dataclass(frozen=True, eq=False)
class TextRows(ReadsBlocks, TokenIds):
    """The records of one text table by their byte spans in the file, and their labels: in the epoch's order,
    blocks of records are read in one ``tf.numpy_function`` call (:func:`record_text` takes each one's text) and
    tokenized together by the tokenizer's TensorFlow ops (the ids of its host ``encode``); no text is held."""

    path: str
    spans: np.ndarray
    """One row ``[start, end)`` per record: its bytes in the file, int64."""
    y: np.ndarray
    tokenizer: Tokenizer
    length: int
    text: str | int
    """Where a record's text is: a JSON object's key (a str), or a CSV record's column index (an int)."""
    w: np.ndarray | None = None

    streaming = "this table streams its rows"

    def subset(self, index: np.ndarray) -> TextRows:
        return replace(self, spans=self.spans[index], y=self.y[index], w=taken(self.w, index))

    def read_blocks(self, order: np.ndarray) -> tf.data.Dataset:
        """Records ``order`` as ``(index, x, y)``, tokenized a block at a time, in parallel, in order."""
        return in_blocks(self._raw(order), lambda index, rows, y: (index, self._tokens(rows), y))

    def _raw(self, order: np.ndarray) -> tf.data.Dataset:
        import tensorflow as tf

        from accumrun.core.targets import as_targets

        order = order.astype(np.int64)
        targets = as_targets(self.y[order], taken(self.w, order))
        return tf.data.Dataset.from_tensor_slices((order, order, targets))

    def _decode(self, raw: tf.Tensor) -> tf.Tensor:
        """``raw`` is the sample's index: its record's text, tokenized to ``length`` ids."""
        import tensorflow as tf

        return tf.reshape(self._tokens(tf.reshape(raw, [1])), [self.length])

    def _tokens(self, rows: tf.Tensor) -> tf.Tensor:
        import tensorflow as tf

        texts = tf.numpy_function(self._texts, [rows], tf.string, stateful=False)
        texts = tf.reshape(texts, tf.shape(rows))  # numpy_function knows no shape
        ids = self.tokenizer.encode_tensor(texts, self.length)
        return tf.ensure_shape(ids, (None, self.length))

    def _texts(self, rows: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        spans = self.spans[rows]
        try:
            records = read_spans(self.path, spans[:, 0], spans[:, 1] - spans[:, 0])
            texts = [record_text(record, self.text) for record in records]
        except (OSError, ValueError) as error:
            # An error of the op, in a pipeline and eagerly alike (where find_undecodable decodes one by one).
            raise tf.errors.InvalidArgumentError(None, None, str(error)) from None
        return np.array([text.encode("utf-8") for text in texts], dtype=object)

    def describe(self, index: int) -> str:
        return f"{self.path}, the record at byte {int(self.spans[index, 0])}"
