"""The tokenizers, registered once: for each ``data.tokenizer.name``, its section, what builds its tokenizer, and
how it learns from the training texts (:class:`~accumrun.data.tokenizers.base.TokenizerKind`). Each kind is one
module of this package; the config's ``data.tokenizer`` union is built from :data:`TOKENIZERS`.

``word_piece``, ``sentence_piece`` and ``preset`` need the ``text`` extra (KerasHub, tensorflow-text,
sentencepiece). TensorFlow is imported only inside the methods that run its ops, never when a module is imported, so
the sources that tokenize stay free of it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from accumrun.data.section import DataSection
from accumrun.data.tokenizers.base import Learning, Tokenizer, TokenizerKind, TokenizerSection
from accumrun.data.tokenizers.byte import ByteTokenizerConfig, build_byte
from accumrun.data.tokenizers.character import CharacterTokenizerConfig, build_character
from accumrun.data.tokenizers.preset import PresetTokenizerConfig, build_preset
from accumrun.data.tokenizers.sentence_piece import (
    SENTENCE_PIECE_LEARNING,
    SentencePieceTokenizerConfig,
    build_sentence_piece,
)
from accumrun.data.tokenizers.word_piece import WORD_PIECE_LEARNING, WordPieceTokenizerConfig, build_word_piece
from accumrun.sections import Unknown, by_name, listed, tagged_union

TOKENIZERS: dict[str, TokenizerKind[Any]] = {
    "byte": TokenizerKind(ByteTokenizerConfig, build_byte),
    "character": TokenizerKind(CharacterTokenizerConfig, build_character),
    "word_piece": TokenizerKind(WordPieceTokenizerConfig, build_word_piece, WORD_PIECE_LEARNING),
    "sentence_piece": TokenizerKind(SentencePieceTokenizerConfig, build_sentence_piece, SENTENCE_PIECE_LEARNING),
    "preset": TokenizerKind(PresetTokenizerConfig, build_preset),
}
"""Every ``data.tokenizer.name``, in the order the docs list them."""


class UnknownTokenizerConfig(TokenizerSection, Unknown):
    refusal = f"input should be {listed(list(TOKENIZERS))}"
    name: Any  # not TokenizerSection's str: a name of any type gets the refusal


TOKENIZER_UNION: dict[str, type[TokenizerSection]] = {
    **{name: kind.section for name, kind in TOKENIZERS.items()},
    "unknown": UnknownTokenizerConfig,
}
"""The members of the ``data.tokenizer`` union by their tag."""

if TYPE_CHECKING:
    # mypy cannot follow a union built at run time; every member is a TokenizerSection.
    TokenizerConfig: TypeAlias = TokenizerSection
else:
    TokenizerConfig = tagged_union(TOKENIZER_UNION, by_name(TOKENIZERS))
    """``data.tokenizer``: one section per tokenizer, chosen by ``name``."""


def tokenizer_for(config: TokenizerSection) -> Tokenizer:
    """The tokenizer that ``data.tokenizer`` names; a ConfigError names a vocabulary file or preset folder that is
    missing, holds no tokenizer or whose id 0 is a real token, or KerasHub's extra when it is not installed."""
    return TOKENIZERS[config.name].build(config)


def learning_of(config: TokenizerSection) -> Learning[Any, Any] | None:
    """How ``config`` learns from the training texts, or None when it does not (a fixed tokenizer)."""
    learning = TOKENIZERS[config.name].learning
    return learning if learning is not None and config.learned else None


def text_input(config: DataSection) -> tuple[Tokenizer, int] | None:
    """The tokenizer and sequence length of a source whose samples are text; None for any other."""
    settings = config.text_settings
    return None if settings is None else (tokenizer_for(settings[0]), settings[1])
