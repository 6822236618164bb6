"""What every tokenizer kind shares: the :class:`Tokenizer` it builds (text to int32 token ids and back, on the host
with NumPy and as TensorFlow ops, with the same ids; id 0 pads), the base of its ``data.tokenizer`` section, and
:class:`Learning`, what a kind that learns from the training texts declares. The kinds register in
:data:`accumrun.data.tokenizers.TOKENIZERS`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import numpy as np

from accumrun.core.tokens import PADDING_ID
from accumrun.sections import Section

if TYPE_CHECKING:
    import tensorflow as tf


class Tokenizer(ABC):
    """Text to ``length`` int32 token ids (cut, or padded with 0) and ids back to text."""

    vocabulary_size: int
    """How many ids there are, padding's 0 among them: what an embedding needs."""
    line_local: bool = True
    """Whether no token spans a line break, so a text's ids are its lines' ids concatenated (how a corpus too big for
    memory is tokenized: :mod:`accumrun.data.corpus`)."""
    loader_imports: tuple[str, ...] = ()
    """The modules a process must import before it loads a SavedModel that holds :meth:`encode_tensor`'s ops (those
    that TensorFlow itself lacks)."""

    def encode(self, texts: Iterable[str], length: int) -> np.ndarray:
        """``texts`` as an int32 array ``[len(texts), length]``, each row cut or padded with 0."""
        rows = [self.ids(text)[:length] for text in texts]
        ids = np.zeros((len(rows), length), np.int32)
        for row, tokens in zip(ids, rows, strict=True):
            row[: len(tokens)] = tokens
        return ids

    @abstractmethod
    def encode_tensor(self, texts: tf.Tensor, length: int) -> tf.Tensor:
        """What :meth:`encode` gives, as TensorFlow ops: a tf.string tensor ``[n]`` to int32 ``[n, length]``."""

    @abstractmethod
    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """The text of token ids, padding skipped; an id outside the vocabulary is a ValueError."""

    @abstractmethod
    def ids(self, text: str) -> np.ndarray:
        """All of ``text``'s token ids, uncut and unpadded, as int32 (a corpus, a prompt)."""

    def _checked(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """``ids`` without padding, refused when one is outside the vocabulary."""
        array = np.asarray(ids, dtype=np.int64).reshape(-1)
        outside = array[(array < 0) | (array >= self.vocabulary_size)]
        if len(outside):
            raise ValueError(f"token id {outside[0]} is outside the vocabulary of {self.vocabulary_size} ids")
        return array[array != PADDING_ID]


class TokenizerSection(Section):
    """What every ``data.tokenizer`` section tells: whether it learns, and what decides its ids for a cache of them
    (:mod:`accumrun.data.corpus`)."""

    name: str
    keras_hub: ClassVar[bool] = False
    """Whether the ids are KerasHub's (its version then decides them too)."""

    @property
    def learns_at_most(self) -> int | None:
        """The most ids this tokenizer learns from the training texts (its kind's :class:`Learning` says how); None
        for one that its settings and files fix."""
        return None

    @property
    def learned(self) -> bool:
        """Whether this tokenizer learns from the training texts."""
        return self.learns_at_most is not None

    def identity(self, file_hash: Callable[[Path], str]) -> dict[str, object]:
        """What decides this tokenizer's ids: its settings, and the files it reads (hashed by ``file_hash``)."""
        return self.model_dump()


SectionT = TypeVar("SectionT", bound=TokenizerSection)
LearnedT = TypeVar("LearnedT")


@dataclass(frozen=True)
class Learning(Generic[SectionT, LearnedT]):
    """How a kind learns from the training texts, and what a run keeps of it. :mod:`accumrun.data.vocabulary`
    settles a section that learns (sets what it learned) before any data is read."""

    file: Path
    """Where a run keeps what it learned, in its folder (under ``tokenizer/``)."""
    noun: str
    """What a message calls what it learned."""
    learn: Callable[[list[str], SectionT], LearnedT]
    """What the section learns from the texts."""
    settle: Callable[[SectionT, LearnedT], SectionT]
    """The section with what it learned set."""
    settled: Callable[[SectionT], LearnedT | None]
    """What a section learned; None while it is unsettled."""
    read: Callable[[Path], LearnedT | None]
    """What the run in a folder learned; None when the run has no :attr:`file`."""
    write: Callable[[Path, LearnedT], None]
    """Writes what was learned into a run folder's :attr:`file`."""
    size: Callable[[LearnedT], int]
    """How many ids were learned, padding's 0 among them."""


@dataclass(frozen=True)
class TokenizerKind(Generic[SectionT]):
    """One ``data.tokenizer.name``: its section, what builds its tokenizer from the section, and how it learns from
    the training texts (None: it is fixed by its settings and files)."""

    section: type[SectionT]
    build: Callable[[SectionT], Tokenizer]
    learning: Learning[SectionT, Any] | None = None
