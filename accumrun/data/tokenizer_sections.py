"""The ``data.tokenizer`` sections, chosen by ``name``; the tokenizers are in :mod:`accumrun.data.tokenizers`. Here too
are the pieces of every union chosen by ``name`` (``data``, ``model`` and ``data.tokenizer``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, PrivateAttr, Tag, field_validator, model_validator

from accumrun.sections import Flag, Section, listed


class Unknown(BaseModel):
    """The member of a union by ``name`` for any other name: it takes any keys and refuses the name with
    :attr:`refusal`. A base after the union's own, so that its ``extra="allow"`` wins."""

    model_config = ConfigDict(extra="allow")
    refusal: ClassVar[str]
    name: Any

    @field_validator("name")
    @classmethod
    def _reject(cls, value: Any) -> Any:
        raise ValueError(cls.refusal)


def by_name(names: dict[str, Any], default: str | None = None) -> Discriminator:
    """A union's choice by ``name`` (``default`` when it is unset): the name itself, or ``unknown``."""

    def kind(value: Any) -> str:
        name = value.get("name", default) if isinstance(value, dict) else getattr(value, "name", None)
        return name if isinstance(name, str) and name in names else "unknown"

    return Discriminator(kind)


class _Tokenizer(Section):
    """What every ``data.tokenizer`` section tells a cache of its ids (:mod:`accumrun.data.corpus`)."""

    keras_hub: ClassVar[bool] = False
    """Whether the ids are KerasHub's (its version then decides them too)."""

    def identity(self, file_hash: Callable[[Path], str]) -> dict[str, object]:
        """What decides this tokenizer's ids: its settings, and the files it reads (hashed by ``file_hash``)."""
        return self.model_dump()


class ByteTokenizerConfig(_Tokenizer):
    """``tokenizer: {name: byte}``: each UTF-8 byte is a token (ids 1 to 256; 0 pads), no vocabulary to learn."""

    name: Literal["byte"]


class CharacterTokenizerConfig(_Tokenizer):
    """``tokenizer: {name: character}``: code point ``c`` is id ``c + 2`` below ``vocabulary_size``, else 1 (unknown);
    0 pads. The default 258 ids cover Latin-1; 65,538 would cover the Basic Multilingual Plane."""

    name: Literal["character"]
    vocabulary_size: int = Field(258, ge=3)
    """Ids in all, padding's 0 and unknown's 1 among them."""


class WordPieceTokenizerConfig(_Tokenizer):
    """``tokenizer: {name: word_piece, vocabulary: FILE}``: KerasHub's WordPiece over a vocabulary file, one token
    per line, the first padding (id 0); or ``vocabulary_size: N``: at most N tokens learned from the training texts
    and saved in the run folder (:mod:`accumrun.data.vocabulary`)."""

    keras_hub = True
    name: Literal["word_piece"]
    vocabulary: str | None = Field(None, min_length=1)
    # Below about 100 learned ids, the learner cuts single characters (with and without ##): text becomes unknowns.
    vocabulary_size: int | None = Field(None, ge=100)
    lowercase: Flag = True
    _tokens: tuple[str, ...] | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _one_vocabulary(self) -> WordPieceTokenizerConfig:
        if (self.vocabulary is None) == (self.vocabulary_size is None):
            what = "set one of vocabulary (a file) and vocabulary_size (learned from the training texts)"
            raise ValueError(what + (", not both" if self.vocabulary is not None else ""))
        return self

    @property
    def learned(self) -> bool:
        """Whether the vocabulary is learned from the training texts (``vocabulary_size``), not read from a file."""
        return self.vocabulary_size is not None

    @property
    def tokens(self) -> tuple[str, ...] | None:
        """A learned vocabulary's tokens, once ``settle_vocabulary`` (:mod:`accumrun.data.vocabulary`) settles them."""
        return self._tokens

    def with_tokens(self, tokens: tuple[str, ...]) -> WordPieceTokenizerConfig:
        """This section with its learned vocabulary's ``tokens`` settled."""
        settled = self.model_copy()
        settled._tokens = tokens
        return settled

    def identity(self, file_hash: Callable[[Path], str]) -> dict[str, object]:
        identity: dict[str, object] = {"name": self.name, "lowercase": self.lowercase}
        if self.tokens is not None:
            identity["tokens"] = hashlib.sha256("\n".join(self.tokens).encode()).hexdigest()
        else:
            assert self.vocabulary is not None  # the schema takes one of the two
            identity["vocabulary"] = file_hash(Path(self.vocabulary))
        return identity


SENTENCE_PIECE_RESERVED = 259
"""The ids a learned SentencePiece model holds whatever the texts: padding (0), unknown (1), the line break (2) and
the 256 bytes that spell any other character (3 to 258)."""


class SentencePieceTokenizerConfig(_Tokenizer):
    """``tokenizer: {name: sentence_piece, vocabulary_size: N}``: a SentencePiece BPE model of at most N ids learned
    from the training texts and saved in the run folder (:mod:`accumrun.data.sentence_piece`). Its decoding gives any
    text back byte for byte (spaces, line breaks, tabs, indentation): what a language model needs."""

    name: Literal["sentence_piece"]
    # The reserved ids, and at least one more: the training texts' own characters need more (the trainer says how many).
    vocabulary_size: int = Field(ge=SENTENCE_PIECE_RESERVED + 1)
    _model: bytes | None = PrivateAttr(None)

    @property
    def learned(self) -> bool:
        """Always: the model is learned from the training texts (a ``tokens`` source, which has none, refuses it)."""
        return True

    @property
    def model(self) -> bytes | None:
        """The learned model (a serialized SentencePiece ``ModelProto``), once ``settle_vocabulary`` settles it."""
        return self._model

    def with_model(self, model: bytes) -> SentencePieceTokenizerConfig:
        """This section with its learned ``model`` settled."""
        settled = self.model_copy()
        settled._model = model
        return settled

    def identity(self, file_hash: Callable[[Path], str]) -> dict[str, object]:
        # Ids are cached only once there is a model (as a corpus is cut once there is a vocabulary).
        assert self.model is not None, "a learned SentencePiece model is settled before its ids are cached"
        identity: dict[str, object] = {**self.model_dump(), "model": hashlib.sha256(self.model).hexdigest()}
        # The host's ids are the sentencepiece package's, as a KerasHub tokenizer's are KerasHub's.
        try:
            identity["sentencepiece"] = metadata.version("sentencepiece")
        except metadata.PackageNotFoundError:
            identity["sentencepiece"] = None
        return identity


class PresetTokenizerConfig(_Tokenizer):
    """``tokenizer: {name: preset, path: FOLDER}``: a local KerasHub preset's tokenizer; its id 0 must pad."""

    keras_hub = True
    name: Literal["preset"]
    path: str = Field(min_length=1)

    def identity(self, file_hash: Callable[[Path], str]) -> dict[str, object]:
        folder = Path(self.path)
        files = [folder / "tokenizer.json", *sorted((folder / "assets").rglob("*"))]
        return {"name": self.name, "files": {str(f.relative_to(folder)): file_hash(f) for f in files if f.is_file()}}


TOKENIZERS: dict[str, type[Section]] = {
    "byte": ByteTokenizerConfig,
    "character": CharacterTokenizerConfig,
    "word_piece": WordPieceTokenizerConfig,
    "sentence_piece": SentencePieceTokenizerConfig,
    "preset": PresetTokenizerConfig,
}
"""Every ``data.tokenizer.name`` and its section."""


class UnknownTokenizerConfig(_Tokenizer, Unknown):
    refusal = f"input should be {listed(list(TOKENIZERS))}"


TokenizerConfig = Annotated[
    Annotated[ByteTokenizerConfig, Tag("byte")]
    | Annotated[CharacterTokenizerConfig, Tag("character")]
    | Annotated[WordPieceTokenizerConfig, Tag("word_piece")]
    | Annotated[SentencePieceTokenizerConfig, Tag("sentence_piece")]
    | Annotated[PresetTokenizerConfig, Tag("preset")]
    | Annotated[UnknownTokenizerConfig, Tag("unknown")],
    by_name(TOKENIZERS),
]
"""``data.tokenizer``: one section per tokenizer, chosen by ``name``."""
